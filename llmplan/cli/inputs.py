"""Command-line values -> specs: every option that builds a spec goes through `build`, so bad input is one
clear line (exit 2)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, get_args

from pydantic import BaseModel, ValidationError

from llmplan.cli.options import SERVING_INSTEAD, SERVING_ONLY
from llmplan.errors import LlmplanError, not_one_of
from llmplan.fileio import excerpt, read_text
from llmplan.specs.layout import balanced_layout, parse_layout
from llmplan.specs.options import (SERVE_PLAN_FLAGS, CheckpointOptions, ClusterOptions, MemoryOptions, ServingOptions,
                                   SwitchOptions)
from llmplan.specs.plan import (ATTENTION_KERNELS, ATTENTION_RELEASES, BF16_MODULES, MXFP8_MODULES, EXPERT_GEMMS,
                                CUDA_GRAPHS,
                                MOE_DISPATCHERS, MOE_FLEX_BACKENDS, MOE_ROUTINGS, OPTIMIZER_MASTER_DTYPES, OPTIMIZERS,
                                OPTIMIZER_MOMENT_DTYPES, PRECISIONS, RECOMPUTE_MODULES, OFFLOAD_MODULES,
                                FUSED_LOSS_IMPLS, UNFUSED_LOSS_IMPLS, TP_IMPLS, CP_IMPLS, CP_COMM_TYPES, NORM_KERNELS, SOFTMAX_KERNELS,
                                FP8_SCALINGS, ClusterSpec, MemoryAllowance, ParallelPlan)
# reported: the commands' one path for a ValidationError, as build's; imported from here by cli/estimate.py
from llmplan.specs.registry import build, expected_values, reported, resolve_model, resolve_system  # noqa: F401
from llmplan.specs.resilience import CheckpointPolicy
from llmplan.specs.serve import (DEFAULT_BATCHED_TOKENS, LengthDistribution, ServeJob, SpeculativeMethod,
                                 SpeculativeSpec, WeightDtype)
from llmplan.topology.graph import validate

if TYPE_CHECKING:
    from llmplan.cost.serve_step import GraphHost


def pipeline_split(m, pp: int, first: int, last: int, layers: Optional[str], embedding: bool,
                   loss: bool, layout: Optional[str] = None, vpp: Optional[int] = None) -> dict:
    """The plan's stage layout from the pipeline options (one way at a time)."""
    ways = [name for name, on in (("--pp-layers", layers is not None), ("--pp-first-layers/--pp-last-layers",
                                  bool(first or last)), ("--account-for-*-in-pipeline-split", embedding or loss),
                                  ("--pp-layout", layout is not None)) if on]
    if len(ways) > 1:
        raise LlmplanError(f"{' and '.join(ways)} each set the pipeline split; give one of them")
    if layout is not None:
        return layout_split(m, layout, pp, vpp)
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
        from llmplan.specs.check import accounted_split
        first, last = accounted_split(m, pp, embedding, loss)
    return {"pp_first": first, "pp_last": last}


def layout_split(m, text: str, pp: int, vpp: Optional[int]) -> dict:
    """pp_layout from Megatron's --pipeline-model-parallel-layout string ('balanced': specs.layout.
    balanced_layout of pp x vpp chunks), and vpp = chunks / pp as Megatron infers it when --vpp is not given;
    a --vpp given (1 included) is kept, and one that disagrees with the chunks is check_plan's rule pp_layout."""
    if text.strip() == "balanced":
        v = vpp or 1
        return {"pp_layout": balanced_layout(m.num_hidden_layers, pp, v, m.num_nextn_predict_layers), "vpp": v}
    chunks = parse_layout(text)
    if vpp is None:
        vpp = len(chunks) // pp if len(chunks) % pp == 0 else 1
    return {"pp_layout": chunks, "vpp": vpp}


