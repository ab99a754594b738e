"""check_plan: every rule that relates a plan to a model and a cluster, in one place (the pipeline rules'
predicates and messages are in specs/stages.py).

Each rule is a predicate written with arithmetic only, so it holds for one ParallelPlan and, elementwise,
for the numpy arrays of plans the search enumerates (the search counts how many plans each rule cuts).
Search, estimate and export all call these rules. Each violation names the rule, the values and valid
alternatives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from llmplan.errors import bounded_list
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ETP_SAME_AS_TP, ClusterSpec, ParallelPlan
from llmplan.specs.pools import HeteroPlan, PoolCluster
from llmplan.specs.schedule import schedule_of
from llmplan.specs.serve import ACCEPTANCE, ServeJob, ServePlan
from llmplan.specs.stages import (  # noqa: F401  (accounted_split, balanced_split, split_text, vpp_fits: re-exported)
    accounted_split, balanced_split, divisors, interleaving_schedules, layout_problem, no_interleave_fix,
    pp_multiple_message, schedule_microbatches_message, schedule_microbatches_ok, split_message, split_ok, split_text,
    vpp_fits, vpp_message, vpp_ok,
)
from llmplan.units import GIB


@dataclass(frozen=True)
class Violation:
    """One broken rule."""

    rule: str
    """Short identifier of the rule (stable; search counts pruned plans per rule)."""
    message: str
    """What is wrong, the values, the rule and the fix."""


def valid_tp(m: ModelSpec, max_tp: int | None = None, replicate_kv: bool = False) -> list[int]:
    """TP degrees that split the query heads, split the KV heads (or, serving, replicate them: `replicate_kv`),
    split the FFNs and a hybrid's recurrent heads and groups."""
    a, K = m.num_attention_heads, m.kv_heads
    ffns = [f for f in (m.intermediate_size if m.num_mlp_layers else 0, m.shared_ffn) if f]
    return [t for t in divisors(a) if (K % t == 0 or (replicate_kv and t % K == 0)) and all(f % t == 0 for f in ffns)
            and (max_tp is None or t <= max_tp) and bool(_mamba_ok(m, t)) and bool(_gdn_ok(m, t))]


Pred = Callable[[ModelSpec, Any, Any], Any]
Msg = Callable[[ModelSpec, Any, Any], str]


@dataclass(frozen=True)
class Rule:
    name: str
    ok: Pred
    """True (elementwise) where the plan keeps the rule."""
    message: Msg
    needs_cluster: bool = False


def _ffn_ok(m: ModelSpec, t: Any) -> Any:
    ok = True
    for f in (m.intermediate_size if m.num_mlp_layers else 0, m.shared_ffn):
        if f:
            ok = ok & (f % t == 0)
    return ok


def _as_bool(x: Any) -> Any:
    """A predicate's value as a bool or bool array (so `~` negates it on both paths)."""
    import numpy as np

    return np.asarray(x, dtype=bool)


def _absent_bf16_modules(m: ModelSpec, p: Any) -> list[str]:
    """The plan's bf16_modules the model does not have."""
    has = {"attention": m.num_attention_layers > 0, "latent_proj": bool(m.moe_latent_size)}
    return [x for x in p.bf16_modules if not has.get(x, False)]


def _bf16_stage_ok(m: ModelSpec, p: Any) -> Any:
    """Each pinned bf16 layer count within one pipeline stage's share of the layers (num_layers // pp), as
    Megatron-Core's TransformerConfig requires; elementwise over the search's arrays."""
    per_stage = m.num_hidden_layers // p.pp
    return ((p.bf16_layers_start or 0) <= per_stage) & ((p.bf16_layers_end or 0) <= per_stage)


def _foreign_modules(m: ModelSpec, p: ParallelPlan) -> list[str]:
    """The plan's recompute_modules that name a kind of layer the model lacks."""
    has = {"mla_up_proj": m.is_mla or bool(m.q_lora_rank), "moe": m.is_moe, "moe_act": m.is_moe,
           "shared_experts": bool(m.shared_ffn), "mhc": m.hc_mult > 1}
    return [x for x in p.recompute_modules if not has.get(x, True)]


