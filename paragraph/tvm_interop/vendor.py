"""Vendor kernels: convolutions and matrix products through the libraries PyTorch ships.

The TVM wheel has neither cuDNN nor cuBLAS, so paragraph reaches vendor libraries the way TVM's
own BYOC backends do (``relax.backend.cuda.cudnn.partition_for_cudnn``): a Relax pass,
`VendorDispatch`, replaces matched operator patterns with ``R.call_dps_packed`` calls to global
functions that paragraph registers under ``paragraph.vendor.``, and those functions run the
kernels with PyTorch (oneDNN and MKL on the CPU, cuDNN and cuBLAS on CUDA) on the TVM tensors
themselves (DLPack, no copy in or out).

Patterns (after `importers.prepare`, batch norm is a chain of per-channel constant ops):

* ``conv2d(x, W)`` with a constant weight, then any chain of per-output-channel constant
  ``add``/``subtract``/``multiply``/``divide`` (folded into the weight and a bias, in numpy),
  then optionally a residual ``add`` of a tensor of the output's shape, then optionally ``relu``;
* ``matmul(a, B)`` with a 2-D ``B`` (``linear``), then optionally a constant bias ``add`` and a
  ``relu``/``gelu``/``gelu_tanh``; and batched ``matmul`` of equal-rank operands (``bmm``);
* on the CPU, ``concat`` of static-shape tensors (a concat of a concat along the same axis,
  read only there, is flattened into one), then optionally ``relu``: ``torch.cat(out=)`` copied
  an Inception block's channels 6x faster than TVM's untuned concatenate kernel, which sits on
  the critical path of every block.

What a call needs beyond its tensors (strides, padding, fused ops, layout) is in the function
name, e.g. ``paragraph.vendor.conv2d.NHWC.s2x2.p1x1.d1x1.g1.bias.relu``; `ensure_registered`
turns any such name back into a kernel, so a compiled program can be loaded in a fresh process.

CPU. Convolutions run in NHWC: oneDNN's NCHW convolutions reorder every activation and were
1.6x slower on this machine (notes/measured.md), so the pass first puts the graph in NHWC with
TVM's ``ConvertLayout`` (weights are transposed once, at compile time). A convolution writes
straight into the output buffer with oneDNN's in-place "add" post-op (the buffer is zeroed first,
or holds the residual: torch has no ``out=`` convolution that does not allocate and copy), with
its weight reordered once into oneDNN's blocked format and cached under the weight's digest,
which the function name carries. A product with a constant matrix runs the same way, as a 1x1
convolution (oneDNN's GEMM was 2.5x faster than MKL's on this AMD CPU); other products use
MKL's ``out=`` forms. The executor binds each kernel to its tensors once (`bind`): the torch
views (DLPack, layout permutes) are made then, not on every call. Each call sets
torch's thread count for the calling thread to the one the executor gave its stream
(``torch.set_num_threads`` is per thread for OpenMP and MKL). On a shared machine, run with
``OMP_WAIT_POLICY=PASSIVE`` (before Python starts): libgomp's spinning barriers made 2-thread
convolutions 100x slower here whenever another process held a core.

CUDA. Calls run on the stream TVM's kernels use at that moment (the executor sets it per
schedule stream), through ``torch.cuda.ExternalStream``. cuDNN convolutions return a new tensor,
copied into the output together with the activation; cuBLAS products write in place. CUDA Graph
capture relies on the executor issuing every kernel once before capturing: cuDNN/cuBLAS
workspaces and the convolution results then come from torch's caching allocator without a
``cudaMalloc`` during capture (do not call ``torch.cuda.empty_cache()`` while a captured
executor lives: the graph keeps using those blocks).
"""

from __future__ import annotations

import hashlib
import os
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.ir.expr import Constant
from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

from paragraph.errors import ParagraphError

PREFIX = "paragraph.vendor."
KERNEL_SOURCES = ("tvm", "vendor", "auto")
ACTIVATIONS = {"relax.nn.relu": "relu", "relax.nn.gelu": "gelu", "relax.nn.gelu_tanh": "gelu_tanh"}
_AFFINE = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide")


class VendorUnavailableError(ParagraphError):
    """Vendor kernels were asked for where PyTorch (or its CUDA build) is missing."""


