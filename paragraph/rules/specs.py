"""The rule language's operators (TASO table 2.1): shape function, numpy reference, z3 function.

Every operator has three meanings that must agree: a shape function over `Meta` (a shape plus
TASO's split trees, section 2.3.1, which let a ``split`` recover the point of the ``concat``
it undoes), a numpy reference in two modes (``"float"``: the real operator; ``"int"``: the
generator's fingerprint arithmetic, int64 with wrap-around, where avg pooling sums instead of
dividing and the non-linear element-wise functions are fixed polynomials, as in TASO's
generator) and a z3 uninterpreted function over the sort of tensors ``T`` with integer
parameters (TASO section 2.4: shapes are not modelled).

The float references are the graph IR's (`paragraph.ops`, one numpy reference per operator):
a rule operator runs the IR operator it lowers to, its parameters (stride, SAME/VALID
padding, activation, groups) mapped to that operator's attributes. The int mode keeps its own
arithmetic where it differs (non-linear functions, pools, a convolution's activation) and
shares the rest: operators exact on int64 (element-wise, matmul, concat, ...) run the IR's
reference in both modes, and pools and convolutions take their windows from
`paragraph.ops.windows`.

Conventions: tensors are NCHW / OIHW; axes are negative (counted from the last), so an axiom
about rows and columns holds for matrices and batched matrices alike; ``pad`` is ``SAME``
(centred, ``k // 2`` on each side, odd kernels only) or ``VALID``; ``act`` is ``NONE`` or
``RELU``; a convolution's ``groups`` is a parameter (grouped convolution, with normal and
depth-wise as special cases). ``transpose`` swaps the last two axes. Constants (``c_pool``,
``i_conv``, ``i_matmul``, ``ones``, ``zeros``, ``neg_one``) take their shape from where they
are used (`constant_shape`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Protocol, cast

import numpy as np
import z3

from paragraph import ops as graph_ops

SAME, VALID = 0, 1  # padding modes
NONE, RELU = 0, 1  # activations

Tree = Any  # None, or (cut, left tree, right tree): one node per concatenation
Params = dict[str, Any]  # an operator's parameter values, by name
Z3Expr = Any  # a z3 term, formula, function or sort (z3 ships no type information)


class ShapeError(ValueError):
    """An operator does not apply to tensors of these shapes (or split trees)."""


@dataclass(frozen=True)
class Meta:
    """The static part of a rule-language tensor: its shape and one split tree per axis."""

    shape: tuple[int, ...]
    trees: tuple[Tree, ...] = ()

    def __post_init__(self) -> None:
        if not self.trees:
            object.__setattr__(self, "trees", (None,) * len(self.shape))

    @property
    def rank(self) -> int:
        return len(self.shape)


ShapeFn = Callable[[Params, list[Meta]], list[Meta]]  # metas of the inputs -> of the outputs
RefFn = Callable[[Params, list[np.ndarray], str], list[np.ndarray]]  # (params, args, mode)
OpFns = tuple[ShapeFn, RefFn]


@dataclass(frozen=True)
class RuleOp:
    """One operator of the rule language."""

    name: str
    params: tuple[str, ...]
    arity: int
    n_out: int
    shape: ShapeFn
    ref: RefFn
    constant: bool = False


OPS: dict[str, RuleOp] = {}


def _op(name: str, params: Sequence[str], arity: int, n_out: int = 1,
        constant: bool = False) -> Callable[[OpFns], OpFns]:
    def deco(fns: OpFns) -> OpFns:
        shape, ref = fns
        OPS[name] = RuleOp(name, tuple(params), arity, n_out, shape, ref, constant)
        return fns
    return deco


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ShapeError(msg)


def _axis(a: int, rank: int) -> int:
    _require(-rank <= a < 0, f"axis {a} for rank {rank}")
    return a + rank


def _join(a: Tree, b: Tree) -> Tree:
    return a if a == b else None


def _ir(kind: str, args: Sequence[np.ndarray], attrs: Mapping[str, Any] | None = None
        ) -> np.ndarray:
    """The one output of the IR operator ``kind``'s numpy reference (`paragraph.ops`)."""
    return graph_ops.compute(kind, args, attrs or {})[0]


