"""The operators `paragraph.graph` models: attribute defaults, shape functions, numpy references.

Kinds and attribute names follow Relax (``relax.op.nn.conv2d`` -> kind ``"conv2d"`` with
``strides``, ``padding``, ...), so the Relax round trip is a direct mapping. Shape functions
reproduce Relax's own type inference (pool sizes with ``ceil_mode``, split sections, slice
clamping), which `Graph.validate` relies on. The numpy references define what each operator
computes; `paragraph.interpret` runs a graph with them, without TVM (tests, rule checks).
Layouts are NCHW / OIHW: a Relax conv or pool in another layout stays an opaque node.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from paragraph.tensor import TensorType

Shape = tuple[int, ...]
InferFn = Callable[[list[TensorType], Mapping[str, Any]], list[TensorType]]


@dataclass(frozen=True)
class OpSpec:
    """Defaults of an operator's attributes, its shape function and its numpy reference."""

    defaults: Mapping[str, Any]
    infer: InferFn
    compute: Callable[..., Any]


SPECS: dict[str, OpSpec] = {}

# an operator's shape function and numpy reference (arrays and attributes in, arrays out)
_OpPair = tuple[InferFn, Callable[..., Any]]


def _register(kind: str, defaults: Mapping[str, Any] | None = None
              ) -> Callable[[_OpPair], _OpPair]:
    def deco(pair: _OpPair) -> _OpPair:
        infer, compute = pair
        SPECS[kind] = OpSpec(dict(defaults or {}), infer, compute)
        return pair
    return deco


def attrs_with_defaults(kind: str, attrs: Mapping[str, Any]) -> dict[str, Any]:
    """``attrs`` completed with the operator's defaults; unknown attribute names raise."""
    spec = SPECS[kind]
    unknown = set(attrs) - set(spec.defaults)
    if unknown:
        raise KeyError(f"{kind} has no attribute(s) {sorted(unknown)}")
    return {**spec.defaults, **attrs}


_CANONICAL: dict[str, Callable[[Any], Any]] = {}  # attribute name -> normaliser


def canonical(kind: str, attrs: Mapping[str, Any],
              in_types: Sequence[TensorType] | None = None) -> dict[str, Any]:
    """``attrs`` with defaults filled in and values in Relax's normal form.

    ``padding=1`` becomes ``(1, 1, 1, 1)``, ``strides=2`` becomes ``(2, 2)``, lists become
    tuples, and (given the input types) a reshape's ``-1`` is resolved, as Relax does, so
    equal operators get equal attributes and equal structural hashes.
    """
    full = attrs_with_defaults(kind, attrs)
    if kind == "reshape" and in_types:
        full["shape"] = _reshape_infer(list(in_types), full)[0].shape
    for key, value in full.items():
        norm = _CANONICAL.get(f"{kind}.{key}") or _CANONICAL.get(key)
        if norm is not None:
            full[key] = norm(value)
        elif isinstance(value, list):
            full[key] = tuple(value)
    return full


def infer(kind: str, in_types: Sequence[TensorType], attrs: Mapping[str, Any]) -> list[TensorType]:
    """Output types of ``kind`` applied to inputs of ``in_types``."""
    if kind not in SPECS:
        raise KeyError(f"no shape function for operator kind {kind!r}")
    return list(SPECS[kind].infer(list(in_types), attrs_with_defaults(kind, attrs)))


def compute(kind: str, args: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> list[np.ndarray]:
    """Run the numpy reference of ``kind``; returns one array per output."""
    out = SPECS[kind].compute(*args, **attrs_with_defaults(kind, attrs))
    return list(out) if isinstance(out, (list, tuple)) else [out]


# ---------------------------------------------------------------------------- helpers
def _same(t: TensorType) -> list[TensorType]:
    return [t]


def _broadcast(a: Shape, b: Shape) -> Shape:
    try:
        return tuple(np.broadcast_shapes(a, b))
    except ValueError:
        raise ValueError(f"shapes {a} and {b} do not broadcast") from None


def _dtype_of(types: Sequence[TensorType]) -> str:
    dtypes = {t.dtype for t in types}
    if len(dtypes) != 1:
        raise ValueError(f"mixed dtypes {sorted(dtypes)}")
    return dtypes.pop()


def _norm_axis(axis: int, ndim: int) -> int:
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} out of range for rank {ndim}")
    return axis % ndim


