"""The MoE serving options in the serving commands (docs/validation.md#sglang-cut, #serve-edges): the serving
search over a cluster file of several pools applies them to each pool's layouts as the one-system search does
(it refused them before serve-edges), and a bad --moe-dispatcher value reads the same under `estimate --mode
infer` and the serving searches."""

from __future__ import annotations

from pathlib import Path

import pytest

TWO = "pools:\n  - {system: dgx-h100, nodes: 1, name: h100}\n  - {system: dgx-a100, nodes: 1}\nfabric: {gb_per_s: 50}\n"
BASE = ("search", "--mode", "infer", "--model", "qwen3-30b-a3b", "--tpot-slo", "0.05", "--ttft-slo", "2")


MOE_KEYS = ("tp", "pp", "dp", "ep", "dp_attention", "moe_dispatcher", "two_batch_overlap", "redundant_experts")


@pytest.mark.parametrize("extra", [("--two-batch-overlap", "--ep", "8"), ("--moe-dispatcher", "alltoall"),
                                   ("--no-dp-attention",), ("--dp-attention",)])
def test_moe_serving_options_over_several_pools_are_applied_per_pool_as_on_one_system(cli, tmp_path: Path, extra):
    """serve-edges: the search over pools hands the MoE serving options to each pool's search (it refused them
    before): each pool's chosen plan is the plan the one-system search of that pool's system chooses with the
    same options, and carries them in the JSON."""
    f = tmp_path / "c.yaml"
    f.write_text(TWO)
    r = cli(*BASE, "--hardware", f, *extra, "--json")
    assert r.code == 0, r.err
    by_pool = {b["pool"]: b["estimate"]["plan"] for b in r.json()["by_pool"]}
    assert set(by_pool) == {"h100", "dgx-a100"}
    for pool, system in (("h100", "dgx-h100"), ("dgx-a100", "dgx-a100")):
        alone = cli(*BASE, "--hardware", system, "--nodes", "1", *extra, "--top", "1", "--json")
        assert alone.code == 0, alone.err
        want = alone.json()["plans"][0]["plan"]
        assert {k: by_pool[pool][k] for k in MOE_KEYS} == {k: want[k] for k in MOE_KEYS}, pool
    plans = list(by_pool.values())
    if "--two-batch-overlap" in extra:
        assert all(p["two_batch_overlap"] and p["ep"] == 8 for p in plans)
    if extra == ("--moe-dispatcher", "alltoall"):  # the wide-EP layouts taken off DeepEP: none runs it
        assert all(p["moe_dispatcher"] == "alltoall" for p in plans)
    if extra[0].endswith("dp-attention"):
        assert all(p["dp_attention"] is (extra[0] == "--dp-attention") for p in plans)


def test_moe_serving_options_over_several_pools_disaggregated_reach_every_instance(cli, tmp_path: Path):
    f = tmp_path / "c.yaml"
    f.write_text(TWO)
    r = cli(*BASE, "--hardware", f, "--disaggregated", "--moe-dispatcher", "deepep", "--no-dp-attention",
            "--top", "50", "--json")
    assert r.code == 0, r.err
    phases = [x[ph] for x in r.json()["plans"] for ph in ("prefill", "decode")]
    assert phases and not any(p["dp_attention"] for p in phases)
    assert any(p["ep"] > 1 for p in phases)
    assert all(p["moe_dispatcher"] == ("deepep" if p["ep"] > 1 else "alltoall") for p in phases)


def test_a_moe_option_over_pools_is_checked_as_on_one_system(cli, tmp_path: Path):
    """The options are checked as the one-system search checks them: --moe-dispatcher deepep with --ep 1
    pinned leaves no layout with EP (check_serve_plan's moe_serving_needs_ep), one line, exit 2."""
    f = tmp_path / "c.yaml"
    f.write_text(TWO)
    r = cli(*BASE, "--hardware", f, "--moe-dispatcher", "deepep", "--ep", "1")
    one = cli(*BASE, "--hardware", "dgx-h100", "--nodes", "1", "--moe-dispatcher", "deepep", "--ep", "1")
    assert r.code == one.code == 2 and r.out == ""
    assert r.err == one.err and len(r.err.strip().splitlines()) == 1, r.err


WANT = ("error: serving plan options: --moe-dispatcher foo: it must be one of alltoall, deepep; give --moe-dispatcher "
        "with one of them")
PLAN = ("--mode", "infer", "--model", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--engine", "sglang")


@pytest.mark.parametrize("command", [("estimate", "--tp", "8", "--ep", "8", "--batch", "8"), ("search",),
                                     ("search", "--disaggregated")])
def test_a_bad_dispatcher_reads_the_same_in_estimate_and_search(cli, command):
    r = cli(command[0], *PLAN, *command[1:], "--moe-dispatcher", "foo")
    assert r.code == 2
    assert [ln for ln in r.err.strip().splitlines() if not ln.startswith("warning")] == [WANT]


def test_over_pools_phase_gets_estimates_own_line(cli, tmp_path: Path):
    """Stop 61 review: --phase gets estimate's own line over pools (the search chooses the phases)."""
    f = tmp_path / "c.yaml"
    f.write_text(TWO)
    ph = cli(*BASE, "--hardware", f, "--phase", "prefill")
    assert ph.code == 2 and "the search chooses the phases" in ph.err and "MoE" not in ph.err, ph.err


@pytest.mark.parametrize("bad", [("--dtype", "fp9"), ("--kv-dtype", "fp9")])
def test_a_bad_dtype_reads_the_same_in_every_serving_search(cli, tmp_path: Path, bad):
    f = tmp_path / "c.yaml"
    f.write_text(TWO)
    runs = [cli("search", *PLAN, *bad), cli("search", *PLAN, "--disaggregated", *bad),
            cli(*BASE, "--hardware", f, *bad)]
    assert [r.code for r in runs] == [2, 2, 2]
    assert all(f"serving plan options: {bad[0]} fp9" in r.err for r in runs), [r.err for r in runs]


def test_disaggregated_search_on_one_system_refuses_pins_as_over_pools(cli):
    r = cli("search", *PLAN, "--disaggregated", "--tp", "2")
    assert r.code == 2 and "drop the pins" in r.err, r.err
