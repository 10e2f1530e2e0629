"""Average-pool schemas: two equal pools added -> one depth-wise convolution (TASO fig.
2.8b), and a 1 x 1 convolution after a pool moved in front of it (linearity, axiom
``pc``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from paragraph import ops as graph_ops
from paragraph.graph import Graph, GraphBuilder
from paragraph.rules.match import Builder, Match, commit
from paragraph.rules.parametric.base import Obligation, ParametricRule, Schema, ship
from paragraph.rules.parametric.predicates import only_reader, plain_conv
from paragraph.rules.parametric.terms import conv_term
from paragraph.rules.specs import NONE, VALID, app, var


def _ratio_map(x_shape: tuple[int, ...], attrs: Mapping[str, Any]) -> np.ndarray:
    """k*k / (window positions inside the input): turns a padding-counting average pool into
    one that does not (shape (1, 1, OH, OW))."""
    ones = np.ones((1, 1) + tuple(x_shape[2:]), np.float32)
    incl = graph_ops.compute("avg_pool2d", [ones], {**attrs, "count_include_pad": True})[0]
    return (1.0 / incl).astype(np.float32)


@ship(5, "taso-avgpool-pair-dwconv", "avg_pool(x) + avg_pool(x) -> depth-wise conv",
      "TASO fig. 2.8b")
@dataclass(frozen=True)
class AvgPoolPair(ParametricRule):
    """avg_pool(x) + avg_pool(x) (the same pool twice, as in NASNet-A's normal cell) -> one
    depth-wise conv with kernel 2 * C_pool (TASO fig. 2.8b: pools as convs with C_pool, then
    conv linearity). For pools that do not count their padding, the conv's output is scaled
    by a constant map (one more, element-wise, operator)."""

    SCHEMA = Schema(
        "avg_pool_pair",
        source="add(avg_pool2d(x), avg_pool2d(x)), the same pool twice",
        target="conv2d(x, 2*C_pool, groups=C) [* constant ratio map if the pools do not count "
               "their padding]",
        constraints=(
            "equal pool attributes",
            "ceil_mode false",
            "dilation 1",
            "each pool read by the add only",
        ),
        outputs="add -> conv2d (or the multiply)")

    def find(self, graph: Graph) -> list[Match]:
        out = []
        for add in graph.nodes:
            if add.kind != "add" or add.inputs[0].node == add.inputs[1].node:
                continue
            p, q = (graph[r.node] for r in add.inputs)
            if (p.kind == q.kind == "avg_pool2d" and p.inputs == q.inputs and p.attrs == q.attrs
                    and not p.attrs["ceil_mode"] and p.attrs["dilation"] == (1, 1)
                    and p.attrs["layout"] == "NCHW" and p.attrs["out_layout"] == "NCHW"
                    and only_reader(graph, p.out, add.id) and only_reader(graph, q.out,
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


@ship(6, "pool-after-conv1x1", "avg_pool + 1x1 conv -> 1x1 conv + avg_pool",
      "TASO section 2.2 (linearity; axiom pc)")
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

    SCHEMA = Schema(
        "pool_after_conv",
        source="conv2d(avg_pool2d(x), W), W 1 x 1",
        target="avg_pool2d(conv2d(x, W))",
        constraints=(
            "conv: stride 1, no padding, groups 1, no bias operand, W a weight",
            "fewer output channels than the pool's",
            "the pool keeps the height and width",
            "the pool counts its padding (or has none)",
            "ceil_mode false",
            "dilation 1",
            "the pool read by the conv only",
        ),
        outputs="conv2d -> avg_pool2d")

    def find(self, graph: Graph) -> list[Match]:
        out = []
        for conv in graph.nodes:
            if conv.kind != "conv2d" or not plain_conv(conv, graph):
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
                    or not only_reader(graph, pool.out, conv.id)
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
                 [conv_term(pool, w, stride=1, pad=VALID, act=NONE, groups=1)],
                 [app("pool_avg", conv_term(x, w, stride=1, pad=VALID, act=NONE, groups=1),
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

