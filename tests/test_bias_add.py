"""The output biases Megatron-Core adds in their own pass when bias_dropout_fusion is off (Megatron-Bridge's GPT-OSS
bridge): _bias_dropout_add_func's x + bias before the residual add, its traffic counted by hand from the
operations (docs/formulas.md#compute.bias_add), and where it applies."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.elementwise import elementwise_bytes
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan

DENSE: dict = {"name": "tiny-dense", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
               "num_attention_heads": 4, "vocab_size": 1000, "max_position_embeddings": 4096}
MOE: dict = {**DENSE, "name": "tiny-moe", "num_experts": 16, "num_experts_per_tok": 2, "moe_intermediate_size": 128}


def per_element() -> float:
    # Megatron-Core fused_bias_dropout.py _bias_dropout_add_func (core_v0.16.0), unfused: x = x + bias reads the
    # bf16 projection output and writes the sum (the h-wide bias itself is negligible); dropout at p 0 returns its
    # input (PyTorch's _dropout_impl: p == 0 returns input, no kernel); residual + out is the residual add every
    # layer pays. Backward: the add hands its gradient through to x; the bias's gradient sums it over the tokens
    # (one read). The stage charges memory-bound bytes three times their forward-equivalent units.
    elem = 2
    forward = elem + elem
    backward = elem
    return (forward + backward) / 3


@settings(max_examples=25, deadline=None, derandomize=True)
@given(s=st.sampled_from([512, 4096]), b=st.integers(1, 4), tp=st.sampled_from([1, 2]), sp=st.booleans())
def test_attention_output_bias_is_one_more_pass_over_the_hidden_state(s, b, tp, sp):
    m = ModelSpec(**MOE, attention_bias=True, mlp_bias=True)
    fused = ParallelPlan(seq_len=s, micro_batch=b, tp=tp, sp=sp and tp > 1, ep=2, dp=2)
    unfused = fused.model_copy(update={"bias_dropout_fusion": False})
    tokens = s * b / (tp if fused.sp else 1)
    extra = elementwise_bytes(m, unfused, True) - elementwise_bytes(m, fused, True)
    # an MoE layer: only the attention output projection's bias reaches the bias-dropout-add (the experts add
    # theirs inside TEGroupedMLP, MoELayer returns no bias)
    assert extra == pytest.approx(per_element() * tokens * m.hidden_size)


def test_dense_mlp_bias_adds_a_second_pass_and_models_without_biases_pay_nothing():
    fused = ParallelPlan(seq_len=2048, micro_batch=2)
    unfused = fused.model_copy(update={"bias_dropout_fusion": False})
    tokens, h = 2048 * 2, DENSE["hidden_size"]
    both = ModelSpec(**DENSE, attention_bias=True, mlp_bias=True)
    assert (elementwise_bytes(both, unfused, False) - elementwise_bytes(both, fused, False)
            == pytest.approx(2 * per_element() * tokens * h))
    for plain in (ModelSpec(**DENSE), ModelSpec(**DENSE, qkv_bias=True)):  # Qwen2's q/k/v biases: no output bias
        assert elementwise_bytes(plain, unfused, False) == elementwise_bytes(plain, fused, False)


def test_export_writes_or_refuses_the_unfused_bias_add(cli, tmp_path):
    # Megatron-LM arguments.py (d98e8a6): --no-bias-dropout-fusion stores bias_dropout_fusion False, as the
    # TransformerConfig field does for Megatron-Bridge; torchtitan's and DeepSpeed's linears add the bias in the GEMM.
    from test_export_switches import export, saved
    on, off = saved(cli, tmp_path / "on"), saved(cli, tmp_path / "off", bias_dropout_fusion=False)
    for plan, want in ((on, False), (off, True)):
        code, files, err = export(cli, plan, "megatron", plan.parent / "m")
        assert code == 0 and ("--no-bias-dropout-fusion" in files) == want, err
        code, files, err = export(cli, plan, "megatron-bridge", plan.parent / "b")
        assert code == 0 and ("model.bias_dropout_fusion=false" in files.lower()) == want, err


def biased_dense_plan(cli, tmp_path, **fields: object):
    """A saved plan of gpt-1.7b (Megatron's GPT: attention and MLP biases) on one H100 node, fields then set."""
    import json
    (tmp_path / "gpt").mkdir(parents=True, exist_ok=True)
    path = tmp_path / "gpt" / "plan.json"
    made = cli("estimate", "--model", "gpt-1.7b", "--hardware", "dgx-h100", "--global-batch", "64", "--save", path)
    assert made.code == 0, made.err
    doc = json.loads(path.read_text())
    doc["plan"].update(fields)
    path.write_text(json.dumps(doc))
    return path


def test_torchtitan_and_deepspeed_refuse_it_only_on_a_biased_model(cli, tmp_path):
    from test_export_switches import export, saved
    from test_export_torchtitan_sinks import gpt_oss_plan
    plain = saved(cli, tmp_path / "llama", bias_dropout_fusion=False)  # Llama: no bias, nothing priced
    biased = {"torchtitan": gpt_oss_plan(cli, tmp_path, "oss", bias_dropout_fusion=False),
              "deepspeed": biased_dense_plan(cli, tmp_path, bias_dropout_fusion=False)}
    for target, plan in biased.items():
        code, files, err = export(cli, plan, target, tmp_path / f"{target}-biased")
        assert code == 2 and "bias_dropout_fusion off" in err and "Traceback" not in err and files == "", err
        code, _, err = export(cli, plain, target, tmp_path / f"{target}-llama")
        assert "bias_dropout_fusion" not in err
