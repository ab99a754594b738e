"""Model specs: Hugging Face config.json loading, cross-field rules, unsupported architectures."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from llmplan.cost.params import param_counts
from llmplan.errors import LlmplanError
from llmplan.specs.model import ModelSpec
from llmplan.specs.registry import builtin_models, load_model_file

# Excerpts of published config.json files (field names and values as on the Hugging Face Hub).
LLAMA31_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 128256, "max_position_embeddings": 131072, "rope_theta": 500000.0, "tie_word_embeddings": False,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "attention_bias": False, "mlp_bias": False, "rms_norm_eps": 1e-05, "torch_dtype": "bfloat16",
}
DEEPSEEK_V3 = {
    "model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1,
    "n_routed_experts": 256, "num_experts_per_tok": 8, "first_k_dense_replace": 3, "q_lora_rank": 1536,
    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "vocab_size": 129280, "max_position_embeddings": 163840, "tie_word_embeddings": False,
    "num_nextn_predict_layers": 1, "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5,
}
MIXTRAL = {
    "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
    "vocab_size": 32000, "max_position_embeddings": 32768, "rope_theta": 1e6, "tie_word_embeddings": False,
}
GPT2 = {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024,
        "vocab_size": 50257, "n_inner": None, "activation_function": "gelu_new"}
QWEN3_MOE = {
    "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
    "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
    "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936, "max_position_embeddings": 40960,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "tie_word_embeddings": False,
}


@pytest.mark.parametrize("cfg,builtin", [(LLAMA31_8B, "llama-3.1-8b"), (DEEPSEEK_V3, "deepseek-v3"),
                                         (MIXTRAL, "mixtral-8x7b"), (QWEN3_MOE, "qwen3-30b-a3b")])
def test_hf_config_gives_same_counts_as_builtin(tmp_path, cfg, builtin):
    path = tmp_path / builtin / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    m = load_model_file(path)
    assert m.name == builtin
    ours, ref = param_counts(m), param_counts(builtin_models()[builtin])
    assert ours.total == ref.total and ours.active == ref.active


def test_gpt2_config_fields(tmp_path):
    path = tmp_path / "gpt2.json"
    path.write_text(json.dumps(GPT2))
    m = load_model_file(path)
    assert (m.num_hidden_layers, m.hidden_size, m.intermediate_size, m.tie_word_embeddings) == (12, 768, 3072, True)
    assert param_counts(m).total == pytest.approx(124_439_808, rel=1e-9)  # GPT-2 small, HF safetensors total


def test_hf_rope_parameters_accepted(tmp_path):
    cfg = {k: v for k, v in LLAMA31_8B.items() if k not in ("rope_theta", "rope_scaling")}
    cfg["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cfg))
    assert load_model_file(path).rope_theta == 500000.0


def test_unsupported_model_type(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA31_8B, "model_type": "mamba"}))
    with pytest.raises(LlmplanError, match="model_type 'mamba' is not supported; supported .*llama.*deepseek_v3"):
        load_model_file(path)


def test_spec_rejects_unknown_keys_and_is_frozen():
    fields = dict(name="x", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  vocab_size=100, max_position_embeddings=128)
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        ModelSpec(**fields, hiddensize=3)
    m = ModelSpec(**fields)
    with pytest.raises(ValidationError):
        m.hidden_size = 3


@pytest.mark.parametrize("extra,needle", [
    (dict(num_attention_heads=6, num_key_value_heads=4, hidden_size=60), "multiple of num_key_value_heads"),
    (dict(num_attention_heads=5), "divisible by num_attention_heads"),
    (dict(num_experts=8, num_experts_per_tok=9), "num_experts_per_tok (9) must be between 1 and num_experts (8)"),
    (dict(kv_lora_rank=512), "MLA (kv_lora_rank set) also needs qk_nope_head_dim"),
    (dict(qk_rope_head_dim=64, v_head_dim=128), "qk_rope_head_dim, v_head_dim set without kv_lora_rank"),
])
def test_cross_field_rules(extra, needle):
    fields = dict(name="x", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  vocab_size=100, max_position_embeddings=128)
    with pytest.raises(ValidationError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        ModelSpec(**{**fields, **extra})


def test_every_builtin_names_its_source():
    for m in builtin_models().values():
        assert m.source, m.name


# Excerpts of config.json files that predate transformers' layer_types field (as on the Hugging Face Hub):
# google/gemma-2-9b, google/gemma-3-27b-it (its text_config), mistralai/Mistral-7B-v0.1, Qwen/Qwen2.5-7B.
GEMMA2_9B = {"model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336, "num_hidden_layers": 42,
             "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "vocab_size": 256000,
             "max_position_embeddings": 8192, "sliding_window": 4096}
GEMMA3_27B = {"model_type": "gemma3", "text_config": {
    "model_type": "gemma3_text", "hidden_size": 5376, "intermediate_size": 21504, "num_hidden_layers": 62,
    "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128, "vocab_size": 262208,
    "max_position_embeddings": 131072, "sliding_window": 1024, "sliding_window_pattern": 6}}
MISTRAL_7B_V01 = {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
                  "max_position_embeddings": 32768, "sliding_window": 4096, "tie_word_embeddings": False}
QWEN25_7B = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
             "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
             "max_position_embeddings": 131072, "sliding_window": 131072, "use_sliding_window": False,
             "max_window_layers": 28}


@pytest.mark.parametrize("cfg, windowed, window", [
    # transformers configuration_gemma2.py / configuration_gemma3.py / modeling_mistral.py / configuration_qwen2.py
    (GEMMA2_9B, [i % 2 == 0 for i in range(42)], 4096),            # even layers windowed
    (GEMMA3_27B, [(i + 1) % 6 != 0 for i in range(62)], 1024),     # every 6th layer full: 52 windowed, 10 full
    (MISTRAL_7B_V01, [True] * 32, 4096),                           # every layer windowed
    (QWEN25_7B, None, None),                                       # use_sliding_window false: no window
])
def test_hf_configs_without_layer_types_get_their_architecture_s_windows(tmp_path, cfg, windowed, window):
    from llmplan.cost.compute import layer_windows
    from llmplan.cost.inference import kv_bytes_per_seq_gpu
    from llmplan.specs.serve import ServePlan
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    m = load_model_file(path)
    assert m.sliding_window == window
    kept = layer_windows(m)  # (window, layers) pairs, counted once per kind
    sliding = sum(windowed) if windowed else 0
    assert kept == tuple((w, n) for w, n in ((None, m.num_hidden_layers - sliding), (window, sliding)) if n)
    if windowed:
        assert [t == "sliding_attention" for t in m.layer_types] == windowed
    # the KV cache of a 32k-token sequence keeps min(32k, window) tokens on the windowed layers
    full = m.model_copy(update={"layer_types": None})
    ratio = kv_bytes_per_seq_gpu(m, ServePlan(), 32768) / kv_bytes_per_seq_gpu(full, ServePlan(), 32768)
    expect = 1.0 if not windowed else (sum(windowed) * window + (len(windowed) - sum(windowed)) * 32768) / (
        len(windowed) * 32768)
    assert float(ratio) == pytest.approx(expect)


def test_layer_types_must_name_every_layer():
    fields = dict(name="x", hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                  vocab_size=100, max_position_embeddings=128, sliding_window=16)
    with pytest.raises(ValidationError, match=r"layer_types lists 2 layers but num_hidden_layers is 4"):
        ModelSpec(**fields, layer_types=("sliding_attention", "full_attention"))


def test_one_etp_encoding():
    """'Expert TP as wide as tp' is ETP_SAME_AS_TP in the plan record and in the search's arrays, and one
    resolver reads both; an unset --etp (None) means the same; serving splits experts by EP, else by TP."""
    import numpy as np

    from llmplan.search.grid import from_plan
    from llmplan.specs.plan import ETP_SAME_AS_TP, ParallelPlan, resolve_etp
    from llmplan.specs.serve import ServePlan

    assert ParallelPlan(tp=4).etp == ParallelPlan(tp=4, etp=None).etp == ETP_SAME_AS_TP
    assert (ParallelPlan(tp=4).etp_resolved, ParallelPlan(tp=4, etp=2).etp_resolved) == (4, 2)
    assert list(resolve_etp(np.array([ETP_SAME_AS_TP, 1, 2]), np.array([8, 8, 8]))) == [8, 1, 2]
    for plan in (ParallelPlan(tp=4, dp=2, ep=8), ParallelPlan(tp=4, dp=2, ep=8, etp=1)):
        assert int(from_plan(plan).etp_resolved[0]) == plan.etp_resolved == plan.degrees.etp
    assert (ServePlan(tp=4).etp_resolved, ServePlan(tp=4, ep=4).etp_resolved) == (4, 1)
    assert ServePlan(tp=4, ep=4).degrees.etp == 1
