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
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax
from tvm.ir.expr import Constant
from tvm.script import ir as I  # noqa: N812 - TVMScript's own spelling
from tvm.script import relax as R  # noqa: N812

import paragraph
from paragraph.errors import ModelLoadError, UnsupportedModelError
from paragraph.tvm_interop import from_relax, load, prepare, to_relax
from paragraph.tvm_interop.build.program import build_program
from paragraph.tvm_interop.frontend import onnx_converters

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


# ---------------------------------------------------------------------------- ONNX: TVM's gaps
# Exports as the public corpus makes them (benchmarks/corpus_models.py: TorchScript exporter,
# opset 17, constant folding on) of small modules with what failed there: sizes computed with
# Shape at run time (ShuffleNetV2's channel split, Swin's window padding), LSTM and GRU (absent
# from TVM's frontend), and Clip (two opaque kernels from TVM's converter). Each runs through
# `paragraph.build` against ONNX Runtime.
BUILD_TOL = {"rtol": 1e-5, "atol": 1e-5}


def export_corpus_style(torch, model, args: tuple, path: Path, names: list[str]) -> Path:
    pytest.importorskip("onnx")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the exporter's deprecation and tracer warnings
        torch.onnx.export(model.eval(), args, str(path), dynamo=False, opset_version=17,
                          input_names=names, output_names=["y"])
    return path


def assert_builds_like_onnxruntime(path: Path, *inputs: np.ndarray) -> None:
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {i.name: x for i, x in zip(session.get_inputs(), inputs, strict=True)}
    expected = session.run(None, feeds)[0]
    got = paragraph.build(str(path), schedule="sequential").run(*inputs)
    got = got[0] if isinstance(got, (list, tuple)) else got
    np.testing.assert_allclose(np.asarray(got), expected, **BUILD_TOL)


def onnx_ops(onnx, path: Path) -> set[str]:
    return {n.op_type for n in onnx.load(str(path)).graph.node}


