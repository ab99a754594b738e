"""The output biases Megatron-Core adds in their own pass when bias_dropout_fusion is off (Megatron-Bridge's GPT-OSS
bridge): _bias_dropout_add_func's x + bias before the residual add, its traffic counted by hand from the
operations (docs/formulas.md#compute.bias_add), and where it applies."""

from __future__ import annotations

import json
from pathlib import Path

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
    # Megatron-Core fused_bias_dropout.py _bias_dropout_add_func (core_v0.16.0, d98e8a6), unfused: x = x + bias reads
    # the bf16 projection output and writes the sum (the h-wide bias itself is negligible); dropout at p 0 returns
    # its input (PyTorch's _dropout_impl: p == 0 returns input, no kernel); residual + out is the residual add every
    # layer pays. Backward: the add hands its gradient through to x, and the bias's gradient (a sum over the tokens)
    # is taken by the fused path too (the torch.compile'd bias-dropout-add reduces it), so nothing more.
    # The stage charges memory-bound bytes three times their forward-equivalent units.
    elem = 2
    forward = elem + elem
    backward = 0
    return (forward + backward) / 3


def dropout_per_element() -> float:
    # The same function with hidden_dropout p > 0, unfused: F.dropout is its own kernel (PyTorch native_dropout:
    # reads x, writes the output and a 1-byte mask), and residual + out then reads the dropped output where the
    # fused kernel read x. The mask is written by the fused kernel too, and backward multiplies by it in both.
    elem = 2
    return (elem + elem) / 3


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


def test_unfused_dropout_is_its_own_pass_per_sub_block_with_or_without_biases():
    fused = ParallelPlan(seq_len=1024, micro_batch=2)
    unfused = fused.model_copy(update={"bias_dropout_fusion": False})
    tokens, h = 1024 * 2, DENSE["hidden_size"]
    for biases, passes in (({}, 0), ({"attention_bias": True, "mlp_bias": True}, 2)):
        m = ModelSpec(**DENSE, hidden_dropout=0.1, **biases)
        extra = elementwise_bytes(m, unfused, False) - elementwise_bytes(m, fused, False)
        # two bias-dropout-adds a layer (attention and MLP): each a dropout pass, and each bias its add
        assert extra == pytest.approx((2 * dropout_per_element() + passes * per_element()) * tokens * h)
    no_dropout = ModelSpec(**DENSE)
    assert elementwise_bytes(no_dropout, unfused, False) == elementwise_bytes(no_dropout, fused, False)


def plan_field(path) -> bool:
    import json
    return json.loads(path.read_text())["plan"]["bias_dropout_fusion"]


def test_estimate_and_search_settle_it_off_for_expert_biases(cli, tmp_path):
    # Megatron-Core experts.py:205-207 (d98e8a6, from a329dd6da5): TEGroupedMLP asserts
    # not (add_bias_linear and bias_dropout_fusion); Megatron-LM's --bias-dropout-fusion defaults True
    # (arguments.py: --no-bias-dropout-fusion store_false), Megatron-Bridge's gpt_oss_bridge.py sets it False.
    base = ("--hardware", "dgx-h100", "--ep", "8", "--etp", "1", "--global-batch", "64")
    for name, extra, want in (("default", (), False), ("named", ("--bias-dropout-fusion",), True)):
        path = tmp_path / f"{name}.json"
        made = cli("estimate", "--model", "gpt-oss-120b", *base, *extra, "--save", path)
        assert made.code == 0, made.err
        assert plan_field(path) is want
    dense = biased_dense_plan(cli, tmp_path)  # gpt-1.7b: biases, no experts: Megatron-LM's default stays
    assert plan_field(dense) is True
    path = tmp_path / "search.json"
    found = cli("search", "--model", "gpt-oss-20b", "--nodes", "1", "--tp", "1", "--pp", "1", "--cp", "1",
                *base, "--save", path)
    assert found.code == 0, found.err
    assert plan_field(path) is False


