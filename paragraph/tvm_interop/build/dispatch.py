"""The vendor dispatch pass (`VendorDispatch`, `dispatch_to_vendor`): operator patterns of a
Relax module become ``call_dps_packed`` calls of vendor kernels, as TVM's cuDNN/cuBLAS BYOC
does; and the way back (`undispatch`, `to_relax_ops`) for calls TVM runs faster."""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.ir.expr import Constant
from tvm.relax.dpl import rewrite_call, wildcard

from paragraph.tvm_interop.frontend.importers import prepare
from paragraph.tvm_interop.runtime.library.names import (
    ACTIVATIONS,
    EPILOGUES,
    POOLS,
    VendorOp,
    is_vendor_name,
)
from paragraph.tvm_interop.runtime.library.torch_kernels import (
    ensure_registered,
    require_torch,
    torch_available,
)

_AFFINE = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide")


def _is_const(expr: relax.Expr) -> bool:
    return isinstance(expr, Constant) and isinstance(expr.ty, relax.TensorType)


def _numpy(expr: relax.Expr) -> np.ndarray:
    return expr.value.numpy()


def _shape(expr: relax.Expr) -> tuple[int, ...] | None:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    try:
        return tuple(int(d) for d in ty.shape)
    except TypeError:  # symbolic dimension
        return None


def _scalar(expr: relax.Expr) -> float | None:
    """The value of a one-element constant, else None."""
    if not _is_const(expr):
        return None
    arr = _numpy(expr)
    return float(arr.reshape(-1)[0]) if arr.size == 1 else None


def _dtype(expr: relax.Expr) -> str:
    return str(expr.ty.dtype)


def _near(value: float | None, target: float) -> bool:
    """Whether a scalar constant is ``target`` up to float32 rounding (exporters write 1/6 or
    sqrt(2/pi) as float32)."""
    return value is not None and abs(value - target) <= 1e-6 * max(1.0, abs(target))


def _clip_bounds(call: relax.Call) -> tuple[float, float] | None:
    """The (min, max) of a ``relax.clip`` call whose bounds are numbers."""
    try:
        return float(call.args[1].value), float(call.args[2].value)
    except (AttributeError, TypeError, ValueError, IndexError):
        return None


# the epilogues each vendor kind fuses: the products and convolutions every activation of the
# kernel library; the concatenation and the average pool relu only (their copy loops)
_EPILOGUES_OF: dict[str, tuple[str, ...]] = {
    "conv2d": EPILOGUES, "matmul": EPILOGUES, "bmm": EPILOGUES,
    "concat": ("relu",), "avg_pool2d": ("relu",)}


