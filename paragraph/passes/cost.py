"""Graph costs for the substitution search (AutoGraph section "Backtracking Search via Mixed
Critical Path Cost"; TASO section 2.8, MetaFlow section 4): pure, no TVM build per candidate.

A candidate graph is costed over the kernels it will become: `fuse` models TVM's fusion and
vendor dispatch (a convolution, matmul or linear absorbs the element-wise chain after it: bias,
activation, a residual add; element-wise chains fuse with each other; reshapes and slices are
views). Each kernel has a signature (anchor kind, attributes, input shapes, fused chain); its
seconds come from a table of measured signatures (`CostModel.measured`, filled by
`paragraph.tvm_interop.measure.device` from the cost database) or, failing that, from a roofline
estimate scaled by how far the measured kernels of the same kind (grouped convolutions apart
from dense ones) were from theirs.

Four costs over the kernel DAG (`COSTS`):

* ``sum``: total kernel time, what TASO and MetaFlow minimise;
* ``critical-path``: the longest path;
* ``mixed``: AutoGraph eq. 1, (1 + a) * critical path + the rest, a = 0.25;
* ``simulated``: what the critical-path planner will get: the makespan of its list schedule
  (`simulate`) with one-thread kernels on the device's streams, or one kernel at a time on
  all threads, whichever is shorter. The mixed cost stands in for it.

The first three price each kernel alone on the whole device (all its threads), as the papers
measure operators; where only one-thread times are known, those. On a 2-core CPU the two
differ by kernel: a grouped convolution gains little from the second core, a large 1x1
convolution nearly 2x, and a rewrite that changes one into the other is judged by both.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from paragraph.dag import toposort
from paragraph.graph import Graph, Node, TensorRef

COSTS = ("sum", "critical-path", "mixed", "simulated")
ALPHA = 0.25  # AutoGraph's weight of the critical path (eq. 1)

# absorb the element-wise ops after them: an average pool too (TVM fuses what follows a pool,
# and the vendor pool takes a per-channel affine and a relu: rule pool-after-conv1x1 leaves a
# convolution's batch norm and activation after its pool)
ANCHORS = frozenset({"conv2d", "matmul", "linear", "avg_pool2d"})
ELEMENTWISE = frozenset({"add", "subtract", "multiply", "divide", "relu", "sigmoid", "tanh",
                         "gelu", "erf", "exp", "sqrt", "rsqrt", "negative", "power",
                         "maximum", "minimum", "clip", "batch_norm"})
VIEWS = frozenset({"reshape", "split", "strided_slice", "squeeze", "expand_dims", "flatten"})


@dataclass(frozen=True)
class Device:
    """What the analytical estimate and the simulation need of a device."""

    flops: float = 50e9  # FLOP/s of one stream
    bandwidth: float = 10e9  # bytes/s of one stream
    launch: float = 3e-6  # seconds of fixed cost per kernel
    streams: int = 2  # kernels that can run at once
    handoff: float = 0.0  # seconds charged when a kernel waits on another stream's


@dataclass(frozen=True)
class Kernel:
    """One kernel of a graph: its operators (anchor first), signature and analytical parts."""

    ops: tuple[int, ...]
    signature: str
    kind: str  # the anchor's kind
    flops: float
    nbytes: float
    # a finer class of the kind for scaling estimates ("" for the kind itself): a grouped
    # convolution runs far below the roofline that dense ones nearly reach
    family: str = ""

    @property
    def classes(self) -> tuple[str, ...]:
        """What this kernel's estimate is scaled by, most specific first."""
        return (self.family, self.kind, "*") if self.family else (self.kind, "*")


@dataclass(frozen=True)
class KernelDAG:
    """The kernels of a graph with their seconds and producers (indices), in order."""

    kernels: tuple[Kernel, ...]
    seconds: tuple[float, ...]  # each kernel on one thread (one stream of the device)
    preds: tuple[tuple[int, ...], ...]
    # each kernel alone with all the device's threads; None: as ``seconds`` (not measured)
    wide: tuple[float, ...] | None = None

    def alone(self) -> tuple[float, ...]:
        """Each kernel's seconds when it runs alone on the whole device (what TASO, MetaFlow
        and AutoGraph measure per operator)."""
        return self.seconds if self.wide is None else self.wide

    def total(self) -> float:
        return sum(self.alone())

    def critical_path(self) -> tuple[float, list[int]]:
        """The longest path's seconds (kernels alone on the device) and its kernels."""
        best: list[float] = []
        prev: list[int] = []
        for i, s in enumerate(self.alone()):
            p = max(self.preds[i], key=best.__getitem__, default=-1)
            best.append(s + (best[p] if p >= 0 else 0.0))
            prev.append(p)
        if not best:
            return 0.0, []
        end = max(range(len(best)), key=best.__getitem__)
        path = []
        while end >= 0:
            path.append(end)
            end = prev[end]
        return best[path[0]], path[::-1]


