"""The shape every refusal of bad input takes: one line on stderr, no traceback (the brief's error rule)."""

from __future__ import annotations


def one_line(err: str) -> str:
    """The single line of `err`; fails the test if the refusal spans several lines or shows a traceback."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]
