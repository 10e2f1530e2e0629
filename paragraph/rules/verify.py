"""The substitution verifier (TASO section 2.4): z3 entailment from the operator axioms.

A rule is verified when the axioms, with its parameter constraints as hypotheses, entail that
every source output equals its mapped target tensor for all inputs and all values of the
parameter variables: z3 must find ``axioms /\\ constraints /\\ not (src == tgt)``
unsatisfiable. The unsat core names the axioms the proof used. The rule's symbolic dimensions
(its inputs' shape templates: two inputs naming the same dimension have equal sizes there)
are stated too, each as a tracked fact, and the core names the ones the proof needed
(`Proof.dims`): those are what the matcher must enforce (an axiom such as ``g1`` holds only
for equal sizes). Proofs are cached on disk by a
hash of the goal, the axioms, the z3 version and paragraph's (`cache_dir`), so re-verifying a
library costs a lookup per rule; a proof another z3 or paragraph made is a miss, so is a
cache file torn or written by another format, and a cache that cannot be written (a read-only
directory, a full disk) warns once and proves on.
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import z3

from paragraph.files import atomic_write_json, cache_dir
from paragraph.rules.axioms import (
    Axiom,
    Hypothesis,
    all_axioms,
    by_name,
    dim_facts,
    hypothesis_z3,
)
from paragraph.rules.rule import DimFact, Rule
from paragraph.rules.specs import Term, Z3Expr, term_vars, to_z3, z3_dim, z3_sorts
from paragraph.version import __version__

DEFAULT_RLIMIT = 20_000_000  # z3 resource units (about 10 s here); deterministic, unlike time


@dataclass(frozen=True)
class Proof:
    """The verifier's answer: ``verified`` (with the axioms and the size facts used),
    ``failed`` or ``unknown``. ``dims`` is None when no size facts were stated."""

    status: str
    axioms: tuple[str, ...] = ()
    seconds: float = 0.0
    z3: str = ""
    dims: tuple[DimFact, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status, "axioms": list(self.axioms),
                               "z3": self.z3}
        if self.dims is not None:
            out["dims"] = [list(d) for d in self.dims]
        return out


def z3_version() -> str:
    version: str = z3.get_version_string()
    return version


@cache
def _axiom_digest(names: tuple[str, ...]) -> str:
    text = "\n".join([str(a.formula().sexpr()) for a in all_axioms() if a.name in names]
                     + [str(f.sexpr()) for _, f in dim_facts()])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Prover:
    """One z3 solver holding the axioms (tracked for unsat cores), reused for many goals."""

    def __init__(self, axioms: Sequence[Axiom] | None = None,
                 rlimit: int = DEFAULT_RLIMIT, seed: int = 0) -> None:
        self.axioms = tuple(all_axioms() if axioms is None else axioms)
        self.rlimit = rlimit
        self.solver = z3.Solver()
        self.solver.set("rlimit", rlimit)
        self.solver.set("random_seed", seed)
        self.solver.set("timeout", max(2000, rlimit // 500))  # a backstop: rlimit can slip
        self.solver.set("unsat_core", True)
        self.tracks: dict[str, str] = {}  # tracking literal -> axiom name
        named = [(a.name, a.formula()) for a in self.axioms] + list(dim_facts())
        for name, formula in named:
            track = z3.Bool(f"axiom_{name}")
            self.tracks[str(track)] = name
            self.solver.assert_and_track(formula, track)
        self.key = _axiom_digest(tuple(a.name for a in self.axioms)) + z3_version()
        # what a cached proof depends on, in its file name: the axioms, z3, paragraph (which
        # states the goal); a proof any other made is not found
        self.file_key = hashlib.sha256(f"{self.key}\n{__version__}".encode()).hexdigest()[:16]

    def prove(self, lhs: Sequence[Term], rhs: Sequence[Term],
              hypotheses: Sequence[Hypothesis] = (),
              dims: Mapping[str, Sequence[Any]] | None = None) -> Proof:
        """Prove ``lhs[i] == rhs[i]`` for all i, for all variables, under ``hypotheses``;
        ``dims`` gives tensor variables' shape templates, whose named sizes become tracked
        facts (the proof reports those it used)."""
        tensor_sort, _ = z3_sorts()
        tv: set[str] = set()
        pv: set[str] = set()
        for t in (*lhs, *rhs):
            term_vars(t, tv, pv)
        tensors = {n: z3.Const(f"in_{n}", tensor_sort) for n in sorted(tv)}
        params = {n: z3.Int(f"p_{n}") for n in sorted(pv)}
        memo: dict[Term, Z3Expr] = {}
        goal = z3.And(*[to_z3(a, tensors, params, memo) == to_z3(b, tensors, params, memo)
                        for a, b in zip(lhs, rhs, strict=True)])
        start = time.perf_counter()
        self.solver.push()
        facts: dict[str, DimFact] = {}
        try:
            for h in hypotheses:
                self.solver.add(hypothesis_z3(h, params, tensors))
            dim = z3_dim()
            for name, template in sorted((dims or {}).items()):
                if name not in tensors:
                    continue
                for axis, d in zip(range(-len(template), 0), template, strict=True):
                    if isinstance(d, str):  # a named size; literal ones prove nothing
                        track = z3.Bool(f"dim_{name}_{axis}")
                        facts[str(track)] = (name, axis)
                        self.solver.assert_and_track(
                            dim(tensors[name], z3.IntVal(axis)) == z3.Int(f"size_{d}"), track)
            self.solver.add(z3.Not(goal))
            answer = self.solver.check()
            used: tuple[str, ...] = ()
            used_dims: tuple[DimFact, ...] = ()
            if answer == z3.unsat:
                core = [str(c) for c in self.solver.unsat_core()]
                used = tuple(sorted({self.tracks[c] for c in core if c in self.tracks},
                                    key=axiom_order))
                used_dims = tuple(sorted(facts[c] for c in core if c in facts))
        finally:
            self.solver.pop()
        status = ("verified" if answer == z3.unsat else "failed" if answer == z3.sat
                  else "unknown")
        return Proof(status, used, time.perf_counter() - start, z3_version(),
                     None if dims is None else used_dims)

    def prove_rule(self, rule: Rule, use_cache: bool = True) -> Proof:
        """`prove` the rule's output map under its constraints, through the on-disk cache."""
        path = cache_dir() / "proofs" / f"{rule.formula_key()[:40]}-{self.file_key}.json"
        if use_cache and (cached := _read_proof(path)) is not None:
            return cached
        proof = self.prove(rule.terms("source"), rule.terms("target"), rule.constraints,
                           {i.name: i.dims for i in rule.inputs})
        if use_cache and proof.status != "unknown":
            try:
                atomic_write_json(path, proof.to_json())
            except OSError as e:  # the proof stands; only the next run proves it again
                _warn_once(str(path.parent), f"proofs are not cached ({e}); they are proved "
                           "again next time")
        return proof


