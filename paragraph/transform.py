"""paragraph as TVM passes: graph substitution, kernel lowering, inter-operator scheduling, and
the ``"paragraph"`` pipeline for ``tvm.compile``.

Each pass is an ``IRModule -> IRModule`` `tvm.transform.module_pass` usable in any
``tvm.transform.Sequential``; options are constructor arguments (TVM's PassContext config keys
can only be registered from C++). A pass without a ``target`` uses the current one
(``with target:``, as ``tvm.compile`` sets it), else this machine's CPU::

    mod = tvm.compile(mod, target, relax_pipeline=paragraph.pipeline(search="autograph"))
    paragraph.register_pipelines()      # then relax.get_pipeline("paragraph") works too

The plain TVM VM then gets the graph-level gains (substitutions, fusion, vendor kernels); for
the inter-operator parallel ones, end with `InterOperatorSchedule` and give the module to
`paragraph.build` (or call `paragraph.build` directly).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import tvm
from tvm import relax

from paragraph.passes.search import SearchOptions
from paragraph.planner import check_schedule, plan_schedule, search_plan
from paragraph.rules.library import Library, default_library
from paragraph.rules.match import AnyRule
from paragraph.tvm_interop.build.lowering import build_pipeline, resolve_target
from paragraph.tvm_interop.build.program import (
    build_program,
    lower_with_info,
    lowered_info,
    program_from_lowered,
    replace_main,
    with_program_info,
)
from paragraph.tvm_interop.frontend.relax_graph import from_relax, to_relax
from paragraph.tvm_interop.runtime.library.names import check_kernel_source
from paragraph.tvm_interop.runtime.library.torch_kernels import default_kernels

REWRITES_ATTR = "paragraph.rewrites"  # ``main``'s attribute: rule ids GraphSubstitution applied
SEARCH_ATTR = "paragraph.search"  # ``main``'s attribute: the search's report (JSON)
Log = Callable[[str], None]


def _target(target: tvm.target.Target | str | None) -> tvm.target.Target:
    """The pass's own target, else the current one (``with target:``), else this CPU."""
    if target is None:
        target = tvm.target.Target.current(allow_none=True)
    return resolve_target(target)


def _check(kernels: str | None, schedule: str | None = None) -> None:
    """Options are checked when a pass is made: an error raised inside a running pass reaches
    the caller through TVM's FFI as a RuntimeError (with the message kept)."""
    if kernels is not None:
        check_kernel_source(kernels)
    if schedule is not None:
        check_schedule(schedule)


def _rules(rules: Library | Sequence[AnyRule | str] | None) -> list[AnyRule] | None:
    """A library (every rule, both ways), rules, or rule ids of the shipped library."""
    if rules is None:
        return None
    if isinstance(rules, Library):
        return rules.for_search()
    lib = default_library()
    return [lib.get(r) if isinstance(r, str) else r for r in rules]


def _rewrites(mod: tvm.IRModule) -> tuple[str, ...]:
    main = mod["main"]
    if main.attrs is None or REWRITES_ATTR not in main.attrs:
        return ()
    return tuple(str(r) for r in main.attrs[REWRITES_ATTR])


