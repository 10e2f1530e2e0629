"""What the planner measures programs with: a `Meter`, here (`paragraph.tvm_interop.meter.local`,
cached in the cost database) or on a device behind TVM's RPC tracker
(`paragraph.tvm_interop.meter.remote`, uncached: the cost database is this machine's). Code that
measures takes a meter and never asks which one it has."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import tvm

from paragraph.passes.ios import IOSOptions
from paragraph.progress import Log
from paragraph.schedule import Schedule
from paragraph.tvm_interop.measure.costdb import CostDB
from paragraph.tvm_interop.measure.device import Peaks
from paragraph.tvm_interop.runtime.program import KernelProgram

Groups = tuple[tuple[int, ...], ...]  # a stage: groups of kernel ids


class StageTimer(Protocol):
    """Times IOS stages (concurrent groups, or kernels in sequence) of one program."""

    def measure(self, groups: Groups, strategy: str) -> float:
        """Seconds of one run of the stage, measured now."""
        ...

    def close(self) -> None:
        """Free what the timer holds (an executor, a remote session's program)."""
        ...


class Meter(Protocol):
    """Where programs are measured (see the module docstring)."""

    db: CostDB | None  # where its measurements are cached (None: they are not this machine's)
    tuning: str  # the tuning database's identity, part of every cost key
    cores: int  # the device's cores

    def kernel_times(self, program: KernelProgram, threads: Sequence[int], *,
                     fill: bool = False, log: Log | None = None) -> list[dict[int, float]]:
        """Seconds per kernel of ``program`` in model order on each of ``threads`` threads
        (``fill``: after one run on sample inputs, so every buffer holds what a run writes;
        ``log`` hears when kernels are timed)."""
        ...

    def measures(self, target: tvm.target.Target) -> bool:
        """Whether programs for ``target`` can be run and measured by this meter."""
        ...

    def handoff(self, target: tvm.target.Target) -> float:
        """Seconds for one worker thread to hand a result to another on the device."""
        ...

    def runs(self, candidates: Sequence[tuple[KernelProgram, Schedule]], *, repeat: int = 6,
             warmup: int = 2, block: int = 5, check: bool = False,
             fresh: bool = False) -> list[float]:
        """Median seconds of whole runs of each candidate side by side; with ``check`` their
        outputs must agree (`paragraph.tvm_interop.meter.runs.require_equal`); ``fresh``:
        timed now, not read from (nor kept in) the cost database."""
        ...

    def stage_timer(self, program: KernelProgram, options: IOSOptions,
                    seq_threads: int) -> StageTimer:
        """A timer of ``program``'s IOS stages by ``options``' protocol."""
        ...

    def sequence_seconds(self, program: KernelProgram, threads: int,
                         options: IOSOptions) -> float:
        """Seconds of ``program``'s kernels in sequence on ``threads`` threads by the stage
        protocol (IOS's merged-convolution stage)."""
        ...

    def peaks(self, target: tvm.target.Target) -> Peaks:
        """The peak rates the cost model's estimates use."""
        ...

    def describe(self) -> str:
        """One line: where the measurements happen."""
        ...
