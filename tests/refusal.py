"""The shape every refusal of bad input takes: one line on stderr, no traceback (the brief's error rule)."""

from __future__ import annotations


def one_line(err: str) -> str:
    """The single line of `err`; fails the test if the refusal spans several lines or shows a traceback."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def targeted_search_exports(cli, tmp_path, common, key, plain, targeted, fix, target="deepspeed"):
    """An untargeted search's #1 sets plan key `key` to `plain` and `target` refuses it in a line naming `fix`;
    the same search with --target sets `targeted` and its #1 exports. Returns the targeted plan file."""
    import json

    p, t = tmp_path / "plain.json", tmp_path / "targeted.json"
    assert cli("search", *common, "--save", p).code == 0
    assert json.loads(p.read_text())["plan"][key] is plain
    r = cli("export", p, "--to", target, "-o", tmp_path / "plain")
    assert r.code == 2 and fix in r.err, r.err
    r = cli("search", *common, "--target", target, "--save", t)
    assert r.code == 0, r.err
    assert json.loads(t.read_text())["plan"][key] is targeted
    assert cli("export", t, "--to", target, "-o", tmp_path / "targeted").code == 0
    return t
