"""Values outside an option's declared range (min= / max=): one line naming the flag, the value and the valid
range with the fix, exit code 2, never typer's multi-line Usage/Error box (the new-user walkthrough saw it for
`search --nodes 0`). Every ranged option of every command is tried, found by walking the command tree."""

from __future__ import annotations

import pytest
import typer

from llmplan.cli import app

BOX = ("Usage:", "Try 'llmplan", "Traceback", "Input should be")


def ranged_options():
    """(command path, flag, a value below its min or above its max, the bound) for every ranged option."""
    def walk(cmd, path):
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            yield from walk(sub, path + [name])
        for p in getattr(cmd, "params", []):
            lo, hi = getattr(p, "min", None), getattr(p, "max", None)
            if not p.opts or not p.opts[0].startswith("--"):
                continue
            flag = max(p.opts, key=len)
            if lo is not None:
                yield tuple(path), flag, lo - 1, lo
            if hi is not None:
                yield tuple(path), flag, hi + 1, hi

    return list(walk(typer.main.get_command(app), []))


RANGED = ranged_options()


def test_the_walk_finds_the_walkthrough_flags():
    seen = {(path, flag) for path, flag, _, _ in RANGED}
    for want in [(("search",), "--nodes"), (("search",), "--top"), (("search",), "--seq-len"),
                 (("estimate",), "--batch"), (("estimate",), "--nodes")]:
        assert want in seen, want
    assert len(RANGED) > 40


@pytest.mark.parametrize("path,flag,value,bound", RANGED, ids=[f"{' '.join(p)} {f} {v}" for p, f, v, _ in RANGED])
def test_every_out_of_range_value_is_one_line(cli, path, flag, value, bound):
    r = cli(*path, flag, value)
    line = r.refusal(2)
    assert not any(b in r.err + r.out for b in BOX), r.err
    assert f"'{flag}'" in line and str(value).replace(".0", "") in line, line
    assert "out of range" in line and (f"{bound:g}" if isinstance(bound, float) else str(bound)) in line.replace(",", ""), line


@pytest.mark.parametrize("cmd,flag,rule", [
    ("search", "--nodes", "at least 1 (give --nodes 1 or more)"),
    ("search", "--top", "at least 1 (give --top 1 or more)"),
    ("search", "--seq-len", "at least 1"),
    ("estimate", "--batch", "at least 1"),
    ("estimate", "--seq-len", "at least 1"),
    ("estimate", "--nodes", "at least 1"),
])
def test_walkthrough_reproducers(cli, cmd, flag, rule):
    r = cli(cmd, "--model", "llama-3.1-70b", "--hardware", "dgx-h100", flag, "0")
    line = r.refusal(2)
    assert line.startswith(f"error: Invalid value for '{flag}': 0 is out of range; it must be {rule}"), line


def test_both_bounds_and_json(cli):
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--acceptance", "1.5", "--json")
    assert r.code == 2 and "1.5 is out of range; it must be from 0 to 1" in r.refusal(2)
    assert r.json()["error"] == {"code": 2, "message": r.refusal(2)[len("error: "):]}


@pytest.mark.parametrize("args,want", [
    (("search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodse", "2"),
     "No such option: --nodse (Possible options: --mode, --no-sp, --nodes); 'llmplan search --help'"),
    (("search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "two"),
     "Invalid value for '--nodes': Input should be a valid integer, unable to parse string as an integer "
     "(given 'two')"),
    (("serch",), "No such command 'serch'. Did you mean 'search'"),
])
def test_every_other_usage_error_is_one_line_too(cli, args, want):
    # A misspelt option or command and a value of the wrong type: click's own message (the nearest option, the
    # value given) on one line with where the options are listed, never the Usage/Try/Error box.
    r = cli(*args)
    line = r.refusal(2)
    assert not any(b in r.err + r.out for b in BOX[:3]), r.err
    assert line.startswith("error: " + want), line
    assert "--help' lists the commands and options" in line
    j = cli(*args, "--json")
    assert j.code == 2 and j.json()["error"]["message"] == j.refusal(2)[len("error: "):]


def _commands() -> list[str]:
    import typer.main

    from llmplan.cli.app import app
    group = typer.main.get_command(app)
    return sorted(group.commands)  # type: ignore[attr-defined]


def test_the_usage_hint_follows_clicks_message_without_a_stray_stop(cli):
    """click ends some usage messages with a full stop ("Missing option '--plans'.") or a question ("Did you
    mean 'search'?"); the hint joined after them read ".;" (before: "Missing option '--plans'.; 'llmplan lock
    --help' ..."). Every command's usage errors: an unknown option, an option without its value, a missing one."""
    lines = []
    for name in _commands():
        lines.append(cli(name, "--no-such-option-zz").refusal(2))
    lines += [cli("lock").refusal(2), cli("search", "--model").refusal(2), cli("serch").refusal(2)]
    assert len(lines) > 10
    for line in lines:
        assert "--help' lists the commands and options" in line, line
        assert ".;" not in line and "?;" not in line and ". '" not in line, line
    assert lines[-3] == "error: Missing option '--plans'; 'llmplan lock --help' lists the commands and options"
    assert lines[-1].endswith("? 'llmplan --help' lists the commands and options"), lines[-1]
