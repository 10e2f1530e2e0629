"""Vendor kernels (oneDNN/MKL on the CPU, cuDNN/cuBLAS on CUDA through PyTorch): every dispatched
pattern against TVM's own kernels, zero-copy calls, per-stream threads, every reduced zoo model
through the executor, the `auto` choice and its cost records, compiled programs, and the path
without PyTorch."""

import math
import os
import subprocess
import sys
import textwrap
import threading
from functools import partial

import numpy as np
import pytest
import tvm
from conftest import with_native_libraries, zoo_for_schedules
from tvm import relax

from paragraph import models
from paragraph.cli import main
from paragraph.deploy import load
from paragraph.errors import ParagraphError
from paragraph.interpret import run_graph
from paragraph.machine import has_avx512
from paragraph.passes.schedule import ALGORITHMS, make_schedule
from paragraph.tvm_interop import from_relax, random_inputs
from paragraph.tvm_interop.build.dispatch import dispatch_to_vendor, undispatch, vendor_names
from paragraph.tvm_interop.build.program import build_program
from paragraph.tvm_interop.build.select import choose_fastest
from paragraph.tvm_interop.frontend.importers import prepare
from paragraph.tvm_interop.measure.costdb import TABLE, CostDB
from paragraph.tvm_interop.measure.device import SETTLE_RUNS
from paragraph.tvm_interop.runtime.executor import gpu_available, make_executor
from paragraph.tvm_interop.runtime.library.names import EPILOGUES, VendorOp, cost_name
from paragraph.tvm_interop.runtime.library.torch_kernels import bind, ensure_registered
from paragraph.tvm_interop.runtime.target import local_cpu_target
from paragraph.tvm_interop.runtime.threads import config_threads
from paragraph.tvm_interop.runtime.vm import run_vm

# the tests of paragraph's own AVX-512 forms (forms forced by index, packed weights looked
# for): on a CPU without AVX-512 those forms refuse themselves (AVX2 forms stand in, tested by
# `test_the_own_avx2_forms_compute_what_pytorch_does`)
needs_avx512 = pytest.mark.skipif(
    has_avx512() is False or os.environ.get("PARAGRAPH_CPU_ISA", "").lower() == "avx2",
    reason="the own AVX-512 forms need an AVX-512 CPU (this one has none, or is held to AVX2)")

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)


def const(*shape, scale=0.5):
    return relax.const((RNG.standard_normal(shape) * scale).astype("float32"))


def module(shape, body):
    """``main(x)`` whose dataflow block is ``body(bb, x)`` (returns the output var)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(body(bb, x))
        bb.emit_func_output(out)
    return bb.get()


def conv_block(*, channels=8, out=12, kernel=3, stride=1, padding=1, groups=1, dilation=1,
               bn=False, bias=False, residual=False, relu=False):
    def body(bb, x):
        y = bb.emit(relax.op.nn.conv2d(x, const(out, channels // groups, kernel, kernel),
                                       strides=stride, padding=padding, dilation=dilation,
                                       groups=groups))
        if bias:
            y = bb.emit(relax.op.add(y, const(1, out, 1, 1)))
        if bn:  # what prepare leaves of a batch norm: (y - mean) / std * gamma + beta
            y = bb.emit(relax.op.subtract(y, const(1, out, 1, 1)))
            y = bb.emit(relax.op.divide(y, relax.const(
                np.abs(RNG.standard_normal((1, out, 1, 1))).astype("float32") + 0.5)))
            y = bb.emit(relax.op.multiply(y, const(1, out, 1, 1)))
            y = bb.emit(relax.op.add(y, const(1, out, 1, 1)))
        if residual:
            shortcut = bb.emit(relax.op.nn.conv2d(x, const(out, channels, 1, 1),
                                                  strides=stride))
            y = bb.emit(relax.op.add(y, shortcut))
        if relu:
            y = bb.emit(relax.op.nn.relu(y))
        return y
    return module((2, channels, 15, 15), body)


def matmul_block(a_shape, b_shape, *, weight=True, bias=False, act=None):
    def body(bb, x):
        b = const(*b_shape) if weight else bb.emit(relax.op.multiply(x, relax.const(
            np.float32(0.5))))
        y = bb.emit(relax.op.matmul(x, b))
        if bias:
            y = bb.emit(relax.op.add(y, const(b_shape[-1])))
        if act:
            y = bb.emit(getattr(relax.op.nn, act)(y))
        return y
    return module(a_shape, body)


CONVS = {
    "conv3x3": (conv_block(), "conv2d.NHWC.s1x1.p1x1.d1x1.g1"),
    "conv1x1_bias_relu": (conv_block(kernel=1, padding=0, bias=True, relu=True),
                          "conv2d.NHWC.s1x1.p0x0.d1x1.g1.bias.relu"),
    "conv_bn_relu": (conv_block(bn=True, relu=True), "conv2d.NHWC.s1x1.p1x1.d1x1.g1.bias.relu"),
    "conv_stride2_bn_residual_relu": (
        conv_block(stride=2, bn=True, residual=True, relu=True),
        ["conv2d.NHWC.s2x2.p1x1.d1x1.g1.bias.res.relu", "conv2d.NHWC.s2x2.p0x0.d1x1.g1"]),
    "conv_asymmetric_padding": (conv_block(stride=2, padding=(1, 1, 2, 2)),
                                "conv2d.NHWC.s2x2.p1x1x2x2.d1x1.g1"),
    "depthwise_dilated": (conv_block(out=8, groups=8, dilation=2, padding=2, bias=True),
                          "conv2d.NHWC.s1x1.p2x2.d2x2.g8.bias"),
    # a stem (few input channels), padded or not, reads the model's NCHW input: no
    # transpose kernel before it
    "stem_nchw_input": (module((1, 3, 19, 17), lambda bb, x: bb.emit(relax.op.nn.relu(bb.emit(
        relax.op.nn.conv2d(x, const(8, 3, 3, 3), strides=2, padding=1))))),
        "conv2d.NCHW2NHWC.s2x2.p1x1.d1x1.g1.relu"),
    "stem_unpadded": (module((1, 3, 19, 17), lambda bb, x: bb.emit(relax.op.nn.conv2d(
        x, const(4, 3, 3, 3), strides=2))), "conv2d.NCHW2NHWC.s2x2.p0x0.d1x1.g1"),
    "conv_1x7": (module((1, 8, 9, 9), lambda bb, x: bb.emit(relax.op.nn.conv2d(
        x, const(6, 8, 1, 7), padding=(0, 3)))), "conv2d.NHWC.s1x1.p0x3.d1x1.g1"),
}
MATMULS = {
    "linear": (matmul_block((4, 16), (16, 8)), "matmul"),
    "linear3d_bias_relu": (matmul_block((2, 5, 16), (16, 8), bias=True, act="relu"),
                           "matmul.bias.relu"),
    "linear_bias_gelu": (matmul_block((5, 16), (16, 8), bias=True, act="gelu"),
                         "matmul.bias.gelu"),
    "linear_bias_gelu_tanh": (matmul_block((5, 16), (16, 8), bias=True, act="gelu_tanh"),
                              "matmul.bias.gelu_tanh"),
    "bmm4d": (matmul_block((2, 3, 6, 6), (2, 3, 6, 6), weight=False), "bmm"),
}



def concat_nested_relu(bb, x):
    a, b = bb.emit(relax.op.exp(x)), bb.emit(relax.op.negative(x))
    c = bb.emit(relax.op.multiply(x, relax.const(np.float32(2))))
    inner = bb.emit(relax.op.concat([b, c], axis=1))  # read once: flattened into the outer
    return bb.emit(relax.op.nn.relu(bb.emit(relax.op.concat([a, inner], axis=-3))))


def conv_branches_concat(bb, x):
    wide = bb.emit(relax.op.nn.conv2d(x, const(6, 8, 3, 3), padding=1))
    narrow = bb.emit(relax.op.nn.conv2d(x, const(4, 8, 1, 1)))
    return bb.emit(relax.op.concat([wide, narrow], axis=1))


def mixed_depthwise_bn_silu(bb, x):
    """MixNet's mixed depthwise convolution: the channels split, each part a depthwise
    convolution of its own kernel size, concatenated, then batch norm and SiLU: the affine ops
    and the activation are spread over the parts' convolutions (one kernel each, and the
    concat's copy), where they were TVM kernels of their own."""
    parts = bb.emit(relax.op.split(x, 2, axis=1))
    a, b = bb.emit(relax.TupleGetItem(parts, 0)), bb.emit(relax.TupleGetItem(parts, 1))
    ya = bb.emit(relax.op.nn.conv2d(a, const(4, 1, 3, 3), padding=1, groups=4))
    yb = bb.emit(relax.op.nn.conv2d(b, const(4, 1, 5, 5), padding=2, groups=4))
    y = bb.emit(relax.op.concat([ya, yb], axis=1))
    for op, c in ((relax.op.subtract, const(1, 8, 1, 1)),
                  (relax.op.divide, relax.const(np.linspace(0.5, 2, 8, dtype="float32")
                                                .reshape(1, 8, 1, 1))),
                  (relax.op.multiply, const(1, 8, 1, 1)), (relax.op.add, const(1, 8, 1, 1))):
        y = bb.emit(op(y, c))
    return silu(bb, y)


def conv_pools(bb, x):
    """A convolution (NHWC after dispatch, and its pools with it), then Inception's two
    average pools (padding counted and not) and a strided max pool."""
    y = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(x, const(20, 8, 3, 3), padding=1))))
    with_pad = bb.emit(relax.op.nn.avg_pool2d(y, 3, 1, 1, count_include_pad=True))
    without = bb.emit(relax.op.nn.avg_pool2d(y, 3, 1, 1, count_include_pad=False))
    return bb.emit(relax.op.nn.max_pool2d(bb.emit(relax.op.add(with_pad, without)), 3, 2, 0))


def pools_with_epilogues(bb, x):
    """Inception's pool branch after rule pool-after-conv1x1: a 1 x 1 convolution, then its
    pool, the convolution's batch norm (as `prepare` decomposes it) and relu after the pool;
    a pool not counting its padding with a relu alone; and a constant minus a pool, which is
    not affine in the pool's terms and stays a TVM kernel."""
    y = bb.emit(relax.op.nn.conv2d(x, const(6, 8, 1, 1)))
    pooled = bb.emit(relax.op.nn.avg_pool2d(y, 3, 1, 1, count_include_pad=True))
    for kind in ("subtract", "divide", "multiply", "add"):
        pooled = bb.emit(getattr(relax.op, kind)(pooled, const(1, 6, 1, 1)))
    branch = bb.emit(relax.op.nn.relu(pooled))
    plain = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.avg_pool2d(y, 3, 1, 1))))
    flipped = bb.emit(relax.op.subtract(const(1, 6, 1, 1), bb.emit(relax.op.nn.avg_pool2d(
        y, 3, 2, 1, count_include_pad=True))))
    return bb.emit(relax.Tuple([branch, plain, flipped]))


def erf_gelu(order):
    """PyTorch's ONNX export of GELU after a linear layer, with the products in ``order``."""
    def body(bb, x):
        y = bb.emit(relax.op.add(bb.emit(relax.op.matmul(x, const(16, 8))), const(8)))
        if order == "scaled":  # x * (1 / sqrt 2) instead of x / sqrt 2
            s = bb.emit(relax.op.multiply(relax.const(np.float32(2 ** -0.5)), y))
        else:
            s = bb.emit(relax.op.divide(y, relax.const(np.float32(2 ** 0.5))))
        one_plus = bb.emit(relax.op.add(bb.emit(relax.op.erf(s)), relax.const(np.float32(1))))
        if order == "half_first":
            half = bb.emit(relax.op.multiply(relax.const(np.float32(0.5)), y))
            return bb.emit(relax.op.multiply(half, one_plus))
        return bb.emit(relax.op.multiply(bb.emit(relax.op.multiply(y, one_plus)),
                                         relax.const(np.float32(0.5))))
    return module((5, 16), body)


def softmax_after_scores(bb, x):
    scores = bb.emit(relax.op.matmul(x, bb.emit(relax.op.permute_dims(x, [0, 2, 1]))))
    return bb.emit(relax.op.nn.softmax(scores, axis=-1))


def softmax_after_scaled_scores(how):
    """An attention's ``softmax(q k^T / sqrt(d))``, the scale multiplied or divided: absorbed
    into the softmax; a scale by a tensor, or scores read again, stay TVM kernels."""
    def body(bb, x):
        scores = bb.emit(relax.op.matmul(x, bb.emit(relax.op.permute_dims(x, [0, 2, 1]))))
        if how == "divide":
            scaled = bb.emit(relax.op.divide(scores, relax.const(np.float32(-2.0))))
        else:
            scaled = bb.emit(relax.op.multiply(relax.const(np.float32(0.125)), scores))
        probs = bb.emit(relax.op.nn.softmax(scaled, axis=-1))
        by_tensor = bb.emit(relax.op.multiply(scores, const(6, 6)))
        read_twice = bb.emit(relax.op.multiply(scores, relax.const(np.float32(0.5))))
        return bb.emit(relax.Tuple([probs, bb.emit(relax.op.nn.softmax(by_tensor, axis=-1)),
                                    bb.emit(relax.op.nn.softmax(read_twice, axis=1)),
                                    read_twice]))
    return module((3, 6, 8), body)


def layer_norm_after_residual(bb, x):
    y = bb.emit(relax.op.matmul(x, const(16, 16)))
    ln = bb.emit(relax.op.nn.layer_norm(bb.emit(relax.op.add(y, x)), const(16), const(16),
                                        axes=[-1], epsilon=1e-12))
    # a broadcast constant added before the norm stays a TVM kernel; one of the whole shape
    # (an encoder's position embeddings) is absorbed; a norm over another axis stays with TVM
    shifted = bb.emit(relax.op.add(ln, const(16)))
    ln2 = bb.emit(relax.op.nn.layer_norm(shifted, const(16), const(16), axes=[-1]))
    embedded = bb.emit(relax.op.add(ln2, const(4, 16)))
    ln3 = bb.emit(relax.op.nn.layer_norm(embedded, const(16), const(16), axes=[-1],
                                         epsilon=1e-6))
    return bb.emit(relax.op.nn.layer_norm(ln3, const(4), const(4), axes=[0]))


OTHERS = {
    **{f"erf_gelu_{o}": (erf_gelu(o), "matmul.bias.gelu") for o in
       ("torch", "half_first", "scaled")},
    "softmax": (module((3, 6, 8), softmax_after_scores), ["bmm", "softmax.a2"]),
    "softmax_scaled": (softmax_after_scaled_scores("multiply"),
                       ["bmm", "softmax.a2.x0p125", "softmax.a2", "softmax.a1"]),
    "softmax_divided": (softmax_after_scaled_scores("divide"),
                        ["bmm", "softmax.a2.x-0p5", "softmax.a2", "softmax.a1"]),
    "layer_norm": (module((4, 16), layer_norm_after_residual),
                   ["matmul", "layer_norm.e1e-12.res", "layer_norm.e1e-05",
                    "layer_norm.e1e-06.res"]),
}

def f32(v):
    return relax.const(np.float32(v))


def relu6(bb, y):
    return bb.emit(relax.op.clip(y, 0, 6))


def hardsigmoid(bb, y):
    """TVM's form of ONNX HardSigmoid with PyTorch's alpha (1/6) and beta."""
    return bb.emit(relax.op.clip(bb.emit(relax.op.add(bb.emit(relax.op.multiply(
        f32(1 / 6), y)), f32(0.5))), 0, 1))


def hardswish(bb, y):
    """TVM's form of ONNX HardSwish: ``y * (clip(y + 3, 0, 6) / 6)``."""
    gate = bb.emit(relax.op.divide(bb.emit(relax.op.clip(bb.emit(relax.op.add(y, f32(3))), 0, 6)),
                                   f32(6)))
    return bb.emit(relax.op.multiply(y, gate))


def silu(bb, y):
    return bb.emit(relax.op.multiply(bb.emit(relax.op.sigmoid(y)), y))


def conv_act(act, groups=1, kernel=3, stride=1):
    """A convolution then an activation as exporters write it (MobileNets, EfficientNet)."""
    def body(bb, x):
        y = bb.emit(relax.op.nn.conv2d(x, const(8, 8 // groups, kernel, kernel), strides=stride,
                                       padding=kernel // 2, groups=groups))
        y = bb.emit(relax.op.add(y, const(1, 8, 1, 1)))
        return act(bb, y)
    return module((1, 8, 11, 11), body)


def squeeze_excite(bb, x):
    """MobileNetV3's block: hardswish convolution, then the global mean, two 1 x 1
    convolutions (relu, hardsigmoid) and the gate multiplied back."""
    y = hardswish(bb, bb.emit(relax.op.nn.conv2d(x, const(8, 8, 1, 1))))
    pooled = bb.emit(relax.op.mean(y, axis=[2, 3], keepdims=True))
    s = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(pooled, const(4, 8, 1, 1)))))
    s = hardsigmoid(bb, bb.emit(relax.op.add(bb.emit(relax.op.nn.conv2d(s, const(8, 4, 1, 1))),
                                             const(1, 8, 1, 1))))
    return bb.emit(relax.op.multiply(y, s))


def tanh_gelu(bb, x):
    """GPT-2's ``gelu_new`` after a linear layer, as it exports to ONNX."""
    y = bb.emit(relax.op.add(bb.emit(relax.op.matmul(x, const(16, 8))), const(8)))
    cubic = bb.emit(relax.op.multiply(f32(0.044715), bb.emit(relax.op.power(y, f32(3.0)))))
    inner = bb.emit(relax.op.multiply(f32((2 / np.pi) ** 0.5), bb.emit(relax.op.add(y, cubic))))
    one_plus = bb.emit(relax.op.add(f32(1.0), bb.emit(relax.op.tanh(inner))))
    return bb.emit(relax.op.multiply(bb.emit(relax.op.multiply(f32(0.5), y)), one_plus))


def reshaped_tanh_gelu(bb, x):
    """GPT-2's Conv1D: the product over the rows of a 2-D view, reshaped back to (batch,
    tokens, features), then ``gelu_new``: the epilogue is fused through the reshape."""
    y = bb.emit(relax.op.add(bb.emit(relax.op.matmul(x, const(16, 8))), const(8)))
    y = bb.emit(relax.op.reshape(y, (1, 5, 8)))
    cubic = bb.emit(relax.op.multiply(bb.emit(relax.op.power(y, f32(3.0))), f32(0.044715)))
    inner = bb.emit(relax.op.multiply(bb.emit(relax.op.add(y, cubic)), f32((2 / np.pi) ** 0.5)))
    one_plus = bb.emit(relax.op.add(bb.emit(relax.op.tanh(inner)), f32(1.0)))
    return bb.emit(relax.op.multiply(y, bb.emit(relax.op.multiply(one_plus, f32(0.5)))))


def divided_by_zero(bb, x):
    """A per-channel division with a zero divisor after a convolution: not folded into its
    weight (x / 0 is +-inf or NaN per element), so the result keeps IEEE semantics."""
    y = bb.emit(relax.op.nn.conv2d(x, const(4, 8, 1, 1)))
    divisor = np.array([1.0, 0.0, 2.0, -0.5], "float32").reshape(1, 4, 1, 1)
    return bb.emit(relax.op.divide(y, relax.const(divisor)))


EPILOGUE_CASES = {
    "conv_relu6": (conv_act(relu6), "conv2d.NHWC.s1x1.p1x1.d1x1.g1.bias.relu6"),
    "depthwise_relu6": (conv_act(relu6, groups=8, stride=2),
                        "conv2d.NHWC.s2x2.p1x1.d1x1.g8.bias.relu6"),
    "depthwise5x5_silu": (conv_act(silu, groups=8, kernel=5),
                          "conv2d.NHWC.s1x1.p2x2.d1x1.g8.bias.silu"),
    "conv1x1_hardswish": (conv_act(hardswish, kernel=1),
                          "conv2d.NHWC.s1x1.p0x0.d1x1.g1.bias.hardswish"),
    "conv_sigmoid": (conv_act(lambda bb, y: bb.emit(relax.op.sigmoid(y))),
                     "conv2d.NHWC.s1x1.p1x1.d1x1.g1.bias.sigmoid"),
    "squeeze_excite": (module((1, 8, 7, 7), squeeze_excite),
                       ["conv2d.NHWC.s1x1.p0x0.d1x1.g1.hardswish", "avg_pool2d.NHWC.k7x7.s1x1.p0x0",
                        "conv2d.NHWC.s1x1.p0x0.d1x1.g1.relu",
                        "conv2d.NHWC.s1x1.p0x0.d1x1.g1.bias.hardsigmoid"]),
    "linear_tanh_gelu": (module((5, 16), tanh_gelu), "matmul.bias.gelu_tanh"),
    "reshaped_tanh_gelu": (module((5, 16), reshaped_tanh_gelu), "matmul.bias.gelu_tanh"),
    "divided_by_zero": (module((1, 8, 5, 5), divided_by_zero), "conv2d.NHWC.s1x1.p0x0.d1x1.g1"),
}

