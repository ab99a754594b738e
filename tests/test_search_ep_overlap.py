"""The search tries Megatron-Core's EP all-to-all overlap (issue 32: switches modern recipes set are tried, and the
output says which won; docs/validation.md#search-ep-overlap).

Megatron-Bridge's DeepSeek-V3 and Qwen3 MoE presets set moe_a2a_overlap (--overlap-moe-expert-parallel-comm,
ParallelPlan.ep_comm_overlap). `llmplan search` priced it (cost.moe.ep_exposed) only when told to."""

from __future__ import annotations

import re

import pytest

from llmplan.search.grid import Workload
from llmplan.search.run import ep_overlap_variants
from llmplan.specs.registry import resolve_model

QWEN = ("--model", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--nodes", "1", "--global-batch", "128",
        "--seq-len", "4096", "--top", "1", "--no-cp", "--micro-batch", "1")
ON = [{"ep_comm_overlap": True}]


def test_the_overlap_is_tried_where_no_rule_refuses_it_whatever_the_axes():
    moe, dense, w = resolve_model("deepseek-v3"), resolve_model("llama-3.1-8b"), Workload()
    assert ep_overlap_variants(moe, w, False, True) == ON  # one MTP module: ep_overlap_mtp allows it
    assert ep_overlap_variants(dense, w, False, True) == []
    assert ep_overlap_variants(moe, w, True, True) == []  # --ep-comm-overlap / --no-ep-comm-overlap named
    assert ep_overlap_variants(moe, w, False, False) == []  # --ep 1
    # rules that refuse it on every plan with ep > 1 (check_switches): fp32, moe recomputed, two MTP modules
    assert ep_overlap_variants(moe, Workload(dtype="fp32"), False, True) == []
    assert ep_overlap_variants(moe, Workload(recompute_modules=("moe",)), False, True) == []
    two_mtp = moe.model_copy(update={"num_nextn_predict_layers": 2})
    assert ep_overlap_variants(two_mtp, w, False, True) == []
    # pinned axes the overlap cannot run with (Megatron-Core's asserts: no full recompute; virtual stages with pp > 1)
    assert ep_overlap_variants(moe, w, False, True, {"recompute": "full"}) == []
    assert ep_overlap_variants(moe, w, False, True, {"pp": 4, "vpp": 1}) == []
    assert ep_overlap_variants(moe, w, False, True, {"pp": 4, "vpp": None, "recompute": "selective"}) == ON
    # DualPipe hides the all-to-alls already (cost.moe.ep_exposed): nothing left for the overlap to hide
    assert ep_overlap_variants(moe, Workload(pp_schedule="dualpipe"), False, True) == []


@pytest.fixture(scope="module")
def pinned_and_free():
    """`llmplan search` of Qwen3-30B-A3B on one DGX H100, free and with the overlap pinned each way (JSON)."""
    import contextlib
    import io
    import json

    from llmplan.cli import main

    out = {}
    for key, extra in (("free", ()), ("on", ("--ep-comm-overlap",)), ("off", ("--no-ep-comm-overlap",))):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), pytest.raises(SystemExit) as done:
            main(["search", *QWEN, *extra, "--json"])
        assert done.value.code in (0, None), key
        out[key] = json.loads(buf.getvalue())
    return out


def test_the_free_search_shows_the_better_of_the_two_pinned_ones(pinned_and_free):
    tps = {k: d["plans"][0]["throughput"]["tokens_per_s"] for k, d in pinned_and_free.items()}
    assert tps["free"] == pytest.approx(max(tps["on"], tps["off"]), rel=1e-9)
    free = pinned_and_free["free"]
    better = "on" if tps["on"] > tps["off"] else "off"
    assert free["plans"][0]["plan"] == pinned_and_free[better]["plans"][0]["plan"]
    # the choice is named in JSON, beside the settings tried (each dispatcher with and without it)
    s = free["switches"]
    assert s["ep_comm_overlap"] is free["plans"][0]["plan"]["ep_comm_overlap"]
    assert {t["ep_comm_overlap"] for t in s["tried"]} == {False, True}
    assert {t["moe_dispatcher"] for t in s["tried"] if t["ep_comm_overlap"]} == {"alltoall", "deepep"}


def test_a_pinned_overlap_is_not_searched(pinned_and_free):
    for key, value in (("on", True), ("off", False)):
        doc = pinned_and_free[key]
        assert all("ep_comm_overlap" not in t for t in doc["switches"]["tried"]), key
        assert "ep_comm_overlap" not in doc["switches"]
        assert doc["plans"][0]["plan"]["ep"] > 1
        assert doc["plans"][0]["plan"]["ep_comm_overlap"] is value, key


def test_the_text_output_names_the_choice(cli):
    r = cli("search", *QWEN)
    assert r.code == 0, r.err
    text = " ".join(r.out.split())
    assert "EP comm overlap on" in text or "EP comm overlap off" in text
    # the flags that pin the settings tried, --ep-comm-overlap among them (on H100 the TP overlap may be tried too:
    # beside it the EP overlap is priced at one queue, docs/formulas.md#moe.overlap_queues)
    assert re.search(r"--ep-comm-overlap( / --[a-z-]+)* pin them", text), text


def test_a_workload_that_refuses_it_gets_no_variant_and_no_error(cli):
    r = cli("search", *QWEN, "--dtype", "fp32", "--json")  # ep_overlap_dtype: bf16 / fp16 models only
    assert r.code == 0, r.err
    doc = r.json()
    assert all("ep_comm_overlap" not in t for t in doc["switches"]["tried"])
    assert doc["plans"][0]["plan"]["ep_comm_overlap"] is False
