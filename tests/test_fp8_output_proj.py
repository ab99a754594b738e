"""The output layer (LM head) in MXFP8 (ParallelPlan.fp8_output_proj, docs/formulas.md#compute.fp8_output_proj):
Megatron-Core's TELMHeadColumnParallelLinear (NVIDIA/Megatron-LM 3f6a2ed844, #4825), a Transformer Engine Linear
run under the mxfp8 recipe where the head is otherwise a bf16 ColumnParallelLinear. Its pricing (the fp8 rate
of the other TE linears, their casts, its weight among the recipe's cached copies), check_plan's rules, the
exports, the CLI switch and the Megatron-Bridge 26.06 / 26.08 recipes that set it."""

from __future__ import annotations

import pytest

from llmplan.cost.compute import output_seconds
from llmplan.cost.gemm import MXFP8_CUBLAS_GEMM_TIME, gemm_shape_efficiency
from llmplan.cost.model_states import low_precision_params
from llmplan.cost.params import padded_vocab
from llmplan.cost.quantize import CAST_BYTES
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M = builtin_models()
S = builtin_systems()
MX = dict(dp=8, global_batch=64, seq_len=4096, dtype="fp8", recipe="mxfp8")


@pytest.mark.parametrize("model, system", [("llama-3.1-8b", "gb200-nvl72"), ("gpt-oss-120b", "gb300-nvl72"),
                                           ("qwen3-235b-a22b", "dgx-b200")])
def test_head_gemm_runs_at_the_mxfp8_rate_of_a_te_linear(model, system):
    """The head's forward (and so its two backward GEMMs, stage_compute's 3x) at the MXFP8 rate: the GPU's
    published MXFP8 / bf16 dense peak (NVIDIA GB200 / GB300 / B200 datasheets: 2x) at each format's shape
    efficiency, x the cuBLASLt MXFP8 factor every TE Linear carries. Off, the bf16 head as before."""
    m, gpu = M[model], S[system].gpu
    off, on = output_seconds(m, ParallelPlan(**MX), gpu), output_seconds(m, ParallelPlan(**MX, fp8_output_proj=True), gpu)
    rows, cols = 4096.0, padded_vocab(m.vocab_size, 1)
    rate = {f: gpu.sustained_flops(f) * gemm_shape_efficiency(gpu, f, rows, cols, m.hidden_size)
            for f in ("bf16", "mxfp8")}
    assert gpu.tflops["mxfp8"] == 2 * gpu.tflops["bf16"]  # the datasheets' dense rates
    assert float(on[0]) / float(off[0]) == pytest.approx(rate["bf16"] / rate["mxfp8"] * MXFP8_CUBLAS_GEMM_TIME,
                                                         rel=1e-9)
    assert float(on[0]) < 0.7 * float(off[0])


def test_head_casts_its_input_and_the_logits_gradient():
    """The memory-bound part grows by the two GEMM inputs' MXFP8 casts (read bf16, write a rowwise and a
    columnwise copy with E8M0 scales per 32: 2 + 2 x 1.03125 B): the h-wide input and the V-wide gradient."""
    m, gpu = M["llama-3.1-8b"], S["gb200-nvl72"].gpu
    off, on = output_seconds(m, ParallelPlan(**MX), gpu), output_seconds(m, ParallelPlan(**MX, fp8_output_proj=True), gpu)
    per_element = 2.0 + 2 * (1 + 1 / 32)  # OCP MX spec: one E8M0 scale byte per 32 fp8 values
    assert CAST_BYTES["mxfp8"] == pytest.approx(per_element)
    expected = per_element * 4096 * (m.hidden_size + padded_vocab(m.vocab_size, 1)) / gpu.hbm_achieved_bytes_per_s
    assert float(on[1]) - float(off[1]) == pytest.approx(expected, rel=1e-9)


def test_head_weight_joins_the_recipes_cached_copies_on_the_last_stage():
    m = M["deepseek-v3"]
    plan = dict(MX, dp=4, pp=2, ep=4, global_batch=64)
    off = low_precision_params(m, ParallelPlan(**plan), 1).total
    on = low_precision_params(m, ParallelPlan(**plan, fp8_output_proj=True), 1).total
    assert float(on) - float(off) == pytest.approx(padded_vocab(m.vocab_size, 1) * m.hidden_size)
    first = [low_precision_params(m, ParallelPlan(**plan, fp8_output_proj=f), 0).total for f in (False, True)]
    assert first[0] == first[1]


