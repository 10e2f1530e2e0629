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

What gets applied is decided twice, by measurement. Per kernel: a tuned form counts as
*faster* only where it measured faster than the untuned kernel, alone, side by side. Per model
(`check_models`, after the tasks): kernels faster alone can still make the model slower
together (a tuned kernel's thread-pool wake-ups between small kernels: a reduced SqueezeNet ran
15% slower with only faster kernels applied, `benchmarks/tuning.py`), so the model is built
with nested sets of the faster kernels (all, the half saving most, the one saving most; none)
and timed end to end under the schedule ``paragraph run`` uses, side by side; the set that
runs fastest is applied, and none unless it beats the untuned model by `MIN_GAIN` (on every
model checked). Lowering reads ``applied/`` (`paragraph.tvm_interop.build.tuning_db`), which holds
only those records, so a tuning database does not make the checked models slower as measured
on the machine that tuned. An interrupted run leaves ``applied/`` as the last check left it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
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
from paragraph.planner import end_to_end, plan_schedule
from paragraph.tvm_interop.build.dispatch import dispatch_to_vendor, tvm_alternatives
from paragraph.tvm_interop.build.lowering import default_device, is_gpu, lower, resolve_target
from paragraph.tvm_interop.build.program import build_program
from paragraph.tvm_interop.build.tuning_db import (
    APPLIED,
    MODEL_FILE,
    RECORDS,
    STATE_FILE,
    WORKLOADS,
    write_applied,
)
from paragraph.tvm_interop.frontend.importers import prepare
from paragraph.tvm_interop.runtime.executor import make_executor
from paragraph.tvm_interop.runtime.program import KernelProgram


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
         check: bool = True, schedule: str = "critical-path", cores: int | None = None,
         log: Callable[[str], None] = print) -> list[TaskResult]:
    """Tune ``mod``'s fused kernels with MetaSchedule, ``trials`` candidates per kernel, then
    (``check``) decide by `check_models` which faster tuned kernels to apply, with the model
    run end to end under ``schedule`` on ``cores`` threads.

    ``max_tasks`` tunes only that many kernels, the ones with the most FLOPs in the model
    (weight x FLOPs). Returns one `TaskResult` per task, in tuning order; see the module
    docstring for resuming and the files written. With ``check`` False nothing new is applied
    until the caller runs `check_models` (over every model tuned into ``work_dir``).
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
    ms_cores = int(tvm_target.attrs.get("num-cores", os.cpu_count() or 1)) \
        if tvm_target.kind.name == "llvm" else "physical"
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
            tools = tools or _workers(ms, ms_cores, tvm_target)
            _tune_one(ms, task, func_mod, tvm_target, work, database, trials - done, ms_cores,
                      seed + i, tools)
            spent_trials += trials - done
            spent_s += time.perf_counter() - start
            done = max(trials, _records(database, func_mod))
        best = _best_ms(database, func_mod)
        untuned, tuned = entry.get("untuned_ms"), entry.get("tuned_ms")
        if not skipped or untuned is None or (best is not None and tuned is None):
            untuned, tuned = _compare(func_mod, database, tvm_target)
        faster = _faster(untuned, tuned)
        applied = faster and bool(entry.get("applied"))  # the last model check's verdict
        results.append(TaskResult(task.task_name, int(task.weight), done, untuned, best, skipped,
                                  tuned, faster, applied, key))
        state[key] = {"name": task.task_name, "weight": int(task.weight), "trials": done,
                      "untuned_ms": untuned, "best_ms": best, "tuned_ms": tuned,
                      "faster": faster, "applied": applied}
        atomic_write_json(work / STATE_FILE, state)  # before "done": a kill after it loses nothing
        write_applied(work, {k: bool(e.get("applied")) for k, e in state.items()})
        if not skipped:
            found = (f"untuned {untuned * 1e3:.1f} us, tuned {tuned * 1e3:.1f} us: "
                     + ("faster (the model check decides)" if faster else "not faster")
                     if tuned is not None else "no valid candidate yet")
            log(f"{label}: done in {time.perf_counter() - start:.0f} s, {found}")
    if check:
        kept = set(check_models([mod], tvm_target, work, kernels=kernels, schedule=schedule,
                                cores=cores, log=log).kept)
        for r in results:
            r.applied = r.key in kept
    return results


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
                 work_dir: str | os.PathLike, *, kernels: str = "tvm",
                 schedule: str = "critical-path", cores: int | None = None,
                 log: Callable[[str], None] = print) -> ModelCheck:
    """Choose the tuned kernels to apply by running the models end to end (module docstring):
    nested sets of the kernels whose tuned form measured faster alone, most saving first,
    each model planned under ``schedule`` with each set and timed side by side with the others
    (`paragraph.planner.end_to_end`, outputs checked equal); the set with the best worst-case
    speedup over the models is applied if that beats untuned by `MIN_GAIN`, else none. Writes
    the verdict into the state file, ``applied/`` and ``paragraph-tune-model.json``; the same
    check (same kernels, tuned times, models, schedule, target) is not measured twice."""
    work = Path(work_dir)
    tvm_target = resolve_target(target)
    state = _read_state(work)
    for e in state.values():  # a state written before the model check existed
        e.setdefault("faster", _faster(e["untuned_ms"], e.get("tuned_ms")))
    faster = sorted((k for k, e in state.items() if e["faster"]),
                    key=lambda k: -state[k]["weight"] * (state[k]["untuned_ms"]
                                                         - state[k]["tuned_ms"]))
    identity = hashlib.blake2b(json.dumps(
        [[(k, state[k]["tuned_ms"]) for k in faster], [f"{tvm_ffi.structural_hash(m):x}"
                                                       for m in mods],
         schedule, kernels, str(tvm_target), cores]).encode(), digest_size=16).hexdigest()
    result = ModelCheck(schedule)
    before = _read_json(work / MODEL_FILE)
    if faster and before.get("identity") == identity:
        result = ModelCheck(schedule, before["sizes"], before["ms"], before["kept"], True)
    elif faster:
        n = len(faster)
        result.sizes = [*sorted({n, (n + 1) // 2, 1}, reverse=True), 0]
        log(f"model check: {n} tuned kernel(s) faster alone; timing the model with sets of "
            f"{', '.join(map(str, result.sizes[:-1]))} of them against untuned "
            f"({schedule} schedule) ...")
        with tempfile.TemporaryDirectory(prefix="paragraph-check-") as tmp:
            dirs: list[str | None] = []
            for size in result.sizes[:-1]:
                d = Path(tmp) / str(size)
                for out in (d, d / APPLIED):  # a database that applies just these
                    write_applied(work, {k: True for k in faster[:size]}, out=out)
                dirs.append(str(d))
            dirs.append(None)  # untuned: what a run without --tuning-db builds
            for mod in mods:
                plans = [plan_schedule(schedule, build_program(
                    mod, tvm_target, tuning_db=d, kernels=kernels), tuning_db=d, cores=cores)
                    for d in dirs]
                candidates = [(p.program, p.schedule) for p in plans]
                block = _block(*candidates[-1])
                seconds = end_to_end(candidates, None, "", repeat=6, block=block, check=True)
                result.ms.append([t * 1e3 for t in seconds])
        ratios = [max(row[j] / row[-1] for row in result.ms)
                  for j in range(len(result.sizes) - 1)]
        best = min(range(len(ratios)), key=lambda j: (ratios[j], j))
        if ratios[best] < 1.0 - MIN_GAIN:
            result.kept = faster[:result.sizes[best]]
        atomic_write_json(work / MODEL_FILE, {**asdict(result), "identity": identity})
    kept = set(result.kept)
    for k, e in state.items():
        e["applied"] = k in kept
    atomic_write_json(work / STATE_FILE, state)
    write_applied(work, {k: k in kept for k in state})
    log(result.describe())
    return result


def _block(program: KernelProgram, schedule) -> int:
    """Runs per timing block: about 20 ms of them (at least one), from one timed run."""
    graph = program.graph
    inputs = [np.zeros(graph[i].type.shape, graph[i].type.dtype) for i in graph.inputs]
    with make_executor(program, schedule) as ex:
        ex.run(*inputs, copy_outputs=False)
        start = time.perf_counter()
        ex.run(*inputs, copy_outputs=False)
        seconds = time.perf_counter() - start
    return max(1, min(50, int(0.02 / max(seconds, 1e-6))))


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


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


def _faster(untuned_ms: float, tuned_ms: float | None) -> bool:
    """The tuned form beat the untuned kernel alone by `MIN_GAIN` (beyond timer noise)."""
    return tuned_ms is not None and tuned_ms < untuned_ms * (1.0 - MIN_GAIN)


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
    return _read_json(work / STATE_FILE)  # if lost, rebuilt: trials are counted in the database


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


__all__ = ["tune", "check_models", "ModelCheck", "TaskResult", "format_summary"]
