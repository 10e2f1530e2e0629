"""Whole runs of programs side by side, and what counts as the same answer.

`time_runs` times candidate ``(program, schedule)`` pairs end to end on this machine's
executor, in alternating blocks, and caches each comparison in the cost database so that a
choice made from it is made again the same way; `tolerance` and `require_equal` decide whether
two programs compute the same outputs. Both the planner and tuning's model check choose from
these (`paragraph.timing.clearly_faster` says when a choice is faster beyond noise).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Sequence
from functools import partial

import numpy as np

from paragraph.errors import ParagraphError
from paragraph.inputs import sample_inputs
from paragraph.machine import LoadWatch, wait_for_quiet_cores
from paragraph.outputs import max_difference
from paragraph.schedule import Schedule
from paragraph.timing import Config, Timing, time_in_blocks
from paragraph.tvm_interop.measure.costdb import CostDB, CostKey
from paragraph.tvm_interop.measure.device import SETTLE_RUNS, uses_vendor, vendor_tag
from paragraph.tvm_interop.runtime.executor import make_executor
from paragraph.tvm_interop.runtime.library.native import timing_kernels
from paragraph.tvm_interop.runtime.program import KernelProgram

Candidates = Sequence[tuple[KernelProgram, Schedule]]

# seconds `time_runs` waits for quiet cores before it times again a comparison that another
# process disturbed (ResNet-50's critical-path planner chose two 1-thread streams, 69 ms, over
# one stream of two threads, 43 ms, while a test suite ran beside it)
QUIET_WAIT_S = 30.0
# a timed block lasts at least this long (at most MAX_BLOCK runs): blocks of five runs of a
# 0.3 ms encoder gave 0.52 against 0.43 ms where 200 runs back to back gave 0.39 against 0.25,
# and the slower schedule was kept
MIN_BLOCK_S = 0.01
MAX_BLOCK = 200
# the timed runs of one comparison last about this long at most (at least 3 rounds of one run
# each): GPT-2's 130 ms runs took 6 rounds of 5 per candidate, 10 s a comparison, and a build
# makes several
COMPARISON_BUDGET_S = 4.0
# warm-up runs before a candidate is timed (`paragraph.tvm_interop.measure.device.SETTLE_RUNS`):
# fewer timed a rewritten candidate's new shapes partly on their slower forms, against an input
# whose shapes had settled


def plan_digest(schedule: Schedule) -> str:
    """What a run's time depends on: streams, thread counts, stage barriers and the kernels
    capped to fewer threads (only where there are some: older digests stay valid)."""
    plan: list = [list(map(list, schedule.streams)), list(schedule.threads),
                  [list(st) for st in schedule.stages or ()]]
    if schedule.kernel_threads:
        plan.append(sorted(map(list, schedule.kernel_threads.items())))
    return hashlib.blake2b(json.dumps(plan).encode(), digest_size=16).hexdigest()


def time_runs(candidates: Candidates, db: CostDB | None, tuning: str, repeat: int = 6,
              warmup: int = 2, check: bool = False, block: int = 5) -> list[float]:
    """Median seconds of whole runs of each ``(program, schedule)`` on this machine's executor:
    after a warm-up block each, ``repeat`` rounds (in forward, then reverse order) running
    every candidate once untimed and then ``block`` times timed, more where a block would last
    under `MIN_BLOCK_S` (a candidate's steady state, which strict alternation disturbs:
    `paragraph.timing.time_in_blocks`), cached in ``db`` (a `CostDB` or None) for this
    comparison (these candidates in this order) so that choices made from them are
    deterministic. With ``check``, the candidates' outputs on one random input must agree
    (`require_equal`): a rewrite that changed the model is a bug, not a slower choice. Timed
    while another process held a core (`LoadWatch`), the comparison is timed once more after
    waiting up to `QUIET_WAIT_S` for quiet cores, and cached only if that one was quiet."""
    runs = [f"{p.graph.structural_hash()}:{plan_digest(s)}" for p, s in candidates]
    # a time is cached for this comparison only: times are comparable within one comparison,
    # and a candidate's time stored by a later comparison (the critical-path planner compares
    # the program it kept with the pools moved, then with its lone convolutions split) made a
    # replayed decision read times from two different comparisons, and flip
    beside = hashlib.sha256("|".join(runs).encode()).hexdigest()[:16]
    keys = [CostKey(str(p.target), "run:" + (f"in:{beside}:" if len(runs) > 1 else "") + run,
                    tuning, ",".join(sorted(p.sources())),
                    f"blocks={repeat}x{block}>={MIN_BLOCK_S}s,w{SETTLE_RUNS}"
                    f"{vendor_tag(p.sources())}")
            for run, (p, s) in zip(runs, candidates, strict=True)]
    seconds = [db.get(k) if db is not None else None for k in keys]
    if None not in seconds and not check:
        return [s for s in seconds if s is not None]
    samples: list[list[float]] = [[] for _ in candidates]
    executors = [make_executor(p, s, use_cuda_graph=True) for p, s in candidates]
    try:
        graph = candidates[0][0].graph
        if check:
            inputs = sample_inputs([graph[i].type for i in graph.inputs],
                                   candidates[0][0].input_ranges)
            outs = [[np.asarray(o) for o in ex.run(*inputs)] for ex in executors]
            require_equal(candidates, [max_difference(outs[0], got) for got in outs])
            if None not in seconds:
                return [s for s in seconds if s is not None]
        inputs = [np.zeros(graph[i].type.shape, graph[i].type.dtype) for i in graph.inputs]
        configs = [Config(str(i), partial(ex.run, *inputs, copy_outputs=False), samples=got)
                   for i, (ex, got) in enumerate(zip(executors, samples, strict=True))]
        fastest = float("inf")
        # in turn, a whole block at least (a process's first runs are slow), then on until no
        # C++ vendor kernel is still timing its forms (at most SETTLE_RUNS rounds): kernels
        # another comparison settled start with their forms (31 runs of each of ViT-B/16's
        # candidates, 130 ms each, were most of its 127 s build)
        vendor = any(uses_vendor(p.sources()) for p, _ in candidates)
        for done in range(1, max(1, warmup, block, SETTLE_RUNS) + 1):
            for c in configs:
                start = time.perf_counter()
                c.run()
                fastest = min(fastest, time.perf_counter() - start)
            if done >= max(1, warmup, block) and (not vendor or timing_kernels() == 0):
                break
        block = max(block, min(MAX_BLOCK, math.ceil(MIN_BLOCK_S / max(fastest, 1e-6))))
        rounds = max(3, repeat)
        per_round = len(configs) * max(fastest, 1e-6)
        if rounds * block * per_round > COMPARISON_BUDGET_S:  # a slow model: fewer runs
            block = max(1, min(block, math.floor(COMPARISON_BUDGET_S / (3 * per_round))))
            rounds = max(3, min(rounds, math.floor(COMPARISON_BUDGET_S / (block * per_round))))
        for attempt in range(2):
            if attempt:  # another process held a core: once more when the cores are quiet
                wait_for_quiet_cores(lambda _msg: None, QUIET_WAIT_S)
                for x in samples:
                    x.clear()
            with LoadWatch() as watch:
                for r in range(rounds):  # drifts hit both orders
                    time_in_blocks(configs if r % 2 == 0 else configs[::-1], 1,
                                   max(1, block), settle=1)
            if not watch.contended:
                break
    finally:
        for ex in executors:
            ex.close()
    if db is not None and not watch.contended:  # a loaded moment's choice is not kept
        for key, x in zip(keys, samples, strict=True):
            db.put(key, Timing(tuple(x)))
    return [float(np.median(x)) for x in samples]


def require_equal(candidates: Candidates, diffs: Sequence[float], where: str = "") -> None:
    """`ParagraphError` unless each candidate's outputs are within `tolerance` of the first's
    (``diffs``: each one's `max_difference` from the first's)."""
    tol = max(tolerance(p) for p, _ in candidates)
    for (p, _), worst in zip(candidates[1:], diffs[1:], strict=True):
        if not worst <= tol:
            what = f" ({', '.join(p.rewrites)})" if p.rewrites else ""
            raise ParagraphError(f"the rewritten program{what} does not compute the model's "
                                 f"outputs{where}: max difference {worst:.3g}")


def tolerance(program: KernelProgram) -> float:
    """How closely ``program``'s outputs must match the model's (relative and absolute):
    1e-5, or float32 accumulation error (1e-4) where its kernels round differently from TVM's
    own: vendor kernels (with batch norm folded into their weights) or a program rewritten by
    library rules (merged or split convolutions)."""
    return 1e-5 if program.kernel_source == "tvm" and not program.rewrites else 1e-4