# ---------------------------------------------------------------------------- fusion
def _is_weight(graph: Graph, r: TensorRef) -> bool:
    return graph[r.node].kind in ("weight", "constant")


def fuse(graph: Graph) -> list[tuple[int, ...]]:
    """Which operators run as one kernel: groups of operator ids, each a kernel, anchor
    first, in topological order of their anchors. An element-wise operator joins the kernel
    that produced its first computed operand when that kernel is an anchor's or an
    element-wise chain's and the operand has no other reader (TVM's OutEWiseFusable and
    injective fusion; the vendor path's conv + bias + activation, average pool + affine +
    relu). Views are their own (free) kernels."""
    group_of: dict[int, int] = {}
    groups: list[list[int]] = []
    fusable: list[bool] = []
    for n in graph.nodes:
        if n.is_source:
            continue
        if n.kind in ELEMENTWISE:
            computed = [r for r in n.inputs if not _is_weight(graph, r)]
            if computed:
                src = computed[0].node
                g = group_of.get(src)
                if (g is not None and fusable[g] and len(graph.users(src)) == 1
                        and TensorRef(src) not in graph.outputs and groups[g][-1] == src
                        and all(r.index == 0 for r in computed[:1])
                        and graph[src].type.shape == n.type.shape):
                    groups[g].append(n.id)
                    group_of[n.id] = g
                    continue
        group_of[n.id] = len(groups)
        groups.append([n.id])
        fusable.append(n.kind in ANCHORS or n.kind in ELEMENTWISE)
    return [tuple(g) for g in groups]


def _prod(xs: Sequence[int]) -> int:
    return math.prod(xs) if xs else 1


def op_flops(graph: Graph, n: Node) -> float:
    """Floating-point operations of one operator (multiply-add = 2)."""
    out = _prod(n.type.shape) if n.outputs else 0
    if n.kind == "conv2d":
        w = graph.type_of(n.inputs[1]).shape
        return 2.0 * out * _prod(w[1:])
    if n.kind in ("matmul", "linear"):
        a = graph.type_of(n.inputs[0]).shape
        return 2.0 * out * (a[-1] if a else 1)
    if n.kind in ("max_pool2d", "avg_pool2d"):
        return float(out * _prod(n.attrs.get("pool_size", (1, 1))))
    if n.kind in VIEWS:
        return 0.0
    return float(out) * (8.0 if n.kind in ("softmax", "layer_norm", "gelu", "erf") else 1.0)


# per-node analytical parts, cached on the (immutable) node: (signature piece, flops, bytes)
_NODE_CACHE: weakref.WeakKeyDictionary[Node, tuple[str, float, float]] = \
    weakref.WeakKeyDictionary()


def _node_parts(graph: Graph, n: Node) -> tuple[str, float, float]:
    cached = _NODE_CACHE.get(n)
    if cached is None:
        ins = [graph.type_of(r) for r in n.inputs]
        shapes = ",".join("x".join(map(str, t.shape)) + (
            "w" if _is_weight(graph, r) else "") for t, r in zip(ins, n.inputs, strict=True))
        attrs = ";".join(f"{k}={v}" for k, v in n.attrs.items() if k != "name")
        sig = f"{n.kind}({shapes}){{{attrs}}}"
        nbytes = sum(t.nbytes for t in n.outputs)
        cached = (sig, op_flops(graph, n), float(nbytes))
        _NODE_CACHE[n] = cached
    return cached


