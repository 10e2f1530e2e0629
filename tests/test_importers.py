"""Tests of paragraph.tvm_interop.frontend.importers: ONNX, torch and Relax sources, and every
error path.

Numerical checks run the imported module on TVM's VM (llvm, CPU) and compare with the source
framework (ONNX Runtime, torch) at 1e-4 absolute and relative: float32 kernels from different
libraries (TVM's LLVM code, MLAS, oneDNN) sum in different orders. The largest difference measured
on this model was 2.7e-7 (outputs of size 0.3), so 1e-4 leaves room for other CPUs and vector
widths without hiding a wrong operator, which shows up as errors of order 1e-1.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax
from tvm.script import ir as I  # noqa: N812 - TVMScript's own spelling
from tvm.script import relax as R  # noqa: N812

from paragraph.errors import ModelLoadError, UnsupportedModelError
from paragraph.tvm_interop import from_relax, load, prepare, to_relax
from paragraph.tvm_interop.build.program import build_program

TOL = {"rtol": 1e-4, "atol": 1e-4}
SHAPE = (1, 3, 16, 16)


# ---------------------------------------------------------------------------- helpers
def run_vm(mod: tvm.IRModule, *inputs: np.ndarray) -> np.ndarray:
    """Compile ``mod`` for the CPU and run ``main`` once."""
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(x) for x in inputs]).numpy()


def op_names(mod: tvm.IRModule) -> set[str]:
    return {b.value.op.name for blk in mod["main"].body.blocks for b in blk.bindings
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)}


def param_shapes(mod: tvm.IRModule) -> list[tuple[int, ...]]:
    return [tuple(int(d) for d in p.ty.shape) for p in mod["main"].params]


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def onnx():
    return pytest.importorskip("onnx")


@pytest.fixture(scope="module")
def small_cnn(torch):
    """conv + BN + relu, two branches joined by concat, max pool, linear; BN stats non-trivial."""
    nn = torch.nn

    class SmallCNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3, padding=1)
            self.bn = nn.BatchNorm2d(8)
            self.left = nn.Conv2d(8, 4, 1)
            self.right = nn.Conv2d(8, 4, 3, padding=1)
            self.pool = nn.MaxPool2d(2)
            self.fc = nn.Linear(8 * 8 * 8, 10)

        def forward(self, x):
            y = torch.relu(self.bn(self.stem(x)))
            y = self.pool(torch.cat([self.left(y), self.right(y)], dim=1))
            return self.fc(torch.flatten(y, 1))

    torch.manual_seed(0)
    model = SmallCNN().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
        model.bn.weight.uniform_(0.5, 1.5)
        model.bn.bias.uniform_(-0.2, 0.2)
    return model


@pytest.fixture(scope="module")
def x() -> np.ndarray:
    return np.random.default_rng(1).standard_normal(SHAPE).astype("float32")


def export_onnx(torch, model, path, dynamic_batch: bool = False):
    """Legacy TorchScript exporter: the dynamo one needs onnxscript. Constant folding is off so
    that BatchNormalization stays a node (the exporter would fold it into the conv)."""
    pytest.importorskip("onnx")
    with warnings.catch_warnings():  # the legacy exporter announces its own deprecation
        warnings.simplefilter("ignore", DeprecationWarning)
        _export_onnx(torch, model, path, dynamic_batch)
    return path


def _export_onnx(torch, model, path, dynamic_batch: bool) -> None:
    torch.onnx.export(model, (torch.zeros(SHAPE),), str(path), dynamo=False,
                      input_names=["x"], output_names=["y"], do_constant_folding=False,
                      dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}} if dynamic_batch
                      else None)


@pytest.fixture(scope="module")
def onnx_path(torch, small_cnn, tmp_path_factory):
    return export_onnx(torch, small_cnn, tmp_path_factory.mktemp("onnx") / "small_cnn.onnx")


@pytest.fixture(scope="module")
def onnx_module(onnx_path):
    return load(onnx_path)


# ---------------------------------------------------------------------------- ONNX
def test_onnx_matches_onnxruntime(onnx, onnx_path, onnx_module, x):
    ort = pytest.importorskip("onnxruntime")
    assert "BatchNormalization" in {n.op_type for n in onnx.load(str(onnx_path)).graph.node}
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"x": x})
    np.testing.assert_allclose(run_vm(onnx_module, x), expected, **TOL)


def test_onnx_module_is_prepared(onnx_module):
    ops = op_names(onnx_module)
    assert "relax.nn.batch_norm" not in ops
    assert {"relax.nn.conv2d", "relax.concat", "relax.nn.max_pool2d"} <= ops
    assert param_shapes(onnx_module) == [SHAPE]  # weights are constants, not inputs
    assert len(onnx_module["main"].body.blocks) == 1


def test_onnx_round_trips_through_graph(onnx_module, x):
    graph = from_relax(onnx_module)
    assert any(n.kind == "conv2d" for n in graph.nodes)
    np.testing.assert_allclose(run_vm(to_relax(graph), x), run_vm(onnx_module, x),
                               rtol=0, atol=1e-6)


def test_onnx_params_kept_as_inputs_get_bound(onnx, onnx_path, onnx_module):
    from tvm.relax.frontend.onnx import from_onnx

    raw = from_onnx(onnx.load(str(onnx_path)), keep_params_in_input=True)
    assert len(raw["main"].params) > 1
    prepared = prepare(raw)
    assert param_shapes(prepared) == [SHAPE]
    assert "params" not in prepared["main"].attrs
    assert tvm_ffi.structural_equal(prepared, onnx_module)


def test_onnx_dynamic_batch_needs_input_shapes(torch, small_cnn, tmp_path):
    path = export_onnx(torch, small_cnn, tmp_path / "dynamic.onnx", dynamic_batch=True)
    with pytest.raises(UnsupportedModelError, match=r"'x'.*batch.*input_shapes"):
        load(path)
    assert param_shapes(load(path, input_shapes={"x": (2, 3, 16, 16)})) == [(2, 3, 16, 16)]
    assert param_shapes(load(str(path), [(3, 3, 16, 16)])) == [(3, 3, 16, 16)]
    with pytest.raises(ModelLoadError, match="not inputs"):
        load(path, input_shapes={"nope": (1, 3, 16, 16)})


def test_onnx_unsupported_operator(onnx, tmp_path):
    helper = onnx.helper
    graph = helper.make_graph(
        [helper.make_node("Celu", ["x"], ["y"])], "celu",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])])
    path = tmp_path / "celu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    with pytest.raises(UnsupportedModelError, match="Celu"):
        load(path)


# ---------------------------------------------------------------------------- torch
@pytest.mark.parametrize("via", ["module", "exported_program"])
def test_torch_matches_torch(torch, small_cnn, x, via):
    args = (torch.from_numpy(x),)
    source = small_cnn if via == "module" else torch.export.export(small_cnn, args)
    mod = load(source, example_inputs=args) if via == "module" else load(source)
    assert "relax.nn.batch_norm" not in op_names(mod)
    assert param_shapes(mod) == [SHAPE]
    with torch.no_grad():
        expected = small_cnn(*args).numpy()
    np.testing.assert_allclose(run_vm(mod, x), expected, **TOL)


def test_torch_module_from_input_shapes(torch, small_cnn):
    small_cnn.train()
    mod = load(small_cnn, input_shapes=[(2, 3, 16, 16)])
    assert param_shapes(mod) == [(2, 3, 16, 16)]
    assert small_cnn.training  # the caller's mode is restored
    small_cnn.eval()


def test_torch_module_needs_inputs(torch, small_cnn):
    with pytest.raises(ModelLoadError, match="example_inputs"):
        load(small_cnn)


def test_torch_unsupported_operator(torch):
    class Bessel(torch.nn.Module):
        def forward(self, x):
            return torch.special.i0(x)

    with pytest.raises(UnsupportedModelError, match="i0"):
        load(Bessel(), input_shapes=[(2, 3)])


def test_pt2_file(torch, small_cnn, tmp_path):
    program = torch.export.export(small_cnn, (torch.zeros(SHAPE),))
    torch.export.save(program, str(tmp_path / "small_cnn.pt2"))
    assert tvm_ffi.structural_equal(load(tmp_path / "small_cnn.pt2"), load(program))


# ---------------------------------------------------------------------------- Relax modules
def conv_bn_module() -> tvm.IRModule:
    rng = np.random.default_rng(2)

    def const(*shape: int, low: float = -1.0) -> relax.Constant:
        return relax.const(rng.uniform(low, 1.0, shape).astype("float32"))

    bb = relax.BlockBuilder()
    data = relax.Var("data", relax.TensorType((1, 3, 8, 8), "float32"))
    with bb.function("main", [data]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(data, const(4, 3, 3, 3)))
            bn = bb.emit(relax.op.nn.batch_norm(y, const(4), const(4), const(4),
                                                const(4, low=0.5), axis=1, training=False))
            out = bb.emit_output(relax.op.nn.relu(relax.TupleGetItem(bn, 0)))
        bb.emit_func_output(out)
    return bb.get()


def test_irmodule_passthrough():
    mod = conv_bn_module()
    before = mod.script()
    loaded = load(mod)
    assert mod.script() == before  # the caller's module is untouched
    assert "relax.nn.batch_norm" not in op_names(loaded)
    data = np.random.default_rng(3).standard_normal((1, 3, 8, 8)).astype("float32")
    np.testing.assert_allclose(run_vm(loaded, data), run_vm(mod, data), rtol=1e-5, atol=1e-5)


def test_weight_params_without_values_stay_inputs():
    bb = relax.BlockBuilder()
    data = relax.Var("data", relax.TensorType((2, 4), "float32"))
    weight = relax.Var("weight", relax.TensorType((4, 3), "float32"))
    with bb.function("main", [data, weight]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(data, weight))
        bb.emit_func_output(out)
    assert [p.name for p in load(bb.get())["main"].params] == ["data", "weight"]


def symbolic_module() -> tvm.IRModule:
    n = tvm.tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    data = relax.Var("data", relax.TensorType((n, 4), "float32"))
    with bb.function("main", [data]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(data))
        bb.emit_func_output(out)
    return bb.get()


def test_symbolic_shape_is_rejected():
    with pytest.raises(UnsupportedModelError, match=r"'data'.*symbolic.*\bn\b"):
        load(symbolic_module())


def test_symbolic_shape_bound_by_input_shapes():
    assert param_shapes(load(symbolic_module(), input_shapes={"data": (3, 4)})) == [(3, 4)]


def test_input_shapes_must_match_static_dims():
    with pytest.raises(ModelLoadError, match="static shape"):
        load(conv_bn_module(), input_shapes=[(2, 3, 8, 8)])


def test_constants_are_folded_numpy_and_tvm():
    # sqrt/expand_dims fold with numpy; sigmoid is not in that table and goes to FoldConstant.
    c = np.linspace(0.5, 2.0, 4, dtype="float32")
    bb = relax.BlockBuilder()
    data = relax.Var("data", relax.TensorType((2, 4), "float32"))
    with bb.function("main", [data]):
        with bb.dataflow():
            root = bb.emit(relax.op.expand_dims(relax.op.sqrt(relax.const(c)), axis=0))
            gate = bb.emit(relax.op.sigmoid(relax.const(c)))
            out = bb.emit_output(relax.op.add(relax.op.multiply(data, root), gate))
        bb.emit_func_output(out)
    mod = bb.get()
    prepared = prepare(mod)
    assert op_names(prepared) == {"relax.multiply", "relax.add"}
    data = np.arange(8, dtype="float32").reshape(2, 4)
    np.testing.assert_allclose(run_vm(prepared, data), data * np.sqrt(c) + 1 / (1 + np.exp(-c)),
                               rtol=1e-6)


@I.ir_module
class TwoBlocksModule:
    # Adjacent dataflow blocks are merged by Relax's normaliser: a plain binding keeps them apart.
    @R.function
    def main(data: R.Tensor((2, 4), "float32")):
        with R.dataflow():
            first = R.nn.relu(data)
            R.output(first)
        middle = R.add(first, first)
        with R.dataflow():
            second = R.negative(middle)
            R.output(second)
        return second


def test_two_dataflow_blocks_are_rejected():
    assert len(TwoBlocksModule["main"].body.blocks) == 3
    with pytest.raises(UnsupportedModelError, match="2 dataflow blocks.*'second'"):
        prepare(TwoBlocksModule)


@I.ir_module
class IfModule:
    @R.function
    def main(cond: R.Tensor((), "bool"), data: R.Tensor((2, 4), "float32")):
        if cond:
            out = R.nn.relu(data)
        else:
            out = R.negative(data)
        return out


def test_control_flow_is_rejected():
    with pytest.raises(UnsupportedModelError, match=r"control flow: 'out'.*relax\.If"):
        load(IfModule)


# ---------------------------------------------------------------------------- load errors
def test_missing_file(tmp_path):
    with pytest.raises(ModelLoadError, match=r"missing\.onnx: no such file"):
        load(tmp_path / "missing.onnx")


def test_corrupt_onnx_file(tmp_path):
    pytest.importorskip("onnx")
    path = tmp_path / "corrupt.onnx"
    path.write_bytes(np.random.default_rng(4).bytes(4096))
    with pytest.raises(ModelLoadError, match=r"corrupt\.onnx.*not"):
        load(path)


def test_empty_onnx_file(tmp_path):
    pytest.importorskip("onnx")
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    with pytest.raises(ModelLoadError, match=r"empty\.onnx is not an ONNX model"):
        load(path)


def test_unknown_extension(tmp_path):
    path = tmp_path / "model.txt"
    path.write_text("not a model")
    with pytest.raises(ModelLoadError, match=r"model\.txt: unknown model file extension '\.txt'"):
        load(path)


def test_directory(tmp_path):
    with pytest.raises(ModelLoadError, match="is a directory"):
        load(tmp_path)


@pytest.mark.parametrize("source", [42, [1, 2], None, b"onnx bytes"])
def test_unsupported_python_object(source):
    with pytest.raises(ModelLoadError, match=r"cannot load a .*paragraph loads .*\.onnx"):
        load(source)


def test_missing_onnx_says_which_extra(monkeypatch, onnx_path):
    monkeypatch.setitem(sys.modules, "onnx", None)  # makes `import onnx` raise ImportError
    with pytest.raises(ModelLoadError, match=r"pip install paragraph\[onnx\]"):
        load(onnx_path)


def test_importers_import_without_torch_and_onnx():
    code = ("import sys; sys.modules['torch'] = sys.modules['onnx'] = None; "
            "import paragraph.tvm_interop.frontend.importers")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_prepare_gives_take_the_clip_mode_so_no_kernel_reads_out_of_bounds():
    """TVM lowers ``take`` in "fast" mode without a bounds check (and warns at every such
    kernel, constant folding's included); prepared, it clamps, and ids in range read the
    same rows."""
    bb = relax.BlockBuilder()
    ids = relax.Var("ids", relax.TensorType((1, 5), "int64"))
    table = np.arange(24, dtype="float32").reshape(6, 4)
    with bb.function("main", [ids]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.take(relax.const(table), ids, axis=0))
        bb.emit_func_output(out)
    mod = prepare(bb.get())
    modes = [b.value.attrs.mode for b in mod["main"].body.blocks[0].bindings
             if isinstance(b.value, relax.Call) and b.value.op.name == "relax.take"]
    assert modes == ["clip"]
    x = np.array([[0, 5, 2, 2, 1]], dtype="int64")
    got = run_vm(mod, x)
    np.testing.assert_array_equal(got, table[x])


def _gather_with_negative_ids(shift: int):
    """main(ids) = take(table, where(ids < 0, ids + shift, ids)): ONNX's Gather, as its
    importer lets ids count from the end (``shift`` the table's rows)."""
    bb = relax.BlockBuilder()
    ids = relax.Var("ids", relax.TensorType((1, 5), "int64"))
    table = np.arange(24, dtype="float32").reshape(6, 4)
    with bb.function("main", [ids]):
        with bb.dataflow():
            negative = bb.emit(relax.op.less(ids, relax.const(0, "int64")))
            shifted = bb.emit(relax.op.add(ids, relax.const(shift, "int64")))
            index = bb.emit(relax.op.where(negative, shifted, ids))
            out = bb.emit_output(relax.op.take(relax.const(table), index, axis=0))
        bb.emit_func_output(out)
    return bb.get(), table


def _ops(mod) -> list[tuple[str, str | None]]:
    return [(b.value.op.name, getattr(b.value.attrs, "mode", None))
            for b in mod["main"].body.blocks[0].bindings
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)]


def test_prepare_folds_the_negative_id_normalisation_into_a_wrapping_take():
    """ONNX's ``where(ids < 0, ids + n, ids)`` before a take over n rows becomes the take's
    "wrap" mode (one kernel fewer per run): every id in [-n, n) reads the same row, and the
    program's input range still admits the negative ones."""
    mod, table = _gather_with_negative_ids(6)
    prepared = prepare(mod)
    assert _ops(prepared) == [("relax.take", "wrap")]
    x = np.array([[0, -1, 5, -6, 2]], dtype="int64")
    np.testing.assert_array_equal(run_vm(prepared, x), table[x])
    program = build_program(prepared, "llvm")
    assert (program.input_ranges[0].low, program.input_ranges[0].high) == (-6, 6)


def test_prepare_keeps_a_normalisation_by_another_extent():
    """A shift that is not the table's row count is not ONNX's normalisation: kept, and the
    take clamps."""
    prepared = prepare(_gather_with_negative_ids(5)[0])
    assert [op for op in _ops(prepared) if op[0] == "relax.take"] == [("relax.take", "clip")]
    assert ("relax.where", None) in _ops(prepared)
