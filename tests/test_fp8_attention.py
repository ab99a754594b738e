"""FP8 dot-product attention (ParallelPlan.fp8_attention, docs/formulas.md#compute.fp8_attention): cuDNN's
published FP8 / MXFP8 speed over bf16 per pass where the profile has it, else the matmuls at twice the tensor
rate and the softmax not; check_plan's rule, the exports, the CLI switch and
the Megatron-Bridge 26.06 / 26.08 MXFP8 presets that set it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.attention_rate import mean_head_dim
from llmplan.cost.compute import fp8_attention_ratio, layer_seconds
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M = builtin_models()
S = builtin_systems()
FP8 = dict(dp=8, global_batch=64, seq_len=4096, dtype="fp8", recipe="mxfp8")


# Published: NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training/results at 3929da2 (cuDNN 9.22.0 on GB200 /
# GB300, 9.19.1 on H200), causal (top_left), 4,096 tokens, non-deterministic backward; (forward, backward) ms of
# bf16 and of the FP8 format. d 128: llama3.1/{gb200,gb300}/llama3.1_2026042410075{0,7}.csv (64 query / 8 KV heads,
# batch 2) and h200_919_only_cudnn/llama3.1_20260227_034703.csv (batch 1); d 160 (d_qk 192, d_v 128):
# dsv3/{gb200,gb300}/dsv3_2026042410{1009,1002}.csv (128 heads, batch 2).
PUBLISHED_MS = {
    ("gb200-nvl72", "llama-3.1-8b", "fp8"): ((0.391, 1.198), (0.305, 1.167)),
    ("gb200-nvl72", "llama-3.1-8b", "mxfp8"): ((0.391, 1.198), (0.326, 1.305)),
    ("gb200-nvl72", "deepseek-v3", "fp8"): ((0.977, 3.383), (0.656, 2.112)),
    ("gb200-nvl72", "deepseek-v3", "mxfp8"): ((0.977, 3.383), (0.714, 2.620)),
    ("gb300-nvl72", "llama-3.1-8b", "fp8"): ((0.323, 1.101), (0.217, 0.985)),
    ("gb300-nvl72", "llama-3.1-8b", "mxfp8"): ((0.323, 1.101), (0.242, 1.203)),
    ("gb300-nvl72", "deepseek-v3", "fp8"): ((0.864, 3.127), (0.493, 1.803)),
    ("gb300-nvl72", "deepseek-v3", "mxfp8"): ((0.864, 3.127), (0.546, 2.348)),
    ("dgx-h200", "llama-3.1-8b", "fp8"): ((0.465, 1.450), (0.322, 1.459)),
}
RECIPE = {"fp8": "tensorwise", "mxfp8": "mxfp8"}
PASS_TOLERANCE = 0.01  # the profiles' per-pass points: the published ratios, rounded to 3 places
CALL_TOLERANCE = 0.05  # forward + backward: llmplan weights the backward 2 : 1 (its FLOPs), cuDNN's bf16 takes ~3 : 1


@pytest.mark.parametrize("key", sorted(PUBLISHED_MS))
def test_profiles_hold_cudnns_published_fp8_over_bf16_per_pass(key):
    system, model, fmt = key
    (bf_f, bf_b), (f8_f, f8_b) = PUBLISHED_MS[key]
    points = {p[0]: p[1:] for p in S[system].gpu.fp8_attention_points[fmt]}
    fwd, bwd = points[mean_head_dim(M[model])]
    assert fwd == pytest.approx(bf_f / f8_f, rel=PASS_TOLERANCE)
    assert bwd == pytest.approx(bf_b / f8_b, rel=PASS_TOLERANCE)


@pytest.mark.parametrize("key", sorted(PUBLISHED_MS))
def test_ratio_matches_cudnns_published_forward_plus_backward(key):
    system, model, fmt = key
    (bf_f, bf_b), (f8_f, f8_b) = PUBLISHED_MS[key]
    plan = ParallelPlan(**{**FP8, "recipe": RECIPE[fmt]}, fp8_attention=True)
    priced = float(fp8_attention_ratio(M[model], plan, S[system].gpu))
    assert priced == pytest.approx((bf_f + bf_b) / (f8_f + f8_b), rel=CALL_TOLERANCE)


# Out of sample: the same benchmark's Kimi-K2.6 call (d_qk 192, d_v 128, 64 heads, batch 2, causal, 4,096 tokens),
# kimiK26/{gb200,gb300}/kimiK26_20260424_1009{53,15}.csv at 3929da2; the profiles' d 160 points are DeepSeek-V3's.
KIMI_MS = {
    ("gb200-nvl72", "fp8"): ((0.518, 1.698), (0.338, 1.082)),
    ("gb200-nvl72", "mxfp8"): ((0.518, 1.698), (0.363, 1.331)),
    ("gb300-nvl72", "fp8"): ((0.421, 1.548), (0.244, 0.904)),
    ("gb300-nvl72", "mxfp8"): ((0.421, 1.548), (0.269, 1.185)),
}


@pytest.mark.parametrize("key", sorted(KIMI_MS))
def test_ratio_matches_the_published_kimi_call_it_was_not_read_from(key):
    system, fmt = key
    (bf_f, bf_b), (f8_f, f8_b) = KIMI_MS[key]
    plan = ParallelPlan(**{**FP8, "recipe": RECIPE[fmt]}, fp8_attention=True)
    priced = float(fp8_attention_ratio(M["kimi-k2"], plan, S[system].gpu))
    assert priced == pytest.approx((bf_f + bf_b) / (f8_f + f8_b), rel=CALL_TOLERANCE)


def test_mxfp8_attention_at_head_dim_128_is_no_faster_than_bf16_on_blackwell():
    # the published 0.974 (GB200) / 0.985 (GB300) forward + backward: MXFP8's backward runs slower than bf16's
    plan = ParallelPlan(**FP8, fp8_attention=True)
    for system in ("gb200-nvl72", "gb300-nvl72", "dgx-b200", "dgx-b300"):
        assert float(fp8_attention_ratio(M["llama-3.1-8b"], plan, S[system].gpu)) < 1.04


@settings(max_examples=30, deadline=None, derandomize=True)
@given(r=st.floats(0.5, 2.0), d=st.sampled_from(["gpt-oss-120b", "llama-3.1-8b", "deepseek-v3"]))
def test_ratio_is_read_between_the_points_and_held_beyond_them(r, d):
    gpu = S["gb200-nvl72"].gpu.model_copy(update={"fp8_attention_points": {"mxfp8": ((128.0, 1.0, 1.0), (192.0, r, r))}})
    priced = float(fp8_attention_ratio(M[d], ParallelPlan(**FP8, fp8_attention=True), gpu))
    assert min(1.0, r) - 1e-12 <= priced <= max(1.0, r) + 1e-12
    if mean_head_dim(M[d]) <= 128:
        assert priced == pytest.approx(1.0)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(d0=st.floats(0.0, 512.0))
def test_without_published_points_the_d0_rule_lies_between_one_and_two(d0):
    m = M["qwen3-30b-a3b"]
    gpu = S["dgx-b200"].gpu.model_copy(update={"attention_softmax_head_dim": d0, "fp8_attention_points": {}})
    r = float(fp8_attention_ratio(m, ParallelPlan(**FP8, fp8_attention=True), gpu))
    assert 1.0 < r <= 2.0 + 1e-12
    assert float(fp8_attention_ratio(m, ParallelPlan(**FP8), gpu)) == 1.0


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
    # FP8 per-tensor attention runs 1.08x bf16 on the B200 die at d 128 (MXFP8's 0.97x would not speed it up)
    off, on = cli(*args, "--precision", "fp8-tensorwise"), cli(*args, "--precision", "fp8-tensorwise", "--fp8-attention")
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
    # the preset written out with fp8_dot_product_attention on (export.bridge_precision): after a preset's name,
    # Hydra's struct mode refuses a mixed_precision.* key, so MixedPrecisionConfig.setup's model field is written
    assert "'model.fp8_dot_product_attention=true'" in text and "'mixed_precision=null'" in text
    assert "mixed_precision." not in text
    off_text = "".join(f.read_text() for f in (tmp_path / "b_off").rglob("*") if f.is_file())
    assert "'mixed_precision=bf16_with_mxfp8_mixed'" in off_text
    assert "fp8_dot_product_attention" not in off_text
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
def test_presets_that_run_fp8_attention(published_runs, acc, row_plan, rid, on):
    rec = published_runs[rid]
    assert acc.mbridge_fp8_attention(rec) is on
    assert row_plan(rid).fp8_attention is on


@pytest.mark.parametrize("points, expected", [
    ("{fp8: [[128, 1.4, 5.0]]}", ["field 'gpu.fp8_attention_points.fp8.0.2'", "less than or equal to 4", "5.0"]),
    ("{fp4: [[128, 1.4, 1.0]]}", ["field 'gpu.fp8_attention_points'", "one of fp8, mxfp8", "rename key fp4 to fp8"]),
    ("{fp8: [[128, 1.4]]}", ["field 'gpu.fp8_attention_points.fp8.0'", "takes 3 items"]),
])
def test_bad_fp8_attention_points_in_a_hardware_file_are_one_line_and_exit_2(tmp_path, points, expected):
    """GpuSpec.fp8_attention_points given wrong in a user's hardware file: the real command refuses it in one
    line naming the field and the rule, exit code 2."""
    from test_bad_input_files import llmplan, one_line

    f = tmp_path / "cluster.yaml"
    f.write_text(f"base: dgx-h100\ngpu: {{fp8_attention_points: {points}}}\n")
    r = llmplan("estimate", "--model", "llama-3.1-8b", "--hardware", f, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    line = one_line(r.stderr)
    assert line.startswith("error: ") and all(e in line for e in expected), line
