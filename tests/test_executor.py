"""The kernel graph, schedules, the concurrency-safe memory plan and the parallel executor."""

import _thread
import gc
import os
import signal
import threading
import time

import numpy as np
import psutil
import pytest
import tvm
import tvm_ffi
from conftest import zoo_for_schedules
from tvm import relax

from paragraph import models
from paragraph.errors import ParagraphError
from paragraph.graph import TensorRef
from paragraph.machine import cpu_count, process_cpus
from paragraph.passes.schedule import (
    ALGORITHMS,
    critical_path,
    make_schedule,
    nimble,
    opara,
    wavefront,
)
from paragraph.schedule import Schedule, ScheduleError
from paragraph.tvm_interop import random_inputs
from paragraph.tvm_interop.build import compiled
from paragraph.tvm_interop.build.program import build_program
from paragraph.tvm_interop.measure.device import kernel_costs
from paragraph.tvm_interop.runtime import native, threads
from paragraph.tvm_interop.runtime.executor import (
    CPUExecutor,
    InputError,
    KernelError,
    gpu_available,
    make_executor,
)
from paragraph.tvm_interop.runtime.memory import check_memory_plan, plan_memory, vm_planned_bytes
from paragraph.tvm_interop.runtime.native import SPIN_NS
from paragraph.tvm_interop.runtime.program import KernelProgram
from paragraph.tvm_interop.runtime.target import is_gpu, resolve_target
from paragraph.tvm_interop.runtime.threads import acquire_workers, release_workers, stream_cores
from paragraph.tvm_interop.runtime.vm import run_vm

_PROGRAMS: dict[str, KernelProgram] = {}


def program_for(name: str) -> KernelProgram:
    """Each reduced zoo model is lowered and compiled once per test session."""
    if name not in _PROGRAMS:
        _PROGRAMS[name] = build_program(models.get(name, reduced=True), "llvm")
    return _PROGRAMS[name]


@pytest.mark.parametrize("name", zoo_for_schedules())
def test_every_schedule_matches_the_vm(name):
    program = program_for(name)
    mod_inputs = random_inputs(program.lowered, seed=1)
    expected = run_vm(program.vm(), mod_inputs)
    for algorithm in ALGORITHMS:
        schedule = make_schedule(algorithm, program.graph)
        with make_executor(program, schedule) as executor:
            check_memory_plan(program.graph, schedule, executor.plan)
            assert executor.plan.peak_bytes <= executor.plan.no_reuse_bytes
            for _ in range(2):  # a second run reuses every buffer
                got = executor.run(*mod_inputs)
                assert len(got) == len(expected)
                for g, e in zip(got, expected, strict=True):
                    np.testing.assert_array_equal(g, e, err_msg=f"{name}/{algorithm}")


def test_kernel_graph_is_fused_and_annotated():
    program = program_for("inception_v3")
    kinds = {n.kind for n in program.graph.nodes}
    assert kinds <= {"input", "weight", "constant", "kernel", "view"}
    kernels = [n for n in program.graph.nodes if n.kind == "kernel"]
    assert any(n.attrs["func"].startswith("fused_") for n in kernels)
    assert all(n.attrs["flops"] >= 0 and n.attrs["hash"] for n in kernels)
    convs = [n for n in kernels if "conv2d" in n.attrs["func"]]
    assert len(convs) == 94  # every convolution of Inception-v3 is its own (fused) kernel
    assert all(n.attrs["flops"] > 0 for n in convs)


def test_memory_plan_reports_against_vm_and_checker_catches_races():
    program = program_for("inception_v3")
    schedule = make_schedule("opara", program.graph)
    plan = plan_memory(program.graph, schedule)
    check_memory_plan(program.graph, schedule, plan)
    assert plan.peak_bytes < plan.no_reuse_bytes
    assert vm_planned_bytes(program.lowered) > 0
    # force two tensors that run on different streams without ordering into one block
    before = schedule.happens_before()
    index = {k: i for i, k in enumerate(schedule.kernels)}
    kernels = [n.id for n in program.graph.nodes if n.kind == "kernel"]
    a, b = next((x, y) for x in kernels for y in kernels if x != y
                and not before[y] >> index[x] & 1 and not before[x] >> index[y] & 1)
    plan.block_of[TensorRef(b, 0)] = plan.block_of[TensorRef(a, 0)]
    with pytest.raises(ScheduleError, match="live at the same time"):
        check_memory_plan(program.graph, schedule, plan)


