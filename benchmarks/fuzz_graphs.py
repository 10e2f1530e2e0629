"""The differential fuzzer's graphs: random well-typed operator graphs as plain recipes, the Relax
module each becomes, its inputs, and its independent reference.

A recipe (`Recipe`, JSON values only, so a failure's graph can be written to a report and read
back) is a list of steps over numbered values: the inputs first, then one value per step. Steps
draw from every operator `paragraph.ops` models (convolutions with random stride, padding,
dilation and groups, depthwise among them; products with weights and batched products of two
activations; linear layers; element-wise arithmetic with broadcasting; the activations and the
exported forms the vendor dispatch fuses: ReLU6 as a clip, hard-swish, hard-sigmoid, SiLU as a
sigmoid gate, GELU with erf and with tanh; softmax, layer and batch norm; pools; concatenation,
split, slices, reshapes, transposes) and from Relax operators the IR keeps opaque (reductions,
``take`` as an embedding over integer ids and as a gather, ``erf``, ``power``, ``gelu_tanh``;
Relax's ``relu6`` is a clip already). Sizes are drawn to hit the tails: 1, primes and sizes
about the vector widths (15, 16, 17, 31, 32, 33). Values that no step reads are the outputs.

Draws come from a `Draw`: `SeededDraw` (a seed makes the graph) for the fuzzer's command line,
`HypothesisDraw` (hypothesis shrinks the draws) for the tests. The reference is the numpy
interpreter (`paragraph.interpret.run_graph`) over the graph imported from the Relax module,
with `opaque_reference` for the opaque calls: never paragraph's kernels or TVM's.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import tvm
from scipy.special import erf
from tvm import relax

from paragraph.graph import Graph, Node
from paragraph.interpret import run_graph
from paragraph.ops import infer
from paragraph.tensor import TensorType
from paragraph.tvm_interop.frontend.relax_graph import from_relax

Recipe = dict[str, Any]  # {"seed", "inputs": [{"shape", "dtype", "high"?}], "steps", "outputs"}

# channel and feature sizes: 1, primes, and about the vector widths (8, 16 and 32 floats)
CHANNELS = (1, 2, 3, 4, 5, 7, 8, 13, 15, 16, 17, 31, 32, 33)
# spatial sizes: small, odd and prime ones, and the widths again
SPATIAL = (1, 2, 3, 4, 5, 7, 8, 9, 11, 13, 15, 16, 17)
MAX_ELEMENTS = 24_000  # a value larger than this is not made: graphs stay cheap to build and run
UNARY = ("relu", "sigmoid", "tanh", "gelu", "silu", "gelu_tanh", "relu6", "clip", "relu6_clip",
         "hardswish", "hardsigmoid", "silu_gate", "gelu_erf_chain", "gelu_tanh_chain")
BINARY = ("add", "subtract", "multiply", "divide")


class Draw(Protocol):
    """Where a recipe's random choices come from."""

    def integer(self, low: int, high: int) -> int:
        """An integer in [low, high]."""
        ...

    def choice(self, options: Sequence[Any]) -> Any:
        """One of ``options``."""
        ...

    def chance(self, p: float) -> bool:
        """True with probability about ``p``."""
        ...


