"""Transformer Engine's fused MXFP8 grouped MLP runs 256 x 256 output tiles (cost.gemm.FUSED_MLP_TILE).

The op fuser's ForwardGroupedMLP_CuTeGEMMSwiGLU_MXFP8 (NVIDIA/TransformerEngine
transformer_engine/pytorch/ops/fused/forward_grouped_mlp.py at v2.16) calls cudnn-frontend's CuTeDSL SM100
grouped GEMMs without an mma_tiler_mn, so they take their default (256, 256) (NVIDIA/cudnn-frontend
grouped_gemm_glu_wrapper_sm100: mma_tiler_mn = (256, 256)). GPT-OSS's expert FFN and hidden width are 2,880:
fc2's N = 2,880 pads to 12 tiles of 256 (3,072 columns), a fill of 2,880 / 3,072 = 0.9375, where a 128-wide
tile pads it to 2,944 (0.978). docs/formulas.md#compute.gemm.
"""

from __future__ import annotations

import pytest

from llmplan.cost.gemm import (FUSED_MLP_TILE, MXFP8_CUBLAS_GEMM_TIME, TILE, expert_gemm_tile, grouped_gemm_efficiency,
                               layer_gemm_seconds)
from llmplan.specs.hardware import GpuSpec
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems



def _gpu() -> GpuSpec:
    return builtin_systems()["gb300-nvl72"].gpu


def _plan(**kw: object) -> ParallelPlan:
    base: dict[str, object] = dict(dp=64, ep=16, seq_len=4096, micro_batch=4, global_batch=1280, dtype="fp8",
                                   recipe="mxfp8")
    base.update(kw)
    return ParallelPlan(**base)  # type: ignore[arg-type]


def test_gpt_oss_fc2_fills_15_of_16_columns_of_its_256_wide_tiles() -> None:
    # N 2,880 and N 3,072 take the same 12 tiles of 256 (so the same waves) and the same K: the efficiency
    # ratio is the tile fill alone, 2,880 / 3,072 (cudnn-frontend's default tile, TE v2.16)
    gpu = _gpu()
    short = grouped_gemm_efficiency(gpu, "mxfp8", 8192, 2880, 2880, 8, FUSED_MLP_TILE)
    full = grouped_gemm_efficiency(gpu, "mxfp8", 8192, 3072, 2880, 8, FUSED_MLP_TILE)
    assert short / full == pytest.approx(2880 / 3072, rel=1e-9)
    # at the 128-wide tile the same N pads only to 2,944
    assert (grouped_gemm_efficiency(gpu, "mxfp8", 8192, 2880, 2880, 8, TILE)
            / grouped_gemm_efficiency(gpu, "mxfp8", 8192, 2944, 2880, 8, TILE)) == pytest.approx(2880 / 2944)


def test_widths_that_are_multiples_of_256_lose_no_tile_fill() -> None:
    # Qwen3-30B-A3B's experts (N 1,536 and 2,048) fill their 256-wide tiles: only the waves may differ
    gpu = _gpu()
    for n in (1536, 2048):
        e256 = grouped_gemm_efficiency(gpu, "mxfp8", 16384, n, 2048, 16, FUSED_MLP_TILE)
        e128 = grouped_gemm_efficiency(gpu, "mxfp8", 16384, n, 2048, 16, TILE)
        assert e256 == pytest.approx(e128, rel=0.02)


def test_only_the_fused_mxfp8_grouped_mlp_takes_the_256_tile() -> None:
    assert expert_gemm_tile(_plan(), "mxfp8") == FUSED_MLP_TILE
    assert expert_gemm_tile(_plan(), "bf16") == TILE  # the fuser fuses the grouped MLP only under MXFP8
    assert expert_gemm_tile(_plan(expert_gemm="per-expert"), "mxfp8") == TILE  # GroupedLinear's cuBLASLt calls
    assert expert_gemm_tile(_plan(tp_impl="dtensor"), "mxfp8") == TILE  # torch._grouped_mm (torchtitan)
    assert expert_gemm_tile(_plan(fused_kernels=False), "mxfp8") == TILE


def test_gpt_oss_expert_gemms_slow_by_at_most_the_tile_and_wave_loss() -> None:
    # the layer's GEMM time grows, by less than the fc2 fill loss bounds it (0.978 / 0.9375 - 1 = 4.3%, plus
    # the coarser waves of 2-SM tiles)
    # the unfused experts run cuBLASLt's MXFP8 GEMMs, priced 5.1% slower (docs/formulas.md#compute.mxfp8_cublas_rate);
    # the tile and wave loss is what is left with that factor taken out of the unfused experts
    m, gpu = builtin_models()["gpt-oss-120b"], _gpu()
    fused = sum(layer_gemm_seconds(m, _plan(), gpu, True))
    unfused = sum(layer_gemm_seconds(m, _plan(expert_gemm="per-expert"), gpu, True))
    experts = sum(layer_gemm_seconds(m, _plan(expert_gemm="per-expert"), gpu, True, only="expert"))
    assert 1.0 < fused / (unfused - experts * (1 - 1 / MXFP8_CUBLAS_GEMM_TIME)) < 1.06
