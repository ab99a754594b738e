"""Bad inputs a hand sweep of the CLI found answered unclearly or not at all (docs/validation.md#tidy-67): a key
given twice with different values in YAML (refused: llmplan's own files; a JSON one is read with the last value,
as Python's json and Hugging Face transformers read it, with a warning), a control character in a
spec's name (echoed raw to the terminal), and json's error text cut at its trailing "at" (the place was lost).
Each: exit 2, one line naming the file and the fix, no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmplan.fileio import excerpt

HF = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
      "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192}


def one_line(r, code: int = 2) -> str:
    assert r.code == code, (r.code, r.err, r.out[:300])
    assert "Traceback" not in r.err and "internal error" not in r.err
    lines = r.err.strip().splitlines()
    assert len(lines) == 1, r.err
    return lines[0]


def test_yaml_key_twice_with_different_values(cli, tmp_path: Path) -> None:
    p = tmp_path / "twice.yaml"
    p.write_text("base: dgx-h100\nnic_gbit_per_s: 400\nnic_gbit_per_s: 100\n")
    line = one_line(cli("estimate", "-m", "llama-3.1-8b", "--hardware", p))
    assert str(p) in line and "'nic_gbit_per_s' is given twice (line 3)" in line and "(400, then 100)" in line
    assert "llmplan does not guess which one a YAML spec, profile or plan file means: give the key once" in line


def test_json_key_twice_with_different_values_warns_and_keeps_the_last(cli, tmp_path: Path) -> None:
    """Python's json (object_pairs_hook absent: a dict keeps the last) and Hugging Face transformers'
    PretrainedConfig (json.loads of the file) read a repeated key's last value: llmplan reads what they read, and
    says so in one warning line naming the key, its line and the value kept."""
    p = tmp_path / "config.json"
    # line 1 "{", lines 2-9 the 8 keys of HF, line 10 the repeat
    p.write_text(json.dumps(HF, indent=1)[:-2] + ',\n "hidden_size": 2048\n}')
    assert json.loads(p.read_text())["hidden_size"] == 2048  # the stdlib's reading
    r = cli("estimate", "-m", p, "--hardware", "dgx-h100", "--json")
    assert r.code == 0, r.err
    warn = [x for x in r.err.splitlines() if x.strip()]
    assert len(warn) == 1 and warn[0].startswith(f"warning: {p}: key 'hidden_size' is given twice (line 10)"), r.err
    assert "(4096, then 2048); read with the last, 2048" in warn[0]
    # the model read is the last value's: the same estimate as a file that gives hidden_size 2048 once
    q = tmp_path / "once.json"
    q.write_text(json.dumps({**HF, "hidden_size": 2048}))
    once = cli("estimate", "-m", q, "--hardware", "dgx-h100", "--json")
    assert once.code == 0 and not once.err.strip(), once.err
    assert json.loads(r.out)["time"] == json.loads(once.out)["time"]


def test_json_key_twice_in_nested_objects_warns_without_a_line(tmp_path: Path, capsys) -> None:
    from llmplan.fileio import parse_document
    text = '{"a": {"k": 1, "k": 2}, "b": {"k": 3}}'
    assert parse_document(text, "JSON", "n.json") == {"a": {"k": 2}, "b": {"k": 3}}
    err = capsys.readouterr().err
    assert err == "warning: n.json: key 'k' is given twice with different values (1, then 2); read with the last, " \
                  "2, as Python's json and Hugging Face transformers read it\n"


def test_key_twice_with_the_same_value_is_read(cli, tmp_path: Path) -> None:
    """Not ambiguous: read as before (a config.json that repeats a key verbatim still loads)."""
    p = tmp_path / "same.yaml"
    p.write_text("base: dgx-h100\nnic_gbit_per_s: 400\nnic_gbit_per_s: 400\n")
    assert cli("estimate", "-m", "llama-3.1-8b", "--hardware", p).code == 0


def test_yaml_merge_key_override_is_not_a_duplicate(tmp_path: Path) -> None:
    from llmplan.fileio import parse_document
    data = parse_document("a: &x {p: 1, q: 2}\nb:\n  <<: *x\n  p: 3\n", "YAML", "t.yaml")
    assert data == {"a": {"p": 1, "q": 2}, "b": {"p": 3, "q": 2}}


@pytest.mark.parametrize("name,code", [("lla\x00ma", "U+0000"), ("bad\x1b[31mred", "U+001B")])
def test_control_character_in_a_model_name(cli, tmp_path: Path, name: str, code: str) -> None:
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**HF, "name": name}))
    line = one_line(cli("estimate", "-m", p, "--hardware", "dgx-h100"))
    assert f"field 'name': a name may not hold a control character ({code} here)" in line
    assert "\x00" not in line and "\x1b" not in line  # shown escaped, never raw


def test_control_character_in_a_system_name(cli, tmp_path: Path) -> None:
    p = tmp_path / "sys.yaml"
    p.write_text('name: "dgx\\x1b[2J"\nbase: dgx-h100\n')
    line = one_line(cli("estimate", "-m", "llama-3.1-8b", "--hardware", p))
    assert "U+001B" in line and "\x1b" not in line


def test_unicode_names_still_read(cli, tmp_path: Path) -> None:
    p = tmp_path / "sys.yaml"
    p.write_text("name: ünïcødé-系统\nbase: dgx-h100\n", encoding="utf-8")
    r = cli("estimate", "-m", "llama-3.1-8b", "--hardware", p)
    assert r.code == 0 and "ünïcødé-系统" in r.out


def test_json_error_gives_line_and_column(cli, tmp_path: Path) -> None:
    p = tmp_path / "config.json"
    head = '{"model_type": "llama", "hidden_size'
    p.write_text(head + "\n")  # a raw newline inside a string, the character after `head` (column 37)
    line = one_line(cli("estimate", "-m", p, "--hardware", "dgx-h100"))
    assert len(head) + 1 == 37
    assert line.endswith("(line 1, column 37): not valid JSON: Invalid control character"), line


def test_excerpt_escapes_control_characters() -> None:
    assert excerpt("plain-ü") == "plain-ü"
    assert excerpt("a\x1bb") == "'a\\x1bb'"


def test_json_key_twice_as_1_then_true_warns(capsys) -> None:
    # Python holds 1 == True; JSON does not, so a key given as 1 and then true is two different values
    from llmplan.fileio import parse_document
    assert parse_document('{"sp": 1, "sp": true}', "JSON", "typed.json") == {"sp": True}
    assert "key 'sp' is given twice" in capsys.readouterr().err
