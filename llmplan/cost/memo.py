"""Reuse within one evaluation: memoized (a result once per plan and key) and per_distinct (a result once per
distinct combination of a few plan axes on plan arrays), and the axis groups they are called with.

Split out of cost.params, which re-exports its public names.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np


def memoized(plan: Any, key: tuple, compute: Any) -> Any:
    """compute() once per plan and key (the arrays path evaluates the same split and stage layers for several
    candidate stages; a single plan's estimate reads its layer times and split once per stage). Keys hold the
    objects they depend on, compared by identity (and numbers and strings by value). A single plan's results
    live as long as the plan object (_plan_memo)."""
    memo = getattr(plan, "__dict__", {}).get("memo")  # plan arrays carry theirs (not pydantic's __getattr__)
    same = _same
    if memo is None:
        memo, same = _plan_memo(plan), _same_value
        if memo is None:
            return compute()
    bucket = _bucket(key)  # a hashable digest: the scan below runs over keys with the same numbers and strings
    for k, value in memo.get(bucket, ()):
        if len(k) == len(key) and all(same(a, b) for a, b in zip(k, key, strict=True)):
            return value
    value = compute()
    memo.setdefault(bucket, []).append((key, value))
    return value


def _bucket(key: tuple) -> tuple:
    """memoized's dictionary key for `key`: its numbers and strings by value, any other part by its type (so that
    a plan listing 4,096 stages finds stage i's entry at once, not after scanning the others)."""
    return ("memoized",) + tuple(k if type(k) in (int, float, str, bool) else type(k).__name__ for k in key)


_PLAN_MEMOS: dict[int, dict] = {}
"""memoized's results of single plans, by id(plan); an entry goes when its plan is collected (weakref.finalize),
so an id is never reused while its entry lives. Specs hold no cache themselves."""


def _plan_memo(plan: Any) -> dict | None:
    memo = _PLAN_MEMOS.get(id(plan))
    if memo is None:
        try:
            weakref.finalize(plan, _PLAN_MEMOS.pop, id(plan), None)
        except TypeError:  # an object without weak references: no memo
            return None
        memo = _PLAN_MEMOS[id(plan)] = {}
    return memo


def _same_value(a: Any, b: Any) -> bool:
    """Key parts of a single plan's memo: the same object, or equal numbers / strings (never __eq__ of specs,
    whose array-valued fields, as in accuracy's grid, have no truth value)."""
    return a is b or (type(a) is type(b) and type(a) in (int, float, str, bool) and a == b)


LAYOUT_AXES = ("pp", "vpp", "pp_first", "pp_last")
"""The plan fields that fix which layers each pipeline stage holds."""
ALL_BUT_ZERO = ("tp", "pp", "dp", "cp", "ep", "etp_resolved", "vpp", "pp_first", "pp_last", "sp", "recompute_code",
                "micro_batch")
"""Every searched plan field but the ZeRO stage: what activation memory and a stage's compute time depend on
(on plan arrays they are computed once per distinct combination of these; a search seeds the grouping as it
enumerates, search.grid.enumerate_plans)."""


def per_distinct(plan: Any, columns: tuple[str, ...], stage: Any, f: Any) -> Any:
    """f(plan, stage), computed once per distinct combination of `columns` on plan arrays (search.grid
    PlanArrays.on_distinct): a stage's layers and parameters depend on a few axes, so a few hundred
    evaluations stand for hundreds of thousands of plans. Single plans compute directly."""
    on_distinct = getattr(type(plan), "on_distinct", None)  # on the class: no pydantic __getattr__ per call
    return f(plan, stage) if on_distinct is None else on_distinct(plan, columns, stage, f)


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return False
    return bool(a == b)