class _Rewriter:
    """State of one rewrite over one function: what each variable is bound to and how often it
    is read (an absorbed producer must have no other reader, or its work would be done twice).
    The calls a rewriter sees have variables as arguments; `value` looks through them."""

    def __init__(self, func: relax.Function, dtypes: tuple[str, ...]) -> None:
        self.dtypes = dtypes
        self.bound: dict[relax.Var, relax.Expr] = {}
        self.uses: dict[relax.Var, int] = {}
        for block in func.body.blocks:
            for b in block.bindings:
                self.bound[b.var] = b.value
        for v in _free_uses(func):
            self.uses[v] = self.uses.get(v, 0) + 1

    def vendor(self, var: relax.Expr) -> tuple[VendorOp | None, list[relax.Expr]]:
        """The vendor call ``var`` is bound to, if it is its only reader's input."""
        value = self.bound.get(var) if isinstance(var, relax.Var) else None
        if value is None or self.uses.get(var, 0) != 1:
            return None, []
        return _unpack(value)

    # -- conv2d
    def conv(self, call: relax.Call) -> relax.Expr:
        a = call.attrs
        layout = str(a.data_layout)
        kernel_layout = {"NCHW": "OIHW", "NHWC": "OHWI"}.get(layout)
        pad = [int(p) for p in a.padding]
        x, w = call.args
        if (kernel_layout is None or not _is_const(w) or str(a.kernel_layout) != kernel_layout
                or str(a.out_layout) != layout
                or _dtype(call) not in self.dtypes or _dtype(x) != _dtype(call)
                or _dtype(w) != _dtype(call) or _shape(call) is None or _shape(x) is None):
            return call
        symmetric = pad[:2] == pad[2:]
        (sh, sw), (dh, dw) = (int(v) for v in a.strides), (int(v) for v in a.dilation)
        op = VendorOp("conv2d", layout, (sh, sw), tuple(pad[:2] if symmetric else pad),
                      (dh, dw), int(a.groups))
        # a stem's few input channels, reordered from NCHW as they are copied (padded or not:
        # with padding, into the zero-bordered copy), where a transpose kernel before the
        # convolution read and wrote the image once more (ResNet-50: 0.5% faster end to end
        # on 1 and 2 threads; Inception-v3's unpadded stem, in one process: 0.8-1.9% on one
        # thread, equal on two, and its 40 us transpose kernel gone). Not a larger input,
        # which keeps the NHWC forms (Winograd, the depthwise form) that read a contiguous
        # NHWC tensor
        w_shape = _shape(w)
        few = w_shape is not None and w_shape[3] <= 4  # OHWI: the input channels
        nchw = self._nchw_source(x) if layout == "NHWC" and op.groups == 1 and few else None
        if nchw is not None:  # the model's NCHW input, reordered inside the convolution
            op, x = replace(op, layout="NCHW2NHWC"), nchw
        return _vendor_call(op, [x, w], call.ty)

    def _nchw_source(self, x: relax.Expr) -> relax.Expr | None:
        """The NCHW float32 tensor that ``x`` (read once) is the NHWC transpose of, on the CPU:
        `ConvertLayout` puts that transpose before a model's first convolution, and a TVM
        kernel ran it at 7-12 GB/s (0.14 ms of Inception-v3's 299 x 299 input, 0.08 of
        ResNet-50's), where ONNX Runtime's first convolution reorders its input as it reads
        it."""
        t = self._single(x, "relax.permute_dims")
        if (t is None or "float16" in self.dtypes or t.attrs.axes is None
                or [int(v) for v in t.attrs.axes] != [0, 2, 3, 1]):
            return None
        src = t.args[0]
        shape = _shape(src)
        return src if shape is not None and len(shape) == 4 and _dtype(src) == _dtype(x) \
            else None

    def absorb_affine(self, call: relax.Call) -> relax.Expr | _Bound:
        """``op(vendor conv, c)`` with a per-output-channel constant -> a new weight and bias;
        ``op(vendor average pool, c)`` -> the pool with an affine epilogue ``pool * scale +
        shift`` (per channel, NHWC): where a 1 x 1 convolution's pool was moved after it (rule
        ``pool-after-conv1x1``) the convolution's batch norm follows the pool, and a kernel of
        its own would read and write the pool's output once more; ``op(vendor concat of
        convolutions, c)`` -> each convolution with its slice of ``c`` (`_across_concat`)."""
        inner, const = call.args
        if _is_const(inner):
            if call.op.name in ("relax.subtract", "relax.divide"):
                return call  # c - conv and c / conv are not affine in the weight
            inner, const = const, inner
        op, args = self.vendor(inner)
        if (op is None or op.kind not in ("conv2d", "avg_pool2d", "concat") or op.residual
                or op.act or not _is_const(const) or _dtype(const) != _dtype(call)):
            return call
        axis = _channel_axis(op)
        shape = _shape(call)
        c = None if shape is None else _per_channel(_numpy(const), shape, axis)
        if c is None:
            return call
        if call.op.name == "relax.divide" and not np.all(c != 0):
            # x / 0 is +-inf or NaN per element (IEEE): no weight scale gives that
            return call
        factor, offset = _affine_step(call.op.name, c)
        if not (np.all(np.isfinite(factor)) and np.all(np.isfinite(offset))):
            return call
        if op.kind == "concat":
            return self._across_concat(
                op, args, call, lambda i, j, p_op, p_args, ty: _vendor_call(
                    *_scaled(p_op, p_args, factor[i:j], offset[i:j], _dtype(call)), ty))
        return _vendor_call(*_scaled(op, args, factor, offset, _dtype(call)), call.ty)

    def _across_concat(self, op: VendorOp, parts: list[relax.Expr], call: relax.Call,
                       make: Callable[[int, int, VendorOp, list[relax.Expr],
                                       relax.TensorType], relax.Call]) -> relax.Expr | _Bound:
        """``call`` (an element-wise epilogue of a vendor concat along the channel axis) as
        the concat of its parts with the epilogue taken by each, where every part is a vendor
        convolution read only there, without an epilogue, of the same channel axis:
        ``make(first, last, op, args, ty)`` is the part of channels [first, last) with it.
        MixNet's mixed depthwise convolutions are concatenated before their batch norm and
        SiLU: left to TVM, those were 8 of its 18 ms on one thread."""
        width = 0
        calls: list[tuple[relax.Call, relax.TensorType]] = []
        for part in parts:
            p_op, p_args = self.vendor(part)
            shape = _shape(part)
            if (p_op is None or p_op.kind != "conv2d" or p_op.act or p_op.residual
                    or shape is None or _channel_axis(p_op) != op.axis % len(shape)
                    or _dtype(part) != _dtype(call)):
                return call
            first, width = width, width + shape[op.axis % len(shape)]
            calls.append((make(first, width, p_op, p_args, part.ty), part.ty))
        return _Bound(calls, lambda parts: _vendor_call(op, list(parts), call.ty))

    def absorb_residual(self, call: relax.Call) -> relax.Expr:
        """``add(vendor conv, y)`` with ``y`` a tensor of the same type -> conv + residual."""
        for inner, other in (call.args, call.args[::-1]):
            op, args = self.vendor(inner)
            if (op is not None and op.kind == "conv2d" and not op.residual and not op.act
                    and not _is_const(other)
                    and _shape(other) == _shape(call) and _dtype(other) == _dtype(call)):
                return _vendor_call(replace(op, residual=True), args + [other], call.ty)
        return call

    def absorb_activation(self, call: relax.Call) -> relax.Expr | _Bound:
        """``act(vendor call)`` -> the call with ``act`` as its epilogue, where its kind takes
        it: products and convolutions every one of `EPILOGUES`, concat and the average pool
        relu only."""
        return self._with_act(call.args[0], ACTIVATIONS[call.op.name], call)

    def _with_act(self, x: relax.Expr, act: str, call: relax.Call,
                  uses: int = 1) -> relax.Expr | _Bound:
        """``call`` (an activation ``act`` of ``x``) as the vendor call ``x`` is bound to with
        ``act`` fused, where ``x`` is read ``uses`` times (all of them inside ``call``'s
        pattern), has ``call``'s type, and its kind takes ``act``; else ``call``."""
        value = self.bound.get(x) if isinstance(x, relax.Var) else None
        if value is None or self.uses.get(x, 0) != uses:
            return call
        if _shape(x) != _shape(call) or _dtype(x) != _dtype(call):
            return call
        reshape = None
        if (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
                and value.op.name == "relax.reshape" and isinstance(value.args[0], relax.Var)
                and self.uses.get(value.args[0], 0) == 1):
            # a product's rows reshaped back to (batch, tokens, features), as GPT-2's Conv1D
            # exports: an element-wise epilogue commutes with the reshape
            reshape, x = value, value.args[0]
            value = self.bound.get(x)
            if value is None:
                return call
        op, args = _unpack(value)
        if op is not None and op.kind == "concat" and not op.act and reshape is None \
                and act in _EPILOGUES_OF["conv2d"]:
            spread = self._across_concat(op, args, call, lambda i, j, p_op, p_args, ty:
                                         _vendor_call(replace(p_op, act=act), p_args, ty))
            if not spread.same_as(call):
                return spread
        if op is None or op.act or act not in _EPILOGUES_OF.get(op.kind, ()):
            return call
        fused = _vendor_call(replace(op, act=act), args, x.ty)
        return fused if reshape is None else _Bound.reshaped(fused, x.ty, reshape.args[1])

    def absorb_clip(self, call: relax.Call) -> relax.Expr | _Bound:
        """``clip(v, 0, 6)`` -> ``relu6``; ``clip(v * (1/6) + 1/2, 0, 1)`` (TVM's form of ONNX
        HardSigmoid with PyTorch's alpha) -> ``hardsigmoid``; ``v`` a vendor call read once.
        MobileNetV2's ReLU6 after every depthwise and expanding convolution was an untuned TVM
        kernel of its own, with layout transposes around it (12 of its 20 ms)."""
        bounds = _clip_bounds(call)
        if bounds == (0.0, 6.0):
            return self._with_act(call.args[0], "relu6", call)
        if bounds == (0.0, 1.0):
            x = self._hardsigmoid_input(call.args[0])
            if x is not None:
                return self._with_act(x, "hardsigmoid", call)
            return self._clip_unit(call)
        return call

    def _clip_unit(self, call: relax.Call) -> relax.Expr | _Bound:
        """``clip(v, 0, 1)`` with ``v`` a convolution or product of a constant weight, read
        once: a hard sigmoid whose ``x * alpha + beta`` was folded into ``v``'s weight and
        bias already (`absorb_affine` runs first). ``clip(v, 0, 1) = hardsigmoid(6 v - 3)``,
        so the weight is scaled by 6 and the bias becomes ``6 b - 3``."""
        x = call.args[0]
        value = self.bound.get(x) if isinstance(x, relax.Var) else None
        op, args = _unpack(value) if value is not None else (None, [])
        if (op is None or op.kind not in ("conv2d", "matmul") or op.act or op.residual
                or self.uses.get(x, 0) != 1 or not _is_const(args[1])
                or _shape(x) != _shape(call) or _dtype(x) != _dtype(call)):
            return call
        dtype, shape = _dtype(call), _shape(call) or (1,)
        w = _numpy(args[1]).astype(np.float64) * 6.0
        channels = shape[1] if op.kind == "conv2d" and op.layout == "NCHW" else shape[-1]
        b = _numpy(args[2]).astype(np.float64).reshape(-1) if op.bias else np.zeros(channels)
        new_args = [args[0], relax.const(w.astype(dtype)),
                    relax.const((6.0 * b - 3.0).astype(dtype))]
        return _vendor_call(replace(op, bias=True, act="hardsigmoid"), new_args, call.ty)

    def absorb_gate(self, call: relax.Call) -> relax.Expr | _Bound:
        """``v * sigmoid(v)`` -> ``silu`` (how exporters write SiLU / Swish); ``v *
        hardsigmoid(v)`` in any of TVM's forms -> ``hardswish``; ``v`` a vendor call read
        twice, both times here."""
        for x, gate in (call.args, call.args[::-1]):
            sig = self._single(gate, "relax.sigmoid")
            if sig is not None and sig.args[0].same_as(x):
                return self._with_act(x, "silu", call, uses=2)
            hard = self._relu6_over_6(gate)
            if hard is None:
                clip = self._single(gate, "relax.clip")
                if clip is not None and _clip_bounds(clip) == (0.0, 1.0):
                    hard = self._hardsigmoid_input(clip.args[0])
            if hard is not None and hard.same_as(x):
                return self._with_act(x, "hardswish", call, uses=2)
        return call

    def _with_scalar(self, expr: relax.Expr, name: str, value: float) -> relax.Expr | None:
        """The other operand where ``expr`` (read once) is a call of operator ``name`` with a
        scalar constant of ``value`` (up to float32 rounding): second for a divide, either
        for the commutative add and multiply."""
        call = self._single(expr, name)
        if call is None:
            return None
        orders = [call.args] + ([] if name == "relax.divide" else [call.args[::-1]])
        return next((x for x, c in orders if _near(_scalar(c), value) and not _is_const(x)),
                    None)

    def _hardsigmoid_input(self, expr: relax.Expr) -> relax.Expr | None:
        """``x`` where ``expr`` (read once) is ``x * (1/6) + 1/2`` (either order of each)."""
        scaled = self._with_scalar(expr, "relax.add", 0.5)
        return None if scaled is None else self._with_scalar(scaled, "relax.multiply", 1 / 6)

    def _relu6_over_6(self, expr: relax.Expr) -> relax.Expr | None:
        """``x`` where ``expr`` (read once) is ``clip(x + 3, 0, 6) / 6`` (or ``* (1/6)``):
        TVM's form of ONNX HardSwish's gate."""
        inner = self._with_scalar(expr, "relax.divide", 6.0)
        if inner is None:  # Relax expressions have no truth value: no ``or``
            inner = self._with_scalar(expr, "relax.multiply", 1 / 6)
        clip = None if inner is None else self._single(inner, "relax.clip")
        if clip is None or _clip_bounds(clip) != (0.0, 6.0):
            return None
        return self._with_scalar(clip.args[0], "relax.add", 3.0)

    def absorb_tanh_gelu(self, call: relax.Call) -> relax.Expr | _Bound:
        """``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))`` (any order of the
        products) after a vendor product -> its tanh GELU: how GPT-2's ``gelu_new`` exports
        (an untuned TVM kernel of five operators per layer otherwise). ``x`` is read three
        times, all inside the chain."""
        factors = self._product(call, top=True)
        if len(factors) != 3:
            return call
        half = [f for f in factors if _near(_scalar(f), 0.5)]
        rest = [f for f in factors if not any(f.same_as(h) for h in half)]
        if len(half) != 1 or len(rest) != 2:
            return call
        for x, one_plus in (rest, rest[::-1]):
            inner = self._tanh_gelu_of(one_plus)
            if inner is not None and inner.same_as(x):
                return self._with_act(x, "gelu_tanh", call, uses=3)
        return call

    def _tanh_gelu_of(self, expr: relax.Expr) -> relax.Expr | None:
        """``x`` where ``expr`` is ``1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3))``."""
        add = self._single(expr, "relax.add")
        if add is None:
            return None
        for tanh_var, one in (add.args, add.args[::-1]):
            tanh = self._single(tanh_var, "relax.tanh")
            if tanh is None or _scalar(one) != 1.0:
                continue
            inner = self._with_scalar(tanh.args[0], "relax.multiply", (2 / np.pi) ** 0.5)
            total = None if inner is None else self._single(inner, "relax.add")
            if total is None:
                continue
            for x, cubic in (total.args, total.args[::-1]):
                p = self._with_scalar(cubic, "relax.multiply", 0.044715)
                power = None if p is None else self._single(p, "relax.power")
                if (power is not None and _near(_scalar(power.args[1]), 3.0)
                        and power.args[0].same_as(x)):
                    return x
        return None

    def mean(self, call: relax.Call) -> relax.Expr:
        """``mean(x, axis=[1, 2], keepdims=True)`` of a static float32 4-D tensor -> the
        vendor average pool over its whole height and width (NHWC): a squeeze-excite block's
        and a classifier's global pool, which were TVM kernels of their own (MobileNetV3: 9,
        0.33 ms)."""
        a = call.attrs
        shape, x = _shape(call), call.args[0]
        in_shape = _shape(x)
        if (shape is None or in_shape is None or len(in_shape) != 4 or a.axis is None
                or sorted(int(v) % 4 for v in a.axis) != [1, 2] or not bool(a.keepdims)
                or _dtype(call) != "float32" or _dtype(x) != "float32"
                or "float32" not in self.dtypes or "float16" in self.dtypes):
            return call
        op = VendorOp("avg_pool2d", "NHWC", (1, 1), (0, 0), window=(in_shape[1], in_shape[2]))
        return _vendor_call(op, [x], call.ty)

    def absorb_erf_gelu(self, call: relax.Call) -> relax.Expr | _Bound:
        """``x * (1 + erf(x / sqrt 2)) * 0.5`` (any order of the products) after a vendor
        product or convolution -> that call with its exact GELU: PyTorch exports GELU as this
        chain to ONNX before opset 20, and TVM runs it as an untuned kernel of its own (5 of
        18.5 ms of a BERT encoder here). The product's result is read twice, both times
        inside the chain."""
        factors = self._product(call, top=True)
        if len(factors) != 3:
            return call
        half = [f for f in factors if abs((_scalar(f) or 0.0) - 0.5) < 1e-6]
        rest = [f for f in factors if not any(f.same_as(h) for h in half)]
        if len(half) != 1 or len(rest) != 2:
            return call
        for x, one_plus in (rest, rest[::-1]):
            erf = self._erf_of(one_plus)
            if erf is not None and erf.same_as(x):
                return self._with_act(x, "gelu", call, uses=2)
        return call

    def _single(self, expr: relax.Expr, name: str) -> relax.Call | None:
        """The call of operator ``name`` that ``expr`` (a variable read once) is bound to."""
        value = self.bound.get(expr) if isinstance(expr, relax.Var) else None
        if (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
                and value.op.name == name and self.uses.get(expr, 0) == 1):
            return value
        return None

    def _product(self, expr: relax.Expr, top: bool = False) -> list[relax.Expr]:
        """The factors of a product of single-use multiplies."""
        call = expr if top else self._single(expr, "relax.multiply")
        if call is None:
            return [expr]
        return [f for a in call.args for f in self._product(a)]

    def _erf_of(self, expr: relax.Expr) -> relax.Expr | None:
        """``x`` where ``expr`` is ``1 + erf(x / sqrt 2)`` (or ``x * (1 / sqrt 2)``)."""
        add = self._single(expr, "relax.add")
        if add is None:
            return None
        for erf_var, one in (add.args, add.args[::-1]):
            erf = self._single(erf_var, "relax.erf")
            if erf is None or _scalar(one) != 1.0:
                continue
            for name, c in (("relax.divide", 2 ** 0.5), ("relax.multiply", 2 ** -0.5)):
                scaled = self._single(erf.args[0], name)
                if scaled is not None:
                    orders = [scaled.args] + ([scaled.args[::-1]] if name == "relax.multiply"
                                              else [])
                    for x, k in orders:
                        v = _scalar(k)
                        if v is not None and abs(v - c) < 1e-6 * c:
                            return x
        return None

    # -- matmul
    def matmul(self, call: relax.Call) -> relax.Expr:
        a, b = call.args
        sa, sb, so = _shape(a), _shape(b), _shape(call)
        if (sa is None or sb is None or so is None or _dtype(call) not in self.dtypes
                or _dtype(a) != _dtype(call) or _dtype(b) != _dtype(call)):
            return call
        if len(sb) == 2 and len(sa) >= 2:
            kind = "matmul"
        elif len(sa) == len(sb) >= 3 and sa[:-2] == sb[:-2]:
            kind = "bmm"
        else:
            return call  # broadcasting and 1-D operands stay with TVM
        return _vendor_call(VendorOp(kind), [a, b], call.ty)

    # -- concat
    def concat(self, call: relax.Call) -> relax.Expr:
        """``concat`` of static tensors, with any concat it reads only once along the same
        axis flattened into it."""
        shape = _shape(call)
        if not isinstance(call.args[0], relax.Tuple) or shape is None:
            return call
        axis = int(call.attrs.axis) % len(shape)
        parts: list[relax.Expr] = []
        for part in call.args[0].fields:
            inner = self.bound.get(part) if isinstance(part, relax.Var) else None
            if (self.uses.get(part, 0) == 1 and isinstance(inner, relax.Call)
                    and isinstance(inner.op, tvm.ir.Op) and inner.op.name == "relax.concat"
                    and isinstance(inner.args[0], relax.Tuple) and _shape(inner) is not None
                    and int(inner.attrs.axis) % len(shape) == axis):
                parts += list(inner.args[0].fields)
            else:
                parts.append(part)
        if any(_shape(p) is None or _dtype(p) != _dtype(call) for p in parts) \
                or _dtype(call) not in self.dtypes:
            return call
        return _vendor_call(VendorOp("concat", axis=axis), parts, call.ty)

    # -- pools
    def pool(self, call: relax.Call) -> relax.Expr:
        """A max or average pool of a static float32 NHWC tensor (CPU) without dilation: TVM's
        pool kernels use its own thread pool, so on a multi-thread stream every one woke TVM's
        workers and then let the OpenMP workers of the vendor kernels around it fall asleep
        (Inception-v3's 13 pools, 2 threads: 1.3 ms against ONNX Runtime's 0.9). The vendor
        pools clip each window to the input, so uneven padding, and ceil_mode's last windows
        (which reach past the bottom and right padding), are more padding there, for a max
        pool and an average that counts real pixels only (torchvision's GoogLeNet and
        SqueezeNet pool with ceil_mode: their max pools were TOPI's, which drop a NaN)."""
        a = call.attrs
        pad = [int(p) for p in a.padding]
        x = call.args[0]
        out_shape, in_shape = _shape(call), _shape(x)
        window = (int(a.pool_size[0]), int(a.pool_size[1]))
        if (str(a.layout) != "NHWC" or str(a.out_layout) != "NHWC"
                or any(int(d) != 1 for d in a.dilation)
                or any(p >= k for p, k in zip(pad, window * 2, strict=True))
                or _dtype(call) != "float32" or "float32" not in self.dtypes
                or _dtype(x) != "float32" or out_shape is None or in_shape is None):
            return call
        kind = "max_pool2d" if call.op.name == "relax.nn.max_pool2d" else "avg_pool2d"
        include_pad = kind == "avg_pool2d" and bool(a.count_include_pad)
        stride = (int(a.strides[0]), int(a.strides[1]))
        # (top, left, bottom, right), the bottom and right grown to where the last windows end
        pads = list(pad)
        for axis in (0, 1):
            size, outs = in_shape[1 + axis], out_shape[1 + axis]
            if (outs - 1) * stride[axis] - pad[axis] >= size:
                return call  # a last window in the padding alone (Relax drops those)
            reach = (outs - 1) * stride[axis] + window[axis] - (size + pad[axis])
            pads[2 + axis] = max(pad[2 + axis], reach)
        if pads[:2] != pads[2:] and include_pad:
            return call  # the divisor would count the padding added
        op = VendorOp(kind, "NHWC", stride, tuple(pads) if pads[:2] != pads[2:] else
                      tuple(pads[:2]), window=window, include_pad=include_pad)
        return _vendor_call(op, [x], call.ty)

    # -- softmax
    def softmax(self, call: relax.Call) -> relax.Expr:
        """``softmax`` of a static float32 tensor (CPU): PyTorch's vectorised kernel ran an
        attention's 12x128x128 scores in 0.13 ms, TVM's untuned kernel in 0.7 ms."""
        shape = _shape(call)
        if shape is None or _dtype(call) not in self.dtypes or _dtype(call.args[0]) != \
                _dtype(call):
            return call
        axis = int(call.attrs.axis) % len(shape)
        # an attention's 1 / sqrt(d) before it, read by nothing else: absorbed, which saves a
        # TVM kernel (and, on two threads, waking the vendor team after it)
        x, scale = self._scaled(call.args[0], shape, _dtype(call)) or (call.args[0], 1.0)
        return _vendor_call(VendorOp("softmax", axis=axis, scale=float(np.float32(scale))),
                            [x], call.ty)

    def _scaled(self, expr: relax.Expr, shape: tuple[int, ...], dtype: str
                ) -> tuple[relax.Expr, float] | None:
        """``(y, s)`` where ``expr`` (read once) is ``y`` times or over a finite nonzero
        scalar constant (``s`` the factor), ``y`` of ``shape`` and ``dtype``; else None."""
        candidates: list[tuple[relax.Expr, relax.Expr, bool]] = []
        product = self._single(expr, "relax.multiply")
        if product is not None:
            a, b = product.args
            candidates += [(a, b, False), (b, a, False)]
        quotient = self._single(expr, "relax.divide")
        if quotient is not None:
            candidates.append((*quotient.args, True))
        for y, c, divide in candidates:
            value = _scalar(c)
            if (value is not None and value != 0.0 and np.isfinite(value)
                    and _shape(y) == shape and _dtype(y) == dtype and _dtype(c) == dtype):
                return y, 1.0 / value if divide else value
        return None

    # -- layer norm
    def layer_norm(self, call: relax.Call) -> relax.Expr:
        """``layer_norm`` over the last axis of a static float32 tensor (CPU), with the
        residual add it normalises absorbed (a BERT layer's ``layer_norm(x + f(x))``): TVM's
        CPU kernel for it is an unscheduled loop nest on one thread, PyTorch's is vectorised
        and runs on every thread of the stream."""
        shape = _shape(call)
        a = call.attrs
        if (shape is None or _dtype(call) not in self.dtypes
                or _dtype(call.args[0]) != _dtype(call) or not (a.center and a.scale)
                or [int(x) % len(shape) for x in a.axes] != [len(shape) - 1]):
            return call
        x, gamma, beta = call.args
        if any(_shape(t) != shape[-1:] or _dtype(t) != _dtype(call) for t in (gamma, beta)):
            return call
        op, args = VendorOp("layer_norm", eps=float(a.epsilon)), [x, gamma, beta]
        add = self._single(x, "relax.add")
        # either addend may be a constant of the whole shape (an encoder's position
        # embeddings added to its token embeddings: a TVM kernel of its own, 0.05 ms on two
        # threads); a broadcast one (a bias) stays a TVM kernel
        if add is not None and all(_shape(t) == shape and _dtype(t) == _dtype(call)
                                   for t in add.args):
            op, args = replace(op, residual=True), [add.args[0], gamma, beta, add.args[1]]
        return _vendor_call(op, args, call.ty)

    def absorb_bias(self, call: relax.Call) -> relax.Expr:
        for inner, const in (call.args, call.args[::-1]):
            op, args = self.vendor(inner)
            if (op is None or op.kind != "matmul" or op.bias or op.act
                    or not _is_const(const) or _dtype(const) != _dtype(call)):
                continue
            shape = _shape(call)
            if shape is None:
                continue
            n = shape[-1]
            c = _numpy(const)
            if c.size != n or c.shape[-1] != n:
                continue
            return _vendor_call(replace(op, bias=True), args + [relax.const(c.reshape(n))],
                                call.ty)
        return call


