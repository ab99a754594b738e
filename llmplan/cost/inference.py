"""Serving: weight and KV-cache memory per GPU, KV capacity, prefill (TTFT) and decode (TPOT) time,
throughput, and the effect of prefix caching.

Symbols: B concurrent sequences, c context tokens, L layers, K KV heads, d head dim, t TP, p PP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from llmplan.cost.breakdown import Breakdown
from llmplan.cost.compute import gemm_efficiency
from llmplan.cost.params import mlp_params, padded_vocab, param_counts, rank_params
from llmplan.specs.hardware import SystemSpec
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import MemoryAllowance, ParallelPlan
from llmplan.specs.serve import ServeJob, ServePlan
from llmplan.topology.collectives import collective_time
from llmplan.topology.placement import GroupSpan
from llmplan.units import GIB

KV_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0}


def weight_bytes_per_param(dtype: str, group: int) -> float:
    """Bytes per linear-layer weight, scale overhead included: group quantisation keeps an fp16 scale and an
    fp16 zero point per `group` weights (AWQ/GPTQ style, 4/group bytes); fp8 keeps one scale per 128x128
    block (DeepSeek-V3 style, negligible). Derived: docs/formulas.md#infer.weights"""
    return {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0 + 4 / 16384, "int8": 1.0 + 4 / group, "int4": 0.5 + 4 / group}[dtype]


def _as_train_plan(plan: ServePlan) -> ParallelPlan:
    """The same sharding as a ParallelPlan, for the parameter-shard functions (experts: EP, else TP)."""
    return ParallelPlan(tp=plan.tp, pp=plan.pp, ep=plan.ep, etp=1 if plan.ep > 1 else plan.tp)


def serve_weight_bytes(m: ModelSpec, plan: ServePlan) -> float:
    """Weight bytes on the most-loaded GPU: linear layers in the weight dtype, the embedding and output layer
    in 16 bits (servers keep them unquantised). Derived: docs/formulas.md#infer.weights"""
    tp_plan = _as_train_plan(plan)
    V = padded_vocab(m.vocab_size, plan.tp)
    wpp = weight_bytes_per_param(plan.weight_dtype, plan.quant_group_size)
    worst = 0.0
    for stage in {0, plan.pp - 1}:
        rp = rank_params(m, tp_plan, stage)
        embed = (V * m.hidden_size / plan.tp) * ((stage == 0) + (stage == plan.pp - 1 and
                                                                 (not m.tie_word_embeddings or plan.pp > 1)))
        worst = max(worst, (float(rp.total) - embed) * wpp + embed * 2.0)
    return worst


def kv_layer_bytes(m: ModelSpec, kv_dtype: str, tp: int = 1, latent: bool = True) -> float:
    """KV bytes per token of one layer on one TP rank: K and V of the rank's KV heads (K/t, at least one
    head, replicated when t > K); MLA caches one compressed latent plus the rope key, replicated on every
    rank, or, without an MLA kernel (`latent` False), the rank's expanded per-head K and V.
    Source: vLLM vllm/config/cache.py (block size, page size)."""
    b = KV_BYTES[kv_dtype]
    if m.is_mla and not latent:
        heads = max(m.num_attention_heads / tp, 1.0)
        return heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim) * b
    if m.is_mla:
        return (m.kv_lora_rank + m.qk_rope_head_dim) * b
    return 2 * max(m.kv_heads / tp, 1.0) * m.d_head * b


def kv_bytes_per_token(m: ModelSpec, kv_dtype: str = "bf16") -> float:
    """KV bytes per token of the whole model, one sequence (every layer, all heads)."""
    return m.num_hidden_layers * kv_layer_bytes(m, kv_dtype)


def layer_windows(m: ModelSpec) -> list[int | None]:
    """Tokens each layer keeps: the sliding window for sliding-attention layers, None (all) otherwise."""
    types = m.layer_types or ("full_attention",) * m.num_hidden_layers
    return [m.sliding_window if (t.startswith("sliding") and m.sliding_window) else None for t in types]


def kv_bytes_per_seq_gpu(m: ModelSpec, plan: ServePlan, context: Any, block_size: int = 1) -> Any:
    """KV bytes one sequence of `context` tokens holds on one GPU: its stage's share of the layers, each
    keeping min(context, window) tokens rounded up to whole blocks. Derived: docs/formulas.md#infer.kv"""
    per_layer = kv_layer_bytes(m, plan.kv_dtype, plan.tp, plan.mla_latent_cache)
    total = 0.0
    for window in layer_windows(m):
        tokens = context if window is None else np.minimum(context, window)
        total = total + np.ceil(np.asarray(tokens) / block_size) * block_size * per_layer
    return total / plan.pp


