"""A build is checked against a reference that shares none of its kernels: ONNX Runtime for an
ONNX file, else the numpy interpreter with TVM's default kernels for opaque operators; on
several seeded inputs; a rewritten program that differs is dropped for the model's own."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import paragraph
from paragraph import models
from paragraph.planner import CompileOptions, Plan, Session, plan_schedule
from paragraph.planner.compile import _checked
from paragraph.tvm_interop.frontend.importers import load
from paragraph.tvm_interop.frontend.relax_graph import from_relax, to_relax
from paragraph.tvm_interop.runtime.reference import (
    GraphReference,
    OnnxRuntimeReference,
    compare,
    reference_for,
)
from paragraph.tvm_interop.runtime.vm import build_vm, run_vm


@pytest.fixture(scope="module")
def squeezenet():
    return models.get("squeezenet1_1", reduced=True)


def test_a_default_build_reports_its_check_on_three_seeds(squeezenet):
    exe = paragraph.build(squeezenet, schedule="sequential")
    check = exe.report["check"]
    assert check["equal"] and check["seeds"] == [0, 1, 2]
    assert check["reference"] == "the numpy interpreter"
    assert 0 <= check["max_difference"] <= check["tolerance"]


def _opaque_module() -> tvm.IRModule:
    """x -> cumsum (an operator the IR does not model) -> relu, twice the same cumsum."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 37), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.cumsum(x, axis=1))
            b = bb.emit(relax.op.nn.relu(a))
            c = bb.emit(relax.op.cumsum(b, axis=1))
            out = bb.emit_output(relax.op.add(c, x))
        bb.emit_func_output(out)
    return bb.get()


def test_opaque_operators_run_on_tvm_default_kernels_in_the_reference():
    mod = _opaque_module()
    graph = from_relax(mod)
    assert sum(n.kind == "opaque" for n in graph.nodes) == 2
    ref = GraphReference(graph)
    assert "2 opaque operator(s) (1 distinct)" in ref.name  # one function for both cumsums
    x = np.random.default_rng(0).standard_normal((2, 37)).astype("float32")
    expected = np.cumsum(np.maximum(np.cumsum(x, 1), 0), 1) + x
    np.testing.assert_allclose(ref.outputs([x])[0], expected, rtol=1e-5, atol=1e-5)
    exe = paragraph.build(mod, schedule="sequential")
    assert exe.report["check"]["equal"], exe.report["check"]


def test_an_onnx_file_is_checked_against_onnx_runtime(tmp_path):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    helper = onnx.helper
    w = onnx.numpy_helper.from_array(
        np.random.default_rng(1).standard_normal((8, 3, 3, 3)).astype("float32"), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Sigmoid", ["c"], ["y"])], "conv",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 9, 9])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8, 9, 9])], [w])
    path = tmp_path / "conv.onnx"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what every ONNX Runtime reads
    onnx.save(model, str(path))
    exe = paragraph.build(path, schedule="sequential")
    assert exe.report["check"]["reference"] == "ONNX Runtime"
    assert exe.report["check"]["equal"], exe.report["check"]
    assert isinstance(reference_for(str(path), from_relax(load(path))), OnnxRuntimeReference)


def test_the_comparison_sees_a_wrong_program(squeezenet):
    """A program of the model with one weight changed by 1% differs from the reference on
    every seed: the check must say so (it compares with the original, not with itself)."""
    graph = from_relax(squeezenet)
    ref = GraphReference(graph)
    wrong = _perturbed(squeezenet)
    vm = build_vm(wrong)
    result = compare(lambda inputs: run_vm(vm, inputs), graph, ref, 1e-4)
    assert not result.equal and result.difference > 1e-3
    assert "DIFFERENT" in result.describe()
    right = build_vm(squeezenet)
    same = compare(lambda inputs: run_vm(right, inputs), graph, ref, 1e-4)
    assert same.equal, same.describe()


def _perturbed(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with its largest weight scaled by 1.01."""
    graph = from_relax(mod)
    biggest = max((n for n in graph.nodes if n.kind == "weight"), key=lambda n: n.value.size)
    changed = biggest.replace(id=graph.next_id, value=biggest.value * np.float32(1.01))
    return to_relax(graph.replace_subgraph([biggest.id], [changed],
                                           {biggest.out: changed.out}))


def test_a_rewritten_program_that_differs_is_dropped_and_the_build_goes_on(squeezenet):
    """A plan whose program carries rewrites and computes something else (its weights
    perturbed) is replaced by the model's own program, with a warning naming the rewrites."""
    with Session() as session:
        program = session.build(_perturbed(squeezenet), "tvm", ["a-wrong-rewrite"])
        plan = plan_schedule("sequential", program, session)
        options = CompileOptions(kernels="tvm", schedule="sequential")
        with pytest.warns(RuntimeWarning, match="a-wrong-rewrite"):
            checked = _checked(plan, squeezenet, squeezenet, options, session)
    assert isinstance(checked, Plan)
    assert checked.report.dropped == ("a-wrong-rewrite",)
    assert not checked.program.rewrites
    assert checked.report.check is not None and checked.report.check.equal


def _cancelling_module(scale: float = 1.0) -> tvm.IRModule:
    """``x @ A - x @ B`` with B within 1e-4 of A: its outputs are a thousandth of the terms
    they are the difference of, so float32 rounding of the terms is ~1e-3 of them, past the
    check's tolerance however the sums are ordered (as in a deep model with random weights)."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((512, 64)).astype("float32")
    b = (a * (1 + 1e-4 * rng.standard_normal(a.shape))).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 512), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            p = bb.emit(relax.op.matmul(x, relax.const(a * np.float32(scale))))
            q = bb.emit(relax.op.matmul(x, relax.const(b)))
            out = bb.emit_output(relax.op.subtract(p, q))
        bb.emit_func_output(out)
    return bb.get()


def test_a_difference_within_the_models_float32_rounding_is_equal():
    """Past the tolerance, the check measures how far the reference itself is from the
    float64 interpreter and allows `ROUNDING_FACTOR` times that; a program that computes
    something else is still far outside it."""
    from paragraph.tvm_interop.runtime.reference import ROUNDING_FACTOR

    mod = _cancelling_module()
    graph = from_relax(mod)
    ref = GraphReference(graph)
    x = np.random.default_rng(0).standard_normal((4, 512)).astype("float32")
    wide = ref.outputs([x], wide=True)[0]
    assert wide.dtype == np.float64
    vm = build_vm(mod)
    result = compare(lambda inputs: run_vm(vm, inputs), graph, ref, 1e-4)
    assert result.difference > 1e-4, "the model no longer rounds past the tolerance"
    assert result.rounding is not None and result.rounding > 1e-5
    assert result.equal and result.allowed == ROUNDING_FACTOR * result.rounding
    assert "float32 rounding" in result.describe() and "equal" in result.describe()
    assert result.to_json()["reference_rounding"] == result.rounding
    wrong = build_vm(_cancelling_module(scale=1.001))
    bad = compare(lambda inputs: run_vm(wrong, inputs), graph, ref, 1e-4)
    assert not bad.equal and bad.difference > 10 * bad.allowed
    # within the tolerance, the rounding is not measured
    same = compare(lambda inputs: ref.outputs(inputs), graph, ref, 1e-4)
    assert same.rounding is None and same.equal
