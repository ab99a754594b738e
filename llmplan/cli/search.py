"""`llmplan search`: rank every training plan (or, --mode infer, every serving layout) of a cluster."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from llmplan import report
from llmplan.cli import options as opt
from llmplan.cli.app import app, emit, out, progress_bar, save_best
from llmplan.cli.inputs import (checked_pins, make_allowance, make_checkpoint, make_cluster, make_job, pipeline_split,
                                refuse_other_mode, switches, with_hardware_options)
from llmplan.advice import advise_training
from llmplan.errors import EXIT_NO_FIT, LlmplanError
from llmplan.fileio import check_target
from llmplan.planfile import plan_document, serve_plan_document, spec_ref
from llmplan.search.grid import RECOMPUTE, Workload, default_space
from llmplan.search.run import (OBJECTIVES, DomainChoice, SearchResult, SwitchChoice, best_score, nodes_using,
                                power_of_two_domain, straddling_space, switch_variants)
from llmplan.search.run import search as run_search
from llmplan.search.serve import SERVE_OBJECTIVES, search_serving
from llmplan.specs.defaults import DEFAULT_BATCH_TOKENS, default_seq_len, global_batch_from_tokens, min_headroom_bytes
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import build, resolve_model
from llmplan.specs.serve import ServePlan
from llmplan.specs.thresholds import CheckThresholds
from llmplan.topology.placement import parse_order
from llmplan.units import parse_count


@app.command()
@opt.with_options(opt.TRAINING_SWITCHES, opt.PIPELINE_SPLIT, opt.SERVING, opt.RUNTIME, opt.RESILIENCE)
def search(
    mode: str = typer.Option("train", "--mode", help="train | infer."),
    global_batch: Optional[int] = typer.Option(None, "--global-batch", min=1, help="Sequences per step."),
    batch_tokens: Optional[str] = typer.Option(None, "--batch-tokens",
                                               help="Tokens per step instead of --global-batch (e.g. 16M); default 4M."),
    grad_dtype: Optional[str] = typer.Option(None, "--grad-dtype",
                                             help="Pin the gradient buffer dtype: fp32 | bf16 (default: both "
                                                  "tried, the better shown)."),
    fp8_params: Optional[bool] = typer.Option(None, "--fp8-params/--no-fp8-params",
                                              help="Pin primary weights in the fp8 / NVFP4 recipe's format "
                                                   "(default: both tried where the recipe allows)."),
    tp_comm_overlap: bool = typer.Option(True, "--tp-comm-overlap/--no-tp-comm-overlap",
                                         help="Overlap TP comm with GEMMs where sp is on (default on, as "
                                              "Megatron-Bridge / NeMo performance recipes set it)."),
    tp: Optional[int] = typer.Option(None, "--tp", min=1, help="Pin the tensor-parallel degree."),
    pp: Optional[int] = typer.Option(None, "--pp", min=1, help="Pin the pipeline stages."),
    cp: Optional[int] = typer.Option(None, "--cp", min=1, help="Pin the context-parallel degree."),
    ep: Optional[int] = typer.Option(None, "--ep", min=1, help="Pin the expert-parallel degree."),
    etp: Optional[int] = typer.Option(None, "--etp", min=1, help="Pin the expert tensor-parallel degree (e.g. 1)."),
    vpp: Optional[int] = typer.Option(None, "--vpp", min=1, help="Pin the virtual pipeline stages."),
    sp: Optional[bool] = typer.Option(None, "--sp/--no-sp", help="Pin sequence parallelism on or off."),
    zero: Optional[int] = typer.Option(None, "--zero", help="Pin the ZeRO stage."),
    recompute: Optional[str] = typer.Option(
        None, "--recompute", help="Pin recompute: none | selective | full | op (torchtitan's per-op policy; "
                                  "searched only when pinned)."),
    micro_batch: Optional[int] = typer.Option(None, "--micro-batch", min=1, help="Pin the micro-batch."),
    max_tp: Optional[int] = typer.Option(None, "--max-tp", min=1, help="Largest TP to try (default: the NVLink domain)."),
    max_pp: Optional[int] = typer.Option(None, "--max-pp", min=1, help="Largest PP to try."),
    max_cp: Optional[int] = typer.Option(None, "--max-cp", min=1, help="Largest CP to try (default 32)."),
    no_cp: bool = typer.Option(False, "--no-cp", help="Do not use context parallelism."),
    objective: str = typer.Option("throughput", "--objective",
                                  help="throughput | time-to-train | gpu-hours | headroom."),
    train_tokens: str = typer.Option("1T", "--train-tokens", help="Token budget for time-to-train / gpu-hours."),
    top: int = typer.Option(5, "--top", min=1, help="How many plans to show."),
    min_headroom: Optional[float] = typer.Option(None, "--min-headroom", min=0.0,
                                       help="Training: GiB each plan must leave free per GPU beyond the allowance."),
    wide: bool = typer.Option(False, "--wide", help="Tables with a column per degree (wider than 80 columns)."),
    explain_opt: bool = typer.Option(False, "--explain", help="Why #1 beats #2 and the conventional plan, part by part."),
    save: Optional[Path] = typer.Option(None, "--save", help="Write the best plan to this JSON file."),
    force: bool = typer.Option(False, "--force", help="Overwrite --save's file if it exists."),
    max_batch: int = typer.Option(1024, "--max-batch", min=1, help="Inference: most concurrent sequences per replica."),
    request_rate: Optional[float] = typer.Option(None, "--request-rate",
                                                 help="Inference, --objective min-gpus: requests/s to sustain."),
    ctx: typer.Context = None,  # type: ignore[assignment]
    **options: object,
) -> None:
    """Rank every way to run a training job (or, --mode infer, to serve a model) on a cluster; exit 3 when
    none fits."""
    if mode not in ("train", "infer"):
        raise LlmplanError(f"--mode {mode}: use train or infer")
    refuse_other_mode(ctx, mode, opt.SERVING_READS | {"objective", "top"})
    given = {k: v for k, v in locals().items() if k not in ("options", "ctx")}
    if save is not None:  # refuse an existing --save file before the search, not after it ran and printed
        check_target(save, force)
    (search_infer if mode == "infer" else search_train)({**given, **options})


def search_infer(o: dict) -> None:
    """The serving path of `search` (o: the command's options by name)."""
    if o["objective"] not in SERVE_OBJECTIVES:
        raise LlmplanError(f"--objective {o['objective']} with --mode infer: use one of {', '.join(SERVE_OBJECTIVES)}")
    m = resolve_model(o["model"])
    cluster = make_cluster(o["hardware"], o["nodes"], o["gpus_per_node"], o["power_limit"], o["domain_gpus"])
    job = make_job(o["input_len"], o["output_len"], o["max_batch"], o["prefix_hit_rate"], o["ttft_slo"],
                   o["tpot_slo"], o["gpu_memory_utilization"], o["block_size"], o["max_num_batched_tokens"],
                   o["engine"], o["cuda_graphs"], o["request_rate"])
    build(ServePlan, {"weight_dtype": o["dtype"], "kv_dtype": o["kv_dtype"]}, "serving dtype options")
    allowance = make_allowance(o["overhead_gib"], o["fragmentation"])
    res = search_serving(m, cluster, job, o["dtype"], o["kv_dtype"], o["objective"], o["top"], job.request_rate,
                         allowance, checked_pins(ServePlan, {"tp": o["tp"], "pp": o["pp"], "ep": o["ep"]}))
    emit(report.serve_search_json(res, m, cluster, job), o["json_mode"],
         lambda: report.serve_search_view(out, res, m, cluster, job))
    if not res.ranked:
        sys.stderr.write(f"error: no serving plan for {m.name} on {cluster.num_gpus} GPUs fits and meets the "
                         "SLOs; see the pruned table\n")
        raise typer.Exit(EXIT_NO_FIT)
    if o["save"] is not None:
        best = res.ranked[0]
        refs = (spec_ref(o["model"], o["save"]), spec_ref(o["hardware"], o["save"]))
        save_best(o["save"], {**serve_plan_document(best, allowance, report.serve_json(best), refs),
                              **with_hardware_options(o)}, o["force"],
                  o["json_mode"])


def search_train(o: dict) -> None:
    """The training path of `search` (o: the command's options by name)."""
    if o["objective"] not in OBJECTIVES:
        raise LlmplanError(f"--objective {o['objective']}: use one of {', '.join(OBJECTIVES)}")
    if o["recompute"] is not None and o["recompute"] not in RECOMPUTE:
        raise LlmplanError(f"--recompute {o['recompute']}: use one of {', '.join(RECOMPUTE)}")
    if o["zero"] is not None and not 0 <= o["zero"] <= 3:
        raise LlmplanError(f"--zero {o['zero']}: ZeRO stages are 0, 1, 2 and 3")
    m = resolve_model(o["model"])
    cluster = make_cluster(o["hardware"], o["nodes"], o["gpus_per_node"], o["power_limit"], o["domain_gpus"])
    order = parse_order(o["axis_order"])
    build(CheckThresholds, {"min_headroom_gib": o["min_headroom"]}, "--min-headroom")  # the range check uses
    base = search_workload(m, o)
    tokens = parse_count(o["train_tokens"], "--train-tokens")  # before the search, not after it
    allowance = make_allowance(o["overhead_gib"], o["fragmentation"])
    checkpoint = make_checkpoint(o["checkpoint"], o["checkpoint_interval"], o["failure_rate"])

    def run(c: ClusterSpec, say, wv: Workload, full: int | None = None) -> SearchResult | None:
        space = default_space(m, c, wv, search_pins(m, o), o["max_tp"], o["max_pp"], o["max_cp"])
        space = straddling_space(space, full) if full else space
        if space is None:
            return None
        return run_search(m, c, space, wv, o["objective"], o["top"], allowance, order, progress=say,
                          min_headroom=min_headroom_bytes(o["min_headroom"], c.system.gpu.hbm_bytes), checkpoint=checkpoint,
                          vpp_pin=o["vpp"])

    full_cluster = cluster
    tried: list[tuple[dict, SearchResult, ClusterSpec, Workload, dict]] = []
    with progress_bar(not o["json_mode"]) as say:
        for v in switch_variants(base, o["grad_dtype"] is not None, o["fp8_params"] is not None):
            wv, ov = Workload(**{**base.fields(), **v}), dict(o)
            res = run(full_cluster, say, wv)
            if res is None:  # only a straddling space can be empty; the full one never is
                continue
            used = power_of_two_domain(full_cluster.system)
            c = full_cluster
            if used and o["domain_gpus"] is None and o["gpus_per_node"] is None and o["objective"] != "headroom":
                res, c = best_domain(res, full_cluster, used, ov,
                                     lambda cc: run(cc, say, wv, full=full_cluster.system.domain_gpus))
            tried.append((v, res, c, wv, ov))
    v, res, cluster, w, chosen_o = max(tried, key=lambda t: best_score(t[1]))  # the first of equals: plain wins ties
    o["domain_gpus"] = chosen_o["domain_gpus"]
    if len(tried) > 1:
        res = dataclasses.replace(res, switches=SwitchChoice(v, tuple((t[0], best_score(t[1])[0]) for t in tried)))
    console = Console(width=max(out.width, 160)) if o["wide"] else out
    advice = advise_training(res.ranked[0], allowance, order) if o["explain_opt"] and res.ranked else None
    emit(report.search_json(res, w, cluster, m, tokens, advice), o["json_mode"],
         lambda: report.search_view(console, res, w, cluster, m, tokens, o["explain_opt"], advice,
                                            o["wide"]))
    if not res.ranked:
        sys.stderr.write(f"error: no plan fits {m.name} on {cluster.num_nodes} x {cluster.system.name}"
                         + (f"; it would fit with {'; '.join(res.suggestions)}" if res.suggestions else "") + "\n")
        raise typer.Exit(EXIT_NO_FIT)
    if o["save"] is not None:
        best = res.ranked[0]
        refs = (spec_ref(o["model"], o["save"]), spec_ref(o["hardware"], o["save"]))
        doc = plan_document(best, allowance, order, report.estimate_json(best), refs)
        save_best(o["save"], {**doc, **with_hardware_options(o), "search": report.search_points(res)}, o["force"],
                  o["json_mode"])


def best_domain(res: SearchResult, cluster: ClusterSpec, used: int, o: dict, run) -> tuple[SearchResult, ClusterSpec]:
    """Search again with `used` GPUs of each NVLink domain (DomainChoice) and keep the result with the higher
    best tokens/s; records the choice on the result and, when the share wins, in o["domain_gpus"] (so that
    --save records it)."""
    nodes = nodes_using(cluster, used)
    try:
        alt_cluster = make_cluster(o["hardware"], nodes, None, o["power_limit"], used)
        alt = run(alt_cluster)
    except LlmplanError:  # pins that only the full domain allows: keep the full-domain result
        return res, cluster
    if alt is None:  # no expert-parallel degree that the full domain cannot hold (dense models)
        return res, cluster
    full = cluster.system.domain_gpus
    best = lambda r: float(r.ranked[0].throughput.tokens_per_s) if r.ranked else 0.0  # noqa: E731
    pick_alt = best(alt) > best(res)
    choice = DomainChoice(full=full, used=used if pick_alt else full,
                          gpus={full: cluster.num_gpus, used: alt_cluster.num_gpus},
                          tokens_per_s={full: best(res), used: best(alt)})
    if pick_alt:
        o["domain_gpus"] = used
        return dataclasses.replace(alt, domain=choice), alt_cluster
    return dataclasses.replace(res, domain=choice), cluster


def search_workload(m, o: dict) -> Workload:
    """What the search holds fixed: batch (from --global-batch or --batch-tokens), sequence and switches."""
    seq = o["seq_len"] if o["seq_len"] is not None else default_seq_len(m)
    global_batch = o["global_batch"]
    if global_batch is None:
        tokens = parse_count(o["batch_tokens"], "--batch-tokens") if o["batch_tokens"] else DEFAULT_BATCH_TOKENS
        global_batch = global_batch_from_tokens(tokens, seq)
    grad = o["grad_dtype"] if o["grad_dtype"] is not None else ParallelPlan.model_fields["grad_dtype"].default
    params = o["fp8_params"] if o["fp8_params"] is not None else ParallelPlan.model_fields["fp8_params"].default
    flags = switches(o["dtype"], grad, params, o["flash_attention"], o["overlap_grad_reduce"],
                     o["overlap_param_gather"], o["tp_comm_overlap"], o["ep_comm_overlap"], o["precision"],
                   o["moe_capacity_factor"], o["pp_schedule"], o["attention_kernel"],
                   o["recompute_layers"], o["fused_loss"], o["tp_impl"], o["fp32_param_shards"],
                   o["moe_dispatcher"], o["moe_routing"], o["recompute_modules"])
    build(ParallelPlan, {"seq_len": seq, "global_batch": global_batch, **flags}, "workload options")  # validates
    return Workload(global_batch=global_batch, seq_len=seq, **flags)


def search_pins(m, o: dict) -> dict:
    """The axes the options pin (None: free)."""
    pp = o["pp"]
    if (o["embedding_in_split"] or o["loss_in_split"]) and not pp:
        raise LlmplanError("--account-for-*-in-pipeline-split in search needs --pp (the split depends on it)")
    split = pipeline_split(m, pp or 1, o["pp_first"], o["pp_last"], None, o["embedding_in_split"],
                           o["loss_in_split"])
    pins = {"pp_first": split["pp_first"] or None, "pp_last": split["pp_last"] or None, "tp": o["tp"], "pp": pp,
            "cp": 1 if o["no_cp"] else o["cp"], "ep": o["ep"], "etp": o["etp"], "vpp": o["vpp"], "sp": o["sp"],
            "zero": o["zero"], "recompute": o["recompute"], "micro_batch": o["micro_batch"]}
    return checked_pins(ParallelPlan, pins)
