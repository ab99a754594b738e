"""The three findings the bad-input audit left (docs/validation.md#cli-json-errors): `check --format json` answered
its own errors on stderr only; an enum flag's bad value was pydantic's listing with no fix; vLLM's
max_num_batched_tokens >= max_num_seqs was refused by the export only, after `estimate` had priced the plan."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100")
INFER = (*TRAIN, "--mode", "infer")


def refused(r, json_doc: bool):
    """Exit 2, one `error:` line on stderr, no traceback; with `json_doc` the error document on stdout carries
    the same line, without it stdout is empty. Returns the line without its `error: `."""
    assert r.code == 2, (r.code, r.out[:300], r.err)
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.err
    assert "Traceback" not in r.err and "internal error" not in r.err
    line = lines[0].removeprefix("error: ")
    if json_doc:
        assert json.loads(r.out) == {"schema": 1, "error": {"code": 2, "message": line}}, r.out
    else:
        assert r.out == "", r.out
    return line


# 1. check --format json (and lock --json): the error document for every bad input, usage errors included.

CHECK_CASES = [
    (("--bogus",), "No such option: --bogus"),
    ((), "give spec / plan paths or --plans DIR"),
    (("--tolerance", "abc", "model_specs"), "Invalid value for '--tolerance'"),
    (("--plans", "/nonexistent-llmplan/plans", "model_specs"), "--plans /nonexistent-llmplan/plans does not exist"),
    (("/nonexistent-llmplan/spec.yaml",), "/nonexistent-llmplan/spec.yaml does not exist"),
]


@pytest.mark.parametrize("args,words", CHECK_CASES)
@pytest.mark.parametrize("fmt", [("--format", "json"), ("--format=json",), ("--json",)])
def test_check_in_json_answers_every_bad_input_with_the_error_document(cli, args, words, fmt):
    line = refused(cli("check", *fmt, *args), json_doc=True)
    assert words in line, line


@pytest.mark.parametrize("fmt", [(), ("--format", "junit"), ("--format", "github")])
def test_check_in_other_formats_writes_no_document(cli, fmt):
    line = refused(cli("check", *fmt, "--bogus"), json_doc=False)
    assert "No such option: --bogus" in line


def test_check_format_json_through_the_console_script():
    # the installed entry point, as CI runs it: the document on stdout, one line on stderr
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "llmplan", "check", "--format", "json", "--bogus"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    doc = json.loads(p.stdout)
    assert doc["schema"] == 1 and doc["error"]["code"] == 2 and "No such option: --bogus" in doc["error"]["message"]
    assert p.stderr.strip() == "error: " + doc["error"]["message"]


@pytest.mark.parametrize("args,words", [
    ((), "Missing option '--plans'"),
    (("--plans", "PLANS", "--nodes", "abc"), "Invalid value for '--nodes'"),
    (("--plans", "PLANS"), "nothing to lock"),
])
def test_lock_json_answers_every_bad_input_with_the_error_document(cli, tmp_path, args, words):
    args = tuple(str(tmp_path / "plans") if a == "PLANS" else a for a in args)
    line = refused(cli("lock", "--json", *args), json_doc=True)
    assert words in line, line


# 2. An enum flag's bad value: the flag, the value, the accepted values and a `give` fix, in one place's words.

ENUM_CASES = [
    (INFER, "--kv-dtype", "fp4", "bf16, fp16, fp8", "give --kv-dtype fp8"),
    (INFER, "--engine", "vlm", "vllm, trtllm, sglang", "give --engine vllm"),
    (INFER, "--dtype", "fp9", "bf16, fp16, fp8, mxfp8, nvfp4, int8, int4", "give --dtype "),
    (INFER, "--speculative", "medusa", "mtp, eagle, eagle3, ngram", "give --speculative with one of them"),
    (TRAIN, "--recompute", "sometimes", "none, selective, full, op", "give --recompute selective"),
    (TRAIN, "--dtype", "fp9", "bf16, fp16, fp8, fp4, fp32", "give --dtype "),
    (TRAIN, "--pp-schedule", "1f1bb", "1f1b, zero-bubble, dualpipe", "give --pp-schedule 1f1b"),
    (TRAIN, "--grad-dtype", "fp16", "fp32, bf16", "give --grad-dtype "),
    (TRAIN, "--grad-reduce", "allreduce", "reduce-scatter, all-reduce", "give --grad-reduce all-reduce"),
    (TRAIN, "--grad-accumulation", "fusedd", "fused, add, cast-add, copy", "give --grad-accumulation fused"),
    (TRAIN, "--zero3-unit", "layers", "layer, tensor", "give --zero3-unit layer"),
    (TRAIN, "--checkpoint", "asynch", "sync, async, memory", "give --checkpoint async"),
    (TRAIN, "--precision", "fp6", "bf16, fp8-tensorwise", "give --precision "),
    (TRAIN, "--softmax-kernel", "bogus", "fused, eager, eager-fp32", "give --softmax-kernel with one of them"),
    (TRAIN, "--optimizer", "adamw", "adam, muon", "give --optimizer adam"),
    (TRAIN, "--mode", "serve", "train, infer", "give --mode "),
    (("search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100"), "--objective", "fastest",
     "throughput, time-to-train, gpu-hours", "give --objective "),
    (("collective", "--hardware", "dgx-h100"), "--op", "allreducee", "all-reduce, all-gather", "give --op all-reduce"),
]


@pytest.mark.parametrize("base,flag,value,listed,fix", ENUM_CASES, ids=[f"{c[1]}-{c[2]}" for c in ENUM_CASES])
def test_an_enum_flag_names_its_values_and_the_fix(cli, base, flag, value, listed, fix):
    args = (*base, flag, value)
    line = refused(cli(*args), json_doc=False)
    assert f"{flag} {value}" in line and f"it must be one of {listed}" in line and fix in line, line
    assert "Input should be" not in line and line.count(";") >= 1
    assert refused(cli(*args, "--json"), json_doc=True) == line


def test_an_export_target_is_an_enum_flag_too(cli, tmp_path):
    plan = ROOT / "tests" / "data" / "plans" / "dense_train.json"
    line = refused(cli("export", plan, "--to", "megatronn", "-o", tmp_path / "out"), json_doc=False)
    assert "--to megatronn is not a target: it must be one of megatron," in line and "give --to megatron" in line
    assert not (tmp_path / "out").exists()


# 3. vLLM's max_num_batched_tokens >= max_num_seqs, refused where plans are checked (check_serve_plan).

RULE = "vLLM refuses max_num_batched_tokens below max_num_seqs, vllm/config/scheduler.py"


def test_a_vllm_batch_above_its_token_budget_is_refused_when_planned(cli):
    args = (*INFER, "--batch", "64", "--max-num-batched-tokens", "1")
    line = refused(cli(*args), json_doc=False)
    assert line.startswith("the plan breaks a rule: --max-num-seqs 64 above --max-num-batched-tokens 1 (" + RULE)
    assert "give --max-num-batched-tokens 64 or more, or --batch 1 or fewer" in line
    assert refused(cli(*args, "--json"), json_doc=True) == line


def test_the_bound_is_inclusive_and_vllms_only(cli):
    # max_num_batched_tokens == max_num_seqs starts; SGLang and TensorRT-LLM have no such rule (not refused)
    assert cli(*INFER, "--batch", "64", "--max-num-batched-tokens", "64").code == 0
    assert cli(*INFER, "--batch", "65", "--max-num-batched-tokens", "64").code == 2
    for engine in ("sglang", "trtllm"):
        r = cli(*INFER, "--batch", "64", "--max-num-batched-tokens", "1", "--engine", engine, "--json")
        assert r.code == 0, (engine, r.err)


def test_a_saved_vllm_plan_over_its_budget_is_refused_on_reading(cli, tmp_path):
    plan = tmp_path / "p.json"
    assert cli(*INFER, "--batch", "64", "--max-num-batched-tokens", "64", "--save", plan).code == 0
    doc = json.loads(plan.read_text())
    doc["job"]["batch"] = 65
    plan.write_text(json.dumps(doc))
    line = refused(cli("estimate", "--plan", plan), json_doc=False)
    assert "--max-num-seqs 65 above --max-num-batched-tokens 64 (" + RULE in line, line


def test_search_and_full_load_stay_within_the_budget(cli):
    # --max-batch and --max-load are ceilings: the engine's bound cuts them rather than refusing every layout
    r = cli("search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--mode", "infer",
            "--max-num-batched-tokens", "32", "--json")
    assert r.code == 0, r.err
    batches = [p["workload"]["batch"] for p in json.loads(r.out)["plans"]]
    assert batches and max(batches) <= 32 and 32 in batches, batches
    r = cli(*INFER, "--max-num-batched-tokens", "16", "--max-load", "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["workload"]["batch"] == 16
