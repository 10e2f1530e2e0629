"""``paragraph rules generate|verify|list|show|axioms``: build, check and inspect the library."""

from __future__ import annotations

import argparse
import json
import time

from paragraph.errors import ParagraphError
from paragraph.rules.axioms import all_axioms, redundant, validate
from paragraph.rules.library import (
    build_library,
    load_library,
    prove_parametric,
    reprove_library,
    verify_library,
)
from paragraph.rules.rule import Rule


def _say(msg: str) -> None:
    print(msg, flush=True)


def cmd_generate(args: argparse.Namespace) -> int:
    if args.parametric:
        prove_parametric(args.out, log=_say)
        return 0
    if args.reprove:
        reprove_library(args.out, log=_say)
        return 0
    if args.k < 1 or args.k > 4:
        raise ParagraphError(f"--k {args.k}: the generator enumerates 1 to 4 operators")
    meta = build_library(args.k, args.out, workers=args.workers, log=_say)
    _say("")
    _say(f"{'stage':<34}{'count':>9}{'seconds':>10}")
    for s in meta["generator"]["stages"]:
        _say(f"{s['stage']:<34}{s['count']:>9}{s['seconds']:>10.1f}")
    _say(f"total {meta['seconds']:.1f} s; {len(meta['generator']['unproved'])} candidates z3 "
         "did not prove were left out")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    results = verify_library(args.file, use_cache=not args.no_cache, log=_say,
                             workers=args.workers)
    _say(f"done in {time.perf_counter() - start:.1f} s")
    return 0 if all(v == "ok" for v in results.values()) else 1


def cmd_list(args: argparse.Namespace) -> int:
    lib = load_library(args.file)
    rows = [r for r in lib.all() if args.origin in (None, r.origin)]
    for r in rows:
        axioms = ",".join((r.proof or {}).get("axioms", [])) if hasattr(r, "proof") else ""
        if not axioms and r.origin == "parametric":
            axioms = "(see show)"
        _say(f"{r.id:<28} {r.origin:<10} {r.name:<52} {axioms}")
    _say(f"{len(rows)} rules ({sum(r.origin == 'generated' for r in rows)} generated, "
         f"{sum(r.origin == 'parametric' for r in rows)} parametric)")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    lib = load_library(args.file)
    rule = lib.get(args.id)
    data = json.loads(lib.path.read_text())
    entry = next(e for e in data["rules"] if e["id"] == rule.id.rstrip("~"))
    if isinstance(rule, Rule):
        _say(f"{rule.id}: {rule.name}")
        for a, b in zip(rule.terms("source"), rule.terms("target"), strict=True):
            _say(f"  {a!r}\n    => {b!r}")
        if rule.constraints:
            _say(f"  constraints: {rule.constraints}")
    _say(json.dumps(entry, indent=2))
    return 0


def cmd_axioms(args: argparse.Namespace) -> int:
    bad = 0
    for a in all_axioms():
        failures = validate(a)
        bad += bool(failures)
        mark = "ok" if not failures else f"FAILS: {failures[0]}"
        _say(f"{a.name:>16} {'table 2.2' if a.table else 'extension':<10} {len(a.cases):>3} "
             f"cases  {mark}  ({a.comment})")
    if args.redundancy:
        _say(f"entailment of each axiom by the others ({args.timeout_ms} ms per query):")
        verdicts = redundant(timeout_ms=args.timeout_ms,
                             progress=lambda a, v, s: _say(f"  {a.name:>16} {v} ({s:.1f} s)"))
        found = [k for k, v in verdicts.items() if v == "redundant"]
        _say(f"redundant: {', '.join(found) or 'none'}")
    return 1 if bad else 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``rules`` command and its verbs to the ``paragraph`` parser."""
    p = subparsers.add_parser("rules", help="generate, verify and inspect the verified "
                              "substitution library")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    g = verbs.add_parser("generate", help="run TASO's generator and the parametric proofs, "
                         "write the library")
    g.add_argument("--k", type=int, default=3, help="operators per graph (default 3, about 3 "
                   "minutes on 2 cores; 4 takes hours and about 12 GB)")
    g.add_argument("--out", default=None, help="library file (default: the shipped one)")
    g.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    g.add_argument("--parametric", action="store_true",
                   help="only re-prove the parametric rules and rewrite their entries "
                   "(seconds; the generated rules stay as they are)")
    g.add_argument("--reprove", action="store_true",
                   help="re-prove every rule of the library (no proof cache) and re-check it "
                   "on shapes drawn to break equalities, dropping any that fail; what a "
                   "change to the axioms needs (about a minute and a half)")
    g.set_defaults(func=cmd_generate)
    v = verbs.add_parser("verify", help="re-prove every rule with z3 and check it numerically")
    v.add_argument("file", nargs="?", default=None, help="library file (default: shipped)")
    v.add_argument("--no-cache", action="store_true", help="ignore cached proofs")
    v.add_argument("--workers", type=int, default=2,
                   help="processes proving rules at once (default 2)")
    v.set_defaults(func=cmd_verify)
    ls = verbs.add_parser("list", help="list the rules")
    ls.add_argument("--origin", choices=("generated", "parametric"), default=None)
    ls.add_argument("--file", default=None, help="library file (default: shipped)")
    ls.set_defaults(func=cmd_list)
    s = verbs.add_parser("show", help="show one rule (append ~ for a pattern rule's reverse)")
    s.add_argument("id")
    s.add_argument("--file", default=None, help="library file (default: shipped)")
    s.set_defaults(func=cmd_show)
    a = verbs.add_parser("axioms", help="validate the operator axioms numerically")
    a.add_argument("--redundancy", action="store_true",
                   help="also ask z3 whether each axiom follows from the others")
    a.add_argument("--timeout-ms", type=int, default=2000)
    a.set_defaults(func=cmd_axioms)
