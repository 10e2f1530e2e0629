"""Everything that touches TVM, in layers (ARCHITECTURE.md): models in (`frontend`), running a
program and the kernel library (`runtime`), timing kernels (`measure`), lowering and building
programs (`build`), measuring programs here or remote (`meter`) and MetaSchedule (`tune`).

The frontend's entry points are re-exported here, imported on first use: `runtime` alone runs
with TVM's runtime library only (`paragraph.lean`), and importing this package must not load
the compiler."""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the names as they are, for type checkers
    from paragraph.tvm_interop.frontend.importers import load, prepare
    from paragraph.tvm_interop.frontend.relax_graph import from_relax, random_inputs, to_relax

_FRONTEND = {"load": "paragraph.tvm_interop.frontend.importers",
             "prepare": "paragraph.tvm_interop.frontend.importers",
             "from_relax": "paragraph.tvm_interop.frontend.relax_graph",
             "to_relax": "paragraph.tvm_interop.frontend.relax_graph",
             "random_inputs": "paragraph.tvm_interop.frontend.relax_graph"}


def __getattr__(name: str) -> object:
    if name in _FRONTEND:
        return getattr(importlib.import_module(_FRONTEND[name]), name)
    raise AttributeError(f"module 'paragraph.tvm_interop' has no attribute {name!r}")


__all__ = ["from_relax", "to_relax", "random_inputs", "load", "prepare"]
