"""The command line's option groups as typed records: the CLI builds one per group from its flags and hands
them on (cli/options.py names each field's flag). They hold the values as given; the spec each becomes
(ClusterSpec, ParallelPlan, MemoryAllowance, CheckpointPolicy, ServeJob) holds the bounds and the rules, so
that a bad value is reported once, by the spec that owns it."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

OPTIONS_CONFIG = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class ClusterOptions(BaseModel):
    """Which model on which cluster (--model, --hardware, --nodes, ...): becomes a ModelSpec and a ClusterSpec."""

    model_config = OPTIONS_CONFIG
    model: str
    """Built-in model name or path to a model spec / Hugging Face config.json."""
    hardware: str
    """Built-in system name or path to a system profile."""
    nodes: int
    """Number of nodes (ClusterSpec.num_nodes)."""
    gpus_per_node: int | None
    """GPUs used per node; None: all of the system's."""
    power_limit: float | None
    """Board power limit per GPU, W; None: the profile's default cap."""
    domain_gpus: int | None
    """GPUs used of each NVLink domain; None: all."""


class MemoryOptions(BaseModel):
    """The per-GPU memory allowance (--overhead-gib, --fragmentation): becomes a MemoryAllowance."""

    model_config = OPTIONS_CONFIG
    overhead_gib: float | None
    """Fixed runtime allowance per GPU, GiB (MemoryAllowance.fixed_gib); None: priced (training) or the serving
    allowance."""
    fragmentation: float
    """Allocator fragmentation, a fraction of the churned tensor memory (MemoryAllowance.fragmentation)."""


class CheckpointOptions(BaseModel):
    """Goodput's inputs (--checkpoint, --checkpoint-interval, --failure-rate): becomes a CheckpointPolicy."""

    model_config = OPTIONS_CONFIG
    checkpoint: str
    """sync | async | memory (CheckpointPolicy.mode)."""
    checkpoint_interval: float | None
    """Seconds between checkpoints; None: the optimal (CheckpointPolicy.interval_s)."""
    failure_rate: float | None
    """Failures per GPU-hour; None: the profile's (CheckpointPolicy.failures_per_gpu_hour)."""


class OutputOptions(BaseModel):
    """Where the answer goes (--json, --save, --force)."""

    model_config = OPTIONS_CONFIG
    json_mode: bool
    """One JSON document on stdout instead of tables."""
    save: Path | None
    """The plan file to write; None: none."""
    force: bool
    """Overwrite an existing --save file."""


