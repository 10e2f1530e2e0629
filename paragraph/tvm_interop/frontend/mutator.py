"""`ModuleMutator`: a Relax expression mutator over every Relax function of one module, the
base of paragraph's rewrites of imported and lowered modules (subclasses override the visits
they need and are decorated with ``relax.expr_functor.mutator``)."""

from __future__ import annotations

import tvm
from tvm import relax


class ModuleMutator(relax.PyExprMutator):
    """Rewrites each Relax function of ``mod`` with this mutator's visits (`transform`)."""

    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.mod_ = mod

    def transform(self) -> tvm.IRModule:
        """The module with every Relax function visited (the others as they were)."""
        for gv, func in self.mod_.functions_items():
            if isinstance(func, relax.Function):
                self.builder_.update_func(gv, self.visit_expr(func))
        return self.builder_.get()
