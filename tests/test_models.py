"""Tests of the model zoo: API contract, structure of the full-size models (build only) and
compile-and-run of every reduced model on the CPU."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import tvm
from tvm import relax

from paragraph import models
from paragraph.errors import ParagraphError

NAMES = [
    "inception_v3", "resnet50", "resnext50_32x4d", "nasnet_a_mobile", "nasnet_a_large",
    "squeezenet1_1", "randwire", "bert", "sru_rnntc",
]

# Full-size input shape, number of bindings and identifying op counts, checked against the
# reference implementations (torchvision, Cadene's NASNet ports, the papers' layer tables).
EXPECTED = {
    "inception_v3": ((1, 3, 299, 299), 408, {
        "nn.conv2d": 94, "nn.batch_norm": 94, "concat": 15, "nn.avg_pool2d": 9,
        "nn.max_pool2d": 4}),
    "resnet50": ((1, 3, 224, 224), 229, {
        "nn.conv2d": 53, "nn.batch_norm": 53, "add": 17, "nn.max_pool2d": 1}),
    "resnext50_32x4d": ((1, 3, 224, 224), 229, {
        "nn.conv2d": 53, "nn.batch_norm": 53, "add": 17, "grouped_conv2d": 16}),
    "nasnet_a_mobile": ((1, 3, 224, 224), 1100, {
        "nn.conv2d": 356, "grouped_conv2d": 160, "nn.batch_norm": 192, "concat": 20,
        "nn.avg_pool2d": 52, "nn.max_pool2d": 8, "strided_slice": 4}),
    "nasnet_a_large": ((1, 3, 331, 331), 1502, {
        "nn.conv2d": 488, "grouped_conv2d": 220, "nn.batch_norm": 264, "concat": 26,
        "nn.avg_pool2d": 70, "nn.max_pool2d": 8, "strided_slice": 4}),
    "squeezenet1_1": ((1, 3, 224, 224), 91, {
        "nn.conv2d": 26, "concat": 8, "nn.max_pool2d": 3, "nn.relu": 26}),
    "randwire": ((1, 3, 224, 224), 626, {
        "nn.conv2d": 195, "grouped_conv2d": 96, "nn.batch_norm": 99, "multiply": 3}),
    "bert": ((64, 1024), 232, {
        "matmul": 64, "nn.softmax": 8, "nn.layer_norm": 16, "nn.gelu": 8,
        "permute_dims": 32}),
    "sru_rnntc": ((10, 1024), 183, {
        "matmul": 31, "sigmoid": 20, "tanh": 10, "subtract": 20, "strided_slice": 10,
        "nn.softmax": 1}),
}
OUTPUT_SHAPE = {"bert": lambda shape: shape, "sru_rnntc": lambda shape: (shape[0] // 10, 10)}


def bindings(mod: tvm.IRModule) -> list[relax.Binding]:
    return list(mod["main"].body.blocks[0].bindings)


def op_counts(mod: tvm.IRModule) -> Counter:
    counts: Counter = Counter()
    for b in bindings(mod):
        if isinstance(b.value, relax.Call):
            name = b.value.op.name.removeprefix("relax.")
            counts[name] += 1
            if name == "nn.conv2d" and int(b.value.attrs.groups) > 1:
                counts["grouped_conv2d"] += 1
    return counts


def wiring(mod: tvm.IRModule) -> list[tuple]:
    """Each binding as (op, producers of its arguments): the topology without shapes/weights."""
    func = mod["main"]
    index: dict[relax.Var, object] = {func.params[0]: "x"}

    def ref(e: relax.Expr) -> object:
        if isinstance(e, relax.Tuple):
            return tuple(ref(f) for f in e.fields)
        return index.get(e, "const") if isinstance(e, relax.Var) else type(e).__name__

    out = []
    for i, b in enumerate(bindings(mod)):
        v = b.value
        if isinstance(v, relax.TupleGetItem):
            out.append(("getitem", ref(v.tuple_value), v.index))
        else:
            out.append((v.op.name, *(ref(a) for a in v.args)))
        index[b.var] = i
    return out


def check_structure(mod: tvm.IRModule, shape: tuple[int, ...]) -> None:
    assert [gv.name_hint for gv in mod.functions] == ["main"]
    func = mod["main"]
    assert [p.name for p in func.params] == ["x"]
    assert tuple(int(d) for d in func.params[0].ty.shape) == shape
    assert len(func.body.blocks) == 1 and isinstance(func.body.blocks[0], relax.DataflowBlock)
    for b in bindings(mod):
        ty = b.var.ty
        for t in ty.fields if isinstance(ty, relax.TupleType) else [ty]:
            assert isinstance(t, relax.TensorType) and t.dtype == "float32"
            assert all(isinstance(d, tvm.prim.IntImm) for d in t.shape), b.var
    # the function returns the last binding itself (no trailing alias)
    assert func.body.body.same_as(bindings(mod)[-1].var)


def test_list_order() -> None:
    assert models.list() == NAMES


def test_errors() -> None:
    with pytest.raises(models.UnknownModelError, match="valid names: inception_v3") as err:
        models.get("resnet51")
    assert isinstance(err.value, ParagraphError) and isinstance(err.value, KeyError)
    with pytest.raises(KeyError):
        models.input_shape("vgg16")
    with pytest.raises(ValueError):
        models.get("bert", batch=0)
    with pytest.raises(ValueError):
        models.input_shape("squeezenet1_1", reduced=True, batch=-1)


@pytest.mark.parametrize("name", NAMES)
def test_describe(name: str) -> None:
    line = models.describe(name)
    assert "\n" not in line and name in line and str(EXPECTED[name][0]) in line


@pytest.mark.parametrize("name", NAMES)
def test_full_size_structure(name: str) -> None:
    shape, num_bindings, counts = EXPECTED[name]
    assert models.input_shape(name) == shape
    mod = models.get(name)
    check_structure(mod, shape)
    assert len(bindings(mod)) == num_bindings
    actual = op_counts(mod)
    assert {op: actual[op] for op in counts} == counts
    # reduced models keep the exact topology: same ops, same wiring, in the same order
    assert wiring(models.get(name, reduced=True)) == wiring(mod)


@pytest.mark.parametrize("name", NAMES)
def test_batch(name: str) -> None:
    one, two = models.input_shape(name), models.input_shape(name, batch=2)
    assert one != two and two[0] == 2 * one[0] and two[1:] == one[1:]
    check_structure(models.get(name, reduced=True, batch=2),
                    models.input_shape(name, reduced=True, batch=2))


@pytest.mark.parametrize("name", NAMES)
def test_reduced_compiles_and_runs(name: str) -> None:
    shape = models.input_shape(name, reduced=True)
    mod = models.get(name, reduced=True)
    check_structure(mod, shape)
    # deterministic: a second build has bit-identical constants (tensor contents are compared)
    tvm.ir.assert_structural_equal(mod, models.get(name, reduced=True), map_free_vars=True)

    exe = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(exe, tvm.cpu())
    x = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
    y = vm["main"](tvm.runtime.tensor(x)).numpy()

    expected = OUTPUT_SHAPE.get(name, lambda s: (s[0], 1000))(shape)
    assert y.shape == expected and y.dtype == np.float32
    assert np.isfinite(y).all() and np.abs(y).max() > 1e-3
    assert y.std() > 1e-3  # not a constant output either
    if name == "sru_rnntc":
        np.testing.assert_allclose(y.sum(axis=-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("name", models.list())
def test_no_dead_code(name):
    """Every binding feeds the output: benchmark graphs carry no work a compiler would drop."""
    mod = models.get(name, reduced=True)
    pruned = relax.transform.DeadCodeElimination()(mod)
    assert len(bindings(pruned)) == len(bindings(mod))
