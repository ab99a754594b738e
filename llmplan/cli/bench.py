"""`llmplan bench` and `llmplan calibrate`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from llmplan import report
from llmplan.cli import options as opt
from llmplan.cli.app import app, bench_progress, emit, out, stderr_line
from llmplan.errors import LlmplanError, PlanViolationError
from llmplan.specs.plan import ParallelPlan
from llmplan.units import parse_size


@app.command()
def bench(
    plan_file: Optional[Path] = typer.Option(None, "--plan", help="A plan file from `llmplan search --save`."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Without --plan: model name or spec path."),
    hardware: str = typer.Option("dgx-h100", "--hardware", help="Without --plan: profile the predictions use."),
    tp: Optional[int] = typer.Option(None, "--tp", min=1,
                                     help="Without --plan: tensor-parallel degree (default: nproc)."),
    cp: int = typer.Option(1, "--cp", min=1, help="Without --plan: context-parallel degree (shortens the sequence)."),
    seq_len: Optional[int] = opt.SEQ_LEN,
    micro_batch: int = typer.Option(1, "--micro-batch", min=1, help="Without --plan: sequences per micro-batch."),
    nproc: int = typer.Option(2, "--nproc", min=1,
                              help="Processes on this node, torchrun starts them (at most the GPUs for nccl, the "
                              "CPU cores for gloo)."),
    backend: str = typer.Option("gloo", "--backend", help="gloo (CPU) | nccl (GPU)."),
    components: str = typer.Option("gemm,collectives,layer,attention", "--components", help="Comma-separated subset."),
    sizes: str = typer.Option("1MiB,16MiB", "--sizes", help="Collective message sizes (nccl-tests convention)."),
    gemm_tokens: Optional[int] = typer.Option(None, "--gemm-tokens", min=1, help="Cap the GEMMs' token dimension."),
    timeout: float = typer.Option(300.0, "--timeout", help="Seconds without progress (no rank entering its next "
                                  "benchmark) before a hung run is stopped (> 0); start-up (torchrun, "
                                  "init_process_group) may take the longer of this and 120 s."),  # 120:
    # bench.run.STARTUP_TIMEOUT_S (not imported here: the CLI imports a command's modules when it runs)
    save: Optional[Path] = typer.Option(None, "--out", help="Write the raw results (input of llmplan calibrate)."),
    force: bool = typer.Option(False, "--force", help="Overwrite --out."),
    json_mode: bool = opt.JSON,
) -> None:
    """Run GEMM, collective, reference-layer and attention micro-benchmarks and compare them with the predictions."""
    from llmplan.bench.compare import compare
    from llmplan.bench.run import (COMPONENTS as BENCH_COMPONENTS, BenchConfig, bench_notes, check_machine,
                                   check_run_options, launch, require_torch)
    from llmplan.cli.inputs import make_cluster
    from llmplan.fileio import check_target, write_atomic
    from llmplan.planfile import load_plan, refuse_mixed_pools
    from llmplan.specs.check import check_plan
    from llmplan.specs.registry import build, resolve_model
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
        refuse_mixed_pools(pf, "bench --plan")
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
    cfg = BenchConfig(m, plan, cluster, nproc, backend, picked,
                      tuple(int(parse_size(x, "--sizes")) for x in sizes.split(",")),
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
            stderr_line("error", f"rank {f.rank} failed while '{f.phase}': {f.error}")
        raise typer.Exit(1)


@app.command()
def calibrate(
    results: Optional[Path] = typer.Argument(None, help="JSON written by `llmplan bench --backend nccl --out`."),
    hardware: Optional[str] = typer.Option(None, "--hardware",
                                           help="The system profile to calibrate (bench results; default with "
                                                "--plan: the plan's own)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o",
                                          help="Where to write the calibrated profile (YAML; with --plan default "
                                               "calibrated.yaml)."),
    plan_file: Optional[Path] = typer.Option(None, "--plan", help="The plan you run today (search/estimate --save)."),
    step_time: Optional[float] = typer.Option(None, "--step-time", help="With --plan: its measured seconds per step."),
    memory_gib: Optional[float] = typer.Option(None, "--memory-gib",
                                               help="With --plan: its measured peak memory per GPU, GiB."),
    force: bool = typer.Option(False, "--force", help="Overwrite --output."),
    json_mode: bool = opt.JSON,
) -> None:
    """Write a hardware profile calibrated to your stack: from `llmplan bench` measurements (GEMM and
    collective efficiencies, attention head-dim curve), or anchored to one measured run of a plan you run
    (--plan --step-time [--memory-gib]: the sustained clock, collective efficiencies and memory reserve that
    reproduce it)."""
    from llmplan.calibrate import calibrated_system, write_profile
    from llmplan.fileio import check_target
    from llmplan.specs.registry import read_document, resolve_system
    if plan_file is not None:
        if results is not None:
            raise LlmplanError("give bench results or --plan with --step-time, not both")
        calibrate_anchor(plan_file, step_time, memory_gib, hardware, output or Path("calibrated.yaml"), force,
                         json_mode)
        return
    if step_time is not None or memory_gib is not None:
        raise LlmplanError("--step-time and --memory-gib calibrate to a measured run of a plan: add --plan PLAN.json "
                           "(written by `llmplan search --save` or `estimate --save`)")
    if results is None or hardware is None or output is None:
        raise LlmplanError("calibrate needs bench results, --hardware and --output (llmplan calibrate results.json "
                           "--hardware dgx-h100 -o calibrated.yaml), or --plan PLAN.json --step-time SECONDS")
    check_target(output, force)
    doc = read_document(results)
    system = calibrated_system(resolve_system(hardware), doc, str(results))
    write_profile(system, output, force)
    out.print(f"wrote {output}: {system.calibrated}")


def calibrate_anchor(plan_file: Path, step_time: float | None, memory_gib: float | None, hardware: str | None,
                     output: Path, force: bool, json_mode: bool) -> None:
    """`calibrate --plan`: the profile that reproduces the measured run of the plan file."""
    from llmplan.fileio import check_target, write_atomic
    from llmplan.planfile import load_plan, refuse_mixed_pools
    from llmplan.specs.registry import resolve_system
    from datetime import datetime, timezone

    from llmplan.calibrate import anchor_profile_text, anchored_system
    from llmplan.specs.registry import builtin_systems

    if step_time is None:
        raise LlmplanError("--plan needs --step-time SECONDS: the measured time of one optimizer step of that plan")
    if not 0 < step_time < 1e6:
        raise LlmplanError(f"--step-time {step_time:g}: give the measured seconds per optimizer step, a number "
                           "above 0 and below 1e6 (11.6 days)")
    if memory_gib is not None and not 0 < memory_gib < 65_536:
        raise LlmplanError(f"--memory-gib {memory_gib:g}: give the measured peak GiB per GPU, a number above 0 "
                           "and below one GPU's memory")
    check_target(output, force)
    pf = load_plan(plan_file)
    if pf.mode != "train":
        raise LlmplanError(f"{plan_file} is a serving plan; --step-time anchors a training plan")
    refuse_mixed_pools(pf, "calibrate --plan")
    cluster = pf.cluster
    if hardware is not None:
        cluster = cluster.model_copy(update={"system": resolve_system(hardware)})
    anchor = anchored_system(pf.model, cluster, pf.plan, pf.allowance, pf.axis_order, step_time, memory_gib)
    ref = hardware or (pf.document.hardware_ref if pf.document else None)
    base = ref if ref in builtin_systems() else None
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    note = (f"anchored to {plan_file.name} ({report.plan_label(pf.plan)} on {cluster.num_gpus} GPUs): measured "
            f"{step_time:g} s per step" + (f", {memory_gib:g} GiB peak" if memory_gib is not None else "")
            + f"; calibrated {when}")
    write_atomic(output, f"# llmplan calibrated hardware profile (use with --hardware {output})\n"
                 + anchor_profile_text(anchor, base, note), force=force)
    emit(report.anchor_json(anchor, str(output), base), json_mode,
         lambda: report.anchor_view(out, anchor, str(output)))
