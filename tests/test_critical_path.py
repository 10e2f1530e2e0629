"""critical_path's exact segment search against brute force on random DAGs (no TVM)."""

import itertools
import random

import pytest

from paragraph.graph import Graph, Node, TensorRef, TensorType
from paragraph.passes.schedule import critical_path, segments
from paragraph.schedule import kernel_ids, producers


def random_graph(n: int, p: float, seed: int) -> Graph:
    """An input, then ``n`` kernels each reading the input or random earlier kernels."""
    rng = random.Random(seed)
    t = (TensorType((4,)),)
    nodes = [Node(0, "input", outputs=t)]
    for i in range(1, n + 1):
        ins = [TensorRef(j) for j in range(1, i) if rng.random() < p] or [TensorRef(0)]
        nodes.append(Node(i, "kernel", ins, t, {"func": f"k{i}"}))
    used = {r.node for nd in nodes for r in nd.inputs}
    return Graph(nodes, [TensorRef(i) for i in range(1, n + 1) if i not in used])


def makespan(graph: Graph, streams, cost, handoff: float = 0.0) -> float:
    """Run each stream's list in order, every kernel when its stream and producers allow."""
    where = {k: s for s, ks in enumerate(streams) for k in ks}
    finish: dict[int, float] = {}
    free = [0.0] * len(streams)
    pending = [list(ks) for ks in streams]
    while any(pending):
        progressed = False
        for s, ks in enumerate(pending):
            while ks and all(p in finish for p in producers(graph, ks[0])):
                k = ks.pop(0)
                start = max([free[s]] + [finish[p] + (handoff if where[p] != s else 0.0)
                                         for p in producers(graph, k)])
                finish[k] = free[s] = start + cost[k]
                progressed = True
        assert progressed, "the stream lists deadlock"
    return max(finish.values())


def brute_force(graph: Graph, cost, width: int) -> float:
    """Shortest makespan over every start order and stream assignment."""
    kernels = kernel_ids(graph)
    best = float("inf")
    for order in itertools.permutations(kernels):
        seen: set[int] = set()
        if any(not set(producers(graph, k)) <= seen or seen.add(k) for k in order):
            continue
        for assign in itertools.product(range(width), repeat=len(order)):
            streams = [[k for k, s in zip(order, assign, strict=True) if s == i]
                       for i in range(width)]
            best = min(best, makespan(graph, streams, cost))
    return best


@pytest.mark.parametrize("seed", range(12))
def test_search_finds_the_optimum(seed):
    n, width = (6, 2) if seed % 3 else (5, 3)
    graph = random_graph(n, 0.2, seed)
    rng = random.Random(seed)
    cost = {k: float(rng.randint(1, 20)) for k in kernel_ids(graph)}
    optimum = brute_force(graph, cost, width)
    listed = critical_path(graph, cost=cost, streams=width, search_budget=0)
    searched = critical_path(graph, cost=cost, streams=width)
    for s in (listed, searched):
        s.validate(graph)
        assert makespan(graph, s.streams, cost) == pytest.approx(s.info["predicted"])
    assert searched.info["predicted"] == pytest.approx(optimum)
    assert searched.info["optimum"] == pytest.approx(optimum)
    assert searched.info["optimum_exact"]
    assert listed.info["predicted"] >= optimum - 1e-9
    assert listed.info["optimum"] <= optimum + 1e-9  # a lower bound without the search


def test_search_beats_list_scheduling_where_greedy_fails():
    # Graham's classic case: 3, 3, 2, 2, 2 on two streams; greedy gives 3+2+2 = 7 on one of
    # them, the optimum splits 3+3 | 2+2+2 = 6
    t = (TensorType((4,)),)
    nodes = [Node(0, "input", outputs=t)] + [
        Node(i, "kernel", [TensorRef(0)], t, {"func": f"k{i}"}) for i in range(1, 6)]
    graph = Graph(nodes, [TensorRef(i) for i in range(1, 6)])
    cost = dict(zip(range(1, 6), (3.0, 3.0, 2.0, 2.0, 2.0), strict=True))
    assert critical_path(graph, cost=cost, streams=2, search_budget=0).info["predicted"] == 7
    searched = critical_path(graph, cost=cost, streams=2)
    assert searched.info["predicted"] == searched.info["optimum"] == 6
    assert sorted(sorted(cost[k] for k in ks) for ks in searched.streams) == [
        [2.0, 2.0, 2.0], [3.0, 3.0]]


@pytest.mark.parametrize("seed", range(6))
def test_search_with_handoff_never_loses_to_the_list_schedule(seed):
    graph = random_graph(9, 0.25, 50 + seed)
    rng = random.Random(seed)
    cost = {k: float(rng.randint(1, 9)) for k in kernel_ids(graph)}
    listed = critical_path(graph, cost=cost, streams=2, handoff=2.0, search_budget=0)
    searched = critical_path(graph, cost=cost, streams=2, handoff=2.0)
    searched.validate(graph)
    assert makespan(graph, searched.streams, cost, 2.0) == pytest.approx(
        searched.info["predicted"])
    assert searched.info["predicted"] <= listed.info["predicted"] + 1e-9
    assert not searched.info["optimum_exact"]  # with a hand-off it is only a bound
    assert searched.info["optimum"] <= searched.info["predicted"] + 1e-9


def test_segments_split_at_kernels_on_every_path():
    graph = random_graph(14, 0.3, 7)
    segs = segments(graph)
    assert [k for seg in segs for k in seg] == kernel_ids(graph)
    for seg in segs:
        if len(seg) == 1:  # a cut: every other kernel is before or after it
            k = seg[0]
            related = graph.ancestors(k) | graph.descendants(k) | {k}
            assert set(kernel_ids(graph)) <= related | set(graph.inputs)


def test_hand_offs_that_do_not_pay_back_give_one_stream():
    # a and b start at once on two streams; c reads both, d reads b and c, e reads b and d:
    # greedy keeps b apart and every later kernel waits for its hand-off (1.5): 8.5 against 8
    # for all five in sequence
    t = (TensorType((4,)),)
    reads = {1: [0], 2: [0], 3: [1, 2], 4: [2, 3], 5: [2, 4]}
    nodes = [Node(0, "input", outputs=t)] + [
        Node(i, "kernel", [TensorRef(j) for j in ins], t, {"func": f"k{i}"})
        for i, ins in reads.items()]
    graph = Graph(nodes, [TensorRef(5)])
    cost = {1: 1.0, 2: 1.0, 3: 1.0, 4: 3.0, 5: 2.0}
    assert makespan(graph, ((1, 3, 4, 5), (2,)), cost, 1.5) == 8.5  # the greedy placement
    costly = critical_path(graph, cost=cost, streams=2, handoff=1.5, search_budget=0)
    assert costly.streams == ((1, 2, 3, 4, 5),)
    assert costly.info["predicted"] == costly.info["work"] == 8.0
    cheap = critical_path(graph, cost=cost, streams=2, handoff=0.1, search_budget=0)
    assert cheap.num_streams == 2 and cheap.info["predicted"] < 8.0