def _free_uses(func: relax.Function) -> list[relax.Var]:
    """Every variable occurrence in the bindings' values and the function's result. TVM's
    own post-order walk, not a ``PyExprVisitor``: a visitor class made per call (and its
    instances, which the C++ side keeps alive) leaked 0.5-2 MiB a build
    (`benchmarks/longrun.py`'s build cycles)."""
    found: list[relax.Var] = []

    def note(e: relax.Expr) -> None:
        if isinstance(e, relax.Var):  # DataflowVar too
            found.append(e)

    for block in func.body.blocks:
        for b in block.bindings:
            relax.analysis.post_order_visit(b.value, note)
    relax.analysis.post_order_visit(func.body.body, note)
    return found


def _affine_step(name: str, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(factor, offset)`` with ``op(y, c) = y * factor + offset`` per channel, for the affine
    operator ``name`` (add, subtract, multiply, divide) of a per-channel constant ``c``."""
    ones, zeros = np.ones_like(c), np.zeros_like(c)
    return {"relax.add": (ones, c), "relax.subtract": (ones, -c),
            "relax.multiply": (c, zeros)}.get(name, (1.0 / c, zeros))


def _channel_axis(op: VendorOp) -> int:
    """The channel axis of a vendor convolution's or pool's output (the concat's own axis)."""
    if op.kind == "concat":
        return op.axis
    return 1 if op.layout == "NCHW" else 3


def _scaled(op: VendorOp, args: list[relax.Expr], factor: np.ndarray, offset: np.ndarray,
            dtype: str) -> tuple[VendorOp, list[relax.Expr]]:
    """A vendor convolution (its weight's output channels scaled, its bias shifted) or average
    pool (an affine epilogue) followed by ``y * factor + offset`` per channel, as one call."""
    channels = len(factor)
    if op.kind == "conv2d":  # the weight's output channels scaled
        w = _numpy(args[1]).astype(np.float64)
        first = w * factor.reshape((-1,) + (1,) * (w.ndim - 1))
    else:  # the pool's epilogue scale
        first = (_numpy(args[1]).astype(np.float64) if op.bias else np.ones(channels)) * factor
    b = (_numpy(args[2]).astype(np.float64) if op.bias else np.zeros(channels)) * factor
    return replace(op, bias=True), [args[0], relax.const(first.astype(dtype)),
                                    relax.const((b + offset).astype(dtype))]


def _per_channel(c: np.ndarray, out_shape: tuple[int, ...], axis: int) -> np.ndarray | None:
    """``c`` as a float64 vector over the channel axis if it varies along that axis only."""
    channels = out_shape[axis]
    if c.ndim > len(out_shape):
        return None
    full = (1,) * (len(out_shape) - c.ndim) + c.shape
    if any(d != 1 and (i != axis or d != channels) for i, d in enumerate(full)):
        return None
    return np.broadcast_to(c.reshape(-1), (channels,)).astype(np.float64)


def _vendor_call(op: VendorOp, args: list[relax.Expr], ty) -> relax.Call:
    return relax.call_dps_packed(relax.ExternFunc(op.name), relax.Tuple(args), out_ty=ty)


def _vendor(call: relax.Call) -> tuple[VendorOp, list[relax.Expr]]:
    """`_unpack` of a call known to be a vendor call."""
    op, args = _unpack(call)
    if op is None:
        raise ValueError(f"not a vendor call: {call}")
    return op, args


def _unpack(expr: relax.Expr) -> tuple[VendorOp | None, list[relax.Expr]]:
    """The `VendorOp` and argument list of a vendor ``call_dps_packed``, else (None, [])."""
    if (isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op)
            and expr.op.name == "relax.call_dps_packed"
            and isinstance(expr.args[0], relax.ExternFunc)
            and is_vendor_name(str(expr.args[0].global_symbol))):
        return VendorOp.from_name(str(expr.args[0].global_symbol)), list(expr.args[1].fields)
    return None, []


def _rewrite_all(func: relax.Function, dtypes: tuple[str, ...]) -> relax.Function:
    """Dispatch, then absorb what follows each call in chain order: the per-channel affine ops
    (one per round, until none is left), a matmul bias, a residual add, an activation."""
    conv = ("relax.nn.conv2d",)
    act = tuple(ACTIVATIONS)

    def apply(ops: tuple[str, ...], method: str, arity: int) -> bool:
        nonlocal func
        func, changed = _rewrite_calls(func, ops, arity,
                                       getattr(_Rewriter(func, dtypes), method))
        return changed

    func = _merge_duplicates(func)
    apply(conv, "conv", 2)
    apply(("relax.matmul",), "matmul", 2)
    if "float16" not in dtypes:  # the CPU (TVM's concat is a scheduled kernel on a GPU)
        apply(("relax.concat",), "concat", 1)
        apply(("relax.nn.softmax",), "softmax", 1)
        apply(("relax.nn.max_pool2d", "relax.nn.avg_pool2d"), "pool", 1)
        apply(("relax.nn.layer_norm",), "layer_norm", 3)
        apply(("relax.mean",), "mean", 1)
    for _ in range(16):  # batch norm leaves 4 affine ops after a conv
        if not apply(_AFFINE, "absorb_affine", 2):
            break
    for ops, method, arity in ((("relax.add",), "absorb_bias", 2),
                               (("relax.add",), "absorb_residual", 2),
                               (act, "absorb_activation", 1),
                               (("relax.clip",), "absorb_clip", 3),
                               (("relax.multiply",), "absorb_gate", 2),
                               (("relax.multiply",), "absorb_erf_gelu", 2),
                               (("relax.multiply",), "absorb_tanh_gelu", 2)):
        apply(ops, method, arity)
    if "float16" not in dtypes:  # the CPU: name each constant weight, for packing
        func, _ = _rewrite_calls(func, ("relax.call_dps_packed",), 2, _tag_weight)
    return func


class _Bound:
    """What a rewrite returns for a call that becomes several: ``calls`` (each with its type)
    bound to new variables first, then ``make`` of those variables in the call's place (a
    vendor call reshaped back; a concatenation of convolutions that each took an epilogue)."""

    def __init__(self, calls: list[tuple[relax.Call, relax.TensorType]],
                 make: Callable[[list[relax.Var]], relax.Expr]) -> None:
        self.calls, self.make = calls, make

    @classmethod
    def reshaped(cls, call: relax.Call, ty: relax.TensorType, shape: relax.Expr) -> _Bound:
        """``reshape(call, shape)``, ``call`` (of type ``ty``) bound first."""
        return cls([(call, ty)], lambda v: relax.op.reshape(v[0], shape))

    def same_as(self, other: object) -> bool:
        return False


def _rewrite_calls(func: relax.Function, ops: tuple[str, ...], arity: int,
                   rewrite: Callable[[relax.Call], relax.Expr | _Bound],
                   ) -> tuple[relax.Function, bool]:
    """``func`` with each binding to a call of one of ``ops`` (with ``arity`` arguments) bound
    to what ``rewrite`` makes of it instead, and the bindings left unread removed; and whether
    anything changed. One walk over the bindings: TVM's `rewrite_call` took 0.65 s a pattern
    on NASNet-A large's 5,000 bindings (10 of a 26 s build), this takes milliseconds. Each
    rewrite keeps its call's type, so every reader of the variable stays well typed."""
    changed = False
    blocks = []
    for block in func.body.blocks:
        bindings = []
        for b in block.bindings:
            value = b.value
            if (isinstance(b, relax.VarBinding) and isinstance(value, relax.Call)
                    and isinstance(value.op, tvm.ir.Op) and value.op.name in ops
                    and len(value.args) == arity):
                new = rewrite(value)
                if not new.same_as(value):
                    if isinstance(new, _Bound):  # its calls bound first
                        kind = (relax.DataflowVar if isinstance(b.var, relax.DataflowVar)
                                else relax.Var)
                        inner = []
                        for i, (part, ty) in enumerate(new.calls):
                            inner.append(kind(f"{b.var.name}_pre{i or ''}", ty))
                            bindings.append(relax.VarBinding(inner[-1], part, b.span))
                        new = new.make(inner)
                    b, changed = relax.VarBinding(b.var, new, b.span), True
            bindings.append(b)
        blocks.append(type(block)(bindings, block.span))
    if not changed:
        return func, False
    return relax.analysis.remove_all_unused(_with_body(func, blocks, func.body.body)), True


def _with_body(func: relax.Function, blocks: list, result: relax.Expr) -> relax.Function:
    """``func`` with these binding blocks and this result."""
    return relax.Function(func.params, relax.SeqExpr(blocks, result, func.body.span),
                          func.ret_ty, func.is_pure, func.attrs, func.span)


def _merge_duplicates(func: relax.Function) -> relax.Function:
    """``func`` with each dataflow binding that recomputes an earlier one (the same operator,
    attributes and arguments) read from the earlier one instead. NASNet-A's cells apply one
    ReLU or pooling to a tensor up to five times (78 such bindings in the mobile model); with
    one left, the activation has a single reader and is absorbed into the kernel before it.
    ``func`` is returned as it is where a renamed variable is read by a kind of expression
    that `_renamed` does not look into (none is after `prepare`)."""
    alias: dict[relax.Var, relax.Var] = {}
    first: dict[tuple, list[relax.VarBinding]] = {}
    blocks = []
    for block in func.body.blocks:
        bindings = []
        for b in block.bindings:
            if not isinstance(b, relax.VarBinding):
                return func
            value = _renamed(b.value, alias)
            if value is None:
                return func
            if not value.same_as(b.value):
                b = relax.VarBinding(b.var, value, b.span)
            key = _call_key(value) if isinstance(block, relax.DataflowBlock) else None
            if key is not None and isinstance(b.var, relax.DataflowVar):
                same = next((e for e in first.get(key, ())
                             if tvm_ffi.structural_equal(e.value, value)), None)
                if same is not None:
                    alias[b.var] = same.var
                    continue
                first.setdefault(key, []).append(b)
            bindings.append(b)
        blocks.append(type(block)(bindings, block.span))
    body = _renamed(func.body.body, alias)
    if not alias or body is None:
        return func
    return _with_body(func, blocks, body)


def _call_key(value: relax.Expr) -> tuple | None:
    """What two calls of one operator on the same variables share (None for other values)."""
    if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)):
        return None
    args: list = []
    for a in value.args:
        fields = a.fields if isinstance(a, relax.Tuple) else [a]
        if not all(isinstance(f, relax.Var) for f in fields):
            return None  # constants are compared by content, only where the rest agree
        args.append(tuple(fields))
    return (value.op.name, tuple(args))


