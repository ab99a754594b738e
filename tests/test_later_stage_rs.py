"""A later pipeline stage's gradient reduction under Megatron-Core's DDP: one unbucketed collective per model chunk,
run in the 1F1B cool-down's slack (docs/formulas.md#step.dp_later_rs; docs/validation.md#later-stage-rs).

NVIDIA/Megatron-LM d98e8a64dd: distributed_data_parallel.py __init__ ("if disable_bucketing or pp_rank > 0:
self.bucket_size = None"); pipeline_parallel/schedules.py forward_backward_pipelining_without_interleaving (grad
sync enabled in the last backward only on the first stage, "Other pipeline stages do grad reduction during pipeline
bubble": grad_sync_func after the cool-down loop), forward_backward_pipelining_with_interleaving (grad_sync_func at
virtual_microbatch_id - pipeline_parallel_rank); training/training.py (grad_sync_func = start_grad_sync under
align_grad_reduce, True by default). Hand values are worked in the docstrings, not by the code under test.
"""

from __future__ import annotations

import numpy as np
import pytest

from llmplan.cost.comm import comm_seconds
from llmplan.cost.compute import StageCompute
from llmplan.cost.exposure import (CommSeconds, cooldown_slack, dp_exposed_per_step, later_stage_reduce_exposed,
                                   later_stage_unbucketed)
from llmplan.cost.schedule import _simulate
from llmplan.cost.step import layout_chunk_shares, pipeline_sum, stage_times
from llmplan.estimate import estimate_training
from llmplan.search.grid import Workload, default_space, enumerate_plans
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems
from agreement import assert_arrays_agree, valid_sample

M, S = builtin_models(), builtin_systems()
H100 = ClusterSpec(system=S["dgx-h100"], num_nodes=2)


def _plan(**kw):
    base = dict(tp=1, pp=4, dp=4, zero=1, micro_batch=1, global_batch=32, seq_len=4096,
                overlap_grad_reduce=True, overlap_param_gather=True)
    return ParallelPlan(**{**base, **kw})


def test_which_stages_are_unbucketed():
    """Stages after the first, on Megatron-Core's schedule (1F1B, interleaved or not), ZeRO 0-1, with the
    gradient-reduce overlap (without it every stage is one bucket per chunk already)."""
    assert not later_stage_unbucketed(_plan(), 0)
    for j in (1, 3):
        assert later_stage_unbucketed(_plan(), j) and later_stage_unbucketed(_plan(vpp=2), j)
        assert later_stage_unbucketed(_plan(zero=0), j)
    for off in (dict(overlap_grad_reduce=False, overlap_param_gather=False), dict(pp_schedule="zero-bubble"),
                dict(zero=2)):
        assert not later_stage_unbucketed(_plan(**off), 1), off


def test_the_exposed_reduction_by_hand():
    """1F1B (v 1): max(0, R - slack): R 1.0 s, slack 0.3 s -> 0.7 s; slack 1.2 s -> 0.
    Interleaved v 2, pp 4, backward 0.4 s a micro-batch (0.2 s a chunk), kappa 0.1: chunk 1's reduction is
    dispatched (v-1)·p = 4 chunk-backwards = 0.8 s before the first stage's last backward ends. R 1.0 s, slack
    0.2 s: the last chunk 0.5 - 0.2 = 0.3 s, the link still busy 1.0 - 0.8 = 0.2 s, the larger 0.3 s, + 0.1 x
    min(0.5, 0.8) = 0.05 s beside compute: 0.35 s. R 2.0 s: max(1.0 - 0.2, 2.0 - 0.8) = 1.2 s + 0.1 x min(1.0,
    0.8) = 0.08: 1.28 s."""
    one, two = _plan(), _plan(vpp=2)
    assert float(later_stage_reduce_exposed(one, 1.0, 0.3, 0.5, 0.1)) == pytest.approx(0.7, abs=1e-12)
    assert float(later_stage_reduce_exposed(one, 1.0, 1.2, 0.5, 0.1)) == 0.0
    assert float(later_stage_reduce_exposed(two, 1.0, 0.2, 0.4, 0.1)) == pytest.approx(0.35, abs=1e-12)
    assert float(later_stage_reduce_exposed(two, 2.0, 0.2, 0.4, 0.1)) == pytest.approx(1.28, abs=1e-12)


