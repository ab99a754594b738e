"""The legacy Megatron layer's kernels per layer and micro-batch, counted from source: megatron/model/transformer.py's
ParallelTransformerLayer (no Transformer Engine), which Megatron-LM ran from 2020 until Megatron-Core (2023) and
the Megatron-DeepSpeed forks ran for BLOOM and MT-NLG. Analysis only: llmplan prices Megatron-Core's count
(llmplan.cost.kernels.layer_launch_average) for every fused plan, and no plan field says which layer code runs, so
nothing in llmplan reads this module (moved here from llmplan.cost.kernels: docs/validation.md#legacy-kernels,
#tidy-69). Reported and priced on request by benchmarks/legacy_kernels.py; tested by tests/test_legacy_kernels.py.
Derived: docs/formulas.md#step.kernel_count
"""

from __future__ import annotations

from typing import Any

from llmplan.arith import where
from llmplan.cost.kernels import Kernels, tp_collectives
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan

# --- The legacy Megatron layer: megatron/model/transformer.py's ParallelTransformerLayer (no Transformer Engine),
# which Megatron-LM ran from 2020 until Megatron-Core (2023) and the Megatron-DeepSpeed forks ran for BLOOM and
# MT-NLG. Source: NVIDIA/Megatron-LM megatron/model/transformer.py, megatron/mpu/layers.py at d73def35a3 (2020-09)
# and 50a4b5fa02 (2021-04), megatron/core/tensor_parallel/layers.py at 285068c810 (2023-01:
# LinearWithGradAccumulationAndAsyncCommunication); bigscience-workshop/Megatron-DeepSpeed
# megatron/model/transformer.py, megatron/mpu/layers.py, megatron/model/fused_bias_gelu.py at 541b967f (2022-02).
# Counted by the rules of the Megatron-Core count above, with PyTorch's autograd for what is not a fused kernel:
# an expanded tensor's gradient is summed back to its shape (one reduction), a 16-bit parameter gradient outside
# the GEMM joins the accumulated one as grad_accumulation says.
LEGACY_NORM = Kernels(1, 2)
"""A LayerNorm module (Apex / Megatron MixedFusedLayerNorm): one kernel; backward the persistent
one-pass kernel and its gamma / beta finalisation (norm_kernel fused-one-pass)."""
LEGACY_NORM_TWO_PASS = Kernels(0, 1)
"""What the two-pass backward (norm_kernel two-pass: Apex's non-persistent FusedLayerNorm, cuComputePartGradGammaBeta,
cuComputeGradGammaBeta, then cuComputeGradInput) adds to LEGACY_NORM."""
LEGACY_QKV = Kernels(2, 4)
"""ColumnParallelLinear query_key_value with its bias (F.linear / matmul, then the bias: 2); backward the data- and
weight-gradient GEMMs, the bias gradient's sum over the tokens and the concatenation of the three split views'
gradients into mixed_x_layer's (split_tensor_along_last_dim's backward) (4)."""
LEGACY_CORE_ATTENTION = Kernels(4, 5)
"""The unfused core attention: baddbmm for the scores, FusedScaleMaskSoftmax (its fused kernel; a fallback's extra
ops are cost.elementwise.softmax_launches), bmm with the values and the context's permute(...).contiguous() (4);
backward bmm's two GEMMs, the softmax's backward and baddbmm's two GEMMs (5)."""
LEGACY_ALIBI = Kernels(1, 0)
"""ALiBi (Megatron-DeepSpeed's position_embedding_type alibi): baddbmm adds the bias tensor with beta != 0, so
the bias is copied into the result before the GEMM."""
LEGACY_DROPOUT = Kernels(1, 1)
"""torch.nn.Dropout on the attention probabilities when p > 0 (native_dropout: output and mask in one kernel),
and its backward."""
LEGACY_LINEAR = Kernels(1, 2)
"""A linear whose bias is left to the next fused op (skip_bias_add: the attention's dense, dense_h_to_4h,
dense_4h_to_h): the GEMM; backward two GEMMs."""
LEGACY_BIAS_DROPOUT_ADD = Kernels(1, 2)
"""bias_dropout_add_fused_train (TorchScript, one fused kernel) on x, the expanded bias and the residual;
backward the sum of the expanded bias's gradient over the tokens and the add where the residual stream's two
gradients meet (as RESIDUAL_ADD). A hidden dropout (p > 0) adds its mask's backward; unfused
(bias_dropout_fusion off: Megatron-LM 2020's opt-in flag) the bias add and the residual add run apart, and the
dropout as its own kernel."""
LEGACY_BIAS_GELU = Kernels(1, 2)
"""bias_gelu_impl (GeLUFunction: bias_gelu forward, bias_gelu_back backward) and, in backward, the sum of the
bias's full-size gradient (GeLUFunction returns tmp for it) to the bias's shape."""
LEGACY_BIAS_GELU_UNFUSED = Kernels(1, 0)
"""What bias_gelu_fusion off adds to LEGACY_BIAS_GELU: activation_func(x + bias) runs the add as its own kernel
before F.gelu (Megatron-LM 19301985dd megatron/model/transformer.py ParallelMLP.forward without the opt-in
--bias-gelu-fusion); backward the same kernels (gelu's backward, the bias gradient's sum; the add passes the
gradient through)."""


