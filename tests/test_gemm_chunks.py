"""Chunked TP-overlap GEMMs on Transformer Engine's concurrent compute streams (docs/formulas.md#compute.gemm_chunks):
userbuffers launch chunk i on stream i % min(3, chunks) (NVIDIA/TransformerEngine v2.8
common/comm_gemm_overlap/comm_gemm_overlap.cpp: CommOverlapCore::initialize, CommOverlapBase::split_overlap_rs,
CommOverlapP2PBase::split_overlap_ag / split_overlap_rs; v1.8 pytorch/csrc/comm_gemm_overlap.h likewise), so a
chunk's first wave fills the previous chunk's last one: the chunks pay one GEMM's wave quantisation."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.gemm import chunk_rows, chunked_gemm_efficiency, gemm_shape_efficiency
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_systems

S = builtin_systems()
GPUS = [S["dgx-a100"].gpu, S["dgx-h100"].gpu]
TE = ParallelPlan(tp=8, sp=True, tp_comm_overlap=True)
DT = ParallelPlan(tp=8, sp=True, tp_comm_overlap=True, tp_impl="dtensor")


@settings(max_examples=80, deadline=None, derandomize=True)
@given(g=st.sampled_from(GPUS), tokens=st.integers(1, 64).map(lambda x: 256 * x), n=st.integers(1, 400),
       k=st.integers(1, 200), tp=st.sampled_from([2, 4, 8]), role=st.sampled_from(["ag", "rs"]))
def test_overlapped_chunks_never_cost_more_than_the_same_chunks_serialized(g, tokens, n, k, tp, role):
    # Chunks on concurrent streams share the SMs: their time is at most the chunks' one after another, and at
    # least the whole GEMM's when the chunk rows fill whole tiles (they then pay exactly the whole GEMM's waves).
    plan = ParallelPlan(tp=tp, sp=True, tp_comm_overlap=True)
    N, K = 64.0 * n, 64.0 * k
    rows = chunk_rows(plan, float(tokens), role)[0]
    pooled = float(chunked_gemm_efficiency(g, "bf16", plan, float(tokens), rows, N, K))
    serial = float(gemm_shape_efficiency(g, "bf16", rows, N, K))
    assert pooled >= serial * (1 - 1e-12)
    if float(rows) % 128 == 0:
        assert abs(pooled / float(gemm_shape_efficiency(g, "bf16", float(tokens), N, K)) - 1) < 1e-9


def test_megascale_530b_qkv_chunks_run_at_the_whole_gemms_rate():
    # MegaScale's 530B (h 20,480) at TP8 on A100 (108 SMs), 2,048 tokens: each 256-row ring-exchange chunk of the
    # QKV projection has 2 x 60 = 120 tiles, 1.11 waves alone (0.56 of the SMs busy); the 8 chunks together
    # have 960 tiles, 8.9 waves (0.99 busy). PyTorch's async TP runs its pieces in turn on one stream.
    a100 = S["dgx-a100"].gpu
    rows = chunk_rows(TE, 2048.0, "ag")[0]
    pooled = float(chunked_gemm_efficiency(a100, "bf16", TE, 2048.0, rows, 7680.0, 20480.0))
    alone = float(gemm_shape_efficiency(a100, "bf16", rows, 7680.0, 20480.0))
    assert abs(alone / pooled - 120 / 216 / (960 / 972)) < 1e-9
    assert float(chunked_gemm_efficiency(a100, "bf16", DT, 2048.0, rows, 7680.0, 20480.0)) == alone
