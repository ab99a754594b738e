"""Hugging Face config.json -> llmplan model-spec fields (a pure mapping; no file access).

Field names per architecture: Hugging Face transformers configuration_*.py field names
"""

from __future__ import annotations

from itertools import takewhile
from typing import Any

from llmplan.fileio import excerpt
from llmplan.specs.model import SUPPORTED_MODEL_TYPES, ModelSpec, beyond_limits, loose_value

COMMON = (
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "head_dim", "vocab_size", "max_position_embeddings", "tie_word_embeddings", "attention_bias", "mlp_bias",
    "rope_theta", "rope_scaling", "sliding_window", "layer_types", "first_k_dense_replace", "q_lora_rank",
    "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "num_experts_per_tok",
    "moe_intermediate_size", "n_shared_experts", "shared_expert_intermediate_size", "attention_dropout",
    "hidden_dropout", "num_nextn_predict_layers", "n_group", "topk_group", "routed_scaling_factor",
    "norm_topk_prob", "mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups", "conv_kernel",
    "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
    "linear_conv_kernel_dim", "attention_chunk_size", "index_topk", "index_n_heads", "index_head_dim",
    "moe_latent_size", "swiglu_limit",
)
TIED_BY_DEFAULT = {"gemma2", "gemma3_text", "gpt2", "bloom"}
EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
QWEN3_5_TYPES = {"qwen3_5": "qwen3_5", "qwen3_5_text": "qwen3_5", "qwen3_5_moe": "qwen3_5_moe",
                 "qwen3_5_moe_text": "qwen3_5_moe"}
"""Qwen3.5's config.json model types (the multimodal file and its text_config, dense and MoE) -> the llmplan
model_type of its language model (Hugging Face transformers models/qwen3_5/configuration_qwen3_5.py and
models/qwen3_5_moe/configuration_qwen3_5_moe.py: Qwen3_5TextConfig, Qwen3_5MoeTextConfig, base_config_key
"text_config")."""
GATED_DELTANET_TYPES = ("qwen3_next", "qwen3_5", "qwen3_5_moe")
"""The architectures of Gated DeltaNet layers with gated full attention every few layers (Qwen3-Next, Qwen3.5)."""