# ---------------------------------------------------------------------------- naming
@dataclass(frozen=True)
class VendorOp:
    """Everything a vendor call needs besides its tensors; its `name` is the function name."""

    kind: str  # conv2d | matmul | bmm | concat
    layout: str = ""  # conv2d: NCHW (weights OIHW) or NHWC (weights OHWI)
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, ...] = (0, 0)  # (top, left) if symmetric, else (top, left, bottom, right)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1
    bias: bool = False
    residual: bool = False
    act: str | None = None
    weight: str = ""  # CPU: digest of the constant weight, whose packed form is cached
    axis: int = 0  # concat: the axis joined along

    @property
    def name(self) -> str:
        return self.cost_name + (f".w{self.weight}" if self.weight else "")

    @property
    def cost_name(self) -> str:
        """The name without the weight digest: what the call costs depends on."""
        parts = [self.kind]
        if self.kind == "conv2d":
            parts += [self.layout, _dims("s", self.stride), _dims("p", self.padding),
                      _dims("d", self.dilation), f"g{self.groups}"]
        elif self.kind == "concat":
            parts.append(f"a{self.axis}")
        parts += ["bias"] * self.bias + ["res"] * self.residual + [self.act] * bool(self.act)
        return PREFIX + ".".join(parts)

    @classmethod
    def from_name(cls, name: str) -> VendorOp:
        """Parse a name made by `name`; raises `ParagraphError` for anything else."""
        parts = name[len(PREFIX):].split(".") if name.startswith(PREFIX) else []
        if not parts or parts[0] not in ("conv2d", "matmul", "bmm", "concat"):
            raise ParagraphError(f"{name!r} is not a paragraph vendor kernel")
        op = cls(parts[0])
        rest = parts[1:]
        if op.kind == "conv2d":
            if len(rest) < 5 or rest[0] not in ("NCHW", "NHWC"):
                raise ParagraphError(f"malformed vendor convolution name {name!r}")
            fields = [re.fullmatch(rf"{k}(\d+(?:x\d+)+)", p) for k, p in zip("spd", rest[1:4])]
            group = re.fullmatch(r"g(\d+)", rest[4])
            if not all(fields) or group is None:
                raise ParagraphError(f"malformed vendor convolution name {name!r}")
            s, p, d = (tuple(int(v) for v in m[1].split("x")) for m in fields)
            if len(s) != 2 or len(d) != 2 or len(p) not in (2, 4):
                raise ParagraphError(f"malformed vendor convolution name {name!r}")
            op = replace(op, layout=rest[0], stride=s, padding=p, dilation=d,
                         groups=int(group[1]))
            rest = rest[5:]
        elif op.kind == "concat":
            axis = re.fullmatch(r"a(\d+)", rest[0]) if rest else None
            if axis is None:
                raise ParagraphError(f"malformed vendor concat name {name!r}")
            op, rest = replace(op, axis=int(axis[1])), rest[1:]
        for flag in rest:
            if flag == "bias":
                op = replace(op, bias=True)
            elif flag == "res":
                op = replace(op, residual=True)
            elif flag in ACTIVATIONS.values():
                op = replace(op, act=flag)
            elif op.kind in ("conv2d", "matmul") and re.fullmatch(r"w[0-9a-f]+", flag):
                op = replace(op, weight=flag[1:])
            else:
                raise ParagraphError(f"unknown part {flag!r} in vendor kernel name {name!r}")
        return op


def _dims(letter: str, values: tuple[int, ...]) -> str:
    return letter + "x".join(map(str, values))


def is_vendor_name(name: str) -> bool:
    return name.startswith(PREFIX)


def cost_name(name: str) -> str:
    """A vendor function's name without its weight digest (a cost key: the time of a call does
    not depend on the weight's values); other names unchanged."""
    return VendorOp.from_name(name).cost_name if is_vendor_name(name) else name


def vendor_flops(name: str, in_shapes: list[tuple[int, ...]],
                 out_shapes: list[tuple[int, ...]]) -> float:
    """Multiply-adds x 2 of a vendor call (what ``estimate_tir_flops`` gives TVM kernels)."""
    op = VendorOp.from_name(name)
    out = out_shapes[0]
    if op.kind == "concat":
        return 0.0
    if op.kind == "conv2d":
        w = in_shapes[1]  # OIHW or OHWI: the reduction is everything but O
        return 2.0 * float(np.prod(out)) * float(np.prod(w[1:]))
    return 2.0 * float(np.prod(out)) * float(in_shapes[0][-1])


