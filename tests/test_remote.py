"""Measuring through TVM's RPC tracker: a tracker and a paragraph server started on loopback,
kernels, IOS's stages, the search's kernel signatures and whole programs timed on the server
(nothing of it in this machine's cost cache), critical-path and IOS planned there, a wrong
address refused with a clear error. Bounded in time: a hang dumps the stacks and fails the run."""

from __future__ import annotations

import faulthandler

import pytest
from test_search import inception_module
from tvm.rpc.tracker import Tracker

from paragraph import models
from paragraph.cli import main
from paragraph.errors import ParagraphError
from paragraph.passes.ios import IOSOptions
from paragraph.passes.schedule import make_schedule
from paragraph.passes.search import SearchOptions
from paragraph.planner import Session, plan_schedule, search_plan
from paragraph.tvm_interop.build.program import build_program
from paragraph.tvm_interop.measure.costdb import TABLE, CostDB
from paragraph.tvm_interop.meter.remote import Remote, parse_address, serve

KEY = "paragraph-test"


@pytest.fixture(scope="module")
def address():
    """A tracker and a paragraph server on loopback; their address as HOST:PORT:KEY."""
    faulthandler.dump_traceback_later(600, exit=True)  # a hung RPC call ends the test run
    tracker = Tracker("127.0.0.1", port=9190, port_end=9290, silent=True)
    server = serve(f"127.0.0.1:{tracker.port}", KEY, host="127.0.0.1", port=9300,
                   port_end=9400)
    try:
        yield f"127.0.0.1:{tracker.port}:{KEY}"
    finally:
        server.terminate()
        tracker.terminate()
        faulthandler.cancel_dump_traceback_later()


def _keys(db: CostDB) -> list[str]:
    """The kernel column of every cached cost (what was measured here)."""
    return [row[0] for row in db.conn.execute(f"SELECT kernel FROM {TABLE}")]


def test_programs_kernels_and_stages_are_timed_on_the_server(address, tmp_path):
    with Remote(address, timeout=30) as remote:
        assert remote.cores >= 1 and remote.target.kind.name == "llvm"
        program = build_program(models.get("squeezenet1_1", reduced=True),
                                      remote.target)
        seq = make_schedule("sequential", program.graph, cores=remote.cores)
        wave = make_schedule("wavefront", program.graph, cores=remote.cores)
        seconds, diffs = remote.time([(program, seq), (program, wave)], blocks=2, block=3)
        assert len(seconds) == 2 and all(0 < s < 1 for s in seconds)
        assert diffs[0] == 0.0 and diffs[1] <= 1e-5 and remote.vm_difference <= 1e-5
        (kernels,) = remote.kernel_times(program, [1])
        assert {k for k in kernels if program.graph[k].kind == "kernel"} == {
            n.id for n in program.graph.nodes if n.kind == "kernel"}
        assert all(v >= 0 for v in kernels.values()) and remote.handoff() > 0
        db = CostDB(tmp_path / "costs.sqlite")
        session = Session(db=db, remote=remote)
        assert session.target == remote.target and session.cores == remote.cores
        plan = plan_schedule("critical-path", program, session, split=False)
        assert plan.report.critical_path is not None
        assert plan.schedule.name == "critical-path" and plan.report.critical_path.predicted_ms > 0
        # IOS's stages, merged convolutions included, measured there and not cached here
        merges, sequence_seconds = [], remote.sequence_seconds
        remote.sequence_seconds = lambda *a: merges.append(a) or sequence_seconds(*a)  # counted
        ios = plan_schedule("ios", program, session, ios=IOSOptions(
            warmup=1, repeat=2, number=2, max_part_size=12))
        assert ios.report.ios is not None
        assert ios.report.ios.stats.stages_measured > 0 and ios.report.ios.stages
        assert ios.report.ios.confirmed is not None
        assert not [k for k in _keys(db) if "ios:" in k or "run:" in k]
        assert merges  # the fire modules' two expand convolutions, merged here, timed there
        # the server serves one session at a time: a second client is told, not hung
        with pytest.raises(ParagraphError, match="no free device with key"):
            Remote(address, timeout=3)


def test_the_search_measures_its_kernels_and_candidates_on_the_server(address, tmp_path):
    g = inception_module()
    db = CostDB(tmp_path / "costs.sqlite")
    with Remote(address, timeout=30) as remote:
        plan = search_plan(g, Session(db=db, remote=remote),
                           SearchOptions(method="greedy", budget=20, top_k=1, rounds=1))
    report = plan.report.search
    assert report is not None
    assert report.kernels_measured_now >= 2  # the convolutions, the concatenation
    assert report.kernels_priced_by_measurement == report.kernels_measured_now
    assert report.measured_before_ms > 0 and report.candidates_built >= 1
    assert not [k for k in _keys(db) if "sig:" in k or "run:" in k]  # timed there


