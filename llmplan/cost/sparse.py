"""DeepSeek Sparse Attention (DeepSeek-V3.2): a lightning indexer scores every preceding key with a few small
fp8 heads and the MLA core attends to the top index_topk of them.

Symbols: h hidden, r_q the query LoRA rank, H_I indexer heads of dimension d_I, k = index_topk, s keys.
Source: DeepSeek-AI 2025, "DeepSeek-V3.2-Exp: Boosting Long-Context Efficiency with DeepSeek Sparse
Attention" §2.1 (lightning indexer, top-k selection); deepseek-ai/DeepSeek-V3.2-Exp inference/model.py
(Indexer: wq_b, wk, k_norm, weights_proj; fp8 key cache with a scale per 128).
"""

from __future__ import annotations

from llmplan.specs.model import ModelSpec

INDEX_SCALE_BLOCK = 128
"""The indexer's fp8 key cache keeps an fp32 scale per 128 values (inference/model.py k_scale_cache)."""


def indexer_params(m: ModelSpec) -> int:
    """One layer's lightning indexer: wq_b r_q x H_I·d_I (h when queries are not compressed), wk h x d_I, its
    LayerNorm (2 d_I), weights_proj h x H_I. Source: DeepSeek-V3.2-Exp inference/model.py (Indexer)."""
    if not m.is_sparse_attention:
        return 0
    H, d, h = m.index_n_heads or 0, m.index_head_dim or 0, m.hidden_size
    return (m.q_lora_rank or h) * H * d + h * d + 2 * d + h * H


def indexer_flops_per_pair(m: ModelSpec) -> float:
    """Forward FLOPs of the indexer per (query, key) pair: H_I dot products of d_I and their weighted sum
    (2 H_I d_I + 2 H_I). Source: DeepSeek-V3.2-Exp report §2.1, Eq. 1 (I = sum_j w_j ReLU(q_j · k))."""
    H, d = m.index_n_heads or 0, m.index_head_dim or 0
    return 2.0 * H * d + 2.0 * H if m.is_sparse_attention else 0.0


def indexer_cache_bytes(m: ModelSpec) -> float:
    """Indexer key-cache bytes per token and layer (every rank holds it whole): d_I fp8 values and an fp32
    scale per 128. Derived: docs/formulas.md#sparse.attention"""
    d = m.index_head_dim or 0
    return d + 4.0 * d / INDEX_SCALE_BLOCK if m.is_sparse_attention else 0.0
