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


def _saved_plan(cli, tmp_path, *extra: str):
    plan = tmp_path / "plan.json"
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1", *extra,
            "--save", str(plan))
    assert r.code == 0
    step = cli("estimate", "--plan", str(plan), "--json").json()["time"]["step_s"]
    return plan, step


def test_calibrate_step_time_out_of_range_names_both_bounds(cli, tmp_path):
    """--step-time 1e9 said 'give the measured seconds per step, above 0' (it is above 0)."""
    plan, _ = _saved_plan(cli, tmp_path, "--zero", "3")
    for value in ("1e9", "inf", "0"):
        r = cli("calibrate", "--plan", str(plan), "--step-time", value, "-o", str(tmp_path / "c.yaml"))
        assert r.code == 2 and "above 0 and below 1e6" in r.err, r.err
    assert not (tmp_path / "c.yaml").exists()


def test_calibrate_memory_above_the_gpu_is_refused_not_written(cli, tmp_path):
    """--memory-gib 5000 on an 80 GB H100 wrote hbm_reserve_gib 4925.7, a profile llmplan itself then refused."""
    plan, step = _saved_plan(cli, tmp_path, "--zero", "3")
    out = tmp_path / "c.yaml"
    r = cli("calibrate", "--plan", str(plan), "--step-time", str(step), "--memory-gib", "5000", "-o", str(out))
    assert r.code == 2 and "--memory-gib 5000: a measured peak above the 79.2 GiB of one h100-sxm" in r.err
    assert not out.exists()
    ok = cli("calibrate", "--plan", str(plan), "--step-time", str(step), "--memory-gib", "60", "-o", str(out))
    assert ok.code == 0 and out.exists()
    assert cli("estimate", "--model", "llama-3.1-8b", "--hardware", str(out), "--nodes", "1", "--zero", "3").code == 0


def test_calibrate_memory_far_below_the_prediction_is_refused_not_written(cli, tmp_path):
    """A measured peak more than a GPU's memory under the prediction gave hbm_reserve_gib below -hbm_gib,
    which GpuSpec refuses when the profile is read."""
    plan, step = _saved_plan(cli, tmp_path)  # zero 0, dp 8: about 162 GiB predicted, it does not fit
    out = tmp_path / "c.yaml"
    r = cli("calibrate", "--plan", str(plan), "--step-time", str(step), "--memory-gib", "1", "-o", str(out))
    assert r.code == 2 and "llmplan predicts" in r.err and "above the measured peak" in r.err
    assert not out.exists()


def test_a_cluster_file_of_one_pool_needs_no_fabric(cli, tmp_path):
    """README: 'A cluster file of one pool is exactly --hardware SYSTEM --nodes N'; without a `fabric:` (there is
    no network between pools with one pool) it said 'no fabric between the pools', exit 2."""
    f = tmp_path / "one.yaml"
    f.write_text("pools:\n  - {system: dgx-h100, nodes: 1}\n")
    r = cli("search", "--model", "llama-3.1-8b", "--hardware", f, "--json")
    same = cli("search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1", "--json")
    assert r.code == 0 and same.code == 0, r.err
    assert [p["plan"] for p in r.json()["plans"]] == [p["plan"] for p in same.json()["plans"]]
    assert cli("search", "--mode", "infer", "--model", "llama-3.1-8b", "--hardware", f).code == 0
    e = cli("estimate", "--model", "llama-3.1-8b", "--hardware", f)
    assert e.code == 2 and "give its system here: --hardware dgx-h100 --nodes 1" in e.err, e.err


def test_a_cluster_file_of_one_pool_is_still_checked(cli, tmp_path):
    for text, words in (("pools:\n  - {system: dgx-h100, nodes: 0}\n", "field 'nodes'"),
                        ("pools:\n  - {system: dgx-h100, nodes: 1}\nfabric: {gb_per_s: -1}\n", "gb_per_s"),
                        ("pools:\n  - {system: dgx-h100, nodes: 1}\nfabrik: {gb_per_s: 50}\n", "unknown key(s) fabrik"),
                        ("pools:\n  - {system: dgx-h100, nodes: 1}\n  - {system: dgx-a100, nodes: 1}\n",
                         "no fabric between the pools")):
        f = tmp_path / "c.yaml"
        f.write_text(text)
        r = cli("search", "--model", "llama-3.1-8b", "--hardware", f)
        assert r.code == 2 and words in r.err and len(r.err.strip().splitlines()) == 1, r.err


