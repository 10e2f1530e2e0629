"""IOS operator merge: convolution kernels that share one input become one wider convolution.

IOS section 3.2 (and `check_merge` in its repository): convolutions that read the same tensor
with the same stride and output size, no groups, and the same activation are replaced by one
convolution whose kernels are zero-padded (centred) to the largest size and stacked along the
output channels; each original output is a channel slice of the merged one. Here a unit is a
fused kernel: one conv2d followed by a chain of element-wise operators (bias, the decomposed
batch norm, the activation). Kernels merge when their chains have the same operators; the
chains' per-channel constants are concatenated like the weights, so the merged kernel computes
every member's whole kernel. Weights are prepared at build time (numpy); at batch 1 the slices
are free views (`kernels._slices_as_views`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from paragraph import ops as opspec
from paragraph.graph import Graph, Node, TensorRef, TensorType

UNARY = ("relu", "sigmoid", "tanh", "gelu", "silu")
BINARY = ("add", "subtract", "multiply", "divide")


@dataclass(frozen=True)
class ConvUnit:
    """A kernel that is one conv2d plus an element-wise chain, as the merge needs it."""

    kernel: int
    conv: int  # operator id of the conv2d
    chain: tuple[int, ...]  # the element-wise operators after it, in order
    data: TensorRef  # the conv's input (an operator-graph tensor)
    key: tuple  # what must be equal for kernels to merge

    @property
    def last(self) -> int:
        return self.chain[-1] if self.chain else self.conv


def conv_unit(ops: Graph, kernel: int, members: Sequence[int]) -> ConvUnit | None:
    """The kernel as a `ConvUnit`, or None if it is not a mergeable convolution kernel."""
    convs = [i for i in members if ops[i].kind == "conv2d"]
    if len(convs) != 1:
        return None
    conv = ops[convs[0]]
    a = conv.attrs
    if a["groups"] != 1 or a["dilation"] != (1, 1) or ops[conv.inputs[1].node].kind != "weight":
        return None
    inside = set(members)
    chain, value, signature = [], conv.id, []
    while len(chain) + 1 < len(members):
        users = [u for u in ops.users(value) if u in inside]
        if len(users) != 1 or len(ops.users(value)) != 1 or TensorRef(value) in ops.outputs:
            return None  # an intermediate read outside the kernel must stay
        node = ops[users[0]]
        step = _chain_step(ops, node, value, conv.type.shape[1])
        if step is None:
            return None
        signature.append(step)
        chain.append(node.id)
        value = node.id
    if len(chain) + 1 != len(members):
        return None
    _, _, kh, kw = ops.type_of(conv.inputs[1]).shape
    pt, pl, pb, pr = a["padding"]
    if (pt - pb) or (pl - pr):
        return None  # centred enlarging needs symmetric padding
    # equal "padding minus half the kernel" keeps the output aligned when kernels grow
    key = (conv.inputs[0], a["strides"], conv.type.shape[2:], conv.type.dtype,
           pt - (kh - 1) / 2, pl - (kw - 1) / 2, tuple(signature))
    return ConvUnit(kernel, conv.id, tuple(chain), conv.inputs[0], key)


def _chain_step(ops: Graph, node: Node, value: int, channels: int) -> tuple | None:
    """A chain operator's signature: its kind and, for a binary one, where the per-channel
    constant sits; None if it does not fit the merge."""
    if node.kind in UNARY:
        return (node.kind,)
    if node.kind not in BINARY or len(node.inputs) != 2:
        return None
    pos = 0 if node.inputs[1].node == value else 1
    const = ops[node.inputs[pos].node]
    if node.inputs[1 - pos].node != value or const.kind not in ("weight", "constant"):
        return None
    if _per_channel(const.value, channels) is None:
        return None
    return (node.kind, pos)


def _per_channel(value: np.ndarray, channels: int) -> np.ndarray | None:
    """``value`` as a (1, C, 1, 1) array if it broadcasts per channel over NCHW, else None."""
    v = np.asarray(value)
    if v.size == 1:
        return np.full((1, channels, 1, 1), v.reshape(()), v.dtype)
    shape = (1,) * (4 - v.ndim) + v.shape
    if len(shape) != 4 or shape[0] != 1 or shape[2:] != (1, 1) or shape[1] != channels:
        return None
    return v.reshape(1, channels, 1, 1)


def can_merge(units: Sequence[ConvUnit | None]) -> bool:
    """IOS's check: at least two convolution kernels with one key (same input, stride, output
    size, aligned padding, and the same element-wise chain)."""
    return len(units) >= 2 and all(u is not None for u in units) and len(
        {u.key for u in units}) == 1


def merge_rewrite(ops: Graph, units: Sequence[ConvUnit]) -> tuple[list[int], list[Node],
                                                                 dict[TensorRef, TensorRef]]:
    """The rewrite that merges ``units``: (removed ids, added nodes, remap) for
    `Graph.replace_subgraph`. Added nodes: one conv2d on the concatenated, centred-padded
    weights, the chain on concatenated constants, and one channel slice per unit."""
    convs = [ops[u.conv] for u in units]
    weights = [ops[c.inputs[1].node].value for c in convs]
    kh = max(w.shape[2] for w in weights)
    kw = max(w.shape[3] for w in weights)
    merged_w = np.concatenate([_enlarge(w, kh, kw) for w in weights], axis=0)
    channels = [w.shape[0] for w in weights]
    first = convs[0]
    pad_h = int(first.attrs["padding"][0] + (kh - weights[0].shape[2]) // 2)
    pad_w = int(first.attrs["padding"][1] + (kw - weights[0].shape[3]) // 2)
    next_id = ops.next_id
    added: list[Node] = []

    def add(kind, inputs, attrs=None, value=None) -> TensorRef:
        nonlocal next_id
        if kind in ("weight", "constant"):
            node = Node(id=next_id, kind=kind, outputs=(TensorType(value.shape,
                                                                   str(value.dtype)),),
                        value=value, name=f"merged{next_id}")
        else:
            attrs = opspec.canonical(kind, attrs or {})
            types = [ops.type_of(r) if r.node in ops else _type(added, r) for r in inputs]
            node = Node(id=next_id, kind=kind, inputs=tuple(inputs),
                        outputs=tuple(opspec.infer(kind, types, attrs)), attrs=attrs,
                        name=f"merged{next_id}")
        added.append(node)
        next_id += 1
        return node.out

    value = add("conv2d", [units[0].data, add("weight", [], value=merged_w)],
                {**dict(first.attrs), "padding": (pad_h, pad_w, pad_h, pad_w)})
    for step in range(len(units[0].chain)):
        nodes = [ops[u.chain[step]] for u in units]
        if nodes[0].kind in UNARY:
            value = add(nodes[0].kind, [value])
            continue
        parts, pos = [], 1
        for n, c in zip(nodes, channels):
            pos = 0 if ops[n.inputs[0].node].kind in ("weight", "constant") else 1
            parts.append(_per_channel(ops[n.inputs[pos].node].value, c))
        const = add("weight", [], value=np.ascontiguousarray(np.concatenate(parts, axis=1)))
        value = add(nodes[0].kind, [const, value] if pos == 0 else [value, const])
    remap: dict[TensorRef, TensorRef] = {}
    offset = 0
    for u, c in zip(units, channels):
        remap[TensorRef(u.last)] = add("strided_slice", [value], {
            "axes": (1,), "begin": (offset,), "end": (offset + c,)})
        offset += c
    removed = [i for u in units for i in (u.conv, *u.chain)]
    return removed, added, remap


def _type(added: Sequence[Node], ref: TensorRef) -> TensorType:
    return next(n for n in added if n.id == ref.node).outputs[ref.index]


def _enlarge(w: np.ndarray, kh: int, kw: int) -> np.ndarray:
    """Zero-pad an OIHW kernel to kh x kw, centred (TASO's enlarge)."""
    dh, dw = (kh - w.shape[2]) // 2, (kw - w.shape[3]) // 2
    return np.pad(w, ((0, 0), (0, 0), (dh, kh - w.shape[2] - dh), (dw, kw - w.shape[3] - dw)))


def apply_merges(ops: Graph, merges: Sequence[Sequence[ConvUnit]]
                 ) -> tuple[Graph, list[list[int]]]:
    """``ops`` with every group of ``merges`` merged (see `merge_rewrite`), and the ids of the
    operators each merge added."""
    added_ids = []
    renamed: dict[TensorRef, TensorRef] = {}  # outputs an earlier merge replaced by slices
    for units in merges:
        units = [replace(u, data=renamed.get(u.data, u.data)) for u in units]
        removed, added, remap = merge_rewrite(ops, units)
        ops = ops.replace_subgraph(removed, added, remap).without_dead_nodes()
        renamed.update(remap)
        added_ids.append([n.id for n in added if not n.is_source])
    ops.validate()
    return ops, added_ids


def relabel(unit: ConvUnit, ids: dict[int, int]) -> ConvUnit:
    """``unit`` with its operator ids mapped through ``ids`` (into a copy of its graph)."""
    return replace(unit, conv=ids[unit.conv], chain=tuple(ids[i] for i in unit.chain),
                   data=TensorRef(ids[unit.data.node], unit.data.index))