def test_the_cooldown_slack_by_hand():
    """Each stage before stage j runs its own last backward in turn after stage j's (Narayanan et al. 2021 §2.2,
    Fig. 4; Megatron-LM's cool-down loop), so the slack is the sum of the earlier stages' backwards, priced as the
    bubble prices the stages (pipeline_sum). Candidate stages 0, 1, 2 (the heaviest MoE), 3 of pp 4 with backwards
    0.5, 0.9, 0.8, 0.7 s: each middle stage's backward is T - F, T the larger micro-batch time of candidates 1
    and 2, F the larger of their times less their backwards. Micro-batch times 1.4, 2.7, 2.4, 2.0 s: T 2.7, F
    max(1.8, 1.6) = 1.8, stage 1's 0.9 s: 0, 0.5, 0.5 + 0.9 = 1.4, 0.5 + 2 x 0.9 = 2.3 s at v 1, halved at v 2 (a
    chunk-backward); micro-batch times 1.4, 2.4, 2.7, 2.0 s: T 2.7, F max(1.5, 1.9) = 1.9, stage 2's 0.8 s: 0,
    0.5, 1.3, 2.1 s.
    Stages listed (pp_layers 2, 10, 10, 10, every stage a candidate), backwards 0.5, 0.9, 0.8, 0.7 s: the running
    sum 0, 0.5, 1.4, 2.2 s."""
    backs = [0.5, 0.9, 0.8, 0.7]
    first = [1.4, 2.7, 2.4, 2.0]
    assert cooldown_slack(_plan(), [0, 1, 2, 3], backs, first) == pytest.approx([0.0, 0.5, 1.4, 2.3], abs=1e-12)
    assert cooldown_slack(_plan(vpp=2), [0, 1, 2, 3], backs, first) == pytest.approx([0.0, 0.25, 0.7, 1.15],
                                                                                      abs=1e-12)
    second = [1.4, 2.4, 2.7, 2.0]
    assert cooldown_slack(_plan(), [0, 1, 2, 3], backs, second) == pytest.approx([0.0, 0.5, 1.3, 2.1], abs=1e-12)
    listed = _plan(pp_layers=(2, 10, 10, 10))
    assert cooldown_slack(listed, [0, 1, 2, 3], backs, first) == pytest.approx([0.0, 0.5, 1.4, 2.2], abs=1e-12)
    # one stage: nothing drains after it
    assert cooldown_slack(_plan(pp=1, dp=16), [0, 0, 0, 0], backs, first) == pytest.approx([0.0] * 4, abs=1e-12)


def test_the_middle_backward_between_two_candidates_by_hand():
    """Candidates 0, 1, 2, 3 of pp 4, backwards 0.5, 1.2, 0.8, 0.7 s, micro-batch times 1.4, 2.7, 2.6, 2.0 s: the
    bubble prices each middle stage at T = max(2.7, 2.6) = 2.7 s, the rest outside the backward at F = max(2.7 -
    1.2, 2.6 - 0.8) = 1.8 s, so b_mid = T - F = 0.9 s (between 0.8 and 1.2; stage 1's 1.2 s before, the one of
    the larger micro-batch time): 0, 0.5, 1.4, 2.3 s. A candidate 2 that is the last stage (pp 3, heaviest MoE
    stage pp - 1 = 2: candidates 0, 1, 2, 2) is no middle stage: its backward holds the LM head's, and the one
    middle stage is stage 1 alone: slack 0, 0.5, 0.5 + 1.2 = 1.7 s (0.5 + 0.8 before, the last stage's own)."""
    backs = [0.5, 1.2, 0.8, 0.7]
    assert cooldown_slack(_plan(), [0, 1, 2, 3], backs, [1.4, 2.7, 2.6, 2.0]) == pytest.approx(
        [0.0, 0.5, 1.4, 2.3], abs=1e-12)
    three = _plan(pp=3, global_batch=24)
    backs = [0.5, 1.2, 0.8, 0.8]
    t = [1.4, 2.0, 2.6, 2.6]
    assert cooldown_slack(three, [0, 1, 2, 2], backs, t) == pytest.approx([0.0, 0.5, 1.7, 1.7], abs=1e-12)
    # the bubble's sum likewise: 1.4 + 2.0 + 2.6 (stage 1 once, not the last stage twice)
    assert float(pipeline_sum(three, t, [0, 1, 2, 2])) == pytest.approx(6.0, abs=1e-12)


