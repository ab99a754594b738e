"""Parameter counts: whole model (total, active) and the shard one rank holds under TP / PP / EP.

Symbols follow the papers: h hidden, f FFN width, a query heads, K key/value heads, d head dim, V vocab,
L layers, E routed experts, k experts per token, t tensor-parallel degree.

Which layers a pipeline stage holds lives in cost.stages and the memo in cost.memo; their names are
re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from llmplan.arith import maximum, where
from llmplan.cost.breakdown import Breakdown
from llmplan.cost.compressed import (
    compressor_params,
    hc_head_params,
    hc_params,
    hyper_connection_params,
    is_v4_attention,
    replicated_layer_params,
    replicated_nonmatrix_params,
    v4_attention_params,
    v4_replicated_attention_params,
)
from llmplan.cost.memo import (  # noqa: F401  (re-exported: their home was this module)
    ALL_BUT_ZERO,
    LAYOUT_AXES,
    memoized,
    per_distinct,
)
from llmplan.cost.mixers import (
    attention_share,
    dense_mlp_share,
    mean_recurrent_nonmatrix_params,
    mean_recurrent_params,
    norms_per_layer,
    recurrent_params,
)
from llmplan.cost.sparse import indexer_params
from llmplan.cost.stages import (  # noqa: F401  (re-exported: their home was this module)
    chunk_layers,
    explicit_stages,
    heaviest_moe_stage,
    kind_layers_between,
    layer_split,
    layers_before,
    layout_chunk_layers,
    layout_grid,
    max_stage_layers,
    moe_layers_between,
    mtp_weight_sets,
    recomputed_share,
    stage_kind_counts,
    stage_layer_count,
    stage_layer_list,
    stage_layers,
    stage_mtp_modules,
    stage_mtp_weight_sets,
    stage_weight_layers,
)
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import PlanLike
from llmplan.specs.schedule import schedule_of


@dataclass(frozen=True)
class ParamCounts(Breakdown):
    """Parameters of the whole model by part; the parts sum to `total`."""

    PARTS: ClassVar[tuple[str, ...]] = ("embedding", "output", "attention", "dense_mlp", "routed_experts",
                                        "shared_experts", "router", "norms", "recurrent_mixers",
                                        "latent_projections", "hyper_connections")

    embedding: int
    """Input token embedding (+ learned position embedding)."""
    output: int
    """Output layer (0 when tied to the embedding)."""
    attention: int
    """All attention projections (and their biases, q/k norms) of all layers."""
    dense_mlp: int
    """MLPs of dense layers."""
    routed_experts: int
    """All routed experts of all MoE layers."""
    shared_experts: int
    """Shared experts of all MoE layers."""
    router: int
    """Router (gate) matrices, with the per-expert selection bias where the model has one."""
    norms: int
    """Layer norms of all layers and the final norm."""
    recurrent_mixers: int
    """Mamba-2 and Gated DeltaNet mixers of a hybrid model's recurrent layers (0 for a transformer)."""
    latent_projections: int
    """A latent MoE's h -> latent and latent -> h projections around the routed experts (0 without one)."""
    hyper_connections: int
    """Hyper-connection weights over the hc_mult residual streams: two per layer and the final collapse
    (cost.compressed; 0 with a plain residual)."""
    experts_per_token_fraction: float
    """k / E: the fraction of routed-expert weights one token uses (1.0 for dense models)."""

    @property
    def active(self) -> float:
        """Parameters one token touches: everything except the routed experts it is not sent to."""
        return self.total - self.routed_experts * (1.0 - self.experts_per_token_fraction)


def attention_params(m: ModelSpec) -> int:
    """Parameters of one attention block.

    Source: Hugging Face modeling code (LlamaAttention projection shapes; DeepseekV3Attention for MLA)."""
    h, a, K, d = m.hidden_size, m.num_attention_heads, m.kv_heads, m.d_head
    if (mla := m.mla) is not None:
        nope, rope, v, kv_r = mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim, mla.kv_lora_rank
        q_r = mla.q_lora_rank
        q = (h * q_r + q_r + q_r * a * (nope + rope)) if q_r else h * a * (nope + rope)
        kv = h * (kv_r + rope) + kv_r + kv_r * a * (nope + v)
        return q + kv + a * v * h + indexer_params(m)  # DeepSeek Sparse Attention's indexer (cost.sparse)
    if is_v4_attention(m):  # DeepSeek-V4's block (cost.compressed)
        return v4_attention_params(m)
    n = h * a * d * (2 if m.attention_output_gate else 1) + 2 * h * K * d + a * d * h
    if m.attention_bias or m.qkv_bias:
        n += a * d + 2 * K * d
    if m.attention_bias:
        n += h
    if m.qk_norm:
        n += 2 * d
    return n + attention_sink_params(m)


