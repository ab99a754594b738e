"""The GEMM rate cost.gemm gives at Llama 3 8B's shapes on B200 (docs/validation.md#small-dense-blackwell),
against OpenXLA's published cuBLAS table for sm_100: tensorflow/tensorflow at a305421c45,
third_party/xla/xla/backends/gpu/cost_model/matmul_interpolator_data.h, entry b 4, m 4096, n 4096, k 4096
(16,384 rows: one micro-batch of 2 x 8192 tokens through the 8B's output projection, N = K = 4096):
bf16xbf16->bf16 1,670.47 TFLOP/s, f8e4m3fnxf8e4m3fn->bf16 3,279.68 TFLOP/s. The table times each kernel alone,
so it is compared with llmplan's efficiency x the datasheet peak, before the sustained training clock
(GpuSpec.sustained_clock_fraction, which every GEMM shares). Tolerance 5%."""

import pytest

from llmplan.cost.gemm import gemm_shape_efficiency
from llmplan.specs.registry import builtin_gpus


@pytest.mark.parametrize("fmt, published_tflops", [("bf16", 1670.47), ("fp8", 3279.68)])
def test_b200_gemm_at_8b_output_projection_matches_openxla_table(fmt, published_tflops):
    gpu = builtin_gpus()["b200"]
    rate = float(gemm_shape_efficiency(gpu, fmt, 16384, 4096, 4096)) * gpu.peak_flops(fmt) / 1e12
    assert rate == pytest.approx(published_tflops, rel=0.05)
