"""MetaSchedule tuning of a model's fused kernels: resumable, with progress and a summary.

`tune` lowers the model exactly as `KernelProgram.build` does (with ``kernels="vendor"`` only
the kernels TVM still generates are tuned; with ``kernels="auto"`` also the TVM form of every
vendor-able pattern, which ``--kernels auto`` then weighs, tuned, against the vendor call),
extracts one MetaSchedule task per distinct fused kernel (``relax_integration.extract_tasks``)
and tunes the tasks one at a time, heaviest first, into the work directory's JSON database
(``database_workload.json``, ``database_tuning_record.json``): the directory every other verb
takes as ``--tuning-db``.

Resuming: MetaSchedule appends each measured candidate to the database as it goes, so a stopped
run loses at most the batch in flight. On restart, a task that already has its trial budget in
the database is skipped, a partly tuned one gets only the rest, and a record line torn by a kill
is dropped. ``paragraph-tune.json`` in the work dir keeps each task's trials spent and its
untuned and tuned latencies, measured side by side with one timer after tuning.

A tuned kernel is applied only where it measured faster than the untuned one
(`paragraph.tvm_interop.tuning_db`: lowering reads ``applied/``, which holds only those
records), so no tuned kernel applied measured slower than its untuned form (the model as a
whole can still run slower: `benchmarks/tuning.py`).
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import tvm
import tvm_ffi
from tvm.driver import build as tvm_build
from tvm.s_tir import dlight as dl
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.analysis import estimate_tir_flops
from tvm.s_tir.meta_schedule.arg_info import ArgInfo
from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

from paragraph.errors import ParagraphError
from paragraph.files import atomic_write_bytes, atomic_write_json
from paragraph.tvm_interop.importers import prepare
from paragraph.tvm_interop.lowering import default_device, is_gpu, lower, resolve_target
from paragraph.tvm_interop.tuning_db import (
    RECORDS,
    STATE_FILE,
    WORKLOADS,
    write_applied,
)
from paragraph.tvm_interop.vendor.dispatch import dispatch_to_vendor, tvm_alternatives


@dataclass
class TaskResult:
    """One tuned kernel: how often the model runs it, trials spent, latency before and after."""

    name: str
    weight: int
    trials: int
    untuned_ms: float
    best_ms: float | None  # MetaSchedule's own measurement of its best candidate
    skipped: bool = False
    tuned_ms: float | None = None  # the best candidate timed beside the untuned kernel
    applied: bool = False  # the tuned kernel measured faster: lowering applies it

    @property
    def speedup(self) -> float | None:
        return self.untuned_ms / self.tuned_ms if self.tuned_ms else None


def tune(mod: tvm.IRModule, target: tvm.target.Target | str | None, work_dir: str | os.PathLike,
         trials: int, *, kernels: str = "tvm", max_tasks: int | None = None, seed: int = 0,
         log: Callable[[str], None] = print) -> list[TaskResult]:
    """Tune ``mod``'s fused kernels with MetaSchedule, ``trials`` candidates per kernel.

    ``max_tasks`` tunes only that many kernels, the ones with the most FLOPs in the model
    (weight x FLOPs). Returns one `TaskResult` per task, in tuning order; see the module
    docstring for resuming and the files written.
    """
    if trials < 1:
        raise ParagraphError(f"--trials must be at least 1, got {trials}")
    tvm_target = resolve_target(target)
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    tasks = ms.relax_integration.extract_tasks(
        lower(mod, tvm_target, dispatch=None if kernels == "tvm" else partial(
            dispatch_to_vendor, target=tvm_target)), tvm_target)
    if kernels == "auto":  # also the TVM forms of the vendor calls, which auto weighs
        tasks += _alternative_tasks(ms, mod, tvm_target)
    tasks = [t for t in tasks if not t.dispatched[0].attrs or
             not t.dispatched[0].attrs.get("tirx.is_scheduled", False)]
    tasks.sort(key=lambda t: -t.weight * _flops(t.dispatched[0]))
    if max_tasks is not None:
        tasks = tasks[:max_tasks]
    if not tasks:
        log("nothing to tune: the model has no TVM-generated kernels")
        return []
    _repair_records(work, log)
    database = ms.database.JSONDatabase(work_dir=str(work), module_equality="structural")
    state = _read_state(work)
    cores = int(tvm_target.attrs.get("num-cores", os.cpu_count() or 1)) \
        if tvm_target.kind.name == "llvm" else "physical"
    log(f"tuning {len(tasks)} kernels, {trials} trials each, into {work}")
    tools = None  # builder and runner worker pools, started once, on the first task to tune
    results = []
    for i, task in enumerate(tasks):
        func_mod = task.dispatched[0]
        key = _workload_key(func_mod)
        entry = state.get(key, {})
        done = max(entry.get("trials", 0), _records(database, func_mod))
        label = f"[{i + 1}/{len(tasks)}] {task.task_name} (x{task.weight})"
        skipped = done >= trials
        start = time.perf_counter()
        if skipped:
            log(f"{label}: already has {done} trials, skipping")
        else:
            log(f"{label}: tuning {trials - done} trials ...")
            tools = tools or _workers(ms, cores, tvm_target)
            _tune_one(ms, task, func_mod, tvm_target, work, database, trials - done, cores,
                      seed + i, tools)
            done = max(trials, _records(database, func_mod))
        best = _best_ms(database, func_mod)
        untuned, tuned = entry.get("untuned_ms"), entry.get("tuned_ms")
        if not skipped or untuned is None or (best is not None and tuned is None):
            untuned, tuned = _compare(func_mod, database, tvm_target)
        applied = tuned is not None and tuned < untuned * (1.0 - MIN_GAIN)
        results.append(TaskResult(task.task_name, int(task.weight), done, untuned, best, skipped,
                                  tuned, applied))
        state[key] = {"name": task.task_name, "weight": int(task.weight), "trials": done,
                      "untuned_ms": untuned, "best_ms": best, "tuned_ms": tuned,
                      "applied": applied}
        atomic_write_json(work / STATE_FILE, state)  # before "done": a kill after it loses nothing
        write_applied(work, {k: bool(e.get("applied")) for k, e in state.items()})
        if not skipped:
            found = (f"untuned {untuned * 1e3:.1f} us, tuned {tuned * 1e3:.1f} us: "
                     f"{'applied' if applied else 'not applied (not faster)'}"
                     if tuned is not None else "no valid candidate yet")
            log(f"{label}: done in {time.perf_counter() - start:.0f} s, {found}")
    return results


def _workers(ms, cores, target: tvm.target.Target) -> tuple:
    """MetaSchedule's local builder and runner, with timeouts for a busy 2-core machine (the
    default 30 s can pass while worker processes import TVM). The builder starts new worker
    processes for every batch, and MetaSchedule's own build function imports
    ``tvm.s_tir.tensor_intrin`` in each (16 s here); CPU candidates build without it."""
    workers = cores if isinstance(cores, int) else None
    f_build = build_candidate if target.kind.name == "llvm" else None
    return (ms.builder.LocalBuilder(max_workers=workers, timeout_sec=300.0, f_build=f_build),
            ms.runner.LocalRunner(timeout_sec=120.0))


def build_candidate(mod: tvm.IRModule, target: tvm.target.Target, _params=None):
    """MetaSchedule's ``default_build`` less the tensor-intrinsic registry import (runs in the
    builder's worker processes)."""
    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm_build(mod, target=target)


