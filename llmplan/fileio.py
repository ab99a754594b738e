"""The one boundary for files: reading untrusted documents (specs, profiles, plan files, results) and writing
user files.

Reading: at most MAX_INPUT_BYTES, UTF-8 text, JSON or YAML whose nesting and YAML aliases are bounded, a
mapping at the top; only regular files (a device, FIFO or socket is refused before it can block or stream);
every problem is one clear error naming the file (a JSON key given twice with different values is a warning
naming it, read with the last value, as Python's json does). Writing (publish, the one writer): never over an existing
file without --force, even one another process creates meanwhile; atomically and all-or-nothing for a set of
files (temporary files in the same folder, then hard link or rename; on any error, Ctrl-C or kill the
temporary files are removed and what was published is rolled back), and an unwritable or occupied path is one
clear error with the reason.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import shutil
import stat
import sys
import tempfile
import unicodedata
from pathlib import Path
from typing import Any, Callable

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


    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, value_node in node.value:  # the mapping's own keys (a << merge's may be overridden)
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                value = self.construct_object(value_node, deep=True)
                if key in seen and seen[key] != value:
                    raise LlmplanError(_twice(key, seen[key], value, f" (line {key_node.start_mark.line + 1})"))
                seen.setdefault(key, value)
        return super().construct_mapping(node, deep)


def _twice(key: Any, first: Any, then: Any, where: str = "") -> str:
    return (f"key {excerpt(key, 40)!r} is given twice{where} with different values ({excerpt(first, 40)}, then "
            f"{excerpt(then, 40)}); llmplan does not guess which one a YAML spec, profile or plan file means: give "
            "the key once")


JSON_DUPLICATES_WARNED: set[tuple[str, str, str]] = set()
"""(file, key, kept value) already warned about: a file read twice in one run warns once."""


def _json_duplicate_line(text: str, key: str) -> str:
    """' (line N)' of a JSON key's second occurrence where the key is written exactly twice in `text` (which
    occurrence repeats is then certain), else ''."""
    hits = list(re.finditer(re.escape(json.dumps(key, ensure_ascii=False)) + r"\s*:", text))
    return f" (line {text.count(chr(10), 0, hits[1].start()) + 1})" if len(hits) == 2 else ""


def _last_pairs(text: str, origin: str, warnings: list[str]) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    """json.loads' object_pairs_hook: a JSON object keeping the last of a key given twice with different values,
    as Python's json and Hugging Face transformers' config loading do, with a warning for `warnings`."""
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            # compared with their types: Python holds 1 == True == 1.0, which JSON tells apart
            if key in out and (type(out[key]), out[key]) != (type(value), value) \
                    and (origin, key, repr(value)) not in JSON_DUPLICATES_WARNED:
                JSON_DUPLICATES_WARNED.add((origin, key, repr(value)))
                warnings.append(f"{origin}: key {excerpt(key, 40)!r} is given twice"
                                f"{_json_duplicate_line(text, key)} with different values ({excerpt(out[key], 40)}, "
                                f"then {excerpt(value, 40)}); read with the last, {excerpt(value, 40)}, as Python's "
                                "json and Hugging Face transformers read it")
            out[key] = value
        return out
    return hook


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


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a pipe (FIFO)"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _refuse_special(path: Path, mode: int) -> None:
    if not stat.S_ISREG(mode):
        shown = "'.' (the current folder; an empty path '' names it too)" if str(path) == "." else str(path)
        raise LlmplanError(f"{shown} is {_file_kind(mode)}, not a regular file; give a spec, profile or plan file")


def exists(path: Path) -> bool:
    """Whether something is at `path`; a name the file system cannot take (too long) is one clear error."""
    try:
        os.stat(path)
        return True
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as e:
        raise LlmplanError(f"cannot use {excerpt(str(path), 60)}: {e.strerror or e}") from None


_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # POSIX: opening a FIFO then returns at once (Windows has no FIFOs)


def read_bytes(path: Path, limit: int = MAX_INPUT_BYTES) -> bytes:
    """The file's bytes: only a regular file (a device, pipe, socket or folder is refused before it is opened
    for reading, and again on the open descriptor, so nothing blocks or streams forever), never more than
    `limit` + 1 bytes read."""
    path = Path(path)
    try:
        _refuse_special(path, os.stat(path).st_mode)
        fd = os.open(path, os.O_RDONLY | _NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
        try:
            st = os.fstat(fd)
            _refuse_special(path, st.st_mode)  # swapped for a FIFO or a device since the stat above
            if st.st_size > limit:
                raise LlmplanError(f"{path} is {st.st_size / 2**20:.1f} MiB; llmplan reads specs, profiles and plan "
                                   f"files of at most {limit // 2**20} MiB")
            if _NONBLOCK:
                os.set_blocking(fd, True)
            chunks, size = [], 0
            while size <= limit:
                chunk = os.read(fd, min(limit + 1 - size, 2**20))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        finally:
            os.close(fd)
    except OSError as e:
        raise LlmplanError(f"cannot read {path}: {e.strerror or e}") from None
    if size > limit:
        raise LlmplanError(f"{path} holds more than {limit:,} bytes; llmplan reads specs, profiles and plan files "
                           f"of at most {limit:,} bytes ({limit / 2**20:g} MiB)")
    return b"".join(chunks)


def read_text(path: Path) -> str:
    """The file as UTF-8 text: a regular file of at most MAX_INPUT_BYTES (see read_bytes)."""
    raw = read_bytes(path)
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
    if len(text) > MAX_INPUT_BYTES:  # by its length first: an oversized text is not scanned (nor copied by strip)
        raise LlmplanError(f"{origin} is over {MAX_INPUT_BYTES // 2**20} MiB; llmplan reads files of at most that")
    if not text.strip():
        raise LlmplanError(f"{origin} is empty: llmplan reads a {kind} mapping of keys to values from it (a model "
                           "spec or config.json, a hardware profile or a plan file); fill it in or give another file")
    try:
        if kind == "JSON":
            warnings: list[str] = []
            data = json.loads(text, object_pairs_hook=_last_pairs(text, origin, warnings))
            if _depth(data) > MAX_NESTING:
                raise LlmplanError(f"nests deeper than {MAX_NESTING} levels")
            for w in warnings:
                _warn(w)
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
    except json.JSONDecodeError as e:
        # json's own message ends "... at" where str(e) appends the place: the place is given as line and column
        raise LlmplanError(f"{path} (line {e.lineno}, column {e.colno}): not valid JSON: "
                           f"{excerpt(e.msg.removesuffix(' at'))}") from None
    except (yaml.YAMLError, ValueError) as e:
        where = getattr(e, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        why = str(getattr(e, "problem", None) or getattr(e, "msg", e))
        raise LlmplanError(f"{path}{line}: not valid {kind}: {excerpt(why)}") from None
    if not isinstance(data, dict):
        got = "nothing (comments only)" if data is None else f"a {type(data).__name__}"
        raise LlmplanError(f"{path}: expected a mapping of keys to values at the top level, got {got}; give a file "
                           "of `key: value` entries (a JSON object)")
    return data


def _warn(message: str) -> None:
    """A `warning:` line on stderr (report.message_text: one line when piped, folded within 80 columns on a
    terminal)."""
    from llmplan.report.common import message_text
    columns = shutil.get_terminal_size().columns if sys.stderr.isatty() else None
    sys.stderr.write(message_text("warning", message, columns))


def _has_control(text: str) -> bool:
    return any(unicodedata.category(c) == "Cc" for c in text)


def excerpt(value: Any, limit: int = 80) -> str:
    """At most `limit` characters of a value for an error message (never echo a whole input); a text with a
    control character (NUL, ESC, ...) is shown escaped, as Python writes it, never raw to the terminal."""
    text = value if isinstance(value, str) and not _has_control(value) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


TEMP_PREFIX = ".llmplan-"
"""Temporary files are `.llmplan-XXXXXXXX.tmp` in the target's folder: short, so any name the file system
takes for the target also works for them."""


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return 255


def check_target(path: Path, force: bool = False) -> None:
    """Refuse, before any work, a target that cannot be written: a name too long for the file system, a folder
    in the way, a missing folder, or an existing file without force (publish checks again when it writes)."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if not path.name:
        raise LlmplanError(f"{path} is not a file name")
    try:
        pst = os.stat(parent)
    except FileNotFoundError:
        raise LlmplanError(f"folder {parent} does not exist; create it first (mkdir -p {parent}) or give a path in an "
                           "existing folder") from None
    except OSError as e:
        raise LlmplanError(f"cannot write in {excerpt(str(parent))}: {e.strerror or e}") from None
    if not stat.S_ISDIR(pst.st_mode):
        raise LlmplanError(f"{parent} is a file, not a folder; give a path inside a folder")
    size, most = len(os.fsencode(path.name)), _name_max(parent)
    if size > most:
        raise LlmplanError(f"the file name {excerpt(path.name, 40)} is {size} bytes; the file system of {parent} "
                           f"takes names of at most {most} bytes; give a shorter name")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise LlmplanError(f"cannot write {path}: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode) or (stat.S_ISLNK(st.st_mode) and path.is_dir()):
        raise LlmplanError(f"{path} is a folder; give a file name")
    _refuse_to_replace(path, st.st_mode)
    if not force:
        raise LlmplanError(f"{path} already exists; pass --force to overwrite it")


def _refuse_to_replace(path: Path, mode: int) -> None:
    """Even with --force, only a regular file (or a symbolic link, which is replaced itself) is replaced:
    never a device such as /dev/null, a pipe or a socket."""
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        raise LlmplanError(f"{path} is {_file_kind(mode)}, not a regular file; llmplan replaces only regular files "
                           "(--force included); give a file name")


def write_atomic(path: Path, text: str, force: bool = False) -> None:
    """Write one file (see publish)."""
    publish({Path(path): text}, force)


_LINK_UNSUPPORTED = {errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOSYS, errno.EOPNOTSUPP,
                     getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)}


