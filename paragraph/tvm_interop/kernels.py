"""The kernel graph: a Relax module lowered through TVM's own legalization and fusion.

``lower`` runs what ``relax.get_default_pipeline`` runs before memory planning (LegalizeOps,
AnnotateTIROpPattern, FoldConstant, FuseOps, FuseTIR; dlight default schedules on GPU; a
MetaSchedule database when given; RewriteDataflowReshape so reshapes become views), and
``kernel_graph`` turns the fused ``main`` into a `paragraph.Graph` whose operator nodes are
``kernel`` (one ``call_tir`` or ``call_dps_packed``) and ``view`` (a reshape that moves no data).
Schedules and costs are about these fused kernels, because they are what runs. A
`KernelProgram` compiles all of them once into one runtime module, which also serves the
TVM VM baseline built from the same lowered module.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import tvm
import tvm_ffi
from tvm import relax

from paragraph.errors import ParagraphError, UnsupportedModelError
from paragraph.graph import Graph, Node
from paragraph.tvm_interop.relax_graph import from_relax
from paragraph.tvm_interop.vm import local_cpu_target

# a GPU target that compiles here without a GPU (nvcc is present); H100/H200 are sm_90
CUDA_COMPILE_ONLY = {"kind": "cuda", "arch": "sm_90"}


def resolve_target(target: tvm.target.Target | str | dict | None) -> tvm.target.Target:
    """``None``/"cpu"/"llvm" -> this machine's CPU; "cuda"/"gpu" -> the visible GPU (or sm_90
    for compiling without one); anything else goes to ``tvm.target.Target``."""
    if target is None or target in ("cpu", "llvm"):
        return local_cpu_target()
    if target in ("cuda", "gpu"):
        dev = tvm.cuda(0)
        if dev.exist:
            return tvm.target.Target.from_device(dev)
        return tvm.target.Target(CUDA_COMPILE_ONLY)
    if isinstance(target, tvm.target.Target):
        return target
    return tvm.target.Target(target)


def is_gpu(target: tvm.target.Target) -> bool:
    return target.kind.name in ("cuda", "rocm", "vulkan", "metal", "opencl")


def lower(mod: tvm.IRModule, target: tvm.target.Target,
          tuning_db: str | os.PathLike | None = None) -> tvm.IRModule:
    """Legalize and fuse ``mod`` for ``target`` (what the default pipeline does before memory
    planning); apply a MetaSchedule database directory when given."""
    from paragraph.tvm_interop.importers import prepare

    mod = prepare(mod)  # batch norm decomposed, constants folded in numpy (FoldConstant is slow)
    passes = [relax.transform.LegalizeOps(),
              relax.transform.AnnotateTIROpPattern(), relax.transform.FoldConstant(),
              relax.transform.FuseOps(), relax.transform.FuseTIR()]
    if tuning_db is not None:
        if not (Path(tuning_db) / "database_tuning_record.json").exists():
            raise ParagraphError(f"no MetaSchedule database in {tuning_db} "
                                 "(database_tuning_record.json is missing)")
        passes.append(relax.transform.MetaScheduleApplyDatabase(str(tuning_db)))
    if is_gpu(target):
        from tvm.s_tir import dlight as dl

        passes.append(dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(),
                                              dl.gpu.Reduction(), dl.gpu.GeneralReduction(),
                                              dl.gpu.Fallback()))
    passes += [relax.transform.RewriteDataflowReshape(), relax.transform.DeadCodeElimination()]
    with target:
        return tvm.transform.Sequential(passes)(mod)


def _kernel_attrs(lowered: tvm.IRModule, node: Node) -> dict:
    """Attributes of a kernel node: callee name, structural hash, FLOPs, bytes, source."""
    from tvm.s_tir.analysis import estimate_tir_flops

    op = node.attrs["op"]
    callee = node.payload["args"][0][1]  # ("keep", GlobalVar or ExternFunc)
    nbytes = sum(t.numel * tvm_ffi.dtype(t.dtype).itemsize for t in node.outputs)
    if op == "relax.call_tir":
        func = lowered[callee]
        flops = float(estimate_tir_flops(tvm.IRModule({"main": func})))
        return {"func": callee.name_hint, "hash": f"{tvm_ffi.structural_hash(func):016x}",
                "flops": flops, "out_bytes": nbytes, "source": "tvm",
                "pattern": int(func.attrs.get("op_pattern", -1)) if func.attrs else -1}
    name = str(callee.global_symbol)
    return {"func": name, "hash": f"packed:{name}:{node.attrs['literals']}",
            "flops": 0.0, "out_bytes": nbytes, "source": "vendor", "pattern": -1}


def kernel_graph(lowered: tvm.IRModule) -> Graph:
    """The fused ``main`` as a graph of ``kernel`` and ``view`` nodes over inputs and weights."""
    graph = from_relax(lowered)
    nodes = []
    for n in graph.nodes:
        if n.is_source:
            nodes.append(n)
        elif n.kind == "reshape":
            nodes.append(n.replace(kind="view"))
        elif n.kind == "opaque" and n.attrs["op"] in ("relax.call_tir",
                                                       "relax.call_dps_packed"):
            attrs = _kernel_attrs(lowered, n)
            nodes.append(n.replace(kind="kernel", attrs=attrs, payload=None))
        else:
            what = n.attrs.get("op", n.kind) if n.kind == "opaque" else n.kind
            raise UnsupportedModelError(f"{what} ({n.name!r}) survived lowering; the executor "
                                        "runs call_tir and call_dps_packed kernels only")
    meta = {k: v for k, v in graph.meta.items() if k != "relax_module"}
    return Graph(nodes, graph.outputs, meta)


@dataclass
class KernelProgram:
    """A lowered module, its kernel graph, and every kernel compiled once for one device."""

    lowered: tvm.IRModule
    graph: Graph
    target: tvm.target.Target
    device: tvm.runtime.Device
    executable: relax.VMExecutable
    functions: dict[str, object] = field(default_factory=dict)

    @classmethod
    def build(cls, mod: tvm.IRModule, target: tvm.target.Target | str | None = None, *,
              device: tvm.runtime.Device | None = None,
              tuning_db: str | os.PathLike | None = None) -> KernelProgram:
        """Lower ``mod``, build its kernel graph and compile the lowered module once."""
        target = resolve_target(target)
        lowered = lower(mod, target, tuning_db)
        graph = kernel_graph(lowered)
        executable = tvm.compile(lowered, target=target)
        if device is None:
            device = tvm.cuda(0) if is_gpu(target) else tvm.cpu(0)
        program = cls(lowered, graph, target, device, executable)
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
