"""How far two timings of the same program differ on this machine: the measurement behind
`paragraph.timing.MARGIN`, the one margin every choice by measurement uses.

Usage: python benchmarks/noise.py [--models a,b] [--rounds 6] [--reduced]
                                  [--json benchmarks/results/noise-cpu.json] [--merge]

Per model (full size, vendor kernels, the critical-path plan that ``paragraph.build`` gives):
the program is built twice from the model, and the two builds are timed side by side
``--rounds`` times with the planner's own whole-run comparison
(`paragraph.tvm_interop.meter.runs.time_runs`, uncached: alternating blocks of runs, medians),
each time recording ``|a - b| / max(a, b)``. Nothing differs between the two but the build and
the moment, so every difference is noise a choice must not be made on. The summary gives the
median, the 90th percentile and the largest difference over all comparisons; the margin is
chosen at or above the 90th percentile. The load is recorded before and after each model.
"""

from __future__ import annotations

# first, before TVM loads torch: paragraph sets libgomp's spin count (paragraph/__init__.py)
import paragraph  # noqa: F401

# isort: split
import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from paragraph import models  # noqa: E402
from paragraph.bench import add_results_options, bench_models, results_path  # noqa: E402
from paragraph.files import atomic_write_json  # noqa: E402
from paragraph.machine import cpu_contention, is_contended, wait_for_quiet_cores  # noqa: E402
from paragraph.planner import CompileOptions, Session, compile  # noqa: E402
from paragraph.timing import MARGIN  # noqa: E402
from paragraph.tvm_interop.build.program import build_program  # noqa: E402
from paragraph.tvm_interop.frontend.relax_graph import to_relax  # noqa: E402
from paragraph.tvm_interop.meter.runs import time_runs  # noqa: E402

MODELS = ("squeezenet1_1", "resnet50", "inception_v3", "nasnet_a_mobile", "bert")


def bench_model(name: str, args: argparse.Namespace, log) -> dict:
    """Two builds of one model's default plan, compared ``args.rounds`` times."""
    mod = models.get(name, reduced=args.reduced)
    before = cpu_contention()
    with Session("cpu", log=lambda _line: None) as session:
        start = time.perf_counter()
        plan = compile(mod, CompileOptions(kernels="vendor"), session=session)
        # the second build of the same program: its own model graph (rewrites and all)
        model = plan.program.model
        twin = build_program(mod if model is None else to_relax(model.get()),
                             plan.program.target, kernels=plan.program.kernel_source,
                             rewrites=plan.program.rewrites)
        log(f"{name}: built twice in {time.perf_counter() - start:.0f} s")
        pair = [(plan.program, plan.schedule), (twin, plan.schedule)]
        diffs, times = [], []
        for r in range(args.rounds):
            a, b = time_runs(pair if r % 2 == 0 else pair[::-1], None, "", check=r == 0)
            diffs.append(abs(a - b) / max(a, b))
            times.append((a, b))
            log(f"  round {r + 1}: {a * 1e3:.3f} and {b * 1e3:.3f} ms, "
                f"{diffs[-1]:.2%} apart")
    after = cpu_contention()
    return {"model": name, "schedule": plan.schedule.describe(), "rounds": args.rounds,
            "ms": [[a * 1e3, b * 1e3] for a, b in times], "differences": diffs,
            "median_difference": float(np.median(diffs)), "max_difference": max(diffs),
            "contended": is_contended(before) or is_contended(after)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--reduced", action="store_true")
    add_results_options(parser)
    args = parser.parse_args()
    out = results_path(args, "noise-cpu")
    wait_for_quiet_cores(print)
    bench_models(args.models.split(","), lambda n: bench_model(n, args, print), out,
                 {"benchmark": "noise"}, merge=args.merge, log=print)
    result = json.loads(Path(out).read_text())
    every = [d for m in result["models"] for d in m["differences"]]
    summary = {"comparisons": len(every), "median": float(np.median(every)),
               "p90": float(np.percentile(every, 90)), "max": max(every)}
    result["summary"] = summary
    atomic_write_json(out, result)
    print(f"{summary['comparisons']} comparisons: median {summary['median']:.2%}, p90 "
          f"{summary['p90']:.2%}, max {summary['max']:.2%} (MARGIN {MARGIN:.0%})")


if __name__ == "__main__":
    main()
