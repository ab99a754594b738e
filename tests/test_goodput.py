"""Goodput at scale (issue 38): failures, checkpoints and restarts. Golden tests against published numbers,
exact formulas, properties (seeded), the search's vectorised path against the scalar one, and the CLI."""

from __future__ import annotations

from itertools import islice
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.goodput import (checkpoint_job_bytes, checkpoint_rank_bytes, daly_interval, goodput_shares,
                                  job_failure_rate, plan_goodput, storage_seconds, young_interval)
from llmplan.estimate import estimate_training
from llmplan.search.grid import Workload, default_space, enumerate_plans
from llmplan.search.run import search
from llmplan.search.ties import apart
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems
from llmplan.specs.resilience import CheckpointPolicy
from llmplan.units import GB

M = builtin_models()
S = builtin_systems()


def llama3_405b_plan(dp: int = 128) -> ParallelPlan:
    """Llama 3 405B's 16K-GPU layout (Dubey et al. 2024, Table 4: TP 8, CP 1, PP 16, DP 128, 16M tokens of
    8,192-token sequences per step)."""
    return ParallelPlan(tp=8, pp=16, dp=dp, cp=1, sp=True, zero=1, recompute="none", micro_batch=1,
                        global_batch=2048, seq_len=8192, pp_first=7, pp_last=7)


def test_llama3_405b_on_16k_h100_meets_the_published_interruption_rate_and_goodput():
    """Dubey et al. 2024 (The Llama 3 Herd of Models, Section 3.3.4): 466 job interruptions in 54 days of
    pre-training on 16,384 H100 (one every 2.8 h; 419 unexpected), "higher than 90% effective training time".
    The default failure rates are the paper's Table 5 counts spread over GPUs, hosts and NICs, so the MTBF
    checks that arithmetic; the goodput (checkpoint, restart and lost work) is the model's and must land within
    the issue's 85-98% band."""
    cluster = ClusterSpec(system=S["dgx-h100"], num_nodes=2048)
    e = estimate_training(M["llama-3.1-405b"], cluster, llama3_405b_plan())
    g = e.goodput
    published_h = 54 * 24 / 466
    assert published_h / 1.5 <= g.mtbf_s / 3600 <= published_h * 1.5
    assert 0.85 <= g.useful <= 0.98
    assert g.total == pytest.approx(1.0, abs=1e-12)


def test_checkpoint_bytes_are_weights_and_adam_state_once_per_job():
    """Mixed-precision Adam keeps 2 + 12 bytes of checkpointed state per parameter (Rajbhandari et al. 2020,
    ZeRO, Section 3.1: 16 bytes of model states, of which the 2 bytes of gradients are not saved); data-parallel
    replicas write one copy, so the ranks' shares add up to the job's bytes."""
    m, plan = M["llama-3.1-405b"], llama3_405b_plan()
    job = checkpoint_job_bytes(m, plan)
    assert job == pytest.approx(14 * 405.85e9, rel=2e-3)
    # 16,384 ranks each writing the busiest stage's share: at most the padded vocabulary above the job's bytes
    assert job <= checkpoint_rank_bytes(m, plan) * plan.num_gpus <= 1.02 * job
    fsdp = plan.model_copy(update={"zero": 3, "fp32_param_shards": True, "pp": 1, "dp": 2048, "tp": 8,
                                   "pp_first": 0, "pp_last": 0})
    assert checkpoint_job_bytes(m, fsdp) == pytest.approx(12 / 14 * job)


def test_checkpoint_time_is_bytes_over_the_slower_of_node_and_aggregate_bandwidth():
    m = M["llama-3.1-405b"]
    plan = llama3_405b_plan()
    big = ClusterSpec(system=S["dgx-h100"], num_nodes=2048)
    job, rank = checkpoint_job_bytes(m, plan), checkpoint_rank_bytes(m, plan)
    # 2,048 nodes x 20 GB/s = 41 TB/s: the storage's 2 TB/s aggregate limits (Llama 3, Section 3.3.1)
    assert storage_seconds(job, rank, big) == pytest.approx(job / (2000 * GB), rel=1e-12)
    faster = big.model_copy(update={"system": big.system.model_copy(update={"checkpoint_gb_per_s": 4000.0})})
    assert storage_seconds(job, rank, faster) == pytest.approx(job / (4000 * GB), rel=1e-12)
    # 8 nodes: each node's 20 GB/s limits; balanced shards write the job's bytes over 8 x 20 GB/s
    small = ClusterSpec(system=S["dgx-h100"], num_nodes=8)
    m70 = M["llama-3.1-70b"]
    p70 = ParallelPlan(tp=8, pp=1, dp=8, sp=True, zero=1, micro_batch=1, global_batch=64, seq_len=4096)
    j70, r70 = checkpoint_job_bytes(m70, p70), checkpoint_rank_bytes(m70, p70)
    assert storage_seconds(j70, r70, small) == pytest.approx(r70 * 8 / (20 * GB), rel=1e-12)
    assert storage_seconds(j70, r70, small) == pytest.approx(j70 / (8 * 20 * GB), rel=0.02)


