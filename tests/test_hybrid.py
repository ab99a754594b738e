"""Hybrid layer stacks (Mamba-2, Gated DeltaNet and attention layers, mixer-only and MLP-only blocks): the
config readers, the per-kind costs and the serving state that replaces the KV cache.

Published figures: Nemotron-H / Nemotron-3 layer patterns from Megatron-Bridge's NemotronH providers and the
Hugging Face configs; formulas from Dao & Gu 2024 (Mamba-2, SSD) and Yang et al. 2024 (Gated DeltaNet).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.compute import attention_keys, layer_flops
from llmplan.cost.inference import (
    kv_bytes_per_seq_gpu,
    kv_bytes_per_token,
    serve_memory,
)
from llmplan.cost.memory import layer_activation_parts
from llmplan.cost.mixers import (
    decode_scan_flops,
    gdn_scan_flops,
    mamba_params,
    mamba_scan_flops,
    recurrent_state_bytes,
)
from llmplan.cost.params import param_counts
from llmplan.specs.check import check_plan
from llmplan.specs.hf import from_hf_config
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models
from llmplan.specs.serve import ServeJob, ServePlan

NANO_PATTERN = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"  # Megatron-Bridge Nemotron3NanoProvider
NANO_CONFIG = {"model_type": "nemotron_h", "hidden_size": 2688, "intermediate_size": 1856, "num_hidden_layers": 52,
               "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128, "vocab_size": 131072,
               "max_position_embeddings": 262144, "hybrid_override_pattern": NANO_PATTERN, "mamba_num_heads": 64,
               "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4,
               "n_routed_experts": 128, "num_experts_per_tok": 6, "moe_intermediate_size": 1856,
               "moe_shared_expert_intermediate_size": 3712, "n_group": 1, "topk_group": 1,
               "routed_scaling_factor": 2.5, "norm_topk_prob": True, "mlp_hidden_act": "relu2"}


def test_nemotron_h_config_reads_its_pattern_into_layer_kinds():
    m = ModelSpec(**from_hf_config(NANO_CONFIG, "nano"))
    # The Nemotron-3 Nano model card: 23 Mamba-2 and 23 MoE layers, 6 attention layers.
    assert (m.count_layers("mamba"), m.num_moe_layers, m.num_attention_layers) == (23, 23, 6)
    assert m.num_mlp_layers == 0 and not m.gated_mlp and m.scoring_func == "sigmoid"
    built_in = builtin_models()["nemotron-3-nano"]
    assert (m.layer_types, m.mlp_layer_types) == (built_in.layer_types, built_in.mlp_layer_types)
    assert param_counts(m) == param_counts(built_in)


def test_nemotron_h_config_listing_its_blocks_reads_as_the_pattern():
    # Nemotron-3 Ultra's config.json lists layers_block_type (mamba / moe / attention) with num_hidden_layers null
    # (NVIDIA-NeMo/Nemotron create_ultra_new_to_old_overlay.py converts it to hybrid_override_pattern).
    names = {"M": "mamba", "E": "moe", "*": "attention", "-": "mlp"}
    listed = {**NANO_CONFIG, "hybrid_override_pattern": None, "num_hidden_layers": None,
              "layers_block_type": [names[c] for c in NANO_PATTERN]}
    m = ModelSpec(**from_hf_config(listed, "nano"))
    built_in = builtin_models()["nemotron-3-nano"]
    assert (m.num_hidden_layers, m.layer_types, m.mlp_layer_types) == (52, built_in.layer_types,
                                                                      built_in.mlp_layer_types)
    with pytest.raises(ValueError, match=r"layers_block_type holds 'gdn'"):
        from_hf_config({**listed, "layers_block_type": ["mamba", "gdn"]}, "x")


@pytest.mark.parametrize("change, message", [
    ({"layers_block_type": ["mamba", "gdn"]}, "layers_block_type holds 'gdn'; llmplan models the blocks mamba, "
                                              "attention, mlp, moe"),
    ({"layers_block_type": "mamba"}, "layers_block_type is 'mamba', not a list of block names"),
    ({"layers_block_type": ["mamba", "moe", "attention"], "num_hidden_layers": 4},
     "layers_block_type lists 3 blocks but num_hidden_layers is 4; give one name per layer"),
])
def test_malformed_nemotron_h_block_list_is_one_line_and_exit_2(cli, tmp_path, change, message):
    # A user's nemotron_h config.json in the Nemotron-3 Ultra form (layers_block_type, no pattern), malformed:
    # the CLI names the key, the value and the rule in one line and exits 2.
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**NANO_CONFIG, "hybrid_override_pattern": None,
                                              "num_hidden_layers": None, **change}))
    assert message in cli("estimate", "--model", path, "--hardware", "dgx-h100", "--tp", "8").refusal()


def test_nemotron_h_pattern_with_an_unknown_block_is_refused():
    with pytest.raises(ValueError, match=r"hybrid_override_pattern holds 'G'"):
        from_hf_config({**NANO_CONFIG, "hybrid_override_pattern": NANO_PATTERN[:-1] + "G"}, "x")
    with pytest.raises(ValueError, match="51 symbols but num_hidden_layers is 52"):
        from_hf_config({**NANO_CONFIG, "hybrid_override_pattern": NANO_PATTERN[:-1]}, "x")


def test_qwen3_next_config_places_full_attention_every_fourth_layer():
    cfg = {"model_type": "qwen3_next", "hidden_size": 2048, "intermediate_size": 5120, "num_hidden_layers": 48,
           "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "vocab_size": 151936,
           "max_position_embeddings": 262144, "num_experts": 512, "num_experts_per_tok": 10,
           "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "norm_topk_prob": True,
           "full_attention_interval": 4, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
           "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4}
    m = ModelSpec(**from_hf_config(cfg, "q"))
    assert m.layer_types[:4] == ("linear_attention",) * 3 + ("full_attention",)
    assert m.num_attention_layers == 12 and m.num_moe_layers == 48 and m.attention_output_gate
    assert param_counts(m).total == param_counts(builtin_models()["qwen3-next-80b-a3b"]).total


def test_mamba_mixer_params_follow_megatron_shapes():
    # Nemotron-H 8B (Megatron-Bridge NemotronHModelProvider8B): h 4096, 128 heads of 64, state 128, 8 groups,
    # conv 4: in_proj 4096 x (2·8192 + 2·8·128 + 128), conv (8192 + 2048) x (4 + 1), 3 x 128, norm 8192,
    # out_proj 8192 x 4096.
    m = builtin_models()["nemotron-h-8b"]
    assert mamba_params(m) == 4096 * 18560 + 10240 * 5 + 384 + 8192 + 8192 * 4096


@settings(max_examples=30, deadline=None, derandomize=True)
@given(s=st.sampled_from([1024, 4096, 16384, 65536]))
def test_recurrent_scans_are_linear_in_sequence_length(s):
    # Dao & Gu 2024 §6 and Yang et al. 2024 §3.3: the chunked scans cost a fixed amount per token, while
    # attention's score FLOPs per token grow with s.
    m = builtin_models()["qwen3-next-80b-a3b"]
    short = ParallelPlan(tp=1, pp=1, dp=1, micro_batch=1, global_batch=1, seq_len=s)
    long_ = short.model_copy(update={"seq_len": 2 * s})
    scan = m.count_layers("linear_attention") * gdn_scan_flops(m) / m.num_hidden_layers
    attn_short = layer_flops(m, short, True).attention - s * scan
    attn_long = layer_flops(m, long_, True).attention - 2 * s * scan
    assert attn_long == pytest.approx(4 * attn_short)  # attention: s² per sequence
    assert mamba_scan_flops(builtin_models()["nemotron-h-8b"]) > 0


def test_attention_keys_count_only_attention_layers():
    m = builtin_models()["nemotron-h-8b"]  # 4 attention layers of 52
    assert attention_keys(m, 8192) == pytest.approx(8192 * 4 / 52)


def test_hybrid_activation_parts_sum_and_include_the_recurrent_mixers():
    m = builtin_models()["nemotron-h-8b"]
    plan = ParallelPlan(tp=2, pp=1, dp=1, micro_batch=1, global_batch=1, seq_len=4096, sp=True)
    parts = layer_activation_parts(m, plan, False)
    assert parts.recurrent > 0
    assert parts.total == pytest.approx(sum(getattr(parts, k) for k in parts.PARTS))


@pytest.mark.parametrize("name", ["nemotron-3-nano", "qwen3-next-80b-a3b", "nemotron-h-8b", "nemotron-3-super",
                                  "nemotron-3-ultra", "minimax-m1"])
def test_recurrent_state_is_separate_from_the_kv_cache_and_does_not_grow_with_context(name):
    m = builtin_models()[name]
    plan = ServePlan(tp=1, pp=1, dp=1)
    short = ServeJob(input_len=2048, output_len=256, batch=4)
    long_ = ServeJob(input_len=6144, output_len=256, batch=4)
    a, b = serve_memory(m, plan, short, 141e9), serve_memory(m, plan, long_, 141e9)
    assert a.recurrent_state == b.recurrent_state == 4 * recurrent_state_bytes(m, 2.0, 1) > 0
    assert b.kv_cache > a.kv_cache
    assert a.total == pytest.approx(sum(getattr(a, k) for k in a.PARTS))
    # The KV cache holds only the attention layers.
    assert kv_bytes_per_token(m) == m.num_attention_layers * 2 * m.kv_heads * m.d_head * 2
    assert float(kv_bytes_per_seq_gpu(m, plan, 1000)) == pytest.approx(1000 * kv_bytes_per_token(m))


def test_gdn_state_matches_vllm_shapes():
    # vLLM MambaStateShapeCalculator.gated_delta_net_state_shape: conv (2·16·128 + 32·128, 3) and temporal
    # (32, 128, 128) per layer for Qwen3-Next at tp 1; 36 linear-attention layers, bf16.
    m = builtin_models()["qwen3-next-80b-a3b"]
    assert recurrent_state_bytes(m, 2.0, 1) == 36 * 2 * (8192 * 3 + 32 * 128 * 128)
    assert decode_scan_flops(m) == 36 * 32 * 6 * 128 * 128


def test_tp_and_cp_follow_megatron_mamba_sharding():
    m = builtin_models()["nemotron-3-nano"]  # 64 Mamba heads, 8 groups, 2 KV heads
    plan = ParallelPlan(tp=4, pp=1, dp=1, micro_batch=1, global_batch=1, seq_len=4096)
    assert "tp_recurrent_heads" in {v.rule for v in check_plan(m, plan.model_copy(update={"tp": 16}))}
    ok = ParallelPlan(tp=2, cp=16, pp=1, dp=1, micro_batch=1, global_batch=1, seq_len=4096)
    assert "cp_recurrent_heads" not in {v.rule for v in check_plan(m, ok)}  # 32 heads, 4 groups per TP rank
    bad = ok.model_copy(update={"cp": 64})
    assert "cp_recurrent_heads" in {v.rule for v in check_plan(m, bad)}


def test_dense_transformers_are_priced_as_before():
    m = builtin_models()["llama-3.1-8b"]
    assert param_counts(m).recurrent_mixers == 0 and not m.is_hybrid
    assert param_counts(m).total == 8_030_261_248  # meta-llama/Llama-3.1-8B safetensors total


@pytest.mark.parametrize("name", ["nemotron-3-nano", "qwen3-next-80b-a3b", "nemotron-h-8b"])
def test_vectorised_search_agrees_with_the_scalar_estimate_on_hybrids(name):
    import numpy as np

    from llmplan.estimate import estimate_training
    from llmplan.search.evaluate import evaluate
    from llmplan.search.grid import Workload, default_space, enumerate_plans, from_plan
    from llmplan.specs.plan import ClusterSpec
    from llmplan.specs.registry import builtin_systems

    m, cluster = builtin_models()[name], ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=2)
    w = Workload(global_batch=256, seq_len=4096)
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    rng = np.random.default_rng(3)
    picked = [p for p in (plans.plan(int(i)) for i in rng.permutation(len(plans))[:400])
              if not check_plan(m, p, cluster)][:8]
    assert picked
    for plan in picked:
        scalar, vec = estimate_training(m, cluster, plan), evaluate(m, cluster, from_plan(plan))
        assert float(vec.memory.total[0]) == pytest.approx(float(scalar.memory.total), rel=1e-9)
        assert float(vec.step.total[0]) == pytest.approx(float(scalar.time.total), rel=1e-9)


@pytest.mark.parametrize("pp,vpp", [(1, 1), (2, 1), (4, 1), (2, 2)])
def test_pipeline_stages_hold_the_pattern_s_moe_layers(pp, vpp):
    # Nemotron-3 Nano's pattern holds 23 MoE blocks among 52; whatever the split, the stages hold them all, and
    # each stage the MoE blocks of its own layers (Megatron-LM assigns consecutive layers to a stage).
    from llmplan.cost.params import stage_layers

    m = builtin_models()["nemotron-3-nano"]
    plan = ParallelPlan(tp=1, pp=pp, vpp=vpp, dp=1, micro_batch=1, global_batch=pp * 4, seq_len=4096)
    per_stage = [stage_layers(m, plan, i) for i in range(pp)]
    assert sum(int(moe) for _, moe in per_stage) == 23
    assert sum(int(d) + int(e) for d, e in per_stage) == 52
    if (pp, vpp) == (2, 1):  # layers 0-25 and 26-51 of the pattern
        assert [int(e) for _, e in per_stage] == [NANO_PATTERN[:26].count("E"), NANO_PATTERN[26:].count("E")]


def _hybrid_plan_file(name, **plan):
    import dataclasses
    from pathlib import Path

    from llmplan.planfile import load_plan

    base = load_plan(Path(__file__).parent / "data" / "plans" / "moe_train.json")
    fields = {"tp": 1, "pp": 1, "dp": 8, "ep": 8, "micro_batch": 1, "global_batch": 64, "seq_len": 4096}
    fields.update(plan)
    return dataclasses.replace(base, model=builtin_models()[name], plan=ParallelPlan(**fields))


@pytest.mark.parametrize("name,pp,vpp,pattern", [
    ("nemotron-3-nano", 1, 1, NANO_PATTERN),
    ("nemotron-3-nano", 2, 2, "|".join([NANO_PATTERN[:13], NANO_PATTERN[13:26], NANO_PATTERN[26:39],
                                        NANO_PATTERN[39:]])),
    # its MTP module after '/': gated full attention and MoE (vllm qwen3_next_mtp.py @ffdc9857)
    ("qwen3-next-80b-a3b", 1, 1, "GEGEGE*E" * 12 + "/*E"),
])
def test_megatron_export_writes_the_hybrid_layer_pattern(name, pp, vpp, pattern):
    # Megatron-LM (d98e8a6) hybrid_layer_allocation.Symbols: M mamba, G gdn, * attention, - mlp, E moe, '|'
    # between pipeline segments, '/' before each MTP depth; pretrain_hybrid.py; every flag parses with
    # Megatron-LM's recorded parser.
    from test_export import parse_megatron

    from llmplan.export import render_all

    pf = _hybrid_plan_file(name, pp=pp, vpp=vpp, dp=8 // pp, global_batch=64)
    script = render_all(pf, "megatron")[0]["megatron_pretrain.sh"]
    ns, _ = parse_megatron(script)
    assert ns.hybrid_layer_pattern.strip('"') == pattern
    assert int(ns.num_layers) == len(pattern.split("/")[0].replace("|", ""))
    assert "pretrain_hybrid.py" in script and ns.num_layers_per_virtual_pipeline_stage is None
    assert ns.moe_layer_freq is None and ns.pipeline_model_parallel_layout is None
    if name == "qwen3-next-80b-a3b":
        assert ns.attention_output_gate and int(ns.linear_num_value_heads) == 32
    else:
        assert int(ns.mamba_num_heads) == 64 and ns.squared_relu and ns.position_embedding_type == "none"


def test_megatron_export_refuses_chunked_attention_in_a_hybrid():
    from llmplan.export import render_all
    from llmplan.export.common import CannotExpress

    m = builtin_models()["nemotron-h-8b"]
    kinds = tuple("chunked_attention" if k == "full_attention" else k for k in m.layer_types)
    pf = _hybrid_plan_file("nemotron-h-8b", ep=1)
    pf = pf.__class__(**{**pf.__dict__, "model": m.model_copy(update={"layer_types": kinds,
                                                                      "attention_chunk_size": 8192})})
    with pytest.raises(CannotExpress, match="chunked_attention layers in a hybrid stack"):
        render_all(pf, "megatron")


@pytest.mark.parametrize("target,program,flag", [("vllm", "vllm serve", "--mamba-ssm-cache-dtype"),
                                                 ("sglang", "python -m sglang.launch_server", "--mamba-ssm-dtype")])
def test_serving_exports_state_the_recurrent_state_dtype_the_memory_assumed(target, program, flag):
    # vLLM's --mamba-ssm-cache-dtype / SGLang's --mamba-ssm-dtype (recorded parsers in tests/data/launchers):
    # the serving memory prices the state in bf16, so the command says so.
    import dataclasses
    from pathlib import Path

    from test_export import parse_serve_export

    from llmplan.planfile import load_plan

    base = load_plan(Path(__file__).parent / "data" / "plans" / "serve.json")
    # 8 GPUs (tp x pp x replicas); Qwen3-Next's bf16 weights fit at tp 4, so the engine has a KV cache to admit
    pf = dataclasses.replace(base, model=builtin_models()["qwen3-next-80b-a3b"], plan=ServePlan(tp=4, pp=1, dp=2))
    ns, unknown = parse_serve_export(pf, target)
    assert not unknown
    assert getattr(ns, flag.lstrip("-").replace("-", "_")) == "bfloat16"


def test_torchtitan_export_refuses_a_hybrid_stack():
    from llmplan.export import render_all
    from llmplan.export.common import CannotExpress

    with pytest.raises(CannotExpress, match="hybrid layer stack"):
        render_all(_hybrid_plan_file("nemotron-h-8b", ep=1), "torchtitan")


def test_hybrid_stages_are_priced_at_the_kinds_they_hold():
    # Nemotron-3 Nano over 4 stages of 13 blocks: stages 0 and 2 hold two attention blocks, 1 and 3 one. At
    # 32k tokens attention costs more than the Mamba-2 / mixer-less blocks it displaces, so the balanced
    # pricing moves time to stages 0 and 2; the pipeline's total over the stages is unchanged (the average
    # layer is the mean of the stages' layers).
    from llmplan.cost.compute import stage_compute
    from llmplan.cost.hybrid_stage import balanced_stage_compute
    from llmplan.cost.params import stage_kind_counts, stage_layers
    from llmplan.specs.registry import builtin_systems

    m, gpu = builtin_models()["nemotron-3-nano"], builtin_systems()["dgx-h100"].gpu
    plan = ParallelPlan(tp=1, pp=4, dp=1, micro_batch=1, global_batch=8, seq_len=32768)
    avg, bal = [], []
    for i in range(4):
        d, e = stage_layers(m, plan, i)
        assert sum(stage_kind_counts(m, plan, i).values()) == d + e
        avg.append(stage_compute(m, plan, gpu, d, e, i == 3).total)
        bal.append(balanced_stage_compute(m, plan, gpu, i, d, e, i == 3).total)
    assert [stage_kind_counts(m, plan, i)["full_attention"] for i in range(4)] == [2, 1, 2, 1]
    assert sum(bal) == pytest.approx(sum(avg), rel=1e-6)  # linear in the shares up to the GEMM-efficiency mix
    assert bal[0] > avg[0] and bal[2] > avg[2] and bal[1] < avg[1] and bal[3] < avg[3]


LLAMA4_TEXT = {"model_type": "llama4_text", "hidden_size": 5120, "intermediate_size": 8192,
               "intermediate_size_mlp": 16384, "num_hidden_layers": 48, "num_attention_heads": 40,
               "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 202048, "max_position_embeddings": 1048576,
               "num_local_experts": 128, "num_experts_per_tok": 1, "interleave_moe_layer_step": 2,
               "attention_chunk_size": 8192, "tie_word_embeddings": False}  # Llama-4-Maverick text_config


def test_llama4_config_interleaves_moe_and_chunked_attention():
    # transformers Llama4TextConfig: moe_layers every interleave_moe_layer_step-th layer, no_rope_layers (global,
    # full attention) every 4th, chunked attention elsewhere; Maverick's card: 400B total, 17B active.
    m = ModelSpec(**from_hf_config({"model_type": "llama4", "text_config": LLAMA4_TEXT}, "maverick"))
    assert m.mlp_layer_types[:4] == ("dense", "moe", "dense", "moe") and m.num_moe_layers == 24
    assert m.layer_types[:4] == ("chunked_attention",) * 3 + ("full_attention",)
    assert (m.expert_ffn, m.intermediate_size, m.shared_ffn) == (8192, 16384, 8192)
    p = param_counts(m)
    assert p.total == pytest.approx(400e9, rel=0.005) and round(p.active / 1e9) == 17
    assert param_counts(builtin_models()["llama-4-maverick"]).total == p.total
    # Scout (16 experts in every layer): 17B active; its card's 109B total counts the vision encoder too.
    scout = ModelSpec(**from_hf_config({**LLAMA4_TEXT, "num_local_experts": 16, "interleave_moe_layer_step": 1},
                                       "scout"))
    assert scout.num_moe_layers == 48 and round(param_counts(scout).active / 1e9) == 17
    assert param_counts(builtin_models()["llama-4-scout"]) == param_counts(scout)
    assert builtin_models()["llama-4-scout"].layer_types == scout.layer_types


def test_scout_config_with_an_empty_no_rope_list_reads_as_the_built_in_spec():
    # meta-llama/Llama-4-Scout-17B-16E config.json text_config: "no_rope_layers": [], "interleave_moe_layer_step": 1;
    # transformers' Llama4TextConfig takes an empty list as the default (every 4th layer without RoPE).
    text = {**LLAMA4_TEXT, "num_local_experts": 16, "interleave_moe_layer_step": 1, "no_rope_layers": []}
    scout = ModelSpec(**from_hf_config({"model_type": "llama4", "text_config": text}, "scout"))
    built_in = builtin_models()["llama-4-scout"]
    assert scout.layer_types == built_in.layer_types and param_counts(scout) == param_counts(built_in)


@pytest.mark.parametrize("change, message", [
    ({"moe_layers": [0, 99]}, "moe_layers holds [99], outside layers 0-47 (num_hidden_layers 48)"),
    ({"no_rope_layers": [1, 0, 1]}, "no_rope_layers lists 3 layers but num_hidden_layers is 48"),
    ({"interleave_moe_layer_step": -2}, "interleave_moe_layer_step is -2; it must be a whole number >= 1"),
])
def test_malformed_llama4_config_is_one_line_and_exit_2(cli, tmp_path, change, message):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama4", "text_config": {**LLAMA4_TEXT, **change}}))
    assert message in cli("estimate", "--model", path, "--hardware", "dgx-h100", "--tp", "8").refusal()


def test_chunked_attention_counts_keys_within_the_chunk():
    m = builtin_models()["llama-4-maverick"]  # 36 chunked layers (8192), 12 full
    assert attention_keys(m, 32768) == pytest.approx((36 * 8192 + 12 * 32768) / 48)
    assert attention_keys(m, 4096) == pytest.approx(4096)
    plan = ServePlan(tp=8, pp=1, dp=1)
    per_token = kv_bytes_per_token(m) / 48  # every layer caches K and V
    assert float(kv_bytes_per_seq_gpu(m, plan, 32768)) == pytest.approx((36 * 8192 + 12 * 32768) * per_token / 8)


def test_scout_chunked_cache_stops_growing_at_the_chunk_and_holds_no_recurrent_state():
    # Llama 4 Scout: 36 chunked layers (8192 tokens) and 12 full-attention layers, no recurrent mixer. Past the
    # chunk only the 12 full layers' cache grows with the context; below it every layer's cache does.
    m = builtin_models()["llama-4-scout"]
    plan = ServePlan(tp=8, pp=1, dp=1)
    per_layer_token = kv_bytes_per_token(m) / 48
    kv = [float(kv_bytes_per_seq_gpu(m, plan, s)) for s in (4096, 8192, 32768, 65536)]
    assert kv[1] - kv[0] == pytest.approx(48 * 4096 * per_layer_token / 8)
    assert kv[3] - kv[2] == pytest.approx(12 * 32768 * per_layer_token / 8)
    mems = [serve_memory(m, plan, ServeJob(input_len=s, output_len=256, batch=2), 141e9) for s in (16384, 65536)]
    assert mems[0].recurrent_state == mems[1].recurrent_state == 0
    assert mems[1].kv_cache > mems[0].kv_cache


def test_megatron_export_refuses_chunked_attention():
    from llmplan.export import render_all
    from llmplan.export.common import CannotExpress

    pf = _hybrid_plan_file("llama-4-maverick", tp=8, dp=1, ep=1)
    with pytest.raises(CannotExpress, match="chunked local attention"):
        render_all(pf, "megatron")


def test_deepseek_sparse_attention_prices_top_k_keys_and_the_indexer():
    # DeepSeek-V3.2-Exp report §2.1: the MLA core attends to index_topk (2,048) keys chosen by a lightning
    # indexer (64 heads of 128) that scores every preceding key; its key cache is fp8 with an fp32 scale per 128.
    from llmplan.cost.sparse import (
        indexer_cache_bytes,
        indexer_flops_per_pair,
        indexer_params,
    )

    dense, sparse = builtin_models()["deepseek-v3"], builtin_models()["deepseek-v3.2"]
    assert indexer_params(sparse) == 1536 * 64 * 128 + 7168 * 128 + 2 * 128 + 7168 * 64
    s = 131072
    assert attention_keys(sparse, s) == pytest.approx(2 * 2048 - 2048 ** 2 / s)  # top-k as a k-token window
    plan = ParallelPlan(tp=1, pp=1, dp=1, micro_batch=1, global_batch=1, seq_len=s)
    d, sp = layer_flops(dense, plan, True).attention, layer_flops(sparse, plan, True).attention
    assert sp == pytest.approx(d * attention_keys(sparse, s) / s + s * s * indexer_flops_per_pair(sparse))
    assert sp < d / 4  # at 128k tokens the indexer's fp8 heads cost far less than dense MLA attention
    # Serving: the whole latent cache stays (any key may be picked), plus the indexer's keys.
    assert kv_bytes_per_token(sparse) == pytest.approx(61 * ((512 + 64) * 2 + 128 + 4))
    assert indexer_cache_bytes(dense) == 0


def test_deepseek_v32_config_is_read():
    from llmplan.specs.registry import builtin_models as bm

    ref = bm()["deepseek-v3.2"]
    cfg = {"model_type": "deepseek_v32", **{k: v for k, v in ref.model_dump().items()
                                            if k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                     "num_attention_heads", "num_key_value_heads", "vocab_size",
                                                     "max_position_embeddings", "moe_intermediate_size",
                                                     "n_shared_experts", "first_k_dense_replace", "n_group",
                                                     "topk_group", "q_lora_rank", "kv_lora_rank",
                                                     "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                                                     "num_experts_per_tok", "routed_scaling_factor",
                                                     "index_topk", "index_n_heads", "index_head_dim")},
           "n_routed_experts": 256}
    m = ModelSpec(**from_hf_config(cfg, "v32"))
    assert m.is_sparse_attention and m.is_mla and m.expert_bias and m.scoring_func == "sigmoid"
    assert param_counts(m).total == param_counts(ref).total


def test_megatron_export_refuses_sparse_attention_rather_than_write_dense_mla():
    from llmplan.export import render_all
    from llmplan.export.common import CannotExpress

    pf = _hybrid_plan_file("deepseek-v3.2", tp=8, dp=1, ep=1)
    with pytest.raises(CannotExpress, match="DeepSeek Sparse Attention"):
        render_all(pf, "megatron")


DEEPSEEK_V4_FLASH_CONFIG = {
    # deepseek-ai/DeepSeek-V4-Flash config.json (model_type deepseek_v4): compress_ratios 0, 0, then 4 and 128
    # alternating, and 0 for its MTP layer (the 44th entry); no intermediate_size (the shared expert's width is
    # moe_intermediate_size)
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "vocab_size": 129280,
    "hidden_size": 4096, "moe_intermediate_size": 2048, "num_hidden_layers": 43, "num_attention_heads": 64,
    "num_key_value_heads": 1, "head_dim": 512, "q_lora_rank": 1024, "qk_rope_head_dim": 64, "o_lora_rank": 1024,
    "o_groups": 8, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 6, "num_hash_layers": 3,
    "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc", "norm_topk_prob": True, "routed_scaling_factor": 1.5,
    "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "sliding_window": 128,
    "compress_ratios": [0, 0] + [4 if i % 2 == 0 else 128 for i in range(2, 43)] + [0],
    "compress_rope_theta": 160000, "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512,
    "num_nextn_predict_layers": 1, "max_position_embeddings": 1048576, "rope_theta": 10000,
    "tie_word_embeddings": False, "swiglu_limit": 10.0}


def test_deepseek_v4_config_reads_as_the_built_in(cli, tmp_path):
    # The published config.json gives the deepseek-v4-flash built-in's fields and parameter count (284.3B against
    # the model card's 284B); a file without its per-layer compression ratios is refused in one line, exit 2.
    from llmplan.specs.hf import from_hf_config
    m = ModelSpec(**from_hf_config(DEEPSEEK_V4_FLASH_CONFIG, "DeepSeek-V4-Flash"))
    built_in = builtin_models()["deepseek-v4-flash"]
    # router_aux_loss_coef: config.json gives none (None); the built-in trains without the loss, 0, as
    # Megatron-Bridge@067f987's DeepSeek-V4 bridge and recipes do
    same = {"name", "source", "declared_params", "router_aux_loss_coef"}
    assert {k for k in type(m).model_fields if getattr(m, k) != getattr(built_in, k)} <= same
    assert param_counts(m).total == param_counts(built_in).total == pytest.approx(284e9, rel=0.005)
    assert m.count_layers("compressed_sparse_attention") == 21 and m.count_layers("heavily_compressed_attention") == 20
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in DEEPSEEK_V4_FLASH_CONFIG.items() if k != "compress_ratios"}))
    r = cli("estimate", "--model", path, "--hardware", "dgx-h100", "--nodes", "1", "--tp", "1", "--ep", "8")
    assert "gives no compress_ratios" in r.refusal()
