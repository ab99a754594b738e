"""MoE router fields of the model spec (score function, renormalisation, scaling factor, expert bias, MTP):
read from config.json, bounded, and exported to Megatron-LM as its own flags, or refused where Megatron-Core's
router cannot run them.

DeepSeek-V3's published config.json (deepseek-ai/DeepSeek-V3 on the Hugging Face Hub): scoring_func "sigmoid",
topk_method "noaux_tc" (the e_score_correction_bias), norm_topk_prob true, routed_scaling_factor 2.5, n_group 8,
topk_group 4, num_nextn_predict_layers 1; the DeepSeek-V3 report (arXiv 2412.19437, section 2.1.2) states the
same router: sigmoid affinities, a bias term for routing only, normalised gating values, 8 groups, top 4.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from llmplan.export import render_all
from llmplan.export.common import CannotExpress
from llmplan.planfile import load_plan
from llmplan.specs.hf import from_hf_config
from llmplan.specs.model import ModelSpec
from llmplan.specs.registry import builtin_models
from test_export import parse_megatron
from test_specs import DEEPSEEK_V3, QWEN3_MOE

PLANS = Path(__file__).parent / "data" / "plans"
PUBLISHED_V3_ROUTER = {"scoring_func": "sigmoid", "norm_topk_prob": True, "routed_scaling_factor": 2.5,
                       "expert_bias": True, "n_group": 8, "topk_group": 4, "num_nextn_predict_layers": 1}


def test_deepseek_v3_router_from_config_json_and_the_builtin_spec():
    cfg = {**DEEPSEEK_V3, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "norm_topk_prob": True}
    for spec in (ModelSpec(**from_hf_config(cfg, "deepseek-v3")), builtin_models()["deepseek-v3"]):
        assert {k: getattr(spec, k) for k in PUBLISHED_V3_ROUTER} == PUBLISHED_V3_ROUTER
    # transformers' DeepseekV3 routes with a sigmoid and the correction bias when the keys are left out
    bare = ModelSpec(**from_hf_config(DEEPSEEK_V3, "deepseek-v3"))
    assert (bare.scoring_func, bare.expert_bias) == ("sigmoid", True)
    # Qwen3MoeConfig defaults norm_topk_prob to false; the published Qwen3-30B-A3B file sets true
    assert ModelSpec(**from_hf_config(QWEN3_MOE, "q")).norm_topk_prob is False
    assert ModelSpec(**from_hf_config({**QWEN3_MOE, "norm_topk_prob": True}, "q")).norm_topk_prob is True
    assert builtin_models()["mixtral-8x7b"].routing_fields_set == []


def test_router_values_from_config_json_are_typed_as_written():
    with pytest.raises(ValueError, match="without quotes"):
        from_hf_config({**DEEPSEEK_V3, "routed_scaling_factor": "2.5"}, "x")
    with pytest.raises(ValueError, match="true or false without quotes"):
        from_hf_config({**DEEPSEEK_V3, "norm_topk_prob": "true"}, "x")
    dense = from_hf_config({**DEEPSEEK_V3, "n_routed_experts": 0, "n_group": None, "topk_group": None}, "x")
    assert not {"routed_scaling_factor", "norm_topk_prob", "scoring_func", "expert_bias"} & set(dense)


@pytest.mark.parametrize("changes,needle", [
    ({"scoring_func": "sigmoid"}, "set on a dense model"),
    ({"expert_bias": True}, "set on a dense model"),
    ({"routed_scaling_factor": 0.0}, "greater than 0"),
    ({"routed_scaling_factor": 1e6}, "beyond any model"),
    ({"scoring_func": "relu"}, "'softmax', 'sigmoid' or 'sqrtsoftplus'"),
])
def test_router_fields_are_bounded(changes, needle):
    base = builtin_models()["llama-3.1-8b"].model_dump()
    with pytest.raises(ValidationError, match=needle):
        ModelSpec(**{**base, **changes})


def test_deepseek_v3_router_reaches_megatron():
    # Every router flag is parsed by Megatron-LM's own parser (recorded flags, commit d98e8a6) and carries the
    # published value.
    pf = load_plan(PLANS / "deepseek_train.json")
    ns, _ = parse_megatron(render_all(pf, "megatron")[0]["megatron_pretrain.sh"])
    assert ns.moe_router_score_function == "sigmoid" and ns.moe_router_enable_expert_bias
    assert (int(ns.moe_router_num_groups), int(ns.moe_router_group_topk)) == (8, 4)
    assert float(ns.moe_router_topk_scaling_factor) == 2.5 and int(ns.mtp_num_layers) == 1
    assert (int(ns.moe_router_topk), int(ns.num_experts)) == (8, 256)
    assert ns.moe_router_dtype == "fp32" and not ns.moe_router_pre_softmax


def _with_model(case: str, **changes):
    pf = load_plan(PLANS / f"{case}.json")
    return dataclasses.replace(pf, model=pf.model.model_copy(update=changes))


def test_unnormalised_softmax_is_megatrons_pre_softmax():
    # Qwen1.5/2-MoE (norm_topk_prob false): softmax over all experts, then top-k, weights not renormalised.
    ns, _ = parse_megatron(render_all(_with_model("moe_train", norm_topk_prob=False), "megatron")[0]
                           ["megatron_pretrain.sh"])
    assert ns.moe_router_pre_softmax and ns.moe_router_score_function == "softmax"
    ns, _ = parse_megatron(render_all(load_plan(PLANS / "moe_train.json"), "megatron")[0]["megatron_pretrain.sh"])
    assert not ns.moe_router_pre_softmax and ns.mtp_num_layers is None and not ns.moe_router_enable_expert_bias


@pytest.mark.parametrize("changes,needle", [
    ({"expert_bias": True}, "an expert bias with softmax scores"),
    ({"scoring_func": "sigmoid", "norm_topk_prob": False}, "without renormalisation"),
])
def test_megatron_refuses_routers_megatron_core_cannot_run(changes, needle):
    with pytest.raises(CannotExpress, match=needle):
        render_all(_with_model("moe_train", **changes), "megatron")


def test_plan_file_embeds_the_router():
    doc = json.loads((PLANS / "deepseek_train.json").read_text())
    assert {k: doc["model"][k] for k in PUBLISHED_V3_ROUTER} == PUBLISHED_V3_ROUTER


def test_megatron_layout_places_the_mtp_layer_before_the_loss():
    # Megatron-Core's PipelineParallelLayerLayout: the count of m must equal --mtp-num-layers, on the last stage.
    pf = load_plan(PLANS / "deepseek_train.json")
    pf = dataclasses.replace(pf, plan=pf.plan.model_copy(update={"pp_first": 0, "pp_last": 0,
                                                                  "pp_layers": (7, 8, 8, 8, 8, 8, 8, 6)}))
    ns, _ = parse_megatron(render_all(pf, "megatron")[0]["megatron_pretrain.sh"])
    layout = ns.pipeline_model_parallel_layout.strip('"')
    assert layout.startswith("Et*7|") and layout.endswith("|t*6,mL") and int(ns.mtp_num_layers) == 1


def test_megatron_ep_overlap_is_written_or_refused():
    # --overlap-moe-expert-parallel-comm (recorded parser); Megatron-Core asserts ep > 1, vpp with pp > 1 and no
    # full recompute for it (TransformerConfig.__post_init__). The export refuses in check_plan's words (its rules
    # ep_comm_overlap_ep, ep_overlap_vpp, ep_overlap_full_recompute: common.EP_OVERLAP_RULES), naming the values.
    pf = load_plan(PLANS / "deepseek_train.json")
    ok = dataclasses.replace(pf, plan=pf.plan.model_copy(update={"ep_comm_overlap": True, "recompute": "selective",
                                                                  "pp_first": 0, "pp_last": 0, "vpp": 2,
                                                                  "pp_layers": (7, 8, 8, 8, 8, 8, 8, 6)}))
    ns, _ = parse_megatron(render_all(ok, "megatron")[0]["megatron_pretrain.sh"])
    assert ns.overlap_moe_expert_parallel_comm
    assert pf.plan.recompute == "full" and pf.plan.pp == 8 and pf.plan.ep > 1
    with pytest.raises(CannotExpress, match=r"recompute full: .*no full recompute.*rule ep_overlap_full_recompute"):
        render_all(dataclasses.replace(pf, plan=pf.plan.model_copy(update={"ep_comm_overlap": True, "vpp": 1,
                                                                           "pp": 1})), "megatron")
    with pytest.raises(CannotExpress, match=r"pp 8 and vpp 1: .*virtual stages when pp > 1.*rule ep_overlap_vpp"):
        render_all(dataclasses.replace(pf, plan=pf.plan.model_copy(update={"ep_comm_overlap": True})), "megatron")
    with pytest.raises(CannotExpress, match=r"ep_comm_overlap with ep 1: .*rule ep_comm_overlap_ep"):
        render_all(dataclasses.replace(pf, plan=ok.plan.model_copy(update={"ep": 1})), "megatron")