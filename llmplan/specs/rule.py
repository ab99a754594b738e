"""The shape of check_plan's rules (Rule: a name, an elementwise predicate, a message) and of what they report
(Violation). The rules are grouped by concern in specs/check_heads.py, check_pipeline.py, check_experts.py and
check_switches.py; specs/check.py assembles them, in order, into RULES and runs them (check_plan)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from llmplan.specs.model import ModelSpec


@dataclass(frozen=True)
class Violation:
    """One broken rule."""

    rule: str
    """Short identifier of the rule (stable; search counts pruned plans per rule)."""
    message: str
    """What is wrong, the values, the rule and the fix."""


Pred = Callable[[ModelSpec, Any, Any], Any]
Msg = Callable[[ModelSpec, Any, Any], str]


@dataclass(frozen=True)
class Rule:
    """One check_plan rule: a predicate over (model, plan, cluster) and the message when it fails."""

    name: str
    """Short identifier (Violation.rule; stable: search counts pruned plans per rule)."""
    ok: Pred
    """True (elementwise) where the plan keeps the rule."""
    message: Msg
    """What is wrong, the values, the rule and the fix, for one plan that breaks it."""
    needs_cluster: bool = False
    """The rule reads the cluster (c): skipped when check_plan is given none."""


def as_bool(x: Any) -> Any:
    """A predicate's value as a bool or bool array (so `~` negates it on both paths)."""
    import numpy as np

    return np.asarray(x, dtype=bool)
