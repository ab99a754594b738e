"""The plan switches on the command line: one-line refusals and errors with exit code 2 (the real command)."""

from __future__ import annotations


def test_one_broken_rule_is_one_line(cli):
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--param-remainders", "--zero", "0")
    assert r.code == 2
    assert "Traceback" not in r.err + r.out
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert len(lines) == 1, r.err
    assert "the plan breaks a rule: param_remainders with zero 0" in lines[0] and "use --zero 1" in lines[0]
