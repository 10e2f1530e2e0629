"""Splitting lone convolutions across streams: which ones, the rewrite's numerics, the rebuilt
program on the executor, and the end-to-end check that refuses a program that changed."""

import numpy as np
import pytest

from paragraph import GraphBuilder, models
from paragraph.dag import lone
from paragraph.errors import ParagraphError
from paragraph.graph import Graph
from paragraph.interpret import run_graph
from paragraph.passes.schedule import make_schedule, sequential
from paragraph.passes.split import split_lone_convs, split_rule
from paragraph.planner import Session, plan_schedule, split_program
from paragraph.schedule import kernel_ids, producers
from paragraph.timing import clearly_faster
from paragraph.tvm_interop import random_inputs
from paragraph.tvm_interop.build.program import build_program
from paragraph.tvm_interop.frontend.importers import prepare
from paragraph.tvm_interop.frontend.relax_graph import from_relax, to_relax
from paragraph.tvm_interop.measure.costdb import CostDB
from paragraph.tvm_interop.meter.runs import time_runs
from paragraph.tvm_interop.runtime.executor import make_executor
from paragraph.tvm_interop.runtime.vm import run_vm


def _stem_and_branches() -> Graph:
    """conv -> relu -> two branch convs -> add: the first conv and relu (and the add) are
    lone, the branch convs are not."""
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.input((1, 3, 8, 8))
    c0 = b.op("conv2d", [x, b.weight(rng.standard_normal((8, 3, 3, 3)).astype("f4"))],
              {"padding": 1})
    r = b.op("relu", [c0.out])
    c1 = b.op("conv2d", [r.out, b.weight(rng.standard_normal((8, 8, 1, 1)).astype("f4"))])
    c2 = b.op("conv2d", [r.out, b.weight(rng.standard_normal((8, 8, 3, 3)).astype("f4"))],
              {"padding": 1})
    return b.build([b.op("add", [c1.out, c2.out]).out])


def is_lone(graph: Graph, node: int) -> bool:
    ops = kernel_ids(graph)
    return node in lone(ops, {k: producers(graph, k) for k in ops})


def test_lone_ops_are_those_nothing_can_run_beside():
    g = _stem_and_branches()
    kinds = {n.id: n.kind for n in g.nodes if not n.is_source and is_lone(g, n.id)}
    assert sorted(kinds.values()) == ["add", "conv2d", "relu"]
    convs = [n.id for n in g.nodes if n.kind == "conv2d"]
    assert convs[0] in kinds and not set(convs[1:]) & set(kinds)


def test_split_rewrites_only_lone_convolutions_and_keeps_the_outputs():
    g = _stem_and_branches()
    split, names = split_lone_convs(g, 2, min_share=0.0)
    first = min(n.id for n in g.nodes if n.kind == "conv2d")
    assert names == [f"split-conv-2: conv{first}"]  # the rule, and the (unnamed) stem conv
    assert sum(n.kind == "conv2d" for n in split.nodes) == 4  # 1 -> 2, branches kept
    assert sum(n.kind == "concat" for n in split.nodes) == 1
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype("f4")
    np.testing.assert_allclose(run_graph(split, [x])[0], run_graph(g, [x])[0], rtol=1e-5,
                               atol=1e-5)
    # a share above every convolution's splits nothing
    assert split_lone_convs(g, 2, min_share=1.0)[1] == []


def test_inception_stem_is_split_and_batch_norm_chains_go_with_it():
    mod = models.get("inception_v3", reduced=True)
    ops = from_relax(prepare(mod))
    split, names = split_lone_convs(ops, 2)
    assert names  # the stem's convolutions
    for name in names:  # only lone convolutions, each with its whole chain
        rule, _, conv_name = name.partition(": ")
        assert rule == "split-conv-2"
        conv = next(n for n in ops.nodes if n.name == conv_name)
        assert is_lone(ops, conv.id)
    concats = [n for n in split.nodes if n.kind == "concat" and n.attrs["axis"] == 1
               and all(split[r.node].kind == "relu" for r in n.inputs)]
    assert len(concats) >= len(names)
    inputs = random_inputs(mod, seed=3)
    np.testing.assert_allclose(run_graph(split, inputs)[0], run_graph(ops, inputs)[0],
                               rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def inception():
    return build_program(models.get("inception_v3", reduced=True), "llvm")


def test_split_program_runs_on_two_streams_like_the_vm(inception):
    with Session() as session:
        split = split_program(inception, 2, session)
    assert split is not None and split.rewrites and not inception.rewrites
    assert len(split.kernels) > len(inception.kernels)
    x = random_inputs(inception.lowered, seed=4)
    expected = run_vm(inception.vm(), x)
    for algorithm in ("nimble", "critical-path", "opara"):
        with make_executor(split, make_schedule(algorithm, split.graph, cores=2)) as ex:
            for g, e in zip(ex.run(*x), expected, strict=True):
                np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)


def test_only_library_rules_split():
    assert split_rule(2).id == "split-conv-2" and split_rule(4).id == "split-conv-4"
    with pytest.raises(ParagraphError, match="2 or 4 parts"):
        split_rule(3)


