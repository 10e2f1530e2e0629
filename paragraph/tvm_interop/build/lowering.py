"""Lowering: a Relax module through TVM's own legalization and fusion, to the kernel graph.

``lower`` runs what ``relax.get_default_pipeline`` runs before memory planning (LegalizeOps,
AnnotateTIROpPattern, FoldConstant, FuseOps, FuseTIR; a MetaSchedule database when given;
then dlight default schedules on GPU, `cpu_schedules` on CPU for what no record scheduled;
RewriteDataflowReshape so reshapes become views), and
``kernel_graph`` turns the fused ``main`` into a `paragraph.Graph` whose operator nodes are
``kernel`` (one ``call_tir`` or ``call_dps_packed``) and ``view`` (a reshape that moves no data).
Schedules and costs are about these fused kernels, because they are what runs;
`paragraph.tvm_interop.build.program.KernelProgram` compiles them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import NamedTuple

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, te, tirx, topi
from tvm.s_tir import dlight as dl
from tvm.s_tir.analysis import estimate_tir_flops

from paragraph.errors import ParagraphError, UnsupportedModelError
from paragraph.graph import Graph, Node, TensorRef
from paragraph.tvm_interop.build.cpu_schedules import (
    REFUSED,
    VALUE_FIELDS,
    attempt,
    default_schedules,
    sub_exprs,
)
from paragraph.tvm_interop.build.tuning_db import applied_dir
from paragraph.tvm_interop.frontend.importers import TE_LOCK, prepare
from paragraph.tvm_interop.frontend.relax_graph import from_relax, to_relax
from paragraph.tvm_interop.runtime.library.names import cost_name, is_vendor_name, vendor_flops
from paragraph.tvm_interop.runtime.program import Once
from paragraph.tvm_interop.runtime.target import is_cpu, is_gpu

Dispatch = Callable[[tvm.IRModule], tvm.IRModule]  # chooses kernel sources (vendor calls)

# passes of a target's default pipeline that `lower` ran already and that must not run again
_FUSION = ("FuseOps", "FuseTIR")


class _Declining(dl.ScheduleRule):
    """A dlight rule that leaves a function it fails on to the next rule instead of failing
    the build: TVM 0.27's GEMV rule asserts on one of (reduced) RandWire's kernels for CUDA
    where it should decline it."""

    def __init__(self, rule: dl.ScheduleRule) -> None:
        self.rule = rule

    def apply(self, func, target, tunable):  # noqa: ANN001, ANN201 (dlight's signature)
        return attempt(f"gpu_schedules: {type(self.rule).__name__}", self.rule.apply, func,
                       target, tunable, refused=(AssertionError, *REFUSED))

    def is_target_available(self, target: tvm.target.Target) -> bool:
        return self.rule.is_target_available(target)


def _cumsum(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    a = call.attrs
    return bb.call_te(topi.cumsum, call.args[0], axis=None if a.axis is None else int(a.axis),
                      dtype=None if a.dtype is None else str(a.dtype),
                      exclusive=bool(a.exclusive))


def _let(value: tirx.Expr, body: Callable[[tirx.Var], tirx.Expr]) -> tirx.Expr:
    """``body(v)`` with ``v`` bound to ``value`` once: the fast forms read their argument
    several times, and an argument written out at each use (what inlining a chain of them
    would do) grows with every link (a fuzzed chain of six tanh never finished lowering)."""
    v = tirx.Var("v", "float32")  # the fast forms are float32's
    return tirx.Let(v, value, body(v))


def _fast_exp(x: tirx.Expr) -> tirx.Expr:
    """e^x in float32 by range reduction (x = n ln 2 + r, |r| <= ln 2 / 2, ln 2 in two parts)
    and Cephes' degree-7 polynomial, 2^n made from its exponent bits; x is clamped to
    [-88.38, 88.38] (e^x is then 0 or inf at the ends), a NaN not (see `_nan_kept`)."""
    def body(v: tirx.Var) -> tirx.Expr:
        n = tirx.floor(v * 1.4426950408889634 + 0.5)
        r = v - n * 0.693359375 + n * 2.12194440e-4

        def poly(r: tirx.Var) -> tirx.Expr:
            p = tirx.const(1.9875691500e-4, "float32")
            for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
                      5.0000001201e-1):
                p = p * r + c
            return p * r * r + r + 1.0

        scale = tirx.reinterpret("float32", (n.astype("int32") + 127) << 23)
        return scale * _let(r, poly)
    return _let(tirx.max(tirx.min(x, 88.3762626647949), -88.3762626647949), body)


def _fast_tanh(x: tirx.Expr) -> tirx.Expr:
    """tanh(x) in float32 as an odd rational function of degree 13 / 6 in x (the minimax fit
    Eigen uses) up to +-7.9053 (2 ulp below 1), that value's up to +-9, +-1 past it."""
    def body(v: tirx.Var) -> tirx.Expr:
        def ratio(x2: tirx.Var) -> tirx.Expr:
            p = tirx.const(-2.76076847742355e-16, "float32")
            for c in (2.00018790482477e-13, -8.60467152213735e-11, 5.12229709037114e-08,
                      1.48572235717979e-05, 6.37261928875436e-04, 4.89352455891786e-03):
                p = p * x2 + c
            q = tirx.const(1.19825839466702e-06, "float32")
            for c in (1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03):
                q = q * x2 + c
            return v * p / q
        return _let(v * v, ratio)

    def tails(v: tirx.Var) -> tirx.Expr:  # +-1 from 9 on, where float32's tanh is
        return tirx.Select(v >= 9.0, tirx.const(1.0, "float32"), tirx.Select(
            v <= -9.0, tirx.const(-1.0, "float32"),
            _let(tirx.max(tirx.min(v, 7.90531110763549805), -7.90531110763549805), body)))
    return _let(x, tails)


