"""Latent MoE (Nemotron-3 Super): experts and the all-to-all at moe_latent_size, two h x l projections.

Architecture: NVIDIA/Megatron-LM megatron/core/transformer/moe/moe_layer.py (the router reads the full-width
token, fc1_latent_proj h -> l before dispatch, fc2_latent_proj l -> h after combine, both replicated on TP
ranks; the shared expert at full width). Config: nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16 config.json.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from llmplan.cost.comm import ep_transfers
from llmplan.cost.compute import layer_flops, layer_gemms
from llmplan.cost.memory import layer_activation_parts
from llmplan.cost.params import param_counts, rank_params
from llmplan.specs.hf import from_hf_config
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models

SUPER_PATTERN = "MEMEMEM*EMEMEMEM*EMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEM*EMEMEMEME"
# nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16 config.json (the keys llmplan reads)
SUPER_CONFIG = {
    "model_type": "nemotron_h", "hidden_size": 4096, "intermediate_size": 2688, "num_hidden_layers": 88,
    "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128, "vocab_size": 131072,
    "max_position_embeddings": 262144, "tie_word_embeddings": False, "mlp_hidden_act": "relu2",
    "hybrid_override_pattern": SUPER_PATTERN, "mamba_num_heads": 128, "mamba_head_dim": 64,
    "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4, "chunk_size": 128, "n_routed_experts": 512,
    "num_experts_per_tok": 22, "moe_intermediate_size": 2688, "moe_latent_size": 1024,
    "moe_shared_expert_intermediate_size": 5376, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
    "norm_topk_prob": True, "routed_scaling_factor": 5.0, "num_nextn_predict_layers": 1,
    "mtp_hybrid_override_pattern": "*E",
}
FIELDS = ("hidden_size", "num_hidden_layers", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
          "moe_latent_size", "shared_expert_intermediate_size", "layer_types", "mlp_layer_types",
          "mamba_num_heads", "num_nextn_predict_layers", "gated_mlp", "scoring_func", "expert_bias")


def _super() -> ModelSpec:
    return builtin_models()["nemotron-3-super"]


def _full_width(m: ModelSpec) -> ModelSpec:
    return m.model_copy(update={"moe_latent_size": None})


def test_nemotron_h_config_reads_the_latent_width_and_matches_the_builtin():
    m = ModelSpec(**from_hf_config(SUPER_CONFIG, "super"))
    assert m.moe_latent_size == 1024 and m.expert_width == 1024
    built_in = _super()
    assert {f: getattr(m, f) for f in FIELDS} == {f: getattr(built_in, f) for f in FIELDS}
    # The model card: 40 Mamba-2, 40 (latent) MoE and 8 attention blocks
    assert (m.count_layers("mamba"), m.num_moe_layers, m.count_layers("full_attention")) == (40, 40, 8)


def test_a_config_without_a_latent_width_reads_as_full_width():
    cfg = {**SUPER_CONFIG, "moe_latent_size": None}  # Nano's config.json writes null
    m = ModelSpec(**from_hf_config(cfg, "x"))
    assert m.moe_latent_size is None and m.expert_width == m.hidden_size


def test_latent_width_on_a_dense_model_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="moe_latent_size .1024. is set on a dense model"):
        ModelSpec(name="x", hidden_size=1024, intermediate_size=4096, num_hidden_layers=2, num_attention_heads=8,
                  vocab_size=1000, max_position_embeddings=4096, moe_latent_size=1024)
    with pytest.raises(ValueError):
        ModelSpec(**{**_super().model_dump(), "moe_latent_size": 0})


def test_parameters_follow_megatron_shapes():
    # Per MoE layer (Megatron-LM moe_layer.py / experts): 512 experts of fc1 l x f and fc2 f x l (squared ReLU,
    # no gate), the two projections h x l, the router h x E and its E-entry expert bias (the checkpoint's
    # e_score_correction_bias), the shared expert h x f_s x 2.
    m = _super()
    h, l, f, E, fs = 4096, 1024, 2688, 512, 5376
    p = param_counts(m)
    assert p.routed_experts == 40 * E * 2 * l * f
    assert p.latent_projections == 40 * 2 * h * l
    assert p.shared_experts == 40 * 2 * h * fs
    assert p.router == 40 * (h * E + E)
    # The same experts at full width would hold 4x the routed weights
    assert param_counts(_full_width(m)).routed_experts == 4 * p.routed_experts


def test_projections_are_replicated_on_tp_ranks():
    # parallel_mode "duplicated": each TP rank holds both projections whole (moe_layer.py)
    m = _super()
    plan = ParallelPlan(tp=2, dp=32, ep=64, global_batch=512, seq_len=8192)
    with_latent = rank_params(m, plan, 0).dense
    without = rank_params(m.model_copy(update={"moe_latent_size": None}), plan, 0).dense
    per_layer = 2 * 4096 * 1024
    n_moe = m.num_moe_layers + m.num_nextn_predict_layers  # pp 1: the MTP module's MoE block is on this rank
    assert with_latent - without == pytest.approx(n_moe * per_layer, rel=1e-9)


def test_all_to_all_moves_latent_width_rows():
    m = _super()
    plan = ParallelPlan(dp=64, ep=64, global_batch=512, seq_len=8192)
    latent = ep_transfers(m, plan, "ep")[0]
    full = ep_transfers(_full_width(m), plan, "ep")[0]
    assert latent.calls == full.calls
    assert latent.message == pytest.approx(full.message * 1024 / 4096, rel=1e-12)


def test_flops_count_experts_at_the_latent_width_and_the_projections():
    m = _super()
    plan = ParallelPlan(dp=64, ep=64, global_batch=512, seq_len=8192)
    T, h, l, f, k = 8192, 4096, 1024, 2688, 22
    diff = layer_flops(_full_width(m), plan, True).gemm - layer_flops(m, plan, True).gemm
    # experts: 2T·k·2f·(h - l) fewer; projections: 2T·2hl more
    assert diff == pytest.approx(2 * T * k * 2 * f * (h - l) - 2 * T * 2 * h * l, rel=1e-9)
    flops = sum(g[0] for g in layer_gemms(m, plan, True))
    moe_part = sum(g[0] for g in layer_gemms(m, plan, True) if g[3] == l or g[2] == l)
    assert moe_part > 0 and flops > moe_part
    assert any(g[1:4] == (T, l, h) for g in layer_gemms(m, plan, True))  # fc1_latent_proj's GEMM


def test_activation_memory_keeps_latent_rows():
    m = _super()
    plan = ParallelPlan(dp=64, ep=64, global_batch=512, seq_len=8192)
    latent = layer_activation_parts(m, plan, True).mlp
    full = layer_activation_parts(_full_width(m), plan, True).mlp
    # each of the T·k dispatched rows keeps 2(h - l) bytes less; the combined rows add 2l per token
    T, k = 8192, 22
    assert full - latent == pytest.approx(T * k * 2 * (4096 - 1024) - T * 2 * 1024, rel=1e-9)


def _plan_file(m: ModelSpec):
    from llmplan.planfile import load_plan

    base = load_plan(Path(__file__).parent / "data" / "plans" / "moe_train.json")
    plan = ParallelPlan(tp=1, pp=1, dp=64, ep=64, micro_batch=1, global_batch=512, seq_len=4096)
    return dataclasses.replace(base, model=m, plan=plan)


def test_megatron_export_passes_the_latent_width():
    from test_export import parse_megatron

    from llmplan.export import render_all

    # The MTP module of a hybrid is refused by the export (its own pattern); without it the model exports.
    m = _super().model_copy(update={"num_nextn_predict_layers": 0})
    script = render_all(_plan_file(m), "megatron")[0]["megatron_pretrain.sh"]
    ns, _ = parse_megatron(script)
    assert int(ns.moe_latent_size) == 1024 and int(ns.moe_ffn_hidden_size) == 2688
    assert ns.hybrid_layer_pattern.strip('"') == SUPER_PATTERN


def test_torchtitan_export_refuses_a_latent_moe():
    from llmplan.export import render_all
    from llmplan.export.common import CannotExpress

    m = builtin_models()["qwen3-30b-a3b"].model_copy(update={"moe_latent_size": 512})
    with pytest.raises(CannotExpress, match="latent MoE"):
        render_all(_plan_file(m), "torchtitan")


# MiniMax-M1 (lightning attention, the linear_attention kind under linear_attention_rule "lightning")
# MiniMaxAI/MiniMax-M1-80k config.json (the keys llmplan reads)
MINIMAX_CONFIG = {
    "model_type": "minimax_m1", "hidden_size": 6144, "intermediate_size": 9216, "num_hidden_layers": 80,
    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 200064,
    "max_position_embeddings": 10240000, "rope_theta": 10000000, "num_local_experts": 32, "num_experts_per_tok": 2,
    "attn_type_list": [0, 0, 0, 0, 0, 0, 0, 1] * 10, "tie_word_embeddings": False, "shared_intermediate_size": 0,
}


def test_minimax_config_reads_lightning_layers_and_matches_the_builtin():
    m = ModelSpec(**from_hf_config(MINIMAX_CONFIG, "m1"))
    assert m.linear_attention_rule == "lightning"
    assert (m.count_layers("linear_attention"), m.count_layers("full_attention"), m.num_moe_layers) == (70, 10, 80)
    built_in = builtin_models()["minimax-m1"]
    keys = ("layer_types", "num_experts", "moe_intermediate_size", "linear_num_value_heads", "linear_key_head_dim",
            "linear_attention_rule", "num_key_value_heads")
    assert {k: getattr(m, k) for k in keys} == {k: getattr(built_in, k) for k in keys}
    text01 = ModelSpec(**from_hf_config({**MINIMAX_CONFIG, "model_type": "minimax_text_01"}, "t01"))
    assert param_counts(text01).total == param_counts(m).total


def test_minimax_attn_type_list_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match="attn_type_list must give 0 .lightning. or 1"):
        from_hf_config({**MINIMAX_CONFIG, "attn_type_list": [0, 1]}, "x")


def test_lightning_mixer_follows_minimax_shapes():
    # MiniMaxM1LightningAttention: qkv_proj h x 3Hd, output_gate h x Hd, norm Hd, out_proj Hd x h
    from llmplan.cost.mixers import decode_scan_flops, lightning_params, recurrent_state_bytes

    m = builtin_models()["minimax-m1"]
    h, Hd = 6144, 64 * 128
    assert lightning_params(m) == 3 * h * Hd + h * Hd + Hd + Hd * h
    # the state is 64 heads of 128 x 128 per lightning layer, no convolution; constant per sequence
    assert recurrent_state_bytes(m, 4.0) == 4.0 * 70 * 64 * 128 * 128
    assert decode_scan_flops(m) == 70 * 64 * 4 * 128 * 128


def test_lightning_rule_needs_one_head_count():
    m = builtin_models()["minimax-m1"]
    with pytest.raises(ValueError, match="lightning attention has one head count"):
        ModelSpec(**{**m.model_dump(), "linear_num_key_heads": 32})


def test_megatron_export_refuses_lightning_attention():
    from llmplan.export import render_all
    from llmplan.export.common import CannotExpress

    pf = _plan_file(builtin_models()["minimax-m1"])
    pf = dataclasses.replace(pf, plan=ParallelPlan(tp=8, dp=8, ep=8, global_batch=64, seq_len=4096))
    with pytest.raises(CannotExpress, match="lightning-attention layers"):
        render_all(pf, "megatron")


@pytest.mark.parametrize("model,tp,kind", [("minimax-m1", "8", "lightning attention"),
                                           ("qwen3-next-80b-a3b", "2", "Gated DeltaNet")])
def test_serving_view_names_the_layers_that_hold_the_recurrent_state(cli, model, tp, kind):
    r = cli("estimate", "--mode", "infer", "--model", model, "--hardware", "dgx-h200", "--nodes", "1", "--tp", tp,
            "--batch", "8")
    assert r.code == 0, r.err
    text = " ".join(r.out.split())
    assert f"({kind} layers hold it instead of a KV cache)" in text