CONCATS = {
    "concat_nested_relu": (module((1, 4, 5, 5), concat_nested_relu), "concat.a1.relu"),
    # NHWC for the convolutions: the concat joins channels on axis 3
    "conv_branches_concat": (module((1, 8, 7, 7), conv_branches_concat),
                             ["conv2d.NHWC.s1x1.p1x1.d1x1.g1", "conv2d.NHWC.s1x1.p0x0.d1x1.g1",
                              "concat.a3"]),
    "mixed_depthwise_bn_silu": (module((1, 8, 6, 6), mixed_depthwise_bn_silu),
                                ["conv2d.NHWC.s1x1.p1x1.d1x1.g4.bias.silu",
                                 "conv2d.NHWC.s1x1.p2x2.d1x1.g4.bias.silu", "concat.a3"]),
    "conv_pools": (module((1, 8, 9, 9), conv_pools),
                   ["conv2d.NHWC.s1x1.p1x1.d1x1.g1.relu", "avg_pool2d.NHWC.k3x3.s1x1.p1x1.incpad",
                    "avg_pool2d.NHWC.k3x3.s1x1.p1x1", "max_pool2d.NHWC.k3x3.s2x2.p0x0"]),
    "pools_with_epilogues": (module((1, 8, 9, 9), pools_with_epilogues),
                             ["conv2d.NHWC.s1x1.p0x0.d1x1.g1",
                              "avg_pool2d.NHWC.k3x3.s1x1.p1x1.incpad.bias.relu",
                              "avg_pool2d.NHWC.k3x3.s1x1.p1x1.relu",
                              "avg_pool2d.NHWC.k3x3.s2x2.p1x1.incpad"]),
}


@pytest.fixture(autouse=True)
def private_cost_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PARAGRAPH_CACHE_DIR", str(tmp_path / "cache"))


def vm_outputs(program, inputs):
    return run_vm(program.vm(), inputs, device=program.device)


@pytest.mark.parametrize("case", [*CONVS, *MATMULS, *CONCATS, *OTHERS, *EPILOGUE_CASES])
def test_every_pattern_matches_tvm_kernels(case):
    mod, expected = {**CONVS, **MATMULS, **CONCATS, **OTHERS, **EPILOGUE_CASES}[case]
    expected = [expected] if isinstance(expected, str) else expected
    dispatched = dispatch_to_vendor(mod, local_cpu_target())
    names = vendor_names(dispatched)
    assert sorted(map(cost_name, names)) == sorted(f"paragraph.vendor.{e}" for e in expected)
    # on the CPU each constant weight is named by its digest (its packed form is cached by it)
    assert all(bool(VendorOp.from_name(n).weight) == (VendorOp.from_name(n).kind in
                                                      ("conv2d", "matmul")) for n in names)
    inputs = random_inputs(mod, seed=3)
    vendor = build_program(mod, "llvm", kernels="vendor")
    assert vendor.sources().get("vendor") == len(expected)
    tvm_kernels = build_program(mod, "llvm")
    for got, want in zip(vm_outputs(vendor, inputs), vm_outputs(tvm_kernels, inputs), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=case)


@pytest.mark.parametrize("case", ["pools_with_epilogues", "conv_relu6", "conv1x1_hardswish",
                                  "depthwise5x5_silu", "squeeze_excite", "linear_tanh_gelu"])
def test_every_epilogue_has_a_tvm_form(case):
    """`--kernels auto` weighs each vendor call against its TVM form: an average pool's affine
    epilogue and relu, and every activation, come back as Relax operators that compute the
    same."""
    mod, _ = {**CONCATS, **EPILOGUE_CASES}[case]
    back = undispatch(dispatch_to_vendor(mod, local_cpu_target()), lambda call: False)
    assert vendor_names(back) == []
    inputs = random_inputs(mod, seed=7)
    want = vm_outputs(build_program(mod, "llvm"), inputs)
    got = vm_outputs(build_program(back, "llvm"), inputs)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def test_nchw_layout_and_what_is_not_dispatched():
    mod, _ = CONVS["conv_bn_relu"]
    nchw = dispatch_to_vendor(mod, local_cpu_target(), layout="NCHW")
    assert [cost_name(n) for n in vendor_names(nchw)] == [
        "paragraph.vendor.conv2d.NCHW.s1x1.p1x1.d1x1.g1.bias.relu"]
    inputs = random_inputs(mod, seed=4)
    want = vm_outputs(build_program(mod, "llvm"), inputs)
    program = build_program(nchw, "llvm")
    np.testing.assert_allclose(vm_outputs(program, inputs)[0], want[0], rtol=1e-4, atol=1e-4)
    # broadcasting matmuls and 1-D operands stay with TVM; so does an affine op after relu
    broadcast = matmul_block((2, 5, 16), (16,))
    assert vendor_names(dispatch_to_vendor(broadcast, local_cpu_target())) == []

    def relu_then_scale(bb, x):
        y = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(x, const(4, 8, 1, 1)))))
        return bb.emit(relax.op.multiply(y, const(1, 4, 1, 1)))
    names = vendor_names(dispatch_to_vendor(module((1, 8, 5, 5), relu_then_scale),
                                            local_cpu_target()))
    assert [cost_name(n) for n in names] == ["paragraph.vendor.conv2d.NHWC.s1x1.p0x0.d1x1.g1.relu"]
    # a dilated pool stays with TVM (and so does relu after one); rounding up and uneven
    # padding are more padding at the bottom and right (a max, an average of real pixels)

    def odd_pools(bb, x):
        y = bb.emit(relax.op.nn.conv2d(x, const(4, 8, 1, 1)))
        up = bb.emit(relax.op.nn.max_pool2d(y, 3, 2, 0, ceil_mode=True))
        dilated = bb.emit(relax.op.nn.max_pool2d(y, 3, 1, 2, dilation=2))
        uneven = bb.emit(relax.op.nn.avg_pool2d(y, 3, 1, (0, 0, 1, 1)))
        plain = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.max_pool2d(y, 2, 2, 0))))
        return bb.emit(relax.Tuple([up, dilated, uneven, plain]))
    names = vendor_names(dispatch_to_vendor(module((1, 8, 8, 8), odd_pools), local_cpu_target()))
    assert sorted(cost_name(n) for n in names) == [
        "paragraph.vendor.avg_pool2d.NHWC.k3x3.s1x1.p0x0x1x1",
        "paragraph.vendor.conv2d.NHWC.s1x1.p0x0.d1x1.g1",
        "paragraph.vendor.max_pool2d.NHWC.k2x2.s2x2.p0x0",
        "paragraph.vendor.max_pool2d.NHWC.k3x3.s2x2.p0x0x1x1"]


def test_vendor_op_names_round_trip():
    names = [n for _, e in [*CONVS.values(), *MATMULS.values(), *CONCATS.values(),
                            *OTHERS.values()]
             for n in ([e] if isinstance(e, str) else e)]
    for name in names:
        full = f"paragraph.vendor.{name}"
        assert VendorOp.from_name(full).name == full
        if name.startswith("conv2d"):
            tagged = VendorOp.from_name(f"{full}.w0123abcd")
            assert tagged.weight == "0123abcd" and tagged.cost_name == full
    for act in EPILOGUES:  # every activation a convolution or product fuses
        for op in (VendorOp("conv2d", "NHWC", bias=True, residual=True, act=act),
                   VendorOp("matmul", act=act, weight="abc"), VendorOp("bmm", act=act)):
            assert VendorOp.from_name(op.name) == op
    for bad in ["paragraph.vendor.pool", "paragraph.vendor.conv2d.NHWC.s1.p0x0.d1x1.g1",
                "paragraph.vendor.matmul.swish", "tvm.contrib.cudnn.conv2d",
                "paragraph.vendor.concat.a1.silu",
                "paragraph.vendor.concat", "paragraph.vendor.concat.a1.w0123abcd",
                "paragraph.vendor.softmax", "paragraph.vendor.softmax.a1.w0123abcd",
                "paragraph.vendor.layer_norm", "paragraph.vendor.layer_norm.a1",
                "paragraph.vendor.layer_norm.e1e-5.w0123abcd",
                "paragraph.vendor.max_pool2d.NHWC.k3x3.s2x2",
                "paragraph.vendor.max_pool2d.NCHW.k3x3.s2x2.p0x0",
                "paragraph.vendor.max_pool2d.NHWC.k3x3.s2x2.p0x0.incpad",
                "paragraph.vendor.max_pool2d.NHWC.k3x3.s1x1.p1x1.relu",
                "paragraph.vendor.max_pool2d.NHWC.k3x3.s1x1.p1x1.bias",
                "paragraph.vendor.avg_pool2d.NHWC.k3x3.s1x1.p1x1.res",
                "paragraph.vendor.avg_pool2d.NHWC.k3x3.s1x1.p1x1.gelu"]:
        with pytest.raises(ParagraphError):
            VendorOp.from_name(bad)


def test_an_erf_gelu_whose_input_is_read_elsewhere_stays():
    """The chain is only absorbed where the matmul's result is read by the chain alone: a third
    reader needs the value before the activation."""
    def body(bb, x):
        y = bb.emit(relax.op.matmul(x, const(16, 8)))
        s = bb.emit(relax.op.divide(y, relax.const(np.float32(2 ** 0.5))))
        one_plus = bb.emit(relax.op.add(bb.emit(relax.op.erf(s)), relax.const(np.float32(1))))
        g = bb.emit(relax.op.multiply(bb.emit(relax.op.multiply(y, one_plus)),
                                      relax.const(np.float32(0.5))))
        return bb.emit(relax.op.add(g, y))
    mod = module((5, 16), body)
    assert [cost_name(n) for n in vendor_names(dispatch_to_vendor(mod, local_cpu_target()))] \
        == ["paragraph.vendor.matmul"]
    inputs = random_inputs(mod, seed=3)
    got = vm_outputs(build_program(mod, "llvm", kernels="vendor"), inputs)
    want = vm_outputs(build_program(mod, "llvm"), inputs)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)


def test_a_concat_read_elsewhere_too_is_not_flattened():
    def body(bb, x):
        inner = bb.emit(relax.op.concat([x, bb.emit(relax.op.exp(x))], axis=1))
        first = bb.emit(relax.op.concat([inner, x], axis=1))
        second = bb.emit(relax.op.concat([x, inner], axis=1))
        return bb.emit(relax.op.add(first, second))
    mod = module((1, 4, 3, 3), body)
    dispatched = dispatch_to_vendor(mod, local_cpu_target())
    assert vendor_names(dispatched) == ["paragraph.vendor.concat.a1"]
    calls = [b.value for b in dispatched["main"].body.blocks[0].bindings
             if "paragraph.vendor.concat" in str(b.value)]
    assert [len(c.args[1].fields) for c in calls] == [2, 2, 2]  # the shared one stays
    inputs = random_inputs(mod, seed=5)
    got = vm_outputs(build_program(mod, "llvm", kernels="vendor"), inputs)
    np.testing.assert_allclose(got[0], vm_outputs(build_program(mod, "llvm"), inputs)[0])


def test_a_recomputed_activation_is_merged_and_absorbed():
    """NASNet-A applies one ReLU to a tensor several times: the copies become one, which has
    the convolution as its only input and is absorbed into it; the two readers read it."""
    def body(bb, x):
        y = bb.emit(relax.op.nn.conv2d(x, const(4, 8, 1, 1)))
        a, b = (bb.emit(relax.op.nn.relu(y)) for _ in range(2))
        pa = bb.emit(relax.op.nn.max_pool2d(a, (3, 3), padding=(1, 1)))
        pb = bb.emit(relax.op.nn.max_pool2d(b, (3, 3), padding=(1, 1)))
        return bb.emit(relax.op.add(pa, pb))
    mod = module((1, 8, 5, 5), body)
    dispatched = dispatch_to_vendor(mod, local_cpu_target())
    # the two pools of the one ReLU are one pool too (a vendor kernel)
    assert sorted(cost_name(n) for n in vendor_names(dispatched)) == [
        "paragraph.vendor.conv2d.NHWC.s1x1.p0x0.d1x1.g1.relu",
        "paragraph.vendor.max_pool2d.NHWC.k3x3.s1x1.p1x1"]
    ops = [b.value.op.name for b in dispatched["main"].body.blocks[0].bindings
           if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)]
    assert ops.count("relax.nn.relu") == 0 and ops.count("relax.nn.max_pool2d") == 0
    inputs = random_inputs(mod, seed=6)
    got = vm_outputs(build_program(mod, "llvm", kernels="vendor"), inputs)
    np.testing.assert_allclose(got[0], vm_outputs(build_program(mod, "llvm"), inputs)[0],
                               rtol=1e-4, atol=1e-4)


def test_a_recomputed_split_is_merged_and_its_items_read_the_one_left():
    """The merged copy's readers are renamed wherever they read it: here tuple items of a
    split computed twice (a rewritten graph's), and a tuple the function returns."""
    def body(bb, x):
        y = bb.emit(relax.op.nn.conv2d(x, const(4, 8, 1, 1)))
        first, second = (bb.emit(relax.op.split(y, 2, axis=1)) for _ in range(2))
        a = bb.emit(relax.op.nn.relu(bb.emit(relax.TupleGetItem(first, 0))))
        b = bb.emit(relax.op.exp(bb.emit(relax.TupleGetItem(second, 1))))
        return bb.emit(relax.Tuple([a, b, bb.emit(relax.TupleGetItem(second, 0))]))
    mod = module((1, 8, 5, 5), body)
    dispatched = dispatch_to_vendor(mod, local_cpu_target())
    splits = [b for b in dispatched["main"].body.blocks[0].bindings
              if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)
              and b.value.op.name == "relax.split"]
    assert len(splits) == 1
    inputs = random_inputs(mod, seed=7)
    got = vm_outputs(build_program(mod, "llvm", kernels="vendor"), inputs)
    for g, w in zip(got, vm_outputs(build_program(mod, "llvm"), inputs), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def residual_blocks(bb, x):
    """A stem convolution, then three residual blocks (the residual added by a 1x1 convolution,
    which also has a GEMM form, a 3x3 and a 1x1 again), and a pool of the stem's output that
    reads it beside the blocks."""
    def conv(t, cout, k, relu=True):
        y = bb.emit(relax.op.nn.conv2d(t, const(cout, int(t.ty.shape[1]), k, k),
                                       padding=k // 2))
        return bb.emit(relax.op.nn.relu(y)) if relu else y
    stem = conv(x, 16, 3)
    z = bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(conv(conv(stem, 8, 1), 16, 1, False),
                                                      stem))))
    z2 = bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(conv(conv(z, 8, 1), 16, 3, False), z))))
    z3 = bb.emit(relax.op.add(conv(conv(z2, 8, 1), 16, 1, False), z2))
    pool = bb.emit(relax.op.nn.max_pool2d(stem, (3, 3), padding=(1, 1)))
    return bb.emit(relax.op.add(z3, pool))


@pytest.mark.parametrize("native", ["1", "0"])
def test_a_nan_and_infinities_come_out_where_tvm_kernels_put_them(monkeypatch, native):
    """A program of convolutions with relu, residuals and a pool, its input holding a NaN and
    infinities: the vendor kernels (C++ and Python, every schedule's executor, every form run
    in its first calls) give NaN and infinity exactly where the program with TVM's kernels
    gives them (oneDNN's fused relu made a NaN 0, a Winograd tile made NaN of an infinity's
    neighbours)."""
    monkeypatch.setenv("PARAGRAPH_NATIVE_VENDOR", native)
    from paragraph.tvm_interop.runtime.executor import make_executor

    mod = module((1, 8, 12, 12), residual_blocks)
    (x,) = random_inputs(mod, seed=5)
    x[0, 1, 2, 3], x[0, 4, 7, 7], x[0, 6, 10, 1] = np.nan, np.inf, -np.inf
    want = vm_outputs(build_program(mod, "llvm"), [x])[0]
    assert np.isnan(want).any() and np.isfinite(want).any()  # (the infinities make NaN)
    program = build_program(mod, "llvm", kernels="vendor")
    for algorithm in ("sequential", "critical-path"):
        with make_executor(program, make_schedule(algorithm, program.graph, cores=2)) as ex:
            for _ in range(12):  # the C++ kernels time their forms in their first calls
                (got,) = ex.run(x)
                np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("native", ["1", "0"])
def test_a_residual_convolution_writes_over_its_residual_in_place(monkeypatch, native):
    """The memory plan gives a residual convolution its residual's block where every other
    user of that block happens before it; the independent checker accepts exactly that, and
    the outputs stay the VM's over many runs (both forms of the 1x1 one are tried), with the
    C++ kernels and with the Python ones."""
    monkeypatch.setenv("PARAGRAPH_NATIVE_VENDOR", native)
    from paragraph.graph import TensorRef
    from paragraph.schedule import Schedule, ScheduleError, kernel_ids
    from paragraph.tvm_interop.runtime.executor import make_executor
    from paragraph.tvm_interop.runtime.memory import (
        check_memory_plan,
        in_place_operands,
        plan_memory,
    )

    mod = module((1, 8, 8, 8), residual_blocks)
    program = build_program(mod, "llvm", kernels="vendor")
    graph = program.graph
    in_place = in_place_operands(graph)
    assert len(in_place) == 3
    inputs = random_inputs(mod, seed=8)
    want = vm_outputs(program, inputs)
    written_over = 0
    for algorithm in ("sequential", "critical-path", "wavefront"):
        schedule = make_schedule(algorithm, graph, cores=2)
        plan = plan_memory(graph, schedule)
        check_memory_plan(graph, schedule, plan)
        before, index = schedule.happens_before(), {k: i for i, k in enumerate(schedule.kernels)}
        for k, r in in_place.items():
            users = {n.id for n in graph.nodes if r in n.inputs} - {k}
            alone = all(before[k] >> index[u] & 1 for u in users)
            assert (plan.block_of[TensorRef(k, 0)] == plan.block_of[r]) == alone, algorithm
            written_over += alone
        with make_executor(program, schedule) as ex:
            # float32 rounding relative to the outputs' scale (up to 40 here): the forms timed
            # (Winograd's among them) round differently from the VM's choices
            scale = max(1.0, float(np.abs(want[0]).max()))
            for _ in range(12):
                np.testing.assert_allclose(ex.run(*inputs)[0], want[0], rtol=1e-4,
                                           atol=1e-5 * scale)
    assert written_over >= 6  # the second and third blocks', at least, under every schedule
    # the pool on a stream of its own, unordered with the first residual convolution: writing
    # over the stem's output there would race with the pool's read
    k, r = min(in_place.items())
    pool = next(n.id for n in graph.nodes if n.kind == "kernel" and "pool" in n.attrs["func"])
    rest = [n for n in kernel_ids(graph) if n != pool]
    racy = Schedule.build(graph, [rest, [pool]])
    plan = plan_memory(graph, racy)
    assert plan.block_of[TensorRef(k, 0)] != plan.block_of[r]
    plan.block_of[TensorRef(k, 0)] = plan.block_of[r]
    with pytest.raises(ScheduleError, match="live at the same time"):
        check_memory_plan(graph, racy, plan)


def _profiled(fn, *args):
    from torch.profiler import ProfilerActivity, profile

    fn(*args)  # warm-up: oneDNN builds its primitive outside the profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn(*args)
    events = prof.key_averages()
    return {e.key for e in events}, sum(max(e.self_cpu_memory_usage, 0) for e in events)


def test_calls_are_zero_copy():
    """Inputs are DLPack views of the TVM tensors and results are computed in the output
    buffer: no torch allocation and no copy of the result during a call."""
    op = VendorOp("conv2d", "NHWC", (1, 1), (1, 1), (1, 1), 1, bias=True, act="relu",
                  weight="feedc0de")  # a tagged weight: packed on the first call, then reused
    ensure_registered(op.name)
    x = tvm.runtime.tensor(RNG.random((1, 16, 16, 8), dtype="float32"))
    w = tvm.runtime.tensor(RNG.random((12, 3, 3, 8), dtype="float32"))
    b = tvm.runtime.tensor(RNG.random(12, dtype="float32"))
    out = tvm.runtime.empty((1, 16, 16, 12), "float32")
    names, allocated = _profiled(tvm.get_global_func(op.name), x, w, b, out)
    assert allocated == 0 and "aten::copy_" not in names, names
    assert "mkldnn::_convolution_pointwise_" in names  # oneDNN's in-place form
    want = torch.relu(torch.nn.functional.conv2d(
        torch.from_dlpack(x).permute(0, 3, 1, 2), torch.from_dlpack(w).permute(0, 3, 1, 2),
        torch.from_dlpack(b), padding=1)).permute(0, 2, 3, 1)
    np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)

    a = tvm.runtime.tensor(RNG.random((2, 5, 16), dtype="float32"))
    m = tvm.runtime.tensor(RNG.random((16, 8), dtype="float32"))
    want = np.maximum(a.numpy() @ m.numpy(), 0)
    # a constant matrix (tagged): oneDNN's GEMM as an in-place 1x1 convolution; else MKL
    for op, engine in [(VendorOp("matmul", act="relu", weight="0ddba11"),
                        "mkldnn::_convolution_pointwise_"), (VendorOp("matmul", act="relu"),
                                                             "aten::mm")]:
        ensure_registered(op.name)
        out = tvm.runtime.empty((2, 5, 8), "float32")
        names, allocated = _profiled(tvm.get_global_func(op.name), a, m, out)
        assert allocated == 0 and "aten::copy_" not in names and engine in names, names
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)


