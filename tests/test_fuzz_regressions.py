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
    # NaN and infinities in the inputs (``fuzz.py --special``, its report
    # fuzz-special-cpu.json): TOPI's clip made a NaN its lower bound (relu6 alone, and after a
    # product), and its max reduction dropped a NaN that did not come last
    "special-82-relu6-of-nan": (
        {"seed": 82, "special": True,
         "inputs": [{"shape": [3, 15, 5, 17], "dtype": "float32"}] * 2,
         "steps": [{"op": "unary", "args": [1], "attrs": {"fn": "relu6"},
                    "shape": [3, 15, 5, 17]}], "outputs": [2]},
        [fuzz_run.Combination("tvm", "none", ("sequential",)),
         fuzz_run.Combination("vendor", "none", ("critical-path",))]),
    "special-57-clip-after-a-product": (
        {"seed": 57, "special": True,
         "inputs": [{"shape": [2, 16, 13, 1], "dtype": "float32"}] * 2,
         "steps": [{"op": "matmul", "args": [1], "attrs": {"n": 8}, "shape": [2, 16, 13, 8]},
                   {"op": "unary", "args": [2], "attrs": {"fn": "relu6_clip"},
                    "shape": [2, 16, 13, 8]}], "outputs": [3]},
        [fuzz_run.Combination("tvm", "none", ("sequential",)),
         fuzz_run.Combination("vendor", "none", ("opara",))]),
    "special-84-max-of-a-nan": (
        {"seed": 84, "special": True, "inputs": [{"shape": [9, 1], "dtype": "float32"}],
         "steps": [{"op": "reduce", "args": [0],
                    "attrs": {"fn": "sum", "axes": [1], "keepdims": False}, "shape": [9]},
                   {"op": "reduce", "args": [1],
                    "attrs": {"fn": "max", "axes": [0], "keepdims": True}, "shape": [1]}],
         "outputs": [2]},
        [fuzz_run.Combination("tvm", "none", ("sequential",)),
         fuzz_run.Combination("vendor", "none", ("wavefront",))]),
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
    # outputs made of rounding, flagged by the comparison, not wrong: the mean of rows a layer
    # norm made (nearly constant rows after a hard-sigmoid: 1.5e-4 of the scale from numpy's),
    # and a layer norm over sums of softmax rows, all 16 but for rounding (ONNX Runtime 1e-3
    # from numpy's). Compared now with the spread of float64 references nudged as float32
    # rounds (`fuzz_run.Expected`)
    "seed-3401-mean-of-normalised-rows": (
        {"seed": 3401, "inputs": [{"shape": [2, 7], "dtype": "int64", "high": 5}],
         "steps": [{"op": "embedding", "args": [0], "attrs": {"rows": 5}, "shape": [2, 7, 32]},
                   {"op": "unary", "args": [1], "attrs": {"fn": "hardsigmoid"},
                    "shape": [2, 7, 32]},
                   {"op": "layer_norm", "args": [2], "attrs": {"axes": [-1], "epsilon": 1e-05},
                    "shape": [2, 7, 32]},
                   {"op": "reduce", "args": [3], "attrs": {"fn": "mean", "axes": [1, 2],
                                                            "keepdims": False}, "shape": [2]},
                   {"op": "gather", "args": [4], "attrs": {"axis": 0, "indices": [0, 0, 0]},
                    "shape": [3]}],
         "outputs": [5]},
        [fuzz_run.Combination("tvm", "greedy", ("ios-merge",))]),
    "seed-4027-layer-norm-of-equal-sums": (
        {"seed": 4027, "inputs": [{"shape": [1, 16, 8, 4], "dtype": "float32"}] * 2,
         "steps": [{"op": "softmax", "args": [1], "attrs": {"axis": -1},
                    "shape": [1, 16, 8, 4]},
                   {"op": "reduce", "args": [2], "attrs": {"fn": "sum", "axes": [1, 3],
                                                            "keepdims": False}, "shape": [1, 8]},
                   {"op": "layer_norm", "args": [3], "attrs": {"axes": [-2, -1],
                                                               "epsilon": 0.001},
                    "shape": [1, 8]}],
         "outputs": [4]},
        [fuzz_run.Combination("vendor", "none", ("critical-path",))]),
    # an adaptive pool (windows that vary with the output position: a loop extent that is an
    # expression) fused with a fast tanh (a let): the FLOP count of a kernel with lets took
    # every loop extent for a number (TypeError at compile)
    "seed-5240-adaptive-pool-with-fast-tanh": (
        {"seed": 5240, "inputs": [{"shape": [3, 31, 3, 11], "dtype": "float32"}] * 2,
         "steps": [{"op": "adaptive_avg_pool2d", "args": [1], "attrs": {"output_size": [1, 3]},
                    "shape": [3, 31, 1, 3]},
                   {"op": "unary", "args": [2], "attrs": {"fn": "gelu_tanh_chain"},
                    "shape": [3, 31, 1, 3]},
                   {"op": "softmax", "args": [3], "attrs": {"axis": -1},
                    "shape": [3, 31, 1, 3]}],
         "outputs": [4]},
        [fuzz_run.Combination("tvm", "none", ("sequential",))]),
    # a tensor concatenated with itself (one read region spanning both positions), sliced and
    # gated by a fast sigmoid (a let): the CPU rules vectorised the select between the two
    # reads two lanes wide, across the seam at 9, and TVM's vectorizer bound the let twice
    # ("Let cannot bind the same var to two different values", an InternalError at compile)
    "seed-9115-self-concat-with-fast-sigmoid": (
        {"seed": 9115, "inputs": [{"shape": [1, 16, 4, 9], "dtype": "float32"}],
         "steps": [{"op": "concat", "args": [0, 0], "attrs": {"axis": -1},
                    "shape": [1, 16, 4, 18]},
                   {"op": "strided_slice", "args": [1],
                    "attrs": {"axes": [1], "begin": [10], "end": [16], "strides": [1]},
                    "shape": [1, 6, 4, 18]},
                   {"op": "unary", "args": [2], "attrs": {"fn": "silu_gate"},
                    "shape": [1, 6, 4, 18]}],
         "outputs": [3]},
        [fuzz_run.Combination("tvm", "none", ("sequential",))]),
}


