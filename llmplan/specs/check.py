"""check_plan: every rule that relates a plan to a model and a cluster, in one place (the pipeline rules'
predicates and messages are in specs/stages.py).

Each rule is a predicate written with arithmetic only, so it holds for one ParallelPlan and, elementwise,
for the numpy arrays of plans the search enumerates (the search counts how many plans each rule cuts).
Search, estimate and export all call these rules. Each violation names the rule, the values and valid
alternatives.

The rules are grouped by concern in sibling modules (specs/check_heads.py: tensor- and context-parallel heads;
check_pipeline.py: pipeline stages and schedules; check_experts.py: expert parallelism; check_switches.py:
recompute, precision, MoE dispatcher, CUDA graphs and offload switches); RULES below assembles them in their
order beside the sequence, batch and cluster rules, and check_plan runs them. Rule and Violation are in
specs/rule.py. Names other modules import from here (Violation, valid_tp, divisors, balanced_split,
accounted_split, vpp_fits, split_text) are re-exported.
"""

from __future__ import annotations

import math
from typing import Any

from llmplan.errors import bounded_list
from llmplan.specs.check_experts import EXPERT_RULES
from llmplan.specs.check_heads import HEAD_RULES, valid_tp
from llmplan.specs.check_pipeline import PIPELINE_RULES
from llmplan.specs.check_switches import SWITCH_RULES
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import CP_COMM_TYPES, ClusterSpec, ParallelPlan, cp_a2a_group, trained_model
from llmplan.specs.pools import HeteroPlan, PoolCluster
from llmplan.specs.rule import Rule, Violation, as_bool
from llmplan.specs.serve import ACCEPTANCE, ServeJob, ServePlan
from llmplan.specs.stages import (  # noqa: F401  (accounted_split, balanced_split, split_text, vpp_fits: re-exported)
    accounted_split, balanced_split, divisors, split_text, vpp_fits,
)