# ---------------------------------------------------------------------------- torch side
def torch_available() -> bool:
    """Whether PyTorch imports here (vendor kernels need it)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def _torch():
    try:
        import torch
    except ImportError:
        raise VendorUnavailableError(
            "vendor kernels need PyTorch (`pip install paragraph[torch]`); use --kernels tvm"
        ) from None
    return torch


def _use_schedule_threads(torch) -> None:
    """Run this call with as many threads as the calling thread's TVM pool, which the executor
    sizes per stream (`executor._config_threads`): vendor and TVM kernels of one stream use the
    schedule's thread count. Threads that never sized a pool (the TVM VM's) use every core, as
    TVM's own pool does.

    The count is checked against torch's on every call, not cached per thread: with libgomp,
    ``torch.set_num_threads`` in one thread also changed the count other threads saw (a 1-thread
    stream made the TVM VM's vendor calls in the main thread single-threaded). Setting it only
    when it differs matters: it also clears oneDNN's primitive cache.
    """
    n = getattr(_executor_threads(), "threads", None) or _all_threads()
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


@cache
def _all_threads() -> int:
    from paragraph.machine import cpu_count

    return int(os.environ.get("TVM_NUM_THREADS") or cpu_count())


def _executor_threads():
    """The executor's per-thread record of its TVM pool size (imported late: the executor
    imports this module's users)."""
    global _EXECUTOR_LOCAL
    if _EXECUTOR_LOCAL is None:
        from paragraph.tvm_interop.executor import _local

        _EXECUTOR_LOCAL = _local
    return _EXECUTOR_LOCAL


_EXECUTOR_LOCAL = None
_external_streams: dict[tuple[int, int], object] = {}


def _tvm_stream(torch, tensor):
    """A torch stream context for TVM's current stream on the tensor's CUDA device: the stream
    the executor set with ``Device.set_raw_stream`` before this kernel."""
    dev = tensor.device
    handle = int(tvm_ffi.get_raw_stream(dev))
    key = (dev.index, handle)
    stream = _external_streams.get(key)
    if stream is None:
        device = torch.device("cuda", dev.index)
        stream = (torch.cuda.default_stream(device) if handle == 0
                  else torch.cuda.ExternalStream(handle, device=device))
        _external_streams[key] = stream
    return torch.cuda.stream(stream)


def _conv2d_kernel(op: VendorOp) -> Callable:
    torch = _torch()
    to_nchw = (lambda t: t.permute(0, 3, 1, 2)) if op.layout == "NHWC" else (lambda t: t)
    stride, dilation = list(op.stride), list(op.dilation)
    padding = list(op.padding[:2])
    # torch pads symmetrically; TF-style "same" padding (NASNet) is padded first, as a copy
    pre_pad = None
    if len(op.padding) == 4:
        top, left, bottom, right = op.padding
        pre_pad, padding = (left, right, top, bottom), [0, 0]
    in_place_add = torch.ops.mkldnn._convolution_pointwise_.binary
    conv2d = torch.nn.functional.conv2d
    packed: dict[tuple[int, ...], object] = {}  # (threads, *input shape) -> blocked weight

    def cpu_weight(w, x):
        """The weight in oneDNN's blocked format for this input shape and thread count,
        reordered once: a plain weight is reordered on every call (10-25% of Inception-v3's
        convolution time here), and so is one blocked for another thread count (oneDNN picks
        the format by threads: 1-thread calls on a 2-thread weight ran 3x slower). The name
        carries the weight's digest, so the cache follows content, not addresses."""
        if not op.weight:
            return w
        key = (torch.get_num_threads(), *x.shape)
        if key not in packed:
            packed[key] = torch._C._nn.mkldnn_reorder_conv2d_weight(
                w.to_mkldnn(), padding, stride, dilation, op.groups, list(x.shape))
        return packed[key]

    def bind(*args) -> Callable[[], None]:
        """The call on these tensors, with their torch views made once."""
        ts = [torch.from_dlpack(a) for a in args]
        x, w, out = to_nchw(ts[0]), to_nchw(ts[1]), to_nchw(ts[-1])
        bias = ts[2] if op.bias else None
        res = to_nchw(ts[2 + op.bias]) if op.residual else None

        def call() -> None:
            xp = x if pre_pad is None else torch.nn.functional.pad(x, pre_pad)
            if out.is_cuda:
                with _tvm_stream(torch, args[0]):
                    y = conv2d(xp, w, bias, stride, padding, dilation, op.groups)
                    if res is not None:
                        y.add_(res)
                    # cuDNN allocates the result: the copy into TVM's buffer carries the
                    # activation
                    if op.act == "relu":
                        torch.clamp_min(y, 0, out=out)
                    else:
                        out.copy_(y)
                return
            _use_schedule_threads(torch)
            # oneDNN computes out = act(conv(x) + bias + out) in place: out starts as 0 or
            # the residual
            if res is not None:
                out.copy_(res)
            else:
                out.zero_()
            in_place_add(out, xp, cpu_weight(w, xp), bias, padding, stride, dilation,
                         op.groups, "add", None, op.act, [], None)
        return call

    return bind


def _matmul_kernel(op: VendorOp) -> Callable:
    torch = _torch()
    gelu = torch._C._nn.gelu
    in_place_add = torch.ops.mkldnn._convolution_pointwise_.binary
    packed: dict[tuple[int, int], object] = {}  # (threads, rows) -> blocked 1x1 conv weight

    def activate(out) -> None:
        if op.act == "relu":
            out.relu_()
        elif op.act is not None:
            gelu(out, approximate="tanh" if op.act == "gelu_tanh" else "none", out=out)

    def gemm(rows, b, bias, out2) -> None:
        if bias is not None:
            torch.addmm(bias, rows, b, out=out2)
        else:
            torch.mm(rows, b, out=out2)
        activate(out2)

    def onednn(rows, b, bias, out2) -> None:
        """(M, K) @ (K, N) as a 1x1 convolution over M pixels in NHWC: oneDNN's packed GEMM
        written in place, 2.5x faster than MKL's sgemm on this (AMD) CPU; the weight, a
        constant, is transposed and reordered once per row count."""
        m, k = rows.shape
        n = out2.shape[1]
        key = (torch.get_num_threads(), m)  # the blocked format depends on both (see conv)
        if key not in packed:
            w = b.t().contiguous().view(n, k, 1, 1)
            packed[key] = torch._C._nn.mkldnn_reorder_conv2d_weight(
                w.to_mkldnn(), [0, 0], [1, 1], [1, 1], 1, [1, k, 1, m])
        x4 = rows.view(1, m, 1, k).permute(0, 3, 2, 1)
        out4 = out2.view(1, m, 1, n).permute(0, 3, 2, 1)
        out2.zero_()
        in_place_add(out4, x4, packed[key], bias, [0, 0], [1, 1], [1, 1], 1, "add", None,
                     "relu" if op.act == "relu" else None, [], None)
        if op.act not in (None, "relu"):  # oneDNN fuses only relu after its in-place add
            activate(out2)

    def run(a, b, bias, out, cpu: bool) -> None:
        if op.kind == "bmm":
            torch.bmm(a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:]),
                      out=out.view(-1, *out.shape[-2:]))
            activate(out)
            return
        # (..., K) @ (K, N): one GEMM over the flattened rows
        rows, out2 = a.reshape(-1, a.shape[-1]), out.view(-1, out.shape[-1])
        (onednn if cpu and op.weight else gemm)(rows, b, bias, out2)

    def bind(*args) -> Callable[[], None]:
        """The call on these tensors, with their torch views made once."""
        ts = [torch.from_dlpack(a) for a in args]
        bias = ts[2] if op.bias else None

        def call() -> None:
            if ts[-1].is_cuda:
                with _tvm_stream(torch, args[0]):
                    run(ts[0], ts[1], bias, ts[-1], cpu=False)
                return
            _use_schedule_threads(torch)
            run(ts[0], ts[1], bias, ts[-1], cpu=True)
        return call

    return bind


