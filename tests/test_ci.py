"""`llmplan check` / `llmplan lock` in a temporary repository of specs and locked plans: a harmful spec
change fails in every output format naming the plan, the spec field and the reason; a harmless one passes."""

from __future__ import annotations

import json
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def repo(tmp_path, cli):
    specs = tmp_path / "model_specs"
    specs.mkdir()
    text = (ROOT / "model_specs" / "llama-3.1-8b.yaml").read_text().replace("name: llama-3.1-8b", "name: team-8b")
    text = "\n".join(line for line in text.splitlines() if not line.startswith("declared_params"))
    (specs / "team-8b.yaml").write_text(text)
    r = cli("lock", specs, "--plans", tmp_path / "plans", "--hardware", "dgx-h100", "--nodes", "1",
            "--global-batch", "64", "--seq-len", "4096")
    assert r.code == 0, r.err + r.out
    git = lambda *a: subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True)  # noqa: E731
    git("init", "-q")
    git("-c", "user.email=t@t", "-c", "user.name=t", "add", ".")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "specs and locked plans")
    return tmp_path


def edit(repo: Path, old: str, new: str) -> Path:
    spec = repo / "model_specs" / "team-8b.yaml"
    spec.write_text(spec.read_text().replace(old, new))
    return spec


def test_locked_plan_passes_and_names_its_spec(repo, cli):
    plan = next((repo / "plans").glob("*.json"))
    doc = json.loads(plan.read_text())
    assert doc["model_ref"] == "../model_specs/team-8b.yaml" and doc["hardware_ref"] == "dgx-h100"
    r = cli("check", repo / "model_specs", "--plans", repo / "plans")
    assert r.code == 0, r.out
    assert "2 passed, 0 failed" in r.out


def test_harmless_change_passes(repo, cli):
    edit(repo, "source: ", "source: (reviewed) ")
    (repo / "model_specs" / "team-8b.yaml").write_text("# a comment\n" + (repo / "model_specs" / "team-8b.yaml").read_text())
    assert cli("check", repo / "model_specs", "--plans", repo / "plans").code == 0


def test_doubling_layers_fails_in_every_format(repo, cli):
    spec = edit(repo, "num_hidden_layers: 32", "num_hidden_layers: 64")
    line = next(i for i, l in enumerate(spec.read_text().splitlines(), 1) if l.startswith("num_hidden_layers"))
    args = ("check", repo / "model_specs", "--plans", repo / "plans")
    text = cli(*args)
    assert text.code == 1
    assert "FAIL" in text.out and "1 passed, 1 failed" in text.out

    js = cli(*args, "--format", "json")
    assert js.code == 1
    doc = js.json()
    bad = [c for c in doc["checks"] if not c["ok"]]
    assert doc["failed"] == 1 and bad[0]["field"] == "num_hidden_layers" and bad[0]["line"] == line
    assert bad[0]["file"].endswith("model_specs/team-8b.yaml")
    assert "regressed" in bad[0]["message"] or "no longer fits" in bad[0]["message"]
    assert "team-8b.dgx-h100.plan.json" in bad[0]["message"] and "num_hidden_layers 32 -> 64" in bad[0]["message"]

    gh = cli(*args, "--format", "github")
    assert gh.code == 1
    ann = [l for l in gh.out.splitlines() if l.startswith("::error")]
    assert len(ann) == 1 and f"model_specs/team-8b.yaml,line={line}" in ann[0]
    assert "team-8b.dgx-h100.plan.json" in ann[0]

    ju = cli(*args, "--format", "junit")
    assert ju.code == 1
    suite = ET.fromstring(ju.out).find("testsuite")
    assert suite.get("failures") == "1" and int(suite.get("tests")) == 2
    failure = suite.find("testcase/failure")
    assert "num_hidden_layers" in failure.text


