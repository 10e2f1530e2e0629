"""Write, verify and use a substitution rule of your own.

Run it with ``python tutorials/custom_rule.py``. Steps:

1. write the rule: two pattern graphs over the same inputs (TASO section 2.2), here
   ``concat(relu(x), relu(y)) => relu(concat(x, y))`` for any concatenation axis (``?axis``
   binds when the source matches and is reused by the target);
2. prove it with z3 against the operator axioms (TASO table 2.2) and check it numerically on
   random shapes drawn to break equalities the rule does not state;
3. keep it in a rule library file of your own (written only if every rule is verified, and
   checked against its content hashes whenever it is loaded);
4. find where it matches in a model and check a rewrite by running both graphs;
5. hand it to the substitution search, beside the shipped rules: the search applies it where
   it lowers the cost and measures faster, never an unverified rule.
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

import paragraph
from paragraph import models
from paragraph.interpret import run_graph
from paragraph.rules import (
    PInput,
    POp,
    Rule,
    apply_match,
    default_library,
    find_matches,
    load_library,
    prove_rule,
)
from paragraph.rules.library import write_library
from paragraph.rules.rule import random_check
from paragraph.tvm_interop import from_relax, random_inputs


def main(full: bool = False, budget: float = 20.0) -> None:
    # 1. The rule. Tensors are (node, output): nodes 0 and 1 are the inputs x and y, then each
    #    side's operators in order (source: 2 = relu(x), 3 = relu(y), 4 = concat; target:
    #    2 = concat, 3 = relu). ``outputs`` maps the source's output to the target's.
    rule = Rule(
        "relu-after-concat", "concat(relu x, relu y) => relu(concat x y)",
        inputs=(PInput("x", ("N", "C", "H", "W")), PInput("y", ("N", "D", "H", "W"))),
        source=(POp("relu", (), ((0, 0),)), POp("relu", (), ((1, 0),)),
                POp("concat", (("axis", "?axis"),), ((2, 0), (3, 0)))),
        target=(POp("concat", (("axis", "?axis"),), ((0, 0), (1, 0))),
                POp("relu", (), ((2, 0),))),
        outputs=(((4, 0), (3, 0)),), origin="custom")
    print(rule.describe())

    # 2. Verify: z3 proves source == target from the axioms (it says which it used), and the
    #    numeric check tries the rule on random shapes and axes (it raises where they differ).
    proof = prove_rule(rule)
    print(f"z3: {proof.status} using axioms {', '.join(proof.axioms)} "
          f"in {proof.seconds * 1e3:.0f} ms")
    assert proof.status == "verified"
    rule = replace(rule, proof=proof.to_json())
    print(f"numeric check: {random_check(rule)} random instances agree")

    # 3. A library file of your own: refused unless verified, hash-checked on load.
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "my-rules.json"
        write_library(path, [rule], [], {"note": "tutorial"})
        mine = load_library(path)
    rule = mine.get("relu-after-concat")
    print(f"library {path.name}: {len(mine.rules)} rule, hash {mine.hashes[rule.id][:12]}")

    # 4. Where it matches in a model: SqueezeNet's fire modules concatenate two ReLUs.
    mod = models.get("squeezenet1_1", reduced=not full)
    graph = from_relax(mod)
    matches = find_matches(graph, rule)
    print(f"squeezenet: {len(matches)} matches")
    assert matches
    rewritten = apply_match(graph, matches[0])
    assert rewritten is not None
    x = random_inputs(mod)
    np.testing.assert_allclose(run_graph(rewritten, x)[0], run_graph(graph, x)[0],
                               rtol=1e-5, atol=1e-5)
    print(f"one rewrite: {len(graph.operators)} -> {len(rewritten.operators)} operators, "
          "same outputs")

    # 5. The search with the shipped rules and yours. Its report names every rule it applied
    #    by id; whether yours is among them is the cost model's and the measurement's call
    #    (TVM fuses a ReLU into the convolution before it, so two fused ReLUs are free and
    #    one after the concatenation is an extra kernel: expect the search to leave it out).
    rules = [*default_library().for_search(), rule]
    search = paragraph.SearchOptions("greedy", budget=budget, top_k=2)
    with paragraph.build(mod, search=search, rules=rules, kernels="tvm") as exe:
        got = exe.run(*x)
        np.testing.assert_allclose(got[0], run_graph(graph, x)[0], rtol=1e-4, atol=1e-4)
        applied = exe.report["search"]["rules"]
        print(f"the search applied {len(applied)} rewrites "
              f"({'including' if rule.id in applied else 'not'} {rule.id}): "
              f"{', '.join(sorted(set(applied))) or 'none'}")

    # An unverified rule never reaches a program:
    try:
        paragraph.build(mod, search=search, rules=[replace(rule, proof=None)])
    except paragraph.ParagraphError as e:
        print(f"unverified: {e}")


if __name__ == "__main__":
    main(full="--full" in sys.argv)
