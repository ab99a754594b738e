"""A new user's bad inputs, each one line on stderr with what is wrong, the values, the rule and the fix, exit 2,
no traceback, and the same message as the --json error document (docs/validation.md#small-fixes). Each case is
one that used to answer without the fix (an empty file: "got NoneType" / "Expecting value"; a config.json with
neither model_type nor name: every spec field "Field required"; a missing --save folder; a file where -o wants a
folder; a missing plan file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "tests" / "data" / "plans" / "dense_train.json"


def one_line(cli, *args: str, needles: tuple[str, ...]):
    """The command refused: exit 2, one stderr line holding every needle; with --json, the error document on stdout
    carries the same line."""
    r = cli(*args)
    assert r.code == 2, (r.code, r.err, r.out[:300])
    assert "Traceback" not in r.err and "internal error" not in r.err
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    j = cli(*args, "--json")
    assert j.code == 2
    assert json.loads(j.out)["error"] == {"code": 2, "message": lines[0].removeprefix("error: ")}
    return lines[0]


@pytest.mark.parametrize("name", ["empty.json", "empty.yaml", "blank.yaml"])
@pytest.mark.parametrize("flag", ["--model", "--hardware", "--plan"])
def test_an_empty_file_says_it_is_empty_and_what_it_should_hold(cli, tmp_path, name, flag):
    p = tmp_path / name
    p.write_text("" if name.startswith("empty") else "\n  \n")
    args = {"--model": ["--model", p, "--hardware", "dgx-h100"], "--hardware": ["--model", "llama-3.1-8b",
                                                                             "--hardware", p], "--plan": ["--plan", p]}
    line = one_line(cli, "estimate", *args[flag], needles=(f"{p} is empty", "mapping of keys to values",
                                                           "fill it in or give another file"))
    assert "NoneType" not in line and "Expecting value" not in line


def test_export_of_an_empty_plan_file(cli, tmp_path):
    p = tmp_path / "plan.json"
    p.write_text("")
    one_line(cli, "export", p, "--to", "megatron", "-o", tmp_path / "out", needles=(f"{p} is empty",))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text, got", [("# a comment\n", "got nothing (comments only)"), ("[1, 2]\n", "got a list"),
                                       ("just words\n", "got a str")])
def test_a_file_that_is_no_mapping_names_what_it_holds(cli, tmp_path, text, got):
    p = tmp_path / "m.yaml"
    p.write_text(text)
    one_line(cli, "estimate", "--model", p, "--hardware", "dgx-h100",
             needles=("expected a mapping of keys to values at the top level", got, "`key: value`"))


def test_a_config_json_without_model_type_or_name_says_which_key_is_missing(cli, tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"hidden_size": 4096, "num_hidden_layers": 32}))
    line = one_line(cli, "estimate", "--model", p, "--hardware", "dgx-h100",
                    needles=("neither model_type", "nor name", '"model_type": "llama"'))
    assert "Field required" not in line
    # with model_type it is read as a Hugging Face config.json: the missing keys are then named
    p.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32}))
    r = cli("estimate", "--model", p, "--hardware", "dgx-h100")
    assert r.code == 2 and "neither model_type" not in r.err and "num_attention_heads" in r.err, r.err


def test_save_into_a_missing_folder_says_to_create_it(cli, tmp_path):
    target = tmp_path / "nodir" / "plan.json"
    one_line(cli, "estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--save", target,
             needles=(f"folder {target.parent} does not exist", f"mkdir -p {target.parent}"))
    assert not target.parent.exists()


def test_save_under_a_file_and_export_into_a_file(cli, tmp_path):
    f = tmp_path / "afile"
    f.write_text("keep")
    one_line(cli, "estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--save", f / "plan.json",
             needles=(f"{f} is a file, not a folder", "give a path inside a folder"))
    one_line(cli, "export", PLAN, "--to", "megatron", "-o", f,
             needles=(f"{f} is a file, not a folder", "give a folder (created if missing)"))
    assert f.read_text() == "keep"


def test_export_of_a_missing_plan_says_how_to_save_one(cli, tmp_path):
    missing = tmp_path / "nosuch.json"
    one_line(cli, "export", missing, "--to", "megatron", "-o", tmp_path / "out",
             needles=(f"plan file {missing} does not exist", "--save"))


def test_export_over_an_existing_file_needs_force_and_leaves_it(cli, tmp_path):
    out = tmp_path / "out"
    assert cli("export", PLAN, "--to", "megatron", "-o", out).code == 0
    written = sorted(out.iterdir())
    assert written
    for p in written:
        p.write_text("mine")
    one_line(cli, "export", PLAN, "--to", "megatron", "-o", out, needles=("already exist", "--force"))
    assert all(p.read_text() == "mine" for p in written)
    assert cli("export", PLAN, "--to", "megatron", "-o", out, "--force").code == 0
    assert all(p.read_text() != "mine" for p in written)


def test_check_of_a_missing_path_says_what_it_takes(cli, tmp_path):
    missing = tmp_path / "nosuch.yaml"
    r = cli("check", missing)
    assert r.code == 2 and "Traceback" not in r.err, r.err
    assert f"{missing} does not exist" in r.err and "existing spec, profile or plan files" in r.err, r.err
