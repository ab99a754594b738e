"""Errors that reach the user as one clear line and an exit code (never a traceback)."""

from __future__ import annotations

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
