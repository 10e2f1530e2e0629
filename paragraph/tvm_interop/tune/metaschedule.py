"""MetaSchedule tuning of a model's fused kernels: resumable, with progress and a summary.

`tune` lowers the model exactly as `build_program` does (with ``kernels="vendor"`` only
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

What gets applied is decided twice, by measurement. Per kernel (here): a tuned form counts as
*faster* only where it measured faster than the untuned kernel, alone, side by side, by
`paragraph.timing.MARGIN`. Per model, after the tasks: the model check
(`paragraph.planner.model_check.check_models`) runs the model end to end with sets of the
faster kernels and applies the set that pays. Lowering reads ``applied/``
(`paragraph.tvm_interop.build.tuning_db`), which holds only those records. An interrupted run
leaves ``applied/`` as the last check left it.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import json
import os
import sys
import tempfile
import time
import types
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import tvm
import tvm_ffi
from tvm import rpc as rpc_client
from tvm.driver import build as tvm_build
from tvm.s_tir import dlight as dl
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.analysis import estimate_tir_flops
from tvm.s_tir.meta_schedule.arg_info import ArgInfo
from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

from paragraph.errors import ParagraphError
from paragraph.files import atomic_write_bytes, atomic_write_json
from paragraph.progress import Log, info
from paragraph.timing import clearly_faster
from paragraph.tvm_interop.build.dispatch import dispatch_to_vendor, tvm_alternatives
from paragraph.tvm_interop.build.lowering import lower
from paragraph.tvm_interop.build.tuning_db import (
    RECORDS,
    STATE_FILE,
    WORKLOADS,
    read_state,
    write_applied,
)
from paragraph.tvm_interop.frontend.importers import prepare
from paragraph.tvm_interop.measure.costdb import cost_versions
from paragraph.tvm_interop.runtime.target import default_device, is_cpu, is_gpu, resolve_target

Tracker = tuple[str, int, str]  # an RPC tracker's host and port, and the device's key
_UPLOADS = itertools.count()  # kernels uploaded to a device, named apart


@dataclass
class TaskResult:
    """One tuned kernel: how often the model runs it, trials spent, latency before and after,
    and whether its tuned form is applied."""

    name: str
    weight: int
    trials: int
    untuned_ms: float
    best_ms: float | None  # MetaSchedule's own measurement of its best candidate
    skipped: bool = False
    tuned_ms: float | None = None  # the best candidate timed beside the untuned kernel
    faster: bool = False  # the tuned form measured faster alone
    applied: bool = False  # ... and the model check kept it: lowering applies it
    key: str = ""  # the workload's key in the database (`workload_key`)

    @property
    def speedup(self) -> float | None:
        return self.untuned_ms / self.tuned_ms if self.tuned_ms else None


def tune(mod: tvm.IRModule, target: tvm.target.Target | str | None, work_dir: str | os.PathLike,
         trials: int, *, kernels: str = "tvm", max_tasks: int | None = None, seed: int = 0,
         rpc: Tracker | None = None, log: Log = info) -> list[TaskResult]:
    """Tune ``mod``'s fused kernels with MetaSchedule, ``trials`` candidates per kernel, for
    ``target``: measured here, or with ``rpc`` (tracker host, port, device key) on the device
    registered with TVM's RPC tracker (the candidates built here, run there; the untuned and
    tuned kernels compared there too).

    ``max_tasks`` tunes only that many kernels, the ones with the most FLOPs in the model
    (weight x FLOPs). Returns one `TaskResult` per task, in tuning order; see the module
    docstring for resuming and the files written. Nothing new is applied until the model
    check runs (`paragraph.planner.model_check.check_models`, over every model tuned into
    ``work_dir``; `paragraph.planner.model_check.tune_and_check` does both).
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
    state = read_state(work)
    ms_cores = int(tvm_target.attrs.get("num-cores", os.cpu_count() or 1)) \
        if is_cpu(tvm_target) else "physical"
    log(f"tuning {len(tasks)} kernels, {trials} trials each, into {work}")
    tools = None  # builder and runner worker pools, started once, on the first task to tune
    results = []
    spent_trials, spent_s = 0, 0.0  # for the time left
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
            left = sum(max(0, trials - _records(database, t.dispatched[0]))
                       for t in tasks[i:]) if spent_trials else 0
            eta = (f", about {_duration(spent_s / spent_trials * left)} left for all"
                   if spent_trials else "")
            log(f"{label}: tuning {trials - done} trials{eta} ...")
            tools = tools or _workers(ms, ms_cores, tvm_target, rpc)
            _tune_one(ms, task, func_mod, tvm_target, work, database, trials - done, ms_cores,
                      seed + i, tools)
            spent_trials += trials - done
            spent_s += time.perf_counter() - start
            done = max(trials, _records(database, func_mod))
        best = _best_ms(database, func_mod)
        untuned, tuned = entry.get("untuned_ms"), entry.get("tuned_ms")
        if not skipped or untuned is None or (best is not None and tuned is None):
            untuned, tuned = _compare(func_mod, database, tvm_target, rpc)
        is_faster = faster(untuned, tuned)
        applied = is_faster and bool(entry.get("applied"))  # the last model check's verdict
        results.append(TaskResult(task.task_name, int(task.weight), done, untuned, best, skipped,
                                  tuned, is_faster, applied, key))
        state[key] = {"name": task.task_name, "weight": int(task.weight), "trials": done,
                      "untuned_ms": untuned, "best_ms": best, "tuned_ms": tuned,
                      "faster": is_faster, "applied": applied, "versions": cost_versions()}
        atomic_write_json(work / STATE_FILE, state)  # before "done": a kill after it loses nothing
        write_applied(work, {k: bool(e.get("applied")) for k, e in state.items()})
        if not skipped:
            found = (f"untuned {untuned * 1e3:.1f} us, tuned {tuned * 1e3:.1f} us: "
                     + ("faster (the model check decides)" if is_faster else "not faster")
                     if tuned is not None else "no valid candidate yet")
            log(f"{label}: done in {time.perf_counter() - start:.0f} s, {found}")
    return results


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _workers(ms, cores, target: tvm.target.Target, rpc: Tracker | None = None) -> tuple:
    """MetaSchedule's local builder and its runner (local, or through the RPC tracker), with
    timeouts for a busy 2-core machine (the default 30 s can pass while worker processes import
    TVM). The builder starts new worker processes for every batch, and MetaSchedule's own
    build function imports ``tvm.s_tir.tensor_intrin`` in each (16 s here); CPU candidates
    build without it."""
    workers = cores if isinstance(cores, int) else None
    f_build = build_candidate if is_cpu(target) else None
    builder = ms.builder.LocalBuilder(max_workers=workers, timeout_sec=300.0, f_build=f_build)
    if rpc is None:
        return builder, ms.runner.LocalRunner(timeout_sec=120.0)
    host, port, key = rpc
    config = ms.runner.RPCConfig(tracker_host=host, tracker_port=port, tracker_key=key,
                                 session_timeout_sec=120)
    return builder, ms.runner.RPCRunner(rpc_config=config, max_workers=1)


