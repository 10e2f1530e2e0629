"""Two algorithms on a DAG given as a topological order and predecessor lists, which the
operator graph, schedules and the scheduling algorithms share (one implementation each)."""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import TypeVar

T = TypeVar("T", bound=Hashable)


class CycleError(ValueError):
    """The predecessor lists have a cycle; ``stuck`` names (some of) the items on it."""

    def __init__(self, stuck: list[T]) -> None:
        super().__init__(f"cycle through {stuck[:10]}")
        self.stuck = stuck


def toposort(items: Sequence[T], preds: Mapping[T, Iterable[T]]) -> list[T]:
    """``items`` in a topological order of ``preds`` (Kahn's algorithm), stable: an item comes
    as early as its position in ``items`` and its predecessors allow. Raises `CycleError`."""
    rank = {k: i for i, k in enumerate(items)}
    pending: dict[T, int] = {}
    succs: dict[T, list[T]] = {k: [] for k in items}
    for k in items:
        ps = set(preds[k])
        pending[k] = len(ps)
        for p in ps:
            succs[p].append(k)
    ready = [(rank[k], k) for k in items if pending[k] == 0]
    heapq.heapify(ready)
    order: list[T] = []
    while ready:
        _, k = heapq.heappop(ready)
        order.append(k)
        for s in succs[k]:
            pending[s] -= 1
            if pending[s] == 0:
                heapq.heappush(ready, (rank[s], s))
    if len(order) != len(items):
        raise CycleError(sorted((k for k in items if pending[k] > 0), key=rank.__getitem__))
    return order


def lone(order: Sequence[T], preds: Mapping[T, Iterable[T]]) -> set[T]:
    """The items that nothing can run beside: every other item is an ancestor or a
    descendant. ``order`` is topological and ``preds`` lists predecessors among its items.
    They cut the DAG into segments that no schedule can overlap (an Inception stem
    convolution, the concat ending a block); unlike the cut nodes on every input-to-output
    path, they include an item that an edge bypasses (a -> v -> b beside a -> b)."""
    bit = {k: 1 << i for i, k in enumerate(order)}
    up: dict[T, int] = {}
    for k in order:
        mask = 0
        for p in preds[k]:
            mask |= up[p] | bit[p]
        up[k] = mask
    down = dict.fromkeys(order, 0)
    for k in reversed(order):
        for p in preds[k]:
            down[p] |= down[k] | bit[k]
    n = len(order)
    return {k for k in order if up[k].bit_count() + down[k].bit_count() + 1 == n}
