"""Stop 65 #mtp-repeat: a model whose MTP depths rerun one module's weights (ModelSpec.mtp_repeated_layer, priced
as one weight set: cost.stages.mtp_weight_sets) exports the switch that makes the launcher build one module.

Expected flags come from the launchers' own sources, not from llmplan: Megatron-LM's --mtp-use-repeated-layer is
generated from TransformerConfig.mtp_use_repeated_layer (NVIDIA/Megatron-LM@d98e8a64dd
megatron/core/transformer/transformer_config.py, argument_utils.py ArgumentGroupFactory), and NVIDIA's own
Nemotron-3.5 Lightning functional test passes it with --mtp-num-layers 2 and the unified pattern's "/*E/*E"
(tests/functional_tests/test_cases/nemotron/nemotron3_5_lightning_nightly_tp1_pp1_cp1_ep8_dgx_gb200/
model_config.yaml); Megatron-Bridge's recipe sets model.mtp_use_repeated_layer = True with mtp_num_layers 2
(NVIDIA-NeMo/Megatron-Bridge@067f987 src/megatron/bridge/recipes/nemotronh/h100/nemotron_3_super.py)."""

from __future__ import annotations

import dataclasses

import pytest

from llmplan.export import render_all
from llmplan.planfile import PlanFile, load_plan
from tests.test_export import recorded_parser
from tests.test_export_bridge import PLANS, SCRIPT, hydra_applied, overrides
from tests.test_export_nemotron3 import run_argv


@pytest.fixture(scope="module")
def super_plan(tmp_path_factory) -> PlanFile:
    from llmplan.cli import main

    path = tmp_path_factory.mktemp("n3r") / "plan.json"
    try:
        main(["estimate", "--model", "nemotron-3-super", "--hardware", "gb200-nvl72", "--nodes", "8", "--tp", "1",
              "--pp", "1", "--ep", "32", "--zero", "1", "--save", str(path)])
    except SystemExit as e:
        assert e.code in (0, 3, None), e.code
    return load_plan(path)


def megatron_args(pf: PlanFile, tmp_path):
    out = tmp_path / "o"
    for name, text in render_all(pf, "megatron")[0].items():
        out.mkdir(exist_ok=True)
        (out / name).write_text(text)
    ns, unknown = recorded_parser("megatron-lm")[0].parse_known_args(run_argv(out / "megatron_pretrain.sh",
                                                                               tmp_path))
    assert not unknown, unknown
    return ns


def test_repeated_mtp_at_depth_two_exports_as_nvidias_functional_test(super_plan, tmp_path):
    # the built-in's one module run at depth 2, as the Bridge recipes train Super
    m = super_plan.model.model_copy(update={"num_nextn_predict_layers": 2})
    ns = megatron_args(dataclasses.replace(super_plan, model=m), tmp_path)
    assert ns.mtp_use_repeated_layer is True
    assert ns.hybrid_layer_pattern.split("/")[1:] == ["*E", "*E"]


def test_repeated_switch_follows_the_spec(super_plan, tmp_path):
    assert super_plan.model.mtp_repeated_layer  # model_specs/nemotron-3-super.yaml
    assert megatron_args(super_plan, tmp_path).mtp_use_repeated_layer is True
    separate = super_plan.model.model_copy(update={"mtp_repeated_layer": False})
    assert megatron_args(dataclasses.replace(super_plan, model=separate), tmp_path).mtp_use_repeated_layer is False


def test_no_mtp_no_switch(cli, tmp_path):
    # --mtp-layers 0: the trained model has no MTP module, so nothing to repeat (and no pattern depth)
    plan = tmp_path / "p.json"
    r = cli("estimate", "--model", "nemotron-3-super", "--hardware", "gb200-nvl72", "--nodes", "8", "--tp", "1",
            "--pp", "1", "--ep", "32", "--zero", "1", "--mtp-layers", "0", "--save", plan)
    assert r.code in (0, 3), r.err
    ns = megatron_args(load_plan(plan), tmp_path)
    assert ns.mtp_use_repeated_layer is False and "/" not in ns.hybrid_layer_pattern


@pytest.mark.parametrize("repeated", [True, False])
def test_bridge_writes_the_providers_field(repeated):
    pf = load_plan(PLANS / "deepseek_train.json")
    m = pf.model.model_copy(update={"num_nextn_predict_layers": 2, "mtp_repeated_layer": repeated})
    text = render_all(dataclasses.replace(pf, model=m), "megatron-bridge")[0][SCRIPT]
    cfg = hydra_applied(overrides(text), True)["model"]
    assert cfg["mtp_num_layers"] == 2
    # written both ways (the record's base is None): a recipe that sets True itself is overridden where the model
    # has one module per depth
    assert cfg["mtp_use_repeated_layer"] is repeated
    assert f"model.mtp_use_repeated_layer={str(repeated).lower()}" in text.replace("'", "")


def test_bridge_overrides_a_recipe_that_repeats_the_module():
    """A recipe that sets mtp_use_repeated_layer True (Megatron-Bridge@067f987 nemotron_3_super.py) under a model
    whose depths have their own weights: the override puts it back to False."""
    pf = load_plan(PLANS / "deepseek_train.json")
    m = pf.model.model_copy(update={"num_nextn_predict_layers": 2, "mtp_repeated_layer": False})
    text = render_all(dataclasses.replace(pf, model=m), "megatron-bridge")[0][SCRIPT]
    omegaconf = pytest.importorskip("omegaconf", reason="hydra-core not installed: pip install '.[launchers]'")
    pytest.importorskip("hydra")
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser

    cfg = omegaconf.OmegaConf.create(hydra_applied([], True))  # every recorded field, as test_export_bridge
    cfg.model.mtp_use_repeated_layer = True  # the recipe's own value
    omegaconf.OmegaConf.set_struct(cfg, True)
    ConfigLoaderImpl._apply_overrides_to_config(overrides=OverridesParser.create().parse_overrides(overrides(text)),
                                                cfg=cfg)
    assert cfg.model.mtp_use_repeated_layer is False and cfg.model.mtp_num_layers == 2


def test_no_mtp_writes_no_repeat_switch():
    pf = load_plan(PLANS / "deepseek_train.json")
    m = pf.model.model_copy(update={"num_nextn_predict_layers": 0})
    text = render_all(dataclasses.replace(pf, model=m), "megatron-bridge")[0][SCRIPT]
    assert "mtp_use_repeated_layer" not in text
