"""A substitution (TASO section 2.2, MetaFlow section 3): source and target patterns over shared
inputs, parameter constraints, and the mapping of source outputs to target tensors.

Patterns are small DAGs of rule-language operators (`paragraph.rules.specs`). A tensor is named
by a ``Ref`` ``(node, output)`` where nodes ``0 .. len(inputs)-1`` are the rule's inputs and the
following ones its operators (the source's or the target's). Operator parameters are ints or
variables (``"?s"``): a variable binds when the source is matched and is reused by the target,
so one rule covers every stride, padding or axis z3 proved it for. Each input carries the shape
template it was found or written with (``("N", "C", "H", "W")``), which gives its rank and lets
tests draw random shapes of the same family. Its named sizes are the rule's symbolic
dimensions: z3 is told them, and the sizes the proof needed (`Rule.equal_dims`) must be equal
wherever the rule is applied; the matcher enforces that.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np

from paragraph.rules.axioms import _hyp_holds
from paragraph.rules.specs import (
    OPS,
    Evaluated,
    Meta,
    ShapeError,
    Term,
    app,
    constant_shape,
    evaluate,
    infer,
    param_value,
    var,
)

Ref = tuple[int, int]
DimFact = tuple[str, int]  # (input name, negative axis): a size a proof relied on


@dataclass(frozen=True)
class PInput:
    """A rule input: a name, a shape template, and whether it must be a weight."""

    name: str
    dims: tuple[Any, ...]
    weight: bool = False

    @property
    def rank(self) -> int:
        return len(self.dims)


@dataclass(frozen=True)
class POp:
    """One operator of a pattern: name, parameters (ints or ``"?var"``) and input tensors."""

    op: str
    params: tuple[tuple[str, Any], ...]
    inputs: tuple[Ref, ...]

    @property
    def param_dict(self) -> dict[str, Any]:
        return dict(self.params)


@dataclass(frozen=True)
class Rule:
    """A verified substitution: ``source`` may be replaced by ``target`` wherever it matches."""

    id: str
    name: str
    inputs: tuple[PInput, ...]
    source: tuple[POp, ...]
    target: tuple[POp, ...]
    outputs: tuple[tuple[Ref, Ref], ...]
    constraints: tuple[tuple[str, str, Any], ...] = ()
    origin: str = "generated"
    proof: dict[str, Any] | None = field(default=None, compare=False)

    # -- views
    def side(self, which: str) -> tuple[POp, ...]:
        return self.source if which == "source" else self.target

    def terms(self, which: str) -> list[Term]:
        """One rule-language term per mapped output of the ``which`` side."""
        ops = self.side(which)
        memo: dict[Ref, Term] = {}

        def term(ref: Ref) -> Term:
            if ref not in memo:
                node, out = ref
                if node < len(self.inputs):
                    memo[ref] = var(self.inputs[node].name)
                else:
                    op = ops[node - len(self.inputs)]
                    memo[ref] = app(op.op, *map(term, op.inputs), out=out, **op.param_dict)
            return memo[ref]

        return [term(pair[0 if which == "source" else 1]) for pair in self.outputs]

    def equal_dims(self) -> tuple[tuple[tuple[int, int], ...], ...]:
        """Groups of (input index, negative axis) whose sizes must be equal for the rule to
        hold: the input templates' shared names among the sizes the proof used
        (``proof["dims"]``); every shared name when the proof does not say (conservative)."""
        index = {i.name: k for k, i in enumerate(self.inputs)}
        used = (self.proof or {}).get("dims")
        facts: list[tuple[int, int]] = []
        for k, inp in enumerate(self.inputs):
            facts += [(k, a) for a, d in zip(range(-inp.rank, 0), inp.dims, strict=True)
                      if isinstance(d, str)]
        if used is not None:
            wanted = {(index[n], int(a)) for n, a in used if n in index}
            facts = [f for f in facts if f in wanted]
        groups: dict[str, list[tuple[int, int]]] = {}
        for k, a in facts:
            groups.setdefault(self.inputs[k].dims[a], []).append((k, a))
        return tuple(tuple(g) for _, g in sorted(groups.items()) if len(g) > 1)

    def dims_hold(self, shapes: list[tuple[int, ...]]) -> bool:
        """Whether input tensors of these shapes meet `equal_dims` (the rule may apply)."""
        for group in self.equal_dims():
            sizes = set()
            for k, a in group:
                if len(shapes[k]) < -a:
                    return False
                sizes.add(shapes[k][a])
            if len(sizes) > 1:
                return False
        return True

    def reversed(self) -> Rule:
        """The same equivalence applied from target to source (id suffixed ``~``)."""
        return replace(self, id=self.id + "~", source=self.target, target=self.source,
                       outputs=tuple((t, s) for s, t in self.outputs))

    def describe(self) -> str:
        """``source => target`` as two expressions per output, for listings."""
        src, tgt = self.terms("source"), self.terms("target")
        return "; ".join(f"{a!r} => {b!r}" for a, b in zip(src, tgt, strict=True))

    # -- JSON and hashing
    def body(self) -> dict[str, Any]:
        """The JSON form of everything that defines the rule (what its hash covers)."""
        return {
            "id": self.id, "name": self.name, "origin": self.origin,
            "inputs": [{"name": i.name, "dims": list(i.dims), **({"weight": True}
                                                                  if i.weight else {})}
                       for i in self.inputs],
            "source": [_op_json(o) for o in self.source],
            "target": [_op_json(o) for o in self.target],
            "outputs": [[list(s), list(t)] for s, t in self.outputs],
            "constraints": [list(c) for c in self.constraints],
        }

    def content_hash(self) -> str:
        """sha256 of the canonical JSON of `body` plus the proof."""
        data = {**self.body(), "proof": self.proof}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()

    def formula_key(self) -> str:
        """A hash of what z3 must prove (ids and names excluded): the proof cache key."""
        data = {k: v for k, v in self.body().items() if k not in ("id", "name", "origin")}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()

    def to_json(self) -> dict[str, Any]:
        return {**self.body(), "proof": self.proof, "hash": self.content_hash()}


def _op_json(o: POp) -> dict[str, Any]:
    return {"op": o.op, "params": {k: _param_json(v) for k, v in o.params},
            "inputs": [list(r) for r in o.inputs]}


def _param_json(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def _param_py(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


def rule_from_json(d: dict[str, Any]) -> Rule:
    """The `Rule` of a JSON entry (raises KeyError/ValueError/TypeError on a malformed one)."""
    def ops(items: Iterable[Mapping[str, Any]]) -> tuple[POp, ...]:
        out = []
        for o in items:
            if o["op"] not in OPS:
                raise ValueError(f"unknown operator {o['op']!r}")
            out.append(POp(o["op"], tuple((k, _param_py(o["params"][k]))
                                          for k in OPS[o["op"]].params),
                           tuple(tuple(r) for r in o["inputs"])))
        return tuple(out)

    return Rule(
        id=d["id"], name=d["name"], origin=d["origin"],
        inputs=tuple(PInput(i["name"], tuple(i["dims"]), bool(i.get("weight", False)))
                     for i in d["inputs"]),
        source=ops(d["source"]), target=ops(d["target"]),
        outputs=tuple((tuple(s), tuple(t)) for s, t in d["outputs"]),
        constraints=tuple(tuple(c) for c in d["constraints"]),
        proof=d.get("proof"))


def check_structure(rule: Rule) -> None:
    """Raise ValueError if refs point nowhere or forward, or parameters do not fit the ops."""
    n = len(rule.inputs)
    for which in ("source", "target"):
        ops = rule.side(which)
        for j, o in enumerate(ops):
            spec = OPS[o.op]
            if tuple(k for k, _ in o.params) != spec.params or len(o.inputs) != spec.arity:
                raise ValueError(f"{which} op {j} ({o.op}) has the wrong parameters or arity")
            for node, out in o.inputs:
                if not 0 <= node < n + j:
                    raise ValueError(f"{which} op {j} reads node {node}, not before it")
                if node >= n and not 0 <= out < OPS[ops[node - n].op].n_out:
                    raise ValueError(f"{which} op {j} reads a missing output {out}")
        for pair in rule.outputs:
            node, out = pair[0 if which == "source" else 1]
            if not 0 <= node < n + len(ops):
                raise ValueError(f"output map names {which} node {node}, which does not exist")
    if not rule.outputs:
        raise ValueError("a rule needs at least one mapped output")


def resolve_params(op: POp, bindings: dict[str, Any]) -> dict[str, Any]:
    """``op``'s parameters with variables replaced by their bound values."""
    return {k: param_value(v, bindings) for k, v in op.params}