def _global_batch_fix(p: ParallelPlan) -> str:
    """The micro-batches that divide the global batch over dp, or, where none does, the batches that would."""
    valid = [b for b in divisors(p.global_batch) if p.global_batch % (b * p.dp) == 0]
    if valid:
        return f"valid micro_batch: {bounded_list(valid)}"
    up = -(-p.global_batch // p.dp) * p.dp
    return f"no micro_batch works at dp {p.dp}: make --global-batch a multiple of dp ({p.dp}), e.g. {up}"


def _masked_layers(m: ModelSpec, chunks: bool = True) -> str:
    """The model's attention that needs more than a causal mask, in words ('' where it has none): sliding-window
    layers (with their window) and chunked layers (with their chunk; `chunks` False: windows only); attention
    sinks apart (cp_masks_ok)."""
    w, c = m.count_layers("sliding_attention") if m.sliding_window else 0, m.count_layers("chunked_attention")
    parts = ([f"{w} sliding-window layers (window {m.sliding_window})"] if w else []) + \
        ([f"{c} chunked layers (chunk {m.attention_chunk_size})"] if c and chunks else [])
    return " and ".join(parts)


def _te_runs(m: ModelSpec, comm: str) -> bool:
    """Whether Transformer Engine's context-parallel attention of cp_comm_type `comm` runs the model's masks and
    softmax: sliding windows with a2a or all_gather only, a learnable softmax offset (attention sinks) with a2a
    only, chunked attention with none (TE's DotProductAttention and Megatron-Core have no chunked mask)."""
    windows, chunks = bool(_masked_layers(m, chunks=False)), bool(m.count_layers("chunked_attention"))
    return not chunks and (not windows or comm in ("a2a", "all_gather")) and (not m.attention_sinks or comm == "a2a")


def te_comm_types(m: ModelSpec) -> tuple[str, ...]:
    """The cp_comm_type values whose Transformer Engine attention runs the model (cp_masks_ok), p2p first; a
    DeepSeek Sparse Attention model only all_gather (cp_sparse_attention)."""
    return tuple(x for x in CP_COMM_TYPES if _te_runs(m, x) and (not m.is_sparse_attention or x == "all_gather"))


def cp_masks_ok(m: ModelSpec, p: ParallelPlan) -> bool:
    """Whether the plan's context-parallel implementation runs the model's attention masks and softmax. Transformer
    Engine (cp_impl te) runs causal or full masks with every cp_comm_type, sliding windows only with a2a or
    all_gather, a learnable softmax (attention sinks) only with a2a, and has no chunked mask (_te_runs);
    PyTorch's SDPA ring (torch-alltoall) only is_causal (no mask: ring attention raises on attn_bias); its
    FlexAttention CP (torch-allgather, as torchtitan runs it) all-gathers the K/V and applies any block mask.
    Source: NVIDIA/TransformerEngine@d0067d0 transformer_engine/pytorch/attention/dot_product_attention/
    context_parallel.py attn_forward_func_with_cp; pytorch/pytorch v2.13 torch/distributed/tensor/experimental/
    _context_parallel/_attention.py (_scaled_dot_product_ring_flash_attention, flex_input_fn)."""
    if p.cp_impl == "te":  # a workload switch, as cp_comm_type: one value for all plans of a search
        return _te_runs(m, p.cp_comm_type)
    return (p.cp_impl == "torch-allgather") | (not _masked_layers(m))


def _cp_mask_message(m: ModelSpec, p: ParallelPlan, c: object = None) -> str:
    te = p.cp_impl == "te"
    sinks = m.attention_sinks and te and p.cp_comm_type != "a2a"
    windows = _masked_layers(m, chunks=False) if te and p.cp_comm_type in ("p2p", "a2a+p2p") else ""
    chunks = _masked_layers(m) if not te or m.count_layers("chunked_attention") else ""
    what = " and ".join(x for x in (chunks or windows, "attention sinks" * sinks) if x)
    ok = te_comm_types(m)
    if not te:
        ring = "PyTorch's SDPA ring takes only a causal mask"
    elif m.count_layers("chunked_attention"):
        ring = "Transformer Engine and Megatron-Core have no chunked attention mask under any cp_comm_type"
    else:
        ring = (f"Transformer Engine's {p.cp_comm_type} context parallelism runs only "
                + ("causal or full masks with the plain softmax" if p.cp_comm_type in ("p2p", "a2a+p2p") else
                   "the plain softmax (a learnable softmax offset only with a2a)"))
    fix = f"--cp-comm-type {' or '.join(ok)} (with --cp-impl te), " if te and ok else ""
    return (f"cp_impl {p.cp_impl}{f' cp_comm_type {p.cp_comm_type}' * te} with cp {p.cp} cannot run {m.name}'s "
            f"{what}: {ring}; use {fix}--cp-impl torch-allgather (FlexAttention's all-gather of the K/V, which applies "
            "any mask) or --cp 1")


def _cp_unfused_message(m: ModelSpec, p: ParallelPlan, c: object = None) -> str:
    """Context parallelism runs only inside a fused attention kernel. Source: NVIDIA/Megatron-LM@d98e8a64dd
    megatron/core/transformer/dot_product_attention.py (DotProductAttention.__init__: "Context parallelism is only
    supported by TEDotProductAttention!"); pytorch/pytorch v2.13 torch/distributed/tensor/experimental/
    _context_parallel/_attention.py (the ring replaces only the flash, efficient and cuDNN SDPA kernels)."""
    return (f"cp {p.cp} with flash_attention off: context parallelism runs only inside a fused attention kernel "
            "(Megatron-Core's unfused DotProductAttention asserts context_parallel_size == 1, 'only supported by "
            "TEDotProductAttention'; PyTorch's ring replaces only the fused SDPA kernels); use --flash-attention "
            "or --cp 1")


def _cp_sparse_message(m: ModelSpec, p: ParallelPlan, c: object = None) -> str:
    return (f"cp_impl {p.cp_impl}{f' cp_comm_type {p.cp_comm_type}' * (p.cp_impl == 'te')} with cp {p.cp} cannot "
            f"run {m.name}'s DeepSeek Sparse Attention (top-{m.index_topk} keys per query from its lightning "
            "indexer): Megatron-Core's DSA runs context parallelism only by all-gathering the K/V (cp_comm_type "
            "allgather), not the ring or head split this plan prices; use --cp-comm-type all_gather (with "
            "--cp-impl te), --cp-impl torch-allgather or --cp 1")


def _cp_sparse_ok(m: ModelSpec, p: ParallelPlan) -> bool:
    """DSA's context parallelism all-gathers the K/V: cp_impl torch-allgather, or te with cp_comm_type all_gather.
    Source: NVIDIA/Megatron-LM@d98e8a6 megatron/core/transformer/transformer_config.py (__post_init__: "DSAttention
    context parallelism currently supports cp_comm_type=allgather only")."""
    return (not m.is_sparse_attention) or p.cp_impl == "torch-allgather" or \
        (p.cp_impl == "te" and p.cp_comm_type == "all_gather")


def _a2a_heads_ok(m: ModelSpec, p: ParallelPlan, c: object = None) -> Any:
    """Transformer Engine's a2a context parallelism (cp_impl te, cp_comm_type a2a) scatters each TP rank's query
    and KV heads over the cp ranks, so cp divides both (where tp splits them; tp_heads / tp_kv_heads say so
    otherwise); a2a+p2p scatters them over its a2a level, so cp_a2a_size divides both. Source:
    NVIDIA/TransformerEngine@d0067d0 transformer_engine/pytorch/attention/dot_product_attention/
    context_parallel.py, AttnFuncWithCPAndQKVOA2A.forward ("cp_comm_type='a2a' requires num_heads % cp_size == 0
    for Q, K, V"); AttnFuncWithCPAndKVP2P.forward (flash_attn_a2a_communicate over cp_group_a2a)."""
    if p.cp_impl != "te" or p.cp_comm_type not in ("a2a", "a2a+p2p"):  # workload switches: one value for all
        return True
    H, K, t = m.num_attention_heads, m.kv_heads, p.tp
    split = as_bool((H % t == 0) & (K % t == 0))
    d = p.cp if p.cp_comm_type == "a2a" else cp_a2a_group(p)
    levels = as_bool(p.cp_comm_type == "a2a" or _hierarchical_ok(m, p))  # else cp_hierarchical_sizes says
    return ~as_bool(p.cp > 1) | ~split | ~levels | (((H // t) % d == 0) & ((K // t) % d == 0))


def _a2a_heads_message(m: ModelSpec, p: ParallelPlan, c: object = None) -> str:
    H, K, t = m.num_attention_heads, m.kv_heads, p.tp
    ok = [x for x in divisors(math.gcd(H // t, K // t)) if x > 1]
    heads = f"query heads ({H}/{t} = {H // t}) and KV heads ({K}/{t} = {K // t}) of {m.name}"
    if p.cp_comm_type == "a2a+p2p":
        sizes = [x for x in ok if x < p.cp and p.cp % x == 0]
        fixes = ([f"--cp-a2a-size {bounded_list(sizes)}"] if sizes else []) + ["--cp-comm-type p2p"]
        return (f"cp_comm_type a2a+p2p with cp_a2a_size {p.cp_a2a_size} and tp {t} needs cp_a2a_size to divide each "
                f"TP rank's {heads}: Transformer Engine's a2a level scatters the heads over its ranks; use "
                f"{', or '.join(fixes)}")
    tps = [x for x in valid_tp(m) if (H // x) % p.cp == 0 and (K // x) % p.cp == 0]
    other = [x for x in te_comm_types(m) if x not in ("a2a", "a2a+p2p")]
    fixes = ([f"cp {bounded_list(ok)} at tp {t}"] if ok else []) + ([f"tp {bounded_list(tps)} at cp {p.cp}"]
                                                                      if tps else []) + \
        [f"--cp-comm-type {x}" for x in other] + ["--cp 1"]
    return (f"cp_comm_type a2a with cp {p.cp} and tp {t} needs cp to divide each TP rank's {heads}: Transformer "
            f"Engine's a2a context parallelism scatters the heads over the CP ranks; use {', or '.join(fixes)}")


def _hierarchical_ok(m: ModelSpec, p: ParallelPlan, c: object = None) -> Any:
    """Transformer Engine's a2a+p2p needs two levels: cp_a2a_size ranks of 2 or more that divide cp, and a ring of
    cp / cp_a2a_size of 2 or more (a level of one runs as plain p2p or a2a: attn_forward_func_with_cp).
    Source: NVIDIA/Megatron-LM@d98e8a6 megatron/training/arguments.py (context_parallel_size ==
    prod(hierarchical_context_parallel_sizes)); NVIDIA/TransformerEngine@d0067d0 context_parallel.py
    (attn_forward_func_with_cp: cp_group = [a2a_cp_group, p2p_cp_group], a group of size 1 falls back)."""
    if p.cp_impl != "te" or p.cp_comm_type != "a2a+p2p":  # workload switches: one value for all plans
        return True
    k = p.cp_a2a_size
    return ~as_bool(p.cp > 1) | ((k > 1) & (k < p.cp) & (p.cp % k == 0))


def _hierarchical_message(m: ModelSpec, p: ParallelPlan, c: object = None) -> str:
    H, K, t = m.num_attention_heads, m.kv_heads, p.tp
    split = H % t == 0 and K % t == 0  # the sizes that also scatter the TP rank's heads (cp_a2a_heads)
    sizes = [x for x in divisors(p.cp) if 1 < x < p.cp and (not split or ((H // t) % x == 0 and (K // t) % x == 0))]
    fix = f"--cp-a2a-size {bounded_list(sizes)}, or " if sizes else ""
    return (f"cp_comm_type a2a+p2p with cp {p.cp} and cp_a2a_size {p.cp_a2a_size} needs 1 < cp_a2a_size < cp, "
            "dividing cp: Megatron-Core splits each CP group into an a2a level of cp_a2a_size ranks and a p2p ring "
            "of cp / cp_a2a_size, and Transformer Engine runs a level of one as plain p2p or a2a; use "
            f"{fix}--cp-comm-type p2p or a2a")


RULES: tuple[Rule, ...] = (
    *HEAD_RULES,
    *PIPELINE_RULES,
    *EXPERT_RULES,
    *SWITCH_RULES,
    Rule("sp_needs_tp", lambda m, p, c: (p.sp == 0) | (p.tp > 1),
         lambda m, p, c: "sequence parallelism (sp) needs tp > 1; use --no-sp or raise tp"),
    Rule("cp_seq", lambda m, p, c: (p.cp == 1) | (p.seq_len % (2 * p.cp) == 0),
         lambda m, p, c: f"seq_len ({p.seq_len}) must be divisible by 2*cp ({2 * p.cp}) for context parallelism; "
                         f"valid cp: {bounded_list([x for x in divisors(p.seq_len // 2) if x > 1][:8])}"),
    Rule("cp_fused_attention", lambda m, p, c: (p.cp == 1) | as_bool(p.flash_attention), _cp_unfused_message),
    Rule("cp_attention_mask", lambda m, p, c: (p.cp == 1) | cp_masks_ok(m, p), _cp_mask_message),
    Rule("cp_hierarchical_sizes", _hierarchical_ok, _hierarchical_message),
    Rule("cp_a2a_heads", _a2a_heads_ok, _a2a_heads_message),
    # NVIDIA/Megatron-LM@d98e8a6 megatron/core/transformer/transformer_config.py: "DSAttention context parallelism
    # currently supports cp_comm_type=allgather only"
    Rule("cp_sparse_attention", lambda m, p, c: (p.cp == 1) | _cp_sparse_ok(m, p), _cp_sparse_message),
    # Training past max_position_embeddings is context extension (RoPE scaled: position interpolation, YaRN),
    # which Qwen3 and Llama 3 long-context stages run; learned absolute positions have no row past it.
    Rule("seq_len_context",
         lambda m, p, c: (p.seq_len <= m.max_position_embeddings) | (not m.learned_position_embeddings),
         lambda m, p, c: f"seq_len ({p.seq_len}) exceeds max_position_embeddings ({m.max_position_embeddings}) of "
                         f"{m.name}, whose learned position embeddings hold one row per position (only RoPE models "
                         "extend their context by scaling); lower --seq-len"),
    Rule("global_batch", lambda m, p, c: p.global_batch % (p.micro_batch * p.dp) == 0,
         lambda m, p, c: f"global_batch ({p.global_batch}) must be divisible by micro_batch x dp ({p.micro_batch} x "
                         f"{p.dp} = {p.micro_batch * p.dp}); {_global_batch_fix(p)}"),
    Rule("gpus_model_parallel", lambda m, p, c: c.num_gpus % (p.tp * p.pp * p.cp) == 0,
         lambda m, p, c: f"tp x pp x cp ({p.tp} x {p.pp} x {p.cp} = {p.tp * p.pp * p.cp}) must divide the "
                         f"{c.num_gpus} GPUs ({c.num_nodes} node{'s' * (c.num_nodes != 1)} x {c.gpus_per_node_used})",
         needs_cluster=True),
    Rule("gpus_dp", lambda m, p, c: (c.num_gpus % (p.tp * p.pp * p.cp) != 0) | (p.num_gpus == c.num_gpus),
         lambda m, p, c: f"tp x pp x cp x dp ({p.tp * p.pp * p.cp} x {p.dp} = {p.num_gpus}) must equal the "
                         f"{c.num_gpus} GPUs; dp must be {c.num_gpus // (p.tp * p.pp * p.cp)}",
         needs_cluster=True),
    # Megatron-LM parallel_state.py (2a75ac12c): "Data parallel size should be divisible by partial DistOpt shard
    # factor" (dp x cp there; llmplan places the replicas along dp, so dp), and the expert data-parallel size
    # likewise; Megatron-FSDP raises NotImplementedError for outer optimizer sharding unless the inner strategy
    # is optim_grads_params (param_and_grad_buffer.py).
    Rule("dp_replicate_divides",
         lambda m, p, c: (p.dp % p.dp_replicate == 0) & (p.expert_dp % p.dp_replicate == 0),
         lambda m, p, c: f"dp_replicate ({p.dp_replicate}) must divide dp ({p.dp})"
                         f"{f' and the expert data-parallel degree ({p.expert_dp})' if m.is_moe else ''}: each "
                         "replica shards the ZeRO states over an equal group; valid dp_replicate: "
                         f"{bounded_list([r for r in divisors(p.dp) if p.expert_dp % r == 0])}"),
    Rule("dp_replicate_zero", lambda m, p, c: (p.dp_replicate == 1) | (p.zero >= 1),
         lambda m, p, c: f"dp_replicate ({p.dp_replicate}) replicates ZeRO shard groups, but zero is 0 (nothing is "
                         "sharded); use --zero 1..3 or --dp-replicate 1"),
    Rule("dp_outer_optimizer", lambda m, p, c: (not p.dp_outer_optimizer) | ((p.dp_replicate > 1) & (p.zero == 3)),
         lambda m, p, c: f"dp_outer_optimizer shards the optimizer across the replicas of a ZeRO-3 shard group "
                         f"(Megatron-FSDP outer optim sharding), but dp_replicate is {p.dp_replicate} and zero "
                         f"{p.zero}; use --zero 3 with --dp-replicate > 1, or drop --dp-outer-optimizer"),
    Rule("dtype_hardware", lambda m, p, c: p.gemm_format in c.system.gpu.tflops,
         lambda m, p, c: f"{c.system.gpu.name} has no {p.gemm_format} tensor cores for {p.dtype}"
                         f"{' (' + p.recipe + ')' if p.low_precision else ''}; use --precision bf16 (this GPU "
                         f"supports: {', '.join(sorted(k for k in c.system.gpu.tflops if k not in ('tf32', 'fp32')))})",
         needs_cluster=True),
)


def check_plan(m: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec | None = None) -> list[Violation]:
    """All violations of `plan` for model `m` on `cluster` (empty list: the plan is valid), each rule read on
    the model the plan trains (trained_model: `m` itself wherever mtp_layers asks for as many MTP modules as
    it has or more, so the rule mtp_layers sees the model's own count)."""
    built = trained_model(m, plan)
    return [Violation(r.name, r.message(built, plan, cluster)) for r in RULES
            if (cluster is not None or not r.needs_cluster) and not bool(r.ok(built, plan, cluster))]


MTP_RULE = next(r for r in RULES if r.name == "mtp_layers")
"""The rule that bounds ParallelPlan.mtp_layers by the model's own MTP modules."""


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
    Rule("dp_attention_ep", lambda m, p, c: (not p.dp_attention) | (p.ep == p.tp * p.pp * p.dp)
         | ((p.ep > 1) & ((p.tp * p.pp * p.dp) % p.ep == 0)),
         lambda m, p, c: f"--dp-attention shards the experts over every GPU of a server: ep ({p.ep}) must equal the "
                         f"{p.tp * p.pp * p.dp} GPUs (tp x pp x dp), or divide them (dp / ep servers of ep > 1 GPUs); "
                         f"use --ep {p.tp * p.pp * p.dp}"),
    Rule("moe_serving_needs_ep",
         lambda m, p, c: (p.ep > 1) | ((p.moe_dispatcher == "alltoall") & (not p.two_batch_overlap)
                                       & (p.redundant_experts == 0)),
         lambda m, p, c: "--moe-dispatcher deepep, --two-batch-overlap and --redundant-experts act on the expert-"
                         f"parallel all-to-all and its ranks, but ep is {p.ep}"
                         + ("; raise --ep or drop them" if m.is_moe
                            else f" ({m.name} is dense: no experts); drop them")),
    Rule("expert_dtype_moe", lambda m, p, c: (p.expert_dtype is None) | m.is_moe,
         lambda m, p, c: f"--expert-dtype {p.expert_dtype} applies to routed experts; {m.name} is dense: drop it "
                         "(the weights take --dtype)"),
)
"""Serving rules of the MoE deployment options (ServePlan.dp_attention, moe_dispatcher, two_batch_overlap,
redundant_experts, expert_dtype)."""


def serve_moe_violations(m: ModelSpec, plan: ServePlan) -> list[Violation]:
    """The SERVE_MOE_RULES the plan breaks (part of check_serve_plan, which needs no job or cluster for them):
    what the serving search checks up front for an option no layout it tries can take."""
    return [Violation(r.name, r.message(m, plan, None)) for r in SERVE_MOE_RULES if not bool(r.ok(m, plan, None))]


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
    if m.is_moe and plan.tp % plan.ep != 0 and not plan.dp_attention and job.engine != "vllm":
        out.append(Violation("ep_serve_engine", ep_serve_engine_message(m, plan, job)))
    if cluster is not None and not dp_attention_server_nodes_ok(plan, cluster, job.engine):
        out.append(Violation("dp_attention_nodes", dp_attention_nodes_message(plan, cluster, job.engine)))
    if job.context > m.max_position_embeddings:
        scaling = f" (rope_scaling: {m.rope_scaling})" if m.rope_scaling else ""
        out.append(Violation("context", f"input_len + output_len ({job.input_len} + {job.output_len} = "
                             f"{job.context}) exceeds max_position_embeddings ({m.max_position_embeddings}) of "
                             f"{m.name}{scaling}; lower --input-len or --output-len"))
    return out + speculative_violations(m, plan, job) + sglang_graph_violations(plan, job) \
        + batched_tokens_violations(job)


VLLM_BATCHED_TOKENS_RULE = "vLLM refuses max_num_batched_tokens below max_num_seqs"
"""The rule of vllm-project/vllm @01230b40, vllm/config/scheduler.py, SchedulerConfig.verify_max_model_len (a
ValueError at start-up, chunked prefill or not); its other rule there, max_num_batched_tokens at least
max_model_len, holds only without chunked prefill, which the plans are priced and exported with. Worded once for
check_serve_plan and the vLLM export (export.serve.render_vllm)."""


def engine_max_seqs(job: ServeJob) -> int | None:
    """The most sequences per replica `job.engine` starts with under the job's max_num_batched_tokens: vLLM's
    max_num_seqs may not exceed it (VLLM_BATCHED_TOKENS_RULE); None where the engine sets no such bound (SGLang and
    TensorRT-LLM: not read, not refused). Derived: docs/formulas.md#infer.capacity"""
    return job.max_num_batched_tokens if job.engine == "vllm" else None


def engine_capped(job: ServeJob) -> ServeJob:
    """The job with its batch cut to the most sequences per replica its engine starts with (engine_max_seqs): a
    search's --max-batch or a full-load batch is a ceiling, and one above the engine's bound is no candidate.
    Derived: docs/formulas.md#infer.capacity"""
    cap = engine_max_seqs(job)
    return job if cap is None or job.batch <= cap else job.model_copy(update={"batch": cap})


def batched_tokens_message(seqs: int, tokens: int) -> str:
    """Why a vLLM server of `seqs` sequences per replica (--max-num-seqs) cannot start with --max-num-batched-tokens
    `tokens` (the caller adds its fix)."""
    return (f"--max-num-seqs {seqs:,} above --max-num-batched-tokens {tokens:,} ({VLLM_BATCHED_TOKENS_RULE}, "
            "vllm/config/scheduler.py)")


def batched_tokens_violations(job: ServeJob) -> list[Violation]:
    """A batch of more sequences per replica than the engine's token budget admits (engine_max_seqs): the engine
    would not start with the --max-num-seqs the plan needs."""
    cap = engine_max_seqs(job)
    if cap is None or job.batch <= cap:
        return []
    return [Violation("batched_tokens", f"{batched_tokens_message(job.batch, cap)}: a batch of {job.batch:,} sequences "
                      f"per replica needs --max-num-seqs {job.batch:,}; give --max-num-batched-tokens {job.batch:,} or "
                      f"more, or --batch {cap:,} or fewer")]


def dp_attention_server_nodes_ok(plan: ServePlan, cluster: ClusterSpec, engine: str) -> bool:
    """Whether SGLang can start each DP-attention server of the plan where llmplan places it: on consecutive GPUs
    (topology.placement), a server of ep GPUs over nodes of G GPUs is whole nodes (ep a multiple of G) or an even
    share of one node (ep dividing G). SGLang starts tp-size / nnodes ranks on every node of a server, on
    consecutive GPUs from --base-gpu-id (sgl-project/sglang @001067ff, python/sglang/srt/entrypoints/engine.py,
    _calculate_rank_ranges and _launch_scheduler_processes), so it cannot start a server of whole nodes and part
    of another. vLLM takes the ranks of each node as given (--data-parallel-size-local and
    --data-parallel-start-rank per node: vllm-project/vllm @01e4fce0, docs/serving/data_parallel_deployment.md),
    so the placement is one it starts, priced as placed. TensorRT-LLM runs a server as one MPI world whose Mapping
    takes rank r to sit on node r // gpus_per_node as local GPU r % gpus_per_node (NVIDIA/TensorRT-LLM @b35ac1b6,
    tensorrt_llm/mapping.py, MappingBase.node_rank / local_rank / is_multi_node), so a server that starts part
    way into a node has ranks on other nodes than its Mapping says: the same two shapes as SGLang. Other engines:
    not read, not refused. Judged on the plan's servers as placed (straddling_server): a plan on fewer GPUs than
    the cluster (refused by gpus_dp) may have none that straddles."""
    if not plan.dp_attention or engine not in NODE_ALIGNED or cluster.num_nodes <= 1:
        return True
    return straddling_server(plan, cluster, engine) is None


def straddling_server(plan: ServePlan, cluster: ClusterSpec, engine: str = "sglang") -> int | None:
    """The index of the plan's first DP-attention server of ep GPUs that, on consecutive GPUs of the cluster's
    nodes (topology.placement), spans a node boundary with uneven ranks per node (ep neither a multiple nor a
    divisor of the GPUs per node), under TensorRT-LLM the first that also starts part way into a node, or None
    when none does."""
    return _first_straddling(plan.ep, cluster.gpus_per_node_used, plan.num_gpus // plan.ep, engine)


def _first_straddling(g: int, per_node: int, servers: int, engine: str) -> int | None:
    """straddling_server for `servers` servers of g GPUs placed one after another on nodes of per_node GPUs."""
    if g % per_node == 0 or per_node % g == 0:
        return None
    return next((k for k in range(servers) if k * g // per_node != ((k + 1) * g - 1) // per_node
                 and (engine != "trtllm" or k * g % per_node)), None)


NODE_ALIGNED = {
    "sglang": "SGLang starts tp-size / nnodes ranks on every node of a server (entrypoints/engine.py "
              "_calculate_rank_ranges)",
    "trtllm": "TensorRT-LLM's Mapping puts rank r of a server on node r // gpus_per_node (tensorrt_llm/mapping.py "
              "node_rank, local_rank)",
}
"""The engines whose DP-attention servers cannot straddle node boundaries as placed, and why
(dp_attention_server_nodes_ok): under SGLang a server is whole nodes or an even share of one; under TensorRT-LLM each
server that spans nodes starts at a node boundary (NODE_RULE)."""

NODE_RULE = {
    "sglang": "a server must be whole nodes (ep a multiple of {per_node}) or an even share of one (ep dividing "
              "{per_node})",
    "trtllm": "each server that spans nodes must start at a node boundary (servers of ep GPUs placed one after "
              "another do where ep is a multiple of {per_node} or divides it, or where one server takes all the GPUs)",
}
"""What NODE_ALIGNED's placement asks of a DP-attention server, per engine (dp_attention_nodes_message)."""


def dp_attention_nodes_message(plan: ServePlan, cluster: ClusterSpec, engine: str = "sglang") -> str:
    """Why `engine` cannot start a DP-attention server straddling node boundaries (dp_attention_server_nodes_ok),
    with the ep values it can start on these GPUs."""
    g, per_node, n = plan.ep, cluster.gpus_per_node_used, plan.num_gpus
    valid = [e for e in divisors(n) if e > 1 and _first_straddling(e, per_node, n // e, engine) is None]
    k = straddling_server(plan, cluster, engine)
    where = "" if k is None else f" (server {k + 1} takes GPUs {k * g}-{(k + 1) * g - 1})"
    return (f"--dp-attention under {engine}: servers of ep {g} GPUs on consecutive GPUs of nodes of {per_node} "
            f"straddle node boundaries with uneven ranks per node{where}; {NODE_ALIGNED[engine]}, so "
            f"{NODE_RULE[engine].format(per_node=per_node)}; use --ep {bounded_list(valid)} on these {n} GPUs (the "
            "experts permitting), or --engine vllm, which takes uneven ranks per node")


def ep_serve_engine_message(m: ModelSpec, plan: ServePlan, job: ServeJob) -> str:
    """Why an EP degree that does not divide tp breaks SGLang or TensorRT-LLM without attention DP: both split a
    replica's TP ranks into EP groups (moe_tp = tp / ep), so ep must divide tp; only vLLM's DP + EP spans replicas.
    Source: sgl-project/sglang v0.5.23 (PyPI wheel), python/sglang/srt/runtime_context.py, derive_parallel_widths
    (moe_tp_size = tp_size // moe_ep_size // moe_dp_size) and _validate_parallel (tp_size == moe_ep_size x
    moe_dp_size x moe_tp_size); NVIDIA/TensorRT-LLM @b35ac1b6, tensorrt_llm/mapping.py, MappingBase.__init__
    (moe_tp_size x moe_ep_size must equal tp_size)."""
    experts = max(m.num_experts, 1) + plan.redundant_experts
    valid = [d for d in divisors(plan.tp) if experts % d == 0]
    fix = f"valid ep at tp {plan.tp}: {bounded_list(valid)}"
    if plan.ep > plan.tp:
        return (
            f"ep ({plan.ep}) above tp ({plan.tp}) spreads experts over several replicas, which {job.engine} "
            f"does only with attention data parallel; add --dp-attention (tp 1, ep = GPUs), lower --ep ({fix}) or use "
            "--engine vllm"
        )
    return (f"ep ({plan.ep}) must divide tp ({plan.tp}) under {job.engine}: it splits each replica's {plan.tp} TP "
            f"ranks into EP groups (MoE TP width tp / ep), so {plan.ep} leaves no whole width; {fix}")


def sglang_graph_violations(plan: ServePlan, job: ServeJob) -> list[Violation]:
    """A user's decode capture list of which SGLang's runner keeps no size for the plan's server
    (cost.serve_step.captured_graph_sizes empty): SGLang then refuses to start, so the plan is refused, naming
    the sizes its runner keeps at the server's alignment. Source: sgl-project/sglang v0.5.23 (PyPI wheel),
    python/sglang/srt/model_executor/runner/base_cuda_graph_runner.py, get_batch_sizes_to_capture (asserts a
    non-empty list). Derived: docs/formulas.md#infer.graph_padding"""
    from llmplan.cost.serve_step import SglangRanks, captured_graph_sizes, draft_tokens_of, sglang_request_width
    listed = job.decode_graph_sizes
    if job.engine != "sglang" or job.cuda_graph_sizes_default or not listed or captured_graph_sizes(job, plan):
        return []
    ranks = SglangRanks.of(plan)
    width = sglang_request_width(ranks, draft_tokens_of(job))
    step = ranks.align // math.gcd(ranks.align, width)
    top = -(-job.batch // ranks.align) * ranks.align
    kept = ", ".join(str(b) for b in range(step, top + 1, step)) if top // step <= 8 else \
        f"{step}, {2 * step}, ..., {top}"
    return [Violation("sglang_graph_sizes", f"SGLang's runner keeps none of --cuda-graph-sizes "
                      f"{','.join(map(str, listed))} for {job.batch} requests per attention rank: it drops sizes "
                      f"above the pool rounded up to the alignment {ranks.align} ({top}) and sizes b with b x "
                      f"{width} not a multiple of {ranks.align}, and refuses to start with none left; give sizes "
                      f"it keeps ({kept}) or --no-cuda-graphs")]


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
