"""IOS's stage meter: the latency of a stage of a `KernelProgram` (groups of kernels run
concurrently, kernels in sequence on all threads, or convolutions merged by the verified rule
``ios-merge-convs``) measured with IOS's protocol, each distinct stage once, cached in the cost
database of its `Meter`. `paragraph.passes.ios.search` prices its stages with it. The stages
themselves are timed by the meter's `StageTimer` (`LocalStages` here; on a remote device the
program is uploaded once and each stage timed there); a merged convolution is built here and
timed by the meter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np

from paragraph.errors import ParagraphError
from paragraph.graph import GraphBuilder, TensorRef
from paragraph.machine import LoadWatch
from paragraph.passes.ios import (
    CONCURRENT,
    MERGE,
    SEQUENTIAL,
    IOSOptions,
    apply_merges,
    merge_rule,
    merge_units,
)
from paragraph.passes.schedule import sequential
from paragraph.rules.parametric import Unit
from paragraph.timing import Timing, time_calls
from paragraph.tvm_interop.build.program import build_program
from paragraph.tvm_interop.build.tuning_db import tuning_id
from paragraph.tvm_interop.measure.costdb import CostKey
from paragraph.tvm_interop.measure.device import time_steps, vendor_tag
from paragraph.tvm_interop.meter.protocol import Groups, Meter, StageTimer
from paragraph.tvm_interop.runtime.executor import CUDAExecutor, cuda_check, cudart, make_executor
from paragraph.tvm_interop.runtime.memory import no_reuse_plan
from paragraph.tvm_interop.runtime.program import KernelProgram
from paragraph.tvm_interop.runtime.target import is_cpu

# A measured stage may come out a little under the sum of its kernels measured alone (noise,
# caches kept warm across a group): the bound is scaled down by this much to stay below it.
BOUND_SLACK = 0.9


class StageMeter:
    """Measures stages of a `KernelProgram` with ``meter``; each distinct stage once, cached in
    the meter's cost database under a key made of its kernels' hashes and the strategy."""

    def __init__(self, program: KernelProgram, options: IOSOptions, meter: Meter,
                 tuning_db: str | None = None, seq_threads: int | None = None) -> None:
        self.program, self.options, self.meter = program, options, meter
        self.db = meter.db
        self.tuning_db = tuning_db
        self.tuning = tuning_id(tuning_db)  # cost keys name the tuned records, not the path
        self.on_cpu = is_cpu(program.target)
        self.cores = (options.cores or meter.cores) if self.on_cpu else 1
        self.seq_threads = seq_threads or self.cores  # threads of a sequential stage
        self.rule = merge_rule()
        self.timer: StageTimer = meter.stage_timer(program, options, self.seq_threads)
        self.measured = 0
        self._overhead: float | None = None
        self._seconds: dict[tuple[Groups, str], float] = {}  # what `cost` returned
        self._units: dict[tuple[int, ...], list[Unit] | None] = {}  # what `units` returned

    def close(self) -> None:
        self.timer.close()

    def key(self, groups: Groups, strategy: str) -> str:
        graph = self.program.graph
        sig = "|".join(",".join(graph[k].attrs["hash"] for k in g) for g in groups)
        return f"ios:{strategy}:{sig}"

    def cost(self, groups: Groups, strategy: str) -> float:
        """Seconds for one run of the stage (kernel ids), measured or from the database."""
        if strategy == SEQUENTIAL and self.seq_threads == 1 and len(groups) == 1:
            strategy = CONCURRENT  # the same run: one group on one thread
        if (groups, strategy) not in self._seconds:
            self._seconds[groups, strategy] = self._cost(groups, strategy)
        return self._seconds[groups, strategy]

    def _cost(self, groups: Groups, strategy: str) -> float:
        sources = {self.program.graph[k].attrs["source"] for g in groups for k in g}
        source = ",".join(sorted(sources))
        threads = f";threads={self.seq_threads}" if strategy != CONCURRENT else ""
        key = CostKey(str(self.program.target), self.key(groups, strategy), self.tuning, source,
                      f"protocol={self.options.warmup}/{self.options.repeat}x"
                      f"{self.options.number}/fork-join{threads}{vendor_tag(sources)}")
        cached = self.db.get(key) if self.db is not None else None
        if cached is not None:
            return cached
        with LoadWatch(min_s=0.0) as watch:  # hundreds of stages: no waiting on short ones
            seconds = self.measure(groups, strategy)
        self.measured += 1
        if self.db is not None and not watch.contended:  # used now, not kept
            self.db.put(key, Timing((seconds,)))
        return seconds

    def overhead(self) -> float:
        """Seconds a stage costs with nothing in it (dispatch to a worker and back), measured
        once per meter with the stage protocol."""
        if self._overhead is None:
            self._overhead = self.cost((), CONCURRENT)
        return self._overhead

    def bound(self, groups: Groups, strategy: str) -> float:
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

    def units(self, kernels: Sequence[int]) -> list[Unit] | None:
        """The convolution units of ``kernels`` if the merge rule merges exactly them."""
        p, key = self.program, tuple(kernels)
        if p.operator_graph is None or p.kernel_operators is None:
            return None
        if key not in self._units:  # the DP asks again for the same sinks in many states
            self._units[key] = merge_units(self.rule, p.operator_graph, p.kernel_operators,
                                           kernels)
        return self._units[key]

    def mergeable(self, kernels: Sequence[int]) -> bool:
        return self.units(kernels) is not None

    def measure(self, groups: Groups, strategy: str) -> float:
        """Seconds of one run of the stage, measured now (by the meter's timer; a merge is
        built here and timed by the meter)."""
        if strategy == MERGE:
            return self._merged_cost(tuple(k for g in groups for k in g))
        return self.timer.measure(groups, strategy)

    def _merged_cost(self, kernels: tuple[int, ...]) -> float:
        """Build the merged convolution alone (the merge rule applied to a copy of the
        kernels' operators), compile it, and time it with all threads."""
        units = self.units(kernels)
        opgraph = self.program.operator_graph
        if units is None or opgraph is None:
            raise ParagraphError(f"IOS: kernels {list(kernels)} do not merge")
        data = opgraph[units[0][0]].inputs[0]
        dtype = opgraph.type_of(data)
        b = GraphBuilder()  # the shared input, then the units' operators
        refs: dict[TensorRef, TensorRef] = {data: b.input(dtype.shape, dtype.dtype, name="x")}
        ids: dict[int, int] = {}
        for conv, chain in units:
            for i in (conv, *chain):
                node = opgraph[i]
                for r in node.inputs:
                    if r not in refs:  # a chain's constants and a kernel's weight
                        src = opgraph[r.node]
                        assert src.value is not None  # a unit reads only its input and weights
                        refs[r] = b.weight(src.value, kind=src.kind)
                ids[i] = b.op(node.kind, [refs[r] for r in node.inputs], node.attrs).id
                refs[TensorRef(i)] = TensorRef(ids[i])
        mini = b.build([TensorRef(ids[chain[-1] if chain else conv]) for conv, chain in units])
        merged, _ = apply_merges(self.rule, mini, [[(ids[c], tuple(ids[i] for i in chain))
                                                    for c, chain in units]])
        program = build_program(merged, self.program.target, device=self.program.device,
                                tuning_db=self.tuning_db, kernels=self.program.kernel_source)
        return self.meter.sequence_seconds(program, self.seq_threads, self.options)


class LocalStages:
    """Times stages of ``program`` here: an executor over it (every buffer kept apart, so any
    groups can run at once) with its kernels bound per thread count."""

    def __init__(self, program: KernelProgram, options: IOSOptions, seq_threads: int) -> None:
        self.program, self.options, self.seq_threads = program, options, seq_threads
        self.on_cpu = is_cpu(program.target)
        graph = program.graph
        self.executor = make_executor(program, sequential(graph), plan=no_reuse_plan(graph),
                                      use_cuda_graph=False)
        self.executor.run(*[np.zeros(graph[i].type.shape, graph[i].type.dtype)
                            for i in graph.inputs], copy_outputs=False)  # load kernels
        self._bound: dict[int, dict] = {}  # `_steps` per thread count

    def close(self) -> None:
        self.executor.close()

    def measure(self, groups: Groups, strategy: str) -> float:
        """Seconds of one run of the stage, measured now."""
        if strategy == SEQUENTIAL:
            steps = self._steps(self.seq_threads)
            run = [[steps[k] for g in groups for k in g]]
            threads = [self.seq_threads]
        else:  # an empty stage (`overhead`) still goes to one worker and back
            steps = self._steps(1)
            run = [[steps[k] for k in g] for g in groups] or [[]]
            threads = [1] * len(run)
        if not self.on_cpu:
            return self._measure_gpu(run)
        return protocol_seconds(run, threads, self.options, fork_join=len(run) > 1)

    def _steps(self, threads: int) -> dict:
        """The steps with vendor kernels on ``threads`` CPU threads, as a stage of that
        strategy runs them (concurrent groups: one each, not the sequential binding's every
        core), bound once per count."""
        if not self.on_cpu:
            return self.executor.steps
        if threads not in self._bound:
            self._bound[threads] = self.executor.steps_at(threads)
        return self._bound[threads]

    def _measure_gpu(self, run: list[list]) -> float:
        """Groups issued on their own CUDA streams, timed between synchronisations."""
        assert isinstance(self.executor, CUDAExecutor)  # off a CPU, the CUDA executor
        rt, streams = cudart(), self.executor.streams
        dev = self.program.device

        def once() -> None:
            for group, stream in zip(run, streams, strict=False):  # a stream per group
                dev.set_raw_stream(int(stream))
                for step in group:
                    step.fn(*step.args)
            for stream in streams[:len(run)]:
                cuda_check(rt.cudaStreamSynchronize(stream))

        return _gpu_median(once, self.program, self.options)


def _gpu_median(once: Callable[[], None], program: KernelProgram, opts: IOSOptions) -> float:
    """Median seconds of ``once`` on the program's GPU by the stage protocol."""
    dev = program.device
    dev.sync()
    try:
        timing = time_calls(once, opts.repeat, opts.warmup, opts.number)
    finally:
        dev.set_raw_stream(0)
    return timing.median_ms / 1e3


@contextmanager
def _kernel_steps(program: KernelProgram, threads: int) -> Iterator[list]:
    """The bound kernels of ``program`` in sequence on ``threads`` threads, loaded by one run
    on zeros, while its executor lives."""
    graph = program.graph
    with make_executor(program, sequential(graph, cores=threads), use_cuda_graph=False) as ex:
        ex.run(*[np.zeros(graph[i].type.shape, graph[i].type.dtype) for i in graph.inputs],
               copy_outputs=False)
        yield [ex.steps[k] for k in ex.schedule.kernels if ex.steps[k].fn is not None]


def protocol_seconds(run: list[list], threads: list[int], options: IOSOptions,
                     fork_join: bool = False) -> float:
    """IOS's protocol on a CPU: ``warmup`` runs, then the median over ``repeat`` of the mean
    of ``number`` runs of the groups of steps ``run`` (one worker each, on ``threads``). A
    stage of several groups has every run dispatched to the workers and joined on its own, as
    the executor forks and joins streams at its barriers (repeating the runs inside one
    dispatch hid that hand-off, and the DP split a run into more concurrent stages than paid:
    NASNet-A predicted 16 ms, ran 24); a one-group stage runs its ``number`` runs in one
    dispatch, as consecutive one-stream stages follow each other on one worker with no
    hand-off."""
    if not fork_join:
        run = [[st for _ in range(options.number) for st in group] for group in run]
        timing = time_steps(run, repeat=options.repeat, warmup=options.warmup, threads=threads)
        return timing.median_ms / 1e3 / options.number
    n = options.number
    timing = time_steps(run, repeat=options.repeat * n, warmup=options.warmup, threads=threads)
    x = timing.samples
    return float(np.median([sum(x[i:i + n]) / n for i in range(0, len(x), n)]))


def sequence_seconds(program: KernelProgram, threads: int, options: IOSOptions) -> float:
    """Seconds of one run of all of ``program``'s kernels in sequence on ``threads`` CPU
    threads by the stage protocol (`protocol_seconds`), or on its GPU by the same protocol:
    a merged convolution's stage."""
    with _kernel_steps(program, threads) as steps:
        if is_cpu(program.target):
            return protocol_seconds([steps], [threads], options)

        def once() -> None:
            for st in steps:
                st.fn(*st.args)
            program.device.sync()
        return _gpu_median(once, program, options)
