"""80-column output of the new-user walkthrough: no word folded inside (`infinity-fa` / `bric`, a lone `)` of
"(no communication)"), no flag parted from its value in the advice (`--dp` / `2`), counts of a thousand or
more with a thousands separator (`1120 sequences`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ENV = {**os.environ, "COLUMNS": "80"}


def run(*args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "llmplan", *args], capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 0, r.stderr[-800:]
    assert max(len(ln) for ln in r.stdout.splitlines()) <= 80
    return r.stdout


def test_hardware_keeps_fabric_names_whole():
    lines = run("hardware").splitlines()
    assert sum("infinity-fabric" in ln for ln in lines) >= 3
    assert not any(ln.split() and ln.split()[0] == "bric" or ln.strip() == "bric" for ln in lines)


@pytest.mark.parametrize("extra", [["--tp", "2", "--pp", "2", "--zero", "1"], ["--tp", "8"]])
def test_estimate_communication_table_folds_no_word(extra):
    out = run("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", *extra)
    table = out.split("Communication per step")[1].split("Step time")[0]
    assert not any(ln.strip() in (")", "communication", "communication)") for ln in table.splitlines()), table
    rows = [ln for ln in table.splitlines() if ln.lstrip().startswith(("cp ", "ep "))]
    assert rows and all("(1 GPU)" in ln for ln in rows), table


def test_serving_advice_keeps_each_flag_with_its_value():
    out = run("estimate", "--mode", "infer", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--tp", "8",
              "--dtype", "fp8", "--kv-dtype", "fp8", "--input-len", "2048", "--output-len", "512", "--batch", "128")
    advice = out.split("What to change next")[1]
    assert "--dp=2" in advice and "--nodes=2" in advice, advice
    # a value flag never ends a line: --dp, --nodes, --tp, --gpus-per-node all take a number
    assert not re.search(r"--(dp|nodes|tp|gpus-per-node)\s*$", advice, re.M), advice


def test_counts_carry_a_thousands_separator():
    out = run("estimate", "--mode", "infer", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--tp", "8",
              "--dtype", "fp8", "--kv-dtype", "fp8", "--max-load", "--ttft-slo", "0.5", "--tpot-slo", "0.05")
    assert not re.search(r"\b\d{4,} (concurrent |running )?sequences", out), out
    assert re.search(r"\b\d{1,3}(,\d{3})+ concurrent sequences", out), out
    head = run("search", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--nodes", "8").splitlines()[0]
    assert "global batch 1,024 x 4,096 tokens" in head, head