def _alternative_tasks(ms, mod: tvm.IRModule, target: tvm.target.Target) -> list:
    probe = tvm_alternatives(dispatch_to_vendor(prepare(mod), target))
    return [] if probe is None else ms.relax_integration.extract_tasks(
        lower(probe, target), target)


def _tune_one(ms, task, func_mod, target, work: Path, database, trials: int, cores, seed: int,
              tools: tuple) -> None:
    """One task through MetaSchedule's own tuner: evolutionary search with an XGBoost cost
    model, its population scaled down for small budgets (512 candidates per round would cost
    more than the few trials they choose)."""
    population = max(64, min(512, 8 * trials))
    strategy = ms.search_strategy.EvolutionarySearch(
        population_size=population, init_min_unmeasured=min(50, population // 4))
    context = ms.TuneContext(mod=func_mod, target=target, space_generator="post-order-apply",
                             search_strategy=strategy, task_name=task.task_name,
                             rand_state=seed, num_threads=cores).clone()
    builder, runner = tools
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # xgboost's deprecation chatter
        ms.tune.tune_tasks(tasks=[context], task_weights=[1.0], work_dir=str(work),
                           max_trials_global=trials, max_trials_per_task=trials,
                           num_trials_per_iter=min(64, trials), builder=builder, runner=runner,
                           database=database)


def _flops(func_mod: tvm.IRModule) -> float:
    try:
        return float(estimate_tir_flops(func_mod))
    except Exception:  # some PrimFuncs defeat the estimator: order them last
        return 0.0


def _workload_key(func_mod: tvm.IRModule) -> str:
    return f"{tvm_ffi.structural_hash(func_mod):016x}"


def _records(database, func_mod: tvm.IRModule) -> int:
    """How many measured candidates the database holds for this kernel."""
    if not database.has_workload(func_mod):
        return 0
    workload = database.commit_workload(func_mod)
    return len(database.get_top_k(workload, 1 << 30))


def _best_ms(database, func_mod: tvm.IRModule) -> float | None:
    if not database.has_workload(func_mod):
        return None
    top = database.get_top_k(database.commit_workload(func_mod), 1)
    if not top or not top[0].run_secs:
        return None
    return float(np.mean([float(s) for s in top[0].run_secs])) * 1e3


# a tuned kernel must beat the untuned one by this much to be applied (timer noise)
MIN_GAIN = 0.03


def _compare(func_mod: tvm.IRModule, database, target: tvm.target.Target,
             rounds: int = 5) -> tuple[float, float | None]:
    """Milliseconds of the kernel untuned (what untuned programs run) and with the database's
    best schedule (None without one), timed alternately with one timer, medians."""
    untuned = _timer(func_mod, target, default_schedule=True)
    best = database.query_ir_module(func_mod, target, "main") \
        if database.has_workload(func_mod) else None
    tuned = _timer(best, target) if best is not None else None
    a, b = [], []
    for _ in range(rounds):
        a.append(untuned())
        if tuned is not None:
            b.append(tuned())
    return float(np.median(a)), float(np.median(b)) if b else None


def _timer(func_mod: tvm.IRModule, target: tvm.target.Target, default_schedule: bool = False):
    """A function that times one compiled kernel: seconds per call, as milliseconds, over
    enough calls to take a few milliseconds (small kernels are microseconds)."""
    dev = default_device(target)
    if default_schedule and is_gpu(target):
        with target:
            func_mod = dl.ApplyDefaultSchedule(dl.gpu.Fallback())(func_mod)
    lib = tvm.compile(func_mod, target=target).mod
    rng = np.random.default_rng(0)  # integer arguments (indices) zero: in range of any table
    args = [tvm.runtime.tensor(rng.standard_normal(info.shape).astype(info.dtype)
                               if np.dtype(str(info.dtype)).kind == "f"
                               else np.zeros(info.shape, info.dtype), dev)
            for info in ArgInfo.from_prim_func(func_mod["main"])]
    timer = lib.time_evaluator("main", dev, number=1, repeat=3, min_repeat_ms=5)
    return lambda: float(np.median(timer(*args).results)) * 1e3


def _read_state(work: Path) -> dict:
    path = work / STATE_FILE
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}  # rebuilt from the database: trials are counted there


def _repair_records(work: Path, log: Callable[[str], None]) -> None:
    """Drop a final line that a kill tore in half (MetaSchedule would refuse the file)."""
    for name in (WORKLOADS, RECORDS):
        path = work / name
        if not path.exists():
            continue
        lines = path.read_bytes().splitlines(keepends=True)
        good = []
        for line in lines:
            try:
                json.loads(line)
                good.append(line if line.endswith(b"\n") else line + b"\n")
            except ValueError:
                log(f"dropping a torn line from {path} (an interrupted run)")
        if good != lines:
            atomic_write_bytes(path, b"".join(good))


def format_summary(results: list[TaskResult]) -> str:
    """The tuned kernels as a table (microseconds: reduced models' kernels are that small),
    with the model's estimated kernel time (weight x latency) before and after: a kernel counts
    as tuned only where the tuned form is applied."""
    lines = [f"{'kernel':44} {'x':>3} {'trials':>6} {'untuned us':>11} {'tuned us':>9} "
             f"{'speedup':>8}  applied"]
    for r in results:
        best = f"{r.tuned_ms * 1e3:9.1f}" if r.tuned_ms is not None else f"{'-':>9}"
        speed = f"{r.speedup:7.2f}x" if r.speedup else f"{'-':>8}"
        lines.append(f"{r.name[:44]:44} {r.weight:3d} {r.trials:6d} {r.untuned_ms * 1e3:11.1f} "
                     f"{best} {speed}  {'yes' if r.applied else 'no'}")
    before = sum(r.weight * r.untuned_ms for r in results)
    after = sum(r.weight * (r.tuned_ms if r.applied and r.tuned_ms is not None
                            else r.untuned_ms) for r in results)
    applied = sum(r.applied for r in results)
    lines.append(f"tuned kernels in the model: {before:.3f} ms untuned -> {after:.3f} ms "
                 f"({before / after if after else float('nan'):.2f}x); {applied} of "
                 f"{len(results)} tuned forms applied (the others measured no faster)")
    return "\n".join(lines)


__all__ = ["tune", "TaskResult", "format_summary"]
