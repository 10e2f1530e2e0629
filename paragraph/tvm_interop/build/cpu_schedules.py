"""Default schedules for TVM's own CPU kernels that no tuning database covers.

LegalizeOps' pooling kernels run a padded copy, a sum (or max) and a division as three loop
nests over workspace buffers, with the 3x3 window innermost: inside a model, where those
buffers are cold, Inception-v3's average pools took 150-260 us each and all its TVM kernels
2.3 ms on one thread, where ONNX Runtime's pools take 0.85 ms (`benchmarks/kernel_classes.py`).
`Pool` fuses the nests into one pass over the output and puts the channels innermost (NHWC),
vectorised: an average pool of 192 channels at 35x35 runs in 56 us instead of 102 alone.
Kernels stay on one thread, as all TVM CPU kernels here: the executor gives the cores to its
streams. Applied with dlight's `ApplyDefaultSchedule`, which skips functions a tuning database
scheduled already; a function the rule does not recognise is left as it is.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl

from paragraph.errors import reraise_interrupt

LANES = (16, 8, 4, 2)  # float32 lanes of an AVX-512 register, or fewer where C does not divide


def _lanes(channels: int) -> int:
    return next((n for n in LANES if channels % n == 0), 1)


# what a schedule primitive raises when it refuses a kernel
REFUSED = (RuntimeError, ValueError, IndexError, TypeError, AttributeError)


def attempt(label: str, schedule: Callable[..., s_tir.Schedule | None], *args: object,
            refused: tuple[type[Exception], ...] = REFUSED) -> s_tir.Schedule | None:
    """``schedule(*args)``, or None where it raises one of ``refused`` (a kernel of another
    form than the rule expects: the next rule, or TVM's default, takes it). The primitives
    check their own legality, so a schedule that does come back computes what the function
    computes. ``PARAGRAPH_DEBUG_SCHEDULES=1`` prints ``label`` and the refusal."""
    try:
        return schedule(*args)
    except refused as exc:
        # a Ctrl+C that landed in TVM's C++ comes out as an empty RuntimeError: not a refusal
        # (swallowed, the build went on and `paragraph run --search` exited 0)
        reraise_interrupt(exc)
        if os.environ.get("PARAGRAPH_DEBUG_SCHEDULES"):
            print(f"{label} left a kernel as it is: "
                  f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        return None


# the most nodes a scheduled kernel's expression may have with its let-bound values written out
# at each use (what TVM's simplifier does): past it a rule leaves the kernel unscheduled. The
# fast sigmoid and tanh (`lowering.EXTRA_LEGALIZE`) read their argument ~60 times through
# lets; inlined into each other, a chain of five took 20 s to compile, six never finished
EXPANDED_LIMIT = 20_000
# the fields of TIR expressions that hold sub-expressions: those of a value (`VALUE_FIELDS`:
# what it computes) and those of an address (a load's indices, a ramp's base and stride)
VALUE_FIELDS = ("a", "b", "condition", "true_value", "false_value", "value", "body", "args")
EXPR_FIELDS = (*VALUE_FIELDS, "indices", "base", "stride")


def sub_exprs(e: object, fields: tuple[str, ...] = EXPR_FIELDS) -> Iterator[object]:
    """The sub-expressions of TIR expression ``e`` held in ``fields`` (arrays flattened; no
    TIR expression-visitor is exposed to Python here)."""
    for name in fields:
        child = getattr(e, name, None)
        if isinstance(child, (list, tvm.ir.Array)):
            yield from child
        elif child is not None:
            yield child


def _expanded_size(expr: tirx.Expr, limit: int = EXPANDED_LIMIT) -> int:
    """The size of ``expr`` with every let-bound value written out at each use (counted, not
    built; at most about ``limit``)."""
    bound: dict[int, int] = {}  # let variable -> its value's expanded size
    seen: dict[int, int] = {}

    def size(e: object) -> int:
        if not isinstance(e, tirx.Expr):
            return 0
        key = e.__chandle__()
        if key in seen:
            return seen[key]
        if isinstance(e, tirx.Let):
            bound[e.var.__chandle__()] = size(e.value)
            n = size(e.body)
        elif isinstance(e, tirx.Var):
            n = bound.get(key, 1)
        else:
            n = 1
            for c in sub_exprs(e):
                n += size(c)
                if n > limit:
                    break
        seen[key] = n = min(n, limit + 1)
        return n

    return size(expr)


def _too_large(sch: s_tir.Schedule, block: s_tir.SBlockRV) -> bool:
    """Whether ``block``'s value, its producers inlined, is past `EXPANDED_LIMIT`, or holds a
    let and an ``if_then_else`` (see `_let_and_branch`): not to be vectorised."""
    body = sch.get(block).body
    return isinstance(body, tirx.BufferStore) and (
        _expanded_size(body.value) > EXPANDED_LIMIT or _let_and_branch(body.value))


def _let_and_branch(expr: tirx.Expr) -> bool:
    """Whether ``expr`` holds both a let (the fast sigmoid's and tanh's) and an
    ``if_then_else`` (a concatenation's choice of input). Vectorised, an ``if_then_else``
    whose condition differs between lanes makes TVM's vectorizer start over on scalar lanes,
    and it then meets each let again with another value: "Let cannot bind the same var to two
    different values", an InternalError at compile (a tensor concatenated with itself, sliced
    and gated by a sigmoid: fuzz seed 9115)."""
    found: set[str] = set()
    seen: set[int] = set()

    def walk(e: object) -> None:
        if not isinstance(e, tirx.Expr) or e.__chandle__() in seen or len(found) == 2:
            return
        seen.add(e.__chandle__())
        if isinstance(e, tirx.Let):
            found.add("let")
        elif isinstance(e, tvm.ir.expr.Call) and str(getattr(e.op, "name", "")).endswith(
                "if_then_else"):  # prim.if_then_else here
            found.add("if")
        for c in sub_exprs(e):
            walk(c)

    walk(expr)
    return len(found) == 2


def _dom_kind(block: tirx.SBlock) -> str:
    return "".join("R" if iv.iter_type == tirx.IterVar.CommReduce else "S"
                   for iv in block.iter_vars)


class _Rule(dl.cpu.base.CPUScheduleRule):
    """A CPU rule whose ``_schedule`` returns a schedule, or None to leave the function."""

    def apply(self, func: tirx.PrimFunc, target: tvm.target.Target, _: bool):
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        return attempt(f"cpu_schedules: {type(self).__name__}", self._schedule, func)

    @staticmethod
    def _schedule(func: tirx.PrimFunc) -> s_tir.Schedule | None:
        raise NotImplementedError


class Pool(_Rule):
    """Pooling in NHWC (max, average, global average; padded or not, with any element-wise
    epilogue FuseOps put after it): padding and division inlined, the window's sum computed per
    output pixel and channel block, channels innermost and vectorised."""

    @staticmethod
    def _schedule(func: tirx.PrimFunc):
        sch = s_tir.Schedule(func)
        root = sch.get_sblock("root")
        blocks = sch.get_child_blocks(root)
        kinds = [_dom_kind(sch.get(b)) for b in blocks]
        reductions = [i for i, k in enumerate(kinds) if "R" in k]
        if len(reductions) != 1 or kinds[reductions[0]] != "SSSSRR":
            return None
        red = blocks[reductions[0]]
        rules = {str(sch.get(b).annotations.get("schedule_rule")) for b in blocks}
        if not rules & {"meta_schedule.pool_max", "meta_schedule.pool_avg",
                        "meta_schedule.adaptive_pool_avg", "meta_schedule.adaptive_pool_max"}:
            return None
        if any(k != "SSSS" for i, k in enumerate(kinds) if i != reductions[0]):
            return None
        # everything but the reduction and the last block inlined: padding into the window's
        # reads, the division (and any epilogue but the last) into its consumer
        last = blocks[-1]
        for b in blocks[:-1]:
            if b != red:
                sch.compute_inline(b)
        channels = int(sch.get(sch.get_loops(red)[3]).extent)
        lanes = _lanes(channels)
        if sch.get(last).same_as(sch.get(red)):  # max pool without an epilogue
            c = sch.get_loops(red)[3]
            _, ci = sch.split(c, [None, lanes])
            if lanes > 1:  # the window's loops inside: one vector of channels per pixel
                sch.vectorize(ci)
            return sch
        n, h, w, c = sch.get_loops(last)
        if int(sch.get(c).extent) != channels:
            return None
        co, ci = sch.split(c, [None, lanes])
        sch.compute_at(red, co, preserve_unit_loops=True)
        if lanes > 1:
            sch.vectorize(sch.get_loops(red)[-3])  # the channels, the window's loops inside
            sch.vectorize(ci)
        return sch


class Injective(_Rule):
    """Data movement (reshapes, transposes, their fusions; BERT's attention heads): the loop
    nests inlined into the last one, which either copies rows (the output's innermost axis is
    the input's: vectorised along it) or transposes (tiled 16x16 so that each tile's reads and
    writes stay in a few cache lines, vectorised along the output's rows). BERT's key
    transpose (64x1024 into 16x64x64, transposed) took 190 us in the model, 49 scheduled."""

    @staticmethod
    def _schedule(func: tirx.PrimFunc):
        sch = s_tir.Schedule(func)
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
        if len(blocks) < 2:  # one loop nest: LLVM vectorises a plain one already
            return None
        if any("R" in _dom_kind(sch.get(b)) for b in blocks):
            return None
        for b in blocks[:-1]:
            sch.compute_inline(b)
        last = blocks[-1]
        if _too_large(sch, last):
            return None
        block = sch.get(last)
        loops = sch.get_loops(last)
        if len(loops) < 2 or len(block.reads) != 1 or len(block.iter_vars) != len(loops):
            return None
        extents = [int(sch.get(loop).extent) for loop in loops]
        inner = _lanes(extents[-1])
        if inner == 1:
            return None
        # which output axes the read's innermost index moves with
        index = block.reads[0].region[-1].min
        used: set[int] = set()
        for v in tirx.analysis.undefined_vars(index, []):
            for i, iv in enumerate(block.iter_vars):
                if iv.var.same_as(v):
                    used.add(i)
        last_axis = len(loops) - 1
        if last_axis in used or not used:  # rows copied: vectorise along them
            _, ci = sch.split(loops[-1], [None, inner])
            sch.vectorize(ci)
            return sch
        across = max(used)  # the output axis that walks the input's rows
        tile = _lanes(extents[across])
        if tile == 1:
            return None
        ao, ai = sch.split(loops[across], [None, tile])
        bo, bi = sch.split(loops[-1], [None, inner])
        sch.reorder(ao, bo, ai, bi)
        sch.vectorize(bi)
        return sch


def _elementwise(block: tirx.SBlock) -> bool:
    """Whether every read of ``block`` is at the output's position, broadcast NumPy's way
    (axes aligned from the right, where each either follows the block's axis or is 0), or
    shifted by a constant along an axis (a slice: an LSTM step's gates, read at
    ``j + k * hidden`` of the one product): not a transpose or a reshape, which `Injective`
    takes."""
    axes = [iv.var for iv in block.iter_vars]
    for read in block.reads:
        offset = len(axes) - len(read.region)
        if offset < 0:
            return False
        for d, r in enumerate(read.region):
            lo = r.min
            if isinstance(lo, tirx.IntImm) and int(lo) == 0 and int(r.extent) == 1:
                continue
            if isinstance(lo, tirx.Add) and isinstance(lo.b, tirx.IntImm):
                lo = lo.a  # x[j + c]: the same walk, shifted
            if not (isinstance(lo, tirx.Var) and lo.same_as(axes[d + offset])):
                return False
    return True


class Elementwise(_Rule):
    """Element-wise chains over several inputs (a batch norm left after a concatenation, with
    its relu: DenseNet-121's 58, MixNet's): every loop nest inlined into the last, whose
    outer axes are fused and innermost one vectorised. Left to TVM's default they ran as one
    loop nest per operator with a full-size buffer between each, and LLVM's JIT spent up to 3
    s on each (76 s of DenseNet-121's 100 s build)."""

    @staticmethod
    def _schedule(func: tirx.PrimFunc):
        sch = s_tir.Schedule(func)
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
        if any(_dom_kind(sch.get(b)) != "S" * len(sch.get(b).iter_vars) for b in blocks):
            return None
        for b in blocks[:-1]:
            sch.compute_inline(b)
        last = blocks[-1]
        if _too_large(sch, last):
            return None
        loops = sch.get_loops(last)
        block = sch.get(last)
        if len(loops) < 2 or len(block.iter_vars) != len(loops) or not _elementwise(block):
            return None
        lanes = _lanes(int(sch.get(loops[-1]).extent))
        sch.fuse(*loops[:-1])
        if lanes > 1:
            _, inner = sch.split(sch.get_loops(last)[-1], [None, lanes])
            sch.vectorize(inner)
        return sch


def default_schedules() -> tvm.transform.Pass:
    """The CPU rules as one module pass (after any tuning database)."""
    return dl.ApplyDefaultSchedule(Pool(), Injective(), Elementwise())
