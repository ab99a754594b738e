"""The timing window of DGX Cloud Benchmarking's Nemotron-H 56B step times (docs/validation.md#dgxc-warmup-window).

NVIDIA/dgxc-benchmarking nemotron-h/README.md prints one example line of parse_train_timing.sh per release. At
856bfc4d (v25.08, nemo:25.04.01) it averages iterations 11-44: 15.714 s, std 2.989 s, for 256 H100 (TP8, MBS1,
GBS768). At 2fc17d4e (v25.08.01, nemo:25.07.01) the README moves the window to iterations 35-44 because "the
early training steps typically take much longer time" and prints 11.874 s, std 0.027 s, for 128 H100 with the
same per-GPU work (TP8, MBS1, GBS384: 24 micro-batches a replica in both). The 11-44 mean is not a steady-state
step time, so the row is listed as skipped, not scored (accuracy.DGXC_SKIP).
"""

from __future__ import annotations

import pytest

H100_256 = "dgxc-2508-pretrain-nemotron-h-56b-h100-256gpu-fp8-tp8pp1mbs1gbs768"
H100_128 = "dgxc-2508-pretrain-nemotron-h-56b-h100-128gpu-fp8-tp8pp1mbs1gbs384"
GB200_128 = "dgxc-2510-pretrain-nemotron-h-56b-gb200-128gpu-fp8-tp4pp1mbs2gbs384"

# (README commit, first and last timed iteration, mean s, std s), as each README's example output prints them.
PUBLISHED = {H100_256: ("856bfc4d", 11, 44, 15.714, 2.989), H100_128: ("2fc17d4e", 35, 44, 11.874, 0.027),
             GB200_128: ("8e77d607", 35, 44, 5.310, 0.007)}


def test_records_carry_the_published_window(published_runs):
    for rid, (_, first, last, mean, _std) in PUBLISHED.items():
        rec = published_runs[rid]
        assert f"iterations {first}-{last}" in rec["source"]["ref"], rid
        assert rec["measured"]["iteration_time_s"] == mean


def test_same_per_gpu_work_at_128_and_256_h100(published_runs):
    # The READMEs' TP8 PP1 MBS1 layouts, GBS768 on 256 GPUs and GBS384 on 128: 24 micro-batches a replica in both.
    for rid in (H100_256, H100_128):
        rec = published_runs[rid]
        par, gpus = rec["parallel"], rec["hardware"]["gpus"]
        assert (par["tp"], par["pp"], par["micro_batch"]) == (8, 1, 1), rid
        assert par["global_batch"] // (gpus // par["tp"]) == 24, rid


def test_warmup_window_row_is_skipped_with_its_reason(acc, published_runs):
    # Fails on the old reading, which scored the 11-44 mean as a step time (+26% against llmplan).
    rec = published_runs[H100_256]
    why = acc.skip_reason(rec)
    assert why is not None and "11-44" in why and "warm-up" in why
    assert acc.predict(rec, "dgxc") == []


@pytest.mark.parametrize("rid", [H100_128, GB200_128])
def test_steady_window_rows_stay_scored(acc, published_runs, rid):
    assert acc.skip_reason(published_runs[rid]) is None and acc.predict(published_runs[rid], "dgxc")


def test_only_the_warmup_window_is_noisy(published_runs):
    # The rule behind the skip, from the published numbers (which the records' notes carry): the 11-44 line's
    # spread is 19% of its mean, the 35-44 lines' under 1%.
    for rid, (_, _, _, mean, std) in PUBLISHED.items():
        assert f"Step time {mean} s (std {std:.3f} s)" in published_runs[rid]["notes"], rid
    cv = {rid: std / mean for rid, (_, _, _, mean, std) in PUBLISHED.items()}
    assert cv[H100_256] > 0.15 and max(cv[H100_128], cv[GB200_128]) < 0.01
