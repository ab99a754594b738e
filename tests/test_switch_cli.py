"""The plan switches on the command line: one-line refusals and errors with exit code 2 (the real command)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def test_one_broken_rule_is_one_line(cli):
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--param-remainders", "--zero", "0")
    assert r.code == 2
    assert "Traceback" not in r.err + r.out
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert len(lines) == 1, r.err
    assert "the plan breaks a rule: param_remainders with zero 0" in lines[0] and "use --zero 1" in lines[0]


PLANS = Path(__file__).parent / "data" / "plans"


def edited(tmp_path: Path, case: str, **plan: object) -> Path:
    """A shipped plan file with some plan fields changed (the file is re-checked on export)."""
    doc = json.loads((PLANS / f"{case}.json").read_text())
    doc["plan"].update(plan)
    path = tmp_path / f"{case}-edited.json"
    path.write_text(json.dumps(doc))
    return path


# dense_train: tp 8, pp 4, sp, zero 1, bf16 (Megatron-LM's flags at d98e8a6; Megatron-Bridge 0.6.2;
# torchtitan 0.3).
@pytest.mark.parametrize("changes,target,needle", [
    ({"grad_reduce": "all-reduce"}, "megatron", "ZeRO-1 gradients all-reduced whole"),
    ({"grad_reduce": "all-reduce"}, "megatron-bridge", "ZeRO-1 gradients all-reduced whole"),
    ({"tp_backward_overlap": False}, "megatron", "synchronous backward TP collectives"),
    ({"tp_backward_overlap": False}, "megatron-bridge", "synchronous backward TP collectives"),

    ({"pp_scatter_gather": True, "sp": False}, "megatron", "pipeline scatter/gather without sp (tp 8, pp 4"),
    ({"pp_scatter_gather": True, "sp": False}, "megatron-bridge", "pipeline scatter/gather without sp"),
    ({"pp_scatter_gather": True, "sp": False}, "torchrun", "pipeline scatter/gather without sp"),
    ({"norm_kernel": "two-pass"}, "megatron", "a norm backward in two passes"),
    ({"norm_kernel": "two-pass"}, "megatron-bridge", "a norm backward in two passes"),
])
def test_switch_refusals_exit_2_with_one_line(cli, tmp_path, changes, target, needle):
    refused(cli, tmp_path, "dense_train", changes, target, needle)


# fsdp_train: tp 1, pp 1, zero 3, dp 16, bf16.
@pytest.mark.parametrize("changes,target,needle", [
    ({"tp": 2, "dp": 8, "sp": True, "tp_backward_overlap": False}, "torchtitan", "synchronous backward TP collectives"),
    ({"launch_blocking": True}, "torchtitan-0.2", "CUDA_LAUNCH_BLOCKING=1"),
])
def test_torchtitan_switch_refusals_exit_2_with_one_line(cli, tmp_path, changes, target, needle):
    refused(cli, tmp_path, "fsdp_train", changes, target, needle)


def test_one_rule_a_plan_file_breaks_is_one_line(cli, tmp_path):
    r = cli("export", edited(tmp_path, "dense_train", vpp=5, pp=1, dp=8, pp_layers=None), "--to", "megatron",
            "-o", tmp_path / "out")
    assert r.code == 2
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert len(lines) == 1 and "the plan no longer passes its rules: vpp (5) needs pp > 1" in lines[0], r.err


def refused(cli, tmp_path: Path, case: str, changes: dict, target: str, needle: str) -> None:
    r = cli("export", edited(tmp_path, case, **changes), "--to", target, "-o", tmp_path / "out")
    assert r.code == 2, r.out + r.err
    assert "Traceback" not in r.err + r.out
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert len(lines) == 1 and needle in lines[0] and "cannot express this plan" in lines[0], r.err


def test_pp_scatter_gather_with_sp_is_refused_as_doing_nothing(cli, tmp_path):
    """With sp a stage's output is already split over the TP ranks (comm.pp_scattered): the switch would do
    nothing, so the plan file is refused (check_plan rule pp_scatter_gather_pp), not exported silently."""
    r = cli("export", edited(tmp_path, "dense_train", pp_scatter_gather=True), "--to", "megatron",
            "-o", tmp_path / "out")
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert r.code == 2 and len(lines) == 1, r.err
    assert "pp_scatter_gather with tp 8, pp 4, sp on" in lines[0] and "drop --pp-scatter-gather" in lines[0]


@pytest.mark.parametrize("target,script", [
    ("megatron", "megatron_pretrain.sh"), ("megatron-bridge", "megatron_bridge_pretrain.sh"),
    ("deepspeed", "deepspeed_launch.sh"), ("torchrun", "torchrun.sh"), ("slurm", "job.sbatch"),
])
def test_launch_blocking_exports_the_variable_after_the_sbatch_lines(cli, tmp_path, target, script):
    case = "fsdp_train" if target == "deepspeed" else "dense_train"
    plan = edited(tmp_path, case, launch_blocking=True, **({"zero": 1, "grad_reduce": "all-reduce", "grad_accumulation": "cast-add",
                                                                     "overlap_grad_reduce": False,
                                                                 "overlap_param_gather": False}
                                                              if target == "deepspeed" else {}))
    r = cli("export", plan, "--to", target, "-o", tmp_path / "out")
    assert r.code == 0, r.err
    text = (tmp_path / "out" / script).read_text()
    exports = [x for x in text.splitlines() if x.startswith("export CUDA_LAUNCH_BLOCKING=1")]
    assert len(exports) == 1, text
    # sbatch reads #SBATCH lines only before the first command
    assert text.index("export CUDA_LAUNCH_BLOCKING") > text.index("set -euo pipefail")
    if target == "deepspeed":  # its multi-node runner passes on the variables of .deepspeed_env (2 nodes here)
        assert (tmp_path / "out" / ".deepspeed_env").read_text() == "CUDA_LAUNCH_BLOCKING=1\n"
    plain = cli("export", PLANS / f"{case}.json", "--to", target, "-o", tmp_path / "plain")
    assert plain.code in (0, 2) and "CUDA_LAUNCH_BLOCKING" not in "".join(
        p.read_text() for p in (tmp_path / "plain").glob("*") if p.is_file())


def test_deepspeed_grad_reduce_sets_reduce_scatter(cli, tmp_path):
    """DeepSpeed's zero_optimization.reduce_scatter: false averages the gradients with all-reduce (DeepSpeed
    config-json docs, ZeRO optimizations). bf16 gradients: with fp32 ones ZeRO-1 runs DeepSpeed's BF16_Optimizer,
    which all-reduces whatever the key says (tests/test_export_deepspeed_grads.py)."""
    for value, expected in (("all-reduce", False), ("reduce-scatter", True)):
        out = tmp_path / value
        r = cli("export", edited(tmp_path, "fsdp_train", grad_reduce=value, zero=1, grad_dtype="bf16",
                                 overlap_param_gather=False), "--to", "deepspeed", "-o", out)
        assert r.code == 0, r.err
        assert json.loads((out / "ds_config.json").read_text())["zero_optimization"]["reduce_scatter"] is expected


def test_grad_reduce_and_launch_blocking_flags_reach_the_plan(cli):
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--dp", "8", "--zero", "1",
            "--grad-reduce", "all-reduce", "--launch-blocking", "--json")
    assert r.code == 0, r.err
    plan = r.json()["plan"]
    assert plan["grad_reduce"] == "all-reduce" and plan["launch_blocking"] is True
    base = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--dp", "8", "--zero", "1", "--json")
    assert base.json()["plan"]["grad_reduce"] == "reduce-scatter" and base.json()["plan"]["launch_blocking"] is False
    # an all-reduce moves twice a reduce-scatter's bytes (ring: 2(n-1)/n vs (n-1)/n of the gradient)
    dp, base_dp = r.json()["comm"]["dp"]["transfers"][0], base.json()["comm"]["dp"]["transfers"][0]
    assert (dp["collective"], base_dp["collective"]) == ("all-reduce", "reduce-scatter")
    assert dp["bytes"] == pytest.approx(2 * base_dp["bytes"])
    # CUDA_LAUNCH_BLOCKING idles the GPU between launches
    blocking = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--dp", "8", "--zero", "1",
                   "--launch-blocking", "--json")
    assert blocking.json()["time"]["step_s"] > base.json()["time"]["step_s"]


@pytest.mark.parametrize("args,needle", [
    (["estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--dp", "8", "--zero", "2",
      "--grad-reduce", "all-reduce"], "grad_reduce all-reduce with zero 2: ZeRO-2/3 keep only their gradient shard"),
    (["estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--grad-reduce", "allreduce"],
     "--grad-reduce allreduce: it must be one of reduce-scatter, all-reduce; give --grad-reduce all-reduce"),
    (["search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--grad-reduce", "all-reduce"],
     "--grad-reduce all-reduce with a free --zero: ZeRO-2/3 keep only their gradient shard"),
])
def test_grad_reduce_errors_exit_2_with_one_line(cli, args, needle):
    r = cli(*args)
    assert r.code == 2
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert len(lines) == 1 and needle in lines[0], r.err


def test_megatron_refuses_remainders_under_fp8_current_scaling(cli, tmp_path):
    """Megatron-Core moves the fp32 master into Transformer Engine's FusedAdam (where it can be a remainder) only
    without fp8 or with delayed scaling (OptimizerConfig.use_precision_aware_optimizer_no_fp8_or_ds_fp8); the
    export writes --fp8-recipe tensorwise for current scaling (--fp8-scaling current, which bf16 layers need)."""
    common = ("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--dp", "8", "--zero", "1",
              "--precision", "fp8-tensorwise", "--param-remainders")
    assert cli(*common, "--bf16-layers-start", "1", "--fp8-scaling", "current", "--save",
               tmp_path / "bf16.json").code == 0
    r = cli("export", tmp_path / "bf16.json", "--to", "megatron", "-o", tmp_path / "out")
    assert r.code == 2 and "remainders with fp8 current scaling (--fp8-recipe tensorwise" in r.err, r.err
    assert len([x for x in r.err.splitlines() if x.strip()]) == 1
    assert cli(*common, "--save", tmp_path / "delayed.json").code == 0
    ok = cli("export", tmp_path / "delayed.json", "--to", "megatron", "-o", tmp_path / "ok")
    assert ok.code == 0, ok.err
    script = (tmp_path / "ok" / "megatron_pretrain.sh").read_text()
    assert "--use-precision-aware-optimizer" in script and "--fp8-recipe" not in script


@pytest.mark.parametrize("args,needle", [
    (["--model", "gpt-1.7b", "--swiglu-fp8-input"], "swiglu_fp8_input with gpt-1.7b, whose MLP is not gated"),
    (["--model", "llama-3.1-8b", "--bf16-modules", "attention,mlp"],
     "--bf16-modules mlp: not a module llmplan can keep in bf16; use a comma-separated list of attention, "
     "latent_proj"),
    (["--model", "llama-3.1-8b", "--precision", "fp8-tensorwise", "--bf16-modules", "latent_proj"],
     "bf16_modules latent_proj: llama-3.1-8b has no such module"),
    (["--model", "llama-3.1-8b", "--bf16-modules", "attention", "--bf16-layers-end", "2"],
     "bf16_layers_end 2 and bf16_modules attention with dtype bf16: layers kept in bf16 are an exception"),
    (["--model", "llama-3.1-8b", "--precision", "fp8-tensorwise", "--bf16-layers-start", "20", "--bf16-layers-end", "20"],
     "bf16_layers_start (20) + bf16_layers_end (20) exceeds llama-3.1-8b's 32 layers"),
    (["--model", "llama-3.1-8b", "--precision", "fp8-tensorwise", "--pp", "4", "--dp", "2", "--bf16-layers-end", "9"],
     "bf16_layers_end (9) above the 8 layers of a pipeline stage"),
    (["--model", "llama-3.1-8b", "--precision", "fp8-blockwise", "--param-remainders", "--zero", "1"],
     "param_remainders needs a recipe whose master Transformer Engine keeps (recipe blockwise"),
])
def test_switch_errors_exit_2_with_one_line(cli, args, needle):
    r = cli("estimate", "--hardware", "dgx-h100", *args)
    assert r.code == 2, r.out
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert len(lines) == 1 and needle in lines[0], r.err
    assert "Traceback" not in r.err + r.out


def test_every_switch_option_reaches_the_plan():
    """A switch added to SwitchOptions (and its flag) but not passed on to ParallelPlan would be silently ignored."""
    from llmplan.cli.inputs import SWITCHES_AS_GIVEN
    from llmplan.specs.options import SwitchOptions
    from llmplan.specs.plan import ParallelPlan

    parsed = {"dtype", "grad_dtype", "fp8_params", "bf16_modules", "mxfp8_modules", "recompute_modules", "offload_modules",
              "cp_comm_type", "cp_a2a_size",  # None in search, where they are tried (search.run.cp_comm_variants)
              "bias_dropout_fusion"}  # None: the model's (specs.defaults.default_bias_dropout_fusion)
    elsewhere = {"seq_len", "precision", "axis_order"}  # the plan's length, dtype + recipe, rank placement
    renamed = {"train_cuda_graphs": "cuda_graphs"}  # serving's --cuda-graphs holds the name cuda_graphs
    assert set(SwitchOptions.model_fields) == set(SWITCHES_AS_GIVEN) | parsed | elsewhere | set(renamed)
    assert set(SWITCHES_AS_GIVEN) | parsed | set(renamed.values()) <= set(ParallelPlan.model_fields)


@pytest.mark.parametrize("target,script,folder", [
    ("megatron", "megatron_pretrain.sh", '"$(dirname "$0")/te_precision.yaml"'),
    ("torchrun", "torchrun.sh", '"$(dirname "$0")/te_precision.yaml"'),
    # sbatch runs a spool copy of the batch script: the file is read from the submit folder
    ("slurm", "job.sbatch", '"${SLURM_SUBMIT_DIR:-.}/te_precision.yaml"'),
])
def test_bf16_modules_file_travels_with_every_megatron_script(cli, tmp_path, target, script, folder):
    assert cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--dp", "8", "--zero", "1",
               "--precision", "fp8-tensorwise", "--bf16-modules", "attention", "--save", tmp_path / "p.json").code == 0
    r = cli("export", tmp_path / "p.json", "--to", target, "-o", tmp_path / "out")
    assert r.code == 0, r.err
    assert f"--te-precision-config-file {folder}" in (tmp_path / "out" / script).read_text()
    assert 'pattern: "*.linear_qkv"' in (tmp_path / "out" / "te_precision.yaml").read_text()


# The switches added with ZeRO-3 units, gradient accumulation, expert GEMMs, cuDNN releases and FP8 attention:
# an unknown value is one line naming the flag's choices, exit code 2 (the real command, estimate and search).
@pytest.mark.parametrize("command", ["estimate", "search"])
@pytest.mark.parametrize("flag,value,choices", [
    ("--zero3-unit", "module", ("layer", "tensor")),
    ("--grad-accumulation", "sum", ("fused", "add", "cast-add")),
    ("--expert-gemm", "loop", ("grouped", "per-expert")),
    ("--attention-release", "cudnn-8.9", ("cudnn-9.1", "cudnn-9.4", "cudnn-9.19")),
    ("--grad-reduce", "allreduce", ("reduce-scatter", "all-reduce")),
    ("--norm-kernel", "apex", ("fused-one-pass", "two-pass")),
])
def test_unknown_switch_value_is_one_line_naming_the_choices(cli, command, flag, value, choices):
    r = cli(command, "--model", "llama-3.1-8b", "--hardware", "dgx-h100", flag, value)
    assert r.code == 2 and "Traceback" not in r.err + r.out
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert len(lines) == 1, r.err
    assert value in lines[0] and flag.lstrip("-").replace("-", "_") in lines[0].replace("-", "_"), lines[0]
    assert all(c in lines[0] for c in choices), lines[0]


def test_fp8_attention_outside_an_fp8_recipe_is_one_line(cli):
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--fp8-attention")
    assert r.code == 2 and "Traceback" not in r.err + r.out
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert len(lines) == 1 and "fp8_attention with dtype bf16" in lines[0] and "--precision" in lines[0], r.err

