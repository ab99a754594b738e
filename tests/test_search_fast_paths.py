"""The search's shortcuts must not change its answer (issue 39: speed of the loop).

A search groups plans known to be equal in the columns a cost depends on as it enumerates them (the ZeRO
stage aside for activation memory; the pipeline layout for stage layers and parameters) and picks the
most-loaded stage of many plans in one gather. The same search without the seeded groupings (found again
from the columns) gives the same JSON, and the one-gather pick is the chain of selections it replaces."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan import report
from llmplan.cost.memory import ActivationBytes, TrainingMemory, _choose, _pick, training_memory
from llmplan.search.grid import PlanArrays, Workload, default_space, enumerate_plans
from llmplan.search.run import search
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec
from llmplan.specs.registry import builtin_models, builtin_systems

M, S = builtin_models(), builtin_systems()
CASES = [("deepseek-v3", "dgx-h800", 32, 1024), ("mixtral-8x7b", "dgx-h100", 4, 256), ("llama-3.1-8b", "dgx-h100", 2, 512)]


@pytest.mark.parametrize("name,system,nodes,gbs", CASES)
def test_search_json_is_the_same_without_the_seeded_groupings(monkeypatch, name, system, nodes, gbs):
    m, cluster = M[name], ClusterSpec(system=S[system], num_nodes=nodes)
    w = Workload(global_batch=gbs, seq_len=4096, tp_comm_overlap=True)
    space = default_space(m, cluster, w)

    def run() -> str:
        res = search(m, cluster, space, w, top=5)
        res.seconds = 0.0
        return json.dumps(report.search_json(res, w, cluster, m, 1e12, None), sort_keys=True, default=str)

    fast = run()
    monkeypatch.setattr(PlanArrays, "seed_distinct", lambda self, columns, group: None)
    assert run() == fast


@pytest.mark.parametrize("name,system,nodes,gbs", CASES[:2])
def test_memory_of_many_plans_is_exactly_the_scalar_memory(name, system, nodes, gbs):
    m, cluster = M[name], ClusterSpec(system=S[system], num_nodes=nodes)
    w = Workload(global_batch=gbs, seq_len=4096)
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    rng = np.random.default_rng(39)
    idx = [int(i) for i in rng.permutation(len(plans))[:400] if not check_plan(m, plans.plan(int(i)), cluster)][:60]
    gpu = cluster.system.gpu
    vec = training_memory(m, plans.take(np.asarray(idx)), gpu.hbm_bytes, None, gpu.fp8_tn_only)
    for j, i in enumerate(idx):
        one = training_memory(m, plans.plan(i), gpu.hbm_bytes, None, gpu.fp8_tn_only)
        for f in ("stage", "weights", "gradients", "optimizer", "activations", "other", "total"):
            assert float(getattr(vec, f)[j]) == float(getattr(one, f)), (f, plans.plan(i))


def test_repeated_candidate_stages_are_priced_once_with_the_same_pick(monkeypatch):
    """training_memory on plan arrays prices a candidate stage only where it is a new stage of the plan (pp 1:
    one stage, pp 2: two), and picks what pricing all four on every plan picks, field for field."""
    import llmplan.cost.memory as mem
    m, cluster = M["deepseek-v3"], ClusterSpec(system=S["dgx-h800"], num_nodes=32)
    w = Workload(global_batch=1024, seq_len=4096)
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    rng = np.random.default_rng(7)
    idx = [int(i) for i in rng.permutation(len(plans))[:3000] if not check_plan(m, plans.plan(int(i)), cluster)][:300]
    sub = plans.take(np.asarray(idx))
    assert {1, 2} <= set(sub.pp.tolist()) and sub.pp.max() > 2  # every kind of repeat
    gpu = cluster.system.gpu
    every = [mem.stage_memory(m, sub, s, mem.MemoryAllowance(), gpu.hbm_bytes, gpu.fp8_tn_only, gpu.nccl_sms,
                              gpu.compute_capability) for s in mem.candidate_stages(m, sub)]
    want = _choose(np.argmax(np.stack([np.broadcast_to(r.total, (len(sub),)) for r in every]), axis=0), every)
    priced = []
    real = mem.stage_memory
    monkeypatch.setattr(mem, "stage_memory", lambda m_, p, *a: priced.append(len(p)) or real(m_, p, *a))
    got = training_memory(m, sub, gpu.hbm_bytes, None, gpu.fp8_tn_only, gpu.nccl_sms, gpu.compute_capability)
    pp = sub.pp
    assert sum(priced) < 4 * len(sub)
    assert sum(priced) >= len(sub) + int((pp > 1).sum()) + int((pp > 2).sum())  # stage 0, second, last at least
    for f in dataclasses.fields(TrainingMemory):
        a, b = getattr(got, f.name), getattr(want, f.name)
        if dataclasses.is_dataclass(a):
            for g in dataclasses.fields(a):
                assert np.array_equal(np.broadcast_to(getattr(a, g.name), (len(sub),)),
                                      np.broadcast_to(getattr(b, g.name), (len(sub),))), (f.name, g.name)
        elif a is None or f.name == "capacity":
            assert a == b, f.name
        else:
            assert np.array_equal(np.broadcast_to(a, (len(sub),)), np.broadcast_to(b, (len(sub),))), f.name


def _memory(rng: np.random.Generator, n: int, ties: np.ndarray, stage: int) -> TrainingMemory:
    v = lambda: np.where(ties, 1.0, rng.integers(0, 4, n).astype(float))  # noqa: E731  (small values: many ties)
    return TrainingMemory(stage=np.full(n, stage), params_on_rank=v(), weights=v(), gradients=v(), optimizer=v(),
                          activations=v(), other=v(), activation_parts=ActivationBytes(v(), v(), v(), v()),
                          capacity=80.0)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**32 - 1), stages=st.integers(1, 4))
def test_one_gather_picks_what_the_chain_of_selections_picks(seed, stages):
    rng = np.random.default_rng(seed)
    ties = rng.random(50) < 0.3
    results = [_memory(rng, 50, ties, k) for k in range(stages)]
    chain = results[0]
    for r in results[1:]:
        chain = _pick(r.total > chain.total, r, chain)
    which = np.argmax(np.stack([r.total for r in results]), axis=0)
    got = _choose(which, results)
    for f in ("stage", "params_on_rank", "weights", "gradients", "optimizer", "activations", "other"):
        assert np.array_equal(getattr(got, f), getattr(chain, f)), f
    for f in ("layers", "recompute_working", "embedding", "output"):
        assert np.array_equal(getattr(got.activation_parts, f), getattr(chain.activation_parts, f)), f


@pytest.mark.parametrize("name,system,nodes,gbs", CASES[1:] + [("llama-3.1-405b", "dgx-h100", 64, 1024)])
def test_layout_rules_once_per_layout_agree_with_every_plan(name, system, nodes, gbs):
    from llmplan.cost.params import LAYOUT_AXES
    from llmplan.search.run import LAYOUT_RULES
    from llmplan.specs.check import RULES

    m, cluster = M[name], ClusterSpec(system=S[system], num_nodes=nodes)
    w = Workload(global_batch=gbs, seq_len=4096)
    space = default_space(m, cluster, w)  # with layouts the rules refuse: uneven, unsplittable, too many stages
    space = dataclasses.replace(space, pipeline=space.pipeline + tuple(
        (p, v, f, 0) for p in (2, 3, 5, 7, 8, 200) for v in (1, 2, 3) for f in (0, 1, 5)))
    plans = enumerate_plans(space, cluster, w)
    for rule in (r for r in RULES if r.name in LAYOUT_RULES):
        once = plans.on_distinct(LAYOUT_AXES, 0, lambda p, _, r=rule: r.ok(m, p, cluster))
        fresh = enumerate_plans(space, cluster, w)
        fresh.memo.clear()
        every = np.broadcast_to(np.asarray(rule.ok(m, fresh, cluster), dtype=bool), len(plans))
        assert np.array_equal(np.broadcast_to(np.asarray(once, dtype=bool), len(plans)), every), rule.name
        assert every.any() and not every.all()  # the check has something to agree on


@pytest.mark.parametrize("name,system,nodes,gbs,headroom_gib", [
    ("deepseek-v3", "dgx-h800", 32, 1024, 4.0), ("mixtral-8x7b", "dgx-h100", 4, 256, 0.0),
    ("llama-3.1-8b", "dgx-h100", 2, 512, 20.0), ("llama-3.1-405b", "dgx-h100", 4, 64, 0.0),  # none fits
    ("llama-3.1-8b", "dgx-h100", 1, 64, 0.0), ("gpt-1.7b", "dgx-h100", 1, 64, 0.0)])
def test_screened_memory_is_the_full_memory_model(name, system, nodes, gbs, headroom_gib):
    """Screening by one stage's memory (search.evaluate.screened_memory) gives the full model's verdict on
    every plan, the full model's memory of each plan that fits and the least-memory misfit."""
    from llmplan.search.evaluate import screened_memory
    from llmplan.specs.check import RULES
    from llmplan.units import GIB

    m, cluster = M[name], ClusterSpec(system=S[system], num_nodes=nodes)
    w = Workload(global_batch=gbs, seq_len=4096)
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    keep = np.ones(len(plans), dtype=bool)
    for rule in RULES:
        keep &= np.broadcast_to(np.asarray(rule.ok(m, plans, cluster), dtype=bool), keep.shape)
    plans = plans.take(np.flatnonzero(keep))
    gpu, headroom = cluster.system.gpu, headroom_gib * GIB
    full = training_memory(m, enumerate_plans(default_space(m, cluster, w), cluster, w).take(np.flatnonzero(keep)),
                           gpu.hbm_bytes, None, gpu.fp8_tn_only, gpu.nccl_sms, gpu.compute_capability)
    total = np.asarray(full.total, dtype=float)
    fits = total + headroom <= gpu.hbm_bytes
    got = screened_memory(m, cluster, plans, None, headroom)
    assert np.array_equal(got.fits, fits)
    if (~fits).any():
        least = int(np.argmin(np.where(~fits, total, np.inf)))
        assert (got.least, got.least_total) == (least, float(total[least]))
    else:
        assert got.least is None
    if not fits.any():
        assert got.memory is None
        return
    idx = np.flatnonzero(fits)
    assert got.memory is not None
    for f in ("stage", "params_on_rank", "weights", "gradients", "optimizer", "activations", "other", "total"):
        assert np.array_equal(getattr(got.memory, f), np.asarray(getattr(full, f))[idx]), f
    for f in ("layers", "recompute_working", "embedding", "output"):
        assert np.array_equal(getattr(got.memory.activation_parts, f),
                              np.broadcast_to(getattr(full.activation_parts, f), total.shape)[idx]), f


