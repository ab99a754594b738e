"""The real `llmplan` command: output, JSON contract and exit codes, including bad input."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmplan.specs.registry import builtin_models, builtin_systems

ACCEPTANCE = ["estimate", "--model", "gpt3-175b", "--hardware", "dgx-a100", "--nodes", "8", "--tp", "8",
              "--pp", "8", "--sp", "--recompute", "selective", "--micro-batch", "1", "--global-batch", "64",
              "--seq-len", "2048"]


def test_estimate_table(cli):
    r = cli(*ACCEPTANCE)
    assert r.code == 0, r.err
    for text in ("Memory per GPU", "weights", "gradients", "optimizer states", "activations", "FITS",
                 "headroom", "174.60B", "mem.activations"):
        assert text in r.out


def test_estimate_json_contract(cli):
    r = cli(*ACCEPTANCE, "--vpp", "3", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["schema"] == 1
    assert set(doc["plan"]) >= {"tp", "pp", "dp", "cp", "ep", "vpp", "sp", "zero", "recompute", "micro_batch",
                                "global_batch", "seq_len", "dtype"}
    assert doc["plan"]["dp"] == 1 and doc["plan"]["vpp"] == 3
    assert set(doc["params"]) >= {"total", "active"}
    mem = doc["memory"]
    assert set(mem) >= {"weights", "gradients", "optimizer", "activations", "other", "total", "capacity", "fits"}
    parts = mem["weights"] + mem["gradients"] + mem["optimizer"] + mem["activations"] + mem["other"]
    assert parts == pytest.approx(mem["total"])
    assert mem["activation_parts"]["layers"] / 2**30 == pytest.approx(12.35, rel=0.01)  # Korthikanti Fig. 1
    assert set(doc["comm"]) == {"tp", "pp", "dp", "cp", "ep"}
    for axis in doc["comm"].values():
        assert {"bytes", "seconds"} <= set(axis)


def test_dp_is_derived_and_does_not_fit_exits_zero(cli):
    r = cli("estimate", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--nodes", "1", "--tp", "1", "--json")
    assert r.code == 0
    doc = r.json()
    assert doc["plan"]["dp"] == 8 and doc["memory"]["fits"] is False
    r = cli("estimate", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--tp", "1")
    assert "DOES NOT FIT" in r.out and "short by" in r.out


def test_models_and_hardware_list_builtins(cli):
    r = cli("models", "--json")
    names = {m["name"] for m in r.json()["models"]}
    assert {"gpt3-175b", "llama-3.1-405b", "deepseek-v3", "gpt-oss-120b", "gpt-1t"} <= names
    r = cli("hardware", "--json")
    doc = r.json()
    assert {g["name"] for g in doc["gpus"]} >= {"a100-40gb", "a100-80gb", "h100-sxm", "h800", "h200", "b200",
                                               "gb200", "mi300x", "mi325x", "l40s"}
    assert {s["name"] for s in doc["systems"]} >= {"dgx-a100", "dgx-a100-40gb", "dgx-h100", "dgx-h800",
                                                  "dgx-h200", "dgx-b200", "gb200-nvl72", "mi300x-8", "l40s-8"}
    assert "dgx-h100" in cli("hardware").out


@pytest.mark.parametrize("args,needle", [
    (["--model", "llama-3.1-7b", "--hardware", "dgx-h100"], "unknown model 'llama-3.1-7b'; did you mean llama-3.1-70b"),
    (["--model", "llama-3.1-8b", "--hardware", "dgx-h1000"], "unknown hardware 'dgx-h1000'; did you mean dgx-h100"),
    (["--model", "llama-3.1-8b", "--hardware", "h100-sxm"], "'h100-sxm' is a GPU, not a system"),
    (["--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--nodes", "2", "--tp", "3"],
     "tp (3) must divide num_attention_heads (64) of llama-3.1-70b; valid tp: 1, 2, 4, 8"),
    (["--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--tp", "8", "--pp", "3"],
     "pp (3) does not divide num_hidden_layers (80)"),
    (["--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--recompute", "sometimes"], "--recompute sometimes: "),
    (["--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "0"], "Invalid value for '--nodes'"),
    (["--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--tp", "0"], "Invalid value for '--tp'"),
    (["--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--seq-len", "0"], "Invalid value for '--seq-len'"),
    (["--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--global-batch", "0"], "Invalid value for '--global-batch'"),
    (["--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--no-such-flag"], "No such option: --no-such-flag"),
    (["--model", "llama-3.1-8b"], "Missing option '--hardware'"),
    (["--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "2", "--gpus-per-node", "9"],
     "gpus_per_node (9) exceeds the 8 GPUs of a dgx-h100 node"),
    (["--model", "llama-3.1-8b", "--hardware", "dgx-a100", "--dtype", "fp8"], "a100-80gb has no fp8 tensor cores"),
    (["--model", "does/not/exist.yaml", "--hardware", "dgx-h100"], "model file does/not/exist.yaml does not exist"),
])
def test_bad_input_exits_2_with_one_clear_message(cli, args, needle):
    r = cli("estimate", *args)
    assert r.code == 2
    assert needle in r.err
    assert "Traceback" not in r.err + r.out


def test_every_violation_listed(cli):
    r = cli("estimate", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--tp", "3", "--pp", "3")
    assert r.code == 2
    assert "breaks 4 rule(s)" in r.err and "FFN width(s) (28672)" in r.err and "tp (3)" in r.err and "pp (3)" in r.err


def test_malformed_and_invalid_spec_files(cli, tmp_path):
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("name: x\nhidden_size: [1, 2\n")
    r = cli("estimate", "--model", bad_yaml, "--hardware", "dgx-h100")
    assert r.code == 2 and str(bad_yaml) in r.err and "not valid YAML" in r.err

    negative = tmp_path / "neg.yaml"
    negative.write_text("name: tiny\nhidden_size: -5\nintermediate_size: 64\nnum_hidden_layers: 2\n"
                        "num_attention_heads: 4\nvocab_size: 100\nmax_position_embeddings: 128\n")
    r = cli("estimate", "--model", negative, "--hardware", "dgx-h100")
    assert r.code == 2 and "field 'hidden_size': Input should be greater than 0 (got -5)" in r.err

    missing = tmp_path / "missing.yaml"
    missing.write_text("name: tiny\nhidden_size: 64\n")
    r = cli("estimate", "--model", missing, "--hardware", "dgx-h100")
    assert r.code == 2 and "field 'num_hidden_layers': Field required" in r.err

    bad_json = tmp_path / "config.json"
    bad_json.write_text("{\"model_type\": \"llama\", ")
    r = cli("estimate", "--model", bad_json, "--hardware", "dgx-h100")
    assert r.code == 2 and "not valid JSON" in r.err


def test_debug_env_shows_traceback():
    env = {**os.environ, "LLMPLAN_DEBUG": "1"}
    r = subprocess.run([sys.executable, "-m", "llmplan", "estimate", "--model", "nope", "--hardware", "dgx-h100"],
                       capture_output=True, text=True, env=env)
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_installed_package_ships_data(tmp_path):
    """Run from outside the checkout: the installed llmplan finds its built-in models and hardware."""
    r = subprocess.run([sys.executable, "-m", "llmplan", "models", "--json"], capture_output=True, text=True,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["models"]) >= 25


def test_wheel_contains_data_folders(tmp_path):
    """A non-editable build puts model_specs/ and hardware_profiles/ inside the package."""
    pytest.importorskip("hatchling")
    from hatchling.builders.wheel import WheelBuilder

    root = Path(__file__).resolve().parents[1]
    wheel = next(WheelBuilder(str(root)).build(directory=str(tmp_path), versions=["standard"]))
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    assert "llmplan/model_specs/llama-3.1-70b.yaml" in names
    assert "llmplan/hardware_profiles/systems/dgx-h100.yaml" in names
    assert "llmplan/hardware_profiles/gpus/h100-sxm.yaml" in names


def test_tp_impl_option(cli):
    # --tp-impl dtensor prices TP as PyTorch DTensor keeps it (torchtitan): the gathered inputs of the
    # column-parallel linears stay in memory, no backward re-gather. It reaches the plan, the JSON and search.
    args = ("estimate", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--nodes", "4", "--tp", "8", "--zero",
            "3", "--recompute", "full", "--seq-len", "8192", "--global-batch", "64", "--json")
    meg, dt = cli(*args), cli(*args, "--tp-impl", "dtensor")
    assert meg.code == 0 and dt.code == 0, dt.err
    assert meg.json()["plan"]["tp_impl"] == "megatron" and dt.json()["plan"]["tp_impl"] == "dtensor"
    assert dt.json()["memory"]["activations"] > meg.json()["memory"]["activations"]
    s = cli("search", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--nodes", "4", "--tp-impl", "dtensor",
            "--json")
    assert s.code == 0 and s.json()["plans"][0]["plan"]["tp_impl"] == "dtensor"
    bad = cli(*args, "--tp-impl", "deepspeed")
    assert bad.code == 2 and "--tp-impl deepspeed is not a TP implementation" in bad.err and "dtensor" in bad.err
    assert "Traceback" not in bad.err


def test_fp32_param_shards_option(cli):
    # --fp32-param-shards prices ZeRO-3 as PyTorch FSDP / FSDP2 lays it out (the fp32 shard is the master
    # copy): 2 bytes per parameter shard less. It reaches the plan, the JSON and search.
    args = ("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--zero", "3", "--recompute", "full",
            "--seq-len", "8192", "--global-batch", "8", "--json")
    ds, fsdp = cli(*args), cli(*args, "--fp32-param-shards")
    assert ds.code == 0 and fsdp.code == 0, fsdp.err
    assert ds.json()["plan"]["fp32_param_shards"] is False and fsdp.json()["plan"]["fp32_param_shards"] is True
    saved = ds.json()["memory"]["total"] - fsdp.json()["memory"]["total"]
    # 2 B x 8.03B parameters / 8 shards saved (held: no allowance), less FSDP2's reduce buffers ((2 + 4) B x
    # 8.03B / 32 layers, docs/formulas.md#mem.other) + 5% (churned: docs/formulas.md#mem.fragmentation)
    assert saved == pytest.approx(2 * 8.03e9 / 8 - 6 * 8.03e9 / 32 * 1.05, rel=0.01)
    # the search pinned to ZeRO-3, where the switch applies (without the pin its top plan may be a ZeRO-1/2 one
    # tied with the ZeRO-3 plans, which carries the switch off)
    s = cli("search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--fp32-param-shards", "--zero", "3",
            "--json")
    assert s.code == 0 and s.json()["plans"][0]["plan"]["fp32_param_shards"] is True


@functools.cache
def listing_at_80_columns(cmd: str) -> subprocess.CompletedProcess:
    """`llmplan CMD` (a listing: read-only, the same output every time) in a child process on an 80-column
    terminal, run once per test process for the tests that read it."""
    env = {**os.environ, "COLUMNS": "80"}
    return subprocess.run([sys.executable, "-m", "llmplan", cmd], capture_output=True, text=True, env=env, timeout=60)


def test_listings_fit_80_columns_with_every_name_whole():
    # On an 80-column terminal `models` and `hardware` keep each name (what --model / --hardware take) on one
    # line and no line is wider than the terminal; `models` leaves the architecture column to --json there.
    for cmd, names in (("models", builtin_models()), ("hardware", builtin_systems())):
        r = listing_at_80_columns(cmd)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert max(len(line) for line in lines) <= 80
        firsts = {line.split()[0] for line in lines if line.split()}
        assert set(names) <= firsts, sorted(set(names) - firsts)


def test_models_listing_never_wraps_a_number_at_80_columns():
    # The models table at 80 columns keeps every number on its model's line: 10,485,760 (llama-4-scout's
    # context) and 128/128 (deepseek-v3's heads/kv) were cut over two lines (`10,485` / `,760`) once the
    # longest name (nemotron-3.5-lightning) and the 10M context arrived.
    r = listing_at_80_columns("models")
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines() if line.split()}
    for name, m in builtin_models().items():
        cells = rows[name]
        assert f"{m.max_position_embeddings:,}" in cells, (name, cells)
        assert f"{m.num_attention_heads}/{m.kv_heads}" in cells, (name, cells)
        assert str(m.hidden_size) in cells, (name, cells)


def test_a_plan_saved_as_yaml_exports(tmp_path):
    # `--save x.yaml` writes YAML that llmplan reads back: JSON's 2e-05 is a string to a YAML 1.1 reader, which
    # made `export x.yaml` refuse the saved hardware's failures_per_node_hour.
    from typer.testing import CliRunner

    from llmplan.cli.app import app

    runner = CliRunner()
    path = tmp_path / "x.yaml"
    made = runner.invoke(app, ["estimate", "-m", "llama-3.1-8b", "--hardware", "dgx-h100", "--save", str(path)])
    assert made.exit_code == 0, made.output
    assert not path.read_text().lstrip().startswith("{")
    r = runner.invoke(app, ["export", str(path), "--to", "megatron", "-o", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "out" / "megatron_pretrain.sh").exists()


def test_a_memory_interval_past_the_capacity_is_flagged(cli):
    # llama-3.1-70b tp 8 on 8 nodes fits at 77.1 of 79.2 GiB, but its 80% memory interval reaches 91.9 GiB:
    # the interval line printed the range beside FITS without saying that its upper end does not fit.
    base = ["estimate", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--nodes", "8", "--zero", "1",
            "--global-batch", "1024"]
    r = cli(*base, "--tp", "8", "--pp", "1")
    assert r.code == 0, r.err
    text = " ".join(r.out.split())
    assert "FITS" in text and "above the 79.2 GiB capacity: it may not fit" in text
    r = cli(*base, "--tp", "8", "--pp", "2")  # 52.2 GiB, interval up to 62.3 GiB: nothing to flag
    assert r.code == 0 and "may not fit" not in " ".join(r.out.split())
