"""The EP all-to-alls counted on the rank with the most MoE layers, and the alltoall dispatcher's routing-probability
all-to-all (docs/formulas.md#comm.ep_stage, #comm.ep_probs; docs/validation.md#ep-stage).

Layer counts are Megatron-Core's split rule: with account_for_embedding_in_pipeline_split and
account_for_loss_in_pipeline_split the embedding and the loss each take a layer's slot, so Qwen3-235B-A22B's 94
layers + 2 over PP8 x VP4 = 32 virtual stages are 3 each, the first and the last holding 2 transformer layers
(NVIDIA/Megatron-LM at d98e8a64dd, megatron/core/transformer/transformer_block.py get_num_layers_to_build: num_layers
+ 1 + 1 split over pp x vp, one fewer on the first rank's first virtual stage and the last rank's last). Rank 0 holds virtual stages 0, 8,
16, 24 (2 + 3 + 3 + 3 = 11), rank 7 stages 7, 15, 23, 31 (3 + 3 + 3 + 2 = 11), ranks 1-6 12 each.

The probabilities' call: MoEAlltoAllTokenDispatcher.token_dispatch sends permutated_local_input_tokens, then
permuted_probs (one value per routed (token, expert) row, the router's dtype: fp32 under moe_router_dtype fp32)
with the same splits in a second all_to_all; _AllToAll's backward is the reverse all_to_all of the gradient
(megatron/core/transformer/moe/token_dispatcher.py, megatron/core/tensor_parallel/mappings.py at d98e8a64dd, and
the same two calls at core_v0.15.0). DeepEP's and HybridEP's dispatch carry the probs in the one call
(moe/fused_a2a.py: buffer.dispatch(topk_weights=...), dispatch_with_permute(probs=...)).
"""

from __future__ import annotations

import numpy as np
import pytest

from llmplan.cost.comm import ep_transfers
from llmplan.cost.stages import stage_layer_list
from llmplan.estimate import estimate_training
from llmplan.search.evaluate import evaluate
from llmplan.search.grid import from_plan
from llmplan.specs.layout import parse_layout
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M, S = builtin_models(), builtin_systems()
QWEN = M["qwen3-235b-a22b"]  # 94 layers, all MoE; top-8 of 128 experts; hidden 4,096
N_MB = 1024 // 8  # global batch 1,024, micro-batch 1, dp 8
TOKENS = 4096  # seq 4,096 x micro-batch 1, no sequence parallelism
SPLIT = dict(pp_first=11, pp_last=11)  # the embedding and the loss counted as layers (see above)
LAYOUT = parse_layout("Ett|(ttt|)*30,ttL")  # the same split as a layout: 2, 3 x 30, 2 layers a virtual stage


def plan(**upd) -> ParallelPlan:
    base = dict(tp=1, pp=8, vpp=4, ep=8, etp=1, dp=8, micro_batch=1, global_batch=1024, seq_len=4096,
                moe_dispatcher="alltoall", **SPLIT)
    base.update(upd)
    return ParallelPlan(**base)


def a2as(p: ParallelPlan) -> tuple:
    """(tokens' all-to-all, probabilities' all-to-all or None) of ep_transfers."""
    out = sorted((t for t in ep_transfers(QWEN, p, "ep") if t.collective == "all-to-all"), key=lambda t: -t.message)
    return out[0], (out[1] if len(out) > 1 else None)


@pytest.mark.parametrize("upd", [SPLIT, {"pp_layout": LAYOUT, "pp_first": 0, "pp_last": 0}])
def test_split_leaves_rank_0_fewer_moe_layers_and_ep_counts_a_middle_ranks(upd):
    p = plan(**upd)
    assert stage_layer_list(QWEN, p) == [11, 12, 12, 12, 12, 12, 12, 11]  # the rule above
    tokens, probs = a2as(p)
    assert tokens.calls == N_MB * 12 * 4  # dispatch and combine, forward and backward, on 12 layers (not 11)
    assert probs.calls == N_MB * 12 * 2  # the probs call forward, its gradient's backward


