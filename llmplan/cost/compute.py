"""FLOPs and compute time: model and hardware FLOPs per step, GEMM time from peak x a shape-dependent
efficiency, memory-bound operators from HBM bandwidth, and the optimizer step.

Works on one ParallelPlan and, elementwise, on plan arrays (see llmplan/arith.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from llmplan.arith import maximum, minimum, where
from llmplan.cost.breakdown import Breakdown
from llmplan.cost.mixers import (attention_share, dense_mlp_share, mean_recurrent_memory_bytes, mean_recurrent_params,
                                 mean_scan_flops, norms_per_layer, recurrent_gemm_shapes)
from llmplan.cost.moe import routing_imbalance
from llmplan.cost.params import (attention_params, expert_params, kv_heads_per_rank, latent_proj_params,
                                 memoized, mlp_params, padded_vocab, recomputed_share)
from llmplan.cost.sparse import indexer_flops_per_pair
from llmplan.specs.hardware import GpuSpec
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan

GEMM_HALF_DIM = 512.0  # serving's default curve: efficiency reaches half its best at a smallest dimension of 512
KERNEL_LAUNCH_S = 5e-6  # one CUDA kernel launch from the host (a few microseconds; CUDA Programming Guide)
TILE = 128  # output tile edge of the large-GEMM kernels (cuBLAS / CUTLASS 128 x 128 .. 256 x 128 tiles)


def gemm_shape_efficiency(gpu: GpuSpec, dtype: str, M: Any, N: Any, K: Any) -> Any:
    """Achieved fraction of peak of one M x N x K GEMM from its own shape: the best large-GEMM fraction, times
    tile quantisation (M and N padded to whole 128-tiles), wave quantisation (the tiles over the SMs, the last
    wave partly idle) and a short-reduction term K / (K + gemm_k_half). Large GEMMs of TP4 and TP8 run alike; a GEMM
    with few rows (small micro-batch, an expert's share of the tokens) pays for its idle tiles and SMs.
    Source: NVIDIA Matrix Multiplication Background User's Guide (tile and wave quantization).
    Derived: docs/formulas.md#compute.gemm"""
    return grouped_gemm_efficiency(gpu, dtype, M, N, K, 1)


def grouped_gemm_efficiency(gpu: GpuSpec, dtype: str, M: Any, N: Any, K: Any, groups: Any) -> Any:
    """Achieved fraction of peak of a grouped GEMM: `groups` experts' M x N x K matmuls in one launch (a rank's
    local experts, M its rows per expert). Each expert's rows start a new row of output tiles, so tile
    quantisation is the expert's own (M and N padded to whole 128-tiles: DeepGEMM's contiguous layout aligns
    every expert's segment to the M block); the tiles of all the experts fill the SMs together, so wave
    quantisation counts groups x tiles; the short-reduction term is the expert's K. groups = 1 is
    gemm_shape_efficiency. Small experts pay where their N or K are short (Qwen3-30B-A3B: f_e 768), not for
    waves. Source: Gale et al. 2023 (MegaBlocks) §5 (all experts' blocks in one kernel); DeepGEMM README
    (m-grouped contiguous layout); NVIDIA Matrix Multiplication Background (tile and wave quantization).
    Derived: docs/formulas.md#compute.gemm"""
    if gpu.gemm_efficiency:  # a calibrated profile measured the curve by smallest dimension
        return gemm_efficiency(gpu, dtype, minimum(M, minimum(N, K)))
    tm, tn = np.ceil(np.maximum(M, 1) / TILE), np.ceil(np.maximum(N, 1) / TILE)
    tiles = tm * tn * groups
    tile_fill = np.maximum(M, 1) * np.maximum(N, 1) / (tm * tn * TILE * TILE)
    wave_fill = tiles / (np.ceil(tiles / gpu.sm_count) * gpu.sm_count)
    return gpu.max_gemm_fraction(dtype) * tile_fill * wave_fill * K / (K + gpu.gemm_k_half)


GEMM_OPERAND_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "mxfp8": 1.0 + 1 / 32, "fp4": 0.5 + 1 / 16}
"""Bytes per element of a GEMM operand in each tensor-core format, block scales included (MXFP8: an E8M0
scale per 32; NVFP4: an E4M3 scale per 16). Derived: docs/formulas.md#compute.gemm"""


def grouped_gemm_bytes(fmt: str, M: Any, N: Any, K: Any, groups: Any) -> Any:
    """HBM bytes of one grouped GEMM of `groups` experts: every expert's N x K weights and M x K inputs read in
    the format, its M x N output written in bf16. At a few rows per expert the weights dominate and the GEMM is
    bound by HBM, not by the tensor cores: a small expert batch runs far below peak (the roofline's memory
    side; Williams, Waterman and Patterson 2009, "Roofline"). Derived: docs/formulas.md#compute.gemm"""
    b = GEMM_OPERAND_BYTES.get(fmt, 2.0)
    return groups * (b * (N * K + M * K) + 2.0 * M * N)


