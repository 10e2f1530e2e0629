"""Model inputs: seeded samples that are valid for what reads them, and the range check that keeps
an index out of range from reaching a kernel.

TVM lowers `take` (an embedding's Gather) in its "fast" mode, which reads out of bounds without a
check: an id beyond the table is a wrong answer or a segfault. So every integer input that ends in
the indices of a gather gets the range its values must lie in (`index_ranges`, over the operator
graph the kernels are fused from), the samples that paragraph times kernels on are drawn from it
(`sample_inputs`), and inputs a user passes are checked against it before anything runs
(`check_index_ranges`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from paragraph.errors import InputError
from paragraph.graph import Graph, TensorType

# operators whose second input indexes their first, by name as the Relax importer records them
GATHERS = ("relax.take", "relax.gather_elements", "relax.gather_nd")
# how ONNX's importer lets a Gather take negative ids: where(ids < 0, ids + size, ids), which
# paragraph's import turns into a take in "wrap" mode (`importers._SafeTake`)
_WRAPS = ("relax.where",)
# what may lie between an input and a gather's indices for the input's values to be the
# indices: views and casts, and the wrap normalisation's compare and add (with its where)
_SAME_VALUES = frozenset({"reshape", "permute_dims", "strided_slice", "split"})
_SAME_VALUES_OPS = frozenset({"relax.astype", "relax.squeeze", "relax.expand_dims",
                              "relax.flatten", "relax.reshape", "relax.broadcast_to",
                              "relax.permute_dims"})
_NORMALISATION_OPS = frozenset({"relax.less", "relax.add", "add", "relax.where"})
DEFAULT_HIGH = 8  # integer inputs nothing indexes with: small non-negative values


@dataclass(frozen=True)
class IndexRange:
    """The values an integer input may hold: ``low <= v < high``, as ``reader`` needs."""

    low: int
    high: int
    reader: str  # the operator that indexes with it, for the error message

    def as_json(self) -> list[int | str]:
        """The range as a JSON-ready list (a compiled program stores its ranges)."""
        return [self.low, self.high, self.reader]

    @classmethod
    def from_json(cls, value: Sequence[Any]) -> IndexRange:
        """The range `as_json` wrote."""
        low, high, reader = value
        return cls(int(low), int(high), str(reader))


def _axis(attrs_text: str) -> int | None:
    """The ``axis`` of a take's attributes as the importer printed them (None: flattened)."""
    m = re.search(r"axis=(-?\d+|None)", attrs_text)
    return None if m is None or m.group(1) == "None" else int(m.group(1))


def _extent(graph: Graph, op: str, node_id: int) -> int:
    """How many entries the gather ``node_id`` can index."""
    node = graph[node_id]
    data, indices = (graph.type_of(r) for r in node.inputs[:2])
    if op == "relax.gather_nd":
        return min(data.shape[:indices.shape[-1]], default=1)
    axis = _axis(str(node.attrs.get("attrs", "")))
    if axis is None and op == "relax.take":
        return data.numel
    axis = 0 if axis is None else axis
    return data.shape[axis % len(data.shape)]


def index_ranges(graph: Graph) -> dict[int, IndexRange]:
    """Per integer input of ``graph`` (by position), the range its values must lie in so that
    every gather whose indices derive from it stays in bounds: [0, extent) (or [-extent, extent)
    where the model wraps negative ids, as ONNX's Gather does), the tightest over its readers.
    Inputs that no gather reads are absent."""
    position = {i: k for k, i in enumerate(graph.inputs)}
    ranges: dict[int, IndexRange] = {}
    for node in graph.operators:
        op = node.attrs.get("op") if node.kind == "opaque" else None
        if op not in GATHERS or len(node.inputs) < 2:
            continue
        extent = _extent(graph, str(op), node.id)
        feeding = graph.ancestors(node.inputs[1].node) | {node.inputs[1].node}
        for i in feeding & position.keys():
            if np.dtype(graph[i].type.dtype).kind not in "iu":
                continue
            on_path = feeding & (graph.descendants(i) | {i})
            if not _same_values(graph, on_path - {i}):
                continue  # indices computed from the input (RoBERTa's cumsum of a mask)
            wraps = 'mode="wrap"' in str(node.attrs.get("attrs", "")) \
                or any(graph[n].attrs.get("op") in _WRAPS for n in on_path)
            found = IndexRange(-extent if wraps else 0, extent,
                               f"{op} ({graph[node.id].name or f'node {node.id}'})")
            old = ranges.get(position[i])
            if old is None or found.high - found.low < old.high - old.low:
                ranges[position[i]] = found
    return ranges


def _same_values(graph: Graph, path: set[int]) -> bool:
    """Whether the nodes between an input and a gather pass the input's values on as the
    indices (views, casts, ONNX's negative-index normalisation): only then do the gather's
    bounds bound the input. Indices computed otherwise are the take's "clip" or "wrap" mode's
    to keep in bounds (`importers._SafeTake`), not the input's range: RoBERTa's position ids,
    a running count of its non-padding ids, gave its ids the range of a 2-row table."""
    ops = {graph[n].attrs.get("op") if graph[n].kind == "opaque" else graph[n].kind
           for n in path}
    normalised = "relax.where" in ops
    return all(op in _SAME_VALUES or op in _SAME_VALUES_OPS
               or (normalised and op in _NORMALISATION_OPS) for op in ops)


def sample_inputs(types: Sequence[TensorType], ranges: Mapping[int, IndexRange] | None = None,
                  seed: int = 0) -> list[np.ndarray]:
    """Seeded inputs of ``types``: standard normal floats; integers drawn from their
    `IndexRange` (non-negative part) or from [0, `DEFAULT_HIGH`); booleans 0 or 1."""
    rng = np.random.default_rng(seed)
    out = []
    for k, t in enumerate(types):
        kind = np.dtype(t.dtype).kind
        if kind == "f":
            out.append(rng.standard_normal(t.shape).astype(t.dtype))
        elif kind == "b":
            out.append(rng.integers(0, 2, t.shape).astype(t.dtype))
        else:
            r = (ranges or {}).get(k)
            high = DEFAULT_HIGH if r is None else max(r.high, 1)
            out.append(rng.integers(0, high, t.shape).astype(t.dtype))
    return out


def check_index_ranges(arrays: Sequence[object], ranges: Mapping[int, IndexRange],
                       names: Sequence[str] = ()) -> None:
    """Raise `InputError` naming the input, the value and the operator when an input holds a
    value outside its `IndexRange`: a gather would read out of bounds (or crash)."""
    for k, r in ranges.items():
        if k >= len(arrays):
            continue
        arr = arrays[k]
        a = arr.numpy() if hasattr(arr, "numpy") else np.asarray(arr)  # tvm and torch tensors
        if a.size == 0:
            continue
        lo, hi = int(a.min()), int(a.max())
        if lo < r.low or hi >= r.high:
            bad = lo if lo < r.low else hi
            where = tuple(int(x) for x in np.argwhere(a == bad)[0])
            name = f" ({names[k]!r})" if k < len(names) and names[k] else ""
            raise InputError(f"input {k}{name} holds {bad} at {list(where)}, out of range for "
                             f"{r.reader}: its values must lie in [{r.low}, {r.high})")
