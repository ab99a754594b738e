"""Transformer Engine's set_sm_margin under --tp-comm-overlap (docs/formulas.md#step.ub_margin): a userbuffer
overlap with the margin on runs its GEMM on N_SM - num_sm SMs for the GEMM's whole length, in place of the
contention while its communication runs."""

from __future__ import annotations

import pytest
from accuracy import te_default_margin, ub_config_margin
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.comm import (
    TE_UB_MARGIN,
    TUNED_UB_MARGIN,
    comm_seconds,
    step_comm,
    te_default_margin_sms,
    tp_margin_sms,
    tp_overlap_contention,
    tp_role_gemm_shares,
    tp_sm_margin_seconds,
)
from llmplan.cost.step import step_time
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems
from llmplan.topology.placement import place

M = builtin_models()
H100_SMS = 132
SMS = st.floats(0.0, 40.0)


def _plan(sms: tuple[float, float, float, float] | None = None,
          margin: tuple[float, float, float, float] | None = None, **kw: object) -> ParallelPlan:
    base: dict[str, object] = {"tp": 4, "sp": True, "tp_comm_overlap": True, "global_batch": 16, "seq_len": 8192,
                               "dtype": "bf16", "tp_overlap_sms": sms, "tp_overlap_margin_sms": margin}
    base.update(kw)
    return ParallelPlan(**base)  # type: ignore[arg-type]


def test_te2_defaults_set_the_margin_on_pipeline_and_bulk():
    # NVIDIA/TransformerEngine transformer_engine/pytorch/module/base.py initialize_ub, get_default_config at
    # v2.0 / v2.4 / v2.8: "set_sm_margin": not method == "ring_exchange" (v1.9 - v1.13: False); the roles are
    # (ring-exchange all-gathers, pipelined forward reduce-scatters, bulk re-gathers, bulk reduce-scatters)
    assert TE_UB_MARGIN == (False, True, True, True)
    assert te_default_margin_sms() == (0.0, 16.0, 16.0, 16.0)
    assert te_default_margin_sms((1.0, 20.0, 3.0, 14.0)) == (0.0, 20.0, 3.0, 14.0)


def test_the_default_plan_prices_the_published_configs_margins():
    # ParallelPlan.tp_overlap_margin_sms None prices what NVIDIA's published userbuffer configs set (Megatron-Bridge
    # training/comm_overlap.py v0.2.0 .. 067f987d, NeMo tp_overlap_configs/userbuffers.py ab020f6a72): the margin
    # on the pipelined forward reduce-scatters only, no bulk overlap with one
    assert TUNED_UB_MARGIN == (False, True, False, False)
    assert tp_margin_sms(_plan()) == (0.0, 16.0, 0.0, 0.0)
    assert tp_margin_sms(_plan((1.0, 20.0, 3.0, 14.0))) == (0.0, 20.0, 0.0, 0.0)


@pytest.mark.parametrize("name, margin", [
    # Megatron-Bridge src/megatron/bridge/training/comm_overlap.py (v0.2.0 .. 067f987d), NeMo
    # tp_overlap_configs/userbuffers.py (ab020f6a72): bf16 70B TP4 proj_fprop PipelineOverlapCfg(num_sm=24,
    # set_sm_margin=True), fc2_fprop (num_sm=16, set_sm_margin=True); every BulkOverlapCfg set_sm_margin=False
    ("userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192", (0.0, 20.0, 0.0, 0.0)),
    # bf16 405B TP8 CP2: proj_fprop 24, fc2_fprop 8, both set_sm_margin=True
    ("userbuffers_bf16_h100_h16384_tp8_cp2_mbs1_seqlen8192", (0.0, 16.0, 0.0, 0.0)),
    # Blackwell bf16 70B TP2: proj_fprop 32, fc2_fprop 16
    ("userbuffers_bf16_b200_h8192_tp2_mbs1_seqlen8192", (0.0, 24.0, 0.0, 0.0)),
    # fp8: proj_fprop / fc2_fprop RingExchangeOverlapCfg(num_sm=1, set_sm_margin=True)
    ("userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192", (0.0, 1.0, 0.0, 0.0)),
    # NeMo-Framework-Launcher 24.07 tp_overlap/ub_cfg_h100_h6144_tp2_mbs2_seqlen2048.yaml: proj_fprop num_sm 16,
    # fc2_fprop num_sm 24, set_sm_margin: 1; the bulk ones set_sm_margin: 0
    ("ub_cfg_h100_h6144_tp2_mbs2_seqlen2048", (0.0, 20.0, 0.0, 0.0)),
])
def test_recipe_configs_reproduce_their_margins(name, margin):
    assert ub_config_margin(name) == margin


