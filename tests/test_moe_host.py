"""MoE layers' host waits and the plan's CUDA graphs (issue 32): a dropless MoE layer's forward waits for its
token counts on the host unless a full-iteration graph with a static budget replaces it; per-layer graphs cut
launches; check_plan's rules and the Megatron-LM flags; golden rows from Megatron-Bridge's performance tables."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.moe import EAGER_OP_HOST_S, HOST_SYNC_S, MOE_CYCLE_HOST_OPS, host_syncs_per_layer
from llmplan.cost.step import host_seconds, host_sync_seconds
from llmplan.estimate import estimate_training
from llmplan.export import render_all
from llmplan.planfile import load_plan
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

sys.path.insert(0, str(Path(__file__).parent))
from test_export import PLANS, parse_megatron  # noqa: E402  (the recorded Megatron-LM parser at d98e8a6)

M = builtin_models()
S = builtin_systems()


def _row(acc, rec: dict) -> tuple[float, float]:
    (_, pred, meas), *_ = acc.predict(rec, acc.family(rec["id"]))
    return pred, meas


# Golden rows (Megatron-Bridge performance summary tables, the releases named in the ids; tokens/s per GPU as
# published). Tolerance 15%: issue 32's target for the MoE rows of mbridge.
# Small experts under a full-iteration graph: Qwen3-30B-A3B (128 experts of FFN 768, top-8) on 8 B300, 26.06,
# MXFP8, micro-batch 8 (preset: cuda_graph_impl full_iteration, moe_expert_rank_capacity_factor 1.5).
SMALL_FULL = "mbridge-26.06-pretrain-qwen3-30b-a3b-dgx-b300-8gpu-mxfp8-tp1pp1cp1ep8vpnagbs512mbs8"
# Large experts under per-layer graphs: Qwen3-235B-A22B (FFN 1,536 on hidden 4,096) on 256 GB300, 26.04, MXFP8,
# PP4 VP12 EP32 (preset: cuda_graph_impl transformer_engine, attn / moe_router / moe_preprocess): every MoE
# layer's forward waits for its token counts.
LARGE_LAYERS = "mbridge-26.04-pretrain-qwen3-235b-a22b-dgx-gb300-256gpu-mxfp8-tp1pp4cp1ep32vp12gbs8192mbs2"
# The same small-expert layout as SMALL_FULL's on GB300, 26.04 (per-layer graphs, host waits): published 31,470
# against 45,275 in 26.06. llmplan predicted about 39,100 (+24%) when this test was written, 36,746 (+16.8%)
# before Qwen3's q / k norms entered the memory-bound traffic, 36,185 (+15.0%, the edge of the tolerance) with
# them: the host waits it prices are 0.1% of that step, so what 26.06 gained lies elsewhere
# (docs/validation.md#moe-host).
SMALL_LAYERS = "mbridge-26.04-pretrain-qwen3-30b-a3b-dgx-gb300-8gpu-mxfp8-tp1pp1cp1ep8vpnagbs512mbs8"


def test_small_expert_full_iteration_row_within_15_percent(published_runs, acc):
    # -11.8% while the fitted 0.7 held with no rate curve; -16.2% with the attention rate curve at 4k tokens
    # (xfail then); -5.9% with the preset's FP8 dot-product attention read (fp8_dot_product_attention=True in
    # v0.5.0's QWEN3_30B_A3B_PRETRAIN_CONFIG_B300_FP8_MX_V1; docs/formulas.md#compute.fp8_attention)
    rec = published_runs[SMALL_FULL]
    assert acc.mbridge_cuda_graphs(rec) == "full-iteration"
    assert acc.mbridge_fp8_attention(rec)
    pred, meas = _row(acc, rec)
    assert meas == 40769
    assert pred == pytest.approx(meas, rel=0.15)


def test_large_expert_per_layer_graphs_row_within_15_percent(published_runs, acc):
    rec = published_runs[LARGE_LAYERS]
    assert acc.mbridge_cuda_graphs(rec) == "layers"
    pred, meas = _row(acc, rec)
    assert meas == 6994
    assert pred == pytest.approx(meas, rel=0.15)


def test_small_expert_per_layer_graphs_row_within_15_percent(published_runs, acc):
    rec = published_runs[SMALL_LAYERS]
    assert acc.mbridge_cuda_graphs(rec) == "layers"
    pred, meas = _row(acc, rec)
    assert meas == 31470
    assert pred == pytest.approx(meas, rel=0.15)


def _moe_plan(**kw) -> ParallelPlan:
    base = dict(ep=8, dp=8, etp=1, micro_batch=1, global_batch=64, seq_len=4096, zero=1)
    return ParallelPlan(**{**base, **kw})


def test_only_dropless_eager_moe_layers_wait_for_the_host():
    m = M["qwen3-30b-a3b"]
    assert host_syncs_per_layer(m, _moe_plan()) == 1.0
    assert host_syncs_per_layer(m, _moe_plan(cuda_graphs="layers")) == 1.0  # the wait is not captured
    assert host_syncs_per_layer(m, _moe_plan(cuda_graphs="full-iteration", moe_dispatcher="deepep",
                                             moe_flex_backend="hybridep")) == 0.0
    assert host_syncs_per_layer(m, _moe_plan(moe_capacity_factor=1.25)) == 0.0  # counts known on the host
    assert host_syncs_per_layer(M["qwen3-8b"], ParallelPlan(dp=8, global_batch=64)) == 0.0


def test_each_wait_idles_the_gpu_for_a_wake_up_and_one_eager_op_when_the_layer_outlasts_the_host():
    plan = _moe_plan()
    one = float(host_sync_seconds(48, 0, 1.0, MOE_CYCLE_HOST_OPS, 1.0))  # a 1 s layer: the host is ahead at once
    assert one == pytest.approx(48 * (HOST_SYNC_S + EAGER_OP_HOST_S))
    assert float(host_sync_seconds(48, 1, 1.0, MOE_CYCLE_HOST_OPS, 1.0)) == pytest.approx(2 * one)  # recompute
    # A long micro-batch hides every launch; what stays is the step start and the waits
    start = float(host_seconds(plan, 48, 10.0, 0))
    waits = float(host_seconds(plan, 48, 10.0, 0, 48, 1.0, 1.0)) - start
    assert waits == pytest.approx(plan.num_microbatches * one)


def _simulated_idle(host_ops: int, h: float, gpu_s: float) -> float:
    """GPU idle time after a wait that empties the queue: the host issues one op every h seconds, the GPU runs
    each (gpu_s / host_ops seconds) when it has been issued and the previous one is done."""
    g = gpu_s / host_ops
    end = 0.0
    for j in range(1, host_ops + 1):
        end = max(j * h, end) + g
    return end - gpu_s


@settings(max_examples=40, deadline=None, derandomize=True)
@given(ops=st.integers(1, 200), gpu_us=st.floats(0.0, 5000.0))
def test_paced_idle_matches_a_simulated_queue_within_one_op(ops, gpu_us):
    # The closed form max(h, n h - G) is the simulated queue's idle time to within one op's GPU time.
    gpu = gpu_us * 1e-6
    closed = float(host_sync_seconds(1, 0, 1.0, ops, gpu)) - HOST_SYNC_S
    sim = _simulated_idle(ops, EAGER_OP_HOST_S, gpu)
    assert closed <= sim + 1e-12
    assert sim <= closed + gpu / ops + 1e-12


def test_short_layers_run_at_the_hosts_pace_and_per_layer_graphs_cut_it():
    # A layer whose forward takes 100 us on the GPU: after each wait the host needs 80 ops x 8 us = 640 us.
    eager = float(host_sync_seconds(1, 0, 1.0, MOE_CYCLE_HOST_OPS, 100e-6))
    assert eager == pytest.approx(HOST_SYNC_S + MOE_CYCLE_HOST_OPS * EAGER_OP_HOST_S - 100e-6)
    plan, layers = _moe_plan(), _moe_plan(cuda_graphs="layers")
    full = _moe_plan(cuda_graphs="full-iteration", moe_dispatcher="deepep", moe_flex_backend="hybridep")
    t = [float(host_seconds(p, 48, 10.0, 0, 48, host_syncs_per_layer(M["qwen3-30b-a3b"], p), 100e-6))
         for p in (plan, layers, full)]
    assert t[0] > t[1] > t[2] == pytest.approx(float(host_seconds(full, 48, 10.0, 0)))  # the step start only


@settings(max_examples=25, deadline=None, derandomize=True)
@given(mb=st.sampled_from([1, 2, 4, 8]), ep=st.sampled_from([1, 2, 4, 8]))
def test_more_graphed_never_slower(mb, ep):
    # one dispatcher under all three: the flex dispatcher's hybridep backend, the one a full-iteration graph runs
    # (check_plan cuda_graphs_flex_backend)
    m, cluster = M["qwen3-30b-a3b"], ClusterSpec(system=S["dgx-b200"], num_nodes=1)
    times = []
    for graphs in ("none", "layers", "full-iteration"):
        plan = ParallelPlan(ep=ep, dp=8, etp=1, micro_batch=mb, global_batch=64, seq_len=4096, zero=1,
                            moe_dispatcher="deepep", moe_flex_backend="hybridep", cuda_graphs=graphs)
        assert not check_plan(m, plan, cluster), graphs
        times.append(float(estimate_training(m, cluster, plan).time.total))
    assert times[0] >= times[1] >= times[2]


def test_check_plan_refuses_a_full_iteration_graph_around_the_alltoall_dispatchers_wait():
    m = M["qwen3-30b-a3b"]
    rules = {v.rule for v in check_plan(m, _moe_plan(cuda_graphs="full-iteration"))}
    assert "cuda_graphs_moe" in rules
    assert "cuda_graphs_moe" not in {v.rule for v in check_plan(m, _moe_plan(cuda_graphs="full-iteration",
                                                                               moe_dispatcher="deepep",
                                                                               moe_flex_backend="hybridep"))}
    assert "cuda_graphs_moe" not in {v.rule for v in check_plan(m, _moe_plan(cuda_graphs="full-iteration",
                                                                               moe_capacity_factor=1.0))}
    dense = {v.rule for v in check_plan(M["qwen3-8b"], ParallelPlan(dp=8, global_batch=64, recompute="full",
                                                                        cuda_graphs="layers"))}
    assert "cuda_graphs_recompute" in dense


def test_check_plan_refuses_deepeps_normal_kernels_in_a_full_iteration_graph():
    # Megatron-LM d98e8a6: DeepEP's normal dispatch waits on the host (moe/fused_a2a.py:107-108, "not compatible
    # with CUDA graph") and the static per-rank budget needs hybridep (transformer_config.py:1868-1873); the export
    # used to write hybridep for such a plan while the estimate priced DeepEP's kernels
    from llmplan.search.grid import from_plan
    from llmplan.specs.check_switches import SWITCH_RULES
    from llmplan.specs.rule import as_bool

    m, cluster = M["qwen3-30b-a3b"], ClusterSpec(system=S["dgx-h100"], num_nodes=1)
    pair = _moe_plan(cuda_graphs="full-iteration", moe_dispatcher="deepep")
    assert pair.moe_flex_backend == "deepep"  # the default backend
    got = [v.message for v in check_plan(m, pair, cluster) if v.rule == "cuda_graphs_flex_backend"]
    assert len(got) == 1, got
    assert got[0].startswith("cuda_graphs full-iteration with moe_dispatcher deepep and moe_flex_backend deepep "
                             "(qwen3-30b-a3b)")
    # the fix names the plan key first, then estimate / search's training flag (--train-cuda-graphs)
    assert got[0].endswith("set the plan key moe_flex_backend: hybridep (--moe-flex-backend hybridep where the "
                           "command takes it), or --train-cuda-graphs layers / none")
    for ok in (pair.model_copy(update={"moe_flex_backend": "hybridep"}),
               pair.model_copy(update={"cuda_graphs": "layers"}), pair.model_copy(update={"cuda_graphs": "none"})):
        assert "cuda_graphs_flex_backend" not in {v.rule for v in check_plan(m, ok, cluster)}, ok.cuda_graphs
    # the search's arrays read the same predicate: the pair is cut from every plan of such a workload
    rule = next(r for r in SWITCH_RULES if r.name == "cuda_graphs_flex_backend")
    assert not as_bool(rule.ok(m, from_plan(pair), cluster)).any()
    assert as_bool(rule.ok(m, from_plan(pair.model_copy(update={"moe_flex_backend": "hybridep"})), cluster)).all()


def test_a_plan_file_with_deepep_in_a_full_iteration_graph_exits_2(cli, tmp_path):
    # estimate and export of the pair: one line, exit 2, nothing written; with hybridep the export writes the
    # plan's own backend
    from test_switch_cli import edited

    path = edited(tmp_path, "moe_train", cuda_graphs="full-iteration", moe_dispatcher="deepep")
    for args in (("estimate", "--plan", path), ("export", path, "--to", "megatron", "-o", tmp_path / "out")):
        r = cli(*args)
        lines = [x for x in r.err.splitlines() if x.strip()]
        assert r.code == 2 and len(lines) == 1 and "Traceback" not in r.err, r.err
        assert "cuda_graphs full-iteration with moe_dispatcher deepep and moe_flex_backend deepep" in lines[0]
        assert "set the plan key moe_flex_backend: hybridep" in lines[0], r.err
    assert not (tmp_path / "out").exists()
    path = edited(tmp_path, "moe_train", cuda_graphs="full-iteration", moe_dispatcher="deepep",
                  moe_flex_backend="hybridep")
    r = cli("export", path, "--to", "megatron", "-o", tmp_path / "ok")
    assert r.code == 0, r.err
    assert "--moe-flex-dispatcher-backend hybridep" in (tmp_path / "ok" / "megatron_pretrain.sh").read_text()


def test_megatron_export_names_the_graphs_in_megatrons_flags():
    base = load_plan(PLANS / "moe_train.json")
    layers = dataclasses.replace(base, plan=base.plan.model_copy(update={"cuda_graphs": "layers"}))
    ns, _ = parse_megatron(render_all(layers, "megatron")[0]["megatron_pretrain.sh"])
    assert ns.cuda_graph_impl == "transformer_engine"
    assert ns.cuda_graph_modules == ["attn", "moe_router", "moe_preprocess"]
    full = dataclasses.replace(base, plan=base.plan.model_copy(update={"cuda_graphs": "full-iteration",
                                                                       "moe_dispatcher": "deepep",
                                                                       "moe_flex_backend": "hybridep"}))
    ns, _ = parse_megatron(render_all(full, "megatron")[0]["megatron_pretrain.sh"])
    assert ns.cuda_graph_impl == "full_iteration" and ns.no_check_for_nan_in_loss_and_grad
    assert ns.moe_flex_dispatcher_backend == "hybridep" and float(ns.moe_expert_rank_capacity_factor) == 1.5
    assert ns.moe_use_grouped_tensor
    ns, _ = parse_megatron(render_all(base, "megatron")[0]["megatron_pretrain.sh"])
    assert ns.cuda_graph_impl is None


def test_vectorised_search_agrees_with_the_scalar_host_terms():
    # The search's plan arrays read cuda_graphs from the workload; pipeline stages with uneven MoE layers too.
    from llmplan.search.evaluate import evaluate
    from llmplan.search.grid import from_plan

    m, cluster = M["qwen3-30b-a3b"], ClusterSpec(system=S["dgx-h100"], num_nodes=2)
    for upd in ({}, {"cuda_graphs": "layers"},
                {"cuda_graphs": "full-iteration", "moe_dispatcher": "deepep", "moe_flex_backend": "hybridep"},
                {"moe_capacity_factor": 1.25}, {"pp": 2, "dp": 8, "ep": 8, "recompute": "full"}):
        plan = ParallelPlan(dp=16, ep=16, etp=1, global_batch=256, micro_batch=1, seq_len=4096).model_copy(update=upd)
        scalar = estimate_training(m, cluster, plan)
        vec = evaluate(m, cluster, from_plan(plan))
        assert float(vec.step.total[0]) == pytest.approx(float(scalar.time.total), rel=1e-9), upd
        assert float(np.asarray(vec.step.overheads["host"])[0]) == pytest.approx(
            float(scalar.time.overheads["host"]), rel=1e-9), upd
