"""The parallel executor: runs a `KernelProgram` under a `Schedule` (IOS, Nimble, Opara runtimes).

* CPU: one worker thread per stream, each waiting for its cross-stream producers; each worker's
  TVM thread pool (and torch's thread count, for vendor kernels) is sized by the schedule
  (``runtime.config_threadpool``). A stream runs on a worker the executor holds for its
  lifetime, not on the calling thread: a thread's pool size sticks (the caller's TVM VM would
  inherit a 1-thread stream's), and changing torch's thread count clears oneDNN's primitive
  cache, so each thread keeps one count. The exception is one stream on every core (the
  sequential schedule, critical-path's one-stream choice): it runs on the calling thread, whose
  counts are already the machine's. libgomp spins an idle OpenMP worker (and so saves a
  wake-up of 45-80 us a multi-thread vendor call) only while the process's OpenMP teams fit the
  cores, and every thread that ran a multi-thread region keeps a team for life; the caller's
  own (its vendor binding, the TVM VM, torch) is then the only one, and a run saves the two
  thread hand-offs. ResNet-50 on one 2-thread stream: 42.6-44.0 -> 40.0-40.9 ms (see
  ``paragraph/__init__.py`` on the spin count). A worker runs its stream in the native runner
  (`native`: C++, no GIL, a wait spins on an atomic flag before it sleeps, while the streams'
  threads fit the cores) or, without a C++ compiler, in Python (waits on ``threading.Event``;
  TVM releases the GIL inside kernels). Vendor kernels bound in Python take the GIL.
  While the streams' threads fit the cores, each worker is bound to cores of its own for the
  run (`stream_cores`; ``PARAGRAPH_PIN=0`` turns that off), and a stream of several threads
  binds its OpenMP team one thread per core of its own (`stream_teams`): unbound, after a pause
  the OS often put a run's caller and its OpenMP worker on one core, and kept them there.
* CUDA: one stream per schedule stream, a persistent event per cross-stream producer, and the
  whole run captured once into a CUDA Graph (fork from the capture stream, join at the end,
  Opara section B7) and replayed with inputs copied into static buffers; ``use_cuda_graph=False``
  issues the same stream program directly (for debugging).

Buffers come from a concurrency-safe memory plan (`memory.plan_memory`) and are bound once, so a
run only copies inputs in, launches prebound kernels, and copies outputs out.
"""

from __future__ import annotations

import ctypes
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial
from types import FrameType

import numpy as np
import tvm
import tvm_ffi

from paragraph.errors import InputError, ParagraphError
from paragraph.graph import TensorRef
from paragraph.inputs import check_index_ranges, sample_inputs
from paragraph.schedule import Schedule
from paragraph.timing import Timing
from paragraph.tvm_interop.runtime import native as _native
from paragraph.tvm_interop.runtime.library import native as native_vendor
from paragraph.tvm_interop.runtime.library import torch_kernels as vendor
from paragraph.tvm_interop.runtime.memory import MemoryPlan, check_fits, plan_memory
from paragraph.tvm_interop.runtime.program import KernelProgram
from paragraph.tvm_interop.runtime.threads import (
    acquire_workers,
    config_threads,
    fits_cores,
    on_caller,
    pinned,
    release_workers,
    stream_cores,
    stream_teams,
)


class KernelError(ParagraphError):
    """A kernel failed while running; the message names it."""


@dataclass
class Step:
    """One kernel (or view, ``fn`` None) with its prebound arguments and synchronisation."""

    node: int
    name: str
    fn: Callable[..., object] | None
    args: tuple
    waits: tuple[int, ...]  # producers on other streams (or earlier stages) to wait for
    signals: bool  # whether another stream waits for this one