AttrsFn = Callable[[Params, list[np.ndarray]], Mapping[str, Any]]  # params, args -> attrs


def _no_attrs(p: Params, xs: list[np.ndarray]) -> Mapping[str, Any]:
    return {}


def _ir_ref(kind: str, attrs: AttrsFn = _no_attrs) -> RefFn:
    """A reference that is IR operator ``kind``'s in both modes, with the attributes
    ``attrs`` makes of the parameters and arguments: for operators exact on int64, where
    the fingerprint arithmetic is the real operator's."""
    return lambda p, xs, mode: [_ir(kind, xs, attrs(p, xs))]


# ---------------------------------------------------------------------------- element-wise
def _ew_shape(p: Params, metas: list[Meta]) -> list[Meta]:
    a, b = metas
    _require(a.shape == b.shape, f"element-wise op on {a.shape} and {b.shape}")
    return [Meta(a.shape, tuple(map(_join, a.trees, b.trees)))]


_op("ewadd", (), 2)((_ew_shape, _ir_ref("add")))
_op("ewmul", (), 2)((_ew_shape, _ir_ref("multiply")))
_op("ewsub", (), 2)((_ew_shape, _ir_ref("subtract")))


def _smul_shape(p: Params, metas: list[Meta]) -> list[Meta]:
    x, s = metas
    _require(s.rank == 0, f"smul needs a scalar second operand, got {s.shape}")
    return [x]


_op("smul", (), 2)((_smul_shape, _ir_ref("multiply")))


def _unary_shape(p: Params, metas: list[Meta]) -> list[Meta]:
    return [metas[0]]


# Integer stand-ins for the non-linear functions (TASO models relu as x*(x+1)+1 on integers):
# arbitrary polynomials, different for each function, so that no identity specific to one of
# them (relu(relu(x)) = relu(x), ...) holds in the fingerprint arithmetic.
_UnaryFn = Callable[[np.ndarray], np.ndarray]
_POLYNOMIALS: dict[str, _UnaryFn] = {
    "relu": lambda x: x * (x + 1) + 1,
    "sigmoid": lambda x: x * x * x + 7,
    "tanh": lambda x: 3 * x * x - x + 11,
    "gelu": lambda x: 5 * x * x + 3 * x + 13,
}


def _unary_ref(name: str, poly: _UnaryFn) -> RefFn:
    def ref(p: Params, xs: list[np.ndarray], mode: str) -> list[np.ndarray]:
        return [poly(xs[0]) if mode == "int" else _ir(name, xs)]
    return ref


for _name, _poly in _POLYNOMIALS.items():
    _op(_name, (), 1)((_unary_shape, _unary_ref(_name, _poly)))


def _transpose_shape(p: Params, metas: list[Meta]) -> list[Meta]:
    (x,) = metas
    _require(x.rank >= 2, f"transpose of rank {x.rank}")
    return [Meta(x.shape[:-2] + (x.shape[-1], x.shape[-2]), x.trees[:-2] + (x.trees[-1],
                                                                            x.trees[-2]))]


def _swap_last_two(p: Params, xs: list[np.ndarray]) -> dict[str, Any]:
    n = xs[0].ndim
    return {"axes": (*range(n - 2), n - 1, n - 2)}


_op("transpose", (), 1)((_transpose_shape, _ir_ref("permute_dims", _swap_last_two)))


# ---------------------------------------------------------------------------- matmul
def _matmul_shape(p: Params, metas: list[Meta]) -> list[Meta]:
    a, b = metas
    _require(a.rank >= 2 and a.rank == b.rank and a.shape[:-2] == b.shape[:-2]
             and a.shape[-1] == b.shape[-2], f"matmul of {a.shape} and {b.shape}")
    trees = tuple(map(_join, a.trees[:-2], b.trees[:-2])) + (a.trees[-2], b.trees[-1])
    return [Meta(a.shape[:-1] + (b.shape[-1],), trees)]


_op("matmul", (), 2)((_matmul_shape, _ir_ref("matmul")))


