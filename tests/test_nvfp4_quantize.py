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
)
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models

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
    # Llama 3.1 70B (h 8192, 64 query and 8 KV heads of 128, SwiGLU f 28672), TP2 with SP, cast elements a token
    # over the step on one rank: forward the QKV and fc1 inputs (h/2 each, the sequence shard before the gather),
    # linear_proj's input 64·128/2 and fc2's f/2; backward the output gradients of linear_proj and fc2 (h/2 each,
    # on the shard), QKV's (64 + 2·8)·128/2 and fc1's 2f/2.
    m = M["llama-3.1-70b"]
    h, f, t = 8192, 28672, 2
    proj = 64 * 128 / t
    cast_elements = 4 * h / t + proj + f / t + (64 + 2 * 8) * 128 / t + 2 * f / t
    assert cast_elements == 68608
    # Megatron-LM d98e8a64dd attention.py sets save_original_input on linear_proj under fp4; TE then casts its input
    # rowwise only in forward (amax pass + rowwise cast: 2 + 2 B read) and columnwise in backward (RHT amax pass +
    # RHT cast: 2 + 2): two one-usage casts, 8 B read with or without the fused RHT kernel, which fuses the two
    # usages of one cast. So the unfused kernels add their one 2-byte read on every cast tensor but that one.
    fused, unfused = nvfp4(), nvfp4(nvfp4_rht_cast_fusion=False)
    extra = elementwise_bytes(m, unfused, False) - elementwise_bytes(m, fused, False)
    # elementwise_bytes is per pass: a third of the step's casts, per token of the layer's s·b
    assert extra == pytest.approx(2.0 * (cast_elements - proj) * PLAN["seq_len"] / 3)
    # fused: every cast the amax pass and one kernel (2 + 2 read, two 4.5-bit copies with E4M3 scales per 16), the
    # proj input 4 B more read (8 + 2·0.5625 in all)
    cast = 2 * 2 + 2 * (4 / 8 + 1 / 16)
    assert float(fp8_cast_bytes(m, fused, False)) == pytest.approx(
        (cast_elements * cast + proj * 4.0) * PLAN["seq_len"] / 3)


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