def test_a_stage_never_ends_its_last_backward_earlier_for_more_work():
    """Seeded property over the candidates' micro-batch times t and backwards b, pp 3-16 and the heaviest MoE
    candidate's stage (a middle stage or the last): d more backward (t and b by d) or forward (t by d) on any
    candidate never shortens a later stage's way to its last backward, pipeline_sum - cooldown_slack (v 1),
    and never jumps: the change is at most d times the stages that candidate stands for. Before, the middle
    backward switched with the larger micro-batch time: DeepSeek-V3 pp16 (a one-layer first stage, MLP
    recompute on 32 DGX H100) priced 0.1 ms more backward on stage 1 as a slack 157 ms longer."""
    rng = np.random.default_rng(11)
    for _ in range(400):
        p = int(rng.integers(3, 17))
        plan = _plan(pp=p, dp=1, global_batch=4 * p)
        stages = [0, 1, int(rng.choice([2, p - 1])), p - 1]
        t = list(rng.uniform(0.2, 2.0, 4))
        b = [x * f for x, f in zip(t, rng.uniform(0.4, 0.8, 4))]
        if stages[2] == p - 1:
            t[2], b[2] = t[3], b[3]
        k, d, back = int(rng.integers(0, 3)), float(rng.uniform(0, 0.05)), bool(rng.integers(0, 2))
        t2, b2 = list(t), list(b)
        for i in range(4):
            if i == k or stages[i] == stages[k]:
                t2[i] += d
                b2[i] += d if back else 0.0
        for j in range(1, 4):
            way = float(pipeline_sum(plan, t, stages)) - float(cooldown_slack(plan, stages, b, t)[j])
            more = float(pipeline_sum(plan, t2, stages)) - float(cooldown_slack(plan, stages, b2, t2)[j])
            assert more >= way - 1e-12, (p, stages, t, b, k, d, back, j)
            assert more <= way + p * d + 1e-12, (p, stages, t, b, k, d, back, j)


def test_a_last_heaviest_moe_stage_prices_as_the_listed_stages():
    """DeepSeek-V3 pp 3 with a one-layer first stage (pp_first 1) on 6 DGX B200: the heaviest MoE candidate is the
    last stage (candidates 0, 1, 2, 2). Its slack and the bubble count stage 1 as the middle stage, as the same
    split listed stage by stage (pp_layers 1, 30, 30) prices it: the split priced the last stage's slack 384.63 ms
    (its own LM-head backward counted) against 347.38 ms listed, and the bubble 63 ms more (the last stage's time
    as the middle stage's)."""
    cluster = ClusterSpec(system=S["dgx-b200"], num_nodes=6)
    kw = dict(pp=3, dp=16, ep=8, micro_batch=1, global_batch=512)
    split = estimate_training(M["deepseek-v3"], cluster, ParallelPlan(pp_first=1, pp_last=0, **kw))
    listed = estimate_training(M["deepseek-v3"], cluster, ParallelPlan(pp_layers=(1, 30, 30), **kw))
    for key in ("bubble", "total"):
        assert float(getattr(split.time, key)) == pytest.approx(float(getattr(listed.time, key)), rel=1e-9), key
    assert float(split.time.exposed["dp"]) == pytest.approx(float(listed.time.exposed["dp"]), rel=1e-9)


