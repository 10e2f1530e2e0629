"""A convolution's per-channel element-wise chain (bias, batch-norm scale and shift,
activation): finding it in a graph, cutting its constants by channels, and the obligations
that carry it through a split or a merge of the convolution (`SplitConv`, `MergeConvs`)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

from paragraph.graph import Graph, Node, TensorRef
from paragraph.rules.parametric.base import Obligation
from paragraph.rules.parametric.predicates import is_weight, value_of
from paragraph.rules.parametric.terms import balanced_concat
from paragraph.rules.specs import Term, app, var

CHAIN_UNARY = ("relu", "sigmoid", "tanh", "gelu")
CHAIN_BINARY = ("add", "subtract", "multiply", "divide")
# one operator of a chain: (kind,) if unary, (kind, position of its constant) if binary
ChainStep = tuple[str] | tuple[str, int]


def chain_step(graph: Graph, node: Node, value: int, channels: int) -> ChainStep | None:
    """What ``node`` is as the next operator of a convolution's per-channel chain after
    ``value`` (which has ``channels`` channels): ``(kind,)`` for a unary operator,
    ``(kind, position of the constant)`` for one with a per-channel (or scalar) constant; None
    if it is neither."""
    if node.kind in CHAIN_UNARY and len(node.inputs) == 1:
        return (node.kind,)
    if node.kind not in CHAIN_BINARY or len(node.inputs) != 2:
        return None
    pos = 0 if is_weight(graph, node.inputs[0]) else 1
    const, other = node.inputs[pos], node.inputs[1 - pos]
    if (other.node != value or not is_weight(graph, const) or node.type != graph[value].type
            or channel_slice(value_of(graph, const), channels, 0, 1) is None):
        return None
    return (node.kind, pos)


def conv_chain(graph: Graph, conv: Node, within: Collection[int] | None = None
               ) -> tuple[int, ...]:
    """The per-channel element-wise operators after ``conv`` (`chain_step`), each the only
    reader of the value before it, which is no graph output; with ``within``, only operators
    among those ids (one fused kernel's). What `SplitConv` splits and `MergeConvs` merges
    along with the convolution."""
    channels, chain, value = conv.type.shape[1], [], conv.id
    while True:
        users = graph.users(value)
        if (len(users) != 1 or TensorRef(value) in graph.outputs
                or within is not None and users[0] not in within):
            break
        if chain_step(graph, graph[users[0]], value, channels) is None:
            break
        chain.append(users[0])
        value = users[0]
    return tuple(chain)


def chain_signature(graph: Graph, conv: Node,
                    chain: Sequence[int]) -> tuple[ChainStep, ...] | None:
    """The steps of ``chain`` after ``conv`` (None if it is not such a chain)."""
    steps, value = [], conv.id
    for i in chain:
        if graph.users(value) != [i] or TensorRef(value) in graph.outputs:
            return None
        step = chain_step(graph, graph[i], value, conv.type.shape[1])
        if step is None:
            return None
        steps.append(step)
        value = i
    return tuple(steps)


def per_channel(value: np.ndarray, channels: int) -> np.ndarray:
    """A chain constant (`channel_slice` accepts it) as a (1, C, 1, 1) array."""
    v = np.asarray(value)
    return np.full((1, channels, 1, 1), v.reshape(()), v.dtype) if v.size == 1 else \
        v.reshape(1, channels, 1, 1)


def chain_obligations(parts: int) -> list[Obligation]:
    """Every chain operator commutes with a concat of ``parts`` pieces along channels (its
    constant cut the same way): what carries a chain through a split or a merge."""
    xs, cs = [var(f"y{i}") for i in range(parts)], [var(f"c{i}") for i in range(parts)]
    out: list[Obligation] = []
    for f in CHAIN_UNARY:
        out.append((f"{f} after it", [app(f, balanced_concat(xs, -3))],
                    [balanced_concat([app(f, y) for y in xs], -3)], ()))
    for f in ("ewadd", "ewsub", "ewmul"):  # divide by a constant: multiply, reciprocal
        for pos in (0, 1):
            def op(a: Term, b: Term, f: str = f, pos: int = pos) -> Term:
                return app(f, b, a) if pos == 0 else app(f, a, b)
            out.append((f"{f} of a per-channel constant (operand {pos}) after it",
                        [op(balanced_concat(xs, -3), balanced_concat(cs, -3))],
                        [balanced_concat([op(y, c) for y, c in zip(xs, cs, strict=True)],
                                         -3)], ()))
    return out


def channel_slice(value: np.ndarray, channels: int, lo: int, hi: int) -> np.ndarray | None:
    """Channels lo..hi of a constant that broadcasts per channel over NCHW (None if it does
    not); shape kept as (..., hi - lo, 1, 1)."""
    v = np.asarray(value)
    if v.size == 1:
        return v
    if v.ndim < 3 or v.shape[-2:] != (1, 1) or v.shape[-3] != channels or any(
            d != 1 for d in v.shape[:-3]):
        return None
    return np.ascontiguousarray(v[..., lo:hi, :, :])

