"""Serving memory per GPU: the engines' rules (ENGINES), weight bytes, KV-cache and recurrent-state bytes per
sequence, the activation peak, the KV capacity and the concurrency it admits (ServeMemory).

Symbols: B concurrent sequences, c context tokens, L layers, K KV heads, d head dim, t TP, p PP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from llmplan.cost.breakdown import Breakdown
from llmplan.cost.compressed import compressed_cache_bytes_per_token, window_cache_bytes
from llmplan.cost.compute import layer_windows
from llmplan.cost.mixers import recurrent_state_bytes
from llmplan.cost.params import padded_vocab, rank_params
from llmplan.cost.serve_moe import redundant_expert_params
from llmplan.cost.sparse import indexer_cache_bytes
from llmplan.specs.defaults import SERVE_RUNTIME_GIB
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import MemoryAllowance
from llmplan.specs.serve import DEFAULT_BATCHED_TOKENS, ServeJob, ServePlan
from llmplan.units import GIB, MXFP8_BYTES, NVFP4_BYTES

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
    allreduce_workspace_bytes: tuple[float, float] | None = None
    """(TP <= 2, TP > 2) largest TP all-reduce, in bytes, the engine's own all-reduce kernel takes; a larger
    one goes to NCCL (cost.serve_step.tp_allreduce_seconds). None: every TP all-reduce priced alike."""
    tp_moe_all_to_all: bool = True
    """With EP inside the TP group (ep <= tp, no DP attention): True, each TP rank dispatches its 1/t share of
    the tokens to the experts' ranks and combines them back by all-to-all; False, every rank runs its own
    experts on the TP group's replicated hidden states and the layer's TP all-reduce of the MoE output is the
    combine (TensorRT-LLM: no exchange beyond the two all-reduces, cost.serve_step.expert_exchange_seconds)."""
    fa3_mla_prefill: bool = False
    """An MLA model's prefill runs as multi-head attention (query-key 192, value 128 for DeepSeek-V3) in
    FlashAttention-3's varlen forward, one causal call over the step's prompts, where the GPU publishes an FA3
    forward rate (GpuSpec.fa3_forward_efficiency; cost.attention_rate.serving_prefill_asymptote). False: the
    prefill attention is priced at the native kernel's asymptote (serving_attention_asymptote)."""


ENGINES = {
    # Source: vLLM docs, "gpu_memory_utilization" (fraction of the whole GPU for weights, activations and KV
    # cache; blocks allocated on demand, preemption when full); async scheduling overlaps the host's work.
    "vllm": EngineRule(False, True, False, 0.0, "vLLM EngineArgs gpu_memory_utilization; PagedAttention"),
    # Source: TensorRT-LLM docs, KvCacheConfig.free_gpu_memory_fraction and "Useful Runtime Options"
    # (GUARANTEED_NO_EVICT is the default capacity scheduler policy); the overlap scheduler hides host time.
    # Its AUTO all-reduce (thop/allreduceOp.cpp, AllreduceOp::selectImplementation) falls back to NCCL when a
    # message exceeds customAllReduceUtils::getMaxRequiredWorkspaceSize: 16e6 bytes at TP <= 2, 8e6 above.
    # Without attention DP its MoE layers exchange nothing but the TP all-reduce: Qwen3MoE builds its experts
    # with reduce_results=False, feeds them the replicated hidden states and all-reduces their output when
    # not enable_attention_dp (_torch/models/modeling_qwen3_moe.py); CutlassFusedMoE all-gathers tokens only
    # under attention DP (use_dp) (_torch/modules/fused_moe/fused_moe_cutlass.py).
    "trtllm": EngineRule(True, True, True, 0.0, "TensorRT-LLM KvCacheConfig free_gpu_memory_fraction",
                         allreduce_workspace_bytes=(16e6, 8e6), tp_moe_all_to_all=False),
    # Source: SGLang server arguments, --mem-fraction-static (model weights and KV cache pool); its overlap
    # scheduler hides host time.
    # On Hopper with no --attention-backend it picks FA3 for MLA models ("Attention backend not set. Use fa3
    # backend by default." with "Chunked prefix cache is turned on.": sgl-project/sglang#6017, the large-scale
    # EP reproduction, 2025-05-15), and a prefill without cached prefix dispatches to MHA_CHUNKED_KV
    # (fzyzcjy/sglang @017a591 python/sglang/srt/models/deepseek_v2.py, DeepseekV2AttentionMLA.
    # dispatch_attn_forward_method: fa3 and sum(extend_prefix_lens) == 0), which FlashAttentionBackend.
    # forward_extend runs as sgl_kernel's FA3 flash_attn_varlen_func(causal=True) over q / k of head dim 192 and
    # v of 128 (its "MHA for extend part of sequence without attending prefix kv cache" branch; not pinned).
    "sglang": EngineRule(False, False, False, 0.0, "SGLang ServerArgs mem_fraction_static", fa3_mla_prefill=True),
}
"""Per-engine rules. step_overhead_s: 0 for the three, whose schedulers overlap host work with the GPU (the
fit on the TensorRT-LLM runs also lands on 0, docs/validation.md#serving); without CUDA graphs every kernel
launch is added (step_host_seconds)."""


