"""The SwiGLU input kept in fp8 for backward (ParallelPlan.swiglu_fp8_input): Megatron-Core's
activation_func_fp8_input_store and DeepSeek-V3's MoE SwiGLU inputs (report §3.3.3), priced per layer, checked
against the gated-MLP rule, carried by the CLI, JSON and exports, and the DeepSeek-V3 report's run that completed
on 80 GB H800s predicted to fit with it (issue 32)."""

from __future__ import annotations

import dataclasses

import pytest

import accuracy
from llmplan.cost.memory import layer_activation_parts, training_memory
from llmplan.export import render_all
from llmplan.export.common import CannotExpress
from llmplan.planfile import load_plan
from llmplan.search.grid import from_plan
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models
from llmplan.units import GIB

M = builtin_models()


def test_fp8_store_frees_one_byte_per_element_of_the_dense_swiglu_input():
    # Megatron-LM fused_bias_swiglu.py: with fp8_input_store the SwiGLU saves input.to(torch.float8_e4m3fn),
    # 1 byte, not its bf16 input (2); the input is fc1's output, 2f wide per token on a TP rank.
    m = M["llama-3.1-8b"]
    kw = dict(tp=2, dp=4, sp=True, seq_len=4096, micro_batch=1, global_batch=8)
    off = layer_activation_parts(m, ParallelPlan(**kw), False)
    on = layer_activation_parts(m, ParallelPlan(**kw, swiglu_fp8_input=True), False)
    T, f, t = 4096, m.intermediate_size, 2
    assert float(off.mlp - on.mlp) == pytest.approx(T * 2 * f / t * (2 - 1), rel=1e-12)
    assert float(off.total - on.total) == float(off.mlp - on.mlp)  # nothing else moves


def test_deepseek_blockwise_store_keeps_a_scale_per_128_on_every_routed_and_shared_row():
    # DeepSeek-V3 report §3.3.3 (2): the MoE SwiGLU inputs "stored in FP8 with our fine-grained quantization"
    # (1x128 tiles, an fp32 scale each, §3.3.2): 1 + 4/128 bytes per element in place of 2, on each of the
    # T.k routed rows (2 f_e wide) and the shared expert's T rows (2 f_s wide).
    m = M["deepseek-v3"]
    kw = dict(tp=1, pp=16, dp=128, ep=64, seq_len=4096, micro_batch=1, global_batch=15360, dtype="fp8",
              recipe="blockwise", pp_schedule="dualpipe", recompute="selective",
              recompute_modules=("layernorm", "mla_up_proj", "moe_act"))
    off = layer_activation_parts(m, ParallelPlan(**kw), True)
    on = layer_activation_parts(m, ParallelPlan(**kw, swiglu_fp8_input=True), True)
    T, k = 4096, m.num_experts_per_tok
    rows_elems = T * k * 2 * m.expert_ffn + T * 2 * m.shared_ffn
    assert float(off.mlp - on.mlp) == pytest.approx(rows_elems * (2 - (1 + 4 / 128)), rel=1e-12)


def test_the_switch_prices_the_same_in_plan_arrays_and_one_plan():
    m = M["deepseek-v3"]
    plan = ParallelPlan(tp=1, pp=16, dp=128, ep=64, seq_len=4096, micro_batch=1, global_batch=15360, dtype="fp8",
                        recipe="blockwise", pp_schedule="dualpipe", swiglu_fp8_input=True)
    one = training_memory(m, plan, 80 * GIB)
    many = training_memory(m, from_plan(plan), 80 * GIB)
    assert float(many.total[0]) == pytest.approx(float(one.total), rel=1e-12)


def test_check_plan_refuses_it_without_a_gated_mlp():
    plan = ParallelPlan(tp=1, dp=8, global_batch=8, swiglu_fp8_input=True)
    assert "swiglu_fp8_input" in [v.rule for v in check_plan(M["gpt3-175b"], plan)]
    assert "swiglu_fp8_input" not in [v.rule for v in check_plan(M["llama-3.1-8b"], plan)]


def test_cli_carries_the_switch_to_the_plan_json_and_the_memory(cli):
    args = ("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--seq-len", "8192",
            "--global-batch", "8", "--recompute", "none", "--json")
    off, on = cli(*args), cli(*args, "--swiglu-fp8-input")
    assert off.code == 0 and on.code == 0, on.err
    assert off.json()["plan"]["swiglu_fp8_input"] is False and on.json()["plan"]["swiglu_fp8_input"] is True
    assert on.json()["memory"]["activations"] < off.json()["memory"]["activations"]
    bad = cli("estimate", "--model", "gpt3-175b", "--hardware", "dgx-h100", "--nodes", "16", "--tp", "8",
              "--pp", "8", "--swiglu-fp8-input")
    assert bad.code == 2 and "swiglu_fp8_input" in bad.err and "Traceback" not in bad.err


def test_exports_write_it_for_megatron_bridge_and_refuse_where_the_launcher_has_no_flag():
    from test_export_bridge import PLANS, SCRIPT, overrides

    base = load_plan(PLANS / "deepseek_train.json")
    pf = dataclasses.replace(base, plan=base.plan.model_copy(update={"swiglu_fp8_input": True}))
    assert "model.activation_func_fp8_input_store=true" in overrides(render_all(pf, "megatron-bridge")[0][SCRIPT])
    with pytest.raises(CannotExpress, match="activation_func_fp8_input_store"):
        render_all(pf, "megatron")


def test_deepseek_v3_report_run_is_predicted_to_fit(published_runs, row_plan):
    # DeepSeek-V3 report (arXiv 2412.19437) §3.2 and Table 1: pre-training completed on 2,048 H800 80 GB with
    # PP16 EP64 ZeRO-1 DualPipe, fp8; §3.3.3 lists the memory it saves, the MoE SwiGLU inputs cached in FP8
    # among them. The run ran, so its plan must fit the H800's memory.
    rid = "deepseek-v3-report-h800-2048gpu-pretrain"
    rec = published_runs[rid]
    plan = row_plan(rid)
    assert plan.swiglu_fp8_input and plan.recompute_modules == ("layernorm", "mla_up_proj", "moe_act")
    rows = {q: (p, m) for q, p, m in accuracy.predict(rec, accuracy.family(rid))}
    assert rows["fits"] == (1.0, 1.0)
