"""A `KernelProgram`: a model lowered (`paragraph.tvm_interop.build.lowering`) with its kernel source
chosen, and every kernel compiled once into one runtime module for one device, which also serves
the TVM VM baseline built from the same lowered module; and a lowered module that carries what
rebuilding its program needs (`with_program_info`, `KernelProgram.from_lowered`)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import tvm
from tvm import relax

from paragraph.errors import ParagraphError
from paragraph.graph import Graph, Node
from paragraph.inputs import IndexRange, index_ranges
from paragraph.schedule import Schedule
from paragraph.tvm_interop.build.compiled import compiled_kernels
from paragraph.tvm_interop.build.lowering import (
    Dispatch,
    build_pipeline,
    default_device,
    is_gpu,
    kernel_graph,
    lower_tracked,
    resolve_target,
    slices_as_views,
)
from paragraph.tvm_interop.build.dispatch import dispatch_to_vendor
from paragraph.tvm_interop.runtime.library.names import check_kernel_source, is_vendor_name
from paragraph.tvm_interop.runtime.library.torch_kernels import ensure_registered
from paragraph.tvm_interop.build.select import choose_fastest


@dataclass(frozen=True)
class KernelProgram:
    """A lowered module, its kernel graph, and every kernel compiled once for one device."""

    lowered: tvm.IRModule
    graph: Graph
    target: tvm.target.Target
    device: tvm.runtime.Device
    # the TVM VM's executable of ``lowered``, compiled when first asked for (`executable`):
    # on a CPU the program's own kernels come from `compiled_kernels`
    _executable: relax.VMExecutable | None
    functions: dict[str, object] = field(default_factory=dict)
    operator_graph: Graph | None = None  # the operator graph the kernels were fused from
    kernel_operators: dict[int, tuple[int, ...]] | None = None  # kernel -> its operators
    kernel_source: str = "tvm"  # what `build` was asked for: tvm, vendor or auto
    source: tvm.IRModule | Graph | None = None  # the model `build` lowered
    rewrites: tuple[str, ...] = ()  # library rules applied to the model (rule id: where)
    # input position -> the values it may hold (an embedding's ids), `paragraph.inputs`
    input_ranges: dict[int, IndexRange] = field(default_factory=dict)
    build_seconds: float = 0.0  # what `build` took: lowering, dispatch and compilation

    @classmethod
    def build(cls, mod: tvm.IRModule | Graph, target: tvm.target.Target | str | None = None, *,
              device: tvm.runtime.Device | None = None,
              tuning_db: str | os.PathLike | None = None,
              kernels: str = "tvm", rewrites: Sequence[str] = ()) -> KernelProgram:
        """Lower ``mod``, build its kernel graph and compile the lowered module once.

        ``kernels`` chooses the kernel source: "tvm" (TVM codegen), "vendor" (operator
        patterns dispatched to vendor libraries, `dispatch_to_vendor`) or "auto" (dispatched,
        then per distinct call the faster of vendor and TVM by measurement, `choose_fastest`).
        An operator graph ``mod`` is taken as prepared and dispatched already. ``rewrites``
        names the library rules that made ``mod`` from the model, for reports and tolerances.
        """
        check_kernel_source(kernels)
        start = time.perf_counter()
        target = resolve_target(target)
        device = device or default_device(target)
        opgraph, lowered, graph, kernel_operators = _lower(mod, target, device, tuning_db,
                                                           kernels)
        program = cls(lowered, graph, target, device, None, operator_graph=opgraph,
                      kernel_operators=kernel_operators, kernel_source=kernels, source=mod,
                      rewrites=tuple(rewrites), input_ranges=index_ranges(opgraph),
                      build_seconds=time.perf_counter() - start)
        program._link()
        return program

    @classmethod
    def from_lowered(cls, lowered: tvm.IRModule,
                     target: tvm.target.Target | str | None = None, *,
                     device: tvm.runtime.Device | None = None,
                     executable: relax.VMExecutable | None = None) -> KernelProgram:
        """The program of a module that `with_program_info` wrote (a lowered module with its
        metadata on ``main``), compiled (or linked to ``executable``, e.g. one loaded from an
        artifact) without lowering it again. Raises `ParagraphError` for any other module."""
        info = lowered_info(lowered)
        if info is None:
            raise ParagraphError(f"the module is not a lowered paragraph program (main has no "
                                 f"{PROGRAM_ATTR!r} attribute): lower it with "
                                 "KernelProgram.build or the InterOperatorSchedule pass")
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
        program = cls(lowered, graph, target, device or default_device(target), executable,
                      kernel_source=kernels,
                      rewrites=tuple(str(r) for r in info.get("rewrites", ())),
                      input_ranges=ranges)
        program._link()
        return program

    def _link(self) -> None:
        # a GPU program (or one given its executable) links to the VM's module instead
        own = (compiled_kernels(self.lowered, self.target)
               if self._executable is None and _shares_kernels(self.target) else None)
        for n in self.graph.nodes:
            if n.kind != "kernel" or n.attrs["func"] in self.functions:
                continue
            name = n.attrs["func"]
            if n.attrs["source"] == "tvm":
                fn = own.get(name) if own is not None else self._exported(name)
            else:
                if is_vendor_name(name):  # e.g. a program loaded in a fresh process
                    ensure_registered(name)
                fn = tvm.get_global_func(name, allow_missing=True)
            if fn is None:
                raise ParagraphError(f"kernel {name!r} is missing from the compiled module")
            self.functions[name] = fn

    def _exported(self, name: str):
        """A TVM kernel of the VM's executable, or None (tvm-ffi raises for a name that is
        missing: say which kernel, and whether the lowered module had it, instead)."""
        try:
            return self.executable.mod.get_function(name, query_imports=True)
        except AttributeError:
            had = any(gv.name_hint == name for gv in self.lowered.functions)
            raise ParagraphError(
                f"kernel {name!r} is missing from the module tvm.compile built for "
                f"{self.target.kind.name} (the lowered module "
                f"{'has' if had else 'does not have'} it)") from None

    @property
    def executable(self) -> relax.VMExecutable:
        """The TVM VM's executable of ``lowered`` (every kernel in one module: the VM baseline,
        an exported library and a GPU program's kernels use it), compiled on first use."""
        with _EXECUTABLE_LOCK:
            if self._executable is None:
                object.__setattr__(self, "_executable", tvm.compile(
                    self.lowered, target=self.target,
                    relax_pipeline=build_pipeline(self.target)))
        assert self._executable is not None
        return self._executable

    @property
    def kernels(self) -> list[Node]:
        """The kernel and view nodes, in topological order."""
        return [n for n in self.graph.nodes if not n.is_source]

    def function(self, node: Node):
        """The compiled function of a kernel node (DPS: inputs, then outputs)."""
        return self.functions[node.attrs["func"]]

    def vm(self) -> relax.VirtualMachine:
        """The TVM VM over the same lowered module and compiled kernels (the baseline)."""
        return relax.VirtualMachine(self.executable, self.device)

    def sources(self) -> dict[str, int]:
        """How many kernels come from each source ("tvm", "vendor")."""
        counts: dict[str, int] = {}
        for n in self.graph.nodes:
            if n.kind == "kernel":
                counts[n.attrs["source"]] = counts.get(n.attrs["source"], 0) + 1
        return counts


