"""The rule library: a versioned JSON data file of verified rules, its loader and its builder.

Format (``"format": "paragraph-rules", "version": 1``): the generator settings and stage
counts, then one entry per rule with a stable id, a name, the source and target patterns, the
constraints, the output map, the proof (status ``verified``, the axioms used, the z3 version)
and a sha256 content hash. Generated rules store their patterns (`paragraph.rules.rule`);
parametric rules store their schema name and parameters (the code is in
`paragraph.rules.parametric`) with the proof obligations z3 discharged. The loader refuses,
with a `RuleLibraryError` naming the file and the rule, a file that is not this format, an
entry whose hash does not match its content (corrupt or hand-edited), and any rule whose proof
status is not ``verified``.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

from paragraph.errors import RuleLibraryError
from paragraph.files import atomic_write_bytes
from paragraph.progress import Log
from paragraph.rules.generator import generate
from paragraph.rules.match import AnyRule, both_directions
from paragraph.rules.parametric import (
    DESCRIPTIONS,
    SCHEMAS,
    ParametricRule,
    all_parametric,
    check_numeric,
    prove,
)
from paragraph.rules.rule import Rule, check_structure, random_check, rule_from_json
from paragraph.rules.verify import prove_rule, z3_version

FORMAT, VERSION = "paragraph-rules", 1
R = TypeVar("R", bound=Rule | ParametricRule)
LIBRARY_PATH = Path(__file__).with_name("library.json")


@dataclass
class Library:
    """The loaded rules: generated pattern rules and parametric rules, by id."""

    path: Path
    rules: list[Rule] = field(default_factory=list)
    parametric: list[ParametricRule] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    hashes: dict[str, str] = field(default_factory=dict)  # rule id -> its entry's content hash

    def all(self) -> list[Rule | ParametricRule]:
        """Every rule, pattern rules first."""
        return [*self.rules, *self.parametric]

    def get(self, rule_id: str) -> Rule | ParametricRule:
        """The rule with this id (a pattern rule's reverse is ``id~``)."""
        base = rule_id.rstrip("~")
        for r in self.all():
            if r.id == base:
                return r.reversed() if rule_id.endswith("~") and isinstance(r, Rule) else r
        raise RuleLibraryError(f"{self.path}: no rule {rule_id!r}")

    def get_as(self, rule_id: str, kind: type[R]) -> R:
        """`get`, checked to be a ``kind`` (e.g. the merge rule a pass applies)."""
        rule = self.get(rule_id)
        if not isinstance(rule, kind):
            raise RuleLibraryError(f"{self.path}: rule {rule_id!r} is a {type(rule).__name__}, "
                                   f"not a {kind.__name__}")
        return rule

    def for_search(self) -> list[AnyRule]:
        """The rules a search applies: each pattern rule both ways (where the reverse can
        match) and the parametric rules."""
        return both_directions(self.rules) + list(self.parametric)


# ---------------------------------------------------------------------------- JSON
def _entry_hash(entry: Mapping[str, Any]) -> str:
    body = {k: v for k, v in entry.items() if k != "hash"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def parametric_entry(rule: ParametricRule, proof: dict[str, Any]) -> dict[str, Any]:
    """The JSON entry of a parametric rule (with its hash)."""
    entry = {"id": rule.id, "name": rule.name, "origin": "parametric", "schema": rule.schema,
             "params": rule.params(), "paper": rule.paper, **DESCRIPTIONS[rule.schema],
             "description": " ".join((type(rule).__doc__ or "").split()), "proof": proof}
    entry["hash"] = _entry_hash(entry)
    return entry


def pattern_entry(rule: Rule) -> dict[str, Any]:
    """The JSON entry of a pattern rule (with its hash)."""
    entry = {k: v for k, v in rule.to_json().items() if k != "hash"}
    entry["hash"] = _entry_hash(entry)
    return entry


def write_library(path: str | Path, rules: Sequence[Rule],
                  parametric: Sequence[tuple[ParametricRule, dict[str, Any]]],
                  meta: Mapping[str, Any]) -> None:
    """Write a library file (atomically): rules must all be verified."""
    for r in rules:
        if (r.proof or {}).get("status") != "verified":
            raise RuleLibraryError(f"{path}: refusing to write unverified rule {r.id}")
    for pr, proof in parametric:
        if proof.get("status") != "verified":
            raise RuleLibraryError(f"{path}: refusing to write unverified rule {pr.id}")
    entries = ([pattern_entry(r) for r in rules]
               + [parametric_entry(r, p) for r, p in parametric])
    head = json.dumps({"format": FORMAT, "version": VERSION, **meta}, indent=1)
    # one rule per line: small, and a regenerated library diffs rule by rule
    body = ",\n".join("  " + json.dumps(e, sort_keys=True, separators=(",", ":"))
                       for e in entries)
    text = head[:-2] + ',\n "rules": [\n' + body + "\n ]\n}\n"
    atomic_write_bytes(path, text.encode())
    os.chmod(path, 0o644)  # package data, readable by all (mkstemp made it private)


def load_library(path: str | Path | None = None) -> Library:
    """Load and check a library file (default: the one shipped with paragraph)."""
    path = Path(path) if path is not None else LIBRARY_PATH
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RuleLibraryError(f"{path}: no such rule library") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RuleLibraryError(f"{path}: not a readable JSON rule library ({e})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise RuleLibraryError(f"{path}: not a paragraph rule library (format "
                               f"{data.get('format') if isinstance(data, dict) else None!r})")
    if data.get("version") != VERSION:
        raise RuleLibraryError(f"{path}: library version {data.get('version')!r}; this "
                               f"paragraph reads version {VERSION}")
    if not isinstance(data.get("rules", []), list):
        raise RuleLibraryError(f"{path}: its 'rules' is not a list of rules (it is a JSON "
                               f"{type(data['rules']).__name__})")
    lib = Library(path, meta={k: v for k, v in data.items() if k != "rules"})
    seen: set[str] = set()
    for i, entry in enumerate(data.get("rules", [])):
        rid = entry.get("id", f"#{i}") if isinstance(entry, dict) else f"#{i}"
        where = f"{path}: rule {rid}"
        if not isinstance(entry, dict):
            raise RuleLibraryError(f"{where}: not a JSON object")
        if rid in seen:
            raise RuleLibraryError(f"{where}: duplicate id")
        seen.add(rid)
        lib.hashes[rid] = str(entry.get("hash"))
        if entry.get("hash") != _entry_hash(entry):
            raise RuleLibraryError(f"{where}: content hash mismatch (the entry was edited or "
                                   "corrupted; regenerate with `paragraph rules generate`)")
        status = (entry.get("proof") or {}).get("status")
        if status != "verified":
            raise RuleLibraryError(f"{where}: proof status is {status!r}, not 'verified'; "
                                   "unverified rules are not loaded")
        try:
            if entry.get("origin") == "parametric":
                cls = SCHEMAS[entry["schema"]]
                lib.parametric.append(cls(entry["id"], entry["name"], entry["paper"],
                                          entry["schema"], **entry.get("params", {})))
            else:
                rule = rule_from_json(entry)
                check_structure(rule)
                lib.rules.append(rule)
        except (KeyError, ValueError, TypeError) as e:
            raise RuleLibraryError(f"{where}: malformed entry ({type(e).__name__}: {e})") from None
    return lib


@cache
def default_library() -> Library:
    """The shipped library, loaded once."""
    return load_library()


# ---------------------------------------------------------------------------- build, verify
def build_library(k: int = 3, out: str | Path | None = None, workers: int = 2,
                  log: Log = print) -> dict[str, Any]:
    """Run the generator, prove the parametric rules, and write the library file.

    Returns the file's metadata (generator settings, stage counts, rule counts).
    """
    start = time.perf_counter()
    log(f"generating substitutions with up to {k} operators ...")
    report = generate(k, workers=workers, log=log)
    log("proving the parametric rules ...")
    parametric: list[tuple[ParametricRule, dict[str, Any]]] = []
    for rule in all_parametric():
        proof = prove(rule)
        log(f"  {rule.id:<28} {proof['status']:<9} axioms {', '.join(proof['axioms'])}")
        if proof["status"] == "verified":
            parametric.append((rule, proof))
    meta = {"z3": z3_version(),
            "generator": {"k": k, "domains": ["matrix", "image"],
                          "stages": [{"stage": s, "count": c, "seconds": round(t, 2)}
                                     for s, c, t in report.stages],
                          "unproved": [r.describe() for r in report.unproved]},
            "counts": {"generated": len(report.rules), "parametric": len(parametric)},
            "seconds": round(time.perf_counter() - start, 1)}
    path = Path(out) if out is not None else LIBRARY_PATH
    write_library(path, report.rules, parametric, meta)
    log(f"wrote {len(report.rules)} generated + {len(parametric)} parametric rules to {path}")
    return meta


def _prove_all(rules: Sequence[ParametricRule], path: Path,
               log: Log) -> list[tuple[ParametricRule, dict[str, Any]]]:
    """Each parametric rule with its proof record; refuses (`RuleLibraryError`, nothing
    written) if one does not verify."""
    proved = []
    for rule in rules:
        proof = prove(rule)
        log(f"  {rule.id:<28} {proof['status']:<9} axioms {', '.join(proof['axioms'])}")
        if proof["status"] != "verified":
            raise RuleLibraryError(f"{path}: parametric rule {rule.id} did not verify "
                                   f"({proof['status']}); the library was not changed")
        proved.append((rule, proof))
    return proved


def prove_parametric(path: str | Path | None = None,
                     log: Log = print) -> dict[str, Any]:
    """Re-prove every parametric rule paragraph ships and rewrite their entries in the library
    file (the generated rules are kept as they are; a new parametric rule is added, a retired
    one dropped): what a change to `paragraph.rules.parametric` needs, without the minutes
    the generator takes. Refuses (and writes nothing) if a proof does not verify. Returns the
    file's metadata."""
    path = Path(path) if path is not None else LIBRARY_PATH
    lib = load_library(path)
    proved = _prove_all(all_parametric(), path, log)
    meta = {k: v for k, v in lib.meta.items() if k not in ("format", "version")}
    meta["counts"] = {**meta.get("counts", {}), "parametric": len(proved)}
    write_library(path, lib.rules, proved, meta)
    log(f"wrote {len(lib.rules)} generated + {len(proved)} parametric rules to {path}")
    return meta


def reprove_library(path: str | Path | None = None,
                    log: Log = print) -> dict[str, Any]:
    """Re-prove every rule of a library file with z3 (no proof cache) and re-check it
    numerically on shapes drawn to break equalities (`random_check`), then rewrite the file:
    what a change to the axioms or the verifier needs, without re-running the generator. A
    pattern rule whose proof no longer verifies or whose numeric check fails is dropped (and
    named in the log); each proof records the sizes it relied on (``dims``), which the matcher
    then enforces. A parametric rule that does not verify refuses the whole rewrite."""
    path = Path(path) if path is not None else LIBRARY_PATH
    lib = load_library(path)
    kept: list[Rule] = []
    dropped: list[str] = []
    for i, rule in enumerate(lib.rules):
        proof = prove_rule(rule, use_cache=False)
        why = "" if proof.status == "verified" else f"z3 {proof.status}"
        if not why:
            rule = replace(rule, proof={**(rule.proof or {}), **proof.to_json()})
            try:
                if not random_check(rule, seed=0):
                    why = "no random instance applied"
            except AssertionError as e:
                why = str(e)
        if why:
            dropped.append(f"{rule.id} ({rule.describe()}): {why}")
            log(f"  dropped {rule.id}: {why}")
        else:
            kept.append(rule)
        if (i + 1) % 50 == 0:
            log(f"  {i + 1} of {len(lib.rules)} pattern rules re-proved")
    proved = _prove_all(lib.parametric, path, log)
    meta = {k: v for k, v in lib.meta.items() if k not in ("format", "version")}
    meta["counts"] = {"generated": len(kept), "parametric": len(proved)}
    meta["z3"] = z3_version()
    if dropped:
        meta["dropped"] = meta.get("dropped", []) + dropped
    write_library(path, kept, proved, meta)
    log(f"wrote {len(kept)} generated + {len(proved)} parametric rules to {path} "
        f"({len(dropped)} dropped)")
    return meta


def _verify_pattern(rule: Rule, use_cache: bool) -> str:
    proof = prove_rule(rule, use_cache)
    try:
        applied = random_check(rule, seed=0)
        numeric = "ok" if applied else "no random instance applied"
    except AssertionError as e:
        numeric = str(e)
    return ("ok" if proof.status == "verified" and numeric == "ok"
            else f"z3 {proof.status}, numeric: {numeric}")


def _verify_share(path: str, share: Sequence[int], use_cache: bool) -> list[tuple[str, str]]:
    """One worker's share of `verify_library`: the pattern rules at those positions."""
    rules = load_library(path).rules
    return [(rules[i].id, _verify_pattern(rules[i], use_cache)) for i in share]


def verify_library(path: str | Path | None = None, use_cache: bool = True,
                   log: Log = print, workers: int = 1) -> dict[str, str]:
    """Re-prove every rule of a library with z3 and check it numerically; maps rule ids to
    ``"ok"`` or what failed. ``workers`` > 1 proves the pattern rules in that many fresh
    processes (each z3 context of its own), interleaved so each gets easy and hard ones."""
    lib = load_library(path)
    results: dict[str, str] = {}
    if workers > 1 and len(lib.rules) > 1:
        # spawned, not forked: the parent may hold thread pools (torch, TVM) a fork would copy
        ctx = multiprocessing.get_context("spawn")
        shares = [range(w, len(lib.rules), workers) for w in range(workers)]
        where = str(path or LIBRARY_PATH)
        with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
            for part in pool.map(_verify_share, [where] * workers, shares,
                                 [use_cache] * workers):
                results.update(part)
        results = {r.id: results[r.id] for r in lib.rules}
    else:
        for rule in lib.rules:
            results[rule.id] = _verify_pattern(rule, use_cache)
    for prule in lib.parametric:
        record = prove(prule)
        try:
            checked = sum(check_numeric(prule, seed) for seed in range(3))
            numeric = "ok" if checked else "no match in the examples"
        except AssertionError as e:
            numeric = str(e)
        results[prule.id] = ("ok" if record["status"] == "verified" and numeric == "ok"
                             else f"z3 {record['status']}, numeric: {numeric}")
    bad = {k: v for k, v in results.items() if v != "ok"}
    log(f"{path or LIBRARY_PATH}: {len(results) - len(bad)} of {len(results)} rules verified "
        "by z3 and checked numerically")
    for k, v in bad.items():
        log(f"  {k}: {v}")
    return results
