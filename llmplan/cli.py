"""The llmplan command line: parses options, calls the library, hands results to the report layer.

Exit codes: 0 success, 2 bad input (one line on stderr; LLMPLAN_DEBUG=1 shows the traceback),
3 when no plan fits.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn

from llmplan import report
from llmplan.cost.params import param_counts
from llmplan.errors import EXIT_NO_FIT, LlmplanError
from llmplan.bench.run import COMPONENTS as BENCH_COMPONENTS
from llmplan.bench.run import BenchConfig, compare, launch, layer_shape, require_torch
from llmplan.calibrate import calibrated_system, write_profile
from llmplan.export import TARGETS, render_all, write_files
from llmplan.fileio import write_atomic
from llmplan.guard import diff_against, discover, run_checks
from llmplan.planfile import load_plan, plan_document, read_plan_document, save_plan, serve_plan_document, spec_ref
from llmplan.search.serve import SERVE_OBJECTIVES, search_serving
from llmplan.serving import estimate_serving
from llmplan.specs.serve import ServeJob, ServePlan
from llmplan.search.grid import RECOMPUTE, Workload, default_space
from llmplan.search.run import OBJECTIVES
from llmplan.search.run import search as run_search
from llmplan.estimate import estimate_training
from llmplan.specs.check import accounted_split
from llmplan.specs.defaults import DEFAULT_BATCH_TOKENS, default_seq_len, global_batch_from_tokens, min_headroom_bytes
from llmplan.specs.plan import ClusterSpec, MemoryAllowance, ParallelPlan
from llmplan.specs.registry import read_document
from llmplan.specs.registry import build, builtin_gpus, builtin_models, builtin_systems, resolve_model, resolve_system
from llmplan.topology.collectives import OPS, collective_time
from llmplan.topology.graph import validate
from llmplan.topology.placement import DEFAULT_ORDER, parse_order, span_of_ranks
from llmplan.units import parse_size

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Parallelism planner for large language models.")
out = Console()
if not out.is_terminal:  # piped output: do not squeeze tables into 80 columns
    out.width = max(out.width, 140)

JsonOpt = typer.Option(False, "--json", help="Print one JSON document (schema 1) instead of tables.")
ModelOpt = typer.Option(..., "--model", "-m", help="Built-in model name or path to a spec / config.json.")
HardwareOpt = typer.Option(..., "--hardware", help="Built-in system name or path to a system profile.")
NodesOpt = typer.Option(1, "--nodes", min=1, help="Number of nodes.")
GpusPerNodeOpt = typer.Option(None, "--gpus-per-node", min=1, help="GPUs used per node (default: all).")
SeqOpt = typer.Option(None, "--seq-len", min=1, help="Sequence length (default: min(4096, context)).")
DtypeOpt = typer.Option("bf16", "--dtype", help="bf16 | fp16 | fp8 | fp32.")
GradDtypeOpt = typer.Option("fp32", "--grad-dtype", help="Gradient buffer dtype: fp32 (Megatron) | bf16.")
Fp8ParamsOpt = typer.Option(False, "--fp8-params/--no-fp8-params", help="With fp8, keep weights in fp8.")
FlashOpt = typer.Option(True, "--flash-attention/--no-flash-attention", help="Fused attention (no s x s scores).")
OgrOpt = typer.Option(True, "--overlap-grad-reduce/--no-overlap-grad-reduce",
                      help="Hide the DP gradient reduction behind the backward pass.")
OpgOpt = typer.Option(True, "--overlap-param-gather/--no-overlap-param-gather",
                      help="Hide the ZeRO/distributed-optimizer weight gather behind forward.")
TpcoOpt = typer.Option(False, "--tp-comm-overlap/--no-tp-comm-overlap", help="Overlap TP comm with GEMMs (needs sp).")
EpcoOpt = typer.Option(False, "--ep-comm-overlap/--no-ep-comm-overlap",
                       help="Overlap EP all-to-alls with another micro-batch (Megatron/DeepEP-style).")
OverheadOpt = typer.Option(MemoryAllowance().fixed_gib, "--overhead-gib",
                           help="Fixed per-GPU runtime allowance (CUDA context, NCCL, workspaces).")
FragOpt = typer.Option(MemoryAllowance().fragmentation, "--fragmentation",
                       help="Allocator fragmentation allowance, fraction of tensor memory.")
InputLenOpt = typer.Option(1024, "--input-len", min=1, help="Inference: prompt tokens per request.")
OutputLenOpt = typer.Option(256, "--output-len", min=1, help="Inference: generated tokens per request.")
KvDtypeOpt = typer.Option("bf16", "--kv-dtype", help="Inference: KV-cache dtype bf16 | fp16 | fp8.")
TtftOpt = typer.Option(None, "--ttft-slo", help="Inference: time-to-first-token objective, seconds.")
TpotOpt = typer.Option(None, "--tpot-slo", help="Inference: time-per-output-token objective, seconds.")
PrefixOpt = typer.Option(0.0, "--prefix-hit-rate", help="Inference: fraction of each prompt in the prefix cache.")
UtilOpt = typer.Option(0.9, "--gpu-memory-utilization", help="Inference: usable fraction of GPU memory.")
BlockOpt = typer.Option(16, "--block-size", min=1, help="Inference: tokens per KV block.")
MaxTokOpt = typer.Option(8192, "--max-num-batched-tokens", min=1, help="Inference: tokens per engine step.")
PpFirstOpt = typer.Option(0, "--pp-first-layers", "--decoder-first-pipeline-num-layers", min=0,
                          help="Layers on the first pipeline stage (0: an even share).")
PpLastOpt = typer.Option(0, "--pp-last-layers", "--decoder-last-pipeline-num-layers", min=0,
                         help="Layers on the last pipeline stage (0: an even share).")
EmbeddingSplitOpt = typer.Option(False, "--account-for-embedding-in-pipeline-split",
                                 help="Count the embedding as a layer of the first stage (Megatron).")
LossSplitOpt = typer.Option(False, "--account-for-loss-in-pipeline-split",
                            help="Count the loss as a layer of the last stage (Megatron).")
OrderOpt = typer.Option("-".join(DEFAULT_ORDER), "--axis-order",
                        help="Rank placement, innermost axis first (Megatron: tp-cp-ep-dp-pp).")


def emit(doc: dict, json_mode: bool, view) -> None:
    if json_mode:
        sys.stdout.write(report.dump_json(doc) + "\n")
    else:
        view()


@app.command()
def models(json_mode: bool = JsonOpt) -> None:
    """List the built-in models."""
    rows = [(m, param_counts(m)) for m in sorted(builtin_models().values(), key=lambda m: m.name)]
    emit(report.models_json(rows), json_mode, lambda: out.print(report.models_table(rows)))


@app.command()
def hardware(json_mode: bool = JsonOpt) -> None:
    """List the built-in GPUs and systems."""
    gpus = sorted(builtin_gpus().values(), key=lambda g: g.name)
    systems = sorted(builtin_systems().values(), key=lambda s: s.name)
    emit(report.hardware_json(gpus, systems), json_mode,
         lambda: [out.print(t) for t in report.hardware_tables(gpus, systems)])


@app.command()
def estimate(
    model: str = ModelOpt,
    hardware: str = HardwareOpt,
    nodes: int = NodesOpt,
    gpus_per_node: Optional[int] = GpusPerNodeOpt,
    tp: int = typer.Option(1, "--tp", min=1, help="Tensor-parallel degree."),
    pp: int = typer.Option(1, "--pp", min=1, help="Pipeline-parallel stages."),
    dp: Optional[int] = typer.Option(None, "--dp", min=1, help="Data-parallel degree (default: GPUs / (tp*pp*cp))."),
    cp: int = typer.Option(1, "--cp", min=1, help="Context-parallel degree."),
    ep: int = typer.Option(1, "--ep", min=1, help="Expert-parallel degree."),
    etp: Optional[int] = typer.Option(None, "--etp", min=1, help="Expert tensor-parallel degree (default: tp)."),
    vpp: int = typer.Option(1, "--vpp", min=1, help="Virtual pipeline stages per rank (interleaved schedule)."),
    pp_first: int = PpFirstOpt,
    pp_last: int = PpLastOpt,
    pp_layers: Optional[str] = typer.Option(None, "--pp-layers",
                                            help="Layers of every pipeline stage, e.g. 7,8,8,...,7 (uneven split)."),
    embedding_in_split: bool = EmbeddingSplitOpt,
    loss_in_split: bool = LossSplitOpt,
    sp: Optional[bool] = typer.Option(None, "--sp/--no-sp", help="Sequence parallelism (default: on when tp > 1)."),
    zero: int = typer.Option(0, "--zero", help="ZeRO stage 0-3 (1 = Megatron distributed optimizer)."),
    recompute: str = typer.Option("none", "--recompute", help="none | selective | full."),
    micro_batch: int = typer.Option(1, "--micro-batch", min=1, help="Sequences per micro-batch."),
    global_batch: Optional[int] = typer.Option(None, "--global-batch", min=1, help="Sequences per step (default: micro-batch x dp)."),
    seq_len: Optional[int] = SeqOpt,
    dtype: str = DtypeOpt,
    grad_dtype: str = GradDtypeOpt,
    fp8_params: bool = Fp8ParamsOpt,
    flash_attention: bool = FlashOpt,
    overlap_grad_reduce: bool = OgrOpt,
    overlap_param_gather: bool = OpgOpt,
    tp_comm_overlap: bool = TpcoOpt,
    ep_comm_overlap: bool = EpcoOpt,
    overhead_gib: float = OverheadOpt,
    fragmentation: float = FragOpt,
    mode: str = typer.Option("train", "--mode", help="train | infer."),
    input_len: int = InputLenOpt,
    output_len: int = OutputLenOpt,
    batch: int = typer.Option(64, "--batch", min=1, help="Inference: concurrent sequences per replica."),
    kv_dtype: str = KvDtypeOpt,
    ttft_slo: Optional[float] = TtftOpt,
    tpot_slo: Optional[float] = TpotOpt,
    prefix_hit_rate: float = PrefixOpt,
    gpu_memory_utilization: float = UtilOpt,
    block_size: int = BlockOpt,
    max_num_batched_tokens: int = MaxTokOpt,
    axis_order: str = OrderOpt,
    save: Optional[Path] = typer.Option(None, "--save", help="Write this plan to a plan file (for export, check)."),
    force: bool = typer.Option(False, "--force", help="Overwrite --save's file if it exists."),
    json_mode: bool = JsonOpt,
) -> None:
    """Memory, communication and step time of one training plan, or (--mode infer) memory, KV capacity,
    TTFT, TPOT and throughput of one serving plan."""
    if mode not in ("train", "infer"):
        raise LlmplanError(f"--mode {mode}: use train or infer")
    m = resolve_model(model)
    if mode == "infer":
        cluster = make_cluster(hardware, nodes, gpus_per_node)
        plan = build(ServePlan, {"tp": tp, "pp": pp, "dp": dp or max(1, cluster.num_gpus // (tp * pp)), "ep": ep,
                                 "weight_dtype": dtype, "kv_dtype": kv_dtype}, "serving plan options")
        job = make_job(input_len, output_len, batch, prefix_hit_rate, ttft_slo, tpot_slo, gpu_memory_utilization,
                       block_size, max_num_batched_tokens)
        allowance = make_allowance(overhead_gib, fragmentation)
        se = estimate_serving(m, cluster, plan, job, allowance)
        for w in se.warnings:
            if json_mode:
                sys.stderr.write(f"warning: {w}\n")
        emit(report.serve_json(se), json_mode, lambda: report.serve_view(out, se))
        if save is not None:
            save_best(save, serve_plan_document(se, allowance, report.serve_json(se),
                                                (spec_ref(model, save), spec_ref(hardware, save))), force, json_mode,
                      "the plan")
        return
    cluster = make_cluster(hardware, nodes, gpus_per_node)
    order = parse_order(axis_order)
    n = cluster.num_gpus
    if dp is None:
        dp = max(1, n // (tp * pp * cp))
    seq = seq_len if seq_len is not None else default_seq_len(m)
    plan = build(ParallelPlan, {
        "tp": tp, "pp": pp, "dp": dp, "cp": cp, "ep": ep, "etp": etp, "vpp": vpp,
        **pipeline_split(m, pp, pp_first, pp_last, pp_layers, embedding_in_split, loss_in_split),
        "sp": (tp > 1) if sp is None else sp, "zero": zero, "recompute": recompute,
        "micro_batch": micro_batch, "global_batch": global_batch if global_batch is not None else micro_batch * dp,
        "seq_len": seq, **switches(dtype, grad_dtype, fp8_params, flash_attention, overlap_grad_reduce,
                                   overlap_param_gather, tp_comm_overlap, ep_comm_overlap),
    }, "plan options")
    allowance = make_allowance(overhead_gib, fragmentation)
    e = estimate_training(m, cluster, plan, allowance, order)
    emit(report.estimate_json(e), json_mode, lambda: report.estimate_view(out, e))
    if save is not None:
        save_best(save, plan_document(e, allowance, order, report.estimate_json(e),
                                      (spec_ref(model, save), spec_ref(hardware, save))), force, json_mode, "the plan")


@app.command()
def search(
    model: str = ModelOpt,
    hardware: str = HardwareOpt,
    nodes: int = NodesOpt,
    gpus_per_node: Optional[int] = GpusPerNodeOpt,
    mode: str = typer.Option("train", "--mode", help="train | infer."),
    global_batch: Optional[int] = typer.Option(None, "--global-batch", min=1, help="Sequences per step."),
    batch_tokens: Optional[str] = typer.Option(None, "--batch-tokens",
                                               help="Tokens per step instead of --global-batch (e.g. 16M); default 4M."),
    seq_len: Optional[int] = SeqOpt,
    dtype: str = DtypeOpt,
    grad_dtype: str = GradDtypeOpt,
    fp8_params: bool = Fp8ParamsOpt,
    flash_attention: bool = FlashOpt,
    overlap_grad_reduce: bool = OgrOpt,
    overlap_param_gather: bool = OpgOpt,
    tp_comm_overlap: bool = typer.Option(True, "--tp-comm-overlap/--no-tp-comm-overlap",
                                         help="Overlap TP comm with GEMMs where sp is on (default on, as "
                                              "Megatron-Bridge / NeMo performance recipes set it)."),
    tp: Optional[int] = typer.Option(None, "--tp", min=1, help="Pin the tensor-parallel degree."),
    pp: Optional[int] = typer.Option(None, "--pp", min=1, help="Pin the pipeline stages."),
    cp: Optional[int] = typer.Option(None, "--cp", min=1, help="Pin the context-parallel degree."),
    ep: Optional[int] = typer.Option(None, "--ep", min=1, help="Pin the expert-parallel degree."),
    etp: Optional[int] = typer.Option(None, "--etp", min=1, help="Pin expert TP to 1 (--etp 1) or leave it to the search."),
    vpp: Optional[int] = typer.Option(None, "--vpp", min=1, help="Pin the virtual pipeline stages."),
    pp_first: int = PpFirstOpt,
    pp_last: int = PpLastOpt,
    embedding_in_split: bool = EmbeddingSplitOpt,
    loss_in_split: bool = LossSplitOpt,
    sp: Optional[bool] = typer.Option(None, "--sp/--no-sp", help="Pin sequence parallelism on or off."),
    zero: Optional[int] = typer.Option(None, "--zero", help="Pin the ZeRO stage."),
    recompute: Optional[str] = typer.Option(None, "--recompute", help="Pin recompute: none | selective | full."),
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
    explain_opt: bool = typer.Option(False, "--explain", help="Why #1 beats #2 and the conventional plan, part by part."),
    ep_comm_overlap: bool = EpcoOpt,
    save: Optional[Path] = typer.Option(None, "--save", help="Write the best plan to this JSON file."),
    force: bool = typer.Option(False, "--force", help="Overwrite --save's file if it exists."),
    overhead_gib: float = OverheadOpt,
    fragmentation: float = FragOpt,
    axis_order: str = OrderOpt,
    input_len: int = InputLenOpt,
    output_len: int = OutputLenOpt,
    max_batch: int = typer.Option(1024, "--max-batch", min=1, help="Inference: most concurrent sequences per replica."),
    kv_dtype: str = KvDtypeOpt,
    ttft_slo: Optional[float] = TtftOpt,
    tpot_slo: Optional[float] = TpotOpt,
    prefix_hit_rate: float = PrefixOpt,
    gpu_memory_utilization: float = UtilOpt,
    block_size: int = BlockOpt,
    max_num_batched_tokens: int = MaxTokOpt,
    request_rate: Optional[float] = typer.Option(None, "--request-rate",
                                                 help="Inference, --objective min-gpus: requests/s to sustain."),
    json_mode: bool = JsonOpt,
) -> None:
    """Rank every way to run a training job (or, --mode infer, to serve a model) on a cluster; exit 3 when
    none fits."""
    if mode not in ("train", "infer"):
        raise LlmplanError(f"--mode {mode}: use train or infer")
    if mode == "infer":
        if objective not in SERVE_OBJECTIVES:
            raise LlmplanError(f"--objective {objective} with --mode infer: use one of {', '.join(SERVE_OBJECTIVES)}")
        m = resolve_model(model)
        cluster = make_cluster(hardware, nodes, gpus_per_node)
        job = make_job(input_len, output_len, max_batch, prefix_hit_rate, ttft_slo, tpot_slo, gpu_memory_utilization,
                       block_size, max_num_batched_tokens)
        build(ServePlan, {"weight_dtype": dtype, "kv_dtype": kv_dtype}, "serving dtype options")
        allowance = make_allowance(overhead_gib, fragmentation)
        res = search_serving(m, cluster, job, dtype, kv_dtype, objective, top, request_rate, allowance,
                             {"tp": tp, "pp": pp, "ep": ep})
        doc = report.serve_search_json(res, m, cluster, job)
        emit(doc, json_mode, lambda: report.serve_search_view(out, res, m, cluster, job))
        if not res.ranked:
            sys.stderr.write(f"error: no serving plan for {m.name} on {cluster.num_gpus} GPUs fits and meets the "
                             "SLOs; see the pruned table\n")
            raise typer.Exit(EXIT_NO_FIT)
        if save is not None:
            best = res.ranked[0]
            save_best(save, serve_plan_document(best, allowance, report.serve_json(best),
                                                (spec_ref(model, save), spec_ref(hardware, save))), force, json_mode)
        return
    if objective not in OBJECTIVES:
        raise LlmplanError(f"--objective {objective}: use one of {', '.join(OBJECTIVES)}")
    if recompute is not None and recompute not in RECOMPUTE:
        raise LlmplanError(f"--recompute {recompute}: use none, selective or full")
    if zero is not None and not 0 <= zero <= 3:
        raise LlmplanError(f"--zero {zero}: ZeRO stages are 0, 1, 2 and 3")
    m = resolve_model(model)
    cluster = make_cluster(hardware, nodes, gpus_per_node)
    order = parse_order(axis_order)
    seq = seq_len if seq_len is not None else default_seq_len(m)
    if global_batch is None:
        tokens = parse_size(batch_tokens) if batch_tokens else DEFAULT_BATCH_TOKENS
        global_batch = global_batch_from_tokens(tokens, seq)
    flags = switches(dtype, grad_dtype, fp8_params, flash_attention, overlap_grad_reduce, overlap_param_gather,
                     tp_comm_overlap, ep_comm_overlap)
    build(ParallelPlan, {"seq_len": seq, "global_batch": global_batch, **flags}, "workload options")  # validates
    w = Workload(global_batch=global_batch, seq_len=seq, **flags)
    split = pipeline_split(m, pp, pp_first, pp_last, None, embedding_in_split, loss_in_split) if pp else (
        pipeline_split(m, 1, pp_first, pp_last, None, False, False))
    if (embedding_in_split or loss_in_split) and not pp:
        raise LlmplanError("--account-for-*-in-pipeline-split in search needs --pp (the split depends on it)")
    pins = {"pp_first": split["pp_first"] or None, "pp_last": split["pp_last"] or None,
            "tp": tp, "pp": pp, "cp": 1 if no_cp else cp, "ep": ep, "etp": etp if etp is None else ("1" if etp == 1 else "tp"),
            "vpp": vpp, "sp": sp, "zero": zero, "recompute": recompute, "micro_batch": micro_batch}
    space = default_space(m, cluster, w, pins, max_tp, max_pp, max_cp)
    allowance = make_allowance(overhead_gib, fragmentation)
    with progress_bar(not json_mode) as say:
        res = run_search(m, cluster, space, w, objective, top, allowance, order, progress=say,
                         min_headroom=min_headroom_bytes(min_headroom, cluster.system.gpu.hbm_bytes))
    doc = report.search_json(res, w, cluster, m, parse_size(train_tokens))
    emit(doc, json_mode, lambda: report.search_view(out, res, w, cluster, m, parse_size(train_tokens), explain_opt))
    if not res.ranked:
        sys.stderr.write(f"error: no plan fits {m.name} on {cluster.num_nodes} x {cluster.system.name}"
                         + (f"; it would fit with {'; '.join(res.suggestions)}" if res.suggestions else "") + "\n")
        raise typer.Exit(EXIT_NO_FIT)
    if save is not None:
        best = res.ranked[0]
        save_best(save, plan_document(best, allowance, order, report.estimate_json(best),
                                      (spec_ref(model, save), spec_ref(hardware, save))), force, json_mode)


def pipeline_split(m, pp: int, first: int, last: int, layers: Optional[str], embedding: bool,
                   loss: bool) -> dict:
    """The plan's stage layout from the pipeline options (one way at a time)."""
    ways = [name for name, on in (("--pp-layers", layers is not None), ("--pp-first-layers/--pp-last-layers",
                                  bool(first or last)), ("--account-for-*-in-pipeline-split", embedding or loss)) if on]
    if len(ways) > 1:
        raise LlmplanError(f"{' and '.join(ways)} each set the pipeline split; give one of them")
    if layers is not None:
        try:
            counts = tuple(int(x) for x in layers.replace(" ", "").split(",") if x != "")
        except ValueError:
            raise LlmplanError(f"--pp-layers {layers!r}: give one whole number of layers per stage, comma-separated "
                               f"(e.g. --pp-layers 7,8,8,7)") from None
        if len(counts) != pp:
            raise LlmplanError(f"--pp-layers lists {len(counts)} stage(s) but --pp is {pp}; give one layer count per "
                               f"stage (e.g. --pp {len(counts)})")
        return {"pp_layers": counts}
    if embedding or loss:
        first, last = accounted_split(m, pp, embedding, loss)
    return {"pp_first": first, "pp_last": last}