def _pool_out(size: int, k: int, s: int, pad_begin: int, pad_end: int, d: int,
              ceil_mode: bool) -> int:
    # Relax's Pool2D inference (TVM 0.27), PyTorch's rule: with ceil_mode a last window that
    # would start past the input and its leading padding is dropped (a 1 x 1 pool of stride 2
    # over 32 columns gives 16, not 17)
    num = size + pad_begin + pad_end - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)
    out = num // s + 1
    if ceil_mode and (out - 1) * s >= size + pad_begin:
        out -= 1
    if out < 1:
        raise ValueError(f"pooling window {k} does not fit a dimension of {size}")
    return out


def _pair(v: Any) -> tuple[int, int]:
    v = tuple(v) if isinstance(v, (tuple, list)) else (v, v)
    return (int(v[0]), int(v[-1]))


def _quad(v: Any) -> tuple[int, int, int, int]:
    """Padding as (top, left, bottom, right) from 1, 2 or 4 values."""
    v = tuple(int(x) for x in v) if isinstance(v, (tuple, list)) else (int(v),)
    if len(v) == 1:
        return (v[0],) * 4
    if len(v) == 2:
        return (v[0], v[1], v[0], v[1])
    if len(v) != 4:
        raise ValueError(f"padding {v}: give 1, 2 or 4 values")
    return (v[0], v[1], v[2], v[3])


def _int_tuple(v: Any) -> tuple[int, ...] | None:
    return None if v is None else tuple(int(x) for x in (v if isinstance(v, (tuple, list))
                                                        else (v,)))


for _key in ("strides", "dilation", "pool_size"):
    _CANONICAL[_key] = _pair
_CANONICAL["padding"] = _quad
for _key in ("axes", "begin", "end"):
    _CANONICAL[_key] = _int_tuple
_CANONICAL["strided_slice.strides"] = _int_tuple
_CANONICAL["adaptive_avg_pool2d.output_size"] = lambda v: None if v is None else _pair(v)
_CANONICAL["split.indices_or_sections"] = lambda v: v if isinstance(v, int) else _int_tuple(v)


def _check_layout(attrs: Mapping[str, Any], *keys: str) -> None:
    for k, want in zip(keys, ("NCHW", "OIHW", "NCHW"), strict=True):
        if attrs.get(k) not in (want, None):
            raise ValueError(f"{k}={attrs[k]!r}: paragraph models NCHW/OIHW only")


# ---------------------------------------------------------------------------- element-wise
def _binary_infer(types: list[TensorType], attrs: Mapping[str, Any]) -> list[TensorType]:
    a, b = types
    return [TensorType(_broadcast(a.shape, b.shape), _dtype_of(types))]


for _kind, _ufunc in {"add": np.add, "subtract": np.subtract, "multiply": np.multiply,
                      "divide": np.divide}.items():
    _register(_kind)((_binary_infer, lambda a, b, _f=_ufunc: _f(a, b).astype(
        np.result_type(a, b), copy=False)))


def _erf(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf  # half a second to import, for GELU's reference only

    out: np.ndarray = erf(x)
    return out


def _unary_infer(types: list[TensorType], attrs: Mapping[str, Any]) -> list[TensorType]:
    return _same(types[0])


_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "relu": lambda x: np.maximum(x, 0).astype(x.dtype),
    "sigmoid": lambda x: (1 / (1 + np.exp(-x))).astype(x.dtype),
    "tanh": lambda x: np.tanh(x),
    "gelu": lambda x: (0.5 * x * (1 + _erf(x / math.sqrt(2)))).astype(x.dtype),
    "silu": lambda x: (x / (1 + np.exp(-x))).astype(x.dtype),
}
for _kind, _fn in _UNARY.items():
    _register(_kind)((_unary_infer, _fn))