def refuse_other_mode(ctx: Any, mode: str, serving_reads: frozenset[str]) -> None:
    """A flag the user gave that the mode does not read is an error, not silently ignored: in --mode infer every
    option outside `serving_reads` (training's precision, ZeRO, recompute, batch...), in training mode the
    serving options (options.SERVING_ONLY). 'Given' is what the command line (or the environment) set,
    whatever its value, so that --zero 0 is refused as --zero 3 is (ctx: the command's typer.Context)."""
    named = named_options(ctx)
    given = [p for p in ctx.command.params if p.name in named]
    wrong = [p for p in given if (p.name not in serving_reads if mode == "infer" else p.name in SERVING_ONLY)]
    if not wrong:
        return
    flags = ", ".join(written_flags(ctx, frozenset(p.name for p in wrong)))
    verb = "apply" if len(wrong) > 1 else "applies"
    if mode == "infer":
        hints = list(dict.fromkeys(SERVING_INSTEAD[p.name] for p in wrong if p.name in SERVING_INSTEAD))
        precision = ctx.params.get("precision")
        if precision in PRECISIONS and any(p.name == "precision" for p in wrong):
            weights = precision if precision in get_args(WeightDtype) else PRECISIONS[precision][0]
            hints = [f"use --dtype {weights} for {precision} serving weights" if h == SERVING_INSTEAD["precision"]
                     else h for h in hints]
        raise LlmplanError(f"{flags} {verb} to training, not to --mode infer; drop {'them' if len(wrong) > 1 else 'it'}"
                           + (f" ({'; '.join(hints)})" if hints else ""))
    graphs = any(p.name in ("cuda_graphs", "cuda_graph_sizes") for p in wrong)
    raise LlmplanError(f"{flags} {verb} to serving (--mode infer), not to training; add --mode infer or drop "
                       f"{'them' if len(wrong) > 1 else 'it'}"
                       + (" (training's CUDA graphs: --train-cuda-graphs none | layers | full-iteration)"
                          if graphs else ""))


def named_options(ctx: Any) -> frozenset[str]:
    """The options the command line (or the environment) set, whatever their value (ctx: the command's
    typer.Context): --zero3-unit layer is named as --zero3-unit tensor is."""
    return frozenset(p.name for p in ctx.command.params if p.name and getattr(
        ctx.get_parameter_source(p.name), "name", None) in ("COMMANDLINE", "ENVIRONMENT"))


def _flag(param: Any, value: object) -> str:
    """The option as the user would write it: --zero 3, --no-sp."""
    opts = getattr(param, "opts", []) or [param.name]
    if getattr(param, "is_flag", False):
        secondary = getattr(param, "secondary_opts", [])
        return opts[0] if value or not secondary else secondary[0]
    return f"{opts[0]} {excerpt(str(value), 20)}"


def written_flags(ctx: Any, names: frozenset[str]) -> list[str]:
    """The options named `names` (parameter names, as named_options gives them) as the user wrote them, in the
    command's order: --tp 4, --no-sp (ctx: the command's typer.Context)."""
    return [_flag(p, ctx.params.get(p.name)) for p in ctx.command.params if p.name in names]


def checked_pins(cls: type[BaseModel], pins: dict) -> dict:
    """The axes `search` pins, checked against the bounds of the plan they will become (cls: ParallelPlan or
    ServePlan, whose Field bounds `estimate` applies too), so that a pinned --tp 70000 is the same clear error
    in both commands, naming the flag (PLAN_FLAGS; a pinned axis is always the user's value); None (free) axes
    are not checked."""
    build(cls, {k: v for k, v in pins.items() if v is not None and k in cls.model_fields}, "pinned axes",
          {**PLAN_FLAGS, "etp": "--etp", "vpp": "--vpp", "zero": "--zero"})
    return pins


