"""The vendor kernels themselves: PyTorch's oneDNN/MKL (CPU) and cuDNN/cuBLAS (CUDA) calls on
TVM's tensors, registered as global functions under their `VendorOp` names
(`ensure_registered`) and bound to an executor's buffers once (`bind`)."""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import statistics
import time
from collections.abc import Callable, Iterator
from functools import cache, partial
from typing import Any

import numpy as np
import tvm
import tvm_ffi

from paragraph.errors import ParagraphError
from paragraph.machine import cpu_count
from paragraph.timing import clearly_faster
from paragraph.tvm_interop.runtime.library.names import EPILOGUES, VendorOp, is_vendor_name
from paragraph.tvm_interop.runtime.threads import configured_threads


class VendorUnavailableError(ParagraphError):
    """Vendor kernels were asked for where PyTorch (or its CUDA build) is missing."""



def torch_available() -> bool:
    """Whether PyTorch imports here (vendor kernels need it)."""
    try:
        import torch  # noqa: F401  (optional, the torch extra; and 1.7 s to import)
    except ImportError:
        return False
    return True


def default_kernels(target_kind: str, tuning_db: object = None) -> str:
    """The kernel source a user gets without ``--kernels``: the fastest available here.
    Vendor kernels where PyTorch is installed (with CUDA for a CUDA target): untuned TVM CPU
    kernels are 10-100x slower than oneDNN's; ``auto`` when a tuning database is given as well,
    since tuned TVM kernels can beat the vendor's and ``auto`` keeps the faster per kernel by
    measurement; TVM's own kernels otherwise."""
    if not torch_available():
        return "tvm"
    if target_kind == "cuda":
        import torch  # optional, as above

        if not torch.cuda.is_available():
            return "tvm"
    return "auto" if tuning_db else "vendor"


def require_torch():
    """PyTorch, or `VendorUnavailableError` saying how to install it."""
    try:
        import torch  # optional (the torch extra), and 1.7 s to import
    except ImportError:
        raise VendorUnavailableError(
            "vendor kernels need PyTorch (`pip install paragraph[torch]`); use --kernels tvm"
        ) from None
    return torch


def _use_schedule_threads(torch, cap: int | None = None) -> None:
    """Run this call with as many threads as the calling thread's TVM pool, which the executor
    sizes per stream (`threads.config_threads`), or ``cap`` where fewer (the schedule's
    ``kernel_threads``: small kernels measured faster on one thread than on two): vendor and
    TVM kernels of one stream use the schedule's thread count. Threads that never sized a pool
    (the TVM VM's) use every core, as TVM's own pool does.

    The count is checked against torch's on every call, not cached per thread: with libgomp,
    ``torch.set_num_threads`` in one thread also changed the count other threads saw (a 1-thread
    stream made the TVM VM's vendor calls in the main thread single-threaded). Setting it costs
    well under a microsecond; the packed weights are cached per thread count.
    """
    n = configured_threads() or _all_threads()
    if cap is not None and cap < n:
        n = cap
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


@cache
def _all_threads() -> int:
    return int(os.environ.get("TVM_NUM_THREADS") or cpu_count())


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
    return _full_fp32_on(torch, stream)


@contextlib.contextmanager
def _full_fp32_on(torch, stream):
    """Run on ``stream`` with TF32 off for cuDNN and cuBLAS: PyTorch lets cuDNN convolutions
    round float32 inputs to TF32 by default (2.4e-3 relative error on Inception-v3 on an H100,
    where the TVM kernels they replace compute in full float32). Set per call, not for the
    process, so the user's own PyTorch code keeps its settings."""
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    saved = cudnn.allow_tf32, matmul.allow_tf32
    cudnn.allow_tf32 = matmul.allow_tf32 = False
    try:
        with torch.cuda.stream(stream):
            yield
    finally:
        cudnn.allow_tf32, matmul.allow_tf32 = saved


def _zero_fill(t) -> Callable[[], object]:
    """A call that zeroes the CPU tensor ``t`` on the calling thread: ``Tensor.zero_`` on two
    threads is an OpenMP parallel region that may wake a sleeping worker (about 45 us here),
    5-20x the memset itself for the buffers of a convolution."""
    if t.is_cuda or not t.is_contiguous():
        return t.zero_
    return partial(ctypes.memset, t.data_ptr(), 0, t.numel() * t.element_size())