def publish(files: dict[Path, str], force: bool = False, executable: frozenset[Path] = frozenset()) -> None:
    """The one writer of user files: all of `files` or none of them, and never over an existing file without
    force, even one that another process creates meanwhile.

    Every target is checked first (check_target), every text written to a temporary file in its folder, then
    each is published: without force by a hard link (which fails when the name exists, so of two racing
    writers one wins and the other gets a clear error), with force by a rename over the old file, whose content
    is kept under a second link until the set is complete. When any step fails, or on Ctrl-C / kill, the files
    already published are removed and the ones replaced restored; temporary files never remain. `executable`
    files get execute permission where they are readable."""
    items = [(Path(p), t) for p, t in files.items()]
    for path, _ in items:
        check_target(path, force)
    temps: list[str] = []
    done: list[tuple[Path, str | None]] = []  # (published target, link to the content it replaced)
    try:
        staged = [(path, _stage(path, text, path in executable, temps)) for path, text in items]
        for path, tmp in staged:
            done.append((path, _publish_one(tmp, path, force)))
    except BaseException as exc:
        _roll_back(done)
        _remove(temps)
        if isinstance(exc, OSError):
            raise LlmplanError(_write_error(exc)) from None
        raise
    _remove(temps + [b for _, b in done if b])


def _stage(path: Path, text: str, executable: bool, temps: list[str]) -> str:
    parent = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=TEMP_PREFIX, suffix=".tmp")
    except OSError as e:
        raise _WriteFailed(e.errno, f"{path} (no temporary file in {parent}: {_reason(e)})") from None
    temps.append(tmp)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        mode = 0o666 & ~_umask()
        os.chmod(tmp, mode | ((mode & 0o444) >> 2) if executable else mode)
    except OSError as e:
        raise _WriteFailed(e.errno, f"{path}: {_reason(e)}") from None
    return tmp