# ---------------------------------------------------------------------------- schedules
def weight(*shape):
    return relax.const(np.random.default_rng(0).standard_normal(shape).astype("float32"))


def diamond_program():
    """x -> three independent matmul branches (one two long) -> concat: a DAG of width 3."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.matmul(x, weight(8, 8)))
            b = bb.emit(relax.op.matmul(x, weight(8, 8)))
            c = bb.emit(relax.op.matmul(x, weight(8, 8)))
            a2 = bb.emit(relax.op.matmul(a, weight(8, 8)))
            out = bb.emit_output(relax.op.concat([a2, b, c], axis=1))
        bb.emit_func_output(out)
    return build_program(bb.get(), "llvm")


def test_schedule_algorithms_on_a_small_graph():
    program = diamond_program()
    g = program.graph
    assert nimble(g).num_streams == 3  # width of the DAG
    assert opara(g).num_streams == 3  # one new stream per root, the chain keeps its stream
    w = wavefront(g)
    assert [len(s) for s in w.stages] == [3, 1, 1]
    w2 = wavefront(g, max_per_stage=2)
    assert max(len(s) for s in w2.stages) == 2
    for algorithm in ALGORITHMS:
        s = make_schedule(algorithm, g)
        again = Schedule.from_json(s.dumps(), g)
        assert again == s


def test_critical_path_packs_branches_around_the_longest_path():
    g = diamond_program().graph
    kernels = [n.id for n in g.nodes if n.kind == "kernel"]
    cost = {k: 1.0 for k in kernels}
    two = critical_path(g, cost=cost, streams=2, cores=2)
    two.validate(g)
    assert two.num_streams == 2 and two.threads == (1, 1)
    # the chain x -> a -> a2 -> concat sets the length; b and c fit beside it
    assert two.info["predicted"] == pytest.approx(two.info["critical_path"])
    assert two.info["predicted"] < len(kernels)
    one = critical_path(g, cost=cost, streams=1)
    assert one.num_streams == 1 and one.info["predicted"] == pytest.approx(len(kernels))
    # a hand-off dearer than the work keeps every consumer on its producer's stream
    costly = critical_path(g, cost=cost, streams=2, cores=2, handoff=10.0)
    costly.validate(g)
    assert sum(map(len, costly.waits.values())) <= sum(map(len, two.waits.values()))
    assert costly.info["predicted"] <= len(kernels) + 10.0


def test_schedule_validation_errors():
    program = diamond_program()
    g = program.graph
    kernels = [n.id for n in g.nodes if not n.is_source]
    with pytest.raises(ScheduleError, match="missing"):
        Schedule.build(g, [kernels[:-1]])
    with pytest.raises(ScheduleError, match="may start before its producer"):
        Schedule.build(g, [kernels[::-1]])
    seq = make_schedule("sequential", g)
    with pytest.raises(ScheduleError, match="twice"):
        Schedule(seq.streams + ((kernels[0],),), (1, 1), {}).validate(g)
    # two streams that wait for each other's later kernels deadlock
    relu, sig = kernels[0], kernels[1]
    exp_ = next(k for k in kernels if k not in (relu, sig) and g[k].inputs[0].node == relu)
    rest = [k for k in kernels if k not in (relu, sig, exp_)]
    bad = Schedule(((exp_, sig), (relu, *rest)), (1, 1), {exp_: (relu,), relu: (sig,)})
    with pytest.raises(ScheduleError, match="deadlock"):
        bad.validate(g)
    with pytest.raises(ScheduleError, match="corrupt schedule"):
        Schedule.from_json('{"format": "paragraph-schedule", "version": 1}')
    with pytest.raises(ScheduleError, match="not a paragraph-schedule"):
        Schedule.from_json('{"format": "other"}')
    other = program_for("squeezenet1_1").graph
    with pytest.raises(ScheduleError, match="different kernel graph"):
        Schedule.from_json(seq.dumps(), other)


# ---------------------------------------------------------------------------- errors
def test_wrong_inputs_are_rejected_before_running():
    program = diamond_program()
    with make_executor(program, make_schedule("nimble", program.graph)) as ex:
        good = np.ones((4, 8), "float32")
        with pytest.raises(InputError, match="takes 1 input"):
            ex.run(good, good)
        with pytest.raises(InputError, match=r"float32\[4, 8\], got float32\[4, 9\]"):
            ex.run(np.ones((4, 9), "float32"))
        with pytest.raises(InputError, match="got float64"):
            ex.run(np.ones((4, 8)))
        w = np.random.default_rng(0).standard_normal((8, 8)).astype("float32")
        np.testing.assert_allclose(ex.run(good)[0][:, 8:16], good @ w, rtol=1e-5)


def packed_program(name: str):
    """exp(x @ W) on one branch, the packed function ``name`` on another, then concat."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.matmul(x, weight(8, 8)))
            a = bb.emit(relax.op.exp(a))
            b = bb.emit(relax.call_dps_packed(name, (x,), relax.TensorType((4, 8), "float32")))
            out = bb.emit_output(relax.op.concat([a, b], axis=1))
        bb.emit_func_output(out)
    return build_program(bb.get(), "llvm")


