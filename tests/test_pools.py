"""Average pools moved after the 1 x 1 convolutions that narrow their output (rule
pool-after-conv1x1): where in the zoo, the rewrite's numerics, and the critical-path planner
keeping the moved program unless whole runs of the model as it is are clearly faster."""

import numpy as np
import pytest

from paragraph import models
from paragraph.interpret import run_graph
from paragraph.passes.pools import RULE_ID, pools_after_convs
from paragraph.planner import Session, plan_like, plan_schedule
from paragraph.timing import clearly_faster
from paragraph.tvm_interop import random_inputs
from paragraph.tvm_interop.build.program import build_program
from paragraph.tvm_interop.frontend.importers import prepare
from paragraph.tvm_interop.frontend.relax_graph import from_relax
from paragraph.tvm_interop.measure.costdb import CostDB
from paragraph.tvm_interop.runtime.executor import make_executor
from paragraph.tvm_interop.runtime.vm import run_vm


@pytest.fixture(scope="module")
def inception():
    return build_program(models.get("inception_v3", reduced=True), "llvm",
                               kernels="vendor")


@pytest.mark.parametrize("name", ["inception_v3", "nasnet_a_mobile", "resnet50"])
def test_every_inception_pool_branch_moves_and_nothing_else(name):
    """Inception-v3's nine pool branches (a 3 x 3 stride-1 pool, then a 1 x 1 convolution to
    fewer channels) move, the model's outputs unchanged; NASNet-A's 1 x 1 stride-2 pools
    before its halving convolutions do not (the convolution would run on 4x the pixels), nor
    does anything in ResNet-50."""
    mod = models.get(name, reduced=True)
    ops = from_relax(prepare(mod))
    moved, done = pools_after_convs(ops)
    assert len(done) == (9 if name == "inception_v3" else 0)
    assert all(d.startswith(f"{RULE_ID}: ") for d in done)
    if done:
        for pool in (n for n in moved.nodes if n.kind == "avg_pool2d"):
            assert moved[pool.inputs[0].node].kind == "conv2d"
        x = random_inputs(mod, seed=7)
        np.testing.assert_allclose(run_graph(moved, x)[0], run_graph(ops, x)[0], rtol=1e-4,
                                   atol=1e-5)


def test_critical_path_moves_the_pools_unless_the_model_as_it_is_runs_clearly_faster(
        inception, tmp_path):
    """The default plan of Inception-v3 (vendor kernels, which absorb the moved batch norm
    and relu into each pool) has its pools moved, timed against the model as it is and kept
    unless that was clearly faster; its outputs equal the model's on the VM either way, and a
    search candidate planned like it gets the same rewrite."""
    session = Session(db=CostDB(tmp_path / "c.sqlite"), cores=2)
    plan = plan_schedule("critical-path", inception, session, split=False)
    assert plan.report.critical_path is not None
    pools = plan.report.critical_path.pools
    assert pools is not None
    kept = not clearly_faster(pools.before_ms, pools.after_ms)
    assert len(pools.rules) == (9 if kept else 0)
    assert tuple(r for r in plan.program.rewrites if r.startswith(RULE_ID)) == pools.rules
    if kept:
        names = {k.attrs.get("func", "") for k in plan.program.kernels}
        assert sum(".avg_pool2d." in f and f.endswith(".incpad.bias.relu") for f in names) >= 1
    x = random_inputs(inception.lowered, seed=5)
    with make_executor(plan.program, plan.schedule) as ex:
        for g, e in zip(ex.run(*x), run_vm(inception.vm(), x), strict=True):
            np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)
    assert inception.model is not None
    like = plan_like(plan, inception.model.get(), session, kernels="vendor", prepared=True)
    # as many moved (the names are the re-imported graph's)
    assert like.report.critical_path is not None
    like_pools = like.report.critical_path.pools
    assert len(like_pools.rules if like_pools else ()) == len(pools.rules)


def test_pools_that_cannot_be_moved_leave_the_plan(inception, tmp_path, monkeypatch):
    import paragraph.planner.critical_path as planner

    def broken(*args, **kwargs):
        raise RuntimeError("no rule")

    monkeypatch.setattr(planner, "pools_after_convs", broken)
    with pytest.warns(RuntimeWarning, match="pools moved could not be built.*no rule"):
        plan = plan_schedule("critical-path", inception,
                             Session(db=CostDB(tmp_path / "c.sqlite"), cores=2), split=False)
    assert plan.report.critical_path is not None
    assert plan.program is inception and plan.report.critical_path.pools is None


def test_pools_moved_whose_outputs_differ_are_dropped_and_the_build_goes_on(
        inception, tmp_path, monkeypatch):
    """A rewrite whose outputs differ from the model's beyond the tolerance (a tolerance of 0
    here: any rounding is too much) is dropped with a message; the plan keeps the model's own
    kernels instead of failing the build (public Inception-v3 and -v4 failed their builds so)."""
    import paragraph.tvm_interop.meter.runs as runs

    monkeypatch.setattr(runs, "tolerance", lambda program: 0.0)
    logged: list[str] = []
    with pytest.warns(RuntimeWarning, match="pools moved was dropped.*does not compute"):
        plan = plan_schedule("critical-path", inception,
                             Session(db=CostDB(tmp_path / "c.sqlite"), cores=2,
                                     log=logged.append), split=False)
    assert plan.program is inception
    assert any("was dropped" in line for line in logged)
