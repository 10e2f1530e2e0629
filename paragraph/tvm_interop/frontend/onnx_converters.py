"""paragraph's converters for ONNX operators TVM's ONNX frontend lacks or converts opaquely.

* ``Clip`` with constant bounds -> one ``relax.clip`` (``relax.nn.relu`` for ``Clip(x, 0)``).
  TVM's converter emits ``emit_te(topi.maximum)`` and ``emit_te(topi.minimum)``: two
  ``call_tir`` kernels that no later pass can see through, where ReLU6 (MobileNetV2,
  EfficientNet-lite) is an epilogue of the convolution before it. A NaN bound means no bound
  (ONNX, ONNX Runtime). Bounds computed at run time, or a lower bound above the upper one, go
  to TVM's converter.
* ``LSTM`` and ``GRU`` (absent from TVM's frontend): unrolled over the static sequence into
  matmuls, sigmoid, tanh and element-wise ops, the input projection of every step done as one
  matmul per direction. Forward, reverse and bidirectional, any initial state, GRU's
  ``linear_before_reset`` either way; weights must be constants. Other activations, a cell
  ``clip``, LSTM's ``input_forget`` or peepholes, ``layout`` 1 (batch first; the exporters
  transpose instead), or ``sequence_lens`` shorter than the sequence raise
  `UnsupportedModelError` naming the attribute.

How they are applied: ``from_onnx`` looks every converter up through the module function
``tvm.relax.frontend.onnx.onnx_frontend._get_convert_map`` (once to list unsupported operators,
once per node). `installed` replaces that function, for the duration of a ``with`` block, by
one returning TVM's map updated with `CONVERTERS`, and puts TVM's back on leaving. A
re-entrant lock, held for the whole block, makes concurrent and nested imports safe:
paragraph's ONNX imports convert one at a time, and the outermost block of the thread holding
the lock restores TVM's function. (Code outside paragraph that calls TVM's frontend on another
thread meanwhile does not wait, and converts with paragraph's converters: the same results for
Clip, and LSTM and GRU where TVM would refuse them.)

A converter is an object with ``get_converter(opset)`` returning
``convert(bb, inputs, attrs, params)``, as TVM's ``OnnxOpConverter`` classes are; these do not
derive from it, so that this module imports without onnx.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import Constant as _ConstBase  # a Relax tensor constant (and IntImm/FloatImm)

from paragraph.errors import UnsupportedModelError

__all__ = ["CONVERTERS", "installed"]

Convert = Callable[[relax.BlockBuilder, list[Any], dict[str, Any], Any], Any]


# ---------------------------------------------------------------------------- Clip
class _Clip:
    """ONNX Clip (attributes before opset 11, inputs since) with constant bounds."""

    def __init__(self, fallback: Any) -> None:
        self.fallback = fallback  # TVM's converter, for bounds computed at run time

    def get_converter(self, opset: int) -> Convert:
        tvm_convert = self.fallback.get_converter(opset)

        def convert(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                    params: Any) -> Any:
            x = inputs[0]
            if opset < 11:
                bounds: list[float | None] | None = [attrs.get("min"), attrs.get("max")]
            else:
                bounds = [_scalar(inputs[1]), _scalar(inputs[2])]
                if any(b is None and v is not None for b, v in zip(bounds, inputs[1:3],
                                                                    strict=False)):
                    bounds = None  # a bound computed at run time
            clipped = None if bounds is None else _clip(x, bounds[0], bounds[1])
            return tvm_convert(bb, inputs, attrs, params) if clipped is None else clipped
        return convert


def _value(expr: Any) -> np.ndarray | None:
    """The value of a tensor constant, else None."""
    if isinstance(expr, _ConstBase) and isinstance(expr.ty, relax.TensorType):
        return expr.value.numpy()
    return None


def _scalar(expr: Any) -> float | None:
    """The value of a one-element constant, else None."""
    value = _value(expr)
    return float(value.reshape(-1)[0]) if value is not None and value.size == 1 else None


def _clip(x: relax.Expr, lo: float | None, hi: float | None) -> relax.Expr | None:
    """``clip(x, lo, hi)`` as one Relax op (None and NaN: unbounded), or None for a lower bound
    above the upper one (ONNX's ``min(max(x, lo), hi)`` is ``hi`` there, ``relax.clip`` gives
    ``lo``) or a tensor that is not floating point or integer."""
    dtype = str(x.ty.dtype)
    lo = None if lo is None or np.isnan(lo) else lo
    hi = None if hi is None or np.isnan(hi) else hi
    if lo is not None and hi is not None and lo > hi:
        return None
    if dtype.startswith(("float", "bfloat")):
        low, high = -np.inf, np.inf
    elif dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        low, high = int(info.min), int(info.max)
        lo, hi = (None if v is None else int(v) for v in (lo, hi))
    else:
        return None
    if lo is None and hi is None:
        return x
    if lo == 0 and hi is None and not isinstance(low, int):
        return relax.op.nn.relu(x)
    return relax.op.clip(x, relax.prim_value(low if lo is None else lo, dtype),
                         relax.prim_value(high if hi is None else hi, dtype))


# ---------------------------------------------------------------------------- RNNs
_DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}


class _Recurrent:
    """What LSTM and GRU share: checking attributes, weights and states, both directions."""

    op = ""
    gates = 0
    activations: tuple[str, ...] = ()  # the defaults, per direction

    def get_converter(self, opset: int) -> Convert:
        return self.convert

    def convert(self, bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                params: Any) -> relax.Tuple:
        direction = _text(attrs.get("direction", b"forward"))
        if direction not in _DIRECTIONS:
            raise self.unsupported("direction", direction)
        dirs = _DIRECTIONS[direction]
        self.check_attrs(attrs, dirs)
        x = inputs[0]
        seq, batch, _ = _static_shape(x, f"{self.op} input X")
        w, r = (self.weight(inputs[i], name) for i, name in ((1, "W"), (2, "R")))
        hidden = int(attrs["hidden_size"]) if "hidden_size" in attrs else int(r.shape[-1])
        b = (np.zeros((dirs, 2 * self.gates * hidden), w.dtype) if inputs[3] is None
             else self.weight(inputs[3], "B"))
        self.check_sequence_lens(inputs[4], seq)
        self.check_extra_inputs(inputs)
        ys, hs, cs = [], [], []
        for d in range(dirs):
            reverse = direction == "reverse" or d == 1
            states = [self.initial(bb, inputs[k], d, batch, hidden, w.dtype)
                      for k in self.state_inputs]
            outs, last = self.direction(bb, x, w[d], r[d], b[d], states, reverse,
                                        (seq, batch, hidden), attrs)
            ys.append(_stack(bb, outs, [seq, 1, batch, hidden], axis=0))
            hs.append(bb.emit(relax.op.reshape(last[0], [1, batch, hidden])))
            if len(last) > 1:
                cs.append(bb.emit(relax.op.reshape(last[1], [1, batch, hidden])))
        y, y_h = _cat(bb, ys, 1), _cat(bb, hs, 0)
        return relax.Tuple([y, y_h] + ([_cat(bb, cs, 0)] if cs else []))

    # -- what the subclasses say
    state_inputs: tuple[int, ...] = ()  # initial_h (and initial_c)

    def direction(self, bb: relax.BlockBuilder, x: relax.Expr, w: np.ndarray, r: np.ndarray,
                  b: np.ndarray, states: list[Any], reverse: bool, sizes: tuple[int, int, int],
                  attrs: dict[str, Any]) -> tuple[list[relax.Expr], list[relax.Expr]]:
        """One direction over the sequence: the output of every step (in time order) and the
        last states. ``w``, ``r``, ``b`` are the direction's weights, ``states`` its initial
        states (None: zeros), ``sizes`` (sequence, batch, hidden)."""
        raise NotImplementedError

    def check_extra_inputs(self, inputs: list[Any]) -> None:
        """Inputs other than X, W, R, B, sequence_lens and the initial states."""

    def check_attrs(self, attrs: dict[str, Any], dirs: int) -> None:
        acts = attrs.get("activations")
        if acts is not None and [_text(a).lower() for a in acts] != \
                [a.lower() for a in self.activations] * dirs:
            raise self.unsupported("activations", [_text(a) for a in acts])
        if "clip" in attrs:
            raise self.unsupported("clip", attrs["clip"])
        if int(attrs.get("layout", 0)):  # the exporters transpose to [seq, batch, ...]
            raise self.unsupported("layout", attrs["layout"])

    # -- shared pieces
    def unsupported(self, attr: str, value: Any) -> UnsupportedModelError:
        return UnsupportedModelError(
            f"ONNX {self.op} with {attr}={value!r}: paragraph converts {self.op} with the "
            f"default activations {list(self.activations)}, no clip, layout 0, all sequences "
            "full length and constant weights")

    def weight(self, expr: Any, name: str) -> np.ndarray:
        value = _value(expr)
        if value is None:
            raise UnsupportedModelError(f"ONNX {self.op}: its weight {name} is computed at run "
                                        "time; paragraph converts constant weights only")
        return value

    def check_sequence_lens(self, expr: Any, seq: int) -> None:
        if expr is None:
            return
        lens = _value(expr)
        if lens is None:
            raise self.unsupported("sequence_lens", "computed at run time")
        if not np.all(lens == seq):
            raise self.unsupported("sequence_lens", lens.tolist())

    def initial(self, bb: relax.BlockBuilder, expr: Any, d: int, batch: int, hidden: int,
                dtype: Any) -> relax.Expr | None:
        """Direction ``d``'s initial state as a [batch, hidden] expression; None for zeros."""
        if expr is None:
            return None
        value = _value(expr)
        if value is not None:
            return None if not value[d].any() else relax.const(value[d].astype(dtype))
        part = bb.emit(relax.op.strided_slice(expr, [0], [d], [d + 1]))
        return bb.emit(relax.op.reshape(part, [batch, hidden]))

    @staticmethod
    def projected(bb: relax.BlockBuilder, x: relax.Expr, w: np.ndarray, bias: np.ndarray,
                  seq: int, batch: int) -> list[relax.Expr]:
        """``x @ w.T + bias`` for every step at once, split into [batch, gates] per step."""
        xw = bb.emit(relax.op.matmul(x, relax.const(np.ascontiguousarray(w.T))))
        xw = bb.emit(relax.op.add(xw, relax.const(bias)))
        width = w.shape[0]
        if seq == 1:
            return [bb.emit(relax.op.reshape(xw, [batch, width]))]
        steps = bb.emit(relax.op.split(xw, seq, axis=0))
        return [bb.emit(relax.op.reshape(relax.TupleGetItem(steps, t), [batch, width]))
                for t in range(seq)]


