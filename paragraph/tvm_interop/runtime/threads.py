"""Worker threads and thread counts: the primitives the executor, the measurements and the
vendor kernels share (a leaf: it imports no other part of `tvm_interop`).

TVM gives every thread that runs a parallel kernel (or sizes its pool) a thread pool of its own
that outlives the thread (``runtime.config_threadpool`` is per calling thread), so paragraph
never ends a worker: executors and measurements borrow workers from a process-wide pool
(`acquire_workers`) and give them back. `config_threads` sizes the calling thread's pool and
records the count, which vendor kernels read (`configured_threads`) to run torch with the same
number of threads. While streams fit the cores, each can be bound to cores of its own
(`stream_cores`, `pinned`), and a stream's OpenMP team one thread per core (`stream_teams`).
"""

from __future__ import annotations

import os
import queue
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial

import numpy as np
import tvm_ffi

from paragraph.machine import cpu_count, process_cpus

PIN_ENV = "PARAGRAPH_PIN"
_local = threading.local()
_warned_cap: list[int] = []
_warned_pin: list[OSError] = []


def config_threads(n: int) -> None:
    """Size the calling thread's TVM thread pool (kBig affinity mode), if it changed; warn
    once if TVM caps it lower (``TVM_NUM_THREADS``)."""
    if getattr(_local, "threads", None) != n:
        tvm_ffi.get_global_func("runtime.config_threadpool")(1, n)
        _local.threads = n
        got = tvm_ffi.get_global_func("runtime.NumThreads")()
        if got < n and not _warned_cap:
            _warned_cap.append(n)
            warnings.warn(f"TVM runs at most {got} thread(s) per pool here, not {n}; set "
                          "TVM_NUM_THREADS before TVM starts", RuntimeWarning, stacklevel=3)


def configured_threads() -> int | None:
    """The thread count `config_threads` gave the calling thread's pool (None: never sized,
    e.g. the TVM VM's caller)."""
    return getattr(_local, "threads", None)


def fits_cores(threads: Sequence[int]) -> bool:
    """Whether streams with these thread counts can all run at once on the process's cores."""
    return sum(threads) <= cpu_count()


def on_caller(threads: Sequence[int]) -> bool:
    """Whether work with these per-stream thread counts runs on the calling thread: one
    stream on every core. libgomp spins an idle OpenMP worker (saving a multi-thread vendor
    call its wake-up) only while the process's OpenMP teams fit the cores, and every thread
    that ran a multi-thread region keeps its team for life; the caller's (its vendor binding,
    the TVM VM, torch) is then the only team, and its thread counts are the machine's
    already."""
    return len(threads) == 1 and threads[0] >= cpu_count()


def stream_cores(threads: Sequence[int]) -> list[frozenset[int]] | None:
    """Disjoint cores for each stream, as many as its threads, or None: for one stream (the OS
    may move it off a busy core), where the threads do not fit the process's cores, off Linux,
    or with ``PARAGRAPH_PIN=0``.

    Bound, a stream keeps its core whatever the OS would do with a worker that wakes from a
    wait. Side by side on the shared 2-core VM, inception_v3 on two 1-thread streams ran
    5-12% faster bound than unbound in busy phases, and the same in quiet ones."""
    if (len(threads) < 2 or os.environ.get(PIN_ENV, "1") == "0"
            or not hasattr(os, "sched_setaffinity")):
        return None
    if not fits_cores(threads):
        return None
    cores = sorted(process_cpus())
    starts = np.cumsum([0, *threads])
    return [frozenset(cores[a:b]) for a, b in zip(starts[:-1], starts[1:], strict=True)]


def stream_teams(threads: Sequence[int]) -> list[list[int] | None] | None:
    """Per stream of two threads or more, the cores its OpenMP team is bound to, one thread
    each (its own cores of `stream_cores`, or every core for one stream on every core), else
    None; None for all where nothing is bound (off Linux, ``PARAGRAPH_PIN=0``, or streams that
    do not fit the cores). Unbound, after a pause (a server between requests) the OS often
    woke a run's OpenMP worker on its caller's core and kept the two there: on the 2-core VM a
    BERT encoder ran 5.5-6 ms a request instead of 0.9, ResNet-50 22-38 ms instead of 16."""
    if os.environ.get(PIN_ENV, "1") == "0" or not hasattr(os, "sched_setaffinity"):
        return None
    if on_caller(threads) and threads[0] == cpu_count() >= 2:
        return [sorted(process_cpus())]
    cores = stream_cores(threads)
    if cores is None:
        return None
    return [sorted(c) if len(c) >= 2 else None for c in cores]


