"""DeepSeek-V4's attention and residual: compressed attention (CSA with its indexer, HCA) beside a sliding
window, the shared-KV low-rank-query attention block with its grouped low-rank output projection, and
manifold-constrained hyper-connections (mHC) over hc_mult residual streams.

Symbols: h hidden, a heads of dimension d (one key/value head, key = value), r_q the query LoRA rank, g output
groups of rank d_g, w the sliding window, m the CSA compression rate (4) and m' the HCA one (128), H_I indexer
heads of dimension d_I, k = index_topk, n = hc_mult streams, s tokens of a sequence.

Source: Hugging Face transformers models/deepseek_v4/modeling_deepseek_v4.py (DeepseekV4Attention,
DeepseekV4CSACompressor, DeepseekV4Indexer, DeepseekV4HCACompressor, DeepseekV4HyperConnection,
DeepseekV4HyperHead); NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/models/deepseek/deepseek_v4_bridge.py at
4ab94dfad (the checkpoint's tensors: wq_a, wq_b, wkv, wo_a, wo_b, compressor, indexer, hc_attn_fn, hc_ffn_fn,
hc_head_fn).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llmplan.cost.windows import window_key_count
from llmplan.specs.model import ModelSpec

COMPRESSED_KEY_BYTES = 2.0
"""Bytes per value of the cached compressed and window keys in serving (bf16, as the attention reads them).
Derived: docs/formulas.md#compressed.cache"""



def compressed_layer_counts(m: ModelSpec) -> tuple[int, int]:
    """(CSA, HCA) layers of the model: compressed_sparse_attention and heavily_compressed_attention (0, 0 for
    other models)."""
    return m.count_layers("compressed_sparse_attention"), m.count_layers("heavily_compressed_attention")

def is_v4_attention(m: ModelSpec) -> bool:
    """Whether the attention block is DeepSeek-V4's (priced by v4_attention_params and its callers): no
    multi-head latent attention, and a query LoRA rank, a grouped output projection or a shared key/value head."""
    return m.mla is None and bool(m.q_lora_rank or m.o_lora_rank or m.shared_key_value)


def v4_attention_params(m: ModelSpec) -> int:
    """One DeepSeek-V4 attention block without its compressor: q_a h x r_q and its norm, q_b r_q x a·d (h x a·d
    without a query rank), the one shared key/value projection h x d and its norm (shared_key_value; else K
    keys and K values), and the output: grouped a·d x d_g (block-diagonal over g groups) then g·d_g x h, or
    a·d x h. Source: transformers modeling_deepseek_v4.py (DeepseekV4Attention.__init__)."""
    h, a, d, K = m.hidden_size, m.num_attention_heads, m.d_head, m.kv_heads
    r_q = m.q_lora_rank
    q_up = r_q * a * d if r_q else h * a * d
    kv = 0 if m.shared_key_value else 2 * h * K * d
    out = a * d * (m.o_lora_rank or 0) + (m.o_groups or 0) * (m.o_lora_rank or 0) * h if m.o_lora_rank else a * d * h
    return v4_replicated_attention_params(m) + q_up + kv + out


def v4_replicated_attention_params(m: ModelSpec) -> int:
    """The part of a DeepSeek-V4 attention block that every TP rank holds whole (the rest splits by heads): the
    query down-projection h x r_q and its norm, and the one shared key/value projection h x d and its norm
    (shared_key_value). Source: transformers modeling_deepseek_v4.py (DeepseekV4Attention.__init__).
    Derived: docs/formulas.md#compressed.attention"""
    h, d, r_q = m.hidden_size, m.d_head, m.q_lora_rank
    return (h * r_q + r_q if r_q else 0) + (h * d + d if m.shared_key_value else 0)


def csa_compressor_params(m: ModelSpec) -> int:
    """One CSA layer's compressor and indexer: kv and gate projections h x 2d (two overlapping series), a
    position bias m x 2d and a norm d; the indexer's own kv and gate h x 2d_I, position bias m x 2d_I, norm
    d_I, query up-projection r_q x H_I·d_I and head weights h x H_I. Source: transformers
    modeling_deepseek_v4.py (DeepseekV4CSACompressor, DeepseekV4Indexer, DeepseekV4IndexerScorer)."""
    h, d = m.hidden_size, m.d_head
    H, dI = m.index_n_heads or 0, m.index_head_dim or 0
    return 2 * h * 2 * d + 2 * h * 2 * dI + (m.q_lora_rank or h) * H * dI + h * H + csa_nonmatrix_params(m)


