"""Tuning's model check: which tuned kernels to apply, decided by running whole models.

Kernels whose tuned form measured faster alone (`paragraph.tvm_interop.tune.metaschedule`) can
still make the model slower together (a tuned kernel's thread-pool wake-ups between small
kernels: a reduced SqueezeNet ran 15% slower with only faster kernels applied,
`benchmarks/tuning.py`), so `check_models` builds each model with nested sets of the faster
kernels (all, the half saving most, the one saving most; none), plans it under the schedule
``paragraph run`` uses, and times the builds end to end side by side; the set that runs fastest
is applied, and none unless it beats the untuned model by `paragraph.timing.MARGIN` (on every
model checked). Lowering then reads ``applied/`` (`paragraph.tvm_interop.build.tuning_db`), so a
tuning database does not make the checked models slower as measured on the machine that tuned.
`tune_and_check` tunes a model and checks it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import tvm
import tvm_ffi

from paragraph.files import atomic_write_json
from paragraph.planner.schedules import plan_schedule
from paragraph.planner.session import Session
from paragraph.progress import Log, info, quiet
from paragraph.schedule import Schedule
from paragraph.timing import MARGIN
from paragraph.tvm_interop.build.tuning_db import (
    APPLIED,
    MODEL_FILE,
    STATE_FILE,
    read_json,
    read_state,
    write_applied,
)
from paragraph.tvm_interop.measure.costdb import cost_versions
from paragraph.tvm_interop.meter.local import LocalMeter
from paragraph.tvm_interop.meter.protocol import Meter
from paragraph.tvm_interop.runtime.executor import make_executor
from paragraph.tvm_interop.runtime.program import KernelProgram
from paragraph.tvm_interop.runtime.target import resolve_target
from paragraph.tvm_interop.tune.metaschedule import TaskResult, faster, tune


@dataclass
class ModelCheck:
    """What `check_models` measured: the sets of faster tuned kernels it tried (their sizes,
    the last 0: untuned), each model's median milliseconds with each set, and the workload
    keys of the set applied (empty: none beat the untuned models)."""

    schedule: str
    sizes: list[int] = field(default_factory=list)
    ms: list[list[float]] = field(default_factory=list)  # [model][set]
    kept: list[str] = field(default_factory=list)
    reused: bool = False  # the same check was measured before: its verdict stands

    def describe(self) -> str:
        """One line per model: each set's time, and the verdict."""
        if not self.ms:
            return "model check: no tuned kernel measured faster alone; none applied"
        lines = []
        for i, row in enumerate(self.ms):
            base = row[-1]
            parts = [f"untuned {base:.3f} ms"] + [
                f"{n} tuned {t:.3f} ms ({base / t:.2f}x)"
                for n, t in zip(self.sizes[:-1], row[:-1], strict=True)]
            lines.append(f"model check{f' ({i + 1})' if len(self.ms) > 1 else ''}, "
                         f"{self.schedule} schedule: " + ", ".join(parts))
        lines.append(f"model check: applying {len(self.kept)} tuned kernel(s)"
                     + ("" if self.kept else ": no set of them made the model faster")
                     + (" (as measured before)" if self.reused else ""))
        return "\n".join(lines)