def gemm_efficiency(gpu: GpuSpec, dtype: str, d_min: Any) -> Any:
    """Achieved fraction of peak for a GEMM whose smallest dimension is d_min (serving's decode and prefill
    steps; training uses gemm_shape_efficiency).

    Default curve e_max·d/(d + 512), e_max the best measured large-GEMM fraction (Stas Bekman, ml-engineering compute/accelerator/README.md:
    A100 0.87, H100 0.80); a calibrated profile's measured (d, efficiency) table replaces it (interpolated in
    log d). Derived: docs/formulas.md#compute.gemm"""
    if gpu.gemm_efficiency:
        d, e = zip(*sorted(gpu.gemm_efficiency))
        return np.interp(np.log(np.maximum(d_min, 1.0)), np.log(d), e)
    return gpu.max_gemm_fraction(dtype) * d_min / (d_min + GEMM_HALF_DIM)


@dataclass(frozen=True)
class LayerFlops(Breakdown):
    """Forward FLOPs of one layer for one micro-batch on one rank, by kind of work."""

    PARTS: ClassVar[tuple[str, ...]] = ("gemm", "attention")

    gemm: Any
    """Projections and MLP/expert matmuls."""
    attention: Any
    """QK^T and attention-over-V (the s² terms), as counted for MFU (no causal halving), and a hybrid's
    recurrent scans (linear in s)."""


def layer_flops(m: ModelSpec, plan: ParallelPlan, moe: bool) -> LayerFlops:
    """Forward FLOPs of one layer, one micro-batch, one rank: 2·tokens·weights for every matmul; attention
    4·b·s²·a·d (QK^T and AV). Source: Narayanan et al. 2021 Eq. 3 (per-layer 24bsh² + 4bs²h, MHA, 4h MLP),
    generalised to GQA, MLA, gated MLP and MoE (top-k experts). A hybrid stack's average layer (mixers.py)
    holds its share of attention, its mean recurrent mixer and scan, and, without experts, its share of
    dense MLP. Derived: docs/formulas.md#compute.flops, docs/formulas.md#mixers.hybrid"""
    s, b, t = plan.seq_len / plan.cp, plan.micro_batch, plan.tp
    T = s * b
    mlp: float
    if moe:
        mlp = m.num_experts_per_tok * expert_params(m) + m.hidden_size * m.num_experts + latent_proj_params(m)
        mlp = mlp + (mlp_params(m, m.shared_ffn) if m.shared_ffn else 0)
    else:
        mlp = dense_mlp_share(m) * mlp_params(m, m.intermediate_size)
    gemm = 2 * T * (attention_share(m) * attention_params(m) + mean_recurrent_params(m) + mlp) / t
    qk, v = attention_head_dims(m)
    keys = attention_keys(m, plan.seq_len)  # plan.seq_len where no layer has a sliding window
    attn = 2 * T * keys * m.num_attention_heads * (qk + v) / t  # local queries x all (window's) keys
    # DeepSeek Sparse Attention: the indexer scores every preceding key (counted as full causal attention is),
    # its heads whole on every TP rank (cost.sparse)
    index = T * plan.seq_len * indexer_flops_per_pair(m) * attention_share(m)
    return LayerFlops(gemm=gemm, attention=attn + T * mean_scan_flops(m) / t + index)


def attention_head_dims(m: ModelSpec) -> tuple[int, int]:
    """(query-key, value) head dimensions: MLA's nope + rope and v dims, else d_head for both."""
    if (mla := m.mla) is not None:
        return mla.qk_head_dim, mla.v_head_dim
    return m.d_head, m.d_head


def attention_groups(m: ModelSpec) -> tuple[tuple[str, int | None, int], ...]:
    """(kind, tokens a layer attends to at most, number of such layers) of the softmax-attention layers: full
    (None: all), sliding (the window; full when the model gives none) and chunked (the chunk). A hybrid's
    recurrent and mixer-less layers are not listed."""
    full = m.count_layers("full_attention") + (0 if m.sliding_window else m.count_layers("sliding_attention"))
    if m.is_sparse_attention:  # DeepSeek Sparse Attention: top-k keys of all the cached ones (cost.sparse)
        return (("sparse", m.index_topk, full),)
    groups = (("full", None, full), ("sliding", m.sliding_window, m.count_layers("sliding_attention")
                                    if m.sliding_window else 0),
              ("chunked", m.attention_chunk_size, m.count_layers("chunked_attention")))
    return tuple(g for g in groups if g[2])