def _clip(x: np.ndarray, min: float, max: float) -> np.ndarray:  # noqa: A002 (Relax's names)
    # max(min(x, hi), lo), as TVM's clip computes it (a NaN stays NaN)
    out: np.ndarray = np.clip(x, min, max).astype(x.dtype)
    return out


# ReLU6 and the hard sigmoid's bounds (ONNX Clip with constant bounds)
_register("clip", {"min": float("-inf"), "max": float("inf")})((_unary_infer, _clip))


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e: np.ndarray = np.exp(x - x.max(axis=axis, keepdims=True))
    out: np.ndarray = (e / e.sum(axis=axis, keepdims=True)).astype(x.dtype)
    return out


def _softmax_infer(types: list[TensorType], attrs: Mapping[str, Any]) -> list[TensorType]:
    _norm_axis(attrs["axis"], len(types[0].shape))
    return _same(types[0])


_register("softmax", {"axis": -1})((_softmax_infer, _softmax))


# ---------------------------------------------------------------------------- normalisation
def _layer_norm_infer(types: list[TensorType], attrs: Mapping[str, Any]) -> list[TensorType]:
    x = types[0]
    axes = [_norm_axis(a, len(x.shape)) for a in attrs["axes"]]
    norm_shape = tuple(x.shape[a] for a in axes)
    for t in types[1:]:
        if t.shape != norm_shape:
            raise ValueError(f"layer_norm parameter of shape {t.shape}, expected {norm_shape}")
    return _same(x)


def _layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, axes: Sequence[int],
                epsilon: float, center: bool, scale: bool) -> np.ndarray:
    axes = tuple(a % x.ndim for a in axes)
    mean: np.ndarray = x.mean(axis=axes, keepdims=True)
    var: np.ndarray = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    y: np.ndarray = (x - mean) / np.sqrt(var + epsilon)
    bshape = [x.shape[i] if i in axes else 1 for i in range(x.ndim)]
    if scale:
        y = y * gamma.reshape(bshape)
    if center:
        y = y + beta.reshape(bshape)
    return y.astype(x.dtype)


_register("layer_norm", {"axes": (-1,), "epsilon": 1e-5, "center": True, "scale": True})(
    (_layer_norm_infer, _layer_norm))


def _batch_norm_infer(types: list[TensorType], attrs: Mapping[str, Any]) -> list[TensorType]:
    x = types[0]
    c = x.shape[_norm_axis(attrs["axis"], len(x.shape))]
    for t in types[1:]:
        if t.shape != (c,):
            raise ValueError(f"batch_norm parameter of shape {t.shape}, expected ({c},)")
    return [x, types[3], types[4]]


def _batch_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, mean: np.ndarray,
                var: np.ndarray, axis: int, epsilon: float, center: bool, scale: bool,
                momentum: float, training: bool) -> list[np.ndarray]:
    if training:
        raise NotImplementedError("batch_norm with training=True has no inference reference")
    bshape = [1] * x.ndim
    bshape[axis % x.ndim] = -1
    y = (x - mean.reshape(bshape)) / np.sqrt(var.reshape(bshape) + epsilon)
    if scale:
        y = y * gamma.reshape(bshape)
    if center:
        y = y + beta.reshape(bshape)
    return [y.astype(x.dtype), mean, var]


_register("batch_norm", {"axis": 1, "epsilon": 1e-5, "center": True, "scale": True,
                         "momentum": 0.1, "training": True})(
    (_batch_norm_infer, _batch_norm))


