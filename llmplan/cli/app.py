"""The typer app, the console and what every command shares: one JSON document or a view, progress bars."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from llmplan import report

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Parallelism planner for large language models.")
"""Help in click's plain layout (rich_markup_mode=None): it wraps to the terminal and never cuts an option
name, which rich's option tables do at 80 columns."""


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """A reader that closed stdout (`| head -1`) ends the command normally: main handles it (rich's own
        answer is exit 1)."""
        self.quiet = True
        raise BrokenPipeError


out = _Console()  # the terminal's width; 80 columns when piped unless COLUMNS says otherwise


def emit(doc: dict, json_mode: bool, view: Callable[[], object]) -> None:
    """The JSON document with --json, else the view (a function that prints it)."""
    if json_mode:
        sys.stdout.write(report.dump_json(doc) + "\n")
    else:
        view()


def stderr_line(kind: str, message: str) -> None:
    """An `error:` / `warning:` line on stderr: one line when stderr is not a terminal, folded within 80
    columns on one (report.message_text)."""
    columns = shutil.get_terminal_size().columns if sys.stderr.isatty() else None
    sys.stderr.write(report.message_text(kind, message, columns))


def print_each(items: list[Any]) -> None:
    """Print each renderable (a table, a markup line) in turn: the view of commands that list."""
    for item in items:
        out.print(item)


def save_best(path: Path, doc: dict, force: bool, json_mode: bool, what: str = "the best plan") -> None:
    from llmplan.planfile import save_plan
    save_plan(path, doc, force=force)
    if not json_mode:
        out.print(f"saved {what} to {path}")




@contextmanager
def bench_progress(enabled: bool):
    if not (enabled and out.is_terminal):
        yield None
        return
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), console=out, transient=True) as bar:
        task = bar.add_task("starting", total=1.0)
        yield lambda msg, frac: bar.update(task, description=msg[:100], completed=min(frac, 1.0))


@contextmanager
def progress_bar(enabled: bool):
    """A rich progress bar on a terminal (quiet with --json or when piped)."""
    if not (enabled and out.is_terminal):
        yield lambda _step: None
        return
    steps = ("enumerating", "pruning", "evaluating memory", "evaluating step time", "ranking")
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), console=out, transient=True) as bar:
        task = bar.add_task("searching", total=len(steps))
        yield lambda step: bar.update(task, description=step, completed=steps.index(step) if step in steps else 0)
