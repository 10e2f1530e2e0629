"""Matcher and rewriter: matches, attribute constraints, external edges, cycles, folding."""

import numpy as np

from paragraph import GraphBuilder
from paragraph.graph import TensorRef
from paragraph.interpret import fold_weights, run_graph
from paragraph.rules.match import apply_match, both_directions, find_matches, usable
from paragraph.rules.rule import PInput, POp, Rule
from paragraph.rules.specs import NONE, RELU, SAME

RNG = np.random.default_rng(0)


def w(*shape):
    return RNG.standard_normal(shape).astype("float32")


# the fixtures' equivalences (axioms 39, 36, ...) need no size facts; a rule whose proof does
# not say which sizes it used has every shared template name enforced (see test_rules_soundness)
NO_DIMS = {"status": "verified", "dims": []}


def rule(inputs, source, target, outputs, rid="t"):
    return Rule(rid, rid, tuple(PInput(n, d) for n, d in inputs), tuple(source), tuple(target),
                tuple(outputs), proof=NO_DIMS)


def conv(x, k, act=NONE, stride="?s"):
    return POp("conv2d", (("stride", stride), ("pad", SAME), ("act", act), ("groups", 1)),
               (x, k))


# fuse two convs sharing an input (TASO axiom 39 / MetaFlow fig. 4a)
FUSE = rule([("x", "BCHW"), ("a", "CC33"), ("b", "CC33")],
            [conv((0, 0), (1, 0)), conv((0, 0), (2, 0))],
            [POp("concat", (("axis", -4),), ((1, 0), (2, 0))), conv((0, 0), (3, 0)),
             POp("split", (("axis", -3),), ((4, 0),))],
            [((3, 0), (5, 0)), ((4, 0), (5, 1))])
# matmul fusion (TASO fig. 2.2b)
MM = rule([("a", "MN"), ("b", "NN"), ("c", "NN")],
          [POp("matmul", (), ((0, 0), (1, 0))), POp("matmul", (), ((0, 0), (2, 0)))],
          [POp("concat", (("axis", -1),), ((1, 0), (2, 0))), POp("matmul", (), ((0, 0), (3, 0))),
           POp("split", (("axis", -1),), ((4, 0),))],
          [((3, 0), (5, 0)), ((4, 0), (5, 1))])
RELU_FUSE = rule([("x", "BCHW"), ("k", "CC33")],
                 [conv((0, 0), (1, 0)), POp("relu", (), ((2, 0),))],
                 [conv((0, 0), (1, 0), act=RELU)], [((3, 0), (2, 0))])


def two_convs(stride2=1, extra_reader=False):
    b = GraphBuilder()
    x = b.input((1, 3, 6, 6))
    c1 = b.op("conv2d", [x, b.weight(w(4, 3, 3, 3))], {"padding": 1})
    c2 = b.op("conv2d", [x, b.weight(w(5, 3, 3, 3))], {"padding": 1, "strides": stride2})
    outs = [b.op("relu", [c1.out]).out, c2.out]
    if extra_reader:
        outs.append(c1.out)
    return b.build(outs)


def check_same(g1, g2, tol=1e-4):
    xs = [RNG.standard_normal(g1[i].type.shape).astype("float32") for i in g1.inputs]
    for a, b in zip(run_graph(g1, xs), run_graph(g2, xs), strict=True):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def test_fuse_convs_match_rewrite_and_fold():
    g = two_convs()
    matches = find_matches(g, FUSE)
    assert len(matches) == 2  # both orders of the two convs
    new = apply_match(g, matches[0])
    assert new is not None
    new.validate()
    check_same(g, new)
    kinds = [n.kind for n in new.operators]
    assert kinds.count("conv2d") == 1 and "split" in kinds
    assert "concat" not in kinds  # the concatenated kernel was folded into one weight


def test_attribute_constraints_stop_a_match():
    assert find_matches(two_convs(stride2=2), FUSE) == []  # ?s binds one stride for both