class _LSTM(_Recurrent):
    """ONNX LSTM, gates i, o, f, c: i, o, f sigmoid, c and the cell output tanh."""

    op = "LSTM"
    gates = 4
    activations = ("Sigmoid", "Tanh", "Tanh")
    state_inputs = (5, 6)

    def check_attrs(self, attrs: dict[str, Any], dirs: int) -> None:
        super().check_attrs(attrs, dirs)
        if int(attrs.get("input_forget", 0)):
            raise self.unsupported("input_forget", attrs["input_forget"])

    def check_extra_inputs(self, inputs: list[Any]) -> None:
        peepholes = inputs[7]
        value = None if peepholes is None else _value(peepholes)
        if peepholes is not None and (value is None or value.any()):
            raise self.unsupported("peepholes P", "non-zero")

    def direction(self, bb, x, w, r, b, states, reverse, sizes, attrs):
        seq, batch, hidden = sizes
        four = 4 * hidden
        xs = self.projected(bb, x, w, b[:four] + b[four:], seq, batch)
        rt = relax.const(np.ascontiguousarray(r.T))
        h, c = states
        outs: list[relax.Expr] = [relax.const(0.0)] * seq
        for t in (reversed(range(seq)) if reverse else range(seq)):
            gates = xs[t] if h is None else bb.emit(
                relax.op.add(xs[t], bb.emit(relax.op.matmul(h, rt))))
            # each gate a slice, not a split: TVM fuses a step's slices, activations and
            # products into one kernel, where a split's tuple ended a fused group (five
            # kernels a step: the LSTM LM's 128 steps ran 1.3 ms of them)
            i, o, f, cand = (bb.emit(relax.op.strided_slice(
                gates, [1], [k * hidden], [(k + 1) * hidden])) for k in range(4))
            i, o, f = (bb.emit(relax.op.sigmoid(g)) for g in (i, o, f))
            cand = bb.emit(relax.op.tanh(cand))
            new = bb.emit(relax.op.multiply(i, cand))
            c = new if c is None else bb.emit(
                relax.op.add(bb.emit(relax.op.multiply(f, c)), new))
            h = bb.emit(relax.op.multiply(o, bb.emit(relax.op.tanh(c))))
            outs[t] = h
        return outs, [h, c]


