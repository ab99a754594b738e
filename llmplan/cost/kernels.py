"""Kernels one rank's GPU runs per micro-batch and per training step, counted structurally per layer kind from the
modules Megatron-Core runs with Transformer Engine (fused kernels), forward and backward apart; and how many of
them the host launches when CUDA graphs replay some scopes (a graphed scope's kernels still run, but the host
issues the scope as one graph launch a pass).

Every count below is a (forward, backward) pair of kernels per micro-batch, read along the module's forward in
the cited source and along the autograd backward it implies: a GEMM's backward is its data-gradient and weight-
gradient GEMMs (Transformer Engine accumulates the weight gradient into main_grad in the GEMM,
gradient_accumulation_fusion); a parameter outside Transformer Engine's linears (norm weights, conv, router,
torch.grouped_mm experts, gates) gets one more add into main_grad from Megatron-Core's DDP post-hook; a tensor that
feeds two branches gets one add in backward. Views, reshapes, host copies and memsets are not kernels.
Reported by benchmarks/kernel_count.py (docs/validation.md#kernel-count); cost.overhead.host_seconds prices a fused
plan's host launches from layer_launch_average. Works on one ParallelPlan and, elementwise, on plan arrays.
The legacy Megatron layer (megatron/model/transformer.py, no Transformer Engine) is counted the same way in
benchmarks/legacy_layer.py: reported, not priced (docs/validation.md#legacy-kernels, #tidy-69).
Derived: docs/formulas.md#step.kernel_count
"""

from __future__ import annotations

from typing import Any, NamedTuple

from llmplan.arith import where
from llmplan.cost.overhead import CP_STEP_KERNELS
from llmplan.cost.quantize import torchao_float8
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.rule import as_bool


class Kernels(NamedTuple):
    """Kernels per micro-batch of one module: forward, backward."""

    fwd: Any
    bwd: Any

    def __add__(self, other: Any) -> Kernels:  # type: ignore[override]
        return Kernels(self.fwd + other.fwd, self.bwd + other.bwd)

    def times(self, n: Any) -> Kernels:
        return Kernels(self.fwd * n, self.bwd * n)

    @property
    def total(self) -> Any:
        return self.fwd + self.bwd


ZERO = Kernels(0, 0)

# --- The layer's shell. Source: NVIDIA/Megatron-LM megatron/core/transformer/transformer_layer.py and
# megatron/core/fusions/fused_bias_dropout.py at 606c01046 (TransformerLayer._forward_attention / _forward_mlp,
# _bias_dropout_add_func: no bias, dropout 0, so residual + out).
RESIDUAL_ADD = Kernels(1, 1)
"""One bias-dropout-add (the residual add; forward 1) and, in backward, the add of the residual stream's two
gradients (the branch's input gradient and the skip path's). Two per layer."""
PRE_MLP_NORM = Kernels(1, 3)
"""The MoE block's separate pre-MLP RMSNorm (TENorm: the dense MLP fuses it into its first linear): the norm
kernel; backward the norm's data-gradient kernel, its gamma-gradient reduction and the weight's main_grad add."""

# --- Attention. Source: NVIDIA/Megatron-LM megatron/core/transformer/attention.py at 606c01046
# (SelfAttention.get_query_key_value_tensors, Attention.forward, _apply_output_gate), Transformer Engine
# LayerNormLinear / Linear / DotProductAttention (FusedAttention, cuDNN), fused RoPE (apply_rope_fusion).
QKV_PROJECTION = Kernels(2, 5)
"""linear_qkv with the input RMSNorm fused (TELayerNormColumnParallelLinear): the norm and the GEMM; backward the
data- and weight-gradient GEMMs, the norm's two kernels and the norm weight's main_grad add."""
QKV_SPLIT = Kernels(1, 1)
"""The query's reshape out of the grouped [q, k, v] split (not contiguous: a copy); backward the concatenation of
the pieces' gradients into mixed_qkv's gradient (the split's backward)."""
QK_NORM = Kernels(3, 6)
"""q_layernorm and k_layernorm (TENorm; the key, a strided slice, copied first): 3; backward two kernels per norm
and two main_grad adds."""
ROTARY = Kernels(2, 2)
"""Fused RoPE on the query and on the key, forward and backward."""
CORE_ATTENTION = Kernels(3, 3)
"""TE FusedAttention (cuDNN): the value's copy out of the strided split, the RNG-state kernel TE launches with
every fused-attention forward, the attention kernel; backward cuDNN's three (dO.O, the attention backward, the
dQ conversion)."""
OUTPUT_GATE = Kernels(1, 1)
"""Gated attention (attention_output_gate): x * sigmoid(gate), one compiled kernel (jit_fuser), and its backward."""
PROJECTION = Kernels(1, 2)
"""A row-parallel linear (TERowParallelLinear): the GEMM; backward data- and weight-gradient GEMMs."""

