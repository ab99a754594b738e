"""Prediction intervals, ties and anchoring to a measured run (issue 33; docs/validation.md#intervals)."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from llmplan import intervals as iv
from llmplan.intervals import conformal
from llmplan.search.ties import resolve
from llmplan.specs.registry import builtin_systems
from llmplan.units import GIB

ROOT = Path(__file__).resolve().parents[1]
EST = ("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--tp", "2", "--global-batch", "16")


def _rec(fam: str, r: float, i: int, gen: str = "hopper", moe: bool = False, stack: str = "flash") -> dict:
    return {"id": f"{fam}-{i}", "family": fam, "r": r, "moe": moe, "generation": gen, "framework": "megatron",
            "gpus": 8, "stack": stack}


def test_coverage_is_counted_from_the_other_families_quantiles():
    # Three families of 12 runs: A's residuals are B's and C's shifted by +0.05; each family's band comes from
    # the other two (np.quantile at the nominal pair), and coverage counts the runs inside it.
    base = np.linspace(-0.1, 0.1, 12)
    recs = ([_rec("a", x + 0.05, i) for i, x in enumerate(base)] + [_rec("b", x, i) for i, x in enumerate(base)]
            + [_rec("c", -x, i) for i, x in enumerate(base)])
    cov = iv.coverage(recs, 0.8)
    lo, hi = np.quantile(np.concatenate([base, -base]), [0.1, 0.9])
    inside_a = sum(lo <= x + 0.05 <= hi for x in base)
    assert cov["a"][:2] == (inside_a, 12)
    assert inside_a < 12  # the shifted family is not fully covered: a family bias is what coverage measures
    assert cov["a"][2] == pytest.approx((math.exp(hi) - math.exp(lo)) / 2)
    assert iv.mean_coverage(cov) == pytest.approx(np.mean([c[0] / c[1] for c in cov.values()]))
    assert iv.choose_nominal(recs) in iv.NOMINAL_CHOICES


def test_the_shipped_pair_is_the_narrowest_inside_the_target(monkeypatch):
    # coverage (inside, records) per pair: 0.9 is under 75% per record, 0.95 and 0.975 are inside 75-85% both
    # ways, 0.99 is nearest 80% over families: the narrowest inside the target (0.95) is shipped
    table = {0.8: (60, 70), 0.85: (65, 72), 0.9: (70, 74), 0.925: (72, 75), 0.95: (77, 77), 0.975: (79, 79),
             0.99: (85, 80)}

    def fake(records, q, pools=None):  # one entry: (inside of 100 records, 100, family mean in %)
        per_record, fam_mean = table[q]
        return {"a": (per_record, 100, fam_mean)}

    # choose_nominal reads coverage and mean_coverage from the module it lives in (re-exported by iv)
    monkeypatch.setattr(conformal, "coverage", fake)
    monkeypatch.setattr(conformal, "mean_coverage", lambda cov: cov["a"][2] / 100)
    assert iv.choose_nominal([], {}) == 0.95
    table.update({0.95: (74, 77), 0.975: (86, 84)})  # none inside both ways: nearest 80% over families
    assert iv.choose_nominal([], {}) == 0.99


def test_a_regime_pool_takes_its_own_pair_only_with_enough_families_and_a_stable_choice():
    # Four flash-attention families drawn from one distribution (seeded): left out, each is covered by the
    # others' quantiles at a pair inside 75-85%, whichever family the choice leaves out. The no-flash pool has
    # two families: too few, so it takes the all-regime pair, and the basis says why.
    rng = np.random.default_rng(3)
    recs = ([_rec(f, x, i) for f in "abcd" for i, x in enumerate(rng.normal(0, 0.05, 20))]
            + [_rec(f, x, i, stack="no-flash") for f in "ef" for i, x in enumerate(rng.normal(0, 0.05, 20))])
    pools = iv.choose_pools(recs, default=0.99)
    flash, old = pools["dense-megatron"], pools["dense-megatron-noflash"]
    assert flash["families"] == 4 and flash["nominal"] in iv.NOMINAL_CHOICES
    mine = [r for r in recs if r["stack"] == "flash"]
    assert iv.inside_target(iv.coverage(mine, (flash["nominal"], flash["weighting"])))
    assert all(iv.TARGET[0] <= x <= iv.TARGET[1] for x in flash["nested"])
    assert old["nominal"] is None and "2 families" in old["why"]
    # every run is on Hopper: the pool's one cell holds the same runs and makes the same choice, and goes first
    cell = pools["dense-megatron/hopper"]
    assert (cell["nominal"], cell["weighting"]) == (flash["nominal"], flash["weighting"])
    data = {"training": recs, "nominal": 0.99, "pools": pools}
    flash_band = iv.training_band(iv.Regime(False, "hopper", "megatron", 8, flash=True), data)
    old_band = iv.training_band(iv.Regime(False, "hopper", "megatron", 8, flash=False), data)
    assert flash_band.pool == "dense-megatron/hopper" and flash_band.nominal == flash["nominal"]
    assert old_band.pool == "" and old_band.nominal == 0.99
    assert "all-regime 99% pair" in old_band.basis and "2 families" in old_band.basis
    # a family whose bias the others do not share (+35%): no pair covers the pool 75-85%, it falls back
    shifted = [dict(r, r=r["r"] + 0.3) if r["family"] == "a" else r for r in recs]
    assert "no pair" in iv.choose_pools(shifted, default=0.99)["dense-megatron"]["why"]


def test_family_weighting_weighs_each_family_alike():
    # 20 runs of one family at 0 and two families of 2 runs at -0.1 and +0.1: every run alike, the 80% band is
    # the big family's (0.1 and 0.9 quantiles inside its 20 runs); every family alike, each side family weighs a
    # third and the band reaches towards them (midpoint rule: the 0.1 quantile lies between -0.1 at cumulative
    # 1/12 and -0.1 at 3/12, i.e. at -0.1).
    recs = ([_rec("big", 0.0, i) for i in range(20)] + [_rec("lo", -0.1, i) for i in range(2)]
            + [_rec("hi", 0.1, i) for i in range(2)])
    w = iv.family_weights(r["family"] for r in recs)
    assert w.sum() == pytest.approx(3) and w[0] == pytest.approx(1 / 20) and w[-1] == pytest.approx(1 / 2)
    run = iv.quantile_band([r["r"] for r in recs], "", False, 0.8)
    fam = iv.quantile_band([r["r"] for r in recs], "", False, 0.8, w)
    assert (run.lo, run.hi) == (0.0, 0.0)
    assert fam.lo == pytest.approx(-0.1) and fam.hi == pytest.approx(0.1)
    # equal weights: the midpoint rule is numpy's 'hazen' quantile
    x = np.random.default_rng(1).normal(size=31)
    for q in (0.1, 0.5, 0.9):
        assert iv.weighted_quantile(x, np.ones(31), q) == pytest.approx(float(np.quantile(x, q, method="hazen")))
    # a file whose cell chose family weighting: the band takes it and says so
    data = {"training": recs, "nominal": 0.8, "pools": {"dense-megatron/hopper": {
        "nominal": 0.8, "weighting": "family", "families": 3}}}
    band = iv.training_band(iv.Regime(False, "hopper", "megatron", 8), data)
    assert band.weighting == "family" and band.pool == "dense-megatron/hopper"
    assert (band.lo, band.hi) == pytest.approx((fam.lo, fam.hi))
    assert "every family weighted alike" in band.basis and "on hopper" in band.basis


def test_a_regime_cell_takes_its_own_choice_before_its_pool_and_the_narrowest_inside_the_target():
    # Hopper: six families of 20 runs (seeded) with biases spread over -0.03 .. +0.03 and one of 40 runs at 0.
    # Blackwell: two families shifted by +0.3 (too few for a cell of their own). The Hopper cell has a choice
    # inside 75-85% left out and nested, the narrowest by median half-width (here every family alike at the 80%
    # pair, narrower than the 85% pair every run alike, the narrowest pair the run weighting has inside the
    # target); a Blackwell plan gets no cell choice.
    rng = np.random.default_rng(7)
    recs = [_rec("n", x, i) for i, x in enumerate(rng.normal(0, 0.02, 40))]
    for f, b in zip("abcdef", (-0.03, -0.015, -0.005, 0.005, 0.015, 0.03)):
        recs += [_rec(f, b + x, i) for i, x in enumerate(rng.normal(0, 0.04, 20))]
    recs += [_rec(f, 0.3 + x, i, gen="blackwell") for f in "yz" for i, x in enumerate(rng.normal(0, 0.03, 10))]
    pools = iv.left_out_pools(recs)
    chosen = iv.choose_pools(recs, pools, default=0.99)
    cell = chosen["dense-megatron/hopper"]
    assert cell["nominal"] is not None, cell
    hopper = [r for r in recs if r["generation"] == "hopper"]
    own = (cell["nominal"], cell["weighting"])
    assert iv.inside_target(iv.coverage(hopper, own, pools))
    assert all(iv.TARGET[0] <= x <= iv.TARGET[1] for x in cell["nested"]) and cell["nested_half"] > 0
    # no choice inside the target is narrower (median half-width) than the one taken
    for c in iv.POOL_CHOICES:
        if iv.inside_target(iv.coverage(hopper, c, pools)):
            assert iv.median_half(hopper, c, pools) >= iv.median_half(hopper, own, pools) - 1e-9
    assert chosen["dense-megatron/blackwell"]["nominal"] is None and "2 families" in chosen[
        "dense-megatron/blackwell"]["why"]
    data = {"training": recs, "nominal": 0.99, "pools": chosen}
    assert iv.nominal_of(data, iv.Regime(False, "hopper", "megatron", 8))[3] == "dense-megatron/hopper"
    # the Blackwell cell has no choice: a Blackwell plan takes the pool's (here the pool has one), else the
    # all-regime pair, whose basis gives the cell's reason, then the pool's
    blackwell = iv.Regime(False, "blackwell", "megatron", 8)
    assert chosen["dense-megatron"]["nominal"] is not None and iv.nominal_of(data, blackwell)[3] == "dense-megatron"
    no_pool = {**data, "pools": {**chosen, "dense-megatron": {"nominal": None, "why": "has no pair (test)"}}}
    nominal, weighting, how, key = iv.nominal_of(no_pool, blackwell)
    assert (nominal, weighting, key) == (0.99, "run", "")
    assert "the blackwell cell has 2 families" in how and how.endswith("pool has no pair (test)")


def test_estimate_json_names_the_regime_pool_and_the_quantile_pair_taken(cli):
    # README's interval keys: pool (a POOLS key, by experts, framework and flash attention), pool_pair (the pool's
    # own pair taken), quantile_pair (the pair taken: the pool's own, else the shipped all-regime one).
    # pool_cell: the cell (the pool on the plan's GPU generation, first) or pool whose own choice is taken, else "";
    # quantile_weighting: run or family; min_sources: the fewest sources the cell's bands are drawn from.
    data = iv.shipped()
    for flags, pool in (((), "dense-megatron"), (("--no-flash-attention",), "dense-megatron-noflash")):
        r = cli(*EST, *flags, "--json")
        assert r.code == 0, r.err
        v = r.json()["interval"]
        assert v["pool"] == pool and isinstance(v["pool_pair"], bool)
        pools = data.get("pools", {})
        key = next((k for k in (f"{pool}/hopper", pool) if pools.get(k, {}).get("nominal") is not None), "")
        assert v["pool_pair"] == bool(key) and v["pool_cell"] == key
        assert v["quantile_pair"] == (pools[key]["nominal"] if key else data["nominal"])
        assert v["quantile_weighting"] == (pools[key].get("weighting", "run") if key else "run")
        assert v["min_sources"] == (pools[key].get("min_sources", iv.MIN_SOURCES) if key else iv.MIN_SOURCES)


def test_regime_relaxes_in_order_and_widens_when_no_family_covers_it():
    recs = ([_rec(f, 0.01 * i, i) for f in "hij" for i in range(4)]
            + [_rec("b", 0.3, i, gen="blackwell") for i in range(3)])
    hits, dropped = iv.select(recs, iv.Regime(moe=False, generation="hopper", framework="megatron", gpus=8))
    assert len(hits) == 12 and dropped == ()
    # 3 Blackwell runs are too few: scale, framework, then the generation are dropped -> widened
    want = iv.Regime(moe=False, generation="blackwell", framework="megatron", gpus=8)
    hits, dropped = iv.select(recs, want)
    assert dropped == ("scale", "framework", "generation") and len(hits) == 15
    band = iv.training_band(want, {"training": recs, "nominal": 0.8})
    raw = iv.quantile_band([r["r"] for r in recs], "", False, 0.8)
    assert band.widened and "no validation family covers blackwell" in band.basis
    assert band.hi - band.lo == pytest.approx(iv.WIDEN * (raw.hi - raw.lo))


def test_a_band_is_drawn_from_min_sources_sources_without_dropping_the_generation():
    # docs/validation.md#intervals-min-sources: Hopper Megatron-style runs of sources a and b at 8 GPUs (12 runs:
    # enough runs, two sources), of source c at 1,024 GPUs, of an FSDP-style source f at 8 GPUs. A band for an
    # 8-GPU plan drops the scale tag to reach three sources; without c it drops the framework tag too; with
    # only a and b on Hopper it keeps the generation (losing it would leave the plan uncovered) and is not
    # widened.
    a_b = [{**_rec(f, 0.01 * i, i), "source": f} for f in "ab" for i in range(6)]
    c = [{**_rec("c", 0.1, i), "source": "c", "gpus": 1024} for i in range(6)]
    f = [{**_rec("f", -0.1, i), "source": "f", "framework": "fsdp"} for i in range(6)]
    want = iv.Regime(moe=False, generation="hopper", framework="megatron", gpus=8)
    assert iv.MIN_SOURCES == 3
    hits, dropped = iv.select(a_b + c + f, want)
    assert dropped == ("scale",) and {r["family"] for r in hits} == {"a", "b", "c"}
    hits, dropped = iv.select(a_b + f, want)
    assert dropped == ("scale", "framework") and {r["family"] for r in hits} == {"a", "b", "f"}
    blackwell = [{**_rec("z", 0.3, i, gen="blackwell"), "source": "z"} for i in range(12)]
    hits, dropped = iv.select(a_b + blackwell, want)
    assert dropped == ("scale", "framework") and {r["family"] for r in hits} == {"a", "b"}
    band = iv.training_band(want, {"training": a_b + blackwell, "nominal": 0.8})
    assert not band.widened and band.n == 12
    # a file without sources counts families (source_of), as before
    untagged = [{k: v for k, v in r.items() if k != "source"} for r in a_b + c]
    assert iv.select(untagged, want)[1] == ("scale",)


def test_no_choice_inside_the_target_takes_the_honest_side(monkeypatch):
    # coverage per choice (per record, per family in %): none is inside 75-85% both ways; of those covering 75% or
    # more both ways the narrowest is taken (a pool's choice by median half-width, the all-regime pair by the
    # smaller pair), not a narrower one that covers less; when none covers 75%, a pool has no choice and the
    # all-regime pair is the one nearest 80% over families.
    table = {0.8: (70, 74), 0.85: (74, 86), 0.9: (88, 86), 0.925: (90, 88), 0.95: (92, 90), 0.975: (94, 92),
             0.99: (96, 94)}

    def fake(records, c, pools=None):
        per_record, fam_mean = table[iv.as_choice(c)[0]]
        return {"a": (per_record, 100, fam_mean)}

    monkeypatch.setattr(conformal, "coverage", fake)
    monkeypatch.setattr(conformal, "mean_coverage", lambda cov: cov["a"][2] / 100)
    monkeypatch.setattr(conformal, "median_half", lambda records, c, pools: c[0] / 10)
    assert iv.choose_nominal([], {}) == 0.9
    one = {iv.MIN_SOURCES: {}}  # bands of MIN_SOURCES sources only
    assert conformal._narrowest_inside([], one) == (0.9, "run", iv.MIN_SOURCES)
    table.update({0.9: (80, 84)})  # inside: taken before any wider one
    assert iv.choose_nominal([], {}) == 0.9 and conformal._narrowest_inside([], one) == (0.9, "run", iv.MIN_SOURCES)
    table.update({q: (70, 80 + q) for q in table})  # none covers 75% per record
    assert conformal._narrowest_inside([], one) is None
    assert iv.choose_nominal([], {}) == 0.8

def test_shipped_residuals_carry_every_tag_and_a_same_job_resolution():
    d = iv.shipped()
    for r in d["training"]:
        assert {"moe", "generation", "framework", "stack", "gpus", "job", "layout"} <= set(r)
    res = d["resolution"]
    assert res["weighting"] == "each job alike" and res["dense_groups"] >= 10
    assert 0 < res["dense"] <= res["moe"]  # llmplan tells dense layouts apart better than MoE ones


def test_estimate_json_and_text_carry_the_interval(cli):
    r = cli(*EST, "--json")
    assert r.code == 0, r.err
    d = r.json()
    v = d["interval"]
    assert v["level"] == 0.8 and "left-out residuals" in v["basis"]
    tps, step, mfu = d["throughput"]["tokens_per_s"], d["time"]["step_s"], d["throughput"]["mfu"]
    assert v["tokens_per_s"][0] < tps < v["tokens_per_s"][1]
    assert v["step_s"][0] < step < v["step_s"][1]
    assert v["mfu"][0] < mfu < v["mfu"][1]
    assert v["step_s"][0] == pytest.approx(step * tps / v["tokens_per_s"][1])  # one band, rate and time inverted
    assert v["memory_bytes"][0] < v["memory_bytes"][1]
    text = cli(*EST)
    assert "80% interval: step" in text.out and "left-out runs" in text.out


def test_search_marks_intervals_ties_and_time_to_train_range(cli, tmp_path):
    # an A100 search whose #1 is predicted above its GPU's best published bf16 MFU: a cluster file sets that
    # ceiling at 0.5 (the shipped A100 one, MegaScale's 65.3%, sits at the 8B search's own #1), so the whole band
    # lies above it; the band is moved down under the ceiling with its width kept, not collapsed to a point
    cluster = tmp_path / "a100-low-ceiling.yaml"
    cluster.write_text("base: dgx-a100\ngpu:\n  best_published_mfu: 0.5\n")
    args = ("search", "--model", "llama-3.1-8b", "--hardware", str(cluster), "--nodes", "1")
    r = cli(*args, "--json")
    assert r.code == 0, r.err
    d = r.json()
    top = d["plans"][0]
    best = 0.5
    assert top["throughput"]["mfu"] > best  # the search's #1 sits above the ceiling...
    assert top["interval"]["ceiling_mfu"] == pytest.approx(best)
    assert top["interval"]["mfu"][1] == pytest.approx(best)  # ...so its interval is capped there, and says so
    assert top["interval"]["mfu"][0] < best
    assert "capped at the best published bf16 MFU" in top["interval"]["basis"]
    assert "interval is capped there" in d["warnings"][0]
    lo, hi = top["budget"]["time_to_train_days_interval"]
    assert lo < hi and hi > top["budget"]["time_to_train_days"]
    res = d["ties"]["resolution"]
    for p in d["plans"]:
        for k in p["tied_with"]:
            other = d["plans"][k - 1]
            apart = abs(math.log(p["throughput"]["tokens_per_s"] / other["throughput"]["tokens_per_s"]))
            assert apart <= res and p["rank"] in other["tied_with"]
    text = cli(*args, "--explain")
    lines = text.out.splitlines()
    assert "MFU % (80%)" in text.out and "days (" in text.out and "80% interval of #1" in text.out
    # the capped interval leaves the point outside it, and the view says why
    outside = top["budget"]["time_to_train_days"] < lo
    assert bool(re.search(r"days \([\d.,]+-[\d.,]+, capped at the best published [\d.]+% MFU\)",
                          " ".join(text.out.split()))) == outside
    if d["plans"][0]["tied_with"]:
        assert any(line.startswith("1=") or line.lstrip().startswith("1=") for line in lines)
    # each adjacent tied pair's rule is printed (#1 may be tied with #3 and not #2: ties are pairwise)
    adjacent = [k for k in range(1, len(d["plans"])) if k + 1 in d["plans"][k - 1]["tied_with"]]
    assert [n["upper"] for n in d["ties"]["decided"]] == adjacent and adjacent
    flat = " ".join(text.out.split())
    for n in d["ties"]["decided"]:
        assert f"#{n['upper']} and #{n['lower']} are tied (" in flat and f"#{n['upper']} preferred: " in flat


def _est(tps: float, headroom_gib: float, tp: int = 4, pp: int = 2, dp: int = 4) -> SimpleNamespace:
    plan = SimpleNamespace(tp=tp, pp=pp, dp=dp, cp=1, ep=1, vpp=1, zero=1, recompute="none")
    return SimpleNamespace(plan=plan, throughput=SimpleNamespace(tokens_per_s=tps),
                           memory=SimpleNamespace(headroom=headroom_gib * GIB, total=(80 - headroom_gib) * GIB,
                                                  capacity=80 * GIB),
                           cluster=SimpleNamespace(system=SimpleNamespace(domain_gpus=8)))


def test_tied_plans_rank_the_more_robust_first():
    # #2 is 1% slower but its memory interval's upper end fits the 80 GiB GPU (60 GiB x 1.25) where #1's (76 GiB)
    # does not: inside a 3% resolution they are tied, and it goes first; #3 is 10% slower: not tied, stays last.
    ranked = [_est(100.0, 4.0), _est(99.0, 20.0), _est(90.0, 30.0)]
    order, tied_with, notes = resolve(ranked, math.log(1.03))
    assert order == [1, 0, 2]
    assert tied_with == [[2], [1], []]
    assert len(notes) == 1 and notes[0].upper == 1
    assert notes[0].rule.startswith("memory within the GPU at the interval's upper end")
    # TP across the node loses to TP inside it, both memory intervals inside the GPU
    ranked = [_est(100.0, 20.0, tp=16, dp=2), _est(99.5, 25.0)]
    order, _, notes = resolve(ranked, math.log(1.03))
    assert order == [1, 0] and notes[0].rule == "TP inside the NVLink domain"
    # outside the resolution nothing moves
    assert resolve([_est(100.0, 4.0), _est(90.0, 10.0)], math.log(1.03))[0] == [0, 1]


def test_serving_estimate_carries_ttft_tpot_and_throughput_intervals(cli):
    r = cli("estimate", "--mode", "infer", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--json")
    assert r.code == 0, r.err
    d = r.json()
    v = d["interval"]
    assert v["ttft_s"][0] < d["ttft_s"] < v["ttft_s"][1] and v["tpot_s"][0] < d["tpot_s"] < v["tpot_s"][1]
    assert v["tokens_per_s"][0] < d["throughput"]["tokens_per_s"] < v["tokens_per_s"][1]
    assert "TensorRT-LLM" in v["basis"]


def test_calibrate_anchor_reproduces_the_measured_run(cli, tmp_path):
    args = ("--model", "llama-3.1-70b", "--nodes", "8", "--tp", "4", "--pp", "4", "--zero", "1",
            "--global-batch", "512")
    plan = tmp_path / "plan.json"
    assert cli("estimate", "--hardware", "dgx-h100", *args, "--save", plan).code == 0
    before = cli("estimate", "--hardware", "dgx-h100", *args, "--json").json()
    for factor in (1.2, 0.95):  # a run slower, then faster, than predicted
        measured = factor * before["time"]["step_s"]
        out = tmp_path / f"cal{factor}.yaml"
        r = cli("calibrate", "--plan", plan, "--step-time", f"{measured:.6f}", "--memory-gib", "70", "-o", out,
                "--json")
        assert r.code == 0, r.err
        d = r.json()
        assert sum(d["attribution"].values()) == pytest.approx(1.0)
        keys = {c["key"] for c in d["changes"]}
        assert {"gpu.sustained_clock_fraction", "nic_efficiency", "gpu.hbm_reserve_gib"} <= keys
        doc = yaml.safe_load(out.read_text())
        assert doc["base"] == "dgx-h100" and "sustained_clock_fraction" in doc["gpu"]
        after = cli("estimate", "--hardware", out, *args, "--json").json()
        assert after["time"]["step_s"] == pytest.approx(measured, rel=0.01)
        # the measured peak: headroom as if 70 GiB were in use
        hbm = builtin_systems()["dgx-h100"].gpu.hbm_gib
        assert after["memory"]["headroom"] == pytest.approx((hbm - 70) * GIB, rel=0.01)
        assert after["calibrated"].startswith("anchored to plan.json")
    text = cli("calibrate", "--plan", plan, "--step-time", "30", "-o", tmp_path / "cal_text.yaml")
    assert text.code == 0 and "% exposed communication" in text.out
    text = cli("calibrate", "--plan", plan, "--step-time", "30", "-o", tmp_path / "cal1.2.yaml")
    assert text.code == 2 and "already exists; pass --force" in text.err


def _anchor_moves(cli, tmp_path, args: tuple[str, ...], factor: float):
    """(shares, log change of the clock, log change of the NIC efficiency, anchor) of anchoring the plan of
    `args` to `factor` x its predicted step."""
    from llmplan.calibrate import anchored_system
    from llmplan.planfile import load_plan

    plan = tmp_path / "p.json"
    assert cli("estimate", "--hardware", "dgx-h100", *args, "--save", plan, "--force").code == 0
    pf = load_plan(plan)
    before = cli("estimate", "--hardware", "dgx-h100", *args, "--json").json()["time"]["step_s"]
    a = anchored_system(pf.model, pf.cluster, pf.plan, pf.allowance, pf.axis_order, factor * before)
    moved = {k: math.log(after / b) for k, b, after in a.changes}
    return a.shares, moved["gpu.sustained_clock_fraction"], moved["nic_efficiency"], a


def test_calibrate_attributes_the_gap_by_the_predicted_breakdown(cli, tmp_path):
    # One run cannot tell a slow clock from slow collectives; the least change that reproduces it moves each
    # constant in proportion to its share of the predicted step. Before this, both moved by one factor, so a
    # compute-bound anchor rewrote the collectives (and a DeepSpeed ZeRO-3 anchor the clock of PTD-P plans).
    dense = ("--model", "llama-3.1-70b", "--nodes", "8", "--tp", "4", "--pp", "4", "--zero", "1",
             "--global-batch", "512")
    shares, clock, nic, a = _anchor_moves(cli, tmp_path, dense, 1.2)
    assert sum(shares.values()) == pytest.approx(1.0)
    assert shares["clock"] > shares["communication"] > 0
    assert a.calibrated_s == pytest.approx(a.measured_s, rel=0.01)
    assert clock < nic < 0  # slower than predicted: both lower, the clock (the larger share) by more
    assert clock / nic == pytest.approx(shares["clock"] / shares["communication"], rel=0.02)
    # a plan with a larger exposed-communication share moves the collectives by a larger fraction of the gap
    comm = ("--model", "llama-3.1-8b", "--nodes", "8", "--tp", "8", "--global-batch", "64")  # 43% exposed
    shares2, clock2, nic2, _ = _anchor_moves(cli, tmp_path, comm, 1.2)
    assert shares2["communication"] > shares["communication"]
    assert nic2 / clock2 > nic / clock


def test_calibrate_anchor_bad_input(cli, tmp_path):
    r = cli("calibrate", "--step-time", "3")
    assert r.code == 2 and "add --plan PLAN.json" in r.err and "Traceback" not in r.err
    plan = tmp_path / "plan.json"
    cli(*EST, "--save", plan)
    r = cli("calibrate", "--plan", plan, "-o", tmp_path / "x.yaml")
    assert r.code == 2 and "--plan needs --step-time" in r.err
    r = cli("calibrate", "--plan", plan, "--step-time", "-1", "-o", tmp_path / "x.yaml")
    assert r.code == 2 and "above 0" in r.err
    r = cli("calibrate", "--plan", plan, "--step-time", "1e-4", "-o", tmp_path / "x.yaml")
    assert r.code == 2 and "faster than llmplan can price" in r.err
    r = cli("calibrate", "--plan", plan, "--step-time", "1e5", "-o", tmp_path / "x.yaml")
    assert r.code == 2 and "slower than llmplan can price" in r.err and "Traceback" not in r.err
    r = cli("calibrate", "results.json")
    assert r.code == 2 and "--hardware and --output" in r.err


def test_same_job_groups_count_each_layout_once_and_weigh_jobs_alike():
    import intervals as bench  # benchmarks/intervals.py (conftest puts benchmarks/ on the path)

    def row(i: int, job: str, layout: str, r: float, moe: bool = False) -> dict:
        return {"id": f"x-{i:02d}", "job": job, "layout": layout, "r": r, "moe": moe}

    # job A: three layouts, one of them re-measured (a later release of the same plan: not an alternative);
    # job B: one layout only (no pair); job C: two layouts 0.5 apart
    rows = [row(0, "A", "tp1", 0.0), row(1, "A", "tp1", 0.3), row(2, "A", "tp2", 0.02), row(3, "A", "tp4", 0.04),
            row(4, "B", "tp1", 0.9), row(5, "C", "tp1", 0.0), row(6, "C", "tp8", 0.5)]
    groups = bench.same_job_groups(rows)
    assert sorted(groups) == ["A", "C"] and [r["id"] for r in groups["A"]] == ["x-00", "x-02", "x-03"]
    res = bench.tie_resolution(rows)
    assert res["pairs"] == 4 and res["groups"] == 2
    # A's 3 pairs weigh 1/3 each, C's one pair 1: the weighted 0.8 quantile lies inside C's 0.5
    assert res["value"] == pytest.approx(bench.weighted_quantile([0.02, 0.04, 0.02, 0.5], [1 / 3] * 3 + [1], 0.8))
    assert res["value"] > 0.04


def test_same_job_layouts_of_narayanan_table_2_keep_the_stacks_apart(published_runs):
    import accuracy as acc  # benchmarks/ (conftest)
    import intervals as bench

    rows = published_runs
    ptdp = bench.job_of(rows["narayanan2021-t2-ptdp-174.6b-384gpu"], "narayanan2021")
    zero3 = bench.job_of(rows["narayanan2021-t2-zero3-174.6b-384gpu"], "narayanan2021")
    # same model, GPUs, batch and sequence, but Megatron-LM against DeepSpeed (Narayanan et al. 2021 section 5.2):
    # two jobs, not two layouts of one
    assert ptdp[0] != zero3[0] and "DeepSpeed ZeRO-3" in zero3[0]
    assert acc.family("narayanan2021-t2-zero3-174.6b-384gpu") == "narayanan2021"


def test_wheel_ships_the_residuals(tmp_path):
    """A non-editable build puts llmplan/data/residuals.json inside the package."""
    pytest.importorskip("hatchling")
    from hatchling.builders.wheel import WheelBuilder

    wheel = next(WheelBuilder(str(ROOT)).build(directory=str(tmp_path), versions=["standard"]))
    assert "llmplan/data/residuals.json" in zipfile.ZipFile(wheel).namelist()


def test_search_table_fits_80_columns():
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "llmplan", "search", "--model", "llama-3.1-70b", "--hardware",
                        "dgx-h100", "--nodes", "8", "--explain"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert max(len(line) for line in r.stdout.splitlines()) <= 80


def test_fewer_axes_decide_before_headroom():
    # Two plans whose memory intervals both fit the GPU (docs/validation.md#headroom-tiers): a plan with one
    # axis fewer (dp8 against dp2 cp4 on 8B) goes first even where the other keeps more memory free.
    a = _est(100.0, 17.0, tp=1, pp=1, dp=8)
    b = _est(99.5, 30.0, tp=1, pp=1, dp=2)
    b.plan.cp = 4
    order, _, notes = resolve([b, a], math.log(1.03))
    assert order == [1, 0] and notes[0].rule == "fewer parallel axes (1 vs 2)"
    # with 4 GiB free the dp8 plan's interval passes the 80 GiB GPU: memory decides first
    a = _est(100.0, 4.0, tp=1, pp=1, dp=8)
    order, _, notes = resolve([b, a], math.log(1.03))
    assert order == [0, 1] and notes[0].rule.startswith("memory within the GPU")


def test_smaller_cp_decides_before_headroom():
    # 405B on 16,384 H100 at 8k: tp8 pp8 dp128 cp2 and tp4 pp16 dp32 cp8 are tied with as many axes; the cp8
    # plan keeps 16 GiB more free but splits each sequence into 512-token chunks; both memory intervals fit
    # the GPU: the cp2 plan goes first.
    a = _est(100.0, 36.0, tp=4, pp=16, dp=32)
    a.plan.cp = 8
    b = _est(98.4, 20.0, tp=8, pp=8, dp=128)
    b.plan.cp = 2
    order, _, notes = resolve([a, b], math.log(1.03))
    assert order == [1, 0] and notes[0].rule.startswith("smaller CP degree (2 vs 8")


def test_left_out_bands_leave_the_whole_source_out():
    # docs/validation.md#lofo-source: bridge's band is not built from mbridge-dense's residuals when the two
    # carry one source (benchmarks/intervals.py tags each residual with its SOURCE_GROUPS group); a file
    # without the tag leaves out the family alone, as before.
    recs = ([{**_rec("bridge", 0.2, i), "source": "mb"} for i in range(12)]
            + [{**_rec("mbridge-dense", 0.2 + 0.01 * i, i), "source": "mb"} for i in range(12)]
            + [{**_rec("mpt", -0.1 + 0.01 * i, i), "source": "mpt"} for i in range(12)])
    pools = iv.left_out_pools(recs)
    assert sorted(pools["bridge-0"][0]) == sorted(r["r"] for r in recs if r["family"] == "mpt")
    assert sorted(pools["mpt-0"][0]) == sorted(r["r"] for r in recs if r["family"] != "mpt")
    cov = iv.coverage(recs, 0.8, pools)
    assert cov["bridge"][0] == 0  # +0.2 lies above every band built from mpt's -0.1 .. +0.01
    untagged = [{k: v for k, v in r.items() if k != "source"} for r in recs]
    pools = iv.left_out_pools(untagged)
    assert len(pools["bridge-0"][0]) == 24 and iv.coverage(untagged, 0.8, pools)["bridge"][0] > 0


def test_nested_choice_leaves_the_whole_source_out(monkeypatch):
    # docs/validation.md#intervals-source-nested: the choice that scores a family is made without every family of
    # its source (bridge and mbridge-dense are two releases of one source), and their residuals leave the bands
    # of that choice too; a file without sources leaves out the family alone, as before.
    rng = np.random.default_rng(5)
    recs = ([{**_rec(f, 0.1 + x, i), "source": "mb"} for f in ("bridge", "mbridge-dense")
             for i, x in enumerate(rng.normal(0, 0.03, 6))]
            + [{**_rec(f, x, i), "source": f} for f in "abc" for i, x in enumerate(rng.normal(0, 0.03, 6))])
    without = iv.left_out_pools(recs, without="mb")
    assert not any(i.startswith(("bridge", "mbridge")) for i in without)
    assert all(len(v[0]) == 12 for v in without.values())  # each band: the two other plain sources' runs
    seen: list[set[str]] = []
    real = conformal._narrowest_inside

    def spy(rest, sourced, lower=iv.TARGET[0]):
        assert set(sourced) == set(iv.SOURCE_CHOICES)  # every choice of sources, each without the source
        assert all(set(v) == set(sourced[iv.MIN_SOURCES]) for v in sourced.values())
        seen.append({r["family"] for r in rest} | {i.rsplit("-", 1)[0] for i in sourced[iv.MIN_SOURCES]})
        return real(rest, sourced, lower)

    monkeypatch.setattr(conformal, "_narrowest_inside", spy)
    mine = [r for r in recs]
    conformal._nested_coverage(recs, mine, iv.left_out_pools(recs), 0.9)
    assert len(seen) == 4  # one choice per source: mb, a, b, c
    assert sum(not ({"bridge", "mbridge-dense"} & s) for s in seen) == 1  # the one scoring mb has neither
    assert all({"bridge", "mbridge-dense"} <= s for s in seen if s & {"bridge", "mbridge-dense"})
    untagged = [{k: v for k, v in r.items() if k != "source"} for r in recs]
    seen.clear()
    conformal._nested_coverage(untagged, untagged, iv.left_out_pools(untagged), 0.9)
    assert len(seen) == 5  # one per family


def test_a_cell_chooses_the_fewest_sources_of_its_bands_and_the_runtime_band_follows():
    # docs/validation.md#intervals-cell-sources: three Hopper sources ran at 8 GPUs (-0.05), three at 1,024 GPUs
    # (+0.10; a source error that grows with the scale). Left out, a band of MIN_SOURCES sources drops the scale
    # (only two other sources share it) and spans both groups; a band of any number of sources keeps it and is
    # narrower. The cell takes the narrower one where both cover (nested too), and a plan's runtime band draws
    # its runs the same way: the 1,024-GPU runs alone, not all of them.
    rng = np.random.default_rng(11)
    recs = [{**_rec(f, b + x, i), "source": f, "gpus": g} for f, b, g in
            (("a", 0.1, 1024), ("b", 0.1, 1024), ("c", 0.1, 1024), ("d", -0.05, 8), ("e", -0.05, 8),
             ("f", -0.05, 8)) for i, x in enumerate(rng.normal(0, 0.02, 8))]
    sourced = iv.left_out_sourced(recs)
    assert set(sourced) == set(iv.SOURCE_CHOICES) and 1 in sourced
    assert len(sourced[iv.MIN_SOURCES]["a-0"][0]) == 40 and len(sourced[1]["a-0"][0]) == 16
    chosen = iv.choose_pools(recs, sourced[iv.MIN_SOURCES], default=0.8, sourced=sourced)
    cell = chosen["dense-megatron/hopper"]
    assert cell["nominal"] is not None and cell["min_sources"] == 1, cell
    assert iv.covers(iv.coverage(recs, (cell["nominal"], cell["weighting"]), sourced[1]))
    assert all(x >= iv.TARGET[0] for x in cell["nested"])
    big = iv.Regime(moe=False, generation="hopper", framework="megatron", gpus=1024)
    data = {"training": recs, "nominal": 0.8, "pools": chosen}
    assert iv.min_sources_of(data, big) == 1
    # at run time with c unpublished: two sources at 1,024 GPUs
    two = {**data, "training": [r for r in recs if r["family"] != "c"]}
    band = iv.training_band(big, two)
    assert band.min_sources == 1 and band.n == 16 and band.lo > 0  # the 1,024-GPU runs only, all above 0
    assert "any number of sources" in band.basis
    assert iv.training_band(big, {**two, "pools": {}}).n == 40  # no cell choice: MIN_SOURCES, the scale dropped
    # the merged material a report scores each run with follows the cell's choice
    merged = iv.merged_pools(recs, data, sourced)
    assert all(len(merged[r["id"]][0]) == 16 for r in recs)


def test_a_cell_whose_choice_fails_nested_asks_more_coverage_before_giving_up(monkeypatch):
    # docs/validation.md#intervals-cell-sources: the nested coverage (the choice made without each source) is
    # under 75% when the choice asks 75% of the other sources' runs, 75% or more when it asks 77.5%: the cell
    # keeps the choice made at 77.5% (`lower`); when no lower edge passes, the cell has none and says why.
    asked: list[float] = []

    def fake_nested(records, mine, pools, default, lower=iv.TARGET[0], cache=None):
        asked.append(lower)
        ok = 80 if lower >= 0.775 else 70
        return {"a": (ok, 100, 0.1), "b": (ok, 100, 0.1), "c": (ok, 100, 0.1)}, 0.1

    def fake_narrowest(records, sourced, lower=iv.TARGET[0]):
        return (0.8 if lower < 0.775 else 0.9, "run", iv.MIN_SOURCES)

    monkeypatch.setattr(conformal, "_nested_coverage", fake_nested)
    monkeypatch.setattr(conformal, "_narrowest_inside", fake_narrowest)
    recs = [{**_rec(f, 0.0, i), "source": f} for f in "abc" for i in range(4)]
    sourced = iv.left_out_sourced(recs)
    cell = iv.choose_pools(recs, sourced[iv.MIN_SOURCES], 0.8, sourced=sourced)["dense-megatron/hopper"]
    assert asked == [0.75, 0.775] * 2 and cell["lower"] == 0.775 and cell["nominal"] == 0.9  # the pool, then its cell
    monkeypatch.setattr(conformal, "_nested_coverage",
                        lambda *a, **k: ({"a": (70, 100, 0.1), "b": (70, 100, 0.1), "c": (70, 100, 0.1)}, 0.1))
    cell = iv.choose_pools(recs, sourced[iv.MIN_SOURCES], 0.8, sourced=sourced)["dense-megatron/hopper"]
    assert cell["nominal"] is None and "asking 85% or more" in cell["why"]


def test_every_shipped_cell_of_three_families_covers_75_percent_left_out():
    # docs/validation.md#intervals-cell-fallback: each regime cell with POOL_MIN_FAMILIES+ families of
    # POOL_MIN_RECORDS+ runs, scored as benchmarks/intervals.py scores it (each run's band from the other sources'
    # residuals, left_out_sourced, under the fewest sources and the (pair, weighting) the shipped file gives it),
    # covers at least 75% of its runs both per run and per family: its own choice, its pool's, or (rule 6) that
    # fallback widened; a fallback covering less is never taken silently.
    data = iv.shipped()
    assert data["pool_rule"] == iv.POOL_RULE
    training = data["training"]
    merged = iv.merged_pools(training, data, iv.left_out_sourced(training))
    pair = iv.pair_of(data)
    checked = []
    for name, info in data["pools"].items():
        if "/" not in name or info["families"] < iv.POOL_MIN_FAMILIES:
            continue
        mine = [r for r in training if iv.cell_of(iv.record_regime(r)) == name]
        cov = iv.coverage(mine, pair, merged)
        assert iv.covers(cov), (name, iv.per_record(cov), iv.mean_coverage(cov), info)
        checked.append(name)
    assert "dense-megatron/hopper" in checked


def test_a_cell_whose_pool_fallback_under_covers_it_takes_it_widened():
    # rule 6: four Hopper sources with biases -0.05, -0.02, +0.02, +0.05 and a pool whose 0.8 pair is fixed. Left
    # out, the cell's runs are covered under 75% at 0.8; the cell (given no own choice: `why`) takes the first
    # wider pair covering 75%, with the pool's weighting and sources, and says it widened;
    # the runtime band follows it. A fallback already covering 75% is kept as it was (no choice of the cell's).
    rng = np.random.default_rng(5)
    recs = [{**_rec(f, b + x, i), "source": f} for f, b in (("a", -0.05), ("b", -0.02), ("c", 0.02), ("d", 0.05))
            for i, x in enumerate(rng.normal(0, 0.03, 6))]
    sourced = iv.left_out_sourced(recs)
    cache: dict = {}
    mine = recs
    pool = {"nominal": 0.8, "weighting": "run", "min_sources": iv.MIN_SOURCES}
    low = iv.coverage(mine, 0.8, sourced[iv.MIN_SOURCES])
    assert not iv.covers(low)
    info: dict = {"why": "no own choice", "families": 4}
    conformal._widen_fallback(recs, mine, sourced, pool, 0.8, info, cache, nested=True)
    assert info["fallback"] == "widened" and info["fallback_from"] == "pool" and info["nominal"] > 0.8
    assert info["weighting"] == "run" and info["min_sources"] == iv.MIN_SOURCES and "why" not in info
    assert iv.covers(iv.coverage(mine, info["nominal"], sourced[iv.MIN_SOURCES]))
    narrower = [q for q in iv.NOMINAL_CHOICES if 0.8 <= q < info["nominal"]]
    assert not any(iv.covers(iv.coverage(mine, q, sourced[iv.MIN_SOURCES])) for q in narrower)
    assert "nested" in info and isinstance(info["nested_ok"], bool)
    data = {"training": recs, "nominal": 0.8, "pools": {"dense-megatron": {**pool, "families": 4},
                                                           "dense-megatron/hopper": info}}
    band = iv.training_band(iv.Regime(moe=False, generation="hopper", framework="megatron", gpus=8), data)
    assert band.nominal == info["nominal"] and band.pool == "dense-megatron/hopper" and "widened" in band.basis
    kept: dict = {"why": "no own choice", "families": 4}
    conformal._widen_fallback(recs, mine, sourced, {**pool, "nominal": 0.99}, 0.8, kept, cache, nested=True)
    assert kept["fallback"] == "pool" and "nominal" not in kept and kept["why"] == "no own choice"


def test_a_widened_fallback_basis_names_what_was_widened():
    # rule 6: a cell whose pool has no choice widens the all-regime pair; its basis must not call that the pool's
    info = {"nominal": 0.9, "weighting": "run", "families": 4, "fallback": "widened"}
    hopper = iv.Regime(moe=False, generation="hopper", framework="megatron", gpus=8)
    for came_from, says in (("pool", "the cell's pool's choice widened"), ("all-regime", "the all-regime pair widened")):
        data = {"nominal": 0.8, "pools": {"dense-megatron/hopper": {**info, "fallback_from": came_from}}}
        assert says in iv.nominal_of(data, hopper)[2]


def test_calibrate_reports_the_ring_share_it_scales(cli, tmp_path):
    """A profile that sets allreduce_nic_efficiency (a cluster file; no built-in does) has it scaled with the
    other collective efficiencies, and Anchor.changes lists it (it was scaled but not reported)."""
    from llmplan.calibrate import anchored_system
    from llmplan.estimate import estimate_training
    from llmplan.planfile import load_plan

    args = ("--model", "llama-3.1-8b", "--nodes", "8", "--tp", "8", "--global-batch", "64")
    plan = tmp_path / "p.json"
    assert cli("estimate", "--hardware", "dgx-h100", *args, "--save", plan).code == 0
    pf = load_plan(plan)
    system = pf.cluster.system.model_copy(update={"allreduce_nic_efficiency": 0.9})
    cluster = pf.cluster.model_copy(update={"system": system})
    before = float(estimate_training(pf.model, cluster, pf.plan, pf.allowance, pf.axis_order).time.total)
    a = anchored_system(pf.model, cluster, pf.plan, pf.allowance, pf.axis_order, 1.2 * before)
    moved = {k: (b, after) for k, b, after in a.changes}
    assert moved["allreduce_nic_efficiency"][0] == 0.9
    ring, nic = moved["allreduce_nic_efficiency"], moved["nic_efficiency"]
    assert ring[1] / ring[0] == pytest.approx(nic[1] / nic[0]) and ring[1] < ring[0]
