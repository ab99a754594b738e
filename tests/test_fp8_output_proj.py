"""The output layer (LM head) in MXFP8 (ParallelPlan.fp8_output_proj, docs/formulas.md#compute.fp8_output_proj):
Megatron-Core's TELMHeadColumnParallelLinear (NVIDIA/Megatron-LM 3f6a2ed844, #4825), a Transformer Engine Linear
run under the mxfp8 recipe where the head is otherwise a bf16 ColumnParallelLinear. Its pricing (the fp8 rate
of the other TE linears, their casts, its weight among the recipe's cached copies), check_plan's rules, the
exports, the CLI switch and the Megatron-Bridge 26.06 / 26.08 recipes that set it."""

from __future__ import annotations

import pytest

from llmplan.cost.compute import output_seconds
from llmplan.cost.gemm import MXFP8_CUBLAS_GEMM_TIME, gemm_shape_efficiency
from llmplan.cost.model_states import bf16_kept_params, low_precision_params, low_precision_weight_cache
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


@pytest.mark.parametrize("fp8_params", [False, True])
def test_head_weight_stays_bf16_and_adds_its_mxfp8_cache_on_the_last_stage(fp8_params):
    """DeepSeek-V3, tp 1, pp 4, last stage. Megatron-LM d98e8a6 gpt_model.py builds the output layer outside
    get_fp8_context(..., is_init=True) (transformer_block._build_layers only), and TELinear's own init context
    (_get_fp8_model_init_for_quant_params) is a nullcontext without a quant_recipe: the head's V·h weight stays a
    bf16 parameter (2 B, gathered in bf16) even under fp8_params. Run in the MXFP8 autocast, TE caches its
    rowwise and columnwise MXFP8 copies: 2 x (1 B + one E8M0 scale byte per 32 values, OCP MX spec) = 2.0625 B
    per element, on top of the bf16 weight. The first stage is unchanged."""
    m = M["deepseek-v3"]
    plan = dict(MX, dp=4, pp=4, ep=4, global_batch=64, fp8_params=fp8_params)
    off, on = ParallelPlan(**plan), ParallelPlan(**plan, fp8_output_proj=True)
    head = padded_vocab(m.vocab_size, 1) * m.hidden_size
    assert float(low_precision_params(m, on, 3).total) == float(low_precision_params(m, off, 3).total)
    if fp8_params:  # the head among the 2-byte parameters
        kept = [float(bf16_kept_params(m, p, 3).total) for p in (off, on)]
        assert kept[0] == kept[1]
        assert kept[1] >= head
    cache = [float(low_precision_weight_cache(m, p, 3)) for p in (off, on)]
    assert cache[1] - cache[0] == pytest.approx(head * 2 * (1 + 1 / 32), rel=1e-12)
    assert float(low_precision_weight_cache(m, on, 0)) == float(low_precision_weight_cache(m, off, 0))


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


def test_tp_comm_overlap_is_refused_where_the_head_s_te_linear_asserts_a_buffer_name(cli):
    """Megatron-LM d98e8a6 (and 3f6a2ed844) TELMHeadColumnParallelLinear passes tp_comm_buffer_name None to
    TELinear, whose __init__ asserts `tp_comm_buffer_name is not None` under config.tp_comm_overlap: the plan
    the Megatron-LM export would write --tp-comm-overlap for (tp_comm_overlap, sp, tp > 1) cannot build.
    MLA models pass: their attention turns the shared config's tp_comm_overlap off before gpt_model builds
    the head (MLASelfAttention's q_down_proj buffer name; TELinear sets config.tp_comm_overlap False)."""
    r = cli("estimate", "-m", "gpt-oss-120b", "--hardware", "gb200-nvl72", "--nodes", "2", "--ep", "8", "--etp", "1",
            "--tp", "2", "--precision", "mxfp8", "--fp8-output-proj", "--tp-comm-overlap")
    assert r.code == 2 and "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1, r.err
    assert "fp8_output_proj with tp_comm_overlap, tp 2, sp on" in r.err
    assert "tp_comm_buffer_name is not None" in r.err and "drop --tp-comm-overlap" in r.err
    m = M["gpt-oss-120b"]
    base = dict(MX, dp=4, tp=2, sp=True, fp8_output_proj=True)
    rules = {p: [v.rule for v in check_plan(m, ParallelPlan(**base, tp_comm_overlap=p))] for p in (False, True)}
    assert "fp8_output_proj_tp_overlap" in rules[True] and "fp8_output_proj_tp_overlap" not in rules[False]
    mla = [v.rule for v in check_plan(M["deepseek-v3"], ParallelPlan(**{**base, "dp": 8}, tp_comm_overlap=True))]
    assert "fp8_output_proj_tp_overlap" not in mla


def test_search_never_ranks_a_plan_the_rule_refuses(cli):
    """The search prunes by check_plan's rules: with both switches every plan that could use the TP overlap
    (tp > 1 with sp) is cut, so --tp-comm-overlap is left unused and refused (rather than a tp > 1 plan ranked
    that Megatron-Core cannot build). The refusal names the rule that cut them and its fix, not the axis advice
    (--tp 2 with --sp) that would only hit the rule again."""
    r = cli("search", "-m", "gpt-oss-120b", "--hardware", "gb200-nvl72", "--nodes", "2", "--precision", "mxfp8",
            "--fp8-output-proj", "--tp-comm-overlap", "--json")
    assert r.code == 2 and "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1, r.err
    assert r.err.startswith("error: --tp-comm-overlap: none of the "), r.err  # the switch first
    assert "plans left by the rules can use it: the " in r.err, r.err
    assert "plans searched that could use it break check rules" in r.err, r.err
    assert "rule fp8_output_proj_tp_overlap cuts" in r.err, r.err
    assert "tp_comm_buffer_name is not None" in r.err, r.err
    assert "drop --tp-comm-overlap, or drop --fp8-output-proj" in r.err, r.err
    assert "use --tp 2 or more with --sp" not in r.err, r.err


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