# --- Gated DeltaNet, on the path the Qwen3.5 H100 card runs. Source: NVIDIA/Megatron-LM
# megatron/core/ssm/gated_delta_net/gdn.py and megatron/core/fusions/fused_pre_gated_delta_rule.py at 606c01046
# (gdn_pre_gated_delta_rule_fusion: _triton_pre_gated_delta_rule_forward / _backward); QwenLM/FlashQLA
# flash_qla/ops/gated_delta_rule/chunk/__init__.py and cp_context.py at 1563fbd / 0808864
# (chunk_gated_delta_rule_fwd / _bwd, intra_card_cp_preprocess[_bwd]); NVIDIA-NeMo/Megatron-Bridge
# src/megatron/bridge/models/qwen/modeling_qwen35/runtime_patch.py at 7e4a6d11e (fla rms_norm_gated).
GDN_IN_PROJECTION = QKV_PROJECTION
"""in_proj with the input RMSNorm fused: as linear_qkv."""
GDN_PRE_RULE = Kernels(4, 13)
"""The fused pre-rule front end: conv+SiLU+l2norm projections of q/k and of v, the gate copy, g and beta (4);
backward the q/k l2norm-repeat, v layout, gate layout and g/beta kernels (with its zeroing of the parameter
gradients), causal_conv1d's backward (2), three casts of the parameter gradients and the main_grad adds of
conv1d.weight, A_log and dt_bias (3)."""
GDN_CHUNK_RULE = Kernels(6, 8)
"""FlashQLA's chunked gated delta rule on SM90 with intra-card context parallelism (on for one 4,096-token
sequence of 32 value heads: Be x H <= 40): chunk cumsum, kkt_solve, the warm-up chunks, the warm-up states, the
initial-state correction, the fused forward (6); backward the state kernel, the fused backward, the dh warm-up,
the mt cast, the terminal-state correction, the two grouped reductions of dq and dk (value heads twice the key
heads), the reverse cumsum (8)."""
GDN_GATED_NORM = Kernels(2, 3)
"""The output RMSNorm with its SiLU gate (FLA rms_norm_gated) and the weight + 1 of the zero-centred gamma;
backward the norm's kernel, its weight-gradient reduction and the main_grad add."""
GDN_OUT_TRANSPOSE = Kernels(1, 1)
"""The output's transpose back to [s, b, h] (contiguous), and its gradient's."""

# --- MoE. Source: NVIDIA/Megatron-LM megatron/core/transformer/moe/ (moe_layer.py MoELayer.forward, router.py
# TopKRouter.forward / routing / _apply_aux_loss, moe_utils.py RouterGatingLinearFunction, RandomSTE,
# get_tokens_per_expert_and_token_count, MoEAuxLossAutoScaler, shared_experts.py, token_dispatcher.py
# MoEFlexTokenDispatcher / _HybridEPManager, experts.py TEGroupedMLP) at 606c01046; the router's two paths
# (moe_router_fusion on and off) at d98e8a6 (router.py TopKRouter.routing, moe_utils.py
# topk_routing_with_score_function, compute_routing_scores_for_aux_loss, switch_load_balancing_loss_func: each
# takes fused=config.moe_router_fusion); NVIDIA/TransformerEngine pytorch/router.py at d0067d0 (one forward and
# one backward kernel each of fused_topk_with_score_function, fused_compute_score_for_moe_aux_loss,
# fused_moe_aux_loss).
ROUTER_FUSED = Kernels(2, 8)
"""The router with moe_router_fusion, without an auxiliary loss: the gating GEMM (TE general_gemm, fp32 out) and
the fused score function with top-k (2); backward the fused top-k's backward, the gating's backward
(RouterGatingLinearFunction.backward: the weight's and the input's casts to fp32, two GEMMs, the two gradients'
casts back: 6) and the router weight's main_grad add (8)."""
ROUTER_AUX_FUSED = Kernels(5, 5)
"""What the auxiliary loss adds to ROUTER_FUSED: the fused scores for the loss, the token counts
(routing_map.sum), the fused loss and its two tracker updates (5); backward the auto-scaler's ones and product
(2), the fused loss's and the fused scores' backwards (2) and the sum of the logits' two gradients (5)."""
ROUTER = ROUTER_FUSED + ROUTER_AUX_FUSED
"""The fused router with an auxiliary loss: 7 forward, 13 backward."""
ROUTER_UNFUSED = Kernels(9, 11)
"""The router without moe_router_fusion and without an auxiliary loss, on the path of a softmax after top-k
(topk_routing_with_score_function, fused=False): the gating GEMM, torch.topk over the logits, the softmax of
the k scores, the routing probs (zeros_like and scatter: 2) and the routing map (zeros_like, .int(), scatter,
.bool(): 4) (9); backward the probs' scatter (a gather), the softmax's backward, torch.topk's (zeros and
scatter: 2), the gating's 6 and the main_grad add (11). torch.topk counted as one launch: its multi-block radix
passes are priced as time by cost.moe_kernels. A sigmoid score function or an expert bias adds a few
elementwise ops, not counted."""
ROUTER_AUX_UNFUSED = Kernels(13, 6)
"""What the auxiliary loss adds to ROUTER_UNFUSED (compute_routing_scores_for_aux_loss and
switch_load_balancing_loss_func, fused=False): the scores' softmax, torch.topk, the map (zeros_like, .int(),
scatter, .bool(): 4), the token counts, the loss (probs.sum over tokens, the product with the counts, its sum,
the coefficient's scale: 4) and the two tracker updates (13); backward the auto-scaler's ones and product (2),
the loss's two products' backwards (2), the scores' softmax backward and the sum of the logits' two gradients
(6). seq_aux_loss reshapes the scores per sequence first: views, counted the same."""