def _renamed(expr: relax.Expr, alias: dict[relax.Var, relax.Var]) -> relax.Expr | None:
    """``expr`` with the variables it reads renamed by ``alias`` (through tuples, tuple items
    and calls); None where it would have to look into another kind of expression."""
    if isinstance(expr, relax.Var):
        return alias.get(expr, expr)
    if isinstance(expr, relax.TupleGetItem):
        inner = _renamed(expr.tuple_value, alias)
        return None if inner is None else (
            expr if inner.same_as(expr.tuple_value) else
            relax.TupleGetItem(inner, expr.index, expr.span))
    if isinstance(expr, (relax.Tuple, relax.Call)):
        parts = list(expr.fields if isinstance(expr, relax.Tuple) else expr.args)
        new = [_renamed(a, alias) for a in parts]
        if any(a is None for a in new):
            return None
        if all(a.same_as(b) for a, b in zip(new, parts, strict=True)):  # type: ignore[union-attr]
            return expr
        if isinstance(expr, relax.Tuple):
            return relax.Tuple(new, expr.span)
        return relax.Call(expr.op, new, expr.attrs, expr.ty_args, expr.span, ret_ty=expr.ty)
    if isinstance(expr, Constant):
        return expr
    try:  # anything else is kept as it is if it reads no renamed variable
        reads = relax.analysis.free_vars(expr)
    except Exception:  # noqa: BLE001 - not an expression the analysis knows
        return None
    return None if any(v in alias for v in reads) else expr


