"""Hybrid sharding (ParallelPlan.dp_replicate / dp_outer_optimizer; Megatron-FSDP HSDP / HFSDP, Megatron-LM
num_distributed_optimizer_instances): docs/formulas.md#mem.hsdp."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import accuracy
from llmplan.cost.model_states import model_state_bytes
from llmplan.estimate import estimate_training
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M = builtin_models()
H100 = builtin_systems()["dgx-h100"]
ULTRA = "mbridge-26.08-pretrain-nemotron-3-ultra-dgx-{}-256gpu-mxfp8-tp{}pp1cp1ep64vpnagbs256mbs1"


def test_model_states_by_hand():
    # 1e9 parameters, ZeRO-3, 2-byte weights and gradients, K = 12: weights and gradients over the partial group
    # of 4, the optimizer over all 8 ranks (outer optim sharding): 0.5 + 0.5 + 1.5 GB
    s = model_state_bytes(1e9, 4, 3, 2.0, 2.0, 12.0, 8)
    assert (s.weights, s.gradients, s.optimizer) == (5e8, 5e8, 1.5e9)
    p = ParallelPlan(dp=8, zero=3, dp_replicate=2, dp_outer_optimizer=True, global_batch=8)
    assert (p.zero_shard, p.optimizer_shard) == (4, 8)
    q = p.model_copy(update={"dp_outer_optimizer": False})
    assert (q.zero_shard, q.optimizer_shard) == (4, 4)


@pytest.mark.parametrize("gpu,tp", [("gb300", 1), ("gb200", 2)])
def test_the_ultra_presets_shard_within_a_64_gpu_domain(published_runs, gpu, tp):
    # Megatron-Bridge perf_recipes/nemotronh/common.py at 067f987d (_apply_nemotron_3_ultra_fsdp_hsdp):
    # num_distributed_optimizer_instances = 256 // 64 = 4, outer_dp_sharding_strategy "optim"; Megatron-LM
    # parallel_state.py at 2a75ac12c: partial groups of dp·cp / 4 ranks, experts of edp / 4 (edp = 256 / EP64 = 4)
    rec = published_runs[ULTRA.format(gpu, tp)]
    setup = accuracy.record_setup(rec, accuracy.family(rec["id"]))
    assert setup is not None
    m, c, plan = setup
    assert not check_plan(m, plan, c)
    assert (plan.dp_replicate, plan.dp_outer_optimizer, plan.zero) == (4, True, 3)
    assert plan.zero_shard * tp == 64 and plan.optimizer_shard == 256 // tp
    assert (plan.expert_shard, plan.expert_optimizer_shard) == (1, 4)


def _memory(dp: int, r: int, outer: bool, zero: int = 3) -> float:
    plan = ParallelPlan(tp=1, dp=dp, zero=zero, dp_replicate=r, dp_outer_optimizer=outer, global_batch=dp,
                        seq_len=2048)
    m, c = M["llama-3.1-8b"], ClusterSpec(system=H100, num_nodes=dp // 8)
    assert not check_plan(m, plan, c)
    return estimate_training(m, c, plan).memory


@settings(max_examples=4, deadline=None, derandomize=True)
@given(st.sampled_from([(16, 2), (16, 4), (32, 4), (32, 8)]))
def test_more_shards_never_raise_memory_and_one_replica_is_zero3(case):
    dp, r = case
    plain, one, hybrid, hfsdp = _memory(dp, 1, False), _memory(dp, 1, False), _memory(dp, r, False), \
        _memory(dp, r, True)
    assert one.total == plain.total
    assert plain.total < hfsdp.total < hybrid.total  # the whole group shards more than one replica does
    assert hfsdp.optimizer == pytest.approx(plain.optimizer)  # outer optim: the optimizer over all dp ranks
    assert hybrid.weights == pytest.approx(r * plain.weights)


@pytest.mark.parametrize("plan,rule,text", [
    (dict(dp=6, zero=3, dp_replicate=4, global_batch=6), "dp_replicate_divides", "must divide dp x cp (6 x 1 = 6)"),
    (dict(dp=8, zero=0, dp_replicate=2, global_batch=8), "dp_replicate_zero", "zero is 0"),
    (dict(dp=8, zero=1, dp_replicate=2, dp_outer_optimizer=True, global_batch=8), "dp_outer_optimizer",
     "use --zero 3 with --dp-replicate > 1"),
])
def test_check_plan_refuses_what_megatron_refuses(plan, rule, text):
    v = [x for x in check_plan(M["llama-3.1-8b"], ParallelPlan(**plan)) if x.rule == rule]
    assert v and text in v[0].message
