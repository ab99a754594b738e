"""The auxiliary load-balancing loss's memory-bound bytes (docs/formulas.md#moe.aux_loss_bytes), its loss types
(seq_aux, global_aux) and the specs that train without it. Expected bytes are counted by hand from the tensors
the source reads and writes for T tokens and E experts with fp32 logits (moe_router_dtype fp32):
NVIDIA/Megatron-LM at d98e8a6, megatron/core/transformer/moe/router.py (TopKRouter.routing, _apply_aux_loss,
_apply_seq_aux_loss, _apply_global_aux_loss) and moe_utils.py (compute_routing_scores_for_aux_loss,
switch_load_balancing_loss_func, get_tokens_per_expert_and_token_count); NVIDIA/TransformerEngine at d0067d0,
transformer_engine/common/fused_router/fused_score_for_moe_aux_loss.cu, fused_moe_aux_loss.cu, pytorch/router.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from agreement import assert_arrays_agree
from llmplan.cost.comm import Transfer, aux_loss_transfers, comm_seconds, step_comm, transfer_seconds
from llmplan.cost.elementwise import moe_aux_loss_passes, moe_routing_train_bytes
from llmplan.cost.kernels import aux_loss_on, router_kernels
from llmplan.estimate import estimate_training
from llmplan.export import render_all
from llmplan.export.bridge import router_overrides
from llmplan.planfile import load_plan
from llmplan.search.grid import Workload, default_space, enumerate_plans
from llmplan.specs.check import check_plan
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems
from llmplan.topology.placement import place

M = builtin_models()
PLANS = Path(__file__).parent / "data" / "plans"
FP32, BOOL = 4, 1
T, E = 4096, 64  # a micro-batch's tokens on one rank and the experts: per-token values are these totals / T


def _model(**update) -> ModelSpec:
    return M["qwen3-30b-a3b"].model_copy(update={"num_experts": E, **update})


def test_fused_aux_loss_bytes_by_hand_from_the_tensor_shapes():
    # forward: fused_score_for_moe_aux_loss_forward_kernel reads logits [T, E] fp32 and writes scores [T, E]
    # fp32, intermediate_output [T, E] fp32 and the routing map [T, E] bool; routing_map.sum(dim=0) reads the map;
    # fused_moe_aux_loss_forward_kernel reads the scores once ([E] counts and the scalar loss not counted)
    forward = T * E * (FP32 + FP32 + FP32 + BOOL) + T * E * BOOL + T * E * FP32
    # backward: fused_moe_aux_loss_backward_kernel writes grad_probs [T, E] fp32; the scores' backward reads it
    # and intermediate_output, writes grad_logits [T, E] fp32; autograd sums the logits' two gradients (the
    # top-k routing's and the loss's): read two [T, E] fp32, write one
    backward = T * E * FP32 + T * E * (FP32 + FP32 + FP32) + T * E * (FP32 + FP32 + FP32)
    fused = moe_aux_loss_passes(_model(router_aux_loss_coef=1e-3), ParallelPlan(moe_router_fusion=True))
    assert fused == (forward / T, backward / T) == (18 * E, 28 * E)


def test_eager_aux_loss_forward_by_hand():
    # compute_routing_scores_for_aux_loss(fused=False), softmax: torch.softmax reads and writes [T, E] fp32; the
    # map: zeros_like (write fp32), .int() (read fp32, write int32), the out-of-place scatter's copy (read and
    # write int32), .bool() (read int32, write bool); routing_map.sum reads the map; probs.sum(dim=0) reads the
    # scores. Backward as fused: the expanded [E] gradient made contiguous (write), the softmax backward (read
    # gradient and output, write), the logits' two gradients summed
    forward = T * E * ((FP32 + FP32) + FP32 + (FP32 + 4) + (4 + 4) + (4 + BOOL) + BOOL + FP32)
    backward = T * E * (FP32 + 3 * FP32 + 3 * FP32)
    eager = moe_aux_loss_passes(_model(router_aux_loss_coef=1e-3), ParallelPlan())
    assert eager == (forward / T, backward / T) == (38 * E, 28 * E)


def test_the_loss_types_move_the_same_bytes_and_none_without_a_coefficient():
    # seq_aux_loss reshapes scores [T, E] to [s, b E] (a view) and global_aux_loss sums the counts into a
    # buffer of E: the same [T, E] passes as aux_loss
    plan = ParallelPlan(moe_router_fusion=True)
    base = moe_aux_loss_passes(_model(router_aux_loss_coef=1e-3), plan)
    assert moe_aux_loss_passes(_model(router_aux_loss_coef=1e-4, seq_aux=True), plan) == base
    assert moe_aux_loss_passes(_model(router_aux_loss_coef=1e-3, global_aux=True), plan) == base
    off = _model(router_aux_loss_coef=0.0)
    assert moe_aux_loss_passes(off, plan) == (0.0, 0.0)


@pytest.mark.parametrize("fused", [True, False])
def test_routing_train_bytes_add_the_loss_forward_per_forward_run(fused):
    # the stage charges 3 x moe_routing_train_bytes: the loss's forward once, twice when `moe` is recomputed
    # (Megatron-Core reruns MoELayer.forward, and the loss with it: grad is enabled in the rerun), backward once
    on, off = _model(router_aux_loss_coef=1e-3), _model(router_aux_loss_coef=0.0)
    forward = (18 if fused else 38) * E
    for recompute, runs in (({}, 1), ({"recompute": "selective", "recompute_modules": ("moe",)}, 2)):
        plan = ParallelPlan(seq_len=4096, micro_batch=1, moe_router_fusion=fused, **recompute)
        added = 3 * (moe_routing_train_bytes(on, plan) - moe_routing_train_bytes(off, plan))
        assert added == pytest.approx(runs * forward + 28 * E)


def test_deepseek_v4_trains_without_the_loss():
    # NVIDIA-NeMo/Megatron-Bridge@067f987 models/deepseek/deepseek_v4_bridge.py: moe_aux_loss_coeff 0.0 (the
    # expert bias alone balances it); recipes/deepseek/*/deepseek_v4.py the same
    for name in ("deepseek-v4-flash", "deepseek-v4-pro"):
        m = M[name]
        assert m.router_aux_loss_coef == 0 and not aux_loss_on(m) and m.expert_bias
        assert moe_aux_loss_passes(m, ParallelPlan(moe_router_fusion=True)) == (0.0, 0.0)
        assert router_kernels(m, ParallelPlan(moe_router_fusion=True)).fwd == 2  # gating GEMM + fused top-k


def _pf(**changes: object):
    pf = load_plan(PLANS / "moe_train.json")
    return dataclasses.replace(pf, model=pf.model.model_copy(update=changes))


def test_qwen3_next_trains_the_global_loss_and_the_exports_say_so():
    # NVIDIA-NeMo/Megatron-Bridge@067f987 models/qwen/qwen3_next_bridge.py: moe_router_load_balancing_type
    # "global_aux_loss", moe_aux_loss_coeff 1e-3
    m = M["qwen3-next-80b-a3b"]
    assert (m.router_aux_loss_coef, m.seq_aux, m.global_aux) == (0.001, False, True)
    pf = _pf(global_aux=True, router_aux_loss_coef=1e-3)
    script = render_all(pf, "megatron")[0]["megatron_pretrain.sh"]
    assert "--moe-router-load-balancing-type global_aux_loss" in script
    assert "--moe-aux-loss-coeff 0.001" in script
    assert dict(router_overrides(pf))["model.moe_router_load_balancing_type"] == "global_aux_loss"


def test_seq_aux_and_global_aux_together_are_refused():
    fields = {**_model().model_dump(exclude_unset=True), "seq_aux": True, "global_aux": True}
    with pytest.raises(ValidationError, match="seq_aux and global_aux both set"):
        ModelSpec(**fields)


def test_random_plans_agree_with_the_scalar_estimate_with_and_without_the_loss():
    cluster = ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=4)
    w = Workload(global_batch=256, seq_len=4096)
    for coef, glob in ((1e-3, True), (0.0, False)):
        m = M["qwen3-30b-a3b"].model_copy(update={"router_aux_loss_coef": coef, "global_aux": glob})
        plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
        order = np.random.default_rng(7).permutation(len(plans))
        idx = [int(i) for i in order[:300] if not check_plan(m, plans.plan(int(i)), cluster)][:4]
        assert_arrays_agree(m, cluster, plans, idx)


def test_the_token_counts_all_reduce_over_the_loss_types_group():
    # get_tokens_per_expert_and_token_count: routing_map.sum(dim=0) is int64 (8 bytes) per expert, all-reduced
    # over tp_cp_group (aux_loss; seq_aux_loss on the [s, b E] map: b E counts) or tp_dp_cp_group
    # (global_aux_loss), once per MoE layer and micro-batch forward, again when `moe` is recomputed
    plan = ParallelPlan(tp=2, dp=4, ep=4, micro_batch=2, global_batch=64, seq_len=4096, sp=True)
    n, L = plan.num_microbatches, M["qwen3-30b-a3b"].num_hidden_layers  # every layer MoE, pp 1
    for update, message, group in (({}, 8 * E, "tpcp"), ({"seq_aux": True}, 8 * 2 * E, "tpcp"),
                                   ({"global_aux": True}, 8 * E, "tpdpcp")):
        (t,) = aux_loss_transfers(_model(router_aux_loss_coef=1e-3, **update), plan, "tpcp", "tpdpcp")
        assert (t.collective, t.calls, t.message, t.group) == ("all-reduce", n * L, message, group)
    rerun = plan.model_copy(update={"recompute": "selective", "recompute_modules": ("moe",)})
    assert aux_loss_transfers(_model(router_aux_loss_coef=1e-3), rerun, "tpcp", "tpdpcp")[0].calls == 2 * n * L
    assert aux_loss_transfers(_model(router_aux_loss_coef=0.0), plan, "tpcp", "tpdpcp") == []


def test_the_global_counts_are_timed_in_line_over_the_whole_stage():
    # Qwen3-Next on 8 DGX H100 nodes: the tp x dp x cp group holds all 64 ranks (pp 1) across 8 nodes; its
    # all-reduces are timed like any all-reduce of that span and add to the step whole
    cluster = ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=8)
    plan = ParallelPlan(tp=2, dp=32, ep=16, etp=1, micro_batch=1, global_batch=512, seq_len=4096, sp=True)
    m = M["qwen3-next-80b-a3b"]
    span = place(plan.degrees, cluster)["tpdpcp"]
    assert (span.size, span.nodes) == (64, 8)
    layers = m.num_hidden_layers + m.num_nextn_predict_layers  # 48 MoE layers and the MTP module's
    by_hand = transfer_seconds(Transfer("all-reduce", plan.num_microbatches * layers, 8 * m.num_experts, span),
                               cluster.system)
    comm = comm_seconds(step_comm(m, plan, place(plan.degrees, cluster), cluster.system), cluster.system)
    assert comm.router == pytest.approx(by_hand) and by_hand > 0
    local = m.model_copy(update={"global_aux": False})  # aux_loss: the tp 2 group inside a node
    step = estimate_training(m, cluster, plan).time
    assert step.exposed["router"] - estimate_training(local, cluster, plan).time.exposed["router"] == pytest.approx(
        by_hand - comm_seconds(step_comm(local, plan, place(plan.degrees, cluster), cluster.system),
                               cluster.system).router)
