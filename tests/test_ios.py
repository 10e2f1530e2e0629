"""IOS: ending enumeration, the DP against brute force, blocks, merging, and the full search."""

import os
import random
import sqlite3
import subprocess
import sys
from dataclasses import FrozenInstanceError, replace

import networkx as nx
import numpy as np
import pytest

from paragraph import GraphBuilder, models
from paragraph.dag import lone
from paragraph.errors import ParagraphError
from paragraph.interpret import run_graph
from paragraph.passes.ios import (
    CONCURRENT,
    MERGE,
    SEQUENTIAL,
    IOSOptions,
    PartGraph,
    SearchStats,
    _bits,
    _components,
    apply_merges,
    blocks,
    brute_force,
    count_states,
    enumerate_endings,
    is_ending,
    kernel_preds,
    merge_rule,
    merge_units,
    part_graph,
    schedule_part,
)
from paragraph.passes.schedule import sequential
from paragraph.planner import PlanReport, Session, plan_ios, plan_schedule
from paragraph.tvm_interop import random_inputs
from paragraph.tvm_interop.build.program import build_program
from paragraph.tvm_interop.measure.costdb import TABLE, CostDB
from paragraph.tvm_interop.meter.runs import plan_digest
from paragraph.tvm_interop.runtime.executor import make_executor
from paragraph.tvm_interop.runtime.vm import run_vm


def random_part(n: int, p: float, seed: int) -> PartGraph:
    rng = random.Random(seed)
    return PartGraph.from_edges(n, [(u, v) for u in range(n) for v in range(u + 1, n)
                                    if rng.random() < p])


def predecessor_closed(part: PartGraph) -> list[int]:
    full = (1 << part.n) - 1
    return [m for m in range(1, full + 1) if all(not part.pred[u] & ~m for u in _bits(m))]


@pytest.mark.parametrize("seed", range(25))
def test_endings_match_the_definition(seed):
    part = random_part(3 + seed % 6, 0.35, seed)
    for state in predecessor_closed(part):
        for r, s in ((1, 1), (2, 2), (3, 8)):
            found = [sum(c) for c in enumerate_endings(part, state, r, s)]
            assert len(found) == len(set(found)), "an ending was enumerated twice"
            expected = set()
            sub = state
            while sub:
                if is_ending(part, state, sub):
                    groups = _components(part, sub)
                    if len(groups) <= s and all(len(g) <= r for g in groups):
                        expected.add(sub)
                sub = (sub - 1) & state
            assert set(found) == expected


def synthetic_cost(groups, strategy):
    """Concurrent: the slowest group plus a per-group overhead; sequential: the sum."""
    work = {u: 1.0 + (u * 7) % 5 for g in groups for u in g}
    if strategy == CONCURRENT:
        return max(sum(work[u] for u in g) for g in groups) + 0.6 * len(groups)
    if strategy == MERGE:
        return 0.7 * sum(work.values())
    return sum(work.values())


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("strategies", [(CONCURRENT,), (CONCURRENT, SEQUENTIAL)])
def test_dp_finds_the_brute_force_optimum(seed, strategies):
    part = random_part(3 + seed % 6, 0.3, 100 + seed)
    for r, s in ((1, 2), (2, 3), (3, 8)):
        cost, stages = schedule_part(part, synthetic_cost, r=r, s=s, mode="parallel",
                                     strategies=strategies)
        assert cost == pytest.approx(brute_force(part, synthetic_cost, r=r, s=s,
                                                 strategies=strategies))
        assert sum(st.cost for st in stages) == pytest.approx(cost)
        left = (1 << part.n) - 1
        for st in reversed(stages):  # a valid schedule: the last stage ends what is left
            units = sum(1 << u for g in st.groups for u in g)
            assert is_ending(part, left, units)
            left &= ~units
        assert left == 0


