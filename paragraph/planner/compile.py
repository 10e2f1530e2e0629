"""The one compile path: import -> search -> build -> plan.

`compile` is what the CLI, `paragraph.build`, the passes and the benchmarks call: a model in
(an ONNX file, a torch module, a Relax module, or a module our passes lowered), a `Plan` out.
`CompileOptions` holds every choice with one set of defaults: the target, the kernel source, the
schedule, the substitution search (`paragraph.passes.search.SearchOptions`, off by default),
the tuning database, the cores.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import tvm

from paragraph.errors import ParagraphError
from paragraph.graph import Graph
from paragraph.passes.ios import IOSOptions
from paragraph.passes.search import SearchOptions
from paragraph.planner.onboard import search_plan
from paragraph.planner.plan import Plan, PlanReport
from paragraph.planner.schedules import check_schedule, plan_schedule
from paragraph.planner.session import Session
from paragraph.progress import Log
from paragraph.rules.match import AnyRule
from paragraph.tvm_interop.build.program import (
    attached_schedule,
    lowered_info,
    module_rewrites,
    program_from_lowered,
)
from paragraph.tvm_interop.frontend.importers import load
from paragraph.tvm_interop.frontend.relax_graph import from_relax
from paragraph.tvm_interop.meter.protocol import Meter
from paragraph.tvm_interop.meter.runs import tolerance
from paragraph.tvm_interop.runtime.executor import make_executor
from paragraph.tvm_interop.runtime.library.names import check_kernel_source
from paragraph.tvm_interop.runtime.library.torch_kernels import default_kernels
from paragraph.tvm_interop.runtime.program import KernelProgram
from paragraph.tvm_interop.runtime.reference import Comparison, Reference, compare, reference_for
from paragraph.tvm_interop.runtime.target import describe_target, runs_here

# schedules that measure on the device (those that do not are the graph algorithms)
MEASURED = ("critical-path", "ios")
# what a target that neither runs here nor has a remote device gets instead of critical-path
UNMEASURED_DEFAULT = "opara"


@dataclass(frozen=True)
class CompileOptions:
    """How to compile, with one set of defaults everywhere.

    ``target``: anything `paragraph.tvm_interop.runtime.target.resolve_target` takes (this CPU
    by default). ``kernels``: tvm, vendor or auto (None: the fastest source where the program
    runs, `default_kernels`; TVM's own for another machine). ``schedule``: a name of
    `paragraph.planner.SCHEDULES` (None: critical-path where it can be measured, else
    `UNMEASURED_DEFAULT`). ``search``: the substitution search (None: none). ``tuning_db``: a
    MetaSchedule work directory to apply. ``cores``: the cores to plan for (default: all of
    the device's). ``split``: let critical-path split lone convolutions. ``ios``: IOS's
    options. ``rules``: the search's rules (default: the shipped verified library).
    ``input_shapes``: static shapes for a model's dynamic inputs (importing only).
    ``check``: compare the result's outputs with an independent reference of the original
    model (`paragraph.tvm_interop.runtime.reference`) on seeded inputs, and drop its rewrites
    if they differ; ``rewrite``: let the planner rewrite the program (pools moved, lone
    convolutions split, IOS merges).
    """

    target: Any = None
    kernels: str | None = None
    schedule: str | None = None
    search: SearchOptions | None = None
    tuning_db: str | os.PathLike[str] | None = None
    cores: int | None = None
    split: bool = True
    ios: IOSOptions = field(default_factory=IOSOptions)
    rules: Sequence[AnyRule] | None = None
    input_shapes: Mapping[str, tuple[int, ...]] | Sequence[tuple[int, ...]] | None = None
    check: bool = True
    rewrite: bool = True

    def __post_init__(self) -> None:
        if self.kernels is not None:
            check_kernel_source(self.kernels)
        if self.schedule is not None:
            check_schedule(self.schedule)


def compile(model: Any, options: CompileOptions = CompileOptions(), *, log: Log | None = None,
            remote: Meter | None = None, session: Session | None = None,
            on_built: Callable[[KernelProgram], object] | None = None) -> Plan:
    """``model`` imported, searched, built and planned as ``options`` say (module docstring).

    A module that `paragraph.transform.InterOperatorSchedule` scheduled keeps its schedule
    unless ``options`` name one; one `paragraph.transform.KernelLowering` lowered is planned
    without lowering it again. Measurements go through ``session`` (made here from
    ``options``, ``log`` and ``remote``, a `paragraph.tvm_interop.meter.remote.Remote` to
    measure on, when None). ``on_built`` hears of the program as built, before it is planned
    (not for a searched model, whose candidates are built by the search)."""
    if session is None:
        with Session(options.target, tuning_db=options.tuning_db, cores=options.cores,
                     log=log, remote=remote) as own:
            return compile(model, options, session=own, on_built=on_built)
    mod = model if isinstance(model, tvm.IRModule) else load(model, options.input_shapes)
    if lowered_info(mod) is not None:  # lowered (and maybe scheduled) by our passes
        program = program_from_lowered(mod, session.target)
        attached = attached_schedule(mod, program)
        if attached is not None and options.schedule is None:
            return Plan(program, attached, PlanReport(attached=attached.name))
        if on_built is not None:
            on_built(program)
        return plan_schedule(_schedule(options, session), program, session, ios=options.ios,
                             split=options.split)
    plan = _plan(mod, options, session, on_built)
    if options.check:
        plan = _checked(plan, model, mod, options, session)
    return plan


def _plan(mod: tvm.IRModule, options: CompileOptions, session: Session,
          on_built: Callable[[KernelProgram], object] | None) -> Plan:
    """The imported ``mod`` searched (if asked), built and planned."""
    schedule = _schedule(options, session)
    kernels = options.kernels or default_source(session)
    if options.search is not None:
        session.log(f"{options.search.method} substitution search ({options.search.cost} "
                    f"cost, beta {options.search.beta}, budget {options.search.budget:.0f} s):")
        return search_plan(from_relax(mod), session, options.search, schedule=schedule,
                           kernels=kernels, rules=options.rules)
    program = session.build(mod, kernels, module_rewrites(mod))
    if on_built is not None:
        on_built(program)
    return plan_schedule(schedule, program, session, ios=options.ios,
                         split=options.split and options.rewrite, rewrite=options.rewrite)


def _checked(plan: Plan, model: Any, mod: tvm.IRModule, options: CompileOptions,
             session: Session) -> Plan:
    """``plan`` with its outputs compared with an independent reference of the original model
    (``mod``, imported from ``model``) on seeded inputs, the comparison in its report. A
    rewritten program whose outputs differ is dropped for the model's own (planned without
    rewrites: the search's, the pools', the split's, IOS's merges), with a message; a program
    of the model's own that differs is kept with a warning (the difference is its kernels'
    rounding or a kernel's error, and no rewrite is left to drop)."""
    if not runs_here(plan.program.target):
        session.log(f"  outputs not checked: programs for {describe_target(plan.program.target)}"
                    " do not run on this machine")
        return plan
    graph = from_relax(mod)
    try:
        reference = reference_for(model, graph)
    except Exception as exc:  # the check is a safeguard: its own failure is reported, not fatal
        _warn(session, f"the outputs could not be checked: no reference for the model "
                       f"({type(exc).__name__}: {exc})")
        return plan
    session.log(f"  checking the outputs against {reference.name} ...")
    result = _compare(plan, graph, reference)
    session.log("  " + result.describe())
    if result.equal:
        return _with_check(plan, result)
    if plan.program.rewrites:
        dropped = tuple(dict.fromkeys(plan.program.rewrites))
        _warn(session, f"the program's rewrites ({', '.join(dropped)}) were dropped: its "
                       f"{result.describe()}")
        plain = _plan(mod, replace(options, search=None, rewrite=False), session, None)
        again = _compare(plain, graph, reference)
        session.log("  the model's own program: " + again.describe())
        if not again.equal:
            _warn(session, f"the model's own program differs from {reference.name} too: "
                           f"{again.describe()}")
        return _with_check(plain, again, dropped)
    _warn(session, f"the program's {result.describe()}; kernels: "
                   f"{', '.join(sorted(plan.program.sources()))}")
    return _with_check(plan, result)


def _compare(plan: Plan, graph: Graph, reference: Reference) -> Comparison:
    executor = make_executor(plan.program, plan.schedule)
    try:
        return compare(lambda inputs: executor.run(*inputs), graph, reference,
                       tolerance(plan.program))
    finally:
        executor.close()


def _with_check(plan: Plan, result: Comparison, dropped: tuple[str, ...] = ()) -> Plan:
    return replace(plan, report=replace(plan.report, check=result, dropped=dropped))


def _warn(session: Session, message: str) -> None:
    session.log("  " + message)
    warnings.warn(message, RuntimeWarning, stacklevel=4)


def default_source(session: Session) -> str:
    """The kernel source a compile gets without one named: the fastest where the session's
    meter runs programs for its target (`default_kernels`), TVM's own for a machine it does
    not reach (the vendor kernels are built for the machines paragraph runs on)."""
    if not session.meter.measures(session.target):
        return "tvm"
    return default_kernels(session.target.kind.name, session.tuning_db)


def _schedule(options: CompileOptions, session: Session) -> str:
    """The schedule to plan: ``options.schedule``, or critical-path where the session's
    meter can measure the target (here, or on the remote device), else `UNMEASURED_DEFAULT`;
    a measured schedule for a target that cannot be measured is an error naming the ways
    out."""
    measurable = session.meter.measures(session.target)
    name = options.schedule
    if name is None:
        if measurable:
            return "critical-path"
        session.log(f"  {describe_target(session.target)} does not run on this machine: "
                    f"planning the {UNMEASURED_DEFAULT} schedule, which needs no measurement "
                    "(give an RPC tracker to measure there)")
        return UNMEASURED_DEFAULT
    if not measurable and (name in MEASURED or name.startswith("ios-")):
        raise ParagraphError(
            f"the {name} schedule measures on the device, and programs for "
            f"{describe_target(session.target)} do not run on this machine: give an RPC tracker "
            "and key to measure there (--rpc-tracker HOST:PORT --rpc-key KEY), or a schedule "
            "that needs no measurement "
            "(sequential, wavefront, opara, nimble)")
    return name
