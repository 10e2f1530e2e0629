"""The substitution search's pure core: graph costs, partition, DP, backtracking (issue 16)."""

import itertools

import numpy as np
import pytest

from paragraph import GraphBuilder
from paragraph.interpret import run_graph
from paragraph.passes.cost import COSTS, CostModel, Device, KernelDAG, dag_cost, fuse, kernels_of
from paragraph.passes.search import (
    DPResult,
    Partition,
    SearchOptions,
    backtrack,
    dp,
    external_inputs,
    extract,
    min_vertex_cut,
    partition,
    piece_outputs,
    search,
    stitch,
)
from paragraph.rules.library import default_library

RNG = np.random.default_rng(0)


def w(*shape):
    return RNG.standard_normal(shape).astype("float32")


def inception_module(c=8, hw=8, extra_bn=False, ks=(1, 1, 3)):
    """x -> parallel convs (1x1, 1x1, 3x3) with bias + relu -> concat."""
    b = GraphBuilder()
    x = b.input((1, c, hw, hw))
    outs = []
    for k in ks:
        y = b.op("conv2d", [x, b.weight(w(c, c, k, k))], {"padding": k // 2})
        y = b.op("add", [y.out, b.weight(w(1, c, 1, 1))])
        outs.append(b.op("relu", [y.out]).out)
    if extra_bn:
        outs[0] = b.op("multiply", [outs[0], b.weight(w(1, c, 1, 1))]).out
    return b.build([b.op("concat", outs, {"axis": 1}).out])


def same_outputs(a, b_):
    xs = [RNG.standard_normal(a[i].type.shape).astype("float32") for i in a.inputs]
    for p, q in zip(run_graph(a, xs), run_graph(b_, xs), strict=True):
        np.testing.assert_allclose(p, q, rtol=1e-4, atol=1e-4)


def test_fusion_puts_bias_and_activation_into_the_convolution():
    g = inception_module()
    groups = fuse(g)
    convs = [grp for grp in groups if g[grp[0]].kind == "conv2d"]
    assert len(convs) == 3 and all([g[i].kind for i in grp] == ["conv2d", "add", "relu"]
                                   for grp in convs)
    assert len(groups) == 4  # and the concat


def test_costs_equal_hand_computed_values():
    g = inception_module()
    ks = kernels_of(g)
    seconds = {k.signature: s for k, s in zip(ks, (1.0, 2.0, 4.0, 0.5), strict=True)}
    assert len(seconds) == 3 or len(seconds) == 4  # the two 1x1 branches share a signature
    model = CostModel(measured={k.signature: {"conv2d": 1.0}.get(k.kind, 0.5) * (
        4.0 if "3x3" in k.signature else 1.0) for k in ks})
    # kernels: conv1x1 (1), conv1x1 (1), conv3x3 (4), concat (0.5)
    assert model.cost(g, "sum") == 6.5
    assert model.cost(g, "critical-path") == 4.5
    assert model.cost(g, "mixed") == 6.5 + 0.25 * 4.5
    model.device = Device(streams=2)
    # streams: 3x3 then concat on one; both 1x1 on the other: max(4, 2) + 0.5
    assert model.cost(g, "simulated") == 4.5
    model.device = Device(streams=1)
    assert model.cost(g, "simulated") == 6.5


def test_costs_price_kernels_alone_on_all_threads_where_that_is_known():
    g = inception_module()
    ks = kernels_of(g)
    one = {k.signature: (4.0 if "3x3" in k.signature else 1.0 if k.kind == "conv2d" else 0.5)
           for k in ks}
    model = CostModel(device=Device(streams=2))
    model.learn({k.signature: (k, one[k.signature]) for k in ks},
                # on 2 threads: the 3x3 convolution gains 2x, the 1x1s and the concat nothing
                {k.signature: one[k.signature] / (2.0 if "3x3" in k.signature else 1.0)
                 for k in ks})
    # kernels alone: 1 + 1 + 2 + 0.5; longest path 2 + 0.5
    assert model.cost(g, "sum") == 4.5
    assert model.cost(g, "critical-path") == 2.5
    assert model.cost(g, "mixed") == 4.5 + 0.25 * 2.5
    # streams of one thread: max(4, 1 + 1) + 0.5 = 4.5; one at a time on both threads: 4.5
    assert model.cost(g, "simulated") == 4.5
    model.learn({}, {k.signature: one[k.signature] / 2 for k in ks})  # everything scales
    assert model.cost(g, "simulated") == 3.25  # one at a time on both threads wins
    # a kernel not measured on 2 threads gains what measured kernels of its kind gain
    other = CostModel()
    conv, concat = (next(k for k in ks if k.kind == kind) for kind in ("conv2d", "concat"))
    other.learn({conv.signature: (conv, 1.0), concat.signature: (concat, 1.0)},
                {conv.signature: 0.6})
    assert other.speedup["conv2d"] == other.speedup["*"] == 0.6
    assert other.seconds_wide(concat) == 0.6 and other.seconds_wide(conv) == 0.6


def test_grouped_convolutions_take_their_own_estimate_scale():
    """A grouped convolution not measured is priced at the measured/estimated ratio of the
    grouped ones (a depthwise convolution's), not the dense ones': NASNet-A's depthwise
    convolutions regrouped into pairs looked 4x cheaper than they ran at the dense ratio."""
    b = GraphBuilder()
    x = b.input((1, 8, 10, 10))
    dense = b.op("conv2d", [x, b.weight(w(8, 8, 1, 1))])
    depthwise = b.op("conv2d", [dense.out, b.weight(w(8, 1, 3, 3))],
                     {"padding": 1, "groups": 8})
    pairs = b.op("conv2d", [depthwise.out, b.weight(w(8, 2, 3, 3))],
                 {"padding": 1, "groups": 4})
    g = b.build([b.op("conv2d", [pairs.out, b.weight(w(8, 8, 3, 3))], {"padding": 1}).out])
    ks = kernels_of(g)
    assert [k.family for k in ks] == ["", "conv2d/grouped", "conv2d/grouped", ""]
    model = CostModel()
    model.learn({ks[0].signature: (ks[0], 2 * model.estimate(ks[0])),
                 ks[1].signature: (ks[1], 10 * model.estimate(ks[1]))})
    assert model.scale["conv2d/grouped"] == 10 and model.scale["conv2d"] in (2, 10)
    assert model.seconds(ks[2]) == pytest.approx(10 * model.estimate(ks[2]))
    assert model.seconds(ks[3]) == pytest.approx(model.scale["conv2d"] * model.estimate(ks[3]))
    # with no grouped convolution measured, the kind's ratio, then every kernel's
    dense_only = CostModel()
    dense_only.learn({ks[0].signature: (ks[0], 2 * model.estimate(ks[0]))})
    assert dense_only.seconds(ks[2]) == pytest.approx(2 * model.estimate(ks[2]))


def test_simulation_schedules_by_bottom_level():
    dag = KernelDAG((), (3.0, 1.0, 1.0, 1.0, 2.0), ((), (), (), (), (0, 1, 2, 3)))
    assert dag_cost(dag, "simulated", device=Device(streams=2)) == 5.0
    assert dag_cost(dag, "simulated", device=Device(streams=3)) == 5.0
    assert dag_cost(dag, "sum") == 8.0 and dag_cost(dag, "critical-path") == 5.0


def test_min_vertex_cut_finds_the_bottleneck():
    # two diamonds joined by one operator: the cut is that operator
    b = GraphBuilder()
    x = b.input((1, 4))
    a1 = b.op("relu", [x]).out
    a2, a3 = b.op("sigmoid", [a1]).out, b.op("tanh", [a1]).out
    a4 = b.op("add", [a2, a3]).out
    mid = b.op("relu", [a4]).out
    c2, c3 = b.op("sigmoid", [mid]).out, b.op("tanh", [mid]).out
    c4 = b.op("add", [c2, c3]).out
    g = b.build([b.op("relu", [c4]).out])
    ops = [n.id for n in g.operators]
    cap = dict.fromkeys(ops, 5)
    first = min_vertex_cut(g, ops, cap)
    assert first == set(ops[:5])  # the prefix ends at the bottleneck (a4 or mid: cap ties)
    cap[ops[4]] = 0  # now mid is strictly cheapest
    assert min_vertex_cut(g, ops, cap) == set(ops[:5])
    cap[ops[4]], cap[ops[3]] = 5, 0  # a4 cheapest: the prefix ends there
    assert min_vertex_cut(g, ops, cap) == set(ops[:4])


def test_dp_equals_exhaustive_search_over_partition_sequences():
    rng = np.random.default_rng(1)
    for n in range(1, 7):
        pieces = tuple(frozenset({i}) for i in range(n))
        runs = tuple((i, j) for i in range(n) for j in range(i, min(n, i + 3)))
        cost = {r: float(rng.uniform(0.5, 1.5)) * (r[1] - r[0] + 1) for r in runs}
        got = dp(Partition(pieces, runs, {}), cost.__getitem__)
        assert isinstance(got, DPResult)
        best = float("inf")
        for cuts in itertools.product((False, True), repeat=n - 1):
            bounds = [0] + [i + 1 for i, c in enumerate(cuts) if c] + [n]
            seq = [(a, b - 1) for a, b in itertools.pairwise(bounds)]
            if all(r in cost for r in seq):
                best = min(best, sum(cost[r] for r in seq))
        assert abs(got.cost - best) < 1e-12
        assert abs(sum(cost[r] for r in got.runs) - best) < 1e-12


def test_extract_and_stitch_round_trip():
    g = inception_module()
    ops = {n.id for n in g.operators if n.kind != "concat"}
    sub = extract(g, ops)
    sub.validate()
    assert len(sub.outputs) == 3 and len(sub.inputs) == 1
    back, _ = stitch(g, ops, sub, external_inputs(g, ops), piece_outputs(g, ops))
    back.validate()
    assert back.structural_hash() == g.structural_hash()


def test_sum_cost_merges_parallel_convolutions_and_simulated_keeps_them_apart():
    # AutoGraph fig. 1 / TASO's merge of convolutions: merging saves launches (the sum cost
    # merges all three) but puts all the work on one stream; on two streams the simulated cost
    # keeps two convolutions apart (it merges two of the three, which balances the streams)
    g = inception_module(c=16, hw=16, ks=(3, 3, 3))
    rules = default_library().for_search()
    model = CostModel(Device(flops=50e9, bandwidth=10e9, launch=20e-6, streams=2))

    def convs(graph):
        return sum(n.kind == "conv2d" for n in graph.nodes)

    summed = search(g, rules, lambda x: model.cost(x, "sum"),
                    SearchOptions(method="taso", beta=1.05, budget=60))
    assert convs(summed.graph) == 1 and summed.cost_after < summed.cost_before
    assert {a.rule for a in summed.applied} == {"ios-merge-convs"}
    same_outputs(g, summed.graph)
    sim = search(g, rules, lambda x: model.cost(x, "simulated"),
                 SearchOptions(method="autograph", budget=60))
    assert convs(sim.graph) == 2 and sim.cost_after < sim.cost_before
    assert model.cost(summed.graph, "simulated") > sim.cost_after
    same_outputs(g, sim.graph)


def nasnet_cell(c=32, hw=32):
    """A NASNet-A cell in miniature (AutoGraph fig. 8): two large convolutions on parallel
    branches reading one tensor (substitution 1/3: merge them), and avg_pool(x) + avg_pool(x)
    (substitution 2: one depth-wise convolution), concatenated."""
    b = GraphBuilder()
    x = b.input((1, c, hw, hw))
    outs = []
    for _ in range(2):
        y = b.op("conv2d", [x, b.weight(w(c, c, 3, 3))], {"padding": 1})
        y = b.op("add", [y.out, b.weight(w(1, c, 1, 1))])
        outs.append(b.op("relu", [y.out]).out)
    pool = {"pool_size": (3, 3), "strides": (1, 1), "padding": (1, 1, 1, 1),
            "count_include_pad": True}
    p, q = (b.op("avg_pool2d", [x], pool).out for _ in range(2))
    outs.append(b.op("add", [p, q]).out)
    return b.build([b.op("concat", outs, {"axis": 1}).out])


@pytest.mark.parametrize("parallel", ["mixed", "simulated"])
def test_parallel_costs_reject_the_fusions_that_lengthen_the_critical_path(parallel):
    # AutoGraph fig. 8: TASO's sum cost takes all three substitutions of a NASNet cell, which
    # makes one long chain of large kernels; the parallelism-aware costs take only the pool
    # pair (less work, same critical path) and keep the two convolutions on parallel branches
    g = nasnet_cell()
    rules = default_library().for_search()
    model = CostModel(Device(flops=50e9, bandwidth=10e9, launch=20e-6, streams=2))

    def convs(graph):
        return sum(n.kind == "conv2d" for n in graph.nodes)

    taso = search(g, rules, lambda x: model.cost(x, "sum"),
                  SearchOptions(method="taso", cost="sum", beta=1.05, budget=60))
    assert {a.rule for a in taso.applied} == {"ios-merge-convs", "taso-avgpool-pair-dwconv"}
    assert convs(taso.graph) == 1 + 1  # the merged convolution and the pools' depth-wise one
    ours = search(g, rules, lambda x: model.cost(x, parallel),
                  SearchOptions(method="autograph", cost=parallel, budget=60))
    assert {a.rule for a in ours.applied} == {"taso-avgpool-pair-dwconv"}
    assert convs(ours.graph) == 2 + 1
    # by the parallel cost TASO's graph is the worse one; by the sum cost, the better one
    assert model.cost(taso.graph, parallel) > ours.cost_after
    assert model.cost(taso.graph, "sum") < model.cost(ours.graph, "sum")
    same_outputs(g, taso.graph)
    same_outputs(g, ours.graph)


def test_backtracking_never_returns_worse_than_its_input():
    g = inception_module(extra_bn=True)
    rules = default_library().for_search()
    model = CostModel()
    for kind in COSTS:
        best = backtrack(g, rules, lambda x, k=kind: model.cost(x, k), keep=3)
        assert best[0].cost <= model.cost(g, kind)
        assert all(a.cost <= b.cost for a, b in itertools.pairwise(best))
        same_outputs(g, best[0].graph)


def test_partition_pieces_are_ordered_and_cover_the_graph():
    from paragraph import models
    from paragraph.tvm_interop.frontend.relax_graph import from_relax
    g = from_relax(models.get("inception_v3", reduced=True))
    part = partition(g, default_library().for_search(), size_l=40, size_u=120)
    ops = [n.id for n in g.operators]
    assert sorted(set().union(*part.pieces)) == sorted(ops)
    assert all(len(p) <= 40 for p in part.pieces)
    piece_of = {v: i for i, p in enumerate(part.pieces) for v in p}
    for n in g.operators:  # every edge goes forward: pieces are convex, in order
        for r in n.inputs:
            if r.node in piece_of:
                assert piece_of[r.node] <= piece_of[n.id]
    assert all(len(part.ops(r)) <= 120 or r[0] == r[1] for r in part.runs)


def resnext_block(c=32, groups=8, hw=8):
    """1x1 conv -> grouped 3x3 conv -> 1x1 conv, each with bias + relu (ResNeXt, fig. 9)."""
    b = GraphBuilder()
    x = b.input((1, c, hw, hw))
    y = x
    for k, g in ((1, 1), (3, groups), (1, 1)):
        y = b.op("conv2d", [y, b.weight(w(c, c // g, k, k))], {"padding": k // 2, "groups": g})
        y = b.op("add", [y.out, b.weight(w(1, c, 1, 1))]).out
        y = b.op("relu", [y]).out
    return b.build([b.op("add", [y, x]).out])


def test_search_regroups_a_resnext_convolution_where_measurements_favour_fewer_groups():
    # AutoGraph fig. 9: a grouped convolution as fewer, larger groups runs faster on devices
    # where many small groups use the hardware badly; the costs say so through measurements
    g = resnext_block()
    rules = default_library().for_search()
    regroup = default_library().get("autograph-regroup-4")
    match = regroup.find(g)[0]
    regrouped = regroup.rewrite(g, match)
    model = CostModel()
    grouped = {k.signature for k in kernels_of(g)} - {k.signature for k in kernels_of(regrouped)}
    fewer = {k.signature for k in kernels_of(regrouped)} - {k.signature for k in kernels_of(g)}
    assert len(grouped) == len(fewer) == 1
    model.measured[grouped.pop()] = 100e-6  # 8 groups: slow
    model.measured[fewer.pop()] = 10e-6  # 2 groups: fast
    result = search(g, rules, lambda x: model.cost(x, "mixed"), SearchOptions(budget=60))
    assert any(a.rule.startswith("autograph-regroup") for a in result.applied)
    assert result.cost_after < result.cost_before
    same_outputs(g, result.graph)
    # without that measurement the roofline prices the block-diagonal kernel's extra work
    plain = search(g, rules, lambda x: CostModel().cost(x, "mixed"), SearchOptions(budget=60))
    assert not any(a.rule.startswith("autograph-regroup") for a in plain.applied)


ALL_METHODS = (("greedy", "sum"), ("taso", "sum"), ("autograph", "mixed"),
               ("autograph", "simulated"))


@pytest.mark.parametrize("name, methods", [("squeezenet1_1", ALL_METHODS),
                                           ("resnext50_32x4d", ALL_METHODS),
                                           # many pieces: stitching follows renamed tensors
                                           ("nasnet_a_mobile", (("taso", "sum"),))])
def test_every_search_keeps_the_outputs_and_never_raises_the_cost(name, methods):
    from paragraph import models
    from paragraph.tvm_interop.frontend.relax_graph import from_relax
    g = from_relax(models.get(name, reduced=True))
    rules = default_library().for_search()
    model = CostModel()
    xs = [np.random.default_rng(1).standard_normal(g[i].type.shape).astype("float32")
          for i in g.inputs]
    want = run_graph(g, xs)
    for method, kind in methods:
        result = search(g, rules, lambda x, k=kind: model.cost(x, k),
                        SearchOptions(method=method, cost=kind, budget=4, expansions=40))
        assert result.cost_after <= result.cost_before, (method, kind)
        for c in result.candidates:
            c.graph.validate()
        assert result.applied or result.graph is g
        for a, b in zip(want, run_graph(result.graph, xs), strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-3, err_msg=f"{method} {kind}")


def test_operators_on_weights_alone_are_folded_and_cost_nothing():
    """A merge concatenates weights; the build folds that concatenation (it never runs), so
    the cost model prices it at nothing, not as a kernel moving both matrices."""
    b = GraphBuilder()
    x = b.input((4, 8))
    ws = b.op("concat", [b.weight(w(8, 8)), b.op("permute_dims", [b.weight(w(8, 8))]).out],
              {"axis": 1})
    g = b.build([b.op("matmul", [x, ws.out]).out])
    kernels = {k.kind: k for k in kernels_of(g)}
    assert kernels["concat"].flops == kernels["concat"].nbytes == 0.0
    assert kernels["permute_dims"].flops == kernels["permute_dims"].nbytes == 0.0
    assert kernels["matmul"].flops == 2 * 4 * 8 * 16
    model = CostModel(Device(1e11, 1e10, 3e-6, streams=2))
    assert model.estimate(kernels["concat"]) == 0.0 < model.estimate(kernels["matmul"])


def test_random_walks_reach_distinct_graphs_by_library_rules_and_keep_the_outputs():
    """What the cost model's accuracy is judged on (benchmarks/costmodel.py): seeded, each a
    different graph 1..steps library rewrites from the input, outputs unchanged."""
    from paragraph.passes.search import random_walks

    g = inception_module()
    rules = default_library().for_search()
    walks = random_walks(g, rules, 8, steps=3, seed=1)
    assert 1 < len(walks) <= 8
    hashes = {c.graph.structural_hash() for c in walks}
    assert len(hashes) == len(walks) and g.structural_hash() not in hashes
    ids = {r.id for r in rules}
    for c in walks:
        assert 1 <= len(c.applied) <= 3 and all(a.rule in ids for a in c.applied)
        same_outputs(g, c.graph)
    again = random_walks(g, rules, 8, steps=3, seed=1)
    assert [c.graph.structural_hash() for c in again] == [c.graph.structural_hash()
                                                           for c in walks]
    # a graph no rule matches has no neighbour, and the walk gives up rather than loop
    b = GraphBuilder()
    lone = b.build([b.op("softmax", [b.input((1, 4))]).out])
    assert random_walks(lone, rules, 5) == []
