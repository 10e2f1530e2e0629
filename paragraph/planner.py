"""Choosing a schedule for a program: the one place that does.

`plan_schedule` takes a `KernelProgram` and a schedule name and returns a `Plan`: the program
the schedule runs (IOS merges and critical-path splits rebuild it through the verified rule
library), the `Schedule`, and a report of what was measured and decided. Behind the names:

* ``sequential``, ``wavefront``, ``opara``, ``nimble``: the graph algorithms of
  `paragraph.passes.schedule`, on the program as it is;
* ``critical-path``: `paragraph.passes.schedule.critical_path` over each kernel's 1-thread
  time measured in model order and the measured cross-stream hand-off; on a CPU with two
  streams or more, also the program with its lone convolutions split (`paragraph.passes.split`),
  kept if its outputs agree and it runs faster end to end;
* ``ios``, ``ios-<mode>``: the IOS dynamic program (`paragraph.passes.ios`) over stages
  measured on the device (`paragraph.tvm_interop.meter.stages`), merged convolutions applied with
  the library rule, the result kept only if it beats the plain sequence end to end.

End-to-end timings (`end_to_end`) and the output check (`tolerance`, `max_difference`) live
here too, so a choice made from measurements is made one way.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from paragraph.errors import ParagraphError
from paragraph.graph import Graph
from paragraph.inputs import sample_inputs
from paragraph.machine import (
    LoadWatch,
    available_memory,
    cpu_count,
    release_memory,
    wait_for_quiet_cores,
)
from paragraph.outputs import max_difference
from paragraph.passes.cost import CostModel, Device, cost_function, kernels_of
from paragraph.passes.ios import (
    CONCURRENT,
    IOS_SCHEDULES,
    MERGE,
    MODES,
    SEQUENTIAL,
    IOSOptions,
    Planned,
    SearchStats,
    apply_merges,
    blocks,
    carry_over,
    plan_streams,
    search,
    to_schedule,
)
from paragraph.passes.pools import pools_after_convs
from paragraph.passes.schedule import ALGORITHMS, critical_path, make_schedule, sequential
from paragraph.passes.search import Applied, Candidate, SearchOptions
from paragraph.passes.search import search as substitution_search
from paragraph.passes.split import split_lone_convs
from paragraph.progress import Progress
from paragraph.rules.library import default_library
from paragraph.rules.match import AnyRule
from paragraph.rules.parametric import MergeConvs, Unit
from paragraph.rules.rule import Rule, random_check
from paragraph.schedule import Schedule, kernel_ids
from paragraph.timing import Config, Timing, time_in_blocks
from paragraph.tvm_interop.build.lowering import resolve_target
from paragraph.tvm_interop.build.program import build_program
from paragraph.tvm_interop.build.tuning_db import tuning_id
from paragraph.tvm_interop.frontend.importers import prepare
from paragraph.tvm_interop.frontend.relax_graph import from_relax, to_relax
from paragraph.tvm_interop.measure.costdb import CostDB, CostKey
from paragraph.tvm_interop.measure.device import (
    SETTLE_RUNS,
    kernel_costs,
    measure_cpu_peaks,
    measure_handoff,
    vendor_tag,
)
from paragraph.tvm_interop.meter.signatures import SignatureMeter
from paragraph.tvm_interop.meter.stages import StageMeter
from paragraph.tvm_interop.runtime.executor import make_executor
from paragraph.tvm_interop.runtime.program import KernelProgram

if TYPE_CHECKING:  # a session on another device, made by the caller
    from paragraph.tvm_interop.meter.remote import Remote

SCHEDULES = (*ALGORITHMS, "ios", *IOS_SCHEDULES)
Log = Callable[[str], None]


@dataclass(frozen=True)
class Plan:
    """A program, the schedule it runs under, and what the planner measured and decided
    (``report``: times in ms; for IOS the search's statistics and stages; for critical-path
    the kernel-time summary and the split decision)."""

    program: KernelProgram
    schedule: Schedule
    report: Mapping[str, Any] = field(default_factory=dict)
    graph: Graph | None = None  # a substitution search's operator graph (the rewritten model)

    def __post_init__(self) -> None:
        object.__setattr__(self, "report", MappingProxyType(dict(self.report)))


@contextmanager
def _opened(db: CostDB | None) -> Iterator[CostDB]:
    """``db``, or the default cost database opened for the block and closed after it."""
    if db is not None:
        yield db
        return
    own = CostDB()
    try:
        yield own
    finally:
        own.close()


def plan_schedule(name: str, program: KernelProgram, *, options: IOSOptions | None = None,
                  db: CostDB | None = None, tuning_db: str | None = None,
                  cores: int | None = None, log: Log | None = None, split: bool = True,
                  remote: Remote | None = None) -> Plan:
    """The `Plan` for the schedule ``name``: one of `paragraph.passes.schedule.ALGORITHMS`
    (the program unchanged), ``ios`` (mode from ``options``) or ``ios-<mode>``. Measurements
    are cached in ``db`` (a `CostDB`; the default cache when None). IOS may return a program
    rebuilt with merged convolutions; ``critical-path`` one with split convolutions
    (``split``). With ``remote`` (`paragraph.tvm_interop.meter.remote.Remote`) the kernels, IOS's
    stages and whole runs are timed on that device, not here (not cached: the cost database
    is this machine's)."""
    check_schedule(name)
    if name not in ("critical-path", "ios", *IOS_SCHEDULES):
        return Plan(program, make_schedule(name, program.graph, cores=cores))
    with _opened(db) as db:
        if name == "critical-path":
            return _critical_path(program, db, tuning_db, cores, log, split, remote)
        options = options or IOSOptions()
        if name != "ios":
            options = replace(options, mode=name[len("ios-"):])
        plan = plan_ios(program, replace(options, cores=options.cores or cores), db=db,
                        tuning_db=tuning_db, log=log, remote=remote)
    if log is not None:
        log(f"  IOS: {plan.report['search']}")
    return plan


def check_schedule(name: str) -> None:
    """Raise `ParagraphError` unless ``name`` is one of `SCHEDULES`."""
    if name not in SCHEDULES:
        if name.startswith("ios-"):
            raise ParagraphError(f"unknown IOS mode {name[4:]!r} in {name!r}; choose from "
                                 f"{', '.join(IOS_SCHEDULES)}")
        raise ParagraphError(f"unknown schedule {name!r}; choose from {', '.join(SCHEDULES)}")


# ---------------------------------------------------------------------------- critical path
def _critical_path(program: KernelProgram, db: CostDB, tuning_db: str | None,
                   cores: int | None, log: Log | None, split: bool,
                   remote: Remote | None = None) -> Plan:
    """`critical_path` over measured 1-thread kernel times (`_measured_critical_path`); on a
    CPU its streams are timed against one stream of every core and the faster kept
    (`_one_stream_if_faster`); with ``split`` (CPU, two streams or more), lone convolutions
    are also split across the streams and the split program is kept if its outputs agree and
    it runs faster end to end."""
    on_cpu = program.target.kind.name == "llvm"
    streams = (cores or cpu_count()) if on_cpu else None
    tuning = tuning_id(tuning_db)  # cost keys name the tuned records, not the path
    plain = _measured_critical_path(program, db, tuning, streams, cores, log, remote)
    if on_cpu and streams is not None and streams >= 2:
        plain = _one_stream_if_faster(plain, db, tuning, streams, log, remote)
    plain = _with_pools_moved(plain, db, tuning_db, cores, log, remote)
    program = plain.program
    if not (split and on_cpu and streams is not None and streams >= 2):
        return plain
    try:
        rebuilt = split_program(program, 4 if streams >= 4 else 2, tuning_db=tuning_db, log=log)
    except Exception as exc:  # an optional rewrite: the plain schedule still stands
        warnings.warn(f"critical-path: the split program could not be built "
                      f"({type(exc).__name__}: {exc}); keeping the model's own kernels",
                      RuntimeWarning, stacklevel=3)
        rebuilt = None
    if rebuilt is None:
        return plain
    other = _measured_critical_path(rebuilt, db, tuning, streams, cores, log, remote)
    if log is not None:
        log("  critical-path: checking the split program's outputs, timing both ...")
    unsplit_s, split_s = end_to_end([(program, plain.schedule), (rebuilt, other.schedule)], db,
                                    tuning, check=True, remote=remote)
    keep = clearly_faster(split_s, unsplit_s)
    if log is not None:
        log(f"  critical-path end to end: {unsplit_s * 1e3:.2f} ms, split "
            f"{split_s * 1e3:.2f} ms: keeping the {'split' if keep else 'unsplit'} program")
    chosen = other if keep else plain
    return Plan(chosen.program, chosen.schedule,
                {**chosen.report, **_moved_report(plain.report),
                 "split": list(_split_rewrites(rebuilt)) if keep else [],
                 "unsplit_ms": unsplit_s * 1e3, "split_ms": split_s * 1e3})


def _split_rewrites(program: KernelProgram) -> tuple[str, ...]:
    return tuple(r for r in program.rewrites if r.startswith("split-conv-"))


def _moved_report(report: Mapping[str, Any]) -> dict[str, Any]:
    return {k: report[k] for k in ("pools", "unmoved_ms", "moved_ms") if k in report}


def _with_pools_moved(plan: Plan, db: CostDB, tuning_db: str | None, cores: int | None,
                      log: Log | None, remote: Remote | None) -> Plan:
    """``plan``, or where average pools of its program feed only 1 x 1 convolutions to fewer
    channels, the program rebuilt with each pool moved after its convolution
    (`pools_after_convs`: the library's ``pool-after-conv1x1``) and planned as ``plan`` is
    (`plan_like`): it does less work and adds no kernel, so it is kept unless its outputs
    differ (`ParagraphError`) or whole runs of ``plan`` time clearly faster
    (`clearly_faster`). The report names the pools moved (``pools``)."""
    program = plan.program
    if program.model is None:
        return plan
    try:
        moved, done = pools_after_convs(_model_graph(program), log=log)
        if not done:
            return plan
        other = plan_like(plan, moved, program.target, kernels=program.kernel_source,
                          rewrites=(*program.rewrites, *done), tuning_db=tuning_db, db=db,
                          cores=cores, remote=remote)
    except Exception as exc:  # an optional rewrite: the program as it is still stands
        warnings.warn(f"critical-path: the program with its pools moved could not be built "
                      f"({type(exc).__name__}: {exc}); keeping the model's own kernels",
                      RuntimeWarning, stacklevel=4)
        return plan
    if log is not None:
        log("  critical-path: checking the outputs with the pools moved, timing both ...")
    as_is_s, moved_s = end_to_end([(program, plan.schedule), (other.program, other.schedule)],
                                  db, tuning_id(tuning_db), check=True, remote=remote)
    keep = not clearly_faster(as_is_s, moved_s)
    if log is not None:
        log(f"  critical-path end to end: {as_is_s * 1e3:.2f} ms, pools moved "
            f"{moved_s * 1e3:.2f} ms: keeping the {'moved' if keep else 'unmoved'} pools")
    # the moved program's kernel-time summary over the stream choices made for ``plan``
    summary = {k: v for k, v in other.report.items()
               if k not in ("planned_like", "pools", "split")}
    chosen = Plan(other.program, other.schedule, {**plan.report, **summary}) if keep else plan
    return Plan(chosen.program, chosen.schedule,
                {**chosen.report, "pools": list(done) if keep else [],
                 "unmoved_ms": as_is_s * 1e3, "moved_ms": moved_s * 1e3})


# how much faster end to end the planner's more elaborate choice (several streams, kernels capped
# to fewer threads, a split program) must run than the plain one to be kept: two timings of one
# program differ by about this much on the shared host, and a choice made on noise is the
# sequential schedule in disguise (Inception-v3's and BERT's critical-path plans kept caps
# measured 0.2-0.9% slower than one plain stream in the search benchmark)
PLAN_MARGIN = 0.01


def clearly_faster(fancy_s: float, plain_s: float) -> bool:
    """Whether the elaborate choice's time ``fancy_s`` beats the plain one's ``plain_s`` by
    more than `PLAN_MARGIN`: on a tie the planner keeps the plainer schedule."""
    return fancy_s < plain_s * (1 - PLAN_MARGIN)


def _one_stream_if_faster(plan: Plan, db: CostDB, tuning: str, cores: int,
                          log: Log | None, remote: Remote | None = None) -> Plan:
    """A CPU schedule of several one-thread streams against one stream whose kernels use all
    ``cores``, timed end to end, the faster kept: a chain of large kernels gains more from
    threads inside each kernel than from the little that runs beside it (ResNeXt-50 with
    vendor kernels ran 64.5 ms on two streams of one thread, 52 ms on one of two), while
    NASNet's many small kernels are the other way round."""
    if len(plan.schedule.streams) < 2:
        return plan
    program = plan.program
    one = _one_stream(plan, db, tuning, cores, log, remote)
    streams_s, one_s = end_to_end([(program, plan.schedule), (program, one)], db, tuning,
                                  remote=remote)
    keep = not clearly_faster(streams_s, one_s)
    if log is not None:
        log(f"  critical-path: {len(plan.schedule.streams)} streams of 1 thread "
            f"{streams_s * 1e3:.2f} ms, 1 stream of {cores} threads {one_s * 1e3:.2f} ms: "
            f"keeping {'one stream' if keep else 'the streams'}")
    report = {**plan.report, "streams_ms": streams_s * 1e3, "one_stream_ms": one_s * 1e3,
              "one_stream_kernels_on_fewer_threads": len(one.kernel_threads)}
    return Plan(program, one if keep else plan.schedule, report)


def _one_stream(plan: Plan, db: CostDB, tuning: str, cores: int, log: Log | None,
                remote: Remote | None, caps: bool | None = None) -> Schedule:
    """One stream of ``cores`` threads over ``plan``'s kernels, in its critical-path order,
    with the vendor kernels that run faster on one thread capped to it where whole runs
    confirm it (``caps`` None), or as ``caps`` says without timing them. Each kernel is faster
    capped when timed alone, but between two 2-thread kernels a 1-thread one lets the OpenMP
    worker fall asleep: a token-id encoder's one stream ran 0.74-0.79 ms with 12-16 kernels
    capped, 0.55-0.58 ms with none."""
    program = plan.program
    one = Schedule.build(program.graph, [kernel_ids(program.graph)], threads=cores,
                         name="critical-path", info=plan.schedule.info)
    if caps is False:
        return one
    capped = fewer_threads_where_faster(program, one, db, tuning, log, remote)
    if caps or not capped.kernel_threads:
        return capped
    one_s, capped_s = end_to_end([(program, one), (program, capped)], db, tuning,
                                 remote=remote)
    keep = clearly_faster(capped_s, one_s)
    if log is not None:
        log(f"  critical-path: 1 stream {one_s * 1e3:.2f} ms, with {len(capped.kernel_threads)} "
            f"kernels on 1 thread {capped_s * 1e3:.2f} ms: keeping "
            f"{'them capped' if keep else 'every kernel on ' + str(cores)}")
    return capped if keep else one


def plan_like(reference: Plan, graph: Graph, target: Any, *, kernels: str,
              rewrites: Sequence[str] = (), tuning_db: str | None = None,
              db: CostDB | None = None, cores: int | None = None,
              remote: Remote | None = None) -> Plan:
    """``graph`` (an operator graph rewritten from ``reference``'s) built with ``kernels`` and
    given a critical-path schedule with the choices that timing whole runs made for
    ``reference`` (`plan_schedule`): its pools moved after their 1 x 1 convolutions and its
    lone convolutions split if ``reference``'s were, and one stream of every core if
    ``reference`` kept one, its kernels capped to one thread where ``reference``'s were. The
    kernel times are still measured (or taken from the cache); what is saved are the
    end-to-end comparisons (and the rewritten programs' builds) that make those choices: 22 s
    of timing whole runs a NASNet-A large candidate of the substitution search, whose rewrites
    are local and do not turn them."""
    if db is None:  # the default cache, opened for this plan alone
        own = CostDB()
        try:
            return plan_like(reference, graph, target, kernels=kernels, rewrites=rewrites,
                             tuning_db=tuning_db, db=own, cores=cores, remote=remote)
        finally:
            own.close()
    target = resolve_target(target)
    on_cpu = target.kind.name == "llvm"
    streams = (cores or cpu_count()) if on_cpu else None
    pools: Sequence[str] = ()
    if reference.report.get("pools"):
        graph, pools = pools_after_convs(from_relax(prepare(to_relax(graph))))
    done: Sequence[str] = ()
    if reference.report.get("split") and streams is not None:
        graph, done = split_lone_convs(from_relax(prepare(to_relax(graph))),
                                       4 if streams >= 4 else 2)
    program = build_program(to_relax(graph), target, tuning_db=tuning_db, kernels=kernels,
                                  rewrites=(*rewrites, *pools, *done))
    tuning = tuning_id(tuning_db)
    plan = _measured_critical_path(program, db, tuning, streams, cores, None, remote)
    if (len(reference.schedule.streams) == 1 and len(plan.schedule.streams) > 1
            and streams is not None):
        plan = Plan(program, _one_stream(plan, db, tuning, streams, None, remote,
                                         caps=bool(reference.schedule.kernel_threads)),
                    plan.report)
    return Plan(program, plan.schedule, {**plan.report, "pools": list(pools),
                                         "split": list(done), "planned_like": "reference"})


def fewer_threads_where_faster(program: KernelProgram, schedule: Schedule, db: CostDB,
                               tuning: str = "", log: Log | None = None,
                               remote: Remote | None = None) -> Schedule:
    """``schedule`` with each vendor kernel of a multi-thread stream that runs faster on one
    thread than on its stream's threads set to one (`Schedule.kernel_threads`), both times
    measured in model order and cached. On two cores a small convolution's second thread
    costs a wake-up (tens of microseconds with sleeping OpenMP workers) longer than the work
    it takes over: NASNet-A's 1x1 convolutions ran 60 us on one thread, 114 us on two. TVM's
    kernels keep their stream's count (resizing TVM's pool restarts its workers)."""
    wide = sorted({t for t in schedule.threads if t > 1})
    if not wide or program.target.kind.name != "llvm":
        return schedule
    graph = program.graph
    one = _kernel_times(program, 1, db, tuning, log, remote)
    caps: dict[int, int] = {}
    for t in wide:
        many = _kernel_times(program, t, db, tuning, log, remote)
        caps.update({k: 1 for s, ks in enumerate(schedule.streams) if schedule.threads[s] == t
                     for k in ks if graph[k].kind == "kernel"
                     and graph[k].attrs.get("source") == "vendor" and one[k] < many[k]})
    if log is not None:
        log(f"  {len(caps)} vendor kernels run faster on 1 thread than on {wide[-1]}: capped")
    return replace(schedule, kernel_threads=caps)


def _kernel_times(program: KernelProgram, threads: int, db: CostDB, tuning: str,
                  log: Log | None, remote: Remote | None) -> dict[int, float]:
    """Seconds per kernel of ``program`` on ``threads`` threads, in model order: measured
    here (and cached) or on the ``remote`` device."""
    schedule = sequential(program.graph, cores=threads)
    if remote is not None:
        return remote.kernel_times(program, schedule, threads)
    with make_executor(program, schedule, use_cuda_graph=False) as ex:
        return kernel_costs(ex, db=db, threads=threads, tuning=tuning, progress=log is not None)


def _measured_critical_path(program: KernelProgram, db: CostDB, tuning: str,
                            streams: int | None, cores: int | None, log: Log | None,
                            remote: Remote | None = None) -> Plan:
    """`critical_path` of ``program`` over each kernel's 1-thread time in model order,
    measured (or from the cost database): on a CPU every stream has one thread, so that is the
    time each kernel will take; a blocking cross-stream wait is charged the measured worker
    hand-off. Report in ms: ``predicted_ms``, ``critical_path_ms``, ``work_ms``,
    ``handoff_us`` and ``optimum_ms`` (no schedule on these streams can beat it with these
    times: `critical_path`'s optimum without hand-offs; ``optimum_exact``)."""
    on_cpu = program.target.kind.name == "llvm"
    if log is not None:
        log("  critical-path: kernel times (1 thread, in model order), measured or cached")
    costs = _kernel_times(program, 1, db, tuning, log, remote)
    handoff = 0.0
    if on_cpu:
        handoff = remote.handoff() if remote is not None else measure_handoff(
            db, str(program.target))
    schedule = critical_path(program.graph, cost=costs, streams=streams, cores=cores,
                             handoff=handoff)
    # the optimum is a bound only without hand-offs: with one, plan again without for it
    free = schedule if handoff == 0.0 else critical_path(program.graph, cost=costs,
                                                         streams=streams, cores=cores)
    info = schedule.info
    return Plan(program, schedule, {
        "predicted_ms": info["predicted"] * 1e3, "critical_path_ms": info["critical_path"] * 1e3,
        "work_ms": info["work"] * 1e3, "handoff_us": handoff * 1e6,
        "optimum_ms": free.info["optimum"] * 1e3, "optimum_exact": free.info["optimum_exact"]})


def _model_graph(program: KernelProgram) -> Graph:
    """The operator graph of the model ``program`` was built from (it keeps one)."""
    assert program.model is not None, "a program built from a model"
    return program.model.get()


def split_program(program: KernelProgram, parts: int, *, tuning_db: str | None = None,
                  log: Log | None = None) -> KernelProgram | None:
    """``program`` rebuilt from its model with its lone convolutions split (`split_lone_convs`:
    the library's ``split-conv-<parts>``), or None when there are none to split (or the
    program does not keep the model it was built from)."""
    if program.model is None or parts < 2:
        return None
    split, done = split_lone_convs(_model_graph(program), parts, log=log)
    if not done:
        return None
    return build_program(to_relax(split), program.target, device=program.device,
                               tuning_db=tuning_db, kernels=program.kernel_source,
                               rewrites=(*program.rewrites, *done))


# ---------------------------------------------------------------------------- IOS
def plan_ios(program: KernelProgram, options: IOSOptions = IOSOptions(), *,
             db: CostDB | None = None, tuning_db: str | None = None,
             log: Log | None = None, remote: Remote | None = None) -> Plan:
    """IOS's schedule of ``program``: the DP per part (`paragraph.passes.ios.search`) with
    stages measured by a `StageMeter` (cached in ``db``; on the ``remote`` device, uncached,
    where one is given); where merges win, the program is
    rebuilt with them (the library rule ``ios-merge-convs``); with ``options.confirm`` the
    result is kept only if it runs faster end to end than the plain sequence. The report
    holds the search's ``stats`` and summary (``search``), its ``stages`` (kernel ids,
    strategy, seconds) and the end-to-end ``confirmed`` times."""
    start = time.monotonic()
    original = program
    tuning = tuning_id(tuning_db)  # cost keys name the tuned records, not the path
    on_cpu = program.target.kind.name == "llvm"
    cores = (options.cores or (cpu_count() if remote is None else remote.cores)) \
        if on_cpu else 1
    # Vendor kernels run with torch's thread count, which is one per process (libgomp): a
    # schedule mixing 1-thread and all-core stages would switch it at every such boundary, and
    # each switch drops oneDNN's compiled primitives (~0.6 ms per convolution after it). So
    # with vendor kernels on a CPU every stage runs on one thread (and the end-to-end check
    # compares the result with the whole program in sequence on all cores).
    uniform = on_cpu and cores > 1 and "vendor" in program.sources()
    seq_threads = 1 if uniform else cores
    if options.s is None:
        options = replace(options, s=cores if on_cpu else 8)
    if options.mode not in MODES:
        raise ParagraphError(f"unknown IOS mode {options.mode!r}; choose from {MODES}")
    parts = blocks(program.graph, options.max_part_size, options.max_states)
    if log is not None:
        log(f"  IOS search ({options.mode}, r={options.r}, s={options.s}, {len(parts)} parts, "
            f"protocol {options.warmup} warm-ups, {options.repeat}x{options.number} runs"
            + (f", budget {options.budget_s:g} s" if options.budget_s else "") + ") ...")
    meter = StageMeter(program, options, db, tuning_db, seq_threads=seq_threads, remote=remote)
    stats = SearchStats()
    bar = Progress(log if options.progress else None, "IOS parts", len(parts))

    def progress(i: int, parts: list[list[int]], stats: SearchStats) -> None:
        bar.update(i + 1, f"{len(parts[i])} kernels, {stats.states} states, "
                          f"{meter.measured} stages measured")

    try:
        stages = search(program.graph, options, meter.cost, bound=meter.bound,
                        mergeable=meter.mergeable, stats=stats, parts=parts,
                        strategies=(CONCURRENT, SEQUENTIAL) if on_cpu else (CONCURRENT,),
                        progress=progress)
        merges = [meter.units(st.groups[0]) for st in stages if st.strategy == MERGE]
    finally:
        meter.close()
    stats.stages_measured = meter.measured
    planned = plan_streams(stages, on_cpu)
    if merges:
        program, planned = _rebuild_with_merges(program, meter.rule, merges, planned, tuning_db)
    schedule = to_schedule(program.graph, planned, seq_threads, options)
    report: dict[str, Any] = {"predicted_ms": schedule.info["predicted_ms"],
                              "stages": [(st.groups, st.strategy, st.cost) for st in stages]}
    if options.confirm:
        program, schedule, report["confirmed"] = _confirm(
            original, program, schedule, cores, options, db, tuning, log, remote)
    stats.seconds = time.monotonic() - start
    return Plan(program, schedule, {**report, "search": stats.summary(), "stats": asdict(stats)})


def _rebuild_with_merges(program: KernelProgram, rule: MergeConvs,
                         merges: Sequence[Sequence[Unit] | None], planned: list[Planned],
                         tuning_db: str | None) -> tuple[KernelProgram, list[Planned]]:
    """Apply the chosen merges to the operator graph (``rule``, once per merge), lower it
    again, and carry the plan over (`carry_over`)."""
    if (program.operator_graph is None or program.kernel_operators is None
            or any(m is None for m in merges)):
        raise ParagraphError("IOS merge: the program's kernels could not be traced")
    units = [list(m) for m in merges if m is not None]
    merged, added = apply_merges(rule, program.operator_graph, units)
    rebuilt = build_program(merged, program.target, device=program.device,
                                  tuning_db=tuning_db, kernels=program.kernel_source,
                                  rewrites=(*program.rewrites, *(
                                      f"{rule.id}: {', '.join(str(c) for c, _ in u)}"
                                      for u in units)))
    if rebuilt.kernel_operators is None:
        raise ParagraphError("IOS merge: the rebuilt program's kernels could not be traced")
    return rebuilt, carry_over(planned, program.kernel_operators, added, rebuilt.graph,
                               rebuilt.kernel_operators)


def _confirm(original: KernelProgram, program: KernelProgram, schedule: Schedule, cores: int,
             options: IOSOptions, db: CostDB | None, tuning: str, log: Log | None,
             remote: Remote | None = None) -> tuple[KernelProgram, Schedule, dict[str, Any]]:
    """The searched program and schedule, or all of ``original`` in sequence (on ``cores``
    threads, and on one thread: the schedule of one-kernel stages, also in IOS's space),
    whichever runs fastest end to end on the executor (`end_to_end`: alternating blocks of
    runs, cached in the cost database so the choice is deterministic); and the times.
    Stage latencies measured alone do not add up to a whole run (caches, hand-offs between
    streams), so the DP's sum can promise what a run does not keep."""
    plain = [sequential(original.graph, cores=c) for c in dict.fromkeys((cores, 1))]
    candidates = [(program, schedule)] + [(original, base) for base in plain]
    seconds = end_to_end(candidates, db, tuning, options.repeat, options.warmup,
                         remote=remote)
    best = min(range(len(candidates)), key=lambda i: (seconds[i], i))  # ties: the search
    names = ["the IOS schedule"] + [f"all kernels in sequence on {b.threads[0]} thread(s)"
                                    for b in plain]
    if log is not None:
        log("  IOS end to end: " + ", ".join(f"{n} {t * 1e3:.2f} ms"
                                            for n, t in zip(names, seconds, strict=True))
            + f": keeping {names[best]}")
    confirmed = {"ios_ms": seconds[0] * 1e3, "sequential_ms": seconds[1] * 1e3,
                 "sequential_1thread_ms": seconds[-1] * 1e3, "kept": names[best]}
    if best == 0:
        return program, schedule, confirmed
    base = plain[best - 1]
    kept = Schedule.build(original.graph, base.streams, threads=base.threads,
                          name=schedule.name, info={**schedule.info, "strategies": [SEQUENTIAL]})
    return original, kept, confirmed


# ---------------------------------------------------------------------------- end to end
def plan_digest(schedule: Schedule) -> str:
    """What a run's time depends on: streams, thread counts, stage barriers and the kernels
    capped to fewer threads (only where there are some: older digests stay valid)."""
    plan: list = [list(map(list, schedule.streams)), list(schedule.threads),
                  [list(st) for st in schedule.stages or ()]]
    if schedule.kernel_threads:
        plan.append(sorted(map(list, schedule.kernel_threads.items())))
    return hashlib.blake2b(json.dumps(plan).encode(), digest_size=16).hexdigest()


# seconds `end_to_end` waits for quiet cores before it times again a comparison that another
# process disturbed (ResNet-50's critical-path planner chose two 1-thread streams, 69 ms, over
# one stream of two threads, 43 ms, while a test suite ran beside it)
QUIET_WAIT_S = 30.0
# a timed block lasts at least this long (at most MAX_BLOCK runs): blocks of five runs of a
# 0.3 ms encoder gave 0.52 against 0.43 ms where 200 runs back to back gave 0.39 against 0.25,
# and the slower schedule was kept
MIN_BLOCK_S = 0.01
MAX_BLOCK = 200
# warm-up runs before a candidate is timed
# (`paragraph.tvm_interop.measure.device.SETTLE_RUNS`): fewer timed a rewritten candidate's
# new shapes partly on their slower forms, against an input whose
# shapes had settled


def end_to_end(candidates: Sequence[tuple[KernelProgram, Schedule]], db: CostDB | None,
               tuning: str, repeat: int = 6, warmup: int = 2, check: bool = False,
               block: int = 5, remote: Remote | None = None) -> list[float]:
    """Median seconds of whole runs of each ``(program, schedule)`` on the executor: after a
    warm-up block each, ``repeat`` rounds (in forward, then reverse order) running every
    candidate once untimed and then ``block`` times timed, more where a block would last under
    `MIN_BLOCK_S` (a candidate's steady state, which strict alternation disturbs:
    `paragraph.timing.time_in_blocks`), cached in ``db`` (a
    `CostDB` or None) for this comparison (these candidates in this order) so that choices
    made from them are deterministic. With ``check``, the
    candidates' outputs on one random input must agree (`tolerance`), else `ParagraphError`:
    a rewrite that changed the model is a bug, not a slower choice. Timed while another
    process held a core (`LoadWatch`), the comparison is timed once more after waiting up to
    `QUIET_WAIT_S` for quiet cores, and cached only if that one was quiet. With ``remote``
    the runs (and the check) happen on that device, uncached."""
    if remote is not None:
        remote_s, diffs = remote.time(candidates, blocks=max(3, repeat), block=max(1, block))
        if check:
            _require_equal(candidates, diffs, f" on {remote.describe()}")
        return remote_s
    runs = [f"{p.graph.structural_hash()}:{plan_digest(s)}" for p, s in candidates]
    # a time is cached for this comparison only: times are comparable within one comparison,
    # and a candidate's time stored by a later comparison (the critical-path planner compares
    # the program it kept with the pools moved, then with its lone convolutions split) made a
    # replayed decision read times from two different comparisons, and flip
    beside = hashlib.sha256("|".join(runs).encode()).hexdigest()[:16]
    keys = [CostKey(str(p.target), "run:" + (f"in:{beside}:" if len(runs) > 1 else "") + run,
                    tuning, ",".join(sorted(p.sources())),
                    f"blocks={repeat}x{block}>={MIN_BLOCK_S}s,w{SETTLE_RUNS}"
                    f"{vendor_tag(p.sources())}")
            for run, (p, s) in zip(runs, candidates, strict=True)]
    seconds = [db.get(k) if db is not None else None for k in keys]
    if None not in seconds and not check:
        return [s for s in seconds if s is not None]
    samples: list[list[float]] = [[] for _ in candidates]
    executors = [make_executor(p, s, use_cuda_graph=True) for p, s in candidates]
    try:
        graph = candidates[0][0].graph
        if check:
            inputs = sample_inputs([graph[i].type for i in graph.inputs],
                                   candidates[0][0].input_ranges)
            outs = [[np.asarray(o) for o in ex.run(*inputs)] for ex in executors]
            _require_equal(candidates, [max_difference(outs[0], got) for got in outs])
            if None not in seconds:
                return [s for s in seconds if s is not None]
        inputs = [np.zeros(graph[i].type.shape, graph[i].type.dtype) for i in graph.inputs]
        configs = [Config(str(i), partial(ex.run, *inputs, copy_outputs=False), samples=got)
                   for i, (ex, got) in enumerate(zip(executors, samples, strict=True))]
        fastest = float("inf")
        for c in configs:  # a whole block each: a process's first runs are slow
            for _ in range(max(1, warmup, block, SETTLE_RUNS)):
                start = time.perf_counter()
                c.run()
                fastest = min(fastest, time.perf_counter() - start)
        block = max(block, min(MAX_BLOCK, math.ceil(MIN_BLOCK_S / max(fastest, 1e-6))))
        for attempt in range(2):
            if attempt:  # another process held a core: once more when the cores are quiet
                wait_for_quiet_cores(lambda _msg: None, QUIET_WAIT_S)
                for x in samples:
                    x.clear()
            with LoadWatch() as watch:
                for r in range(max(3, repeat)):  # drifts hit both orders
                    time_in_blocks(configs if r % 2 == 0 else configs[::-1], 1,
                                   max(1, block), settle=1)
            if not watch.contended:
                break
    finally:
        for ex in executors:
            ex.close()
    if db is not None and not watch.contended:  # a loaded moment's choice is not kept
        for key, x in zip(keys, samples, strict=True):
            db.put(key, Timing(tuple(x)))
    return [float(np.median(x)) for x in samples]


def _require_equal(candidates: Sequence[tuple[KernelProgram, Schedule]],
                   diffs: Sequence[float], where: str = "") -> None:
    """`ParagraphError` unless each candidate's outputs are within `tolerance` of the first's
    (``diffs``: each one's `max_difference` from the first's)."""
    tol = max(tolerance(p) for p, _ in candidates)
    for (p, _), worst in zip(candidates[1:], diffs[1:], strict=True):
        if not worst <= tol:
            what = f" ({', '.join(p.rewrites)})" if p.rewrites else ""
            raise ParagraphError(f"the rewritten program{what} does not compute the model's "
                                 f"outputs{where}: max difference {worst:.3g}")


# ---------------------------------------------------------------------------- outputs
def tolerance(program: KernelProgram) -> float:
    """How closely ``program``'s outputs must match the model's (relative and absolute):
    1e-5, or float32 accumulation error (1e-4) where its kernels round differently from TVM's
    own: vendor kernels (with batch norm folded into their weights) or a program rewritten by
    library rules (merged or split convolutions)."""
    return 1e-5 if program.kernel_source == "tvm" and not program.rewrites else 1e-4


# ---------------------------------------------------------------------------- substitution search
def _checked(rules: Sequence[AnyRule]) -> list[AnyRule]:
    """``rules``, each a verified one: a pattern rule outside the shipped library must carry a
    z3 proof (``proof["status"] == "verified"``, from `paragraph.rules.prove_rule`) and pass
    the numeric check on shapes drawn to break equalities (`random_check`), since a rule
    wrong for some shapes would be a wrong answer."""
    shipped = set(default_library().for_search())
    out = []
    for r in rules:
        if isinstance(r, Rule) and r not in shipped:
            status = (r.proof or {}).get("status")
            if status != "verified":
                raise ParagraphError(f"rule {r.id!r} is not verified (proof status {status!r}): "
                                     "prove it with paragraph.rules.prove_rule and attach the "
                                     "proof (dataclasses.replace(rule, proof=proof.to_json()))")
            try:
                random_check(r)
            except AssertionError as e:
                raise ParagraphError(f"rule {r.id!r} is refuted numerically: {e}") from None
        out.append(r)
    return out


# a candidate must beat the best graph so far by this much as measured: on the shared 2-core
# host, a TASO candidate 1.3% faster in the loop ran 1.46x slower in the benchmark's timing
MIN_GAIN = 0.02


def required_gain(best_s: float, twin_s: float) -> float:
    """The fraction by which a candidate must run faster than the best graph so far, given
    one timing of the best (``best_s``) and of a second build of the same graph beside it
    (``twin_s``): `MIN_GAIN`, or how far the two builds differ if that is more. On this 2-core
    host two builds of one graph timed in one run differed by up to 7% (whether from the build
    or from bursts of other work on the host is not known), more than `MIN_GAIN` alone
    refuses."""
    return max(MIN_GAIN, abs(best_s - twin_s) / max(best_s, twin_s))


HELD_PER_WEIGHT_BYTE = 8  # bytes a built and bound candidate holds per byte of its weights


def _check_start(start: Plan, schedule: str, kernels: str) -> None:
    """`ParagraphError` unless ``start`` can stand for the search's input plan: built with
    the ``kernels`` source and planned with the ``schedule`` the search plans candidates with
    (its graph is the caller's word)."""
    if start.program.kernel_source != kernels:
        raise ParagraphError(f"search_plan: the start plan's kernels are "
                             f"{start.program.kernel_source!r}, the search's {kernels!r}")
    name = start.schedule.name.split("/")[0]  # wavefront/2: packed on two streams
    if name != schedule and not (schedule == "ios" and name.startswith("ios-")):
        raise ParagraphError(f"search_plan: the start plan's schedule is "
                             f"{start.schedule.name!r}, the search's {schedule!r}")


def candidates_in_memory(graph: Graph, share: float = 0.5) -> int:
    """How many built candidates of ``graph`` the on-board loop may hold at once: ``share``
    of the memory available now over what one holds (`HELD_PER_WEIGHT_BYTE` times the bytes
    of its weights: BERT's 0.4 GB of weights held 1.8-3 GB per candidate), at least one."""
    weights = sum(n.type.nbytes for n in graph.nodes if n.kind in ("weight", "constant"))
    free = available_memory()
    if free is None or weights == 0:
        return 1 << 30
    return max(1, int(share * free / (HELD_PER_WEIGHT_BYTE * weights)))


# a candidate dearer than the best graph by more than this, by the search's cost with its
# kernels measured, is not built: such costs missed by 8-13% (ResNeXt-50), not by 2x
MAX_OVERSHOOT = 1.25
UNCONFIRMED_MEASURED = 8  # top_k 0: candidates whose new kernels are measured before ranking


def worth_building(candidates: Sequence[Candidate], cost: Callable[[Graph], float],
                   base: float, top_k: int) -> tuple[list[Candidate], list[Candidate]]:
    """The ``top_k`` cheapest of ``candidates`` by ``cost`` among those within
    `MAX_OVERSHOOT` of ``base`` (the best graph's cost), and those beyond it (dearest last),
    which are not worth a build."""
    priced = sorted(((cost(c.graph), i) for i, c in enumerate(candidates)))
    ranked = [candidates[i] for _, i in priced]
    cheap = sum(1 for c, _ in priced if c <= MAX_OVERSHOOT * base)
    return ranked[:cheap][:top_k], ranked[cheap:]


def _cheapest(graph: Graph, start: Plan, rules: Sequence[AnyRule], cost: Callable[[Graph], float],
              options: SearchOptions, began: float, build_s: float,
              learn: Callable[[Graph], None], build: Callable[[Graph, Sequence[str]], Plan],
              tuning_db: str | None, db: CostDB, remote: Remote | None, say: Log
              ) -> tuple[Plan, Graph, tuple[Applied, ...], float, float, int]:
    """`search_plan` without its on-board loop (``top_k`` 0), as TASO and MetaFlow work: one
    search, the `UNCONFIRMED_MEASURED` cheapest candidates' new kernels measured, and the
    cheapest of them by the cost built, whatever it measures. Its outputs are checked against
    the input's and both are timed once, for the report only. Returns the plan, its graph,
    the rewrites, the input's and the plan's seconds and the number of programs built."""
    left = options.seconds - (time.perf_counter() - began)
    result = substitution_search(graph, rules, cost,
                                 replace(options, seconds=max(left - 1.2 * build_s, left / 4)),
                                 progress=say)
    ranked = list(result.candidates[:UNCONFIRMED_MEASURED])
    for c in ranked:
        learn(c.graph)
    chosen = min(ranked, key=lambda c: cost(c.graph))
    # never costlier than the input by the cost, as TASO's result (the input itself, or
    # ranked out of the measured few by its estimate)
    if cost(chosen.graph) >= cost(graph):
        say("  no on-board loop: the input is the cheapest graph by the cost")
        alone = end_to_end([(start.program, start.schedule)], db, tuning_id(tuning_db),
                           remote=remote)[0]
        return start, graph, (), alone, alone, 1
    plan = build(chosen.graph, [a.rule for a in chosen.applied])
    first_s, best_s = end_to_end([(start.program, start.schedule),
                                  (plan.program, plan.schedule)], db, tuning_id(tuning_db),
                                 check=True, remote=remote)
    say(f"  no on-board loop: the cheapest graph by the cost ({len(chosen.applied)} rewrites) "
        f"kept unconfirmed: {best_s * 1e3:.3f} ms against the input's {first_s * 1e3:.3f} ms")
    return plan, chosen.graph, chosen.applied, first_s, best_s, 2


def _signature_meter(target: Any, kernels: str, db: CostDB, tuning_db: str | None,
                     threads: int, remote: Remote | None) -> SignatureMeter:
    """The search's meter: on a CPU each kernel is timed on one thread and on ``threads`` (the
    costs price both); a GPU kernel has the device either way."""
    on_cpu = resolve_target(target).kind.name == "llvm"
    return SignatureMeter(target, kernels, db, tuning_db, threads=threads if on_cpu else 1,
                          remote=remote)


def measure_signatures(graph: Graph, target: Any, *, kernels: str = "tvm",
                       tuning_db: str | None = None, cores: int | None = None,
                       db: CostDB | None = None, log: Log | None = None) -> int:
    """Measure and cache in ``db`` every kernel signature of ``graph`` that `search_plan`
    would price it by (its first step, inside its budget), and return how many were new: a
    search that follows starts with its input's kernels known, as on a machine whose cost
    database has seen the model (the search benchmark warms each model once this way, so no
    configuration's budget goes on measuring what every configuration shares)."""
    with _opened(db) as db:
        meter = _signature_meter(target, kernels, db, tuning_db, cores or cpu_count(), None)
        meter.seconds(graph, kernels_of(graph), progress=log)
        return meter.measured


def search_plan(graph: Graph, target: Any, *, options: SearchOptions = SearchOptions(),
                schedule: str = "critical-path", kernels: str = "tvm",
                tuning_db: str | None = None, top_k: int = 20, rounds: int = 4,
                cores: int | None = None, db: CostDB | None = None, measure: bool = True,
                rules: Sequence[AnyRule] | None = None, remote: Remote | None = None,
                start: Plan | None = None, log: Log | None = None) -> Plan:
    """The substitution search with AutoGraph's on-board loop (alg. 1): search ``graph`` with
    the verified library under the search's cost (`paragraph.passes.search.search`), price the
    best candidates with their kernels measured, build the ``top_k`` cheapest, plan
    ``schedule`` for each and time them end to end side by side with the best graph so far
    (outputs checked against it, so against the model); a measured improvement (by
    `MIN_GAIN`, and again in a second timing beside a second build of the best, by more than
    the two builds differ: `required_gain`) becomes the start of the next round, until none
    improves, ``rounds`` are done or the search budget is spent. The input graph is always a
    candidate, so the result is never slower than it as measured. ``start``, a plan of
    ``graph`` under ``schedule`` with these ``kernels`` built already (`plan_schedule` of
    `build_program` of it), saves building the input again. Under ``critical-path``
    each candidate is planned with the choices timed for the input (`plan_like`). The budget
    covers the whole loop: the search leaves ``top_k`` candidate builds of it (at the mean
    build time seen so far) to the loop, and candidates are built while a build still fits
    (at least one per round), so the loop ends within about one build of the budget.

    The cost model prices each kernel of a candidate (`paragraph.passes.cost.kernels_of`) by
    its signature's seconds on one thread with this kernel source, measured once and cached in
    the cost database (`SignatureMeter`): the input's kernels before the search, the new
    kernels of the ``2 * top_k`` cheapest candidates after each round. Kernels not measured
    (``measure`` False, or the budget spent) get the roofline estimate on this machine's
    measured peaks, scaled by the median measured/estimate ratio of their kind.

    ``rules`` are the rules to search with (default: the shipped library's, both ways); the
    returned plan's ``graph`` is the chosen operator graph. With ``remote`` everything is
    measured on that device: the kernel signatures (built here for its target, uncached), the
    candidates' schedules (`plan_schedule`) and their end-to-end times (`end_to_end`); only
    the estimate for kernels left unmeasured uses this machine's peaks.

    ``top_k`` 0 turns the on-board loop off (`_cheapest`): the search's cheapest graph by its
    cost is returned unconfirmed, as TASO and MetaFlow return theirs; it may run slower than
    the input."""
    if top_k < 0:
        raise ParagraphError(f"top_k must be at least 0, got {top_k}")
    say = log or (lambda _m: None)
    began = time.perf_counter()
    deadline = time.monotonic() + options.seconds
    with _opened(db) as db:
        rules = default_library().for_search() if rules is None else _checked(rules)
        peaks = measure_cpu_peaks(db, str(target) if remote is None else "cpu")
        threads = cores or (cpu_count() if remote is None else remote.cores)
        model = CostModel(Device(peaks.flops, peaks.bandwidth, peaks.launch, streams=threads))
        cost = cost_function(model, options.cost)
        meter = _signature_meter(target, kernels, db, tuning_db, threads, remote)

        def learn(g: Graph) -> None:
            new = [k for k in kernels_of(g) if k.signature not in model.measured]
            model.learn(meter.seconds(g, new, measure=measure, deadline=deadline, progress=say),
                        meter.wide)

        def build(g: Graph, applied: Sequence[str]) -> Plan:
            if schedule == "critical-path" and like is not None:
                return plan_like(like, g, target, kernels=kernels, rewrites=applied,
                                 tuning_db=tuning_db, db=db, cores=cores, remote=remote)
            program = build_program(to_relax(g), target, tuning_db=tuning_db,
                                          kernels=kernels, rewrites=tuple(applied))
            return plan_schedule(schedule, program, db=db, tuning_db=tuning_db, cores=cores,
                                 remote=remote)

        learn(graph)
        say(f"  cost model: {len(model.measured)} kernel signatures measured (1"
            f"{f' and {meter.threads}' if meter.threads > 1 else ''} thread, "
            f"{meter.measured} new), the rest estimated"
            f"{' and scaled by kind' if model.measured else ''}")
        # seconds to build and plan one candidate: the input's at first, then the mean of the
        # candidates' own (planning a candidate also times it end to end, once per schedule
        # choice, which the input may have found cached)
        like: Plan | None = None  # the input's plan: candidates take its timed choices
        if start is None:
            t_build = time.perf_counter()
            best = build(graph, ())
            build_s = time.perf_counter() - t_build
        else:
            _check_start(start, schedule, kernels)
            best, build_s = start, start.program.build_seconds
        like = best
        build_times: list[float] = []
        build_failures: list[str] = []
        best_graph: Graph = graph
        best_applied: tuple[Applied, ...] = ()
        # the input is timed beside the candidates (a lone first timing in a fresh process
        # runs slow), and alone only if no candidate comes
        first_s: float | None = None
        best_s: float | None = None
        built, cost_before = 1, cost(graph)
        say(f"  input: cost {cost_before * 1e3:.3f} ms ({options.cost})")
        seen = {graph.structural_hash()}
        if top_k == 0:  # no on-board loop: the cheapest graph by the cost, as TASO returns it
            best, best_graph, best_applied, first_s, best_s, built = _cheapest(
                graph, best, rules, cost, options, began, build_s, learn, build, tuning_db,
                db, remote, say)
            rounds = 0
        for r in range(rounds):
            left = options.seconds - (time.perf_counter() - began)
            if left <= 0:
                break
            # what building and timing the top_k candidates will take, kept out of the
            # search's share of the budget so the whole loop ends near it (at least a quarter
            # searches)
            reserve = top_k * build_s * 1.2
            result = substitution_search(best_graph, rules, cost,
                                         replace(options, seconds=max(left - reserve, left / 4)),
                                         progress=say)
            fresh = [c for c in result.candidates
                     if c.graph.structural_hash() not in seen][:2 * top_k]
            for c in fresh:  # their new kernels measured, then ranked again
                learn(c.graph)
            # ranked again with their kernels measured, and filtered only where far dearer
            # than the best graph: on ResNeXt-50 every greedy candidate cost more than the
            # input once measured (1-thread kernel sums) and still ran 8-13% faster end to
            # end, round after round; on NASNet-A mobile every candidate of a round regrouped
            # depthwise convolutions (priced by the estimate while searched), cost 2x the
            # input once measured and ran 1.9x slower
            base = cost(best_graph)
            fresh, dear = worth_building(fresh, cost, base, top_k)
            seen.update(c.graph.structural_hash() for c in dear)
            if dear:
                say(f"  round {r + 1}: {len(dear)} candidates cost over {MAX_OVERSHOOT:.2f}x "
                    f"the best graph's once their kernels were measured (up to "
                    f"{cost(dear[-1].graph) / base:.2f}x): not built")
            if not fresh:
                if dear:  # searched again, their kernels' measured times known now
                    continue
                say(f"  round {r + 1}: no new candidate")
                break
            # built and timed in batches that fit in memory, the best so far timed beside each
            # batch: each built candidate holds its weights several times over (constants,
            # executor buffers, packed vendor copies), and eight of BERT's at once (1.8 GB
            # each) exhausted a 24 GB machine
            batch = candidates_in_memory(graph)
            winner: tuple[float, Plan, Candidate, float, float] | None = None
            plans: list[tuple[Plan, Candidate]] = []
            timed = 0
            for k, c in enumerate(fresh):
                left = options.seconds - (time.perf_counter() - began)
                spent = bool(plans or timed) and left < build_s  # time what is built
                if spent:
                    say(f"  round {r + 1}: budget spent after {timed + len(plans)} of "
                        f"{len(fresh)} candidates")
                else:
                    seen.add(c.graph.structural_hash())
                    t_build = time.perf_counter()
                    try:
                        plans.append((build(c.graph, [a.rule for a in (*best_applied,
                                                                       *c.applied)]), c))
                    except (ParagraphError, RuntimeError) as e:
                        # a candidate TVM cannot build is a bug to report, not a reason to
                        # lose the search: the input (and the other candidates) still stand
                        build_failures.append(f"{type(e).__name__}: {e}")
                        say(f"  round {r + 1}: a candidate could not be built and is "
                            f"skipped ({build_failures[-1]})")
                    build_times.append(time.perf_counter() - t_build)
                    build_s = sum(build_times) / len(build_times)
                if plans and (spent or len(plans) >= batch or k + 1 == len(fresh)):
                    times = end_to_end([(best.program, best.schedule)]
                                       + [(p.program, p.schedule) for p, _ in plans],
                                       db, tuning_id(tuning_db), check=True, remote=remote)
                    if first_s is None:
                        first_s = times[0]
                    for (p, cand), t in zip(plans, times[1:], strict=True):
                        if winner is None or t / times[0] < winner[0]:
                            winner = (t / times[0], p, cand, t, times[0])
                    timed += len(plans)
                    plans = []  # only the winner's program stays built
                    release_memory()
                if spent:
                    break
            built += timed
            if winner is None:
                break
            ratio, plan, cand, cand_s, base_s = winner
            say(f"  round {r + 1}: {timed} candidates built"
                f"{f' (batches of {batch})' if batch < timed else ''}, best {cand_s * 1e3:.3f} "
                f"ms against {base_s * 1e3:.3f} ms")
            if best_s is None:  # the input's time where it was first timed, until a
                best_s = first_s  # candidate is kept (another batch's differs by noise)
            if ratio >= 1.0 - MIN_GAIN:
                break
            # a gain is confirmed by a second, fresh timing (uncached) beside the best and a
            # second build of it, beating both by more than they differ (`required_gain`): on
            # Inception-v3 three searches kept rewrites measured 2-9% faster in one timing that
            # ran 1-7% slower than the input side by side afterwards
            twin = build(best_graph, [a.rule for a in best_applied])
            built += 1
            again = end_to_end([(best.program, best.schedule), (twin.program, twin.schedule),
                                (plan.program, plan.schedule)], None, tuning_id(tuning_db),
                               remote=remote)
            del twin
            release_memory()
            need = required_gain(again[0], again[1])
            if again[2] >= min(again[:2]) * (1.0 - need):
                say(f"  round {r + 1}: not confirmed: {again[2] * 1e3:.3f} ms against "
                    f"{again[0] * 1e3:.3f} and {again[1] * 1e3:.3f} ms (two builds of the "
                    f"best) timed again; a gain of {need:.1%} needed")
                break
            say(f"  round {r + 1}: confirmed: {again[2] * 1e3:.3f} ms against "
                f"{again[0] * 1e3:.3f} and {again[1] * 1e3:.3f} ms (two builds of the best)")
            best, best_s = plan, cand_s
            best_graph, best_applied = cand.graph, (*best_applied, *cand.applied)
        if first_s is None or best_s is None:
            first_s = best_s = end_to_end([(best.program, best.schedule)], db,
                                          tuning_id(tuning_db), remote=remote)[0]
        if meter.failed:
            say(f"  cost model: {len(meter.failed)} kernels could not be measured alone and "
                f"were estimated (first: {next(iter(meter.failed.values()))})")
        report = {**best.report, "search": {
            "method": options.method, "cost": options.cost, "beta": options.beta,
            "applied": [str(a) for a in best_applied],
            "rules": [a.rule for a in best_applied],
            "cost_before_ms": cost_before * 1e3, "cost_after_ms": cost(best_graph) * 1e3,
            "measured_before_ms": first_s * 1e3, "measured_after_ms": best_s * 1e3,
            "speedup": first_s / best_s if best_s > 0 else 1.0,
            "candidates_built": built, "build_failures": build_failures,
            "kernels_priced_by_measurement": len(model.measured),
            "kernels_measured_now": meter.measured, "seconds": time.perf_counter() - began}}
        return Plan(best.program, best.schedule, report, graph=best_graph)
