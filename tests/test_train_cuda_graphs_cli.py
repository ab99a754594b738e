"""Training's CUDA graphs on the command line: estimate / search --train-cuda-graphs none | layers | full-iteration
(ParallelPlan.cuda_graphs; estimate sets the plan's value, search pins it), beside serving's --cuda-graphs /
--no-cuda-graphs (ServeJob.cuda_graphs, --mode infer), which keeps its name and meaning. A combination
Megatron-Core refuses is check_plan's rule (cuda_graphs_recompute, cuda_graphs_moe: NVIDIA/Megatron-LM
transformer_config.py at d98e8a6, "full recompute is only supported with full iteration CUDA graph"; the alltoall
dispatcher's host wait on its token counts), one line and exit 2."""

from __future__ import annotations

import json

import pytest

DENSE = ("--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1")
ESTIMATE = ("estimate", *DENSE, "--tp", "2", "--global-batch", "64", "--seq-len", "4096", "--json")
MOE = ("--model", "mixtral-8x7b", "--hardware", "dgx-h100", "--nodes", "2")


@pytest.mark.parametrize("value", ["none", "layers", "full-iteration"])
def test_estimate_sets_the_plans_cuda_graphs(cli, tmp_path, value):
    path = tmp_path / "plan.json"
    r = cli(*ESTIMATE, "--train-cuda-graphs", value, "--save", path)
    assert r.code == 0, r.err
    assert r.json()["plan"]["cuda_graphs"] == value
    assert json.loads(path.read_text())["plan"]["cuda_graphs"] == value
    # the saved plan prices as the flag did
    again = cli("estimate", "--plan", path, "--json")
    assert again.code == 0 and again.json()["plan"]["cuda_graphs"] == value


def test_the_default_is_no_graphs_and_graphs_take_launches_off_the_step(cli):
    none, layers = cli(*ESTIMATE), cli(*ESTIMATE, "--train-cuda-graphs", "layers")
    assert none.code == 0 and layers.code == 0
    assert none.json()["plan"]["cuda_graphs"] == "none"
    # one launch per graphed part instead of one per kernel: a shorter step (docs/formulas.md#step.host_sync)
    assert layers.json()["time"]["step_s"] < none.json()["time"]["step_s"]


def test_an_unknown_value_is_one_line_exit_2(cli):
    line = cli(*ESTIMATE, "--train-cuda-graphs", "full").refusal()
    assert "--train-cuda-graphs full" in line and "none, layers, full-iteration" in line


def test_layers_with_full_recompute_breaks_check_plans_rule(cli):
    line = cli(*ESTIMATE, "--train-cuda-graphs", "layers", "--recompute", "full").refusal()
    assert "cuda_graphs layers with recompute full" in line
    assert "--train-cuda-graphs full-iteration or none" in line  # the fix names the flag the user has
    assert cli(*ESTIMATE, "--train-cuda-graphs", "full-iteration", "--recompute", "full").code == 0


def test_full_iteration_over_a_dropless_alltoall_moe_is_refused(cli):
    line = cli("estimate", *MOE, "--tp", "2", "--ep", "8", "--train-cuda-graphs", "full-iteration").refusal()
    assert "cuda_graphs full-iteration with a dropless alltoall MoE dispatcher (mixtral-8x7b)" in line
    assert "--train-cuda-graphs layers / none" in line


def test_search_pins_the_value(cli):
    r = cli("search", *DENSE, "--global-batch", "64", "--seq-len", "4096", "--train-cuda-graphs", "layers",
            "--top", "3", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["plans"] and {p["plan"]["cuda_graphs"] for p in doc["plans"]} == {"layers"}
    # the full-recompute plans Megatron-Core refuses beside per-layer graphs are cut by check_plan's rule
    assert doc["pruned"].get("cuda_graphs_recompute", 0) > 0
    assert all(p["plan"]["recompute"] != "full" for p in doc["plans"])


def test_search_refuses_switches_that_break_a_rule(cli):
    line = cli("search", *MOE, "--train-cuda-graphs", "full-iteration", "--top", "1").refusal()
    assert "cuda_graphs_moe" in line and "--train-cuda-graphs layers / none" in line


def test_serving_keeps_its_boolean_and_each_flag_names_the_other(cli):
    serve = ("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--mode", "infer", "--batch", "8",
             "--json")
    on, off = cli(*serve), cli(*serve, "--no-cuda-graphs")
    assert on.code == 0 and off.code == 0, (on.err, off.err)
    assert on.json() != off.json()  # eager decode prices otherwise
    line = cli(*serve, "--train-cuda-graphs", "layers").refusal()
    assert "applies to training" in line and "--cuda-graphs / --no-cuda-graphs" in line
    line = cli(*ESTIMATE, "--no-cuda-graphs").refusal()
    assert "applies to serving" in line and "--train-cuda-graphs" in line
    for command in ("estimate", "search"):
        text = cli(command, "--help").out
        assert "--train-cuda-graphs" in text and "--cuda-graphs" in text


def test_a_plan_file_breaking_a_graph_rule_names_the_key_the_flag_sets(cli, tmp_path):
    # the rules' fixes name --train-cuda-graphs; the file holds plan.cuda_graphs (not a key of the flag's name)
    path = tmp_path / "plan.json"
    assert cli(*ESTIMATE, "--recompute", "full", "--save", path).code == 0
    doc = json.loads(path.read_text())
    doc["plan"]["cuda_graphs"] = "layers"
    path.write_text(json.dumps(doc))
    line = cli("estimate", "--plan", path).refusal()
    assert "cuda_graphs layers with recompute full" in line and "--train-cuda-graphs is plan.cuda_graphs" in line