def aux_loss_on(m: ModelSpec) -> bool:
    """Whether the model trains with an auxiliary load-balancing loss, so that the router computes it every MoE
    layer's forward: unless the spec's router_aux_loss_coef is 0 (Megatron-Core computes it only with a
    coefficient above 0: router.py is_aux_loss_enabled at d98e8a6; a spec without a coefficient is exported with
    export.megatron.AUX_LOSS_COEFF_DEFAULT). Derived: docs/formulas.md#moe.router_fusion"""
    return m.router_aux_loss_coef != 0


def router_host_ops(m: ModelSpec, plan: ParallelPlan) -> int:
    """Eager operators one MoE layer's router forward issues beyond the fused router with an auxiliary loss
    (ROUTER's 7 kernels, the router cost.moe.MOE_CYCLE_HOST_OPS counts): one operator a kernel, negative for a
    fused router without the loss. Derived: docs/formulas.md#moe.router_fusion"""
    return int(router_kernels(m, plan).fwd - ROUTER.fwd)


def router_kernels(m: ModelSpec, plan: ParallelPlan) -> Kernels:
    """Kernels of one MoE layer's router: fused (plan.moe_router_fusion) or eager, with the auxiliary loss's
    where the model trains with one (aux_loss_on). Derived: docs/formulas.md#moe.router_fusion"""
    fused = plan.moe_router_fusion
    base = ROUTER_FUSED if fused else ROUTER_UNFUSED
    return base + (ROUTER_AUX_FUSED if fused else ROUTER_AUX_UNFUSED) if aux_loss_on(m) else base


FORCE_BALANCE = Kernels(2, 0)
"""moe_router_force_load_balancing (the benchmark recipes): RandomSTE's clone and normal_."""
MOE_INPUT_FANOUT = Kernels(0, 1)
"""The MoE input feeds the router and the dispatcher: one gradient add."""
HYBRIDEP_DISPATCH = Kernels(5, 2)
"""Hybrid-EP dispatch_with_permute: the routing map's all-gather, the metadata kernel, the permute preprocessing,
the dispatch kernel, the permute kernel; backward the combine-with-unpermute's two. Source: deepseek-ai/DeepEP
hybrid-ep docs (Hybrid-EP Implementation Guide, 5. Executor: metadata_preprocess = allgather + metadata kernel
+ permute preprocessing; dispatch_with_permute = dispatch + permute kernel; combine_with_unpermute = unpermute +
combine kernel; fused mode: one kernel each)."""
HYBRIDEP_COMBINE = Kernels(2, 2)
"""Hybrid-EP combine_with_unpermute: unpermute and combine; backward the dispatch's dispatch and permute."""
HYBRIDEP_FUSED_SAVING = Kernels(2, 2)
"""Kernels fewer when the permute runs inside the dispatch kernel and the unpermute inside the combine
(moe_permute_fusion_into_hybridep)."""
HYBRIDEP_COUNTS = Kernels(2, 0)
"""The expert counts' cast to int64 and their sum (num_permuted_tokens) after a blocking dispatch."""
HYBRIDEP_STATIC = Kernels(5, 0)
"""A static rank capacity (moe_expert_rank_capacity_factor): the counts' cast, the overflow flag's compare and
or, and the Qwen3.5 H100 runtime's overflow assertion (~flag, _assert_async)."""
ALLTOALL_DISPATCH = Kernels(8, 6)
"""Megatron's alltoall dispatcher: the token counts and their gather over the EP group, the permute, the two
all-to-alls, the sort by local expert and its inverse, the unpermute; backward the two all-to-alls, the permute
and unpermute backwards and the two sorts'."""
DEEPEP_DISPATCH = Kernels(6, 4)
"""DeepEP's normal kernels (flex dispatcher, deepep backend): the dispatch layout, the notify, the dispatch, the
permute, the combine, the unpermute; backward the dispatch and combine and the two permutes'."""
GROUPED_EXPERTS = Kernels(4, 8)
"""Routed experts as one grouped kernel per matmul (torch.grouped_mm on GPU offsets): the offsets' cumsum, fc1,
the weighted SwiGLU (compiled), fc2; backward each grouped matmul's two, the weighted SwiGLU's two (input and
probability gradients) and the two stacked weights' main_grad adds. Source: Megatron-Bridge runtime_patch.py at
7e4a6d11e (_Qwen35H100TorchGroupedMLP.forward), Megatron-LM fusions/fused_bias_swiglu.py (weighted_swiglu_back)."""
PER_EXPERT_ACTIVATION = Kernels(1, 2)
"""TEGroupedMLP's fused weighted SwiGLU between its GroupedLinear layers (one cuBLAS GEMM per local expert, four
per expert in backward with the weight gradients accumulated in place)."""
SHARED_EXPERT = Kernels(4, 6)
"""The shared expert: fc1, the fused SwiGLU, fc2, the add into the routed output; backward fc2's and fc1's two
GEMMs, the SwiGLU's and the add of its input gradient to the routed path's."""
SHARED_EXPERT_GATE = Kernels(3, 8)
"""The shared expert's sigmoid gate (Qwen2-MoE style): the gate's GEMM, the sigmoid, the product; backward the
product's gradient and the gate score's (a product and a reduction), the sigmoid's, the gate's two GEMMs, its
weight's main_grad add and the add of its input gradient."""