def infer_side(rule: Rule, which: str, inputs: list[Meta],
               bindings: dict[str, Any]) -> dict[Ref, Meta]:
    """The meta of every tensor of one side, given the inputs' metas and the parameter
    bindings; constants get their shapes from their first reader. Raises `ShapeError`."""
    ops = rule.side(which)
    n = len(rule.inputs)
    metas: dict[Ref, Meta] = {(i, 0): m for i, m in enumerate(inputs)}
    for j, o in enumerate(ops):
        if OPS[o.op].constant:
            continue
        p = resolve_params(o, bindings)
        args: list[Meta | None] = [metas.get(r) for r in o.inputs]
        for pos, r in enumerate(o.inputs):
            if args[pos] is None:
                const = ops[r[0] - n]
                shape = constant_shape(const.op, resolve_params(const, bindings), o.op, p,
                                       pos, args)
                metas[r] = args[pos] = Meta(shape)
        # the loop above gave every constant argument its meta
        for out, m in enumerate(infer(o.op, p, cast(list[Meta], args))):
            metas[(n + j, out)] = m
    for pair in rule.outputs:
        ref = pair[0 if which == "source" else 1]
        if ref not in metas:
            raise ShapeError(f"output {ref} of the {which} has no shape (an unused constant?)")
    return metas


