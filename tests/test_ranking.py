"""The step-time defects behind implausible rankings (issue "Plan ranking that an expert would trust"), each
pinned by a test: the bubble when micro-batches are fewer than stages, ZeRO-3 traffic sharing one window,
per-GEMM efficiency, partial TP overlap, EP overlap, the sustained clock, equivalent plans collapsing, and
that more communication never makes a step shorter."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from llmplan.cost.comm import comm_seconds
from llmplan.cost.moe import EP_OVERLAP_HIDDEN
from llmplan.cost.compute import (
    TE_PIPELINE_SPLITS, chunk_rows, gemm_shape_efficiency, layer_gemm_seconds, layer_gemms, layer_flops, stage_compute,
)
from llmplan.cost.params import stage_layers
from llmplan.cost.step import CommSeconds, chunked_sync_window, step_time
from llmplan.estimate import estimate_training
from llmplan.search.grid import Workload, default_space
from llmplan.search.run import search
from llmplan.search.variants import equivalent
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M, S = builtin_models(), builtin_systems()
H100 = S["dgx-h100"]


def test_bubble_with_fewer_microbatches_than_stages_is_exact():
    # One micro-batch through 4 stages: 1F1B takes the sum of the stages' times (Narayanan et al. 2021 §2.2:
    # (n + p - 1) stage-times for equal stages); each stage's time is built here from its own layers.
    m, gpu = M["llama-3.1-8b"], H100.gpu
    plan = ParallelPlan(pp=4, dp=1, global_batch=1, seq_len=4096)
    cluster = ClusterSpec(system=H100, num_nodes=1, gpus_per_node=4)
    t = [float(stage_compute(m, plan, gpu, *stage_layers(m, plan, i), i == 3).total) for i in range(4)]
    e = estimate_training(m, cluster, plan)
    assert float(e.time.compute + e.time.bubble) == pytest.approx(sum(t), rel=1e-9)
    # Interleaving does not shorten a one-micro-batch pipeline: it is refused (Megatron needs whole groups of p).
    with pytest.raises(Exception, match="whole number of groups of pp"):
        estimate_training(m, cluster, plan.model_copy(update={"vpp": 2}))


def test_zero3_gathers_and_reductions_share_one_window():
    # Llama-70B tp2 dp32 ZeRO-3: the all-gathers and reduce-scatters cross the same NICs in the same passes,
    # so what is exposed is at least the DP traffic minus the compute it can hide behind.
    m, cluster = M["llama-3.1-70b"], ClusterSpec(system=H100, num_nodes=8)
    plan = ParallelPlan(tp=2, dp=32, sp=True, zero=3, recompute="none", global_batch=1024, seq_len=2048)
    e = estimate_training(m, cluster, plan)
    traffic = e.comm.axes["dp"].seconds
    assert traffic > float(e.time.compute)  # the case of the issue: more DP traffic than compute
    assert float(e.time.exposed["dp"]) >= traffic - float(e.time.compute) - 1e-9
    # Switching the overlaps off at ZeRO-3 exposes the whole traffic.
    off = estimate_training(m, cluster, plan.model_copy(update={"overlap_grad_reduce": False,
                                                                 "overlap_param_gather": False}))
    assert float(off.time.exposed["dp"]) == pytest.approx(traffic, rel=1e-9)


def _fifo_sync_exposed(v: int, p: int, sync: float, per_mb: float) -> float:
    """Event simulation of Megatron-LM's interleaved schedule at the end of a step (schedules.py): in the last
    round of backward passes chunk c (v-1 first, 0 last) finishes its last micro-batch c*p chunk-passes before
    the end, and its share sync/v runs on the one link in order, overlapping (bucket by bucket) its own last
    pass. Returns how long the link stays busy after the last backward ends."""
    w = per_mb / v
    link_free = -float("inf")
    for c in range(v - 1, -1, -1):
        ready = -(c * p + 1) * w
        link_free = max(link_free, ready) + sync / v
    return max(0.0, link_free)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(v=st.integers(1, 8), p=st.integers(2, 16), sync=st.floats(0.0, 5.0), per_mb=st.floats(1e-3, 1.0))
def test_interleaved_dp_sync_window_matches_a_schedule_simulation(v, p, sync, per_mb):
    # The closed form (docs/formulas.md#step.dp) against the event simulation above: what stays exposed is
    # sync minus the window, and at v = 1 the window is the one pass (the non-interleaved rule).
    plan = ParallelPlan(pp=p, vpp=v, dp=1, global_batch=p * v, seq_len=1024)
    window = float(chunked_sync_window(plan, sync, per_mb))
    assert max(0.0, sync - window) == pytest.approx(_fifo_sync_exposed(v, p, sync, per_mb), rel=1e-9, abs=1e-12)
    if v == 1:
        assert window == pytest.approx(per_mb, rel=1e-12)
    assert window >= min(sync, per_mb) - 1e-12  # interleaving never hides less than one pass


def test_interleaving_hides_the_distributed_optimizer_sync_of_a_large_dp_group():
    # GPT 177B at TP8 PP6 on 2,304 H100 (Megatron-Core r0.8 weak-scaling row, 24 micro-batches): 14.8 GB of fp32
    # gradients per GPU reduce-scattered over 48 ranks take longer than one micro-batch's backward; with 4
    # chunks each chunk's reduction starts as its last backward ends, so less is exposed than without.
    m = M["gpt3-175b"]
    cluster = ClusterSpec(system=H100, num_nodes=288)
    base = ParallelPlan(tp=8, sp=True, pp=6, dp=48, zero=1, recompute="none", global_batch=1152, seq_len=2048,
                        tp_comm_overlap=True)
    flat, chunked = (estimate_training(m, cluster, base.model_copy(update={"vpp": v})) for v in (1, 4))
    assert float(flat.time.exposed["dp"]) > 0.05  # the case: more sync than one backward hides
    assert float(chunked.time.exposed["dp"]) < 0.6 * float(flat.time.exposed["dp"])


def test_tp8_and_tp4_gemms_run_alike_when_their_dimensions_are_large():
    # Each GEMM's efficiency comes from its own (M, N, K): Llama-70B's MLP GEMMs at TP4 and TP8 (N and K of
    # 3,584 and more) run within 3% of each other, where one minimum dimension per layer cost TP8 10-20%.
    m, gpu = M["llama-3.1-70b"], H100.gpu
    eff = {}
    for t in (4, 8):
        plan = ParallelPlan(tp=t, sp=True, micro_batch=1, seq_len=4096)
        fc1, fc2 = layer_gemms(m, plan, False)[2:4]  # [qkv, out, fc1, fc2]
        eff[t] = [float(gemm_shape_efficiency(gpu, "bf16", *g[1:4])) for g in (fc1, fc2)]
    for a, b in zip(eff[4], eff[8]):
        assert b == pytest.approx(a, rel=0.03)
    # A GEMM with few rows (an expert's share of a small micro-batch) pays for idle tiles and SMs.
    assert float(gemm_shape_efficiency(gpu, "bf16", 16, 4096, 4096)) < 0.2 * float(
        gemm_shape_efficiency(gpu, "bf16", 4096, 4096, 4096))


def test_layer_gemms_cover_the_layer_flops():
    # The GEMM list weighs each matmul's efficiency; its FLOPs are the layer's model FLOPs (biases aside). MLA's
    # down-projections are replicated on every TP rank, so the rank runs more than the model's share.
    for name in ("llama-3.1-70b", "deepseek-v3", "mixtral-8x7b", "gpt3-175b"):
        m = M[name]
        plan = ParallelPlan(tp=4, ep=4 if m.is_moe else 1, dp=4 if m.is_moe else 1, sp=True, seq_len=2048)
        for moe in ((False, True) if m.is_moe else (False,)):
            covered = sum(g[0] for g in layer_gemms(m, plan, moe))
            model = float(layer_flops(m, plan, moe).gemm)
            if m.is_mla:
                assert model < covered < 1.1 * model, name
            else:
                assert covered == pytest.approx(model, rel=0.02), name


def test_tp_overlap_is_partial():
    # --tp-comm-overlap (Transformer Engine userbuffers) leaves the last of TE_PIPELINE_SPLITS chunks of each
    # forward reduce-scatter exposed, and the contention of the rest; without it, only the backward
    # collectives that overlap the weight-gradient GEMMs are hidden.
    m, cluster = M["llama-3.1-70b"], ClusterSpec(system=H100, num_nodes=1)
    base = ParallelPlan(tp=8, dp=1, sp=True, recompute="full", global_batch=16, seq_len=4096)
    plain = estimate_training(m, cluster, base)
    over = estimate_training(m, cluster, base.model_copy(update={"tp_comm_overlap": True}))
    traffic = plain.comm.axes["tp"].seconds
    assert 0 < float(over.time.exposed["tp"]) < float(plain.time.exposed["tp"]) < traffic
    # full recompute: 4 of the 6 reduce-scatters (of 14 collectives of one size in bf16) run in forward passes
    assert float(over.time.exposed["tp"]) >= traffic * (4 / 14) / TE_PIPELINE_SPLITS * (1 - 1e-9)


def test_ep_all_to_all_can_overlap():
    m, cluster = M["deepseek-v3"], ClusterSpec(system=S["dgx-h800"], num_nodes=32)
    base = ParallelPlan(pp=8, pp_first=7, pp_last=6, dp=32, ep=32, etp=1, zero=1, recompute="full", global_batch=512,
                        seq_len=4096)
    # Megatron-Core runs the EP overlap at pp > 1 only in the interleaved schedule, with no full recompute
    # (TransformerConfig; check_plan's ep_overlap_vpp / ep_overlap_full_recompute): Megatron-Bridge's DeepSeek-V3
    # H100 layout, PP 8 with VPP 4 (set_deepseek_v3_pipeline_model_parallel_layout "Et|(tt|)*30mL" at 067f987)
    from llmplan.specs.layout import parse_layout
    plan = base.model_copy(update={"pp_first": 0, "pp_last": 0, "vpp": 4, "pp_layout": parse_layout("Et|(tt|)*30mL"),
                                   "recompute": "selective"})
    plain = estimate_training(m, cluster, plan)
    over = estimate_training(m, cluster, plan.model_copy(update={"ep_comm_overlap": True}))
    # Megatron-Core's EP overlap is credited as measured (cost.moe.EP_OVERLAP_HIDDEN of what each all-to-all's
    # paired compute chunk covers, less what their SMs take from it), never more than of the all-to-alls that fit
    # beside the whole compute; and only on the micro-batches the combined 1F1B pairs: here the first rank's
    # warm-up, 2(p - 1) + (v - 1)p + 1 = 39 chunk passes of the 16 x 4, and as many cool-down backwards, run
    # unpaired (cost.moe.unpaired_microbatches). DualPipe hides in full.
    ep, kappa = float(plain.time.exposed["ep"]), cluster.system.gpu.contention
    hideable = min(ep, float(plain.time.compute))  # the all-to-alls that fit beside the compute
    assert plan.num_microbatches == 16
    paired = (16 - (2 * 7 + 3 * 8 + 1) / 4) / 16
    assert ep * (1 - EP_OVERLAP_HIDDEN) <= float(over.time.exposed["ep"])
    assert ep - EP_OVERLAP_HIDDEN * (1 - kappa) * hideable * paired <= float(over.time.exposed["ep"]) * (1 + 1e-9)
    assert float(over.time.exposed["ep"]) < ep
    ep1 = float(estimate_training(m, cluster, base).time.exposed["ep"])
    dual = estimate_training(m, cluster, base.model_copy(update={"pp_schedule": "dualpipe"}))
    assert float(dual.time.exposed["ep"]) < 0.5 * ep1


def test_power_cap_slows_compute_by_its_clock():
    # A compute-bound single-GPU plan: at half the sustained clock every GEMM and attention kernel takes twice
    # as long; memory-bound work does not change; MFU stays against the nominal peak.
    m = M["llama-3.1-8b"]
    capped_gpu = H100.gpu.model_copy(update={"sustained_clock_fraction": H100.gpu.sustained_clock_fraction / 2})
    capped = H100.model_copy(update={"gpu": capped_gpu})
    plan = ParallelPlan(dp=1, global_batch=8, recompute="full", seq_len=4096)
    a = estimate_training(m, ClusterSpec(system=H100, num_nodes=1, gpus_per_node=1), plan)
    b = estimate_training(m, ClusterSpec(system=capped, num_nodes=1, gpus_per_node=1), plan)
    assert float(b.time.stage.gemm) == pytest.approx(2 * float(a.time.stage.gemm), rel=1e-9)
    assert float(b.time.stage.attention) == pytest.approx(2 * float(a.time.stage.attention), rel=1e-9)
    assert float(b.time.stage.memory_bound) == pytest.approx(float(a.time.stage.memory_bound), rel=1e-9)
    ratio = float(b.throughput.tokens_per_s / a.throughput.tokens_per_s)
    assert 0.5 <= ratio < 0.6


def test_estimate_says_what_share_of_the_peak_it_priced(cli):
    # estimate reports the fraction of the peak its tensor-core times ran at (the sustained clock, after a
    # power cap), in the step-time caption and as time.sustained_fraction in --json.
    args = ("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--tp", "1", "--dp", "8", "--zero", "2")
    g = H100.gpu
    assert cli(*args, "--json").json()["time"]["sustained_fraction"] == g.sustained_clock_fraction
    capped = cli(*args, "--power-limit", "500", "--json").json()["time"]["sustained_fraction"]
    assert capped == pytest.approx(g.at_power_limit(500).sustained_clock_fraction)
    r = cli(*args)
    assert r.code == 0 and f"priced at {100 * g.sustained_clock_fraction:.1f}% of" in " ".join(r.out.split())


def test_equivalent_plans_collapse_into_one_row():
    score = np.array([3.0, 3.0, 2.0, 3.0, 1.0])
    memory = np.array([10.0, 10.0, 5.0, 20.0, 1.0]) * 2**30
    # equivalent to plan 0: the same score (to 1e-4) and memory (to 0.05 GiB) ...
    same = np.zeros(5, dtype=bool)
    assert list(equivalent(score, 3.0, memory, 10.0 * 2**30, same)) == [True, True, False, False, False]
    # ... or plan 0's layout at a higher ZeRO stage (plan 3: same time, more memory), never a slower one
    same[[3, 4]] = True
    assert list(equivalent(score, 3.0, memory, 10.0 * 2**30, same)) == [True, True, False, True, False]
    m, cluster = M["llama-3.1-405b"], ClusterSpec(system=H100, num_nodes=2048)
    w = Workload(global_batch=2048, seq_len=8192)
    res = search(m, cluster, default_space(m, cluster, w, {"tp": 8}), w, top=5)
    rows = [(float(e.throughput.tokens_per_s), float(e.memory.total) / 2**30) for e in res.ranked]
    for i, (t1, m1) in enumerate(rows):  # no two rows shown predict the same
        for t2, m2 in rows[i + 1:]:
            assert abs(t1 - t2) > 1e-4 * t1 or abs(m1 - m2) > 0.05
    assert len(res.equivalents) == len(res.ranked)


def test_search_explains_its_choice(cli):
    r = cli("search", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--nodes", "8", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    conv = doc["conventional"]["plan"]
    assert conv["tp"] == 8 and conv["cp"] == 1  # TP inside the node, PP across nodes, DP the rest
    vs = doc["explain"]["vs_conventional"]
    assert vs["throughput_ratio"] >= 1 and {"compute_s", "bubble_s", "exposed_tp_s", "memory_bytes"} <= set(vs)
    r = cli("search", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--nodes", "8", "--explain")
    assert "beats conventional" in r.out.replace("\n", " ") or "beats" in r.out


@st.composite
def plan_and_more_comm(draw):
    name = draw(st.sampled_from(["llama-3.1-8b", "llama-3.1-70b", "mixtral-8x7b", "gpt3-175b"]))
    m = M[name]
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.sampled_from([1, 2, 4]))
    ep = draw(st.sampled_from([1, 2, 4])) if m.is_moe else 1
    dp = 8 * ep
    plan = ParallelPlan(tp=tp, pp=pp, dp=dp, ep=ep, etp=1, sp=tp > 1, zero=draw(st.integers(0, 3)),
                        recompute=draw(st.sampled_from(["none", "selective", "full"])), global_batch=dp * 8,
                        tp_comm_overlap=draw(st.booleans()), ep_comm_overlap=draw(st.booleans()),
                        overlap_grad_reduce=draw(st.booleans()), overlap_param_gather=draw(st.booleans()))
    factors = {f.name: draw(st.floats(1.0, 5.0)) for f in dataclasses.fields(CommSeconds)
               if f.name not in ("dp_stages", "tp_edge_stages")}
    return m, plan, factors


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan_and_more_comm())
def test_more_communication_never_shortens_the_step(case):
    m, plan, factors = case
    cluster = ClusterSpec(system=H100, num_nodes=plan.num_gpus // 8)
    from llmplan.specs.check import check_plan

    assume(not check_plan(m, plan, cluster))
    e = estimate_training(m, cluster, plan)
    base = comm_seconds(e.comm, cluster.system)
    more = CommSeconds(**{k: getattr(base, k) * f for k, f in factors.items()},  # each stage's dp too
                       dp_stages=tuple((r * factors["dp_reduce"], g * factors["dp_gather"]) for r, g in base.dp_stages),
                       tp_edge_stages=tuple((s * factors["tp_edge"], a * factors["tp_edge_async"])
                                            for s, a in base.tp_edge_stages))  # each stage's TP edge too
    t0 = step_time(m, plan, cluster.system.gpu, base)
    t1 = step_time(m, plan, cluster.system.gpu, more)
    assert float(t1.total) >= float(t0.total) * (1 - 1e-12)


def _torchtitan_predictions(published_runs):
    import accuracy  # benchmarks/accuracy.py (conftest puts benchmarks/ on the path)
    from llmplan.specs.check import check_plan

    rows = {rid: r for rid, r in published_runs.items() if rid.startswith("torchtitan-")}
    assert len(rows) == 16
    pred = {}
    for rid, r in rows.items():
        assert accuracy.system_for(r["hardware"]["gpu"]) == "hgx-h100-96gb"
        plan = accuracy.plan_for(r, "torchtitan", r["hardware"]["gpus"])
        cluster = ClusterSpec(system=S["hgx-h100-96gb"], num_nodes=r["hardware"]["gpus"] // 8)
        assert check_plan(accuracy.model_for(r, "torchtitan"), plan, cluster) == [], rid
        (quantity, pred[rid], measured), (_, fits, _) = accuracy.predict(r, "torchtitan")
        assert quantity == "tok/s/GPU" and fits and measured == r["measured"]["tokens_per_s_per_gpu"]
    return rows, pred


def test_torchtitan_h100_runs_unseen_by_the_fit(published_runs):
    # torchtitan's December 2024 Llama 3.1 benchmarks (pytorch/torchtitan
    # benchmarks/llama3_h100_202412_torchtitan.md): H100 96 GB at 500 W, FSDP2 + TP + PP + CP, Float8, full
    # activation checkpointing. Every row is describable on the shipped hgx-h100-96gb profile at its power
    # cap; the pairs measured as alternatives for one job are ranked as measured (AsyncTP 876 > 829
    # tokens/s per GPU, Table 4; interleaved 1F1B 128 > 1F1B 100, Table 5; compile over eager, Tables 1 and 3).
    import accuracy  # benchmarks/accuracy.py (conftest puts benchmarks/ on the path)

    rows, pred = _torchtitan_predictions(published_runs)
    t = "torchtitan-2412-"
    assert pred[t + "t4-llama31-70b-256gpu-2d-asynctp"] > pred[t + "t4-llama31-70b-256gpu-2d"]
    assert pred[t + "t5-llama31-405b-512gpu-interleaved-1f1b"] > pred[t + "t5-llama31-405b-512gpu-1f1b"]
    for table, gpus in (("t1", 8), ("t3", 128)):
        rid = f"{t}{table}-llama31-8b-{gpus}gpu-fsdp"
        assert accuracy.plan_for(rows[rid], "torchtitan", gpus).recompute == "op"
        assert pred[rid + "-compile"] > pred[rid]


def test_torchtitan_h100_runs_within_tolerance(published_runs):
    # The 4D rows of Table 6 (16-76 tokens/s per GPU, sequences of 32k-256k tokens) within 10% each, and the
    # compiled rows of Tables 1 and 3 (bf16, op-level selective checkpointing: 6,667 and 6,514 tokens/s per GPU)
    # within 7.5%. Held while FA2 ran at 0.57 x the fitted 0.7 x the clock (0.6 of its published rate), which
    # offset a fast bias of every torchtitan row (the 405B PP rows, little attention, were +9% / +10% then) and
    # a CP-dependent cost of PyTorch's ring; at FA2's published rate: 405B CP1 / 2 / 4 / 8 +14 / +35 / +34 /
    # +53%, compiled 8B rows +13.9% / +15.7% (docs/validation.md#attention-clock); with PyTorch's ring priced
    # (cp_impl torch-allgather, docs/validation.md#torch-ring) CP 2 / 4 / 8 are +26 / +23 / +31%; at the H100
    # clock 0.825 (docs/validation.md#refit) CP 1 / 2 / 4 / 8 +9.6 / +22.5 / +20.6 / +29.1%, compiled 8B
    # +5.5 / +7.2%; with the ring traced by torch.compile, its transfers waited for where issued
    # (cp_comm_overlap off, docs/formulas.md#step.cp_compiled), CP 2 / 4 / 8 +9.8 / +0.2 / +8.1%.
    rows, pred = _torchtitan_predictions(published_runs)
    t = "torchtitan-2412-"
    for cp in (1, 2, 4, 8):
        rid = f"{t}t6-llama31-405b-512gpu-cp{cp}"
        assert pred[rid] == pytest.approx(rows[rid]["measured"]["tokens_per_s_per_gpu"], rel=0.10), rid
    for table, gpus in (("t1", 8), ("t3", 128)):
        rid = f"{t}{table}-llama31-8b-{gpus}gpu-fsdp-compile"
        assert pred[rid] == pytest.approx(rows[rid]["measured"]["tokens_per_s_per_gpu"], rel=0.075)


def test_automodel_h100_bf16_runs(published_runs):
    # NeMo AutoModel's H100 bf16 pre-training table (NVIDIA-NeMo/Automodel docs/performance-summary.mdx, recipes
    # in examples/llm_benchmark/): every scored row is describable and fits in 80 GB, as the runs did (Qwen3
    # 30B-A3B with EP8 FSDP8 only under FSDP's fp32 parameter shards: 76 GiB, 84 GiB with a bf16 shard beside
    # the master); the dense Llama 3.1 70B row (TP1 CP2 FSDP32, full recompute, 866.77 tokens/s per GPU) is
    # predicted within 5%.
    import accuracy  # benchmarks/accuracy.py (conftest puts benchmarks/ on the path)
    from llmplan.specs.check import check_plan

    rows = {rid: r for rid, r in published_runs.items() if rid.startswith("automodel-")}
    assert len(rows) == 3
    pred = {}
    for rid, r in rows.items():
        plan = accuracy.plan_for(r, "automodel", r["hardware"]["gpus"])
        assert plan.zero == 3 and plan.fp32_param_shards, rid
        cluster = ClusterSpec(system=S["dgx-h100"], num_nodes=r["hardware"]["gpus"] // 8)
        assert check_plan(accuracy.model_for(r, "automodel"), plan, cluster) == [], rid
        (quantity, pred[rid], measured), (_, fits, _) = accuracy.predict(r, "automodel")
        assert quantity == "tok/s/GPU" and fits, rid
    rid = "automodel-h100-bf16-llama3-70b-64gpu-gbs128"
    assert accuracy.plan_for(rows[rid], "automodel", 64).attention_kernel == "flash2"  # SDPA's flash under CP
    assert pred[rid] == pytest.approx(866.77, rel=0.10)  # within 5%: test_automodel_70b_row_within_5_percent


@pytest.mark.xfail(strict=True, reason="-6.7% (808.7 vs 866.77 tokens/s per GPU) at the refitted H100 clock "
                   "0.825 (docs/validation.md#refit): the row runs FA2 at its own published rate, so only the clock "
                   "moves it; -2.6% at the old 0.875. The clock fit splits the H100 rows: this one wants a higher "
                   "clock than the other H100 families. Read with PyTorch's allgather ring on the KV heads, as "
                   "AutoModel runs it (-6.6%, 809.7, under TE's ring: docs/validation.md#automodel-cp); its eager, "
                   "unfused fp32 merges are priced as fused")
def test_automodel_70b_row_within_5_percent(published_runs):
    # The dense Llama 3.1 70B row (TP1 CP2 FSDP32, 8k tokens, FA2 via SDPA): -4.7% while the fitted 0.7 held with
    # no rate curve, -6.1% under 0.57 x the fitted 0.7 (814.2 vs 866.77 tokens/s per GPU); within 5% at FA2's own
    # published H100 rate (GpuSpec.flash2_attention_efficiency, docs/formulas.md#compute.flash2_rate).
    import accuracy  # benchmarks/accuracy.py (conftest puts benchmarks/ on the path)

    (_, pred, _), *_ = accuracy.predict(published_runs["automodel-h100-bf16-llama3-70b-64gpu-gbs128"], "automodel")
    assert pred == pytest.approx(866.77, rel=0.05)


def tp_per_collective(m: object, p: ParallelPlan, bytes_: bool = False) -> dict[str, float]:
    """Calls (or bytes: calls x message) of each TP collective of one plan, summed over its transfers."""
    from llmplan.cost.comm import tp_transfers

    out: dict[str, float] = {}
    for t in tp_transfers(m, p, "tp"):
        out[t.collective] = out.get(t.collective, 0.0) + float(t.calls * (t.message if bytes_ else 1))
    return out


def test_dtensor_tp_sends_no_backward_regather():
    # Megatron-LM's SP linears all-gather their saved shard again in backward (2 all-gathers per layer and
    # micro-batch, Korthikanti et al. 2022 §4.2.2); DTensor TP saved the gathered input and sends none.
    m = M["llama-3.1-70b"]
    plan = ParallelPlan(tp=8, sp=True, dp=4, recompute="full", seq_len=8192, micro_batch=1, global_batch=32)
    meg, dt = tp_per_collective(m, plan), tp_per_collective(m, plan.model_copy(update={"tp_impl": "dtensor"}))
    layers = m.num_hidden_layers
    assert meg["all-gather"] - dt["all-gather"] == pytest.approx(plan.num_microbatches * layers * 2)
    assert meg["reduce-scatter"] == dt["reduce-scatter"]


def test_constant_fit_takes_each_family_median_over_its_clock_groups():
    # benchmarks/accuracy.py's leave-one-family-out fit: a family measured on two clock groups (MPT on A100 and
    # on H100) is scored by the median over both groups' records at each combination of the group clocks.
    import accuracy  # benchmarks/accuracy.py (conftest puts benchmarks/ on the path)

    na, nh = (len(accuracy.GRID[f"clock_{g}"]) for g in accuracy.CLOCK_GROUPS)
    ia, ih = 2, 5  # the clocks where each group's records are exact
    grid = {g: np.array(accuracy.GRID[f"clock_{g}"]) for g in accuracy.CLOCK_GROUPS}

    def errs(group: str, at: int, n: int) -> np.ndarray:  # |error| per clock (rows) and record (columns)
        return np.abs(grid[group] - grid[group][at])[:, None] * 100 + np.zeros((1, n))

    fams = {"mpt": {"a100": errs("a100", ia, 3), "h100": errs("h100", ih, 2)},
            "nemo2407": {"h100": errs("h100", ih, 4)}}
    med = accuracy.family_medians(fams)
    assert med["mpt"].shape == med["nemo2407"].shape == (na, nh)
    # Off by one step in the A100 group only: 3 of MPT's 5 records are one step (100 x the clock step points)
    # off, so the median is; one step off in the H100 group: 2 of 5, so it is not.
    step = {g: 100 * (grid[g][1] - grid[g][0]) for g in grid}
    assert med["mpt"][ia + 1, ih] == pytest.approx(step["a100"])
    assert med["mpt"][ia, ih + 1] == pytest.approx(0.0) and med["nemo2407"][ia, ih + 1] == pytest.approx(step["h100"])
    key = tuple((k, v[0]) for k, v in accuracy.GRID.items() if not k.startswith("clock_"))
    best, score = accuracy.best_fit({key: med}, {"mpt", "nemo2407"})
    assert score == pytest.approx(0.0)
    assert (best["clock_a100"], best["clock_h100"]) == (grid["a100"][ia], grid["h100"][ih])
    assert accuracy.score({key: med}, {**dict(key), "clock_a100": grid["a100"][ia + 1],
                                       "clock_h100": grid["h100"][ih]}, {"mpt"}) == {"mpt": pytest.approx(step["a100"])}


def _fit_from_records(errors: np.ndarray):
    """A one-family fit table and its jackknife from per-record |errors| (clock_a100, clock_h100, record)."""
    import accuracy

    key = tuple((k, v[0]) for k, v in accuracy.GRID.items() if not k.startswith("clock_"))
    return ({key: {"mpt": np.median(errors, axis=-1)}},
            {key: {"mpt": accuracy.jackknife_medians(errors)}})


def _jackknife_se(x: np.ndarray, y: np.ndarray) -> float:
    # The delete-one-record jackknife standard error of median(x) - median(y), by brute force.
    n = len(x)
    d = np.array([np.median(np.delete(x, i)) - np.median(np.delete(y, i)) for i in range(n)])
    return float(np.sqrt((n - 1) / n * ((d - d.mean()) ** 2).sum()))


def _ridge_records(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # 15 records: a spread base, and the same records with seeded noise (one per record) at the ridge's edge.
    base = 5 + np.linspace(-2, 2, 15)
    return base, base + np.random.default_rng(seed).normal(0, 1.0, 15), base + 4


def test_fit_ties_are_one_jackknife_standard_error_and_resolve_toward_the_shipped_values():
    # docs/validation.md#lofo-one-se: a ridge of clock_h100 values whose least (at its far end) is better by
    # less than one jackknife standard error of the difference (the SE computed here by brute force): the fit
    # takes the tied point nearest the shipped value (the prior). The same noise, drawn so that the edge is
    # better by more than one standard error, is a real optimum and is kept.
    import accuracy

    na, nh = (len(accuracy.GRID[f"clock_{g}"]) for g in accuracy.CLOCK_GROUPS)
    prior = accuracy.fit_prior()
    ph = accuracy.GRID["clock_h100"].index(prior["clock_h100"])
    assert ph >= 4  # the ridge below lies wholly under the shipped H100 clock
    for seed, tied in ((3, True), (17, False)):
        base, edge, far = _ridge_records(seed)
        gap, se = float(np.median(base) - np.median(edge)), _jackknife_se(edge, base)
        assert gap > 0 and (gap <= se) == tied  # the data are what the case says
        errors = np.broadcast_to(far, (na, nh, 15)).copy()
        errors[2, ph - 3:ph - 1] = base
        errors[2, ph - 4] = edge
        table, jack = _fit_from_records(errors)
        best, score = accuracy.best_fit(table, {"mpt"}, jackknife=jack, prior=prior)
        assert best["clock_a100"] == accuracy.GRID["clock_a100"][2]
        assert best["clock_h100"] == accuracy.GRID["clock_h100"][ph - 2 if tied else ph - 4]
        assert score == pytest.approx(float(np.median(base if tied else edge)))


def test_a_constant_the_fit_cannot_identify_is_held_at_its_shipped_value():
    # docs/validation.md#lofo, rule 3: no record informs the A100 clock (the records' errors do not vary along
    # it but for one point better by less than one jackknife standard error), so it is held at the shipped
    # value and named, whatever the H100 clock does; better by more than one standard error, it is taken.
    import accuracy

    na, nh = (len(accuracy.GRID[f"clock_{g}"]) for g in accuracy.CLOCK_GROUPS)
    prior = accuracy.fit_prior()
    for seed, held in ((3, True), (17, False)):
        base, edge, _ = _ridge_records(seed)
        errors = (np.abs(np.arange(nh) - 3.0)[None, :, None] + base[None, None, :]).repeat(na, axis=0)
        errors[0, 3] = edge
        table, jack = _fit_from_records(errors)
        fit = accuracy.fit_constants(table, {"mpt"}, prior, jackknife=jack)
        assert fit is not None and ("clock_a100" in fit.held) == held and "clock_h100" not in fit.held
        assert fit.consts["clock_a100"] == (prior["clock_a100"] if held else accuracy.GRID["clock_a100"][0])
        assert fit.consts["clock_h100"] == accuracy.GRID["clock_h100"][3]


def test_the_left_out_fit_s_prior_never_sees_the_left_out_families():
    # docs/validation.md#lofo-prior: the prior ties resolve toward is the published value where one exists
    # (PUBLISHED_PRIOR, on GRID at its nearest value) and otherwise the least point of the fold's own families;
    # a left-out family's errors, however they move, change neither the fold's prior nor its fit.
    import accuracy

    table = _two_source_table()
    grid = accuracy.GRID["clock_h100"]
    kept = {"mpt"}
    prior = accuracy.independent_prior(table, kept)
    assert prior["clock_h100"] == grid[8]  # mpt's own least, not the shipped H100 clock
    for k, v in accuracy.PUBLISHED_PRIOR.items():
        assert abs(prior[k] - v) <= min(abs(g - v) for g in accuracy.GRID[k]) + 1e-12
    fit = accuracy.fit_constants(table, kept)
    assert fit is not None and fit.prior == prior
    for far in (0, len(grid) - 1):  # the left-out source's families now exact at either end of the grid
        h = np.arange(len(grid), dtype=float)[None, :].repeat(len(accuracy.GRID["clock_a100"]), axis=0)
        moved = {key: {**fams, "bridge": np.abs(h - far), "mbridge-dense": np.abs(h - far)}
                 for key, fams in table.items()}
        assert accuracy.independent_prior(moved, kept) == prior
        refit = accuracy.fit_constants(moved, kept)
        assert refit is not None and refit.consts == fit.consts


def test_same_plan_across_sources_groups_one_plan_from_two_publishers(monkeypatch):
    # benchmarks/accuracy.py same_plan_across_sources (docs/validation.md#lofo-prior): runs of one plan are
    # reported together only when two sources (SOURCE_GROUPS) publish it; another layout, or the same plan from
    # one source only, is not a pair. Each row carries llmplan's signed error as predict gives it.
    import accuracy

    monkeypatch.setattr(accuracy, "predict", lambda rec, fam, consts=None: [
        ("tok/s/GPU", 1.1 * rec["measured"]["tokens_per_s_per_gpu"], rec["measured"]["tokens_per_s_per_gpu"]),
        ("fits", 1.0, 1.0)])

    def run(rid: str, tok: float, tp: int = 1) -> dict:
        return {"id": rid, "model": {"layers": 32, "hidden": 4096, "seq_len": 8192},
                "hardware": {"gpu": "H100 SXM", "gpus": 8},
                "parallel": {"tp": tp, "pp": 1, "cp": 2, "micro_batch": 1, "global_batch": 128, "precision": "fp8"},
                "measured": {"tokens_per_s_per_gpu": tok}}

    records = [run("megatron-a", 13812), run("nemo2407-b", 12273), run("nemocp-c", 12000), run("bridge-d", 9, tp=2),
               run("bridge-e", 5, tp=2)]
    out = accuracy.same_plan_across_sources(records)
    assert len(out) == 1
    key, rows = out[0]
    assert [r[0] for r in rows] == ["megatron-a", "nemo2407-b", "nemocp-c"] and key[5] == 1
    assert all(err == pytest.approx(10.0) for _, _, err in rows)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.integers(0, 6), min_size=2, max_size=9), st.integers(1, 3))
def test_jackknife_medians_are_the_medians_with_each_record_deleted(values: list[int], cols: int):
    # benchmarks/accuracy.py jackknife_medians (its closed form from the sorted records, ties included) against
    # numpy's median of the records left after each deletion.
    import accuracy

    errors = np.array([[v + c for v in values] for c in range(cols)], dtype=float)
    brute = np.stack([np.median(np.delete(errors, i, axis=-1), axis=-1) for i in range(len(values))], axis=-1)
    np.testing.assert_allclose(accuracy.jackknife_medians(errors), brute)
    errors[0, 0] = np.nan  # a record not predicted at one point: the NaN-aware path
    with warnings.catch_warnings():  # a deletion that leaves only the NaN has an all-NaN median, by design
        warnings.simplefilter("ignore", RuntimeWarning)
        brute = np.stack([np.nanmedian(np.delete(errors, i, axis=-1), axis=-1) for i in range(len(values))],
                         axis=-1)
    np.testing.assert_allclose(accuracy.jackknife_medians(errors), brute)


def test_only_dense_models_records_enter_the_constant_fit(published_records):
    # docs/validation.md#lofo, rule 1: by model structure, not by error.
    import accuracy

    runs = published_records
    moe = [r for r in runs if accuracy.family(r["id"]) == "mbridge-moe"]
    dense = [r for r in runs if accuracy.family(r["id"]) == "mbridge-dense"]
    assert moe and dense
    assert not any(accuracy.fit_row(r) for r in moe[:5]) and all(accuracy.fit_row(r) for r in dense[:5])


def test_megatron_core_r08_pipelined_rows_are_read_as_interleaved(published_runs):
    # ASSUMPTIONS["megatron"]: the r0.8 README overlaps pipeline communication, which r0.8 does only in the
    # interleaved schedule; one layer per virtual stage.
    import accuracy

    runs = published_runs
    r = runs["megatron-core-r0.8-weak-177b"]
    plan = accuracy.plan_for(r, "megatron", r["hardware"]["gpus"])
    assert (plan.pp, plan.vpp, plan.num_microbatches) == (6, 16, 24)
    flat = runs["megatron-core-r0.8-weak-32b"]
    flat_plan = accuracy.plan_for(flat, "megatron", flat["hardware"]["gpus"])
    assert flat_plan.vpp == 1
    # PP 1: the replica's 4 sequences (192 over DP 48) as one micro-batch; r0.8 reduces gradients only in the
    # last micro-batch's backward, so four micro-batches of 1 would leave most of the DP traffic exposed.
    assert (flat_plan.micro_batch, flat_plan.num_microbatches) == (4, 1)
    assert accuracy.clock_group(r) == "h100"


def test_fp8_over_bf16_speedup_matches_the_paired_mpt_runs(published_records):
    # The same llm-foundry run on 8 H100 in bf16 and in fp8 (MosaicML's tables, benchmarks/data): llmplan's
    # fp8 / bf16 throughput ratio is within 10% of the measured one for every pair (measured 1.00-1.35x).
    # This is the controlled test that rejected a separate sustained fraction for bf16 runs
    # (docs/validation.md#constants).
    import accuracy

    pairs = accuracy.precision_pairs(published_records)
    assert len(pairs) == 5
    for rid, pred, meas in pairs:
        assert abs(pred - meas) / meas < 0.10, (rid, pred, meas)


def test_chunked_tp_overlap_splits_the_gemms_as_transformer_engine_does():
    # Transformer Engine v1.8's default userbuffer methods (pytorch/module/base.py, initialize_ub): ring
    # exchange (one piece per TP rank) for the QKV / fc1 forward and the output-projection / fc2 input
    # gradient, a 4-way "pipeline" split for the output-projection / fc2 forward, bulk (whole) otherwise.
    # PyTorch's async TP splits every gathered or reduce-scattered matmul per rank, in both passes.
    on = dict(tp=8, sp=True, tp_comm_overlap=True)
    te, dt = ParallelPlan(**on), ParallelPlan(**on, tp_impl="dtensor")
    assert [float(x) for x in chunk_rows(te, 4096, "ag")] == [512, 4096]
    assert [float(x) for x in chunk_rows(te, 4096, "rs")] == [1024, 512]
    assert [float(x) for x in chunk_rows(dt, 4096, "ag")] == [512, 512]
    assert [float(x) for x in chunk_rows(dt, 4096, "rs")] == [512, 512]
    assert [float(x) for x in chunk_rows(ParallelPlan(tp=8, sp=True), 4096, "ag")] == [4096, 4096]
    assert [float(x) for x in chunk_rows(te, 4096, "")] == [4096, 4096]  # experts, routers: not TP-chunked

    # GPT-3 175B at TP8: a 4,096-token micro-batch split 8 ways runs its QKV forward as 512-row pieces whose
    # 144 output tiles alone fill 55% of two waves on 132 SMs (tile and wave quantisation). Transformer Engine
    # runs the pieces on 3 concurrent streams, so together they fill the waves as the whole GEMM does (rows in
    # whole 128-tiles: the same time, docs/formulas.md#compute.gemm_chunks); PyTorch's async TP runs them in
    # turn and pays each piece's waves; at 16 x 8,192 tokens its pieces are large and cost under 0.5%.
    m, gpu = M["gpt3-175b"], H100.gpu

    def ratio(**kw: object) -> float:
        split = sum(layer_gemm_seconds(m, ParallelPlan(**on, **kw), gpu, False))
        whole = sum(layer_gemm_seconds(m, ParallelPlan(tp=8, sp=True, **kw), gpu, False))
        return float(split / whole)

    assert abs(ratio(micro_batch=1, seq_len=4096) - 1) < 1e-9
    assert 1.05 < ratio(micro_batch=1, seq_len=4096, tp_impl="dtensor") < 1.3
    assert ratio(micro_batch=16, seq_len=8192, tp_impl="dtensor") < 1.005


def test_low_precision_tp_gathers_move_the_quantised_inputs():
    # Transformer Engine casts a GEMM input to fp8 before the sequence-parallel all-gather (v1.8
    # LayerNormLinear gathers the norm's fp8 output; grad_output_preprocess casts, then gathers), so with TE
    # every TP all-gather moves 1 byte per element and the reduce-scatters stay bf16. torchao's float8 TP casts
    # before the forward gathers (PrepareFloat8ModuleInput) and the output gradient before the backward ones
    # (Float8RowwiseParallel: NoopFwToFloat8BwDynamic, float8_tensor_parallel.py at eab345c); its rowwise
    # recipe gathers bf16.
    m = M["llama-3.1-70b"]
    base = ParallelPlan(tp=8, sp=True, dp=4, recompute="none", seq_len=8192, micro_batch=1, global_batch=32)

    def volume(p: ParallelPlan) -> dict[str, float]:
        return tp_per_collective(m, p, bytes_=True)

    bf16 = volume(base)
    fp8 = volume(base.model_copy(update={"dtype": "fp8"}))
    assert fp8["all-gather"] == pytest.approx(bf16["all-gather"] / 2)
    assert fp8["reduce-scatter"] == pytest.approx(bf16["reduce-scatter"])
    # DTensor: 2 forward gathers per layer and 2 backward gathers of output gradients, all in fp8.
    dt = {"tp_impl": "dtensor", "dtype": "fp8"}
    dt_bf16, dt_fp8 = volume(base.model_copy(update={"tp_impl": "dtensor"})), volume(base.model_copy(update=dt))
    assert dt_fp8["all-gather"] == pytest.approx(dt_bf16["all-gather"] / 2)
    rowwise = volume(base.model_copy(update={"dtype": "fp8", "recipe": "rowwise"}))
    assert rowwise["all-gather"] == pytest.approx(bf16["all-gather"])


def test_source_groups_put_one_publishers_families_together():
    # docs/validation.md#lofo-source: Megatron-Bridge's performance tables and verification cards are one
    # source (NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md, examples/model_verification_cards).
    import accuracy

    bridge = {"bridge", "mbridge-dense", "mbridge-moe", "bridgecard"}
    assert all(set(accuracy.source_group(f)) == bridge for f in bridge)
    grouped = [f for g in accuracy.SOURCE_GROUPS.values() for f in g]
    assert len(grouped) == len(set(grouped)) and set(grouped) <= set(accuracy.FAMILIES)
    assert accuracy.source_group("mpt") == ("mpt",)


def _two_source_table():
    # bridge and mbridge-dense (one source) are exact at H100 clock index 2, mpt at index 8 and weakly so:
    # any fit that keeps mbridge-dense lands at 2, one on mpt alone at 8.
    import accuracy

    na, nh = (len(accuracy.GRID[f"clock_{g}"]) for g in accuracy.CLOCK_GROUPS)
    h = np.arange(nh, dtype=float)[None, :].repeat(na, axis=0)
    key = tuple((k, v[0]) for k, v in accuracy.GRID.items() if not k.startswith("clock_"))
    return {key: {"bridge": np.abs(h - 2), "mbridge-dense": np.abs(h - 2), "mpt": 0.5 * np.abs(h - 8)}}


def test_left_out_fit_leaves_the_whole_source_out(monkeypatch):
    # docs/validation.md#lofo-source: bridge left out alone is fitted on mbridge-dense, which shares its source
    # and its bias, so it looks exact; left out with its source it is scored under the fit on mpt.
    import accuracy

    monkeypatch.setattr(accuracy, "TRAIN_FAMILIES", ("bridge", "mbridge-dense", "mpt"))
    table = _two_source_table()
    grid = accuracy.GRID["clock_h100"]
    alone = {f: (fit.consts["clock_h100"], left) for f, fit, left, _ in accuracy.lofo(table, table, by_source=False)}
    source = {f: (fit.consts["clock_h100"], left) for f, fit, left, _ in accuracy.lofo(table, table)}
    assert alone["bridge"] == (grid[2], pytest.approx(0.0))
    assert source["bridge"] == (grid[8], pytest.approx(6.0)) and source["mbridge-dense"] == source["bridge"]
    assert source["mpt"] == alone["mpt"] == (grid[2], pytest.approx(3.0))


def test_interval_residual_constants_leave_the_source_out(monkeypatch):
    # benchmarks/intervals.py: the constants a record's residual is computed under are fitted without its
    # source, scored-only families too (bridgecard is never fitted, but its source's families are).
    import accuracy
    import intervals as bench

    table = _two_source_table()
    monkeypatch.setattr(accuracy, "TRAIN_FAMILIES", ("bridge", "mbridge-dense", "mpt"))
    monkeypatch.setattr(accuracy, "fit_tables", lambda records: (table, table, None))
    consts = bench.lofo_constants([], None)
    grid = accuracy.GRID["clock_h100"]
    assert consts["_all"]["clock_h100"] == grid[2]
    assert consts["bridgecard"]["clock_h100"] == consts["bridge"]["clock_h100"] == grid[8]
    assert consts["mpt"]["clock_h100"] == grid[2] and consts["dgxc"] == consts["_all"]