class SwitchOptions(BaseModel):
    """The training switches estimate and search share (ParallelPlan / Workload fields, cli.inputs.switches);
    dtype is also the serving weights' dtype."""

    model_config = OPTIONS_CONFIG
    seq_len: int | None
    """Tokens per sequence (ParallelPlan.seq_len); None: min(default, the model's context)."""
    dtype: str
    """Compute dtype (ParallelPlan.dtype; serving: ServePlan.weight_dtype)."""
    precision: str | None
    """A training recipe naming dtype and scaling at once (specs.plan_choices.PRECISIONS); None: from dtype."""
    fp8_scaling: str
    """ParallelPlan.fp8_scaling."""
    moe_capacity_factor: float | None
    """ParallelPlan.moe_capacity_factor; None: dropless."""
    pp_schedule: str
    """ParallelPlan.pp_schedule."""
    flash_attention: bool
    """ParallelPlan.flash_attention."""
    attention_kernel: str
    """ParallelPlan.attention_kernel."""
    attention_release: str | None
    """ParallelPlan.attention_release; None: the GPU's attention_efficiency."""
    fused_loss: bool
    """ParallelPlan.fused_loss."""
    fused_loss_impl: str = "native"
    """ParallelPlan.fused_loss_impl."""
    unfused_loss_impl: str = "eager"
    """ParallelPlan.unfused_loss_impl."""
    tp_whole_embedding: bool = False
    """ParallelPlan.tp_whole_embedding."""
    tp_impl: str
    """ParallelPlan.tp_impl."""
    cp_impl: str
    """ParallelPlan.cp_impl."""
    cp_kv_repeated: bool
    """ParallelPlan.cp_kv_repeated."""
    cp_comm_type: str | None
    """ParallelPlan.cp_comm_type; None (search only): p2p, and where the model needs them the others tried."""
    cp_a2a_size: int | None = None
    """ParallelPlan.cp_a2a_size; None (search only): each in-domain share tried under a2a+p2p (search.variants)."""
    cp_comm_overlap: bool
    """ParallelPlan.cp_comm_overlap."""
    rope_complex: bool
    """ParallelPlan.rope_complex."""
    bias_dropout_fusion: bool | None = None
    """ParallelPlan.bias_dropout_fusion; None: the model's (specs.defaults.default_bias_dropout_fusion)."""
    zero3_copy_out: bool
    """ParallelPlan.zero3_copy_out."""
    pp_blocking_sends: bool
    """ParallelPlan.pp_blocking_sends."""
    norm_kernel: str
    """ParallelPlan.norm_kernel."""
    softmax_kernel: str
    """ParallelPlan.softmax_kernel."""
    pp_unbatched_sends: bool
    """ParallelPlan.pp_unbatched_sends."""
    recompute_layers: int | None
    """ParallelPlan.recompute_layers."""
    offload_layers: int
    """ParallelPlan.offload_layers."""
    mtp_layers: int | None
    """ParallelPlan.mtp_layers (None: the model's own num_nextn_predict_layers)."""
    offload_moe_act: bool
    """ParallelPlan.offload_moe_act."""
    indexer_loss: str | None
    """ParallelPlan.indexer_loss (None: the model's recipe)."""
    moe_paged_stash: float | None
    """ParallelPlan.moe_paged_stash; None: off."""
    moe_rank_capacity_factor: float | None
    """ParallelPlan.moe_rank_capacity_factor; None: 1.5 where the plan has the budget."""
    dp_replicate: int
    """ParallelPlan.dp_replicate."""
    dp_outer_optimizer: bool
    """ParallelPlan.dp_outer_optimizer."""
    recompute_modules: str | None
    """Comma-separated Megatron recompute modules (ParallelPlan.recompute_modules); None: the default."""
    offload_modules: str | None = None
    """Comma-separated Megatron offload modules (ParallelPlan.offload_modules); None: none."""
    overlap_grad_reduce: bool
    """ParallelPlan.overlap_grad_reduce."""
    overlap_param_gather: bool
    """ParallelPlan.overlap_param_gather."""
    tp_comm_overlap: bool
    """ParallelPlan.tp_comm_overlap."""
    tp_backward_overlap: bool
    """ParallelPlan.tp_backward_overlap."""
    pp_scatter_gather: bool
    """ParallelPlan.pp_scatter_gather."""
    ep_comm_overlap: bool
    """ParallelPlan.ep_comm_overlap."""
    delay_wgrad: bool = False
    """ParallelPlan.delay_wgrad."""
    moe_dispatcher: str
    """ParallelPlan.moe_dispatcher."""
    expert_gemm: str
    """ParallelPlan.expert_gemm."""
    moe_routing: str
    """ParallelPlan.moe_routing."""
    moe_dispatch_sms: int | None
    """ParallelPlan.moe_dispatch_sms; None: the dispatcher's default."""
    cuda_max_connections: int | None = None
    """ParallelPlan.cuda_max_connections; None: as the launcher leaves it."""
    moe_flex_backend: str
    """ParallelPlan.moe_flex_backend."""
    train_cuda_graphs: str = "none"
    """ParallelPlan.cuda_graphs (--train-cuda-graphs none | layers | full-iteration); serving's decode graphs are
    ServingOptions.cuda_graphs (--cuda-graphs / --no-cuda-graphs)."""
    ep_dispatch_fp8: bool
    """ParallelPlan.ep_dispatch_fp8."""
    moe_router_fusion: bool = False
    """ParallelPlan.moe_router_fusion."""
    moe_router_padding: bool = False
    """ParallelPlan.moe_router_padding."""
    megatron_fsdp: bool = False
    """ParallelPlan.megatron_fsdp."""
    fp32_param_shards: bool
    """ParallelPlan.fp32_param_shards."""
    bf16_layers_start: int | None
    """ParallelPlan.bf16_layers_start; None: the recipe's default."""
    bf16_layers_end: int | None
    """ParallelPlan.bf16_layers_end; None: the recipe's default."""
    bf16_modules: str | None
    """Comma-separated modules kept in bf16 (ParallelPlan.bf16_modules); None: none."""
    mxfp8_modules: str | None
    """Comma-separated modules run in MXFP8 under NVFP4 (ParallelPlan.mxfp8_modules); None: none."""
    swiglu_fp8_input: bool
    """ParallelPlan.swiglu_fp8_input."""
    fp8_attention: bool
    """ParallelPlan.fp8_attention."""
    fp8_output_proj: bool
    """ParallelPlan.fp8_output_proj."""
    grad_dtype: str | None
    """ParallelPlan.grad_dtype; None (search only): both tried."""
    optimizer_master_dtype: str
    """ParallelPlan.optimizer_master_dtype."""
    optimizer_moment_dtype: str
    """ParallelPlan.optimizer_moment_dtype."""
    optimizer: str = "adam"
    """ParallelPlan.optimizer (adam | muon)."""
    param_remainders: bool
    """ParallelPlan.param_remainders."""
    kept_grad_shards: bool
    """ParallelPlan.kept_grad_shards."""
    fp32_embedding_grads: bool
    """ParallelPlan.fp32_embedding_grads."""
    grad_reduce: str
    """ParallelPlan.grad_reduce."""
    grad_accumulation: str
    """ParallelPlan.grad_accumulation."""
    grad_reduce_dtype: str
    """ParallelPlan.grad_reduce_dtype."""
    grad_reduce_fp32_sum: bool = False
    """ParallelPlan.grad_reduce_fp32_sum."""
    launch_blocking: bool
    """ParallelPlan.launch_blocking."""
    zero3_unit: str
    """ParallelPlan.zero3_unit."""
    fp8_params: bool | None
    """ParallelPlan.fp8_params; None (search only): both tried where the recipe allows."""
    axis_order: str
    """Rank placement, innermost axis first (topology.placement.parse_order)."""


