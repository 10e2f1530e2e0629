"""The differential fuzzer in the suite (``benchmarks/fuzz.py`` runs it at scale, docs/fuzzing.md):
its graphs are well typed and reach every operator; a few hundred of them, drawn by hypothesis
(which shrinks a failing one), are imported, searched, built, planned and run through one
combination each (kernel source, search method, schedule, vendor forms forced in turn: the
combinations rotate over the cases) and compared with the numpy reference of the original graph;
a crash, a hang and a mismatch are reported by the driver with their seeds."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paragraph import ops
from paragraph.machine import has_avx512
from paragraph.outputs import max_difference
from paragraph.tvm_interop.runtime.executor import gpu_available
from paragraph.tvm_interop.runtime.library import native

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
if str(BENCHMARKS) not in sys.path:  # the benchmarks import each other as scripts do
    sys.path.insert(0, str(BENCHMARKS))

import fuzz  # noqa: E402
import fuzz_graphs  # noqa: E402
import fuzz_run  # noqa: E402

# Relax operators the graphs use that the IR keeps opaque
OPAQUE = {"relax.take", "relax.mean", "relax.sum", "relax.max", "relax.erf", "relax.power",
          "relax.nn.gelu_tanh"}


def test_graphs_are_well_typed_and_reach_every_operator():
    kinds: Counter[str] = Counter()
    for seed in range(300):
        recipe = fuzz_graphs.recipe(fuzz_graphs.SeededDraw(seed), seed, 6)
        assert json.loads(json.dumps(recipe)) == recipe  # a report can hold it
        _, graph = fuzz_graphs.imported(recipe)  # validated: Relax's types are paragraph's
        kinds.update(n.attrs["op"] if n.kind == "opaque" else n.kind for n in graph.operators)
        outs = fuzz_graphs.reference(graph, fuzz_graphs.inputs(recipe))
        assert [o.shape for o in outs] == [fuzz_graphs.shape_of(recipe, v)
                                           for v in recipe["outputs"]]
    # enlarge only a rewrite makes (a kernel padded to a larger window)
    assert set(ops.SPECS) - {"enlarge"} <= set(kinds), set(ops.SPECS) - set(kinds)
    assert OPAQUE <= set(kinds), OPAQUE - set(kinds)


def test_ids_are_drawn_at_both_ends_and_refused_past_them():
    recipe = next(r for s in range(100) if (r := fuzz_graphs.recipe(
        fuzz_graphs.SeededDraw(s), s, 3))["inputs"][0]["dtype"] == "int64")
    ids, high = fuzz_graphs.inputs(recipe)[0], recipe["inputs"][0]["high"]
    assert ids.min() == 0 and ids.max() == high - 1
    bad = fuzz_graphs.out_of_range(recipe, fuzz_graphs.inputs(recipe))
    assert sorted(int(b[0].reshape(-1)[-1]) for b in bad) == [-1, high]


def test_the_drawn_meter_answers_the_same_question_alike():
    meter = fuzz_run.DrawnMeter(3)
    assert meter.handoff(None) == fuzz_run.DrawnMeter(3).handoff(None)
    assert meter.handoff(None) != fuzz_run.DrawnMeter(4).handoff(None)


def test_combinations_cover_every_search_and_schedule_in_each_case():
    from paragraph.planner import SCHEDULES

    combos = fuzz_run.combinations(5)
    assert {c.search for c in combos} == set(fuzz_run.SEARCHES)
    assert sorted(s for c in combos for s in c.schedules) == sorted(SCHEDULES)
    every = fuzz_run.combinations(5, every=True)
    assert len(every) == len(fuzz_run.KERNELS) * len(fuzz_run.SEARCHES)


@pytest.mark.skipif(has_avx512() is False, reason="a 3x3 convolution has one form (oneDNN's) "
                    "without AVX-512: nothing is timed to bypass")
def test_a_forced_form_runs_untimed_and_every_form_computes_the_same():
    """Forcing a vendor form (`native.forced_form`) bypasses the timing: the kernels stay
    unchosen however often they run, and each form gives the reference's answer."""
    if native.module() is None:
        pytest.skip(f"the C++ vendor kernels are unavailable: {native.reason()}")
    recipe = {"seed": 1, "inputs": [{"shape": [1, 16, 9, 9], "dtype": "float32"}],
              "steps": [{"op": "conv2d", "args": [0], "shape": [1, 17, 9, 9], "attrs": {
                  "out_channels": 17, "kernel": [3, 3], "strides": [1, 1],
                  "padding": [1, 1, 1, 1], "dilation": [1, 1], "groups": 1, "bias": True}}],
              "outputs": [1]}
    mod, graph = fuzz_graphs.imported(recipe)
    arrays = fuzz_graphs.inputs(recipe)
    expected = fuzz_graphs.reference(graph, arrays)
    from paragraph.deploy import build

    ex = build(mod, kernels="vendor", schedule="sequential")
    forms = 0
    with native.forced_form(0):
        for _ in range(30):  # beyond the timing of any kernel's forms
            assert max_difference(expected, ex.run(*arrays)) < fuzz_run.TOLERANCE
        assert native.timing_kernels() > 0  # nothing chose: the forced form ran untimed
        forms = native.most_forms()
    ex.close()
    assert forms >= 2
    for index in range(forms):
        with native.forced_form(index), build(mod, kernels="vendor",
                                              schedule="sequential") as again:
            assert max_difference(expected, again.run(*arrays)) < fuzz_run.TOLERANCE


