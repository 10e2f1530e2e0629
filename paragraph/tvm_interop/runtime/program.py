"""A `KernelProgram`: a model's kernels compiled once for one device, with the kernel graph that
says how they connect. It is the value the executors run, the planner schedules and an
artifact stores; `paragraph.tvm_interop.build.program` builds it (lowering, kernel source,
compilation, linking) and nothing changes it afterwards. A program read from an artifact by
TVM's runtime alone (`paragraph.tvm_interop.runtime.artifact`) runs the same, its TVM VM too;
only what needs the compiler (its lowered module, its target) is refused, with the reason."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import tvm
import tvm.runtime.vm

from paragraph.errors import ParagraphError
from paragraph.graph import Graph, Node
from paragraph.inputs import IndexRange

if TYPE_CHECKING:
    from tvm import relax

T = TypeVar("T")


class Once(Generic[T]):
    """A value made on first use and kept, once across threads: what a program only sometimes
    needs (the TVM VM's executable, the model's operator graph) costs nothing until asked."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make: Callable[[], T] | None = make
        self._value: T | None = None
        self._lock = threading.Lock()

    @classmethod
    def of(cls, value: T) -> Once[T]:
        """A value known already."""
        once = cls(lambda: value)
        once.get()
        return once

    @property
    def made(self) -> bool:
        """Whether the value exists yet."""
        return self._make is None

    def get(self) -> T:
        with self._lock:
            if self._make is not None:
                self._value, self._make = self._make(), None
        return self._value  # type: ignore[return-value]  # made above


class CompilerNeededError(ParagraphError):
    """What a program read by TVM's runtime alone cannot give: its lowered module and target
    need TVM's compiler, which `paragraph.load` leaves unloaded (`paragraph.lean`)."""


def compiler_needed(what: str) -> CompilerNeededError:
    """The error for ``what``, asked of a process whose TVM is its runtime alone."""
    return CompilerNeededError(
        f"{what} needs TVM's compiler, and this process loaded TVM's runtime alone "
        "(paragraph.load does that where TVM was not imported yet, to save about 400 MiB): "
        "import tvm before paragraph.load, or set PARAGRAPH_LEAN_LOAD=0")


def needs_compiler(what: str) -> Once[Any]:
    """A value that a program read by TVM's runtime alone does not have: asking raises
    `CompilerNeededError` naming ``what`` and how to get it."""
    def refuse() -> Any:
        raise compiler_needed(what)
    return Once(refuse)


@dataclass(frozen=True)
class KernelProgram:
    """A kernel graph and every kernel compiled once for one device, with the lowered module
    and target they came from."""

    graph: Graph
    device: tvm.runtime.Device
    functions: Mapping[str, Callable[..., object]]  # kernel function name -> compiled function
    lowered_module: Once[tvm.IRModule]  # `lowered`: a loaded program's is read on first use
    target_once: Once[tvm.target.Target]  # `target`
    # the TVM VM's executable of ``lowered`` (the VM baseline, an export, a GPU program's
    # kernels), compiled on first use: on a CPU the kernels come from a shared cache. A
    # program read by TVM's runtime alone has the artifact's library (a runtime module) here
    compiled: Once[relax.VMExecutable | tvm.runtime.Module]
    # the model's operator graph as prepared for lowering (batch norm decomposed, constants
    # folded), before any kernel source's dispatch: what the planner's rewrites start from;
    # None for a program loaded from a lowered module
    model: Once[Graph] | None = None
    operator_graph: Graph | None = None  # the operator graph the kernels were fused from
    kernel_operators: Mapping[int, tuple[int, ...]] | None = None  # kernel -> its operators
    kernel_source: str = "tvm"  # what the build was asked for: tvm, vendor or auto
    rewrites: tuple[str, ...] = ()  # library rules applied to the model (rule id: where)
    # input position -> the values it may hold (an embedding's ids), `paragraph.inputs`
    input_ranges: Mapping[int, IndexRange] = field(default_factory=dict)
    build_seconds: float = 0.0  # what the build took: lowering, dispatch and compilation
    # what the executable's ``main`` takes after the inputs: an artifact's weights (its
    # library holds none, `paragraph.tvm_interop.build.weights`); empty when built here
    vm_weights: tuple[tvm.runtime.Tensor, ...] = ()

    @property
    def lowered(self) -> tvm.IRModule:
        """The lowered module (fused ``main`` and its kernels) the program was built from."""
        return self.lowered_module.get()

    @property
    def target(self) -> tvm.target.Target:
        """The target the kernels were compiled for."""
        return self.target_once.get()

    @property
    def executable(self) -> relax.VMExecutable | tvm.runtime.Module:
        """The TVM VM's executable of ``lowered`` (every kernel in one module), compiled on
        first use."""
        return self.compiled.get()

    @property
    def kernels(self) -> list[Node]:
        """The kernel and view nodes, in topological order."""
        return [n for n in self.graph.nodes if not n.is_source]

    def function(self, node: Node) -> Callable[..., object]:
        """The compiled function of a kernel node (DPS: inputs, then outputs)."""
        return self.functions[node.attrs["func"]]

    def vm(self) -> tvm.runtime.vm.VirtualMachine:
        """The TVM VM over the same lowered module and compiled kernels (the baseline);
        ``vm["main"](*inputs)`` runs the model, with `vm_weights` passed after the inputs.
        (TVM's runtime runs it: Relax's VirtualMachine is this class.)"""
        if not self.vm_weights:
            return tvm.runtime.vm.VirtualMachine(self.executable, self.device)
        return _WeightedVM(self.executable, self.device, self.vm_weights)

    def sources(self) -> dict[str, int]:
        """How many kernels come from each source ("tvm", "vendor")."""
        counts: dict[str, int] = {}
        for n in self.graph.nodes:
            if n.kind == "kernel":
                counts[n.attrs["source"]] = counts.get(n.attrs["source"], 0) + 1
        return counts


class _WeightedVM(tvm.runtime.vm.VirtualMachine):
    """A VM whose executable's ``main`` takes the weights after the inputs: ``main`` is
    given them, so it is called with the inputs alone like any model's."""

    def __init__(self, executable: relax.VMExecutable | tvm.runtime.Module,
                 device: tvm.runtime.Device, weights: tuple[tvm.runtime.Tensor, ...]) -> None:
        super().__init__(executable, device)
        self._weights = weights

    def __getitem__(self, name: str) -> Callable[..., object]:
        f = super().__getitem__(name)
        if name != "main":
            return f
        return lambda *inputs: f(*inputs, *self._weights)
