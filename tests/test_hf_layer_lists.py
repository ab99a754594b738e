"""config.json lists of layer indices (Qwen3-Next's mlp_only_layers, Llama 4's moe_layers and no_rope_layers)
that are not lists of whole numbers: one line naming the key and the value, exit 2 (they raised TypeError,
an internal error with exit 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

QWEN3_NEXT = {"model_type": "qwen3_next", "hidden_size": 2048, "intermediate_size": 5120, "num_hidden_layers": 48,
              "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "vocab_size": 151936,
              "max_position_embeddings": 262144, "num_experts": 512, "num_experts_per_tok": 10,
              "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "full_attention_interval": 4,
              "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
              "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4}
LLAMA4 = {"model_type": "llama4_text", "hidden_size": 5120, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
          "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
          "vocab_size": 202048, "max_position_embeddings": 1048576, "num_local_experts": 16, "num_experts_per_tok": 1,
          "interleave_moe_layer_step": 1, "attention_chunk_size": 8192}


@pytest.mark.parametrize(("base", "key", "value"), [
    (QWEN3_NEXT, "mlp_only_layers", 5), (QWEN3_NEXT, "mlp_only_layers", [[1]]), (LLAMA4, "moe_layers", [[1]]),
    (LLAMA4, "moe_layers", ["1"]), (LLAMA4, "no_rope_layers", "x")])
def test_layer_index_list_of_other_values_is_refused_in_one_line(cli, tmp_path: Path, base, key, value) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**base, key: value}))
    r = cli("estimate", "--model", str(path), "--hardware", "dgx-h100")
    line = r.refusal()
    assert "internal error" not in line and key in line and "not a list of whole numbers" in line, line


def test_layer_index_lists_of_whole_numbers_are_read(cli, tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**QWEN3_NEXT, "mlp_only_layers": [0]}))
    r = cli("estimate", "--model", str(path), "--hardware", "dgx-h100")
    assert r.code == 0, r.err


def test_qwen3_next_config_gets_the_mtp_module_its_release_ships() -> None:
    # The released config.json declares no MTP key; vLLM's Qwen3NextMultiTokenPredictor builds
    # getattr(config, "num_nextn_predict_layers", 1) of them (vllm-project/vllm
    # vllm/model_executor/models/qwen3_next_mtp.py @ffdc985737c94233f2c88629c4450022e5bf4925).
    from llmplan.specs.hf import from_hf_config
    from llmplan.specs.model import ModelSpec
    from llmplan.specs.registry import builtin_models
    m = ModelSpec(**from_hf_config(QWEN3_NEXT, "q"))
    assert m.num_nextn_predict_layers == 1 == builtin_models()["qwen3-next-80b-a3b"].num_nextn_predict_layers
    assert ModelSpec(**from_hf_config({**QWEN3_NEXT, "num_nextn_predict_layers": 0}, "q")).num_nextn_predict_layers == 0
