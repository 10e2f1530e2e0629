"""Matching rules in a `paragraph.graph.Graph` and rewriting the matches (MetaFlow section 3,
TASO sections 2.2 and 2.7).

Rule operators map onto the graph kinds `from_relax` produces: ``ewadd``/``ewmul``/``ewsub``
are ``add``/``multiply``/``subtract`` of equal shapes, ``smul`` is a ``multiply`` by a rank-0
tensor, ``transpose`` is a ``permute_dims`` swapping the last two axes, ``conv2d`` is a
``conv2d`` (with ``act=RELU``: a ``conv2d`` whose only reader is a ``relu``), SAME padding is
the centred ``k // 2``, a pool is an ``avg_pool2d``/``max_pool2d`` (average pools must count
the padding, as C_pool does), ``concat``/``split`` are two-way. ``add`` and ``multiply`` match
in either operand order (the rules are verified with commutativity).

A match maps every source operator to a distinct graph node, binds rule inputs to graph
tensors (two inputs may bind the same tensor), binds parameter variables, and obeys
MetaFlow's external-edge rule: a tensor the source computes but does not map to the target
must have no reader outside the match, and inputs whose templates share a dimension name the
proof relied on must have equal sizes there (`Rule.equal_dims`). Rewriting builds the target,
rewires readers of mapped outputs, rejects a rewrite that would close a cycle (TASO fig. 2.6),
and folds operators whose inputs are all weights (concatenated and padded kernels are computed
once, section 2.8).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Protocol, cast

import numpy as np

from paragraph import ops as graph_ops
from paragraph.errors import GraphError
from paragraph.graph import Attrs, Graph, Node, TensorRef, TensorType
from paragraph.interpret import fold_weights
from paragraph.rules.axioms import Hypothesis, _hyp_holds
from paragraph.rules.rule import POp, Ref, Rule, infer_side, resolve_params
from paragraph.rules.specs import (
    OPS,
    RELU,
    SAME,
    VALID,
    Meta,
    Params,
    ShapeError,
    constant_value,
    split_point,
)

GRAPH_KIND = {"conv2d": "conv2d", "matmul": "matmul", "ewadd": "add", "ewmul": "multiply",
              "ewsub": "subtract", "smul": "multiply", "relu": "relu", "sigmoid": "sigmoid",
              "tanh": "tanh", "gelu": "gelu", "transpose": "permute_dims",
              "pool_avg": "avg_pool2d", "pool_max": "max_pool2d", "concat": "concat",
              "split": "split", "enlarge": "enlarge"}
COMMUTATIVE_KINDS = frozenset({"add", "multiply"})

Bindings = dict[str, Any]  # parameter variable -> value
KindIndex = Mapping[str, list[int]]  # node ids of each kind (`kind_index`)


class SelfMatchingRule(Protocol):
    """A rule that finds and rewrites its own matches (`paragraph.rules.parametric`)."""

    @property
    def id(self) -> str: ...

    def find(self, graph: Graph) -> list[Match]: ...

    def rewrite(self, graph: Graph, match: Match) -> Graph | None: ...


AnyRule = Rule | SelfMatchingRule  # a pattern rule or a parametric one


@dataclass(eq=False)
class Match:
    """One occurrence of a rule's source in a graph."""

    rule: AnyRule
    nodes: tuple[int, ...]
    tensors: dict[Ref, TensorRef] = field(default_factory=dict)  # source Ref -> graph TensorRef
    bindings: Bindings = field(default_factory=dict)  # parameter variable -> value
    extra: dict[str, Any] = field(default_factory=dict)  # what a parametric rule needs to rewrite