def sync_points(schedule: Schedule) -> dict[int, tuple[int, ...]]:
    """Per kernel, what it must wait for: the schedule's waits plus, at each stage barrier, the
    last kernel of every stream in the previous stage (stream order covers the rest)."""
    waits = {k: list(v) for k, v in schedule.waits.items()}
    if schedule.stages:
        stream_of = schedule.stream_of
        pos = {k: i for ks in schedule.streams for i, k in enumerate(ks)}
        for prev, stage in zip(schedule.stages, schedule.stages[1:], strict=False):  # pairs
            last: dict[int, int] = {}
            for k in prev:
                s = stream_of[k]
                if s not in last or pos[k] > pos[last[s]]:
                    last[s] = k
            first: dict[int, int] = {}
            for k in stage:
                s = stream_of[k]
                if s not in first or pos[k] < pos[first[s]]:
                    first[s] = k
            for s, k in first.items():
                waits.setdefault(k, [])
                waits[k] += [p for t, p in last.items() if t != s and p not in waits[k]]
    return {k: tuple(v) for k, v in waits.items() if v}


def _view(base: tvm.runtime.Tensor, t, offset: int) -> tvm.runtime.Tensor:
    """A tensor of type ``t`` over ``base``'s bytes from ``offset`` on. TVM's kernels insist on
    byte_offset 0, so an offset view is made by DLPack over host memory (64-byte aligned)."""
    if not offset:
        return base._create_view(t.shape, t.dtype)
    host = np.from_dlpack(base).reshape(-1).view(np.uint8)
    size = int(np.prod(t.shape)) * np.dtype(t.dtype).itemsize
    window = host[offset:offset + size].view(t.dtype).reshape(t.shape)
    return tvm.runtime.from_dlpack(window)


def _weight(value: np.ndarray, device: tvm.runtime.Device) -> tvm.runtime.Tensor:
    """A weight on ``device``: on a CPU the array's own bytes where they suit TVM's kernels
    (C-contiguous, 64-byte aligned: a module constant's, `relax_graph.host_array`), so that
    every executor of a program reads the one copy; otherwise a copy."""
    if (device.dlpack_device_type() == tvm.cpu().dlpack_device_type()
            and value.flags.c_contiguous and value.flags.writeable
            and value.ctypes.data % 64 == 0 and value.dtype != np.bool_):
        try:
            return tvm.runtime.from_dlpack(value)
        except (BufferError, TypeError, RuntimeError):
            pass
    return tvm.runtime.tensor(value, device)


# inputs of at least this size are copied in by the caller's OpenMP team (`_Base._copy_in`):
# MobileNetV3-small's 600 KB image, copied on one thread, took 60 us of a 1.1 ms run; two
# threads ran the model 30 us faster (alternated in one process)
PARALLEL_COPY_BYTES = 256 << 10