@pytest.mark.parametrize("name,system,nodes,gbs", [CASES[0], ("llama-3.1-405b", "dgx-h100", 64, 1024)])
def test_shown_plans_equal_plain_scalar_estimates(monkeypatch, name, system, nodes, gbs):
    """Every plan a search shows (ranked, Pareto, the conventional one) reads exactly what the scalar estimate
    of a fresh copy gives with no single-plan memo (cost.memo._plan_memo: each part computed where it is
    read): the screened memory, the memo and the layout pass's shortcuts change no number."""
    from llmplan.cost import memo
    from llmplan.estimate import estimate_training

    m, cluster = M[name], ClusterSpec(system=S[system], num_nodes=nodes)
    w = Workload(global_batch=gbs, seq_len=4096, tp_comm_overlap=True)
    res = search(m, cluster, default_space(m, cluster, w), w, top=5)
    shown = res.ranked + res.pareto + ([res.conventional] if res.conventional else [])
    assert res.ranked
    as_json = lambda e: json.dumps(report.estimate_json(e), sort_keys=True, default=str)
    got = [as_json(e) for e in shown]
    monkeypatch.setattr(memo, "_plan_memo", lambda plan: None)
    for e, seen in zip(shown, got):
        plain = estimate_training(m, cluster, e.plan.model_copy(deep=True), None, checkpoint=e.checkpoint)
        assert seen == as_json(plain), e.plan.describe()


