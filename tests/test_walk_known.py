"""search.filtered.keep_accepted with `known` (plans of a class the caller refuses whole, passed over unasked:
export.every_plan_mask for `search --target`) keeps what the walk that asks about every plan keeps: the same
rows, ties, notes and rows showing another plan of their layout, the same plans dropped above the last row kept,
and it asks about the same plans outside the class (counted in Walk.passed where it would have asked)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import one_run_search

from llmplan.search import filtered
from llmplan.search.filtered import keep_accepted

QWEN = ["search", "--model", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--nodes", "2", "--json"]


@pytest.fixture(scope="module")
def llama_search():
    """The 70B search on 8 DGX H100 nodes with its plans kept, as tests/test_search_target.py runs it."""
    from llmplan.search.grid import Workload, default_space
    from llmplan.search.run import search
    from llmplan.specs.plan import ClusterSpec
    from llmplan.specs.registry import builtin_models, builtin_systems

    m, cluster = builtin_models()["llama-3.1-70b"], ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=8)
    w = Workload(global_batch=512, seq_len=8192)
    return search(m, cluster, default_space(m, cluster, w, {}), w, top=5, keep_plans=True)


CLASSES = {  # a class refused whole (on arrays and on one plan alike), and what else the caller refuses
    "zero1": (lambda p: np.asarray(p.zero) == 1, lambda p: p.tp > 1 and p.micro_batch > 1),
    "tp4": (lambda p: np.asarray(p.tp) == 4, lambda p: p.zero >= 2),
    "pp": (lambda p: np.asarray(p.pp) > 1, lambda p: p.recompute == "full"),
    "mb1": (lambda p: np.asarray(p.micro_batch) == 1, lambda p: p.sp),
}


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_passing_over_a_class_keeps_the_walk(llama_search, name):
    whole, other = CLASSES[name]
    asked: dict[bool, list] = {False: [], True: []}

    def caller(passing: bool):
        def refused(c) -> bool:
            asked[passing].append(c.plan)
            return bool(whole(c.plan)) or other(c.plan)
        return refused

    old, w0 = keep_accepted(llama_search, caller(False), 5, checks=10**6)
    new, w1 = keep_accepted(llama_search, caller(True), 5, checks=10**6, known=whole)
    assert [e.plan for e in new.ranked] == [e.plan for e in old.ranked] and new.ranked
    assert (new.equivalents, new.variants, new.tied_with, new.tie_notes) == \
        (old.equivalents, old.variants, old.tied_with, old.tie_notes)
    assert (w1.other_plan, w1.dropped, w1.complete) == (w0.other_plan, w0.dropped, w0.complete)
    assert w1.passed > 0 and w0.passed == 0
    assert (w1.checked + w1.passed, w1.refused + w1.passed) == (w0.checked, w0.refused)
    outside = {k: [p for p in v if not whole(p)] for k, v in asked.items()}  # (a ranked row is asked as shown)
    assert outside[True] == outside[False] and len(asked[True]) < len(asked[False])


def test_deepspeed_walk_is_the_unlimited_walk(cli, monkeypatch):
    """qwen3-30b-a3b on 2 nodes, --target deepspeed (15,010 of its 17,299 plans that fit use EP, which DeepSpeed
    refuses whole): the walk now keeps its rows within its limit, the rows and counts the walk asking about every
    plan keeps without a limit; --target torchtitan (no class refused whole) is unchanged by the limit too.
    DeepSpeed keeps 4 rows, all at tp 1 (its AutoTP all-reduces Qwen3's q/k norm gradients per micro-batch, so
    deepspeed.tp_synced_refusal refuses every tp > 1 plan; 5 before it), torchtitan 5."""
    import llmplan.cli.target as target

    for name in ("deepspeed", "torchtitan"):
        # the two commands differ only in the walk's limit, which acts after the searches: each setting's search
        # runs once and both walks run on its result (conftest.one_run_search)
        with one_run_search():
            new = cli(*QWEN, "--target", name).json()
            with monkeypatch.context() as mp:
                mp.setattr(target, "keep_accepted", lambda res, refused, top, known=None:
                           filtered.keep_accepted(res, refused, top, checks=10**6))
                old = cli(*QWEN, "--target", name).json()
        assert [r["plan"] for r in new["plans"]] == [r["plan"] for r in old["plans"]]
        assert len(new["plans"]) == (4 if name == "deepspeed" else 5)
        assert name != "deepspeed" or {r["plan"]["tp"] for r in new["plans"]} == {1}
        assert new["not_exportable"] == old["not_exportable"]
        a, b = new["target_walk"], old["target_walk"]
        assert a["complete"] and a["other_plan_of_layout"] == b["other_plan_of_layout"]
        assert (a["checked"] + a["passed"], a["refused"] + a["passed"]) == (b["checked"], b["refused"])
        assert (a["passed"] > 0) == (name == "deepspeed") and a["checked"] <= a["limit"]
        walks = new["target_walks"]  # every search's walk (two switch settings here), the shown one marked
        assert len(walks) == len(new["switches"]["tried"]) == 2
        assert [{k: v for k, v in w.items() if k in a} for w in walks if w["shown"]] == [a]
        assert {(w["grad_dtype"], w["fp8_params"], w["gpus"]) for w in walks} == \
            {(t["grad_dtype"], t["fp8_params"], 16) for t in new["switches"]["tried"]}


def test_a_workload_refused_whole_is_named(cli):
    """--grad-dtype bf16 with --target torchtitan (a switch torchtitan refuses whatever the plan: EVERY_PLAN):
    every plan that fits is passed over, none asked but the ranked rows, and the one line (exit 2) names that
    rule as refusing them whole (before, the walk asked 5,000 plans and stopped; cli.target.refuse_every_setting:
    it once named it as the refusal met most often)."""
    r = cli("search", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--nodes", "8", "--target", "torchtitan",
            "--grad-dtype", "bf16")
    line = r.refusal()
    assert "bf16 gradient reduction" in line.split("refused whole")[1] and "none of the" in line


def test_target_walks_mark_the_shown_walk_by_position():
    """report.search.target_json marks `target_walks[i].shown` where i is the shown search's position
    (SearchResult.walk_index, recorded by cli.search.SettingSearch.run), not by object identity: the same walk
    object held twice, or two equal walks, are marked only at that position (before: `k is walk`, both)."""
    from types import SimpleNamespace

    from llmplan.report.search import target_json
    from llmplan.search.filtered import Walk
    w = SimpleNamespace(grad_dtype="fp32", fp8_params=False, fp8_scaling="delayed")
    c = SimpleNamespace(system=SimpleNamespace(domain_gpus=8), num_gpus=16)
    walk = Walk(checked=3, refused=1, other_plan=(), complete=True)
    held = ((w, c, walk), (w, c, walk), (w, c, Walk(checked=3, refused=1, other_plan=(), complete=True)))
    for shown in range(3):
        doc = target_json("megatron", 0, walk, None, held, shown)  # type: ignore[arg-type]
        assert [x["shown"] for x in doc["target_walks"]] == [i == shown for i in range(3)]
    assert [x["shown"] for x in target_json("megatron", 0, None, None, held)["target_walks"]] == [False] * 3