class _Base:
    """What both executors share: validation, the memory plan, bound buffers, input checks."""

    _copy_team = 0  # the caller's OpenMP team copies large inputs in (0: memmove)

    def __init__(self, program: KernelProgram, schedule: Schedule,
                 plan: MemoryPlan | None = None) -> None:
        schedule.validate(program.graph)
        self.program, self.schedule = program, schedule
        self.graph = program.graph
        self.device = program.device
        # one run at a time: a run owns the bound buffers, events and the native runner's
        # flags, and `close` waits for it (8 threads sharing one executable without this each
        # got other threads' outputs, silently)
        self._lock = threading.Lock()
        self.plan = plan or plan_memory(self.graph, schedule)
        check_fits(self.graph, self.plan, self.device)  # before allocating any of it
        self._bind_buffers()
        waits = sync_points(schedule)
        signalled = {p for ps in waits.values() for p in ps}
        self.steps: dict[int, Step] = {}
        self.python_kernels = False  # whether a kernel may be a Python function
        self.cpp_vendor_kernels = False  # whether a kernel is one of the C++ vendor kernels
        stream_of = schedule.stream_of
        for k in schedule.kernels:
            cap = schedule.kernel_threads.get(k)
            threads = schedule.threads[stream_of[k]]
            self.steps[k] = self._step(k, min(threads, cap) if cap else threads, cap,
                                       waits.get(k, ()), k in signalled)

    def _step(self, k: int, threads: int, cap: int | None, waits: tuple[int, ...],
              signals: bool) -> Step:
        """Kernel ``k``'s step on this executor's buffers, a vendor kernel bound for
        ``threads`` threads (``cap``: the Python binding's cap, None for none)."""
        node = self.graph[k]
        fn, args = None, ()
        if node.kind == "kernel":
            fn = self.program.function(node)
            outs = [TensorRef(k, i) for i in range(len(node.outputs))]
            args = tuple(self.tensors[r] for r in (*node.inputs, *outs))
            if node.attrs["source"] == "vendor":  # torch views made once, not per call
                # in C++ where it can (no GIL on the stream's thread), else in Python
                bound = native_vendor.bind(node.attrs["func"], args, threads)
                if bound is None:
                    self.python_kernels = True  # Python's, or an extern packed function
                    bound = vendor.bind(node.attrs["func"], args, cap)
                else:
                    self.cpp_vendor_kernels = True
                fn, args = (fn, args) if bound is None else (bound, ())
        return Step(k, node.attrs.get("func") or node.name or node.kind, fn, args, waits,
                    signals)

    def steps_at(self, threads: int) -> dict[int, Step]:
        """The steps with every vendor kernel bound for ``threads`` CPU threads, on the same
        buffers (other steps the same for any count): for timing kernels on another thread
        count than the schedule's, as IOS's stages do. A kernel bound for two threads and run on a
        stream's worker gives that worker an OpenMP team of its own for life, and with more
        teams than cores libgomp stops spinning: after IOS had timed its concurrent stages
        with the 2-thread bindings, a token-id encoder ran 2.7 ms instead of 0.63 on one
        2-thread stream in the same process."""
        if not self.schedule.kernel_threads and set(self.schedule.threads) == {threads}:
            return self.steps
        return {k: self._step(k, threads, threads, st.waits, st.signals)
                for k, st in self.steps.items()}

    def _bind_buffers(self) -> None:
        dev = self.device
        self.blocks = [tvm.runtime.empty((max(b.size, 1),), "uint8", dev)
                       for b in self.plan.blocks]
        self.tensors: dict[TensorRef, tvm.runtime.Tensor] = {}
        self.inputs: list[tvm.runtime.Tensor] = []
        # inputs hold valid samples from the start: kernels timed before any run read them,
        # and an embedding's ids must index its table (TVM's take does not check)
        samples = dict(zip(self.graph.inputs, sample_inputs(
            [self.graph[i].type for i in self.graph.inputs], self.program.input_ranges),
            strict=True))
        for n in self.graph.nodes:
            if n.kind == "input":
                t = tvm.runtime.tensor(samples[n.id], dev)
                self.inputs.append(t)
                self.tensors[n.out] = t
            elif n.kind in ("weight", "constant"):
                assert n.value is not None  # a weight node holds its value
                self.tensors[n.out] = _weight(n.value, dev)
            elif n.kind == "view":  # a reshape, or a contiguous slice (byte offset)
                self.tensors[n.out] = _view(self.tensors[n.inputs[0]], n.type,
                                            n.attrs.get("offset", 0))
            else:
                for i, t in enumerate(n.outputs):
                    ref = TensorRef(n.id, i)
                    self.tensors[ref] = self.blocks[self.plan.block_of[ref]]._create_view(
                        t.shape, t.dtype)
        self._input_specs = [(self.graph[i].type.shape, self.graph[i].type.dtype,
                              self.graph[i].name) for i in self.graph.inputs]
        # numpy views of host input buffers, made once: `_copy_in` writes through them (TVM's
        # copyfrom checks and converts in Python, about 85 us a run on cold caches)
        self._host_inputs: list[np.ndarray] | None = None
        if dev.dlpack_device_type() == tvm.cpu().dlpack_device_type():
            try:
                self._host_inputs = [np.from_dlpack(t) for t in self.inputs]
                self._input_addrs = [v.ctypes.data for v in self._host_inputs]
            except (BufferError, TypeError, ValueError):  # a dtype numpy lacks (bfloat16)
                self._host_inputs = None
        # and of the outputs, which `outputs` copies: TVM's Tensor.numpy() took 55 us a run
        # on cold caches (MobileNetV3-small runs in 1.1 ms), a view's copy 8 us
        self._host_outputs: list[np.ndarray] | None = None
        if self._host_inputs is not None:
            try:
                self._host_outputs = [np.from_dlpack(self.tensors[r])
                                      for r in self.graph.outputs]
            except (BufferError, TypeError, ValueError):
                self._host_outputs = None

    def check_inputs(self, inputs: Sequence[object]) -> None:
        """Raise `InputError` unless ``inputs`` match the graph's inputs in count, shape, dtype,
        and every index an input holds is within what reads it (`paragraph.inputs`)."""
        specs = self._input_specs
        if len(inputs) != len(specs):
            raise InputError(f"the model takes {len(specs)} input(s) "
                             f"({', '.join(repr(name) for _, _, name in specs)}), "
                             f"got {len(inputs)}")
        for k, (arr, (shape, dtype, name)) in enumerate(zip(inputs, specs, strict=True)):
            if not hasattr(arr, "shape") or not hasattr(arr, "dtype"):
                raise InputError(f"input {k} ({name!r}) must be an array of {dtype}"
                                 f"{list(shape)} (numpy or TVM), got a {type(arr).__name__}")
            if isinstance(arr, np.ndarray) and arr.shape == shape and arr.dtype == dtype:
                continue  # the common case, without str(dtype) (1-2 us a run)
            got_shape, got_dtype = tuple(arr.shape), str(arr.dtype)
            if got_shape != shape or got_dtype != dtype:
                raise InputError(f"input {k} ({name!r}) must be {dtype}{list(shape)}, got "
                                 f"{got_dtype}{list(got_shape)}")
        if self.program.input_ranges:
            check_index_ranges(inputs, self.program.input_ranges,
                               [name for _, _, name in specs])

    def _copy_in(self, inputs: Sequence[object], check: bool = True) -> None:
        if check:
            self.check_inputs(inputs)
        views = self._host_inputs
        team = self._copy_team
        for i, (buf, arr) in enumerate(zip(self.inputs, inputs, strict=True)):
            if views is not None and isinstance(arr, np.ndarray) and arr.flags.c_contiguous:
                # shape and dtype checked above. Not np.copyto: in the peers benchmark's
                # process (ONNX Runtime, PyTorch and the TVM VM beside it) the token-id
                # encoder then ran 29.7-30.5 ms a run instead of 25.8-26.2, for a reason not
                # found; a plain memmove of the same bytes does not do that
                dst, src, n = self._input_addrs[i], arr.ctypes.data, arr.nbytes
                if not (team and n >= PARALLEL_COPY_BYTES
                        and native_vendor.copy_bytes(dst, src, n, team)):
                    ctypes.memmove(dst, src, n)
            else:
                buf.copyfrom(arr)

    def outputs(self, copy: bool = True) -> list:
        """The graph outputs of the last run: numpy copies, or the static device tensors."""
        if copy and self._host_outputs is not None:
            return [v.copy() for v in self._host_outputs]
        outs = [self.tensors[r] for r in self.graph.outputs]
        return [t.numpy() for t in outs] if copy else outs

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Release threads, streams and graphs (buffers go with the object)."""


# ---------------------------------------------------------------------------- CPU
_bound = threading.local()  # .team: the cores this thread's OpenMP team is bound to


def _bind_team(team: list[int]) -> None:
    """Bind the calling thread's OpenMP team to ``team`` (`stream_teams`), once per thread
    and team: the binding outlives the run (the caller's own is undone by `pinned`)."""
    if getattr(_bound, "team", None) != team and native_vendor.bind_team(team):
        _bound.team = team


class CPUExecutor(_Base):
    """Worker threads over streams; see the module docstring."""

    def __init__(self, program: KernelProgram, schedule: Schedule,
                 plan: MemoryPlan | None = None, native: bool | None = None) -> None:
        super().__init__(program, schedule, plan)
        self.events = {k: threading.Event() for k, st in self.steps.items() if st.signals}
        self.programs = [[self.steps[k] for k in ks] for ks in schedule.streams]
        self.timeline: dict[int, tuple[int, int, int]] | None = None
        self._error: tuple[Step, str, BaseException | None] | None = None
        self._abort = False
        self._crash: tuple[int, BaseException] | None = None  # a stream failed outside kernels
        self._closed = False
        # one stream on every core runs on the calling thread (module docstring)
        self._on_caller = on_caller(schedule.threads)
        self._interrupts: list[bool] = []  # a Ctrl+C during the caller's stream
        self.native = None if native is False else self._native_program()
        if native and self.native is None:
            raise ParagraphError("the native stream runner is unavailable: "
                                 f"{_native.unavailable_reason()}")
        self._workers = acquire_workers(schedule.num_streams - self._on_caller)
        self._done = [threading.Event() for _ in range(schedule.num_streams)]
        self.cores = stream_cores(schedule.threads)  # per stream, or None: unbound
        self.teams = stream_teams(schedule.threads)  # per stream, or None: OpenMP unbound
        # inputs copied in by the caller's OpenMP team where the caller runs the one stream
        # and its C++ vendor kernels (that team is theirs): a TVM-only program or one of
        # several streams would give the caller a team of its own, spinning beside theirs
        self._copy_team = (schedule.threads[0] if self._on_caller and schedule.threads[0] >= 2
                           and self.cpp_vendor_kernels else 0)

    def _native_program(self) -> _native.StreamProgram | None:
        """The streams for the native runner (None without it). Waits spin only while the
        streams' threads fit the cores: a spinning thread must not take a core from a kernel."""
        module = _native.runner()
        if module is None:
            return None
        slot = {k: i for i, k in enumerate(self.events)}
        # a bound vendor kernel is a Python function: TVM FFI wraps it (it takes the GIL)
        streams = [[(st.fn if st.fn is None or isinstance(st.fn, tvm_ffi.Function)
                     else tvm_ffi.convert(st.fn), st.args, [slot[p] for p in st.waits],
                     slot.get(st.node, -1)) for st in steps] for steps in self.programs]
        spin = _native.SPIN_NS if fits_cores(self.schedule.threads) else 0
        return _native.StreamProgram(module, streams, len(slot), spin)

    def run(self, *inputs: object, copy_outputs: bool = True, profile: bool = False) -> list:
        """Run once; returns the outputs (numpy copies unless ``copy_outputs`` is False: then
        the executor's own tensors, which the next run overwrites).

        Safe from several threads: runs take turns (a lock), and `close` waits for the one in
        flight. With ``profile``, `timeline` maps each kernel to (stream, start ns, end ns).
        """
        with self._lock:
            if self._closed:
                raise ParagraphError("the executor is closed")
            return self._run(inputs, copy_outputs, profile)

    def _run(self, inputs: Sequence[object], copy_outputs: bool, profile: bool) -> list:
        if self._copy_team:  # the caller's team copies them in once it is bound
            self.check_inputs(inputs)
        else:
            self._copy_in(inputs)
        if self.native is not None:
            self.native.reset()  # its own events; the Python ones serve `run_stream` only
        else:  # 163 events cost NASNet-A mobile 130 us a run on cold caches
            for ev in self.events.values():
                ev.clear()
        self._error, self._abort, self._crash = None, False, None
        self.timeline = {} if profile else None
        try:
            if self._on_caller:
                with _noting_interrupts(self._interrupts, self.python_kernels):
                    self._stream_task(0, self._done[0], inputs if self._copy_team else None)
                if self._crash is not None and isinstance(self._crash[1], KeyboardInterrupt):
                    raise self._crash[1]
                if self._interrupts:
                    self._interrupts.clear()
                    raise KeyboardInterrupt
            for s, w in enumerate(self._workers, start=int(self._on_caller)):
                w.submit(partial(self._stream_task, s, self._done[s]), self._binding(s))
            for done in self._done:
                while not done.wait(0.05):  # short waits keep Ctrl+C responsive
                    pass
        except BaseException:
            self._stop_all()
            for done in self._done:
                done.wait()
            raise
        finally:
            for done in self._done:
                done.clear()
        if self._error is not None:
            step, message, exc = self._error
            raise KernelError(f"kernel {step.name!r} (node %{step.node}) failed: {message}") \
                from exc
        if self._crash is not None:
            s, exc = self._crash
            raise ParagraphError(f"stream {s} stopped outside its kernels: "
                                 f"{type(exc).__name__}: {exc}") from exc
        return self.outputs(copy_outputs)

    def _binding(self, s: int) -> frozenset[int] | None:
        """The cores stream ``s``'s thread is bound to: its team's first where its OpenMP
        team is bound, else its own (None: unbound)."""
        team = None if self.teams is None else self.teams[s]
        return frozenset(team[:1]) if team else None if self.cores is None else self.cores[s]

    def _stream_task(self, s: int, done: threading.Event,
                     copy_in: Sequence[object] | None = None) -> None:
        try:
            # after sizing the pool: TVM gives the calling thread every core when it does
            config_threads(self.schedule.threads[s])
            team = None if self.teams is None else self.teams[s]
            # a worker was bound as it took the task (`Worker.submit`), and stays bound; the
            # caller only for the run
            on_caller_thread = s == 0 and self._on_caller
            with pinned(self._binding(s)) if on_caller_thread else nullcontext():
                if team:
                    _bind_team(team)
                if copy_in is not None:  # checked in `_run`; copied by the caller's team
                    # on the caller's core, its team's worker on its own: unbound, after a
                    # pause the caller may wake on the worker's core and the two copy there
                    self._copy_in(copy_in, check=False)
                if self.native is None:
                    self.run_stream(s)
                else:
                    self._run_native(s)
        except BaseException as exc:  # not a kernel's error: stop every stream, raise in run()
            if self._crash is None:
                self._crash = (s, exc)
            self._stop_all()
        finally:
            done.set()

    def _run_native(self, s: int) -> None:
        """Run stream ``s`` in the native runner; note its error and timeline."""
        assert self.native is not None  # only called with the native runner
        stopped = self.native.run(s, self.timeline is not None)
        if stopped >= 0 and self._error is None:
            self._error = (self.programs[s][stopped], self.native.error(s), None)
        if self.timeline is not None:
            times = self.native.times(s)
            for i, step in enumerate(self.programs[s]):
                if step.fn is not None:
                    self.timeline[step.node] = (s, times[2 * i], times[2 * i + 1])

    def run_stream(self, s: int) -> None:
        """Run stream ``s``'s kernels in order, waiting for cross-stream producers."""
        events, timeline = self.events, self.timeline
        for step in self.programs[s]:
            for p in step.waits:
                events[p].wait()
            if self._abort:
                return
            if step.fn is not None:
                start = time.perf_counter_ns() if timeline is not None else 0
                try:
                    step.fn(*step.args)
                except BaseException as exc:  # stop every stream, report in run()
                    if self._error is None:
                        self._error = (step, f"{type(exc).__name__}: {exc}", exc)
                    self._stop_all()
                    return
                if timeline is not None:
                    timeline[step.node] = (s, start, time.perf_counter_ns())
            if step.signals:
                events[step.node].set()

    def _stop_all(self) -> None:
        self._abort = True
        if self.native is not None:
            self.native.abort()
        for ev in self.events.values():
            ev.set()

    def close(self) -> None:
        """Give the workers back (they stay alive for the next executor), after the run in
        flight, if any."""
        with self._lock:
            if not self._closed:
                self._closed = True
                release_workers(self._workers)
                self._workers = []
                if self.native is not None:
                    self.native.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


# ---------------------------------------------------------------------------- CUDA
def cudart():
    """CUDA's runtime API (cuda-bindings, the optional ``cuda`` extra)."""
    try:
        from cuda.bindings import runtime  # optional: only the CUDA executor needs it
    except ImportError:
        raise ParagraphError("the CUDA executor needs cuda-bindings "
                             "(`pip install paragraph[cuda]`)") from None
    return runtime


def cuda_check(result):
    """Unwrap a cuda-bindings ``(error, value...)`` tuple, raising on an error."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise ParagraphError(f"CUDA error {err}")
    return values[0] if len(values) == 1 else (values or None)


class CUDAExecutor(_Base):
    """Streams, events and one captured CUDA Graph; see the module docstring."""

    def __init__(self, program: KernelProgram, schedule: Schedule,
                 plan: MemoryPlan | None = None, *, use_cuda_graph: bool = True) -> None:
        super().__init__(program, schedule, plan)
        rt = self.rt = cudart()
        self.streams = [cuda_check(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking))
                        for _ in schedule.streams]
        flags = rt.cudaEventDisableTiming
        self.events = {k: cuda_check(rt.cudaEventCreateWithFlags(flags))
                       for k, st in self.steps.items() if st.signals}
        self.fork = cuda_check(rt.cudaEventCreateWithFlags(flags))
        self.joins = [cuda_check(rt.cudaEventCreateWithFlags(flags)) for _ in self.streams]
        self.stream_of = schedule.stream_of
        self.order = schedule.launch_order or tuple(schedule.kernels)
        self.graph_exec = self.cuda_graph = None
        self._issue_all()  # warm-up: loads every kernel's module before any capture
        cuda_check(rt.cudaStreamSynchronize(self.streams[0]))
        if use_cuda_graph:
            self._capture()

    def _issue_all(self) -> None:
        """Fork from stream 0, issue every kernel on its stream with its waits, join back."""
        rt, s0 = self.rt, self.streams[0]
        cuda_check(rt.cudaEventRecord(self.fork, s0))
        for s in self.streams[1:]:
            cuda_check(rt.cudaStreamWaitEvent(s, self.fork, 0))
        for k in self.order:
            step, stream = self.steps[k], self.streams[self.stream_of[k]]
            for p in step.waits:
                cuda_check(rt.cudaStreamWaitEvent(stream, self.events[p], 0))
            if step.fn is not None:
                self.device.set_raw_stream(int(stream))
                try:
                    step.fn(*step.args)
                except Exception as exc:
                    raise KernelError(f"kernel {step.name!r} (node %{k}) failed to launch: "
                                      f"{exc}") from exc
            if step.signals:
                cuda_check(rt.cudaEventRecord(self.events[k], stream))
        for s, ev in zip(self.streams[1:], self.joins[1:], strict=True):
            cuda_check(rt.cudaEventRecord(ev, s))
            cuda_check(rt.cudaStreamWaitEvent(s0, ev, 0))
        self.device.set_raw_stream(0)

    def _capture(self) -> None:
        rt, s0 = self.rt, self.streams[0]
        mode = rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        cuda_check(rt.cudaStreamBeginCapture(s0, mode))
        try:
            self._issue_all()
        finally:
            self.cuda_graph = cuda_check(rt.cudaStreamEndCapture(s0))
        self.graph_exec = cuda_check(rt.cudaGraphInstantiate(self.cuda_graph, 0))

    def kernel_seconds(self, order: Sequence[int], *, repeat: int = 10,
                       warmup: int = 2) -> list[Timing]:
        """GPU seconds of each kernel of ``order`` (executor nodes, topological) run in that
        order on one stream: captured once into a CUDA Graph with a timing event recorded
        between kernels, replayed ``warmup`` + ``repeat`` times, each kernel's time the
        elapsed time between its two events. This is what a kernel costs under the executor's
        own graph replay; timed from the host with a sync after each launch it cost the launch
        and the sync too (NASNet-A mobile's 459 kernels summed to 26.7 ms on an H100, where
        one graph replay of them all took 3.9 ms), which drowned every kernel-level
        difference the search prices."""
        rt, s0 = self.rt, self.streams[0]
        # recorded as graph nodes (external), and able to time (no DisableTiming flag)
        marks = [cuda_check(rt.cudaEventCreate()) for _ in range(len(order) + 1)]
        graph = graph_exec = None
        try:
            external = rt.cudaEventRecordExternal
            cuda_check(rt.cudaStreamBeginCapture(
                s0, rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal))
            try:
                cuda_check(rt.cudaEventRecordWithFlags(marks[0], s0, external))
                self.device.set_raw_stream(int(s0))
                for i, k in enumerate(order):
                    step = self.steps[k]
                    if step.fn is not None:
                        step.fn(*step.args)
                    cuda_check(rt.cudaEventRecordWithFlags(marks[i + 1], s0, external))
            finally:
                self.device.set_raw_stream(0)
                graph = cuda_check(rt.cudaStreamEndCapture(s0))
            graph_exec = cuda_check(rt.cudaGraphInstantiate(graph, 0))
            samples = np.zeros((repeat, len(order)))
            for r in range(warmup + repeat):
                cuda_check(rt.cudaGraphLaunch(graph_exec, s0))
                cuda_check(rt.cudaStreamSynchronize(s0))
                if r >= warmup:
                    samples[r - warmup] = [
                        cuda_check(rt.cudaEventElapsedTime(a, b)) * 1e-3
                        for a, b in zip(marks, marks[1:], strict=False)]
        finally:
            if graph_exec is not None:
                rt.cudaGraphExecDestroy(graph_exec)
            if graph is not None:
                rt.cudaGraphDestroy(graph)
            for ev in marks:
                rt.cudaEventDestroy(ev)
        return [Timing(tuple(map(float, col))) for col in samples.T]

    def run(self, *inputs: object, copy_outputs: bool = True) -> list:
        """Copy inputs in, replay the CUDA Graph (or issue the streams), wait, return outputs.
        Runs from several threads take turns, as on the CPU."""
        with self._lock:
            if self.rt is None:
                raise ParagraphError("the executor is closed")
            self._copy_in(inputs)
            if self.graph_exec is not None:
                cuda_check(self.rt.cudaGraphLaunch(self.graph_exec, self.streams[0]))
            else:
                self._issue_all()
            cuda_check(self.rt.cudaStreamSynchronize(self.streams[0]))
            return self.outputs(copy_outputs)

    def close(self) -> None:
        """Destroy the graph, events and streams, after the run in flight, if any."""
        lock = getattr(self, "_lock", None)
        with lock if lock is not None else nullcontext():
            self._release()

    def _release(self) -> None:
        rt = getattr(self, "rt", None)
        if rt is None:
            return
        if self.graph_exec is not None:
            rt.cudaGraphExecDestroy(self.graph_exec)
            rt.cudaGraphDestroy(self.cuda_graph)
        for ev in [*self.events.values(), self.fork, *self.joins]:
            rt.cudaEventDestroy(ev)
        for s in self.streams:
            rt.cudaStreamDestroy(s)
        self.rt = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


@contextmanager
def _noting_interrupts(interrupts: list[bool], python_kernels: bool) -> Iterator[None]:
    """Note in ``interrupts`` a Ctrl+C during the block (Python's own handler still raises):
    one landing inside a Python kernel reaches the caller as that kernel's failure (TVM FFI
    turns it into an empty RuntimeError), and `run` raises KeyboardInterrupt after all. Only
    where kernels may be Python functions (swapping the handler costs ~8 us a run), on the
    main thread, where the handler is Python's default: elsewhere a Ctrl+C lands in the
    executor's own Python code after a kernel returns."""
    if (not python_kernels or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        interrupts.append(True)
        signal.default_int_handler(signum, frame)
    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def make_executor(program: KernelProgram, schedule: Schedule, *, use_cuda_graph: bool = True,
                  plan: MemoryPlan | None = None) -> CPUExecutor | CUDAExecutor:
    """The executor for the program's device: `CUDAExecutor` on a GPU, else `CPUExecutor`."""
    if program.device.dlpack_device_type() == tvm.cuda(0).dlpack_device_type():
        return CUDAExecutor(program, schedule, plan, use_cuda_graph=use_cuda_graph)
    return CPUExecutor(program, schedule, plan)


def gpu_available() -> bool:
    """Whether a CUDA GPU is visible to TVM (the GPU executor's tests skip otherwise)."""
    try:
        return bool(tvm.cuda(0).exist)
    except Exception:
        return False


__all__ = ["CPUExecutor", "CUDAExecutor", "KernelError", "InputError", "make_executor",
           "sync_points", "gpu_available"]
