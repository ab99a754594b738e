"""FLOPs: a layer's forward FLOPs by kind of work (matmuls, attention scores, recurrent scans), the keys a
query attends to (full, sliding-window, chunked, sparse attention), the model and recompute FLOPs of a step,
and the matmuls selective and op-level recompute run again.

Works on one ParallelPlan and, elementwise, on plan arrays (see llmplan/arith.py). Split out of cost.compute,
which re-exports its names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from llmplan.arith import where
from llmplan.cost.breakdown import Breakdown
from llmplan.cost.memo import memoized
from llmplan.cost.compressed import (
    attended_compressed_keys,
    compressed_keys,
    hc_params,
    indexer_scores_per_token,
    replicated_layer_params,
)
from llmplan.cost.mixers import (
    attention_share,
    dense_mlp_share,
    mean_recurrent_params,
    mean_scan_flops,
)
from llmplan.cost.params import (
    attention_params,
    expert_params,
    latent_proj_params,
    mlp_params,
)
from llmplan.cost.sparse import indexer_flops_per_pair, indexer_params
from llmplan.cost.stages import recomputed_share
from llmplan.cost.windows import window_key_count
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan


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
    dense MLP. Computed once per plan, model and kind (cost.memo.memoized: the step time reads it for every
    candidate stage and TP role). Derived: docs/formulas.md#compute.flops, docs/formulas.md#mixers.hybrid"""
    return memoized(plan, ("layer_flops", m, moe), lambda: _layer_flops(m, plan, moe))


def _layer_flops(m: ModelSpec, plan: ParallelPlan, moe: bool) -> LayerFlops:
    """layer_flops, computed. Derived: docs/formulas.md#compute.flops"""
    s, b, t = plan.seq_len / plan.cp, plan.micro_batch, plan.tp
    T = s * b
    mlp: float
    if moe:  # the router, the latent projections and the shared experts; the routed experts below
        mlp = m.hidden_size * m.num_experts + latent_proj_params(m)
        mlp = mlp + (mlp_params(m, m.shared_ffn) if m.shared_ffn else 0)
    else:
        mlp = dense_mlp_share(m) * mlp_params(m, m.intermediate_size)
    # DeepSeek-V3.2's indexer projections (inside attention_params) run whole on every TP rank (dsa.py
    # parallel_mode "duplicated"): taken out of the TP-split attention, added back undivided
    dsa = indexer_params(m) if m.is_dsa else 0
    gemm = 2 * T * (attention_share(m) * (attention_params(m) - dsa) + mean_recurrent_params(m) + mlp) / t
    if moe:
        gemm = gemm + routed_expert_flops(m, plan)
    # DeepSeek-V4: the mean layer's compressors and indexer and its two hyper-connection projections, whole on
    # every TP rank (cost.compressed); DeepSeek-V3.2's indexer projections likewise
    gemm = gemm + 2 * T * (replicated_layer_params(m) + attention_share(m) * dsa)
    keys = attention_keys(m, plan.seq_len)  # plan.seq_len where no layer has a sliding window
    attn = attention_score_flops(m, plan, keys)  # local queries x all (window's) keys
    # DeepSeek Sparse Attention: the indexer scores every preceding key (counted as full causal attention is),
    # its heads whole on every TP rank (cost.sparse)
    index = T * plan.seq_len * indexer_flops_per_pair(m) * attention_share(m) if m.is_dsa else \
        T * indexer_scores_per_token(m, plan.seq_len) / m.num_hidden_layers  # DeepSeek-V4's CSA indexers
    return LayerFlops(gemm=gemm, attention=attn + T * mean_scan_flops(m) / t + index)


def recurrent_scan_flops(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Forward FLOPs of the average layer's recurrent-mixer scans (Mamba-2 SSD, Gated DeltaNet, lightning), one
    micro-batch, one rank: the part of layer_flops(...).attention outside the softmax-attention core, which
    Megatron's core_attn recompute does not run again (it checkpoints Attention's core_attention only; the
    Mamba-2 and Gated DeltaNet mixers are not Attention modules). Source: NVIDIA/Megatron-LM at d98e8a6,
    megatron/core/transformer/attention.py (checkpoint_core_attention, _checkpointed_attention_forward),
    megatron/core/ssm/mamba_mixer.py, megatron/core/ssm/gated_delta_net/common.py (_GDNBase).
    Derived: docs/formulas.md#compute.core_attn_recompute"""
    return plan.seq_len / plan.cp * plan.micro_batch * mean_scan_flops(m) / plan.tp


