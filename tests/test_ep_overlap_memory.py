"""Activation memory under Megatron-Core's EP overlap (ParallelPlan.ep_comm_overlap, the combined-1F1B schedule).

By-hand counts from NVIDIA/Megatron-LM at d98e8a6: schedules.py get_pp_rank_microbatches (the interleaved
warm-up, 2(p - i - 1) + (v - 1)·p, plus one forward with overlap_moe_expert_parallel_comm), combined_1f1b.py
(combined_1f1b_schedule_for_no_pipelining: forward of micro-batch k+1 beside backward of k) and
models/common/model_chunk_schedule_plan.py (TransformerModelChunkSchedulePlan.run pairs forward layer j with
backward layer L-1-j; TransformerLayerSchedulePlan.run's order of nodes). docs/formulas.md#mem.ep_overlap"""

from __future__ import annotations

import pytest

from llmplan.cost.memory import (activation_bytes, ep_overlap_microbatch_steps, inflight_microbatches,
                                 layer_activation_parts, layer_activations, training_memory)
from llmplan.estimate import estimate_training
from llmplan.search.evaluate import evaluate
from llmplan.search.grid import from_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M, S = builtin_models(), builtin_systems()
QWEN = M["qwen3-30b-a3b"]  # 48 layers, all MoE (top-8 of 128 experts)


def plan(**upd) -> ParallelPlan:
    base = dict(tp=1, pp=1, ep=8, etp=1, dp=8, micro_batch=1, global_batch=64, seq_len=4096,
                moe_dispatcher="alltoall", recompute="selective", recompute_modules=("core_attn",))
    base.update(upd)
    return ParallelPlan(**base)


def _pre_dispatch(parts) -> float:
    """The pre-dispatch node's parts, named one by one (everything but the MoE MLP's insides)."""
    return float(parts.residual + parts.attn_input + parts.latents + parts.qkv + parts.attn_out + parts.scores
                 + parts.mlp_input + parts.recurrent + parts.cp_a2a_out)


def _walk_combined_no_pipelining(layers: int, n: int, pre: float, mlp: float) -> float:
    """Peak bytes of a layer-level walk of the combined schedule without pipeline stages: micro-batch 0's
    forward alone, then each step runs forward layer j of k+1 beside backward layer L-1-j of k in
    TransformerLayerSchedulePlan.run's order (combine bwd, pre_dispatch fwd, mlp bwd + dw, dispatch bwd,
    mlp fwd, combine fwd, pre_dispatch bwd), then the last backward alone."""
    held = peak = 0.0
    for _ in range(layers):  # the first forward
        held += pre + mlp
        peak = max(peak, held)
    for _ in range(n - 1):
        for _ in range(layers):
            held += pre                 # f pre_dispatch forward
            peak = max(peak, held)
            held -= mlp                 # b mlp backward and backward_dw
            held += mlp                 # f mlp forward
            peak = max(peak, held)
            held -= pre                 # b pre_dispatch backward
    return peak


def test_pp1_by_hand_one_microbatch_plus_one_pre_dispatch_part():
    on, off = plan(ep_comm_overlap=True), plan()
    # no pipelining: one micro-batch in flight either way (forward_backward_no_pipelining / combined schedule)
    assert inflight_microbatches(on, 0) == inflight_microbatches(off, 0) == 1
    assert bool(ep_overlap_microbatch_steps(on, 0))
    parts = layer_activation_parts(QWEN, on, True)
    per_layer = float(layer_activations(QWEN, on).moe)
    pre = _pre_dispatch(parts)
    assert per_layer == pytest.approx(pre + float(parts.mlp))  # core_attn only drops the scores
    walk = _walk_combined_no_pipelining(QWEN.num_hidden_layers, on.num_microbatches, pre, float(parts.mlp))
    assert walk == pytest.approx(QWEN.num_hidden_layers * per_layer + pre)
    a_on, a_off = activation_bytes(QWEN, on, 0), activation_bytes(QWEN, off, 0)
    assert float(a_on.layers) - float(a_off.layers) == pytest.approx(pre, rel=1e-12)
    assert float(a_on.layers) == pytest.approx(walk, rel=1e-12)
    # the next micro-batch's embedding is built before the previous one's embedding backward: two dropout masks
    assert float(a_on.embedding) == pytest.approx(2 * float(a_off.embedding))


