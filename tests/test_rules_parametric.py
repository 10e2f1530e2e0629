"""Parametric rules: z3 proofs of the general schemas, randomised numeric checks, and
behaviour on small graphs built for each."""

import numpy as np
import pytest

from paragraph import GraphBuilder
from paragraph.interpret import run_graph
from paragraph.rules.parametric import (
    AvgPoolPair,
    MergeConvs,
    Regroup,
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
    assert [n.kind for n in new.operators] == ["conv2d", "split"]
    assert new.operators[0].attrs["padding"] == (1, 2, 1, 2)
    xs = [rng.standard_normal((1, 3, 7, 7)).astype("f4")]
    for a, c in zip(run_graph(g, xs), run_graph(new, xs)):
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
