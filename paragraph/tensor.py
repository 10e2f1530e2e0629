"""Tensor types and references: the two values that operator specs (`paragraph.ops`) and the
graph IR (`paragraph.graph`) share, kept below both so that neither imports the other's
users."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np


@cache
def _itemsize(dtype: str) -> int:
    return np.dtype(dtype).itemsize


@dataclass(frozen=True)
class TensorType:
    """Static shape and dtype of one tensor."""

    shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * _itemsize(self.dtype)

    def __str__(self) -> str:
        return f"{self.dtype}[{'x'.join(map(str, self.shape))}]"


@dataclass(frozen=True)
class TensorRef:
    """One output (``index``) of one node (``node``, its id)."""

    node: int
    index: int = 0

    def __str__(self) -> str:
        return f"%{self.node}" + (f".{self.index}" if self.index else "")
