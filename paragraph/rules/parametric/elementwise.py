"""Element-wise schemas: SRU's gate distributed, x*y + (1-x)*z -> x*(y-z) + z (MetaFlow
section 6)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paragraph.graph import Graph, GraphBuilder, TensorRef
from paragraph.rules.match import Builder, Match, commit
from paragraph.rules.parametric.base import Obligation, ParametricRule, Schema, ship
from paragraph.rules.parametric.predicates import only_reader
from paragraph.rules.specs import app, var


@ship(11, "metaflow-sru", "x*y + (1-x)*z -> x*(y-z) + z", "MetaFlow section 6")
@dataclass(frozen=True)
class SruDistribute(ParametricRule):
    """x*y + (1-x)*z  =>  x*(y-z) + z: 4 element-wise operators to 3 (MetaFlow section 6,
    the SRU rewrite TensorRT missed; axioms ``sub``, 5, 4, 8, 27, 1, 2)."""

    SCHEMA = Schema(
        "sru_distribute",
        source="add(multiply(x, y), multiply(subtract(1, x), z))",
        target="add(multiply(x, subtract(y, z)), z)",
        constraints=(
            "x, y, z of the output's shape",
            "the constant is all ones",
            "intermediates read only inside the match",
        ),
        outputs="add -> add")

    def find(self, graph: Graph) -> list[Match]:
        out = []
        for add in graph.nodes:
            if add.kind != "add":
                continue
            for m1_ref, m2_ref in (add.inputs, add.inputs[::-1]):
                m1, m2 = graph[m1_ref.node], graph[m2_ref.node]
                if m1.kind != "multiply" or m2.kind != "multiply" or m1.id == m2.id:
                    continue
                for s_ref, z in (m2.inputs, m2.inputs[::-1]):
                    s = graph[s_ref.node]
                    if s.kind != "subtract" or not _is_ones(graph, s.inputs[0]):
                        continue
                    x = s.inputs[1]
                    for a, y in (m1.inputs, m1.inputs[::-1]):
                        if a != x or not (graph.type_of(x) == graph.type_of(y)
                                          == graph.type_of(z) == add.type):
                            continue
                        if (only_reader(graph, m1.out, add.id)
                                and only_reader(graph, m2.out, add.id)
                                and only_reader(graph, s.out, m2.id)):
                            out.append(Match(self, (add.id, m1.id, m2.id, s.id),
                                             extra={"x": x, "y": y, "z": z}))
        return _unique(out)

    def rewrite(self, graph: Graph, match: Match) -> Graph | None:
        x, y, z = (match.extra[k] for k in "xyz")
        add = graph[match.nodes[0]]
        b = Builder(graph)
        d = b.op("subtract", [y, z], {})
        m = b.op("multiply", [x, d.out], {})
        new = b.op("add", [m.out, z], {}, name=add.name)
        return commit(graph, match.nodes, b, {add.out: new.out})

    def obligations(self) -> list[Obligation]:
        x, y, z = var("x"), var("y"), var("z")
        lhs = app("ewadd", app("ewmul", x, y), app("ewmul", app("ewsub", app("ones"), x), z))
        rhs = app("ewadd", app("ewmul", x, app("ewsub", y, z)), z)
        return [("x*y + (1-x)*z = x*(y-z) + z", [lhs], [rhs], ())]

    def example(self, rng: np.random.Generator) -> Graph:
        b = GraphBuilder()
        shape = (int(rng.integers(1, 4)), int(rng.integers(1, 6)))
        x, y, z = (b.input(shape) for _ in range(3))
        f = b.op("sigmoid", [x]).out
        one = b.constant(np.float32(1.0))
        left = b.op("multiply", [f, y]).out
        right = b.op("multiply", [b.op("subtract", [one, f]).out, z]).out
        return b.build([b.op("add", [left, right]).out])


def _is_ones(graph: Graph, t: TensorRef) -> bool:
    node = graph[t.node]
    return node.kind in ("weight", "constant") and bool(np.all(node.value == 1))


def _unique(matches: list[Match]) -> list[Match]:
    seen, out = set(), []
    for m in matches:
        key = frozenset(m.nodes)
        if key not in seen:
            seen.add(key)
            out.append(m)
    return out

