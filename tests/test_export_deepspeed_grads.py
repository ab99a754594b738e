"""`llmplan export --to deepspeed` keeps the plan's gradient dtype and reduction as DeepSpeed would run them.

DeepSpeed 0.19.8 picks its optimizer wrapper from (model dtype, data_types.grad_accum_dtype, ZeRO stage,
pipeline engine) in deepspeed/runtime/engine.py DeepSpeedEngine._do_optimizer_sanity_check (github.com/
deepspeedai/DeepSpeed): bf16 + fp32 accumulation + ZeRO-1 runs BF16_Optimizer, which all-reduces the whole
fp32 gradient; other ZeRO stages keep gradients in grad_accum_dtype; without ZeRO the two dtypes must match,
and bf16 under the pipeline engine runs BF16_Optimizer (ZeRO-1's sharded master). Each case runs the real CLI.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

HERE = Path(__file__).parent
BASE = HERE / "data" / "plans" / "fsdp_train.json"  # bf16, tp 1, pp 1, dp 16, ZeRO-3, fp32 gradients


def plan_file(tmp_path: Path, **plan: object) -> Path:
    doc = json.loads(BASE.read_text())
    doc["plan"].update(plan)
    if doc["plan"].get("zero") == 0:
        doc["plan"]["overlap_param_gather"] = False
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    return path


PIPE = {"pp": 2, "dp": 8}
CAST = {"grad_accumulation": "cast-add"}


@pytest.mark.parametrize("plan,grad,reduce_scatter,optimizer", [
    # bf16 + fp32 accumulation + ZeRO-1: BF16_Optimizer, the whole fp32 gradient all-reduced in fp32
    # (and casts each micro-batch's bf16 gradient to fp32 before adding it: update_hp_grads, cast-add)
    ({"zero": 1, "grad_dtype": "fp32", "grad_reduce": "all-reduce", **CAST}, "fp32", False, "BF16_Optimizer"),
    ({"zero": 1, "grad_dtype": "fp32", "grad_reduce": "all-reduce", **PIPE, **CAST}, "fp32", False,
     "BF16_Optimizer"),
    # bf16 gradients with ZeRO-1: the ZeRO optimizer, reduce-scatter or all-reduce as planned
    ({"zero": 1, "grad_dtype": "bf16"}, "bf16", True, "ZeRO"),
    ({"zero": 1, "grad_dtype": "bf16", "grad_reduce": "all-reduce"}, "bf16", False, "ZeRO"),
    # ZeRO-2/3 keep a gradient partition in grad_accum_dtype
    ({"zero": 2, "grad_dtype": "fp32"}, "fp32", True, "ZeRO"),
    ({"zero": 3, "grad_dtype": "fp32"}, "fp32", True, "ZeRO"),
    ({"zero": 3, "grad_dtype": "bf16"}, "bf16", True, "ZeRO"),
    # no ZeRO, bf16 gradients, no pipeline: DDP_BFLOAT16
    ({"zero": 0, "grad_dtype": "bf16"}, "bf16", True, "DDP_BFLOAT16"),
    # fp16 with fp32 accumulation under ZeRO-1: the ZeRO optimizer's fp32 grad_accum buffers
    ({"zero": 1, "dtype": "fp16", "grad_dtype": "fp32", **CAST}, "fp32", True, "ZeRO"),
    ({"zero": 1, "dtype": "fp16", "grad_dtype": "bf16"}, "fp16", True, "ZeRO"),
])
def test_deepspeed_writes_the_gradient_dtype(cli, tmp_path, plan, grad, reduce_scatter, optimizer):
    r = cli("export", plan_file(tmp_path, **plan), "--to", "deepspeed", "-o", tmp_path / "out")
    assert r.code == 0, r.err
    cfg = json.loads((tmp_path / "out" / "ds_config.json").read_text())
    assert cfg["data_types"] == {"grad_accum_dtype": grad}
    assert cfg["communication_data_type"] == grad  # engine.allreduce_bucket casts to it (default: model dtype)
    assert cfg["zero_optimization"]["stage"] == plan["zero"]
    assert cfg["zero_optimization"]["reduce_scatter"] is reduce_scatter
    # the wrapper DeepSpeed's rule picks (engine.py _do_optimizer_sanity_check), restated from the config
    model = "bf16" if cfg["bf16"]["enabled"] else "fp16"
    zero = cfg["zero_optimization"]["stage"]
    picked = ("BF16_Optimizer" if zero == 1 and model == "bf16" and grad == "fp32" else "ZeRO") if zero else (
        "DDP_BFLOAT16" if model == grad == "bf16" and plan.get("pp", 1) == 1 else "other")
    assert picked == optimizer


def test_deepspeed_fp32_training_keeps_the_defaults(cli, tmp_path):
    r = cli("export", plan_file(tmp_path, zero=2, dtype="fp32"), "--to", "deepspeed", "-o", tmp_path / "out")
    assert r.code == 0, r.err
    cfg = json.loads((tmp_path / "out" / "ds_config.json").read_text())
    assert "data_types" not in cfg and "communication_data_type" not in cfg
    assert not cfg["bf16"]["enabled"] and not cfg["fp16"]["enabled"]


@pytest.mark.parametrize("plan,needles", [
    ({"zero": 1, "grad_dtype": "fp32", "grad_reduce": "reduce-scatter"},
     ["ZeRO-1 fp32 gradients reduce-scattered", "grad_reduce reduce-scatter", "BF16_Optimizer",
      "--grad-reduce all-reduce", "--grad-dtype bf16"]),
    ({"zero": 1, "grad_dtype": "fp32", **PIPE}, ["ZeRO-1 fp32 gradients reduce-scattered", "--grad-reduce all-reduce"]),
    ({"zero": 0, "grad_dtype": "fp32"},
     ["fp32 gradients with bf16 weights and ZeRO stage 0", "unsupported mix", "--grad-dtype bf16"]),
    ({"zero": 0, "dtype": "fp16", "grad_dtype": "fp32"}, ["fp32 gradients with fp16 weights", "--grad-dtype bf16"]),
    ({"zero": 0, "grad_dtype": "bf16", **PIPE},
     ["ZeRO stage 0 with bf16 under the pipeline engine (pp 2, dp 8", "BF16_Optimizer",
      "--zero 1 --grad-reduce all-reduce"]),
])
def test_deepspeed_refuses_gradients_it_runs_otherwise(cli, tmp_path, plan, needles):
    r = cli("export", plan_file(tmp_path, **plan), "--to", "deepspeed", "-o", tmp_path / "out")
    assert r.code == 2, r.out
    line = r.err.strip()
    assert "\n" not in line and "Traceback" not in line
    assert "runtime/engine.py _do_optimizer_sanity_check" in line
    for needle in needles:
        assert needle in line, line
    assert not (tmp_path / "out").exists()


def test_search_then_export_deepspeed(cli, tmp_path):
    # The search tries fp32 and bf16 gradients; a ZeRO-1 plan with pinned fp32 gradients reduce-scatters by
    # default, which DeepSpeed runs as BF16_Optimizer's all-reduce: refused, and the fix the line names works.
    common = ("--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--zero", "1", "--tp", "1", "--pp", "1",
              "--cp", "1")
    plan = tmp_path / "p.json"
    assert cli("search", *common, "--save", plan).code == 0
    # the default accumulation is Megatron's, fused into the GEMM; DeepSpeed's autograd adds: the search's plan
    # exports, its files saying so with the flag that prices it
    r = cli("export", plan, "--to", "deepspeed", "-o", tmp_path / "a0")
    assert r.code == 0, r.err
    assert "re-plan with --grad-accumulation add to price it" in (tmp_path / "a0" / "ds_config.json").read_text()
    assert cli("search", *common, "--grad-accumulation", "add", "--save", plan, "--force").code == 0
    assert cli("export", plan, "--to", "deepspeed", "-o", tmp_path / "a").code == 0
    assert cli("search", *common, "--grad-dtype", "fp32", "--save", plan, "--force").code == 0
    r = cli("export", plan, "--to", "deepspeed", "-o", tmp_path / "b")
    assert r.code == 2 and "--grad-reduce all-reduce" in r.err
    assert cli("search", *common, "--grad-dtype", "fp32", "--grad-reduce", "all-reduce", "--save", plan,
               "--force").code == 0
    r = cli("export", plan, "--to", "deepspeed", "-o", tmp_path / "c0")
    assert r.code == 0 and "runs cast-add" in (tmp_path / "c0" / "ds_config.json").read_text()  # BF16_Optimizer
    assert cli("search", *common, "--grad-dtype", "fp32", "--grad-reduce", "all-reduce", "--grad-accumulation",
               "add", "--save", plan, "--force").code == 0
    r = cli("export", plan, "--to", "deepspeed", "-o", tmp_path / "c1")
    assert r.code == 2 and "--grad-accumulation cast-add" in r.err  # named otherwise than it runs: refused
    assert cli("search", *common, "--grad-dtype", "fp32", "--grad-reduce", "all-reduce", "--grad-accumulation",
               "cast-add", "--save", plan, "--force").code == 0
    assert cli("export", plan, "--to", "deepspeed", "-o", tmp_path / "c").code == 0
    cfg = json.loads((tmp_path / "c" / "ds_config.json").read_text())
    assert cfg["data_types"] == {"grad_accum_dtype": "fp32"} and cfg["zero_optimization"]["reduce_scatter"] is False