def test_onnx_channel_shuffle_sizes_from_shape_fold(torch, onnx, tmp_path):
    """ShuffleNetV2's unit: ``chunk`` (Slice ends from Shape / 2) and the channel shuffle
    (view to sizes read from ``x.shape``). TVM's frontend left the Slice ends dynamic, and the
    convolution after it failed to legalise."""
    nn = torch.nn

    class Shuffle(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Conv2d(8, 8, 1)
            self.branch = nn.Conv2d(4, 4, 3, padding=1, groups=4)

        def forward(self, x):
            a, b = self.stem(x).chunk(2, dim=1)
            y = torch.cat([a, torch.relu(self.branch(b))], dim=1)
            n, c, h, w = y.shape
            return y.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous().view(n, c, h, w)

    torch.manual_seed(0)
    path = export_corpus_style(torch, Shuffle(), (torch.zeros(1, 8, 6, 6),), tmp_path / "s.onnx",
                               ["x"])
    assert "Shape" in onnx_ops(onnx, path)
    mod = load(path)
    assert "relax.shape_of" not in op_names(mod)
    x = np.random.default_rng(5).standard_normal((1, 8, 6, 6)).astype("float32")
    assert_builds_like_onnxruntime(path, x)


@pytest.mark.parametrize("size", [6, 8])
def test_onnx_shifted_windows_padded_by_computed_sizes(torch, onnx, tmp_path, size):
    """Swin's window attention input: padded to whole windows by amounts computed from
    ``x.shape`` (2 at 6 x 6, zero at 8 x 8, where the Pad goes), rolled, cut into windows by a
    view to sizes of the padded tensor. TVM's frontend failed on the Reshape ("Reshape expects
    the input tensor to have known shape")."""
    nn, functional = torch.nn, torch.nn.functional

    class Windows(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 4)

        def forward(self, x):
            b, h, w, c = x.shape
            x = functional.pad(x, (0, 0, 0, (4 - w % 4) % 4, 0, (4 - h % 4) % 4))
            _, ph, pw, _ = x.shape
            x = torch.roll(x, shifts=(-2, -2), dims=(1, 2))
            x = x.view(b, ph // 4, 4, pw // 4, 4, c).permute(0, 1, 3, 2, 4, 5)
            x = x.reshape(b * (ph // 4) * (pw // 4), 16, c)
            return torch.softmax(self.proj(x) @ x.transpose(1, 2), dim=-1)

    torch.manual_seed(0)
    shape = (1, size, size, 4)
    path = export_corpus_style(torch, Windows(), (torch.zeros(shape),), tmp_path / "w.onnx",
                               ["x"])
    assert {"Shape", "Pad"} <= onnx_ops(onnx, path)
    x = np.random.default_rng(6).standard_normal(shape).astype("float32")
    assert_builds_like_onnxruntime(path, x)


def test_onnx_lstm_language_model(torch, onnx, tmp_path):
    """A two-layer LSTM language model (the corpus's lstm_lm, small): token ids in, logits out;
    zero initial states."""
    nn = torch.nn

    class LM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(50, 8)
            self.rnn = nn.LSTM(8, 16, num_layers=2, batch_first=True)
            self.head = nn.Linear(16, 50)

        def forward(self, ids):
            out, _ = self.rnn(self.embed(ids))
            return self.head(out)

    torch.manual_seed(0)
    ids = torch.zeros(1, 5, dtype=torch.int64)
    path = export_corpus_style(torch, LM(), (ids,), tmp_path / "lm.onnx", ["ids"])
    assert "LSTM" in onnx_ops(onnx, path)
    tokens = np.random.default_rng(7).integers(0, 50, (1, 5)).astype("int64")
    assert_builds_like_onnxruntime(path, tokens)


def test_onnx_bidirectional_gru_with_initial_state(torch, onnx, tmp_path):
    """The corpus's gru_classifier (small): two bidirectional layers, GRU's
    linear_before_reset as torch exports it, the initial state an input of the model."""
    nn = torch.nn

    class Classifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = nn.GRU(6, 8, num_layers=2, batch_first=True, bidirectional=True)
            self.head = nn.Linear(16, 3)

        def forward(self, x, h0):
            out, _ = self.rnn(x, h0)
            return self.head(out[:, -1])

    torch.manual_seed(0)
    args = (torch.zeros(1, 7, 6), torch.zeros(4, 1, 8))
    path = export_corpus_style(torch, Classifier(), args, tmp_path / "gru.onnx", ["x", "h0"])
    assert "GRU" in onnx_ops(onnx, path)
    rng = np.random.default_rng(8)
    x, h0 = (rng.standard_normal(tuple(a.shape)).astype("float32") for a in args)
    assert_builds_like_onnxruntime(path, x, h0)


def test_onnx_relu6_is_one_relax_clip(torch, onnx, tmp_path):
    """conv + ReLU6 (MobileNetV2's) and a hardtanh: each ONNX Clip is one ``relax.clip`` with
    constant bounds (TVM's converter made two opaque call_tir kernels)."""
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)

        def forward(self, x):
            return nn.functional.hardtanh(torch.nn.functional.relu6(self.conv(x)) - 3.0,
                                          -0.5, 0.5)

    torch.manual_seed(0)
    path = export_corpus_style(torch, Block(), (torch.zeros(1, 3, 8, 8),), tmp_path / "c.onnx",
                               ["x"])
    assert [n.op_type for n in onnx.load(str(path)).graph.node].count("Clip") == 2
    mod = load(path)
    clips = [b.value for b in mod["main"].body.blocks[0].bindings
             if isinstance(b.value, relax.Call) and b.value.op.name == "relax.clip"]
    assert [(float(c.args[1].value), float(c.args[2].value)) for c in clips] == [
        (0.0, 6.0), (-0.5, 0.5)]
    assert "relax.call_tir" not in op_names(mod)
    x = 3 * np.random.default_rng(9).standard_normal((1, 3, 8, 8)).astype("float32")
    assert_builds_like_onnxruntime(path, x)


def test_onnx_group_norm_needs_no_transposes(torch, onnx, tmp_path):
    """PoolFormer's block: ``GroupNorm(1, C)`` (a reshape to (N, 1, C*H*W), an instance norm,
    a reshape back, a (C, 1, 1) scale and shift), then its pooling token mixer. The norm's
    statistics are taken over the 4-D tensor's axes 1..3 (whole-image means, then over
    channels) and the constants are at full rank (`layout_free`), so the NHWC program has no
    transpose kernel but the output's (back to NCHW), and the whole-image means are vendor
    pools; the outputs are ONNX Runtime's."""
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.norm = nn.GroupNorm(1, 8)
            self.pool = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
            self.scale = nn.Parameter(torch.rand(8, 1, 1) + 0.5)
            self.head = nn.Conv2d(8, 4, 1)

        def forward(self, x):
            y = self.conv(x)
            z = self.norm(y)
            return self.head(y + self.scale * (self.pool(z) - z))

    torch.manual_seed(0)
    with torch.no_grad():
        block = Block()
        block.norm.weight.uniform_(0.5, 1.5)
        block.norm.bias.uniform_(-0.5, 0.5)
    path = export_corpus_style(torch, block, (torch.zeros(1, 3, 10, 9),), tmp_path / "g.onnx",
                               ["x"])
    assert "InstanceNormalization" in onnx_ops(onnx, path)
    mod = load(path)
    assert "relax.reshape" not in op_names(mod)
    reductions = [b.value for b in mod["main"].body.blocks[0].bindings
                  if isinstance(b.value, relax.Call)
                  and b.value.op.name in ("relax.mean", "relax.variance")]
    # mean and variance, each as a whole-image mean (the vendor's average pool) then a mean
    # over channels; the variance's over (x - mean)^2, the mean taken once
    assert [(r.op.name, [int(a) for a in r.attrs.axis]) for r in reductions] == [
        ("relax.mean", [2, 3]), ("relax.mean", [1])] * 2
    program = paragraph.build(str(path), schedule="sequential").program
    names = [str(n.attrs.get("func", "")) for n in program.graph.nodes if n.kind == "kernel"]
    assert [n for n in names if "transpose" in n] == [names[-1]], names
    assert sum("avg_pool2d.NHWC.k10x9" in n for n in names) == 2, names
    x = np.random.default_rng(3).standard_normal((1, 3, 10, 9)).astype("float32")
    assert_builds_like_onnxruntime(path, x)


def test_full_rank_constants_keep_values_and_leave_scalars():
    """A (C, 1, 1) constant against an (N, C, H, W) tensor becomes (1, C, 1, 1), on either
    side of the operator, and goes second in a commutative one; a 0-d constant stays 0-d; the
    function computes the same."""
    from paragraph.tvm_interop.frontend.layout_free import full_rank_constants

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 3, 4, 5), "float32"))
    c = np.arange(3, dtype="float32").reshape(3, 1, 1) + 1
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.multiply(relax.const(c), x))
            y = bb.emit(relax.op.subtract(relax.const(c), y))
            y = bb.emit(relax.op.add(y, relax.const(np.float32(2))))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    mod = bb.get()
    new = full_rank_constants(mod)
    shapes = [tuple(int(d) for d in a.ty.shape) for b in new["main"].body.blocks[0].bindings
              if isinstance(b.value, relax.Call) for a in b.value.args
              if isinstance(a, Constant)]
    assert shapes == [(1, 3, 1, 1), (1, 3, 1, 1), ()]
    first = new["main"].body.blocks[0].bindings[0].value
    assert isinstance(first.args[0], relax.Var) and isinstance(first.args[1], Constant)
    data = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype("float32")
    want = c - data * c + 2
    for m in (mod, new):
        vm = relax.VirtualMachine(tvm.compile(m, "llvm"), tvm.cpu())
        np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(data)).numpy(), want,
                                   rtol=1e-6)