def test_megatron_exports_refuse_it_fused_with_expert_biases(cli, tmp_path):
    from test_export_switches import export
    from test_export_torchtitan_sinks import gpt_oss_plan
    fused = gpt_oss_plan(cli, tmp_path, "fused", bias_dropout_fusion=True)
    for target in ("megatron", "megatron-bridge"):
        code, files, err = export(cli, fused, target, tmp_path / f"{target}-fused")
        assert code == 2 and files == "" and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1, err
        for words in ("bias_dropout_fusion true", "gpt-oss-120b: attention_bias true, mlp_bias true",
                      "TEGroupedMLP asserts not (add_bias_linear and bias_dropout_fusion)",
                      "--no-bias-dropout-fusion"):
            assert words in err, (words, err)
    default = gpt_oss_plan(cli, tmp_path, "default")
    for target, written in (("megatron", "--no-bias-dropout-fusion"),
                            ("megatron-bridge", "model.bias_dropout_fusion=false")):
        code, files, err = export(cli, default, target, tmp_path / f"{target}-default")
        assert code == 0 and written in files.replace("False", "false"), err


def test_torchtitan_notes_and_deepspeed_refuses_it_by_the_priced_rule(cli, tmp_path):
    from test_export_switches import export, saved
    from test_export_torchtitan_sinks import gpt_oss_plan
    plain = saved(cli, tmp_path / "llama", bias_dropout_fusion=False)  # Llama: no bias, nothing priced
    code, files, err = export(cli, biased_dense_plan(cli, tmp_path, bias_dropout_fusion=False), "deepspeed",
                              tmp_path / "ds-biased")
    assert code == 2 and files == "" and "Traceback" not in err, err
    assert "bias_dropout_fusion off" in err and "gpt-1.7b: attention_bias true, mlp_bias true" in err, err
    for target in ("torchtitan", "deepspeed"):
        code, _, err = export(cli, plain, target, tmp_path / f"{target}-llama")
        assert "bias_dropout_fusion" not in err
    # GPT-OSS's default plan (settled off for its expert biases) exports to torchtitan with a note
    code, files, err = export(cli, gpt_oss_plan(cli, tmp_path, "oss"), "torchtitan", tmp_path / "tt")
    assert code == 0, err
    assert "the default for gpt-oss-120b's expert biases" in files and "set bias_dropout_fusion true" in files


def test_the_refusal_predicate_is_what_is_priced():
    from types import SimpleNamespace

    from llmplan.export.common import unfused_bias_add
    unfused = ParallelPlan(seq_len=1024, micro_batch=1, ep=2, dp=2, bias_dropout_fusion=False)
    fused = unfused.model_copy(update={"bias_dropout_fusion": True})
    for spec in (DENSE, MOE):
        for attn in (False, True):
            for mlp in (False, True):
                m = ModelSpec(**spec, attention_bias=attn, mlp_bias=mlp)
                moe = m.is_moe
                priced = elementwise_bytes(m, unfused, moe) > elementwise_bytes(m, fused, moe)
                # by hand: the attention output bias on every layer; fc2's only on a dense MLP (experts: none)
                assert priced == (attn or (mlp and not moe)), (spec["name"], attn, mlp)
                assert unfused_bias_add(SimpleNamespace(model=m, plan=unfused)) == priced, (spec["name"], attn, mlp)


