"""Model outputs compared: how far one run's outputs are from another's (a leaf: numpy only)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# an output's scale is at least this: below it, differences are measured absolutely (an
# output that is all zeros has no scale of its own)
SCALE_FLOOR = 1e-3


def max_difference(expected: Sequence[np.ndarray], got: Sequence[np.ndarray]) -> float:
    """The largest difference between two lists of outputs, each output's relative to its
    scale, ``max |expected|`` (at least `SCALE_FLOOR`); infinite if their number or shapes
    differ or a value is NaN where the other is not.

    Not ``1 + max |expected|``, as it was: that let a 10% error pass on outputs of softmax
    size (probabilities of 1e-3). Per output, not per element: float32 rounding error grows
    with the magnitudes summed, not with the element compared, so an element near zero among
    logits of 30 differs by what its neighbours do (public Inception-v3 with random weights:
    2e-4 per element after moving its pools, 1e-6 of the output's scale)."""
    if len(expected) != len(got):
        return float("inf")
    worst = 0.0
    for e, g in zip(expected, got, strict=True):
        if e.shape != g.shape:
            return float("inf")
        if e.size:
            e64, g64 = np.asarray(e, np.float64), np.asarray(g, np.float64)
            nan_e, nan_g = np.isnan(e64), np.isnan(g64)
            if np.any(nan_e != nan_g):
                return float("inf")  # a NaN on one side only: never equal
            finite = np.isfinite(e64) & np.isfinite(g64)
            if np.any((e64 != g64) & ~finite & ~nan_e):
                return float("inf")  # infinities that differ
            if not np.any(finite):
                continue
            scale = max(float(np.max(np.abs(e64[finite]))), SCALE_FLOOR)
            worst = max(worst, float(np.max(np.abs(g64[finite] - e64[finite]))) / scale)
    return worst
