"""benchmarks/gptoss_act.py (docs/validation.md#gptoss-act): the BGRADB candidate's GEMM share counted by hand from
GPT-OSS 120B's published shapes."""

from __future__ import annotations

import gptoss_act as G  # benchmarks/ is on the path (conftest)
import pytest

from llmplan.specs.hf import from_hf_config
from llmplan.specs.model import ModelSpec

# openai/gpt-oss-120b config.json: hidden 2,880, 64 query / 8 KV heads of 64, 128 experts top-4 of 2,880,
# vocab 201,088, 36 layers
GPT_OSS_120B = {"model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 36,
                "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 201088,
                "num_local_experts": 128, "num_experts_per_tok": 4, "max_position_embeddings": 131072,
                "attention_bias": True, "sliding_window": 128, "swiglu_limit": 7.0,
                "layer_types": ["sliding_attention", "full_attention"] * 18}


def test_bgradb_share_is_the_qkv_and_fc1_weight_gradients():
    fl = G.gemm_flops(ModelSpec(**from_hf_config(GPT_OSS_120B, "gpt-oss-120b")))
    # by hand, forward multiply-adds per token and layer: qkv 2,880 x (4,096 + 2 x 512), proj 4,096 x 2,880,
    # fc1 4 x 2,880 x 5,760, fc2 4 x 2,880 x 2,880, router 2,880 x 128, the head 2,880 x 201,088 over 36 layers
    qkv, proj, fc1, fc2, router = 2880 * 5120, 4096 * 2880, 4 * 2880 * 5760, 4 * 2880 * 2880, 2880 * 128
    head = 2880 * 201088 / 36
    assert fl["qkv"] == 2 * qkv and fl["fc1"] == 2 * fc1 and fl["head"] == pytest.approx(2 * head)
    # weight gradients are a third of forward + both backward GEMMs; the biased ones are qkv's and fc1's
    share = (qkv + fc1) / (3 * (qkv + proj + fc1 + fc2 + router + head))
    assert (fl["qkv"] + fl["fc1"]) / (3 * sum(fl.values())) == pytest.approx(share)
    assert 0.18 < share < 0.20
