"""A `KernelProgram`: a model lowered (`paragraph.tvm_interop.lowering`) with its kernel source
chosen, and every kernel compiled once into one runtime module for one device, which also serves
the TVM VM baseline built from the same lowered module; and compiled programs on disk."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import tvm
from tvm import relax

from paragraph.errors import ParagraphError
from paragraph.files import atomic_write_bytes
from paragraph.graph import Graph, Node
from paragraph.inputs import IndexRange, index_ranges
from paragraph.tvm_interop.lowering import (
    Dispatch,
    is_gpu,
    kernel_graph,
    lower_tracked,
    resolve_target,
    slices_as_views,
)
from paragraph.tvm_interop.vendor.dispatch import dispatch_to_vendor
from paragraph.tvm_interop.vendor.names import KERNEL_SOURCES, is_vendor_name
from paragraph.tvm_interop.vendor.runtime import ensure_registered
from paragraph.tvm_interop.vendor.select import choose_fastest


@dataclass(frozen=True)
class KernelProgram:
    """A lowered module, its kernel graph, and every kernel compiled once for one device."""

    lowered: tvm.IRModule
    graph: Graph
    target: tvm.target.Target
    device: tvm.runtime.Device
    executable: relax.VMExecutable
    functions: dict[str, object] = field(default_factory=dict)
    operator_graph: Graph | None = None  # the operator graph the kernels were fused from
    kernel_operators: dict[int, tuple[int, ...]] | None = None  # kernel -> its operators
    kernel_source: str = "tvm"  # what `build` was asked for: tvm, vendor or auto
    source: tvm.IRModule | Graph | None = None  # the model `build` lowered
    rewrites: tuple[str, ...] = ()  # library rules applied to the model (rule id: where)
    # input position -> the values it may hold (an embedding's ids), `paragraph.inputs`
    input_ranges: dict[int, IndexRange] = field(default_factory=dict)

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
        if kernels not in KERNEL_SOURCES:
            raise ParagraphError(f"unknown kernel source {kernels!r}; choose from "
                                 f"{KERNEL_SOURCES}")
        target = resolve_target(target)
        if device is None:
            device = tvm.cuda(0) if is_gpu(target) else tvm.cpu(0)
        opgraph, lowered, groups = lower_tracked(mod, target, tuning_db,
                                             _dispatch(kernels, target, device, tuning_db))
        graph = kernel_graph(lowered)
        executable = tvm.compile(lowered, target=target)
        kernel_operators = None
        if groups is not None:
            kernel_operators = {n.id: groups[n.name] for n in graph.nodes
                                if not n.is_source and n.name in groups}
            if len(kernel_operators) != sum(not n.is_source for n in graph.nodes):
                kernel_operators = None
            elif not is_gpu(target):  # offset views are made through host memory (DLPack)
                graph = slices_as_views(graph, opgraph, kernel_operators)
        program = cls(lowered, graph, target, device, executable, operator_graph=opgraph,
                      kernel_operators=kernel_operators, kernel_source=kernels, source=mod,
                      rewrites=tuple(rewrites), input_ranges=index_ranges(opgraph))
        program._link()
        return program

    def _link(self) -> None:
        lib = self.executable.mod
        for n in self.graph.nodes:
            if n.kind != "kernel" or n.attrs["func"] in self.functions:
                continue
            name = n.attrs["func"]
            if n.attrs["source"] == "tvm":
                fn = lib.get_function(name, query_imports=True)
            else:
                if is_vendor_name(name):  # e.g. a program loaded in a fresh process
                    ensure_registered(name)
                fn = tvm.get_global_func(name, allow_missing=True)
            if fn is None:
                raise ParagraphError(f"kernel {name!r} is missing from the compiled module")
            self.functions[name] = fn

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


# ---------------------------------------------------------------------------- compiled programs
PROGRAM_FILE = "paragraph-program.json"


def save_program(program: KernelProgram, directory: str | os.PathLike,
                 info: dict | None = None) -> Path:
    """Write a compiled program to ``directory`` (what ``paragraph compile`` does).

    Files: ``kernels.so`` (every kernel and the VM code, ``export_library``), ``lowered.json``
    (the lowered module, weights included, from which the kernel graph is rebuilt) and
    ``paragraph-program.json`` (target, vendor functions, ``info``). `load_program` reads it.
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    program.executable.export_library(str(out / "kernels.so"))
    atomic_write_bytes(out / "lowered.json", tvm.ir.save_json(program.lowered).encode())
    vendor = sorted({n.attrs["func"] for n in program.graph.nodes
                     if n.kind == "kernel" and n.attrs["source"] == "vendor"})
    meta = {"format": 1, "target": json.loads(str(program.target)),
            "vendor_functions": vendor, "sources": program.sources(),
            "input_ranges": {str(k): r.as_json() for k, r in program.input_ranges.items()},
            **(info or {})}
    atomic_write_bytes(out / PROGRAM_FILE, (json.dumps(meta, indent=2) + "\n").encode())
    return out


def load_program(directory: str | os.PathLike,
                 device: tvm.runtime.Device | None = None) -> tuple[KernelProgram, dict]:
    """A program written by `save_program`, linked and ready to run, and its metadata."""
    path = Path(directory)
    try:
        meta = json.loads((path / PROGRAM_FILE).read_text())
        lowered = tvm.ir.load_json((path / "lowered.json").read_text())
        library = tvm.runtime.load_module(str(path / "kernels.so"))
    except (OSError, ValueError) as e:
        raise ParagraphError(f"{path} is not a compiled paragraph program: {e}") from None
    if meta.get("format") != 1:
        raise ParagraphError(f"{path}: unknown compiled program format {meta.get('format')!r}")
    target = tvm.target.Target(meta["target"])
    if device is None:
        device = tvm.cuda(0) if is_gpu(target) else tvm.cpu(0)
    program = KernelProgram(lowered, kernel_graph(lowered), target, device,
                            relax.VMExecutable(library),
                            kernel_source=str(meta.get("kernels", "tvm")),
                            rewrites=tuple(meta.get("rewrites", ())),
                            input_ranges={int(k): IndexRange.from_json(v) for k, v in
                                          meta.get("input_ranges", {}).items()})
    program._link()
    return program, meta


def _dispatch(kernels: str, target: tvm.target.Target, device: tvm.runtime.Device,
              tuning_db: str | os.PathLike | None) -> Dispatch | None:
    """What turns a prepared module's patterns into calls of the chosen kernel source."""
    if kernels == "tvm":
        return None
    if kernels == "vendor":
        return lambda mod: dispatch_to_vendor(mod, target)

    def probe(mod: tvm.IRModule) -> KernelProgram:  # a probe's calls, compiled as they are
        return KernelProgram.build(mod, target, device=device, tuning_db=tuning_db)

    return lambda mod: choose_fastest(dispatch_to_vendor(mod, target), target, build=probe,
                                      tuning_db=None if tuning_db is None else str(tuning_db))
