"""The host's per-expert GEMM calls of a MoE layer (docs/formulas.md#step.expert_gemms): Transformer Engine's
grouped linear issues one GEMM per local expert, in forward and twice in backward; the GPU idles for them only
where they outlast the layer's GPU work. And the Megatron-Bridge presets that decide which Qwen3 rows run
the alltoall dispatcher or the EP overlap (benchmarks/accuracy.py mbridge_moe_recipe)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.moe import EXPERT_GEMM_HOST_S, EXPERT_GEMMS_FWD, expert_gemm_host_seconds
from llmplan.cost.overhead import host_seconds
from llmplan.estimate import estimate_training
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M = builtin_models()
S = builtin_systems()


def _plan(**kw) -> ParallelPlan:
    base = dict(ep=8, dp=8, etp=1, micro_batch=1, global_batch=64, seq_len=4096, zero=1)
    return ParallelPlan(**{**base, **kw})


def test_calls_per_local_expert_forward_and_backward():
    m = M["qwen3-30b-a3b"]  # 128 experts: 16 per rank at EP 8
    fwd, total = expert_gemm_host_seconds(m, _plan(), 0.0)
    assert float(fwd) == pytest.approx(EXPERT_GEMMS_FWD * 16 * EXPERT_GEMM_HOST_S)
    assert float(total) == pytest.approx(3 * float(fwd))  # backward: input and weight gradient per forward GEMM
    _, recomputed = expert_gemm_host_seconds(m, _plan(recompute="selective", recompute_modules=("moe",)), 0.0)
    assert float(recomputed) == pytest.approx(4 * float(fwd))


def test_no_calls_for_dense_models_or_inside_a_full_iteration_graph():
    assert expert_gemm_host_seconds(M["qwen3-8b"], ParallelPlan(dp=8, global_batch=64), 0.0) == (0.0, 0.0)
    graphed = _plan(cuda_graphs="full-iteration", moe_dispatcher="deepep")
    assert float(expert_gemm_host_seconds(M["qwen3-30b-a3b"], graphed, 0.0)[1]) == 0.0


@settings(max_examples=30, deadline=None, derandomize=True)
@given(ep=st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128]))
def test_host_time_falls_as_experts_spread_over_more_ranks(ep):
    m = M["qwen3-30b-a3b"]
    fwd, _ = expert_gemm_host_seconds(m, _plan(ep=ep, dp=128), 0.0)
    assert float(fwd) == pytest.approx(EXPERT_GEMMS_FWD * m.num_experts / ep * EXPERT_GEMM_HOST_S)


def test_a_long_micro_batch_hides_the_calls_and_a_short_one_waits_for_them():
    plan, calls = _plan(), (1e-3, 3e-3)  # 3 ms of calls per MoE layer and micro-batch
    hidden = float(host_seconds(plan, 48, 10.0, 0, 48, 0.0, 1.0, calls))
    assert hidden == pytest.approx(float(host_seconds(plan, 48, 10.0, 0, 48)))
    short = float(host_seconds(plan, 48, 0.05, 0, 48, 0.0, 1.0, calls))
    base = float(host_seconds(plan, 48, 0.05, 0, 48))
    # the launches beyond the 50 ms micro-batch: at least the calls' 144 ms less the GPU's 50 ms, per micro-batch
    assert short - base >= plan.num_microbatches * (48 * 3e-3 - 0.05) - 1e-9


def test_vectorised_plans_agree_with_scalar_ones():
    m = M["qwen3-30b-a3b"]
    eps = np.array([2, 4, 8, 16])
    arr = ParallelPlan.model_construct(**{**_plan().__dict__, "ep": eps, "dp": np.full(4, 16)})
    fwd, total = expert_gemm_host_seconds(m, arr, 0.0)
    for i, ep in enumerate(eps):
        f, t = expert_gemm_host_seconds(m, _plan(ep=int(ep), dp=16), 0.0)
        assert fwd[i] == pytest.approx(float(f)) and total[i] == pytest.approx(float(t))


# Megatron-Bridge's Qwen3-30B-A3B on 8 B200 at micro-batch 1 (26.02 table: 9,691 tokens/s per GPU; 16 local
# experts): the step's host part holds the expert calls the micro-batch's GPU time does not cover.
B200_MBS1 = "mbridge-26.02-pretrain-qwen3-30b-a3b-dgx-b200-8gpu-mxfp8-tp1pp1cp1ep8vpnagbs512mbs1"


@pytest.fixture(scope="module")
def acc():
    import accuracy  # benchmarks/accuracy.py (conftest puts benchmarks/ on the path)

    return accuracy


def test_short_small_expert_layers_run_at_the_hosts_pace(published_runs, acc):
    rec = published_runs[B200_MBS1]
    assert rec["measured"]["tokens_per_s_per_gpu"] == 9691
    plan = acc.plan_for(rec, "mbridge-moe", 8)
    m = acc.model_for(rec, "mbridge-moe")
    e = estimate_training(m, ClusterSpec(system=S["dgx-b200"], num_nodes=1, gpus_per_node=8), plan)
    _, total = expert_gemm_host_seconds(m, plan, 0.0)
    per_mb = (e.time.compute + e.time.exposed["ep"]) / plan.num_microbatches  # the micro-batch's GPU time
    assert 48 * float(total) > per_mb  # more host time than GPU time per micro-batch
    assert float(e.time.overheads["host"]) >= plan.num_microbatches * (48 * float(total) - per_mb) - 1e-9


@pytest.mark.parametrize("rid, flex, overlap", [
    # v0.2.0 configs/qwen3/workload_base_configs.py: the B200 and H100 presets set no flex backend (the Qwen3
    # provider's alltoall), the H100 ones moe_a2a_overlap=True
    ("mbridge-25.11-pretrain-qwen3-30b-a3b-dgx-b200-8gpu-fp8mx-tp1pp1cp1ep8vp1gbs512mbs1", False, False),
    ("mbridge-25.11-pretrain-qwen3-30b-a3b-dgx-h100-16gpu-fp8cs-tp1pp2cp1ep8vp24gbs512mbs2", False, True),
    ("mbridge-25.11-pretrain-qwen3-30b-a3b-dgx-gb200-8gpu-fp8mx-tp1pp1cp1ep8vp1gbs512mbs4", True, False),
    # v0.3.0 configs/qwen/qwen3_workload_base_configs.py: B200 as before; H100 deepep with moe_a2a_overlap
    (B200_MBS1, False, False),
    ("mbridge-26.02-pretrain-qwen3-30b-a3b-dgx-h100-16gpu-fp8-tp1pp2cp1ep8vp12gbs1024mbs1", True, True),
    # v0.3.0's Qwen3-235B B300 presets: moe_a2a_overlap=True (v0.3.1 sets False)
    ("mbridge-26.02-pretrain-qwen3-235b-a22b-dgx-b300-256gpu-mxfp8-tp1pp8cp1ep8vp4gbs8192mbs1", False, True),
    # v0.2.0's DeepSeek-V3 B200 preset: no flex backend (the DeepSeek provider's alltoall); GB200 hybridep
    ("mbridge-25.11-pretrain-deepseekv3-w-mtp-dgx-b200-256gpu-fp8mx-tp1pp16cp1ep8vp1gbs2048mbs1", False, False),
    ("mbridge-25.11-pretrain-deepseekv3-w-o-mtp-dgx-gb200-256gpu-fp8mx-tp1pp8cp1ep32vp4gbs4096mbs1", True, False),
    # 25.09's token-drop runs: apply_moe_token_drop asserts the alltoall dispatcher (v0.1.0rc3 run_script.py)
    ("mbridge-25.09-pretrain-qwen3-30b-a3b-tokendrop-dgx-gb200-8gpu-fp8-tp1pp1cp1ep8vp1gbs512mbs4", False, False),
    # v0.3.1 (26.02.01) on: hybridep on B200 (BASE config deepep, the B200 preset hybridep)
    ("mbridge-26.02.01-pretrain-qwen3-30b-a3b-dgx-b200-8gpu-mxfp8-tp1pp1cp1ep8vpnagbs512mbs4", True, False),
])
def test_qwen3_presets_per_release(published_runs, acc, rid, flex, overlap):
    assert acc.mbridge_moe_recipe(published_runs[rid]) == (flex, overlap)


def test_token_drop_rows_pad_every_expert_to_capacity_one(published_runs, acc):
    # moe_token_drop.py (v0.1.0rc3): moe_expert_capacity_factor 1.0, moe_pad_expert_input_to_capacity True
    rid = "mbridge-25.09-pretrain-qwen3-30b-a3b-tokendrop-dgx-b200-8gpu-fp8-tp1pp1cp1ep8vp1gbs512mbs1"
    assert acc.plan_for(published_runs[rid], "mbridge-moe", 8).moe_capacity_factor == 1.0
    dropless = "mbridge-25.11-pretrain-qwen3-30b-a3b-dgx-b200-8gpu-fp8mx-tp1pp1cp1ep8vp1gbs512mbs1"
    assert acc.plan_for(published_runs[dropless], "mbridge-moe", 8).moe_capacity_factor is None
