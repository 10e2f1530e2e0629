"""Quickstart: from a Relax model to a multi-stream run, step by step.

Run it with ``python tutorials/quickstart.py`` (add ``--full`` for the full-size model; the
default reduced model takes seconds). Each step is one public API call:

1. get a model (the zoo, or `paragraph.tvm_interop.load` for ONNX / torch / IRModule);
2. look at it as a `paragraph.Graph` and round-trip it back to Relax;
3. lower and compile it once into a kernel graph (TVM's own legalization and fusion);
4. pick a schedule (which stream runs which kernel) and run it on the parallel executor;
5. compare with the TVM VM on the same kernels;
6. search an IOS schedule: stages measured on this device and cached in the cost database
   (``~/.cache/paragraph``, or ``$PARAGRAPH_CACHE_DIR``), so a second run searches in a blink.
"""

from __future__ import annotations

import sys

import numpy as np

from paragraph import models
from paragraph.passes.ios import IOSOptions
from paragraph.passes.schedule import ALGORITHMS
from paragraph.planner import plan_schedule, tolerance
from paragraph.timing import time_calls
from paragraph.tvm_interop import from_relax, random_inputs, to_relax
from paragraph.tvm_interop.build.program import build_program
from paragraph.tvm_interop.runtime.executor import make_executor
from paragraph.tvm_interop.runtime.vm import run_vm


def main(full: bool = False) -> None:
    # 1. A model: Inception-v3 as a Relax IRModule with seeded weights.
    mod = models.get("inception_v3", reduced=not full)

    # 2. The graph IR: immutable nodes with kinds, attributes and types; a canonical hash.
    graph = from_relax(mod)
    print(graph.summary())
    print("structural hash:", graph.structural_hash()[:16])
    length, path = graph.longest_path({n.id: 1.0 for n in graph.operators})
    print(f"longest chain: {int(length)} of {len(graph.operators)} operators")
    roundtrip = to_relax(graph)  # the same computation, back in Relax

    # 3. Lower once: every fused kernel compiled into one module, and a graph of kernels.
    program = build_program(roundtrip, "cpu")
    print(f"{len(program.kernels)} kernels after TVM's fusion")

    # 4. Schedules: where each kernel runs and what it waits for. critical-path times each
    #    kernel on one thread in model order first (cached in the cost database) and
    #    balances the streams by those times; the others place kernels by the graph's shape.
    #    A plan is a value: the program to run, its schedule, and a report of the planning.
    inputs = random_inputs(mod)
    expected = run_vm(program.vm(), inputs)
    for name in ALGORITHMS:
        # critical-path may hand back a program with lone convolutions split across streams
        # (the verified library rule split-conv-2: program.rewrites names it)
        plan = plan_schedule(name, program)
        schedule = plan.schedule
        with make_executor(plan.program, schedule) as executor:
            out = executor.run(*inputs)
            tol = tolerance(plan.program)  # looser where rewrites change the rounding
            np.testing.assert_allclose(out[0], expected[0], rtol=tol, atol=tol,
                                       err_msg="the executor must match the VM")
            timing = time_calls(lambda: executor.run(*inputs, copy_outputs=False), 5)
        print(f"{schedule.describe()}\n    median {timing.median_ms:.2f} ms, "
              f"memory {executor.plan.summary()}")

    # 5. The TVM VM over the same kernels, for reference.
    vm = program.vm()
    timing = time_calls(lambda: run_vm(vm, inputs), 5)
    print(f"TVM VM: median {timing.median_ms:.2f} ms")

    # 6. IOS: dynamic programming over stages, each stage timed on the device. A quick
    #    measurement protocol here; the default (2 warm-ups, 6 repeats of 6 runs) is IOS's.
    options = IOSOptions(mode="both", warmup=1, repeat=2, number=1)
    plan = plan_schedule("ios", program, options=options, log=print)
    program, schedule = plan.program, plan.schedule
    with make_executor(program, schedule) as executor:  # merges may have rebuilt the program
        out = executor.run(*inputs)
        np.testing.assert_allclose(out[0], expected[0], rtol=1e-4, atol=1e-5)
        timing = time_calls(lambda: executor.run(*inputs, copy_outputs=False), 5)
    print(f"{schedule.describe()}\n    median {timing.median_ms:.2f} ms")


if __name__ == "__main__":
    main(full="--full" in sys.argv)