def test_bound_calls_reuse_their_views_and_see_new_data():
    """What the executor calls: the kernel bound to its tensors once (`bind`), still zero-copy,
    reading whatever the buffers hold at call time."""
    op = VendorOp("conv2d", "NHWC", (1, 1), (0, 1, 2, 1), (1, 1), 1, bias=True, act="relu",
                  residual=True, weight="b0dec0de")  # TF-style padding: padded per call
    ensure_registered(op.name)
    x = tvm.runtime.tensor(RNG.random((1, 9, 9, 8), dtype="float32"))
    w = tvm.runtime.tensor(RNG.random((12, 3, 3, 8), dtype="float32"))
    b = tvm.runtime.tensor(RNG.random(12, dtype="float32"))
    res = tvm.runtime.tensor(RNG.random((1, 9, 9, 12), dtype="float32"))
    out, want = (tvm.runtime.empty((1, 9, 9, 12), "float32") for _ in range(2))
    call = bind(op.name, (x, w, b, res, out))
    for _ in range(3):
        x.copyfrom(RNG.random((1, 9, 9, 8), dtype="float32"))  # new data, same buffer
        call()
        tvm.get_global_func(op.name)(x, w, b, res, want)
        np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-6, atol=1e-6)
    names, _ = _profiled(call)
    assert "aten::copy_" in names and "mkldnn::_convolution_pointwise_" in names  # residual
    a = tvm.runtime.tensor(RNG.random((2, 5, 16), dtype="float32"))
    m = tvm.runtime.tensor(RNG.random((16, 8), dtype="float32"))
    op = VendorOp("matmul", act="relu", weight="b0d")
    ensure_registered(op.name)
    out = tvm.runtime.empty((2, 5, 8), "float32")
    call = bind(op.name, (a, m, out))
    names, allocated = _profiled(call)
    assert allocated == 0 and "aten::copy_" not in names
    np.testing.assert_allclose(out.numpy(), np.maximum(a.numpy() @ m.numpy(), 0), rtol=1e-5,
                               atol=1e-5)
    assert bind("paragraph_test.not_a_vendor_kernel", (a, m, out)) is None


def test_small_kernels_time_both_forms_and_keep_the_faster():
    """A bound 1x1 convolution (bias, residual, relu) and a linear layer (bias, gelu) have two
    forms, oneDNN's in-place kernel and MKL's GEMM in place: the first calls alternate between
    them, timed, then the faster by median is kept (and bindings made later start with it);
    every call computes the same result."""
    from paragraph.tvm_interop.runtime.library.torch_kernels import TRIALS, _Fastest

    conv = VendorOp("conv2d", "NHWC", (1, 1), (0, 0), (1, 1), 1, bias=True, residual=True,
                    act="relu", weight="c0ffee")
    x = tvm.runtime.tensor(RNG.random((1, 6, 6, 8), dtype="float32"))
    w = RNG.standard_normal((12, 1, 1, 8)).astype("float32")
    b = RNG.standard_normal(12).astype("float32")
    res = tvm.runtime.tensor(RNG.random((1, 6, 6, 12), dtype="float32"))
    out = tvm.runtime.empty((1, 6, 6, 12), "float32")
    lin = VendorOp("matmul", bias=True, act="gelu", weight="facade")
    a = tvm.runtime.tensor(RNG.random((3, 16), dtype="float32"))
    m = RNG.standard_normal((16, 8)).astype("float32")
    mb = RNG.standard_normal(8).astype("float32")
    out2 = tvm.runtime.empty((3, 8), "float32")
    cases = [(conv, (x, tvm.runtime.tensor(w), tvm.runtime.tensor(b), res, out), out,
              lambda: np.maximum(np.einsum("nhwc,oc->nhwo", x.numpy(), w[:, 0, 0]) + b
                                 + res.numpy(), 0)),
             (lin, (a, tvm.runtime.tensor(m), tvm.runtime.tensor(mb), out2), out2,
              lambda: torch.nn.functional.gelu(torch.from_numpy(a.numpy() @ m + mb)).numpy())]
    for op, args, result, reference in cases:
        ensure_registered(op.name)
        call = bind(op.name, args)
        assert isinstance(call, _Fastest) and len(call.variants) == 2
        for _ in range(2 * (TRIALS + 1) + 3):
            args[0].copyfrom(RNG.random(args[0].shape, dtype="float32"))
            call()
            np.testing.assert_allclose(result.numpy(), reference(), rtol=1e-4, atol=1e-4,
                                       err_msg=op.name)
        n = torch.get_num_threads()
        assert all(len(t) == TRIALS + 1 for t in call.samples[n]) and n in call.chosen
        again = bind(op.name, args)  # a later executor's binding starts with the choice
        again()
        assert n in again.chosen and not again.samples
    # only where a GEMM form exists: a 3x3 convolution keeps oneDNN's kernel alone
    three = VendorOp("conv2d", "NHWC", (1, 1), (1, 1), (1, 1), 1, weight="c0ffee3")
    ensure_registered(three.name)
    w3 = tvm.runtime.tensor(RNG.random((12, 3, 3, 8), dtype="float32"))
    assert not isinstance(bind(three.name, (x, w3, out)), _Fastest)


def _cpp_module():
    def body(bb, x):
        y = bb.emit(relax.op.nn.conv2d(x, const(8, 8, 1, 1)))
        y = bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(bb.emit(relax.op.add(
            y, const(1, 8, 1, 1))), x))))  # 1x1 + bias + residual + relu: two forms
        z = bb.emit(relax.op.nn.conv2d(y, const(6, 8, 3, 3), strides=2, padding=(0, 1, 1, 2)))
        r = bb.emit(relax.op.reshape(z, (6, -1)))
        g = bb.emit(relax.op.nn.gelu(bb.emit(relax.op.add(
            bb.emit(relax.op.matmul(r, const(r.ty.shape[1].value, 6))), const(6)))))
        # attention's kernels: products of two activations, softmax, a concatenation
        scores = bb.emit(relax.op.nn.softmax(bb.emit(relax.op.matmul(
            g, bb.emit(relax.op.permute_dims(g, (1, 0)))))))
        h = bb.emit(relax.op.reshape(g, (2, 3, 6)))
        ctx = bb.emit(relax.op.matmul(h, bb.emit(relax.op.permute_dims(h, (0, 2, 1)))))
        c = bb.emit(relax.op.concat([scores, bb.emit(relax.op.reshape(ctx, (6, 3)))], axis=1))
        # layer norm with the residual add before it, then without one
        ln = bb.emit(relax.op.nn.layer_norm(
            bb.emit(relax.op.add(c, bb.emit(relax.op.multiply(c, relax.const(2.0))))),
            const(9), const(9), axes=[-1], epsilon=1e-5))
        return bb.emit(relax.op.nn.layer_norm(ln, const(9), const(9), axes=[-1],
                                              epsilon=1e-3))
    return module((1, 8, 9, 9), body)


