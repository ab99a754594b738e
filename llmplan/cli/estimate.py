"""`llmplan estimate`: one training plan, or (--mode infer) one serving plan."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from llmplan import report
from llmplan.cli import options as opt
from llmplan.cli.app import app, emit, out, save_best, stderr_line
from llmplan.errors import LlmplanError, PlanViolationError, not_one_of
from llmplan.specs.defaults import default_bias_dropout_fusion, default_seq_len
from llmplan.specs.model import ModelSpec
from llmplan.specs.options import (SERVE_PLAN_OPTIONS, CheckpointOptions, ClusterOptions, MemoryOptions,
                                   MoeServingOptions, OutputOptions, PipelineSplitOptions, PlanOptions, ServingOptions,
                                   SwitchOptions)
from llmplan.specs.plan import ETP_SAME_AS_TP, ClusterSpec, ParallelPlan, trained_model
from llmplan.specs.resilience import CheckpointPolicy
from llmplan.specs.serve import ServePlan
from llmplan.units import GIB


@app.command(cls=opt.SectionedCommand)
@opt.grouped
def estimate(
    *,
    cluster: Annotated[ClusterOptions, opt.ESTIMATE_CLUSTER],
    plan_file: Optional[Path] = opt.PLAN_FILE,
    mode: str = opt.MODE,
    plan: Annotated[PlanOptions, opt.PLAN],
    training: Annotated[SwitchOptions, opt.SWITCHES],
    split: Annotated[PipelineSplitOptions, opt.PIPELINE_SPLIT],
    memory: Annotated[MemoryOptions, opt.MEMORY],
    checkpoints: Annotated[CheckpointOptions, opt.CHECKPOINTS],
    serving: Annotated[ServingOptions, opt.SERVING],
    batch: Optional[int] = typer.Option(None, "--batch", min=1, rich_help_panel=opt.SERVING.panel,
                                        help="Inference: concurrent sequences per replica (default 64)."),
    max_load: bool = typer.Option(False, "--max-load", rich_help_panel=opt.SERVING.panel,
                                  help="Inference: as many concurrent sequences as the engine's KV cache admits "
                                       "(continuous batching at full load), capped by --batch if given."),
    output: Annotated[OutputOptions, opt.OUTPUT],
    moe_serving: Annotated[MoeServingOptions, opt.MOE_SERVING],
    ctx: typer.Context = None,  # type: ignore[assignment]  # typer passes the context; None is never seen
) -> None:
    """Memory, communication and step time of one training plan, or (--mode infer) memory, KV capacity,
    TTFT, TPOT and throughput of one serving plan; --plan FILE: of a saved plan, as saved."""
    from llmplan.cli.inputs import named_options, refuse_other_mode
    from llmplan.fileio import check_target
    if plan_file is not None:
        return estimate_saved(plan_file, output, named_options(ctx), ctx)
    missing = [flag for flag, given in (("--model", cluster.model), ("--hardware", cluster.hardware)) if not given]
    if missing:
        raise LlmplanError(f"Missing option {', '.join(repr(f) for f in missing)}: estimate prices a plan of "
                           "--model on --hardware; give both, or --plan PLAN.json (a saved plan)")
    if mode not in ("train", "infer"):
        raise LlmplanError(not_one_of("--mode", mode, ("train", "infer")))
    refuse_other_mode(ctx, mode, opt.SERVING_READS | {"dp"} | set(MoeServingOptions.model_fields))
    if output.save is not None:  # refuse an existing --save file before printing the estimate, not after
        check_target(output.save, output.force)
    if mode == "infer":
        estimate_infer(cluster, plan, training.dtype, serving, batch, max_load, memory, output,
                       moe_plan_fields(moe_serving, training.moe_dispatcher))
    else:
        estimate_train(cluster, plan, training, split, memory, checkpoints, output, named_options(ctx))


def moe_plan_fields(o: MoeServingOptions, dispatcher: str) -> dict[str, object]:
    """The ServePlan fields of the phase and MoE serving options (--phase, --dp-attention, ...) and of the
    shared --moe-dispatcher."""
    return {"phase": o.phase, "dp_attention": o.dp_attention, "moe_dispatcher": dispatcher,
            "two_batch_overlap": o.two_batch_overlap, "redundant_experts": o.redundant_experts,
            "ep_imbalance": o.ep_imbalance, "expert_dtype": o.expert_dtype}


def estimate_infer(c: ClusterOptions, p: PlanOptions, dtype: str, s: ServingOptions, batch: int | None,
                   max_load: bool, memory: MemoryOptions, output: OutputOptions, moe: dict[str, object]) -> None:
    """The serving path of `estimate`: p's tp, pp, dp and ep, the serving options and --batch / --max-load;
    `moe` the phase and MoE deployment fields (moe_plan_fields)."""
    from llmplan.cli.inputs import OPTION_FLAGS, cluster_of, make_allowance, make_job, with_hardware_options
    from llmplan.specs.registry import build, resolve_model
    m = resolve_model(c.model)
    cluster = cluster_of(c)
    # the cost modules load once the model and hardware are known: a bad name is refused without them
    from llmplan.advice import advise_serving
    from llmplan.cost.serve_memory import default_batched_tokens
    from llmplan.cost.serve_step import GraphHost
    from llmplan.planfile import save_refs, serve_plan_document
    from llmplan.serving import at_max_load, estimate_serving, largest_fitting
    plan = build(ServePlan, {"tp": p.tp, "pp": p.pp, "dp": p.dp or max(1, cluster.num_gpus // (p.tp * p.pp)),
                             "ep": p.ep, "weight_dtype": dtype, "kv_dtype": s.kv_dtype, **moe},
                 SERVE_PLAN_OPTIONS, OPTION_FLAGS)
    # A prefill pool holds only the prompts of the batch it is prefilling (their KV then leaves for decode):
    # by default, as many as one batch of --max-num-batched-tokens tokens takes.
    tokens = s.max_num_batched_tokens or default_batched_tokens(s.engine, plan, cluster.system.gpu.hbm_gib * GIB)
    prefill_seqs = -(-tokens // s.input_len) if plan.phase == "prefill" else 64
    job = make_job(s, batch or prefill_seqs, tp=plan.tp, host=GraphHost.of(cluster.system, m))
    allowance = make_allowance(memory)
    if max_load:
        job = at_max_load(m, cluster, plan, job, allowance, cap=batch)
    se = estimate_serving(m, cluster, plan, job, allowance)
    if output.json_mode:
        for warning in se.warnings:
            stderr_line("warning", warning)
    # The advice ranks changes by co-located throughput and TTFT; a one-phase pool is priced on its own phase.
    advice = advise_serving(se, allowance) if plan.phase == "both" else None
    fitting = largest_fitting(se, allowance)  # a plan that does not fit: what the batch that fits achieves
    emit(report.serve_json(se, advice, fitting), output.json_mode,
         lambda: report.serve_view(out, se, advice, fitting))
    if output.save is not None:
        refs = save_refs(c.model, c.hardware, output.save)
        save_best(output.save, {**serve_plan_document(se, allowance, report.serve_json(se, fitting=fitting), refs),
                                **with_hardware_options(c)}, output.force, output.json_mode, "the plan")


def training_plan(m: ModelSpec, cluster: ClusterSpec, p: PlanOptions, s: SwitchOptions,
                  split: PipelineSplitOptions) -> ParallelPlan:
    """The ParallelPlan estimate's options describe: p's degrees and batch (--tp -> PlanOptions.tp ->
    ParallelPlan.tp), s's switches, split's stage layout (a --pp-layout may set vpp)."""
    from llmplan.cli.inputs import OPTION_FLAGS, PLAN_FLAGS, pipeline_split, reported, switches
    dp = p.dp if p.dp is not None else max(1, cluster.num_gpus // (p.tp * p.pp * p.cp))
    stages = pipeline_split(trained_model(m, s), p.pp, split.pp_first, split.pp_last, p.pp_layers,
                            split.embedding_in_split, split.loss_in_split, p.pp_layout, p.vpp)
    vpp = stages.pop("vpp", 1 if p.vpp is None else p.vpp)
    given = {k: f for k, f, v in (("global_batch", "--global-batch", p.global_batch), ("etp", "--etp", p.etp),
                                  ("vpp", "--vpp", p.vpp)) if v is not None}  # else derived: no flag
    with reported("plan options", {**OPTION_FLAGS, **PLAN_FLAGS, **given}):
        return ParallelPlan(
            tp=p.tp, pp=p.pp, dp=dp, cp=p.cp, ep=p.ep, etp=ETP_SAME_AS_TP if p.etp is None else p.etp, vpp=vpp,
            **stages,
            sp=(p.tp > 1) if p.sp is None else p.sp, zero=p.zero, micro_batch=p.micro_batch,
            recompute=p.recompute,  # type: ignore[arg-type]  # a str: ParallelPlan's Literal is the rule, reported
            global_batch=p.global_batch if p.global_batch is not None else p.micro_batch * dp,
            seq_len=s.seq_len if s.seq_len is not None else default_seq_len(m),
            **{"bias_dropout_fusion": default_bias_dropout_fusion(m), **switches(s)})


def estimate_train(c: ClusterOptions, p: PlanOptions, s: SwitchOptions, split: PipelineSplitOptions,
                   memory: MemoryOptions, checkpoints: CheckpointOptions, output: OutputOptions,
                   named: frozenset[str] = frozenset()) -> None:
    """The training path of `estimate` (`named`: the options the command line set, for the switches named at
    their defaults that the plan cannot use: check_switches.named_switch_violations)."""
    from llmplan.cli.inputs import cluster_of, make_allowance, make_checkpoint, with_hardware_options
    from llmplan.specs.registry import resolve_model
    from llmplan.topology.placement import parse_order
    m = resolve_model(c.model)
    cluster = cluster_of(c)
    # the cost modules load once the model and hardware are known: a bad name is refused without them
    from llmplan.advice import advise_training
    from llmplan.estimate import estimate_training
    from llmplan.planfile import plan_document, save_refs
    from llmplan.specs.check import check_plan
    from llmplan.specs.check_switches import named_switch_violations
    order = parse_order(s.axis_order)
    plan = training_plan(m, cluster, p, s, split)
    unused = {v.rule: v for v in named_switch_violations(m, plan, named)}
    if unused:  # a rule both break: the named one's message, which also names the switches given at their default
        raise PlanViolationError([unused.pop(b.rule, b) for b in check_plan(m, plan, cluster)] + list(unused.values()))
    allowance = make_allowance(memory)
    e = estimate_training(m, cluster, plan, allowance, order, make_checkpoint(checkpoints))
    advice = advise_training(e, allowance, order)
    emit(report.estimate_json(e, advice), output.json_mode, lambda: report.estimate_view(out, e, advice))
    if output.save is not None:
        refs = save_refs(c.model, c.hardware, output.save)
        save_best(output.save, {**plan_document(e, allowance, order, report.estimate_json(e), refs),
                                **with_hardware_options(c)}, output.force, output.json_mode, "the plan")


def estimate_saved(path: Path, output: OutputOptions, named: frozenset[str], ctx: typer.Context) -> None:
    """`estimate --plan FILE`: the saved plan priced as saved (the specs it snapshots, as export reads them),
    a plan over pools on its pinned assignment (planfile.saved_pools); no other flag, which would change it."""
    from llmplan.advice import advise_training
    from llmplan.cli.inputs import written_flags
    from llmplan.estimate import estimate_training
    from llmplan.hetero import estimate_hetero
    from llmplan.planfile import load_plan, saved_pools
    from llmplan.report.pools import hetero_json, pinned_view
    from llmplan.serving import estimate_serving, largest_fitting
    from llmplan.specs.registry import build
    other = written_flags(ctx, named - {"plan_file", "json_mode"})
    if other:
        raise LlmplanError(f"--plan {path} prices the saved plan as saved, and {', '.join(other)} would change it; "
                           f"drop {', '.join(other)} (edit the plan file's keys, or re-create it with --save)")
    pf = load_plan(path)
    if pf.mode == "infer":
        se = estimate_serving(pf.model, pf.cluster, pf.plan, pf.serve_job, pf.allowance)
        fitting = largest_fitting(se, pf.allowance)
        emit(report.serve_json(se, fitting=fitting), output.json_mode,
             lambda: report.serve_view(out, se, fitting=fitting))
        return
    checkpoint = build(CheckpointPolicy, pf.document.checkpoint or {}, f"{path} (checkpoint)")
    pools = saved_pools(pf)
    if pools is None:
        e = estimate_training(pf.model, pf.cluster, pf.plan, pf.allowance, pf.axis_order, checkpoint)
        advice = advise_training(e, pf.allowance, pf.axis_order)
        emit(report.estimate_json(e, advice), output.json_mode, lambda: report.estimate_view(out, e, advice))
        return
    h = estimate_hetero(pf.model, *pools, pf.allowance, pf.axis_order, checkpoint)
    emit(hetero_json(h), output.json_mode, lambda: pinned_view(out, h, pools[0]))
