"""`search --hardware A,B` ranks the systems' best plans by the objective and marks ties with the search's resolution;
among tied systems it now applies the one search's first tie rule (docs/validation.md#headroom-tiers): a best plan
whose memory interval's upper end passes the GPU goes after a tied one that fits there (search.systems.compare,
through search.ties.row_order and at_risk). Before branch search-edges the cheaper system stayed #1 on cost alone.

The case: Qwen3-30B-A3B on one node of DGX H100 (80 GB) and of HGX H100 96 GB, --objective cost at given prices.
The H100's best plan (tp4 pp2 ep4 zero0 mb2 since the EP overlap beside TE's TP overlap is priced at one hardware
queue, docs/validation.md#mend1-review-fixes; tp4 dp2 ep8 zero2 before) passes its 79.2 GiB at the interval's upper
end; the 96 GB system's fits; their costs are within the MoE resolution of each other, the H100's the lower at
$1.90 against $1.85 a GPU-hour (at $2.00 it was the lower before that change, and is no longer)."""

from __future__ import annotations

import math

import pytest
from conftest import one_train_search, run_cli

ARGS = ("search", "--model", "qwen3-30b-a3b", "--hardware", "dgx-h100,hgx-h100-96gb", "--nodes", "1",
        "--objective", "cost", "--price", "dgx-h100=1.9,hgx-h100-96gb=1.85")


@pytest.fixture(scope="module")
def compared():
    """The comparison's JSON and text runs, once for the module: the text renders the JSON run's searches (one per
    system) through the real command's report path instead of searching again (conftest.one_train_search)."""
    with one_train_search():
        return run_cli(*ARGS, "--json"), run_cli(*ARGS)


def test_a_tied_system_whose_best_plan_fits_goes_before_a_cheaper_one_at_risk(compared):
    r = compared[0]
    assert r.code == 0, r.err
    d = r.json()
    rows = {s["system"]: s for s in d["systems"]}
    h100, h96 = rows["dgx-h100"], rows["hgx-h100-96gb"]
    assert h100["memory_at_risk"] is True and h96["memory_at_risk"] is False
    cost_h100, cost_h96 = h100["run"]["cost_usd"], h96["run"]["cost_usd"]
    assert cost_h100 < cost_h96 and abs(math.log(cost_h96 / cost_h100)) <= d["resolution"]  # tied, H100 cheaper
    assert [s["system"] for s in d["systems"]] == ["hgx-h100-96gb", "dgx-h100"]
    assert (h96["rank"], h100["rank"]) == (1, 2) and h96["tied_with"] == [2] and h100["tied_with"] == [1]
    assert d["plans"][0]["system"] == "hgx-h100-96gb"
    assert len(d["tie_notes"]) == 1 and d["tie_notes"][0].startswith("hgx-h100-96gb before dgx-h100 (cost tied)")


def test_the_text_says_which_best_plan_is_at_risk(compared):
    r = compared[1]
    assert r.code == 0, r.err
    text = " ".join(r.out.split())
    assert "#2 dgx-h100:" in text and "memory at risk:" in text
    assert "hgx-h100-96gb before dgx-h100 (cost tied): memory within the GPU at the interval's upper end" in text


def test_systems_beyond_the_resolution_keep_the_objective_order(cli):
    """Throughput, DGX H100 against DGX A100: the H100's best plan (about 110k tok/s against 46k) is far outside
    the resolution: it stays first though at risk, and is marked so."""
    args = (*ARGS[:4], "dgx-h100,dgx-a100", *ARGS[5:7])
    d = cli(*args, "--json").json()
    assert [s["system"] for s in d["systems"]] == ["dgx-h100", "dgx-a100"]
    tok = [s["run"]["tokens_per_s"] for s in d["systems"]]
    assert abs(math.log(tok[0] / tok[1])) > d["resolution"]
    assert d["systems"][0]["memory_at_risk"] is True and d["tie_notes"] == []