def test_critical_path_keeps_whichever_program_runs_faster(inception, tmp_path, monkeypatch):
    import paragraph.planner.critical_path as planner

    # the streams kept: the split is tried only where they are, and whether one stream of
    # every core runs faster is a timing of its own (a loaded suite chose it once)
    monkeypatch.setattr(planner, "one_stream_if_faster", lambda plain, *_: plain)
    session = Session(db=CostDB(tmp_path / "c.sqlite"), cores=2)
    plan = plan_schedule("critical-path", inception, session)
    program, report = plan.program, plan.report.critical_path
    assert report is not None and report.split is not None
    split = report.split
    assert split.after_ms > 0 and split.before_ms > 0
    assert bool(split.rules) == clearly_faster(split.after_ms, split.before_ms)
    # the program may also have its pools moved first (tests/test_pools.py)
    assert split.rules == tuple(r for r in program.rewrites if r.startswith("split-conv-"))
    x = random_inputs(inception.lowered, seed=5)
    with make_executor(program, plan.schedule) as ex:
        for g, e in zip(ex.run(*x), run_vm(inception.vm(), x), strict=True):
            np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)
    # the choice is cached: planning again measures nothing new and decides the same
    again = plan_schedule("critical-path", inception, session)
    assert again.report.critical_path is not None and again.report.critical_path.split == split
    assert again.program.rewrites == program.rewrites
    unsplit = plan_schedule("critical-path", inception, session, split=False)
    assert unsplit.report.critical_path is not None
    assert unsplit.report.critical_path.split is None
    assert not any(r.startswith("split-conv-") for r in unsplit.program.rewrites)


def test_end_to_end_check_refuses_a_program_that_computes_something_else(inception):
    assert inception.model is not None
    ops = inception.model.get()
    split, _ = split_lone_convs(ops, 2)
    conv = next(n for n in split.nodes if n.kind == "conv2d" and n.name.endswith("_1"))
    w = split[conv.inputs[1].node]
    broken = Graph([n.replace(value=n.value * 2) if n.id == w.id else n for n in split.nodes],
                   split.outputs, split.meta)
    wrong = build_program(to_relax(broken), "llvm")
    candidates = [(p, sequential(p.graph, cores=1)) for p in (inception, wrong)]
    with pytest.raises(ParagraphError, match="does not compute the model's outputs"):
        time_runs(candidates, None, "", repeat=1, warmup=0, check=True)


def test_a_split_that_cannot_be_built_leaves_the_plain_schedule(inception, tmp_path,
                                                                monkeypatch):
    import paragraph.planner.critical_path as planner

    def broken(*args, **kwargs):
        raise RuntimeError("lowering failed")

    monkeypatch.setattr(planner, "split_program", broken)
    # the streams kept whatever one stream measures: under load one stream won, and no split
    # was tried (a fresh-clone run beside another benchmark, 2026-12-01)
    monkeypatch.setattr(planner, "one_stream_if_faster", lambda plan, *_a, **_k: plan)
    with pytest.warns(RuntimeWarning, match="could not be built.*lowering failed"):
        plan = plan_schedule("critical-path", inception,
                             Session(db=CostDB(tmp_path / "c.sqlite"), cores=2))
    assert plan.report.critical_path is not None and plan.report.critical_path.split is None
    assert not any(r.startswith("split-conv-") for r in plan.program.rewrites)


def test_a_comparison_timed_under_load_is_timed_again_when_quiet(inception, monkeypatch,
                                                                 tmp_path):
    """`time_runs` timed while another process held a core waits for quiet cores and times
    the comparison again; the quiet timing is cached, one taken under load twice is not."""
    from paragraph.tvm_interop.meter import runs as planner

    made: list[planner.LoadWatch] = []
    loaded = {"always": False}

    class Watch(planner.LoadWatch):
        def __enter__(self):
            made.append(self)
            return super().__enter__()

        @property
        def contended(self) -> bool:  # the first timing ran under load
            return loaded["always"] or self is made[0]

    waited: list[float] = []
    monkeypatch.setattr(planner, "LoadWatch", Watch)
    monkeypatch.setattr(planner, "wait_for_quiet_cores",
                        lambda log, wait_s: waited.append(wait_s) or {})
    db = CostDB(tmp_path / "costs.sqlite")
    candidates = [(inception, sequential(inception.graph, cores=1))]
    first = time_runs(candidates, db, "", repeat=1, warmup=0, block=1)
    assert len(made) == 2 and waited == [planner.QUIET_WAIT_S]
    assert time_runs(candidates, db, "", repeat=1, warmup=0, block=1) == first
    assert len(made) == 2  # cached: nothing timed
    loaded["always"] = True
    other = [(inception, sequential(inception.graph, cores=2))]
    time_runs(other, db, "", repeat=1, warmup=0, block=1)
    time_runs(other, db, "", repeat=1, warmup=0, block=1)
    assert len(made) == 6  # under load both times: not cached, timed again