def _chmul_shape(p: Params, metas: list[Meta]) -> list[Meta]:
    x, v = metas
    a = _axis(p["axis"], x.rank)
    _require(v.rank == 1 and v.shape[0] == x.shape[a], f"chmul of {x.shape} by {v.shape}")
    return [x]


def _chmul_ref(p: Params, xs: list[np.ndarray], mode: str) -> list[np.ndarray]:
    x, v = xs
    shape = [1] * x.ndim
    shape[p["axis"]] = -1
    return [_ir("multiply", [x, v.reshape(shape)])]


# multiply every slice along ``axis`` by one entry of a vector (batch norm's scale)
_op("chmul", ("axis",), 2)((_chmul_shape, _chmul_ref))


# ---------------------------------------------------------------------------- conv and pool
def _pads(pad: int, kh: int, kw: int) -> tuple[int, int]:
    if pad == VALID:
        return 0, 0
    _require(pad == SAME and kh % 2 == 1 and kw % 2 == 1, f"SAME padding of a {kh}x{kw} kernel")
    return kh // 2, kw // 2


def _window_out(size: int, k: int, s: int, p: int) -> int:
    out = (size + 2 * p - k) // s + 1
    _require(out >= 1, f"window {k} does not fit {size}")
    return out


def _conv_shape(p: Params, metas: list[Meta]) -> list[Meta]:
    x, w = metas
    _require(x.rank == 4 and w.rank == 4, f"conv2d of {x.shape} and {w.shape}")
    g = p["groups"]
    _require(g >= 1 and x.shape[1] == w.shape[1] * g and w.shape[0] % g == 0,
             f"conv2d: data {x.shape}, kernel {w.shape}, groups {g}")
    kh, kw = w.shape[2:]
    ph, pw = _pads(p["pad"], kh, kw)
    s = p["stride"]
    _require(s >= 1, f"stride {s}")
    oh, ow = _window_out(x.shape[2], kh, s, ph), _window_out(x.shape[3], kw, s, pw)
    return [Meta((x.shape[0], w.shape[0], oh, ow), (x.trees[0], w.trees[0], None, None))]


def _windows(x: np.ndarray, kh: int, kw: int, s: int, oh: int, ow: int) -> np.ndarray:
    """The IR's windows (`paragraph.ops.windows`) for a square stride, without dilation."""
    return graph_ops.windows(x, kh, kw, (s, s), (1, 1), oh, ow)


def conv2d_ref(x: np.ndarray, w: np.ndarray, stride: int, pad: int, act: int, groups: int,
               mode: str = "float") -> np.ndarray:
    """Grouped 2-D convolution (NCHW/OIHW) with SAME or VALID padding and an activation:
    the IR's ``conv2d`` (and ``relu``); in int mode the same sums in int64, and relu's
    polynomial."""
    kh, kw = w.shape[2:]
    ph, pw = _pads(pad, kh, kw)
    if mode != "int":
        out = _ir("conv2d", [x, w], {"strides": stride, "padding": (ph, pw), "groups": groups})
        return _ir("relu", [out]) if act == RELU else out
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh, ow = _window_out(x.shape[2], kh, stride, ph), _window_out(x.shape[3], kw, stride, pw)
    win = _windows(xp, kh, kw, stride, oh, ow)
    n, g = x.shape[0], groups
    win = win.reshape(n, g, x.shape[1] // g, oh, ow, kh, kw)
    wg = w.reshape(g, w.shape[0] // g, w.shape[1], kh, kw)
    out = np.einsum("ngchwij,gocij->ngohw", win, wg).reshape(n, w.shape[0], oh, ow)
    return _POLYNOMIALS["relu"](out) if act == RELU else out


def _conv_ref(p: Params, xs: list[np.ndarray], mode: str) -> list[np.ndarray]:
    x, w = xs
    return [conv2d_ref(x, w, p["stride"], p["pad"], p["act"], p["groups"], mode)]


_op("conv2d", ("stride", "pad", "act", "groups"), 2)((_conv_shape, _conv_ref))


def _pool_shape(p: Params, metas: list[Meta]) -> list[Meta]:
    (x,) = metas
    _require(x.rank == 4, f"pooling of rank {x.rank}")
    kh, kw, s = p["kh"], p["kw"], p["stride"]
    ph, pw = _pads(p["pad"], kh, kw)
    _require(s >= 1 and kh >= 1 and kw >= 1, "pool parameters")
    return [Meta(x.shape[:2] + (_window_out(x.shape[2], kh, s, ph),
                                _window_out(x.shape[3], kw, s, pw)), x.trees[:2] + (None, None))]


def pool_ref(x: np.ndarray, kh: int, kw: int, stride: int, pad: int, kind: str,
             mode: str = "float") -> np.ndarray:
    """Average pooling counting the padding (= conv with C_pool), or max pooling: the IR's
    ``avg_pool2d`` (``count_include_pad``) or ``max_pool2d``; in int mode the average is
    the window's sum (C_pool is all ones there)."""
    ph, pw = _pads(pad, kh, kw)
    if mode != "int":
        kind_ir = "max_pool2d" if kind == "max" else "avg_pool2d"
        return _ir(kind_ir, [x], {"pool_size": (kh, kw), "strides": stride, "padding": (ph, pw),
                                  "count_include_pad": True})
    oh, ow = _window_out(x.shape[2], kh, stride, ph), _window_out(x.shape[3], kw, stride, pw)
    if kind == "max":
        xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)),
                    constant_values=np.iinfo(np.int64).min)
        out: np.ndarray = _windows(xp, kh, kw, stride, oh, ow).max(axis=(4, 5))
        return out
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    total: np.ndarray = _windows(xp, kh, kw, stride, oh, ow).sum(axis=(4, 5))
    return total


