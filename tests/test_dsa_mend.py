"""Defects in the DSA indexer-training change (docs/validation.md#dsa-mend)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmplan.cost.sparse_gather import reference_rate
from llmplan.specs.registry import builtin_gpus

GPUS = builtin_gpus()


@pytest.mark.parametrize("gpu, fp32", [("mi355x", 157.3), ("mi350x", 144.2)])
def test_cdna4_profiles_list_their_fp32_rate(gpu: str, fp32: float) -> None:
    # AMD's published peak FP32 (vector = matrix): 157.3 TF MI355X, 144.2 TF MI350X, AMD CDNA 4 architecture
    # whitepaper Table 2 (= 256 CUs x 256 FLOP/clock/CU x 2.4 / 2.2 GHz); exact to the printed 0.1 TF. No tf32 on
    # CDNA 4 (TF32 emulated through BF16, same whitepaper), so the reference path runs at fp32
    g = GPUS[gpu]
    assert "tf32" not in g.tflops and g.tflops["fp32"] == fp32
    assert reference_rate(g) == pytest.approx(fp32 * 1e12 * g.sustained_clock_fraction)


@pytest.mark.parametrize("args", [
    ("-m", "deepseek-v3.2", "--nodes", "64", "--ep", "64", "--pp", "8", "--pp-layout", "balanced"),
    ("-m", "deepseek-v3.2", "--nodes", "64", "--ep", "64", "--pp", "8", "--pp-layout", "balanced",
     "--indexer-loss", "off"),
    ("-m", "deepseek-v4-flash", "--nodes", "8", "--ep", "64"),
])
def test_dsa_models_estimate_on_mi355x(cli, args: tuple[str, ...]) -> None:  # noqa: ANN001
    r = cli("estimate", "--hardware", "mi355x-8", *args)
    assert r.code == 0, r.err


def _bf16_only(tmp_path: Path) -> Path:
    f = tmp_path / "bf16only.yaml"
    f.write_text("base: mi355x-8\ngpu:\n  tflops: {bf16: 2500, fp16: 2500, fp8: 5000}\n")
    return f


def test_a_profile_without_fp32_or_tf32_refuses_the_dsa_plan_in_one_line(cli, tmp_path: Path) -> None:  # noqa: ANN001
    r = cli("estimate", "-m", "deepseek-v3.2", "--hardware", _bf16_only(tmp_path), "--nodes", "64", "--ep", "64",
            "--pp", "8", "--pp-layout", "balanced")
    assert r.code == 2 and "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1, r.err
    assert "tf32 or fp32" in r.err and "tflops.fp32" in r.err
    dense = cli("estimate", "-m", "llama-3.1-8b", "--hardware", _bf16_only(tmp_path), "--nodes", "1")
    assert dense.code == 0, dense.err


def test_search_on_a_profile_without_fp32_or_tf32_does_not_crash(cli, tmp_path: Path) -> None:  # noqa: ANN001
    r = cli("search", "-m", "deepseek-v4-flash", "--hardware", _bf16_only(tmp_path), "--nodes", "8",
            "--global-batch", "64")
    assert r.code in (0, 2) and "Traceback" not in r.err and "internal error" not in r.err, r.err


V32_ARGS = ("-m", "deepseek-v3.2", "--hardware", "dgx-h100", "--nodes", "32", "--tp", "8", "--pp", "8",
            "--pp-first-layers", "7", "--pp-last-layers", "6", "--ep", "32", "--etp", "1", "--global-batch", "1024")


@pytest.mark.parametrize("extra, want", [((), "dense"), (("--indexer-loss", "off"), "off"),
                                         (("--indexer-loss", "sparse"), "sparse")])
def test_the_priced_indexer_setting_is_a_top_level_key_and_a_header_line(cli, extra, want) -> None:  # noqa: ANN001
    from llmplan.specs.plan import ParallelPlan
    doc = cli("estimate", *V32_ARGS, *extra, "--json").json()
    # DeepSeek-V3.2's default is dense (Megatron-Bridge PR #1421); the plan keeps what was asked
    assert doc["indexer_loss_priced"] == want
    assert doc["plan"]["indexer_loss"] == (extra[1] if extra else None)
    assert ParallelPlan(**doc["plan"]).indexer_loss == doc["plan"]["indexer_loss"]
    text = cli("estimate", *V32_ARGS, *extra).out
    assert f"DSA indexer loss: {want}" + ("" if extra else " (the default)") in text


def test_a_model_without_an_indexer_prices_it_off_and_prints_no_line(cli) -> None:  # noqa: ANN001
    args = ("-m", "gpt3-175b", "--hardware", "dgx-h100", "--nodes", "16", "--tp", "8", "--pp", "8")
    assert cli("estimate", *args, "--json").json()["indexer_loss_priced"] == "off"
    out = cli("estimate", *args).out
    assert "DSA indexer" not in out and "bias-GeLU" not in out


def test_v4_on_gb200_prices_the_sparse_loss_and_search_entries_carry_the_key(cli) -> None:  # noqa: ANN001
    doc = cli("search", "-m", "deepseek-v4-flash", "--hardware", "gb200-nvl72", "--nodes", "16", "--global-batch",
              "256", "--json").json()
    assert doc["plans"], doc
    for e in doc["plans"]:
        assert e["indexer_loss_priced"] == ("sparse" if e["plan"]["flash_attention"] else "off")


def test_the_unfused_bias_gelu_is_printed(cli, tmp_path: Path) -> None:  # noqa: ANN001
    import json
    path = tmp_path / "plan.json"
    assert cli("estimate", "-m", "gpt3-175b", "--hardware", "dgx-h100", "--nodes", "16", "--tp", "8", "--pp", "8",
               "--save", path).code == 0
    doc = json.loads(path.read_text())
    doc["plan"]["bias_gelu_fusion"] = False
    path.write_text(json.dumps(doc))
    r = cli("estimate", "--plan", path)
    assert r.code == 0 and "bias-GeLU: unfused" in r.out, r.err
    assert cli("estimate", "--plan", path, "--json").json()["plan"]["bias_gelu_fusion"] is False


def test_v4_default_follows_the_fused_path_not_the_gpu_alone() -> None:
    from llmplan.cost.sparse_gather import fused_csa_priced, indexer_loss
    from llmplan.specs.plan import ParallelPlan
    from llmplan.specs.registry import builtin_models
    flash = builtin_models()["deepseek-v4-flash"]
    gb200, h100 = GPUS["gb200"], GPUS["h100-sxm"]
    fused = ParallelPlan(ep=8, dp=8, seq_len=4096)
    unfused = fused.model_copy(update={"flash_attention": False})
    assert fused_csa_priced(flash, fused, gb200) and indexer_loss(flash, fused, gb200) == "sparse"
    # GB200 has a sparse gather rate, but without fused attention the fused CSA path is not priced: off, as the
    # docstrings and Megatron-Bridge's library recipes (coefficient 0.0) say
    assert not fused_csa_priced(flash, unfused, gb200) and indexer_loss(flash, unfused, gb200) == "off"
    assert indexer_loss(flash, fused, h100) == "off"


def test_bridge_overrides_of_unfused_v4_on_gb200_write_no_indexer_loss(cli, tmp_path: Path) -> None:  # noqa: ANN001
    # The CLI export refuses unfused attention for Bridge (attention_backend), so dsa_overrides is read directly:
    # the library recipe's coefficient 0.0 and no sparse flag (recipes/deepseek/h100/deepseek_v4.py at 067f987df)
    import dataclasses

    from llmplan.export.bridge import dsa_overrides
    from llmplan.planfile import load_plan
    path = tmp_path / "plan.json"
    made = cli("estimate", "-m", "deepseek-v4-flash", "--hardware", "gb200-nvl72", "--nodes", "2", "--ep", "8",
               "--global-batch", "64", "--save", path)
    assert made.code == 0, made.err
    pf = load_plan(path)
    unfused = dataclasses.replace(pf, plan=pf.plan.model_copy(update={"flash_attention": False}))
    assert dsa_overrides(unfused) == [("model.dsa_indexer_loss_coeff", 0.0),
                                      ("model.dsa_indexer_use_sparse_loss", False)]


@pytest.mark.parametrize("kw, loss, gib", [
    # worked by hand (docs/formulas.md#mem.indexer_reference): P = b (s/cp) s = 2^24 at s 4096, b 1, cp 1;
    # index scores 2 x 4 x H_I(64) x P = 8 GiB; KL target (17 a/t + 8) x P; with the loss on, the backward's
    # grad_scores, relu_mask, relu_mask.float() and their product (4 + 1 + 4 + 4) x 64 + 4 = 836 B x P
    ({"tp": 8}, None, 13.0625),                # default dense: max(8, 4.375, 836 x 2^24 B = 13.0625)
    ({"tp": 8}, "off", 8.0),                   # scores alone
    ({"tp": 1}, "sparse", 34.125),             # (17 x 128 + 8) x 2^24
    ({"tp": 1}, "off", 8.0),
    ({"tp": 8, "cp": 2}, None, 6.53125),       # the rank's s/2 query rows
    ({"tp": 8, "seq_len": 16384}, None, 209.0),  # 836 x 2^28
])
def test_reference_indexer_transient_by_hand(kw, loss, gib) -> None:  # noqa: ANN001
    from llmplan.cost.activations import indexer_reference_transient_bytes
    from llmplan.specs.plan import ParallelPlan
    from llmplan.specs.registry import builtin_models
    models = builtin_models()
    plan = ParallelPlan(**{"seq_len": 4096, "indexer_loss": loss, **kw})
    assert indexer_reference_transient_bytes(models["deepseek-v3.2"], plan) == gib * 2 ** 30
    assert indexer_reference_transient_bytes(models["deepseek-v3"], ParallelPlan(seq_len=4096)) == 0.0


def test_the_indexer_transient_is_an_activation_part(cli) -> None:  # noqa: ANN001
    doc = cli("estimate", *V32_ARGS, "--json").json()
    parts = doc["memory"]["activation_parts"]
    assert parts["indexer_workspace"] == 836 * 2 ** 24  # the loss's backward (13 x 64 + 4) B x 2^24 pairs
    assert "DSA indexer scores" in cli("estimate", *V32_ARGS).out


@pytest.mark.parametrize("loss", ["off", "dense", "sparse"])
def test_v32_indexer_projections_are_duplicated_on_tp_and_detached(loss) -> None:  # noqa: ANN001
    # Megatron-LM dsa.py at 1e23526adc: the indexer's linears parallel_mode "duplicated" (whole on every TP rank),
    # fed x.detach() / qr.detach() (no input gradient), under torch.no_grad with the loss off (no weight gradient)
    from llmplan.cost.gemm import layer_gemm_seconds, layer_gemms
    from llmplan.specs.plan import ParallelPlan
    from llmplan.specs.registry import builtin_models
    m, h100 = builtin_models()["deepseek-v3.2"], GPUS["h100-sxm"]
    plan = ParallelPlan(tp=8, ep=8, dp=8, seq_len=4096, indexer_loss=loss)
    got = [(g.K, g.N, g.flops) for g in layer_gemms(m, plan, True) if g.module == "dsa_indexer"]
    T = 4096  # s/cp x b; not divided by tp 8
    # wq_b q_lora_rank 1536 -> 64 heads x 128, wk 7168 -> 128, weights_proj 7168 -> 64 heads
    assert got == [(1536, 8192, 2 * T * 1536 * 8192), (7168, 128, 2 * T * 7168 * 128), (7168, 64, 2 * T * 7168 * 64)]
    fwd, bwd = layer_gemm_seconds(m, plan, h100, True, only="dsa_indexer")
    assert fwd > 0 and bwd == (0.0 if loss == "off" else pytest.approx(fwd))  # weight gradient alone


def test_fused_csa_priced_on_arrays_equals_it_on_each_plan_and_the_rule_asks_it() -> None:
    # One place per rule: check_plan's indexer_reference_rate asks fused_csa_priced (array-safe) instead of
    # restating its condition. Array answers must equal the one-plan answers element by element.
    from types import SimpleNamespace

    import numpy as np

    from llmplan.cost.sparse_gather import fused_csa_priced
    from llmplan.specs.check import RULES
    from llmplan.specs.plan import ParallelPlan
    from llmplan.specs.registry import builtin_models
    rule = next(r for r in RULES if r.name == "indexer_reference_rate")
    flags = np.array([True, False, True, False])
    batch = SimpleNamespace(flash_attention=flags)
    no_fp32 = GPUS["gb200"].model_copy(update={"tflops": {"bf16": 2500.0, "fp8": 5000.0}})
    for name in ("deepseek-v4-flash", "deepseek-v3.2", "llama-3.1-8b"):
        m = builtin_models()[name]
        for gpu in (GPUS["gb200"], GPUS["h100-sxm"], no_fp32):
            each = [bool(fused_csa_priced(m, ParallelPlan(ep=8, dp=8, seq_len=4096, flash_attention=bool(f)), gpu))
                    for f in flags]
            assert np.array_equal(fused_csa_priced(m, batch, gpu), each), (name, gpu.name)
            ok = rule.ok(m, batch, SimpleNamespace(system=SimpleNamespace(gpu=gpu)))
            assert np.array_equal(np.broadcast_to(ok, flags.shape),
                                  [(not m.is_sparse_attention) or gpu is not no_fp32 or e for e in each])
    # the fused path priced on GB200 only with fused attention; the rule then passes without an fp32 rate
    assert [bool(x) for x in fused_csa_priced(builtin_models()["deepseek-v4-flash"], batch, no_fp32)] \
        == [True, False, True, False]


def test_fused_csa_priced_of_one_plan_is_a_python_bool_and_hydra_writes_it_lowercase() -> None:
    # docs/validation.md#mend-70a: a numpy bool for one plan reached export.bridge.hydra_value, whose
    # isinstance(value, bool) missed it, so the Bridge export wrote True/False (Hydra's grammar: true/false)
    import numpy as np

    from llmplan.cost.sparse_gather import fused_csa_priced
    from llmplan.export.bridge import hydra_value
    from llmplan.specs.plan import ParallelPlan
    from llmplan.specs.registry import builtin_models
    flash = builtin_models()["deepseek-v4-flash"]
    fused = ParallelPlan(ep=8, dp=8, seq_len=4096)
    unfused = fused.model_copy(update={"flash_attention": False})
    assert fused_csa_priced(flash, fused, GPUS["gb200"]) is True
    assert fused_csa_priced(flash, unfused, GPUS["gb200"]) is False
    assert fused_csa_priced(flash, fused, GPUS["h100-sxm"]) is False
    assert hydra_value(np.bool_(True)) == "true" and hydra_value(np.bool_(False)) == "false"
