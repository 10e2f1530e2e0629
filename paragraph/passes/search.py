"""The substitution search (AutoGraph, AAAI'23; MetaFlow alg. 1 and 2; TASO alg. 2): pure, no TVM.

* `backtrack`: MetaFlow's backtracking search / TASO's cost-based search. A priority queue of
  graphs by cost; each popped graph is expanded by every match of every rule; results within
  ``beta`` of the best are queued (beta = 1.1 as AutoGraph, 1.05 as TASO), deduplicated by
  structural hash; a rewrite that would close a cycle is rejected by the rewriter. Budgets in
  expansions and seconds.
* `partition`: AutoGraph's flow-based partition. A node's capacity is the number of rule
  matches that touch it; a minimum vertex cut of the split-node flow network (networkx's
  Boykov-Kolmogorov) splits a piece into a prefix and a suffix, recursively until every piece
  has at most ``size_l`` = 40 operators; then runs of neighbouring pieces up to ``size_u`` = 120
  operators are the candidate pieces.
* `dp`: AutoGraph eq. 2, MCP[G] = min over beginning pieces p of MCP[G - p] + BSMCP[p],
  memoised by the remaining piece set, each piece optimised by `backtrack` on its own
  (`extract`) and the chosen pieces stitched back into the whole graph (`stitch`).
* `search`: one call for ``greedy``, ``taso`` and ``autograph``.

Every rewrite comes from a library rule and is recorded by rule id (`Applied`). The on-board
loop, which builds and times the best candidates, is the planner's (`paragraph.planner`).
"""

from __future__ import annotations

import heapq
import itertools
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import networkx as nx

from paragraph.errors import GraphError, ParagraphError
from paragraph.graph import Graph, Node, TensorRef
from paragraph.passes.cost import COSTS, CostFn
from paragraph.progress import Log
from paragraph.progress import Progress as Bar
from paragraph.rules.match import AnyRule, apply_match, find_matches, kind_index

SIZE_L, SIZE_U = 40, 120  # AutoGraph's partition thresholds
METHODS = ("none", "greedy", "taso", "autograph")


@dataclass(frozen=True)
class Applied:
    """One rewrite: the rule id and the operators it replaced (kind and name)."""

    rule: str
    where: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.rule} at {', '.join(self.where)}"


@dataclass(frozen=True)
class Candidate:
    """A graph the search reached, its cost and the rewrites that made it; where it was
    assembled from pieces of the graph searched, each rewritten piece (`Piece`), so that a
    subset of them can be stitched into that graph again (`with_pieces`)."""

    cost: float
    graph: Graph
    applied: tuple[Applied, ...] = ()
    pieces: tuple[Piece, ...] = ()


@dataclass(frozen=True)
class Piece:
    """The operators ``ops`` of the graph searched, rewritten as ``result`` (a graph of the
    piece alone, as `extract` made it, with the rewrites that made it)."""

    ops: frozenset[int]
    result: Candidate


@dataclass
class Budget:
    """Expansions and seconds a search may spend (shared by the pieces of one search)."""

    expansions: int = 2000
    seconds: float = 60.0
    start: float = field(default_factory=time.perf_counter)
    used: int = 0

    def spent(self) -> bool:
        return (self.used >= self.expansions
                or time.perf_counter() - self.start >= self.seconds)


def _where(graph: Graph, nodes: Sequence[int]) -> tuple[str, ...]:
    return tuple(graph[i].name or f"{graph[i].kind}%{i}" for i in nodes if i in graph)


def expand(graph: Graph, rules: Sequence[AnyRule]) -> list[tuple[Applied, Graph]]:
    """Every graph one rewrite away from ``graph`` (cycles and no-ops rejected)."""
    index = kind_index(graph)
    out = []
    for rule in rules:
        for m in find_matches(graph, rule, index):
            new = apply_match(graph, m)
            if new is not None:
                out.append((Applied(rule.id, _where(graph, m.nodes)), new))
    return out


