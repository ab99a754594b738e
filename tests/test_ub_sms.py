"""SMs Transformer Engine's userbuffers hold beside the TP GEMMs under --tp-comm-overlap
(docs/formulas.md#step.ub_sms): ring exchanges move their chunks on copy engines (num_sm 1, use_ce), pipelined
and bulk overlaps run kernels on num_sm SMs (16 by default; the recipes' userbuffer configs set their own)."""

from __future__ import annotations

import pytest
from accuracy import ub_config_sms
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.comm import TE_UB_SMS, tp_forward_rs_share, tp_overlap_contention
from llmplan.cost.compute import StageCompute
from llmplan.cost.exposure import tp_exposed
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models

M = builtin_models()
H100_SMS = 132
SMS = st.floats(0.0, 64.0)


def _plan(dtype: str = "bf16", sms: tuple[float, float, float, float] | None = None, tp: int = 4) -> ParallelPlan:
    # no set_sm_margin (Transformer Engine 1.x's default): the contention alone (tests/test_ub_margin.py: with it)
    return ParallelPlan(tp=tp, sp=True, tp_comm_overlap=True, global_batch=8, seq_len=8192, dtype=dtype,
                        tp_overlap_sms=sms, tp_overlap_margin_sms=(0.0, 0.0, 0.0, 0.0))


def test_defaults_are_transformer_engines():
    # NVIDIA/TransformerEngine transformer_engine/pytorch/module/base.py initialize_ub (v1.8 and v2.8):
    # num_sm 1 if method == "ring_exchange" else 16, use_ce True; ring_exchange for qkv_fprop, fc1_fprop,
    # proj_dgrad, fc2_dgrad; pipeline for proj_fprop, fc2_fprop; bulk for qkv/fc1 dgrad and wgrad.
    assert TE_UB_SMS == (1.0, 16.0, 16.0, 16.0)


@pytest.mark.parametrize("name, sms", [
    # Megatron-Bridge src/megatron/bridge/training/comm_overlap.py (v0.2.0 .. 067f987d): fp8 H100 70B TP4
    # qkv_dgrad 4, fc1_dgrad 2, qkv_wgrad 24, fc1_wgrad 4, proj_fprop / fc2_fprop RingExchangeOverlapCfg(num_sm=1)
    ("userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192", (1.0, 1.0, 3.0, 14.0)),
    # the bf16 one: proj_fprop PipelineOverlapCfg(num_sm=24), fc2_fprop num_sm=16
    ("userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192", (1.0, 20.0, 3.0, 14.0)),
    # 405B TP8 CP2: qkv_dgrad 2, fc1_dgrad 2, qkv_wgrad 24, fc1_wgrad 2; bf16 proj_fprop 24, fc2_fprop 8
    ("userbuffers_fp8_h100_h16384_tp8_cp2_mbs1_seqlen8192", (1.0, 1.0, 2.0, 13.0)),
    ("userbuffers_bf16_h100_h16384_tp8_cp2_mbs1_seqlen8192", (1.0, 16.0, 2.0, 13.0)),
    # Blackwell 405B (the GB200 / GB300 / B200 presets): qkv_dgrad 8, fc1_dgrad 2, qkv_wgrad 32, fc1_wgrad 8
    ("userbuffers_fp8_b200_h16384_tp4_cp2_mbs1_seqlen8192", (1.0, 1.0, 5.0, 20.0)),
    # NeMo-Framework-Launcher 24.07 tp_overlap/ub_cfg_h100_h8192_tp4_mbs1_seqlen4096.yaml: qkv_dgrad 8,
    # qkv_wgrad 16, fc1_dgrad 2, fc1_wgrad 4, proj_fprop 24, fc2_fprop 16
    ("ub_cfg_h100_h8192_tp4_mbs1_seqlen4096", (1.0, 20.0, 5.0, 10.0)),
])
def test_recipe_configs_reproduce_their_sm_counts(name, sms):
    assert ub_config_sms(name) == sms


