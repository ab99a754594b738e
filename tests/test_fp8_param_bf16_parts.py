"""fp8_params keeps only the transformer layers' GEMM weights in the recipe's format; the embedding, the output
layer, the norms, the MoE routers and the layers a recipe keeps in bf16 stay 2 bytes a weight, in memory and in
the weight all-gather (docs/formulas.md#mem.fp8_param_bf16_parts; docs/validation.md#fp8-bf16-parts).

Sources: NVIDIA/Megatron-LM at 2a75ac12c, megatron/core/fp8_utils.py get_fp8_context(is_init=True) (fp8_model_init
unless is_first_last_bf16_layer), transformer/transformer_block.py _build_layers (layers built under it),
models/gpt/gpt_model.py (VocabParallelEmbedding, ColumnParallelLinear output layer), transformer/moe/router.py
(a plain torch.nn.Parameter), distributed/param_and_grad_buffer.py group_params_for_buffers (buffers keyed by
param dtype: uint8 for FP8 / NVFP4, else param.dtype); NVIDIA/TransformerEngine pytorch/module/base.py
reset_parameters (only parameters with an fp8_meta_index, the GEMM weights, are quantized)."""

from __future__ import annotations

from itertools import islice

import numpy as np
import pytest

from agreement import assert_arrays_agree
from llmplan.cost.comm import dp_transfers
from llmplan.cost.memory import MemoryAllowance, stage_memory
from llmplan.cost.model_states import bf16_kept_params, low_precision_weight_cache
from llmplan.cost.params import rank_params
from llmplan.estimate import estimate_training
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M = builtin_models()
GB200 = builtin_systems()["gb200-nvl72"]
# Llama 3.1 8B (meta-llama/Llama-3.1-8B config.json): vocab 128256 (a multiple of 128: no padding at tp 1),
# hidden 4096, 32 layers, two RMSNorms a layer and a final one, untied output layer.
V, H, L = 128256, 4096, 32
LLAMA8B_KEPT = 2 * V * H + (2 * L + 1) * H


def plan(**kw) -> ParallelPlan:
    base = {"dp": 8, "zero": 1, "global_batch": 64, "dtype": "fp8", "recipe": "tensorwise", "fp8_params": True}
    return ParallelPlan(**{**base, **kw})


def all_gather_bytes(m, p: ParallelPlan) -> float:
    return sum(float(t.calls * t.message) for t in dp_transfers(m, p, "dpcp", "edp") if t.collective == "all-gather")


def test_llama_8b_keeps_embedding_output_and_norms_by_hand():
    m = M["llama-3.1-8b"]
    assert float(bf16_kept_params(m, plan(), 0).total) == LLAMA8B_KEPT
    # a pipeline: the embedding and the first half's norms on stage 0, the rest on the last
    p2 = plan(pp=2, global_batch=64)
    assert float(bf16_kept_params(m, p2, 0).total) == V * H + L * H
    assert float(bf16_kept_params(m, p2, 1).total) == V * H + (L + 1) * H


def test_bf16_layers_are_kept_whole():
    m = M["llama-3.1-8b"]
    p = plan(recipe="mxfp8", bf16_layers_start=1, bf16_layers_end=1)
    rp = rank_params(m, p, 0)
    layer = (float(rp.total) - 2 * V * H - H) / L  # one layer's parameters, its two norms included
    assert float(bf16_kept_params(m, p, 0).total) == pytest.approx(LLAMA8B_KEPT + 2 * (layer - 2 * H))


def test_memory_charges_the_kept_parameters_two_bytes():
    # weights = every parameter at weight_bytes (1), the recipe's cache, and 1 more byte a kept parameter
    m, p = M["llama-3.1-8b"], plan()
    rp = rank_params(m, p, 0)
    mem = stage_memory(m, p, 0, MemoryAllowance(), 80e9)
    cache = float(low_precision_weight_cache(m, p, 0))
    assert float(mem.weights) == pytest.approx(float(rp.total) * 1.0 + cache + LLAMA8B_KEPT * 1.0)


