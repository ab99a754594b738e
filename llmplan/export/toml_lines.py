"""Exported TOML fitted to 80 columns (the brief's output rule) without changing a value it sets.

A setting's trailing comment that does not fit moves onto comment lines of its own above the setting (TOML
comments run from '#' to the end of a line, outside strings). A setting still too long whose value is an array
is written over several lines, its elements at 4 more columns (TOML arrays may span lines; a trailing comma is
allowed: TOML 1.0.0, "Array"), an element array that does not fit broken the same way. Strings are never split.
A line this reader cannot follow (a multi-line string, a quote left open, a value that is not a whole array)
is left as written.
"""

from __future__ import annotations

import textwrap

WIDTH = 80
INDENT = "    "
"""Elements of a broken array start 4 columns in from the line that opens it."""


def _string_end(text: str, i: int) -> int:
    """Index of the quote that closes the TOML string opening at text[i] (basic '"' with backslash escapes,
    literal "'" without), -1 if none on the line."""
    j = i + 1
    while j < len(text):
        if text[i] == '"' and text[j] == "\\":
            j += 2
            continue
        if text[j] == text[i]:
            return j
        j += 1
    return -1


def _split(line: str) -> tuple[str, str] | None:
    """(code, trailing comment) of one line, the comment '' if none; None where a string is multi-line or left
    open."""
    i = 0
    while i < len(line):
        if line[i] in "\"'":
            end = -1 if line.startswith(line[i] * 3, i) else _string_end(line, i)  # a multi-line string
            if end < 0:
                return None
            i = end + 1
            continue
        if line[i] == "#":
            return line[:i].rstrip(), line[i:]
        i += 1
    return line.rstrip(), ""


def _elements(array: str) -> list[str] | None:
    """The top-level elements of the array literal `array` ('[' ... ']'), each stripped; None where it is not one
    whole array (brackets and braces unbalanced, or anything after its closing ']')."""
    depth, start, out, i = 0, 1, [], 0
    while i < len(array):
        c = array[i]
        if c in "\"'":
            end = _string_end(array, i)
            if end < 0:
                return None
            i = end + 1
            continue
        if c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
            if depth == 0 and i != len(array) - 1:
                return None
        elif c == "," and depth == 1:
            out.append(array[start:i].strip())
            start = i + 1
        i += 1
    if depth != 0 or not array.startswith("["):
        return None
    last = array[start:-1].strip()
    return out + [last] if last else out


def _array_lines(head: str, array: str, indent: str, tail: str) -> list[str]:
    """`head` + the array literal `array` + `tail` on one line if it fits, else over lines: elements packed at
    `indent` + 4, each followed by ',', an element array too long for a line broken in turn."""
    one = f"{head}{array}{tail}"
    elements = _elements(array)
    if len(one) <= WIDTH or not elements:
        return [one]
    inner, rows, row = indent + INDENT, [f"{head}["], ""
    for e in elements:
        if len(inner) + len(e) + 1 > WIDTH and e.startswith("["):
            rows += [row] if row else []
            rows += _array_lines(inner, e, inner, ",")
            row = ""
        elif row and len(row) + 1 + len(e) + 1 <= WIDTH:
            row = f"{row} {e},"
        else:
            rows += [row] if row else []
            row = f"{inner}{e},"
    return rows + ([row] if row else []) + [f"{indent}]{tail}"]


def _fit_line(line: str) -> list[str]:
    split = _split(line)
    if split is None or not split[0]:
        return [line]
    code, comment = split
    indent = line[:len(line) - len(line.lstrip())]
    rows: list[str] = []
    if comment:
        rows = textwrap.wrap(comment[1:].strip(), WIDTH, initial_indent=f"{indent}# ",
                             subsequent_indent=f"{indent}#   ", break_long_words=False, break_on_hyphens=False)
    key, eq, value = code.partition("=")
    if eq and value.strip().startswith("[") and len(code) > WIDTH:
        return rows + _array_lines(f"{key.rstrip()} = ", value.strip(), indent, "")
    return rows + [code]


def fit_toml(text: str) -> str:
    """`text` (a whole exported TOML file) with every line that is longer than WIDTH and not a whole-line comment
    refitted as the module docstring says; other lines are kept as they are."""
    out: list[str] = []
    for line in text.split("\n"):
        out += [line] if len(line) <= WIDTH or line.lstrip().startswith("#") else _fit_line(line)
    return "\n".join(out)