@pytest.mark.parametrize("seed", range(20))
def test_lower_bound_keeps_the_optimum_and_prices_less(seed):
    part = random_part(4 + seed % 6, 0.3, 300 + seed)
    strategies = (CONCURRENT, SEQUENTIAL)
    priced = []

    def cost(groups, strategy):
        priced.append((groups, strategy))
        return synthetic_cost(groups, strategy)

    def bound(groups, strategy):  # 0.8 of the cost without the per-group overhead
        work = [sum(1.0 + (u * 7) % 5 for u in g) for g in groups]
        return 0.8 * (max(work) if strategy == CONCURRENT else sum(work))

    for r, s in ((2, 3), (3, 8)):
        priced.clear()
        plain, _ = schedule_part(part, cost, r=r, s=s, mode="parallel", strategies=strategies)
        everything = len(priced)
        priced.clear()
        stats = SearchStats()
        lazy, stages = schedule_part(part, cost, r=r, s=s, mode="parallel",
                                     strategies=strategies, bound=bound, stats=stats)
        assert lazy == pytest.approx(plain)
        assert lazy == pytest.approx(brute_force(part, synthetic_cost, r=r, s=s,
                                                 strategies=strategies))
        assert sum(st.cost for st in stages) == pytest.approx(lazy)
        assert len(priced) <= everything


@pytest.mark.parametrize("seed", range(10))
def test_states_are_counted_and_parts_split_to_the_limit(seed):
    part = random_part(3 + seed % 7, 0.25, 500 + seed)
    assert count_states(part, 10**6) == len(predecessor_closed(part)) + 1  # + the empty one
    assert 3 < count_states(part, 3) <= 3 + part.n or count_states(part, 10**6) <= 3


def test_wide_parts_are_halved_until_their_states_fit(inception):
    graph = inception.graph
    plain = blocks(graph, 50)
    limited = blocks(graph, 50, max_states=40)
    assert [k for p in limited for k in p] == [k for p in plain for k in p]
    assert len(limited) > len(plain)
    for p in limited:
        assert len(p) == 1 or count_states(part_graph(graph, p), 40) <= 40


def test_dp_uses_merges_where_they_pay():
    # three independent sinks fed by one source: merging the three is cheapest
    part = PartGraph.from_edges(4, [(0, 1), (0, 2), (0, 3)])
    cost, stages = schedule_part(part, synthetic_cost, r=1, s=1, mode="both",
                                 mergeable=lambda units: set(units) <= {1, 2, 3})
    assert stages[-1].strategy == MERGE and set(stages[-1].groups[0]) == {1, 2, 3}
    _, only_merge = schedule_part(part, synthetic_cost, mode="merge",
                                  mergeable=lambda units: set(units) <= {1, 2, 3})
    assert all(len(st.groups) == 1 for st in only_merge)
    _, no_merge = schedule_part(part, synthetic_cost, mode="parallel",
                                mergeable=lambda units: True)
    assert MERGE not in {st.strategy for st in no_merge}


@pytest.fixture(scope="module")
def inception():
    return build_program(models.get("inception_v3", reduced=True), "llvm")


def test_blocks_cut_at_lone_kernels(inception):
    """Blocks end at the kernels nothing can run beside, which include IOS's cut nodes (the
    kernels on every input-to-output path)."""
    graph = inception.graph
    kernels = [n.id for n in graph.nodes if n.kind == "kernel"]
    preds = kernel_preds(graph, kernels)
    dag = nx.DiGraph([(p, k) for k, ps in preds.items() for p in ps])
    dag.add_nodes_from(kernels)
    cuts = lone(kernels, preds)
    assert 11 <= len(cuts) <= 40  # stem kernels, one per Inception module, the head
    for c in cuts:  # every other kernel runs before or after it
        assert nx.ancestors(dag, c) | nx.descendants(dag, c) | {c} == set(kernels)
    sources = [k for k in kernels if dag.in_degree(k) == 0]
    sinks = [k for k in kernels if dag.out_degree(k) == 0]
    for c in kernels:  # a kernel whose removal disconnects the inputs from the outputs
        rest = dag.copy()
        rest.remove_node(c)
        if not any(nx.has_path(rest, a, b) for a in sources if a != c for b in sinks
                   if b != c):
            assert c in cuts
    parts = blocks(graph, max_part_size=5)
    assert sorted(k for p in parts for k in p) == sorted(kernels)
    assert max(map(len, parts)) <= 5
    assert [len(b) for b in blocks(graph) if len(b) > 1][:3] == [9, 9, 9]  # modules A