@pytest.mark.parametrize("kw,lp_bytes", [
    ({}, 1.0),  # per-tensor fp8: the uint8 buffer, the kept parameters their bf16 buffer
    ({"recipe": "blockwise"}, 1.0),
    ({"dtype": "fp4", "recipe": "nvfp4"}, 0.5),  # NVFP4's packed rowwise bytes
    ({"recipe": "mxfp8"}, 2.0),  # MXFP8 stages everything through bf16: no change
])
def test_zero1_gather_moves_the_kept_parameters_at_two_bytes(kw, lp_bytes):
    m, p = M["llama-3.1-8b"], plan(**kw)
    total = float(rank_params(m, p, 0).total)
    kept = float(bf16_kept_params(m, p, 0).total)
    assert all_gather_bytes(m, p) == pytest.approx(lp_bytes * (total - kept) + 2.0 * kept)


def test_without_fp8_params_nothing_changes():
    m, p = M["llama-3.1-8b"], plan(fp8_params=False)
    assert all_gather_bytes(m, p) == pytest.approx(2.0 * float(rank_params(m, p, 0).total))


def test_vectorised_search_agrees_with_the_scalar_estimate():
    from llmplan.search.grid import Workload, default_space, enumerate_plans
    m, cluster = M["qwen3-30b-a3b"], ClusterSpec(system=GB200, num_nodes=4)
    w = Workload(global_batch=64, seq_len=4096, dtype="fp8", recipe="tensorwise", fp8_params=True)
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    ok = (i for i in range(len(plans)) if plans.plan(i).dp > 1 and not check_plan(m, plans.plan(i), cluster))
    assert_arrays_agree(m, cluster, plans, list(islice(ok, 0, 140, 7)))


@pytest.mark.parametrize("rid,dtype,params", [
    # bf16_with_nvfp4_mixed sets fp4_param_gather from Megatron-Bridge v0.4.2 (26.04.01); the Llama config
    # functions leave it on (NVIDIA-NeMo/Megatron-Bridge v0.4.2 / v0.5.0 training/mixed_precision.py,
    # scripts/performance/configs/llama/llama31_llm_pretrain.py); v0.3.1 (26.02.01) sets fp8_param_gather False only
    ("mbridge-26.06-pretrain-llama3.1-405b-dgx-gb300-256gpu-nvfp4-tp4pp8cp1epnavp4gbs1536mbs1", "fp4", True),
    ("mbridge-26.02.01-pretrain-llama3.1-405b-dgx-gb300-256gpu-nvfp4-tp4pp8cp1epnavp4gbs1536mbs1", "fp4", False),
    # Kimi-K2 from v0.3.1 (26.02.01) to v0.5.0 (26.06): its default Muon optimizer (dist_muon) turns MXFP8 parameters
    # off (scripts/performance/configs/kimi/kimi_llm_pretrain.py set_kimi_k2_common_configs, the same at each release)
    ("mbridge-26.06-pretrain-kimi-k2-dgx-gb300-256gpu-mxfp8-tp1pp4cp1ep64vp4gbs4096mbs2", "fp8", False),
    ("mbridge-26.04.01-pretrain-kimi-k2-dgx-gb300-256gpu-mxfp8-tp1pp4cp1ep64vp4gbs4096mbs2", "fp8", False),
    ("mbridge-26.02.01-pretrain-kimi-k2-dgx-gb300-256gpu-mxfp8-tp1pp4cp1ep64vp4gbs4096mbs2", "fp8", False),
])
def test_bridge_rows_read_their_presets_primary_weights(row_setup, rid, dtype, params):
    p = row_setup(rid)[2]
    assert (p.dtype, p.fp8_params) == (dtype, params)