def test_pp1_one_microbatch_runs_alone():
    on = plan(ep_comm_overlap=True, global_batch=8)  # dp 8 x micro-batch 1: one micro-batch
    assert on.num_microbatches == 1
    assert not bool(ep_overlap_microbatch_steps(on, 0))
    assert float(activation_bytes(QWEN, on, 0).total) == pytest.approx(float(activation_bytes(QWEN, plan(global_batch=8), 0).total))


@pytest.mark.parametrize("gb, steady", [(64, (True, True, True, True)), (32, (False, False, True, True)),
                                        (8, (False, False, False, False))])
def test_pp4_vpp2_by_hand(gb, steady):
    # dp 8, micro-batch 1: gb 64 -> 8 micro-batches, 16 chunk passes; gb 32 -> 4 (8); gb 8 -> 1 (2)
    on = plan(pp=4, vpp=2, ep_comm_overlap=True, global_batch=gb)
    # warm-up with the overlap, stage i: 2(4 - i - 1) + (2 - 1)·4 + 1 = 11, 9, 7, 5 chunk passes; a combined
    # (forward beside backward) step exists where the chunk passes, 2n, exceed it
    assert tuple(bool(ep_overlap_microbatch_steps(on, i)) for i in range(4)) == steady
    # the warm-up's forwards are alive at its end, as many as the plain schedule's peak (warm-up + the
    # steady step's forward before its backward): min(11, 2n) / 2 stages' worth on stage 0
    n = on.num_microbatches
    assert inflight_microbatches(on, 0) == pytest.approx(min(11, 2 * n) / 2)
    assert inflight_microbatches(on, 3) == pytest.approx(min(5, 2 * n) / 2)
    off = on.model_copy(update={"ep_comm_overlap": False})
    pre = _pre_dispatch(layer_activation_parts(QWEN, on, True))
    for i in range(4):
        d = float(activation_bytes(QWEN, on, i).layers) - float(activation_bytes(QWEN, off, i).layers)
        assert d == pytest.approx(pre if steady[i] else 0.0, rel=1e-12, abs=1e-3)
        assert float(activation_bytes(QWEN, on, i).embedding) == float(activation_bytes(QWEN, off, i).embedding)


@pytest.mark.parametrize("upd", [{}, {"pp": 4, "vpp": 2}, {"pp": 8, "vpp": 3, "global_batch": 1024},
                                 {"pp": 4, "vpp": 2, "global_batch": 32}, {"recompute": "none", "recompute_modules": ()},
                                 {"recompute_modules": ("core_attn", "moe_act")}, {"micro_batch": 2},
                                 {"ep": 1}, {"tp": 2, "sp": True, "dp": 4}, {"offload_layers": 4}])
def test_overlap_never_lowers_memory(upd):
    off = plan(**upd)
    on = off.model_copy(update={"ep_comm_overlap": True})
    for i in range(off.pp):
        assert float(activation_bytes(QWEN, on, i).total) >= float(activation_bytes(QWEN, off, i).total)
    assert float(training_memory(QWEN, on, 80e9).total) >= float(training_memory(QWEN, off, 80e9).total)


@pytest.mark.parametrize("upd", [{}, {"pp": 4, "vpp": 2}, {"pp": 8, "vpp": 3, "global_batch": 1024},
                                 {"pp": 4, "vpp": 2, "global_batch": 32}])
def test_vectorised_memory_agrees_with_the_scalar_one(upd):
    p = plan(ep_comm_overlap=True, **upd)
    cluster = ClusterSpec(system=S["dgx-b200"], num_nodes=p.pp)  # 8 GPUs a node: tp 1 x dp 8 per stage
    scalar = estimate_training(QWEN, cluster, p)
    vec = evaluate(QWEN, cluster, from_plan(p))
    assert float(vec.memory.total[0]) == pytest.approx(float(scalar.memory.total), rel=1e-9)
    assert float(vec.memory.activations[0]) == pytest.approx(float(scalar.memory.activations), rel=1e-9)