def test_json_is_format_json(repo, cli):
    """README: every command takes --json. check's --json prints what --format json prints, byte for byte (a
    failing check, exit 1, and a passing one, exit 0); --format json still works; --json with another --format is
    one clear error (exit 2)."""
    args = ("check", repo / "model_specs", "--plans", repo / "plans")
    ok_fmt, ok_json = cli(*args, "--format", "json"), cli(*args, "--json")
    assert ok_fmt.code == ok_json.code == 0 and ok_json.out == ok_fmt.out and ok_json.json()["failed"] == 0
    assert cli(*args, "--json", "--format", "json").out == ok_fmt.out
    edit(repo, "num_hidden_layers: 32", "num_hidden_layers: 64")
    bad_fmt, bad_json = cli(*args, "--format", "json"), cli(*args, "--json")
    assert bad_fmt.code == bad_json.code == 1 and bad_json.out == bad_fmt.out and bad_json.json()["failed"] == 1
    both = cli(*args, "--json", "--format", "github")
    assert both.code == 2 and "--json with --format github" in both.err and "Traceback" not in both.err


def test_rule_break_is_reported(repo, cli):
    edit(repo, "num_hidden_layers: 32", "num_hidden_layers: 31")  # the locked pp no longer divides, or heads rule
    plan = next((repo / "plans").glob("*.json"))
    doc = json.loads(plan.read_text())
    doc["plan"]["pp"] = 2
    doc["plan"]["dp"] = doc["plan"]["dp"] // 2 or 1
    plan.write_text(json.dumps(doc))
    r = cli("check", "--plans", repo / "plans", "--format", "json")
    assert r.code == 1
    msg = [c for c in r.json()["checks"] if not c["ok"]][0]["message"]
    assert "breaks its rules" in msg and "pp (2) does not divide num_hidden_layers (31)" in msg


def test_diff_against_base(repo, cli):
    edit(repo, "num_hidden_layers: 32", "num_hidden_layers: 40")
    r = cli("check", repo / "model_specs", "--plans", repo / "plans", "--base", "HEAD", "--format", "json")
    d = r.json()["diff"][0]
    assert d["fields"]["num_hidden_layers"] == [32, 40]
    assert d["params"][1] > d["params"][0]
    row = d["plans"][0]
    assert row["now"]["step_s"] > row["base"]["step_s"]
    r = cli("check", repo / "model_specs", "--base", "no-such-rev")
    assert r.code == 2 and "--base no-such-rev is not a git revision" in r.err


def test_missing_model_and_corrupt_plan_are_failed_checks(repo, cli):
    shutil.move(repo / "model_specs" / "team-8b.yaml", repo / "gone.yaml")
    (repo / "plans" / "broken.json").write_text("{not json")
    r = cli("check", "--plans", repo / "plans", "--format", "json")
    assert r.code == 1 and "Traceback" not in r.err
    messages = " | ".join(c["message"] for c in r.json()["checks"])
    assert "no longer exists" in messages and "not valid JSON" in messages


def test_invalid_spec_points_at_field(tmp_path, cli):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nhidden_size: 64\nintermediate_size: -1\nnum_hidden_layers: 2\n"
                   "num_attention_heads: 4\nvocab_size: 100\nmax_position_embeddings: 128\n")
    r = cli("check", bad, "--format", "github")
    assert r.code == 1 and f"file={bad},line=3" in r.out and "intermediate_size" in r.out
    assert cli("check").code == 2


def test_declared_parameter_count_is_checked(tmp_path, cli):
    text = (ROOT / "model_specs" / "llama-3.1-8b.yaml").read_text().replace("num_hidden_layers: 32",
                                                                           "num_hidden_layers: 40")
    spec = tmp_path / "grown.yaml"
    spec.write_text(text)
    r = cli("check", spec, "--format", "json")
    assert r.code == 1
    c = r.json()["checks"][0]
    assert c["field"] == "declared_params" and "differ from declared_params" in c["message"]


def test_shipped_specs_pass(cli):
    r = cli("check", ROOT / "model_specs", ROOT / "hardware_profiles", "--format", "json")
    assert r.code == 0 and r.json()["failed"] == 0 and r.json()["passed"] >= 43