class SeededDraw:
    """Draws from a seeded generator: one seed, one graph."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def integer(self, low: int, high: int) -> int:
        return self.rng.randint(low, high)

    def choice(self, options: Sequence[Any]) -> Any:
        return options[self.rng.randrange(len(options))]

    def chance(self, p: float) -> bool:
        return self.rng.random() < p


class HypothesisDraw:
    """Draws through hypothesis's ``data`` object, so that it shrinks a failing graph (earlier
    options, smaller integers, fewer steps)."""

    def __init__(self, data: Any) -> None:
        from hypothesis import strategies  # a test dependency, not the fuzzer's

        self.data, self.st = data, strategies

    def integer(self, low: int, high: int) -> int:
        return int(self.data.draw(self.st.integers(low, high)))

    def choice(self, options: Sequence[Any]) -> Any:
        return options[self.data.draw(self.st.integers(0, len(options) - 1))]

    def chance(self, p: float) -> bool:
        return bool(self.data.draw(self.st.integers(0, 999)) < p * 1000)


# ---------------------------------------------------------------------------- generation
class _Maker:
    """The state of one recipe being drawn: the values made so far and their shapes."""

    def __init__(self, draw: Draw, max_steps: int) -> None:
        self.d, self.max_steps = draw, max_steps
        self.inputs: list[dict[str, Any]] = []
        self.steps: list[dict[str, Any]] = []
        self.shapes: list[tuple[int, ...]] = []
        self.dtypes: list[str] = []

    def dim(self, sizes: Sequence[int] = CHANNELS) -> int:
        return int(self.d.choice(sizes))

    def add_input(self, shape: Sequence[int], dtype: str = "float32", high: int = 0) -> int:
        spec: dict[str, Any] = {"shape": [int(s) for s in shape], "dtype": dtype}
        if high:
            spec["high"] = high
        self.inputs.append(spec)
        self.shapes.append(tuple(spec["shape"]))
        self.dtypes.append(dtype)
        return len(self.shapes) - 1

    def add(self, op: str, args: Sequence[int], out: Sequence[int], **attrs: Any) -> int:
        shape = tuple(int(s) for s in out)
        if not all(s >= 1 for s in shape) or math.prod(shape) > MAX_ELEMENTS:
            raise _Skip
        self.steps.append({"op": op, "args": list(args), "attrs": attrs, "shape": list(shape)})
        self.shapes.append(shape)
        self.dtypes.append("float32")
        return len(self.shapes) - 1

    def start(self) -> None:
        """The graph's inputs (an image batch, a sequence, or ids to embed; maybe a second
        float input beside it, for joins, residuals and products) and, for ids, the
        embedding."""
        family = self.d.choice(("image", "image", "sequence", "ids"))
        if family == "image":
            n = self.d.choice((1, 1, 2, 3))
            first = (n, self.dim(), self.dim(SPATIAL), self.dim(SPATIAL))
        elif family == "sequence":
            rank = self.d.choice((2, 3, 3))
            first = tuple([self.dim(SPATIAL) for _ in range(rank - 1)] + [self.dim()])
        else:
            rows = self.d.choice((1, 2, 5, 16, 17, 33))
            ids_shape = (self.d.choice((1, 2)), self.dim(SPATIAL))
            first = (*ids_shape, self.dim())
            ids = self.add_input(ids_shape, "int64", high=rows)
        if family != "ids":
            self.add_input(first)
        if self.d.chance(0.25):  # the inputs come first: values are numbered inputs first
            self.add_input(first if self.d.chance(0.7) else _broadcast_partner(self.d, first))
        if family == "ids":
            self.add("embedding", [ids], first, rows=rows)


class _Skip(Exception):
    """The drawn step does not fit (too large, or no valid attributes): draw another."""


def recipe(draw: Draw, seed: int, max_steps: int = 6) -> Recipe:
    """A random recipe of 1 to ``max_steps`` steps (see the module docstring); ``seed`` makes
    its weights."""
    m = _Maker(draw, max_steps)
    m.start()
    want = draw.integer(1, max_steps)
    tries = 0
    while len(m.steps) < want and tries < 60:
        tries += 1
        floats = [i for i, t in enumerate(m.dtypes) if t == "float32"]
        # mostly the newest value: chains (a convolution and its epilogue) over fan-out
        x = floats[-1] if draw.chance(0.6) else draw.choice(floats)
        try:
            _step(m, x)
            # epilogues on a product or convolution: what the vendor dispatch fuses into it
            if m.steps[-1]["op"] in ("conv2d", "matmul", "linear"):
                while draw.chance(0.6):
                    _step_epilogue(m, len(m.shapes) - 1)
        except _Skip:
            continue
    if not m.steps:
        _step_unary(m, [i for i, t in enumerate(m.dtypes) if t == "float32"][-1])
    read = {a for s in m.steps for a in s["args"]}
    outputs = [i for i in range(len(m.inputs), len(m.shapes)) if i not in read]
    # outputs a model may have beside its leaves: a value others read too, one output twice,
    # an input passed through (buffers the executor must not reuse or alias wrongly)
    inner = [v for v in range(len(m.inputs), len(m.shapes)) if v in read]
    if inner and draw.chance(0.15):
        outputs.append(draw.choice(inner))
    if draw.chance(0.05):
        outputs.append(outputs[0])
    if m.dtypes[0] == "float32" and draw.chance(0.05):
        outputs.append(0)
    return {"seed": seed, "inputs": m.inputs, "steps": m.steps, "outputs": outputs}


def shape_of(recipe: Recipe, value: int) -> tuple[int, ...]:
    """The shape of value ``value`` of ``recipe`` (an input's or a step's)."""
    n_in = len(recipe["inputs"])
    spec = recipe["inputs"][value] if value < n_in else recipe["steps"][value - n_in]
    return tuple(spec["shape"])


def union(recipes: Sequence[Recipe]) -> Recipe:
    """One recipe computing all of ``recipes`` side by side (disconnected, their inputs and
    outputs one after another; the first one's seed makes the weights): several graphs in one
    import and one build, and independent branches for the schedules to run at once."""
    inputs: list[dict[str, Any]] = [spec for r in recipes for spec in r["inputs"]]
    steps: list[dict[str, Any]] = []
    outputs: list[int] = []
    first_input = 0
    step_base = len(inputs)
    for r in recipes:
        n_in = len(r["inputs"])
        offset = step_base + len(steps)

        def renumber(v: int, n_in: int = n_in, first: int = first_input,
                     offset: int = offset) -> int:
            return first + v if v < n_in else offset + v - n_in

        steps += [{**s, "args": [renumber(a) for a in s["args"]]} for s in r["steps"]]
        outputs += [renumber(o) for o in r["outputs"]]
        first_input += n_in
    return {"seed": recipes[0]["seed"], "inputs": inputs, "steps": steps, "outputs": outputs}


def _broadcast_partner(draw: Draw, shape: tuple[int, ...]) -> list[int]:
    """A shape that broadcasts with ``shape``: some of its dimensions 1, maybe fewer of them."""
    out = [1 if draw.chance(0.4) else s for s in shape]
    drop = draw.integer(0, len(out) - 1) if draw.chance(0.3) else 0
    return out[drop:]


def _step(m: _Maker, x: int) -> None:
    rank = len(m.shapes[x])
    options = ["unary", "unary", "binary", "binary", "softmax", "layer_norm", "reduce",
               "slice", "split", "concat", "permute", "reshape", "gather", "matmul", "linear"]
    if rank == 4:
        options += ["conv2d"] * 5 + ["pool", "pool", "adaptive_pool", "batch_norm"]
    if rank >= 2:
        options += ["matmul"]
    kind = m.d.choice(options)
    {"unary": _step_unary, "binary": _step_binary, "softmax": _step_softmax,
     "layer_norm": _step_layer_norm, "reduce": _step_reduce, "slice": _step_slice,
     "split": _step_split, "concat": _step_concat, "permute": _step_permute,
     "reshape": _step_reshape, "gather": _step_gather, "matmul": _step_matmul,
     "linear": _step_linear, "conv2d": _step_conv2d, "pool": _step_pool,
     "adaptive_pool": _step_adaptive_pool, "batch_norm": _step_batch_norm}[kind](m, x)


def _step_unary(m: _Maker, x: int) -> None:
    fn = m.d.choice(UNARY)
    attrs: dict[str, Any] = {"fn": fn}
    if fn == "clip":
        low = m.d.choice((-1.0, -0.5, 0.0, 0.25))
        attrs.update(low=low, high=low + m.d.choice((0.5, 1.0, 2.0)))
    if fn in ("hardswish", "gelu_erf_chain"):
        attrs["variant"] = m.d.integer(0, 1)  # divide by a constant or multiply by its inverse
    m.add("unary", [x], m.shapes[x], **attrs)


def _step_binary(m: _Maker, x: int) -> None:
    fn = m.d.choice(BINARY)
    shape = m.shapes[x]
    others = [i for i, (s, t) in enumerate(zip(m.shapes, m.dtypes, strict=True))
              if t == "float32" and i != x and _broadcasts(s, shape)]
    if fn != "divide" and others and m.d.chance(0.5):  # two activations (a residual add)
        y = m.d.choice(others)
        args = [x, y] if m.d.chance(0.7) else [y, x]
        m.add("binary", args, np.broadcast_shapes(shape, m.shapes[y]), fn=fn)
        return
    const = _broadcast_partner(m.d, shape) if m.d.chance(0.7) else []
    if len(shape) == 4 and m.d.chance(0.4):  # per channel, what folds into a convolution
        const = [1, shape[1], 1, 1]
    m.add("binary", [x], np.broadcast_shapes(shape, tuple(const)), fn=fn, const=const,
          const_first=fn != "divide" and m.d.chance(0.2))


def _step_epilogue(m: _Maker, x: int) -> None:
    """After a convolution or product: an activation, a per-channel (or per-feature) affine
    step with a constant (batch norm as exporters leave it), or a residual add."""
    shape = m.shapes[x]
    kind = m.d.choice(("unary", "unary", "affine", "affine", "residual"))
    same = [i for i, (s, t) in enumerate(zip(m.shapes, m.dtypes, strict=True))
            if t == "float32" and i != x and s == shape]
    if kind == "residual" and same:
        y = m.d.choice(same)
        m.add("binary", [x, y] if m.d.chance(0.7) else [y, x], shape, fn="add")
    elif kind == "affine":
        const = [1, shape[1], 1, 1] if len(shape) == 4 else [shape[-1]]
        fn = m.d.choice(BINARY)
        m.add("binary", [x], shape, fn=fn, const=const,
              const_first=fn != "divide" and m.d.chance(0.2))
    else:
        _step_unary(m, x)


def _broadcasts(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    try:
        return tuple(np.broadcast_shapes(a, b)) == b
    except ValueError:
        return False


def _axis(m: _Maker, x: int) -> int:
    rank = len(m.shapes[x])
    axis = m.d.integer(0, rank - 1)
    return axis - rank if m.d.chance(0.3) else axis


def _step_softmax(m: _Maker, x: int) -> None:
    m.add("softmax", [x], m.shapes[x], axis=-1 if m.d.chance(0.6) else _axis(m, x))


def _step_layer_norm(m: _Maker, x: int) -> None:
    rank = len(m.shapes[x])
    axes = [-1] if rank == 1 or m.d.chance(0.8) else [-2, -1]
    # not BERT's 1e-12: a row of equal values (an embedding of a 1-row table) has a variance of
    # rounding error, which so small an epsilon turns into any value (ill-conditioned, not wrong)
    m.add("layer_norm", [x], m.shapes[x], axes=axes, epsilon=m.d.choice((1e-5, 1e-3)))


def _step_batch_norm(m: _Maker, x: int) -> None:
    m.add("batch_norm", [x], m.shapes[x], epsilon=m.d.choice((1e-5, 1e-3)))


def _step_reduce(m: _Maker, x: int) -> None:
    shape = m.shapes[x]
    rank = len(shape)
    if rank == 4 and m.d.chance(0.4):  # the global pool the dispatch takes as a vendor pool
        axes = [2, 3] if m.d.chance(0.7) else [-2, -1]
    else:
        axes = sorted({m.d.integer(0, rank - 1) for _ in range(m.d.integer(1, rank))})
    keep = m.d.chance(0.6)
    out = [1 if i in {a % rank for a in axes} else s for i, s in enumerate(shape)]
    if not keep:
        out = [s for i, s in enumerate(shape) if i not in {a % rank for a in axes}]
    if not out:
        raise _Skip  # a scalar: nothing downstream takes one
    m.add("reduce", [x], out, fn=m.d.choice(("mean", "mean", "sum", "max")), axes=axes,
          keepdims=keep)


def _step_slice(m: _Maker, x: int) -> None:
    shape = m.shapes[x]
    axis = m.d.integer(0, len(shape) - 1)
    size = shape[axis]
    begin = m.d.integer(-size, size - 1)
    # ends past the dimension clamp; a stride that skips
    end = m.d.choice((size, size + 3, m.d.integer(begin % size + 1, size)))
    stride = m.d.choice((1, 1, 2, 3))
    attrs = {"axes": [axis], "begin": [begin], "end": [end], "strides": [stride]}
    (out,) = infer("strided_slice", [TensorType(shape)], attrs)
    m.add("strided_slice", [x], out.shape, **attrs)


def _step_split(m: _Maker, x: int) -> None:
    shape = m.shapes[x]
    axis = m.d.integer(0, len(shape) - 1)
    if shape[axis] < 2:
        raise _Skip
    if m.d.chance(0.5):
        sections: Any = m.d.choice([n for n in (2, 3, 4) if n <= shape[axis]])
        if shape[axis] % sections:
            raise _Skip  # Relax needs sections that divide the dimension
    else:
        cut = m.d.integer(1, shape[axis] - 1)
        sections = [cut] if m.d.chance(0.6) or cut + 1 >= shape[axis] else [cut, cut + 1]
    outs = infer("split", [TensorType(shape)], {"indices_or_sections": sections, "axis": axis})
    piece = m.d.integer(0, len(outs) - 1)
    m.add("split", [x], outs[piece].shape, sections=sections, axis=axis, piece=piece)


def _step_concat(m: _Maker, x: int) -> None:
    shape = m.shapes[x]
    axis = m.d.integer(0, len(shape) - 1)
    fits = [i for i, (s, t) in enumerate(zip(m.shapes, m.dtypes, strict=True)) if t == "float32"
            and len(s) == len(shape) and all(a == b for k, (a, b) in enumerate(
                zip(s, shape, strict=True)) if k != axis)]
    parts = [x] + [m.d.choice(fits) for _ in range(m.d.integer(1, 2))]
    total = sum(m.shapes[p][axis] for p in parts)
    out = list(shape)
    out[axis] = total
    m.add("concat", parts, out, axis=axis - len(shape) if m.d.chance(0.3) else axis)


def _step_permute(m: _Maker, x: int) -> None:
    rank = len(m.shapes[x])
    if rank < 2:
        raise _Skip
    axes = list(range(rank))
    for i in range(rank - 1, 0, -1):  # a drawn permutation
        j = m.d.integer(0, i)
        axes[i], axes[j] = axes[j], axes[i]
    m.add("permute_dims", [x], [m.shapes[x][a] for a in axes], axes=axes)


def _step_reshape(m: _Maker, x: int) -> None:
    shape = m.shapes[x]
    total = math.prod(shape)
    if len(shape) >= 2 and m.d.chance(0.5):  # merge two neighbours
        i = m.d.integer(0, len(shape) - 2)
        out = [*shape[:i], shape[i] * shape[i + 1], *shape[i + 2:]]
    else:  # split a dimension by one of its factors
        i = m.d.integer(0, len(shape) - 1)
        factors = [f for f in range(2, shape[i]) if shape[i] % f == 0]
        if not factors:
            out = [*shape, 1] if len(shape) < 4 else [total]
        else:
            f = m.d.choice(factors)
            out = [*shape[:i], f, shape[i] // f, *shape[i + 1:]]
    m.add("reshape", [x], out, shape=out)


def _step_gather(m: _Maker, x: int) -> None:
    shape = m.shapes[x]
    axis = m.d.integer(0, len(shape) - 1)
    size = shape[axis]
    n = m.d.integer(1, 5)
    # indices at and just inside both bounds
    picks = [m.d.choice((0, size - 1, min(1, size - 1), max(size - 2, 0))) for _ in range(n)]
    out = [*shape[:axis], n, *shape[axis + 1:]]
    m.add("gather", [x], out, axis=axis, indices=picks)


def _step_matmul(m: _Maker, x: int) -> None:
    shape = m.shapes[x]
    if len(shape) >= 2 and m.d.chance(0.35):  # two activations: a batched product
        k = shape[-1]
        others = [i for i, (s, t) in enumerate(zip(m.shapes, m.dtypes, strict=True))
                  if t == "float32" and len(s) == len(shape) and s[:-2] == shape[:-2]
                  and s[-2] == k]
        if others:
            y = m.d.choice(others)
            m.add("matmul", [x, y], (*shape[:-1], m.shapes[y][-1]))
            return
        if len(shape) >= 3 or m.d.chance(0.5):  # x times its own transpose
            perm = [*range(len(shape) - 2), len(shape) - 1, len(shape) - 2]
            t = m.add("permute_dims", [x], [shape[p] for p in perm], axes=perm)
            m.add("matmul", [x, t], (*shape[:-1], shape[-2]))
            return
    n = m.dim()
    m.add("matmul", [x], (*shape[:-1], n), n=n)


def _step_linear(m: _Maker, x: int) -> None:
    n = m.dim()
    m.add("linear", [x], (*m.shapes[x][:-1], n), n=n, bias=m.d.chance(0.7))


def _step_conv2d(m: _Maker, x: int) -> None:
    n, c, h, w = m.shapes[x]
    depthwise = m.d.chance(0.3)
    if depthwise:
        groups, out = c, c * m.d.choice((1, 1, 2))
    else:
        groups = m.d.choice([g for g in (1, 1, 1, 2, 3, 4) if c % g == 0])
        out = groups * max(1, m.dim() // groups)
    kh = m.d.choice((1, 1, 3, 3, 5, 7))
    kw = kh if m.d.chance(0.8) else m.d.choice((1, 3))
    if m.d.chance(0.15):  # the 1 x 7 / 7 x 1 pair of Inception
        kh, kw = m.d.choice(((1, 7), (7, 1), (1, 3), (3, 1)))
    stride = m.d.choice((1, 1, 1, 2, 3))
    strides = (stride, stride if m.d.chance(0.9) else m.d.choice((1, 2)))
    dil = m.d.choice((1, 1, 1, 2))
    pads = [m.d.choice((0, kh // 2, kh // 2, kh - 1)) for _ in range(2)]
    pads += [m.d.choice((0, kw // 2, kw // 2, kw - 1)) for _ in range(2)]
    padding = [pads[0], pads[2], pads[1], pads[3]]  # top, left, bottom, right
    if m.d.chance(0.6):  # symmetric, as most models are
        padding = [padding[0], padding[1], padding[0], padding[1]]
    attrs = {"strides": strides, "padding": padding, "dilation": (dil, dil), "groups": groups}
    try:
        (t,) = infer("conv2d", [TensorType((n, c, h, w)), TensorType((out, c // groups, kh, kw))],
                     attrs)
    except ValueError:
        raise _Skip from None
    m.add("conv2d", [x], t.shape, out_channels=out, kernel=[kh, kw], strides=list(strides),
          padding=padding, dilation=[dil, dil], groups=groups, bias=m.d.chance(0.6))


def _step_pool(m: _Maker, x: int) -> None:
    kind = m.d.choice(("max_pool2d", "avg_pool2d"))
    k = m.d.choice((1, 2, 3, 3, 5))
    stride = m.d.choice((1, 1, 2, 2, 3))
    pad = m.d.integer(0, k // 2)
    attrs = {"pool_size": (k, k), "strides": (stride, stride), "padding": (pad, pad, pad, pad),
             "ceil_mode": m.d.chance(0.3), "count_include_pad": m.d.chance(0.5)}
    try:
        (t,) = infer(kind, [TensorType(m.shapes[x])], attrs)
    except ValueError:
        raise _Skip from None
    m.add(kind, [x], t.shape, **{k: list(v) if isinstance(v, tuple) else v
                                 for k, v in attrs.items()})


def _step_adaptive_pool(m: _Maker, x: int) -> None:
    n, c, h, w = m.shapes[x]
    size = m.d.choice(((1, 1), (1, 1), (2, 2), (h, w), (max(1, h // 2), max(1, w // 3))))
    m.add("adaptive_avg_pool2d", [x], (n, c, *size), output_size=list(size))


# ---------------------------------------------------------------------------- Relax
def weights(recipe: Recipe, index: int, in_shape: Sequence[int]) -> dict[str, np.ndarray]:
    """Step ``index``'s weights (its first argument of shape ``in_shape``), drawn from the
    recipe's seed and the step: the same recipe, the same weights, in Relax and in ONNX."""
    step = recipe["steps"][index]
    op, a = step["op"], step["attrs"]
    rng = np.random.default_rng([int(recipe["seed"]) & 0xFFFFFFFF, index])
    shape = list(in_shape)

    def normal(dims: Sequence[int], scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(tuple(dims)) * scale).astype("float32")

    if op == "embedding":
        return {"table": normal((a["rows"], step["shape"][-1]))}
    if op == "gather":
        return {"indices": np.array(a["indices"], "int64")}
    if op == "conv2d":
        c_in = shape[1] // a["groups"]
        fan_in = c_in * a["kernel"][0] * a["kernel"][1]
        w = {"w": normal((a["out_channels"], c_in, *a["kernel"]), fan_in ** -0.5)}
        return {**w, "b": normal((1, a["out_channels"], 1, 1))} if a["bias"] else w
    if op == "matmul" and len(step["args"]) == 1:
        return {"w": normal((shape[-1], a["n"]), shape[-1] ** -0.5)}
    if op == "linear":
        w = {"w": normal((a["n"], shape[-1]), shape[-1] ** -0.5)}
        return {**w, "b": normal((a["n"],))} if a["bias"] else w
    if op == "binary" and len(step["args"]) == 1:
        c = normal(a["const"])
        if a["fn"] == "divide":  # away from zero: a quotient's scale stays that of its input
            c = ((np.sign(c) + (c == 0)) * (0.5 + np.abs(c) % 1.5)).astype("float32")
        return {"c": c}
    if op == "layer_norm":
        norm = [shape[ax] for ax in a["axes"]]
        return {"gamma": 1 + 0.1 * normal(norm), "beta": 0.1 * normal(norm)}
    if op == "batch_norm":
        c = shape[1]
        return {"gamma": 1 + 0.1 * normal((c,)), "beta": normal((c,)), "mean": normal((c,)),
                "var": (0.5 + rng.random(c)).astype("float32")}
    return {}


def _const(value: np.ndarray) -> relax.Constant:
    return relax.const(value, str(value.dtype))


def module(recipe: Recipe) -> tvm.IRModule:
    """The Relax module whose ``main`` computes ``recipe``: one dataflow block, weights as
    constants (what `paragraph.build` takes from any importer)."""
    bb = relax.BlockBuilder()
    params = [relax.Var(f"x{k}", relax.TensorType(spec["shape"], spec["dtype"]))
              for k, spec in enumerate(recipe["inputs"])]
    with bb.function("main", params):
        with bb.dataflow():
            values: list[relax.Expr] = list(params)
            for i, step in enumerate(recipe["steps"]):
                args = [values[a] for a in step["args"]]
                w = weights(recipe, i, [int(d) for d in args[0].ty.shape])
                values.append(_emit(bb, step, args, w, f"s{i}"))
            outs = [values[o] for o in recipe["outputs"]]
            gv = bb.emit_output(outs[0] if len(outs) == 1 else relax.Tuple(outs))
        bb.emit_func_output(gv)
    return bb.get()


def _emit(bb: relax.BlockBuilder, step: dict[str, Any], args: list[relax.Expr],
          w: dict[str, np.ndarray], name: str) -> relax.Expr:
    """The bindings of one step (its weights ``w``); returns the variable of its value."""
    op, a = step["op"], step["attrs"]
    nn = relax.op.nn
    x = args[0]

    def emit(expr: relax.Expr) -> relax.Expr:
        return bb.emit(expr, name_hint=name)

    c = {k: _const(v) for k, v in w.items()}
    if op == "embedding":
        return emit(relax.op.take(c["table"], x, axis=0))
    if op == "gather":
        return emit(relax.op.take(x, c["indices"], axis=a["axis"]))
    if op == "conv2d":
        y = emit(nn.conv2d(x, c["w"], a["strides"], a["padding"], a["dilation"], a["groups"]))
        return emit(relax.op.add(y, c["b"])) if a["bias"] else y
    if op == "matmul":
        return emit(relax.op.matmul(x, args[1] if len(args) == 2 else c["w"]))
    if op == "linear":
        return emit(relax.op.linear(x, c["w"], c.get("b")))
    if op == "binary":
        fn = getattr(relax.op, a["fn"])
        if len(args) == 2:
            return emit(fn(x, args[1]))
        return emit(fn(c["c"], x) if a.get("const_first") else fn(x, c["c"]))
    if op == "unary":
        return _emit_unary(bb, a, x, name)
    if op == "softmax":
        return emit(nn.softmax(x, a["axis"]))
    if op == "layer_norm":
        return emit(nn.layer_norm(x, c["gamma"], c["beta"], a["axes"], a["epsilon"]))
    if op == "batch_norm":
        bn = emit(nn.batch_norm(x, c["gamma"], c["beta"], c["mean"], c["var"], axis=1,
                                epsilon=a["epsilon"], training=False))
        return emit(relax.TupleGetItem(bn, 0))
    if op in ("max_pool2d", "avg_pool2d"):
        fn = nn.max_pool2d if op == "max_pool2d" else nn.avg_pool2d
        return emit(fn(x, a["pool_size"], a["strides"], a["padding"], ceil_mode=a["ceil_mode"],
                       count_include_pad=a["count_include_pad"]))
    if op == "adaptive_avg_pool2d":
        return emit(nn.adaptive_avg_pool2d(x, a["output_size"]))
    if op == "reduce":
        return emit(getattr(relax.op, a["fn"])(x, a["axes"], a["keepdims"]))
    if op == "strided_slice":
        return emit(relax.op.strided_slice(x, a["axes"], a["begin"], a["end"], a["strides"]))
    if op == "split":
        parts = emit(relax.op.split(x, a["sections"], a["axis"]))
        return emit(relax.TupleGetItem(parts, a["piece"]))
    if op == "concat":
        return emit(relax.op.concat(args, a["axis"]))
    if op == "permute_dims":
        return emit(relax.op.permute_dims(x, a["axes"]))
    if op == "reshape":
        return emit(relax.op.reshape(x, a["shape"]))
    raise ValueError(f"unknown step {op!r}")


def _emit_unary(bb: relax.BlockBuilder, a: dict[str, Any], x: relax.Expr,
                name: str) -> relax.Expr:
    """An activation, as a Relax operator or as the chain an exporter writes (the forms the
    vendor dispatch fuses into a convolution or product before it)."""
    nn, op = relax.op.nn, relax.op
    fn = a["fn"]

    def emit(expr: relax.Expr) -> relax.Expr:
        return bb.emit(expr, name_hint=name)

    def k(v: float) -> relax.Constant:
        return relax.const(np.float32(v))

    simple = {"relu": nn.relu, "sigmoid": op.sigmoid, "tanh": op.tanh, "gelu": nn.gelu,
              "silu": nn.silu, "gelu_tanh": nn.gelu_tanh, "relu6": nn.relu6}
    if fn in simple:
        return emit(simple[fn](x))
    if fn == "clip":
        return emit(op.clip(x, a["low"], a["high"]))
    if fn == "relu6_clip":
        return emit(op.clip(x, 0.0, 6.0))
    if fn == "hardswish":  # x * clip(x + 3, 0, 6) / 6
        clipped = emit(op.clip(emit(op.add(x, k(3.0))), 0.0, 6.0))
        gate = emit(op.divide(clipped, k(6.0)) if a["variant"] == 0
                    else op.multiply(clipped, k(1 / 6)))
        return emit(op.multiply(x, gate))
    if fn == "hardsigmoid":  # clip(x / 6 + 1/2, 0, 1)
        return emit(op.clip(emit(op.add(emit(op.multiply(x, k(1 / 6))), k(0.5))), 0.0, 1.0))
    if fn == "silu_gate":
        return emit(op.multiply(x, emit(op.sigmoid(x))))
    if fn == "gelu_erf_chain":  # x * (1 + erf(x / sqrt 2)) * 0.5
        scaled = emit(op.divide(x, k(2 ** 0.5)) if a["variant"] == 0
                      else op.multiply(x, k(2 ** -0.5)))
        one_plus = emit(op.add(emit(op.erf(scaled)), k(1.0)))
        return emit(op.multiply(emit(op.multiply(x, one_plus)), k(0.5)))
    if fn == "gelu_tanh_chain":  # 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
        cube = emit(op.multiply(emit(op.power(x, k(3.0))), k(0.044715)))
        inner = emit(op.multiply(emit(op.add(x, cube)), k((2 / np.pi) ** 0.5)))
        one_plus = emit(op.add(emit(op.tanh(inner)), k(1.0)))
        return emit(op.multiply(emit(op.multiply(k(0.5), x)), one_plus))
    raise ValueError(f"unknown activation {fn!r}")


# ---------------------------------------------------------------------------- inputs, reference
SPECIAL = (np.nan, np.inf, -np.inf)  # the values a recipe with "special" puts in its inputs


def inputs(recipe: Recipe, seed: int = 0) -> list[np.ndarray]:
    """The recipe's inputs: standard normal floats; integer ids at and just inside both ends
    of their table ([0, high)) first, then drawn within it. A recipe with ``"special": true``
    (``fuzz.py --special``) has one to three of its float values NaN, +inf or -inf, drawn:
    they must come out where the reference puts them."""
    rng = np.random.default_rng([int(recipe["seed"]) & 0xFFFFFFFF, 1 << 20, seed])
    out = []
    for spec in recipe["inputs"]:
        shape = tuple(spec["shape"])
        if spec["dtype"] == "float32":
            values = rng.standard_normal(shape).astype("float32")
            if recipe.get("special") and values.size:
                count = int(rng.integers(1, min(3, values.size) + 1))
                where = rng.choice(values.size, count, replace=False)
                values.reshape(-1)[where] = rng.choice(SPECIAL, count)
            out.append(values)
            continue
        high = int(spec["high"])
        ids = rng.integers(0, high, shape).reshape(-1)
        edges = [0, high - 1, min(1, high - 1), max(high - 2, 0)]
        ids[:min(len(edges), ids.size)] = edges[:ids.size]
        out.append(ids.reshape(shape).astype(spec["dtype"]))
    return out


def out_of_range(recipe: Recipe, arrays: Sequence[np.ndarray]) -> list[list[np.ndarray]]:
    """Inputs with one id just past each end of its table (``high`` and -1): each must be
    refused with an `InputError`, never read."""
    cases = []
    for k, spec in enumerate(recipe["inputs"]):
        if spec["dtype"] == "float32":
            continue
        for bad in (int(spec["high"]), -1):
            changed = [a.copy() for a in arrays]
            changed[k].reshape(-1)[-1] = bad
            cases.append(changed)
    return cases


def opaque_reference(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    """numpy references of the Relax operators a recipe leaves opaque (by the call's operator
    and attributes, as the importer kept them)."""
    op, attrs = node.attrs["op"], node.payload["attrs"] if node.payload else None
    if op == "relax.take":
        axis = None if attrs.axis is None else int(attrs.axis)
        return [np.take(args[0], args[1], axis=axis)]
    if op in ("relax.mean", "relax.sum", "relax.max"):
        axes = None if attrs.axis is None else tuple(int(v) for v in attrs.axis)
        fn = {"relax.mean": np.mean, "relax.sum": np.sum, "relax.max": np.max}[op]
        return [fn(args[0], axis=axes, keepdims=bool(attrs.keepdims)).astype(args[0].dtype)]
    if op == "relax.erf":
        return [erf(args[0]).astype(args[0].dtype)]
    if op == "relax.power":
        return [np.power(args[0], args[1]).astype(args[0].dtype)]
    if op == "relax.nn.gelu_tanh":
        x = args[0].astype(np.float64)
        y = 0.5 * x * (1 + np.tanh((2 / np.pi) ** 0.5 * (x + 0.044715 * x ** 3)))
        return [y.astype(args[0].dtype)]
    raise NotImplementedError(f"no fuzzer reference for {op}")


def reference(graph: Graph, arrays: Sequence[np.ndarray],
              nudge: int | None = None) -> list[np.ndarray]:
    """What the imported graph computes on ``arrays``, by the numpy references alone; with
    ``nudge`` (a seed), in float64, every floating value (inputs, weights, each operator's
    outputs) multiplied by 1 + u 2^-24 as it is made, u uniform in [-1, 1] (a float32
    rounding): how far that moves an output is how much it amplifies rounding
    (`fuzz_run.Expected`)."""
    if nudge is None:
        return run_graph(graph, arrays, opaque=opaque_reference)
    rng = np.random.default_rng(nudge)

    def leaf(v: np.ndarray) -> np.ndarray:
        if v.dtype.kind != "f":
            return v
        return v.astype(np.float64) * (1 + rng.uniform(-1, 1, v.shape) * 2.0 ** -24)
    return run_graph(graph, arrays, opaque=opaque_reference, each=leaf)


def imported(recipe: Recipe) -> tuple[tvm.IRModule, Graph]:
    """The recipe's Relax module and the operator graph imported from it."""
    mod = module(recipe)
    return mod, from_relax(mod)


def describe(recipe: Recipe) -> str:
    """One line per step: what the graph is, for a report or a failure's message."""
    lines = [f"inputs {[(s['dtype'], s['shape']) for s in recipe['inputs']]}"
             + (" holding NaN or infinities" if recipe.get("special") else "")]
    n = len(recipe["inputs"])
    for i, s in enumerate(recipe["steps"]):
        lines.append(f"v{n + i} = {s['op']}({', '.join(f'v{a}' for a in s['args'])}; "
                     f"{s['attrs']}) -> {s['shape']}")
    lines.append(f"outputs {[f'v{o}' for o in recipe['outputs']]}")
    return "\n".join(lines)