def _activation(torch, op: VendorOp) -> Callable[[object], object] | None:
    """``op``'s activation (one of `names.EPILOGUES`) applied to a tensor in place, PyTorch's
    (as the C++ kernels' `activate`); None where it has none. Raises `ParagraphError` for any
    other name: a kernel that skipped it would return wrong values."""
    functional = torch.nn.functional
    gelu = torch._C._nn.gelu
    acts: dict[str, Callable[[object], object]] = {
        "relu": torch.relu_,
        "relu6": partial(functional.relu6, inplace=True),
        "hardswish": partial(functional.hardswish, inplace=True),
        "hardsigmoid": partial(functional.hardsigmoid, inplace=True),
        "sigmoid": torch.sigmoid_,
        "silu": partial(functional.silu, inplace=True),
        "gelu": lambda t: gelu(t, out=t),
        "gelu_tanh": lambda t: gelu(t, approximate="tanh", out=t),
    }
    if op.act is None:
        return None
    if op.act not in acts:
        raise ParagraphError(f"{op.name}: no activation {op.act!r} (the vendor kernels fuse "
                             f"{', '.join(EPILOGUES)})")
    return acts[op.act]


TRIALS = 4  # timed calls per variant before `_Fastest` chooses (the first is discarded)


class _Fastest:
    """One kernel with several implementations on the same buffers: the first calls on each
    thread count alternate between them, timed (the first of each discarded: packing, caches),
    then the faster by median runs from there on (a later one only where it is faster by
    `paragraph.timing.MARGIN`). oneDNN's in-place convolution costs about
    24 us per call before any work, MKL's GEMM 3 us: a small 1x1 convolution or linear layer
    (NASNet-A's, an RNN step's) runs faster as a GEMM, a large one as oneDNN's."""

    def __init__(self, torch, variants: list[Callable[[], None]], threads: int | None,
                 key: tuple) -> None:
        self.torch, self.variants, self.threads, self.key = torch, variants, threads, key
        self.samples: dict[int, list[list[float]]] = {}
        self.chosen: dict[int, Callable[[], None]] = {}

    def __call__(self) -> None:
        _use_schedule_threads(self.torch, self.threads)
        if _FORCED:  # the differential fuzzer runs each variant in turn, untimed
            self.variants[min(_FORCED[-1], len(self.variants) - 1)]()
            return
        n = self.torch.get_num_threads()
        fn = self.chosen.get(n)
        if fn is None and (self.key, n) in _CHOSEN:  # chosen by an earlier binding
            fn = self.chosen[n] = self.variants[_CHOSEN[self.key, n]]
        if fn is not None:
            fn()
            return
        samples = self.samples.setdefault(n, [[] for _ in self.variants])
        i = min(range(len(samples)), key=lambda j: len(samples[j]))
        start = time.perf_counter()
        self.variants[i]()
        samples[i].append(time.perf_counter() - start)
        if all(len(x) > TRIALS for x in samples):
            medians = [statistics.median(x[1:]) for x in samples]
            best = 0  # a later variant only where it is faster beyond noise, as the C++ forms
            for j in range(1, len(medians)):
                if clearly_faster(medians[j], medians[best]):
                    best = j
            self.chosen[n] = self.variants[best]
            _CHOSEN[self.key, n] = best


# (kernel name, argument shapes), threads -> the variant `_Fastest` chose: executors built
# later in the process (a planner builds several) start with it
_CHOSEN: dict[tuple[tuple, int], int] = {}
# the variant every `_Fastest` runs while this holds one (the innermost `forced_variant`)
_FORCED: list[int] = []


@contextlib.contextmanager
def forced_variant(index: int) -> Iterator[None]:
    """Inside the block every kernel with several variants runs variant ``index`` (its last
    where it has fewer), untimed, whatever it chose (`paragraph.tvm_interop.runtime.library.
    native.forced_form` forces the C++ kernels' forms with it)."""
    _FORCED.append(max(0, index))
    try:
        yield
    finally:
        _FORCED.pop()


