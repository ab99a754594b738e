"""Exported files as a test reads them: each wrapped comment (common.comment_lines, and the indented ones
export.shell_lines moves above a command) joined back onto one line, so a test can look for a note's words
whatever column the 80-column wrap broke them at."""

from __future__ import annotations

import re


def unwrapped(text: str) -> str:
    """`text` with every '#   ' continuation line (indented or not) joined to the comment line above it."""
    return re.sub(r"\n[ \t]*#   ", " ", text)
