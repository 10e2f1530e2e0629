"""Models that start from token ids (issue 17): a BERT-style encoder exported from torch to ONNX
(embedding Gather, attention, GELU through erf, layer norms) runs under every schedule and
under critical-path with its kernels timed, and its ids are sampled and checked against the
table they index. Before this, the kernels were timed on input buffers no run had filled, the
embedding's `take` read garbage ids and `--schedule critical-path` segfaulted."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from paragraph.errors import InputError
from paragraph.graph import GraphBuilder, TensorType
from paragraph.inputs import IndexRange, check_index_ranges, index_ranges, sample_inputs
from paragraph.planner import Session, plan_schedule
from paragraph.tvm_interop.build.program import build_program
from paragraph.tvm_interop.frontend.importers import load
from paragraph.tvm_interop.frontend.relax_graph import random_inputs
from paragraph.tvm_interop.measure.costdb import CostDB
from paragraph.tvm_interop.runtime.executor import make_executor
from paragraph.tvm_interop.runtime.vm import build_vm, run_vm

TAKE = {"op": "relax.take", "attrs": 'relax.attrs.TakeAttrs(axis=0, mode="fast")'}


def _embedding(wrap: bool, rows: int = 50, take: dict = TAKE):
    """ids (1, 6) -> an embedding table of ``rows`` rows, as ONNX's importer writes it when
    ``wrap`` (negative ids counted from the end) and as torch's does otherwise."""
    b = GraphBuilder()
    ids = b.input((1, 6), "int64", name="ids")
    mask = b.input((1, 6), "int64", name="mask")
    table = b.weight(np.ones((rows, 4), np.float32))
    index = ids
    if wrap:
        zero = b.constant(0, "int64")
        less = b.op("opaque", [ids, zero], {"op": "relax.less"},
                    outputs=[TensorType((1, 6), "bool")]).out
        shifted = b.op("opaque", [ids, b.constant(rows, "int64")], {"op": "relax.add"},
                       outputs=[TensorType((1, 6), "int64")]).out
        index = b.op("opaque", [less, shifted, ids], {"op": "relax.where"},
                     outputs=[TensorType((1, 6), "int64")]).out
    rows_of = b.op("opaque", [table, index], take, outputs=[TensorType((1, 6, 4), "float32")])
    return b.build([rows_of.out, mask])


def test_ids_get_the_range_of_the_table_they_index():
    plain, wrapped = index_ranges(_embedding(False)), index_ranges(_embedding(True))
    assert set(plain) == {0}  # the mask indexes nothing
    assert (plain[0].low, plain[0].high) == (0, 50)
    assert (wrapped[0].low, wrapped[0].high) == (-50, 50)
    # the normalisation folded into the take's "wrap" mode (`importers._SafeTake`)
    folded = index_ranges(_embedding(False, take={**TAKE, "attrs": TAKE["attrs"].replace(
        "fast", "wrap")}))
    assert (folded[0].low, folded[0].high) == (-50, 50)
    assert "relax.take" in plain[0].reader


def test_indices_computed_from_ids_do_not_bound_the_ids():
    """RoBERTa's position ids, a running count of its non-padding ids, index a table of their
    own: that table bounds the count, not the ids (a 2-row table refused every real id)."""
    b = GraphBuilder()
    ids = b.input((1, 6), "int64", name="ids")
    count = b.op("opaque", [ids], {"op": "relax.cumsum"}, outputs=[TensorType((1, 6), "int64")])
    positions = b.weight(np.ones((2, 4), np.float32))
    words = b.weight(np.ones((50, 4), np.float32))
    a = b.op("opaque", [positions, count.out], TAKE, outputs=[TensorType((1, 6, 4), "float32")])
    w = b.op("opaque", [words, ids], TAKE, outputs=[TensorType((1, 6, 4), "float32")])
    ranges = index_ranges(b.build([a.out, w.out]))
    assert (ranges[0].low, ranges[0].high) == (0, 50)


def test_samples_lie_in_range_and_out_of_range_ids_are_refused():
    graph = _embedding(False, rows=5)
    ranges = index_ranges(graph)
    types = [graph[i].type for i in graph.inputs]
    for seed in range(5):
        ids, mask = sample_inputs(types, ranges, seed)
        assert ids.dtype == np.int64 and 0 <= ids.min() and ids.max() < 5
        check_index_ranges([ids, mask], ranges)
    bad = np.array([[0, 1, 2, 5, 1, 0]], np.int64)
    with pytest.raises(InputError, match=r"input 0 \('ids'\) holds 5 at \[0, 3\].*relax.take"):
        check_index_ranges([bad, mask], ranges, ["ids", "mask"])
    with pytest.raises(InputError, match=r"input 0 holds -6 at \[0, 3\]"):
        check_index_ranges([-bad - 1, mask], {0: IndexRange(0, 5, "t")})


# ---------------------------------------------------------------------------- the ONNX encoder
@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("onnx")
    from paragraph.models.encoder import export_encoder  # needs torch

    path = export_encoder(tmp_path_factory.mktemp("encoder") / "encoder.onnx", reduced=True)
    return path, load(path)


@pytest.fixture(scope="module")
def encoder_program(encoder):

    return build_program(encoder[1], "llvm", kernels="vendor")


def test_encoder_matches_onnxruntime(encoder):
    ort = pytest.importorskip("onnxruntime")

    path, mod = encoder
    (ids,) = random_inputs(mod, seed=1)
    assert ids.dtype == np.int64 and ids.max() > 8  # drawn over the whole vocabulary
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"input_ids": ids})
    np.testing.assert_allclose(run_vm(build_vm(mod), [ids])[0], expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("schedule", ["sequential", "wavefront", "opara", "nimble",
                                      "critical-path", "ios"])
def test_encoder_runs_under_every_schedule(encoder_program, schedule, tmp_path):

    program = encoder_program
    assert program.input_ranges[0].high == 1000  # the reduced vocabulary
    db = CostDB(tmp_path / "costs.sqlite")  # critical-path times its kernels afresh
    try:
        plan = plan_schedule(schedule, program, Session(db=db))
    finally:
        db.close()
    ids = sample_inputs([program.graph[i].type for i in program.graph.inputs],
                        program.input_ranges, seed=2)
    (expected,) = run_vm(program.vm(), ids)
    types = [program.graph[i].type for i in program.graph.inputs]
    with make_executor(plan.program, plan.schedule) as ex:
        # valid ids before any run (what kernels timed before a run read), not raw memory
        np.testing.assert_array_equal(ex.inputs[0].numpy(),
                                      sample_inputs(types, program.input_ranges)[0])
        (got,) = ex.run(*ids)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
        with pytest.raises(InputError, match="out of range for relax.take"):
            ex.run(np.full_like(ids[0], 1000))


def test_cli_times_the_encoder_kernels_under_critical_path(encoder, fresh_cache):
    """The reported crash, as a user met it: a fresh cache, so every kernel is timed."""
    env = {**os.environ, "PARAGRAPH_CACHE_DIR": str(fresh_cache)}
    done = subprocess.run([sys.executable, "-m", "paragraph", "run", str(encoder[0]),
                           "--kernels", "vendor", "--schedule", "critical-path",
                           "--repeat", "2"], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "kernels in model order" in done.stdout and "equal" in done.stdout
