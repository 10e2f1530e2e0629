"""The default CPU schedules for TVM's own kernels
(`paragraph.tvm_interop.build.cpu_schedules`): each scheduled pool or data-movement kernel
computes what LegalizeOps' unscheduled kernel computes,
on shapes that break its assumptions (channels no vector width divides, padding, ceil mode,
epilogues, transposes of odd sizes), and so does each element-wise chain; other kernels are
left alone."""

from functools import reduce

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from paragraph import models
from paragraph.tvm_interop.build.cpu_schedules import default_schedules
from paragraph.tvm_interop.build.program import build_program
from paragraph.tvm_interop.runtime.target import resolve_target

TARGET = resolve_target("cpu")


def legalized(shape, body):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(body(bb, x))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    return tvm.transform.Sequential([relax.transform.AnnotateTIROpPattern(),
                                     relax.transform.FuseOps(), relax.transform.FuseTIR()])(mod)


def run(mod, x):
    vm = relax.VirtualMachine(tvm.compile(mod, target=TARGET), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def scheduled(mod):
    with TARGET:
        out = default_schedules()(mod)
    return out, [gv.name_hint for gv in out.functions if isinstance(out[gv], tirx.PrimFunc)
                 and "tirx.is_scheduled" in (out[gv].attrs or {})]


NN = relax.op.nn
CASES = {
    "max_3x3_s2": ((1, 15, 15, 64), lambda bb, x: NN.max_pool2d(x, 3, 2, layout="NHWC")),
    "max_padded_11_channels": ((1, 9, 9, 11), lambda bb, x: NN.max_pool2d(
        x, 3, 1, padding=1, layout="NHWC")),
    "max_ceil_mode": ((2, 10, 10, 24), lambda bb, x: NN.max_pool2d(
        x, 3, 2, ceil_mode=True, layout="NHWC")),
    "avg_counting_padding": ((1, 8, 8, 48), lambda bb, x: NN.avg_pool2d(
        x, 3, 1, padding=1, count_include_pad=True, layout="NHWC")),
    "avg_uncounted_asymmetric_44": ((1, 11, 11, 44), lambda bb, x: NN.avg_pool2d(
        x, 3, 2, padding=(0, 0, 1, 1), count_include_pad=False, layout="NHWC")),
    "avg_then_relu_add": ((1, 7, 7, 32), lambda bb, x: relax.op.add(
        bb.emit(NN.relu(bb.emit(NN.avg_pool2d(x, 3, 1, padding=1, layout="NHWC")))), x)),
    "global_avg": ((1, 5, 5, 80), lambda bb, x: NN.adaptive_avg_pool2d(
        x, (1, 1), layout="NHWC")),
}



def heads(shape, perm):
    """BERT's attention heads: a (tokens, hidden) matrix reshaped and permuted."""
    tokens, hidden = shape
    return lambda bb, x: relax.op.permute_dims(
        bb.emit(relax.op.reshape(x, (1, tokens, 4, hidden // 4))), perm)


MOVES = {
    "heads_rows": ((64, 256), heads((64, 256), (0, 2, 1, 3))),
    "heads_transposed": ((64, 256), heads((64, 256), (0, 2, 3, 1))),
    "heads_transposed_odd": ((12, 40), heads((12, 40), (0, 2, 3, 1))),
    "transpose_back": ((1, 4, 64, 16), lambda bb, x: relax.op.reshape(
        bb.emit(relax.op.permute_dims(x, (0, 2, 1, 3))), (64, 64))),
    "scale_then_relu": ((3, 5, 32), lambda bb, x: NN.relu(
        bb.emit(relax.op.multiply(x, relax.const(0.5, "float32"))))),
}

RNG = np.random.default_rng(5)


def batch_norm_relu(channels):
    """DenseNet's batch norm and relu after a concatenation, NHWC: per-channel constants
    broadcast against the tensor, one loop nest per operator before scheduling."""
    def body(bb, x):
        y = x
        for op in (relax.op.subtract, relax.op.divide, relax.op.multiply, relax.op.add):
            c = RNG.uniform(0.5, 1.5, (1, 1, 1, channels)).astype("float32")
            y = bb.emit(op(y, relax.const(c)))
        return NN.relu(y)
    return body


def lstm_cell(hidden):
    """An LSTM step's cell update from its four gates' one product (each gate a slice)."""
    def body(bb, x):
        gate = [bb.emit(relax.op.strided_slice(x, [1], [k * hidden], [(k + 1) * hidden]))
                for k in range(4)]
        c = relax.const(RNG.standard_normal((1, hidden), "float32"))
        return relax.op.add(bb.emit(relax.op.multiply(gate[2], c)),
                            bb.emit(relax.op.multiply(gate[0], gate[3])))
    return body


ELEMENTWISE = {
    "lstm_cell_sliced_gates": ((1, 4 * 40), lstm_cell(40)),
    "batch_norm_relu": ((1, 6, 5, 48), batch_norm_relu(48)),
    "batch_norm_relu_odd_channels": ((1, 3, 4, 13), batch_norm_relu(13)),
    "two_tensors_broadcast": ((2, 4, 16), lambda bb, x: relax.op.multiply(
        bb.emit(relax.op.add(x, x)), relax.const(RNG.standard_normal((4, 1), "float32")))),
}


@pytest.mark.parametrize("case", sorted(CASES) + sorted(MOVES) + sorted(ELEMENTWISE))
def test_scheduled_kernels_compute_what_tvm_computes(case):
    shape, body = {**CASES, **MOVES, **ELEMENTWISE}[case]
    mod = legalized(shape, body)
    out, names = scheduled(mod)
    assert names, f"no kernel of {case} was scheduled"
    x = np.random.default_rng(7).standard_normal(shape, dtype="float32")
    np.testing.assert_allclose(run(out, x), run(mod, x), rtol=1e-6, atol=1e-6)


def test_other_kernels_are_left_alone():
    mod = legalized((4, 33), lambda bb, x: NN.softmax(x))
    assert scheduled(mod)[1] == []
    mod = legalized((1, 8, 8, 16), lambda bb, x: relax.op.sum(x, axis=[1, 2]))
    assert scheduled(mod)[1] == []
    # two outputs: the first nest cannot be inlined, and the refusal is not an error
    mod = legalized((4, 32), lambda bb, x: relax.op.split(x, 2, axis=1))
    assert scheduled(mod)[1] == []
    # a transpose whose rows no vector width divides
    mod = legalized((5, 7, 3), lambda bb, x: relax.op.permute_dims(
        bb.emit(relax.op.reshape(x, (7, 5, 3))), (2, 0, 1)))
    assert scheduled(mod)[1] == []


def test_every_pool_of_the_zoo_is_scheduled():
    """NASNet-A's pools come fused with adds and padding: the rule takes them all."""
    for name in ("inception_v3", "nasnet_a_mobile"):
        program = build_program(models.get(name, reduced=True), TARGET, kernels="vendor")
        pools = {gv.name_hint: "tirx.is_scheduled" in (program.lowered[gv].attrs or {})
                 for gv in program.lowered.functions
                 if isinstance(program.lowered[gv], tirx.PrimFunc) and "pool" in gv.name_hint}
        assert pools and all(pools.values()), (name, pools)


@pytest.mark.parametrize("op", ["sigmoid", "tanh"])
def test_fast_sigmoid_and_tanh_are_within_a_few_ulp_and_keep_nans_and_tails(op):
    """A float32 sigmoid or tanh left to TVM on a CPU is legalized in its fast form
    (`lowering.EXTRA_LEGALIZE`): within 4e-7 of numpy's in float64 over [-30, 30], 1 and
    -1 (or 0) at the tails (+-inf, +-100), NaN kept; what is not float32 keeps TVM's exact
    form; a chain of them lowers as fast as one (each reads its argument once)."""
    from paragraph.tvm_interop.build.lowering import EXTRA_LEGALIZE

    def built(dtype):
        bb = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType((1, 4099), dtype))
        with bb.function("main", [x]):
            with bb.dataflow():
                out = bb.emit_output(getattr(relax.op, op)(x))
            bb.emit_func_output(out)
        with TARGET:
            mod = relax.transform.LegalizeOps(EXTRA_LEGALIZE)(bb.get())
        return mod

    mod = built("float32")
    text = mod.script()
    assert "T.exp(" not in text and "T.tanh(" not in text and "T.sigmoid(" not in text
    x = np.linspace(-30, 30, 4099, dtype="float32")[None]
    x[0, :6] = [np.nan, np.inf, -np.inf, 100.0, -100.0, 0.0]
    got = run(mod, x)
    want = (1 / (1 + np.exp(-x.astype("float64"))) if op == "sigmoid"
            else np.tanh(x.astype("float64")))
    assert np.isnan(got[0, 0])
    np.testing.assert_allclose(got[0, 1:], want[0, 1:], rtol=0, atol=4e-7)
    assert got[0, 1] == got[0, 3] == 1.0  # +inf, +100
    if op == "tanh":
        assert got[0, 2] == got[0, 4] == -1.0  # -inf, -100
    else:  # 0 up to float32's subnormals (e^88.4 is its largest power of e)
        assert 0.0 <= got[0, 2] == got[0, 4] < 5e-39
    exact = built("float64").script()
    assert any(f in exact for f in ("T.tanh(", "T.exp(", "T.sigmoid("))
    chain = legalized((1, 64), lambda bb, x: reduce(
        lambda y, _: bb.emit(getattr(relax.op, op)(y)), range(7), x))  # exact forms
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = x
            for _ in range(8):
                y = bb.emit(getattr(relax.op, op)(y))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    with TARGET:
        mod = relax.transform.LegalizeOps(EXTRA_LEGALIZE)(bb.get())
        fused = tvm.transform.Sequential([
            relax.transform.AnnotateTIROpPattern(), relax.transform.FuseOps(),
            relax.transform.FuseTIR(), default_schedules()])(mod)
    assert len(fused.script()) < 40 * len(chain.script())  # it grew 4x a link when inlined
    xs = np.linspace(-3, 3, 64, dtype="float32")[None]
    want = xs.astype("float64")
    for _ in range(8):
        want = 1 / (1 + np.exp(-want)) if op == "sigmoid" else np.tanh(want)
    np.testing.assert_allclose(run(fused, xs), want, rtol=0, atol=2e-6)


def test_relu_left_to_tvm_keeps_nan():
    """relu legalized as ``x < 0 ? 0 : x`` (`lowering.EXTRA_LEGALIZE`): NaN stays NaN as in
    ONNX Runtime and PyTorch (TOPI's ``max(x, 0)`` made it 0); the rest as relu; and a whole
    program built with TVM's kernels keeps a NaN through a relu to its output."""
    from paragraph import GraphBuilder
    from paragraph.passes.schedule import make_schedule
    from paragraph.tvm_interop.build.lowering import EXTRA_LEGALIZE
    from paragraph.tvm_interop.frontend.relax_graph import to_relax
    from paragraph.tvm_interop.runtime.executor import make_executor

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 37), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(x))
        bb.emit_func_output(out)
    with TARGET:
        mod = relax.transform.LegalizeOps(EXTRA_LEGALIZE)(bb.get())
    x = np.linspace(-3, 3, 37, dtype="float32")[None]
    x[0, :4] = [np.nan, np.inf, -np.inf, -0.0]
    got = run(mod, x)
    assert np.isnan(got[0, 0]) and got[0, 1] == np.inf and got[0, 2] == 0.0
    np.testing.assert_array_equal(got[0, 3:], np.maximum(x[0, 3:], 0))
    b = GraphBuilder()
    inp = b.input((1, 37))
    w = b.weight(np.linspace(0.5, 1.5, 37, dtype="float32")[None])
    g = b.build([b.op("relu", [b.op("multiply", [inp, w]).out]).out])
    program = build_program(to_relax(g), TARGET, kernels="tvm")
    with make_executor(program, make_schedule("sequential", program.graph)) as ex:
        (y,) = ex.run(x)
    y = np.asarray(y)
    assert np.isnan(y[0, 0]) and y[0, 1] == np.inf and (y[0, 2:] >= 0).all()


@pytest.mark.parametrize("case", ["clip", "relu6", "max over rows", "max over all, kept"])
def test_clip_and_the_max_reduction_left_to_tvm_keep_nan(case):
    """clip (relu6's, hard-sigmoid's) legalized as ``x < lo ? lo : (x > hi ? hi : x)`` and
    the max reduction with a NaN-absorbing combiner (`lowering.EXTRA_LEGALIZE`): a NaN in the
    input stays NaN as in numpy and PyTorch (TOPI's ``max(min(x, hi), lo)`` made it ``lo``, its
    max reduction dropped a NaN unless it came last); infinities and the rest as numpy's."""
    from paragraph.tvm_interop.build.lowering import EXTRA_LEGALIZE

    x = np.linspace(-9, 9, 4 * 37, dtype="float32").reshape(4, 37)
    x[0, 3], x[1, 0], x[2, 36], x[3, 5] = np.nan, np.inf, -np.inf, np.nan
    ops = {"clip": (lambda v: relax.op.clip(v, -1.5, 2.0), lambda a: np.clip(a, -1.5, 2.0)),
           "relu6": (lambda v: relax.op.clip(v, 0.0, 6.0), lambda a: np.clip(a, 0, 6)),
           "max over rows": (lambda v: relax.op.max(v, axis=[1]), lambda a: a.max(axis=1)),
           "max over all, kept": (lambda v: relax.op.max(v, keepdims=True),
                                  lambda a: a.max(keepdims=True))}
    build, want = ops[case]
    bb = relax.BlockBuilder()
    v = relax.Var("x", relax.TensorType(x.shape, "float32"))
    with bb.function("main", [v]):
        with bb.dataflow():
            out = bb.emit_output(build(v))
        bb.emit_func_output(out)
    with TARGET:
        mod = relax.transform.LegalizeOps(EXTRA_LEGALIZE)(bb.get())
    np.testing.assert_array_equal(run(mod, x), want(x))
