"""The auxiliary load-balancing loss's saved fp32 scores in an MoE layer's activations (docs/formulas.md
#mem.aux_loss_scores; cost.activations.aux_loss_saved_bytes), counted by hand from the tensors the source saves for
backward: NVIDIA/TransformerEngine d0067d0 transformer_engine/pytorch/router.py (FusedComputeScoresForMoEAuxLoss
saves the kernel's intermediate_output, at::kFloat in the logits' shape, csrc/extensions/router.cpp
fused_score_for_moe_aux_loss_fwd; FusedAuxLoss saves its constant and the [E] token counts only);
NVIDIA/Megatron-LM d98e8a6 megatron/core/transformer/moe/moe_utils.py (compute_routing_scores_for_aux_loss:
torch.softmax(..., dtype=float32) saves its [T, E] output; switch_load_balancing_loss_func's probs.sum(dim=0) and
[E] product save none of [T, E]), router.py (TopKRouter.routing: the loss only with gradients enabled)."""
from __future__ import annotations

import pytest

from llmplan.cost.activations import layer_activation_bytes, layer_activation_parts
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models

M = builtin_models()


def without_loss(m):
    return m.model_copy(update={"router_aux_loss_coef": 0.0})


@pytest.mark.parametrize("fused", [False, True])
def test_qwen3_30b_keeps_four_bytes_a_token_and_expert(fused):
    # E = 128, T = 4,096 tokens a rank (tp 1): 4 x 4,096 x 128 = 2 MiB a MoE layer and micro-batch, fused or eager
    m = M["qwen3-30b-a3b"]
    plan = ParallelPlan(seq_len=4096, micro_batch=1, moe_router_fusion=fused)
    on, off = layer_activation_parts(m, plan, True), layer_activation_parts(without_loss(m), plan, True)
    assert on.mlp - off.mlp == 4 * 4096 * 128 == 2 * 2**20
    assert layer_activation_bytes(m, plan, True) - layer_activation_bytes(without_loss(m), plan, True) == 4 * 4096 * 128


def test_the_router_sees_the_sequence_shard_under_sp():
    # tp 2 with sequence parallelism: the router's [T/2, E] tensors, micro-batch 2
    m = M["qwen3-30b-a3b"]
    plan = ParallelPlan(tp=2, sp=True, seq_len=4096, micro_batch=2)
    diff = layer_activation_parts(m, plan, True).mlp - layer_activation_parts(without_loss(m), plan, True).mlp
    assert diff == 4 * (4096 * 2 / 2) * 128


def test_moe_recompute_and_full_recompute_store_none():
    # `moe` recompute runs the layer's forward without gradients (no loss, nothing saved) and rebuilds it in backward
    m = M["qwen3-30b-a3b"]
    for plan in (ParallelPlan(seq_len=4096, recompute="selective", recompute_modules=("moe",)),
                 ParallelPlan(seq_len=4096, recompute="full")):
        assert layer_activation_bytes(m, plan, True) == layer_activation_bytes(without_loss(m), plan, True)


def test_models_without_the_loss_and_dense_layers_keep_none():
    plan = ParallelPlan(seq_len=4096)
    v4 = M["deepseek-v4-flash"]  # router_aux_loss_coef 0 (Megatron-Bridge 067f987 deepseek_v4 recipes)
    assert layer_activation_parts(v4, plan, True).mlp == layer_activation_parts(without_loss(v4), plan, True).mlp
    m = M["qwen3-30b-a3b"]
    assert layer_activation_parts(m, plan, False) == layer_activation_parts(without_loss(m), plan, False)