def random_walks(graph: Graph, rules: Sequence[AnyRule], count: int, *, steps: int = 4,
                 seed: int = 0, attempts: int = 20) -> list[Candidate]:
    """Up to ``count`` distinct graphs, each 1 to ``steps`` random rewrites away from
    ``graph`` (cost 0: not priced), seeded: at each step a rule is drawn among those with a
    match, then one of its matches, so that a rule matching everywhere does not crowd out the
    rest. What the cost model's accuracy is judged on (`benchmarks/costmodel.py`): graphs the
    rules reach, not only the ones a cost already prefers. Gives up after ``attempts`` times
    ``count`` walks (a graph with few matches has few distinct neighbours)."""
    rng = random.Random(seed)
    seen = {graph.structural_hash()}
    out: list[Candidate] = []
    for _ in range(attempts * count):
        if len(out) >= count:
            break
        g, applied = graph, []
        for _ in range(rng.randint(1, steps)):
            index = kind_index(g)
            found = [(rule, ms) for rule in rules if (ms := find_matches(g, rule, index))]
            if not found:
                break
            rule, ms = found[rng.randrange(len(found))]
            match = ms[rng.randrange(len(ms))]
            new = apply_match(g, match)
            if new is None:
                continue
            applied.append(Applied(rule.id, _where(g, match.nodes)))
            g = new
        h = g.structural_hash()
        if applied and h not in seen:
            seen.add(h)
            out.append(Candidate(0.0, g, tuple(applied)))
    return out


# ---------------------------------------------------------------------------- backtracking
def backtrack(graph: Graph, rules: Sequence[AnyRule], cost: CostFn, *, beta: float = 1.1,
              budget: Budget | None = None, keep: int = 1) -> list[Candidate]:
    """MetaFlow alg. 1: the ``keep`` cheapest graphs found (best first; the input is one)."""
    budget = budget or Budget()
    start = Candidate(cost(graph), graph)
    best = [start]
    seen = {graph.structural_hash()}
    tie = itertools.count()
    queue = [(start.cost, next(tie), start)]
    while queue and not budget.spent():
        _, _, cand = heapq.heappop(queue)
        if cand.cost > beta * best[0].cost:
            continue
        budget.used += 1
        for applied, new in expand(cand.graph, rules):
            h = new.structural_hash()
            if h in seen:
                continue
            seen.add(h)
            c = Candidate(cost(new), new, cand.applied + (applied,))
            if c.cost < beta * best[0].cost:
                heapq.heappush(queue, (c.cost, next(tie), c))
            best.append(c)
            best.sort(key=lambda x: x.cost)
            del best[keep:]
    return best


def greedy(graph: Graph, rules: Sequence[AnyRule], cost: CostFn, *,
           budget: Budget | None = None) -> Candidate:
    """Apply the most cost-reducing rewrite until none reduces the cost (a baseline)."""
    budget = budget or Budget()
    cur = Candidate(cost(graph), graph)
    while not budget.spent():
        budget.used += 1
        options = [Candidate(cost(g), g, cur.applied + (a,)) for a, g in expand(cur.graph, rules)]
        nxt = min(options, key=lambda c: c.cost, default=None)
        if nxt is None or nxt.cost >= cur.cost:
            break
        cur = nxt
    return cur


# ---------------------------------------------------------------------------- pieces
def extract(graph: Graph, ops: set[int]) -> Graph:
    """The operators ``ops`` as a graph of their own: tensors they read from other operators
    or graph inputs become inputs (`external_inputs`, in order; weights stay weights, same
    ids); its outputs are their tensors read elsewhere or returned (`piece_outputs`)."""
    external = external_inputs(graph, ops)
    base = graph.next_id
    inputs = {r: base + k for k, r in enumerate(external)}
    nodes: list[Node] = [Node(base + k, "input", outputs=(graph.type_of(r),), name=f"in{k}")
                         for k, r in enumerate(external)]
    weights: dict[int, None] = {}
    for n in graph.nodes:
        if n.id in ops:
            for r in n.inputs:
                if r.node not in ops and r not in inputs:
                    weights.setdefault(r.node, None)
            nodes.append(n.replace(inputs=tuple(TensorRef(inputs[r], 0) if r in inputs else r
                                                for r in n.inputs)))
    sources = [graph[w] for w in weights]
    return Graph(sources + nodes, piece_outputs(graph, ops), graph.meta)


