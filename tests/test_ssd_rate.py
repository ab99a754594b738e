"""The Mamba-2 SSD scan's FLOPs at the Triton kernels' measured rate (docs/formulas.md#mixers.ssd_rate).

Published: tile-ai/tilelang benchmark/mamba2/README.md and its figure mamba_benchmark_result.png (at 4f3523dc):
Triton's chunk_scan forward (mamba-ssm 2.2.6.post3, Triton 3.5.0) on an H800, batch 8, 80 heads of 64, state
128, one group, chunk 256, about 91 TFLOP/s at 8,192 tokens a sequence (the fourth bar, read off the figure
as 88-94), FLOPs counted as the README's script counts them (2 b s Q H P / 2 + 2 b s H P N). The H800 has the
H100 SXM's tensor rate and HBM, so the H100 profile's peak and achieved bandwidth stand for it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.compute import (
    attention_fraction,
    layer_flops,
    layer_seconds,
    ssd_scan_seconds,
)
from llmplan.cost.mixers import (
    SSD_SCAN_EFFICIENCY,
    mamba_scan_backward_flops,
    mamba_scan_flops,
)
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

B, S, H, P, N, G, Q = 8, 8192, 80, 64, 128, 1, 256  # the README's shape
BF16, FP32 = 2, 4


def _efficiency(tflops_read: float) -> float:
    """The fraction of the dense bf16 peak the kernel's FLOPs run at, once its HBM traffic is priced as llmplan
    prices traffic (bytes over the achieved bandwidth), from one reading of the bar."""
    gpu = builtin_systems()["dgx-h100"].gpu
    tokens = B * S
    measured_s = (2 * B * S * Q * H * P * 0.5 + 2 * B * S * H * P * N) / (tflops_read * 1e12)
    # chunk_scan's tensors per token, without z (mamba_forward_bytes' chunk_scan term): C B^T in fp32, x, C,
    # the bf16 chunk states, dt and dA_cumsum in fp32 read; the output written
    per_token = FP32 * G * Q + BF16 * H * P + BF16 * G * N + BF16 * H * P * N / Q + 2 * FP32 * H + BF16 * H * P
    traffic_s = tokens * per_token / gpu.hbm_achieved_bytes_per_s
    flops = tokens * H * (2 * Q * P + 2 * N * P)  # the chunk_scan part of mamba_scan_flops (full chunks)
    return flops / (measured_s - traffic_s) / gpu.peak_flops("bf16")


def test_ssd_efficiency_from_the_published_triton_chunk_scan() -> None:
    # golden: the shipped fraction within the figure's reading (88-94 TFLOP/s), and within 0.005 of 91's
    assert _efficiency(88.0) <= SSD_SCAN_EFFICIENCY <= _efficiency(94.0)
    assert SSD_SCAN_EFFICIENCY == pytest.approx(_efficiency(91.0), abs=0.005)


def test_the_readme_shape_counts_as_mamba_scan_flops_does() -> None:
    # the chunk_scan FLOPs used above are mamba_scan_flops less its C B^T (G 2QN) and chunk-state (H 2NP) terms
    m = builtin_models()["nemotron-3-nano"].model_copy(update={
        "mamba_num_heads": H, "mamba_head_dim": P, "ssm_state_size": N, "n_groups": G, "mamba_chunk_size": Q})
    assert mamba_scan_flops(m) - G * 2 * Q * N - H * 2 * N * P == H * (2 * Q * P + 2 * N * P)


# Nemotron-3 Nano's scan per token and Mamba-2 layer (64 heads of 64, state 128, 8 groups, chunk 128), counted
# by hand from state-spaces/mamba mamba_ssm/ops/triton/ssd_combined.py. Forward: C B^T per group (2QN), chunk
# states B^T x and the read-out C h per head (2NP each), the scores times x per head (2QP).
NANO_FORWARD = 8 * 2 * 128 * 128 + 64 * (2 * 128 * 64 + 2 * 2 * 128 * 64)
# Backward (_mamba_chunk_scan_combined_bwd): C B^T and the chunk states recomputed (_bmm_chunk_fwd,
# _chunk_state_fwd); per head dstates (_chunk_scan_bwd_dstates, 2NP), dx (_chunk_scan_chunk_state_bwd_dx: 2QP +
# 2NP), dB (_chunk_state_bwd_db, 2NP), dC (_chunk_scan_bwd_dC, 2NP), dCB (_chunk_scan_bwd_dcb, 2QP), ddA
# (_chunk_scan_bwd_ddAcs_stable, 2QP); per group the two _bmm_chunk_bwd (2QN each).
NANO_BACKWARD = 3 * 8 * 2 * 128 * 128 + 64 * (3 * 2 * 128 * 64 + 5 * 2 * 128 * 64)


def test_the_ssd_backward_counts_its_kernels_matmuls() -> None:
    m = builtin_models()["nemotron-3-nano"]
    assert mamba_scan_flops(m) == NANO_FORWARD == 3_407_872
    assert mamba_scan_backward_flops(m) == NANO_BACKWARD == 9_175_040  # 2.69 times the forward, not 2


def test_a_transformer_has_no_ssd_time() -> None:
    m, gpu = builtin_models()["llama-3.1-8b"], builtin_systems()["dgx-h100"].gpu
    plan = ParallelPlan(tp=2, pp=1, dp=1, micro_batch=1, global_batch=1, seq_len=4096)
    assert ssd_scan_seconds(m, plan, gpu) == (0.0, 0.0)


@settings(max_examples=20, deadline=None, derandomize=True)
@given(tp=st.sampled_from([1, 2, 4]), mb=st.integers(1, 4), system=st.sampled_from(["dgx-h100", "dgx-b200"]))
def test_nano_scan_runs_slower_than_at_the_attention_rate(tp: int, mb: int, system: str) -> None:
    # the Triton rate is below every built-in GPU's fused-attention rate, so pricing the scan apart adds time:
    # the layer's attention seconds exceed those of its attention FLOPs less the scan, and the scan's share is
    # exactly its FLOPs over the GPU's SSD fraction of the bf16 rate
    m, gpu = builtin_models()["nemotron-3-nano"], builtin_systems()[system].gpu
    plan = ParallelPlan(tp=tp, pp=1, dp=1, micro_batch=mb, global_batch=mb, seq_len=8192, sp=tp > 1)
    ssd_flops, ssd_s = ssd_scan_seconds(m, plan, gpu)
    assert ssd_flops == pytest.approx(8192 * mb * 23 / 52 * mamba_scan_flops(m) / tp)  # 23 of Nano's 52 blocks
    # the published rate, at its own clock (uncapped GPUs): the H800's on Hopper, GB200's measured one on Blackwell
    # (tests/test_ssd_blackwell.py)
    rate = (SSD_SCAN_EFFICIENCY if system == "dgx-h100" else 0.0671) * gpu.peak_flops("bf16")
    assert ssd_s == pytest.approx(ssd_flops * (1 + NANO_BACKWARD / NANO_FORWARD) / 3 / rate)
    assert ssd_flops < layer_flops(m, plan, True).attention
    assert ssd_s > ssd_flops / (gpu.sustained_flops("bf16") * attention_fraction(gpu, plan, m))
    _, attention_s, _ = layer_seconds(m, plan, gpu, True)
    assert attention_s > ssd_s > 0
