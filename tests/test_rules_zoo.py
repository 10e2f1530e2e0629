"""Rules on the reduced zoo: every rule that matches a model keeps its outputs (numpy), and
the parametric rules' rewrites keep them through TVM too; a property test chains random
rewrites on random graphs."""

import numpy as np
import pytest
import tvm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paragraph import GraphBuilder, models
from paragraph.interpret import run_graph
from paragraph.rules import apply_match, find_matches, load_library
from paragraph.rules.match import kind_index
from paragraph.tvm_interop import from_relax, to_relax
from paragraph.tvm_interop.runtime.vm import build_vm, run_vm

LIB = load_library()
RULES = LIB.for_search()
TOL = 1e-4


def _inputs(graph, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(graph[i].type.shape).astype(graph[i].type.dtype)
            for i in graph.inputs]


def _close(expected, got, tol=TOL):
    assert len(expected) == len(got)
    for e, g in zip(expected, got, strict=True):
        assert e.shape == g.shape
        scale = max(1.0, float(np.max(np.abs(e))))
        np.testing.assert_allclose(g, e, rtol=tol, atol=tol * scale)


@pytest.fixture(scope="module")
def zoo():
    return {name: from_relax(models.get(name, reduced=True)) for name in models.list()}


@pytest.mark.parametrize("name", models.list())
def test_every_matching_rule_keeps_the_outputs(zoo, name):
    graph = zoo[name]
    xs = _inputs(graph)
    expected = run_graph(graph, xs)
    index = kind_index(graph)
    applied = []
    for rule in RULES:
        for match in find_matches(graph, rule, index):
            new = apply_match(graph, match)
            if new is None:
                continue
            new.validate()
            _close(expected, run_graph(new, xs))
            applied.append(rule.id)
            break
    assert len(applied) >= 3, applied


def _parametric_rewrites(graph):
    """The graph with one match of each parametric rule rewritten, in turn."""
    applied = []
    for rule in LIB.parametric:
        for match in rule.find(graph):
            new = apply_match(graph, match)
            if new is not None:
                graph = new
                applied.append(rule.id)
                break
    return graph, applied


TVM_MODELS = {"inception_v3": {"ios-merge-convs", "metaflow-fold-bn", "split-conv-2",
                               "split-conv-4"},
              "resnext50_32x4d": {"autograph-regroup-2", "autograph-split-groups-4"},
              "nasnet_a_mobile": {"taso-avgpool-pair-dwconv"},
              "squeezenet1_1": {"metaflow-conv-add", "ios-merge-convs"},
              "bert": {"taso-merge-matmuls"}, "sru_rnntc": {"metaflow-sru"}}


@pytest.mark.parametrize("name", sorted(TVM_MODELS))
def test_parametric_rewrites_through_tvm(zoo, name):
    graph = zoo[name]
    new, applied = _parametric_rewrites(graph)
    assert TVM_MODELS[name] <= set(applied), applied
    mod = models.get(name, reduced=True)
    both = tvm.IRModule({**{gv: f for gv, f in mod.functions.items()},
                         tvm.ir.GlobalVar("rewritten"):
                         to_relax(new)["main"].without_attr("global_symbol")})
    vm = build_vm(both, "llvm")
    xs = _inputs(graph, seed=1)
    _close(run_vm(vm, xs, "main"), run_vm(vm, xs, "rewritten"))


def test_every_parametric_rule_is_checked_through_tvm():
    covered = set().union(*TVM_MODELS.values())
    missing = {r.id for r in LIB.parametric} - covered
    # the rest are checked on their example graphs below
    for rule in LIB.parametric:
        if rule.id not in missing:
            continue
        rng = np.random.default_rng(0)
        graph = rule.example(rng)
        match = rule.find(graph)[0]
        new = apply_match(graph, match)
        both = to_relax(graph)
        both[tvm.ir.GlobalVar("rewritten")] = to_relax(new)["main"].without_attr(
            "global_symbol")
        vm = build_vm(both, "llvm")
        xs = _inputs(graph, seed=2)
        _close(run_vm(vm, xs, "main"), run_vm(vm, xs, "rewritten"))


