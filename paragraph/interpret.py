"""Running a `Graph` with the numpy references of `paragraph.ops` (torch.fx's Interpreter
analogue): whole graphs for tests and rule checks, and weight-only subgraphs folded at build
time (TASO section 2.8). No TVM."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import numpy as np

from paragraph.graph import Graph, Node, TensorRef
from paragraph.ops import SPECS, compute

# a numpy reference for opaque nodes: the node and its argument arrays in, its outputs out
OpaqueReference = Callable[[Node, list[np.ndarray]], Sequence[np.ndarray]]


def run_graph(graph: Graph, inputs: Sequence[np.ndarray],
              opaque: OpaqueReference | None = None,
              each: Callable[[np.ndarray], np.ndarray] | None = None) -> list[np.ndarray]:
    """Execute ``graph`` with the numpy references (no TVM); opaque nodes run with ``opaque``
    where given (the caller knows the operators it put there: the differential fuzzer), else
    raise. ``each`` (where given) is applied to every value as it is made (inputs, weights,
    every operator's outputs): the fuzzer computes in float64 with each value widened and
    nudged as a float32 rounding would, to tell how much an output amplifies rounding."""
    if len(inputs) != len(graph.inputs):
        raise ValueError(f"graph takes {len(graph.inputs)} inputs, got {len(inputs)}")

    def widened(v: np.ndarray) -> np.ndarray:
        return np.asarray(v) if each is None else each(np.asarray(v))

    values: dict[TensorRef, np.ndarray] = {}
    feed = dict(zip(graph.inputs, inputs, strict=True))
    for n in graph.nodes:
        if n.kind == "input":
            outs = [widened(feed[n.id])]
        elif n.kind in ("weight", "constant"):
            assert n.value is not None  # `Graph.validate` checks that weights hold arrays
            outs = [widened(n.value)]
        elif n.kind in SPECS:
            outs = compute(n.kind, [values[r] for r in n.inputs], n.attrs)
        elif n.kind == "opaque" and opaque is not None:
            outs = [np.asarray(v) for v in opaque(n, [values[r] for r in n.inputs])]
        else:
            raise NotImplementedError(f"no numpy reference for {n!r}")
        for i, v in enumerate(outs):
            values[TensorRef(n.id, i)] = v if n.kind in ("input", "weight", "constant") \
                else widened(v)
    return [values[r] for r in graph.outputs]


def fold_weights(graph: Graph, only: Collection[int] | None = None) -> Graph:
    """Pre-compute operators whose inputs are all weights or constants (TASO section 2.8).

    Each such node (and, transitively, what it feeds) is evaluated with the numpy references
    and replaced by weight nodes holding its outputs, so a concatenated or zero-padded kernel
    is computed once. ``only`` (node ids) limits folding to those nodes, e.g. the ones a
    rewrite added. Opaque nodes are never folded.
    """
    values: dict[TensorRef, np.ndarray] = {}
    for n in graph.nodes:
        if n.kind in ("weight", "constant"):
            assert n.value is not None  # `Graph.validate` checks that weights hold arrays
            values[n.out] = n.value
    removed, added, remap = [], [], {}
    next_id = graph.next_id
    for n in graph.nodes:
        if (n.is_source or n.kind not in SPECS or (only is not None and n.id not in only)
                or not n.inputs or not all(r in values for r in n.inputs)):
            continue
        outs = compute(n.kind, [values[r] for r in n.inputs], n.attrs)
        removed.append(n.id)
        for i, (v, t) in enumerate(zip(outs, n.outputs, strict=True)):
            v = np.ascontiguousarray(np.asarray(v).astype(t.dtype, copy=False))
            w = Node(id=next_id, kind="weight" if v.size > 1 else "constant", outputs=(t,),
                     value=v, name=f"{n.name}_folded" if n.name else "")
            next_id += 1
            added.append(w)
            values[TensorRef(n.id, i)] = v
            remap[TensorRef(n.id, i)] = w.out
    if not removed:
        return graph
    return graph.replace_subgraph(removed, added, remap).without_dead_nodes()
