"""Move average pools past the 1 x 1 convolutions that narrow their output.

In every Inception block the pool branch is a 3 x 3 average pool over C channels followed by a
1 x 1 convolution to C/4 or fewer (Inception-v3: 288 -> 64, 768 -> 192, 2048 -> 192). The two
commute (both linear; a pool that counts its padding maps the padding's zeros to zeros), so the
verified library rule ``pool-after-conv1x1`` (`paragraph.rules.parametric.PoolAfterConv`, axiom
``pc``) runs the convolution first and the pool on its 4-10x fewer channels, with the
convolution's batch norm and relu after the pool (the vendor pool applies them as its
epilogue). Nothing is added and the pool's work shrinks, so the critical-path planner applies it
wherever it matches (`paragraph.planner`), and confirms by timing the whole run only that it is
not slower, as AutoGraph confirms its substitutions.
"""

from __future__ import annotations

from paragraph.graph import Graph
from paragraph.progress import Log
from paragraph.rules.library import default_library
from paragraph.rules.match import apply_match
from paragraph.rules.parametric import PoolAfterConv

RULE_ID = "pool-after-conv1x1"


def pools_after_convs(graph: Graph, *, log: Log | None = None
                      ) -> tuple[Graph, list[str]]:
    """``graph`` (an operator graph, NCHW) with every average pool that feeds only a narrowing
    1 x 1 convolution moved after it (`RULE_ID`); also what was moved, as ``"<rule id>:
    <convolution name>"``."""
    rule = default_library().get_as(RULE_ID, PoolAfterConv)
    done = []
    while True:  # one at a time: each rewrite renumbers what it touched
        found = ((m, apply_match(graph, m)) for m in rule.find(graph))
        match, new = next(((m, g) for m, g in found if g is not None), (None, None))
        if match is None or new is None:
            break
        conv, pool = (graph[i] for i in match.nodes)
        name = conv.name or f"conv{conv.id}"
        done.append(f"{RULE_ID}: {name}")
        if log is not None:
            log(f"  pool {pool.name or pool.id} ({pool.type.shape[1]} channels) moved after "
                f"{name} ({conv.type.shape[1]} channels)")
        graph = new
    graph.validate()
    return graph, done