def test_search_phase_help_names_the_flag_search_takes(cli):
    """search --help's --phase said 'decode at --batch sequences', an estimate flag search refuses."""
    assert cli("search", "--mode", "infer", "--model", "llama-3.1-8b", "--hardware", "dgx-h100",
               "--batch", "8").code == 2
    import typer.main

    from llmplan.cli import app
    search = typer.main.get_command(app).commands["search"]  # type: ignore[attr-defined]
    phase = next(p for p in search.params if "--phase" in p.opts)
    assert "--max-batch" in phase.help and "--max-batch" in {o for p in search.params for o in p.opts}


def test_budget_gpus_below_one_node_is_one_balanced_line(cli):
    r = cli("search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100,dgx-b200", "--budget-gpus", "4")
    assert r.code == 2 and "dgx-h100 (8), dgx-b200 (8) (GPUs per node); give at least 8" in r.err
    assert r.err.count("(") == r.err.count(")")


def test_model_folder_points_at_its_config_json(cli, tmp_path, monkeypatch):
    """A downloaded Hugging Face snapshot folder: `--model snap` said "unknown model 'snap'" and listed every
    built-in; `--model snap/` said it is not a regular file without naming the file to give."""
    snap = tmp_path / "snap"
    snap.mkdir()
    (snap / "config.json").write_text('{"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, '
                                      '"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, '
                                      '"vocab_size": 128256, "max_position_embeddings": 8192}')
    monkeypatch.chdir(tmp_path)
    for ref in ("snap", "snap/"):
        r = cli("estimate", "--model", ref, "--hardware", "dgx-h100")
        assert r.code == 2 and "is a folder" in r.err and "--model snap/config.json" in r.err, r.err
        assert "built-ins" not in r.err
    assert cli("estimate", "--model", "snap/config.json", "--hardware", "dgx-h100").code == 0


def test_a_hugging_face_hub_id_says_to_download_the_config(cli):
    r = cli("estimate", "--model", "meta-llama/Llama-3.1-8B", "--hardware", "dgx-h100")
    assert r.code == 2 and "does not exist" in r.err
    assert "huggingface-cli download meta-llama/Llama-3.1-8B config.json" in r.err
    assert "or use the built-in llama-3.1-8b" in r.err and len(r.err.strip().splitlines()) == 1
    r = cli("estimate", "--model", "specs/missing.yaml", "--hardware", "dgx-h100")
    assert r.code == 2 and "Hugging Face" not in r.err