def test_cpu_vendor_kernels_run_in_cpp_without_the_gil(monkeypatch, tmp_path):
    """On the CPU the executor binds every vendor kernel (convolutions, products with a
    constant matrix and of two activations, batched products, softmax, concatenation, layer
    norm) to its C++ form (`vendor.native`: TVM FFI functions the native runner calls without
    the GIL); their outputs equal the Python kernels' and TVM's over enough runs for both
    forms of the 1x1 convolution and the product to be tried. Switched off, or where the C++
    build fails (with a warning), the Python kernels run."""
    import tvm_ffi

    from paragraph.tvm_interop.runtime.library import native as native_vendor

    mod = _cpp_module()
    inputs = random_inputs(mod, seed=2)
    program = build_program(mod, "llvm", kernels="vendor")
    want = vm_outputs(build_program(mod, "llvm"), inputs)
    vendor_kernels = [n.id for n in program.kernels if n.attrs.get("source") == "vendor"]
    kinds = sorted(VendorOp.from_name(program.graph[k].attrs["func"]).kind
                   for k in vendor_kernels)
    assert kinds == ["bmm", "concat", "conv2d", "conv2d", "layer_norm", "layer_norm", "matmul",
                     "matmul", "softmax"]
    assert sum(VendorOp.from_name(program.graph[k].attrs["func"]).residual
               for k in vendor_kernels) == 2  # the conv's and the first layer norm's

    def check(cpp: bool) -> None:
        for algorithm in ("sequential", "critical-path"):
            schedule = make_schedule(algorithm, program.graph, cores=2)
            with make_executor(program, schedule) as ex:
                assert all(isinstance(ex.steps[k].fn, tvm_ffi.Function) == cpp
                           for k in vendor_kernels)
                for _ in range(12):
                    for got, ref in zip(ex.run(*inputs), want, strict=True):
                        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)

    check(cpp=True)
    monkeypatch.setenv("PARAGRAPH_NATIVE_VENDOR", "0")
    check(cpp=False)
    monkeypatch.delenv("PARAGRAPH_NATIVE_VENDOR")
    monkeypatch.setenv("PARAGRAPH_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "false")  # a "compiler" that always fails
    monkeypatch.setattr(native_vendor, "_state", {})
    with pytest.warns(RuntimeWarning, match="C\\+\\+ vendor kernels are unavailable"):
        check(cpp=False)
    assert "failed" in native_vendor.reason()


def test_products_sharing_a_weight_share_its_packed_form_and_stay_exact():
    """An RNN's steps multiply by one matrix: the C++ products pack it once and share it
    (a packed copy per call kept the SRU's weights out of cache); products with another matrix
    of the same shape, and executors bound after earlier ones were closed (their buffers'
    addresses reused), still compute with their own weights."""
    from paragraph.graph import GraphBuilder
    from paragraph.tvm_interop.frontend.relax_graph import to_relax

    rng = np.random.default_rng(3)
    b = GraphBuilder()
    x = b.input((1, 64), "float32", name="x")
    w, v = (b.weight(rng.standard_normal((64, 64)).astype("float32") / 8) for _ in range(2))
    h = x
    for step in range(4):  # three steps by w, one by v, each with its own activation
        h = b.op("matmul", [h, v if step == 2 else w]).out
        h = b.op("tanh", [h]).out
    mod = to_relax(b.build([h]))
    inputs = random_inputs(mod, seed=4)
    want = vm_outputs(build_program(mod, "llvm"), inputs)
    for _ in range(3):  # later executors bind where closed ones were
        program = build_program(mod, "llvm", kernels="vendor")
        assert sum(n.attrs.get("source") == "vendor" for n in program.kernels) == 4
        with make_executor(program, make_schedule("sequential", program.graph)) as ex:
            for _ in range(12):  # both forms (oneDNN's packed, MKL's) tried, then the faster
                np.testing.assert_allclose(ex.run(*inputs)[0], want[0], rtol=1e-4, atol=1e-5)


def test_a_weight_is_packed_once_per_thread_count():
    """oneDNN blocks a weight for the threads that run it: two products by one matrix (an
    RNN's steps share it) in one executor, one of them capped at one thread
    (`Schedule.kernel_threads`), get a packing each, for their own thread counts."""
    from dataclasses import replace

    from paragraph.graph import GraphBuilder
    from paragraph.tvm_interop.frontend.relax_graph import to_relax
    from paragraph.tvm_interop.runtime.library import native as native_vendor

    if native_vendor.module() is None:
        pytest.skip(f"C++ vendor kernels unavailable: {native_vendor.reason()}")
    rng = np.random.default_rng(5)
    b = GraphBuilder()
    x = b.input((4, 64), "float32", name="x")
    w = b.weight(rng.standard_normal((64, 64)).astype("float32") / 8)
    h = b.op("tanh", [b.op("matmul", [x, w]).out]).out
    mod = to_relax(b.build([b.op("tanh", [b.op("matmul", [h, w]).out]).out]))
    program = build_program(mod, "llvm", kernels="vendor")
    products = [n.id for n in program.kernels if n.attrs.get("source") == "vendor"]
    assert len(products) == 2
    schedule = make_schedule("sequential", program.graph, cores=2)
    schedule = replace(schedule, kernel_threads={products[0]: 1})
    keys = native_vendor.module()["paragraph_vendor_packed_keys"]
    inputs = random_inputs(mod, seed=6)
    want = vm_outputs(build_program(mod, "llvm"), inputs)
    with make_executor(program, schedule) as ex:
        for _ in range(12):  # both forms tried on both thread counts
            np.testing.assert_allclose(ex.run(*inputs)[0], want[0], rtol=1e-4, atol=1e-5)
        by_weight: dict[str, set[str]] = {}
        for k in map(str, keys()):
            weight, _, threads = k.rpartition("@")
            by_weight.setdefault(weight, set()).add(threads)
        assert {"1", "2"} in by_weight.values()


def test_forms_not_chosen_release_their_packed_weights():
    """Each form of a product packs its own copy of the weight (oneDNN's blocked one, the own
    GEMM's panels); once the first calls have chosen a form, the others are dropped and so
    are the copies only they held, so a model's weights are not held three times over."""
    import tvm_ffi

    from paragraph.tvm_interop.runtime.library import native

    module = native.module()
    if module is None:
        pytest.skip(f"the C++ vendor kernels are unavailable: {native.reason()}")
    gen = torch.Generator().manual_seed(3)
    a, w, b = torch.randn(64, 256, generator=gen), torch.randn(256, 256, generator=gen), None
    out = torch.empty(64, 256)
    fn = module["paragraph_vendor_linear"](tvm_ffi.from_dlpack(out), tvm_ffi.from_dlpack(a),
                                           tvm_ffi.from_dlpack(w), b, "", 1)

    def packings(weight: torch.Tensor = w) -> list[str]:
        return [k for k in map(str, module["paragraph_vendor_packed_keys"]())
                if k.startswith(str(weight.data_ptr()))]

    assert packings() == []  # each form packs on its first call, not at binding
    for i in range(16):  # three forms timed five times each, then the fastest
        fn()
        torch.testing.assert_close(out, a @ w, rtol=1e-4, atol=1e-4)
        if i == 2:  # each form has run once: oneDNN's and the own GEMM's (MKL's per call)
            assert len(packings()) == 2
    chosen = [c for c in map(str, module["paragraph_vendor_chosen_forms"]())
              if c.startswith("linear1(64,256,)(256,256,)")]
    assert len(chosen) == 1
    held = 0 if chosen[0].endswith("=1") else 1
    assert len(packings()) == held
    del fn
    # a kernel bound with its form chosen already (an artifact's forms) packs that one only
    w2 = torch.randn(256, 256, generator=gen)
    fn = module["paragraph_vendor_linear"](tvm_ffi.from_dlpack(out), tvm_ffi.from_dlpack(a),
                                           tvm_ffi.from_dlpack(w2), b, "", 1)
    for _ in range(3):
        fn()
        torch.testing.assert_close(out, a @ w2, rtol=1e-4, atol=1e-4)
        assert len(packings(w2)) == held
    del fn


def test_each_stream_thread_gets_its_schedule_thread_count():
    """torch.set_num_threads is per calling thread (OpenMP/MKL), so a vendor call sizes torch's
    pool from the thread count the executor gave its stream, without touching other threads."""
    op = VendorOp("matmul")
    ensure_registered(op.name)
    fn = tvm.get_global_func(op.name)
    a = tvm.runtime.tensor(RNG.random((8, 8), dtype="float32"))
    before = torch.get_num_threads()
    seen = {}

    def worker(n):
        config_threads(n)
        out = tvm.runtime.empty((8, 8), "float32")
        fn(a, a, out)
        seen[n] = torch.get_num_threads()

    for n in (1, 2):
        t = threading.Thread(target=worker, args=(n,))
        t.start()
        t.join()
    assert seen == {1: 1, 2: 2}
    assert torch.get_num_threads() == before


def test_a_kernel_thread_cap_runs_the_call_on_fewer_threads():
    """A bound call with ``threads`` (the schedule's ``kernel_threads``) runs torch on that many
    threads inside a stream of more, and on the stream's count without it."""
    a = tvm.runtime.tensor(RNG.random((8, 8), dtype="float32"))
    out = tvm.runtime.empty((8, 8), "float32")
    ensure_registered(VendorOp("matmul").name)
    seen = []

    def worker():
        config_threads(2)
        for cap in (1, None):
            bind(VendorOp("matmul").name, (a, a, out), threads=cap)()
            seen.append(torch.get_num_threads())

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == [1, 2]


def test_kernels_measured_faster_on_one_thread_are_capped(tmp_path):
    """`fewer_threads_where_faster` caps only vendor kernels of multi-thread streams, to one
    thread, from measurements it caches; the capped schedule validates, survives JSON and runs
    with the same outputs; a cap beyond its stream's threads is refused."""
    from paragraph.planner import Session
    from paragraph.planner.critical_path import fewer_threads_where_faster
    from paragraph.schedule import Schedule, ScheduleError

    mod = models.get("nasnet_a_mobile", reduced=True)
    program = build_program(mod, "llvm", kernels="vendor")
    inputs = random_inputs(mod, seed=1)
    g = program.graph
    wide = make_schedule("sequential", g, cores=2)
    db = CostDB(tmp_path / "costs.sqlite")
    session = Session(db=db)
    capped = fewer_threads_where_faster(program, wide, session)
    vendor_kernels = {n.id for n in program.kernels if n.attrs.get("source") == "vendor"}
    assert set(capped.kernel_threads) <= vendor_kernels
    assert set(capped.kernel_threads.values()) <= {1}
    measured = len(db)
    assert fewer_threads_where_faster(program, wide, session) == capped  # from the cache
    assert len(db) == measured
    every = Schedule.build(g, wide.streams, threads=2)
    every = Schedule(**{**every.__dict__, "kernel_threads": dict.fromkeys(vendor_kernels, 1)})
    assert Schedule.from_json(every.dumps(), g) == every
    with make_executor(program, wide) as plain, make_executor(program, every) as fewer:
        for got, want in zip(fewer.run(*inputs), plain.run(*inputs), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert fewer_threads_where_faster(program, make_schedule("sequential", g, cores=1),
                                      session).kernel_threads == {}  # 1 thread: nothing to cap
    k = next(iter(vendor_kernels))
    for bad in ({k: 3}, {k: 0}, {-5: 1}):
        with pytest.raises(ScheduleError, match="cannot run on"):
            Schedule(**{**every.__dict__, "kernel_threads": bad}).validate(g)


@pytest.mark.parametrize("name", zoo_for_schedules())
def test_every_zoo_model_with_vendor_kernels_under_every_schedule(name):
    mod = models.get(name, reduced=True)
    inputs = random_inputs(mod, seed=1)
    want = run_graph(from_relax(mod), inputs)  # paragraph's numpy reference of every operator
    program = build_program(mod, "llvm", kernels="vendor")
    assert program.sources().get("vendor", 0) > 0
    vm = vm_outputs(program, inputs)
    for got, ref in zip(vm, want, strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4, err_msg=name)
    vendor_kernels = {n.id for n in program.kernels if n.kind == "kernel"
                      and n.attrs["source"] == "vendor"}
    for algorithm in ALGORITHMS:
        with make_executor(program, make_schedule(algorithm, program.graph)) as executor:
            assert all(executor.steps[k].args == () for k in vendor_kernels)  # bound once
            for got, ref in zip(executor.run(*inputs), vm, strict=True):
                # the same kernels, but a kernel still timing its forms runs the next one in
                # each call, and forms round differently (BERT's layer norms and softmaxes have
                # two each, with or without AVX-512): float32 rounding of the outputs' scale
                scale = max(1.0, float(np.abs(ref).max()))
                np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * scale,
                                           err_msg=f"{name}/{algorithm}")


def test_auto_measures_each_kernel_once_and_records_its_source(tmp_path):
    mod = models.get("squeezenet1_1", reduced=True)
    logged = []
    db = CostDB(tmp_path / "costs.sqlite")
    target = local_cpu_target()

    def choose():
        return choose_fastest(dispatch_to_vendor(prepare(mod), target), target, db=db,
                              log=logged.append,
                              build=lambda probe: build_program(probe, target))

    chosen = choose()
    rows = db.conn.execute(f"SELECT source, COUNT(*) FROM {TABLE} GROUP BY source").fetchall()
    counts = dict(rows)
    assert counts.get("vendor", 0) >= 3 and counts.get("tvm", 0) >= 3  # 3 distinct calls here
    assert any("timing" in line for line in logged)
    logged.clear()
    again = choose()
    assert not any("timing" in line for line in logged)  # every cost came from the database
    assert vendor_names(again) == vendor_names(chosen)
    inputs = random_inputs(mod, seed=2)
    want = vm_outputs(build_program(mod, "llvm"), inputs)
    program = build_program(mod, "llvm", kernels="auto")
    np.testing.assert_allclose(vm_outputs(program, inputs)[0], want[0], rtol=1e-4, atol=1e-4)


def test_auto_takes_back_an_asymmetrically_padded_convolution():
    """`--kernels auto` compiles each vendor call's TVM form too: a TF-style padded
    convolution (NASNet's) keeps its four paddings on the way back to Relax."""
    mod, _ = CONVS["conv_asymmetric_padding"]
    inputs = random_inputs(mod, seed=4)
    want = vm_outputs(build_program(mod, "llvm"), inputs)
    program = build_program(mod, "llvm", kernels="auto")
    np.testing.assert_allclose(vm_outputs(program, inputs)[0], want[0], rtol=1e-4, atol=1e-4)


def test_compile_then_run_in_a_fresh_process(tmp_path, capsys):
    out = tmp_path / "squeezenet.paragraph"
    assert main(["compile", "squeezenet1_1", "--reduced", "--kernels", "vendor",
                 "--schedule", "opara", "-o", str(out)]) == 0
    exe = load(out)
    assert exe.manifest["kernels"] == "vendor" and exe.program.sources()["vendor"] > 0
    # the C++ kernels this process built, in the cache the fresh process reads (the test's
    # private one): found there, not compiled again (most of this test's minute)
    env = {**os.environ, "PARAGRAPH_CACHE_DIR": str(with_native_libraries(tmp_path / "cache"))}
    run = subprocess.run([sys.executable, "-m", "paragraph", "run", str(out), "--repeat", "2"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr
    assert "equal" in run.stdout and "opara" in run.stdout
    with pytest.raises(ParagraphError, match="is a directory, not a paragraph artifact"):
        load(tmp_path)


def test_a_program_settles_once_its_kernels_have_chosen_their_forms():
    """`measure.settle` runs a vendor program until no C++ kernel is timing its forms: a first
    executor takes several runs (at most SETTLE_RUNS), a second of the same program, whose
    kernels start with the first's choices, one. In a fresh process (the count is the
    process's), with the kernels this one built."""
    from paragraph.tvm_interop.runtime.library import native

    if native.module() is None:
        pytest.skip(f"the C++ vendor kernels are unavailable: {native.reason()}")
    script = textwrap.dedent("""
        from paragraph import models
        from paragraph.passes.schedule import make_schedule
        from paragraph.tvm_interop import random_inputs
        from paragraph.tvm_interop.runtime.executor import make_executor
        from paragraph.tvm_interop.build.program import build_program
        from paragraph.tvm_interop.runtime.program import KernelProgram
        from paragraph.tvm_interop.measure.device import settle
        from paragraph.tvm_interop.runtime.library.native import timing_kernels
        mod = models.get("inception_v3", reduced=True)
        program = build_program(mod, "llvm", kernels="vendor")
        inputs = random_inputs(mod)
        schedule = make_schedule("sequential", program.graph, cores=2)
        with make_executor(program, schedule) as first:
            print("BOUND", timing_kernels())
            print("FIRST", settle(lambda: first.run(*inputs), program.sources()), timing_kernels())
            with make_executor(program, schedule) as second:
                print("SECOND", settle(lambda: second.run(*inputs), program.sources()))
    """)
    env = {**os.environ, "PARAGRAPH_CACHE_DIR": str(native._state["path"].parent.parent)}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=600, env=env)
    assert run.returncode == 0, run.stderr
    got = dict(line.split(" ", 1) for line in run.stdout.splitlines() if " " in line)
    assert int(got["BOUND"]) > 0
    first, left = (int(v) for v in got["FIRST"].split())
    assert 1 < first <= SETTLE_RUNS and left == 0
    assert int(got["SECOND"]) == 1


def test_without_pytorch_the_pass_says_so_and_tvm_kernels_run(tmp_path):
    script = textwrap.dedent("""
        import sys, warnings
        sys.modules["torch"] = None  # import torch now raises ImportError
        import numpy as np
        from paragraph import models
        from paragraph.tvm_interop.build.program import build_program
        from paragraph.tvm_interop.runtime.program import KernelProgram
        from paragraph.tvm_interop.runtime.library.torch_kernels import (
            VendorUnavailableError,
            ensure_registered,
        )
        mod = models.get("squeezenet1_1", reduced=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            program = build_program(mod, "llvm", kernels="vendor")
        print("WARNED", [str(w.message) for w in caught])
        print("SOURCES", program.sources())
        try:
            ensure_registered("paragraph.vendor.matmul")
        except VendorUnavailableError as e:
            print("ERROR", e)
    """)
    env = {**os.environ, "PARAGRAPH_CACHE_DIR": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, env=env)
    assert run.returncode == 0, run.stderr
    assert "vendor kernels need PyTorch" in run.stdout
    assert "SOURCES {'tvm':" in run.stdout and "'vendor'" not in run.stdout.split("SOURCES")[1]
    assert "ERROR vendor kernels need PyTorch" in run.stdout


# ---------------------------------------------------------------------------- CUDA
def _cuda_ready() -> bool:
    return gpu_available() and torch.cuda.is_available()


cuda = pytest.mark.skipif(not _cuda_ready(), reason="no CUDA GPU visible to TVM and PyTorch: "
                          "the cuDNN/cuBLAS paths compile but cannot run here")


@cuda
@pytest.mark.parametrize("case", ["conv_bn_relu", "conv_stride2_bn_residual_relu",
                                  "conv_asymmetric_padding", "linear3d_bias_relu", "bmm4d"])
def test_cuda_patterns_match_tvm_kernels(case):
    mod, expected = {**CONVS, **MATMULS}[case]
    inputs = random_inputs(mod, seed=3)
    vendor = build_program(mod, "cuda", kernels="vendor")
    # one vendor kernel per convolution or matmul (the residual case has two convolutions)
    assert vendor.sources().get("vendor") == (1 if isinstance(expected, str) else len(expected))
    want = vm_outputs(build_program(mod, "cuda"), inputs)
    np.testing.assert_allclose(vm_outputs(vendor, inputs)[0], want[0], rtol=1e-3, atol=1e-3)


@cuda
@pytest.mark.parametrize("name", ["inception_v3", "nasnet_a_mobile", "bert"])
def test_cuda_multistream_graph_capture_with_vendor_kernels(name):
    """Each vendor call runs on the executor's stream for its schedule stream (else capture
    would miss it or fail), and the whole multi-stream run is one CUDA Graph. NASNet-A's
    TF-style padded convolutions pad in torch first: that copy too must be on the stream."""
    mod = models.get(name, reduced=True)
    inputs = random_inputs(mod, seed=1)
    program = build_program(mod, "cuda", kernels="vendor")
    want = vm_outputs(program, inputs)
    for algorithm in ("sequential", "opara", "nimble"):
        schedule = make_schedule(algorithm, program.graph)
        with make_executor(program, schedule, use_cuda_graph=True) as executor:
            assert executor.graph_exec is not None
            for _ in range(3):  # replays reuse the captured workspaces
                got = executor.run(*inputs)
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-3, err_msg=algorithm)


def test_cli_verbs_take_the_kernel_source(capsys, tmp_path):
    assert main(["run", "squeezenet1_1", "--reduced", "--kernels", "vendor", "--schedule",
                 "nimble", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert "vendor kernels" in out and "equal" in out
    assert main(["bench", "squeezenet1_1", "--reduced", "--kernels", "vendor", "--schedules",
                 "sequential", "--repeat", "2", "--json", str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith(("tvm_", "executor:"))]
    assert {r[0]: r[1] for r in rows} == {"tvm_vm": "vendor", "tvm_compile_default": "tvm",
                                          "executor:sequential": "vendor"}


def test_cuda_dispatch_compiles_here(monkeypatch):
    """The CUDA form of the pass (NCHW, float16 allowed, no weight packing) and a CUDA build of
    its result, without a GPU; without a CUDA PyTorch the pass keeps TVM's kernels."""
    from paragraph.tvm_interop.runtime.target import CUDA_COMPILE_ONLY

    target = tvm.target.Target(CUDA_COMPILE_ONLY)
    mod, _ = CONVS["conv_stride2_bn_residual_relu"]
    if not torch.cuda.is_available():
        with pytest.warns(RuntimeWarning, match="no CUDA"):
            assert vendor_names(dispatch_to_vendor(mod, target)) == []
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    names = vendor_names(dispatch_to_vendor(mod, target))
    assert sorted(names) == ["paragraph.vendor.conv2d.NCHW.s2x2.p0x0.d1x1.g1",
                             "paragraph.vendor.conv2d.NCHW.s2x2.p1x1.d1x1.g1.bias.res.relu"]
    program = build_program(mod, target, kernels="vendor")
    assert program.sources() == {"vendor": 2}


def _split_then_unfolded_batch_norm():
    """A convolution whose output is split in two, each half through a batch norm that cannot
    fold into it (subtract, divide, multiply, add) and a relu: what a search candidate that
    merged two convolutions made of Inception-v3."""
    from paragraph import GraphBuilder
    from paragraph.graph import TensorRef

    b = GraphBuilder()
    x = b.input((1, 8, 8, 8))
    y = b.op("conv2d", [x, b.weight(RNG.standard_normal((16, 8, 1, 1)).astype("float32"))])
    parts = b.op("split", [y.out], {"indices_or_sections": 2, "axis": 1})
    outs = []
    for i in range(2):
        r = TensorRef(parts.id, i)
        for kind in ("subtract", "divide", "multiply", "add"):
            r = b.op(kind, [r, b.weight(RNG.uniform(0.5, 1.5, (1, 8, 1, 1)).astype("float32"))]).out
        outs.append(b.op("relu", [r]).out)
    return b.build(outs)


@pytest.mark.parametrize("where", ["cpu", "cuda"])
def test_the_vm_module_keeps_every_kernel_of_the_graph(where, monkeypatch):
    """TVM's whole default pipeline on a lowered module legalizes the split again and fuses it
    into the kernels after it, under a new name: on an H100 a search candidate's kernel was
    then missing from the VM's module. `build_pipeline` (what paragraph compiles a lowered
    module with) keeps every kernel of the graph, on a CPU and for CUDA (compiled here without
    a GPU), and the program links."""
    from paragraph.tvm_interop.build.lowering import build_pipeline
    from paragraph.tvm_interop.frontend.relax_graph import to_relax
    from paragraph.tvm_interop.runtime.target import CUDA_COMPILE_ONLY

    if where == "cuda" and not torch.cuda.is_available():
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # compile only
    target = tvm.target.Target(CUDA_COMPILE_ONLY if where == "cuda" else "llvm")
    g = _split_then_unfolded_batch_norm()
    for kernels in ("vendor", "tvm"):
        program = build_program(to_relax(g), target, kernels=kernels)
        with target:
            final = build_pipeline(target)(program.lowered)
        compiled = {gv.name_hint for gv, f in final.functions.items()
                    if isinstance(f, tvm.tirx.PrimFunc)}
        ours = {n.attrs["func"] for n in program.graph.nodes
                if n.kind == "kernel" and n.attrs["source"] == "tvm"}
        assert any(name.startswith("fused_subtract") for name in ours)
        assert ours <= compiled
        if where == "cpu":  # the VM runs the very kernels the executor runs
            inputs = random_inputs(to_relax(g))
            got = make_executor(program, make_schedule("sequential", program.graph)).run(*inputs)
            want = program.vm()["main"](*[tvm.runtime.tensor(a) for a in inputs])
            for a, b in zip(got, want, strict=True):
                np.testing.assert_allclose(np.asarray(a), b.numpy(), rtol=1e-5, atol=1e-5)


def test_randwire_compiles_for_cuda_with_tvm_kernels():
    """dlight's GEMV rule failed with a bare AssertionError on one of RandWire's kernels (TVM
    0.27), so `--target cuda --kernels tvm` crashed while lowering: rules that fail now decline
    the kernel and the next rule schedules it. Compiled here without a GPU."""
    from paragraph.tvm_interop.runtime.target import CUDA_COMPILE_ONLY

    program = build_program(models.get("randwire", reduced=True),
                                  tvm.target.Target(CUDA_COMPILE_ONLY), kernels="tvm")
    assert program.sources()["tvm"] > 100


@pytest.mark.parametrize("shape", [(64, 1024), (3, 37), (2, 5, 16)])
@pytest.mark.parametrize("residual", [True, False])
def test_native_layer_norm_forms_agree_with_torch(shape, residual):
    """The C++ layer norm's two forms (ATen's add and norm; one AVX-512 pass, 2x faster on
    BERT's rows) both run in its first calls, which time them: every call equals torch's,
    rows of any length (a tail after the 16-wide vectors), with and without the residual."""
    import tvm_ffi

    from paragraph.tvm_interop.runtime.library import native

    module = native.module()
    if module is None:
        pytest.skip(f"the C++ vendor kernels are unavailable: {native.reason()}")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=gen) * 3 + 1
    res = torch.randn(*shape, generator=gen)
    gamma, beta = torch.randn(shape[-1], generator=gen), torch.randn(shape[-1], generator=gen)
    out = torch.empty_like(x)
    fn = module["paragraph_vendor_layer_norm"](
        *(tvm_ffi.from_dlpack(t) for t in (out, x, gamma, beta)),
        tvm_ffi.from_dlpack(res) if residual else None, 1e-12, 1)
    want = torch.nn.functional.layer_norm(x + res if residual else x, shape[-1:], gamma, beta,
                                          1e-12)
    for _ in range(12):  # both forms timed, then the faster
        out.fill_(float("nan"))
        fn()
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("shape", "axis"), [
    ((1, 12, 128, 128), -1),   # BERT's attention rows: split over two threads
    ((3, 37), 1),              # a tail after the 16-wide vectors
    ((2, 5, 7), -1),           # rows shorter than a vector
    ((4, 6, 8), 1),            # not the last axis: ATen's alone
])
@pytest.mark.parametrize("form", [0, 1, 2])
@pytest.mark.parametrize("scale", [1.0, 0.125, -0.5])
def test_native_softmax_forms_agree_with_torch(threads, shape, axis, form, scale):
    """The C++ softmax's forms (the own AVX-512 one along the last axis, ATen's, and on two
    threads the own one on the calling thread alone), each forced
    before the first call: every call equals torch's softmax of ``scale * x``, for rows of any
    length, with large and -inf entries (an attention mask's), a row with a NaN giving NaN and
    a row of -inf NaN, as torch's; along another axis ATen's runs whatever the form asked."""
    import tvm_ffi

    from paragraph.tvm_interop.runtime.library import native

    module = native.module()
    if module is None:
        pytest.skip(f"the C++ vendor kernels are unavailable: {native.reason()}")
    gen = torch.Generator().manual_seed(sum(shape) + form)
    x = torch.randn(*shape, generator=gen) * 8
    flat = x.view(-1, shape[-1])
    flat[0, : shape[-1] // 2] = float("-inf")  # a masked half row
    flat[-1, 0] = 300.0  # e^(x - max) must not overflow
    if flat.shape[0] > 2:
        flat[1, 1] = float("nan")
        flat[2, :] = float("-inf")
    key = f"softmax{threads}" + "(" + "".join(f"{d}," for d in shape) + ")"
    module["paragraph_vendor_choose_form"](key, form)
    out = torch.empty_like(x)
    fn = module["paragraph_vendor_softmax"](tvm_ffi.from_dlpack(out), tvm_ffi.from_dlpack(x),
                                            axis, scale, threads)
    want = torch.softmax(x * scale, axis)
    for _ in range(3):
        out.fill_(-1.0)
        fn()
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("rows", "k", "n", "residual", "act"), [
    (49, 176, 176, "", "relu"),      # NASNet's: a 16-column tail panel, rows not a tile multiple
    (30, 44, 44, "own", ""),         # residual in its own buffer
    (12, 64, 96, "in place", "relu"),  # the memory plan's residual written over
    (7, 33, 200, "", ""),
    (20, 2500, 64, "in place", "relu"),  # K in three shares, the residual written over
    (26, 2100, 96, "own", ""),             # K in three shares, a panel split on two threads
    (30, 40, 96, "", "relu"),              # three panels by three row tiles: a panel split
    (1, 2500, 40, "", "relu"),             # one row (a classifier's), K in three shares
    (9, 2100, 48, "own", ""),              # one row tile, K in three shares, a residual
])
def test_native_gemm_forms_agree_with_torch(threads, rows, k, n, residual, act):
    """A 1x1 convolution's three C++ forms (oneDNN's, MKL's, paragraph's own packed GEMM with
    its epilogue in registers) each run in the first calls, which time them: every call equals
    torch's, for columns that fill no whole panel, rows that fill no whole tile, a residual in
    its own buffer or in the output's, and on one and two threads."""
    import tvm_ffi

    from paragraph.tvm_interop.runtime.library import native

    module = native.module()
    if module is None:
        pytest.skip(f"the C++ vendor kernels are unavailable: {native.reason()}")
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(1, rows, 1, k, generator=gen)
    w = torch.randn(n, 1, 1, k, generator=gen) / k ** 0.5
    b = torch.randn(n, generator=gen)
    res = torch.randn(1, rows, 1, n, generator=gen)
    out = res.clone() if residual == "in place" else torch.empty(1, rows, 1, n)
    want = torch.nn.functional.conv2d(x.permute(0, 3, 1, 2), w.permute(0, 3, 1, 2), b)
    want = want.permute(0, 2, 3, 1) + (res if residual else 0)
    want = {"relu": torch.relu, "gelu": torch.nn.functional.gelu}.get(act, lambda t: t)(want)
    res_arg = out if residual == "in place" else res if residual else None
    fn = module["paragraph_vendor_conv2d"](
        *(tvm_ffi.from_dlpack(t) for t in (out, x, w, b)),
        None if res_arg is None else tvm_ffi.from_dlpack(res_arg), [1, 1, 0, 0, 1, 1, 1], "NHWC",
        act, threads)
    for _ in range(16):  # every form timed five times, then the fastest
        if residual == "in place":
            out.copy_(res)
        else:
            out.fill_(float("nan"))
        fn()
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("rows", "act"), [(1, ""), (5, "relu"), (13, "gelu"), (26, "")])
def test_native_linear_forms_agree_with_torch(threads, rows, act):
    """A product by a constant (K, N) matrix: the same three forms where it has few rows (an
    RNN's step; the own GEMM packs the matrix from its other orientation), two where it has
    more, GELU applied after the GEMM; every call equals torch's."""
    import tvm_ffi

    from paragraph.tvm_interop.runtime.library import native

    module = native.module()
    if module is None:
        pytest.skip(f"the C++ vendor kernels are unavailable: {native.reason()}")
    gen = torch.Generator().manual_seed(1)
    a, w, b = (torch.randn(*s, generator=gen) for s in ((1, rows, 40), (40, 72), (72,)))
    out = torch.empty(1, rows, 72)
    want = {"relu": torch.relu, "gelu": torch.nn.functional.gelu}.get(act, lambda t: t)(
        a @ w + b)
    fn = module["paragraph_vendor_linear"](*(tvm_ffi.from_dlpack(t) for t in (out, a, w, b)),
                                           act, threads)
    for _ in range(16):
        out.fill_(float("nan"))
        fn()
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)


@needs_avx512
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("k", "n", "bias", "act"), [
    (2050, 1000, True, ""),    # a classifier's: K not of four rows, N not of whole vectors
    (2048, 40, False, "relu"),
    (30, 17, True, "relu"),    # too few rows to share between threads
])
def test_the_one_row_product_streams_the_weight(threads, k, n, bias, act):
    """The own one-row product (form 3: the weight streamed front to back, each thread summing
    its share of the rows, the shares added at the end) equals torch's on every call, with and
    without a bias; the own GEMM (form 2) as well."""
    import tvm_ffi

    from paragraph.tvm_interop.runtime.library import native

    module = native.module()
    if module is None:
        pytest.skip(f"the C++ vendor kernels are unavailable: {native.reason()}")
    gen = torch.Generator().manual_seed(k + n)
    a, w, b = (torch.randn(*s, generator=gen) for s in ((1, 1, k), (k, n), (n,)))
    want = a @ w + (b if bias else 0)
    want = torch.relu(want) if act == "relu" else want
    key = f"linear{threads}{act}(1,{k},)({k},{n},)" + ("b" if bias else "")
    for form in (2, 3):
        module["paragraph_vendor_choose_form"](key, form)
        out = torch.empty(1, 1, n)
        args = (out, a, w, b) if bias else (out, a, w)
        fn = module["paragraph_vendor_linear"](*(tvm_ffi.from_dlpack(t) for t in args),
                                               *(() if bias else (None,)), act, threads)
        for _ in range(25):  # past the trials: a form that did not exist would be replaced
            out.fill_(float("nan"))
            fn()
            torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
        assert f"{key}={form}" in [str(c) for c in module["paragraph_vendor_chosen_forms"]()]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("shapes", "axis", "act", "dtype"), [
    ([(1, 35, 35, 64), (1, 35, 35, 96), (1, 35, 35, 32)], 3, "", torch.float32),  # Inception's
    ([(1, 17, 17, 192), (1, 17, 17, 192)], 3, "relu", torch.float32),
    ([(1, 9, 9, 11), (1, 9, 9, 11), (1, 9, 9, 22)], 3, "relu", torch.float32),  # NASNet's
    ([(1, 6, 6, 17), (1, 6, 6, 40)], 3, "", torch.float32),  # whole vectors and tails
    # tails stored whole over the next part, rows split over the threads (> 64 KB)
    ([(1, 40, 40, 11), (1, 40, 40, 3), (1, 40, 40, 19)], 3, "relu", torch.float32),
    ([(2, 3, 5), (2, 1, 5), (2, 4, 5)], 1, "", torch.float32),  # along a middle axis
    ([(3, 4), (5, 4)], 0, "relu", torch.float32),               # one row: whole parts
    ([(1, 9, 9, 7), (1, 9, 9, 1)], 3, "", torch.int64),         # another element size
    ([(4, 0, 3), (4, 2, 3)], 1, "", torch.float32),             # an empty part
])
def test_native_concat_forms_agree_with_torch(threads, shapes, axis, act, dtype):
    """A concat's C++ forms (PyTorch's cat_out, paragraph's own row-by-row copy with the
    relu applied in the same pass, rows split over the threads, and on several threads the
    own copy on one) each run in the first calls, which time them: every call equals
    torch.cat, negative and NaN values included (relu keeps NaN, as torch's does), for
    channel joins, middle and first axes and integer tensors."""
    import tvm_ffi

    from paragraph.tvm_interop.runtime.library import native

    module = native.module()
    if module is None:
        pytest.skip(f"the C++ vendor kernels are unavailable: {native.reason()}")
    gen = torch.Generator().manual_seed(len(shapes))
    parts = [(torch.randn(*s, generator=gen) * 100).to(dtype) for s in shapes]
    if dtype == torch.float32:
        parts[0].view(-1)[:1] = float("nan")
    want = torch.cat(parts, dim=axis)
    want = torch.relu(want) if act == "relu" else want
    out = torch.empty_like(want)
    fn = module["paragraph_vendor_concat"](tvm_ffi.from_dlpack(out),
                                           [tvm_ffi.from_dlpack(p) for p in parts], axis, act,
                                           threads)
    for _ in range(20):  # each form timed five times, then the fastest
        out.fill_(7)
        fn()
        torch.testing.assert_close(out, want, equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [
    (4, 64, 64, 64),     # a small encoder's four heads
    (12, 128, 64, 128),  # BERT's scores: rows in 12-row blocks, columns in 32-column panels
    (3, 13, 7, 45),      # a 1-row and a 4-row block, a partial second panel
    (2, 5, 3, 10),       # one panel, less than one vector
])
def test_native_batched_product_forms_agree_with_torch(threads, shape):
    """A batched product's C++ forms (MKL's batched GEMM, paragraph's own tiles over 12-row
    blocks split over the threads) each run in the first calls, which time them: every call
    equals torch's product, NaN included."""
    import tvm_ffi

    from paragraph.tvm_interop.runtime.library import native

    module = native.module()
    if module is None:
        pytest.skip(f"the C++ vendor kernels are unavailable: {native.reason()}")
    batch, m, k, n = shape
    gen = torch.Generator().manual_seed(sum(shape))
    a = torch.randn(1, batch, m, k, generator=gen)
    b = torch.randn(1, batch, k, n, generator=gen)
    a[0, 0, 1, 0] = float("nan")  # row 1 of the first product is NaN throughout
    want = a @ b
    out = torch.empty_like(want)
    fn = module["paragraph_vendor_product"](tvm_ffi.from_dlpack(out), tvm_ffi.from_dlpack(a),
                                            tvm_ffi.from_dlpack(b), None, "", threads)
    for _ in range(12):  # both forms timed five times, then the faster
        out.fill_(7.0)
        fn()
        torch.testing.assert_close(out, want, equal_nan=True, rtol=1e-4, atol=1e-4)


