"""Qwen3.5 (Gated DeltaNet + gated attention hybrids, issue 40): the config.json reader for model_type qwen3_5 /
qwen3_5_moe, the qwen3.5-35b-a3b built-in, and the Megatron-Bridge verification-card row that validates its
pricing (docs/validation.md#gdn-rows)."""

from __future__ import annotations

import pytest

from llmplan.cost.params import param_counts
from llmplan.specs.hf import from_hf_config
from llmplan.specs.model import ModelSpec
from llmplan.specs.registry import builtin_models

ROW = "bridgecard-h100-bf16-qwen3.5-35b-a3b-16gpu-gbs1024"

TEXT = {"model_type": "qwen3_5_moe_text", "attention_bias": False, "attn_output_gate": True, "head_dim": 256,
        "hidden_act": "silu", "hidden_size": 2048, "full_attention_interval": 4,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 10,
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
        "linear_num_value_heads": 32, "linear_value_head_dim": 128, "max_position_embeddings": 262144,
        "mlp_only_layers": [], "moe_intermediate_size": 512, "mtp_num_hidden_layers": 1,
        "num_attention_heads": 16, "num_experts": 256, "num_experts_per_tok": 8, "num_hidden_layers": 40,
        "num_key_value_heads": 2, "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 512,
        "vocab_size": 248320, "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                                                  "partial_rotary_factor": 0.25, "mrope_interleaved": True,
                                                  "mrope_section": [11, 11, 10]}}
"""Qwen/Qwen3.5-35B-A3B config.json's text_config: the values transformers' Qwen3_5MoeTextConfig defaults to
(huggingface/transformers src/transformers/models/qwen3_5_moe/configuration_qwen3_5_moe.py: "Qwen3.5-35B-A3B
style"), with the model card's 262,144-token context and the file's layer_types, mtp_num_hidden_layers 1 and
attn_output_gate (the keys the Megatron-Bridge qwen35_bridge.py reads)."""
FILE = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
        "tie_word_embeddings": False, "text_config": TEXT,
        "vision_config": {"model_type": "qwen3_5_moe", "depth": 27, "hidden_size": 1152}}


def test_the_multimodal_file_reads_as_the_builtin_language_model():
    m = ModelSpec(**from_hf_config(FILE, "Qwen3.5-35B-A3B"))
    b = builtin_models()["qwen3.5-35b-a3b"]
    assert m.model_type == b.model_type == "qwen3_5_moe"
    assert m.layer_types == b.layer_types and m.layer_types[3] == "full_attention" and m.num_attention_layers == 10
    assert m.count_layers("linear_attention") == 30 and m.num_moe_layers == 40
    assert (m.attention_output_gate, m.qk_norm, m.norm_topk_prob, m.tie_word_embeddings) == (True, True, True, False)
    assert m.num_nextn_predict_layers == 1 and m.rope_theta == 1e7
    assert param_counts(m).total == param_counts(b).total


def test_a_text_only_file_reads_the_same_and_the_mtp_depth_is_the_files():
    # a text-only export (model_type qwen3_5_moe_text at the top, no text_config), without the MTP key
    text = {k: v for k, v in TEXT.items() if k != "mtp_num_hidden_layers"}
    m = ModelSpec(**from_hf_config(text, "q"))
    assert m.model_type == "qwen3_5_moe" and m.num_nextn_predict_layers == 0
    assert param_counts(m).total == param_counts(builtin_models()["qwen3.5-35b-a3b"]).total


def test_a_dense_qwen3_5_file_has_no_moe_layers_and_its_interval_places_attention():
    # dense Qwen3.5 (Qwen3_5TextConfig: intermediate_size, no experts); no layer_types: every 4th layer full
    # attention by full_attention_interval, as transformers' config builds it
    text = {k: v for k, v in TEXT.items() if k not in ("layer_types", "num_experts", "num_experts_per_tok",
                                                        "moe_intermediate_size", "shared_expert_intermediate_size")}
    cfg = {"model_type": "qwen3_5", "tie_word_embeddings": True,
           "text_config": {**text, "model_type": "qwen3_5_text", "intermediate_size": 6144, "num_hidden_layers": 8}}
    m = ModelSpec(**from_hf_config(cfg, "q"))
    assert m.model_type == "qwen3_5" and not m.is_moe and m.num_moe_layers == 0
    assert m.layer_types == (("linear_attention",) * 3 + ("full_attention",)) * 2
    assert m.tie_word_embeddings  # the top-level key where the text_config leaves it out


def test_the_card_row_reads_the_recipe_and_is_scored(published_runs, acc, row_setup):
    model, _, plan = row_setup(ROW)
    assert model.name == "qwen3.5-35b-a3b" and model.num_nextn_predict_layers == 1
    assert (plan.ep, plan.dp, plan.tp, plan.micro_batch, plan.global_batch) == (8, 16, 1, 1, 1024)
    assert (plan.moe_dispatcher, plan.moe_flex_backend, plan.moe_dispatch_sms, plan.ep_comm_overlap) == \
        ("deepep", "hybridep", 16, False)
    assert plan.expert_gemm == "grouped" and plan.moe_capacity_factor is None
    assert (plan.optimizer_master_dtype, plan.optimizer_moment_dtype, plan.param_remainders, plan.grad_dtype) == \
        ("fp16", "bf16", False, "bf16")
    assert not plan.overlap_grad_reduce and not plan.overlap_param_gather and plan.cuda_graphs == "none"
    (quantity, pred, meas), *rest = acc.predict(published_runs[ROW], acc.family(ROW))
    assert rest == [("fits", 1.0, 1.0)]  # the run completed and llmplan predicts it fits
    # the card: 20,966.10 ms per step of 1,024 x 4,096 tokens on 16 GPUs (tokens/s derived from it)
    assert quantity == "tok/s/GPU" and meas == pytest.approx(1024 * 4096 / 16 / 20.9661, rel=1e-5)
    # llmplan predicted +8.3% when the row was added (docs/validation.md#gdn-rows); within the family's largest
    # error then (the Qwen3-30B-A3B card's 15.7%)
    assert abs(pred / meas - 1) < 0.157