def _bind(cores: frozenset[int] | None) -> bool:
    """Bind the calling thread to ``cores`` (None: every core of the process); False, with a
    warning the first time, where the CPU set cannot be had (hotplug, a cgroup changed)."""
    try:
        os.sched_setaffinity(0, process_cpus() if cores is None else cores)
        return True
    except OSError as exc:
        if not _warned_pin:
            _warned_pin.append(exc)
            warnings.warn(f"cannot bind a stream to CPUs {sorted(cores or ())} ({exc}); streams "
                          "run unbound", RuntimeWarning, stacklevel=3)
        return False


@contextmanager
def pinned(cores: frozenset[int] | None) -> Iterator[None]:
    """Bind the calling thread to ``cores`` for the block, then give it back every core of
    the process (the caller's thread is the user's). None: unchanged."""
    if cores is None or not _bind(cores):
        yield
        return
    try:
        yield
    finally:
        _bind(None)


class Worker:
    """A persistent thread that runs the tasks given to it, one at a time (see the module
    docstring for why it never ends), bound to the cores each task asks for (every core of the
    process where it asks for none). The binding outlives the task: a worker that sleeps
    bound to its stream's core is woken there. Unbound between runs, after a pause the OS
    often woke a stream's worker on the core of the stream that woke it, where it waited for
    a time slice: NASNet-A mobile's second stream began its first kernel 1.4 ms after it
    could, and runs after 50 ms pauses took 9.58 ms unbound against 9.19 bound (p90 11.0
    against 9.7)."""

    def __init__(self, index: int) -> None:
        self.tasks: queue.SimpleQueue = queue.SimpleQueue()
        self.cores: frozenset[int] | None = None  # bound to these; None: every core
        self.thread = threading.Thread(target=self._loop, name=f"paragraph-worker-{index}",
                                       daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            task, cores = self.tasks.get()
            if cores != self.cores:
                self.cores = cores if _bind(cores) else None
                if cores is not None and self.cores is None:
                    _bind(None)  # not left on a stale binding of an earlier task
            try:
                task()
            except BaseException:  # noqa: S110 - tasks report their own errors; keep serving
                pass

    def submit(self, task: Callable[[], object], cores: frozenset[int] | None = None) -> None:
        """Run ``task`` on this worker, bound to ``cores`` (None: every core)."""
        self.tasks.put((task, cores))


_IDLE: list[Worker] = []
_ALL: list[Worker] = []
_POOL_LOCK = threading.Lock()


def acquire_workers(n: int) -> list[Worker]:
    """``n`` workers for this caller alone until `release_workers`."""
    with _POOL_LOCK:
        while len(_IDLE) < n:
            w = Worker(len(_ALL))
            _ALL.append(w)
            _IDLE.append(w)
        taken, _IDLE[:] = _IDLE[:n], _IDLE[n:]
    return taken


def release_workers(workers: list[Worker]) -> None:
    with _POOL_LOCK:
        _IDLE.extend(workers)


def on_workers(tasks: Sequence[Callable[[], None]], threads: Sequence[int] | None = None
               ) -> None:
    """Run each task on its own borrowed worker (none on the caller: a thread's pool size
    sticks, see the module docstring), wait for all, and re-raise the first error; one task
    on every core (``threads``, per task) runs on the caller (`on_caller`)."""
    if threads is not None and on_caller(threads):
        tasks[0]()
        return
    errors: list[BaseException] = []
    done = [threading.Event() for _ in tasks]

    def guarded(task: Callable[[], None], ev: threading.Event) -> None:
        try:
            task()
        except BaseException as exc:  # re-raised below, after every task ended
            errors.append(exc)
        finally:
            ev.set()

    workers = acquire_workers(len(tasks))
    try:
        for w, task, ev in zip(workers, tasks, done, strict=True):
            w.submit(partial(guarded, task, ev))
        for ev in done:
            ev.wait()
    finally:
        release_workers(workers)
    if errors:
        raise errors[0]
