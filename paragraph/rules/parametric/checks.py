"""Checking a parametric rule: its obligations proved by z3 (the library's proof record),
and its rewrites compared with the graph they rewrote on random examples."""

from __future__ import annotations

from typing import Any

import numpy as np

from paragraph.interpret import run_graph
from paragraph.rules.axioms import by_name
from paragraph.rules.parametric.base import ParametricRule
from paragraph.rules.verify import DEFAULT_RLIMIT, Prover, axiom_order, z3_version


def prove(rule: ParametricRule, prover: Prover | None = None) -> dict[str, Any]:
    """Discharge every obligation with z3; the proof record for the library."""
    hint = by_name(rule.hint()) if prover is None else []
    prover = prover or Prover()
    axioms: set[str] = set()
    instances = []
    status = "verified"
    for desc, lhs, rhs, hyps in rule.obligations():
        p = None
        # z3's search depends on its history: a few seeds on the small set, then everything
        for seed in range(4 if hint else 0):
            p = Prover(hint, rlimit=DEFAULT_RLIMIT // 4, seed=seed).prove(lhs, rhs, hyps)
            if p.status == "verified":
                break
        if p is None or p.status != "verified":
            p = prover.prove(lhs, rhs, hyps)
        instances.append({"case": desc, "status": p.status,
                          "source": [repr(t) for t in lhs], "target": [repr(t) for t in rhs]})
        axioms.update(p.axioms)
        if p.status != "verified":
            status = p.status

    return {"status": status, "axioms": sorted(axioms, key=axiom_order), "z3": z3_version(),
            "obligations": instances}


def check_numeric(rule: ParametricRule, seed: int = 0, tol: float = 1e-4) -> int:
    """Rewrite every match in a random example graph; compare outputs with numpy.

    Returns the number of rewrites checked; raises AssertionError on a difference.
    """
    rng = np.random.default_rng(seed)
    graph = rule.example(rng)
    inputs = [rng.standard_normal(graph[i].type.shape).astype(graph[i].type.dtype)
              for i in graph.inputs]
    expected = run_graph(graph, inputs)
    checked = 0
    for match in rule.find(graph):
        new = rule.rewrite(graph, match)
        if new is None:
            continue
        new.validate()
        got = run_graph(new, inputs)
        for e, g in zip(expected, got, strict=True):
            assert e.shape == g.shape, f"{rule.id}: shape {g.shape} != {e.shape}"
            err = float(np.max(np.abs(e - g))) if e.size else 0.0
            assert np.allclose(e, g, rtol=tol, atol=tol), f"{rule.id}: max error {err}"
        checked += 1
    return checked