def from_hf_config(cfg: dict[str, Any], default_name: str) -> dict[str, Any]:
    """Fields for ModelSpec from a config.json mapping. Raises ValueError for unsupported architectures."""
    if cfg.get("model_type") == "gemma3" and isinstance(cfg.get("text_config"), dict):
        cfg = {"model_type": "gemma3_text", **cfg["text_config"]}
    if cfg.get("model_type") in ("llama4", "llama4_text"):  # the language model of Llama 4 (text_config)
        cfg = {**(cfg["text_config"] if isinstance(cfg.get("text_config"), dict) else cfg), "model_type": "llama4"}
    if cfg.get("model_type") in QWEN3_5_TYPES:
        cfg = _qwen3_5_text(cfg)
    mt = cfg.get("model_type")
    if mt not in SUPPORTED_MODEL_TYPES or mt == "gpt":
        supported = ", ".join(t for t in SUPPORTED_MODEL_TYPES if t != "gpt")
        raise ValueError(f"model_type '{mt}' is not supported; supported Hugging Face model types: {supported}")
    if mt == "nemotron_h":
        cfg = _nemotron_h_blocks(cfg)
    if mt == "deepseek_v4" and cfg.get("intermediate_size") is None:  # the shared expert's width is the MoE one
        cfg = {**cfg, "intermediate_size": cfg.get("moe_intermediate_size")}
    if mt == "qwen3_5_moe" and cfg.get("intermediate_size") is None:  # every layer MoE: no dense width in the file
        width = cfg.get("shared_expert_intermediate_size") or cfg.get("moe_intermediate_size")
        cfg = {**cfg, "intermediate_size": width}
    cfg = _checked(cfg, mt)
    if mt == "llama4":
        cfg = _llama4(cfg)
    if mt in ("minimax_m1", "minimax_text_01"):
        cfg = _minimax(cfg)
    if mt == "gpt2":
        cfg = _gpt2(cfg)
    if mt == "bloom":
        cfg = _bloom(cfg)
    out: dict[str, Any] = {k: cfg[k] for k in COMMON if cfg.get(k) is not None}
    out["name"] = str(cfg.get("_name_or_path") or default_name).rstrip("/").split("/")[-1] or default_name
    out["source"] = f"Hugging Face config.json ({cfg.get('_name_or_path') or default_name})"
    out["model_type"] = mt
    # Nemotron-H names its MLP's activation mlp_hidden_act (none named: the spec implies relu2, model.mlp_activation);
    # Gemma's configs carry both hidden_act and hidden_activation, and transformers' Gemma MLPs read hidden_activation
    act_keys = (("mlp_hidden_act",) if mt == "nemotron_h" else
                ("hidden_activation", "hidden_act") if str(mt).startswith("gemma") else
                ("hidden_act", "hidden_activation", "activation_function"))
    act = next((cfg[k] for k in act_keys if isinstance(cfg.get(k), str)), None)
    if isinstance(act, str):
        out["hidden_act"] = act
    out.setdefault("tie_word_embeddings", mt in TIED_BY_DEFAULT)
    if out.get("rope_theta") is None and isinstance(cfg.get("rope_parameters"), dict):
        out["rope_theta"] = cfg["rope_parameters"].get("rope_theta")
        out["rope_scaling"] = cfg["rope_parameters"]
        out = {k: v for k, v in out.items() if v is not None}
    out.update(_attention_layers(cfg, mt) if mt != "deepseek_v4" else _deepseek_v4(cfg))
    out.update(_hybrid_layers(cfg, mt))
    if out.get("sliding_window") is None:
        out.pop("sliding_window", None)
    experts = next((cfg[k] for k in EXPERT_COUNT_KEYS if cfg.get(k)), 0)
    if experts:
        out["num_experts"] = experts
        if mt in ("mixtral", "gpt_oss", "minimax_m1", "minimax_text_01"):  # intermediate_size: per-expert width
            out.setdefault("moe_intermediate_size", cfg["intermediate_size"])
        if mt == "nemotron_h" and cfg.get("moe_shared_expert_intermediate_size"):
            out["shared_expert_intermediate_size"] = cfg["moe_shared_expert_intermediate_size"]
        # their layer lists place the MoE layers
        if mt not in ("nemotron_h", "llama4", "deepseek_v4", *GATED_DELTANET_TYPES):
            _check_sparse_layout(cfg)
        out.update(_router(cfg, mt))
    else:
        for k in ("num_experts_per_tok", "n_shared_experts", "moe_intermediate_size", "first_k_dense_replace",
                  "shared_expert_intermediate_size", "n_group", "topk_group", "routed_scaling_factor",
                  "norm_topk_prob", "moe_latent_size"):
            out.pop(k, None)
    if mt == "gpt2":
        out.update(gated_mlp=False, norm_type="layernorm", learned_position_embeddings=True)
    if mt == "bloom":
        out.update(gated_mlp=False, norm_type="layernorm", learned_position_embeddings=False, embedding_norm=True)
    if mt == "qwen2":
        out["qkv_bias"] = True
    if mt in ("qwen3", "qwen3_moe", *GATED_DELTANET_TYPES):
        out["qk_norm"] = True
    if mt in GATED_DELTANET_TYPES:
        out["attention_output_gate"] = True
    if mt in ("qwen3_5", "qwen3_5_moe") and cfg.get("mtp_num_hidden_layers"):
        # Qwen3.5's files state their MTP depth (mtp_num_hidden_layers; vLLM qwen3_5_mtp.py and Megatron-Bridge
        # model_bridge.py read it as the MTP layer count, mtp_num_hidden_layers -> mtp_num_layers)
        out["num_nextn_predict_layers"] = cfg["mtp_num_hidden_layers"]
    if mt == "qwen3_next":
        # The release ships one MTP module (mtp.* tensors) its config.json does not declare; vLLM's
        # Qwen3NextMultiTokenPredictor builds num_nextn_predict_layers of them, 1 when the key is absent
        # (vllm-project/vllm vllm/model_executor/models/qwen3_next_mtp.py @ffdc9857).
        out.setdefault("num_nextn_predict_layers", 1)
    if mt == "nemotron_h" and cfg.get("num_nextn_predict_layers"):
        # Megatron-Bridge runs a Nemotron-H checkpoint's MTP module repeated (mtp_use_repeated_layer: the config's
        # key where it has one, else True; NVIDIA-NeMo/Megatron-Bridge@067f987 nemotronh/nemotron_h_bridge.py)
        out["mtp_repeated_layer"] = bool(cfg.get("mtp_use_repeated_layer", True))
    if mt == "nemotron_h":  # squared-ReLU MLP (up and down projections), no biases, no position embeddings
        out.update(gated_mlp=cfg.get("mlp_hidden_act", "relu2") not in ("relu2", "relu", "gelu"),
                   mamba_chunk_size=cfg.get("chunk_size") or 128)
    if mt in ("minimax_m1", "minimax_text_01"):
        out["linear_attention_rule"] = "lightning"
    if mt == "gpt_oss":  # transformers GptOssAttention: q/k/v/o biases, per-head sinks; biased experts
        out["attention_bias"] = True
        out["mlp_bias"] = True
        out["attention_sinks"] = True
    if mt not in ("deepseek_v3", "deepseek_v32"):  # DeepSeek-V4 keeps its query rank (a plain-attention field)
        for k in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim") + \
                (("q_lora_rank",) if mt != "deepseek_v4" else ()):
            out.pop(k, None)
    if mt == "deepseek_v4":
        out = {k: v for k, v in out.items() if v is not None}
    return out


