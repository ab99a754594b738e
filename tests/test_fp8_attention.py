"""FP8 dot-product attention (ParallelPlan.fp8_attention, docs/formulas.md#compute.fp8_attention): the fused
attention's matmuls at twice the tensor rate, its softmax not; check_plan's rule, the exports, the CLI switch and
the Megatron-Bridge 26.06 / 26.08 MXFP8 presets that set it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.compute import fp8_attention_ratio, layer_seconds
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M = builtin_models()
S = builtin_systems()
FP8 = dict(dp=8, global_batch=64, seq_len=4096, dtype="fp8", recipe="mxfp8")


def test_ratio_matches_flashattention3_fp8_over_bf16_at_head_dim_128():
    # Shah et al. 2024 (FlashAttention-3), abstract: H100, FP8 close to 1.2 PFLOP/s, BF16 up to 740 TFLOP/s
    m, gpu = M["llama-3.1-8b"], S["dgx-h100"].gpu  # head dim 128
    assert float(fp8_attention_ratio(m, ParallelPlan(**FP8, fp8_attention=True), gpu)) == pytest.approx(
        1200 / 740, rel=0.03)
    assert float(fp8_attention_ratio(m, ParallelPlan(**FP8), gpu)) == 1.0


@settings(max_examples=30, deadline=None, derandomize=True)
@given(d0=st.floats(0.0, 512.0))
def test_ratio_lies_between_one_and_the_tensor_rates_two(d0):
    m = M["qwen3-30b-a3b"]
    gpu = S["dgx-b200"].gpu.model_copy(update={"attention_softmax_head_dim": d0})
    r = float(fp8_attention_ratio(m, ParallelPlan(**FP8, fp8_attention=True), gpu))
    assert 1.0 < r <= 2.0 + 1e-12


def test_attention_time_falls_by_the_ratio_and_nothing_else_moves():
    m, gpu = M["qwen3-30b-a3b"], S["gb300-nvl72"].gpu
    off = layer_seconds(m, ParallelPlan(**FP8, ep=8), gpu, True)
    on = layer_seconds(m, ParallelPlan(**FP8, ep=8, fp8_attention=True), gpu, True)
    r = float(fp8_attention_ratio(m, ParallelPlan(**FP8, fp8_attention=True), gpu))
    assert float(on[1]) == pytest.approx(float(off[1]) / r)
    assert on[0] == off[0] and on[2] == off[2]


def test_check_plan_needs_an_fp8_recipe_and_fused_attention():
    m = M["llama-3.1-8b"]
    assert "fp8_attention" in [v.rule for v in check_plan(m, ParallelPlan(dp=8, global_batch=64, fp8_attention=True))]
    assert "fp8_attention" in [v.rule for v in check_plan(
        m, ParallelPlan(**FP8, flash_attention=False, fp8_attention=True))]
    assert "fp8_attention" not in [v.rule for v in check_plan(m, ParallelPlan(**FP8, fp8_attention=True))]


def test_cli_switch_reaches_the_plan_and_refuses_bf16(cli):
    args = ("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-b200", "--global-batch", "64", "--json")
    off, on = cli(*args, "--precision", "mxfp8"), cli(*args, "--precision", "mxfp8", "--fp8-attention")
    assert off.code == 0 and on.code == 0, on.err
    assert on.json()["plan"]["fp8_attention"] is True and off.json()["plan"]["fp8_attention"] is False
    assert on.json()["time"]["step_s"] < off.json()["time"]["step_s"]
    bad = cli(*args, "--fp8-attention")
    assert bad.code == 2 and "fp8_attention" in bad.err and "Traceback" not in bad.err


def test_megatron_bridge_writes_it_after_the_preset_and_megatron_lm_refuses_it(cli, tmp_path):
    args = ("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-b200", "--global-batch", "64",
            "--precision", "mxfp8", "--fp8-params")
    assert cli(*args, "--fp8-attention", "--save", tmp_path / "on.json").code == 0
    assert cli(*args, "--save", tmp_path / "off.json").code == 0
    on = cli("export", tmp_path / "on.json", "--to", "megatron-bridge", "-o", tmp_path / "b_on")
    off = cli("export", tmp_path / "off.json", "--to", "megatron-bridge", "-o", tmp_path / "b_off")
    assert on.code == 0 and off.code == 0, on.err
    text = "".join(f.read_text() for f in (tmp_path / "b_on").rglob("*") if f.is_file())
    assert "mixed_precision.fp8_dot_product_attention=true" in text.lower()
    assert text.lower().index("mixed_precision.fp8_dot_product_attention") > text.index("mixed_precision=")
    assert "fp8_dot_product_attention" not in "".join(
        f.read_text() for f in (tmp_path / "b_off").rglob("*") if f.is_file())
    lm = cli("export", tmp_path / "on.json", "--to", "megatron", "-o", tmp_path / "m")
    assert lm.code == 2 and "FP8 dot-product attention" in lm.err and "Traceback" not in lm.err


@pytest.mark.parametrize("rid, on", [
    # v0.5.0 qwen3_workload_base_configs.py: QWEN3_30B_A3B_PRETRAIN_CONFIG_{GB300,GB200,B300}_FP8_MX_V1
    ("mbridge-26.06-pretrain-qwen3-30b-a3b-dgx-gb300-8gpu-mxfp8-tp1pp1cp1ep8vpnagbs512mbs8", True),
    ("mbridge-26.06-pretrain-qwen3-30b-a3b-dgx-b300-8gpu-mxfp8-tp1pp1cp1ep8vpnagbs512mbs8", True),
    # v0.4.0's presets (26.04) set none
    ("mbridge-26.04-pretrain-qwen3-30b-a3b-dgx-gb300-8gpu-mxfp8-tp1pp1cp1ep8vpnagbs512mbs8", False),
    # v0.5.0 deepseek_workload_base_configs.py: the GB300 MXFP8 preset sets it, the GB200 one does not
    ("mbridge-26.06-pretrain-deepseekv3-dgx-gb300-256gpu-mxfp8-tp1pp2cp1ep32vp8gbs4096mbs1", True),
    ("mbridge-26.06-pretrain-deepseekv3-dgx-gb200-256gpu-mxfp8-tp1pp4cp1ep64vp4gbs4096mbs1", False),
    # H100 FP8 rows run no full-iteration preset
    ("mbridge-26.06-pretrain-qwen3-30b-a3b-dgx-h100-16gpu-fp8-tp1pp1cp1ep16vpnagbs1024mbs1", False),
])
def test_presets_that_run_fp8_attention(published_runs, acc, rid, on):
    rec = published_runs[rid]
    assert acc.mbridge_fp8_attention(rec) is on
    assert acc.plan_for(rec, "mbridge-moe", rec["hardware"]["gpus"]).fp8_attention is on
