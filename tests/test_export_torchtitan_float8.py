"""torchtitan's float8 switches in the exports (docs/formulas.md#comm.torchao_fp8_gather).

Read at pytorch/torchtitan v0.2.2 (73a0e69): components/quantization/float8.py registers the converter as
"quantize.linear.float8" (protocols/model_converter.py looks model.converters up by that name, so "float8" raises
KeyError); config/job_config.py Float8Linear: enable_fsdp_float8_all_gather, precompute_float8_dynamic_scale_for_fsdp,
recipe_name (None: tensorwise; asserted without the all-gather), filter_fqns (module_filter_fn converts every
nn.Linear not named, the output layer included); models/*/infra/parallelize.py turns float8 TP on only for
`"float8" in job_config.model.converters`. 0.3.0's Float8LinearConverter.Config: recipe_name rowwise only, no
float8 all-gather.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

import pytest

from llmplan.export import render_all
from llmplan.export.common import CannotExpress
from llmplan.planfile import load_plan

PLANS = Path(__file__).parent / "data" / "plans"
FP8 = {"dtype": "fp8", "recipe": "tensorwise", "fp8_scaling": "current", "tp_impl": "dtensor"}


def plan_file(**changes):
    base = load_plan(PLANS / "fsdp_train.json")  # llama-3.1-8b, ZeRO-3 over 16, tp 1
    return dataclasses.replace(base, plan=base.plan.model_copy(update=changes))


def toml(**changes) -> dict:
    return tomllib.loads(render_all(plan_file(**changes), "torchtitan-0.2")[0]["torchtitan-v0.2.2.toml"])


@pytest.mark.parametrize("fp8_params", [True, False])
def test_tensorwise_writes_the_float8_all_gather_as_priced(fp8_params):
    cfg = toml(**FP8, fp8_params=fp8_params)
    assert cfg["model"]["converters"] == ["quantize.linear.float8"]
    assert cfg["quantize"]["linear"]["float8"] == {"enable_fsdp_float8_all_gather": fp8_params,
                                                   "precompute_float8_dynamic_scale_for_fsdp": fp8_params,
                                                   "filter_fqns": ["output"]}


def test_rowwise_names_its_recipe_and_bf16_has_no_table():
    cfg = toml(dtype="fp8", recipe="rowwise")
    assert cfg["quantize"]["linear"]["float8"] == {"recipe_name": "rowwise", "filter_fqns": ["output"]}
    bf16 = toml()
    assert "quantize" not in bf16 and "converters" not in bf16["model"]


@pytest.mark.parametrize(("target", "changes", "words"), [
    ("torchtitan-0.2", {**FP8, "torchao_saves_hp_input": False}, "torchao_saves_hp_input false"),
    ("torchtitan-0.2", {**FP8, "tp": 2, "sp": True, "dp": 8}, "float8 tensor parallelism"),
    ("torchtitan-0.2", {**FP8, "fp8_params": True, "zero": 0, "grad_accumulation": "cast-add"}, "fp8_params with zero 0"),
])
def test_refusals_name_the_rule(target, changes, words):
    with pytest.raises(CannotExpress, match=words):
        render_all(plan_file(**changes), target)


@pytest.mark.parametrize("target", ["torchtitan-0.2", "torchtitan"])
def test_rowwise_with_fp8_params_is_check_plans_refusal_not_the_exports(cli, tmp_path, target):
    """No torchao float8 all-gather exists for rowwise (pytorch/ao@36027d82d1 torchao/float8/config.py asserts
    enable_fsdp_float8_all_gather with tensorwise only): check_plan's fp8_params_rowwise refuses the plan file
    before any export reads it, in one line, exit 2, nothing written."""
    doc = json.loads((PLANS / "fsdp_train.json").read_text())
    doc["plan"].update({"dtype": "fp8", "recipe": "rowwise", "fp8_params": True})
    path = tmp_path / "rowwise.json"
    path.write_text(json.dumps(doc))
    r = cli("export", path, "--to", target, "-o", tmp_path / "out")
    assert r.code == 2 and "Traceback" not in r.err and not (tmp_path / "out").exists(), r.err
    assert "the plan no longer passes its rules: fp8_params with dtype fp8, recipe rowwise" in r.err, r.err
    assert "use --precision fp8-tensorwise or drop --fp8-params" in r.err, r.err


@pytest.fixture(scope="module")
def moe_fp8(tmp_path_factory):
    """qwen3-30b-a3b (torchtitan's qwen3 30B-A3B flavour) on one DGX H100 at ep 8, ZeRO-3, fp8 rowwise: the plan
    llmplan prices with the routed experts' grouped GEMMs in fp8 (cost.gemm.layer_gemm_seconds)."""
    from llmplan.cli import main
    path = tmp_path_factory.mktemp("moe") / "moe.json"
    with pytest.raises(SystemExit) as done:
        main(["estimate", "--model", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--nodes", "1", "--tp", "1", "--ep",
              "8", "--zero", "3", "--precision", "fp8-rowwise", "--save", str(path)])
    assert done.value.code in (0, None)
    return load_plan(path)


def test_moe_rowwise_converts_the_routed_experts(moe_fp8):
    """torchtitan v0.2.2 (73a0e69): Float8LinearConverter swaps nn.Linear only, so GroupedExperts' parameters stay
    bf16 unless "quantize.grouped_mm.float8" (Float8GroupedMMConverter, rowwise) is among model.converters, with
    [quantize.grouped_mm.float8] fqns naming the routed experts (models/moe/moe.py MoE.experts: "moe.experts", no
    substring of moe.shared_experts; tests/test_torchtitan_expert_fqns.py)."""
    cfg = tomllib.loads(render_all(moe_fp8, "torchtitan-0.2")[0]["torchtitan-v0.2.2.toml"])
    assert cfg["model"]["converters"] == ["quantize.linear.float8", "quantize.grouped_mm.float8"]
    assert cfg["quantize"]["grouped_mm"]["float8"] == {"fqns": ["moe.experts"]}
    assert cfg["quantize"]["linear"]["float8"]["filter_fqns"] == ["output", "router.gate"]
    rec = json.loads((Path(__file__).parent / "data" / "launchers" / "torchtitan-v0.2.2.json").read_text())
    assert rec["sections"]["model"]["converters"] == "list[str]"  # recorded by tools/launcher_flags.py at v0.2.2
    assert set(cfg["quantize"]["grouped_mm"]["float8"]) <= set(rec["sections"]["quantize.grouped_mm.float8"])
    assert rec["sections"]["quantize.grouped_mm.float8"]["fqns"].startswith("list[str]")  # fqns' declared type
    assert rec["sections"]["quantize.grouped_mm"]["float8"] == "Float8GroupedMM"  # the nested table's record
    dense = toml(dtype="fp8", recipe="rowwise")  # a dense model has no grouped GEMMs to convert
    assert dense["model"]["converters"] == ["quantize.linear.float8"] and "grouped_mm" not in dense["quantize"]


@pytest.mark.parametrize(("changes", "words"), [
    ({"recipe": "tensorwise", "fp8_scaling": "current", "tp_impl": "dtensor"}, "recipe tensorwise: its float8 grouped GEMMs are rowwise only"),
    ({"pp": 2, "dp": 4}, "pp 2, cp 1: its float8 grouped GEMMs assert pipeline and context parallelism off"),
    ({"cp": 2, "dp": 4, "cp_impl": "torch-allgather"}, "pp 1, cp 2: its float8 grouped GEMMs assert"),
])
def test_moe_fp8_the_grouped_converter_cannot_run_is_refused(moe_fp8, changes, words):
    """Float8GroupedMMConverter (torchtitan v0.2.2 components/quantization/float8.py) runs torchao's rowwise
    MoETrainingConfig and asserts pipeline_parallel_degree == 1 and context_parallel_degree == 1: anywhere else the
    experts would run bf16, so the export refuses in one line naming the fix."""
    pf = dataclasses.replace(moe_fp8, plan=moe_fp8.plan.model_copy(update=changes))
    with pytest.raises(CannotExpress, match=words) as e:
        render_all(pf, "torchtitan-0.2")
    assert "re-plan with --precision fp8-rowwise --pp 1 --cp 1, or export to megatron" in str(e.value)
    assert "\n" not in str(e.value)
