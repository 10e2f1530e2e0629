"""Measuring through TVM's RPC tracker: a tracker and a paragraph server started on loopback,
kernels and whole programs timed on the server, critical-path planned there, a wrong address
refused with a clear error. Bounded in time: a hang dumps the stacks and fails the run."""

from __future__ import annotations

import faulthandler

import pytest
from tvm.rpc.tracker import Tracker

from paragraph import models
from paragraph.cli import main
from paragraph.errors import ParagraphError
from paragraph.passes.schedule import make_schedule
from paragraph.planner import plan_schedule
from paragraph.tvm_interop.kernels import KernelProgram
from paragraph.tvm_interop.remote import Remote, parse_address, serve

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


def test_programs_and_kernels_are_timed_on_the_server(address):
    with Remote(address, timeout=30) as remote:
        assert remote.cores >= 1 and remote.target.kind.name == "llvm"
        program = KernelProgram.build(models.get("squeezenet1_1", reduced=True),
                                      remote.target)
        seq = make_schedule("sequential", program.graph, cores=remote.cores)
        wave = make_schedule("wavefront", program.graph, cores=remote.cores)
        seconds, diffs = remote.time([(program, seq), (program, wave)], blocks=2, block=3)
        assert len(seconds) == 2 and all(0 < s < 1 for s in seconds)
        assert diffs[0] == 0.0 and diffs[1] <= 1e-5 and remote.vm_difference <= 1e-5
        kernels = remote.kernel_times(program, seq)
        assert {k for k in kernels if program.graph[k].kind == "kernel"} == {
            n.id for n in program.graph.nodes if n.kind == "kernel"}
        assert all(v >= 0 for v in kernels.values()) and remote.handoff() > 0
        plan = plan_schedule("critical-path", program, remote=remote, cores=remote.cores,
                             split=False)
        assert plan.schedule.name == "critical-path" and plan.report["predicted_ms"] > 0
        with pytest.raises(ParagraphError, match="measures its stages on this machine"):
            plan_schedule("ios", program, remote=remote)
        # the server serves one session at a time: a second client is told, not hung
        with pytest.raises(ParagraphError, match="no free device with key"):
            Remote(address, timeout=3)


def test_run_and_compile_with_rpc(address, capsys, tmp_path):
    code = main(["run", "squeezenet1_1", "--reduced", "--rpc", address, "--kernels", "tvm",
                 "--schedule", "wavefront", "--repeat", "5"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "kernels and runs are timed there" in out and "equal" in out
    assert f"on {KEY} at 127.0.0.1" in out and "wavefront schedule" in out
    artifact = tmp_path / "remote.paragraph"
    assert main(["compile", "squeezenet1_1", "--reduced", "--rpc", address, "--kernels", "tvm",
                 "--schedule", "opara", "-o", str(artifact)]) == 0
    assert artifact.is_file()


def test_a_wrong_address_is_refused():
    with pytest.raises(ParagraphError, match="HOST:PORT:KEY"):
        parse_address("localhost:9190")
    with pytest.raises(ParagraphError, match="port 'x' is not a number"):
        parse_address("localhost:x:key")
    with pytest.raises(ParagraphError, match="no tracker at 127.0.0.1:1"):
        Remote("127.0.0.1:1:k", timeout=2)
