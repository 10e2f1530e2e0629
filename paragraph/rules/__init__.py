"""Verified substitution rules (TASO chapter 2, MetaFlow): the rule language's operator specs,
the axioms and their validation, the z3 verifier, TASO's generator, parametric rules, the rule
library and the matcher/rewriter over `paragraph.graph`. Nothing here imports TVM.

    from paragraph import rules
    lib = rules.load_library()                      # the shipped, verified rules
    for match, new_graph in rules.rewrites(graph, lib.for_search()):
        ...
"""

from paragraph.errors import RuleLibraryError
from paragraph.rules.axioms import Axiom, all_axioms, redundant, validate, validate_all
from paragraph.rules.generator import generate
from paragraph.rules.library import (
    Library,
    build_library,
    default_library,
    load_library,
    verify_library,
)
from paragraph.rules.match import (
    Match,
    apply_match,
    both_directions,
    find_matches,
    match_all,
    rewrites,
)
from paragraph.rules.parametric import ParametricRule, all_parametric
from paragraph.rules.rule import PInput, POp, Rule
from paragraph.rules.verify import Proof, Prover, prove_rule

__all__ = [
    "Axiom", "all_axioms", "redundant", "validate", "validate_all", "generate", "Library",
    "build_library", "default_library", "load_library", "verify_library", "Match",
    "apply_match", "both_directions", "find_matches", "match_all", "rewrites",
    "ParametricRule", "all_parametric", "PInput", "POp", "Rule", "Proof", "Prover",
    "prove_rule", "RuleLibraryError",
]