def test_merged_convolutions_equal_the_originals(inception):
    """IOS merges through the library rule: the kernels of each match found in reduced
    Inception-v3 are units, merged they compute the same, and the program has fewer
    kernels."""
    rule = merge_rule()
    opgraph, kernel_operators = inception.operator_graph, inception.kernel_operators
    unit_kernel = {}
    for k in kernel_operators:
        if inception.graph[k].kind == "kernel":
            unit = rule.unit(opgraph, kernel_operators[k])
            if unit is not None:
                unit_kernel[unit] = k
    groups, used = [], set()
    for m in sorted(rule.find(opgraph), key=lambda m: -len(m.extra["units"])):
        units = m.extra["units"]
        if all(u in unit_kernel for u in units) and not used & {c for c, _ in units}:
            assert merge_units(rule, opgraph, kernel_operators,
                               [unit_kernel[u] for u in units]) == list(units)
            groups.append(list(units))
            used |= {c for c, _ in units}
    assert any(len({opgraph.type_of(opgraph[c].inputs[1]).shape[2:] for c, _ in g}) > 1
               for g in groups), "some merge must enlarge kernels (1x1 with 5x5 / 3x3)"
    merged, added = apply_merges(rule, opgraph, groups)
    assert len(added) == len(groups) and all(added)
    x = random_inputs(inception.lowered)
    np.testing.assert_allclose(run_graph(merged, x)[0], run_graph(opgraph, x)[0], rtol=1e-4,
                               atol=1e-5)
    rebuilt = build_program(merged, "llvm")
    assert len([n for n in rebuilt.graph.nodes if n.kind == "kernel"]) < len(
        [n for n in inception.graph.nodes if n.kind == "kernel"])
    expected = run_vm(inception.vm(), x)
    for a, b in zip(run_vm(rebuilt.vm(), x), expected, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_merge_rejects_what_cannot_merge():
    b = GraphBuilder()
    x = b.input((1, 4, 8, 8))
    w = np.ones((2, 4, 3, 3), "float32")
    a = b.op("conv2d", [x, b.weight(w)], {"padding": 1})
    strided = b.op("conv2d", [x, b.weight(w)], {"padding": 1, "strides": 2})
    grouped = b.op("conv2d", [x, b.weight(np.ones((4, 1, 3, 3), "float32"))],
                   {"padding": 1, "groups": 4})
    valid = b.op("conv2d", [x, b.weight(w)])
    a2 = b.op("conv2d", [x, b.weight(w)], {"padding": 1})
    g = b.build([a.out, strided.out, grouped.out, valid.out, a2.out])
    rule = merge_rule()
    unit = {n.id: rule.unit(g, [n.id]) for n in (a, strided, grouped, valid, a2)}
    assert rule.match_units(g, [unit[a.id], unit[grouped.id]]) is None  # groups
    assert rule.match_units(g, [unit[a.id], unit[strided.id]]) is None  # stride differs
    assert rule.match_units(g, [unit[a.id], unit[valid.id]]) is None  # output size differs
    assert rule.match_units(g, [unit[a.id]]) is None  # one is no merge
    assert rule.match_units(g, [unit[a.id], unit[a2.id]]) is not None


@pytest.mark.parametrize("mode", ["parallel", "merge", "both"])
def test_ios_search_end_to_end(mode, tmp_path):
    program = build_program(models.get("squeezenet1_1", reduced=True), "llvm")
    db = CostDB(tmp_path / "costs.sqlite")
    opts = IOSOptions(mode=mode, warmup=1, repeat=2, number=1)
    result = plan_ios(program, Session(db=db), opts)
    assert result.report.ios is not None
    stats = result.report.ios.stats
    assert stats.stages_measured > 0 and not stats.budget_hit
    strategies = set(result.schedule.info["strategies"])
    if mode == "parallel":
        assert MERGE not in strategies
    if mode == "merge":  # IOS-Merge: one kernel or one merged kernel per stage
        assert all(len(groups) == 1 for groups, _, _ in result.report.ios.stages)
    x = random_inputs(program.lowered)
    expected = run_vm(program.vm(), x)
    with make_executor(result.program, result.schedule) as ex:
        for a, b in zip(ex.run(*x), expected, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    # the same inputs and cost database give the same schedule, with nothing measured again
    again = plan_ios(program, Session(db=db), opts)
    assert again.report.ios.stats.stages_measured == 0
    assert again.schedule.streams == result.schedule.streams
    assert again.schedule.stages == result.schedule.stages


def test_ios_time_budget(tmp_path):
    program = build_program(models.get("squeezenet1_1", reduced=True), "llvm")
    result = plan_ios(program, Session(db=CostDB(tmp_path / "c.sqlite")),
                      IOSOptions(budget_s=1e-9, warmup=0, repeat=1, number=1))
    assert result.report.ios.stats.budget_hit
    result.schedule.validate(result.program.graph)
    x = random_inputs(program.lowered)
    with make_executor(result.program, result.schedule) as ex:
        np.testing.assert_allclose(ex.run(*x)[0], run_vm(program.vm(), x)[0], rtol=1e-5)


def test_chosen_merges_rebuild_the_program(inception, tmp_path):
    """Where the cost database says merged convolutions are faster, the DP takes them and the
    program is rebuilt with them; the schedule on the rebuilt program computes the same."""
    path = tmp_path / "costs.sqlite"
    opts = IOSOptions(mode="both", warmup=0, repeat=1, number=1, max_part_size=12,
                      confirm=False,  # the rebuild path itself, however fast the result
                      bound=False)  # price every stage, so the second search measures none
    first = plan_ios(inception, Session(db=CostDB(path)), opts)
    # lazy pricing (the default) measures a fraction of the stages for the same search
    lazy = plan_ios(inception, Session(db=CostDB(tmp_path / "b.sqlite")),
                    replace(opts, bound=True))
    assert lazy.report.ios.stats.bounded > 0
    assert lazy.report.ios.stats.stages_measured < first.report.ios.stats.stages_measured
    with sqlite3.connect(path) as conn:  # make every merged stage nearly free
        changed = conn.execute(f"UPDATE {TABLE} SET median = 1e-9 WHERE kernel LIKE "
                               "'ios:merge:%'")
        assert changed.rowcount > 0
    result = plan_ios(inception, Session(db=CostDB(path)), opts)
    assert result.report.ios.stats.stages_measured == 0
    assert MERGE in result.schedule.info["strategies"]
    def compute(p):
        return sum(n.kind == "kernel" for n in p.graph.nodes)

    assert compute(result.program) < compute(inception)
    result.schedule.validate(result.program.graph)
    assert first.report.ios.predicted_ms > result.report.ios.predicted_ms
    x = random_inputs(inception.lowered)
    expected = run_vm(inception.vm(), x)
    with make_executor(result.program, result.schedule) as ex:
        for a, b in zip(ex.run(*x), expected, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_plan_schedule_names(tmp_path):
    program = build_program(models.get("squeezenet1_1", reduced=True), "llvm")
    plan = plan_schedule("nimble", program)
    assert plan.program is program and plan.schedule.name == "nimble"
    assert plan.report == PlanReport()
    opts = IOSOptions(warmup=0, repeat=1, number=1)
    plan = plan_schedule("ios-parallel", program, Session(db=CostDB(tmp_path / "c.sqlite")),
                         ios=opts)
    assert plan.report.ios is not None
    assert plan.schedule.name == "ios-parallel" and "states" in plan.report.ios.summary
    # critical-path: list scheduling (and search) on each kernel's measured 1-thread time
    db = CostDB(tmp_path / "cp.sqlite")
    plan = plan_schedule("critical-path", program, Session(db=db, cores=2), split=False)
    sched = plan.schedule
    assert plan.program is program and sched.name == "critical-path"
    assert sched.num_streams <= 2  # fewer where the hand-offs cost more than they win
    assert sched.threads == (2 // sched.num_streams,) * sched.num_streams
    info = plan.report.critical_path
    assert info is not None
    assert 0 < info.critical_path_ms <= info.optimum_ms + 1e-9
    assert info.optimum_ms <= info.predicted_ms + 1e-9  # hand-offs only add
    assert info.predicted_ms <= info.work_ms + 1e-9
    assert 0 < info.handoff_us < 1000  # measured: a spin (native runner) or a wake-up
    assert len(db) >= len({n.attrs["hash"] for n in program.kernels})  # times were cached
    with pytest.raises(FrozenInstanceError):  # a plan is a value: its report is read-only
        info.predicted_ms = 0.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        sched.info["predicted"] = 0.0  # type: ignore[index]
    x = random_inputs(program.lowered)
    with make_executor(program, sched) as ex:
        np.testing.assert_allclose(ex.run(*x)[0], run_vm(program.vm(), x)[0], rtol=1e-5,
                                   atol=1e-6)
    with pytest.raises(ParagraphError, match="unknown IOS mode"):
        plan_schedule("ios-fast", program, ios=opts)
    with pytest.raises(ParagraphError, match="unknown schedule"):
        plan_schedule("greedy", program)


def test_vendor_kernels_get_one_thread_count(tmp_path):
    """torch's thread count is process-wide, so with vendor kernels on a CPU an IOS schedule
    uses one count throughout: 1-thread stages, or everything in sequence on all cores."""
    pytest.importorskip("torch")
    program = build_program(models.get("inception_v3", reduced=True), "llvm",
                                  kernels="vendor")
    opts = IOSOptions(warmup=0, repeat=1, number=1, cores=2)
    result = plan_ios(program, Session(db=CostDB(tmp_path / "c.sqlite")), opts)
    threads = set(result.schedule.threads)
    assert threads == {1} or (threads == {2} and result.schedule.num_streams == 1)
    x = random_inputs(program.lowered)
    with make_executor(result.program, result.schedule) as ex:
        np.testing.assert_allclose(ex.run(*x)[0], run_vm(program.vm(), x)[0], rtol=1e-5,
                                   atol=1e-6)


_TEAMS_SCRIPT = """
import os, threading
import paragraph
from paragraph import models
from paragraph.passes.ios import CONCURRENT, IOSOptions
from paragraph.tvm_interop.build.program import build_program
from paragraph.tvm_interop.meter.stages import StageMeter
program = build_program(models.get("inception_v3", reduced=True), "llvm", kernels="vendor")
from paragraph.tvm_interop.meter.local import LocalMeter
meter = StageMeter(program, IOSOptions(warmup=1, repeat=2, number=1, cores=2), LocalMeter())
convs = [n.id for n in program.graph.nodes
         if n.kind == "kernel" and n.attrs["source"] == "vendor" and "conv2d" in n.attrs["func"]]
def native():  # threads Python did not start: OpenMP's (TVM's pools are off: one thread)
    return len(os.listdir("/proc/self/task")) - len(threading.enumerate())
before = native()
meter.cost(((convs[0],), (convs[1],)), CONCURRENT)
print("new native threads", native() - before)
"""


def test_concurrent_stages_time_one_thread_vendor_kernels():
    """IOS times a concurrent stage's groups on workers, one thread each, so their vendor
    kernels are bound for one thread there. Bound for every core (the meter's sequential
    binding), each worker got an OpenMP team of its own for the life of the process; with more
    teams than cores libgomp stops spinning, and every later run in the process slowed (a
    token-id encoder's one 2-thread stream: 0.63 ms before an IOS plan, 2.7 after). In a
    process of its own: the count of threads is the process's."""
    pytest.importorskip("torch")
    from paragraph.tvm_interop.runtime.library import native

    if native.module() is None or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs the C++ vendor kernels and two cores")
    env = {**os.environ, "TVM_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", _TEAMS_SCRIPT], capture_output=True,
                         text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "new native threads 0" in run.stdout, run.stdout


def test_search_is_confirmed_end_to_end(tmp_path):
    """The searched schedule is kept only if a whole run beats all kernels in sequence (on all
    cores, and on one thread); the runs are cached, so the same inputs and database give the
    same answer."""
    program = build_program(models.get("squeezenet1_1", reduced=True), "llvm")
    db = CostDB(tmp_path / "c.sqlite")
    opts = IOSOptions(warmup=0, repeat=1, number=1, cores=2)
    result = plan_ios(program, Session(db=db), opts)
    assert result.report.ios is not None and result.report.ios.confirmed is not None
    confirmed = result.report.ios.confirmed
    assert confirmed.ios_ms > 0 and confirmed.sequential_ms > 0
    plain = plan_digest(sequential(program.graph, cores=2))
    for sequence_wins in (True, False):
        with sqlite3.connect(db.path) as conn:
            conn.execute(f"UPDATE {TABLE} SET median = CASE WHEN kernel LIKE ? THEN ? ELSE ? END "
                         "WHERE kernel LIKE 'run:%'",
                         (f"%{plain}", *((1e-9, 1.0) if sequence_wins else (1.0, 1e-9))))
        again = plan_ios(program, Session(db=db), opts)
        assert again.report.ios.stats.stages_measured == 0 and again.schedule.name == "ios-both"
        assert (again.schedule.info["strategies"] == [SEQUENTIAL]) == sequence_wins
        if sequence_wins:
            assert again.schedule.num_streams == 1 and again.program is program
            assert again.schedule.threads == (2,)
    one = plan_digest(sequential(program.graph, cores=1))  # one-kernel stages on one thread
    with sqlite3.connect(db.path) as conn:
        conn.execute(f"UPDATE {TABLE} SET median = CASE WHEN kernel LIKE ? THEN 1e-9 ELSE 1.0 "
                     "END "
                     "WHERE kernel LIKE 'run:%'", (f"%{one}",))
    again = plan_ios(program, Session(db=db), opts)
    assert again.schedule.threads == (1,) and again.program is program
    assert again.report.ios.confirmed.kept.endswith("on 1 thread(s)")


def test_budget_cuts_a_search_in_progress(inception, tmp_path):
    """A deadline reached inside a large part stops pricing endings there and finishes the
    rest sequentially; the schedule is still valid and computes the same."""
    opts = IOSOptions(budget_s=0.5, warmup=0, repeat=1, number=1, confirm=False)
    result = plan_ios(inception, Session(db=CostDB(tmp_path / "c.sqlite")), opts)
    assert result.report.ios.stats.budget_hit and result.report.ios.stats.states >= 1
    result.schedule.validate(result.program.graph)
    x = random_inputs(inception.lowered)
    with make_executor(result.program, result.schedule) as ex:
        np.testing.assert_allclose(ex.run(*x)[0], run_vm(inception.vm(), x)[0], rtol=1e-5,
                                   atol=1e-6)