# ---------------------------------------------------------------------------- hand-made nodes
def one_node_model(onnx, path: Path, node, inputs: list[tuple[str, tuple[int, ...]]],
                   initializers: dict[str, np.ndarray], opset: int = 17) -> Path:
    helper = onnx.helper
    graph = helper.make_graph(
        [node], "one",
        [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in node.output],
        [onnx.numpy_helper.from_array(v, n) for n, v in initializers.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=8)  # what ONNX Runtime reads
    onnx.save(onnx.shape_inference.infer_shapes(model), str(path))  # the outputs' shapes
    return path


def onnxruntime_outputs(path: Path, *inputs: np.ndarray) -> list[np.ndarray]:
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: x for i, x in zip(session.get_inputs(), inputs,
                                                         strict=True)})


def run_vm_all(mod: tvm.IRModule, *inputs: np.ndarray) -> list[np.ndarray]:
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(x) for x in inputs])
    return [o.numpy() for o in out] if isinstance(out, tvm_ffi.Array) else [out.numpy()]


@pytest.mark.parametrize(("bounds", "expected"), [
    ((np.nan, 0.5), (-np.inf, 0.5)),  # a NaN bound is no bound (ONNX, ONNX Runtime)
    ((-0.5, np.nan), (-0.5, np.inf)),
])
def test_onnx_clip_nan_bound_is_unbounded(onnx, tmp_path, bounds, expected):
    node = onnx.helper.make_node("Clip", ["x", "lo", "hi"], ["y"])
    consts = {"lo": np.array(bounds[0], "float32"), "hi": np.array(bounds[1], "float32")}
    path = one_node_model(onnx, tmp_path / "clip.onnx", node, [("x", (2, 5))], consts)
    mod = load(path)
    (clip,) = [b.value for b in mod["main"].body.blocks[0].bindings]
    assert clip.op.name == "relax.clip"
    assert (float(clip.args[1].value), float(clip.args[2].value)) == expected
    x = np.array([[-3, -0.5, 0, 0.25, 4], [-1, 1, -0.75, 0.75, 0.5]], "float32")
    np.testing.assert_array_equal(run_vm(mod, x), onnxruntime_outputs(path, x)[0])