# ---------------------------------------------------------------------------- conv and matmul
_CONV_DEFAULTS = {"strides": (1, 1), "padding": (0, 0, 0, 0), "dilation": (1, 1), "groups": 1,
                  "data_layout": "NCHW", "kernel_layout": "OIHW", "out_layout": "NCHW",
                  "out_dtype": None}


def _conv2d_infer(types: list[TensorType], attrs: Mapping[str, Any]) -> list[TensorType]:
    x, w = types
    _check_layout(attrs, "data_layout", "kernel_layout", "out_layout")
    if len(x.shape) != 4 or len(w.shape) != 4:
        raise ValueError(f"conv2d needs rank-4 data and weight, got {x.shape} and {w.shape}")
    n, c, h, wd = x.shape
    o, i, kh, kw = w.shape
    g = attrs["groups"]
    if c != i * g or o % g:
        raise ValueError(f"conv2d: {c} input channels, weight {w.shape}, groups {g}")
    (sh, sw), (dh, dw) = _pair(attrs["strides"]), _pair(attrs["dilation"])
    pt, pl, pb, pr = _quad(attrs["padding"])
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
    if oh < 1 or ow < 1:
        raise ValueError(f"conv2d kernel {kh}x{kw} does not fit input {h}x{wd}")
    return [TensorType((n, o, oh, ow), attrs["out_dtype"] or x.dtype)]


def windows(x: np.ndarray, kh: int, kw: int, s: tuple[int, int], d: tuple[int, int],
            oh: int, ow: int) -> np.ndarray:
    """View of shape (N, C, oh, ow, kh, kw) over a padded NCHW array: the ``kh`` x ``kw``
    window (strides ``s``, dilation ``d``) of every output position, which convolutions and
    pools reduce."""
    sn, sc, sh_, sw_ = x.strides
    return np.lib.stride_tricks.as_strided(
        x, (x.shape[0], x.shape[1], oh, ow, kh, kw),
        (sn, sc, sh_ * s[0], sw_ * s[1], sh_ * d[0], sw_ * d[1]), writeable=False)


def _conv2d(x: np.ndarray, w: np.ndarray, strides: Any, padding: Any, dilation: Any,
            groups: int, data_layout: str, kernel_layout: str, out_layout: str,
            out_dtype: str | None) -> np.ndarray:
    (out_t,) = _conv2d_infer([TensorType(x.shape, str(x.dtype)), TensorType(w.shape)],
                             {"strides": strides, "padding": padding, "dilation": dilation,
                              "groups": groups, "out_dtype": out_dtype})
    pt, pl, pb, pr = _quad(padding)
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    n, o, oh, ow = out_t.shape
    kh, kw = w.shape[2:]
    win = windows(xp, kh, kw, _pair(strides), _pair(dilation), oh, ow)
    cg, og = w.shape[1], o // groups
    outs = [np.einsum("nchwij,ocij->nohw", win[:, g * cg:(g + 1) * cg],
                      w[g * og:(g + 1) * og], optimize=True) for g in range(groups)]
    return np.concatenate(outs, axis=1).astype(out_t.dtype, copy=False)


_register("conv2d", _CONV_DEFAULTS)((_conv2d_infer, _conv2d))


def _matmul_shape(a: Shape, b: Shape) -> Shape:
    if not a or not b:
        raise ValueError("matmul of a scalar")
    a2, b2 = (a if len(a) > 1 else (1,) + a), (b if len(b) > 1 else b + (1,))
    if a2[-1] != b2[-2]:
        raise ValueError(f"matmul: {a} @ {b} have mismatched inner dimensions")
    batch = _broadcast(a2[:-2], b2[:-2])
    out = batch + (a2[-2] if len(a) > 1 else None, b2[-1] if len(b) > 1 else None)
    return tuple(d for d in out if d is not None)


def _matmul_infer(types: list[TensorType], attrs: Mapping[str, Any]) -> list[TensorType]:
    a, b = types
    return [TensorType(_matmul_shape(a.shape, b.shape), attrs["out_dtype"] or _dtype_of(types))]


