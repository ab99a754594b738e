"""The llmplan command line, one module per command (the Hugging Face CLI's layout): each parses its options,
calls the library and hands the result to the report layer.

Exit codes: 0 success, 2 bad input (one line on stderr; LLMPLAN_DEBUG=1 shows the traceback), 3 when no plan
fits (check: 1 when a check fails), 130 / 143 on SIGINT / SIGTERM (128 + the signal, `llmplan: interrupted`).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


INTERRUPTED = "llmplan: interrupted\n"


def _interrupted_doc(signum: int) -> str:
    return json.dumps(_error_doc(128 + signum, "interrupted", signum)) + "\n"


def json_wanted(args: list[str]) -> bool:
    """Whether the command line asks for one JSON document: --json, or check's --format json (also written
    --format=json). An error then also answers with the error document, whatever the command (a usage error is
    found before the command has read its options)."""
    return "--json" in args or "--format=json" in args or any(
        a == "--format" and b == "json" for a, b in zip(args, args[1:]))


def _error_doc(code: int, message: str, signum: int | None = None) -> dict:
    err: dict = {"code": code, "message": message}
    if signum is not None:
        err["signal"] = signal.Signals(signum).name
    return {"schema": 1, "error": err}


def _interrupted_while_starting(signum: int, frame: object) -> None:
    """The answer to Ctrl-C or a kill before the commands are imported: written straight to the descriptors."""
    for fd, text in ((1, _interrupted_doc(signum) if json_wanted(sys.argv[1:]) else ""), (2, INTERRUPTED)):
        try:
            if text:
                os.write(fd, text.encode())
        except OSError:
            pass
    os._exit(128 + signum)


# Until the commands are imported (half a second), a signal ends the process at once with the same answer.
_starting = threading.current_thread() is threading.main_thread()
_previous = {s: signal.signal(s, _interrupted_while_starting) for s in SIGNALS} if _starting else {}

import typer  # noqa: E402

# Importing a command module registers its commands, in the order `llmplan --help` lists them.
from llmplan.cli import listing  # noqa: F401, I001, E402
from llmplan.cli import estimate  # noqa: F401, E402
from llmplan.cli import search  # noqa: F401, E402
from llmplan.cli import export  # noqa: F401, E402
from llmplan.cli import ci  # noqa: F401, E402
from llmplan.cli import bench  # noqa: F401, E402
from llmplan.cli import collective  # noqa: F401, E402
from llmplan.cli import report  # noqa: F401, E402
from llmplan.cli.app import app, stderr_line  # noqa: E402
from llmplan.errors import LlmplanError  # noqa: E402
from llmplan.fileio import excerpt  # noqa: E402

for _sig, _handler in _previous.items():  # an application importing llmplan keeps its own handlers
    signal.signal(_sig, _handler)

__all__ = ["app", "main"]

_caught: list[int] = []


def _interrupt(signum: int, frame: object) -> None:
    """SIGINT and SIGTERM end a command like Ctrl-C: KeyboardInterrupt unwinds it (temporary files are
    removed, a bench's processes stopped), then main answers `interrupted` with exit code 128 + signal."""
    _caught.append(signum)
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> None:
    """Console entry point: runs the app and turns every error into one line on stderr and its exit code
    (with --json or --format json, also a JSON document on stdout: {"schema": 1, "error": {"code", "message"}}). Ctrl-C
    and
    SIGTERM exit 130 and 143 (128 + the signal, as shells report a signal); a reader that closes stdout early
    (`llmplan search ... | head -1`) is a normal end."""
    args = list(sys.argv[1:] if argv is None else argv)
    _caught.clear()
    previous = {}
    for sig in SIGNALS:
        try:
            previous[sig] = signal.signal(sig, _interrupt)
        except ValueError:  # not the main thread (an embedding application): leave its handlers alone
            pass
    try:
        code = _run(args)
        if _caught:
            code = _interrupted(_caught[0], args)
    except KeyboardInterrupt:
        code = _interrupted(_caught[0] if _caught else signal.SIGINT, args)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    sys.exit(_flush(code))


def _interrupted(signum: int, args: list[str]) -> int:
    """The answer to Ctrl-C or a kill: one line on stderr (and with --json the error document); 128 + signal."""
    if json_wanted(args):
        try:
            sys.stdout.write(_interrupted_doc(signum))
        except BrokenPipeError:
            _stdout_closed(0)
    sys.stderr.write(INTERRUPTED)
    return 128 + signum


def _run(args: list[str]) -> int:
    try:
        rc = app(args=args, prog_name="llmplan", standalone_mode=False)
        return rc if isinstance(rc, int) else 0
    except BrokenPipeError:
        return _stdout_closed(0)
    except LlmplanError as e:
        if os.environ.get("LLMPLAN_DEBUG"):
            raise
        return _fail(args, e.exit_code, str(e))
    except (typer.Exit, SystemExit) as e:
        code = getattr(e, "exit_code", getattr(e, "code", 0))
        if type(sys.stdout).__name__ == "PacifyFlushWrapper" or (code == 1 and _now_devnull()):
            return _stdout_closed(0)  # typer's and rich's answer to a closed stdout (exit 1)
        return code if isinstance(code, int) else (0 if code is None else 1)
    except Exception as e:  # usage errors (typer's click) and anything unexpected: never a bare traceback
        if _caught:  # a signal's KeyboardInterrupt that a library wrapped (pydantic's class set-up: RuntimeError)
            raise KeyboardInterrupt from e
        exit_code = getattr(e, "exit_code", None)
        if hasattr(e, "show") and isinstance(exit_code, int):
            ranged = _range_error(e)
            if ranged is not None:
                return _fail(args, exit_code, ranged)
            usage = _usage_line(e, args)
            if usage is not None:
                return _fail(args, exit_code, usage)
            if json_wanted(args):
                _json_error(exit_code, e.format_message() if hasattr(e, "format_message") else str(e))
            e.show()
            return exit_code
        if type(e).__name__ == "Abort":
            return _fail(args, 130, "interrupted")
        if os.environ.get("LLMPLAN_DEBUG"):
            raise
        return _fail(args, 1, f"internal error: {type(e).__name__}: {excerpt(str(e), 200)} (set LLMPLAN_DEBUG=1 "
                              "for a traceback)")


def _num(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else f"{x:,}" if abs(x) >= 100_000 else str(x)


def _validation_errors(e: Exception) -> list[Any]:
    """The pydantic errors behind a typer bad parameter (typer checks min= / max= and types with pydantic and
    chains its ValidationError as the cause); [] for any other exception."""
    return list(getattr(e.__cause__, "errors", list)())


def _range_error(e: Exception) -> str | None:
    """One line for a value outside an option's declared min= / max= (typer checks them and raises a bad
    parameter with pydantic's words, which name neither the value nor the range): the flag, the value, the
    valid range and the fix. None for every other usage error (they keep click's answer)."""
    param = getattr(e, "param", None)
    lo, hi = getattr(param, "min", None), getattr(param, "max", None)
    if param is None or (lo is None and hi is None):
        return None
    errors = _validation_errors(e)
    if not errors or not str(errors[0].get("type", "")).startswith(("greater_than", "less_than")):
        return None
    value = str(errors[0].get("input", "?"))
    flag = max(getattr(param, "opts", None) or [f"--{param.name}"], key=len)
    if lo is not None and hi is not None:
        rule, fix = f"from {_num(lo)} to {_num(hi)}", f"give {flag} a value from {_num(lo)} to {_num(hi)}"
    elif lo is not None:
        rule, fix = f"at least {_num(lo)}", f"give {flag} {_num(lo)} or more"
    elif hi is not None:
        rule, fix = f"at most {_num(hi)}", f"give {flag} {_num(hi)} or less"
    return f"Invalid value for '{flag}': {value} is out of range; it must be {rule} ({fix})"


def _usage_line(e: Exception, args: list[str]) -> str | None:
    """One line for a usage error (an unknown option or command, a missing or malformed value): click's own
    message, which names the option and, for a misspelling, its nearest match, and where the options are
    listed: the command's --help. typer's parser raises an option given no value ("Option '--model' requires an
    argument") without the command's context, so the command is then the first word of `args` (the app takes
    no option before it but --help, which ends before any error). None for what is not a usage error (click's
    other exceptions keep their answer)."""
    if getattr(e, "exit_code", None) != 2 or not hasattr(e, "format_message"):
        return None
    message = " ".join(str(e.format_message()).split())
    errors = _validation_errors(e)  # typer's pydantic check: echo the value given
    if errors and "input" in errors[0]:
        message += f" (given {str(errors[0]['input'])!r})"
    ctx = getattr(e, "ctx", None)
    path = getattr(ctx, "command_path", None) or _command_path(args)
    # click ends some messages with a full stop ("Missing option '--plans'."), some with a question ("Did you mean
    # --x?"), some with neither: the hint follows as the line's second clause, never after ".;" or "?;"
    message = message.rstrip(".")
    return f"{message}{' ' if message.endswith(('?', '!')) else '; '}'{path} --help' lists the commands and options"


def _command_path(args: list[str]) -> str:
    """`llmplan COMMAND` for the command the arguments name (their first word, when it is one), else `llmplan`."""
    from typer.main import get_command

    group = get_command(app)
    names = getattr(group, "commands", {})
    return f"llmplan {args[0]}" if args and args[0] in names else "llmplan"


def _devnull_id(fd: int) -> tuple[int, int] | None:
    try:
        st, null = os.fstat(fd), os.stat(os.devnull)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if (st.st_dev, st.st_ino, st.st_rdev) == (null.st_dev, null.st_ino, null.st_rdev) \
        else None


_STDOUT_WAS_DEVNULL = _devnull_id(1) is not None


def _now_devnull() -> bool:
    """Whether stdout was sent to /dev/null since start (rich does that when the reader closes the pipe)."""
    return not _STDOUT_WAS_DEVNULL and _devnull_id(1) is not None


def _flush(code: int) -> int:
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        return _stdout_closed(code)
    except (OSError, ValueError):
        pass
    return code


def _stdout_closed(code: int) -> int:
    """The reader went away: send the rest of the output nowhere (Python's advice for SIGPIPE), so that the
    final flush does not fail again, and end normally."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.__stdout__.fileno() if sys.__stdout__ else 1)
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
    return code


def _fail(args: list[str], code: int, message: str) -> int:
    # A value read from the user's file may hold text the terminal cannot encode (a YAML "\ud800" escape is a
    # lone surrogate): show it escaped rather than fail while saying what is wrong.
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    if json_wanted(args):
        _json_error(code, message)
    stderr_line("error", message)
    return code


def _json_error(code: int, message: str) -> None:
    try:
        sys.stdout.write(json.dumps(_error_doc(code, message)) + "\n")
    except BrokenPipeError:
        _stdout_closed(code)