def test_te_version_of_the_container_picks_the_default():
    # NeMo 24.07 ships TE 1.8.0.dev0 (NeMo Framework user guide 24.09, Software Component Versions): no margin;
    # DGX Cloud's Nemotron-H 56B on NeMo 25.07.01 (after TE v2.0, 2025-02-12): TE's defaults (None)
    assert te_default_margin({"id": "nemo2407-pretrain-nemotron-8b-x"}) == (0.0, 0.0, 0.0, 0.0)
    assert te_default_margin({"id": "dgxc-x", "source": "nvcr.io/nvidia/nemo:25.07.01"}) == (0.0, 16.0, 16.0, 16.0)
    assert te_default_margin({"id": "x", "notes": "nvcr.io/nvidia/pytorch:24.05-py3"}) == (0.0,) * 4


def test_role_shares_of_a_llama_70b_layer():
    # Llama 3 70B (h 8192, 64 heads of 128, 8 KV heads, ffn 28672, SwiGLU): per layer the row-parallel weights
    # are o_proj h^2 and down_proj 3.5 h^2, the column ones q/k/v 1.25 h^2 and gate/up 7 h^2: row 4.5 / 12.75
    row, col = 4.5 / 12.75, 8.25 / 12.75
    for r in (0.0, 1.0):
        ring, fwd_rs, re_gather, bwd_rs = (float(x) for x in tp_role_gemm_shares(M["llama-3.1-70b"], _plan(), r))
        assert fwd_rs == pytest.approx((1 + r) * row / (3 + r), rel=1e-9)
        assert re_gather == bwd_rs == pytest.approx(col / (3 + r), rel=1e-9)
        # every GEMM beside one overlap but the row-parallel linears' weight gradients (no userbuffer of theirs)
        assert ring + fwd_rs + re_gather + bwd_rs == pytest.approx(1 - row / (3 + r), rel=1e-9)


def test_role_shares_of_nemotron_h_56b():
    # nvidia/Nemotron-H-56B-Base-8K config.json: h 8192, 118 layers (54 Mamba-2, 10 attention, 54 MLP), 64 heads
    # of 128 with 8 KV heads, ffn 32768 (ReLU^2, not gated), Mamba 256 heads of 64, 8 groups, state 256. Row
    # GEMMs: o_proj h^2, fc2 f h, out_proj 16384 h; column: q/k/v 1.25 h^2, fc1 f h, in_proj h (2 16384 + 2 8 256
    # + 256) (Megatron-LM ssm/mamba_mixer.py: tp_comm_buffer_name "fc1" / "fc2")
    h, f = 8192, 32768
    row = 10 * h * h + 54 * f * h + 54 * 16384 * h
    col = 10 * 1.25 * h * h + 54 * f * h + 54 * h * (2 * 16384 + 2 * 8 * 256 + 256)
    _ring, fwd_rs, re_gather, bwd_rs = (float(x) for x in tp_role_gemm_shares(M["nemotron-h-56b"], _plan(tp=8), 0.0))
    # the convolution, dt / A / D and the gated norm's weights sit in the whole only: 1e-3
    assert fwd_rs == pytest.approx(row / (row + col) / 3, rel=1e-3)
    assert re_gather == bwd_rs == pytest.approx(col / (row + col) / 3, rel=1e-3)


def test_margin_roles_contend_no_further():
    # with the margin on a role its GEMM already left the SMs free: only the ring's 1 SM contends
    k = tp_overlap_contention(M["llama-3.1-70b"], _plan(margin=te_default_margin_sms()), 0.0, H100_SMS)
    assert float(k) == pytest.approx(4 * 1 / 9.5 / H100_SMS)
    assert float(tp_sm_margin_seconds(M["llama-3.1-70b"], _plan(margin=(0.0,) * 4), 1.0, 0.0, H100_SMS)) == 0.0


def _step(plan: ParallelPlan, name: str = "llama-3.1-70b") -> float:
    m, system = M[name], builtin_systems()["dgx-h100"]
    c = ClusterSpec(system=system, num_nodes=1)
    secs = comm_seconds(step_comm(m, plan, place(plan.degrees, c), system), system)
    return float(step_time(m, plan, system.gpu, secs).total)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(sms=st.tuples(st.floats(1.0, 4.0), SMS, SMS, SMS), on=st.tuples(st.booleans(), st.booleans(),
       st.booleans(), st.booleans()), tp=st.sampled_from([2, 4, 8]), full=st.booleans(),
       name=st.sampled_from(["llama-3.1-8b", "llama-3.1-70b"]), s=st.sampled_from([2048, 8192]))
def test_margin_on_never_makes_a_step_faster(sms, on, tp, full, name, s):
    # the same SMs taken for the GEMM's whole length instead of only while the communication runs: never faster
    kw = {"tp": tp, "dp": 8 // tp, "recompute": "full" if full else "none", "seq_len": s}
    margin = tuple(n if o else 0.0 for n, o in zip(sms, on, strict=True))
    on_step = _step(_plan(sms, margin, **kw), name)  # type: ignore[arg-type]
    assert on_step >= _step(_plan(sms, (0.0,) * 4, **kw), name) * (1 - 1e-12)