_POOL = ("kh", "kw", "stride", "pad")
_op("pool_avg", _POOL, 1)((_pool_shape, lambda p, xs, mode: [
    pool_ref(xs[0], p["kh"], p["kw"], p["stride"], p["pad"], "avg", mode)]))
_op("pool_max", _POOL, 1)((_pool_shape, lambda p, xs, mode: [
    pool_ref(xs[0], p["kh"], p["kw"], p["stride"], p["pad"], "max", mode)]))


def _enlarge_shape(p: Params, metas: list[Meta]) -> list[Meta]:
    (w,) = metas
    kh, kw = p["kh"], p["kw"]
    _require(w.rank == 4 and w.shape[2] <= kh and w.shape[3] <= kw
             and (kh - w.shape[2]) % 2 == 0 and (kw - w.shape[3]) % 2 == 0,
             f"enlarge of {w.shape} to {kh}x{kw}")
    return [Meta(w.shape[:2] + (kh, kw), w.trees[:2] + (None, None))]


def enlarge_ref(w: np.ndarray, kh: int, kw: int) -> np.ndarray:
    """Zero-pad a kernel to kh x kw, keeping it centred (so SAME convolutions agree): the
    IR's ``enlarge``, in both modes."""
    return _ir("enlarge", [w], {"kernel_size": (kh, kw)})


_op("enlarge", ("kh", "kw"), 1)((_enlarge_shape,
                                 lambda p, xs, mode: [enlarge_ref(xs[0], p["kh"], p["kw"])]))


# ---------------------------------------------------------------------------- concat, split
def _concat_shape(p: Params, metas: list[Meta]) -> list[Meta]:
    x, y = metas
    a = _axis(p["axis"], x.rank)
    _require(x.rank == y.rank and all(x.shape[i] == y.shape[i] for i in range(x.rank) if i != a),
             f"concat on axis {p['axis']} of {x.shape} and {y.shape}")
    shape = list(x.shape)
    shape[a] += y.shape[a]
    trees = [_join(s, t) for s, t in zip(x.trees, y.trees, strict=True)]
    trees[a] = (x.shape[a], x.trees[a], y.trees[a])
    return [Meta(tuple(shape), tuple(trees))]


_op("concat", ("axis",), 2)((_concat_shape, _ir_ref("concat", lambda p, xs: p)))