def activation_peak_bytes(m: ModelSpec, plan: ServePlan, job: ServeJob) -> float:
    """Activation workspace of the largest engine step (max_num_batched_tokens tokens) on one GPU: hidden
    states, QKV, MLP intermediates (gate and up, then the product) in 16 bits, and fp32 logits of the
    sequences sampled; without fused attention, one layer's scores and probabilities for a prompt of T tokens.
    Derived: docs/formulas.md#infer.activations (vLLM measures this by profiling)."""
    T, h, t = job.max_num_batched_tokens, m.hidden_size, plan.tp
    qkv = (m.num_attention_heads * m.d_head + 2 * max(m.kv_heads, t) * m.d_head) / t
    f = (m.num_experts_per_tok * m.expert_ffn + m.shared_ffn) if m.is_moe else m.intermediate_size
    mlp = (3 if m.gated_mlp else 2) * f / t
    logits = min(job.batch, T) * padded_vocab(m.vocab_size, t) / t * 4
    scores = 0.0 if plan.fused_attention else 2 * 2.0 * m.num_attention_heads / t * T * T  # S and P, 16-bit
    return 2 * T * (2 * h + qkv + mlp) + logits + scores


@dataclass(frozen=True)
class ServeMemory(Breakdown):
    """Memory of one GPU at `batch` sequences of full context; weights + kv_cache + activations + other = total."""

    PARTS: ClassVar[tuple[str, ...]] = ("weights", "kv_cache", "activations", "other")

    weights: float
    kv_cache: float
    activations: float
    other: float
    capacity: float
    """Usable memory: gpu_memory_utilization x HBM."""
    kv_available: float
    """Memory left for the KV cache after weights, activations and the runtime allowance (may be < 0)."""
    max_concurrent_seqs: int
    """Sequences of full context that fit in kv_available (vLLM's max concurrency)."""
    kv_blocks: int

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity and self.kv_available > 0


