"""HybridEP's standalone permute / unpermute on the fp32 probs (moe.hybridep_prob_permute), counted by hand.

Source: deepseek-ai/DeepEP csrc/hybrid_ep/extension/permute.cu at 17cfb81: permute_kernel reads the rank's
routed entries of a received prob row and writes one prob per permuted row; unpermute_kernel (backward: the
probs' gradient, Megatron-LM fused_a2a.py HybridEPDispatch.backward) writes the whole row of
num_local_experts x num_ranks_per_node floats, zeros but the routed entries, for every received row."""
from math import comb

import pytest

from llmplan.cost.compute import elementwise_bytes
from llmplan.cost.elementwise import hybridep_prob_permute_bytes, moe_routing_train_bytes
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models

M = builtin_models()


def hybridep(ep: int, **kw) -> ParallelPlan:
    return ParallelPlan(dp=ep, ep=ep, moe_dispatcher="deepep", moe_flex_backend="hybridep", **kw)


def test_nemotron_3_super_ep64_by_hand():
    # 512 experts, top-22, 8 a rank at EP64 in one NVL72 domain: a received row's prob row is 8 x 64 = 512
    # floats (2 KB). Rows a token reaches: 64 ranks x P(a rank holds any of the 22), k drawn uniformly.
    m = M["nemotron-3-super"]
    rows = 64 * (1 - comb(512 - 8, 22) / comb(512, 22))
    forward = 4 * 22 + 4 * 22  # permute: read the 22 routed probs, write 22 permuted
    backward = 4 * 22 + 4 * 512 * rows  # unpermute: read 22 gradients, write full rows
    assert hybridep_prob_permute_bytes(m, hybridep(64)) == pytest.approx((forward + backward) / 3, rel=1e-12)
    assert 18 < rows < 20  # about 13 KB a token against the permutes' 8 k w = 180 KB


def test_deepseek_v3_ep64_by_hand():
    # 256 experts, top-8 from 4 of 8 groups of 32; EP64: 4 experts a rank, blocks inside one group, so a rank
    # is hit when its group is picked (4/8) and it holds any of the 8 drawn from the 4 x 32 picked experts.
    m = M["deepseek-v3"]
    rows = 64 * (4 / 8) * (1 - comb(128 - 4, 8) / comb(128, 8))
    total = 4 * 8 * 3 + 4 * 256 * rows
    assert hybridep_prob_permute_bytes(m, hybridep(64)) == pytest.approx(total / 3, rel=1e-12)


def test_only_hybridep_with_expert_parallelism_pays():
    m = M["deepseek-v3"]
    assert hybridep_prob_permute_bytes(m, ParallelPlan(dp=8, ep=8, moe_dispatcher="deepep")) == 0.0
    assert hybridep_prob_permute_bytes(m, ParallelPlan(dp=8, ep=8)) == 0.0  # alltoall
    assert hybridep_prob_permute_bytes(m, hybridep(1)) == 0.0


def test_the_layer_traffic_carries_it():
    m = M["nemotron-3-super"]
    on, off = hybridep(64, seq_len=4096), ParallelPlan(dp=64, ep=64, seq_len=4096, moe_dispatcher="deepep")
    extra = elementwise_bytes(m, on, True) - elementwise_bytes(m, off, True)
    # the backends also differ in their token permutes (HybridEP's own, moe.hybridep_permute)
    permutes = moe_routing_train_bytes(m, on) - moe_routing_train_bytes(m, off)
    assert extra == pytest.approx(4096 * (hybridep_prob_permute_bytes(m, on) + permutes), rel=1e-9)


def test_vectorised_search_agrees_with_scalar_on_hybridep():
    # the bytes follow each plan's own ep (dispatch_rows): one evaluation of mixed plans equals each scalar estimate
    import itertools

    import numpy as np

    from llmplan.estimate import estimate_training
    from llmplan.search.evaluate import evaluate
    from llmplan.search.grid import Workload, default_space, enumerate_plans
    from llmplan.specs.check import check_plan
    from llmplan.specs.plan import ClusterSpec
    from llmplan.specs.registry import builtin_systems

    m, cluster = M["deepseek-v3"], ClusterSpec(system=builtin_systems()["dgx-h800"], num_nodes=32)
    w = Workload(global_batch=1024, seq_len=4096, moe_dispatcher="deepep", moe_flex_backend="hybridep")
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    rng = np.random.default_rng(11)
    valid = (int(i) for i in rng.permutation(len(plans)) if not check_plan(m, plans.plan(int(i)), cluster))
    idx = list(itertools.islice(valid, 16))
    assert len(idx) == 16 and len({plans.plan(i).ep for i in idx}) > 1
    vec = evaluate(m, cluster, plans.take(np.asarray(idx)))
    for j, i in enumerate(idx):
        plan = plans.plan(i)
        assert plan.moe_flex_backend == "hybridep"
        assert float(vec.step.total[j]) == pytest.approx(float(estimate_training(m, cluster, plan).time.total),
                                                         rel=1e-9)