MIB = 2**20
SGLANG_RESERVE_MIB = 512.0
"""SGLang's constant reserve (attention-backend metadata and activation slack) in its default
--mem-fraction-static, MiB (sglang_mem_fraction_static)."""
SGLANG_ACTIVATION_MIB_PER_TOKEN = 1.5
"""MiB SGLang reserves per activation token (the chunked-prefill size, at least SGLANG_MIN_ACTIVATION_TOKENS)."""
SGLANG_MIN_ACTIVATION_TOKENS = 2048
SGLANG_PARALLEL_MIB = 1024 / 8
"""MiB reserved per GPU of tp_size x pp_size ("adjustments for large parallel size")."""
SGLANG_FLOOR_MIB, SGLANG_FLOOR_ABOVE_MIB = 10 * 1024.0, 60 * 1024.0
"""The reserve is at least 10 GiB on a GPU of more than 60 GiB."""
SGLANG_DECODE_GRAPH_MIB_PER_BS = 2.0
SGLANG_DP_ATTN_MIB_PER_BS, SGLANG_DP_ATTN_LARGE_MIB_PER_BS, SGLANG_DP_ATTN_LARGE_BS = 3.0, 1.5, 300
"""DP attention: 3 MiB per decode-graph request per attention rank, 1.5 more when max_bs > 300."""
SGLANG_PREFILL_GRAPH_MIB_PER_SIZE, SGLANG_MLA_PREFILL_GRAPH_MIB = 8.0, 1536.0
SGLANG_DEEPEP_MIB, SGLANG_DEEPEP_PREFILL_GRAPH_MIB = 2048.0, 1024.0
# The constants above: sgl-project/sglang v0.5.23 (PyPI sglang-0.5.23 wheel; GitHub
# python/sglang/srt/arg_groups/memory_hook.py), handle_gpu_memory_settings, reserve_for_graph_mb,
# reserve_for_deepep_a2a_mb. They are SGLang's own settings, not fitted here.


@dataclass(frozen=True)
class SglangServer:
    """What SGLang 0.5.23's default --mem-fraction-static reads of a CUDA server's settings (ServerArgs once
    the CUDA-graph and GPU-memory defaults are resolved; no speculative or post-capture sizing switches)."""

    gpu_mem_bytes: float
    """The GPU's total memory (SGLang reads nvidia-smi's memory.total, MiB)."""
    tp_size: int = 1
    """--tp-size (every GPU of the instance, attention DP ranks included)."""
    pp_size: int = 1
    chunked_prefill_size: int = 8192
    decode_graph_max_bs: int | None = None
    """The decode CUDA graphs' max_bs, which SGLang resolves with decode graphs on or off; None: unknown (then
    decode graphs off)."""
    decode_graphs: bool | None = None
    """Whether decode CUDA graphs are captured; None: where decode_graph_max_bs is given."""
    max_running_requests: int | None = None
    """--max-running-requests (all attention ranks together); None: not given."""
    prefill_graph_max_tokens: int | None = None
    """The breakable prefill CUDA graphs' largest token count; None: prefill graphs off."""
    mla: bool = False
    attn_dp_size: int = 0
    """Attention DP ranks under --enable-dp-attention; 0 without it."""
    deepep: bool = False
    """--moe-a2a-backend deepep."""
    phase: str = "both"
    """--disaggregation-mode: both (null), prefill or decode."""
    draft_tokens: int = 1
    """--speculative-num-draft-tokens (1 without speculation): a decode server's activation tokens."""


