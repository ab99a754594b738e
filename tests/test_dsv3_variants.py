"""DeepSeek-V3's Megatron-Bridge variant rows (25.09 token-drop / dropless, 25.11 w/ and w/o MTP) read as the
performance scripts of their release set them (docs/validation.md#dsv3-variants).

Expected values are taken from the scripts at the tags (quoted per test) and from the model dimensions
(deepseek-ai/DeepSeek-V3 config_671B.json), not read back from the code under test."""

from __future__ import annotations

import pytest

from llmplan.cost.flops import module_recompute_flops

TD_B200 = "mbridge-25.09-pretrain-deepseekv3-tokendrop-dgx-b200-256gpu-fp8-tp1pp16cp1ep8vp1gbs2048mbs1"
TD_GB200 = "mbridge-25.09-pretrain-deepseekv3-tokendrop-dgx-gb200-256gpu-fp8-tp1pp4cp1ep64vp4gbs2048mbs1"
DL_H100 = "mbridge-25.09-pretrain-deepseekv3-dropless-dgx-h100-1024gpu-fp8-tp2pp8cp1ep64vp4gbs8192mbs1"
WO_MTP_GB200 = "mbridge-25.11-pretrain-deepseekv3-w-o-mtp-dgx-gb200-256gpu-bf16-tp1pp4cp1ep64vp4gbs4096mbs1"
GB200_2608 = "mbridge-26.08-pretrain-deepseekv3-dgx-gb200-256gpu-mxfp8-tp1pp4cp1ep64vp4gbs4096mbs1"
GB300_2608 = "mbridge-26.08-pretrain-deepseekv3-dgx-gb300-256gpu-mxfp8-tp1pp2cp1ep32vp8gbs4096mbs1"


def test_25_09_token_drop_rows_recompute_the_mla_up_projections(row_plan):
    # NVIDIA-NeMo/Megatron-Bridge scripts/performance/run_script.py at v0.1.0rc4 (6725f7049): DeepSeek-V3
    # `if args.gpu.lower() == "b200": recipe.model.recompute_modules = ["mla_up_proj"]`, and on gb200
    # `if use_tokendrop: ... ["mla_up_proj"]` (token drop is the default on b200 / gb200); h100 ["mla_up_proj", "mlp"].
    # Granularity "selective": configs/deepseek/deepseek_v3_llm_pretrain.yaml and the recipe's default.
    for rid in (TD_B200, TD_GB200):
        plan = row_plan(rid)
        assert plan.recompute == "selective" and plan.recompute_modules == ("mla_up_proj",), rid
    assert row_plan(DL_H100).recompute_modules == ("mla_up_proj", "mlp")


def test_the_recomputed_up_projections_are_the_mla_q_and_kv_up_projections(row_setup):
    # One micro-batch of 4,096 tokens at TP 1: Q up-projection q_lora_rank 1536 -> 128 heads x (128 + 64), KV
    # up-projection kv_lora_rank 512 -> 128 heads x (128 + 128), 2 FLOPs per multiply-add (config_671B.json).
    m, _, plan = row_setup(TD_B200)
    T, a = 4096, 128
    hand = 2 * T * (1536 * a * (128 + 64) + 512 * a * (128 + 128))
    assert float(module_recompute_flops(m, plan, True)) == pytest.approx(hand, rel=1e-12)


def test_25_09_deepseek_gb200_row_ran_no_cuda_graphs(acc, published_runs, row_plan):
    # v0.1.0rc4 configs/deepseek/deepseek_v3_llm_pretrain.yaml perf_matrix: gb200 num_gpus_256 common
    # `cuda_graphs: false` (utils/helpers.py set_cuda_graph_overrides: model.enable_cuda_graph False); 25.11's
    # v0.2.0 DEEPSEEK_V3_GB200_BASE_CONFIG sets cuda_graph_impl "transformer_engine" (moe_router, moe_preprocess)
    assert acc.mbridge_cuda_graphs(published_runs[TD_GB200]) == "none"
    assert row_plan(TD_GB200).cuda_graphs == "none"
    assert acc.mbridge_cuda_graphs(published_runs[WO_MTP_GB200]) == "layers"


def test_26_08_gb200_recipe_recomputes_the_mla_up_projections_gb300_none(acc, published_runs):
    # v0.6.0 src/megatron/bridge/perf_recipes/deepseek/gb200/deepseek_v3.py deepseek_v3_pretrain_256gpu_gb200_fp8mx_config:
    # recompute_modules ["mla_up_proj"] (not reset by _enable_deepseek_full_iteration_mxfp8);
    # gb300/deepseek_v3.py deepseek_v3_pretrain_256gpu_gb300_fp8mx_config: recompute_modules []
    assert acc.mbridge_recompute_modules(published_runs[GB200_2608]) == ("mla_up_proj",)
    assert acc.mbridge_recompute_modules(published_runs[GB300_2608]) == ()


def test_the_probe_lines_the_variant_rows_up_with_their_gpu_and_layout():
    # benchmarks/dsv3_variants.py: the B200 PP16 EP8 series runs from 25.09's token-drop row through 25.11's w/ MTP
    # row to the unlabelled 26.02 - 26.04 rows (the tables at 067f987df list five), oldest first
    import dsv3_variants as V

    got = V.rows()
    gpu, layout = V.SERIES["B200 PP16 EP8 MBS1"]
    series = [rec["model"]["name"] for rec, _ in got if gpu in rec["id"] and layout in rec["id"]]
    assert len(series) == 5
    assert "tokendrop" in series[0] and "w/ MTP" in series[1]
    assert all(s.endswith("[DeepSeekV3]") for s in series[2:])