# ---------------------------------------------------------------------------- property test
def _image_graph(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    b = GraphBuilder()
    tensors = [b.input((1, 4, 5, 5))]
    for _ in range(draw(st.integers(2, 6))):
        kind = draw(st.sampled_from(["conv3", "conv1", "relu", "add", "mul", "avg", "max",
                                     "concat_conv"]))
        x = tensors[draw(st.integers(0, len(tensors) - 1))]
        y = tensors[draw(st.integers(0, len(tensors) - 1))]
        if kind in ("conv3", "conv1"):
            k = 3 if kind == "conv3" else 1
            w = b.weight((rng.standard_normal((4, 4, k, k)) / (4 * k)).astype("f4"))
            node = b.op("conv2d", [x, w], {"padding": k // 2})
        elif kind == "concat_conv":
            cat = b.op("concat", [x, y], {"axis": 1})
            w = b.weight((rng.standard_normal((4, 8, 3, 3)) / 12).astype("f4"))
            node = b.op("conv2d", [cat.out, w], {"padding": 1})
        elif kind in ("avg", "max"):
            attrs = {"pool_size": 3, "padding": 1}
            if kind == "avg":
                attrs["count_include_pad"] = True
            node = b.op("avg_pool2d" if kind == "avg" else "max_pool2d", [x], attrs)
        else:
            node = b.op({"relu": "relu", "add": "add", "mul": "multiply"}[kind],
                        [x] if kind == "relu" else [x, y])
        tensors.append(node.out)
    used = {r for n in b.nodes for r in n.inputs}
    return b.build([t for t in tensors[1:] if t not in used] or [tensors[-1]])


def _matrix_graph(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    b = GraphBuilder()
    tensors = [b.input((3, 4))]
    for _ in range(draw(st.integers(2, 6))):
        kind = draw(st.sampled_from(["mm", "mm_shared", "transpose2", "relu", "add", "scale"]))
        x = tensors[draw(st.integers(0, len(tensors) - 1))]
        n = b.type_of(x).shape[-1]
        if kind in ("mm", "mm_shared"):
            outs = [b.op("matmul", [x, b.weight((rng.standard_normal((n, 4)) / n).astype(
                "f4"))]).out for _ in range(1 if kind == "mm" else 2)]
            tensors += outs
            continue
        if kind == "transpose2":
            t = b.op("permute_dims", [x], {"axes": (1, 0)})
            node = b.op("permute_dims", [t.out], {"axes": (1, 0)})
        elif kind == "scale":
            node = b.op("multiply", [x, b.constant(np.float32(rng.uniform(-2, 2)))])
        elif kind == "add":
            same = [t for t in tensors if b.type_of(t) == b.type_of(x)]
            node = b.op("add", [x, same[draw(st.integers(0, len(same) - 1))]])
        else:
            node = b.op("relu", [x])
        tensors.append(node.out)
    used = {r for n in b.nodes for r in n.inputs}
    return b.build([t for t in tensors[1:] if t not in used] or [tensors[-1]])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_rewrite_sequences_keep_outputs(data):
    draw = data.draw
    graph = _image_graph(draw) if draw(st.booleans()) else _matrix_graph(draw)
    xs = _inputs(graph, seed=3)
    expected = run_graph(graph, xs)
    for _ in range(draw(st.integers(1, 5))):
        index = kind_index(graph)
        options = [(r, m) for r in RULES for m in find_matches(graph, r, index)]
        if not options:
            break
        rule, match = options[draw(st.integers(0, len(options) - 1))]
        new = apply_match(graph, match)
        if new is not None:
            new.validate()
            graph = new
    _close(expected, run_graph(graph, xs), tol=1e-3)
