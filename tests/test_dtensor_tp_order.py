"""DTensor TP as torchtitan 9dec370 ran it on torch 1963fc8 (docs/formulas.md#step.tp): each TransformerBlock
compiled as its own graph with Inductor's reorder_for_compute_comm_overlap off, so without async TP every
collective is waited where its result is used; async TP (micro_pipeline_tp) fuses a reduce-scatter only with
the matmul producing its input, which leaves the backward's two input-gradient reduce-scatters (the sums over
wq / wk / wv and over w1 / w3) unfused and exposed."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.comm import symm_mem_tp_seconds, tp_transfers, tp_unfused_rs_share
from llmplan.cost.compute import StageCompute
from llmplan.cost.exposure import tp_exposed
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M = builtin_models()


def _stage(gemm: float) -> StageCompute:
    return StageCompute(gemm=gemm, attention=0.0, memory_bound=0.0, forward=gemm / 3)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(t=st.sampled_from([2, 4, 8]), tp=st.floats(1e-4, 1.0), gemm=st.floats(1e-4, 100.0),
       kappa=st.floats(0.0, 0.5), r=st.sampled_from([0.0, 1.0]))
def test_dtensor_without_async_tp_hides_nothing(t, tp, gemm, kappa, r):
    plan = ParallelPlan(tp=t, sp=True, tp_impl="dtensor", global_batch=8, seq_len=4096)
    assert float(tp_exposed(plan, tp, _stage(gemm), kappa, r)) == pytest.approx(tp)
    # Megatron-LM's asynchronous backward collectives still hide behind a long weight-gradient window
    megatron = plan.model_copy(update={"tp_impl": "megatron"})
    assert float(tp_exposed(megatron, tp, _stage(1e3), 0.0, r)) < tp


@pytest.mark.parametrize("dtype, r", [("bf16", 0.0), ("bf16", 1.0), ("fp8", 1.0)])
def test_unfused_share_is_two_reduce_scatters_of_the_transfers(dtype, r):
    # by bytes, of what tp_transfers lists: 2 of the 4 + 2r reduce-scatters of a layer-pass
    m = M["llama-3.1-70b"]
    plan = ParallelPlan(tp=8, sp=True, tp_impl="dtensor", recompute="full" if r else "none", global_batch=16,
                        seq_len=8192, dtype=dtype)
    moved = {t.collective: 0.0 for t in tp_transfers(m, plan, None)}
    for t in tp_transfers(m, plan, None):
        moved[t.collective] += float(t.calls) * float(t.message)
    unfused = moved["reduce-scatter"] * 2 / (4 + 2 * r)
    assert float(tp_unfused_rs_share(m, plan, r)) == pytest.approx(unfused / sum(moved.values()))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(t=st.sampled_from([2, 4, 8]), tp=st.floats(1e-4, 1.0), u=st.floats(0.0, 0.5))
def test_async_tp_exposes_the_unfused_share_and_one_chunk_of_the_rest(t, tp, u):
    plan = ParallelPlan(tp=t, sp=True, tp_impl="dtensor", tp_comm_overlap=True, global_batch=8, seq_len=4096)
    got = float(tp_exposed(plan, tp, _stage(1e3), 0.0, 0.0, 0.0, u))
    assert got == pytest.approx(tp * u + tp * (1 - u) / t)


def test_torchtitan_70b_2d_without_async_tp(acc, published_runs):
    # pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Table 4: Llama 3.1 70B, FSDP 32 x TP 8,
    # torch.compile + Float8, full AC, local batch 16: 829 tokens/s per GPU without AsyncTP. Within 7.5%, the
    # tolerance of the compiled 8B rows (test_ranking); +8.4% on main (aabe343), where 4 of its 12 collectives
    # a layer hid behind the weight-gradient matmuls.
    rid = "torchtitan-2412-t4-llama31-70b-256gpu-2d"
    rec = published_runs[rid]
    (quantity, pred, measured), _ = acc.predict(rec, "torchtitan")
    assert quantity == "tok/s/GPU" and measured == 829
    assert pred == pytest.approx(measured, rel=0.075)


@pytest.mark.parametrize("r", [0.0, 1.0])
def test_symmetric_memory_reduce_reads_every_partial(r):
    # _fused_matmul_reduce_scatter_impl sums the tp stacked partials of the whole M x N output (16-bit) after
    # the last chunk, writing its 1/tp share; _pipelined_all_gather_and_consume copies the local shard into the
    # gathered buffer on the current stream. Only DTensor async TP runs them.
    m, gpu = M["llama-3.1-70b"], builtin_systems()["hgx-h100-96gb"].gpu
    plan = ParallelPlan(tp=8, sp=True, tp_impl="dtensor", tp_comm_overlap=True, global_batch=16,
                        micro_batch=16, seq_len=8192, recompute="full" if r else "none")
    sbh = 8192 * 16 * m.hidden_size
    reduce = 2 * (1 + r) * 2 * sbh * (1 + 1 / 8)  # wo and w2, forward (and recompute) passes
    local = 2 * (2 + r) * 2 * 2 * sbh / 8  # bf16 gathers: forward, recompute, backward
    got = float(symm_mem_tp_seconds(m, plan, gpu, 1, r))
    assert got == pytest.approx((reduce + local) / gpu.hbm_achieved_bytes_per_s)
    for off in ({"tp_comm_overlap": False}, {"tp_impl": "megatron"}, {"sp": False}):
        assert float(symm_mem_tp_seconds(m, plan.model_copy(update=off), gpu, 1, r)) == 0.0


@pytest.mark.parametrize("r", [0.0, 1.0])
def test_symmetric_memory_passes_follow_the_tp_pairs_of_a_parallel_block(r):
    # A parallel transformer block (MegaScale, Jiang et al. 2024 §3.1) feeds attention and MLP one gathered
    # input and reduce-scatters their summed outputs once: one fused reduce-scatter and one fused gather a
    # layer and pass, where the sequential block has two (wo, w2). The copies and sums follow the TP pairs
    # that tp_transfers moves: half the sequential block's, and as many as its reduce-scatters.
    seq, gpu = M["llama-3.1-70b"], builtin_systems()["hgx-h100-96gb"].gpu
    par = seq.model_copy(update={"parallel_block": True})
    plan = ParallelPlan(tp=8, sp=True, tp_impl="dtensor", tp_comm_overlap=True, global_batch=16,
                        micro_batch=16, seq_len=8192, recompute="full" if r else "none")
    sbh = 8192 * 16 * seq.hidden_size
    reduce = 1 * (1 + r) * 2 * sbh * (1 + 1 / 8)  # one summed output a layer: forward (and recompute)
    local = 1 * (2 + r) * 2 * 2 * sbh / 8  # one bf16 gathered input a layer: forward, recompute, backward
    got = float(symm_mem_tp_seconds(par, plan, gpu, 1, r))
    assert got == pytest.approx((reduce + local) / gpu.hbm_achieved_bytes_per_s)
    assert got == pytest.approx(float(symm_mem_tp_seconds(seq, plan, gpu, 1, r)) / 2)
    rs = {m.parallel_block: sum(x.calls for x in tp_transfers(m, plan, 8) if x.collective == "reduce-scatter")
          for m in (seq, par)}
    assert rs[True] == pytest.approx(rs[False] / 2)


def test_torchtitan_async_tp_gain(acc, published_runs):
    # Table 4 (benchmarks/llama3_h100_202412_torchtitan.md): 2D 829 -> 2D + AsyncTP 876 tokens/s per GPU, a
    # gain of 1.057. Predicted within 0.05 of it (1.116 when every DTensor collective was decomposed and 4 of
    # 12 hid without async TP; 1.146 with the unfused reduce-scatters alone).
    t = "torchtitan-2412-t4-llama31-70b-256gpu-2d"
    (_, sync, m_sync), _ = acc.predict(published_runs[t], "torchtitan")
    (_, asy, m_asy), _ = acc.predict(published_runs[t + "-asynctp"], "torchtitan")
    assert m_asy / m_sync == pytest.approx(876 / 829)
    assert asy / sync == pytest.approx(m_asy / m_sync, abs=0.05)
