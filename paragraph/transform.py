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
`paragraph.build` (or call `paragraph.build` directly). The search and the schedule go through
the one compile path (`paragraph.planner.compile`), with its defaults.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import tvm
from tvm import relax

from paragraph.passes.search import SearchOptions
from paragraph.planner import CompileOptions, check_schedule, compile
from paragraph.progress import Log
from paragraph.rules.library import Library, default_library
from paragraph.rules.match import AnyRule
from paragraph.tvm_interop.build.lowering import build_pipeline
from paragraph.tvm_interop.build.program import (
    REWRITES_ATTR,
    SEARCH_ATTR,
    lower_with_info,
    lowered_info,
    module_rewrites,
    replace_main,
    with_program_info,
)
from paragraph.tvm_interop.frontend.relax_graph import to_relax
from paragraph.tvm_interop.runtime.library.names import check_kernel_source
from paragraph.tvm_interop.runtime.library.torch_kernels import default_kernels
from paragraph.tvm_interop.runtime.target import resolve_target


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


def _path(path: str | os.PathLike[str] | None) -> str | None:
    return None if path is None else str(path)


@tvm.transform.module_pass(opt_level=0, name="paragraph.GraphSubstitution")
class GraphSubstitution:
    """Rewrite ``main`` with the verified substitution library, searched under a
    parallelism-aware cost and confirmed by measurement.

    AutoGraph (AAAI'23) sections 3-4: the mixed critical-path cost (eq. 1), flow-based graph
    partition (sec. 4.1, MetaFlow alg. 2), DP over partition sequences with backtracking inside
    each piece (eq. 2, fig. 6; MetaFlow alg. 1, TASO alg. 2) and the on-board loop that builds
    and times the best candidates under ``schedule`` (alg. 1). ``search`` is a method name
    ("autograph", "taso", "greedy", "none") or `SearchOptions` (cost, beta, budget, top_k: the
    same defaults as everywhere); ``rules`` a `Library`, rules or rule ids (default: the
    shipped library). The result is never slower than the input as measured; the rule ids
    applied are ``main``'s ``paragraph.rewrites`` attribute and the search report its
    ``paragraph.search``.
    """

    def __init__(self, search: str | SearchOptions = "autograph", *,
                 rules: Library | Sequence[AnyRule | str] | None = None,
                 schedule: str = "critical-path",
                 target: tvm.target.Target | str | None = None, kernels: str | None = None,
                 tuning_db: str | os.PathLike[str] | None = None, cores: int | None = None,
                 log: Log | None = None) -> None:
        self.search = SearchOptions.of(search)
        _check(kernels, schedule)
        self.rules = _rules(rules)
        self.schedule, self.target, self.kernels = schedule, target, kernels
        self.tuning_db, self.cores, self.log = _path(tuning_db), cores, log

    def transform_module(self, mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        if self.search is None:
            return mod
        options = CompileOptions(target=_target(self.target), kernels=self.kernels,
                                 schedule=self.schedule, search=self.search,
                                 tuning_db=self.tuning_db, cores=self.cores, rules=self.rules)
        plan = compile(mod, options, log=self.log)
        assert plan.graph is not None and plan.report.search is not None  # a search's plan
        report = plan.report.search
        main = to_relax(plan.graph)["main"].with_attr(REWRITES_ATTR, list(report.rules))
        return replace_main(mod, main.with_attr(SEARCH_ATTR, json.dumps(report.to_json())))


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
                 tuning_db: str | os.PathLike[str] | None = None) -> None:
        _check(kernels)
        self.target, self.kernels, self.tuning_db = target, kernels, _path(tuning_db)

    def transform_module(self, mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        if lowered_info(mod) is not None:  # lowered already
            return mod
        target = _target(self.target)
        kernels = self.kernels or default_kernels(target.kind.name, self.tuning_db)
        return lower_with_info(mod, target, kernels=kernels, tuning_db=self.tuning_db,
                               rewrites=module_rewrites(mod))


@tvm.transform.module_pass(opt_level=0, name="paragraph.InterOperatorSchedule")
class InterOperatorSchedule:
    """Plan how the kernels of ``main`` run concurrently and attach the schedule to ``main``
    (``paragraph.schedule``, JSON), so it travels with the module to `paragraph.build`.

    ``schedule``: "sequential"; "wavefront" (greedy levels); "opara" (Opara, sec. III-B:
    stream allocation and resource-aware launch order); "nimble" (Nimble, sec. 4.2: minimum
    path cover by bipartite matching); "critical-path" (list scheduling on measured kernel
    times, splitting a lone large convolution across cores, confirmed end to end); "ios",
    "ios-parallel", "ios-merge", "ios-both" (IOS, sec. 4: dynamic programming over stages,
    measured). A module not yet lowered is lowered first (as `KernelLowering` does); IOS
    merges and critical-path rewrites return the rebuilt program's module.
    """

    def __init__(self, schedule: str = "critical-path", *,
                 target: tvm.target.Target | str | None = None, kernels: str | None = None,
                 tuning_db: str | os.PathLike[str] | None = None, cores: int | None = None,
                 split: bool = True, log: Log | None = None) -> None:
        _check(kernels, schedule)
        self.schedule, self.target, self.kernels = schedule, target, kernels
        self.tuning_db, self.cores, self.split, self.log = _path(tuning_db), cores, split, log

    def transform_module(self, mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        options = CompileOptions(target=_target(self.target), kernels=self.kernels,
                                 schedule=self.schedule, tuning_db=self.tuning_db,
                                 cores=self.cores, split=self.split)
        plan = compile(mod, options, log=self.log)
        return with_program_info(plan.program, plan.schedule)


@tvm.transform.module_pass(opt_level=0, name="paragraph.TVMBuildPasses")
def _tvm_build_passes(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
    """What ``tvm.compile``'s "default" pipeline runs for the current target, after paragraph
    lowered the module, without fusing again (`build_pipeline`)."""
    return build_pipeline(_target(None))(mod)


def pipeline(target: tvm.target.Target | str | None = None, *,
             search: str | SearchOptions | None = None, kernels: str | None = None,
             tuning_db: str | os.PathLike[str] | None = None,
             rules: Library | Sequence[AnyRule | str] | None = None,
             log: Log | None = None) -> tvm.transform.Pass:
    """The pass ``tvm.compile(mod, target, relax_pipeline=...)`` takes for paragraph's
    graph-level optimisations: `GraphSubstitution` (with ``search``, a method name or
    `SearchOptions`; default none), `KernelLowering` (fusion and ``kernels``) and TVM's own
    build passes. ``target`` None means the one ``tvm.compile`` is given. Vendor kernels are
    called by global name: run the result in a process that imported paragraph (it registers
    them when it lowers)."""
    passes: list[tvm.transform.Pass] = []
    options = SearchOptions.of(search)
    if options is not None:
        passes.append(GraphSubstitution(options, rules=rules, target=target, kernels=kernels,
                                        tuning_db=tuning_db, log=log))
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