# --- docs/validation.md#bf16-parts-fix ---------------------------------------------------------------------------
# GPT 1.7B (Narayanan et al. 2021, Table 1; model_specs/gpt-1.7b.yaml): tied word embedding, vocabulary 51200 (a
# multiple of 128: no padding at tp 1), hidden 2304, 24 layers, learned positions (2048 x h), biased LayerNorms
# (2h each, two a layer and a final one), biased attention and MLP: 12h^2 + 13h a layer.
GV, GH, GL, GPOS = 51200, 2304, 24, 2048
G_LAYER = 12 * GH * GH + 13 * GH
# A layer's low-precision weights: its four linear weight matrices (q/k/v 3h^2, output h^2, fc1 4h^2, fc2 4h^2),
# i.e. its parameters less its two LayerNorms (2h each: weight and bias) and the linear layers' 9h biases (3h qkv,
# h output, 4h fc1, h fc2), which TE does not quantize (docs/formulas.md#mem.fp8_param_bf16_parts).
G_LINEAR = 12 * GH * GH
G_BIASES = 9 * GH
assert G_LAYER - 2 * 2 * GH - G_BIASES == G_LINEAR


def test_tied_embedding_low_precision_weights_by_hand():
    from llmplan.cost.model_states import low_precision_weights
    m = M["gpt-1.7b"]
    p1 = plan()
    # pp 1: one V x h tensor serves the embedding and the output layer, kept once; the learned positions and the
    # final LayerNorm are kept too, so only the layers' linear weights are left
    assert float(low_precision_weights(m, p1, 0)) == GL * G_LINEAR
    # pp 2: Megatron keeps the tied embedding's copy on the last stage (LanguageModule.
    # setup_embeddings_and_output_layer), so each end stage holds one and keeps it
    p2 = plan(pp=2)
    assert float(low_precision_weights(m, p2, 0)) == GL // 2 * G_LINEAR
    assert float(low_precision_weights(m, p2, 1)) == GL // 2 * G_LINEAR


def test_dualpipe_rank_of_both_ends_keeps_a_tied_embedding_once():
    # DualPipe at pp 2: each rank holds stages 0 and 1 (paired_rank_params), so a tied model's rank holds the one
    # V x h tensor once (DeepSeek-V3 report §3.2.3, shared embedding and output head); it keeps that tensor, the
    # positions, every LayerNorm (48 and the final one, 2h each) and the 24 layers' biases in bf16, and all 24
    # layers' linear weights are low precision
    from llmplan.cost.model_states import low_precision_weights
    m, p = M["gpt-1.7b"], plan(pp=2, pp_schedule="dualpipe")
    assert float(bf16_kept_params(m, p, 0).total) == GV * GH + GPOS * GH + (2 * GL + 1) * 2 * GH + GL * G_BIASES
    assert float(low_precision_weights(m, p, 0)) == GL * G_LINEAR


def test_tied_embedding_cache_counts_every_linear_weight():
    # tensorwise with fp8_params on a TN-only GPU: the cache is the fp8 transpose, 1 byte a low-precision weight
    m, p = M["gpt-1.7b"], plan()
    cache = float(low_precision_weight_cache(m, p, 0))
    assert cache == GL * G_LINEAR * 1.0


def test_zero3_copy_out_copies_the_kept_parameters_at_two_bytes():
    from llmplan.cost.overhead import zero3_copy_out_seconds
    m, gpu = M["llama-3.1-8b"], GB200.gpu
    p = plan(zero=3, zero3_copy_out=True, micro_batch=1, global_batch=64)  # 8 micro-batches a step
    P = float(rank_params(m, p, 0).total)
    kept = float(bf16_kept_params(m, p, 0).total)
    assert kept == LLAMA8B_KEPT
    # two gathers a micro-batch without a pipeline, each read and written: 2 x 8 x 2 x (1 x P + 1 x kept)
    want = 2 * 8 * 2 * (P + kept) / gpu.hbm_achieved_bytes_per_s
    assert float(zero3_copy_out_seconds(p, P, gpu, kept)) == pytest.approx(want, rel=1e-12)
    off = plan(zero=3, zero3_copy_out=True, micro_batch=1, fp8_params=False)
    assert float(zero3_copy_out_seconds(off, P, gpu, 0.0)) == pytest.approx(2 * 8 * 2 * 2 * P
                                                                              / gpu.hbm_achieved_bytes_per_s)


