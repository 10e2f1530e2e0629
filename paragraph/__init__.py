"""paragraph: graph substitution and inter-operator parallelism for Apache TVM (Relax)."""

import importlib
import os

from paragraph.machine import cpu_count, hold_libraries_to_isa

# TVM sizes its CPU thread pool to half the logical CPUs on x86 (to skip SMT siblings); on cloud
# machines whose vCPUs are all there is, that idles half the machine and caps every schedule's
# per-stream thread count. Use every CPU this process may run on, unless the user chose.
os.environ.setdefault("TVM_NUM_THREADS", str(cpu_count()))
# Idle TVM pool workers spin (sched_yield) before sleeping, pinned to one core each: with a
# pool per stream they took half of the cores from concurrent streams (two 1-thread streams
# ran no faster than one). Sleep at once; a wake-up costs microseconds.
os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")
# libgomp's (PyTorch's, so vendor kernels') idle workers spin this many times (about 30 us)
# before they sleep, unless the user chose a policy; read when torch loads, so it takes effect
# if paragraph is imported before torch or TVM. A sleeping worker costs every multi-thread
# vendor call a wake-up (45-80 us here); 3000 spans the gap between one stream's calls, so
# ResNet-50 on one 2-thread stream ran 40.6-40.9 ms against 42.6-44.0 asleep (alternating
# processes, idle cores). The spin has a price when another process holds a core (77 -> 84-87
# ms there, where ONNX Runtime's spinning pool went 42 -> 79), and libgomp's default (about
# 3 ms) and ACTIVE cost far more: 2-thread convolutions 100x slower on a busy core.
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "3000"

from paragraph.errors import GraphError, ModelLoadError, ParagraphError, UnsupportedModelError
from paragraph.graph import Graph, GraphBuilder, Node, TensorRef, TensorType
from paragraph.version import __version__

hold_libraries_to_isa()  # PARAGRAPH_CPU_ISA=avx2: oneDNN and MKL as on an AVX2-only CPU

# The TVM-facing API loads TVM on first use, so `import paragraph` (the graph IR, rules and
# algorithms) stays fast and works without TVM.
_LAZY = {"build": "paragraph.deploy", "load": "paragraph.deploy",
         "SearchOptions": "paragraph.passes.search", "compile": "paragraph.planner",
         "CompileOptions": "paragraph.planner",
         "ParallelExecutable": "paragraph.deploy", "pipeline": "paragraph.transform",
         "register_pipelines": "paragraph.transform", "GraphSubstitution": "paragraph.transform",
         "KernelLowering": "paragraph.transform", "InterOperatorSchedule": "paragraph.transform"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'paragraph' has no attribute {name!r}")


__all__ = ["Graph", "GraphBuilder", "Node", "TensorRef", "TensorType", "ParagraphError",
           "UnsupportedModelError", "ModelLoadError", "GraphError", "__version__", *_LAZY]
