"""How far two runs' outputs are apart (`paragraph.outputs.max_difference`)."""

import numpy as np

from paragraph.outputs import max_difference


def test_the_difference_is_relative_to_each_outputs_scale():
    """An element near zero among large ones may differ by what rounding of the large ones
    gives; each output is measured against its own scale."""
    logits = np.array([30.0, -25.0, 1e-6], np.float32)
    near = logits + np.array([0.0, 0.0, 2e-4], np.float32)
    small = np.array([1e-3, 2e-3], np.float32)
    assert max_difference([logits, small], [near, small]) < 1e-5
    assert max_difference([small], [small * 1.5]) > 4e-4  # a small output keeps its own scale
    assert max_difference([logits], [logits * 1.01]) > 9e-3


def test_nan_and_infinity_are_equal_only_where_both_have_them():
    a = np.array([1.0, np.nan, np.inf, -np.inf], np.float32)
    assert max_difference([a], [a.copy()]) == 0.0
    for i, v in ((0, np.nan), (1, 0.0), (2, 1.0), (3, np.inf)):
        b = a.copy()
        b[i] = v
        assert max_difference([a], [b]) == float("inf")


def test_outputs_of_other_number_or_shape_never_agree():
    x = np.zeros((2, 3), np.float32)
    assert max_difference([x], [x, x]) == float("inf")
    assert max_difference([x], [x.reshape(3, 2)]) == float("inf")
    assert max_difference([np.full(2, np.nan)], [np.full(2, np.nan)]) == 0.0


def test_a_ten_percent_error_on_probabilities_is_seen():
    """Softmax outputs over 1,000 classes are about 1e-3 each: measured against ``1 + max``,
    a 10% error on every one of them passed a 1e-4 tolerance."""
    p = np.full(1000, 1e-3, np.float32)
    assert max_difference([p], [p * 1.1]) > 1e-2
    assert max_difference([np.zeros(4, np.float32)], [np.full(4, 1e-8, np.float32)]) < 1e-4
