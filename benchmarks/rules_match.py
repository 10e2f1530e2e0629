"""Time matching every library rule on full-size models (target: under 0.5 s for inception_v3).

Usage: python benchmarks/rules_match.py [--repeat N] [--json FILE] [MODEL ...]
A model is a zoo model, ``corpus:NAME`` (a public corpus model, `corpus_models`), or
``corpus`` (every one of them): which rules match what real models contain.
"All rules" is what a search applies: each generated rule in both directions (where the
reverse can match) plus the parametric rules. A match counts only if its target can be built
there (shapes fit); rewriting is not timed. The import (from_relax) is not timed either. Each
model is measured as imported and again after folding every batch norm into its conv (most
conv patterns need the conv's output to reach the next operator directly).
"""

from __future__ import annotations

import argparse
import statistics
import time

from paragraph.files import atomic_write_json
from paragraph.machine import describe_machine
from paragraph.rules import apply_match, load_library, match_all
from paragraph.tvm_interop import from_relax


def fold_all_batch_norms(graph, lib):
    """The graph with every conv + batch norm folded (what a search does first)."""
    fold = lib.get("metaflow-fold-bn")
    while True:
        done = next((g for m in fold.find(graph) if (g := apply_match(graph, m)) is not None),
                    None)
        if done is None:
            return graph
        graph = done


def time_matching(name: str, rules: list, repeat: int, lib=None) -> dict:
    """Median seconds to match ``rules`` on the full-size model ``name``, and the matches
    (with ``lib``: after folding every batch norm first)."""
    import corpus_models  # benchmarks/ is on the path when run as a script

    graph = from_relax(corpus_models.relax_module(name))
    if lib is not None:
        graph = fold_all_batch_norms(graph, lib)
        name += " (batch norms folded)"
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        matches = match_all(graph, rules)
        times.append(time.perf_counter() - start)
    per_rule = {rid: len(ms) for rid, ms in matches.items() if ms}
    return {"model": name, "nodes": len(graph), "operators": len(graph.operators),
            "rules": len(rules), "match_s": statistics.median(times),
            "match_s_all": times, "matches": sum(per_rule.values()),
            "rules_matching": len(per_rule),
            "matches_per_rule": dict(sorted(per_rule.items(), key=lambda kv: -kv[1]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", default="benchmarks/results/rules-match-cpu.json")
    parser.add_argument("models", nargs="*", default=["inception_v3", "nasnet_a_large"])
    args = parser.parse_args()
    lib = load_library()
    rules = lib.for_search()
    print(f"{len(lib.rules)} generated rules ({len(rules) - len(lib.parametric)} with usable "
          f"reverses) + {len(lib.parametric)} parametric")
    rows = []
    import corpus_models

    for name, folded in [(m, f) for m in corpus_models.expand(args.models)
                         for f in (False, True)]:
        r = time_matching(name, rules, args.repeat, lib if folded else None)
        rows.append(r)
        print(f"{r['model']:38} {r['operators']:5} ops  {r['match_s'] * 1000:7.1f} ms  "
              f"{r['matches']:5} matches of {r['rules_matching']} rules", flush=True)
        for rid, n in r["matches_per_rule"].items():
            rule = lib.get(rid)
            print(f"    {rid:<28} {n:5}  {rule.name}")
    inception = next((r for r in rows if r["model"] == "inception_v3"), None)
    result = {"benchmark": "rules_match", "machine": describe_machine(), "repeat": args.repeat,
              "library": {"generated": len(lib.rules), "parametric": len(lib.parametric),
                          "rules_matched": len(rules)},
              "target_s": {"inception_v3": 0.5},
              "met": None if inception is None else inception["match_s"] < 0.5,
              "results": rows}
    atomic_write_json(args.json, result)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