def test_onnx_clip_bound_computed_at_run_time_goes_to_tvm(onnx, tmp_path):
    node = onnx.helper.make_node("Clip", ["x", "lo"], ["y"])
    path = one_node_model(onnx, tmp_path / "clip.onnx", node, [("x", (2, 3)), ("lo", ())], {})
    x = np.random.default_rng(10).standard_normal((2, 3)).astype("float32")
    lo = np.array(0.1, "float32")
    np.testing.assert_array_equal(run_vm(load(path), x, lo), onnxruntime_outputs(path, x, lo)[0])


RNN_CASES = {  # op, attributes, (input, hidden), with B, with initial states as inputs
    "gru-reverse-reset-after": ("GRU", {"direction": "reverse", "linear_before_reset": 0}, True,
                                False),
    "gru-forward-no-bias": ("GRU", {"linear_before_reset": 1}, False, True),
    "lstm-bidirectional-states": ("LSTM", {"direction": "bidirectional"}, True, True),
    "lstm-reverse": ("LSTM", {"direction": "reverse"}, False, False),
}


@pytest.mark.parametrize("case", list(RNN_CASES))
def test_onnx_recurrent_node_matches_onnxruntime(onnx, tmp_path, case):
    """The variants of paragraph's LSTM and GRU converters the exporters' models above do not
    reach, as single nodes: all three outputs against ONNX Runtime."""
    op, attrs, with_bias, with_states = RNN_CASES[case]
    gates, hidden, seq, batch, size = (4 if op == "LSTM" else 3), 5, 4, 2, 3
    dirs = 2 if attrs.get("direction") == "bidirectional" else 1
    rng = np.random.default_rng(11)
    consts = {"W": rng.standard_normal((dirs, gates * hidden, size)),
              "R": rng.standard_normal((dirs, gates * hidden, hidden)) / 2}
    if with_bias:
        consts["B"] = rng.standard_normal((dirs, 2 * gates * hidden))
    consts = {k: v.astype("float32") for k, v in consts.items()}
    states = ["h0", "c0"][:2 if op == "LSTM" else 1] if with_states else []
    inputs = [("x", (seq, batch, size))] + [(s, (dirs, batch, hidden)) for s in states]
    names = ["x", "W", "R", "B" if with_bias else "", ""] + states
    outputs = ["y", "y_h"] + (["y_c"] if op == "LSTM" else [])
    node = onnx.helper.make_node(op, names, outputs, hidden_size=hidden, **attrs)
    path = one_node_model(onnx, tmp_path / "rnn.onnx", node, inputs, consts)
    feeds = [rng.standard_normal(s).astype("float32") for _, s in inputs]
    got, expected = run_vm_all(load(path), *feeds), onnxruntime_outputs(path, *feeds)
    assert [g.shape for g in got] == [e.shape for e in expected]
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, **BUILD_TOL)


@pytest.mark.parametrize(("attrs", "named"), [
    ({"clip": 1.0}, "clip"),
    ({"activations": ["Relu", "Tanh", "Tanh"]}, "activations"),
    ({"input_forget": 1}, "input_forget"),
    ({"layout": 1}, "layout"),
])
def test_onnx_lstm_unsupported_attribute_is_named(onnx, tmp_path, attrs, named):
    rng = np.random.default_rng(12)
    consts = {"W": rng.standard_normal((1, 8, 3)).astype("float32"),
              "R": rng.standard_normal((1, 8, 2)).astype("float32")}
    node = onnx.helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=2, **attrs)
    path = one_node_model(onnx, tmp_path / "lstm.onnx", node, [("x", (4, 1, 3))], consts)
    with pytest.raises(UnsupportedModelError, match=rf"lstm\.onnx: ONNX LSTM with {named}="):
        load(path)


