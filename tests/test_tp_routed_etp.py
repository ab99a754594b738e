"""The routed experts' TP pair under expert TP > 1 (docs/formulas.md#comm.tp): Megatron-Core's alltoall token
dispatcher gathers the dispatched tokens over the expert-TP group with gather_from_sequence_parallel_region and
reduce-scatters the experts' outputs with reduce_scatter_to_sequence_parallel_region, plain torch.distributed
collectives of the bf16 hidden states (no Transformer Engine quantizer), and the grouped linear keeps its
gathered input for the weight gradients (no backward re-gather). Source: NVIDIA/Megatron-LM d98e8a6
megatron/core/transformer/moe/token_dispatcher.py (MoEAlltoAllTokenDispatcher: dispatch_postprocess ~746,
combine_preprocess ~829), megatron/core/tensor_parallel/mappings.py (_GatherFromSequenceParallelRegion.backward
reduce-scatters, _ReduceScatterToSequenceParallelRegion.backward all-gathers).

The byte counts are by hand, per layer in units of s·b·h: the attention pair under Transformer Engine gathers its
input forward (one copy), the output gradient backward (MXFP8: two copies, rowwise and columnwise) and re-gathers
the input for wgrad (one copy: columnwise); an MXFP8 copy is 1 byte plus an E8M0 scale per 32 elements (OCP
Microscaling spec). The routed pair gathers 2 bf16 tensors (forward tokens, backward output gradient), 2 bytes."""

from __future__ import annotations

import pytest

from llmplan.cost.comm import tp_role_bytes, tp_routed_blocks_per_layer, tp_transfers
from llmplan.estimate import estimate_training
from llmplan.search.evaluate import evaluate
from llmplan.search.grid import from_plan
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M = builtin_models()["qwen3-30b-a3b"]  # 48 layers, hidden 2048, every layer MoE, no shared expert
MB = 8  # micro-batches a step (global batch 8, dp 1, micro-batch 1)


def _plan(etp: int, **kw) -> ParallelPlan:
    return ParallelPlan(tp=2, sp=True, ep=8, etp=etp, global_batch=MB, seq_len=4096, recompute="none", **kw)


def _per_layer(plan: ParallelPlan, collective: str) -> float:
    sbh = plan.seq_len * plan.micro_batch * M.hidden_size
    total = sum(float(t.calls) * float(t.message) for t in tp_transfers(M, plan, None) if t.collective == collective)
    return total / sbh / MB / M.num_hidden_layers


def test_routed_pair_gathers_bf16_without_re_gather():
    assert M.num_hidden_layers == 48 and M.shared_ffn == 0 and M.num_moe_layers == 48
    # bf16: attention 3 gathers x 2 bytes, routed 2 x 2 (not 3 x 2: no re-gather)
    assert _per_layer(_plan(2), "all-gather") == pytest.approx(6 + 4)
    # reduce-scatters: 2 a pair (forward output, backward input gradient), 2 bytes each
    assert _per_layer(_plan(2), "reduce-scatter") == pytest.approx(4 + 4)


def test_routed_pair_stays_bf16_under_mxfp8():
    one = 1 + 1 / 32
    # attention: forward 1 copy + output gradient 2 copies + re-gather 1 copy; routed: 2 x 2 bytes
    assert _per_layer(_plan(2, dtype="fp8", recipe="mxfp8"), "all-gather") == pytest.approx(4 * one + 4)


def test_expert_tp_1_has_no_routed_pair():
    assert tp_routed_blocks_per_layer(M, _plan(1)) == 0
    assert _per_layer(_plan(1, dtype="fp8", recipe="mxfp8"), "all-gather") == pytest.approx(4 * (1 + 1 / 32))


def test_roles_split_the_routed_pair_as_transfers_do():
    # tp_role_bytes: per two pairs (a transformer layer's), the pair kinds averaged; qwen3-30b-a3b's layer is
    # one attention pair and one routed pair, half each
    plan = _plan(2, dtype="fp8", recipe="mxfp8")
    ring, fwd_rs, re_gather, bwd_rs = (float(x) for x in tp_role_bytes(M, plan, 0.0))
    one = 1 + 1 / 32
    # two TE pairs' ring gathers: 2 forward copies + the 2 output gradients' rowwise copies; two routed pairs':
    # 4 x 2 bytes
    assert ring == pytest.approx(0.5 * 4 * one + 0.5 * 8)
    # the re-gathers and the output gradients' columnwise copies (TE's bulk all-gather beside the dgrad GEMM):
    # only the attention half
    assert re_gather == pytest.approx(0.5 * (2 + 2) * one)
    assert fwd_rs == pytest.approx(4.0) and bwd_rs == pytest.approx(4.0)
    assert ring + re_gather == pytest.approx(_per_layer(plan, "all-gather"))
    assert fwd_rs + bwd_rs == pytest.approx(_per_layer(plan, "reduce-scatter"))


@pytest.mark.parametrize("etp, dtype, recipe", [(2, "fp8", "mxfp8"), (2, "bf16", "tensorwise"), (1, "fp8", "mxfp8")])
def test_vectorised_agrees_with_scalar(etp, dtype, recipe):
    # search.evaluate prices tp_transfers with array fields (its axis names for groups): the routed pair's
    # share must come out as the scalar estimate's
    cluster = ClusterSpec(system=builtin_systems()["dgx-b200"], num_nodes=2)
    plan = ParallelPlan(tp=2, sp=True, ep=8, etp=etp, dp=8, global_batch=64, seq_len=4096, recompute="none",
                        dtype=dtype, recipe=recipe)
    assert not check_plan(M, plan, cluster)
    scalar = estimate_training(M, cluster, plan)
    vec = evaluate(M, cluster, from_plan(plan))
    assert float(vec.step.total[0]) == pytest.approx(float(scalar.time.total), rel=1e-9)
    assert float(vec.step.comm_exposed[0]) == pytest.approx(float(scalar.time.comm_exposed), rel=1e-9, abs=1e-12)
