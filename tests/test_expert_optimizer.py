"""The optimizer step shards routed-expert parameters over the expert data-parallel group (issue 32):
Megatron-Core's distributed optimizer shards expert parameters over expt_dp = world / (etp x ep x pp) ranks
(megatron/core/parallel_state.py), not over dp x cp as the dense ones."""

from __future__ import annotations

import pytest

from llmplan.estimate import estimate_training
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M = builtin_models()
S = builtin_systems()


def _seconds(per_rank_params: float, plan: ParallelPlan, gpu) -> float:
    per_param = 2 * plan.optimizer_bytes + 4 * plan.grad_bytes + plan.weight_bytes
    return per_rank_params * per_param / (gpu.hbm_bytes_per_s * gpu.hbm_efficiency)


def test_ep8_dp8_expert_parameters_are_not_sharded_over_dp():
    # Qwen3-30B-A3B on 8 GPUs at EP8 DP8: each rank holds 16 of the 128 experts of each of the 48 layers, and
    # the expert data-parallel group is 8 / (1 x 8 x 1) = 1 rank, so every expert parameter is updated on its
    # rank; the dense parameters are sharded 8 ways.
    m, cluster = M["qwen3-30b-a3b"], ClusterSpec(system=S["dgx-h100"], num_nodes=1)
    plan = ParallelPlan(dp=8, ep=8, etp=1, micro_batch=1, global_batch=64, seq_len=4096, zero=1)
    e = estimate_training(m, cluster, plan)
    expert = 48 * (128 // 8) * 3 * m.hidden_size * m.expert_ffn  # hand count of the rank's routed experts
    dense = float(e.memory.params_on_rank) - expert
    assert dense > 0
    want = _seconds(dense / 8 + expert / 1, plan, cluster.system.gpu)
    assert float(e.time.optimizer) == pytest.approx(want, rel=1e-6)
    assert float(e.time.optimizer) > 5 * _seconds(float(e.memory.params_on_rank) / 8, plan, cluster.system.gpu)


def test_ep8_on_64_gpus_shards_experts_over_the_8_expert_replicas():
    m, cluster = M["qwen3-30b-a3b"], ClusterSpec(system=S["dgx-h100"], num_nodes=8)
    plan = ParallelPlan(dp=64, ep=8, etp=1, micro_batch=1, global_batch=512, seq_len=4096, zero=1)
    e = estimate_training(m, cluster, plan)
    expert = 48 * (128 // 8) * 3 * m.hidden_size * m.expert_ffn
    dense = float(e.memory.params_on_rank) - expert
    want = _seconds(dense / 64 + expert / 8, plan, cluster.system.gpu)
    assert float(e.time.optimizer) == pytest.approx(want, rel=1e-6)


def test_dense_model_keeps_the_dp_shard():
    m, cluster = M["qwen3-8b"], ClusterSpec(system=S["dgx-h100"], num_nodes=1)
    plan = ParallelPlan(dp=8, micro_batch=1, global_batch=64, seq_len=4096, zero=1)
    e = estimate_training(m, cluster, plan)
    want = _seconds(float(e.memory.params_on_rank) / 8, plan, cluster.system.gpu)
    assert float(e.time.optimizer) == pytest.approx(want, rel=1e-9)