def test_every_role_at_nccls_count_is_the_old_contention():
    # all four roles on 16 SMs: the overlap slows the GEMMs by 16 / 132, GpuSpec.contention's NCCL reading
    for dtype in ("bf16", "fp8"):
        k = tp_overlap_contention(M["llama-3.1-70b"], _plan(dtype, (16.0,) * 4), 0.0, H100_SMS)
        assert float(k) == pytest.approx(16 / H100_SMS)


def test_te_defaults_hold_about_a_third_of_nccls():
    # bf16, no recompute: the ring-exchanged all-gathers are 4 of 10 equal collectives, the forward
    # reduce-scatters 2 x 3/4 overlapped, bulk 4: (4 x 1 + 1.5 x 16 + 4 x 16) / 9.5 = 8.84 SMs of 132
    k = tp_overlap_contention(M["llama-3.1-70b"], _plan(), 0.0, H100_SMS)
    assert float(k) == pytest.approx((4 * 1 + 1.5 * 16 + 4 * 16) / 9.5 / H100_SMS)


@settings(max_examples=80, deadline=None, derandomize=True)
@given(n=st.floats(1.0, 64.0), others=st.tuples(SMS, SMS, SMS), dtype=st.sampled_from(["bf16", "fp8"]),
       r=st.sampled_from([0.0, 0.5, 1.0]), t=st.sampled_from([2, 4, 8]), tp=st.floats(1e-4, 1.0),
       gemm=st.floats(1e-4, 1.0))
def test_copy_engine_ring_never_costs_more_than_n_sms(n, others, dtype, r, t, tp, gemm):
    # the same collectives with the ring exchange's copy engines (1 SM) never expose more than with N >= 1 SMs
    m, fwd, regather, bwd = M["llama-3.1-70b"], *others
    sc = StageCompute(gemm=gemm, attention=0.0, memory_bound=0.0, forward=gemm / 3)
    exposed = []
    for ring in (1.0, n):
        plan = _plan(dtype, (ring, fwd, regather, bwd), t)
        k = tp_overlap_contention(m, plan, r, H100_SMS)
        exposed.append(float(tp_exposed(plan, tp, sc, 16 / H100_SMS, r, tp_forward_rs_share(m, plan, r), ub_kappa=k)))
    assert exposed[0] <= exposed[1] + 1e-15


@settings(max_examples=60, deadline=None, derandomize=True)
@given(sms=st.tuples(SMS, SMS, SMS, SMS), more=st.floats(0.0, 32.0), role=st.integers(0, 3),
       r=st.sampled_from([0.0, 1.0]))
def test_more_sms_in_any_role_never_lowers_the_contention(sms, more, role, r):
    m = M["llama-3.1-70b"]
    bumped = tuple(x + more if i == role else x for i, x in enumerate(sms))
    lo = float(tp_overlap_contention(m, _plan("fp8", sms), r, H100_SMS))
    hi = float(tp_overlap_contention(m, _plan("fp8", bumped), r, H100_SMS))  # type: ignore[arg-type]
    assert 0.0 <= lo <= hi + 1e-15 <= 0.5 + 1e-15


def test_dtensor_async_tp_keeps_nccls_contention():
    # the userbuffer SMs describe Transformer Engine's overlap only; torchtitan's DTensor async TP keeps kappa
    m = M["llama-3.1-70b"]
    plan = _plan().model_copy(update={"tp_impl": "dtensor"})
    sc = StageCompute(gemm=1.0, attention=0.0, memory_bound=0.0, forward=1 / 3)
    kappa = 16 / H100_SMS
    with_ub = tp_exposed(plan, 0.1, sc, kappa, 0.0, 0.2, ub_kappa=tp_overlap_contention(m, plan, 0.0, H100_SMS))
    assert float(with_ub) == pytest.approx(float(tp_exposed(plan, 0.1, sc, kappa, 0.0, 0.2)))
