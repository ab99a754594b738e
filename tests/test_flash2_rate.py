"""FlashAttention-2 priced at its own published rate (docs/formulas.md#compute.flash2_rate), not as a ratio to the
fitted native asymptote (issue 32). Golden: the profiles' flash2_attention_efficiency, through the cp = 1 rate
curve, gives the published forward + backward TFLOP/s within a stated tolerance."""

from __future__ import annotations

import pytest

from llmplan.cost.attention_rate import (
    attention_fraction,
    attention_rate_ratio,
    fused_attention_asymptote,
)
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

S = builtin_systems()
M = builtin_models()
# Published FlashAttention-2 forward + backward, causal, head dim 128, 16 heads, batch x sequence = 16k tokens,
# TFLOP/s as benchmarks/benchmark_flash_attention.py counts them (causal pairs halved, backward 2.5x forward):
#  - A100 80GB SXM4: Dao 2023 (arXiv 2307.08691), Figure 4d = Dao-AILab/flash-attention
#    assets/flash2_a100_fwd_bwd_benchmark.png;
#  - H100 80GB SXM5: Dao-AILab/flash-attention assets/flash2_h100_fwd_bwd_benchmark.png.
PUBLISHED = {"dgx-a100": {4096: 173, 8192: 182, 16384: 189}, "dgx-h100": {4096: 294, 8192: 308, 16384: 328}}
TOLERANCE = 0.04  # one asymptote per GPU through the rate curve (compute.cp_attention's own 5-8% band)
COUNT = 12 / 7  # llmplan's count (causal not halved, backward 2x forward) over the published one: 2 x 3 / 3.5


def _bench_model():
    return M["llama-3.1-8b"].model_copy(update={"num_attention_heads": 16, "hidden_size": 2048})


@pytest.mark.parametrize("system", list(PUBLISHED))
def test_profile_flash2_rate_gives_the_published_points(system):
    gpu, m = S[system].gpu, _bench_model()
    peak = gpu.tflops["bf16"]
    for s, pub in PUBLISHED[system].items():
        plan = ParallelPlan(tp=1, seq_len=s, micro_batch=16384 // s, attention_kernel="flash2")
        # the rate training prices: the asymptote against the sustained peak (peak x sustained_clock_fraction)
        rate = float(fused_attention_asymptote(gpu, plan) * attention_rate_ratio(m, plan, gpu)) * peak \
            * gpu.sustained_clock_fraction / COUNT
        assert rate == pytest.approx(pub, rel=TOLERANCE), s


@pytest.mark.parametrize("system", list(PUBLISHED))
def test_published_rate_is_read_at_its_own_clock(system):
    # The published loop ran the kernel at the vendor's power limit, at the clock it holds there: the priced
    # absolute rate does not move with the fitted sustained_clock_fraction (the GEMM-bound step's clock), and a
    # power cap slows it by the clock the cap keeps (at_power_limit's law; docs/formulas.md#compute.flash2_rate).
    gpu, plan = S[system].gpu, ParallelPlan(tp=1, seq_len=8192, attention_kernel="flash2")

    def absolute(g):
        return float(fused_attention_asymptote(g, plan)) * g.sustained_clock_fraction

    slower = gpu.model_copy(update={"sustained_clock_fraction": gpu.sustained_clock_fraction * 0.9})
    assert absolute(slower) == pytest.approx(absolute(gpu))
    capped = gpu.at_power_limit(gpu.power_limit_w / 2)
    assert absolute(capped) == pytest.approx(absolute(gpu) * 0.5 ** (1 / 3))


def test_fa2_does_not_follow_the_fitted_native_asymptote():
    # FA2's rate is its own: raising the fitted attention_efficiency moves Hopper's native kernel only, and on
    # Ampere (native kernel FA2) neither.
    m = M["llama-3.1-8b"]
    for system, native_moves in (("dgx-h100", True), ("dgx-a100", False)):
        gpu = S[system].gpu
        fast = gpu.model_copy(update={"attention_efficiency": gpu.attention_efficiency * 1.5})
        for kernel in ("native", "flash2"):
            plan = ParallelPlan(tp=1, seq_len=8192, attention_kernel=kernel)
            moved = float(attention_fraction(fast, plan, m)) != pytest.approx(float(attention_fraction(gpu, plan, m)))
            assert moved == (native_moves and kernel == "native"), (system, kernel)


def test_without_a_published_fa2_rate_the_ratio_prices_it():
    gpu = S["dgx-h100"].gpu.model_copy(update={"flash2_attention_efficiency": None})
    plan = ParallelPlan(tp=1, seq_len=8192, attention_kernel="flash2")
    assert float(fused_attention_asymptote(gpu, plan)) == pytest.approx(gpu.flash2_attention_ratio
                                                                          * gpu.attention_efficiency)