def sglang_prefill_graph_sizes(max_tokens: int) -> int:
    """How many token counts SGLang's default breakable prefill CUDA graphs capture up to `max_tokens`: every 4
    to 32, 16 to 256, 32 to 512, 64 to 1,024, 256 to 4,096, then every 512. Source: sgl-project/sglang v0.5.23,
    python/sglang/srt/arg_groups/cuda_graph_hook.py, generate_prefill_cuda_graph_batch_sizes."""
    steps = ((4, 32, 4), (48, 256, 16), (288, 512, 32), (576, 1024, 64), (1280, 4096, 256), (4608, max_tokens, 512))
    return sum(len(range(lo, min(hi, max_tokens) + 1, step)) for lo, hi, step in steps)


def sglang_graph_reserve_mib(s: SglangServer) -> float:
    """MiB SGLang's default fraction keeps for CUDA graphs: 2 per decode-graph request (decode graphs on); with DP
    attention 3 per request of the decode max_bs per attention rank, 1.5 more above 300, whether decode graphs are
    on or off; 8 per captured prefill size (1.5 GiB for an MLA model), 1 GiB more with DeepEP.
    Source: sgl-project/sglang v0.5.23, arg_groups/memory_hook.py, reserve_for_graph_mb (its DP-attention term
    does not read the decode backend; handle_gpu_memory_settings resolves max_bs either way)."""
    mib, bs = 0.0, s.decode_graph_max_bs
    on = s.decode_graphs if s.decode_graphs is not None else bs is not None
    if s.phase != "prefill" and bs is not None:
        mib += bs * SGLANG_DECODE_GRAPH_MIB_PER_BS if on else 0.0
        if s.attn_dp_size:
            mib += bs * s.attn_dp_size * (SGLANG_DP_ATTN_MIB_PER_BS + SGLANG_DP_ATTN_LARGE_MIB_PER_BS
                                          * (bs > SGLANG_DP_ATTN_LARGE_BS))
    if s.phase != "decode" and s.prefill_graph_max_tokens is not None:
        mib += SGLANG_MLA_PREFILL_GRAPH_MIB if s.mla else \
            sglang_prefill_graph_sizes(s.prefill_graph_max_tokens) * SGLANG_PREFILL_GRAPH_MIB_PER_SIZE
        mib += SGLANG_DEEPEP_PREFILL_GRAPH_MIB if s.deepep else 0.0
    return mib


def sglang_mem_fraction_static(s: SglangServer) -> float:
    """SGLang's --mem-fraction-static when none is given: round((G - R) / G, 3), G the GPU's memory in MiB and R
    the reserve for activations and CUDA graphs: 512 + 1.5 x the activation tokens (max(chunked prefill,
    2,048); a decode server: max(--max-running-requests, else the decode max_bs, x draft tokens, 2,048)) +
    tp_size x pp_size / 8 x 1,024 + the
    graphs' reserve (sglang_graph_reserve_mib), at least 10 GiB on a GPU above 60 GiB, plus 2 GiB for DeepEP's
    buffers under decode graphs. Source: sgl-project/sglang v0.5.23 (PyPI wheel),
    python/sglang/srt/arg_groups/memory_hook.py, handle_gpu_memory_settings. Derived: docs/formulas.md#infer.capacity"""
    gpu = s.gpu_mem_bytes / MIB
    running = s.max_running_requests or s.decode_graph_max_bs or 1
    tokens = running * s.draft_tokens if s.phase == "decode" else s.chunked_prefill_size
    reserved = (SGLANG_RESERVE_MIB + SGLANG_ACTIVATION_MIB_PER_TOKEN * max(tokens, SGLANG_MIN_ACTIVATION_TOKENS)
                + s.tp_size * s.pp_size * SGLANG_PARALLEL_MIB + sglang_graph_reserve_mib(s))
    if gpu > SGLANG_FLOOR_ABOVE_MIB:
        reserved = max(reserved, SGLANG_FLOOR_MIB)
    if s.deepep and s.phase != "prefill" and s.decode_graph_max_bs is not None and s.decode_graphs is not False:
        reserved += SGLANG_DEEPEP_MIB
    return round((gpu - reserved) / gpu, 3)


