"""ONNX to ONNX before TVM's frontend: the shape computations of a static model folded away.

The TorchScript exporter writes every size a model reads from a tensor (``x.shape``,
``x.chunk``, ``F.pad`` amounts, view shapes) as ``Shape -> Gather -> Add/Div/... -> Concat``
chains evaluated at run time, and constants built from them (``ConstantOfShape``, ``Range``,
``ScatterND`` masks) too. TVM's ONNX frontend tracks a ``Shape`` of a static tensor as a
``ShapeExpr`` through a few operators only; past them (an ``Add``, a ``Div``, a ``Slice`` end,
a ``Cast``) the size becomes a tensor computed at run time, and what reads it gets a dynamic
shape: ShuffleNetV2's channel split (``chunk``: ``Slice`` ends from ``Shape``/``Div``) makes
convolutions of unknown shape that TVM cannot legalise (``emit_te now only supports Tensor
that has ShapeExpr shape``), and Swin's window padding (``Pad`` amounts, then ``Reshape`` to
sizes from ``Shape`` of the padded tensor) fails inside the frontend (``Reshape expects the input
tensor to have known shape``).

With every input shape static, all of these are constants. `fold_shape_computations` makes
them so, in place, in one pass in graph order: a ``Shape`` (or ``Size``) of a tensor of static
shape becomes a ``Constant``, every node whose inputs are all constant is evaluated with ONNX's
reference implementation and becomes a ``Constant`` too, and the type of every other node's
outputs comes from ONNX's shape inference of that node, told the values of its constant inputs
(so a ``Slice`` with folded ends, or a ``Reshape`` to a folded shape, has a static shape, and a
``Shape`` of it folds in turn). A ``Pad`` by folded zeros (Swin's windows) becomes an
``Identity``. Nodes left without readers are removed.

onnx is imported only when a model is folded: this module imports without it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["fold_shape_computations"]

# Elements beyond which a constant is neither evaluated from nor folded into: weights, and
# constants too large to be worth a copy. Shape arithmetic has a handful of elements, Swin's
# attention masks (windows x 49 x 49) about 10^5.
MAX_INPUT_ELEMENTS = 1 << 20
MAX_OUTPUT_ELEMENTS = 1 << 22
# Never folded: random values, quantisation (kept for what reads its pattern), and
# Identity (an alias of a weight; folding would copy it).
_NEVER_FOLD = frozenset({
    "Identity", "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
    "Bernoulli", "Multinomial", "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear",
    "If", "Loop", "Scan", "Constant",
})


def fold_shape_computations(model: Any, shape_dict: Mapping[str, Sequence[int]]) -> int:
    """Fold ``model``'s shape computations into constants, in place; returns how many nodes
    were folded (0: the model is untouched).

    ``shape_dict`` gives the shapes of inputs with dynamic dimensions (the frontend's
    ``shape_dict``); they are written into the graph's inputs first. Folding stops short of
    anything it cannot evaluate (an operator of another domain, one the reference implementation
    lacks, a tensor of unknown shape): those nodes stay for TVM as they were.
    """
    import onnx  # optional dependency (the onnx extra): only ONNX models come here

    graph = model.graph
    _fix_input_shapes(graph, shape_dict)
    folder = _Folder(onnx, model)
    nodes = [done for node in graph.node for done in folder.visit(node)]
    if not folder.folded:
        return 0
    live = _live_nodes(nodes, [o.name for o in graph.output])
    del graph.node[:]
    graph.node.extend(live)
    return folder.folded


class _Folder:
    """One pass over the nodes in graph order, tracking each tensor's type (ONNX's shape
    inference node by node, told the constant inputs) and the value of each constant."""

    def __init__(self, onnx: Any, model: Any) -> None:
        self.onnx = onnx
        self.opset = _default_opset(model)
        self.opset_imports = list(model.opset_import)
        self.ir_version = model.ir_version
        graph = model.graph
        self.initializers = {t.name: t for t in graph.initializer}
        self.types: dict[str, Any] = {i.name: i.type for i in graph.input}
        for t in graph.initializer:
            self.types[t.name] = onnx.helper.make_tensor_type_proto(t.data_type, list(t.dims))
        self.consts: dict[str, np.ndarray] = {}
        self.protos: dict[str, Any] = {}  # constants as TensorProtos, for shape inference
        self.folded = 0

    def visit(self, node: Any) -> list[Any]:
        """``[node]``, or the Constant nodes of its values where it folds."""
        if node.domain not in ("", "ai.onnx"):
            return [node]  # its outputs' types stay unknown
        if node.op_type == "Constant":
            value = _constant_node_value(self.onnx, node)
            if value is not None:
                self.record(node.output[0], value)
            else:
                self.infer(node)
            return [node]
        if self.pads_nothing(node):
            identity = self.onnx.helper.make_node("Identity", [node.input[0]], [node.output[0]],
                                                  name=f"{node.name or 'Pad'}_folded")
            self.folded += 1
            self.infer(identity)
            return [identity]
        values = self.shape_of(node)
        if values is None and node.op_type not in _NEVER_FOLD and node.input \
                and not any(a.type in (self.onnx.AttributeProto.GRAPH,
                                       self.onnx.AttributeProto.GRAPHS)
                            for a in node.attribute):
            inputs = [self.const_input(name) if name else None for name in node.input]
            if all(v is not None for v, name in zip(inputs, node.input, strict=True) if name):
                # the declared sizes first: a ConstantOfShape of 10^12 elements is not made
                # (past the machine's memory the OOM killer, not an error, would end it)
                self.infer(node)
                if not self.too_large(node):
                    values = _evaluate(self.onnx, node, inputs, self.opset)
        if values is None:
            self.infer(node)
            return [node]
        self.folded += 1
        constants = []
        for k, (name, value) in enumerate(zip(node.output, values, strict=True)):
            if name:
                self.record(name, value)
                constants.append(self.onnx.helper.make_node(
                    "Constant", [], [name], name=f"{node.name or node.op_type}_folded{k}",
                    value=self.onnx.numpy_helper.from_array(value, name)))
        return constants

    def record(self, name: str, value: np.ndarray) -> None:
        self.consts[name] = value
        elem = self.onnx.helper.np_dtype_to_tensor_dtype(value.dtype)
        self.types[name] = self.onnx.helper.make_tensor_type_proto(elem, list(value.shape))

    def infer(self, node: Any) -> None:
        """The types of ``node``'s outputs by ONNX's shape inference (unknown where it fails)."""
        onnx = self.onnx
        known = {name: self.types[name] for name in node.input if name in self.types}
        if len(known) < len([n for n in node.input if n]):
            return
        data = {}
        for name in node.input:
            if name and name not in self.protos and self.const_input(name) is not None:
                self.protos[name] = onnx.numpy_helper.from_array(self.consts[name], name)
            if name in self.protos:
                data[name] = self.protos[name]
        try:
            schema = onnx.defs.get_schema(node.op_type, self.opset, node.domain)
            types = onnx.shape_inference.infer_node_outputs(
                schema, node, known, data, opset_imports=self.opset_imports,
                ir_version=self.ir_version)
        except Exception:  # noqa: BLE001  no schema, or inference fails: types unknown
            return
        self.types.update(types)

    def too_large(self, node: Any) -> bool:
        """Whether shape inference gave an output of ``node`` more elements than a folded
        constant may have."""
        for name in node.output:
            dims = _dims(self.types.get(name))
            if dims is not None and all(d is not None for d in dims) \
                    and _elements([int(d) for d in dims if d is not None]) > MAX_OUTPUT_ELEMENTS:
                return True
        return False

    def pads_nothing(self, node: Any) -> bool:
        """Whether ``node`` is a ``Pad`` by amounts that are all zero: Swin pads its windows by
        sizes computed from the input's (zero at 224 x 224), and TVM's converter makes even a
        zero ``Pad`` a kernel of its own."""
        if node.op_type != "Pad":
            return False
        attrs = {a.name: list(a.ints) for a in node.attribute if a.name == "pads"}
        pads = np.array(attrs["pads"]) if "pads" in attrs else (
            self.const_input(node.input[1]) if len(node.input) > 1 and node.input[1] else None)
        return pads is not None and pads.size > 0 and not pads.any()

    def shape_of(self, node: Any) -> list[np.ndarray] | None:
        """The value of a ``Shape`` or ``Size`` node whose input has a static shape."""
        if node.op_type not in ("Shape", "Size"):
            return None
        dims = _dims(self.types.get(node.input[0]))
        if dims is None or any(d is None for d in dims):
            return None
        static = [int(d) for d in dims if d is not None]
        if node.op_type == "Size":
            return [np.array(int(np.prod(static, dtype=np.int64)), dtype=np.int64)]
        attrs = {a.name: a.i for a in node.attribute}
        rank = len(static)
        start, end = attrs.get("start", 0), attrs.get("end", rank)
        start = min(max(start + rank if start < 0 else start, 0), rank)
        end = min(max(end + rank if end < 0 else end, 0), rank)
        return [np.array(static[start:end], dtype=np.int64)]

    def const_input(self, name: str) -> np.ndarray | None:
        """The value of input ``name`` if it is a constant small enough to evaluate from."""
        if name in self.consts:
            value = self.consts[name]
        elif name in self.initializers:
            tensor = self.initializers[name]
            if _elements(tensor.dims) > MAX_INPUT_ELEMENTS or tensor.data_location != 0:
                return None
            value = self.consts[name] = self.onnx.numpy_helper.to_array(tensor)
        else:
            return None
        return value if value.size <= MAX_INPUT_ELEMENTS else None


def _evaluate(onnx: Any, node: Any, inputs: list[np.ndarray | None],
              opset: int) -> list[np.ndarray] | None:
    """The outputs of ``node`` on constant ``inputs`` (ONNX's reference implementation), or
    None where it cannot say or the result is not worth a constant."""
    from onnx.reference import ReferenceEvaluator  # optional dependency (the onnx extra)

    feeds = {name: value for name, value in zip(node.input, inputs, strict=True) if name}
    try:
        results = ReferenceEvaluator(node, opsets={"": opset}).run(None, feeds)
    except Exception:  # noqa: BLE001  an op the reference lacks, or fails on: TVM gets the node
        return None
    values = [np.asarray(r) for r in results]
    if len(values) != len(node.output) or any(
            v.dtype.kind not in "biuf" or v.size > MAX_OUTPUT_ELEMENTS for v in values):
        return None
    return values


def _dims(type_proto: Any) -> list[int | None] | None:
    """A tensor type's dims (None for an unknown one), or None for an unknown shape."""
    if type_proto is None or not type_proto.HasField("tensor_type"):
        return None
    tensor_type = type_proto.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    return [int(d.dim_value) if d.HasField("dim_value") else None for d in tensor_type.shape.dim]


def _fix_input_shapes(graph: Any, shape_dict: Mapping[str, Sequence[int]]) -> None:
    for info in graph.input:
        if info.name not in shape_dict:
            continue
        shape = info.type.tensor_type.shape
        del shape.dim[:]
        for size in shape_dict[info.name]:
            shape.dim.add().dim_value = int(size)


# ---------------------------------------------------------------------------- helpers
def _constant_node_value(onnx: Any, node: Any) -> np.ndarray | None:
    for a in node.attribute:
        if a.name == "value":
            if a.t.data_location != 0:
                return None
            value = onnx.numpy_helper.to_array(a.t)
            return value if value.dtype.kind in "biuf" else None
        if a.name == "value_float":
            return np.array(a.f, dtype=np.float32)
        if a.name == "value_floats":
            return np.array(list(a.floats), dtype=np.float32)
        if a.name == "value_int":
            return np.array(a.i, dtype=np.int64)
        if a.name == "value_ints":
            return np.array(list(a.ints), dtype=np.int64)
    return None  # a sparse or string constant


def _default_opset(model: Any) -> int:
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    return 1


def _elements(dims: Sequence[int]) -> int:
    return int(np.prod([int(d) for d in dims], dtype=np.int64))


def _live_nodes(nodes: list[Any], outputs: list[str]) -> list[Any]:
    """``nodes`` less those whose results nothing reads (in order)."""
    needed = set(outputs)
    live = []
    for node in reversed(nodes):
        if any(name in needed for name in node.output):
            live.append(node)
            needed.update(_reads(node))
    return live[::-1]


def _reads(node: Any) -> set[str]:
    """The names ``node`` reads: its inputs, and those its subgraphs (an If's branches) read
    from the enclosing graph."""
    names = {name for name in node.input if name}
    for a in node.attribute:
        for sub in [a.g] if a.HasField("g") else list(a.graphs):
            for inner in sub.node:
                names |= _reads(inner)
    return names
