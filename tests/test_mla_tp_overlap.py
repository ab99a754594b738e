"""Megatron-Core turns TP communication overlap off for a whole MLA model (docs/validation.md#mla-tp-overlap).

NVIDIA/Megatron-LM d98e8a6, megatron/core/extensions/transformer_engine.py, TELinear.__init__: with
config.tp_comm_overlap and a tp_comm_buffer_name not in ["qkv", "proj", "fc1", "fc2"] it sets
self.config.tp_comm_overlap = False, on the TransformerConfig every layer shares. MLASelfAttention.__init__
(transformer/multi_latent_attention.py) builds linear_q_down_proj ("q_down_proj") or linear_q_proj ("q_proj")
in the first MLA layer, after that layer's linear_proj and before its MLP: every later TP linear runs without
userbuffers. The userbuffers themselves are allocated before the model is built (megatron/training/
initialize.py _initialize_tp_communicators under args.tp_comm_overlap), so their memory stays.
So: an MLA plan asking for TP overlap is priced as the same plan without it (step), with the userbuffers' memory;
a non-MLA plan keeps its overlap."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from llmplan.cost.runtime_memory import mla_turns_tp_overlap_off
from llmplan.estimate import estimate_training, stage_views
from llmplan.report.training import estimate_json
from llmplan.search.evaluate import evaluate
from llmplan.search.grid import Workload, default_space, enumerate_plans
from llmplan.search.run import search
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import resolve_model, resolve_system

H800 = ClusterSpec(system=resolve_system("dgx-h800"), num_nodes=256)


def _dsv3_plan(overlap: bool, **kw) -> ParallelPlan:  # benchmarks/search_speed.py's H800 #1 layout
    fields = dict(tp=4, pp=16, pp_first=3, pp_last=2, dp=32, ep=8, etp=1, sp=True, zero=1, micro_batch=1,
                  global_batch=4096, seq_len=4096, dtype="bf16")
    return ParallelPlan(**{**fields, **kw}, tp_comm_overlap=overlap)


def test_mla_plan_with_overlap_is_priced_as_without_it_but_keeps_the_userbuffers():
    m = resolve_model("deepseek-v3")
    on, off = estimate_training(m, H800, _dsv3_plan(True)), estimate_training(m, H800, _dsv3_plan(False))
    assert mla_turns_tp_overlap_off(m, on.plan)
    assert float(on.time.total) == pytest.approx(float(off.time.total), rel=1e-12)
    assert float(on.time.exposed["tp"]) == pytest.approx(float(off.time.exposed["tp"]), rel=1e-12)
    assert float(on.time.exposed["tp"]) > 0.3  # the whole TP traffic waits (0.551 s at this branch's start)
    assert float(on.memory.total) > float(off.memory.total)  # initialize_ub's buffers are still allocated
    assert "Megatron-Core turns TP overlap off" in estimate_json(on)["tp_overlap_off"]
    assert "tp_overlap_off" not in estimate_json(off)


def test_dtensor_async_tp_is_not_megatron_core():
    m = resolve_model("deepseek-v3")
    assert not mla_turns_tp_overlap_off(m, _dsv3_plan(True, tp_impl="dtensor"))


def test_non_mla_plan_keeps_its_overlap():
    m = resolve_model("llama-3.1-70b")
    cluster = ClusterSpec(system=resolve_system("dgx-h100"), num_nodes=8)
    base = dict(tp=8, pp=1, dp=8, sp=True, micro_batch=1, global_batch=512, seq_len=8192, dtype="bf16")
    on = estimate_training(m, cluster, ParallelPlan(**base, tp_comm_overlap=True))
    off = estimate_training(m, cluster, ParallelPlan(**base, tp_comm_overlap=False))
    assert not mla_turns_tp_overlap_off(m, on.plan)
    assert float(on.time.exposed["tp"]) < 0.5 * float(off.time.exposed["tp"])
    assert "tp_overlap_off" not in estimate_json(on)


def test_search_prices_the_rule_as_the_estimate_does():
    m = resolve_model("deepseek-v3")
    w = Workload(global_batch=4096, seq_len=4096, dtype="bf16", tp_comm_overlap=True)
    res = search(m, H800, default_space(m, H800, w), w, top=1)
    first = res.ranked[0]
    assert first.plan.tp_comm_overlap and first.plan.tp > 1
    alone = estimate_training(m, H800, first.plan)
    assert float(first.time.total) == pytest.approx(float(alone.time.total), rel=1e-9)
    unlapped = estimate_training(m, H800, first.plan.model_copy(update={"tp_comm_overlap": False}))
    assert float(first.time.total) == pytest.approx(float(unlapped.time.total), rel=1e-9)


def test_megatron_export_says_the_overlap_is_off(cli, tmp_path):
    path = tmp_path / "plan.json"
    made = cli("estimate", "--model", "deepseek-v3", "--hardware", "dgx-h800", "--nodes", "256", "--tp", "4",
               "--pp", "16", "--pp-first-layers", "3", "--pp-last-layers", "2", "--ep", "8", "--etp", "1", "--sp",
               "--tp-comm-overlap", "--global-batch", "4096",
               "--seq-len", "4096", "--save", path)
    assert made.code == 0, made.err
    assert "Megatron-Core turns TP overlap off" in made.out
    out = tmp_path / "out"
    r = cli("export", path, "--to", "megatron", "-o", out)
    assert r.code == 0, r.err
    script = (out / "megatron_pretrain.sh").read_text()
    assert "does not overlap this MLA model's TP collectives" in script
    assert "SM margins of NVIDIA's published userbuffer configs" not in script  # no userbuffer GEMM runs


def test_many_mla_plans_at_once_agree_with_scalar():
    """The vectorised path (PlanArrays.model_copy in step_time) against estimate_training, plan by plan."""
    m, cluster = resolve_model("deepseek-v3"), ClusterSpec(system=resolve_system("dgx-h800"), num_nodes=32)
    w = Workload(global_batch=1024, seq_len=4096, dtype="bf16", tp_comm_overlap=True)
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    rng = np.random.default_rng(11)
    valid = (int(i) for i in rng.permutation(len(plans))
             if plans.tp[int(i)] > 1 and plans.sp[int(i)] and not check_plan(m, plans.plan(int(i)), cluster))
    idx = list(itertools.islice(valid, 12))
    assert len(idx) == 12
    vec = evaluate(m, cluster, plans.take(np.asarray(idx)))
    for j, i in enumerate(idx):
        p = plans.plan(i)
        off = estimate_training(m, cluster, p.model_copy(update={"tp_comm_overlap": False}))
        assert float(vec.step.total[j]) == pytest.approx(float(estimate_training(m, cluster, p).time.total), rel=1e-9)
        assert float(vec.step.total[j]) == pytest.approx(float(off.time.total), rel=1e-9)


def test_stage_views_price_the_chunked_gemms_as_the_step_does():
    """Short sequences at TP 8: userbuffers' chunking would split the matmuls into smaller, slower calls
    (cost.gemm.chunk_rows); without the overlap they run whole, in the per-stage view as in the step."""
    m = resolve_model("deepseek-v3")
    on, off = (estimate_training(m, H800, _dsv3_plan(ov, tp=8, dp=16, seq_len=512)) for ov in (True, False))
    assert [t for v in stage_views(on) for t in (v.forward_s, v.backward_s)] == \
        pytest.approx([t for v in stage_views(off) for t in (v.forward_s, v.backward_s)], rel=1e-12)


def test_search_defaults_tp_overlap_off_only_for_mla_models(cli):
    # `search` turns --tp-comm-overlap on by default (Megatron-Bridge / NeMo performance recipes), except for an MLA
    # model: Megatron-Core runs it without (TELinear, above) and Megatron-Bridge's DeepSeek-V3 / Kimi-K2 recipes set
    # CommOverlapConfig(tp_comm_overlap=False) (067f987). Asking for it keeps it, priced as Megatron-Core runs it.
    args = ("search", "--model", "deepseek-v3", "--hardware", "dgx-h800", "--nodes", "32", "--tp", "4", "--pp", "8",
            "--top", "1", "--json")
    free = cli(*args)
    assert free.code == 0, free.err
    assert free.json()["plans"][0]["plan"]["tp_comm_overlap"] is False
    asked = cli(*args, "--tp-comm-overlap")
    assert asked.code == 0, asked.err
    assert asked.json()["plans"][0]["plan"]["tp_comm_overlap"] is True
    dense = cli("search", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--nodes", "8", "--tp", "4",
                "--top", "1", "--json")
    assert dense.code == 0 and dense.json()["plans"][0]["plan"]["tp_comm_overlap"] is True
