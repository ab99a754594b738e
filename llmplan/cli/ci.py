"""`llmplan check` and `llmplan lock`: specs and locked plans in CI."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from llmplan import report
from llmplan.cli import options as opt
from llmplan.cli.app import app, emit, out, print_each
from llmplan.errors import LlmplanError, bounded_list


@app.command()
def check(
    paths: list[Path] = typer.Argument(None, help="Spec, profile or plan files, or folders of them."),
    plans: Optional[Path] = typer.Option(None, "--plans", help="Folder of plan files (or one plan file) to re-check."),
    min_headroom: Optional[float] = typer.Option(
        None, "--min-headroom", min=0.0,
        help="GiB each plan must leave free per GPU (default: 5% of its memory, as search)."),
    tolerance: float = typer.Option(0.05, "--tolerance", help="Allowed step-time regression (0.05 = 5%)."),
    param_tolerance: float = typer.Option(0.01, "--param-tolerance",
                                          help="Allowed gap between computed and declared parameters."),
    base: Optional[str] = typer.Option(None, "--base", help="Git revision to diff the specs against."),
    fmt: str = typer.Option("text", "--format", help="text | json | github | junit."),
    json_mode: bool = typer.Option(False, "--json", help="Print one JSON document (schema 1): --format json."),
) -> None:
    """Validate specs and profiles and re-check saved plans against them (exit 1 when a check fails)."""
    from llmplan.fileio import exists
    from llmplan.plancheck import discover, run_checks
    from llmplan.plandiff import check_base, diff_against
    from llmplan.specs.registry import build
    from llmplan.specs.thresholds import CheckThresholds
    if fmt not in ("text", "json", "github", "junit"):
        raise LlmplanError(f"--format {fmt}: use text, json, github or junit")
    if json_mode and fmt not in ("text", "json"):
        raise LlmplanError(f"--json with --format {fmt}: --json is --format json; give one of them")
    fmt = "json" if json_mode else fmt
    targets = list(paths or [])
    if not targets and plans is None:
        raise LlmplanError("give spec / plan paths or --plans DIR (e.g. llmplan check model_specs/ --plans plans/)")
    if plans is not None and not exists(plans):
        raise LlmplanError(f"--plans {plans} does not exist; give a folder of plan files or one plan file")
    if base is not None:
        check_base(base)
    limits = build(CheckThresholds, {"tolerance": tolerance, "param_tolerance": param_tolerance,
                                     "min_headroom_gib": min_headroom}, "check options")
    findings = run_checks(targets, plans, limits.min_headroom_gib, limits.tolerance, limits.param_tolerance)
    if not findings:  # an empty folder or a wrong path in CI must not pass as "all checks passed"
        where = bounded_list([*(str(t) for t in targets), *([f"--plans {plans}"] if plans else [])])
        raise LlmplanError(f"no spec, profile or plan files found in {where} (a *.yaml, *.yml or *.json file "
                           f"holding a model, GPU, system or plan); give the folders that hold them (e.g. llmplan "
                           f"check model_specs/ --plans plans/)")
    diff = None
    if base is not None:
        files = discover(targets)
        plan_files = discover([plans]) if plans else [f for f in files if f.suffix == ".json"]
        diff = diff_against(base, files, plan_files)
    if fmt == "json":
        sys.stdout.write(report.dump_json(report.check_json(findings, diff)) + "\n")
    elif fmt == "github":
        sys.stdout.write(report.check_github(findings) + "\n")
    elif fmt == "junit":
        sys.stdout.write(report.check_junit(findings) + "\n")
    else:
        report.check_view(out, findings, diff)
    if not all(f.ok for f in findings):
        raise typer.Exit(1)


@app.command()
def lock(
    paths: list[Path] = typer.Argument(None, help="Model specs to plan for (with --hardware and --nodes)."),
    plans: Path = typer.Option(..., "--plans", help="Folder of plan files to write or refresh."),
    hardware: Optional[str] = typer.Option(None, "--hardware", help="For new plans: system name or profile."),
    nodes: int = typer.Option(1, "--nodes", min=1, help="For new plans: nodes."),
    global_batch: Optional[int] = typer.Option(
        None, "--global-batch", min=1, help="For new plans: sequences per step."
    ),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", min=1, help="For new plans: sequence length."),
    json_mode: bool = opt.JSON,
) -> None:
    """Refresh every plan in --plans with current predictions; plan the given specs that have none."""
    from llmplan.cli.inputs import make_cluster
    from llmplan.fileio import make_folder
    from llmplan.planlock import NewPlans, Predictions, lock as lock_plans
    from llmplan.report.pools import hetero_json
    make_folder(plans)
    predictions = Predictions(training=report.estimate_json, serving=report.serve_json, pools=hetero_json)
    new_plans = None if hardware is None else NewPlans(hardware, nodes, lambda: make_cluster(hardware, nodes, None),
                                                       global_batch, seq_len)
    result = lock_plans(plans, list(paths or []), predictions, new_plans)
    written, failed = result.written, result.failed
    if not written and not failed:
        raise LlmplanError(f"nothing to lock: no plan files in {plans} and no model specs given "
                           "(llmplan lock model_specs/ --plans DIR --hardware H --nodes N)")
    emit({"schema": 1, "written": written, "failed": failed}, json_mode,
         lambda: print_each([f"locked {w}" for w in written] + [f"[red]failed[/] {f}" for f in failed]))
    if failed:
        raise typer.Exit(1)