# --- Dense MLP (TELayerNormColumnParallelLinear fc1, bias_swiglu / bias_gelu, TERowParallelLinear fc2).
DENSE_MLP = Kernels(4, 8)
"""fc1 with the pre-MLP norm fused (2), the fused activation, fc2; backward fc2's two, the activation's, fc1's
two, the norm's two and its weight's main_grad add."""

# --- Multi-token prediction and the head. Source: NVIDIA/Megatron-LM
# megatron/core/transformer/multi_token_prediction.py at 606c01046 (MultiTokenPredictionLayer._get_embeddings,
# _concat_embeddings, _postprocess, process_mtp_loss, roll_tensor), megatron/core/models/gpt/gpt_model.py.
MTP_EXTRA = Kernels(47, 25)
"""One MTP module beyond its transformer layer: the rolls of the input ids and positions (roll, fill, sum: 6),
the embedding and its transpose (2), enorm and hnorm (2), the concatenation and eh_proj (2), the final norm (1),
the block's concatenation of the hidden states (1), the labels' clone and the token count (2), the output GEMM
(1), the rolls of labels and loss mask (6), the cross-entropy (6), the masked loss (1), the logged loss (6), the
acceptance counts (5), the tracker (2) and the loss scaling (3); backward the auto-scaler (2), the cross-entropy
(4), the output GEMM (2), three norms (9), eh_proj (2), the embedding's backward (5) and the add into the main
stack's last hidden state (1)."""
HEAD = Kernels(20, 18)
"""The embedding (lookup and transpose), the final norm, the output GEMM, the fused vocabulary-parallel
cross-entropy (6) and the loss function's mask, sums and report (10); backward the embedding's backward (5), the
final norm (3), the output GEMM (2), the cross-entropy (4, with its two BF16 conversions), the loss (2) and the
auxiliary and MTP loss scales (2)."""

# --- Low-precision quantisation: the kernels Transformer Engine adds to a linear's forward and backward under an
# fp8 / fp4 recipe (none in bf16). Source: NVIDIA/TransformerEngine at v2.16 (4220403e831d), transformer_engine/
# pytorch/module/linear.py (_linear_forward_impl: input_quantizer(inputmat), quantize_weight with update_workspace
# only on the first micro-batch; backward: grad_output_quantizer, the input's columnwise copy saved from the
# forward's cast), module/layernorm_linear.py, module/grouped_linear.py (_GroupedLinear.forward / backward:
# tex.split_quantize of the input and of the output gradient, quantize_weight per expert), csrc/quantizer.cpp
# (Float8Quantizer / Float8BlockQuantizer / MXFP8Quantizer::quantize: one nvte_quantize_v2;
# Float8CurrentScalingQuantizer::quantize_impl: amax, scale, cast; NVFP4Quantizer::quantize_impl: amax (post-RHT
# Hadamard amax) and the cast, fused with the RHT on SM100), csrc/common.cpp (philox_unpack: the stochastic-
# rounding RNG state kernel), csrc/extensions/cast.cpp (split_quantize -> multi_tensor_quantize_impl: "only have
# fused kernel for FP8 delayed scaling", else one quantize per split; split_quantize_nvfp4_impl: grouped amax and
# grouped RHT cast), csrc/extensions/normalization.cpp (rmsnorm_fwd: FULLY_FUSED for delayed scaling,
# FUSED_NORM_AMAX_FP8 for current scaling, UNFUSED norm-then-quantize for MXFP8 without NVTE_NORM_FWD_USE_CUDNN,
# NVFP4 with post-RHT amax and blockwise), csrc/extensions/swizzle.cpp and gemm.cpp (swizzle_scales_for_gemm: an
# MXFP8 / NVFP4 operand whose scales are not GEMM-swizzled is swizzled before each GEMM; the inputs' and output
# gradients' quantizers set optimize_for_gemm, the weights' do not).
QUANTIZE_KERNELS = {"delayed": 1, "current": 3, "blockwise": 1, "mxfp8": 1, "nvfp4": 2}
"""Kernels of one tensor's quantisation: delayed scaling's cast (its amax a side output; the transpose in the
same kernel), current scaling's amax, scale and cast, the blockwise and MXFP8 casts (row- and columnwise in one),
NVFP4's amax and cast (the Hadamard amax and the fused RHT cast for an activation or a gradient)."""
NVFP4_GRAD_RNG = 1
"""The stochastic-rounding RNG state kernel (nvte_extract_seed_and_offset) before each NVFP4 output-gradient
quantisation (fp4_quant_bwd_grad: stochastic_rounding)."""
NORM_FUSED_CAST = {"delayed": 1, "current": 1}
"""Kernels of the input's quantisation a LayerNormLinear's norm kernel does itself: delayed scaling's cast
(FULLY_FUSED), current scaling's amax (FUSED_NORM_AMAX_FP8; the scale and the cast remain)."""
SCALE_SWIZZLE = {"mxfp8": 1, "nvfp4": 1}
"""Swizzles of the weight's block scales before its forward and its data-gradient GEMM (one multi-tensor kernel
for a GroupedLinear's experts); the per-tensor and blockwise formats need none."""
NVFP4_GROUPED_INPUT = 2
"""An NVFP4 GroupedLinear input's split quantisation: the grouped Hadamard amax and the grouped RHT cast over
all experts (split_quantize_nvfp4_impl_with_rht_helper), whatever the expert count."""