def _tag_weight(call: relax.Call) -> relax.Expr:
    op, args = _unpack(call)
    if op is None or op.kind not in ("conv2d", "matmul") or op.weight or not _is_const(args[1]):
        return call
    arr = np.ascontiguousarray(_numpy(args[1]))
    digest = hashlib.blake2b(arr.tobytes(), digest_size=8)
    digest.update(f"{arr.dtype}{arr.shape}".encode())
    return _vendor_call(replace(op, weight=digest.hexdigest()), args, call.ty)


def _to_channels_last(mod: tvm.IRModule) -> tvm.IRModule:
    """NHWC activations and OHWI weights for every convolution (weights transposed once).

    TVM's ``ConvertLayout`` has no layout rule for ``clip``: it put every ReLU6 back in NCHW
    between two transposes (MobileNetV2: 34 such kernels, 12 of its 20 ms). Clips are
    written as ``minimum(maximum(x, lo), hi)``, which it converts, and read back after."""
    mod = mod.clone()
    mod["main"], _ = _rewrite_calls(mod["main"], ("relax.clip",), 3, _clip_as_bounds)
    mod = relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "OHWI"]})(mod)
    mod["main"], _ = _rewrite_calls(mod["main"], ("relax.minimum",), 2,
                                    _Bounds(mod["main"]).as_clip)
    return prepare(mod)  # folds the weight transposes ConvertLayout inserted


