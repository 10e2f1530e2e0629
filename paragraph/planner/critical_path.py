"""The critical-path decision: a list schedule over measured kernel times, then the choices that
only whole runs settle.

`plan_critical_path` schedules a program's kernels with `paragraph.passes.schedule.critical_path`
over each kernel's one-thread time measured in model order and the measured cross-stream
hand-off. On a CPU it then times, end to end and side by side (`Meter.runs`), and keeps:
several one-thread streams or one stream of every core (`one_stream_if_faster`, with the
kernels that run faster on one thread capped to it where that pays; one stream without timing
where the measured kernel times predict the streams `PREDICTED_MARGIN` times slower); the
program with its average pools moved after their 1 x 1 convolutions (`with_pools_moved`, the
library rule ``pool-after-conv1x1``); and, where streams were kept, the program with its lone
convolutions split across them (``split-conv-2``/``-4``). Every rewrite starts from the
program's own prepared model graph (`KernelProgram.model`). `plan_like` plans a rewritten
graph (a search candidate) with the choices another plan made.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import replace

from paragraph.errors import ParagraphError, reraise_interrupt
from paragraph.graph import Graph
from paragraph.passes.pools import pools_after_convs
from paragraph.passes.schedule import critical_path
from paragraph.passes.split import split_lone_convs
from paragraph.planner.plan import (
    CriticalPathReport,
    Plan,
    PlanReport,
    RewriteChoice,
    StreamsChoice,
)
from paragraph.planner.session import Session
from paragraph.schedule import Schedule, kernel_ids
from paragraph.timing import clearly_faster
from paragraph.tvm_interop.frontend.importers import prepare
from paragraph.tvm_interop.frontend.relax_graph import from_relax, to_relax
from paragraph.tvm_interop.runtime.program import KernelProgram
from paragraph.tvm_interop.runtime.target import is_cpu


def plan_critical_path(program: KernelProgram, session: Session, split: bool = True,
                       pools: bool = True) -> Plan:
    """`critical_path` over measured 1-thread kernel times (`measured_critical_path`); on a
    CPU of two cores or more, its streams are timed against one stream of every core and the
    faster kept (`one_stream_if_faster`), with ``pools`` the program with its pools moved is
    kept unless the program as it is runs clearly faster (`with_pools_moved`), and with
    ``split``, where several streams were kept, the program with its lone convolutions split
    is kept if its outputs agree and it runs clearly faster end to end."""
    on_cpu = is_cpu(program.target)
    streams = session.cores if on_cpu else None
    plain = measured_critical_path(program, session, streams)
    if on_cpu and streams is not None and streams >= 2:
        plain = one_stream_if_faster(plain, session, streams)
    if pools:
        plain = with_pools_moved(plain, session)
    program = plain.program
    if not (split and on_cpu and streams is not None and streams >= 2):
        return plain
    if len(plain.schedule.streams) < 2:
        # a split convolution's parts run side by side on streams; on one stream of every
        # core they would run one after the other, the same work in more kernels. In the
        # corpus the split was kept on Inception-v3 only (streams); timing it on ViT-B/16's
        # one stream took 25 s of its 127 s build to reject it (544 against 356 ms)
        session.log("  critical-path: one stream: no lone convolution split across streams")
        return plain
    try:
        rebuilt = split_program(program, 4 if streams >= 4 else 2, session)
    except Exception as exc:  # an optional rewrite: the plain schedule still stands
        reraise_interrupt(exc)
        warnings.warn(f"critical-path: the split program could not be built "
                      f"({type(exc).__name__}: {exc}); keeping the model's own kernels",
                      RuntimeWarning, stacklevel=3)
        rebuilt = None
    if rebuilt is None:
        return plain
    other = measured_critical_path(rebuilt, session, streams)
    session.log("  critical-path: checking the split program's outputs, timing both ...")
    try:
        unsplit_s, split_s = session.meter.runs([(program, plain.schedule),
                                                 (rebuilt, other.schedule)], check=True)
    except ParagraphError as exc:  # outputs differ: the rewrite is dropped, the build goes on
        _dropped("split", exc, session)
        return plain
    keep = clearly_faster(split_s, unsplit_s)
    session.log(f"  critical-path end to end: {unsplit_s * 1e3:.2f} ms, split "
                f"{split_s * 1e3:.2f} ms: keeping the {'split' if keep else 'unsplit'} program")
    chosen = other if keep else plain
    assert chosen.report.critical_path is not None and plain.report.critical_path is not None
    report = replace(chosen.report.critical_path, pools=plain.report.critical_path.pools,
                     split=RewriteChoice(_split_rewrites(rebuilt) if keep else (),
                                         unsplit_s * 1e3, split_s * 1e3))
    return Plan(chosen.program, chosen.schedule, PlanReport(critical_path=report))


def _dropped(what: str, exc: ParagraphError, session: Session) -> None:
    """Say that an optional rewrite was dropped because its outputs differ from the model's."""
    message = f"critical-path: the program with {what} was dropped: {exc}"
    session.log("  " + message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def _split_rewrites(program: KernelProgram) -> tuple[str, ...]:
    return tuple(r for r in program.rewrites if r.startswith("split-conv-"))


def with_pools_moved(plan: Plan, session: Session) -> Plan:
    """``plan``, or where average pools of its program feed only 1 x 1 convolutions to fewer
    channels, the program rebuilt with each pool moved after its convolution
    (`pools_after_convs`: the library's ``pool-after-conv1x1``) and planned as ``plan`` is
    (`plan_like`): it does less work and adds no kernel, so it is kept unless its outputs
    differ (`ParagraphError`) or whole runs of ``plan`` time clearly faster
    (`clearly_faster`). The report names the pools moved."""
    program = plan.program
    if program.model is None:
        return plan
    try:
        moved, done = pools_after_convs(program.model.get(), log=session.log)
        if not done:
            return plan
        other = plan_like(plan, moved, session, kernels=program.kernel_source,
                          rewrites=(*program.rewrites, *done), prepared=True)
    except Exception as exc:  # an optional rewrite: the program as it is still stands
        reraise_interrupt(exc)
        warnings.warn(f"critical-path: the program with its pools moved could not be built "
                      f"({type(exc).__name__}: {exc}); keeping the model's own kernels",
                      RuntimeWarning, stacklevel=4)
        return plan
    session.log("  critical-path: checking the outputs with the pools moved, timing both ...")
    try:
        as_is_s, moved_s = session.meter.runs([(program, plan.schedule),
                                               (other.program, other.schedule)], check=True)
    except ParagraphError as exc:  # outputs differ: the rewrite is dropped, the build goes on
        _dropped("pools moved", exc, session)
        return plan
    keep = not clearly_faster(as_is_s, moved_s)
    session.log(f"  critical-path end to end: {as_is_s * 1e3:.2f} ms, pools moved "
                f"{moved_s * 1e3:.2f} ms: keeping the {'moved' if keep else 'unmoved'} pools")
    mine, theirs = plan.report.critical_path, other.report.critical_path
    assert mine is not None and theirs is not None
    # the moved program's kernel-time summary over the stream choices made for ``plan``
    base = replace(theirs, streams=mine.streams, planned_like=False) if keep else mine
    chosen = other if keep else plan
    pools = RewriteChoice(tuple(done) if keep else (), as_is_s * 1e3, moved_s * 1e3)
    return Plan(chosen.program, chosen.schedule,
                PlanReport(critical_path=replace(base, pools=pools, split=None)))


def one_stream_if_faster(plan: Plan, session: Session, cores: int) -> Plan:
    """A CPU schedule of several one-thread streams against one stream whose kernels use all
    ``cores``, timed end to end, the faster kept: a chain of large kernels gains more from
    threads inside each kernel than from the little that runs beside it (ResNeXt-50 with
    vendor kernels ran 64.5 ms on two streams of one thread, 52 ms on one of two), while
    NASNet's many small kernels are the other way round. Where the streams' predicted makespan
    (critical-path's, over 1-thread kernel times) is over `PREDICTED_MARGIN` times the one
    stream's (the sum of its kernels' times measured on their threads), one stream is kept
    untimed (`StreamsChoice.timed` false: its times are the predictions)."""
    if len(plan.schedule.streams) < 2:
        return plan
    program = plan.program
    one = _one_stream(plan, session, cores)
    assert plan.report.critical_path is not None
    # the streams' makespan as critical-path predicts it (1-thread kernel times, hand-offs),
    # and the one stream's as the sum of its kernels' measured times on their threads: where
    # the streams are predicted far slower, no run is timed (ViT-B/16: predicted 542 against
    # 398 ms, timed 524 against 307 ms, 14 s of its build)
    streams_pred = plan.report.critical_path.predicted_ms / 1e3
    one_pred = _sum_of_kernels(program, one, session)
    if one_pred * PREDICTED_MARGIN < streams_pred:
        session.log(f"  critical-path: {len(plan.schedule.streams)} streams of 1 thread "
                    f"predicted {streams_pred * 1e3:.2f} ms, 1 stream of {cores} threads "
                    f"{one_pred * 1e3:.2f} ms: keeping one stream, untimed")
        report = replace(plan.report.critical_path, streams=StreamsChoice(
            streams_pred * 1e3, one_pred * 1e3, len(one.kernel_threads), True, timed=False))
        return Plan(program, one, PlanReport(critical_path=report))
    streams_s, one_s = session.meter.runs([(program, plan.schedule), (program, one)])
    keep = not clearly_faster(streams_s, one_s)
    session.log(f"  critical-path: {len(plan.schedule.streams)} streams of 1 thread "
                f"{streams_s * 1e3:.2f} ms (predicted {streams_pred * 1e3:.2f}), 1 stream of "
                f"{cores} threads {one_s * 1e3:.2f} ms (predicted {one_pred * 1e3:.2f}): "
                f"keeping {'one stream' if keep else 'the streams'}")
    report = replace(plan.report.critical_path, streams=StreamsChoice(
        streams_s * 1e3, one_s * 1e3, len(one.kernel_threads), keep))
    return Plan(program, one if keep else plan.schedule, PlanReport(critical_path=report))


# one stream is kept without timing where the streams' predicted makespan is more than this
# many times the one stream's predicted time
PREDICTED_MARGIN = 1.25


def _sum_of_kernels(program: KernelProgram, one: Schedule, session: Session) -> float:
    """Seconds the one-stream schedule ``one`` is predicted to take: each kernel's time measured
    in model order on the threads it runs on there (cached by `fewer_threads_where_faster`)."""
    threads = one.threads[0]
    times = {t: _kernel_times(program, t, session, quiet=True)
             for t in {threads, *one.kernel_threads.values()}}
    return sum(times[one.kernel_threads.get(k, threads)][k] for k in one.streams[0]
               if k in times[threads])


def _one_stream(plan: Plan, session: Session, cores: int, caps: bool | None = None,
                quiet: bool = False) -> Schedule:
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
    capped = fewer_threads_where_faster(program, one, session, quiet=quiet)
    if caps or not capped.kernel_threads:
        return capped
    one_s, capped_s = session.meter.runs([(program, one), (program, capped)])
    keep = clearly_faster(capped_s, one_s)
    session.log(f"  critical-path: 1 stream {one_s * 1e3:.2f} ms, with "
                f"{len(capped.kernel_threads)} kernels on 1 thread {capped_s * 1e3:.2f} ms: "
                f"keeping {'them capped' if keep else 'every kernel on ' + str(cores)}")
    return capped if keep else one


def plan_like(reference: Plan, graph: Graph, session: Session, *, kernels: str,
              rewrites: Sequence[str] = (), prepared: bool = False) -> Plan:
    """``graph`` (an operator graph rewritten from ``reference``'s) built with ``kernels`` and
    given a critical-path schedule with the choices that timing whole runs made for
    ``reference`` (`plan_critical_path`): its pools moved after their 1 x 1 convolutions and
    its lone convolutions split if ``reference``'s were, and one stream of every core if
    ``reference`` kept one, its kernels capped to one thread where ``reference``'s were. The
    kernel times are still measured (or taken from the cache); what is saved are the
    end-to-end comparisons (and the rewritten programs' builds) that make those choices: 22 s
    of timing whole runs a NASNet-A large candidate of the substitution search, whose rewrites
    are local and do not turn them. ``prepared``: ``graph`` went through `prepare` already
    (a program's model graph rewritten); else it is prepared once here when a rule needs it."""
    target = reference.program.target
    streams = session.cores if is_cpu(target) else None
    choices = reference.report.critical_path
    move = choices is not None and choices.pools is not None and bool(choices.pools.rules)
    split = (streams is not None and choices is not None and choices.split is not None
             and bool(choices.split.rules))
    if (move or split) and not prepared:
        graph = from_relax(prepare(to_relax(graph)))
    pools: Sequence[str] = ()
    if move:
        graph, pools = pools_after_convs(graph)
    done: Sequence[str] = ()
    if split and streams is not None:
        graph, done = split_lone_convs(graph, 4 if streams >= 4 else 2)
    program = session.build(to_relax(graph), kernels, (*rewrites, *pools, *done), target=target)
    plan = measured_critical_path(program, session, streams, quiet=True)
    schedule = plan.schedule
    if (len(reference.schedule.streams) == 1 and len(schedule.streams) > 1
            and streams is not None):
        schedule = _one_stream(plan, session, streams,
                               caps=bool(reference.schedule.kernel_threads), quiet=True)
    assert plan.report.critical_path is not None
    report = replace(plan.report.critical_path,
                     pools=RewriteChoice(tuple(pools)) if move else None,
                     split=RewriteChoice(tuple(done)) if split else None,
                     planned_like=True)
    return Plan(program, schedule, PlanReport(critical_path=report))


def fewer_threads_where_faster(program: KernelProgram, schedule: Schedule, session: Session,
                               quiet: bool = False) -> Schedule:
    """``schedule`` with each vendor kernel of a multi-thread stream that runs faster on one
    thread than on its stream's threads set to one (`Schedule.kernel_threads`), both times
    measured in model order and cached. On two cores a small convolution's second thread
    costs a wake-up (tens of microseconds with sleeping OpenMP workers) longer than the work
    it takes over: NASNet-A's 1x1 convolutions ran 60 us on one thread, 114 us on two. TVM's
    kernels keep their stream's count (resizing TVM's pool restarts its workers)."""
    wide = sorted({t for t in schedule.threads if t > 1})
    if not wide or not is_cpu(program.target):
        return schedule
    graph = program.graph
    one = _kernel_times(program, 1, session, quiet)
    caps: dict[int, int] = {}
    for t in wide:
        many = _kernel_times(program, t, session, quiet)
        caps.update({k: 1 for s, ks in enumerate(schedule.streams) if schedule.threads[s] == t
                     for k in ks if graph[k].kind == "kernel"
                     and graph[k].attrs.get("source") == "vendor" and one[k] < many[k]})
    if not quiet:
        session.log(f"  {len(caps)} vendor kernels run faster on 1 thread than on {wide[-1]}: "
                    "capped")
    return replace(schedule, kernel_threads=caps)


def _kernel_times(program: KernelProgram, threads: int, session: Session,
                  quiet: bool = False) -> dict[int, float]:
    """Seconds per kernel of ``program`` on ``threads`` threads, in model order, by the
    session's meter (cached where it measures here)."""
    return session.meter.kernel_times(program, [threads],
                                      log=None if quiet else session.log)[0]


def measured_critical_path(program: KernelProgram, session: Session, streams: int | None,
                           quiet: bool = False) -> Plan:
    """`critical_path` of ``program`` over each kernel's 1-thread time in model order,
    measured (or from the cost database): on a CPU every stream has one thread, so that is the
    time each kernel will take; a blocking cross-stream wait is charged the measured worker
    hand-off. The report (`CriticalPathReport`, ms) holds the prediction, the critical path,
    the work, the hand-off and the optimum (no schedule on these streams can beat it with
    these times: `critical_path`'s optimum without hand-offs)."""
    if not quiet:
        session.log("  critical-path: kernel times (1 thread, in model order), measured or "
                    "cached")
    costs = _kernel_times(program, 1, session, quiet)
    handoff = session.meter.handoff(program.target) if is_cpu(program.target) else 0.0
    schedule = critical_path(program.graph, cost=costs, streams=streams, cores=session.cores,
                             handoff=handoff)
    # the optimum is a bound only without hand-offs: with one, plan again without for it
    free = schedule if handoff == 0.0 else critical_path(program.graph, cost=costs,
                                                         streams=streams, cores=session.cores)
    info = schedule.info
    return Plan(program, schedule, PlanReport(critical_path=CriticalPathReport(
        predicted_ms=info["predicted"] * 1e3, critical_path_ms=info["critical_path"] * 1e3,
        work_ms=info["work"] * 1e3, handoff_us=handoff * 1e6,
        optimum_ms=free.info["optimum"] * 1e3, optimum_exact=free.info["optimum_exact"])))


def split_program(program: KernelProgram, parts: int, session: Session) -> KernelProgram | None:
    """``program`` rebuilt from its model graph with its lone convolutions split
    (`split_lone_convs`: the library's ``split-conv-<parts>``), or None when there are none
    to split (or the program does not keep the model it was built from)."""
    if program.model is None or parts < 2:
        return None
    split, done = split_lone_convs(program.model.get(), parts, log=session.log)
    if not done:
        return None
    return session.build(to_relax(split), program.kernel_source, (*program.rewrites, *done),
                         target=program.target, device=program.device)


__all__ = ["plan_critical_path", "plan_like", "measured_critical_path", "split_program",
           "fewer_threads_where_faster", "one_stream_if_faster", "with_pools_moved"]