_register("matmul", {"out_dtype": None})(
    (_matmul_infer, lambda a, b, out_dtype: np.matmul(a, b).astype(out_dtype or a.dtype)))


def _linear_infer(types: list[TensorType], attrs: Mapping[str, Any]) -> list[TensorType]:
    x, w = types[:2]
    if len(w.shape) != 2:
        raise ValueError(f"linear weight must be 2-D (out, in), got {w.shape}")
    shape = _matmul_shape(x.shape, (w.shape[1], w.shape[0]))
    if len(types) == 3:
        shape = _broadcast(shape, types[2].shape)
    return [TensorType(shape, attrs["out_dtype"] or x.dtype)]


def _linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None,
            out_dtype: str | None = None) -> np.ndarray:
    y: np.ndarray = np.matmul(x, w.T)
    return (y if b is None else y + b).astype(out_dtype or x.dtype)


_register("linear", {"out_dtype": None})((_linear_infer, _linear))


# ---------------------------------------------------------------------------- pooling
_POOL_DEFAULTS = {"pool_size": (1, 1), "strides": (1, 1), "padding": (0, 0, 0, 0),
                  "dilation": (1, 1), "ceil_mode": False, "count_include_pad": False,
                  "layout": "NCHW", "out_layout": "NCHW"}


def _pool_infer(types: list[TensorType], attrs: Mapping[str, Any]) -> list[TensorType]:
    (x,) = types
    _check_layout(attrs, "layout", "", "out_layout")
    if len(x.shape) != 4:
        raise ValueError(f"pooling needs rank-4 NCHW data, got {x.shape}")
    (kh, kw), (sh, sw), (dh, dw) = (_pair(attrs[k]) for k in ("pool_size", "strides",
                                                                 "dilation"))
    pt, pl, pb, pr = _quad(attrs["padding"])
    oh = _pool_out(x.shape[2], kh, sh, pt, pb, dh, attrs["ceil_mode"])
    ow = _pool_out(x.shape[3], kw, sw, pl, pr, dw, attrs["ceil_mode"])
    return [TensorType(x.shape[:2] + (oh, ow), x.dtype)]


def _pool(x: np.ndarray, reduce: str, pool_size: Any, strides: Any, padding: Any,
          dilation: Any, ceil_mode: bool, count_include_pad: bool, layout: str,
          out_layout: str) -> np.ndarray:
    (out_t,) = _pool_infer([TensorType(x.shape, str(x.dtype))],
                           {"pool_size": pool_size, "strides": strides, "padding": padding,
                            "dilation": dilation, "ceil_mode": ceil_mode})
    (kh, kw), s, d = _pair(pool_size), _pair(strides), _pair(dilation)
    pt, pl, pb, pr = _quad(padding)
    oh, ow = out_t.shape[2:]
    # room for windows that run past the padded input when ceil_mode adds an output
    extra_h = max(0, (oh - 1) * s[0] + d[0] * (kh - 1) + 1 - (x.shape[2] + pt + pb))
    extra_w = max(0, (ow - 1) * s[1] + d[1] * (kw - 1) + 1 - (x.shape[3] + pl + pr))
    pads = ((0, 0), (0, 0), (pt, pb + extra_h), (pl, pr + extra_w))
    if reduce == "max":
        xp = np.pad(x, pads, constant_values=-np.inf)
        high: np.ndarray = windows(xp, kh, kw, s, d, oh, ow).max(axis=(4, 5))
        return high.astype(x.dtype)
    xp = np.pad(x, pads)
    total = windows(xp, kh, kw, s, d, oh, ow).sum(axis=(4, 5))
    inside = np.zeros((1, 1) + xp.shape[2:], x.dtype)
    if count_include_pad:  # padding counts, the ceil_mode overhang does not
        inside[..., :x.shape[2] + pt + pb, :x.shape[3] + pl + pr] = 1
    else:
        inside[..., pt:pt + x.shape[2], pl:pl + x.shape[3]] = 1
    count = windows(inside, kh, kw, s, d, oh, ow).sum(axis=(4, 5))
    out: np.ndarray = (total / np.maximum(count, 1)).astype(x.dtype)
    return out


