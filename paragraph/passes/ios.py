"""IOS: inter-operator scheduling by dynamic programming over stages (Ding et al., MLSys'21).

The kernel graph is cut into blocks at the kernels every input-to-output path crosses
(post-dominator cut nodes, as RAF's port of IOS does), and blocks larger than ``max_part_size``
into consecutive parts. For each part a memoised DP over states (bitmask of kernels not yet
scheduled) takes, at each state S, the best ending S' (no edge leaves S' into S - S'):

    cost[S] = min over endings S' of cost[S - S'] + stage_latency(S')      (IOS section 4)

with stage_latency = min(concurrent execution of S''s groups, operator merge where mergeable).
Groups are the weakly connected components of the ending; pruning keeps at most ``s`` groups
per stage and ``r`` kernels per group (``r`` = 3; ``s`` = 8 on a GPU as in IOS, the core count
on a CPU, where more groups only share the cores). Stage latencies are measured on the
device (IOS protocol: 2 warm-ups, 6 repeats of 6 runs), each distinct stage once, cached in the
cost database. Beyond IOS:

* on a CPU a stage may instead run its kernels one after another with all threads; the DP
  picks per stage by measurement;
* stages are priced lazily against a lower bound (their kernels measured alone), a branch and
  bound inside each state that measures a fraction of the stages for the same optimum;
* parts whose DP would visit more than ``max_states`` states are halved (the state count grows
  exponentially with a part's width);
* the result is checked end to end against all kernels in sequence and kept only if faster.

The DP runs over abstract stage costs (`schedule_part`); `ios_schedule` binds it to a
`KernelProgram`: measured stage costs, convolution merging (`paragraph.passes.merge`) and the
final `Schedule`.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import cache, partial
from itertools import combinations

import networkx as nx
import numpy as np

from paragraph.errors import ParagraphError
from paragraph.graph import Graph, TensorRef
from paragraph.schedule import kernel_ids, producers

MODES = ("parallel", "merge", "both")
CONCURRENT, SEQUENTIAL, MERGE = "concurrent", "sequential", "merge"


@dataclass(frozen=True)
class Stage:
    """One stage: groups of unit indices (each group runs in order on one stream)."""

    groups: tuple[tuple[int, ...], ...]
    strategy: str
    cost: float


@dataclass
class SearchStats:
    """What the search did: states, transitions, stages costed and measured, seconds."""

    states: int = 0
    transitions: int = 0
    stages_costed: int = 0
    stages_measured: int = 0
    seconds: float = 0.0
    budget_hit: bool = False
    parts: int = 0
    bounded: int = 0  # transitions never priced: their lower bound could not win

    def summary(self) -> str:
        cut = ", time budget hit: rest sequential" if self.budget_hit else ""
        skipped = f", {self.bounded} transitions cut by the bound" if self.bounded else ""
        return (f"{self.parts} parts, {self.states} states, {self.transitions} transitions, "
                f"{self.stages_costed} distinct stages ({self.stages_measured} measured)"
                f"{skipped}, {self.seconds:.1f} s{cut}")


# ---------------------------------------------------------------------------- blocks
def cut_nodes(graph: Graph) -> list[int]:
    """Kernels that every path from the graph inputs to its outputs goes through, in order."""
    kernels = [k for k in kernel_ids(graph) if graph[k].kind == "kernel"]
    g = _kernel_dag(graph, kernels)
    g.add_nodes_from(("source", "sink"))
    for k in kernels:
        if not any(p in g for p in g.predecessors(k)):
            g.add_edge("source", k)
    outs = {_producing_kernel(graph, r.node) for r in graph.outputs}
    for k in kernels:
        if g.out_degree(k) == 0 or k in outs:
            g.add_edge(k, "sink")
    dom = nx.immediate_dominators(g, "source")
    chain, v = [], dom.get("sink")
    while v is not None and v != "source":
        chain.append(v)
        v = dom[v]
    position = {k: i for i, k in enumerate(kernels)}
    return sorted(chain, key=position.__getitem__)


def _producing_kernel(graph: Graph, node: int) -> int:
    """Follow views back to the kernel that wrote the bytes (or the source)."""
    while graph[node].kind == "view":
        node = graph[node].inputs[0].node
    return node


def _kernel_dag(graph: Graph, kernels: Sequence[int]) -> nx.DiGraph:
    """Kernel-to-kernel dependencies, looking through views."""
    g = nx.DiGraph()
    g.add_nodes_from(kernels)
    members = set(kernels)
    for k in kernels:
        for p in producers(graph, k):
            p = _producing_kernel(graph, p)
            if p in members:
                g.add_edge(p, k)
    return g


def blocks(graph: Graph, max_part_size: int = 50,
           max_states: int | None = None) -> list[list[int]]:
    """The kernels (views excluded) cut into blocks at the cut nodes (each cut node ends its
    block), each block split into consecutive parts of at most ``max_part_size`` kernels, and
    a part whose DP would visit more than ``max_states`` states (its predecessor-closed subsets)
    halved until it does not: the DP's cost grows with the states, which grow exponentially with
    a part's width (NASNet-A: 200k+ states in a 50-kernel part, under 20k in 25)."""
    kernels = [k for k in kernel_ids(graph) if graph[k].kind == "kernel"]
    cuts = set(cut_nodes(graph))
    out: list[list[int]] = []
    current: list[int] = []
    for k in kernels:  # topological order: a block is what lies between two cut nodes
        current.append(k)
        if k in cuts:
            out.append(current)
            current = []
    if current:
        out.append(current)
    parts = [b[i:i + max_part_size] for b in out for i in range(0, len(b), max_part_size)]
    if max_states is None:
        return parts

    def split(part: list[int]) -> list[list[int]]:
        if len(part) < 2 or count_states(part_graph(graph, part), max_states) <= max_states:
            return [part]
        half = len(part) // 2
        return split(part[:half]) + split(part[half:])

    return [p for part in parts for p in split(part)]