class _WriteFailed(OSError):
    """An OSError with the target it concerns, for the message."""


def _publish_one(tmp: str, path: Path, force: bool) -> str | None:
    """Put `tmp` in place at `path`; returns a link to the content it replaced (force only), or None."""
    try:
        if not force:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise LlmplanError(f"{path} appeared while llmplan was writing it (another process?); it was "
                                   "left as it is; pass --force to overwrite it") from None
            except OSError as e:
                if e.errno not in _LINK_UNSUPPORTED:
                    raise
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))  # no hard links: claim it
                os.replace(tmp, path)
            return None
        try:
            _refuse_to_replace(path, os.lstat(path).st_mode)  # again: it may have changed since the check
        except FileNotFoundError:
            pass
        backup = _keep_old(path)
        os.replace(tmp, path)
        return backup
    except LlmplanError:
        raise
    except OSError as e:
        raise _WriteFailed(e.errno, f"{path}: {_reason(e)}") from None


def _keep_old(path: Path) -> str | None:
    """A second hard link to the file at `path` (to restore it if the set fails), or None when there is none."""
    if not os.path.lexists(path):
        return None
    for _ in range(100):
        backup = str(path.parent / f"{TEMP_PREFIX}{secrets.token_hex(4)}.old")
        try:
            os.link(path, backup, follow_symlinks=False)
            return backup
        except FileExistsError:
            continue
        except OSError as e:
            if e.errno in _LINK_UNSUPPORTED:
                return None  # this file system has no hard links: a replaced file cannot be restored
            raise
    return None


def _roll_back(done: list[tuple[Path, str | None]]) -> None:
    for path, backup in reversed(done):
        try:
            if backup:
                os.replace(backup, path)
            else:
                os.unlink(path)
        except OSError:
            pass


def _remove(paths: list[str]) -> None:
    for p in paths:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
        except OSError:
            pass


def _reason(e: OSError) -> str:
    if e.errno == errno.ENOSPC:
        return "the disk is full"
    if e.errno == errno.ENAMETOOLONG:
        return "the name is too long for the file system"
    return e.strerror or str(e)


def _write_error(e: OSError) -> str:
    if isinstance(e, _WriteFailed):
        return f"cannot write {e.strerror}; nothing was written"
    where = f" {e.filename}" if getattr(e, "filename", None) else ""
    return f"cannot write{where}: {_reason(e)}; nothing was written"


def make_folder(folder: Path) -> None:
    """Create an output folder (and its parents); a file in the way or no permission is one clear error."""
    folder = Path(folder)
    if exists(folder) and not folder.is_dir():
        raise LlmplanError(f"{folder} is a file, not a folder; give a folder (created if missing), not that file")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LlmplanError(f"cannot create folder {folder}: {e.strerror or e}; give an output folder in a place "
                           "you can write to") from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
