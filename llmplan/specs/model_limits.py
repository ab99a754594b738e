"""What a model's raw mapping is refused for before validation: a size beyond any real model (MODEL_LIMITS) or
a per-layer kind llmplan does not model."""

from __future__ import annotations

from typing import Any, get_args

from llmplan.errors import bounded_list
from llmplan.fileio import excerpt
from llmplan.specs.model_kinds import LayerType

# Sizes beyond any real model: a value above these is a typo or a broken file, refused with the field named.
MODEL_LIMITS: dict[str, float] = {
    "hidden_size": 262_144, "intermediate_size": 4_194_304, "num_hidden_layers": 4_096,
    "num_attention_heads": 4_096, "num_key_value_heads": 4_096, "head_dim": 8_192, "vocab_size": 16_777_216,
    "max_position_embeddings": 1 << 30, "sliding_window": 1 << 30, "num_experts": 65_536,
    "num_experts_per_tok": 1_024, "moe_intermediate_size": 4_194_304, "n_shared_experts": 1_024,
    "shared_expert_intermediate_size": 4_194_304, "first_k_dense_replace": 4_096, "q_lora_rank": 262_144,
    "kv_lora_rank": 262_144, "num_nextn_predict_layers": 16, "routed_scaling_factor": 100,
    "qk_nope_head_dim": 8_192, "qk_rope_head_dim": 8_192, "v_head_dim": 8_192,
    "declared_params": 1e15,
    "mamba_num_heads": 65_536, "mamba_head_dim": 8_192, "ssm_state_size": 65_536, "n_groups": 65_536,
    "conv_kernel": 1_024, "linear_num_key_heads": 65_536, "linear_num_value_heads": 65_536,
    "linear_key_head_dim": 8_192, "linear_value_head_dim": 8_192, "linear_conv_kernel_dim": 1_024,
    "attention_chunk_size": 1 << 30, "mamba_chunk_size": 65_536, "index_topk": 1 << 30, "index_n_heads": 4_096,
    "index_head_dim": 8_192, "moe_latent_size": 262_144,
}


def beyond_limits(data: dict[str, Any]) -> str | None:
    """The first size in `data` beyond MODEL_LIMITS, as a message; None when all are within."""
    for key, limit in MODEL_LIMITS.items():
        value = data.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) > limit:
            return f"{key} {value:.3g} is beyond any model llmplan plans for (at most {limit:,.0f})"
    return None


def unknown_layer_types(kinds: Any) -> str | None:
    """A message naming the layer_types entries llmplan does not model (one line, whatever the layer count)."""
    return unknown_kinds("layer_types", kinds, get_args(LayerType))


def unknown_kinds(field: str, kinds: Any, known: tuple[str, ...]) -> str | None:
    """A message naming the entries of list field `field` that are not among `known` (None when all are)."""
    if not isinstance(kinds, (list, tuple)):
        return None
    unknown = list(dict.fromkeys(excerpt(repr(k), 40) for k in kinds if k not in known))
    if not unknown:
        return None
    return (f"{field} holds {bounded_list(unknown)}, which llmplan does not model; each layer must be one of "
            f"{', '.join(known)}")
