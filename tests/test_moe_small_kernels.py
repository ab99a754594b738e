"""An MoE layer's small per-call kernels (docs/formulas.md#moe.small_kernels): calls a layer from the source, a
time per call scaled by its work at the rate one published Nsight profile measured.

Call counts, read at NVIDIA/Megatron-LM d98e8a6 (megatron/core/transformer/moe/token_dispatcher.py:
MoEAlltoAllTokenDispatcher.dispatch_postprocess and combine_preprocess each call sort_chunks_by_idxs with E x tp
chunks; moe_layer.py: `moe` recompute checkpoints the router and the dispatch; router.py TopKRouter.routing: the
routing's torch.topk, two through group_limited_topk when moe_router_group_topk is set, and, with an aux loss and
gradients enabled, compute_routing_scores_for_aux_loss's; tensor_parallel/random.py CheckpointFunction: the
checkpointed forward under no_grad, the rerun under enable_grad), NVIDIA/TransformerEngine d0067d0
(pytorch/permutation.py: the chunk sort and the permute build their maps in forward only and the backward reuses
them; pytorch/triton/permutation.py: make_chunk_sort_map's grid is the received rows, _row_id_map_pass_3_kernel's
the tokens) and pytorch/pytorch 6ed5926 (aten/src/ATen/native/cuda/TensorTopK.cu: should_use_multiblock, and
mbtopk::launch's four 8-bit passes over fp32, each one computeBlockDigitCounts and one
computeBlockwiseWithinKCounts).

Golden: S1 = NVIDIA-NeMo/Megatron-Bridge branch zhiyul/determinism-debug-tool at 6d780951a,
scripts/performance/perf_leaderboard/analysis_report_det_vs_nondet.md, non-deterministic arm, rank 0 (16 MoE
layers), 24 micro-batches: _make_chunk_sort_map_kernel 1,536 calls 280.4 ms, _row_id_map_pass_3_kernel 768
calls 166.2 ms, mbtopk computeBlockwiseWithinKCounts 7,680 calls 70.5 ms and computeBlockDigitCounts 7,680 calls
58.3 ms (sections 3.3, 4.2).
"""

from __future__ import annotations

import pytest

from llmplan.cost.compute import layer_seconds
from llmplan.cost.moe_kernels import (
    moe_kernel_call_seconds,
    moe_kernel_calls,
    moe_kernel_seconds,
    multiblock_topk,
)
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

LAYER_MICROBATCHES = 24 * 16  # S1's window: 3 steps x 8 micro-batches, 16 MoE layers on rank 0
MODULES = ("moe", "layernorm", "core_attn", "moe_act", "mlp", "shared_experts")


def _s1_plan(**update) -> ParallelPlan:
    plan = ParallelPlan(tp=2, pp=3, dp=16, ep=32, etp=1, micro_batch=1, global_batch=128, seq_len=8192, sp=True,
                        recompute="selective", recompute_modules=MODULES, moe_dispatcher="alltoall")
    return plan.model_copy(update=update)


def test_calls_a_layer_from_the_source_match_the_profile_counts():
    m = builtin_models()["nemotron-3-ultra"]
    calls = moe_kernel_calls(m, _s1_plan())
    # a layer and micro-batch under `moe` recompute (forward and rerun): the sort map for dispatch_postprocess and
    # for combine_preprocess, twice; one permute's row-id map, twice; torch.topk: group_limited_topk (Nemotron-3's
    # n_group 1 / topk_group 1) runs two multi-block ones over 4,096 x 512 each forward (the group scores', the
    # final), the aux-loss scores' one only in the rerun (the checkpointed forward runs under no_grad):
    # (2 x 2 + 1) x 4 radix passes
    assert calls == {"sort_map": 2 * 2, "row_id_argsort": 2 * 1, "topk_pass": (2 * 2 + 1) * 4}
    # S1: 1,536, 768 and 7,680 (of each mbtopk kernel) calls over 384 layer-micro-batches, all three exact
    assert calls["sort_map"] == 1536 / LAYER_MICROBATCHES
    assert calls["row_id_argsort"] == 768 / LAYER_MICROBATCHES
    assert calls["topk_pass"] == 7680 / LAYER_MICROBATCHES


def test_topk_calls_by_recompute_grouping_and_aux_loss():
    m = builtin_models()["nemotron-3-ultra"]
    no_rerun = _s1_plan(recompute_modules=("core_attn",))
    assert moe_kernel_calls(m, no_rerun)["topk_pass"] == (2 + 1) * 4  # one forward: routing's two, the aux loss's
    ungrouped = m.model_copy(update={"n_group": None, "topk_group": None})
    assert moe_kernel_calls(ungrouped, _s1_plan())["topk_pass"] == (2 * 1 + 1) * 4
    assert moe_kernel_calls(ungrouped, no_rerun)["topk_pass"] == (1 + 1) * 4
    no_aux = m.model_copy(update={"router_aux_loss_coef": 0.0})
    assert moe_kernel_calls(no_aux, _s1_plan())["topk_pass"] == 2 * 2 * 4
    assert moe_kernel_calls(m, _s1_plan(moe_router_fusion=True))["topk_pass"] == 0
    # DeepSeek-V3's limit (8 groups of 32, 4 picked): 8 x 4,096 rows of 32 and 4,096 of 256, all single-block
    assert moe_kernel_calls(builtin_models()["deepseek-v3"], _s1_plan())["topk_pass"] == 0


