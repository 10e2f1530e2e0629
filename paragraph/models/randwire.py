"""RandWire-WS (Xie et al., "Exploring Randomly Wired Neural Networks for Image Recognition",
ICCV 2019), small-computation regime with C = 78, N = 32. (IOS, Ding et al. MLSys 2021,
benchmarks the regular regime instead: `randwire_large` in its repository, C = 154, stages of
16/32/32/32 nodes, no conv2; the node operator, ReLU + separable conv, is the same.)

Layout (paper Table 1, small regime, 224x224 input): conv1 3x3/2 C/2 + BN; conv2 ReLU-3x3/2
conv C-BN; three random-graph stages of 32 nodes with C, 2C, 4C channels (each halves the
resolution: 28, 14, 7); classifier ReLU, 1x1 conv 1280 + BN + ReLU, global average pool, fc.

Each stage's graph is networkx `watts_strogatz_graph(32, 4, 0.75, seed)` with a fixed seed per
stage and edges oriented from the lower to the higher node index (so index order is a
topological order). A node sums its inputs (as IOS does: no learned aggregation weights), then
ReLU, separable 3x3 conv (depthwise + pointwise) and BN. Nodes without predecessors read the
stage input at stride 2; nodes without successors are averaged into the stage output.
"""

from __future__ import annotations

import networkx as nx
import numpy as np
from tvm import relax

from ._builder import Net

C_SMALL = 78  # paper's small regime
NODES, NEIGHBOURS, REWIRE_P = 32, 4, 0.75
STAGE_SEEDS = (101, 102, 103)  # one fixed Watts-Strogatz graph per stage
NUM_CLASSES = 1000


def stage_graph(seed: int) -> list[list[int]]:
    """Predecessor lists of the stage's DAG: WS graph with edges oriented low -> high index."""
    graph = nx.watts_strogatz_graph(NODES, NEIGHBOURS, REWIRE_P, seed=seed)
    preds: list[list[int]] = [[] for _ in range(NODES)]
    for u, v in graph.edges():
        preds[max(u, v)].append(min(u, v))
    return [sorted(p) for p in preds]


def _node(net: Net, inputs: list[relax.Expr], out_ch: int, stride: int) -> relax.Var:
    x = inputs[0]
    for y in inputs[1:]:
        x = net.add(x, y)
    x = net.relu(x)
    c = net.shape(x)[1]
    x = net.conv(x, c, 3, stride, 1, groups=c)
    # gain 1/fan-in on the pointwise conv: the unweighted sum of k inputs would otherwise grow
    # the activations k-fold at every node along the graph's longest path
    return net.conv_bn(x, out_ch, 1, gain=1.0 / len(inputs))


def _stage(net: Net, x: relax.Expr, out_ch: int, seed: int) -> relax.Var:
    preds = stage_graph(seed)
    has_succ = {u for p in preds for u in p}
    outs: list[relax.Var] = []
    for v in range(NODES):
        if preds[v]:
            outs.append(_node(net, [outs[u] for u in preds[v]], out_ch, 1))
        else:
            outs.append(_node(net, [x], out_ch, 2))
    sinks = [outs[v] for v in range(NODES) if v not in has_succ]
    y = sinks[0]
    for s in sinks[1:]:
        y = net.add(y, s)
    if len(sinks) > 1:
        y = net.multiply(y, relax.const(np.float32(1.0 / len(sinks))))
    return y


def randwire(net: Net, x: relax.Var, reduced: bool) -> relax.Var:
    """RandWire-WS small regime, C = 78 (reduced: C = 8, classifier width 160)."""
    c = 8 if reduced else C_SMALL
    x = net.conv_bn(x, c // 2, 3, 2, 1, gain=1.0)
    x = net.conv_bn(net.relu(x), c, 3, 2, 1)
    for i, seed in enumerate(STAGE_SEEDS):
        x = _stage(net, x, c << i, seed)
    x = net.conv_bn(net.relu(x), 160 if reduced else 1280, 1)
    return net.dense(net.global_pool(net.relu(x)), NUM_CLASSES)
