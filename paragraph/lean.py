"""TVM's runtime alone, for a process that only loads and runs artifacts (`paragraph.load`).

``import tvm`` loads TVM's compiler (a 260 MB library and the Relax Python API) and, through
TVM FFI, PyTorch whenever it is installed: 406 MiB resident before any model, against 46 MiB
for ``import onnxruntime`` (2026-12-01, a 2-vCPU Zen 3: `benchmarks/memory.py`). Running an
artifact needs neither: its kernels are compiled, and paragraph's C++ vendor kernels load the
PyTorch library they call themselves, and only where a kernel runs one of PyTorch's forms.
`runtime_only_tvm`, called by ``paragraph.load`` before TVM is first imported, imports TVM with
``TVM_USE_RUNTIME_LIB=1`` and with PyTorch's Python package held back, which leaves 82 MiB. It
changes nothing where TVM is imported already, or where ``PARAGRAPH_LEAN_LOAD=0``.

The price: in such a process TVM's compiler is missing, so building a model
(`paragraph.build`), a loaded program's lowered module and target, exporting it again, and
any other use of ``tvm.relax`` fail with
`paragraph.tvm_interop.runtime.program.CompilerNeededError` (or TVM's own error, outside
paragraph); the TVM VM still runs (TVM's runtime has it). A program that loads artifacts and
also compiles imports TVM first, or sets ``PARAGRAPH_LEAN_LOAD=0``. PyTorch can still be
imported afterwards; TVM FFI then does not convert torch tensors passed to TVM functions
(paragraph passes none).
"""

from __future__ import annotations

import os
import sys
import threading

ENV = "PARAGRAPH_LEAN_LOAD"  # "0": import TVM whole, as `import tvm` does
_lock = threading.Lock()  # two first loads at once: one imports, the other finds it done


def runtime_only_tvm() -> bool:
    """Import TVM's runtime alone (without its compiler or PyTorch) unless TVM is imported
    already or ``$PARAGRAPH_LEAN_LOAD`` is ``0``; whether this process's TVM is runtime-only
    afterwards."""
    with _lock:
        if "tvm" not in sys.modules and os.environ.get(ENV, "1").strip() != "0":
            _import_runtime_only()
    return is_runtime_only()


def _import_runtime_only() -> None:
    """``import tvm`` with ``TVM_USE_RUNTIME_LIB=1`` and PyTorch held back, both undone after."""
    before = os.environ.get("TVM_USE_RUNTIME_LIB")
    hold_torch = "torch" not in sys.modules
    os.environ["TVM_USE_RUNTIME_LIB"] = "1"  # read once, when TVM loads its library
    if hold_torch:  # TVM FFI imports PyTorch if it can: make it fail, for this import
        sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        # the point of this module: TVM imported, but its runtime only (a slow import)
        import tvm  # noqa: F401
    finally:
        if before is None:
            os.environ.pop("TVM_USE_RUNTIME_LIB", None)
        else:
            os.environ["TVM_USE_RUNTIME_LIB"] = before
        if hold_torch and sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]


def is_runtime_only() -> bool:
    """Whether this process imported TVM's runtime alone (False where TVM is not imported)."""
    base = sys.modules.get("tvm.base")
    return bool(getattr(base, "_RUNTIME_ONLY", False))