def legacy_accumulation_adds(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Backward kernels per layer and micro-batch that join a legacy layer's parameter gradients (4 weights, 4
    biases, the norms' weights and biases) to the accumulated ones (ParallelPlan.grad_accumulation): fused, the
    weights' in the GEMM (Megatron-LM's gradient_accumulation_fusion, wgrad_gemm_accum_fp32) and one add for each
    other parameter (DDP's main_grad.add_ hook); add (and copy), one add for every parameter; cast-add, a cast and
    an add for every parameter (DeepSpeed's BF16_Optimizer update_hp_grads after each pipeline backward:
    hp_grad.add_(lp.grad.to(fp32)); deepspeedai/DeepSpeed deepspeed/runtime/bf16_optimizer.py and pipe/engine.py
    at 56c522386)."""
    weights, other = 4, 4 + 2 * (2 if m.norm_type == "layernorm" else 1)
    per = {"fused": other, "add": weights + other, "copy": weights + other, "cast-add": 2 * (weights + other)}
    return per[plan.grad_accumulation]


def legacy_tp_kernels(plan: ParallelPlan) -> Kernels:
    """The legacy layer's tensor-parallel collectives at tp > 1: without sequence parallelism one all-reduce per
    block each way (the row-parallel output's in forward, the column-parallel input gradient's in backward); with
    it an all-gather and a reduce-scatter per block forward, and backward the column-parallel linear's all-gather
    of its input again (for the weight gradient) and reduce-scatter of its input gradient, and the row-parallel's
    all-gather of the output gradient (3): the attention's and the MLP's, each as Megatron-Core's block
    (llmplan.cost.kernels.tp_collectives).
    Source: NVIDIA/Megatron-LM megatron/core/tensor_parallel/layers.py
    (LinearWithGradAccumulationAndAsyncCommunication) and mappings.py at 285068c810."""
    return tp_collectives(plan).times(2)


def legacy_layer_kernels(m: ModelSpec, plan: ParallelPlan) -> Kernels:
    """Kernels of one dense GELU layer of the legacy Megatron ParallelTransformerLayer, one micro-batch (every
    linear biased, as that layer always builds them): two norms, the QKV linear, the unfused core attention (its
    dropout when the model has one; ALiBi's bias copy for a model without learned positions, which among the
    legacy stacks' runs is BLOOM), the dense projection, two bias-dropout-adds, the bias-GeLU MLP, the TP
    collectives and the gradients' accumulation (legacy_accumulation_adds); with bias_gelu_fusion off (Megatron-LM
    2020's default) the bias add before F.gelu as its own forward kernel (LEGACY_BIAS_GELU_UNFUSED). Not priced:
    the plan does not say which layer code runs (docs/validation.md#legacy-kernels)."""
    d_att, d_hid = int(m.attention_dropout > 0), int(m.hidden_dropout > 0)
    norms = LEGACY_NORM.times(2) + Kernels(0, 2 * where(plan.norm_kernel == "two-pass", LEGACY_NORM_TWO_PASS.bwd, 0))
    core = LEGACY_CORE_ATTENTION + LEGACY_DROPOUT.times(d_att)
    if not m.learned_position_embeddings:
        core = core + LEGACY_ALIBI
    unfused = where(plan.bias_dropout_fusion, 0, 1 + d_hid)  # bias add, dropout, residual add apart
    bda = (LEGACY_BIAS_DROPOUT_ADD + Kernels(unfused, d_hid)).times(2)
    gelu = LEGACY_BIAS_GELU + LEGACY_BIAS_GELU_UNFUSED.times(where(plan.bias_gelu_fusion, 0, 1))
    k = norms + LEGACY_QKV + core + LEGACY_LINEAR.times(3) + bda + gelu + legacy_tp_kernels(plan)
    return Kernels(k.fwd, k.bwd + legacy_accumulation_adds(m, plan))
