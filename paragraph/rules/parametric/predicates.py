"""What the parametric rules ask of a graph: weights and their values, a value's only reader,
plain and centred convolutions, and which candidates to try together."""

from __future__ import annotations

import itertools
from typing import TypeVar

import numpy as np

from paragraph.graph import Graph, Node, TensorRef
from paragraph.rules.match import EVERY_PAIR_UP_TO

T = TypeVar("T")


def is_weight(graph: Graph, t: TensorRef) -> bool:
    """``t`` is a weight or a constant (a value the graph holds, which a rewrite may fold)."""
    return graph[t.node].kind in ("weight", "constant")


def value_of(graph: Graph, t: TensorRef) -> np.ndarray:
    """The array of weight or constant ``t`` (a valid graph gives every one its value)."""
    value = graph[t.node].value
    assert value is not None, f"{graph[t.node]!r} has no value"
    return value


def only_reader(graph: Graph, t: TensorRef, reader: int) -> bool:
    """``t`` is read by ``reader`` alone and is not a graph output."""
    return graph.users(t.node) == [reader] and t not in graph.outputs


def centred(node: Node, graph: Graph) -> bool:
    """A conv/pool whose padding is SAME (k // 2 each side, odd k) or none for 1x1."""
    a = node.attrs
    if node.kind == "conv2d":
        kh, kw = graph.type_of(node.inputs[1]).shape[2:]
    else:
        kh, kw = a["pool_size"]
    return kh % 2 == 1 and kw % 2 == 1 and tuple(a["padding"]) == (kh // 2, kw // 2) * 2


def plain_conv(node: Node, graph: Graph) -> bool:
    """A convolution of data by a weight kernel, without dilation or a change of dtype: one
    whose kernel a rule may cut, concatenate or rewrite."""
    a = node.attrs
    return (node.kind == "conv2d" and len(node.inputs) == 2 and a["dilation"] == (1, 1)
            and a["out_dtype"] in (None, node.type.dtype) and is_weight(graph, node.inputs[1]))


def groups_and_pairs(items: list[T]) -> list[list[T]]:
    """The whole group and, when it has more than two members, every pair of it (only the
    pairs of neighbours in ``items``' order once it has more than `EVERY_PAIR_UP_TO`)."""
    if len(items) < 2:
        return []
    out = [items]
    if len(items) > EVERY_PAIR_UP_TO:
        out += [[a, b] for a, b in itertools.pairwise(items)]
    elif len(items) > 2:
        out += [list(p) for p in itertools.combinations(items, 2)]
    return out


def member_ancestry(graph: Graph, members: list[int]) -> dict[int, int]:
    """For each of ``members``, a bit set (bit i: ``members[i]``) of the other members it
    depends on: one pass in topological order, not one search per member."""
    bit = {m: 1 << i for i, m in enumerate(members)}
    below: dict[int, int] = {}  # node id -> members at or above it
    for node in graph.nodes:
        mask = 0
        for r in node.inputs:
            mask |= below.get(r.node, 0)
        if mask or node.id in bit:
            below[node.id] = mask | bit.get(node.id, 0)
    return {m: below.get(m, 0) & ~bit[m] for m in members}
