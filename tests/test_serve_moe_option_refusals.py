"""The MoE serving options where a serving command cannot or does not take them (docs/validation.md#sglang-cut):
the serving search over a cluster file of several pools prices every pool with the default MoE deployment
(search.hetero_serve passes none), so a MoE serving option given there is refused in one line (exit 2), not
ignored; and a bad --moe-dispatcher value reads the same under `estimate --mode infer` and the serving searches."""

from __future__ import annotations

from pathlib import Path

import pytest

TWO = "pools:\n  - {system: dgx-h100, nodes: 1, name: h100}\n  - {system: dgx-a100, nodes: 1}\nfabric: {gb_per_s: 50}\n"
BASE = ("search", "--mode", "infer", "--model", "qwen3-30b-a3b", "--tpot-slo", "0.05", "--ttft-slo", "2")


@pytest.mark.parametrize("extra", [("--two-batch-overlap",), ("--moe-dispatcher", "deepep"),
                                   ("--redundant-experts", "8", "--disaggregated")])
def test_moe_serving_options_over_several_pools_are_refused(cli, tmp_path: Path, extra):
    f = tmp_path / "c.yaml"
    f.write_text(TWO)
    r = cli(*BASE, "--hardware", f, *extra)
    assert r.code == 2 and r.out == ""
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.err
    assert extra[0] in lines[0] and "several pools" in lines[0] and "drop" in lines[0]


WANT = "error: serving plan options: --moe-dispatcher foo: Input should be 'alltoall' or 'deepep'"
PLAN = ("--mode", "infer", "--model", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--engine", "sglang")


@pytest.mark.parametrize("command", [("estimate", "--tp", "8", "--ep", "8", "--batch", "8"), ("search",),
                                     ("search", "--disaggregated")])
def test_a_bad_dispatcher_reads_the_same_in_estimate_and_search(cli, command):
    r = cli(command[0], *PLAN, *command[1:], "--moe-dispatcher", "foo")
    assert r.code == 2
    assert [ln for ln in r.err.strip().splitlines() if not ln.startswith("warning")] == [WANT]


def test_over_pools_only_what_asks_for_something_is_refused_and_named_as_typed(cli, tmp_path: Path):
    """Stop 61 review: the default dispatcher asks for nothing (accepted, as on one system), --no-dp-attention is
    named as typed, and --phase gets estimate's own line (the search chooses the phases)."""
    f = tmp_path / "c.yaml"
    f.write_text(TWO)
    ok = cli(*BASE, "--hardware", f, "--moe-dispatcher", "alltoall", "--top", "1")
    assert ok.code in (0, 3) and "several pools" not in ok.err, ok.err
    no = cli(*BASE, "--hardware", f, "--no-dp-attention")
    assert no.code == 2 and "--no-dp-attention with" in no.err, no.err
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