def folded(graph: Graph) -> set[int]:
    """Operators computed from weights and constants alone: the build folds them (numpy and
    FoldConstant), so they never run. A merge's concatenated weights are such an operator;
    pricing them as a kernel made every merge look 12 MB dearer (BERT's Q/K/V)."""
    out: set[int] = set()
    for n in graph.nodes:
        if not n.is_source and n.inputs and all(
                _is_weight(graph, r) or r.node in out for r in n.inputs):
            out.add(n.id)
    return out


def kernels_of(graph: Graph) -> list[Kernel]:
    """`fuse` with each kernel's signature, FLOPs and bytes moved (its inputs from outside the
    kernel and its last output; views and `folded` operators cost nothing)."""
    out = []
    constant = folded(graph)
    for ops in fuse(graph):
        inside = set(ops)
        head = graph[ops[0]]
        parts = [_node_parts(graph, graph[i]) for i in ops]
        sig = "+".join(p[0] for p in parts)
        if head.kind in VIEWS or inside <= constant:
            out.append(Kernel(ops, sig, head.kind, 0.0, 0.0))
            continue
        moved = float(sum(graph.type_of(r).nbytes for i in ops for r in graph[i].inputs
                          if r.node not in inside)) + parts[-1][2]
        out.append(Kernel(ops, sig, head.kind, sum(p[1] for p in parts), moved,
                          _family(head)))
    return out


def _family(n: Node) -> str:
    """The class within ``n``'s kind whose measured/estimated ratio its estimate takes: grouped
    convolutions apart from dense ones (NASNet-A's depthwise convolutions measured several
    times their roofline; priced at the dense ones' ratio, a depthwise convolution regrouped
    into pairs of channels looked 4x cheaper than the depthwise one it replaced and ran 4x
    slower)."""
    if n.kind == "conv2d" and n.attrs.get("groups", 1) != 1:
        return "conv2d/grouped"
    return ""


