"""A plan over several pools saved by `search --save` pins its assignment (pools.plan: which pool holds which
pipeline stages or data-parallel replicas): `estimate --plan`, `export` and `check` price and write that
assignment, never a re-derived one, and a hand-edited assignment the cluster cannot hold is one line, exit 2.

Before: `estimate --plan` did not exist, and re-typing the saved plan for the file's own `hardware` and `nodes`
(the slowest pool's system over every GPU) priced a 64-GPU A100 cluster, 221.9 s per step against the 81.5 s
the search ranked; `export` wrote a single-system `8 x dgx-a100` script for stage_pools [0, 0, 0, 0] (64 GPUs
on a 32-GPU pool) and stopped with an internal IndexError for a pool index past the cluster's pools."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_cli

CLUSTER = "pools:\n  - {system: dgx-h100, nodes: 4}\n  - {system: dgx-a100, nodes: 4}\nfabric: {gb_per_s: 50}\n"
"""The mixed cluster of tests/test_hetero.py: 32 H100 and 32 A100 GPUs."""


def close(a: float, b: float) -> bool:
    return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)


def _search(folder: Path, *pins: str) -> tuple[dict, Path]:
    """`llmplan search --json --save` of Llama-3.1-70B on CLUSTER, run as a command through the real entry point
    (in-process: the saved file and the ranked row are the tests' input; the child-process run is
    test_estimate_plan_as_a_subprocess_prints_the_pinned_pools): the ranked row that was saved (#1) and the file."""
    (folder / "cluster.yaml").write_text(CLUSTER)
    path = folder / "plan.json"
    r = run_cli("search", "--model", "llama-3.1-70b", "--hardware", folder / "cluster.yaml", *pins, "--save", path,
                "--json")
    assert r.code == 0, r.err
    return r.json()["plans"][0], path


@pytest.fixture(scope="module")
def stages(tmp_path_factory):
    """TP8 x PP8 needs all 64 GPUs: only pipelines over both pools rank (test_hetero.saved_plan)."""
    row, path = _search(tmp_path_factory.mktemp("stages"), "--tp", "8", "--pp", "8")
    assert row["pools"]["assignment"] == "stages" and set(row["pools"]["stage_pools"]) == {0, 1}, row["pools"]
    return row, path


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    """PP1: no pipeline spreads over pools; replicas over both rank first (test_hetero.saved_replicas_plan)."""
    row, path = _search(tmp_path_factory.mktemp("replicas"), "--pp", "1")
    assert row["pools"]["assignment"] == "replicas", row["pools"]
    return row, path


@pytest.mark.parametrize("which", ["stages", "replicas"])
def test_estimate_of_the_saved_plan_is_the_search_row(cli, stages, replicas, which):
    """search --save -> estimate --plan: the step time, memory, throughput and the pools' assignment of the
    row the search ranked first, to 1e-9 (one cost model, so any difference is a re-derived assignment)."""
    row, path = {"stages": stages, "replicas": replicas}[which]
    r = cli("estimate", "--plan", path, "--json")
    assert r.code == 0, r.err
    got = r.json()
    assert close(got["time"]["step_s"], row["time"]["step_s"])
    assert close(got["memory"]["total"], row["memory"]["total"])
    assert close(got["throughput"]["tokens_per_s"], row["throughput"]["tokens_per_s"])
    for key in ("assignment", "stage_pools", "replica_pools", "replica_batches"):
        assert got["pools"][key] == row["pools"][key], key
    assert [(u["name"], u["stages"], u["stage_layers"], u["replicas"], u["global_batch"])
            for u in got["pools"]["by_pool"]] == [(u["name"], u["stages"], u["stage_layers"], u["replicas"],
                                                  u["global_batch"]) for u in row["pools"]["by_pool"]]


def test_estimate_plan_as_a_subprocess_prints_the_pinned_pools(stages):
    """The real command in its own process: the table view names the pinned stages of each pool and the
    search row's step time."""
    row, path = stages
    r = subprocess.run([sys.executable, "-m", "llmplan", "estimate", "--plan", str(path)], capture_output=True,
                       text=True, env={**os.environ, "COLUMNS": "80"}, check=False)
    assert r.returncode == 0, r.stderr
    assert "as pinned in the plan file" in r.stdout
    for u in row["pools"]["by_pool"]:
        assert f"{u['name']} s{u['stages'][0]}-{u['stages'][-1]}" in r.stdout.replace("\n", " ")
    assert f"{row['time']['step_s']:.4f}" in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) <= 80


