"""Megatron-Core builds the DDP of every pipeline stage after the first unbucketed, and without interleaving the
first forward pre-hook dispatches that stage's one weight gather after the stage received its input: each later
stage's whole gather waits on the 1F1B warm-up's chain (docs/formulas.md#step.dp_later_stages).
NVIDIA/Megatron-LM d98e8a64dd: distributed_data_parallel.py __init__ ("if disable_bucketing or pp_rank > 0:
self.bucket_size = None"); param_and_grad_buffer.py finish_param_sync ("If current bucket's param AG has not been
dispatched, dispatch it now"); training/arguments.py (align_param_gather = False without interleaving);
pipeline_parallel/schedules.py forward_backward_pipelining_without_interleaving (recv_forward, then
forward_step). Interleaved, align_param_gather dispatches chunks 0 and 1 at the schedule's start on every stage,
so the warm-up hides them (benchmarks/later_stage_buckets.py: no interleaved record's tail moves)."""

from __future__ import annotations

import pytest

from llmplan.cost.comm import comm_seconds
from llmplan.cost.exposure import gathers_on_warmup_chain
from llmplan.cost.step import later_stage_chain
from llmplan.estimate import estimate_training
from llmplan.search.evaluate import evaluate
from llmplan.search.grid import from_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M, S = builtin_models(), builtin_systems()
H100 = ClusterSpec(system=S["dgx-h100"], num_nodes=2)


def _plan(**kw):
    base = dict(tp=1, pp=4, dp=4, zero=1, micro_batch=1, global_batch=32, seq_len=4096,
                overlap_grad_reduce=True, overlap_param_gather=True)
    return ParallelPlan(**{**base, **kw})


def test_later_stage_chain_by_hand():
    """Candidate stages (0, 1, 1, 3) of pp 4 with whole gathers 5, 2, 2, 3 s: stages 1 and 2 (middle, 2 s
    each) and 3 (3 s) wait in turn: 7 s; stage 0's own (bucketed) gather is in the tail, not here. Listed stages
    (0..3: 5, 2, 4, 3 s) are summed stage by stage: 9 s. pp 2: only the last stage, 3 s."""
    p4 = _plan()
    assert later_stage_chain(p4, [(0, 5.0), (1, 2.0), (1, 2.0), (3, 3.0)], False) == pytest.approx(7.0)
    assert later_stage_chain(p4, [(0, 5.0), (1, 2.0), (2, 4.0), (3, 3.0)], True) == pytest.approx(9.0)
    assert later_stage_chain(_plan(pp=2, dp=8), [(0, 5.0), (1, 3.0), (1, 3.0), (1, 3.0)], False) == pytest.approx(3.0)


def test_only_megatron_core_1f1b_with_the_overlapped_gather():
    assert gathers_on_warmup_chain(_plan())
    for off in (dict(vpp=2), dict(pp=1, dp=16), dict(zero=0), dict(overlap_param_gather=False),
                dict(pp_schedule="zero-bubble")):
        assert not gathers_on_warmup_chain(_plan(**off)), off


