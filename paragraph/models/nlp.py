"""Sequence models of the MetaFlow/TASO/AutoGraph benchmarks, fed already-embedded tokens.

* `bert`: the BERT encoder (Devlin et al. 2018) as in TASO's `examples/bert.py` and AutoGraph
  Table 1: 8 post-LN layers, hidden 1024, 16 heads, FFN 4096, sequence 64; input
  (batch*64, 1024) rows (AutoGraph's [16x64, 1024] is batch=16).
* `sru_rnntc`: the RNNTC text classifier of MetaFlow/AutoGraph: one SRU layer (Lei et al.,
  "Simple Recurrent Units for Highly Parallelizable Recurrence", 2017), hidden 1024, unrolled
  over 10 time steps (AutoGraph's 10 blocks), then a 10-way softmax classifier. Input
  (10*batch, 1024), time-major: rows t*batch:(t+1)*batch are step t.

`reduced=True`: BERT hidden 64, 4 heads, FFN 256, sequence 16, still 8 layers; SRU hidden 64,
still 10 steps.
"""

from __future__ import annotations

import numpy as np
from tvm import relax
from tvm.relax.op import nn

from ._builder import Net, Shape

BERT_LAYERS = 8
SRU_STEPS = 10
SRU_CLASSES = 10


def _bert_dims(reduced: bool) -> tuple[int, int, int, int]:
    """(sequence, hidden, heads, ffn)."""
    return (16, 64, 4, 256) if reduced else (64, 1024, 16, 4096)


def bert_shape(reduced: bool, batch: int) -> Shape:
    seq, hidden, _, _ = _bert_dims(reduced)
    return (batch * seq, hidden)


def sru_shape(reduced: bool, batch: int) -> Shape:
    return (SRU_STEPS * batch, 64 if reduced else 1024)


def _layer_norm(net: Net, x: relax.Expr) -> relax.Var:
    hidden = net.shape(x)[-1]
    gamma = net.uniform((hidden,), 0.5, 1.5)
    beta = net.normal((hidden,), 0.1)
    return net.emit(nn.layer_norm(x, gamma, beta, axes=-1, epsilon=1e-12))


def _attention(net: Net, x: relax.Var, batch: int, seq: int, heads: int) -> relax.Var:
    """Multi-head self-attention with separate Q, K, V projections (merging them is a rewrite)."""
    hidden = net.shape(x)[-1]
    head_dim = hidden // heads

    def split_heads(y: relax.Expr, order: tuple[int, ...]) -> relax.Var:
        return net.emit(relax.op.permute_dims(
            net.reshape(y, (batch, seq, heads, head_dim)), order))

    q = split_heads(net.dense(x, hidden), (0, 2, 1, 3))  # (b, heads, seq, d)
    k = split_heads(net.dense(x, hidden), (0, 2, 3, 1))  # (b, heads, d, seq): K transposed
    v = split_heads(net.dense(x, hidden), (0, 2, 1, 3))
    scores = net.multiply(net.emit(relax.op.matmul(q, k)),
                          relax.const(np.float32(1.0 / np.sqrt(head_dim))))
    probs = net.emit(nn.softmax(scores, axis=-1))
    ctx = net.emit(relax.op.permute_dims(net.emit(relax.op.matmul(probs, v)), (0, 2, 1, 3)))
    return net.dense(net.reshape(ctx, (batch * seq, hidden)), hidden)


def bert(net: Net, x: relax.Var, reduced: bool) -> relax.Var:
    """BERT encoder stack (post-LN), no embedding layer: (batch*seq, hidden) -> same shape."""
    seq, hidden, heads, ffn = _bert_dims(reduced)
    batch = net.shape(x)[0] // seq
    for _ in range(BERT_LAYERS):
        x = _layer_norm(net, net.add(_attention(net, x, batch, seq, heads), x))
        h = net.emit(nn.gelu(net.dense(x, ffn, gain=2.0)))
        x = _layer_norm(net, net.add(net.dense(h, hidden), x))
    return x


def sru_rnntc(net: Net, x: relax.Var, reduced: bool) -> relax.Var:
    """One SRU layer unrolled over 10 steps, classifier on the time-averaged hidden state.

    Per step: x~ = x W; f = sigmoid(x W_f + b_f); r = sigmoid(x W_r + b_r);
    c = f*c_prev + (1-f)*x~; h = r*tanh(c) + (1-r)*x. The `(1-f)` terms are written with an
    explicit subtract from the constant 1, the pattern MetaFlow's SRU rewrite matches.
    The three weight matrices are shared by all steps (the same constants). Averaging h over
    the steps (rather than reading only the last one) keeps every step's h alive, as a stacked
    SRU's next layer would; with the last h alone, nine of the ten h computations are dead code.
    """
    rows, hidden = net.shape(x)
    batch = rows // SRU_STEPS
    std = np.sqrt(1.0 / hidden)
    w, w_f, w_r = (net.normal((hidden, hidden), std) for _ in range(3))
    b_f, b_r = net.normal((hidden,), 0.1), net.normal((hidden,), 0.1)
    one = relax.const(np.float32(1.0))
    c = relax.const(np.zeros((batch, hidden), dtype=np.float32))
    total = None
    for t in range(SRU_STEPS):
        x_t = net.slice(x, [0], [t * batch], [(t + 1) * batch])
        x_tilde = net.emit(relax.op.matmul(x_t, w))
        f = net.emit(relax.op.sigmoid(net.add(net.emit(relax.op.matmul(x_t, w_f)), b_f)))
        r = net.emit(relax.op.sigmoid(net.add(net.emit(relax.op.matmul(x_t, w_r)), b_r)))
        c = net.add(net.multiply(f, c), net.multiply(net.emit(relax.op.subtract(one, f)), x_tilde))
        h = net.add(net.multiply(r, net.emit(relax.op.tanh(c))),
                    net.multiply(net.emit(relax.op.subtract(one, r)), x_t))
        total = h if total is None else net.add(total, h)
    mean = net.multiply(total, relax.const(np.float32(1.0 / SRU_STEPS)))
    return net.emit(nn.softmax(net.dense(mean, SRU_CLASSES), axis=-1))