def test_native_runner_builds_here():
    """With a C++ compiler (as on every machine the Makefile supports) the runner builds, and
    the CPU executor uses it; PARAGRAPH_NATIVE=0 switches it off with a clear reason."""
    if native._compiler() is None:
        pytest.skip("no C++ compiler: the executor runs its streams in Python")
    assert native.runner() is not None, native.unavailable_reason()
    assert native.library_path().exists()
    program = program_for("squeezenet1_1")
    with CPUExecutor(program, make_schedule("nimble", program.graph)) as ex:
        assert ex.native is not None


def test_native_stream_program_runs_and_refuses_use_after_close():
    module = native.runner()
    if module is None:
        pytest.skip(f"no native stream runner: {native.unavailable_reason()}")
    # stream 1 waits for stream 0's first step; no kernels, only the synchronisation
    prog = native.StreamProgram(module, [[(None, (), [], 0), (None, (), [1], -1)],
                                         [(None, (), [0], 1)]], 2, 0)
    prog.reset()
    done = []
    t = threading.Thread(target=lambda: done.append(prog.run(0)))
    t.start()
    assert prog.run(1) == -1
    t.join(10)
    assert done == [-1] and prog.error(0) == ""
    prog.close()
    with pytest.raises(ParagraphError, match="closed"):
        prog.run(0)