def _split_shape(p: Params, metas: list[Meta]) -> list[Meta]:
    (x,) = metas
    a = _axis(p["axis"], x.rank)
    tree = x.trees[a]
    _require(tree is not None, "split of an axis that no concat made (no split tree)")
    cut, left, right = tree
    outs = []
    for size, sub in ((cut, left), (x.shape[a] - cut, right)):
        shape, trees = list(x.shape), list(x.trees)
        shape[a], trees[a] = size, sub
        outs.append(Meta(tuple(shape), tuple(trees)))
    return outs


def split_point(meta: Meta, axis: int) -> int:
    """Where ``split(axis)`` cuts a tensor: the point of the concat its split tree records."""
    return _split_shape({"axis": axis}, [meta])[0].shape[_axis(axis, meta.rank)]


def _split_ref(p: Params, xs: list[np.ndarray], mode: str) -> list[np.ndarray]:
    raise ShapeError("split needs its input's split tree: evaluate it through `compute`")


_op("split", ("axis",), 1, n_out=2)((_split_shape, _split_ref))


# ---------------------------------------------------------------------------- constants
def _const_shape(p: Params, metas: list[Meta]) -> list[Meta]:
    raise ShapeError("a constant takes its shape from its use (constant_shape)")


def c_pool_value(shape: tuple[int, ...], mode: str = "float") -> np.ndarray:
    """Depth-wise kernel that makes a convolution an average pool: every entry 1/(kh*kw)."""
    if mode == "int":
        return np.ones(shape, np.int64)
    return np.full(shape, 1.0 / (shape[2] * shape[3]))


