"""IOS on a device: the dynamic program over stages measured by the session's meter, merged
convolutions applied with the library rule, and the result kept only if whole runs confirm it.

`plan_ios` runs IOS's search (`paragraph.passes.ios.search`) part by part with a `StageMeter`
pricing each stage by measurement (IOS, MLSys'21, section 4: concurrent groups and merged
convolutions, pruned by r and s), rebuilds the program where merges won (the verified rule
``ios-merge-convs``), and with ``confirm`` times the result end to end against every kernel in
sequence: stage latencies measured alone do not add up to a whole run.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

from paragraph.errors import ParagraphError
from paragraph.passes.ios import (
    CONCURRENT,
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
from paragraph.passes.schedule import sequential
from paragraph.planner.plan import IOSConfirmation, IOSReport, Plan, PlanReport
from paragraph.planner.session import Session
from paragraph.progress import Progress
from paragraph.rules.parametric import MergeConvs, Unit
from paragraph.schedule import Schedule
from paragraph.tvm_interop.meter.stages import StageMeter
from paragraph.tvm_interop.runtime.program import KernelProgram
from paragraph.tvm_interop.runtime.target import is_cpu


def plan_ios(program: KernelProgram, session: Session, options: IOSOptions = IOSOptions()
             ) -> Plan:
    """IOS's schedule of ``program`` (module docstring): the DP per part with stages measured
    by a `StageMeter` on the session's meter (cached where it measures here); where merges
    win, the program is rebuilt with them; with ``options.confirm`` the result is kept only if
    it runs faster end to end than the plain sequence. The report (`IOSReport`) holds the
    search's statistics, its stages (kernel ids, strategy, seconds) and the end-to-end
    confirmation."""
    start = time.monotonic()
    original = program
    on_cpu = is_cpu(program.target)
    cores = (options.cores or session.cores) if on_cpu else 1
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
    session.log(f"  IOS search ({options.mode}, r={options.r}, s={options.s}, {len(parts)} "
                f"parts, protocol {options.warmup} warm-ups, {options.repeat}x{options.number} "
                "runs" + (f", budget {options.budget_s:g} s" if options.budget_s else "")
                + ") ...")
    meter = StageMeter(program, options, session.meter, session.tuning_db,
                       seq_threads=seq_threads)
    stats = SearchStats()
    bar = Progress(session.log if options.progress else None, "IOS parts", len(parts))

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
        bar.close()
    stats.stages_measured = meter.measured
    planned = plan_streams(stages, on_cpu)
    if merges:
        program, planned = _rebuild_with_merges(program, meter.rule, merges, planned, session)
    schedule = to_schedule(program.graph, planned, seq_threads, options)
    confirmed = None
    if options.confirm:
        program, schedule, confirmed = _confirm(original, program, schedule, cores, options,
                                                session)
    stats.seconds = time.monotonic() - start
    report = IOSReport(schedule.info["predicted_ms"],
                       tuple((st.groups, st.strategy, st.cost) for st in stages), stats,
                       confirmed)
    session.log(f"  IOS: {report.summary}")
    return Plan(program, schedule, PlanReport(ios=report))


def _rebuild_with_merges(program: KernelProgram, rule: MergeConvs,
                         merges: Sequence[Sequence[Unit] | None], planned: list[Planned],
                         session: Session) -> tuple[KernelProgram, list[Planned]]:
    """Apply the chosen merges to the operator graph (``rule``, once per merge), lower it
    again, and carry the plan over (`carry_over`)."""
    if (program.operator_graph is None or program.kernel_operators is None
            or any(m is None for m in merges)):
        raise ParagraphError("IOS merge: the program's kernels could not be traced")
    units = [list(m) for m in merges if m is not None]
    merged, added = apply_merges(rule, program.operator_graph, units)
    rebuilt = session.build(merged, program.kernel_source,
                            (*program.rewrites,
                             *(f"{rule.id}: {', '.join(str(c) for c, _ in u)}" for u in units)),
                            target=program.target, device=program.device)
    if rebuilt.kernel_operators is None:
        raise ParagraphError("IOS merge: the rebuilt program's kernels could not be traced")
    return rebuilt, carry_over(planned, dict(program.kernel_operators), added, rebuilt.graph,
                               dict(rebuilt.kernel_operators))


def _confirm(original: KernelProgram, program: KernelProgram, schedule: Schedule, cores: int,
             options: IOSOptions, session: Session
             ) -> tuple[KernelProgram, Schedule, IOSConfirmation]:
    """The searched program and schedule, or all of ``original`` in sequence (on ``cores``
    threads, and on one thread: the schedule of one-kernel stages, also in IOS's space),
    whichever runs fastest end to end on the executor (`Meter.runs`: alternating blocks of
    runs, cached in the cost database so the choice is deterministic); and the times.
    Stage latencies measured alone do not add up to a whole run (caches, hand-offs between
    streams), so the DP's sum can promise what a run does not keep."""
    plain = [sequential(original.graph, cores=c) for c in dict.fromkeys((cores, 1))]
    candidates = [(program, schedule)] + [(original, base) for base in plain]
    seconds = session.meter.runs(candidates, repeat=options.repeat, warmup=options.warmup)
    best = min(range(len(candidates)), key=lambda i: (seconds[i], i))  # ties: the search
    names = ["the IOS schedule"] + [f"all kernels in sequence on {b.threads[0]} thread(s)"
                                    for b in plain]
    session.log("  IOS end to end: " + ", ".join(f"{n} {t * 1e3:.2f} ms"
                                                 for n, t in zip(names, seconds, strict=True))
                + f": keeping {names[best]}")
    confirmed = IOSConfirmation(seconds[0] * 1e3, seconds[1] * 1e3, seconds[-1] * 1e3,
                                names[best])
    if best == 0:
        return program, schedule, confirmed
    base = plain[best - 1]
    kept = Schedule.build(original.graph, base.streams, threads=base.threads,
                          name=schedule.name, info={**schedule.info, "strategies": [SEQUENTIAL]})
    return original, kept, confirmed