def switches(s: SwitchOptions) -> dict:
    """The training switches estimate and search share, as ParallelPlan / Workload fields (a grad_dtype or
    fp8_params that search leaves free, None, takes ParallelPlan's default: search tries the other too);
    --precision names the dtype and its recipe at once (PRECISIONS); bias_dropout_fusion only where named (the
    caller settles it from the model: specs.defaults.default_bias_dropout_fusion)."""
    grad_dtype = s.grad_dtype if s.grad_dtype is not None else ParallelPlan.model_fields["grad_dtype"].default
    fp8_params = s.fp8_params if s.fp8_params is not None else ParallelPlan.model_fields["fp8_params"].default
    dtype, recipe = s.dtype, "tensorwise"
    if s.precision is not None:
        if s.precision not in PRECISIONS:
            raise LlmplanError(not_one_of("--precision", s.precision, PRECISIONS, "a recipe"))
        implied, recipe = PRECISIONS[s.precision]
        if dtype not in ("bf16", implied):
            raise LlmplanError(f"--dtype {dtype} contradicts --precision {s.precision} (dtype {implied}); give one")
        dtype = implied
    elif dtype == "fp4":
        recipe = "nvfp4"
    for flag, value, allowed, what in (("--attention-kernel", s.attention_kernel, ATTENTION_KERNELS, "a kernel"),
                                       ("--attention-release", s.attention_release, ATTENTION_RELEASES,
                                        "a release with a published attention rate"),
                                       ("--fused-loss-impl", s.fused_loss_impl, FUSED_LOSS_IMPLS,
                                        "a fused loss llmplan prices"),
                                       ("--unfused-loss-impl", s.unfused_loss_impl, UNFUSED_LOSS_IMPLS,
                                        "an unfused loss llmplan prices"),
                                       ("--tp-impl", s.tp_impl, TP_IMPLS, "a TP implementation"),
                                       ("--cp-impl", s.cp_impl, CP_IMPLS, "a CP ring"),
                                       ("--cp-comm-type", s.cp_comm_type, CP_COMM_TYPES,
                                        "a Transformer Engine CP attention llmplan prices"),
                                       ("--norm-kernel", s.norm_kernel, NORM_KERNELS, "a norm kernel"),
                                       ("--softmax-kernel", s.softmax_kernel, SOFTMAX_KERNELS, "a softmax kernel"),
                                       ("--fp8-scaling", s.fp8_scaling, FP8_SCALINGS,
                                        "a per-tensor fp8 scaling"),
                                       ("--moe-dispatcher", s.moe_dispatcher, MOE_DISPATCHERS, "an MoE dispatcher"),
                                       ("--moe-routing", s.moe_routing, MOE_ROUTINGS, "a routing"),
                                       ("--moe-flex-backend", s.moe_flex_backend, MOE_FLEX_BACKENDS,
                                        "a flex dispatcher backend"),
                                       ("--expert-gemm", s.expert_gemm, EXPERT_GEMMS, "an expert GEMM path"),
                                       ("--train-cuda-graphs", s.train_cuda_graphs, CUDA_GRAPHS,
                                        "a training CUDA-graph scope"),
                                       ("--optimizer-master-dtype", s.optimizer_master_dtype,
                                        OPTIMIZER_MASTER_DTYPES, "an optimizer master dtype"),
                                       ("--optimizer-moment-dtype", s.optimizer_moment_dtype,
                                        OPTIMIZER_MOMENT_DTYPES, "an optimizer moment dtype"),
                                       ("--optimizer", s.optimizer, OPTIMIZERS, "an optimizer llmplan prices")):
        if value is not None and value not in allowed:  # None: --attention-release not given
            raise LlmplanError(not_one_of(flag, excerpt(value), allowed, what))
    fusion = {} if s.bias_dropout_fusion is None else {"bias_dropout_fusion": s.bias_dropout_fusion}
    return {**{k: getattr(s, k) for k in SWITCHES_AS_GIVEN}, **fusion, "dtype": dtype, "recipe": recipe,
            "grad_dtype": grad_dtype, "fp8_params": fp8_params, "cuda_graphs": s.train_cuda_graphs,
            "cp_comm_type": s.cp_comm_type if s.cp_comm_type is not None else ParallelPlan.model_fields[
                "cp_comm_type"].default,
            "cp_a2a_size": s.cp_a2a_size if s.cp_a2a_size is not None else ParallelPlan.model_fields[
                "cp_a2a_size"].default, "bf16_modules": parse_bf16_modules(s.bf16_modules),
            "mxfp8_modules": _module_list(s.mxfp8_modules, "--mxfp8-modules", MXFP8_MODULES,
                                          "a module llmplan can run in MXFP8 under NVFP4"),
            "recompute_modules": parse_recompute_modules(s.recompute_modules),
            "offload_modules": _module_list(s.offload_modules, "--offload-modules", OFFLOAD_MODULES,
                                            "a Megatron offload module llmplan prices")}


