"""Building a `KernelProgram` (`paragraph.tvm_interop.runtime.program`): a model lowered
(`paragraph.tvm_interop.build.lowering`) with its kernel source chosen, every kernel compiled
once into one runtime module for one device (which also serves the TVM VM baseline built from
the same lowered module) and linked (`build_program`); and a lowered module that carries what
rebuilding its program needs (`with_program_info`, `program_from_lowered`)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence

import tvm
from tvm import relax

from paragraph.errors import ParagraphError
from paragraph.graph import Graph
from paragraph.inputs import IndexRange, index_ranges
from paragraph.schedule import Schedule
from paragraph.tvm_interop.build.compiled import compiled_kernels
from paragraph.tvm_interop.build.dispatch import dispatch_to_vendor
from paragraph.tvm_interop.build.lowering import (
    Dispatch,
    build_pipeline,
    kernel_graph,
    lower_tracked,
    slices_as_views,
)
from paragraph.tvm_interop.build.select import choose_fastest
from paragraph.tvm_interop.runtime.library.names import check_kernel_source, is_vendor_name
from paragraph.tvm_interop.runtime.library.torch_kernels import ensure_registered
from paragraph.tvm_interop.runtime.program import KernelProgram, Once
from paragraph.tvm_interop.runtime.target import default_device, is_cpu, is_gpu, resolve_target


def build_program(mod: tvm.IRModule | Graph, target: tvm.target.Target | str | None = None, *,
                  device: tvm.runtime.Device | None = None,
                  tuning_db: str | os.PathLike | None = None,
                  kernels: str = "tvm", rewrites: Sequence[str] = ()) -> KernelProgram:
    """Lower ``mod``, build its kernel graph and compile the lowered module once.

    ``kernels`` chooses the kernel source: "tvm" (TVM codegen), "vendor" (operator patterns
    dispatched to vendor libraries, `dispatch_to_vendor`) or "auto" (dispatched, then per
    distinct call the faster of vendor and TVM by measurement, `choose_fastest`). A Relax
    ``mod`` is prepared first (`paragraph.tvm_interop.frontend.importers.prepare`) and the
    program keeps the prepared operator graph (``model``); an operator graph ``mod`` is taken
    as prepared and dispatched already (a rewrite of another program's ``operator_graph``).
    ``rewrites`` names the library rules that made ``mod`` from the model, for reports and
    tolerances.
    """
    check_kernel_source(kernels)
    start = time.perf_counter()
    target = resolve_target(target)
    device = device or default_device(target)
    opgraph, lowered, graph, kernel_operators, model = _lower(mod, target, device, tuning_db,
                                                              kernels)
    compiled = vm_executable(lowered, target)
    return KernelProgram(graph, device, _link(graph, lowered, target, compiled),
                         Once.of(lowered), Once.of(target), compiled, model=model,
                         operator_graph=opgraph, kernel_operators=kernel_operators,
                         kernel_source=kernels,
                         rewrites=tuple(rewrites), input_ranges=index_ranges(opgraph),
                         build_seconds=time.perf_counter() - start)


def program_from_lowered(lowered: tvm.IRModule, target: tvm.target.Target | str | None = None,
                         *, device: tvm.runtime.Device | None = None) -> KernelProgram:
    """The program of a module that `with_program_info` wrote (a lowered module with its
    metadata on ``main``), compiled without lowering it again. Raises `ParagraphError` for
    any other module. (An artifact's program is read from its kernel graph instead:
    `paragraph.tvm_interop.runtime.artifact`.)"""
    info = lowered_info(lowered)
    if info is None:
        raise ParagraphError(f"the module is not a lowered paragraph program (main has no "
                             f"{PROGRAM_ATTR!r} attribute): lower it with build_program or the "
                             "InterOperatorSchedule pass")
    target = resolve_target(target)
    kernels = str(info.get("kernels", "tvm"))
    check_kernel_source(kernels)
    graph = kernel_graph(lowered)
    try:
        views = {int(k): int(v) for k, v in info.get("views", {}).items()}
        ranges = {int(k): IndexRange.from_json(v)
                  for k, v in info.get("input_ranges", {}).items()}
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise ParagraphError(f"corrupt program metadata: {type(e).__name__}: {e}") from None
    bad = [k for k in views if k not in graph or graph[k].kind != "kernel"]
    if bad:
        raise ParagraphError(f"program metadata names views %{bad} that are not kernels "
                             "of this module")
    if views:
        graph = Graph([n.replace(kind="view", attrs={"offset": views[n.id],
                                                     "func": n.attrs["func"]})
                       if n.id in views else n for n in graph.nodes], graph.outputs,
                      graph.meta)
    compiled = vm_executable(lowered, target)
    functions = _link(graph, lowered, target, compiled)
    return KernelProgram(graph, device or default_device(target), functions, Once.of(lowered),
                         Once.of(target), compiled, kernel_source=kernels,
                         rewrites=tuple(str(r) for r in info.get("rewrites", ())),
                         input_ranges=ranges)


def vm_executable(lowered: tvm.IRModule, target: tvm.target.Target
                  ) -> Once[relax.VMExecutable]:
    """The TVM VM's executable of ``lowered``, compiled on first use."""
    return Once(lambda: tvm.compile(lowered, target=target,
                                    relax_pipeline=build_pipeline(target)))


def _link(graph: Graph, lowered: tvm.IRModule, target: tvm.target.Target,
          compiled: Once[relax.VMExecutable]) -> dict[str, Callable[..., object]]:
    """Kernel function name -> compiled function for every kernel of ``graph``: a CPU
    program's TVM kernels from the shared cache (`compiled_kernels`), a GPU program's from its
    VM executable, vendor kernels by their global names."""
    own = compiled_kernels(lowered, target) if _shares_kernels(target) else None
    functions: dict[str, Callable[..., object]] = {}
    for n in graph.nodes:
        if n.kind != "kernel" or n.attrs["func"] in functions:
            continue
        name = n.attrs["func"]
        if n.attrs["source"] == "tvm":
            fn = own.get(name) if own is not None else _exported(compiled, lowered, target,
                                                                 name)
        else:
            if is_vendor_name(name):  # the TVM VM calls it by this name
                ensure_registered(name)
            fn = tvm.get_global_func(name, allow_missing=True)
        if fn is None:
            raise ParagraphError(f"kernel {name!r} is missing from the compiled module")
        functions[name] = fn
    return functions


def _exported(compiled: Once[relax.VMExecutable], lowered: tvm.IRModule,
              target: tvm.target.Target, name: str) -> Callable[..., object]:
    """A TVM kernel of the VM's executable (tvm-ffi raises for a name that is missing: say
    which kernel, and whether the lowered module had it, instead)."""
    try:
        return compiled.get().mod.get_function(name, query_imports=True)
    except AttributeError:
        had = any(gv.name_hint == name for gv in lowered.functions)
        raise ParagraphError(
            f"kernel {name!r} is missing from the module tvm.compile built for "
            f"{target.kind.name} (the lowered module "
            f"{'has' if had else 'does not have'} it)") from None


def _shares_kernels(target: tvm.target.Target) -> bool:
    """Whether programs for ``target`` take their TVM kernels from `compiled_kernels`: on a
    CPU; a GPU program keeps one module of its own (host and device code), which no GPU
    here could check the shared path against."""
    return is_cpu(target)


def _lower(mod: tvm.IRModule | Graph, target: tvm.target.Target, device: tvm.runtime.Device,
           tuning_db: str | os.PathLike | None, kernels: str,
           ) -> tuple[Graph, tvm.IRModule, Graph, dict[int, tuple[int, ...]] | None,
                      Once[Graph] | None]:
    """The operator graph, lowered module, kernel graph, kernel -> operators and the prepared
    model graph (`lower_tracked`) of ``mod``."""
    opgraph, lowered, groups, model = lower_tracked(
        mod, target, tuning_db, kernel_dispatch(kernels, target, device, tuning_db))
    graph = kernel_graph(lowered)
    kernel_operators = None
    if groups is not None:
        kernel_operators = {n.id: groups[n.name] for n in graph.nodes
                            if not n.is_source and n.name in groups}
        if len(kernel_operators) != sum(not n.is_source for n in graph.nodes):
            kernel_operators = None
        elif not is_gpu(target):  # offset views are made through host memory (DLPack)
            graph = slices_as_views(graph, opgraph, kernel_operators)
    return opgraph, lowered, graph, kernel_operators, model


# ---------------------------------------------------------------------------- lowered programs
PROGRAM_ATTR = "paragraph.program"  # ``main``'s attribute: how to rebuild the kernel graph
SCHEDULE_ATTR = "paragraph.schedule"  # ``main``'s attribute: a `Schedule` of that graph (JSON)
REWRITES_ATTR = "paragraph.rewrites"  # ``main``'s attribute: rule ids a graph search applied
SEARCH_ATTR = "paragraph.search"  # ``main``'s attribute: the search's report (JSON)


def program_info(program: KernelProgram) -> dict:
    """What a lowered module alone does not say about its program, as JSON values: the kernel
    source, the kernels that run as byte-offset views (`slices_as_views`), the index ranges of
    integer inputs and the library rules applied. `program_from_lowered` reads it back."""
    return _info(program.kernel_source, program.graph, program.input_ranges, program.rewrites)


def _info(kernels: str, graph: Graph, ranges: Mapping[int, IndexRange],
          rewrites: Sequence[str]) -> dict:
    # only `slices_as_views` gives a view an offset, and only a kernel becomes one
    views = {str(n.id): n.attrs["offset"] for n in graph.nodes
             if n.kind == "view" and "offset" in n.attrs}
    return {"kernels": kernels, "views": views,
            "input_ranges": {str(k): r.as_json() for k, r in ranges.items()},
            "rewrites": list(rewrites)}


def lower_with_info(mod: tvm.IRModule, target: tvm.target.Target | str | None = None, *,
                    kernels: str = "tvm", tuning_db: str | os.PathLike | None = None,
                    rewrites: Sequence[str] = ()) -> tvm.IRModule:
    """``mod`` lowered as `build_program` lowers it (prepared, ``kernels`` dispatched,
    legalized and fused), not compiled, with its `program_info` attached to ``main``."""
    check_kernel_source(kernels)
    target = resolve_target(target)
    opgraph, lowered, graph, _, _ = _lower(mod, target, default_device(target), tuning_db,
                                           kernels)
    info = _info(kernels, graph, index_ranges(opgraph), rewrites)
    out = replace_main(lowered, lowered["main"].with_attr(PROGRAM_ATTR, json.dumps(info)))
    for n in graph.nodes:  # the TVM VM calls vendor kernels by their global names
        if n.kind == "kernel" and n.attrs["source"] == "vendor" and is_vendor_name(
                n.attrs["func"]):
            ensure_registered(n.attrs["func"])
    return out


def with_program_info(program: KernelProgram, schedule: Schedule | None = None) -> tvm.IRModule:
    """The program's lowered module with `program_info` attached to ``main`` (JSON), so the
    module alone rebuilds the same kernel graph (`program_from_lowered`), and with
    ``schedule`` (checked against that graph) attached too when given."""
    main = program.lowered["main"].with_attr(PROGRAM_ATTR, json.dumps(program_info(program)))
    if schedule is not None:
        schedule.validate(program.graph)
        main = main.with_attr(SCHEDULE_ATTR, schedule.dumps())
    return replace_main(program.lowered, main)


def replace_main(mod: tvm.IRModule, main: relax.Function) -> tvm.IRModule:
    """A copy of ``mod`` (its functions and attributes) whose ``main`` is ``main``."""
    out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
    out["main"] = main
    return out


def _main_attr(mod: tvm.IRModule, key: str) -> str | None:
    for gv, func in mod.functions_items():
        if gv.name_hint == "main" and func.attrs is not None and key in func.attrs:
            return str(func.attrs[key])
    return None


def module_rewrites(mod: tvm.IRModule) -> tuple[str, ...]:
    """The library rules (by id) that a graph search applied to ``mod`` (``main``'s
    `REWRITES_ATTR`, set by `paragraph.transform.GraphSubstitution`), for reports and
    tolerances of the programs built from it."""
    text = None
    for gv, func in mod.functions_items():
        if gv.name_hint == "main" and func.attrs is not None and REWRITES_ATTR in func.attrs:
            text = func.attrs[REWRITES_ATTR]
    return () if text is None else tuple(str(r) for r in text)


def lowered_info(mod: tvm.IRModule) -> dict | None:
    """`program_info` attached to a module's ``main`` by `with_program_info`, or None."""
    text = _main_attr(mod, PROGRAM_ATTR)
    if text is None:
        return None
    try:
        info = json.loads(text)
    except ValueError as e:
        raise ParagraphError(f"corrupt {PROGRAM_ATTR} attribute on main: {e}") from None
    if not isinstance(info, dict):
        raise ParagraphError(f"corrupt {PROGRAM_ATTR} attribute on main")
    return info


def attached_schedule(mod: tvm.IRModule, program: KernelProgram) -> Schedule | None:
    """The schedule `with_program_info` attached to ``mod``'s ``main``, checked against
    ``program`` (its kernel graph); None when there is none."""
    text = _main_attr(mod, SCHEDULE_ATTR)
    return None if text is None else Schedule.from_json(text, program.graph)


def kernel_dispatch(kernels: str, target: tvm.target.Target, device: tvm.runtime.Device,
                    tuning_db: str | os.PathLike | None) -> Dispatch | None:
    """What turns a prepared module's patterns into calls of the kernel source ``kernels``
    (None for TVM's own kernels)."""
    if kernels == "tvm":
        return None
    if kernels == "vendor":
        return lambda mod: dispatch_to_vendor(mod, target)

    def probe(mod: tvm.IRModule) -> KernelProgram:  # a probe's calls, compiled as they are
        return build_program(mod, target, device=device, tuning_db=tuning_db)

    return lambda mod: choose_fastest(dispatch_to_vendor(mod, target), target, build=probe,
                                      tuning_db=None if tuning_db is None else str(tuning_db))