def _clip_as_bounds(call: relax.Call) -> relax.Expr:
    bounds, x = _clip_bounds(call), call.args[0]
    if bounds is None or _dtype(x) not in ("float32", "float16"):
        return call
    lo, hi = (relax.const(np.array(v, _dtype(x))) for v in bounds)
    return relax.op.minimum(relax.op.maximum(x, lo), hi)


class _Bounds:
    """``minimum(maximum(x, lo), hi)`` with scalar constant bounds (the maximum read only
    there) -> ``clip(x, lo, hi)``: what `_clip_as_bounds` wrote, back after the layout
    change."""

    def __init__(self, func: relax.Function) -> None:
        self.rewriter = _Rewriter(func, ())

    def as_clip(self, call: relax.Call) -> relax.Expr:
        inner, hi = call.args
        low = self.rewriter._single(inner, "relax.maximum")
        if low is None:
            return call
        x, lo = low.args
        lo_v, hi_v = _scalar(lo), _scalar(hi)
        if (lo_v is None or hi_v is None or not _is_const(lo) or not _is_const(hi)
                or _shape(x) != _shape(call) or lo_v > hi_v):
            return call
        return relax.op.clip(x, lo_v, hi_v)


def dispatch_to_vendor(mod: tvm.IRModule, target: tvm.target.Target,
                       layout: str | None = None) -> tvm.IRModule:
    """Replace conv2d / matmul / batched matmul patterns in ``mod["main"]`` by vendor calls.

    ``layout`` is the convolution layout to run in: "NHWC" (the CPU default: the graph is
    converted with ``ConvertLayout`` first) or "NCHW" (the GPU default). Every vendor function
    the result calls is registered. Without PyTorch this warns and returns ``mod`` unchanged,
    so that TVM's kernels are used.
    """
    if not torch_available():
        warnings.warn("vendor kernels need PyTorch, which is not installed "
                      "(`pip install paragraph[torch]`); using TVM's kernels",
                      RuntimeWarning, stacklevel=2)
        return mod
    gpu = target.kind.name == "cuda"
    if gpu and not require_torch().cuda.is_available():
        warnings.warn("this PyTorch has no CUDA (or sees no GPU): vendor kernels cannot run on "
                      "the GPU; using TVM's kernels", RuntimeWarning, stacklevel=2)
        return mod
    if target.kind.name not in ("llvm", "cuda"):
        warnings.warn(f"no vendor kernels for target {target.kind.name}; using TVM's kernels",
                      RuntimeWarning, stacklevel=2)
        return mod
    layout = layout or ("NCHW" if gpu else "NHWC")
    if layout == "NHWC" and _has_conv(mod):
        mod = _to_channels_last(mod)
    dtypes = ("float32", "float16") if gpu else ("float32",)
    mod = mod.clone()
    mod["main"] = _rewrite_all(mod["main"], dtypes)
    mod = relax.transform.DeadCodeElimination()(mod)
    for name in vendor_names(mod):
        ensure_registered(name)
    return mod