def core_attention_flops(m: ModelSpec, plan: ParallelPlan, moe: bool) -> Any:
    """Forward FLOPs of one layer's attention core, one micro-batch, one rank: layer_flops(...).attention less the
    recurrent scans (recurrent_scan_flops): the softmax attention (full, sliding, chunked, MLA, sparse, with its
    indexer, which Megatron's DSA core attention holds). What core_attn recompute runs again.
    Derived: docs/formulas.md#compute.core_attn_recompute"""
    return layer_flops(m, plan, moe).attention - recurrent_scan_flops(m, plan)


def routed_expert_flops(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Forward FLOPs of one MoE layer's routed experts, one micro-batch, one rank: 2·T·k·expert_params / t, T the
    rank's s·b tokens, each through k experts (2·tokens·weights per matmul, as layer_flops counts every matmul).
    Source: Narayanan et al. 2021 Eq. 3 (2 FLOPs per weight per token), top-k routing as in Shazeer et al. 2017.
    Derived: docs/formulas.md#compute.flops"""
    T = plan.seq_len / plan.cp * plan.micro_batch
    return 2 * T * m.num_experts_per_tok * expert_params(m) / plan.tp



def attention_score_flops(m: ModelSpec, plan: ParallelPlan, keys: Any) -> Any:
    """Forward FLOPs of QK^T and AV, one layer, one micro-batch, one rank, when each of the rank's s·b queries
    counts `keys` keys (attention_keys, or a part of it): 2·s·b·keys·a·(d_qk + d_v)/t. Source: Narayanan et al.
    2021 Eq. 3 (the 4bs²h term). Derived: docs/formulas.md#compute.flops"""
    qk, v = attention_head_dims(m)
    T = plan.seq_len / plan.cp * plan.micro_batch
    return 2 * T * keys * m.num_attention_heads * (qk + v) / plan.tp

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
    if m.is_dsa:  # DeepSeek Sparse Attention: top-k keys of all the cached ones (cost.sparse)
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
    full causal layer counts s (MFU's count, no causal halving); a sliding-window layer of window w counts
    window_key_count(w, s); a chunked layer of chunk c sees the keys of its own chunk, on
    average c/2, so it counts min(c, s); a layer without attention counts 0. Derived: docs/formulas.md#compute.flops"""
    groups = attention_groups(m)  # a sparse layer's k selected keys count as a window of k (cost.sparse)
    if all(w is None for _, w, _ in groups) and m.num_attention_layers == m.num_hidden_layers \
            and not m.compressed_layers:
        return s
    s = np.asarray(s, dtype=float)
    counted = [n * (s if w is None else np.minimum(w, s) if kind == "chunked" else window_key_count(w, s))
               for kind, w, n in groups]
    compressed = compressed_keys(m, s) if m.compressed_layers else 0.0  # DeepSeek-V4 (cost.compressed)
    return (sum(counted, 0.0 * s) + compressed) / m.num_hidden_layers


def window_keys(m: ModelSpec, s: Any) -> Any:
    """The part of attention_keys (the same count, averaged over the layers) that the sliding-window layers
    contribute, window_key_count each: the layers whose fused kernel runs one windowed causal call
    (cost.attention_rate.window_rate_ratio). 0 for DeepSeek-V4, whose window keys join the compressed ones in
    one sparse call (cost.compressed), and without sliding layers. Derived: docs/formulas.md#compute.window_attention"""
    w, n = m.sliding_window, m.count_layers("sliding_attention")
    if not w or not n or m.is_dsa or m.compressed_layers:
        return 0.0 * np.asarray(s, dtype=float)
    return n * window_key_count(w, np.asarray(s, dtype=float)) / m.num_hidden_layers


def logits_flops(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Output layer forward, one micro-batch, one rank: 2·s·b·h·V/t (V unpadded, as MFU counts it).
    Derived: docs/formulas.md#compute.flops"""
    return 2 * plan.seq_len / plan.cp * plan.micro_batch * m.hidden_size * m.vocab_size / plan.tp


def model_flops_per_step(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Model FLOPs of one step over all GPUs: 3 x forward (backward = 2 x forward), no recompute.
    Source: Narayanan et al. 2021 Eq. 3 without its recompute pass; Korthikanti et al. 2022 §6 (MFU).
    Derived: docs/formulas.md#compute.flops"""
    per_rank_mb = (m.num_dense_layers * layer_flops(m, plan, False).total
                   + m.num_moe_layers * layer_flops(m, plan, True).total + logits_flops(m, plan))
    replicas_per_mb = plan.tp * plan.cp  # ranks that share one micro-batch
    return 3 * per_rank_mb * replicas_per_mb * plan.global_batch / plan.micro_batch


def recompute_flops_per_step(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Extra forward FLOPs recomputation adds over all GPUs: full recompute repeats the layers' forward,
    selective only the attention core (Korthikanti et al. 2022 §5; a hybrid's recurrent scans not:
    core_attention_flops), op every other matmul (op_recomputed_share). Derived: docs/formulas.md#compute.flops"""
    dense, moe = layer_flops(m, plan, False), layer_flops(m, plan, True)
    full = (m.num_dense_layers * dense.total + m.num_moe_layers * moe.total) * recomputed_share(
        plan, m.num_hidden_layers / plan.pp)
    core = where(plan.recomputes("core_attn"), m.num_dense_layers * core_attention_flops(m, plan, False)
                 + m.num_moe_layers * core_attention_flops(m, plan, True), 0.0) \
        + m.num_dense_layers * module_recompute_flops(m, plan, False) \
        + m.num_moe_layers * module_recompute_flops(m, plan, True)
    op = (m.num_dense_layers * dense.gemm + m.num_moe_layers * moe.gemm) * op_recomputed_share(m)
    per_rank_mb = where(plan.full, full, where(plan.selective, core, where(plan.op, op, 0.0)))
    return per_rank_mb * plan.tp * plan.cp * plan.global_batch / plan.micro_batch


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
    if m.mla is None and m.q_lora_rank:  # DeepSeek-V4: the query up-projection (Megatron-LM DSv4 recompute_up_proj)
        up = where(plan.recomputes("mla_up_proj"), 2 * T * m.q_lora_rank * m.num_attention_heads * m.d_head / t, 0.0)
    if (mla := m.mla) is not None:
        a, nope, rope, v = m.num_attention_heads, mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim
        up = where(plan.recomputes("mla_up_proj"), 2 * T * (mla.q_rank * a * (nope + rope)
                                                              + mla.kv_lora_rank * a * (nope + v)) / t, 0.0)
    # mhc: the two hyper-connection projections run again (their memory-bound passes are not repriced)
    up = up + where(plan.recomputes("mhc"), 2 * T * 2 * hc_params(m), 0.0)
    if not moe:
        mlp = 2 * T * mlp_params(m, m.intermediate_size) * dense_mlp_share(m) / t
        return up + where(plan.recomputes("mlp"), mlp, 0.0)
    shared = 2 * T * mlp_params(m, m.shared_ffn) / t if m.shared_ffn else 0.0
    whole = routed_expert_flops(m, plan) + 2 * T * (m.hidden_size * m.num_experts + latent_proj_params(m)) / t \
        + shared
    return up + where(plan.recomputes("moe"), whole, where(plan.recomputes("shared_experts"), shared, 0.0))


def op_recomputed_share(m: ModelSpec) -> float:
    """Share of a dense layer's forward matmul FLOPs that op-level checkpointing recomputes: the layer's
    second, fourth, ... matmul (Llama: wk, wo, w3). Source: torchtitan 0.3.0 distributed/activation_checkpoint.py
    (SelectiveAC saves the compute-intensive ops' outputs except every second mm). Derived:
    docs/formulas.md#compute.time"""
    widths = op_matmul_widths(m)
    return sum(k * n for i, (k, n) in enumerate(widths) if i % 2 == 1) / sum(k * n for k, n in widths)


def attended_keys(m: ModelSpec, keys: Any) -> Any:
    """Keys a query attends to, averaged over the layers, when `keys` precede it: min(keys, w) on a
    sliding-window layer, at most the chunk on a chunked one, none on a layer without attention (serving's
    prefill and decode). Derived: docs/formulas.md#compute.flops"""
    windows = tuple((w, n) for _, w, n in attention_groups(m))  # a sparse layer attends to its top k
    if all(w is None for w, _ in windows) and m.num_attention_layers == m.num_hidden_layers \
            and not m.compressed_layers:
        return keys
    compressed = attended_compressed_keys(m, keys) if m.compressed_layers else 0.0  # DeepSeek-V4
    return (sum(n * (keys if w is None else np.minimum(keys, w)) for w, n in windows) + compressed) \
        / m.num_hidden_layers