SGLANG_CHUNKED_PREFILL = ((20, 2048), (60, 4096), (160, 8192))
"""SGLang's default --chunked-prefill-size by GPU memory: (below this many GiB of device memory, tokens);
16,384 at 160 GiB and above, 4,096 when the memory is unknown; no TP or model dependence (its 20-35 and
35-60 GiB rows, and its 60-90 and 90-160 GiB rows, agree). Source: sgl-project/sglang v0.5.23 (PyPI
sglang-0.5.23 wheel), python/sglang/srt/arg_groups/memory_hook.py, handle_gpu_memory_settings."""
SGLANG_CHUNKED_PREFILL_TOP, SGLANG_CHUNKED_PREFILL_UNKNOWN = 16384, 4096


def sglang_chunked_prefill_size(hbm_bytes: float | None) -> int:
    """SGLang 0.5.23's --chunked-prefill-size when none is given, for the whole server (under DP attention it
    then gives each attention rank chunked_prefill_size // attn_dp_size: arg_groups/parallel_hook.py,
    handle_data_parallelism, which runs after handle_gpu_memory_settings). llmplan's hbm_gib is deviceQuery's
    total, SGLang's gpu_mem nvidia-smi's (slightly more), as for cost.serve_step.sglang_graph_max_bs.
    Source: sgl-project/sglang v0.5.23 (PyPI wheel), arg_groups/memory_hook.py, handle_gpu_memory_settings.
    Derived: docs/formulas.md#infer.sglang_chunk"""
    if hbm_bytes is None:
        return SGLANG_CHUNKED_PREFILL_UNKNOWN
    gib = hbm_bytes / GIB
    return next((tokens for below, tokens in SGLANG_CHUNKED_PREFILL if gib < below), SGLANG_CHUNKED_PREFILL_TOP)


def sglang_chunk_total(job: ServeJob, plan: ServePlan, hbm_bytes: float | None) -> int:
    """The --chunked-prefill-size of the SGLang server of `plan` (all attention ranks together): SGLang's own
    default for the GPU (sglang_chunked_prefill_size) where the job is SGLang's and gives no budget
    (ServeJob.max_num_batched_tokens_default), else the job's per-rank budget x the attention DP ranks.
    Derived: docs/formulas.md#infer.sglang_chunk"""
    if job.engine == "sglang" and job.max_num_batched_tokens_default:
        return sglang_chunked_prefill_size(hbm_bytes)
    return job.max_num_batched_tokens * plan.attn_dp