def _read_proof(path: Path) -> Proof | None:
    """The proof cached in ``path``, or None where there is none, or it is torn, of another
    format, or made by another z3."""
    try:
        d = json.loads(path.read_text())
        proof = Proof(d["status"], tuple(d["axioms"]), 0.0, d["z3"],
                      tuple((str(n), int(a)) for n, a in d["dims"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if proof.status not in ("verified", "failed") or proof.z3 != z3_version():
        return None
    return proof


_warned: set[str] = set()  # the cache directories warned of


def _warn_once(where: str, message: str) -> None:
    if where not in _warned:
        _warned.add(where)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def axiom_order(name: str) -> tuple[int, str]:
    order = {a.name: i for i, a in enumerate(all_axioms())}
    return order.get(name, 10**6), name


@cache
def default_prover() -> Prover:
    """A shared `Prover` over every axiom."""
    return Prover()


def prove_rule(rule: Rule, use_cache: bool = True) -> Proof:
    """Verify ``rule`` with z3 (cached by rule hash).

    A rule from the library names the axioms its proof used: a fresh solver holding just
    those re-proves it quickly and deterministically (z3's search over all axioms depends on
    the solver's history). Otherwise, or if that fails, every axiom is used.
    """
    used = [a for a in (rule.proof or {}).get("axioms", ()) if not a.startswith("dim-")]
    if used:
        axioms = by_name(used)
        if len(axioms) == len(set(used)):
            # z3's search also depends on the terms its context made before (the test suite
            # proved a library rule "unknown" after other proofs once): a resource-limited
            # answer gets two more tries with other seeds
            for seed in (0, 1, 2):
                proof = Prover(axioms, seed=seed).prove_rule(rule, use_cache)
                if proof.status != "unknown":
                    break
            if proof.status == "verified":
                return proof
    return Prover().prove_rule(rule, use_cache)
