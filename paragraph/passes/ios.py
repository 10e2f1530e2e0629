"""IOS: inter-operator scheduling by dynamic programming over stages (Ding et al., MLSys'21).

The kernel graph is cut into blocks at its lone kernels (`paragraph.dag.lone`: nothing can run
beside them; they include IOS's cut nodes on every input-to-output path, as RAF's port of IOS
uses), and blocks larger than ``max_part_size`` into consecutive parts. For each part a
memoised DP over states (bitmask of kernels not yet scheduled) takes, at each state S, the best
ending S' (no edge leaves S' into S - S'):

    cost[S] = min over endings S' of cost[S - S'] + stage_latency(S')      (IOS section 4)

with stage_latency = min(concurrent execution of S''s groups, operator merge where mergeable).
Groups are the weakly connected components of the ending; pruning keeps at most ``s`` groups
per stage and ``r`` kernels per group (``r`` = 3; ``s`` = 8 on a GPU as in IOS, the core count
on a CPU, where more groups only share the cores). Beyond IOS:

* on a CPU a stage may instead run its kernels one after another with all threads;
* stages are priced lazily against a lower bound (their kernels measured alone), a branch and
  bound inside each state that prices a fraction of the stages for the same optimum;
* parts whose DP would visit more than ``max_states`` states are halved (the state count grows
  exponentially with a part's width);
* a time budget: what is not solved in time runs sequentially.

Pure: stage costs come in as functions. `paragraph.tvm_interop.meter.stages.StageMeter` measures
them on a device, and `paragraph.planner` runs the search on a program, applies the merges it
chose (the verified rule ``ios-merge-convs``, `apply_merges`), confirms the result end to end
and returns it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from itertools import combinations
from typing import Any

from paragraph.dag import lone
from paragraph.errors import ParagraphError
from paragraph.graph import Graph
from paragraph.rules.library import default_library
from paragraph.rules.match import Match
from paragraph.rules.parametric import MergeConvs, Unit
from paragraph.schedule import Schedule, kernel_ids, producers

MODES = ("parallel", "merge", "both")
IOS_SCHEDULES = tuple(f"ios-{m}" for m in MODES)
CONCURRENT, SEQUENTIAL, MERGE = "concurrent", "sequential", "merge"
MERGE_RULE = "ios-merge-convs"  # the library rule every IOS merge applies


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


# ---------------------------------------------------------------------------- blocks
def producing_kernel(graph: Graph, node: int) -> int:
    """Follow views back to the kernel that wrote the bytes (or the source)."""
    while graph[node].kind == "view":
        node = graph[node].inputs[0].node
    return node


def kernel_preds(graph: Graph, kernels: Sequence[int]) -> dict[int, list[int]]:
    """Each kernel's producers among ``kernels``, looking through views."""
    members = set(kernels)
    preds: dict[int, list[int]] = {}
    for k in kernels:
        found = (producing_kernel(graph, p) for p in producers(graph, k))
        preds[k] = list(dict.fromkeys(p for p in found if p in members))
    return preds


def blocks(graph: Graph, max_part_size: int = 50,
           max_states: int | None = None) -> list[list[int]]:
    """The kernels (views excluded) cut into blocks at the lone ones (each ends its block),
    each block split into consecutive parts of at most ``max_part_size`` kernels, and a part
    whose DP would visit more than ``max_states`` states (its predecessor-closed subsets)
    halved until it does not: the DP's cost grows with the states, which grow exponentially
    with a part's width (NASNet-A: 200k+ states in a 50-kernel part, under 20k in 25)."""
    kernels = [k for k in kernel_ids(graph) if graph[k].kind == "kernel"]
    cuts = lone(kernels, kernel_preds(graph, kernels))
    out: list[list[int]] = []
    current: list[int] = []
    for k in kernels:  # topological order: a block is what lies between two cut kernels
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
    index = {k: j for j, k in enumerate(part)}
    return PartGraph.from_edges(len(part), [(index[p], index[k]) for k, ps
                                            in kernel_preds(graph, part).items() for p in ps])


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

    def extend(start: int, chosen: tuple[int, ...], blocked: int
               ) -> Iterator[tuple[int, ...]]:
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
Groups = tuple[tuple[int, ...], ...]
StageCost = Callable[[Groups, str], float]


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
    # a state's choice: (ending, its stage), or the stages of a fallback, or None (empty)
    memo: dict[int, tuple[float, tuple[int, Stage] | list[Stage] | None]] = {0: (0.0, None)}
    price: dict[tuple[Groups, str], Stage] = {}
    bounds: dict[tuple[Groups, str], float] = {}

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
            memo[state] = (sum(st.cost for st in stages), stages)
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
        best: tuple[float, tuple[int, Stage] | list[Stage] | None] = (float("inf"), None)
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
        if isinstance(choice, list):  # a fallback finished this state
            stages = choice + stages
            break
        assert choice is not None  # only the empty state has no choice
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


