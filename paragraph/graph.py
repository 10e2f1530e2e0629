"""The op graph IR: the one data structure every part of paragraph speaks.

A `Graph` is an immutable DAG of `Node`s in topological order. A node is an operator (a `kind`
such as ``"conv2d"`` with attributes), a graph input, a weight or a constant (both keep their
arrays, so weight-only subgraphs can be folded at build time), or an ``"opaque"`` node that
carries any Relax operator paragraph does not model. Tensors are named by `TensorRef` (node id,
output index). Like torch.fx, it is small on purpose: everything else (rules, search, schedules,
the Relax round trip) builds on these few types.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from paragraph import ops
from paragraph.dag import CycleError, toposort
from paragraph.errors import GraphError
from paragraph.tensor import TensorRef, TensorType

__all__ = ["Attrs", "Graph", "GraphBuilder", "Node", "SOURCE_KINDS", "TensorRef", "TensorType"]

SOURCE_KINDS = frozenset({"input", "weight", "constant"})


class Attrs(Mapping[str, Any]):
    """An immutable, hashable attribute mapping with sorted keys."""

    __slots__ = ("_items", "_dict")

    def __init__(self, items: Mapping[str, Any] | Iterable[tuple[str, Any]] = ()) -> None:
        d = dict(items)
        self._items = tuple(sorted(d.items()))
        self._dict = dict(self._items)

    def __getitem__(self, key: str) -> Any:
        return self._dict[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._dict)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self) == dict(other)

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{k}={v!r}" for k, v in self._items) + "}"

    def __reduce__(self) -> tuple[type[Attrs], tuple[tuple[tuple[str, Any], ...]]]:
        return (Attrs, (self._items,))


@dataclass(frozen=True, eq=False)
class Node:
    """One operator, input, weight or constant.

    ``attrs`` must hold plain, hashable Python values (ints, floats, strings, tuples, None):
    they enter the structural hash. ``value`` is the array of a weight or constant.
    ``payload`` is whatever an opaque node needs to be rebuilt (for Relax: the original call);
    it never enters the hash, so opaque nodes must describe themselves fully in ``attrs``.
    """

    id: int
    kind: str
    inputs: tuple[TensorRef, ...] = ()
    outputs: tuple[TensorType, ...] = ()
    attrs: Mapping[str, Any] = field(default_factory=Attrs)  # stored as an `Attrs`
    name: str = ""
    value: np.ndarray | None = None
    payload: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.attrs, Attrs):
            object.__setattr__(self, "attrs", Attrs(self.attrs))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))

    @property
    def out(self) -> TensorRef:
        """The reference to this node's first output."""
        return TensorRef(self.id, 0)

    @property
    def type(self) -> TensorType:
        """The type of this node's only (first) output."""
        return self.outputs[0]

    @property
    def is_source(self) -> bool:
        return self.kind in SOURCE_KINDS

    def local_digest(self) -> bytes:
        """Digest of what the node is apart from its inputs: kind, attributes, output types
        and (weights, constants) its array (cached: the structural hash's inner loop)."""
        cached = self.__dict__.get("_local")
        if cached is None:
            h = hashlib.blake2b(repr((self.kind, self.attrs, self.outputs)).encode(),
                                digest_size=16)
            if self.kind != "input" and self.value is not None:
                h.update(self.content_digest())
            cached = h.digest()
            object.__setattr__(self, "_local", cached)
        return cached

    def content_digest(self) -> bytes:
        """Digest of a weight's or constant's array (cached: nodes are immutable)."""
        cached = self.__dict__.get("_digest")
        if cached is None:
            arr = np.ascontiguousarray(self.value)
            h = hashlib.blake2b(digest_size=16)
            h.update(f"{arr.dtype.str}{arr.shape}".encode())
            h.update(arr.data)
            cached = h.digest()
            object.__setattr__(self, "_digest", cached)
        return cached

    def replace(self, **changes: Any) -> Node:
        """A copy of this node with some fields changed."""
        fields = {k: getattr(self, k) for k in
                  ("id", "kind", "inputs", "outputs", "attrs", "name", "value", "payload")}
        fields.update(changes)
        return Node(**fields)

    def __repr__(self) -> str:
        args = ", ".join(map(str, self.inputs))
        outs = ", ".join(map(str, self.outputs))
        attrs = f" {self.attrs!r}" if self.attrs else ""
        label = f" '{self.name}'" if self.name else ""
        return f"%{self.id}{label} = {self.kind}({args}){attrs} -> {outs}"


