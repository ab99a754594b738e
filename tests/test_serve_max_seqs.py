"""The admission cap the vLLM and SGLang exports write (vLLM --max-num-seqs, SGLang --max-running-requests):
the planned batch when it fits the KV cache, else the most sequences that do (serving.admission_cap,
docs/formulas.md#infer.capacity), with a comment saying so; a refusal for what the engine cannot start.

The cap a non-fitting plan gets is checked against the estimate itself, not against the export's own function:
`estimate --batch cap` fits and `estimate --batch cap + 1` does not (the engine would then preempt / retract)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from exported import unwrapped
from test_export import SERVE_PROGRAMS, command_argv, recorded_parser

from llmplan.specs.registry import builtin_systems

# Llama-3.1-8B bf16 on one H100 at 1,024 in / 256 out (docs/validation.md#kv-capacity: 8,192 do not fit, ~383 do).
BASE = ("--mode", "infer", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--gpus-per-node", "1")
CAP_FLAG = {"vllm": "--max-num-seqs", "sglang": "--max-running-requests"}


def parsed(script: str, target: str):
    """The launch line parsed by the engine's recorded parser (tests/data/launchers/TARGET.json)."""
    ap, rec = recorded_parser(target)
    if target == "vllm":
        ap.add_argument("model_tag", nargs="?")
    ns, unknown = ap.parse_known_args(command_argv(script, SERVE_PROGRAMS[target]))
    assert not unknown, f"flags {rec['launcher']} {rec['version']} does not define: {unknown}"
    return ns


def exported(cli, tmp_path: Path, name: str, *args: str) -> tuple[Path, dict[str, str]]:
    plan = tmp_path / f"{name}.json"
    assert cli("estimate", *BASE, *args, "--save", plan).code == 0
    out = tmp_path / name
    assert cli("export", plan, "--to", "all", "-o", out).code == 0
    return plan, {t: unwrapped((out / f"{t}_serve.sh").read_text()) for t in ("vllm", "sglang")}


def fits(cli, batch: int, *args: str) -> bool:
    return cli("estimate", *BASE, "--batch", str(batch), *args, "--json").json()["memory"]["fits"]


def test_a_batch_that_does_not_fit_exports_the_batch_that_does(cli, tmp_path):
    plan, files = exported(cli, tmp_path, "big", "--batch", "8192")
    caps = set()
    for target, text in files.items():
        ns = parsed(text, target)
        cap = int(ns.max_num_seqs if target == "vllm" else ns.max_running_requests)
        caps.add(cap)
        assert (f"# {CAP_FLAG[target]}: {cap:,} sequences per replica, not the planned batch of 8,192: only "
                f"{cap:,} fit the KV cache") in text
        assert "queues the rest" in text
        # the header gives the timing at the cap, not the unachievable one of the asked batch
        assert f"at the {cap:,} sequences per replica that fit: TTFT" in text
    (cap,) = caps
    assert 1 < cap < 8192
    assert fits(cli, cap) and not fits(cli, cap + 1)
    # the saved plan says what fits (it held at_fitting_batch null, "not even one fits", before)
    assert json.loads(plan.read_text())["predictions"]["at_fitting_batch"]["batch"] == cap


def test_a_batch_that_fits_is_admitted_as_planned(cli, tmp_path):
    _, files = exported(cli, tmp_path, "small", "--batch", "64")
    assert fits(cli, 64)
    assert int(parsed(files["vllm"], "vllm").max_num_seqs) == 64
    assert int(parsed(files["sglang"], "sglang").max_running_requests) == 64
    assert not any("not the planned batch" in t for t in files.values())


