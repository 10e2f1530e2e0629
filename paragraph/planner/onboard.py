"""The substitution search's on-board loop (AutoGraph, AAAI'23, alg. 1): search a graph with the
verified rule library under a parallelism-aware cost, build the cheapest candidates, plan and
time them on the device beside the best graph so far, and keep what measures faster.

`search_plan` is a short loop over the named steps of `_OnBoard`: `start` (the input's kernels
measured, the input built and planned), then per round `candidates` (searched from the best
graph, their new kernels measured, ranked again), `build_and_time` (built and timed in batches
that fit in memory, outputs checked against the best graph, so against the model) and
`confirm` (a gain timed again beside a second build of the best), `bisect` (where the round's
best candidate did not pay, the subsets of its rewritten pieces, by delta debugging), `keep`
or, where a round kept nothing, `pop` (the next round searches from the fastest measured
candidate not yet searched from: AutoGraph's queue of measured graphs), and `result`. With
``top_k`` 0 there is no loop (`cheapest`): the cheapest graph by the cost is kept unconfirmed,
as TASO and MetaFlow return theirs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from paragraph.errors import ParagraphError, reraise_interrupt
from paragraph.graph import Graph
from paragraph.machine import available_memory, release_memory
from paragraph.passes.cost import CostModel, Device, cost_function, kernels_of
from paragraph.passes.search import Applied, Candidate, SearchOptions, with_pieces
from paragraph.passes.search import search as substitution_search
from paragraph.planner.critical_path import plan_like
from paragraph.planner.plan import Plan, SearchReport
from paragraph.planner.schedules import plan_schedule
from paragraph.planner.session import Session
from paragraph.rules.library import default_library
from paragraph.rules.match import AnyRule
from paragraph.rules.rule import Rule, random_check
from paragraph.timing import MARGIN
from paragraph.tvm_interop.frontend.relax_graph import to_relax
from paragraph.tvm_interop.meter.signatures import SignatureMeter
from paragraph.tvm_interop.runtime.target import is_cpu

HELD_PER_WEIGHT_BYTE = 8  # bytes a built and bound candidate holds per byte of its weights
# a candidate dearer than the best graph by more than this, by the search's cost with its
# kernels measured, is not built: such costs missed by 8-13% (ResNeXt-50), not by 2x
MAX_OVERSHOOT = 1.25
UNCONFIRMED_MEASURED = 8  # top_k 0: candidates whose new kernels are measured before ranking


def search_plan(graph: Graph, session: Session, options: SearchOptions = SearchOptions(), *,
                schedule: str = "critical-path", kernels: str = "tvm", measure: bool = True,
                rules: Sequence[AnyRule] | None = None, start: Plan | None = None) -> Plan:
    """The substitution search with AutoGraph's on-board loop (module docstring): a measured
    improvement (faster than the best graph by `paragraph.timing.MARGIN`, and again in a
    second timing beside a second build of the best, by more than the two builds differ:
    `required_gain`) becomes the start of the next round; a round that keeps nothing is
    followed by one that searches from the fastest candidate measured faster than the best
    and not yet searched from (AutoGraph alg. 1's queue), until the queue is empty,
    ``options.rounds`` are done or ``options.budget`` is spent. The input graph is always a
    candidate, so the result is never slower than it as measured. ``start``, a plan of
    ``graph`` under ``schedule`` with these ``kernels`` built already, saves building the
    input again. Under ``critical-path`` each candidate is planned with the choices timed for
    the input (`plan_like`). The budget covers the whole loop: the search leaves ``top_k``
    candidate builds of it (at the mean build time seen so far) to the loop, and candidates
    are built while a build still fits (at least one per round), so the loop ends within
    about one build of the budget.

    The cost model prices each kernel of a candidate (`paragraph.passes.cost.kernels_of`) by
    its signature's seconds on one thread with this kernel source, measured once by the
    session's meter and cached (`SignatureMeter`): the input's kernels before the search, the
    new kernels of the ``2 * top_k`` cheapest candidates after each round. Kernels not
    measured (``measure`` False, or the budget spent) get the roofline estimate on the
    meter's peaks, scaled by the median measured/estimate ratio of their kind.

    ``rules`` are the rules to search with (default: the shipped library's, both ways); the
    returned plan's ``graph`` is the chosen operator graph. ``top_k`` 0 turns the on-board
    loop off (`_OnBoard.cheapest`): the result may run slower than the input."""
    loop = _OnBoard(graph, session, options, schedule, kernels, measure, rules)
    loop.start(start)
    if options.top_k == 0:
        loop.cheapest()
        return loop.result()
    for r in range(options.rounds):
        if loop.left() <= 0:
            break
        fresh = loop.candidates(r)
        if fresh is None:  # only dear ones: search again, their kernels' times known now
            continue
        winner = loop.build_and_time(r, fresh) if fresh else None
        ratio = None if winner is None else loop.confirm(r, winner)
        if winner is not None and ratio is None:
            # a good rewrite is not lost because a bad one came with it: the subsets of the
            # round's best candidate's pieces, timed in turn
            winner = loop.bisect(r, winner)
            ratio = None if winner is None else loop.confirm(r, winner)
        if winner is not None and ratio is not None:
            loop.keep(winner, ratio)
        elif not loop.pop(r):  # nothing kept: explore from the next measured graph, if any
            break
    return loop.result()


@dataclass(frozen=True)
class _Winner:
    """A round's best candidate as timed beside the best graph so far."""

    ratio: float  # its time over the best's
    plan: Plan
    candidate: Candidate
    seconds: float
    best_seconds: float


@dataclass(frozen=True)
class _Queued:
    """A measured candidate that ran faster than the best graph beside it, kept to search
    from (AutoGraph alg. 1's queue Q): its graph, every rewrite from the input, and its time
    relative to the input's (its ratio times the best's then)."""

    relative: float
    graph: Graph
    applied: tuple[Applied, ...]


class _OnBoard:
    """The state of one on-board loop and its steps (see `search_plan`)."""

    def __init__(self, graph: Graph, session: Session, options: SearchOptions, schedule: str,
                 kernels: str, measure: bool, rules: Sequence[AnyRule] | None) -> None:
        self.graph, self.session, self.options = graph, session, options
        self.schedule, self.kernels, self.measure = schedule, kernels, measure
        self.say = session.log
        self.began = time.perf_counter()
        self.deadline = time.monotonic() + options.budget
        self.rules = default_library().for_search() if rules is None else checked(rules)
        self.model = search_cost_model(session)
        self.cost = cost_function(self.model, options.cost)
        self.meter = signature_meter(session, kernels)
        self.like: Plan | None = None  # the input's plan: candidates take its timed choices
        self.build_times: list[float] = []
        self.build_failures: list[str] = []
        self.best_graph: Graph = graph
        self.best_applied: tuple[Applied, ...] = ()
        # the graph a round searches from: the best, or a measured graph popped from the
        # queue when a round kept nothing (AutoGraph alg. 1 explores every graph it queued)
        self.base_graph: Graph = graph
        self.base_applied: tuple[Applied, ...] = ()
        self.queue: list[_Queued] = []
        self.popped = 0
        # the input is timed beside the candidates (a lone first timing in a fresh process
        # runs slow), and alone only if no candidate comes
        self.first_s: float | None = None
        self.best_s: float | None = None
        self.built = 1
        self.bisected = 0  # candidates built from subsets of a round's best candidate
        self.seen = {graph.structural_hash()}
        self.cost_before = 0.0

    # ------------------------------------------------------------------------ steps
    def left(self) -> float:
        """Seconds of the budget left."""
        return self.options.budget - (time.perf_counter() - self.began)

    def learn(self, g: Graph) -> None:
        """The kernels of ``g`` not priced yet measured (or estimated) into the cost model."""
        new = [k for k in kernels_of(g) if k.signature not in self.model.measured]
        self.model.learn(self.meter.seconds(g, new, measure=self.measure,
                                            deadline=self.deadline, progress=self.say),
                         self.meter.wide)

    def build(self, g: Graph, applied: Sequence[str]) -> Plan:
        """``g`` built and planned as the input was (`plan_like` under critical-path)."""
        if self.schedule == "critical-path" and self.like is not None:
            return plan_like(self.like, g, self.session, kernels=self.kernels,
                             rewrites=applied)
        program = self.session.build(to_relax(g), self.kernels, tuple(applied))
        return plan_schedule(self.schedule, program, self.session)

    def start(self, start: Plan | None) -> None:
        """The input's kernels measured, and the input built and planned (or ``start``)."""
        self.learn(self.graph)
        meter, model = self.meter, self.model
        self.say(f"  cost model: {len(model.measured)} kernel signatures measured (1"
                 f"{f' and {meter.threads}' if meter.threads > 1 else ''} thread, "
                 f"{meter.measured} new), the rest estimated"
                 f"{' and scaled by kind' if model.measured else ''}")
        # seconds to build and plan one candidate: the input's at first, then the mean of the
        # candidates' own (planning a candidate also times it end to end, once per schedule
        # choice, which the input may have found cached)
        if start is None:
            t_build = time.perf_counter()
            self.best = self.build(self.graph, ())
            self.build_s = time.perf_counter() - t_build
        else:
            check_start(start, self.schedule, self.kernels)
            self.best, self.build_s = start, start.program.build_seconds
        self.like = self.best
        self.cost_before = self.cost(self.graph)
        self.say(f"  input: cost {self.cost_before * 1e3:.3f} ms ({self.options.cost})")

    def candidates(self, r: int) -> list[Candidate] | None:
        """Round ``r``'s new candidates, searched from the best graph inside the budget (less
        what building and timing ``top_k`` of them will take, at least a quarter), their new
        kernels measured, ranked again and filtered where far dearer than the best graph
        (`worth_building`); None where only dear ones came."""
        left, top_k = self.left(), self.options.top_k
        reserve = top_k * self.build_s * 1.2
        result = substitution_search(self.base_graph, self.rules, self.cost,
                                     replace(self.options, budget=max(left - reserve, left / 4)),
                                     progress=self.say)
        fresh = [c for c in result.candidates
                 if c.graph.structural_hash() not in self.seen][:2 * top_k]
        for c in fresh:  # their new kernels measured, then ranked again
            self.learn(c.graph)
        # ranked again with their kernels measured, and filtered only where far dearer than
        # the best graph: on ResNeXt-50 every greedy candidate cost more than the input once
        # measured (1-thread kernel sums) and still ran 8-13% faster end to end, round after
        # round; on NASNet-A mobile every candidate of a round regrouped depthwise
        # convolutions (priced by the estimate while searched), cost 2x the input once
        # measured and ran 1.9x slower
        base = self.cost(self.best_graph)
        fresh, dear = worth_building(fresh, self.cost, base, top_k)
        self.seen.update(c.graph.structural_hash() for c in dear)
        if dear:
            self.say(f"  round {r + 1}: {len(dear)} candidates cost over {MAX_OVERSHOOT:.2f}x "
                     f"the best graph's once their kernels were measured (up to "
                     f"{self.cost(dear[-1].graph) / base:.2f}x): not built")
        if not fresh:
            if dear:
                return None
            self.say(f"  round {r + 1}: no new candidate")
        return fresh

    def build_and_time(self, r: int, fresh: list[Candidate]) -> _Winner | None:
        """Build ``fresh`` while a build fits the budget (at least one), in batches that fit
        in memory, each batch timed beside the best so far with outputs checked; the round's
        fastest relative to the best (None if none was built)."""
        # each built candidate holds its weights several times over (constants, executor
        # buffers, packed vendor copies), and eight of BERT's at once (1.8 GB each) exhausted
        # a 24 GB machine
        batch = candidates_in_memory(self.graph)
        winner: _Winner | None = None
        plans: list[tuple[Plan, Candidate]] = []
        timed = 0
        for k, c in enumerate(fresh):
            spent = bool(plans or timed) and self.left() < self.build_s  # time what is built
            if spent:
                self.say(f"  round {r + 1}: budget spent after {timed + len(plans)} of "
                         f"{len(fresh)} candidates")
            else:
                self.seen.add(c.graph.structural_hash())
                t_build = time.perf_counter()
                try:
                    plans.append((self.build(c.graph, [a.rule for a in (*self.base_applied,
                                                                        *c.applied)]), c))
                except (ParagraphError, RuntimeError) as e:
                    reraise_interrupt(e)
                    # a candidate TVM cannot build is a bug to report, not a reason to lose
                    # the search: the input (and the other candidates) still stand
                    self.build_failures.append(f"{type(e).__name__}: {e}")
                    self.say(f"  round {r + 1}: a candidate could not be built and is "
                             f"skipped ({self.build_failures[-1]})")
                self.build_times.append(time.perf_counter() - t_build)
                self.build_s = sum(self.build_times) / len(self.build_times)
            if plans and (spent or len(plans) >= batch or k + 1 == len(fresh)):
                times = self.session.meter.runs(
                    [(self.best.program, self.best.schedule)]
                    + [(p.program, p.schedule) for p, _ in plans], check=True)
                if self.first_s is None:
                    self.first_s = times[0]
                for (p, cand), t in zip(plans, times[1:], strict=True):
                    if winner is None or t / times[0] < winner.ratio:
                        winner = _Winner(t / times[0], p, cand, t, times[0])
                    if t / times[0] < 1.0 - MARGIN:  # faster than the best: worth exploring
                        self.queue.append(_Queued(t / times[0] * self.best_relative(),
                                                  cand.graph, (*self.base_applied,
                                                               *cand.applied)))
                timed += len(plans)
                plans = []  # only the winner's program stays built
                release_memory()
            if spent:
                break
        self.built += timed
        if winner is not None:
            self.say(f"  round {r + 1}: {timed} candidates built"
                     f"{f' (batches of {batch})' if batch < timed else ''}, best "
                     f"{winner.seconds * 1e3:.3f} ms against {winner.best_seconds * 1e3:.3f} ms")
            if self.best_s is None:  # the input's time where it was first timed, until a
                self.best_s = self.first_s  # candidate is kept (another batch's differs)
        return winner

    def confirm(self, r: int, winner: _Winner) -> float | None:
        """Whether ``winner`` beats the best by `MARGIN` and, timed afresh (uncached) beside
        the best and a second build of it, beats both by more than they differ
        (`required_gain`): its time over the faster of the two builds of the best in that
        timing where it does, None where not. On Inception-v3 three searches kept rewrites
        measured 2-9% faster in one timing that ran 1-7% slower than the input side by side
        afterwards."""
        if winner.ratio >= 1.0 - MARGIN:
            return None
        twin = self.build(self.best_graph, [a.rule for a in self.best_applied])
        self.built += 1
        again = self.session.meter.runs([(self.best.program, self.best.schedule),
                                         (twin.program, twin.schedule),
                                         (winner.plan.program, winner.plan.schedule)],
                                        fresh=True)
        del twin
        release_memory()
        need = required_gain(again[0], again[1])
        if again[2] >= min(again[:2]) * (1.0 - need):
            self.say(f"  round {r + 1}: not confirmed: {again[2] * 1e3:.3f} ms against "
                     f"{again[0] * 1e3:.3f} and {again[1] * 1e3:.3f} ms (two builds of the "
                     f"best) timed again; a gain of {need:.1%} needed")
            return None
        self.say(f"  round {r + 1}: confirmed: {again[2] * 1e3:.3f} ms against "
                 f"{again[0] * 1e3:.3f} and {again[1] * 1e3:.3f} ms (two builds of the best)")
        return again[2] / min(again[:2])

    def bisect(self, r: int, winner: _Winner) -> _Winner | None:
        """Where ``winner`` (the round's best candidate, several rewritten pieces) did not pay,
        subsets of its pieces stitched into the best graph (`with_pieces`), built and timed
        beside it as delta debugging does (Zeller's ddmin, for a faster subset): its halves,
        then quarters and their complements, and so on, until a subset measures faster by
        `MARGIN` (returned, still to be confirmed), the pieces are single, or the budget is
        spent (None). On Inception-v3 the one rewrite that paid (``pool-after-conv1x1``,
        1-2%) came in candidates with merges that measured slower, and was lost with them."""
        pieces = winner.candidate.pieces
        n = 2
        while len(pieces) >= 2 and self.left() > self.build_s:
            chunks = [pieces[len(pieces) * i // n:len(pieces) * (i + 1) // n] for i in range(n)]
            subsets = chunks + ([tuple(p for c in chunks if c is not chunk for p in c)
                                 for chunk in chunks] if n > 2 else [])
            fresh: list[Candidate] = []
            for subset in subsets:
                c = with_pieces(self.base_graph, subset)
                if c is not None and c.graph.structural_hash() not in self.seen:
                    fresh.append(c)
            self.say(f"  round {r + 1}: bisecting {len(pieces)} rewritten pieces into {n}: "
                     f"{len(fresh)} new subsets")
            found = self.build_and_time(r, fresh) if fresh else None
            self.bisected += len(fresh)
            if found is not None and found.ratio < 1.0 - MARGIN:
                return found
            if n >= len(pieces):
                break
            n = min(len(pieces), 2 * n)
        return None

    def keep(self, winner: _Winner, ratio: float) -> None:
        """``winner`` becomes the best graph, the start of the next round; the best's time
        is scaled by ``ratio``, the winner's over the best's as confirmed side by side. Not
        ``winner.seconds``: that was timed in a batch of its own (batches of a few where
        memory is short), beside the best at another time than the input's first timing, and
        on a CI host 9% slower than that first timing while 2% faster than its batch's."""
        assert self.best_s is not None
        self.best, self.best_s = winner.plan, self.best_s * ratio
        self.best_graph = self.base_graph = winner.candidate.graph
        self.best_applied = self.base_applied = (*self.base_applied, *winner.candidate.applied)
        kept = self.best_graph.structural_hash()
        self.queue = [q for q in self.queue if q.graph.structural_hash() != kept]

    def best_relative(self) -> float:
        """The best graph's time over the input's, as measured so far."""
        return 1.0 if self.first_s is None or self.best_s is None else self.best_s / self.first_s

    def pop(self, r: int) -> bool:
        """Where a round kept nothing: the fastest measured candidate not yet searched from
        becomes the graph the next round searches from (AutoGraph alg. 1 pops its queue of
        measured graphs in order of latency and explores each; the best graph stays the best
        unless a candidate beats it, confirmed). False where the queue is empty."""
        if not self.queue:
            return False
        self.queue.sort(key=lambda q: q.relative)
        q = self.queue.pop(0)
        self.base_graph, self.base_applied = q.graph, q.applied
        self.popped += 1
        self.say(f"  round {r + 1}: nothing kept; the next round searches from a measured "
                 f"candidate ({len(q.applied)} rewrites, {q.relative:.3f}x the input's time "
                 f"where timed), {len(self.queue)} more queued")
        return True

    def cheapest(self) -> None:
        """No on-board loop (``top_k`` 0), as TASO and MetaFlow work: one search, the
        `UNCONFIRMED_MEASURED` cheapest candidates' new kernels measured, and the cheapest of
        them by the cost built, whatever it measures. Its outputs are checked against the
        input's and both are timed once, for the report only."""
        left = self.left()
        result = substitution_search(self.graph, self.rules, self.cost,
                                     replace(self.options,
                                             budget=max(left - 1.2 * self.build_s, left / 4)),
                                     progress=self.say)
        ranked = list(result.candidates[:UNCONFIRMED_MEASURED])
        for c in ranked:
            self.learn(c.graph)
        chosen = min(ranked, key=lambda c: self.cost(c.graph))
        # never costlier than the input by the cost, as TASO's result (the input itself, or
        # ranked out of the measured few by its estimate)
        if self.cost(chosen.graph) >= self.cost(self.graph):
            self.say("  no on-board loop: the input is the cheapest graph by the cost")
            self.first_s = self.best_s = self.session.meter.runs(
                [(self.best.program, self.best.schedule)])[0]
            return
        plan = self.build(chosen.graph, [a.rule for a in chosen.applied])
        self.first_s, self.best_s = self.session.meter.runs(
            [(self.best.program, self.best.schedule), (plan.program, plan.schedule)],
            check=True)
        self.say(f"  no on-board loop: the cheapest graph by the cost ({len(chosen.applied)} "
                 f"rewrites) kept unconfirmed: {self.best_s * 1e3:.3f} ms against the input's "
                 f"{self.first_s * 1e3:.3f} ms")
        self.best, self.best_graph, self.best_applied = plan, chosen.graph, chosen.applied
        self.built = 2

    def result(self) -> Plan:
        """The best plan, its graph, and the search's report."""
        if self.first_s is None or self.best_s is None:
            self.first_s = self.best_s = self.session.meter.runs(
                [(self.best.program, self.best.schedule)])[0]
        if self.meter.failed:
            self.say(f"  cost model: {len(self.meter.failed)} kernels could not be measured "
                     f"alone and were estimated (first: {next(iter(self.meter.failed.values()))})")
        options = self.options
        report = SearchReport(
            method=options.method, cost=options.cost, beta=options.beta,
            applied=tuple(str(a) for a in self.best_applied),
            rules=tuple(a.rule for a in self.best_applied),
            cost_before_ms=self.cost_before * 1e3,
            cost_after_ms=self.cost(self.best_graph) * 1e3,
            measured_before_ms=self.first_s * 1e3, measured_after_ms=self.best_s * 1e3,
            speedup=self.first_s / self.best_s if self.best_s > 0 else 1.0,
            candidates_built=self.built, subsets_built=self.bisected,
            searched_from_queue=self.popped,
            build_failures=tuple(self.build_failures),
            kernels_priced_by_measurement=len(self.model.measured),
            kernels_measured_now=self.meter.measured,
            seconds=time.perf_counter() - self.began)
        return Plan(self.best.program, self.best.schedule,
                    replace(self.best.report, search=report), graph=self.best_graph)


# ---------------------------------------------------------------------------- the pieces
def checked(rules: Sequence[AnyRule]) -> list[AnyRule]:
    """``rules``, each a verified one: a pattern rule outside the shipped library must carry a
    z3 proof (``proof["status"] == "verified"``, from `paragraph.rules.prove_rule`) and pass
    the numeric check on shapes drawn to break equalities (`random_check`), since a rule
    wrong for some shapes would be a wrong answer."""
    shipped = set(default_library().for_search())
    out = []
    for r in rules:
        if isinstance(r, Rule) and r not in shipped:
            status = (r.proof or {}).get("status")
            if status != "verified":
                raise ParagraphError(f"rule {r.id!r} is not verified (proof status {status!r}): "
                                     "prove it with paragraph.rules.prove_rule and attach the "
                                     "proof (dataclasses.replace(rule, proof=proof.to_json()))")
            try:
                random_check(r)
            except AssertionError as e:
                raise ParagraphError(f"rule {r.id!r} is refuted numerically: {e}") from None
        out.append(r)
    return out


def required_gain(best_s: float, twin_s: float) -> float:
    """The fraction by which a candidate must run faster than the best graph so far, given
    one timing of the best (``best_s``) and of a second build of the same graph beside it
    (``twin_s``): `MARGIN`, or how far the two builds differ if that is more. On this 2-core
    host two builds of one graph timed in one run differed by up to 7% (whether from the build
    or from bursts of other work on the host is not known), more than `MARGIN` alone
    refuses."""
    return max(MARGIN, abs(best_s - twin_s) / max(best_s, twin_s))


def check_start(start: Plan, schedule: str, kernels: str) -> None:
    """`ParagraphError` unless ``start`` can stand for the search's input plan: built with
    the ``kernels`` source and planned with the ``schedule`` the search plans candidates with
    (its graph is the caller's word)."""
    if start.program.kernel_source != kernels:
        raise ParagraphError(f"search_plan: the start plan's kernels are "
                             f"{start.program.kernel_source!r}, the search's {kernels!r}")
    name = start.schedule.name.split("/")[0]  # wavefront/2: packed on two streams
    if name != schedule and not (schedule == "ios" and name.startswith("ios-")):
        raise ParagraphError(f"search_plan: the start plan's schedule is "
                             f"{start.schedule.name!r}, the search's {schedule!r}")


def candidates_in_memory(graph: Graph, share: float = 0.5) -> int:
    """How many built candidates of ``graph`` the on-board loop may hold at once: ``share``
    of the memory available now over what one holds (`HELD_PER_WEIGHT_BYTE` times the bytes
    of its weights: BERT's 0.4 GB of weights held 1.8-3 GB per candidate), at least one."""
    weights = sum(n.type.nbytes for n in graph.nodes if n.kind in ("weight", "constant"))
    free = available_memory()
    if free is None or weights == 0:
        return 1 << 30
    return max(1, int(share * free / (HELD_PER_WEIGHT_BYTE * weights)))


def worth_building(candidates: Sequence[Candidate], cost: Callable[[Graph], float],
                   base: float, top_k: int) -> tuple[list[Candidate], list[Candidate]]:
    """The ``top_k`` cheapest of ``candidates`` by ``cost`` among those within
    `MAX_OVERSHOOT` of ``base`` (the best graph's cost), and those beyond it (dearest last),
    which are not worth a build."""
    priced = sorted(((cost(c.graph), i) for i, c in enumerate(candidates)))
    ranked = [candidates[i] for _, i in priced]
    cheap = sum(1 for c, _ in priced if c <= MAX_OVERSHOOT * base)
    return ranked[:cheap][:top_k], ranked[cheap:]


def signature_meter(session: Session, kernels: str) -> SignatureMeter:
    """The search's kernel meter: on a CPU each kernel is timed on one thread and on every
    core (the costs price both); a GPU kernel has the device either way."""
    threads = session.cores if is_cpu(session.target) else 1
    return SignatureMeter(session.target, kernels, session.meter, session.tuning_db,
                          threads=threads)


def search_cost_model(session: Session) -> CostModel:
    """The cost model a search starts from on ``session``'s device: its peak rates (for the
    estimates of kernels not measured), its cores as streams and, on a CPU, the meter's
    measured hand-off between two worker threads (what the executor pays when a kernel waits
    on another stream's, and the ``simulated`` cost charges; the critical-path planner
    charges the same), no kernel measured yet (`CostModel.learn` adds them)."""
    peaks = session.meter.peaks(session.target)
    handoff = session.meter.handoff(session.target) if is_cpu(session.target) else 0.0
    return CostModel(Device(peaks.flops, peaks.bandwidth, peaks.launch, streams=session.cores,
                            handoff=handoff))


def measure_signatures(graph: Graph, session: Session, *, kernels: str = "tvm") -> int:
    """Measure and cache every kernel signature of ``graph`` that `search_plan` would price
    it by (its first step, inside its budget), and return how many were new: a search that
    follows starts with its input's kernels known, as on a machine whose cost database has
    seen the model (the search benchmark warms each model once this way, so no
    configuration's budget goes on measuring what every configuration shares)."""
    meter = signature_meter(session, kernels)
    meter.seconds(graph, kernels_of(graph), progress=session.log)
    return meter.measured


__all__ = ["search_plan", "measure_signatures", "search_cost_model", "signature_meter",
           "required_gain", "worth_building", "candidates_in_memory", "checked",
           "MAX_OVERSHOOT"]