def _concat_kernel(op: VendorOp) -> Callable:
    torch = _torch()

    def bind(*args) -> Callable[[], None]:
        """The call on these tensors, with their torch views made once."""
        ts = [torch.from_dlpack(a) for a in args]
        parts, out = ts[:-1], ts[-1]

        def call() -> None:
            if out.is_cuda:
                with _tvm_stream(torch, args[0]):
                    torch.cat(parts, dim=op.axis, out=out)
            else:
                _use_schedule_threads(torch)
                torch.cat(parts, dim=op.axis, out=out)
            if op.act == "relu":
                out.relu_()
        return call

    return bind


_KERNELS = {"conv2d": _conv2d_kernel, "matmul": _matmul_kernel, "bmm": _matmul_kernel,
            "concat": _concat_kernel}


def ensure_registered(name: str) -> None:
    """Register the global function ``name`` (a `VendorOp` name) unless it exists; raises
    `VendorUnavailableError` without PyTorch."""
    if tvm_ffi.get_global_func(name, allow_missing=True) is not None:
        return
    op = VendorOp.from_name(name)
    binder = _KERNELS[op.kind](op)
    _BINDERS[name] = binder
    tvm_ffi.register_global_func(name, lambda *args: binder(*args)(), override=True)


_BINDERS: dict[str, Callable] = {}


