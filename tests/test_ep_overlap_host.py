"""benchmarks/ep_overlap_host.py (docs/validation.md#ep-overlap-host): the host's issue time of Megatron-Core's
EP-overlap schedule per layer pair, counted from the source, against the GPU time of the pair. The findings the
section rests on: on the three Qwen3-235B-A22B rows MBRIDGE_SKIP holds for the overlap's "CPU overhead"
(Megatron-Bridge PR #1760) the count stays far under the GPU's time, and the same count cannot separate the B200
row (priced 38% fast) from the H100 rows of the same model, layout family and schedule (priced within 10%)."""

from __future__ import annotations

import ep_overlap_host as E  # benchmarks/ is on the path (conftest)
import pytest

B200 = "mbridge-25.11-pretrain-qwen3-235b-a22b-dgx-b200-64gpu-fp8mx-tp1pp8cp1ep8vp2gbs1024mbs1"
B300 = ("mbridge-26.02-pretrain-qwen3-235b-a22b-dgx-b300-256gpu-mxfp8-tp1pp8cp1ep8vp4gbs8192mbs1",
        "mbridge-26.02.01-pretrain-qwen3-235b-a22b-dgx-b300-256gpu-mxfp8-tp1pp8cp1ep8vp4gbs8192mbs1")
H100 = "mbridge-26.02-pretrain-qwen3-235b-a22b-dgx-h100-256gpu-fp8-tp2pp8cp1ep32vp4gbs8192mbs1"


def test_node_ops_are_the_passes_counted_in_the_source():
    # Megatron-LM pipeline_parallel/utils.py at d98e8a6: 4 forward node passes of 5 host calls, 4 backward of 6,
    # 2 weight-gradient passes of 4 (TransformerLayerSchedulePlan.run issues 10 passes a layer pair)
    assert E.NODE_HOST_OPS == 4 * 5 + 4 * 6 + 2 * 4


@pytest.mark.parametrize("rid", (B200, *B300))
def test_skipped_rows_are_priced_as_run_and_the_host_count_does_not_bind(published_runs, rid):
    r = E.row(published_runs[rid])
    assert r is not None and r["path"] == "alltoall/none" and r["f"] == 1.0  # x86 hosts, eager, alltoall
    assert r["host"] < 0.25 * r["gpu"]  # the pair's GPU time is over 4x the host's issue time
    assert r["need"] > 5  # the host would have to be over 5x slower per op than the published costs
    assert r["err"] > 30  # and llmplan prices the preset that fast: the gap the rows are skipped for


def test_the_count_cannot_separate_the_b200_row_from_the_h100_rows(published_runs, acc):
    b200, h100 = E.row(published_runs[B200]), E.row(published_runs[H100])
    assert b200 is not None and h100 is not None
    assert abs(b200["host"] / b200["gpu"] - h100["host"] / h100["gpu"]) < 0.05
    (_, pred, meas), *_ = acc.predict(published_runs[H100], acc.family(H100))
    assert h100["err"] == pytest.approx(100 * (pred / meas - 1), rel=1e-6)  # the error accuracy.py scores
    # within 2% before docs/validation.md#ep-stage; its EP32 all-to-alls now counted on a middle rank's 12 MoE
    # layers (not rank 0's 11) and with the probabilities' calls it prices 6.7% slow; 8.8% slow since the EP
    # overlap's hidden share was re-read at 0.74 (docs/validation.md#h100-moe-spread): still 30 points from the B200
    assert abs(h100["err"]) < 10 and b200["err"] - h100["err"] > 30