def check_models(mods: Sequence[tvm.IRModule], target: tvm.target.Target | str | None,
                 work_dir: str | os.PathLike[str], *, kernels: str = "tvm",
                 schedule: str = "critical-path", cores: int | None = None,
                 log: Log = info, remote: Meter | None = None) -> ModelCheck:
    """Choose the tuned kernels to apply by running the models end to end (module docstring):
    nested sets of the kernels whose tuned form measured faster alone, most saving first,
    each model planned under ``schedule`` with each set and timed side by side with the others
    (`Meter.runs`: here, or on ``remote``; outputs checked equal); the set with the
    best worst-case speedup over the models is applied if that beats untuned by `MARGIN`, else
    none. Writes the verdict into the state file, ``applied/`` and
    ``paragraph-tune-model.json``; the same check (same kernels, tuned times, models, schedule,
    target) is not measured twice."""
    work = Path(work_dir)
    tvm_target = resolve_target(target)
    meter: Meter = remote or LocalMeter()  # timed now: a check is not cached
    state = read_state(work)
    for e in state.values():  # a state written before the model check existed
        e.setdefault("faster", faster(e["untuned_ms"], e.get("tuned_ms")))
    chosen = sorted((k for k, e in state.items() if e["faster"]),
                    key=lambda k: -state[k]["weight"] * (state[k]["untuned_ms"]
                                                         - state[k]["tuned_ms"]))
    identity = hashlib.blake2b(json.dumps(
        [[(k, state[k]["tuned_ms"]) for k in chosen], [f"{tvm_ffi.structural_hash(m):x}"
                                                       for m in mods],
         schedule, kernels, str(tvm_target), cores, cost_versions()]).encode(),
        digest_size=16).hexdigest()
    result = ModelCheck(schedule)
    before = read_json(work / MODEL_FILE)
    if chosen and before.get("identity") == identity:
        result = ModelCheck(schedule, before["sizes"], before["ms"], before["kept"], True)
    elif chosen:
        n = len(chosen)
        result.sizes = [*sorted({n, (n + 1) // 2, 1}, reverse=True), 0]
        log(f"model check: {n} tuned kernel(s) faster alone; timing the model with sets of "
            f"{', '.join(map(str, result.sizes[:-1]))} of them against untuned "
            f"({schedule} schedule) ...")
        with tempfile.TemporaryDirectory(prefix="paragraph-check-") as tmp:
            dirs: list[str | None] = []
            for size in result.sizes[:-1]:
                d = Path(tmp) / str(size)
                for out in (d, d / APPLIED):  # a database that applies just these
                    write_applied(work, {k: True for k in chosen[:size]}, out=out)
                dirs.append(str(d))
            dirs.append(None)  # untuned: what a run without --tuning-db builds
            for mod in mods:
                plans = []
                for applied in dirs:
                    with Session(tvm_target, tuning_db=applied, cores=cores, log=quiet,
                                 remote=remote) as session:
                        plans.append(plan_schedule(schedule, session.build(mod, kernels),
                                                   session))
                candidates = [(p.program, p.schedule) for p in plans]
                block = _block(*candidates[-1])
                seconds = meter.runs(candidates, repeat=6, block=block, check=True)
                result.ms.append([t * 1e3 for t in seconds])
        ratios = [max(row[j] / row[-1] for row in result.ms)
                  for j in range(len(result.sizes) - 1)]
        best = min(range(len(ratios)), key=lambda j: (ratios[j], j))
        if ratios[best] < 1.0 - MARGIN:
            result.kept = chosen[:result.sizes[best]]
        atomic_write_json(work / MODEL_FILE, {**asdict(result), "identity": identity})
    kept = set(result.kept)
    for k, e in state.items():
        e["applied"] = k in kept
    atomic_write_json(work / STATE_FILE, state)
    write_applied(work, {k: k in kept for k in state})
    log(result.describe())
    return result


def _block(program: KernelProgram, schedule: Schedule) -> int:
    """Runs per timing block: about 20 ms of them (at least one), from one timed run."""
    graph = program.graph
    inputs = [np.zeros(graph[i].type.shape, graph[i].type.dtype) for i in graph.inputs]
    with make_executor(program, schedule) as ex:
        ex.run(*inputs, copy_outputs=False)
        start = time.perf_counter()
        ex.run(*inputs, copy_outputs=False)
        seconds = time.perf_counter() - start
    return max(1, min(50, int(0.02 / max(seconds, 1e-6))))


def tune_and_check(mod: tvm.IRModule, target: tvm.target.Target | str | None,
                   work_dir: str | os.PathLike[str], trials: int, *, kernels: str = "tvm",
                   max_tasks: int | None = None, seed: int = 0,
                   schedule: str = "critical-path", cores: int | None = None,
                   log: Log = info) -> list[TaskResult]:
    """`tune` ``mod`` into ``work_dir``, then decide by `check_models` which faster tuned
    kernels to apply, with the model run end to end under ``schedule`` on ``cores`` threads;
    each result says whether its kernel is applied."""
    results = tune(mod, target, work_dir, trials, kernels=kernels, max_tasks=max_tasks,
                   seed=seed, log=log)
    if not results:
        return results
    kept = set(check_models([mod], target, work_dir, kernels=kernels, schedule=schedule,
                            cores=cores, log=log).kept)
    for r in results:
        r.applied = r.key in kept
    return results