def quant_recipe(plan: ParallelPlan) -> str | None:
    """The QUANTIZE_KERNELS key of the plan's recipe: None in bf16 / fp16 / fp32 and for torchao's rowwise
    recipe (not Transformer Engine's: its casts are not counted); delayed or current for tensorwise."""
    if not plan.low_precision or plan.recipe == "rowwise":
        return None
    return plan.fp8_scaling if plan.recipe == "tensorwise" else plan.recipe


def _weight_casts(plan: ParallelPlan, key: str, weights: Any) -> Any:
    """Weight quantisation kernels per micro-batch of `weights` weights: one quantisation each on the step's first
    micro-batch (is_first_microbatch; cached after), none where the weights are kept quantised (fp8_params).
    torchao's Float8Linear (torchao_float8) caches nothing: one each micro-batch (and one more in backward,
    linear_quant_kernels). Derived: docs/formulas.md#precision.torchao_weight_casts"""
    per_step = 1 if torchao_float8(plan) else plan.num_microbatches
    return where(plan.fp8_params, 0.0, QUANTIZE_KERNELS[key] * weights / per_step)


def linear_quant_kernels(m: ModelSpec, plan: ParallelPlan, norm: bool = False, weights: int = 1) -> Kernels:
    """Quantisation kernels of one Transformer Engine Linear (LayerNormLinear with `norm`), one micro-batch:
    forward the input's quantisation (less what the norm fuses), the weight's scale swizzle and its cast on the
    first micro-batch; backward the output gradient's quantisation (with NVFP4's RNG state) and the weight's
    swizzle; times the share of layers in the low format. Under torchao (torchao_float8) the linear stands for
    `weights` Float8Linears reading one input, each casting its weight in every micro-batch's forward and again
    for the input-gradient GEMM (cast_config_weight_for_grad_input). Derived: docs/formulas.md#step.quant_kernels,
    docs/formulas.md#precision.torchao_weight_casts"""
    key = quant_recipe(plan)
    if key is None:
        return ZERO
    q, swz = QUANTIZE_KERNELS[key], SCALE_SWIZZLE.get(key, 0)
    torchao = torchao_float8(plan)
    fwd = q - (NORM_FUSED_CAST.get(key, 0) if norm else 0) + swz + _weight_casts(plan, key, weights if torchao else 1)
    bwd = q + (NVFP4_GRAD_RNG if key == "nvfp4" else 0) + swz + (_weight_casts(plan, key, weights) if torchao else 0)
    share = plan.low_precision_layer_fraction(m.num_hidden_layers)
    return Kernels(fwd * share, bwd * share)


def grouped_linear_quant_kernels(m: ModelSpec, plan: ParallelPlan, local: Any) -> Kernels:
    """Quantisation kernels of one GroupedLinear over `local` experts, one micro-batch: TE's split_quantize of
    the input (forward) and of the output gradient (backward), one quantisation per expert (NVFP4: the grouped
    kernels, NVFP4_GROUPED_INPUT, and one RNG state for the gradient), the experts' weight-scale swizzle (one
    multi-tensor kernel per GEMM) and each expert's weight cast on the first micro-batch.
    Derived: docs/formulas.md#step.quant_kernels"""
    key = quant_recipe(plan)
    if key is None:
        return ZERO
    swz = SCALE_SWIZZLE.get(key, 0)
    split_in = NVFP4_GROUPED_INPUT if key == "nvfp4" else QUANTIZE_KERNELS[key] * local
    split_grad = NVFP4_GROUPED_INPUT + NVFP4_GRAD_RNG if key == "nvfp4" else QUANTIZE_KERNELS[key] * local
    share = plan.low_precision_layer_fraction(m.num_hidden_layers)
    fwd = split_in + swz + _weight_casts(plan, key, local)
    return Kernels(fwd * share, (split_grad + swz) * share)


def projections_quant_kernels(m: ModelSpec, plan: ParallelPlan, torchao_weights: int = 2) -> Kernels:
    """A block's two TE linears, the first with its norm fused (LayerNormLinear QKV / in_proj / fc1) and the
    second plain (the output projection / out_proj / fc2); under torchao `torchao_weights` Float8Linears in all
    (wq, wk, wv, wo: 4; w1, w3, w2: 3 gated), the first's input shared by all but the last."""
    return linear_quant_kernels(m, plan, norm=True, weights=torchao_weights - 1) + linear_quant_kernels(m, plan)


def _mlp_weights(m: ModelSpec) -> int:
    """Linears of a dense MLP as torchtitan builds it: w1, w3 and w2 gated, two plain."""
    return 3 if m.gated_mlp else 2


GRAPH_IO = Kernels(1, 1)
"""Per graphed scope and micro-batch: the copy of the input into the graph's static input buffer before the
forward replay and of the output gradient into its static buffer before the backward replay. Source:
NVIDIA/TransformerEngine transformer_engine/pytorch/graph.py (make_graphed_callables: Graphed.forward /
backward copy_ into the static surfaces, then replay)."""