def test_young_and_daly_intervals_are_exact():
    """Young 1974: sqrt(2 C M). Daly 2006, Eq. 37: sqrt(2CM)[1 + sqrt(C/2M)/3 + (C/2M)/9] - C for C < 2M, else M.
    C = 300 s, M = 1 day: sqrt(2 x 300 x 86,400) = 7,200 s; C/2M = 1/576."""
    assert young_interval(300.0, 86400.0) == pytest.approx(7200.0, rel=1e-15)
    assert daly_interval(300.0, 86400.0) == pytest.approx(7200 * (1 + 1 / 72 + 1 / 5184) - 300, rel=1e-15)
    assert daly_interval(300.0, 86400.0) == pytest.approx(7001.388888888889, rel=1e-12)
    assert daly_interval(500.0, 200.0) == 200.0  # C >= 2M: checkpoint once per MTBF


def test_goodput_shares_by_hand():
    # one failure per 10,000 s costing 495 s of restart and 505 s of lost work: 10% of the time down; the
    # remaining 90% split 1000 : 10 between training and checkpointing
    useful, ckpt, lost, restart = goodput_shares(1000.0, 10.0, 505.0, 495.0, 1e-4)
    assert useful == pytest.approx(0.9 * 1000 / 1010, rel=1e-12)
    assert ckpt == pytest.approx(0.9 * 10 / 1010, rel=1e-12)
    assert (lost, restart) == (pytest.approx(0.0505), pytest.approx(0.0495))
    assert goodput_shares(1000.0, 10.0, 505.0, 495.0, 0.0) == (pytest.approx(1000 / 1010), pytest.approx(10 / 1010),
                                                              0.0, 0.0)
    # a failure faster than the job recovers: nothing trains
    assert goodput_shares(1000.0, 10.0, 5e4, 5e4, 1e-4)[0] == 0.0


def test_job_failure_rate_adds_gpus_hosts_and_nics():
    s = S["dgx-h100"]
    per_hour = 16384 * s.gpu.failures_per_gpu_hour + 2048 * s.failures_per_node_hour + 16384 * s.failures_per_nic_hour
    assert job_failure_rate(s, 16384, 2048) == pytest.approx(per_hour / 3600, rel=1e-12)
    # Table 5's 419 unexpected interruptions in 54 days
    assert per_hour * 54 * 24 == pytest.approx(419, rel=0.01)
    assert job_failure_rate(s, 1000, 125, per_gpu_hour=1e-5) == pytest.approx(1000 * 1e-5 / 3600)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(name=st.sampled_from(["llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b"]),
       rate=st.floats(1e-7, 1e-3), mode=st.sampled_from(["sync", "async", "memory"]),
       k=st.integers(0, 9), storage=st.sampled_from([50.0, 2000.0, 20000.0]))
def test_goodput_falls_with_gpu_count_at_a_fixed_per_gpu_failure_rate(name, rate, mode, k, storage):
    m = M[name]
    system = S["dgx-h100"].model_copy(update={"checkpoint_gb_per_s": storage})
    policy = CheckpointPolicy(mode=mode, failures_per_gpu_hour=rate)

    def at(nodes: int) -> float:
        plan = ParallelPlan(tp=8, pp=1, dp=nodes, sp=True, zero=1, micro_batch=1, global_batch=4096, seq_len=4096)
        return float(plan_goodput(m, ClusterSpec(system=system, num_nodes=nodes), plan, 5.0, policy).useful)

    assert at(2 ** (k + 1)) <= at(2 ** k) + 1e-12


@settings(max_examples=40, deadline=None, derandomize=True)
@given(interval=st.floats(1.0, 1e6), blocking=st.floats(0.0, 1e4), lost=st.floats(0.0, 1e6),
       restart=st.floats(0.0, 1e5), rate=st.floats(0.0, 1e-2))
def test_goodput_shares_sum_to_one(interval, blocking, lost, restart, rate):
    shares = goodput_shares(interval, blocking, lost, restart, rate)
    assert sum(shares) == pytest.approx(1.0, abs=1e-9)
    assert all(s >= -1e-12 for s in shares)


