"""Where Transformer Engine's userbuffer TP overlap prices slower than none (docs/formulas.md#step.ub_loses) and
the published configs' forward reduce-scatters under fp8 / fp4 (docs/formulas.md#step.ub_low_precision)."""

from __future__ import annotations

from itertools import islice

import pytest
from accuracy import ub_config_margin, ub_config_sms
from agreement import assert_arrays_agree

from llmplan.cost.comm import (
    TE_UB_SMS,
    comm_seconds,
    step_comm,
    tp_forward_rs_share,
    tp_margin_sms,
    tp_role_sms,
    tp_sm_margin_seconds,
)
from llmplan.cost.step import step_time
from llmplan.estimate import estimate_training
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems
from llmplan.topology.placement import place

M, S = builtin_models(), builtin_systems()


def _plan(**kw: object) -> ParallelPlan:
    base: dict[str, object] = {"sp": True, "micro_batch": 1, "seq_len": 8192, "tp_comm_overlap": True}
    base.update(kw)
    return ParallelPlan(**base)  # type: ignore[arg-type]


def _cluster(system: str, plan: ParallelPlan) -> ClusterSpec:
    gpus = plan.tp * plan.pp * plan.dp * plan.cp
    return ClusterSpec(system=S[system], num_nodes=max(1, gpus // S[system].gpus_per_node))


def _gain(name: str, system: str, plan: ParallelPlan) -> float:
    """Seconds a step the overlap saves (on - off), priced here from two step_time calls."""
    m, c = M[name], _cluster(system, plan)
    out = []
    for p in (plan.model_copy(update={"tp_comm_overlap": False}), plan):
        secs = comm_seconds(step_comm(m, p, place(p.degrees, c), c.system), c.system)
        out.append(float(step_time(m, p, c.system.gpu, secs).total))
    return out[0] - out[1]


LLAMA_405B_TP2 = {"tp": 2, "dp": 4, "global_batch": 64, "recompute": "full"}


def test_the_margin_outweighs_the_forward_reduce_scatters_at_tp2_h16384():
    # Llama 3.1 405B (meta-llama config.json: h 16384, 128 heads of 128, 8 KV heads, ffn 53248, SwiGLU), per layer
    # in units of h^2: row-parallel o_proj 1 + down_proj 3.25 = 4.25, column q/k/v 1.125 + gate/up 6.5 = 7.625.
    # Under full recompute (r = 1) the forward reduce-scatters' GEMMs (proj, fc2, forward and recompute) are
    # 2 x 4.25 / (4 x 11.875) of the GEMM time; by default (TE_UB_SMS, the published configs' set_sm_margin on
    # proj_fprop / fc2_fprop) they run on 132 - 16 SMs: 16 / 116 of their time more (step.ub_margin).
    m, plan = M["llama-3.1-405b"], _plan(**LLAMA_405B_TP2)
    c = _cluster("dgx-h100", plan)
    secs = comm_seconds(step_comm(m, plan, place(plan.degrees, c), c.system), c.system)
    sc = step_time(m, plan, c.system.gpu, secs).stage
    margin = float(tp_sm_margin_seconds(m, plan, sc.gemm, 1.0, 132))
    assert margin == pytest.approx(float(sc.gemm) * (2 * 4.25 / (4 * 11.875)) * 16 / 116, rel=1e-6)
    # what the pipelined forward reduce-scatters hide: rho = 2(2 + 2r) / (2(2 + 2r) + 2 2 + (6 + 2r) 2) = 8/28 of the
    # TP seconds (bf16), less their last chunk of 4, which waits after the last GEMM (step.tp)
    assert float(tp_forward_rs_share(m, plan, 1.0)) == pytest.approx(8 / 28)
    hidden = float(secs.tp) / plan.num_microbatches * 8 / 28 * 3 / 4
    assert margin > 3 * hidden  # 0.50 s against 0.14 s a micro-batch on dgx-h100
    assert _gain("llama-3.1-405b", "dgx-h100", plan) < 0


def test_estimate_reports_the_loss(cli):
    common = ("estimate", "--model", "llama-3.1-405b", "--hardware", "dgx-h100", "--nodes", "16", "--tp", "2",
              "--dp", "64", "--zero", "3", "--recompute", "full", "--grad-dtype", "bf16", "--global-batch", "128",
              "--seq-len", "8192", "--json")
    on, off = cli(*common, "--tp-comm-overlap").json(), cli(*common, "--no-tp-comm-overlap").json()
    assert on["tp_overlap_gain_s"] == pytest.approx(off["time"]["step_s"] - on["time"]["step_s"], rel=1e-9)
    assert on["tp_overlap_gain_s"] < 0 and "slower than without it" in on["tp_overlap_slower"]
    assert "tp_overlap_gain_s" not in off and "tp_overlap_slower" not in off
    text = cli(*common[:-1], "--tp-comm-overlap").out
    assert "note: tp_comm_overlap prices" in " ".join(text.split())


def test_search_drops_the_overlap_where_it_loses(cli):
    # search turns the overlap on itself; where a plan it ranks prices slower with it, the winning setting is
    # searched again without it, and no ranked plan keeps an overlap that loses
    common = ("search", "--model", "llama-3.1-405b", "--hardware", "dgx-h100", "--nodes", "16", "--tp", "2",
              "--global-batch", "128", "--seq-len", "8192", "--top", "3", "--json")
    r = cli(*common).json()
    assert r["switches"]["tp_comm_overlap"] is False
    assert any(t["tp_comm_overlap"] for t in r["switches"]["tried"])
    assert all(not p["plan"]["tp_comm_overlap"] for p in r["plans"])
    # named, it is kept as given
    pinned = cli(*common, "--tp-comm-overlap").json()
    assert all(p["plan"]["tp_comm_overlap"] for p in pinned["plans"])
    assert "tp_comm_overlap" not in (pinned.get("switches") or {})


# NVIDIA's tuned Blackwell recipes keep TP overlap on at TP 2 with their userbuffer configs (Megatron-Bridge
# 067f987d perf_recipes/llama/b200/llama3.py llama3_70b_pretrain_64gpu_b200_{bf16,fp8mx}_config, gb200/llama3.py
# llama3_70b_pretrain_64gpu_gb200_fp8mx_config: tp_comm_overlap from the base recipe's CommOverlapConfig(True),
# tp_comm_overlap_cfg userbuffers_{bf16,fp8}_b200_h8192_tp2_mbs1_seqlen8192), where they turn it off for NVFP4:
# a tuning choice, not a published A/B; the overlap must not price slower on the layouts they chose.
@pytest.mark.parametrize("system, cfg, kw", [
    ("dgx-b200", "userbuffers_bf16_b200_h8192_tp2_mbs1_seqlen8192",
     {"tp": 2, "pp": 4, "cp": 2, "vpp": 5, "dp": 2, "dtype": "bf16"}),
    ("dgx-b200", "userbuffers_fp8_b200_h8192_tp2_mbs1_seqlen8192",
     {"tp": 2, "pp": 4, "vpp": 5, "dp": 8, "dtype": "fp8", "recipe": "mxfp8"}),
    ("gb200-nvl72", "userbuffers_fp8_b200_h8192_tp2_mbs1_seqlen8192",
     {"tp": 2, "pp": 4, "vpp": 5, "dp": 8, "dtype": "fp8", "recipe": "mxfp8"}),
])
def test_published_tp2_blackwell_recipes_gain_from_the_overlap(system, cfg, kw):
    plan = _plan(global_batch=256, zero=1, **kw)
    tuned = plan.model_copy(update={"tp_overlap_sms": ub_config_sms(cfg), "tp_overlap_margin_sms": ub_config_margin(cfg)})
    assert _gain("llama-3.1-70b", system, tuned) > 0
    assert _gain("llama-3.1-70b", system, plan) > 0  # and at llmplan's defaults


def test_low_precision_defaults_run_the_fp8_configs_forward_reduce_scatters():
    # every fp8 config NVIDIA publishes (Megatron-Bridge 067f987d training/comm_overlap.py userbuffers_fp8_*):
    # proj_fprop / fc2_fprop = RingExchangeOverlapCfg(num_sm=1, set_sm_margin=True)
    for dtype, recipe in (("fp8", "tensorwise"), ("fp8", "mxfp8"), ("fp4", "nvfp4")):
        p = _plan(tp=2, dtype=dtype, recipe=recipe)
        assert tp_role_sms(p) == (1.0, 1.0, 16.0, 16.0) and tp_margin_sms(p) == (0.0, 1.0, 0.0, 0.0)
        assert ub_config_margin("userbuffers_fp8_b200_h8192_tp2_mbs1_seqlen8192")[1] == tp_margin_sms(p)[1]
    bf16 = _plan(tp=2)
    assert tp_role_sms(bf16) == TE_UB_SMS and tp_margin_sms(bf16) == (0.0, 16.0, 0.0, 0.0)
    # a plan that sets its margins prices TE's own SMs (the export's "[0, 16, 16, 16]" for TE's defaults)
    te = _plan(tp=2, dtype="fp8", recipe="mxfp8", tp_overlap_margin_sms=(0.0, 16.0, 16.0, 16.0))
    assert tp_role_sms(te) == TE_UB_SMS


def test_gb300_mxfp8_tp2_no_longer_loses():
    # the noted case: a 1T-parameter GPT at TP 2 on GB300 MXFP8 priced the 16-SM pipelined reduce-scatters' margin
    # (the bf16 configs' method) and lost to no overlap; at the fp8 configs' 1-SM ring exchange it gains. Since the
    # output gradients' gathers move MXFP8's two copies (docs/formulas.md#comm.tp) there is more to hide and the
    # 16-SM margin gains a little too (0.04 s), far less than the ring exchange (1.24 s)
    kw = {"tp": 2, "pp": 4, "dp": 2, "global_batch": 32, "recompute": "full"}
    mx = _plan(dtype="fp8", recipe="mxfp8", **kw)
    ring = _gain("gpt-1t", "gb300-nvl72", mx)
    margin = _gain("gpt-1t", "gb300-nvl72", mx.model_copy(update={"tp_overlap_margin_sms": (0.0, 16.0, 0.0, 0.0)}))
    assert ring > 0 and margin < 0.1 * ring


def test_search_arrays_agree_on_the_low_precision_defaults():
    from llmplan.search.grid import Workload, default_space, enumerate_plans
    m, cluster = M["llama-3.1-70b"], ClusterSpec(system=S["gb300-nvl72"], num_nodes=1)
    w = Workload(global_batch=64, seq_len=4096, dtype="fp8", recipe="mxfp8", tp_comm_overlap=True)
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    ok = (i for i in range(len(plans)) if plans.plan(i).tp > 1 and plans.plan(i).sp
          and not check_plan(m, plans.plan(i), cluster))
    idx = list(islice(ok, 0, 200, 10))
    assert_arrays_agree(m, cluster, plans, idx)
    e = estimate_training(m, cluster, plans.plan(idx[0]))
    assert e.tp_overlap_gain is not None


def test_megatron_export_notes_the_fp8_forward_reduce_scatters():
    # the script passes no --tp-comm-overlap-cfg: Transformer Engine runs its 16-SM pipeline where the plan was
    # priced at the fp8 configs' 1-SM ring exchange, and the header says so (bf16 plans keep the old note)
    import dataclasses
    from pathlib import Path

    from llmplan.export import render_all
    from llmplan.planfile import load_plan
    base = load_plan(Path(__file__).parent / "data" / "plans" / "dense_train.json")
    over = {"tp": 8, "sp": True, "tp_comm_overlap": True, "tp_impl": "megatron"}
    for dtype, said in (("fp8", True), ("bf16", False)):
        pf = dataclasses.replace(base, plan=base.plan.model_copy(update={**over, "dtype": dtype}))
        script = " ".join(render_all(pf, "megatron")[0]["megatron_pretrain.sh"].replace("#", " ").split())
        assert "set_sm_margin" in script and ("1-SM ring exchange" in script) == said


def test_the_gain_prices_both_arms_on_the_clusters_nvlink_domain(cli):
    # HybridEP's metadata scan reads the EP ranks of one NVLink domain (ParallelPlan.nvlink_domain_ranks, set from
    # the cluster): EP16 over two DGX H100 nodes is 8 a domain. The gain must be the two estimates' difference,
    # the overlap-off arm priced on the same domain (it was priced at the whole EP group before the review fix).
    common = ("estimate", "--model", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--nodes", "4", "--tp", "2",
              "--dp", "16", "--ep", "16", "--sp", "--moe-dispatcher", "deepep", "--moe-flex-backend", "hybridep",
              "--global-batch", "256", "--seq-len", "4096", "--json")
    on, off = cli(*common, "--tp-comm-overlap").json(), cli(*common, "--no-tp-comm-overlap").json()
    assert on["tp_overlap_gain_s"] == pytest.approx(off["time"]["step_s"] - on["time"]["step_s"], rel=1e-9)