def test_onnx_converters_are_installed_only_while_importing(onnx, tmp_path):
    """paragraph's converters stand in for TVM's only inside `installed` (nested and from
    several threads at once), and TVM's map is back afterwards."""
    from tvm.relax.frontend.onnx import onnx_frontend  # needs onnx

    original = onnx_frontend._get_convert_map
    assert "LSTM" not in original()
    with onnx_converters.installed(onnx_frontend):
        with onnx_converters.installed(onnx_frontend):
            assert "LSTM" in onnx_frontend._get_convert_map()
        assert "LSTM" in onnx_frontend._get_convert_map()
    assert onnx_frontend._get_convert_map is original
    node = onnx.helper.make_node("Clip", ["x", "lo", "hi"], ["y"])
    consts = {"lo": np.array(0, "float32"), "hi": np.array(6, "float32")}
    path = one_node_model(onnx, tmp_path / "clip.onnx", node, [("x", (2, 5))], consts)
    results: list[tvm.IRModule] = []
    threads = [threading.Thread(target=lambda: results.append(load(path))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3 and all(op_names(m) == {"relax.clip"} for m in results)
    assert onnx_frontend._get_convert_map is original


def test_onnx_cumsum_position_ids(torch, onnx, tmp_path):
    """RoBERTa's position ids: a running count of the non-padding tokens (CumSum), for which
    TVM 0.27's LegalizeOps has no rule: paragraph legalizes it (`lowering.EXTRA_LEGALIZE`)."""
    nn = torch.nn

    class Positions(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(20, 4)

        def forward(self, ids):
            mask = ids.ne(1).int()
            positions = torch.cumsum(mask, dim=1).type_as(mask) * mask + 1
            return self.embed(positions)

    ids = torch.zeros(1, 6, dtype=torch.int64)
    path = export_corpus_style(torch, Positions(), (ids,), tmp_path / "pos.onnx", ["ids"])
    assert "CumSum" in onnx_ops(onnx, path)
    tokens = np.array([[3, 1, 5, 7, 1, 2]], "int64")
    assert_builds_like_onnxruntime(path, tokens)


def test_onnx_weights_written_once_per_use_become_one_weight(onnx, tmp_path):
    """An exporter that writes a shared weight once per use (an unrolled recurrence): the
    copies are one constant after import, one weight node of the graph, one buffer."""
    helper, numpy_helper = onnx.helper, onnx.numpy_helper
    w = np.random.default_rng(3).standard_normal((16, 16)).astype("float32") * 0.3
    nodes, inits, prev = [], [], "x"
    for step in range(4):  # h = tanh(h @ W): the same W, a copy per step
        inits.append(numpy_helper.from_array(w.copy(), f"w{step}"))
        nodes += [helper.make_node("MatMul", [prev, f"w{step}"], [f"m{step}"]),
                  helper.make_node("Tanh", [f"m{step}"], [f"h{step}"])]
        prev = f"h{step}"
    info = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "unrolled", [info("x", onnx.TensorProto.FLOAT, [2, 16])],
                              [info(prev, onnx.TensorProto.FLOAT, [2, 16])], initializer=inits)
    path = tmp_path / "unrolled.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=8), str(path))  # one ONNX Runtime reads
    weights = [n for n in from_relax(load(path)).nodes if n.kind == "weight"]
    assert len(weights) == 1
    assert_builds_like_onnxruntime(path, np.random.default_rng(4).standard_normal(
        (2, 16)).astype("float32"))


def test_static_shape_and_index_arithmetic_fold_with_numpy():
    """ViT's and Swin's exports normalise each Gather index at run time from the input's
    shape: shape_of -> shape_to_tensor -> take -> less/add/where. Folded with numpy (exactly:
    integer maths, comparisons, selection), where FoldConstant compiled a kernel for each (37
    in ViT-B/16, 7 s of its import); the gather then reads the right row."""
    from tvm import relax

    from paragraph.tvm_interop.frontend.importers import _NumpyFolder, prepare

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((3, 5, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            dims = bb.emit(relax.op.shape_to_tensor(relax.op.shape_of(x)))
            n = bb.emit(relax.op.take(dims, relax.const(0, "int64"), axis=0, mode="wrap"))
            i = relax.const(-1, "int64")
            fixed = bb.emit(relax.op.where(relax.op.less(i, relax.const(0, "int64")),
                                           relax.op.add(i, n), i))
            out = bb.emit_output(relax.op.take(x, fixed, axis=0))
        bb.emit_func_output(out)
    raw = bb.get()
    text = _NumpyFolder(raw).transform().script(show_meta=False)  # before FoldConstant
    for op in ("shape_of", "shape_to_tensor", "R.where", "R.less", "R.add"):
        assert op not in text, (op, text)
    mod = prepare(raw)
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    a = np.random.default_rng(0).standard_normal((3, 5, 4)).astype("float32")
    np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(a)).numpy(), a[2])