def test_async_and_memory_checkpoints_block_less_than_sync():
    cluster = ClusterSpec(system=S["dgx-h100"], num_nodes=2048)
    m, plan = M["llama-3.1-405b"], llama3_405b_plan()
    g = {mode: plan_goodput(m, cluster, plan, 9.0, CheckpointPolicy(mode=mode)) for mode in ("sync", "async", "memory")}
    assert g["async"].blocking_s < g["sync"].blocking_s
    assert g["sync"].useful < g["async"].useful <= g["memory"].useful
    assert g["memory"].restart_s < g["async"].restart_s  # read back from a peer's memory, not from storage
    fixed = plan_goodput(m, cluster, plan, 9.0, CheckpointPolicy(interval_s=3600.0))
    assert fixed.interval_s == 3600.0 and fixed.useful < g["sync"].useful  # the optimum beats an hourly save


def test_vectorised_goodput_agrees_with_scalar():
    m, cluster = M["llama-3.1-405b"], ClusterSpec(system=S["dgx-h100"], num_nodes=64)
    w = Workload(global_batch=1024, seq_len=4096)
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    rng = np.random.default_rng(11)
    valid = (int(i) for i in rng.permutation(len(plans)) if not check_plan(m, plans.plan(int(i)), cluster))
    idx = list(islice(valid, 30))  # lazily: the first 30 valid plans of the permutation
    step = np.linspace(1.0, 30.0, len(idx))
    policy = CheckpointPolicy(mode="async")
    vec = plan_goodput(m, cluster, plans.take(np.asarray(idx)), step, policy)
    for j, i in enumerate(idx):
        one = plan_goodput(m, cluster, plans.plan(i), float(step[j]), policy)
        for f in ("useful", "checkpointing", "lost_work", "restarting", "rank_bytes", "interval_s", "restart_s"):
            assert float(np.asarray(getattr(vec, f))[j] if np.ndim(getattr(vec, f)) else getattr(vec, f)) == \
                pytest.approx(float(getattr(one, f)), rel=1e-9), f


def test_time_to_train_search_ranks_by_goodput_adjusted_tokens():
    """The search's time-to-train score is tokens/s x goodput of its scalar estimates; a failure rate that
    makes goodput depend on the plan can reorder plans against throughput."""
    m, cluster = M["llama-3.1-70b"], ClusterSpec(system=S["dgx-h100"], num_nodes=8)
    w = Workload(global_batch=256, seq_len=4096)
    policy = CheckpointPolicy(mode="async", failures_per_gpu_hour=2e-3)
    res = search(m, cluster, default_space(m, cluster, w), w, "time-to-train", top=5, checkpoint=policy)
    eff = [float(e.throughput.tokens_per_s * e.goodput.useful) for e in res.ranked]
    assert all(e.checkpoint == policy for e in res.ranked)
    # a plan is shown above a faster one only when the two are tied, pairwise: within the resolution of each
    # other (search.ties.resolve), not through a third plan (before: #1 was 4.1% below #2, tied with it only
    # through #4); so the best ranks first or is tied with #1
    assert res.resolution is not None
    for u in range(len(eff)):
        for lo in range(u + 1, len(eff)):
            if eff[lo] > eff[u]:
                assert apart(res.ranked[u], res.ranked[lo]) <= res.resolution, (u + 1, lo + 1)
                assert lo + 1 in res.tied_with[u]
    best = eff.index(max(eff)) + 1
    assert best == 1 or best in res.tied_with[0]
    assert all(0 < float(e.goodput.useful) < 1 for e in res.ranked)


ESTIMATE = ["estimate", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--nodes", "8", "--tp", "8",
            "--zero", "1", "--global-batch", "64", "--seq-len", "4096"]


def test_estimate_prints_the_goodput_line_in_80_columns(cli):
    r = cli(*ESTIMATE)
    assert r.code == 0, r.err
    lines = [ln for ln in r.out.splitlines() if "goodput" in ln or "checkpoint " in ln]
    assert any(ln.startswith("goodput ") and "MTBF" in ln and "1T tokens in" in ln for ln in lines)
    assert any("every" in ln and "restart" in ln for ln in lines)
    assert all(len(ln) <= 80 for ln in lines)


def test_estimate_json_goodput_keys(cli):
    doc = cli(*ESTIMATE, "--json").json()
    g = doc["goodput"]
    assert set(g) >= {"mtbf_h", "checkpoint_bytes", "checkpoint_s", "interval_s", "restart_s", "goodput"}
    assert 0 < g["goodput"] < 1 and g["mode"] == "sync"
    assert sum(g["shares"].values()) == pytest.approx(1.0)
    assert g["effective_tokens_per_s"] == pytest.approx(doc["throughput"]["tokens_per_s"] * g["goodput"])
    assert g["effective_days_per_trillion_tokens"] == pytest.approx(1e12 / g["effective_tokens_per_s"] / 86400)
    fast = cli(*ESTIMATE, "--json", "--checkpoint", "async", "--checkpoint-interval", "600").json()["goodput"]
    assert fast["mode"] == "async" and fast["interval_s"] == 600
    none = cli(*ESTIMATE, "--json", "--failure-rate", "0").json()["goodput"]
    assert none["mtbf_h"] is None and none["shares"]["restarting"] == 0