def _random_layout(rng, p: int, v: int, layers: int = 32) -> tuple[str, ...]:
    cuts = np.sort(rng.choice(np.arange(0, layers + 1), size=p * v - 1, replace=True))
    chunks = ["t" * int(c) for c in np.diff(np.concatenate([[0], cuts, [layers]]))]
    return ("E" + chunks[0], *chunks[1:-1], chunks[-1] + "L")


def test_an_interleaved_layout_slack_is_the_simulated_cooldown_at_most():
    """Interleaved pp_layout plans (Llama 3.1 8B, random layouts, pp 2-4, vpp 2-3, random stage times): each stage
    before j runs its chunk 0's last backward after stage j's, chunk 0 its share of the stage
    (layout_chunk_shares), so the priced slack is never more than the schedule simulation's gap from stage j's
    last backward to the first stage's (cost.schedule; the simulation may wait on a stage's own earlier work
    too), and equals it on the reviewer's layout (an empty first chunk): 0, 0, 5/9 b, 10/9 b. Before, b_i / v
    priced more than simulated (stage 1 of the reviewer's layout, which has no slack: 17.7 ms on 2 DGX H100)."""
    m, gpu = M["llama-3.1-8b"], S["dgx-h100"].gpu
    rng = np.random.default_rng(5)
    for case in range(30):
        p, v = int(rng.integers(2, 5)), int(rng.integers(2, 4))
        n = p * int(rng.integers(1, 4))
        layout = (("E", "t" * 5, "t" * 5, "t" * 5, "t" * 5, "t" * 4, "t" * 4, "t" * 4 + "L") if case == 0
                  else _random_layout(rng, p, v))
        p, v = (4, 2) if case == 0 else (p, v)
        plan = _plan(pp=p, vpp=v, dp=1, global_batch=n if case else 8, pp_layout=layout)
        share = [[float(x) for x in row] for row in layout_chunk_shares(m, plan, gpu)[0]]
        t = list(rng.uniform(0.5, 2.0, p)) if case else [1.0] * p
        f = [x * r for x, r in zip(t, rng.uniform(0.25, 0.4, p))] if case else [1 / 3] * p
        b = [x - y for x, y in zip(t, f)]
        ends = _simulate(f, b, plan.num_microbatches, v, share, None)
        priced = cooldown_slack(plan, list(range(p)), b, t, [row[0] for row in share])
        for j in range(p):
            assert float(priced[j]) <= ends[0] - ends[j] + 1e-12, (layout, j)
            if case == 0:
                assert float(priced[j]) == pytest.approx(ends[0] - ends[j], abs=1e-12)
                assert float(priced[j]) == pytest.approx([0, 0, 5 / 9, 10 / 9][j] * 2 / 3, rel=1e-2)


def test_an_interleaved_layout_reduction_sees_its_chunk_shares(monkeypatch):
    """The step prices the reviewer's layout (Llama 3.1 8B pp 4 vpp 2, an empty first chunk, 2 DGX H100) as it
    prices it with the schedule simulation's slack (each stage's last backward to the first stage's, from the
    step's own stage times and chunk shares); before, b_i / v priced stage 1 a slack of 17.7 ms where it has none
    (stage 0's chunk 0 holds no layer) and the step 3.7 ms shorter."""
    import llmplan.cost.step as step
    m, cluster = M["llama-3.1-8b"], ClusterSpec(system=S["dgx-h100"], num_nodes=2)
    layout = ("E", "t" * 5, "t" * 5, "t" * 5, "t" * 5, "t" * 4, "t" * 4, "t" * 4 + "L")
    plan = _plan(pp=4, vpp=2, dp=4, global_batch=32, pp_layout=layout)
    seen = []
    tails = step.stage_tails
    monkeypatch.setattr(step, "stage_tails", lambda *a: seen.append(a[4]) or tails(*a))
    priced = estimate_training(m, cluster, plan)
    f = [float(sc.forward) for _, sc, _, _ in seen[-1]]
    b = [float(sc.total - sc.forward) for _, sc, _, _ in seen[-1]]
    share = [[float(x) for x in row] for row in layout_chunk_shares(m, plan, cluster.system.gpu)[0]]
    ends = _simulate(f, b, plan.num_microbatches, 2, share, None)
    monkeypatch.setattr(step, "cooldown_slack", lambda *a: [ends[0] - e for e in ends])
    simulated = estimate_training(m, cluster, plan)
    assert ends[0] - ends[1] == pytest.approx(0.0, abs=1e-12)
    assert float(priced.time.total) == pytest.approx(float(simulated.time.total), rel=1e-9)
    assert float(priced.time.exposed["dp"]) == pytest.approx(float(simulated.time.exposed["dp"]), rel=1e-9)