@tvm.transform.module_pass(opt_level=0, name="paragraph.GraphSubstitution")
class GraphSubstitution:
    """Rewrite ``main`` with the verified substitution library, searched under a
    parallelism-aware cost and confirmed by measurement.

    AutoGraph (AAAI'23) sections 3-4: the mixed critical-path cost (eq. 1), flow-based graph
    partition (sec. 4.1, MetaFlow alg. 2), DP over partition sequences with backtracking inside
    each piece (eq. 2, fig. 6; MetaFlow alg. 1, TASO alg. 2) and the on-board loop that builds
    and times the ``top_k`` best candidates under ``schedule`` (alg. 1). ``search`` is
    "autograph", "taso" (sum cost, beta 1.05), "greedy" or "none"; ``cost`` is sum,
    critical-path, mixed or simulated; ``budget`` bounds the whole search in seconds;
    ``rules`` a `Library`, rules or rule ids (default: the shipped library). The result is
    never slower than the input as measured; the rule ids applied are ``main``'s
    ``paragraph.rewrites`` attribute and the search report its ``paragraph.search``.
    """

    def __init__(self, search: str = "autograph", *, cost: str | None = None,
                 beta: float | None = None, rules: Library | Sequence[AnyRule | str] | None = None,
                 budget: float = 60.0, top_k: int = 20, schedule: str = "critical-path",
                 target: tvm.target.Target | str | None = None, kernels: str | None = None,
                 tuning_db: str | os.PathLike | None = None, cores: int | None = None,
                 log: Log | None = None) -> None:
        self.options = SearchOptions.of(search, cost, beta, budget)
        _check(kernels, schedule)
        self.search, self.rules = search, _rules(rules)
        self.top_k, self.schedule, self.target, self.kernels = top_k, schedule, target, kernels
        self.tuning_db = None if tuning_db is None else str(tuning_db)
        self.cores, self.log = cores, log

    def transform_module(self, mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        if self.search == "none":
            return mod
        target = _target(self.target)
        kernels = self.kernels or default_kernels(target.kind.name, self.tuning_db)
        plan = search_plan(from_relax(mod), target, options=self.options,
                           schedule=self.schedule, kernels=kernels, tuning_db=self.tuning_db,
                           top_k=self.top_k, cores=self.cores, rules=self.rules, log=self.log)
        assert plan.graph is not None  # search_plan always says which graph it chose
        main = to_relax(plan.graph)["main"]
        report = dict(plan.report).get("search", {})
        main = main.with_attr(REWRITES_ATTR, list(report.get("rules", [])))
        return replace_main(mod, main.with_attr(SEARCH_ATTR, json.dumps(report, default=str)))


@tvm.transform.module_pass(opt_level=0, name="paragraph.KernelLowering")
class KernelLowering:
    """Lower ``main`` to the kernels paragraph runs: the model prepared (batch norm folded,
    constants folded), operator patterns dispatched to ``kernels`` (vendor libraries, as TVM's
    cuDNN/cuBLAS BYOC does, or the faster of vendor and TVM per call by measurement for
    "auto"), then TVM's LegalizeOps, FuseOps and FuseTIR (and a MetaSchedule database).
    TVM's default CPU pipeline does not fuse; this does. ``main`` carries what rebuilding the
    kernel graph needs (``paragraph.program``). Kernel sources: design notes, "Kernel sources".
    """

    def __init__(self, target: tvm.target.Target | str | None = None, *,
                 kernels: str | None = None,
                 tuning_db: str | os.PathLike | None = None) -> None:
        _check(kernels)
        self.target, self.kernels = target, kernels
        self.tuning_db = None if tuning_db is None else str(tuning_db)

    def transform_module(self, mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        if lowered_info(mod) is not None:  # lowered already
            return mod
        target = _target(self.target)
        kernels = self.kernels or default_kernels(target.kind.name, self.tuning_db)
        return lower_with_info(mod, target, kernels=kernels, tuning_db=self.tuning_db,
                               rewrites=_rewrites(mod))


@tvm.transform.module_pass(opt_level=0, name="paragraph.InterOperatorSchedule")
class InterOperatorSchedule:
    """Plan how the kernels of ``main`` run concurrently and attach the schedule to ``main``
    (``paragraph.schedule``, JSON), so it travels with the module to `paragraph.build`.

    ``method``: "sequential"; "wavefront" (greedy levels); "opara" (Opara, sec. III-B: stream
    allocation and resource-aware launch order); "nimble" (Nimble, sec. 4.2: minimum path
    cover by bipartite matching); "critical-path" (list scheduling on measured kernel times,
    splitting a lone large convolution across cores, confirmed end to end); "ios",
    "ios-parallel", "ios-merge", "ios-both" (IOS, sec. 4: dynamic programming over stages,
    measured). A module not yet lowered is lowered first (`KernelLowering`); IOS merges and
    critical-path splits return the rebuilt program's module.
    """

    def __init__(self, method: str = "critical-path", *,
                 target: tvm.target.Target | str | None = None, kernels: str | None = None,
                 tuning_db: str | os.PathLike | None = None, cores: int | None = None,
                 split: bool = True, log: Log | None = None) -> None:
        _check(kernels, method)
        self.method, self.target, self.kernels = method, target, kernels
        self.tuning_db = None if tuning_db is None else str(tuning_db)
        self.cores, self.split, self.log = cores, split, log

    def transform_module(self, mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        target = _target(self.target)
        if lowered_info(mod) is not None:
            program = program_from_lowered(mod, target)
        else:
            kernels = self.kernels or default_kernels(target.kind.name, self.tuning_db)
            program = build_program(mod, target, tuning_db=self.tuning_db,
                                          kernels=kernels, rewrites=_rewrites(mod))
        plan = plan_schedule(self.method, program, tuning_db=self.tuning_db, cores=self.cores,
                             log=self.log, split=self.split)
        return with_program_info(plan.program, plan.schedule)


@tvm.transform.module_pass(opt_level=0, name="paragraph.TVMBuildPasses")
def _tvm_build_passes(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
    """What ``tvm.compile``'s "default" pipeline runs for the current target, after paragraph
    lowered the module, without fusing again (`build_pipeline`)."""
    return build_pipeline(_target(None))(mod)


def pipeline(target: tvm.target.Target | str | None = None, *, search: str = "none",
             kernels: str | None = None, tuning_db: str | os.PathLike | None = None,
             cost: str | None = None, beta: float | None = None, budget: float = 60.0,
             top_k: int = 20, rules: Library | Sequence[AnyRule | str] | None = None,
             log: Log | None = None) -> tvm.transform.Pass:
    """The pass ``tvm.compile(mod, target, relax_pipeline=...)`` takes for paragraph's
    graph-level optimisations: `GraphSubstitution` (when ``search`` is not "none"),
    `KernelLowering` (fusion and ``kernels``) and TVM's own build passes. ``target`` None means
    the one ``tvm.compile`` is given. Vendor kernels are called by global name: run the
    result in a process that imported paragraph (it registers them when it lowers)."""
    passes: list[tvm.transform.Pass] = []
    if search != "none":
        passes.append(GraphSubstitution(search, cost=cost, beta=beta, rules=rules,
                                        budget=budget, top_k=top_k, target=target,
                                        kernels=kernels, tuning_db=tuning_db, log=log))
    passes.append(KernelLowering(target, kernels=kernels, tuning_db=tuning_db))
    passes.append(_tvm_build_passes)
    return tvm.transform.Sequential(passes, name="paragraph")


def register_pipelines() -> None:
    """Register `pipeline` as ``"paragraph"`` for ``relax.get_pipeline`` and
    ``tvm.compile(..., relax_pipeline="paragraph")`` (keyword options pass through
    ``relax.get_pipeline("paragraph", **options)``). Calling it again does nothing."""
    try:
        relax.register_pipeline("paragraph")(pipeline)
    except ValueError:  # registered already: TVM refuses a name twice
        pass


__all__ = ["GraphSubstitution", "KernelLowering", "InterOperatorSchedule", "pipeline",
           "register_pipelines"]
