"""CLI defects found by a new user's sweep of README.md, docs/ and every --help (branch qa-cli): each test runs
the command as the user typed it and asserts the exit code and the words of the answer."""

from __future__ import annotations

import re


def test_nothing_fits_under_min_headroom_names_the_headroom_not_more_nodes(cli):
    """--min-headroom above what any plan leaves: the advice was 'about 1 nodes instead of 1 (--nodes)'."""
    r = cli("search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1", "--min-headroom", "1000")
    assert r.code == 3
    assert "nodes instead of 1" not in r.err
    m = re.search(r"--min-headroom ([0-9.]+) or less .* leaves ([0-9.]+) GiB free; 1000 GiB was asked", r.err)
    assert m and m.group(1) == m.group(2) and 0 < float(m.group(1)) < 79.2
    ok = cli("search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1", "--min-headroom",
             m.group(1), "--json")
    assert ok.code == 0 and ok.json()["plans"]  # the advice holds: at that headroom a plan fits


def test_nothing_fits_more_nodes_counts_the_default_headroom(cli):
    r = cli("search", "--model", "llama-3.1-405b", "--hardware", "dgx-h100", "--nodes", "1")
    assert r.code == 3
    n = int(re.search(r"about (\d+) nodes instead of 1 \(--nodes\)", r.err).group(1))
    assert n > 1