GRAPH_SCOPES = ("attn", "mlp", "moe_router", "moe_preprocess")
"""Megatron-Core's per-layer CUDA graph scopes llmplan's cuda_graphs "layers" may stand for (attn mlp for a dense
layer, attn moe_router moe_preprocess for a MoE layer); graph_scopes picks a model's and plan's."""


def graph_scopes(m: ModelSpec, router: bool) -> tuple[str, ...]:
    """The per-layer CUDA graph modules of cuda_graphs "layers" (TransformerConfig.cuda_graph_modules), the one rule
    that pricing (layer_launch_average) and the Megatron-LM / Megatron-Bridge exports read: attn always; mlp where
    the model has dense MLP layers that Megatron-Core lets it graph (a model without experts, or one whose
    moe_layer_freq lists dense layers, as the export writes for a non-hybrid model: TransformerConfig asserts "mlp
    cuda graph is only supported for dense layers" when moe_layer_freq is 1 or lists no 0); moe_router and
    moe_preprocess on a MoE model when `router` (False under recompute module moe, which TransformerConfig refuses
    beside a graphed moe_router; moe_preprocess needs moe_router). Source: NVIDIA/Megatron-LM
    megatron/core/transformer/transformer_config.py at d98e8a6 (__post_init__, cuda_graph_modules checks; the
    same at cd4afffa6)."""
    mlp = not m.is_moe or (not m.is_hybrid and "dense" in mlp_types(m))
    return ("attn",) + (("mlp",) if mlp else ()) + (("moe_router", "moe_preprocess") if m.is_moe and router else ())


def tp_collectives(plan: ParallelPlan) -> Kernels:
    """The tensor-parallel collectives of one block (a column-parallel linear into a row-parallel one) at
    tp > 1. Without sequence parallelism one all-reduce each way: the row-parallel output's forward, the
    column-parallel input gradient's backward (1, 1). With it the column-parallel input's all-gather and the
    row-parallel output's reduce-scatter forward (2); backward the column-parallel input's all-gather again for
    the weight gradient (backward_input_needs_gather), the reduce-scatter of its input gradient and the
    row-parallel output gradient's all-gather (grad_output_preprocess) (3). The norms and dropouts then run on
    s / tp rows: the same launches. Userbuffer overlap (tp_comm_overlap) counted as this path, not itemised.
    Source: NVIDIA/TransformerEngine transformer_engine/pytorch/module/linear.py, layernorm_linear.py and
    base.py at d0067d0, as Megatron-Core's TE wrappers call them (sequence_parallel=config.sequence_parallel,
    parallel_mode column / row: megatron/core/extensions/transformer_engine.py at 606c01046)."""
    on = plan.tp > 1
    return Kernels(where(on, where(plan.sp, 2, 1), 0), where(on, where(plan.sp, 3, 1), 0))


def attention_kernels(m: ModelSpec, plan: ParallelPlan) -> Kernels:
    """Kernels of one softmax-attention mixer (Megatron SelfAttention on Transformer Engine): the attention
    kernel becomes CP_STEP_KERNELS per ring step under context parallelism (forward and backward alike). MLA,
    DSA, sliding and chunked attention are counted as this module (not itemised apart).
    Derived: docs/formulas.md#step.kernel_count"""
    k = QKV_PROJECTION + QKV_SPLIT + ROTARY + CORE_ATTENTION + PROJECTION + tp_collectives(plan)
    k = k + projections_quant_kernels(m, plan, torchao_weights=4)  # torchtitan's wq, wk, wv, wo
    if m.qk_norm:
        k = k + QK_NORM
    if m.attention_output_gate:
        k = k + OUTPUT_GATE
    ring = where(plan.cp > 1, CP_STEP_KERNELS * plan.cp - 1, 0)
    return k + Kernels(ring, ring)


def gdn_kernels(m: ModelSpec, plan: ParallelPlan) -> Kernels:
    """Kernels of one Gated DeltaNet mixer on the fused pre-rule, FlashQLA and fused gated-norm path.
    Derived: docs/formulas.md#step.kernel_count"""
    return (GDN_IN_PROJECTION + GDN_PRE_RULE + GDN_CHUNK_RULE + GDN_GATED_NORM + GDN_OUT_TRANSPOSE + PROJECTION
            + tp_collectives(plan) + projections_quant_kernels(m, plan))


def mixer_kernels(m: ModelSpec, plan: ParallelPlan, kind: str) -> Kernels:
    """Kernels of one layer's mixer of `kind`: linear_attention (Gated DeltaNet) as gdn_kernels, none as none,
    every other kind (attention, Mamba-2) as attention_kernels (Mamba-2 not itemised)."""
    if kind == "linear_attention":
        return gdn_kernels(m, plan)
    if kind == "none":
        return ZERO
    return attention_kernels(m, plan)


