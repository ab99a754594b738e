"""Error and warning lines: one line when stderr is piped (scripts, logs and these tests read one line), folded at
spaces within 80 columns when stderr is a terminal (the brief: output fits 80 columns), words never cut."""

from __future__ import annotations

import sys

import pytest

from llmplan.report import message_text

LONG = ("tp (16) must divide num_key_value_heads (8) of llama-3.1-70b; valid tp: 1, 2, 4, 8; see "
        "https://example.org/a-very-long-address-that-is-one-word-of-more-than-eighty-characters-on-its-own-xxxxx")


def test_piped_message_is_one_line():
    assert message_text("error", LONG) == f"error: {LONG}\n"


@pytest.mark.parametrize("columns", [40, 80, 200])
def test_terminal_message_folds_within_80_columns_and_keeps_every_word(columns):
    rows = message_text("error", LONG, columns).rstrip("\n").split("\n")
    assert len(rows) > 1 and rows[0].startswith("error: tp (16)")
    width = min(columns, 80)
    assert all(len(r) <= width for r in rows if " " in r.strip())  # only a single word longer than the width
    assert all(r.startswith("  ") for r in rows[1:])  # runs over, and it stands on a line of its own
    assert " ".join(r.strip() for r in rows) == f"error: {LONG}"


def _bad_tp(cli, monkeypatch, tty: bool):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: tty)
    monkeypatch.setenv("COLUMNS", "80")
    return cli("estimate", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--nodes", "2", "--tp", "16")


def test_cli_error_on_a_terminal_fits_80_columns(cli, monkeypatch):
    piped = _bad_tp(cli, monkeypatch, False)
    assert piped.code == 2 and piped.err.count("\n") == 1 and len(piped.err) > 81  # one long line when piped
    shown = _bad_tp(cli, monkeypatch, True)
    assert shown.code == 2 and shown.err.count("\n") > 1
    assert all(len(row) <= 80 for row in shown.err.splitlines())
    assert " ".join(r.strip() for r in shown.err.splitlines()) == piped.err.strip()
