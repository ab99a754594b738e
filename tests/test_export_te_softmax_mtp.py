"""Follow-ups of export-mtp (docs/validation.md#export-followups): what each export runs for an unfused softmax and
for MTP modules, against what the estimate priced.

Expected limits come from the launchers' sources, not from llmplan:
- Megatron-Core's fused causal softmax, priced for softmax_kernel fused: 16 < sk <= 4096, sq % 4 == 0, else the
  fp32 torch fallback (NVIDIA/Megatron-LM@d98e8a64dd megatron/core/fusions/fused_softmax.py is_kernel_available).
- What Megatron-LM's --attention-backend unfused runs under its default Transformer Engine spec: TE's
  FusedScaleMaskSoftmax, kernel for 16 < sk < 16384 with sk % 8 == 0 (NVIDIA/TransformerEngine@d0067d0da6
  transformer_engine/pytorch/attention/dot_product_attention/softmax.py is_kernel_available).
  A softmax_kernel te plan prices TE's path at every length and exports; a softmax_kernel fused plan (Megatron-Core's
  own kernel, which this export does not run) is refused with the fix.
- torchtitan v0.2.2 has no MTP; 0.3.0rc1 (pytorch/torchtitan@1fdf90d) builds DeepSeek-V3's only from
  model_registry(num_mtp_layers=N) inside a config function (models/deepseek_v3/config_registry.py:
  deepseek_v3_debugmodel_mtp; deepseek_v3_671b sets none).
- Megatron-LM's --mtp-num-layers (TransformerConfig.mtp_num_layers) builds MTP modules for any GPT model, dense
  or MoE (NVIDIA/Megatron-LM@d98e8a64dd gpt_builders.py builds the MTP block spec whenever mtp_num_layers)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.test_export import MEGATRON_VALUE_FLAGS, recorded_parser
from tests.test_export_nemotron3 import run_argv

REPO = Path(__file__).resolve().parents[1]
LLAMA = ["-m", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1", "--tp", "8", "--global-batch", "64"]


def _plan(cli, tmp_path: Path, *args: str) -> Path:
    path = tmp_path / f"plan{len(list(tmp_path.glob('plan*.json')))}.json"
    r = cli("estimate", *args, "--save", path)
    assert r.code in (0, 3), r.err
    return path


def _export(cli, plan: Path, target: str, out: Path):
    return cli("export", plan, "--to", target, "-o", out)


def _megatron_args(script: Path, tmp_path: Path):
    """The script's arguments to pretrain_gpt.py (bash runs it with a torchrun stub that prints them), parsed by
    the recorded Megatron-LM parser."""
    argv = run_argv(script, tmp_path, "pretrain_gpt.py")
    ns, unknown = recorded_parser("megatron-lm", MEGATRON_VALUE_FLAGS)[0].parse_known_args(argv)
    assert not unknown, unknown
    return ns


LENGTHS = [4088, 4092, 4096, 4104, 8192, 16376, 16380, 16384]


@pytest.mark.parametrize("seq", LENGTHS)
def test_te_softmax_plans_export_at_every_length(cli, tmp_path, seq):
    # softmax_kernel te prices what Transformer Engine runs at each length (its kernel or its fp32 torch path:
    # docs/validation.md#te-softmax), so no length is refused
    plan = _plan(cli, tmp_path, *LLAMA, "--no-flash-attention", "--softmax-kernel", "te", "--seq-len", str(seq))
    r = _export(cli, plan, "megatron", tmp_path / "o")
    assert r.code == 0, r.err
    ns = _megatron_args(tmp_path / "o" / "megatron_pretrain.sh", tmp_path)
    assert ns.attention_backend == "AttnBackend.unfused" and int(ns.seq_length) == seq


FUSED_LINE = ("error: megatron cannot express this plan: Megatron's fused causal softmax (softmax_kernel fused: "
              "scaled_upper_triang_masked_softmax over the lower triangle, or its fp32 torch fallback past 4096 "
              "keys); this launcher runs Transformer Engine's unfused attention softmax; re-plan with "
              "--softmax-kernel te")


@pytest.mark.parametrize("seq", [2048, 4096, 8192])
def test_megatron_core_softmax_plans_are_refused(cli, tmp_path, seq):
    plan = _plan(cli, tmp_path, *LLAMA, "--no-flash-attention", "--seq-len", str(seq))
    assert _export(cli, plan, "megatron", tmp_path / "o").refusal() == FUSED_LINE
    assert not (tmp_path / "o").exists()


def test_flash_attention_at_the_same_lengths_exports(cli, tmp_path):
    plan = _plan(cli, tmp_path, *LLAMA, "--seq-len", "8192")
    assert _export(cli, plan, "megatron", tmp_path / "o").code == 0


DSV3 = ["-m", "deepseek-v3", "--hardware", "dgx-h100", "--nodes", "32", "--tp", "1", "--ep", "32", "--zero", "3",
        "--precision", "fp8-rowwise"]


@pytest.mark.parametrize("target", ["torchtitan", "torchtitan-0.2"])
def test_torchtitan_refuses_the_priced_mtp_module(cli, tmp_path, target):
    plan = _plan(cli, tmp_path, *DSV3)
    assert _export(cli, plan, target, tmp_path / "o").refusal() == (
        f"error: {target} cannot express this plan: the 1 MTP module the estimate priced for deepseek-v3 "
        "(torchtitan v0.2.2 has none; 0.3.0 builds DeepSeek-V3's only from model_registry's num_mtp_layers "
        "with MTPLoss in a config function, which its deepseek_v3_671b does not set and no command-line field "
        "reaches); re-plan with --mtp-layers 0, or export to megatron")


@pytest.mark.parametrize("target", ["torchtitan", "torchtitan-0.2"])
def test_torchtitan_exports_the_plan_without_mtp(cli, tmp_path, target):
    plan = _plan(cli, tmp_path, *DSV3, "--mtp-layers", "0")
    r = _export(cli, plan, target, tmp_path / "o")
    assert r.code == 0, r.err
    assert any(f.is_file() for f in (tmp_path / "o").rglob("*"))


@pytest.fixture
def dense_mtp(tmp_path) -> Path:
    """llama-3.1-8b with one MTP module: a dense, non-hybrid model with MTP."""
    spec = yaml.safe_load((REPO / "model_specs" / "llama-3.1-8b.yaml").read_text())
    spec.update(name="llama-mtp", num_nextn_predict_layers=1)
    path = tmp_path / "llama-mtp.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_dense_model_exports_its_mtp_modules(cli, tmp_path, dense_mtp):
    plan = _plan(cli, tmp_path, "-m", dense_mtp, "--hardware", "dgx-h100", "--nodes", "1", "--tp", "2", "--pp",
                 "2", "--global-batch", "64", "--pp-layout", "balanced")
    assert _export(cli, plan, "megatron", tmp_path / "o").code == 0
    ns = _megatron_args(tmp_path / "o" / "megatron_pretrain.sh", tmp_path)
    assert int(ns.mtp_num_layers) == 1 and ns.mtp_use_repeated_layer is False
    assert ns.num_experts is None
    # Megatron-Core's PipelineParallelLayerLayout: as many m as --mtp-num-layers, on the last stage
    layout = ns.pipeline_model_parallel_layout.strip('"')
    assert layout.count("m") == 1 and layout.endswith("mL")


def test_dense_model_without_mtp_at_mtp_layers_0(cli, tmp_path, dense_mtp):
    plan = _plan(cli, tmp_path, "-m", dense_mtp, "--hardware", "dgx-h100", "--nodes", "1", "--tp", "8",
                 "--global-batch", "64", "--mtp-layers", "0")
    assert _export(cli, plan, "megatron", tmp_path / "o").code == 0
    ns = _megatron_args(tmp_path / "o" / "megatron_pretrain.sh", tmp_path)
    assert ns.mtp_num_layers is None and ns.mtp_use_repeated_layer is False


def test_torchtitans_own_config_functions_build_mtp_only_where_they_ask():
    # The installed torchtitan 0.3.0 itself: the config function the export names builds no MTP layer and trains
    # with the plain loss; its MTP example builds one with MTPLoss (models/deepseek_v3/config_registry.py).
    from tests.test_export import TORCHTITAN_MISSING
    manager = pytest.importorskip("torchtitan.config.manager", reason=TORCHTITAN_MISSING)
    full = manager.ConfigManager().parse_args(["--module", "deepseek_v3", "--config", "deepseek_v3_671b"])
    assert list(full.model_spec.model.mtp_layers) == []
    assert "MTPLoss" not in type(full.loss).__qualname__
    mtp = manager.ConfigManager().parse_args(["--module", "deepseek_v3", "--config", "deepseek_v3_debugmodel_mtp"])
    assert len(mtp.model_spec.model.mtp_layers) == 1 and type(mtp.loss).__qualname__ == "MTPLoss.Config"


SEARCH = ["-m", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1", "--no-flash-attention", "--top", "3"]


def test_unfused_search_for_megatron_tries_te_and_exports(cli, tmp_path):
    # Megatron-LM's --attention-backend unfused runs TE's softmax and the export refuses every other kernel
    # (export.EVERY_PLAN["megatron"]): the search tries softmax_kernel te beside the default fused (main: exit 2)
    r = cli("search", *SEARCH, "--target", "megatron", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["plans"][0]["plan"]["softmax_kernel"] == "te"
    assert {t["softmax_kernel"] for t in doc["switches"]["tried"]} == {"fused", "te"}
    saved = tmp_path / "best.json"
    r = cli("search", *SEARCH, "--target", "megatron", "--save", saved)
    assert r.code == 0, r.err
    assert _export(cli, saved, "megatron", tmp_path / "o").code == 0


def test_unfused_search_forcing_fused_for_megatron_names_the_rule_once(cli):
    r = cli("search", *SEARCH, "--target", "megatron", "--softmax-kernel", "fused")
    assert r.code == 2
    line = r.err.strip()
    assert "\n" not in line and "is refused whole: " + FUSED_LINE.removeprefix("error: ") in line, line


def test_deepspeed_refuses_te_softmax(cli, tmp_path):
    plan = _plan(cli, tmp_path, *LLAMA, "--tp", "1", "--no-flash-attention", "--softmax-kernel", "te")
    assert _export(cli, plan, "deepspeed", tmp_path / "o").refusal() == (
        "error: deepspeed cannot express this plan: Transformer Engine's unfused attention softmax (softmax_kernel "
        "te: Megatron-Core's TE layer, whose mask build and kernel a DeepSpeed training script does not run); "
        "re-plan with --softmax-kernel fused or --flash-attention, or export to megatron")
    fused = _plan(cli, tmp_path, *LLAMA, "--tp", "1", "--no-flash-attention", "--grad-dtype", "bf16")
    assert _export(cli, fused, "deepspeed", tmp_path / "f").code == 0


@pytest.mark.parametrize("target", ["torchtitan", "torchtitan-0.2"])
@pytest.mark.parametrize("kernel", ["fused", "te"])
def test_torchtitan_refuses_unfused_attention_with_a_flash_fix(cli, tmp_path, target, kernel):
    # torchtitan's attention is SDPA (cuDNN / flash / memory-efficient ahead of math) or FlexAttention: no
    # unfused plan runs as priced, whatever its softmax kernel (main exported `fused` and said of `te` that
    # torchtitan runs Megatron's fused softmax)
    plan = _plan(cli, tmp_path, *LLAMA, "--no-flash-attention", "--softmax-kernel", kernel)
    line = _export(cli, plan, target, tmp_path / "o").refusal()
    assert line.endswith("re-plan with --flash-attention") and "SDPA" in line and "Megatron" not in line, line
