"""Vendor kernel names: a `VendorOp` is everything a vendor call needs besides its tensors, and
its name is the global function's name (``paragraph.vendor.conv2d.NHWC.s2x2...``); the cost and
FLOP count of a call follow from it. No PyTorch, no Relax."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import numpy as np

from paragraph.errors import ParagraphError

PREFIX = "paragraph.vendor."
KERNEL_SOURCES = ("tvm", "vendor", "auto")


def check_kernel_source(kernels: str) -> None:
    """Raise `ParagraphError` unless ``kernels`` is one of `KERNEL_SOURCES`."""
    if kernels not in KERNEL_SOURCES:
        raise ParagraphError(f"unknown kernel source {kernels!r}; choose from "
                             f"{', '.join(KERNEL_SOURCES)}")
KINDS = ("conv2d", "matmul", "bmm", "concat", "softmax", "layer_norm", "max_pool2d",
         "avg_pool2d")
POOLS = ("max_pool2d", "avg_pool2d")
CONV_LAYOUTS = ("NCHW", "NHWC", "NCHW2NHWC")
# the activations a convolution's or product's kernel applies to its output (`VendorOp.act`,
# the last part of its name; the C++ kernels' `Act`, the Python kernels' `_activation`):
#   relu max(x, 0); relu6 min(max(x, 0), 6) (torch's F.relu6, ONNX's Clip(0, 6));
#   hardswish x * relu6(x + 3) / 6; hardsigmoid relu6(x + 3) / 6 (ONNX's HardSigmoid with
#   alpha 1/6, beta 1/2); sigmoid 1 / (1 + e^-x); silu x * sigmoid(x); gelu x * Phi(x);
#   gelu_tanh 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))); a NaN stays NaN.
# A concat and an average pool fuse relu alone.
EPILOGUES = ("relu", "relu6", "hardswish", "hardsigmoid", "sigmoid", "silu", "gelu", "gelu_tanh")
# Relax's activation operators -> the activation a vendor kernel applies in their place
ACTIVATIONS = {"relax.nn.relu": "relu", "relax.nn.gelu": "gelu", "relax.nn.gelu_tanh": "gelu_tanh",
               "relax.sigmoid": "sigmoid", "relax.nn.silu": "silu"}


@dataclass(frozen=True)
class VendorOp:
    """Everything a vendor call needs besides its tensors; its `name` is the function name."""

    kind: str  # conv2d | matmul | bmm | concat | softmax | layer_norm | max/avg_pool2d
    # conv2d: NCHW (weights OIHW), NHWC (weights OHWI) or NCHW2NHWC (an NCHW input read where
    # it lies, weights and output as NHWC's); pools: NHWC
    layout: str = ""
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, ...] = (0, 0)  # (top, left) if symmetric, else (top, left, bottom, right)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1
    # conv2d, matmul: a bias operand; avg_pool2d: two per-channel operands, scale and shift, of
    # an affine epilogue (a batch norm or a bias the pool absorbed)
    bias: bool = False
    residual: bool = False
    act: str | None = None
    weight: str = ""  # CPU: digest of the constant weight, whose packed form is cached
    axis: int = 0  # concat: the axis joined along; softmax: the axis normalised
    eps: float = 0.0  # layer_norm (over the last axis): the epsilon
    window: tuple[int, int] = (1, 1)  # pools: the window's height and width
    include_pad: bool = False  # avg_pool2d: padding counts in the divisor
    scale: float = 1.0  # softmax: of scale * x (an attention's 1 / sqrt(d) absorbed)

    @property
    def pads(self) -> tuple[int, ...]:
        """The padding as (top, left, bottom, right), however it is stored."""
        return self.padding if len(self.padding) == 4 else (*self.padding, *self.padding)

    @property
    def name(self) -> str:
        return self.cost_name + (f".w{self.weight}" if self.weight else "")

    @property
    def cost_name(self) -> str:
        """The name without the weight digest: what the call costs depends on."""
        parts = [self.kind]
        if self.kind == "conv2d":
            parts += [self.layout, _dims("s", self.stride), _dims("p", self.padding),
                      _dims("d", self.dilation), f"g{self.groups}"]
        elif self.kind in POOLS:
            parts += [self.layout, _dims("k", self.window), _dims("s", self.stride),
                      _dims("p", self.padding)] + ["incpad"] * self.include_pad
        elif self.kind in ("concat", "softmax"):
            parts.append(f"a{self.axis}")
            if self.kind == "softmax" and self.scale != 1.0:
                parts.append("x" + _number(self.scale))
        elif self.kind == "layer_norm":
            parts.append("e" + _number(self.eps))
        parts += ["bias"] * self.bias + ["res"] * self.residual + [self.act or ""] * bool(self.act)
        return PREFIX + ".".join(parts)

    @classmethod
    def from_name(cls, name: str) -> VendorOp:
        """Parse a name made by `name`; raises `ParagraphError` for anything else."""
        parts = name[len(PREFIX):].split(".") if name.startswith(PREFIX) else []
        if not parts or parts[0] not in KINDS:
            raise ParagraphError(f"{name!r} is not a paragraph vendor kernel")
        op = cls(parts[0])
        rest = parts[1:]
        if op.kind == "conv2d":
            if len(rest) < 5 or rest[0] not in CONV_LAYOUTS:
                raise ParagraphError(f"malformed vendor convolution name {name!r}")
            found = [re.fullmatch(rf"{k}(\d+(?:x\d+)+)", p)
                     for k, p in zip("spd", rest[1:4], strict=True)]
            fields = [m for m in found if m is not None]
            group = re.fullmatch(r"g(\d+)", rest[4])
            if len(fields) != 3 or group is None:
                raise ParagraphError(f"malformed vendor convolution name {name!r}")
            s, p, d = (tuple(int(v) for v in m[1].split("x")) for m in fields)
            if len(s) != 2 or len(d) != 2 or len(p) not in (2, 4):
                raise ParagraphError(f"malformed vendor convolution name {name!r}")
            op = replace(op, layout=rest[0], stride=s, padding=p, dilation=d,
                         groups=int(group[1]))
            rest = rest[5:]
        elif op.kind in POOLS:
            if len(rest) < 4 or rest[0] != "NHWC":
                raise ParagraphError(f"malformed vendor pool name {name!r}")
            found = [re.fullmatch(rf"{k}(\d+(?:x\d+)+)", p)
                     for k, p in zip("ksp", rest[1:4], strict=True)]
            if any(m is None for m in found):
                raise ParagraphError(f"malformed vendor pool name {name!r}")
            k, s, p = (tuple(int(v) for v in m[1].split("x")) for m in found if m is not None)
            if len(k) != 2 or len(s) != 2 or len(p) not in (2, 4):
                raise ParagraphError(f"malformed vendor pool name {name!r}")
            op, rest = replace(op, layout=rest[0], window=k, stride=s, padding=p), rest[4:]
            if op.kind == "avg_pool2d" and rest[:1] == ["incpad"]:
                op, rest = replace(op, include_pad=True), rest[1:]
        elif op.kind in ("concat", "softmax"):
            axis = re.fullmatch(r"a(\d+)", rest[0]) if rest else None
            if axis is None:
                raise ParagraphError(f"malformed vendor {op.kind} name {name!r}")
            op, rest = replace(op, axis=int(axis[1])), rest[1:]
            if op.kind == "softmax" and rest[:1] and rest[0].startswith("x"):
                scale = _parse_number(rest[0][1:])
                if scale is None or scale == 1.0:
                    raise ParagraphError(f"malformed vendor softmax name {name!r}")
                op, rest = replace(op, scale=scale), rest[1:]
        elif op.kind == "layer_norm":
            eps = _parse_number(rest[0][1:]) if rest and rest[0].startswith("e") else None
            if eps is None:
                raise ParagraphError(f"malformed vendor layer_norm name {name!r}")
            op, rest = replace(op, eps=eps), rest[1:]
        for flag in rest:
            if op.kind in POOLS and not (op.kind == "avg_pool2d" and flag in ("bias", "relu")):
                # an average pool takes an affine epilogue and a relu; no pool anything else
                raise ParagraphError(f"unknown part {flag!r} in vendor kernel name {name!r}")
            if op.kind == "concat" and flag in EPILOGUES and flag != "relu":
                raise ParagraphError(f"a vendor concat fuses relu alone, not {flag!r}: {name!r}")
            if flag == "bias":
                op = replace(op, bias=True)
            elif flag == "res":
                op = replace(op, residual=True)
            elif flag in EPILOGUES:
                op = replace(op, act=flag)
            elif op.kind in ("conv2d", "matmul") and re.fullmatch(r"w[0-9a-f]+", flag):
                op = replace(op, weight=flag[1:])
            else:
                raise ParagraphError(f"unknown part {flag!r} in vendor kernel name {name!r}")
        return op


def _dims(letter: str, values: tuple[int, ...]) -> str:
    return letter + "x".join(map(str, values))


def _number(value: float) -> str:
    """``value`` exactly (its shortest repr), with no dots: names split on them."""
    return repr(float(value)).replace(".", "p")


def _parse_number(text: str) -> float | None:
    """The float `_number` wrote, or None for anything else (a finite value only)."""
    if not re.fullmatch(r"-?\d[0-9pe+-]*", text):
        return None
    try:
        value = float(text.replace("p", "."))
    except ValueError:
        return None
    return value if np.isfinite(value) else None


def is_vendor_name(name: str) -> bool:
    return name.startswith(PREFIX)


def cost_name(name: str) -> str:
    """A vendor function's name without its weight digest (a cost key: the time of a call does
    not depend on the weight's values); other names unchanged."""
    return VendorOp.from_name(name).cost_name if is_vendor_name(name) else name


def vendor_flops(name: str, in_shapes: list[tuple[int, ...]],
                 out_shapes: list[tuple[int, ...]]) -> float:
    """Multiply-adds x 2 of a vendor call (what ``estimate_tir_flops`` gives TVM kernels)."""
    op = VendorOp.from_name(name)
    out = out_shapes[0]
    if op.kind in ("concat", "softmax", "layer_norm", *POOLS):  # data movement, a few ops each
        return 0.0
    if op.kind == "conv2d":
        w = in_shapes[1]  # OIHW or OHWI: the reduction is everything but O
        return 2.0 * float(np.prod(out)) * float(np.prod(w[1:]))
    return 2.0 * float(np.prod(out)) * float(in_shapes[0][-1])
