"""The llmplan command line, one module per command (the Hugging Face CLI's layout): each parses its options,
calls the library and hands the result to the report layer.

Exit codes: 0 success, 2 bad input (one line on stderr; LLMPLAN_DEBUG=1 shows the traceback), 3 when no plan
fits (check: 1 when a check fails).
"""

from __future__ import annotations

import json
import os
import signal
import sys

import typer

# Importing a command module registers its commands, in the order `llmplan --help` lists them.
from llmplan.cli import listing  # noqa: F401, I001
from llmplan.cli import estimate  # noqa: F401
from llmplan.cli import search  # noqa: F401
from llmplan.cli import export  # noqa: F401
from llmplan.cli import ci  # noqa: F401
from llmplan.cli import bench  # noqa: F401
from llmplan.cli import collective  # noqa: F401
from llmplan.cli import report  # noqa: F401
from llmplan.cli.app import app
from llmplan.errors import LlmplanError
from llmplan.fileio import excerpt

__all__ = ["app", "main"]


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> None:
    """Console entry point: runs the app and turns every error into one line on stderr and its exit code
    (with --json, also a JSON document on stdout: {"schema": 1, "error": {"code", "message"}})."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        signal.signal(signal.SIGTERM, _interrupt)  # a kill ends like Ctrl-C: temporary files are removed
    except ValueError:  # not the main thread (an embedding application): leave its handlers alone
        pass
    try:
        rc = app(args=args, prog_name="llmplan", standalone_mode=False)
        if isinstance(rc, int) and rc:
            sys.exit(rc)
    except LlmplanError as e:
        if os.environ.get("LLMPLAN_DEBUG"):
            raise
        _fail(args, e.exit_code, str(e))
    except (typer.Exit, SystemExit) as e:
        sys.exit(getattr(e, "exit_code", getattr(e, "code", 0)))
    except KeyboardInterrupt:
        _fail(args, 130, "interrupted")
    except Exception as e:  # usage errors (typer's click) and anything unexpected: never a bare traceback
        if hasattr(e, "show") and isinstance(getattr(e, "exit_code", None), int):
            if "--json" in args:
                _json_error(e.exit_code, e.format_message() if hasattr(e, "format_message") else str(e))
            e.show()
            sys.exit(e.exit_code)
        if type(e).__name__ == "Abort":
            _fail(args, 130, "interrupted")
        if os.environ.get("LLMPLAN_DEBUG"):
            raise
        _fail(args, 1, f"internal error: {type(e).__name__}: {excerpt(str(e), 200)} (set LLMPLAN_DEBUG=1 for a "
                       "traceback)")


def _fail(args: list[str], code: int, message: str) -> None:
    if "--json" in args:
        _json_error(code, message)
    sys.stderr.write(f"error: {message}\n")
    sys.exit(code)


def _json_error(code: int, message: str) -> None:
    sys.stdout.write(json.dumps({"schema": 1, "error": {"code": code, "message": message}}) + "\n")