def build_candidate(mod: tvm.IRModule, target: tvm.target.Target, _params=None):
    """MetaSchedule's ``default_build`` less the tensor-intrinsic registry import (runs in the
    builder's worker processes)."""
    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm_build(mod, target=target)


def _alternative_tasks(ms, mod: tvm.IRModule, target: tvm.target.Target) -> list:
    probe = tvm_alternatives(dispatch_to_vendor(prepare(mod), target))
    return [] if probe is None else ms.relax_integration.extract_tasks(
        lower(probe, target), target)


def import_tensor_intrinsics() -> None:
    """Import TVM's tensor intrinsics (``tvm.s_tir.tensor_intrin``, which every
    ``TuneContext`` imports) in a tenth of the time. They are TVMScript functions parsed at
    import, each calling ``inspect.stack()``; for a frame of a file no module owns (the
    import machinery's), ``inspect.getmodule`` scans all of ``sys.modules`` on every call, and
    with PyTorch loaded (``tvm_ffi`` imports it) that is 2,000 modules: 24 s on this machine
    before a first trial, 2.6 s with the answer kept per file name. Only frames and code
    objects (no ``__module__`` to go by) are kept, and only during this import."""
    if "tvm.s_tir.tensor_intrin" in sys.modules:
        return
    original = inspect.getmodule
    by_file: dict[str, types.ModuleType | None] = {}

    def getmodule(object: object, _filename: str | None = None) -> types.ModuleType | None:
        if _filename is None or hasattr(object, "__module__"):
            return original(object, _filename)
        if _filename not in by_file:
            by_file[_filename] = original(object, _filename)
        return by_file[_filename]

    inspect.getmodule = getmodule
    try:  # the import is the point: here, under the patch, not at this module's import
        importlib.import_module("tvm.s_tir.tensor_intrin")
    finally:
        inspect.getmodule = original


def _tune_one(ms, task, func_mod, target, work: Path, database, trials: int, cores, seed: int,
              tools: tuple) -> None:
    """One task through MetaSchedule's own tuner: evolutionary search with an XGBoost cost
    model, its population scaled down for small budgets (512 candidates per round would cost
    more than the few trials they choose)."""
    population = max(64, min(512, 8 * trials))
    import_tensor_intrinsics()
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


