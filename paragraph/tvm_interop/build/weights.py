"""A lowered module's weights taken out of it and put back: what lets an artifact store them
once, as raw bytes (`paragraph.tvm_interop.build.artifact`).

A lowered module holds its weights as ``main``'s tensor constants. ``tvm.ir.save_json``
writes them base64-encoded (4/3 of their size) and ``export_library`` writes the VM
executable's copy into the kernel library: ResNet-18's artifact held its 45 MB of weights
twice, 90 MB, and loading it held them four times over. Here

* `stripped` replaces each weight (a tensor constant of at least `MIN_BYTES`, in a dtype
  numpy reads) by a placeholder: a constant of the same type whose data is its index (one
  int64), and returns the weights in index order;
* `lifted` makes the weights ``main``'s trailing parameters instead, for the VM executable
  that goes into the kernel library (the same kernels; ``main`` is then called with the
  weights after the inputs, `KernelProgram.vm`);
* `restored` puts loaded weights back in place of the placeholders, and refuses a module
  whose placeholders do not match the weights it is given one to one.

Small constants (scalars, shapes) stay where they are: they cost nothing and some are not
plain tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import Constant
from tvm.relax import _ffi_api

from paragraph.errors import ParagraphError
from paragraph.tvm_interop.build.program import replace_main
from paragraph.tvm_interop.frontend.mutator import ModuleMutator

MIN_BYTES = 64  # a placeholder's data (8 bytes) must differ from any weight's type


def _is_weight(const: Constant) -> bool:
    ty = const.ty
    if not isinstance(ty, relax.TensorType) or not hasattr(const.value, "numpy"):
        return False
    try:
        dtype = np.dtype(str(ty.dtype))
    except TypeError:  # bfloat16 and other types numpy lacks: kept inline
        return False
    value = const.value
    return dtype != np.bool_ and int(np.prod(value.shape)) * dtype.itemsize >= MIN_BYTES


def _placeholder(index: int, ty: relax.TensorType) -> Constant:
    return _ffi_api.MakeTensorConst(tvm.runtime.tensor(np.array([index], np.int64)), ty, None)


def _placeholder_index(const: Constant) -> int | None:
    """The index a placeholder holds; None for any other constant."""
    value = const.value
    if not hasattr(value, "numpy") or str(value.dtype) != "int64" or tuple(value.shape) != (1,):
        return None
    ty = const.ty
    if isinstance(ty, relax.TensorType) and str(ty.dtype) == "int64" and ty.shape is not None \
            and [int(d) for d in ty.shape] == [1]:
        return None  # a real (1,) int64 constant: its type is its data's
    return int(value.numpy()[0])


@relax.expr_functor.mutator
class _Replace(ModuleMutator):
    """``main``'s weights replaced by placeholders (``mode="strip"``), parameters
    (``"lift"``), or, given the weights, placeholders by them (``"restore"``)."""

    def __init__(self, mod: tvm.IRModule, mode: str,
                 weights: Sequence[tvm.runtime.Tensor] = ()) -> None:
        super().__init__(mod)
        self.mode = mode
        self.weights: list[tvm.runtime.Tensor] = list(weights)
        self.index: dict[Constant, int] = {}
        self.params: list[relax.Var] = []
        self.restored: set[int] = set()
        self.problem: str | None = None
        self.made: dict[int, relax.Expr] = {}  # weight index -> the expression put in its place

    def main(self) -> relax.Function:
        main = self.mod_["main"]
        if not isinstance(main, relax.Function):
            raise ParagraphError("the lowered module's main is not a Relax function")
        body = self.visit_expr(main.body)
        if self.problem:
            raise ParagraphError(self.problem)
        return relax.Function(list(main.params) + self.params, body, main.ret_ty,
                              main.is_pure, main.attrs)

    def visit_generic_const_(self, const: Constant) -> relax.Expr:  # noqa: D102
        if self.mode == "restore":
            i = _placeholder_index(const)
            if i is None:
                return const
            # a problem is kept, not raised: an exception inside a visit comes back through
            # TVM's FFI as a RuntimeError
            if not 0 <= i < len(self.weights):
                self.problem = self.problem or (f"weight placeholder {i} is out of range: "
                                                f"{len(self.weights)} weights")
                return const
            w = self.weights[i]
            ty = const.ty
            if tuple(w.shape) != tuple(int(d) for d in ty.shape) or str(w.dtype) != str(
                    ty.dtype):
                self.problem = self.problem or (f"weight {i} is {w.dtype}{tuple(w.shape)}; "
                                                f"its place in the module holds {ty}")
                return const
            if i not in self.made:  # one constant object per weight: shared stays shared
                self.made[i] = _ffi_api.MakeTensorConst(w, ty, None)
            self.restored.add(i)
            return self.made[i]
        if not _is_weight(const):
            return const
        if const not in self.index:
            self.index[const] = len(self.weights)
            self.weights.append(const.value)
            if self.mode == "lift":
                self.params.append(relax.Var(f"weight{self.index[const]}", const.ty))
        i = self.index[const]
        if self.mode == "lift":
            return self.params[i]
        if i not in self.made:  # one placeholder per weight, however often it is used
            self.made[i] = _placeholder(i, const.ty)
        return self.made[i]


def stripped(mod: tvm.IRModule) -> tuple[tvm.IRModule, list[tvm.runtime.Tensor]]:
    """``mod`` with ``main``'s weights replaced by placeholders, and the weights in the
    order of their indices."""
    r = _Replace(mod, "strip")
    main = r.main()
    return replace_main(mod, main), r.weights


def lifted(mod: tvm.IRModule) -> tuple[tvm.IRModule, list[tvm.runtime.Tensor]]:
    """``mod`` with ``main``'s weights as its trailing parameters (in `stripped`'s order),
    and the weights."""
    r = _Replace(mod, "lift")
    main = r.main()
    return replace_main(mod, main), r.weights


def restored(mod: tvm.IRModule, weights: Sequence[tvm.runtime.Tensor]) -> tvm.IRModule:
    """``mod`` (`stripped`) with its placeholders replaced by ``weights``. `ParagraphError`
    unless every weight fills a placeholder of its type and every placeholder is filled."""
    r = _Replace(mod, "restore", weights)
    main = r.main()
    if r.restored != set(range(len(weights))):
        missing = sorted(set(range(len(weights))) - r.restored)[:5]
        raise ParagraphError(f"{len(weights) - len(r.restored)} of {len(weights)} weights have "
                             f"no place in the module (e.g. {missing})")
    return replace_main(mod, main)