def switches(dtype: str, grad_dtype: str, fp8_params: bool, flash_attention: bool, overlap_grad_reduce: bool,
             overlap_param_gather: bool, tp_comm_overlap: bool, ep_comm_overlap: bool = False) -> dict:
    """The training switches estimate and search share (ParallelPlan / Workload field names)."""
    return {"dtype": dtype, "grad_dtype": grad_dtype, "fp8_params": fp8_params, "flash_attention": flash_attention,
            "overlap_grad_reduce": overlap_grad_reduce, "overlap_param_gather": overlap_param_gather,
            "tp_comm_overlap": tp_comm_overlap, "ep_comm_overlap": ep_comm_overlap}


def save_best(path: Path, doc: dict, force: bool, json_mode: bool, what: str = "the best plan") -> None:
    save_plan(path, doc, force=force)
    if not json_mode:
        out.print(f"saved {what} to {path}")


@app.command()
def export(
    plan_file: Path = typer.Argument(..., help="A plan file written by `llmplan search --save`."),
    to: str = typer.Option(..., "--to", help=f"{' | '.join(TARGETS)} | all"),
    out_dir: Path = typer.Option(Path("."), "--out", "-o", help="Folder for the files (created if missing)."),
    wrap: Optional[str] = typer.Option(None, "--wrap", help="Training target torchrun / slurm launch "
                                       "(megatron | torchtitan | deepspeed; default: the first that fits the plan)."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing files."),
    json_mode: bool = JsonOpt,
) -> None:
    """Write launcher files for a saved plan (exit 2 when the target cannot express it)."""
    pf = load_plan(plan_file)
    files, skipped = render_all(pf, to, wrap)
    paths = write_files(files, out_dir, force)
    emit({"schema": 1, "target": to, "files": [str(p) for p in paths], "skipped": skipped}, json_mode,
         lambda: report.export_view(out, paths, skipped))


@app.command()
def check(
    paths: list[Path] = typer.Argument(None, help="Spec, profile or plan files, or folders of them."),
    plans: Optional[Path] = typer.Option(None, "--plans", help="Folder of plan files to re-check."),
    min_headroom: Optional[float] = typer.Option(
        None, "--min-headroom", min=0.0, help="GiB each plan must leave free per GPU (default: 5% of its memory, as search)."),
    tolerance: float = typer.Option(0.05, "--tolerance", help="Allowed step-time regression (0.05 = 5%)."),
    param_tolerance: float = typer.Option(0.01, "--param-tolerance",
                                          help="Allowed gap between computed and declared parameters."),
    base: Optional[str] = typer.Option(None, "--base", help="Git revision to diff the specs against."),
    fmt: str = typer.Option("text", "--format", help="text | json | github | junit."),
) -> None:
    """Validate specs and profiles and re-check saved plans against them (exit 1 when a check fails)."""
    if fmt not in ("text", "json", "github", "junit"):
        raise LlmplanError(f"--format {fmt}: use text, json, github or junit")
    targets = list(paths or [])
    if not targets and plans is None:
        raise LlmplanError("give spec / plan paths or --plans DIR (e.g. llmplan check model_specs/ --plans plans/)")
    if plans is not None and not plans.is_dir():
        raise LlmplanError(f"--plans {plans} is not a folder")
    findings = run_checks(targets, plans, min_headroom, tolerance, param_tolerance)
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
    global_batch: Optional[int] = typer.Option(None, "--global-batch", min=1, help="For new plans: sequences per step."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", min=1, help="For new plans: sequence length."),
    json_mode: bool = JsonOpt,
) -> None:
    """Refresh every plan in --plans with current predictions; plan the given specs that have none."""
    plans.mkdir(parents=True, exist_ok=True)
    written, failed = [], []
    for pf_path in sorted(plans.glob("*.json")):
        try:
            pf = load_plan(pf_path, current=True)
            doc = pf.document
            refs = (doc.model_ref, doc.hardware_ref)
            model_now = pf.model
            cluster = pf.cluster
            if pf.mode == "infer":
                se = estimate_serving(model_now, cluster, pf.plan, pf.job, pf.allowance)
                new = serve_plan_document(se, pf.allowance, report.serve_json(se), refs if refs[0] else None)
            else:
                e = estimate_training(model_now, cluster, pf.plan, pf.allowance, pf.axis_order)
                new = plan_document(e, pf.allowance, pf.axis_order, report.estimate_json(e), refs if refs[0] else None)
            save_plan(pf_path, new, force=True)
            written.append(str(pf_path))
        except LlmplanError as exc:
            failed.append(f"{pf_path}: {exc}")
    locked = {read_plan_document(p).model_ref for p in plans.glob("*.json")}
    for spec in discover(list(paths or [])):
        ref = spec_ref(str(spec), plans / "x.json")
        if ref in locked:
            continue
        if hardware is None:
            failed.append(f"{spec}: no plan in {plans}; give --hardware and --nodes to create one")
            continue
        m = resolve_model(str(spec))
        cluster = make_cluster(hardware, nodes, None)
        seq = seq_len or default_seq_len(m)
        w = Workload(global_batch=global_batch or global_batch_from_tokens(DEFAULT_BATCH_TOKENS, seq), seq_len=seq)
        res = run_search(m, cluster, default_space(m, cluster, w), w, top=1)
        if not res.ranked:
            failed.append(f"{spec}: no plan fits on {nodes} x {cluster.system.name}")
            continue
        target = plans / f"{m.name}.{cluster.system.name}.plan.json"
        best = res.ranked[0]
        save_plan(target, plan_document(best, MemoryAllowance(), DEFAULT_ORDER, report.estimate_json(best),
                                        (spec_ref(str(spec), target), spec_ref(hardware, target))), force=True)
        written.append(str(target))
    if not written and not failed:
        raise LlmplanError(f"nothing to lock: no plan files in {plans} and no model specs given "
                           "(llmplan lock model_specs/ --plans DIR --hardware H --nodes N)")
    emit({"schema": 1, "written": written, "failed": failed}, json_mode,
         lambda: [out.print(f"locked {w}") for w in written] + [out.print(f"[red]failed[/] {f}") for f in failed])
    if failed:
        raise typer.Exit(1)


@app.command()
def bench(
    plan_file: Optional[Path] = typer.Option(None, "--plan", help="A plan file from `llmplan search --save`."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Without --plan: model name or spec path."),
    hardware: str = typer.Option("dgx-h100", "--hardware", help="Without --plan: profile the predictions use."),
    tp: Optional[int] = typer.Option(None, "--tp", min=1, help="Without --plan: tensor-parallel degree (default: nproc)."),
    cp: int = typer.Option(1, "--cp", min=1, help="Without --plan: context-parallel degree (shortens the sequence)."),
    seq_len: Optional[int] = SeqOpt,
    micro_batch: int = typer.Option(1, "--micro-batch", min=1, help="Without --plan: sequences per micro-batch."),
    nproc: int = typer.Option(2, "--nproc", min=1, help="Processes (GPUs) on this node; torchrun starts them."),
    backend: str = typer.Option("gloo", "--backend", help="gloo (CPU) | nccl (GPU)."),
    components: str = typer.Option("gemm,collectives,layer", "--components", help="Comma-separated subset."),
    sizes: str = typer.Option("1MiB,16MiB", "--sizes", help="Collective message sizes (nccl-tests convention)."),
    gemm_tokens: Optional[int] = typer.Option(None, "--gemm-tokens", min=1, help="Cap the GEMMs' token dimension."),
    timeout: float = typer.Option(300.0, "--timeout", help="Seconds before a hung run is stopped."),
    save: Optional[Path] = typer.Option(None, "--out", help="Write the raw results (input of llmplan calibrate)."),
    force: bool = typer.Option(False, "--force", help="Overwrite --out."),
    json_mode: bool = JsonOpt,
) -> None:
    """Run GEMM, collective and reference-layer micro-benchmarks and compare them with the predictions."""
    require_torch()
    if backend not in ("gloo", "nccl"):
        raise LlmplanError(f"--backend {backend}: use gloo (CPU) or nccl (GPU)")
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
    else:
        raise LlmplanError("give --plan plan.json or --model (with --tp, --seq-len, --micro-batch)")
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
        for t in report.bench_tables(rows):
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
    """Write a hardware profile with measured GEMM and collective efficiencies."""
    doc = read_document(results)
    system = calibrated_system(resolve_system(hardware), doc, str(results))
    write_profile(system, output, force)
    out.print(f"wrote {output}: {system.calibrated}")


def bench_notes(cfg) -> list[str]:
    """What the bench does differently from the plan, said up front."""
    m, p = cfg.model, cfg.plan
    notes = [f"the layer benchmark runs 1 of the {m.num_hidden_layers} layers of {m.name} (shape per layer "
             f"unchanged: s {p.seq_len // p.cp}, micro-batch {p.micro_batch}) with tp = nproc = {cfg.nproc}"]
    if p.tp != cfg.nproc:
        notes.append(f"the plan has tp {p.tp}; the layer and collectives run over the {cfg.nproc} processes here")
    if cfg.backend == "gloo":
        notes.append("CPU run: times are not comparable with the GPU profile; saved bytes and bytes sent are")
    sh = layer_shape(cfg)
    per_proc = 60 * sh["s"] * sh["b"] * sh["h"] + 30 * sh["a"] * sh["s"] ** 2 * sh["b"] / cfg.nproc
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        ram = None
    if ram and per_proc * cfg.nproc > 0.5 * ram:
        raise LlmplanError(f"one layer of {m.name} at seq {sh['s']} x micro-batch {sh['b']} needs about "
                           f"{per_proc / 2**30:.1f} GiB per process; this machine has {ram / 2**30:.0f} GiB: lower "
                           "--seq-len or --micro-batch, or run on GPUs")
    return notes


@contextmanager
def bench_progress(enabled: bool):
    if not (enabled and out.is_terminal):
        yield None
        return
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
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), console=out, transient=True) as bar:
        task = bar.add_task("searching", total=len(steps))
        yield lambda step: bar.update(task, description=step, completed=steps.index(step) if step in steps else 0)


