"""serve-edges: check_plan's jit_activation refusal names the model's MLP activation (ModelSpec.hidden_act as a
config.json names it, else what the spec implies: Nemotron-H's ungated MLP is squared ReLU, another ungated MLP
GELU) and the activations the priced kernels support (Megatron-Core's jit_fuser SwiGLU bias_swiglu_impl and GeGLU
bias_geglu_impl). jit_activation is a plan-file switch, so each case saves a plan, sets it, and re-reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmplan.specs.hf import from_hf_config

SUPPORTED = ("the only activations it supports: SwiGLU (silu: bias_swiglu_impl, fusions/fused_bias_swiglu.py) "
             "and GeGLU (gelu: bias_geglu_impl, fusions/fused_bias_geglu.py)")
# GPT-2 small's config.json keys (openai-community/gpt2): n_embd 768, n_layer 12, n_head 12, n_positions 1024,
# vocab 50257, activation_function gelu_new.
GPT2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024, "vocab_size": 50257,
        "activation_function": "gelu_new", "_name_or_path": "gpt2"}


def _refusal(cli, tmp_path: Path, model: str) -> tuple[int, str]:
    saved = tmp_path / "p.json"
    r = cli("estimate", "--model", model, "--hardware", "dgx-h100", "--tp", "1", "--micro-batch", "1",
            "--global-batch", "8", "--seq-len", "1024", "--save", saved)
    assert r.code == 0, r.err
    doc = json.loads(saved.read_text())
    doc["plan"]["jit_activation"] = True
    saved.write_text(json.dumps(doc))
    r = cli("estimate", "--plan", saved)
    return r.code, r.err


@pytest.mark.parametrize("model, named", [
    ("nemotron-h-8b", "its activation is squared ReLU (relu2, Nemotron-H's default; the spec names no hidden_act)"),
    ("gpt-1.7b", "its activation is GELU (a plain two-matrix MLP; the spec names no hidden_act)"),
])
def test_the_refusal_names_a_built_in_models_activation(cli, tmp_path: Path, model, named):
    code, err = _refusal(cli, tmp_path, model)
    assert code == 2 and "Traceback" not in err
    assert f"jit_activation with {model}, whose MLP is not gated: {named}; " in err, err
    assert SUPPORTED in err and "set jit_activation false in the plan" in err, err


def test_the_refusal_names_the_hidden_act_of_a_config_json(cli, tmp_path: Path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(GPT2))
    code, err = _refusal(cli, tmp_path, str(cfg))
    assert code == 2
    assert "jit_activation with gpt2, whose MLP is not gated: its activation is gelu_new (hidden_act); " in err, err
    assert SUPPORTED in err


@pytest.mark.parametrize("cfg, act", [
    ({"hidden_act": "silu"}, "silu"),
    ({"hidden_activation": "gelu_pytorch_tanh"}, "gelu_pytorch_tanh"),  # Gemma 2 / 3's key
    ({"mlp_hidden_act": "relu2", "model_type": "nemotron_h"}, "relu2"),
])
def test_the_reader_keeps_the_config_activation(cfg, act):
    base = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
            "num_attention_heads": 4, "vocab_size": 1000, "max_position_embeddings": 2048}
    if cfg.get("model_type") == "nemotron_h":
        base.update(hybrid_override_pattern="M-*-", mamba_num_heads=8, mamba_head_dim=32, ssm_state_size=16,
                    n_groups=1, conv_kernel=4, num_hidden_layers=4, head_dim=64)
    assert from_hf_config({**base, **cfg}, "x").get("hidden_act") == act


def _nemotron_h(**extra):
    return {"model_type": "nemotron_h", "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
            "vocab_size": 1000, "max_position_embeddings": 2048, "hybrid_override_pattern": "M-*-",
            "mamba_num_heads": 8, "mamba_head_dim": 32, "ssm_state_size": 16, "n_groups": 1, "conv_kernel": 4,
            "num_hidden_layers": 4, "head_dim": 64, **extra}


def test_nemotron_h_activation_only_where_the_config_names_it():
    # a config without mlp_hidden_act: the reader names none (the spec implies relu2, ModelSpec.mlp_activation),
    # not a hidden_act the file does not hold; a stray hidden_act is not Nemotron-H's MLP key
    assert "hidden_act" not in from_hf_config(_nemotron_h(), "x")
    assert "hidden_act" not in from_hf_config(_nemotron_h(hidden_act="silu"), "x")
    assert from_hf_config(_nemotron_h(mlp_hidden_act="relu2"), "x")["hidden_act"] == "relu2"


@pytest.mark.parametrize("mt", ["gemma2", "gemma3_text"])
def test_gemma_reads_hidden_activation_before_hidden_act(mt):
    # Gemma configs may carry both keys (google/gemma-7b's: hidden_act "gelu", hidden_activation
    # "gelu_pytorch_tanh"); transformers' Gemma MLPs build their activation from hidden_activation. Values differ
    # here so the test tells which key was read
    base = {"model_type": mt, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 1000,
            "max_position_embeddings": 2048}
    both = {**base, "hidden_act": "gelu", "hidden_activation": "gelu_pytorch_tanh"}
    assert from_hf_config(both, "x")["hidden_act"] == "gelu_pytorch_tanh"
    assert from_hf_config({**base, "hidden_act": "gelu"}, "x")["hidden_act"] == "gelu"
    # other models keep hidden_act first
    assert from_hf_config({**both, "model_type": "llama"}, "x")["hidden_act"] == "gelu"