def _has_conv(mod: tvm.IRModule) -> bool:
    return any(isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)
               and b.value.op.name == "relax.nn.conv2d"
               for block in mod["main"].body.blocks for b in block.bindings)


def vendor_names(mod: tvm.IRModule) -> list[str]:
    """The vendor functions ``mod["main"]`` calls, in first-call order."""
    names: dict[str, None] = {}
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            op, _ = _unpack(b.value)
            if op is not None:
                names[op.name] = None
    return list(names)


@tvm.transform.module_pass(opt_level=0, name="VendorDispatch")
class VendorDispatch:
    """Relax pass: vendor-library dispatch (the ``partition_for_cudnn`` / ``CublasDispatch``
    mechanism, backed by PyTorch's oneDNN/MKL/cuDNN/cuBLAS); see `dispatch_to_vendor`."""

    def __init__(self, target: tvm.target.Target | None = None, layout: str | None = None):
        self.target, self.layout = target, layout

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        target = self.target or tvm.target.Target.current() or tvm.target.Target("llvm")
        return dispatch_to_vendor(mod, target, self.layout)


# ---------------------------------------------------------------------------- undispatch
def to_relax_ops(call: relax.Call) -> relax.Expr:
    """The TVM-kernel form of a vendor call: the same maths as plain Relax operators (weights
    already folded), which TVM's legalization and fusion turn into one fused kernel."""
    op, args = _vendor(call)
    if op.kind == "concat":
        y = relax.op.concat(args, axis=op.axis)
    elif op.kind == "softmax":
        x = args[0]
        if op.scale != 1.0:
            x = relax.op.multiply(x, relax.const(np.float32(op.scale), _dtype(x)))
        y = relax.op.nn.softmax(x, axis=op.axis)
    elif op.kind in POOLS:
        pool = relax.op.nn.max_pool2d if op.kind == "max_pool2d" else relax.op.nn.avg_pool2d
        y = pool(args[0], op.window, op.stride, list(op.pads),
                 count_include_pad=op.include_pad, layout="NHWC")
        if op.bias:  # the affine epilogue, per channel (NHWC)
            y = relax.op.add(relax.op.multiply(y, args[1]), args[2])
    elif op.kind == "layer_norm":
        x = relax.op.add(args[0], args[3]) if op.residual else args[0]
        y = relax.op.nn.layer_norm(x, args[1], args[2], axes=[-1], epsilon=op.eps)
    elif op.kind == "conv2d":
        x = args[0]
        if op.layout == "NCHW2NHWC":
            x = relax.op.permute_dims(x, [0, 2, 3, 1])
        layout = "NCHW" if op.layout == "NCHW" else "NHWC"
        y = relax.op.nn.conv2d(x, args[1], strides=op.stride,
                               padding=list(op.pads), dilation=op.dilation,
                               groups=op.groups, data_layout=layout,
                               kernel_layout="OIHW" if layout == "NCHW" else "OHWI")
        if op.bias:
            b = _numpy(args[2])
            shape = (1, -1, 1, 1) if op.layout == "NCHW" else (-1,)
            y = relax.op.add(y, relax.const(b.reshape(shape)))
        if op.residual:
            y = relax.op.add(y, args[2 + op.bias])
    else:
        y = relax.op.matmul(args[0], args[1])
        if op.bias:
            y = relax.op.add(y, args[2])
    # the output's dtype is its input's (a dispatched call's may not be normalised yet)
    return _activated(y, op.act, _dtype(args[0])) if op.act else y