def attention_sink_params(m: ModelSpec) -> int:
    """One attention block's sinks: a learned logit per query head (a; 0 without attention_sinks).
    Source: Hugging Face transformers modeling_gpt_oss.py (GptOssAttention.sinks, one per attention head);
    NVIDIA/Megatron-LM at d98e8a64dd megatron/core/transformer/dot_product_attention.py (softmax_type
    "learnable": softmax_offset, num_attention_heads_per_partition entries, split by TP).
    Derived: docs/formulas.md#params.model"""
    return m.num_attention_heads if m.attention_sinks else 0


def attention_replicated_params(m: ModelSpec) -> int:
    """One attention block's parameters that every TP rank holds whole: the row-parallel output projection's
    bias (h) and the per-head q/k norms (2d, built at head width). Source: NVIDIA/Megatron-LM at d98e8a64dd
    megatron/core/tensor_parallel/layers.py (RowParallelLinear: "bias is not parallelized", output_size
    entries), transformer/attention.py (q_layernorm / k_layernorm of hidden_size_per_attention_head);
    NVIDIA/TransformerEngine at d0067d0da6 transformer_engine/pytorch/module/linear.py (parallel_mode "row"
    splits in_features only; the bias has out_features). Derived: docs/formulas.md#params.rank"""
    return (m.hidden_size if m.attention_bias else 0) + (2 * m.d_head if m.qk_norm else 0)


def mlp_params(m: ModelSpec, f: int, width: int | None = None) -> int:
    """Parameters of one MLP of width f on inputs of `width` (default h): 3·h·f gated (SwiGLU), 2·h·f plain;
    biases where the model has them.

    Source: Hugging Face modeling code (LlamaMLP: gate, up and down projections)."""
    h = width or m.hidden_size
    return (3 if m.gated_mlp else 2) * h * f + mlp_bias_params(m, f, width)


def mlp_bias_params(m: ModelSpec, f: int, width: int | None = None) -> int:
    """The biases of one MLP of width f on inputs of `width` (default h), 0 without mlp_bias: fc1's 2f (gated)
    or f and fc2's h. Source: Hugging Face modeling code (GptOssExperts gate_up_proj_bias, down_proj_bias)."""
    h = width or m.hidden_size
    return ((2 * f if m.gated_mlp else f) + h) if m.mlp_bias else 0


def mlp_params_per_rank(m: ModelSpec, f: int, t: Any, width: int | None = None) -> Any:
    """One MLP of width f on inputs of `width` (default h) on one rank of a TP (or expert-TP) group of t: its
    weights and fc1's biases split by t, fc2's bias (`width` entries) whole on every rank.
    Source: NVIDIA/Megatron-LM at d98e8a64dd megatron/core/tensor_parallel/layers.py (RowParallelLinear:
    "bias is not parallelized"; ColumnParallelLinear's bias of output_size_per_partition); NVIDIA/
    TransformerEngine at d0067d0da6 transformer_engine/pytorch/module/grouped_linear.py (parallel_mode "row":
    bias{i} of out_features). Derived: docs/formulas.md#params.rank"""
    fc2_bias = (width or m.hidden_size) if m.mlp_bias else 0
    return (mlp_params(m, f, width) - fc2_bias) / t + fc2_bias


def mlp_bias_per_rank(m: ModelSpec, f: int, t: Any, width: int | None = None) -> Any:
    """mlp_bias_params on one rank of a TP (or expert-TP) group of t: fc1's split by t, fc2's whole (as
    mlp_params_per_rank). Derived: docs/formulas.md#mem.nonmatrix_params"""
    fc2_bias = (width or m.hidden_size) if m.mlp_bias else 0
    return (mlp_bias_params(m, f, width) - fc2_bias) / t + fc2_bias


def token_ffn_width(m: ModelSpec, moe: bool) -> int:
    """The FFN columns one token runs through in a layer: k·f_e + f_shared (its k routed experts and the shared
    expert) in an MoE layer, f in a dense one. Derived: docs/formulas.md#compute.flops"""
    return m.expert_ffn * m.num_experts_per_tok + m.shared_ffn if moe else m.intermediate_size

