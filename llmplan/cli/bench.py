"""`llmplan bench` and `llmplan calibrate`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from llmplan import report
from llmplan.bench.run import COMPONENTS as BENCH_COMPONENTS
from llmplan.bench.run import BenchConfig, bench_notes, check_machine, check_run_options, compare, launch, require_torch
from llmplan.calibrate import calibrated_system, write_profile
from llmplan.cli import options as opt
from llmplan.cli.app import app, bench_progress, emit, out
from llmplan.cli.inputs import make_cluster
from llmplan.errors import LlmplanError, PlanViolationError
from llmplan.specs.check import check_plan
from llmplan.fileio import check_target, write_atomic
from llmplan.planfile import load_plan
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import build, read_document, resolve_model, resolve_system
from llmplan.units import parse_size


@app.command()
def bench(
    plan_file: Optional[Path] = typer.Option(None, "--plan", help="A plan file from `llmplan search --save`."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Without --plan: model name or spec path."),
    hardware: str = typer.Option("dgx-h100", "--hardware", help="Without --plan: profile the predictions use."),
    tp: Optional[int] = typer.Option(None, "--tp", min=1, help="Without --plan: tensor-parallel degree (default: nproc)."),
    cp: int = typer.Option(1, "--cp", min=1, help="Without --plan: context-parallel degree (shortens the sequence)."),
    seq_len: Optional[int] = opt.SEQ_LEN,
    micro_batch: int = typer.Option(1, "--micro-batch", min=1, help="Without --plan: sequences per micro-batch."),
    nproc: int = typer.Option(2, "--nproc", min=1, help="Processes on this node, torchrun starts them (at most the GPUs "
                              "for nccl, the CPU cores for gloo)."),
    backend: str = typer.Option("gloo", "--backend", help="gloo (CPU) | nccl (GPU)."),
    components: str = typer.Option("gemm,collectives,layer,attention", "--components", help="Comma-separated subset."),
    sizes: str = typer.Option("1MiB,16MiB", "--sizes", help="Collective message sizes (nccl-tests convention)."),
    gemm_tokens: Optional[int] = typer.Option(None, "--gemm-tokens", min=1, help="Cap the GEMMs' token dimension."),
    timeout: float = typer.Option(300.0, "--timeout", help="Seconds before a hung run is stopped (> 0)."),
    save: Optional[Path] = typer.Option(None, "--out", help="Write the raw results (input of llmplan calibrate)."),
    force: bool = typer.Option(False, "--force", help="Overwrite --out."),
    json_mode: bool = opt.JSON,
) -> None:
    """Run GEMM, collective, reference-layer and attention micro-benchmarks and compare them with the predictions."""
    require_torch()
    if save is not None:
        check_target(save, force)  # refuse before a run of minutes
    if backend not in ("gloo", "nccl"):
        raise LlmplanError(f"--backend {backend}: use gloo (CPU) or nccl (GPU)")
    check_run_options(nproc, timeout)
    picked = tuple(c.strip() for c in components.split(",") if c.strip())
    unknown = [c for c in picked if c not in BENCH_COMPONENTS]
    if unknown or not picked:
        raise LlmplanError(f"--components {components}: choose from {', '.join(BENCH_COMPONENTS)}")
    if plan_file is not None:
        pf = load_plan(plan_file)
        if pf.mode != "train":
            raise LlmplanError("llmplan bench takes training plans (the reference layer is a training layer)")
        m, cluster, plan = pf.model, pf.cluster, pf.plan
    elif model is not None:
        m = resolve_model(model)
        cluster = make_cluster(hardware, 1, None)
        seq = seq_len or min(2048, m.max_position_embeddings)
        plan = build(ParallelPlan, {"tp": tp or nproc, "cp": cp, "seq_len": seq, "micro_batch": micro_batch,
                                    "global_batch": micro_batch, "sp": (tp or nproc) > 1}, "bench options")
        bad = [v for v in check_plan(m, plan) if v.rule not in ("gpus_model_parallel", "gpus_dp")]
        if bad:  # the same rules as estimate (the layer runs over nproc processes, not the plan's GPU count)
            raise PlanViolationError(bad)
    else:
        raise LlmplanError("give --plan plan.json or --model (with --tp, --seq-len, --micro-batch)")
    check_machine(backend, nproc)
    cfg = BenchConfig(m, plan, cluster, nproc, backend, picked, tuple(int(parse_size(x)) for x in sizes.split(",")),
                      timeout, gemm_tokens)
    notes = bench_notes(cfg)
    with bench_progress(not json_mode) as say:
        run = launch(cfg, say)
    rows = compare(cfg, run)
    doc = report.bench_json(cfg, run, rows)
    doc["notes"] = notes
    if save is not None:
        write_atomic(save, report.dump_json(doc) + "\n", force=force)

    def view():
        for note in notes:
            out.print(f"[dim]{note}[/]")
        for t in report.bench_tables(rows, cpu=backend == "gloo"):
            out.print(t)
        out.print(f"bench took {run.seconds:.1f} s on {nproc} process(es) ({backend})")
    emit(doc, json_mode, view)
    if run.failures:
        for f in run.failures:
            sys.stderr.write(f"error: rank {f.rank} failed while '{f.phase}': {f.error}\n")
        raise typer.Exit(1)


@app.command()
def calibrate(
    results: Path = typer.Argument(..., help="JSON written by `llmplan bench --backend nccl --out`."),
    hardware: str = typer.Option(..., "--hardware", help="The system profile to calibrate."),
    output: Path = typer.Option(..., "--output", "-o", help="Where to write the calibrated profile (YAML)."),
    force: bool = typer.Option(False, "--force", help="Overwrite --output."),
) -> None:
    """Write a hardware profile with measured GEMM and collective efficiencies and attention head-dim curve."""
    check_target(output, force)
    doc = read_document(results)
    system = calibrated_system(resolve_system(hardware), doc, str(results))
    write_profile(system, output, force)
    out.print(f"wrote {output}: {system.calibrated}")
