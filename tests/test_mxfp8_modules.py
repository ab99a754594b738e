"""Modules an NVFP4 plan runs in MXFP8 (ParallelPlan.mxfp8_modules; docs/formulas.md#precision.mxfp8_modules).

Source: NVIDIA-NeMo/Megatron-Bridge's Nemotron-3 Super NVFP4 presets load a Megatron-Core quantization recipe,
te_quant.cfg (scripts/performance/configs/nemotronh/ at v0.4.0 - v0.5.1, src/megatron/bridge/perf_recipes/
nemotronh/ at v0.6.0 = 067f987df, the same file), whose matcher mamba_outproj_mxfp8 sends "*mixer.out_proj" to a
config with fp8_quantization_recipe "mxfp8": the Mamba-2 mixer's out_proj runs in MXFP8 inside the NVFP4 layers.
"""

from __future__ import annotations

import pytest
import yaml

from llmplan.cost.compute import layer_gemm_seconds
from llmplan.export import render_all
from llmplan.export.common import CannotExpress
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M, S = builtin_models(), builtin_systems()
PLAN = {"tp": 1, "pp": 1, "dp": 8, "ep": 8, "sp": False, "seq_len": 8192, "micro_batch": 1, "global_batch": 64}


def _plan(**kw) -> ParallelPlan:
    return ParallelPlan(**{**PLAN, "dtype": "fp4", "recipe": "nvfp4", "bf16_layers_end": 0, **kw})


def _out_proj(plan: ParallelPlan) -> float:
    m, gpu = M["nemotron-3-super"], S["gb300-nvl72"].gpu
    return float(sum(layer_gemm_seconds(m, plan, gpu, True, only="mamba_out_proj")))


def test_out_proj_priced_as_an_mxfp8_run_prices_it():
    m, gpu = M["nemotron-3-super"], S["gb300-nvl72"].gpu
    mx = ParallelPlan(**{**PLAN, "dtype": "fp8", "recipe": "mxfp8"})
    with_module, without = _out_proj(_plan(mxfp8_modules=("mamba_out_proj",))), _out_proj(_plan())
    assert with_module == pytest.approx(_out_proj(mx), rel=1e-9)  # the matmul as the MXFP8 recipe prices it
    assert with_module > 1.3 * without  # GB300's NVFP4 rate is well above its MXFP8 one
    # nothing else in the layer moves: the whole layer's GEMM time grows by the out_proj's own difference
    total = [float(sum(layer_gemm_seconds(m, p, gpu, True)))
             for p in (_plan(mxfp8_modules=("mamba_out_proj",)), _plan())]
    assert total[0] - total[1] == pytest.approx(with_module - without, rel=1e-9)


def test_bf16_layers_stay_bf16():
    L = M["nemotron-3-super"].num_hidden_layers
    assert _out_proj(_plan(bf16_layers_end=L, mxfp8_modules=("mamba_out_proj",))) == pytest.approx(
        _out_proj(_plan(bf16_layers_end=L)), rel=1e-12)


def test_check_plan_names_the_recipe_and_the_model():
    mx = ParallelPlan(**{**PLAN, "dtype": "fp8", "recipe": "mxfp8", "mxfp8_modules": ("mamba_out_proj",)})
    assert "mxfp8_modules" in [v.rule for v in check_plan(M["nemotron-3-super"], mx)]
    llama = _plan(mxfp8_modules=("mamba_out_proj",), ep=1)
    assert "mxfp8_modules_model" in [v.rule for v in check_plan(M["llama-3.1-8b"], llama)]
    ok = _plan(mxfp8_modules=("mamba_out_proj",))
    assert not {"mxfp8_modules", "mxfp8_modules_model"} & {v.rule for v in check_plan(M["nemotron-3-super"], ok)}


def test_command_line_and_exports(cli, tmp_path):
    args = ["estimate", "--model", "nemotron-3-super", "--hardware", "gb300-nvl72", "--nodes", "8",
            "--precision", "nvfp4", "--mxfp8-modules", "mamba_out_proj"]
    r = cli(*args, "--json")
    assert r.code == 0 and r.json()["plan"]["mxfp8_modules"] == ["mamba_out_proj"], r.err
    bad = cli(*args[:-1], "out_proj")
    assert "--mxfp8-modules out_proj" in bad.refusal()
    wrong = cli(*args[:7], "--precision", "mxfp8", "--mxfp8-modules", "mamba_out_proj")
    assert wrong.code == 2 and "MXFP8 modules are an exception to an NVFP4 recipe" in wrong.err, wrong.err
    assert cli(*args, "--bf16-modules", "attention", "--save", tmp_path / "p.json").code == 0
    from llmplan.planfile import load_plan
    pf = load_plan(tmp_path / "p.json")
    files, _ = render_all(pf, "megatron")
    cfg = yaml.safe_load(files["te_precision.yaml"])  # te_quant.cfg's format and values
    assert cfg["configs"]["mxfp8"]["training_recipe"] == {"fp8_quantization_recipe": "mxfp8"}
    by_config = {}
    for x in cfg["matchers"].values():
        by_config.setdefault(x["config"], set()).add(x["pattern"])
    assert by_config == {"mxfp8": {"*mixer.out_proj"}, "bf16": {"*.linear_qkv", "*.linear_proj"}}
    with pytest.raises(CannotExpress):  # Megatron-Bridge: hybrids (and model.quant_recipe) are not overridable
        render_all(pf, "megatron-bridge")