def test_the_own_concat_holds_its_buffers_once_chosen():
    """The own concat holds its output and parts alive as long as the function: once it is
    chosen the other forms are dropped (PyTorch's had held them), and a caller that kept the
    function but not its output had the copies write freed memory (heap corruption in a script
    that did). The freed buffer's memory, allocated again and filled, must stay untouched."""
    import tvm_ffi

    from paragraph.tvm_interop.runtime.library import native

    module = native.module()
    if module is None:
        pytest.skip(f"the C++ vendor kernels are unavailable: {native.reason()}")
    parts = [torch.full((1, 40, 40, 11), -1.0), torch.full((1, 40, 40, 22), 2.0)]
    key = "concat1relu3(1,40,40,11,)(1,40,40,22,)(1,40,40,33,)"
    module["paragraph_vendor_choose_form"](key, 1)  # the own form, chosen before any call
    fn = module["paragraph_vendor_concat"](tvm_ffi.from_dlpack(torch.empty(1, 40, 40, 33)),
                                           [tvm_ffi.from_dlpack(p) for p in parts], 3, "relu",
                                           1)
    fn()  # chooses: the other form, and what it held, dropped
    reused = [torch.full((1, 40, 40, 33), 7.0) for _ in range(8)]
    fn()
    assert all(bool((t == 7.0).all()) for t in reused)


def _act(act):
    """Torch's activation ``act`` (one of `EPILOGUES`, or "" for none), out of place."""
    functional = torch.nn.functional
    return {"": lambda t: t, "relu": torch.relu, "relu6": functional.relu6,
            "hardswish": functional.hardswish, "hardsigmoid": functional.hardsigmoid,
            "sigmoid": torch.sigmoid, "silu": functional.silu, "gelu": functional.gelu,
            "gelu_tanh": lambda t: functional.gelu(t, approximate="tanh")}[act]


def _shapes(*shapes):
    """Shapes as the C++ kernels' choice keys spell them (`shape_key`)."""
    return "".join("(" + "".join(f"{d}," for d in shape) + ")" for shape in shapes)


def _forced(module, key, form, bind, *args):
    """The kernel ``bind(*args)`` makes, form ``form`` chosen for ``key`` before its first
    call, after that call: it timed none of its forms (so ``key`` is the one it built)."""
    module["paragraph_vendor_choose_form"](key, form)
    timing = module["paragraph_vendor_timing_kernels"]()
    fn = bind(*args)
    fn()
    assert module["paragraph_vendor_timing_kernels"]() == timing, f"{key} timed its forms"
    return fn


def _check_native_conv(module, x, w, b, stride, pad, dilation, groups, residual, act, threads,
                       gen, equal_nan=False, layout="NHWC", calls=16, family="", form=None):
    """``paragraph_vendor_conv2d`` bound to NHWC ``x`` (given as an NCHW tensor where
    ``layout`` is NCHW2NHWC), OHWI ``w``, bias ``b`` (or None), padding ``pad``
    ((top, left) or (top, left, bottom, right)) and a residual ("", "own" buffer or "in
    place" in the output's), called 16 times (up to three forms timed five times each, then
    the fastest): every call equals torch's convolution (+ residual, activation ``act``).
    With ``form``, that form of the kernel's ``family`` (conv2d: a 1x1's GEMM forms;
    conv_kxk; depthwise) is chosen before the first call; returns the choice's key."""
    import tvm_ffi

    top, left, bottom, right = pad if len(pad) == 4 else (*pad, *pad)
    xn = torch.nn.functional.pad(x.permute(0, 3, 1, 2), (left, right, top, bottom))
    want = torch.nn.functional.conv2d(xn, w.permute(0, 3, 1, 2), b, stride, 0, dilation, groups)
    want = want.permute(0, 2, 3, 1).contiguous()
    res = torch.randn(*want.shape, generator=gen)
    want = _act(act)(want + res if residual else want)
    out = res.clone() if residual == "in place" else torch.empty(want.shape)
    res_arg = out if residual == "in place" else res if residual else None
    params = [stride, stride, *pad, dilation, dilation, groups]
    given = x.permute(0, 3, 1, 2).contiguous() if layout == "NCHW2NHWC" else x

    def bind():
        return module["paragraph_vendor_conv2d"](
            *(tvm_ffi.from_dlpack(t) for t in (out, given, w)),
            None if b is None else tvm_ffi.from_dlpack(b),
            None if res_arg is None else tvm_ffi.from_dlpack(res_arg), params, layout, act,
            threads)

    def reset():
        if residual == "in place":
            out.copy_(res)
        else:
            out.fill_(7.0)

    key = (family + ("c" if layout == "NCHW2NHWC" else "") + f"{threads}{act}/"
           + "".join(f"{p}," for p in params) + _shapes(x.shape, w.shape, want.shape)
           + ("r" if residual else "") + ("i" if residual == "in place" else "")
           + ("b" if b is not None else ""))
    if form is None:
        fn = bind()
    else:
        reset()
        fn = _forced(module, key, form, bind)
        torch.testing.assert_close(out, want, equal_nan=equal_nan, rtol=1e-4, atol=1e-4,
                                   msg=lambda m: f"{key} form {form}: {m}")
    for _ in range(calls):
        reset()
        fn()
        torch.testing.assert_close(out, want, equal_nan=equal_nan, rtol=1e-4, atol=1e-4,
                                   msg=lambda m: f"{key}: {m}")
    return key


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("hw", "c", "k", "stride", "pad", "dilation", "residual", "act"), [
    (11, 44, 3, 1, (1, 1), 1, "", "relu"),          # NASNet's: channels 2.75 vectors
    (12, 20, 5, 2, (1, 2, 2, 1), 1, "", ""),        # TF-style uneven padding (no padded copy)
    (9, 16, 7, 1, (3, 3), 1, "own", "relu"),        # residual in its own buffer
    (10, 32, 3, 1, (2, 2), 2, "in place", ""),      # dilated, the residual written over
    (3, 8, 5, 1, (2, 2), 1, "", "relu"),            # narrower than four pixels: every tap checked
    (32, 64, 3, 1, (1, 1), 1, "", "relu"),          # 256 KB out: rows split over 2 threads
    # eight pixels at a time (`eight_pixels`): each kernel width and stride compiled, rows
    # with one block, two, and a rest of four and of single pixels
    (21, 24, 5, 1, (2, 2), 1, "own", ""),
    (29, 16, 3, 2, (1, 1), 1, "", "relu"),
    (27, 20, 7, 2, (3, 3), 1, "", ""),
    (26, 16, 9, 1, (4, 4), 1, "in place", "relu"),
])
def test_native_depthwise_forms_agree_with_torch(threads, hw, c, k, stride, pad, dilation,
                                                 residual, act):
    """A depthwise convolution's C++ forms (paragraph's own eight-pixel form alone where its
    width and stride have one; else oneDNN's and the own general loop, each run in the first
    calls, which time them): every call equals torch's,
    for channels that fill no whole vector, strides, dilation, TF-style uneven padding, a
    residual in its own buffer or in the output's, a NaN in the input, 1 and 2 threads."""

    from paragraph.tvm_interop.runtime.library import native

    module = native.module()
    if module is None:
        pytest.skip(f"the C++ vendor kernels are unavailable: {native.reason()}")
    gen = torch.Generator().manual_seed(hw * c)
    x = torch.randn(1, hw, hw, c, generator=gen)
    x[0, 1, 1, 0] = float("nan")
    w = torch.randn(c, k, k, 1, generator=gen) / k
    b = torch.randn(c, generator=gen)
    _check_native_conv(module, x, w, b, stride, pad, dilation, c, residual, act, threads, gen,
                       equal_nan=True)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("n", "hw", "cin", "cout", "k", "stride", "pad", "dilation", "residual",
                          "act"), [
    (1, 9, 24, 80, (3, 3), 1, (1, 1), 1, "", "relu"),     # 2.5 panels: one split on 2 threads
    (2, 8, 16, 20, (3, 3), 2, (1, 1), 1, "own", ""),      # 2 images, stride 2, a 4-wide tail
    (1, 7, 32, 64, (1, 7), 1, (0, 3), 1, "in place", "relu"),  # Inception's 1x7
    (1, 10, 8, 48, (5, 5), 1, (1, 2, 2, 1), 1, "", ""),   # TF-style uneven padding
    (1, 11, 16, 32, (3, 3), 1, (2, 2), 2, "", "relu"),    # dilated
    (1, 14, 64, 96, (1, 1), 2, (0, 0), 1, "", ""),        # a strided 1x1 (ResNet's shortcut)
    (1, 12, 3, 16, (7, 7), 2, (3, 3), 1, "", "relu"),     # a stem: 3 input channels
])
def test_native_conv_forms_agree_with_torch(threads, n, hw, cin, cout, k, stride, pad, dilation,
                                            residual, act):
    """A regular convolution's two C++ forms (oneDNN's, paragraph's own implicit GEMM over a
    zero-bordered copy of the input) each run in the first calls, which time them: every call
    equals torch's, for output channels that fill no whole panel, strides, dilation, uneven
    padding, two images (tiles across rows and images), a residual in its own buffer or in the
    output's, 1 and 2 threads."""

    from paragraph.tvm_interop.runtime.library import native

    module = native.module()
    if module is None:
        pytest.skip(f"the C++ vendor kernels are unavailable: {native.reason()}")
    gen = torch.Generator().manual_seed(hw * cin + cout)
    x = torch.randn(n, hw, hw, cin, generator=gen)
    w = torch.randn(cout, *k, cin, generator=gen) / (k[0] * k[1] * cin) ** 0.5
    b = torch.randn(cout, generator=gen)
    _check_native_conv(module, x, w, b, stride, pad, dilation, 1, residual, act, threads, gen)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("hw", "cin", "k", "stride", "pad", "cout"), [
    ((37, 35), 3, (3, 3), 2, (0, 0), 16),    # Inception's stem: unpadded; 16-pixel blocks + a tail
    ((12, 12), 3, (7, 7), 2, (3, 3), 16),    # ResNet's: padded
    ((9, 7), 1, (3, 3), 1, (1, 2, 0, 1), 16),  # one channel, uneven padding, narrower than 16
    ((6, 18), 4, (1, 1), 1, (0, 0), 16),     # a 1x1 (no GEMM form on a transposed input)
    ((21, 19), 3, (3, 3), 2, (1, 1), 40),    # the direct form: two vectors, then a tail of 8
    ((11, 13), 2, (5, 5), 1, (2, 2), 24),    # the direct form for any width and stride
])
def test_native_conv_reads_an_nchw_input(threads, hw, cin, k, stride, pad, cout):
    """``NCHW2NHWC``: a stem convolution given the model's NCHW input (its forms: oneDNN's,
    which reorders it; the own implicit GEMM, whose padded copy reorders it, the three-channel
    rows 16 pixels at a time by permutes; the own direct form, `stem.h`, which reads the NCHW
    rows in place) writes the NHWC output every call, as torch's convolution of the same
    input."""
    from paragraph.tvm_interop.runtime.library import native

    module = native.module()
    if module is None:
        pytest.skip(f"the C++ vendor kernels are unavailable: {native.reason()}")
    gen = torch.Generator().manual_seed(hw[0] * hw[1] + cin)
    x = torch.randn(2 if k == (1, 1) else 1, *hw, cin, generator=gen)
    w = torch.randn(cout, *k, cin, generator=gen) / (k[0] * k[1] * cin) ** 0.5
    b = torch.randn(cout, generator=gen)
    _check_native_conv(module, x, w, b, stride, pad, 1, 1, "", "relu", threads, gen,
                       layout="NCHW2NHWC")


@pytest.mark.parametrize(("what", "hw", "cin", "cout", "k", "groups", "residual"), [
    ("3x3: oneDNN's, the own implicit GEMM, the Winograd forms", 10, 16, 24, (3, 3), 1, ""),
    ("1x7: the one-dimensional Winograd forms", 9, 8, 16, (1, 7), 1, "own"),
    ("1x1: oneDNN's, MKL's and the own GEMMs", 6, 16, 32, (1, 1), 1, "in place"),
    ("depthwise 5x5", 11, 16, 16, (5, 5), 16, ""),
    ("grouped", 8, 32, 32, (3, 3), 4, "own"),
    ("a NaN in the weight", 7, 8, 8, (3, 3), 1, ""),
])
def test_every_conv_form_keeps_nan_and_infinity_where_torch_does(what, hw, cin, cout, k,
                                                                  groups, residual):
    """A NaN and infinities in the input (and an infinity in a residual, a NaN in a weight)
    come out of every form of a convolution with relu exactly where torch's convolution and
    relu put them: oneDNN's fused relu (MAXPS(v, 0) makes a NaN 0) is fused only where no NaN
    can arise, and a Winograd tile (one infinity in it makes NaN of outputs whose window does
    not hold it) gives way to the implicit GEMM where an input is not finite."""
    import tvm_ffi

    from paragraph.tvm_interop.runtime.library import native

    module = native.module()
    if module is None:
        pytest.skip(f"the C++ vendor kernels are unavailable: {native.reason()}")
    gen = torch.Generator().manual_seed(hw * cin + cout)
    x = torch.randn(1, hw, hw, cin, generator=gen)
    x[0, 2, 3, 1], x[0, 5, 5, 0], x[0, hw - 2, 1, cin - 1] = float("nan"), float("inf"), -float(
        "inf")
    w = torch.randn(cout, *k, cin // groups, generator=gen) / (k[0] * k[1] * cin) ** 0.5
    if what.startswith("a NaN"):
        w[3, 1, 1, 2] = float("nan")
    b = torch.randn(cout, generator=gen)
    pad = (k[0] // 2, k[1] // 2)
    xn = torch.nn.functional.pad(x.permute(0, 3, 1, 2), (pad[1], pad[1], pad[0], pad[0]))
    want = torch.nn.functional.conv2d(xn, w.permute(0, 3, 1, 2), b, 1, 0, 1, groups)
    want = want.permute(0, 2, 3, 1).contiguous()
    res = torch.randn(*want.shape, generator=gen)
    res[0, 1, 1, 2] = float("inf")
    want = torch.relu(want + res if residual else want)
    out = torch.empty(want.shape)
    res_arg = out if residual == "in place" else res if residual else None
    index, count = 0, 1
    while index < count:
        with native.forced_form(index):
            fn = module["paragraph_vendor_conv2d"](
                *(tvm_ffi.from_dlpack(t) for t in (out, x, w, b)),
                None if res_arg is None else tvm_ffi.from_dlpack(res_arg),
                [1, 1, *pad, 1, 1, groups], "NHWC", "relu", 2)
            for _ in range(2):
                out.copy_(res) if residual == "in place" else out.fill_(7.0)
                fn()
                torch.testing.assert_close(out, want, equal_nan=True, rtol=1e-4, atol=1e-4,
                                           msg=lambda m, i=index: f"form {i}: {m}")
        count = max(count, native.most_forms())
        index += 1


def _check_forced_form(module, x, w, b, pad, residual, act, threads, gen, form, packing,
                       calls=16):
    """Form ``form`` of a stride-1 ``paragraph_vendor_conv2d`` chosen before its first call
    (the key as the C++ kernel builds it from its parameters and shapes), then
    `_check_native_conv`: every call equals torch's, the form listed as chosen and the weight
    packed as ``packing``."""
    key = _check_native_conv(module, x, w, b, 1, pad, 1, 1, residual, act, threads, gen,
                             calls=calls, family="conv_kxk", form=form)
    assert f"{key}={form}" in map(str, module["paragraph_vendor_chosen_forms"]())
    assert any(str(p).startswith(f"{w.data_ptr()}{packing}")
               for p in module["paragraph_vendor_packed_keys"]())


@needs_avx512
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("n", "hw", "cin", "cout", "pad", "residual", "act"), [
    (1, 48, 16, 16, (1, 1), "", "relu"),             # 576 (144) tiles: blocks, two threads
    (2, 9, 20, 36, (1, 0, 2, 1), "own", ""),         # sizes no multiple of 2 or 4; uneven pads
    (1, 12, 40, 48, (0, 0), "in place", "relu"),     # unpadded (Inception's 149 -> 147)
    (1, 6, 3, 70, (1, 1), "", ""),                   # 3 inputs, outputs in a 6-column tail
    (1, 12, 160, 136, (1, 1), "", ""),               # 1.6 (3.7) MB transformed: streamed
    (1, 4, 160, 160, (1, 1), "own", "relu"),         # streamed, split by panels on 2 threads
])
@pytest.mark.parametrize(("k", "form", "packing"), [(3, 2, "winograd23"), (3, 3, "winograd43"),
                                                   (5, 2, "winograd25")])
def test_the_winograd_forms_agree_with_torch(k, form, packing, threads, n, hw, cin, cout, pad,
                                             residual, act):
    """A 3x3 stride-1 convolution's Winograd forms F(2x2, 3x3) and F(4x4, 3x3), and a 5x5's
    F(2x2, 5x5) (its padding twice the 3x3's), each chosen before the first call: every call
    equals torch's convolution within the transforms' rounding, for sizes no multiple of the
    tile's (the last tiles partly outside the output), uneven padding, two images, several
    blocks of tiles, a transformed weight too large for L2 (streamed; on two threads split by
    tiles or by panels), a residual in its own buffer or in the output's, 1 and 2 threads; the
    transformed weight is what the kernel packed, and the form is the one that ran."""
    from paragraph.tvm_interop.runtime.library import native

    module = native.module()
    if module is None:
        pytest.skip(f"the C++ vendor kernels are unavailable: {native.reason()}")
    gen = torch.Generator().manual_seed(hw * cin + cout + k)
    x = torch.randn(n, hw, hw, cin, generator=gen)
    w = torch.randn(cout, k, k, cin, generator=gen) / (k * k * cin) ** 0.5
    b = torch.randn(cout, generator=gen)
    pad = tuple(p * (k - 1) // 2 for p in pad)
    _check_forced_form(module, x, w, b, pad, residual, act, threads, gen, form, packing)


@needs_avx512
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("form", "packing"), [(4, "winograd23"), (5, "winograd43")])
def test_the_winograd_forms_in_small_blocks_agree_with_torch(form, packing, threads):
    """A streamed Winograd form also comes in blocks of tiles sized to stay in L2 beside the
    weight's panels (listed after the other forms): each agrees with torch's convolution, with
    the weight packed once for both block sizes."""
    from paragraph.tvm_interop.runtime.library import native

    module = native.module()
    if module is None:
        pytest.skip(f"the C++ vendor kernels are unavailable: {native.reason()}")
    gen = torch.Generator().manual_seed(form)
    x = torch.randn(1, 30, 30, 160, generator=gen)  # 225 F(2x2) tiles or 64 F(4x4): 1.6 and
    w = torch.randn(160, 3, 3, 160, generator=gen) / 38  # 3.7 MB weights: 2 or 5 and 6 blocks
    b = torch.randn(160, generator=gen)
    # past the trials of every form (had the form not existed, they would have chosen another)
    _check_forced_form(module, x, w, b, (1, 1), "", "relu", threads, gen, form, packing,
                       calls=40)
    # the most forms a kernel has (this one's six): `SETTLE_RUNS` warms a program up past them
    assert 30 <= module["paragraph_vendor_timing_calls"]() < SETTLE_RUNS


@needs_avx512
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("k", "form", "packing"), [
    ((1, 7), 2, "winograd27/1d"), ((7, 1), 2, "winograd27/1d"),   # Inception's 17x17 stage
    ((1, 7), 3, "winograd37/1d"), ((7, 1), 3, "winograd37/1d"),   # (17 = 6 tiles of 3, less 1)
    ((1, 3), 2, "winograd23/1d"), ((3, 1), 3, "winograd43/1d"),   # its 8x8 stage's
])
@pytest.mark.parametrize(("n", "hw", "cin", "cout", "residual", "act"), [
    (1, 17, 24, 40, "", "relu"),        # 17 wide: the last tile half outside
    (2, 10, 40, 160, "in place", ""),    # two images, 5 panels
])
def test_the_one_dimensional_winograd_forms_agree_with_torch(k, form, packing, threads, n, hw,
                                                             cin, cout, residual, act):
    """A 1 x r or r x 1 convolution's Winograd forms F(m, r) (tiles of m pixels along the
    kernel's long axis: F(2, 7) and F(3, 7), F(2, 3) and F(4, 3)), each chosen before the
    first call: every call equals torch's convolution within the transforms' rounding, with
    the padding along that axis (uneven for the 1x7: TF-style), two images, a residual in its
    own buffer or in the output's, 1 and 2 threads; the transformed weight is what the kernel
    packed."""
    from paragraph.tvm_interop.runtime.library import native

    module = native.module()
    if module is None:
        pytest.skip(f"the C++ vendor kernels are unavailable: {native.reason()}")
    gen = torch.Generator().manual_seed(hw * cin + cout + k[0])
    x = torch.randn(n, hw, hw, cin, generator=gen)
    w = torch.randn(cout, *k, cin, generator=gen) / (k[0] * k[1] * cin) ** 0.5
    b = torch.randn(cout, generator=gen)
    pad = (0, 2, 0, 4) if k == (1, 7) else ((k[0] - 1) // 2, (k[1] - 1) // 2)
    _check_forced_form(module, x, w, b, pad, residual, act, threads, gen, form, packing)


# a convolution's forms by family, as the C++ kernel lists them: the NHWC input's shape, the
# OHWI weight's, stride, padding, groups, the key's family and the forms' indices
CONV_FORMS = {
    # a 1x1's GEMM forms: oneDNN's, MKL's and the own packed GEMM (a panel and a 4-column one)
    "gemm": [((1, 5, 5, 40), (36, 1, 1, 40), 1, (0, 0), 1, "conv2d", (0, 1, 2))],
    # oneDNN's and the own implicit GEMM (stride 2: no Winograd form)
    "kxk": [((1, 7, 7, 8), (20, 3, 3, 8), 2, (1, 1), 1, "conv_kxk", (0, 1))],
    # F(2x2, 3x3) and F(4x4, 3x3); F(2, 7) along a 1x7's rows (the one-dimensional epilogue)
    "winograd": [((1, 6, 6, 8), (20, 3, 3, 8), 1, (1, 1), 1, "conv_kxk", (2, 3)),
                 ((1, 5, 9, 8), (20, 1, 7, 8), 1, (0, 3), 1, "conv_kxk", (2,))],
    # the own depthwise form (one vector of channels and a 4-channel tail), 3x3 and 5x5,
    # strides 1 and 2; and oneDNN's
    "depthwise": [((1, 9, 9, 20), (20, k, k, 1), stride, (k // 2, k // 2), 20, "depthwise",
                   (0, 1) if (k, stride) == (3, 1) else (1,))
                  for k in (3, 5) for stride in (1, 2)],
}


@needs_avx512
@pytest.mark.parametrize("family", list(CONV_FORMS))
@pytest.mark.parametrize("act", EPILOGUES)
def test_every_convolution_form_fuses_every_activation(act, family):
    """Every activation a convolution fuses (`EPILOGUES`) after each of its C++ forms, each
    chosen before the first call: the own forms' epilogues in registers (the packed GEMM's,
    the implicit GEMM's, Winograd's two- and one-dimensional output transforms, the depthwise
    form's), oneDNN's and MKL's followed by PyTorch's activation (oneDNN fuses relu alone);
    with a bias and the residual written over, a residual in its own buffer, and neither:
    every call equals torch's convolution and activation."""
    from paragraph.tvm_interop.runtime.library import native

    module = native.module()
    if module is None:
        pytest.skip(f"the C++ vendor kernels are unavailable: {native.reason()}")
    gen = torch.Generator().manual_seed(len(act) + len(family))
    for x_shape, w_shape, stride, pad, groups, key_family, forms in CONV_FORMS[family]:
        # outputs spread over about -6..6, every piece of relu6's and hardswish's
        x = torch.randn(*x_shape, generator=gen) * 2
        w = torch.randn(*w_shape, generator=gen) / math.prod(w_shape[1:]) ** 0.5
        b = torch.randn(w_shape[0], generator=gen)
        for form in forms:
            for bias, residual in ((b, "in place"), (None, "own"), (None, "")):
                _check_native_conv(module, x, w, bias, stride, pad, 1, groups, residual, act, 1,
                                   gen, calls=1, family=key_family, form=form)


@needs_avx512
@pytest.mark.parametrize("act", EPILOGUES)
def test_every_product_form_fuses_every_activation(act):
    """Every activation after each C++ form of a product, each chosen before the first call:
    a linear layer's (oneDNN's, MKL's, the own GEMM's and, for one row on two threads, the
    own one-row product, whose threads' sums are added before the activation), with and
    without a bias; a batched product's (MKL's, the own tiles'); a product of two activations
    (MKL's alone): every call equals torch's product and activation."""
    import tvm_ffi

    from paragraph.tvm_interop.runtime.library import native

    module = native.module()
    if module is None:
        pytest.skip(f"the C++ vendor kernels are unavailable: {native.reason()}")
    gen = torch.Generator().manual_seed(len(act))
    activation = _act(act)

    def check(out, want, key, form, kernel, *args):
        out.fill_(7.0)
        fn = _forced(module, key, form, module[kernel], *args)
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4,
                                   msg=lambda m: f"{key} form {form}: {m}")
        out.fill_(7.0)
        fn()
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)

    for rows, threads, forms in ((5, 1, (0, 1, 2)), (1, 2, (0, 2, 3))):
        a = torch.randn(1, rows, 160, generator=gen) * 2
        w = torch.randn(160, 40, generator=gen) / 160 ** 0.5
        b = torch.randn(40, generator=gen)
        for bias in (b, None):
            out = torch.empty(1, rows, 40)
            want = activation(a @ w + (0 if bias is None else bias))
            args = [tvm_ffi.from_dlpack(t) for t in (out, a, w)]
            bias_arg = None if bias is None else tvm_ffi.from_dlpack(bias)
            key = (f"linear{threads}{act}" + _shapes((rows, 160), (160, 40))
                   + ("" if bias is None else "b"))
            for form in forms:
                check(out, want, key, form, "paragraph_vendor_linear", *args, bias_arg, act,
                      threads)
    a, b = torch.randn(1, 3, 13, 7, generator=gen), torch.randn(1, 3, 7, 45, generator=gen)
    out = torch.empty(1, 3, 13, 45)
    args = [tvm_ffi.from_dlpack(t) for t in (out, a, b)]
    for form in (0, 1):
        check(out, activation(a @ b), f"bmm1{act}" + _shapes((3, 13, 7), (3, 7, 45)), form,
              "paragraph_vendor_product", *args, None, act, 1)
    a, b, bias = (torch.randn(*s, generator=gen) for s in ((2, 3, 16), (16, 24), (24,)))
    out = torch.empty(2, 3, 24)
    fn = module["paragraph_vendor_product"](
        *(tvm_ffi.from_dlpack(t) for t in (out, a, b, bias)), act, 1)
    fn()
    torch.testing.assert_close(out, activation(a @ b + bias), rtol=1e-4, atol=1e-4)


