"""`search --target NAME` keeps only the plans `export --to NAME` writes (cli.target over export.refusal)."""

from __future__ import annotations

import json

import pytest

LLAMA = ["search", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--nodes", "8"]
NEMOTRON = ["search", "--model", "nemotron-3-super", "--hardware", "gb200-nvl72", "--nodes", "8"]


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
    if top["zero"] == 3:  # the untargeted #1 (ZeRO-3, issue text) is one megatron refuses: dropped, counted
        assert doc["not_exportable"] >= 1 and doc["plans"][0]["plan"]["zero"] != 3


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