def csa_nonmatrix_params(m: ModelSpec) -> int:
    """One CSA compressor and indexer's parameters that are no linear-layer weight: the position biases m x 2d
    and m x 2d_I and the norms d and d_I (plain parameters, left in bf16 by a quantized init).
    Source: transformers modeling_deepseek_v4.py (DeepseekV4CSACompressor, DeepseekV4Indexer).
    Derived: docs/formulas.md#mem.nonmatrix_params"""
    d, dI, c = m.d_head, m.index_head_dim or 0, m.compress_rate_csa
    return c * 2 * d + d + c * 2 * dI + dI


def hca_compressor_params(m: ModelSpec) -> int:
    """One HCA layer's compressor: kv and gate projections h x d, a position bias m' x d and a norm d.
    Source: transformers modeling_deepseek_v4.py (DeepseekV4HCACompressor)."""
    return 2 * m.hidden_size * m.d_head + hca_nonmatrix_params(m)


def hca_nonmatrix_params(m: ModelSpec) -> int:
    """One HCA compressor's parameters that are no linear-layer weight: its position bias m' x d and norm d.
    Source: transformers modeling_deepseek_v4.py (DeepseekV4HCACompressor). Derived:
    docs/formulas.md#mem.nonmatrix_params"""
    return m.compress_rate_hca * m.d_head + m.d_head


def compressor_params(m: ModelSpec) -> int:
    """All compressors and indexers of the model (0 without compressed attention layers).
    Derived: docs/formulas.md#compressed.attention"""
    n_csa, n_hca = compressed_layer_counts(m)
    return n_csa * csa_compressor_params(m) + n_hca * hca_compressor_params(m)


def compressor_gemm_widths(m: ModelSpec) -> list[tuple[int, int, float, bool, bool]]:
    """(K, N, layer share, quantized, indexer) of the compressors' and indexer's projections over every token of a
    layer: CSA kv and gate (h -> 4d), the indexer's kv and gate (h -> 4d_I), query (r_q -> H_I d_I) and head
    weights (h -> H_I); HCA kv and gate (h -> 2d). Only the indexer's query runs in a low-precision recipe's
    format: the compressors and the head weights are built and run outside the FP8 autocast. `indexer`: the
    matmul is the CSA indexer's, fed detached inputs (x and q_r .detach() before forward_before_topk), so its
    backward has a weight gradient and no input gradient. Source: transformers modeling_deepseek_v4.py
    (DeepseekV4CSACompressor, DeepseekV4Indexer, DeepseekV4HCACompressor: their Linear layers); NVIDIA/Megatron-LM
    experimental_attention_variant/csa.py at 1e23526adc (Compressor._project and CSAIndexer._project_weights under
    get_fp8_disabled_context; linear_wq_b built without it; x_det / qr_det in _forward_unfused_csa and
    _forward_fused_indexer_training). Derived: docs/formulas.md#compressed.unquantized"""
    h, d, L = m.hidden_size, m.d_head, m.num_hidden_layers
    H, dI = m.index_n_heads or 0, m.index_head_dim or 0
    n_csa, n_hca = compressed_layer_counts(m)
    out: list[tuple[int, int, float, bool, bool]] = []
    if n_csa:
        out += [(h, 4 * d, n_csa / L, False, False), (h, 4 * dI, n_csa / L, False, True),
                (m.q_lora_rank or h, H * dI, n_csa / L, True, True), (h, H, n_csa / L, False, True)]
    if n_hca:
        out += [(h, 2 * d, n_hca / L, False, False)]
    return out


def hc_fn_shape(m: ModelSpec) -> tuple[int, int]:
    """(K, N) of one hyper-connection's fn projection: the n streams flattened (n·h) to the (2+n)n mixing
    weights (n pre, n post, n x n comb). Source: transformers modeling_deepseek_v4.py
    (DeepseekV4HyperConnection)."""
    n = m.hc_mult
    return n * m.hidden_size, (2 + n) * n


def hc_params(m: ModelSpec) -> int:
    """One hyper-connection (two per layer, one before each sub-block): fn (2+n)n x n·h (hc_fn_shape), base
    (2+n)n, three scales; 0 with a plain residual (n = 1). Source: transformers modeling_deepseek_v4.py
    (DeepseekV4HyperConnection)."""
    nh, w = hc_fn_shape(m)
    return w * nh + w + 3 if m.hc_mult > 1 else 0


