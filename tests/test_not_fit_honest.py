"""A plan that does not fit (QA sweep): its throughput and latency are marked not achievable (serving: the
figures of the most sequences that do fit instead, labelled), and every piece of advice printed for it, added to
the same command, gives a plan that fits. Exit code 0 as for any estimate (tests/test_cli.py); output within 80
columns."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

SERVE = ["--mode", "infer", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--tp", "1", "--batch", "100000",
         "--max-num-batched-tokens", "100000"]  # vLLM refuses a token budget under its sequence cap (#cli-json-errors)
TRAIN = {"70b-1-node": ["--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--nodes", "1", "--tp", "1"],
         "405b-tp8": ["--model", "llama-3.1-405b", "--hardware", "dgx-h100", "--tp", "8"]}


def text(*args: str) -> tuple[int, str]:
    r = subprocess.run([sys.executable, "-m", "llmplan", *args], capture_output=True, text=True,
                       env={**os.environ, "COLUMNS": "80"}, timeout=180)
    assert max(len(ln) for ln in r.stdout.splitlines()) <= 80
    return r.returncode, " ".join(r.stdout.split())  # rich wraps at 80 columns: compare words, not lines


def test_serving_batch_that_does_not_fit_gives_no_throughput_for_it(cli):
    doc = cli("estimate", *SERVE, "--json").json()
    assert doc["memory"]["fits"] is False and doc["achievable"] is False
    fit = doc["at_fitting_batch"]
    # the engine's capacity at the smaller batch (its activation workspace shrinks with it): at least the
    # count admitted beside 100,000 sequences' workspace, far below 100,000
    assert doc["max_concurrent_seqs"] <= fit["batch"] < 1000
    again = cli("estimate", *SERVE, "--batch", str(fit["batch"]), "--json").json()
    assert again["memory"]["fits"] and again["achievable"]
    assert again["throughput"]["tokens_per_s"] == pytest.approx(fit["tokens_per_s"], rel=1e-9)
    assert again["ttft_s"] == pytest.approx(fit["ttft_s"], rel=1e-9)
    code, out = text("estimate", *SERVE)
    assert code == 0
    assert "DOES NOT FIT" in out and "not achievable: 100,000 sequences per replica do not fit" in out
    assert f"at the {fit['batch']:,} sequences that fit:" in out
    assert f"{fit['tokens_per_s']:,.0f} output tokens/s" in out
    # the plan's own figures (tokens/s of 100,000 sequences, its 80% interval) are not printed
    assert f"{doc['throughput']['tokens_per_s']:,.0f} output" not in out and "80% interval" not in out
    assert "What makes it fit" in out and "What to change next" not in out


def test_every_serving_advice_for_a_plan_that_does_not_fit_makes_it_fit(cli):
    doc = cli("estimate", *SERVE, "--json").json()
    advice = doc["advice"]
    assert any(a["flags"] == ["--batch", str(doc["at_fitting_batch"]["batch"])] for a in advice), advice
    # more replicas (the batch is per replica) or more TP at 100,000 sequences still do not fit: not advised
    assert not any("--dp" in a["flags"] and "--tp" not in a["flags"] for a in advice), advice
    for a in advice:
        got = cli("estimate", *SERVE, *a["flags"], "--json")
        assert got.code == 0, (a, got.err)
        g = got.json()
        assert g["memory"]["fits"] is True, a
        assert g["throughput"]["tokens_per_s"] == pytest.approx(a["predicted"]["tokens_per_s"], rel=1e-3), a


def test_a_serving_plan_whose_weights_do_not_fit_is_advised_only_what_fits(cli):
    base = ["--mode", "infer", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--gpus-per-node", "1",
            "--tp", "1", "--dp", "1"]
    doc = cli("estimate", *base, "--json").json()
    assert doc["achievable"] is False and doc["at_fitting_batch"] is None  # not one sequence fits
    assert doc["advice"]
    for a in doc["advice"]:
        assert cli("estimate", *base, *a["flags"], "--json").json()["memory"]["fits"] is True, a


@pytest.mark.parametrize("case", sorted(TRAIN))
def test_every_training_advice_for_a_plan_that_does_not_fit_makes_it_fit(cli, case):
    base = TRAIN[case]
    doc = cli("estimate", *base, "--json").json()
    assert doc["memory"]["fits"] is False and doc["achievable"] is False
    assert doc["advice"], "no advice that makes the plan fit"
    for a in doc["advice"]:
        got = cli("estimate", *base, *a["flags"], "--json")
        assert got.code == 0, (a, got.err)
        g = got.json()
        assert g["memory"]["fits"] is True and g["achievable"] is True, a
        assert g["throughput"]["tokens_per_s"] == pytest.approx(a["predicted"]["tokens_per_s"], rel=1e-3), a
        assert g["memory"]["total"] / 2**30 == pytest.approx(a["predicted"]["memory_gib"], rel=1e-3), a


def test_training_text_marks_the_step_of_a_plan_that_does_not_fit(cli):
    doc = cli("estimate", *TRAIN["70b-1-node"], "--json").json()
    code, out = text("estimate", *TRAIN["70b-1-node"])
    assert code == 0
    assert "DOES NOT FIT" in out
    tokens = f"{doc['throughput']['tokens_per_s']:,.0f} tokens/s"
    assert f"not achievable (the plan does not fit): {tokens}" in out
    assert "goodput" not in out  # a plan that cannot run trains no tokens in any number of days
    assert "What makes it fit" in out
    # no % against the throughput of a plan that cannot run
    table = out.split("What makes it fit")[1]
    assert not re.search(r"\([+-]\d+\.\d%\)", table), table


def test_a_plan_that_fits_is_achievable_and_unchanged(cli):
    doc = cli("estimate", "--mode", "infer", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--json").json()
    assert doc["memory"]["fits"] and doc["achievable"] is True and "at_fitting_batch" not in doc
    code, out = text("estimate", "--mode", "infer", "--model", "llama-3.1-8b", "--hardware", "dgx-h100")
    assert code == 0 and "not achievable" not in out and "output tokens/s" in out
    doc = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--zero", "3", "--recompute", "full",
              "--seq-len", "4096", "--json").json()
    assert doc["memory"]["fits"] and doc["achievable"] is True