def layer_windows(m: ModelSpec) -> tuple[tuple[int | None, int], ...]:
    """(tokens a layer attends to, number of such layers): the sliding window for the sliding-attention layers,
    the chunk for chunked ones, None (all) for the others; only the attention layers. Counted once, not listed
    per layer, so that a cost evaluated per pipeline stage stays linear in the stages (4,096 stages of a
    4,096-layer model took 41 s listing every layer per stage)."""
    return tuple((None if kind == "sparse" else w, n) for kind, w, n in attention_groups(m))  # sparse: caches all


def attention_keys(m: ModelSpec, s: Any) -> Any:
    """Keys per query counted in the attention FLOPs of a sequence of s tokens, averaged over the layers. A
    full causal layer counts s (MFU's count, no causal halving); a sliding-window layer of window w counts the
    same multiple of what its kernel computes: query i sees min(i, w) keys, on average w - w²/(2s) for w < s,
    so it counts 2w - w²/s (s when w >= s); a chunked layer of chunk c sees the keys of its own chunk, on
    average c/2, so it counts min(c, s); a layer without attention counts 0. Derived: docs/formulas.md#compute.flops"""
    groups = attention_groups(m)  # a sparse layer's k selected keys count as a window of k (cost.sparse)
    if all(w is None for _, w, _ in groups) and m.num_attention_layers == m.num_hidden_layers:
        return s
    s = np.asarray(s, dtype=float)
    counted = [n * (s if w is None else np.minimum(w, s) if kind == "chunked"
                    else np.where(w < s, 2.0 * w - w * w / s, s)) for kind, w, n in groups]
    return sum(counted, 0.0 * s) / m.num_hidden_layers