def hc_head_params(m: ModelSpec) -> int:
    """The final collapse of the n streams before the last norm: hc_fn n x n·h, n biases, one scale.
    Source: transformers modeling_deepseek_v4.py (DeepseekV4HyperHead)."""
    n = m.hc_mult
    return n * n * m.hidden_size + n + 1 if n > 1 else 0


def hyper_connection_params(m: ModelSpec) -> int:
    """All hyper-connection parameters of the main model: two per layer and the head collapse.
    Derived: docs/formulas.md#compressed.hyper_connections"""
    return 2 * m.num_hidden_layers * hc_params(m) + hc_head_params(m)


def replicated_layer_params(m: ModelSpec) -> float:
    """Parameters of the average layer that every TP rank holds whole: its share of the compressors and
    indexers (compressor_params over the layers) and its two hyper-connections (0 for other models).
    Derived: docs/formulas.md#compressed.attention"""
    return compressor_params(m) / m.num_hidden_layers + 2 * hc_params(m)


def replicated_nonmatrix_params(m: ModelSpec) -> float:
    """The part of replicated_layer_params no quantized init stores low-precision: the average layer's share of
    the compressors' position biases and norms, and its two hyper-connections whole (Megatron-Core builds them
    from torch.nn.Linear and nn.Parameter, no Transformer Engine module). Source: NVIDIA/Megatron-LM at
    d98e8a64dd, megatron/core/transformer/hyper_connection.py (HyperConnectionModule.__init__).
    Derived: docs/formulas.md#mem.nonmatrix_params"""
    n_csa, n_hca = compressed_layer_counts(m)
    compressors = n_csa * csa_nonmatrix_params(m) + n_hca * hca_nonmatrix_params(m)
    return compressors / m.num_hidden_layers + 2 * hc_params(m)


def compressed_keys(m: ModelSpec, s: Any) -> Any:
    """Keys per query counted in training's attention FLOPs for a sequence of s tokens, summed over the
    compressed layers (MFU's count: twice the mean a causal query sees). Every layer's window: query i sees
    min(i, w) keys, window_key_count (as a sliding layer). CSA: query i sees i/m compressed keys of which the indexer
    keeps k, 2k - k²m/s while s/m > k (else s/m); HCA: all i/m', s/m'.
    Derived: docs/formulas.md#compressed.attention"""
    s = np.asarray(s, dtype=float)
    w, c, k = m.sliding_window or 0, m.compress_rate_csa, m.index_topk or 0
    window = window_key_count(w, s)
    csa = np.where(s / c > k, 2.0 * k - k * k * c / s, s / c)
    n_csa, n_hca = compressed_layer_counts(m)
    return (n_csa + n_hca) * window + n_csa * csa + n_hca * s / m.compress_rate_hca


def indexer_scores_per_token(m: ModelSpec, s: Any) -> Any:
    """Forward FLOPs per token of the CSA layers' indexers, all such layers: each query scores every preceding
    compressed indexer key (i/m of them; s/m counted, as full causal attention is) with H_I dot products of
    d_I and their weighted sum (2 H_I d_I + 2 H_I). Source: DeepSeek-V3.2-Exp report §2.1 Eq. 1 (the lightning
    indexer); transformers modeling_deepseek_v4.py (DeepseekV4IndexerScorer over the compressed keys)."""
    H, dI = m.index_n_heads or 0, m.index_head_dim or 0
    return compressed_layer_counts(m)[0] * s / m.compress_rate_csa * (2.0 * H * dI + 2.0 * H)


def attended_compressed_keys(m: ModelSpec, keys: Any) -> Any:
    """Keys a query attends to, summed over the compressed layers, when `keys` precede it (serving): the window
    min(keys, w) in each, plus min(keys/m, k) in a CSA layer and keys/m' in an HCA one.
    Derived: docs/formulas.md#compressed.attention"""
    w, c, k = m.sliding_window or 0, m.compress_rate_csa, m.index_topk or 0
    n_csa, n_hca = compressed_layer_counts(m)
    return (n_csa + n_hca) * np.minimum(keys, w) + n_csa * np.minimum(np.asarray(keys) / c, k) \
        + n_hca * np.asarray(keys) / m.compress_rate_hca