def _activated(y: relax.Expr, act: str, dtype: str) -> relax.Expr:
    """``act`` (one of `EPILOGUES`) applied to ``y`` (of ``dtype``) as Relax operators."""
    if act in ("relu6", "hardsigmoid", "hardswish"):
        base = y if act == "relu6" else relax.op.add(y, relax.const(np.array(3.0, dtype)))
        clipped = relax.op.clip(base, 0, 6)
        if act == "relu6":
            return clipped
        gate = relax.op.divide(clipped, relax.const(np.array(6.0, dtype)))
        return gate if act == "hardsigmoid" else relax.op.multiply(y, gate)
    if act == "sigmoid":
        return relax.op.sigmoid(y)
    return getattr(relax.op.nn, act)(y)  # relu, silu, gelu, gelu_tanh


def undispatch(mod: tvm.IRModule, keep: Callable[[relax.Call], bool]) -> tvm.IRModule:
    """``mod`` with every vendor call for which ``keep(call)`` is false turned back into Relax
    operators (`to_relax_ops`)."""
    pattern = wildcard()

    def rewrite(call, matchings):
        op, _ = _unpack(call)
        return call if op is None or keep(call) else to_relax_ops(call)

    mod = mod.clone()
    mod["main"] = rewrite_call(pattern, rewrite, mod["main"])
    return relax.transform.DeadCodeElimination()(relax.transform.Normalize()(mod))


def signature(call: relax.Call) -> tuple:
    """What a vendor call's cost depends on: its function name (less the weight digest) and
    argument types."""
    op, args = _vendor(call)
    return (op.cost_name, tuple((_shape(a), _dtype(a)) for a in args))


def vendor_calls(mod: tvm.IRModule) -> list[relax.Call]:
    """The vendor calls of ``mod["main"]``, in order."""
    return [b.value for block in mod["main"].body.blocks for b in block.bindings
            if _unpack(b.value)[0] is not None]


def tvm_alternatives(mod: tvm.IRModule) -> tvm.IRModule | None:
    """The TVM form of each distinct vendor call of a dispatched ``mod``, as one module (what
    `choose_fastest` weighs the vendor calls against; ``paragraph tune --kernels auto`` tunes
    it), or None when ``mod`` calls no vendor function."""
    calls: dict[tuple, relax.Call] = {}
    for call in vendor_calls(mod):
        calls.setdefault(signature(call), call)
    return probe_module(list(calls.values()), tvm_form=True) if calls else None


def probe_module(calls: list[relax.Call], tvm_form: bool) -> tvm.IRModule:
    """One function computing every call once from fresh inputs (weights stay constants, as in
    the model, so TVM fuses the same kernels); output i is call i."""
    bb = relax.BlockBuilder()
    params, bodies = [], []
    for i, call in enumerate(calls):
        op, args = _vendor(call)
        new_args = []
        for j, a in enumerate(args):
            if _is_const(a):
                new_args.append(a)
            else:
                params.append(relax.Var(f"in{i}_{j}", a.ty))
                new_args.append(params[-1])
        bodies.append(_vendor_call(op, new_args, call.ty))
    with bb.function("main", params):
        with bb.dataflow():
            outs = [bb.emit(to_relax_ops(c) if tvm_form else c) for c in bodies]
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    return bb.get()