def test_native_runner_build_failure_falls_back_to_python(monkeypatch, tmp_path):
    monkeypatch.setenv("PARAGRAPH_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "false")  # a "compiler" that always fails
    monkeypatch.setattr(native, "_state", {})
    with pytest.warns(RuntimeWarning, match="native stream runner is unavailable"):
        assert native.runner() is None
    assert "failed" in native.unavailable_reason()
    program = program_for("squeezenet1_1")
    x = random_inputs(program.lowered)
    with CPUExecutor(program, make_schedule("nimble", program.graph)) as ex:
        assert ex.native is None
        np.testing.assert_allclose(ex.run(*x)[0], run_vm(program.vm(), x)[0], rtol=1e-5,
                                   atol=1e-6)


def test_native_runner_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("PARAGRAPH_NATIVE", "0")
    program = program_for("squeezenet1_1")
    schedule = make_schedule("nimble", program.graph)
    with CPUExecutor(program, schedule) as ex:
        assert ex.native is None
    with pytest.raises(ParagraphError, match="PARAGRAPH_NATIVE=0"):
        CPUExecutor(program, schedule, native=True)


@pytest.mark.parametrize("name", ["inception_v3", "nasnet_a_mobile"])
def test_python_and_native_runners_agree(name, stream_runner):
    program = program_for(name)
    inputs = random_inputs(program.lowered, seed=2)
    expected = run_vm(program.vm(), inputs)
    for algorithm in ("opara", "critical-path", "wavefront"):
        with make_executor(program, make_schedule(algorithm, program.graph)) as ex:
            assert (ex.native is not None) == (stream_runner == "native")
            for _ in range(2):
                for g, e in zip(ex.run(*inputs), expected, strict=True):
                    np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


def test_native_waits_spin_only_when_the_streams_fit_the_cores():
    if native.runner() is None:
        pytest.skip(f"no native stream runner: {native.unavailable_reason()}")
    program = program_for("squeezenet1_1")
    g = program.graph
    streams = make_schedule("nimble", g).streams
    cores = os.cpu_count() or 1
    with CPUExecutor(program, Schedule.build(g, streams, threads=1)) as ex:
        assert ex.native.spin_ns == (SPIN_NS if len(streams) <= cores else 0)
    with CPUExecutor(program, Schedule.build(g, streams, threads=cores)) as ex:
        assert ex.native.spin_ns == 0


def test_failing_kernel_is_named_and_nothing_hangs(stream_runner):
    def fail(x, out):
        raise ValueError("boom")

    tvm_ffi.register_global_func("paragraph_test.fail", fail, override=True)
    program = packed_program("paragraph_test.fail")
    for algorithm in ALGORITHMS:
        with make_executor(program, make_schedule(algorithm, program.graph)) as ex:
            start = time.time()
            with pytest.raises(KernelError, match="boom") as info:
                ex.run(np.ones((4, 8), "float32"))
            assert "'paragraph_test.fail'" in str(info.value)
            assert time.time() - start < 10
            with pytest.raises(KernelError):  # the executor is still usable afterwards
                ex.run(np.ones((4, 8), "float32"))


@pytest.fixture
def sigint_raises():
    """A shell starts background jobs with SIGINT ignored, and Python then installs no
    KeyboardInterrupt handler (so `_thread.interrupt_main` does nothing): put the default
    handler in place for the test, and the previous one back after it."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_keyboard_interrupt_stops_all_workers(sigint_raises, stream_runner):
    calls = []

    def interrupt(x, out):
        calls.append(1)
        if len(calls) == 2:  # the first call is a plain run
            _thread.interrupt_main()
            time.sleep(0.5)
        out.copyfrom(x.numpy())

    tvm_ffi.register_global_func("paragraph_test.interrupt", interrupt, override=True)
    program = packed_program("paragraph_test.interrupt")
    schedule = make_schedule("nimble", program.graph)
    assert schedule.num_streams == 2
    with make_executor(program, schedule) as ex:
        x = np.ones((4, 8), "float32")
        ex.run(x)
        with pytest.raises(KeyboardInterrupt):
            ex.run(x)
        np.testing.assert_array_equal(ex.run(x)[0][:, 8:], x)
    # workers are reused, never ended: TVM keeps each thread's pool alive after it exits
    before = threading.active_count()
    for _ in range(5):
        with make_executor(program, schedule) as ex:
            ex.run(x)
    assert threading.active_count() == before


def test_stream_threads_follow_the_schedule(stream_runner):
    seen = {}

    def probe(x, out):
        seen[threading.current_thread().name] = tvm_ffi.get_global_func("runtime.NumThreads")()
        out.copyfrom(x.numpy())

    tvm_ffi.register_global_func("paragraph_test.probe", probe, override=True)
    program = packed_program("paragraph_test.probe")
    g = program.graph
    s = make_schedule("nimble", g)
    num_threads = tvm_ffi.get_global_func("runtime.NumThreads")
    caller = num_threads()
    for counts in ([1, 2], [2, 1]):
        seen.clear()
        s = Schedule.build(g, s.streams, threads=counts)
        with CPUExecutor(program, s) as ex:
            ex.run(np.ones((4, 8), "float32"))
        stream = s.stream_of[next(n.id for n in g.nodes if n.kind == "kernel"
                                  and n.attrs["source"] == "vendor")]
        assert list(seen.values()) == [s.threads[stream]]
        # every stream runs on a worker: the caller's own TVM pool keeps its size
        assert next(iter(seen)).startswith("paragraph-worker-")
        assert num_threads() == caller


def test_one_stream_on_every_core_runs_on_the_caller(sigint_raises, stream_runner):
    """The caller's OpenMP team is then the process's only one (libgomp spins only while the
    teams fit the cores): the stream runs on the calling thread, other schedules on workers,
    and Ctrl+C there stops the run and leaves the executor usable."""
    seen, interrupt = [], []

    def probe(x, out):
        seen.append(threading.current_thread())
        if interrupt:
            interrupt.clear()
            _thread.interrupt_main()
            time.sleep(0.2)
        out.copyfrom(x.numpy())

    tvm_ffi.register_global_func("paragraph_test.probe_caller", probe, override=True)
    program = packed_program("paragraph_test.probe_caller")
    s = make_schedule("sequential", program.graph)
    assert s.num_streams == 1 and s.threads == (cpu_count(),)
    x = np.ones((4, 8), "float32")
    before = threading.active_count()
    with CPUExecutor(program, s) as ex:
        np.testing.assert_array_equal(ex.run(x)[0][:, 8:], x)
        assert seen == [threading.current_thread()]
        interrupt.append(1)
        with pytest.raises(KeyboardInterrupt):
            ex.run(x)
        np.testing.assert_array_equal(ex.run(x)[0][:, 8:], x)
    assert threading.active_count() == before  # no worker was needed
    if cpu_count() > 1:  # a stream on fewer cores than the machine's keeps to a worker
        seen.clear()
        with CPUExecutor(program, Schedule.build(program.graph, s.streams, threads=1)) as ex:
            ex.run(x)
        assert seen[0].name.startswith("paragraph-worker-")


needs_two_cores = pytest.mark.skipif(
    len(process_cpus()) < 2 or not hasattr(os, "sched_setaffinity"),
    reason="binding streams to cores needs Linux and at least two cores")


@needs_two_cores
def test_stream_cores_are_disjoint_and_only_where_the_streams_fit(monkeypatch):
    cores = sorted(process_cpus())
    assert stream_cores([1, 1]) == [frozenset(cores[:1]), frozenset(cores[1:2])]
    assert stream_cores([1]) is None  # one stream: the OS may move it off a busy core
    assert stream_cores([len(cores), 1]) is None  # more threads than cores
    monkeypatch.setenv("PARAGRAPH_PIN", "0")
    assert stream_cores([1, 1]) is None


def _worker_affinities() -> list[frozenset[int]]:
    """The affinity of every idle pooled worker, read on the worker itself."""
    workers = acquire_workers(len(threads._IDLE))
    try:
        seen, done = [], []
        for w in workers:
            ev = threading.Event()
            w.submit(lambda ev=ev: (seen.append(frozenset(os.sched_getaffinity(0))), ev.set()))
            done.append(ev)
        for ev in done:
            assert ev.wait(10)
        return seen
    finally:
        release_workers(workers)


def probed_program(seen: list[frozenset[int]]):
    """`packed_program` whose packed kernel appends the affinity of the thread that runs it
    to ``seen``."""
    def probe(x, out):
        seen.append(frozenset(os.sched_getaffinity(0)))
        out.copyfrom(x.numpy())

    tvm_ffi.register_global_func("paragraph_test.probe_cores", probe, override=True)
    return packed_program("paragraph_test.probe_cores")


@needs_two_cores
def test_streams_run_on_cores_of_their_own(stream_runner):
    seen: list[frozenset[int]] = []
    program = probed_program(seen)
    g = program.graph
    s = Schedule.build(g, make_schedule("nimble", g).streams, threads=1)
    assert s.num_streams == 2
    probe_stream = s.stream_of[next(n.id for n in g.nodes if n.kind == "kernel"
                                    and n.attrs["source"] == "vendor")]
    with CPUExecutor(program, s) as ex:
        assert ex.cores is not None and not ex.cores[0] & ex.cores[1]
        ex.run(np.ones((4, 8), "float32"))
        assert seen == [ex.cores[probe_stream]]
        # between runs each stream's worker sleeps bound to its core, so that the OS wakes it
        # there (unbound, it was often woken beside the stream that woke it, and waited)
        assert [frozenset(os.sched_getaffinity(w.thread.native_id))
                for w in ex._workers] == ex.cores
    # a task that asks for no cores gets every core back (the next executor, a measurement)
    assert set(_worker_affinities()) == {process_cpus()}


@needs_two_cores
def test_one_stream_on_every_core_binds_its_openmp_team_one_thread_per_core(stream_runner):
    """Unbound, after a pause the OS often put a run's caller and its OpenMP worker on one
    core and kept them there (a BERT-style encoder 0.9 -> 5.8 ms a request, ResNet-50 16 ->
    31-38 ms). The caller is bound to the first core for the run and gets every core back
    after it; the OpenMP worker stays on a core of its own."""
    from paragraph.tvm_interop.runtime.library import native as native_vendor

    if native_vendor.module() is None:
        pytest.skip(f"no C++ vendor kernels: {native_vendor.reason()}")
    cores = sorted(process_cpus())
    seen: list[frozenset[int]] = []
    program = probed_program(seen)
    g = program.graph
    s = Schedule.build(g, make_schedule("sequential", g).streams, threads=len(cores))
    with CPUExecutor(program, s) as ex:
        assert ex.teams == [cores]
        ex.run(np.ones((4, 8), "float32"))
    assert seen == [frozenset(cores[:1])]
    assert frozenset(os.sched_getaffinity(0)) == process_cpus()  # the caller's cores back
    bound = {frozenset(os.sched_getaffinity(t.id)) for t in psutil.Process().threads()}
    assert all(frozenset([c]) in bound for c in cores[1:])  # the team's workers
    with pytest.MonkeyPatch.context() as m:
        m.setenv("PARAGRAPH_PIN", "0")
        assert CPUExecutor(program, s).teams is None


@needs_two_cores
def test_cores_that_cannot_be_bound_warn_and_the_run_goes_on(monkeypatch):
    monkeypatch.setattr(threads, "_warned_pin", [])
    program = program_for("squeezenet1_1")
    s = Schedule.build(program.graph, make_schedule("nimble", program.graph, cores=2).streams,
                       threads=1)
    inputs = random_inputs(models.get("squeezenet1_1", reduced=True))
    want = run_vm(program.vm(), inputs, device=program.device)
    with CPUExecutor(program, s) as ex:
        ex.cores = [frozenset({100_000 + i}) for i in range(s.num_streams)]  # no such CPU
        with pytest.warns(RuntimeWarning, match="cannot bind a stream"):
            got = ex.run(*inputs)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_a_stream_failing_outside_its_kernels_stops_all(monkeypatch, stream_runner):
    from paragraph.tvm_interop.runtime import executor

    tvm_ffi.register_global_func("paragraph_test.copy", lambda x, out: out.copyfrom(x.numpy()),
                                 override=True)
    program = packed_program("paragraph_test.copy")
    s = Schedule.build(program.graph, make_schedule("nimble", program.graph).streams, threads=1)
    with CPUExecutor(program, s) as ex:
        def broken(n):
            raise OSError("no thread pool today")
        monkeypatch.setattr(executor, "config_threads", broken)
        start = time.time()
        with pytest.raises(ParagraphError, match="outside its kernels: OSError"):
            ex.run(np.ones((4, 8), "float32"))
        assert time.time() - start < 10


def test_repeated_runs_do_not_leak(stream_runner):
    program = program_for("squeezenet1_1")
    x = random_inputs(program.lowered)
    with make_executor(program, make_schedule("opara", program.graph)) as ex:
        for _ in range(50):
            ex.run(*x)
        gc.collect()
        rss = psutil.Process().memory_info().rss
        for _ in range(500):
            ex.run(*x)
        gc.collect()
        grown = psutil.Process().memory_info().rss - rss
    assert grown < 8 * 2**20, f"RSS grew {grown / 2**20:.1f} MiB over 500 runs"


def test_profile_timeline_covers_every_kernel(stream_runner):
    program = program_for("squeezenet1_1")
    schedule = make_schedule("wavefront", program.graph)
    with make_executor(program, schedule) as ex:
        ex.run(*random_inputs(program.lowered), profile=True)
        kernels = {n.id for n in program.graph.nodes if n.kind == "kernel"}
        assert set(ex.timeline) == kernels
        for k, (stream, start, end) in ex.timeline.items():
            assert stream == schedule.stream_of[k] and end >= start
        # stage barriers: a kernel starts only after every kernel of earlier stages ended
        stage_of = {k: i for i, st in enumerate(schedule.stages) for k in st}
        for a in kernels:
            for b in kernels:
                if stage_of[a] < stage_of[b]:
                    assert ex.timeline[a][2] <= ex.timeline[b][1]


def _two_kernels(second) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            total = bb.emit(relax.op.sum(x, axis=1))
            other = bb.emit(second(x))
            out = bb.emit_output(relax.Tuple([total, other]))
        bb.emit_func_output(out)
    return bb.get()


def test_programs_share_the_compiled_kernels_they_have_in_common():
    """A kernel is compiled once per process: a second program with one kernel of its own
    compiles that one, takes the other from the first, and both run right (the VM, compiled
    on first use, agrees)."""
    first = build_program(_two_kernels(relax.op.nn.relu), "llvm")
    held = compiled.cached_kernel_count()
    again = build_program(_two_kernels(relax.op.nn.relu), "llvm")
    assert compiled.cached_kernel_count() == held
    assert set(again.functions.values()) == set(first.functions.values())
    second = build_program(_two_kernels(relax.op.sigmoid), "llvm")
    assert compiled.cached_kernel_count() == held + 1
    assert len(set(second.functions.values()) & set(first.functions.values())) == 1
    x = np.random.default_rng(0).standard_normal((4, 8)).astype("float32")
    for program, want in ((first, np.maximum(x, 0)), (second, 1 / (1 + np.exp(-x)))):
        assert not program.compiled.made  # the VM's module is not built for the executor
        with make_executor(program, make_schedule("sequential", program.graph)) as ex:
            got = ex.run(x)
        np.testing.assert_allclose(got[0], x.sum(axis=1), rtol=1e-5)
        np.testing.assert_allclose(got[1], want, rtol=1e-5, atol=1e-6)
        for g, v in zip(got, run_vm(program.vm(), [x]), strict=True):
            np.testing.assert_allclose(g, v, rtol=1e-6)


@pytest.mark.skipif(cpu_count() < 2, reason="one core: kernels compile on the caller")
def test_kernels_compile_on_threads_under_the_callers_pass_context():
    """The modules of one build compile on threads of their own (`compiled.CHUNK` kernels a
    module), each under the caller's PassContext (thread-local in TVM, so carried over): its
    instruments see the passes of every module, and the program runs right."""
    from tvm.ir.instrument import pass_instrument

    seen: set[str] = set()

    @pass_instrument
    class Threads:
        def run_before_pass(self, mod, info):
            seen.add(threading.current_thread().name)

    n = 2 * compiled.CHUNK + 1  # three modules of kernels this process has not compiled
    bb = relax.BlockBuilder()
    xs = [relax.Var(f"x{i}", relax.TensorType((3, 1000 + i), "float32"))
          for i in range(n)]
    with bb.function("main", xs):
        with bb.dataflow():
            outs = [bb.emit(relax.op.nn.relu(x)) for x in xs]
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    with tvm.transform.PassContext(instruments=[Threads()]):
        program = build_program(bb.get(), "llvm")
    assert any(name.startswith("paragraph-compile") for name in seen), seen
    inputs = [np.random.default_rng(i).standard_normal((3, 1000 + i)).astype("float32")
              for i in range(n)]
    with make_executor(program, make_schedule("sequential", program.graph)) as ex:
        for got, x in zip(ex.run(*inputs), inputs, strict=True):
            np.testing.assert_array_equal(got, np.maximum(x, 0))


# ---------------------------------------------------------------------------- CUDA
def test_cuda_kernels_compile_here():
    target = resolve_target("cuda")
    assert is_gpu(target)
    mod = models.get("squeezenet1_1", reduced=True)
    program = build_program(mod, target, device=tvm.cpu())  # compile only
    assert len(program.functions) == len({n.attrs["func"] for n in program.graph.nodes
                                          if n.kind == "kernel"})
    sources = program.executable.mod.imports[0].imports
    assert any(m.kind == "cuda" for m in sources)


@pytest.mark.skipif(not gpu_available(), reason="no CUDA GPU visible to TVM on this machine")
@pytest.mark.parametrize("use_graph", [True, False])
def test_cuda_executor_matches_the_vm(use_graph):
    pytest.importorskip("cuda.bindings", reason="cuda-bindings is not installed")
    mod = models.get("inception_v3", reduced=True)
    program = build_program(mod, "cuda")
    inputs = random_inputs(program.lowered)
    expected = run_vm(program.vm(), inputs, device=program.device)
    for algorithm in ALGORITHMS:
        schedule = make_schedule(algorithm, program.graph)
        with make_executor(program, schedule, use_cuda_graph=use_graph) as ex:
            for _ in range(2):
                for g, e in zip(ex.run(*inputs), expected, strict=True):
                    np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not gpu_available(), reason="no CUDA GPU visible to TVM on this machine")
def test_cuda_kernel_costs_are_gpu_time():
    """A GPU kernel's cost is its time between events in a graph replay: all of them together
    take about one replay of the whole sequence (the events between kernels add their own
    nodes), where host-timed with a sync after each launch NASNet-A mobile's kernels had
    summed to 7x a replay; and each is positive."""
    pytest.importorskip("cuda.bindings", reason="cuda-bindings is not installed")
    mod = models.get("inception_v3", reduced=True)
    program = build_program(mod, "cuda")
    inputs = random_inputs(program.lowered)
    with make_executor(program, make_schedule("sequential", program.graph)) as ex:
        ex.run(*inputs)
        costs = kernel_costs(ex, db=None, repeat=5, warmup=2)
        replays = []
        for _ in range(20):
            t = time.perf_counter()
            ex.run(*inputs, copy_outputs=False)
            replays.append(time.perf_counter() - t)
        kernels = [k for k in costs if ex.steps[k].fn is not None]  # views launch nothing
    assert len(kernels) > 20 and all(costs[k] > 0 for k in kernels)
    total = sum(costs[k] for k in kernels)
    print(f"{len(kernels)} kernels: {total * 1e3:.3f} ms by events, a replay "
          f"{min(replays) * 1e3:.3f} ms")
    assert total < 1.5 * min(replays), (total, min(replays))


@pytest.mark.parametrize("name", zoo_for_schedules())
def test_kernels_are_traced_to_their_operators(name):
    """Every operator of the prepared model lies in exactly one kernel."""
    program = program_for(name)
    assert program.kernel_operators is not None
    placed = sorted(i for ids in program.kernel_operators.values() for i in ids)
    assert placed == sorted(n.id for n in program.operator_graph.nodes if not n.is_source)
    assert set(program.kernel_operators) == {n.id for n in program.graph.nodes if not n.is_source}


def test_traced_operators_compute_what_their_kernel_computes():
    """Each kernel's output equals its operators' output evaluated in numpy."""
    from paragraph.graph import Graph
    from paragraph.interpret import run_graph
    from paragraph.tvm_interop.runtime.memory import Block, MemoryPlan

    program = program_for("inception_v3")
    g, ops = program.graph, program.operator_graph
    kernels = [n for n in g.nodes if n.kind == "kernel"]
    # each kernel's result is the output of the one operator no other operator of it reads
    last = {}
    for k in kernels:
        members = set(program.kernel_operators[k.id])
        read = {r.node for i in members for r in ops[i].inputs}
        (last[k.id],) = [i for i in members if i not in read]
    refs = [TensorRef(k.id) for k in kernels]
    plan = MemoryPlan([Block(max(1, k.type.numel * 4)) for k in kernels],
                      {r: i for i, r in enumerate(refs)}, 0)  # no reuse: keep every tensor
    x = random_inputs(program.lowered)
    with make_executor(program, make_schedule("sequential", g), plan=plan) as ex:
        ex.run(*x)
        got = [ex.tensors[r].numpy() for r in refs]
    expected = run_graph(Graph(ops.nodes, [TensorRef(last[k.id]) for k in kernels]), x)
    for k, a, b in zip(kernels, got, expected, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4, err_msg=k.attrs["func"])


def test_large_inputs_are_copied_in_by_the_callers_team(monkeypatch):
    """One stream on every core runs on the caller with its C++ vendor kernels: inputs of
    `PARALLEL_COPY_BYTES` or more are copied in by the caller's OpenMP team (the threshold
    lowered here so that the reduced model's input takes that path), once the caller is bound
    to its core for the run, and runs compute from the inputs each is given. A schedule of
    several streams copies on the caller alone."""
    from paragraph.tvm_interop.runtime import executor as executor_module
    from paragraph.tvm_interop.runtime.library import native as native_vendor

    if cpu_count() < 2:
        pytest.skip("one core: the caller runs kernels on one thread")
    monkeypatch.setattr(executor_module, "PARALLEL_COPY_BYTES", 1)
    mod = models.get("squeezenet1_1", reduced=True)
    program = build_program(mod, "llvm", kernels="vendor")
    calls = []  # (threads, the calling thread's cores at the copy)
    real = native_vendor.copy_bytes
    monkeypatch.setattr(native_vendor, "copy_bytes",
                        lambda *a: calls.append((a[-1], os.sched_getaffinity(0))) or real(*a))
    with CPUExecutor(program, make_schedule("sequential", program.graph, cores=2)) as ex:
        if not ex.cpp_vendor_kernels:
            pytest.skip(f"C++ vendor kernels unavailable: {native_vendor.reason()}")
        assert ex._copy_team == 2
        for seed in (0, 1):
            inputs = random_inputs(mod, seed=seed)
            want = run_vm(program.vm(), inputs, device=program.device)
            got = ex.run(*inputs)
            np.testing.assert_array_equal(np.from_dlpack(ex.inputs[0]), inputs[0])
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
        # copied once the caller is bound for the run, where its team is bound: on its
        # own core, not where an unbound caller woke after a pause (the worker's)
        bound = ex._binding(0)
    assert [t for t, _ in calls] == [2, 2]
    if bound is not None:
        assert all(cores == bound for _, cores in calls)
    with CPUExecutor(program, make_schedule("nimble", program.graph, cores=2)) as ex:
        assert ex.schedule.num_streams == 1 or ex._copy_team == 0


def test_each_run_reads_the_inputs_it_is_given(stream_runner):
    """Inputs are written through numpy views of the input buffers made once (TVM's copyfrom
    cost a run ~85 us on cold caches): a second run with other inputs computes from them, and
    inputs that are not numpy arrays (a TVM tensor) still go through TVM's copy."""
    program = program_for("squeezenet1_1")
    mod = models.get("squeezenet1_1", reduced=True)
    s = make_schedule("nimble", program.graph, cores=2)
    with CPUExecutor(program, s) as ex:
        for seed in (0, 1):
            inputs = random_inputs(mod, seed=seed)
            want = run_vm(program.vm(), inputs, device=program.device)
            for given in (inputs, [tvm.runtime.tensor(a) for a in inputs]):
                got = ex.run(*given)
                np.testing.assert_array_equal(np.from_dlpack(ex.inputs[0]), inputs[0])
                for g, w in zip(got, want, strict=True):
                    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