class _GRU(_Recurrent):
    """ONNX GRU, gates z, r, h: z and r sigmoid, the candidate tanh."""

    op = "GRU"
    gates = 3
    activations = ("Sigmoid", "Tanh")
    state_inputs = (5,)

    def direction(self, bb, x, w, r, b, states, reverse, sizes, attrs):
        seq, batch, hidden = sizes
        before_reset = bool(int(attrs.get("linear_before_reset", 0)))
        two, three = 2 * hidden, 3 * hidden
        wb, rb = b[:three], b[three:]
        # the recurrent bias joins the input projection, except the candidate's when the
        # reset gate multiplies it (linear_before_reset)
        bias = wb + np.concatenate([rb[:two], np.zeros_like(rb[two:]) if before_reset
                                    else rb[two:]])
        xs = self.projected(bb, x, w, bias, seq, batch)
        # with linear_before_reset every gate's recurrent product takes h: one product of h
        # with all three (PyTorch's GRU exports so: one kernel a step fewer)
        r_all = relax.const(np.ascontiguousarray(r.T)) if before_reset else None
        r_zr = None if before_reset else relax.const(np.ascontiguousarray(r[:two].T))
        r_h = None if before_reset else relax.const(np.ascontiguousarray(r[two:].T))
        rb_h = relax.const(np.ascontiguousarray(rb[two:]))
        (h,) = states
        outs: list[relax.Expr] = [relax.const(0.0)] * seq
        for t in (reversed(range(seq)) if reverse else range(seq)):
            parts = bb.emit(relax.op.split(xs[t], [two], axis=1))
            x_zr, x_h = relax.TupleGetItem(parts, 0), relax.TupleGetItem(parts, 1)
            h_all = None
            if h is not None and r_all is not None:
                h_all = bb.emit(relax.op.matmul(h, r_all))
                x_zr = bb.emit(relax.op.add(x_zr, bb.emit(
                    relax.op.strided_slice(h_all, [1], [0], [two]))))
            elif h is not None:
                x_zr = bb.emit(relax.op.add(x_zr, bb.emit(relax.op.matmul(h, r_zr))))
            zr = bb.emit(relax.op.split(bb.emit(relax.op.sigmoid(x_zr)), 2, axis=1))
            z, reset = relax.TupleGetItem(zr, 0), relax.TupleGetItem(zr, 1)
            if before_reset:  # r * (h @ R_h.T + Rb_h)
                hh = rb_h if h_all is None else bb.emit(relax.op.add(bb.emit(
                    relax.op.strided_slice(h_all, [1], [two], [three])), rb_h))
                recurrent: relax.Expr | None = bb.emit(relax.op.multiply(reset, hh))
            else:  # (r * h) @ R_h.T
                recurrent = None if h is None else bb.emit(
                    relax.op.matmul(bb.emit(relax.op.multiply(reset, h)), r_h))
            pre = x_h if recurrent is None else bb.emit(relax.op.add(x_h, recurrent))
            cand = bb.emit(relax.op.tanh(pre))
            # (1 - z) * cand + z * h  =  cand + z * (h - cand)
            if h is None:
                keep = bb.emit(relax.op.subtract(relax.const(1.0, str(w.dtype)), z))
                h = bb.emit(relax.op.multiply(keep, cand))
            else:
                diff = bb.emit(relax.op.subtract(h, cand))
                h = bb.emit(relax.op.add(cand, bb.emit(relax.op.multiply(z, diff))))
            outs[t] = h
        return outs, [h]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _static_shape(expr: relax.Expr, what: str) -> list[int]:
    shape = expr.ty.shape if isinstance(expr.ty, relax.TensorType) else None
    if not isinstance(shape, relax.ShapeExpr) or not all(
            isinstance(d, tvm.tirx.IntImm) for d in shape.values):
        raise UnsupportedModelError(f"{what} has no static shape ({expr.ty}): paragraph "
                                    "unrolls recurrent layers over a static sequence")
    return [int(d.value) for d in shape.values]


