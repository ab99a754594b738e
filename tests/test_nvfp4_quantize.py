"""NVFP4 quantisation as Transformer Engine's kernels run it (ParallelPlan.nvfp4_rht_cast_fusion,
cost.compute.nvfp4_quantize_bytes): an amax pass over the bf16 tensor (its own amax and its random Hadamard
transform's), then the rowwise and the RHT-columnwise 4-bit casts, fused into one kernel from TE 2.15
(NVIDIA/TransformerEngine#2555) and two kernels before (TE 2.9 - 2.14: quantizer.cpp NVFP4Quantizer::quantize_impl,
nvte_quantize_v2 then nvte_hadamard_transform_cast_fusion_columnwise)."""

from __future__ import annotations

import pytest

from llmplan.cost.compute import (
    elementwise_bytes,
    fp8_cast_bytes,
    nvfp4_quantize_bytes,
    quantize_bytes,
)
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models


# the other casts: linear_proj's save_original_input is held out (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("without_linear_proj_flag")


M = builtin_models()
PLAN = {"tp": 2, "pp": 1, "dp": 4, "sp": True, "seq_len": 8192, "micro_batch": 1, "global_batch": 64}


def nvfp4(**kw) -> ParallelPlan:
    return ParallelPlan(**{**PLAN, "dtype": "fp4", "recipe": "nvfp4", "bf16_layers_end": 0, **kw})


def test_bytes_per_element_are_the_kernels_reads_and_writes():
    # One NVFP4 copy: a 4-bit E2M1 value and a 1-byte E4M3 scale per 16 elements (TE docs, nvfp4.rst); the
    # input is bf16 (RHT is "supported only for BF16 inputs/gradients").
    copy, read = 4 / 8 + 1 / 16, 2.0
    # TE >= 2.15: the amax pass reads it; one fused kernel reads it again and writes both copies.
    assert nvfp4_quantize_bytes(nvfp4()) == pytest.approx(2 * read + 2 * copy)
    # TE 2.9 - 2.14: the amax pass, then the rowwise cast and the RHT-columnwise cast read it once each.
    assert nvfp4_quantize_bytes(nvfp4(nvfp4_rht_cast_fusion=False)) == pytest.approx(3 * read + 2 * copy)


def test_the_unfused_kernels_add_one_bf16_read_of_every_cast_tensor():
    m = M["llama-3.1-70b"]
    fused, unfused = nvfp4(), nvfp4(nvfp4_rht_cast_fusion=False)
    cast_elements = fp8_cast_bytes(m, fused, False) / quantize_bytes(fused)
    extra = elementwise_bytes(m, unfused, False) - elementwise_bytes(m, fused, False)
    assert extra == pytest.approx(2.0 * cast_elements)  # one more read of 2 bytes, nothing else moves
    assert extra > 0


@pytest.mark.parametrize("precision", [("fp8", "mxfp8"), ("fp8", "tensorwise"), ("bf16", None)])
def test_the_switch_leaves_the_other_recipes_alone(precision):
    m = M["llama-3.1-70b"]
    dtype, recipe = precision
    base = {**PLAN, "dtype": dtype, **({"recipe": recipe} if recipe else {})}
    on, off = ParallelPlan(**base), ParallelPlan(**base, nvfp4_rht_cast_fusion=False)
    assert elementwise_bytes(m, off, False) == elementwise_bytes(m, on, False)


def test_golden_bridge_nvfp4_row_on_te_2_14(published_runs, row_plan):
    # Megatron-Bridge performance summary, 26.04 NeMo container: Llama 3 70B pretraining on 64 GB200 (NVL72),
    # NVFP4, TP2 PP4 VP5, GBS 256: 4,898 tokens/s/GPU. Megatron-Bridge v0.4.0's uv.lock pins Transformer Engine
    # 2.14.0+71bbefbf, before the fused RHT cast: priced with its two cast kernels, within 10% (12.5% high with
    # the fused kernel's bytes).
    import accuracy  # benchmarks/accuracy.py (conftest puts benchmarks/ on the path)

    rid = "mbridge-26.04-pretrain-llama3-70b-dgx-gb200-64gpu-nvfp4-tp2pp4cp1epnavp5gbs256mbs1"
    rec = published_runs[rid]
    assert rec["measured"]["tokens_per_s_per_gpu"] == 4898
    plan = row_plan(rid)
    assert plan.nvfp4_rht_cast_fusion is False
    (quantity, predicted, measured), _fits = accuracy.predict(rec, "mbridge-dense")
    assert quantity == "tok/s/GPU" and predicted == pytest.approx(measured, rel=0.10)


def test_rows_on_te_2_15_or_later_keep_the_fused_kernel(row_plan):
    # Megatron-Bridge v0.5.0 (26.06) pins TE 2.16.0+4220403e, which has the fused kernel
    rid = "mbridge-26.06-pretrain-llama3.1-405b-dgx-gb200-256gpu-nvfp4-tp4pp16cp1epnavp8gbs1536mbs1"
    assert row_plan(rid).nvfp4_rht_cast_fusion is True


def test_the_search_prices_the_switch_as_the_scalar_estimate():
    import numpy as np

    from llmplan.search.grid import Workload, default_space, enumerate_plans
    from llmplan.specs.plan import ClusterSpec
    from llmplan.specs.registry import builtin_systems

    m, cluster = M["llama-3.1-70b"], ClusterSpec(system=builtin_systems()["gb200-nvl72"], num_nodes=2)
    w = Workload(global_batch=64, seq_len=4096, dtype="fp4", recipe="nvfp4", nvfp4_rht_cast_fusion=False)
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    idx = np.random.default_rng(5).permutation(len(plans))[:5]
    sub = plans.take(idx)
    vec = np.asarray(fp8_cast_bytes(m, sub, False))
    scalar = [fp8_cast_bytes(m, plans.plan(int(i)), False) for i in idx]
    assert vec == pytest.approx(scalar)
