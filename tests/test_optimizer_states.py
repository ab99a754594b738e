"""Adam's master weights and moments in their own dtypes (ParallelPlan.optimizer_master_dtype,
optimizer_moment_dtype): the optimizer states they price, the runs that completed with them, the launchers
that take them and the CLI flags (issue 32, docs/formulas.md#mem.model_states)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from refusal import one_line
import accuracy
from llmplan.cost.memory import stage_memory
from llmplan.export import CannotExpress
from llmplan.planfile import load_plan
from llmplan.specs.plan import MemoryAllowance, ParallelPlan
from llmplan.specs.registry import builtin_models
from llmplan.units import GIB

HERE = Path(__file__).parent
PLANS = HERE / "data" / "plans"


@pytest.mark.parametrize("master,moment,per_param", [
    # Rajbhandari et al. 2020 (ZeRO) §3.1: K = 12 (fp32 master, momentum and variance)
    ("fp32", "fp32", 12.0),
    # DeepSeek-V3 report §3.3.3: fp32 master weights, BF16 first and second moments
    ("fp32", "bf16", 4.0 + 2 * 2.0),
    # Megatron-LM --main-params-dtype fp16 --exp-avg-dtype fp8 --exp-avg-sq-dtype fp8
    ("fp16", "fp8", 2.0 + 2 * 1.0),
    # Apex DistributedFusedAdam with dtype bf16 and no stored params (NeMo 1.x, bf16 model): moments only
    ("none", "bf16", 2 * 2.0),
])
def test_optimizer_bytes_per_parameter_follow_the_state_dtypes(master, moment, per_param):
    plan = ParallelPlan(optimizer_master_dtype=master, optimizer_moment_dtype=moment)
    assert plan.optimizer_bytes == per_param


def test_the_optimizer_part_of_a_rank_scales_with_the_moment_dtype():
    m = builtin_models()["llama-3.1-8b"]
    kw = dict(tp=1, pp=1, dp=8, zero=1, global_batch=8)
    fp32 = stage_memory(m, ParallelPlan(**kw), 0, MemoryAllowance(), 80 * GIB)
    bf16 = stage_memory(m, ParallelPlan(**kw, optimizer_moment_dtype="bf16"), 0, MemoryAllowance(), 80 * GIB)
    assert float(bf16.optimizer) == pytest.approx(float(fp32.optimizer) * 8 / 12, rel=1e-12)
    assert float(bf16.weights) == float(fp32.weights) and float(bf16.gradients) == float(fp32.gradients)


def test_fsdp_fp32_shards_are_the_master_whatever_the_moments():
    # PyTorch FSDP2's fp32 shard is the master copy: the optimizer part is the two moments alone.
    m = builtin_models()["llama-3.1-8b"]
    kw = dict(tp=1, pp=1, dp=8, zero=3, global_batch=8, fp32_param_shards=True)
    fp32 = stage_memory(m, ParallelPlan(**kw), 0, MemoryAllowance(), 80 * GIB)
    bf16 = stage_memory(m, ParallelPlan(**kw, optimizer_moment_dtype="bf16"), 0, MemoryAllowance(), 80 * GIB)
    assert float(bf16.optimizer) == pytest.approx(float(fp32.optimizer) / 2, rel=1e-12)


def test_low_precision_states_with_fp32_training_fail_validation():
    with pytest.raises(ValueError, match="optimizer_moment_dtype bf16 with dtype fp32"):
        ParallelPlan(dtype="fp32", optimizer_moment_dtype="bf16")


@pytest.mark.parametrize("rid", [
    # NeMo 24.07 performance summary (DGX-H100, 80 GB): Nemotron-4 340B on 128 GPUs and Llama 2 70B SFT on 16
    # completed; their launcher configs keep bf16 Adam states (optim.dtype bf16, RECIPE_SETTINGS in accuracy.py)
    "nemo2407-pretrain-nemotron-340b-128gpu-gbs32",
    "nemo2407-sft-llama2-70b-16gpu",
])
def test_completed_nemo_runs_fit_with_their_recipe_optimizer_states(published_runs, row_setup, rid):
    rec = published_runs[rid]
    fam = accuracy.family(rid)
    rows = dict((q, (p, m)) for q, p, m in accuracy.predict(rec, fam))
    assert rows["fits"] == (1.0, 1.0)
    # ... and would not with fp32 states: the mechanism, not slack elsewhere, makes them fit
    m, _, plan = row_setup(rid)
    fp32 = plan.model_copy(update={"optimizer_master_dtype": "fp32", "optimizer_moment_dtype": "fp32"})
    from llmplan.estimate import estimate_training
    system = accuracy.builtin_systems()[accuracy.system_for(rec["hardware"]["gpu"])]
    e = estimate_training(m, accuracy.cluster_of(system, rec["hardware"]["gpus"]), fp32)
    assert not bool(e.memory.fits)


def _pf(update: dict):
    base = load_plan(PLANS / "dense_train.json")
    return dataclasses.replace(base, plan=base.plan.model_copy(update=update))


def test_megatron_takes_the_state_dtypes_through_the_precision_aware_optimizer():
    from llmplan.export import render_all
    from test_export import parse_megatron

    # with bf16 weights Megatron-Core then keeps the master as remainders, which the plan must price
    # (tests/test_param_remainders.py)
    ns, _ = parse_megatron(render_all(_pf({"optimizer_moment_dtype": "bf16", "param_remainders": True}),
                                      "megatron")[0]["megatron_pretrain.sh"])
    assert ns.use_precision_aware_optimizer and ns.exp_avg_dtype == ns.exp_avg_sq_dtype == "bf16"
    assert ns.main_params_dtype is None  # Megatron's default, fp32
    ns, _ = parse_megatron(render_all(_pf({}), "megatron")[0]["megatron_pretrain.sh"])
    assert not ns.use_precision_aware_optimizer


@pytest.mark.parametrize("target,update,reason", [
    ("megatron", {"optimizer_master_dtype": "none"}, "--main-params-dtype takes fp32 or fp16"),
    ("deepspeed", {"optimizer_moment_dtype": "bf16"}, "bf16_master_weights_and_grads"),
    ("torchtitan", {"optimizer_moment_dtype": "bf16"}, "fp32 parameter shards' dtype"),
])
def test_launchers_that_cannot_hold_the_state_dtypes_refuse_with_the_reason(target, update, reason):
    from llmplan.export import render_all

    plan = {"deepspeed": {"sp": False, "vpp": 1, "recompute": "full"}, "torchtitan": {"zero": 3}}.get(target, {})
    with pytest.raises(CannotExpress, match=reason.replace("(", r"\(")):
        render_all(_pf({**plan, **update}), target)


def _cli(cli, *args: str):
    """`llmplan ARGS` in-process through the real entry point (the conftest's cli: exit code, stdout, stderr)."""
    return cli(*args)


def test_cli_estimate_prices_the_moment_dtype_and_rejects_an_unknown_one(cli):
    base = ["estimate", "-m", "llama-3.1-8b", "--hardware", "dgx-h100", "--dp", "8", "--zero", "1", "--json"]
    fp32 = json.loads(_cli(cli, *base).out)["memory"]["optimizer"]
    r = _cli(cli, *base, "--optimizer-moment-dtype", "bf16")
    assert r.code == 0
    assert json.loads(r.out)["memory"]["optimizer"] == pytest.approx(fp32 * 8 / 12, rel=1e-9)
    bad = _cli(cli, "estimate", "-m", "llama-3.1-8b", "--hardware", "dgx-h100", "--optimizer-moment-dtype", "fp4")
    assert bad.code == 2 and "--optimizer-moment-dtype fp4 is not an optimizer moment dtype" in bad.err
    assert "Traceback" not in bad.err


def test_cli_refuses_low_precision_states_with_fp32_training_in_one_line(cli):
    r = _cli(cli, "estimate", "-m", "llama-3.1-8b", "--hardware", "dgx-h100", "--dtype", "fp32",
             "--optimizer-moment-dtype", "bf16")
    assert r.code == 2 and "optimizer_moment_dtype bf16 with dtype fp32" in one_line(r.err)