def i_conv_value(shape: tuple[int, ...], mode: str = "float") -> np.ndarray:
    """Identity kernel (C, C, kh, kw): 1 at the centre of the diagonal, 0 elsewhere."""
    _require(len(shape) == 4 and shape[0] == shape[1],
             f"an identity kernel must be square in its channels, not {shape}")
    v = np.zeros(shape, np.int64 if mode == "int" else np.float64)
    c = np.arange(shape[0])
    v[c, c, shape[2] // 2, shape[3] // 2] = 1
    return v


def i_matmul_value(shape: tuple[int, ...], mode: str = "float") -> np.ndarray:
    """Identity matrix (or a batch of them): square in its last two axes."""
    _require(len(shape) >= 2 and shape[-1] == shape[-2],
             f"an identity matrix must be square, not {shape}")
    v = np.zeros(shape, np.int64 if mode == "int" else np.float64)
    v[..., np.arange(shape[-1]), np.arange(shape[-1])] = 1
    return v


class ConstantFn(Protocol):
    """The array of a constant at a shape, in a mode (``"float"`` or ``"int"``)."""

    def __call__(self, shape: tuple[int, ...], mode: str = "float") -> np.ndarray: ...


def _fill(value: float) -> ConstantFn:
    return lambda shape, mode="float": np.full(shape, value,
                                               np.int64 if mode == "int" else np.float64)


CONSTANT_VALUES: dict[str, ConstantFn] = {
    "c_pool": c_pool_value, "i_conv": i_conv_value, "i_matmul": i_matmul_value,
    "ones": _fill(1), "zeros": _fill(0), "neg_one": _fill(-1),
}
for _name, _params in {"c_pool": ("kh", "kw"), "i_conv": ("kh", "kw"), "i_matmul": (),
                       "ones": (), "zeros": (), "neg_one": ()}.items():
    _op(_name, _params, 0, constant=True)((_const_shape, lambda p, xs, mode: []))


def constant_shape(name: str, params: Params, consumer: str, cparams: Params, position: int,
                   others: Sequence[Meta | None]) -> tuple[int, ...]:
    """The shape of constant ``name`` read as argument ``position`` of ``consumer``.

    ``others`` are the consumer's other arguments (None at ``position``). Raises `ShapeError`
    where the use does not determine a shape.
    """
    if name == "neg_one":
        return ()
    if consumer == "conv2d" and position == 1 and name in ("c_pool", "i_conv", "zeros"):
        x = others[0]
        _require(x is not None and x.rank == 4, "constant kernel without data")
        assert x is not None  # for mypy: _require raised otherwise
        kh, kw = params.get("kh", 1), params.get("kw", 1)
        c, g = x.shape[1], cparams["groups"]
        if name == "c_pool":
            _require(g == c, "C_pool is a depth-wise kernel: groups must equal channels")
            return (c, 1, kh, kw)
        if name == "i_conv":
            _require(g == 1, "I_conv is a dense kernel: groups must be 1")
            return (c, c, kh, kw)
    if consumer == "matmul" and name == "i_matmul":
        other = others[1 - position]
        _require(other is not None, "I_matmul without a partner")
        assert other is not None  # for mypy: _require raised otherwise
        n = other.shape[-1] if position == 1 else other.shape[-2]
        return other.shape[:-2] + (n, n)
    if consumer in ("ewadd", "ewmul", "ewsub"):
        other = others[1 - position]
        _require(other is not None, f"{name} without a partner")
        assert other is not None  # for mypy: _require raised otherwise
        return other.shape
    raise ShapeError(f"the shape of {name} is not determined by its use in {consumer}")


def constant_value(name: str, shape: tuple[int, ...], mode: str = "float") -> np.ndarray:
    """The array of constant ``name`` at ``shape``."""
    return CONSTANT_VALUES[name](shape, mode)


# ---------------------------------------------------------------------------- evaluation
def infer(name: str, params: Params, metas: Sequence[Meta]) -> list[Meta]:
    """Output metas of operator ``name``; raises `ShapeError` where it does not apply."""
    op = OPS[name]
    _require(len(metas) == op.arity, f"{name} takes {op.arity} inputs, got {len(metas)}")
    return op.shape(params, list(metas))


def compute(name: str, params: Params, args: Sequence[np.ndarray], metas: Sequence[Meta],
            mode: str = "float") -> list[np.ndarray]:
    """Run the numpy reference of ``name`` (``metas`` give split points to ``split``)."""
    if name == "split":
        cut = split_point(metas[0], params["axis"])
        return graph_ops.compute("split", args, {"indices_or_sections": (cut,),
                                                 "axis": params["axis"]})
    return OPS[name].ref(params, list(args), mode)


# ---------------------------------------------------------------------------- z3
@cache
def z3_sorts() -> tuple[Z3Expr, Z3Expr]:
    """The z3 sort of tensors (uninterpreted) and of parameters (integers)."""
    return z3.DeclareSort("T"), z3.IntSort()


@cache
def z3_dim() -> Z3Expr:
    """``dim(T, axis) -> Int``: a tensor's size along a (negative) axis, for the few axioms
    whose hypotheses compare sizes (`paragraph.rules.axioms`)."""
    tensor, param = z3_sorts()
    return z3.Function("dim", tensor, param, param)


@cache
def z3_function(name: str, out: int = 0) -> Z3Expr:
    """The uninterpreted function (or constant) of output ``out`` of operator ``name``."""
    op = OPS[name]
    tensor, param = z3_sorts()
    fname = name if op.n_out == 1 else f"{name}{out}"
    sig = [param] * len(op.params) + [tensor] * op.arity
    return z3.Const(fname, tensor) if not sig else z3.Function(fname, *sig, tensor)


def z3_apply(name: str, params: Sequence[Any], args: Sequence[Z3Expr], out: int = 0) -> Z3Expr:
    """``name``'s z3 term for output ``out`` (``params`` ints or z3 integer terms)."""
    f = z3_function(name, out)
    if not params and not args:
        return f
    return f(*[z3.IntVal(v) if isinstance(v, int) else v for v in params], *args)


# ---------------------------------------------------------------------------- terms
@dataclass(frozen=True)
class Term:
    """A rule-language expression: a tensor variable (``op == "var"``) or an application.

    ``params`` values are ints, parameter variables (str) or expressions ``("//", "g", 2)``
    (``*``, ``//``, ``%``);
    ``out`` selects an output of a multi-output operator (``split``).
    """

    op: str
    params: tuple[tuple[str, Any], ...] = ()
    args: tuple[Term, ...] = ()
    out: int = 0
    name: str = ""

    def __repr__(self) -> str:
        if self.op == "var":
            return self.name
        ps = [f"{k}={v}" for k, v in self.params]
        head = self.op + (str(self.out) if OPS[self.op].n_out > 1 else "")
        return f"{head}({', '.join(ps + [repr(a) for a in self.args])})"


Evaluated = tuple[np.ndarray, Meta]  # a term's value and meta


def var(name: str) -> Term:
    """A tensor variable."""
    return Term("var", name=name)


def app(op: str, *args: Term, out: int = 0, **params: Any) -> Term:
    """Operator ``op`` applied to ``args`` with ``params`` (checked against the operator)."""
    spec = OPS[op]
    if set(params) != set(spec.params) or len(args) != spec.arity:
        raise ValueError(f"{op} takes params {spec.params} and {spec.arity} args")
    return Term(op, tuple((k, params[k]) for k in spec.params), tuple(args), out)


def is_constant(term: Term) -> bool:
    """Whether ``term`` is a constant tensor (``c_pool``, ``ones``, ...)."""
    return term.op != "var" and OPS[term.op].constant


def param_value(v: Any, env: Mapping[str, Any]) -> Any:
    """A parameter value: an int, a variable looked up in ``env``, or a product."""
    if isinstance(v, str):
        return env[v]
    if isinstance(v, tuple):
        op, a, b = v
        a, b = param_value(a, env), param_value(b, env)
        return {"*": lambda: a * b, "//": lambda: a / b if _is_z3(a) else a // b,
                "%": lambda: a % b}[op]()
    return v


def _is_z3(v: Any) -> bool:
    return not isinstance(v, int)


def term_vars(term: Term, tensors: set[str] | None = None,
              params: set[str] | None = None) -> tuple[set[str], set[str]]:
    """The tensor variables and parameter variables of ``term`` (two sets)."""
    tensors, params = (set() if tensors is None else tensors), (set() if params is None
                                                                else params)
    if term.op == "var":
        tensors.add(term.name)
    for _, v in term.params:
        stack = [v]
        while stack:
            x = stack.pop()
            if isinstance(x, str):
                params.add(x)
            elif isinstance(x, tuple):
                stack.extend(x[1:])
    for a in term.args:
        term_vars(a, tensors, params)
    return tensors, params


def evaluate(term: Term, tensors: Mapping[str, np.ndarray], params: Mapping[str, Any],
             mode: str = "float", memo: dict[Term, Evaluated] | None = None) -> Evaluated:
    """Value and meta of ``term`` (constants get their shapes from their use)."""
    memo = {} if memo is None else memo
    if term in memo:
        return memo[term]
    if term.op == "var":
        v = tensors[term.name]
        result = (v, Meta(tuple(v.shape)))
    else:
        p = {k: param_value(v, params) for k, v in term.params}
        done: list[Evaluated | None] = [
            None if is_constant(a) else evaluate(a, tensors, params, mode, memo)
            for a in term.args]
        for i, a in enumerate(term.args):
            if done[i] is None:
                ap = {k: param_value(v, params) for k, v in a.params}
                others = [None if d is None else d[1] for d in done]
                shape = constant_shape(a.op, ap, term.op, p, i, others)
                value = constant_value(a.op, shape, mode)
                if mode == "float" and term.args and done[0] is not None:
                    value = value.astype(done[0][0].dtype)
                done[i] = (value, Meta(shape))
        filled = cast(list[Evaluated], done)  # the loop above gave every constant its value
        metas = [d[1] for d in filled]
        out_meta = infer(term.op, p, metas)[term.out]
        value = compute(term.op, p, [d[0] for d in filled], metas, mode)[term.out]
        result = (value, out_meta)
    memo[term] = result
    return result


def to_z3(term: Term, tensors: Mapping[str, Z3Expr], params: Mapping[str, Z3Expr],
          memo: dict[Term, Z3Expr] | None = None) -> Z3Expr:
    """The z3 expression of ``term`` (``tensors``/``params`` map variable names to z3 terms)."""
    memo = {} if memo is None else memo
    if term in memo:
        return memo[term]
    if term.op == "var":
        result = tensors[term.name]
    else:
        ps = [param_value(v, params) for _, v in term.params]
        result = z3_apply(term.op, ps, [to_z3(a, tensors, params, memo) for a in term.args],
                          term.out)
    memo[term] = result
    return result