class Graph:
    """An immutable DAG of nodes in topological order, with ordered inputs and outputs.

    Build one with `GraphBuilder`; derive new graphs with `replace_subgraph`. ``meta`` carries
    context that is not part of the structure (e.g. the Relax functions opaque nodes call).
    """

    def __init__(self, nodes: Sequence[Node], outputs: Sequence[TensorRef],
                 meta: Mapping[str, Any] | None = None) -> None:
        self.nodes: tuple[Node, ...] = tuple(nodes)
        self.outputs: tuple[TensorRef, ...] = tuple(outputs)
        self.meta: dict[str, Any] = dict(meta or {})
        self._by_id = {n.id: n for n in self.nodes}
        if len(self._by_id) != len(self.nodes):
            raise GraphError("duplicate node ids")
        self.inputs: tuple[int, ...] = tuple(n.id for n in self.nodes if n.kind == "input")
        self._hash: str | None = None
        self._users: dict[int, list[int]] | None = None

    # -- lookup
    def __getitem__(self, node_id: int) -> Node:
        return self._by_id[node_id]

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._by_id

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def type_of(self, ref: TensorRef) -> TensorType:
        """The type of a tensor."""
        return self._by_id[ref.node].outputs[ref.index]

    @property
    def operators(self) -> list[Node]:
        """The operator nodes (everything but inputs, weights and constants), in order."""
        return [n for n in self.nodes if not n.is_source]

    @property
    def next_id(self) -> int:
        """An id no node of this graph uses."""
        return max(self._by_id, default=-1) + 1

    def users(self, node_id: int) -> list[int]:
        """Ids of the nodes that read any output of ``node_id``, in topological order."""
        if self._users is None:
            users: dict[int, list[int]] = {n.id: [] for n in self.nodes}
            for n in self.nodes:
                for src in dict.fromkeys(r.node for r in n.inputs):
                    users[src].append(n.id)
            self._users = users
        return self._users[node_id]

    # -- derived views
    def topological_order(self) -> list[int]:
        """Node ids in a topological order (the stored order)."""
        return [n.id for n in self.nodes]

    def ancestors(self, node_id: int) -> set[int]:
        """Ids of every node ``node_id`` transitively depends on (not itself)."""
        seen: set[int] = set()
        stack = [r.node for r in self._by_id[node_id].inputs]
        while stack:
            nid = stack.pop()
            if nid not in seen:
                seen.add(nid)
                stack.extend(r.node for r in self._by_id[nid].inputs)
        return seen

    def descendants(self, node_id: int) -> set[int]:
        """Ids of every node that transitively depends on ``node_id`` (not itself)."""
        seen: set[int] = set()
        stack = list(self.users(node_id))
        while stack:
            nid = stack.pop()
            if nid not in seen:
                seen.add(nid)
                stack.extend(self.users(nid))
        return seen

    def longest_path(self, cost: Mapping[int, float]) -> tuple[float, list[int]]:
        """The longest path by summed node costs, and its node ids from source to sink.

        Nodes missing from ``cost`` cost 0 (inputs and weights usually are).
        """
        best: dict[int, float] = {}
        prev: dict[int, int | None] = {}
        for n in self.nodes:
            preds = {r.node for r in n.inputs}
            p = max(preds, key=lambda i: best[i], default=None)
            best[n.id] = cost.get(n.id, 0.0) + (best[p] if p is not None else 0.0)
            prev[n.id] = p
        if not best:
            return 0.0, []
        end = max(best, key=lambda i: best[i])
        path: list[int] = []
        step: int | None = end
        while step is not None:
            path.append(step)
            step = prev[step]
        return best[end], path[::-1]

    # -- structural hash
    def structural_hash(self) -> str:
        """A canonical hash of the structure: independent of node ids and names.

        Each node's hash combines its kind, attributes, output types, its inputs' hashes (in
        order, with output index), a weight's array digest, and an input's position. The graph
        hash combines the ordered output hashes with the sorted multiset of all node hashes, so
        dead nodes and duplicates count too.
        """
        if self._hash is None:
            position = {nid: i for i, nid in enumerate(self.inputs)}
            node_hash: dict[int, bytes] = {}
            for n in self.nodes:
                h = hashlib.blake2b(n.local_digest(), digest_size=16)
                for r in n.inputs:
                    h.update(node_hash[r.node])
                    h.update(r.index.to_bytes(4, "little"))
                if n.kind == "input":
                    h.update(f"input{position[n.id]}".encode())
                node_hash[n.id] = h.digest()
            g = hashlib.blake2b(digest_size=16)
            for r in self.outputs:
                g.update(node_hash[r.node])
                g.update(r.index.to_bytes(4, "little"))
            for d in sorted(node_hash.values()):
                g.update(d)
            self._hash = g.hexdigest()
        return self._hash

    def __hash__(self) -> int:
        return hash(self.structural_hash())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Graph) and self.structural_hash() == other.structural_hash()

    # -- checks
    def validate(self) -> None:
        """Check acyclicity (inputs precede users), references and types; raise `GraphError`.

        Operators paragraph models have their output types recomputed from their inputs
        (`paragraph.ops`); opaque nodes are trusted to declare their own.
        """
        seen: set[int] = set()
        for n in self.nodes:
            for r in n.inputs:
                if r.node not in self._by_id:
                    raise GraphError(f"{n!r}: input {r} names no node")
                if r.node not in seen:
                    raise GraphError(f"{n!r}: input {r} does not precede it (cycle or bad order)")
                if not 0 <= r.index < len(self._by_id[r.node].outputs):
                    raise GraphError(f"{n!r}: input {r} has no such output")
            if not n.outputs:
                raise GraphError(f"{n!r}: node has no outputs")
            if n.kind in ("weight", "constant"):
                if n.value is None:
                    raise GraphError(f"{n!r}: {n.kind} without a value")
                if (tuple(n.value.shape) != n.type.shape
                        or str(n.value.dtype) != n.type.dtype):
                    raise GraphError(f"{n!r}: value is {n.value.dtype}{list(n.value.shape)}")
            elif n.kind in ops.SPECS:
                in_types = [self.type_of(r) for r in n.inputs]
                try:
                    expected = ops.infer(n.kind, in_types, n.attrs)
                except (ValueError, KeyError, IndexError, TypeError) as e:
                    raise GraphError(f"{n!r}: {e}") from e
                if tuple(expected) != n.outputs:
                    raise GraphError(f"{n!r}: outputs should be "
                                     f"{', '.join(map(str, expected))}")
            seen.add(n.id)
        for r in self.outputs:
            if r.node not in self._by_id or not 0 <= r.index < len(self[r.node].outputs):
                raise GraphError(f"graph output {r} names no tensor")

    # -- rewriting
    def replace_subgraph(self, removed: Iterable[int], added: Sequence[Node],
                         remap: Mapping[TensorRef, TensorRef]) -> Graph:
        """A new graph without ``removed``, with ``added``, and readers rewired by ``remap``.

        ``added`` nodes need fresh ids (from `next_id`) and may read any surviving or added
        tensor. Every output of a removed node that a surviving node or the graph output reads
        must be in ``remap``. The result is re-sorted topologically (stable for untouched nodes);
        a cycle raises `GraphError` (TASO fig. 2.6: a rewrite must not create one).
        """
        removed = set(removed)
        for n in added:
            if n.id in self._by_id and n.id not in removed:
                raise GraphError(f"added node id {n.id} is already used")
        for old in remap:
            if old.node not in removed:
                raise GraphError(f"remap source {old} is not a removed tensor")

        def rewire(r: TensorRef) -> TensorRef:
            if r.node in removed:
                if r not in remap:
                    raise GraphError(f"tensor {r} of a removed node is still read")
                return remap[r]
            return r

        kept = [n for n in self.nodes if n.id not in removed]
        kept = [n.replace(inputs=tuple(map(rewire, n.inputs)))
                if any(r.node in removed for r in n.inputs) else n for n in kept]
        added = [n.replace(inputs=tuple(map(rewire, n.inputs))) for n in added]
        outputs = [rewire(r) for r in self.outputs]
        return Graph(_toposort(kept + list(added)), outputs, self.meta)

    def without_dead_nodes(self) -> Graph:
        """The graph without nodes no output depends on (inputs are always kept)."""
        live: set[int] = set()
        stack = [r.node for r in self.outputs]
        while stack:
            nid = stack.pop()
            if nid not in live:
                live.add(nid)
                stack.extend(r.node for r in self._by_id[nid].inputs)
        nodes = [n for n in self.nodes if n.id in live or n.kind == "input"]
        return self if len(nodes) == len(self.nodes) else Graph(nodes, self.outputs, self.meta)

    # -- display
    def __repr__(self) -> str:
        lines = [repr(n) for n in self.nodes]
        lines.append("return " + ", ".join(map(str, self.outputs)))
        return "\n".join(lines)

    def summary(self) -> str:
        """One line: node counts by kind."""
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.kind] = counts.get(n.kind, 0) + 1
        body = ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
        return f"Graph({len(self.nodes)} nodes: {body})"

    def to_dot(self, *, show_weights: bool = False) -> str:
        """A Graphviz dot description (weights and constants hidden unless asked for)."""
        hidden = set() if show_weights else {n.id for n in self.nodes
                                             if n.kind in ("weight", "constant")}
        out = ["digraph paragraph {", "  rankdir=TB;", '  node [shape=box, fontsize=10];']
        for n in self.nodes:
            if n.id in hidden:
                continue
            label = n.kind if n.kind != "opaque" else str(n.attrs.get("op", "opaque"))
            label += f"\\n{n.name}" if n.name else ""
            label += "\\n" + ", ".join(map(str, n.outputs))
            shape = "ellipse" if n.is_source else "box"
            out.append(f'  n{n.id} [label="{_dot_escape(label)}", shape={shape}];')
            for r in n.inputs:
                if r.node not in hidden:
                    out.append(f"  n{r.node} -> n{n.id};")
        for i, r in enumerate(self.outputs):
            out.append(f'  out{i} [label="output {i}", shape=ellipse];')
            out.append(f"  n{r.node} -> out{i};")
        out.append("}")
        return "\n".join(out) + "\n"


