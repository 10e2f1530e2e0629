"""Serving benchmark: each run after a pause, as a server with requests now and then sees them,
side by side in one process on this machine's CPU.

Usage: python benchmarks/serving.py [--models a,b] [--pause-ms 50] [--blocks N] [--block N]
                                    [--reduced] [--json benchmarks/results/serving-cpu.json]
                                    [--merge]

Per model: ONNX Runtime's sequential executor (2 intra-op threads, its default optimisations)
and paragraph's executor under the critical-path schedule (what ``paragraph.build`` gives,
vendor kernels). Outputs are checked against ONNX Runtime's. Two timings, configurations
alternating by block, medians with p10/p90: runs back to back (`time_in_blocks`, as the peers
benchmark times), and each run after ``--pause-ms`` idle (`time_after_pauses`). Before a run
bound its OpenMP team one thread per core (`threads.stream_teams`), the OS often put the
caller and its OpenMP worker on one core after a pause and kept them there: in separate
processes on the 2-core VM a BERT encoder ran 0.9 ms back to back and 5.5-6.0 ms after 50 ms
pauses, ResNet-50 16 and 22-38 ms, where ONNX Runtime lost 0.3 ms. The contention on the cores
is recorded before and after each model; a model timed while another process held a core is
flagged ``contended``.
"""

from __future__ import annotations

# first, before TVM loads torch: paragraph sets libgomp's spin count (paragraph/__init__.py)
import paragraph  # noqa: F401

# isort: split
import argparse  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from peers import TOLERANCE, model_and_onnx, ort_config  # noqa: E402  (benchmarks/ on the path)

from paragraph.bench import (  # noqa: E402
    add_results_options,
    bench_models,
    executor_config,
    results_path,
)
from paragraph.machine import (  # noqa: E402
    cpu_contention,
    is_contended,
    wait_for_quiet_cores,
)
from paragraph.outputs import max_difference  # noqa: E402
from paragraph.planner import Session, plan_schedule  # noqa: E402
from paragraph.timing import Config, time_after_pauses, time_in_blocks  # noqa: E402
from paragraph.tvm_interop import random_inputs  # noqa: E402
from paragraph.tvm_interop.build.program import build_program  # noqa: E402
from paragraph.tvm_interop.measure.costdb import CostDB  # noqa: E402
from paragraph.tvm_interop.measure.device import SETTLE_RUNS  # noqa: E402
from paragraph.tvm_interop.runtime.target import resolve_target  # noqa: E402

MODELS = ("inception_v3", "nasnet_a_mobile", "resnet50", "bert", "encoder")


def _rows(configs: list[Config], ort_ms: float) -> list[dict]:
    rows = []
    for c in configs:
        row = c.row(None)
        del row["speedup_vs_tvm_vm"]
        row["speed_vs_onnxruntime"] = ort_ms / row["median_ms"]
        rows.append(row)
    return rows


def bench_model(name: str, args, db: CostDB, log) -> dict:
    """ONNX Runtime and paragraph, checked, then timed back to back and after pauses."""
    workdir = Path(tempfile.mkdtemp(prefix="paragraph-serving-"))
    mod, onnx_bytes, _ = model_and_onnx(name, args.reduced, workdir)
    inputs = random_inputs(mod, seed=0)
    program = build_program(mod, resolve_target("cpu"), kernels="vendor")
    plan = plan_schedule("critical-path", program, Session(program.target, db=db))
    ort = ort_config(onnx_bytes, inputs, parallel=False)
    ours = executor_config(plan.program, plan.schedule, inputs)
    ours.name = "paragraph"
    ours.info.update(runtime="paragraph", kernels="vendor")
    configs = [ort, ours]
    results: dict[str, list[dict]] = {}
    try:
        expected = ort.run()
        for c in configs[1:]:
            worst = max_difference(expected, c.run())
            if not worst <= TOLERANCE:
                raise RuntimeError(f"{name}: {c.name} differs from ONNX Runtime by {worst:.3g}")
        for c in configs:
            for _ in range(SETTLE_RUNS):
                c.run()
        before = wait_for_quiet_cores(log)
        log(f"{name}: back to back, {args.blocks} blocks of {args.block}")
        time_in_blocks(configs, args.blocks, args.block)
        results["back_to_back"] = _rows(configs, statistics.median(ort.samples) * 1e3)
        for c in configs:
            c.samples = []
        log(f"{name}: each run after {args.pause_ms:g} ms idle")
        time_after_pauses(configs, args.blocks, args.block, args.pause_ms / 1e3)
        results["after_pause"] = _rows(configs, statistics.median(ort.samples) * 1e3)
        after = cpu_contention(2.0)
    finally:
        for c in configs:
            if c.close is not None:
                c.close()
    for kind, rows in results.items():
        for r in rows:
            log(f"  {kind:12} {r['config']:26} {r['median_ms']:9.3f} ms "
                f"({r['speed_vs_onnxruntime']:.2f}x ORT)")
    contended = is_contended(before, after)
    if contended:
        log(f"  FLAGGED: other work held a core around the timing ({before}, {after})")
    return {"model": name, "reduced": args.reduced, "schedule": plan.schedule.name,
            "streams": plan.schedule.num_streams, "threads": list(plan.schedule.threads),
            "pause_ms": args.pause_ms, **results,
            "contention_before": before, "contention_after": after, "contended": contended}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--pause-ms", type=float, default=50.0)
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--block", type=int, default=10)
    parser.add_argument("--reduced", action="store_true")
    add_results_options(parser)
    args = parser.parse_args()
    out = results_path(args, "serving-cpu")

    def log(msg: str) -> None:
        print(msg, flush=True)

    db = CostDB(Path(tempfile.mkdtemp(prefix="paragraph-serving-")) / "costs.sqlite")
    bench_models(args.models.split(","), lambda m: bench_model(m, args, db, log), out,
                 {"benchmark": "serving", "kernels": "vendor", "blocks": args.blocks,
                  "block": args.block, "pause_ms": args.pause_ms,
                  "gomp_spincount": os.environ.get("GOMP_SPINCOUNT")},
                 merge=args.merge, log=log, order=MODELS)


if __name__ == "__main__":
    main()
