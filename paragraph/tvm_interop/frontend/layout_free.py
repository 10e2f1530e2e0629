"""Forms of an imported module that `ConvertLayout` carries to NHWC without transposes:
norms over every axis but the batch without their flattening reshape (`unflatten_norms`), and
constant operands at their tensor's rank (`full_rank_constants`).

PyTorch's ``GroupNorm(1, C)`` (PoolFormer's norm, timm's ``GroupNorm1``) exports to ONNX as a
reshape to ``(N, 1, C*H*W)``, ``InstanceNormalization`` over the last axis, a reshape back and
the per-channel scale and shift; TVM's frontend decomposes the instance norm into ``mean``,
``variance``, ``sqrt`` and element-wise operators on the flattened tensor. Flattened, the
tensor is tied to NCHW's order: `ConvertLayout` put a transpose on each side of every norm
(PoolFormer-S12: 4 of its 15 ms of TVM kernels on one thread, and the norm's element-wise
operators apart from the channel scale and shift). The statistics over the flattened axis
are the statistics over axes 1..3 of the 4-D tensor, in any layout; `unflatten_norms`
computes them there and drops both reshapes, each mean as a whole-image mean (the vendor's
average pool) then a mean over the channels, so the norm is NHWC like its neighbours, and
its scale and shift one element-wise kernel. PoolFormer-S12's TVM kernels on one thread: 15
ms flattened, 1.5 ms so. The values are those of the same sums taken in another order
(float rounding only).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import Constant

from paragraph.tvm_interop.frontend.mutator import ModuleMutator

_REDUCE = ("relax.mean", "relax.variance")
_BINARY = {"relax.add": relax.op.add, "relax.subtract": relax.op.subtract,
           "relax.multiply": relax.op.multiply, "relax.divide": relax.op.divide}
_UNARY = {"relax.sqrt": relax.op.sqrt, "relax.rsqrt": relax.op.rsqrt}


def _shape(expr: relax.Expr) -> tuple[int, ...] | None:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    try:
        return tuple(int(d) for d in ty.shape)
    except TypeError:  # symbolic
        return None


def _op(value: relax.Expr) -> str | None:
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        return value.op.name
    return None


def _scalar_const(expr: relax.Expr) -> relax.Expr | None:
    """A one-element tensor constant as a 0-d constant (it broadcasts to any rank), else None."""
    if isinstance(expr, Constant) and isinstance(expr.ty, relax.TensorType):
        arr = expr.value.numpy()
        if arr.size == 1:
            return relax.const(arr.reshape(()), str(arr.dtype))
    return None


class _Chain:
    """One flattened norm: the variables computed from ``origin``'s flattening, by domain
    ("flat": the (N, 1, L) tensor's shape; "stat": (N, 1, 1))."""

    def __init__(self, origin: relax.Var, shape: tuple[int, ...]) -> None:
        self.origin, self.shape = origin, shape
        self.domain: dict[relax.Var, str] = {}
        self.ends: list[relax.Var] = []  # reshapes back to ``shape``


def _domain_of(chain: _Chain, value: relax.Expr) -> str | None:
    """The domain of ``value`` (a binding's right side) computed from ``chain``'s variables,
    "" where it reads none of them, None where it reads one in a way this pass cannot
    rewrite."""
    op = _op(value)
    args = list(value.args) if isinstance(value, relax.Call) else []
    read = [a for a in args if isinstance(a, relax.Var) and a in chain.domain]
    if not read:
        return ""
    n = chain.shape[0]
    if op in _REDUCE:
        axes = [int(a) for a in value.attrs.axis] if value.attrs.axis is not None else None
        return "stat" if (chain.domain[args[0]] == "flat" and axes in ([2], [-1])
                          and bool(value.attrs.keepdims)) else None
    if op == "relax.reshape":
        return "end" if chain.domain[args[0]] == "flat" and _shape(value) == chain.shape \
            else None
    if op in _UNARY:
        return chain.domain[args[0]]
    if op in _BINARY:
        domains = set()
        for a in args:
            if isinstance(a, relax.Var):
                if a not in chain.domain:
                    return None  # another tensor: not this pass's
                domains.add(chain.domain[a])
            elif _scalar_const(a) is None and not (isinstance(a, Constant)
                                                   and _shape(a) == (n, 1, 1)):
                return None
        return "flat" if "flat" in domains else "stat"
    return None


def _chains(func: relax.Function) -> list[_Chain]:
    """The flattened norms of ``func`` whose every use this pass can rewrite."""
    bindings = [b for block in func.body.blocks for b in block.bindings]
    chains = []
    for b in bindings:
        if not isinstance(b, relax.VarBinding) or _op(b.value) != "relax.reshape":
            continue
        x = b.value.args[0]
        shape, flat = _shape(x), _shape(b.value)
        if shape is None or len(shape) != 4 or flat != (shape[0], 1, int(np.prod(shape[1:]))):
            continue
        chain = _Chain(x, shape)
        chain.domain[b.var] = "flat"
        chains.append(chain)
    kept = []
    for chain in chains:
        ok = True
        for b in bindings:
            if b.var in chain.domain:
                continue
            domain = _domain_of(chain, b.value) if isinstance(b, relax.VarBinding) else ""
            if domain is None:
                ok = False
                break
            if domain == "end":
                chain.ends.append(b.var)
            elif domain:
                chain.domain[b.var] = domain
        # the chain's values leave it only through its reshapes back (and not as outputs)
        if ok and chain.ends and not _escapes(func, chain):
            kept.append(chain)
    return kept


def _escapes(func: relax.Function, chain: _Chain) -> bool:
    """Whether a variable of ``chain`` is the function's result or read by it directly."""
    return any(v in chain.domain for v in relax.analysis.free_vars(func.body.body))


@relax.expr_functor.mutator
class _Unflatten(ModuleMutator):
    def __init__(self, mod: tvm.IRModule, chains: list[_Chain]) -> None:
        super().__init__(mod)
        self.chains = chains
        self.replace: dict[relax.Var, relax.Expr] = {}
        self.means: dict[relax.Expr, relax.Var] = {}

    def _arg(self, a: relax.Expr) -> relax.Expr:
        if isinstance(a, relax.Var) and a in self.replace:
            return self.replace[a]
        scalar = _scalar_const(a)
        if scalar is not None:
            return scalar
        if isinstance(a, Constant):  # (N, 1, 1) per image: (N, 1, 1, 1)
            arr = a.value.numpy()
            return relax.const(arr.reshape(arr.shape[0], 1, 1, 1), str(arr.dtype))
        return self.visit_expr(a)

    def _mean(self, x: relax.Expr, name: str, remember: bool = True) -> relax.Var:
        """The mean of ``x`` over axes 1..3, as the mean over channels of its mean over height
        and width (equal group sizes: the same value): the inner mean, a whole-image average
        pool, is the vendor's (both cores, vectorised) where a TVM reduction of every element
        ran on one thread unvectorised (PoolFormer's 24 norms: 6 ms). A variance is the mean
        of ``(x - mean)^2`` taken so, the mean of ``x`` computed once."""
        if remember and x in self.means:
            return self.means[x]
        pooled = self.builder_.emit(relax.op.mean(x, axis=[2, 3], keepdims=True))
        out = self.builder_.emit(relax.op.mean(pooled, axis=[1], keepdims=True), name)
        if remember:
            self.means[x] = out
        return out

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:  # noqa: D102
        for chain in self.chains:
            if binding.var in chain.domain or binding.var in chain.ends:
                value, op = binding.value, _op(binding.value)
                if chain.domain.get(binding.var) == "flat" and op == "relax.reshape" \
                        and value.args[0].same_as(chain.origin):
                    self.replace[binding.var] = self.visit_expr(chain.origin)
                    return
                if binding.var in chain.ends:
                    new = self.replace[value.args[0]]
                    if not isinstance(binding.var, relax.DataflowVar):  # a block's output
                        new = self.builder_.emit_output(new, binding.var.name)
                    self.set_var_remap(binding.var, new)
                    return
                args = [self._arg(a) for a in value.args]
                if op in _REDUCE:
                    new = self._mean(args[0], binding.var.name)
                    if op == "relax.variance":
                        d = self.builder_.emit(relax.op.subtract(args[0], new))
                        new = self._mean(self.builder_.emit(relax.op.multiply(d, d)),
                                         binding.var.name, remember=False)
                    self.replace[binding.var] = new
                    return
                if op in _UNARY:
                    new = _UNARY[op](args[0])
                else:
                    new = _BINARY[str(op)](*args)
                self.replace[binding.var] = self.builder_.emit(new, binding.var.name)
                return
        super().visit_var_binding_(binding)


def unflatten_norms(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each norm over a 4-D tensor's flattened (N, 1, C*H*W) view computed over
    axes 1..3 of the tensor itself (see the module's docstring); unchanged where there is
    none."""
    func = mod["main"] if "main" in [gv.name_hint for gv in mod.get_global_vars()] else None
    if not isinstance(func, relax.Function):
        return mod
    chains = _chains(func)
    if not chains:
        return mod
    return _Unflatten(mod, chains).transform()


@relax.expr_functor.mutator
class _FullRank(ModuleMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: D102
        call = self.visit_expr_post_order(call)
        make = {**_BINARY, **_OTHER_BINARY}.get(_op(call) or "")
        if make is None or len(call.args) != 2:
            return call
        known = [_shape(a) for a in call.args]
        shapes = [s for s in known if s is not None]
        if len(shapes) != len(known):
            return call
        rank = max(len(s) for s in shapes)
        args = list(call.args)
        changed = False
        for i, (a, s) in enumerate(zip(args, shapes, strict=True)):
            if isinstance(a, Constant) and 0 < len(s) < rank:
                arr = a.value.numpy()
                args[i] = relax.const(arr.reshape((1,) * (rank - len(s)) + s), str(arr.dtype))
                changed = True
        if _op(call) in _COMMUTATIVE and isinstance(args[0], Constant) \
                and not isinstance(args[1], Constant):
            # the tensor first: `ConvertLayout` takes a binary operator's layout from its
            # first operand, and left ``c * x`` in NCHW between two transposes
            args, changed = args[::-1], True
        return make(*args) if changed else call


_COMMUTATIVE = ("relax.add", "relax.multiply", "relax.maximum", "relax.minimum")
_OTHER_BINARY = {"relax.maximum": relax.op.maximum, "relax.minimum": relax.op.minimum,
                 "relax.power": relax.op.power}


def full_rank_constants(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each constant operand of an element-wise binary operator that has fewer
    axes than the other operand given the missing leading unit axes: PyTorch exports a
    per-channel scale as (C, 1, 1) against an (N, C, H, W) tensor, and `ConvertLayout` has no
    NHWC form for an operand of lower rank, so it put a transpose on each side of the operator
    (PoolFormer's scale and shift after each norm: 2.6 of its 15 ms of TVM kernels on one
    thread); and the tensor put first in a commutative operator (``c * x`` as ``x * c``: see
    `_FullRank`). A 0-d constant (a scalar) stays as it is: it has no layout."""
    return _FullRank(mod).transform()
