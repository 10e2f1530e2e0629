"""Relax <-> `paragraph.graph`: ``from_relax(mod) -> Graph`` and ``to_relax(graph) -> IRModule``.

`main` must be one dataflow block over tensors of static shape. Each binding becomes a node:
the operators listed in ``MODELED`` become typed nodes with their attributes as plain Python
values (the names Relax uses), ``matmul(x, permute_dims(W))`` (+ bias) on weights becomes
``linear`` (what ``relax.op.linear`` emits), and any other call becomes an ``opaque`` node that
keeps the original operator, attributes and non-tensor arguments, so that
``to_relax(from_relax(m))`` computes exactly what ``m`` computes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.ir.expr import Constant as _ConstBase  # tensor constants and IntImm/FloatImm alike

from paragraph.errors import UnsupportedModelError
from paragraph.graph import Graph, GraphBuilder, Node, TensorRef, TensorType
from paragraph.inputs import index_ranges, sample_inputs

__all__ = ["from_relax", "to_relax", "opaque_module", "MODELED"]

# Relax op name -> (graph kind, attribute names read from call.attrs)
MODELED: dict[str, tuple[str, tuple[str, ...]]] = {
    "relax.nn.conv2d": ("conv2d", ("strides", "padding", "dilation", "groups", "data_layout",
                                   "kernel_layout", "out_layout", "out_dtype")),
    "relax.matmul": ("matmul", ("out_dtype",)),
    "relax.add": ("add", ()), "relax.subtract": ("subtract", ()),
    "relax.multiply": ("multiply", ()), "relax.divide": ("divide", ()),
    "relax.nn.relu": ("relu", ()), "relax.sigmoid": ("sigmoid", ()), "relax.tanh": ("tanh", ()),
    "relax.nn.gelu": ("gelu", ()), "relax.nn.silu": ("silu", ()), "relax.clip": ("clip", ()),
    "relax.nn.softmax": ("softmax", ("axis",)),
    "relax.nn.layer_norm": ("layer_norm", ("axes", "epsilon", "center", "scale")),
    "relax.nn.batch_norm": ("batch_norm", ("axis", "epsilon", "center", "scale", "momentum",
                                           "training")),
    "relax.nn.avg_pool2d": ("avg_pool2d", ("pool_size", "strides", "padding", "dilation",
                                           "ceil_mode", "count_include_pad", "layout",
                                           "out_layout")),
    "relax.nn.max_pool2d": ("max_pool2d", ("pool_size", "strides", "padding", "dilation",
                                           "ceil_mode", "count_include_pad", "layout",
                                           "out_layout")),
    "relax.nn.adaptive_avg_pool2d": ("adaptive_avg_pool2d", ("output_size", "layout",
                                                             "out_layout")),
    "relax.concat": ("concat", ("axis",)),
    "relax.split": ("split", ("indices_or_sections", "axis")),
    "relax.strided_slice": ("strided_slice", ("assume_inbound",)),
    "relax.reshape": ("reshape", ()),
    "relax.permute_dims": ("permute_dims", ("axes",)),
    "relax.nn.pad": ("enlarge", ("pad_width", "pad_mode", "pad_value")),
}

_NN = relax.op.nn
# graph kind -> builder of the Relax call from argument expressions and attributes
_BUILD: dict[str, Callable[..., relax.Expr]] = {
    "conv2d": lambda x, w, **a: _NN.conv2d(x, w, **a),
    "matmul": lambda a, b, out_dtype: relax.op.matmul(a, b, out_dtype=out_dtype),
    "linear": lambda x, w, b=None, out_dtype=None: relax.op.linear(x, w, b, out_dtype),
    "add": relax.op.add, "subtract": relax.op.subtract, "multiply": relax.op.multiply,
    "divide": relax.op.divide,
    "relu": _NN.relu, "sigmoid": relax.op.sigmoid, "tanh": relax.op.tanh, "gelu": _NN.gelu,
    "silu": _NN.silu,
    "clip": lambda x, min, max: relax.op.clip(x, min, max),  # noqa: A006 (Relax's names)
    "softmax": lambda x, axis: _NN.softmax(x, axis),
    "layer_norm": lambda x, g, b, **a: _NN.layer_norm(x, g, b, **a),
    "batch_norm": lambda x, g, b, m, v, **a: _NN.batch_norm(x, g, b, m, v, **a),
    "avg_pool2d": lambda x, **a: _NN.avg_pool2d(x, **a),
    "max_pool2d": lambda x, **a: _NN.max_pool2d(x, **a),
    "adaptive_avg_pool2d": lambda x, **a: _NN.adaptive_avg_pool2d(x, **a),
    "concat": lambda *xs, axis: relax.op.concat(list(xs), axis),
    "split": lambda x, indices_or_sections, axis: relax.op.split(x, indices_or_sections, axis),
    "strided_slice": lambda x, axes, begin, end, strides, assume_inbound: relax.op.strided_slice(
        x, list(axes), list(begin), list(end), None if strides is None else list(strides),
        assume_inbound),
    "reshape": lambda x, shape: relax.op.reshape(x, shape),
    "permute_dims": lambda x, axes: relax.op.permute_dims(x, None if axes is None else list(axes)),
    "enlarge": lambda w, kernel_size: _NN.pad(w, _enlarge_pads(w, kernel_size)),
}


def _enlarge_pads(w: relax.Expr, kernel_size: tuple[int, int]) -> list[int]:
    """nn.pad widths that grow an OIHW kernel to ``kernel_size``, centred (TASO's enlarge)."""
    kh, kw = w.ty.shape.values[2].value, w.ty.shape.values[3].value
    dh, dw = (kernel_size[0] - kh) // 2, (kernel_size[1] - kw) // 2
    return [0, 0, 0, 0, dh, dh, dw, dw]


class _NotModeled(Exception):
    """A modeled op whose arguments do not fit the model: keep it opaque instead."""


# ---------------------------------------------------------------------------- conversions
def _py(v: Any) -> Any:
    """A Relax attribute or literal as a plain, hashable Python value."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):
        return v.value
    if isinstance(v, relax.ShapeExpr):
        return tuple(_py(x) for x in v.values)
    if isinstance(v, relax.Tuple):
        return tuple(_py(x) for x in v.fields)
    if hasattr(v, "__len__") and hasattr(v, "__getitem__") and not isinstance(v, relax.Expr):
        return tuple(_py(x) for x in v)
    return str(v)


def _static_type(ty: Any, what: str) -> list[TensorType]:
    """The tensor types of a Relax type (a tuple gives several); dynamic shapes raise."""
    if isinstance(ty, relax.TupleType):
        return [t for f in ty.fields for t in _static_type(f, what)]
    if not isinstance(ty, relax.TensorType):
        raise UnsupportedModelError(f"{what} has type {ty}: paragraph models tensors only")
    if ty.shape is None or not isinstance(ty.shape, relax.ShapeExpr):
        raise UnsupportedModelError(f"{what} has an unknown shape ({ty}): "
                                    "paragraph needs static shapes")
    dims = []
    for d in ty.shape.values:
        if not isinstance(d, tvm.tirx.IntImm):
            raise UnsupportedModelError(
                f"{what} has the symbolic (dynamic) shape {ty.shape}: paragraph needs static "
                "shapes; bind the symbolic dimensions first (relax.transform.BindSymbolicVars)")
        dims.append(int(d.value))
    return [TensorType(tuple(dims), str(ty.dtype))]


def host_array(t: tvm.runtime.Tensor) -> np.ndarray:
    """A host tensor's bytes as a numpy array without a copy (DLPack), else a copy: a
    model's weights are then held once, by the module's constants, however many graphs and
    executors read them (a copy each held ResNet-50's 98 MB four times over)."""
    if t.device.dlpack_device_type() == tvm.cpu().dlpack_device_type():
        try:
            return np.from_dlpack(t)
        except (BufferError, TypeError, RuntimeError):  # a dtype numpy's DLPack lacks
            pass
    return t.numpy()


def _is_tensor_const(e: Any) -> bool:
    return isinstance(e, _ConstBase) and isinstance(e.ty, relax.TensorType) and hasattr(
        e.value, "numpy")


# ---------------------------------------------------------------------------- from_relax
class _Importer:
    def __init__(self, mod: tvm.IRModule, func_name: str) -> None:
        if func_name not in [gv.name_hint for gv in mod.functions]:
            raise UnsupportedModelError(f"the module has no function {func_name!r}")
        self.mod = mod
        self.func = mod[func_name]
        if not isinstance(self.func, relax.Function):
            raise UnsupportedModelError(f"{func_name!r} is a {type(self.func).__name__}, "
                                        "not a Relax function")
        self.b = GraphBuilder()
        self.env: dict[Any, Any] = {}  # Relax var -> TensorRef | list (tuple) | ("literal", e)
        self.consts: dict[Any, TensorRef] = {}

    def run(self) -> Graph:
        for p in self.func.params:
            (t,) = _static_type(p.ty, f"input {p.name!r}")
            self.env[p] = self.b.input(t.shape, t.dtype, name=p.name)
        body = self.func.body
        if not isinstance(body, relax.SeqExpr):
            raise UnsupportedModelError("main's body is not a sequence of binding blocks")
        blocks = [blk for blk in body.blocks if len(blk.bindings)]
        for blk in blocks:
            for binding in blk.bindings:
                if isinstance(binding.value, relax.If):
                    raise UnsupportedModelError(
                        f"control flow: {binding.var.name!r} is bound to an if/else; "
                        "paragraph supports straight-line dataflow graphs only")
        dataflow = [blk for blk in blocks if isinstance(blk, relax.DataflowBlock)]
        if len(dataflow) > 1:
            first = dataflow[1].bindings[0].var.name
            raise UnsupportedModelError(
                f"main has {len(dataflow)} dataflow blocks (the second starts at {first!r}); "
                "paragraph supports exactly one")
        for blk in blocks:
            if not isinstance(blk, relax.DataflowBlock):
                var = blk.bindings[0].var.name
                raise UnsupportedModelError(
                    f"binding {var!r} lies outside a dataflow block; paragraph supports one "
                    "dataflow block (try relax.transform.ConvertToDataflow())")
        for binding in (dataflow[0].bindings if dataflow else ()):
            self.bind(binding)
        outputs, structure = self.flatten_output(body.body)
        graph = self.b.build(outputs, meta={
            "output_structure": structure,
            "relax_attrs": self.func.attrs,
            "relax_module": self.mod,
            "relax_func_name": self.func_name_of(),
        })
        return _fuse_linear(graph)

    def func_name_of(self) -> str:
        return next(gv.name_hint for gv, f in self.mod.functions.items() if f.same_as(self.func))

    def flatten_output(self, expr: Any) -> tuple[list[TensorRef], Any]:
        value = self.value_of(expr, "main's result")
        if isinstance(value, TensorRef):
            return [value], None
        outputs: list[TensorRef] = []

        def walk(v):
            if isinstance(v, TensorRef):
                outputs.append(v)
                return len(outputs) - 1
            if isinstance(v, list):
                return tuple(walk(x) for x in v)
            raise UnsupportedModelError(f"main returns a non-tensor value {expr}")
        return outputs, walk(value)

    def value_of(self, expr: Any, where: str) -> Any:
        """The graph value of an argument expression (creating constant nodes)."""
        if isinstance(expr, relax.Var):
            if expr not in self.env:
                raise UnsupportedModelError(f"{where} reads {expr.name!r}, which is not bound")
            return self.env[expr]
        if _is_tensor_const(expr):
            if expr not in self.consts:
                arr = host_array(expr.value)
                kind = "weight" if arr.size > 1 else "constant"
                self.consts[expr] = self.b.weight(arr, kind=kind)
            return self.consts[expr]
        if isinstance(expr, relax.Tuple):
            return [self.value_of(f, where) for f in expr.fields]
        return ("literal", expr)

    def bind(self, binding: Any) -> None:
        var, name = binding.var, binding.var.name
        value = binding.value
        if isinstance(binding, relax.MatchCast):
            # a cast to a static tensor type only asserts what the shapes already say
            (t,) = _static_type(binding.ty, f"match_cast binding {name!r}")
            source = self.value_of(value, f"match_cast binding {name!r}")
            if not isinstance(source, TensorRef) or self.b.type_of(source) != t:
                raise UnsupportedModelError(f"match_cast binding {name!r} changes the type")
            self.env[var] = source
            return
        if isinstance(value, (relax.SeqExpr, relax.Function)):
            raise UnsupportedModelError(f"{name!r} is bound to a nested {type(value).__name__}")
        if isinstance(value, relax.Call):
            types = _static_type(var.ty, f"variable {name!r}")
            node = self.call(value, name, types)
            self.env[var] = (node.out if isinstance(var.ty, relax.TensorType)
                             else [TensorRef(node.id, i) for i in range(len(types))])
            return
        if isinstance(value, relax.TupleGetItem):
            tup = self.value_of(value.tuple_value, f"variable {name!r}")
            if not isinstance(tup, list):
                raise UnsupportedModelError(f"{name!r} indexes a non-tuple")
            self.env[var] = tup[value.index]
            return
        if isinstance(value, relax.Var) or _is_tensor_const(value) or isinstance(value,
                                                                                 relax.Tuple):
            self.env[var] = self.value_of(value, f"variable {name!r}")
            if isinstance(self.env[var], TensorRef):
                _static_type(var.ty, f"variable {name!r}")
            return
        if isinstance(value, (relax.ShapeExpr, _ConstBase, relax.GlobalVar, relax.ExternFunc)):
            self.env[var] = ("literal", value)
            return
        raise UnsupportedModelError(f"{name!r} is bound to an unsupported "
                                    f"{type(value).__name__}: {value}")

    def call(self, call: Any, name: str, types: list[TensorType]) -> Node:
        op_name = call.op.name if isinstance(call.op, tvm.ir.Op) else None
        if op_name in MODELED:
            try:
                kind, inputs, attrs = self.modeled(call, op_name)
                return self.b.op(kind, inputs, attrs, outputs=types, name=name)
            except _NotModeled:
                pass
        return self.opaque(call, name, types)

    def tensor_arg(self, expr: Any) -> TensorRef:
        v = self.value_of(expr, "an operator")
        if not isinstance(v, TensorRef):
            raise _NotModeled
        return v

    def modeled(self, call: Any, op_name: str) -> tuple[str, list[TensorRef], dict[str, Any]]:
        kind, names = MODELED[op_name]
        attrs = {k: _py(getattr(call.attrs, k)) for k in names}
        args = list(call.args)
        if kind == "concat":
            if attrs["axis"] is None or not isinstance(args[0], (relax.Tuple, relax.Var)):
                raise _NotModeled
            parts = self.value_of(args[0], "concat")
            if not isinstance(parts, list) or not all(isinstance(p, TensorRef) for p in parts):
                raise _NotModeled
            return kind, parts, attrs
        if kind == "strided_slice":
            fields = [_py(a) for a in args[1:]]
            if not all(isinstance(f, tuple) and all(isinstance(i, int) for i in f)
                       for f in fields):
                raise _NotModeled
            # strides are optional
            attrs.update(zip(("axes", "begin", "end", "strides"), fields, strict=False))
            attrs.setdefault("strides", None)
            return kind, [self.tensor_arg(args[0])], attrs
        if kind == "enlarge":  # only the centred zero padding of a kernel's window
            width = attrs["pad_width"]
            if (attrs["pad_mode"] != "constant" or float(attrs["pad_value"]) != 0.0
                    or len(width) != 8 or any(width[:4]) or width[4] != width[5]
                    or width[6] != width[7] or min(width) < 0):
                raise _NotModeled
            x = self.tensor_arg(args[0])
            _, _, kh, kw = self.b.type_of(x).shape
            return kind, [x], {"kernel_size": (kh + 2 * width[4], kw + 2 * width[6])}
        if kind == "clip":  # bounds are PrimValue arguments: numbers only
            bounds = [_py(a) for a in args[1:]]
            if len(bounds) != 2 or not all(isinstance(v, (int, float)) for v in bounds):
                raise _NotModeled
            return kind, [self.tensor_arg(args[0])], {"min": float(bounds[0]),
                                                      "max": float(bounds[1])}
        if kind == "reshape":
            shape = _py(args[1]) if isinstance(args[1], relax.ShapeExpr) else None
            if shape is None or not all(isinstance(d, int) for d in shape):
                raise _NotModeled
            return kind, [self.tensor_arg(args[0])], {"shape": shape}
        if kind in ("conv2d", "avg_pool2d", "max_pool2d", "adaptive_avg_pool2d"):
            layouts = [v for k, v in attrs.items() if k.endswith("layout")]
            if any(v not in ("NCHW", "OIHW") for v in layouts):
                raise _NotModeled
        return kind, [self.tensor_arg(a) for a in args], attrs

    def opaque(self, call: Any, name: str, types: list[TensorType]) -> Node:
        inputs: list[TensorRef] = []
        described: list[str] = []

        def template(expr: Any) -> Any:
            v = self.value_of(expr, f"variable {name!r}")
            return to_template(v)

        def to_template(v: Any) -> Any:
            if isinstance(v, TensorRef):
                inputs.append(v)
                return ("in", len(inputs) - 1)
            if isinstance(v, list):
                return ("tuple", [to_template(x) for x in v])
            lit = v[1]
            if isinstance(lit, relax.GlobalVar) and lit in self.mod.functions:
                text = f"{lit.name_hint}#{tvm_ffi.structural_hash(self.mod[lit])}"
            else:
                text = str(lit)
            described.append(text)
            return ("keep", lit)

        args = [template(a) for a in call.args]
        op = call.op
        if isinstance(op, tvm.ir.Op):
            op_text = op.name
        elif isinstance(op, relax.GlobalVar) and op in self.mod.functions:
            op_text = f"{op.name_hint}#{tvm_ffi.structural_hash(self.mod[op])}"
        else:
            op_text = str(op)
        attrs = {"op": op_text,
                 "attrs": "" if call.attrs is None else str(call.attrs),
                 "literals": tuple(described),
                 "ty_args": tuple(str(s) for s in call.ty_args)}
        payload = {"op": op, "args": args, "attrs": call.attrs, "ty_args": call.ty_args}
        return self.b.op("opaque", inputs, attrs, outputs=types, name=name, payload=payload)


def _fuse_linear(graph: Graph) -> Graph:
    """``matmul(x, permute_dims(W))`` (+ 1-D bias weight) on weights -> one ``linear`` node."""
    removed: list[int] = []
    added: list[Node] = []
    remap: dict[TensorRef, TensorRef] = {}
    outputs = set(graph.outputs)
    for n in graph.nodes:
        if n.kind != "matmul":
            continue
        perm = graph[n.inputs[1].node]
        if (perm.kind != "permute_dims" or perm.attrs["axes"] not in (None, (1, 0))
                or graph.users(perm.id) != [n.id] or perm.out in outputs):
            continue
        w = graph[perm.inputs[0].node]
        if w.kind != "weight" or len(w.type.shape) != 2:
            continue
        fused_ids, inputs, last = [perm.id, n.id], [n.inputs[0], w.out], n
        users = graph.users(n.id)
        if len(users) == 1 and n.out not in outputs:
            add = graph[users[0]]
            bias = add.inputs[1] if add.kind == "add" and add.inputs[0] == n.out else None
            if (bias is not None and bias != n.out and graph[bias.node].is_source
                    and graph[bias.node].kind != "input"
                    and len(graph.type_of(bias).shape) == 1):
                fused_ids.append(add.id)
                inputs.append(bias)
                last = add
        fused = Node(id=graph.next_id + len(added), kind="linear", inputs=tuple(inputs),
                     outputs=last.outputs, attrs={"out_dtype": n.attrs["out_dtype"]},
                     name=last.name)
        removed += fused_ids
        added.append(fused)
        remap[last.out] = fused.out
    return graph.replace_subgraph(removed, added, remap) if added else graph


def from_relax(mod: tvm.IRModule, func_name: str = "main") -> Graph:
    """Convert ``mod[func_name]`` into a `Graph`.

    Raises `UnsupportedModelError` naming the variable or construct for symbolic shapes,
    control flow, bindings outside the (single) dataflow block, or non-tensor values.
    """
    return _Importer(mod, func_name).run()


# ---------------------------------------------------------------------------- to_relax
def _relax_type(t: TensorType) -> relax.TensorType:
    return relax.TensorType(t.shape, t.dtype)


def to_relax(graph: Graph, func_name: str | None = None, *,
             constants: dict | None = None) -> tvm.IRModule:
    """Build a Relax module whose ``main`` (or ``func_name``) computes ``graph``.

    Other functions of the module the graph came from (those its opaque calls may reference)
    are carried over unchanged. ``constants``, when given, is filled with the Relax constant
    made for each weight or constant node (id -> expression), to trace them through passes.
    """
    func_name = func_name or graph.meta.get("relax_func_name", "main")
    bb = relax.BlockBuilder()
    params = [relax.Var(graph[i].name or f"input{k}", _relax_type(graph[i].type))
              for k, i in enumerate(graph.inputs)]
    exprs: dict[int, Any] = dict(zip(graph.inputs, params, strict=True))
    items: dict[TensorRef, Any] = {}

    def expr_of(r: TensorRef) -> Any:
        node = graph[r.node]
        if len(node.outputs) == 1:
            return exprs[r.node]
        if r not in items:
            items[r] = bb.emit(relax.TupleGetItem(exprs[r.node], r.index),
                               name_hint=node.name and f"{node.name}_{r.index}")
        return items[r]

    attrs = graph.meta.get("relax_attrs")
    with bb.function(func_name, params, attrs=dict(attrs) if attrs else None):
        with bb.dataflow():
            structure = graph.meta.get("output_structure", None if len(graph.outputs) == 1
                                       else tuple(range(len(graph.outputs))))
            # a single-tensor result made by the last op is emitted as the block's output,
            # as frontends and BlockBuilder code do, so the round trip is structurally exact
            last = graph.nodes[-1]
            direct = (structure is None and graph.outputs[0] == last.out
                      and len(last.outputs) == 1 and not last.is_source)
            for n in graph.nodes:
                emit = bb.emit_output if direct and n is last else bb.emit
                if n.kind in ("weight", "constant"):
                    assert n.value is not None  # a validated graph's weights hold arrays
                    exprs[n.id] = relax.const(n.value, str(n.value.dtype))
                    if constants is not None:
                        constants[n.id] = exprs[n.id]
                elif n.kind == "opaque":
                    exprs[n.id] = emit(_rebuild_opaque(n, expr_of), name_hint=n.name)
                elif n.kind != "input":
                    args = [expr_of(r) for r in n.inputs]
                    exprs[n.id] = emit(_BUILD[n.kind](*args, **n.attrs), name_hint=n.name)
            if direct:
                gv = exprs[last.id]
            else:
                outs = [expr_of(r) for r in graph.outputs]
                gv = bb.emit_output(outs[0] if structure is None
                                    else _restructure(structure, outs))
        bb.emit_func_output(gv)
    mod = bb.get()
    source = graph.meta.get("relax_module")
    if source is not None:
        for gvar, func in source.functions.items():
            if gvar.name_hint != func_name:
                mod[gvar] = func
    return mod


def _restructure(structure: Any, outs: list[Any]) -> Any:
    if isinstance(structure, int):
        return outs[structure]
    return relax.Tuple([_restructure(s, outs) for s in structure])


def _rebuild_opaque(n: Node, expr_of: Callable[[TensorRef], Any]) -> Any:
    p = n.payload
    if p is None:
        raise UnsupportedModelError(f"{n!r} has no Relax call to rebuild")

    def build(t: Any) -> Any:
        tag, v = t
        if tag == "in":
            return expr_of(n.inputs[v])
        if tag == "tuple":
            return relax.Tuple([build(x) for x in v])
        return v
    return relax.Call(p["op"], [build(a) for a in p["args"]], p["attrs"], p["ty_args"])


def opaque_module(graph: Graph) -> tuple[tvm.IRModule, dict[int, str]]:
    """A Relax module with one function per distinct opaque call of ``graph`` (its inputs as
    parameters, its result as the function's), and which function computes each opaque node:
    what the numpy interpreter cannot run, to be compiled once for a reference run. Functions
    of the module the graph came from are carried over, as `to_relax` does."""
    bb = relax.BlockBuilder()
    name_of: dict[int, str] = {}
    made: dict[int, list[tuple[Any, str]]] = {}  # structural hash -> (function, name)
    for n in graph.nodes:
        if n.kind != "opaque":
            continue
        params = [relax.Var(f"x{i}", _relax_type(graph.type_of(r)))
                  for i, r in enumerate(n.inputs)]
        var_of = dict(zip(reversed(n.inputs), reversed(params), strict=True))
        call = _rebuild_opaque(n, var_of.__getitem__)
        # for comparing calls (a function binds the parameters); built below if new
        func = relax.Function(params, relax.BlockBuilder().normalize(call))
        same = made.setdefault(tvm_ffi.structural_hash(func, map_free_vars=True), [])
        name = next((f for g, f in same
                     if tvm_ffi.structural_equal(g, func, map_free_vars=True)), None)
        if name is None:
            name = f"opaque{sum(map(len, made.values()))}"
            same.append((func, name))
            with bb.function(name, params):
                with bb.dataflow():
                    out = bb.emit_output(call)
                bb.emit_func_output(out)
        name_of[n.id] = name
    mod = bb.get()
    names = set(name_of.values())
    source = graph.meta.get("relax_module")
    if source is not None:
        for gvar, func in source.functions.items():
            if gvar.name_hint not in names and gvar.name_hint != "main":
                mod[gvar] = func
    return mod, name_of


def random_inputs(mod: tvm.IRModule, seed: int = 0, func_name: str = "main") -> list[np.ndarray]:
    """Seeded random arrays for every parameter of ``mod[func_name]`` (static shapes), valid
    for what reads them (`paragraph.inputs.sample_inputs`: an embedding's ids within its
    table)."""
    types = [_static_type(p.ty, f"input {p.name!r}")[0] for p in mod[func_name].params]
    ranges = {}
    if any(np.dtype(t.dtype).kind in "iu" for t in types):  # only then the graph is needed
        ranges = index_ranges(from_relax(mod, func_name))
    return sample_inputs(types, ranges, seed)