def test_last_rank_holding_the_most_sets_the_count():
    # a layout whose last rank holds the most: 7 x 11 + 17 = 94 layers
    layout = parse_layout("E" + "t" * 11 + "|" + ("t" * 11 + "|") * 6 + "t" * 17 + "L")
    p = plan(vpp=1, pp_layout=layout, pp_first=0, pp_last=0)
    assert stage_layer_list(QWEN, p) == [11] * 7 + [17]
    tokens, probs = a2as(p)
    assert tokens.calls == N_MB * 17 * 4 and probs.calls == N_MB * 17 * 2


def test_probs_message_is_t_times_k_fp32_values():
    tokens, probs = a2as(plan())
    # the tokens: T x k rows of h bf16; the probs: T x k fp32 values, both for the most-loaded rank (same factor)
    assert probs.message / tokens.message == pytest.approx(4 / (2 * 4096), rel=1e-12)
    assert TOKENS * 8 * 4 <= probs.message <= TOKENS * 8 * 4 * 1.02  # 131,072 B x the most-loaded rank's < 2%
    assert probs.dispatch is None and tokens.dispatch is None  # NCCL all_to_all_single, not DeepEP


def test_recompute_reruns_the_forward_probs_call():
    tokens, probs = a2as(plan(recompute="full"))
    assert tokens.calls == N_MB * 12 * 6 and probs.calls == N_MB * 12 * 3  # + one forward of each


@pytest.mark.parametrize("backend", [None, "hybridep"])
def test_deepep_and_hybridep_send_probs_inside_the_dispatch(backend):
    upd = {"moe_dispatcher": "deepep"} | ({"moe_flex_backend": backend} if backend else {})
    transfers = [t for t in ep_transfers(QWEN, plan(**upd), "ep") if t.collective == "all-to-all"]
    assert len(transfers) == 1 and transfers[0].dispatch is not None


def test_probs_calls_add_their_latency_to_the_step():
    # at micro-batch 1 and seq 512 the probs message is 16 kB: the call is latency, not bytes
    cluster = ClusterSpec(system=S["dgx-b200"], num_nodes=8)
    p = plan(seq_len=512)
    e = estimate_training(QWEN, cluster, p)
    probs = [t for t in e.comm.axes["ep"].transfers if t.collective == "all-to-all" and t.message < 1e5]
    assert len(probs) == 1 and probs[0].message == pytest.approx(512 * 8 * 4, rel=0.05)
    # one latency a peer (7 peers) at least, per call, on the EP axis
    from llmplan.cost.comm import transfer_seconds
    assert transfer_seconds(probs[0], cluster.system) >= probs[0].calls * 7 * 1e-6 * 0.99


@pytest.mark.parametrize("upd", [{}, {"recompute": "full"}, {"moe_dispatcher": "deepep"}, {"ep_comm_overlap": True}])
def test_vectorised_path_agrees_with_the_scalar_one(upd):  # (layouts are priced one plan at a time: search.layouts)
    cluster = ClusterSpec(system=S["dgx-b200"], num_nodes=8)
    p = plan(**upd)
    scalar = estimate_training(QWEN, cluster, p)
    vec = evaluate(QWEN, cluster, from_plan(p))
    assert float(vec.step.total[0]) == pytest.approx(float(scalar.time.total), rel=1e-9)
    assert float(vec.step.comm_exposed[0]) == pytest.approx(float(scalar.time.comm_exposed), rel=1e-9)


def test_vectorised_search_over_uneven_splits_agrees():
    # many plans at once (pp 8 pinned with the 11 / 11 ends; tp, ep, vpp, recompute, micro-batch vary)
    from agreement import assert_arrays_agree
    from llmplan.search.grid import Workload, default_space, enumerate_plans
    from llmplan.specs.check import check_plan
    cluster = ClusterSpec(system=S["dgx-b200"], num_nodes=8)
    w = Workload(global_batch=1024, seq_len=4096)
    plans = enumerate_plans(default_space(QWEN, cluster, w, pins={"pp": 8, **SPLIT}), cluster, w)
    picked = [i for i in range(0, len(plans), max(1, len(plans) // 400))
              if plans.plan(i).ep > 1 and not check_plan(QWEN, plans.plan(i), cluster)][:12]
    assert len(picked) >= 4
    assert_arrays_agree(QWEN, cluster, plans, picked)
    assert np.all(np.asarray([plans.plan(i).pp_first for i in picked]) == 11)