def bind(name: str, args: tuple) -> Callable[[], None] | None:
    """Vendor kernel ``name`` bound to ``args``: a call with no arguments that reuses torch
    views of those tensors, which the executor makes once per kernel (its buffers never move).
    A call through the registered function makes them every time: from DLPack and the layout
    permutes take about 8 us, much of a small kernel's Python time, and the GIL is held
    throughout. None for a name registered elsewhere (or not yet), and on a GPU, whose path
    stays as captured in its CUDA Graphs."""
    binder = _BINDERS.get(name)
    if binder is None or any(a.device.dlpack_device_type() != tvm.cpu().dlpack_device_type()
                             for a in args):
        return None
    return binder(*args)


# ---------------------------------------------------------------------------- the pass
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


def _dtype(expr: relax.Expr) -> str:
    return str(expr.ty.dtype)


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
    def conv(self, call: relax.Call, m: dict) -> relax.Expr:
        a = call.attrs
        layout = str(a.data_layout)
        kernel_layout = {"NCHW": "OIHW", "NHWC": "OHWI"}.get(layout)
        pad = [int(p) for p in a.padding]
        x, w = call.args
        if (kernel_layout is None or str(a.kernel_layout) != kernel_layout
                or str(a.out_layout) != layout
                or _dtype(call) not in self.dtypes or _dtype(x) != _dtype(call)
                or _dtype(w) != _dtype(call) or _shape(call) is None or _shape(x) is None):
            return call
        symmetric = pad[:2] == pad[2:]
        op = VendorOp("conv2d", layout, tuple(int(s) for s in a.strides),
                      tuple(pad[:2] if symmetric else pad), tuple(int(d) for d in a.dilation),
                      int(a.groups))
        return _vendor_call(op, [x, w], call.ty)

    def absorb_affine(self, call: relax.Call, m: dict) -> relax.Expr:
        """``op(vendor conv, c)`` with a per-output-channel constant -> a new weight and bias."""
        inner, const = call.args
        if _is_const(inner):
            if call.op.name in ("relax.subtract", "relax.divide"):
                return call  # c - conv and c / conv are not affine in the weight
            inner, const = const, inner
        op, args = self.vendor(inner)
        if (op is None or op.kind != "conv2d" or op.residual or op.act
                or not _is_const(const) or _dtype(const) != _dtype(call)):
            return call
        axis = 1 if op.layout == "NCHW" else 3
        c = _per_channel(_numpy(const), _shape(call), axis)
        if c is None:
            return call
        w = _numpy(args[1]).astype(np.float64)
        b = _numpy(args[2]).astype(np.float64) if op.bias else np.zeros(len(c))
        name = call.op.name
        if name == "relax.add":
            b = b + c
        elif name == "relax.subtract":
            b = b - c
        else:
            scale = c if name == "relax.multiply" else 1.0 / c
            w = w * scale.reshape((-1,) + (1,) * (w.ndim - 1))
            b = b * scale
        dtype = _dtype(call)
        new_args = [args[0], relax.const(w.astype(dtype)), relax.const(b.astype(dtype))]
        return _vendor_call(replace(op, bias=True), new_args, call.ty)

    def absorb_residual(self, call: relax.Call, m: dict) -> relax.Expr:
        """``add(vendor conv, y)`` with ``y`` a tensor of the same type -> conv + residual."""
        for inner, other in (call.args, call.args[::-1]):
            op, args = self.vendor(inner)
            if (op is not None and op.kind == "conv2d" and not op.residual and not op.act
                    and not _is_const(other)
                    and _shape(other) == _shape(call) and _dtype(other) == _dtype(call)):
                return _vendor_call(replace(op, residual=True), args + [other], call.ty)
        return call

    def absorb_activation(self, call: relax.Call, m: dict) -> relax.Expr:
        act = ACTIVATIONS[call.op.name]
        op, args = self.vendor(call.args[0])
        if (op is None or op.act or op.kind == "bmm"
                or op.kind in ("conv2d", "concat") and act != "relu"):  # oneDNN: relu only
            return call
        return _vendor_call(replace(op, act=act), args, call.ty)

    # -- matmul
    def matmul(self, call: relax.Call, m: dict) -> relax.Expr:
        a, b = call.args
        sa, sb, so = _shape(a), _shape(b), _shape(call)
        if (None in (sa, sb, so) or _dtype(call) not in self.dtypes
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
    def concat(self, call: relax.Call, m: dict) -> relax.Expr:
        """``concat`` of static tensors, with any concat it reads only once along the same
        axis flattened into it."""
        if not isinstance(call.args[0], relax.Tuple) or _shape(call) is None:
            return call
        axis = int(call.attrs.axis) % len(_shape(call))
        parts: list[relax.Expr] = []
        for part in call.args[0].fields:
            inner = self.bound.get(part) if isinstance(part, relax.Var) else None
            if (self.uses.get(part, 0) == 1 and isinstance(inner, relax.Call)
                    and isinstance(inner.op, tvm.ir.Op) and inner.op.name == "relax.concat"
                    and isinstance(inner.args[0], relax.Tuple) and _shape(inner) is not None
                    and int(inner.attrs.axis) % len(_shape(inner)) == axis):
                parts += list(inner.args[0].fields)
            else:
                parts.append(part)
        if any(_shape(p) is None or _dtype(p) != _dtype(call) for p in parts) \
                or _dtype(call) not in self.dtypes:
            return call
        return _vendor_call(VendorOp("concat", axis=axis), parts, call.ty)

    def absorb_bias(self, call: relax.Call, m: dict) -> relax.Expr:
        for inner, const in (call.args, call.args[::-1]):
            op, args = self.vendor(inner)
            if (op is None or op.kind != "matmul" or op.bias or op.act
                    or not _is_const(const) or _dtype(const) != _dtype(call)):
                continue
            n = _shape(call)[-1]
            c = _numpy(const)
            if c.size != n or c.shape[-1] != n:
                continue
            return _vendor_call(replace(op, bias=True), args + [relax.const(c.reshape(n))],
                                call.ty)
        return call


def _free_uses(func: relax.Function) -> list[relax.Var]:
    """Every variable occurrence in the bindings' values and the function's result."""
    found: list[relax.Var] = []

    @relax.expr_functor.visitor
    class _Uses(relax.PyExprVisitor):
        def visit_var_(self, var):  # noqa: N802 (TVM's visitor names)
            found.append(var)

        def visit_dataflow_var_(self, var):  # noqa: N802
            found.append(var)

    visitor = _Uses()
    for block in func.body.blocks:
        for b in block.bindings:
            visitor.visit_expr(b.value)
    visitor.visit_expr(func.body.body)
    return found


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
    x, w = wildcard(), wildcard()
    affine = is_op(_AFFINE[0])(x, w)
    for name in _AFFINE[1:]:
        affine = affine | is_op(name)(x, w)
    act = is_op("relax.nn.relu")(x) | is_op("relax.nn.gelu")(x) | is_op("relax.nn.gelu_tanh")(x)
    add = is_op("relax.add")(x, w)

    def apply(pattern, method):
        return rewrite_call(pattern, _guard(getattr(_Rewriter(func, dtypes), method)), func)

    func = apply(is_op("relax.nn.conv2d")(x, is_const()), "conv")
    func = apply(is_op("relax.matmul")(x, w), "matmul")
    if "float16" not in dtypes:  # the CPU (TVM's concat is a scheduled kernel on a GPU)
        func = apply(is_op("relax.concat")(x), "concat")
    for _ in range(16):  # batch norm leaves 4 affine ops after a conv
        before, func = func, apply(affine, "absorb_affine")
        if tvm_ffi.structural_equal(before, func):
            break
    for pattern, method in ((add, "absorb_bias"), (add, "absorb_residual"),
                            (act, "absorb_activation")):
        func = apply(pattern, method)
    if "float16" not in dtypes:  # the CPU: name each constant weight, for packing
        func = rewrite_call(wildcard(), _tag_weight, func)
    return func


def _tag_weight(call, matchings) -> relax.Expr:
    op, args = _unpack(call)
    if op is None or op.kind not in ("conv2d", "matmul") or op.weight or not _is_const(args[1]):
        return call
    arr = np.ascontiguousarray(_numpy(args[1]))
    digest = hashlib.blake2b(arr.tobytes(), digest_size=8)
    digest.update(f"{arr.dtype}{arr.shape}".encode())
    return _vendor_call(replace(op, weight=digest.hexdigest()), args, call.ty)


def _guard(method: Callable) -> Callable:
    """A rewriter that only looks at calls of the right operator (patterns are alternations)."""
    def rewrite(call, matchings):
        return method(call, matchings) if isinstance(call, relax.Call) else call
    return rewrite


def _to_channels_last(mod: tvm.IRModule) -> tvm.IRModule:
    """NHWC activations and OHWI weights for every convolution (weights transposed once)."""
    from paragraph.tvm_interop.importers import prepare

    mod = relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "OHWI"]})(mod)
    return prepare(mod)  # folds the weight transposes ConvertLayout inserted


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
    if gpu and not _torch().cuda.is_available():
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
    op, args = _unpack(call)
    if op.kind == "concat":
        y = relax.op.concat(args, axis=op.axis)
    elif op.kind == "conv2d":
        y = relax.op.nn.conv2d(args[0], args[1], strides=op.stride,
                               padding=[*op.padding, *op.padding], dilation=op.dilation,
                               groups=op.groups, data_layout=op.layout,
                               kernel_layout="OIHW" if op.layout == "NCHW" else "OHWI")
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
    if op.act:
        y = getattr(relax.op.nn, op.act)(y)
    return y


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
    op, args = _unpack(call)
    return (op.cost_name, tuple((_shape(a), _dtype(a)) for a in args))