# ---------------------------------------------------------------------------- the model
@dataclass
class CostModel:
    """Seconds per kernel on one thread: measured by signature where known, else the roofline
    estimate scaled by the median measured/estimated ratio of that kind (1 where none is
    known); and on all the device's threads (``wide``): measured where known, else the
    one-thread seconds scaled by the median wide/one-thread ratio of that kind (how well such
    kernels use more cores; 1 where none is known)."""

    device: Device = field(default_factory=Device)
    measured: dict[str, float] = field(default_factory=dict)
    scale: dict[str, float] = field(default_factory=dict)
    wide: dict[str, float] = field(default_factory=dict)  # signature -> seconds, all threads
    speedup: dict[str, float] = field(default_factory=dict)  # kind -> median wide/one ratio
    _kernels: dict[str, Kernel] = field(default_factory=dict, repr=False)  # learned ones

    def estimate(self, k: Kernel) -> float:
        """The roofline estimate of a kernel (0 for views and folded operators)."""
        if k.kind in VIEWS or k.flops == k.nbytes == 0.0:
            return 0.0
        d = self.device
        return max(k.flops / d.flops, k.nbytes / d.bandwidth) + d.launch

    def seconds(self, k: Kernel) -> float:
        if k.signature in self.measured:
            return self.measured[k.signature]
        return self.estimate(k) * _first(self.scale, k.classes)

    def seconds_wide(self, k: Kernel) -> float:
        """The kernel's seconds alone on all the device's threads."""
        if k.signature in self.wide:
            return self.wide[k.signature]
        return self.seconds(k) * _first(self.speedup, k.classes)

    def learn(self, measured: Mapping[str, tuple[Kernel, float]],
              wide: Mapping[str, float] | None = None) -> None:
        """Add measured kernels (signature -> (kernel, seconds on one thread); ``wide``:
        signature -> seconds on all threads) and recompute the scales over every kernel
        measured so far."""
        for sig, (k, s) in measured.items():
            self.measured[sig] = s
            self._kernels[sig] = k
        self.wide.update({sig: w for sig, w in (wide or {}).items() if sig in self.measured})
        gains: dict[str, list[float]] = {}
        for sig, w in self.wide.items():
            if self.measured[sig] > 0:
                for c in self._kernels[sig].classes:
                    gains.setdefault(c, []).append(w / self.measured[sig])
        for kind, rs in gains.items():
            rs.sort()
            self.speedup[kind] = rs[len(rs) // 2]
        ratios: dict[str, list[float]] = {}
        for sig, k in self._kernels.items():
            est = self.estimate(k)
            if est > 0:
                for c in k.classes:
                    ratios.setdefault(c, []).append(self.measured[sig] / est)
        for kind, rs in ratios.items():
            rs.sort()
            self.scale[kind] = rs[len(rs) // 2]

    def dag(self, graph: Graph) -> KernelDAG:
        """The graph's kernels in a topological order, with their seconds and producers (a
        kernel that absorbed a residual add reads a kernel begun after its anchor)."""
        ks = kernels_of(graph)
        where = {op: i for i, k in enumerate(ks) for op in k.ops}
        preds: dict[int, set[int]] = {}
        for i, k in enumerate(ks):
            inside = set(k.ops)
            preds[i] = {where[r.node] for op in k.ops for r in graph[op].inputs
                        if r.node not in inside and r.node in where} - {i}
        order = toposort(range(len(ks)), preds)
        pos = {k: j for j, k in enumerate(order)}
        return KernelDAG(tuple(ks[i] for i in order), tuple(self.seconds(ks[i]) for i in order),
                         tuple(tuple(sorted(pos[p] for p in preds[i])) for i in order),
                         tuple(self.seconds_wide(ks[i]) for i in order) if self.wide else None)

    def cost(self, graph: Graph, kind: str = "mixed", alpha: float = ALPHA) -> float:
        """The graph's cost (`COSTS`) in seconds."""
        return dag_cost(self.dag(graph), kind, alpha, self.device)


def _first(by_class: Mapping[str, float], classes: Sequence[str]) -> float:
    """The value of the first of ``classes`` known in ``by_class`` (1 where none is)."""
    return next((by_class[c] for c in classes if c in by_class), 1.0)


def dag_cost(dag: KernelDAG, kind: str = "mixed", alpha: float = ALPHA,
             device: Device | None = None) -> float:
    """``sum``, ``critical-path``, ``mixed`` (eq. 1) or ``simulated`` over a kernel DAG."""
    if kind == "sum":
        return dag.total()
    if kind == "critical-path":
        return dag.critical_path()[0]
    if kind == "mixed":
        return dag.total() + alpha * dag.critical_path()[0]
    if kind == "simulated":  # kernels on streams of one thread, or one at a time on all
        d = device or Device()
        return min(simulate(dag, d.streams, d.handoff), dag.total())
    raise ValueError(f"unknown cost {kind!r}; choose from {', '.join(COSTS)}")


def simulate(dag: KernelDAG, streams: int, handoff: float = 0.0) -> float:
    """The makespan of the critical-path list schedule (`paragraph.passes.schedule.
    critical_path`'s placement without its exact segment search): kernels by decreasing
    bottom level, each on the stream where it can start first; ``handoff`` charged for a
    producer on another stream."""
    n = len(dag.seconds)
    users: list[list[int]] = [[] for _ in range(n)]
    for i, ps in enumerate(dag.preds):
        for p in ps:
            users[p].append(i)
    bottom = [0.0] * n
    for i in reversed(range(n)):
        bottom[i] = dag.seconds[i] + max((bottom[u] for u in users[i]), default=0.0)
    free = [0.0] * max(1, streams)
    finish = [0.0] * n
    stream_of = [0] * n
    waiting = [len(ps) for ps in dag.preds]
    ready = [i for i in range(n) if not waiting[i]]
    while ready:
        ready.sort(key=lambda i: (-bottom[i], i))
        i = ready.pop(0)
        best_s, best_t = 0, math.inf
        for s, f in enumerate(free):
            t = max([f] + [finish[p] + (handoff if stream_of[p] != s else 0.0)
                           for p in dag.preds[i]])
            if t < best_t:
                best_s, best_t = s, t
        finish[i] = best_t + dag.seconds[i]
        free[best_s] = finish[i]
        stream_of[i] = best_s
        for u in users[i]:
            waiting[u] -= 1
            if not waiting[u]:
                ready.append(u)
    return max(finish, default=0.0)


CostFn = Callable[[Graph], float]


def cost_function(model: CostModel, kind: str = "mixed", alpha: float = ALPHA) -> CostFn:
    """``graph -> seconds`` for a search."""
    if kind not in COSTS:
        raise ValueError(f"unknown cost {kind!r}; choose from {', '.join(COSTS)}")
    return lambda g: model.cost(g, kind, alpha)