def piece_outputs(graph: Graph, ops: set[int]) -> list[TensorRef]:
    """Tensors of ``ops`` read outside them or returned by ``graph``, in a fixed order."""
    outs: dict[TensorRef, None] = {}
    returned = set(graph.outputs)
    for n in graph.nodes:
        if n.id in ops:
            for i in range(len(n.outputs)):
                r = TensorRef(n.id, i)
                if r in returned or any(u not in ops and r in graph[u].inputs
                                        for u in graph.users(n.id)):
                    outs[r] = None
    return list(outs)


def stitch(graph: Graph, ops: set[int], optimised: Graph, external: Sequence[TensorRef],
           outputs: Sequence[TensorRef]) -> tuple[Graph, dict[TensorRef, TensorRef]]:
    """``graph`` with the operators ``ops`` replaced by ``optimised`` (a graph `extract` made
    of them, rewritten): its k-th input is rewired to ``external[k]``, its k-th output replaces
    ``outputs[k]`` (both recorded when the piece was extracted: other stitches may reorder
    ``graph``). Returns the new graph and that replacement of tensors."""
    if len(external) != len(optimised.inputs) or len(outputs) != len(optimised.outputs):
        raise ValueError("the optimised piece does not read or compute what the piece does")
    stood_for = dict(zip(optimised.inputs, external, strict=True))
    fresh = itertools.count(max(graph.next_id, optimised.next_id))
    ids: dict[int, int] = {}
    for n in optimised.nodes:
        if n.kind == "input" or (n.is_source and n.id in graph and graph[n.id] is n):
            continue  # an input, or a weight the piece already read
        ids[n.id] = next(fresh)

    def ref(r: TensorRef) -> TensorRef:
        if r.node in stood_for:
            return stood_for[r.node]
        return TensorRef(ids[r.node], r.index) if r.node in ids else r

    added = [n.replace(id=ids[n.id], inputs=tuple(map(ref, n.inputs)))
             for n in optimised.nodes if n.id in ids]
    remap = {old: ref(new) for old, new in zip(outputs, optimised.outputs, strict=True)}
    out = graph.replace_subgraph(ops, added, remap).without_dead_nodes()
    return out, remap


def stitch_all(graph: Graph, pieces: Sequence[tuple[set[int], Graph, Sequence[TensorRef],
                                                   Sequence[TensorRef]]]) -> Graph:
    """`stitch` of several disjoint pieces at once, each ``(ops, optimised, external,
    outputs)`` as `stitch` takes them: one rewrite of the whole graph instead of one per piece
    (a piece may read another's output: the replacement is followed)."""
    fresh = itertools.count(max([graph.next_id] + [p[1].next_id for p in pieces]))
    removed: set[int] = set()
    added: list[Node] = []
    remap: dict[TensorRef, TensorRef] = {}
    for ops, optimised, external, outputs in pieces:
        if len(external) != len(optimised.inputs) or len(outputs) != len(optimised.outputs):
            raise ValueError("an optimised piece does not read or compute what the piece does")
        stood_for = dict(zip(optimised.inputs, external, strict=True))
        ids = {n.id: next(fresh) for n in optimised.nodes
               if not (n.kind == "input" or (n.is_source and n.id in graph and graph[n.id] is n))}

        def ref(r: TensorRef, stood_for: dict[int, TensorRef] = stood_for,
                ids: dict[int, int] = ids) -> TensorRef:
            if r.node in stood_for:
                return stood_for[r.node]
            return TensorRef(ids[r.node], r.index) if r.node in ids else r

        added += [n.replace(id=ids[n.id], inputs=tuple(map(ref, n.inputs)))
                  for n in optimised.nodes if n.id in ids]
        remap.update({old: ref(new) for old, new in zip(outputs, optimised.outputs,
                                                          strict=True)})
        removed |= ops

    def final(r: TensorRef) -> TensorRef:
        for _ in range(len(remap) + 1):
            if r.node not in removed:
                return r
            if r not in remap:
                raise GraphError(f"tensor {r} of a replaced piece is still read")
            r = remap[r]
        raise GraphError("the pieces' outputs replace each other in a cycle")

    remap = {k: final(v) for k, v in remap.items()}
    added = [n.replace(inputs=tuple(map(final, n.inputs)))
             if any(r.node in removed for r in n.inputs) else n for n in added]
    return graph.replace_subgraph(removed, added, remap).without_dead_nodes()


