"""Parameter-count edges (docs/formulas.md#params.model, #params.rank, #mem.nonmatrix_params;
docs/validation.md#param-edges): what every tensor-parallel rank holds whole, GPT-OSS's attention sinks, and
the multi-token-prediction module's block.

Sources: NVIDIA/Megatron-LM at d98e8a64dd megatron/core/tensor_parallel/layers.py (RowParallelLinear: "bias is
not parallelized", a bias of output_size; ColumnParallelLinear: output_size_per_partition), transformer/
attention.py (q_layernorm / k_layernorm of hidden_size_per_attention_head), transformer/dot_product_attention.py
(softmax_type "learnable": softmax_offset of num_attention_heads_per_partition), transformer/
multi_token_prediction.py (MultiTokenPredictionLayer); NVIDIA/TransformerEngine at d0067d0da6
transformer_engine/pytorch/module/linear.py and grouped_linear.py (parallel_mode "row" splits in_features only;
the biases keep out_features). Every expected value below is computed from the config dimensions by hand."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.model_states import bf16_kept_params
from llmplan.cost.params import (attention_params_per_rank, mtp_module_params, param_counts, rank_params)
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models

M = builtin_models()


def test_gpt3_rank_holds_the_row_parallel_biases_whole():
    # GPT-3 175B (Brown et al. 2020 Table 2.1; Megatron GPT: biased projections, LayerNorm, learned positions,
    # tied embedding): h 12288, 96 layers, 96 heads of 128, f 4h, vocabulary 50257 padded to 51200 at tp 8.
    h, L, f, Vp, pos, t = 12288, 96, 4 * 12288, 51200, 2048, 8
    attention = (3 * h * h + 3 * h + h * h) / t + h  # qkv weights and biases split; proj weight split, bias whole
    mlp = (h * f + f + f * h) / t + h  # fc1 weight and bias split; fc2 weight split, bias whole
    layer = attention + mlp + 2 * 2 * h  # two LayerNorms (weight and bias), replicated
    assert attention_params_per_rank(M["gpt3-175b"], t) == attention
    rp = rank_params(M["gpt3-175b"], ParallelPlan(tp=t, dp=1, global_batch=8), 0)
    assert float(rp.dense) == L * layer + Vp * h / t + pos * h + 2 * h
    # the change against splitting both biases by t: 2h (7/8) per layer, 2.06 M a rank
    assert L * 2 * h * (1 - 1 / t) == 2_064_384


def test_qwen3_q_k_norms_are_whole_on_every_rank():
    # Qwen3-8B (config.json): h 4096, 32 query heads and 8 KV heads of 128, q/k RMSNorm of 128 each. At tp 8 a rank
    # holds 4 query heads, one KV head, and both norms whole.
    h, a, K, d, t = 4096, 32, 8, 128, 8
    assert attention_params_per_rank(M["qwen3-8b"], t) == 2 * h * a * d / t + 2 * h * d * (K // t) + 2 * d


def test_gpt_oss_sinks_are_counted_and_split_by_heads():
    # GPT-OSS 20B (openai/gpt-oss-20b config.json): h 2880, 24 layers, 64 query heads and 8 KV heads of 64, q/k/v/o
    # biases, one learned sink per query head (transformers modeling_gpt_oss.py GptOssAttention.sinks).
    h, L, a, K, d = 2880, 24, 64, 8, 64
    one = h * a * d + 2 * h * K * d + a * d * h + a * d + 2 * K * d + h + a
    assert param_counts(M["gpt-oss-20b"]).attention == L * one
    # tp 2: the q/k/v weights, q/k/v biases and sinks split by heads, the output weight split, its bias whole
    t = 2
    per_rank = (h * a * d + 2 * h * K * d + a * d * h + a * d + 2 * K * d + a) / t + h
    assert attention_params_per_rank(M["gpt-oss-20b"], t) == per_rank
    # the sinks are a plain parameter (no TE GEMM weight): kept in bf16 under fp8_params, a/t per layer a rank
    plan = ParallelPlan(tp=t, dp=4, global_batch=64, dtype="fp8", recipe="mxfp8", fp8_params=True)
    no_sinks = M["gpt-oss-20b"].model_copy(update={"attention_sinks": False})
    gained = bf16_kept_params(M["gpt-oss-20b"], plan, 0).dense - bf16_kept_params(no_sinks, plan, 0).dense
    assert float(gained) == L * a / t


@pytest.mark.parametrize("name, total, sinks", [("gpt-oss-120b", 116.83e9, 36 * 64), ("gpt-oss-20b", 20.91e9, 24 * 64)])
def test_gpt_oss_sinks_keep_the_model_card_totals(name, total, sinks):
    # gpt-oss model card parameter table: 116.83B and 20.91B (to 10 M). The sinks add layers x heads parameters; the
    # totals still print as the card does (116,829,156,672 and 20,914,757,184).
    p = param_counts(M[name])
    assert round(p.total / 1e7) == round(total / 1e7)
    assert p.total - param_counts(M[name].model_copy(update={"attention_sinks": False})).total == sinks


def test_gpt_oss_expert_fc2_bias_is_whole_on_every_expert_tp_rank():
    # GPT-OSS 20B: 32 experts of 2880 (gate_up 2 x 2880 with biases, down 2880 -> h with bias h). ep 4, etp 2: a
    # rank holds 8 experts per layer, half of each weight and fc1 bias, and fc2's bias whole (TE GroupedLinear
    # parallel_mode "row": bias{i} of out_features).
    h, L, E, f, ep, etp = 2880, 24, 32, 2880, 4, 2
    plan = ParallelPlan(tp=2, ep=ep, etp=etp, dp=4, global_batch=64)
    rp = rank_params(M["gpt-oss-20b"], plan, 0)
    assert float(rp.expert) == L * (E / ep) * ((3 * h * f + 2 * f) / etp + h)


def test_qwen3_next_mtp_block_is_an_attention_layer_on_its_rank():
    # Qwen3-Next-80B-A3B (config.json; one MTP module, vllm qwen3_next_mtp.py @ffdc9857: fc 2h -> h, two input
    # norms, a gated full-attention MoE decoder layer, a final norm): h 2048, 16 query heads of 256 with an output
    # gate, 2 KV heads, q/k norms; 512 experts of 512, shared expert 512, router h x 512. tp 2 (etp 2), pp 1, ep 1.
    h, a, K, d, E, fe, fs, t = 2048, 16, 2, 256, 512, 512, 512, 2
    m = M["qwen3-next-80b-a3b"]
    plan = ParallelPlan(tp=t, dp=1, global_batch=8)
    with_mtp, without = rank_params(m, plan, 0), rank_params(m.model_copy(update={"num_nextn_predict_layers": 0}),
                                                             plan, 0)
    attention = (2 * h * a * d + a * d * h) / t + 2 * h * d * (K // t) + 2 * d
    block = attention + h * E + 3 * h * fs / t + 3 * h  # router, shared expert, two pre-norms and final norm
    projection = 2 * h * h / t + 2 * h  # eh_proj (split), enorm and hnorm
    assert float(with_mtp.dense - without.dense) == pytest.approx(block + projection, rel=1e-12)
    assert float(with_mtp.expert - without.expert) == E * 3 * h * fe / t  # its routed experts (etp = tp, no bias)


def test_deepseek_v3_published_counts_with_and_without_the_mtp_module():
    # DeepSeek-V3 README: "685B" on Hugging Face, "671B of the Main Model weights and 14B of the Multi-Token
    # Prediction (MTP) Module weights". param_counts is the main model; the files hold it, the MTP module
    # (README_WEIGHTS.md: "11.5B unique parameters, excluding the shared 0.9B Embedding and 0.9B output Head") and
    # the module's own stored copies of the embedding and output head (model.layers.61.embed_tokens.weight,
    # model.layers.61.shared_head.head.weight, [129280, 7168] each). Tolerances: 0.5% on the three-digit counts,
    # 1% on the module (README_WEIGHTS prints 11.5B; 11.61B computed).
    m = M["deepseek-v3"]
    V, h = 129280, 7168
    main, module = param_counts(m).total, mtp_module_params(m)
    assert main == pytest.approx(671e9, rel=0.005)
    assert module == pytest.approx(11.5e9, rel=0.01)  # 11.61B, 1.0% above the README's 11.5B
    assert main + module + 2 * V * h == pytest.approx(685e9, rel=0.005)


# Property: a rank's parameters summed over the tp (and ep x etp) ranks, less the parts every rank holds whole
# counted once per extra rank, are the model's (pp 1, no MTP module; vocabulary a multiple of 128 x tp; tp divides
# the KV heads).
@settings(max_examples=60, deadline=None)
@given(t=st.sampled_from([1, 2, 4]), ep=st.sampled_from([1, 2]), etp=st.sampled_from([1, 2]),
       K=st.sampled_from([4, 8]), group=st.sampled_from([1, 2]), d=st.sampled_from([32, 64]),
       h=st.sampled_from([256, 384]), E=st.sampled_from([4, 8]), dense_first=st.sampled_from([0, 1]),
       shared=st.sampled_from([0, 96]), attention_bias=st.booleans(), qkv_bias=st.booleans(),
       mlp_bias=st.booleans(), qk_norm=st.booleans(), sinks=st.booleans(), layernorm=st.booleans(),
       tied=st.booleans(), gated=st.booleans())
def test_rank_parameters_sum_to_the_model(t, ep, etp, K, group, d, h, E, dense_first, shared, attention_bias,
                                          qkv_bias, mlp_bias, qk_norm, sinks, layernorm, tied, gated):
    L, V, f, fe = 3, 2048, 512, 128
    m = ModelSpec(name="edge-moe", hidden_size=h, intermediate_size=f, num_hidden_layers=L,
                  num_attention_heads=K * group, num_key_value_heads=K, head_dim=d, vocab_size=V,
                  max_position_embeddings=1024, num_experts=E, num_experts_per_tok=2, moe_intermediate_size=fe,
                  first_k_dense_replace=dense_first, shared_expert_intermediate_size=shared or None,
                  n_shared_experts=1 if shared else 0, attention_bias=attention_bias, qkv_bias=qkv_bias,
                  mlp_bias=mlp_bias, qk_norm=qk_norm, attention_sinks=sinks,
                  norm_type="layernorm" if layernorm else "rmsnorm", tie_word_embeddings=tied, gated_mlp=gated)
    rp = rank_params(m, ParallelPlan(tp=t, ep=ep, etp=etp, dp=ep * etp, global_batch=8), 0)
    p = param_counts(m)
    norm = (2 if layernorm else 1) * h
    n_moe = L - dense_first
    fc2_bias = h if mlp_bias else 0
    whole = ((2 * L + 1) * norm + n_moe * (h * E + (E if mlp_bias else 0))  # norms, routers
             + L * ((h if attention_bias else 0) + (2 * d if qk_norm else 0))  # output bias, q/k norms
             + dense_first * fc2_bias + (n_moe * fc2_bias if shared else 0))  # fc2 biases
    assert float(t * rp.dense - (t - 1) * whole) == pytest.approx(p.total - p.routed_experts, rel=1e-12)
    expert_whole = n_moe * E * fc2_bias  # each expert's fc2 bias on each of its etp ranks
    assert float(ep * etp * rp.expert - (etp - 1) * expert_whole) == pytest.approx(p.routed_experts, rel=1e-12)