class PipelineSplitOptions(BaseModel):
    """How layers split over pipeline stages, Megatron's uneven-split flags (cli.inputs.pipeline_split)."""

    model_config = OPTIONS_CONFIG
    pp_first: int
    """Layers on the first stage (ParallelPlan.pp_first); 0: an even share."""
    pp_last: int
    """Layers on the last stage (ParallelPlan.pp_last); 0: an even share."""
    embedding_in_split: bool
    """Count the embedding as a layer of the first stage."""
    loss_in_split: bool
    """Count the loss as a layer of the last stage."""


class PlanOptions(BaseModel):
    """estimate's training plan: its degrees and batch, each the ParallelPlan field of the same name."""

    model_config = OPTIONS_CONFIG
    tp: int
    """ParallelPlan.tp (serving: ServePlan.tp)."""
    pp: int
    """ParallelPlan.pp (serving: ServePlan.pp)."""
    dp: int | None
    """ParallelPlan.dp; None: GPUs / (tp * pp * cp)."""
    cp: int
    """ParallelPlan.cp."""
    ep: int
    """ParallelPlan.ep (serving: ServePlan.ep)."""
    etp: int | None
    """ParallelPlan.etp; None: tp."""
    vpp: int | None
    """ParallelPlan.vpp; None: 1, or the chunks of a --pp-layout over pp (as Megatron-LM infers it)."""
    pp_layers: str | None
    """Comma-separated layers of every stage (ParallelPlan.pp_layers); None: pipeline split options."""
    pp_layout: str | None
    """Megatron's pipeline layout string or 'balanced' (ParallelPlan.pp_layout); None: none."""
    sp: bool | None
    """ParallelPlan.sp; None: on when tp > 1."""
    zero: int
    """ParallelPlan.zero."""
    recompute: str
    """ParallelPlan.recompute."""
    micro_batch: int
    """ParallelPlan.micro_batch."""
    global_batch: int | None
    """ParallelPlan.global_batch; None: micro_batch x dp."""


class SearchPins(BaseModel):
    """search's space: the axes pinned (None: searched), the limits of the free ones and the batch."""

    model_config = OPTIONS_CONFIG
    tp: int | None
    """Pinned ParallelPlan.tp (serving: ServePlan.tp)."""
    pp: int | None
    """Pinned ParallelPlan.pp (serving: ServePlan.pp)."""
    cp: int | None
    """Pinned ParallelPlan.cp."""
    ep: int | None
    """Pinned ParallelPlan.ep (serving: ServePlan.ep)."""
    etp: int | None
    """Pinned ParallelPlan.etp."""
    vpp: int | None
    """Pinned ParallelPlan.vpp."""
    sp: bool | None
    """Pinned ParallelPlan.sp."""
    zero: int | None
    """Pinned ParallelPlan.zero."""
    recompute: str | None
    """Pinned ParallelPlan.recompute."""
    micro_batch: int | None
    """Pinned ParallelPlan.micro_batch."""
    max_tp: int | None
    """Largest tp tried; None: the NVLink domain."""
    max_pp: int | None
    """Largest pp tried."""
    max_cp: int | None
    """Largest cp tried."""
    no_cp: bool
    """Pin cp to 1."""
    global_batch: int | None
    """Sequences per step; None: from batch_tokens."""
    batch_tokens: str | None
    """Tokens per step (e.g. 16M); None: the default."""


