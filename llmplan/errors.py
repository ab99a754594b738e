"""Errors that reach the user as one clear line and an exit code (never a traceback)."""

from __future__ import annotations

from typing import Iterable

EXIT_BAD_INPUT = 2
EXIT_NO_FIT = 3


class LlmplanError(Exception):
    """Bad user input: the message says what is wrong, the values, the rule and the fix."""

    exit_code = EXIT_BAD_INPUT


class PlanViolationError(LlmplanError):
    """A plan breaks one or more rules of check_plan; each violation is listed."""

    def __init__(self, violations: list) -> None:
        self.violations = list(violations)
        lines = "\n".join(f"  - {v.message}" for v in self.violations)
        super().__init__(f"the plan breaks {len(self.violations)} rule(s):\n{lines}")


MAX_LISTED = 12
"""Most items an error message lists (valid values, offending entries); the rest are counted."""


def bounded_list(items: Iterable[object], limit: int = MAX_LISTED, sep: str = ", ") -> str:
    """Items for a message, at most `limit` of them, then '... (K more)': a message never grows with the input
    (a million valid --domain-gpus values, 4,096 layer types). A range is not expanded. 'none' when empty."""
    seq = items if isinstance(items, (range, list, tuple)) else list(items)
    if not seq:
        return "none"
    shown = sep.join(str(seq[i]) for i in range(min(len(seq), limit)))
    return shown if len(seq) <= limit else f"{shown}{sep}... ({len(seq) - limit:,} more)"
