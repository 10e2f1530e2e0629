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
# libgomp's (PyTorch's, so vendor kernels') idle workers spin this many times before they
# sleep, unless the user chose a policy; read when torch loads, so it takes effect if paragraph
# is imported before torch or TVM. A sleeping worker costs every multi-thread call a wake-up,
# and on one 2-thread stream the spin spans the gap between calls. 300000 (libgomp's own
# default, about 3 ms) against the 3000 chosen before: one process per setting, each timed
# beside ONNX Runtime (benchmarks/spin.py, spin-cpu.json, 2026-11-30, 2-vCPU Zen 3): five
# one-stream models ran 6-23% faster idle and 4-15% faster with another process on a core
# (GPT-2 1.13x ONNX Runtime's time against 1.47x). On a Xeon VM (2026-11-27) a longer spin
# was 5-8% faster idle but 1.7x slower on ResNet-50 with a core busy: the idle case is the
# one a deployment buys cores for. A schedule of several streams spins little either way
# (libgomp spins 100 times where its threads outnumber the cores), and its
# 1-thread streams run no OpenMP team. A spin burns the core it waits on: where other work
# shares the machine and should come first, set OMP_WAIT_POLICY=PASSIVE.
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "300000"

from paragraph.errors import GraphError, ModelLoadError, ParagraphError, UnsupportedModelError
from paragraph.graph import Graph, GraphBuilder, Node, TensorRef, TensorType
from paragraph.lean import runtime_only_tvm
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
    if name == "load":  # a process that only loads artifacts needs TVM's runtime alone
        runtime_only_tvm()
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'paragraph' has no attribute {name!r}")


__all__ = ["Graph", "GraphBuilder", "Node", "TensorRef", "TensorType", "ParagraphError",
           "UnsupportedModelError", "ModelLoadError", "GraphError", "__version__", *_LAZY]
