"""Parametric rules: z3 proofs of the general schemas, randomised numeric checks, and
behaviour on small graphs built for each."""

import numpy as np
import pytest

from paragraph import GraphBuilder
from paragraph.interpret import run_graph
from paragraph.rules.parametric import (
    AvgPoolPair,
    MergeConvs,
    MergeMatmulRows,
    PoolAfterConv,
    Regroup,
    SplitConvConcat,
    all_parametric,
    block_diagonal,
    check_numeric,
    prove,
)
from paragraph.rules.specs import Meta as M
from paragraph.rules.specs import compute

RULES = all_parametric()


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_schema_is_proved_by_z3(rule):
    proof = prove(rule)
    assert proof["status"] == "verified", proof["obligations"]
    assert proof["axioms"]


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_random_instances_are_equal(rule):
    checked = sum(check_numeric(rule, seed) for seed in range(6))
    assert checked >= 6


def test_block_diagonal_kernel_is_a_regrouping():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 8, 5, 5))
    k = rng.standard_normal((8, 1, 3, 3))
    conv = {"stride": 1, "pad": 0, "act": 0}
    want = compute("conv2d", {**conv, "groups": 8}, [x, k], [M(x.shape), M(k.shape)])[0]
    for factor in (2, 4, 8):
        bd = block_diagonal(k, 8, factor)
        got = compute("conv2d", {**conv, "groups": 8 // factor}, [x, bd],
                      [M(x.shape), M(bd.shape)])[0]
        np.testing.assert_allclose(got, want, atol=1e-9)


def test_merge_convs_needs_a_shared_input_and_stride():
    rng = np.random.default_rng(2)
    b = GraphBuilder()
    x, y = b.input((1, 2, 6, 6)), b.input((1, 2, 6, 6))
    k = b.weight(rng.standard_normal((3, 2, 3, 3)).astype("f4"))
    c1 = b.op("conv2d", [x, k], {"padding": 1})
    c2 = b.op("conv2d", [y, k], {"padding": 1})  # another input
    c3 = b.op("conv2d", [x, k], {"padding": 1, "strides": 2})  # another stride
    g = b.build([c1.out, c2.out, c3.out])
    assert MergeConvs("m", "m", "", "merge_convs").find(g) == []


def test_merge_convs_of_three_kernel_sizes_is_one_conv():
    rng = np.random.default_rng(3)
    b = GraphBuilder()
    x = b.input((1, 3, 7, 7))
    outs = []
    for kh, kw in ((1, 1), (3, 3), (1, 5)):
        k = b.weight(rng.standard_normal((2, 3, kh, kw)).astype("f4"))
        outs.append(b.op("conv2d", [x, k], {"padding": (kh // 2, kw // 2)}).out)
    g = b.build(outs)
    rule = MergeConvs("m", "m", "", "merge_convs")
    full = [m for m in rule.find(g) if len(m.nodes) == 3]
    new = rule.rewrite(g, full[0])
    assert [n.kind for n in new.operators] == ["conv2d"] + ["strided_slice"] * 3
    assert new.operators[0].attrs["padding"] == (1, 2, 1, 2)
    xs = [rng.standard_normal((1, 3, 7, 7)).astype("f4")]
    for a, c in zip(run_graph(g, xs), run_graph(new, xs), strict=True):
        np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-4)


def _conv_chains(b, x, rng, chains, sizes=((1, 1), (3, 3))):
    """Convolutions of ``x`` (SAME), each followed by the chain of operator kinds given."""
    outs, convs = [], []
    for (kh, kw), chain in zip(sizes, chains, strict=True):
        k = b.weight(rng.standard_normal((2, 3, kh, kw)).astype("f4"))
        y = b.op("conv2d", [x, k], {"padding": (kh // 2, kw // 2)})
        convs.append(y.id)
        y = y.out
        for kind in chain:
            if kind == "relu":
                y = b.op("relu", [y]).out
            else:
                y = b.op(kind, [y, b.weight(rng.uniform(0.5, 2, (1, 2, 1, 1)).astype("f4"))]).out
        outs.append(y)
    return outs, convs


def test_merge_convs_carries_equal_chains_and_not_unequal_ones():
    """IOS merges fused kernels: convolutions with their bias, scale and activation. The
    chains merge when they have the same operators in the same places; otherwise only the
    bare convolutions do, and the chains stay on the slices."""
    rng = np.random.default_rng(5)
    rule = MergeConvs("m", "m", "", "merge_convs")
    b = GraphBuilder()
    x = b.input((1, 3, 6, 6))
    outs, convs = _conv_chains(b, x, rng, [("add", "relu"), ("add", "relu")])
    g = b.build(outs)
    units = [rule.unit(g, [c, *g.users(c), *g.users(g.users(c)[0])]) for c in convs]
    assert all(u is not None and len(u[1]) == 2 for u in units)
    match = rule.match_units(g, units)
    new = rule.rewrite(g, match)
    assert [n.kind for n in new.operators] == ["conv2d", "add", "relu", "strided_slice",
                                               "strided_slice"]
    xs = [rng.standard_normal((1, 3, 6, 6)).astype("f4")]
    for a, c in zip(run_graph(g, xs), run_graph(new, xs), strict=True):
        np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-4)
    assert any(len(m.nodes) == 6 for m in rule.find(g))  # found with the chains too

    b = GraphBuilder()
    x = b.input((1, 3, 6, 6))
    outs, convs = _conv_chains(b, x, rng, [("add", "relu"), ("multiply", "relu")])
    g = b.build(outs)
    chained = [(c, (g.users(c)[0], g.users(g.users(c)[0])[0])) for c in convs]
    assert rule.match_units(g, chained) is None
    assert rule.match_units(g, [(c, ()) for c in convs]) is not None
    assert all(len(m.nodes) == 2 for m in rule.find(g))
    # a fused kernel that is not one convolution and its chain is no unit
    assert rule.unit(g, [convs[0], g.users(convs[0])[0]]) is not None
    assert rule.unit(g, convs) is None
    assert rule.unit(g, [g.users(convs[0])[0]]) is None


def test_merge_convs_of_one_kernel_size_keeps_its_padding():
    rng = np.random.default_rng(6)
    b = GraphBuilder()
    x = b.input((1, 3, 7, 7))
    ks = [b.weight(rng.standard_normal((2, 3, 3, 3)).astype("f4")) for _ in range(2)]
    valid = [b.op("conv2d", [x, k]).out for k in ks]  # no padding: not SAME
    wide = b.op("conv2d", [x, b.weight(rng.standard_normal((2, 3, 5, 5)).astype("f4"))])
    g = b.build([*valid, wide.out])
    rule = MergeConvs("m", "m", "", "merge_convs")
    matches = rule.find(g)
    assert [len(m.nodes) for m in matches] == [2]  # the two 3x3 ones, not the 5x5 beside
    new = rule.rewrite(g, matches[0])
    assert new.operators[0].attrs["padding"] == (0, 0, 0, 0)
    xs = [rng.standard_normal((1, 3, 7, 7)).astype("f4")]
    for a, c in zip(run_graph(g, xs), run_graph(new, xs), strict=True):
        np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-4)


def test_regroup_only_where_groups_divide():
    rng = np.random.default_rng(4)
    b = GraphBuilder()
    x = b.input((1, 6, 5, 5))
    k = b.weight(rng.standard_normal((6, 2, 3, 3)).astype("f4"))
    g = b.build([b.op("conv2d", [x, k], {"groups": 3, "padding": 1}).out])
    assert Regroup("r", "r", "", "regroup", 2).find(g) == []
    assert len(Regroup("r", "r", "", "regroup", 3).find(g)) == 1


def test_avg_pool_pair_needs_the_same_input():
    b = GraphBuilder()
    x, y = b.input((1, 2, 5, 5)), b.input((1, 2, 5, 5))
    attrs = {"pool_size": 3, "padding": 1}
    g = b.build([b.op("add", [b.op("avg_pool2d", [x], attrs).out,
                              b.op("avg_pool2d", [y], attrs).out]).out])
    assert AvgPoolPair("a", "a", "", "avg_pool_pair").find(g) == []


def _pool_branch(pool_attrs, cout=2, conv_attrs=None, kernel=1, read_pool=False):
    """Inception's pool branch: avg pool -> conv -> bias -> relu over 8 channels."""
    rng = np.random.default_rng(5)
    b = GraphBuilder()
    x = b.input((1, 8, 7, 7))
    pool = b.op("avg_pool2d", [x], {"pool_size": 3, "padding": 1, **pool_attrs})
    w = b.weight(rng.standard_normal((cout, 8, kernel, kernel)).astype("f4"))
    conv = b.op("conv2d", [pool.out, w], {"padding": kernel // 2, **(conv_attrs or {})})
    bias = b.weight(rng.standard_normal((1, cout, 1, 1)).astype("f4"))
    out = b.op("relu", [b.op("add", [conv.out, bias]).out]).out
    return b.build([out, pool.out] if read_pool else [out])


def test_pool_after_conv_moves_the_pool_past_a_narrowing_1x1_conv():
    """Inception's pool branch (in the model 768 -> 192 channels): the 1 x 1 convolution reads
    the pool's input and the pool its output, the bias and relu after the pool, equal; not
    where it does not hold (a pool leaving its padding out of the divisor, a 3 x 3 or strided
    convolution) or would not pay (no fewer channels after the convolution, a strided pool:
    the convolution would run on 4x the pixels, the pool's output read elsewhere too)."""
    rule = PoolAfterConv("p", "p", "", "pool_after_conv")
    g = _pool_branch({"count_include_pad": True})
    (match,) = rule.find(g)
    new = rule.rewrite(g, match)
    assert [n.kind for n in new.operators] == ["conv2d", "avg_pool2d", "add", "relu"]
    assert new.operators[0].type.shape == (1, 2, 7, 7)
    feeds = [np.random.default_rng(6).standard_normal((1, 8, 7, 7)).astype("f4")]
    np.testing.assert_allclose(run_graph(new, feeds)[0], run_graph(g, feeds)[0], rtol=1e-5,
                               atol=1e-5)
    for refused in (_pool_branch({"count_include_pad": False}),
                    _pool_branch({"count_include_pad": True}, kernel=3),
                    _pool_branch({"count_include_pad": True}, conv_attrs={"strides": 2}),
                    _pool_branch({"count_include_pad": True, "strides": 2}),
                    _pool_branch({"count_include_pad": True}, cout=8),
                    _pool_branch({"count_include_pad": True}, read_pool=True)):
        assert rule.find(refused) == []


def test_merge_matmul_rows_batches_independent_steps_and_not_a_recurrence():
    """An RNN's input projections (x_t @ W, independent) become one product of the stacked
    rows; its recurrence (h_t = tanh(h_{t-1} @ U)) does not: merging it would close a cycle."""
    rule = MergeMatmulRows("rows", "rows", "", "merge_matmul_rows")
    rng = np.random.default_rng(1)
    b = GraphBuilder()
    w = b.weight(rng.standard_normal((4, 3)).astype("f4"))
    u = b.weight(rng.standard_normal((3, 3)).astype("f4"))
    xs = [b.input((1, 4), name=f"x{t}") for t in range(3)]
    h = b.input((1, 3), name="h")
    outs = []
    for x in xs:
        h = b.op("tanh", [b.op("add", [b.op("matmul", [x, w]).out,
                                       b.op("matmul", [h, u]).out]).out]).out
        outs.append(h)
    g = b.build(outs)
    matches = rule.find(g)
    weights = {g[g[m.nodes[0]].inputs[1].node].id for m in matches}
    assert weights == {w.node}  # only the projections by W
    assert max(len(m.nodes) for m in matches) == 3
    whole = next(m for m in matches if len(m.nodes) == 3)
    merged = rule.rewrite(g, whole)
    assert merged is not None
    assert sum(n.kind == "matmul" for n in merged.nodes) == 1 + 3  # one for W, three for U
    feeds = [rng.standard_normal(g[i].type.shape).astype("f4") for i in g.inputs]
    for got, want in zip(run_graph(merged, feeds), run_graph(g, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_merge_matmul_rows_of_many_steps_offers_the_whole_and_neighbours():
    """Twelve independent products by one matrix: the whole group and the eleven pairs of
    neighbours (not all 66 pairs); a recurrence of twelve steps offers nothing."""
    rule = MergeMatmulRows("rows", "rows", "", "merge_matmul_rows")
    rng = np.random.default_rng(2)
    b = GraphBuilder()
    w = b.weight(rng.standard_normal((3, 3)).astype("f4"))
    u = b.weight(rng.standard_normal((3, 3)).astype("f4"))
    steps = [b.op("matmul", [b.input((1, 3), name=f"x{t}"), w]).out for t in range(12)]
    h = b.input((1, 3), name="h")
    for _ in range(12):
        h = b.op("tanh", [b.op("matmul", [h, u]).out]).out
    g = b.build([*steps, h])
    sizes = sorted(len(m.nodes) for m in rule.find(g))
    assert sizes == [2] * 11 + [12]


def test_conv_of_a_concat_becomes_a_sum_and_the_concat_goes():
    """A 1x1 convolution over a three-piece channel concat (SqueezeNet's fire module into the
    next squeeze) -> three convolutions on the kernel's channel slices, summed; the concat
    is gone where nothing else reads it, kept where a pool reads it too. A grouped
    convolution and a concat along the height are not matched."""
    rule = SplitConvConcat("s", "s", "", "split_conv_concat")
    rng = np.random.default_rng(3)

    def fire(also_pool=False, groups=1, axis=1):
        b = GraphBuilder()
        xs = [b.input((1, c, 6, 6), name=f"x{i}") for i, c in enumerate((2, 4, 2))]
        cat = b.op("concat", xs, {"axis": axis}).out
        cin = 8 if axis == 1 else 2
        w = b.weight(rng.standard_normal((4, cin // groups, 1, 1)).astype("f4"))
        y = b.op("conv2d", [cat, w], {"groups": groups}).out
        outs = [y] + ([b.op("max_pool2d", [cat], {"pool_size": 2}).out] if also_pool else [])
        return b.build(outs)

    for also_pool in (False, True):
        g = fire(also_pool)
        [match] = rule.find(g)
        new = rule.rewrite(g, match)
        assert new is not None
        kinds = [n.kind for n in new.operators]
        assert kinds.count("conv2d") == 3 and kinds.count("add") == 2
        assert kinds.count("concat") == (1 if also_pool else 0)
        feeds = [rng.standard_normal(g[i].type.shape).astype("f4") for i in g.inputs]
        for got, want in zip(run_graph(new, feeds), run_graph(g, feeds), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert rule.find(fire(groups=2)) == []
    xs_on_height = GraphBuilder()
    parts = [xs_on_height.input((1, 2, 3, 6)) for _ in range(2)]
    cat = xs_on_height.op("concat", parts, {"axis": 2}).out
    w = xs_on_height.weight(rng.standard_normal((4, 2, 1, 1)).astype("f4"))
    g = xs_on_height.build([xs_on_height.op("conv2d", [cat, w]).out])
    assert rule.find(g) == []
