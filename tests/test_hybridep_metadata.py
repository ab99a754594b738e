"""HybridEP's metadata preprocessing (docs/formulas.md#moe.hybridep_permute, cost.elementwise.hybridep_metadata_bytes)
counted by hand, and the search pricing it and the router's top-k calls (cost.moe_kernels) as the scalar estimate.

Source: deepseek-ai/DeepEP hybrid-ep @94a9f8f6: csrc/hybrid_ep/hybrid_ep.cu (metadata_preprocessing: the routing
map's all-gather, then metadata_preprocess_core), backend/hybrid_ep_backend.cuh (scan: one thread a token of the
whole EP group, num_of_tokens_per_rank x ranks per node x nodes, each loading NUM_OF_EXPERTS_PER_RANK x
NUM_OF_RANKS_PER_NODE bools, in step 0 and again in step 2), deep_ep/hybrid_ep_buffer.py (dispatch_with_permute
preprocesses only without a handle); NVIDIA/Megatron-LM @d98e8a6 megatron/core/transformer/moe/fused_a2a.py
(HybridEPDispatch.forward passes the routing map; HybridEPDispatch.backward and HybridEPCombine.backward reuse the
handle) and moe_layer.py (custom_forward, rerun whole under `moe` recompute)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from llmplan.cost.elementwise import hybridep_metadata_bytes, moe_permute_passes, moe_routing_train_bytes
from llmplan.cost.moe_kernels import moe_kernel_calls
from llmplan.estimate import estimate_training
from llmplan.search.evaluate import evaluate
from llmplan.search.grid import Workload, default_space, enumerate_plans
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M = builtin_models()


def hybridep(ep: int, **kw) -> ParallelPlan:
    return ParallelPlan(dp=ep, ep=ep, moe_dispatcher="deepep", moe_flex_backend="hybridep", **kw)


def test_nemotron_3_ultra_ep64_by_hand():
    # EP64 in one NVL72 domain (the 26.08 preset's NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN 64): the scan runs
    # over the 64 ranks' tokens, each row 512 bools, loaded twice: 2 x 64 x 512 bytes a token of the rank
    m = M["nemotron-3-ultra"]
    assert hybridep_metadata_bytes(m, hybridep(64)) == 2 * 64 * 512
    # 4,096 tokens a rank (TP2 + SP): 268 MB a forward dispatch, 134 MB each read
    assert 4096 * hybridep_metadata_bytes(m, hybridep(64)) / 2 == 4096 * 64 * 512


def test_forward_only_and_once_more_with_the_moe_rerun():
    m = M["nemotron-3-super"]
    plan = hybridep(64, seq_len=4096)
    forward, backward = moe_permute_passes(m, plan)
    meta = hybridep_metadata_bytes(m, plan)
    assert forward - backward == pytest.approx(meta)  # the pair is the same each way; the scan runs in forward
    rerun = hybridep(64, seq_len=4096, recompute="selective", recompute_modules=("moe",))
    # the rerun's forward adds the pair, the scan, the eager router's forward (37E, docs/formulas.md
    # #moe.router_fusion) and, Super training with the aux loss on the eager router, the loss's forward passes
    # (38E, docs/formulas.md#moe.aux_loss_bytes)
    assert 3 * (moe_routing_train_bytes(m, rerun) - moe_routing_train_bytes(m, plan)) == pytest.approx(
        forward + (37 + 38) * m.num_experts)


def test_only_hybridep_with_expert_parallelism_and_growing_with_the_group():
    m = M["nemotron-3-super"]
    assert hybridep_metadata_bytes(m, hybridep(1)) == 0.0
    alltoall, deepep = ParallelPlan(dp=64, ep=64), ParallelPlan(dp=64, ep=64, moe_dispatcher="deepep")
    te = moe_permute_passes(m, alltoall)
    assert moe_permute_passes(m, deepep) == te  # DeepEP's normal kernels, then TE's permute: no scan
    assert hybridep_metadata_bytes(m, hybridep(64)) == 8 * hybridep_metadata_bytes(m, hybridep(8))


@pytest.mark.parametrize("name,system,nodes", [("nemotron-3-super", "gb200-nvl72", 18)])
def test_vectorised_search_agrees_with_scalar(name, system, nodes):
    # E = 512: the multi-block top-k (group-limited routing, aux loss) and HybridEP's scan on every plan
    m, cluster = M[name], ClusterSpec(system=builtin_systems()[system], num_nodes=nodes)
    w = Workload(global_batch=1024, seq_len=8192, moe_dispatcher="deepep", moe_flex_backend="hybridep")
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    rng = np.random.default_rng(3)
    valid = (int(i) for i in rng.permutation(len(plans)) if not check_plan(m, plans.plan(int(i)), cluster))
    idx = list(itertools.islice(valid, 12))
    assert len(idx) == 12 and len({plans.plan(i).ep for i in idx}) > 1
    vec = evaluate(m, cluster, plans.take(np.asarray(idx)))
    for j, i in enumerate(idx):
        scalar = estimate_training(m, cluster, plans.plan(i))
        assert float(vec.step.total[j]) == pytest.approx(float(scalar.time.total), rel=1e-9)


ULTRA = "mbridge-26.08-pretrain-nemotron-3-ultra-dgx-{}-256gpu-mxfp8-tp{}pp1cp1ep64vpnagbs256mbs1"


@pytest.mark.parametrize("gpu,tp", [("gb300", 1), ("gb200", 2)])
def test_the_ultra_rows_price_the_fused_router_their_preset_sets(row_setup, gpu, tp):
    # NVIDIA-NeMo/Megatron-Bridge perf_recipes/nemotronh/common.py at 4ab94dfad (the rows' performance-summary
    # commit) and v0.6.0: _apply_nemotron_3_ultra_perf_defaults sets moe_router_fusion = True; no top-k kernel runs
    m, _, plan = row_setup(ULTRA.format(gpu, tp))
    assert plan.moe_router_fusion
    assert moe_kernel_calls(m, plan)["topk_pass"] == 0
    # HybridEP with EP64 in the NVL72 domain: the scan's 2 x 64 x 512 bytes a token each forward
    assert hybridep_metadata_bytes(m, plan) == 2 * 64 * 512


def test_the_super_rows_keep_the_unfused_router(published_runs, row_setup):
    # _apply_nemotron_3_super_perf_defaults (same file and commit) leaves moe_router_fusion at Megatron's False;
    # 512 experts at 4,096+ tokens a rank: group_limited_topk's two multi-block top-k and the aux loss's one
    rows = [rid for rid in published_runs if "nemotron-3-super" in rid and rid.startswith("mbridge-26")]
    assert rows
    m, _, plan = row_setup(rows[0])
    assert not plan.moe_router_fusion
