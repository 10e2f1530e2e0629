"""Soundness of the rules on shapes that break equalities (issue 16, item 0).

Axiom g1 (a grouped convolution is two convolutions on its halves) once had no hypothesis that
the halves have equal output channels, so z3 "proved" rules that are false when they differ:
the library's taso-7389b280 (two convolutions concatenated <-> one with groups = 2) among them.
"""

from dataclasses import replace

import numpy as np
import pytest

from paragraph import GraphBuilder
from paragraph.interpret import run_graph
from paragraph.rules.axioms import by_name, validate
from paragraph.rules.library import default_library
from paragraph.rules.match import apply_match, find_matches
from paragraph.rules.rule import Rule, random_check
from paragraph.rules.verify import prove_rule

RNG = np.random.default_rng(3)


def test_g1_states_equal_halves_and_validation_catches_the_old_axiom():
    g1 = by_name(["g1"])[0]
    assert validate(g1) == []
    assert any(h[1][0] == "dim" for h in g1.hypotheses)
    unsound = replace(g1, hypotheses=tuple(h for h in g1.hypotheses
                                           if not isinstance(h[1], tuple) or h[1][0] != "dim"))
    failures = validate(unsound)
    assert failures and all("the sides differ" in f for f in failures)


def test_a_hypothesis_that_is_never_needed_is_reported():
    g1 = by_name(["g1"])[0]
    extra = ("eq", ("dim", "x1", -1), ("dim", "x2", -1))  # implied by typing: never needed
    assert any("never needed" in f for f in validate(replace(g1, hypotheses=(*g1.hypotheses,
                                                                             extra))))


def _two_convs(out1: int, out2: int):
    """concat(conv(a, k1), conv(b, k2)) on channels: the target side of taso-7389b280."""
    b = GraphBuilder()
    x1, x2 = b.input((1, 4, 6, 6)), b.input((1, 4, 6, 6))
    k1 = b.weight(RNG.standard_normal((out1, 4, 3, 3)).astype("f4"))
    k2 = b.weight(RNG.standard_normal((out2, 4, 3, 3)).astype("f4"))
    c1 = b.op("conv2d", [x1, k1], {"padding": 1})
    c2 = b.op("conv2d", [x2, k2], {"padding": 1})
    return b.build([b.op("concat", [c1.out, c2.out], {"axis": 1}).out])


def test_grouped_conv_rule_does_not_apply_to_unequal_convolutions():
    rule = default_library().get("taso-7389b280~")
    assert isinstance(rule, Rule) and rule.equal_dims()
    assert find_matches(_two_convs(2, 4), rule) == []
    graph = _two_convs(4, 4)
    matches = find_matches(graph, rule)
    assert matches
    new = apply_match(graph, matches[0])
    assert new is not None and any(n.kind == "conv2d" and n.attrs["groups"] == 2
                                   for n in new.nodes)
    inputs = [RNG.standard_normal((1, 4, 6, 6)).astype("f4") for _ in range(2)]
    np.testing.assert_allclose(run_graph(new, inputs)[0], run_graph(graph, inputs)[0],
                               rtol=1e-4, atol=1e-4)


def test_the_proof_names_the_sizes_it_needs_and_the_numeric_check_refutes_without_them():
    rule = default_library().get("taso-7389b280")
    assert isinstance(rule, Rule)
    proof = prove_rule(rule, use_cache=False)
    assert proof.status == "verified" and proof.dims == (("k1", -4), ("k2", -4))
    assert random_check(rule, seed=0) > 0
    # the same rule claiming no size equalities: shapes drawn to break them refute it
    careless = replace(rule, proof={**(rule.proof or {}), "dims": []})
    with pytest.raises(AssertionError, match="differs"):
        random_check(careless, seed=0, tries=200)


def test_every_library_rule_records_the_sizes_its_proof_used():
    for rule in default_library().rules:
        assert "dims" in (rule.proof or {}), rule.id
