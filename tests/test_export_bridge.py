"""`llmplan export --to megatron-bridge`: golden scripts for a dense (llama-3.1-70b) and a MoE (deepseek-v3) plan,
every override a field of Megatron-Bridge's ConfigContainer with a value of its type, the overrides applied
as Megatron-Bridge applies them (Hydra's override parser on an OmegaConf struct config), values that
reproduce the plan, and refusals.

The field list is tests/data/launchers/megatron-bridge.json, recorded by tools/bridge_fields.py from the
megatron-bridge 0.6.2 wheel (PyPI) and the Megatron-LM commit its r0.6.0 branch pins (cd4afff); its rng and
rerun_state_machine sections (the CUDA-graph overrides') were read by the same tool from that branch's sources at
6124fbe, which give the wheel's fields for the eleven sections recorded from the wheel; the command
line is scripts/training/run_recipe.py of that branch (6124fbe). Regenerate the goldens after an intended
change with `LLMPLAN_UPDATE_GOLDEN=1 python -m pytest tests/test_export_bridge.py` and review the diff.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from llmplan import __version__
from llmplan.export import render_all
from llmplan.export.bridge import RECIPES
from llmplan.export.common import CannotExpress
from llmplan.planfile import load_plan

HERE = Path(__file__).parent
PLANS = HERE / "data" / "plans"
GOLDEN = HERE / "golden" / "export" / "megatron-bridge"
RECORD = json.loads((HERE / "data" / "launchers" / "megatron-bridge.json").read_text())
SCRIPT = "megatron_bridge_pretrain.sh"
CASES = ["dense_train", "deepseek_train", "layout_train", "uneven_train"]


def script(case: str, **changes) -> str:
    pf = load_plan(PLANS / f"{case}.json")
    if changes:
        pf = dataclasses.replace(pf, plan=pf.plan.model_copy(update=changes))
    return render_all(pf, "megatron-bridge")[0][SCRIPT]


def array(text: str, name: str) -> list[str]:
    block = re.search(rf"^{name}=\((.*?)\)[ \t]*(?:#[^\n]*)?$", text, re.S | re.M).group(1)
    return shlex.split(block.replace("${TRAIN_ITERS:-1000}", "1000"), comments=True)


def overrides(text: str) -> list[str]:
    return array(text, "TRAIN") + array(text, "OVERRIDES")


@pytest.mark.parametrize("case", ["dense_train", "deepseek_train"])
def test_golden_scripts(case):
    text = script(case).replace(f"llmplan {__version__}", "llmplan VERSION")
    path = GOLDEN / case / SCRIPT
    if os.environ.get("LLMPLAN_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text()


def annotation_accepts(note: str, value: str) -> bool:
    """Whether a Hydra override value fits a field annotation as recorded (text of the Python annotation)."""
    if value == "null":
        return "Optional" in note or "None" in note
    if note.startswith("Union[") and note.endswith("]") and "[" not in note[6:].split(",")[0]:
        # Union[str, List[str]] / Union[float, List[float]]: a value that fits one member fits the union
        first, rest = note[6:-1].split(",", 1)
        return annotation_accepts(first.strip(), value) or annotation_accepts(rest.strip(), value)
    literals = re.findall(r"Literal\[([^\]]*)\]", note)
    if literals:
        choices = [c.strip().strip("'\"") for c in literals[0].split(",")]
        return value in choices
    if note.startswith(("int", "Optional[int]")):
        return value.lstrip("-").isdigit()
    if note.startswith(("float", "Optional[float]")):
        return re.fullmatch(r"-?\d+(\.\d*)?(e-?\d+)?", value) is not None
    if note in ("bool", "Optional[bool]"):
        return value in ("true", "false")
    if "List[str]" in note or "list[str]" in note:
        return value.startswith("[") and value.endswith("]")
    if "dtype" in note:
        return value in ("float32", "bfloat16", "float16")
    return "str" in note


# Where Megatron-Bridge itself stores a value outside the annotation: its flex-dispatcher fallback clears the
# backend to None (training/flex_dispatcher_backend.py, _fallback_to_alltoall).
SET_BY_BRIDGE = {("model.moe_flex_dispatcher_backend", "null")}


def assert_recorded_fields_of_their_type(args: list[str]) -> None:
    for arg in args:
        key, value = arg.split("=", 1)
        parts = key.split(".")
        if len(parts) == 1:
            assert key in RECORD["container"], f"ConfigContainer has no {key}"
            note = RECORD["container"][key]
            # mixed_precision: a preset's name, or null with its fields written out (export.bridge_precision)
            ok = value in (*RECORD["mixed_precision_presets"], "null") if key == "mixed_precision" else value == "null"
        else:
            section, field = parts
            fields = RECORD["sections"][section]["fields"]
            assert field in fields, f"{RECORD['sections'][section]['class']} ({section}) has no field {field}"
            note = fields[field]
            ok = annotation_accepts(note, value.strip('"')) or (key, value) in SET_BY_BRIDGE
        assert ok, f"{key}={value} does not fit {note}"


@pytest.mark.parametrize("case", CASES)
def test_every_override_is_a_recorded_field_of_its_type(case):
    assert_recorded_fields_of_their_type(overrides(script(case)))
    # the check bites: a name Megatron-Bridge does not define is not in the record
    assert "tensor_parallel_size" not in RECORD["sections"]["model"]["fields"]
    assert not annotation_accepts("Optional[int]", "true")


def test_recipes_and_command_line_are_megatron_bridges():
    assert set(RECIPES.values()) <= set(RECORD["recipes"])
    text = script("dense_train")
    flags = [a for a in array(text, "RECIPE") if a.startswith("--")]
    assert set(flags) <= set(RECORD["run_recipe_flags"]) and "--recipe" in flags
    # run_recipe.py's _collect_overrides: what its parser leaves must be KEY=VALUE, not an option
    assert all("=" in a and not a.startswith("-") for a in overrides(text))
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def hydra_applied(args: list[str], mixed_precision_as_dataclass: bool) -> dict:
    """The overrides applied as Megatron-Bridge applies them (omegaconf_utils.parse_hydra_overrides: OmegaConf
    struct mode, Hydra's OverridesParser, ConfigLoaderImpl._apply_overrides_to_config) to a config with every
    recorded field: a key that is not a field, or a value Hydra's grammar rejects, fails here."""
    omegaconf = pytest.importorskip("omegaconf", reason="hydra-core not installed: pip install '.[launchers]'")
    pytest.importorskip("hydra")
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser

    base: dict = {s: {f: None for f in v["fields"]} for s, v in RECORD["sections"].items()}
    # recipes hold a MixedPrecisionConfig / CommOverlapConfig object (a dict here) or the preset name / None
    if not mixed_precision_as_dataclass:
        base["mixed_precision"], base["comm_overlap"] = "bf16_mixed", None
    cfg = omegaconf.OmegaConf.create(base)
    omegaconf.OmegaConf.set_struct(cfg, True)
    ConfigLoaderImpl._apply_overrides_to_config(overrides=OverridesParser.create().parse_overrides(args), cfg=cfg)
    return omegaconf.OmegaConf.to_container(cfg)


@pytest.mark.parametrize("as_dataclass", [True, False])
@pytest.mark.parametrize("case", CASES)
def test_overrides_apply_as_megatron_bridge_applies_them_and_reproduce_the_plan(case, as_dataclass):
    pf = load_plan(PLANS / f"{case}.json")
    cfg = hydra_applied(overrides(script(case)), as_dataclass)
    p, m, model = pf.plan, pf.model, cfg["model"]
    tp, pp, cp = model["tensor_model_parallel_size"], model["pipeline_model_parallel_size"], \
        model["context_parallel_size"]
    env = {k: int(v) for k, v in re.findall(r"^(NNODES|GPUS_PER_NODE)=\$\{\w+:-(\d+)\}", script(case), re.M)}
    dp = env["NNODES"] * env["GPUS_PER_NODE"] // (tp * pp * cp)  # ConfigContainer.get_data_parallel_size
    assert (tp, pp, dp, cp) == (p.tp, p.pp, p.dp, p.cp)
    assert (model["virtual_pipeline_model_parallel_size"] or 1) == p.vpp and model["sequence_parallel"] == p.sp
    assert (cfg["train"]["micro_batch_size"], cfg["train"]["global_batch_size"]) == (p.micro_batch, p.global_batch)
    assert model["seq_length"] == cfg["dataset"]["seq_length"] == p.seq_len
    assert cfg["ddp"]["use_distributed_optimizer"] == cfg["optimizer"]["use_distributed_optimizer"] == (p.zero == 1)
    assert cfg["mixed_precision"] == "bf16_mixed" and cfg["comm_overlap"] is None
    assert (model["num_layers_in_first_pipeline_stage"] or 0, model["num_layers_in_last_pipeline_stage"] or 0) \
        == (p.pp_first, p.pp_last)
    if m.is_moe:
        assert (model["expert_model_parallel_size"], model["expert_tensor_parallel_size"]) == (p.ep, p.etp_resolved)
    recompute = {"selective": ("selective", ["core_attn"]), "full": ("full", None), "none": (None, None)}
    assert (model["recompute_granularity"], model["recompute_modules"]) == recompute[p.recompute]
    layout = model["pipeline_model_parallel_layout"]
    if p.pp_layers is not None:  # Megatron-Core's layout string: decoder layers per stage, E first, L last
        stages = re.sub(r"(.)\*(\d+)", lambda x: x.group(1) * int(x.group(2)), layout).split("|")
        assert [s.count("t") for s in stages] == list(p.pp_layers)
        assert stages[0].startswith("E") and stages[-1].endswith("L")
    else:
        assert layout is None


def test_deepseek_v3_plan_keeps_mtp_and_the_stage_split():
    # DeepSeek-V3's config.json: num_nextn_predict_layers 1 (Megatron-Bridge's recipe: mtp_num_layers 1); the
    # plan's 7 + 6 x 8 + 6 layer split over pp 8 replaces the recipe's own layout.
    cfg = hydra_applied(overrides(script("deepseek_train")), True)["model"]
    assert cfg["mtp_num_layers"] == 1 and cfg["pipeline_model_parallel_layout"] is None
    assert (cfg["num_layers_in_first_pipeline_stage"], cfg["num_layers_in_last_pipeline_stage"]) == (7, 6)
    assert (cfg["moe_token_dispatcher_type"], cfg["moe_flex_dispatcher_backend"]) == ("alltoall", None)
    flex = hydra_applied(overrides(script("deepseek_train", moe_dispatcher="deepep")), True)["model"]
    assert (flex["moe_token_dispatcher_type"], flex["moe_flex_dispatcher_backend"]) == ("flex", "deepep")
    sms = hydra_applied(overrides(script("deepseek_train", moe_dispatcher="deepep", moe_dispatch_sms=32)), True)
    assert sms["model"]["moe_flex_dispatcher_num_sms"] == 32  # the plan's dispatcher SMs (cost.comm.ep_sms)


def test_mtp_goes_into_an_explicit_layout():
    pf = load_plan(PLANS / "deepseek_train.json")
    pf = dataclasses.replace(pf, plan=pf.plan.model_copy(update={"pp_first": 0, "pp_last": 0,
                                                                  "pp_layers": (7, 8, 8, 8, 8, 8, 8, 6)}))
    layout = hydra_applied(overrides(render_all(pf, "megatron-bridge")[0][SCRIPT]), True)["model"][
        "pipeline_model_parallel_layout"]
    assert layout.startswith("Et*7|") and layout.endswith("|t*6mL")  # Megatron-Core: m = MTP, before the loss


# Each preset's bf16 layers (megatron/bridge/training/mixed_precision.py at 067f987d): current scaling keeps the
# first and last layer, nemotron_h's current scaling two of each; the others none. A plan keeping other layers
# in bf16 has no preset (a preset name takes no per-field override).
# Per-tensor fp8 picks its preset by ParallelPlan.fp8_scaling: bf16_with_fp8_delayed_scaling_mixed (fp8_recipe
# "delayed", fp8_param_gather True, no bf16 layers) or the current-scaling ones.
@pytest.mark.parametrize("dtype,recipe,fp8_params,bf16_layers,preset", [
    ("fp8", "tensorwise", True, (1, 1), "bf16_with_fp8_current_scaling_mixed"),
    ("fp8", "tensorwise", True, (2, 2), "nemotron_h_bf16_with_fp8_current_scaling_mixed"),
    ("fp8", "delayed", True, (None, None), "bf16_with_fp8_delayed_scaling_mixed"),
    ("fp8", "blockwise", False, (None, None), "bf16_with_fp8_subchannel_scaling_mixed"),
    ("fp8", "mxfp8", True, (None, None), "bf16_with_mxfp8_mixed"),
    ("fp4", "nvfp4", True, (0, 0), "bf16_with_nvfp4_mixed"),
])
def test_precision_presets(dtype, recipe, fp8_params, bf16_layers, preset):
    scaling = {"fp8_scaling": "delayed" if recipe == "delayed" else "current"}
    args = overrides(script("dense_train", dtype=dtype, recipe="tensorwise" if recipe == "delayed" else recipe,
                            fp8_params=fp8_params, bf16_layers_start=bf16_layers[0],
                            bf16_layers_end=bf16_layers[1], **scaling))
    assert f"mixed_precision={preset}" in args and preset in RECORD["mixed_precision_presets"]


@pytest.mark.parametrize("case,changes,needle", [
    ("moe_train", {}, "has no pretrain recipe for mixtral-8x7b"),
    ("fsdp_train", {}, r"ZeRO-3 \(Megatron-FSDP optim_grads_params\) with grad_accumulation add"),
    ("fsdp_train", {"grad_accumulation": "fused"},
     r"ZeRO-3 \(Megatron-FSDP optim_grads_params\) priced without megatron_fsdp \(zero 3"),
    ("dense_train", {"dtype": "fp8", "recipe": "tensorwise", "bf16_layers_start": 1, "bf16_layers_end": 1,
                     "fp8_scaling": "current"}, "re-plan with --fp8-params"),
    ("dense_train", {"dtype": "fp8", "recipe": "rowwise"}, "fp8 rowwise scaling"),
    # the fp8 current-scaling preset keeps layers 1 / 1 in bf16, the plan none (Megatron-Core's default)
    ("dense_train", {"dtype": "fp8", "recipe": "tensorwise", "fp8_params": True, "fp8_scaling": "current"},
     "re-plan with --bf16-layers-start 1 --bf16-layers-end 1"),
    # NVFP4's default keeps the last 12 of llama-3.1-70b's 80 layers in bf16; bf16_with_nvfp4_mixed none
    ("dense_train", {"dtype": "fp4", "recipe": "nvfp4", "fp8_params": True}, "0 / 12 layers kept in bf16"),
    ("dense_train", {"tp_comm_overlap": True}, "TP communication overlap"),
    ("dense_train", {"attention_kernel": "flash2"}, "flash2 attention kernel"),
    ("dense_train", {"pp_schedule": "zero-bubble"}, "zero-bubble pipeline schedule"),
    # a full-iteration graph over dropless MoE layers without the fused grouped MLP: Megatron-Core cd4afffa6
    # (Megatron-Bridge 0.6's pin) asserts use_transformer_engine_op_fuser beside the hybridep static budget
    ("deepseek_train", {"cuda_graphs": "full-iteration", "moe_dispatcher": "deepep", "moe_flex_backend": "hybridep",
                        "expert_gemm": "per-expert"},
     "requires use_transformer_engine_op_fuser.*--train-cuda-graphs layers"),
    ("dense_train", {"seq_len": 262144}, "past llama-3.1-70b's max_position_embeddings"),  # YaRN was dropped
])
def test_refusals(case, changes, needle):
    pf = load_plan(PLANS / f"{case}.json")
    pf = dataclasses.replace(pf, plan=pf.plan.model_copy(update=changes))
    with pytest.raises(CannotExpress, match=needle):
        render_all(pf, "megatron-bridge")


def test_cli_refuses_with_one_line_and_writes_nothing(cli, tmp_path):
    r = cli("export", PLANS / "moe_train.json", "--to", "megatron-bridge", "-o", tmp_path / "out")
    line = r.refusal()
    assert "no pretrain recipe for mixtral-8x7b" in line and "export to megatron" in line
    assert not (tmp_path / "out").exists()
    assert cli("export", PLANS / "dense_train.json", "--to", "megatron-bridge", "-o", tmp_path / "ok").code == 0
    assert os.access(tmp_path / "ok" / SCRIPT, os.X_OK)


@pytest.mark.parametrize("target,name", [("torchrun", "torchrun.sh"), ("slurm", "job.sbatch")])
def test_torchrun_and_slurm_wrap_megatron_bridge(target, name):
    files, _ = render_all(load_plan(PLANS / "deepseek_train.json"), target, "megatron-bridge")
    text = files[name]
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    assert "run_recipe.py" in text and array(text, "OVERRIDES") == array(script("deepseek_train"), "OVERRIDES")
    with pytest.raises(CannotExpress, match="no pretrain recipe"):
        render_all(load_plan(PLANS / "moe_train.json"), target, "megatron-bridge")


def test_a_plans_pipeline_layout_reaches_the_bridge_recipe():
    # Megatron-Bridge's DeepSeek-V3 H100 preset layout (PP 8, VPP 4; set_deepseek_v3_pipeline_model_parallel_layout
    # "Et|(tt|)*30mL" at 067f987): a plan holding it must not fall back to the even split or the recipe's own.
    from llmplan.specs.layout import parse_layout
    pf = load_plan(PLANS / "deepseek_train.json")
    chunks = parse_layout("Et|(tt|)*30mL")
    pf = dataclasses.replace(pf, plan=pf.plan.model_copy(update={"pp_first": 0, "pp_last": 0, "vpp": 4,
                                                                  "pp_layout": chunks}))
    layout = hydra_applied(overrides(render_all(pf, "megatron-bridge")[0][SCRIPT]), True)["model"][
        "pipeline_model_parallel_layout"]
    assert "," not in layout and parse_layout(layout) == chunks


def test_a_plans_recompute_modules_reach_the_bridge_recipe():
    # The plan's Megatron modules, not always core_attn (they were dropped: the script said [core_attn])
    args = overrides(script("dense_train", recompute="selective", recompute_modules=("layernorm", "mlp")))
    cfg = hydra_applied(args, True)["model"]
    assert cfg["recompute_granularity"] == "selective" and list(cfg["recompute_modules"]) == ["layernorm", "mlp"]


# Kimi-K2 as Megatron-Bridge's recipe runs it (NVIDIA-NeMo/Megatron-Bridge 6124fbe, r0.6.0 = v0.6.0 for these files:
# recipes/kimi/kimi_k2.py aliases recipes/kimi/h100/kimi_k2.py kimi_k2_pretrain_512gpu_h100_bf16_config, TP 2, PP 16
# laid out E + 4 | 4 x 14 | 1 + L, EP 32, ETP 1, sequence 4096, global batch 4096 on 512 GPUs; _apply_kimi_k2_optimizer
# "muon": distributed_muon_with_cosine_annealing's dist_muon, ddp.use_distributed_optimizer False, grad_reduce_in_fp32
# True). The plan: zero 1 over an all-reducing DDP, fp32 gradient reduction.
KIMI = ("estimate", "--model", "kimi-k2", "--hardware", "dgx-h100", "--nodes", "64", "--tp", "2", "--pp", "16",
        "--ep", "32", "--etp", "1", "--pp-first-layers", "4", "--pp-last-layers", "1", "--global-batch", "4096",
        "--seq-len", "4096", "--zero", "1", "--recompute", "selective")


def kimi_script(cli, tmp_path, *extra) -> tuple[object, str]:
    path = tmp_path / "kimi.json"
    assert cli(*KIMI, *extra, "--save", path, "--force").code == 0
    out = tmp_path / "out"
    r = cli("export", path, "--to", "megatron-bridge", "-o", out)
    return r, (out / SCRIPT).read_text() if (out / SCRIPT).exists() else ""


def test_kimi_k2_muon_plan_exports_to_its_recipe(cli, tmp_path):
    assert RECIPES["kimi-k2"] == "kimi_k2_pretrain_config" and RECIPES["kimi-k2"] in RECORD["recipes"]
    r, text = kimi_script(cli, tmp_path, "--optimizer", "muon", "--grad-reduce", "all-reduce")
    assert r.code == 0, r.err
    assert array(text, "RECIPE")[:2] == ["--recipe", "kimi_k2_pretrain_config"]
    args = overrides(text)
    assert_recorded_fields_of_their_type(args)
    cfg = hydra_applied(args, True)
    model, opt, ddp = cfg["model"], cfg["optimizer"], cfg["ddp"]
    assert (model["tensor_model_parallel_size"], model["pipeline_model_parallel_size"],
            model["expert_model_parallel_size"], model["expert_tensor_parallel_size"]) == (2, 16, 32, 1)
    # the plan's 4 + 4 x 14 + 1 split replaces the recipe's layout (written, so that run_recipe.py's
    # sync_model_pipeline_layout does not rebuild it from _get_kimi_k2_pipeline_layout)
    assert "model.pipeline_model_parallel_layout=null" in args
    assert (model["num_layers_in_first_pipeline_stage"], model["num_layers_in_last_pipeline_stage"]) == (4, 1)
    assert (opt["optimizer"], opt["muon_num_ns_steps"], opt["muon_tp_mode"]) == ("dist_muon", 5, "blockwise")
    assert ddp["use_distributed_optimizer"] is False and opt["use_distributed_optimizer"] is False
    assert cfg["mixed_precision"] == "bf16_mixed"  # grad_reduce_in_fp32 true, as the recipe's own config
    assert model["mtp_num_layers"] is None  # Kimi-K2 has no MTP module (config.json num_nextn_predict_layers 0)


def test_kimi_k2_adam_plan_names_adam_over_the_recipes_muon(cli, tmp_path):
    # the recipe sets dist_muon; an AdamW plan must not inherit it (the other recipes keep OptimizerConfig's adam)
    r, text = kimi_script(cli, tmp_path)
    assert r.code == 0, r.err
    cfg = hydra_applied(overrides(text), True)
    assert cfg["optimizer"]["optimizer"] == "adam" and cfg["ddp"]["use_distributed_optimizer"] is True
    assert "optimizer.optimizer=adam" not in overrides(script("dense_train"))


def test_kimi_k2_muon_over_reduce_scatter_is_refused(cli, tmp_path):
    r, text = kimi_script(cli, tmp_path, "--optimizer", "muon")
    line = r.refusal()
    assert "Muon over reduce-scattered gradients" in line and "re-plan with --grad-reduce all-reduce" in line
    assert text == ""


# The plan's CUDA graphs as Megatron-Bridge's performance scripts write them (NVIDIA-NeMo/Megatron-Bridge r0.6.0,
# 6124fbe: scripts/performance/utils/overrides.py _set_cuda_graph_overrides; src/megatron/bridge/utils/cuda_graph.py
# set_cuda_graph_modules / set_full_iteration_cuda_graph; training/config.py asserts check_for_nan_in_loss off under
# the full-iteration graph), over the TransformerConfig of the Megatron-LM commit that branch pins (cd4afffa6:
# cuda_graph_impl's Literal holds "transformer_engine" and "full_iteration"; cuda_graph_modules the module names).
GRAPH_FIELDS = {"layers": {"model.cuda_graph_impl", "model.cuda_graph_modules", "model.cuda_graph_scope",
                           "model.use_te_rng_tracker"},
                "full-iteration": {"model.cuda_graph_impl", "model.cuda_graph_modules", "model.cuda_graph_scope",
                                   "model.use_te_rng_tracker", "rerun_state_machine.check_for_nan_in_loss",
                                   "model.moe_expert_rank_capacity_factor"}}
HYBRIDEP = {"moe_dispatcher": "deepep", "moe_flex_backend": "hybridep"}


def test_the_recorded_field_list_holds_the_cuda_graph_fields():
    model = RECORD["sections"]["model"]["fields"]
    assert model["cuda_graph_impl"] == "Literal['none', 'local', 'transformer_engine', 'full_iteration']"
    assert "List[str]" in model["cuda_graph_modules"] and "Optional" in model["cuda_graph_scope"]
    assert RECORD["sections"]["rerun_state_machine"]["fields"]["check_for_nan_in_loss"] == "bool"
    assert RECORD["sections"]["rng"]["fields"]["te_rng_tracker"] == "bool"
    for fields in GRAPH_FIELDS.values():
        for key in fields:
            section, field = key.split(".")
            assert field in RECORD["sections"][section]["fields"], key


@pytest.mark.parametrize("case,changes,modules", [
    ("dense_train", {}, ["attn", "mlp"]),  # a dense layer's MLP graphed beside the attention
    # the router and preprocess, not the experts; the first 3 dense layers' MLP (moe_layer_freq [0]*3+[1]*58, which
    # TransformerConfig at cd4afffa6 lets graph mlp)
    ("deepseek_train", {}, ["attn", "mlp", "moe_router", "moe_preprocess"]),
    # recompute module moe around a graphed router: TransformerConfig refuses it, the router stays eager
    ("deepseek_train", {"recompute": "selective", "recompute_modules": ("moe",)}, ["attn", "mlp"]),
])
def test_a_layers_plan_writes_transformer_engine_graphs_of_the_priced_modules(case, changes, modules):
    args = overrides(script(case, cuda_graphs="layers", **changes))
    assert_recorded_fields_of_their_type(args)
    assert GRAPH_FIELDS["layers"] <= {a.split("=", 1)[0] for a in args}
    assert "rerun_state_machine.check_for_nan_in_loss=false" not in args  # only the full-iteration graph needs it
    model = hydra_applied(args, True)["model"]
    assert model["cuda_graph_impl"] == "transformer_engine" and list(model["cuda_graph_modules"]) == modules
    # the library recipes set the deprecated scope ("full"), which TransformerConfig refuses beside the modules
    assert model["cuda_graph_scope"] is None and model["use_te_rng_tracker"] is True


def test_a_full_iteration_plan_writes_bridges_full_iteration_graph():
    args = overrides(script("deepseek_train", cuda_graphs="full-iteration", moe_paged_stash=1.2, **HYBRIDEP))
    assert_recorded_fields_of_their_type(args)
    assert GRAPH_FIELDS["full-iteration"] <= {a.split("=", 1)[0] for a in args}
    cfg = hydra_applied(args, True)
    model = cfg["model"]
    assert model["cuda_graph_impl"] == "full_iteration" and list(model["cuda_graph_modules"]) == []
    assert model["cuda_graph_scope"] is None and model["use_te_rng_tracker"] is True
    # ConfigContainer.validate asserts the loss NaN check off; the gradient one is the plan's (off: check_plan)
    assert cfg["rerun_state_machine"]["check_for_nan_in_loss"] is False and cfg["ddp"]["check_for_nan_in_grad"] is False
    # the dropless layers' static budget over hybridep and the fused grouped MLP, 1.5 as Bridge's DeepSeek presets
    assert (model["moe_token_dispatcher_type"], model["moe_flex_dispatcher_backend"]) == ("flex", "hybridep")
    assert model["use_transformer_engine_op_fuser"] is True and model["moe_expert_rank_capacity_factor"] == 1.5
    assert model["moe_paged_stash"] is True and model["moe_paged_stash_buffer_size_factor_cuda"] == 1.2
    dense = overrides(script("dense_train", cuda_graphs="full-iteration"))
    assert "model.cuda_graph_impl=full_iteration" in dense and not any("capacity" in a for a in dense)


def test_a_plan_without_graphs_turns_a_recipes_own_off():
    # qwen3_30b_a3b_pretrain_config graphs moe_router and moe_preprocess (recipes/qwen/h100/qwen3_moe.py at
    # 6124fbe); a plan priced without graphs must not inherit them
    for case in CASES:
        args = overrides(script(case))
        assert "model.cuda_graph_impl=none" in args
        # ConfigContainer turns both RNG-tracker fields on if either is (training/config.py at 6124fbe): both off
        assert "model.use_te_rng_tracker=false" in args and "rng.te_rng_tracker=false" in args


def test_megatron_fsdp_runs_graph_safe_under_graphs():
    # Megatron-LM's training.py sets both itself (cd4afffa6); Bridge calls no such code, its GB300 DeepSeek-V3
    # FSDP preset writes them (perf_recipes/deepseek/gb300/deepseek_v3.py at 6124fbe)
    pf = load_plan(PLANS / "dense_train.json")
    for graphs, gather in (("layers", None), ("full-iteration", "false")):
        p = pf.plan.model_copy(update={"cuda_graphs": graphs, "zero": 2, "megatron_fsdp": True, "pp": 1})
        args = build_overrides(dataclasses.replace(pf, plan=p))
        assert "ddp.megatron_fsdp_cuda_graph_mode=true" in args
        assert (f"ddp.fsdp_all_gather_in_start_param_sync={gather}" in args) == (gather is not None)


def build_overrides(pf) -> list[str]:
    from llmplan.export.bridge import hydra_value, overrides as bridge_overrides
    return [f"{k}={hydra_value(v)}" for k, v in bridge_overrides(pf)]
