"""Compiled TVM kernels shared by the programs of one process (`compiled_kernels`).

The substitution search builds many programs of one model that differ in a few kernels; each
used to compile and JIT every TVM kernel again. LLVM's JIT of NASNet-A large's 44 untuned
kernels took 5.3 s of a 26 s build, for kernels the search's input had compiled already. Here a
kernel is compiled once per process, keyed by its TIR (structurally, without its name), and a
program takes the compiled functions of the kernels it shares with one built before.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import tvm
import tvm_ffi

from paragraph.machine import cpu_count
from paragraph.tvm_interop.build.lowering import build_pipeline

CAPACITY = 4096  # kernels kept; the oldest used goes first (its code stays while a program uses it)
# functions compiled together in one module: LLVM's JIT of a module grows faster than its size
# (DenseNet-121's 63 batch-norm kernels after its concatenations, measured: 8 a module 0.35 s,
# 16 2.4 s, 32 38 s; all 63 in one took 76 of a 100 s build)
CHUNK = 8

_lock = threading.Lock()
# (target, structural hash) -> [(TIR without its name, compiled function, its module)]
_cache: OrderedDict[tuple[str, int], list[tuple[tvm.tirx.PrimFunc, object, object]]] = \
    OrderedDict()


def compiled_kernels(lowered: tvm.IRModule, target: tvm.target.Target) -> dict[str, Any]:
    """Every TIR function of ``lowered`` (a lowered Relax module, `paragraph.tvm_interop.
    lowering`) compiled for ``target``, by name: the TIR as TVM's default Relax pipeline hands
    it to code generation (the VM's kernels are these), the ones not compiled before in this
    process built together in one module, the rest taken from earlier builds. A function is
    reused only when its TIR is structurally equal to the one compiled, so two programs share
    exactly the code TVM would have made for each."""
    with target:
        final = build_pipeline(target)(lowered)
    found: dict[str, object] = {}
    missing: dict[str, tuple[tuple[str, int], tvm.tirx.PrimFunc]] = {}
    with _lock:
        for gv, func in final.functions.items():
            if not isinstance(func, tvm.tirx.PrimFunc):
                continue
            bare = func.without_attr("global_symbol")
            key = (str(target), tvm_ffi.structural_hash(bare))
            hit = next((fn for tir, fn, _ in _cache.get(key, ())
                        if tvm_ffi.structural_equal(tir, bare)), None)
            if hit is None:
                missing[gv.name_hint] = (key, bare)
            else:
                _cache.move_to_end(key)
                found[gv.name_hint] = hit
    if missing:
        found.update(_compile(missing, target))
    return found


def _compile(missing: dict[str, tuple[tuple[str, int], tvm.tirx.PrimFunc]],
             target: tvm.target.Target) -> dict[str, object]:
    """``missing`` compiled, `CHUNK` functions a module (see there), the modules on as many
    threads as this process has cores: TVM's code generation releases the GIL, and each
    module has an LLVM context of its own (NASNet-A mobile's 15 modules, reduced: 12.4 s on
    one thread, 5.8 s on two)."""
    names = list(missing)
    chunks = [{n: missing[n] for n in names[first:first + CHUNK]}
              for first in range(0, len(names), CHUNK)]
    out: dict[str, object] = {}
    workers = min(len(chunks), cpu_count())
    if workers <= 1:
        for chunk in chunks:
            out.update(_compile_module(chunk, target))
        return out
    context = tvm.transform.PassContext.current()  # thread-local: the caller's, carried

    def compile_in(chunk: dict[str, tuple[tuple[str, int], tvm.tirx.PrimFunc]]
                   ) -> dict[str, object]:
        with context:
            return _compile_module(chunk, target)

    pool = ThreadPoolExecutor(workers, thread_name_prefix="paragraph-compile")
    try:
        for done in pool.map(compile_in, chunks):
            out.update(done)
    finally:  # an error or Ctrl+C: the modules not started are not compiled
        pool.shutdown(wait=True, cancel_futures=True)
    return out


def _compile_module(missing: dict[str, tuple[tuple[str, int], tvm.tirx.PrimFunc]],
                    target: tvm.target.Target) -> dict[str, object]:
    # each under a symbol of its own: two programs may give different kernels one name
    symbols = {name: f"paragraph_k{i}_{key[1] & 0xFFFFFFFFFFFF:012x}"
               for i, (name, (key, _)) in enumerate(missing.items())}
    mod = tvm.IRModule({tvm.ir.GlobalVar(symbols[name]):
                        bare.with_attr("global_symbol", symbols[name])
                        for name, (_, bare) in missing.items()})
    lib = tvm.tirx.build(mod, target=target, pipeline="default")
    out: dict[str, object] = {}
    with _lock:
        for name, (key, bare) in missing.items():
            fn = lib.get_function(symbols[name], query_imports=True)
            out[name] = fn
            _cache.setdefault(key, []).append((bare, fn, lib))
            _cache.move_to_end(key)
        while len(_cache) > CAPACITY:
            _cache.popitem(last=False)
    return out


def cached_kernel_count() -> int:
    """How many compiled kernels this process holds for reuse."""
    with _lock:
        return sum(len(v) for v in _cache.values())