def serve_memory(m: ModelSpec, plan: ServePlan, job: ServeJob, hbm_bytes: float,
                 allowance: MemoryAllowance | None = None) -> ServeMemory:
    """Memory per GPU and KV capacity the way vLLM sizes its cache: utilisation x HBM minus weights,
    activation peak and non-torch memory; blocks of block_size tokens per layer.
    Source: vLLM documentation (KV-cache capacity computation)."""
    allowance = allowance or MemoryAllowance()
    cap = job.gpu_memory_utilization * hbm_bytes
    weights = serve_weight_bytes(m, plan)
    act = activation_peak_bytes(m, plan, job)
    other = allowance.fixed_gib * GIB
    available = cap - weights - act - other
    per_seq = float(kv_bytes_per_seq_gpu(m, plan, job.context, job.block_size))
    block = float(kv_bytes_per_seq_gpu(m, plan, job.block_size, job.block_size))
    return ServeMemory(
        weights=weights, kv_cache=job.batch * per_seq, activations=act, other=other, capacity=cap,
        kv_available=available, max_concurrent_seqs=max(0, int(available // per_seq)) if per_seq else 0,
        kv_blocks=max(0, int(available // block)) if block else 0,
    )


@dataclass(frozen=True)
class Spans:
    """Where a replica's TP, PP and EP groups sit."""

    tp: GroupSpan
    pp: GroupSpan
    ep: GroupSpan


def _active_linear_params(m: ModelSpec) -> float:
    """Matmul weights one token passes through (active parameters without the embedding lookup)."""
    pc = param_counts(m)
    return float(pc.active - pc.embedding)


def _expert_fraction_touched(m: ModelSpec, tokens: Any) -> Any:
    """Expected fraction of a layer's experts a step's tokens visit (independent top-k routing):
    1 - (1 - k/E)^tokens. Derived: docs/formulas.md#infer.decode"""
    if not m.is_moe:
        return 1.0
    return 1.0 - (1.0 - m.num_experts_per_tok / m.num_experts) ** np.asarray(tokens, dtype=float)


def step_seconds(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, tokens: Any,
                 attn_pairs: Any, kv_read: Any) -> Any:
    """One engine step of one pipeline stage on one GPU: `tokens` new tokens, `attn_pairs` (query, key)
    pairs of attention, `kv_read` KV bytes read on this GPU. Time = max(compute, HBM traffic) + the TP
    all-reduces (2 per layer) and, with EP, the dispatch and combine all-to-alls of each TP rank's 1/t share
    of the tokens (2 per MoE layer). Expert GEMMs run at the efficiency of their rows per expert, tokens x k / E.
    Derived: docs/formulas.md#infer.step"""
    gpu = system.gpu
    t, p = plan.tp, plan.pp
    compute_dtype = "fp8" if plan.weight_dtype == "fp8" and "fp8" in gpu.tflops else "bf16"
    L = m.num_hidden_layers
    qk = (m.qk_nope_head_dim + m.qk_rope_head_dim) if m.is_mla else m.d_head
    v = m.v_head_dim if m.is_mla else m.d_head
    pc = param_counts(m)
    expert_active = pc.routed_experts * pc.experts_per_token_fraction
    dense_flops = (2 * (_active_linear_params(m) - expert_active) * tokens
                   + 2 * attn_pairs * m.num_attention_heads * (qk + v) * L) / (t * p)
    expert_flops = 2 * expert_active * tokens / (t * p)
    peak = gpu.sustained_flops(compute_dtype)
    # Rows per expert the step actually runs: the routed rows over the experts they touch (at least one each),
    # so fewer tokens never make the expert GEMMs slower. Derived: docs/formulas.md#infer.step
    touched = np.maximum(_expert_fraction_touched(m, tokens) * max(m.num_experts, 1), 1e-12)
    rows_per_expert = np.maximum(np.asarray(tokens, dtype=float) * m.num_experts_per_tok / touched, 1)
    compute = dense_flops / (peak * gemm_efficiency(gpu, compute_dtype, np.maximum(tokens, 1))) + \
        expert_flops / (peak * gemm_efficiency(gpu, compute_dtype, rows_per_expert))
    weights = serve_weight_bytes(m, plan)
    if m.is_moe:
        wpp = weight_bytes_per_param(plan.weight_dtype, plan.quant_group_size)
        experts = m.num_moe_layers * m.num_experts * mlp_params(m, m.expert_ffn) * wpp / (max(plan.ep, 1) if plan.ep > 1 else t) / p
        weights = weights - experts * (1 - _expert_fraction_touched(m, tokens))
    bandwidth = gpu.hbm_bytes_per_s * gpu.hbm_efficiency
    traffic = (weights + kv_read) / bandwidth
    # Unfused attention writes the scores S, reads them for the softmax, writes P and reads it for P·V: four
    # 16-bit passes over every (query, key) pair of every head, in memory-bound kernels of their own (added,
    # not overlapped with the GEMMs). Source: Dao et al. 2022 (FlashAttention) §2.2.
    scores = 0.0 if plan.fused_attention else 4 * 2.0 * attn_pairs * m.num_attention_heads / t * L / p / bandwidth
    act = 2.0 * m.hidden_size * np.asarray(tokens, dtype=float)
    tp_comm = 2 * (L / p) * _coll(system, "all-reduce", act, spans.tp)
    # With EP each TP rank dispatches its 1/t share of the tokens (the attention all-reduce becomes a
    # reduce-scatter + all-gather around the MoE block) to the experts' ranks and combines them back.
    ep_comm = 2 * (m.num_moe_layers / p) * _coll(system, "all-to-all", act * m.num_experts_per_tok / t, spans.ep) \
        if plan.ep > 1 else 0.0
    return np.maximum(compute, traffic) + scores + tp_comm + ep_comm


def _coll(system: SystemSpec, op: str, size: Any, span: GroupSpan) -> Any:
    sizes = np.atleast_1d(np.asarray(size, dtype=float))
    out = np.array([collective_time(op, float(s), span, system).seconds for s in sizes])
    return out if np.ndim(size) else float(out[0])


def decode_tpot(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, batch: Any, context: Any) -> Any:
    """Time per output token at `batch` sequences of average `context`: with p stages the batch splits into p
    groups that take turns, so a sequence gets a token every p stage-steps of batch/p sequences (each step
    reading the stage's weights once and the group's KV). Derived: docs/formulas.md#infer.decode"""
    b = np.maximum(np.asarray(batch, dtype=float) / plan.pp, 1.0)
    kv = b * kv_bytes_per_seq_gpu(m, plan, context)
    stage = step_seconds(m, plan, system, spans, b, b * context, kv)
    hop = _coll(system, "send-recv", 2.0 * m.hidden_size * b, spans.pp) if plan.pp > 1 else 0.0
    return plan.pp * (stage + hop)


def prefill_seconds(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, job: ServeJob,
                    batch: Any) -> Any:
    """Time to first token of one request while `batch` sequences decode: its uncached prompt runs in chunks
    of (max_num_batched_tokens - batch) tokens, each chunk sharing an engine step with the decodes and
    passing every pipeline stage; causal attention covers the cached prefix too.
    Derived: docs/formulas.md#infer.prefill"""
    new = max(job.uncached_input, 1.0)
    cached = job.input_len - job.uncached_input
    chunk = np.maximum(job.max_num_batched_tokens - np.asarray(batch, dtype=float), 256.0)
    chunk = np.minimum(chunk, new)
    n_chunks = np.ceil(new / chunk)
    pairs = chunk * (cached + new / 2)  # per chunk, on average
    decodes = np.asarray(batch, dtype=float) / plan.pp
    kv = decodes * kv_bytes_per_seq_gpu(m, plan, job.input_len + job.output_len / 2)
    stage = step_seconds(m, plan, system, spans, chunk + decodes, pairs + decodes * job.context / 2, kv)
    hop = _coll(system, "send-recv", 2.0 * m.hidden_size * chunk, spans.pp) if plan.pp > 1 else 0.0
    return n_chunks * plan.pp * (stage + hop)


def prefill_work_seconds(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, job: ServeJob) -> float:
    """Engine time one request's prefill costs when prompts are batched: a full step of
    max_num_batched_tokens prompt tokens (several requests' prompts, reading the weights once) times the
    request's share of it. Derived: docs/formulas.md#infer.throughput"""
    T = float(job.max_num_batched_tokens)
    new = max(job.uncached_input, 1.0)
    cached = job.input_len - job.uncached_input
    stage = step_seconds(m, plan, system, spans, T, T * (cached + min(new, T) / 2), 0.0)
    hop = _coll(system, "send-recv", 2.0 * m.hidden_size * T, spans.pp) if plan.pp > 1 else 0.0
    return float(plan.pp * (stage + hop)) * new / T


@dataclass(frozen=True)
class ServeTiming:
    ttft: Any
    tpot: Any
    e2e: Any
    """TTFT + (output_len - 1) x TPOT."""
    tokens_per_s_replica: Any
    """Output tokens per second of one replica in steady state (prefills included)."""


def serve_timing(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, job: ServeJob,
                 batch: Any) -> ServeTiming:
    """TTFT, TPOT, end-to-end latency and steady-state throughput at `batch` concurrent sequences: per
    output_len decode steps the replica also prefills `batch` new prompts, so throughput =
    batch x output_len / (output_len x TPOT + batch x batched prefill time per request).
    Derived: docs/formulas.md#infer.throughput"""
    context = job.input_len + job.output_len / 2
    tpot = decode_tpot(m, plan, system, spans, batch, context)
    ttft = prefill_seconds(m, plan, system, spans, job, batch)
    b = np.asarray(batch, dtype=float)
    period = job.output_len * tpot + b * prefill_work_seconds(m, plan, system, spans, job)
    return ServeTiming(ttft=ttft, tpot=tpot, e2e=ttft + (job.output_len - 1) * tpot,
                       tokens_per_s_replica=b * job.output_len / period)


def max_batch_under_slo(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, job: ServeJob,
                        limit: int) -> int:
    """Largest concurrency (up to `limit`) whose TTFT and TPOT meet the job's SLOs (0 if none does)."""
    if limit < 1:
        return 0
    grid = np.unique(np.round(np.geomspace(1, limit, 96))).astype(float)
    timing = serve_timing(m, plan, system, spans, job, grid)
    ok = np.ones(grid.shape, dtype=bool)
    if job.ttft_slo_s is not None:
        ok &= np.asarray(timing.ttft) <= job.ttft_slo_s
    if job.tpot_slo_s is not None:
        ok &= np.asarray(timing.tpot) <= job.tpot_slo_s
    return int(grid[ok].max()) if ok.any() else 0