def expert_params(m: ModelSpec) -> int:
    """One routed expert: an MLP of width f_e on the expert width (the latent width of a latent MoE).

    Source: NVIDIA/Megatron-LM megatron/core/transformer/moe/moe_layer.py (the experts read the
    fc1_latent_proj output). Derived: docs/formulas.md#moe.latent"""
    return mlp_params(m, m.expert_ffn, m.expert_width)


def latent_proj_params(m: ModelSpec) -> int:
    """A latent MoE layer's two projections, h -> l before dispatch and l -> h after combine (2·h·l, biases
    where the model has them); 0 without a latent width. Megatron-LM replicates them on every TP rank
    (parallel_mode "duplicated") and counts them with the layer's non-expert weights.

    Source: NVIDIA/Megatron-LM megatron/core/transformer/moe/moe_layer.py (fc1_latent_proj, fc2_latent_proj).
    Derived: docs/formulas.md#moe.latent"""
    l, h = m.moe_latent_size, m.hidden_size
    return 2 * h * l + latent_bias_params(m) if l else 0


def latent_bias_params(m: ModelSpec) -> int:
    """The biases of a latent MoE layer's two projections (l and h; 0 without a latent width or biases).
    Derived: docs/formulas.md#mem.nonmatrix_params"""
    l = m.moe_latent_size
    return (l + m.hidden_size) if l and m.mlp_bias else 0


def router_params(m: ModelSpec) -> int:
    """One MoE layer's router: the h x E gate (and its E biases where the MLP has biases), plus the E-entry
    selection bias of auxiliary-loss-free balancing (expert_bias: a parameter tensor in the checkpoint).

    Source: Hugging Face modeling code (DeepseekV3TopkRouter and NemotronHTopkRouter: weight and
    e_score_correction_bias); Megatron-LM megatron/core/transformer/moe/router.py (expert_bias)."""
    E = m.num_experts
    return m.hidden_size * E + (E if m.mlp_bias else 0) + (E if m.expert_bias else 0)


def moe_block_params(m: ModelSpec) -> int:
    """One MoE layer's MLP part: its routed experts, shared expert, router and latent projections."""
    return (m.num_experts * expert_params(m) + (mlp_params(m, m.shared_ffn) if m.shared_ffn else 0)
            + router_params(m) + latent_proj_params(m))


def mtp_projection_params(m: ModelSpec, t: Any = 1) -> Any:
    """One multi-token-prediction module's own projection on a rank of TP degree t: eh_proj (2h -> h, no bias,
    split by TP) and its two input norms enorm and hnorm (replicated). Source: DeepSeek-V3 report §2.2 (M_k and
    the RMSNorms before it); Hugging Face NemotronHMultiTokenPredictorLayer (eh_proj, enorm, hnorm)."""
    h = m.hidden_size
    return 2 * h * h / t + 2 * norm_params(m)


def mtp_module_params(m: ModelSpec) -> int:
    """One multi-token-prediction module, which the published counts leave out: an attention block and an MLP
    block (MoE where the model has experts) with their pre-norms, its projection (mtp_projection_params: eh_proj,
    enorm, hnorm) and the final norm; the embedding and the output head are shared with the model.

    Source: DeepSeek-V3 report §2.2 (Figure 3: M_k, the projection and the block); Hugging Face
    NemotronHMultiTokenPredictorLayer (mtp_hybrid_override_pattern "*E": eh_proj, enorm, hnorm,
    final_layernorm)."""
    mlp = moe_block_params(m) if m.is_moe else mlp_params(m, m.intermediate_size)
    hc = 2 * hc_params(m) + hc_head_params(m)  # DeepSeek-V4's MTP block keeps its own streams and collapse
    return attention_params(m) + mlp + int(mtp_projection_params(m)) + 3 * norm_params(m) + hc


def mtp_params(m: ModelSpec) -> int:
    """Parameters of the model's MTP modules, which the published counts leave out: mtp_module_params per weight
    set (cost.stages.mtp_weight_sets: one under mtp_repeated_layer, however many depths run it).
    Derived: docs/formulas.md#params.rank"""
    return mtp_weight_sets(m) * mtp_module_params(m)