def test_a_plan_file_without_the_key_loads_the_model_s_default(cli, tmp_path):
    """A plan file saved before bias_dropout_fusion was a key (or with it deleted) loads with the model's
    default (specs.defaults.default_bias_dropout_fusion: off for GPT-OSS, whose TEGroupedMLP asserts not
    (add_bias_linear and bias_dropout_fusion), Megatron-LM d98e8a6 experts.py), not ParallelPlan's True; a
    file that states the key keeps it."""
    from llmplan.planfile import load_plan
    base = ("--hardware", "dgx-h100", "--ep", "8", "--etp", "1", "--global-batch", "64")
    for name, extra, want in (("default", (), False), ("named", ("--bias-dropout-fusion",), True)):
        path = tmp_path / f"{name}.json"
        assert cli("estimate", "--model", "gpt-oss-120b", *base, *extra, "--save", path).code == 0
        assert load_plan(path).plan.bias_dropout_fusion is want  # stated: kept
        doc = json.loads(path.read_text())
        del doc["plan"]["bias_dropout_fusion"]
        path.write_text(json.dumps(doc))
        assert load_plan(path).plan.bias_dropout_fusion is False  # absent: GPT-OSS's default
    dense = biased_dense_plan(cli, tmp_path)  # gpt-1.7b: Megatron-LM's default True stays
    doc = json.loads(dense.read_text())
    del doc["plan"]["bias_dropout_fusion"]
    dense.write_text(json.dumps(doc))
    assert load_plan(dense).plan.bias_dropout_fusion is True


def test_a_dropout_only_unfused_plan_per_launcher(cli, tmp_path):
    """bias_add_bytes also prices the hidden dropout's own kernel with bias_dropout_fusion off (no biases needed).
    DeepSpeed's Hugging Face blocks run that dropout as its own kernel before the residual add, as priced: not
    refused. torchtitan's LLM modules have no dropout at all (pytorch/torchtitan@73a0e69 torchtitan/models:
    'dropout' appears only under flux), so a plan pricing one is refused whether fused or not."""
    from test_export_switches import export, saved
    from llmplan.export.common import unfused_bias_add
    from llmplan.planfile import load_plan
    def dropout_plan(name: str, *extra: str, fused: bool) -> Path:
        path = saved(cli, tmp_path / name, *extra, bias_dropout_fusion=fused)  # Llama: no biases
        doc = json.loads(path.read_text())
        doc["model"]["hidden_dropout"] = 0.1
        path.write_text(json.dumps(doc))
        assert not unfused_bias_add(load_plan(path))  # no bias priced apart: the dropout alone
        return path

    for fused in (False, True):
        code, _, err = export(cli, dropout_plan(f"tt-{fused}", fused=fused), "torchtitan", tmp_path / f"tt-{fused}")
        assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert "hidden dropout 0.1" in err and "run no dropout" in err, err
        assert f"bias_dropout_fusion {str(fused).lower()}" in err, err
    # --grad-dtype bf16: DeepSpeed's ZeRO 0 needs gradients in the model's dtype (an unrelated refusal)
    ds = dropout_plan("ds", "--grad-dtype", "bf16", fused=False)
    code, _, err = export(cli, ds, "deepspeed", tmp_path / "ds-out")
    assert code == 0 and "dropout" not in err and "bias_dropout_fusion" not in err, err


def gelu_bias_per_element() -> float:
    # Megatron-LM 19301985dd megatron/model/transformer.py ParallelMLP.forward without --bias-gelu-fusion (an opt-in
    # store_true flag in megatron/arguments.py then): activation_func(intermediate_parallel + bias_parallel). The add
    # reads the 16-bit fc1 output and writes the sum (2 + 2), then F.gelu reads the sum as bias_gelu would have read
    # the fc1 output. Backward: gelu's backward reads the gradient and its saved input and writes one gradient, as
    # bias_gelu_back does (megatron/model/fused_bias_gelu.py), the add hands it to x, and the bias gradient's sum
    # over the tokens runs in both paths (GeLUFunction.backward returns the full-size tmp for the bias). The stage
    # charges memory-bound bytes three times their forward-equivalent units.
    elem = 2
    return (elem + elem + 0) / 3


