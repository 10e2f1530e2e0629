"""TASO's generator at k=2: it reproduces a known small rule set, and its parts behave."""

import numpy as np
import pytest

from paragraph.rules import generator as G
from paragraph.rules.rule import PInput, POp, Rule, random_check

# TASO table 2.2 / fig. 2.2 facts that graphs of at most two operators express
EXPECTED = {
    "matmul(x1, matmul(w1, w2)) => matmul(matmul(x1, w1), w2)",
    "matmul(x1, smul(w1, s)) => smul(matmul(x1, w1), s)",
    "split0(axis=?axis0, concat(axis=?axis0, x1, x2)) => x1; "
    "split1(axis=?axis0, concat(axis=?axis0, x1, x2)) => x2",
    "transpose(transpose(x1)) => x1",
    "matmul(x1, i_matmul()) => x1",
    "ewmul(x1, ones()) => x1",
    "relu(transpose(x1)) => transpose(relu(x1))",
    "relu(conv2d(stride=?stride0, pad=?pad0, act=0, groups=?groups0, i1, k1)) => "
    "conv2d(stride=?stride0, pad=?pad0, act=1, groups=?groups0, i1, k1)",
    "conv2d(stride=?stride0, pad=0, act=?act0, groups=?groups0, i1, enlarge(kh=?kh0, kw=?kw0, "
    "k3)) => conv2d(stride=?stride0, pad=0, act=?act0, groups=?groups0, i1, k3)",
    "conv2d(stride=1, pad=0, act=0, groups=1, i1, i_conv(kh=?kh0, kw=?kw0)) => i1",
    "conv2d(stride=?stride0, pad=?pad0, act=0, groups=?groups0, i1, c_pool(kh=?kh0, kw=?kw0)) "
    "=> pool_avg(kh=?kh0, kw=?kw0, stride=?stride0, pad=?pad0, i1)",
}


@pytest.fixture(scope="module")
def k2():
    lines = []
    report = G.generate(2, workers=1, log=lines.append)
    return report, lines


def test_k2_reproduces_known_rules(k2):
    report, _ = k2
    found = {r.describe() for r in report.rules}
    assert EXPECTED <= found, EXPECTED - found
    assert 15 <= len(report.rules) <= 40
    assert all(r.proof["status"] == "verified" and r.proof["axioms"] for r in report.rules)
    assert len({r.id for r in report.rules}) == len(report.rules)


def test_stage_counts_are_printed_and_shrink(k2):
    report, lines = k2
    names = [s[0] for s in report.stages]
    assert names[:3] == ["graphs enumerated", "candidates (equal on floats)",
                         "after input renaming"]
    counts = [s[1] for s in report.stages]
    assert counts == sorted(counts, reverse=True) and counts[0] > 1000
    assert any("graphs enumerated" in line for line in lines)


def test_k2_rules_hold_on_random_shapes(k2):
    report, _ = k2
    for rule in report.rules:
        assert random_check(rule, seed=1) > 0, rule.describe()


def test_fingerprint_ignores_the_order_of_outputs():
    d = G.matrix_domain()
    enum = G.enumerate_graphs(d, 2)
    # matmul(x1, w1) and matmul(x1, w2) in either order is one graph, one fingerprint:
    # every bucket holding a two-output graph holds it once per operator order at most
    sizes = [len(g) for g in enum.buckets.values()]
    assert max(sizes) < 20 and enum.graphs > 1000


def test_renaming_keeps_one_of_equal_rules():
    def assoc(a, b, c):
        ins = (PInput("x", ("N", "N")), PInput("y", ("N", "N")), PInput("z", ("N", "N")))
        src = (POp("matmul", (), ((a, 0), (b, 0))), POp("matmul", (), ((3, 0), (c, 0))))
        tgt = (POp("matmul", (), ((b, 0), (c, 0))), POp("matmul", (), ((a, 0), (3, 0))))
        return Rule("", "", ins, src, tgt, (((4, 0), (4, 0)),))

    assert G.canonical_key(assoc(0, 1, 2)) == G.canonical_key(assoc(2, 0, 1))
    # identifying two inputs is a specialisation: its key is the merged one
    special = assoc(0, 1, 0)
    assert G.canonical_key(assoc(0, 1, 2), merge=(0, 2)) == G.canonical_key(special)


def test_common_subgraph_generalisations():
    # relu(smul(a^T, s)) vs relu(smul(a, s)^T): the common top operator goes (form b)
    ins = (PInput("a", ("M", "N")), PInput("s", ()))
    rule = Rule("", "", ins,
                (POp("transpose", (), ((0, 0),)), POp("smul", (), ((2, 0), (1, 0))),
                 POp("relu", (), ((3, 0),))),
                (POp("smul", (), ((0, 0), (1, 0))), POp("transpose", (), ((2, 0),)),
                 POp("relu", (), ((3, 0),))),
                (((4, 0), (4, 0)),))
    general = G.common_generalisations(rule, {"M": 3, "N": 4})
    assert [g.describe() for g in general] == ["smul(transpose(a), s) => transpose(smul(a, s))"]
    # a common operator on the same inputs becomes a fresh input (form a)
    rule = Rule("", "", ins,
                (POp("transpose", (), ((0, 0),)), POp("relu", (), ((2, 0),)),
                 POp("smul", (), ((3, 0), (1, 0)))),
                (POp("transpose", (), ((0, 0),)), POp("smul", (), ((2, 0), (1, 0))),
                 POp("relu", (), ((3, 0),))),
                (((4, 0), (4, 0)),))
    general = G.common_generalisations(rule, {"M": 3, "N": 4})
    assert [g.describe() for g in general] == ["smul(relu(c0), s) => relu(smul(c0, s))"]


def test_components_split_parallel_rules():
    ins = (PInput("a", ("N", "N")), PInput("s", ()))
    rule = Rule("", "", ins,
                (POp("transpose", (), ((0, 0),)), POp("smul", (), ((2, 0), (1, 0))),
                 POp("relu", (), ((0, 0),))),
                (POp("smul", (), ((0, 0), (1, 0))), POp("transpose", (), ((2, 0),)),
                 POp("relu", (), ((0, 0),))),
                (((3, 0), (3, 0)), ((4, 0), (4, 0))))
    parts = G.components(rule)
    assert sorted(p.describe() for p in parts) == [
        "relu(a) => relu(a)", "smul(transpose(a), s) => transpose(smul(a, s))"]
    # the generator drops the output pair that is the same on both sides first
    assert G.drop_identical_outputs(rule).describe() == parts[0].describe()


def test_int_and_float_tests_agree_on_a_true_pair():
    d = G.matrix_domain()
    ints = G._inputs(d, "int", 0)
    assert all(v.dtype == np.int64 for v in ints)
    floats = G._inputs(d, "float", 1)
    assert all(np.abs(v).max() <= 1 for v in floats)
