"""Shared plumbing of the model zoo: one `Net` per model that emits Relax ops into a single
dataflow block and draws every weight from one seeded numpy generator, so `get` is deterministic.

Weights follow He/Kaiming-normal scaling (std = sqrt(gain / fan_in)): gain 2 next to a ReLU
(undoing its halving of the second moment), gain 1 elsewhere, so that activations stay near
unit scale through deep nets although batch norm runs in inference mode with fixed (random but
non-trivial) statistics. Those statistics scale the second moment by E[gamma^2 / var] =
13/12 * ln 3 ~ 1.19 on average, which compounds to orders of magnitude over NASNet's ~60 BN
layers in depth; `conv_bn` divides the conv's gain by that factor so that conv + BN together
keep the scale.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax
from tvm.relax.op import nn

Shape = tuple[int, ...]
IntPair = int | tuple[int, int]


BN_MOMENT_GAIN = 13 / 12 * np.log(3)  # E[gamma^2] * E[1/var], gamma, var ~ U(0.5, 1.5)


def _pair(v: IntPair) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else v


class Net:
    """A BlockBuilder inside `main`'s dataflow block plus the seeded weight generator."""

    def __init__(self, bb: relax.BlockBuilder, seed: int):
        self.bb = bb
        self.rng = np.random.default_rng(seed)

    # -- plumbing ------------------------------------------------------------------------
    def emit(self, expr: relax.Expr) -> relax.Var:
        return self.bb.emit(expr)

    @staticmethod
    def shape(x: relax.Expr) -> Shape:
        return tuple(int(d) for d in x.ty.shape)

    def normal(self, shape: Shape, std: float) -> tvm.ir.Constant:
        return relax.const(self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std))

    def uniform(self, shape: Shape, low: float, high: float) -> tvm.ir.Constant:
        return relax.const(self.rng.uniform(low, high, shape).astype(np.float32))

    # -- elementwise / structural ops ----------------------------------------------------
    def relu(self, x: relax.Expr) -> relax.Var:
        return self.emit(nn.relu(x))

    def add(self, a: relax.Expr, b: relax.Expr) -> relax.Var:
        return self.emit(relax.op.add(a, b))

    def multiply(self, a: relax.Expr, b: relax.Expr) -> relax.Var:
        return self.emit(relax.op.multiply(a, b))

    def concat(self, xs: Sequence[relax.Expr], axis: int = 1) -> relax.Var:
        return self.emit(relax.op.concat(list(xs), axis=axis))

    def reshape(self, x: relax.Expr, shape: Shape) -> relax.Var:
        return self.emit(relax.op.reshape(x, shape))

    def slice(self, x: relax.Expr, axes: Sequence[int], begin: Sequence[int],
              end: Sequence[int], strides: Sequence[int] | None = None) -> relax.Var:
        return self.emit(relax.op.strided_slice(x, list(axes), list(begin), list(end), strides))

    # -- layers --------------------------------------------------------------------------
    def conv(self, x: relax.Expr, out_ch: int, kernel: IntPair, stride: IntPair = 1,
             padding: int | Sequence[int] = 0, groups: int = 1, dilation: IntPair = 1,
             gain: float = 2.0, bias: bool = False) -> relax.Var:
        """conv2d (NCHW/OIHW) with He-normal weights; `padding` is 1, 2 or 4 ints as in Relax."""
        in_ch = self.shape(x)[1]
        kh, kw = _pair(kernel)
        fan_in = in_ch // groups * kh * kw
        w = self.normal((out_ch, in_ch // groups, kh, kw), np.sqrt(gain / fan_in))
        y = self.emit(nn.conv2d(x, w, strides=_pair(stride), padding=padding,
                                dilation=_pair(dilation), groups=groups))
        if bias:
            y = self.add(y, self.normal((1, out_ch, 1, 1), 0.05))
        return y

    def batch_norm(self, x: relax.Expr, eps: float = 1e-5) -> relax.Var:
        """Inference batch norm with non-trivial statistics so it is not an identity."""
        c = self.shape(x)[1]
        gamma = self.uniform((c,), 0.5, 1.5)
        beta = self.normal((c,), 0.1)
        mean = self.normal((c,), 0.1)
        var = self.uniform((c,), 0.5, 1.5)
        bn = self.emit(nn.batch_norm(x, gamma, beta, mean, var, axis=1, epsilon=eps,
                                     training=False))
        return self.emit(relax.TupleGetItem(bn, 0))

    def conv_bn(self, x: relax.Expr, out_ch: int, kernel: IntPair, stride: IntPair = 1,
                padding: int | Sequence[int] = 0, groups: int = 1, gain: float = 2.0,
                eps: float = 1e-5) -> relax.Var:
        """Bias-free conv then inference BN; the conv's gain absorbs BN's average moment gain."""
        y = self.conv(x, out_ch, kernel, stride, padding, groups, gain=gain / BN_MOMENT_GAIN)
        return self.batch_norm(y, eps)

    def dense(self, x: relax.Expr, out_features: int, gain: float = 1.0) -> relax.Var:
        """x @ W + b with W stored as (in, out) so no transpose of the constant is emitted."""
        in_features = self.shape(x)[-1]
        w = self.normal((in_features, out_features), np.sqrt(gain / in_features))
        y = self.emit(relax.op.matmul(x, w))
        return self.add(y, self.normal((out_features,), 0.02))

    def max_pool(self, x: relax.Expr, kernel: int, stride: int,
                 padding: int | Sequence[int] = 0, ceil_mode: bool = False) -> relax.Var:
        return self.emit(nn.max_pool2d(x, kernel, stride, padding, ceil_mode=ceil_mode))

    def avg_pool(self, x: relax.Expr, kernel: int, stride: int, padding: int | Sequence[int] = 0,
                 count_include_pad: bool = True) -> relax.Var:
        return self.emit(nn.avg_pool2d(x, kernel, stride, padding,
                                       count_include_pad=count_include_pad))

    def global_pool(self, x: relax.Expr) -> relax.Var:
        """Global average pool, then flatten to (N, C) for the classifier."""
        n, c = self.shape(x)[:2]
        return self.reshape(self.emit(nn.adaptive_avg_pool2d(x, output_size=1)), (n, c))


@dataclass(frozen=True)
class ModelSpec:
    """How to build one zoo model: its builder, its input shape and a one-line source."""

    build: Callable[[Net, relax.Var, bool], relax.Var]
    input_shape: Callable[[bool, int], Shape]
    seed: int
    source: str


def build_module(spec: ModelSpec, reduced: bool, batch: int) -> tvm.IRModule:
    """Emit `main(x)` with one dataflow block whose last binding is the function's output."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(spec.input_shape(reduced, batch), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(spec.build(Net(bb, spec.seed), x, reduced))
        bb.emit_func_output(out)
    # emit_output leaves an alias `gv = lv`; canonicalizing makes the last op itself the output.
    return relax.transform.CanonicalizeBindings()(bb.finalize())


def image_shape(full: int, small: int) -> Callable[[bool, int], Shape]:
    """Input-shape rule of an NCHW RGB classifier: square, full or reduced resolution."""

    def shape(reduced: bool, batch: int) -> Shape:
        size = small if reduced else full
        return (batch, 3, size, size)

    return shape