def test_vllm_refuses_a_cap_above_its_token_budget(cli, tmp_path):
    # vLLM's SchedulerConfig refuses max_num_batched_tokens < max_num_seqs (vllm-project/vllm @01230b40,
    # vllm/config/scheduler.py, verify_max_model_len): the pinned 256-token budget cannot start the fitting cap.
    # A vLLM plan of 8192 sequences is refused when planned (check_serve_plan, tests/test_cli_json_errors.py); an
    # SGLang plan, which has no such rule, is refused by the vLLM export.
    plan = tmp_path / "pinned.json"
    assert cli("estimate", *BASE, "--batch", "8192", "--max-num-batched-tokens", "256").code == 2
    assert cli("estimate", *BASE, "--batch", "8192", "--max-num-batched-tokens", "256", "--engine", "sglang",
               "--save", plan).code == 0
    r = cli("export", plan, "--to", "vllm", "-o", tmp_path / "v")
    assert r.code == 2 and not (tmp_path / "v").exists() and "Traceback" not in r.err
    line = r.err.strip()
    assert "\n" not in line
    m = re.search(r"--max-num-seqs (\d+) above --max-num-batched-tokens 256 \(vLLM refuses "
                  r"max_num_batched_tokens below max_num_seqs, vllm/config/scheduler.py\); re-plan with --max-num-batched-tokens (\d+) or more, "
                  r"or --batch 256", line)
    assert m and m.group(1) == m.group(2) and int(m.group(1)) > 256
    # SGLang has no such rule: its export writes the fitting cap
    r = cli("export", plan, "--to", "sglang", "-o", tmp_path / "s")
    assert r.code == 0
    text = (tmp_path / "s" / "sglang_serve.sh").read_text()
    assert int(parsed(text, "sglang").max_running_requests) == int(m.group(1))


def test_a_plan_that_holds_no_sequence_is_refused(cli, tmp_path):
    # Llama-3.1-70B in bf16 (141 GB of weights) on one 80 GB H100: no KV cache at all.
    plan = tmp_path / "none.json"
    assert cli("estimate", "--mode", "infer", "--model", "llama-3.1-70b", "--hardware", "dgx-h100",
               "--gpus-per-node", "1", "--save", plan).code == 0
    for target in ("vllm", "sglang"):
        r = cli("export", plan, "--to", target, "-o", tmp_path / target)
        assert r.code == 2 and not (tmp_path / target).exists() and "Traceback" not in r.err
        assert "\n" not in r.err.strip()
        assert re.search(rf"{target} cannot express this plan: weights, activations and runtime exceed the usable "
                         r"memory by [0-9.]+ GiB per GPU, leaving no KV cache; re-plan with a larger tp or pp",
                         r.err)


def test_an_export_to_the_other_engine_gives_it_the_fitting_batchs_kv_cache(cli, tmp_path):
    # 8,192 sequences do not fit (docs/validation.md#kv-capacity); the engine the export starts admits the fitting
    # cap and profiles its activation peak there, so the fraction converted for the other engine must give it the
    # KV bytes of that fitting batch (at_fitting_batch.kv_available), not the asked batch's smaller ones
    # (docs/validation.md#serve-fraction). Checked by pricing the other engine as exported: its rule, the written
    # fraction and cap. The fraction is rounded down to 0.001, so its KV is short by at most 0.001 of the GPU.
    hbm = builtin_systems()["dgx-h100"].gpu.hbm_bytes
    for planned, other in (("vllm", "sglang"), ("sglang", "vllm")):
        plan, files = exported(cli, tmp_path, planned, "--batch", "8192", "--engine", planned)
        fit = json.loads(plan.read_text())["predictions"]["at_fitting_batch"]
        ns = parsed(files[other], other)
        cap = int(ns.max_num_seqs if other == "vllm" else ns.max_running_requests)
        fraction = float(ns.gpu_memory_utilization if other == "vllm" else ns.mem_fraction_static)
        assert cap == fit["batch"] < 8192
        got = cli("estimate", *BASE, "--batch", str(cap), "--engine", other, "--memory-fraction", str(fraction),
                  "--json").json()["memory"]
        assert fit["kv_available"] - 0.001 * hbm <= got["kv_available"] <= fit["kv_available"]
        assert f"gives the KV cache the {fit['kv_available'] / 2**30:.1f} GiB per GPU planned with {planned}" in files[other]