@pytest.mark.parametrize("which", ["stages", "replicas"])
def test_estimate_plan_header_names_each_pool_not_one_combined_cluster(cli, stages, replicas, which):
    """The table view's header named the combined estimate's cluster, 'llama-3.1-70b on 8 x dgx-a100 (64 x
    a100-80gb)': the slowest pool's system at the plan's GPU count, hardware no pool is. It names each pool
    the plan runs on, with its nodes and GPUs as CLUSTER gives them, within 80 columns."""
    row, path = {"stages": stages, "replicas": replicas}[which]
    r = cli("estimate", "--plan", path)
    assert r.code == 0, r.err
    text = " ".join(r.out.split())
    assert "x dgx-a100 (64 x a100-80gb)" not in text and "(64 x" not in text
    if which == "stages":  # TP8 x PP8: all 64 GPUs, both pools whole
        assert ("llama-3.1-70b on pool dgx-h100: 4 x dgx-h100 (32 x h100-sxm), pool dgx-a100: 4 x dgx-a100 "
                "(32 x a100-80gb) tp 8 pp 8") in text
    else:
        gpus = {u["name"]: u["gpus"] for u in row["pools"]["by_pool"]}
        assert set(gpus) == {"dgx-h100", "dgx-a100"}
        assert (f"llama-3.1-70b on pool dgx-h100: {gpus['dgx-h100'] // 8} x dgx-h100 ({gpus['dgx-h100']} x "
                f"h100-sxm), pool dgx-a100: {gpus['dgx-a100'] // 8} x dgx-a100 ({gpus['dgx-a100']} x a100-80gb)"
                ) in text
    assert max(len(line) for line in r.out.splitlines()) <= 80


def test_export_writes_the_stage_to_pool_mapping_of_the_search_row(cli, stages, tmp_path: Path):
    row, path = stages
    r = cli("export", path, "--to", "megatron", "-o", tmp_path)
    assert r.code == 0, r.err
    rows = [line.split(",") for line in (tmp_path / "pool_ranks.csv").read_text().splitlines()[1:]]
    got = {name: (stage_range, layers) for name, _, _, _, _, _, _, stage_range, layers in rows}
    want = {u["name"]: (f"{u['stages'][0]}-{u['stages'][-1]}", "+".join(str(x) for x in u["stage_layers"]))
            for u in row["pools"]["by_pool"]}
    assert got == want
    script = (tmp_path / "megatron_pretrain.sh").read_text()
    assert "--pipeline-model-parallel-layout" in script and "8 x dgx-a100 = 64" not in script
    # the layers come from the plan's layout, not from predictions saved beside it (stale after an edit)
    stale = _edited(path, tmp_path,
                    lambda d: d["predictions"].update(stage_layers=d["predictions"]["stage_layers"][::-1]))
    r = cli("export", stale, "--to", "megatron", "-o", tmp_path / "stale")
    assert r.code == 0, r.err
    assert (tmp_path / "stale" / "pool_ranks.csv").read_text() == (tmp_path / "pool_ranks.csv").read_text()


def _edited(path: Path, folder: Path, edit) -> Path:
    doc = json.loads(path.read_text())
    edit(doc)
    out = folder / "edited.json"
    out.write_text(json.dumps(doc))
    return out


