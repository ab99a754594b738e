"""The routed experts' TP pair under expert TP > 1 (docs/formulas.md#comm.tp, #comm.etp_pair): Megatron-Core's
alltoall token dispatcher gathers the rows its EP all-to-all received (each rank's s·b/t tokens' k routed copies)
over the expert-TP group with gather_from_sequence_parallel_region, with their routing probabilities, and
reduce-scatters the experts' outputs cast to the probabilities' dtype (hidden_states.to(self.probs.dtype): fp32
under moe_router_dtype fp32) with reduce_scatter_to_sequence_parallel_region; plain torch.distributed
collectives (no Transformer Engine quantizer), and the grouped linear keeps its gathered input for the weight
gradients (no backward re-gather). Each backward is the reverse collective in the same dtype. The flex
dispatcher (DeepEP, HybridEP) runs no TP collective (it dispatches over the TP x EP group). Source:
NVIDIA/Megatron-LM d98e8a6 megatron/core/transformer/moe/token_dispatcher.py (MoEAlltoAllTokenDispatcher:
dispatch_postprocess ~741-751, combine_preprocess ~824-833; MoEFlexTokenDispatcher ~1809: group tp_ep_group),
megatron/core/tensor_parallel/mappings.py (_GatherFromSequenceParallelRegion.backward reduce-scatters,
_ReduceScatterToSequenceParallelRegion.backward all-gathers).

The byte counts are by hand, per layer in units of s·b·h: the attention pair under Transformer Engine gathers its
input forward (one copy), the output gradient backward (MXFP8: two copies, rowwise and columnwise) and re-gathers
the input for wgrad (one copy: columnwise); an MXFP8 copy is 1 byte plus an E8M0 scale per 32 elements (OCP
Microscaling spec). The routed pair at qwen3-30b-a3b's top-8, h 2,048, TP 2 = expert TP 2, contiguous (balanced)
routing: the gathered buffer is 2 x (s·b/2 x 8) = 8 rows per token of the sequence. All-gathers: forward tokens
8 x 2 bytes, their probabilities 8 x 4 / 2,048, the backward's output gradient 8 x 4 (fp32): 48.015625.
Reduce-scatters: forward output 8 x 4, backward tokens 8 x 2 and probabilities 8 x 4 / 2,048: 48.015625."""

from __future__ import annotations

import pytest

from llmplan.cost.comm import ep_transfers, routed_pair_transfers, tp_role_bytes, tp_routed_blocks_per_layer, tp_transfers
from llmplan.estimate import estimate_training
from llmplan.search.evaluate import evaluate
from llmplan.search.grid import from_plan
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M = builtin_models()["qwen3-30b-a3b"]  # 48 layers, hidden 2048, every layer MoE, no shared expert
MB = 8  # micro-batches a step (global batch 8, dp 1, micro-batch 1)


def _plan(etp: int, tp: int = 2, **kw) -> ParallelPlan:
    kw.setdefault("moe_routing", "contiguous")  # every EP rank gets the mean rows (routing_imbalance 1)
    return ParallelPlan(tp=tp, sp=True, ep=8, etp=etp, global_batch=MB, seq_len=4096, recompute="none", **kw)


ROUTED = 8 * (2 + 4 / 2048 + 4)  # the routed pair's all-gathers a layer (module docstring), = its reduce-scatters


def _per_layer(plan: ParallelPlan, collective: str) -> float:
    sbh = plan.seq_len * plan.micro_batch * M.hidden_size
    total = sum(float(t.calls) * float(t.message) for t in tp_transfers(M, plan, None) if t.collective == collective)
    return total / sbh / MB / M.num_hidden_layers


def test_routed_pair_moves_the_routed_copies_without_re_gather():
    assert M.num_hidden_layers == 48 and M.shared_ffn == 0 and M.num_moe_layers == 48
    assert M.num_experts_per_tok == 8 and M.hidden_size == 2048
    # bf16: attention 3 gathers x 2 bytes; routed 48.015625 (no re-gather)
    assert ROUTED == pytest.approx(48.015625)
    assert _per_layer(_plan(2), "all-gather") == pytest.approx(6 + ROUTED)
    # reduce-scatters: attention 2 x 2 bytes; routed 48.015625
    assert _per_layer(_plan(2), "reduce-scatter") == pytest.approx(4 + ROUTED)


def test_routed_pair_gathers_expert_tp_ranks_of_the_tp_shard():
    # TP 4, expert TP 2: each rank holds s·b/4 tokens, the gather brings 2 ranks' 8 copies: 4 rows a token
    assert _per_layer(_plan(2, tp=4), "all-gather") == pytest.approx(6 + ROUTED / 2)
    assert _per_layer(_plan(2, tp=4), "reduce-scatter") == pytest.approx(4 + ROUTED / 2)


