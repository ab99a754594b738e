"""What the fitted per-step constant stood for, priced from the plan (issue 32, "No fitted fixed cost standing
in for physics", "Data-parallel scaling"): the exposed DP buckets, the host's launches, the stragglers of a
large job; and that more data-parallel replicas at fixed per-replica work never raise tokens/s per GPU."""

from __future__ import annotations

from itertools import islice
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from llmplan.cost.comm import comm_seconds
from llmplan.cost.step import (
    BUCKET_PARAMS, GPU_SPEED_SPREAD, bucket_share, expected_max_normal, host_seconds, step_time,
)
from llmplan.estimate import estimate_training
from llmplan.search.evaluate import evaluate
from llmplan.search.grid import Workload, default_space, enumerate_plans
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M, S = builtin_models(), builtin_systems()
H100 = S["dgx-h100"]


def test_shipped_profiles_carry_no_fixed_step_constant():
    # The 0.15 s fitted constant is gone (issue 32 target: gone, or at most 0.02 s with a measured source).
    assert all(s.gpu.step_overhead_s == 0.0 for s in S.values())


def test_overheads_sum_to_overhead_and_reach_the_json(cli):
    m = M["llama-3.1-8b"]
    plan = ParallelPlan(tp=2, dp=8, global_batch=64, seq_len=4096)
    e = estimate_training(m, ClusterSpec(system=H100, num_nodes=2), plan)
    assert set(e.time.overheads) == {"host", "stragglers", "measured", "grad_buffer", "zero3_copy_out",
                                       "mxfp8_param_unstage", "pp_sync", "geglu_offset_sync",
                                       "mxfp8_master_cast"}
    assert sum(float(v) for v in e.time.overheads.values()) == pytest.approx(float(e.time.overhead))
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "2", "--tp", "2",
            "--global-batch", "64", "--json")
    assert r.code == 0, r.err
    t = r.json()["time"]
    assert t["overhead_s"] == pytest.approx(sum(t["overheads_s"].values()))  # the old key kept, the parts added
    assert t["overheads_s"]["measured"] == 0.0


def test_a_measured_fleet_overhead_is_still_added():
    m = M["llama-3.1-8b"]
    plan = ParallelPlan(dp=8, global_batch=64, seq_len=4096)
    fleet = H100.model_copy(update={"gpu": H100.gpu.model_copy(update={"step_overhead_s": 0.05})})
    a = estimate_training(m, ClusterSpec(system=H100, num_nodes=1), plan)
    b = estimate_training(m, ClusterSpec(system=fleet, num_nodes=1), plan)
    assert float(b.time.total - a.time.total) == pytest.approx(0.05)
    assert float(b.time.overheads["measured"]) == 0.05


@pytest.mark.parametrize("n,exact,rel", [(1, 0.0, 0.0), (2, 0.56419, 0.05), (10, 1.53875, 0.01),
                                         (100, 2.50759, 0.01), (1000, 3.24144, 0.01)])
def test_expected_max_of_normals_against_the_tables(n, exact, rel):
    # Exact expected largest of n standard normals (Harter 1961, "Expected values of normal order statistics",
    # Biometrika 48; E[max of 2] = 1/sqrt(pi)); Blom's approximation is within 5% at 2 and 1% from 10 on.
    assert float(expected_max_normal(n)) == pytest.approx(exact, rel=rel, abs=1e-12)
    arr = expected_max_normal(np.array([n, 1, n]))
    assert arr.shape == (3,) and float(arr[0]) == float(expected_max_normal(n)) and float(arr[1]) == 0.0


def test_stragglers_grow_with_log_of_the_gpu_count():
    # The straggler share of the busy time is spread x E[max of N]: 0 on one GPU, about 2.8% at 64 GPUs
    # and 4.6% at 12,288 (it never decreases, and grows as sqrt(2 ln N)).
    shares = [GPU_SPEED_SPREAD * float(expected_max_normal(n)) for n in (1, 8, 64, 1024, 12288)]
    assert shares[0] == 0.0
    assert shares == sorted(shares)
    assert 0.027 < shares[2] < 0.029 and 0.045 < shares[4] < 0.047