SWITCHES_AS_GIVEN = ("flash_attention", "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap",
                     "pp_scatter_gather", "tp_backward_overlap", "ep_comm_overlap", "delay_wgrad",
                     "moe_capacity_factor",
                     "pp_schedule", "attention_kernel", "attention_release", "recompute_layers", "fused_loss",
                     "fused_loss_impl", "unfused_loss_impl", "tp_whole_embedding",
                     "tp_impl", "cp_impl", "cp_kv_repeated", "cp_comm_overlap", "fp32_param_shards", "megatron_fsdp",
                     "swiglu_fp8_input",
                     "fp8_attention", "fp8_output_proj", "moe_dispatcher",
                     "bf16_layers_start", "bf16_layers_end", "moe_routing", "expert_gemm", "moe_dispatch_sms",
                     "cuda_max_connections",
                     "moe_flex_backend", "ep_dispatch_fp8", "moe_router_fusion", "moe_router_padding",
                     "optimizer", "optimizer_master_dtype", "optimizer_moment_dtype", "param_remainders",
                     "kept_grad_shards", "fp32_embedding_grads", "grad_reduce",
                     "grad_accumulation", "grad_reduce_dtype", "grad_reduce_fp32_sum", "launch_blocking",
                     "offload_layers",
                     "offload_moe_act", "moe_paged_stash", "moe_rank_capacity_factor", "zero3_unit",
                     "mtp_layers", "indexer_loss",
                     "dp_replicate", "dp_outer_optimizer",
                     "rope_complex", "zero3_copy_out", "pp_blocking_sends",
                     "norm_kernel", "pp_unbatched_sends", "softmax_kernel", "fp8_scaling")
"""The SwitchOptions that reach ParallelPlan under the same name and value (switches parses the others)."""


def _module_list(text: str | None, flag: str, allowed: tuple[str, ...], what: str) -> tuple[str, ...]:
    """A comma- or space-separated list of module names for `flag`; a name outside `allowed` is an error."""
    names = tuple(x.strip() for x in (text or "").replace(" ", ",").split(",") if x.strip())
    unknown = [x for x in names if x not in allowed]
    if unknown:
        raise LlmplanError(f"{flag} {', '.join(unknown)}: not {what}; use a comma-separated list of "
                           f"{', '.join(allowed)}")
    return names


def parse_bf16_modules(text: str | None) -> tuple[str, ...]:
    """--bf16-modules "attention,latent_proj" -> ("attention", "latent_proj"); an unknown name is an error."""
    return _module_list(text, "--bf16-modules", BF16_MODULES, "a module llmplan can keep in bf16")


def parse_recompute_modules(text: str | None) -> tuple[str, ...]:
    """--recompute-modules "layernorm,moe_act" -> ("layernorm", "moe_act"); an unknown name is an error."""
    return _module_list(text, "--recompute-modules", RECOMPUTE_MODULES, "a Megatron recompute module llmplan prices")



def with_hardware_options(c: ClusterOptions) -> dict[str, dict[str, float]]:
    """The plan-file key recording the --power-limit / --domain-gpus a plan was made with (empty without
    them), so that `check` applies them to the hardware spec as it is now."""
    opts = {k: v for k, v in (("power_limit", c.power_limit), ("domain_gpus", c.domain_gpus)) if v is not None}
    return {"hardware_options": opts} if opts else {}


