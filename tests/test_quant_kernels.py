"""Transformer Engine's quantisation kernels per linear, GroupedLinear and layer under each low-precision recipe
(cost.kernels.linear_quant_kernels / grouped_linear_quant_kernels; docs/formulas.md#step.quant_kernels,
docs/validation.md#quant-launches). Expected counts are read from NVIDIA/TransformerEngine at v2.16
(4220403e831d), one kernel at a time:
- csrc/quantizer.cpp: Float8Quantizer::quantize, Float8BlockQuantizer::quantize, MXFP8Quantizer::quantize each one
  nvte_quantize_v2; Float8CurrentScalingQuantizer::quantize_impl nvte_compute_amax_with_config,
  nvte_compute_scale_from_amax, nvte_quantize_v2; NVFP4Quantizer::quantize_impl (RHT on SM100, post-RHT amax)
  nvte_hadamard_transform_amax and nvte_quantize_with_hadamard_transform, without RHT (the weight)
  nvte_compute_amax_with_config and nvte_quantize_v2; the gradient's stochastic rounding adds philox_unpack
  (csrc/common.cpp: nvte_extract_seed_and_offset).
- module/linear.py _linear_forward_impl: input_quantizer(inputmat); quantize_weight with update_workspace only when
  is_first_microbatch is None or True; backward grad_output_quantizer; the wgrad GEMM uses the input's columnwise
  copy saved from the forward.
- csrc/extensions/normalization.cpp rmsnorm_fwd: delayed scaling FULLY_FUSED (the norm writes fp8), current
  scaling FUSED_NORM_AMAX_FP8 (quantize_with_amax: scale and cast), MXFP8 UNFUSED by default (norm, then quantise).
- csrc/extensions/swizzle.cpp swizzle_scales_for_gemm (MXFP8 / NVFP4 only; the inputs' and gradients' quantizers set
  optimize_for_gemm, module/linear.py _get_quantizers; the weight's do not): one swizzle per weight GEMM use.
- module/grouped_linear.py: tex.split_quantize of the input and of the output gradient; csrc/extensions/cast.cpp
  multi_tensor_quantize_impl quantises each split apart ("only have fused kernel for FP8 delayed scaling", used only
  where every output has a columnwise copy); split_quantize_nvfp4_impl_with_rht_helper: nvte_group_hadamard_transform
  _amax and nvte_group_hadamard_transform_cast_fusion over all splits.
"""

from __future__ import annotations

import pytest

from llmplan.cost import kernels as K
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models

M = builtin_models()
BASE = dict(tp=1, pp=1, ep=8, dp=8, micro_batch=1, global_batch=8, seq_len=4096)  # one micro-batch a step


def plan(**kw) -> ParallelPlan:
    return ParallelPlan(**{**BASE, **kw})


def test_bf16_and_torchao_rowwise_add_no_quantisation_kernels():
    m = M["qwen3-30b-a3b"]
    assert K.linear_quant_kernels(m, plan()) == K.ZERO
    assert K.grouped_linear_quant_kernels(m, plan(), 16) == K.ZERO
    assert K.linear_quant_kernels(m, plan(dtype="fp8", recipe="rowwise")) == K.ZERO


@pytest.mark.parametrize("kw, linear, norm_linear", [
    # (forward, backward) of a Linear and of a LayerNormLinear, one micro-batch a step (the weight cast each step)
    (dict(dtype="fp8", recipe="tensorwise", fp8_scaling="delayed"), (1 + 1, 1), (0 + 1, 1)),
    (dict(dtype="fp8", recipe="tensorwise", fp8_scaling="current"), (3 + 3, 3), (2 + 3, 3)),
    (dict(dtype="fp8", recipe="blockwise"), (1 + 1, 1), (1 + 1, 1)),
    (dict(dtype="fp8", recipe="mxfp8"), (1 + 1 + 1, 1 + 1), (1 + 1 + 1, 1 + 1)),
    (dict(dtype="fp4", recipe="nvfp4", bf16_layers_start=0), (2 + 1 + 2, 3 + 1), (2 + 1 + 2, 3 + 1)),
])
def test_linear_quantisation_kernels_by_recipe(kw, linear, norm_linear):
    m = M["qwen3-30b-a3b"]
    p = plan(**kw)
    assert tuple(K.linear_quant_kernels(m, p)) == pytest.approx(linear)
    assert tuple(K.linear_quant_kernels(m, p, norm=True)) == pytest.approx(norm_linear)


def test_weight_cast_once_a_step_and_none_for_quantised_weights():
    """is_first_microbatch: the weight is cast on the step's first micro-batch only; fp8_params (the weight a
    QuantizedTensor) not at all."""
    m = M["qwen3-30b-a3b"]
    mx = dict(dtype="fp8", recipe="mxfp8")
    one = K.linear_quant_kernels(m, plan(**mx))
    many = K.linear_quant_kernels(m, plan(**mx, global_batch=8 * 32))  # 32 micro-batches
    kept = K.linear_quant_kernels(m, plan(**mx, fp8_params=True))
    assert one.fwd - kept.fwd == pytest.approx(1)
    assert many.fwd - kept.fwd == pytest.approx(1 / 32)
    assert one.bwd == many.bwd == kept.bwd


