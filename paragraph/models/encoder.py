"""A BERT-style encoder that starts from token ids, written in torch and exported to ONNX: what a
user brings from Hugging Face transformers (embedding Gather, position embedding, multi-head
attention, GELU through erf, layer norms), without downloading weights.

The zoo's `bert` starts from embedded tokens; this one starts from integer ids, so it exercises
what that skips: an integer input, a `take` that reads a table at indices the model is given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ENCODER_DIMS = {  # reduced: (vocab, seq, hidden, heads, layers, ffn)
    False: (30522, 128, 768, 12, 6, 3072),
    True: (1000, 16, 64, 4, 2, 128),
}


def encoder_module(reduced: bool = False, seed: int = 0) -> Any:
    """The encoder as a torch module in eval mode, seeded weights; input: int64 ids of shape
    (1, seq)."""
    import torch  # optional: only this model and the vendor kernels need torch

    vocab, seq, hidden, heads, layers, ffn = ENCODER_DIMS[reduced]
    torch.manual_seed(seed)

    class Layer(torch.nn.Module):  # post-LN, as BERT: attention, add & norm, GELU MLP, add & norm
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v, self.o = (torch.nn.Linear(hidden, hidden) for _ in range(4))
            self.up, self.down = torch.nn.Linear(hidden, ffn), torch.nn.Linear(ffn, hidden)
            self.norm1, self.norm2 = torch.nn.LayerNorm(hidden), torch.nn.LayerNorm(hidden)

        def forward(self, x: Any) -> Any:
            def heads_of(y: Any) -> Any:
                return y.reshape(1, seq, heads, hidden // heads).transpose(1, 2)
            q, k, v = heads_of(self.q(x)), heads_of(self.k(x)), heads_of(self.v(x))
            scores = torch.softmax(q @ k.transpose(-1, -2) / (hidden // heads) ** 0.5, dim=-1)
            attended = (scores @ v).transpose(1, 2).reshape(1, seq, hidden)
            x = self.norm1(x + self.o(attended))
            return self.norm2(x + self.down(torch.nn.functional.gelu(self.up(x))))

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tokens = torch.nn.Embedding(vocab, hidden)
            self.positions = torch.nn.Parameter(torch.randn(1, seq, hidden) * 0.02)
            self.norm = torch.nn.LayerNorm(hidden)
            self.layers = torch.nn.ModuleList(Layer() for _ in range(layers))

        def forward(self, ids: Any) -> Any:
            x = self.norm(self.tokens(ids) + self.positions)
            for layer in self.layers:
                x = layer(x)
            return x

    return Encoder().eval()


def export_encoder(path: str | Path, reduced: bool = False, seed: int = 0) -> Path:
    """Write the encoder to ``path`` as ONNX (static shapes, opset 17) and return the path."""
    import torch  # optional, as above

    path = Path(path)
    seq = ENCODER_DIMS[reduced][1]
    module = encoder_module(reduced, seed)
    ids = torch.zeros((1, seq), dtype=torch.int64)
    with torch.no_grad():
        torch.onnx.export(module, (ids,), str(path), dynamo=False, opset_version=17,
                          input_names=["input_ids"], output_names=["hidden"])
    return path
