"""The C++ vendor kernels' entry points check every shape they are given (cpp/checks.h): an
output height or width that does not follow from the input, window, stride, padding and
dilation, channels, batch, ranks, a bias or residual of another size; each is refused with a
ValueError naming the entry point and the mismatch, never a read or write out of bounds. Each
entry point's consistent call is the control: it binds and runs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
tvm_ffi = pytest.importorskip("tvm_ffi")

from paragraph.errors import ParagraphError  # noqa: E402
from paragraph.tvm_interop.runtime.library import native  # noqa: E402
from paragraph.tvm_interop.runtime.library.names import VendorOp  # noqa: E402


@pytest.fixture(scope="module")
def module():
    m = native.module()
    if m is None:
        pytest.skip(f"the C++ vendor kernels are unavailable: {native.reason()}")
    return m


def t(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype) if shape else torch.tensor(1.0)


def ffi(x):
    return None if x is None else tvm_ffi.from_dlpack(x)


def conv(out=(1, 8, 8, 6), x=(1, 8, 8, 4), w=(6, 3, 3, 4), params=(1, 1, 1, 1, 1, 1, 1),
         bias=None, res=None, layout="NHWC"):
    """paragraph_vendor_conv2d's arguments: NHWC tensors, an OHWI weight; params stride (2),
    padding (2 or 4), dilation (2), groups."""
    return ("paragraph_vendor_conv2d", ffi(t(*out)), ffi(t(*x)), ffi(t(*w)),
            ffi(None if bias is None else t(*bias)), ffi(None if res is None else t(*res)),
            list(params), layout, "", 1)


def pool(out=(1, 4, 4, 4), x=(1, 8, 8, 4), params=(2, 2, 2, 2, 0, 0, 0, 0), scale=None,
         shift=None):
    """paragraph_vendor_pool2d's: NHWC; params window (2), stride (2), padding (4)."""
    return ("paragraph_vendor_pool2d", ffi(t(*out)), ffi(t(*x)), list(params), True, False,
            ffi(None if scale is None else t(*scale)), ffi(None if shift is None else t(*shift)),
            False, 1)


def linear(out=(3, 5), a=(3, 8), w=(8, 5), bias=None):
    return ("paragraph_vendor_linear", ffi(t(*out)), ffi(t(*a)), ffi(t(*w)),
            ffi(None if bias is None else t(*bias)), "", 1)


def product(out=(2, 3, 5), a=(2, 3, 4), b=(2, 4, 5), bias=None):
    return ("paragraph_vendor_product", ffi(t(*out)), ffi(t(*a)), ffi(t(*b)),
            ffi(None if bias is None else t(*bias)), "", 1)


def concat(out=(1, 6, 3), parts=((1, 2, 3), (1, 4, 3)), axis=1, dtype=torch.float32):
    return ("paragraph_vendor_concat", ffi(t(*out)), [ffi(t(*p, dtype=dtype)) for p in parts],
            axis, "", 1)


def softmax(out=(2, 5), x=(2, 5), axis=1):
    return "paragraph_vendor_softmax", ffi(t(*out)), ffi(t(*x)), axis, 1.0, 1


def layer_norm(out=(2, 8), x=(2, 8), gamma=(8,), beta=(8,), res=None):
    return ("paragraph_vendor_layer_norm", ffi(t(*out)), ffi(t(*x)), ffi(t(*gamma)),
            ffi(t(*beta)), ffi(None if res is None else t(*res)), 1e-5, 1)


CONTROLS = {
    "conv": conv(), "conv-bias-residual": conv(bias=(6,), res=(1, 8, 8, 6)),
    "conv-stride-dilation": conv(out=(1, 3, 3, 6), params=(2, 2, 1, 1, 2, 2, 1)),
    "conv-4-pads": conv(out=(1, 9, 6, 6), params=(1, 1, 2, 0, 1, 0, 1, 1, 1)),
    "conv-1x1": conv(w=(6, 1, 1, 4), params=(1, 1, 0, 0, 1, 1, 1)),
    "depthwise": conv(out=(1, 8, 8, 4), w=(4, 3, 3, 1), params=(1, 1, 1, 1, 1, 1, 4)),
    "conv-nchw-input": conv(x=(1, 4, 8, 8), layout="NCHW2NHWC"),
    "pool": pool(), "pool-epilogue": pool(scale=(4,), shift=(4,)),
    "linear": linear(), "product-2d": product(out=(3, 5), a=(3, 8), b=(8, 5)),
    "product": product(), "concat": concat(), "softmax": softmax(),
    "layer_norm": layer_norm(res=(2, 8)),
}