def mtp_block_params_per_rank(m: ModelSpec, t: Any) -> Any:
    """One multi-token-prediction module's block on one rank of TP degree t, its routed experts and projection
    (mtp_projection_params, with the output head) aside: softmax attention whatever the stack's mixers (a hybrid's
    module is an attention layer, not the average layer), its MLP (an MoE layer's router, shared expert and latent
    projections where the model has experts), two pre-norms and the final norm, DeepSeek-V4's two
    hyper-connections and collapse; mtp_module_params split as attention_params_per_rank and
    mlp_params_per_rank split a layer. Source: NVIDIA/Megatron-LM at d98e8a64dd
    megatron/core/transformer/multi_token_prediction.py (MultiTokenPredictionLayer: enorm, hnorm, eh_proj, the
    transformer layer, final_layernorm); vllm-project/vllm qwen3_next_mtp.py at ffdc9857 (Qwen3-Next's module: a
    full-attention decoder layer). Derived: docs/formulas.md#params.rank"""
    mlp = (router_params(m) + (mlp_params_per_rank(m, m.shared_ffn, t) if m.shared_ffn else 0)
           + latent_proj_params(m)) if m.is_moe else mlp_params_per_rank(m, m.intermediate_size, t)
    hc = 2 * hc_params(m) + hc_head_params(m)
    return attention_params_per_rank(m, t) + mlp + 3 * norm_params(m) + hc


def norm_params(m: ModelSpec) -> int:
    """One norm: h weights (RMSNorm) or h weights + h biases (LayerNorm)."""
    return m.hidden_size * (2 if m.norm_type == "layernorm" else 1)


def param_counts(m: ModelSpec) -> ParamCounts:
    """Whole-model parameter counts by part: attention in the attention layers, the recurrent mixers in the
    others, a pre-norm per sub-block (mixer, MLP) and the final norm.

    Source: Hugging Face modeling code (MixtralSparseMoeBlock, DeepseekV3MoE: E experts + router;
    NemotronHBlock: one norm and one mixer or MLP per block)."""
    h, V, L = m.hidden_size, m.vocab_size, m.num_hidden_layers
    E, n_moe = m.num_experts, m.num_moe_layers
    pos = m.max_position_embeddings * h if m.learned_position_embeddings else 0
    return ParamCounts(
        embedding=V * h + pos,
        output=0 if m.tie_word_embeddings else V * h,
        attention=m.num_attention_layers * attention_params(m) + compressor_params(m),
        dense_mlp=m.num_mlp_layers * mlp_params(m, m.intermediate_size),
        routed_experts=n_moe * E * expert_params(m),
        shared_experts=n_moe * (mlp_params(m, m.shared_ffn) if m.shared_ffn else 0),
        router=n_moe * router_params(m) - (m.num_hash_layers * E if m.expert_bias else 0),  # hash: no bias
        norms=(L - m.count_layers("none") + m.num_mlp_layers + n_moe + 1) * norm_params(m),
        recurrent_mixers=recurrent_params(m),
        latent_projections=n_moe * latent_proj_params(m),
        hyper_connections=hyper_connection_params(m),
        experts_per_token_fraction=(m.num_experts_per_tok / E) if E else 1.0,
    )


@dataclass(frozen=True)
class RankParams(Breakdown):
    """Parameters one rank holds, split by the group that replicates them (for ZeRO sharding)."""

    PARTS: ClassVar[tuple[str, ...]] = ("dense", "expert")

    dense: Any
    """Non-expert parameters (replicated over dp x cp)."""
    expert: Any
    """Routed-expert parameters (replicated over the expert-data-parallel group)."""


def kv_heads_per_rank(m: ModelSpec, t: Any) -> Any:
    """KV heads on one TP rank: K/t, or one replicated head when t exceeds K (check_plan keeps t | K or K | t)."""
    return maximum(m.kv_heads / t, 1.0)


def attention_params_per_rank(m: ModelSpec, t: Any) -> Any:
    """One attention block's parameters on one TP rank (column/row-parallel projections split by heads).

    Derived: docs/formulas.md#params.rank"""
    h, d = m.hidden_size, m.d_head
    if m.mla is not None:
        # Down-projections (and their norms) are replicated; per-head up-projections and the output split by t.
        down = mla_down_params(m) + indexer_params(m)  # indexer replicated
        return down + (attention_params(m) - down) / t
    if is_v4_attention(m):
        down = v4_replicated_attention_params(m)  # DeepSeek-V4: the query down-projection, the shared KV head
        return down + (attention_params(m) - down) / t
    kv_head = 2 * (h * d + (d if (m.attention_bias or m.qkv_bias) else 0))  # a key and a value head, biases
    whole = attention_replicated_params(m)  # output bias, q/k norms: on every TP rank
    return (attention_params(m) - kv_head * m.kv_heads - whole) / t + kv_head * kv_heads_per_rank(m, t) + whole


