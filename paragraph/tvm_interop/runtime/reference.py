"""The model's outputs computed apart from everything paragraph builds, to check a build against.

A program's own VM (`KernelProgram.vm`) runs the same lowered module and the same vendor and
C++ kernels as the executor, so comparing with it cannot catch a wrong kernel form or a wrong
dispatch. A `Reference` shares none of that: for an ONNX file, ONNX Runtime's session (where
``onnxruntime`` is installed); otherwise the numpy interpreter of the original graph
(`paragraph.interpret`), with the operators it does not model compiled by TVM's default
pipeline, one function per distinct call in one module. `compare` runs a program on several
seeded inputs and measures how far it is from the reference, each output relative to its own
scale (`paragraph.outputs.max_difference`). Where that is beyond the tolerance, it also measures
how far the reference itself is from the interpreter in float64 (`Comparison.rounding`): a deep
model with random weights can amplify float32 rounding past any fixed tolerance (Inception-v4:
ONNX Runtime's outputs 5.5e-4 from the float64 ones, paragraph's 7.6e-4), and a difference
within a few times the reference's own rounding is that, not a wrong kernel.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm import relax

from paragraph.graph import Graph, TensorRef, TensorType
from paragraph.inputs import index_ranges, sample_inputs
from paragraph.interpret import run_graph
from paragraph.ops import SPECS, compute
from paragraph.outputs import max_difference
from paragraph.tvm_interop.frontend.relax_graph import opaque_module
from paragraph.tvm_interop.runtime.vm import flatten_result

# seeded inputs a build is checked on: several, so that one lucky input cannot hide an error
CHECK_SEEDS = (0, 1, 2)
# a program is equal to the reference within this many times the reference's own float32
# rounding (its distance from the float64 interpreter), where that exceeds the tolerance: two
# float32 computations in different orders are each about that far from the exact values, and
# from each other up to about twice it
ROUNDING_FACTOR = 4.0


class Reference:
    """Outputs of the original model for given inputs, computed independently (module
    docstring); ``name`` says by what."""

    name = "reference"

    def outputs(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError


class GraphReference(Reference):
    """The numpy interpreter of ``graph``, its opaque operators run by TVM's default build."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        opaque = [n for n in graph.nodes if n.kind == "opaque"]
        self._vm: relax.VirtualMachine | None = None
        self._fn: dict[int, str] = {}
        if opaque:
            mod, self._fn = opaque_module(graph)
            self._vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
        kinds = len(set(self._fn.values()))
        self.name = ("the numpy interpreter" if not opaque else
                     f"the numpy interpreter with TVM's default kernels for {len(opaque)} "
                     f"opaque operator(s) ({kinds} distinct)")

    def outputs(self, inputs: Sequence[np.ndarray], wide: bool = False) -> list[np.ndarray]:
        """The outputs for ``inputs``; with ``wide``, every float32 tensor computed in float64
        (inputs, weights and the numpy references; an opaque operator still in TVM's float32,
        its result widened): the model's values with little rounding, to measure how much a
        float32 computation of it rounds."""
        if self._vm is None and not wide:
            return run_graph(self.graph, inputs)
        values: dict[TensorRef, np.ndarray] = {}
        feed = dict(zip(self.graph.inputs, inputs, strict=True))
        widen = _widened if wide else np.asarray
        for n in self.graph.nodes:
            if n.kind == "input":
                outs = [widen(feed[n.id])]
            elif n.kind in ("weight", "constant"):
                assert n.value is not None  # a validated graph's weights hold arrays
                outs = [widen(n.value)]
            elif n.kind in SPECS:
                attrs = ({k: "float64" if v == "float32" else v for k, v in n.attrs.items()}
                         if wide else n.attrs)
                outs = compute(n.kind, [values[r] for r in n.inputs], attrs)
            else:  # opaque: its own function of the compiled module
                assert self._vm is not None
                args = [tvm.runtime.tensor(_as_type(values[r], self.graph.type_of(r)))
                        for r in n.inputs]
                outs = [widen(o) for o in flatten_result(self._vm[self._fn[n.id]](*args))]
            for i, v in enumerate(outs):
                values[TensorRef(n.id, i)] = v
        return [values[r] for r in self.graph.outputs]


def _widened(value: np.ndarray) -> np.ndarray:
    """``value`` in float64 where it is float32, else as it is."""
    value = np.asarray(value)
    return value.astype(np.float64) if value.dtype == np.float32 else value


def _as_type(value: np.ndarray, t: TensorType) -> np.ndarray:
    """``value`` in the graph's declared shape and dtype (TVM checks both), C-contiguous."""
    # not np.ascontiguousarray: it makes a 0-d array 1-d
    return np.require(np.asarray(value).reshape(t.shape).astype(t.dtype, copy=False),
                      requirements="C")


