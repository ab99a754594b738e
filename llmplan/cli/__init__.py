"""The llmplan command line, one module per command (the Hugging Face CLI's layout): each parses its options,
calls the library and hands the result to the report layer.

Exit codes: 0 success, 2 bad input (one line on stderr; LLMPLAN_DEBUG=1 shows the traceback), 3 when no plan
fits (check: 1 when a check fails).
"""

from __future__ import annotations

import os
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
from llmplan.cli.app import app
from llmplan.errors import LlmplanError

__all__ = ["app", "main"]


def main(argv: list[str] | None = None) -> None:
    """Console entry point: runs the app and turns LlmplanError into one line and its exit code."""
    try:
        rc = app(args=argv, prog_name="llmplan", standalone_mode=False)
        if isinstance(rc, int) and rc:
            sys.exit(rc)
    except LlmplanError as e:
        if os.environ.get("LLMPLAN_DEBUG"):
            raise
        sys.stderr.write(f"error: {e}\n")
        sys.exit(e.exit_code)
    except (typer.Exit, SystemExit) as e:
        sys.exit(getattr(e, "exit_code", getattr(e, "code", 0)))
    except Exception as e:  # usage errors (typer's click) and anything unexpected: never a bare traceback
        if hasattr(e, "show") and isinstance(getattr(e, "exit_code", None), int):
            e.show()
            sys.exit(e.exit_code)
        if type(e).__name__ == "Abort":
            sys.exit(130)
        if os.environ.get("LLMPLAN_DEBUG"):
            raise
        sys.stderr.write(f"error: internal error: {type(e).__name__}: {e} (set LLMPLAN_DEBUG=1 for a traceback)\n")
        sys.exit(1)
