"""Exported shell scripts fitted to 80 columns (the brief's output rule) without changing what bash runs.

A long command line is broken between words: inside a bash array (`NAME=(...)`) at a plain newline, which
separates the array's elements as a space does; elsewhere with a backslash-newline, which bash removes before it
reads the words (bash manual, 3.1.2.1 Escape Character). A trailing comment of a line that does not fit moves to
its own comment lines above it; on the last line of a backslash-continued command, where a comment line would
end the command, it stays trailing where it fits and otherwise moves above the command's first line. Words are never
split: not inside quotes, `${...}` or a comment, and a `--flag
value` pair stays on one line where it fits. A script this lexer cannot follow (a here-document, a backquoted
command, a quote left open at the end of a line) is left as written.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmplan.export.common import WIDTH, comment_lines

INDENT = "    "
"""Continuation lines of a command start 4 columns in from the command (the exporters' own style)."""


@dataclass(frozen=True)
class Word:
    """One word of a command line: its text and whether a break before it falls inside a bash array."""

    text: str
    in_array: bool


@dataclass(frozen=True)
class Line:
    """One physical line as the lexer leaves it: its code words, its trailing comment ('' if none), whether it
    ends with a backslash-newline, and where it starts (inside an array; continuing the line above)."""

    words: tuple[Word, ...]
    comment: str
    continues: bool
    in_array: bool
    continued: bool


def _lex(text: str) -> list[Line] | None:
    """Each line of `text` split into unquoted words, or None where the script leaves the lexer's reach."""
    lines: list[Line] = []
    stack: list[str] = []  # open '(' kinds: 'array' (NAME=( ), 'cmd' ($( ) and subshells), 'brace' (${ )
    continued = False
    for raw in text.split("\n"):
        start_array = stack[-1:] == ["array"]
        lexed = _lex_line(raw, stack)
        if lexed is None:
            return None
        words, comment, continues = lexed
        lines.append(Line(words, comment, continues, start_array, continued))
        continued = continues
    return None if stack or continued else lines


def _lex_line(raw: str, stack: list[str]) -> tuple[tuple[Word, ...], str, bool] | None:
    """One physical line's unquoted words, its trailing comment and whether it ends with a backslash-newline;
    `stack`, the open '(' kinds carried from line to line, is updated in place. None where the line leaves the
    lexer's reach (an unclosed quote, a backquote, a here-document, a stray ')')."""
    words: list[Word] = []
    word, word_array, i, comment, continues = "", False, 0, "", False
    while i < len(raw):
        c = raw[i]
        if c in " \t" and stack[-1:] != ["brace"]:
            if word:
                words.append(Word(word, word_array))
            word, i = "", i + 1
            continue
        if not word:
            word_array = stack[-1:] == ["array"]
            if c == "#":
                comment = raw[i:]
                break
        if c == "\\":
            if i + 1 == len(raw):
                continues = True
                break
            word, i = word + raw[i:i + 2], i + 2
            continue
        if c in "'\"":
            end = _quote_end(raw, i)
            if end < 0:
                return None
            word, i = word + raw[i:end + 1], end + 1
            continue
        if c == "`" or c == "<" and raw.startswith("<<", i):
            return None
        if c == "(":
            stack.append("array" if word.endswith("=") else "cmd")
        elif c == "{" and word.endswith("$"):
            stack.append("brace")
        elif c == ")" and stack[-1:] in (["cmd"], ["array"]) or c == "}" and stack[-1:] == ["brace"]:
            stack.pop()
        elif c == ")" and stack:  # a `case` pattern's ')' closes nothing; any other stray one: give up
            return None
        word, i = word + c, i + 1
    if word:
        words.append(Word(word, word_array))
    return tuple(words), comment, continues


def _quote_end(raw: str, i: int) -> int:
    """Index of the quote that closes the one at raw[i] on the same line, -1 if none (or a backquote inside
    double quotes). Inside double quotes a `$( )` is passed whole, quotes of its own included: bash reads it as
    a command of its own."""
    j = i + 1
    while j < len(raw):
        if raw[i] == '"' and raw[j] == "\\":
            j += 2
        elif raw[i] == '"' and raw[j] == "`":
            return -1
        elif raw[i] == '"' and raw.startswith("$(", j):
            j = _paren_end(raw, j + 1)
            if j < 0:
                return -1
            j += 1
        elif raw[j] == raw[i]:
            return j
        else:
            j += 1
    return -1


def _paren_end(raw: str, i: int) -> int:
    """Index of the ')' that closes the '(' at raw[i] on the same line, quoted text skipped; -1 if none."""
    depth, j = 0, i
    while j < len(raw):
        c = raw[j]
        if c in "'\"":
            j = _quote_end(raw, j)
            if j < 0:
                return -1
        elif c == "\\":
            j += 1
        elif c in "()":
            depth += 1 if c == "(" else -1
            if depth == 0:
                return j
        j += 1
    return -1


def _units(words: tuple[Word, ...]) -> list[list[Word]]:
    """Words grouped so that a `--flag` stays with the value after it (a word that does not start with '-')."""
    units: list[list[Word]] = []
    for w in words:
        if units and len(units[-1]) == 1 and units[-1][0].text.startswith("-") and not w.text.startswith("-"):
            units[-1].append(w)
        else:
            units.append([w])
    return units


def _wrap(indent: str, more: str, words: tuple[Word, ...], tail: str) -> list[str]:
    """The words from `indent`, continued on lines at `more`, each line closed by `tail` room kept free."""
    rows: list[tuple[str, bool]] = []  # (text, the break after it falls in an array)
    row = indent
    for unit in _units(words):
        text = " ".join(w.text for w in unit)
        fits_here = len(row) + 1 + len(text) + 2 <= WIDTH
        fits_alone = len(more) + len(text) + 2 <= WIDTH
        if row.strip() and not fits_here and fits_alone:
            rows.append((row, unit[0].in_array))
            row = more + text
        else:
            row = row + (" " if row.strip() else "") + text
    out = [r + ("" if in_array else " \\") for r, in_array in rows]
    return out + [row + tail]


def fit_shell(text: str) -> str:
    """`text` (a whole exported shell script) with every line that is longer than WIDTH and not a whole-line
    comment refitted as the module docstring says; other lines are kept as they are."""
    lines = _lex(text)
    if lines is None:
        return text
    out: list[str] = []
    start, start_indent = 0, ""  # where in `out` the command the line belongs to starts, and its indent
    for raw, line in zip(text.split("\n"), lines, strict=True):
        indent = raw[:len(raw) - len(raw.lstrip())]
        if not line.continued:
            start, start_indent = len(out), indent
        if len(raw) <= WIDTH or not line.words:
            out.append(raw)
            continue
        more = indent if line.in_array or line.continued else indent + INDENT
        tail = " \\" if line.continues else ""
        if line.comment and not line.continued:
            out += comment_lines(line.comment[1:].strip(), f"{indent}#")
            out += _wrap(indent, more, line.words, tail)
            continue
        rows = _wrap(indent, more, line.words, tail)
        trailing = f"{rows[-1]}   {line.comment}" if line.comment else rows[-1]
        if not line.comment or len(trailing) <= WIDTH:
            out += rows[:-1] + [trailing]
        else:  # the last line of a backslash-continued command: a comment line can only go above the command
            out[start:start] = comment_lines(line.comment[1:].strip(), f"{start_indent}#")
            out += rows
    return "\n".join(out)