def vendor_calls(mod: tvm.IRModule) -> list[relax.Call]:
    """The vendor calls of ``mod["main"]``, in order."""
    return [b.value for block in mod["main"].body.blocks for b in block.bindings
            if _unpack(b.value)[0] is not None]


# ---------------------------------------------------------------------------- choice
def select_kernels(mod: tvm.IRModule, target: tvm.target.Target, kernels: str = "tvm", *,
                   tuning_db: str | None = None, cost_db=None,
                   log: Callable[[str], None] | None = None) -> tvm.IRModule:
    """``mod`` with its kernel source chosen: "tvm" (unchanged), "vendor" (`dispatch_to_vendor`)
    or "auto" (dispatched, then per distinct call the faster of vendor and TVM by measurement,
    see `choose_fastest`)."""
    if kernels not in KERNEL_SOURCES:
        raise ParagraphError(f"unknown kernel source {kernels!r}; choose from {KERNEL_SOURCES}")
    if kernels == "tvm":
        return mod
    dispatched = dispatch_to_vendor(mod, target)
    if kernels == "auto" and vendor_calls(dispatched):
        dispatched = choose_fastest(dispatched, target, tuning_db=tuning_db, db=cost_db,
                                    log=log)
    return dispatched


def choose_fastest(mod: tvm.IRModule, target: tvm.target.Target, *,
                   tuning_db: str | None = None, db=None, repeat: int = 5,
                   log: Callable[[str], None] | None = None) -> tvm.IRModule:
    """Keep each vendor call of ``mod`` only where it beats TVM's kernel for the same maths.

    Every distinct call (function name and argument types) is built twice into one probe
    module each: as the vendor call and as Relax operators that TVM fuses (with ``tuning_db``
    applied). Each kernel is timed once on the device with `measure.time_kernel` and recorded
    in the cost database (``db``, default `CostDB()`) under its source, "vendor" or "tvm"; a
    later choice with the same kernels reads the costs and compiles nothing. Cost is bounded
    by the number of distinct calls, not of calls.
    """
    from paragraph.tvm_interop.measure import CostDB

    db = db if db is not None else CostDB()
    calls: dict[tuple, relax.Call] = {}
    for call in vendor_calls(mod):
        calls.setdefault(signature(call), call)
    sigs = list(calls)
    cost = {}
    for source in ("vendor", "tvm"):
        probe = _probe_module([calls[s] for s in sigs], tvm_form=source == "tvm")
        cost[source] = _probe_costs(probe, target, source, tuning_db, db, repeat, log)
    keep = {s for s, v, t in zip(sigs, cost["vendor"], cost["tvm"]) if v <= t}
    if log is not None:
        log(f"  auto: {len(sigs)} distinct vendor-able kernels; vendor faster for {len(keep)}, "
            f"TVM for {len(sigs) - len(keep)} (vendor {sum(cost['vendor']) * 1e3:.2f} ms, "
            f"TVM {sum(cost['tvm']) * 1e3:.2f} ms, one of each)")
    return undispatch(mod, lambda call: signature(call) in keep)


