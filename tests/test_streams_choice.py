"""critical-path's choice between several one-thread streams and one stream of every core: timed
end to end, unless the measured kernel times predict the streams slower by `PREDICTED_MARGIN`
(then kept as one stream without timing, and said so in the report); a lone convolution is
split only for streams."""

import numpy as np
import pytest

from paragraph import GraphBuilder
from paragraph.planner import Session, plan_schedule
from paragraph.planner import critical_path as planner
from paragraph.tvm_interop.build.program import build_program
from paragraph.tvm_interop.frontend.relax_graph import to_relax
from paragraph.tvm_interop.measure.costdb import CostDB
from paragraph.tvm_interop.runtime.library.torch_kernels import torch_available

pytestmark = pytest.mark.skipif(not torch_available(), reason="vendor kernels need PyTorch")


def chain_beside_a_small_branch():
    """Six 3x3 convolutions in a chain and, beside them, one small convolution: two streams
    can only run the small one beside the chain, while one stream of two threads runs every
    convolution on both cores."""
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.input((1, 64, 28, 28))
    y = x
    for _ in range(6):
        wt = b.weight((rng.standard_normal((64, 64, 3, 3)) / 24).astype("f4"))
        y = b.op("relu", [b.op("conv2d", [y, wt], {"padding": 1}).out]).out
    side = b.op("conv2d", [x, b.weight((rng.standard_normal((4, 64, 1, 1)) / 8).astype("f4"))])
    return b.build([y, side.out])


@pytest.fixture(scope="module")
def program():
    return build_program(to_relax(chain_beside_a_small_branch()), "llvm", kernels="vendor")


def test_streams_predicted_far_slower_are_not_timed(program, tmp_path, monkeypatch):
    """With any margin the prediction clears (0: how far it clears is the host's, and a
    host's kernel times moved it around 1.25 between runs), one stream is kept untimed."""
    monkeypatch.setattr(planner, "PREDICTED_MARGIN", 0.0)
    timed: list = []  # the schedules of each whole-run comparison
    session = Session(db=CostDB(tmp_path / "c.sqlite"), cores=2)
    runs = session.meter.runs

    def counting(candidates, *args, **kwargs):
        timed.append([s for _, s in candidates])
        return runs(candidates, *args, **kwargs)

    monkeypatch.setattr(session.meter, "runs", counting)
    plan = plan_schedule("critical-path", program, session)
    report = plan.report.critical_path
    assert report is not None and report.streams is not None
    choice = report.streams
    assert not choice.timed and choice.one_stream and len(plan.schedule.streams) == 1
    assert choice.streams_ms > 0 and choice.one_stream_ms > 0  # the predictions, reported
    # no whole run compared several streams with one (the caps' comparison is one stream)
    assert all(len(s.streams) == 1 for schedules in timed for s in schedules)
    assert report.to_json()["streams_timed"] is False
    # one stream: the lone convolutions are not split for streams that do not exist
    assert report.split is None
    assert not any(r.startswith("split-conv-") for r in plan.program.rewrites)


def test_streams_not_predicted_far_slower_are_timed(program, tmp_path, monkeypatch):
    monkeypatch.setattr(planner, "PREDICTED_MARGIN", float("inf"))
    plan = plan_schedule("critical-path", program,
                         Session(db=CostDB(tmp_path / "c.sqlite"), cores=2))
    report = plan.report.critical_path
    assert report is not None and report.streams is not None and report.streams.timed
    assert (len(plan.schedule.streams) == 1) == report.streams.one_stream
