"""Transfer-bound userbuffers chunk steps (docs/formulas.md#step.tp_chunk_steps): Transformer Engine's ring
exchange sends its t - 1 steps one after another and starts chunk i + 1's GEMM only after step i's receive
(NVIDIA/TransformerEngine v1.8 pytorch/csrc/comm_gemm_overlap.h, UbufP2PCommOverlap::split_overlap_ag); the
pipeline reduce-scatters each chunk after its GEMM on one communication stream (split_overlap_rs). Where a
step's transfer outlasts its GEMM chunk the GEMMs wait; comm.tp_chunk_step_waits prices that beyond the GEMMs.
The checks compare it with an event-by-event timeline of the chunks built here, step by step."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.comm import ACT_BYTES, gather_bytes, tp_blocks_per_layer, tp_chunk_step_waits
from llmplan.cost.flops import layer_flops
from llmplan.cost.params import attention_params, mlp_params
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models


def ring_finish(g: float, c: float, t: int) -> float:
    """A ring all-gather beside a GEMM of g seconds in t chunks, its t - 1 steps c seconds each, simulated:
    the SMs run one chunk at a time in order; chunk i > 0 starts once step i - 1's receive is done."""
    recv, end = 0.0, 0.0
    for i in range(t):
        if i > 0:
            recv += c  # step i - 1's send follows step i - 2's receive
        end = max(end, recv if i > 0 else 0.0) + g / t
    return end


def pipe_finish(g: float, c: float, n: int) -> float:
    """A GEMM of g seconds in n chunks, each chunk's reduce-scatter (c / n seconds) after its GEMM and after the
    previous chunk's reduce-scatter, simulated."""
    gemm_end, rs_end = 0.0, 0.0
    for _ in range(n):
        gemm_end += g / n
        rs_end = max(rs_end, gemm_end) + c / n
    return rs_end


@settings(max_examples=60, deadline=None, derandomize=True)
@given(tp=st.sampled_from([2, 4, 8]), gemm=st.floats(1e-4, 1e-1), tp_s=st.floats(1e-5, 1e-1),
       name=st.sampled_from(["llama-3.1-70b", "llama-2-7b"]))
def test_waits_match_a_timeline_of_the_chunk_steps(tp, gemm, tp_s, name):
    m = builtin_models()[name]
    plan = ParallelPlan(tp=tp, sp=True, tp_comm_overlap=True, seq_len=4096)
    r = 0.0
    # one TP pair's collectives (3 all-gathers and 2 reduce-scatters a pass set, tp_transfers) by bytes
    q, a = float(gather_bytes(m, plan)), ACT_BYTES
    per_pair = tp_s / (2 * float(tp_blocks_per_layer(m, plan))) / (3 * q + 2 * a)
    gather, scatter = q * per_pair, a * per_pair
    weights = float(layer_flops(m, plan, False).gemm) * tp / (2 * plan.seq_len * plan.micro_batch)
    ad, h, f = m.num_attention_heads * m.d_head, m.hidden_size, m.intermediate_size
    per_w = gemm / 3 / weights
    qkv, proj = (attention_params(m) - ad * h) * per_w, ad * h * per_w
    fc1, fc2 = (mlp_params(m, f) - f * h) * per_w, f * h * per_w
    want = 0.0
    for g in (qkv, fc1, proj, fc2):  # forward of the column GEMMs, input gradients of the row ones
        want += ring_finish(g, gather / (tp - 1), tp) - g
    for g in (proj, fc2):  # forward reduce-scatters: beyond the GEMM and the last chunk's (tp_exposed's waits)
        want += pipe_finish(g, scatter, 4) - g - scatter / 4
    got = float(tp_chunk_step_waits(m, plan, tp_s, gemm, r))
    assert abs(got - want) <= 1e-9 + 1e-6 * want


def test_no_waits_without_userbuffers_or_when_the_gemms_are_long():
    m = builtin_models()["llama-3.1-70b"]
    off = ParallelPlan(tp=8, sp=True, tp_comm_overlap=False)
    on = ParallelPlan(tp=8, sp=True, tp_comm_overlap=True)
    assert float(tp_chunk_step_waits(m, off, 1e-2, 1e-3, 0.0)) == 0.0
    assert float(tp_chunk_step_waits(m, on, 1e-3, 1.0, 0.0)) == 0.0
    assert float(tp_chunk_step_waits(m, on, 1e-2, 1e-3, 0.0)) > 0.0