def test_plan_with_its_own_axis_order_checks_clean(cli, tmp_path):
    # Issue 11: check re-evaluates with the plan's axis order; an unchanged plan saved with a non-default
    # placement used to fail as a 25% step-time regression.
    plan = tmp_path / "p.json"
    r = cli("estimate", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--nodes", "4", "--tp", "8",
            "--zero", "3", "--global-batch", "1024", "--seq-len", "4096", "--axis-order", "pp-dp-ep-cp-tp",
            "--save", plan)
    assert r.code == 0, r.err
    r = cli("check", plan, "--format", "json")
    assert r.code == 0, r.out
    assert json.loads(plan.read_text())["axis_order"] == "pp-dp-ep-cp-tp"


def test_uneven_plan_is_recorded_and_rechecked(cli, tmp_path):
    plan = tmp_path / "p.json"
    assert cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1", "--gpus-per-node",
               "3", "--pp", "3", "--pp-layers", "10,11,11", "--global-batch", "24", "--save", plan).code == 0
    assert json.loads(plan.read_text())["plan"]["pp_layers"] == [10, 11, 11]
    assert cli("check", plan).code == 0
    doc = json.loads(plan.read_text())
    doc["plan"]["pp_layers"] = [10, 10, 11]
    plan.write_text(json.dumps(doc))
    r = cli("check", plan, "--format", "json")
    assert r.code == 1 and "must sum to num_hidden_layers (32)" in r.out


def test_check_says_does_not_fit_when_nothing_changed(cli, tmp_path):
    plan = tmp_path / "p.json"
    assert cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1", "--global-batch",
               "8", "--save", plan).code == 0
    r = cli("check", plan, "--min-headroom", "200", "--format", "json")
    assert r.code == 1 and "does not fit with 200" in r.out and "no longer" not in r.out


def test_plans_takes_one_plan_file(repo, cli):
    # issue 39: `check --plans FILE` said "not a folder"; one plan file is checked as the folder's would be.
    plan = next((repo / "plans").glob("*.json"))
    r = cli("check", "--plans", plan, "--format", "json")
    assert r.code == 0, r.err + r.out
    doc = r.json()
    assert doc["passed"] == 1 and doc["failed"] == 0 and doc["checks"][0]["name"] == f"plan {plan.name}"
    edit(repo, "num_hidden_layers: 32", "num_hidden_layers: 64")
    assert cli("check", "--plans", plan).code == 1
    r = cli("check", "--plans", repo / "nowhere.json")
    assert r.code == 2 and "does not exist" in r.err


def test_annotation_paths_are_normalised_from_the_checkout(repo, cli, monkeypatch):
    # issue 39: a plan's model_ref "../model_specs/team-8b.yaml", read from plans/, printed as
    # "plans/../model_specs/team-8b.yaml"; GitHub wants the path from the checkout root, where CI runs.
    spec = edit(repo, "num_hidden_layers: 32", "num_hidden_layers: 64")
    line = next(i for i, l in enumerate(spec.read_text().splitlines(), 1) if l.startswith("num_hidden_layers"))
    monkeypatch.chdir(repo)
    gh = cli("check", "model_specs", "--plans", "plans", "--format", "github")
    assert gh.code == 1
    ann = [l for l in gh.out.splitlines() if l.startswith("::error")]
    assert len(ann) == 1 and ann[0].startswith(f"::error file=model_specs/team-8b.yaml,line={line},"), ann
    js = cli("check", "model_specs", "--plans", "plans", "--format", "json").json()
    assert {c["file"] for c in js["checks"]} == {"model_specs/team-8b.yaml"}
    # an absolute path inside the working directory is shown from it too; one outside keeps its full path
    js = cli("check", repo / "model_specs", "--plans", repo / "plans", "--format", "json").json()
    assert {c["file"] for c in js["checks"]} == {"model_specs/team-8b.yaml"}
    monkeypatch.chdir(repo / "plans")
    js = cli("check", repo / "model_specs", "--format", "json").json()
    assert js["checks"][0]["file"] == str(repo / "model_specs" / "team-8b.yaml")
