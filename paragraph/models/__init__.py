"""Model zoo: the benchmark networks of IOS, MetaFlow/TASO and AutoGraph as Relax modules.

Every model is `main(x)` with one dataflow block, static float32 shapes and its weights as
constants drawn from a per-model seeded generator, so `get` returns the same module every time.
`reduced=True` keeps each model's topology (every block, cell, node and layer) at small widths
and resolutions so that it compiles and runs on a CPU in seconds.
"""

from __future__ import annotations

import builtins

import tvm

from ..errors import ParagraphError
from . import cnn, nasnet, nlp, randwire
from ._builder import ModelSpec, Shape, build_module, image_shape


class UnknownModelError(ParagraphError, KeyError):
    """`get`, `input_shape` or `describe` was given a name that is not in the zoo."""

    def __str__(self) -> str:  # KeyError would print the repr of its argument
        return str(self.args[0]) if self.args else ""


_ZOO: dict[str, ModelSpec] = {
    "inception_v3": ModelSpec(
        cnn.inception_v3, image_shape(299, 75), 1,
        "Inception-v3 (Szegedy et al. 2016), torchvision layout without aux head"),
    "resnet50": ModelSpec(
        cnn.resnet50, image_shape(224, 32), 2,
        "ResNet-50 (He et al. 2016), torchvision Bottleneck layout"),
    "resnext50_32x4d": ModelSpec(
        cnn.resnext50_32x4d, image_shape(224, 32), 3,
        "ResNeXt-50 32x4d (Xie et al. 2017), torchvision layout"),
    "nasnet_a_mobile": ModelSpec(
        nasnet.nasnet_a_mobile, image_shape(224, 96), 4,
        "NASNet-A Mobile 4@1056 (Zoph et al. 2018), Cadene pretrained-models layout"),
    "nasnet_a_large": ModelSpec(
        nasnet.nasnet_a_large, image_shape(331, 75), 5,
        "NASNet-A Large 6@4032 (Zoph et al. 2018), Cadene pretrained-models layout"),
    "squeezenet1_1": ModelSpec(
        cnn.squeezenet1_1, image_shape(224, 32), 6,
        "SqueezeNet 1.1 (Iandola et al. 2016), torchvision layout"),
    "randwire": ModelSpec(
        randwire.randwire, image_shape(224, 32), 7,
        "RandWire-WS small regime, C=78, 3 stages of 32 nodes (Xie et al. 2019)"),
    "bert": ModelSpec(
        nlp.bert, nlp.bert_shape, 8,
        "BERT encoder, 8 layers, hidden 1024, 16 heads, seq 64 (TASO / AutoGraph)"),
    "sru_rnntc": ModelSpec(
        nlp.sru_rnntc, nlp.sru_shape, 9,
        "SRU text classifier, hidden 1024, 10 steps (MetaFlow / AutoGraph RNNTC)"),
}


def list() -> builtins.list[str]:  # shadows the builtin on purpose, like torch.hub.list
    """Return the zoo's model names in benchmark order (CNNs first, then the sequence models);
    these are the only names `get`, `input_shape` and `describe` accept."""
    return [*_ZOO]


def _spec(name: str) -> ModelSpec:
    if name not in _ZOO:
        raise UnknownModelError(f"unknown model {name!r}; valid names: {', '.join(_ZOO)}")
    return _ZOO[name]


def input_shape(name: str, *, reduced: bool = False, batch: int = 1) -> Shape:
    """Return the shape of `main`'s single input `x` for the given size and batch: CNNs take an
    NCHW image, `bert` (batch*seq, hidden) rows and `sru_rnntc` (10*batch, hidden) time-major
    rows. Raises `UnknownModelError` for an unknown name and `ValueError` for batch < 1."""
    spec = _spec(name)
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    return spec.input_shape(reduced, batch)


def get(name: str, *, reduced: bool = False, batch: int = 1) -> tvm.IRModule:
    """Build the Relax module of model `name`: one function `main(x)` with one dataflow block,
    static float32 shapes and weights as constants from a fixed per-model seed (two calls give
    bit-identical modules). `reduced=True` keeps the topology at small widths and input size for
    fast CPU tests. Raises `UnknownModelError` for an unknown name, `ValueError` for batch < 1."""
    input_shape(name, reduced=reduced, batch=batch)  # validates name and batch
    return build_module(_ZOO[name], reduced, batch)


def describe(name: str) -> str:
    """Return a one-line description of model `name`: its paper/source and full input shape."""
    return f"{name}: {_spec(name).source}; input {input_shape(name)}"
