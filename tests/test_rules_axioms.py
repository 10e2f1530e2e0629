"""Axioms: each holds numerically on concrete tensors, wrong ones are caught, z3 finds the
redundant ones."""

import pytest

from paragraph.rules.axioms import (
    Axiom,
    _concat_cases,
    _conv,
    _conv_cases,
    _same_shape,
    all_axioms,
    by_name,
    redundant,
    validate,
)
from paragraph.rules.specs import NONE, RELU, SAME, VALID, app, var

x, y, z = var("x"), var("y"), var("z")


def test_table_2_2_is_complete():
    names = [a.name for a in all_axioms() if a.table]
    assert names == [str(i) for i in range(1, 44)]


@pytest.mark.parametrize("axiom", all_axioms(), ids=lambda a: a.name)
def test_axiom_holds_on_concrete_tensors(axiom):
    assert validate(axiom) == []


WRONG = [
    # TASO's axiom 39 as printed (any groups): false for grouped convolutions
    Axiom("39-any-groups", app("concat", _conv(x, y), _conv(x, z), axis=-3),
          _conv(x, app("concat", y, z, axis=-4)), "concat and conv for every groups",
          tuple({**c, "z": (2,) + c["y"][1:]} for c in _conv_cases("y"))),
    # "conv is linear for all activation modes" (the thesis's own example of a wrong axiom)
    Axiom("19-relu", _conv(x, app("ewadd", y, z), c=RELU),
          app("ewadd", _conv(x, y, c=RELU), _conv(x, z, c=RELU)), "linear with relu",
          _conv_cases("yz", acts=(RELU,))),
    # enlarging the kernel changes a VALID convolution
    Axiom("21-valid", _conv(x, y, pad=VALID),
          _conv(x, app("enlarge", y, kh=3, kw=3), pad=VALID), "enlarge with VALID padding",
          tuple(c for c in _conv_cases(ks=((1, 1),)) if c["p"] == VALID)),
    # 16 with the operands of the transposed product in the wrong order
    Axiom("16-order", app("transpose", app("matmul", x, y)),
          app("matmul", app("transpose", x), app("transpose", y)), "(xy)^T = x^T y^T",
          ({"x": (3, 3), "y": (3, 3)}, {"x": (2, 4, 4), "y": (2, 4, 4)})),
    # pc for any kernel: a 3 x 3 convolution does not commute with a padded pool (borders)
    Axiom("pc-3x3", _conv(app("pool_avg", x, kh=3, kw=3, stride=1, pad=SAME), y, c=NONE, g=1,
                          pad=VALID, stride=1),
          app("pool_avg", _conv(x, y, c=NONE, g=1, pad=VALID, stride=1), kh=3, kw=3, stride=1,
              pad=SAME), "a convolution commutes with an average pool",
          ({"x": (2, 4, 6, 5), "y": (3, 4, 3, 3)},)),
    # relu does not commute with scaling by a (possibly negative) scalar
    Axiom("relu-smul", app("relu", app("smul", x, var("s"))),
          app("smul", app("relu", x), var("s")), "relu(sx) = s relu(x)",
          tuple({**c, "s": ()} for c in _same_shape("x"))),
]


@pytest.mark.parametrize("axiom", WRONG, ids=lambda a: a.name)
def test_wrong_axiom_is_caught(axiom):
    failures = validate(axiom)
    assert failures and "differ" in failures[0]


def test_a_case_that_does_not_apply_is_a_failure():
    bad = Axiom("misfit", app("ewadd", x, y), app("ewadd", y, x), "shapes that do not fit",
                ({"x": (2, 3), "y": (3, 2)},))
    assert "does not apply" in validate(bad)[0]
    assert validate(Axiom("empty", x, x, "no cases")) == ["axiom empty has no validation cases"]


def test_redundancy_check_finds_an_entailed_axiom():
    # ewadd(x, ewadd(y, z)) = ewadd(z, ewadd(x, y)) follows from associativity + commutativity
    derived = Axiom("derived", app("ewadd", x, app("ewadd", y, z)),
                    app("ewadd", z, app("ewadd", x, y)), "rotation", _same_shape("xyz"))
    verdict = redundant(by_name(["1", "2", "9"]) + [derived], timeout_ms=3000)
    assert verdict["derived"] == "redundant"
    assert verdict["9"] != "redundant"  # transpose involution does not follow from 1 and 2


def test_concat_cases_cover_every_axis():
    axes = {c["a"] for c in _concat_cases("x", "y", (-1, -2, -3))}
    assert axes == {-1, -2, -3}
    assert SAME != VALID and NONE != RELU