_register("max_pool2d", _POOL_DEFAULTS)((_pool_infer, lambda x, **a: _pool(x, "max", **a)))
_register("avg_pool2d", _POOL_DEFAULTS)((_pool_infer, lambda x, **a: _pool(x, "avg", **a)))


def _adaptive_infer(types: list[TensorType], attrs: Mapping[str, Any]) -> list[TensorType]:
    (x,) = types
    _check_layout(attrs, "layout", "", "out_layout")
    size = attrs["output_size"]
    oh, ow = (x.shape[2], x.shape[3]) if size is None else _pair(size)
    return [TensorType(x.shape[:2] + (oh, ow), x.dtype)]


def _adaptive_avg_pool2d(x: np.ndarray, output_size: Any, layout: str,
                         out_layout: str) -> np.ndarray:
    oh, ow = (x.shape[2], x.shape[3]) if output_size is None else _pair(output_size)
    h, w = x.shape[2:]
    out = np.empty(x.shape[:2] + (oh, ow), x.dtype)
    for i in range(oh):
        for j in range(ow):
            hs, he = (i * h) // oh, -((-(i + 1) * h) // oh)
            ws, we = (j * w) // ow, -((-(j + 1) * w) // ow)
            out[:, :, i, j] = x[:, :, hs:he, ws:we].mean(axis=(2, 3))
    return out


_register("adaptive_avg_pool2d", {"output_size": None, "layout": "NCHW", "out_layout": "NCHW"})(
    (_adaptive_infer, _adaptive_avg_pool2d))


# ---------------------------------------------------------------------------- data movement
def _concat_infer(types: list[TensorType], attrs: Mapping[str, Any]) -> list[TensorType]:
    if not types:
        raise ValueError("concat of nothing")
    ndim = len(types[0].shape)
    axis = _norm_axis(attrs["axis"], ndim)
    for t in types:
        if len(t.shape) != ndim or any(t.shape[i] != types[0].shape[i]
                                       for i in range(ndim) if i != axis):
            raise ValueError(f"concat on axis {axis} of {[t.shape for t in types]}")
    shape = list(types[0].shape)
    shape[axis] = sum(t.shape[axis] for t in types)
    return [TensorType(tuple(shape), _dtype_of(types))]


_register("concat", {"axis": 0})((_concat_infer, lambda *xs, axis: np.concatenate(xs, axis)))


