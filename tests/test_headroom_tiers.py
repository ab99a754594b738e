"""How memory headroom orders plans inside the model's resolution (docs/validation.md#headroom-tiers): a plan whose
memory interval's upper end (llmplan.intervals.memory_band, the published memory peaks' 0.9 quantile of measured
over predicted) passes the GPU is at risk and loses to a tied plan that stays inside it; two plans that both stay
inside it are not separated by headroom, so the faster prediction stays first. And settings (one search each) are
chosen by the same rule (search.run.first_setting)."""

from __future__ import annotations

import dataclasses
import json
import math
from types import SimpleNamespace

import numpy as np

from llmplan.search.run import SearchResult, first_setting, win_floor
from llmplan.search.ties import HEADROOM_STEP, decide, memory_upper, oom_tier, resolve
from llmplan.search.variants import robust_pick
from llmplan.units import GIB

CAPACITY = 80 * GIB
RESOLUTION = 0.125  # |log| of a tokens/s ratio: near the MoE resolution (13.3%, docs/validation.md)


def est(rate: float, headroom_gib: float, ep: int = 8) -> SimpleNamespace:
    """A fake estimate (the fields the tie rules read): tp4 pp2 dp8 with `ep`, ZeRO-1, no recompute, on an 80 GiB
    GPU with `headroom_gib` free."""
    plan = SimpleNamespace(tp=4, pp=2, dp=8, cp=1, ep=ep, vpp=1, zero=1, recompute="none")
    h = headroom_gib * GIB
    return SimpleNamespace(plan=plan, model=SimpleNamespace(is_moe=True),
                           cluster=SimpleNamespace(system=SimpleNamespace(domain_gpus=8)),
                           memory=SimpleNamespace(headroom=h, total=CAPACITY - h, capacity=CAPACITY),
                           throughput=SimpleNamespace(tokens_per_s=rate), goodput=None)


def safe_headroom() -> float:
    """The least headroom (GiB) on the 80 GiB GPU whose memory interval's upper end still fits."""
    return 80 - 80 / memory_upper()


def test_the_upper_end_is_the_published_memory_interval():
    # README quotes the memory peaks' interval as x1.00-x1.17 (81 published peaks at stop 66; x1.25 before stop
    # 60's memory mends, docs/validation.md#headroom-tiers)
    assert 1.1 < memory_upper() < 1.3


def test_tiers_by_hand():
    up = memory_upper()
    cap = 80 * GIB
    assert int(oom_tier(cap / up, cap)) == 0  # the upper end exactly at the GPU's memory: safe
    assert int(oom_tier((cap + 1) / up, cap)) == 1  # a byte over: the first tier
    assert int(oom_tier((cap + HEADROOM_STEP + 1) / up, cap)) == 2
    assert oom_tier(np.array([0.5 * cap, cap]), cap).tolist() == [0, math.ceil((cap * up - cap) / HEADROOM_STEP)]


def test_a_faster_plan_with_ample_headroom_beats_a_slower_one_with_more():
    # both keep their memory interval inside the GPU: 20 GiB more headroom does not pass a plan 5% faster
    assert safe_headroom() < 20
    fast, roomy = est(100.0, 20.0), est(95.0, 40.0, ep=16)
    assert decide(roomy, fast)[0] == 0
    order, tied, notes = resolve([fast, roomy], RESOLUTION)
    assert order == [0, 1] and tied == [[2], [1]]
    assert notes[0].rule.startswith("faster prediction")


def test_a_plan_within_resolution_at_oom_risk_loses_to_a_safer_one():
    # the DeepSeek-V3 default search's pair (stop 59: ep64 6% faster at 67.7 GiB of 79.6, ep128 at 57.1 GiB),
    # placed about the shipped band's edge: ep64 3 GiB short of the headroom its upper end needs, ep128 8 GiB
    # past it: the safer plan first, and the note says why
    edge = safe_headroom()
    risky, safe = est(106.0, edge - 3.0, ep=64), est(100.0, edge + 8.0, ep=128)
    assert int(oom_tier(risky.memory.total, CAPACITY)) > 0 and int(oom_tier(safe.memory.total, CAPACITY)) == 0
    order, _, notes = resolve([risky, safe], RESOLUTION)
    assert order == [1, 0]
    assert notes[0].rule.startswith("memory within the GPU at the interval's upper end")
    # beyond the resolution the faster stays first, at risk or not
    order, _, notes = resolve([est(120.0, 4.0, ep=64), safe], RESOLUTION)
    assert order == [0, 1] and notes == []


def test_among_plans_at_risk_the_one_less_over_goes_first():
    a, b = est(100.0, 4.0), est(98.0, 9.0, ep=16)  # both past the GPU at the upper end, b by 2 tiers less
    assert int(oom_tier(a.memory.total, CAPACITY)) - int(oom_tier(b.memory.total, CAPACITY)) >= 2
    order, _, notes = resolve([a, b], RESOLUTION)
    assert order == [1, 0] and notes[0].rule.startswith("less over the GPU")