def test_a_reused_enumeration_prices_as_a_fresh_one():
    # the searches of one command enumerate each space once (grid.enumerate_plans' reuse): a later workload's
    # plans have the same axes, their own memo, and price the same memory as plans enumerated afresh
    from llmplan.search.evaluate import evaluate_memory
    from llmplan.specs.registry import resolve_model, resolve_system

    m, c = resolve_model("qwen3-30b-a3b"), ClusterSpec(system=resolve_system("dgx-h100"), num_nodes=4)
    w, w2 = Workload(global_batch=256, seq_len=4096), Workload(global_batch=256, seq_len=4096, grad_dtype="bf16")
    reuse: dict = {}
    first = enumerate_plans(default_space(m, c, w), c, w, reuse)
    evaluate_memory(m, c, first.take(np.arange(0, len(first), 97)))  # fills first's memo, not the next one's
    later = enumerate_plans(default_space(m, c, w2), c, w2, reuse)
    fresh = enumerate_plans(default_space(m, c, w2), c, w2)
    assert len(reuse) == 1 and later.w == w2 and later.memo is not first.memo
    for f in dataclasses.fields(PlanArrays):
        if f.name not in ("w", "memo"):
            assert np.array_equal(getattr(later, f.name), getattr(fresh, f.name)), f.name
    idx = np.arange(0, len(fresh), 31)
    assert np.array_equal(np.asarray(evaluate_memory(m, c, later.take(idx)).total),
                          np.asarray(evaluate_memory(m, c, fresh.take(idx)).total))
    assert not np.array_equal(np.asarray(evaluate_memory(m, c, first.take(idx)).total),
                              np.asarray(evaluate_memory(m, c, fresh.take(idx)).total))  # grad dtype moves memory
