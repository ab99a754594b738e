"""The Mamba-2 SSD scan on Blackwell at its published per-kernel time (docs/formulas.md#mixers.ssd_rate,
docs/validation.md#nemotron-sources-2026-12-06).

Published: NVIDIA-NeMo/Megatron-Bridge branch zhiyul/determinism-debug-tool at 6d780951a,
scripts/performance/perf_leaderboard/analysis_report_det_vs_nondet.md (2026-06-12), section 3.3: Nemotron-3
Ultra on 96 GB200, nemo 26.04.01, BF16, TP2 PP3 EP32, micro-batch 1 of 8,192 tokens, 8 micro-batches a step;
Nsight on rank 0 (the first pipeline stage: 36 layers, 16 of them Mamba-2) over steps 15-17; the
non-deterministic run's SSM kernels: 7,680 kernels, 913 ms. 7,680 / (3 x 8 x 16) = 20 kernels a layer and
micro-batch, the Triton kernels of state-spaces/mamba's mamba_split_conv1d_scan_combined (forward: chunk_cumsum,
chunk_state, state_passing, bmm_chunk, chunk_scan; backward: four of them recomputed, then chunk_scan_bwd_dz,
chunk_scan_bwd_dstates, state_passing_bwd, chunk_scan_chunk_state_bwd_dx, chunk_state_bwd_db, chunk_scan_bwd_dC,
chunk_scan_bwd_dcb, two bmm_chunk_bwd, chunk_scan_bwd_ddAcs_stable, chunk_cumsum_bwd: mamba_ssm/ops/triton/
ssd_combined.py at e9594ce); the causal convolution (CUDA) and the gated RMSNorm are not among them."""

from __future__ import annotations

import pytest

from llmplan.cost.compute import ssd_scan_seconds
from llmplan.cost.mixers import (
    SSD_SCAN_EFFICIENCY,
    mamba_scan_backward_flops,
    mamba_scan_flops,
)
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

PUBLISHED_S = 0.913 / (3 * 8 * 16)  # one Mamba-2 layer and micro-batch, forward and backward: 2.378 ms
TOKENS, TP = 8192, 2


def _ssd_kernel_bytes_per_token() -> float:
    """HBM bytes a token of the 20 SSD kernels, all heads (divide by TP), counted from their tensors as
    cost.mixers.mamba_forward_bytes / mamba_backward_bytes list them, less the convolution's (forward 4d + 8g;
    recomputed 4d + 8g and its backward 6d + 12g), the gated norm's (4d; 6d) and no layout copies (one sequence
    a micro-batch)."""
    m = builtin_models()["nemotron-3-ultra"]
    H, P, N, G, Q = m.mamba_num_heads, m.mamba_head_dim, m.ssm_state_size, m.n_groups, m.mamba_chunk_size
    d, g, S, GQ = H * P, G * N, H * P * N / Q, G * Q
    forward = 10 * d + 8 * g + 12 * S + 8 * GQ + 26 * H
    backward = 34 * d + 54 * g + 34 * S + 32 * GQ + 70 * H
    return forward + backward


def _ultra_plan() -> ParallelPlan:
    return ParallelPlan(tp=TP, pp=1, dp=1, micro_batch=1, global_batch=1, seq_len=TOKENS, sp=True)


def test_blackwell_ssd_efficiency_from_the_published_kernel_time() -> None:
    # golden: the fraction the GB200 profile ships is what the published time gives once the kernels' traffic
    # is priced at the achieved bandwidth (the reading tilelang's H800 figure was given: tests/test_ssd_rate.py)
    m, gpu = builtin_models()["nemotron-3-ultra"], builtin_systems()["gb200-nvl72"].gpu
    flops = TOKENS / TP * (mamba_scan_flops(m) + mamba_scan_backward_flops(m))
    traffic_s = TOKENS / TP * _ssd_kernel_bytes_per_token() / gpu.hbm_achieved_bytes_per_s
    measured = flops / (PUBLISHED_S - traffic_s) / gpu.peak_flops("bf16")
    assert gpu.ssd_scan_efficiency == pytest.approx(measured, abs=0.0005)


def test_gb200_prices_the_published_ssd_kernels() -> None:
    # the scan's seconds (forward-equivalent, of the average layer: three times them a Mamba-2 layer's FLOPs
    # time over the Mamba-2 share of the layers) plus the kernels' traffic: within 1% of the published time
    m, gpu = builtin_models()["nemotron-3-ultra"], builtin_systems()["gb200-nvl72"].gpu
    _, ssd_s = ssd_scan_seconds(m, _ultra_plan(), gpu)
    per_layer = 3 * ssd_s * m.num_hidden_layers / m.count_layers("mamba")
    traffic_s = TOKENS / TP * _ssd_kernel_bytes_per_token() / gpu.hbm_achieved_bytes_per_s
    assert per_layer + traffic_s == pytest.approx(PUBLISHED_S, rel=0.01)


@pytest.mark.parametrize("system", ["dgx-b200", "dgx-b300", "gb200-nvl72", "gb300-nvl72"])
def test_blackwell_scans_slower_than_at_the_h800_fraction(system: str) -> None:
    # the measured Blackwell fraction is under a third of the H800's: the same scan takes that much longer
    m, gpu = builtin_models()["nemotron-3-nano"], builtin_systems()[system].gpu
    hopper = gpu.model_copy(update={"ssd_scan_efficiency": None})
    plan = ParallelPlan(tp=1, pp=1, dp=1, micro_batch=2, global_batch=2, seq_len=TOKENS)
    _, blackwell_s = ssd_scan_seconds(m, plan, gpu)
    _, h800_s = ssd_scan_seconds(m, plan, hopper)
    assert blackwell_s / h800_s == pytest.approx(SSD_SCAN_EFFICIENCY / 0.0671)
    assert blackwell_s > 3 * h800_s


@pytest.mark.parametrize("system", ["dgx-h100", "dgx-h200", "dgx-h800", "dgx-a100", "mi300x-8"])
def test_other_gpus_keep_the_h800_fraction(system: str) -> None:
    assert builtin_systems()[system].gpu.ssd_scan_efficiency is None