def test_last_bucket_is_exposed_even_when_the_reduction_fits_the_window():
    # Megatron-Core's default bucket is max(40M, 1M x dp) parameters: a 70B TP8 PP4 stage (about 2.2B params)
    # at dp 8 has its last 40M-parameter bucket's reduction exposed, even with the whole backward to hide in.
    m = M["llama-3.1-70b"]
    plan = ParallelPlan(tp=8, pp=4, dp=8, global_batch=256, seq_len=4096)
    e = estimate_training(m, ClusterSpec(system=H100, num_nodes=32), plan)
    share = float(bucket_share(plan, e.memory.params_on_rank))
    assert share == pytest.approx(BUCKET_PARAMS / float(e.memory.params_on_rank))
    cs = comm_seconds(e.comm, H100)
    assert float(e.time.exposed["dp"]) >= share * (cs.dp_reduce + cs.dp_gather) * (1 - 1e-9)
    big = plan.model_copy(update={"dp": 128, "global_batch": 4096})
    assert float(bucket_share(big, e.memory.params_on_rank)) == pytest.approx(128e6 / float(e.memory.params_on_rank))


def test_host_launches_wait_only_where_the_gpu_outruns_the_host():
    plan = ParallelPlan(dp=1, global_batch=8, seq_len=4096)
    start = float(host_seconds(plan, 32, 1.0, 0))  # a long micro-batch: only the step start's first layer
    assert 0 < start < 1e-3
    short = float(host_seconds(plan, 32, 1e-3, 0))  # a 1 ms micro-batch of 32 layers: launch-bound
    assert short > start + 8 * 1e-3


def test_blocking_launches_idle_the_gpu_for_every_kernel_however_long_the_micro_batch():
    # CUDA_LAUNCH_BLOCKING=1 (CUDA C++ Programming Guide): nothing is queued, so even a long micro-batch pays,
    # per kernel, the host's wake-up, its next op and the launch: (12 + 2 TP) kernels x (3 + 1 recompute)
    # passes x 32 layers, 8 micro-batches.
    from llmplan.cost.compute import KERNEL_LAUNCH_S
    from llmplan.cost.moe import EAGER_OP_HOST_S, HOST_SYNC_S

    plan = ParallelPlan(tp=2, dp=1, global_batch=8, seq_len=4096, recompute="full")
    queued = float(host_seconds(plan, 32, 1.0, 1))
    blocking = float(host_seconds(plan.model_copy(update={"launch_blocking": True}), 32, 1.0, 1))
    kernels = (12 + 2) * (3 + 1) * 32 * plan.num_microbatches
    assert blocking - queued == pytest.approx(kernels * (HOST_SYNC_S + EAGER_OP_HOST_S + KERNEL_LAUNCH_S))


def test_vectorised_overheads_agree_with_scalar():
    m, cluster = M["llama-3.1-70b"], ClusterSpec(system=H100, num_nodes=8)
    w = Workload(global_batch=256, seq_len=4096)
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    rng = np.random.default_rng(11)
    valid = (int(i) for i in rng.permutation(len(plans)) if not check_plan(m, plans.plan(int(i)), cluster))
    idx = list(islice(valid, 25))  # lazily: the first 25 valid plans of the permutation
    vec = evaluate(m, cluster, plans.take(np.asarray(idx)))
    for j, i in enumerate(idx):
        scalar = estimate_training(m, cluster, plans.plan(i))
        for k, v in scalar.time.overheads.items():
            assert float(np.asarray(vec.step.overheads[k])[j]) == pytest.approx(float(v), rel=1e-9, abs=1e-15), k
        assert float(vec.step.exposed["dp"][j]) == pytest.approx(float(scalar.time.exposed["dp"]), rel=1e-9,
                                                                  abs=1e-15)


