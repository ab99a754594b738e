"""`llmplan export`: launcher files for a saved plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from typer.core import TyperCommand

from llmplan import report
from llmplan.cli import options as opt
from llmplan.cli.app import app, emit, out


class _ExportCommand(TyperCommand):
    """export's --help lists llmplan.export's targets under --to, read when the help is shown: registering the
    command (every llmplan run) does not import the exporters."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        from llmplan.export import TARGETS
        for param in self.params:
            if param.name == "to":
                param.help = f"{' | '.join(TARGETS)} | all"  # type: ignore[attr-defined]  # a click Option
        super().format_help(ctx, formatter)


@app.command(cls=_ExportCommand)
def export(
    plan_file: Path = typer.Argument(..., help="A plan file written by `llmplan search --save`."),
    to: str = typer.Option(..., "--to", help="(the targets: _ExportCommand) | all"),
    out_dir: Path = typer.Option(Path("."), "--out", "-o", help="Folder for the files (created if missing)."),
    wrap: Optional[str] = typer.Option(None, "--wrap", help="Training target torchrun / slurm launch "
                                       "(megatron | torchtitan | deepspeed | megatron-bridge; default: the first "
                                       "that fits the plan)."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing files."),
    json_mode: bool = opt.JSON,
) -> None:
    """Write launcher files for a saved plan (exit 2 when the target cannot express it)."""
    from llmplan.export import render_all, write_files
    from llmplan.planfile import load_plan
    pf = load_plan(plan_file)
    files, skipped = render_all(pf, to, wrap)
    paths = write_files(files, out_dir, force)
    emit({"schema": 1, "target": to, "files": [str(p) for p in paths], "skipped": skipped}, json_mode,
         lambda: report.export_view(out, paths, skipped))
