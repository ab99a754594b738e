"""The fused MXFP8 grouped MLP's GEMMs against the fused kernel's own published rate (docs/formulas.md#compute.gemm,
docs/validation.md#fused-mlp-rate).

NVIDIA/cudnn-frontend publishes a benchmark of the CuTeDSL grouped GEMM + activation kernels that Transformer
Engine's fused grouped MLP calls (benchmark/cutedsl_fusion_kernels: MXFP8 e4m3 operands with E8M0 scales,
8 experts x 4,096 tokens, K 8,192, N 4,096; a GLU's GEMM is 2N = 8,192 wide; timed with CUDA-graph replay;
torch 26.05, Transformer Engine 2.15.0, cudnn-frontend 1.23.0, CUTLASS DSL 4.4.1). Published cudnn_ms:
GB200 (results/GB200/output.txt at 3d44fdb0f4): swiglu 1.498, geglu 1.500, srelu 0.749, dsrelu 0.720,
dswiglu 0.850; GB300 (results/GB300/output.txt at 51023a1f23): swiglu 1.364, geglu 1.361, srelu 0.687,
dsrelu 0.698, dswiglu 0.760.

A published kernel rate is read at the clock its benchmark ran at (cost.attention_rate.published_rate_clock):
the step charges the kernel its published time. llmplan prices the fused path's grouped GEMMs with
grouped_gemm_efficiency at the fused tile (FUSED_MLP_TILE) over the sustained peak; at the benchmark's shape that
time lands within 1% of the published forward kernels (swiglu, geglu, srelu) and within 3.4% of dSReLU (the epilogue's activation and quantisation hidden under
the tensor cores, as cost.gemm.fused_grouped_mlp prices them). The backward dGLU kernel is not: it runs 10-14%
slower than its GEMM alone (documented, not priced: docs/validation.md#fused-mlp-rate), which the last test pins
so that a change pricing it has to say so.
"""

from __future__ import annotations

import pytest

from llmplan.cost.gemm import FUSED_MLP_TILE, grouped_gemm_efficiency
from llmplan.specs.registry import builtin_systems

EXPERTS, TOKENS, K, N = 8, 4096, 8192, 4096
# (system, kernel, GEMM N, published ms): NVIDIA/cudnn-frontend benchmark/cutedsl_fusion_kernels/results
FORWARD = [
    ("gb200-nvl72", "swiglu", 2 * N, 1.498), ("gb200-nvl72", "geglu", 2 * N, 1.500),
    ("gb200-nvl72", "srelu", N, 0.749), ("gb200-nvl72", "dsrelu", N, 0.720),
    ("gb300-nvl72", "swiglu", 2 * N, 1.364), ("gb300-nvl72", "geglu", 2 * N, 1.361),
    ("gb300-nvl72", "srelu", N, 0.687), ("gb300-nvl72", "dsrelu", N, 0.698),
]
DGLU = [("gb200-nvl72", 0.850), ("gb300-nvl72", 0.760)]
TOLERANCE = 0.04  # the furthest point, GB200 dsrelu, is 3.4% off; the benchmark's five graph-replay samples
# spread far wider (GB200 swiglu 1.342-1.603 ms, output_verbose.txt)


def _priced_ms(system: str, gemm_n: int) -> float:
    """The fused path's grouped GEMM at the benchmark's shape, as step time prices it (milliseconds)."""
    gpu = builtin_systems()[system].gpu
    flops = 2.0 * EXPERTS * TOKENS * K * gemm_n
    eff = float(grouped_gemm_efficiency(gpu, "mxfp8", TOKENS, gemm_n, K, EXPERTS, FUSED_MLP_TILE))
    return flops / (eff * gpu.sustained_flops("mxfp8")) * 1e3


@pytest.mark.parametrize(("system", "kernel", "gemm_n", "published_ms"), FORWARD)
def test_fused_grouped_gemm_is_priced_at_the_fused_kernels_published_time(
        system: str, kernel: str, gemm_n: int, published_ms: float) -> None:
    assert _priced_ms(system, gemm_n) == pytest.approx(published_ms, rel=TOLERANCE), kernel


@pytest.mark.parametrize(("system", "published_ms"), DGLU)
def test_the_dglu_backward_kernel_runs_slower_than_its_gemm_is_priced(system: str, published_ms: float) -> None:
    # fc2's dgrad on the fused path: the dSwiGLU epilogue reads the saved 2N-wide pre-activation and writes the
    # 2N-wide gradient quantised rowwise and columnwise; the published kernel takes 10-14% longer than the GEMM
    ratio = published_ms / _priced_ms(system, N)
    assert 1.08 < ratio < 1.17