@settings(max_examples=20, deadline=None, derandomize=True)
@given(s=st.sampled_from([512, 4096]), b=st.integers(1, 4), tp=st.sampled_from([1, 2, 4]), sp=st.booleans())
def test_unfused_bias_gelu_is_one_more_pass_over_the_fc1_output(s, b, tp, sp):
    """Only a dense, non-gated MLP with biases pays it, on its f / t columns of every token (SP or not: the GeLU runs
    on the TP shard of the whole sequence); a gated MLP, an MLP without biases and an MoE layer pay nothing."""
    gelu = ModelSpec(**DENSE, gated_mlp=False, mlp_bias=True, attention_bias=True)
    fused = ParallelPlan(seq_len=s, micro_batch=b, tp=tp, sp=sp and tp > 1, dp=1)
    unfused = fused.model_copy(update={"bias_gelu_fusion": False})
    extra = elementwise_bytes(gelu, unfused, False) - elementwise_bytes(gelu, fused, False)
    assert extra == pytest.approx(gelu_bias_per_element() * s * b * DENSE["intermediate_size"] / tp)
    for other in (ModelSpec(**DENSE, mlp_bias=True), ModelSpec(**DENSE, gated_mlp=False)):
        assert elementwise_bytes(other, unfused, False) == elementwise_bytes(other, fused, False)
    moe = ModelSpec(**MOE, gated_mlp=False, mlp_bias=True)
    assert elementwise_bytes(moe, unfused, True) == elementwise_bytes(moe, fused, True)


def test_exports_write_the_unfused_bias_gelu(cli, tmp_path):
    """Megatron-LM d98e8a6: --no-bias-gelu-fusion stores bias_gelu_fusion False, which argument_utils.py makes
    TransformerConfig.bias_activation_fusion for a model without --swiglu; Megatron-Bridge sets that field. A plan
    file key (no command-line flag); GPT-3 175B (Megatron-Bridge has its recipe) is a biased GeLU model."""
    import json

    from test_export_switches import export
    for fusion, want in ((True, False), (False, True)):
        path = tmp_path / str(fusion) / "plan.json"
        path.parent.mkdir()
        made = cli("estimate", "--model", "gpt3-175b", "--hardware", "dgx-h100", "--nodes", "16", "--tp", "8",
                   "--pp", "8", "--save", path)
        assert made.code == 0, made.err
        doc = json.loads(path.read_text())
        doc["plan"]["bias_gelu_fusion"] = fusion
        path.write_text(json.dumps(doc))
        code, files, err = export(cli, path, "megatron", path.parent / "m")
        assert code == 0 and ("--no-bias-gelu-fusion" in files) == want, err
        code, files, err = export(cli, path, "megatron-bridge", path.parent / "b")
        assert code == 0 and ("model.bias_activation_fusion=false" in files.lower()) == want, err


def test_deepspeed_refuses_the_unfused_bias_gelu_it_does_not_run(cli, tmp_path):
    """Hugging Face's GPT-2-style MLP adds c_fc's bias in the GEMM (Conv1D: torch.addmm with the bias), so a plan
    priced with the fc1 bias in its own pass (bias_gelu_fusion off) is refused; with the fusion it exports, and a
    SwiGLU model (no GeLU bias priced) is not refused for the key."""
    from test_export_switches import export, saved
    code, files, err = export(cli, biased_dense_plan(cli, tmp_path / "off", bias_gelu_fusion=False), "deepspeed",
                              tmp_path / "ds-off")
    assert code == 2 and files == "" and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "bias_gelu_fusion off" in err and "gpt-1.7b: attention_bias true, mlp_bias true" in err, err
    assert "set bias_gelu_fusion true in the plan, or export to megatron" in err, err
    code, _, err = export(cli, biased_dense_plan(cli, tmp_path / "on"), "deepspeed", tmp_path / "ds-on")
    assert "bias_gelu_fusion" not in err, err
    code, _, err = export(cli, saved(cli, tmp_path / "llama", bias_gelu_fusion=False), "deepspeed",
                          tmp_path / "ds-llama")
    assert "bias_gelu_fusion" not in err, err