def test_run_compile_and_tune_with_rpc(address, capsys, tmp_path):
    tracker, _, key = address.rpartition(":")
    code = main(["run", "squeezenet1_1", "--reduced", "--rpc-tracker", tracker, "--rpc-key",
                 key, "--kernels", "tvm", "--schedule", "wavefront", "--repeat", "5"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "kernels and runs are timed there" in out and "equal" in out
    assert f"on {KEY} at 127.0.0.1" in out and "wavefront schedule" in out
    artifact = tmp_path / "remote.paragraph"
    assert main(["compile", "squeezenet1_1", "--reduced", "--rpc", address, "--kernels", "tvm",
                 "--schedule", "opara", "-o", str(artifact)]) == 0  # the older form
    assert artifact.is_file()
    # half a pair, or both forms, is refused with a clear error
    assert main(["run", "squeezenet1_1", "--reduced", "--rpc-tracker", tracker]) == 2
    assert "--rpc-key KEY go together" in capsys.readouterr().err
    # MetaSchedule's trials and the tuned-against-untuned timing run on the device
    code = main(["tune", "squeezenet1_1", "--reduced", "--trials", "1", "--max-tasks", "1",
                 "--work-dir", str(tmp_path / "tuned"), "--rpc-tracker", tracker,
                 "--rpc-key", key, "--schedule", "sequential"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "[1/1]" in out and "model check" in out


def test_a_wrong_address_is_refused():
    with pytest.raises(ParagraphError, match="HOST:PORT:KEY"):
        parse_address("localhost:9190")
    with pytest.raises(ParagraphError, match="port 'x' is not a number"):
        parse_address("localhost:x:key")
    with pytest.raises(ParagraphError, match="no tracker at 127.0.0.1:1"):
        Remote("127.0.0.1:1:k", timeout=2)


def test_a_server_killed_mid_session_is_one_clear_error(address):
    """A worker killed mid-run: the device's RPC server (and the worker serving the session)
    is killed while a session holds it; the next measurement ends at once with one
    `ParagraphError` naming the device and what was being done, not TVM's internal check."""
    tracker = address.rpartition(":")[0]
    server = serve(tracker, "paragraph-killed", host="127.0.0.1", port=9400, port_end=9500)
    try:
        with Remote(f"{tracker}:paragraph-killed", timeout=30) as remote:
            program = build_program(models.get("squeezenet1_1", reduced=True), remote.target)
            seq = make_schedule("sequential", program.graph, cores=remote.cores)
            seconds, _ = remote.time([(program, seq)], blocks=1, block=2)
            assert seconds[0] > 0
            server.terminate()  # SIGKILL to the server's process tree
            with pytest.raises(ParagraphError, match=r"paragraph-killed: (uploading|running)"
                               r".*server stopped or the connection to it was lost"):
                remote.time([(program, seq)], blocks=1, block=2)
    finally:
        server.terminate()


def test_a_pool_measures_on_every_server_of_the_key(address):
    """Two servers registered under one key: `connect` holds a session on each; a round of
    five candidates is dealt to both (the first, the yardstick, timed beside each share) and
    timed at once; the search's kernel signatures are timed on both."""
    import threading
    import time

    from paragraph.passes.cost import kernels_of
    from paragraph.tvm_interop.meter.pool import RemotePool, connect, free_servers
    from paragraph.tvm_interop.meter.signatures import SignatureMeter

    tracker = address.rpartition(":")[0]
    key = "paragraph-pool"
    servers = [serve(tracker, key, host="127.0.0.1", port=9600, port_end=9700)
               for _ in range(2)]
    try:
        pool_address = f"{tracker}:{key}"
        deadline = time.monotonic() + 30
        while free_servers(pool_address) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        with connect(pool_address, timeout=30) as pool:
            assert isinstance(pool, RemotePool) and pool.parallel == 2
            assert pool.describe().startswith("2 x paragraph-pool at 127.0.0.1")
            calls: list[tuple[int, int, float, float]] = []  # device, candidates, start, end
            lock = threading.Lock()
            for i, device in enumerate(pool.devices):
                def counted(cands, *, _i=i, _runs=device.runs, **kw):
                    start = time.monotonic()
                    out = _runs(cands, **kw)
                    with lock:
                        calls.append((_i, len(cands), start, time.monotonic()))
                    return out
                device.runs = counted
            program = build_program(models.get("squeezenet1_1", reduced=True), pool.target)
            seq = make_schedule("sequential", program.graph, cores=pool.cores)
            wave = make_schedule("wavefront", program.graph, cores=pool.cores)
            seconds = pool.runs([(program, seq), (program, wave), (program, seq),
                                 (program, wave), (program, seq)], repeat=3, block=2,
                                check=True)
            assert len(seconds) == 5 and all(0 < s < 1 for s in seconds)
            assert sorted((d, n) for d, n, _, _ in calls) == [(0, 3), (1, 3)]
            (_, _, s0, e0), (_, _, s1, e1) = calls
            assert max(s0, s1) < min(e0, e1)  # the two shares were timed at the same time
            # the search's kernel signatures: built here, timed on both devices
            timed_on: list[int] = []
            for i, device in enumerate(pool.devices):
                def kernel_times(*a, _i=i, _kt=device.kernel_times, **kw):
                    timed_on.append(_i)
                    return _kt(*a, **kw)
                device.kernel_times = kernel_times
            g = inception_module()
            meter = SignatureMeter(pool.target, "tvm", pool)
            priced = meter.seconds(g, kernels_of(g))
            assert len(priced) >= 2 and not meter.failed
            assert all(s > 0 for _, s in priced.values())
            assert set(timed_on) == {0, 1}
    finally:
        for s in servers:
            s.terminate()