def test_option_range_errors_name_the_flag_and_the_value_to_give(cli):
    """'cluster options: field 'num_nodes': ...', 'memory allowance options: field 'fixed_gib': ...' and
    'inference workload options: field 'ttft_slo_s': ...' named fields the user never typed, and no fix."""
    train = ("--model", "llama-3.1-8b", "--hardware", "dgx-h100")
    infer = ("--mode", "infer", *train, "--tp", "1")
    for args, words in (
            ((*train, "--nodes", "100000000"), "--nodes 100000000: Input should be less than or equal to 1000000; "
                                               "give --nodes 1000000 or less"),
            ((*train, "--overhead-gib", "-5"), "--overhead-gib -5.0: Input should be greater than or equal to 0; "
                                               "give --overhead-gib 0.0 or more"),
            ((*train, "--zero", "4", "--tp", "1"), "--zero 4: Input should be less than or equal to 3; "
                                                   "give --zero 3 or less"),
            ((*infer, "--ttft-slo", "0"), "--ttft-slo 0.0: Input should be greater than 0; give --ttft-slo above 0.0"),
            ((*infer, "--kv-dtype", "int4"), "--kv-dtype int4: it must be one of bf16, fp16, fp8; "
                                               "give --kv-dtype with one of them")):
        for cmd in ("estimate",) + (("search",) if "--tp" not in args else ()):
            r = cli(cmd, *args)
            assert r.code == 2 and words in r.err and "field '" not in r.err, r.err
            assert len(r.err.strip().splitlines()) == 1
    r = cli("search", "--mode", "infer", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--kv-dtype", "int4")
    assert r.code == 2 and "--kv-dtype int4: " in r.err and "field '" not in r.err, r.err


def test_collective_gpus_past_the_node_bound_names_gpus(cli):
    r = cli("collective", "--op", "all-reduce", "--size", "1GiB", "--gpus", "1000000000", "--hardware", "dgx-h100")
    assert r.code == 2 and "num_nodes" not in r.err
    assert "--gpus 1000000000 at 8 per node is 125,000,000 nodes" in r.err and "give --gpus 8,000,000 or fewer" in r.err


def test_typed_nodes_1_beside_another_cluster_size_is_refused(cli, tmp_path):
    """`--nodes 2 --budget-gpus 8` was refused but `--nodes 1 --budget-gpus 8` ran (1 is --nodes' default), and
    `--hardware cluster.yaml --nodes 1` ignored --nodes; a typed --nodes is refused whatever its value."""
    base = ("search", "--model", "llama-3.1-8b")
    for hw in ("dgx-h100,dgx-b200", "dgx-h100"):
        r = cli(*base, "--hardware", hw, "--nodes", "1", "--budget-gpus", "8")
        assert r.code == 2 and "--budget-gpus 8 and --nodes 1 each size the cluster; give one" in r.err, r.err
    f = tmp_path / "c.yaml"
    f.write_text("pools:\n  - {system: dgx-h100, nodes: 1}\n  - {system: dgx-a100, nodes: 1}\nfabric: {gb_per_s: 50}\n")
    for mode in ("train", "infer"):
        r = cli(*base, "--mode", mode, "--hardware", f, "--nodes", "1")
        assert r.code == 2 and "lists pools with their nodes; drop --nodes" in r.err, r.err
    assert cli(*base, "--hardware", "dgx-h100", "--budget-gpus", "8", "--json").code == 0


def test_a_dense_search_plan_edited_to_another_tp_is_not_refused_for_expert_tp(cli, tmp_path):
    """search --save wrote a dense model's etp as the tp it found (8); editing plan.tp to 4, as the refusal's
    own 'To mend' line says to, was refused: 'expert tp (8) applies to mixture-of-experts layers'."""
    import json

    plan = tmp_path / "plan.json"
    assert cli("search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1", "--tp", "2",
               "--save", plan).code == 0
    doc = json.loads(plan.read_text())
    doc["plan"].update(tp=4, dp=doc["plan"]["dp"] // 2)
    plan.write_text(json.dumps(doc))
    r = cli("estimate", "--plan", plan, "--json")
    assert r.code == 0, r.err
    assert r.json()["plan"]["tp"] == 4 and "expert tp" not in r.err


def test_a_file_of_the_other_kind_names_the_flag_that_reads_it(cli, tmp_path):
    """A config.json given to --hardware listed every missing and extra key (800+ characters) instead of saying
    it is a model spec; a system profile given to --model listed every missing model key."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    cfg = tmp_path / "config.json"
    cfg.write_text('{"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, '
                   '"num_attention_heads": 32, "vocab_size": 128256, "max_position_embeddings": 8192}')
    for args, words in ((("--model", "llama-3.1-8b", "--hardware", cfg), "is a model spec (model_type, hidden_size"),
                        (("--model", root / "model_specs" / "llama-3.1-8b.yaml", "--hardware", root / "model_specs" /
                          "llama-3.1-8b.yaml"), "not a system profile; give it to --model"),
                        (("--model", root / "hardware_profiles" / "systems" / "dgx-h100.yaml", "--hardware",
                          "dgx-h100"), "is a hardware profile (gpu, gpus_per_node")):
        r = cli("estimate", *args)
        assert r.code == 2 and words in r.err and "Field required" not in r.err, r.err
        assert len(r.err) < 300
