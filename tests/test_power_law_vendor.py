"""The cube-root clock law of a power cap (docs/formulas.md#step.power) against the one published pair of boards
built on one die at two board powers with no other change to the tensor cores: H100 SXM and H100 NVL (GH100,
132 SMs each). No measured bf16 clock-vs-cap curve of an H100 was found (docs/validation.md#powercap-search); this
checks the law's level against the clocks NVIDIA prices the two boards at, not a sustained clock."""

from __future__ import annotations

import pytest

from llmplan.specs.hardware import power_clock_ratio
from llmplan.specs.registry import builtin_systems

# Source: NVIDIA H100 product page (nvidia.com/en-us/data-center/h100/), specification table, H100 SXM | H100 NVL:
# BFLOAT16 Tensor Core 1,979 | 1,671 teraFLOPS (with sparsity); Max TDP up to 700 W | 350-400 W (configurable).
SXM_BF16_SPARSE_TFLOPS, NVL_BF16_SPARSE_TFLOPS = 1979.0, 1671.0
SXM_TDP_W, NVL_TDP_W = 700.0, 400.0


def test_cube_root_law_at_400_w_matches_h100_nvl_over_sxm_peak_within_2_percent():
    published = NVL_BF16_SPARSE_TFLOPS / SXM_BF16_SPARSE_TFLOPS  # 0.844: same SMs, so the clock ratio
    law = power_clock_ratio(NVL_TDP_W, SXM_TDP_W)  # 0.830
    assert law == pytest.approx(published, abs=0.02)
    assert law <= published  # the law does not leave a capped board a faster clock than NVIDIA prices it at


def test_the_torchtitan_gpu_at_500_w_lies_between_sxm_and_nvl():
    # torchtitan benchmarks/llama3_h100_202412_torchtitan.md: "the actual peak TFLOPs number is between SXM and NVL"
    gpu = builtin_systems()["hgx-h100-96gb"].gpu
    capped = gpu.at_power_limit(500)
    ratio = capped.capped_clock_ratio
    assert NVL_BF16_SPARSE_TFLOPS / SXM_BF16_SPARSE_TFLOPS < ratio < 1.0