def test_never_more_than_the_reduction_nor_the_bucketed_price_once_the_slack_covers_a_backward():
    """Seeded property over reductions, slacks, backwards, contention, v and pp: the exposed reduction is
    between 0 and R(1 + kappa), is exactly max(0, R - slack) at v 1, never grows with more slack; and at v 1,
    where the slack is at least the stage's own backward, it never exceeds the bucketed price (step.dp: the last
    bucket plus the rest beside the last backward, dp_exposed_per_step), which hid the same reduction behind
    that backward at contention kappa."""
    rng = np.random.default_rng(32)
    for _ in range(400):
        v, pp = int(rng.choice([1, 2, 4])), int(rng.integers(2, 17))
        plan = _plan(pp=pp, vpp=v, dp=2, global_batch=8 * pp)
        r, b, kappa = rng.uniform(0, 2), rng.uniform(0.01, 1), rng.uniform(0, 0.5)
        slack = rng.uniform(0, 2)
        e = float(later_stage_reduce_exposed(plan, r, slack, b, kappa))
        assert -1e-12 <= e <= r * (1 + kappa) + 1e-12
        assert float(later_stage_reduce_exposed(plan, r, slack + 0.1, b, kappa)) <= e + 1e-12
        if v == 1:
            assert e == pytest.approx(max(0.0, r - slack), abs=1e-12)
            covered = float(later_stage_reduce_exposed(plan, r, b * (1 + rng.uniform(0, 2)), b, kappa))
            comm = CommSeconds(tp=0.0, pp=0.0, cp=0.0, ep=0.0, dp_reduce=r, dp_gather=0.0)
            sc = StageCompute(gemm=2 * b, attention=0.0, memory_bound=0.0, forward=b)
            bucketed = float(dp_exposed_per_step(plan, comm, sc, kappa, rng.uniform(1e8, 1e10), 0.0))
            assert covered <= bucketed + 1e-12


def test_a_later_stage_reduction_sets_the_tail_by_hand():
    """Llama 3.1 8B, PP4 with 2, 10, 10, 10 layers, plain DDP (ZeRO 0: an all-reduce, no gather) over dp 4 inside one
    DGX-H100, the gradient-reduce overlap on. A middle stage holds 10 x 218,112,000 = 2,181,120,000 parameters,
    fp32 gradients (4 bytes, Megatron-Core's default buffer): 8,724,480,000 bytes, all-reduced by a ring of 4 in
    2 x 3/4 of them at 360 GB/s (450 x 0.80) = 0.036352 s, plus 2 x 3 steps of 1 us, one call (unbucketed; 55
    calls at 40M a bucket would add 0.33 ms): R_1 = 0.036358 s. Its one all-reduce starts after its last backward,
    and the first stage's last backward (b_0) is all the cool-down left: R_1 - b_0 is the step's exposed DP (stage
    2: R_1 - b_0 - b_1; the last stage, b_0 + b_1 + b_2 of slack; the first stage's buckets hide behind its own
    backward)."""
    m = M["llama-3.1-8b"]
    plan = _plan(zero=0, pp_layers=(2, 10, 10, 10), overlap_param_gather=False)
    est = estimate_training(m, H100, plan)
    secs = comm_seconds(est.comm, H100.system)
    r1 = 1 * 2 * 3 * 1e-6 + 2 * 0.75 * 4 * 10 * 218_112_000 / 360e9
    assert r1 == pytest.approx(0.036358, rel=1e-9)
    assert float(secs.dp_stages[1][0]) == pytest.approx(r1, rel=1e-9)
    calls = [int(t.calls) for t in est.comm.dp_stages[1].transfers if t.calls]
    assert calls == [1]
    stages = stage_times(m, plan, H100.system.gpu)
    b0 = float(stages[0][1].total - stages[0][1].forward)
    assert b0 < min(float(sc.total - sc.forward) for _, sc, _, _ in stages[1:])
    assert float(est.time.exposed["dp"]) == pytest.approx(r1 - b0, rel=1e-9)