class OnnxRuntimeReference(Reference):
    """ONNX Runtime's default CPU session over the ONNX file, inputs in the file's order."""

    name = "ONNX Runtime"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        import onnxruntime as ort  # optional (the onnx extra): only ONNX files use it

        options = ort.SessionOptions()
        options.log_severity_level = 3  # its warnings are about its own optimisations
        self.session = ort.InferenceSession(str(path), options,
                                            providers=["CPUExecutionProvider"])
        self.names = [i.name for i in self.session.get_inputs()]
        self.shapes = [i.shape for i in self.session.get_inputs()]

    def takes(self, shapes: Sequence[tuple[int, ...]]) -> bool:
        """Whether the file's inputs take these shapes (in order; a named dimension takes
        any size): not where the import changed them (``--batch``)."""
        return len(shapes) == len(self.shapes) and all(
            len(s) == len(mine) and all(not isinstance(m, int) or m == d
                                        for m, d in zip(mine, s, strict=True))
            for s, mine in zip(shapes, self.shapes, strict=True))

    def outputs(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [np.asarray(o) for o in self.session.run(
            None, dict(zip(self.names, inputs, strict=True)))]


def reference_for(model: Any, graph: Graph) -> Reference:
    """The reference for a model imported from ``model`` as ``graph``: ONNX Runtime where
    ``model`` is an ONNX file with as many inputs and ``onnxruntime`` is installed, else the
    interpreter of ``graph`` (`GraphReference`)."""
    if isinstance(model, str | os.PathLike) and Path(model).suffix.lower() == ".onnx":
        try:
            ort = OnnxRuntimeReference(model)
        except ImportError:
            ort = None
        except Exception:  # ONNX Runtime cannot run it (an op it lacks): the graph's own
            ort = None
        if ort is not None and ort.takes([graph[i].type.shape for i in graph.inputs]):
            return ort
    return GraphReference(graph)


@dataclass(frozen=True)
class Comparison:
    """How far a program's outputs were from the reference's (``difference``, the worst over
    ``seeds``, each output relative to its scale) and whether that is within ``tolerance``."""

    reference: str
    seeds: tuple[int, ...]
    difference: float
    tolerance: float
    # where the difference exceeds the tolerance: how far the reference's outputs are from
    # the float64 interpreter's (its own float32 rounding), which then widens the tolerance
    # to `ROUNDING_FACTOR` times it
    rounding: float | None = None

    @property
    def allowed(self) -> float:
        """The largest difference that is equal: the tolerance, or the model's rounding."""
        if self.rounding is None or not np.isfinite(self.rounding):
            return self.tolerance
        return max(self.tolerance, ROUNDING_FACTOR * self.rounding)

    @property
    def equal(self) -> bool:
        return self.difference <= self.allowed

    def describe(self) -> str:
        verdict = "equal" if self.equal else "DIFFERENT"
        within = "" if self.rounding is None else (
            f"; {self.reference} is {self.rounding:.2g} from the float64 interpreter, so up to "
            f"{self.allowed:.2g} is the model's float32 rounding")
        return (f"outputs against {self.reference} on {len(self.seeds)} seeded input(s): "
                f"max difference {self.difference:.3g} (tolerance {self.tolerance:.0e}"
                f"{within}): {verdict}")

    def to_json(self) -> dict[str, Any]:
        out = {"reference": self.reference, "seeds": list(self.seeds),
               "max_difference": self.difference if np.isfinite(self.difference) else None,
               "tolerance": self.tolerance, "equal": self.equal}
        if self.rounding is not None:
            out["reference_rounding"] = self.rounding if np.isfinite(self.rounding) else None
        return out


def compare(run: Callable[[Sequence[np.ndarray]], Sequence[np.ndarray]], graph: Graph,
            reference: Reference, tolerance: float,
            seeds: Sequence[int] = CHECK_SEEDS) -> Comparison:
    """Run ``run`` (a program's executor) and ``reference`` on seeded inputs of ``graph`` (the
    original model's: valid for what reads them), and compare (`Comparison`)."""
    types = [graph[i].type for i in graph.inputs]
    ranges = index_ranges(graph) if any(np.dtype(t.dtype).kind in "iu" for t in types) else {}
    worst = 0.0
    checked: list[tuple[list[np.ndarray], list[np.ndarray]]] = []
    for seed in seeds:
        inputs = sample_inputs(types, ranges, seed)
        expected = reference.outputs(inputs)
        got = [np.asarray(o) for o in run(inputs)]
        worst = max(worst, max_difference(expected, got))
        checked.append((inputs, expected))
    # beyond the tolerance but finite: how much a float32 computation of this model rounds
    rounding = (reference_rounding(reference, graph, checked)
                if tolerance < worst < float("inf") else None)
    return Comparison(reference.name, tuple(seeds), worst, tolerance, rounding)


def reference_rounding(reference: Reference, graph: Graph,
                       checked: Sequence[tuple[Sequence[np.ndarray], Sequence[np.ndarray]]]
                       ) -> float | None:
    """How far ``reference``'s outputs (``checked``: each input list with the reference's
    outputs for it) are from the float64 interpreter's of ``graph``, the worst over them
    (`max_difference`); None where no output is float32."""
    if not any(np.asarray(e).dtype == np.float32 for _, exp in checked for e in exp):
        return None
    wide = reference if isinstance(reference, GraphReference) else GraphReference(graph)
    return max(max_difference(wide.outputs(inputs, wide=True), expected)
               for inputs, expected in checked)


__all__ = ["CHECK_SEEDS", "ROUNDING_FACTOR", "Comparison", "GraphReference",
           "OnnxRuntimeReference", "Reference", "compare", "reference_for",
           "reference_rounding"]