def _exact(act, x):
    """``act`` of float32 ``x`` in float64, rounded to float32: the GELUs without 1 + erf's and
    1 + tanh's cancellation for negative x (PyTorch's have it even in float64)."""
    x = x.double()
    if act == "gelu":
        y = x * torch.special.erfc(-x / math.sqrt(2)) / 2
    elif act == "gelu_tanh":
        y = x / (1 + torch.exp(-2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    else:
        y = _act(act)(x)
    return y.float()


@needs_avx512
@pytest.mark.parametrize("act", EPILOGUES)
def test_the_own_epilogues_are_exact_and_keep_nan(act):
    """Each own form's epilogue on values it adds exactly to a zero product (the residual's, a
    linear layer's bias; a batched product's by an identity): within 1e-6 of the function's
    exact value (the vector exponential's and GELU's erfc's rounding), and of PyTorch's
    float32 one on ordinary values (within 1e-6 absolute for the GELUs, whose PyTorch forms
    cancel), at ties
    (-3, 0, 3, 6), past the exponential's range (+-88.7, +-100, +-3e38), at infinities (inf
    where the function tends to it, NaN for silu's and the GELUs' -inf * 0, as PyTorch), and a
    NaN stays NaN."""
    check_own_epilogues(act)


def check_own_epilogues(act: str, avx2: bool = False) -> None:
    """`test_the_own_epilogues_are_exact_and_keep_nan`'s checks of activation ``act`` on the
    own AVX-512 forms, or with ``avx2`` on the own AVX2 forms (in a process without AVX-512,
    `test_the_own_avx2_epilogues_are_exact_and_keep_nan`)."""
    import tvm_ffi

    from paragraph.tvm_interop.runtime.library import native

    module = native.module()
    if module is None:
        pytest.skip(f"the C++ vendor kernels are unavailable: {native.reason()}")
    # (family, the own forms' indices): without AVX-512 the own AVX2 forms' (avx2.h); with it
    # the own AVX-512 forms' (a 1x1 convolution: MKL's and oneDNN's first; a 3x3: oneDNN's)
    gemm, kxk, k1x7, depthwise, linear = (
        (("conv2d", (2,)), ("conv_avx2_", (1, 2, 3)), ("conv_avx2_", (2, 3)),
         ("depthwise2", (1,)), (2,)) if avx2 else
        (("conv2d", (2,)), ("conv_kxk", (1, 2, 3)), ("conv_kxk", (2,)), ("depthwise", (1,)),
         (2, 3)))
    gen = torch.Generator().manual_seed(len(act))
    special = [float("nan"), float("inf"), -float("inf"), -0.0, 88.7, -88.7, -87.3, 100.0,
               -100.0, 1e30, -1e30, 1e-30, -1e-30, 3e38, -3e38, 1e-40]
    values = torch.cat([torch.linspace(-16, 16, 257), torch.randn(63, generator=gen) * 4,
                        torch.tensor(special)])

    def check(got, pre, what):
        torch.testing.assert_close(got, _exact(act, pre), rtol=1e-6, atol=1e-37, equal_nan=True,
                                   msg=lambda m: f"{what}: {m}")
        # PyTorch's float32 forms on an ordinary range (past it, its hardswish's x * 6 can
        # overflow, and its GELU of inf is NaN)
        finite = pre.abs() < 1e4
        torch.testing.assert_close(got[finite], _act(act)(pre[finite]), rtol=1e-6,
                                   atol=1e-6 if act.startswith("gelu") else 1e-37,
                                   msg=lambda m: f"{what} against PyTorch: {m}")

    # convolutions of a zero input: the residual (every value, in turn) is the epilogue's input
    for x_shape, w_shape, pad, groups, (family, forms) in [
            ((1, 6, 8, 40), (20, 1, 1, 40), (0, 0), 1, gemm),      # the own GEMM
            ((1, 6, 8, 8), (20, 3, 3, 8), (1, 1), 1, kxk),         # implicit, Winograd
            ((1, 6, 8, 8), (20, 1, 7, 8), (0, 3), 1, k1x7),        # Winograd F(2, 7) (F(3, 7))
            ((1, 6, 8, 20), (20, 3, 3, 1), (1, 1), 20, depthwise)]:
        x = torch.zeros(x_shape)
        w = torch.randn(*w_shape, generator=gen)
        res = values.repeat(4)[: 6 * 8 * 20].reshape(1, 6, 8, 20)
        out = torch.empty_like(res)
        params = [1, 1, *pad, 1, 1, groups]
        key = (f"{family}1{act}/" + "".join(f"{p}," for p in params)
               + _shapes(x.shape, w.shape, out.shape) + "r")
        for form in forms:
            out.fill_(7.0)
            _forced(module, key, form, module["paragraph_vendor_conv2d"],
                    *(tvm_ffi.from_dlpack(t) for t in (out, x, w)), None,
                    tvm_ffi.from_dlpack(res), params, "NHWC", act, 1)
            check(out, res, f"{key} form {form}")
    # a zero row by a linear layer's weight: its bias is the epilogue's input (the own GEMM's;
    # the one-row product's, its two threads' sums added first)
    n = values.numel()
    a, w, out = torch.zeros(1, 1, 160), torch.randn(160, n, generator=gen), torch.empty(1, 1, n)
    key = f"linear2{act}" + _shapes((1, 160), (160, n)) + "b"
    for form in linear:
        out.fill_(7.0)
        _forced(module, key, form, module["paragraph_vendor_linear"],
                *(tvm_ffi.from_dlpack(t) for t in (out, a, w, values)), act, 2)
        check(out[0, 0], values, f"{key} form {form}")
    # the own batched product by identities: finite values (an infinity times 0 is NaN)
    finite = values[values.isfinite()][:320].reshape(1, 2, 16, 10)
    eye = torch.eye(16).expand(1, 2, 16, 16).contiguous()
    out = torch.empty(1, 2, 16, 10)
    key = f"bmm1{act}" + _shapes((2, 16, 16), (2, 16, 10))
    out.fill_(7.0)
    _forced(module, key, 1, module["paragraph_vendor_product"],
            *(tvm_ffi.from_dlpack(t) for t in (out, eye, finite)), None, act, 1)
    check(out, finite, f"{key} form 1")




_AVX2_EPILOGUES_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, "tests")
    from test_vendor import EPILOGUES, check_own_epilogues
    for act in EPILOGUES:
        check_own_epilogues(act, avx2=True)
    print("checked", len(EPILOGUES))
""")


def test_the_own_avx2_epilogues_are_exact_and_keep_nan(tmp_path):
    """`test_the_own_epilogues_are_exact_and_keep_nan` on the own AVX2 forms (the GEMM, the
    implicit GEMM, the Winograd forms, the depthwise form, a linear layer's GEMM, the batched
    product), in a process without AVX-512 (``PARAGRAPH_CPU_ISA=avx2``): every activation,
    GELU's erf form included, in their epilogues or over the tile or row they just stored
    (`act_rows8`) within 1e-6 of its exact value, at ties, past the exponential's range, at
    infinities, and a NaN kept."""
    if not {"avx2", "fma"} <= _cpu_flags():
        pytest.skip("the CPU has no AVX2 and FMA")
    run = _run_held_to_avx2(_AVX2_EPILOGUES_SCRIPT, tmp_path)
    assert run.stdout.split()[-2:] == ["checked", str(len(EPILOGUES))]


def test_an_unknown_activation_is_refused():
    """An activation the kernels do not know is an error where a kernel is bound (or its name
    read), not a kernel without it: the C++ convolution, linear layer and product say which
    they know; a concat fuses relu alone."""
    import tvm_ffi

    from paragraph.tvm_interop.runtime.library import native

    module = native.module()
    if module is not None:
        x, w, out = torch.randn(1, 3, 3, 8), torch.randn(4, 1, 1, 8), torch.empty(1, 3, 3, 4)
        args = [tvm_ffi.from_dlpack(t) for t in (out, x, w)]
        with pytest.raises(ValueError, match="no activation 'swish'.*relu, relu6, hardswish"):
            module["paragraph_vendor_conv2d"](*args, None, None, [1, 1, 0, 0, 1, 1, 1], "NHWC",
                                              "swish", 1)
        a, m, out2 = torch.randn(2, 8), torch.randn(8, 4), torch.empty(2, 4)
        args = [tvm_ffi.from_dlpack(t) for t in (out2, a, m)]
        for kernel in ("paragraph_vendor_linear", "paragraph_vendor_product"):
            with pytest.raises(ValueError, match="no activation 'swish'"):
                module[kernel](*args, None, "swish", 1)
        with pytest.raises(ValueError, match="relu alone"):
            module["paragraph_vendor_concat"](tvm_ffi.from_dlpack(torch.empty(4, 4)),
                                              [tvm_ffi.from_dlpack(a)] * 2, 0, "silu", 1)
    for name in ("paragraph.vendor.matmul.swish", "paragraph.vendor.concat.a1.silu"):
        with pytest.raises(ParagraphError):
            ensure_registered(name)


@pytest.mark.parametrize("act", EPILOGUES)
def test_the_python_kernels_apply_every_activation(act):
    """The Python vendor kernels (where the C++ ones are unavailable) apply every activation:
    a 1x1 convolution with bias and residual (oneDNN's form, which fuses relu alone, and
    MKL's, both timed), a 3x3 one, a linear layer (both forms) and a batched product."""
    from paragraph.tvm_interop.runtime.library.torch_kernels import TRIALS

    gen = torch.Generator().manual_seed(len(act))
    activation = _act(act)

    def tensor(*shape):
        return tvm.runtime.tensor((torch.randn(*shape, generator=gen) * 2).numpy())

    def nchw(t):
        return torch.from_numpy(t.numpy()).permute(0, 3, 1, 2)

    x, w1, w3, b, res = (tensor(1, 5, 5, 8), tensor(12, 1, 1, 8), tensor(12, 3, 3, 8),
                         tensor(12), tensor(1, 5, 5, 12))
    out = tvm.runtime.empty((1, 5, 5, 12), "float32")
    conv1 = torch.nn.functional.conv2d(nchw(x), nchw(w1), torch.from_numpy(b.numpy()))
    conv3 = torch.nn.functional.conv2d(nchw(x), nchw(w3), padding=1)
    a, m, mb = tensor(3, 16), tensor(16, 8), tensor(8)
    out2 = tvm.runtime.empty((3, 8), "float32")
    p, q = tensor(2, 4, 6), tensor(2, 6, 5)
    out3 = tvm.runtime.empty((2, 4, 5), "float32")
    # a weight's name carries its digest (the packed weights follow it): these weights are
    # not the other tests', so neither are their digests
    cases = [
        (VendorOp("conv2d", "NHWC", bias=True, residual=True, act=act, weight="c0ffe1"),
         (x, w1, b, res, out), 2 * (TRIALS + 1), (conv1 + nchw(res)).permute(0, 2, 3, 1)),
        (VendorOp("conv2d", "NHWC", padding=(1, 1), act=act, weight="c0ffe3"), (x, w3, out), 1,
         conv3.permute(0, 2, 3, 1)),
        (VendorOp("matmul", bias=True, act=act, weight="decade"), (a, m, mb, out2),
         2 * (TRIALS + 1), torch.from_numpy(a.numpy() @ m.numpy() + mb.numpy())),
        (VendorOp("bmm", act=act), (p, q, out3), 1,
         torch.from_numpy(p.numpy() @ q.numpy()))]
    for op, args, calls, pre in cases:
        ensure_registered(op.name)
        call = bind(op.name, args)
        for _ in range(calls):
            args[-1].copyfrom(np.full(args[-1].shape, 7.0, dtype="float32"))
            call()
            torch.testing.assert_close(torch.from_numpy(args[-1].numpy()), activation(pre),
                                       rtol=1e-4, atol=1e-4, msg=lambda m, op=op: f"{op.name}: {m}")


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("shape", "kind", "window", "stride", "pad", "include_pad"), [
    ((1, 35, 35, 40), "avg", 3, 1, (1, 1, 1, 1), True),    # Inception's, a 24-channel tail
    ((1, 35, 35, 40), "avg", 3, 1, (1, 1, 1, 1), False),   # NASNet's: padding not counted
    ((2, 6, 9, 33), "avg", 3, 1, (0, 0, 0, 0), False),     # unpadded; row blocks end at images
    ((1, 7, 5, 16), "avg", 3, 1, (1, 1, 1, 1), True),      # 7 rows: a block of 3 after 4
    ((2, 17, 17, 7), "max", 3, 2, (0, 0, 0, 0), False),    # fewer channels than a vector
    ((1, 12, 11, 16), "max", 3, 2, (1, 1, 1, 1), False),
    ((1, 9, 10, 20), "max", 2, 1, (0, 0, 1, 1), False),    # uneven padding (C++ only)
    ((1, 71, 71, 80), "max", 3, 2, (0, 0, 0, 0), False),   # 64 channels and a tail, rows split
    ((2, 23, 20, 64), "max", 3, 2, (1, 1, 1, 1), False),   # mid-image over two threads
    ((1, 73, 73, 64), "max", 3, 2, (0, 0, 0, 0), False),   # Inception's stem, columns carried
    ((1, 30, 29, 40), "max", 3, 2, (1, 1, 1, 1), False),   # ResNet's stem's, a 8-channel tail
])
def test_native_pools_agree_with_torch(threads, shape, kind, window, stride, pad, include_pad):
    """The C++ pools on NHWC buffers equal PyTorch's: padding left out of a max and counted in
    an average's divisor only where asked, channels that fill no whole vector, a NaN in a
    max's window giving NaN, rows split over one thread or two (within an image too); a 3 x 3
    stride-1 average by both of its forms (each window reduced, sliding sums), a max by each of
    its (each window reduced, the input read in its order, 3-wide windows two columns apart
    with a column carried)."""
    import tvm_ffi

    from paragraph.tvm_interop.runtime.library import native

    module = native.module()
    if module is None:
        pytest.skip(f"the C++ vendor kernels are unavailable: {native.reason()}")
    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(*shape, generator=gen) * 10
    x[0, 3, 4, :3] = float("nan")
    # a window's first pixel and its last (each NaN sign): the max keeps a NaN met first
    x[0, 0, 0, 3], x[-1, -1, -1, -1] = float("nan"), -float("nan")
    xn = x.permute(0, 3, 1, 2)
    top, left, bottom, right = pad
    if kind == "max":
        padded = torch.nn.functional.pad(xn, (left, right, top, bottom), value=float("-inf"))
        want = torch.nn.functional.max_pool2d(padded, window, stride)
    else:
        want = torch.nn.functional.avg_pool2d(xn, window, stride, top,
                                              count_include_pad=include_pad)
    want = want.permute(0, 2, 3, 1).contiguous()
    out = torch.full(want.shape, 7.0)
    fn = module["paragraph_vendor_pool2d"](tvm_ffi.from_dlpack(out), tvm_ffi.from_dlpack(x),
                                           [window, window, stride, stride, *pad],
                                           kind == "max", include_pad, None, None, False,
                                           threads)
    for _ in range(20):  # a pool's forms (up to three) each run five times, then the chosen
        out.fill_(7.0)
        fn()
        torch.testing.assert_close(out, want, equal_nan=True, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("shape", "stride", "affine", "relu"), [
    ((1, 35, 35, 40), 1, True, True),    # both forms, rows split over blocks of four
    ((2, 7, 5, 21), 1, True, False),     # a block of three after four, two images
    ((1, 9, 9, 16), 2, False, True),     # the window form alone, relu alone
])
def test_native_average_pools_apply_their_epilogue(threads, shape, stride, affine, relu):
    """An average pool's epilogue (what it absorbs after rule pool-after-conv1x1: a batch
    norm's per-channel scale and shift, a relu) equals the same operators after PyTorch's pool,
    in every form and over one thread or two, a NaN kept through the relu."""
    import tvm_ffi

    from paragraph.tvm_interop.runtime.library import native

    module = native.module()
    if module is None:
        pytest.skip(f"the C++ vendor kernels are unavailable: {native.reason()}")
    gen = torch.Generator().manual_seed(sum(shape) + stride)
    x = torch.randn(*shape, generator=gen)
    x[0, 2, 2, 0] = float("nan")
    c = shape[-1]
    scale, shift = torch.randn(c, generator=gen), torch.randn(c, generator=gen)
    want = torch.nn.functional.avg_pool2d(x.permute(0, 3, 1, 2), 3, stride, 1)
    want = want.permute(0, 2, 3, 1)
    if affine:
        want = want * scale + shift
    if relu:
        want = torch.where(want.isnan(), want, want.clamp(min=0))
    out = torch.full(want.shape, 7.0)
    ffi = tvm_ffi.from_dlpack
    fn = module["paragraph_vendor_pool2d"](ffi(out), ffi(x), [3, 3, stride, stride, 1, 1, 1, 1],
                                           False, True, ffi(scale) if affine else None,
                                           ffi(shift) if affine else None, relu, threads)
    for _ in range(12):  # the forms each timed, then the chosen one
        out.fill_(7.0)
        fn()
        torch.testing.assert_close(out, want.contiguous(), equal_nan=True, rtol=1e-5,
                                   atol=1e-5)


def test_the_python_pools_take_uneven_padding_except_where_they_count_it():
    """PyTorch's pools pad evenly: the Python kernels pad a copy first where the padding is
    uneven (-inf for a max, zeros for an average divided by its real pixels), and refuse an
    average that counts uneven padding in its divisor (which the dispatch never makes) with the
    reason, rather than run it with the wrong divisor."""
    x = np.random.default_rng(4).standard_normal((1, 5, 6, 4)).astype("float32")
    x[0, 4, 5, 1] = np.nan
    xn = torch.from_numpy(x).permute(0, 3, 1, 2)
    sides = (1, 2, 0, 1)  # left, right, top, bottom
    for name, want in [
        ("paragraph.vendor.max_pool2d.NHWC.k3x3.s2x2.p0x1x1x2", torch.nn.functional.max_pool2d(
            torch.nn.functional.pad(xn, sides, value=float("-inf")), 3, 2)),
        ("paragraph.vendor.avg_pool2d.NHWC.k3x3.s2x2.p0x1x1x2", torch.nn.functional.avg_pool2d(
            torch.nn.functional.pad(xn, sides), 3, 2) / torch.nn.functional.avg_pool2d(
            torch.nn.functional.pad(torch.ones(1, 1, 5, 6), sides), 3, 2))]:
        ensure_registered(name)
        out = tvm.runtime.empty((1, 2, 4, 4), "float32")
        bind(name, (tvm.runtime.tensor(x), out))()
        torch.testing.assert_close(torch.from_numpy(out.numpy()), want.permute(0, 2, 3, 1),
                                   equal_nan=True, msg=lambda m, n=name: f"{n}: {m}")
    name = "paragraph.vendor.avg_pool2d.NHWC.k3x3.s1x1.p0x0x1x1.incpad"
    ensure_registered(name)
    args = (tvm.runtime.tensor(np.zeros((1, 5, 5, 4), "float32")),
            tvm.runtime.tensor(np.zeros((1, 4, 4, 4), "float32")))
    with pytest.raises(ParagraphError, match="symmetric padding"):
        bind(name, args)


@pytest.mark.parametrize("native", ["1", "0"])
@pytest.mark.parametrize(("kind", "pad", "ceil", "include_pad", "vendor"), [
    ("max", (1, 1, 1, 1), True, False, True),     # GoogLeNet's and SqueezeNet's: ceil_mode
    ("max", (0, 0, 1, 1), False, False, True),    # uneven padding
    ("avg", (1, 1, 1, 1), True, False, True),     # real pixels counted: more padding is free
    ("avg", (1, 1, 1, 1), True, True, False),     # the divisor would count the added padding
])
def test_ceil_mode_and_uneven_pools_run_as_vendor_pools_where_they_can(
        monkeypatch, native, kind, pad, ceil, include_pad, vendor):
    """A ceil_mode pool's last windows reach past the bottom and right padding, and the vendor
    pools clip every window to the input: so for a max pool, and an average that counts real
    pixels only, ceil_mode and uneven padding are more padding at the bottom and right, and the
    pool is a vendor pool (C++ and Python) that equals TVM's, a NaN in a window kept (TOPI's
    max pool drops it: compared where there is none). An average counting its padding stays
    TVM's."""
    monkeypatch.setenv("PARAGRAPH_NATIVE_VENDOR", native)
    pool = relax.op.nn.max_pool2d if kind == "max" else partial(relax.op.nn.avg_pool2d,
                                                       count_include_pad=include_pad)
    mod = module((1, 10, 9, 24), lambda bb, x: bb.emit(pool(
        x, 3, 2, pad, ceil_mode=ceil, layout="NHWC")))
    names = [VendorOp.from_name(n).kind for n in vendor_names(
        dispatch_to_vendor(mod, local_cpu_target()))]
    assert names == ([f"{kind}_pool2d"] if vendor else []), names
    (x,) = random_inputs(mod, seed=6)
    program = build_program(mod, "llvm", kernels="vendor")
    np.testing.assert_allclose(vm_outputs(program, [x])[0],
                               vm_outputs(build_program(mod, "llvm"), [x])[0], rtol=1e-5,
                               atol=1e-6)
    if vendor and kind == "max" and ceil:
        x[0, 9, 8, 3] = np.nan  # in the last row and column: ceil_mode's last windows
        want = torch.nn.functional.max_pool2d(torch.from_numpy(x).permute(0, 3, 1, 2), 3, 2, 1,
                                              ceil_mode=True).permute(0, 2, 3, 1)
        got = vm_outputs(program, [x])[0]
        assert np.isnan(got[0, -1, -1, 3])
        torch.testing.assert_close(torch.from_numpy(got), want, equal_nan=True)


def test_the_cpp_kernels_build_where_a_compiler_and_pytorch_are_present():
    """Every test of the C++ kernels skips where they are unavailable (no compiler, no PyTorch,
    PARAGRAPH_NATIVE_VENDOR=0); where a compiler and PyTorch are present they must build, so
    that a compile error fails the suite instead of skipping those tests with a warning."""
    from paragraph.tvm_interop.runtime import native as native_runner
    from paragraph.tvm_interop.runtime.library import native

    if native_runner._compiler() is None:
        pytest.skip("no C++ compiler on this machine")
    if native._switched_off():
        pytest.skip("the C++ kernels are switched off (PARAGRAPH_NATIVE_VENDOR=0)")
    assert native.module() is not None, native.reason()


def test_a_compiler_without_openmp_builds_kernels_that_run_on_one_thread(monkeypatch, tmp_path):
    """A compiler that refuses ``-fopenmp`` (clang without libomp) still builds the C++ vendor
    kernels, with a warning: the own GEMM then runs its two-thread calls on one thread and
    equals torch's."""
    import tvm_ffi

    from paragraph.tvm_interop.runtime import native as native_runner
    from paragraph.tvm_interop.runtime.library import native

    cxx = native_runner._compiler()
    if cxx is None:
        pytest.skip("no C++ compiler")
    wrapper = tmp_path / "cxx"
    # (-O0 last, so it wins: the build in half its minute; what is tested is the threads)
    wrapper.write_text("#!/bin/sh\nfor a in \"$@\"; do\n  if [ \"$a\" = -fopenmp ]; then\n"
                       "    echo \"error: unsupported option '-fopenmp'\" >&2; exit 1\n  fi\n"
                       f"done\nexec {cxx} \"$@\" -O0\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("CXX", str(wrapper))
    monkeypatch.setenv("PARAGRAPH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "_state", {})
    with pytest.warns(RuntimeWarning, match="without OpenMP"):
        module = native.module()
    assert module is not None, native.reason()
    gen = torch.Generator().manual_seed(2)
    x, w, b = (torch.randn(*s, generator=gen) for s in ((1, 30, 1, 40), (50, 1, 1, 40), (50,)))
    out = torch.empty(1, 30, 1, 50)
    want = torch.relu(torch.nn.functional.conv2d(x.permute(0, 3, 1, 2), w.permute(0, 3, 1, 2),
                                                 b).permute(0, 2, 3, 1))
    fn = module["paragraph_vendor_conv2d"](*(tvm_ffi.from_dlpack(t) for t in (out, x, w, b)),
                                           None, [1, 1, 0, 0, 1, 1, 1], "NHWC", "relu", 2)
    for _ in range(16):
        out.fill_(float("nan"))
        fn()
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)


def test_a_variant_build_of_the_kernels_runs_beside_the_main_one_with_its_own_choices():
    """`native.variant` loads a second build of the C++ kernels (here of the same source) as a
    library of its own, and `native.using` makes `bind` bind from it: its kernels compute the
    same results and choose their forms in their own table, which the main build never sees
    (what lets `benchmarks/ab.py` compare two builds in one process)."""
    import tvm_ffi

    from paragraph.tvm_interop.runtime.library import native

    module = native.module()
    if module is None:
        pytest.skip(f"the C++ vendor kernels are unavailable: {native.reason()}")
    other = native.variant(native.sources())
    gen = torch.Generator().manual_seed(5)
    a, w = torch.randn(24, 176, generator=gen), torch.randn(176, 144, generator=gen)
    out = torch.empty(24, 144)
    args = tuple(tvm_ffi.from_dlpack(t) for t in (a, w, out))
    name = VendorOp("matmul", weight="5eed").name
    with native.using(other):
        fn = native.bind(name, args, 1)
    for _ in range(16):  # three forms timed, then the fastest
        fn()
        torch.testing.assert_close(out, a @ w, rtol=1e-4, atol=1e-4)

    def keys(kernels) -> list[str]:
        return [c for c in map(str, kernels["paragraph_vendor_chosen_forms"]())
                if c.startswith("linear1(24,176,)(176,144,)")]

    assert len(keys(other)) == 1 and keys(module) == []
    assert native.bind(name, args, 1) is not None  # outside the block: the main build again
    assert keys(module) == []  # bound, not yet called


def test_a_chosen_form_can_be_set_before_the_kernels_time_their_forms():
    """`paragraph_vendor_choose_form` fixes a kernel's form before its first calls (so two
    builds can run the same forms); the kernel then times nothing and computes the same
    result, and an index the kernel has no form for is ignored (it times its forms as ever)."""
    import tvm_ffi

    from paragraph.tvm_interop.runtime.library import native

    module = native.module()
    if module is None:
        pytest.skip(f"the C++ vendor kernels are unavailable: {native.reason()}")
    gen = torch.Generator().manual_seed(6)
    for rows, index, forms in ((40, 1, "=1"), (56, 7, None)):
        a, w = torch.randn(rows, 208, generator=gen), torch.randn(208, 112, generator=gen)
        out = torch.empty(rows, 112)
        key = f"linear1({rows},208,)(208,112,)"
        module["paragraph_vendor_choose_form"](key, index)
        fn = module["paragraph_vendor_linear"](tvm_ffi.from_dlpack(out), tvm_ffi.from_dlpack(a),
                                               tvm_ffi.from_dlpack(w), None, "", 1)
        fn()
        torch.testing.assert_close(out, a @ w, rtol=1e-4, atol=1e-4)
        listed = [c for c in map(str, module["paragraph_vendor_chosen_forms"]())
                  if c.startswith(key)]
        if forms is not None:  # chosen: only the MKL form is left, no packed weights
            assert listed == [key + forms]
            assert not [k for k in map(str, module["paragraph_vendor_packed_keys"]())
                        if k.startswith(str(w.data_ptr()))]
        else:  # out of range: timed as ever, the table's index replaced by a real one
            for _ in range(16):
                fn()
                torch.testing.assert_close(out, a @ w, rtol=1e-4, atol=1e-4)
            listed = [c for c in map(str, module["paragraph_vendor_chosen_forms"]())
                      if c.startswith(key)]
            assert len(listed) == 1 and listed[0] != key + "=7"
        del fn


def test_one_stream_keeps_its_capped_kernels_only_where_whole_runs_are_faster(tmp_path,
                                                                               monkeypatch):
    """Kernels each faster alone on one thread can make the stream slower (between two
    2-thread kernels a 1-thread one lets the OpenMP worker fall asleep), so the planner's one
    stream keeps its caps only where whole runs with them are clearly faster (by more than
    `MARGIN`), each timed under a cache key of its own (`plan_digest` carries the caps);
    told whether to cap (as `plan_like` passes the reference's choice), it does as told."""
    import sqlite3
    from dataclasses import replace

    from paragraph.planner import Plan, PlanReport, Session
    from paragraph.planner import critical_path as planner
    from paragraph.tvm_interop.meter.runs import plan_digest

    mod = models.get("squeezenet1_1", reduced=True)
    program = build_program(mod, "llvm", kernels="vendor")
    g = program.graph
    k = next(n.id for n in program.kernels if n.attrs.get("source") == "vendor")
    monkeypatch.setattr(planner, "fewer_threads_where_faster",  # one cap, whatever it measures
                        lambda program, one, *a, **kw: replace(one, kernel_threads={k: 1}))
    plan = Plan(program, make_schedule("sequential", g, cores=2), PlanReport())
    db = CostDB(tmp_path / "costs.sqlite")
    session = Session(db=db, cores=2)
    first = planner._one_stream(plan, session, 2)
    capped = plan_digest(replace(first, kernel_threads={k: 1}))
    plain = plan_digest(replace(first, kernel_threads={}))
    assert capped != plain
    # capped runs take: far less, more, and 0.5% less (a tie inside `MARGIN`: noise
    # does not buy the capped schedule)
    for capped_s, caps_win in ((1e-9, True), (2.0, False), (0.995, False)):
        with sqlite3.connect(db.path) as conn:
            conn.execute(f"UPDATE {TABLE} SET median = CASE WHEN kernel LIKE ? THEN ? ELSE ? END "
                         "WHERE kernel LIKE 'run:%'", (f"%{capped}", capped_s, 1.0))
        again = planner._one_stream(plan, session, 2)
        assert again.kernel_threads == ({k: 1} if caps_win else {})
    assert planner._one_stream(plan, session, 2, caps=True).kernel_threads == {k: 1}
    assert planner._one_stream(plan, session, 2, caps=False).kernel_threads == {}


_ISA_SCRIPT = textwrap.dedent("""
    import sys, numpy as np
    sys.path.insert(0, "tests")
    import paragraph, os
    from test_vendor import EPILOGUE_CASES, vm_outputs
    from paragraph.tvm_interop import random_inputs
    from paragraph.tvm_interop.build.program import build_program
    from paragraph.tvm_interop.runtime.target import local_cpu_target, runs_here
    from paragraph.passes.schedule import make_schedule
    from paragraph.tvm_interop.runtime.executor import make_executor
    mod, _ = EPILOGUE_CASES["conv_relu6"]
    inputs = random_inputs(mod, seed=1)
    program = build_program(mod, local_cpu_target(), kernels="vendor")
    executor = make_executor(program, make_schedule("sequential", program.graph, cores=1))
    for _ in range(30):  # past the forms' timing: the faster form is chosen
        got = executor.run(*inputs)[0]
    executor.close()
    want = vm_outputs(build_program(mod, "llvm"), inputs)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    from paragraph.tvm_interop.runtime.library import native
    keys = [str(k) for k in native.module()["paragraph_vendor_chosen_forms"]()]
    print(runs_here(local_cpu_target()), local_cpu_target().mcpu,
          os.environ.get("ONEDNN_MAX_CPU_ISA"), any(k.startswith("conv_kxk") for k in keys),
          any(k.startswith("conv_avx2_") for k in keys))
""")


def test_the_avx2_switch_runs_without_the_own_avx512_kernels(tmp_path):
    """``PARAGRAPH_CPU_ISA=avx2``: the 3x3 convolution's forms are oneDNN's (held to AVX2) and
    the own AVX2 implicit GEMM, timed against each other, never the own AVX-512 one (where
    natively it is timed, as the forced-form tests show), and TVM compiles for a Haswell;
    the outputs stay equal to TVM's. A cache of its own (TVM's kernels for a Haswell, the
    costs), with this process's C++ kernels in it: the switch is read when they run, not
    when they are built."""
    run = _run_held_to_avx2(_ISA_SCRIPT, tmp_path)
    # measured and given vendor kernels by default, as on an AVX2 machine (not taken for
    # another machine's target: TVM kernels and an unmeasured schedule)
    assert run.stdout.split()[-5:] == ["True", "haswell", "AVX2", "False", "True"]


_AVX2_FORMS_SCRIPT = textwrap.dedent("""
    import numpy as np, torch, tvm
    import paragraph
    from paragraph.tvm_interop.runtime.library import native
    m = native.module()
    rng = np.random.default_rng(0)
    T = tvm.runtime.tensor
    acts = {"": lambda y: y, "relu": torch.relu, "relu6": lambda y: torch.clamp(y, 0, 6),
            "hardswish": torch.nn.functional.hardswish, "silu": torch.nn.functional.silu,
            "gelu": torch.nn.functional.gelu}
    worst = 0.0
    bound = []  # the kernels held: a packed weight lives as long as a kernel holds it
    def run(f):
        bound.append(f)
        f()
    def check(got, want):
        global worst
        worst = max(worst, float(np.abs(got - want).max() / max(1.0, np.abs(want).max())))
    m["paragraph_vendor_force_form"](99)  # every kernel's last form: the own AVX2 one
    # depthwise: borders, channel tails, strides, dilation, uneven padding, residual, epilogues
    for h, c, k, s, d, act, res, pads in [
            (19, 32, 3, 1, 1, "relu6", False, None), (20, 13, 5, 2, 1, "hardswish", True, None),
            (9, 21, 7, 1, 1, "silu", False, None), (15, 40, 3, 2, 2, "relu", True, None),
            (17, 33, 5, 2, 1, "", False, (1, 2, 2, 1)), (3, 7, 5, 1, 1, "", False, None),
            # border pixels eight channel vectors at a time, then one, then a masked tail
            (10, 70, 3, 1, 1, "relu6", True, (0, 1, 2, 2)), (9, 136, 5, 2, 1, "", False, None),
            (14, 200, 3, 1, 1, "relu", False, None)]:
        pt, pl, pb, pr = pads or ((k - 1) * d // 2,) * 4
        x = rng.standard_normal((1, h, h, c)).astype("f4")
        w = rng.standard_normal((c, k, k, 1)).astype("f4")
        b = rng.standard_normal(c).astype("f4")
        xp = torch.nn.functional.pad(torch.tensor(x).permute(0, 3, 1, 2), (pl, pr, pt, pb))
        y = torch.nn.functional.conv2d(xp, torch.tensor(w).permute(0, 3, 1, 2), torch.tensor(b),
                                       stride=s, dilation=d, groups=c).permute(0, 2, 3, 1)
        r = rng.standard_normal(tuple(y.shape)).astype("f4") if res else None
        y = acts[act](y + (torch.tensor(r) if res else 0)).numpy()
        out = T(np.zeros(y.shape, "f4"))
        params = ([s, s, pt, pl, d, d, c] if (pt, pl) == (pb, pr)
                  else [s, s, pt, pl, pb, pr, d, d, c])
        run(m["paragraph_vendor_conv2d"](out, T(x), T(w), T(b), T(r) if res else None,
                                         params, "NHWC", act, 2))
        check(out.numpy(), y)
    # KxK convolutions (the implicit GEMM): strides, dilation, uneven padding, a residual,
    # column and pixel tails, a 1 x 7 kernel, and a stem reading the model's NCHW input
    for h, cin, cout, (kh, kw), s, d, act, res, pads, nchw_in in [
            (11, 16, 40, (3, 3), 1, 1, "relu", False, None, False),
            (13, 7, 19, (5, 5), 2, 1, "hardswish", True, None, False),
            (10, 24, 33, (3, 3), 1, 2, "silu", False, (1, 2, 2, 1), False),
            (9, 8, 6, (1, 7), 1, 1, "relu6", True, None, False),
            (15, 3, 16, (7, 7), 2, 1, "relu", False, None, True),
            (12, 8, 16, (3, 5), 1, 1, "gelu", True, None, False)]:
        pt, pl, pb, pr = pads or ((kh - 1) * d // 2, (kw - 1) * d // 2) * 2
        x = rng.standard_normal((1, h, h, cin)).astype("f4")
        w = (rng.standard_normal((cout, kh, kw, cin)) / np.sqrt(kh * kw * cin)).astype("f4")
        b = rng.standard_normal(cout).astype("f4")
        xp = torch.nn.functional.pad(torch.tensor(x).permute(0, 3, 1, 2), (pl, pr, pt, pb))
        y = torch.nn.functional.conv2d(xp, torch.tensor(w).permute(0, 3, 1, 2), torch.tensor(b),
                                       stride=s, dilation=d).permute(0, 2, 3, 1)
        r = rng.standard_normal(tuple(y.shape)).astype("f4") if res else None
        y = acts[act](y + (torch.tensor(r) if res else 0)).numpy()
        out = T(np.zeros(y.shape, "f4"))
        params = ([s, s, pt, pl, d, d, 1] if (pt, pl) == (pb, pr)
                  else [s, s, pt, pl, pb, pr, d, d, 1])
        xin = T(np.ascontiguousarray(x.transpose(0, 3, 1, 2))) if nchw_in else T(x)
        run(m["paragraph_vendor_conv2d"](out, xin, T(w), T(b), T(r) if res else None,
                                         params, "NCHW2NHWC" if nchw_in else "NHWC", act, 2))
        check(out.numpy(), y)
    conv = "panels16" in " ".join(str(k) for k in m["paragraph_vendor_packed_keys"]())
    # 1x1 convolutions and linear layers: row and column tails, one row (an RNN's step)
    for h, cin, cout, act, res in [(9, 16, 96, "relu6", False), (5, 13, 40, "hardswish", True),
                                   (3, 100, 13, "silu", False), (1, 1, 17, "relu", True),
                                   (4, 24, 40, "gelu", True)]:
        x = rng.standard_normal((1, h, h, cin)).astype("f4")
        w = (rng.standard_normal((cout, 1, 1, cin)) / np.sqrt(cin)).astype("f4")
        b = rng.standard_normal(cout).astype("f4")
        y = torch.tensor(x) @ torch.tensor(w[:, 0, 0, :]).T + torch.tensor(b)
        r = rng.standard_normal(tuple(y.shape)).astype("f4") if res else None
        y = acts[act](y + (torch.tensor(r) if res else 0)).numpy()
        out = T(np.zeros(y.shape, "f4"))
        run(m["paragraph_vendor_conv2d"](out, T(x), T(w), T(b), T(r) if res else None,
                                         [1, 1, 0, 0, 1, 1, 1], "NHWC", act, 2))
        check(out.numpy(), y)
    for rows, k, n in [(1, 300, 200), (7, 33, 50)]:
        a = rng.standard_normal((rows, k)).astype("f4")
        w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype("f4")
        out = T(np.zeros((rows, n), "f4"))
        run(m["paragraph_vendor_linear"](out, T(a), T(w), None, "relu", 2))
        check(out.numpy(), np.maximum(a @ w, 0))
    # products of two activations (the own batched product, AVX2's): row tails of its blocks
    # of 24 and tiles of 6, column tails of its strips of 16, a batch of heads on two threads,
    # and a product of two matrices as a batch of one, with a bias and GELU
    for a_shape, b_shape, bias, act in [
            ((1, 12, 50, 64), (1, 12, 64, 50), False, ""), ((2, 3, 29, 7), (2, 3, 7, 37), False,
                                                            "relu"),
            ((1, 1, 1, 33), (1, 1, 33, 5), False, "gelu"), ((31, 40), (40, 70), True, "gelu"),
            ((1, 5, 16), (16, 3), False, "silu")]:
        a = rng.standard_normal(a_shape).astype("f4")
        bm = (rng.standard_normal(b_shape) / np.sqrt(a_shape[-1])).astype("f4")
        b = rng.standard_normal(b_shape[-1]).astype("f4") if bias else None
        y = acts[act](torch.tensor(a) @ torch.tensor(bm) + (torch.tensor(b) if bias else 0))
        out = T(np.zeros(tuple(y.shape), "f4"))
        run(m["paragraph_vendor_product"](out, T(a), T(bm), T(b) if bias else None, act, 2))
        check(out.numpy(), y.numpy())
    # pools with uneven padding (top, left, bottom, right): PyTorch's form pads a copy first
    x = rng.standard_normal((1, 9, 10, 20)).astype("f4")
    xt = torch.tensor(x).permute(0, 3, 1, 2)
    for is_max, include in ((True, False), (False, True), (False, False)):
        pads = (0, 1, 1, 0)  # left, right, top, bottom, as torch's pad takes them
        if is_max:
            want = torch.nn.functional.max_pool2d(
                torch.nn.functional.pad(xt, pads, value=float("-inf")), 2, 1)
        else:
            total = torch.nn.functional.avg_pool2d(torch.nn.functional.pad(xt, pads), 2, 1)
            count = torch.nn.functional.avg_pool2d(
                torch.nn.functional.pad(torch.ones(1, 1, 9, 10), pads), 2, 1)
            want = total if include else total / count
        want = want.permute(0, 2, 3, 1).numpy()
        out = T(np.zeros(want.shape, "f4"))
        run(m["paragraph_vendor_pool2d"](out, T(x), [2, 2, 1, 1, 1, 0, 0, 1], is_max, include,
                                         None, None, False, 2))
        check(out.numpy(), want)
    # softmax along the last axis and layer norm: the own AVX2 forms (form 0) where ATen's
    # alone ran; a masked run of -inf, rows not a multiple of 8, rows of 4 side by side
    for shape, scale in [((2, 12, 20), 0.125), ((5, 128), 1.0), ((3, 5), -0.5)]:
        x = (rng.standard_normal(shape) * 8).astype("f4")
        x.reshape(-1, shape[-1])[0, :3] = -np.inf
        m["paragraph_vendor_choose_form"]("softmax2(" + "".join(f"{d}," for d in shape) + ")", 0)
        out = T(np.zeros(shape, "f4"))
        run(m["paragraph_vendor_softmax"](out, T(x), -1, scale, 2))
        check(out.numpy(), torch.softmax(torch.tensor(x) * scale, -1).numpy())
    for shape, res in [((5, 77), True), ((4, 64), False)]:
        x = (rng.standard_normal(shape) * 3 + 1).astype("f4")
        r = rng.standard_normal(shape).astype("f4")
        g, be = rng.standard_normal((2, shape[-1])).astype("f4")
        key = "layer_norm1" + ("res" if res else "") + "(" + "".join(f"{d}," for d in shape) + ")"
        m["paragraph_vendor_choose_form"](key, 0)
        out = T(np.zeros(shape, "f4"))
        run(m["paragraph_vendor_layer_norm"](out, T(x), T(g), T(be), T(r) if res else None,
                                             1e-5, 1))
        want = torch.nn.functional.layer_norm(torch.tensor(x + r if res else x), shape[-1:],
                                              torch.tensor(g), torch.tensor(be), 1e-5)
        check(out.numpy(), want.numpy())
    keys = " ".join(str(k) for k in m["paragraph_vendor_packed_keys"]())
    print(conv, "depthwise" in keys, "panels16" in keys, worst)
""")


def test_the_own_avx2_forms_compute_what_pytorch_does(tmp_path):
    """Without AVX-512 (a Zen 3, or ``PARAGRAPH_CPU_ISA=avx2``) the own AVX2 forms run: the
    implicit-GEMM convolution (strides, dilation, uneven padding, residual, tails, an NCHW
    input), the depthwise one (every border, tail, stride and epilogue), the GEMM of 1x1
    convolutions and linear layers (row and column tails, one row), the batched product of two
    activations (row, column and batch tails; a 2-D product with a bias and GELU), softmax and
    layer norm (tails, a masked run, a residual), each equal to PyTorch's;
    their packed weights show that they, not oneDNN's forms, ran. And the pools, PyTorch's
    there, take uneven padding (they refused it)."""
    # the kernels this process built, not built again in the test's private cache: the
    # switch is read when they run
    run = _run_held_to_avx2(_AVX2_FORMS_SCRIPT, tmp_path)
    conv, depthwise, gemm, worst = run.stdout.split()[-4:]
    assert conv == "True" and depthwise == "True" and gemm == "True"
    assert float(worst) < 1e-5


_AVX2_WINOGRAD_SCRIPT = textwrap.dedent("""
    import numpy as np, torch, tvm
    import paragraph
    from paragraph.tvm_interop.runtime.library import native
    m = native.module()
    rng = np.random.default_rng(0)
    T = tvm.runtime.tensor
    acts = {"": lambda y: y, "relu": torch.relu, "relu6": lambda y: torch.clamp(y, 0, 6),
            "silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu}
    worst, forms_run = 0.0, 0
    bound = []  # the kernels held: a packed weight lives as long as a kernel holds it
    # (h, w, cin, cout, kernel, act, residual, pads (top, left, bottom, right) or None, batch):
    # channel tails of 8-vectors and 16-column panels, tiles past the image's edge, uneven
    # padding, a residual, an activation after the call, batch 2, the one-dimensional kernels,
    # 5 x 5, and a weight streamed (over 1 MB) and split by panels
    for h, w_, cin, cout, (kh, kw), act, res, pads, n in [
            (11, 9, 13, 21, (3, 3), "relu", False, None, 1),
            (10, 13, 24, 40, (3, 3), "silu", True, (0, 1, 2, 1), 2),
            (9, 9, 16, 16, (1, 3), "relu6", False, None, 1),
            (9, 7, 17, 33, (3, 1), "", True, None, 1),
            (12, 11, 20, 24, (1, 7), "relu", False, None, 1),
            (11, 10, 8, 19, (7, 1), "relu", True, None, 2),
            (13, 12, 12, 20, (5, 5), "relu6", False, None, 1),
            (8, 9, 16, 24, (3, 3), "gelu", True, None, 1),
            (4, 4, 256, 256, (3, 3), "relu", True, None, 1)]:
        pt, pl, pb, pr = pads or ((kh - 1) // 2, (kw - 1) // 2) * 2
        x = rng.standard_normal((n, h, w_, cin)).astype("f4")
        w = (rng.standard_normal((cout, kh, kw, cin)) / np.sqrt(kh * kw * cin)).astype("f4")
        b = rng.standard_normal(cout).astype("f4")
        xp = torch.nn.functional.pad(torch.tensor(x).permute(0, 3, 1, 2), (pl, pr, pt, pb))
        y = torch.nn.functional.conv2d(xp, torch.tensor(w).permute(0, 3, 1, 2),
                                       torch.tensor(b)).permute(0, 2, 3, 1)
        r = rng.standard_normal(tuple(y.shape)).astype("f4") if res else None
        want = acts[act](y + (torch.tensor(r) if res else 0)).numpy()
        out = T(np.zeros(want.shape, "f4"))
        params = ([1, 1, pt, pl, 1, 1, 1] if (pt, pl) == (pb, pr)
                  else [1, 1, pt, pl, pb, pr, 1, 1, 1])
        kernel = m["paragraph_vendor_conv2d"](out, T(x), T(w), T(b), T(r) if res else None,
                                              params, "NHWC", act, 2)
        bound.append(kernel)
        # forms 0 and 1 are oneDNN's and the implicit GEMM; the Winograd forms follow
        index = 2
        while True:
            with native.forced_form(index) as most:
                out.copyfrom(np.full(want.shape, np.nan, "f4"))
                kernel()
            got = out.numpy()
            worst = max(worst, float(np.abs(got - want).max() / max(1.0, np.abs(want).max())))
            forms_run += 1
            index += 1
            if index >= most:
                break
    keys = " ".join(str(k) for k in m["paragraph_vendor_packed_keys"]())
    names = ["winograd23/16", "winograd43/16", "winograd23/1d/16", "winograd43/1d/16",
             "winograd27/1d/16", "winograd37/1d/16", "winograd25/16"]
    print(all(name in keys for name in names), forms_run, worst)
""")


def test_the_own_avx2_winograd_forms_compute_what_pytorch_does(tmp_path):
    """Without AVX-512 the stride-1 convolutions have Winograd forms in AVX2 (F(2x2, 3x3),
    F(4x4, 3x3), F(2x2, 5x5), and along one axis F(2, 3), F(4, 3), F(2, 7), F(3, 7)): forced
    in turn, every one equals PyTorch's convolution on channel tails, tiles past the image's
    edge, uneven padding, a residual, activations in the epilogue and after it, batch 2 and a
    streamed weight split by panels; each packed its own weight, so each ran. (Their NaN and
    infinities: `test_every_conv_form_keeps_nan_and_infinity_where_torch_does`, on a CPU
    without AVX-512.)"""
    if not {"avx2", "fma"} <= _cpu_flags():
        pytest.skip("the CPU has no AVX2 and FMA")
    run = _run_held_to_avx2(_AVX2_WINOGRAD_SCRIPT, tmp_path)
    packed, forms_run, worst = run.stdout.split()[-3:]
    assert packed == "True"
    assert int(forms_run) >= 10  # 3x3: two forms; 1x7 and 7x1: two; the rest one each
    assert float(worst) < 2e-5


def _run_held_to_avx2(script: str, tmp_path) -> subprocess.CompletedProcess:
    """``script`` run in a process held to AVX2 (``PARAGRAPH_CPU_ISA=avx2``, oneDNN unlimited)
    with a cache of its own holding this process's native libraries (the switch is read when
    the kernels run, not when they are built); it must exit 0."""
    cache = with_native_libraries(tmp_path / "cache")
    env = {**os.environ, "PARAGRAPH_CPU_ISA": "avx2", "PARAGRAPH_CACHE_DIR": str(cache)}
    env.pop("ONEDNN_MAX_CPU_ISA", None)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f
                         if line.startswith("flags")), set())
    except OSError:
        return set()


