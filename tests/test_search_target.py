"""`search --target NAME` keeps only the plans `export --to NAME` writes (cli.target over export.refusal)."""

from __future__ import annotations

import json
import math

import pytest

LLAMA = ["search", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--nodes", "8"]
NEMOTRON = ["search", "--model", "nemotron-3-super", "--hardware", "gb200-nvl72", "--nodes", "8"]


def saved_then_exported(cli, tmp_path, args, target):
    plan = tmp_path / "plan.json"
    r = cli(*args, "--target", target, "--save", plan, "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["target"] == target and doc["plans"]
    e = cli("export", plan, "--to", target, "--out", tmp_path / "out", "--json")
    assert e.code == 0, e.err
    assert e.json()["files"]
    a = cli("export", plan, "--to", "all", "--out", tmp_path / "all", "--json")  # `all` writes it too
    assert a.code == 0 and target not in a.json()["skipped"], a.err
    return doc, json.loads(plan.read_text())


def test_nemotron_megatron_exports(cli, tmp_path):
    plain = cli(*NEMOTRON, "--json").json()
    doc, saved = saved_then_exported(cli, tmp_path, NEMOTRON, "megatron")
    assert saved["plan"]["tp"] == doc["plans"][0]["plan"]["tp"]
    top = plain["plans"][0]["plan"]
    if top["zero"] == 3:  # the untargeted #1 (ZeRO-3, issue text) is one megatron refuses: dropped, counted
        assert doc["not_exportable"] >= 1 and doc["plans"][0]["plan"]["zero"] != 3


def test_llama_torchtitan_saved_plan_exports(cli, tmp_path):
    plain = tmp_path / "plain.json"
    assert cli(*LLAMA, "--save", plain, "--json").code == 0
    refused = cli("export", plain, "--to", "torchtitan", "--out", tmp_path / "p")
    doc, _ = saved_then_exported(cli, tmp_path, LLAMA, "torchtitan")
    if refused.code == 2:  # the default #1 needs a re-plan for torchtitan: the targeted search dropped it
        assert doc["not_exportable"] >= 1
    assert len(doc["plans"]) <= 5


@pytest.mark.parametrize("target", ["deepspeed", "megatron-bridge"])
def test_llama_other_targets_export(cli, tmp_path, target):
    saved_then_exported(cli, tmp_path, LLAMA, target)


def test_unknown_target_one_line(cli):
    line = cli(*LLAMA, "--target", "nosuch").refusal()
    assert "--target nosuch" in line and "megatron" in line


def test_target_of_other_mode_one_line(cli):
    assert "--mode infer" in cli(*LLAMA, "--target", "vllm").refusal()


def test_no_plan_exports_names_target_and_reason(cli):
    line = cli(*NEMOTRON, "--target", "torchtitan").refusal()
    assert "torchtitan" in line and "cannot express this plan" in line


def test_serving_target(cli, tmp_path):
    args = ["search", "--mode", "infer", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--nodes", "1"]
    saved_then_exported(cli, tmp_path, args, "vllm")


def test_table_names_target_within_80_columns(cli):
    r = cli(*LLAMA, "--target", "torchtitan")
    assert r.code == 0, r.err
    assert "target torchtitan:" in r.out and "dropped as not exportable" in r.out
    assert max(len(line) for line in r.out.splitlines()) <= 80


def test_without_target_unchanged(cli):
    """No --target: the search's JSON holds no target keys (the rest is the code path as before)."""
    doc = cli(*LLAMA, "--json").json()
    assert "target" not in doc and "not_exportable" not in doc


def test_llama_torchtitan_keeps_other_variants_that_export(cli, tmp_path):
    """A layout whose best plan torchtitan refuses (ZeRO-1, Megatron-costed TP) stands by its best plan that it
    writes (ZeRO-2/3, ...), so the targeted search keeps --top plans, not only the one layout whose best plan is
    FSDP already (the old walk kept 1 of 5). Each kept row is a plan file `export --to torchtitan` writes: the
    saved #1 as --save wrote it, the others as that file with the row's plan in place of #1's."""
    saved = tmp_path / "best.json"
    r = cli(*LLAMA, "--target", "torchtitan", "--save", saved, "--json")
    assert r.code == 0, r.err
    doc = r.json()
    plans = doc["plans"]
    assert len(plans) > 1
    best = json.loads(saved.read_text())
    assert best["plan"] == plans[0]["plan"]  # --save wrote the kept #1
    for row in plans:
        path = tmp_path / f"plan{row['rank']}.json"
        path.write_text(json.dumps({**best, "plan": row["plan"]}))
        e = cli("export", path, "--to", "torchtitan", "--out", tmp_path / f"out{row['rank']}", "--json")
        assert e.code == 0, (row["rank"], e.err)
    walk = doc["target_walk"]
    assert walk["other_plan_of_layout"] and doc["not_exportable"] == walk["refused"] >= 1
    for k in walk["other_plan_of_layout"]:  # such a row describes the plan kept: its layout is placed by it
        row = plans[k - 1]
        assert row["variants"]["layout_best_score"] == pytest.approx(row["throughput"]["tokens_per_s"], rel=1e-3)


@pytest.mark.parametrize("target", ["torchtitan", "deepspeed"])
def test_tie_notes_join_rows_shown_next_to_each_other(cli, target):
    """Ties are resolved again among the rows kept: a note joins two adjacent rows within the resolution, and
    each row's tied ranks are the kept rows within it."""
    doc = cli(*LLAMA, "--target", target, "--json").json()
    plans, ties = doc["plans"], doc["ties"]
    rate = [p["throughput"]["tokens_per_s"] for p in plans]
    within = lambda a, b: abs(math.log(rate[a - 1] / rate[b - 1])) <= ties["resolution"]  # noqa: E731
    for n in ties["decided"]:
        assert n["lower"] == n["upper"] + 1 <= len(plans) and within(n["upper"], n["lower"])
    for p in plans:
        assert sorted(p["tied_with"]) == [k for k in range(1, len(plans) + 1)
                                          if k != p["rank"] and within(k, p["rank"])]


@pytest.fixture(scope="module")
def llama_search():
    """The 70B search on 8 DGX H100 nodes with its plans kept (search.filtered's input), as the library runs it."""
    from llmplan.search.grid import Workload, default_space
    from llmplan.search.run import search
    from llmplan.specs.plan import ClusterSpec
    from llmplan.specs.registry import builtin_models, builtin_systems

    m, cluster = builtin_models()["llama-3.1-70b"], ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=8)
    w = Workload(global_batch=512, seq_len=8192)
    return search(m, cluster, default_space(m, cluster, w, {}), w, top=5, keep_plans=True)


def test_walk_refusing_nothing_is_the_search(llama_search):
    """A caller that refuses nothing keeps the search's rows, ties and notes: the walk asks about the rows only."""
    from llmplan.search.filtered import keep_accepted

    kept, walk = keep_accepted(llama_search, lambda c: False, 5)
    assert [e.plan for e in kept.ranked] == [e.plan for e in llama_search.ranked]
    assert kept.tied_with == llama_search.tied_with and kept.tie_notes == llama_search.tie_notes
    assert walk.checked == 5 and walk.refused == 0 and not walk.other_plan and walk.complete


def test_walk_keeps_each_layout_by_its_best_accepted_plan(llama_search):
    """Refusing every ZeRO-1 plan (the search's rows are ZeRO-1 here) keeps five layouts by a plan of another
    stage, each row priced as that plan (its estimate's plan) and placed by its own score; every plan of a kept
    layout that scores above its row was refused."""
    from llmplan.search.filtered import keep_accepted

    assert any(e.plan.zero == 1 for e in llama_search.ranked)
    asked: list = []

    def refused(c):
        asked.append(c.plan)
        return c.plan.zero == 1

    kept, walk = keep_accepted(llama_search, refused, 5)
    assert len(kept.ranked) == 5 and walk.complete
    assert all(e.plan.zero != 1 for e in kept.ranked)
    assert len({(e.plan.tp, e.plan.pp, e.plan.dp, e.plan.cp, e.plan.vpp > 1) for e in kept.ranked}) == 5
    assert set(walk.other_plan) == {k for k, e in enumerate(kept.ranked, 1)
                                    if any(p.zero == 1 and (p.tp, p.pp, p.dp, p.cp, p.vpp > 1) ==
                                           (e.plan.tp, e.plan.pp, e.plan.dp, e.plan.cp, e.plan.vpp > 1)
                                           for p in asked)}
    for k in walk.other_plan:  # a row of another plan is placed by that plan's score, not by its refused best
        rate = float(kept.ranked[k - 1].throughput.tokens_per_s)
        assert kept.variants[k - 1].best == pytest.approx(rate, rel=1e-3)
    for n in kept.tie_notes:
        assert n.lower == n.upper + 1