def hybrid_timeline_waits(m, plan, tp_s: float, gemm: float) -> tuple[float, float]:
    """(waits of the attention and dense-MLP pairs, waits of the Mamba-2 pairs) of the average layer from the
    chunk timelines above: a Mamba-2 mixer's in_proj (h x 2·d_inner + 2·G·N + H) gathers before its chunks and
    its out_proj (d_inner x h) reduce-scatters after them, TE's fc1 / fc2 userbuffers (Megatron-LM
    megatron/core/ssm/mamba_mixer.py, tp_comm_buffer_name "fc1" / "fc2"); each pair's collectives are one
    pair's share of the layer's TP seconds, as in the dense test."""
    tp, L = plan.tp, m.num_hidden_layers
    q, a = float(gather_bytes(m, plan)), ACT_BYTES
    per_pair = tp_s / (2 * float(tp_blocks_per_layer(m, plan))) / (3 * q + 2 * a)
    gather, scatter = q * per_pair, a * per_pair
    per_w = gemm / 3 / (float(layer_flops(m, plan, False).gemm) * tp / (2 * plan.seq_len * plan.micro_batch))
    h, f, ad = m.hidden_size, m.intermediate_size, m.num_attention_heads * m.d_head
    d_in = m.mamba_num_heads * m.mamba_head_dim
    in_proj = h * (2 * d_in + 2 * m.n_groups * m.ssm_state_size + m.mamba_num_heads)
    pairs = {"attention": (m.count_layers("full_attention") / L, attention_params(m) - ad * h, ad * h),
             "mlp": (m.num_mlp_layers / L, mlp_params(m, f) - f * h, f * h),
             "mamba": (m.count_layers("mamba") / L, in_proj, d_in * h)}
    waits = {}
    for kind, (share, col, row) in pairs.items():
        w = 0.0
        for g in (col * per_w, row * per_w):  # forward of the column GEMM, input gradient of the row one
            w += ring_finish(g, gather / (tp - 1), tp) - g
        w += pipe_finish(row * per_w, scatter, 4) - row * per_w - scatter / 4
        waits[kind] = share * w
    return waits["attention"] + waits["mlp"], waits["mamba"]


@settings(max_examples=40, deadline=None, derandomize=True)
@given(tp=st.sampled_from([2, 4, 8]), gemm=st.floats(1e-4, 1e-1), tp_s=st.floats(1e-5, 1e-1),
       name=st.sampled_from(["nemotron-h-8b", "nemotron-h-56b"]))
def test_hybrid_waits_match_a_timeline_with_the_mamba_pairs(tp, gemm, tp_s, name):
    m = builtin_models()[name]
    plan = ParallelPlan(tp=tp, sp=True, tp_comm_overlap=True, seq_len=8192)
    others, mamba = hybrid_timeline_waits(m, plan, tp_s, gemm)
    got = float(tp_chunk_step_waits(m, plan, tp_s, gemm, 0.0))
    assert abs(got - (others + mamba)) <= 1e-9 + 1e-6 * (others + mamba)


def test_nemotron_h_mamba_pairs_wait_where_their_chunks_are_short():
    # Nemotron-H 8B at TP4: collectives of 1 ms a layer beside 0.2 ms of GEMMs leave every chunk step
    # transfer-bound; the Mamba-2 mixers' in_proj / out_proj (24 of its 52 layers) wait as an MLP's fc1 / fc2.
    m = builtin_models()["nemotron-h-8b"]
    plan = ParallelPlan(tp=4, sp=True, tp_comm_overlap=True, seq_len=8192)
    others, mamba = hybrid_timeline_waits(m, plan, 1e-3, 2e-4)
    got = float(tp_chunk_step_waits(m, plan, 1e-3, 2e-4, 0.0))
    assert mamba > 0.2 * others > 0.0
    assert got == pytest.approx(others + mamba, rel=1e-6)