@pytest.mark.parametrize("backend", ["deepep", "hybridep"])
def test_flex_dispatcher_has_no_routed_pair(backend):
    # MoEFlexTokenDispatcher dispatches over the TP x EP group: no gather over expert TP
    plan = _plan(2, moe_dispatcher="deepep", moe_flex_backend=backend)
    assert tp_routed_blocks_per_layer(M, plan) == 0
    assert _per_layer(plan, "all-gather") == pytest.approx(6)
    assert _per_layer(plan, "reduce-scatter") == pytest.approx(4)


def test_routed_pair_stays_bf16_under_mxfp8():
    one = 1 + 1 / 32
    # attention: forward 1 copy + output gradient 2 copies + re-gather 1 copy; routed as in bf16
    assert _per_layer(_plan(2, dtype="fp8", recipe="mxfp8"), "all-gather") == pytest.approx(4 * one + ROUTED)


@pytest.mark.parametrize("dispatcher", ["alltoall", "deepep"])
def test_expert_tp_1_has_no_routed_pair(dispatcher):
    # property: expert TP 1 sends no expert-TP bytes under any dispatcher
    assert tp_routed_blocks_per_layer(M, _plan(1, moe_dispatcher=dispatcher)) == 0
    routed = routed_pair_transfers(M, _plan(1), None, 0, 0.0)
    assert sum(float(t.calls) * float(t.message) for t in routed) == 0
    assert _per_layer(_plan(1, dtype="fp8", recipe="mxfp8"), "all-gather") == pytest.approx(4 * (1 + 1 / 32))


def test_roles_split_the_routed_pair_as_transfers_do():
    # tp_role_bytes: per two pairs (a transformer layer's), the pair kinds averaged; qwen3-30b-a3b's layer is
    # one attention pair and one routed pair, half each
    plan = _plan(2, dtype="fp8", recipe="mxfp8")
    ring, fwd_rs, re_gather, bwd_rs = (float(x) for x in tp_role_bytes(M, plan, 0.0))
    one = 1 + 1 / 32
    # two TE pairs' ring gathers: 2 forward copies + the 2 output gradients' rowwise copies; two routed pairs':
    # 2 x 48.015625 (every routed gather is on the ring)
    assert ring == pytest.approx(0.5 * 4 * one + 0.5 * 2 * ROUTED)
    # the re-gathers and the output gradients' columnwise copies (TE's bulk all-gather beside the dgrad GEMM):
    # only the attention half
    assert re_gather == pytest.approx(0.5 * (2 + 2) * one)
    # forward reduce-scatters: attention 2 x 2 bytes, routed 2 x 8 x 4 (fp32); backward: 2 x 2, 2 x 8 x (2 + 4/2048)
    assert fwd_rs == pytest.approx(0.5 * 4 + 0.5 * 64)
    assert bwd_rs == pytest.approx(0.5 * 4 + 0.5 * 16 * (2 + 4 / 2048))
    assert ring + re_gather == pytest.approx(_per_layer(plan, "all-gather"))
    assert fwd_rs + bwd_rs == pytest.approx(_per_layer(plan, "reduce-scatter"))


@pytest.mark.parametrize("etp, dtype, recipe, dispatcher", [(2, "fp8", "mxfp8", "alltoall"),
                                                             (2, "bf16", "tensorwise", "alltoall"),
                                                             (1, "fp8", "mxfp8", "alltoall"),
                                                             (2, "bf16", "tensorwise", "deepep")])
def test_vectorised_agrees_with_scalar(etp, dtype, recipe, dispatcher):
    # search.evaluate prices tp_transfers with array fields (its axis names for groups): the routed pair's
    # share must come out as the scalar estimate's
    cluster = ClusterSpec(system=builtin_systems()["dgx-b200"], num_nodes=2)
    plan = ParallelPlan(tp=2, sp=True, ep=8, etp=etp, dp=8, global_batch=64, seq_len=4096, recompute="none",
                        dtype=dtype, recipe=recipe, moe_dispatcher=dispatcher)
    assert not check_plan(M, plan, cluster)
    scalar = estimate_training(M, cluster, plan)
    vec = evaluate(M, cluster, from_plan(plan))
    assert float(vec.step.total[0]) == pytest.approx(float(scalar.time.total), rel=1e-9)
    assert float(vec.step.comm_exposed[0]) == pytest.approx(float(scalar.time.comm_exposed), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("etp", [1, 2])
def test_flex_dispatch_sends_a_row_to_each_expert_tp_rank(etp):
    # MoEFlexTokenDispatcher expands the routing map over the expert-TP ranks (group tp_ep_group): a token goes to
    # every one of the etp ranks of each EP rank it reaches, and each combine returns their etp partial outputs.
    # Contiguous routing gives token i the experts 8i .. 8i + 7, all on one EP rank (128 / 8 = 16 experts a
    # rank): one destination rank a token; the rank holds s·b / t = 4,096 / 2 tokens (SP)
    plan = _plan(etp, moe_dispatcher="deepep")
    (a2a,) = [t for t in ep_transfers(M, plan, None) if t.collective == "all-to-all"]
    assert float(a2a.message) == pytest.approx(2 * (4096 / 2) * 1 * 2048 * etp)
