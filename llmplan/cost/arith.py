"""Arithmetic that works the same on Python scalars and numpy arrays.

The cost functions take a plan whose fields are either Python numbers (ParallelPlan, the scalar path) or
numpy arrays of many plans (search.grid.PlanArrays, the vectorised path). Writing every formula once, with
these helpers instead of `if`, keeps one copy of each formula for both paths.
"""

from __future__ import annotations

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
