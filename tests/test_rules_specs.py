"""Rule-language operators: numpy references agree with the graph operators they lower to."""

import numpy as np
import pytest

from paragraph import GraphBuilder
from paragraph.interpret import run_graph
from paragraph.rules.match import lower
from paragraph.rules.specs import (
    NONE,
    RELU,
    SAME,
    VALID,
    Meta,
    ShapeError,
    app,
    compute,
    constant_shape,
    constant_value,
    evaluate,
    infer,
    split_point,
    var,
)

RNG = np.random.default_rng(0)


def lowered(op, params, shapes):
    """Run the graph lowering of one rule op on random inputs; return (inputs, outputs)."""
    metas = [Meta(s) for s in shapes]
    b = GraphBuilder()
    refs = [b.input(s) for s in shapes]
    node = None
    for kind, attrs in lower(op, params, metas):
        node = b.op(kind, refs if node is None else [node.out], attrs)
    outs = [type(node.out)(node.id, i) for i in range(len(node.outputs))]
    graph = b.build(outs)
    xs = [RNG.standard_normal(s).astype("float32") for s in shapes]
    return xs, run_graph(graph, xs)


CASES = [
    ("conv2d", {"stride": 1, "pad": SAME, "act": NONE, "groups": 1}, [(2, 4, 6, 5), (3, 4, 3, 3)]),
    ("conv2d", {"stride": 2, "pad": SAME, "act": RELU, "groups": 2}, [(1, 4, 7, 6), (6, 2, 1, 3)]),
    ("conv2d", {"stride": 2, "pad": VALID, "act": NONE, "groups": 4}, [(1, 4, 7, 6), (4, 1, 3, 3)]),
    ("pool_avg", {"kh": 3, "kw": 3, "stride": 1, "pad": SAME}, [(1, 3, 6, 5)]),
    ("pool_avg", {"kh": 3, "kw": 1, "stride": 2, "pad": VALID}, [(1, 3, 6, 5)]),
    ("pool_max", {"kh": 3, "kw": 3, "stride": 2, "pad": SAME}, [(2, 3, 7, 5)]),
    ("matmul", {}, [(3, 4), (4, 5)]),
    ("matmul", {}, [(2, 3, 4), (2, 4, 5)]),
    ("transpose", {}, [(3, 4)]),
    ("transpose", {}, [(2, 3, 4)]),
    ("ewadd", {}, [(2, 3), (2, 3)]),
    ("ewmul", {}, [(2, 3, 4), (2, 3, 4)]),
    ("ewsub", {}, [(2, 3), (2, 3)]),
    ("smul", {}, [(2, 3), ()]),
    ("relu", {}, [(2, 5)]),
    ("sigmoid", {}, [(2, 5)]),
    ("tanh", {}, [(2, 5)]),
    ("gelu", {}, [(2, 5)]),
    ("concat", {"axis": -3}, [(2, 3, 4, 4), (2, 5, 4, 4)]),
    ("concat", {"axis": -1}, [(3, 4), (3, 2)]),
    ("enlarge", {"kh": 5, "kw": 3}, [(2, 3, 1, 3)]),
]


@pytest.mark.parametrize("op,params,shapes", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_reference_matches_graph_lowering(op, params, shapes):
    xs, got = lowered(op, params, shapes)
    metas = [Meta(s) for s in shapes]
    want = compute(op, params, [x.astype(np.float64) for x in xs], metas)
    assert [m.shape for m in infer(op, params, metas)] == [w.shape for w in want]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_split_undoes_the_concat_recorded_in_the_split_tree():
    x, y = RNG.standard_normal((2, 3)), RNG.standard_normal((2, 5))
    cat = evaluate(app("concat", var("x"), var("y"), axis=-1), {"x": x, "y": y}, {})
    assert split_point(cat[1], -1) == 3
    for out, want in ((0, x), (1, y)):
        term = app("split", app("concat", var("x"), var("y"), axis=-1), axis=-1, out=out)
        np.testing.assert_array_equal(evaluate(term, {"x": x, "y": y}, {})[0], want)
    # the lowering cuts at the point of the split tree
    kind, attrs = lower("split", {"axis": -1}, [cat[1]])[0]
    assert kind == "split" and attrs["indices_or_sections"] == (3,) and attrs["axis"] == 1
    with pytest.raises(ShapeError):  # a tensor no concat made has no split point
        infer("split", {"axis": -1}, [Meta((2, 8))])


def test_shape_errors():
    with pytest.raises(ShapeError):
        infer("ewadd", {}, [Meta((2, 3)), Meta((3, 2))])
    with pytest.raises(ShapeError):  # groups must divide the channels as the kernel says
        infer("conv2d", {"stride": 1, "pad": SAME, "act": NONE, "groups": 2},
              [Meta((1, 4, 5, 5)), Meta((4, 4, 3, 3))])
    with pytest.raises(ShapeError):  # SAME padding needs odd kernels
        infer("conv2d", {"stride": 1, "pad": SAME, "act": NONE, "groups": 1},
              [Meta((1, 4, 5, 5)), Meta((4, 4, 2, 2))])
    with pytest.raises(ShapeError):
        infer("smul", {}, [Meta((2, 3)), Meta((2, 3))])


def test_constants_take_their_shape_from_their_use():
    x = Meta((2, 3, 5, 5))
    conv = {"stride": 1, "pad": SAME, "act": NONE, "groups": 3}
    assert constant_shape("c_pool", {"kh": 3, "kw": 3}, "conv2d", conv, 1, [x, None]) == (3, 1,
                                                                                          3, 3)
    assert constant_shape("i_matmul", {}, "matmul", {}, 1, [Meta((4, 6)), None]) == (6, 6)
    assert constant_shape("ones", {}, "ewmul", {}, 0, [None, Meta((2, 2))]) == (2, 2)
    np.testing.assert_array_equal(constant_value("i_matmul", (3, 3)), np.eye(3))
    ident = constant_value("i_conv", (2, 2, 3, 3))
    assert ident[0, 0, 1, 1] == 1 and ident.sum() == 2
    with pytest.raises(ShapeError):
        constant_shape("ones", {}, "concat", {"axis": -1}, 0, [None, Meta((2, 2))])


def test_int_mode_models_nonlinear_functions_as_polynomials():
    x = np.arange(-3, 4, dtype=np.int64)
    relu = compute("relu", {}, [x], [Meta(x.shape)], "int")[0]
    np.testing.assert_array_equal(relu, x * (x + 1) + 1)
    sig = compute("sigmoid", {}, [x], [Meta(x.shape)], "int")[0]
    assert not np.array_equal(relu, sig)
    pool = compute("pool_avg", {"kh": 3, "kw": 3, "stride": 1, "pad": SAME},
                   [np.ones((1, 1, 3, 3), np.int64)], [Meta((1, 1, 3, 3))], "int")[0]
    assert pool[0, 0, 1, 1] == 9  # sums: C_pool is all ones in the integer model


def test_terms_print_and_convert_to_z3():
    import z3

    from paragraph.rules.specs import to_z3, z3_sorts

    t = app("matmul", var("a"), app("transpose", var("b")))
    assert repr(t) == "matmul(a, transpose(b))"
    tensor, _ = z3_sorts()
    a, b = z3.Consts("a b", tensor)
    e = to_z3(t, {"a": a, "b": b}, {})
    assert str(e) == "matmul(a, transpose(b))"
    with pytest.raises(ValueError):
        app("concat", var("a"), var("b"))  # missing the axis parameter