def test_a_forced_variant_of_the_python_kernels_runs_alone_and_untimed():
    torch = pytest.importorskip("torch")
    from paragraph.tvm_interop.runtime.library import torch_kernels

    ran: list[int] = []
    kernel = torch_kernels._Fastest(torch, [lambda: ran.append(0), lambda: ran.append(1)],
                                    None, ("fuzz-forced",))
    with torch_kernels.forced_variant(5):  # past the last: the last
        for _ in range(3 * (torch_kernels.TRIALS + 1)):
            kernel()
    assert set(ran) == {1} and not kernel.chosen
    assert not any(key == ("fuzz-forced",) for key, _ in torch_kernels._CHOSEN)
    kernel()  # unforced: it times its variants again, from the first
    assert ran[-1] == 0


# the suite's fuzz: 60 cases of two graphs each (at most 4 steps), built and planned as one
# (independent branches), each case through one combination of kernel source, search and
# schedule drawn among all; about 30 s (the suite must stay under 20 minutes on 2 cores:
# `make fuzz` runs thousands)
CI_CASES, CI_GRAPHS = 60, 2
_COMBOS = [fuzz_run.Combination(k, s, (sched,)) for k in ("tvm", "vendor")
           for s in fuzz_run.SEARCHES for sched in fuzz_run.SCHEDULES]