def mla_down_params(m: ModelSpec) -> int:
    """One MLA block's down-projections and latent norms, which every TP rank holds whole: h x q_r and its norm
    q_r (with a compressed query), h x (kv_r + rope) and its norm kv_r; 0 without MLA. Source: NVIDIA/Megatron-LM
    at d98e8a64dd, megatron/core/transformer/multi_latent_attention.py (MLASelfAttention.__init__:
    linear_q_down_proj / linear_kv_down_proj built as TELinear parallel_mode "duplicated"; q_layernorm of
    q_lora_rank, kv_layernorm of kv_lora_rank). Derived: docs/formulas.md#params.rank"""
    if (mla := m.mla) is None:
        return 0
    h, rope, kv_r, q_r = m.hidden_size, mla.qk_rope_head_dim, mla.kv_lora_rank, mla.q_lora_rank
    return (h * q_r + q_r if q_r else 0) + h * (kv_r + rope) + kv_r


def tp_synced_layer_params(m: ModelSpec) -> tuple[float, float, float]:
    """Per average (dense layer, MoE layer), the parameters every TP rank holds whole whose gradients
    Megatron-Core sums over TP at the end of the step when sequence parallelism is on (each rank saw 1/t of the
    tokens): the pre-norms, MLA's down-projections and latent norms, the row-parallel output biases (attention;
    a dense MLP's), the hyper-connections, and in a MoE layer the router's gate (and bias; its expert_bias is a
    buffer) and the latent projections; and, third, what it sums whatever sequence parallelism: the per-head
    q/k norms of qk_layernorm (MLA fuses its latent norms into the up-projections instead). DeepSeek Sparse
    Attention's indexer, also whole on every rank, is averaged in a call of its own (indexer_params).
    Source: NVIDIA/Megatron-LM at d98e8a64dd, megatron/core/distributed/finalize_model_grads.py
    (_allreduce_non_tensor_model_parallel_grads: config.sequence_parallel and the param's sequence_parallel
    attribute, or qk_layernorm's q_layernorm / k_layernorm, SUM; average_gradients_across_tp_domain, AVG),
    extensions/transformer_engine.py (TELinear "duplicated": sequence_parallel = config.sequence_parallel; the
    row-parallel bias), tensor_parallel/layers.py (RowParallelLinear's bias), transformer/moe/router.py
    (Router.reset_parameters), transformer/hyper_connection.py, experimental_attention_variant/dsa.py (the
    indexer: average); NVIDIA/TransformerEngine transformer_engine/pytorch/module/layernorm_linear.py
    (layer_norm_weight's sequence_parallel attribute). Derived: docs/formulas.md#comm.tp_grad_sync"""
    h = m.hidden_size
    bias = h if m.attention_bias else 0
    common = attention_share(m) * (mla_down_params(m) + (0 if m.mla is not None else bias)) \
        + norms_per_layer(m) * norm_params(m) + 2 * hc_params(m)
    dense = common + (dense_mlp_share(m) * h if m.mlp_bias else 0)
    router = h * m.num_experts + (m.num_experts if m.mlp_bias else 0)
    moe = common + router + latent_proj_params(m) if m.is_moe else dense
    qk = attention_share(m) * (2 * m.d_head if m.qk_norm and m.mla is None else 0)
    return dense, moe, qk


