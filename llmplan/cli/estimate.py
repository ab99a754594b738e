"""`llmplan estimate`: one training plan, or (--mode infer) one serving plan."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from llmplan import report
from llmplan.cli import options as opt
from llmplan.cli.app import app, emit, out, save_best
from llmplan.cli.inputs import (make_allowance, make_checkpoint, make_cluster, make_job, pipeline_split,
                                refuse_other_mode, switches, with_hardware_options)
from llmplan.advice import advise_serving, advise_training
from llmplan.errors import LlmplanError
from llmplan.estimate import estimate_training
from llmplan.fileio import check_target
from llmplan.planfile import plan_document, serve_plan_document, spec_ref
from llmplan.serving import at_max_load, estimate_serving
from llmplan.specs.defaults import default_seq_len
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import build, resolve_model
from llmplan.specs.serve import ServePlan
from llmplan.topology.placement import parse_order


@app.command()
@opt.with_options(opt.TRAINING_SWITCHES, opt.STATE_SWITCHES, opt.PIPELINE_SPLIT, opt.SERVING, opt.RUNTIME, opt.RESILIENCE)
def estimate(
    tp: int = typer.Option(1, "--tp", min=1, help="Tensor-parallel degree."),
    pp: int = typer.Option(1, "--pp", min=1, help="Pipeline-parallel stages."),
    dp: Optional[int] = typer.Option(None, "--dp", min=1, help="Data-parallel degree (default: GPUs / (tp*pp*cp))."),
    cp: int = typer.Option(1, "--cp", min=1, help="Context-parallel degree."),
    ep: int = typer.Option(1, "--ep", min=1, help="Expert-parallel degree."),
    etp: Optional[int] = typer.Option(None, "--etp", min=1, help="Expert tensor-parallel degree (default: tp)."),
    vpp: int = typer.Option(1, "--vpp", min=1, help="Virtual pipeline stages per rank (interleaved schedule)."),
    pp_layers: Optional[str] = typer.Option(None, "--pp-layers",
                                            help="Layers of every pipeline stage, e.g. 7,8,8,...,7 (uneven split)."),
    pp_layout: Optional[str] = opt.PP_LAYOUT,
    sp: Optional[bool] = typer.Option(None, "--sp/--no-sp", help="Sequence parallelism (default: on when tp > 1)."),
    zero: int = typer.Option(0, "--zero", help="ZeRO stage 0-3 (1 = Megatron distributed optimizer)."),
    recompute: str = typer.Option("none", "--recompute",
                                  help="none | selective | full | op (torchtitan's per-op policy)."),
    micro_batch: int = typer.Option(1, "--micro-batch", min=1, help="Sequences per micro-batch."),
    global_batch: Optional[int] = typer.Option(None, "--global-batch", min=1, help="Sequences per step (default: micro-batch x dp)."),
    tp_comm_overlap: bool = opt.TP_COMM_OVERLAP,
    mode: str = typer.Option("train", "--mode", help="train | infer."),
    batch: Optional[int] = typer.Option(None, "--batch", min=1,
                                        help="Inference: concurrent sequences per replica (default 64)."),
    max_load: bool = typer.Option(False, "--max-load",
                                  help="Inference: as many concurrent sequences as the engine's KV cache admits "
                                       "(continuous batching at full load), capped by --batch if given."),
    save: Optional[Path] = typer.Option(None, "--save", help="Write this plan to a plan file (for export, check)."),
    force: bool = typer.Option(False, "--force", help="Overwrite --save's file if it exists."),
    ctx: typer.Context = None,  # type: ignore[assignment]
    **options: object,
) -> None:
    """Memory, communication and step time of one training plan, or (--mode infer) memory, KV capacity,
    TTFT, TPOT and throughput of one serving plan."""
    if mode not in ("train", "infer"):
        raise LlmplanError(f"--mode {mode}: use train or infer")
    refuse_other_mode(ctx, mode, opt.SERVING_READS | {"dp"})
    given = {k: v for k, v in locals().items() if k not in ("options", "ctx")}
    if save is not None:  # refuse an existing --save file before printing the estimate, not after
        check_target(save, force)
    (estimate_infer if mode == "infer" else estimate_train)({**given, **options})


def estimate_infer(o: dict) -> None:
    """The serving path of `estimate` (o: the command's options by name)."""
    m = resolve_model(o["model"])
    cluster = make_cluster(o["hardware"], o["nodes"], o["gpus_per_node"], o["power_limit"], o["domain_gpus"])
    tp, pp = o["tp"], o["pp"]
    plan = build(ServePlan, {"tp": tp, "pp": pp, "dp": o["dp"] or max(1, cluster.num_gpus // (tp * pp)), "ep": o["ep"],
                             "weight_dtype": o["dtype"], "kv_dtype": o["kv_dtype"]}, "serving plan options")
    job = make_job(o["input_len"], o["output_len"], o["batch"] or 64, o["prefix_hit_rate"], o["ttft_slo"], o["tpot_slo"],
                   o["gpu_memory_utilization"], o["block_size"], o["max_num_batched_tokens"],
                   o["engine"], o["cuda_graphs"])
    allowance = make_allowance(o["overhead_gib"], o["fragmentation"])
    if o["max_load"]:
        job = at_max_load(m, cluster, plan, job, allowance, cap=o["batch"])
    se = estimate_serving(m, cluster, plan, job, allowance)
    if o["json_mode"]:
        for warning in se.warnings:
            sys.stderr.write(f"warning: {warning}\n")
    advice = advise_serving(se, allowance)
    emit(report.serve_json(se, advice), o["json_mode"], lambda: report.serve_view(out, se, advice))
    if o["save"] is not None:
        refs = (spec_ref(o["model"], o["save"]), spec_ref(o["hardware"], o["save"]))
        save_best(o["save"], {**serve_plan_document(se, allowance, report.serve_json(se), refs),
                              **with_hardware_options(o)}, o["force"],
                  o["json_mode"], "the plan")


def estimate_train(o: dict) -> None:
    """The training path of `estimate` (o: the command's options by name)."""
    m = resolve_model(o["model"])
    cluster = make_cluster(o["hardware"], o["nodes"], o["gpus_per_node"], o["power_limit"], o["domain_gpus"])
    order = parse_order(o["axis_order"])
    tp, pp, cp = o["tp"], o["pp"], o["cp"]
    dp = o["dp"] if o["dp"] is not None else max(1, cluster.num_gpus // (tp * pp * cp))
    mb = o["micro_batch"]
    plan = build(ParallelPlan, {
        "tp": tp, "pp": pp, "dp": dp, "cp": cp, "ep": o["ep"], "etp": o["etp"], "vpp": o["vpp"],
        **pipeline_split(m, pp, o["pp_first"], o["pp_last"], o["pp_layers"], o["embedding_in_split"],
                         o["loss_in_split"], o["pp_layout"], o["vpp"]),
        "sp": (tp > 1) if o["sp"] is None else o["sp"], "zero": o["zero"], "recompute": o["recompute"],
        "micro_batch": mb, "global_batch": o["global_batch"] if o["global_batch"] is not None else mb * dp,
        "seq_len": o["seq_len"] if o["seq_len"] is not None else default_seq_len(m),
        **switches(o["dtype"], o["grad_dtype"], o["fp8_params"], o["flash_attention"], o["overlap_grad_reduce"],
                   o["overlap_param_gather"], o["tp_comm_overlap"], o["ep_comm_overlap"], o["precision"],
                   o["moe_capacity_factor"], o["pp_schedule"], o["attention_kernel"],
                   o["recompute_layers"], o["fused_loss"], o["tp_impl"], o["fp32_param_shards"],
                   o["moe_dispatcher"], o["moe_routing"], o["recompute_modules"]),
    }, "plan options")
    allowance = make_allowance(o["overhead_gib"], o["fragmentation"])
    checkpoint = make_checkpoint(o["checkpoint"], o["checkpoint_interval"], o["failure_rate"])
    e = estimate_training(m, cluster, plan, allowance, order, checkpoint)
    advice = advise_training(e, allowance, order)
    emit(report.estimate_json(e, advice), o["json_mode"], lambda: report.estimate_view(out, e, advice))
    if o["save"] is not None:
        refs = (spec_ref(o["model"], o["save"]), spec_ref(o["hardware"], o["save"]))
        save_best(o["save"], {**plan_document(e, allowance, order, report.estimate_json(e), refs),
                              **with_hardware_options(o)}, o["force"],
                  o["json_mode"], "the plan")