def test_external_edge_rule():
    # conv + relu fuse only when nothing else reads the conv's output
    g = two_convs()
    assert len(find_matches(g, RELU_FUSE)) == 1
    assert find_matches(two_convs(extra_reader=True), RELU_FUSE) == []


def test_rewrite_that_would_create_a_cycle_is_rejected():
    # TASO fig. 2.6: A x relu(A x B); fusing the two matmuls makes one read its own output
    b = GraphBuilder()
    a = b.input((4, 4))
    bb = b.weight(w(4, 4))
    m1 = b.op("matmul", [a, bb])
    m2 = b.op("matmul", [a, b.op("relu", [m1.out]).out])
    g = b.build([m2.out])
    matches = find_matches(g, MM)
    assert matches, "the source pattern does match"
    assert all(apply_match(g, m) is None for m in matches)


def test_commutative_operands_and_shared_inputs():
    add = rule([("x", "MN"), ("y", "MN")], [POp("ewadd", (), ((0, 0), (1, 0)))],
               [POp("ewadd", (), ((1, 0), (0, 0)))], [((2, 0), (2, 0))])
    b = GraphBuilder()
    x = b.input((2, 3))
    g = b.build([b.op("add", [x, x]).out])
    ms = find_matches(g, add)
    assert ms and all(m.tensors[(0, 0)] == m.tensors[(1, 0)] for m in ms)
    # rewriting x + x into x + x changes nothing: no rewrite
    assert all(apply_match(g, m) is None for m in ms)


def test_broadcast_add_is_not_ewadd():
    add = rule([("x", "MN"), ("y", "MN")], [POp("ewadd", (), ((0, 0), (1, 0)))],
               [POp("ewadd", (), ((1, 0), (0, 0)))], [((2, 0), (2, 0))])
    b = GraphBuilder()
    x = b.input((2, 3))
    g = b.build([b.op("add", [x, b.weight(w(3))]).out])
    assert find_matches(g, add) == []


def test_identity_rules_and_reverse_direction():
    tt = rule([("x", "MN")], [POp("transpose", (), ((0, 0),)), POp("transpose", (), ((1, 0),))],
              [], [((2, 0), (0, 0))])
    b = GraphBuilder()
    x = b.input((2, 3))
    t1 = b.op("permute_dims", [x], {"axes": (1, 0)})
    t2 = b.op("permute_dims", [t1.out], {"axes": (1, 0)})
    g = b.build([b.op("relu", [t2.out]).out])
    (m,) = find_matches(g, tt)
    new = apply_match(g, m)
    assert [n.kind for n in new.operators] == ["relu"]
    check_same(g, new)
    assert not usable(tt.reversed())  # x => transpose(transpose(x)) matches nothing
    assert both_directions([tt]) == [tt]


def test_constant_in_source_is_matched_by_value():
    ones = rule([("x", "MN")], [POp("ones", (), ()), POp("ewmul", (), ((0, 0), (1, 0)))], [],
                [((2, 0), (0, 0))])
    for value, expect in ((1.0, 1), (2.0, 0)):
        b = GraphBuilder()
        x = b.input((2, 3))
        g = b.build([b.op("multiply", [x, b.weight(np.full((2, 3), value, "float32"))]).out])
        assert len(find_matches(g, ones)) == expect


def test_fold_weights_folds_weight_only_chains():
    b = GraphBuilder()
    x = b.input((2, 3))
    k = b.op("permute_dims", [b.weight(w(3, 3))], {"axes": (1, 0)})
    k2 = b.op("relu", [k.out])
    g = b.build([b.op("matmul", [x, k2.out]).out])
    folded = fold_weights(g)
    assert [n.kind for n in folded.operators] == ["matmul"]
    check_same(g, folded)
    assert fold_weights(g, only=set()) is g
    assert TensorRef(k2.id, 0) not in folded.outputs