_EXECUTABLE_LOCK = threading.Lock()


def _shares_kernels(target: tvm.target.Target) -> bool:
    """Whether programs for ``target`` take their TVM kernels from `compiled_kernels`: on a
    CPU; a GPU program keeps one module of its own (host and device code), which no GPU
    here could check the shared path against."""
    return target.kind.name == "llvm"


def _lower(mod: tvm.IRModule | Graph, target: tvm.target.Target, device: tvm.runtime.Device,
           tuning_db: str | os.PathLike | None, kernels: str,
           ) -> tuple[Graph, tvm.IRModule, Graph, dict[int, tuple[int, ...]] | None]:
    """The operator graph, lowered module, kernel graph and kernel -> operators of ``mod``."""
    opgraph, lowered, groups = lower_tracked(mod, target, tuning_db,
                                             kernel_dispatch(kernels, target, device, tuning_db))
    graph = kernel_graph(lowered)
    kernel_operators = None
    if groups is not None:
        kernel_operators = {n.id: groups[n.name] for n in graph.nodes
                            if not n.is_source and n.name in groups}
        if len(kernel_operators) != sum(not n.is_source for n in graph.nodes):
            kernel_operators = None
        elif not is_gpu(target):  # offset views are made through host memory (DLPack)
            graph = slices_as_views(graph, opgraph, kernel_operators)
    return opgraph, lowered, graph, kernel_operators


# ---------------------------------------------------------------------------- lowered programs
PROGRAM_ATTR = "paragraph.program"  # ``main``'s attribute: how to rebuild the kernel graph
SCHEDULE_ATTR = "paragraph.schedule"  # ``main``'s attribute: a `Schedule` of that graph (JSON)


def program_info(program: KernelProgram) -> dict:
    """What a lowered module alone does not say about its program, as JSON values: the kernel
    source, the kernels that run as byte-offset views (`slices_as_views`), the index ranges of
    integer inputs and the library rules applied. `KernelProgram.from_lowered` reads it back."""
    return _info(program.kernel_source, program.graph, program.input_ranges, program.rewrites)


def _info(kernels: str, graph: Graph, ranges: dict[int, IndexRange],
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
    """``mod`` lowered as `KernelProgram.build` lowers it (prepared, ``kernels`` dispatched,
    legalized and fused), not compiled, with its `program_info` attached to ``main``."""
    check_kernel_source(kernels)
    target = resolve_target(target)
    opgraph, lowered, graph, _ = _lower(mod, target, default_device(target), tuning_db, kernels)
    info = _info(kernels, graph, index_ranges(opgraph), rewrites)
    out = replace_main(lowered, lowered["main"].with_attr(PROGRAM_ATTR, json.dumps(info)))
    for n in graph.nodes:  # the TVM VM calls vendor kernels by their global names
        if n.kind == "kernel" and n.attrs["source"] == "vendor" and is_vendor_name(
                n.attrs["func"]):
            ensure_registered(n.attrs["func"])
    return out


def with_program_info(program: KernelProgram, schedule: Schedule | None = None) -> tvm.IRModule:
    """The program's lowered module with `program_info` attached to ``main`` (JSON), so the
    module alone rebuilds the same kernel graph (`KernelProgram.from_lowered`), and with
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
        return KernelProgram.build(mod, target, device=device, tuning_db=tuning_db)

    return lambda mod: choose_fastest(dispatch_to_vendor(mod, target), target, build=probe,
                                      tuning_db=None if tuning_db is None else str(tuning_db))