def _stack(bb: relax.BlockBuilder, steps: list[relax.Expr], shape: list[int],
           axis: int) -> relax.Expr:
    """The [batch, hidden] states of every step as one tensor of ``shape``."""
    one = [1, *shape[1:]]
    parts = [bb.emit(relax.op.reshape(s, one)) for s in steps]
    return _cat(bb, parts, axis)


def _cat(bb: relax.BlockBuilder, parts: list[relax.Expr], axis: int) -> relax.Expr:
    return parts[0] if len(parts) == 1 else bb.emit(relax.op.concat(parts, axis=axis))


# ---------------------------------------------------------------------------- installing
CONVERTERS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "Clip": lambda tvm_map: _Clip(tvm_map["Clip"]),
    "LSTM": lambda tvm_map: _LSTM(),
    "GRU": lambda tvm_map: _GRU(),
}
"""ONNX operator -> a function of TVM's converter map making paragraph's converter."""

_lock = threading.RLock()
_depth = 0
_saved: Any = None


@contextmanager
def installed(frontend: Any) -> Iterator[None]:
    """Within the block, TVM's ONNX frontend module ``frontend``
    (``tvm.relax.frontend.onnx.onnx_frontend``) converts with `CONVERTERS`; TVM's own
    ``_get_convert_map`` is restored when the outermost block of the thread leaves."""
    global _depth, _saved
    with _lock:
        if _depth == 0:
            _saved = original = frontend._get_convert_map

            def convert_map() -> dict[str, Any]:
                tvm_map = original()
                return {**tvm_map, **{op: make(tvm_map) for op, make in CONVERTERS.items()}}

            frontend._get_convert_map = convert_map
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
            if _depth == 0:
                frontend._get_convert_map = _saved
                _saved = None
