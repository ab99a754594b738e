"""Serving: weight and KV-cache memory per GPU, KV capacity, prefill (TTFT) and decode (TPOT) time,
throughput, and the effect of prefix caching.

Symbols: B concurrent sequences, c context tokens, L layers, K KV heads, d head dim, t TP, p PP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from llmplan.cost.breakdown import Breakdown
from llmplan.cost.compute import (KERNEL_LAUNCH_S, TILE, attended_keys, attention_head_dims, attention_shapes,
                                  head_dim_attention_ratio, layer_windows, moe_routing_bytes)
from llmplan.cost.mixers import attention_share, dense_mlp_share, recurrent_gemm_shapes, recurrent_state_bytes
from llmplan.cost.params import expert_params, padded_vocab, rank_params
from llmplan.cost.serve_moe import (COMBINE_BYTES, comm_sm_slowdown, deepep_exchange_seconds,
                                    dispatch_bytes_per_element, expert_token_factor, overlapped_step,
                                    redundant_expert_params, serve_ep_imbalance, tbo_prefill_seconds)
from llmplan.cost.sparse import indexer_cache_bytes
from llmplan.specs.hardware import SystemSpec
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import MemoryAllowance
from llmplan.specs.serve import ServeJob, ServePlan
from llmplan.topology.collectives import collective_time
from llmplan.topology.placement import GroupSpan
from llmplan.units import GIB

KV_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0}


@dataclass(frozen=True)
class EngineRule:
    """How a serving engine sizes its KV cache and admits sequences, and what one engine step costs beyond
    the GPU work."""

    fraction_of_free: bool
    """True: the memory fraction applies to what the weights, activations and runtime leave (TensorRT-LLM);
    False: to the whole GPU."""
    activations_inside: bool
    """Whether the activation peak and runtime memory come out of the fraction (vLLM, TensorRT-LLM) or out of
    the rest of the GPU (SGLang: the fraction holds only the weights and the KV pool)."""
    reserve_whole_context: bool
    """True: a request is admitted only with blocks for its whole input + output (TensorRT-LLM's default
    GUARANTEED_NO_EVICT); False: blocks are allocated as it grows, so on average input + output/2 are held."""
    step_overhead_s: float
    """Host time per engine step outside the GPU kernels (scheduling, sampling, launch with CUDA graphs)."""
    source: str


ENGINES = {
    # Source: vLLM docs, "gpu_memory_utilization" (fraction of the whole GPU for weights, activations and KV
    # cache; blocks allocated on demand, preemption when full); async scheduling overlaps the host's work.
    "vllm": EngineRule(False, True, False, 0.0, "vLLM EngineArgs gpu_memory_utilization; PagedAttention"),
    # Source: TensorRT-LLM docs, KvCacheConfig.free_gpu_memory_fraction and "Useful Runtime Options"
    # (GUARANTEED_NO_EVICT is the default capacity scheduler policy); the overlap scheduler hides host time.
    "trtllm": EngineRule(True, True, True, 0.0, "TensorRT-LLM KvCacheConfig free_gpu_memory_fraction"),
    # Source: SGLang server arguments, --mem-fraction-static (model weights and KV cache pool); its overlap
    # scheduler hides host time.
    "sglang": EngineRule(False, False, False, 0.0, "SGLang ServerArgs mem_fraction_static"),
}
"""Per-engine rules. step_overhead_s: 0 for the three, whose schedulers overlap host work with the GPU (the
fit on the TensorRT-LLM runs also lands on 0, docs/validation.md#serving); without CUDA graphs every kernel
launch is added (step_host_seconds)."""


def step_host_seconds(m: ModelSpec, plan: ServePlan, job: ServeJob) -> float:
    """Host time per engine step: the engine's own (ENGINES) and, without CUDA graphs, one launch per kernel:
    the layer's GEMMs, attention, about six memory-bound kernels (norms, adds, rotary, activation) and the two
    TP all-reduces, for the stage's layers. Derived: docs/formulas.md#infer.step"""
    rule = ENGINES[job.engine]
    if job.cuda_graphs:
        return rule.step_overhead_s
    per_layer = len(layer_linear_shapes(m, plan, m.is_moe)) + 1 + 6 + (2 if plan.tp > 1 else 0)
    return rule.step_overhead_s + per_layer * m.num_hidden_layers / plan.pp * KERNEL_LAUNCH_S


def weight_bytes_per_param(dtype: str, group: int) -> float:
    """Bytes per linear-layer weight, scale overhead included: group quantisation keeps an fp16 scale and an
    fp16 zero point per `group` weights (AWQ/GPTQ style, 4/group bytes); fp8 keeps one scale per 128x128
    block (DeepSeek-V3 style, negligible); MXFP8 one E8M0 byte per 32 weights and NVFP4 one E4M3 byte per
    16 (OCP Microscaling spec; NVIDIA NVFP4 format). Derived: docs/formulas.md#infer.weights"""
    return {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0 + 4 / 16384, "mxfp8": 1.0 + 1 / 32, "nvfp4": 0.5 + 1 / 16,
            "int8": 1.0 + 4 / group, "int4": 0.5 + 4 / group}[dtype]


def serve_weight_bytes(m: ModelSpec, plan: ServePlan) -> float:
    """Weight bytes on the most-loaded GPU: linear layers in the weight dtype, the embedding and output layer
    in 16 bits (servers keep them unquantised). Derived: docs/formulas.md#infer.weights"""
    V = padded_vocab(m.vocab_size, plan.tp)
    wpp = weight_bytes_per_param(plan.weight_dtype, plan.quant_group_size)
    # Routed experts in their own dtype (expert_dtype), with EPLB's redundant replicas (cost.serve_moe).
    wpp_e = weight_bytes_per_param(plan.expert_dtype_resolved, plan.quant_group_size)
    worst = 0.0
    for stage in {0, plan.pp - 1}:
        rp = rank_params(m, plan, stage)
        embed = (V * m.hidden_size / plan.tp) * ((stage == 0) + (stage == plan.pp - 1 and
                                                                 (not m.tie_word_embeddings or plan.pp > 1)))
        experts = float(rp.expert) + redundant_expert_params(m, plan)
        worst = max(worst, (float(rp.total) - float(rp.expert) - embed) * wpp + experts * wpp_e + embed * 2.0)
    return worst


def kv_layer_bytes(m: ModelSpec, kv_dtype: str, tp: int = 1, latent: bool = True) -> float:
    """KV bytes per token of one layer on one TP rank: K and V of the rank's KV heads (K/t, at least one
    head, replicated when t > K); MLA caches one compressed latent plus the rope key, replicated on every
    rank, or, without an MLA kernel (`latent` False), the rank's expanded per-head K and V.
    Source: vLLM vllm/config/cache.py (block size, page size)."""
    b = KV_BYTES[kv_dtype]
    mla = m.mla
    if mla is not None and not latent:
        heads = max(m.num_attention_heads / tp, 1.0)
        return heads * (mla.qk_head_dim + mla.v_head_dim) * b + indexer_cache_bytes(m)
    if mla is not None:  # with DeepSeek Sparse Attention also the indexer's fp8 keys (cost.sparse)
        return (mla.kv_lora_rank + mla.qk_rope_head_dim) * b + indexer_cache_bytes(m)
    return 2 * max(m.kv_heads / tp, 1.0) * m.d_head * b


def kv_bytes_per_token(m: ModelSpec, kv_dtype: str = "bf16") -> float:
    """KV bytes per token of the whole model, one sequence (every attention layer, all heads; a hybrid's
    recurrent layers keep a fixed state instead: recurrent_state_bytes)."""
    return m.num_attention_layers * kv_layer_bytes(m, kv_dtype)


def recurrent_state_per_seq_gpu(m: ModelSpec, plan: ServePlan) -> float:
    """Recurrent-state bytes one sequence holds on one GPU: its TP shard of the states of its stage's share of
    the recurrent layers, in bf16 (vLLM's mamba cache dtype 'auto': the model's dtype). Derived:
    docs/formulas.md#mixers.state"""
    return recurrent_state_bytes(m, 2.0, plan.tp) / plan.pp


def kv_bytes_per_seq_gpu(m: ModelSpec, plan: ServePlan, context: Any, block_size: int = 1) -> Any:
    """KV bytes one sequence of `context` tokens holds on one GPU: its stage's share of the layers, each
    keeping min(context, window) tokens rounded up to whole blocks. Derived: docs/formulas.md#infer.kv"""
    per_layer = kv_layer_bytes(m, plan.kv_dtype, plan.tp, plan.mla_latent_cache)
    total: Any = 0.0  # an array when `context` is one
    for window, layers in layer_windows(m):
        tokens = context if window is None else np.minimum(context, window)
        total = total + layers * np.ceil(np.asarray(tokens) / block_size) * block_size * per_layer
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
    """Memory of one GPU at `batch` running sequences, each holding the KV tokens the engine's rule keeps for it
    (admitted_tokens); weights + kv_cache + activations + other = total."""

    PARTS: ClassVar[tuple[str, ...]] = ("weights", "kv_cache", "activations", "other", "recurrent_state")

    weights: float
    kv_cache: float
    activations: float
    other: float
    capacity: float
    """Memory the engine may use on the GPU (its memory fraction, by the engine's rule)."""
    kv_available: float
    """Memory the engine gives the KV cache (kv_capacity_bytes; may be < 0)."""
    max_concurrent_seqs: int
    """Sequences that run at once at full load: kv_available over the tokens each holds (admitted_tokens)."""
    kv_blocks: int
    recurrent_state: float = 0.0
    """A hybrid's recurrent-layer states of the `batch` sequences (fixed per sequence, whatever its length;
    cost.mixers.recurrent_state_bytes), held in the same pool as the KV cache; 0 for a transformer."""

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity and self.kv_available > 0


def kv_capacity_bytes(job: ServeJob, hbm_bytes: float, weights: float, activations: float, other: float) -> float:
    """Bytes the engine gives the KV cache on one GPU (may be < 0 when the weights do not fit):
    vLLM u·HBM - weights - activations - other; TensorRT-LLM u·(HBM - weights - activations - other);
    SGLang u·HBM - weights. Derived: docs/formulas.md#infer.capacity"""
    rule, u = ENGINES[job.engine], job.gpu_memory_utilization
    if rule.fraction_of_free:
        free = hbm_bytes - weights - activations - other
        return u * free if free > 0 else free
    if not rule.activations_inside:
        return u * hbm_bytes - weights
    return u * hbm_bytes - weights - activations - other


def admitted_tokens(job: ServeJob) -> float:
    """KV tokens the engine holds per running sequence at full load: the whole context where the scheduler
    reserves it at admission (TensorRT-LLM), else input + output/2 on average (blocks grow with the sequence).
    Derived: docs/formulas.md#infer.capacity"""
    return float(job.context) if ENGINES[job.engine].reserve_whole_context else job.input_len + job.output_len / 2


def serve_memory(m: ModelSpec, plan: ServePlan, job: ServeJob, hbm_bytes: float,
                 allowance: MemoryAllowance | None = None) -> ServeMemory:
    """Memory per GPU and KV capacity by the engine's rule (kv_capacity_bytes); concurrency at full load from
    the tokens each running sequence holds (admitted_tokens), in whole blocks of block_size tokens per layer.
    Source: vLLM / TensorRT-LLM / SGLang memory settings (ENGINES)."""
    allowance = allowance or MemoryAllowance()
    rule = ENGINES[job.engine]
    weights = serve_weight_bytes(m, plan)
    if job.speculative is not None:  # the draft's weights beyond the target's
        from llmplan.cost.speculative import draft_weight_bytes  # builds on this module
        weights = weights + draft_weight_bytes(m, plan, job.speculative)
    act = activation_peak_bytes(m, plan, job)
    other = allowance.fixed_gib * GIB
    available = kv_capacity_bytes(job, hbm_bytes, weights, act, other)
    if rule.fraction_of_free:
        cap = weights + act + other + max(available, 0.0)
    else:
        cap = job.gpu_memory_utilization * hbm_bytes + (0.0 if rule.activations_inside else act + other)
    state = recurrent_state_per_seq_gpu(m, plan)  # each running sequence's fixed state, in the same pool
    per_seq = float(kv_bytes_per_seq_gpu(m, plan, admitted_tokens(job), job.block_size))
    if job.speculative is not None:  # the k draft tokens' slots and the draft's own cache
        from llmplan.cost.speculative import speculative_kv_per_seq  # builds on this module
        per_seq = float(speculative_kv_per_seq(m, plan, job.speculative, admitted_tokens(job), job.block_size))
    block = float(kv_bytes_per_seq_gpu(m, plan, job.block_size, job.block_size))
    return ServeMemory(
        weights=weights, kv_cache=job.batch * per_seq, activations=act, other=other, capacity=min(cap, hbm_bytes),
        kv_available=available,
        max_concurrent_seqs=max(0, int(available // (per_seq + state))) if per_seq + state else 0,
        kv_blocks=max(0, int(available // block)) if block else 0, recurrent_state=job.batch * state,
    )


@dataclass(frozen=True)
class Spans:
    """Where a replica's TP, PP and EP groups sit."""

    tp: GroupSpan
    pp: GroupSpan
    ep: GroupSpan


def _expert_fraction_touched(m: ModelSpec, tokens: Any) -> Any:
    """Expected fraction of a layer's experts a step's tokens visit (independent top-k routing):
    1 - (1 - k/E)^tokens. Derived: docs/formulas.md#infer.decode"""
    if not m.is_moe:
        return 1.0
    return 1.0 - (1.0 - m.num_experts_per_tok / m.num_experts) ** np.asarray(tokens, dtype=float)


SERVE_GEMM_M_HALF = 192.0
"""Rows at which a serving GEMM reaches half the efficiency its shape allows (small-M kernels fill their
pipelines poorly beyond what tile quantisation counts); fitted by leave-one-model-out on the TensorRT-LLM
runs (benchmarks/accuracy.py; docs/validation.md#serving). Training GEMMs (thousands of rows) leave it out."""


def layer_linear_shapes(m: ModelSpec, plan: ServePlan, moe: bool) -> list[tuple[float, str, float, float]]:
    """(weights x tokens factor, row kind, N, K) of each matmul of one layer on one GPU, for `tokens` rows:
    attention projections (MLA's down and up projections), the dense or shared-expert MLP, the router, and
    the routed experts (their rows per expert; split by TP, or whole on EP ranks): an entry's FLOPs are
    2·factor·tokens·N·K. Derived: docs/formulas.md#infer.step"""
    h, t = m.hidden_size, plan.tp
    # A hybrid's average layer (cost.mixers): its share of attention, of each recurrent mixer, of dense MLP.
    out = [(attention_share(m), "tokens", n, k) for k, n in attention_shapes(m, t)]
    out += [(share, "tokens", n, k) for k, n, share in recurrent_gemm_shapes(m, t)]
    c = 2 if m.gated_mlp else 1
    f = m.shared_ffn if moe else m.intermediate_size
    f_share = 1.0 if moe else dense_mlp_share(m)
    if f and f_share:
        out += [(f_share, "tokens", c * f / t, h), (f_share, "tokens", h, f / t)]
    if moe:
        split = plan.etp_resolved  # experts split by TP, or whole experts on each EP rank
        share = m.num_experts_per_tok * split / t  # rows each GPU runs per token, over its experts
        w = m.expert_width  # a latent MoE's experts run at its latent width, between two replicated projections
        out += [(1.0, "tokens", m.num_experts, h),
                (share, "experts", c * m.expert_ffn / split, w), (share, "experts", w, m.expert_ffn / split)]
        if m.moe_latent_size:
            out += [(1.0, "tokens", w, h), (1.0, "tokens", h, w)]
    return out


def serve_gemm_efficiency(gpu: Any, dtype: str, M: Any, N: float, K: float) -> Any:
    """Fraction of peak of one serving GEMM: the best large-GEMM fraction x M / (M + SERVE_GEMM_M_HALF) (few
    rows: small-M kernels pick small tiles, so no 128-row tile padding, but fill their pipelines poorly) x
    N-tile quantisation x K / (K + gemm_k_half). Derived: docs/formulas.md#infer.step"""
    n_fill = N / (np.ceil(N / TILE) * TILE)
    return gpu.max_gemm_fraction(dtype) * M / (M + SERVE_GEMM_M_HALF) * n_fill * K / (K + gpu.gemm_k_half)


def linear_seconds(m: ModelSpec, plan: ServePlan, gpu: Any, dtype: str, tokens: Any) -> tuple[Any, Any]:
    """(dense, expert) compute time of one GPU's matmuls for `tokens` rows through its share of the layers
    and the output layer, each GEMM at the efficiency of its own (M, N, K) (serve_gemm_efficiency); expert
    GEMMs at their rows per expert: the routed rows over the experts they touch (at least one row each), so
    fewer tokens never make them slower. Derived: docs/formulas.md#infer.step"""
    T = np.maximum(np.asarray(tokens, dtype=float), 1.0)
    # When the EP group spans replicas (DP attention, vLLM's DP + EP) the experts see the tokens of all of them
    # (cost.serve_moe.expert_token_factor).
    G = T * expert_token_factor(plan)
    touched = np.maximum(_expert_fraction_touched(m, G) * max(m.num_experts, 1), 1e-12)
    rows = {"tokens": T, "experts": np.maximum(G * m.num_experts_per_tok / touched, 1.0)}
    fmt = {"tokens": dtype, "experts": expert_compute_format(plan, gpu) if plan.expert_dtype else dtype}
    parts = {"tokens": 0.0, "experts": 0.0}
    for layers, moe in ((m.num_dense_layers, False), (m.num_moe_layers, True)):
        for share, kind, N, K in layer_linear_shapes(m, plan, moe) if layers else ():
            eff = serve_gemm_efficiency(gpu, fmt[kind], rows[kind], N, K)
            parts[kind] = parts[kind] + layers * 2 * share * T * N * K / (gpu.sustained_flops(fmt[kind]) * eff)
    V = padded_vocab(m.vocab_size, plan.tp) / plan.tp
    peak = gpu.sustained_flops(dtype)
    head = 2 * T * V * m.hidden_size / (peak * serve_gemm_efficiency(gpu, dtype, T, V, m.hidden_size))
    # The busiest EP rank's expert rows set the pace (serve_ep_imbalance; 1 when EP stays inside a replica).
    return (parts["tokens"] + head) / plan.pp, parts["experts"] * serve_ep_imbalance(m, plan, T) / plan.pp


SERVE_FORMATS = {"fp8": "fp8", "mxfp8": "mxfp8", "nvfp4": "fp4"}
"""Weight dtype -> the tensor-core format its GEMMs run in when the GPU has it (activations quantised on the
fly, W8A8 / W4A4); otherwise the weights are dequantised to bf16."""


def serve_compute_format(plan: ServePlan, gpu: Any) -> str:
    """The GEMM format of a serving step: the weights' own where the GPU has those tensor cores, else bf16."""
    fmt = SERVE_FORMATS.get(plan.weight_dtype)
    return fmt if fmt is not None and fmt in gpu.tflops else "bf16"


def expert_compute_format(plan: ServePlan, gpu: Any) -> str:
    """The routed experts' GEMM format: their own dtype's where the GPU has those tensor cores, else bf16."""
    fmt = SERVE_FORMATS.get(plan.expert_dtype_resolved)
    return fmt if fmt is not None and fmt in gpu.tflops else "bf16"


def elementwise_serve_bytes(m: ModelSpec, plan: ServePlan, compute_dtype: str) -> float:
    """HBM bytes per token per layer of a serving step's memory-bound operators on one GPU, in 16 bits: two
    norms (read + write h each) and two residual adds (read 2h, write h), which every TP rank repeats on the
    whole hidden state; the gated activation (read 2f/t, write f/t); with fp8 GEMMs, the cast of each GEMM
    input (read 2, write 1 per element); MoE routing and the permute / unpermute of the k copies.
    Derived: docs/formulas.md#infer.step"""
    h, t = m.hidden_size, plan.tp
    f = (m.num_experts_per_tok * m.expert_ffn + m.shared_ffn) if m.is_moe else m.intermediate_size
    d_v = attention_head_dims(m)[1]
    norms_adds = 2 * (2 * h + 3 * h) * 2.0
    act = (3 if m.gated_mlp else 2) * f / t * 2.0
    cast = 3.0 * (2 * h + m.num_attention_heads * d_v / t + f / t) if compute_dtype in ("fp8", "mxfp8", "fp4") else 0.0
    # MoE: routing and the permutes (moe_routing_bytes), on the MoE layers' share of the layers.
    routing = (m.num_moe_layers / m.num_hidden_layers) * moe_routing_bytes(m) if m.is_moe else 0.0
    return norms_adds + act + cast + routing


def step_seconds(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, tokens: Any,
                 attn_pairs: Any, kv_read: Any, decode_only: bool = False) -> Any:
    """One engine step of one pipeline stage on one GPU: `tokens` new tokens, `attn_pairs` (query, key)
    pairs of attention, `kv_read` KV bytes read on this GPU (`decode_only`: a step of decodes alone, which
    DeepEP serves with its low-latency kernels). Time = the step's compute (step_compute_seconds) and its
    expert exchange, one after the other or, with two-batch overlap, overlapped over two half-batches
    (cost.serve_moe.overlapped_step). Derived: docs/formulas.md#infer.step"""
    def parts(share: float) -> tuple[Any, Any, Any]:
        T = np.asarray(tokens, dtype=float) * share
        exchange = expert_exchange_seconds(m, plan, system, spans, T, decode_only)
        rest, routed = step_compute_parts(m, plan, system, spans, T, np.asarray(attn_pairs) * share,
                                          np.asarray(kv_read) * share, decode_only)
        return rest, routed, exchange

    slowdown = comm_sm_slowdown(plan, system.gpu, decode_only)
    if plan.two_batch_overlap and not decode_only and m.is_moe and plan.moe_dispatcher == "deepep":
        # SGLang's prefill (extend) schedule: three stages per MoE layer and micro-batch (serve_moe.tbo_prefill_seconds)
        rest, routed, exchange = parts(0.5)
        b = dispatch_bytes_per_element(plan, system.gpu)
        return tbo_prefill_seconds(rest, routed, exchange, m.num_moe_layers / plan.pp, m.num_dense_layers / plan.pp,
                                   b / (b + COMBINE_BYTES), slowdown)
    rest, routed, exchange = parts(1.0)
    half = parts(0.5) if plan.two_batch_overlap else (0.0, 0.0, 0.0)
    return overlapped_step(rest + routed, exchange, half[0] + half[1], half[2], plan.two_batch_overlap, slowdown)


def attention_pair_dims(m: ModelSpec, plan: ServePlan, decode_only: bool) -> tuple[float, float]:
    """(query-key, value) width per head of one attention pair: the head's own dims, or for MLA decoding from
    its latent cache the absorbed form, where every head scores against the latent plus the rope key
    (kv_lora_rank + qk_rope_head_dim) and sums the latent values (kv_lora_rank), 3.4x the expanded form's work
    for DeepSeek-V3. Source: DeepSeek-V2 report §2.1 (absorbing W^UK and W^UV at inference); deepseek-ai/FlashMLA
    README (decode on the 576-wide latent cache, 512-wide values). Derived: docs/formulas.md#infer.step"""
    if m.is_mla:  # is_mla: the MLA dims are set
        c, r = float(m.kv_lora_rank or 0), float(m.qk_rope_head_dim or 0)
        if decode_only and plan.mla_latent_cache:
            return c + r, c
        return float(m.qk_nope_head_dim or 0) + r, float(m.v_head_dim or 0)
    return float(m.d_head), float(m.d_head)


def expert_exchange_seconds(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, tokens: Any,
                            decode_only: bool) -> Any:
    """The EP token exchange of a step: with EP each TP rank dispatches its 1/t share of the tokens (the
    attention all-reduce becomes a reduce-scatter + all-gather around the MoE block) to the experts' ranks and
    combines them back, two all-to-alls of the k routed 16-bit copies per MoE layer, waiting on the busiest
    rank (serve_ep_imbalance); with DeepEP, its kernels (cost.serve_moe). Derived: docs/formulas.md#infer.step"""
    if plan.ep <= 1 or not m.is_moe:
        return 0.0
    if plan.moe_dispatcher == "deepep":
        return deepep_exchange_seconds(m, plan, system, spans.ep, tokens, decode_only)
    act = 2.0 * m.expert_width * np.asarray(tokens, dtype=float) * serve_ep_imbalance(m, plan, tokens)
    layers = m.num_moe_layers / plan.pp
    if not plan.dp_attention and plan.ep > plan.tp:
        # vLLM's DP + EP (its default all2all backend, allgather_reducescatter): every rank gathers the hidden
        # states of all ep / tp replicas in the group, runs its experts on them, and reduce-scatters the outputs
        # back. Source: vLLM docs, Expert Parallel Deployment (backend selection guide).
        gathered = act * expert_token_factor(plan)
        return layers * (_coll(system, "all-gather", gathered, spans.ep)
                         + _coll(system, "reduce-scatter", gathered, spans.ep))
    return 2 * layers * _coll(system, "all-to-all", act * m.num_experts_per_tok / plan.tp, spans.ep)


def step_compute_seconds(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, tokens: Any,
                         attn_pairs: Any, kv_read: Any, decode_only: bool = False) -> Any:
    """A step's work on one GPU beside its expert exchange: max(matmuls, weights read) + max(attention core,
    KV read) + memory-bound operators + the TP all-reduces (2 per layer). Derived: docs/formulas.md#infer.step"""
    rest, routed = step_compute_parts(m, plan, system, spans, tokens, attn_pairs, kv_read, decode_only)
    return rest + routed


def step_compute_parts(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, tokens: Any,
                       attn_pairs: Any, kv_read: Any, decode_only: bool = False) -> tuple[Any, Any]:
    """(everything but the routed experts, the routed experts' max(GEMMs, weights read)) of
    step_compute_seconds: the parts a two-batch-overlap schedule places apart. Derived: docs/formulas.md#infer.step"""
    gpu = system.gpu
    t, p = plan.tp, plan.pp
    compute_dtype = serve_compute_format(plan, gpu)
    L = m.num_hidden_layers
    qk, v = attention_pair_dims(m, plan, decode_only)
    attn_flops = 2 * attn_pairs * m.num_attention_heads * (qk + v) * L / (t * p)
    # Weights read once per step: every matmul weight, but only the looked-up rows of the embedding, and of
    # the experts (EPLB's replicas included) only those the step's tokens touch; with DP attention the tokens
    # of every attention rank reach them (cost.serve_moe.expert_token_factor).
    weights = serve_weight_bytes(m, plan) - padded_vocab(m.vocab_size, t) * m.hidden_size / t * 2.0 / p
    experts = 0.0
    if m.is_moe:
        wpp = weight_bytes_per_param(plan.expert_dtype_resolved, plan.quant_group_size)
        shards = plan.ep * plan.etp_resolved  # whole experts over EP ranks, or each expert split by TP
        experts = (m.num_moe_layers * m.num_experts * expert_params(m) * wpp / shards / p
                   + redundant_expert_params(m, plan) * wpp)
        weights = weights - experts
        experts = experts * _expert_fraction_touched(m, np.asarray(tokens, dtype=float) * expert_token_factor(plan))
    bandwidth = gpu.hbm_bytes_per_s * gpu.hbm_efficiency
    elementwise = elementwise_serve_bytes(m, plan, compute_dtype) * np.asarray(tokens, dtype=float) * L / p
    # The sampler reads each token's fp32 logits (written by the output layer) for softmax / top-k / top-p.
    elementwise = elementwise + 2 * 4.0 * padded_vocab(m.vocab_size, t) / t * np.asarray(tokens, dtype=float) / p
    # Matmuls and attention are separate kernels: each is bound by its own compute or its own reads (the
    # weights, the touched experts, the KV cache), and they run one after the other.
    dense_s, expert_s = linear_seconds(m, plan, gpu, compute_dtype, tokens)
    routed = np.maximum(expert_s, experts / bandwidth)
    gemm = np.maximum(dense_s, weights / bandwidth)
    head = head_dim_attention_ratio(m, gpu.attention_softmax_head_dim) if plan.fused_attention else 1.0
    attention = np.maximum(attn_flops / (gpu.sustained_flops("bf16") * gpu.attention_efficiency
                                         * gpu.softmax_attention_ratio * head),
                           np.asarray(kv_read, dtype=float) / bandwidth)
    # Unfused attention writes the scores S, reads them for the softmax, writes P and reads it for P·V: four
    # 16-bit passes over every (query, key) pair of every head, in memory-bound kernels of their own (added,
    # not overlapped with the GEMMs). Source: Dao et al. 2022 (FlashAttention) §2.2.
    scores = 0.0 if plan.fused_attention else 4 * 2.0 * attn_pairs * m.num_attention_heads / t * L / p / bandwidth
    act = 2.0 * m.hidden_size * np.asarray(tokens, dtype=float)
    tp_comm = 2 * (L / p) * _coll(system, "all-reduce", act, spans.tp)
    return gemm + attention + elementwise / bandwidth + scores + tp_comm, routed


SERVE_COLLECTIVE_FLOOR_S = 0.0
"""Least time of one collective in a serving step: a kernel that synchronises the group's GPUs (NCCL or the
engines' custom all-reduce), whatever the message size; fitted by leave-one-model-out on the TensorRT-LLM
runs (docs/validation.md#serving): 0 in the current fit, where the latency term of collective_time already
prices the small messages of decode."""


def _coll(system: SystemSpec, op: str, size: Any, span: GroupSpan) -> Any:
    sizes = np.atleast_1d(np.asarray(size, dtype=float))
    out = np.array([max(collective_time(op, float(s), span, system).seconds, SERVE_COLLECTIVE_FLOOR_S)
                    if span.size > 1 else 0.0 for s in sizes])
    return out if np.ndim(size) else float(out[0])


def decode_tpot(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, batch: Any, context: Any,
                overhead: float = 0.0, queries: int = 1) -> Any:
    """Time per output token at `batch` sequences of average `context`: with p stages the batch splits into p
    groups that take turns, so a sequence gets a token every p stage-steps of batch/p sequences (each step
    reading the stage's weights once and the group's KV), plus the engine's host time per step (`overhead`).
    `queries` tokens per sequence per step (speculative verification: k + 1) share the step's KV reads.
    Derived: docs/formulas.md#infer.decode"""
    b = np.maximum(np.asarray(batch, dtype=float) / plan.pp, 1.0)
    # A hybrid's recurrent layers read and write each sequence's fixed state once per step.
    kv = b * (kv_bytes_per_seq_gpu(m, plan, context) + 2 * recurrent_state_per_seq_gpu(m, plan))
    q = b * queries
    stage = step_seconds(m, plan, system, spans, q, q * attended_keys(m, context), kv, decode_only=True)
    hop = _coll(system, "send-recv", 2.0 * m.hidden_size * q, spans.pp) if plan.pp > 1 else 0.0
    return plan.pp * (stage + hop) + overhead


def job_tpot(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, job: ServeJob, batch: Any,
             context: Any) -> Any:
    """TPOT of the job's decoding at `batch` sequences of average `context`: one token per step, or under
    speculative decoding the step of draft + verification over the tokens it yields (cost.speculative).
    Derived: docs/formulas.md#infer.decode"""
    overhead = step_host_seconds(m, plan, job)
    if job.speculative is None:
        return decode_tpot(m, plan, system, spans, batch, context, overhead)
    from llmplan.cost.speculative import speculative_tpot  # builds on this module: imported where used
    return speculative_tpot(m, plan, system, spans, job, batch, context, overhead)


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
    pairs = chunk * attended_keys(m, cached + new / 2)  # per chunk, on average
    decodes = np.asarray(batch, dtype=float) / plan.pp
    kv = decodes * kv_bytes_per_seq_gpu(m, plan, job.input_len + job.output_len / 2)
    stage = step_seconds(m, plan, system, spans, chunk + decodes,
                         pairs + decodes * attended_keys(m, job.context / 2), kv)
    hop = _coll(system, "send-recv", 2.0 * m.hidden_size * chunk, spans.pp) if plan.pp > 1 else 0.0
    return n_chunks * (plan.pp * (stage + hop) + step_host_seconds(m, plan, job))


def prefill_work_seconds(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, job: ServeJob) -> float:
    """Engine time one request's prefill costs when prompts are batched: a full step of
    max_num_batched_tokens prompt tokens (several requests' prompts, reading the weights once) times the
    request's share of it. Derived: docs/formulas.md#infer.throughput"""
    T = float(job.max_num_batched_tokens)
    new = max(job.uncached_input, 1.0)
    cached = job.input_len - job.uncached_input
    stage = step_seconds(m, plan, system, spans, T, T * attended_keys(m, cached + min(new, T) / 2), 0.0)
    hop = _coll(system, "send-recv", 2.0 * m.hidden_size * T, spans.pp) if plan.pp > 1 else 0.0
    return float(plan.pp * (stage + hop) + step_host_seconds(m, plan, job)) * new / T


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
    tpot = job_tpot(m, plan, system, spans, job, batch, context)
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
