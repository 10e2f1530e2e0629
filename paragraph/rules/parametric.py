"""Parametric rules: substitutions over any number of operators or any kernel size, group
count or shape, which enumeration cannot express (IOS, MetaFlow, TASO sections 2.8-2.9,
AutoGraph fig. 9).

Each rule finds its matches in a `Graph` and rewrites them itself, and carries

* ``obligations()``: z3 proof obligations over the axioms for its general schema (parameters
  are z3 variables; a schema over n operators is proved for n = 2 and n = 3, nested binary
  concat/split being how n-way ones are written), discharged by `prove`;
* ``example(rng)``: a random small graph where it matches, which `check_numeric` rewrites
  and compares with `paragraph.interpret.run_graph`.

Where a graph operator's meaning goes beyond the rule language (batch norm, an average pool
that does not count its padding, ``linear``), the obligation states it through its algebraic
definition (``bn(y) = chmul(y, a) + b``, ``avg_excl(x) = avg(x) * r``) and the numeric check
covers that step.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from paragraph import ops as graph_ops
from paragraph.graph import Graph, GraphBuilder, Node, TensorRef
from paragraph.interpret import run_graph
from paragraph.rules.axioms import Hypothesis, by_name
from paragraph.rules.match import Builder, Match, commit
from paragraph.rules.specs import NONE, SAME, VALID, Term, app, var
from paragraph.rules.verify import DEFAULT_RLIMIT, Prover, axiom_order, z3_version

# a proof obligation: its description, lhs[i] == rhs[i] for all i, under the hypotheses
Obligation = tuple[str, list[Term], list[Term], tuple[Hypothesis, ...]]
T = TypeVar("T")


# ---------------------------------------------------------------------------- helpers
def _is_weight(graph: Graph, t: TensorRef) -> bool:
    return graph[t.node].kind in ("weight", "constant")


def _value(graph: Graph, t: TensorRef) -> np.ndarray:
    """The array of weight or constant ``t`` (a valid graph gives every one its value)."""
    value = graph[t.node].value
    assert value is not None, f"{graph[t.node]!r} has no value"
    return value


def _only_reader(graph: Graph, t: TensorRef, reader: int) -> bool:
    """``t`` is read by ``reader`` alone and is not a graph output."""
    return graph.users(t.node) == [reader] and t not in graph.outputs


def _centred(node: Node, graph: Graph) -> bool:
    """A conv/pool whose padding is SAME (k // 2 each side, odd k) or none for 1x1."""
    a = node.attrs
    if node.kind == "conv2d":
        kh, kw = graph.type_of(node.inputs[1]).shape[2:]
    else:
        kh, kw = a["pool_size"]
    return kh % 2 == 1 and kw % 2 == 1 and tuple(a["padding"]) == (kh // 2, kw // 2) * 2


def _plain_conv(node: Node, graph: Graph) -> bool:
    a = node.attrs
    return (node.kind == "conv2d" and len(node.inputs) == 2 and a["dilation"] == (1, 1)
            and a["out_dtype"] in (None, node.type.dtype) and _is_weight(graph, node.inputs[1]))


def _groups_and_pairs(items: list[T]) -> list[list[T]]:
    """The whole group and, when it has more than two members, every pair of it."""
    if len(items) < 2:
        return []
    out = [items]
    if len(items) > 2:
        out += [list(p) for p in itertools.combinations(items, 2)]
    return out


def _conv(x: Term, w: Term, stride: Any = "s", pad: Any = SAME, act: Any = "c",
          groups: Any = 1) -> Term:
    return app("conv2d", x, w, stride=stride, pad=pad, act=act, groups=groups)


def _nested_split(t: Term, n: int, axis: int) -> list[Term]:
    """The n pieces of ``t`` that a left-nested n-way concat along ``axis`` made."""
    if n == 1:
        return [t]
    head = _nested_split(app("split", t, axis=axis, out=0), n - 1, axis)
    return head + [app("split", t, axis=axis, out=1)]


def _nested_concat(ts: Sequence[Term], axis: int) -> Term:
    out = ts[0]
    for t in ts[1:]:
        out = app("concat", out, t, axis=axis)
    return out


@dataclass(frozen=True)
class ParametricRule:
    """Base class: id, name, the paper it implements; subclasses find, rewrite, prove."""

    id: str
    name: str
    paper: str
    schema: str

    origin = "parametric"

    def find(self, graph: Graph) -> list[Match]:
        raise NotImplementedError

    def rewrite(self, graph: Graph, match: Match) -> Graph | None:
        raise NotImplementedError

    def obligations(self) -> list[Obligation]:
        raise NotImplementedError

    def hint(self) -> tuple[str, ...]:
        """Axioms z3 tries first (a small set proves faster and more surely than all)."""
        return ()

    def example(self, rng: np.random.Generator) -> Graph:
        raise NotImplementedError

    def params(self) -> dict[str, Any]:
        return {}


# ---------------------------------------------------------------------------- conv chains
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
    pos = 0 if _is_weight(graph, node.inputs[0]) else 1
    const, other = node.inputs[pos], node.inputs[1 - pos]
    if (other.node != value or not _is_weight(graph, const) or node.type != graph[value].type
            or _channel_slice(_value(graph, const), channels, 0, 1) is None):
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


def _chain_signature(graph: Graph, conv: Node,
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


def _per_channel(value: np.ndarray, channels: int) -> np.ndarray:
    """A chain constant (`_channel_slice` accepts it) as a (1, C, 1, 1) array."""
    v = np.asarray(value)
    return np.full((1, channels, 1, 1), v.reshape(()), v.dtype) if v.size == 1 else \
        v.reshape(1, channels, 1, 1)


def _chain_obligations(parts: int) -> list[Obligation]:
    """Every chain operator commutes with a concat of ``parts`` pieces along channels (its
    constant cut the same way): what carries a chain through a split or a merge."""
    xs, cs = [var(f"y{i}") for i in range(parts)], [var(f"c{i}") for i in range(parts)]
    out: list[Obligation] = []
    for f in CHAIN_UNARY:
        out.append((f"{f} after it", [app(f, _balanced_concat(xs, -3))],
                    [_balanced_concat([app(f, y) for y in xs], -3)], ()))
    for f in ("ewadd", "ewsub", "ewmul"):  # divide by a constant: multiply, reciprocal
        for pos in (0, 1):
            def op(a: Term, b: Term, f: str = f, pos: int = pos) -> Term:
                return app(f, b, a) if pos == 0 else app(f, a, b)
            out.append((f"{f} of a per-channel constant (operand {pos}) after it",
                        [op(_balanced_concat(xs, -3), _balanced_concat(cs, -3))],
                        [_balanced_concat([op(y, c) for y, c in zip(xs, cs, strict=True)],
                                          -3)], ()))
    return out


# ---------------------------------------------------------------------------- merge convs
Unit = tuple[int, tuple[int, ...]]  # a convolution and its chain (operator ids)
# what units must share to merge: data, strides, output size, dtype and chain steps
_MergeKey = tuple[TensorRef, Any, tuple[int, ...], str, tuple[ChainStep, ...]]


@dataclass(frozen=True)
class MergeConvs(ParametricRule):
    """n convolutions reading the same tensor, each with its per-channel element-wise chain
    (possibly empty; the same operators at the same places in every chain), with equal
    strides and output sizes -> one convolution on the kernels enlarged to the largest and
    concatenated, the chain on the concatenated constants, and each output a slice of the
    channels (IOS operator merge with the fused epilogue; MetaFlow fig. 1 enlarge + fig. 4a
    fuse; TASO axioms 21, 39 and the element-wise axioms). Kernels of different sizes need
    SAME padding; kernels of one size may share any padding."""

    def unit(self, graph: Graph, members: Collection[int]) -> Unit | None:
        """The convolution and chain that the operators ``members`` (one fused kernel's) are,
        or None if they are something else."""
        convs = [i for i in members if graph[i].kind == "conv2d"]
        if len(convs) != 1:
            return None
        chain = conv_chain(graph, graph[convs[0]], within=set(members))
        return (convs[0], chain) if len(chain) + 1 == len(members) else None

    def _key(self, graph: Graph, unit: Unit) -> _MergeKey | None:
        conv = graph[unit[0]]
        a = conv.attrs
        if (not _plain_conv(conv, graph) or a["groups"] != 1
                or a["strides"][0] != a["strides"][1]):
            return None
        signature = _chain_signature(graph, conv, unit[1])
        if signature is None:
            return None
        return (conv.inputs[0], a["strides"], conv.type.shape[2:], conv.type.dtype, signature)

    def match_units(self, graph: Graph, units: Sequence[Unit]) -> Match | None:
        """The match merging exactly ``units``, or None where they cannot merge."""
        keys = [self._key(graph, u) for u in units]
        if len(units) < 2 or None in keys or len(set(keys)) != 1:
            return None
        convs = [graph[c] for c, _ in units]
        sizes = {graph.type_of(c.inputs[1]).shape[2:] for c in convs}
        same = len(sizes) == 1 and len({c.attrs["padding"] for c in convs}) == 1
        if not same and not all(_centred(c, graph) for c in convs):
            return None
        nodes = tuple(i for c, chain in units for i in (c, *chain))
        return Match(self, nodes, extra={"units": tuple(units)})

    def find(self, graph: Graph) -> list[Match]:
        groups: dict[_MergeKey, list[Unit]] = {}
        for node in graph.nodes:
            if node.kind != "conv2d":
                continue
            chain = conv_chain(graph, node)
            for unit in {(node.id, chain), (node.id, ())}:  # with its chain, and bare
                key = self._key(graph, unit)
                if key is not None:
                    groups.setdefault(key, []).append(unit)
        matches = (self.match_units(graph, units) for group in groups.values()
                   for units in _groups_and_pairs(group))
        return [m for m in matches if m is not None]

    def rewrite(self, graph: Graph, match: Match) -> Graph | None:
        units = match.extra["units"]
        convs = [graph[c] for c, _ in units]
        shapes = [graph.type_of(c.inputs[1]).shape for c in convs]
        kh, kw = max(s[2] for s in shapes), max(s[3] for s in shapes)
        b = Builder(graph)
        kernels = []
        for c, s in zip(convs, shapes, strict=True):
            w = c.inputs[1]
            if s[2:] != (kh, kw):
                w = b.op("enlarge", [w], {"kernel_size": (kh, kw)}).out
            kernels.append(w)
        cat = b.op("concat", kernels, {"axis": 0})
        first = convs[0]
        padding = first.attrs["padding"] if all(s[2:] == (kh, kw) for s in shapes) else (
            kh // 2, kw // 2) * 2
        value = b.op("conv2d", [first.inputs[0], cat.out], {**first.attrs, "padding": padding},
                     name=first.name).out
        channels = [s[0] for s in shapes]
        for step in range(len(units[0][1])):
            nodes = [graph[chain[step]] for _, chain in units]
            if len(nodes[0].inputs) == 1:
                value = b.op(nodes[0].kind, [value], dict(nodes[0].attrs)).out
                continue
            pos = 0 if _is_weight(graph, nodes[0].inputs[0]) else 1
            const = b.constant(np.concatenate(
                [_per_channel(_value(graph, n.inputs[pos]), c)
                 for n, c in zip(nodes, channels, strict=True)], axis=1)).out
            value = b.op(nodes[0].kind, [const, value] if pos == 0 else [value, const],
                         dict(nodes[0].attrs)).out
        remap: dict[TensorRef, TensorRef] = {}
        offset = 0
        for (conv, chain), width in zip(units, channels, strict=True):
            last = chain[-1] if chain else conv
            remap[TensorRef(last)] = b.op("strided_slice", [value], {
                "axes": (1,), "begin": (offset,), "end": (offset + width,)}).out
            offset += width
        return commit(graph, match.nodes, b, remap)

    def obligations(self) -> list[Obligation]:
        out: list[Obligation] = []
        x = var("x")
        for n in (2, 3):
            ws = [var(f"w{i}") for i in range(n)]
            big = [app("enlarge", w, kh="kh", kw="kw") for w in ws]
            merged = _conv(x, _nested_concat(big, -4))
            out.append((f"n={n}, SAME kernels enlarged", [_conv(x, w) for w in ws],
                        _nested_split(merged, n, -3), ()))
            merged = _conv(x, _nested_concat(ws, -4), pad="p")
            out.append((f"n={n}, kernels of one size and padding",
                        [_conv(x, w, pad="p") for w in ws], _nested_split(merged, n, -3), ()))
        return out + _chain_obligations(2)

    def example(self, rng: np.random.Generator) -> Graph:
        b = GraphBuilder()
        c, h = int(rng.integers(1, 5)), int(rng.integers(5, 9))
        x = b.input((int(rng.integers(1, 3)), c, h, h + int(rng.integers(0, 3))))
        stride = int(rng.integers(1, 3))
        same = bool(rng.integers(0, 4))  # else one kernel size, no padding
        chained = bool(rng.integers(0, 2))
        outs = []
        for _ in range(int(rng.integers(2, 4))):
            kh, kw = (int(v) for v in rng.choice([1, 3, 5], 2)) if same else (3, 3)
            o = int(rng.integers(1, 5))
            w = b.weight(rng.standard_normal((o, c, kh, kw)).astype("f4"))
            y = b.op("conv2d", [x, w], {"strides": stride,
                                        "padding": (kh // 2, kw // 2) if same else 0}).out
            if chained:  # a bias, a scale in front, a scalar, relu
                y = b.op("add", [y, b.weight(rng.standard_normal((1, o, 1, 1)).astype("f4"))]).out
                y = b.op("multiply", [b.weight(rng.uniform(0.5, 2, (o, 1, 1)).astype("f4")),
                                      y]).out
                y = b.op("subtract", [y, b.constant(np.float32(0.25))]).out
                y = b.op("relu", [y]).out
            outs.append(y)
        return b.build(outs)


# ---------------------------------------------------------------------------- grouped convs
def block_diagonal(w: np.ndarray, groups: int, factor: int) -> np.ndarray:
    """The kernel of a ``groups // factor``-group conv equal to a ``groups``-group conv with
    kernel ``w``: each new group holds ``factor`` old ones on its diagonal, zeros elsewhere."""
    o, cg = w.shape[:2]
    og = o // groups
    out = np.zeros((o, cg * factor) + w.shape[2:], w.dtype)
    for q in range(groups):
        pos = q % factor
        out[q * og:(q + 1) * og, pos * cg:(pos + 1) * cg] = w[q * og:(q + 1) * og]
    return out


def _grouped_terms(g: int) -> tuple[Term, Term, list[Term], list[Term]]:
    """x and w of a g-group conv written as (balanced) concats of their per-group blocks."""
    xs = [var(f"x{i}") for i in range(g)]
    ws = [var(f"w{i}") for i in range(g)]
    return _balanced_concat(xs, -3), _balanced_concat(ws, -4), xs, ws


def _equal_out_channels(ws: Sequence[Term]) -> tuple[Hypothesis, ...]:
    """The per-group kernels of a grouped convolution have equal output channels (what
    ``g1`` needs; a real grouped kernel is cut into equal blocks)."""
    return tuple(("eq", ("dim", w.name, -4), ("dim", ws[0].name, -4)) for w in ws[1:])


def _balanced_concat(ts: Sequence[Term], axis: int) -> Term:
    if len(ts) == 1:
        return ts[0]
    half = len(ts) // 2
    return app("concat", _balanced_concat(ts[:half], axis), _balanced_concat(ts[half:], axis),
               axis=axis)


@dataclass(frozen=True)
class Regroup(ParametricRule):
    """A g-group convolution -> a g/factor-group one with a block-diagonal kernel (computed
    once from the weight): fewer, larger groups (AutoGraph fig. 9; TASO fig. 2.9: ResNeXt's
    32 groups as 8 or 4)."""

    factor: int = 2

    def hint(self) -> tuple[str, ...]:
        return ("2", "39", "40", "g1", "z1", "z2") + (("1", "30", "32", "33")
                                                      if self.factor > 2 else ())

    def params(self) -> dict[str, Any]:
        return {"factor": self.factor}

    def find(self, graph: Graph) -> list[Match]:
        return [Match(self, (n.id,)) for n in graph.nodes
                if _plain_conv(n, graph) and n.attrs["groups"] % self.factor == 0
                and n.attrs["groups"] >= self.factor]

    def rewrite(self, graph: Graph, match: Match) -> Graph | None:
        conv = graph[match.nodes[0]]
        g = conv.attrs["groups"]
        w = _value(graph, conv.inputs[1])
        b = Builder(graph)
        kernel = b.constant(block_diagonal(w, g, self.factor), name=f"{conv.name}_regrouped")
        new = b.op("conv2d", [conv.inputs[0], kernel.out],
                   {**conv.attrs, "groups": g // self.factor}, name=conv.name)
        return commit(graph, [conv.id], b, {conv.out: new.out})

    def obligations(self) -> list[Obligation]:
        out: list[Obligation] = []
        # one instance, 2 * factor groups -> 2: both sides split by g1 first. z3 does not
        # settle g = factor -> 1 (dense) or 4 * factor -> 4 for factor 4 within its resource
        # limit once g1 carries its size hypothesis; the numeric check covers g = factor,
        # 2 * factor and 4 * factor (`example`)
        for g in (2 * self.factor,):
            x, w, xs, ws = _grouped_terms(g)
            # the block-diagonal kernel, new group j = old groups j*f .. j*f+f-1
            rows = []
            for q in range(g):
                base = (q // self.factor) * self.factor
                blocks = [ws[q] if base + p == q else app("ewmul", ws[q], app("zeros"))
                          for p in range(self.factor)]
                rows.append(_balanced_concat(blocks, -3))
            lhs = _conv(x, w, act=NONE, groups=g)
            rhs = _conv(x, _balanced_concat(rows, -4), act=NONE, groups=g // self.factor)
            out.append((f"groups {g} -> {g // self.factor}", [lhs], [rhs],
                        _equal_out_channels(ws)))
        return out

    def example(self, rng: np.random.Generator) -> Graph:
        g = self.factor * int(rng.choice([1, 2, 4]))
        cg, og = int(rng.integers(1, 3)), int(rng.integers(1, 3))
        b = GraphBuilder()
        x = b.input((1, g * cg, 6, 5))
        w = b.weight(rng.standard_normal((g * og, cg, 3, 3)).astype("f4"))
        y = b.op("conv2d", [x, w], {"groups": g, "padding": 1,
                                    "strides": int(rng.integers(1, 3))})
        return b.build([b.op("relu", [y.out]).out])


@dataclass(frozen=True)
class SplitGroupedConv(ParametricRule):
    """A g-group convolution -> ``parts`` parallel convolutions of g/parts groups on slices
    of the channels, concatenated (AutoGraph fig. 9's parallel branches; TASO's merge of
    group convs read backwards)."""

    parts: int = 2

    def params(self) -> dict[str, Any]:
        return {"parts": self.parts}

    def find(self, graph: Graph) -> list[Match]:
        return [Match(self, (n.id,)) for n in graph.nodes
                if _plain_conv(n, graph) and n.attrs["groups"] % self.parts == 0
                and n.attrs["groups"] >= self.parts]

    def rewrite(self, graph: Graph, match: Match) -> Graph | None:
        conv = graph[match.nodes[0]]
        g = conv.attrs["groups"]
        b = Builder(graph)
        xs = b.op("split", [conv.inputs[0]], {"indices_or_sections": self.parts, "axis": 1})
        ws = b.op("split", [conv.inputs[1]], {"indices_or_sections": self.parts, "axis": 0})
        outs = [b.op("conv2d", [TensorRef(xs.id, i), TensorRef(ws.id, i)],
                     {**conv.attrs, "groups": g // self.parts},
                     name=f"{conv.name}_{i}" if conv.name else "").out
                for i in range(self.parts)]
        cat = b.op("concat", outs, {"axis": 1}, name=conv.name)
        return commit(graph, [conv.id], b, {conv.out: cat.out})

    def obligations(self) -> list[Obligation]:
        xs = [var(f"x{i}") for i in range(self.parts)]
        ws = [var(f"w{i}") for i in range(self.parts)]
        part = ("//", "g", self.parts)
        lhs = _conv(_balanced_concat(xs, -3), _balanced_concat(ws, -4), groups="g")
        rhs = _balanced_concat([_conv(a, b, groups=part) for a, b in zip(xs, ws, strict=True)],
                               -3)
        hyps = (("eq", ("%", "g", self.parts), 0), ("ge", "g", self.parts),
                *_equal_out_channels(ws))
        return [(f"any g divisible by {self.parts}", [lhs], [rhs], hyps)]

    def example(self, rng: np.random.Generator) -> Graph:
        return Regroup("", "", "", "", self.parts).example(rng)


@dataclass(frozen=True)
class SplitConv(ParametricRule):
    """A convolution and the per-channel element-wise chain after it -> ``parts`` copies on
    slices of the output channels, concatenated (TASO axiom 39 and the element-wise axioms
    read backwards; the inverse of the IOS merge). The parts can run on streams that would
    otherwise idle (`paragraph.passes.split`)."""

    parts: int = 2

    def params(self) -> dict[str, Any]:
        return {"parts": self.parts}

    def find(self, graph: Graph) -> list[Match]:
        out = []
        for n in graph.nodes:
            if (_plain_conv(n, graph) and n.attrs["groups"] == 1
                    and n.type.shape[1] % self.parts == 0 and n.type.shape[1] >= self.parts):
                out.append(Match(self, (n.id, *conv_chain(graph, n))))
        return out

    def rewrite(self, graph: Graph, match: Match) -> Graph | None:
        conv, chain = graph[match.nodes[0]], [graph[i] for i in match.nodes[1:]]
        w = _value(graph, conv.inputs[1])
        channels, size = w.shape[0], w.shape[0] // self.parts
        b = Builder(graph)
        outs = []
        for i in range(self.parts):
            lo, hi = i * size, (i + 1) * size
            part = f"{conv.name}_{i}" if conv.name else ""
            value = b.op("conv2d", [conv.inputs[0], b.constant(w[lo:hi], name=part).out],
                         dict(conv.attrs), name=part).out
            for node in chain:
                if len(node.inputs) == 1:
                    value = b.op(node.kind, [value], dict(node.attrs)).out
                    continue
                pos = 0 if _is_weight(graph, node.inputs[0]) else 1
                const = node.inputs[pos]
                c = _value(graph, const)
                if np.asarray(c).size > 1:  # a scalar is shared as it is
                    sliced = _channel_slice(c, channels, lo, hi)
                    assert sliced is not None  # `find` took per-channel constants only
                    const = b.constant(sliced).out
                ins = [const, value] if pos == 0 else [value, const]
                value = b.op(node.kind, ins, dict(node.attrs)).out
            outs.append(value)
        last = match.nodes[-1]
        cat = b.op("concat", outs, {"axis": 1}, name=graph[last].name)
        return commit(graph, match.nodes, b, {TensorRef(last): cat.out})

    def obligations(self) -> list[Obligation]:
        ws = [var(f"w{i}") for i in range(self.parts)]
        x = var("x")
        return [("conv split along output channels", [_conv(x, _balanced_concat(ws, -4))],
                 [_balanced_concat([_conv(x, w) for w in ws], -3)], ())
                ] + _chain_obligations(self.parts)

    def example(self, rng: np.random.Generator) -> Graph:
        b = GraphBuilder()
        c, h = int(rng.integers(1, 4)), int(rng.integers(5, 9))
        x = b.input((int(rng.integers(1, 3)), c, h, h + int(rng.integers(0, 3))))
        o = self.parts * int(rng.integers(1, 4))
        k = int(rng.choice([1, 3]))
        w = b.weight(rng.standard_normal((o, c, k, k)).astype("f4"))
        y = b.op("conv2d", [x, w], {"padding": k // 2, "strides": int(rng.integers(1, 3))})
        # batch norm as `prepare` decomposes it, a scalar, then relu
        for kind in ("subtract", "divide", "multiply", "add"):
            y = b.op(kind, [y.out, b.weight(rng.uniform(0.5, 2, (1, o, 1, 1)).astype("f4"))])
        y = b.op("add", [b.constant(np.float32(0.5)), y.out])
        return b.build([b.op("relu", [y.out]).out])


def _channel_slice(value: np.ndarray, channels: int, lo: int, hi: int) -> np.ndarray | None:
    """Channels lo..hi of a constant that broadcasts per channel over NCHW (None if it does
    not); shape kept as (..., hi - lo, 1, 1)."""
    v = np.asarray(value)
    if v.size == 1:
        return v
    if v.ndim < 3 or v.shape[-2:] != (1, 1) or v.shape[-3] != channels or any(
            d != 1 for d in v.shape[:-3]):
        return None
    return np.ascontiguousarray(v[..., lo:hi, :, :])


# ---------------------------------------------------------------------------- pools
def _ratio_map(x_shape: tuple[int, ...], attrs: Mapping[str, Any]) -> np.ndarray:
    """k*k / (window positions inside the input): turns a padding-counting average pool into
    one that does not (shape (1, 1, OH, OW))."""
    ones = np.ones((1, 1) + tuple(x_shape[2:]), np.float32)
    incl = graph_ops.compute("avg_pool2d", [ones], {**attrs, "count_include_pad": True})[0]
    return (1.0 / incl).astype(np.float32)


@dataclass(frozen=True)
class AvgPoolPair(ParametricRule):
    """avg_pool(x) + avg_pool(x) (the same pool twice, as in NASNet-A's normal cell) -> one
    depth-wise conv with kernel 2 * C_pool (TASO fig. 2.8b: pools as convs with C_pool, then
    conv linearity). For pools that do not count their padding, the conv's output is scaled
    by a constant map (one more, element-wise, operator)."""

    def find(self, graph: Graph) -> list[Match]:
        out = []
        for add in graph.nodes:
            if add.kind != "add" or add.inputs[0].node == add.inputs[1].node:
                continue
            p, q = (graph[r.node] for r in add.inputs)
            if (p.kind == q.kind == "avg_pool2d" and p.inputs == q.inputs and p.attrs == q.attrs
                    and not p.attrs["ceil_mode"] and p.attrs["dilation"] == (1, 1)
                    and p.attrs["layout"] == "NCHW" and p.attrs["out_layout"] == "NCHW"
                    and _only_reader(graph, p.out, add.id) and _only_reader(graph, q.out,
                                                                           add.id)):
                out.append(Match(self, (add.id, p.id, q.id)))
        return out

    def rewrite(self, graph: Graph, match: Match) -> Graph | None:
        add, pool = graph[match.nodes[0]], graph[match.nodes[1]]
        a = pool.attrs
        x = pool.inputs[0]
        xt = graph.type_of(x)
        kh, kw = a["pool_size"]
        c = xt.shape[1]
        b = Builder(graph)
        kernel = b.constant(np.full((c, 1, kh, kw), 2.0 / (kh * kw), xt.dtype), name="c_pool2")
        conv = b.op("conv2d", [x, kernel.out], {"strides": a["strides"], "padding": a["padding"],
                                                "groups": c}, name=add.name)
        result = conv
        if not a["count_include_pad"] and any(a["padding"]):
            ratio = b.constant(_ratio_map(xt.shape, dict(a)).astype(xt.dtype), name="pad_ratio")
            result = b.op("multiply", [conv.out, ratio.out], {}, name=add.name)
        return commit(graph, match.nodes, b, {add.out: result.out})

    def obligations(self) -> list[Obligation]:
        x, r = var("x"), var("r")
        pool = app("pool_avg", x, kh="kh", kw="kw", stride="s", pad="p")
        conv = app("conv2d", x, app("ewadd", app("c_pool", kh="kh", kw="kw"),
                                    app("c_pool", kh="kh", kw="kw")),
                   stride="s", pad="p", act=NONE, groups="g")
        return [("pools counting their padding", [app("ewadd", pool, pool)], [conv], ()),
                ("pools not counting it: avg_excl(x) = avg(x) * r",
                 [app("ewadd", app("ewmul", pool, r), app("ewmul", pool, r))],
                 [app("ewmul", conv, r)], ())]

    def example(self, rng: np.random.Generator) -> Graph:
        b = GraphBuilder()
        x = b.input((1, int(rng.integers(1, 5)), 7, 6))
        k = int(rng.choice([3, 5]))
        attrs = {"pool_size": k, "strides": int(rng.integers(1, 3)), "padding": k // 2,
                 "count_include_pad": bool(rng.integers(0, 2))}
        p1, p2 = b.op("avg_pool2d", [x], attrs), b.op("avg_pool2d", [x], attrs)
        return b.build([b.op("add", [p1.out, p2.out]).out])


@dataclass(frozen=True)
class PoolAfterConv(ParametricRule):
    """conv1x1(avg_pool(x)) -> avg_pool(conv1x1(x)): a 1 x 1 convolution (stride 1, no
    padding, groups 1) commutes with an average pool that counts its padding (axiom ``pc``:
    both linear, the padding's zeros map to zeros; TASO section 2.2's linearity axioms, one
    more operator pair). Where the convolution has fewer output channels than the pool has
    channels, as every Inception block's pool branch (768 -> 192, 288 -> 64, 2048 -> 192), the
    pool then averages 4-10x fewer channels; what followed the convolution (its bias, batch
    norm, activation) now follows the pool, which is exact because nothing of it moved
    inside the window. Only for that case, and for pools that keep the image's size: after a
    strided pool (NASNet-A's 1 x 1 stride-2 pool before its halving convolution) the
    convolution would run on stride^2 times the pixels; the other direction never saves work
    here."""

    def find(self, graph: Graph) -> list[Match]:
        out = []
        for conv in graph.nodes:
            if conv.kind != "conv2d" or not _plain_conv(conv, graph):
                continue
            a = conv.attrs
            pool = graph[conv.inputs[0].node]
            p = pool.attrs
            if (a["groups"] != 1 or a["strides"] != (1, 1) or any(a["padding"])
                    or a["data_layout"] != "NCHW" or a["kernel_layout"] != "OIHW"
                    or graph.type_of(conv.inputs[1]).shape[2:] != (1, 1)
                    or pool.kind != "avg_pool2d" or p["ceil_mode"] or p["dilation"] != (1, 1)
                    or p["layout"] != "NCHW" or p["out_layout"] != "NCHW"
                    or not (p["count_include_pad"] or not any(p["padding"]))
                    or not _only_reader(graph, pool.out, conv.id)
                    or conv.type.shape[1] >= pool.type.shape[1]
                    or pool.type.shape[2:] != graph.type_of(pool.inputs[0]).shape[2:]):
                continue
            out.append(Match(self, (conv.id, pool.id)))
        return out

    def rewrite(self, graph: Graph, match: Match) -> Graph | None:
        conv, pool = graph[match.nodes[0]], graph[match.nodes[1]]
        b = Builder(graph)
        mixed = b.op("conv2d", [pool.inputs[0], conv.inputs[1]], dict(conv.attrs),
                     name=conv.name)
        pooled = b.op("avg_pool2d", [mixed.out], dict(pool.attrs), name=pool.name)
        return commit(graph, match.nodes, b, {conv.out: pooled.out})

    def obligations(self) -> list[Obligation]:
        x, w = var("x"), var("w")
        pool = app("pool_avg", x, kh="kh", kw="kw", stride="s", pad="p")
        one_by_one = (("eq", ("dim", "w", -2), 1), ("eq", ("dim", "w", -1), 1))
        return [("a 1 x 1 kernel w, a pool counting its padding",
                 [_conv(pool, w, stride=1, pad=VALID, act=NONE, groups=1)],
                 [app("pool_avg", _conv(x, w, stride=1, pad=VALID, act=NONE, groups=1),
                      kh="kh", kw="kw", stride="s", pad="p")], one_by_one)]

    def hint(self) -> tuple[str, ...]:
        return ("pc",)

    def example(self, rng: np.random.Generator) -> Graph:
        b = GraphBuilder()
        c = int(rng.integers(3, 7))
        x = b.input((int(rng.integers(1, 3)), c, 7, 6))
        k = int(rng.choice([1, 3, 5]))  # odd, stride 1: the image keeps its size
        pool = b.op("avg_pool2d", [x], {"pool_size": k, "padding": k // 2,
                                         "count_include_pad": True})
        o = int(rng.integers(1, c))
        w = b.weight(rng.standard_normal((o, c, 1, 1)).astype("f4"))
        y = b.op("conv2d", [pool.out, w], {"padding": 0})
        y = b.op("add", [y.out, b.weight(rng.standard_normal((1, o, 1, 1)).astype("f4"))])
        return b.build([b.op("relu", [y.out]).out])


# ---------------------------------------------------------------------------- matmuls
def _split_back(graph: Graph, b: Builder, nodes: Sequence[Node], merged: TensorRef,
                axis: int) -> Graph | None:
    """Split ``merged`` along ``axis`` into the merged ``nodes``' outputs (each its own size
    there) and commit: their readers read the pieces."""
    cuts = list(itertools.accumulate(n.type.shape[axis] for n in nodes))[:-1]
    split = b.op("split", [merged], {"indices_or_sections": tuple(cuts), "axis": axis})
    remap = {n.out: TensorRef(split.id, i) for i, n in enumerate(nodes)}
    return commit(graph, [n.id for n in nodes], b, remap)


@dataclass(frozen=True)
class MergeMatmuls(ParametricRule):
    """n matmuls (or linears) reading the same input with weight matrices -> one with the
    weights concatenated, output split (TASO fig. 2.2b; axiom 36, and 35/32 for linear)."""

    def find(self, graph: Graph) -> list[Match]:
        groups: dict[tuple[Any, ...], list[int]] = {}
        for n in graph.nodes:
            if n.kind == "matmul" and len(graph.type_of(n.inputs[1]).shape) == 2 and _is_weight(
                    graph, n.inputs[1]) and len(n.type.shape) >= 2:
                groups.setdefault(("matmul", n.inputs[0], n.attrs), []).append(n.id)
            elif n.kind == "linear" and all(_is_weight(graph, r) for r in n.inputs[1:]):
                groups.setdefault(("linear", n.inputs[0], len(n.inputs), n.attrs),
                                  []).append(n.id)
        return [Match(self, tuple(ids), extra={"ops": tuple(ids)})
                for ids in groups.values() for ids in _groups_and_pairs(ids)]

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
            merged = app("matmul", x, _nested_concat(ws, -1))
            out.append((f"matmul n={n}", [app("matmul", x, w) for w in ws],
                        _nested_split(merged, n, -1), ()))
        ws, bs = [var("w0"), var("w1")], [var("b0"), var("b1")]
        lin = [app("ewadd", app("matmul", x, app("transpose", w)), bias)
               for w, bias in zip(ws, bs, strict=True)]
        merged = app("ewadd", app("matmul", x, app("transpose", _nested_concat(ws, -2))),
                     _nested_concat(bs, -1))
        out.append(("linear n=2: x W^T + b", lin, _nested_split(merged, 2, -1), ()))
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


@dataclass(frozen=True)
class MergeMatmulRows(ParametricRule):
    """n matmuls of different inputs by the same weight matrix -> one matmul of the inputs'
    rows concatenated, output split by rows (TASO's axiom 36 for rows, 36r here): an RNN's
    input projections, one small product per step (each reading the whole matrix) batched
    into one that reads it once. Inputs that depend on another member's output (a
    recurrence) are not merged."""

    def find(self, graph: Graph) -> list[Match]:
        groups: dict[tuple[Any, ...], list[int]] = {}
        for n in graph.nodes:
            if (n.kind == "matmul" and len(n.type.shape) == 2
                    and len(graph.type_of(n.inputs[0]).shape) == 2
                    and len(graph.type_of(n.inputs[1]).shape) == 2
                    and _is_weight(graph, n.inputs[1])):
                groups.setdefault((n.inputs[1], n.attrs, graph.type_of(n.inputs[0]).dtype),
                                  []).append(n.id)
        out = []
        for ids in groups.values():
            if len(ids) < 2:
                continue
            before = {i: graph.ancestors(i) for i in ids}
            for group in _groups_and_pairs(ids):
                if not any(j in before[i] for i in group for j in group if i != j):
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
            merged = app("matmul", _nested_concat(xs, -2), w)
            out.append((f"matmul rows n={n}", [app("matmul", x, w) for x in xs],
                        _nested_split(merged, n, -2), ()))
        return out

    def example(self, rng: np.random.Generator) -> Graph:
        b = GraphBuilder()
        k, m = int(rng.integers(2, 6)), int(rng.integers(1, 5))
        w = b.weight(rng.standard_normal((k, m)).astype("f4"))
        outs = [b.op("matmul", [b.input((int(rng.integers(1, 4)), k)), w]).out
                for _ in range(int(rng.integers(2, 4)))]
        return b.build(outs)


# ---------------------------------------------------------------------------- batch norm
@dataclass(frozen=True)
class FoldBatchNorm(ParametricRule):
    """conv -> inference batch norm  =>  conv with scaled kernel + per-channel bias (the
    fusion every framework does; MetaFlow's fuse_conv_batch; axiom ``cs``)."""

    def find(self, graph: Graph) -> list[Match]:
        out = []
        for bn in graph.nodes:
            if bn.kind != "batch_norm" or bn.attrs["training"] or bn.attrs["axis"] not in (1, -3):
                continue
            conv = graph[bn.inputs[0].node]
            if (not _plain_conv(conv, graph) or not _only_reader(graph, conv.out, bn.id)
                    or not all(_is_weight(graph, r) for r in bn.inputs[1:])):
                continue
            readers = [r for u in graph.users(bn.id) for r in graph[u].inputs] + list(
                graph.outputs)
            if any(r.node == bn.id and r.index > 0 for r in readers):
                continue  # the running mean/var outputs are read
            out.append(Match(self, (bn.id, conv.id)))
        return out

    def rewrite(self, graph: Graph, match: Match) -> Graph | None:
        bn, conv = graph[match.nodes[0]], graph[match.nodes[1]]
        gamma, beta, mean, var_ = (_value(graph, r).astype(np.float64) for r in bn.inputs[1:])
        a = bn.attrs
        scale = 1.0 / np.sqrt(var_ + a["epsilon"])
        if a["scale"]:
            scale = scale * gamma
        shift = -mean * scale + (beta if a["center"] else 0.0)
        w = _value(graph, conv.inputs[1])
        dtype = w.dtype
        b = Builder(graph)
        kernel = b.constant((w * scale.reshape(-1, 1, 1, 1)).astype(dtype), name="folded_bn_w")
        bias = b.constant(shift.reshape(1, -1, 1, 1).astype(dtype), name="folded_bn_b")
        new = b.op("conv2d", [conv.inputs[0], kernel.out], conv.attrs, name=conv.name)
        add = b.op("add", [new.out, bias.out], {}, name=bn.name)
        return commit(graph, [bn.id, conv.id], b, {TensorRef(bn.id, 0): add.out})

    def obligations(self) -> list[Obligation]:
        x, w, a, bias = var("x"), var("w"), var("a"), var("b")
        conv = app("conv2d", x, w, stride="s", pad="p", act=NONE, groups="g")
        folded = app("conv2d", x, app("chmul", w, a, axis=-4), stride="s", pad="p", act=NONE,
                     groups="g")
        return [("bn(y) = chmul(y, a) + b", [app("ewadd", app("chmul", conv, a, axis=-3), bias)],
                 [app("ewadd", folded, bias)], ())]

    def example(self, rng: np.random.Generator) -> Graph:
        b = GraphBuilder()
        c, o = int(rng.integers(1, 4)), int(rng.integers(1, 5))
        x = b.input((int(rng.integers(1, 3)), c, 6, 6))
        w = b.weight(rng.standard_normal((o, c, 3, 3)).astype("f4"))
        y = b.op("conv2d", [x, w], {"padding": 1, "strides": int(rng.integers(1, 3))})
        params = [b.weight(rng.uniform(0.5, 1.5, o).astype("f4")) for _ in range(2)]
        mean = b.weight(rng.standard_normal(o).astype("f4"))
        var_ = b.weight(rng.uniform(0.5, 1.5, o).astype("f4"))
        bn = b.op("batch_norm", [y.out, params[0], params[1], mean, var_],
                  {"training": False, "epsilon": 1e-3})
        return b.build([bn.out])


# ---------------------------------------------------------------------------- conv + add
@dataclass(frozen=True)
class ConvAddIdentity(ParametricRule):
    """conv(x, W) (+ bias) + z  =>  conv(concat(x, z), concat(W, I_conv)) (+ bias): the add
    folded into the convolution through an identity kernel (MetaFlow fig. 4b, section 3;
    TASO axioms 40 and 25). Stride 1, SAME padding, one group."""

    def find(self, graph: Graph) -> list[Match]:
        out = []
        for add in graph.nodes:
            if add.kind != "add":
                continue
            for u, z in (add.inputs, add.inputs[::-1]):
                node, bias = graph[u.node], None
                if (node.kind == "add" and _is_weight(graph, node.inputs[1])
                        and _only_reader(graph, node.out, add.id)):
                    bias, u = node, node.inputs[0]
                    node = graph[u.node]
                reader = bias.id if bias else add.id
                if (_plain_conv(node, graph) and node.attrs["groups"] == 1
                        and node.attrs["strides"] == (1, 1) and _centred(node, graph)
                        and _only_reader(graph, node.out, reader)
                        and graph.type_of(z) == node.type == add.type
                        and (bias is None or bias.type == node.type)):
                    ids = (add.id, node.id) + ((bias.id,) if bias else ())
                    out.append(Match(self, ids, extra={"z": z}))
                    break
        return out

    def rewrite(self, graph: Graph, match: Match) -> Graph | None:
        add, conv = graph[match.nodes[0]], graph[match.nodes[1]]
        z = match.extra["z"]
        w = _value(graph, conv.inputs[1])
        o, _, kh, kw = w.shape
        ident = np.zeros((o, o, kh, kw), w.dtype)
        ident[np.arange(o), np.arange(o), kh // 2, kw // 2] = 1
        b = Builder(graph)
        x = b.op("concat", [conv.inputs[0], z], {"axis": 1})
        kernel = b.constant(np.concatenate([w, ident], axis=1), name="w_and_identity")
        result = b.op("conv2d", [x.out, kernel.out], conv.attrs, name=add.name)
        if len(match.nodes) == 3:
            bias = graph[match.nodes[2]]
            result = b.op("add", [result.out, bias.inputs[1]], {}, name=bias.name)
        return commit(graph, match.nodes, b, {add.out: result.out})

    def obligations(self) -> list[Obligation]:
        x, w, z, bias = var("x"), var("w"), var("z"), var("b")

        def conv(xx: Term, ww: Term) -> Term:
            return app("conv2d", xx, ww, stride=1, pad=SAME, act=NONE, groups=1)
        merged = conv(app("concat", x, z, axis=-3),
                      app("concat", w, app("i_conv", kh="kh", kw="kw"), axis=-3))
        return [("conv + add", [app("ewadd", conv(x, w), z)], [merged], ()),
                ("conv + bias + add", [app("ewadd", app("ewadd", conv(x, w), bias), z)],
                 [app("ewadd", merged, bias)], ())]

    def example(self, rng: np.random.Generator) -> Graph:
        b = GraphBuilder()
        c, o, k = int(rng.integers(1, 4)), int(rng.integers(1, 4)), int(rng.choice([1, 3]))
        x = b.input((1, c, 5, 6))
        z = b.input((1, o, 5, 6))
        w = b.weight(rng.standard_normal((o, c, k, k)).astype("f4"))
        y = b.op("conv2d", [x, w], {"padding": k // 2}).out
        if rng.integers(0, 2):
            y = b.op("add", [y, b.weight(rng.standard_normal((1, o, 1, 1)).astype("f4"))]).out
        return b.build([b.op("add", [z, y]).out])


# ---------------------------------------------------------------------------- SRU
@dataclass(frozen=True)
class SruDistribute(ParametricRule):
    """x*y + (1-x)*z  =>  x*(y-z) + z: 4 element-wise operators to 3 (MetaFlow section 6,
    the SRU rewrite TensorRT missed; axioms ``sub``, 5, 4, 8, 27, 1, 2)."""

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
                        if (_only_reader(graph, m1.out, add.id)
                                and _only_reader(graph, m2.out, add.id)
                                and _only_reader(graph, s.out, m2.id)):
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


# ---------------------------------------------------------------------------- registry
# What each schema matches, what it builds, under which conditions, and how outputs map.
DESCRIPTIONS = {
    "merge_convs": {
        "source": "chain_i(conv2d(x, W_i)) for i = 1..n, n >= 2, the same x, chain_i a "
                  "per-channel element-wise chain (possibly empty)",
        "target": "slice_1(chain(conv2d(x, concat_0(enlarge(W_i, K))), concat_1 of the "
                  "chains' constants), channels of i)",
        "constraints": ["groups 1", "equal square strides", "equal output sizes",
                        "SAME padding (odd kernels), or one kernel size and padding",
                        "W_i weights", "K = the largest kernel height and width",
                        "the same chain operators at the same places, constants per channel "
                        "or scalar, each chain value read once"],
        "outputs": "last of chain_i (or conv2d_i) -> slice i"},
    "regroup": {
        "source": "conv2d(x, W, groups=g)",
        "target": "conv2d(x, blockdiag(W), groups=g/factor)",
        "constraints": ["g divisible by factor", "W a weight (the new kernel is folded)"],
        "outputs": "conv2d -> conv2d"},
    "split_grouped_conv": {
        "source": "conv2d(x, W, groups=g)",
        "target": "concat_1(conv2d(split_1(x)_i, split_0(W)_i, groups=g/parts))",
        "constraints": ["g divisible by parts", "W a weight"],
        "outputs": "conv2d -> concat"},
    "split_conv": {
        "source": "conv2d(x, W) and the per-channel element-wise chain after it",
        "target": "concat_1(chain_i(conv2d(x, split_0(W)_i)))",
        "constraints": ["groups 1", "W a weight", "output channels divisible by parts",
                        "chain constants per channel or scalar, each chain value read once"],
        "outputs": "last of the chain -> concat"},
    "avg_pool_pair": {
        "source": "add(avg_pool2d(x), avg_pool2d(x)), the same pool twice",
        "target": "conv2d(x, 2*C_pool, groups=C) [* constant ratio map if the pools do not "
                  "count their padding]",
        "constraints": ["equal pool attributes", "ceil_mode false", "dilation 1",
                        "each pool read by the add only"],
        "outputs": "add -> conv2d (or the multiply)"},
    "pool_after_conv": {
        "source": "conv2d(avg_pool2d(x), W), W 1 x 1",
        "target": "avg_pool2d(conv2d(x, W))",
        "constraints": ["conv: stride 1, no padding, groups 1, no bias operand, W a weight",
                        "fewer output channels than the pool's",
                        "the pool keeps the height and width",
                        "the pool counts its padding (or has none)", "ceil_mode false",
                        "dilation 1", "the pool read by the conv only"],
        "outputs": "conv2d -> avg_pool2d"},
    "merge_matmuls": {
        "source": "matmul(x, W_i) (or linear(x, W_i, b_i)) for i = 1..n, n >= 2, the same x",
        "target": "split(matmul(x, concat_1(W_i))) (linear: concat_0 of W_i and b_i)",
        "constraints": ["W_i (and b_i) weights", "W_i of rank 2"],
        "outputs": "op_i -> split piece i"},
    "merge_matmul_rows": {
        "source": "matmul(x_i, W) for i = 1..n, n >= 2, the same W",
        "target": "split_0(matmul(concat_0(x_i), W))",
        "constraints": ["W a weight", "x_i, W and the outputs of rank 2",
                        "no x_i depends on another member's output"],
        "outputs": "op_i -> split piece i"},
    "fold_batch_norm": {
        "source": "batch_norm(conv2d(x, W), gamma, beta, mean, var), inference",
        "target": "add(conv2d(x, W * a), b) with a = gamma / sqrt(var + eps), "
                  "b = beta - mean * a",
        "constraints": ["training false", "channel axis 1", "all parameters weights",
                        "the conv read by the batch norm only", "mean/var outputs unused"],
        "outputs": "batch_norm.0 -> add"},
    "conv_add_identity": {
        "source": "add(conv2d(x, W) [+ bias], z)",
        "target": "conv2d(concat_1(x, z), concat_1(W, I_conv)) [+ bias]",
        "constraints": ["stride 1", "SAME padding", "groups 1", "z of the conv's output shape",
                        "the conv (and bias add) read only inside the match"],
        "outputs": "add -> conv2d (or the bias add)"},
    "sru_distribute": {
        "source": "add(multiply(x, y), multiply(subtract(1, x), z))",
        "target": "add(multiply(x, subtract(y, z)), z)",
        "constraints": ["x, y, z of the output's shape", "the constant is all ones",
                        "intermediates read only inside the match"],
        "outputs": "add -> add"},
}

SCHEMAS = {"merge_convs": MergeConvs, "regroup": Regroup, "split_grouped_conv": SplitGroupedConv,
           "split_conv": SplitConv, "avg_pool_pair": AvgPoolPair,
           "pool_after_conv": PoolAfterConv, "merge_matmuls": MergeMatmuls,
           "merge_matmul_rows": MergeMatmulRows,
           "fold_batch_norm": FoldBatchNorm, "conv_add_identity": ConvAddIdentity,
           "sru_distribute": SruDistribute}


def all_parametric() -> list[ParametricRule]:
    """Every parametric rule paragraph ships, with its id, name and the paper it follows."""
    return [
        MergeConvs("ios-merge-convs", "merge convs sharing an input (enlarge + concat + split)",
                   "IOS section 4 operator merge; MetaFlow fig. 1, 4a", "merge_convs"),
        Regroup("autograph-regroup-2", "grouped conv: g groups -> g/2", "AutoGraph fig. 9",
                "regroup", 2),
        Regroup("autograph-regroup-4", "grouped conv: g groups -> g/4", "AutoGraph fig. 9",
                "regroup", 4),
        SplitGroupedConv("autograph-split-groups-2", "grouped conv -> 2 parallel convs",
                         "AutoGraph fig. 9", "split_grouped_conv", 2),
        SplitGroupedConv("autograph-split-groups-4", "grouped conv -> 4 parallel convs",
                         "AutoGraph fig. 9", "split_grouped_conv", 4),
        AvgPoolPair("taso-avgpool-pair-dwconv", "avg_pool(x) + avg_pool(x) -> depth-wise conv",
                    "TASO fig. 2.8b", "avg_pool_pair"),
        PoolAfterConv("pool-after-conv1x1", "avg_pool + 1x1 conv -> 1x1 conv + avg_pool",
                      "TASO section 2.2 (linearity; axiom pc)", "pool_after_conv"),
        MergeMatmuls("taso-merge-matmuls", "merge matmuls sharing an operand (concat + split)",
                     "TASO fig. 2.2b", "merge_matmuls"),
        MergeMatmulRows("taso-merge-matmul-rows",
                        "merge matmuls sharing a weight (concat rows + split)",
                        "TASO axiom 36 for rows (36r)", "merge_matmul_rows"),
        FoldBatchNorm("metaflow-fold-bn", "fold inference batch norm into the conv",
                      "MetaFlow artifact fuse_conv_batch", "fold_batch_norm"),
        ConvAddIdentity("metaflow-conv-add", "conv + add -> conv through an identity kernel",
                        "MetaFlow fig. 4b", "conv_add_identity"),
        SruDistribute("metaflow-sru", "x*y + (1-x)*z -> x*(y-z) + z", "MetaFlow section 6",
                      "sru_distribute"),
        SplitConv("split-conv-2", "conv + per-channel chain -> 2 convs on output channels",
                  "TASO axiom 39 read backwards (IOS merge inverted)", "split_conv", 2),
        SplitConv("split-conv-4", "conv + per-channel chain -> 4 convs on output channels",
                  "TASO axiom 39 read backwards (IOS merge inverted)", "split_conv", 4),
    ]


# ---------------------------------------------------------------------------- checks
def prove(rule: ParametricRule, prover: Prover | None = None) -> dict[str, Any]:
    """Discharge every obligation with z3; the proof record for the library."""
    hint = by_name(rule.hint()) if prover is None else []
    prover = prover or Prover()
    axioms: set[str] = set()
    instances = []
    status = "verified"
    for desc, lhs, rhs, hyps in rule.obligations():
        p = None
        # z3's search depends on its history: a few seeds on the small set, then everything
        for seed in range(4 if hint else 0):
            p = Prover(hint, rlimit=DEFAULT_RLIMIT // 4, seed=seed).prove(lhs, rhs, hyps)
            if p.status == "verified":
                break
        if p is None or p.status != "verified":
            p = prover.prove(lhs, rhs, hyps)
        instances.append({"case": desc, "status": p.status,
                          "source": [repr(t) for t in lhs], "target": [repr(t) for t in rhs]})
        axioms.update(p.axioms)
        if p.status != "verified":
            status = p.status

    return {"status": status, "axioms": sorted(axioms, key=axiom_order), "z3": z3_version(),
            "obligations": instances}


def check_numeric(rule: ParametricRule, seed: int = 0, tol: float = 1e-4) -> int:
    """Rewrite every match in a random example graph; compare outputs with numpy.

    Returns the number of rewrites checked; raises AssertionError on a difference.
    """
    rng = np.random.default_rng(seed)
    graph = rule.example(rng)
    inputs = [rng.standard_normal(graph[i].type.shape).astype(graph[i].type.dtype)
              for i in graph.inputs]
    expected = run_graph(graph, inputs)
    checked = 0
    for match in rule.find(graph):
        new = rule.rewrite(graph, match)
        if new is None:
            continue
        new.validate()
        got = run_graph(new, inputs)
        for e, g in zip(expected, got, strict=True):
            assert e.shape == g.shape, f"{rule.id}: shape {g.shape} != {e.shape}"
            err = float(np.max(np.abs(e - g))) if e.size else 0.0
            assert np.allclose(e, g, rtol=tol, atol=tol), f"{rule.id}: max error {err}"
        checked += 1
    return checked
