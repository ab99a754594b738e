"""The head-dimension curve of fused attention on a GPU whose exponentials lag its tensor cores (Blackwell B200 /
GB200, compute.attention): the per-pair softmax work that makes a pair 1/r as slow at d = 128 raises the
curve's d0, so small heads lose more than r and large ones less."""

from __future__ import annotations

import pytest

from llmplan.cost.attention_rate import attention_fraction, exp_bound_softmax_head_dim
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

S = builtin_systems()
M = builtin_models()


@pytest.mark.parametrize("system", ["dgx-h100", "dgx-a100", "gb300-nvl72", "dgx-b300"])
def test_gpus_whose_exponentials_keep_pace_keep_the_measured_d0(system):
    gpu = S[system].gpu
    assert gpu.softmax_attention_ratio == 1.0
    d0 = gpu.attention_softmax_head_dim
    assert exp_bound_softmax_head_dim(d0, gpu) == pytest.approx(d0)


def test_b200_d0_is_at_least_what_its_exponentials_alone_give():
    """B200 doubles H100's dense bf16 per SM (profile peaks and SM counts) at the same 16 exp2 per SM and clock
    (CUDA C++ Programming Guide, arithmetic instruction throughput, cc 9.0 and 10.0): the exponential share of
    H100's d0 = 43 doubles with it. The d0 the measured 1/1.35 implies must cover that, within 25%."""
    h, b = S["dgx-h100"].gpu, S["dgx-b200"].gpu
    per_sm = (b.peak_flops("bf16") / b.sm_count) / (h.peak_flops("bf16") / h.sm_count)
    exp_only = per_sm * h.attention_softmax_head_dim
    d0 = exp_bound_softmax_head_dim(b.attention_softmax_head_dim, b)
    assert exp_only <= d0 <= 1.25 * exp_only


def _rate(system: str, d: int, r: float | None = None) -> float:
    gpu = S[system].gpu
    if r is not None:
        gpu = gpu.model_copy(update={"softmax_attention_ratio": r})
    m = M["llama-3.1-8b"].model_copy(update={"head_dim": d})
    return float(attention_fraction(gpu, ParallelPlan(seq_len=4096), m))


def test_the_exponential_bound_costs_small_heads_more_and_large_heads_less():
    r = S["dgx-b200"].gpu.softmax_attention_ratio
    slow = {d: _rate("dgx-b200", d) / _rate("dgx-b200", d, r=1.0) for d in (64, 128, 256, 512)}
    assert slow[128] == pytest.approx(r, rel=1e-12)  # unchanged where attention_efficiency was fitted
    assert slow[64] < slow[128] < slow[256] < slow[512] < 1.0
    # d = 64: (64 / (64 + d0')) / (128 / (128 + d0)) with d0' = (128 + d0) / r - 128, by hand
    d0 = S["dgx-b200"].gpu.attention_softmax_head_dim
    d0b = (128 + d0) / r - 128
    assert slow[64] == pytest.approx((64 / (64 + d0b)) / (64 / (64 + d0)), rel=1e-9)