def test_parameter_constraints_and_unbound_variables():
    # concat(a, concat(b, x, y), concat(b, z, w)) needs a != b (TASO axiom 30)
    def cat(axis, u, v):
        return POp("concat", (("axis", axis),), (u, v))

    geo = Rule("geo", "geo", tuple(PInput(n, "MN") for n in "xyzw"),
               (cat("?b", (0, 0), (1, 0)), cat("?b", (2, 0), (3, 0)), cat("?a", (4, 0), (5, 0))),
               (cat("?a", (0, 0), (2, 0)), cat("?a", (1, 0), (3, 0)), cat("?b", (4, 0), (5, 0))),
               (((6, 0), (6, 0)),), constraints=(("ne", "?a", "?b"),), proof=NO_DIMS)
    for axis, want in ((0, 1), (1, 0)):  # inner concats on axis 1; outer on axis 0 / 1
        b2 = GraphBuilder()
        ins = [b2.input((2, 2)) for _ in range(4)]
        c1 = b2.op("concat", ins[:2], {"axis": 1})
        c2 = b2.op("concat", ins[2:], {"axis": 1})
        g = b2.build([b2.op("concat", [c1.out, c2.out], {"axis": axis}).out])
        matches = find_matches(g, geo)
        assert len(matches) == want
        for m in matches:
            check_same(g, apply_match(g, m))
    # reversed, enlarge would need a kernel size the source does not give
    grow = Rule("grow", "grow", (PInput("x", "BCHW"), PInput("k", "CC11")),
                (conv((0, 0), (1, 0)),),
                (POp("enlarge", (("kh", "?k"), ("kw", "?k")), ((1, 0),)), conv((0, 0), (2, 0))),
                (((2, 0), (3, 0)),))
    assert usable(grow.reversed()) and not usable(grow)


def test_fused_relu_conv_reached_from_its_reader():
    # concat(relu(conv(x, a)), relu(conv(x, b))) with the convs written act=RELU: the plan
    # starts at the concat and reaches each conv through its relu
    cat = Rule("cat", "cat", (PInput("x", "BCHW"), PInput("a", "CC33"), PInput("b", "CC33")),
               (conv((0, 0), (1, 0), act=RELU), conv((0, 0), (2, 0), act=RELU),
                POp("concat", (("axis", -3),), ((3, 0), (4, 0)))),
               (POp("concat", (("axis", -4),), ((1, 0), (2, 0))),
                conv((0, 0), (3, 0), act=RELU)),
               (((5, 0), (4, 0)),), proof=NO_DIMS)
    b = GraphBuilder()
    x = b.input((1, 3, 6, 6))
    r1 = b.op("relu", [b.op("conv2d", [x, b.weight(w(2, 3, 3, 3))], {"padding": 1}).out])
    r2 = b.op("relu", [b.op("conv2d", [x, b.weight(w(4, 3, 3, 3))], {"padding": 1}).out])
    g = b.build([b.op("concat", [r1.out, r2.out], {"axis": 1}).out])
    (m,) = find_matches(g, cat)
    new = apply_match(g, m)
    assert [n.kind for n in new.operators] == ["conv2d", "relu"]
    check_same(g, new)


def test_many_siblings_pair_only_with_their_neighbours():
    """Twelve products of one input by twelve matrices: a two-operator rule over siblings
    pairs every two of up to EVERY_PAIR_UP_TO of them, beyond that only neighbours (an
    unrolled recurrent model has hundreds: every pair of the GRU's made 39,000 matches)."""
    from paragraph.rules.match import EVERY_PAIR_UP_TO

    def products(n):
        b = GraphBuilder()
        x = b.input((2, 3))
        return b.build([b.op("matmul", [x, b.weight(w(3, 3))]).out for _ in range(n)])

    few = find_matches(products(EVERY_PAIR_UP_TO), MM)
    assert len({frozenset(m.nodes) for m in few}) == EVERY_PAIR_UP_TO * (EVERY_PAIR_UP_TO - 1) // 2
    g = products(12)
    pairs = {frozenset(m.nodes) for m in find_matches(g, MM)}
    order = [n.id for n in g.operators]
    assert pairs == {frozenset(p) for p in zip(order, order[1:], strict=False)}