def test_optimizer_step_writes_the_kept_parameters_at_two_bytes():
    from llmplan.cost.compute import optimizer_step_seconds
    m, gpu, p = M["llama-3.1-8b"], GB200.gpu, plan()
    P = float(rank_params(m, p, 0).total)
    per = 2 * p.optimizer_bytes + 4 * p.grad_bytes + 1.0  # the fp8 copy written at 1 byte
    # ZeRO-1 over dp 8: each rank steps an eighth, its kept parameters' bf16 copy one byte more each
    want = (P / 8 * per + LLAMA8B_KEPT / 8 * 1.0) / gpu.hbm_achieved_bytes_per_s
    got = optimizer_step_seconds(P, p, gpu, 0.0, bf16_kept_params(m, p, 0))
    assert float(got) == pytest.approx(want, rel=1e-12)


def test_checkpoint_holds_the_kept_parameters_at_two_bytes():
    from llmplan.cost.goodput import checkpoint_job_bytes, checkpoint_rank_bytes
    from llmplan.cost.params import param_counts
    m, p = M["llama-3.1-8b"], plan()
    total = float(param_counts(m).total)
    # fp8 model copy (1) + Adam's 12 per parameter, the kept ones' copy 1 byte more (bf16)
    assert float(checkpoint_job_bytes(m, p)) == pytest.approx(total * 13 + LLAMA8B_KEPT * 1.0, rel=1e-12)
    P = float(rank_params(m, p, 0).total)
    assert float(checkpoint_rank_bytes(m, p)) == pytest.approx((P * 13 + LLAMA8B_KEPT) / 8, rel=1e-12)
    # a tied model: the embedding once, positions, the 49 LayerNorms, the 24 layers' biases
    g = M["gpt-1.7b"]
    g_kept = GV * GH + GPOS * GH + (2 * GL + 1) * 2 * GH + GL * G_BIASES
    assert float(checkpoint_job_bytes(g, p)) == pytest.approx(float(param_counts(g).total) * 13 + g_kept, rel=1e-12)
    off = plan(fp8_params=False)
    assert float(checkpoint_job_bytes(m, off)) == pytest.approx(total * 14, rel=1e-12)


def test_vectorised_zero3_and_goodput_agree_with_the_scalar_estimate():
    from llmplan.cost.goodput import plan_goodput
    from llmplan.search.evaluate import evaluate
    from llmplan.search.grid import Workload, default_space, enumerate_plans
    from llmplan.specs.resilience import CheckpointPolicy
    m, cluster = M["qwen3-30b-a3b"], ClusterSpec(system=GB200, num_nodes=4)
    w = Workload(global_batch=64, seq_len=4096, dtype="fp8", recipe="tensorwise", fp8_params=True,
                 zero3_copy_out=True)
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    ok = (i for i in range(len(plans)) if plans.plan(i).zero >= 3 and plans.plan(i).dp > 1
          and not check_plan(m, plans.plan(i), cluster))
    idx = list(islice(ok, 0, 60, 5))
    assert idx
    sub = plans.take(np.asarray(idx))
    vec = evaluate(m, cluster, sub)
    policy = CheckpointPolicy(mode="async")
    step = np.linspace(1.0, 12.0, len(idx))
    gvec = plan_goodput(m, cluster, sub, step, policy)
    for j, i in enumerate(idx):
        scalar = estimate_training(m, cluster, plans.plan(i))
        assert float(vec.step.total[j]) == pytest.approx(float(scalar.time.total), rel=1e-9)
        one = plan_goodput(m, cluster, plans.plan(i), float(step[j]), policy)
        for f in ("checkpoint_bytes", "rank_bytes", "useful"):
            v = getattr(gvec, f)
            assert float(np.asarray(v)[j] if np.ndim(v) else v) == pytest.approx(float(getattr(one, f)), rel=1e-9), f