def test_one_layout_keeps_its_faster_safe_variant():
    # plans of one layout, best score first: 25 and 35 GiB free both fit at the upper end; the first stays
    headroom = np.array([25.0, 35.0, 3.0]) * GIB
    zero, code = np.array([1, 1, 1]), np.array([0, 0, 0])
    assert robust_pick(np.arange(3), headroom, zero, code, CAPACITY - headroom) == 0
    # a first variant at risk gives way to the safe one
    headroom = np.array([3.0, 25.0]) * GIB
    assert robust_pick(np.arange(2), headroom, zero[:2], code[:2], CAPACITY - headroom) == 1


def result(rows: list[SimpleNamespace], top: float) -> SearchResult:
    """A fake search of one setting: its ranked rows (ties resolved) and its fastest plan's score."""
    return SearchResult(considered=1, feasible=1, pruned=[], ranked=rows, pareto=[], resolution=RESOLUTION,
                        variants=[SimpleNamespace(best=float(r.throughput.tokens_per_s)) for r in rows],
                        top_score=top)


def test_settings_are_chosen_by_the_rule_that_orders_plans():
    # setting A's fastest plan (100) is at risk and lost A's #1 to a safe one (95); setting B's #1 (98) is at
    # risk. Comparing #1s by tokens/s chose B (98 > 95); ordered once, A's #1 is within the resolution of the
    # fastest plan of either setting and safer: A
    a1, b1 = est(95.0, 20.0), est(98.0, 4.0, ep=16)
    a, b = result([a1], 100.0), result([b1], 98.0)
    assert first_setting([b, a]) == 1 and first_setting([a, b]) == 0
    # both safe: the faster #1 wins, whatever the headroom
    assert first_setting([a, result([est(98.0, 40.0, ep=16)], 98.0)]) == 1
    # a setting whose #1 is beyond the resolution of another setting's fastest plan cannot lead, however safe
    far = result([est(80.0, 40.0, ep=16)], 80.0)
    assert first_setting([far, b]) == 1
    # exact equals: the first setting (the plain one)
    assert first_setting([result([est(95.0, 20.0)], 95.0), result([est(95.0, 20.0)], 95.0)]) == 0
    # a later setting prunes (search(beat=...)) only below the resolution of the fastest so far
    assert win_floor(a, b) == 100.0 * math.exp(-RESOLUTION)


def test_cli_small_moe_search_orders_ties_by_memory_tier(cli):
    # qwen3-30b-a3b on 2 DGX H100: every adjacent tied pair's note names the rule; headroom decides only
    # through the memory tier (no "GiB more memory headroom" note), and a pair the memory rule decided puts
    # the plan whose memory interval fits the GPU (or is less over it) first
    r = cli("search", "--model", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--nodes", "2", "--json")
    assert r.code == 0, r.err[-600:]
    doc = json.loads(r.out)
    plans = doc["plans"]
    up = memory_upper()
    over = [max(0.0, p["memory"]["total"] * up - p["memory"]["capacity"]) for p in plans]
    decided = doc["ties"]["decided"]
    assert decided, "the case must hold a tie"
    for n in decided:
        assert "GiB more memory headroom" not in n["rule"]
        i, j = n["upper"] - 1, n["lower"] - 1
        if "upper end" in n["rule"]:
            assert over[i] < over[j]
        if n["rule"].startswith("faster prediction"):
            assert plans[i]["throughput"]["tokens_per_s"] >= plans[j]["throughput"]["tokens_per_s"]


def test_layouts_equal_to_four_digits_keep_the_faster_first_not_the_roomier():
    """search.layouts.rank rounded each layout's score to 4 significant digits before its stable sort, so two
    layouts 0.001% apart kept the vectorised order, which puts more headroom (to 0.1 GiB) first among equal
    rounded scores (search.run._order); the tie resolution then kept it there on its last key (the ranked order)
    and noted 'faster prediction'. Both plans fit at the memory interval's upper end and no other rule separates
    them: the faster goes first (docs/validation.md#headroom-tiers). Fails before branch search-edges."""
    from llmplan.search.layouts import rank

    roomy, fast = est(99_999.0, 40.0, ep=16), est(100_000.0, 20.0)
    assert round(99_999.0 / 100_000.0, 4) == 1.0 and decide(fast, roomy)[0] == 0
    res = dataclasses.replace(result([roomy, fast], 100_000.0), equivalents=[0, 0])
    out = rank(res, 5)
    assert [float(e.throughput.tokens_per_s) for e in out.ranked] == [100_000.0, 99_999.0]
    assert out.tie_notes[0].rule.startswith("faster prediction")