def _set(*keys_value):
    *keys, value = keys_value

    def edit(doc):
        d = doc
        for k in keys[:-1]:
            d = d[k]
        d[keys[-1]] = value
    return edit


BAD = [
    ("index", _set("pools", "plan", "stage_pools", [2] * 4 + [0] * 4), "stage_pools [2, 2, 2, 2, 0",
     "pool_index", "the cluster has 2 pools"),
    ("one pool", _set("pools", "plan", "stage_pools", [0] * 8), "stage_pools [0, 0, 0, 0, 0",
     "pool_gpus", "64 GPUs on pool dgx-h100, which has 32"),
    ("interleaved", _set("pools", "plan", "stage_pools", [1, 0] * 4), "stage_pools [1, 0, 1, 0",
     "pool_stages_consecutive", "must be consecutive"),
    ("shrunk pool", lambda d: d["pools"]["cluster"]["pools"][0].update(nodes=1), "stage_pools [",
     "pool_gpus", "which has 8 (1 x 8)"),
]


@pytest.mark.parametrize("name,edit,values,rule,why", BAD, ids=[b[0] for b in BAD])
@pytest.mark.parametrize("command", ["estimate", "export"])
def test_a_bad_pinned_assignment_exits_2_in_one_line(cli, stages, tmp_path: Path, name, edit, values, rule, why,
                                                    command):
    """What is wrong (pools.plan and its values), the rule, and the fix; nothing written."""
    _, path = stages
    f = _edited(path, tmp_path, edit)
    args = ("estimate", "--plan", f) if command == "estimate" else ("export", f, "--to", "megatron", "-o",
                                                                     tmp_path / "out")
    line = cli(*args).refusal()
    assert "pools.plan" in line and values in line and rule in line and why in line, line
    assert "re-create the plan with `llmplan search" in line
    assert not (tmp_path / "out").exists()


def test_a_plan_pinned_on_one_pool_must_be_the_files_hardware(cli, stages, tmp_path: Path):
    """Every stage on the (grown) H100 pool while the file's hardware is the A100 snapshot: refused rather
    than priced or exported on the A100 system the top-level keys name."""
    _, path = stages

    def edit(doc):
        doc["pools"]["cluster"]["pools"][0]["nodes"] = 8
        doc["pools"]["plan"]["stage_pools"] = [0] * 8
    f = _edited(path, tmp_path, edit)
    assert json.loads(f.read_text())["hardware"]["name"] == "dgx-a100"
    for args in (("estimate", "--plan", f), ("export", f, "--to", "megatron", "-o", tmp_path / "out")):
        line = cli(*args).refusal()
        assert "puts the whole plan (64 GPUs) on pool dgx-h100" in line and "8 x dgx-a100" in line, line
    assert not (tmp_path / "out").exists()


def test_estimate_plan_of_a_plan_file_of_one_system(cli, tmp_path: Path):
    """A plan file without pools (estimate --save, as older files) is priced as before: its saved step."""
    f = tmp_path / "one.json"
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--tp", "2", "--save", f, "--json")
    assert r.code == 0, r.err
    want = r.json()
    got = cli("estimate", "--plan", f, "--json")
    assert got.code == 0, got.err
    assert "pools" not in json.loads(f.read_text())
    assert close(got.json()["time"]["step_s"], want["time"]["step_s"])
    assert close(got.json()["memory"]["total"], want["memory"]["total"])


def test_estimate_plan_refuses_flags_that_would_change_the_saved_plan(cli, stages):
    _, path = stages
    line = cli("estimate", "--plan", path, "--tp", "4").refusal()
    assert "--tp 4" in line and "prices the saved plan as saved" in line
    line = cli("estimate", "--plan", path, "--no-sp", "--zero", "1").refusal()
    assert "--no-sp, --zero 1 would change it; drop --no-sp, --zero 1" in line, line  # as written
    line = cli("estimate", "--tp", "4").refusal()
    assert "Missing option '--model', '--hardware'" in line and "--plan" in line