# (h, cin, cout, groups, kernel, stride, dilation, pads or None, act, residual, batch): groups
# of 2-32 channels, inputs and outputs per group unequal, channel tails of both panel widths,
# strides, dilation, uneven padding, 1 x 1 and 5 x 5 kernels, a residual, epilogues, batch 2
_GROUPED = [
    (9, 128, 128, 32, 3, 1, 1, None, "relu", False, 1),
    (12, 64, 64, 8, 3, 2, 1, None, "relu6", True, 1),
    (10, 48, 96, 6, 3, 1, 2, (1, 2, 2, 1), "hardswish", False, 2),
    (7, 12, 21, 3, 5, 2, 1, None, "silu", True, 1),
    (6, 32, 48, 2, 1, 1, 1, None, "", False, 1),
    (8, 256, 256, 16, 3, 1, 1, None, "relu", False, 1),
    (5, 24, 40, 4, 3, 1, 1, (0, 0, 2, 2), "", True, 2),
]


@pytest.mark.skipif(not {"avx2", "fma"} <= _cpu_flags(), reason="the CPU has no AVX2 and FMA")
@pytest.mark.parametrize("form", [1, 2], ids=["panels16", "panels8"])
def test_the_own_grouped_forms_compute_what_pytorch_does(form):
    """Grouped convolutions (1 < groups < channels) have two own AVX2 forms on any AVX2 CPU,
    panels of 16 and of 8 output channels over the input channels of the groups they cover,
    the padding read as zeros: forced in turn, each equals PyTorch's grouped convolution on
    every case (groups of 2-32, unequal inputs and outputs per group, tails, strides,
    dilation, uneven padding, 1 x 1 and 5 x 5, residual, epilogues, batch 2), and their packed
    weights show that they, not oneDNN's form, ran."""
    from paragraph.tvm_interop.runtime.library import native

    m = native.module()
    if m is None:
        pytest.skip(f"the C++ vendor kernels are unavailable: {native.reason()}")
    rng = np.random.default_rng(form)
    acts = {"": lambda y: y, "relu": torch.relu, "relu6": lambda y: torch.clamp(y, 0, 6),
            "hardswish": torch.nn.functional.hardswish, "silu": torch.nn.functional.silu}
    bound = []  # the kernels held: a packed weight lives as long as a kernel holds it
    for h, cin, cout, groups, k, s, d, pads, act, res, n in _GROUPED:
        pt, pl, pb, pr = pads or ((k - 1) * d // 2,) * 4
        x = rng.standard_normal((n, h, h, cin)).astype("f4")
        w = (rng.standard_normal((cout, k, k, cin // groups)) / k).astype("f4")
        b = rng.standard_normal(cout).astype("f4")
        xp = torch.nn.functional.pad(torch.tensor(x).permute(0, 3, 1, 2), (pl, pr, pt, pb))
        y = torch.nn.functional.conv2d(xp, torch.tensor(w).permute(0, 3, 1, 2), torch.tensor(b),
                                       stride=s, dilation=d, groups=groups).permute(0, 2, 3, 1)
        r = rng.standard_normal(tuple(y.shape)).astype("f4") if res else None
        want = acts[act](y + (torch.tensor(r) if res else 0)).numpy()
        out = tvm.runtime.tensor(np.full(want.shape, np.nan, "f4"))
        params = ([s, s, pt, pl, d, d, groups] if (pt, pl) == (pb, pr)
                  else [s, s, pt, pl, pb, pr, d, d, groups])
        T = tvm.runtime.tensor
        kernel = m["paragraph_vendor_conv2d"](out, T(x), T(w), T(b), T(r) if res else None,
                                              params, "NHWC", act, 2)
        bound.append(kernel)
        with native.forced_form(form):
            kernel()
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5,
                                   err_msg=f"{(h, cin, cout, groups, k, s, d, pads, act)}")
    keys = " ".join(str(k) for k in m["paragraph_vendor_packed_keys"]())
    assert f"grouped{16 if form == 1 else 8}" in keys


@pytest.mark.skipif(not {"avx2", "fma"} <= _cpu_flags(), reason="the CPU has no AVX2 and FMA")
@pytest.mark.parametrize("form", [1, 2], ids=["panels16", "panels8"])
def test_the_own_grouped_forms_keep_nan_and_infinity_in_their_group(form):
    """The own grouped forms multiply other groups' inputs by zero weights, and zero times an
    infinity or a NaN is NaN: a call that computes a NaN is done again by oneDNN's form, so a
    NaN and an infinity in one group's inputs give NaN and infinities where PyTorch's grouped
    convolution has them and nowhere else, and every finite output equals PyTorch's."""
    from paragraph.tvm_interop.runtime.library import native

    m = native.module()
    if m is None:
        pytest.skip(f"the C++ vendor kernels are unavailable: {native.reason()}")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 9, 7, 32)).astype("f4")
    x[0, 3, 2, 1] = np.nan  # group 0
    x[0, 6, 5, 13] = np.inf  # group 3
    w = rng.standard_normal((32, 3, 3, 4)).astype("f4")
    b = rng.standard_normal(32).astype("f4")
    want = torch.nn.functional.conv2d(torch.tensor(x).permute(0, 3, 1, 2),
                                      torch.tensor(w).permute(0, 3, 1, 2), torch.tensor(b),
                                      padding=1, groups=8).permute(0, 2, 3, 1).numpy()
    T = tvm.runtime.tensor
    out = T(np.zeros(want.shape, "f4"))
    kernel = m["paragraph_vendor_conv2d"](out, T(x), T(w), T(b), None, [1, 1, 1, 1, 1, 1, 8],
                                          "NHWC", "", 2)
    with native.forced_form(form):
        kernel()
    got = out.numpy()
    assert np.isnan(want).any() and np.isinf(want).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-5)


