"""Timing loops, all of them: repeated calls, round-robin and block-alternating comparison of
several configurations side by side. Pure Python (what is timed is a callable); the device
specific primitives that use them are in `paragraph.tvm_interop.measure.device`."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from paragraph.errors import ParagraphError

# How much faster a choice must time than the one it would replace to count as faster, not
# noise: every choice made by measurement uses it (the planner's schedules and rewrites, the
# search's candidates, tuned kernels, the C++ kernels' forms and the PyTorch kernels' variants).
# Two builds of one program timed side by side, as the planner times its choices, differed by
# 0.6% in the median, 1.4% at the 90th percentile and 2.6% at most (30 comparisons of five zoo
# models on the idle 2-core host, `benchmarks/noise.py`: benchmarks/results/noise-cpu.json).
# Before this one margin there were five: 1% (planner), 2% (search), 3% (tuning, C++ forms),
# none (PyTorch variants).
MARGIN = 0.02


def clearly_faster(new_s: float, old_s: float, margin: float = MARGIN) -> bool:
    """Whether ``new_s`` beats ``old_s`` by more than ``margin`` (`MARGIN`): on a tie the
    choice already made (the plainer schedule, the incumbent, the first form) stands."""
    return new_s < old_s * (1 - margin)


@dataclass(frozen=True)
class Timing:
    """Wall-clock samples of repeated runs, in seconds, with summary statistics in ms."""

    samples: tuple[float, ...]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples) * 1e3

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.samples, q)) * 1e3


def time_calls(fn: Callable[[], object], repeat: int, warmup: int = 1,
               number: int = 1) -> Timing:
    """Call ``fn`` ``warmup`` times untimed, then take ``repeat`` samples, each the mean of
    ``number`` calls back to back."""
    if repeat < 1 or number < 1:
        raise ParagraphError(f"repeat and number must be at least 1, got {repeat}, {number}")
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - start) / number)
    return Timing(tuple(samples))


@dataclass
class Config:
    """One way to run a model, timed side by side with others: a callable plus what to
    report about it, and the samples the timing loops append."""

    name: str
    run: Callable[[], Any]
    info: dict[str, Any] = field(default_factory=dict)
    samples: list[float] = field(default_factory=list)
    close: Callable[[], None] | None = None

    def row(self, baseline_ms: float | None) -> dict[str, Any]:
        """Median, p10 and p90 in ms, the speed-up over ``baseline_ms``, and ``info``."""
        med = statistics.median(self.samples) * 1e3
        return {"config": self.name, "median_ms": med,
                "p10_ms": float(np.percentile(self.samples, 10)) * 1e3,
                "p90_ms": float(np.percentile(self.samples, 90)) * 1e3,
                "speedup_vs_tvm_vm": baseline_ms / med if baseline_ms else None,
                "runs": len(self.samples), **self.info}


def time_after_pauses(configs: Sequence[Config], blocks: int, block: int = 10,
                      pause_s: float = 0.05) -> None:
    """As a server with requests now and then sees them: ``blocks`` rounds in which each
    configuration runs ``block`` times, each run timed after ``pause_s`` idle (threads that
    went to sleep must be woken, caches were left to others), configurations alternating by
    block. Appends to each ``samples``."""
    for _ in range(blocks):
        for c in configs:
            for _ in range(block):
                time.sleep(pause_s)
                start = time.perf_counter()
                c.run()
                c.samples.append(time.perf_counter() - start)


def time_round_robin(configs: Sequence[Config], repeat: int, warmup: int = 2, settle: int = 1,
                     progress: Callable[[int], object] | None = None) -> None:
    """Warm every configuration up, then time ``repeat`` rounds of one run each, after
    ``settle`` untimed runs of the same configuration: the timed run sees that configuration's
    steady state (switching torch's process-wide thread count between configurations drops
    oneDNN's compiled primitives), while drift on a shared machine still hits all alike."""
    for c in configs:
        for _ in range(warmup):
            c.run()
    for r in range(repeat):
        for c in configs:
            for _ in range(settle):
                c.run()
            start = time.perf_counter()
            c.run()
            c.samples.append(time.perf_counter() - start)
        if progress is not None:
            progress(r + 1)


def time_in_blocks(configs: Sequence[Config], blocks: int, block: int = 10,
                   settle: int = 2) -> list[list[float]]:
    """``blocks`` rounds in which each configuration runs ``settle`` untimed, then ``block``
    timed runs back to back: each timed run sees its configuration's steady state, also where
    that takes longer than one run to reach (after a one-stream run, a second core idle for
    tens of milliseconds made the next few runs of two-stream NASNet-A 14% slower on the
    shared VM), while drift still hits all alike. Appends to each ``samples``; returns, per
    configuration, the median of each block."""
    medians: list[list[float]] = [[] for _ in configs]
    for _ in range(blocks):
        for c, got in zip(configs, medians, strict=True):
            for _ in range(settle):
                c.run()
            times = []
            for _ in range(block):
                start = time.perf_counter()
                c.run()
                times.append(time.perf_counter() - start)
            c.samples += times
            got.append(statistics.median(times))
    return medians