def test_grouped_linear_quantises_each_expert_apart_except_nvfp4():
    """TE 2.16 split_quantize: one MXFP8 / blockwise / per-tensor quantisation per local expert (current scaling
    three), NVFP4's grouped amax and grouped RHT cast whatever the expert count; one multi-tensor swizzle per GEMM."""
    m = M["qwen3-30b-a3b"]
    for local in (4, 16):
        mx = K.grouped_linear_quant_kernels(m, plan(dtype="fp8", recipe="mxfp8", fp8_params=True), local)
        assert tuple(mx) == pytest.approx((local + 1, local + 1))
        cs = K.grouped_linear_quant_kernels(m, plan(dtype="fp8", fp8_scaling="current", fp8_params=True), local)
        assert tuple(cs) == pytest.approx((3 * local, 3 * local))
        fp4 = K.grouped_linear_quant_kernels(m, plan(dtype="fp4", recipe="nvfp4", fp8_params=True,
                                                     bf16_layers_start=0), local)
        assert tuple(fp4) == pytest.approx((2 + 1, 2 + 1 + 1))
    # the experts' bf16 weights: one cast each on the first micro-batch
    mx16 = K.grouped_linear_quant_kernels(m, plan(dtype="fp8", recipe="mxfp8"), 16)
    assert mx16.fwd == pytest.approx(16 + 1 + 16)


def test_bf16_layers_carry_no_quantisation_kernels():
    """NVFP4 keeps the last 15% of the layers in bf16 by default: the average layer carries that share less."""
    m = M["qwen3-30b-a3b"]
    all_fp4 = K.linear_quant_kernels(m, plan(dtype="fp4", recipe="nvfp4", bf16_layers_start=0, bf16_layers_end=0))
    default = K.linear_quant_kernels(m, plan(dtype="fp4", recipe="nvfp4"))
    share = plan(dtype="fp4", recipe="nvfp4").low_precision_layer_fraction(m.num_hidden_layers)
    assert share < 1
    assert default.fwd == pytest.approx(all_fp4.fwd * share)


def test_moe_layer_launches_grow_by_the_quantisation_kernels_only_in_low_precision():
    """Qwen3-30B-A3B at EP8 (16 local experts, per-expert GEMMs), MXFP8 weights: the MoE layer adds two
    GroupedLinears' (2 x (16 + 1) each way) and the attention's two linears' (2 x 2 each way)."""
    m = M["qwen3-30b-a3b"]
    kw = dict(expert_gemm="per-expert")
    bf16 = K.layer_kernels(m, plan(**kw), "full_attention", "moe")
    mx = K.layer_kernels(m, plan(**kw, dtype="fp8", recipe="mxfp8", fp8_params=True), "full_attention", "moe")
    assert mx.fwd - bf16.fwd == pytest.approx(2 * 17 + 2 * 2)
    assert mx.bwd - bf16.bwd == pytest.approx(2 * 17 + 2 * 2)
    # the attention's quantisation runs inside its per-layer CUDA graph: no launch of its own
    scopes = K.GRAPH_SCOPES
    bf16_l = K.layer_launches(m, plan(**kw), "full_attention", "moe", scopes)
    mx_l = K.layer_launches(m, plan(**kw, dtype="fp8", recipe="mxfp8", fp8_params=True), "full_attention", "moe",
                            scopes)
    assert mx_l.fwd - bf16_l.fwd == pytest.approx(2 * 17)


@pytest.mark.parametrize("dtype, recipe", [("fp8", "mxfp8"), ("fp4", "nvfp4")])
def test_vectorised_search_agrees_with_the_scalar_estimate_in_low_precision(dtype, recipe):
    """The quantisation kernels enter the host launches of the plan arrays as of one plan (the micro-batch
    count, which amortises the weight casts, varies across the arrays)."""
    from itertools import islice

    from agreement import assert_arrays_agree
    from llmplan.search.grid import Workload, default_space, enumerate_plans
    from llmplan.specs.check import check_plan
    from llmplan.specs.plan import ClusterSpec
    from llmplan.specs.registry import builtin_systems

    m = M["qwen3-30b-a3b"]
    cluster = ClusterSpec(system=builtin_systems()["gb200-nvl72"], num_nodes=1)
    w = Workload(global_batch=64, seq_len=4096, dtype=dtype, recipe=recipe)
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    ok = (i for i in range(len(plans)) if not check_plan(m, plans.plan(i), cluster))
    idx = list(islice(ok, 0, 84, 7))
    assert len(idx) >= 5
    assert_arrays_agree(m, cluster, plans, idx)