def test_an_unknown_isa_is_refused(monkeypatch):
    from paragraph.machine import forced_isa
    monkeypatch.setenv("PARAGRAPH_CPU_ISA", "sse2")
    with pytest.raises(ParagraphError, match="choose one of native, avx2"):
        forced_isa()


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_copy_bytes_copies_every_byte_once_over_the_team(threads):
    """`copy_bytes` (the executor's copy of a large input, `executor.PARALLEL_COPY_BYTES`)
    splits whole cache lines over the calling thread's team: every byte arrives, sizes that
    are not a multiple of a line and smaller than the team included, and nothing past the end
    is written."""
    from paragraph.tvm_interop.runtime.library import native as native_vendor

    if native_vendor.module() is None:
        pytest.skip(f"C++ vendor kernels unavailable: {native_vendor.reason()}")
    rng = np.random.default_rng(threads)
    for n in (0, 1, 63, 64, 65, 191, 1_000_003):
        src = rng.integers(0, 256, n + 64, dtype=np.uint8)
        dst = np.zeros(n + 64, dtype=np.uint8)
        assert native_vendor.copy_bytes(dst.ctypes.data, src.ctypes.data, n, threads)
        np.testing.assert_array_equal(dst[:n], src[:n])
        assert not dst[n:].any()  # the 64 bytes after the copy untouched
