"""Failures the differential fuzzer found (``benchmarks/fuzz.py``, docs/fuzzing.md), each as its
minimised graph: a recipe that `fuzz_graphs.module` builds, run through the combination it
failed in and compared with the numpy reference of the original graph. The seed that found it
and the commit that fixed it are in ``benchmarks/results/fuzz-cpu.json``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
if str(BENCHMARKS) not in sys.path:  # the benchmarks import each other as scripts do
    sys.path.insert(0, str(BENCHMARKS))

import fuzz_graphs  # noqa: E402
import fuzz_run  # noqa: E402


def _one_step(shape: list[int], op: str, out: list[int], **attrs: object) -> dict:
    return {"seed": 0, "inputs": [{"shape": shape, "dtype": "float32"}],
            "steps": [{"op": op, "args": [0], "attrs": attrs, "shape": out}], "outputs": [1]}


# seed -> (what it was, the minimised recipe, the combinations it is run through)
REGRESSIONS = {
    # a ceil_mode pool whose last window would start past the input: Relax drops it (16
    # columns), paragraph's shape function kept it (17), so the import raised a GraphError
    "seed-252-ceil-mode-pool": (
        _one_step([1, 2, 3, 32], "avg_pool2d", [1, 2, 2, 16], pool_size=[1, 1],
                  strides=[2, 2], padding=[0, 0, 0, 0], ceil_mode=True,
                  count_include_pad=False),
        [fuzz_run.Combination("tvm", "none", ("sequential",)),
         fuzz_run.Combination("vendor", "none", ("critical-path",))]),
    # a program of views alone (two reshapes of the input, both outputs) has no kernel, so
    # IOS planned no stage, and its views' stage 0 did not exist: "stages must partition the
    # kernels" (a ScheduleError) under every IOS schedule
    "seed-1337-views-only-ios": (
        {"seed": 0, "inputs": [{"shape": [13, 16, 3], "dtype": "float32"}],
         "steps": [{"op": "reshape", "args": [0], "attrs": {"shape": [13, 4, 4, 3]},
                    "shape": [13, 4, 4, 3]},
                   {"op": "reshape", "args": [0], "attrs": {"shape": [13, 48]},
                    "shape": [13, 48]}],
         "outputs": [1, 2]},
        [fuzz_run.Combination("vendor", "none", ("ios-parallel", "ios")),
         fuzz_run.Combination("tvm", "none", ("ios-merge",))]),
}


@pytest.mark.parametrize("name", sorted(REGRESSIONS))
def test_minimised_failure_now_matches_the_reference(name):
    recipe, combos = REGRESSIONS[name]
    outcome = fuzz_run.run_case(recipe, combos)
    assert outcome.runs >= len(combos)
    assert not outcome.failures, (fuzz_graphs.describe(recipe),
                                  [f.as_json() for f in outcome.failures])
