"""serve-edges: a pinned --ep that no layout of the serving search takes (check_serve_plan's EP rules on every
layout: ep_experts, ep_serve, ep_serve_engine) is refused in one line, exit 2, naming the value, the rule and the
EP degrees some layout takes on those GPUs (search.serve.pinned_ep_refusal). It was exit 3 with a bare "no
serving plan ... fits" line (over pools, only the rule's name). A pinned --ep that a layout takes but that fits
nowhere stays exit 3 (memory, SLOs)."""

from __future__ import annotations

from pathlib import Path

import pytest

MIXTRAL = ("search", "--mode", "infer", "--model", "mixtral-8x7b", "--hardware", "dgx-h100", "--nodes", "1")


@pytest.mark.parametrize("ep, rule", [(3, "ep_experts"), (16, "ep_serve")])
def test_an_ep_no_layout_takes_is_one_line_with_the_rule_and_the_valid_choices(cli, ep, rule):
    r = cli(*MIXTRAL, "--ep", ep)
    assert r.code == 2 and r.out == "", (r.code, r.err)
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.err
    # mixtral: 8 experts, 8 GPUs: EP 1, 2, 4, 8 divide the experts and fit tp x replicas (by hand)
    assert lines[0].startswith(f"error: --ep {ep}: no serving layout of mixtral-8x7b on 8 GPUs takes it"), lines[0]
    assert f"(rule {rule})" in lines[0] and "pin one of --ep 1, 2, 4, 8 on these GPUs" in lines[0], lines[0]


def test_the_refusal_reads_the_same_as_a_json_error_document(cli):
    r = cli(*MIXTRAL, "--ep", "3", "--json")
    assert r.code == 2
    doc = r.json()
    assert doc["error"]["code"] == 2 and doc["error"]["message"].startswith("--ep 3: no serving layout")


def test_redundant_experts_widen_the_valid_choices(cli):
    """DeepSeek-V3's 256 experts plus 32 redundant ones (288) on 4 DGX H100 under SGLang: ep 24 above tp breaks
    ep_serve_engine on every layout the search tries (24 GPUs is no wide-EP group size: 2, 4, 8, 16, 32), and the valid
    choices are the divisors of 288 up to 32 a layout takes (by hand: SGLang's EP degree divides tp, and tp is 1,
    2, 4 or 8 here, so 1, 2, 4, 8; and the wide-EP groups 16, 32; 3 and 6 divide 288 but no tp: serve-edges2)."""
    r = cli("search", "--mode", "infer", "--model", "deepseek-v3", "--hardware", "dgx-h100", "--nodes", "4",
            "--dtype", "fp8", "--engine", "sglang", "--redundant-experts", "32", "--ep", "24")
    assert r.code == 2, r.err
    assert "(rule ep_serve_engine)" in r.err and "groups of 2, 4, 8, 16, 32 GPUs" in r.err, r.err
    assert "pin one of --ep 1, 2, 4, 8, 16, 32 on these GPUs" in r.err, r.err


def test_an_ep_a_layout_takes_still_searches(cli):
    r = cli(*MIXTRAL, "--ep", "8", "--top", "1", "--json")
    assert r.code == 0, r.err
    assert r.json()["plans"][0]["plan"]["ep"] == 8


TWO = "pools:\n  - {system: dgx-h100, nodes: 1, name: h100}\n  - {system: dgx-a100, nodes: 1}\nfabric: {gb_per_s: 50}\n"


def test_over_pools_the_refusal_names_the_pools_when_none_takes_the_ep(cli, tmp_path: Path):
    f = tmp_path / "c.yaml"
    f.write_text(TWO)
    r = cli("search", "--mode", "infer", "--model", "mixtral-8x7b", "--hardware", f, "--ep", "16")
    assert r.code == 2 and r.out == "", r.err
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: pools h100, dgx-a100: --ep 16: no serving layout"), lines
    assert "(rule ep_serve)" in lines[0] and "pin one of --ep 1, 2, 4, 8" in lines[0]


def test_over_pools_one_pool_taking_the_ep_serves(cli, tmp_path: Path):
    """--ep 16 fits a pool of two DGX H100 nodes, not one of one node: the search serves on the first."""
    f = tmp_path / "c.yaml"
    f.write_text("pools:\n  - {system: dgx-h100, nodes: 2, name: big}\n  - {system: dgx-a100, nodes: 1, name: small}\n"
                 "fabric: {gb_per_s: 50}\n")
    r = cli("search", "--mode", "infer", "--model", "qwen3-30b-a3b", "--hardware", f, "--ep", "16", "--json")
    assert r.code == 0, r.err
    assert [(b["pool"], b["estimate"]["plan"]["ep"]) for b in r.json()["by_pool"]] == [("big", 16)]


@pytest.mark.parametrize("pins, shown", [(("--pp", "16"), "--pp 16: tp x pp (at least 1 x 16 = 16)"),
                                         (("--tp", "8", "--pp", "2"), "--tp 8 --pp 2: tp x pp (at least 8 x 2 = 16)")])
def test_pins_that_leave_no_layout_are_one_line_not_an_empty_search(cli, pins, shown):
    """Before: "evaluated 0 layouts", exit 3 and "see the pruned table" with no table."""
    r = cli(*MIXTRAL, *pins)
    assert r.code == 2 and r.out == "", r.err
    assert r.err.strip() == (f"error: {shown} exceeds the 8 GPUs of the budget: each serving replica of "
                             "mixtral-8x7b takes tp x pp GPUs; lower --tp / --pp so that tp x pp <= 8, or add GPUs")


def test_over_pools_pins_no_pool_can_hold_are_refused(cli, tmp_path: Path):
    f = tmp_path / "c.yaml"
    f.write_text(TWO)
    r = cli("search", "--mode", "infer", "--model", "mixtral-8x7b", "--hardware", f, "--tp", "16")
    assert r.code == 2 and "exceeds the 8 GPUs of the largest pool" in r.err, r.err
