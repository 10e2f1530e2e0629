"""Relax <-> graph: every zoo model round-trips exactly; unsupported models get clear errors."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from paragraph import UnsupportedModelError, models
from paragraph.tvm_interop import from_relax, random_inputs, to_relax
from paragraph.tvm_interop.runtime.vm import build_vm, run_vm


def run_both(original: tvm.IRModule, roundtrip: tvm.IRModule, seed: int = 0):
    """Compile both ``main``s in one module (shared kernels compile once) and run them."""
    both = tvm.IRModule({**dict(original.functions.items()),
                         tvm.ir.GlobalVar("main_rt"):
                         roundtrip["main"].without_attr("global_symbol")})
    vm = build_vm(both, "llvm")
    inputs = random_inputs(original, seed)
    return run_vm(vm, inputs, "main"), run_vm(vm, inputs, "main_rt")


@pytest.mark.parametrize("name", models.list())
def test_zoo_roundtrip_outputs_equal(name):
    mod = models.get(name, reduced=True)
    graph = from_relax(mod)
    assert sum(n.kind == "opaque" for n in graph.nodes) == 0, "zoo models are fully modeled"
    roundtrip = to_relax(graph)
    assert from_relax(roundtrip) == graph
    expected, got = run_both(mod, roundtrip)
    assert len(expected) == len(got)
    for e, g in zip(expected, got, strict=True):
        assert np.isfinite(e).all() and np.abs(e).max() > 0
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


def test_structural_hash_ignores_names_of_relax_vars():
    a = models.get("squeezenet1_1", reduced=True)
    graph = from_relax(a)
    renamed = to_relax(type(graph)(
        [n.replace(name=f"renamed{n.id}") for n in graph.nodes], graph.outputs, graph.meta))
    assert from_relax(renamed) == graph
    assert tvm_ffi.structural_equal(to_relax(graph), a, map_free_vars=True)


def test_opaque_calls_roundtrip_with_prim_funcs():
    """After LegalizeOps every op is a call_tir on a PrimFunc: all opaque, still exact."""
    mod = relax.transform.LegalizeOps()(models.get("squeezenet1_1", reduced=True))
    graph = from_relax(mod)
    kinds = {n.kind for n in graph.operators}
    assert kinds == {"opaque"}
    assert {n.attrs["op"] for n in graph.operators} == {"relax.call_tir"}
    roundtrip = to_relax(graph)
    assert len(roundtrip.functions) == len(mod.functions)
    expected, got = run_both(mod, roundtrip)
    for e, g in zip(expected, got, strict=True):
        np.testing.assert_array_equal(g, e)


def test_unmodeled_ops_and_layouts_stay_opaque_and_exact():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 8, 4), "float32"))
    w = relax.const(np.random.default_rng(0).standard_normal((6, 3, 3, 4)).astype("float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, padding=1, data_layout="NHWC",
                                           kernel_layout="OHWI"))
            y = bb.emit(relax.op.exp(y))
            y = bb.emit(relax.op.sum(y, axis=[1, 2]))
            y = bb.emit(relax.op.nn.relu(y))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    mod = bb.get()
    graph = from_relax(mod)
    assert [n.kind for n in graph.operators] == ["opaque", "opaque", "opaque", "relu"]
    assert graph.operators[0].attrs["op"] == "relax.nn.conv2d"
    expected, got = run_both(mod, to_relax(graph))
    np.testing.assert_array_equal(got[0], expected[0])


def test_tuple_outputs_and_hash_sensitivity():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 6), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            parts = bb.emit(relax.op.split(x, 3, axis=1))
            a = bb.emit(relax.op.nn.relu(relax.TupleGetItem(parts, 0)))
            out = bb.emit_output(relax.Tuple([a, relax.TupleGetItem(parts, 2)]))
        bb.emit_func_output(out)
    mod = bb.get()
    graph = from_relax(mod)
    assert len(graph.outputs) == 2
    expected, got = run_both(mod, to_relax(graph))
    for e, g in zip(expected, got, strict=True):
        np.testing.assert_array_equal(g, e)


# ---------------------------------------------------------------------------- unsupported models
def test_symbolic_shape_is_rejected_with_the_variable_name():
    n = tvm.tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("tokens", relax.TensorType((n, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(x))
        bb.emit_func_output(out)
    with pytest.raises(UnsupportedModelError, match="'tokens'.*symbolic"):
        from_relax(bb.get())


def test_symbolic_intermediate_is_rejected():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(x))
            m = tvm.tirx.Var("m", "int64")
            z = bb.match_cast(y, relax.TensorType((m, 4), "float32"))
            out = bb.emit_output(relax.op.nn.relu(z))
        bb.emit_func_output(out)
    with pytest.raises(UnsupportedModelError, match="match_cast"):
        from_relax(bb.get())


def test_control_flow_is_rejected():
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((2,), "float32"), c: R.Tensor((), "bool")):
            if c:
                y = R.add(x, x)
            else:
                y = R.multiply(x, x)
            return y

    with pytest.raises(UnsupportedModelError, match="if/else|control flow"):
        from_relax(Mod)


def test_two_dataflow_blocks_are_rejected():
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((2,), "float32")):
            with R.dataflow():
                a = R.nn.relu(x)
                R.output(a)
            b = R.add(a, a)
            with R.dataflow():
                second = R.add(b, b)
                R.output(second)
            return second

    with pytest.raises(UnsupportedModelError, match="2 dataflow blocks.*'second'"):
        from_relax(Mod)


def test_binding_outside_dataflow_is_rejected():
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((2,), "float32")):
            loose = R.nn.relu(x)
            return loose

    with pytest.raises(UnsupportedModelError, match="'loose'.*outside a dataflow block"):
        from_relax(Mod)


def test_missing_function_and_non_tensor_result():
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((2, 3), "float32")):
            with R.dataflow():
                s = R.shape_of(x)
                R.output(s)
            return s

    with pytest.raises(UnsupportedModelError, match="no function 'forward'"):
        from_relax(Mod, "forward")
    with pytest.raises(UnsupportedModelError, match="'s'.*tensors only"):
        from_relax(Mod)
