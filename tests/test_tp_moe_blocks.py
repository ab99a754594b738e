"""The TP collectives of a MoE layer under Megatron-Core with expert TP 1 (docs/formulas.md#comm.tp): the routed
experts take the rank's sequence shard straight to the EP dispatch, whose TP group is the expert TP group
(NVIDIA/Megatron-LM d98e8a6 megatron/core/transformer/moe/token_dispatcher.py: MoETokenDispatcher.tp_group =
pg_collection.expt_tp), and the router and latent projections run duplicated on that shard (moe_layer.py,
parallel_mode "duplicated"); only a shared expert is a column- and a row-parallel linear over TP
(moe/shared_experts.py)."""

from __future__ import annotations

import pytest

from llmplan.cost.comm import tp_blocks_per_layer, tp_transfers
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models

M = builtin_models()


def _bytes(m, plan) -> float:
    return sum(float(t.calls) * float(t.message) for t in tp_transfers(m, plan, None))


def _plan(etp: int) -> ParallelPlan:
    return ParallelPlan(tp=2, sp=True, ep=8, etp=etp, global_batch=64, seq_len=4096)


def test_moe_without_shared_expert_sends_only_its_attention_half_at_expert_tp_1():
    # Qwen3-235B-A22B: every layer attention + 128 routed experts, no shared expert. At expert TP 1 its TP
    # traffic is the attention block's alone: half of what the same layer sends at expert TP = TP.
    m = M["qwen3-235b-a22b"]
    assert m.shared_ffn == 0
    assert tp_blocks_per_layer(m, _plan(1)) == pytest.approx(0.5)
    assert tp_blocks_per_layer(m, _plan(2)) == pytest.approx(1.0)
    # bytes per layer in s·b·h: attention 3 gathers + 2 reduce-scatters in bf16, 10; at expert TP 2 the routed
    # experts' alltoall dispatcher adds its pair (tests/test_tp_routed_etp.py): balanced, each rank's k = 8 copies
    # of its s·b/2 tokens from 2 ranks, 8 rows a token, gathered in bf16 with a 4-byte probability, reduce-scattered
    # in fp32, each reversed in backward: 2 x 8 x (2 + 4 / 4,096 + 4) = 96.015625
    assert m.num_experts_per_tok == 8 and m.hidden_size == 4096
    one, two = (_plan(e).model_copy(update={"moe_routing": "contiguous"}) for e in (1, 2))
    assert _bytes(m, one) == pytest.approx(_bytes(m, two) * 10 / (10 + 96.015625))


@pytest.mark.parametrize("name, blocks", [("deepseek-v3", 1.0), ("nemotron-3-super", 0.5)])
def test_a_shared_expert_keeps_its_pair(name, blocks):
    # DeepSeek-V3's MoE layers and Nemotron-3 Super's latent-MoE blocks hold a shared expert: its fc1 gathers
    # the shard and its fc2 reduce-scatters, as a dense MLP (Super: one sub-block a layer, Megatron's E).
    m = M[name]
    assert m.shared_ffn > 0
    assert tp_blocks_per_layer(m, _plan(1)) == pytest.approx(blocks)
    # at expert TP 2 the routed experts' dispatcher gathers and reduce-scatters besides (Megatron-LM d98e8a6
    # token_dispatcher.py; the shared expert keeps its own linears' pair): one pair more per MoE layer
    routed = m.num_moe_layers / m.num_hidden_layers / 2
    assert tp_blocks_per_layer(m, _plan(2)) == pytest.approx(blocks + routed)
    assert _bytes(m, _plan(2)) > _bytes(m, _plan(1))