def tvm_alternatives(mod: tvm.IRModule) -> tvm.IRModule | None:
    """The TVM form of each distinct vendor call of a dispatched ``mod``, as one module (what
    `choose_fastest` weighs the vendor calls against; ``paragraph tune --kernels auto`` tunes
    it), or None when ``mod`` calls no vendor function."""
    calls: dict[tuple, relax.Call] = {}
    for call in vendor_calls(mod):
        calls.setdefault(signature(call), call)
    return _probe_module(list(calls.values()), tvm_form=True) if calls else None


def _probe_module(calls: list[relax.Call], tvm_form: bool) -> tvm.IRModule:
    """One function computing every call once from fresh inputs (weights stay constants, as in
    the model, so TVM fuses the same kernels); output i is call i."""
    bb = relax.BlockBuilder()
    params, bodies = [], []
    for i, call in enumerate(calls):
        op, args = _unpack(call)
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


def _probe_costs(probe: tvm.IRModule, target: tvm.target.Target, source: str,
                 tuning_db: str | None, db, repeat: int, log) -> list[float]:
    """Seconds of each output of ``probe``: the sum of the kernels it needs (cached, or built
    once and timed one kernel at a time)."""
    from paragraph.machine import cpu_count
    from paragraph.schedule import Schedule, kernel_ids
    from paragraph.tvm_interop.executor import make_executor
    from paragraph.tvm_interop.kernels import KernelProgram, kernel_graph, lower
    from paragraph.tvm_interop.measure import kernel_key, time_kernel
    from paragraph.tvm_interop.tune import tuning_id

    graph = kernel_graph(lower(probe, target, tuning_db))
    threads = int(target.attrs.get("num-cores", cpu_count())) if target.kind.name == "llvm" else 1
    tuning = tuning_id(tuning_db)

    def key(k: int):
        return kernel_key(str(target), graph[k], tuning, threads)

    kernels = [k for k in kernel_ids(graph) if graph[k].kind == "kernel"]
    seconds = {k: db.get(key(k)) for k in kernels}
    missing = [k for k, v in seconds.items() if v is None]
    if missing:
        if log is not None:
            log(f"  auto: timing {len(missing)} {source} kernels ...")
        program = KernelProgram.build(probe, target, tuning_db=tuning_db)
        if [n.attrs.get("hash") for n in program.graph.nodes] != [
                n.attrs.get("hash") for n in graph.nodes]:
            raise ParagraphError("the probe module lowered differently twice")
        schedule = Schedule.build(program.graph, [kernel_ids(program.graph)], threads=threads)
        executor = make_executor(program, schedule, use_cuda_graph=False)
        sync = None if target.kind.name == "llvm" else program.device.sync
        try:
            for k in missing:
                timing = time_kernel(executor.steps[k], threads=threads, repeat=repeat,
                                     warmup=1, sync=sync)
                db.put(key(k), timing)
                seconds[k] = timing.median_ms / 1e3
        finally:
            executor.close()
    result = []
    for ref in graph.outputs:
        needed = graph.ancestors(ref.node) | {ref.node}
        result.append(sum(seconds.get(k, 0.0) for k in needed))
    return result


__all__ = ["VendorDispatch", "VendorOp", "dispatch_to_vendor", "ensure_registered",
           "undispatch", "to_relax_ops", "torch_available", "vendor_flops", "vendor_names",
           "VendorUnavailableError", "KERNEL_SOURCES", "PREFIX", "select_kernels",
           "choose_fastest", "signature", "vendor_calls", "tvm_alternatives"]