class SearchGoal(BaseModel):
    """What search ranks by and shows."""

    model_config = OPTIONS_CONFIG
    objective: str
    """search.run.OBJECTIVES (serving: search.serve.SERVE_OBJECTIVES)."""
    train_tokens: str
    """Token budget for time-to-train / gpu-hours (e.g. 1T)."""
    top: int
    """Plans shown."""
    min_headroom: float | None
    """GiB each plan must leave free per GPU (CheckThresholds.min_headroom_gib)."""
    wide: bool
    """Tables with a column per degree."""
    explain_opt: bool
    """Explain why #1 beats #2 and the conventional plan."""
    budget_gpus: int | None = None
    """Training: GPUs to rent on each system of --hardware (whole nodes within it); None: --nodes."""
    price: str | None = None
    """Training: prices per GPU-hour, 'SYSTEM=USD,...', over the profiles' (search.systems)."""


class ServingOptions(BaseModel):
    """The serving workload and engine (--mode infer): with each command's load flags, becomes a ServeJob."""

    model_config = OPTIONS_CONFIG
    input_len: int
    """ServeJob.input_len."""
    output_len: int
    """ServeJob.output_len."""
    kv_dtype: str
    """ServePlan.kv_dtype."""
    ttft_slo: float | None
    """ServeJob.ttft_slo_s."""
    tpot_slo: float | None
    """ServeJob.tpot_slo_s."""
    prefix_hit_rate: float
    """ServeJob.prefix_hit_rate."""
    gpu_memory_utilization: float | None
    """ServeJob.gpu_memory_utilization (None: the engine's default)."""
    block_size: int
    """ServeJob.block_size."""
    max_num_batched_tokens: int | None
    """ServeJob.max_num_batched_tokens (None: the engine's default)."""
    engine: str
    """ServeJob.engine."""
    cuda_graphs: bool
    """ServeJob.cuda_graphs."""
    cuda_graph_sizes: str | None = None
    """ServeJob.cuda_graph_batch_sizes as written on the command line (1,2,4,...; None: the engine's default,
    cost.serve_step.default_graph_sizes)."""
    speculative: str | None = None
    """SpeculativeSpec.method (None: no speculative decoding)."""
    spec_tokens: int | None = None
    """SpeculativeSpec.num_speculative_tokens."""
    acceptance: float | None = None
    """SpeculativeSpec.acceptance_rate."""
    draft_model: str | None = None
    """SpeculativeSpec.draft_model (resolved to SpeculativeSpec.draft)."""
    input_len_dist: str | None = None
    """ServeJob.input_len_dist, as written on the command line."""
    output_len_dist: str | None = None
    """ServeJob.output_len_dist, as written on the command line."""


SERVE_PLAN_OPTIONS = "serving plan options"
"""The origin a bad serving plan value is reported under (registry.build), by `estimate --mode infer` and the
serving searches alike."""
SERVE_PLAN_FLAGS = {"weight_dtype": "--dtype", "kv_dtype": "--kv-dtype", "phase": "--phase",
                    "moe_dispatcher": "--moe-dispatcher", "redundant_experts": "--redundant-experts",
                    "ep_imbalance": "--ep-imbalance", "expert_dtype": "--expert-dtype"}
"""The flag that sets each ServePlan field a serving command builds from its options (a bad value names the
flag, registry.validation_message)."""


class MoeServingOptions(BaseModel):
    """One phase on its own and the MoE deployment of serving (estimate --mode infer): become ServePlan fields."""

    model_config = OPTIONS_CONFIG
    phase: str
    """ServePlan.phase."""
    dp_attention: bool
    """ServePlan.dp_attention."""
    two_batch_overlap: bool
    """ServePlan.two_batch_overlap."""
    redundant_experts: int
    """ServePlan.redundant_experts."""
    ep_imbalance: float
    """ServePlan.ep_imbalance."""
    expert_dtype: str | None
    """ServePlan.expert_dtype."""
