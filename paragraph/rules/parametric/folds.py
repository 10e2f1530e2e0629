"""Folding schemas: an operator after a convolution folded into the convolution itself, an
inference batch norm into its kernel and a bias (MetaFlow's fuse_conv_batch), an added
tensor through an identity kernel (MetaFlow fig. 4b)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paragraph.graph import Graph, GraphBuilder, TensorRef
from paragraph.rules.match import Builder, Match, commit
from paragraph.rules.parametric.base import Obligation, ParametricRule, Schema, ship
from paragraph.rules.parametric.predicates import (
    centred,
    is_weight,
    only_reader,
    plain_conv,
    value_of,
)
from paragraph.rules.specs import NONE, SAME, Term, app, var


# ---------------------------------------------------------------------------- batch norm
@ship(9, "metaflow-fold-bn", "fold inference batch norm into the conv",
      "MetaFlow artifact fuse_conv_batch")
@dataclass(frozen=True)
class FoldBatchNorm(ParametricRule):
    """conv -> inference batch norm  =>  conv with scaled kernel + per-channel bias (the
    fusion every framework does; MetaFlow's fuse_conv_batch; axiom ``cs``)."""

    SCHEMA = Schema(
        "fold_batch_norm",
        source="batch_norm(conv2d(x, W), gamma, beta, mean, var), inference",
        target="add(conv2d(x, W * a), b) with a = gamma / sqrt(var + eps), b = beta - mean * a",
        constraints=(
            "training false",
            "channel axis 1",
            "all parameters weights",
            "the conv read by the batch norm only",
            "mean/var outputs unused",
        ),
        outputs="batch_norm.0 -> add")

    def find(self, graph: Graph) -> list[Match]:
        out = []
        for bn in graph.nodes:
            if bn.kind != "batch_norm" or bn.attrs["training"] or bn.attrs["axis"] not in (1, -3):
                continue
            conv = graph[bn.inputs[0].node]
            if (not plain_conv(conv, graph) or not only_reader(graph, conv.out, bn.id)
                    or not all(is_weight(graph, r) for r in bn.inputs[1:])):
                continue
            readers = [r for u in graph.users(bn.id) for r in graph[u].inputs] + list(
                graph.outputs)
            if any(r.node == bn.id and r.index > 0 for r in readers):
                continue  # the running mean/var outputs are read
            out.append(Match(self, (bn.id, conv.id)))
        return out

    def rewrite(self, graph: Graph, match: Match) -> Graph | None:
        bn, conv = graph[match.nodes[0]], graph[match.nodes[1]]
        gamma, beta, mean, var_ = (value_of(graph, r).astype(np.float64) for r in bn.inputs[1:])
        a = bn.attrs
        scale = 1.0 / np.sqrt(var_ + a["epsilon"])
        if a["scale"]:
            scale = scale * gamma
        shift = -mean * scale + (beta if a["center"] else 0.0)
        w = value_of(graph, conv.inputs[1])
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
@ship(10, "metaflow-conv-add", "conv + add -> conv through an identity kernel", "MetaFlow fig. 4b")
@dataclass(frozen=True)
class ConvAddIdentity(ParametricRule):
    """conv(x, W) (+ bias) + z  =>  conv(concat(x, z), concat(W, I_conv)) (+ bias): the add
    folded into the convolution through an identity kernel (MetaFlow fig. 4b, section 3;
    TASO axioms 40 and 25). Stride 1, SAME padding, one group."""

    SCHEMA = Schema(
        "conv_add_identity",
        source="add(conv2d(x, W) [+ bias], z)",
        target="conv2d(concat_1(x, z), concat_1(W, I_conv)) [+ bias]",
        constraints=(
            "stride 1",
            "SAME padding",
            "groups 1",
            "z of the conv's output shape",
            "the conv (and bias add) read only inside the match",
        ),
        outputs="add -> conv2d (or the bias add)")

    def find(self, graph: Graph) -> list[Match]:
        out = []
        for add in graph.nodes:
            if add.kind != "add":
                continue
            for u, z in (add.inputs, add.inputs[::-1]):
                node, bias = graph[u.node], None
                if (node.kind == "add" and is_weight(graph, node.inputs[1])
                        and only_reader(graph, node.out, add.id)):
                    bias, u = node, node.inputs[0]
                    node = graph[u.node]
                reader = bias.id if bias else add.id
                if (plain_conv(node, graph) and node.attrs["groups"] == 1
                        and node.attrs["strides"] == (1, 1) and centred(node, graph)
                        and only_reader(graph, node.out, reader)
                        and graph.type_of(z) == node.type == add.type
                        and (bias is None or bias.type == node.type)):
                    ids = (add.id, node.id) + ((bias.id,) if bias else ())
                    out.append(Match(self, ids, extra={"z": z}))
                    break
        return out

    def rewrite(self, graph: Graph, match: Match) -> Graph | None:
        add, conv = graph[match.nodes[0]], graph[match.nodes[1]]
        z = match.extra["z"]
        w = value_of(graph, conv.inputs[1])
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