def _mamba_ok(m: ModelSpec, t: Any, cp: Any = 1) -> Any:
    """Megatron-LM's MambaMixer splits the heads and the groups over TP (both divisible by tp) and its all-to-all
    CP splits each rank's heads over cp, the groups divided among or replicated across the cp ranks.
    Source: Megatron-LM megatron/core/ssm/mamba_mixer.py (asserts on ngroups and nheads % tp) and
    mamba_context_parallel.py (nheads_local_tp % cp_size; ngroups_local_tp and cp_size divide one another)."""
    if not m.count_layers("mamba"):
        return True
    H, G = m.mamba_num_heads or 1, m.n_groups or 1
    g_local = G // t
    groups_cp = (g_local > 0) & ((g_local % cp == 0) | (cp % (g_local + (g_local == 0)) == 0))  # no 0 divisor
    return (H % t == 0) & (G % t == 0) & ((H // t) % cp == 0) & groups_cp


def _gdn_ok(m: ModelSpec, t: Any, cp: Any = 1) -> Any:
    """Megatron-LM's GatedDeltaNet splits the key and value heads over TP and each rank's value heads over CP.
    Source: Megatron-LM megatron/core/ssm/gated_delta_net.py (num_key_heads and num_value_heads % tp_size,
    (num_value_heads // tp_size) % cp_size)."""
    if not m.count_layers("linear_attention"):
        return True
    Hk, Hv = m.linear_num_key_heads or 1, m.linear_num_value_heads or 1
    return (Hk % t == 0) & (Hv % t == 0) & ((Hv // t) % cp == 0)


def _mixer_heads(m: ModelSpec) -> str:
    parts = [f"mamba_num_heads {m.mamba_num_heads} and n_groups {m.n_groups}"] if m.count_layers("mamba") else []
    if m.count_layers("linear_attention"):
        parts.append(f"linear_num_key_heads {m.linear_num_key_heads} and linear_num_value_heads "
                     f"{m.linear_num_value_heads}")
    return "; ".join(parts)


def _host_bytes(m: ModelSpec, p: Any, c: ClusterSpec) -> tuple[Any, float]:
    """Offloaded activation bytes per GPU and the host bytes each GPU may take (the node's usable host memory over
    the GPUs used of it). The bytes are priced in cost/offload.py, which imports specs: imported at call time."""
    from llmplan.cost.offload import host_offload_bytes

    usable = c.system.host_usable_bytes
    return host_offload_bytes(m, p), (usable or 0.0) / c.gpus_per_node_used


def _host_fits(m: ModelSpec, p: Any, c: ClusterSpec) -> Any:
    """Offloaded activations of the node's GPUs within the usable host memory (ParallelPlan.offload_layers,
    SystemSpec.host_memory_gb); no offload or an unknown host memory: true. Derived: docs/formulas.md#mem.host"""
    import numpy as np

    if c.system.host_usable_bytes is None or not np.any(np.asarray(p.offload_layers) > 0):
        return True
    used, share = _host_bytes(m, p, c)
    return (p.pp != 1) | (used <= share)  # with pipeline stages rule offload_pp refuses the plan already


def _host_message(m: ModelSpec, p: ParallelPlan, c: ClusterSpec) -> str:
    used, share = _host_bytes(m, p, c)
    s, g = c.system, c.gpus_per_node_used
    per_layer = float(used) / max(min(p.offload_layers, m.num_hidden_layers), 1)
    most = int(share // per_layer) if per_layer > 0 else p.offload_layers
    fix = (f"offload at most {most} layers (--offload-activations-layers {most})" if most > 0
           else "drop --offload-activations-layers")
    return (f"offloaded activations ({float(used) / GIB:.1f} GiB per GPU, {float(used) * g / GIB:.0f} GiB per node of "
            f"{g} GPUs) exceed host memory ({s.host_memory_gb:g} GB per {s.name} node, "
            f"{s.host_memory_usable_fraction:.0%} usable: {share * g / GIB:.0f} GiB); {fix}, lower --micro-batch, "
            "or set host_memory_gb / host_memory_usable_fraction in a --hardware profile")


RULES: tuple[Rule, ...] = (
    Rule("tp_heads", lambda m, p, c: m.num_attention_heads % p.tp == 0,
         lambda m, p, c: f"tp ({p.tp}) must divide num_attention_heads ({m.num_attention_heads}) of {m.name}; "
                         f"valid tp: {bounded_list(valid_tp(m))}"),
    Rule("tp_kv_heads",
         lambda m, p, c: (m.num_attention_heads % p.tp != 0) | (m.kv_heads % p.tp == 0),
         lambda m, p, c: f"tp ({p.tp}) must divide num_key_value_heads ({m.kv_heads}) of {m.name} (Megatron's "
                         "num_query_groups rule: training does not replicate KV heads); valid tp: "
                         f"{bounded_list(valid_tp(m))}"),
    Rule("tp_ffn", lambda m, p, c: _ffn_ok(m, p.tp),
         lambda m, p, c: f"tp ({p.tp}) must divide the FFN width(s) "
                         f"({', '.join(str(f) for f in (m.intermediate_size if m.num_mlp_layers else 0, m.shared_ffn) if f)}) "
                         f"of {m.name}; valid tp: {bounded_list(valid_tp(m))}"),
    Rule("tp_recurrent_heads", lambda m, p, c: _mamba_ok(m, p.tp) & _gdn_ok(m, p.tp),
         lambda m, p, c: f"tp ({p.tp}) must divide the recurrent mixers' heads and groups ({_mixer_heads(m)}) of "
                         f"{m.name}: Megatron-LM shards them over TP; valid tp: "
                         f"{bounded_list(valid_tp(m))}"),
    Rule("cp_recurrent_heads", lambda m, p, c: ~_as_bool(_mamba_ok(m, p.tp) & _gdn_ok(m, p.tp))
         | (_mamba_ok(m, p.tp, p.cp) & _gdn_ok(m, p.tp, p.cp)),
         lambda m, p, c: f"cp ({p.cp}) must divide each TP rank's recurrent heads ({_mixer_heads(m)}, over tp "
                         f"{p.tp}) of {m.name}: Megatron-LM's context parallelism for Mamba-2 and Gated DeltaNet "
                         "layers trades the sequence split for a head split (all-to-all); lower --cp"),
    Rule("pp_layers", lambda m, p, c: split_ok(m, p), lambda m, p, c: split_message(m, p)),
    Rule("pp_layout", lambda m, p, c: layout_problem(m, p) is None, lambda m, p, c: layout_problem(m, p) or ""),
    Rule("schedule_no_interleave", lambda m, p, c: (p.vpp == 1) | schedule_of(p).interleaves,
         lambda m, p, c: f"the {p.pp_schedule} schedule runs one stage per rank (vpp {p.vpp} interleaves 1F1B); "
                         f"set vpp 1 or --pp-schedule {interleaving_schedules()}"),
    Rule("dualpipe_even_pp", lambda m, p, c: p.pp % schedule_of(p).pp_multiple == 0,
         lambda m, p, c: pp_multiple_message(p)),
    Rule("schedule_microbatches", lambda m, p, c: schedule_microbatches_ok(p),
         lambda m, p, c: schedule_microbatches_message(p)),
    Rule("vpp_needs_pp", lambda m, p, c: (p.vpp == 1) | (p.pp > 1),
         lambda m, p, c: f"vpp ({p.vpp}) needs pp > 1 (interleaving splits pipeline stages); set pp or vpp 1"),
    Rule("vpp_layers", lambda m, p, c: ~_as_bool(split_ok(m, p)) | (p.pp == 1) | vpp_ok(m, p),
         lambda m, p, c: vpp_message(m, p)),
    # Megatron-Core's interleaved schedule runs micro-batches through the chunks in groups of pp
    # (microbatch_group_size_per_vp_stage, default pp) and raises when the last group is partial
    # (pipeline_parallel/schedules.py, forward_backward_pipelining_with_interleaving, at d98e8a6)
    Rule("vpp_microbatches", lambda m, p, c: (p.vpp == 1) | ((p.num_microbatches >= p.pp)
                                                             & (p.num_microbatches % p.pp == 0)),
         lambda m, p, c: f"interleaving (vpp {p.vpp}) needs a whole number of groups of pp ({p.pp}) micro-batches "
                         f"per step, and global_batch / (micro_batch x dp) = {p.global_batch} / ({p.micro_batch} x "
                         f"{p.dp}) gives {p.num_microbatches} (Megatron-Core's interleaved schedule refuses a partial "
                         f"last group); make it a multiple of {p.pp} with --global-batch or --micro-batch, or do not "
                         f"interleave: {no_interleave_fix(p)}"),
    Rule("ep_dense", lambda m, p, c: m.is_moe | (p.ep == 1),
         lambda m, p, c: f"ep ({p.ep}) needs a mixture-of-experts model; {m.name} is dense: use ep 1"),
    # A dense model has no expert layers: expert tp 1 (what MoE recipes set, and Megatron ignores) or the
    # default (tp) is harmless; any other value describes no layer and leaves no expert group grid to place.
    Rule("etp_dense", lambda m, p, c: m.is_moe | (p.etp_resolved == p.tp) | (p.etp_resolved == 1),
         lambda m, p, c: f"expert tp ({p.etp_resolved}) applies to mixture-of-experts layers; {m.name} is dense: "
                         f"drop --etp (dense layers use tp, {p.tp})"),
    Rule("ep_experts", lambda m, p, c: (not m.is_moe) | (max(m.num_experts, 1) % p.ep == 0),
         lambda m, p, c: f"ep ({p.ep}) must divide the {m.num_experts} experts of {m.name}; "
                         f"valid ep: {bounded_list(divisors(m.num_experts))}"),
    Rule("etp_ffn", lambda m, p, c: (not m.is_moe) | (m.expert_ffn % p.etp_resolved == 0),
         lambda m, p, c: f"expert tp ({p.etp_resolved}) must divide the expert FFN width ({m.expert_ffn}) of "
                         f"{m.name}; valid: {bounded_list(divisors(m.expert_ffn)[:8])}"),
    Rule("expert_grid", lambda m, p, c: (not m.is_moe) | ((p.tp * p.cp * p.dp) % (p.etp_resolved * p.ep) == 0),
         lambda m, p, c: f"expert tp x ep ({p.etp_resolved} x {p.ep}) must divide tp x cp x dp "
                         f"({p.tp * p.cp * p.dp}) (Megatron's expert grid: world size divisible by etp x ep x pp); "
                         f"expert tp {'defaults to tp (Megatron)' if p.etp == ETP_SAME_AS_TP else 'is set by --etp'}"
                         ": most MoE recipes use --etp 1, or lower --ep"),
    Rule("recompute_layers", lambda m, p, c: True if p.recompute_layers is None else p.full,
         lambda m, p, c: f"recompute_layers ({p.recompute_layers}) recomputes whole layers (Megatron's block method), "
                         f"which needs recompute full (got {p.recompute}); use --recompute full or drop "
                         "--recompute-layers"),
    Rule("recompute_op", lambda m, p, c: (p.op == 0) | (not m.is_moe and not m.is_mla),
         lambda m, p, c: f"recompute op (torchtitan's per-op checkpointing, priced by the order of a dense "
                         f"layer's matmuls) is modelled for dense attention + MLP layers; {m.name} has "
                         f"{'expert' if m.is_moe else 'MLA'} layers: use --recompute full, selective or none"),
    Rule("recompute_op_dtype", lambda m, p, c: (p.op == 0) | (not p.low_precision),
         lambda m, p, c: f"recompute op with {p.dtype} matmuls: torchtitan's releases treat low-precision matmul "
                         "outputs differently (v0.2.2 recomputes them, 0.3.0 saves them), so the plan does not say "
                         "what runs; use --recompute full or none, or --dtype bf16"),
    Rule("recompute_modules", lambda m, p, c: (not p.recompute_modules) | p.selective,
         lambda m, p, c: f"recompute_modules ({', '.join(p.recompute_modules)}) are Megatron's selective recompute "
                         f"modules, but the plan recomputes {p.recompute}; use "
                         "--recompute selective or drop --recompute-modules"),
    Rule("recompute_modules_model", lambda m, p, c: not _foreign_modules(m, p),
         lambda m, p, c: f"recompute_modules {', '.join(_foreign_modules(m, p))} describe layers {m.name} does not "
                         "have (mla_up_proj: MLA attention or a query rank; moe, moe_act: expert layers; "
                         "shared_experts: shared experts; mhc: hyper-connections; Megatron TransformerConfig "
                         "rules); drop them from --recompute-modules"),
    Rule("recompute_moe_overlap", lambda m, p, c: ("moe" not in p.recompute_modules) | (not p.ep_comm_overlap),
         lambda m, p, c: "recompute_modules moe (recomputing the whole MoE layer) with ep_comm_overlap: Megatron "
                         "refuses --overlap-moe-expert-parallel-comm with it (TransformerConfig); drop one"),
    Rule("fp8_attention", lambda m, p, c: (not p.fp8_attention) | ((p.dtype == "fp8") & p.flash_attention),
         lambda m, p, c: f"fp8_attention with dtype {p.dtype}"
                         f"{'' if p.flash_attention else ' and unfused attention'}: FP8 dot-product attention is "
                         "Transformer Engine's fused (cuDNN) attention under an fp8 recipe (Megatron-Core "
                         "TransformerConfig.fp8_dot_product_attention with fp8 set); use an fp8 --precision with "
                         "fused attention, or drop --fp8-attention"),
    Rule("swiglu_fp8_input", lambda m, p, c: (not p.swiglu_fp8_input) | m.gated_mlp,
         lambda m, p, c: f"swiglu_fp8_input with {m.name}, whose MLP is not gated: Megatron stores the activation "
                         "input in fp8 for SwiGLU only (TransformerConfig, activation_func_fp8_input_store); drop "
                         "--swiglu-fp8-input"),
    # Megatron-Core optimizer/__init__.py (d98e8a6): "--use-precision-aware-optimizer only supported with
    # distributed optimizer"; Megatron-FSDP keeps its own main-weight buffer (--megatron-fsdp-main-params-dtype);
    # fp8 primary weights leave no bf16 weight for the remainder to complete (TE FusedAdam: "Works only when
    # param type is BF16")
    Rule("param_remainders", lambda m, p, c: (not p.param_remainders) | ((p.zero >= 1) & (p.zero <= 2)
                                                                        & (not p.fp8_params)),
         lambda m, p, c: f"param_remainders with zero {p.zero}{' and fp8_params' if p.fp8_params else ''}: "
                         "Megatron-Core keeps the master as 16-bit remainders only in its distributed optimizer "
                         "(zero 1 or 2) beside bf16 weights; "
                         f"{'use --no-fp8-params' if p.fp8_params else 'use --zero 1'} or drop --param-remainders"),
    Rule("bf16_layers", lambda m, p, c: (p.bf16_layers_start or 0) + (p.bf16_layers_end or 0) <= m.num_hidden_layers,
         lambda m, p, c: f"bf16_layers_start ({p.bf16_layers_start or 0}) + bf16_layers_end ({p.bf16_layers_end or 0}) "
                         f"exceeds {m.name}'s {m.num_hidden_layers} layers: the layers kept in bf16 are counted within "
                         f"the stack; give at most {m.num_hidden_layers} in all with --bf16-layers-start / "
                         "--bf16-layers-end"),
    Rule("bf16_modules", lambda m, p, c: not _absent_bf16_modules(m, p),
         lambda m, p, c: f"bf16_modules {', '.join(_absent_bf16_modules(m, p))}: {m.name} has no such module "
                         "(attention: attention layers; latent_proj: a latent MoE, moe_latent_size); drop them "
                         "from --bf16-modules"),
    Rule("bf16_layers_stage", lambda m, p, c: _bf16_stage_ok(m, p),
         lambda m, p, c: f"bf16_layers_start ({p.bf16_layers_start or 0}) / bf16_layers_end ({p.bf16_layers_end or 0}) "
                         f"above the {m.num_hidden_layers // p.pp} layers of a pipeline stage ({m.num_hidden_layers} "
                         f"layers / pp {p.pp}): Megatron-Core keeps each count within one stage (TransformerConfig "
                         "num_layers_at_start_in_bf16 / _end_); lower them or use a smaller --pp"),
    Rule("deepep_capacity", lambda m, p, c: p.moe_dispatcher != "deepep" or p.moe_capacity_factor is None,
         lambda m, p, c: f"moe_dispatcher deepep with moe_capacity_factor ({p.moe_capacity_factor}): Megatron's flex "
                         "dispatcher with the deepep backend does not pad experts to capacity (TransformerConfig "
                         "rule); drop --moe-capacity-factor or use --moe-dispatcher alltoall"),
    # Megatron-Core TransformerConfig (d98e8a6): moe_expert_rank_capacity_factor, the static per-rank budget a
    # dropless MoE layer needs inside a full-iteration graph, requires the flex dispatcher's hybridep backend;
    # the alltoall dispatcher waits for its token counts on the host (token_dispatcher.py, cuda_sync_point)
    Rule("cuda_graphs_moe",
         lambda m, p, c: (p.cuda_graphs != "full-iteration") | (not m.is_moe) | (p.moe_dispatcher != "alltoall")
         | (p.moe_capacity_factor is not None),
         lambda m, p, c: f"cuda_graphs full-iteration with a dropless alltoall MoE dispatcher ({m.name}): the "
                         "alltoall dispatcher copies each layer's token counts to the host and waits for them, "
                         "which a CUDA graph cannot capture (Megatron's static per-rank budget, "
                         "--moe-expert-rank-capacity-factor, needs the flex dispatcher); use --moe-dispatcher "
                         "deepep, a --moe-capacity-factor, or cuda_graphs layers / none"),
    # Megatron-Core TransformerConfig (d98e8a6): "full recompute is only supported with full iteration CUDA graph"
    Rule("cuda_graphs_recompute", lambda m, p, c: (p.cuda_graphs != "layers") | (p.full == 0),
         lambda m, p, c: "cuda_graphs layers with recompute full: Megatron-Core captures per-layer graphs only "
                         "with selective or no recompute (full recompute needs the full-iteration graph); use "
                         "cuda_graphs full-iteration or none, or --recompute selective"),
    # Megatron-Core TransformerConfig.__post_init__ (d98e8a6): cpu_offloading_num_layers within [0, num_layers),
    # no pipeline parallelism, no activation recompute, no CUDA graphs but the full-iteration one
    Rule("offload_layers", lambda m, p, c: p.offload_layers < m.num_hidden_layers,
         lambda m, p, c: f"offload_layers ({p.offload_layers}) must be below {m.name}'s {m.num_hidden_layers} layers: "
                         "Megatron-Core offloads the first N layers and keeps the rest on the GPU (cpu_offloading_"
                         f"num_layers < num_layers); use --offload-activations-layers 1 to {m.num_hidden_layers - 1}"),
    Rule("offload_pp", lambda m, p, c: (p.offload_layers == 0) | (p.pp == 1),
         lambda m, p, c: f"offload_layers ({p.offload_layers}) with pp {p.pp}: Megatron-Core has no activation offload "
                         "under pipeline parallelism (TransformerConfig: 'no support for Pipeline parallelism with CPU "
                         "offloading'); use --pp 1 or drop --offload-activations-layers"),
    Rule("offload_recompute", lambda m, p, c: (p.offload_layers == 0) | (p.recompute_code == 0),
         lambda m, p, c: f"offload_layers ({p.offload_layers}) with recompute {p.recompute}: Megatron-Core refuses "
                         "activation offload with activation recomputation (TransformerConfig); use --recompute none "
                         "or drop --offload-activations-layers"),
    Rule("offload_cuda_graphs", lambda m, p, c: (p.offload_layers == 0) | (p.cuda_graphs != "layers"),
         lambda m, p, c: f"offload_layers ({p.offload_layers}) with per-layer CUDA graphs: Megatron-Core supports CPU "
                         "offloading only with the full-iteration graph (TransformerConfig); use cuda_graphs none or "
                         "full-iteration, or drop --offload-activations-layers"),
    Rule("offload_host_memory", lambda m, p, c: _host_fits(m, p, c), lambda m, p, c: _host_message(m, p, c),
         needs_cluster=True),
    Rule("sp_needs_tp", lambda m, p, c: (p.sp == 0) | (p.tp > 1),
         lambda m, p, c: "sequence parallelism (sp) needs tp > 1; use --no-sp or raise tp"),
    Rule("cp_seq", lambda m, p, c: (p.cp == 1) | (p.seq_len % (2 * p.cp) == 0),
         lambda m, p, c: f"seq_len ({p.seq_len}) must be divisible by 2*cp ({2 * p.cp}) for context parallelism; "
                         f"valid cp: {bounded_list([x for x in divisors(p.seq_len // 2) if x > 1][:8])}"),
    # Training past max_position_embeddings is context extension (RoPE scaled: position interpolation, YaRN),
    # which Qwen3 and Llama 3 long-context stages run; learned absolute positions have no row past it.
    Rule("seq_len_context",
         lambda m, p, c: (p.seq_len <= m.max_position_embeddings) | (not m.learned_position_embeddings),
         lambda m, p, c: f"seq_len ({p.seq_len}) exceeds max_position_embeddings ({m.max_position_embeddings}) of "
                         f"{m.name}, whose learned position embeddings hold one row per position (only RoPE models "
                         "extend their context by scaling); lower --seq-len"),
    Rule("global_batch", lambda m, p, c: p.global_batch % (p.micro_batch * p.dp) == 0,
         lambda m, p, c: f"global_batch ({p.global_batch}) must be divisible by micro_batch x dp ({p.micro_batch} x "
                         f"{p.dp} = {p.micro_batch * p.dp}); valid micro_batch: "
                         f"{bounded_list([b for b in divisors(p.global_batch) if p.global_batch % (b * p.dp) == 0])}"),
    Rule("gpus_model_parallel", lambda m, p, c: c.num_gpus % (p.tp * p.pp * p.cp) == 0,
         lambda m, p, c: f"tp x pp x cp ({p.tp} x {p.pp} x {p.cp} = {p.tp * p.pp * p.cp}) must divide the "
                         f"{c.num_gpus} GPUs ({c.num_nodes} node{'s' * (c.num_nodes != 1)} x {c.gpus_per_node_used})",
         needs_cluster=True),
    Rule("gpus_dp", lambda m, p, c: (c.num_gpus % (p.tp * p.pp * p.cp) != 0) | (p.num_gpus == c.num_gpus),
         lambda m, p, c: f"tp x pp x cp x dp ({p.tp * p.pp * p.cp} x {p.dp} = {p.num_gpus}) must equal the "
                         f"{c.num_gpus} GPUs; dp must be {c.num_gpus // (p.tp * p.pp * p.cp)}",
         needs_cluster=True),
    Rule("dtype_hardware", lambda m, p, c: p.gemm_format in c.system.gpu.tflops,
         lambda m, p, c: f"{c.system.gpu.name} has no {p.gemm_format} tensor cores for {p.dtype}"
                         f"{' (' + p.recipe + ')' if p.low_precision else ''}; use --precision bf16 (this GPU "
                         f"supports: {', '.join(sorted(k for k in c.system.gpu.tflops if k not in ('tf32', 'fp32')))})",
         needs_cluster=True),
)


def check_plan(m: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec | None = None) -> list[Violation]:
    """All violations of `plan` for model `m` on `cluster` (empty list: the plan is valid)."""
    return [Violation(r.name, r.message(m, plan, cluster)) for r in RULES
            if (cluster is not None or not r.needs_cluster) and not bool(r.ok(m, plan, cluster))]


def _training_rules(*names: str) -> tuple[Rule, ...]:
    """The training rules that read only a plan's tp and ep, and so hold for a serving plan as written."""
    return tuple(r for r in RULES if r.name in names)


SERVE_MOE_RULES: tuple[Rule, ...] = (
    Rule("dp_attention_moe", lambda m, p, c: (not p.dp_attention) | m.is_moe,
         lambda m, p, c: f"--dp-attention shards the routed experts over the attention ranks; {m.name} is dense: "
                         "drop --dp-attention (replicas already run attention data-parallel)"),
    Rule("dp_attention_layout", lambda m, p, c: (not p.dp_attention) | ((p.tp == 1) & (p.pp == 1)),
         lambda m, p, c: f"--dp-attention runs attention whole on every GPU (tp 1, pp 1), but the plan has tp {p.tp} "
                         f"pp {p.pp}; use --tp 1 --pp 1 with --dp and --ep set to the GPUs of the pool"),
    Rule("dp_attention_ep", lambda m, p, c: (not p.dp_attention) | (p.ep == p.tp * p.pp * p.dp),
         lambda m, p, c: f"--dp-attention shards the experts over every GPU of the pool: ep ({p.ep}) must equal the "
                         f"{p.tp * p.pp * p.dp} GPUs (tp x pp x dp); use --ep {p.tp * p.pp * p.dp}"),
    Rule("moe_serving_needs_ep",
         lambda m, p, c: (p.ep > 1) | ((p.moe_dispatcher == "alltoall") & (not p.two_batch_overlap)
                                       & (p.redundant_experts == 0)),
         lambda m, p, c: "--moe-dispatcher deepep, --two-batch-overlap and --redundant-experts act on the expert-"
                         f"parallel all-to-all and its ranks, but ep is {p.ep}; raise --ep or drop them"),
    Rule("expert_dtype_moe", lambda m, p, c: (p.expert_dtype is None) | m.is_moe,
         lambda m, p, c: f"--expert-dtype {p.expert_dtype} applies to routed experts; {m.name} is dense: drop it "
                         "(the weights take --dtype)"),
)
"""Serving rules of the MoE deployment options (ServePlan.dp_attention, moe_dispatcher, two_batch_overlap,
redundant_experts, expert_dtype)."""


SERVE_RULES: tuple[Rule, ...] = (
    *_training_rules("tp_heads"),
    Rule("tp_kv_heads_serve",
         lambda m, p, c: (m.num_attention_heads % p.tp != 0) | (m.kv_heads % p.tp == 0) | (p.tp % m.kv_heads == 0),
         lambda m, p, c: f"tp ({p.tp}) must divide num_key_value_heads ({m.kv_heads}) of {m.name} or be a multiple "
                         f"of it (serving engines then replicate KV heads); valid tp: "
                         f"{bounded_list(valid_tp(m, replicate_kv=True))}"),
    *_training_rules("tp_ffn", "tp_recurrent_heads"),
    Rule("pp_layers", lambda m, p, c: m.num_hidden_layers % p.pp == 0,
         lambda m, p, c: f"pp ({p.pp}) must divide num_hidden_layers ({m.num_hidden_layers}) of {m.name}: a serving "
                         f"plan gives every pipeline stage an equal share of the layers; valid pp: "
                         f"{bounded_list(divisors(m.num_hidden_layers))}"),
    *_training_rules("ep_dense"),
    # EPLB's redundant experts join the routed ones before they are spread over the EP ranks (SGLang
    # --ep-num-redundant-experts: 256 + 32 = 288 experts make EP 72 or 96 possible).
    Rule("ep_experts", lambda m, p, c: (not m.is_moe) | ((max(m.num_experts, 1) + p.redundant_experts) % p.ep == 0),
         lambda m, p, c: f"ep ({p.ep}) must divide the {m.num_experts} experts of {m.name}"
                         + (f" plus the {p.redundant_experts} redundant ones ({m.num_experts + p.redundant_experts})"
                            if p.redundant_experts else "")
                         + f"; valid ep: {bounded_list(divisors(m.num_experts + p.redundant_experts))}"
                         + ("" if p.redundant_experts else " (or add --redundant-experts so that ep divides the sum)")),
    *SERVE_MOE_RULES,
    Rule("gpus_model_parallel", lambda m, p, c: c.num_gpus % (p.tp * p.pp) == 0,
         lambda m, p, c: f"tp x pp ({p.tp} x {p.pp} = {p.tp * p.pp}) must divide the {c.num_gpus} GPUs "
                         f"({c.num_nodes} node{'s' * (c.num_nodes != 1)} x {c.gpus_per_node_used}): each replica "
                         "takes tp x pp of them", needs_cluster=True),
    Rule("gpus_dp", lambda m, p, c: (c.num_gpus % (p.tp * p.pp) != 0) | (p.num_gpus == c.num_gpus),
         lambda m, p, c: f"tp x pp x replicas ({p.tp * p.pp} x {p.dp} = {p.num_gpus}) must equal the {c.num_gpus} "
                         f"GPUs; --dp (replicas) must be {c.num_gpus // (p.tp * p.pp)}", needs_cluster=True),
)
"""The rules of a serving plan (ServePlan: tp, pp, dp replicas, ep) beside its context and EP rules below."""


def check_serve_plan(m: ModelSpec, plan: ServePlan, job: ServeJob,
                     cluster: ClusterSpec | None = None) -> list[Violation]:
    """All violations of a serving plan (ServePlan + ServeJob): head, FFN and layer divisibility, experts and
    GPU count (SERVE_RULES), plus the context limit and the EP group size."""
    out = [Violation(r.name, r.message(m, plan, cluster)) for r in SERVE_RULES
           if (cluster is not None or not r.needs_cluster) and not bool(r.ok(m, plan, cluster))]
    if plan.ep > 1 and plan.ep > plan.tp * plan.dp:
        out.append(Violation("ep_serve", f"ep ({plan.ep}) cannot exceed tp x dp ({plan.tp * plan.dp}): serving "
                             "engines spread experts over the TP ranks of all replicas"))
    if m.is_moe and plan.ep > plan.tp and not plan.dp_attention and job.engine != "vllm":
        # SGLang splits its TP ranks into EP groups (--ep-size divides --tp-size) and TensorRT-LLM its TP ranks
        # (moe_ep_size x moe_tp_size = tp_size); only vLLM's DP + EP spans replicas without attention DP.
        out.append(Violation("ep_serve_engine", f"ep ({plan.ep}) above tp ({plan.tp}) spreads experts over several "
                             f"replicas, which {job.engine} does only with attention data parallel; add "
                             f"--dp-attention (tp 1, ep = GPUs), lower --ep to at most {plan.tp}, or use "
                             "--engine vllm"))
    if job.context > m.max_position_embeddings:
        scaling = f" (rope_scaling: {m.rope_scaling})" if m.rope_scaling else ""
        out.append(Violation("context", f"input_len + output_len ({job.input_len} + {job.output_len} = "
                             f"{job.context}) exceeds max_position_embeddings ({m.max_position_embeddings}) of "
                             f"{m.name}{scaling}; lower --input-len or --output-len"))
    return out + speculative_violations(m, plan, job)


def speculative_violations(m: ModelSpec, plan: ServePlan, job: ServeJob) -> list[Violation]:
    """Speculative decoding's rules: MTP needs the model's MTP layers, a method without a published
    acceptance rate needs one given, the draft shares the target's vocabulary, one pipeline stage."""
    s = job.speculative
    if s is None:
        return []
    out = []
    if s.method == "mtp" and m.num_nextn_predict_layers == 0:
        out.append(Violation("speculative_mtp", f"speculative method mtp drafts with the model's multi-token-"
                             f"prediction layers, but {m.name} has num_nextn_predict_layers 0; use --speculative "
                             "eagle or ngram"))
    if s.acceptance_rate is None and s.method not in ACCEPTANCE:
        why = ("it depends on how much of each output repeats its prompt" if s.method == "ngram" else
               "its paper reports acceptance lengths of tree drafts, not a per-token rate")
        out.append(Violation("speculative_acceptance", f"speculative method {s.method} has no published "
                             f"acceptance rate ({why}); give --acceptance P, the fraction of draft tokens accepted "
                             "(0-1)"))
    if s.draft is not None and s.draft.vocab_size != m.vocab_size:
        out.append(Violation("speculative_vocab", f"draft model {s.draft.name} has vocab_size "
                             f"{s.draft.vocab_size} but {m.name} has {m.vocab_size}; the draft must share the "
                             "target's vocabulary: name a draft of the same family"))
    if plan.pp > 1:
        out.append(Violation("speculative_pp", f"speculative decoding is priced on one pipeline stage, the plan "
                             f"has pp {plan.pp}; use --pp 1 (raise --tp instead)"))
    return out


def check_pools(m: ModelSpec, hp: HeteroPlan, pc: PoolCluster) -> list[Violation]:
    """The rules of a plan placed on a cluster of several pools (specs.pools.HeteroPlan), beside check_plan's
    rules that every pool's part keeps: each pool named exists and holds the GPUs its part takes in whole nodes;
    a pool's pipeline stages are consecutive (its ranks one block: one SLURM het-group); and every TP, CP and
    EP group stays inside one pool (stages: a stage's groups lie in its pool; replicas: each pool holds whole EP
    groups), so no per-layer collective crosses the inter-pool fabric."""
    p, n = hp.plan, len(pc.pools)
    out: list[Violation] = []
    if hp.stage_pools is not None:
        bad = sorted({g for g in hp.stage_pools if g >= n})
        if bad:
            return [Violation("pool_index", f"stage_pools names pool(s) {bad}; the cluster has {n} pools "
                                            f"(0..{n - 1})")]
        runs = [g for i, g in enumerate(hp.stage_pools) if i == 0 or hp.stage_pools[i - 1] != g]
        if len(runs) != len(set(runs)):
            out.append(Violation("pool_stages_consecutive",
                                 f"stage_pools {list(hp.stage_pools)}: each pool's stages must be consecutive "
                                 f"(one block of ranks per pool); e.g. {sorted(hp.stage_pools)}"))
        used = {g: hp.stage_pools.count(g) * p.tp * p.cp * p.dp for g in set(hp.stage_pools)}
    else:
        pools = hp.replica_pools or ()
        if len(pools) != n:
            return [Violation("pool_index", f"replica_pools lists {len(pools)} pools; the cluster has {n}")]
        used = {g: r * p.tp * p.pp * p.cp for g, r in enumerate(pools) if r}
        group = p.ep * p.etp_resolved
        for g, r in enumerate(pools):
            if r and (r * p.cp * p.tp) % group:
                out.append(Violation("pool_ep", f"pool {pc.pools[g].name} holds {r} replicas x cp {p.cp} x tp "
                                                f"{p.tp} = {r * p.cp * p.tp} ranks per stage, not a multiple of "
                                                f"ep x etp ({group}): an expert-parallel group would span two "
                                                f"pools; give each pool a multiple of {group} such ranks"))
    for g, gpus in sorted(used.items()):
        pool = pc.pools[g]
        per_node = pool.system.gpus_per_node
        if gpus > pool.num_gpus or (gpus % per_node and gpus > per_node):
            out.append(Violation("pool_gpus", f"the plan puts {gpus} GPUs on pool {pool.name}, which has "
                                              f"{pool.num_gpus} ({pool.nodes} x {per_node}); a pool's part must "
                                              f"fit it in whole nodes"))
        if p.tp > pool.system.domain_gpus:
            out.append(Violation("pool_tp", f"tp ({p.tp}) exceeds the {pool.system.domain_gpus}-GPU NVLink "
                                            f"domain of pool {pool.name}; keep tp within one node of the pool"))
    return out
