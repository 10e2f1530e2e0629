"""Schedule algorithms over a kernel graph: sequential, wavefront, Opara, Nimble, critical path.

Each takes the kernel graph (`KernelProgram.graph`: ``kernel`` and ``view`` nodes) and returns a
`paragraph.schedule.Schedule`. On a CPU every stream gets ``cores // streams`` threads (at least
one). Pure: costs come in as numbers (`paragraph.planner` measures them); the IOS dynamic
program is `paragraph.passes.ios`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import networkx as nx

from paragraph.dag import lone
from paragraph.errors import ParagraphError
from paragraph.graph import Graph
from paragraph.machine import cpu_count
from paragraph.schedule import Schedule, bytes_moved, kernel_ids, producers

ALGORITHMS = ("sequential", "wavefront", "opara", "nimble", "critical-path")
SEARCH_MAX_KERNELS = 200  # `critical_path` searches segments up to this size (recursion depth)


def _consumers(graph: Graph) -> dict[int, list[int]]:
    kernels = kernel_ids(graph)
    users: dict[int, list[int]] = {k: [] for k in kernels}
    for k in kernels:
        for p in producers(graph, k):
            users[p].append(k)
    return users


def _threads(num_streams: int, cores: int | None) -> list[int]:
    cores = cores or cpu_count()
    return [max(1, cores // max(1, num_streams))] * num_streams


def sequential(graph: Graph, *, cores: int | None = None) -> Schedule:
    """Every kernel on one stream in topological order, all cores for each (the baseline)."""
    return Schedule.build(graph, [kernel_ids(graph)], threads=_threads(1, cores),
                          name="sequential")


def wavefront(graph: Graph, *, max_per_stage: int = 10, cores: int | None = None) -> Schedule:
    """Greedy stages (IOS's "greedy" baseline, section 6): each stage runs every ready kernel,
    at most ``max_per_stage`` of them, the i-th on stream i, with a barrier between stages."""
    users = _consumers(graph)
    pending = {k: len(producers(graph, k)) for k in users}
    ready = [k for k in kernel_ids(graph) if pending[k] == 0]
    stages = []
    while ready:
        stage, ready = ready[:max_per_stage], ready[max_per_stage:]
        stages.append(stage)
        for k in stage:
            for u in users[k]:
                pending[u] -= 1
                if pending[u] == 0:
                    ready.append(u)
    width = max(map(len, stages), default=1)
    streams = [[st[i] for st in stages if i < len(st)] for i in range(width)]
    return Schedule.build(graph, streams, threads=_threads(width, cores), stages=stages,
                          name="wavefront", info={"max_per_stage": max_per_stage})


def arithmetic_intensity(graph: Graph, k: int) -> float:
    """FLOPs per byte moved (inputs read + outputs written) of a kernel; 0 for views."""
    if graph[k].kind != "kernel":
        return 0.0
    return float(graph[k].attrs["flops"]) / max(bytes_moved(graph, k), 1)


def opara_launch_order(graph: Graph, *, demand: Mapping[int, float] | None = None,
                       compute_bound: Callable[[int], bool] | None = None) -> list[int]:
    """Opara's resource-aware launch order (Alg. 2): a topological sort with two ready lists,
    memory- and compute-intensive kernels, alternating between them (compute first) and taking
    the least-demand kernel of the chosen list (ties: the earlier entry).

    ``demand`` defaults to each kernel's shared memory per block where known (GPU) else its
    FLOPs; ``compute_bound`` defaults to arithmetic intensity above 8 FLOP/byte.
    """
    users = _consumers(graph)
    if demand is None:
        demand = {k: float(graph[k].attrs.get("shared_bytes", graph[k].attrs.get("flops", 0.0)))
                  if graph[k].kind == "kernel" else 0.0 for k in users}
    if compute_bound is None:
        def compute_bound(k: int) -> bool:
            return arithmetic_intensity(graph, k) > 8.0
    pending = {k: len(producers(graph, k)) for k in users}
    lists: dict[bool, list[int]] = {True: [], False: []}
    for k in kernel_ids(graph):
        if pending[k] == 0:
            lists[compute_bound(k)].append(k)
    order, take_compute = [], True
    while lists[True] or lists[False]:
        chosen = lists[take_compute] if lists[take_compute] else lists[not take_compute]
        take_compute = not take_compute
        best = min(range(len(chosen)), key=lambda i: (demand[chosen[i]], i))
        k = chosen.pop(best)
        order.append(k)
        for u in users[k]:
            pending[u] -= 1
            if pending[u] == 0:
                lists[compute_bound(u)].append(u)
    return order


def opara(graph: Graph, *, cores: int | None = None,
          demand: Mapping[int, float] | None = None) -> Schedule:
    """Opara (Chen et al.): launch order by Alg. 2, then stream allocation by Alg. 1: walking the
    launch order, a kernel inherits the stream of its first predecessor whose stream no other
    successor has claimed yet, else it opens a new stream (each stream is a path of the DAG)."""
    order = opara_launch_order(graph, demand=demand)
    stream_of: dict[int, int] = {}
    claimed: set[int] = set()
    streams: list[list[int]] = []
    for k in order:
        for p in producers(graph, k):  # argument order, as FX's all_input_nodes
            if p not in claimed:
                claimed.add(p)
                stream_of[k] = stream_of[p]
                break
        else:
            stream_of[k] = len(streams)
            streams.append([])
        streams[stream_of[k]].append(k)
    return Schedule.build(graph, streams, threads=_threads(len(streams), cores),
                          launch_order=order, name="opara")


def _max_matching_cover(nodes: list[int], edges: list[tuple[int, int]]) -> list[list[int]]:
    """Minimum path cover of a DAG given as ``edges`` (u before v): maximum bipartite matching
    (left copy -> right copy), then follow matched edges into chains (Nimble's get_mapping)."""
    bip = nx.Graph()
    left = [("L", u) for u in nodes]
    bip.add_nodes_from(left, bipartite=0)
    bip.add_nodes_from((("R", v) for v in nodes), bipartite=1)
    bip.add_edges_from((("L", u), ("R", v)) for u, v in edges)
    matching = nx.bipartite.hopcroft_karp_matching(bip, top_nodes=left)
    nxt = {u: matching[("L", u)][1] for u in nodes if ("L", u) in matching}
    has_prev = set(nxt.values())
    chains = []
    for u in nodes:
        if u not in has_prev:
            chain = [u]
            while chain[-1] in nxt:
                chain.append(nxt[chain[-1]])
            chains.append(chain)
    return chains


def nimble(graph: Graph, *, cores: int | None = None) -> Schedule:
    """Nimble (Kwon et al., NeurIPS'20) stream assignment: minimum path cover of the transitive
    reduction (the minimum equivalent graph) by maximum bipartite matching gives chains; a second
    matching over the chains' reachability puts chains that run one after another on one stream.
    Streams = maximum logical concurrency; syncs only on MEG edges that cross streams."""
    kernels = kernel_ids(graph)
    dag = nx.DiGraph()
    dag.add_nodes_from(kernels)
    dag.add_edges_from((p, k) for k in kernels for p in producers(graph, k))
    meg = nx.transitive_reduction(dag)
    chains = _max_matching_cover(kernels, list(meg.edges))
    closure = nx.transitive_closure_dag(dag)
    chain_edges = [(i, j) for i, a in enumerate(chains) for j, b in enumerate(chains)
                   if i != j and closure.has_edge(a[-1], b[0])]
    groups = _max_matching_cover(list(range(len(chains))), chain_edges)
    position = {k: i for i, k in enumerate(kernels)}
    streams = [sorted((k for c in group for k in chains[c]), key=position.__getitem__)
               for group in groups]
    streams.sort(key=lambda s: position[s[0]])
    return Schedule.build(graph, streams, threads=_threads(len(streams), cores), name="nimble",
                          info={"chains": len(chains)})


def estimated_cost(graph: Graph, k: int) -> float:
    """A unitless cost for balancing without measurements: FLOPs plus 8 per byte moved
    (about the FLOP/byte balance of a CPU core)."""
    if graph[k].kind != "kernel":
        return 0.0
    return float(graph[k].attrs["flops"]) + 8.0 * bytes_moved(graph, k)


def cap_streams(graph: Graph, schedule: Schedule, max_streams: int, *,
                cost: Mapping[int, float] | None = None, cores: int | None = None) -> Schedule:
    """The same schedule on at most ``max_streams`` streams: whole streams are packed into bins
    by longest-processing-time-first on their summed ``cost``, and each bin's kernels keep the
    original launch order (a topological order, so the result is always valid)."""
    if schedule.num_streams <= max_streams:
        return schedule
    if cost is None:
        cost = {k: estimated_cost(graph, k) for k in schedule.kernels}
    load = [0.0] * max_streams
    bins: list[list[int]] = [[] for _ in range(max_streams)]
    for ks in sorted(schedule.streams, key=lambda ks: -sum(cost.get(k, 0.0) for k in ks)):
        b = min(range(max_streams), key=load.__getitem__)
        bins[b].extend(ks)
        load[b] += sum(cost.get(k, 0.0) for k in ks)
    order = schedule.launch_order or tuple(schedule.kernels)
    rank = {k: i for i, k in enumerate(order)}
    streams = [sorted(b, key=rank.__getitem__) for b in bins if b]
    streams.sort(key=lambda ks: rank[ks[0]])
    return Schedule.build(graph, streams, threads=_threads(len(streams), cores),
                          launch_order=order, name=f"{schedule.name}/{max_streams}",
                          info={**schedule.info, "capped_from": schedule.num_streams})


def segments(graph: Graph) -> list[list[int]]:
    """The kernels in topological order, split at the lone ones (`paragraph.dag.lone`: nothing
    can run beside them): each lone kernel alone, and the kernels between two lone ones
    together (an inception block, a NASNet cell, ...)."""
    kernels = kernel_ids(graph)
    cuts = lone(kernels, {k: producers(graph, k) for k in kernels})
    out: list[list[int]] = []
    for k in kernels:
        if k in cuts or not out or out[-1][-1] in cuts:
            out.append([k])
        else:
            out[-1].append(k)
    return out


@dataclass
class _Placement:
    """Streams so far: when each is free, and where and when each placed kernel ends."""

    free: list[float]
    finish: dict[int, float]
    stream_of: dict[int, int]
    handoff: float

    def start(self, preds: list[int], i: int) -> float:
        """When a kernel with producers ``preds`` could start on stream ``i``."""
        return max([self.free[i]] + [self.finish[p] + (self.handoff if self.stream_of[p] != i
                                                       else 0.0) for p in preds])


def _list_segment(seg: list[int], order: list[int], cost: Mapping[int, float],
                  preds: Mapping[int, list[int]], at: _Placement) -> dict[int, tuple[int, float]]:
    """Graham's list scheduling of one segment in priority ``order``: each kernel where it
    can start first (ties: its first producer's stream, then the lowest index)."""
    free, finish, where = list(at.free), dict(at.finish), dict(at.stream_of)
    local = _Placement(free, finish, where, at.handoff)
    placed = {}
    for k in order:
        first = next((where[p] for p in preds[k]), 0)
        starts = [local.start(preds[k], i) for i in range(len(free))]
        s = min(range(len(free)), key=lambda i: (starts[i], i != first, i))
        finish[k], where[k] = starts[s] + cost.get(k, 0.0), s
        free[s] = finish[k]
        placed[k] = (s, starts[s])
    return placed


def _search_segment(seg: list[int], cost: Mapping[int, float],
                    preds: Mapping[int, list[int]], consumers: Mapping[int, list[int]],
                    at: _Placement, upper: float,
                    budget: int) -> tuple[dict[int, tuple[int, float]] | None, bool]:
    """Branch and bound for the segment's shortest makespan from placement ``at``: schedules
    are built in order of start time (a left-justified optimum is one of them), each step
    placing a ready kernel on a stream; a branch is cut when its lower bound (its longest
    path left, or its work left spread over the streams) reaches the best makespan found,
    ``upper`` to begin with (the list schedule's). Returns (a better placement or None,
    whether the search was exhaustive within ``budget`` nodes)."""
    inside = set(seg)
    users = {k: [u for u in consumers[k] if u in inside] for k in seg}
    tail: dict[int, float] = {}  # longest path from a kernel to the segment's end
    for k in reversed(seg):
        tail[k] = cost.get(k, 0.0) + max((tail[u] for u in users[k]), default=0.0)
    waiting = {k: sum(p in inside for p in preds[k]) for k in seg}
    width, symmetric = len(at.free), at.handoff == 0.0
    best: list[Any] = [upper, None]  # makespan, placement
    nodes = [0]
    placed: dict[int, tuple[int, float]] = {}

    def visit(ready: list[int], last: float, span: float, left: float) -> None:
        if not ready:
            if span < best[0] * (1 - 1e-9):
                best[0], best[1] = span, dict(placed)
            return
        for k in sorted(ready, key=lambda r: -tail[r]):
            seen = set()
            for i in range(width):
                if symmetric:  # streams free at the same time are interchangeable
                    if at.free[i] in seen:
                        continue
                    seen.add(at.free[i])
                start = at.start(preds[k], i)
                if start < last:
                    continue
                end = start + cost.get(k, 0.0)
                busy = sum(max(f, start) for f in at.free) - max(at.free[i], start) + end
                bound = max(start + tail[k], span, end, (busy + left - cost.get(k, 0.0)) / width)
                if bound >= best[0] * (1 - 1e-9):
                    continue
                nodes[0] += 1
                if nodes[0] > budget:
                    return
                was = at.free[i]
                at.free[i], at.finish[k], at.stream_of[k] = end, end, i
                placed[k] = (i, start)
                now = [r for r in ready if r != k]
                for u in users[k]:
                    waiting[u] -= 1
                    if waiting[u] == 0:
                        now.append(u)
                visit(now, start, max(span, end), left - cost.get(k, 0.0))
                for u in users[k]:
                    waiting[u] += 1
                del placed[k], at.finish[k], at.stream_of[k]
                at.free[i] = was

    saved = list(at.free)
    visit([k for k in seg if waiting[k] == 0], 0.0, max(at.free, default=0.0),
          sum(cost.get(k, 0.0) for k in seg))
    at.free[:] = saved
    return best[1], nodes[0] <= budget


def critical_path(graph: Graph, *, cost: Mapping[int, float] | None = None,
                  streams: int | None = None, cores: int | None = None,
                  handoff: float = 0.0, search_budget: int = 20000) -> Schedule:
    """List scheduling by critical path (Graham; HEFT on identical processors), refined by an
    exact search where it is small: kernels in order of their bottom level (longest ``cost``
    path from the kernel to the end), each placed on the stream where it can start first given
    its producers' finish times; ties go to the stream of its first producer, then the lowest
    index. Then each segment between two lone kernels (an inception block) gets a branch-and-bound
    search for its shortest makespan (`_search_segment`, at most ``search_budget`` nodes),
    kept where it beats the list schedule.

    Unlike Opara and Nimble, which choose streams from the graph's shape alone, this balances
    the streams by time, so with ``streams`` equal to the cores (the default on a CPU, one
    thread each) it packs the branches around the critical path. ``cost`` defaults to
    `estimated_cost`; `paragraph.planner.plan_schedule` passes measured 1-thread times.
    ``handoff`` (same unit as ``cost``) is charged when a producer ran on another stream: a
    blocking cross-stream wait costs the CPU executor tens of microseconds (a thread wake-up).

    Where the placement predicts a longer run than all kernels on one stream (hand-offs that
    greedy choices did not pay back), it returns that one stream.

    ``info``: ``predicted`` makespan, ``critical_path``, ``work``, and ``optimum``: the
    shortest makespan any schedule on these streams can have with these costs and no hand-off
    (exact where every segment's search finished, else a lower bound: ``optimum_exact``).
    """
    kernels = kernel_ids(graph)
    if cost is None:
        cost = {k: estimated_cost(graph, k) for k in kernels}
    width = max(1, streams or cores or cpu_count())
    preds = {k: producers(graph, k) for k in kernels}
    users = _consumers(graph)
    bottom: dict[int, float] = {}
    for k in reversed(kernels):
        bottom[k] = cost.get(k, 0.0) + max((bottom[u] for u in users[k]), default=0.0)
    position = {k: i for i, k in enumerate(kernels)}
    at = _Placement([0.0] * width, {}, {}, handoff)
    starts: dict[int, float] = {}
    optimum, exact = 0.0, True
    for seg in segments(graph):
        # (-bottom, position) is a topological order: a producer's bottom level is at least
        # its consumer's, and where equal (a view costs 0) the producer comes first
        order = sorted(seg, key=lambda k: (-bottom[k], position[k]))
        placed = _list_segment(seg, order, cost, preds, at)
        work = sum(cost.get(k, 0.0) for k in seg)
        seg_bound = max(max(bottom[k] for k in seg) - max(
            (bottom[u] for k in seg for u in users[k] if u not in seg), default=0.0),
            work / width)
        if 1 < len(seg) <= SEARCH_MAX_KERNELS and search_budget > 0:
            span = max(s + cost.get(k, 0.0) for k, (_, s) in placed.items())
            better, done = _search_segment(seg, cost, preds, users, at, span, search_budget)
            placed = better or placed
            if done and handoff == 0.0:  # the search proved this segment's optimum
                seg_bound = max(s + cost.get(k, 0.0) for k, (_, s) in placed.items()) - max(
                    at.free)
            exact = exact and done
        else:
            exact = exact and len(seg) == 1
        optimum += seg_bound
        for k in sorted(placed, key=lambda k: (placed[k][1], position[k])):
            s, start = placed[k]
            at.free[s] = at.finish[k] = start + cost.get(k, 0.0)
            at.stream_of[k] = s
            starts[k] = start
    lists: list[list[int]] = [[] for _ in range(width)]
    order = sorted(kernels, key=lambda k: (starts[k], position[k]))
    for k in order:
        lists[at.stream_of[k]].append(k)
    used = [ks for ks in lists if ks]
    used.sort(key=lambda ks: position[ks[0]])
    predicted = max(at.finish.values(), default=0.0)
    work = sum(cost.get(k, 0.0) for k in kernels)
    if predicted > work:  # greedy placement plus hand-offs lost to one stream: take that
        used, order, predicted = [list(kernels)], list(kernels), work
    return Schedule.build(graph, used, threads=_threads(len(used), cores), launch_order=order,
                          name="critical-path",
                          info={"predicted": predicted,
                                "critical_path": max(bottom.values(), default=0.0),
                                "work": work,
                                "optimum": optimum,
                                "optimum_exact": exact and handoff == 0.0})


def make_schedule(name: str, graph: Graph, *, cores: int | None = None,
                  max_streams: int | None = None) -> Schedule:
    """The schedule ``name`` (one of `ALGORITHMS`) for ``graph``, optionally packed onto at most
    ``max_streams`` streams (wavefront: at most that many kernels per stage)."""
    table = {"sequential": sequential, "opara": opara, "nimble": nimble}
    if name == "critical-path":  # balances its own streams: no packing afterwards
        return critical_path(graph, cores=cores, streams=max_streams)
    if name == "wavefront":
        schedule = wavefront(graph, cores=cores, max_per_stage=min(10, max_streams or 10))
        if max_streams is not None:
            schedule = replace(schedule, name=f"wavefront/{max_streams}")
        return schedule
    if name not in table:
        raise ParagraphError(f"unknown schedule {name!r}; choose from {', '.join(ALGORITHMS)}")
    schedule = table[name](graph, cores=cores)
    return schedule if max_streams is None else cap_streams(graph, schedule, max_streams,
                                                            cores=cores)