OPTION_FLAGS = {"num_nodes": "--nodes", "gpus_per_node": "--gpus-per-node", "fixed_gib": "--overhead-gib",
                "fragmentation": "--fragmentation", "ttft_slo_s": "--ttft-slo", "tpot_slo_s": "--tpot-slo",
                "prefix_hit_rate": "--prefix-hit-rate", "gpu_memory_utilization": "--gpu-memory-utilization",
                "block_size": "--block-size", "max_num_batched_tokens": "--max-num-batched-tokens",
                "engine": "--engine", "request_rate": "--request-rate", "weight_dtype": "--dtype",
                "kv_dtype": "--kv-dtype", "phase": "--phase", "zero": "--zero", "recompute": "--recompute",
                "dtype": "--dtype", "pp_schedule": "--pp-schedule", "grad_dtype": "--grad-dtype",
                "grad_reduce": "--grad-reduce", "grad_accumulation": "--grad-accumulation",
                "grad_reduce_dtype": "--grad-reduce-dtype", "zero3_unit": "--zero3-unit",
                "indexer_loss": "--indexer-loss",
                **SERVE_PLAN_FLAGS}
"""The flag that sets each spec field the options build, where one flag alone sets it: a bad value is one
line naming the flag and the value to give (registry.validation_message), not the field."""


PLAN_FLAGS = {"tp": "--tp", "pp": "--pp", "cp": "--cp", "ep": "--ep", "micro_batch": "--micro-batch",
              "seq_len": "--seq-len"}
"""The flags estimate's training plan takes as given, ParallelPlan field by field (dp, and unless given etp, vpp
and global_batch, may be derived, so their errors name the field)."""


def make_allowance(m: MemoryOptions) -> MemoryAllowance:
    return build(MemoryAllowance, {"fixed_gib": m.overhead_gib, "fragmentation": m.fragmentation},
                 "memory allowance options", OPTION_FLAGS)


CHECKPOINT_FLAGS = {"mode": "--checkpoint", "interval_s": "--checkpoint-interval",
                    "failures_per_gpu_hour": "--failure-rate"}


def make_checkpoint(c: CheckpointOptions) -> CheckpointPolicy:
    """--checkpoint, --checkpoint-interval and --failure-rate as a CheckpointPolicy (its Field bounds are the
    rule); a bad value is one line naming the flag."""
    try:
        # mode is the flag's str: CheckpointPolicy's Literal is the rule, and a bad value is reported below
        return CheckpointPolicy(mode=c.checkpoint, interval_s=c.checkpoint_interval,  # type: ignore[arg-type]
                                failures_per_gpu_hour=c.failure_rate)
    except ValidationError as e:
        err = e.errors()[0]
        flag = CHECKPOINT_FLAGS.get(str(err["loc"][0]), str(err["loc"][0]))
        if err["type"] in ("literal_error", "enum"):
            raise LlmplanError(not_one_of(flag, err["input"], expected_values(err))) from None
        raise LlmplanError(f"{flag} {err['input']}: {err['msg'].removeprefix('Value error, ')}") from None


def make_job(s: ServingOptions, batch: int, request_rate: float | None = None, tp: int = 1,
             host: GraphHost | None = None) -> ServeJob:
    """The serving workload: the serving options with the command's load (estimate --batch, search
    --max-batch and --request-rate); with a length distribution, input_len / output_len are its mean.
    `tp` and `host` (the GPU and model) pick the engine's default CUDA graph sizes (graph_sizes_of)."""
    from llmplan.cost.lengths import mean_length
    dists = {side: length_distribution(f"--{side}-len-dist", text, side, given)
             for side, text, given in (("input", s.input_len_dist, s.input_len), ("output", s.output_len_dist,
                                                                                  s.output_len))
             if text is not None}
    lengths = {f"{side}_len": max(1, round(mean_length(d))) for side, d in dists.items()}
    spec = speculative_of(s)  # its flags checked before the capture list reads --spec-tokens
    return build(ServeJob, {"input_len": s.input_len, "output_len": s.output_len, "batch": batch,
                            "prefix_hit_rate": s.prefix_hit_rate, "ttft_slo_s": s.ttft_slo, "tpot_slo_s": s.tpot_slo,
                            "gpu_memory_utilization": s.gpu_memory_utilization, "block_size": s.block_size,
                            "max_num_batched_tokens": s.max_num_batched_tokens, "engine": s.engine,
                            "cuda_graphs": s.cuda_graphs, "request_rate": request_rate, **lengths,
                            "cuda_graph_batch_sizes": graph_sizes_of(s, batch, tp, host),
                            "cuda_graph_sizes_default": s.cuda_graphs and s.cuda_graph_sizes is None,
                            "speculative": spec,
                            **{f"{side}_len_dist": d for side, d in dists.items()}},
                 "inference workload options", {**OPTION_FLAGS, **{f"{side}_len": f"--{side}-len" for side in
                                                                  ("input", "output") if side not in dists}})