def _gemm_1x1(torch, op: VendorOp, x, w, bias, res, out) -> Callable[[], None] | None:
    """A 1x1, stride-1, unpadded, ungrouped NHWC convolution as MKL's GEMM writing ``out``
    in place, its bias, residual and activation after it; None where the shapes are not
    that."""
    if (op.layout != "NHWC" or w.shape[1:3] != (1, 1) or op.stride != (1, 1)
            or any(op.padding) or op.dilation != (1, 1) or op.groups != 1
            or not (x.is_contiguous() and out.is_contiguous())):
        return None
    cin, cout = x.shape[-1], out.shape[-1]
    rows, out2 = x.view(-1, cin), out.view(-1, cout)
    weight = w.reshape(cout, cin).t()
    res2 = None if res is None else res.reshape(-1, cout)
    act = _activation(torch, op)

    if res2 is not None and res2.data_ptr() == out2.data_ptr():  # the residual's buffer
        def accumulate() -> None:
            out2.addmm_(rows, weight)
            if bias is not None:
                out2.add_(bias)
            if act is not None:
                act(out2)
        return accumulate

    def call() -> None:
        if bias is not None:
            torch.addmm(bias, rows, weight, out=out2)
        else:
            torch.mm(rows, weight, out=out2)
        if res2 is not None:
            out2.add_(res2)
        if act is not None:
            act(out2)
    return call


def _all_finite(*tensors: Any) -> bool:
    """Whether none of the CPU ``tensors`` (None skipped) holds a NaN or an infinity, or may:
    oneDNN's fused relu is MAXPS(v, 0), which makes a NaN 0 where PyTorch and ONNX Runtime keep
    it, so it is fused only where no NaN can arise (as the C++ kernels' `any_nonfinite`). Each
    tensor's sum, read in place through numpy (no tensor allocated: calls stay zero-copy), is
    finite only where every value is; a sum that overflows counts as not finite (relu after
    the call: correct, a little slower)."""
    return all(math.isfinite(float(np.sum(t.numpy()))) for t in tensors if t is not None)


def _conv2d_kernel(op: VendorOp) -> Callable:
    torch = require_torch()
    to_nchw = (lambda t: t.permute(0, 3, 1, 2)) if op.layout != "NCHW" else (lambda t: t)
    # NCHW2NHWC: the input is NCHW already (oneDNN reorders it inside the convolution)
    input_nchw = (lambda t: t) if op.layout == "NCHW2NHWC" else to_nchw
    stride, dilation = list(op.stride), list(op.dilation)
    padding = list(op.padding[:2])
    # torch pads symmetrically; TF-style "same" padding (NASNet) is padded first, as a copy
    pre_pad = None
    if len(op.padding) == 4:
        top, left, bottom, right = op.padding
        pre_pad, padding = (left, right, top, bottom), [0, 0]
    in_place_add = torch.ops.mkldnn._convolution_pointwise_.binary
    conv2d = torch.nn.functional.conv2d
    act = _activation(torch, op)
    # oneDNN's in-place convolution fuses relu; another activation follows it
    fused, after = ("relu", None) if op.act == "relu" else (None, act)
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

    def bind(*args, threads: int | None = None) -> Callable[[], None]:
        """The call on these tensors, with their torch views made once."""
        ts = [torch.from_dlpack(a) for a in args]
        x, w, out = input_nchw(ts[0]), to_nchw(ts[1]), to_nchw(ts[-1])
        bias = ts[2] if op.bias else None
        res = to_nchw(ts[2 + op.bias]) if op.residual else None
        zero = _zero_fill(ts[-1])
        # a constant weight checked once (the CUDA path fuses nothing)
        weight_finite = out.is_cuda or not op.weight or _all_finite(w)

        def call() -> None:
            if out.is_cuda:
                # every torch call inside: outside, the pad ran on the legacy default stream,
                # which neither waits for the executor's non-blocking streams nor is captured
                # into their CUDA Graph (NASNet-A on an H100: outputs off by up to 1.14)
                with _tvm_stream(torch, args[0]):
                    xp = x if pre_pad is None else torch.nn.functional.pad(x, pre_pad)
                    y = conv2d(xp, w, bias, stride, padding, dilation, op.groups)
                    if res is not None:
                        y.add_(res)
                    # cuDNN allocates the result: the copy into TVM's buffer carries the
                    # activation
                    if op.act == "relu":
                        torch.clamp_min(y, 0, out=out)
                    else:
                        out.copy_(y)
                        if act is not None:
                            act(out)
                return
            xp = x if pre_pad is None else torch.nn.functional.pad(x, pre_pad)
            _use_schedule_threads(torch, threads)
            # oneDNN computes out = act(conv(x) + bias + out) in place: out starts as 0 or
            # the residual
            if res is not None:
                if res.data_ptr() != out.data_ptr():  # else the plan wrote over it in place
                    out.copy_(res)
            else:
                zero()
            keep_nan = fused == "relu" and not (weight_finite and _all_finite(
                x, bias, res, None if op.weight else w))
            in_place_add(out, xp, cpu_weight(w, xp), bias, padding, stride, dilation,
                         op.groups, "add", None, None if keep_nan else fused, [], None)
            if keep_nan:
                out.relu_()
            if after is not None:
                after(out)

        gemm = None if out.is_cuda else _gemm_1x1(
            torch, op, ts[0], ts[1], bias, None if res is None else ts[2 + op.bias], ts[-1])
        in_place = res is not None and res.data_ptr() == out.data_ptr()
        return call if gemm is None else _Fastest(torch, [call, gemm], threads,
                                                  (op.name, *(tuple(t.shape) for t in ts),
                                                   in_place))

    return bind


