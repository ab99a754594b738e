"""Megatron-Bridge export of a gradient reduction other than the preset's (export.bridge.reduction_overrides).

Expected values are read from NVIDIA-NeMo/Megatron-Bridge at r0.6.0 6124fbe, src/megatron/bridge/training/
mixed_precision.py: bf16_mixed sets bf16 True, params_dtype / pipeline_dtype torch.bfloat16 and
grad_reduce_in_fp32 True; fp16_mixed fp16 True, torch.half and grad_reduce_in_fp32 False; initial_loss_scale
defaults to 2**32; bf16_with_mxfp8_mixed sets fp8 "e4m3", fp8_recipe "mxfp8", fp8_param_gather True and
reuse_grad_buf_for_mxfp8_param_ag True. config.py runtime_config_update applies a preset only when
mixed_precision is not None, so a preset's name beside `ddp.grad_reduce_in_fp32=false` would overwrite it."""

from __future__ import annotations

import dataclasses
import json

import pytest

from llmplan.export import render_all
from llmplan.planfile import load_plan
from tests.test_export_bridge import (PLANS, SCRIPT, assert_recorded_fields_of_their_type, hydra_applied,
                                      overrides)


def bridge_args(**changes) -> list[str]:
    pf = load_plan(PLANS / "dense_train.json")
    pf = dataclasses.replace(pf, plan=pf.plan.model_copy(update=changes))
    return overrides(render_all(pf, "megatron-bridge")[0][SCRIPT])


BF16_LINES = ["mixed_precision=null", "model.bf16=true", "model.fp16=false", "model.params_dtype=bfloat16",
              "model.pipeline_dtype=bfloat16", "optimizer.bf16=true", "optimizer.params_dtype=bfloat16",
              "optimizer.initial_loss_scale=4294967296", "ddp.grad_reduce_in_fp32=false"]


def test_bf16_gradients_write_the_preset_out_with_bf16_reduction():
    args = bridge_args(grad_dtype="bf16")
    for line in BF16_LINES:
        assert line in args, line
    assert not any(a.startswith("mixed_precision=bf16") or a.startswith("mixed_precision.") for a in args)
    assert_recorded_fields_of_their_type(args)
    for as_dataclass in (True, False):  # the recipe holds a MixedPrecisionConfig or the preset's name
        cfg = hydra_applied(args, as_dataclass)
        assert cfg["mixed_precision"] is None and cfg["ddp"]["grad_reduce_in_fp32"] is False
        assert (cfg["model"]["bf16"], cfg["model"]["params_dtype"]) == (True, "bfloat16")


def test_fp32_gradients_keep_the_preset_name():
    # dense_train reduces fp32 gradients, as bf16_mixed does: the preset by name, nothing written out
    args = bridge_args()
    assert "mixed_precision=bf16_mixed" in args
    assert not any(a.startswith("ddp.grad_reduce_in_fp32") or a == "mixed_precision=null" for a in args)


def test_fp16_with_fp32_gradients_writes_fp16_mixed_out():
    args = bridge_args(dtype="fp16", grad_dtype="fp32")
    for line in ("mixed_precision=null", "model.fp16=true", "model.bf16=false", "model.params_dtype=float16",
                 "optimizer.fp16=true", "optimizer.loss_scale=null", "optimizer.hysteresis=2",
                 "ddp.grad_reduce_in_fp32=true"):
        assert line in args, line
    assert "mixed_precision=fp16_mixed" in bridge_args(dtype="fp16", grad_dtype="bf16")


def test_mxfp8_with_bf16_gradients_folds_the_exports_own_fields_in():
    args = bridge_args(dtype="fp8", recipe="mxfp8", fp8_params=True, grad_dtype="bf16", fp8_attention=True)
    for line in ("model.fp8=e4m3", "model.fp8_recipe=mxfp8", "model.fp8_param=true", "ddp.fp8_param_gather=true",
                 "ddp.reuse_grad_buf_for_mxfp8_param_ag=true", "optimizer.reuse_grad_buf_for_mxfp8_param_ag=true",
                 "model.fp8_dot_product_attention=true", "ddp.grad_reduce_in_fp32=false"):
        assert line in args, line
    assert not any(a.startswith("mixed_precision.") for a in args)
    assert_recorded_fields_of_their_type(args)
    for as_dataclass in (True, False):
        assert hydra_applied(args, as_dataclass)["model"]["fp8_dot_product_attention"] is True


def test_an_amended_preset_is_written_out_so_that_hydra_applies_it():
    # fp32 gradients as the preset, fp8 attention on: the name followed by mixed_precision.fp8_dot_product_attention
    # failed in Hydra's struct mode ("Could not override"); the fields written out apply
    args = bridge_args(dtype="fp8", recipe="mxfp8", fp8_params=True, fp8_attention=True)
    assert "mixed_precision=null" in args and "ddp.grad_reduce_in_fp32=true" in args
    for as_dataclass in (True, False):
        cfg = hydra_applied(args, as_dataclass)
        assert cfg["model"]["fp8_dot_product_attention"] is True and cfg["ddp"]["grad_reduce_in_fp32"] is True


def test_a_searchs_bf16_gradient_plan_exports(cli, tmp_path):
    path = tmp_path / "best.json"
    r = cli("search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--global-batch", "64", "--seq-len",
            "4096", "--grad-dtype", "bf16", "--target", "megatron-bridge", "--top", "1", "--save", path)
    assert r.code == 0, r.err
    assert json.loads(path.read_text())["plan"]["grad_dtype"] == "bf16"
    e = cli("export", path, "--to", "megatron-bridge", "-o", tmp_path / "out")
    assert e.code == 0, e.err
    text = (tmp_path / "out" / SCRIPT).read_text()
    assert "'ddp.grad_reduce_in_fp32=false'" in text and "'mixed_precision=null'" in text


@pytest.mark.parametrize("changes,line", [
    ({"dtype": "fp32"}, "error: megatron-bridge cannot express this plan: fp32 training (Megatron-Bridge's "
     "mixed-precision presets: bf16, fp16, fp8 tensorwise, blockwise, mxfp8, nvfp4); re-plan with --precision bf16 "
     "or fp8-tensorwise, or export to torchtitan"),
])
def test_what_is_still_refused(cli, tmp_path, changes, line):
    doc = json.loads((PLANS / "dense_train.json").read_text())
    doc["plan"].update(changes)
    (tmp_path / "p.json").write_text(json.dumps(doc))
    r = cli("export", tmp_path / "p.json", "--to", "megatron-bridge", "-o", tmp_path / "out")
    assert r.code == 2 and " ".join(r.err.split()) == line
