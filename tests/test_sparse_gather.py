"""DeepSeek-V4's sparse attention calls priced at their published kernel rates (cost.sparse_gather,
docs/formulas.md#compute.sparse_gather). The goldens are NVIDIA/cudnn-frontend's published DSA benchmark
numbers: benchmark/dsa/README.md (B200 backward table, 64 heads, d = 512, 4,096 queries) and
benchmark/dsa/results/deepseek_v4/<gpu>/*.csv (DeepSeek-V4-Flash's 640-slot call, cuDNN Frontend 1.30.0)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from llmplan.cost.compute import attention_seconds, layer_flops, layer_seconds
from llmplan.cost.flops import attention_keys, attention_score_flops
from llmplan.cost.sparse_gather import (
    GATHER_FIXED_SLOTS,
    GATHER_TOPK_ALIGN,
    gather_calls,
    gather_layer_seconds,
    gather_rate_ratio,
    indexer_loss_layer_seconds,
)
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_gpus, builtin_models

FLASH = builtin_models()["deepseek-v4-flash"]
GPUS = builtin_gpus()

# NVIDIA/cudnn-frontend benchmark/dsa/README.md, "Sparse Attention Backward", B200 results table:
# seqlen 4096, 64 heads, d_qk = d_v = 512, top-k -> backward ms.
B200_BWD_MS = {128: 0.563, 512: 1.243, 1024: 2.198, 2048: 4.168}

# benchmark/dsa/results/deepseek_v4/<gpu>/deepseek_v4_<stamp>.csv, dsv4_flash at 4,096 queries:
# (forward ms, backward ms, peak_mma_tflops the benchmark sampled).
PUBLISHED = {"gb200": (0.408, 1.423, 2567.569), "gb300": (0.390, 1.431, 2577.531), "b200": (0.478, 1.635, 2218.721)}


def plan(**kw: object) -> ParallelPlan:
    base: dict[str, object] = {"tp": 1, "pp": 1, "dp": 128, "ep": 64, "micro_batch": 1, "global_batch": 2048,
                               "seq_len": 4096, "dtype": "fp8", "recipe": "mxfp8"}
    base.update(kw)
    return ParallelPlan(**base)


def test_fixed_slots_solved_from_the_published_512_and_2048_points() -> None:
    r = B200_BWD_MS[2048] / B200_BWD_MS[512]
    assert GATHER_FIXED_SLOTS == pytest.approx((2048 - 512 * r) / (r - 1), rel=0.005)


@pytest.mark.parametrize(("topk", "tol"), [(1024, 0.02), (128, 0.10)])
def test_fixed_slots_predict_the_other_published_backward_times(topk: int, tol: float) -> None:
    # time ~ (K + k0): the 1,024 and 128 points were not used to solve k0
    predicted = B200_BWD_MS[512] * (topk + GATHER_FIXED_SLOTS) / (512 + GATHER_FIXED_SLOTS)
    assert predicted == pytest.approx(B200_BWD_MS[topk], rel=tol)


def test_flash_calls_window_csa_and_hca_slots() -> None:
    # window 128; CSA 128 + 512 indexer keys; HCA 128 + 4096/128 = 160, padded to 192
    assert [(int(K), n) for K, n in gather_calls(FLASH, 4096)] == [(128, 2), (640, 21), (192, 20)]


@pytest.mark.parametrize("gpu", sorted(PUBLISHED))
def test_csa_call_reproduces_the_published_kernel_times(gpu: str) -> None:
    fwd_ms, bwd_ms, peak = PUBLISHED[gpu]
    g = GPUS[gpu]
    at_bench = g.model_copy(update={"sustained_clock_fraction": peak / g.tflops["bf16"]})
    csa_only = FLASH.model_copy(update={"layer_types": ("compressed_sparse_attention",) * FLASH.num_hidden_layers})
    fwd, bwd = gather_layer_seconds(csa_only, plan(), at_bench)
    assert fwd * 1e3 == pytest.approx(fwd_ms, rel=0.01)
    assert bwd * 1e3 == pytest.approx(bwd_ms, rel=0.01)


def test_gpu_without_a_published_rate_keeps_the_dense_price_for_the_core() -> None:
    # the core at the dense rate; the indexer's scores and loss as Megatron-Core's reference path runs them
    # (tests/test_indexer_training.py, docs/formulas.md#compute.indexer_training)
    g = GPUS["h100-sxm"]
    assert g.sparse_gather_efficiency is None
    p = plan(dtype="bf16", recipe="tensorwise")
    flops = layer_flops(FLASH, p, True).attention
    core = attention_score_flops(FLASH, p, attention_keys(FLASH, p.seq_len))
    assert attention_seconds(FLASH, p, g, flops, 1e15) > core / 1e15
    no_indexer = FLASH.model_copy(update={"layer_types": ("sliding_attention",) * FLASH.num_hidden_layers})
    f = layer_flops(no_indexer, p, True).attention
    assert attention_seconds(no_indexer, p, g, f, 1e15) == pytest.approx(f / 1e15)


def test_sparse_price_on_gb200_exceeds_the_dense_price() -> None:
    # the dense fused kernel's rule prices the counted pairs; the gather call's measured rate is lower
    p, g = plan(), GPUS["gb200"]
    dense = GPUS["gb200"].model_copy(update={"sparse_gather_efficiency": None})
    assert layer_seconds(FLASH, p, g, True)[1] > 1.5 * layer_seconds(FLASH, p, dense, True)[1]


@seed(40)
@settings(max_examples=50, deadline=None)
@given(st.integers(min_value=1, max_value=4096), st.integers(min_value=1, max_value=4096))
def test_rate_ratio_rises_with_slots(a: int, b: int) -> None:
    lo, hi = sorted((a, b))
    assert gather_rate_ratio(lo) <= gather_rate_ratio(hi) + 1e-12
    assert gather_rate_ratio(640) == pytest.approx(1.0)


@seed(40)
@settings(max_examples=30, deadline=None)
@given(st.sampled_from([1024, 2048, 4096, 8192, 16384]))
def test_slots_are_padded_and_hca_grows_with_the_sequence(s: int) -> None:
    calls = gather_calls(FLASH, s)
    assert all(float(K) % GATHER_TOPK_ALIGN == 0 for K, _ in calls)
    assert float(calls[-1][0]) >= 128 + s / 128
    assert sum(n for _, n in calls) == FLASH.num_hidden_layers
    assert np.isfinite(sum(gather_layer_seconds(FLASH, plan(seq_len=s), GPUS["gb200"])))


def test_v4_unquantized_matmuls_run_in_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    # Megatron-LM's DeepSeek-V4: the grouped output projection is a torch.einsum and the compressors / indexer
    # head weights run under get_fp8_disabled_context (docs/formulas.md#compressed.unquantized)
    from llmplan.cost import gemm

    p, g = plan(), GPUS["gb200"]
    tags = [x.module for x in gemm.layer_gemms(FLASH, p, True)]
    assert (tags.count("grouped_out"), tags.count("indexer_query"), tags.count("indexer"),
            tags.count("compressor")) == (1, 1, 2, 2)
    grouped = next(x for x in gemm.layer_gemms(FLASH, p, True) if x.module == "grouped_out")
    assert grouped.flops == 2 * 4096 * 64 * 512 * 1024  # a·d -> d_g per token: 2·T·a·d·d_g
    bf16_plan = plan(dtype="bf16", recipe="tensorwise")
    kept = gemm.layer_gemm_seconds(FLASH, p, g, True)[0], gemm.layer_gemm_seconds(FLASH, bf16_plan, g, True)[0]
    monkeypatch.setattr(gemm, "UNQUANTIZED_MODULES", frozenset())
    assert gemm.layer_gemm_seconds(FLASH, p, g, True)[0] < kept[0]
    assert gemm.layer_gemm_seconds(FLASH, bf16_plan, g, True)[0] == pytest.approx(kept[1])


def test_v4_indexer_matmuls_run_no_input_gradient(monkeypatch: pytest.MonkeyPatch) -> None:
    # NVIDIA/Megatron-LM csa.py at 1e23526adc feeds the CSA indexer x.detach() and qr.detach()
    # (_forward_fused_indexer_training, _forward_unfused_csa): its compressor's kv / gate, query and head-weight
    # projections run a weight gradient in the backward and no input gradient; the attention's own compressors
    # (CSA and HCA kv / gate, fed the live x) run both.
    from llmplan.cost import gemm

    p, g = plan(), GPUS["gb200"]
    for module in ("indexer", "indexer_query"):
        fwd, bwd = gemm.layer_gemm_seconds(FLASH, p, g, True, only=module)
        assert fwd > 0 and bwd == pytest.approx(fwd, rel=1e-12)
    fwd, bwd = gemm.layer_gemm_seconds(FLASH, p, g, True, only="compressor")
    assert fwd > 0 and bwd == pytest.approx(2 * fwd, rel=1e-12)
    # the whole layer's backward is short by exactly the indexer's forward matmul time
    indexer = sum(gemm.layer_gemm_seconds(FLASH, p, g, True, only=x)[0] for x in ("indexer", "indexer_query"))
    detached = gemm.layer_gemm_seconds(FLASH, p, g, True)[1]
    monkeypatch.setattr(gemm, "DETACHED_INPUT_MODULES", frozenset())
    assert gemm.layer_gemm_seconds(FLASH, p, g, True)[1] - detached == pytest.approx(indexer, rel=1e-9)


@pytest.mark.parametrize("gpu", sorted(PUBLISHED))
def test_indexer_loss_kernels_at_the_published_gather_rates(gpu: str) -> None:
    # Megatron-LM csa_kernels.py at 1e23526adc (FusedCSAIndexerSparseAttnFunc): per CSA layer the attention scores
    # recomputed over the 512 selected keys (QK^T, 64 heads, d = 512) and the indexer's sparse backward, three
    # GEMMs of 2·Sq·H·D·TopK (cudnn-frontend benchmark_dsa_indexer_h32.py; indexer 64 heads of 128). Rates: the
    # published 640-slot call's TFLOP/s (forward, backward), at 512 slots by the fixed-slot rule
    fwd_ms, bwd_ms, peak = PUBLISHED[gpu]
    g = GPUS[gpu]
    at_bench = g.model_copy(update={"sustained_clock_fraction": peak / g.tflops["bf16"]})
    csa_only = FLASH.model_copy(update={"layer_types": ("compressed_sparse_attention",) * FLASH.num_hidden_layers})
    fwd_rate = 2 * 4096 * 64 * 640 * (512 + 512) / (fwd_ms * 1e-3)
    bwd_rate = 2 * 4096 * 64 * 640 * (3 * 512 + 2 * 512) / (bwd_ms * 1e-3)
    at_512 = (512 / (512 + GATHER_FIXED_SLOTS)) / (640 / (640 + GATHER_FIXED_SLOTS))
    target, backward = indexer_loss_layer_seconds(csa_only, plan(), at_bench)
    assert target == pytest.approx(2 * 4096 * 64 * 512 * 512 / (fwd_rate * at_512), rel=0.01)
    assert backward == pytest.approx(3 * 2 * 4096 * 64 * 128 * 512 / (bwd_rate * at_512), rel=0.01)


def test_attention_prices_the_indexer_scores_once_with_its_loss_kernels() -> None:
    # the indexer's inputs are detached: its dense scores run in the forward only, and its gradient comes from the
    # sparse loss kernels; stage_compute charges attention_seconds three times
    p, g = plan(), GPUS["gb200"]
    flops = layer_flops(FLASH, p, True).attention
    peak = 1e15
    scores = (flops - attention_score_flops(FLASH, p, attention_keys(FLASH, p.seq_len))) / peak
    fwd, bwd = gather_layer_seconds(FLASH, p, g)
    target, backward = indexer_loss_layer_seconds(FLASH, p, g)
    assert scores > 0 and target > 0 and backward > 0
    assert 3 * attention_seconds(FLASH, p, g, flops, peak) == pytest.approx(fwd + bwd + target + backward + scores)


def test_models_without_a_csa_indexer_add_no_indexer_loss() -> None:
    window_only = FLASH.model_copy(update={"layer_types": ("sliding_attention",) * FLASH.num_hidden_layers})
    assert indexer_loss_layer_seconds(window_only, plan(), GPUS["gb200"]) == (0.0, 0.0)
    assert indexer_loss_layer_seconds(FLASH, plan(), GPUS["h100-sxm"]) == (0.0, 0.0)