def _matmul_kernel(op: VendorOp) -> Callable:
    torch = require_torch()
    in_place_add = torch.ops.mkldnn._convolution_pointwise_.binary
    packed: dict[tuple[int, int], object] = {}  # (threads, rows) -> blocked 1x1 conv weight
    act = _activation(torch, op)

    def activate(out) -> None:
        if act is not None:
            act(out)

    def gemm(rows, b, bias, out2, zero) -> None:
        if bias is not None:
            torch.addmm(bias, rows, b, out=out2)
        else:
            torch.mm(rows, b, out=out2)
        activate(out2)

    def onednn(rows, b, bias, out2, zero) -> None:
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
        zero()
        fuse = op.act == "relu" and _all_finite(rows, b, bias)
        in_place_add(out4, x4, packed[key], bias, [0, 0], [1, 1], [1, 1], 1, "add", None,
                     "relu" if fuse else None, [], None)
        if not fuse:  # oneDNN fuses only relu after its in-place add (see `_all_finite`)
            activate(out2)

    def run(a, b, bias, out, cpu: bool, zero=None) -> None:
        if op.kind == "bmm":
            torch.bmm(a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:]),
                      out=out.view(-1, *out.shape[-2:]))
            activate(out)
            return
        # (..., K) @ (K, N): one GEMM over the flattened rows
        rows, out2 = a.reshape(-1, a.shape[-1]), out.view(-1, out.shape[-1])
        (onednn if cpu and op.weight else gemm)(rows, b, bias, out2, zero or out2.zero_)

    def bind(*args, threads: int | None = None) -> Callable[[], None]:
        """The call on these tensors, with their torch views made once."""
        ts = [torch.from_dlpack(a) for a in args]
        bias = ts[2] if op.bias else None
        zero = _zero_fill(ts[-1])

        def call() -> None:
            if ts[-1].is_cuda:
                with _tvm_stream(torch, args[0]):
                    run(ts[0], ts[1], bias, ts[-1], cpu=False)
                return
            _use_schedule_threads(torch, threads)
            run(ts[0], ts[1], bias, ts[-1], cpu=True, zero=zero)

        if ts[-1].is_cuda or op.kind == "bmm" or not op.weight:
            return call

        def mkl() -> None:  # MKL's GEMM in place: no 24 us oneDNN call cost for small ones
            _use_schedule_threads(torch, threads)
            run(ts[0], ts[1], bias, ts[-1], cpu=False)
        return _Fastest(torch, [call, mkl], threads, (op.name, *(tuple(t.shape) for t in ts)))

    return bind


def _concat_kernel(op: VendorOp) -> Callable:
    torch = require_torch()
    if op.act not in (None, "relu"):  # as the C++ concat: a join fuses relu alone
        raise ParagraphError(f"{op.name}: a vendor concat fuses relu alone")

    def bind(*args, threads: int | None = None) -> Callable[[], None]:
        """The call on these tensors, with their torch views made once."""
        ts = [torch.from_dlpack(a) for a in args]
        parts, out = ts[:-1], ts[-1]

        def cat() -> None:
            torch.cat(parts, dim=op.axis, out=out)
            if op.act == "relu":
                out.relu_()

        def call() -> None:
            if out.is_cuda:  # (dispatched on the CPU only today) on TVM's stream, as a whole
                with _tvm_stream(torch, args[0]):
                    cat()
            else:
                _use_schedule_threads(torch, threads)
                cat()
        return call

    return bind