def test_check_plan_needs_mxfp8_and_an_untied_head_weight():
    m = M["llama-3.1-8b"]
    rules = [v.rule for v in check_plan(m, ParallelPlan(**MX, fp8_output_proj=True))]
    assert "fp8_output_proj" not in rules and "fp8_output_proj_tied" not in rules
    for bad in (dict(dtype="bf16", recipe="tensorwise"), dict(recipe="tensorwise"), dict(recipe="blockwise")):
        vs = {v.rule: v.message for v in check_plan(m, ParallelPlan(**{**MX, **bad}, fp8_output_proj=True))}
        assert "fp8_output_proj" in vs and "--precision mxfp8" in vs["fp8_output_proj"], vs
        assert f"recipe {bad['recipe']}" in vs["fp8_output_proj"]
    tied = M["gpt-1.7b"]
    assert tied.tie_word_embeddings
    vs = {v.rule: v.message for v in check_plan(tied, ParallelPlan(**MX, fp8_output_proj=True))}
    assert "fp8_output_proj_tied" in vs and "pp 1" in vs["fp8_output_proj_tied"]
    assert "skip_weight_param_allocation" in vs["fp8_output_proj_tied"]
    two = ParallelPlan(**{**MX, "dp": 4}, pp=2, fp8_output_proj=True)
    assert "fp8_output_proj_tied" not in [v.rule for v in check_plan(tied, two)]


ARGS = ("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-b200", "--global-batch", "64",
        "--precision", "mxfp8")


def test_cli_switch_reaches_the_plan_and_refuses_other_recipes(cli):
    off, on = cli(*ARGS, "--json"), cli(*ARGS, "--fp8-output-proj", "--json")
    assert off.code == 0 and on.code == 0, on.err
    assert on.json()["plan"]["fp8_output_proj"] is True and off.json()["plan"]["fp8_output_proj"] is False
    assert on.json()["time"]["step_s"] < off.json()["time"]["step_s"]
    bad = cli(*ARGS[:-1], "fp8-tensorwise", "--fp8-output-proj")
    assert bad.code == 2 and "fp8_output_proj with dtype fp8, recipe tensorwise" in bad.err, bad.err
    assert "Traceback" not in bad.err and len(bad.err.strip().splitlines()) == 1


def test_exports_write_the_real_names_and_the_others_refuse(cli, tmp_path):
    # --fp8-params: Megatron-Bridge's preset bf16_with_mxfp8_mixed keeps the weights in MXFP8
    assert cli(*ARGS, "--fp8-params", "--fp8-output-proj", "--save", tmp_path / "on.json").code == 0
    assert cli(*ARGS, "--fp8-params", "--save", tmp_path / "off.json").code == 0

    def text(target: str, name: str) -> str:
        r = cli("export", tmp_path / f"{name}.json", "--to", target, "-o", tmp_path / f"{target}-{name}")
        assert r.code == 0, r.err
        return "".join(f.read_text() for f in (tmp_path / f"{target}-{name}").rglob("*") if f.is_file())

    # Megatron-LM: TransformerConfig.fp8_output_proj becomes --fp8-output-proj (ArgumentGroupFactory, 3f6a2ed844)
    assert "--fp8-output-proj" in text("megatron", "on") and "--fp8-output-proj" not in text("megatron", "off")
    # Megatron-Bridge: cfg.model.fp8_output_proj, as its perf recipes set it
    assert "model.fp8_output_proj=true" in text("megatron-bridge", "on")
    assert "fp8_output_proj" not in text("megatron-bridge", "off")
    # torchtitan and DeepSpeed cannot run it: both refuse the mxfp8 recipe it needs (torchtitan's export writes
    # the float8 converter only, which skips the output layer anyway; DeepSpeed refuses fp8 / fp4 training)
    for target, words in (("torchtitan", "the mxfp8 recipe"), ("deepspeed", "fp8")):
        r = cli("export", tmp_path / "on.json", "--to", target, "-o", tmp_path / target)
        assert r.code == 2 and words in r.err and "Traceback" not in r.err, r.err


@pytest.mark.parametrize("rid, on", [
    # Megatron-Bridge v0.5.0 (26.06) deepseek_llm_pretrain.py / gpt_oss_llm_pretrain.py: GB300 / GB200 under mxfp8
    ("mbridge-26.06-pretrain-deepseekv3-dgx-gb200-256gpu-mxfp8-tp1pp4cp1ep64vp4gbs4096mbs1", True),
    ("mbridge-26.06-pretrain-gpt-oss-120b-dgx-gb300-64gpu-mxfp8-tp1pp1cp1ep16vpnagbs1280mbs4", True),
    # v0.6.0 (26.08) perf_recipes/deepseek/gb300/deepseek_v3.py
    ("mbridge-26.08-pretrain-deepseekv3-dgx-gb300-256gpu-mxfp8-tp1pp2cp1ep32vp8gbs4096mbs1", True),
    # Qwen3's recipes never set it (v0.5.0, v0.6.0)
    ("mbridge-26.06-pretrain-qwen3-30b-a3b-dgx-gb300-8gpu-mxfp8-tp1pp1cp1ep8vpnagbs512mbs8", False),
    # 26.02's recipes predate Megatron-LM #4825 (2026-05-31)
    ("mbridge-26.02-pretrain-deepseekv3-dgx-gb200-256gpu-mxfp8-tp1pp4cp1ep64vp4gbs4096mbs1", False),
])
def test_recipes_that_set_it(published_runs, acc, row_plan, rid, on):
    rec = published_runs[rid]
    assert acc.mbridge_fp8_output_proj(rec) is on
    assert row_plan(rid).fp8_output_proj is on
