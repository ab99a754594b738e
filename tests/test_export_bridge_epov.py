"""The EP all-to-all overlap (ParallelPlan.ep_comm_overlap) and its delayed weight gradients (delay_wgrad) in the
Megatron-Bridge export, and check_plan's rules for them.

Sources: Megatron-Bridge's performance presets turn the overlap on with comm_overlap.overlap_moe_expert_parallel_comm
and comm_overlap.delay_wgrad_compute both True and model.moe_shared_expert_overlap False
(NVIDIA-NeMo/Megatron-Bridge v0.3.0 - v0.6.0, scripts/performance/utils/overrides.py, _set_moe_a2a_overlap_overrides);
CommOverlapConfig.setup copies them onto the model config (training/comm_overlap.py at 6124fbe, _apply_cfgs), where
Megatron-Core's TransformerConfig.__post_init__ asserts EP > 1, an alltoall / flex dispatcher, virtual stages when
PP > 1, no full recompute, no moe recompute, no shared-expert overlap, at most one MTP layer and a bf16 / fp16 model
(NVIDIA/Megatron-LM cd4afffa6, megatron/core/transformer/transformer_config.py)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from llmplan.export import render_all
from llmplan.export.common import CannotExpress
from llmplan.planfile import load_plan
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models
from tests.test_export_bridge import (PLANS, SCRIPT, assert_recorded_fields_of_their_type, hydra_applied,
                                      overrides)

# Megatron-Bridge's DeepSeek-V3 H100 layout (PP 8, VPP 4: set_deepseek_v3_pipeline_model_parallel_layout
# "Et|(tt|)*30mL" at 067f987), selective recompute, the EP overlap and delayed weight gradients
DSV3_OVERLAP = {"pp_first": 0, "pp_last": 0, "vpp": 4, "recompute": "selective", "ep_comm_overlap": True,
                "delay_wgrad": True}


def dsv3(**changes):
    from llmplan.specs.layout import parse_layout
    pf = load_plan(PLANS / "deepseek_train.json")
    return dataclasses.replace(pf, plan=pf.plan.model_copy(update={"pp_layout": parse_layout("Et|(tt|)*30mL"),
                                                                    **DSV3_OVERLAP, **changes}))


def megatron_core_ep_overlap_asserts(model: dict) -> None:
    """TransformerConfig.__post_init__'s overlap_moe_expert_parallel_comm / delay_wgrad_compute asserts (cd4afffa6),
    restated on the applied config (the recipe's bf16 preset is checked by the caller)."""
    assert model["expert_model_parallel_size"] > 1
    assert model["moe_token_dispatcher_type"] in ("alltoall", "flex")
    assert model["pipeline_model_parallel_size"] == 1 or model["virtual_pipeline_model_parallel_size"] is not None
    assert model["recompute_granularity"] != "full" and model["recompute_method"] is None
    assert model["recompute_num_layers"] is None and "moe" not in (model["recompute_modules"] or [])
    assert model["moe_shared_expert_overlap"] is False and model["mtp_num_layers"] in (None, 0, 1)
    assert not model["delay_wgrad_compute"] or model["overlap_moe_expert_parallel_comm"]


@pytest.mark.parametrize("as_dataclass", [True, False])  # a recipe with a CommOverlapConfig object, or with None
def test_deepseek_v3_ep_overlap_plan_exports_both_switches(as_dataclass):
    pf = dsv3()
    assert not {v.rule for v in check_plan(pf.model, pf.plan)} & {"ep_overlap_vpp", "ep_overlap_full_recompute",
                                                                  "ep_overlap_mtp", "ep_overlap_dtype"}
    text = render_all(pf, "megatron-bridge")[0][SCRIPT]
    args = overrides(text)
    assert_recorded_fields_of_their_type(args)
    cfg = hydra_applied(args, as_dataclass)
    model = cfg["model"]
    assert model["overlap_moe_expert_parallel_comm"] is True and model["delay_wgrad_compute"] is True
    assert model["virtual_pipeline_model_parallel_size"] == 4 and model["mtp_num_layers"] == 1
    megatron_core_ep_overlap_asserts(model)
    assert cfg["comm_overlap"] is None and cfg["mixed_precision"] == "bf16_mixed"
    # the overlap's streams: the performance presets' 8 work queues on H100 (32 under deepep), not 1
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=8" in text
    deepep = render_all(dsv3(moe_dispatcher="deepep"), "megatron-bridge")[0][SCRIPT]
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=32" in deepep


def test_overlap_without_delay_and_off_are_written_as_priced():
    cfg = hydra_applied(overrides(render_all(dsv3(delay_wgrad=False), "megatron-bridge")[0][SCRIPT]), True)
    assert (cfg["model"]["overlap_moe_expert_parallel_comm"], cfg["model"]["delay_wgrad_compute"]) == (True, False)
    off = render_all(load_plan(PLANS / "deepseek_train.json"), "megatron-bridge")[0][SCRIPT]
    args = overrides(off)
    assert "model.overlap_moe_expert_parallel_comm=false" in args and "model.delay_wgrad_compute=false" in args
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in off


def test_comm_overlap_fields_cannot_be_overridden_once_it_is_null():
    # why the export writes the TransformerConfig fields: comm_overlap=null (so that CommOverlapConfig.setup does not
    # overwrite the plan's DDP settings) leaves no node for comm_overlap.* under OmegaConf's struct mode
    pytest.importorskip("hydra")
    from hydra.errors import ConfigCompositionException
    with pytest.raises(ConfigCompositionException, match="Could not override"):
        hydra_applied(["comm_overlap=null", "comm_overlap.overlap_moe_expert_parallel_comm=true"], True)


def test_qwen3_ep_overlap_plan_exports_through_the_cli(cli, tmp_path):
    # Qwen3-30B-A3B: its recipe leaves comm_overlap None (recipes/qwen/h100/qwen3_moe.py at 6124fbe)
    path = tmp_path / "q.json"
    assert cli("estimate", "--model", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--nodes", "2", "--ep", "8",
               "--ep-comm-overlap", "--delay-wgrad", "--recompute", "selective", "--save", path).code == 0
    r = cli("export", path, "--to", "megatron-bridge", "-o", tmp_path / "out")
    assert r.code == 0, r.err
    args = overrides((tmp_path / "out" / SCRIPT).read_text())
    cfg = hydra_applied(args, False)
    assert cfg["model"]["overlap_moe_expert_parallel_comm"] is True and cfg["model"]["delay_wgrad_compute"] is True
    megatron_core_ep_overlap_asserts(cfg["model"])


@pytest.mark.parametrize("changes,rule", [
    ({"vpp": 1, "pp_layout": None, "pp_first": 7, "pp_last": 6}, "ep_overlap_vpp"),
    ({"recompute": "full"}, "ep_overlap_full_recompute"),
    ({"recompute_modules": ("moe",)}, "recompute_moe_overlap"),
])
def test_plans_megatron_core_refuses_are_refused_with_their_rule(changes, rule):
    pf = dsv3(**changes)
    assert rule in {v.rule for v in check_plan(pf.model, pf.plan)}
    with pytest.raises(CannotExpress, match=f"check_plan rule {rule}"):
        render_all(pf, "megatron-bridge")


def test_cli_refuses_an_ep_overlap_plan_without_virtual_stages_in_one_line(cli, tmp_path):
    doc = json.loads((PLANS / "deepseek_train.json").read_text())
    doc["plan"].update(ep_comm_overlap=True, recompute="selective")  # pp 8, vpp 1
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    line = cli("export", path, "--to", "megatron-bridge", "-o", tmp_path / "out").refusal()
    # the plan file's load runs check_plan: the rule's values, reason and fix in one line
    assert "pp 8 and vpp 1" in line and "asserts virtual stages" in line and "--vpp 2 or more" in line
    assert not (tmp_path / "out").exists()


def test_check_plan_ep_overlap_rules():
    ds, mix = builtin_models()["deepseek-v3"], builtin_models()["mixtral-8x7b"]
    base = dict(tp=1, pp=2, vpp=2, dp=8, ep=8, global_batch=64, ep_comm_overlap=True, recompute="selective")
    names = lambda m, **kw: {v.rule for v in check_plan(m, ParallelPlan(**{**base, **kw}))}  # noqa: E731
    ep_rules = {"ep_overlap_vpp", "ep_overlap_full_recompute", "ep_overlap_mtp", "ep_overlap_dtype"}
    assert not names(mix) & ep_rules
    assert "ep_overlap_vpp" in names(mix, vpp=1) and "ep_overlap_vpp" not in names(mix, vpp=1, ep_comm_overlap=False)
    assert "ep_overlap_full_recompute" in names(mix, recompute="full")
    assert "ep_overlap_dtype" in names(mix, dtype="fp32") and "ep_overlap_dtype" not in names(mix, dtype="fp16")
    assert "ep_overlap_mtp" not in names(ds)  # DeepSeek-V3's one MTP module (config.json num_nextn_predict_layers 1)
    two = ds.model_copy(update={"num_nextn_predict_layers": 2})  # a model with two MTP modules
    assert "ep_overlap_mtp" in names(two) and "ep_overlap_mtp" not in names(two, mtp_layers=1)