def test_the_later_stages_whole_gathers_are_exposed_and_listed_stages_agree():
    """Llama 3.1 8B, 4 stages of 8 layers, ZeRO-1 over dp 4 (inside one DGX-H100: NVSwitch), bf16 weights. By hand:
    a layer holds 2·4096² (q, o) + 2·4096·1024 (k, v: 8 KV heads of 128) + 3·4096·14336 (gated MLP) + 2·4096
    (norms) = 218,112,000 parameters; a middle stage 8 of them, 1,744,896,000 (3,489,792,000 bytes); the last
    stage also the final norm (4,096) and the untied output layer (4,096 · 128,256), 2,270,236,672 (4,540,473,344
    bytes). A ring all-gather over 4 ranks moves 3/4 of the bytes at the profile's 450 GB/s per GPU x the ring
    efficiency 0.80 (HardwareSpec.ring_efficiency) = 360 GB/s, plus 3 steps of 1 us per call, one call: a later
    stage's DDP is unbucketed (step.dp_later_rs; the first stage's 40M-parameter buckets, comm.dp_bucket, are not
    its). The chain is the two middle stages' gathers and the last
    stage's: 2·G_mid + G_last; the DP exposure is the first stage's tail plus it. A plan listing the same stages
    (pp_layers 8, 8, 8, 8: summed stage by stage) prices the same step, and so does the search."""
    from dataclasses import replace

    from llmplan.cost.exposure import dp_exposed_per_step
    from llmplan.cost.params import stepped_rank_params, word_embedding_on_rank
    from llmplan.cost.step import stage_comm, stage_times

    layer = 2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    assert layer == 218_112_000
    mid, last = 8 * layer, 8 * layer + 4096 + 4096 * 128_256
    bw, hop = 450e9 * 0.80, 1e-6
    g_mid = 1 * 3 * hop + 2 * mid * 3 / 4 / bw  # 0.0072734 s
    g_last = 1 * 3 * hop + 2 * last * 3 / 4 / bw  # 0.0094623 s
    assert (g_mid, g_last) == pytest.approx((0.0072734, 0.00946232), rel=1e-6)
    m = M["llama-3.1-8b"]
    plan = _plan()
    est = estimate_training(m, H100, plan)
    secs, gpu = comm_seconds(est.comm, H100.system), H100.system.gpu
    stages = secs.dp_stages  # candidate stages 0, 1, 1, 3
    assert (float(stages[1][1]), float(stages[3][1])) == pytest.approx((g_mid, g_last), rel=1e-9)
    (s0, sc0, _, _) = stage_times(m, plan, gpu)[0]
    c0 = stage_comm(secs, 0)
    p0, e0 = stepped_rank_params(m, plan, s0).total, word_embedding_on_rank(m, plan, s0)
    first = (dp_exposed_per_step(plan, replace(c0, dp_gather=0.0), sc0, gpu.contention, p0, e0)
             + dp_exposed_per_step(plan, replace(c0, dp_reduce=0.0), sc0, gpu.contention, p0, e0))
    assert float(est.time.exposed["dp"]) == pytest.approx(float(first) + 2 * g_mid + g_last, rel=1e-9)
    listed = estimate_training(m, H100, plan.model_copy(update={"pp_layers": (8, 8, 8, 8)}))
    assert float(listed.time.total) == pytest.approx(float(est.time.total), rel=1e-9)
    vec = evaluate(m, H100, from_plan(plan))
    assert float(vec.step.total[0]) == pytest.approx(float(est.time.total), rel=1e-9)
    # interleaved, the same gathers hide behind the warm-up: less DP exposed than the chain alone
    inter = estimate_training(m, H100, plan.model_copy(update={"vpp": 2}))
    assert float(inter.time.exposed["dp"]) < 2 * g_mid + g_last


