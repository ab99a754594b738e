"""`llmplan report`: a self-contained HTML page of a saved plan (matplotlib figures, no network)."""

from __future__ import annotations

from pathlib import Path

import typer

from llmplan.cli import options as opt
from llmplan.cli.app import app, emit, out
from llmplan.specs.resilience import CheckpointPolicy


@app.command()
def report(
    plan_file: Path = typer.Argument(..., help="A plan file written by `search --save` or `estimate --save`."),
    output: Path = typer.Option(Path("report.html"), "--out", "-o", help="The HTML file to write."),
    force: bool = typer.Option(False, "--force", help="Overwrite the HTML file if it exists."),
    json_mode: bool = opt.JSON,
) -> None:
    """One HTML page with the plan's pictures: memory per stage, pipeline schedule, step time by part,
    communication per axis, goodput against GPU count, and for a saved search its throughput vs headroom
    front; for a serving plan, memory, latency and throughput per GPU against concurrency and TPOT."""
    from llmplan.estimate import estimate_training, goodput_scaling, stage_views
    from llmplan.fileio import check_target, write_atomic
    from llmplan.planfile import load_plan, refuse_mixed_pools
    from llmplan.report.html import serving_report, training_report
    from llmplan.serving import estimate_serving, load_curve
    from llmplan.specs.registry import build
    pf = load_plan(plan_file)
    refuse_mixed_pools(pf, "report")
    check_target(output, force)  # refuse before drawing (drawing takes a second or two)
    if pf.mode == "infer":
        se = estimate_serving(pf.model, pf.cluster, pf.plan, pf.serve_job, pf.allowance)
        page = serving_report(se, load_curve(se))
    else:
        saved = pf.document.checkpoint if pf.document is not None else None
        checkpoint = build(CheckpointPolicy, saved, f"{plan_file} (checkpoint)") if saved is not None else None
        e = estimate_training(pf.model, pf.cluster, pf.plan, pf.allowance, pf.axis_order, checkpoint)
        points = pf.document.search if pf.document is not None else None
        page = training_report(e, stage_views(e, pf.allowance), points.model_dump() if points else None,
                               goodput_scaling(e, pf.allowance, pf.axis_order))
    write_atomic(output, page, force=force)
    figures = page.count("<figure ")
    emit({"schema": 1, "report": str(output), "figures": figures}, json_mode,
         lambda: out.print(f"wrote {output} ({figures} figures)"))
