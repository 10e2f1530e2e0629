"""A memory plan that is safe under concurrency.

TVM's StaticPlanBlockMemory reuses a buffer as soon as its last reader is done in the *sequential*
order; with several streams that is a race. Here a storage block is reused for a new tensor only
when every kernel that touches the block's current tensor (its producer and all readers, through
views too) happens-before the new tensor's producer in the schedule's partial order (stream
order, waits and stage barriers). Graph outputs get blocks of their own that are never reused.
A convolution that adds a residual (`in_place_operands`) writes over the residual's block where
it is that block's last user: oneDNN adds into its output, which otherwise starts as a copy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import tvm
import tvm_ffi

from paragraph.errors import ModelTooLargeError
from paragraph.graph import Graph, TensorRef
from paragraph.machine import total_memory
from paragraph.schedule import Schedule, ScheduleError
from paragraph.tvm_interop.runtime.library.names import VendorOp, is_vendor_name


def nbytes(graph: Graph, ref: TensorRef) -> int:
    """Size in bytes of one tensor."""
    t = graph.type_of(ref)
    return t.numel * tvm_ffi.dtype(t.dtype).itemsize


@dataclass
class Block:
    """One storage allocation; ``users`` are the kernels that touch any tensor it held."""

    size: int
    dedicated: bool = False
    users: set[int] = field(default_factory=set)
    tensors: list[TensorRef] = field(default_factory=list)


@dataclass
class MemoryPlan:
    """Which block holds each kernel output (views alias their source's block)."""

    blocks: list[Block]
    block_of: dict[TensorRef, int]  # kernel outputs and views -> block index
    no_reuse_bytes: int

    def __post_init__(self) -> None:
        # a plan may come from a file (an artifact): an index out of range or a negative size
        # would place a tensor outside every buffer
        for i, block in enumerate(self.blocks):
            size: object = block.size
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise ScheduleError(f"memory plan block {i} has size {size!r}, not a "
                                    "non-negative integer")
        for ref, index in self.block_of.items():
            b: object = index
            if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < len(self.blocks):
                raise ScheduleError(f"the memory plan puts {ref} in block {b!r}; it has "
                                    f"{len(self.blocks)} blocks (0 to {len(self.blocks) - 1})")

    @property
    def peak_bytes(self) -> int:
        return sum(b.size for b in self.blocks)

    def summary(self) -> str:
        saved = 1 - self.peak_bytes / self.no_reuse_bytes if self.no_reuse_bytes else 0.0
        return (f"{len(self.blocks)} blocks, {self.peak_bytes / 2**20:.2f} MiB "
                f"(no reuse {self.no_reuse_bytes / 2**20:.2f} MiB, saves {saved:.0%})")


def _storage_roots(graph: Graph) -> dict[TensorRef, TensorRef]:
    """Every kernel/view tensor -> the tensor that owns its bytes (views follow their input)."""
    root: dict[TensorRef, TensorRef] = {}
    for n in graph.nodes:
        if n.kind == "view":
            src = n.inputs[0]
            root[n.out] = root.get(src, src)
        elif not n.is_source:
            for i in range(len(n.outputs)):
                root[TensorRef(n.id, i)] = TensorRef(n.id, i)
    return root


def in_place_operands(graph: Graph) -> dict[int, TensorRef]:
    """Kernel -> the input its output may be written over: each NHWC vendor convolution's
    residual (its last input), which the kernel adds into its output (C++ and Python forms
    both skip the copy that starts the output as the residual when the two are one buffer).
    In ResNet-50 that is 16 copies of up to 3 MB a run. A residual that the kernel also reads
    as another operand is left out."""
    found: dict[int, TensorRef] = {}
    for n in graph.nodes:
        name = n.attrs.get("func", "") if n.kind == "kernel" else ""
        if not (n.attrs.get("source") == "vendor" and is_vendor_name(name)):
            continue
        op = VendorOp.from_name(name)
        if op.kind == "conv2d" and op.residual and op.layout == "NHWC" \
                and n.inputs[-1] not in n.inputs[:-1] and len(n.outputs) == 1 \
                and graph.type_of(n.inputs[-1]) == n.outputs[0]:
            found[n.id] = n.inputs[-1]
    return found


def plan_memory(graph: Graph, schedule: Schedule) -> MemoryPlan:
    """Greedy best-fit assignment of kernel outputs to blocks, reusing a block only when all
    its users happen-before the new producer, or written in place over an operand of
    `in_place_operands` whose block's other users all happen-before (see the module
    docstring)."""
    in_place = in_place_operands(graph)
    before = schedule.happens_before()
    index = {k: i for i, k in enumerate(schedule.kernels)}
    root = _storage_roots(graph)
    touches: dict[TensorRef, set[int]] = {}  # owned tensor -> kernels touching its bytes
    for n in graph.nodes:
        if n.is_source:
            continue
        for r in n.inputs:
            if r in root:
                touches.setdefault(root[r], set()).add(n.id)
        if n.kind != "view":
            for i in range(len(n.outputs)):
                touches.setdefault(TensorRef(n.id, i), set()).add(n.id)
    pinned = {root[r] for r in graph.outputs if r in root}
    blocks: list[Block] = []
    block_of: dict[TensorRef, int] = {}
    order = schedule.launch_order or tuple(schedule.kernels)
    total = 0
    for k in order:
        node = graph[k]
        if node.kind == "view":
            continue
        for i in range(len(node.outputs)):
            ref = TensorRef(k, i)
            size = nbytes(graph, ref)
            total += size
            operand = in_place.get(k)  # written over where it owns its block (not a view)
            over = block_of.get(operand) if operand is not None and root.get(operand) == operand \
                else None
            if ref in pinned:
                chosen = _new_block(blocks, size, dedicated=True)
            elif over is not None and not blocks[over].dedicated \
                    and blocks[over].size >= size and all(
                        u == k or before[k] >> index[u] & 1 for u in blocks[over].users):
                chosen = over
            else:
                free = [b for b, blk in enumerate(blocks) if not blk.dedicated and all(
                    before[k] >> index[u] & 1 for u in blk.users)]
                fits = [b for b in free if blocks[b].size >= size]
                if fits:
                    chosen = min(fits, key=lambda b: blocks[b].size)
                elif free:
                    chosen = max(free, key=lambda b: blocks[b].size)
                    blocks[chosen].size = size  # grow: sizes are final only after planning
                else:
                    chosen = _new_block(blocks, size)
            blocks[chosen].users |= touches.get(ref, {k})
            blocks[chosen].tensors.append(ref)
            block_of[ref] = chosen
    for ref, owner in root.items():
        if ref != owner and owner in block_of:  # views of graph inputs have no block
            block_of[ref] = block_of[owner]
    return MemoryPlan(blocks, block_of, total)


def no_reuse_plan(graph: Graph) -> MemoryPlan:
    """Every kernel output in a block of its own (for measuring kernels in any combination)."""
    root = _storage_roots(graph)
    owners = [r for r, o in root.items() if r == o]
    block_of = {r: i for i, r in enumerate(owners)}
    for ref, owner in root.items():
        if owner in block_of:
            block_of[ref] = block_of[owner]
    blocks = [Block(nbytes(graph, r), tensors=[r]) for r in owners]
    return MemoryPlan(blocks, block_of, sum(b.size for b in blocks))


def _new_block(blocks: list[Block], size: int, dedicated: bool = False) -> int:
    blocks.append(Block(size, dedicated))
    return len(blocks) - 1


def check_memory_plan(graph: Graph, schedule: Schedule, plan: MemoryPlan) -> None:
    """Raise `ScheduleError` if the plan does not fit ``graph``: a tensor the graph lacks, one
    larger than its block, a block larger than every tensor it holds (or holding none), a view
    outside its source (`check_views`), or two tensors that may be live at once in one block.

    Independent of `plan_memory`: for every pair of tensors in one block, all kernels touching
    the earlier must happen-before the producer of the later (in one direction or the other),
    but the producer itself where it writes over the earlier in place (`in_place_operands`).
    """
    in_place = in_place_operands(graph)
    before = schedule.happens_before()
    index = {k: i for i, k in enumerate(schedule.kernels)}
    root = _storage_roots(graph)
    check_views(graph)
    for ref, b in plan.block_of.items():
        if ref not in root:
            raise ScheduleError(f"the memory plan places {ref} (in block {b}), which is not a "
                                "kernel output or a view of the program")
        if root[ref] != ref and plan.block_of.get(root[ref], b) != b:
            raise ScheduleError(f"the memory plan puts the view {ref} in block {b}, its "
                                f"source {root[ref]} in block {plan.block_of[root[ref]]}")
    touches: dict[TensorRef, set[int]] = {}
    for n in graph.nodes:
        for r in n.inputs:
            if r in root:
                touches.setdefault(root[r], set()).add(n.id)
    owned: dict[int, list[TensorRef]] = {}
    for ref, b in plan.block_of.items():
        if root[ref] == ref:
            owned.setdefault(b, []).append(ref)
            touches.setdefault(ref, set()).add(ref.node)
    for b, refs in owned.items():
        for i, x in enumerate(refs):
            for y in refs[i + 1:]:
                if not (_all_before(touches[x] - _writer(y, x, in_place), y.node, before, index)
                        or _all_before(touches[y] - _writer(x, y, in_place), x.node, before,
                                       index)):
                    raise ScheduleError(f"tensors {x} and {y} share block {b} but may be live "
                                        "at the same time")
        need = max(nbytes(graph, r) for r in refs)
        if plan.blocks[b].size < need:
            raise ScheduleError(f"block {b} holds {need} bytes in {plan.blocks[b].size}")
        if plan.blocks[b].size > need:  # plan_memory sizes a block to its largest tensor
            raise ScheduleError(f"block {b} is {plan.blocks[b].size} bytes, larger than the "
                                f"{need} its tensors need")
    for b, block in enumerate(plan.blocks):
        if b not in owned:
            raise ScheduleError(f"block {b} ({block.size} bytes) holds no tensor")


def check_views(graph: Graph) -> None:
    """Raise `ScheduleError` unless every view (a reshape, or a slice at a byte offset) lies
    inside the tensor it views: a non-negative offset, and offset plus size within it."""
    for n in graph.nodes:
        if n.kind != "view":
            continue
        offset = n.attrs.get("offset", 0)
        size, within = nbytes(graph, n.out), nbytes(graph, n.inputs[0])
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0 \
                or offset + size > within:
            raise ScheduleError(f"view {n.id} ({n.name or 'unnamed'}) reads {size} bytes at "
                                f"offset {offset!r} of {n.inputs[0]}, which has {within}")


def memory_needed(graph: Graph, plan: MemoryPlan) -> int:
    """Bytes a run of ``graph`` under ``plan`` allocates on its device: the plan's blocks,
    the inputs and the weights and constants."""
    return plan.peak_bytes + sum(nbytes(graph, n.out) for n in graph.nodes if n.is_source)


def check_fits(graph: Graph, plan: MemoryPlan, device: tvm.runtime.Device) -> None:
    """Raise `ModelTooLargeError` when a run needs more memory (`memory_needed`) than
    ``device`` has in all (a GPU's global memory, `total_memory` on a CPU), before anything
    is allocated: a clear error instead of an allocation failure or the kernel's OOM killer."""
    need = memory_needed(graph, plan)
    if device.dlpack_device_type() == tvm.cpu().dlpack_device_type():
        have, where = total_memory(), "this machine's memory"
    else:
        have, where = int(device.total_global_memory or 0) or None, f"{device}'s memory"
    if have is not None and need > have:
        raise ModelTooLargeError(f"the program needs {need / 2**30:.1f} GiB (its memory plan's "
                                 f"{len(plan.blocks)} blocks {plan.peak_bytes / 2**30:.1f} GiB, "
                                 f"its inputs and weights {(need - plan.peak_bytes) / 2**30:.1f}"
                                 f" GiB); {where} is {have / 2**30:.1f} GiB")


def _writer(ref: TensorRef, over: TensorRef, in_place: dict[int, TensorRef]) -> set[int]:
    """{the producer of ``ref``} if it writes ``ref`` over ``over`` in place, else {}."""
    return {ref.node} if in_place.get(ref.node) == over else set()


def _all_before(users: Iterable[int], k: int, before: dict[int, int],
                index: dict[int, int]) -> bool:
    return all(u != k and before[k] >> index[u] & 1 for u in users)


def vm_planned_bytes(lowered: tvm.IRModule) -> int:
    """Bytes the TVM VM allocates for ``main`` after StaticPlanBlockMemory (planned storage plus
    the output tensors it allocates separately): the baseline the memory plan is compared to."""
    # the compiler's Python API: absent from a runtime-only TVM (`paragraph.lean`)
    from tvm import relax

    seq = tvm.transform.Sequential([
        relax.transform.RewriteDataflowReshape(), relax.transform.ToNonDataflow(),
        relax.transform.RemovePurityChecking(), relax.transform.CallTIRRewrite(),
        relax.transform.StaticPlanBlockMemory()])
    planned = seq(lowered)
    total = 0
    for block in planned["main"].body.blocks:
        for binding in block.bindings:
            call = binding.value
            if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
                continue
            if call.op.name == "relax.memory.alloc_storage":
                total += int(call.args[0].values[0])
            elif call.op.name == "relax.builtin.alloc_tensor":
                shape = [int(d) for d in call.args[0].values]
                dtype = tvm_ffi.dtype(str(call.args[1].value))
                total += int(dtype.itemsize) * math.prod(shape)
    return total