@pytest.mark.parametrize("name", sorted(REGRESSIONS))
def test_minimised_failure_now_matches_the_reference(name):
    recipe, combos = REGRESSIONS[name]
    outcome = fuzz_run.run_case(recipe, combos)
    assert outcome.runs >= len(combos)
    assert not outcome.failures, (fuzz_graphs.describe(recipe),
                                  [f.as_json() for f in outcome.failures])


def test_an_output_made_of_rounding_is_compared_by_how_much_rounding_moves_it():
    """`fuzz_run.Expected`: beyond the tolerance, an output is still equal where it lies within
    `CONDITIONED` times the spread of the nudged float64 references, and only there: a 1e-3
    error of a well-conditioned output (references that agree to 1e-7) is a mismatch."""
    import numpy as np

    e = np.linspace(-1, 1, 50).astype("float32")
    calm = fuzz_run.Expected([e], [[e.astype("float64")], [e.astype("float64") + 1e-8]])
    assert calm.difference([e + 1e-3]) > fuzz_run.TOLERANCE
    assert calm.difference([e + 1e-6]) <= fuzz_run.TOLERANCE
    wild = fuzz_run.Expected([e], [[e.astype("float64")], [e.astype("float64") + 1e-4]])
    assert wild.difference([e + 1e-3]) == 0.0
    assert wild.difference([e + 0.5]) > fuzz_run.TOLERANCE  # 5000 x the spread
    nan = e.copy()
    nan[3] = np.nan
    assert wild.difference([nan]) == float("inf")  # a NaN on one side is never equal