# ---------------------------------------------------------------------------- reading nodes
def _pad_modes(padding: Sequence[int], kh: int, kw: int) -> set[int]:
    modes = set()
    if tuple(padding) == (0, 0, 0, 0):
        modes.add(VALID)
    if kh % 2 and kw % 2 and tuple(padding) == (kh // 2, kw // 2, kh // 2, kw // 2):
        modes.add(SAME)
    return modes


def _neg_axis(axis: int, rank: int) -> int:
    return axis - rank if axis >= 0 else axis


def node_params(graph: Graph, node: Node, op: str) -> dict[str, set[int]] | None:
    """The rule-level parameter values a graph node offers for rule operator ``op`` (each a
    set of possibilities), or None if the node is not a lowering of ``op``."""
    a = node.attrs
    if op == "conv2d":
        if a["dilation"] != (1, 1) or a["strides"][0] != a["strides"][1]:
            return None
        kh, kw = graph.type_of(node.inputs[1]).shape[2:]
        pads = _pad_modes(a["padding"], kh, kw)
        if not pads or (a["out_dtype"] not in (None, node.type.dtype)):
            return None
        return {"stride": {a["strides"][0]}, "pad": pads, "groups": {a["groups"]}}
    if op in ("pool_avg", "pool_max"):
        if (a["dilation"] != (1, 1) or a["strides"][0] != a["strides"][1] or a["ceil_mode"]
                or a["layout"] != "NCHW" or a["out_layout"] != "NCHW"):
            return None
        kh, kw = a["pool_size"]
        pads = _pad_modes(a["padding"], kh, kw)
        if op == "pool_avg" and not a["count_include_pad"]:
            pads &= {VALID}
        if not pads:
            return None
        return {"kh": {kh}, "kw": {kw}, "stride": {a["strides"][0]}, "pad": pads}
    if op == "concat":
        if len(node.inputs) != 2:
            return None
        return {"axis": {_neg_axis(a["axis"], len(node.type.shape))}}
    if op == "split":
        if len(node.outputs) != 2:
            return None
        return {"axis": {_neg_axis(a["axis"], len(node.outputs[0].shape))}}
    if op == "transpose":
        rank = len(node.type.shape)
        swap = tuple(range(rank - 2)) + (rank - 1, rank - 2)
        axes = a["axes"]
        return {} if rank >= 2 and (axes == swap or (axes is None and rank == 2)) else None
    if op == "matmul":
        return {} if a["out_dtype"] in (None, node.type.dtype) else None
    if op == "enlarge":
        kh, kw = a["kernel_size"]
        return {"kh": {kh}, "kw": {kw}}
    return {}


# ---------------------------------------------------------------------------- matching
@dataclass
class _State:
    tensors: dict[Ref, TensorRef]
    bindings: Bindings
    op_node: dict[int, int]  # source operator index -> graph node
    used: set[int]
    nodes: list[int]


@cache
def _plan(rule: Rule) -> tuple[int, ...]:
    """Source operators in an order where each (after the first) touches an earlier one."""
    n = len(rule.inputs)
    ops = [j for j, o in enumerate(rule.source) if not OPS[o.op].constant]
    if not ops:
        return ()

    def touches(j: int, done: list[int]) -> bool:
        reads = {r for r in rule.source[j].inputs}
        for d in done:
            if any(r[0] == n + d for r in reads):
                return True
            if any(r[0] == n + j for r in rule.source[d].inputs):
                return True
            if reads & {r for r in rule.source[d].inputs if r[0] < n}:
                return True
        return False

    # start from the last operator that is not a relu or an add (common kinds anchor badly)
    first = max(ops, key=lambda j: (rule.source[j].op not in ("relu", "ewadd"), j))
    order = [first]
    while len(order) < len(ops):
        nxt = next((j for j in ops if j not in order and touches(j, order)), None)
        order.append(nxt if nxt is not None else next(j for j in ops if j not in order))
    return tuple(order)


# siblings (operators of one kind reading one tensor) a match may pair: every pair up to this
# many, beyond it only neighbours in graph order (an unrolled recurrent model has hundreds of
# products by one matrix: every pair of the GRU's 198 gave 39,000 matches and 14 s of matching)
EVERY_PAIR_UP_TO = 8


def _siblings(users: list[int], used: set[int]) -> list[int]:
    """``users`` that a match already holding ``used`` may take next (`EVERY_PAIR_UP_TO`)."""
    if len(users) <= EVERY_PAIR_UP_TO:
        return users
    held = [k for k, u in enumerate(users) if u in used]
    if not held:
        return users
    near = {k + d for k in held for d in (-1, 1)}
    return [u for k, u in enumerate(users) if k in near]


def _candidates(graph: Graph, rule: Rule, j: int, st: _State,
                index: KindIndex) -> Iterable[int]:
    n = len(rule.inputs)
    op = rule.source[j]
    kind = GRAPH_KIND[op.op]
    for r in op.inputs:
        if r in st.tensors:
            t = st.tensors[r]
            return _siblings([u for u in graph.users(t.node) if graph[u].kind == kind],
                             st.used)
    for d in st.op_node:
        for r in rule.source[d].inputs:
            if r[0] == n + j:
                produced = st.tensors.get(r)
                if produced is None:
                    return []
                node = graph[produced.node]
                if node.kind == kind:
                    return [produced.node]
                if kind == "conv2d" and node.kind == "relu":  # a conv with its fused relu
                    producer = node.inputs[0].node
                    return [producer] if graph[producer].kind == kind else []
                return []
    return index.get(kind, [])


def _unify(value: Any, options: set[int], bindings: Bindings) -> Iterator[Bindings]:
    if isinstance(value, int):
        if value in options:
            yield bindings
        return
    if isinstance(value, str):
        if value in bindings:
            if bindings[value] in options:
                yield bindings
            return
        for v in sorted(options):
            yield {**bindings, value: v}


def _match_op(graph: Graph, rule: Rule, j: int, g: int, st: _State) -> Iterator[_State]:
    n = len(rule.inputs)
    op = rule.source[j]
    node = graph[g]
    if g in st.used or node.kind != GRAPH_KIND[op.op]:
        return
    offered = node_params(graph, node, op.op)
    if offered is None:
        return
    if op.op == "smul":  # multiply by a rank-0 tensor (either operand)
        ranks = [len(graph.type_of(r).shape) for r in node.inputs]
        if 0 not in ranks:
            return
    # parameters: unify each pattern parameter with what the node offers
    params = dict(op.params)
    act = params.pop("act", None)
    binding_options = [st.bindings]
    for name, value in params.items():
        if name not in offered:
            continue
        binding_options = [b2 for b in binding_options for b2 in _unify(value, offered[name], b)]
    companion = None
    if act is not None:
        act_value = st.bindings.get(act, act) if isinstance(act, str) else act
        if act_value == RELU:
            users = graph.users(g)
            if len(users) != 1 or graph[users[0]].kind != "relu" or users[0] in st.used:
                return
            companion = users[0]
        elif isinstance(act, str) and act not in st.bindings:
            binding_options = [{**b, act: 0} for b in binding_options]
    out_node = companion if companion is not None else g
    orders = [node.inputs]
    if node.kind in COMMUTATIVE_KINDS:
        orders.append(node.inputs[::-1])
    for bindings in binding_options:
        for inputs in orders:
            tensors = dict(st.tensors)
            ok = True
            for r, t in zip(op.inputs, inputs, strict=True):
                if tensors.get(r, t) != t:
                    ok = False
                    break
                tensors[r] = t
            if not ok:
                continue
            for k in range(OPS[op.op].n_out):
                ref, t = (n + j, k), TensorRef(out_node, k)
                if tensors.get(ref, t) != t:
                    ok = False
                    break
                tensors[ref] = t
            if not ok:
                continue
            used = st.used | {g} | ({companion} if companion is not None else set())
            nodes = st.nodes + [g] + ([companion] if companion is not None else [])
            yield _State(tensors, bindings, {**st.op_node, j: g}, used, nodes)


def _complete(graph: Graph, rule: Rule, st: _State) -> bool:
    """Shapes, constants, external edges and input independence of a full assignment."""
    n = len(rule.inputs)
    matched = set(st.used)
    for i in range(n):
        t = st.tensors.get((i, 0))
        if t is None or t.node in matched:
            return False
    if not all(_holds(c, st.bindings) for c in rule.constraints):
        return False
    inputs = [Meta(graph.type_of(st.tensors[(i, 0)]).shape) for i in range(n)]
    if not rule.dims_hold([m.shape for m in inputs]):
        return False  # sizes the proof assumed equal are not (e.g. g1's two halves)
    try:
        metas = infer_side(rule, "source", inputs, st.bindings)
        target = infer_side(rule, "target", inputs, st.bindings)
    except (ShapeError, KeyError, ValueError):
        return False  # the source does not type-check here, or the target cannot be built
    if any(metas[s].shape != target[t].shape for s, t in rule.outputs):
        return False
    for ref, t in st.tensors.items():
        if ref[0] < n:
            continue
        op = rule.source[ref[0] - n]
        if metas[ref].shape != graph.type_of(t).shape:
            return False
        if OPS[op.op].constant:
            src = graph[t.node]
            if src.kind not in ("weight", "constant"):
                return False
            assert src.value is not None  # a valid graph gives every weight its value
            try:
                want = constant_value(op.op, metas[ref].shape)
            except ShapeError:
                return False
            have = np.broadcast_to(src.value, metas[ref].shape)
            if not np.allclose(have, want, rtol=1e-6, atol=1e-7):
                return False
    mapped = {s for s, _ in rule.outputs}
    outputs = set(graph.outputs)
    for ref, t in st.tensors.items():
        if ref[0] < n or ref in mapped or OPS[rule.source[ref[0] - n].op].constant:
            continue
        if t in outputs or any(u not in matched for u in graph.users(t.node)):
            return False
    for j, g in st.op_node.items():  # a conv's output hidden behind its fused relu
        if st.tensors.get((n + j, 0)) != TensorRef(g, 0):
            if TensorRef(g, 0) in outputs or len(graph.users(g)) != 1:
                return False
    return True


def _holds(constraint: Hypothesis, bindings: Bindings) -> bool:
    try:
        return _hyp_holds(constraint, bindings)
    except KeyError:
        return False


def kind_index(graph: Graph) -> dict[str, list[int]]:
    """Node ids of each kind, in topological order."""
    index: dict[str, list[int]] = {}
    for node in graph.nodes:
        index.setdefault(node.kind, []).append(node.id)
    return index


def find_matches(graph: Graph, rule: AnyRule, index: KindIndex | None = None,
                 limit: int | None = None) -> list[Match]:
    """Every match of ``rule``'s source in ``graph`` (at most ``limit``)."""
    if hasattr(rule, "find"):
        return rule.find(graph)
    index = kind_index(graph) if index is None else index
    plan = _plan(rule)
    if not plan or any(GRAPH_KIND[rule.source[j].op] not in index for j in plan):
        return []
    found: list[Match] = []
    seen: set[tuple[frozenset[int], tuple[tuple[Ref, TensorRef], ...]]] = set()

    def extend(i: int, st: _State) -> None:
        if limit is not None and len(found) >= limit:
            return
        if i == len(plan):
            if _complete(graph, rule, st):
                key = (frozenset(st.used), tuple(sorted(st.tensors.items())))
                if key not in seen:
                    seen.add(key)
                    found.append(Match(rule, tuple(st.nodes), st.tensors, st.bindings))
            return
        j = plan[i]
        for g in _candidates(graph, rule, j, st, index):
            for nxt in _match_op(graph, rule, j, g, st):
                extend(i + 1, nxt)

    extend(0, _State({}, {}, {}, set(), []))
    return found


# ---------------------------------------------------------------------------- rewriting
def lower(op: str, params: Params, metas: Sequence[Meta]) -> list[tuple[str, dict[str, Any]]]:
    """The graph nodes (kind, attrs) computing rule operator ``op``: one, or a conv then a
    relu for ``conv2d`` with ``act=RELU``."""
    if op == "conv2d":
        kh, kw = metas[1].shape[2:]
        ph, pw = (kh // 2, kw // 2) if params["pad"] == SAME else (0, 0)
        attrs = {"strides": (params["stride"],) * 2, "padding": (ph, pw, ph, pw),
                 "groups": params["groups"]}
        return [("conv2d", attrs)] + ([("relu", {})] if params["act"] == RELU else [])
    if op in ("pool_avg", "pool_max"):
        kh, kw = params["kh"], params["kw"]
        ph, pw = (kh // 2, kw // 2) if params["pad"] == SAME else (0, 0)
        attrs = {"pool_size": (kh, kw), "strides": (params["stride"],) * 2,
                 "padding": (ph, pw, ph, pw)}
        if op == "pool_avg":
            attrs["count_include_pad"] = True
        return [(GRAPH_KIND[op], attrs)]
    if op == "concat":
        return [("concat", {"axis": params["axis"] + metas[0].rank})]
    if op == "split":
        return [("split", {"indices_or_sections": (split_point(metas[0], params["axis"]),),
                           "axis": params["axis"] + metas[0].rank})]
    if op == "transpose":
        r = metas[0].rank
        return [("permute_dims", {"axes": tuple(range(r - 2)) + (r - 1, r - 2)})]
    if op == "enlarge":
        return [("enlarge", {"kernel_size": (params["kh"], params["kw"])})]
    return [(GRAPH_KIND[op], {})]


class Builder:
    """Appends new nodes (fresh ids) for a rewrite of ``graph``."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.next_id = graph.next_id
        self.added: list[Node] = []
        self.types: dict[TensorRef, TensorType] = {}

    def type_of(self, r: TensorRef) -> TensorType:
        return self.types[r] if r in self.types else self.graph.type_of(r)

    def op(self, kind: str, inputs: Sequence[TensorRef], attrs: Mapping[str, Any],
           name: str = "") -> Node:
        in_types = [self.type_of(r) for r in inputs]
        attrs = graph_ops.canonical(kind, attrs, in_types)
        outs = graph_ops.infer(kind, in_types, attrs)
        node = Node(self.next_id, kind, tuple(inputs), tuple(outs), Attrs(attrs), name=name)
        return self._add(node)

    def constant(self, value: np.ndarray, name: str = "") -> Node:
        value = np.ascontiguousarray(value)
        node = Node(self.next_id, "weight" if value.size > 1 else "constant",
                    outputs=(TensorType(tuple(value.shape), str(value.dtype)),), value=value,
                    name=name)
        return self._add(node)

    def _add(self, node: Node) -> Node:
        self.next_id += 1
        self.added.append(node)
        for i, t in enumerate(node.outputs):
            self.types[TensorRef(node.id, i)] = t
        return node


def commit(graph: Graph, removed: Iterable[int], builder: Builder,
           remap: dict[TensorRef, TensorRef]) -> Graph | None:
    """Replace ``removed`` by the builder's nodes, rewire ``remap``, fold new weight-only
    nodes; None if the result has a cycle (TASO fig. 2.6) or mistyped rewiring."""
    for old, new in remap.items():
        if graph.type_of(old) != builder.type_of(new):
            return None
    try:
        result = graph.replace_subgraph(removed, builder.added, remap)
    except GraphError:
        return None
    result = fold_weights(result, only={n.id for n in builder.added})
    return result.without_dead_nodes()


def apply_match(graph: Graph, match: Match) -> Graph | None:
    """The graph with ``match`` rewritten (None if the rewrite is impossible: shapes that do
    not fit the target, a cycle, or no change at all)."""
    rule = match.rule
    if hasattr(rule, "rewrite"):
        result = rule.rewrite(graph, match)
    else:
        result = _rewrite_pattern(graph, match)
    if result is None or result.structural_hash() == graph.structural_hash():
        return None
    return result


def _rewrite_pattern(graph: Graph, match: Match) -> Graph | None:
    rule = cast(Rule, match.rule)  # `apply_match` sends pattern rules only (others rewrite)
    n = len(rule.inputs)
    bound = [match.tensors[(i, 0)] for i in range(n)]
    try:
        metas = infer_side(rule, "target", [Meta(graph.type_of(t).shape) for t in bound],
                           match.bindings)
    except (ShapeError, KeyError, ValueError):
        return None
    dtype = graph.type_of(bound[0]).dtype if bound else "float32"
    b = Builder(graph)
    made: dict[Ref, TensorRef] = {(i, 0): t for i, t in enumerate(bound)}
    for j, op in enumerate(rule.target):
        ref0 = (n + j, 0)
        if OPS[op.op].constant:
            if ref0 in metas:
                try:
                    value = constant_value(op.op, metas[ref0].shape)
                except ShapeError:
                    return None
                made[ref0] = b.constant(value.astype(dtype), name=op.op).out
            continue
        p = resolve_params(op, match.bindings)
        args = [made[r] for r in op.inputs]
        try:
            steps = lower(op.op, p, [metas[r] for r in op.inputs])
            node = None
            for kind, attrs in steps:
                node = b.op(kind, args if node is None else [node.out], attrs)
        except (ValueError, KeyError, TypeError):
            return None
        assert node is not None  # `lower` gives every operator at least one node
        for k in range(OPS[op.op].n_out):
            made[(n + j, k)] = TensorRef(node.id, k)
    remap: dict[TensorRef, TensorRef] = {}
    for s, t in rule.outputs:
        old, new = match.tensors[s], made[t]
        if old != new:
            remap[old] = new
    return commit(graph, match.nodes, b, remap)


# ---------------------------------------------------------------------------- rule sets
def usable(rule: Rule) -> bool:
    """Whether ``rule`` can rewrite anything: its source has an operator, maps only operator
    outputs (a reversed identity rule, ``x => f(x)``, cannot) and binds every input and
    parameter variable the target reads."""
    n = len(rule.inputs)
    bound = {r[0] for o in rule.source for r in o.inputs if r[0] < n}
    needed = {r[0] for o in rule.target for r in o.inputs if r[0] < n} | {
        t[0] for _, t in rule.outputs if t[0] < n}

    def variables(ops: Sequence[POp]) -> set[str]:
        return {v for o in ops for _, v in o.params if isinstance(v, str)}
    return (any(not OPS[o.op].constant for o in rule.source)
            and all(s[0] >= n for s, _ in rule.outputs) and needed <= bound
            and variables(rule.target) <= variables(rule.source))


def match_all(graph: Graph, rules: Sequence[AnyRule]) -> dict[str, list[Match]]:
    """Every match of every rule (pattern or parametric) in ``graph``, by rule id."""
    index = kind_index(graph)
    return {rule.id: find_matches(graph, rule, index) for rule in rules}


def rewrites(graph: Graph, rules: Sequence[AnyRule]) -> Iterator[tuple[Match, Graph]]:
    """Every (match, rewritten graph) of ``rules`` in ``graph`` that changes it."""
    for matches in match_all(graph, rules).values():
        for m in matches:
            result = apply_match(graph, m)
            if result is not None:
                yield m, result


def both_directions(rules: Iterable[Rule]) -> list[Rule]:
    """Each rule and its reverse (where the reverse can match), for a search to use."""
    out = []
    for r in rules:
        for candidate in ((r, r.reversed()) if isinstance(r, Rule) else (r,)):
            if not isinstance(candidate, Rule) or usable(candidate):
                out.append(candidate)
    return out


__all__ = ["Match", "GRAPH_KIND", "find_matches", "apply_match", "match_all", "rewrites",
           "both_directions", "usable", "lower", "commit", "kind_index", "node_params",
           "Builder"]