def default_batched_tokens(engine: str, plan: ServePlan, hbm_bytes: float | None) -> int:
    """Tokens one engine step of a replica (an attention rank under DP attention) may process when the user
    gives no budget: SGLang its default chunk for the GPU split over the attention ranks (as its
    handle_data_parallelism divides it), vLLM and TensorRT-LLM DEFAULT_BATCHED_TOKENS.
    Derived: docs/formulas.md#infer.sglang_chunk"""
    if engine != "sglang":
        return DEFAULT_BATCHED_TOKENS
    return max(sglang_chunked_prefill_size(hbm_bytes) // plan.attn_dp, 1)


def batched_tokens_for_plan(job: ServeJob, plan: ServePlan, hbm_bytes: float | None) -> int:
    """The job's max_num_batched_tokens on a server of `plan`: the job's own, or where an SGLang job gives none
    (ServeJob.max_num_batched_tokens_default) SGLang's default (default_batched_tokens); vLLM and TensorRT-LLM
    keep the job's value. Derived: docs/formulas.md#infer.sglang_chunk"""
    if job.engine == "sglang" and job.max_num_batched_tokens_default:
        return default_batched_tokens(job.engine, plan, hbm_bytes)
    return job.max_num_batched_tokens


def sglang_server_of(m: ModelSpec, plan: ServePlan, job: ServeJob, gpu: Any) -> SglangServer:
    """The SGLang server llmplan's export launches for `plan` (export.serve.render_sglang: --tp-size tp x dp and
    --chunked-prefill-size x dp under DP attention), with SGLang's default decode graphs (sglang_graph_max_bs at
    its tp-size; the largest of the user's --cuda-graph-sizes) and its breakable prefill graphs, on by default
    on CUDA (cuda_graph_config.py, default_prefill_backend) but off with pipeline parallelism, two-batch
    overlap or DeepSeek-V4 (cuda_graph_hook.py, apply_cuda_graph_compatibility). Derived:
    docs/formulas.md#infer.capacity"""
    from llmplan.cost.serve_step import sglang_decode_max_bs, sglang_default_list_empty  # builds on this module
    dp = plan.attn_dp
    tp, chunk = plan.tp * dp, sglang_chunk_total(job, plan, gpu.hbm_gib * GIB)
    user = job.cuda_graph_batch_sizes if not job.cuda_graph_sizes_default else None
    # A default max_bs above --max-running-requests (the export writes the batch x dp) is cut to it; SGLang
    # resolves it with decode graphs off too (its DP-attention reserve reads it).
    decode = max(user) if user and job.cuda_graphs else sglang_decode_max_bs(gpu.hbm_bytes, tp, job.batch * dp)
    prefill = job.cuda_graphs and gpu.vendor == "nvidia" and plan.pp == 1 and not plan.two_batch_overlap \
        and not m.compressed_layers
    return SglangServer(
        gpu_mem_bytes=gpu.hbm_gib * GIB, tp_size=tp, pp_size=plan.pp, chunked_prefill_size=chunk,
        # an empty default list: the export writes --disable-decode-cuda-graph (sglang_default_list_empty)
        decode_graph_max_bs=decode, decode_graphs=job.cuda_graphs and not sglang_default_list_empty(job),
        max_running_requests=job.batch * dp,
        prefill_graph_max_tokens=chunk if prefill else None, mla=m.mla is not None,
        attn_dp_size=plan.attn_dp if plan.dp_attention else 0, deepep=plan.moe_dispatcher == "deepep",
        phase=plan.phase, draft_tokens=job.speculative.num_speculative_tokens + 1 if job.speculative else 1)


def weight_bytes_per_param(dtype: str, group: int) -> float:
    """Bytes per linear-layer weight, scale overhead included: group quantisation keeps an fp16 scale and an
    fp16 zero point per `group` weights (AWQ/GPTQ style, 4/group bytes); fp8 keeps one scale per 128x128
    block (DeepSeek-V3 style, negligible); MXFP8 one E8M0 byte per 32 weights and NVFP4 one E4M3 byte per
    16 (OCP Microscaling spec; NVIDIA NVFP4 format). Derived: docs/formulas.md#infer.weights"""
    return {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0 + 4 / 16384, "mxfp8": MXFP8_BYTES, "nvfp4": NVFP4_BYTES,
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
    recurrent layers keep a fixed state instead: recurrent_state_bytes). DeepSeek-V4: the compressed keys a
    token of context adds (its windows are per sequence: cost.compressed.window_cache_bytes)."""
    if m.compressed_layers:
        return compressed_cache_bytes_per_token(m, KV_BYTES[kv_dtype])
    return m.num_attention_layers * kv_layer_bytes(m, kv_dtype)


def recurrent_state_per_seq_gpu(m: ModelSpec, plan: ServePlan) -> float:
    """Recurrent-state bytes one sequence holds on one GPU: its TP shard of the states of its stage's share of
    the recurrent layers, in bf16 (vLLM's mamba cache dtype 'auto': the model's dtype). Derived:
    docs/formulas.md#mixers.state"""
    return recurrent_state_bytes(m, 2.0, plan.tp) / plan.pp


def kv_bytes_per_seq_gpu(m: ModelSpec, plan: ServePlan, context: Any, block_size: int = 1) -> Any:
    """KV bytes one sequence of `context` tokens holds on one GPU: its stage's share of the layers, each
    keeping min(context, window) tokens rounded up to whole blocks. Derived: docs/formulas.md#infer.kv"""
    if m.compressed_layers:  # DeepSeek-V4: every layer's window and buffers, the compressed keys (replicated)
        value = KV_BYTES[plan.kv_dtype]  # bytes per cached value
        return (window_cache_bytes(m, context, value)
                + np.asarray(context) * compressed_cache_bytes_per_token(m, value)) / plan.pp
    per_layer = kv_layer_bytes(m, plan.kv_dtype, plan.tp, plan.mla_latent_cache)
    total: Any = 0.0  # an array when `context` is one
    for window, layers in layer_windows(m):
        tokens = context if window is None else np.minimum(context, window)
        total = total + layers * np.ceil(np.asarray(tokens) / block_size) * block_size * per_layer
    return total / plan.pp


def activation_peak_bytes(m: ModelSpec, plan: ServePlan, job: ServeJob) -> float:
    """Activation peak of the engine's profiling step (max_num_batched_tokens T tokens) on one GPU: the larger of
    the forward's workspace (hidden states, QKV, MLP intermediates (gate and up, then the product) in 16 bits;
    without fused attention one layer's scores and probabilities for a prompt of T tokens) and the sampler's
    (the T hidden states kept, fp32 logits of the min(batch, T) sequences sampled): the sampler runs after the
    forward has freed its intermediates, so the two do not add.
    Source: vllm-project/vllm @000fc94b vllm/v1/worker/gpu_model_runner.py, GPUModelRunner.profile_run
    (_dummy_run of max_num_tokens, then _dummy_sampler_run; num_reqs = min(num_tokens, max_num_seqs)).
    Derived: docs/formulas.md#infer.activations"""
    T, h, t = job.max_num_batched_tokens, m.hidden_size, plan.tp
    qkv = (m.num_attention_heads * m.d_head + 2 * max(m.kv_heads, t) * m.d_head) / t
    f = (m.num_experts_per_tok * m.expert_ffn + m.shared_ffn) if m.is_moe else m.intermediate_size
    mlp = (3 if m.gated_mlp else 2) * f / t
    logits = min(job.batch, T) * padded_vocab(m.vocab_size, t) / t * 4
    scores = 0.0 if plan.fused_attention else 2 * 2.0 * m.num_attention_heads / t * T * T  # S and P, 16-bit
    return max(2 * T * (2 * h + qkv + mlp) + scores, 2 * T * h + logits)


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
    SGLang u·(HBM - other) - weights: its fraction applies to the memory free once the CUDA context and NCCL
    are up, before the weights load. Source: sgl-project/sglang @001ccef0
    python/sglang/srt/model_executor/model_runner_kv_cache_mixin.py, profile_max_num_token (free after loading
    - total_gpu_memory x (1 - mem_fraction_static)), total_gpu_memory being model_runner.py's
    min_per_gpu_memory, read after the distributed init. Derived: docs/formulas.md#infer.capacity"""
    rule, u = ENGINES[job.engine], job.gpu_memory_utilization
    if rule.fraction_of_free:
        free = hbm_bytes - weights - activations - other
        return u * free if free > 0 else free
    if not rule.activations_inside:
        return u * (hbm_bytes - other) - weights
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
    other = (SERVE_RUNTIME_GIB if allowance.fixed_gib is None else allowance.fixed_gib) * GIB
    available = kv_capacity_bytes(job, hbm_bytes, weights, act, other)
    if rule.fraction_of_free:
        cap = weights + act + other + max(available, 0.0)
    else:
        cap = job.gpu_memory_utilization * hbm_bytes if rule.activations_inside else \
            job.gpu_memory_utilization * (hbm_bytes - other) + act + other
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