def attention_nonmatrix_per_rank(m: ModelSpec, t: Any) -> Any:
    """One attention block's parameters on one TP rank that are no linear-layer weight, split as
    attention_params_per_rank splits them: the projections' biases, the q/k norms and the sinks; MLA's latent norms
    (q_r, kv_r) and the sparse indexer's LayerNorm (2 d_I), replicated; DeepSeek-V4's query and key/value norms.
    Source: Hugging Face modeling code (Qwen2Attention biases, Qwen3Attention q_norm / k_norm, DeepseekV3Attention
    q_a_layernorm / kv_a_layernorm); DeepSeek-V3.2-Exp inference/model.py (Indexer.k_norm).
    Derived: docs/formulas.md#mem.nonmatrix_params"""
    d = m.d_head
    if (mla := m.mla) is not None:
        indexer_norm = 2 * (m.index_head_dim or 0) if m.is_sparse_attention else 0
        return (mla.q_lora_rank or 0) + mla.kv_lora_rank + indexer_norm
    if is_v4_attention(m):
        return (m.q_lora_rank or 0) + (d if m.shared_key_value else 0)
    biased = m.attention_bias or m.qkv_bias
    split = (m.num_attention_heads * d if biased else 0) + attention_sink_params(m)  # q biases, sinks: by heads
    return split / t + (2 * d * kv_heads_per_rank(m, t) if biased else 0) + attention_replicated_params(m)


def nonmatrix_layer_params(m: ModelSpec, t: Any, ep: Any, etp: Any) -> tuple[Any, Any, Any]:
    """Per rank of TP degree t, EP ep and expert-TP etp, the parameters of (a dense layer, a MoE layer's
    non-expert part, its expert part), as _rank_param_parts counts them, that are no linear-layer weight matrix
    built by Transformer Engine: the norms, biases (attention, MLP, shared and routed experts, latent
    projections), q/k and latent norms, the MoE router (a plain parameter), the recurrent mixers' convolution,
    A, D, dt-bias and gated norm, DeepSeek-V4's hyper-connections and compressor position biases and norms.
    t = ep = etp = 1 gives whole layers. Derived: docs/formulas.md#mem.nonmatrix_params"""
    attn = attention_share(m) * attention_nonmatrix_per_rank(m, t) + mean_recurrent_nonmatrix_params(m) / t \
        + norms_per_layer(m) * norm_params(m) + replicated_nonmatrix_params(m)
    dense = attn + dense_mlp_share(m) * mlp_bias_per_rank(m, m.intermediate_size, t)
    moe = attn + router_params(m) + (mlp_bias_per_rank(m, m.shared_ffn, t) if m.shared_ffn else 0) \
        + latent_bias_params(m)
    expert = (m.num_experts / ep) * mlp_bias_per_rank(m, m.expert_ffn, etp, m.expert_width) if m.is_moe else 0 * t
    return dense, moe, expert