def part_graph(graph: Graph, part: Sequence[int]) -> PartGraph:
    """The dependencies among the kernels of ``part`` as a `PartGraph` over 0..len(part)-1."""
    dag = _kernel_dag(graph, part)
    index = {k: j for j, k in enumerate(part)}
    return PartGraph.from_edges(len(part), [(index[u], index[v]) for u, v in dag.edges])


def count_states(part: PartGraph, cap: int) -> int:
    """How many states the DP can reach (predecessor-closed subsets, the empty one included),
    counting stops past ``cap``."""
    full = (1 << part.n) - 1
    seen, stack = {full}, [full]
    while stack and len(seen) <= cap:
        state = stack.pop()
        for u in _bits(state):
            if not part.succ[u] & state and state & ~(1 << u) not in seen:
                seen.add(state & ~(1 << u))
                stack.append(state & ~(1 << u))
    return len(seen)


# ---------------------------------------------------------------------------- endings
@dataclass
class PartGraph:
    """A part as bitmasks over its units (0..n-1 in topological order)."""

    n: int
    succ: list[int]
    pred: list[int]
    desc: list[int] = field(default_factory=list)

    @classmethod
    def from_edges(cls, n: int, edges: Sequence[tuple[int, int]]) -> PartGraph:
        succ, pred = [0] * n, [0] * n
        for u, v in edges:
            succ[u] |= 1 << v
            pred[v] |= 1 << u
        desc = [0] * n
        for u in reversed(range(n)):  # units are in topological order
            d = succ[u]
            m = succ[u]
            while m:
                low = m & -m
                d |= desc[low.bit_length() - 1]
                m ^= low
            desc[u] = d
        return cls(n, succ, pred, desc)

    def reach(self, start: int, within: int) -> int:
        """The units of ``within`` weakly connected to those of ``start`` inside ``within``."""
        seen = frontier = start
        while frontier:
            low = frontier & -frontier
            frontier ^= low
            u = low.bit_length() - 1
            new = (self.succ[u] | self.pred[u]) & within & ~seen
            seen |= new
            frontier |= new
        return seen

    def connected(self, mask: int) -> bool:
        """Whether the units of ``mask`` are weakly connected among themselves."""
        return bool(mask) and self.reach(mask & -mask, mask) == mask

    def neighbours(self, mask: int) -> int:
        out, m = 0, mask
        while m:
            low = m & -m
            u = low.bit_length() - 1
            out |= self.succ[u] | self.pred[u]
            m ^= low
        return out


def _bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def group_atoms(part: PartGraph, state: int, r: int) -> list[int]:
    """Connected sets of at most ``r`` units of ``state`` that contain their own successors
    within ``state``: the possible groups of an ending (IOS: weakly connected components)."""
    closure = {u: (part.desc[u] | 1 << u) & state for u in _bits(state)}
    seeds = {c for c in closure.values() if c.bit_count() <= r}
    atoms, frontier = set(seeds), list(seeds)
    while frontier:
        t = frontier.pop()
        for u in _bits(state & ~t):
            grown = t | closure[u]
            if grown not in atoms and grown.bit_count() <= r and part.connected(grown):
                atoms.add(grown)
                frontier.append(grown)
    return sorted(a for a in atoms if part.connected(a))


def enumerate_endings(part: PartGraph, state: int, r: int, s: int) -> Iterator[tuple[int, ...]]:
    """Every ending of ``state`` with at most ``s`` groups of at most ``r`` units, as a tuple
    of group masks (pairwise disjoint, with no edge between two of them)."""
    atoms = group_atoms(part, state, r)
    reach = [part.neighbours(a) | a for a in atoms]

    def extend(start: int, chosen: tuple[int, ...], blocked: int):
        for i in range(start, len(atoms)):
            if atoms[i] & blocked:
                continue
            combo = (*chosen, atoms[i])
            yield combo
            if len(combo) < s:
                yield from extend(i + 1, combo, blocked | reach[i])
    yield from extend(0, (), 0)


def is_ending(part: PartGraph, state: int, sub: int) -> bool:
    """The definition: ``sub`` is a non-empty subset of ``state`` and no edge goes from
    ``sub`` to ``state - sub``."""
    if not sub or sub & ~state:
        return False
    return all(not (part.succ[u] & (state & ~sub)) for u in _bits(sub))


# ---------------------------------------------------------------------------- the DP
StageCost = Callable[[tuple[tuple[int, ...], ...], str], float]