@settings(max_examples=CI_CASES, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(st.data())
def test_fuzz_cases_match_the_reference(data):
    index = data.draw(st.integers(0, len(_COMBOS) - 1))
    draw = fuzz_graphs.HypothesisDraw(data)
    recipe = fuzz_graphs.union([fuzz_graphs.recipe(draw, index, 4) for _ in range(CI_GRAPHS)])
    outcome = fuzz_run.run_case(recipe, [_COMBOS[index]])
    assert outcome.runs >= 1
    assert not outcome.failures, (fuzz_graphs.describe(recipe),
                                  [f.as_json() for f in outcome.failures])


def test_a_union_of_graphs_computes_each_of_them():
    parts = [fuzz_graphs.recipe(fuzz_graphs.SeededDraw(s), s, 5) for s in (1, 2, 3)]
    whole = fuzz_graphs.union(parts)
    _, graph = fuzz_graphs.imported(whole)
    got = fuzz_graphs.reference(graph, fuzz_graphs.inputs(whole))
    assert len(got) == sum(len(p["outputs"]) for p in parts)
    shapes = [fuzz_graphs.shape_of(p, v) for p in parts for v in p["outputs"]]
    assert [g.shape for g in got] == shapes


def _fake_worker(tmp_path, monkeypatch, body: str) -> None:
    """The driver's workers replaced by a script that announces each of its ``--seeds`` and
    then runs ``body`` for seed ``s`` (json, os, sys and time imported), which prints the
    case's result line or does not."""
    script = tmp_path / "worker.py"
    script.write_text(
        "import json, os, sys, time\n"
        "seeds = [int(s) for s in sys.argv[sys.argv.index('--seeds') + 1].split(',')]\n"
        "for s in seeds:\n"
        "    print(json.dumps({'start': s}), flush=True)\n"
        + "".join(f"    {line}\n" for line in body.strip().splitlines()))
    monkeypatch.setattr(fuzz, "_worker_command",
                        lambda args, extra: [sys.executable, str(script), *extra])


def test_the_driver_reports_a_crash_and_a_hang_with_their_seeds(tmp_path, monkeypatch):
    """A worker that dies or stops answering costs its case only: the batch goes on."""
    _fake_worker(tmp_path, monkeypatch, """
if s == 2: os.abort()
if s == 4: time.sleep(60)
print(json.dumps({'done': s, 'runs': 1, 'combos': 1, 'failures': []}), flush=True)
""")
    args = fuzz.main.__globals__["argparse"].Namespace(batch=10, timeout=3.0)
    results = {r["seed"]: r for r in fuzz.run_cases(args, list(range(6)), lambda _: None)}
    assert sorted(results) == list(range(6))
    assert results[2]["failures"][0]["what"] == "crash"
    assert "SIGABRT" in results[2]["failures"][0]["detail"]
    assert results[4]["failures"][0]["what"] == "hang"
    assert not any(results[s]["failures"] for s in (0, 1, 3, 5))


def test_a_resumed_run_goes_on_from_the_seed_after_the_last_and_sums_its_segments(
        tmp_path, monkeypatch):
    """``--resume``: a run in segments (one sitting each) continues the report's seeds and
    ends at ``--cases`` in all; the totals are the sums over the segments, and a report
    written before segments existed is read as the first."""
    _fake_worker(tmp_path, monkeypatch, """
fails = [{'what': 'mismatch', 'where': 'x', 'detail': 'd'}] if s == 5 else []
print(json.dumps({'done': s, 'runs': 2, 'combos': 1, 'failures': fails, 'ops': ['relu']}),
      flush=True)
""")
    report = tmp_path / "fuzz.json"
    report.write_text(json.dumps({  # the old form: one run, no segments
        "cases": 3, "seeds": [0, 2], "programs_compared": 3, "executor_runs": 6,
        "checked_by_onnxruntime": 0, "seconds": 60.0, "failing_cases": 0, "failures": [],
        "steps_drawn": {"relu": 3}, "finished": False}))
    common = ["--report", str(report), "--no-minimise", "--batch", "2", "--resume"]
    fuzz.main(["--cases", "5", *common])
    got = json.loads(report.read_text())
    assert [s["seeds"] for s in got["segments"]] == [[0, 2], [3, 4]]
    assert (got["cases"], got["seeds"], got["executor_runs"]) == (5, [0, 4], 10)
    assert got["finished"] and got["steps_drawn"] == {"relu": 5}
    with pytest.raises(SystemExit):  # the new failure (seed 5) ends the run with status 1
        fuzz.main(["--cases", "7", *common])
    got = json.loads(report.read_text())
    assert [s["seeds"] for s in got["segments"]] == [[0, 2], [3, 4], [5, 6]]
    assert got["failing_cases"] == 1 and [f["seed"] for f in got["failures"]] == [5]
    fuzz.main(["--cases", "7", *common])  # already there: nothing runs, nothing changes
    assert json.loads(report.read_text()) == got


def test_the_cuda_pass_without_a_gpu_is_one_line_and_writes_nothing(tmp_path):
    """``--target cuda`` (issue 53's CUDA pass, run where a GPU is lent) refuses a machine
    without one before any worker starts."""
    if gpu_available():
        pytest.skip("a CUDA device is here: test_a_case_runs_on_cuda runs the pass")
    report = tmp_path / "gpu-fuzz.json"
    with pytest.raises(SystemExit, match="no CUDA device on this machine"):
        fuzz.main(["--target", "cuda", "--cases", "1", "--report", str(report)])
    assert not report.exists()


def test_a_case_runs_on_cuda():
    """One drawn graph through TVM's kernels on the GPU under each schedule, against the
    reference (no forced forms: they are the CPU's C++ kernels)."""
    if not gpu_available():
        pytest.skip("no CUDA device here: the CUDA pass is unmeasured on this machine")
    recipe = fuzz_graphs.recipe(fuzz_graphs.SeededDraw(3), 3, 4)
    combos = [fuzz_run.Combination("tvm", "none", tuple(fuzz_run.SCHEDULES))]
    outcome = fuzz_run.run_case(recipe, combos, target="cuda")
    assert outcome.runs >= 1 and not outcome.failures, [f.as_json() for f in outcome.failures]


def test_a_graph_that_cannot_be_imported_is_an_error_of_the_case_not_a_crash():
    recipe = {"seed": 0, "inputs": [{"shape": [2, 3], "dtype": "float32"}],
              "steps": [{"op": "no-such-step", "args": [0], "attrs": {}, "shape": [2, 3]}],
              "outputs": [1]}
    outcome = fuzz_run.run_case(recipe, fuzz_run.combinations(0))
    assert [(f.what, f.where) for f in outcome.failures] == [("error", "import")]
    assert "no-such-step" in outcome.failures[0].detail and outcome.runs == 0


def test_subgraphs_for_minimising_are_well_formed():
    recipe = fuzz_graphs.recipe(fuzz_graphs.SeededDraw(11), 11, 8)
    subs = fuzz._subrecipes(recipe)
    assert len(subs) >= len(recipe["steps"])
    for sub in subs:
        _, graph = fuzz_graphs.imported(sub)
        assert len(graph.outputs) == 1 and len(sub["steps"]) <= len(recipe["steps"])
        assert np.all(np.isfinite(fuzz_graphs.reference(graph, fuzz_graphs.inputs(sub))[0]))