def test_1f1b_exposure_is_the_first_stage_tail_plus_the_later_whole_gather():
    """Llama 3.1 70B, TP8 PP2 DP4 on 8 DGX-H100, 1F1B: the DP exposure is the first stage's (its reduction's
    tail behind the last backward, its first bucket's gather and the rest beside the first forward:
    dp_exposed_per_step) plus stage 1's whole gather on the chain, which the tail no longer holds. Here that
    costs more than the synchronous gather does (0.540 against 0.419 s with overlap_param_gather off and the
    reduce overlap kept: the synchronous gathers run on both stages at once), which is why Megatron-Core aligns
    the gathers under interleaving and the search tries the synchronous gather on 1F1B (sync_gather_choice)."""
    from dataclasses import replace

    from llmplan.cost.exposure import dp_exposed_per_step
    from llmplan.cost.params import stepped_rank_params, word_embedding_on_rank
    from llmplan.cost.step import stage_comm, stage_times

    m, cluster = M["llama-3.1-70b"], ClusterSpec(system=S["dgx-h100"], num_nodes=8)
    plan = ParallelPlan(tp=8, pp=2, dp=4, sp=True, zero=1, global_batch=64, seq_len=4096)
    est = estimate_training(m, cluster, plan)
    secs, gpu = comm_seconds(est.comm, cluster.system), cluster.system.gpu
    (s0, sc0, _, _) = stage_times(m, plan, gpu)[0]
    c0 = stage_comm(secs, 0)
    p0, e0 = stepped_rank_params(m, plan, s0).total, word_embedding_on_rank(m, plan, s0)
    red0 = dp_exposed_per_step(plan, replace(c0, dp_gather=0.0), sc0, gpu.contention, p0, e0)
    gat0 = dp_exposed_per_step(plan, replace(c0, dp_reduce=0.0), sc0, gpu.contention, p0, e0)
    whole1 = float(secs.dp_stages[-1][1])
    assert float(est.time.exposed["dp"]) == pytest.approx(float(red0 + gat0) + whole1, rel=1e-9)
    off = estimate_training(m, cluster, plan.model_copy(update={"overlap_grad_reduce": False,
                                                                "overlap_param_gather": False}))
    # off: each stage's whole reduction and gather at the tail, both stages at once (R + G of one stage)
    r1, g1 = (float(x) for x in comm_seconds(off.comm, cluster.system).dp_stages[-1])
    assert float(off.time.exposed["dp"]) == pytest.approx(r1 + g1, rel=1e-9)
    assert float(est.time.exposed["dp"]) > float(off.time.exposed["dp"])
    sync = estimate_training(m, cluster, plan.model_copy(update={"overlap_param_gather": False}))
    assert float(est.time.exposed["dp"]) > float(sync.time.exposed["dp"])


def _search(plans_pins, w_kw=None, named=None):
    from llmplan.search.grid import Workload, default_space
    from llmplan.search.run import search

    m, cluster = M["llama-3.1-70b"], ClusterSpec(system=S["dgx-h100"], num_nodes=16)
    w = Workload(**{**dict(global_batch=64, seq_len=4096), **(w_kw or {})})
    return search(m, cluster, default_space(m, cluster, w, plans_pins), w, named=named, vpp_pin=plans_pins["vpp"])


def test_the_search_keeps_the_cheaper_gather_on_1f1b_and_the_overlap_interleaved():
    """Llama 3.1 70B, TP8 PP4 ZeRO-1 on 16 DGX-H100 (dp 4): on 1F1B the three later stages' whole gathers wait
    in turn on the warm-up's chain, while the synchronous gather runs on all four stages at once after the step,
    so the synchronous one is the cheaper and the search's #1 carries overlap_param_gather False, priced as the
    scalar estimate of that plan; interleaved (vpp 2) no gather waits on the chain and the overlap is kept.
    --overlap-param-gather named keeps the overlap whatever it costs."""
    pins = dict(tp=8, pp=4, zero=1, micro_batch=1, recompute="none", sp=True, cp=1, ep=1)
    m, cluster = M["llama-3.1-70b"], ClusterSpec(system=S["dgx-h100"], num_nodes=16)
    best = _search({**pins, "vpp": 1}).ranked[0]
    on = best.plan.model_copy(update={"overlap_param_gather": True})
    assert best.plan.vpp == 1 and best.plan.overlap_param_gather is False
    assert float(best.time.total) < float(estimate_training(m, cluster, on).time.total)
    assert float(best.time.total) == pytest.approx(float(estimate_training(m, cluster, best.plan).time.total),
                                                   rel=1e-9)
    named = _search({**pins, "vpp": 1}, named={"overlap_param_gather"}).ranked[0]
    assert named.plan.overlap_param_gather is True
    inter = _search({**pins, "vpp": 2}).ranked[0]
    assert inter.plan.vpp == 2 and inter.plan.overlap_param_gather is True
