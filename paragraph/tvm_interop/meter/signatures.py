"""Measured seconds of the search's kernels, by signature (issue 16, item 1).

The substitution search prices a candidate graph over the kernels it will become
(`paragraph.passes.cost.kernels_of`: an anchor with its fused element-wise chain, an element-wise
chain, a pool, ...). A `SignatureMeter` measures such a kernel on the device: its operators are
extracted as a graph of their own (`paragraph.passes.search.extract`), built with the program's
kernel source (TVM, vendor or auto, so a vendor convolution with its bias and activation is timed
as the vendor call it becomes), run once on real inputs (so every buffer holds values a run
makes: an index tensor is in range), and its kernels timed in sequence on one thread, the way
`kernel_costs` times a model's kernels, and again on all the threads the search's device has
(``threads``): how much a kernel gains from more cores differs by kernel. The layout
transposes the vendor path adds at the edges of a graph of one convolution are not the kernel's:
in a whole model they happen once, so they are left out. The result is cached in the cost
database by signature, so a kernel is measured once per machine, kernel source, tuning database
and thread count, and every later search starts knowing it. The kernels are timed by a `Meter`:
with a remote one each kernel is built here for the remote target and timed there (both thread
counts in one upload), uncached: the cost database is this machine's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from paragraph.errors import reraise_interrupt
from paragraph.graph import Graph
from paragraph.machine import LoadWatch
from paragraph.passes.cost import Kernel
from paragraph.passes.search import extract
from paragraph.progress import Log, Progress
from paragraph.timing import Timing
from paragraph.tvm_interop.build.program import build_program
from paragraph.tvm_interop.build.tuning_db import tuning_id
from paragraph.tvm_interop.frontend.relax_graph import to_relax
from paragraph.tvm_interop.measure.costdb import CostKey
from paragraph.tvm_interop.measure.device import vendor_tag
from paragraph.tvm_interop.meter.protocol import Meter
from paragraph.tvm_interop.runtime.program import KernelProgram

SIGNATURE_PROTOCOL = "signature/v3"  # bump when what a signature's seconds mean changes
# v2: TVM's CPU pools and transposes are scheduled (`cpu_schedules`), 2-4x faster in a model
# v3: kernels timed after their vendor forms are chosen (`measure.SETTLE_RUNS` warm-ups)
_EDGE_KERNELS = ("transpose", "layout_transform")  # what the vendor path adds at the edges


class SignatureMeter:
    """Seconds of kernels by signature on one target with one kernel source: from the cost
    database, else measured (`measure`) and stored there."""

    def __init__(self, target, kernels: str, meter: Meter, tuning_db: str | None = None,
                 threads: int = 1) -> None:
        self.target = target
        self.kernels = kernels
        self.meter = meter
        self.db = meter.db
        self.tuning_db = tuning_db
        self.tuning = tuning_id(tuning_db)  # cost keys name the tuned records, not the path
        self.threads = threads  # the wide timing's threads (1: one-thread timings only)
        self.measured = 0  # kernels this meter built and timed
        self.failed: dict[str, str] = {}  # signature -> why it could not be measured
        self.wide: dict[str, float] = {}  # signature -> seconds on ``threads`` threads

    def key(self, signature: str, threads: int = 1) -> CostKey:
        return CostKey(str(self.target), f"sig:{signature}", self.tuning,
                       self.kernels,
                       f"threads={threads}/{SIGNATURE_PROTOCOL}{vendor_tag([self.kernels])}")

    def cached(self, kernel: Kernel) -> float | None:
        """The stored one-thread seconds of ``kernel``'s signature (its wide seconds noted in
        ``wide``), or None when either is missing."""
        if self.db is None:
            return None
        one = self.db.get(self.key(kernel.signature))
        if one is not None and self.threads > 1:
            wide = self.db.get(self.key(kernel.signature, self.threads))
            if wide is None:
                return None
            self.wide[kernel.signature] = wide
        return one

    def measure_one(self, graph: Graph, kernel: Kernel) -> float:
        """Build and time ``kernel`` (operators of ``graph``) alone; stored in the database."""
        program, own = self._build(graph, kernel)
        return self._keep(kernel, own, *self._time(program))

    def _build(self, graph: Graph, kernel: Kernel
               ) -> tuple[KernelProgram, Callable[[dict[int, float]], float]]:
        """``kernel``'s operators built as a program of their own, and what of a timing of
        its kernels is the kernel's own (not the layout transposes at its edges)."""
        piece = extract(graph, set(kernel.ops))
        program = build_program(to_relax(piece), self.target, tuning_db=self.tuning_db,
                                kernels=self.kernels)
        own = {graph[i].kind for i in kernel.ops}

        def own_seconds(costs: dict[int, float]) -> float:
            return sum(s for k, s in costs.items()
                       if program.graph[k].kind == "kernel"
                       and not (str(program.graph[k].attrs["func"]).startswith(_EDGE_KERNELS)
                                and "permute_dims" not in own))
        return program, own_seconds

    def _time(self, program: KernelProgram) -> tuple[list[dict[int, float]], bool]:
        """The program's kernel times on one thread (and ``threads``), and whether another
        process held a core meanwhile."""
        counts = [1, self.threads] if self.threads > 1 else [1]
        with LoadWatch() as watch:  # every buffer filled by a real run before timing
            times = self.meter.kernel_times(program, counts, fill=True)
        return times, watch.contended

    def _keep(self, kernel: Kernel, own_seconds: Callable[[dict[int, float]], float],
              times: list[dict[int, float]], contended: bool) -> float:
        """Note a timing of ``kernel`` (stored in the database unless disturbed)."""
        seconds = own_seconds(times[0])
        if self.threads > 1:
            wide = own_seconds(times[1])
            self.wide[kernel.signature] = wide
        self.measured += 1
        if self.db is not None and not contended:  # used now, not kept
            if self.threads > 1:  # first, so a stored one-thread time always has its pair
                self.db.put(self.key(kernel.signature, self.threads), Timing((wide,)))
            self.db.put(self.key(kernel.signature), Timing((seconds,)))
        return seconds

    def _measure_at_once(self, graph: Graph, todo: list[Kernel], parallel: int,
                         deadline: float | None, bar: Progress
                         ) -> dict[str, tuple[Kernel, float]]:
        """``todo`` built here one by one and timed on ``parallel`` devices at once (a pool of
        remote devices, `paragraph.tvm_interop.meter.pool`): a kernel is timed while the next
        is built."""
        out: dict[str, tuple[Kernel, float]] = {}
        done = 0
        with ThreadPoolExecutor(max_workers=parallel) as pool:
            flight: list[tuple[Kernel, Callable[[dict[int, float]], float], Future[Any]]] = []
            for k in todo:
                if deadline is not None and time.monotonic() > deadline:
                    break
                try:
                    program, own = self._build(graph, k)
                except Exception as exc:  # an estimate still prices it; say why once
                    reraise_interrupt(exc)
                    self.failed[k.signature] = f"{type(exc).__name__}: {exc}"
                    continue
                flight.append((k, own, pool.submit(self._time, program)))
            for k, own, future in flight:
                try:
                    out[k.signature] = (k, self._keep(k, own, *future.result()))
                except Exception as exc:
                    reraise_interrupt(exc)
                    self.failed[k.signature] = f"{type(exc).__name__}: {exc}"
                done += 1
                bar.update(done)
        return out

    def seconds(self, graph: Graph, kernels: Iterable[Kernel], *, measure: bool = True,
                deadline: float | None = None,
                progress: Log | None = None
                ) -> dict[str, tuple[Kernel, float]]:
        """Seconds of each distinct signature among ``kernels`` (operators of ``graph``):
        cached, else (``measure``, before ``deadline`` on `time.monotonic`) measured. Views
        cost nothing and are not measured; a kernel that cannot be built is left out (and
        noted in ``failed``): the estimate prices it."""
        out: dict[str, tuple[Kernel, float]] = {}
        todo: list[Kernel] = []
        for k in kernels:
            if k.signature in out or k.signature in self.failed or k.flops == k.nbytes == 0.0:
                continue
            s = self.cached(k)
            if s is not None:
                out[k.signature] = (k, s)
            elif measure and k.signature not in {t.signature for t in todo}:
                todo.append(k)
        if todo and progress is not None:
            progress(f"  cost model: measuring {len(todo)} new kernel signatures (1"
                     f"{f' and {self.threads}' if self.threads > 1 else ''} thread) ...")
        bar = Progress(progress, "cost model: measured", len(todo), least=8)
        parallel = int(getattr(self.meter, "parallel", 1))
        if parallel > 1 and len(todo) > 1:
            out.update(self._measure_at_once(graph, todo, parallel, deadline, bar))
            return out
        for i, k in enumerate(todo):
            if deadline is not None and time.monotonic() > deadline:
                break
            try:
                out[k.signature] = (k, self.measure_one(graph, k))
            except Exception as exc:  # an estimate still prices it; say why once
                reraise_interrupt(exc)
                self.failed[k.signature] = f"{type(exc).__name__}: {exc}"
            bar.update(i + 1)
        return out

