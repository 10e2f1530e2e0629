"""The `Meter` of this machine: kernels, hand-offs, stages and whole runs timed here on the
executor, cached in the cost database (`paragraph.tvm_interop.measure.costdb`)."""

from __future__ import annotations

from collections.abc import Sequence

import tvm

from paragraph.inputs import sample_inputs
from paragraph.machine import cpu_count
from paragraph.passes.ios import IOSOptions
from paragraph.passes.schedule import sequential
from paragraph.progress import Log
from paragraph.schedule import Schedule
from paragraph.tvm_interop.measure.costdb import CostDB
from paragraph.tvm_interop.measure.device import (
    Peaks,
    kernel_costs,
    measure_cpu_peaks,
    measure_handoff,
)
from paragraph.tvm_interop.meter.runs import time_runs
from paragraph.tvm_interop.meter.stages import LocalStages, sequence_seconds
from paragraph.tvm_interop.runtime.executor import make_executor
from paragraph.tvm_interop.runtime.program import KernelProgram
from paragraph.tvm_interop.runtime.target import runs_here


class LocalMeter:
    """Measures on this machine; ``db`` caches what it measures (None: nothing is cached),
    under the tuning database's identity ``tuning``."""

    def __init__(self, db: CostDB | None = None, tuning: str = "") -> None:
        self.db, self.tuning = db, tuning
        self.cores = cpu_count()

    def kernel_times(self, program: KernelProgram, threads: Sequence[int], *,
                     fill: bool = False, log: Log | None = None) -> list[dict[int, float]]:
        graph = program.graph
        with make_executor(program, sequential(graph, cores=threads[0]),
                           use_cuda_graph=False) as ex:
            if fill:  # every buffer filled by a real run (indices within their tables)
                ex.run(*sample_inputs([graph[i].type for i in graph.inputs],
                                      program.input_ranges))
            return [kernel_costs(ex, db=self.db, threads=t, tuning=self.tuning, log=log)
                    for t in threads]

    def measures(self, target: tvm.target.Target) -> bool:
        return runs_here(target)

    def handoff(self, target: tvm.target.Target) -> float:
        return measure_handoff(self.db, str(target))

    def runs(self, candidates: Sequence[tuple[KernelProgram, Schedule]], *, repeat: int = 6,
             warmup: int = 2, block: int = 5, check: bool = False,
             fresh: bool = False) -> list[float]:
        return time_runs(candidates, None if fresh else self.db, self.tuning, repeat=repeat,
                         warmup=warmup, check=check, block=block)

    def stage_timer(self, program: KernelProgram, options: IOSOptions,
                    seq_threads: int) -> LocalStages:
        return LocalStages(program, options, seq_threads)

    def sequence_seconds(self, program: KernelProgram, threads: int,
                         options: IOSOptions) -> float:
        return sequence_seconds(program, threads, options)

    def peaks(self, target: tvm.target.Target) -> Peaks:
        return measure_cpu_peaks(self.db, str(target))

    def describe(self) -> str:
        return f"this machine, {self.cores} cores"
