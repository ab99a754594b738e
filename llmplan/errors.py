"""Errors that reach the user as one clear line and an exit code (never a traceback)."""

from __future__ import annotations

from typing import Iterable

EXIT_BAD_INPUT = 2
EXIT_NO_FIT = 3


class LlmplanError(Exception):
    """Bad user input: the message says what is wrong, the values, the rule and the fix."""

    exit_code = EXIT_BAD_INPUT


class PlanViolationError(LlmplanError):
    """A plan breaks one or more rules of check_plan: one violation is the one line of bad input, several are
    listed one a line."""

    def __init__(self, violations: list) -> None:
        self.violations = list(violations)
        if len(self.violations) == 1:
            super().__init__(f"the plan breaks a rule: {self.violations[0].message}")
            return
        lines = "\n".join(f"  - {v.message}" for v in self.violations)
        super().__init__(f"the plan breaks {len(self.violations)} rule(s):\n{lines}")


MAX_LISTED = 12
"""Most items an error message lists (valid values, offending entries); the rest are counted."""


def bounded_list(items: Iterable[object], limit: int = MAX_LISTED, sep: str = ", ") -> str:
    """Items for a message, at most `limit` of them: the first ones, '... (K more)', and the last two (the end of
    a range of valid values matters as much as its start), so that a message never grows with the input (a
    million valid --domain-gpus values, 4,096 layer types). A range is not expanded. 'none' when empty."""
    seq = items if isinstance(items, (range, list, tuple)) else list(items)
    n = len(seq)
    if n <= limit:
        return sep.join(str(x) for x in seq) if n else "none"
    head, tail = max(limit - 2, 1), 2
    return sep.join([*(str(seq[i]) for i in range(head)), f"... ({n - head - tail:,} more)",
                     *(str(seq[i]) for i in range(n - tail, n))])



SHOWN = 60
"""Most characters of a value a not_one_of line shows; a longer one is cut and marked with '...'."""


def shown(value: object, limit: int = SHOWN) -> str:
    """A value as an error line shows it: as given, or quoted (repr) where plain text would hide it (empty,
    blank at either end, a control character: a line break would split the one line); at most `limit`
    characters, a cut marked with '...'."""
    text = str(value)
    if not text or text != text.strip() or not text.isprintable():
        text = repr(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def not_one_of(flag: str, value: object, allowed: Iterable[object], what: str | None = None,
               give: str | None = None) -> str:
    """The one line for an option given a value outside its set (an enum flag: --kv-dtype fp4): the flag and
    value (errors.shown), what the flag names (`what`, where the caller knows it), the accepted values and the
    fix: the one accepted value equal to the one given but for case and blanks at either end, else the one alike
    to it (difflib's similarity, at least 0.5), else any of them. Every enum flag answers in these words
    (specs.registry.validation_message for the flags a spec's Literal checks, and for a spec file's field:
    `give` the words of the fix before the value, "set norm_type:", instead of "give FLAG")."""
    import difflib
    choices = [str(a) for a in allowed]
    text = str(value)
    folded = [c for c in choices if c.casefold() == text.strip().casefold()]
    near = folded if len(folded) == 1 else difflib.get_close_matches(text[:SHOWN], choices, n=1, cutoff=0.5)
    lead = give or f"give {flag}"
    fix = f"{lead} {near[0]}" if near else f"{lead} one of them" if give else f"give {flag} with one of them"
    return (f"{flag} {shown(value)}{f' is not {what}' if what else ''}: it must be one of {bounded_list(choices)}; "
            f"{fix}")
