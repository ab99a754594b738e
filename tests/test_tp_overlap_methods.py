"""Exposed TP time under --tp-comm-overlap as Transformer Engine's userbuffers run it (docs/formulas.md#step.tp):
ring-exchange all-gathers start on the rank's own shard (no chunk waits), the backward collectives overlap in
bulk, and the forward reduce-scatters run pipelined in TE_PIPELINE_SPLITS chunks whose last one follows the
last GEMM chunk (Transformer Engine v2.8 pytorch/module/base.py initialize_ub; common/comm_gemm_overlap/
comm_gemm_overlap.cpp, CommOverlapP2PBase::split_overlap_ag and CommOverlapBase::split_overlap_rs)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.comm import tp_forward_rs_share, tp_transfers
from llmplan.cost.compute import TE_PIPELINE_SPLITS, StageCompute
from llmplan.cost.exposure import tp_exposed
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models

M = builtin_models()


def _stage(gemm: float) -> StageCompute:
    return StageCompute(gemm=gemm, attention=0.0, memory_bound=0.0, forward=gemm / 3)


@pytest.mark.parametrize("dtype, share", [("bf16", 4 / 20), ("fp8", 4 / 14)])
def test_forward_reduce_scatter_share_counts_korthikanti_collectives(dtype, share):
    # Korthikanti et al. 2022 §4.2.2 (Figure 5): with SP a layer runs 2 all-gathers and 2 reduce-scatters in
    # forward, the same in backward, and Megatron-LM gathers the 2 saved input shards again in backward: 6
    # all-gathers, 4 reduce-scatters of one sbh buffer, 2 of them forward. In fp8 (Transformer Engine casts
    # before the gather) the all-gathers move 1 byte an element against the reduce-scatters' 2.
    plan = ParallelPlan(tp=4, sp=True, global_batch=8, seq_len=4096, dtype=dtype)
    assert float(tp_forward_rs_share(M["llama-3.1-70b"], plan, 0.0)) == pytest.approx(share)


def test_share_matches_the_transfers_it_summarises():
    # the share is the forward reduce-scatters' bytes over every TP transfer's bytes that tp_transfers lists
    m = M["llama-3.1-70b"]
    plan = ParallelPlan(tp=8, sp=True, recompute="full", global_batch=16, seq_len=4096, dtype="fp8")
    moved = {t.collective: 0.0 for t in tp_transfers(m, plan, None)}
    for t in tp_transfers(m, plan, None):
        moved[t.collective] += float(t.calls) * float(t.message)
    rs_total = moved["reduce-scatter"]
    forward = rs_total * 4 / 6  # full recompute: 2 + 2 of the 4 + 2 reduce-scatters run in a forward pass
    assert float(tp_forward_rs_share(m, plan, 1.0)) == pytest.approx(forward / sum(moved.values()))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(t=st.sampled_from([2, 4, 8]), tp=st.floats(1e-4, 1.0), share=st.floats(0.05, 0.5))
def test_ring_exchange_exposes_no_first_chunk(t, tp, share):
    # With GEMMs long enough to hide everything and no contention, Megatron-LM + TE exposes only the pipelined
    # reduce-scatters' last chunk, whatever the TP size; DTensor async TP the first of its tp chunks.
    sc = _stage(100.0)
    plan = ParallelPlan(tp=t, sp=True, tp_comm_overlap=True, global_batch=8, seq_len=4096)
    assert float(tp_exposed(plan, tp, sc, 0.0, 0.0, share)) == pytest.approx(tp * share / TE_PIPELINE_SPLITS)
    dtensor = plan.model_copy(update={"tp_impl": "dtensor"})
    assert float(tp_exposed(dtensor, tp, sc, 0.0, 0.0, share)) == pytest.approx(tp / t)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(t=st.sampled_from([2, 4, 8]), tp=st.floats(1e-4, 1.0), gemm=st.floats(1e-4, 1.0),
       kappa=st.floats(0.0, 0.5), r=st.sampled_from([0.0, 1.0]))
def test_overlap_never_exposes_more_than_without_it(t, tp, gemm, kappa, r):
    plan = ParallelPlan(tp=t, sp=True, global_batch=8, seq_len=4096)
    m = M["llama-3.1-70b"]
    share = tp_forward_rs_share(m, plan, r)
    plain = float(tp_exposed(plan, tp, _stage(gemm), kappa, r, share))
    over = float(tp_exposed(plan.model_copy(update={"tp_comm_overlap": True}), tp, _stage(gemm), kappa, r, share))
    assert tp * share / TE_PIPELINE_SPLITS * (1 - 1e-9) <= over <= tp * (1 + kappa) + 1e-12
    assert over <= plain + 1e-12


@settings(max_examples=40, deadline=None, derandomize=True)
@given(t=st.sampled_from([2, 4, 8]), tp=st.floats(1e-4, 1.0), r=st.sampled_from([0.0, 0.5, 1.0]))
def test_sp_without_overlap_hides_only_the_column_parallel_backward_collectives(t, tp, r):
    # Megatron-LM with SP and no --tp-comm-overlap, a layer's 10 + 4r collectives (6 + 2r all-gathers, 4 + 2r
    # reduce-scatters): the column-parallel linears' backward re-gathers their saved input shard beside the
    # input-gradient GEMM and reduce-scatters the input gradient beside the weight-gradient GEMM, both
    # asynchronous (megatron/core/tensor_parallel/layers.py LinearWithGradAccumulationAndAsyncCommunication;
    # Transformer Engine _Linear.backward, async_op=True): 4 can hide. The row-parallel linears' output
    # gradient is all-gathered synchronously before its input-gradient GEMM (mappings.py
    # _ReduceScatterToSequenceParallelRegion.backward at NVIDIA/Megatron-LM d98e8a6; TE module/base.py
    # grad_output_preprocess, gather_along_first_dim without async_op at NVIDIA/TransformerEngine d0067d0): with
    # the forward and recompute ones, 6 + 4r stay exposed however long the GEMMs. Fails at 6 hidden (2 + 4r).
    plan = ParallelPlan(tp=t, sp=True, global_batch=8, seq_len=4096)
    exposed = float(tp_exposed(plan, tp, _stage(100.0), 0.0, r, 0.0))
    assert exposed == pytest.approx(tp * (6 + 4 * r) / (10 + 4 * r))
