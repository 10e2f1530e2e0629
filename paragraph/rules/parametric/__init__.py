"""Parametric rules: substitutions over any number of operators or any kernel size, group
count or shape, which enumeration cannot express (IOS, MetaFlow, TASO sections 2.8-2.9,
AutoGraph fig. 9).

Each rule finds its matches in a `Graph` and rewrites them itself, and carries

* ``obligations()``: z3 proof obligations over the axioms for its general schema (parameters
  are z3 variables; a schema over n operators is proved for n = 2 and n = 3, nested binary
  concat/split being how n-way ones are written), discharged by `prove`;
* ``example(rng)``: a random small graph where it matches, which `check_numeric` rewrites
  and compares with `paragraph.interpret.run_graph`.

Where a graph operator's meaning goes beyond the rule language (batch norm, an average pool
that does not count its padding, ``linear``), the obligation states it through its algebraic
definition (``bn(y) = chmul(y, a) + b``, ``avg_excl(x) = avg(x) * r``) and the numeric check
covers that step.

Each schema is declared once, in the module of its family (`FAMILIES`): a `ParametricRule`
subclass with its library description as class data (``SCHEMA = Schema(...)``) and one
``@ship(position, id, name, paper, **params)`` decorator per rule paragraph ships of it
(`paragraph.rules.parametric.base`). ``SCHEMAS``, ``DESCRIPTIONS`` and `all_parametric` are
derived from those declarations.
"""

from __future__ import annotations

from paragraph.rules.parametric import convs, elementwise, folds, matmuls, pools
from paragraph.rules.parametric.base import (
    Obligation,
    ParametricRule,
    Schema,
    schemas,
    ship,
    shipped,
)
from paragraph.rules.parametric.chains import (
    CHAIN_BINARY,
    CHAIN_UNARY,
    ChainStep,
    chain_step,
    conv_chain,
)
from paragraph.rules.parametric.checks import check_numeric, prove
from paragraph.rules.parametric.convs import (
    MergeConvs,
    Regroup,
    SplitConv,
    SplitConvConcat,
    SplitGroupedConv,
    Unit,
    block_diagonal,
)
from paragraph.rules.parametric.elementwise import SruDistribute
from paragraph.rules.parametric.folds import ConvAddIdentity, FoldBatchNorm
from paragraph.rules.parametric.matmuls import MergeMatmulRows, MergeMatmuls
from paragraph.rules.parametric.pools import AvgPoolPair, PoolAfterConv

# the families, in the order their schemas are listed (SCHEMAS, DESCRIPTIONS)
FAMILIES = (convs, pools, matmuls, folds, elementwise)

SCHEMAS = schemas(FAMILIES)
# What each schema matches, what it builds, under which conditions, and how outputs map.
DESCRIPTIONS = {name: cls.SCHEMA.description() for name, cls in SCHEMAS.items()}


def all_parametric() -> list[ParametricRule]:
    """Every parametric rule paragraph ships, with its id, name and the paper it follows."""
    return shipped()


__all__ = [
    "CHAIN_BINARY", "CHAIN_UNARY", "DESCRIPTIONS", "FAMILIES", "SCHEMAS", "AvgPoolPair",
    "ChainStep", "ConvAddIdentity", "FoldBatchNorm", "MergeConvs", "MergeMatmulRows",
    "MergeMatmuls", "Obligation", "ParametricRule", "PoolAfterConv", "Regroup", "Schema",
    "SplitConv", "SplitConvConcat", "SplitGroupedConv", "SruDistribute", "Unit", "all_parametric",
    "block_diagonal", "chain_step", "check_numeric", "conv_chain", "prove", "ship",
]
