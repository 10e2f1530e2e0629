"""The `Schedule` data type: which stream runs each kernel, in what order, and what it waits for.

A schedule is data, kept next to the graph IR so that the executor can consume one without
importing the algorithms that produce one (`paragraph.passes.schedule`). Per stream it holds an
ordered kernel list and (on a CPU) the thread count of that stream's kernels; cross-stream
dependencies become explicit waits (one event per producer on a GPU); optional stage barriers
express IOS-style schedules (every kernel of stage i finishes before any of stage i+1 starts).
The happens-before partial order it induces is what makes a concurrent memory plan safe.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from paragraph.dag import CycleError, toposort
from paragraph.errors import ParagraphError
from paragraph.graph import Graph

FORMAT = "paragraph-schedule"
VERSION = 1


class ScheduleError(ParagraphError):
    """A schedule does not fit its graph (missing kernel, broken dependency, deadlock, bad file)."""


def kernel_ids(graph: Graph) -> list[int]:
    """The ids of the nodes a schedule must place: every node that is not an input, weight or
    constant, in topological order (views included: they cost nothing but order matters)."""
    return [n.id for n in graph.nodes if not n.is_source]


def producers(graph: Graph, node_id: int) -> list[int]:
    """Ids of the schedulable nodes that ``node_id`` reads (sources excluded), deduplicated."""
    return list(dict.fromkeys(r.node for r in graph[node_id].inputs
                              if not graph[r.node].is_source))


def bytes_moved(graph: Graph, k: int) -> int:
    """Bytes kernel ``k`` reads (every input once) and writes (every output once)."""
    node = graph[k]
    return (sum(graph.type_of(r).nbytes for r in node.inputs)
            + sum(t.nbytes for t in node.outputs))


@dataclass(frozen=True)
class Schedule:
    """Streams of kernels with their launch order, waits, thread counts and optional stages.

    Build one with `Schedule.build`, which derives the minimal cross-stream waits from the
    graph's data dependencies; ``validate`` checks it against a graph. A value: ``waits`` and
    ``info`` are read-only mappings (derive a new schedule with `dataclasses.replace`).
    """

    streams: tuple[tuple[int, ...], ...]
    threads: tuple[int, ...]
    waits: Mapping[int, tuple[int, ...]]
    stages: tuple[tuple[int, ...], ...] | None = None
    launch_order: tuple[int, ...] = ()
    name: str = ""
    graph_hash: str = ""
    info: Mapping[str, Any] = field(default_factory=dict)
    # kernels that run on fewer threads than their stream has (measured faster so: a small
    # kernel's second thread costs a wake-up longer than the work it takes over)
    kernel_threads: Mapping[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("waits", "info", "kernel_threads"):
            value = getattr(self, name)
            if not isinstance(value, MappingProxyType):
                object.__setattr__(self, name, MappingProxyType(dict(value)))

    # -- construction
    @classmethod
    def build(cls, graph: Graph, streams: Sequence[Sequence[int]], *,
              threads: Sequence[int] | int = 1, stages: Sequence[Sequence[int]] | None = None,
              launch_order: Sequence[int] | None = None, name: str = "",
              info: Mapping[str, Any] | None = None) -> Schedule:
        """A validated schedule with minimal waits for ``graph``.

        A kernel waits for a producer on another stream unless an earlier kernel of its own
        stream already waited for that producer or a later kernel of the producer's stream,
        or (with stages) the producer lies in an earlier stage, whose barrier covers it.
        ``launch_order`` (the global issue order, e.g. Opara's) defaults to a topological
        interleaving of the streams.
        """
        lists = tuple(tuple(s) for s in streams if len(s))
        if isinstance(threads, int):
            threads = (threads,) * len(lists)
        stream_of = {k: s for s, ks in enumerate(lists) for k in ks}
        pos = {k: i for ks in lists for i, k in enumerate(ks)}
        stage_of = ({k: i for i, st in enumerate(stages) for k in st} if stages else {})
        waits: dict[int, tuple[int, ...]] = {}
        for s, ks in enumerate(lists):
            synced = [-1] * len(lists)  # latest position of each stream already waited for
            for k in ks:
                latest: dict[int, int] = {}  # stream -> its latest producer of k
                for p in producers(graph, k) if k in graph else ():
                    t = stream_of.get(p)
                    if t is None or t == s or (stage_of and stage_of.get(p, -1)
                                               < stage_of.get(k, -1)):
                        continue
                    if pos[p] > synced[t] and (t not in latest or pos[p] > pos[latest[t]]):
                        latest[t] = p
                for t, p in latest.items():
                    synced[t] = pos[p]
                if latest:
                    waits[k] = tuple(latest[t] for t in sorted(latest))
        sched = cls(streams=lists, threads=tuple(int(t) for t in threads), waits=waits,
                    stages=None if stages is None else tuple(tuple(st) for st in stages),
                    launch_order=tuple(launch_order) if launch_order else (),
                    name=name, graph_hash=graph.structural_hash(), info=dict(info or {}))
        if not sched.launch_order:
            sched = sched._with_default_launch_order(graph)
        sched.validate(graph)
        return sched

    def _with_default_launch_order(self, graph: Graph) -> Schedule:
        order = _topological(self._edges(), self.kernels)
        return replace(self, launch_order=tuple(order))

    # -- views
    @property
    def kernels(self) -> list[int]:
        """Every scheduled kernel, stream by stream."""
        return [k for ks in self.streams for k in ks]

    @property
    def stream_of(self) -> dict[int, int]:
        return {k: s for s, ks in enumerate(self.streams) for k in ks}

    @property
    def num_streams(self) -> int:
        return len(self.streams)

    def _edges(self) -> dict[int, set[int]]:
        """Completion-before-start edges: stream order, waits and stage barriers."""
        preds: dict[int, set[int]] = {k: set() for k in self.kernels}
        for ks in self.streams:
            for a, b in zip(ks, ks[1:], strict=False):  # consecutive pairs
                preds[b].add(a)
        for k, ps in self.waits.items():
            preds[k].update(ps)
        if self.stages:
            for prev, nxt in zip(self.stages, self.stages[1:], strict=False):  # pairs
                for k in nxt:
                    preds[k].update(prev)
        return preds

    def happens_before(self) -> dict[int, int]:
        """For each kernel, a bitmask (over `kernels` positions) of the kernels that are sure
        to finish before it starts, under this schedule's streams, waits and barriers."""
        index = {k: i for i, k in enumerate(self.kernels)}
        preds = self._edges()
        before: dict[int, int] = {}
        for k in _topological(preds, self.kernels):
            mask = 0
            for p in preds[k]:
                mask |= before[p] | (1 << index[p])
            before[k] = mask
        return before

    # -- checks
    def validate(self, graph: Graph) -> None:
        """Raise `ScheduleError` unless every kernel of ``graph`` is placed once, the thread
        counts fit, every data dependency is ordered by the schedule, and nothing deadlocks."""
        expected = set(kernel_ids(graph))
        placed = self.kernels
        if len(placed) != len(set(placed)):
            raise ScheduleError(f"schedule {self.name!r} places a kernel twice")
        if set(placed) != expected:
            missing, extra = sorted(expected - set(placed)), sorted(set(placed) - expected)
            raise ScheduleError(f"schedule {self.name!r} does not fit the graph: "
                                f"missing {missing[:8]}, unknown {extra[:8]}")
        if len(self.threads) != len(self.streams) or any(t < 1 for t in self.threads):
            raise ScheduleError(f"schedule {self.name!r}: one thread count >= 1 per stream "
                                f"needed, got {list(self.threads)}")
        stream_of = self.stream_of
        for k, t in self.kernel_threads.items():
            if k not in stream_of or not 1 <= t <= self.threads[stream_of[k]]:
                raise ScheduleError(f"schedule {self.name!r}: kernel %{k} cannot run on {t} "
                                    "thread(s) (a scheduled kernel, at least 1, at most its "
                                    "stream's)")
        if self.stages is not None and sorted(k for st in self.stages for k in st) != sorted(
                placed):
            raise ScheduleError(f"schedule {self.name!r}: stages must partition the kernels")
        if self.launch_order and sorted(self.launch_order) != sorted(placed):
            raise ScheduleError(f"schedule {self.name!r}: launch order must list every kernel")
        try:
            before = self.happens_before()
        except ScheduleError as e:
            raise ScheduleError(f"schedule {self.name!r} deadlocks: {e}") from None
        index = {k: i for i, k in enumerate(placed)}
        for k in placed:
            for p in producers(graph, k):
                if not before[k] >> index[p] & 1:
                    raise ScheduleError(
                        f"schedule {self.name!r}: kernel %{k} may start before its producer "
                        f"%{p} finishes (add a wait or reorder the stream)")
        if self.launch_order:
            seen: set[int] = set()
            preds = self._edges()
            for k in self.launch_order:
                if not preds[k] <= seen:
                    raise ScheduleError(f"schedule {self.name!r}: launch order issues %{k} "
                                        "before something it waits for")
                seen.add(k)

    # -- JSON
    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable dict (kernel ids are node ids of the graph whose hash it names)."""
        return {"format": FORMAT, "version": VERSION, "name": self.name,
                "graph_hash": self.graph_hash, "streams": [list(s) for s in self.streams],
                "threads": list(self.threads),
                "waits": {str(k): list(v) for k, v in sorted(self.waits.items())},
                "stages": None if self.stages is None else [list(s) for s in self.stages],
                "launch_order": list(self.launch_order), "info": dict(self.info),
                **({"kernel_threads": {str(k): t for k, t in sorted(self.kernel_threads.items())}}
                   if self.kernel_threads else {})}

    def dumps(self) -> str:
        return json.dumps(self.to_json())

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | str, graph: Graph | None = None) -> Schedule:
        """Read a schedule written by `to_json`; with ``graph``, check it was made for it."""
        try:
            d: Mapping[str, Any] = json.loads(data) if isinstance(data, str) else data
            if d.get("format") != FORMAT or d.get("version") != VERSION:
                raise ScheduleError(f"not a {FORMAT} v{VERSION} file (format="
                                    f"{d.get('format')!r}, version={d.get('version')!r})")
            sched = cls(streams=tuple(tuple(int(k) for k in s) for s in d["streams"]),
                        threads=tuple(int(t) for t in d["threads"]),
                        waits={int(k): tuple(int(p) for p in v)
                               for k, v in d["waits"].items()},
                        stages=None if d.get("stages") is None else tuple(
                            tuple(int(k) for k in s) for s in d["stages"]),
                        launch_order=tuple(int(k) for k in d.get("launch_order", ())),
                        name=str(d.get("name", "")),
                        graph_hash=str(d.get("graph_hash", "")),
                        info=dict(d.get("info", {})),
                        kernel_threads={int(k): int(t)
                                        for k, t in d.get("kernel_threads", {}).items()})
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ScheduleError(f"corrupt schedule: {type(e).__name__}: {e}") from None
        if graph is not None:
            if sched.graph_hash and sched.graph_hash != graph.structural_hash():
                raise ScheduleError("the schedule was made for a different kernel graph "
                                    f"(hash {sched.graph_hash[:12]}, this one "
                                    f"{graph.structural_hash()[:12]})")
            sched.validate(graph)
        return sched

    def describe(self) -> str:
        """One line: name, streams, kernels, waits, stages."""
        stages = f", {len(self.stages)} stages" if self.stages else ""
        threads = (f"{self.threads[0]} thread(s) each" if len(set(self.threads)) == 1
                   else f"threads {list(self.threads)}")
        if self.kernel_threads:
            threads += f" ({len(self.kernel_threads)} kernels on fewer)"
        return (f"{self.name or 'schedule'}: {len(self.kernels)} kernels on {self.num_streams} "
                f"stream(s), {sum(map(len, self.waits.values()))} cross-stream waits{stages}, "
                f"{threads}")


def _topological(preds: Mapping[int, set[int]], order: Sequence[int]) -> list[int]:
    """``order`` sorted topologically by ``preds`` (stable); a cycle raises `ScheduleError`."""
    try:
        return toposort(order, preds)
    except CycleError as e:
        raise ScheduleError(f"circular waits among kernels {e.stuck[:10]}") from None
