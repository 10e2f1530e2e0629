"""The public corpus (issue 52): architectures nobody here wrote, built from their packages' own
constructors (torchvision, timm, Hugging Face transformers, torch.nn), with seeded random weights,
batch 1, exported to ONNX as a user would (TorchScript exporter, opset 17, constant folding on).

Random weights make a weak output check unless they are drawn with care: torchvision zero-fills
some classifier heads and timm zero-fills the last batch norm of a residual block, and eval-mode
batch norm with its default statistics (mean 0, variance 1) lets activations shrink or grow layer
by layer until an output is constant, vanishing or infinite, and then any check passes. So every
all-zero parameter is redrawn, and the batch-norm statistics are calibrated: the model runs in
training mode on random inputs with cumulative averaging, then goes back to eval mode. An export
whose outputs do not change with the input is refused.

The exports are cached outside the repository (``~/.cache/paragraph/corpus``, or
``$PARAGRAPH_CORPUS``) under a key of the model, the seed and the package versions; a file is
written atomically. ``python benchmarks/corpus_models.py [--models a,b]`` exports and lists them.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SEED = 0
OPSET = 17
CALIBRATION_BATCHES = 4


def _torchvision():
    """torchvision's model constructors. Its C++ operators (nms, roi_align) do not load against
    the CPU build of torch this project pins, and importing the package registers their meta
    kernels; the classifiers need none of them, so that registration is skipped."""
    sys.modules.setdefault("torchvision._meta_registrations",
                           types.ModuleType("torchvision._meta_registrations"))
    import torchvision.models

    return torchvision.models


def _timm():
    _torchvision()  # timm imports torchvision
    import timm

    return timm


@dataclass(frozen=True)
class Spec:
    """One corpus model: its name, kind, the package it comes from, and how to build it."""

    name: str
    kind: str  # mobile, branchy, classic, modern, transformer, recurrent
    package: str  # torchvision, timm, transformers, torch
    make: Callable[[], tuple[object, tuple]]  # -> (eval-mode module, example inputs)
    note: str = ""


def _image(size: int = 224) -> tuple:
    import torch

    return (torch.randn(1, 3, size, size),)


def _tv(name: str, size: int = 224, **kw) -> Callable[[], tuple[object, tuple]]:
    def make():
        return getattr(_torchvision(), name)(**kw), _image(size)
    return make


def _tm(name: str, size: int = 224, **kw) -> Callable[[], tuple[object, tuple]]:
    def make():
        return _timm().create_model(name, pretrained=False, **kw), _image(size)
    return make


class _Logits:
    """A Hugging Face model's first output only (a plain tensor, what an export keeps)."""

    def __new__(cls, model):
        import torch

        class Wrapped(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, *args):
                out = self.model(*args, return_dict=False)
                return out[0]

        return Wrapped()


def _hf(config_name: str, model_name: str, seq: int = 128, **config) -> Callable:
    def make():
        import torch

        _torchvision()  # transformers imports torchvision where it is installed
        import transformers

        cfg = getattr(transformers, config_name)(**config)
        cfg._attn_implementation = "eager"  # exported as plain matmul + softmax, as users get
        model = getattr(transformers, model_name)(cfg)
        ids = torch.randint(0, cfg.vocab_size, (1, seq), generator=torch.Generator().manual_seed(1))
        return _Logits(model), (ids,)
    return make