@pytest.mark.parametrize("case", CONTROLS)
def test_consistent_shapes_bind_and_run(module, case):
    entry, *args = CONTROLS[case]
    module[entry](*args)()


REFUSED = {
    # the output's height and width against the input, window, stride, padding and dilation
    "conv-height": (conv(out=(1, 9, 8, 6)), "the output is 9 x 8, but .* gives 8 x 8"),
    "conv-width": (conv(out=(1, 8, 7, 6)), "the output is 8 x 7, but .* gives 8 x 8"),
    "conv-stride": (conv(params=(2, 2, 1, 1, 1, 1, 1)), r"stride 2 x 2.* gives 4 x 4"),
    "conv-dilation": (conv(params=(1, 1, 1, 1, 2, 2, 1)), r"dilation 2 x 2 gives 6 x 6"),
    "conv-4-pads": (conv(params=(1, 1, 0, 0, 1, 0, 1, 1, 1)), r"padding \(0, 0, 1, 0\).* gives "
                    "7 x 6"),
    "conv-window-too-large": (conv(out=(1, 1, 1, 6), w=(6, 11, 11, 4), params=(1, 1, 0, 0, 1, 1,
                                                                                1)),
                              "a 11 x 11 window .* does not fit the 8 x 8 input"),
    "conv-negative-padding": (conv(params=(1, 1, -1, 1, 1, 1, 1)), "the padding .* is "
                              r"\(-1, 1, -1, 1\)"),
    "conv-zero-stride": (conv(params=(0, 1, 1, 1, 1, 1, 1)), "the stride is 0 x 1"),
    "conv-zero-dilation": (conv(params=(1, 1, 1, 1, 0, 1, 1)), "the dilation is 0 x 1"),
    "conv-params": (conv(params=(1, 1, 1, 1, 1)), "7 or 9 parameters .* got 5"),
    # channels, batch, groups, ranks, operands
    "conv-in-channels": (conv(w=(6, 3, 3, 5)), "takes 5 input channels in 1 group"),
    "conv-out-channels": (conv(out=(1, 8, 8, 7)), "must have batch 1 and the weight's 6 "
                          "channels"),
    "conv-batch": (conv(out=(2, 8, 8, 6)), "must have batch 1"),
    "conv-groups": (conv(out=(1, 8, 8, 6), w=(6, 3, 3, 1), params=(1, 1, 1, 1, 1, 1, 3)),
                    "3 groups do not divide the input's 4"),
    "conv-zero-groups": (conv(params=(1, 1, 1, 1, 1, 1, 0)), "0 groups do not divide"),
    "depthwise-height": (conv(out=(1, 7, 8, 4), w=(4, 3, 3, 1), params=(1, 1, 1, 1, 1, 1, 4)),
                         "the output is 7 x 8"),
    "conv-nchw-input-height": (conv(x=(1, 4, 9, 8), layout="NCHW2NHWC"),
                               "the output is 8 x 8, but a 9 x 8 input"),
    "conv-rank": (conv(x=(1, 8, 8)), "the input must have 4 dimensions"),
    "conv-bias": (conv(bias=(5,)), r"the bias \(5,\) float has 5 elements, not 6 \(one per "
                  r"output channel\)"),
    "conv-residual": (conv(res=(1, 8, 8, 5)), "the residual .* does not match the output"),
    # pools
    "pool-height": (pool(out=(1, 5, 4, 4)), "the output is 5 x 4, "
                    "but a 8 x 8 input with a 2 x 2 window, stride 2 x 2"),
    "pool-width": (pool(out=(1, 4, 3, 4)), "the output is 4 x 3"),
    "pool-padding": (pool(params=(2, 2, 2, 2, 1, 1, 1, 1)), r"padding \(1, 1, 1, 1\).* gives "
                     "5 x 5"),
    "pool-window": (pool(params=(0, 2, 2, 2, 0, 0, 0, 0)), "the window is 0 x 2"),
    "pool-stride": (pool(params=(2, 2, 0, 2, 0, 0, 0, 0)), "the stride is 0 x 2"),
    "pool-channels": (pool(out=(1, 4, 4, 5)), "must have the input's .* batch and channels"),
    "pool-batch": (pool(out=(2, 4, 4, 4)), "batch and channels"),
    "pool-params": (pool(params=(2, 2, 2, 2)), "8 parameters .* got 4"),
    "pool-rank": (pool(x=(8, 8, 4)), "the input must have 4 dimensions"),
    "pool-scale-alone": (pool(scale=(4,)), "a scale and a shift, or neither"),
    "pool-scale": (pool(scale=(3,), shift=(4,)), "the scale .* has 3 elements, not 4"),
    # products
    "linear-k": (linear(w=(7, 5)), "the input .* has 8 columns; the "
                 "weight .* takes 7"),
    "linear-n": (linear(out=(3, 6)), "the output .* has 6 columns; the weight .* gives 5"),
    "linear-rows": (linear(out=(4, 5)), "differ in dimension 0"),
    "linear-weight-rank": (linear(w=(8, 5, 1)), "the weight must have 2 dimensions"),
    "linear-bias": (linear(bias=(4,)), "the bias .* has 4 elements, not 5"),
    "product-2d-k": (product(out=(3, 5), a=(3, 8), b=(7, 5)), "the "
                     "input .* has 8 columns"),
    "product-batch": (product(b=(3, 4, 5)), "batch dimension 0 differs"),
    "product-k": (product(b=(2, 5, 5)), "4 columns against 5 rows"),
    "product-out": (product(out=(2, 3, 6)), r"the output .* is not 3 x 5 per batch"),
    "product-rank": (product(b=(1, 2, 4, 5)), "operands and an output of one rank"),
    "product-bias": (product(bias=(5,)), "a batched product takes no bias"),
    # joins and norms
    "concat-total": (concat(out=(1, 7, 3)), "the parts join to 6 along axis 1; the output .* "
                     "has 7"),
    "concat-other-dim": (concat(parts=((1, 2, 3), (1, 4, 4))), "part 1 .* differs from the "
                         "output .* in dimension 2"),
    "concat-axis": (concat(axis=3), "axis 3 of the output"),
    "concat-rank": (concat(parts=((1, 2, 3), (4, 3))), "part 1 .* differ in rank"),
    "concat-dtype": (concat(dtype=torch.float64), "part 0 .* not of the output's dtype"),
    "concat-empty": (concat(parts=()), "nothing to join"),
    "softmax-shape": (softmax(out=(2, 6)), "the output .* does not "
                      "match the input"),
    "softmax-axis": (softmax(axis=2), "axis 2 of the input"),
    "softmax-negative-axis": (softmax(axis=-3), "axis -3 of the input"),
    "layer_norm-gamma": (layer_norm(gamma=(7,)), "gamma .* has 7 "
                         "elements, not 8"),
    "layer_norm-beta": (layer_norm(beta=(9,)), "beta .* has 9 elements"),
    "layer_norm-out": (layer_norm(out=(2, 9)), "the output .* does not match the input"),
    "layer_norm-residual": (layer_norm(res=(2, 7)), "the residual .* does not match"),
    "layer_norm-scalar": (layer_norm(out=(), x=(), gamma=(1,), beta=(1,)), "has no axis"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_inconsistent_shapes_are_refused_by_name(module, case):
    (entry, *args), message = REFUSED[case]
    with pytest.raises(ValueError, match=f"{entry}: .*{message}"):
        module[entry](*args)


def test_the_binding_layer_raises_a_paragraph_error():
    """`native.bind` (what the executor calls) turns the C++ refusal into a
    `KernelShapeError`, a `ParagraphError` naming the vendor function."""
    if native.module() is None:
        pytest.skip(f"the C++ vendor kernels are unavailable: {native.reason()}")
    op = VendorOp("conv2d", layout="NHWC", stride=(2, 2), padding=(1, 1))
    args = tuple(tvm_ffi.from_dlpack(x) for x in (t(1, 8, 8, 4), t(6, 3, 3, 4),
                                                  t(1, 8, 8, 6)))
    with pytest.raises(native.KernelShapeError, match=r"conv2d\.NHWC\.s2x2.*: .*the output "
                       "is 8 x 8, but .* gives 4 x 4") as refused:
        native.bind(op.name, args, 1)
    assert isinstance(refused.value, ParagraphError)
    good = tuple(tvm_ffi.from_dlpack(x) for x in (t(1, 8, 8, 4), t(6, 3, 3, 4), t(1, 4, 4, 6)))
    native.bind(op.name, good, 1)()
