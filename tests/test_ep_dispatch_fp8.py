"""The EP dispatch in FP8 (ParallelPlan.ep_dispatch_fp8): DeepSeek-V3 report §3.3.2-3.3.3 quantises the
activations before the MoE up-projection and dispatches them in FP8 (1x128 tiles, one scale each), the combines
in BF16; DeepEP's dispatch takes the (fp8, scales) tuple. Priced in comm.ep's bytes, checked by check_plan,
carried by the CLI, refused by the Megatron exports, set on the DeepSeek-V3 report row (issue 32)."""

from __future__ import annotations

import dataclasses

import pytest

from llmplan.cost.comm import ep_transfers
from llmplan.estimate import estimate_training
from llmplan.export import render_all
from llmplan.export.common import CannotExpress
from llmplan.planfile import load_plan
from llmplan.search.evaluate import evaluate
from llmplan.search.grid import from_plan
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models

M = builtin_models()
DSV3 = {"tp": 1, "pp": 16, "dp": 128, "ep": 64, "seq_len": 4096, "micro_batch": 1, "global_batch": 15360,
        "dtype": "fp8", "recipe": "blockwise", "moe_dispatcher": "deepep"}


def test_dispatch_bytes_by_hand_and_the_combine_unchanged():
    # DeepSeek-V3: hidden 7168 (config.json). FP8 dispatch per token row: 7168 e4m3 bytes + 7168 / 128 fp32
    # scales = 7168 + 224 = 7392 bytes (DeepEP README: x_scales float [tokens, hidden / 128]); bf16: 14336.
    m = M["deepseek-v3"]
    assert m.hidden_size == 7168
    (off,) = [t for t in ep_transfers(m, ParallelPlan(**DSV3), "ep") if t.collective == "all-to-all"]
    on = [t for t in ep_transfers(m, ParallelPlan(**DSV3, ep_dispatch_fp8=True), "ep") if t.collective == "all-to-all"]
    dispatch, combine = on
    assert dispatch.calls + combine.calls == off.calls and dispatch.calls == combine.calls
    assert combine.message == off.message  # the combine stays bf16
    assert dispatch.message / off.message == pytest.approx(7392 / 14336, rel=1e-12)
    moved = sum(t.calls * t.message for t in on) / (off.calls * off.message)
    assert moved == pytest.approx((7392 + 14336) / (2 * 14336), rel=1e-12)


def test_check_plan_needs_fp8_and_deepep():
    m = M["deepseek-v3"]
    ok = ParallelPlan(**DSV3, ep_dispatch_fp8=True)
    assert "ep_dispatch_fp8" not in [v.rule for v in check_plan(m, ok)]
    for bad in ({"dtype": "bf16", "recipe": "tensorwise"}, {"moe_dispatcher": "alltoall"},
                {"moe_flex_backend": "hybridep"}):
        plan = ok.model_copy(update=bad)
        msgs = [v for v in check_plan(m, plan) if v.rule == "ep_dispatch_fp8"]
        assert msgs and "--ep-dispatch-fp8" in msgs[0].message


def test_the_switch_prices_the_same_in_plan_arrays_and_one_plan(row_setup):
    rid = "deepseek-v3-report-h800-2048gpu-pretrain"
    m, cluster, row = row_setup(rid)
    est = {}
    for fp8 in (False, True):
        plan = row.model_copy(update={"ep_dispatch_fp8": fp8})
        assert not check_plan(m, plan, cluster)
        est[fp8] = one = estimate_training(m, cluster, plan)
        many = evaluate(m, cluster, from_plan(plan))
        assert float(many.step.total[0]) == pytest.approx(float(one.time.total), rel=1e-9)
        assert float(many.step.comm_exposed[0]) == pytest.approx(float(one.time.comm_exposed), rel=1e-9)
    assert est[True].time.comm_exposed < est[False].time.comm_exposed and est[True].time.total < est[False].time.total


def test_cli_carries_the_switch_and_refuses_it_in_bf16(cli):
    args = ("estimate", "--model", "deepseek-v3", "--hardware", "dgx-h800", "--nodes", "32", "--pp", "8",
            "--ep", "32", "--pp-layout", "balanced", "--moe-dispatcher", "deepep", "--global-batch", "1024",
            "--json")
    on = cli(*args, "--precision", "fp8-blockwise", "--ep-dispatch-fp8")
    assert on.code == 0, on.err
    assert on.json()["plan"]["ep_dispatch_fp8"] is True
    bad = cli(*args, "--ep-dispatch-fp8")
    assert bad.code == 2 and "ep_dispatch_fp8" in bad.err and "Traceback" not in bad.err


def test_megatron_exports_refuse_it():
    # Megatron-LM fused_a2a.py (02ad939, Megatron-Bridge's pin; d98e8a6): DeepEP is handed bf16 tokens and
    # init_hybrid_ep_buffer asserts fp8 dispatch off; moe_dispatch_fwd_dtype mxfp8 is the ncclep backend's.
    from test_export_bridge import PLANS

    base = load_plan(PLANS / "deepseek_train.json")
    plan = base.plan.model_copy(update={"dtype": "fp8", "recipe": "blockwise", "moe_dispatcher": "deepep",
                                        "ep_dispatch_fp8": True})
    pf = dataclasses.replace(base, plan=plan)
    for target in ("megatron", "megatron-bridge"):
        with pytest.raises(CannotExpress, match="ep_dispatch_fp8"):
            render_all(pf, target)


def test_deepseek_v3_report_row_dispatches_in_fp8(row_setup):
    # DeepSeek-V3 report (arXiv 2412.19437) §3.3.3 "Low-Precision Communication": the dispatch in FP8, the
    # combine in BF16; the row's plan says so, and it moves fewer EP bytes than the same plan in bf16.
    rid = "deepseek-v3-report-h800-2048gpu-pretrain"
    m, _, plan = row_setup(rid)
    assert plan.ep_dispatch_fp8 and plan.moe_dispatcher == "deepep" and plan.dtype == "fp8"
    assert not [v for v in check_plan(m, plan) if v.rule == "ep_dispatch_fp8"]

    def moved(p: ParallelPlan) -> float:
        return sum(t.calls * t.message for t in ep_transfers(m, p, "ep") if t.collective == "all-to-all")

    assert moved(plan) < moved(plan.model_copy(update={"ep_dispatch_fp8": False}))