def template_metas(rule: Rule, dims: dict[str, int]) -> list[Meta]:
    """Metas of the rule's inputs with the symbolic dims of their templates set to ``dims``."""
    return [Meta(tuple(d if isinstance(d, int) else dims[d] for d in i.dims))
            for i in rule.inputs]


def check_numeric(rule: Rule, dims: dict[str, int], bindings: dict[str, Any] | None = None,
                  seed: int = 0, tol: float = 1e-5,
                  shapes: list[tuple[int, ...]] | None = None) -> bool | None:
    """Evaluate both sides on random float64 inputs (template shapes with ``dims``, or the
    input ``shapes`` given): True if every mapped output agrees within ``tol``, False if one
    differs, None if the shapes or parameters do not apply."""
    rng = np.random.default_rng(seed)
    if shapes is None:
        shapes = [m.shape for m in template_metas(rule, dims)]
    tensors = {i.name: rng.uniform(-1, 1, sh)
               for i, sh in zip(rule.inputs, shapes, strict=True)}
    bindings = bindings or {}
    memo: dict[Term, Evaluated] = {}
    try:
        for a, b in zip(rule.terms("source"), rule.terms("target"), strict=True):
            left, lm = evaluate(a, tensors, bindings, "float", memo)
            right, rm = evaluate(b, tensors, bindings, "float", memo)
            if left.shape != right.shape:
                return False
            if not np.allclose(left, right, rtol=tol, atol=tol):
                return False
    except (ShapeError, KeyError, ValueError):
        return None
    return True


_DIM_RANGE = {"B": (1, 3), "C": (1, 6), "H": (3, 8), "W": (3, 8), "M": (1, 6), "N": (1, 6)}
# parameter values tried by `random_check`, the most common first (drawn half the time)
_PARAM_CHOICES = {"stride": (1, 2), "pad": (0, 1), "act": (0, 1), "groups": (1, 2, 4),
                  "axis": (-1, -2, -3, -4), "kh": (3, 1, 5), "kw": (3, 1, 5)}


def random_check(rule: Rule, seed: int = 0, tries: int = 80) -> int:
    """Check ``rule`` numerically on random shapes of its inputs' families and random values
    of its parameter variables; returns how many instances applied (0: none did).

    The shapes are drawn to break equalities the rule does not state: different names get
    different sizes, and half the draws also change sizes that `Rule.equal_dims` leaves free
    (one input's size along one axis), keeping only instances where both sides apply, as the
    matcher would. Raises AssertionError naming the instance when the two sides differ.
    """
    rng = np.random.default_rng(seed)
    names = sorted({v for o in rule.source + rule.target for _, v in o.params
                    if isinstance(v, str)})
    bound = {f for g in rule.equal_dims() for f in g}
    free = [(k, a) for k, i in enumerate(rule.inputs) for a in range(-i.rank, 0)
            if (k, a) not in bound]
    applied = 0
    for t in range(tries):
        dims = _distinct_dims(rule, rng)
        bindings = {}
        for n in names:
            choices = _PARAM_CHOICES[n.lstrip("?").rstrip("0123456789")]
            bindings[n] = int(choices[0] if rng.random() < 0.5 else rng.choice(choices))
        if not all(_hyp_holds(c, bindings) for c in rule.constraints):
            continue
        shapes = [list(m.shape) for m in template_metas(rule, dims)]
        if t % 2 and free:
            k, a = free[int(rng.integers(len(free)))]
            shapes[k][a] += int(rng.integers(1, 3))
        inputs = [tuple(sh) for sh in shapes]
        if not rule.dims_hold(inputs):
            continue
        ok = check_numeric(rule, dims, bindings, seed=int(rng.integers(1 << 30)), tol=1e-4,
                           shapes=inputs)
        if ok is False:
            raise AssertionError(f"rule {rule.id} differs at shapes {inputs}, params "
                                 f"{bindings}")
        applied += ok is True
    return applied


def _distinct_dims(rule: Rule, rng: np.random.Generator) -> dict[str, int]:
    """A size for every named dimension of the templates, different names different sizes
    where the ranges allow (so no equality the rule does not state holds by accident)."""
    wanted = sorted({d for i in rule.inputs for d in i.dims if isinstance(d, str)})
    taken: set[int] = set()
    dims = {}
    for d in wanted:
        lo, hi = _DIM_RANGE.get(d, (1, 6))
        free = [v for v in range(lo, hi + 1) if v not in taken] or list(range(lo, hi + 1))
        dims[d] = int(rng.choice(free))
        taken.add(dims[d])
    return dims
