"""Choosing a schedule for a program by name: the graph algorithms as they are, or a decision
that measures (critical-path, IOS)."""

from __future__ import annotations

from dataclasses import replace

from paragraph.errors import ParagraphError
from paragraph.passes.ios import IOS_SCHEDULES, IOSOptions
from paragraph.passes.schedule import ALGORITHMS, make_schedule
from paragraph.planner.critical_path import plan_critical_path
from paragraph.planner.ios import plan_ios
from paragraph.planner.plan import Plan
from paragraph.planner.session import Session
from paragraph.tvm_interop.runtime.program import KernelProgram

SCHEDULES = (*ALGORITHMS, "ios", *IOS_SCHEDULES)


def check_schedule(name: str) -> None:
    """Raise `ParagraphError` unless ``name`` is one of `SCHEDULES`."""
    if name not in SCHEDULES:
        if name.startswith("ios-"):
            raise ParagraphError(f"unknown IOS mode {name[4:]!r} in {name!r}; choose from "
                                 f"{', '.join(IOS_SCHEDULES)}")
        raise ParagraphError(f"unknown schedule {name!r}; choose from {', '.join(SCHEDULES)}")


def plan_schedule(name: str, program: KernelProgram, session: Session | None = None, *,
                  ios: IOSOptions | None = None, split: bool = True,
                  rewrite: bool = True) -> Plan:
    """The `Plan` for the schedule ``name``: one of `paragraph.passes.schedule.ALGORITHMS`
    (the program unchanged; ``critical-path`` measures: `plan_critical_path`, which may
    return the program rebuilt with its pools moved or, with ``split``, its lone
    convolutions split), ``ios`` (the mode of ``ios``) or ``ios-<mode>`` (`plan_ios`, which may
    return the program rebuilt with merged convolutions). Measurements go through the
    ``session``'s meter (a session for the program's target, with the default cost database,
    when None). Without ``rewrite`` the program is planned as it is: no pools moved, no
    split, no IOS merges."""
    check_schedule(name)
    if session is None:
        with Session(program.target) as own:
            return plan_schedule(name, program, own, ios=ios, split=split, rewrite=rewrite)
    if name not in ("critical-path", "ios", *IOS_SCHEDULES):
        return Plan(program, make_schedule(name, program.graph, cores=session.cores))
    if name == "critical-path":
        return plan_critical_path(program, session, split and rewrite, pools=rewrite)
    options = ios or IOSOptions()
    if name != "ios":
        options = replace(options, mode=name[len("ios-"):])
    if not rewrite:
        options = replace(options, mode="parallel")  # IOS without its merges
    return plan_ios(program, session, options)
