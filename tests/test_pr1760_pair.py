"""benchmarks/pr1760_pair.py (docs/validation.md#pr1760-pair): Megatron-Bridge PR #1760's BF16 pair (Qwen3-235B-A22B,
64 B200, PP8 VP4 EP8, alltoall; only overlap_moe_expert_parallel_comm toggled; "BF16 step time improved from
17.2s to 16s"). The findings the section rests on: the off arm's miss does not sit in its expert all-to-alls (at
their line-rate floor the arm is still priced over 5% slow), the B200 rows that share its all-to-all path are priced
fast rather than slow, the Blackwell BF16 rows of the same model share its miss; and (a strict xfail) the
overlap priced as the loss the pair measures, which llmplan does not do yet."""

from __future__ import annotations

import pr1760_pair as P  # benchmarks/ is on the path (conftest)
import pytest


@pytest.fixture(scope="module")
def arms(published_runs):
    return [P.take_apart(published_runs[rid]) for rid in P.ARMS]


def test_the_pair_is_scored_as_the_pr_states_it(published_runs, acc, arms):
    # PR #1760's description: 17.2 s with the overlap, 16 s without (64 GPUs x 16,384 tokens a step)
    off, on = arms
    assert off["meas"] == pytest.approx(16.0, abs=0.01) and on["meas"] == pytest.approx(17.2, abs=0.01)
    for rid, r in zip(P.ARMS, arms, strict=True):
        assert acc.skip_reason(published_runs[rid]) is None
        (_, pred, meas), *_ = acc.predict(published_runs[rid], acc.family(rid))
        assert r["err"] == pytest.approx(100 * (pred / meas - 1), rel=1e-6)  # the error accuracy.py scores


def test_the_off_arms_all_to_alls_cannot_carry_its_miss(arms):
    off, _ = arms
    # all of the alltoall dispatcher's calls sit in the step without the overlap (synchronous all_to_all_single);
    # the floor sends the T x k x h bf16 rows that leave the GPU at the NVLink's one-way rate, no efficiency lost
    assert off["message"] == pytest.approx(2 * 4096 * 8 * 4096, rel=0.02)  # most-loaded rank's rows, +< 2%
    # 128 micro-batches x 12 MoE layers (a middle rank's, docs/validation.md#ep-stage) x 4 token calls, and the
    # routing probabilities' T x k fp32 values in 2 calls a layer (token_dispatch's second all_to_all)
    assert off["calls"] == 128 * 12 * 4 and off["probs_calls"] == 128 * 12 * 2
    assert off["probs_message"] == pytest.approx(4 * 4096 * 8, rel=0.02)
    assert off["floor_call_s"] < off["call_s"]
    # with its all-to-alls at their line-rate floor the arm is still priced over 5% slow (the rest of the step,
    # 15.7 s since docs/validation.md#routing-passes, 16.3 s before, is within 2% of the measured 16.0 s)
    rest = off["total"] - off["ep"]
    assert rest + off["ep_floor"] > 1.05 * off["meas"]


def test_rows_on_the_same_path_are_priced_fast_and_bf16_rows_slow(published_runs, arms):
    off, _ = arms
    assert off["err"] < -8
    # the rows on the same all-to-all path are priced near (the two 26.x rows -1.4 / -0.6% since the quantisation
    # padding and the later stages' gathers, docs/validation.md#dsv3-variants, #te-ce-later-stages; +8.7 / +9.6%
    # before; the 25.09 row +0.4%): none slow like the arm (under -8%)
    assert all(P.take_apart(published_runs[rid])["err"] > -4 for rid in P.SAME_PATH)
    assert all(P.take_apart(published_runs[rid])["err"] < -8 for rid in P.SAME_PRECISION)


@pytest.mark.xfail(strict=True, reason="llmplan prices PR #1760's EP overlap as a 7% gain; the pair measures a 7.5% "
                   "loss (docs/validation.md#pr1760-pair): the overlap's extra cost is not priced yet")
def test_the_overlap_is_priced_as_the_loss_the_pair_measures(arms):
    off, on = arms
    assert on["meas"] > off["meas"]  # the published pair: 17.2 s with the overlap, 16.0 s without
    assert on["total"] > off["total"]