# ---------------------------------------------------------------------------- the search
KernelStageCost = Callable[[Groups, str], float]  # groups of kernel ids


def search(graph: Graph, options: IOSOptions, cost: KernelStageCost, *,
           strategies: Sequence[str] = (CONCURRENT,),
           bound: KernelStageCost | None = None,
           mergeable: Callable[[Sequence[int]], bool] | None = None,
           stats: SearchStats | None = None, parts: list[list[int]] | None = None,
           progress: Callable[[int, list[list[int]], SearchStats], None] | None = None,
           ) -> list[Stage]:
    """IOS over the whole kernel graph: `blocks` (or ``parts``, already made), then
    `schedule_part` on each part with ``cost``, ``bound`` and ``mergeable`` over kernel ids;
    the stages, in execution order, over kernel ids. ``options.s`` must be set. After
    ``options.budget_s`` the states not yet solved run sequentially; ``progress(i, parts,
    stats)`` follows each part."""
    if options.s is None:
        raise ParagraphError("IOS search: the number of groups per stage (s) is not set")
    start = time.monotonic()
    deadline = start + options.budget_s if options.budget_s else None
    stats = stats if stats is not None else SearchStats()
    if parts is None:
        parts = blocks(graph, options.max_part_size, options.max_states)
    stats.parts = len(parts)
    stages: list[Stage] = []
    for i, part in enumerate(parts):
        def on_part(groups: Groups, part: list[int] = part) -> Groups:
            return tuple(tuple(part[u] for u in g) for g in groups)

        def part_cost(groups: Groups, strategy: str,
                      on_part: Callable[[Groups], Groups] = on_part) -> float:
            return cost(on_part(groups), strategy)

        def part_bound(groups: Groups, strategy: str,
                       on_part: Callable[[Groups], Groups] = on_part) -> float:
            assert bound is not None  # only passed with a bound
            return bound(on_part(groups), strategy)

        def fallback(state: int, part_cost: StageCost = part_cost) -> list[Stage]:
            units = tuple(_bits(state))
            return [Stage((units,), SEQUENTIAL, part_cost((units,), SEQUENTIAL))]

        def part_mergeable(units: tuple[int, ...], part: list[int] = part) -> bool:
            assert mergeable is not None
            return mergeable([part[u] for u in units])

        _, found = schedule_part(
            part_graph(graph, part), part_cost, r=options.r, s=options.s, mode=options.mode,
            strategies=strategies, mergeable=part_mergeable if mergeable else None,
            stats=stats, deadline=deadline, fallback=fallback,
            bound=part_bound if bound is not None and options.bound else None)
        stages += [Stage(on_part(st.groups), st.strategy, st.cost) for st in found]
        if progress is not None:
            progress(i, parts, stats)
    stats.seconds = time.monotonic() - start
    return stages


# ---------------------------------------------------------------------------- to a schedule
# a planned stage: strategy, cost, and stream -> kernels in order
Planned = tuple[str, float, dict[int, list[int]]]


def plan_streams(stages: Sequence[Stage], on_cpu: bool) -> list[Planned]:
    """Each stage's streams: concurrent groups one per stream (on a CPU from stream 1, as
    stream 0 keeps every thread for sequential and merged stages), the rest on stream 0."""
    planned: list[Planned] = []
    for st in stages:
        if st.strategy == CONCURRENT:
            first = 1 if on_cpu else 0
            planned.append((st.strategy, st.cost, {first + j: list(g)
                                                   for j, g in enumerate(st.groups)}))
        else:
            planned.append((st.strategy, st.cost, {0: [k for g in st.groups for k in g]}))
    return planned


