"""Time from_relax + to_relax on the full-size zoo (target: under 2 s for inception_v3).

Usage: python benchmarks/roundtrip.py [--repeat N] [--json benchmarks/results/roundtrip-cpu.json]
Each model is built once; the round trip is timed ``repeat`` times and the median reported.
"""

from __future__ import annotations

import argparse
import statistics
import time

from paragraph import models
from paragraph.files import atomic_write_json
from paragraph.machine import describe_machine
from paragraph.tvm_interop import from_relax, to_relax


def time_roundtrip(name: str, repeat: int) -> dict:
    """Median seconds of from_relax, to_relax and both, on the full-size model ``name``."""
    mod = models.get(name)
    t_from, t_to = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        graph = from_relax(mod)
        mid = time.perf_counter()
        to_relax(graph)
        t_from.append(mid - start)
        t_to.append(time.perf_counter() - mid)
    both = [a + b for a, b in zip(t_from, t_to, strict=True)]
    return {"model": name, "nodes": len(graph), "operators": len(graph.operators),
            "opaque": sum(n.kind == "opaque" for n in graph.nodes),
            "from_relax_s": statistics.median(t_from), "to_relax_s": statistics.median(t_to),
            "roundtrip_s": statistics.median(both)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", default="benchmarks/results/roundtrip-cpu.json")
    parser.add_argument("models", nargs="*", default=models.list())
    args = parser.parse_args()
    rows = []
    print(f"{'model':18} {'nodes':>6} {'ops':>6} {'from_relax':>11} {'to_relax':>9} {'total':>7}")
    for name in args.models:
        r = time_roundtrip(name, args.repeat)
        rows.append(r)
        print(f"{name:18} {r['nodes']:6} {r['operators']:6} {r['from_relax_s']:10.3f}s "
              f"{r['to_relax_s']:8.3f}s {r['roundtrip_s']:6.3f}s", flush=True)
    inception = next((r for r in rows if r["model"] == "inception_v3"), None)
    result = {"benchmark": "roundtrip", "machine": describe_machine(), "repeat": args.repeat,
              "target_s": {"inception_v3": 2.0},
              "met": None if inception is None else inception["roundtrip_s"] < 2.0,
              "results": rows}
    atomic_write_json(args.json, result)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
