"""HybridEP's metadata scan and probs' permute priced with the EP ranks of one NVLink domain, not the whole EP group
(docs/formulas.md#moe.hybridep_permute; cost.comm.hybridep_domain_ranks). Expected values counted by hand from
deepseek-ai/DeepEP hybrid-ep @94a9f8f6: deep_ep/hybrid_ep_buffer.py (HybridEPBuffer.__init__: ranks per NVLink domain
from NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN or detect_accessible_ranks, the group a multiple of it),
backend/hybrid_ep_backend.cuh (scan: tokens x ranks per node x nodes threads, each loading NUM_OF_EXPERTS_PER_RANK x
NUM_OF_RANKS_PER_NODE bools, twice), extension/permute.cu (the unpermute writes the domain's prob row)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from llmplan.cost.comm import dispatch_rows, hybridep_domain_ranks
from llmplan.cost.elementwise import elementwise_bytes, hybridep_metadata_bytes, hybridep_prob_permute_bytes
from llmplan.estimate import estimate_training
from llmplan.search.evaluate import evaluate
from llmplan.search.grid import Workload, default_space, enumerate_plans
from llmplan.search.run import runs_on
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems
from llmplan.topology.placement import on_cluster, place

M, S = builtin_models(), builtin_systems()


def hybridep(ep: int, **kw) -> ParallelPlan:
    return ParallelPlan(dp=64 // kw.pop("tp", 1), ep=ep, moe_dispatcher="deepep", moe_flex_backend="hybridep", **kw)


def test_super_ep64_over_eight_dgx_b200_nodes_by_hand():
    # 8 DGX B200 (NVLink domain of 8): an EP64 group spans 8 domains, so HybridEP sees 8 ranks a domain; the scan
    # loads E/ep x 8 = 64 bools for each of the T x 64 gathered tokens, twice: 2 x 8 x 512 bytes a token of the rank
    m, cluster = M["nemotron-3-super"], ClusterSpec(system=S["dgx-b200"], num_nodes=8)
    plan = on_cluster(hybridep(64), cluster)
    assert plan.nvlink_domain_ranks == 8 and hybridep_domain_ranks(plan) == 8
    assert hybridep_metadata_bytes(m, plan) == 2 * 8 * 512
    # the probs' unpermute writes the domain's 512 / 64 x 8 = 64 probs (fp32) a received row, in backward
    k, rows = m.num_experts_per_tok, dispatch_rows(m, plan)
    assert hybridep_prob_permute_bytes(m, plan) == pytest.approx(4 * (3 * k + 64 * rows) / 3, rel=1e-12)
    # the domain unknown (nvlink_domain_ranks 0): the EP group as one domain, 64 ranks, the upper bound
    assert hybridep_metadata_bytes(m, hybridep(64)) == 2 * 64 * 512
    assert hybridep_prob_permute_bytes(m, hybridep(64)) == pytest.approx(4 * (3 * k + 512 * rows) / 3, rel=1e-12)
    # one layer's memory-bound bytes fall by T/1 x (scan + probs) difference (tp 1, no recompute: forward + backward
    # over 3 for the scan's forward pass, the probs' bytes as they stand)
    T = 4096
    base, placed = hybridep(64, seq_len=T), on_cluster(hybridep(64, seq_len=T), cluster)
    saved = 2 * (64 - 8) * 512 / 3 + 4 * (512 - 64) * rows / 3
    assert elementwise_bytes(m, base, True) - elementwise_bytes(m, placed, True) == pytest.approx(T * saved, rel=1e-9)


def test_in_one_nvl72_domain_the_group_is_the_domain():
    # the Ultra 26.08 preset: EP64 in one NVL72 rack (NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN 64)
    m, cluster = M["nemotron-3-ultra"], ClusterSpec(system=S["gb200-nvl72"], num_nodes=16)
    plan = on_cluster(hybridep(64), cluster)
    assert hybridep_domain_ranks(plan) == 64 and hybridep_metadata_bytes(m, plan) == 2 * 64 * 512


@pytest.mark.parametrize("system,nodes,tp,ep,etp", [
    ("dgx-b200", 8, 1, 64, 1), ("dgx-b200", 8, 1, 16, 1), ("dgx-b200", 8, 2, 16, 2), ("dgx-h100", 4, 4, 8, 1),
    ("dgx-h100", 2, 2, 4, 2), ("dgx-h100", 1, 1, 8, 1), ("gb200-nvl72", 32, 1, 64, 1), ("gb200-nvl72", 32, 2, 32, 2),
])
def test_the_domain_ranks_are_the_ranks_dispatch_coeffs_splits_the_ep_group_into(system, nodes, tp, ep, etp):
    # the comm path's g (cost.comm.dispatch_coeffs: span.size // span.domains of the placed EP group)
    cluster = ClusterSpec(system=S[system], num_nodes=nodes)
    n = cluster.num_gpus
    plan = on_cluster(ParallelPlan(tp=tp, dp=n // tp, ep=ep, etp=etp, moe_dispatcher="deepep",
                                   moe_flex_backend="hybridep"), cluster)
    span = place(plan.degrees, cluster)["ep"]
    assert hybridep_domain_ranks(plan) == max(span.size // span.domains, 1)


def test_no_expert_parallelism_no_scan():
    cluster = ClusterSpec(system=S["dgx-b200"], num_nodes=8)
    assert hybridep_metadata_bytes(M["nemotron-3-super"], on_cluster(hybridep(1), cluster)) == 0.0


def test_the_search_workload_carries_the_domain():
    m, cluster = M["nemotron-3-super"], ClusterSpec(system=S["dgx-b200"], num_nodes=8)
    w = runs_on(m, cluster, Workload(global_batch=512, seq_len=4096, moe_dispatcher="deepep",
                                     moe_flex_backend="hybridep"))
    assert w.nvlink_domain_ranks == 8


@pytest.mark.parametrize("system,nodes", [("dgx-b200", 8), ("gb200-nvl72", 32)])
def test_vectorised_search_agrees_with_scalar_across_domains(system, nodes):
    # plans whose EP groups span several NVLink domains: the vectorised evaluation and the one-plan estimate price
    # the same scan (both set the domain from the cluster)
    m, cluster = M["nemotron-3-super"], ClusterSpec(system=S[system], num_nodes=nodes)
    w = Workload(global_batch=1024, seq_len=4096, moe_dispatcher="deepep", moe_flex_backend="hybridep")
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    rng = np.random.default_rng(5)
    valid = (int(i) for i in rng.permutation(len(plans))
             if plans.ep[int(i)] > 8 and not check_plan(m, plans.plan(int(i)), cluster))
    idx = list(itertools.islice(valid, 10))
    assert len(idx) == 10
    g = hybridep_domain_ranks(on_cluster(plans.take(np.asarray(idx)), cluster))
    assert np.any(np.asarray(g) < plans.ep[np.asarray(idx)]) or system == "gb200-nvl72"
    vec = evaluate(m, cluster, plans.take(np.asarray(idx)))
    for j, i in enumerate(idx):
        scalar = estimate_training(m, cluster, plans.plan(i))
        assert float(vec.step.total[j]) == pytest.approx(float(scalar.time.total), rel=1e-9)
