"""The tie rule that keeps EP and CP inside the NVLink domain (search.ties.decide / robust_key), and the tie
note a --top below the pool would hide (report.search.faster_tied_line; docs/validation.md#tie-placement)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from conftest import one_train_search

from llmplan.search.ties import decide, heavy_across, resolve, robust_first
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_systems
from llmplan.units import GIB

S = builtin_systems()
# 32 GB200 trays (128 GPUs, 72-GPU racks): a 64-GPU share of each rack, as the search's power-of-two share runs
NVL = ClusterSpec(system=S["gb200-nvl72"].with_options(domain_gpus=64), num_nodes=32)
H100 = ClusterSpec(system=S["dgx-h100"], num_nodes=16)  # 128 GPUs, 8-GPU NVLink domains


def est(rate: float, cluster: ClusterSpec, total_gib: float = 100.0, **kw) -> SimpleNamespace:
    """A priced plan stand-in: real degrees on a real cluster (placement), given memory and tokens/s."""
    plan = ParallelPlan(**kw)
    cap = float(cluster.system.gpu.hbm_bytes)
    return SimpleNamespace(plan=plan, cluster=cluster, model=SimpleNamespace(is_moe=True),
                           memory=SimpleNamespace(total=total_gib * GIB, capacity=cap, headroom=cap - total_gib * GIB),
                           throughput=SimpleNamespace(tokens_per_s=rate))


def test_ep_across_domains_is_counted_by_placement():
    # ep 128 over 128 ranks of 64-GPU domains spans two; ep 16 beside pp 2 stays in one; ep 64 fills one
    assert NVL.system.domain_gpus == 64
    assert heavy_across(est(1.0, NVL, dp=128, ep=128)) == ("ep",)
    assert heavy_across(est(1.0, NVL, pp=2, dp=64, ep=16)) == ()
    assert heavy_across(est(1.0, NVL, dp=128, ep=64)) == ()
    # CP: tp 8 x cp 16 = 128 ranks, the CP groups stride 8 over two domains
    assert heavy_across(est(1.0, NVL, tp=8, cp=16)) == ("cp",)
    assert heavy_across(est(1.0, H100, dp=128, ep=8)) == ()
    assert heavy_across(est(1.0, H100, dp=128, ep=16)) == ("ep",)


def test_placement_follows_the_estimates_axis_order():
    # cp 16 x dp 8 on 128 GPUs of 64-GPU domains: in the default order (tp, cp, ep, dp, pp) the CP groups are
    # contiguous, 16 ranks inside one domain; in --axis-order tp-dp-cp-pp they stride 8 and span 2 domains, and
    # the estimate was priced so: heavy_across and the tie note read the estimate's order (TrainingEstimate.order)
    default = est(1.0, NVL, cp=16, dp=8)
    strided = est(1.0, NVL, cp=16, dp=8)
    strided.order = ("tp", "dp", "cp", "pp")
    assert heavy_across(default) == ()
    assert heavy_across(strided) == ("cp",)
    sign, rule = decide(default, strided)
    assert sign == -1 and "cp 16 spans 2 domains" in rule


def test_ep_inside_the_domain_beats_fewer_axes_both_orders():
    # the search_speed DeepSeek-V3 GB300 shape: a flat plan whose EP crosses the network (2 axes) against an
    # in-domain EP plan with a pipeline (3 axes), 1.5% faster; the in-domain one goes first in either order
    flat = est(8_883_062.0, NVL, dp=128, ep=128)
    piped = est(9_018_000.0, NVL, pp=2, dp=64, ep=16)
    sign, rule = decide(flat, piped)
    assert sign == 1 and rule.startswith("EP inside the NVLink domain") and "ep 128 spans 2 domains" in rule
    sign, rule = decide(piped, flat)
    assert sign == -1 and rule.startswith("EP inside the NVLink domain")
    assert robust_first([flat, piped], [0, 1]) == 1 and robust_first([piped, flat], [0, 1]) == 0
    # the slower in-domain plan passes the faster cross-domain one only inside the resolution
    slower = est(8_000_000.0, NVL, pp=2, dp=64, ep=16)  # 10.5% below the flat plan: inside 11.8%
    order, _, notes = resolve([flat, slower], 0.11146)
    assert order == [1, 0] and notes[0].rule.startswith("EP inside")
    assert resolve([flat, est(7_000_000.0, NVL, pp=2, dp=64, ep=16)], 0.11146)[0] == [0, 1]


def test_placement_comes_after_memory_risk_and_the_zero3_gather():
    flat = est(9.0e6, NVL, dp=128, ep=128)
    at_risk = est(9.1e6, NVL, total_gib=1000.0, pp=2, dp=64, ep=16)  # past any GPU at the interval's upper end
    assert decide(flat, at_risk)[0] == -1 and "memory" in decide(flat, at_risk)[1]
    gathers = est(9.1e6, NVL, dp=128, ep=1, zero=3)  # ep 1 never leaves a domain, but gathers every expert
    assert decide(flat, gathers) == (-1, "experts kept on their EP ranks, not gathered by ZeRO-3 each micro-batch")
    # two plans whose EP both cross: no placement decision, fewer axes decides as before
    a, b = est(9.0e6, H100, dp=128, ep=16), est(9.1e6, H100, pp=2, dp=64, ep=16)
    assert decide(a, b)[1].startswith("fewer parallel axes")


def test_top_1_shows_the_faster_tied_plan(cli):
    # qwen3-30b-a3b on 2 DGX H100: #1 is not the fastest plan found (a more robust one tied with it); at --top 1
    # the table has no = mark, so a line says a faster plan sits below it; the JSON says how much faster (the
    # JSON renders the text run's search result, one search: conftest.one_train_search)
    with one_train_search():
        one = cli("search", "--model", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--nodes", "2", "--top", "1")
        doc = json.loads(cli("search", "--model", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--nodes", "2",
                             "--top", "1", "--json").out)
    assert one.code == 0, one.err[-600:]
    line = " ".join(one.out.split())
    assert "tie: a plan" in line and "faster than #1, within the model's resolution" in line
    assert all(len(x) <= 80 for x in one.out.splitlines())
    pct = doc["ties"]["fastest_above_first_percent"]
    assert pct is not None and 0 < pct < doc["ties"]["resolution_percent"]
    assert {"upper", "lower", "apart_percent", "rule", "lower_shown"} <= set(doc["ties"]["decided"][0])
    assert doc["ties"]["decided"][0]["lower_shown"] is False


def test_serving_search_first_plan_does_not_depend_on_top(cli):
    # search_infer ranks every serving layout by one sort (no tie rule moves a plan) and, with a target, walks
    # max(--top, WALK) of them keeping the first --top accepted: its #1 is the same at --top 1 and 5, so it needs
    # no walk to the tie pool (docs/validation.md#tie-placement)
    args = ("search", "--mode", "infer", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--json")
    one, five = (cli(*args, "--top", t) for t in ("1", "5"))
    assert one.code == 0 and five.code == 0, (one.err[-400:], five.err[-400:])
    a, b = json.loads(one.out)["plans"], json.loads(five.out)["plans"]
    assert len(a) == 1 and len(b) > 1 and a[0] == b[0]
