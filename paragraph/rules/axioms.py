"""Operator properties (TASO table 2.2) as z3 formulas, validated on concrete tensors.

Each `Axiom` is an equation ``lhs = rhs`` between rule-language terms, universally quantified
over its tensor and parameter variables, with optional hypotheses on the parameters and a list
of concrete cases (shapes and parameter values) on which `validate` checks it numerically with
the numpy references, in float64 (TASO section 2.4 validates by symbolic execution on tensors up
to 4x4x4x4; random concrete tensors catch the same wrong axioms, e.g. "conv is linear for every
activation"). `redundant` reports axioms the others entail (TASO section 2.4).

Axioms 1-43 are table 2.2 with two corrections and one generalisation found by validation:

* 39 and 40 (concat and conv along channels) are false for grouped convolutions (the groups
  re-partition the channels); they hold with ``groups = 1`` only and are stated so.
* 30 (geometry of concat) is stated for any two distinct axes, not only rows and columns.

The extensions after them (``g1``, ``e*``, ``pc``, ``sub``, ``z*``) are marked ``table=False``:
grouped convolution split into two halves, the opaque element-wise functions (sigmoid, tanh,
gelu) commuting with concat and transpose as relu does, a 1 x 1 convolution commuting with an
average pool, subtraction, and zero kernels. The parametric rules (regrouping, pools after
their 1 x 1 convolutions, SRU) need them.

Shapes are not modelled (TASO section 2.4) except where an axiom needs them: a hypothesis may
compare dimensions, ``("dim", "x1", -3)`` (the size of tensor ``x1`` along axis -3; z3's
``dim(T, Int) -> Int``, with `dim_facts` saying what a concat does to it). ``g1`` needs equal
halves: without that hypothesis z3 "proved" rules that are false when the two halves of a
grouped convolution differ. `validate` therefore also draws shapes that break the cases'
equalities: where both sides apply and the hypotheses hold they must agree, and every
hypothesis on dimensions must be needed (some broken case differs).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, cast

import numpy as np
import z3

from paragraph.rules.specs import (
    NONE,
    RELU,
    SAME,
    VALID,
    ShapeError,
    Term,
    Z3Expr,
    app,
    evaluate,
    param_value,
    term_vars,
    to_z3,
    var,
    z3_dim,
    z3_function,
    z3_sorts,
)

x, y, z, w = var("x"), var("y"), var("z"), var("w")
x1, x2, w1, w2 = var("x1"), var("x2"), var("w1"), var("w2")
s = var("s")  # a scalar tensor (smul's second operand)

# a parameter condition (op, expr, expr): op "ne", "eq" or "ge"; each expr an int, a parameter
# variable, an expression such as ("%", "g", 2), or a tensor's size ("dim", "x1", -3)
Hypothesis = tuple[str, Any, Any]
Case = dict[str, Any]  # a validation case: tensor name -> shape, parameter name -> value


@dataclass(frozen=True)
class Axiom:
    """``lhs = rhs`` for all variables, under ``hypotheses`` (z3-style parameter conditions)."""

    name: str
    lhs: Term
    rhs: Term
    comment: str
    cases: tuple[Case, ...] = ()
    hypotheses: tuple[Hypothesis, ...] = ()
    table: bool = True  # from TASO table 2.2 (False: an extension of paragraph)
    extra: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def formula(self) -> Z3Expr:
        """The z3 formula ``ForAll vars. hypotheses -> lhs == rhs``."""
        tensor_sort, _ = z3_sorts()
        tv, pv = term_vars(self.lhs)
        term_vars(self.rhs, tv, pv)
        tensors = {n: z3.Const(f"ax_{n}", tensor_sort) for n in sorted(tv)}
        params = {n: z3.Int(f"ax_{n}") for n in sorted(pv)}
        lhs, rhs = to_z3(self.lhs, tensors, params), to_z3(self.rhs, tensors, params)
        body = lhs == rhs
        hyps = [hypothesis_z3(h, params, tensors) for h in self.hypotheses]
        if hyps:
            body = z3.Implies(z3.And(*hyps), body)
        bound = list(tensors.values()) + list(params.values())
        if not bound:
            return body
        # either side triggers an instance (z3's own choice of trigger is often one side
        # only, and then a rewrite in the other direction is never found)
        names = {str(v) for v in bound}
        triggers = [t for t in (lhs, rhs) if not z3.is_const(t)
                    and names <= {str(c) for c in _consts(t)}]
        return z3.ForAll(bound, body, patterns=triggers) if triggers else z3.ForAll(bound,
                                                                                     body)


def _consts(t: Z3Expr) -> list[Z3Expr]:
    out: list[Z3Expr] = []
    stack = [t]
    while stack:
        e = stack.pop()
        if z3.is_const(e) and e.decl().kind() == z3.Z3_OP_UNINTERPRETED:
            out.append(e)
        stack.extend(e.children())
    return out


DimFn = Callable[[str, int], Any]  # (tensor name, axis) -> its size (an int or a z3 term)


def hypothesis_z3(h: Hypothesis, params: Mapping[str, Z3Expr],
                  tensors: Mapping[str, Z3Expr] | None = None) -> Z3Expr:
    """A condition ``(op, expr, expr)`` (op ne, eq or ge) as a z3 boolean; ``tensors`` gives
    the z3 terms of the tensors its ``("dim", name, axis)`` expressions name."""
    dim = z3_dim()
    env = tensors or {}
    return _compare(h, params, lambda n, a: dim(env[n], z3.IntVal(a)))


def dims_of(h: Hypothesis) -> list[tuple[str, int]]:
    """The ``(tensor, axis)`` sizes a condition compares (empty for a parameter condition)."""
    return [(e[1], e[2]) for e in h[1:] if isinstance(e, tuple) and e and e[0] == "dim"]


def _compare(h: Hypothesis, params: Mapping[str, Any], dim: DimFn | None = None) -> Any:
    op, a, b = h

    def value(e: Any) -> Any:
        if isinstance(e, tuple) and e and e[0] == "dim":
            if dim is None:
                raise KeyError(f"{e}: no shapes to read a dimension from")
            return dim(e[1], e[2])
        return param_value(e, params)

    left, right = value(a), value(b)
    return {"ne": lambda: left != right, "eq": lambda: left == right,
            "ge": lambda: left >= right}[op]()


def _hyp_holds(h: Hypothesis, params: Mapping[str, Any],
               shapes: Mapping[str, tuple[int, ...]] | None = None) -> bool:
    """Whether condition ``h`` holds for these parameter values (and tensor shapes)."""
    sizes = shapes or {}

    def dim(n: str, a: int) -> int:
        shape = sizes[n]
        if not -len(shape) <= a < 0:
            raise KeyError(f"{n} of rank {len(shape)} has no axis {a}")
        return shape[a]

    return bool(_compare(h, params, dim))


@cache
def dim_facts() -> tuple[tuple[str, Z3Expr], ...]:
    """What z3 knows about sizes, as named formulas: a concat adds its operands' sizes along
    its axis and keeps the first operand's along the others; element-wise operators keep
    their first operand's sizes (enough for ``g1``'s halves built from concatenations and
    zeroed blocks, the only sizes a proof has needed)."""
    tensor, _ = z3_sorts()
    dim, cat = z3_dim(), z3_function("concat")
    a, i = z3.Int("dim_a"), z3.Int("dim_i")
    u, v = z3.Const("dim_u", tensor), z3.Const("dim_v", tensor)
    along = dim(cat(a, u, v), a)
    across = dim(cat(a, u, v), i)
    facts = [("dim-concat", z3.ForAll([a, u, v], along == dim(u, a) + dim(v, a),
                                      patterns=[along])),
             ("dim-concat-across", z3.ForAll([a, i, u, v], z3.Implies(
                 i != a, across == dim(u, i)), patterns=[across]))]
    for op in ("ewadd", "ewmul", "ewsub"):
        f = dim(z3_function(op)(u, v), i)
        facts.append((f"dim-{op}", z3.ForAll([u, v, i], f == dim(u, i), patterns=[f])))
    for op in ("relu", "sigmoid", "tanh", "gelu"):
        f = dim(z3_function(op)(u), i)
        facts.append((f"dim-{op}", z3.ForAll([u, i], f == dim(u, i), patterns=[f])))
    return tuple(facts)


# ---------------------------------------------------------------------------- cases
def _grid(**choices: Sequence[Any]) -> list[Case]:
    keys = list(choices)
    return [dict(zip(keys, vals, strict=True))
            for vals in itertools.product(*(choices[k] for k in keys))]


def _same_shape(names: str, shapes: Sequence[tuple[int, ...]] = ((3, 4), (2, 3, 4), (2, 3, 4, 5))
                ) -> tuple[Case, ...]:
    return tuple({n: sh for n in names} for sh in shapes)


def _with_scalar(cases: Sequence[Case], *names: str) -> tuple[Case, ...]:
    return tuple({**c, **{n: () for n in names}} for c in cases)


def _concat_cases(names_a: str, names_b: str,
                  axis_choices: Sequence[int] = (-1, -2, -3)) -> tuple[Case, ...]:
    """Shapes where tensors in ``names_a`` and in ``names_b`` differ along the axis ``a``."""
    out = []
    for a in axis_choices:
        for base in ((3, 4, 5), (2, 3, 4, 5)):
            if -a > len(base):
                continue
            sa, sb = list(base), list(base)
            sb[a] = base[a] + 2
            out.append({"a": a, **{n: tuple(sa) for n in names_a},
                        **{n: tuple(sb) for n in names_b}})
    return tuple(out)


_CONV_P = dict(s=(1, 2), p=(SAME, VALID))


def _conv_cases(kernel_names: str = "y", data: str = "x", groups: Sequence[int] = (1, 2),
                acts: Sequence[int] = (NONE, RELU),
                ks: Sequence[tuple[int, int]] = ((3, 3), (1, 3)), out_ch: int = 4, in_ch: int = 4,
                extra: Case | None = None) -> tuple[Case, ...]:
    out = []
    for c in _grid(**_CONV_P, c=acts, g=groups, k=ks):
        kh, kw = c.pop("k")
        if c["p"] == SAME and (kh % 2 == 0 or kw % 2 == 0):
            continue
        case = {**c, data: (2, in_ch, 6, 5)}
        for n in kernel_names:
            case[n] = (out_ch, in_ch // c["g"], kh, kw)
        out.append({**case, **(extra or {})})
    return tuple(out)


def _pool_cases(extra_axis: int, names: str = "xy") -> tuple[Case, ...]:
    out = []
    for c in _grid(kh=(3, 1), kw=(3,), s=(1, 2), p=(SAME, VALID)):
        other = [2, 3, 6, 5]
        other[extra_axis] += 1
        out.append({**c, names[0]: (2, 3, 6, 5), names[1]: tuple(other)})
    return tuple(out)


# ---------------------------------------------------------------------------- the axioms
def _conv(xx: Term, yy: Term, c: Any = "c", g: Any = "g", pad: Any = "p",
          stride: Any = "s") -> Term:
    return app("conv2d", xx, yy, stride=stride, pad=pad, act=c, groups=g)


def _pool(kind: str, xx: Term) -> Term:
    return app(kind, xx, kh="kh", kw="kw", stride="s", pad="p")


def _cat(a: Any, u: Term, v: Term) -> Term:
    return app("concat", u, v, axis=a)


def _build() -> list[Axiom]:
    ew = _same_shape("xyz")
    ax: list[Axiom] = []

    def add(name: str, lhs: Term, rhs: Term, comment: str, cases: Iterable[Case],
            **kw: Any) -> None:
        ax.append(Axiom(name, lhs, rhs, comment, tuple(cases), **kw))

    add("1", app("ewadd", x, app("ewadd", y, z)), app("ewadd", app("ewadd", x, y), z),
        "ewadd is associative", ew)
    add("2", app("ewadd", x, y), app("ewadd", y, x), "ewadd is commutative", ew)
    add("3", app("ewmul", x, app("ewmul", y, z)), app("ewmul", app("ewmul", x, y), z),
        "ewmul is associative", ew)
    add("4", app("ewmul", x, y), app("ewmul", y, x), "ewmul is commutative", ew)
    add("5", app("ewmul", app("ewadd", x, y), z),
        app("ewadd", app("ewmul", x, z), app("ewmul", y, z)), "distributivity", ew)
    add("6", app("smul", app("smul", x, y), w), app("smul", x, app("smul", y, w)),
        "smul is associative", _with_scalar(_same_shape("x"), "y", "w"))
    add("7", app("smul", app("ewadd", x, y), w), app("ewadd", app("smul", x, w),
                                                     app("smul", y, w)),
        "distributivity", _with_scalar(_same_shape("xy"), "w"))
    add("8", app("smul", app("ewmul", x, y), w), app("ewmul", x, app("smul", y, w)),
        "operator commutativity", _with_scalar(_same_shape("xy"), "w"))
    mats = _same_shape("xy", ((3, 4), (2, 3, 4)))
    add("9", app("transpose", app("transpose", x)), x, "transpose is its own inverse", mats)
    add("10", app("transpose", app("ewadd", x, y)),
        app("ewadd", app("transpose", x), app("transpose", y)), "operator commutativity", mats)
    add("11", app("transpose", app("ewmul", x, y)),
        app("ewmul", app("transpose", x), app("transpose", y)), "operator commutativity", mats)
    add("12", app("smul", app("transpose", x), w), app("transpose", app("smul", x, w)),
        "operator commutativity", _with_scalar(mats, "w"))
    chain = ({"x": (3, 4), "y": (4, 5), "z": (5, 2)}, {"x": (2, 3, 4), "y": (2, 4, 5),
                                                      "z": (2, 5, 2)})
    add("13", app("matmul", x, app("matmul", y, z)), app("matmul", app("matmul", x, y), z),
        "matmul is associative", chain)
    add("14", app("smul", app("matmul", x, y), w), app("matmul", x, app("smul", y, w)),
        "matmul is linear", _with_scalar(chain, "w"))
    lin = ({"x": (3, 4), "y": (4, 5), "z": (4, 5)}, {"x": (2, 3, 4), "y": (2, 4, 5),
                                                    "z": (2, 4, 5)})
    add("15", app("matmul", x, app("ewadd", y, z)),
        app("ewadd", app("matmul", x, y), app("matmul", x, z)), "matmul is linear", lin)
    add("16", app("transpose", app("matmul", x, y)),
        app("matmul", app("transpose", y), app("transpose", x)), "matmul and transpose", chain)
    add("17", _conv(app("smul", x, w), y), _conv(x, app("smul", y, w)), "conv is bilinear",
        _conv_cases(extra={"w": ()}))
    add("18", app("smul", _conv(x, y, c=NONE), w), _conv(app("smul", x, w), y, c=NONE),
        "conv is bilinear", _conv_cases(acts=(NONE,), extra={"w": ()}))
    add("19", _conv(x, app("ewadd", y, z), c=NONE),
        app("ewadd", _conv(x, y, c=NONE), _conv(x, z, c=NONE)), "conv is bilinear",
        _conv_cases("yz", acts=(NONE,)))
    add("20", _conv(app("ewadd", x, y), z, c=NONE),
        app("ewadd", _conv(x, z, c=NONE), _conv(y, z, c=NONE)), "conv is bilinear",
        tuple({**c, "y": c["x"]} for c in _conv_cases("z", acts=(NONE,))))
    add("21", _conv(x, y, pad=SAME), _conv(x, app("enlarge", y, kh="kh", kw="kw"), pad=SAME),
        "enlarging the kernel (SAME padding only)",
        tuple({**c, "kh": kh, "kw": kw} for c in _conv_cases(ks=((1, 1), (1, 3), (3, 3)))
              if c["p"] == SAME for kh, kw in ((3, 3), (5, 5)) if kw >= c["y"][3]))
    add("22", _conv(x, y, c=RELU), app("relu", _conv(x, y, c=NONE)),
        "conv with RELU applies relu", _conv_cases(acts=(RELU,)))
    add("23", app("relu", app("transpose", x)), app("transpose", app("relu", x)),
        "operator commutativity", mats)
    add("24", _conv(x, app("c_pool", kh="kh", kw="kw"), c=NONE), _pool("pool_avg", x),
        "pooling by conv with C_pool",
        tuple({**c, "g": 3, "x": (2, 3, 6, 5)} for c in _grid(kh=(3, 1), kw=(3,), s=(1, 2),
                                                              p=(SAME, VALID))))
    add("25", _conv(x, app("i_conv", kh="kh", kw="kw"), c=NONE, g=1, pad=SAME, stride=1), x,
        "identity kernel", tuple({"x": (2, 3, 5, 4), "kh": k, "kw": k} for k in (1, 3, 5)))
    add("26", app("matmul", x, app("i_matmul")), x, "identity matrix",
        _same_shape("x", ((3, 4), (2, 3, 4))))
    add("27", app("ewmul", x, app("ones")), x, "ewmul identity", _same_shape("x"))
    add("28", app("split", _cat("a", x, y), axis="a", out=0), x, "split definition",
        _concat_cases("x", "y", (-1, -2, -3, -4)))
    add("29", app("split", _cat("a", x, y), axis="a", out=1), y, "split definition",
        _concat_cases("x", "y", (-1, -2, -3, -4)))
    geo = []
    for a, b in itertools.permutations((-1, -2, -3), 2):
        base = [2, 3, 4, 5]
        sx, sy, sz = list(base), list(base), list(base)
        sy[b] += 1
        sz[a] += 2
        sw = list(sy)
        sw[a] = sz[a]
        geo.append({"a": a, "b": b, "x": tuple(sx), "y": tuple(sy), "z": tuple(sz),
                    "w": tuple(sw)})
    add("30", _cat("a", _cat("b", x, y), _cat("b", z, w)),
        _cat("b", _cat("a", x, z), _cat("a", y, w)), "geometry of concat (any two axes)",
        geo, hypotheses=(("ne", "a", "b"),))
    add("31", _cat("a", app("smul", x, w), app("smul", y, w)), app("smul", _cat("a", x, y), w),
        "operator commutativity", _with_scalar(_concat_cases("x", "y"), "w"))
    add("32", _cat("a", app("ewadd", x, y), app("ewadd", z, w)),
        app("ewadd", _cat("a", x, z), _cat("a", y, w)), "operator commutativity",
        _concat_cases("xy", "zw"))
    add("33", _cat("a", app("ewmul", x, y), app("ewmul", z, w)),
        app("ewmul", _cat("a", x, z), _cat("a", y, w)), "operator commutativity",
        _concat_cases("xy", "zw"))
    add("34", _cat("a", app("relu", x), app("relu", y)), app("relu", _cat("a", x, y)),
        "operator commutativity", _concat_cases("x", "y"))
    add("35", _cat(-1, app("transpose", x), app("transpose", y)),
        app("transpose", _cat(-2, x, y)), "concat and transpose",
        ({"x": (3, 4), "y": (5, 4)}, {"x": (2, 3, 4), "y": (2, 5, 4)}))
    add("36", _cat(-1, app("matmul", x, y), app("matmul", x, z)),
        app("matmul", x, _cat(-1, y, z)), "concat and matmul",
        ({"x": (3, 4), "y": (4, 5), "z": (4, 2)}, {"x": (2, 3, 4), "y": (2, 4, 5),
                                                  "z": (2, 4, 2)}))
    add("37", app("matmul", _cat(-1, x, z), _cat(-2, y, w)),
        app("ewadd", app("matmul", x, y), app("matmul", z, w)), "concat and matmul",
        ({"x": (3, 4), "y": (4, 5), "z": (3, 2), "w": (2, 5)},
         {"x": (2, 3, 4), "y": (2, 4, 5), "z": (2, 3, 2), "w": (2, 2, 5)}))
    add("38", _cat(-4, _conv(x, z), _conv(y, z)), _conv(_cat(-4, x, y), z),
        "concat and conv (batch)",
        tuple({**c, "y": (3,) + c["x"][1:]} for c in _conv_cases("z")))
    add("39", _cat(-3, _conv(x, y, g=1), _conv(x, z, g=1)), _conv(x, _cat(-4, y, z), g=1),
        "concat and conv (output channels), groups = 1 only",
        tuple({**c, "z": (2,) + c["y"][1:]} for c in _conv_cases("y", groups=(1,))))
    add("40", _conv(_cat(-3, x, z), _cat(-3, y, w), c=NONE, g=1),
        app("ewadd", _conv(x, y, c=NONE, g=1), _conv(z, w, c=NONE, g=1)),
        "concat and conv (input channels), groups = 1 only",
        tuple({**c, "z": (2, 3) + c["x"][2:], "w": c["y"][:1] + (3,) + c["y"][2:]}
              for c in _conv_cases("y", groups=(1,), acts=(NONE,))))
    add("41", _cat(-3, _pool("pool_avg", x), _pool("pool_avg", y)),
        _pool("pool_avg", _cat(-3, x, y)), "concat and pooling", _pool_cases(1))
    add("42", _cat(-4, _pool("pool_max", x), _pool("pool_max", y)),
        _pool("pool_max", _cat(-4, x, y)), "concat and pooling", _pool_cases(0))
    add("43", _cat(-3, _pool("pool_max", x), _pool("pool_max", y)),
        _pool("pool_max", _cat(-3, x, y)), "concat and pooling", _pool_cases(1))

    # ------------------------------------------------------------------ extensions
    # equal output channels; equal input channels follow from both sides type-checking
    halves = (("eq", ("dim", "w1", -4), ("dim", "w2", -4)),)
    add("g1", _conv(_cat(-3, x1, x2), _cat(-4, w1, w2)),
        _cat(-3, _conv(x1, w1, g=("//", "g", 2)), _conv(x2, w2, g=("//", "g", 2))),
        "a grouped conv with an even number of groups is two convs on equal halves",
        tuple({**{k: v for k, v in c.items() if k not in ("g", "x", "y")}, "g": 2 * c["g"],
               "x1": c["x"], "x2": c["x"], "w1": c["y"], "w2": c["y"]}
              for c in _conv_cases(groups=(1, 2))),
        hypotheses=(("eq", ("%", "g", 2), 0), ("ge", "g", 2), *halves), table=False)
    add("14l", app("matmul", app("smul", x, w), y), app("smul", app("matmul", x, y), w),
        "matmul is linear in its left operand (14 with 9, 12, 16)", _with_scalar(chain, "w"),
        table=False)
    add("cs", _conv(x, app("chmul", y, w, axis=-4), c=NONE),
        app("chmul", _conv(x, y, c=NONE), w, axis=-3),
        "scaling a kernel's output channels scales the conv's output channels",
        tuple({**c, "w": (4,)} for c in _conv_cases(acts=(NONE,))), table=False)
    add("15r", app("matmul", app("ewadd", x, y), z),
        app("ewadd", app("matmul", x, z), app("matmul", y, z)),
        "matmul is linear in its left operand (TASO's verifier: implied, via transpose)",
        ({"x": (3, 4), "y": (3, 4), "z": (4, 5)}, {"x": (2, 3, 4), "y": (2, 3, 4),
                                                  "z": (2, 4, 5)}), table=False)
    add("35r", _cat(-2, app("transpose", x), app("transpose", y)),
        app("transpose", _cat(-1, x, y)), "concat and transpose, other axis (35 with 9)",
        ({"x": (4, 3), "y": (4, 5)}, {"x": (2, 4, 3), "y": (2, 4, 5)}), table=False)
    add("36r", _cat(-2, app("matmul", x, z), app("matmul", y, z)),
        app("matmul", _cat(-2, x, y), z), "concat of rows and matmul (36 with 9, 16, 35)",
        ({"x": (3, 4), "y": (2, 4), "z": (4, 5)}, {"x": (2, 3, 4), "y": (2, 2, 4),
                                                  "z": (2, 4, 5)}), table=False)
    add("mm-left", app("matmul", app("i_matmul"), x), x, "identity matrix on the left (TASO's "
        "verifier has it as a lemma)", _same_shape("x", ((3, 4), (2, 3, 4))), table=False)
    for f in ("sigmoid", "tanh", "gelu"):
        add(f"e-{f}-concat", _cat("a", app(f, x), app(f, y)), app(f, _cat("a", x, y)),
            f"{f} commutes with concat (as relu, 34)", _concat_cases("x", "y"), table=False)
        add(f"e-{f}-transpose", app(f, app("transpose", x)), app("transpose", app(f, x)),
            f"{f} commutes with transpose (as relu, 23)", mats, table=False)
    one_by_one = (("eq", ("dim", "w", -2), 1), ("eq", ("dim", "w", -1), 1))
    add("pc", _conv(_pool("pool_avg", x), w, c=NONE, g=1, pad=VALID, stride=1),
        _pool("pool_avg", _conv(x, w, c=NONE, g=1, pad=VALID, stride=1)),
        "a 1 x 1 convolution commutes with an average pool that counts its padding: both are "
        "linear, one mixes channels pixel by pixel, the other pixels channel by channel, and "
        "the padding's zeros map to zeros",
        tuple({**c, "x": (2, 4, 6, 5), "w": (3, 4, 1, 1)} for c in _grid(
            kh=(3, 1), kw=(3, 2), s=(1, 2), p=(SAME, VALID)) if c["p"] == VALID
            or c["kh"] % 2 == c["kw"] % 2 == 1),
        hypotheses=one_by_one, table=False)
    add("sub", app("ewsub", x, y), app("ewadd", x, app("smul", y, app("neg_one"))),
        "definition of subtraction", _same_shape("xy"), table=False)
    add("z1", app("ewadd", x, app("ewmul", y, app("zeros"))), x, "x + 0 = x",
        _same_shape("xy"), table=False)
    add("z2", _conv(x, app("ewmul", y, app("zeros")), c=NONE),
        app("ewmul", _conv(x, y, c=NONE), app("zeros")), "conv with a zero kernel is zero",
        _conv_cases(acts=(NONE,)), table=False)
    return ax


@cache
def all_axioms() -> tuple[Axiom, ...]:
    """Every axiom: TASO's table 2.2 (as corrected) followed by paragraph's extensions."""
    return tuple(_build())


def by_name(names: Sequence[str]) -> list[Axiom]:
    """The axioms with these names, in table order."""
    wanted = set(names)
    return [a for a in all_axioms() if a.name in wanted]


# ---------------------------------------------------------------------------- validation
def validate(axiom: Axiom, seed: int = 0, tol: float = 1e-8) -> list[str]:
    """Check ``axiom`` on each of its cases with random float64 tensors; returns failures.

    A case whose shapes do not fit one side is a failure too (a case must exercise the axiom).
    An axiom without cases fails: every axiom must be checked. Each case is also redrawn
    with one tensor's size along one axis changed (shapes drawn to break the cases'
    equalities): where both sides still apply and the hypotheses hold the sides must agree,
    and each hypothesis on sizes must be needed (a broken case that violates it differs).
    """
    if not axiom.cases:
        return [f"axiom {axiom.name} has no validation cases"]
    rng = np.random.default_rng(seed)
    tv, _ = term_vars(axiom.lhs)
    term_vars(axiom.rhs, tv)
    failures = []
    needed = {h: False for h in axiom.hypotheses if dims_of(h)}
    for case in axiom.cases:
        shapes = {n: tuple(case[n]) for n in tv}
        params = {k: v for k, v in case.items() if k not in tv}
        if not all(_hyp_holds(h, params, shapes) for h in axiom.hypotheses):
            failures.append(f"{axiom.name}: case {case} violates the hypotheses")
            continue
        agree = _sides_agree(axiom, shapes, params, rng, tol)
        if isinstance(agree, str):
            failures.append(f"{axiom.name}: case {case} does not apply ({agree})")
        elif not agree:
            failures.append(f"{axiom.name}: case {case}: sides differ")
        for n in sorted(tv):
            for a in range(-len(shapes[n]), 0):
                for delta in (1, 2):
                    broken = {**shapes, n: _grow(shapes[n], a, delta)}
                    verdict = _sides_agree(axiom, broken, params, rng, tol)
                    if isinstance(verdict, str):
                        continue
                    failed = [h for h in axiom.hypotheses
                              if not _hyp_holds(h, params, broken)]
                    if not failed and not verdict:
                        failures.append(f"{axiom.name}: case {case} with {n} of shape "
                                        f"{broken[n]}: the hypotheses hold, the sides differ")
                    if not verdict and len(failed) == 1 and failed[0] in needed:
                        needed[failed[0]] = True
    failures += [f"{axiom.name}: hypothesis {h} is never needed (no broken case violating it "
                 "differs)" for h, shown in needed.items() if not shown]
    return failures


def _grow(shape: tuple[int, ...], axis: int, delta: int) -> tuple[int, ...]:
    out = list(shape)
    out[axis] += delta
    return tuple(out)


def _sides_agree(axiom: Axiom, shapes: Mapping[str, tuple[int, ...]],
                 params: Mapping[str, Any], rng: np.random.Generator,
                 tol: float) -> bool | str:
    """Whether both sides agree on random tensors of these shapes (a string: why a side
    does not apply)."""
    tensors = {n: cast(np.ndarray, rng.standard_normal(sh)) for n, sh in shapes.items()}
    try:
        left, _ = evaluate(axiom.lhs, tensors, params)
        right, _ = evaluate(axiom.rhs, tensors, params)
    except (ShapeError, KeyError) as e:
        return str(e)
    return left.shape == right.shape and bool(np.allclose(left, right, rtol=tol, atol=tol))


def validate_all(axioms: Sequence[Axiom] | None = None) -> dict[str, list[str]]:
    """`validate` every axiom; maps each name to its failures (empty lists when all hold)."""
    return {a.name: validate(a) for a in (all_axioms() if axioms is None else axioms)}


def redundant(axioms: Sequence[Axiom] | None = None, timeout_ms: int = 2000,
              progress: Callable[[Axiom, str, float], object] | None = None) -> dict[str, str]:
    """For each axiom, whether the others entail it: ``"redundant"``, ``"independent"``
    (z3 found a countermodel) or ``"unknown"`` (timeout; z3 searches for ever otherwise).

    TASO section 2.4: an entailed axiom is redundant, and a surprising entailment often reveals
    a wrong axiom.
    """
    axioms = list(all_axioms() if axioms is None else axioms)
    formulas = [a.formula() for a in axioms]
    result = {}
    for i, a in enumerate(axioms):
        start = time.perf_counter()
        solver = z3.Solver()
        solver.set("timeout", timeout_ms)
        solver.set("rlimit", timeout_ms * 2000)  # z3's timeout slips; its rlimit does not
        solver.add(*[f for j, f in enumerate(formulas) if j != i])
        solver.add(z3.Not(formulas[i]))
        answer = solver.check()
        result[a.name] = ("redundant" if answer == z3.unsat else "independent"
                          if answer == z3.sat else "unknown")
        if progress:
            progress(a, result[a.name], time.perf_counter() - start)
    return result
