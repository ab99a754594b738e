"""ParallelPlan.delay_wgrad (Megatron-Core --delay-wgrad-compute inside the combined-1F1B EP overlap): the windows the
backward all-to-alls hide behind, check_plan's rules, the exports and the Megatron-Bridge rows that set it
(docs/formulas.md#moe.delay_wgrad, docs/validation.md#delay-wgrad).

The schedule (NVIDIA/Megatron-LM megatron/core/models/common/model_chunk_schedule_plan.py at d98e8a6,
TransformerLayerSchedulePlan.run): per layer pair the compute stream runs the forward micro-batch's attention node
(A_f), the backward one's experts' input gradient (M_bd) and, delayed, their weight gradient (M_bw), the forward's
experts (M_f), the backward's attention input gradient (A_bd) and, delayed, its weight gradient (A_bw); the
communication stream runs combine backward (waits for the previous layer's A_bd), dispatch forward (waits A_f),
dispatch backward (waits M_bd), combine forward (waits M_f); M_bd waits the combine backward, M_f the dispatch
forward, A_bd the dispatch backward, the next A_f the combine forward.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from llmplan.cost.moe import EP_OVERLAP_HIDDEN, delayed_windows, ep_exposed, stretched_transfer
from llmplan.estimate import estimate_training
from llmplan.export import render_all
from llmplan.export.common import delay_wgrad_refusal
from llmplan.planfile import load_plan
from llmplan.specs.check import check_plan
from llmplan.specs.cluster import ClusterSpec
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems
from test_export import parse_megatron

PLANS = Path(__file__).parent / "data" / "plans"


def _simulated_layer(a_f, m_bd, m_bw, m_f, a_bd, a_bw, t, layers=40):
    """Seconds per layer pair of the two streams run as the source orders them (dependencies above), many layers
    in a row, from the start of the schedule: an event simulation, independent of cost.moe."""
    comp = comm = a_bd_end = c_f_end = 0.0
    start = 0.0
    for i in range(layers):
        c_b_end = max(comm, a_bd_end) + t              # combine backward: after the previous layer's A_bd
        a_f_end = max(comp, c_f_end) + a_f             # attention forward: after the previous combine forward
        m_bd_end = max(a_f_end, c_b_end) + m_bd        # experts' input gradient: after the combine backward
        d_f_end = max(c_b_end, a_f_end) + t            # dispatch forward: after the attention node forward
        m_bw_end = m_bd_end + m_bw
        d_b_end = max(d_f_end, m_bd_end) + t           # dispatch backward: after the input gradient only
        m_f_end = max(m_bw_end, d_f_end) + m_f         # experts' forward: after the dispatch forward
        c_f_end = max(d_b_end, m_f_end) + t            # combine forward: after the experts' forward
        a_bd_end = max(m_f_end, d_b_end) + a_bd        # attention input gradient: after the dispatch backward
        comp, comm = a_bd_end + a_bw, c_f_end
        if i == layers // 2:
            start = max(comp, comm)
    return (max(comp, comm) - start) / (layers - layers // 2 - 1)


@pytest.mark.parametrize("seed", range(40))
def test_delayed_windows_match_an_event_simulation_of_the_two_streams(seed):
    # Each all-to-all hides min(t, w_i) of the windows cost.moe prices; the simulation, run without the phase
    # barriers the formula assumes, agrees with it to rounding, delayed or not.
    rng = random.Random(seed)
    a_f, m_bd, m_bw, m_f, a_bd, a_bw = (rng.uniform(0.2, 2.0) for _ in range(6))
    t = rng.uniform(0.1, 3.0)
    compute = a_f + m_bd + m_bw + m_f + a_bd + a_bw
    pair = (a_f, m_bd + m_bw, m_f, a_bd + a_bw)
    for deferred, sim in (((a_bw, m_bw), _simulated_layer(a_f, m_bd, m_bw, m_f, a_bd, a_bw, t)),
                          ((0.0, 0.0), _simulated_layer(a_f, m_bd + m_bw, 0.0, m_f, a_bd + a_bw, 0.0, t))):
        exposed = sum(max(0.0, t - w) for w in delayed_windows(pair, t, deferred))
        assert sim == pytest.approx(compute + exposed, rel=1e-9, abs=1e-12)


def test_delayed_windows_by_hand():
    # A_f 1.0, M_b 2.0 (0.9 of it the weight gradient), M_f 1.1, A_b 2.0 (0.25 of it), t 1.85: the dispatch
    # backward gets M_f + min(0.9, 2.0 - 1.85) = 1.25, the combine backward A_f + min(0.25, 0.15) = 1.15.
    assert delayed_windows((1.0, 2.0, 1.1, 2.0), 1.85, (0.25, 0.9)) == pytest.approx((1.15, 2.0, 1.25, 2.0))
    # a short transfer (0.5): the whole deferred GEMM joins each window
    assert delayed_windows((1.0, 2.0, 1.1, 2.0), 0.5, (0.25, 0.9)) == pytest.approx((1.25, 2.0, 2.0, 2.0))
    # a transfer longer than the chunk it follows (2.5 > M_b, A_b): the forward transfer holds the stream, no gain
    assert delayed_windows((1.0, 2.0, 1.1, 2.0), 2.5, (0.25, 0.9)) == pytest.approx((1.0, 2.0, 1.1, 2.0))
    assert delayed_windows((), 1.0, (0.25, 0.9)) == ()


def test_ep_exposed_with_delayed_weight_gradients_by_hand():
    # 8 micro-batches, no pipeline: one unpaired; 2 MoE layers; 4 all-to-alls of t = 0.016 / 2 / 4 = 2 ms each.
    # Windows (1, 4, 1.5, 3) ms: hidden 1 + 2 + 1.5 + 2 = 6.5 ms a layer. Deferred (0.5, 1.5) ms: the dispatch
    # backward's window 1.5 + min(1.5, 4 - 2) = 3 ms, the combine backward's 1 + min(0.5, 3 - 2) = 1.5 ms:
    # hidden 1.5 + 2 + 2 + 2 = 7.5 ms.
    # With the residual on the compute (the share of the grown windows) that is 0.8 ms a layer less; on the
    # communication stream (docs/formulas.md#moe.delay_wgrad) a paired layer leaves 8 - 0.8 x 6.5 = 2.8 ms exposed,
    # each transfer stretches to t' with (t' - 1) + (t' - 1.5) = 2.8: 2.65 ms, where the deferral grows A_f to
    # 1 + min(0.5, 3 - 2.65) = 1.35 and M_f to 1.5 + min(1.5, 4 - 2.65) = 2.85 ms: 1.5 ms less. The smaller, 0.8.
    plan = ParallelPlan(dp=8, ep=8, global_batch=64, ep_comm_overlap=True, delay_wgrad=True)
    pair = (0.001, 0.004, 0.0015, 0.003)
    plain = ep_exposed(plan, 0.016, 1.0, 0.0, pair, 2)
    delayed = ep_exposed(plan, 0.016, 1.0, 0.0, pair, 2, (0.0005, 0.0015))
    assert stretched_transfer(pair, 0.0028) == pytest.approx(0.00265)
    assert plain == pytest.approx(0.016 - EP_OVERLAP_HIDDEN * 7 / 8 * 2 * 0.0065)
    assert delayed == pytest.approx(0.016 - EP_OVERLAP_HIDDEN * 7 / 8 * 2 * 0.0075)
    # PR 3862's shape (test_delayed_windows_by_hand): windows (1, 2, 1.1, 2) ms, t 1.85, deferred (0.25, 0.9). On
    # the compute: 0.8 x (0.15 + 0.15) = 0.24 ms. Exposed 7.4 - 0.8 x 5.8 = 2.76 ms: t' = (2.76 + 6.1) / 4 = 2.215 ms,
    # longer than every window, so the deferral frees nothing of it: no gain.
    pair, t = (0.001, 0.002, 0.0011, 0.002), 0.00185
    assert stretched_transfer(pair, 0.00276) == pytest.approx(0.002215)
    for dispatcher in ("alltoall", "deepep"):
        p = plan.model_copy(update={"moe_dispatcher": dispatcher})
        assert ep_exposed(p, 8 * t, 1.0, 0.0, pair, 2, (0.00025, 0.0009)) == pytest.approx(
            ep_exposed(p, 8 * t, 1.0, 0.0, pair, 2), rel=1e-12)
        assert ep_exposed(p, 8 * t, 1.0, 0.0, pair, 2) == pytest.approx(8 * t - EP_OVERLAP_HIDDEN * 7 / 8 * 2 * 0.0058)


def test_stretched_transfer_inverts_the_exposure():
    # sum_i max(t' - w_i, 0) = exposed, checked on random windows; no exposure: the shortest window
    rng = random.Random(7)
    for _ in range(200):
        pair = tuple(rng.uniform(0.1, 3.0) for _ in range(4))
        e = rng.uniform(0.0, 6.0)
        t = stretched_transfer(pair, e)
        assert sum(max(t - w, 0.0) for w in pair) == pytest.approx(e, abs=1e-12)
    assert stretched_transfer((1.0, 2.0, 1.5, 3.0), 0.0) == pytest.approx(1.0)


M, SYSTEMS = builtin_models(), builtin_systems()


def test_the_step_prices_it_only_through_the_windows():
    # Mixtral on 16 H100 at EP 8 with the overlap: delay_wgrad never costs time and adds no FLOPs or memory.
    m, cluster = M["mixtral-8x7b"], ClusterSpec(system=SYSTEMS["dgx-h100"], num_nodes=2)
    plan = ParallelPlan(dp=16, ep=8, global_batch=256, seq_len=4096, ep_comm_overlap=True)
    on, off = (estimate_training(m, cluster, plan.model_copy(update={"delay_wgrad": d})) for d in (True, False))
    assert float(on.time.total) <= float(off.time.total)
    assert float(on.time.total) - float(on.time.comm_exposed) == pytest.approx(
        float(off.time.total) - float(off.time.comm_exposed), rel=1e-12)
    assert float(on.memory.total) == float(off.memory.total)


def test_check_plan_refuses_it_without_the_ep_overlap():
    m, cluster = M["mixtral-8x7b"], ClusterSpec(system=SYSTEMS["dgx-h100"], num_nodes=2)
    plan = ParallelPlan(dp=16, ep=8, global_batch=256, seq_len=4096, delay_wgrad=True)
    v = check_plan(m, plan, cluster)
    assert [x.rule for x in v] == ["delay_wgrad_ep_overlap"]
    assert "delay_wgrad with ep 8 and no ep_comm_overlap" in v[0].message
    assert "overlap_moe_expert_parallel_comm" in v[0].message and "--ep-comm-overlap" in v[0].message
    assert not check_plan(m, plan.model_copy(update={"ep_comm_overlap": True}), cluster)
    dense = check_plan(M["llama-3.1-8b"], ParallelPlan(dp=16, global_batch=256, delay_wgrad=True), cluster)
    assert [x.rule for x in dense] == ["moe_switches_dense"]


def test_check_plan_graphed_delayed_wgrad_needs_fused_accumulation():
    # Megatron-LM arguments.py (d98e8a6): with overlap_grad_reduce and the attention in a CUDA graph, delayed
    # weight gradients need gradient_accumulation_fusion (and no attention bias).
    m, cluster = M["mixtral-8x7b"], ClusterSpec(system=SYSTEMS["dgx-h100"], num_nodes=2)
    plan = ParallelPlan(dp=16, ep=8, global_batch=256, seq_len=4096, ep_comm_overlap=True, delay_wgrad=True,
                        overlap_grad_reduce=True, cuda_graphs="layers", grad_accumulation="add")
    v = [x for x in check_plan(m, plan, cluster) if x.rule == "delay_wgrad_graphs"]
    assert len(v) == 1 and "grad_accumulation add" in v[0].message and "gradient_accumulation_fusion" in v[0].message
    assert not [x for x in check_plan(m, plan.model_copy(update={"grad_accumulation": "fused"}), cluster)
                if x.rule == "delay_wgrad_graphs"]


def test_cli_refuses_it_in_one_line(cli):
    r = cli("estimate", "--model", "mixtral-8x7b", "--hardware", "dgx-h100", "--nodes", "2", "--tp", "1",
            "--ep", "8", "--global-batch", "64", "--delay-wgrad")
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert r.code == 2 and len(lines) == 1 and "Traceback" not in r.err
    assert "delay_wgrad" in lines[0] and "--ep-comm-overlap" in lines[0]
    ok = cli("estimate", "--model", "mixtral-8x7b", "--hardware", "dgx-h100", "--nodes", "2", "--tp", "1",
             "--ep", "8", "--global-batch", "64", "--ep-comm-overlap", "--delay-wgrad")
    assert ok.code == 0, ok.err


def _overlap_plan():
    pf = load_plan(PLANS / "deepseek_train.json")
    return dataclasses.replace(pf, plan=pf.plan.model_copy(update={
        "ep_comm_overlap": True, "delay_wgrad": True, "recompute": "selective", "pp_first": 0, "pp_last": 0,
        "vpp": 2, "pp_layers": (7, 8, 8, 8, 8, 8, 8, 6)}))


def test_megatron_writes_the_flag_and_others_refuse():
    pf = _overlap_plan()
    ns, _ = parse_megatron(render_all(pf, "megatron")[0]["megatron_pretrain.sh"])
    assert ns.overlap_moe_expert_parallel_comm and ns.delay_wgrad_compute  # the recorded parser's flag
    off = dataclasses.replace(pf, plan=pf.plan.model_copy(update={"delay_wgrad": False}))
    ns, _ = parse_megatron(render_all(off, "megatron")[0]["megatron_pretrain.sh"])
    assert not ns.delay_wgrad_compute
    # Megatron-Bridge writes both TransformerConfig fields (tests/test_export_bridge_epov.py)
    bridge = render_all(pf, "megatron-bridge")[0]["megatron_bridge_pretrain.sh"]
    assert "'model.overlap_moe_expert_parallel_comm=true'" in bridge and "'model.delay_wgrad_compute=true'" in bridge
    # torchtitan and DeepSpeed run no combined-1F1B schedule: the refusal both their checks list
    what, bad, fix = delay_wgrad_refusal(pf)
    assert bad and "delay_wgrad" in what
    assert fix == "re-plan with --no-delay-wgrad, or export to megatron or megatron-bridge"
    assert not delay_wgrad_refusal(off)[1]
    import llmplan.export.deepspeed as ds
    import llmplan.export.torchtitan as tt
    assert ds.delay_wgrad_refusal is delay_wgrad_refusal and tt.delay_wgrad_refusal is delay_wgrad_refusal


def test_bridge_presets_set_it_with_the_overlap(published_runs, acc, row_setup):
    # Every Megatron-Bridge performance preset that runs the EP overlap sets delay_wgrad_compute with it
    # (utils/overrides.py _set_moe_a2a_overlap_overrides, v0.3.0 .. v0.6.0); the H100 Qwen3-30B-A3B card recipe
    # does not (perf_recipes/qwen/h100/qwen3_moe.py: False), the GPT-OSS GB200 card recipe does.
    for rid, rec in published_runs.items():
        if acc.family(rid) == "mbridge-moe":
            assert acc.mbridge_delay_wgrad(rec) == acc.mbridge_moe_recipe(rec)[1], rid
    assert row_setup("bridgecard-gb200-bf16-gpt-oss-120b-64gpu-gbs1280")[2].delay_wgrad
    assert not row_setup("bridgecard-h100-bf16-qwen3-30b-a3b-16gpu-gbs1024-ep-overlap-on-pr5094")[2].delay_wgrad
    assert row_setup("mbridge-26.06-pretrain-qwen3-30b-a3b-dgx-gb200-8gpu-mxfp8-tp1pp1cp1ep8vpnagbs512mbs4")[2].delay_wgrad


def test_pr3862_delayed_wgrad_pair(row_setup):
    # Megatron-Bridge PR 3862 (750d0d322, docs/training/communication-overlap.md, skills/perf-expert-parallel-overlap/
    # SKILL.md): on the alltoall EP16 H100 Qwen3-30B-A3B smoke, iterations 3-8 of 8, adding delay_wgrad_compute to
    # the overlap was "neutral": 31.31 s -> 31.20 s (0.35%; "directional rather than release-grade"), inside the
    # 0.38% that PR 5094's overlap arm moves between its two published windows (21.0725 / 20.992 s). Read with
    # the overlap's residual on the communication stream (docs/formulas.md#moe.delay_wgrad), each transfer
    # stretches past every window, so the deferral frees nothing, and it gains the smaller of that and the share of
    # the grown windows (docs/validation.md#ab-pairs; it priced 2.55%, 3.64% at first, when the share of the grown
    # windows was all). Tolerance 0.5 point: the measured change is noise.
    from llmplan.cost.compute import ep_deferred_wgrad, ep_pair_windows
    from llmplan.cost.moe import stretched_transfer
    m, cluster, plan = row_setup("bridgecard-h100-bf16-qwen3-30b-a3b-16gpu-gbs1024-ep-overlap-off-pr5094")
    a2a = plan.model_copy(update={"moe_dispatcher": "alltoall", "moe_flex_backend": "deepep", "moe_dispatch_sms": None,
                                  "cuda_graphs": "none", "ep_comm_overlap": True})
    t_on = float(estimate_training(m, cluster, a2a).time.total)
    t_dw = float(estimate_training(m, cluster, a2a.model_copy(update={"delay_wgrad": True})).time.total)
    assert 0.0 <= (t_on - t_dw) / t_on
    assert abs((t_on - t_dw) / t_on - (31.31 - 31.20) / 31.31) < 0.005
    # the cause: the priced overlap leaves each paired layer's transfers stretched longer than the experts' and the
    # attention's backward chunks, the only ones whose deferred GEMMs could widen a window
    gpu = cluster.system.gpu
    a_f, m_b, m_f, a_b = ep_pair_windows(m, a2a, gpu)
    a_dw, e_dw = ep_deferred_wgrad(m, a2a.model_copy(update={"delay_wgrad": True}), gpu)
    assert 0 < e_dw < m_b and 0 < a_dw < a_b
    t = 1.85e-3  # the 1.85-1.88 ms transfer docs/validation.md#delay-wgrad prices
    exposed = 4 * t - EP_OVERLAP_HIDDEN * (1 - gpu.contention) * sum(min(t, w) for w in (a_f, m_b, m_f, a_b))
    assert stretched_transfer((a_f, m_b, m_f, a_b), exposed) > max(m_b, a_b)


def test_delayed_wgrad_gains_nothing_with_every_transfer_inside_its_window(row_setup):
    m, cluster, plan = row_setup("bridgecard-h100-bf16-qwen3-30b-a3b-16gpu-gbs1024-ep-overlap-off-pr5094")
    # The HybridEP pair (PR 5094) has every transfer inside its window: nothing to gain.
    hyb = plan.model_copy(update={"ep_comm_overlap": True})
    assert float(estimate_training(m, cluster, hyb.model_copy(update={"delay_wgrad": True})).time.total) == \
        pytest.approx(float(estimate_training(m, cluster, hyb).time.total), rel=1e-12)
