"""The planner's result: a `Plan` (a program, the schedule it runs under, and the operator graph
a substitution search chose) and its typed report (`PlanReport`): what was measured and
decided, one part per decision. ``PlanReport.to_json`` is its JSON form (artifacts, the CLI's
``--json``, benchmarks)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from paragraph.graph import Graph
from paragraph.passes.ios import SearchStats
from paragraph.schedule import Schedule
from paragraph.tvm_interop.runtime.program import KernelProgram
from paragraph.tvm_interop.runtime.reference import Comparison


@dataclass(frozen=True)
class StreamsChoice:
    """Several one-thread streams against one stream of every core, timed end to end, or
    (``timed`` false) predicted from the measured kernel times where the prediction left no
    doubt (`critical_path.one_stream_if_faster`)."""

    streams_ms: float
    one_stream_ms: float
    capped: int  # kernels of the one stream capped to one thread
    one_stream: bool  # what was kept
    timed: bool = True


@dataclass(frozen=True)
class RewriteChoice:
    """A program rewritten by library rules against the program as it was, timed end to end:
    ``rules`` are the rewrites kept (none when the program stayed as it was); the times are
    None where the choice was taken from another plan, not timed (`plan_like`)."""

    rules: tuple[str, ...]
    before_ms: float | None = None
    after_ms: float | None = None


@dataclass(frozen=True)
class CriticalPathReport:
    """critical-path's plan: the list schedule over measured kernel times (ms), the optimum no
    schedule on these streams can beat with these times, and the choices timed end to end."""

    predicted_ms: float
    critical_path_ms: float
    work_ms: float
    handoff_us: float
    optimum_ms: float
    optimum_exact: bool
    streams: StreamsChoice | None = None  # several streams or one (a CPU with two cores+)
    pools: RewriteChoice | None = None  # average pools moved after their 1 x 1 convolutions
    split: RewriteChoice | None = None  # lone convolutions split across the streams
    planned_like: bool = False  # the choices were taken from another plan (`plan_like`)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "predicted_ms": self.predicted_ms, "critical_path_ms": self.critical_path_ms,
            "work_ms": self.work_ms, "handoff_us": self.handoff_us,
            "optimum_ms": self.optimum_ms, "optimum_exact": self.optimum_exact}
        if self.streams is not None:
            out.update(streams_ms=self.streams.streams_ms,
                       one_stream_ms=self.streams.one_stream_ms,
                       one_stream_kernels_on_fewer_threads=self.streams.capped,
                       streams_timed=self.streams.timed)
        for name, choice, before, after in (("pools", self.pools, "unmoved_ms", "moved_ms"),
                                            ("split", self.split, "unsplit_ms", "split_ms")):
            if choice is not None:
                out[name] = list(choice.rules)
                if choice.before_ms is not None:
                    out.update({before: choice.before_ms, after: choice.after_ms})
        if self.planned_like:
            out["planned_like"] = "reference"
        return out


@dataclass(frozen=True)
class IOSConfirmation:
    """The IOS schedule against all kernels in sequence, timed end to end (ms)."""

    ios_ms: float
    sequential_ms: float
    sequential_1thread_ms: float
    kept: str


@dataclass(frozen=True)
class IOSReport:
    """IOS's plan: the DP's predicted time, its stages (kernel ids, strategy, seconds), the
    search's statistics, and the end-to-end confirmation."""

    predicted_ms: float
    stages: tuple[tuple[Any, str, float], ...]
    stats: SearchStats
    confirmed: IOSConfirmation | None = None

    @property
    def summary(self) -> str:
        return self.stats.summary()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"predicted_ms": self.predicted_ms,
                               "stages": [list(s) for s in self.stages],
                               "search": self.summary, "stats": asdict(self.stats)}
        if self.confirmed is not None:
            out["confirmed"] = asdict(self.confirmed)
        return out


@dataclass(frozen=True)
class SearchReport:
    """The substitution search with its on-board loop: the rewrites kept, the graph's cost and
    measured time before and after, and what it took."""

    method: str
    cost: str
    beta: float
    applied: tuple[str, ...]  # each rewrite, where it applied
    rules: tuple[str, ...]  # the rule id of each
    cost_before_ms: float
    cost_after_ms: float
    measured_before_ms: float  # the input, as first timed beside candidates
    # the input's time scaled by each kept rewrite's confirmed ratio (timed side by side)
    measured_after_ms: float
    speedup: float
    candidates_built: int  # all of them, the subsets bisected included
    subsets_built: int  # candidates built from subsets of a round's best one's pieces
    # rounds that searched from a measured candidate other than the best (AutoGraph's queue)
    searched_from_queue: int
    build_failures: tuple[str, ...]
    kernels_priced_by_measurement: int
    kernels_measured_now: int
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


@dataclass(frozen=True)
class PlanReport:
    """What the planner measured and decided, one part per decision (None where it did not
    decide that); ``attached`` when the schedule came with the module, planned before."""

    critical_path: CriticalPathReport | None = None
    ios: IOSReport | None = None
    search: SearchReport | None = None
    attached: str | None = None  # the attached schedule's name
    check: Comparison | None = None  # the outputs against an independent reference
    dropped: tuple[str, ...] = ()  # rewrites dropped because their outputs differed

    def to_json(self) -> dict[str, Any]:
        """The report as JSON values: each part's fields at the top level, the search's under
        ``search`` (IOS's summary line is ``search`` where no substitution search ran)."""
        out: dict[str, Any] = {}
        if self.attached is not None:
            out["schedule"] = self.attached
        if self.critical_path is not None:
            out.update(self.critical_path.to_json())
        if self.ios is not None:
            out.update(self.ios.to_json())
        if self.search is not None:
            out["search"] = self.search.to_json()
        if self.check is not None:
            out["check"] = self.check.to_json()
        if self.dropped:
            out["dropped_rewrites"] = list(self.dropped)
        return out


@dataclass(frozen=True)
class Plan:
    """A program, the schedule it runs under, what the planner measured and decided
    (``report``), and for a substitution search the operator graph it chose (``graph``)."""

    program: KernelProgram
    schedule: Schedule
    report: PlanReport = field(default_factory=PlanReport)
    graph: Graph | None = None