@pytest.mark.parametrize("flag,value,needle", [("--checkpoint", "often", "--checkpoint often"),
                                               ("--checkpoint-interval", "-5", "--checkpoint-interval -5"),
                                               ("--failure-rate", "2", "--failure-rate 2"),
                                               ("--failure-rate", "nan", "--failure-rate nan")])
def test_bad_goodput_options_exit_2_with_one_line(cli, flag, value, needle):
    assert needle in cli(*ESTIMATE, flag, value).refusal()


def test_search_budget_carries_the_effective_time_to_train(cli):
    r = cli("search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "2", "--objective",
            "time-to-train", "--top", "2", "--json")
    assert r.code == 0, r.err
    plan = r.json()["plans"][0]
    b, g = plan["budget"], plan["goodput"]
    assert b["effective_time_to_train_s"] == pytest.approx(b["time_to_train_s"] / g["goodput"])
    assert math.isclose(b["goodput"], g["goodput"])


def test_advice_offers_the_checkpointing_changes_that_raise_goodput():
    from llmplan.advice import advise_training

    cluster = ClusterSpec(system=S["dgx-h100"], num_nodes=2048)
    plan = llama3_405b_plan().model_copy(update={"recompute": "full", "vpp": 2})
    e = estimate_training(M["llama-3.1-405b"], cluster, plan)
    items = {a.flags: a for a in advise_training(e)}
    a = items[("--checkpoint", "async")]
    assert a.predicted["goodput"] > float(e.goodput.useful)
    assert a.gain == pytest.approx(a.predicted["goodput"] / float(e.goodput.useful) - 1)
    assert a.predicted["tokens_per_s"] == pytest.approx(float(e.throughput.tokens_per_s))  # the step is unchanged
    hourly = estimate_training(M["llama-3.1-405b"], cluster, plan, checkpoint=CheckpointPolicy(mode="async",
                                                                                            interval_s=36000.0))
    flags = [x.flags for x in advise_training(hourly)]
    assert any(f[0] == "--checkpoint-interval" and float(f[1]) < 36000 for f in flags)


def test_a_cluster_profile_overrides_the_failure_rates_and_storage(cli, tmp_path):
    prof = tmp_path / "my-h100.yaml"
    prof.write_text("base: dgx-h100\nfailures_per_node_hour: 2.0e-4\ncheckpoint_gb_per_s: 100\n"
                    "gpu:\n  failures_per_gpu_hour: 5.0e-5\n")
    ours = cli(*ESTIMATE[:4], str(prof), *ESTIMATE[5:], "--json").json()["goodput"]
    base = cli(*ESTIMATE, "--json").json()["goodput"]
    s = S["dgx-h100"]
    assert ours["mtbf_h"] == pytest.approx(1 / (64 * 5e-5 + 8 * 2e-4 + 64 * s.failures_per_nic_hour), rel=1e-12)
    assert ours["mtbf_h"] < base["mtbf_h"] and ours["goodput"] < base["goodput"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: dgx-h100\ncheckpoint_gb_per_s: -1\n")
    r = cli(*ESTIMATE[:4], str(bad), *ESTIMATE[5:])
    assert r.code == 2 and "checkpoint_gb_per_s" in r.err and "Traceback" not in r.err


@settings(max_examples=30, deadline=None, derandomize=True)
@given(nodes=st.sampled_from([8, 64, 512, 2048]), bw=st.floats(10.0, 1e4), restart=st.floats(0.0, 3600.0),
       mode=st.sampled_from(["sync", "async", "memory"]))
def test_faster_storage_never_lowers_and_slower_restarts_never_raise_goodput(nodes, bw, restart, mode):
    m = M["llama-3.1-70b"]
    plan = ParallelPlan(tp=8, pp=1, dp=nodes, sp=True, zero=1, micro_batch=1, global_batch=4096, seq_len=4096)
    policy = CheckpointPolicy(mode=mode)

    def at(**keys: float) -> float:
        system = S["dgx-h100"].model_copy(update={"checkpoint_gb_per_s": bw, "restart_overhead_s": restart, **keys})
        return float(plan_goodput(m, ClusterSpec(system=system, num_nodes=nodes), plan, 5.0, policy).useful)

    assert at(checkpoint_gb_per_s=2 * bw) >= at() - 1e-12
    assert at(restart_overhead_s=restart + 600) <= at() + 1e-12
