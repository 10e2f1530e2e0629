"""Matmul schemas: matmuls (or linears) that share their input merged along the weights'
columns (TASO fig. 2.2b), and matmuls that share their weight merged along the inputs' rows
(TASO axiom 36 for rows)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from paragraph.graph import Graph, GraphBuilder, Node, TensorRef
from paragraph.rules.match import Builder, Match, commit
from paragraph.rules.parametric.base import Obligation, ParametricRule, Schema, ship
from paragraph.rules.parametric.predicates import groups_and_pairs, is_weight, member_ancestry
from paragraph.rules.parametric.terms import nested_concat, nested_split
from paragraph.rules.specs import app, var


def _split_back(graph: Graph, b: Builder, nodes: Sequence[Node], merged: TensorRef,
                axis: int) -> Graph | None:
    """Split ``merged`` along ``axis`` into the merged ``nodes``' outputs (each its own size
    there) and commit: their readers read the pieces."""
    cuts = list(itertools.accumulate(n.type.shape[axis] for n in nodes))[:-1]
    split = b.op("split", [merged], {"indices_or_sections": tuple(cuts), "axis": axis})
    remap = {n.out: TensorRef(split.id, i) for i, n in enumerate(nodes)}
    return commit(graph, [n.id for n in nodes], b, remap)


@ship(7, "taso-merge-matmuls", "merge matmuls sharing an operand (concat + split)",
      "TASO fig. 2.2b")
@dataclass(frozen=True)
class MergeMatmuls(ParametricRule):
    """n matmuls (or linears) reading the same input with weight matrices -> one with the
    weights concatenated, output split (TASO fig. 2.2b; axiom 36, and 35/32 for linear)."""

    SCHEMA = Schema(
        "merge_matmuls",
        source="matmul(x, W_i) (or linear(x, W_i, b_i)) for i = 1..n, n >= 2, the same x",
        target="split(matmul(x, concat_1(W_i))) (linear: concat_0 of W_i and b_i)",
        constraints=(
            "W_i (and b_i) weights",
            "W_i of rank 2",
        ),
        outputs="op_i -> split piece i")

    def find(self, graph: Graph) -> list[Match]:
        groups: dict[tuple[Any, ...], list[int]] = {}
        for n in graph.nodes:
            if n.kind == "matmul" and len(graph.type_of(n.inputs[1]).shape) == 2 and is_weight(
                    graph, n.inputs[1]) and len(n.type.shape) >= 2:
                groups.setdefault(("matmul", n.inputs[0], n.attrs), []).append(n.id)
            elif n.kind == "linear" and all(is_weight(graph, r) for r in n.inputs[1:]):
                groups.setdefault(("linear", n.inputs[0], len(n.inputs), n.attrs),
                                  []).append(n.id)
        return [Match(self, tuple(ids), extra={"ops": tuple(ids)})
                for ids in groups.values() for ids in groups_and_pairs(ids)]

    def rewrite(self, graph: Graph, match: Match) -> Graph | None:
        nodes = [graph[i] for i in match.extra["ops"]]
        b = Builder(graph)
        first = nodes[0]
        if first.kind == "matmul":
            w = b.op("concat", [n.inputs[1] for n in nodes], {"axis": 1})
            merged = b.op("matmul", [first.inputs[0], w.out], first.attrs, name=first.name)
        else:
            w = b.op("concat", [n.inputs[1] for n in nodes], {"axis": 0})
            args = [first.inputs[0], w.out]
            if len(first.inputs) == 3:
                args.append(b.op("concat", [n.inputs[2] for n in nodes], {"axis": 0}).out)
            merged = b.op("linear", args, first.attrs, name=first.name)
        return _split_back(graph, b, nodes, merged.out, len(first.type.shape) - 1)

    def obligations(self) -> list[Obligation]:
        out: list[Obligation] = []
        x = var("x")
        for n in (2, 3):
            ws = [var(f"w{i}") for i in range(n)]
            merged = app("matmul", x, nested_concat(ws, -1))
            out.append((f"matmul n={n}", [app("matmul", x, w) for w in ws],
                        nested_split(merged, n, -1), ()))
        ws, bs = [var("w0"), var("w1")], [var("b0"), var("b1")]
        lin = [app("ewadd", app("matmul", x, app("transpose", w)), bias)
               for w, bias in zip(ws, bs, strict=True)]
        merged = app("ewadd", app("matmul", x, app("transpose", nested_concat(ws, -2))),
                     nested_concat(bs, -1))
        out.append(("linear n=2: x W^T + b", lin, nested_split(merged, 2, -1), ()))
        return out

    def example(self, rng: np.random.Generator) -> Graph:
        b = GraphBuilder()
        k = int(rng.integers(2, 6))
        x = b.input((int(rng.integers(1, 4)), k))
        outs = []
        linear = bool(rng.integers(0, 2))
        for _ in range(int(rng.integers(2, 4))):
            m = int(rng.integers(1, 5))
            if linear:
                w = b.weight(rng.standard_normal((m, k)).astype("f4"))
                bias = b.weight(rng.standard_normal((m,)).astype("f4"))
                outs.append(b.op("linear", [x, w, bias]).out)
            else:
                w = b.weight(rng.standard_normal((k, m)).astype("f4"))
                outs.append(b.op("matmul", [x, w]).out)
        return b.build(outs)


@ship(8, "taso-merge-matmul-rows", "merge matmuls sharing a weight (concat rows + split)",
      "TASO axiom 36 for rows (36r)")
@dataclass(frozen=True)
class MergeMatmulRows(ParametricRule):
    """n matmuls of different inputs by the same weight matrix -> one matmul of the inputs'
    rows concatenated, output split by rows (TASO's axiom 36 for rows, 36r here): an RNN's
    input projections, one small product per step (each reading the whole matrix) batched
    into one that reads it once. Inputs that depend on another member's output (a
    recurrence) are not merged."""

    SCHEMA = Schema(
        "merge_matmul_rows",
        source="matmul(x_i, W) for i = 1..n, n >= 2, the same W",
        target="split_0(matmul(concat_0(x_i), W))",
        constraints=(
            "W a weight",
            "x_i, W and the outputs of rank 2",
            "no x_i depends on another member's output",
        ),
        outputs="op_i -> split piece i")

    def find(self, graph: Graph) -> list[Match]:
        groups: dict[tuple[Any, ...], list[int]] = {}
        for n in graph.nodes:
            if (n.kind == "matmul" and len(n.type.shape) == 2
                    and len(graph.type_of(n.inputs[0]).shape) == 2
                    and len(graph.type_of(n.inputs[1]).shape) == 2
                    and is_weight(graph, n.inputs[1])):
                groups.setdefault((n.inputs[1], n.attrs, graph.type_of(n.inputs[0]).dtype),
                                  []).append(n.id)
        out = []
        for ids in groups.values():
            if len(ids) < 2:
                continue
            above = member_ancestry(graph, ids)
            index = {m: i for i, m in enumerate(ids)}
            for group in groups_and_pairs(ids):
                mask = sum(1 << index[m] for m in group)
                if not any(above[m] & mask for m in group):
                    out.append(Match(self, tuple(group), extra={"ops": tuple(group)}))
        return out

    def rewrite(self, graph: Graph, match: Match) -> Graph | None:
        nodes = [graph[i] for i in match.extra["ops"]]
        b = Builder(graph)
        first = nodes[0]
        rows = b.op("concat", [n.inputs[0] for n in nodes], {"axis": 0})
        merged = b.op("matmul", [rows.out, first.inputs[1]], first.attrs, name=first.name)
        return _split_back(graph, b, nodes, merged.out, 0)

    def obligations(self) -> list[Obligation]:
        out: list[Obligation] = []
        w = var("w")
        for n in (2, 3):
            xs = [var(f"x{i}") for i in range(n)]
            merged = app("matmul", nested_concat(xs, -2), w)
            out.append((f"matmul rows n={n}", [app("matmul", x, w) for x in xs],
                        nested_split(merged, n, -2), ()))
        return out

    def example(self, rng: np.random.Generator) -> Graph:
        b = GraphBuilder()
        k, m = int(rng.integers(2, 6)), int(rng.integers(1, 5))
        w = b.weight(rng.standard_normal((k, m)).astype("f4"))
        outs = [b.op("matmul", [b.input((int(rng.integers(1, 4)), k)), w]).out
                for _ in range(int(rng.integers(2, 4)))]
        return b.build(outs)