def test_dispatchers_and_shapes_that_run_no_such_kernel():
    m = builtin_models()["nemotron-3-ultra"]
    assert moe_kernel_calls(m, _s1_plan(moe_dispatcher="deepep"))["sort_map"] == 0  # flex: no sort by local expert
    assert moe_kernel_calls(m, _s1_plan(ep=1, dp=512))["sort_map"] == 0  # no all-to-all
    hybridep = _s1_plan(moe_dispatcher="deepep", moe_flex_backend="hybridep")
    assert moe_kernel_calls(m, hybridep)["row_id_argsort"] == 0  # HybridEP's own permute kernels
    # PyTorch's single-block top-k below 400 experts at more than 4,000 rows, multi-block at 800+ in 800-4,000 rows
    assert not multiblock_topk(4096, 384) and multiblock_topk(4096, 400)
    assert not multiblock_topk(2048, 512) and multiblock_topk(2048, 800) and not multiblock_topk(799, 2000)
    qwen = builtin_models()["qwen3-235b-a22b"]
    assert moe_kernel_calls(qwen, _s1_plan())["topk_pass"] == 0
    assert moe_kernel_seconds(builtin_models()["qwen3-8b"], _s1_plan(ep=1, dp=512)) == 0.0


def test_golden_against_the_ultra_profile_itemised_kernels():
    m = builtin_models()["nemotron-3-ultra"]
    plan = _s1_plan()
    per_mb = {k: 3 * 16 * moe_kernel_seconds(m, plan, (k,)) for k in ("sort_map", "row_id_argsort", "topk_pass")}
    # ms a micro-batch on rank 0: the rates are read from these two kernels (within 1%) ...
    assert 1e3 * per_mb["sort_map"] == pytest.approx(280.4 / 24, rel=0.01)
    assert 1e3 * per_mb["row_id_argsort"] == pytest.approx(166.2 / 24, rel=0.01)
    # ... the top-k's rate from its per-call time, its count (20 a layer and micro-batch) from the source
    assert 1e3 * per_mb["topk_pass"] == pytest.approx((70.5 + 58.3) / 24, rel=0.01)
    assert 1e3 * sum(per_mb.values()) == pytest.approx((280.4 + 166.2 + 70.5 + 58.3) / 24, rel=0.01)


def test_per_call_time_scales_with_the_call_work():
    m = builtin_models()["nemotron-3-ultra"]
    one, two = moe_kernel_call_seconds(m, _s1_plan()), moe_kernel_call_seconds(m, _s1_plan(seq_len=16384))
    for k in ("sort_map", "row_id_argsort", "topk_pass"):
        assert two[k] == pytest.approx(2 * one[k])  # twice the tokens
    nano = builtin_models()["nemotron-3-nano"]  # E 128, k 6: rows x chunks 22 x 512 / (6 x 128) times smaller
    assert one["sort_map"] / moe_kernel_call_seconds(nano, _s1_plan())["sort_map"] == pytest.approx(22 * 512 / (6 * 128))
    # the argsort: 512 slots x 45 stages against 128 x 28
    assert one["row_id_argsort"] / moe_kernel_call_seconds(nano, _s1_plan())["row_id_argsort"] == pytest.approx(
        512 * 45 / (128 * 28))


def test_the_moe_layer_carries_them_and_the_dense_layer_not():
    m = builtin_models()["nemotron-3-ultra"]
    gpu = builtin_systems()["gb200-nvl72"].gpu
    plan = _s1_plan()
    with_moe = layer_seconds(m, plan, gpu, True)[2]
    no_rerun = layer_seconds(m, plan.model_copy(update={"recompute_modules": ("core_attn",)}), gpu, True)[2]
    assert with_moe > moe_kernel_seconds(m, plan) > 0
    no_moe = plan.model_copy(update={"recompute_modules": ("core_attn",)})
    for k in ("sort_map", "row_id_argsort"):  # the forward's calls again; the top-k's aux-loss call not
        assert moe_kernel_seconds(m, plan, (k,)) == pytest.approx(2 * moe_kernel_seconds(m, no_moe, (k,)))
    assert moe_kernel_seconds(m, plan, ("topk_pass",)) == pytest.approx(
        5 / 3 * moe_kernel_seconds(m, no_moe, ("topk_pass",)))
    assert no_rerun < with_moe


def test_padded_to_capacity_the_rows_are_transposed_not_sorted_by_a_map():
    # token_dispatcher.py dispatch_postprocess: drop_and_pad reorders by view / transpose / contiguous
    m = builtin_models()["nemotron-3-ultra"]
    assert moe_kernel_calls(m, _s1_plan(moe_capacity_factor=1.0))["sort_map"] == 0
    assert moe_kernel_calls(m, _s1_plan(moe_capacity_factor=1.0))["row_id_argsort"] == 2  # forward and rerun
