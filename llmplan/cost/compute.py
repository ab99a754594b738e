"""FLOPs and compute time: model and hardware FLOPs per step, GEMM time from peak x a shape-dependent
efficiency, memory-bound operators from HBM bandwidth, and the optimizer step.

Works on one ParallelPlan and, elementwise, on plan arrays (see cost/arith.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from llmplan.cost.arith import minimum, where
from llmplan.cost.breakdown import Breakdown
from llmplan.cost.params import attention_params, kv_heads_per_rank, mlp_params, padded_vocab
from llmplan.specs.hardware import GpuSpec
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan

GEMM_HALF_DIM = 512.0  # default curve: efficiency reaches half its best when the smallest GEMM dimension is 512


def gemm_efficiency(gpu: GpuSpec, dtype: str, d_min: Any) -> Any:
    """Achieved fraction of peak for a GEMM whose smallest dimension is d_min.

    Default curve e_max·d/(d + 512), e_max the best measured large-GEMM fraction (reference/formats.md C1:
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
    """QK^T and attention-over-V (the s² terms), as counted for MFU (no causal halving)."""


def layer_flops(m: ModelSpec, plan: ParallelPlan, moe: bool) -> LayerFlops:
    """Forward FLOPs of one layer, one micro-batch, one rank: 2·tokens·weights for every matmul; attention
    4·b·s²·a·d (QK^T and AV). Source: Narayanan et al. 2021 Eq. 3 (per-layer 24bsh² + 4bs²h, MHA, 4h MLP),
    generalised to GQA, MLA, gated MLP and MoE (top-k experts). Derived: docs/formulas.md#compute.flops"""
    s, b, t = plan.seq_len / plan.cp, plan.micro_batch, plan.tp
    T = s * b
    if moe:
        mlp = m.num_experts_per_tok * mlp_params(m, m.expert_ffn) + m.hidden_size * m.num_experts
        mlp = mlp + (mlp_params(m, m.shared_ffn) if m.shared_ffn else 0)
    else:
        mlp = mlp_params(m, m.intermediate_size)
    gemm = 2 * T * (attention_params(m) + mlp) / t
    if m.is_mla:
        qk, v = m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim
    else:
        qk = v = m.d_head
    attn = 2 * T * plan.seq_len * m.num_attention_heads * (qk + v) / t  # local queries x all keys
    return LayerFlops(gemm=gemm, attention=attn)


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
    selective only the attention core (Korthikanti et al. 2022 §5)."""
    dense, moe = layer_flops(m, plan, False), layer_flops(m, plan, True)
    full = m.num_dense_layers * dense.total + m.num_moe_layers * moe.total
    core = m.num_dense_layers * dense.attention + m.num_moe_layers * moe.attention
    per_rank_mb = where(plan.full, full, where(plan.selective, core, 0.0))
    return per_rank_mb * plan.tp * plan.cp * plan.global_batch / plan.micro_batch


def _gemm_dims(m: ModelSpec, plan: ParallelPlan, moe: bool) -> Any:
    """Smallest GEMM dimension of a layer's matmuls on one rank (tokens, output width or reduction)."""
    s, b, t = plan.seq_len / plan.cp, plan.micro_batch, plan.tp
    T = s * b
    heads = m.num_attention_heads / t * m.d_head
    d = minimum(T, minimum(m.hidden_size, heads))
    if not moe:
        return minimum(d, m.intermediate_size / t)
    etp = plan.etp_resolved
    rows = T / where(plan.sp, t, 1) * m.num_experts_per_tok * etp * plan.ep / m.num_experts
    return minimum(d, minimum(rows, m.expert_ffn / etp))


def elementwise_bytes(m: ModelSpec, plan: ParallelPlan, moe: bool) -> Any:
    """HBM traffic of one layer's memory-bound operators in forward, one micro-batch, one rank: norms
    (read + write 2h each), residual adds (read 4h, write 2h each), rotary on q and k, the MLP activation
    (gated: read 2f, write f; GELU: read f, write f) and, without fused attention, the softmax and dropout
    over the scores (4 bytes per score, 9 with attention dropout). Derived: docs/formulas.md#compute.memory_bound"""
    s, b, h, t = plan.seq_len / plan.cp, plan.micro_batch, m.hidden_size, plan.tp
    T = s * b
    sp = where(plan.sp, t, 1)
    norms_residual = (8 + 12) * T * h / sp
    rope = 0 if m.learned_position_embeddings else 4 * T * m.d_head * (m.num_attention_heads / t + kv_heads_per_rank(m, t))
    f = m.expert_ffn * m.num_experts_per_tok + m.shared_ffn if moe else m.intermediate_size
    act = (6 if m.gated_mlp else 4) * T * f / t
    per_score = 9 if m.attention_dropout > 0 else 4  # softmax read + write, and dropout's read, mask and write
    scores = where(plan.flash_attention, 0.0, per_score * m.num_attention_heads * s * T / t)
    return norms_residual + rope + act + scores


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
    forward of the attention core. Derived: docs/formulas.md#compute.time"""
    peak = gpu.peak_flops(plan.dtype)
    peak_attn = gpu.peak_flops("bf16" if plan.dtype == "fp8" else plan.dtype) * gpu.attention_efficiency
    passes = 3 + where(plan.full, 1, 0)
    attn_passes = 3 + where(plan.full | plan.selective, 1, 0)
    gemm = attention = membound = fwd = 0.0
    for n, moe in ((n_dense, False), (n_moe, True)):
        if moe and not m.is_moe:
            continue
        fl = layer_flops(m, plan, moe)
        g1 = fl.gemm / (peak * gemm_efficiency(gpu, plan.dtype, _gemm_dims(m, plan, moe)))
        a1 = fl.attention / peak_attn
        mb1 = elementwise_bytes(m, plan, moe) / gpu.hbm_bytes_per_s
        gemm = gemm + n * g1 * passes
        attention = attention + n * a1 * attn_passes
        membound = membound + n * mb1 * passes
        fwd = fwd + n * (g1 + a1 + mb1)
    s, b = plan.seq_len / plan.cp, plan.micro_batch
    d_logits = minimum(s * b, minimum(m.hidden_size, padded_vocab(m.vocab_size, plan.tp) / plan.tp))
    out = where(last, logits_flops(m, plan) / (peak * gemm_efficiency(gpu, plan.dtype, d_logits)), 0.0)
    loss = where(last, loss_bytes(m, plan) / gpu.hbm_bytes_per_s, 0.0)
    return StageCompute(gemm=gemm + 3 * out, attention=attention, memory_bound=membound + loss,
                        forward=fwd + out + loss / 3)


def loss_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """HBM traffic of the output layer's loss, forward and backward, one micro-batch, one rank: the logits
    written in bf16, read and turned into fp32 softmax, read again for the loss and the gradient, and the
    gradient written: about 16 bytes per logit. Derived: docs/formulas.md#compute.memory_bound"""
    return 16 * plan.seq_len / plan.cp * plan.micro_batch * padded_vocab(m.vocab_size, plan.tp) / plan.tp


def optimizer_step_seconds(params_on_rank: Any, plan: ParallelPlan, gpu: GpuSpec) -> Any:
    """Adam update, memory-bound: read fp32 master, moments and the gradient, write them back and the bf16
    copy: (2 x optimizer bytes + gradient + weight) per parameter of the rank's optimizer shard.
    Derived: docs/formulas.md#compute.optimizer"""
    per_param = 2 * plan.optimizer_bytes + plan.grad_bytes + plan.weight_bytes
    shard = where(plan.zero >= 1, plan.zero_shard, 1)
    return params_on_rank * per_param / shard / gpu.hbm_bytes_per_s
