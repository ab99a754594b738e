"""Megatron-Bridge's Qwen3-30B-A3B H100 FP8 rows as accuracy.py reads them (docs/validation.md#qwen3-h100-fp8-rows).

Expected values are read by hand from the public sources named in each test, not from the code under test."""

import pytest

H100 = "mbridge-{r}-pretrain-qwen3-30b-a3b-dgx-h100-16gpu-{p}"
EP16 = [H100.format(r=r, p="fp8-tp1pp1cp1ep16vpnagbs1024mbs1") for r in ("26.04", "26.04.01", "26.06")]
ERRATUM = H100.format(r="26.02.01", p="fp8-tp1pp2cp1ep8vp12gbs1024mbs1")
REGRESSED = {
    "mbridge-25.11-pretrain-qwen3-30b-a3b-dgx-h100-16gpu-fp8cs-tp1pp2cp1ep8vp24gbs512mbs2":
        "mbridge-25.09-pretrain-qwen3-30b-a3b-tokendrop-dgx-h100-16gpu-fp8-tp1pp2cp1ep8vp24gbs512mbs2",
    "mbridge-25.11-pretrain-qwen3-30b-a3b-dgx-b200-8gpu-fp8mx-tp1pp1cp1ep8vp1gbs512mbs1":
        "mbridge-25.09-pretrain-qwen3-30b-a3b-tokendrop-dgx-b200-8gpu-fp8-tp1pp1cp1ep8vp1gbs512mbs1",
}
STILL_REGRESSED = {
    "mbridge-26.02-pretrain-qwen3-30b-a3b-dgx-h100-16gpu-fp8-tp1pp2cp1ep8vp12gbs1024mbs1":
        "mbridge-25.11-pretrain-qwen3-30b-a3b-dgx-h100-16gpu-fp8cs-tp1pp2cp1ep8vp24gbs512mbs2",
    "mbridge-26.02-pretrain-qwen3-30b-a3b-dgx-b200-8gpu-mxfp8-tp1pp1cp1ep8vpnagbs512mbs1":
        "mbridge-25.11-pretrain-qwen3-30b-a3b-dgx-b200-8gpu-fp8mx-tp1pp1cp1ep8vp1gbs512mbs1",
}


def _rate(rec: dict) -> float:
    return rec["measured"]["tokens_per_s_per_gpu"]


def test_dropless_x86_rows_of_25_11_and_26_02_are_skipped_as_issue_1998(published_runs, acc):
    # NVIDIA-NeMo/Megatron-Bridge issue #1998 ("[Regression] Low QWEN3 30B B200 and H100 performance with
    # dropless", 2026-01-20): 25.11 is 2x slower than 25.09's token-drop runs on H100 and B200. The published
    # numbers show it at the same layouts (H100 PP2 VP24 EP8 MBS2: 5,275 against 10,494; B200 MBS1: 9,299
    # against 18,066), and 26.02 still at 25.11's rate (5,113 and 9,691, within 5%).
    for bad, before in REGRESSED.items():
        assert _rate(published_runs[bad]) <= 0.55 * _rate(published_runs[before])
        assert acc.skip_reason(published_runs[before]) is None  # the token-drop runs stay scored
    for bad, prior in STILL_REGRESSED.items():
        assert _rate(published_runs[bad]) == pytest.approx(_rate(published_runs[prior]), rel=0.05)
    for rid in list(REGRESSED) + list(STILL_REGRESSED):
        assert "#1998" in (acc.skip_reason(published_runs[rid]) or ""), rid
        assert acc.predict(published_runs[rid], "mbridge-moe") == []
    # only those four rows: the same tables' GB200 / GB300 / B300 rows and every 26.02.01 row stay scored
    skipped = [rid for rid, r in published_runs.items() if "qwen3-30b" in rid and acc.skip_reason(r)]
    assert sorted(skipped) == sorted(list(REGRESSED) + list(STILL_REGRESSED))


def test_26_02_01_h100_row_is_read_as_its_release_preset(published_runs, acc):
    # The 26.02.01 table (docs/performance-summary.md at cfeddcd94) lists PP2 VP12 EP8 for 9,058 tokens/s per GPU;
    # v0.3.1's QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1 (f29a269f8, PR #2477 "Update Qwen3 30B H100 Base
    # Configs with HybridEP") runs PP1 EP16 hybridep without moe_a2a_overlap: the 26.04 / 26.06 tables' layout,
    # whose rows read 8,826 - 8,960. So the row prices as the EP16 rows do.
    plan = acc.plan_for(published_runs[ERRATUM], "mbridge-moe", 16)
    assert (plan.pp, plan.vpp, plan.ep, plan.dp) == (1, 1, 16, 16)
    assert _rate(published_runs[ERRATUM]) == pytest.approx(_rate(published_runs[EP16[0]]), rel=0.03)
    assert acc.predict(published_runs[ERRATUM], "mbridge-moe")[0][1] == \
        pytest.approx(acc.predict(published_runs[EP16[0]], "mbridge-moe")[0][1], rel=1e-9)


@pytest.mark.parametrize("rid", EP16 + [ERRATUM])
def test_ep16_fp8_rows_run_the_h100_fp8_cs_preset(published_runs, acc, rid):
    # v0.3.1 - v0.5.0 scripts/performance/configs/qwen/qwen3_workload_base_configs.py H100_FP8_CS_V1: EP16,
    # moe_a2a_overlap False, hybridep, no cuda_graph_impl (the BF16 preset graphs moe_router / moe_preprocess);
    # utils/overrides.py _set_common_perf_overrides: moe_hybridep_num_sms 32 for hybridep; utils/precision.py:
    # bf16_with_fp8_current_scaling_mixed (tensorwise, fp8_param_gather) with first_last_layers_bf16 False;
    # qwen3_llm_pretrain.py set_qwen3_common_configs: recompute_granularity None.
    plan = acc.plan_for(published_runs[rid], "mbridge-moe", 16)
    assert (plan.dtype, plan.recipe, plan.fp8_scaling, plan.fp8_params) == ("fp8", "tensorwise", "current", True)
    assert (plan.bf16_layers_start, plan.bf16_layers_end) == (0, 0)
    assert (plan.moe_dispatcher, plan.moe_flex_backend, plan.moe_dispatch_sms) == ("deepep", "hybridep", 32)
    assert not plan.ep_comm_overlap and plan.cuda_graphs == "none" and plan.recompute == "none"
    assert plan.expert_gemm == "per-expert"  # TEGroupedMLP (moe_grouped_gemm, no op fuser on H100)