def _softmax_kernel(op: VendorOp) -> Callable:
    torch = require_torch()
    softmax = torch.ops.aten._softmax.out

    def bind(*args, threads: int | None = None) -> Callable[[], None]:
        """The call on these tensors, with their torch views made once."""
        x, out = (torch.from_dlpack(a) for a in args)

        def call() -> None:
            _use_schedule_threads(torch, threads)
            if op.scale != 1.0:  # scaled into the output, normalised there in place
                torch.mul(x, op.scale, out=out)
                softmax(out, op.axis, False, out=out)
            else:
                softmax(x, op.axis, False, out=out)
        return call

    return bind


def _layer_norm_kernel(op: VendorOp) -> Callable:
    torch = require_torch()
    layer_norm = torch.nn.functional.layer_norm

    def bind(*args, threads: int | None = None) -> Callable[[], None]:
        """The call on these tensors, with their torch views made once."""
        ts = [torch.from_dlpack(a) for a in args]
        x, gamma, beta, out = ts[0], ts[1], ts[2], ts[-1]
        res = ts[3] if op.residual else None

        def call() -> None:
            _use_schedule_threads(torch, threads)
            y = x if res is None else x + res
            out.copy_(layer_norm(y, y.shape[-1:], gamma, beta, op.eps))
        return call

    return bind


def _pool_kernel(op: VendorOp) -> Callable:
    torch = require_torch()
    functional = torch.nn.functional

    def bind(*args, threads: int | None = None) -> Callable[[], None]:
        """The call on these tensors, with their torch views made once (NHWC as NCHW)."""
        top, left, bottom, right = op.pads
        even = (top, left) == (bottom, right)
        if not even and op.include_pad:
            raise ParagraphError(f"{op.name}: an average pool counting its padding takes "
                                 "symmetric padding only (paragraph dispatches no other)")
        x, out = (torch.from_dlpack(a).permute(0, 3, 1, 2) for a in (args[0], args[-1]))
        # an average pool's affine epilogue: per-channel scale and shift, as (C, 1, 1)
        scale, shift = ((torch.from_dlpack(a).reshape(-1, 1, 1) for a in args[1:3]) if op.bias
                        else (None, None))
        # PyTorch pads evenly: uneven padding is a padded copy first (-inf for a max; zeros for
        # an average, divided by each window's count of real pixels)
        kw = {"kernel_size": op.window, "stride": op.stride,
              "padding": (top, left) if even else (0, 0)}
        sides = (left, right, top, bottom)
        count = None if even or op.kind == "max_pool2d" else functional.avg_pool2d(
            functional.pad(torch.ones(1, 1, *x.shape[2:], dtype=x.dtype), sides),
            count_include_pad=True, **kw)

        def call() -> None:
            _use_schedule_threads(torch, threads)
            if op.kind == "max_pool2d":
                xp = x if even else functional.pad(x, sides, value=float("-inf"))
                y = functional.max_pool2d(xp, **kw)
            elif even:
                y = functional.avg_pool2d(x, count_include_pad=op.include_pad, **kw)
            else:
                y = functional.avg_pool2d(functional.pad(x, sides), count_include_pad=True,
                                          **kw) / count
            if scale is not None:
                y = torch.addcmul(shift, y, scale)
            if op.act == "relu":
                y = torch.relu_(y)
            out.copy_(y)
        return call

    return bind


_KERNELS = {"conv2d": _conv2d_kernel, "matmul": _matmul_kernel, "bmm": _matmul_kernel,
            "concat": _concat_kernel, "softmax": _softmax_kernel,
            "layer_norm": _layer_norm_kernel, "max_pool2d": _pool_kernel,
            "avg_pool2d": _pool_kernel}


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


def bind(name: str, args: tuple, threads: int | None = None) -> Callable[[], None] | None:
    """Vendor kernel ``name`` bound to ``args``: a call with no arguments that reuses torch
    views of those tensors, which the executor makes once per kernel (its buffers never move).
    A call through the registered function makes them every time: from DLPack and the layout
    permutes take about 8 us, much of a small kernel's Python time, and the GIL is held
    throughout. ``threads`` caps the call's thread count below its stream's (the schedule's
    ``kernel_threads``). None for a name registered elsewhere, and on a GPU, whose path stays
    as captured in its CUDA Graphs. A `VendorOp` name not registered yet is registered here
    (a program loaded by TVM's runtime alone registers none: PyTorch loads only if a kernel
    runs here, not in C++)."""
    if name not in _BINDERS and is_vendor_name(name):
        ensure_registered(name)
    binder = _BINDERS.get(name)
    if binder is None or any(a.device.dlpack_device_type() != tvm.cpu().dlpack_device_type()
                             for a in args):
        return None
    return binder(*args, threads=threads)