def to_schedule(graph: Graph, planned: Sequence[Planned], cores: int, options: IOSOptions,
                info: Mapping[str, Any] | None = None) -> Schedule:
    """The plan as a `Schedule` with one barrier per stage; stream 0 gets ``cores`` threads
    (sequential and merged stages), the others one each; views follow the kernel that wrote
    their bytes. ``info``: the search's own, with the mode, pruning, strategies and the
    predicted time."""
    position = {k: p for p, k in enumerate(kernel_ids(graph))}
    where = {k: (i, s) for i, (_, _, streams) in enumerate(planned)
             for s, ks in streams.items() for k in ks}
    for n in graph.nodes:
        if n.kind == "view":
            where[n.id] = where.get(producing_kernel(graph, n.id), (0, 0))
    used = sorted({s for _, s in where.values()})
    streams = [sorted((k for k, (_, t) in where.items() if t == s),
                      key=lambda k: (where[k][0], position[k])) for s in used]
    # a program of views alone (reshapes of an input) plans no stage: its views take stage 0
    count = max([len(planned)] + [j + 1 for j, _ in where.values()])
    stage_lists = [[k for k, (j, _) in where.items() if j == i] for i in range(count)]
    threads = [cores if s == 0 else 1 for s in used]
    return Schedule.build(graph, streams, threads=threads, stages=stage_lists,
                          name=f"ios-{options.mode}",
                          info={"mode": options.mode, "r": options.r, "s": options.s,
                                "max_part_size": options.max_part_size,
                                "strategies": [strategy for strategy, _, _ in planned],
                                "predicted_ms": sum(cost for _, cost, _ in planned) * 1e3,
                                **(info or {})})


# ---------------------------------------------------------------------------- merges
def merge_rule() -> MergeConvs:
    """The library's IOS merge: every merge that reaches a program is this verified rule."""
    return default_library().get_as(MERGE_RULE, MergeConvs)


def merge_units(rule: MergeConvs, opgraph: Graph,
                kernel_operators: Mapping[int, Sequence[int]],
                kernels: Sequence[int]) -> list[Unit] | None:
    """The convolution units (`MergeConvs.unit`) of ``kernels`` if ``rule`` merges exactly
    them (IOS's check: one input, stride, output size and chain), else None."""
    units = [rule.unit(opgraph, kernel_operators.get(k, ())) for k in kernels]
    if any(u is None for u in units):
        return None
    found = [u for u in units if u is not None]
    return found if rule.match_units(opgraph, found) is not None else None


def apply_merges(rule: MergeConvs, opgraph: Graph, merges: Sequence[Sequence[Unit]]
                 ) -> tuple[Graph, list[list[int]]]:
    """``opgraph`` with every group of ``merges`` merged by ``rule`` (one library rewrite
    each), and the ids of the operators each merge added."""
    added: list[list[int]] = []
    for units in merges:
        match: Match | None = rule.match_units(opgraph, units)
        merged = None if match is None else rule.rewrite(opgraph, match)
        if merged is None:
            raise ParagraphError(f"IOS merge: {MERGE_RULE} does not apply to the convolutions "
                                 f"{[c for c, _ in units]}")
        fresh = opgraph.next_id
        added.append([n.id for n in merged.operators if n.id >= fresh])
        opgraph = merged
    opgraph.validate()
    return opgraph, added


def carry_over(planned: Sequence[Planned], old: Mapping[int, Sequence[int]],
               added: Sequence[Sequence[int]], graph: Graph,
               new: Mapping[int, Sequence[int]]) -> list[Planned]:
    """The plan moved onto a program rebuilt with merges: ``old`` and ``new`` map the kernels
    of the two programs to their operators, ``added`` lists the operators of each merge (in
    the order of the merge stages), ``graph`` is the new kernel graph. Each new kernel goes
    to the latest stage (and that stage's stream) of the operators it computes: the old
    kernel's, or the merge's for operators a merge made; never earlier than a kernel it reads
    from."""
    origin: dict[int, tuple[int, int]] = {}  # operator id -> (stage, stream)
    merge_stages = [i for i, (strategy, _, _) in enumerate(planned) if strategy == MERGE]
    for i, (_, _, streams) in enumerate(planned):
        for s, ks in streams.items():
            for k in ks:
                for op in old.get(k, ()):
                    origin[op] = (i, s)
    for i, ids in zip(merge_stages, added, strict=True):
        for op in ids:
            origin[op] = (i, 0)
    where: dict[int, tuple[int, int]] = {}
    for k in kernel_ids(graph):
        if graph[k].kind != "kernel":
            continue
        here = max(origin[op] for op in new[k])
        for p in producers(graph, k):
            p = producing_kernel(graph, p)
            if p in where and where[p][0] > here[0]:
                here = where[p]
        where[k] = here
    out: list[Planned] = [(strategy, cost, {}) for strategy, cost, _ in planned]
    for k, (i, s) in where.items():
        out[i][2].setdefault(s, []).append(k)
    return [p for p in out if p[2]]
