"""The one boundary for files: reading untrusted documents (specs, profiles, plan files, results) and writing
user files.

Reading: at most MAX_INPUT_BYTES, UTF-8 text, JSON or YAML whose nesting and YAML aliases are bounded, a
mapping at the top; every problem is one clear error naming the file. Writing: never over an existing file
without --force, atomically (temporary file in the same folder, then rename; the temporary file is removed
on any error, Ctrl-C or kill), and an unwritable or occupied path is one clear error with the reason.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from llmplan.errors import LlmplanError

MAX_INPUT_BYTES = 8 * 2**20
"""Largest spec, profile, plan or results file llmplan reads (8 MiB; real ones are a few KiB)."""
MAX_YAML_ALIASES = 20
"""YAML aliases a document may use (an alias bomb expands exponentially)."""
MAX_NESTING = 64
"""Deepest nesting of a document (real specs nest 3 levels)."""


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses documents with too many aliases or too deep a nesting."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._aliases = 0
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.events.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_YAML_ALIASES:
                raise LlmplanError(f"uses more than {MAX_YAML_ALIASES} YAML aliases (&anchor / *alias); write the "
                                   "values out")
        self._depth += 1
        try:
            if self._depth > MAX_NESTING:
                raise LlmplanError(f"nests deeper than {MAX_NESTING} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _depth(obj: Any, limit: int = MAX_NESTING) -> int:
    """Nesting depth of parsed JSON, without recursion."""
    stack, deepest = [(obj, 1)], 0
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        if d > limit:
            return d
        if isinstance(node, dict):
            stack += [(v, d + 1) for v in node.values()]
        elif isinstance(node, list):
            stack += [(v, d + 1) for v in node]
    return deepest


def read_text(path: Path) -> str:
    """The file as UTF-8 text, refused beyond MAX_INPUT_BYTES."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if path.is_dir():
            raise LlmplanError(f"{path} is a folder, not a file")
        if size > MAX_INPUT_BYTES:
            raise LlmplanError(f"{path} is {size / 2**20:.1f} MiB; llmplan reads specs, profiles and plan files of "
                               f"at most {MAX_INPUT_BYTES // 2**20} MiB")
        raw = path.read_bytes()
    except OSError as e:
        raise LlmplanError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise LlmplanError(f"{path} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); save it as "
                           "UTF-8 JSON or YAML") from None


def read_document(path: Path) -> dict[str, Any]:
    """Parse a YAML or JSON file into a mapping; any problem is one clear error naming the file."""
    path = Path(path)
    return parse_document(read_text(path), "JSON" if path.suffix == ".json" else "YAML", str(path))


def parse_document(text: str, kind: str, origin: str) -> dict[str, Any]:
    """Parse JSON or YAML text (from a file or a git revision) into a mapping, within the bounds above."""
    path = origin
    if len(text) > MAX_INPUT_BYTES:
        raise LlmplanError(f"{origin} is over {MAX_INPUT_BYTES // 2**20} MiB; llmplan reads files of at most that")
    try:
        if kind == "JSON":
            data = json.loads(text)
            if _depth(data) > MAX_NESTING:
                raise LlmplanError(f"nests deeper than {MAX_NESTING} levels")
        else:
            loader = _BoundedLoader(text)
            try:
                data = loader.get_single_data()
            finally:
                loader.dispose()
    except LlmplanError as e:
        raise LlmplanError(f"{path}: {e}") from None
    except RecursionError:
        raise LlmplanError(f"{path}: nests deeper than {MAX_NESTING} levels") from None
    except (json.JSONDecodeError, yaml.YAMLError, ValueError) as e:
        where = getattr(e, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else f" (line {e.lineno})" if hasattr(e, "lineno") else ""
        why = str(getattr(e, "problem", None) or getattr(e, "msg", e))
        raise LlmplanError(f"{path}{line}: not valid {kind}: {excerpt(why)}") from None
    if not isinstance(data, dict):
        raise LlmplanError(f"{path}: expected a mapping of keys to values, got {type(data).__name__}")
    return data


def excerpt(value: Any, limit: int = 80) -> str:
    """At most `limit` characters of a value for an error message (never echo a whole input)."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def write_atomic(path: Path, text: str, force: bool = False) -> None:
    """Write `text` to `path` atomically; refuse to overwrite without force; every failure is one clear error."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise LlmplanError(f"{path} is a folder; give a file name")
    if path.exists() and not force:
        raise LlmplanError(f"{path} already exists; pass --force to overwrite it")
    if not parent.exists():
        raise LlmplanError(f"folder {parent} does not exist")
    if not parent.is_dir():
        raise LlmplanError(f"{parent} is a file, not a folder")
    try:
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise LlmplanError(f"cannot write in {parent}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        why = "the disk is full" if e.errno == errno.ENOSPC else (e.strerror or str(e))
        raise LlmplanError(f"cannot write {path}: {why}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def make_folder(folder: Path) -> None:
    """Create an output folder (and its parents); a file in the way or no permission is one clear error."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise LlmplanError(f"{folder} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LlmplanError(f"cannot create folder {folder}: {e.strerror or e}") from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
