"""`search --target NAME` keeps only the plans `export --to NAME` writes (cli.target over export.refusal)."""

from __future__ import annotations

import json
import math

import pytest

LLAMA = ["search", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--nodes", "8"]
# Pinned to tp 1, pp 1: what the Nemotron tests check (a targeted search keeps or drops the untargeted #1, a
# target that writes no plan is refused) holds on any search space. The unpinned untargeted and --target megatron
# searches both rank a tp 1 pp 1 plan first, and the pinned ones rank the very same entries first (compared whole,
# plan and predictions, 2026-12-07) at about a sixth of the CPU (1.8-2.7 against 12.6-12.8 s a search).
NEMOTRON = ["search", "--model", "nemotron-3-super", "--hardware", "gb200-nvl72", "--nodes", "8", "--tp", "1",
            "--pp", "1"]


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
    if "megatron" in plain["best_exports_to"]:  # the untargeted #1 is one megatron writes: still first when targeted
        assert doc["plans"][0]["plan"] == top
    else:  # one megatron refuses (ZeRO-3 on a hybrid, issue text): dropped, counted, and said so untargeted
        assert doc["not_exportable"] >= 1 and "megatron" in plain["best_refusals"]


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
    # --save wrote the kept #1, a dense model's expert TP as "same as tp" (0) where the search's grid fills tp
    # (planfile._saved_plan, docs: a hand edit of plan.tp is then not refused for an expert degree)
    assert best["plan"]["etp"] == 0 and plans[0]["plan"]["etp"] == plans[0]["plan"]["tp"]
    assert {**best["plan"], "etp": plans[0]["plan"]["etp"]} == plans[0]["plan"]
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


def test_asked_file_answers_as_the_saved_file(llama_search):
    """The walk asks about a plan with the search's plan file, #1's, with that plan swapped in (cli.target.asker),
    never pricing it: for plans of the search drawn at random, every training target answers that file as it
    answers the file `--save` writes for the plan (its own predictions), word for word."""
    import random

    from llmplan.cli.target import asker
    from llmplan.export import TRAIN_TARGETS, refusal
    from llmplan.planfile import document_plan, plan_document
    from llmplan.report.training import estimate_json
    from llmplan.search.filtered import of_arrays
    from llmplan.specs.allowance import MemoryAllowance
    from llmplan.topology.placement import DEFAULT_ORDER

    lp = llama_search.layout_plans
    doc_of = lambda e: plan_document(e, MemoryAllowance(), DEFAULT_ORDER, estimate_json(e))  # noqa: E731
    like = llama_search.ranked[0]
    picks = random.Random("asked-file").sample(range(len(lp.score)), 30)
    saved = {i: document_plan(doc_of(lp.estimate(i))) for i in picks}
    answers = set()
    for target in TRAIN_TARGETS:
        reason = asker(target, doc_of)
        for i in picks:
            want = refusal(saved[i], target)
            assert reason(of_arrays(lp, i, like)) == want, (target, lp.plans.plan(i))
            answers.add(want is None)
    assert answers == {True, False}


def test_not_exportable_counts_the_refused_above_the_last_row(llama_search):
    """A walk that stops at its limit with fewer rows than asked for has refused plans after its last row: those
    are not better-ranked plans dropped. Walk.dropped (JSON not_exportable) counts the refusals asked before the
    last row was kept; Walk.refused (target_walk.refused) all of them; the text says both."""
    from llmplan.report.search import target_lines
    from llmplan.search.filtered import keep_accepted

    answers: list[bool] = []

    def refused(c):
        answers.append(not (c.plan.pp == 8 and c.plan.zero == 0))
        return answers[-1]

    kept, walk = keep_accepted(llama_search, refused, 5, checks=400)
    assert not walk.complete and 0 < len(kept.ranked) < 5 and walk.checked == len(answers) == 400
    last = max(k for k, bad in enumerate(answers) if not bad)
    assert walk.refused == sum(answers) and walk.dropped == sum(answers[:last]) < walk.refused
    text = " ".join(target_lines("t", walk.dropped, walk))
    assert f"target t: {walk.dropped:,} better-ranked plans dropped as not exportable" in text
    assert "the walk stopped after asking about 400 plans (at most 400)" in text
    assert f"    {walk.refused:,} of them refused" in text


def test_not_exportable_against_the_walk_on_a_target_that_keeps_few(cli):
    """torchtitan-0.2 (no ZeRO-1, TP with sequence parallelism only, ...) keeps fewer than 5 llama-3.1-70b plans
    in 5,000 asked: not_exportable is the refused above the last row kept, fewer than the walk refused."""
    r = cli(*LLAMA, "--target", "torchtitan-0.2", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    walk = doc["target_walk"]
    assert len(doc["plans"]) < 5 and not walk["complete"] and walk["checked"] == 5000
    assert doc["not_exportable"] < walk["refused"]


# Side outputs (docs/validation.md#target-sides): the Pareto front, the conventional plan, the "without CP" /
# "with EP" comparisons and each row's +N / variants counts hold only plans the target accepts. Each search is
# pinned small (about 1.5 s); `export --to TARGET` of a plan file is the oracle.
L8 = ["search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1", "--pp", "1", "--micro-batch", "1",
      "--recompute", "none", "--no-sp"]
QWEN_MOE = ["search", "--model", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--nodes", "1", "--pp", "1",
            "--micro-batch", "1"]
LONG = ["search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1", "--seq-len", "65536",
        "--global-batch", "64", "--pp", "1", "--micro-batch", "1"]


def targeted(cli, tmp_path, args, target):
    """The targeted search's JSON, its text and an `exports(plan)` oracle: whether `export --to target` writes
    the saved plan file with `plan` in place of #1's."""
    saved = tmp_path / "best.json"
    r = cli(*args, "--target", target, "--save", saved, "--json")
    assert r.code == 0, r.err
    text = cli(*args, "--target", target)
    assert text.code == 0, text.err
    best = json.loads(saved.read_text())

    def exports(plan: dict) -> bool:
        path = tmp_path / "side.json"
        path.write_text(json.dumps({**best, "plan": plan}))
        return cli("export", path, "--to", target, "--out", tmp_path / "side", "--force").code == 0

    return r.json(), " ".join(text.out.split()), exports


def test_pareto_and_conventional_hold_only_accepted_plans(cli, tmp_path):
    """torchtitan refuses ZeRO-1 and other plans the untargeted front holds: the targeted front is every plan it
    writes, and the conventional plan (TP over the node, ZeRO-1) is either one it writes or null with a line."""
    doc, text, exports = targeted(cli, tmp_path, L8, "torchtitan")
    assert doc["pareto"]
    for row in doc["pareto"]:
        assert exports(row["plan"]), row["plan"]
    conv = doc["target_sides"]["conventional"]
    if doc.get("conventional") is not None:
        assert exports(doc["conventional"]["plan"]) and conv["status"] == "accepted"
    else:
        assert "conventional" in doc and conv["status"] == "refused"
        assert "torchtitan refuses it; not compared" in text and "#1 vs conventional" not in text
    assert "plans torchtitan accepts only" in text


def test_with_ep_comparison_only_with_an_accepted_plan(cli, tmp_path):
    """#1 of a DeepSpeed-targeted MoE search runs ep 1; the "best with EP" comparison shows a plan DeepSpeed
    writes, or JSON null and one line saying none is accepted (never a refused EP plan)."""
    doc, text, exports = targeted(cli, tmp_path, QWEN_MOE, "deepspeed")
    assert doc["plans"][0]["plan"]["ep"] == 1 and "with_ep" in doc
    if doc["with_ep"] is not None:
        assert doc["with_ep"]["plan"]["ep"] > 1 and exports(doc["with_ep"]["plan"])
        assert "#1 vs best with EP" in text and doc["target_sides"]["with_ep"]["status"] == "accepted"
    else:
        assert doc["target_sides"]["with_ep"]["status"] == "none" and "#1 vs best with EP" not in text
        assert "no plan with EP that deepspeed accepts" in text


def test_with_ep_not_walked_where_every_ep_plan_is_refused(cli, tmp_path):
    """DeepSpeed refuses every plan with EP (DeepSpeed-MoE sets it in model code; export.every_plan_refusal): the
    comparison asks about none of them (it asked about 5,000), and JSON and text say why; `export --to
    deepspeed` of #1 with ep 2 refuses it."""
    doc, text, exports = targeted(cli, tmp_path, QWEN_MOE, "deepspeed")
    side = doc["target_sides"]["with_ep"]
    assert doc["with_ep"] is None and side["status"] == "none" and side["checked"] == 0 and side["complete"]
    assert "deepspeed cannot express this plan: expert parallelism (ep 2;" in side["refused_every"]
    assert "no plan with EP that deepspeed accepts, none asked: it refuses every one" in text
    assert not exports({**doc["plans"][0]["plan"], "ep": 2})
    assert doc["target_sides"]["conventional"]["refused_every"] is None


def test_without_cp_comparison_is_an_accepted_plan(cli, tmp_path):
    """#1 of a long-sequence search for megatron-bridge runs CP; the best plan without CP shown beside it is one
    megatron-bridge writes (the untargeted best one is refused here)."""
    doc, text, exports = targeted(cli, tmp_path, LONG, "megatron-bridge")
    assert doc["plans"][0]["plan"]["cp"] > 1 and "without_cp" in doc
    if doc["without_cp"] is not None:
        assert doc["without_cp"]["plan"]["cp"] == 1 and exports(doc["without_cp"]["plan"])
        assert "#1 vs best without CP" in text
    else:
        assert "no plan without CP that megatron-bridge accepts" in text


def test_row_counts_only_accepted_zero_stages(cli, tmp_path):
    """With sp, recompute, micro-batch and pp pinned, a layout's other plans are its other ZeRO stages: a row's
    +N and variants together count at most those `export --to torchtitan` writes (it refuses ZeRO-1)."""
    doc, _, exports = targeted(cli, tmp_path, L8, "torchtitan")
    refused_any = False
    for row in doc["plans"]:
        p = row["plan"]
        others = [{**p, "zero": z} for z in range(4) if z != p["zero"]]
        ok = [o for o in others if exports(o)]
        refused_any |= len(ok) < len(others)
        assert row["equivalent"] + row["variants"]["count"] <= len(ok), (p, row["equivalent"], row["variants"])
    assert refused_any  # the check bites: some row has a refused sibling


def test_recount_refusing_nothing_is_the_search(llama_search):
    """Counting again among the plans a caller accepts, when it refuses none, gives the search's own +N and
    variants for every row of the arrays."""
    from llmplan.search.filtered import keep_sides

    kept, sides = keep_sides(llama_search, llama_search.layout_plans, lambda c: False)
    for k, e in enumerate(llama_search.ranked):
        if e.plan.pp_layout is None:
            assert kept.equivalents[k] == llama_search.equivalents[k]
            assert kept.variants[k] == llama_search.variants[k]
    assert sides is not None and not sides.upper_bound
    assert [e.plan for e in kept.pareto] == [e.plan for e in llama_search.pareto]


def test_recount_is_the_search_without_the_refused_plans(llama_search):
    """Refusing every ZeRO-1 plan, each array row's counts are search.variants.variants_of's over the arrays
    with the ZeRO-1 plans taken out of the row's layout."""
    import numpy as np

    from llmplan.search.filtered import keep_sides
    from llmplan.search.variants import variants_of

    lp = llama_search.layout_plans
    kept, _ = keep_sides(llama_search, lp, lambda c: c.plan.zero == 1)
    codes = np.where(np.asarray(lp.plans.zero) == 1, -1, lp.codes)
    for k, e in enumerate(llama_search.ranked):
        i = lp.index_of(e.plan, lp.layout_of(e.plan))
        if i is None or e.plan.zero == 1:
            continue
        n, v = variants_of(i, codes, lp.score, lp.memory, lp.full, lp.plans, lp.resolution)
        assert kept.equivalents[k] == n and kept.variants[k].count == v.count and kept.variants[k].near == v.near


def test_serving_walk_states_its_depth_when_it_ends_early(cli, monkeypatch):
    """A serving layout has no variants (one plan per layout): the targeted walk goes down the ranking, WALK deep
    (or --top); where that ends it before --top plans are kept while more layouts fit, JSON and one line say so.
    WALK is lowered so that the walk over mixtral-8x22b's vLLM-refused EP layouts ends early."""
    import llmplan.cli.search as cs

    args = ["search", "--mode", "infer", "--model", "mixtral-8x22b", "--hardware", "dgx-h100", "--nodes", "8",
            "--target", "vllm", "--top", "5"]
    monkeypatch.setattr(cs, "WALK", 0)
    plain = cli(*args[:-4], "--top", "5", "--json").json()["plans"]  # the same search, untargeted
    doc = cli(*args, "--json").json()
    walk = doc["target_walk"]
    assert walk["limit"] == 5 and walk["checked"] == 5
    if len(doc["plans"]) < 5 and doc["feasible"] > 5:
        assert walk["complete"] is False and walk["refused"] == 5 - len(doc["plans"])
        ranks = [next(k for k, e in enumerate(plain, 1) if e["plan"] == p["plan"]) for p in doc["plans"]]
        assert doc["not_exportable"] == max(ranks) - len(ranks)  # the refused ranked above the last one kept
        text = cli(*args).out
        assert "the walk stopped after asking about 5 layouts (at most 5)\n" in text
        assert f"    {walk['refused']} of them refused" in text
    else:
        pytest.fail("the case no longer ends the walk early: pick another")
    monkeypatch.setattr(cs, "WALK", 40)
    assert cli(*args, "--json").json()["target_walk"]["complete"] is True
