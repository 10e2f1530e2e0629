"""The fuzzer's second reference: a recipe (`fuzz_graphs`) written as an ONNX model, with the same
weights, and run by ONNX Runtime. Every step has an ONNX form but an adaptive pool to anything
but 1 x 1 and a pool with ``ceil_mode`` (`to_onnx` returns None for such a graph). ONNX
Runtime checks the numpy reference itself: a disagreement between the two is a finding about
the references (or about ONNX Runtime), before any of paragraph's outputs are compared with them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import fuzz_graphs
import numpy as np

from paragraph.ops import split_bounds

OPSET = 20  # Gelu (with its tanh form) and ReduceMax with axes as an input


def to_onnx(recipe: fuzz_graphs.Recipe) -> Any | None:
    """The recipe as an ONNX ``ModelProto``; None where a step has no ONNX form here."""
    import onnx  # optional (the onnx extra)
    from onnx import TensorProto, helper, numpy_helper

    nodes: list[Any] = []
    inits: list[Any] = []
    names = [f"x{k}" for k in range(len(recipe["inputs"]))]
    shapes = [list(s["shape"]) for s in recipe["inputs"]]
    counter = [0]

    def const(value: Any, dtype: str = "float32") -> str:
        counter[0] += 1
        name = f"c{counter[0]}"
        inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def node(op: str, inputs: Sequence[str], **attrs: Any) -> str:
        counter[0] += 1
        out = f"t{counter[0]}"
        nodes.append(helper.make_node(op, list(inputs), [out], **attrs))
        return out

    for i, step in enumerate(recipe["steps"]):
        args = [names[a] for a in step["args"]]
        w = fuzz_graphs.weights(recipe, i, shapes[step["args"][0]])
        out = _step(step, args, w, shapes[step["args"][0]], const, node)
        if out is None:
            return None
        names.append(out)
        shapes.append(list(step["shape"]))
    dtype = {"float32": TensorProto.FLOAT, "int64": TensorProto.INT64}
    graph = helper.make_graph(
        nodes, "fuzz",
        [helper.make_tensor_value_info(f"x{k}", dtype[s["dtype"]], s["shape"])
         for k, s in enumerate(recipe["inputs"])],
        [helper.make_tensor_value_info(names[o], TensorProto.FLOAT, shapes[o])
         for o in recipe["outputs"]], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def _step(step: dict[str, Any], args: list[str], w: dict[str, np.ndarray], shape: list[int],
          const: Any, node: Any) -> str | None:
    op, a = step["op"], step["attrs"]
    x = args[0]
    if op == "embedding":
        return str(node("Gather", [const(w["table"]), x], axis=0))
    if op == "gather":
        return str(node("Gather", [x, const(w["indices"], "int64")], axis=a["axis"]))
    if op == "conv2d":
        y = node("Conv", [x, const(w["w"])], strides=a["strides"], pads=a["padding"],
                 dilations=a["dilation"], group=a["groups"],
                 kernel_shape=a["kernel"])
        return str(node("Add", [y, const(w["b"])])) if a["bias"] else str(y)
    if op == "matmul":
        return str(node("MatMul", [x, args[1] if len(args) == 2 else const(w["w"])]))
    if op == "linear":
        y = node("MatMul", [x, const(w["w"].T)])
        return str(node("Add", [y, const(w["b"])])) if a["bias"] else str(y)
    if op == "binary":
        onnx_op = {"add": "Add", "subtract": "Sub", "multiply": "Mul", "divide": "Div"}[a["fn"]]
        if len(args) == 2:
            return str(node(onnx_op, args))
        c = const(w["c"])
        return str(node(onnx_op, [c, x] if a.get("const_first") else [x, c]))
    if op == "unary":
        return _unary(a, x, const, node)
    if op == "softmax":
        return str(node("Softmax", [x], axis=a["axis"]))
    if op == "layer_norm":
        return str(node("LayerNormalization", [x, const(w["gamma"]), const(w["beta"])],
                        axis=min(a["axes"]), epsilon=a["epsilon"]))
    if op == "batch_norm":
        return str(node("BatchNormalization", [x, *(const(w[k]) for k in (
            "gamma", "beta", "mean", "var"))], epsilon=a["epsilon"]))
    if op in ("max_pool2d", "avg_pool2d"):
        if a["ceil_mode"]:  # ONNX Runtime 1.31 sizes these by another rule than Relax and
            return None  # PyTorch (2 x 2, stride 2, padding 1 over 8 rows: 4, not 5)
        extra = {} if op == "max_pool2d" else {"count_include_pad": int(a["count_include_pad"])}
        return str(node("MaxPool" if op == "max_pool2d" else "AveragePool", [x],
                        kernel_shape=a["pool_size"], strides=a["strides"], pads=a["padding"],
                        ceil_mode=int(a["ceil_mode"]), **extra))
    if op == "adaptive_avg_pool2d":
        return str(node("GlobalAveragePool", [x])) if a["output_size"] == [1, 1] else None
    if op == "reduce":
        onnx_op = {"mean": "ReduceMean", "sum": "ReduceSum", "max": "ReduceMax"}[a["fn"]]
        return str(node(onnx_op, [x, const(a["axes"], "int64")], keepdims=int(a["keepdims"])))
    if op == "strided_slice":
        return str(node("Slice", [x, const(a["begin"], "int64"), const(a["end"], "int64"),
                                  const(a["axes"], "int64"), const(a["strides"], "int64")]))
    if op == "split":
        axis = a["axis"]
        bounds = split_bounds(shape[axis], a["sections"])
        b, e = bounds[a["piece"]]
        return str(node("Slice", [x, const([b], "int64"), const([e], "int64"),
                                  const([axis], "int64")]))
    if op == "concat":
        return str(node("Concat", args, axis=a["axis"]))
    if op == "permute_dims":
        return str(node("Transpose", [x], perm=a["axes"]))
    if op == "reshape":
        return str(node("Reshape", [x, const(a["shape"], "int64")]))
    return None


def _unary(a: dict[str, Any], x: str, const: Any, node: Any) -> str:
    fn = a["fn"]
    simple = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "gelu": "Gelu",
              "gelu_erf_chain": "Gelu", "hardswish": "HardSwish"}
    if fn in simple:
        return str(node(simple[fn], [x]))
    if fn in ("gelu_tanh", "gelu_tanh_chain"):
        return str(node("Gelu", [x], approximate="tanh"))
    if fn in ("silu", "silu_gate"):
        return str(node("Mul", [x, node("Sigmoid", [x])]))
    if fn == "hardsigmoid":
        return str(node("HardSigmoid", [x], alpha=1 / 6, beta=0.5))
    low, high = (0.0, 6.0) if fn in ("relu6", "relu6_clip") else (a["low"], a["high"])
    return str(node("Clip", [x, const(np.float32(low)), const(np.float32(high))]))


def run(model: Any, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """ONNX Runtime's outputs of ``model`` on ``arrays`` (one thread: the executor's cores
    are the fuzzer's)."""
    import onnxruntime  # optional (the onnx extra)

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(model.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
    feed = {f"x{k}": a for k, a in enumerate(arrays)}
    return [np.asarray(o) for o in session.run(None, feed)]
