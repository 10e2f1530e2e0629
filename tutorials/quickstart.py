"""Quickstart: build a model with ``paragraph.build``, check it, time it, try the schedules,
export it as one file and load it back.

Run it with ``python tutorials/quickstart.py`` (add ``--full`` for the full-size model; the
default reduced model keeps Inception-v3's topology at small sizes and builds in a minute or
two). Everything here is public API:

1. a model: ``paragraph.models.get`` returns a Relax IRModule (``paragraph.build`` also takes
   an ONNX path or a torch module);
2. ``paragraph.build(mod)``: lower, fuse and compile the kernels for this CPU, then plan a
   schedule (which stream runs which kernel, in what order, waiting for what);
3. ``exe.run`` on numpy inputs, checked against ``exe.vm()``, the TVM VM over the same kernels;
4. ``exe.time()``: the median of repeated runs;
5. the same model under several ``schedule=`` values (measured schedules time kernels or
   stages on this machine first, cached in ``~/.cache/paragraph`` or ``$PARAGRAPH_CACHE_DIR``);
6. ``exe.export_library`` writes one file; ``paragraph.load`` reads it back.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import tvm

import paragraph
from paragraph import models

SCHEDULES = ("sequential", "wavefront", "opara", "nimble", "critical-path", "ios")
TOLERANCE = 1e-4  # vendor kernels and rewrites round float32 differently from TVM's kernels


def vm_outputs(vm: Any, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Run a TVM VM (``exe.vm()``: the TVM VM over the same kernels) on numpy inputs."""
    return flatten(vm["main"](*[tvm.runtime.tensor(a, tvm.cpu()) for a in inputs]))


def flatten(out: Any) -> list[np.ndarray]:
    """A VM result (a tensor or nested tuples of them) as a list of numpy arrays."""
    if hasattr(out, "numpy"):
        return [out.numpy()]
    return [a for item in out for a in flatten(item)]


def same(actual: list[np.ndarray], expected: list[np.ndarray]) -> None:
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        np.testing.assert_allclose(a, e, rtol=TOLERANCE, atol=TOLERANCE)


def main(full: bool = False, schedules: tuple[str, ...] = SCHEDULES) -> None:
    # 1. A model: Inception-v3 as a Relax IRModule with seeded weights.
    mod = models.get("inception_v3", reduced=not full)

    # 2-4. Build with the defaults but one schedule, run, check against the TVM VM, time.
    #      The kernels are compiled once per process; later builds reuse them.
    with paragraph.build(mod, schedule="sequential") as exe:
        print(f"built: {exe!r}")
        x = exe.sample_inputs(seed=0)  # seeded inputs of the right shapes
        vm = exe.vm()
        expected = vm_outputs(vm, x)
        same(exe.run(*x), expected)
        # A vendor kernel tries its forms on its first few dozen calls and keeps the fastest
        # for its shape: warm up before timing anything.
        for _ in range(40):
            exe.run(*x)
        times = []
        for _ in range(6):
            start = time.perf_counter()
            vm_outputs(vm, x)
            times.append(time.perf_counter() - start)
        print(f"TVM VM: {np.median(times[1:]) * 1e3:.2f} ms a run (median of 5, the same "
              "kernels one after another)")

    # 5. The schedules. critical-path times each kernel on one thread once and balances the
    #    streams by those times (it may split a lone convolution across them, a verified rule:
    #    exe.rewrites names it); ios searches IOS's stages, each timed on this machine.
    for name in schedules:
        with paragraph.build(mod, schedule=name) as exe:
            same(exe.run(*x), expected)
            timing = exe.time(*x, repeat=10)
            rules = sorted({r.split(":")[0] for r in exe.rewrites})  # "rule: where" each
            rewrites = f"; rewrites: {', '.join(rules)}" if rules else ""
            print(f"schedule={name!r}: {exe.schedule.describe()}{rewrites}\n"
                  f"    median {timing.median_ms:.2f} ms, same outputs as the TVM VM")
    print(f"schedules run: {', '.join(schedules)}")

    # 6. One file to ship: kernels, weights, schedule, memory plan and a manifest. Load it in
    #    any process with the same paragraph and TVM, on the same kind of CPU: nothing is
    #    searched, planned or unpickled (it holds a shared library: load only files you trust).
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "inception.paragraph"
        with paragraph.build(mod) as exe:  # the default schedule, critical-path
            exe.export_library(path)
        print(f"exported {path.name}: {path.stat().st_size / 2**20:.1f} MiB")
        with paragraph.load(path) as loaded:
            same(loaded.run(*x), expected)
            print(f"loaded: {loaded.schedule.describe()}, same outputs, median "
                  f"{loaded.time(*x, repeat=10).median_ms:.2f} ms")


if __name__ == "__main__":
    main(full="--full" in sys.argv)