def _nan_kept(fast: Callable[[tirx.Expr], tirx.Expr]) -> Callable[[te.Tensor],
                                                                           te.Tensor]:
    """``fast`` element-wise, a NaN passed through: its clamp (LLVM's minnum and maxnum)
    would turn a NaN into a bound."""
    def compute(x: te.Tensor) -> te.Tensor:
        return te.compute(x.shape, lambda *i: _let(
            x[i], lambda v: tirx.Select(tirx.isnan(v), v, fast(v))), name="fast",
            tag="elemwise")
    return compute


def _fast_activation(name: str, fast: Callable[[tirx.Expr], tirx.Expr],
                     exact: Callable[[te.Tensor], te.Tensor]) -> Callable:
    """Legalize ``relax.NAME`` on a float32 tensor for a CPU in a fast form (``fast``: a
    polynomial or rational function LLVM vectorises) with NaNs kept; elsewhere as TVM does
    (``exact``). LLVM calls libm's expf and tanhf once per element: an LSTM step's three
    gates of 512 took 5 us, the fast forms 0.7, within 2 ulp of them."""

    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        x = call.args[0]
        target = tvm.target.Target.current(allow_none=True)
        dtype = x.ty.dtype if isinstance(x.ty, relax.TensorType) else None
        if dtype != "float32" or target is None or not is_cpu(target):
            return bb.call_te(exact, x, primfunc_name_hint=name)
        return bb.call_te(_nan_kept(fast), x, primfunc_name_hint=name)

    return legalize


def _fast_sigmoid(x: tirx.Expr) -> tirx.Expr:
    return tirx.const(1.0, "float32") / (_fast_exp(-x) + 1.0)