def dispatcher_kernels(plan: ParallelPlan, static_capacity: bool = False, fused_permute: bool = False) -> Kernels:
    """Kernels of one MoE layer's token dispatch and combine: Megatron's alltoall dispatcher, DeepEP's normal
    kernels, or Hybrid-EP (flex dispatcher, hybridep backend) with a blocking dispatch or a static rank capacity
    (`static_capacity`) and the permute in or beside its kernels (`fused_permute`). Derived:
    docs/formulas.md#step.kernel_count"""
    hybrid = HYBRIDEP_DISPATCH + HYBRIDEP_COMBINE + (HYBRIDEP_STATIC if static_capacity else HYBRIDEP_COUNTS)
    if fused_permute:
        hybrid = Kernels(hybrid.fwd - HYBRIDEP_FUSED_SAVING.fwd, hybrid.bwd - HYBRIDEP_FUSED_SAVING.bwd)
    flex = plan.moe_dispatcher == "deepep"
    is_hybrid = flex & (plan.moe_flex_backend == "hybridep")
    fwd = where(is_hybrid, hybrid.fwd, where(flex, DEEPEP_DISPATCH.fwd, ALLTOALL_DISPATCH.fwd))
    bwd = where(is_hybrid, hybrid.bwd, where(flex, DEEPEP_DISPATCH.bwd, ALLTOALL_DISPATCH.bwd))
    return Kernels(fwd, bwd)


def experts_kernels(m: ModelSpec, plan: ParallelPlan) -> Kernels:
    """Kernels of the routed experts of one MoE layer: grouped (GROUPED_EXPERTS) or, where they run per expert
    (cost.compute.runs_per_expert: TEGroupedMLP's GroupedLinear), one GEMM per local expert and matmul forward,
    two in backward, around the fused weighted SwiGLU; under an fp8 / fp4 recipe each GroupedLinear's
    quantisation kernels (grouped_linear_quant_kernels), the grouped path's as one Linear's.
    Derived: docs/formulas.md#step.kernel_count, #step.quant_kernels"""
    from llmplan.cost.compute import runs_per_expert

    local = m.num_experts / plan.ep
    quant = grouped_linear_quant_kernels(m, plan, local).times(2)  # fc1 and fc2 under an fp8 / fp4 recipe
    per_expert = PER_EXPERT_ACTIVATION + Kernels(2 * local, 4 * local) + quant
    grouped = GROUPED_EXPERTS + linear_quant_kernels(m, plan).times(2)
    per = runs_per_expert(plan)
    return Kernels(where(per, per_expert.fwd, grouped.fwd), where(per, per_expert.bwd, grouped.bwd))


def moe_kernels(m: ModelSpec, plan: ParallelPlan, static_capacity: bool = False, fused_permute: bool = False,
                force_balance: bool = False) -> Kernels:
    """Kernels of one MoE block: the pre-MLP norm, the router (with RandomSTE under `force_balance`), the
    dispatch and combine, the routed experts and the shared expert (gated when the spec gives
    shared_expert_intermediate_size, the Qwen2-MoE convention). Derived: docs/formulas.md#step.kernel_count"""
    k = PRE_MLP_NORM + router_kernels(m, plan) + MOE_INPUT_FANOUT \
        + dispatcher_kernels(plan, static_capacity, fused_permute)
    k = k + experts_kernels(m, plan)
    if force_balance:
        k = k + FORCE_BALANCE
    if m.shared_ffn:
        k = k + SHARED_EXPERT + tp_collectives(plan) + linear_quant_kernels(m, plan, weights=_mlp_weights(m) - 1) \
            + linear_quant_kernels(m, plan)
        if m.shared_expert_intermediate_size is not None:
            k = k + SHARED_EXPERT_GATE
    return k


def layer_kernels(m: ModelSpec, plan: ParallelPlan, kind: str, mlp: str, **moe: bool) -> Kernels:
    """Kernels of one layer: its mixer of `kind`, its `mlp` (dense, moe, none) and the residual adds."""
    k = mixer_kernels(m, plan, kind) + RESIDUAL_ADD.times(2 if kind != "none" and mlp != "none" else 1)
    if mlp == "moe":
        return k + moe_kernels(m, plan, **moe)
    if mlp == "dense":
        return k + DENSE_MLP + tp_collectives(plan) + projections_quant_kernels(m, plan, _mlp_weights(m))
    return k


def mlp_types(m: ModelSpec) -> tuple[str, ...]:
    """Each layer's MLP: the model's mlp_layer_types, or its last num_moe_layers MoE and the first dense."""
    if m.mlp_layer_types is not None:
        return tuple(m.mlp_layer_types)
    moe_from = m.num_hidden_layers - m.num_moe_layers
    return tuple("moe" if i >= moe_from else "dense" for i in range(m.num_hidden_layers))


def model_layer_kernels(m: ModelSpec, plan: ParallelPlan, scopes: tuple[str, ...] = (), launches: bool = False,
                        **moe: bool) -> Kernels:
    """Kernels the GPU runs for all the model's layers, one micro-batch, as if on one rank (every layer kind by
    its count; graphed `scopes` add their static-buffer copies), or with `launches` the host's launches
    (layer_launches)."""
    kinds = m.layer_types or ("full_attention",) * m.num_hidden_layers
    mlps = mlp_types(m)
    total = ZERO
    for pair in sorted(set(zip(kinds, mlps))):
        n = sum(1 for p in zip(kinds, mlps) if p == pair)
        one = (layer_launches(m, plan, pair[0], pair[1], scopes, **moe) if launches
               else layer_kernels(m, plan, pair[0], pair[1], **moe) + graph_io(pair[0], pair[1], scopes))
        total = total + one.times(n)
    return total


