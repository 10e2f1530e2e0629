"""ceil_mode and unevenly padded pools as TOPI's kernels (the vendor dispatch before 2026-11-30)
against vendor pools (now), on corpus models: each built by `paragraph.build` with its defaults
both ways, outputs compared, then timed side by side in one process (alternating blocks of 10
runs, the order reversed every block, medians).

Usage: PYTHONPATH=.:benchmarks python benchmarks/pool_ceil_ab.py [--json F] googlenet squeezenet1_0
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import corpus_models
import numpy as np

import paragraph
from paragraph.machine import describe_machine
from paragraph.tvm_interop.build import dispatch

VENDOR_POOL = dispatch._Rewriter.pool


def topi_pool(self: Any, call: Any) -> Any:
    """The dispatch before: ceil_mode and uneven padding left to TOPI."""
    a = call.attrs
    pad = [int(p) for p in a.padding]
    if bool(a.ceil_mode) or pad[:2] != pad[2:]:
        return call
    return VENDOR_POOL(self, call)


def bench(name: str, blocks: int = 12, block: int = 10) -> dict[str, Any]:
    path = corpus_models.export(corpus_models.BY_NAME[name])
    exes = {}
    try:
        for label, pool in (("tvm_pools", topi_pool), ("vendor_pools", VENDOR_POOL)):
            dispatch._Rewriter.pool = pool
            exes[label] = paragraph.build(str(path))
    finally:
        dispatch._Rewriter.pool = VENDOR_POOL
    inputs = exes["vendor_pools"].sample_inputs(seed=0)
    ref, got = (exes[k].run(*inputs) for k in exes)
    diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
               for a, b in zip(ref, got, strict=True))
    times: dict[str, list[float]] = {k: [] for k in exes}
    for b in range(blocks):
        for k in (list(exes) if b % 2 == 0 else list(exes)[::-1]):
            for _ in range(block):
                t = time.perf_counter()
                exes[k].run(*inputs)
                times[k].append(time.perf_counter() - t)
    for e in exes.values():
        e.close()
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    return {"model": name, "median_ms": med, "speedup": med["tvm_pools"] / med["vendor_pools"],
            "max_abs_diff": diff}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+")
    p.add_argument("--json")
    args = p.parse_args()
    out: dict[str, Any] = {"benchmark": "pool-ceil-ab", "machine": describe_machine(),
                           "load_average_before": os.getloadavg(), "models": []}
    for name in args.models:
        row = bench(name)
        print(row, flush=True)
        out["models"].append(row)
    out["load_average"] = os.getloadavg()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
