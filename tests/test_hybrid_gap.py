"""benchmarks/hybrid_gap.py (docs/validation.md#hybrid-gap): the Nemotron-3 Ultra rows against the Nemotron-3
Super rows of the same Megatron-Bridge 26.08 table (NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md at
4ab94dfad: Super GB300 TP1 9,856 and GB200 TP2 7,040 tokens/s per GPU, MXFP8, 64 GPUs; Ultra GB300 TP1 3,552 and
GB200 TP2 2,528, MXFP8, 256 GPUs). What is asserted: the unplaced-time arithmetic by hand; the published fact that
both models lose the same share going from GB300 TP1 to GB200 TP2; and (a strict xfail) llmplan's price of that
share, which it does not meet yet."""

from __future__ import annotations

import hybrid_gap as H  # benchmarks/ is on the path (conftest)
import pytest

RATIO_TOLERANCE = 0.03
"""|predicted / measured - 1| of the GB200-TP2 / GB300-TP1 tokens/s ratio: the four rows are one table of one
release (each rounded to the table's 4 digits), so 3% is a price right to a few points."""


def test_unplaced_time_by_hand():
    # predicted 2.0 s a step at 4,000 tokens/s per GPU, measured 3,200: the measured step is 2.0 x 4,000 / 3,200
    # = 2.5 s, 0.5 s unplaced; 250 ms a micro-batch over 2, 2.5 ms a layer and micro-batch over 100 layers
    got = H.unplaced(2.0, 4000.0, 3200.0, 2, 100)
    assert got["measured_ms"] == pytest.approx(2500.0)
    assert got["gap_ms"] == pytest.approx(500.0)
    assert got["per_mb_ms"] == pytest.approx(250.0)
    assert got["per_layer_mb_ms"] == pytest.approx(2.5)


def test_both_models_lose_the_same_share_at_gb200_tp2(published_runs):
    tps = {k: published_runs[rid]["measured"]["tokens_per_s_per_gpu"] for k, rid in H.ROWS.items()}
    assert (tps[("super", "gb300")], tps[("super", "gb200")]) == (9856, 7040)
    assert (tps[("ultra", "gb300")], tps[("ultra", "gb200")]) == (3552, 2528)
    # 7,040 / 9,856 = 0.714 and 2,528 / 3,552 = 0.712: one share for both models within 0.5%
    assert tps[("ultra", "gb200")] / tps[("ultra", "gb300")] == pytest.approx(
        tps[("super", "gb200")] / tps[("super", "gb300")], rel=0.005)


@pytest.mark.xfail(strict=True, reason="llmplan prices GB200 TP2 at 0.83-0.85 of GB300 TP1 per GPU for both "
                   "Nemotron-3 Super and Ultra where the table measures 0.71 (docs/validation.md#hybrid-gap)")
def test_gb200_tp2_share_is_priced(published_runs):
    for model in ("super", "ultra"):
        a = H.row(published_runs[H.ROWS[(model, "gb200")]])
        b = H.row(published_runs[H.ROWS[(model, "gb300")]])
        assert a["pred"] / b["pred"] == pytest.approx(a["meas"] / b["meas"], rel=RATIO_TOLERANCE)


def test_counterfactual_layouts_keep_gpus_and_tokens_per_rank(published_runs):
    # docs/validation.md#moe-tp2 splits the predicted GB200-TP2 / GB300-TP1 ratio through two swapped plans; the
    # split means something only if every layout runs the row's GPUs and hands each rank the same tokens a step
    # (global batch 512 (Super) / 256 (Ultra) x 8,192 over the 64 / 256 GPUs: 65,536 / 8,192 tokens a GPU a step,
    # SP's shard at TP2), with TP2 at twice TP1's micro-batches
    for model, tokens in (("super", 65_536), ("ultra", 8_192)):
        cases = H.counterfactuals(published_runs, model)
        assert list(cases) == ["gb300 tp1", "gb200 tp1", "gb300 tp2", "gb200 tp2"]
        for name, (_, cluster, plan) in cases.items():
            assert plan.tp * plan.pp * plan.cp * plan.dp == cluster.num_gpus, name
            assert plan.global_batch * plan.seq_len // cluster.num_gpus == tokens, name
            assert plan.sp == (plan.tp > 1), name
        assert cases["gb200 tp2"][2].num_microbatches == 2 * cases["gb200 tp1"][2].num_microbatches
        assert cases["gb300 tp2"][2].num_microbatches == 2 * cases["gb300 tp1"][2].num_microbatches
        assert cases["gb200 tp1"][1].system.gpu.name == "gb200" and cases["gb300 tp2"][1].system.gpu.name == "gb300"