def mtp_kernels(m: ModelSpec, plan: ParallelPlan, **moe: bool) -> Kernels:
    """Kernels of the multi-token-prediction modules: each an attention layer with the model's MLP (MoE when
    the model has experts) plus MTP_EXTRA. Derived: docs/formulas.md#step.kernel_count"""
    mlp = "moe" if m.is_moe else "dense"
    one = layer_kernels(m, plan, "full_attention", mlp, **moe) + MTP_EXTRA
    return one.times(m.num_nextn_predict_layers)


def step_kernels(m: ModelSpec, plan: ParallelPlan, scopes: tuple[str, ...] = (), launches: bool = False,
                 **moe: bool) -> Any:
    """Kernels of one training step on a rank holding the whole model (pp 1): micro-batches x (every layer's
    forward and backward + the MTP modules + HEAD). The optimizer's multi-tensor kernels, the gradient
    reduction and the parameter gather (a few hundred a step) are not itemised. `scopes`: the per-layer CUDA
    graph scopes; `launches`: count the host's launches (a graph one) instead of the GPU's kernels.
    Derived: docs/formulas.md#step.kernel_count"""
    per_mb = model_layer_kernels(m, plan, scopes, launches, **moe) + mtp_kernels(m, plan, **moe) + HEAD
    return plan.num_microbatches * per_mb.total


def graphed_kernels(m: ModelSpec, plan: ParallelPlan, kind: str, mlp: str, scopes: tuple[str, ...],
                    **moe: bool) -> Kernels:
    """Kernels of one layer that Megatron-Core's per-layer CUDA graphs of `scopes` (GRAPH_SCOPES) capture: attn
    the mixer with its residual add; mlp a dense MLP with its residual add; moe_router the pre-MLP norm and the
    router (with RandomSTE under force_balance); moe_preprocess the dispatcher's preprocessing (views for Hybrid-EP:
    none counted).
    Source: NVIDIA/Megatron-LM megatron/core/transformer/transformer_layer.py and moe/moe_layer.py at 606c01046
    (the cuda_graph scopes of _forward_attention and MoELayer.route / preprocess)."""
    k = ZERO
    if "attn" in scopes and kind != "none":
        k = k + mixer_kernels(m, plan, kind) + RESIDUAL_ADD
    if "mlp" in scopes and mlp == "dense":
        k = k + DENSE_MLP + tp_collectives(plan) + projections_quant_kernels(m, plan, _mlp_weights(m)) + RESIDUAL_ADD
    if "moe_router" in scopes and mlp == "moe":
        k = k + PRE_MLP_NORM + router_kernels(m, plan) + (FORCE_BALANCE if moe.get("force_balance") else ZERO)
    return k


def layer_launches(m: ModelSpec, plan: ParallelPlan, kind: str, mlp: str, scopes: tuple[str, ...] = (),
                   **moe: bool) -> Kernels:
    """Host launches of one layer: its kernels less those the graphed `scopes` capture, plus one graph launch
    per captured scope and pass (a graph replays its kernels on the GPU without their launches; the router and
    preprocessing scopes of a MoE layer are captured together, one launch)."""
    k = layer_kernels(m, plan, kind, mlp, **moe) + graph_io(kind, mlp, scopes)
    g = graphed_kernels(m, plan, kind, mlp, scopes, **moe)
    graphs = _graphs(kind, mlp, scopes)
    return Kernels(k.fwd - g.fwd + graphs, k.bwd - g.bwd + graphs)


def _graphs(kind: str, mlp: str, scopes: tuple[str, ...]) -> int:
    """Graphs one layer replays a pass: the attention's, a dense MLP's, and one for a MoE layer's router and
    preprocessing."""
    moe_scopes = bool(set(scopes) & {"moe_router", "moe_preprocess"})
    return (int("attn" in scopes and kind != "none") + int("mlp" in scopes and mlp == "dense")
            + int(mlp == "moe" and moe_scopes))


def graph_io(kind: str, mlp: str, scopes: tuple[str, ...]) -> Kernels:
    """The static-buffer copies (GRAPH_IO) of one layer's graphs: kernels the GPU runs beside the replays."""
    return GRAPH_IO.times(_graphs(kind, mlp, scopes))


def layer_launch_average(m: ModelSpec, plan: ParallelPlan) -> Kernels:
    """Host launches per layer and micro-batch, forward and backward, averaged over the model's layers
    (model_layer_kernels with launches): the per-layer CUDA graphs of cuda_graphs "layers" (graph_scopes: the
    router's graph only where recompute module moe is off) leave one launch per graphed scope and pass;
    "full-iteration" is priced as no launches by cost.overhead. Derived: docs/formulas.md#step.kernel_count"""
    eager = model_layer_kernels(m, plan, (), True)
    graphed = model_layer_kernels(m, plan, graph_scopes(m, True), True)
    if m.is_moe:
        bare = model_layer_kernels(m, plan, graph_scopes(m, False), True)
        router = ~as_bool(plan.recomputes("moe"))
        graphed = Kernels(where(router, graphed.fwd, bare.fwd), where(router, graphed.bwd, bare.bwd))
    on = plan.cuda_graphs == "layers"
    n = m.num_hidden_layers
    return Kernels(where(on, graphed.fwd, eager.fwd) / n, where(on, graphed.bwd, eager.bwd) / n)