def padded_vocab(V: int, t: int, divisor: int = 128) -> int:
    """Vocabulary rows after Megatron's padding to a multiple of divisor x t (an upper bound for launchers
    that do not pad). Source: Megatron-LM megatron/training/vocab_utils.py (vocabulary padded to a multiple of 128 x
    tp)."""
    if isinstance(t, np.ndarray) and t.dtype.kind == "i" and t.size > PADDED_TABLE and 1 <= t.min() <= t.max() < 4096:
        units = divisor * np.arange(int(t.max()) + 1, dtype=t.dtype)  # plan arrays: a few small tp values
        units[0] = 1
        return (-(-V // units) * units)[t]  # the same integers, one lookup per plan instead of a division
    unit = divisor * t
    return -(-V // unit) * unit  # ceil division; elementwise on arrays


PADDED_TABLE = 64
"""padded_vocab looks arrays of more TP degrees than this up in a table of every degree up to their largest."""


def vocab_shard_params(m: ModelSpec, t: Any) -> Any:
    """Parameters of one TP rank's shard of a vocabulary-sized matrix (the word embedding or the output layer):
    V·h / t with V padded (padded_vocab; VocabParallelEmbedding and the column-parallel output layer split its
    rows over TP). padded_vocab(V, t) is a multiple of t, so the division is exact. Elementwise on arrays of t.
    Source: Megatron-LM megatron/core/tensor_parallel/layers.py (VocabParallelEmbedding).
    Derived: docs/formulas.md#params.rank"""
    return padded_vocab(m.vocab_size, t) * m.hidden_size / t


def whole_embedding(m: ModelSpec, plan: PlanLike) -> Any:
    """Whether each TP rank holds the input word embedding whole (ParallelPlan.tp_whole_embedding on an untied
    embedding at tp > 1; a tied one shares the vocabulary-parallel head's shard). Elementwise on arrays of tp.
    Source: deepspeedai/DeepSpeed v0.19.8 deepspeed/runtime/engine.py (the training AutoTP path converts the
    Hugging Face tp_plan) and module_inject/auto_tp.py (_replace_module leaves an nn.Embedding whole unless a
    non-SKIP spec matches it; _create_vocab_parallel_layer shards a tied one with the head)."""
    whole = bool(getattr(plan, "tp_whole_embedding", False))  # a ServePlan has none: serving splits it
    return (plan.tp > 1) & whole & (not m.tie_word_embeddings)


def input_embedding_params(m: ModelSpec, plan: PlanLike) -> Any:
    """Parameters of one TP rank's word embedding: V·h whole under whole_embedding (unpadded: AutoTP pads
    nothing), else its vocabulary shard (vocab_shard_params). Elementwise on arrays of tp.
    Derived: docs/formulas.md#params.rank"""
    return where(whole_embedding(m, plan), m.vocab_size * m.hidden_size, vocab_shard_params(m, plan.tp))


def rank_params(m: ModelSpec, plan: PlanLike, stage: Any) -> RankParams:
    """Parameters held by one rank of pipeline stage `stage` (see _rank_params)."""
    return per_distinct(plan, LAYOUT_AXES + ("tp", "ep", "etp_resolved"), stage, lambda p, i: _rank_params(m, p, i))


def paired_rank_params(m: ModelSpec, plan: PlanLike, stage: Any) -> RankParams:
    """Parameters of the rank that holds stage `stage` and stage pp-1-stage (a schedule with param_copies 2,
    DualPipe): both stages' layers; the rank of stages 0 and pp-1 holds the embedding and the output layer
    side by side, and a tied embedding once (one tensor serves both ends, as DeepSeek-V3's MTP module shares
    the main model's embedding and output head on that rank). Source: DeepSeek-V3 report (arXiv 2412.19437)
    §3.2.3 "Shared Embedding and Output Head for Multi-Token Prediction"; deepseek-ai/DualPipe README.
    Derived: docs/formulas.md#mem.inflight"""
    mirror = plan.pp - 1 - stage
    a, b = rank_params(m, plan, stage), rank_params(m, plan, mirror)
    ends = (stage == 0) | (mirror == 0)
    tied = where(ends, vocab_shard_params(m, plan.tp), 0) \
        * (1 if m.tie_word_embeddings else 0)
    return RankParams(dense=a.dense + b.dense - tied, expert=a.expert + b.expert)


def stepped_rank_params(m: ModelSpec, plan: PlanLike, stage: Any) -> RankParams:
    """Parameters whose gradients one rank of pipeline stage `stage` reduces and whose optimizer step it runs: its
    stage's (rank_params), and under a schedule with two parameter copies (DualPipe) the paired stage's too
    (paired_rank_params). Derived: docs/formulas.md#step.stage_tail"""
    if schedule_of(plan).param_copies == 2:
        return paired_rank_params(m, plan, stage)
    return rank_params(m, plan, stage)


def _rank_params(m: ModelSpec, plan: PlanLike, stage: Any) -> RankParams:
    """Parameters held by one rank of pipeline stage `stage`: its layers sharded by TP (norms and router
    replicated), experts split by EP and expert-TP, the embedding on the first stage and the output layer
    on the last (a tied embedding keeps a copy on the last stage when pp > 1, as Megatron does); MTP modules by
    their weight sets (stage_weight_layers, stage_mtp_weight_sets: one under mtp_repeated_layer).

    Derived: docs/formulas.md#params.rank"""
    n_dense, n_moe = stage_weight_layers(m, plan, stage)
    dense_layer, moe_layer, expert_layer, embedding, head, mtp_extra = memoized(
        plan, ("rank_param_parts", m), lambda: _rank_param_parts(m, plan))
    first = where(stage == 0, embedding, 0)
    last = where(stage == plan.pp - 1, head, 0)
    return RankParams(dense=n_dense * dense_layer + n_moe * moe_layer + first + last
                      + stage_mtp_weight_sets(m, plan, stage) * mtp_extra, expert=n_moe * expert_layer)


def mtp_block_extra_params(m: ModelSpec, plan: PlanLike) -> Any:
    """What one MTP module's block holds on a rank beyond the layer stage_layers counts it as (an average MoE
    layer, or dense layer without experts): mtp_block_params_per_rank less that layer's non-expert part, as
    _rank_params adds it per module of the stage. Derived: docs/formulas.md#params.rank"""
    return memoized(plan, ("rank_param_parts", m), lambda: _rank_param_parts(m, plan))[5]


def word_embedding_on_rank(m: ModelSpec, plan: PlanLike, stage: Any) -> Any:
    """The word embedding's parameters on one rank of pipeline stage `stage`: V·h / t on the first stage, V
    padded as the rank holds it (padded_vocab; VocabParallelEmbedding splits it over TP; whole under
    whole_embedding), none elsewhere. One
    parameter: the DP buckets never split it (cost.exposure.bucket_share).
    Derived: docs/formulas.md#step.dp_last_bucket"""
    return where(stage == 0, input_embedding_params(m, plan), 0.0)


def separate_output_layer(m: ModelSpec, plan: PlanLike) -> Any:
    """Whether the last stage holds an output layer apart from the word embedding: always with a pipeline (a
    tied embedding keeps a copy on the last stage, kept equal by an all-reduce of the two gradients), and at
    pp 1 only when the embedding is not tied (one tensor serves both ends). Elementwise on arrays of pp.
    Source: NVIDIA/Megatron-LM at 3d5f704c91, megatron/core/models/common/language_module/language_module.py
    (setup_embeddings_and_output_layer: the last stage's output_layer.weight, zeroed and all-reduced with the
    first stage's word embedding over the embedding group when pp > 1; shared_embedding_or_output_weight).
    Derived: docs/formulas.md#params.rank"""
    return where(plan.pp > 1, True, not m.tie_word_embeddings)


def stage_end_params(m: ModelSpec, plan: PlanLike, stage: Any) -> Any:
    """Parameters of one rank of pipeline stage `stage` outside its transformer layers: the embedding on the
    first stage, the final norm, output layer and MTP projections on the last (as _rank_params counts them).
    Derived: docs/formulas.md#params.rank"""
    _, _, _, embedding, head, _ = memoized(plan, ("rank_param_parts", m), lambda: _rank_param_parts(m, plan))
    return where(stage == 0, embedding, 0) + where(stage == plan.pp - 1, head, 0)


def layer_params(m: ModelSpec, plan: PlanLike) -> tuple[Any, Any]:
    """Parameters of one rank's share of (a dense layer, a MoE layer: its non-expert part and its experts), as
    _rank_params counts a stage's layers. Derived: docs/formulas.md#params.rank"""
    dense_layer, moe_layer, expert_layer, _, _, _ = memoized(
        plan, ("rank_param_parts", m), lambda: _rank_param_parts(m, plan))
    return dense_layer, moe_layer + expert_layer


def _rank_param_parts(m: ModelSpec, plan: PlanLike) -> tuple[Any, Any, Any, Any, Any, Any]:
    """Per rank: a dense layer, a MoE layer's non-expert part, its expert part, the first stage's embedding,
    the last stage's norm, output layer and MTP projections, and what one MTP module's block holds beyond the
    layer stage_layers counts it as (stage-independent, computed once per plan)."""
    t, etp, h = plan.tp, plan.etp_resolved, m.hidden_size
    # A hybrid stack's average layer: its share of attention, its mean recurrent mixer (split by t, as
    # Megatron-LM's MambaMixer splits heads and groups), its norms (mixers.py).
    attn = attention_share(m) * attention_params_per_rank(m, t) + mean_recurrent_params(m) / t \
        + norms_per_layer(m) * norm_params(m) \
        + replicated_layer_params(m)  # DeepSeek-V4's compressors and hyper-connections (cost.compressed)
    dense_layer = attn + dense_mlp_share(m) * mlp_params_per_rank(m, m.intermediate_size, t)
    moe_layer = attn + router_params(m) + (mlp_params_per_rank(m, m.shared_ffn, t) if m.shared_ffn else 0) \
        + latent_proj_params(m)  # replicated on every TP rank
    expert_layer = (m.num_experts / plan.ep) * mlp_params_per_rank(m, m.expert_ffn, etp, m.expert_width) \
        if m.is_moe else 0 * t
    vocab = vocab_shard_params(m, t)
    positions = m.max_position_embeddings * h if m.learned_position_embeddings else 0
    has_output = separate_output_layer(m, plan)
    mtp_proj = mtp_weight_sets(m) * mtp_projection_params(m, t)  # one set under mtp_repeated_layer
    head = norm_params(m) + where(has_output, vocab, 0) + mtp_proj + hc_head_params(m)
    mtp_extra = mtp_block_params_per_rank(m, t) - (moe_layer if m.is_moe else dense_layer)
    embedding = input_embedding_params(m, plan) + positions
    return dense_layer, moe_layer, expert_layer, embedding, head, mtp_extra
