"""Megatron-Core's store_param_remainders (ParallelPlan.param_remainders): the fp32 master kept as 16-bit
remainders beside the bf16 weights, where it applies, how the memory table and JSON show it, what the
launchers write or refuse, and the validation rows that ran it (issue 32, docs/formulas.md#mem.param_remainders).

Published numbers: Megatron-Core (NVIDIA/Megatron-LM d98e8a6) megatron/core/optimizer/distrib_optimizer.py
allocates the master as torch.int16 (2 bytes) when store_param_remainders and bf16, torch.float32 (4 bytes)
otherwise; Transformer Engine fused_adam.py: "Works only when param type is BF16 and master weight type is
FP32". Rajbhandari et al. 2020 (ZeRO) §3.1: K = 12 with the fp32 master and two fp32 moments."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import accuracy
from llmplan.cost.memory import stage_memory
from llmplan.cost.model_states import optimizer_parts
from llmplan.export import CannotExpress, render_all
from llmplan.planfile import load_plan
from llmplan.search.grid import Workload
from llmplan.search.run import switch_variants
from llmplan.specs.check import check_plan
from llmplan.specs.plan import MemoryAllowance, ParallelPlan
from llmplan.specs.registry import builtin_models
from llmplan.units import GIB

PLANS = Path(__file__).parent / "data" / "plans"
INT16, FP32 = 2.0, 4.0  # torch.int16 / torch.float32 element sizes (distrib_optimizer.py's master dtypes)


def _pf(**update):
    base = load_plan(PLANS / "dense_train.json")
    return dataclasses.replace(base, plan=base.plan.model_copy(update=update))


def test_master_is_two_bytes_and_adam_ten():
    on, off = ParallelPlan(param_remainders=True), ParallelPlan()
    assert on.master_bytes == INT16 and off.master_bytes == FP32
    assert off.optimizer_bytes == 12.0  # ZeRO §3.1
    assert on.optimizer_bytes == INT16 + 2 * FP32
    # with bf16 moments as well (Megatron-Bridge's DeepSeek / Qwen3 presets): 2 + 2 + 2
    assert ParallelPlan(param_remainders=True, optimizer_moment_dtype="bf16").optimizer_bytes == 6.0
    # fp8 training with bf16 weights (the tensorwise recipe, Megatron's delayed scaling) keeps the remainder
    assert ParallelPlan(param_remainders=True, dtype="fp8").master_bytes == INT16


def test_memory_falls_by_two_bytes_per_optimizer_shard_and_parts_sum():
    m = builtin_models()["llama-3.1-70b"]
    kw = dict(tp=8, pp=4, dp=2, zero=1, global_batch=128)
    off = stage_memory(m, ParallelPlan(**kw), 0, MemoryAllowance(), 80 * GIB)
    on = stage_memory(m, ParallelPlan(**kw, param_remainders=True), 0, MemoryAllowance(), 80 * GIB)
    shard = off.params_on_rank / 2  # ZeRO-1 over dp 2
    assert off.optimizer - on.optimizer == pytest.approx(shard * (FP32 - INT16), rel=1e-9)
    for plan, mem in ((ParallelPlan(**kw), off), (ParallelPlan(**kw, param_remainders=True), on)):
        parts = optimizer_parts(plan, mem.optimizer)
        assert parts.total == pytest.approx(mem.optimizer, rel=1e-12)
        assert parts.master == pytest.approx(shard * plan.master_bytes, rel=1e-9)
        assert mem.total == pytest.approx(sum(getattr(mem, p) for p in mem.PARTS), rel=1e-12)
    # FSDP's fp32 shard is the master: the optimizer holds moments only
    fsdp = ParallelPlan(tp=8, pp=1, dp=8, zero=3, global_batch=128, fp32_param_shards=True)
    assert optimizer_parts(fsdp, 100.0).master == 0.0


@pytest.mark.parametrize("update,needle", [
    ({"dtype": "fp16"}, "bf16 weights (dtype is fp16)"),
    ({"optimizer_master_dtype": "fp16"}, "an fp32 master"),
    ({"dtype": "fp8", "recipe": "mxfp8"}, "recipe mxfp8"),
    ({"dtype": "fp8", "recipe": "blockwise"}, "recipe blockwise"),
])
def test_plans_it_cannot_apply_to_are_refused(update, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        ParallelPlan(param_remainders=True, **update)


@pytest.mark.parametrize("update,applies", [
    ({"zero": 0}, False), ({"zero": 1}, True), ({"zero": 3}, False),
    ({"zero": 1, "dtype": "fp8", "fp8_params": True}, False),  # --fp8-param-gather: no bf16 weight to complete
])
def test_check_plan_needs_the_distributed_optimizer_and_bf16_weights(update, applies):
    m = builtin_models()["llama-3.1-8b"]
    plan = ParallelPlan(dp=8, global_batch=8, param_remainders=True, **update)
    rules = {v.rule: v.message for v in check_plan(m, plan)}
    assert ("param_remainders" not in rules) == applies
    if not applies:
        assert "drop --param-remainders" in rules["param_remainders"]


def test_search_does_not_pair_it_with_fp8_primary_weights():
    w = Workload(dtype="fp8", param_remainders=True)
    assert {v["fp8_params"] for v in switch_variants(w, False, False)} == {False}
    assert {v["fp8_params"] for v in switch_variants(Workload(dtype="fp8"), False, False)} == {False, True}


def test_megatron_turns_the_precision_aware_optimizer_on_for_it():
    from test_export import parse_megatron

    ns, _ = parse_megatron(render_all(_pf(param_remainders=True), "megatron")[0]["megatron_pretrain.sh"])
    assert ns.use_precision_aware_optimizer  # store_param_remainders is on by default with it
    assert ns.main_params_dtype is None and ns.exp_avg_dtype is None  # fp32, Megatron's defaults
    ns, _ = parse_megatron(render_all(_pf(), "megatron")[0]["megatron_pretrain.sh"])
    assert not ns.use_precision_aware_optimizer


def test_megatron_refuses_what_it_would_run_with_remainders_but_the_plan_prices_whole():
    with pytest.raises(CannotExpress, match="re-plan with --param-remainders, or export to megatron-bridge"):
        render_all(_pf(optimizer_moment_dtype="bf16"), "megatron")
    # where Megatron-Core keeps its own fp32 master (MXFP8) or the weights are fp16, no remainder: exported
    for update in ({"dtype": "fp8", "recipe": "mxfp8"}, {"dtype": "fp16"}):
        assert render_all(_pf(optimizer_moment_dtype="bf16", **update), "megatron")[0]
    with pytest.raises(CannotExpress, match="only in the distributed optimizer"):
        render_all(_pf(optimizer_moment_dtype="bf16", param_remainders=True, zero=0), "megatron")


def test_megatron_bridge_writes_the_setting_as_the_plan_prices_it():
    from test_export_bridge import RECORD, overrides, script

    assert "store_param_remainders" in RECORD["sections"]["optimizer"]["fields"]  # recorded OptimizerConfig field
    on = overrides(script("dense_train", param_remainders=True))
    assert "optimizer.use_precision_aware_optimizer=true" in on and "optimizer.store_param_remainders=true" in on
    whole = overrides(script("dense_train", optimizer_moment_dtype="bf16"))
    assert "optimizer.store_param_remainders=false" in whole
    assert not any(a.startswith("optimizer.store_param_remainders") for a in overrides(script("dense_train")))


@pytest.mark.parametrize("target,update,needle", [
    ("deepspeed", {"sp": False, "vpp": 1, "recompute": "full"}, "DeepSpeed keeps a whole fp32 master"),
    ("torchtitan", {"zero": 2}, "fp32 parameter shards are the master"),
])
def test_launchers_without_it_refuse(target, update, needle):
    with pytest.raises(CannotExpress, match=needle):
        render_all(_pf(param_remainders=True, **update), target)


def _cli(cli, *args: str):
    """`llmplan ARGS` in-process through the real entry point (the conftest's cli: exit code, stdout, stderr)."""
    return cli(*args)


def test_cli_json_and_table_show_the_master_as_remainders(cli):
    base = ["estimate", "-m", "llama-3.1-8b", "--hardware", "dgx-h100", "--dp", "8", "--zero", "1"]
    off = json.loads(_cli(cli, *base, "--json").out)
    r = _cli(cli, *base, "--json", "--param-remainders")
    assert r.code == 0
    on = json.loads(r.out)
    assert on["plan"]["param_remainders"] is True and off["plan"]["param_remainders"] is False
    parts = on["memory"]["optimizer_parts"]
    assert parts["master"] + parts["moments"] == pytest.approx(on["memory"]["optimizer"], rel=1e-12)
    assert parts["master"] == pytest.approx(off["memory"]["optimizer_parts"]["master"] * INT16 / FP32, rel=1e-9)
    assert parts["moments"] == pytest.approx(off["memory"]["optimizer_parts"]["moments"], rel=1e-9)
    table = _cli(cli, *base, "--param-remainders").out
    assert "master as remainders" in table and "mem.param_remainders" in table
    assert max(len(line) for line in table.splitlines()) <= 80


@pytest.mark.parametrize("extra,needle", [
    (["--dtype", "fp16"], "param_remainders needs bf16 weights (dtype is fp16)"),
    (["--zero", "0"], "param_remainders with zero 0"),
])
def test_cli_refuses_in_one_line(cli, extra, needle):
    r = _cli(cli, "estimate", "-m", "llama-3.1-8b", "--hardware", "dgx-h100", "--dp", "8", "--param-remainders", *extra)
    assert r.code == 2 and needle in r.err and "Traceback" not in r.err


def test_validation_rows_that_ran_it(published_runs):
    """Megatron-Bridge's performance scripts turn the precision-aware optimizer on for bf16 Adam runs
    (v0.1.0rc4 run_script.py ... v0.6.0 run_script.py), on Megatron-Core >= 0.14: their bf16 ZeRO-1 rows
    keep remainders; so do NeMo 24.07's rows on Apex's distributed_fused_adam with fp32 states beside bf16
    weights (NeMo r2.0.0rc1 setup_optimization: store_param_remainders), not those with bf16 states or
    fp8_params; other fp8 rows do not."""
    records = published_runs
    seen = {True: 0, False: 0}
    for rid, rec in records.items():
        fam = accuracy.family(rid)
        described = "layers" in rec["model"] or rec["model"].get("name") in accuracy.MBRIDGE_NAMED_MODELS
        if fam not in ("bridge", "mbridge-dense", "mbridge-moe", "nemo2407") or "tp" not in rec.get("parallel", {}) \
                or not described or accuracy.skip_reason(rec):
            continue
        plan = accuracy.plan_for(rec, fam, rec["hardware"]["gpus"])
        expect = plan.zero == 1 and (plan.dtype == "bf16" if fam != "nemo2407"
                                     else plan.optimizer_master_dtype == "fp32" and not plan.fp8_params)
        assert plan.param_remainders == expect, rid
        seen[expect] += 1
    assert seen[True] > 0 and seen[False] > 0


@pytest.mark.parametrize("rid, remainders, master", [
    # NeMo-Framework-Launcher 24.07 conf/training/gpt3/20b.yaml: distributed_fused_adam, no optim.dtype (fp32),
    # megatron_amp_O2 with bf16, no fp8_params -> NeMo r2.0.0rc1 setup_optimization: store_param_remainders
    ("nemo2407-pretrain-gpt3-20b-64gpu-gbs256", True, "fp32"),
    ("nemo2407-pretrain-llama2-70b-64gpu-gbs128", True, "fp32"),
    # nemotron_340b.yaml: optim.dtype bf16 -> store_params False, no remainder (the optimizer updates the weights)
    ("nemo2407-pretrain-nemotron-340b-128gpu-gbs32", False, "none"),
    # the SFT scripts' fp8_params -> store_params True (a bf16 master), no remainder
    ("nemo2407-sft-llama2-7b-8gpu", False, "bf16"),
])
def test_nemo_apex_rows_read_the_remainders_nemo_sets(row_plan, rid, remainders, master):
    plan = row_plan(rid)
    assert plan.param_remainders is remainders and plan.optimizer_master_dtype == master


def test_nemo_gpt3_20b_master_is_an_int16_shard_over_dp(row_setup):
    # Apex distributed_fused_adam.py at f3f049246e: param_remainders_shard torch.int16, exp_avg / exp_avg_sq in
    # the optimizer dtype (fp32), each of shard_size = bucket / distributed_size (dp 32 here)
    m, c, plan = row_setup("nemo2407-pretrain-gpt3-20b-64gpu-gbs256")
    mem = stage_memory(m, plan, 0, MemoryAllowance(), 80 * GIB)
    assert plan.dp == 32
    assert mem.optimizer == pytest.approx(mem.params_on_rank / 32 * (INT16 + 2 * FP32), rel=1e-9)
