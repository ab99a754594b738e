"""The fused attention kernel's rate against sequence length at cp = 1 (compute.cp_attention): one causal call
of s tokens runs below the kernel's asymptote (its diagonal tiles computed whole, each CTA's fixed work) (issue 32).
Golden tests against the published curves, relative to their 16k point, within a stated tolerance."""

from __future__ import annotations

import itertools

import pytest

from llmplan.cost.compute import (
    ATTENTION_FIXED_KEYS,
    ATTENTION_TILE,
    attention_call_seconds,
    attention_rate_ratio,
)
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

S = builtin_systems()
M = builtin_models()
LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)

# Published causal rates, head dim 128, batch x sequence = 16k tokens, 16 heads, TFLOP/s (causal FLOPs
# halved, the papers' count), by sequence length:
#  - FlashAttention-2 forward + backward on A100 80GB SXM4: Dao 2023 (arXiv 2307.08691), Figure 4d
#    (Dao-AILab/flash-attention assets/flash2_a100_fwd_bwd_benchmark.png);
#  - FlashAttention-2 forward + backward on H100 80GB SXM5: the same repository's
#    assets/flash2_h100_fwd_bwd_benchmark.png, panel (d);
#  - FlashAttention-3 forward on H100: Shah et al. 2024 (arXiv 2407.08608), Figure 5, causal, head dim 128.
CAUSAL = {
    ("flash2", 108, "fwd+bwd"): (99, 133, 155, 173, 182, 189),
    ("flash2", 132, "fwd+bwd"): (163, 221, 265, 294, 308, 328),
    ("native", 132, "fwd"): (292, 423, 521, 579, 602, 616),
}
TOLERANCE = 0.08  # the one fixed-work form, k0 solved on H100's non-causal 512 / 16k points (tests/test_cp_short.py)


def _causal_rate(s: int, sms: int, kernel: str, direction: str) -> float:
    """Useful (causal) tile iterations per unit time of one causal call of s tokens, 16k tokens in the batch;
    forward + backward weighted as the papers count them (backward 2.5 x the forward's FLOPs)."""
    k_fwd, k_bwd = ATTENTION_FIXED_KEYS[kernel]
    n = s // ATTENTION_TILE
    rows = n * 16 * (16384 // s)
    work = rows * (n + 1) / 2
    fwd = float(attention_call_seconds(rows, work, n, sms, k_fwd))
    bwd = float(attention_call_seconds(rows, work, n, sms, k_bwd))
    useful = rows * n / 2
    return useful / fwd if direction == "fwd" else 3.5 * useful / (fwd + 2.5 * bwd)


@pytest.mark.parametrize("kernel, sms, direction", list(CAUSAL))
def test_causal_call_rate_follows_the_published_curve(kernel, sms, direction):
    pub = CAUSAL[(kernel, sms, direction)]
    model = [_causal_rate(s, sms, kernel, direction) for s in LENGTHS]
    for s, p, r in zip(LENGTHS, pub, model):
        assert r / model[-1] == pytest.approx(p / pub[-1], rel=TOLERANCE), s


def test_the_layer_s_ratio_rises_with_the_sequence_and_stays_below_the_asymptote():
    m, gpu = M["llama-3.1-8b"], S["dgx-h100"].gpu
    ratios = [float(attention_rate_ratio(m, ParallelPlan(tp=2, seq_len=s), gpu)) for s in LENGTHS + (131072,)]
    assert all(a < b for a, b in itertools.pairwise(ratios)), ratios
    assert ratios[-1] < 1.0 and ratios[-1] > 0.99
    # the same function prices the ring: cp 2 at 8k runs below cp 1 at 8k
    assert float(attention_rate_ratio(m, ParallelPlan(tp=2, cp=2, seq_len=8192), gpu)) < ratios[4]


@pytest.mark.parametrize("weight", [0.0, 2.0, 5.0])
def test_one_constant_weighs_the_backward_calls_everywhere(monkeypatch, weight):
    # The backward's weight against the forward (ATTENTION_BACKWARD_WEIGHT, compute.time: backward = 2 x forward)
    # is one named constant: moving it moves attention_rate_ratio's causal call, the sliding-window call and the
    # FP8 per-pass weighting together, as the hand-written forward + weight x backward below.
    from llmplan.cost import attention_rate as ar

    monkeypatch.setattr(ar, "ATTENTION_BACKWARD_WEIGHT", weight)
    m, gpu, s = M["llama-3.1-8b"], S["dgx-h100"].gpu, 4096
    plan = ParallelPlan(tp=2, seq_len=s)
    k_fwd, k_bwd = ATTENTION_FIXED_KEYS["native"]
    n = s // ATTENTION_TILE
    heads = m.num_attention_heads / 2
    rows, work = n * heads, heads * n * (n + 1) / 2
    fwd = float(attention_call_seconds(rows, work, n, gpu.sm_count, k_fwd))
    bwd = float(attention_call_seconds(rows, work, n, gpu.sm_count, k_bwd))
    useful = heads * n * n / 2 / gpu.sm_count
    expected = (1 + weight) * useful / (fwd + weight * bwd)
    assert float(ar.attention_rate_ratio(m, plan, gpu)) == pytest.approx(expected, rel=1e-12)
    # a window as long as the sequence is the causal call (window_rate_ratio's w >= s)
    windowed = m.model_copy(update={"sliding_window": s})
    assert float(ar.window_rate_ratio(windowed, plan, gpu)) == pytest.approx(expected, rel=1e-12)
    # FP8: the published per-pass ratios weighted 1 : weight
    gb200 = S["gb200-nvl72"].gpu
    fp8 = ParallelPlan(dp=8, global_batch=64, seq_len=s, dtype="fp8", recipe="mxfp8", fp8_attention=True)
    d, r_fwd, r_bwd = min(gb200.fp8_attention_points["mxfp8"])
    assert d == 128 == ar.mean_head_dim(m)
    assert float(ar.fp8_attention_ratio(m, fp8, gb200)) == pytest.approx(
        (1 + weight) / (1 / r_fwd + weight / r_bwd), rel=1e-12)