def _attention_layers(cfg: dict[str, Any], mt: str) -> dict[str, Any]:
    """sliding_window and layer_types as the architecture applies them when config.json lists no layer_types
    (older Hub files): transformers' configuration_*.py rules. Gemma 2 and GPT-OSS alternate, the even
    layers windowed; Gemma 3 windows all but every sliding_window_pattern-th layer (default 6); Mistral and
    Mixtral window every layer; Qwen 2/3 only with use_sliding_window, from layer max_window_layers on. A
    window the architecture does not use is dropped (Qwen's sliding_window with use_sliding_window false)."""
    w, n = cfg.get("sliding_window"), cfg.get("num_hidden_layers")
    if isinstance(cfg.get("layer_types"), list):
        return {"layer_types": tuple(cfg["layer_types"])}
    if not isinstance(w, int) or not isinstance(n, int) or w <= 0 or n <= 0:
        return {}
    if mt in ("gemma2", "gpt_oss"):
        windowed = [(i + 1) % 2 != 0 for i in range(n)]
    elif mt == "gemma3_text":
        pattern = int(cfg.get("sliding_window_pattern") or 6)
        windowed = [(i + 1) % pattern != 0 for i in range(n)]
    elif mt in ("mistral", "mixtral"):
        windowed = [True] * n
    elif mt in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
        if not cfg.get("use_sliding_window"):
            return {"sliding_window": None}
        first = int(cfg.get("max_window_layers") or 0)
        windowed = [i >= first for i in range(n)]
    else:
        return {}
    return {"layer_types": tuple("sliding_attention" if x else "full_attention" for x in windowed)}


NEMOTRON_H_BLOCKS = {"M": ("mamba", "none"), "*": ("full_attention", "none"), "-": ("none", "dense"),
                     "E": ("none", "moe")}
"""Nemotron-H's hybrid_override_pattern symbols -> (mixer, MLP) of the block: Mamba-2, attention, MLP, MoE.
Source: Hugging Face transformers models/nemotron_h/configuration_nemotron_h.py (layers_block_type);
Megatron-LM megatron/core/ssm/mamba_hybrid_layer_allocation.py (Symbols: M, *, -, E)."""


DEEPSEEK_V4_RATIOS = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
"""DeepSeek-V4's compress_ratios entries -> the layer kind (transformers configuration_deepseek_v4.py
_COMPRESS_RATIO_TO_LAYER_TYPE; Megatron-Bridge deepseek_v4_bridge.py supports the same three)."""