GRAPH_SIZE_MAX, GRAPH_SIZES_MAX = 1 << 24, 64
"""ServeJob.cuda_graph_batch_sizes' bounds: the largest size, and how many sizes."""


def graph_sizes_of(s: ServingOptions, batch: int, tp: int = 1, host: GraphHost | None = None
                   ) -> tuple[int, ...] | None:
    """--cuda-graph-sizes as sorted distinct positive batch sizes, or the engine's default captured sizes for a
    largest batch of `batch`, at `tp` on `host` (cost.serve_step.default_graph_sizes;
    serving.estimate_serving re-derives SGLang's for each plan's tp); None without CUDA graphs.
    A bad list is one line naming the flag."""
    if not s.cuda_graphs:
        if s.cuda_graph_sizes is not None:
            raise LlmplanError("--cuda-graph-sizes with --no-cuda-graphs: eager decode pads to no graph")
        return None
    if s.cuda_graph_sizes is None:
        from llmplan.cost.serve_step import default_graph_sizes
        tokens = s.max_num_batched_tokens or DEFAULT_BATCHED_TOKENS  # SGLang's list does not read it
        return default_graph_sizes(s.engine, batch, tokens, tp, host,  # type: ignore[arg-type]
                                   (s.spec_tokens or 0) if s.speculative is not None else None)
    parts = [p.strip() for p in s.cuda_graph_sizes.split(",")]
    if not all(p.isdigit() and 1 <= int(p) <= GRAPH_SIZE_MAX for p in parts) or len(set(parts)) > GRAPH_SIZES_MAX:
        raise LlmplanError(f"--cuda-graph-sizes {s.cuda_graph_sizes}: want up to {GRAPH_SIZES_MAX} "
                           f"comma-separated sizes of 1-{GRAPH_SIZE_MAX}")
    return tuple(sorted({int(p) for p in parts}))


def speculative_of(s: ServingOptions) -> SpeculativeSpec | None:
    """--speculative, --spec-tokens, --acceptance and --draft-model as a SpeculativeSpec (None without
    --speculative; the others alone are refused)."""
    if s.speculative is None:
        alone = [f for f, v in (("--spec-tokens", s.spec_tokens), ("--acceptance", s.acceptance),
                                ("--draft-model", s.draft_model)) if v is not None]
        if alone:
            raise LlmplanError(f"{', '.join(alone)} {'apply' if len(alone) > 1 else 'applies'} to speculative "
                               "decoding; add --speculative mtp|eagle|eagle3|ngram or drop "
                               f"{'them' if len(alone) > 1 else 'it'}")
        return None
    methods = get_args(SpeculativeMethod)
    if s.speculative not in methods:
        raise LlmplanError(not_one_of("--speculative", s.speculative, methods, "a speculative decoding method"))
    if s.spec_tokens is None:
        raise LlmplanError(f"--speculative {s.speculative} needs --spec-tokens K, the draft tokens per sequence per "
                           "step (e.g. 1 for DeepSeek-V3's one MTP layer, 3-5 for EAGLE)")
    draft = resolve_model(s.draft_model) if s.draft_model is not None else None
    return build(SpeculativeSpec, {"method": s.speculative, "num_speculative_tokens": s.spec_tokens,
                                   "acceptance_rate": s.acceptance, "draft_model": s.draft_model, "draft": draft},
                 "speculative decoding options (--speculative, --spec-tokens, --acceptance, --draft-model)")