def split_bounds(dim: int, indices_or_sections: int | Sequence[int]) -> list[tuple[int, int]]:
    """[begin, end) of every piece of a Relax split of a dimension of size ``dim``."""
    if isinstance(indices_or_sections, int):
        n = indices_or_sections
        if n < 1:
            raise ValueError(f"split into {n} sections")
        step = -(-dim // n)  # Relax: equal sections, the last one smaller
        cuts = [min(step * i, dim) for i in range(1, n)]
    else:
        cuts = [min(max(int(c), 0), dim) for c in indices_or_sections]
    edges = [0, *cuts, dim]
    return [(edges[i], max(edges[i], edges[i + 1])) for i in range(len(edges) - 1)]


def _split_infer(types: list[TensorType], attrs: Mapping[str, Any]) -> list[TensorType]:
    (x,) = types
    axis = _norm_axis(attrs["axis"], len(x.shape))
    outs = []
    for b, e in split_bounds(x.shape[axis], attrs["indices_or_sections"]):
        shape = list(x.shape)
        shape[axis] = e - b
        outs.append(TensorType(tuple(shape), x.dtype))
    return outs


def _split(x: np.ndarray, indices_or_sections: int | Sequence[int],
           axis: int) -> list[np.ndarray]:
    axis %= x.ndim
    return [np.take(x, range(b, e), axis=axis)
            for b, e in split_bounds(x.shape[axis], indices_or_sections)]


_register("split", {"indices_or_sections": 1, "axis": 0})((_split_infer, _split))


def _slices(shape: Shape, axes: Sequence[int], begin: Sequence[int], end: Sequence[int],
            strides: Sequence[int] | None) -> list[slice]:
    strides = strides or (1,) * len(axes)
    sl = [slice(None)] * len(shape)
    for a, b, e, s in zip(axes, begin, end, strides, strict=True):
        sl[_norm_axis(a, len(shape))] = slice(b, e, s)
    return sl


def _strided_slice_infer(types: list[TensorType], attrs: Mapping[str, Any]) -> list[TensorType]:
    (x,) = types
    sl = _slices(x.shape, attrs["axes"], attrs["begin"], attrs["end"], attrs["strides"])
    shape = tuple(len(range(*s.indices(d))) for s, d in zip(sl, x.shape, strict=True))
    return [TensorType(shape, x.dtype)]


_register("strided_slice", {"axes": (), "begin": (), "end": (), "strides": None,
                            "assume_inbound": False})(
    (_strided_slice_infer,
     lambda x, axes, begin, end, strides, assume_inbound:
     np.ascontiguousarray(x[tuple(_slices(x.shape, axes, begin, end, strides))])))


def _reshape_infer(types: list[TensorType], attrs: Mapping[str, Any]) -> list[TensorType]:
    (x,) = types
    shape = list(attrs["shape"])
    if shape.count(-1) > 1:
        raise ValueError(f"reshape to {shape}: more than one -1")
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        shape[shape.index(-1)] = x.numel // known if known else 0
    if math.prod(shape) != x.numel:
        raise ValueError(f"reshape of {x.shape} to {tuple(attrs['shape'])}")
    return [TensorType(tuple(shape), x.dtype)]


_register("reshape", {"shape": ()})((_reshape_infer, lambda x, shape: x.reshape(shape)))


def _permute_infer(types: list[TensorType], attrs: Mapping[str, Any]) -> list[TensorType]:
    (x,) = types
    axes = attrs["axes"]
    axes = tuple(reversed(range(len(x.shape)))) if axes is None else tuple(axes)
    if sorted(a % len(x.shape) for a in axes) != list(range(len(x.shape))):
        raise ValueError(f"permute_dims axes {axes} for rank {len(x.shape)}")
    return [TensorType(tuple(x.shape[a] for a in axes), x.dtype)]


_register("permute_dims", {"axes": None})(
    (_permute_infer, lambda x, axes: np.ascontiguousarray(np.transpose(x, axes))))


def _enlarge_infer(types: list[TensorType], attrs: Mapping[str, Any]) -> list[TensorType]:
    (w,) = types
    kh, kw = _pair(attrs["kernel_size"])
    if len(w.shape) != 4 or w.shape[2] > kh or w.shape[3] > kw or (kh - w.shape[2]) % 2 or (
            kw - w.shape[3]) % 2:
        raise ValueError(f"enlarge of a {w.shape} kernel to {kh}x{kw}")
    return [TensorType(w.shape[:2] + (kh, kw), w.dtype)]


def _enlarge(w: np.ndarray, kernel_size: Any) -> np.ndarray:
    kh, kw = _pair(kernel_size)
    dh, dw = (kh - w.shape[2]) // 2, (kw - w.shape[3]) // 2
    return np.pad(w, ((0, 0), (0, 0), (dh, dh), (dw, dw)))


# TASO's enlarge: zero-pad an OIHW kernel to kernel_size, centred (Relax: nn.pad). A rewrite
# normally folds it into the weight; it survives only where the kernel is computed.
_CANONICAL["enlarge.kernel_size"] = _pair
_register("enlarge", {"kernel_size": (1, 1)})((_enlarge_infer, _enlarge))