def schedule_part(part: PartGraph, stage_cost: StageCost, *, r: int = 3, s: int = 8,
                  mode: str = "both", strategies: Sequence[str] = (CONCURRENT,),
                  mergeable: Callable[[tuple[int, ...]], bool] | None = None,
                  stats: SearchStats | None = None, deadline: float | None = None,
                  fallback: Callable[[int], list[Stage]] | None = None,
                  bound: StageCost | None = None) -> tuple[float, list[Stage]]:
    """The IOS DP on one part: minimum total stage cost and its stages in execution order.

    ``stage_cost(groups, strategy)`` prices a stage; ``strategies`` lists the ways a non-merge
    stage may run (concurrent groups; on a CPU also sequential with all threads). In ``merge``
    mode the endings are single units and mergeable sets of sinks; in ``parallel`` mode the
    pruned concurrent endings; ``both`` takes the union. After ``deadline`` (time.monotonic) the
    states not yet solved are finished by ``fallback(state)`` (e.g. sequential stages).

    ``bound(groups, strategy)``, a lower bound of ``stage_cost``, makes the DP price lazily
    (branch and bound, beyond IOS): a state's transitions are tried in order of
    cost[S - S'] + bound, and pricing stops once that sum reaches the best total found. The
    optimum is the same; far fewer stages are measured.
    """
    if mode not in MODES:
        raise ParagraphError(f"unknown IOS mode {mode!r}; choose from {MODES}")
    stats = stats or SearchStats()
    memo: dict[int, tuple[float, object]] = {0: (0.0, None)}
    price: dict[tuple, Stage] = {}
    bounds: dict[tuple, float] = {}

    def priced(groups: tuple[tuple[int, ...], ...], strategy: str) -> Stage:
        key = (groups, strategy)
        if key not in price:
            stats.stages_costed += 1
            price[key] = Stage(groups, strategy, stage_cost(groups, strategy))
        return price[key]

    def transitions(state: int) -> Iterator[tuple[int, tuple[tuple[int, ...], ...], str]]:
        if mode in ("parallel", "both"):
            for combo in enumerate_endings(part, state, r, s):
                groups = tuple(tuple(_bits(g)) for g in combo)
                for strategy in strategies:
                    yield sum(combo), groups, strategy
        if mode in ("merge", "both"):
            sinks = [u for u in _bits(state) if not part.succ[u] & state]
            if mode == "merge":  # single units: the only non-merge stages of IOS-Merge
                for u in sinks:
                    for strategy in strategies:
                        yield 1 << u, ((u,),), strategy
            if mergeable is not None:
                for subset in _subsets(sinks, min_size=2):
                    if mergeable(subset):
                        yield sum(1 << u for u in subset), (subset,), MERGE

    def solve(state: int) -> float:
        if state in memo:
            return memo[state][0]
        if deadline is not None and fallback is not None and time.monotonic() > deadline:
            stats.budget_hit = True
            stages = fallback(state)
            memo[state] = (sum(st.cost for st in stages), ("fallback", stages))
            return memo[state][0]
        stats.states += 1
        options = []
        for i, (ending, groups, strategy) in enumerate(transitions(state)):
            stats.transitions += 1
            rest = solve(state & ~ending)
            low = rest
            if bound is not None:
                if (groups, strategy) not in bounds:
                    bounds[groups, strategy] = bound(groups, strategy)
                low += bounds[groups, strategy]
            options.append((low, i, rest, ending, groups, strategy))
        if bound is not None:
            options.sort(key=lambda o: o[:2])  # ties: enumeration order (deterministic)
        best: tuple[float, object] = (float("inf"), None)
        for j, (low, _, rest, ending, groups, strategy) in enumerate(options):
            if bound is not None and low >= best[0] - 1e-12:
                stats.bounded += len(options) - j
                break
            stage = priced(groups, strategy)
            if rest + stage.cost < best[0] - 1e-12:  # ties: the first tried wins
                best = (rest + stage.cost, (ending, stage))
            if deadline is not None and time.monotonic() > deadline:
                stats.budget_hit = True  # keep the best so far: no more endings to price
                break
        memo[state] = best
        return best[0]

    full = (1 << part.n) - 1
    cost = solve(full)
    if cost == float("inf"):
        raise ParagraphError("the IOS search found no schedule (no ending passed the pruning)")
    stages: list[Stage] = []
    state = full
    while state:
        choice = memo[state][1]
        if choice[0] == "fallback":
            stages = choice[1] + stages
            break
        ending, stage = choice
        stages.insert(0, stage)
        state &= ~ending
    return cost, stages


def _subsets(items: Sequence[int], min_size: int) -> Iterator[tuple[int, ...]]:
    """Subsets of ``items`` with at least ``min_size`` members (of the first 12), smallest
    first."""
    items = list(items)[:12]
    for size in range(min_size, len(items) + 1):
        yield from combinations(items, size)


def brute_force(part: PartGraph, stage_cost: StageCost, *, r: int = 3, s: int = 8,
                strategies: Sequence[str] = (CONCURRENT,)) -> float:
    """The optimum over every schedule, by trying every subset as the next ending and checking
    the definitions directly (for tests on small graphs only)."""
    @cache
    def best(state: int) -> float:
        if not state:
            return 0.0
        result = float("inf")
        sub = state
        while sub:  # every non-empty subset of state
            if is_ending(part, state, sub):
                groups = _components(part, sub)
                if len(groups) <= s and all(len(g) <= r for g in groups):
                    stage = min(stage_cost(groups, st) for st in strategies)
                    result = min(result, best(state & ~sub) + stage)
            sub = (sub - 1) & state
        return result

    return best((1 << part.n) - 1)


def _components(part: PartGraph, mask: int) -> tuple[tuple[int, ...], ...]:
    """Weakly connected components of the units in ``mask``, each sorted, ordered by first."""
    comps, left = [], mask
    while left:
        seen = part.reach(left & -left, left)
        comps.append(tuple(_bits(seen)))
        left &= ~seen
    return tuple(sorted(comps))


# ---------------------------------------------------------------------------- on a device
@dataclass(frozen=True)
class IOSOptions:
    """Search settings: IOS's pruning (r, s), mode, part size and measurement protocol."""

    mode: str = "both"
    r: int = 3
    s: int | None = None  # None: 8 (IOS's, for a GPU) on a GPU, the core count on a CPU
    max_part_size: int = 50
    max_states: int | None = 20000  # parts whose DP has more states are halved (`blocks`)
    bound: bool = True  # price stages lazily against a lower bound (`schedule_part`)
    warmup: int = 2
    repeat: int = 6
    number: int = 6
    budget_s: float | None = None  # after this, unsolved states run sequentially
    progress: bool = False
    confirm: bool = True  # keep the result only if it beats the plain sequence end to end
    cores: int | None = None  # CPU threads of sequential and merged stages (default: all)