def external_inputs(graph: Graph, ops: set[int]) -> list[TensorRef]:
    """The tensors ``ops`` read from outside (weights excepted), in first-read order: what
    `extract` turns into inputs."""
    seen: dict[TensorRef, None] = {}
    for n in graph.nodes:
        if n.id in ops:
            for r in n.inputs:
                if r.node not in ops and graph[r.node].kind not in ("weight", "constant"):
                    seen.setdefault(r, None)
    return list(seen)


# ---------------------------------------------------------------------------- partition
@dataclass(frozen=True)
class Partition:
    """Minimal pieces (operator id sets, every edge from an earlier piece to a later one) and
    the candidate pieces: runs ``(i, j)`` of consecutive minimal pieces, at most ``size_u``
    operators in all."""

    pieces: tuple[frozenset[int], ...]
    runs: tuple[tuple[int, int], ...]
    capacity: dict[int, int]

    def ops(self, run: tuple[int, int]) -> set[int]:
        i, j = run
        return set().union(*self.pieces[i:j + 1])


def capacities(graph: Graph, rules: Sequence[AnyRule]) -> dict[int, int]:
    """AutoGraph's cap(v): how many rule matches map a node of the source pattern onto v."""
    cap = {n.id: 0 for n in graph.operators}
    index = kind_index(graph)
    for rule in rules:
        for m in find_matches(graph, rule, index):
            for i in m.nodes:
                if i in cap:
                    cap[i] += 1
    return cap


