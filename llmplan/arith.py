"""Arithmetic that works the same on Python scalars and numpy arrays.

The cost functions take a plan whose fields are either Python numbers (ParallelPlan, the scalar path) or
numpy arrays of many plans (search.grid.PlanArrays, the vectorised path). Writing every formula once, with
these helpers instead of `if`, keeps one copy of each formula for both paths.
"""

from __future__ import annotations

from functools import lru_cache
from statistics import NormalDist
from typing import Any

import numpy as np


def where(cond: Any, a: Any, b: Any) -> Any:
    """`a if cond else b`, elementwise when cond is an array."""
    if isinstance(cond, (bool, np.bool_)):
        return a if cond else b
    return np.where(cond, a, b)


def minimum(a: Any, b: Any) -> Any:
    return np.minimum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else min(a, b)


def maximum(a: Any, b: Any) -> Any:
    return np.maximum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else max(a, b)


def expected_max_normal(n: Any) -> Any:
    """Expected largest of n independent standard normal draws (scalar or array of n), by Blom's approximation
    Phi^-1((n - 0.375) / (n + 0.25)) (within 5% of the exact value at n = 2, 1% from n = 10): 0 for one draw,
    1.03 for 4, 2.33 for 64, 3.20 for 1,024, 3.85 for 12,288; it grows as sqrt(2 ln n).
    Source: Blom 1958, Statistical Estimates and Transformed Beta-Variables (normal order statistics)."""
    arr = np.asarray(n)
    if arr.ndim == 0:
        return _blom_max(int(arr))
    values, index = np.unique(arr, return_inverse=True)
    return np.array([_blom_max(int(v)) for v in values])[index].reshape(arr.shape)


@lru_cache(maxsize=4096)
def _blom_max(n: int) -> float:
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25)) if n > 1 else 0.0