def _dot_escape(s: str) -> str:
    return s.replace('"', '\\"')


def _toposort(nodes: Sequence[Node]) -> list[Node]:
    """``nodes`` in a stable topological order (`paragraph.dag.toposort`)."""
    by_id = {n.id: n for n in nodes}
    for n in nodes:
        for r in n.inputs:
            if r.node not in by_id:
                raise GraphError(f"{n!r}: input %{r.node} names no node")
    try:
        order = toposort(list(by_id), {n.id: [r.node for r in n.inputs] for n in nodes})
    except CycleError as e:
        raise GraphError(f"the graph has a cycle through nodes {e.stuck[:10]}") from None
    return [by_id[i] for i in order]


class GraphBuilder:
    """Mutable helper that appends nodes in order and produces an immutable `Graph`."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self._types: dict[int, tuple[TensorType, ...]] = {}

    def _add(self, **fields: Any) -> Node:
        node = Node(id=len(self.nodes), **fields)
        self.nodes.append(node)
        self._types[node.id] = node.outputs
        return node

    def type_of(self, ref: TensorRef) -> TensorType:
        return self._types[ref.node][ref.index]

    def input(self, shape: Sequence[int], dtype: str = "float32", name: str = "") -> TensorRef:
        """A graph input (its position among inputs is its identity)."""
        return self._add(kind="input", outputs=(TensorType(tuple(shape), dtype),), name=name).out

    def weight(self, value: np.ndarray, name: str = "", kind: str = "weight") -> TensorRef:
        """A weight (or, with ``kind="constant"``, a constant) holding ``value``."""
        value = np.asarray(value)
        t = TensorType(tuple(value.shape), str(value.dtype))
        return self._add(kind=kind, outputs=(t,), value=value, name=name).out

    def constant(self, value: np.ndarray | float, dtype: str = "float32",
                 name: str = "") -> TensorRef:
        """A constant (a scalar or small array that is not a learned weight)."""
        return self.weight(np.asarray(value, dtype=dtype), name=name, kind="constant")

    def op(self, kind: str, inputs: Sequence[TensorRef], attrs: Mapping[str, Any] | None = None,
           *, outputs: Sequence[TensorType] | None = None, name: str = "",
           payload: Any = None) -> Node:
        """Append an operator; modeled kinds get canonical attributes and inferred outputs."""
        in_types = [self.type_of(r) for r in inputs]
        attrs = Attrs(ops.canonical(kind, attrs or {}, in_types) if kind in ops.SPECS
                      else attrs or {})
        if outputs is None:
            outputs = ops.infer(kind, in_types, attrs)
        return self._add(kind=kind, inputs=tuple(inputs), outputs=tuple(outputs), attrs=attrs,
                         name=name, payload=payload)

    def build(self, outputs: Sequence[TensorRef], meta: Mapping[str, Any] | None = None) -> Graph:
        """The finished graph, validated."""
        g = Graph(self.nodes, outputs, meta)
        g.validate()
        return g