@dataclass
class IOSResult:
    """The program the schedule runs (merges rebuild it), the schedule, and search stats."""

    program: object  # KernelProgram
    schedule: object  # Schedule
    stats: SearchStats
    stages: list[tuple[tuple[tuple[int, ...], ...], str, float]]


# A measured stage may come out a little under the sum of its kernels measured alone (noise,
# caches kept warm across a group): the bound is scaled down by this much to stay below it.
BOUND_SLACK = 0.9


class StageMeter:
    """Measures stages of a `KernelProgram` on its device; each distinct stage once, cached in
    the cost database under a key made of its kernels' hashes and the strategy."""

    def __init__(self, program, options: IOSOptions, db=None, tuning: str = "") -> None:
        from paragraph.machine import cpu_count
        from paragraph.passes.schedule import sequential
        from paragraph.tvm_interop.executor import make_executor
        from paragraph.tvm_interop.memory import no_reuse_plan

        self.program, self.options, self.db, self.tuning = program, options, db, tuning
        self.on_cpu = program.target.kind.name == "llvm"
        self.cores = (options.cores or cpu_count()) if self.on_cpu else 1
        self.seq_threads = self.cores  # threads of a sequential stage (see `ios_schedule`)
        graph = program.graph
        self.executor = make_executor(program, sequential(graph), plan=no_reuse_plan(graph),
                                      use_cuda_graph=False)
        self.executor.run(*[np.zeros(graph[i].type.shape, graph[i].type.dtype)
                            for i in graph.inputs], copy_outputs=False)  # load every kernel
        self.measured = 0
        self._overhead: float | None = None
        self._seconds: dict[tuple, float] = {}  # what `cost` returned, by stage

    def close(self) -> None:
        self.executor.close()

    def key(self, groups, strategy: str) -> str:
        graph = self.program.graph
        sig = "|".join(",".join(graph[k].attrs["hash"] for k in g) for g in groups)
        return f"ios:{strategy}:{sig}"

    def cost(self, groups: tuple[tuple[int, ...], ...], strategy: str) -> float:
        """Seconds for one run of the stage (kernel ids), measured or from the database."""
        if strategy == SEQUENTIAL and self.seq_threads == 1 and len(groups) == 1:
            strategy = CONCURRENT  # the same run: one group on one thread
        if (groups, strategy) not in self._seconds:
            self._seconds[groups, strategy] = self._cost(groups, strategy)
        return self._seconds[groups, strategy]

    def _cost(self, groups: tuple[tuple[int, ...], ...], strategy: str) -> float:
        from paragraph.tvm_interop.measure import CostKey

        source = ",".join(sorted({self.program.graph[k].attrs["source"]
                                  for g in groups for k in g}))
        threads = f";threads={self.seq_threads}" if strategy != CONCURRENT else ""
        key = CostKey(str(self.program.target), self.key(groups, strategy), self.tuning, source,
                      f"protocol={self.options.warmup}/{self.options.repeat}x"
                      f"{self.options.number}/fork-join{threads}")
        cached = self.db.get(key) if self.db is not None else None
        if cached is not None:
            return cached
        seconds = self._measure(groups, strategy)
        self.measured += 1
        if self.db is not None:
            from paragraph.tvm_interop.vm import Timing

            self.db.put(key, Timing((seconds,)))
        return seconds

    def overhead(self) -> float:
        """Seconds a stage costs with nothing in it (dispatch to a worker and back), measured
        once per meter with the stage protocol."""
        if self._overhead is None:
            self._overhead = self.cost((), CONCURRENT)
        return self._overhead

    def bound(self, groups: tuple[tuple[int, ...], ...], strategy: str) -> float:
        """A lower bound of ``cost(groups, strategy)`` from the kernels measured alone: the
        slowest group (on a CPU also the total spread over the cores) plus one stage overhead,
        times `BOUND_SLACK` for measurement noise. Merges are not bounded (0)."""
        if strategy == MERGE:
            return 0.0
        base = self.overhead()
        loads = [sum(max(0.0, self.cost(((k,),), strategy) - base) for k in g) for g in groups]
        if strategy == SEQUENTIAL:
            work = sum(loads)
        else:
            work = max(loads, default=0.0)
            if self.on_cpu:  # groups beyond the cores share them
                work = max(work, sum(loads) / self.cores)
        return BOUND_SLACK * (base + work)

    def _measure(self, groups, strategy: str) -> float:
        steps = self.executor.steps
        if strategy == MERGE:
            return self._merged_cost(tuple(k for g in groups for k in g))
        if strategy == SEQUENTIAL:
            run = [[steps[k] for g in groups for k in g]]
            threads = [self.seq_threads]
        else:  # an empty stage (`overhead`) still goes to one worker and back
            run = [[steps[k] for k in g] for g in groups] or [[]]
            threads = [1] * len(run)
        if not self.on_cpu:
            return self._measure_gpu(run)
        return self._protocol(run, threads, fork_join=len(run) > 1)

    def _protocol(self, run, threads: list[int], fork_join: bool = False) -> float:
        """IOS's protocol on a CPU: ``warmup`` runs, then the median over ``repeat`` of the
        mean of ``number`` runs. A stage of several groups has every run dispatched to the
        workers and joined on its own, as the executor forks and joins streams at its barriers
        (repeating the runs inside one dispatch hid that hand-off, and the DP split a run into
        more concurrent stages than paid: NASNet-A predicted 16 ms, ran 24); a one-group stage
        runs its ``number`` runs in one dispatch, as consecutive one-stream stages follow each
        other on one worker with no hand-off."""
        from paragraph.tvm_interop.measure import time_steps

        opts = self.options
        if not fork_join:
            run = [[st for _ in range(opts.number) for st in group] for group in run]
            timing = time_steps(run, repeat=opts.repeat, warmup=opts.warmup, threads=threads)
            return timing.median_ms / 1e3 / opts.number
        timing = time_steps(run, repeat=opts.repeat * opts.number, warmup=opts.warmup,
                            threads=threads)
        x = timing.samples
        means = [sum(x[i:i + opts.number]) / opts.number for i in range(0, len(x), opts.number)]
        return float(np.median(means))

    def _measure_gpu(self, run) -> float:
        """Groups issued on their own CUDA streams, timed between device synchronisations."""
        from paragraph.tvm_interop.executor import _check, _cudart

        rt, dev, opts = _cudart(), self.program.device, self.options
        streams = self.executor.streams
        samples = []
        for i in range(opts.warmup + opts.repeat):
            dev.sync()
            start = time.perf_counter()
            for _ in range(opts.number):
                for group, stream in zip(run, streams):
                    dev.set_raw_stream(int(stream))
                    for step in group:
                        step.fn(*step.args)
                for stream in streams[:len(run)]:
                    _check(rt.cudaStreamSynchronize(stream))
            if i >= opts.warmup:
                samples.append((time.perf_counter() - start) / opts.number)
        dev.set_raw_stream(0)
        return sorted(samples)[len(samples) // 2]

    def _merged_cost(self, kernels: tuple[int, ...]) -> float:
        """Build the merged convolution alone, compile it, and time it with all threads."""
        from paragraph.graph import GraphBuilder
        from paragraph.passes.merge import merge_rewrite, relabel
        from paragraph.passes.schedule import sequential
        from paragraph.tvm_interop.executor import make_executor
        from paragraph.tvm_interop.kernels import KernelProgram

        ops = self.program.ops
        units = [self.unit(k) for k in kernels]
        data = ops.type_of(units[0].data)
        b = GraphBuilder()  # the shared input, then the units' operators, then the merge
        x = b.input(data.shape, data.dtype, name="x")
        nodes = {units[0].data.node: x.node}
        for u in units:
            for i in (u.conv, *u.chain):
                node = ops[i]
                ins = []
                for r in node.inputs:
                    if r.node not in nodes:
                        nodes[r.node] = b.weight(ops[r.node].value, kind=ops[r.node].kind).node
                    ins.append(TensorRef(nodes[r.node], r.index))
                nodes[i] = b.op(node.kind, ins, node.attrs).id
        mini = b.build([TensorRef(nodes[u.last]) for u in units])
        removed, added, remap = merge_rewrite(mini, [relabel(u, nodes) for u in units])
        merged = mini.replace_subgraph(removed, added, remap).without_dead_nodes()
        program = KernelProgram.build(merged, self.program.target, device=self.program.device,
                                      tuning_db=self.tuning or None,
                                      kernels=self.program.kernel_source)
        with make_executor(program, sequential(program.graph, cores=self.seq_threads),
                           use_cuda_graph=False) as ex:
            ex.run(np.zeros(data.shape, data.dtype), copy_outputs=False)
            steps = [ex.steps[k] for k in ex.schedule.kernels if ex.steps[k].fn is not None]
            if not self.on_cpu:
                return self._measure_gpu_steps(ex, steps)
            return self._protocol([steps], [self.seq_threads])

    def _measure_gpu_steps(self, ex, steps) -> float:
        opts, dev = self.options, self.program.device
        samples = []
        for i in range(opts.warmup + opts.repeat):
            dev.sync()
            start = time.perf_counter()
            for _ in range(opts.number):
                for st in steps:
                    st.fn(*st.args)
            dev.sync()
            if i >= opts.warmup:
                samples.append((time.perf_counter() - start) / opts.number)
        return sorted(samples)[len(samples) // 2]

    def unit(self, kernel: int):
        from paragraph.passes.merge import conv_unit

        if self.program.kernel_ops is None:
            return None
        return conv_unit(self.program.ops, kernel, self.program.kernel_ops[kernel])

    def mergeable(self, kernels: Sequence[int]) -> bool:
        from paragraph.passes.merge import can_merge

        return can_merge([self.unit(k) for k in kernels])


# a planned stage: strategy, cost, and stream -> kernels in order
Planned = tuple[str, float, dict[int, list[int]]]


def ios_schedule(program, options: IOSOptions = IOSOptions(), *, db=None, tuning_db=None,
                 log: Callable[[str], None] | None = None) -> IOSResult:
    """Search the IOS schedule of ``program`` (a `KernelProgram`): DP per part with measured
    stages; where merges win, rebuild the program with them; return program and schedule."""
    start = time.monotonic()
    deadline = start + options.budget_s if options.budget_s else None
    original, graph = program, program.graph
    meter = StageMeter(program, options, db, tuning="" if tuning_db is None else str(tuning_db))
    stats = SearchStats()
    strategies = (CONCURRENT, SEQUENTIAL) if meter.on_cpu else (CONCURRENT,)
    # Vendor kernels run with torch's thread count, which is one per process (libgomp): a
    # schedule mixing 1-thread and all-core stages would switch it at every such boundary, and
    # each switch drops oneDNN's compiled primitives (~0.6 ms per convolution after it). So
    # with vendor kernels on a CPU every stage runs on one thread (and `_confirm` compares the
    # result with the whole program in sequence on all cores).
    uniform = meter.on_cpu and meter.cores > 1 and "vendor" in program.sources()
    if uniform:
        meter.seq_threads = 1
    if options.s is None:
        options = replace(options, s=meter.cores if meter.on_cpu else 8)
    parts = blocks(graph, options.max_part_size, options.max_states)
    stats.parts = len(parts)
    if log is not None:
        log(f"  IOS search ({options.mode}, r={options.r}, s={options.s}, {len(parts)} parts, "
            f"protocol {options.warmup} warm-ups, {options.repeat}x{options.number} runs"
            + (f", budget {options.budget_s:g} s" if options.budget_s else "") + ") ...")
    stages: list[Stage] = []  # groups of kernel ids
    last_log = start
    try:
        for i, part in enumerate(parts):
            pg = part_graph(graph, part)

            def cost(groups, strategy, part=part):
                return meter.cost(tuple(tuple(part[u] for u in g) for g in groups), strategy)

            def bound(groups, strategy, part=part):
                return meter.bound(tuple(tuple(part[u] for u in g) for g in groups), strategy)

            def fallback(state, part=part):
                units = tuple(_bits(state))
                return [Stage((units,), SEQUENTIAL, cost((units,), SEQUENTIAL))]

            _, found = schedule_part(
                pg, cost, r=options.r, s=options.s, mode=options.mode, strategies=strategies,
                mergeable=lambda units, part=part: meter.mergeable([part[u] for u in units]),
                stats=stats, deadline=deadline, fallback=fallback,
                bound=bound if options.bound else None)
            stages += [Stage(tuple(tuple(part[u] for u in g) for g in st.groups), st.strategy,
                             st.cost) for st in found]
            quarter = 4 * (i + 1) // len(parts) > 4 * i // len(parts)
            if log is not None and (i + 1 == len(parts) or options.progress and (
                    quarter or time.monotonic() - last_log > 10)):
                last_log = time.monotonic()
                bar = "#" * (20 * (i + 1) // len(parts))
                log(f"  IOS [{bar:20}] part {i + 1}/{len(parts)}: {len(part)} kernels, "
                    f"{stats.states} states, {meter.measured} stages measured, "
                    f"{time.monotonic() - start:.0f} s")
    finally:
        meter.close()
    stats.stages_measured = meter.measured
    planned: list[Planned] = []
    for st in stages:
        if st.strategy == CONCURRENT:
            first = 1 if meter.on_cpu else 0  # stream 0 keeps every thread on a CPU
            planned.append((st.strategy, st.cost, {first + j: list(g)
                                                   for j, g in enumerate(st.groups)}))
        else:
            planned.append((st.strategy, st.cost, {0: [k for g in st.groups for k in g]}))
    merges = [[meter.unit(k) for k in st.groups[0]] for st in stages if st.strategy == MERGE]
    if merges:
        program, planned = _rebuild_with_merges(program, merges, planned, tuning_db)
    schedule = _to_schedule(program, planned, meter.seq_threads, options, stats)
    if options.confirm:
        program, schedule = _confirm(original, (program, schedule), meter.cores, options, db,
                                     meter.tuning, log)
    stats.seconds = time.monotonic() - start
    schedule.info["search"] = stats.summary()
    return IOSResult(program, schedule, stats, [(st.groups, st.strategy, st.cost)
                                                for st in stages])


def _plan_digest(schedule) -> str:
    """What a run's time depends on: streams, thread counts and stage barriers."""
    import hashlib
    import json

    plan = [list(map(list, schedule.streams)), list(schedule.threads),
            [list(st) for st in schedule.stages or ()]]
    return hashlib.blake2b(json.dumps(plan).encode(), digest_size=16).hexdigest()


def end_to_end(candidates, db, tuning: str, repeat: int = 6, warmup: int = 2,
               check: bool = False, block: int = 5) -> list[float]:
    """Median seconds of whole runs of each ``(program, schedule)`` on the executor: after a
    warm-up block each, ``repeat`` rounds (in forward, then reverse order) running every
    candidate once untimed and then ``block`` times timed (a candidate's steady state, which
    strict alternation disturbs: `bench.time_in_blocks`),
    cached in ``db`` (a `CostDB` or None) so that choices made from them are deterministic. With
    ``check``, the candidates' outputs on one random input must agree (float32 tolerance),
    else `ParagraphError`: a rewrite that changed the model is a bug, not a slower choice."""
    from paragraph.bench import Config, time_in_blocks
    from paragraph.tvm_interop.executor import make_executor
    from paragraph.tvm_interop.measure import CostKey
    from paragraph.tvm_interop.vm import Timing

    keys = [CostKey(str(p.target), f"run:{p.graph.structural_hash()}:{_plan_digest(s)}",
                    tuning, ",".join(sorted(p.sources())), f"blocks={repeat}x{block}")
            for p, s in candidates]
    seconds = [db.get(k) if db is not None else None for k in keys]
    if None not in seconds and not check:
        return seconds
    samples: list[list[float]] = [[] for _ in candidates]
    executors = [make_executor(p, s, use_cuda_graph=True) for p, s in candidates]
    try:
        graph = candidates[0][0].graph
        if check:
            rng = np.random.default_rng(0)
            inputs = [rng.standard_normal(graph[i].type.shape).astype(graph[i].type.dtype)
                      for i in graph.inputs]
            outs = [[np.asarray(o) for o in ex.run(*inputs)] for ex in executors]
            for (p, _), got in zip(candidates[1:], outs[1:]):
                for a, b in zip(outs[0], got):
                    if a.shape != b.shape or not np.allclose(a, b, rtol=1e-4, atol=1e-4):
                        what = f" (split {', '.join(p.split)})" if p.split else ""
                        raise ParagraphError(
                            f"the rewritten program{what} does not compute the model's "
                            "outputs: max difference "
                            f"{float(np.max(np.abs(a - b))) if a.shape == b.shape else a.shape}")
            if None not in seconds:
                return seconds
        inputs = [np.zeros(graph[i].type.shape, graph[i].type.dtype) for i in graph.inputs]
        configs = [Config(str(i), partial(ex.run, *inputs, copy_outputs=False), samples=got)
                   for i, (ex, got) in enumerate(zip(executors, samples))]
        for c in configs:  # a whole block each: a process's first runs are slow
            for _ in range(max(1, warmup, block)):
                c.run()
        for r in range(max(3, repeat)):  # drifts hit both orders
            time_in_blocks(configs if r % 2 == 0 else configs[::-1], 1, max(1, block), settle=1)
    finally:
        for ex in executors:
            ex.close()
    if db is not None:
        for key, x in zip(keys, samples):
            db.put(key, Timing(tuple(x)))
    return [float(np.median(x)) for x in samples]


def _confirm(original, searched, cores: int, options: IOSOptions, db, tuning: str, log):
    """The searched (program, schedule), or all of ``original`` in sequence (on ``cores``
    threads, and on one thread: the schedule of one-kernel stages, also in IOS's space),
    whichever runs fastest end to end on the executor (`end_to_end`: alternating blocks of
    runs, cached in the cost database so the choice is deterministic).
    Stage latencies measured alone do not add up to a whole run (caches, hand-offs between
    streams), so the DP's sum can promise what a run does not keep."""
    from paragraph.passes.schedule import sequential
    from paragraph.schedule import Schedule

    program, schedule = searched
    plain = [sequential(original.graph, cores=c) for c in dict.fromkeys((cores, 1))]
    candidates = [(program, schedule)] + [(original, base) for base in plain]
    seconds = end_to_end(candidates, db, tuning, options.repeat, options.warmup)
    best = min(range(len(candidates)), key=lambda i: (seconds[i], i))  # ties: the search
    names = ["the IOS schedule"] + [f"all kernels in sequence on {b.threads[0]} thread(s)"
                                    for b in plain]
    if log is not None:
        log("  IOS end to end: " + ", ".join(f"{n} {t * 1e3:.2f} ms"
                                            for n, t in zip(names, seconds))
            + f": keeping {names[best]}")
    confirmed = {"ios_ms": seconds[0] * 1e3, "sequential_ms": seconds[1] * 1e3,
                 "sequential_1thread_ms": seconds[-1] * 1e3, "kept": names[best]}
    if best == 0:
        schedule.info["confirmed"] = confirmed
        return program, schedule
    base = plain[best - 1]
    info = {**schedule.info, "confirmed": confirmed, "strategies": [SEQUENTIAL]}
    return original, Schedule.build(original.graph, base.streams, threads=base.threads,
                                    name=schedule.name, info=info)


def _rebuild_with_merges(program, merges, planned: list[Planned], tuning_db):
    """Apply the chosen merges to the operator graph, lower it again, and carry the plan over:
    each new kernel goes to the latest stage (and that stage's stream) of the operators it
    computes: the old kernel's, or the merge's for operators a merge made; never earlier than
    a kernel it reads from."""
    from paragraph.passes.merge import apply_merges
    from paragraph.tvm_interop.kernels import KernelProgram

    new_ops, added = apply_merges(program.ops, merges)
    rebuilt = KernelProgram.build(new_ops, program.target, device=program.device,
                                  tuning_db=tuning_db, kernels=program.kernel_source)
    if rebuilt.kernel_ops is None:
        raise ParagraphError("IOS merge: the rebuilt program's kernels could not be traced")
    origin: dict[int, tuple[int, int]] = {}  # operator id -> (stage, stream)
    merge_stages = [i for i, (strategy, _, _) in enumerate(planned) if strategy == MERGE]
    for i, (_, _, streams) in enumerate(planned):
        for s, ks in streams.items():
            for k in ks:
                for op in program.kernel_ops.get(k, ()):
                    origin[op] = (i, s)
    for i, ids in zip(merge_stages, added):
        for op in ids:
            origin[op] = (i, 0)
    where: dict[int, tuple[int, int]] = {}
    graph = rebuilt.graph
    for k in kernel_ids(graph):
        if graph[k].kind != "kernel":
            continue
        here = max(origin[op] for op in rebuilt.kernel_ops[k])
        for p in producers(graph, k):
            p = _producing_kernel(graph, p)
            if p in where and where[p][0] > here[0]:
                here = where[p]
        where[k] = here
    out: list[Planned] = [(strategy, cost, {}) for strategy, cost, _ in planned]
    for k, (i, s) in where.items():
        out[i][2].setdefault(s, []).append(k)
    return rebuilt, [p for p in out if p[2]]


def _to_schedule(program, planned: list[Planned], cores: int, options: IOSOptions,
                 stats: SearchStats):
    """The plan as a `Schedule` with one barrier per stage; stream 0 gets ``cores`` threads
    (sequential and merged stages), the others one each; views follow the kernel that wrote
    their bytes."""
    from paragraph.schedule import Schedule

    graph = program.graph
    position = {k: p for p, k in enumerate(kernel_ids(graph))}
    where = {k: (i, s) for i, (_, _, streams) in enumerate(planned)
             for s, ks in streams.items() for k in ks}
    for n in graph.nodes:
        if n.kind == "view":
            where[n.id] = where.get(_producing_kernel(graph, n.id), (0, 0))
    used = sorted({s for _, s in where.values()})
    streams = [sorted((k for k, (_, t) in where.items() if t == s),
                      key=lambda k: (where[k][0], position[k])) for s in used]
    stage_lists = [[k for k, (j, _) in where.items() if j == i] for i in range(len(planned))]
    threads = [cores if s == 0 else 1 for s in used]
    info = {"mode": options.mode, "r": options.r, "s": options.s,
            "max_part_size": options.max_part_size, "search": stats.summary(),
            "strategies": [strategy for strategy, _, _ in planned],
            "predicted_ms": sum(cost for _, cost, _ in planned) * 1e3}
    return Schedule.build(graph, streams, threads=threads, stages=stage_lists,
                          name=f"ios-{options.mode}", info=info)


IOS_SCHEDULES = tuple(f"ios-{m}" for m in MODES)


def _measured_critical_path(program, db, tuning_db, cores: int | None, log,
                            split: bool = True):
    """``(program, schedule)``: `critical_path` over each kernel's 1-thread time in model
    order, measured (or from the cost database): on a CPU every stream has one thread, so that
    is the time each kernel will take; a blocking cross-stream wait is charged the measured
    worker hand-off. With ``split`` (CPU, two streams or more), lone convolutions are also
    split across the streams (`paragraph.passes.split`) and the split program is kept if its
    outputs agree and it runs faster end to end. ``info`` in ms: ``predicted_ms``,
    ``critical_path_ms``, ``work_ms``, ``handoff_us`` and ``optimum_ms`` (no schedule on these
    streams can beat it with these times: `critical_path`'s optimum without hand-offs)."""
    from paragraph.machine import cpu_count
    from paragraph.passes.split import split_program
    from paragraph.tvm_interop.measure import CostDB

    on_cpu = program.target.kind.name == "llvm"
    streams = (cores or cpu_count()) if on_cpu else None
    own_db = db is None
    db = CostDB() if own_db else db
    tuning = "" if tuning_db is None else str(tuning_db)
    try:
        schedule = _plan_critical_path(program, db, tuning, streams, cores, log)
        if not (split and on_cpu and streams >= 2):
            return program, schedule
        try:
            rebuilt = split_program(program, 4 if streams >= 4 else 2, tuning_db=tuning_db,
                                    log=log)
        except Exception as exc:  # an optional rewrite: the plain schedule still stands
            warnings.warn(f"critical-path: the split program could not be built "
                          f"({type(exc).__name__}: {exc}); keeping the model's own kernels",
                          RuntimeWarning, stacklevel=3)
            rebuilt = None
        if rebuilt is None:
            return program, schedule
        other = _plan_critical_path(rebuilt, db, tuning, streams, cores, log)
        if log is not None:
            log("  critical-path: checking the split program's outputs, timing both ...")
        unsplit_s, split_s = end_to_end([(program, schedule), (rebuilt, other)], db, tuning,
                                        check=True)
    finally:
        if own_db:
            db.close()
    keep = split_s < unsplit_s
    if log is not None:
        log(f"  critical-path end to end: {unsplit_s * 1e3:.2f} ms, split "
            f"{split_s * 1e3:.2f} ms: keeping the {'split' if keep else 'unsplit'} program")
    result = (rebuilt, other) if keep else (program, schedule)
    result[1].info.update(split=rebuilt.split if keep else [], unsplit_ms=unsplit_s * 1e3,
                          split_ms=split_s * 1e3)
    return result


def _plan_critical_path(program, db, tuning: str, streams: int | None, cores: int | None,
                        log):
    """`critical_path` of ``program`` over measured 1-thread kernel times and hand-off."""
    from paragraph.passes.schedule import critical_path, sequential
    from paragraph.tvm_interop.executor import make_executor
    from paragraph.tvm_interop.measure import kernel_costs, measure_handoff

    on_cpu = program.target.kind.name == "llvm"
    if log is not None:
        log("  critical-path: kernel times (1 thread, in model order), measured or cached")
    with make_executor(program, sequential(program.graph, cores=1), use_cuda_graph=False) as ex:
        costs = kernel_costs(ex, db=db, threads=1, tuning=tuning, progress=log is not None)
    handoff = measure_handoff(db, str(program.target)) if on_cpu else 0.0
    schedule = critical_path(program.graph, cost=costs, streams=streams, cores=cores,
                             handoff=handoff)
    # the optimum is a bound only without hand-offs: with one, plan again without for it
    free = schedule if handoff == 0.0 else critical_path(program.graph, cost=costs,
                                                         streams=streams, cores=cores)
    optimum, exact = free.info["optimum"], free.info["optimum_exact"]
    info = schedule.info
    del info["optimum"]
    info.update(predicted_ms=info.pop("predicted") * 1e3,
                critical_path_ms=info.pop("critical_path") * 1e3,
                work_ms=info.pop("work") * 1e3, handoff_us=handoff * 1e6,
                optimum_ms=optimum * 1e3, optimum_exact=exact)
    return schedule


def plan_schedule(name: str, program, *, options: IOSOptions | None = None, db=None,
                  tuning_db=None, cores: int | None = None,
                  log: Callable[[str], None] | None = None, split: bool = True):
    """``(program, schedule)`` for the schedule ``name``: one of
    `paragraph.passes.schedule.ALGORITHMS` (the program unchanged), ``ios`` (mode from
    ``options``) or ``ios-<mode>``. IOS searches with measured stages, cached in ``db`` (a
    `CostDB`; the default cache when None), and may return a program rebuilt with merged
    convolutions; ``critical-path`` may return one with split convolutions (``split``)."""
    from paragraph.passes.schedule import make_schedule
    from paragraph.tvm_interop.measure import CostDB

    if name == "critical-path":
        return _measured_critical_path(program, db, tuning_db, cores, log, split)
    if name != "ios" and not name.startswith("ios-"):
        return program, make_schedule(name, program.graph, cores=cores)
    options = options or IOSOptions()
    if name != "ios":
        mode = name[len("ios-"):]
        if mode not in MODES:
            raise ParagraphError(f"unknown IOS mode {mode!r} in {name!r}; choose from "
                                 f"{', '.join(IOS_SCHEDULES)}")
        options = replace(options, mode=mode)
    options = replace(options, cores=options.cores or cores)
    own_db = db is None
    db = CostDB() if own_db else db
    try:
        result = ios_schedule(program, options, db=db, tuning_db=tuning_db, log=log)
    finally:
        if own_db:
            db.close()
    if log is not None:
        log(f"  IOS: {result.stats.summary()}")
    return result.program, result.schedule