def faster(untuned_ms: float, tuned_ms: float | None) -> bool:
    """The tuned form beat the untuned kernel alone beyond noise (`clearly_faster`)."""
    return tuned_ms is not None and clearly_faster(tuned_ms, untuned_ms)


def _compare(func_mod: tvm.IRModule, database, target: tvm.target.Target,
             rpc: Tracker | None = None, rounds: int = 5) -> tuple[float, float | None]:
    """Milliseconds of the kernel untuned (what untuned programs run) and with the database's
    best schedule (None without one), timed alternately with one timer, medians: here, or
    on the ``rpc`` device (one session for both)."""
    best = database.query_ir_module(func_mod, target, "main") \
        if database.has_workload(func_mod) else None
    with _session(rpc) as session:
        untuned = _timer(func_mod, target, session, default_schedule=True)
        tuned = _timer(best, target, session) if best is not None else None
        a, b = [], []
        for _ in range(rounds):
            a.append(untuned())
            if tuned is not None:
                b.append(tuned())
    return float(np.median(a)), float(np.median(b)) if b else None


@contextmanager
def _session(rpc: Tracker | None) -> Iterator[Any]:
    """A session on the ``rpc`` device (None: measure here), closed after the block."""
    if rpc is None:
        yield None
        return
    host, port, key = rpc
    session = rpc_client.connect_tracker(host, port).request(key, priority=1,
                                                              session_timeout=120)
    try:
        yield session
    finally:
        del session


def _timer(func_mod: tvm.IRModule, target: tvm.target.Target, session: Any = None,
           default_schedule: bool = False) -> Callable[[], float]:
    """A function that times one compiled kernel: seconds per call, as milliseconds, over
    enough calls to take a few milliseconds (small kernels are microseconds); on the device of
    the RPC ``session`` where one is given (the kernel built here, uploaded)."""
    if default_schedule and is_gpu(target):
        with target:
            func_mod = dl.ApplyDefaultSchedule(dl.gpu.Fallback())(func_mod)
    lib = tvm.compile(func_mod, target=target).mod
    if session is None:
        dev = default_device(target)
    else:  # a name of its own: a file loaded there is not replaced under its handle
        name = f"kernel{next(_UPLOADS)}-{os.getpid()}.so"
        with tempfile.TemporaryDirectory(prefix="paragraph-tune-") as tmp:
            path = Path(tmp) / name
            lib.export_library(str(path))
            session.upload(str(path))
        lib = session.load_module(name)
        dev = session.cuda(0) if is_gpu(target) else session.cpu(0)
    rng = np.random.default_rng(0)  # integer arguments (indices) zero: in range of any table
    args = [tvm.runtime.tensor(rng.standard_normal(info.shape).astype(info.dtype)
                               if np.dtype(str(info.dtype)).kind == "f"
                               else np.zeros(info.shape, info.dtype), dev)
            for info in ArgInfo.from_prim_func(func_mod["main"])]
    timer = lib.time_evaluator("main", dev, number=1, repeat=3, min_repeat_ms=5)
    return lambda: float(np.median(timer(*args).results)) * 1e3




def _repair_records(work: Path, log: Log) -> None:
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
    """The tuned kernels as a table (microseconds: reduced models' kernels are that small):
    faster alone, applied (the model check kept it), and the sum of the model's kernel times
    (weight x latency) before and after, counting a kernel as tuned only where it is applied."""
    lines = [f"{'kernel':44} {'x':>3} {'trials':>6} {'untuned us':>11} {'tuned us':>9} "
             f"{'speedup':>8}  faster  applied"]
    for r in results:
        best = f"{r.tuned_ms * 1e3:9.1f}" if r.tuned_ms is not None else f"{'-':>9}"
        speed = f"{r.speedup:7.2f}x" if r.speedup else f"{'-':>8}"
        lines.append(f"{r.name[:44]:44} {r.weight:3d} {r.trials:6d} {r.untuned_ms * 1e3:11.1f} "
                     f"{best} {speed}  {'yes' if r.faster else 'no':6}  "
                     f"{'yes' if r.applied else 'no'}")
    before = sum(r.weight * r.untuned_ms for r in results)
    after = sum(r.weight * (r.tuned_ms if r.applied and r.tuned_ms is not None
                            else r.untuned_ms) for r in results)
    applied, faster = sum(r.applied for r in results), sum(r.faster for r in results)
    lines.append(f"tuned kernels in the model: {before:.3f} ms untuned -> {after:.3f} ms "
                 f"({before / after if after else float('nan'):.2f}x, summed alone); "
                 f"{faster} of {len(results)} tuned forms faster alone, {applied} applied")
    return "\n".join(lines)


__all__ = ["tune", "TaskResult", "format_summary", "faster"]
