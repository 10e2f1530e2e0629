"""A tuning database never makes a model slower: untuned TVM kernels, the tuned kernels that
paragraph applies (faster alone, then kept by the model check), every tuned kernel that
measured faster alone, and every tuned record (what MetaSchedule's ApplyDatabase alone
applies), side by side in one process.

    python benchmarks/tuning.py [--model squeezenet1_1] [--trials 16] [--work-dir DIR]
                                [--json benchmarks/results/tuning-cpu.json]

Tunes the reduced model's kernels into ``--work-dir`` first where it has no records (minutes;
resumable) and runs the model check (on quiet cores), then builds the four programs with TVM
kernels under the critical-path schedule and times them in alternating blocks (medians), the
machine's load sampled before and after.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from dataclasses import asdict
from functools import partial
from pathlib import Path

import paragraph
from paragraph import models
from paragraph.files import atomic_write_json
from paragraph.machine import cpu_contention, describe_machine, is_contended, wait_for_quiet_cores
from paragraph.outputs import max_difference
from paragraph.planner import check_models
from paragraph.timing import Config, time_in_blocks
from paragraph.tvm_interop.build.tuning_db import RECORDS, STATE_FILE, write_applied
from paragraph.tvm_interop.runtime.target import local_cpu_target
from paragraph.tvm_interop.tune.metaschedule import tune


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="squeezenet1_1")
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--work-dir", default="/tmp/paragraph-tuning-bench")
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    mod = models.get(args.model, reduced=True)
    work = Path(args.work_dir)
    if not (work / RECORDS).exists():
        tune(mod, local_cpu_target(), work, args.trials)
    wait_for_quiet_cores(print)
    check = check_models([mod], local_cpu_target(), work)
    state = json.loads((work / STATE_FILE).read_text())
    with tempfile.TemporaryDirectory() as tmp:
        copies = {}
        for name, apply in (("faster", {k: bool(e["faster"]) for k, e in state.items()}),
                            ("every", {k: True for k in state})):
            copies[name] = Path(tmp) / name
            shutil.copytree(work, copies[name])
            write_applied(copies[name], apply)
        exes = {"untuned": paragraph.build(mod, kernels="tvm"),
                "tuned, as paragraph applies it": paragraph.build(mod, kernels="tvm",
                                                                  tuning_db=work),
                "tuned, every kernel faster alone": paragraph.build(
                    mod, kernels="tvm", tuning_db=copies["faster"]),
                "tuned, every record": paragraph.build(mod, kernels="tvm",
                                                       tuning_db=copies["every"])}
    x = exes["untuned"].sample_inputs()
    want = exes["untuned"].run(*x)
    diffs = {k: max_difference(want, e.run(*x)) for k, e in exes.items()}
    before = wait_for_quiet_cores(print)
    medians = time_in_blocks([Config(k, partial(e.executor.run, *x, copy_outputs=False))
                              for k, e in exes.items()], args.blocks, block=50)
    after = cpu_contention()
    rows = {k: {"median_ms": statistics.median(m) * 1e3, "schedule": e.schedule.describe(),
                "max_difference": diffs[k]} for (k, e), m in zip(exes.items(), medians,
                                                                 strict=True)}
    for k, r in rows.items():
        print(f"{k:28} {r['median_ms']:.4f} ms  ({r['schedule']})")
    applied = sum(bool(e.get("applied")) for e in state.values())
    faster = sum(bool(e.get("faster")) for e in state.values())
    print(f"{faster} of {len(state)} tuned forms faster alone, {applied} applied; load before "
          f"{before}, after {after}")
    if args.json:
        atomic_write_json(args.json, {
            "benchmark": "tuning", "model": f"{args.model} (reduced)", "trials": args.trials,
            "kernels": "tvm", "schedule": "critical-path", "blocks": f"{args.blocks}x50",
            "tuned_forms_applied": applied, "tuned_forms_faster_alone": faster,
            "tuned_forms": len(state), "model_check": asdict(check), "results": rows,
            "contention_before": before, "contention_after": after,
            "contended": is_contended(before, after), "machine": describe_machine()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