def test_later_stages_count_one_call_per_chunk():
    """The first stage's chunk 0 is cut into 40M-parameter buckets (comm.dp_bucket); every later stage's DDP is
    unbucketed: one reduce-scatter and one all-gather per model chunk, v calls (1 at vpp 1, 2 at vpp 2), also on the
    DP seconds the later stages' tails and the 1F1B gather chain read (dp_stages)."""
    m = M["llama-3.1-8b"]
    for v in (1, 2):
        est = estimate_training(m, H100, _plan(vpp=v, global_batch=32))
        per_stage = [{t.collective: int(t.calls) for t in a.transfers if t.calls} for a in est.comm.dp_stages]
        assert per_stage[0]["reduce-scatter"] > v and per_stage[0]["all-gather"] == per_stage[0]["reduce-scatter"]
        for calls in per_stage[1:]:
            assert calls == {"reduce-scatter": v, "all-gather": v}
    zb = estimate_training(m, H100, _plan(pp_schedule="zero-bubble"))
    assert all(int(t.calls) > 1 for a in zb.comm.dp_stages for t in a.transfers if t.calls)


@pytest.mark.parametrize("name,system,nodes,gbs", [("llama-3.1-70b", "dgx-h100", 16, 256),
                                                   ("kimi-k2", "dgx-h800", 32, 1024)])
def test_vectorised_search_agrees_on_later_stage_reductions(name, system, nodes, gbs):
    """Random valid plans with pipeline stages, ZeRO 0-1 and the gradient-reduce overlap, interleaved and not: the
    search's arrays price the step the scalar estimate prices (kimi-k2: a dense first layer, so the candidate
    stages' backwards, and so the cool-down's slack per stage, differ)."""
    m, cluster = M[name], ClusterSpec(system=S[system], num_nodes=nodes)
    w = Workload(global_batch=gbs, seq_len=4096)
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    keep = (lambda p: p.pp > 1 and p.zero <= 1 and p.overlap_grad_reduce)
    idx = valid_sample(m, cluster, plans, 32, 600, 16, keep=keep)
    assert len(idx) >= 8 and {plans.plan(i).vpp > 1 for i in idx} == {True, False}
    assert_arrays_agree(m, cluster, plans, idx)


def test_apex_distributed_fused_adam_keeps_its_buckets_on_every_stage():
    """Apex's DistributedFusedAdam (kept_grad_shards, NeMo 1.x) reduces in its bucket_cap_mb buckets on every
    pipeline stage: Megatron-Core DDP's one call per chunk on later stages is not its rule, so every stage's
    reduce-scatter counts more than one call (one per chunk came out 1 before)."""
    m = M["llama-3.1-8b"]
    est = estimate_training(m, H100, _plan(kept_grad_shards=True, grad_reduce="reduce-scatter", grad_dtype="bf16"))
    for a in est.comm.dp_stages:
        calls = {t.collective: int(t.calls) for t in a.transfers if t.calls}
        assert calls["reduce-scatter"] > 1, calls
