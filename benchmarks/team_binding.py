"""Binding a run's OpenMP team, one thread per core (`threads.stream_teams`), against leaving it
to the OS: each model's paragraph build (critical-path, vendor kernels) timed back to back and
after pauses, in alternating processes (the binding outlives a run, so the two cannot share a
process): ``PARAGRAPH_PIN=1`` (the default) against ``PARAGRAPH_PIN=0``.

Usage: python benchmarks/team_binding.py [--models a,b] [--rounds 2] [--pause-ms 50]
                                         [--json benchmarks/results/team-binding-cpu.json]

Each process builds the model, settles it, then times 5 blocks of 10 runs back to back
(`time_in_blocks`) and 5 blocks of 10 runs each after ``--pause-ms`` idle
(`time_after_pauses`); medians and p90. The contention on the cores is recorded around each
process; a process timed while another held a core is flagged ``contended``.
"""

from __future__ import annotations

# first, before TVM loads torch: paragraph sets libgomp's spin count (paragraph/__init__.py)
import paragraph  # noqa: F401

# isort: split
import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from paragraph.files import atomic_write_json  # noqa: E402
from paragraph.machine import cpu_contention, describe_machine, is_contended  # noqa: E402

MODELS = ("resnet50", "inception_v3", "encoder")


def child(name: str, pause_ms: float) -> dict:
    """One process's timing of ``name`` (run with the environment's ``PARAGRAPH_PIN``)."""
    from peers import model_and_onnx  # benchmarks/ is on the path when run as a script

    from paragraph.bench import executor_config
    from paragraph.timing import time_after_pauses, time_in_blocks
    from paragraph.tvm_interop import random_inputs
    from paragraph.tvm_interop.measure.device import SETTLE_RUNS

    mod, _, _ = model_and_onnx(name, False, Path(tempfile.mkdtemp(prefix="paragraph-team-")))
    exe = paragraph.build(mod, kernels="vendor")
    c = executor_config(exe.program, exe.schedule, random_inputs(mod, seed=0))
    try:
        for _ in range(SETTLE_RUNS):
            c.run()
        time_in_blocks([c], 5, 10)
        back = statistics.median(c.samples)
        c.samples = []
        time_after_pauses([c], 5, 10, pause_ms / 1e3)
        paused = np.array(c.samples)
    finally:
        if c.close is not None:
            c.close()
    return {"model": name, "bound": os.environ.get("PARAGRAPH_PIN", "1") != "0",
            "schedule": exe.schedule.name, "threads": list(exe.schedule.threads),
            "back_to_back_ms": back * 1e3,
            "after_pause_ms": float(np.median(paused)) * 1e3,
            "after_pause_p90_ms": float(np.percentile(paused, 90)) * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pause-ms", type=float, default=50.0)
    parser.add_argument("--json", default="benchmarks/results/team-binding-cpu.json")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.pause_ms)), flush=True)
        return
    load_before = os.getloadavg()
    rows = []
    for name in args.models.split(","):
        for _ in range(args.rounds):
            for pin in ("1", "0"):
                before = cpu_contention(1.0)
                done = subprocess.run(
                    [sys.executable, __file__, "--child", name, "--pause-ms", str(args.pause_ms)],
                    env={**os.environ, "PARAGRAPH_PIN": pin}, capture_output=True, text=True,
                    timeout=1200, check=True)
                after = cpu_contention(1.0)
                row = json.loads(done.stdout.strip().splitlines()[-1])
                row.update(contention_before=before, contention_after=after,
                           contended=is_contended(before, after))
                rows.append(row)
                print(f"{name:14} bound={row['bound']!s:5} back to back "
                      f"{row['back_to_back_ms']:7.2f} ms, after {args.pause_ms:g} ms idle "
                      f"{row['after_pause_ms']:7.2f} ms (p90 {row['after_pause_p90_ms']:.2f})"
                      f"{'  FLAGGED' if row['contended'] else ''}", flush=True)
    atomic_write_json(args.json, {"benchmark": "team-binding", "machine": describe_machine(),
                                  "pause_ms": args.pause_ms, "rounds": args.rounds,
                                  "timing": "5 blocks of 10 runs each way, per process",
                                  "load_average_before": load_before,
                                  "load_average": os.getloadavg(), "rows": rows})
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
