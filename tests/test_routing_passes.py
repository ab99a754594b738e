"""An MoE layer's router and permutes in training priced by their kernels' own forward and backward passes
(docs/formulas.md#moe.routing_passes), not three forwards. Expected values are counted by hand from the bytes each
kernel reads and writes per token: NVIDIA/TransformerEngine at d0067d0,
transformer_engine/common/fused_router/fused_topk_with_score_function.cu (fused router forward / backward
kernels), transformer_engine/common/triton/permutation.py (_row_id_map_pass_1/2/3_kernel, _permute_kernel,
_unpermute_kernel) and pytorch/permutation.py (the permute's backward is an unpermute of the gradient, the
unpermute's a permute); NVIDIA/Megatron-LM d98e8a6 token_dispatcher.py (permute with the probs, unpermute without).
"""

from __future__ import annotations

import pytest

from llmplan.cost.elementwise import (
    elementwise_bytes,
    moe_permute_passes,
    moe_recompute_bytes,
    moe_router_passes,
    moe_routing_bytes,
    moe_routing_train_bytes,
)
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan

TINY: dict = {"name": "tiny-moe", "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 2,
              "num_attention_heads": 4, "vocab_size": 1000, "max_position_embeddings": 4096,
              "learned_position_embeddings": True, "num_experts": 64, "num_experts_per_tok": 4,
              "moe_intermediate_size": 256}
E, K, H = 64, 4, 512


def test_fused_router_is_one_pass_each_way_for_every_score_function():
    # forward: read the fp32 logits (4), write the probs (4), the fp32 intermediate_output (4) and the bool
    # routing map (1); backward: read the probs' gradient (4), intermediate_output (4) and the map (1), write the
    # logits' gradient (4). Sigmoid with expert bias and group-limited top-k run in the same kernel's registers.
    forward = (4 + 4 + 4 + 1) * E
    backward = (4 + 4 + 1 + 4) * E
    fused = ParallelPlan(moe_router_fusion=True)
    for extra in ({}, {"scoring_func": "sigmoid", "expert_bias": True, "routed_scaling_factor": 2.5}):
        assert moe_router_passes(ModelSpec(**{**TINY, **extra}), fused) == (forward, backward)


def test_eager_router_counts_both_out_of_place_scatters():
    # Megatron-LM d98e8a6 moe_utils.py topk_routing_with_score_function (not deterministic), fp32 logits:
    # routing_probs = zeros_like(logits).scatter(1, idx, probs): the fill (write 4) and the out-of-place scatter's
    # copy of it (ATen scatter_impl: out.copy_(self): read 4, write 4); routing_map =
    # zeros_like(logits).int().scatter(1, idx, 1).bool(): fill (4), .int() (4 + 4), the scatter's int32 copy
    # (4 + 4), .bool() (4 + 1). Backward: torch.topk's zero-filled fp32 gradient (write 4).
    forward = (4 + (4 + 4)) * E + (4 + (4 + 4) + (4 + 4) + (4 + 1)) * E
    assert forward == 37 * E
    assert moe_router_passes(ModelSpec(**TINY), ParallelPlan()) == (forward, 4 * E)


def test_permute_and_unpermute_passes_by_hand():
    m = ModelSpec(**TINY)
    # forward: row-id map pass 1 (read the bool map 1, write int32 4), pass 2 (read 4, write 4), pass 3 (read 4);
    # the permute reads the bf16 row once (2h) and writes k copies (2kh); the unpermute reads the k copies (2kh)
    # and writes the row (2h)
    row_id_map = (1 + 4) * E + (4 + 4) * E + 4 * E
    permute, unpermute = 2 * H + 2 * K * H, 2 * K * H + 2 * H
    # backward: the unpermute's is a permute of the gradient, the permute's an unpermute of the gradients that
    # also zero-fills the fp32 probs-gradient row (4E)
    assert moe_permute_passes(m, ParallelPlan()) == (row_id_map + permute + unpermute, unpermute + permute + 4 * E)


def test_latent_moe_permutes_at_the_latent_width():
    m = ModelSpec(**{**TINY, "moe_latent_size": 128})
    forward, backward = moe_permute_passes(m, ParallelPlan())
    assert forward - 17 * E == backward - 4 * E == 4 * (K + 1) * 128


def test_training_charges_forward_plus_backward_not_three_forwards():
    # The stage charges elementwise_bytes three times: the routing's share is forward + backward (one pass
    # each, about 2x forward), and with `moe` recomputed forward twice + backward.
    # TINY gives no router_aux_loss_coef, so it trains the auxiliary loss: its eager forward (38E, the default
    # plan runs the router unfused) and backward (28E), docs/formulas.md#moe.aux_loss_bytes; the eager router
    # 37E forward, 4E backward (test_eager_router_counts_both_out_of_place_scatters)
    m = ModelSpec(**TINY)
    forward = 37 * E + 38 * E + 17 * E + 4 * (K + 1) * H
    backward = 4 * E + 28 * E + 4 * E + 4 * (K + 1) * H
    base = ParallelPlan(seq_len=1024, micro_batch=2)
    assert 3 * moe_routing_train_bytes(m, base) == pytest.approx(forward + backward)
    assert 3 * moe_routing_train_bytes(m, base) < 2.1 * forward
    fused = base.model_copy(update={"moe_router_fusion": True})  # the fused router (13E each way) and loss (18E)
    assert 3 * moe_routing_train_bytes(m, fused) == pytest.approx(
        forward - (37 - 13 + 38 - 18) * E + backward + (13 - 4) * E)
    rerun = ParallelPlan(seq_len=1024, micro_batch=2, recompute="selective", recompute_modules=("moe",))
    assert 3 * moe_routing_train_bytes(m, rerun) == pytest.approx(2 * forward + backward)


def test_moe_recompute_adds_the_routing_forward_once_in_elementwise_bytes():
    m = ModelSpec(**TINY)
    T = 1024 * 2
    base = ParallelPlan(seq_len=1024, micro_batch=2, recompute="selective", recompute_modules=("core_attn",))
    rerun = base.model_copy(update={"recompute_modules": ("core_attn", "moe")})
    forward = 37 * E + 38 * E + 17 * E + 4 * (K + 1) * H  # the eager router 37E, the unfused aux loss's 38E
    added = elementwise_bytes(m, rerun, True) - elementwise_bytes(m, base, True)
    assert added - moe_recompute_bytes(m, rerun) == pytest.approx(T * forward / 3)


def test_serving_keeps_its_forward_only_price():
    # serving's step (cost.serve_step) reads moe_routing_bytes, unchanged: 8E + 8kh
    assert moe_routing_bytes(ModelSpec(**TINY)) == 8 * E + 8 * K * H