def compressed_cache_bytes_per_token(m: ModelSpec, b: float = COMPRESSED_KEY_BYTES) -> float:
    """Serving cache bytes per token of context, all compressed layers, keys at b bytes a value: a CSA layer
    keeps one d-wide key per m tokens and its indexer one d_I-wide key per m (fp8 with an fp32 scale per 128, as
    DeepSeek-V3.2's), an HCA layer one d-wide key per m'. The window's keys are per sequence
    (window_cache_bytes). Source: transformers modeling_deepseek_v4.py (DeepseekV4CSACache,
    DeepseekV4HCACache: compressed_kv per entry name). Derived: docs/formulas.md#compressed.cache"""
    d, dI = m.d_head, m.index_head_dim or 0
    csa = (d * b + dI + 4.0 * dI / 128) / m.compress_rate_csa
    n_csa, n_hca = compressed_layer_counts(m)
    return n_csa * csa + n_hca * d * b / m.compress_rate_hca


def window_cache_bytes(m: ModelSpec, context: Any, b: float = COMPRESSED_KEY_BYTES) -> Any:
    """Serving cache bytes per sequence of `context` tokens of the sliding-window keys every DeepSeek-V4 layer
    keeps (min(context, w) keys of d, key = value) and of the compressors' pending tokens (up to m kv and gate
    rows of 2d on a CSA layer, m' of d on an HCA one), bounded whatever the context length. Source:
    transformers modeling_deepseek_v4.py (DynamicSlidingWindowLayer; buffer_kv / buffer_gate, overlap_kv).
    Derived: docs/formulas.md#compressed.cache"""
    w, d = m.sliding_window or 0, m.d_head
    n_csa, n_hca = compressed_layer_counts(m)
    window_layers = m.count_layers("sliding_attention") + n_csa + n_hca
    buffers = n_csa * m.compress_rate_csa * 2 * 2 * d * b + n_hca * m.compress_rate_hca * 2 * d * b
    return window_layers * np.minimum(context, w) * d * b + buffers


def hc_memory_bytes(m: ModelSpec) -> float:
    """HBM bytes per token of one layer's hyper-connections beyond a plain residual, in the forward-equivalent
    units of elementwise_bytes (the stage charges them three times), bf16: per sub-block the mapping kernel (norm
    and fn projection) reads the n streams (2nh) and the weighted collapse, a kernel of its own, reads them again
    and writes the collapsed input (2nh + 2h); the post step reads the n streams and the sub-block's output and
    writes the n mixed streams (4nh + 2h); the backward sums the three consumers' n-stream gradients in one kernel
    (reads 6nh, writes 2nh), 8nh/3 here; in place of a residual add's 6h. 0 for n = 1.
    Source: NVIDIA/Megatron-LM megatron/core/transformer/hyper_connection.py at 1e23526adc
    (HyperConnectionModule._forward: BroadcastTensorFused into compute_mappings, aggregate and the fused
    h_res / h_post bias-dropout-add; BroadcastTensorFused.backward's fused_add_3); transformers
    modeling_deepseek_v4.py (DeepseekV4HyperConnection.forward).
    Derived: docs/formulas.md#compressed.hyper_connections"""
    n, h = m.hc_mult, m.hidden_size
    per_sub_block = 2 * n * h + (2 * n * h + 2 * h) + (4 * n * h + 2 * h) + 8 * n * h / 3 - 6 * h
    return 2 * per_sub_block if n > 1 else 0.0


def hc_activation_bytes(m: ModelSpec) -> float:
    """Activation bytes per token one layer's hyper-connections keep for backward beyond a plain residual, in
    bf16: per sub-block the n input streams (read by the fn projection, the collapse and the comb mix: 2nh)
    and the fp32 pre / post / comb weights ((2+n)n values). 0 for n = 1.
    Derived: docs/formulas.md#compressed.hyper_connections"""
    n, h = m.hc_mult, m.hidden_size
    return 2 * (2.0 * n * h + 4.0 * (2 + n) * n) if n > 1 else 0.0


def compressor_token_bytes(m: ModelSpec) -> float:
    """Bytes per token, summed over the compressed layers, of the compressors' projected series that the
    pooling reads (and keeps for backward), in bf16: a CSA layer's kv and gate of 2d each (8d) and its
    indexer's of 2d_I each (8d_I) with the indexer's H_I·d_I query and H_I head weights; an HCA layer's kv and
    gate of d (4d). Source: transformers modeling_deepseek_v4.py (the softmax-gated sum over each window of
    kv_proj x gate_proj outputs; DeepseekV4Indexer). Derived: docs/formulas.md#compressed.attention"""
    d, dI, H = m.d_head, m.index_head_dim or 0, m.index_n_heads or 0
    csa = 8.0 * d + 8.0 * dI + 2.0 * H * dI + 2.0 * H
    n_csa, n_hca = compressed_layer_counts(m)
    return n_csa * csa + n_hca * 4.0 * d