def _deepseek_v4(cfg: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek-V4's config.json (transformers configuration_deepseek_v4.py, Megatron-Bridge deepseek_v4_bridge.py
    at 4ab94dfad): the per-layer compress_ratios (0 sliding window only, 4 compressed sparse, 128 heavily
    compressed; entries past num_hidden_layers are the MTP layers') or the newer layer_types and compress_rates,
    num_hash_layers (or mlp_layer_types' leading hash_moe), one shared key/value head, the grouped output
    projection and the hyper-connection streams; the MoE width is also the shared expert's (no
    intermediate_size in the file)."""
    n = int(cfg["num_hidden_layers"])
    ratios = cfg.get("compress_ratios")
    if isinstance(cfg.get("layer_types"), list):
        kinds = tuple(cfg["layer_types"])[:n]
    elif isinstance(ratios, list) and len(ratios) >= n:
        # an entry may be any JSON value (a list is unhashable, true equals 1): named by its repr
        unknown = sorted({repr(r) for r in ratios[:n] if type(r) is not int or r not in DEEPSEEK_V4_RATIOS})
        if unknown:
            raise ValueError(f"compress_ratios holds {', '.join(unknown)}, which DeepSeek-V4 does not define; each "
                             "layer's ratio must be 0 (sliding window), 4 (compressed sparse) or 128 (heavily "
                             "compressed)")
        kinds = tuple(DEEPSEEK_V4_RATIOS[r] for r in ratios[:n])
    else:
        raise ValueError(f"the deepseek_v4 config gives no compress_ratios for its {n} layers (nor layer_types); "
                         "DeepSeek-V4 needs one compression ratio per layer (0, 4 or 128)")
    given = cfg.get("compress_rates")
    rates: dict[str, Any] = given if isinstance(given, dict) else {}
    hash_layers = cfg.get("num_hash_layers")
    if hash_layers is None and isinstance(cfg.get("mlp_layer_types"), list):
        hash_layers = sum(1 for _ in takewhile(lambda k: k == "hash_moe", cfg["mlp_layer_types"]))
    # qk_norm: every query head RMS-normalised (no weight) after its up-projection, the shared key/value head by
    # kv_norm (Megatron-LM deepseek_v4_hybrid_attention.py at 1e23526adc: _q_rms_norm, kv_layernorm)
    return {"layer_types": kinds, "shared_key_value": True, "qk_norm": True, "num_hash_layers": int(hash_layers or 0),
            "hc_mult": int(cfg.get("hc_mult") or 1), "o_groups": cfg.get("o_groups"),
            "o_lora_rank": cfg.get("o_lora_rank"),
            # as given: ModelSpec's fields check them (an int() here would fail on text without naming the key)
            "compress_rate_csa": rates.get("compressed_sparse_attention") or cfg.get("compress_rate_csa") or 4,
            "compress_rate_hca": rates.get("heavily_compressed_attention") or cfg.get("compress_rate_hca") or 128}


NEMOTRON_H_BLOCK_NAMES = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}
"""Nemotron-H's layers_block_type entries -> their hybrid_override_pattern symbol. Source: Hugging Face
transformers models/nemotron_h/configuration_nemotron_h.py (layers_block_type); NVIDIA-NeMo/Nemotron
usage-cookbook/Nemotron-3-Ultra/RL/create_ultra_new_to_old_overlay.py (BLOCK_TO_PATTERN)."""


def _nemotron_h_blocks(cfg: dict[str, Any]) -> dict[str, Any]:
    """A nemotron_h config.json that lists its blocks (layers_block_type, num_hidden_layers null: the
    Nemotron-3 Ultra files) in the pattern form the reader prices: one symbol per block, the list's length as
    num_hidden_layers (a stated one must agree). A config with hybrid_override_pattern is read as it is."""
    blocks = cfg.get("layers_block_type")
    if cfg.get("hybrid_override_pattern") or blocks is None:
        return cfg
    if not isinstance(blocks, list) or not blocks:
        raise ValueError(f"layers_block_type is {excerpt(repr(blocks))}, not a list of block names; give one name per "
                         f"layer, such as [\"mamba\", \"moe\", \"attention\"], or hybrid_override_pattern")
    unknown = sorted({str(b) for b in blocks} - set(NEMOTRON_H_BLOCK_NAMES))
    if unknown:
        raise ValueError(f"layers_block_type holds {', '.join(repr(b) for b in unknown)}; llmplan models the "
                         f"blocks {', '.join(NEMOTRON_H_BLOCK_NAMES)} (Mamba-2, attention, MLP, MoE)")
    n = cfg.get("num_hidden_layers")
    if n is not None and n != len(blocks):
        raise ValueError(f"layers_block_type lists {len(blocks)} blocks but num_hidden_layers is {excerpt(repr(n))}; "
                         "give one name per layer")
    return {**cfg, "hybrid_override_pattern": "".join(NEMOTRON_H_BLOCK_NAMES[str(b)] for b in blocks),
            "num_hidden_layers": len(blocks)}


def _llama4(cfg: dict[str, Any]) -> dict[str, Any]:
    """Llama 4's text model (transformers' Llama4TextConfig): intermediate_size is the expert width and
    intermediate_size_mlp the dense layers'; MoE layers every interleave_moe_layer_step-th (moe_layers when
    given), each with one shared expert of the expert width; chunked attention (attention_chunk_size) except on
    the no-RoPE layers (no_rope_layers 0; by default, or when the list is empty, every 4th: Llama4TextConfig
    `no_rope_layers if no_rope_layers else default`), which attend to the whole context; a sigmoid top-k router
    whose weights are not renormalised."""
    n, step = cfg.get("num_hidden_layers"), cfg.get("interleave_moe_layer_step") or 1
    if not isinstance(n, int) or n <= 0:
        return cfg
    if not isinstance(step, int) or step < 1:
        raise ValueError(f"interleave_moe_layer_step is {excerpt(repr(step))}; it must be a whole number >= 1 "
                         "(every step-th layer is MoE)")
    given = cfg.get("moe_layers")
    moe: set[Any] = set(given) if isinstance(given, list) else set(range(step - 1, n, step))
    outside = sorted(i for i in moe if not 0 <= i < n)
    if outside:
        raise ValueError(f"moe_layers holds {excerpt(repr(outside))}, outside layers 0-{n - 1} "
                         f"(num_hidden_layers {n}); give layer indices below num_hidden_layers")
    listed = cfg.get("no_rope_layers") or None  # [] (the published Scout file): the default, as transformers reads it
    if isinstance(listed, list) and len(listed) != n:
        raise ValueError(f"no_rope_layers lists {len(listed)} layers but num_hidden_layers is {n}; give one 0 or 1 "
                         "per layer")
    rope: list[Any] = listed if isinstance(listed, list) else [int((i + 1) % 4 != 0) for i in range(n)]
    chunked = cfg.get("attention_chunk_size") is not None
    kinds = cfg.get("layer_types") if isinstance(cfg.get("layer_types"), list) else \
        ["chunked_attention" if r and chunked else "full_attention" for r in rope]
    experts = cfg.get("num_local_experts") or 0
    return {**cfg, "intermediate_size": cfg.get("intermediate_size_mlp") or cfg.get("intermediate_size"),
            "moe_intermediate_size": cfg.get("intermediate_size"),
            "shared_expert_intermediate_size": cfg.get("intermediate_size") if experts else None,
            "layer_types": kinds, "_mlp_layer_types": ["moe" if i in moe and experts else "dense" for i in range(n)],
            "scoring_func": "sigmoid", "norm_topk_prob": False}


MINIMAX_ATTN_TYPES = {0: "linear_attention", 1: "full_attention"}
"""MiniMax-Text-01 / M1 attn_type_list entries -> layer_types: 0 lightning attention, 1 softmax attention.
Source: MiniMaxAI/MiniMax-M1 modeling_minimax_m1.py (MiniMaxM1DecoderLayer: attn_type 0 builds
MiniMaxM1LightningAttention); MiniMax-01 (arXiv 2501.08313) §2 (a softmax layer after every 7 lightning)."""


def _minimax(cfg: dict[str, Any]) -> dict[str, Any]:
    """MiniMax-Text-01 / M1 (configuration_minimax_m1.py): attn_type_list gives each layer's mixer; the lightning
    layers have num_attention_heads heads of head_dim for q, k and v; every layer is MoE (num_local_experts,
    intermediate_size the expert width, softmax top-k renormalised as Mixtral)."""
    n, kinds = cfg.get("num_hidden_layers"), cfg.get("attn_type_list")
    if not isinstance(kinds, list) or len(kinds) != n or any(k not in MINIMAX_ATTN_TYPES for k in kinds):
        raise ValueError(f"the {cfg.get('model_type')} config's attn_type_list must give 0 (lightning) or 1 "
                         f"(softmax attention) for each of its num_hidden_layers ({n}) layers")
    heads = cfg["num_attention_heads"]
    d = cfg.get("head_dim") or cfg["hidden_size"] // heads
    return {**cfg, "layer_types": [MINIMAX_ATTN_TYPES[k] for k in kinds], "linear_num_key_heads": heads,
            "linear_num_value_heads": heads, "linear_key_head_dim": d, "linear_value_head_dim": d}


def _hybrid_layers(cfg: dict[str, Any], mt: str) -> dict[str, Any]:
    """layer_types and mlp_layer_types of the hybrid architectures: Nemotron-H's hybrid_override_pattern, one
    symbol per block (NEMOTRON_H_BLOCKS); Qwen3-Next's and Qwen3.5's layer_types, or every
    full_attention_interval-th layer full attention and the others Gated DeltaNet (transformers' Qwen3NextConfig
    and Qwen3_5(Moe)TextConfig default), every layer MoE when the model has experts unless decoder_sparse_step /
    mlp_only_layers say otherwise (Qwen3.5-MoE: every layer; dense Qwen3.5: none)."""
    n = cfg.get("num_hidden_layers")
    if mt == "nemotron_h":
        pattern = cfg.get("hybrid_override_pattern")
        if not isinstance(pattern, str) or not pattern:
            raise ValueError("the nemotron_h config has no hybrid_override_pattern; a config.json of this "
                             "architecture states it (one of M, *, -, E per layer)")
        bad = sorted(set(pattern) - set(NEMOTRON_H_BLOCKS))
        if bad:
            raise ValueError(f"hybrid_override_pattern holds {', '.join(repr(c) for c in bad)}; llmplan models "
                             f"the blocks {', '.join(NEMOTRON_H_BLOCKS)} (Mamba-2, attention, MLP, MoE)")
        if len(pattern) != n:
            raise ValueError(f"hybrid_override_pattern has {len(pattern)} symbols but num_hidden_layers is {n}; "
                             "give one symbol per layer")
        return {"layer_types": tuple(NEMOTRON_H_BLOCKS[c][0] for c in pattern),
                "mlp_layer_types": tuple(NEMOTRON_H_BLOCKS[c][1] for c in pattern)}
    if mt == "llama4" and isinstance(cfg.get("_mlp_layer_types"), list):
        return {"layer_types": tuple(cfg["layer_types"]), "mlp_layer_types": tuple(cfg["_mlp_layer_types"])}
    if mt in GATED_DELTANET_TYPES and isinstance(n, int):
        if not isinstance(cfg.get("layer_types"), list):
            every = int(cfg.get("full_attention_interval") or 4)
            kinds = tuple("full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n))
        else:
            kinds = tuple(cfg["layer_types"])
        step, dense = int(cfg.get("decoder_sparse_step") or 1), set(cfg.get("mlp_only_layers") or ())
        moe = [i not in dense and cfg.get("num_experts", 0) > 0 and (i + 1) % step == 0 for i in range(n)]
        return {"layer_types": kinds, "mlp_layer_types": tuple("moe" if x else "dense" for x in moe)}
    return {}


def _qwen3_5_text(cfg: dict[str, Any]) -> dict[str, Any]:
    """Qwen3.5's language model: the multimodal file's text_config (Qwen3_5MoeConfig / Qwen3_5Config nest it;
    tie_word_embeddings also sits at the top), or a text-only file as it is, under the llmplan model_type
    (QWEN3_5_TYPES). Its vision encoder is not modelled."""
    text = cfg.get("text_config")
    inner = text if isinstance(text, dict) else cfg
    out = {**inner, "model_type": QWEN3_5_TYPES[str(cfg["model_type"])]}
    if "tie_word_embeddings" not in inner and "tie_word_embeddings" in cfg:
        out["tie_word_embeddings"] = cfg["tie_word_embeddings"]
    if cfg.get("_name_or_path"):
        out["_name_or_path"] = cfg["_name_or_path"]
    return out


def _router(cfg: dict[str, Any], mt: str) -> dict[str, Any]:
    """scoring_func, norm_topk_prob and expert_bias as the architecture routes when config.json leaves them
    out (transformers' configuration_*.py and modeling_*.py): DeepSeek-V3 scores with a sigmoid, adds the
    e_score_correction_bias (topk_method "noaux_tc") and renormalises; Qwen2/3-MoE's config classes default
    norm_topk_prob to false (the published Qwen3-MoE files set true); Mixtral and gpt-oss softmax over the
    chosen experts (renormalised, no key)."""
    # Nemotron-3: sigmoid router with expert bias
    deepseek = mt in ("deepseek_v3", "deepseek_v32", "deepseek_v4", "nemotron_h")
    if mt == "llama4":  # sigmoid of the top-k logits, not renormalised, no bias (Llama4Router)
        return {"scoring_func": "sigmoid", "norm_topk_prob": False, "expert_bias": False, **_balance_loss(cfg)}
    norm_default = mt not in ("qwen2_moe", "qwen3_moe", "qwen3_next")
    # Qwen3.5-MoE's Qwen3_5MoeTopKRouter renormalises the top-k weights unconditionally (no norm_topk_prob key)
    return {"scoring_func": cfg.get("scoring_func") or ("sigmoid" if deepseek else "softmax"),
            "norm_topk_prob": cfg.get("norm_topk_prob", norm_default)
            if mt not in ("mixtral", "gpt_oss", "minimax_m1", "minimax_text_01", "qwen3_5_moe") else True,
            "expert_bias": (cfg.get("topk_method") or ("noaux_tc" if deepseek else "greedy")) == "noaux_tc",
            **_balance_loss(cfg)}


def _balance_loss(cfg: dict[str, Any]) -> dict[str, Any]:
    """router_aux_loss_coef (DeepSeek's aux_loss_alpha: the same coefficient, as Megatron-Bridge's CONFIG_MAPPING
    maps both to moe_aux_loss_coeff, NVIDIA-NeMo/Megatron-Bridge@067f987 models/conversion/model_bridge.py) and
    seq_aux, where config.json gives them."""
    coef = cfg.get("router_aux_loss_coef", cfg.get("aux_loss_alpha"))
    return {**({} if coef is None else {"router_aux_loss_coef": coef}), "seq_aux": bool(cfg.get("seq_aux", False))}


ALIASES: dict[str, dict[str, str]] = {
    "gpt2": {"n_embd": "hidden_size", "n_inner": "intermediate_size", "n_layer": "num_hidden_layers",
             "n_head": "num_attention_heads", "n_positions": "max_position_embeddings",
             "attn_pdrop": "attention_dropout", "resid_pdrop": "hidden_dropout"},
    "bloom": {"n_embed": "hidden_size", "n_layer": "num_hidden_layers", "n_head": "num_attention_heads",
              "seq_length": "max_position_embeddings"},
}
"""Architecture-specific config.json names -> the llmplan (Hugging Face common) name they stand for."""
PRECEDENCE = {("bloom", "hidden_size")}
"""(model_type, key) where the common name wins over the alias (BLOOM's hidden_size over the older n_embed)."""
HF_ONLY: dict[str, type] = {"sliding_window_pattern": int, "max_window_layers": int, "decoder_sparse_step": int,
                            "num_local_experts": int, "num_experts": int, "n_routed_experts": int,
                            "use_sliding_window": bool, "full_attention_interval": int, "chunk_size": int,
                            "moe_shared_expert_intermediate_size": int, "interleave_moe_layer_step": int,
                            "intermediate_size_mlp": int, "hc_mult": int, "o_groups": int, "o_lora_rank": int,
                            "num_hash_layers": int, "mtp_num_hidden_layers": int,
                            "mtp_use_repeated_layer": bool}
"""config.json keys read here that are not ModelSpec fields, with the type they hold."""
LAYER_LISTS = ("mlp_only_layers", "moe_layers", "no_rope_layers")
"""config.json keys holding a list of whole numbers, one per layer or per layer index (Qwen3-Next's dense
layers, Llama 4's MoE layers and its no-RoPE flags), checked before sets and per-layer lists are made of them."""
REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
"""Sizes every architecture's arithmetic needs (gpt2 / bloom derive intermediate_size from hidden_size)."""


def _checked(cfg: dict[str, Any], mt: str) -> dict[str, Any]:
    """The mapping with every number typed as a number, the aliases renamed, the required sizes present and
    every size within MODEL_LIMITS, before any arithmetic or per-layer list is made from it: a quoted "768"
    would otherwise multiply as text, a missing n_embd fail as None, 20,000,000 layers allocate lists."""
    kinds = {**{k: v for k, v in ModelSpec._scalar_fields().items() if k in COMMON}, **HF_ONLY}
    aliases = ALIASES.get(mt, {})
    kinds.update({alias: kinds.get(name, int) for alias, name in aliases.items()})
    for key, kind in kinds.items():
        value = cfg.get(key)
        problem = loose_value(key, value, kind)
        if problem is None and value is not None and kind is not bool and not isinstance(value, (int, float)):
            problem = f"{key} is {excerpt(repr(value), 40)}, not a number; give {key} as a number"
        if problem:
            raise ValueError(problem)
    for key in LAYER_LISTS:
        value = cfg.get(key)
        if value is not None and (not isinstance(value, list)
                                  or any(not isinstance(x, int) or isinstance(x, bool) for x in value)):
            raise ValueError(f"{key} is {excerpt(repr(value), 40)}, not a list of whole numbers; give {key} as a "
                             "list such as [0, 3]")
    out = dict(cfg)
    for alias, name in aliases.items():
        if cfg.get(alias) is not None and not ((mt, name) in PRECEDENCE and cfg.get(name) is not None):
            out[name] = cfg[alias]
    derived = {"intermediate_size"} if mt in ("gpt2", "bloom") else set()
    missing = [k for k in REQUIRED if out.get(k) is None and k not in derived]
    if missing:
        names = ", ".join(" or ".join([*(a for a, n in aliases.items() if n == k), k]) for k in missing)
        raise ValueError(f"the {mt} config has no {names}; a config.json of this architecture states "
                         f"{'them' if len(missing) > 1 else 'it'} (add the key with the model's value)")
    problem = beyond_limits(out)
    if problem:
        raise ValueError(problem)
    return out


def _gpt2(cfg: dict[str, Any]) -> dict[str, Any]:
    """GPT-2 (aliases renamed by _checked) has LayerNorm, learned positions, biases, a 4h MLP unless n_inner
    says otherwise, and 0.1 dropouts by default."""
    return {**cfg, "intermediate_size": cfg.get("intermediate_size") or 4 * cfg["hidden_size"],
            "attention_bias": True, "mlp_bias": True,
            "attention_dropout": cfg.get("attention_dropout", 0.1), "hidden_dropout": cfg.get("hidden_dropout", 0.1)}


def _bloom(cfg: dict[str, Any]) -> dict[str, Any]:
    """BLOOM (transformers' BloomConfig): a 4h GELU MLP, LayerNorm, biases everywhere, ALiBi instead of position
    embeddings, so no max_position_embeddings: the training length (seq_length, 2048 for BLOOM-176B) stands
    in for it."""
    return {**cfg, "intermediate_size": 4 * cfg["hidden_size"],
            "max_position_embeddings": cfg.get("seq_length") or 2048, "attention_bias": True, "mlp_bias": True}


def _check_sparse_layout(cfg: dict[str, Any]) -> None:
    step = cfg.get("decoder_sparse_step", 1) or 1
    if step != 1 or cfg.get("mlp_only_layers"):
        raise ValueError("MoE layouts with decoder_sparse_step != 1 or mlp_only_layers are not supported yet; "
                         "only leading dense layers (first_k_dense_replace) are")

