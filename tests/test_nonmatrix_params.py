"""fp8_params stores only Transformer Engine's GEMM weights in the recipe's format: every parameter that is no
linear-layer weight matrix (biases, norms, q/k and latent norms, routers, the Mamba-2 / Gated DeltaNet mixers'
convolution, A_log, D, dt_bias and gated norm) stays in bf16, 2 bytes (docs/formulas.md#mem.fp8_param_bf16_parts,
docs/validation.md#nonmatrix-params).

Sources: NVIDIA/TransformerEngine at d0067d0da6, transformer_engine/pytorch/module/base.py (reset_parameters: only
parameters registered with an fp8_meta_index are quantized), module/linear.py and module/grouped_linear.py (weights
registered with fp8_meta_index, biases without); NVIDIA/Megatron-LM at d98e8a64dd, megatron/core/ssm/mamba_mixer.py
(conv1d_weight, conv1d_bias, dt_bias, A_log, D: nn.Parameter; ExtendedRMSNorm), ssm/gated_delta_net/common.py
(nn.Conv1d, dt_bias, A_log, out_norm)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.memory import MemoryAllowance, stage_memory
from llmplan.cost.model_states import (bf16_kept_params, low_precision_params, low_precision_weight_cache,
                                       model_bf16_kept_params)
from llmplan.cost.params import param_counts, rank_params, stepped_rank_params
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models

M = builtin_models()


def plan(**kw) -> ParallelPlan:
    base = {"dp": 8, "zero": 1, "global_batch": 64, "dtype": "fp8", "recipe": "mxfp8", "fp8_params": True}
    return ParallelPlan(**{**base, **kw})


# GPT-OSS 20B (openai/gpt-oss-20b config.json): h 2880, 24 layers, all MoE, 64 query heads and 8 KV heads of 64,
# biased attention (q/k/v and output), 32 experts of width 2880 with biases (gate_up 2 x 2880, down 2880), a biased
# router (h x 32 + 32), RMSNorms, untied vocabulary 201088 (a multiple of 128: no padding at tp 1), and one
# learned sink per query head per layer (transformers modeling_gpt_oss.py GptOssAttention.sinks: a plain
# parameter, kept in bf16).
OH, OL, OA, OK, OD, OV, OE, OF = 2880, 24, 64, 8, 64, 201088, 32, 2880
OSS_ATTN_BIAS = OA * OD + 2 * OK * OD + OH + OA  # q/k/v and output biases, the sinks
OSS_EXPERT_BIAS = OE * (2 * OF + OH)
OSS_KEPT_DENSE = 2 * OV * OH + (2 * OL + 1) * OH + OL * (OH * OE + OE) + OL * OSS_ATTN_BIAS


def test_gpt_oss_biases_are_kept_two_bytes_by_hand():
    m, p = M["gpt-oss-20b"], plan()
    kept = bf16_kept_params(m, p, 0)
    assert float(kept.dense) == OSS_KEPT_DENSE
    assert float(kept.expert) == OL * OSS_EXPERT_BIAS
    # memory: every parameter at 1 byte (MXFP8's weight_bytes), the cache, and one more byte a kept parameter
    rp = rank_params(m, p, 0)
    mem = stage_memory(m, p, 0, MemoryAllowance(), 80e9)
    cache = float(low_precision_weight_cache(m, p, 0))
    want = float(rp.total) * p.weight_bytes + cache + (OSS_KEPT_DENSE + OL * OSS_EXPERT_BIAS) * (2 - p.weight_bytes)
    assert float(mem.weights) == pytest.approx(want, rel=1e-12)


def test_qwen25_qkv_biases_split_over_tp_by_hand():
    # Qwen2.5-72B (config.json): h 8192, 80 layers, 64 query / 8 KV heads of 128, q/k/v biases, no output bias;
    # vocabulary 152064 = 594 x 256 (no padding at tp 2). At tp 2 a rank holds half of each bias.
    h, L, a, K, d, V = 8192, 80, 64, 8, 128, 152064
    kept = bf16_kept_params(M["qwen2.5-72b"], plan(tp=2), 0)
    assert float(kept.total) == 2 * V * h / 2 + (2 * L + 1) * h + L * (a * d + 2 * K * d) / 2


def test_nemotron_h_mamba_mixer_parameters_are_kept_by_hand():
    # Nemotron-H 8B (nvidia/Nemotron-H-8B-Base-8K config.json): h 4096, 52 blocks (24 Mamba-2, 4 attention, 24
    # MLP) with one RMSNorm each and a final one, 128 heads of 64, state 128, 8 groups, convolution width 4 over
    # x, B, C (8192 + 2 x 1024 channels, a bias each), A_log, D and dt_bias per head, the gated norm over 8192;
    # no linear biases; untied vocabulary 131072.
    h, V, H, P, N, G, k = 4096, 131072, 128, 64, 128, 8, 4
    mamba = (H * P + 2 * G * N) * (k + 1) + 3 * H + H * P
    kept = bf16_kept_params(M["nemotron-h-8b"], plan(), 0)
    assert float(kept.total) == pytest.approx(2 * V * h + 53 * h + 24 * mamba, rel=1e-12)


def test_qwen3_next_gdn_and_attention_norms_are_kept_by_hand():
    # Qwen3-Next 80B-A3B (config.json): h 2048, 48 layers repeating 3 Gated DeltaNet + 1 gated attention (q/k norms
    # of 256), all MoE (512 experts and a shared expert, router h x 512); GDN: 16 key heads of 128, 32 value heads
    # of 128, convolution width 4 over q, k, v (no bias), A_log and dt_bias per value head, the gated norm over 128;
    # two RMSNorms a layer; vocabulary 151936 (= 1187 x 128). Stage 0 of pp 2 (the MTP module rides on the last
    # stage): the embedding and 24 layers, 18 GDN and 6 attention.
    h, V, E = 2048, 151936, 512
    gdn = (2 * 16 * 128 + 32 * 128) * 4 + 2 * 32 + 128
    kept = bf16_kept_params(M["qwen3-next-80b-a3b"], plan(pp=2), 0)
    want = V * h + 24 * 2 * h + 24 * h * E + 18 * gdn + 6 * 2 * 256
    assert float(kept.total) == pytest.approx(want, rel=1e-12)
    assert float(kept.expert) == 0.0  # no expert biases


def test_without_low_precision_layers_every_parameter_is_kept():
    m = M["gpt-oss-20b"]
    p = plan(bf16_layers_start=12, bf16_layers_end=12)
    assert float(low_precision_params(m, p, 0).total) == 0.0


FAMILIES = sorted(M)


@pytest.mark.parametrize("name", FAMILIES)
@settings(max_examples=5, deadline=None, derandomize=True)
@given(pp=st.sampled_from([1, 2, 3, 4]), bf16_ends=st.sampled_from([0, 1, 2]))
def test_stages_split_sums_to_the_whole_models_count(name, pp, bf16_ends):
    # The per-rank split (low_precision_params + bf16_kept_params = the rank's parameters) summed over a
    # pipeline's stages at tp = ep = 1 matches the whole-model rule (param_counts less model_bf16_kept_params):
    # two paths through nonmatrix_layer_params, one over stage_layers, one over the model's layer counts. The
    # pipeline's extra copies (a tied embedding's last-stage copy, the vocabulary padding) are kept.
    m = M[name].model_copy(update={"num_nextn_predict_layers": 0})  # param_counts leaves MTP modules out
    pp = max(d for d in range(1, pp + 1) if m.num_hidden_layers % d == 0)  # even stages (no pp_first / pp_last)
    p = plan(pp=pp, bf16_layers_start=bf16_ends, bf16_layers_end=bf16_ends)
    low = sum(float(low_precision_params(m, p, s).total) for s in range(pp))
    kept = sum(float(bf16_kept_params(m, p, s).total) for s in range(pp))
    held = sum(float(stepped_rank_params(m, p, s).total) for s in range(pp))
    assert low + kept == pytest.approx(held, rel=1e-12)
    assert low >= 0 and kept >= 0
    whole = float(param_counts(m).total) - float(model_bf16_kept_params(m, p))
    assert low == pytest.approx(whole, rel=1e-12, abs=1.0)
