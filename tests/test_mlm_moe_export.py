"""The Megatron-LM export runs the MoE router llmplan prices: load balancing, router dtype, fused router and permute,
and the fused grouped MLP's environment, checked through `llmplan export` and parsed with the flags of
Megatron-LM's own parser (tests/data/launchers/megatron-lm.json, recorded at d98e8a6: an unknown flag or a value
outside a flag's choices fails).

What the pricing assumes for every MoE model (so every export must run it): an auxiliary load-balancing loss in
each MoE layer's forward (cost.kernels.ROUTER, cost.moe.MOE_CYCLE_HOST_OPS), which Megatron-Core computes only
with --moe-aux-loss-coeff above its default 0 (megatron/core/transformer/moe/router.py, is_aux_loss_enabled, at
d98e8a6); fp32 router logits and probs (cost.elementwise.ROUTER_BYTES, cost.comm.ROUTER_PROB_BYTES); Transformer
Engine's fused router and permute (docs/formulas.md#moe.routing_passes).

Expected routing per model, from the published files (not from llmplan):
- DeepSeek-V3: config.json (deepseek-ai/DeepSeek-V3) aux_loss_alpha 0.001, seq_aux true, topk_method noaux_tc,
  scoring_func sigmoid, n_group 8, topk_group 4, routed_scaling_factor 2.5; the report (arXiv 2412.19437, 2.1.2)
  pairs the aux-loss-free bias with a complementary sequence-wise balance loss. Megatron-Bridge's DeepSeek-V3
  bridge writes the same (seq_aux_loss, moe_aux_loss_coeff = aux_loss_alpha, expert bias, fp32 router:
  NVIDIA-NeMo/Megatron-Bridge@067f987 models/deepseek/deepseek_v3_bridge.py).
- Qwen3-30B-A3B: config.json router_aux_loss_coef 0.001; Megatron-LM's own Qwen3-30B-A3B arguments
  (NVIDIA/Megatron-LM@d98e8a6 examples/post_training/modelopt/conf/Qwen/Qwen3-30B-A3B.sh): aux_loss, 1e-3,
  fp32 router.
- Mixtral-8x7B: config.json (mistralai/Mixtral-8x7B-v0.1) router_aux_loss_coef 0.02; the Switch-style loss over
  the batch (transformers' load_balancing_loss_func; Megatron-LM@d98e8a6 examples/mixtral/
  train_mixtral_8x7b_distributed.sh: --moe-router-load-balancing-type aux_loss).
- Kimi-K2: config.json (moonshotai/Kimi-K2-Instruct) aux_loss_alpha 0.001, seq_aux true, topk_method noaux_tc,
  scoring_func sigmoid, n_group 1, topk_group 1, routed_scaling_factor 2.827; Megatron-Bridge's Kimi bridge:
  seq_aux_loss, 1e-3, expert bias, fp32 router (NVIDIA-NeMo/Megatron-Bridge@067f987 models/kimi/kimi_bridge.py).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from exported import unwrapped
from llmplan.cost.kernels import aux_loss_on
from llmplan.export import render_all
from llmplan.export.common import CannotExpress
from llmplan.planfile import load_plan
from llmplan.specs.hf import from_hf_config
from llmplan.specs.model import ModelSpec
from llmplan.specs.registry import builtin_models
from test_export import parse_megatron
from test_specs import DEEPSEEK_V3, MIXTRAL, QWEN3_MOE

PLANS = Path(__file__).parent / "data" / "plans"

PUBLISHED = {  # model: (plan file, load balancing type, coefficient, score function, groups, group top-k,
    #                    top-k scaling factor, expert bias)
    "deepseek-v3": ("deepseek_train", "seq_aux_loss", 0.001, "sigmoid", 8, 4, 2.5, True),
    "qwen3-30b-a3b": ("moe_train", "aux_loss", 0.001, "softmax", None, None, None, False),
    "mixtral-8x7b": ("moe_train", "aux_loss", 0.02, "softmax", None, None, None, False),
    "kimi-k2": ("deepseek_train", "seq_aux_loss", 0.001, "sigmoid", 1, 1, 2.827, True),
}


def _plan_json(tmp_path: Path, model: str) -> Path:
    """The test plan file of PUBLISHED[model] with the built-in spec as it is now (as `search --save` writes it)."""
    doc = json.loads((PLANS / f"{PUBLISHED[model][0]}.json").read_text())
    doc["model"] = builtin_models()[model].model_dump(mode="json")
    path = tmp_path / f"{model}.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("model", sorted(PUBLISHED))
def test_cli_export_writes_the_priced_router(cli, tmp_path, model):
    _, kind, coef, score, groups, group_topk, scaling, bias = PUBLISHED[model]
    out = tmp_path / "out"
    r = cli("export", _plan_json(tmp_path, model), "--to", "megatron", "-o", out)
    assert r.code == 0, r.err
    script = (out / "megatron_pretrain.sh").read_text()
    ns, _ = parse_megatron(script)  # Megatron-LM's recorded parser accepts every flag and value
    assert ns.moe_router_load_balancing_type == [kind]
    assert [float(c) for c in ns.moe_aux_loss_coeff] == [coef]
    # the router fusion as the plan prices it (plan.moe_router_fusion: off in these plans, Megatron-Core's default)
    assert (ns.moe_router_dtype, ns.moe_router_fusion, ns.moe_permute_fusion) == ("fp32", False, True)
    assert ns.moe_router_score_function == score and ns.moe_router_enable_expert_bias == bias
    assert ns.moe_router_num_groups == (None if groups is None else str(groups))
    assert ns.moe_router_group_topk == (None if group_topk is None else str(group_topk))
    assert (ns.moe_router_topk_scaling_factor is None) == (scaling is None)
    if scaling is not None:
        assert float(ns.moe_router_topk_scaling_factor) == scaling
    # every plan here prices the experts' one grouped kernel with expert TP 1 on a gated MLP: the fused grouped
    # MLP, which Megatron-Core turns down for a GLU without the environment (moe/experts.py at d98e8a6,
    # _is_fused_impl_supported)
    assert ns.use_transformer_engine_op_fuser
    assert "export NVTE_CUTEDSL_FUSED_GROUPED_MLP=1" in unwrapped(script)
    assert "gives no router_aux_loss_coef" not in unwrapped(script)  # the spec gives it: no fallback note


def test_config_json_balance_loss_fields():
    v3 = ModelSpec(**from_hf_config({**DEEPSEEK_V3, "aux_loss_alpha": 0.001, "seq_aux": True}, "deepseek-v3"))
    assert (v3.router_aux_loss_coef, v3.seq_aux) == (0.001, True)
    mixtral = ModelSpec(**from_hf_config({**MIXTRAL, "router_aux_loss_coef": 0.02}, "mixtral-8x7b"))
    assert (mixtral.router_aux_loss_coef, mixtral.seq_aux) == (0.02, False)
    bare = ModelSpec(**from_hf_config(QWEN3_MOE, "qwen3-30b-a3b"))  # no key: not given
    assert (bare.router_aux_loss_coef, bare.seq_aux) == (None, False)
    for name, (_, kind, coef, *_rest) in PUBLISHED.items():  # the built-in specs carry the published values
        spec = builtin_models()[name]
        assert (spec.router_aux_loss_coef, spec.seq_aux) == (coef, kind == "seq_aux_loss")


def _with_model(**changes: object):
    pf = load_plan(PLANS / "moe_train.json")
    return dataclasses.replace(pf, model=pf.model.model_copy(update=changes))


def test_a_spec_without_the_coefficient_still_runs_the_priced_loss_and_says_so():
    # Megatron-LM's --moe-aux-loss-coeff defaults to 0.0 (arguments.py at d98e8a6), which turns the priced loss
    # off: the export writes a coefficient above 0 and names the spec key that would give the model's own
    files, _ = render_all(_with_model(router_aux_loss_coef=None), "megatron")
    script = files["megatron_pretrain.sh"]
    ns, _ = parse_megatron(script)
    assert ns.moe_router_load_balancing_type == ["aux_loss"] and float(ns.moe_aux_loss_coeff[0]) > 0
    assert "gives no router_aux_loss_coef" in unwrapped(script)


def test_a_model_trained_without_the_loss_runs_none_as_priced():
    pf = _with_model(router_aux_loss_coef=0.0)
    files, _ = render_all(pf, "megatron")
    script = files["megatron_pretrain.sh"]
    ns, _ = parse_megatron(script)
    assert ns.moe_router_load_balancing_type == ["none"] and ns.moe_aux_loss_coeff is None
    # priced without the loss's kernels (cost.kernels.aux_loss_on), so no "faster than priced" note
    assert not aux_loss_on(pf.model) and "faster than priced" not in unwrapped(script)


def test_wrapped_launch_carries_the_router_flags():
    files, _ = render_all(load_plan(PLANS / "moe_train.json"), "torchrun")
    ns, _ = parse_megatron(files["torchrun.sh"])
    assert ns.moe_router_load_balancing_type == ["aux_loss"] and not ns.moe_router_fusion and ns.moe_permute_fusion


def test_torchtitan_refuses_the_ep_overlap_it_does_not_run():
    # torchtitan 0.3.0's export writes no EP all-to-all overlap (Megatron-Core's combined 1F1B,
    # --overlap-moe-expert-parallel-comm): a plan priced with it (ep > 1) is refused, not run exposed; with
    # ep 1 the switch is check_plan's to refuse (ep_comm_overlap_ep)
    pf = load_plan(PLANS / "moe_train.json")
    plan = pf.plan.model_copy(update={"zero": 2, "recompute": "none", "pp": 1, "tp": 1, "dp": 32, "sp": False,
                                      "tp_impl": "dtensor"})
    qwen = dataclasses.replace(pf, plan=plan, model=builtin_models()["qwen3-30b-a3b"])
    files, _ = render_all(qwen, "torchtitan")  # the same plan without the overlap exports
    assert "torchtitan_train.sh" in files
    with pytest.raises(CannotExpress, match=r"EP all-to-all overlap .*--no-ep-comm-overlap"):
        render_all(dataclasses.replace(qwen, plan=plan.model_copy(update={"ep_comm_overlap": True})), "torchtitan")
