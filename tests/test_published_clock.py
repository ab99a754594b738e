"""One reading of every published kernel rate (docs/formulas.md#compute.published_clock): FlashAttention-2's, the
cuDNN releases' and the Mamba-2 SSD scan's published rates are read at the clock their benchmarks ran at (the
vendor's power limit: NVIDIA/cudnn-frontend benchmark/README.md at b740542 sets `nvidia-smi -ac 3201,1980` and
`-pl 700`; Dao-AILab/flash-attention's and tile-ai/tilelang's loops ran unlocked), so refitting the sustained
clock of the GEMM-bound step leaves the time of a published-rate kernel unchanged; only a power cap moves it,
by the clock the cap keeps (step.power's cube-root law). The fitted native attention_efficiency keeps the
clock (it was fitted against it): the property's counter-case."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.compute import attention_fraction, ssd_scan_seconds
from llmplan.specs.hardware import GpuSpec, power_clock_ratio
from llmplan.specs.plan import ATTENTION_RELEASES, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

S = builtin_systems()
M = builtin_models()


def _attention_seconds(gpu: GpuSpec, plan: ParallelPlan) -> float:
    """Seconds per attention FLOP at the kernel's asymptote and the model's head dimension."""
    return 1.0 / float(gpu.sustained_flops("bf16") * attention_fraction(gpu, plan, M["llama-3.1-8b"]))


def _published_seconds(gpu: GpuSpec) -> list[float]:
    """The time of each published-rate kernel on this GPU: FA2, each cuDNN release, the SSD scan."""
    base = ParallelPlan(tp=1, pp=1, dp=1, micro_batch=1, global_batch=1, seq_len=8192)
    plans = [base.model_copy(update={"attention_kernel": "flash2"})]
    plans += [base.model_copy(update={"attention_release": r}) for r in ATTENTION_RELEASES]
    ssd = float(ssd_scan_seconds(M["nemotron-3-nano"], base, gpu)[1])
    return [_attention_seconds(gpu, p) for p in plans] + [ssd]


@settings(max_examples=40, deadline=None, derandomize=True)
@given(clock=st.floats(0.5, 1.0), system=st.sampled_from(["dgx-h100", "dgx-h200", "hgx-h100-96gb", "dgx-h800"]))
def test_refitting_the_sustained_clock_leaves_published_rate_kernels_unchanged(clock: float, system: str) -> None:
    gpu = S[system].gpu
    refit = gpu.model_copy(update={"sustained_clock_fraction": clock})
    assert _published_seconds(refit) == pytest.approx(_published_seconds(gpu), rel=1e-9)
    # the counter-case: the fitted native asymptote (no release named) moves with the clock
    native = ParallelPlan(tp=1, pp=1, dp=1, micro_batch=1, global_batch=1, seq_len=8192)
    assert _attention_seconds(refit, native) == pytest.approx(
        _attention_seconds(gpu, native) * gpu.sustained_clock_fraction / clock, rel=1e-9)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(share=st.floats(0.6, 0.95), clock=st.floats(0.5, 1.0))
def test_a_power_cap_slows_published_rate_kernels_by_the_clock_it_keeps(share: float, clock: float) -> None:
    gpu = S["dgx-h100"].gpu
    assert gpu.power_limit_w is not None
    watts = gpu.power_limit_w * share
    capped = gpu.model_copy(update={"sustained_clock_fraction": clock}).at_power_limit(watts)
    slow = 1.0 / power_clock_ratio(watts, gpu.power_limit_w)
    assert _published_seconds(capped) == pytest.approx([t * slow for t in _published_seconds(gpu)], rel=1e-9)
