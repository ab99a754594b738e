"""A search pinned to the switches its free run chose returns that run's first plan (docs/validation.md#pin-bug).

On a rack of 72 GPUs (GB200 NVL72) with a power-of-two global batch, the free search's MoE winner runs on the
power-of-two share of each NVLink domain (64 GPUs: EP 16 tiles it, not the 72), where it turned on the EP
all-to-all overlap. With the same switches pinned (--ep-comm-overlap and the dispatcher), the search refused the
command on the full racks (no plan there with ep > 1 passes the rules) before it tried the share, where the
plan it refused stands: exit 2 for the free search's own winning values. The refusal must still stand where no
share mends it."""

from __future__ import annotations

import re

import pytest

AXES = ("--model", "qwen3-30b-a3b", "--hardware", "gb200-nvl72", "--nodes", "18", "--global-batch", "256",
        "--seq-len", "4096", "--tp", "1", "--cp", "1", "--no-sp", "--recompute", "none", "--zero", "1",
        "--grad-dtype", "bf16", "--no-fp8-params", "--top", "1")
"""Axes pinned alike in both runs, so that the free search is short; the bug shows with them as without."""


def flags(plan: dict) -> list[str]:
    """The winner's MoE switches as the command line pins them."""
    return ["--moe-dispatcher", plan["moe_dispatcher"], "--moe-flex-backend", plan["moe_flex_backend"],
            "--ep-comm-overlap" if plan["ep_comm_overlap"] else "--no-ep-comm-overlap"]


@pytest.fixture(scope="module")
def free(cli_once):
    r = cli_once("search", *AXES, "--json")
    assert r.code == 0, r.err
    return r.json()


def test_the_free_winner_runs_on_the_share_with_the_overlap(free):
    """The case this file is about: the free winner uses the power-of-two share and a switch (the EP overlap)
    that acts only with ep > 1; were it not so, the test below would not test the share."""
    plan = free["plans"][0]["plan"]
    assert free["domain"]["used_per_domain"] == 64 and free["gpus"] == 64
    assert plan["ep"] > 1 and 72 % plan["ep"] and plan["ep_comm_overlap"]


def test_pinning_the_free_winners_switches_returns_its_plan(free, cli_once):
    first = free["plans"][0]
    r = cli_once("search", *AXES, *flags(first["plan"]), "--json")
    assert r.code == 0, r.err  # was: "--ep-comm-overlap: none of the 15 plans left by the rules can use it"
    got = r.json()
    assert got["plans"][0]["plan"] == first["plan"]
    assert got["plans"][0]["throughput"]["tokens_per_s"] == pytest.approx(first["throughput"]["tokens_per_s"],
                                                                          rel=1e-9)
    assert got["gpus"] == free["gpus"] and got["domain"]["used_per_domain"] == 64
    assert got["domain"]["tried"][-1] == {"per_domain": 72, "gpus": 72, "tokens_per_s": 0.0}  # refused there


def test_a_pin_no_share_mends_is_still_refused_with_its_rule(cli):
    """--ep 1 leaves no plan that all-to-alls on either share: the refusal names the overlap and the rule."""
    r = cli("search", *AXES, "--ep", "1", "--ep-comm-overlap")
    assert r.code == 2 and "Traceback" not in r.err
    assert "--ep-comm-overlap" in r.err and "ep 1" in r.err


def test_the_domain_line_says_no_plan_where_a_share_had_none():
    from llmplan.report.search import domain_line
    from llmplan.search.run import DomainChoice
    d = DomainChoice(full=72, used=64, gpus={72: 72, 64: 64}, tokens_per_s={72: 0.0, 64: 1.5e6})
    line = domain_line(d)
    assert "(64 GPUs, 1,500,000 tok/s) beats 72 of 72 (72 GPUs, no plan)" in line


def test_axes_no_full_rack_plan_can_take_search_the_share(cli_once):
    """tp, pp and cp 1 pinned on one 72-GPU rack leave dp 72, which divides no power-of-two global batch: every
    plan on the full domain breaks global_batch, while the free search's own 64-GPU share runs. It exited 2
    ("no plan passes the rules") although the share the search tries holds plans; its domain object says the
    full domain had none."""
    r = cli_once("search", "--model", "gpt-oss-20b", "--hardware", "gb200-nvl72", "--nodes", "18",
                 "--global-batch", "256", "--seq-len", "4096", "--tp", "1", "--pp", "1", "--cp", "1", "--no-sp",
                 "--recompute", "none", "--top", "1", "--json")
    assert r.code == 0, r.err
    d = r.json()
    assert d["gpus"] == 64 and d["plans"][0]["plan"]["ep"] > 1
    assert d["domain"]["used_per_domain"] == 64
    assert {"per_domain": 72, "gpus": 72, "tokens_per_s": 0.0} in d["domain"]["tried"]


def test_a_refusal_on_both_shares_quotes_the_plans_of_both(cli):
    """--tp 1 --no-sp leave no plan --tp-comm-overlap acts in, on the full racks or on the 64-GPU share, which
    was searched too: the refusal quotes both counts (it quoted the full racks' alone)."""
    r = cli("search", *AXES, "--tp-comm-overlap")
    assert r.code == 2 and "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1, r.err
    assert "--tp-comm-overlap: none of the plans left by the rules can use it (" in r.err, r.err
    assert " on 72 GPUs of each NVLink domain, " in r.err and " on 64 of each)" in r.err, r.err
    assert "tp 1 and sp off" in r.err


def test_a_refusal_where_only_the_full_racks_were_searched_quotes_their_count(cli):
    """--ep 1 leaves the share nothing the full rack cannot hold, so only the full racks are searched: one count."""
    r = cli("search", *AXES, "--ep", "1", "--ep-comm-overlap")
    assert r.code == 2 and "Traceback" not in r.err, r.err
    assert re.search(r"--ep-comm-overlap: none of the [0-9,]+ plans left by the rules can use it: ", r.err), r.err
    assert "of each" not in r.err
