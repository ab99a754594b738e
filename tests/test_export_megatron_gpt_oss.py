"""The Megatron-LM export writes GPT-OSS's own layers, and check_plan refuses DeepSeek Sparse Attention under a ring CP.

Expected values are written by hand from the models' Hugging Face configs (openai/gpt-oss-20b and -120b
config.json: sliding_window 128, layer_types alternating sliding / full from layer 0, swiglu_limit 7.0, rope_theta
150000, rope_scaling yarn factor 32, original_max_position_embeddings 4096, beta_fast 32, beta_slow 1, truncate
false; attention_bias true) and the GPT-OSS MLP of huggingface/transformers models/gpt_oss/modeling_gpt_oss.py
(GptOssExperts: gate * sigmoid(1.702 gate) * (up + 1), the gate clamped at most the limit, up within +/- it), mapped
to Megatron-LM@d98e8a6 as NVIDIA-NeMo/Megatron-Bridge@067f987's gpt_oss_bridge.py provider_bridge maps them:
window_size (sliding_window - 1, 0), quick_gelu with glu_linear_offset 1.0 and activation_func_clamp_value 7.0,
softmax_type learnable, yarn_* as above with yarn_correction_range_round_to_int False, add_bias_linear True."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_export import parse_megatron

from llmplan.specs.check import check_plan
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import resolve_model


def plan_file(cli, tmp_path: Path, model: str, **model_fields: object) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "plan.json"
    made = cli("estimate", "--model", model, "--hardware", "dgx-h100", "--ep", "8", "--etp", "1",
               "--global-batch", "64", "--save", path)
    assert made.code == 0, made.err
    if model_fields:
        doc = json.loads(path.read_text())
        doc["model"].update(model_fields)
        path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("model,layers", [("gpt-oss-20b", 24), ("gpt-oss-120b", 36)])
def test_megatron_export_writes_gpt_oss_windows_sinks_glu_and_yarn(cli, tmp_path, model, layers):
    out = tmp_path / "out"
    r = cli("export", plan_file(cli, tmp_path, model), "--to", "megatron", "-o", out)
    assert r.code == 0, r.err
    script = (out / "megatron_pretrain.sh").read_text()
    ns, _ = parse_megatron(script)  # every flag is one Megatron-LM's parser defines
    assert ns.num_layers == layers
    assert ns.window_size == "127,0"  # HF keeps keys q-127..q (128 with the query's own); TE (127, 0)
    assert ns.window_attn_skip_freq == "[" + ",".join(["1,0"] * (layers // 2)) + "]"  # 1: sliding (layer 1 first)
    assert ns.softmax_type == "learnable"
    assert ns.quick_geglu and not ns.swiglu
    assert float(ns.glu_linear_offset) == 1.0 and float(ns.activation_func_clamp_value) == 7.0
    assert ns.position_embedding_type == "yarn" and int(ns.rotary_base) == 150000
    assert float(ns.rotary_scaling_factor) == 32.0 and int(ns.yarn_original_max_position_embeddings) == 4096
    assert float(ns.yarn_beta_fast) == 32.0 and float(ns.yarn_beta_slow) == 1.0
    assert ns.no_yarn_correction_range_round_to_int
    assert not ns.disable_bias_linear  # Megatron's default add_bias_linear: q, k, v, o, router and expert biases


def test_megatron_export_leaves_gpt_oss_flags_off_a_plain_model(cli, tmp_path):
    made = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--save", tmp_path / "p.json")
    assert made.code == 0, made.err
    assert cli("export", tmp_path / "p.json", "--to", "megatron", "-o", tmp_path / "o").code == 0
    ns, _ = parse_megatron((tmp_path / "o" / "megatron_pretrain.sh").read_text())
    assert ns.swiglu and not ns.quick_geglu and ns.window_size is None and ns.softmax_type is None
    assert ns.position_embedding_type == "rope" and ns.activation_func_clamp_value is None


@pytest.mark.parametrize("fields,words", [
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "RoPE scaling linear"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 32.0, "attention_factor": 1.2}}, "its own attention_factor"),
    ({"mlp_bias": False}, "biases on the attention projections only"),
])
def test_megatron_export_refuses_what_its_flags_cannot_say(cli, tmp_path, fields, words):
    out = tmp_path / "out"
    r = cli("export", plan_file(cli, tmp_path, "gpt-oss-20b", **fields), "--to", "megatron", "-o", out)
    assert r.code == 2 and words in r.err and r.err.count("\n") == 1, r.err
    assert "Traceback" not in r.err and not out.exists()


def test_dsa_under_a_ring_cp_is_refused_with_one_line(cli):
    args = ("estimate", "--model", "deepseek-v3.2", "--hardware", "dgx-h100", "--nodes", "32", "--tp", "8", "--pp",
            "1", "--cp", "2", "--ep", "8", "--etp", "1", "--seq-len", "8192", "--global-batch", "64",
            "--micro-batch", "1")
    r = cli(*args)
    assert r.code == 2
    assert r.err == (
        "error: the plan breaks a rule: cp_impl te cp_comm_type p2p with cp 2 cannot run deepseek-v3.2's DeepSeek "
        "Sparse Attention (top-2048 keys per query from its lightning indexer): Megatron-Core's DSA runs context "
        "parallelism only by all-gathering the K/V (cp_comm_type allgather), not the ring or head split this plan "
        "prices; use --cp-comm-type all_gather (with --cp-impl te), --cp-impl torch-allgather or --cp 1\n")


def test_dsa_rule_passes_all_gather_cp_and_cp1_and_dense_mla():
    dsa = resolve_model("deepseek-v3.2")
    base = dict(tp=8, pp=1, dp=4, ep=8, etp=1, seq_len=8192, global_batch=64, micro_batch=1)

    def broken(m, **kw: object) -> bool:
        return "cp_sparse_attention" in [v.rule for v in check_plan(m, ParallelPlan(**{**base, **kw}))]

    assert broken(dsa, cp=2, cp_impl="te") and broken(dsa, cp=2, cp_impl="torch-alltoall")
    assert not broken(dsa, cp=2, cp_impl="torch-allgather") and not broken(dsa, cp=1)
    assert broken(dsa, cp=2, cp_impl="te", cp_comm_type="a2a")  # Megatron-Core's DSA: allgather only
    assert not broken(dsa, cp=2, cp_impl="te", cp_comm_type="all_gather")
    assert not broken(resolve_model("deepseek-v3"), cp=2, cp_impl="te")  # dense MLA: the ring runs it


def test_megatron_export_refuses_a_clamp_on_a_dense_mlp(cli, tmp_path):
    # TransformerConfig.__post_init__ (d98e8a6): "activation_func_clamp_value for SwiGLU is only supported with MoE"
    path = tmp_path / "p.json"
    assert cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--save", path).code == 0
    doc = json.loads(path.read_text())
    doc["model"]["swiglu_limit"] = 7.0
    path.write_text(json.dumps(doc))
    r = cli("export", path, "--to", "megatron", "-o", tmp_path / "o")
    assert r.code == 2 and "a clamped GLU on a dense MLP (llama-3.1-8b" in r.err and r.err.count("\n") == 1, r.err
    assert not (tmp_path / "o").exists()
