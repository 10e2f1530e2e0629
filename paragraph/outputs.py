"""Model outputs compared: how far one run's outputs are from another's (a leaf: numpy only)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def max_difference(expected: Sequence[np.ndarray], got: Sequence[np.ndarray]) -> float:
    """The largest difference between two lists of outputs, relative to ``1 + |expected|``
    (``np.allclose`` with ``rtol = atol``); infinite if their number or shapes differ or a
    value is NaN."""
    if len(expected) != len(got):
        return float("inf")
    worst = 0.0
    for e, g in zip(expected, got, strict=True):
        if e.shape != g.shape:
            return float("inf")
        if e.size:
            d = float(np.max(np.abs(g - e) / (1.0 + np.abs(e))))
            worst = max(worst, d if d == d else float("inf"))  # NaN: never equal
    return worst