def make_allowance(overhead_gib: float, fragmentation: float) -> MemoryAllowance:
    return build(MemoryAllowance, {"fixed_gib": overhead_gib, "fragmentation": fragmentation},
                 "memory allowance options")


def make_job(input_len, output_len, batch, prefix_hit_rate, ttft_slo, tpot_slo, util, block_size, max_tokens):
    return build(ServeJob, {"input_len": input_len, "output_len": output_len, "batch": batch,
                            "prefix_hit_rate": prefix_hit_rate, "ttft_slo_s": ttft_slo, "tpot_slo_s": tpot_slo,
                            "gpu_memory_utilization": util, "block_size": block_size,
                            "max_num_batched_tokens": max_tokens}, "inference workload options")


def make_cluster(hardware: str, nodes: int, gpus_per_node: int | None):
    """Resolve --hardware, build the cluster and check that its graph connects every GPU."""
    system = resolve_system(hardware)
    cluster = build(ClusterSpec, {"system": system, "num_nodes": nodes, "gpus_per_node": gpus_per_node},
                    "cluster options")
    validate(system, nodes)
    return cluster


@app.command()
def collective(
    op: str = typer.Option("all-reduce", "--op", help=f"One of: {', '.join(OPS)}."),
    size: str = typer.Option("1GiB", "--size", help="Buffer size as nccl-tests counts it, e.g. 256MiB, 1GiB, 4e9."),
    gpus: int = typer.Option(8, "--gpus", min=1, help="Ranks in the group."),
    hardware: str = typer.Option(..., "--hardware", help="Built-in system name or path to a system profile."),
    gpus_per_node: Optional[int] = typer.Option(None, "--gpus-per-node", min=1,
                                                help="Ranks placed on each node (default: fill nodes)."),
    algorithm: str = typer.Option("auto", "--algorithm", help="auto | ring | tree | hierarchical."),
    nvls: bool = typer.Option(True, "--nvls/--no-nvls", help="NVLink SHARP for all-reduce (NCCL_NVLS_ENABLE)."),
    json_mode: bool = JsonOpt,
) -> None:
    """Predicted time, algorithm and bus bandwidth of one collective (compare with nccl-tests)."""
    if op not in OPS:
        raise LlmplanError(f"--op {op} is not a collective llmplan models; use one of: {', '.join(OPS)}")
    if algorithm not in ("auto", "ring", "tree", "hierarchical"):
        raise LlmplanError(f"--algorithm {algorithm}: use auto, ring, tree or hierarchical")
    nbytes = parse_size(size)
    system = resolve_system(hardware)
    per_node = gpus_per_node or min(gpus, system.gpus_per_node)
    if gpus % per_node:
        raise LlmplanError(f"--gpus ({gpus}) must be a multiple of --gpus-per-node ({per_node})")
    cluster = make_cluster(hardware, gpus // per_node, per_node)
    span = span_of_ranks(list(range(gpus)), cluster)
    ct = collective_time(op, nbytes, span, system, algorithm, nvls)
    group = span.describe(*report.fabric_names(system))
    emit(report.collective_json(ct, group), json_mode, lambda: report.collective_view(out, ct, group, system))


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
