"""Timing kernels on the device (cached in `paragraph.tvm_interop.measure.costdb`).

* `time_steps` times one kernel, or several kernels run concurrently (one group of kernels per
  worker thread on the CPU, each group in order), on buffers an executor has already bound:
  warm-ups, then repeats, median. `time_kernel` times one kernel with its runs back to back in
  one dispatch, so the hand-off to a worker (about 30 us on a CPU) is not part of its cost;
  `time_in_sequence` times every kernel where it runs in a 1-thread run of the whole model
  (what `kernel_costs` caches; on a GPU `CUDAExecutor.kernel_seconds` times them between
  events in one CUDA Graph replay); `measure_handoff` times that hand-off itself.
* `estimate_seconds` is the analytical fallback when measuring is off: FLOPs and bytes over the
  device's measured peak rates (a roofline), plus a fixed launch overhead.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from paragraph.errors import ParagraphError
from paragraph.graph import Graph, Node
from paragraph.machine import LoadWatch
from paragraph.progress import Log
from paragraph.schedule import bytes_moved
from paragraph.timing import Timing, time_calls
from paragraph.tvm_interop.measure.costdb import CostDB, CostKey
from paragraph.tvm_interop.runtime import native
from paragraph.tvm_interop.runtime.library.native import revision as vendor_revision
from paragraph.tvm_interop.runtime.library.native import timing_kernels

if TYPE_CHECKING:  # steps are the executor's; measuring them needs no executor
    from paragraph.tvm_interop.runtime.executor import Step
from paragraph.tvm_interop.runtime.target import is_cpu
from paragraph.tvm_interop.runtime.threads import (
    acquire_workers,
    config_threads,
    on_caller,
    on_workers,
    pinned,
    release_workers,
    stream_cores,
)


# ---------------------------------------------------------------------------- timing
def time_steps(groups: Sequence[Sequence[Step]], *, repeat: int = 10, warmup: int = 2,
               threads: Sequence[int] | None = None,
               sync: Callable[[], object] | None = None) -> Timing:
    """Wall time of running ``groups`` of prebound steps concurrently (one worker thread per
    group, each group in order).

    A step is anything with ``fn`` and ``args`` (an executor's `Step`). ``threads`` sizes each
    group's TVM thread pool; ``sync`` (a callable) is called before the clock stops, for
    asynchronous devices.
    """
    threads = list(threads or [1] * len(groups))

    errors: list[BaseException] = []

    def run_group(i, done):
        try:
            config_threads(threads[i])
            for st in groups[i]:
                if st.fn is not None:
                    st.fn(*st.args)
        except BaseException as exc:  # re-raised by the caller, after every group ended
            errors.append(exc)
        finally:
            done.set()

    caller = on_caller(threads)  # one group on every core: as the executor runs it
    # none on the caller otherwise: see `executor` on threads
    workers = [] if caller else acquire_workers(len(groups))
    done = [threading.Event() for _ in groups]

    def once():
        if caller:
            run_group(0, done[0])
        else:
            for i, (w, ev) in enumerate(zip(workers, done, strict=True)):
                w.submit(partial(run_group, i, ev))
        for ev in done:
            ev.wait()
            ev.clear()
        if errors:
            raise errors[0]
        if sync is not None:
            sync()

    try:
        return time_calls(once, repeat, warmup)
    finally:
        release_workers(workers)


SAMPLE_SECONDS = 1e-3  # `time_kernel` repeats a short kernel in one dispatch up to this long


# v2: vendor kernels are called bound to their tensors (`vendor.runtime.bind`), ~8 us less;
# v3: a sequence on every core runs on the caller, whose OpenMP worker spins between calls
# (`threads.on_caller`): multi-thread vendor kernels 45-80 us less each; v4: a program with
# vendor kernels warmed up `SETTLE_RUNS` times first
IN_SEQUENCE = "in-sequence/v4"
IN_GRAPH = "in-graph/v1"  # a GPU kernel's time between events in one graph replay
# calls before a vendor kernel runs only its chosen form: the C++ vendor kernels time each of
# their forms (up to six: a 3x3 or 1x7 convolution's oneDNN, implicit GEMM and two Winograd
# forms, those two also in small blocks where the weight is streamed) in their first five calls
# per new shape, then keep the fastest. A kernel timed within them is timed on a mix of forms:
# `kernel_costs` with two warm-ups gave the median of the forms being tried, so the
# critical-path schedule and the search's cost model priced Winograd's convolutions at another
# form's time. `tests/test_vendor.py` checks it against the kernels' own count
# (``paragraph_vendor_timing_calls``) for the kernel with the most forms
SETTLE_RUNS = 31


def uses_vendor(sources: Iterable[str]) -> bool:
    """Whether kernels of these sources include vendor kernels (``vendor``, or ``auto``'s)."""
    return any(s in ("vendor", "auto") for s in sources)


def settle(run: Callable[[], object], sources: Iterable[str]) -> int:
    """Run ``run`` until the vendor kernels of a program with these kernel ``sources`` run
    only their chosen forms, and return how many runs that took: at most `SETTLE_RUNS`, at
    least one; fewer where the C++ kernels say none is still timing (an executor bound after
    the planner timed the same kernels starts with their choices: a fixed 31 runs would be
    8 s of NASNet-A large's ~260 ms runs spent on nothing). Without vendor kernels, one run."""
    if not uses_vendor(sources):
        run()
        return 1
    for done in range(1, SETTLE_RUNS + 1):
        run()
        if timing_kernels() == 0:  # None (the Python kernels): all SETTLE_RUNS
            return done
    return SETTLE_RUNS


def kernel_key(target: str, node: Node, tuning: str, threads: int,
               protocol: str = "alone") -> CostKey:
    """The cost-database key of one kernel timed with ``threads``, by `time_kernel`
    (``protocol`` "alone") or `time_in_sequence` (`IN_SEQUENCE`); a vendor kernel's key also
    names the vendor kernels' implementation (`vendor_tag`)."""
    source = node.attrs["source"]
    return CostKey(target, node.attrs["hash"], tuning, source,
                   f"threads={threads}/{protocol}{vendor_tag([source])}")


def vendor_tag(sources: Iterable[str]) -> str:
    """What a cost key's config gets where vendor kernels (``vendor``, or ``auto``'s) take
    part: their implementation (`vendor.native.revision`), so that a change to how they run
    voids their cached times; "" otherwise."""
    return f"/{vendor_revision()}" if uses_vendor(sources) else ""


def time_kernel(step: Step, *, threads: int = 1, repeat: int = 10, warmup: int = 2,
                sync: Callable[[], object] | None = None) -> Timing:
    """Seconds per run of one prebound kernel: each sample is the mean of ``number`` runs back
    to back in one dispatch to a worker, ``number`` chosen (1 to 64) so a sample lasts about
    `SAMPLE_SECONDS`. A kernel in a stream follows its predecessor on the same worker, so the
    dispatch of a lone run (a thread wake-up, tens of microseconds) is not part of its cost;
    counting it made 122 inception_v3 kernels add up to 5% more than their sequence ran."""
    probe = time_steps([[step]], repeat=1, warmup=1, threads=[threads], sync=sync).samples[0]
    number = max(1, min(64, int(SAMPLE_SECONDS / max(probe, 1e-7))))
    timing = time_steps([[step] * number], repeat=repeat, warmup=warmup, threads=[threads],
                        sync=sync)
    return Timing(tuple(t / number for t in timing.samples))


def time_in_sequence(steps: Sequence[Step], *, threads: int = 1, repeat: int = 10,
                     warmup: int = 2, until_settled: bool = False) -> list[Timing]:
    """Seconds of each of ``steps`` where it runs on a CPU: all of them in order on one
    worker, ``repeat`` times, each step timed on its own (a GPU's kernels are timed by
    `CUDAExecutor.kernel_seconds`). This is what a kernel costs inside its model, with its
    weights as cold and its inputs as warm as in a run: on inception_v3 the same kernels
    repeated alone added up to 8% less than the sequence took (hot caches), timed one
    dispatch each 5% more. With ``until_settled``, the warm-up stops once no C++ vendor kernel
    is still timing its forms (at least two runs, at most ``warmup``): kernels whose forms an
    earlier measurement chose start with them (ViT-B/16's four measurements of a build ran
    31 warm-ups each, 20 s of its 127)."""
    if repeat < 1:
        raise ParagraphError(f"repeat must be at least 1, got {repeat}")
    samples = np.zeros((repeat, len(steps)))
    clock = time.perf_counter

    def sequence(row: np.ndarray | None) -> None:
        for i, st in enumerate(steps):
            if st.fn is None:
                continue
            start = clock()
            st.fn(*st.args)
            if row is not None:
                row[i] = clock() - start

    def run() -> None:
        config_threads(threads)
        for done in range(1, warmup + 1):
            sequence(None)
            if until_settled and done >= 2 and timing_kernels() == 0:
                break
        for row in samples:
            sequence(row)

    on_workers([run], [threads])
    return [Timing(tuple(map(float, col))) for col in samples.T]


def measure_handoff(db: CostDB | None = None, target: str = "cpu", rounds: int = 300) -> float:
    """Seconds from one worker signalling the step another waits on to that one running again:
    what the CPU executor pays at a cross-stream wait that blocks (two workers ping-pong
    ``rounds`` times; the median over 5 tries), through the executor's own runner: the native
    one's spinning flags when it is available, else Python events. Cached in the cost
    database, per runner."""
    module = native.runner()
    cores = stream_cores([1, 1])  # bound as the executor's streams are, where they are
    runner = "native-flag" if module else "worker-event"
    key = CostKey(target, f"handoff:{runner}{'/bound' if cores else ''}")
    if db is not None and (cached := db.get(key)) is not None:
        return cached
    if module is not None:  # stream 0 signals slot i, stream 1 answers in slot rounds + i
        program = native.StreamProgram(module, [
            [(None, (), [rounds + i - 1] if i else [], i) for i in range(rounds)],
            [(None, (), [i], rounds + i) for i in range(rounds)]], 2 * rounds, native.SPIN_NS)

        def serve() -> None:
            program.run(1)

        def volley() -> None:
            program.run(0)
    else:
        ping, pong = threading.Event(), threading.Event()

        def serve() -> None:
            for _ in range(rounds):
                ping.wait()
                ping.clear()
                pong.set()

        def volley() -> None:
            for _ in range(rounds):
                ping.set()
                pong.wait()
                pong.clear()

    def bound(task, cores) -> Callable[[], None]:
        def run() -> None:
            with pinned(cores):
                task()
        return run

    tasks = [bound(serve, cores and cores[1]), bound(volley, cores and cores[0])]

    def volleys() -> None:
        if module is not None:
            program.reset()
        on_workers(tasks)

    try:
        runs = time_calls(volleys, repeat=5, warmup=0)
    finally:
        if module is not None:
            program.close()
    samples = [t / (2 * rounds) for t in runs.samples]
    timing = Timing(tuple(samples))
    if db is not None:
        db.put(key, timing)
    return statistics.median(samples)


# ---------------------------------------------------------------------------- analytical
@dataclass(frozen=True)
class Peaks:
    """Measured peak rates of a device."""

    flops: float  # FLOP/s
    bandwidth: float  # bytes/s
    launch: float = 2e-6  # seconds of fixed cost per kernel


def measure_cpu_peaks(db: CostDB | None = None, target: str = "cpu") -> Peaks:
    """This CPU's FLOP rate (a float32 GEMM through numpy's BLAS) and memory bandwidth (a large
    copy), measured once and cached in the cost database."""
    keys = (CostKey(target, "peak:flops"), CostKey(target, "peak:bandwidth"))
    if db is not None:
        flops, bandwidth = (db.get(k) for k in keys)
        if flops is not None and bandwidth is not None:
            return Peaks(1 / flops, 1 / bandwidth)
    n = 1024
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    gemm = min(time_calls(lambda: a @ a, repeat=5, warmup=0).samples)
    src = np.ones(64 * 2**20 // 4, np.float32)
    dst = np.empty_like(src)
    copy = min(time_calls(lambda: np.copyto(dst, src), repeat=5, warmup=0).samples)
    peaks = Peaks(2 * n**3 / gemm, 2 * src.nbytes / copy)
    if db is not None:  # stored as seconds per unit so CostDB keeps one column
        db.put(keys[0], Timing((1 / peaks.flops,)))
        db.put(keys[1], Timing((1 / peaks.bandwidth,)))
    return peaks


def estimate_seconds(graph: Graph, node: Node, peaks: Peaks) -> float:
    """Roofline estimate of a kernel: max(FLOPs / peak FLOP/s, bytes / bandwidth) + launch."""
    if node.kind != "kernel":
        return 0.0
    flops = float(node.attrs.get("flops", 0.0))
    moved = bytes_moved(graph, node.id)
    return max(flops / peaks.flops, moved / peaks.bandwidth) + peaks.launch


def kernel_costs(executor, *, db: CostDB | None = None, measure: bool = True,
                 repeat: int = 10, warmup: int | None = None, tuning: str = "",
                 threads: int | None = None, log: Log | None = None) -> dict[int, float]:
    """Seconds per kernel of an executor's program with ``threads`` threads: cached, else
    measured in model order with `time_in_sequence` (and cached), or with ``measure=False``
    estimated from FLOPs and bytes (``log`` hears when it measures). Views cost nothing.
    ``warmup`` runs of the sequence come first (default: `SETTLE_RUNS` where the program has
    vendor kernels, which time their forms in their first calls, else 2)."""
    graph, program = executor.graph, executor.program
    if warmup is None:
        warmup = SETTLE_RUNS if uses_vendor(program.sources()) else 2
    target = str(program.target)
    threads = threads or executor.schedule.threads[0]
    kernels = [k for k in executor.schedule.kernels if graph[k].kind == "kernel"]
    costs: dict[int, float] = dict.fromkeys(executor.schedule.kernels, 0.0)
    on_cpu = is_cpu(program.target)
    protocol = IN_SEQUENCE if on_cpu else IN_GRAPH
    keys = {k: kernel_key(target, graph[k], tuning, threads, protocol) for k in kernels}
    cached = {k: db.get(keys[k]) if db is not None else None for k in kernels}
    if not measure and None in cached.values():
        peaks = measure_cpu_peaks(db, target)
        cached = {k: estimate_seconds(graph, graph[k], peaks) if v is None else v
                  for k, v in cached.items()}
    if None in cached.values():
        if log is not None:
            log(f"  timing {len(kernels)} kernels in model order, {repeat} runs ...")
        order = [k for k in graph.topological_order() if k in keys]
        with LoadWatch() as watch:
            if on_cpu:  # vendor kernels bound for ``threads``: the executor's may be for another
                steps = executor.steps_at(threads)
                timings = time_in_sequence([steps[k] for k in order], threads=threads,
                                           repeat=repeat, warmup=warmup,
                                           until_settled=warmup == SETTLE_RUNS)
            else:  # GPU time under a graph replay, not the host's launch and sync
                timings = executor.kernel_seconds(order, repeat=repeat, warmup=warmup)
        pooled: dict[CostKey, list[float]] = {}  # a kernel used twice: one cost, both runs
        for k, timing in zip(order, timings, strict=True):
            if cached[k] is None:  # a cached cost stays: costs are measured once
                pooled.setdefault(keys[k], []).extend(timing.samples)
        for key, samples in pooled.items():
            if db is not None and not watch.contended:  # used now, not kept
                db.put(key, Timing(tuple(samples)))
        for k in kernels:
            if cached[k] is None:
                cached[k] = statistics.median(pooled[keys[k]])
    costs.update(cached)
    return costs
