"""Megatron-Bridge presets that turn the distributed optimizer's parameter all-gather overlap off, read per row
(benchmarks/accuracy.py mbridge_param_gather_off; docs/validation.md#mxfp8-gather-preset).

Sources, NVIDIA-NeMo/Megatron-Bridge:
- v0.2.0 (7af9601c9, the 25.11 rows) scripts/performance/configs/llama3/llama3_llm_pretrain.py lines 80-83, 115-118,
  150-153 (llama3_70b_gb300 / gb200 / b200_config), llama31/llama31_llm_pretrain.py (405B gb300 / gb200 / b200),
  deepseek/deepseek_llm_pretrain.py lines 75-78, 112-115 (DeepSeek-V3 gb300 / gb200; b200 has none),
  qwen3/qwen3_llm_pretrain.py lines 133-136 (qwen3_235b_a22b_b200_config only): `if precision == "fp8_mx":
  # keeping this eanbled causes NaN grad norm` -> comm_overlap / ddp / optimizer overlap_param_gather = False.
  The llama3_8b_* functions (lines 181-250) set nothing.
- v0.3.0 (21b02e0cf, the 26.02 rows) - v0.4.0: no LLM preset in scripts/performance sets overlap_param_gather
  (utils/overrides.py keeps only overlap_param_gather_with_optimizer_step off for fp8_mx).
- v0.4.2 (c81012934, 26.04.01) - v0.5.1: configs/llama/llama31_llm_pretrain.py disable_param_gather_overlap
  (lines 46-55, "avoid OOM", issue #3714) under `precision == "nvfp4" and config_variant == "v2"` in
  llama31_405b_pretrain_config_gb200 (lines 123-124); V2 is 256 GPUs, gbs 1536
  (llama31_workload_base_configs.py LLAMA31_405B_PRETRAIN_CONFIG_GB200_NVFP4_V2). Absent at v0.4.0 (26.04).
"""

from __future__ import annotations

import pytest

from llmplan.estimate import estimate_training

OFF = [
    "bridge-2511-b200-mxfp8-llama31-405b-128gpu-gbs64",
    "mbridge-25.11-pretrain-deepseekv3-w-o-mtp-dgx-gb300-256gpu-fp8mx-tp1pp2cp1ep32vp4gbs4096mbs1",
    "mbridge-25.11-pretrain-deepseekv3-w-o-mtp-dgx-gb200-256gpu-fp8mx-tp1pp8cp1ep32vp4gbs4096mbs1",
    "mbridge-26.04.01-pretrain-llama3.1-405b-dgx-gb200-256gpu-nvfp4-tp4pp16cp1epnavp8gbs1536mbs1",
    "mbridge-26.06-pretrain-llama3.1-405b-dgx-gb200-256gpu-nvfp4-tp4pp16cp1epnavp8gbs1536mbs1",
]
ON = [
    # 25.11 rows the v0.2.0 override does not reach: the 8B functions, FP8-CS, DeepSeek-V3 on B200
    "bridge-2511-b200-mxfp8-llama3-8b-8gpu-gbs128",
    "bridge-2511-gb300-mxfp8-llama3-8b-8gpu-gbs128",
    "bridge-2511-b200-fp8-cs-llama31-405b-128gpu-gbs64",
    "mbridge-25.11-pretrain-deepseekv3-w-mtp-dgx-b200-256gpu-fp8mx-tp1pp16cp1ep8vp1gbs2048mbs1",
    "mbridge-25.11-pretrain-qwen3-30b-a3b-dgx-gb300-8gpu-fp8mx-tp1pp1cp1ep8vp1gbs512mbs4",
    # 26.02 (v0.3.0) onwards: no MXFP8 override
    "bridge-2602-gb300-mxfp8-llama3-70b-64gpu-gbs256",
    "bridge-2602-gb200-mxfp8-llama31-405b-256gpu-gbs1536",
    "mbridge-26.04.01-pretrain-llama3.1-405b-dgx-gb300-256gpu-mxfp8-tp2pp8cp2epnavp4gbs1536mbs1",
    "mbridge-26.06-pretrain-deepseekv3-dgx-gb300-256gpu-mxfp8-tp1pp2cp1ep32vp8gbs4096mbs1",
    # the NVFP4 V2 workaround is not in v0.4.0 (26.04) nor v0.3.1 (26.02.01)
    "mbridge-26.04-pretrain-llama3.1-405b-dgx-gb200-256gpu-nvfp4-tp4pp16cp1epnavp8gbs1536mbs1",
    "mbridge-26.02.01-pretrain-llama3.1-405b-dgx-gb200-256gpu-nvfp4-tp4pp16cp1epnavp4gbs1536mbs1",
]


@pytest.mark.parametrize("rid", OFF)
def test_presets_that_turn_the_gather_overlap_off(rid, row_plan):
    assert row_plan(rid).overlap_param_gather is False


@pytest.mark.parametrize("rid", ON)
def test_presets_that_keep_it(rid, row_plan):
    assert row_plan(rid).overlap_param_gather is True


def test_skipped_qwen_b200_row_is_read_too(published_runs, acc):
    """qwen3_235b_a22b_b200_config (v0.2.0 lines 133-136) turns it off; the row itself is not scored (issue #1705)."""
    rid = "mbridge-25.11-pretrain-qwen3-235b-a22b-dgx-b200-64gpu-fp8mx-tp1pp8cp1ep8vp2gbs1024mbs1"
    assert acc.mbridge_param_gather_off(published_runs[rid])
    assert not acc.mbridge_param_gather_off(
        published_runs["mbridge-25.11-pretrain-qwen3-30b-a3b-dgx-b200-8gpu-fp8mx-tp1pp1cp1ep8vp1gbs512mbs1"])


def test_exposed_gather_is_priced_on_the_405b_b200_mxfp8_row(row_setup):
    """The 25.11 B200 405B MXFP8 plan (tp4 pp8 vp8 cp2 dp2) gathers 405B / 32 of bf16 weights per rank after the
    step: with the overlap off the step is longer than with it on (the row ran off; measured 624 tokens/s/GPU)."""
    m, c, off = row_setup("bridge-2511-b200-mxfp8-llama31-405b-128gpu-gbs64")
    on = off.model_copy(update={"overlap_param_gather": True})
    t_off, t_on = estimate_training(m, c, off).time.total, estimate_training(m, c, on).time.total
    assert t_off > 1.02 * t_on
