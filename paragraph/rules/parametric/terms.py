"""The rule-language terms the parametric rules' proof obligations are written with: a
convolution with the schemas' default parameters, and n-way concats and splits built from
binary ones."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from paragraph.rules.specs import SAME, Term, app


def conv_term(x: Term, w: Term, stride: Any = "s", pad: Any = SAME, act: Any = "c",
              groups: Any = 1) -> Term:
    """``conv2d(x, w)``; parameters are ints or parameter variables (any stride ``s``, any
    activation ``c``, SAME padding and one group unless given)."""
    return app("conv2d", x, w, stride=stride, pad=pad, act=act, groups=groups)


def nested_split(t: Term, n: int, axis: int) -> list[Term]:
    """The n pieces of ``t`` that a left-nested n-way concat along ``axis`` made."""
    if n == 1:
        return [t]
    head = nested_split(app("split", t, axis=axis, out=0), n - 1, axis)
    return head + [app("split", t, axis=axis, out=1)]


def nested_concat(ts: Sequence[Term], axis: int) -> Term:
    """The left-nested concat of ``ts`` along ``axis`` (what `nested_split` takes apart)."""
    out = ts[0]
    for t in ts[1:]:
        out = app("concat", out, t, axis=axis)
    return out


def balanced_concat(ts: Sequence[Term], axis: int) -> Term:
    """The concat of ``ts`` along ``axis`` as a balanced tree of binary concats (halves
    first), the form a split into equal parts proves in."""
    if len(ts) == 1:
        return ts[0]
    half = len(ts) // 2
    return app("concat", balanced_concat(ts[:half], axis), balanced_concat(ts[half:], axis),
               axis=axis)