def length_distribution(flag: str, text: str, side: str, fixed: int) -> LengthDistribution:
    """A length distribution from its flag: lognormal:mean=M,sigma=S, a named trace shape (its published mean
    for this side, lognormal of TRACE_SIGMA), or a histogram file of `length,weight` lines. A --input-len /
    --output-len other than the default alongside it is refused (the distribution sets the mean)."""
    from llmplan.cost.lengths import TRACE_SHAPES, TRACE_SIGMA
    if fixed != ServeJob.model_fields[f"{side}_len"].default:
        raise LlmplanError(f"{flag} {text} and --{side}-len {fixed} both set the {side} length; give one of them")
    if text in TRACE_SHAPES:
        mean_in, mean_out, source = TRACE_SHAPES[text]
        return build(LengthDistribution, {"kind": "lognormal", "mean": mean_in if side == "input" else mean_out,
                                          "sigma": TRACE_SIGMA, "name": f"{text}: {source}"}, flag)
    if text.startswith("lognormal:"):
        fields: dict[str, Any] = {}
        for part in text.removeprefix("lognormal:").split(","):
            key, _, value = part.partition("=")
            try:
                fields[key.strip()] = float(value)
            except ValueError:
                fields[key.strip()] = value
        if set(fields) != {"mean", "sigma"}:
            raise LlmplanError(f"{flag} {text}: write lognormal:mean=M,sigma=S (M the mean tokens, S the "
                               "standard deviation of log length, e.g. lognormal:mean=2000,sigma=0.8)")
        return build(LengthDistribution, {"kind": "lognormal", **fields, "name": text}, flag)
    path = Path(text)
    if not text.strip() or not path.exists():  # Path("") is the current folder, which exists
        raise LlmplanError(
            f"{flag} {text if text.strip() else repr(text)}: not lognormal:mean=M,sigma=S, a trace shape "
            f"({' | '.join(TRACE_SHAPES)}) or an existing histogram file"
        )
    return build(LengthDistribution, {"kind": "histogram", **histogram_rows(flag, path), "name": text}, flag)


def histogram_rows(flag: str, path: Path) -> dict[str, list[Any]]:
    """`length,weight` per line (blank lines, `#` comments and a non-numeric header line skipped)."""
    lengths: list[Any] = []
    weights: list[Any] = []
    for n, line in enumerate(read_text(path).splitlines(), 1):
        row = line.split("#")[0].strip()
        if not row:
            continue
        cells = [c.strip() for c in row.split(",")]
        try:
            length, weight = int(cells[0]), float(cells[1])
        except (ValueError, IndexError):
            if not lengths and not weights and n == 1:
                continue  # a header
            raise LlmplanError(f"{flag} {path} line {n}: {excerpt(line)!r} is not `length,weight` (a whole number "
                               "of tokens and a weight)") from None
        lengths.append(length)
        weights.append(weight)
    return {"lengths": lengths, "weights": weights}


def cluster_of(c: ClusterOptions, nodes: int | None = None, domain_gpus: int | None = None) -> ClusterSpec:
    """make_cluster from the cluster options (nodes and domain_gpus, when given, replace theirs)."""
    return make_cluster(c.hardware, c.nodes if nodes is None else nodes, c.gpus_per_node if nodes is None else None,
                        c.power_limit, c.domain_gpus if domain_gpus is None else domain_gpus)


def make_cluster(hardware: str, nodes: int, gpus_per_node: int | None, power_limit: float | None = None,
                 domain_gpus: int | None = None, flags: Mapping[str, str] | None = OPTION_FLAGS):
    """Resolve --hardware (capped at --power-limit watts; --domain-gpus of each NVLink domain used, e.g. 64 of
    a 72-GPU rack so that power-of-two groups stay inside one), build the cluster and check that its graph
    connects every GPU."""
    system = resolve_system(hardware)
    if power_limit is None:  # the fleet's default cap, where the system profile states one
        power_limit = system.default_power_limit_w
    for flag, value, kwargs in (("--domain-gpus", domain_gpus, {"domain_gpus": domain_gpus}),
                                ("--power-limit", power_limit, {"power_limit": power_limit})):
        if value is not None:
            try:
                system = system.with_options(**kwargs)
            except ValueError as e:
                raise LlmplanError(f"{flag} {value:g}: {e}") from None
    cluster = build(ClusterSpec, {"system": system, "num_nodes": nodes, "gpus_per_node": gpus_per_node},
                    "cluster options", flags)
    validate(system, nodes)
    return cluster
