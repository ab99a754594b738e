"""The architectures, per-layer token mixers and per-layer blocks llmplan models (Hugging Face names), and the
field groups each kind needs."""

from __future__ import annotations

from typing import Literal, get_args

ModelType = Literal[
    "gpt",
    "gpt2",
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "deepseek_v3",
    "gemma2",
    "gemma3_text",
    "phi3",
    "gpt_oss",
    "bloom",
    "nemotron_h",
    "qwen3_next",
    "qwen3_5",
    "qwen3_5_moe",
    "llama4",
    "deepseek_v32",
    "deepseek_v4",
    "minimax_m1",
    "minimax_text_01",
]
"""The model_type values llmplan models (Hugging Face names; 'gpt': a plain Megatron-style GPT)."""
SUPPORTED_MODEL_TYPES: tuple[str, ...] = get_args(ModelType)

LayerType = Literal["sliding_attention", "full_attention", "chunked_attention", "compressed_sparse_attention",
                    "heavily_compressed_attention", "linear_attention", "mamba", "none"]
"""The per-layer token mixers llmplan models: Hugging Face layer_types values (full, sliding-window and Gated
DeltaNet linear attention as Qwen3-Next names it), chunked local attention (Llama 4), a Mamba-2 SSM mixer
(Nemotron-H's 'M' blocks), DeepSeek-V4's compressed attention (Hugging Face deepseek_v4 names: a sliding window plus
keys compressed compress_rate_csa to one and picked by an indexer, or compress_rate_hca to one and all attended)
and none (a layer that is only an MLP or MoE: Nemotron-H's '-' and 'E' blocks)."""
MlpType = Literal["dense", "moe", "none"]
"""What follows a layer's mixer: a dense MLP, the routed experts (+ shared), or nothing (Nemotron-H's 'M' and
'*' blocks are mixer-only)."""
ATTENTION_KINDS = ("full_attention", "sliding_attention", "chunked_attention", "compressed_sparse_attention",
                   "heavily_compressed_attention")
"""layer_types that are softmax attention over cached keys (they hold a KV cache in serving)."""
COMPRESSED_KINDS = ("compressed_sparse_attention", "heavily_compressed_attention")
"""layer_types whose attention adds compressed keys to a sliding window (DeepSeek-V4's CSA and HCA)."""
RECURRENT_KINDS = ("mamba", "linear_attention")
"""layer_types whose mixer is a recurrence: a fixed-size state per sequence replaces the KV cache."""
MAMBA_FIELDS = ("mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups")
LINEAR_FIELDS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim")

ROUTING_FIELDS = ("scoring_func", "norm_topk_prob", "routed_scaling_factor", "expert_bias")
"""How a MoE router scores, picks and weights experts, beyond top-k and the group limit (defaults: softmax,
renormalised weights, factor 1, no bias)."""
