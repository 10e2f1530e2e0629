"""``--kernels auto``: per distinct vendor call, the faster of the vendor kernel and TVM's
kernel for the same maths, by measurement (cached in the cost database)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import tvm
from tvm import relax

from paragraph.errors import ParagraphError
from paragraph.machine import cpu_count
from paragraph.progress import Log
from paragraph.schedule import Schedule, kernel_ids
from paragraph.tvm_interop.build.dispatch import (
    probe_module,
    signature,
    undispatch,
    vendor_calls,
)
from paragraph.tvm_interop.build.lowering import kernel_graph, lower
from paragraph.tvm_interop.build.tuning_db import tuning_id
from paragraph.tvm_interop.measure.costdb import CostDB
from paragraph.tvm_interop.measure.device import kernel_key, time_kernel
from paragraph.tvm_interop.runtime.executor import make_executor
from paragraph.tvm_interop.runtime.memory import no_reuse_plan
from paragraph.tvm_interop.runtime.target import is_cpu

if TYPE_CHECKING:  # programs are built above this module (see `choose_fastest`)
    from paragraph.tvm_interop.runtime.program import KernelProgram


Build = Callable[[tvm.IRModule], "KernelProgram"]


def choose_fastest(mod: tvm.IRModule, target: tvm.target.Target, *, build: Build,
                   tuning_db: str | None = None, db: CostDB | None = None, repeat: int = 5,
                   log: Log | None = None) -> tvm.IRModule:
    """Keep each vendor call of ``mod`` only where it beats TVM's kernel for the same maths.

    Every distinct call (function name and argument types) is built twice into one probe
    module each: as the vendor call and as Relax operators that TVM fuses (with ``tuning_db``
    applied). Each kernel is timed once on the device with `measure.time_kernel` and recorded
    in the cost database (``db``, default `CostDB()`) under its source, "vendor" or "tvm"; a
    later choice with the same kernels reads the costs and compiles nothing. Cost is bounded
    by the number of distinct calls, not of calls. ``build`` compiles a probe module as it is
    (`build_program` with TVM kernels, which passes itself: programs are built above
    this module).
    """
    if not vendor_calls(mod):
        return mod
    db = db if db is not None else CostDB()
    calls: dict[tuple, relax.Call] = {}
    for call in vendor_calls(mod):
        calls.setdefault(signature(call), call)
    sigs = list(calls)
    cost = {}
    for source in ("vendor", "tvm"):
        probe = probe_module([calls[s] for s in sigs], tvm_form=source == "tvm")
        cost[source] = _probe_costs(probe, target, source, tuning_db, db, repeat, build, log)
    keep = {s for s, v, t in zip(sigs, cost["vendor"], cost["tvm"], strict=True) if v <= t}
    if log is not None:
        log(f"  auto: {len(sigs)} distinct vendor-able kernels; vendor faster for {len(keep)}, "
            f"TVM for {len(sigs) - len(keep)} (vendor {sum(cost['vendor']) * 1e3:.2f} ms, "
            f"TVM {sum(cost['tvm']) * 1e3:.2f} ms, one of each)")
    return undispatch(mod, lambda call: signature(call) in keep)


def _probe_costs(probe: tvm.IRModule, target: tvm.target.Target, source: str,
                 tuning_db: str | None, db: CostDB, repeat: int, build: Build,
                 log: Log | None) -> list[float]:
    """Seconds of each output of ``probe``: the sum of the kernels it needs (cached, or built
    once and timed one kernel at a time)."""
    graph = kernel_graph(lower(probe, target, tuning_db))
    threads = int(target.attrs.get("num-cores", cpu_count())) if is_cpu(target) else 1
    tuning = tuning_id(tuning_db)

    def key(k: int):
        return kernel_key(str(target), graph[k], tuning, threads)

    kernels = [k for k in kernel_ids(graph) if graph[k].kind == "kernel"]
    cached = {k: db.get(key(k)) for k in kernels}
    seconds = {k: v for k, v in cached.items() if v is not None}
    missing = [k for k, v in cached.items() if v is None]
    if missing:
        if log is not None:
            log(f"  auto: timing {len(missing)} {source} kernels ...")
        program = build(probe)
        if [n.attrs.get("hash") for n in program.graph.nodes] != [
                n.attrs.get("hash") for n in graph.nodes]:
            raise ParagraphError("the probe module lowered differently twice")
        schedule = Schedule.build(program.graph, [kernel_ids(program.graph)], threads=threads)
        # every tensor in its own buffer, filled by one run: a kernel timed alone reads what
        # the model gives it (an index that a reused buffer left as floats would crash a take)
        executor = make_executor(program, schedule, use_cuda_graph=False,
                                 plan=no_reuse_plan(program.graph))
        sync = None if is_cpu(target) else program.device.sync
        try:
            executor.run(*[t.numpy() for t in executor.inputs], copy_outputs=False)
            for k in missing:
                timing = time_kernel(executor.steps[k], threads=threads, repeat=repeat,
                                     warmup=1, sync=sync)
                db.put(key(k), timing)
                seconds[k] = timing.median_ms / 1e3
        finally:
            executor.close()
    result = []
    for ref in graph.outputs:
        needed = graph.ancestors(ref.node) | {ref.node}
        result.append(sum(seconds.get(k, 0.0) for k in needed))
    return result