def min_vertex_cut(graph: Graph, ops: Sequence[int], cap: dict[int, int]) -> set[int]:
    """The prefix of ``ops`` (a topologically ordered, convex set) whose last layer is a
    minimum-capacity vertex cut between the first and the last quarter of ``ops``.

    Each operator v is an edge v_in -> v_out of capacity cap(v) + 1 (so fewer nodes break
    ties); data edges u_out -> v_in and back edges v_in -> u_out have infinite capacity, which
    makes the source side closed under producers: a prefix. Boykov-Kolmogorov finds the cut.
    Empty when no finite cut exists (an edge from the first quarter to the last).
    """
    inside = set(ops)
    n = len(ops)
    head, tail = set(ops[:max(1, n // 4)]), set(ops[n - max(1, n // 4):])
    g = nx.DiGraph()
    # "infinite": more than any cut of split edges can cost (a path of them means no cut)
    inf = float(sum(cap.get(v, 0) + 1 for v in ops) + 1)
    for v in ops:
        big = v in head or v in tail
        g.add_edge(("i", v), ("o", v), capacity=inf if big else cap.get(v, 0) + 1)
        for r in graph[v].inputs:
            if r.node in inside and r.node != v:
                g.add_edge(("o", r.node), ("i", v), capacity=inf)
                g.add_edge(("i", v), ("o", r.node), capacity=inf)
    for v in head:
        g.add_edge("s", ("i", v), capacity=inf)
    for v in tail:
        g.add_edge(("o", v), "t", capacity=inf)
    value, (reach, _) = nx.minimum_cut(g, "s", "t",
                                       flow_func=nx.algorithms.flow.boykov_kolmogorov)
    if value >= inf:
        return set()
    return {v for v in ops if ("i", v) in reach}


def partition(graph: Graph, rules: Sequence[AnyRule], *, size_l: int = SIZE_L,
              size_u: int = SIZE_U, cap: dict[int, int] | None = None) -> Partition:
    """Recursive min-cut bisection to pieces of at most ``size_l`` operators, then the runs
    of neighbouring pieces up to ``size_u`` (AutoGraph fig. 4)."""
    cap = capacities(graph, rules) if cap is None else cap
    order = [n.id for n in graph.operators]

    def split(ops: list[int]) -> list[list[int]]:
        if len(ops) <= size_l:
            return [ops]
        first = min_vertex_cut(graph, ops, cap)
        if not first or len(first) == len(ops):  # no cut: fall back to halves in order
            first = set(ops[:len(ops) // 2])
        a = [v for v in ops if v in first]
        b = [v for v in ops if v not in first]
        return split(a) + split(b)

    pieces = tuple(frozenset(p) for p in split(order)) if order else ()
    runs = []
    for i in range(len(pieces)):
        size = 0
        for j in range(i, len(pieces)):
            size += len(pieces[j])
            if j > i and size > size_u:
                break
            runs.append((i, j))
    return Partition(pieces, tuple(runs), cap)


# ---------------------------------------------------------------------------- DP
@dataclass
class DPResult:
    """The chosen runs (in order), each run's best candidate, and MCP of the whole."""

    runs: list[tuple[int, int]]
    best: dict[tuple[int, int], Candidate]
    cost: float
    states: int


def dp(part: Partition, piece_cost: Callable[[tuple[int, int]], float]) -> DPResult:
    """AutoGraph eq. 2 over the partition: MCP[remaining] = min over the runs p that begin
    the remaining pieces of MCP[remaining - p] + BSMCP[p], memoised by the remaining set."""
    n = len(part.pieces)
    memo: dict[frozenset[int], tuple[float, list[tuple[int, int]]]] = {frozenset(): (0.0, [])}
    starting: dict[int, list[tuple[int, int]]] = {}
    for run in part.runs:
        starting.setdefault(run[0], []).append(run)

    def mcp(remaining: frozenset[int]) -> tuple[float, list[tuple[int, int]]]:
        if remaining in memo:
            return memo[remaining]
        first = min(remaining)
        best: tuple[float, list[tuple[int, int]]] = (float("inf"), [])
        for run in starting.get(first, []):
            covered = frozenset(range(run[0], run[1] + 1))
            if not covered <= remaining:
                continue
            rest_cost, rest = mcp(remaining - covered)
            c = piece_cost(run) + rest_cost
            if c < best[0]:
                best = (c, [run] + rest)
        memo[remaining] = best
        return best

    cost, runs = mcp(frozenset(range(n)))
    return DPResult(runs, {}, cost, len(memo))


# ---------------------------------------------------------------------------- one call
# the search's budget everywhere (the CLI, `paragraph.build`, the passes): whole searches,
# candidate builds and timing included
BUDGET_S = 120.0


@dataclass(frozen=True)
class SearchOptions:
    """How to search, one set of defaults everywhere: the method; its cost and beta (unset: the
    method's paper's, TASO's sum cost and alpha 1.05 for "taso", AutoGraph's mixed cost and
    beta 1.1 otherwise); the whole search's ``budget`` in seconds (candidate builds and
    timing included); the on-board loop's ``top_k`` candidates built and timed a round and
    its ``rounds`` (AutoGraph alg. 1; ``top_k`` 0: no loop, the cheapest graph by the cost is
    kept unconfirmed, as TASO does); the partition sizes, expansions and the alternatives
    kept per piece. Bad values raise `ParagraphError`."""

    method: str = "autograph"
    cost: str = ""  # "": the method's paper's
    beta: float = 0.0  # 0: the method's paper's
    budget: float = BUDGET_S
    top_k: int = 20
    rounds: int = 4
    size_l: int = SIZE_L
    size_u: int = SIZE_U
    expansions: int = 2000
    keep: int = 3  # candidates kept per piece (alternatives for the on-board loop)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ParagraphError(f"unknown search {self.method!r}; choose from "
                                 f"{', '.join(METHODS)}")
        taso = self.method == "taso"
        # the method's defaults filled in: a value, not a promise to look them up later
        object.__setattr__(self, "cost", self.cost or ("sum" if taso else "mixed"))
        object.__setattr__(self, "beta", self.beta or (1.05 if taso else 1.1))
        if self.cost not in COSTS:
            raise ParagraphError(f"unknown cost {self.cost!r}; choose from {', '.join(COSTS)}")
        if self.beta < 1.0:
            raise ParagraphError(f"beta {self.beta} < 1: the search could not keep its best "
                                 "graph")
        if self.budget <= 0:
            raise ParagraphError(f"the search budget must be positive, got {self.budget}")
        if self.top_k < 0:
            raise ParagraphError(f"top_k must be at least 0, got {self.top_k}")

    @classmethod
    def of(cls, search: str | SearchOptions | None) -> SearchOptions | None:
        """``search`` as options: a method name (its defaults), options as they are, or None
        (and "none") for no search."""
        if search is None or search == "none":
            return None
        if isinstance(search, SearchOptions):
            return None if search.method == "none" else search
        return cls(method=search)


@dataclass(frozen=True)
class SearchResult:
    """The best graph by the search's cost and the candidates behind it (best first)."""

    graph: Graph
    cost_before: float
    cost_after: float
    applied: tuple[Applied, ...]
    candidates: tuple[Candidate, ...]
    stats: dict[str, float]


def search(graph: Graph, rules: Sequence[AnyRule], cost: CostFn,
           options: SearchOptions = SearchOptions(), *,
           progress: Log | None = None) -> SearchResult:
    """Optimise ``graph`` with the library ``rules`` under ``cost``: ``greedy`` (whole graph),
    ``taso`` (backtracking on each minimal piece in turn), ``autograph`` (backtracking on the
    candidate pieces, DP over partition sequences, alternatives kept for the on-board loop).
    Never returns a graph costlier than the input."""
    say = progress or (lambda _msg: None)
    start = time.perf_counter()
    before = cost(graph)
    budget = Budget(options.expansions, options.budget)
    stats: dict[str, float] = {}
    if options.method == "none" or not graph.operators:
        return SearchResult(graph, before, before, (), (Candidate(before, graph),), stats)
    if options.method == "greedy":
        best = greedy(graph, rules, cost, budget=budget)
        stats.update(expansions=budget.used, seconds=time.perf_counter() - start)
        return _result(graph, before, [best, Candidate(before, graph)], stats)
    part = partition(graph, rules, size_l=options.size_l, size_u=options.size_u)
    stats.update(pieces=len(part.pieces), runs=len(part.runs),
                 partition_seconds=time.perf_counter() - start)
    say(f"  partition: {len(part.pieces)} pieces of <= {options.size_l} operators, "
        f"{len(part.runs)} candidate pieces of <= {options.size_u}")
    runs = ([(i, i) for i in range(len(part.pieces))] if options.method == "taso"
            else list(part.runs))
    bar = Bar(progress, f"{options.method} search: pieces", len(runs))
    found: dict[tuple[int, int], list[Candidate]] = {}
    for k, run in enumerate(runs):
        ops = part.ops(run)
        sub = extract(graph, ops)
        # each piece gets an equal share of what is left
        left = len(runs) - k
        share = Budget(max(1, (budget.expansions - budget.used) // left),
                       max(0.0, budget.seconds - (time.perf_counter() - budget.start)) / left)
        found[run] = backtrack(sub, rules, cost, beta=options.beta, budget=share,
                               keep=options.keep)
        budget.used += share.used
        rewritten = sum(bool(found[r][0].applied) for r in found)
        bar.update(k + 1, f"{rewritten} pieces rewritten, {budget.used} expansions")
    if options.method == "taso":
        chosen = runs
    else:
        chosen = dp(Partition(part.pieces, tuple(runs), part.capacity),
                    lambda r: found[r][0].cost).runs
    whole = _assemble(graph, part, chosen, {r: found[r][0] for r in chosen})
    cands = [whole, Candidate(before, graph)]
    # alternatives: one piece at a time with its next-best result (for the on-board loop)
    for r in chosen:
        for alt in found[r][1:]:
            cands.append(_assemble(graph, part, chosen, {**{q: found[q][0] for q in chosen},
                                                        r: alt}))
    cands = [replace(c, cost=cost(c.graph)) for c in cands]
    stats.update(expansions=budget.used, seconds=time.perf_counter() - start)
    return _result(graph, before, cands, stats)


def _assemble(graph: Graph, part: Partition, runs: Sequence[tuple[int, int]],
              best: dict[tuple[int, int], Candidate]) -> Candidate:
    """Stitch each run's chosen graph into ``graph`` (runs are disjoint; each piece's inputs
    and outputs are those of ``graph``, followed through the earlier stitches). A result
    that does not validate keeps ``graph``."""
    todo = [Piece(frozenset(part.ops(r)), best[r]) for r in runs if best[r].applied]
    if not todo:
        return Candidate(0.0, graph)
    whole = with_pieces(graph, todo)
    if whole is not None:
        return whole
    # piece by piece, keeping whatever no longer fits as it was
    out = graph
    kept: list[Piece] = []
    renamed: dict[TensorRef, TensorRef] = {}
    for piece in todo:
        ops = set(piece.ops)
        external = [renamed.get(r, r) for r in external_inputs(graph, ops)]
        try:
            out, remap = stitch(out, ops, piece.result.graph, external,
                                piece_outputs(graph, ops))
        except (GraphError, ValueError):
            continue  # the piece no longer fits: keep it as it was
        renamed.update(remap)
        kept.append(piece)
    try:
        out.validate()
    except GraphError:
        return Candidate(0.0, graph)
    return Candidate(0.0, out, tuple(a for p in kept for a in p.result.applied), tuple(kept))


def with_pieces(graph: Graph, pieces: Sequence[Piece]) -> Candidate | None:
    """``graph`` with each of ``pieces`` (disjoint pieces of it) stitched in, all in one
    rewrite of the graph (one per piece costs pieces x graph); None where the result does not
    validate. A subset of a candidate's pieces is a candidate of its own: the on-board loop
    bisects a candidate that measured slower into them (`planner.onboard`)."""
    if not pieces:
        return Candidate(0.0, graph)
    try:
        out = stitch_all(graph, [(set(p.ops), p.result.graph,
                                  external_inputs(graph, set(p.ops)),
                                  piece_outputs(graph, set(p.ops))) for p in pieces])
        out.validate()
    except (GraphError, ValueError):
        return None
    return Candidate(0.0, out, tuple(a for p in pieces for a in p.result.applied),
                     tuple(pieces))


def _result(graph: Graph, before: float, cands: list[Candidate],
            stats: dict[str, float]) -> SearchResult:
    seen: set[str] = set()
    unique = []
    for c in sorted(cands, key=lambda c: c.cost):
        h = c.graph.structural_hash()
        if h not in seen:
            seen.add(h)
            unique.append(c)
    best = unique[0] if unique[0].cost <= before else Candidate(before, graph)
    return SearchResult(best.graph, before, best.cost, best.applied, tuple(unique), stats)