def _lstm() -> tuple[object, tuple]:
    """A two-layer LSTM language model (torch.nn.Embedding, LSTM, Linear), 64 tokens."""
    import torch

    class LM(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(10000, 256)
            self.rnn = torch.nn.LSTM(256, 512, num_layers=2, batch_first=True)
            self.head = torch.nn.Linear(512, 10000)

        def forward(self, ids):
            out, _ = self.rnn(self.embed(ids))
            return self.head(out)

    return LM(), (torch.randint(0, 10000, (1, 64), generator=torch.Generator().manual_seed(1)),)


def _gru() -> tuple[object, tuple]:
    """A bidirectional GRU sequence classifier (torch.nn.GRU, Linear) over 100 frames of 80."""
    import torch

    class Classifier(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = torch.nn.GRU(80, 256, num_layers=2, batch_first=True, bidirectional=True)
            self.head = torch.nn.Linear(512, 35)

        def forward(self, x):
            out, _ = self.rnn(x)
            return self.head(out[:, -1])

    return Classifier(), (torch.randn(1, 100, 80),)


SPECS: tuple[Spec, ...] = (
    # mobile CNNs
    Spec("mobilenet_v2", "mobile", "torchvision", _tv("mobilenet_v2")),
    Spec("mobilenet_v3_large", "mobile", "torchvision", _tv("mobilenet_v3_large")),
    Spec("mobilenet_v3_small", "mobile", "torchvision", _tv("mobilenet_v3_small")),
    Spec("efficientnet_b0", "mobile", "torchvision", _tv("efficientnet_b0")),
    Spec("mnasnet1_0", "mobile", "torchvision", _tv("mnasnet1_0")),
    Spec("shufflenet_v2_x1_0", "mobile", "torchvision", _tv("shufflenet_v2_x1_0")),
    Spec("regnet_y_400mf", "mobile", "torchvision", _tv("regnet_y_400mf")),
    Spec("ghostnet_100", "mobile", "timm", _tm("ghostnet_100")),
    Spec("mixnet_s", "mobile", "timm", _tm("mixnet_s")),
    Spec("lcnet_100", "mobile", "timm", _tm("lcnet_100")),
    Spec("efficientnet_lite0", "mobile", "timm", _tm("efficientnet_lite0")),
    Spec("squeezenet1_0", "mobile", "torchvision", _tv("squeezenet1_0")),
    # branchy CNNs
    Spec("googlenet", "branchy", "torchvision", _tv("googlenet", aux_logits=False,
                                                    init_weights=True)),
    Spec("inception_v3", "branchy", "torchvision", _tv("inception_v3", 299, aux_logits=False,
                                                       init_weights=True)),
    Spec("inception_v4", "branchy", "timm", _tm("inception_v4", 299)),
    Spec("densenet121", "branchy", "torchvision", _tv("densenet121")),
    Spec("dla34", "branchy", "timm", _tm("dla34")),
    Spec("res2net50_26w_4s", "branchy", "timm", _tm("res2net50_26w_4s")),
    # classic CNNs
    Spec("resnet18", "classic", "torchvision", _tv("resnet18")),
    Spec("resnext50_32x4d", "classic", "torchvision", _tv("resnext50_32x4d")),
    Spec("vgg11_bn", "classic", "torchvision", _tv("vgg11_bn")),
    # modern
    Spec("vit_b_16", "modern", "torchvision", _tv("vit_b_16")),
    Spec("swin_t", "modern", "torchvision", _tv("swin_t")),
    Spec("convnext_tiny", "modern", "torchvision", _tv("convnext_tiny")),
    Spec("deit_tiny", "modern", "timm", _tm("deit_tiny_patch16_224")),
    Spec("mobilevit_s", "modern", "timm", _tm("mobilevit_s", 256)),
    Spec("poolformer_s12", "modern", "timm", _tm("poolformer_s12")),
    # transformers
    Spec("distilbert", "transformer", "transformers",
         _hf("DistilBertConfig", "DistilBertModel")),
    Spec("gpt2_6l", "transformer", "transformers", _hf("GPT2Config", "GPT2Model", n_layer=6)),
    Spec("t5_small_encoder", "transformer", "transformers",
         _hf("T5Config", "T5EncoderModel", d_model=512, d_ff=2048, num_layers=6, num_heads=8)),
    Spec("bert_base", "transformer", "transformers", _hf("BertConfig", "BertModel")),
    Spec("roberta_base", "transformer", "transformers", _hf("RobertaConfig", "RobertaModel")),
    # recurrent
    Spec("lstm_lm", "recurrent", "torch", _lstm),
    Spec("gru_classifier", "recurrent", "torch", _gru),
)
BY_NAME = {s.name: s for s in SPECS}


def corpus_dir() -> Path:
    """Where exports are cached: ``$PARAGRAPH_CORPUS`` or ``~/.cache/paragraph/corpus``."""
    root = os.environ.get("PARAGRAPH_CORPUS")
    return Path(root) if root else Path.home() / ".cache" / "paragraph" / "corpus"


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    parts = []
    for package in ("torch", "torchvision", "timm", "transformers", "onnx"):
        try:
            parts.append(f"{package}={version(package)}")
        except PackageNotFoundError:
            parts.append(f"{package}=none")
    return ",".join(parts)


def _redraw_zeros(module) -> None:
    """Redraw every all-zero weight (zero-initialised heads, last batch norms of residual
    blocks): a zero head makes every output equal whatever the network computes."""
    import torch

    gen = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.numel() > 1 and not torch.any(p):
                scale = 1.0 if name.endswith("weight") and p.dim() == 1 else 0.02
                p.copy_(torch.randn(p.shape, generator=gen) * scale)


def _calibrate(module, inputs: tuple) -> None:
    """Batch-norm statistics from random data (cumulative averages over a few batches), so that
    eval mode keeps activations O(1) layer after layer."""
    import torch

    norms = [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative moving average
    module.train()
    gen = torch.Generator().manual_seed(SEED + 2)
    with torch.no_grad():
        for _ in range(CALIBRATION_BATCHES):
            batch = tuple(torch.randn((4, *x.shape[1:]), generator=gen) for x in inputs)
            module(*batch)
    module.eval()


def build(spec: Spec):
    """The spec's module (seeded, calibrated, eval mode) and its example inputs."""
    import torch

    # torch's fused attention fast path exports as an operator ONNX lacks (ViT)
    torch.backends.mha.set_fastpath_enabled(False)
    torch.manual_seed(SEED)
    module, inputs = spec.make()
    module.eval()
    _redraw_zeros(module)
    if all(x.is_floating_point() for x in inputs):
        _calibrate(module, inputs)
    return module, inputs


def _check_alive(module, inputs: tuple, name: str) -> None:
    """Refuse a model whose output is constant, vanishing or not finite on random inputs."""
    import torch

    gen = torch.Generator().manual_seed(SEED + 3)
    with torch.no_grad():
        a = module(*inputs)
        other = tuple(torch.randn(x.shape, generator=gen) if x.is_floating_point()
                      else torch.randint(0, int(x.max()) + 1, x.shape, generator=gen)
                      for x in inputs)
        b = module(*other)
    a, b = a.float(), b.float()
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        raise RuntimeError(f"{name}: outputs are not finite")
    if float(a.std()) < 1e-3 or float((a - b).abs().max()) < 1e-3 * (1 + float(a.abs().max())):
        raise RuntimeError(f"{name}: outputs are constant or vanishing "
                           f"(std {float(a.std()):.2e}, change {float((a - b).abs().max()):.2e})")


def export(spec: Spec, cache: Path | None = None) -> Path:
    """The cached ONNX file of ``spec`` (exported and checked on first use)."""
    cache = cache or corpus_dir()
    key = hashlib.sha256(f"{spec.name}|{SEED}|{OPSET}|{_versions()}".encode()).hexdigest()[:12]
    path = cache / f"{spec.name}-{key}.onnx"
    if path.exists():
        return path
    import torch

    module, inputs = build(spec)
    _check_alive(module, inputs, spec.name)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    try:
        with torch.no_grad():
            names = [f"input{i}" for i in range(len(inputs))]
            torch.onnx.export(module, inputs, str(tmp), dynamo=False, opset_version=OPSET,
                              input_names=names, output_names=["output"])
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def relax_module(name: str, reduced: bool = False):
    """A zoo model by name, or a corpus model as ``corpus:NAME`` (its cached export, imported
    as `paragraph.load` does; full size whatever ``reduced``), as a Relax module."""
    if name.startswith("corpus:"):
        spec = BY_NAME.get(name.removeprefix("corpus:"))
        if spec is None:
            raise SystemExit(f"unknown corpus model {name!r}; corpus models: "
                             + ", ".join(sorted(BY_NAME)))
        from paragraph.tvm_interop.frontend.importers import load

        return load(export(spec))
    from paragraph import models

    return models.get(name, reduced=reduced)


def expand(names: list[str]) -> list[str]:
    """``corpus`` in ``names`` expanded to every corpus model as ``corpus:NAME``."""
    return [m for n in names for m in ([f"corpus:{s.name}" for s in SPECS] if n == "corpus"
                                       else [n])]


def example_inputs(path: Path, seed: int = 0) -> list[np.ndarray]:
    """Seeded inputs for an exported model: N(0, 1) floats, token ids in range for integers
    (the vocabulary is read from the first Gather's table)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    inits = {t.name: t for t in model.graph.initializer}
    vocab = None
    for node in model.graph.node:
        if node.op_type == "Gather" and node.input[0] in inits:
            vocab = inits[node.input[0]].dims[0]
            break
    rng = np.random.default_rng(seed)
    out = []
    for value in model.graph.input:
        if value.name in inits:
            continue
        t = value.type.tensor_type
        shape = tuple(d.dim_value for d in t.shape.dim)
        if t.elem_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
            dtype = np.int64 if t.elem_type == onnx.TensorProto.INT64 else np.int32
            out.append(rng.integers(0, vocab or 2, shape).astype(dtype))
        else:
            out.append(rng.standard_normal(shape).astype(np.float32))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="", help="comma-separated names (default: all)")
    args = parser.parse_args()
    names = args.models.split(",") if args.models else [s.name for s in SPECS]
    for name in names:
        spec = BY_NAME[name]
        try:
            path = export(spec)
            print(f"{name:22s} {spec.kind:12s} {path.stat().st_size / 1e6:7.1f} MB  {path}",
                  flush=True)
        except Exception as e:  # noqa: BLE001  a listing goes on past one model's failure
            print(f"{name:22s} FAILED: {type(e).__name__}: {str(e)[:300]}", flush=True)


if __name__ == "__main__":
    main()