def _relu(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """relu as ``x < 0 ? 0 : x``, which keeps NaN as ONNX Runtime and PyTorch do; TOPI's
    ``max(x, 0)`` made it 0 (the same vector compare and blend either way)."""

    def relu(x: te.Tensor) -> te.Tensor:
        zero = tirx.const(0, x.dtype)
        return te.compute(x.shape, lambda *i: tirx.Select(x(*i) < zero, zero, x(*i)),
                          name="relu", tag="elemwise")

    return bb.call_te(relu, call.args[0], primfunc_name_hint="relu")


def _clip(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """clip (relu6, hard-sigmoid's, ONNX Clip) as ``x < lo ? lo : (x > hi ? hi : x)``, which
    keeps NaN as PyTorch, numpy and the C++ kernels' epilogues do; TOPI's
    ``max(min(x, hi), lo)`` made it ``lo``."""

    def clip(x: te.Tensor, lo: tirx.PrimExpr, hi: tirx.PrimExpr) -> te.Tensor:
        lo, hi = (v.astype(x.dtype) for v in (lo, hi))
        return te.compute(x.shape, lambda *i: tirx.Select(
            x(*i) < lo, lo, tirx.Select(x(*i) > hi, hi, x(*i))), name="clip", tag="elemwise")

    return bb.call_te(clip, *call.args, primfunc_name_hint="clip")


def _nan_max_reducer(dtype: str) -> te.CommReducer:
    """max with a NaN absorbing, by ordered compares alone: ``b > a ? b : (b <= a ? a : a +
    b)`` (both compares false only where one is NaN, and then the sum is NaN). An ``isnan(a) ||
    a > b`` form was not vectorised (as a max pool's window: 7-25x TOPI's time, this form
    1.7-2.6x); ``a != a`` TVM's simplifier folds to false. Integers have no NaN: a plain
    max."""
    if "float" not in dtype:
        return te.comm_reducer(lambda a, b: tirx.max(a, b), lambda t: tirx.min_value(t),
                               name="max")
    return te.comm_reducer(
        lambda a, b: tirx.Select(b > a, b, tirx.Select(b <= a, a, a + b)),
        lambda t: tirx.min_value(t), name="nan_max")


def _nan_max(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """The max reduction (``relax.max``) with a NaN anywhere in a reduced slice giving NaN,
    as numpy, PyTorch's ``amax`` and the C++ pools do; TOPI's ``max`` combines by ``a > b ? a :
    b``, which drops a NaN unless it comes last."""
    axis, keep = call.attrs.axis, bool(call.attrs.keepdims)

    def reduce_max(x: te.Tensor) -> te.Tensor:
        reducer = _nan_max_reducer(str(x.dtype))
        ndim = len(x.shape)
        axes = sorted({int(a) % ndim for a in axis} if axis is not None else range(ndim))
        ks = {a: te.reduce_axis((0, x.shape[a]), name=f"k{a}") for a in axes}
        shape = [1 if a in ks else x.shape[a] for a in range(ndim) if keep or a not in ks]

        def body(*idx: tirx.PrimExpr) -> tirx.PrimExpr:
            at = iter(idx)
            full = []
            for a in range(ndim):
                if a in ks:
                    full.append(ks[a])
                    if keep:
                        next(at)
                else:
                    full.append(next(at))
            return reducer(x(*full), axis=list(ks.values()))

        return te.compute(shape, body, name="max")

    return bb.call_te(reduce_max, call.args[0], primfunc_name_hint="max")


# legalizations TVM 0.27's LegalizeOps lacks: ``cumsum`` (RoBERTa's position ids, the running
# count of its non-padding tokens) survived lowering and the executor refused the model; and
# the sigmoid and tanh that stay TVM kernels (an RNN's gates; a vendor kernel's epilogue has
# its own) in fast forms on a CPU; and relu, clip and the max reduction, which TVM's made
# lose a NaN (TOPI's max pool still drops one, as ONNX Runtime's does: docs/findings.md)
EXTRA_LEGALIZE = {"relax.cumsum": _cumsum, "relax.nn.relu": _relu, "relax.clip": _clip,
                  "relax.max": _nan_max,
                  "relax.sigmoid": _fast_activation("sigmoid", _fast_sigmoid, topi.sigmoid),
                  "relax.tanh": _fast_activation("tanh", _fast_tanh, topi.tanh)}


def gpu_schedules() -> tvm.transform.Pass:
    """dlight's default GPU schedules (the ones TVM's CUDA pipeline applies), each rule that
    fails on a kernel declining it so that the next (at the end `Fallback`) schedules it."""
    return dl.ApplyDefaultSchedule(*(_Declining(r) for r in (
        dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(),
        dl.gpu.Fallback())))


def build_pipeline(target: tvm.target.Target) -> tvm.transform.Pass:
    """What ``tvm.compile`` runs on a module `lower` made, so that the VM's module holds
    exactly the kernels of the kernel graph: on a CPU TVM's generic build passes (what
    `compiled_kernels` compiles the executor's kernels with); on a GPU the target's default
    pipeline without fusion. The whole default pipeline annotates and fuses again, so a
    kernel `lower` left alone (a split) merged into the kernel after it (a batch norm that
    could not fold) under a new name: one of Inception-v3's search candidates lost a kernel
    that way on an H100 (`fused_subtract2_divide2_multiply2_add2_relu2` missing from the VM's
    module), and the CPU VM baseline ran kernels the executor did not."""
    if not is_gpu(target):
        return relax.pipeline.default_build_pipeline()
    backend = relax.backend.cuda.pipeline if target.kind.name == "cuda" else \
        relax.backend.gpu_generic.pipeline
    # dlight's schedules (for what legalization makes anew) with rules that decline
    passes = [gpu_schedules() if p.info.name == "ApplyDefaultSchedule" else p
              for p in (backend.library_dispatch_passes(target)
                        + backend.legalize_passes(target)
                        + backend.dataflow_lower_passes(target)
                        + backend.finalize_passes(target))
              if p.info.name not in _FUSION]

    @tvm.transform.module_pass(opt_level=0, name="paragraph.BuildPipeline")
    def _pipeline(mod: tvm.IRModule, _ctx: object) -> tvm.IRModule:
        with target:
            return tvm.transform.Sequential(passes)(mod)

    return _pipeline


def lower(mod: tvm.IRModule, target: tvm.target.Target,
          tuning_db: str | os.PathLike | None = None,
          dispatch: Dispatch | None = None) -> tvm.IRModule:
    """Legalize and fuse ``mod`` for ``target`` (what the default pipeline does before memory
    planning); apply a MetaSchedule database directory when given. ``dispatch`` first turns
    operator patterns of the prepared module into vendor calls, before legalization, like
    TVM's cuDNN/cuBLAS BYOC (`paragraph.tvm_interop.build.dispatch.dispatch_to_vendor`)."""
    return lower_tracked(mod, target, tuning_db, dispatch).lowered


class Lowered(NamedTuple):
    """What `lower_tracked` returns."""

    opgraph: Graph  # the operator graph the kernels are fused from
    lowered: tvm.IRModule
    groups: dict[str, tuple[int, ...]] | None  # binding name -> operator ids (None: untraced)
    model: Once[Graph] | None  # the prepared operator graph before dispatch


def lower_tracked(mod: tvm.IRModule | Graph, target: tvm.target.Target,
                  tuning_db: str | os.PathLike | None = None, dispatch: Dispatch | None = None,
                  ) -> Lowered:
    """`lower`, keeping track of which operators each kernel computes.

    ``mod`` may also be an operator graph that went through `prepare` (and dispatch) already,
    e.g. one that a rewrite produced from `KernelProgram.operator_graph`: its node ids are
    kept, so the kernels of the result can be matched with the operators of the original.

    Returns the operator graph (``from_relax`` of the prepared, dispatched module), the lowered
    module, for each binding name of the lowered ``main`` the ids of the operator-graph nodes
    that kernel computes (None where TVM's fusion could not be traced), and for a Relax ``mod``
    the prepared operator graph before dispatch (made on first use where a dispatch changed
    it; None for an operator graph ``mod``). Tracing names every binding
    ``n<node id>`` before lowering (LegalizeOps keeps binding variables, so unfused kernels keep
    their names) and replays each function FuseOps made on the operator graph
    (`_fusion_groups`).
    """
    model: Once[Graph] | None = None
    if isinstance(mod, Graph):  # an operator graph that is already prepared: keep its ids
        opgraph = mod
    else:  # batch norm decomposed, constants folded in numpy (FoldConstant is slow)
        prepared = prepare(mod)
        if dispatch is None:
            opgraph = from_relax(prepared)
            model = Once.of(opgraph)
        else:
            opgraph = from_relax(dispatch(prepared))
            model = Once(partial(from_relax, prepared))
    # operators named by id (their bindings are traced through fusion); inputs keep the
    # model's names, which users pass inputs by
    opgraph = Graph([n if n.kind == "input" else n.replace(name=f"n{n.id}")
                     for n in opgraph.nodes], opgraph.outputs,
                    opgraph.meta)
    legalize = [relax.transform.LegalizeOps(EXTRA_LEGALIZE), relax.transform.AnnotateTIROpPattern(),
                relax.transform.FoldConstant()]
    rest = [relax.transform.FuseTIR()]
    if tuning_db is not None:
        if not (Path(tuning_db) / "database_tuning_record.json").exists():
            raise ParagraphError(f"no MetaSchedule database in {tuning_db} "
                                 "(database_tuning_record.json is missing)")
        with target:  # the pass reads the target when it is made
            # only the records that measured faster than the untuned kernels
            rest.append(relax.transform.MetaScheduleApplyDatabase(str(applied_dir(tuning_db))))
    if is_gpu(target):
        rest.append(gpu_schedules())
    elif is_cpu(target):  # pools fused and vectorised (cpu_schedules)
        rest.append(default_schedules())
    rest += [relax.transform.RewriteDataflowReshape(), relax.transform.DeadCodeElimination()]
    constants: dict[int, object] = {}
    with target:
        with TE_LOCK:  # TOPI's tag scope is process-wide (importers.TE_LOCK)
            legal = tvm.transform.Sequential(legalize)(to_relax(opgraph, constants=constants))
        fused = relax.transform.FuseOps()(legal)
        groups = _fusion_groups(fused, opgraph, {c: TensorRef(i) for i, c in constants.items()},
                                _callees(legal))
        return Lowered(opgraph, tvm.transform.Sequential(rest)(fused), groups, model)


def _callees(legal: tvm.IRModule) -> dict[str, str]:
    """Binding name -> the PrimFunc (or packed function) LegalizeOps made it call."""
    out = {}
    for block in legal["main"].body.blocks:
        for b in block.bindings:
            callee = _callee(b.value)
            if callee:
                out[b.var.name] = callee
    return out


def _callee(call) -> str:
    if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
        return ""
    if call.op.name == "relax.call_tir":
        return call.args[0].name_hint
    if call.op.name == "relax.call_dps_packed":
        return str(call.args[0].global_symbol)
    return ""


def _fusion_groups(fused: tvm.IRModule, opgraph: Graph, constants: dict,
                   callees: dict[str, str]) -> dict[str, tuple[int, ...]] | None:
    """Binding name in ``fused``'s main -> operator node ids it computes (see lower_tracked).

    FuseOps shares one function among structurally equal groups, so inner names cannot be
    trusted; instead each fused function is replayed on the operator graph: an inner
    ``call_tir`` is the operator whose inputs are that call's tensors and whose PrimFunc (the
    one LegalizeOps made for it, ``callees``) it calls: slices of one tensor differ only
    there. ``constants`` maps the Relax constants `to_relax` made to their weight nodes;
    constants that legalization inlines are skipped. Returns None when some operator cannot
    be placed.
    """
    # duplicated computations (RandWire applies relu(x) once per successor) are one class:
    # whichever copy a call is matched to, its users' inputs must still match
    canon: dict[TensorRef, TensorRef] = {}
    first: dict[tuple, int] = {}
    for n in opgraph.nodes:
        ins = tuple(canon.get(r, r) for r in n.inputs)
        rep = n.id if n.is_source else first.setdefault((n.kind, n.attrs, ins), n.id)
        for i in range(len(n.outputs)):
            canon[TensorRef(n.id, i)] = TensorRef(rep, i)
    by_inputs: dict[tuple, list[int]] = {}
    for n in opgraph.nodes:
        if not n.is_source:
            ins = tuple(canon[r] for r in n.inputs)
            by_inputs.setdefault(ins, []).append(n.id)
            tensors = tuple(r for r in ins if opgraph[r.node].kind not in ("weight", "constant"))
            if tensors != ins:
                by_inputs.setdefault(("no constants", *tensors), []).append(n.id)
    main = fused["main"]
    env: dict[object, object] = {p: canon[TensorRef(i, 0)]
                                 for p, i in zip(main.params, opgraph.inputs, strict=True)}
    groups: dict[str, list[int]] = {}

    def value(expr, scope):
        if isinstance(expr, relax.Var):
            return scope.get(expr, env.get(expr))
        if isinstance(expr, relax.Tuple):
            return [value(f, scope) for f in expr.fields]
        return constants.get(expr)  # None for a constant made by a pass

    def place(call, scope, members) -> object:
        args = value(call.args[1], scope) if call.op.name == "relax.call_tir" else [
            value(a, scope) for a in call.args]
        args = list(_flat(args))
        candidates = [i for i in by_inputs.get(tuple(args), ()) if i not in taken]
        if not candidates:  # legalization inlined a scalar constant, or a pass made one
            tensors = tuple(a for a in args if a is not None
                            and opgraph[a.node].kind not in ("weight", "constant"))
            candidates = [i for i in by_inputs.get(("no constants", *tensors), ())
                          if i not in taken]
        callee = _callee(call)
        candidates = [i for i in candidates if callees.get(opgraph[i].name) == callee]
        if not candidates:
            raise LookupError(call)
        taken.add(candidates[0])
        members.append(candidates[0])
        node = opgraph[candidates[0]]
        outs = [canon[TensorRef(node.id, i)] for i in range(len(node.outputs))]
        return outs[0] if len(outs) == 1 else outs

    def bind(binding, scope, members) -> None:
        v = binding.value
        if isinstance(v, relax.TupleGetItem):
            scope[binding.var] = value(v.tuple_value, scope)[v.index]
        elif isinstance(v, relax.Tuple | relax.Var):
            scope[binding.var] = value(v, scope)
        elif isinstance(v, relax.Call) and isinstance(v.op, relax.GlobalVar):
            func = fused[v.op]
            inner = dict(zip(func.params, [value(a, scope) for a in v.args], strict=True))
            group: list[int] = []
            for blk in func.body.blocks:
                for b in blk.bindings:
                    bind(b, inner, group)
            scope[binding.var] = value(func.body.body, inner)
            groups[binding.var.name] = group
        elif isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op):
            scope[binding.var] = place(v, scope, members)

    taken: set[int] = set()
    try:
        for block in main.body.blocks:
            for binding in block.bindings:
                single: list[int] = []
                bind(binding, env, single)
                if single:
                    groups[binding.var.name] = single
    except (LookupError, TypeError, IndexError):
        return None
    left = [n for n in opgraph.nodes if not n.is_source and n.id not in taken]
    if any(not all(opgraph[r.node].is_source for r in n.inputs) for n in left):
        return None  # only operators on constants may vanish (FoldConstant)
    return {g: tuple(sorted(m)) for g, m in groups.items()}


def _flat(x):
    if isinstance(x, list):
        for item in x:
            yield from _flat(item)
    else:
        yield x


_ARITHMETIC = (tirx.Add, tirx.Sub, tirx.Mul, tirx.Div, tirx.Min, tirx.Max, tirx.FloorDiv,
               tirx.FloorMod, tirx.Mod, tirx.Select, tvm.ir.expr.Call)


def _tir_flops(func: tirx.PrimFunc) -> float:
    """TVM's FLOP estimate of ``func``. Its estimator has no case for a let-bound value (the
    fast sigmoid and tanh bind theirs): such a kernel's FLOPs are counted here, each store's
    arithmetic (a let's value once) times the extents of the loops around it."""
    try:
        return float(estimate_tir_flops(tvm.IRModule({"main": func})))
    except tvm.error.InternalError as exc:
        if "Let" not in str(exc):
            raise
    return float(_store_flops(func.body, 1))


def _store_flops(stmt: object, trips: int) -> int:
    if isinstance(stmt, tirx.For):
        # an extent that varies with an outer loop (an adaptive pool's window) counted once:
        # an estimate for the cost model, which measures what it relies on
        extent = stmt.extent
        return _store_flops(stmt.body,
                            trips * (int(extent) if isinstance(extent, tirx.IntImm) else 1))
    if isinstance(stmt, tirx.BufferStore):
        seen: set[int] = set()

        def ops(e: object) -> int:
            if not isinstance(e, tirx.Expr) or e.__chandle__() in seen:
                return 0
            seen.add(e.__chandle__())
            return int(isinstance(e, _ARITHMETIC)) + sum(ops(c) for c in
                                                         sub_exprs(e, VALUE_FIELDS))
        return trips * ops(stmt.value)
    total = 0
    for name in ("body", "block", "then_case", "else_case", "seq"):
        child = getattr(stmt, name, None)
        for c in (child if isinstance(child, tvm.ir.Array) else [child]):
            if isinstance(c, tirx.Stmt):
                total += _store_flops(c, trips)
    return total


def _kernel_attrs(lowered: tvm.IRModule, node: Node, in_types: list) -> dict:
    """Attributes of a kernel node: callee name, structural hash, FLOPs, bytes, source (a
    packed function's hash is its name and argument types)."""
    op = node.attrs["op"]
    callee = node.payload["args"][0][1]  # ("keep", GlobalVar or ExternFunc)
    nbytes = sum(t.numel * tvm_ffi.dtype(t.dtype).itemsize for t in node.outputs)
    if op == "relax.call_tir":
        func = lowered[callee]
        flops = _tir_flops(func)
        return {"func": callee.name_hint, "hash": f"{tvm_ffi.structural_hash(func):016x}",
                "flops": flops, "out_bytes": nbytes, "source": "tvm",
                "pattern": int(func.attrs.get("op_pattern", -1)) if func.attrs else -1}
    name = str(callee.global_symbol)
    types = [str(t) for t in (*in_types, *node.outputs)]
    flops = vendor_flops(name, [t.shape for t in in_types], [t.shape for t in node.outputs]) \
        if is_vendor_name(name) else 0.0
    return {"func": name, "hash": f"packed:{cost_name(name)}:{','.join(types)}",
            "flops": flops, "out_bytes": nbytes, "source": "vendor", "pattern": -1}


def kernel_graph(lowered: tvm.IRModule) -> Graph:
    """The fused ``main`` as a graph of ``kernel`` and ``view`` nodes over inputs and weights."""
    graph = from_relax(lowered)
    nodes = []
    for n in graph.nodes:
        if n.is_source:
            nodes.append(n)
        elif n.kind == "reshape":
            nodes.append(n.replace(kind="view"))
        elif n.kind == "opaque" and n.attrs["op"] in ("relax.call_tir",
                                                       "relax.call_dps_packed"):
            attrs = _kernel_attrs(lowered, n, [graph.type_of(r) for r in n.inputs])
            nodes.append(n.replace(kind="kernel", attrs=attrs, payload=None))
        else:
            what = n.attrs.get("op", n.kind) if n.kind == "opaque" else n.kind
            raise UnsupportedModelError(f"{what} ({n.name!r}) survived lowering; the executor "
                                        "runs call_tir and call_dps_packed kernels only")
    meta = {k: v for k, v in graph.meta.items() if k != "relax_module"}
    return Graph(nodes, graph.outputs, meta)


def slices_as_views(graph: Graph, opgraph: Graph,
                    kernel_operators: dict[int, tuple[int, ...]]) -> Graph:
    """Kernels that only copy a contiguous channel range out of a tensor whose leading
    dimensions are 1 (an IOS merge's outputs at batch 1) become views with a byte offset,
    where the offset keeps the 64-byte alignment TVM's kernels assume."""
    nodes = []
    for n in graph.nodes:
        members = kernel_operators.get(n.id, ())
        op = opgraph[members[0]] if len(members) == 1 else None
        if n.kind == "kernel" and op is not None and op.kind == "strided_slice":
            src = graph.type_of(n.inputs[0])
            axes = [a % len(src.shape) for a in op.attrs["axes"]]
            if (axes == [1] and (op.attrs["strides"] or (1,)) == (1,) and src.shape[0] == 1
                    and op.attrs["begin"][0] >= 0):
                offset = op.attrs["begin"][0] * math.prod(src.shape[2:]) * np.dtype(
                    src.dtype).itemsize
                if offset % 64 == 0:
                    nodes.append(n.replace(kind="view", attrs={"offset": offset,
                                                               "func": n.attrs["func"]}))
                    continue
        nodes.append(n)
    return Graph(nodes, graph.outputs, graph.meta)
