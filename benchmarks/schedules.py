"""Schedule benchmark (the layout of the IOS README table): every schedule on each model.

Usage: python benchmarks/schedules.py [--models a,b] [--kernels vendor] [--repeat N]
           [--reduced] [--ios-protocol 2,6,6] [--json benchmarks/results/schedules-cpu.json]

Per model: sequential, wavefront ("greedy" in IOS), opara, nimble, critical-path,
IOS-parallel, IOS-merge, IOS-both, each a median latency from one round-robin timing run,
plus each IOS search's time.
Targets (issue 4): IOS-both no slower than the best other schedule on every model; search under
10 minutes per model on 2 cores. IOS-both searches first, on a fresh cost database (or
``--db``); IOS-parallel and IOS-merge then re-use the stages it measured, so their search times
are warm and only IOS-both's is the cold figure the target is about.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from paragraph import models
from paragraph.bench import check_and_time, executor_config, vm_config
from paragraph.files import atomic_write_json
from paragraph.machine import describe_machine
from paragraph.passes.ios import IOSOptions
from paragraph.planner import Session, plan_ios, plan_schedule
from paragraph.tvm_interop import random_inputs
from paragraph.tvm_interop.build.program import build_program
from paragraph.tvm_interop.measure.costdb import CostDB
from paragraph.tvm_interop.meter.runs import plan_digest
from paragraph.tvm_interop.runtime.target import resolve_target

MODELS = ("inception_v3", "nasnet_a_mobile", "randwire", "squeezenet1_1")
BASELINES = ("sequential", "wavefront", "opara", "nimble")  # IOS-both's target (issue 4)
HEURISTICS = (*BASELINES, "critical-path")


def bench_model(name: str, args, db: CostDB, log) -> dict:
    """Every schedule of one model, the IOS ones searched first, then all timed side by side."""
    mod = models.get(name, reduced=args.reduced)
    start = time.perf_counter()
    program = build_program(mod, resolve_target(args.target), kernels=args.kernels)
    log(f"{name}: {len(program.kernels)} kernels, built in {time.perf_counter() - start:.0f} s")
    inputs = random_inputs(mod)
    vm = vm_config("tvm_vm", program.vm(), inputs, program.device)
    expected = vm.run()
    configs = [vm]
    plans = {}  # config name -> what its run depends on (identical plans run the same)
    session = Session(program.target, db=db, log=log)
    for h in HEURISTICS:  # critical-path: measured kernel times
        plan = plan_schedule(h, program, session)  # critical-path may split
        configs.append(executor_config(plan.program, plan.schedule, inputs))
        plans[configs[-1].name] = (plan_digest(plan.schedule) if plan.program is program
                                   else None)
    searches = {}
    warmup, repeat, number = (int(v) for v in args.ios_protocol.split(","))
    for mode in ("both", "parallel", "merge"):  # both first, on a cold cost database
        options = IOSOptions(mode=mode, warmup=warmup, repeat=repeat, number=number,
                             budget_s=args.budget, progress=True)
        t = time.perf_counter()
        result = plan_ios(program, session, options)
        assert result.report.ios is not None
        searches[f"ios-{mode}"] = {"search_s": time.perf_counter() - t,
                                   "cold_cost_db": mode == "both",
                                   "summary": result.report.ios.summary,
                                   "predicted_ms": result.report.ios.predicted_ms}
        configs.append(executor_config(result.program, result.schedule, inputs))
        plans[configs[-1].name] = (plan_digest(result.schedule)
                                   if result.program is program else None)
    check_and_time(configs, expected, 1e-4, args.repeat)
    base = statistics.median(vm.samples) * 1e3
    rows = [c.row(base) for c in configs]
    for r in rows:
        r.update(searches.get(r.get("schedule", ""), {}))
        if r["config"] in plans:
            r["plan"] = plans[r["config"]]
        log(f"  {r['config']:28} {r['median_ms']:9.3f} ms")
    return {"model": name, "kernels": len(program.kernels), "configs": rows,
            **summarize(rows, searches["ios-both"])}


def summarize(rows: list[dict], search: dict) -> dict:
    """The issue's target: IOS-both no slower than the best of the IOS table's other schedules
    (`BASELINES`); where IOS-both kept exactly that schedule (its end-to-end check chose the
    plain sequence), the two are the same run and tie. critical-path, which is not in the IOS
    table, is compared separately."""
    ms = {r["config"].split(":", 1)[1]: r for r in rows if r["config"].startswith("executor:")}
    both = ms["ios-both"]
    best = min(BASELINES, key=lambda n: ms[n]["median_ms"])
    same = [n for n in BASELINES if both.get("plan") and ms[n].get("plan") == both["plan"]]
    return {"best_other": best, "ios_both_same_schedule_as": same,
            "ios_both_vs_best_other": ms[best]["median_ms"] / both["median_ms"],
            "ios_both_vs_critical_path": ms["critical-path"]["median_ms"] / both["median_ms"],
            "ios_both_search_s": search["search_s"],
            "ios_both_budget_hit": "budget hit" in search["summary"],
            "target_met": (both["median_ms"] <= ms[best]["median_ms"] or best in same)
            and search["search_s"] < 600}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--kernels", default="tvm", choices=("tvm", "vendor", "auto"))
    parser.add_argument("--target", default="cpu")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--reduced", action="store_true")
    parser.add_argument("--ios-protocol", default="2,6,6", help="warmup,repeat,number")
    parser.add_argument("--budget", type=float, default=None, help="IOS time budget (s)")
    parser.add_argument("--db", default=None,
                        help="cost database (default: a fresh one, so that searches are cold)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    kind = "cpu" if args.target == "cpu" else "gpu"
    out = args.json or f"benchmarks/results/schedules-{kind}{'-reduced' * args.reduced}.json"

    def log(msg: str) -> None:
        print(msg, flush=True)

    db = CostDB(args.db or Path(tempfile.mkdtemp(prefix="paragraph-bench-")) / "costs.sqlite")
    results = [bench_model(m, args, db, log) for m in args.models.split(",")]
    atomic_write_json(out, {"benchmark": "schedules", "kernels": args.kernels,
                            "target": args.target, "machine": describe_machine(),
                            "repeat": args.repeat, "ios_protocol": args.ios_protocol,
                            "ios_budget_s": args.budget,
                            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                            "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
                            "load_average": os.getloadavg(),
                            "models": results})
    log(f"wrote {out}")


if __name__ == "__main__":
    main()
