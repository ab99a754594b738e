"""The flags `search` refuses over a cluster file of pools (cli.pools) and when comparing systems (cli.systems):
each through the real command, exit 2, one line that names the flag and the fix, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

TWO_POOLS = "pools:\n  - {system: dgx-h100, nodes: 4}\n  - {system: dgx-a100, nodes: 4}\nfabric: {gb_per_s: 50}\n"
SEARCH = ("search", "--model", "llama-3.1-8b")


def one_line(r) -> str:
    return r.refusal()


@pytest.mark.parametrize("extra,words", [
    (("--nodes", "2"), "drop --nodes"),
    (("--gpus-per-node", "4"), "drop --gpus-per-node"),
    (("--power-limit", "500"), "drop --power-limit"),
    (("--domain-gpus", "8"), "drop --domain-gpus"),
    (("--objective", "time-to-train"), "drop --objective"),
    (("--wide",), "drop --wide"),
    (("--explain",), "drop --explain"),
])
def test_search_over_pools_refuses_flags_it_does_not_read(cli, tmp_path: Path, extra, words):
    f = tmp_path / "cluster.yaml"
    f.write_text(TWO_POOLS)
    line = one_line(cli(*SEARCH, "--hardware", f, *extra))
    assert words in line, line


@pytest.mark.parametrize("extra,words", [
    (("--hardware", "dgx-h100,,dgx-a100"), "an empty system name"),
    (("--hardware", "dgx-h100,dgx-h100"), "dgx-h100 more than once"),
    (("--hardware", "dgx-h100,dgx-a100", "--objective", "headroom"), "--objective headroom is not an objective for comparing systems"),
    (("--hardware", "dgx-h100,dgx-a100", "--explain"), "--explain shows one system's search"),
    (("--hardware", "dgx-h100,dgx-a100", "--wide"), "--wide shows one system's search"),
    (("--hardware", "dgx-h100,dgx-a100", "--gpus-per-node", "4"), "--gpus-per-node 4 is one system's node shape"),
    (("--hardware", "dgx-h100,dgx-a100", "--budget-gpus", "16", "--nodes", "2"), "each size the cluster"),
    (("--hardware", "dgx-h100,dgx-a100", "--price", "dgx-h100"), "give SYSTEM=USD"),
    (("--hardware", "dgx-h100,dgx-a100", "--price", "dgx-h100=abc"), "not a number"),
    (("--hardware", "dgx-h100,dgx-a100", "--price", "dgx-h100=-1"), "finite number of US dollars"),
    (("--hardware", "dgx-h100,dgx-a100", "--price", "dgx-h100=1,dgx-h100=2"), "dgx-h100 twice"),
    (("--hardware", "dgx-h100,dgx-h200", "--budget-gpus", "16", "--objective", "cost"),
     "dgx-h200 cite(s) none in the profile"),
])
def test_system_comparison_refuses_bad_flags_in_one_line(cli, extra, words):
    line = one_line(cli(*SEARCH, *extra))
    assert words in line, line


def test_serving_search_refuses_several_systems(cli):
    line = one_line(cli(*SEARCH, "--mode", "infer", "--hardware", "dgx-h100,dgx-a100"))
    assert "comparing systems ranks training runs" in line, line


@pytest.mark.parametrize("extra,words", [
    (("--hardware", "dgx-h100", "--mode", "serve"), "--mode serve: it must be one of train, infer"),
    (("--hardware", "dgx-h100", "--objective", "fastest"), "--objective fastest: it must be one of throughput"),
    (("--hardware", "dgx-h100", "--mode", "infer", "--objective", "gpu-hours"),
     "--objective gpu-hours is not a serving objective: it must be one of throughput, min-gpus"),
    (("--hardware", "dgx-h100", "--recompute", "most"), "--recompute most: it must be one of"),
    (("--hardware", "dgx-h100", "--zero", "4"), "--zero 4: ZeRO stages are 0, 1, 2 and 3"),
    (("--hardware", "dgx-h100", "--account-for-embedding-in-pipeline-split"), "needs --pp"),
    (("--hardware", "dgx-h100", "--mode", "infer", "--disaggregated", "--save", "SAVE"),
     "--save with --disaggregated"),
])
def test_search_refuses_bad_options_in_one_line(cli, tmp_path: Path, extra, words):
    extra = tuple(str(tmp_path / "p.json") if x == "SAVE" else x for x in extra)
    line = one_line(cli(*SEARCH, *extra))
    assert words in line, line
    assert not (tmp_path / "p.json").exists()