@st.composite
def replicated(draw):
    name = draw(st.sampled_from(["llama-3.1-8b", "llama-3.1-70b", "mixtral-8x7b"]))
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.sampled_from([1, 2, 4]))
    dp = draw(st.sampled_from([1, 2, 4, 8, 16]))
    more = draw(st.sampled_from([2, 4, 8]))
    n = draw(st.sampled_from([1, 4, 8]))
    plan = ParallelPlan(tp=tp, pp=pp, dp=dp, micro_batch=1, global_batch=dp * n, seq_len=4096,
                        zero=draw(st.sampled_from([0, 1, 2, 3])), sp=tp > 1,
                        recompute=draw(st.sampled_from(["none", "selective", "full"])),
                        overlap_grad_reduce=draw(st.booleans()), overlap_param_gather=draw(st.booleans()))
    return M[name], plan, more


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(replicated())
def test_more_replicas_at_fixed_per_replica_work_never_raise_tokens_per_gpu(case):
    """Issue 32's property: the same replica (layout, micro-batches) repeated `more` times over more GPUs.
    Every time that grows with the DP degree (the collectives' bus factor and ring latencies, the exposed last
    bucket, the slowest of more GPUs) may only slow it. The one part that shrinks, the optimizer step of a
    ZeRO shard that is 1/dp of the parameters, is taken out: it is less work per GPU, not a faster step."""
    m, plan, more = case
    big = plan.model_copy(update={"dp": plan.dp * more, "global_batch": plan.global_batch * more})
    gpn = 8
    small_c = ClusterSpec(system=H100, num_nodes=max(1, plan.num_gpus // gpn), gpus_per_node=min(gpn, plan.num_gpus))
    big_c = ClusterSpec(system=H100, num_nodes=max(1, big.num_gpus // gpn), gpus_per_node=min(gpn, big.num_gpus))
    assume(not check_plan(m, plan, small_c) and not check_plan(m, big, big_c))
    a, b = estimate_training(m, small_c, plan), estimate_training(m, big_c, big)
    per_gpu_a = float(a.throughput.tokens_per_s) / plan.num_gpus
    per_gpu_b = float(b.throughput.tokens_per_s) / big.num_gpus
    if plan.zero == 0:
        assert per_gpu_b <= per_gpu_a * (1 + 1e-12)
    assert float(b.time.total - b.time.optimizer) >= float(a.time.total - a.time.optimizer) * (1 - 1e-12)


def test_zero3_pipeline_step_parts_sum_to_the_step():
    m = M["llama-3.1-70b"]
    plan = ParallelPlan(tp=8, pp=2, dp=4, global_batch=64, seq_len=4096, zero=3)
    e = estimate_training(m, ClusterSpec(system=H100, num_nodes=8), plan)
    t = step_time(m, plan, H100.gpu, comm_seconds(e.comm, H100))
    parts = t.compute + t.bubble + t.comm_exposed + t.optimizer + t.overhead
    assert float(parts) == pytest.approx(float(t.total))


# MegaScale (Jiang et al. 2024, NSDI'24, Table 2): GPT-175B (TP8 PP8 VPP6) with Megatron-LM on A100, strong
# scaling at batch 768 (256 -> 1,024 GPUs) and at batch 6,144 (3,072 -> 12,288 GPUs). Records megascale-t2-*.
BASELINE = "megascale-t2-175b-megatron-lm-{}gpu"


def _mfu(acc, published_runs, gpus: int) -> tuple[float, float]:
    rec = published_runs[BASELINE.format(gpus)]
    (quantity, pred, meas), *_ = acc.predict(rec, acc.family(rec["id"]))
    assert quantity == "MFU"
    return pred, meas


def test_megascale_12288_gpu_row_within_10_percent(published_runs):
    # 12,288 A100, DP 192: measured 41.2% MFU (Table 2). Tolerance 10%, issue 32's per-family target.
    import accuracy

    pred, meas = _mfu(accuracy, published_runs, 12288)
    assert meas == 0.412
    assert pred == pytest.approx(meas, rel=0.10)


@pytest.mark.parametrize("small,large", [(256, 1024), (3072, 12288)])
def test_megascale_efficiency_falls_with_scale_as_measured(published_runs, small, large):
    # Measured MFU falls 15.7% from 256 to 1,024 GPUs (53.0 -> 44.7%) and 15.4% from 3,072 to 12,288
    # (48.7 -> 41.2%). The baseline reduces its DP buckets after the backward (MegaScale adds "DP overlap",
    # Table 3), so the exposed reduction stays while the step shrinks; with the stragglers of 4x more GPUs the
    # predicted fall must be at least half the measured one (with the 0.15 s constant and the reduction
    # overlapped it was 4.6% and 6.7%, under a third and under a half).
    import accuracy

    p_small, m_small = _mfu(accuracy, published_runs, small)
    p_large, m_large = _mfu(accuracy, published_runs, large)
    measured_fall, predicted_fall = 1 - m_large / m_small, 1 - p_large / p_small
    assert measured_fall == pytest.approx(0.155, abs=0.005)
    assert measured_fall / 2 <= predicted_fall <= measured_fall * 1.25