def logits_flops(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Output layer forward, one micro-batch, one rank: 2·s·b·h·V/t."""
    return 2 * plan.seq_len / plan.cp * plan.micro_batch * m.hidden_size * m.vocab_size / plan.tp


def model_flops_per_step(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Model FLOPs of one step over all GPUs: 3 x forward (backward = 2 x forward), no recompute.
    Source: Narayanan et al. 2021 Eq. 3 without its recompute pass; Korthikanti et al. 2022 §6 (MFU)."""
    per_rank_mb = (m.num_dense_layers * layer_flops(m, plan, False).total
                   + m.num_moe_layers * layer_flops(m, plan, True).total + logits_flops(m, plan))
    replicas_per_mb = plan.tp * plan.cp  # ranks that share one micro-batch
    return 3 * per_rank_mb * replicas_per_mb * plan.global_batch / plan.micro_batch


def recompute_flops_per_step(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Extra forward FLOPs recomputation adds over all GPUs: full recompute repeats the layers' forward,
    selective only the attention core (Korthikanti et al. 2022 §5), op every other matmul (op_recomputed_share)."""
    dense, moe = layer_flops(m, plan, False), layer_flops(m, plan, True)
    full = (m.num_dense_layers * dense.total + m.num_moe_layers * moe.total) * recomputed_share(
        plan, m.num_hidden_layers / plan.pp)
    core = where(plan.recomputes("core_attn"), m.num_dense_layers * dense.attention + m.num_moe_layers * moe.attention,
                 0.0) + m.num_dense_layers * module_recompute_flops(m, plan, False) \
        + m.num_moe_layers * module_recompute_flops(m, plan, True)
    op = (m.num_dense_layers * dense.gemm + m.num_moe_layers * moe.gemm) * op_recomputed_share(m)
    per_rank_mb = where(plan.full, full, where(plan.selective, core, where(plan.op, op, 0.0)))
    return per_rank_mb * plan.tp * plan.cp * plan.global_batch / plan.micro_batch


def attention_shapes(m: ModelSpec, t: Any) -> list[tuple[Any, Any]]:
    """(K, N) of each attention projection on one of t TP ranks: fused QKV and output (the rank's heads, at
    least one KV head), or MLA's query down/up, KV down (latent + rope key, replicated) and up, and output.
    Derived: docs/formulas.md#compute.gemm"""
    h, a_t = m.hidden_size, m.num_attention_heads / t
    if (mla := m.mla) is not None:
        nope, rope, v, kv_r, q_r = (mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim, mla.kv_lora_rank,
                                    mla.q_lora_rank)
        q = [(h, q_r), (q_r, a_t * (nope + rope))] if q_r else [(h, a_t * (nope + rope))]
        return q + [(h, kv_r + rope), (kv_r, a_t * (nope + v)), (a_t * v, h)]
    return [(h, (a_t + 2 * kv_heads_per_rank(m, t)) * m.d_head), (a_t * m.d_head, h)]


def layer_gemms(m: ModelSpec, plan: ParallelPlan, moe: bool) -> list[tuple[Any, Any, Any, Any, str]]:
    """(FLOPs, M, N, K, tp_role) of each matmul of one layer's forward on one rank, one micro-batch: the
    attention projections, the MLP (or the router, the rank's experts at their rows per expert, the shared
    experts). tp_role: "ag" for a column-parallel matmul whose input TP gathers (QKV, MLP up), "rs" for a
    row-parallel one whose output TP reduces (attention output, MLP down), "" for the rest.
    Derived: docs/formulas.md#compute.gemm"""
    s, b, h, t = plan.seq_len / plan.cp, plan.micro_batch, m.hidden_size, plan.tp
    T = s * b
    c = 2 if m.gated_mlp else 1
    shapes = attention_shapes(m, t)
    roles = ["ag", "rs"] if not m.is_mla else [""] * (len(shapes) - 1) + ["rs"]
    a_share = attention_share(m)  # a hybrid's average layer: its share of each mixer kind (mixers.py)
    out = [(2 * T * k * n * a_share, T, n, k, role) for (k, n), role in zip(shapes, roles)]
    out += [(2 * T * k * n * share, T, n, k, role)
            for (k, n, share), role in zip(recurrent_gemm_shapes(m, t), ["ag", "rs"] * 2)]
    dense_f = m.shared_ffn if moe else m.intermediate_size
    f_share = 1.0 if moe else dense_mlp_share(m)
    if dense_f and f_share:
        out += [(2 * T * h * c * dense_f / t * f_share, T, c * dense_f / t, h, "ag"),
                (2 * T * dense_f / t * h * f_share, T, h, dense_f / t, "rs")]
    if moe:
        etp, f_e, k_top, w = plan.etp_resolved, m.expert_ffn, m.num_experts_per_tok, m.expert_width
        # Rows per local expert (padded to capacity when a capacity factor is set).
        rows = T / where(plan.sp, t, 1) * k_top * etp * plan.ep / m.num_experts * plan.expert_padding
        routed = 2 * T * k_top * (c + 1) * w * f_e / t  # the experts read and write the expert width w
        out += [(routed * c / (c + 1), rows, c * f_e / etp, w, ""), (routed / (c + 1), rows, w, f_e / etp, ""),
                (2 * T * h * m.num_experts / t, T, m.num_experts, h, "")]
        if m.moe_latent_size:  # a latent MoE's h -> l and l -> h projections, replicated across TP
            out += [(2 * T * h * w / t, T, w, h, ""), (2 * T * w * h / t, T, h, w, "")]
    return out


TE_PIPELINE_SPLITS = 4  # Transformer Engine's default num_splits for its "pipeline" GEMM + reduce-scatter overlap


def chunk_rows(plan: ParallelPlan, M: Any, role: str) -> tuple[Any, Any]:
    """Rows of each GEMM call in the forward and in the backward's input-gradient matmul when chunked TP
    overlap (tp_comm_overlap with sp) splits a matmul beside its collective; the weight-gradient matmul
    always runs whole. Megatron-LM (Transformer Engine userbuffers, default methods): ring exchange, one
    chunk per TP rank, for the forward of "ag" matmuls and the input gradient of "rs" ones; the forward
    "rs" reduce-scatter in TE_PIPELINE_SPLITS chunks; the "ag" input gradients overlap in bulk (whole).
    DTensor async TP splits every gathered and reduce-scattered matmul per rank, in both passes.
    Source: Transformer Engine v1.8, pytorch/module/base.py initialize_ub (methods and num_splits);
    PyTorch symmetric_memory fused_all_gather_matmul / fused_matmul_reduce_scatter. Derived:
    docs/formulas.md#compute.gemm"""
    if not role or not plan.tp_comm_overlap:  # a workload switch: one value for all plans of a search
        return M, M
    dtensor = plan.tp_impl == "dtensor"  # likewise
    per_rank = M / plan.tp
    fwd = per_rank if role == "ag" or dtensor else M / TE_PIPELINE_SPLITS
    dgrad = per_rank if role == "rs" or dtensor else None  # None: the bulk-overlapped call runs whole
    return where(plan.sp, fwd, M), (M if dgrad is None else where(plan.sp, dgrad, M))


def layer_gemm_seconds(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec, moe: bool) -> tuple[Any, Any]:
    """(forward, backward) time of one layer's GEMMs: its GEMM FLOPs (layer_flops) at the FLOP-weighted
    harmonic mean of the efficiencies of its own matmuls, in the recipe's format (NVFP4 keeps a share of the
    layers in bf16: the average layer mixes both). The backward is an input-gradient and a weight-gradient
    matmul of the forward's FLOPs each, priced at the forward's shape except where chunked TP overlap splits
    the call (chunk_rows). Derived: docs/formulas.md#compute.gemm, docs/formulas.md#precision"""
    gemms = layer_gemms(m, plan, moe)
    total = sum(g[0] for g in gemms)
    flops = layer_flops(m, plan, moe).gemm

    # The two expert matmuls (entries 1-2 from the end of a MoE layer's list; the router is last) run as one
    # grouped GEMM over the rank's E/ep experts, and the most-loaded rank computes routing_imbalance x the
    # mean routed rows (capacity padding: the factor).
    experts = (len(gemms) - 3, len(gemms) - 2) if moe else ()
    load = routing_imbalance(m, plan) if moe else 1.0
    pad = [load if i in experts else 1.0 for i in range(len(gemms))]
    groups = [m.num_experts / plan.ep if i in experts else 1 for i in range(len(gemms))]
    split = bool(plan.tp_comm_overlap and np.any(plan.sp))  # skip the piece shapes when no plan chunks

    def seconds(fmt: str) -> tuple[Any, Any]:
        fwd = bwd = 0.0
        # (a hybrid's layer variant without mixer or MLP has no matmul: cost.hybrid_stage)
        scale = where(total > 0, flops / where(total > 0, total, 1.0), 0.0) / gpu.sustained_flops(fmt)
        for i, ((f, M, N, K, role), x, g) in enumerate(zip(gemms, pad, groups)):
            whole = f * x / grouped_gemm_efficiency(gpu, fmt, M, N, K, g) * scale
            if i in experts:  # few rows per expert: the weights' reads, not the tensor cores, set the time
                whole = maximum(whole, grouped_gemm_bytes(fmt, M * x, N, K, g) / (gpu.hbm_bytes_per_s * gpu.hbm_efficiency))
            if split and role:
                f_rows, d_rows = chunk_rows(plan, M, role)
                fwd = fwd + f * x / gemm_shape_efficiency(gpu, fmt, f_rows, N, K) * scale
                dgrad = whole if d_rows is M else f * x / gemm_shape_efficiency(gpu, fmt, d_rows, N, K) * scale
                bwd = bwd + dgrad + whole
            else:
                fwd, bwd = fwd + whole, bwd + 2 * whole
        return fwd, bwd

    share = plan.low_precision_layer_fraction
    low = seconds(plan.gemm_format)
    if share == 1.0:
        return low
    high = seconds("bf16")
    return share * low[0] + (1 - share) * high[0], share * low[1] + (1 - share) * high[1]


def elementwise_bytes(m: ModelSpec, plan: ParallelPlan, moe: bool, fp8_tn_only: bool = False) -> Any:
    """HBM traffic of one layer's memory-bound operators in forward, one micro-batch, one rank: norms
    (read + write 2h each), residual adds (read 4h, write 2h each), rotary on q and k, the MLP activation
    (gated: read 2f, write f; GELU: read f, write f), an MoE layer's routing and permutes (moe_routing_bytes)
    and, without fused attention, the softmax and dropout over the scores (4 bytes per score, 9 with attention
    dropout). Derived: docs/formulas.md#compute.memory_bound"""
    s, b, h, t = plan.seq_len / plan.cp, plan.micro_batch, m.hidden_size, plan.tp
    T = s * b
    sp = where(plan.sp, t, 1)
    # Unfused (fused_kernels False): a norm reads its input twice and writes and re-reads the normalised tensor
    # before scaling (3x the fused traffic); rotary reads cos / sin and makes two more passes (3x).
    unfused = where(plan.fused_kernels, 1, 3)
    norms_residual = (8 * unfused + 12) * T * h / sp * norms_per_layer(m) / 2  # a norm and an add per sub-block
    rope = 0 if m.learned_position_embeddings else 4 * unfused * T * m.d_head * (
        m.num_attention_heads / t + kv_heads_per_rank(m, t)) * attention_share(m)
    f = m.expert_ffn * m.num_experts_per_tok + m.shared_ffn if moe else m.intermediate_size * dense_mlp_share(m)
    act = (6 if m.gated_mlp else 4) * T * f / t
    per_score = 9 if m.attention_dropout > 0 else 4  # softmax read + write, and dropout's read, mask and write
    scores = where(plan.flash_attention, 0.0, per_score * m.num_attention_heads * s * T / t)
    routing = moe_routing_bytes(m) * T / sp if moe else 0.0
    recurrent = mean_recurrent_memory_bytes(m) * T / t  # a hybrid's convolutions, scans and gated norms
    return norms_residual + rope + act + scores + routing + recurrent + fp8_cast_bytes(m, plan, moe, fp8_tn_only)


def moe_routing_bytes(m: ModelSpec) -> float:
    """HBM bytes per token of one MoE layer's routing, forward, in 16 bits: the router's fp32 scores over the
    E experts (softmax and top-k: read and write 8E) and the permute of the token into its k expert copies
    and back (read and write the k copies each way: 8kh; h the latent width of a latent MoE). Training and serving alike.
    Derived: docs/formulas.md#compute.memory_bound"""
    return 8.0 * m.num_experts + 8.0 * m.num_experts_per_tok * m.expert_width


CAST_BYTES = {"tensorwise": 3.0, "rowwise": 3.0, "blockwise": 3.0 + 4 / 128, "mxfp8": 4.0 + 2 / 32,
              "nvfp4": 5.0 + 2 / 16}
"""HBM bytes per element of a GEMM input to quantise it: read 2 (bf16) and write the low-precision copies
with their scales: one fp8 copy (per-tensor, rowwise; blockwise + an fp32 scale per 128); MXFP8 a rowwise
and a columnwise copy (the wgrad operand) with an E8M0 scale per 32 each; NVFP4 two 4-bit copies with an
E4M3 scale per 16, plus the random Hadamard transform's read and write of the wgrad operand (2 + 2).
Derived: docs/formulas.md#precision (Transformer Engine / torchao recipe documentation)."""


def fp8_cast_bytes(m: ModelSpec, plan: ParallelPlan, moe: bool, fp8_tn_only: bool = False) -> Any:
    """fp8 training casts every GEMM input to fp8 before the GEMM (read 2 bytes, write 1, plus the amax
    reduction it fuses): the QKV, output-projection, fc1 and fc2 inputs in forward; backward casts the output
    gradients likewise (stage_compute counts backward traffic as twice the forward). Weights are cast once
    per step and left out. On a GPU whose FP8 GEMMs take only the TN layout (Hopper) the per-tensor and
    blockwise casts also write the transposed copy (one byte more per element). Source: Transformer Engine
    fp8 primer (per-tensor scaling, cast before each GEMM); cuBLASLt FP8 TN requirement and Transformer
    Engine's column-wise data (common/gemm/cublaslt_gemm.cu). Derived: docs/formulas.md#compute.memory_bound"""
    if not plan.low_precision:
        return 0.0
    s, b, h, t = plan.seq_len / plan.cp, plan.micro_batch, m.hidden_size, plan.tp
    f = (m.expert_ffn * m.num_experts_per_tok + m.shared_ffn) if moe else m.intermediate_size
    d_v = attention_head_dims(m)[1]
    transposed = 1.0 if fp8_tn_only and plan.recipe in ("tensorwise", "blockwise") else 0.0
    per_element = (CAST_BYTES[plan.recipe] + transposed) * plan.low_precision_layer_fraction
    return per_element * s * b * (2 * h + (m.num_attention_heads * d_v + f) / t)


def op_matmul_widths(m: ModelSpec) -> list[tuple[int, int]]:
    """(K, N) of a dense layer's matmuls in the order torchtitan's modules run them: wq, wk, wv, wo, then w1,
    w3, w2 (gated MLP: w2(silu(w1(x)) * w3(x))) or w1, w2. Source: torchtitan models/common attention.py and
    feed_forward.py (release 0.3.0)."""
    h, a, K, d, f = m.hidden_size, m.num_attention_heads, m.kv_heads, m.d_head, m.intermediate_size
    mlp = [(h, f), (h, f), (f, h)] if m.gated_mlp else [(h, f), (f, h)]
    return [(h, a * d), (h, K * d), (h, K * d), (a * d, h)] + mlp


def module_recompute_flops(m: ModelSpec, plan: ParallelPlan, moe: bool) -> Any:
    """Forward matmul FLOPs (one layer, micro-batch and rank) that Megatron's selective recompute_modules run
    again in backward: mla_up_proj MLA's Q and KV up-projections, mlp a dense layer's MLP, moe an MoE
    layer's router, experts and shared experts, shared_experts the shared MLP (2·tokens·weights each, as
    layer_flops); layernorm, moe_act and core_attn add no matmul (core_attn's attention pass is counted with
    the attention). Source: Megatron-LM transformer_config.py recompute_modules.
    Derived: docs/formulas.md#mem.recompute_modules"""
    if not plan.recompute_modules:
        return 0.0
    T, t = plan.seq_len / plan.cp * plan.micro_batch, plan.tp
    up = 0.0
    if (mla := m.mla) is not None:
        a, nope, rope, v = m.num_attention_heads, mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim
        up = where(plan.recomputes("mla_up_proj"), 2 * T * (mla.q_rank * a * (nope + rope)
                                                              + mla.kv_lora_rank * a * (nope + v)) / t, 0.0)
    if not moe:
        mlp = 2 * T * mlp_params(m, m.intermediate_size) * dense_mlp_share(m) / t
        return up + where(plan.recomputes("mlp"), mlp, 0.0)
    shared = 2 * T * mlp_params(m, m.shared_ffn) / t if m.shared_ffn else 0.0
    whole = 2 * T * (m.num_experts_per_tok * expert_params(m) + m.hidden_size * m.num_experts
                     + latent_proj_params(m)) / t + shared
    return up + where(plan.recomputes("moe"), whole, where(plan.recomputes("shared_experts"), shared, 0.0))


def op_recomputed_share(m: ModelSpec) -> float:
    """Share of a dense layer's forward matmul FLOPs that op-level checkpointing recomputes: the layer's
    second, fourth, ... matmul (Llama: wk, wo, w3). Source: torchtitan 0.3.0 distributed/activation_checkpoint.py
    (SelectiveAC saves the compute-intensive ops' outputs except every second mm). Derived:
    docs/formulas.md#compute.time"""
    widths = op_matmul_widths(m)
    return sum(k * n for i, (k, n) in enumerate(widths) if i % 2 == 1) / sum(k * n for k, n in widths)


@dataclass(frozen=True)
class StageCompute(Breakdown):
    """Compute time of one micro-batch on one pipeline stage (forward + backward, recompute included);
    gemm + attention + memory_bound = total."""

    PARTS: ClassVar[tuple[str, ...]] = ("gemm", "attention", "memory_bound")

    gemm: Any
    attention: Any
    memory_bound: Any
    forward: Any
    """Forward part of the total (for overlap windows)."""


def stage_compute(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec, n_dense: Any, n_moe: Any,
                  last: Any) -> StageCompute:
    """Time of one micro-batch's forward and backward on a stage of n_dense + n_moe layers (plus the output
    layer when `last`): backward = 2 x forward; full recompute adds a forward of the layers, selective a
    forward of the attention core, op a forward of every other matmul and of the memory-bound operators.
    Derived: docs/formulas.md#compute.time"""
    per_layer = {moe: layer_seconds(m, plan, gpu, moe) for moe in ((False, True) if m.is_moe else (False,))}
    r = recomputed_share(plan, n_dense + n_moe)  # 1 under full recompute of every layer
    op = where(plan.op, 1.0, 0.0)  # op-level checkpointing: every other matmul and the memory-bound ops again
    q = op * op_recomputed_share(m)
    passes = 3 + r + op
    core = plan.recomputes("core_attn")
    attn_passes = 3 + (where(plan.full | core, 1, 0) if plan.recompute_layers is None else where(core, 1, r))
    gemm = attention = membound = fwd = 0.0
    for n, moe in ((n_dense, False), (n_moe, True)):
        if moe not in per_layer:
            continue
        (g1, g_back), a1, mb1 = per_layer[moe]
        # Selective recompute_modules: the share of the layer's forward matmuls they run again.
        # (a layer without matmuls, as a hybrid's mixer-only variants in cost.hybrid_stage price it: none)
        layer_gemm = layer_flops(m, plan, moe).gemm
        modules = (where(layer_gemm > 0, module_recompute_flops(m, plan, moe) / maximum(layer_gemm, 1.0), 0.0)
                   if plan.recompute_modules else 0.0)
        gemm = gemm + n * (g1 * (1 + r + q + modules) + g_back)
        attention = attention + n * a1 * attn_passes
        membound = membound + n * mb1 * passes
        fwd = fwd + n * (g1 + a1 + mb1)
    head, loss_s = output_seconds(m, plan, gpu)
    out, loss = where(last, head, 0.0), where(last, loss_s, 0.0)
    return StageCompute(gemm=gemm + 3 * out, attention=attention, memory_bound=membound + loss,
                        forward=fwd + out + loss / 3)


def layer_seconds(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec, moe: bool) -> tuple[Any, Any, Any]:
    """(GEMM, attention, memory-bound) forward seconds of one layer and micro-batch: the same on every stage,
    so computed once per plan arrays."""
    def compute() -> tuple[Any, Any, Any]:
        peak_attn = gpu.sustained_flops("bf16" if plan.low_precision else plan.dtype) * attention_fraction(gpu, plan, m)
        # Without a grouped GEMM every local expert's two matmuls are separate launches.
        launches = where(plan.fused_kernels, 0.0, 2 * m.num_experts / plan.ep * KERNEL_LAUNCH_S) if moe else 0.0
        return (layer_gemm_seconds(m, plan, gpu, moe), layer_flops(m, plan, moe).attention / peak_attn,
                elementwise_bytes(m, plan, moe, gpu.fp8_tn_only) / (gpu.hbm_bytes_per_s * gpu.hbm_efficiency)
                + launches)
    return memoized(plan, ("layer_seconds", m, gpu, moe), compute)


def attended_keys(m: ModelSpec, keys: Any) -> Any:
    """Keys a query attends to, averaged over the layers, when `keys` precede it: min(keys, w) on a
    sliding-window layer, at most the chunk on a chunked one, none on a layer without attention (serving's
    prefill and decode). Derived: docs/formulas.md#compute.flops"""
    windows = tuple((w, n) for _, w, n in attention_groups(m))  # a sparse layer attends to its top k
    if all(w is None for w, _ in windows) and m.num_attention_layers == m.num_hidden_layers:
        return keys
    return sum(n * (keys if w is None else np.minimum(keys, w)) for w, n in windows) / m.num_hidden_layers


def attention_fraction(gpu: GpuSpec, plan: ParallelPlan, m: ModelSpec) -> Any:
    """Achieved fraction of the sustained peak on the attention-score FLOPs: the GPU's fused-kernel efficiency,
    times FlashAttention-2's ratio to the native kernel when the plan runs FA2 (unfused attention is priced
    by its score traffic in elementwise_bytes), times the GPU's softmax (exp-rate) ratio, times the fused
    kernel's rate at the model's head dimension (head_dim_attention_ratio). Source: Shah et al.
    2024 (FlashAttention-3), abstract; NVIDIA, "Making Softmax More Efficient with NVIDIA Blackwell Ultra".
    Derived: docs/formulas.md#compute.attention"""
    flash2 = plan.attention_kernel == "flash2"
    ratio = gpu.flash2_attention_ratio if flash2 else 1.0
    d0 = gpu.flash2_softmax_head_dim if flash2 else gpu.attention_softmax_head_dim
    head = where(plan.flash_attention, head_dim_attention_ratio(m, d0), 1.0)
    return gpu.attention_efficiency * ratio * gpu.softmax_attention_ratio * head


def head_dim_attention_ratio(m: ModelSpec, d0: float) -> float:
    """A fused attention kernel's rate at the model's head dimension d relative to d = 128 (where
    attention_efficiency is fitted). Per (query, key) pair the kernel does 4d matmul FLOPs and a fixed amount
    of softmax work (the exponential on the special-function units, the scale, max and sum), so its rate
    goes as d / (d + d0), d0 the head dimension at which the two take as long. MLA's d is the mean of its
    query-key and value dims. Source: Shah et al. 2024 (FlashAttention-3), Figures 5-6 (H100, 4k tokens:
    head dim 64 runs forward + backward at 0.79x (cuDNN), 0.81x (FA3), 0.89x (FA2) of head dim 128).
    Derived: docs/formulas.md#compute.attention"""
    qk, v = attention_head_dims(m)
    d = (qk + v) / 2
    return (d / (d + d0)) / (128 / (128 + d0))


def output_seconds(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec) -> tuple[Any, Any]:
    """(output-layer GEMM, loss) seconds of one micro-batch on the last stage (once more per MTP module). The
    output layer stays in bf16 under every low-precision recipe (Megatron-Core's fp8 autocast covers the
    decoder layers only; torchtitan's float8 / MX converters skip the output layer)."""
    def compute() -> tuple[Any, Any]:
        s, b = plan.seq_len / plan.cp, plan.micro_batch
        fmt = "bf16" if plan.low_precision else plan.dtype
        eff = gemm_shape_efficiency(gpu, fmt, s * b, padded_vocab(m.vocab_size, plan.tp) / plan.tp, m.hidden_size)
        heads = 1 + m.num_nextn_predict_layers  # multi-token prediction runs the output head once more per module
        return (heads * logits_flops(m, plan) / (gpu.sustained_flops(fmt) * eff),
                heads * loss_bytes(m, plan) / (gpu.hbm_bytes_per_s * gpu.hbm_efficiency))
    return memoized(plan, ("output_seconds", m, gpu), compute)


def loss_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """HBM traffic of the output layer's loss, forward and backward, one micro-batch, one rank: the logits
    written in bf16, read and turned into fp32 softmax, read again for the loss and the gradient, and the
    gradient written: about 16 bytes per logit. Derived: docs/formulas.md#compute.memory_bound"""
    return 16 * plan.seq_len / plan.cp * plan.micro_batch * padded_vocab(m.vocab_size, plan.tp) / plan.tp


def optimizer_step_seconds(params_on_rank: Any, plan: ParallelPlan, gpu: GpuSpec, expert_on_rank: Any = 0.0) -> Any:
    """Gradient clipping and the Adam update, memory-bound: read the gradients for their norm, read and write
    them to scale them; read fp32 master, moments and the gradient, write them back and the bf16 copy:
    (2 x optimizer bytes + 4 x gradient + weight) per parameter of the rank's optimizer shard. The rank's
    `expert_on_rank` routed-expert parameters are sharded over the expert data-parallel group,
    world / (etp x ep x pp) ranks (as cost.memory.stage_memory), the rest over dp x cp.
    Source: Megatron-LM megatron/core/parallel_state.py (expert data-parallel group).
    Derived: docs/formulas.md#compute.optimizer"""
    per_param = 2 * plan.optimizer_bytes + 4 * plan.grad_bytes + plan.weight_bytes
    sharded = where(plan.zero >= 1, (params_on_rank - expert_on_rank) / plan.zero_shard + expert_on_rank / plan.expert_dp,
                    params_on_rank)
    return sharded * per_param / (gpu.hbm_bytes_per_s * gpu.hbm_efficiency)
