"""Compute time: a stage's forward and backward seconds per micro-batch (GEMMs, attention, memory-bound
operators, recompute), the attention kernels' achieved fraction of peak, the memory-bound operators' HBM
traffic, the output layer and loss, and the optimizer step.

FLOPs live in cost.flops and GEMM efficiency and time in cost.gemm; their names are re-exported here.
Works on one ParallelPlan and, elementwise, on plan arrays (see llmplan/arith.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from llmplan.arith import maximum, where
from llmplan.cost.breakdown import Breakdown
from llmplan.cost.flops import (  # noqa: F401  (re-exported: their home was this module)
    LayerFlops,
    attended_keys,
    attention_groups,
    attention_head_dims,
    attention_keys,
    layer_flops,
    layer_windows,
    logits_flops,
    model_flops_per_step,
    module_recompute_flops,
    op_matmul_widths,
    op_recomputed_share,
    recompute_flops_per_step,
)
from llmplan.cost.gemm import (  # noqa: F401  (re-exported: their home was this module)
    GEMM_HALF_DIM,
    GEMM_OPERAND_BYTES,
    TE_PIPELINE_SPLITS,
    TILE,
    attention_shapes,
    chunk_rows,
    gemm_efficiency,
    gemm_shape_efficiency,
    grouped_gemm_bytes,
    grouped_gemm_efficiency,
    layer_gemm_seconds,
    layer_gemms,
)
from llmplan.cost.compressed import compressor_token_bytes, hc_memory_bytes
from llmplan.cost.memo import memoized
from llmplan.cost.mixers import attention_share, dense_mlp_share, mean_recurrent_memory_bytes, norms_per_layer
from llmplan.cost.params import kv_heads_per_rank, padded_vocab
from llmplan.cost.stages import recomputed_share
from llmplan.specs.hardware import GpuSpec
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan
from llmplan.units import MXFP8_BYTES, NVFP4_BYTES

KERNEL_LAUNCH_S = 5e-6  # one CUDA kernel launch from the host (a few microseconds; CUDA Programming Guide)


def elementwise_bytes(m: ModelSpec, plan: ParallelPlan, moe: bool, fp8_tn_only: bool = False) -> Any:
    """HBM traffic of one layer's memory-bound operators in forward, one micro-batch, one rank: norms
    (read + write 2h each), residual adds (read 4h, write 2h each), rotary on q and k and, with qk_norm, their
    per-head norms (read + write each), the MLP activation
    (gated: read 2f, write f; GELU: read f, write f), an MoE layer's routing and permutes (moe_routing_bytes)
    and, without fused attention, the softmax and dropout over the scores (4 bytes per score, 9 with attention
    dropout). Derived: docs/formulas.md#compute.memory_bound"""
    s, b, h, t = plan.seq_len / plan.cp, plan.micro_batch, m.hidden_size, plan.tp
    T = s * b
    sp = where(plan.sp, t, 1)
    # Unfused (fused_kernels False): a norm reads its input twice and writes and re-reads the normalised tensor
    # before scaling (3x the fused traffic); rotary reads cos / sin and makes two more passes (3x).
    unfused = where(plan.fused_kernels, 1, 3)
    norms_residual = (8 * unfused + 12) * T * h / sp * norms_per_layer(m) / 2  # a norm and an add per sub-block
    qk_width = m.d_head * (m.num_attention_heads / t + kv_heads_per_rank(m, t)) * attention_share(m)
    rope_pass = where(plan.rope_fusion, 4 * unfused, sum(EAGER_ROPE_BYTES) / 3)  # per element of q and k
    rope = 0 if m.learned_position_embeddings else rope_pass * T * qk_width
    qk_norm = 4 * unfused * T * qk_width if m.qk_norm else 0.0  # per-head RMSNorm of q and k, as a norm above
    f = m.expert_ffn * m.num_experts_per_tok + m.shared_ffn if moe else m.intermediate_size * dense_mlp_share(m)
    act = activation_pass_bytes(m) * T * f / t
    if moe:  # the routed experts' activation: its eager clamp and its moe_act recompute (rows x f_e)
        act = act + expert_activation_extra_bytes(m, plan) * T * m.expert_ffn * m.num_experts_per_tok / t
    per_score = 9 if m.attention_dropout > 0 else 4  # softmax read + write, and dropout's read, mask and write
    scores = where(plan.flash_attention, 0.0, per_score * m.num_attention_heads * s * T / t)
    routing = (moe_routing_bytes(m) + expert_bias_bytes(m, plan)) * T / sp if moe else 0.0
    recurrent = mean_recurrent_memory_bytes(m, b) * T / t  # a hybrid's convolutions, scans and norms
    casts = fp8_cast_bytes(m, plan, moe, fp8_tn_only)
    # DeepSeek-V4: the hyper-connections' passes over the n streams and the compressors' pooling of their
    # projected series, per average layer (cost.compressed)
    v4 = (hc_memory_bytes(m) + compressor_token_bytes(m) / m.num_hidden_layers) * T / sp
    return norms_residual + rope + qk_norm + act + scores + routing + recurrent + casts + v4


def activation_pass_bytes(m: ModelSpec) -> float:
    """HBM bytes per token and MLP column of the fused activation's one pass in bf16: gated, read the 2f-wide
    fc1 output and write f (6); GELU, read f and write f (4). Derived: docs/formulas.md#compute.memory_bound"""
    return 6.0 if m.gated_mlp else 4.0


def moe_routing_bytes(m: ModelSpec) -> float:
    """HBM bytes per token of one MoE layer's routing, forward, in 16 bits: the router's fp32 scores over the
    E experts (softmax and top-k: read and write 8E) and the permute of the token into its k expert copies
    and back (read and write the k copies each way: 8kh; h the latent width of a latent MoE). Training and serving alike.
    Derived: docs/formulas.md#compute.memory_bound"""
    return 8.0 * m.num_experts + 8.0 * m.num_experts_per_tok * m.expert_width


def expert_bias_bytes(m: ModelSpec, plan: ParallelPlan) -> float:
    """HBM bytes per token of an MoE layer's expert output bias (models with mlp_bias: GPT-OSS), in the
    forward-equivalent units of elementwise_bytes (the stage charges three times them). Megatron-Core builds the
    grouped fc2 with skip_bias_add and adds the bias outside the GEMM, expert by expert, as t + b * p, then
    concatenates and casts back, on the k output copies of width w. With fp32 probabilities p (DeepEP and
    HybridEP take only fp32 probs) forward writes b * p (4 bytes an element), reads t and it and writes the
    fp32 sum (10), copies it into the concatenation (8) and casts it to bf16 (6): 28; backward casts the
    gradient to fp32 (6) and back for t (6) and forms and reduces grad * p and grad * b (12 + 12): 36. With the
    alltoall dispatcher p stays in the router's bf16: 2 + 6 + 4 forward (the cast is a no-op), 6 + 6 backward.
    The fc1 bias rides the grouped GEMM (skip_bias_add False). Source: NVIDIA/Megatron-LM
    megatron/core/transformer/moe/experts.py TEGroupedMLP._apply_bias, token_dispatcher.py ("DeepEP only
    supports float32 probs") (core_v0.15.0 - core_v0.19.0). Derived: docs/formulas.md#moe.expert_bias"""
    if not (m.is_moe and m.mlp_bias):
        return 0.0
    forward, backward = (28.0, 36.0) if plan.moe_dispatcher == "deepep" else (12.0, 12.0)
    # TE's op-fuser GroupedLinear adds the bias in the GEMM (ParallelPlan.expert_bias_fusion)
    return where(plan.expert_bias_fusion, 0.0, (forward + backward) / 3 * m.num_experts_per_tok * m.expert_width)


EAGER_ROPE_BYTES = (24.0, 26.0)
"""(forward, backward) HBM bytes per element of q and k of Megatron-Core's eager rotary in bf16 (ParallelPlan.
rope_fusion False), against the fused kernel's 4 + 8: forward t * cos (read 2, write 2), rotate-half's negated
half (2 an element) and its concatenation (4), the product with sin (4), the sum (read 4, write 2) and the
final torch.cat with the empty pass-through part (4); backward the two products' gradients (4 + 4), the
negation (2) and the chunk's concatenation (4), the two branches summed (6) and the slice t[..., :rot_dim]
scattered into a zeroed full-size gradient (6). Source: NVIDIA/Megatron-LM megatron/core/models/common/
embeddings/rope_utils.py _apply_rotary_pos_emb_bshd, _rotate_half (core_v0.15.0 - core_v0.19.0); PyTorch
tools/autograd/derivatives.yaml (slice_backward, split). Derived: docs/formulas.md#compute.memory_bound"""

GLU_CLAMP_BYTES = (16.0, 30.0)
"""(forward, backward) HBM bytes per (token, expert) row and expert-FFN column of a gated MLP's eager clamp
(Megatron-Core weighted_bias_quick_geglu_impl with activation_func_clamp_value), in bf16 over the 2f-wide fc1
output: forward the two clamps read and write their halves (8) and torch.cat copies them together (8);
backward the gate's one-sided clamp gradient compares its saved input (read 2, write a 1-byte mask) and
selects the gradient (read 1 + 2, write 2): 8; the linear half's two-sided one makes two masks, ANDs them
and selects: 14; the chunk's backward concatenates the two halves' gradients (8).
Source: NVIDIA/Megatron-LM megatron/core/fusions/fused_bias_geglu.py weighted_bias_quick_geglu_impl
(core_v0.15.0 - core_v0.19.0); PyTorch tools/autograd/derivatives.yaml and FunctionsManual.cpp clamp_backward
(where(self <= max, grad, 0); where((self >= min).logical_and_(self <= max), grad, 0)), split_backward
(concatenates). Derived: docs/formulas.md#moe.glu_clamp"""


def expert_activation_extra_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """HBM bytes per (token, expert) row and expert-FFN column that the routed experts' activation costs beyond
    the fused kernel's one pass (read 2f, write f: the `act` term of elementwise_bytes), in its
    forward-equivalent units (the stage charges three times them): the eager clamp of a clamped GLU
    (ModelSpec.swiglu_limit without ParallelPlan.glu_clamp_fusion: GLU_CLAMP_BYTES), and with moe_act in the
    recompute modules the activation's forward once more in backward, the clamp's forward with it (Megatron-Core
    checkpoints bias_act_func with CheckpointWithoutOutput and reruns it before fc2's backward).
    Source: NVIDIA/Megatron-LM megatron/core/transformer/moe/experts.py TEGroupedMLP.forward (activation_recompute,
    core_v0.15.0 - core_v0.19.0). Derived: docs/formulas.md#moe.glu_clamp"""
    if not m.is_moe:
        return 0.0
    rerun = where(plan.recomputes("moe_act"), 1.0, 0.0)
    clamp_fwd, clamp_bwd = GLU_CLAMP_BYTES if m.swiglu_limit is not None and m.gated_mlp else (0.0, 0.0)
    clamp = where(plan.glu_clamp_fusion, 0.0, clamp_fwd * (1 + rerun) + clamp_bwd)
    return (clamp + rerun * activation_pass_bytes(m)) / 3


QUANTIZED_COPY_BYTES = {"tensorwise": 1.0, "rowwise": 1.0, "blockwise": 1.0 + 4 / 128, "mxfp8": MXFP8_BYTES,
                        "nvfp4": NVFP4_BYTES}
"""Bytes per element of one low-precision copy of a tensor under each recipe, scales included: one fp8 byte
(per-tensor; torchao rowwise), with an fp32 scale per 128 (blockwise) or an E8M0 scale per 32 (MXFP8); NVFP4 a
4-bit E2M1 value and an E4M3 scale per 16 (the FP32 per-tensor scale is one number). Source: Transformer
Engine docs, features/low_precision_training (fp8 current / blockwise scaling, MXFP8, NVFP4); OCP
Microscaling spec; torchao float8 README (rowwise)."""

QUANTIZED_GATHER_RECIPES = ("tensorwise", "blockwise", "mxfp8", "nvfp4")
"""Recipes whose TP all-gathers of GEMM inputs move the quantised copy: the input is cast before the gather,
not after (Transformer Engine v1.8 LayerNormLinear writes the norm's fp8 output and gathers it,
grad_output_preprocess casts then gathers the output gradient; current TE gather_along_first_dim gathers
delayed / current-scaling fp8, blockwise, MXFP8 and NVFP4 tensors; torchao's PrepareFloat8ModuleInput casts
before the forward gather). torchao's rowwise recipe gathers in bf16. Derived: docs/formulas.md#comm.tp"""

CAST_BYTES = {r: 2.0 + copies * QUANTIZED_COPY_BYTES[r]
              for r, copies in (("tensorwise", 1), ("rowwise", 1), ("blockwise", 1), ("mxfp8", 2))}
"""HBM bytes per element of a GEMM input to quantise it: read 2 (bf16) and write the low-precision copies
(QUANTIZED_COPY_BYTES): one fp8 copy (per-tensor, rowwise, blockwise); MXFP8 a rowwise and a columnwise copy
(the wgrad operand). NVFP4's passes depend on the plan's kernels: nvfp4_quantize_bytes (quantize_bytes
picks). Derived: docs/formulas.md#precision (Transformer Engine / torchao recipe documentation)."""


def nvfp4_quantize_bytes(plan: ParallelPlan) -> Any:
    """HBM bytes per element to quantise one NVFP4 GEMM input as Transformer Engine does (an activation or an
    output gradient: the recipe gives both the random Hadamard transform on their wgrad copy). Its per-tensor
    scale needs the tensor's amax before any cast, and the RHT copy's amax too: one pass reads the bf16
    tensor for both (nvte_hadamard_transform_amax). The casts then read it again and write the rowwise copy and
    the columnwise copy of the 16x16-transformed tensor (QUANTIZED_COPY_BYTES each): in one fused kernel (TE 2.15
    on: 2 + 2 + 2 x 0.5625 = 5.125 B) or, with plan.nvfp4_rht_cast_fusion False, in two kernels that each read
    it (TE 2.9 - 2.14: 2 + 2 + 2 + 1.125 = 7.125 B). The transform runs on the tensor cores inside the amax
    pass and the cast (a 16x16 matrix on each 16 elements: 32 FLOP an element, against the 2N of a GEMM of N
    output columns) and the gradients' stochastic rounding in the conversion instruction: neither adds traffic.
    Source: NVIDIA/TransformerEngine transformer_engine/pytorch/csrc/quantizer.cpp NVFP4Quantizer::quantize_impl
    (v2.12: nvte_quantize_v2 then nvte_hadamard_transform_cast_fusion_columnwise; v2.16:
    nvte_quantize_with_hadamard_transform), common/recipe/__init__.py NVFP4BlockScaling (RHT on fp4_quant_fwd_inp
    and fp4_quant_bwd_grad). Derived: docs/formulas.md#precision"""
    reads = where(plan.nvfp4_rht_cast_fusion, 2.0, 3.0)
    return 2.0 * reads + 2 * QUANTIZED_COPY_BYTES["nvfp4"]


def quantize_bytes(plan: ParallelPlan) -> Any:
    """HBM bytes per element to quantise one GEMM input under the plan's recipe (CAST_BYTES; NVFP4 as its
    kernels run, nvfp4_quantize_bytes). Derived: docs/formulas.md#precision"""
    return nvfp4_quantize_bytes(plan) if plan.recipe == "nvfp4" else CAST_BYTES[plan.recipe]


def fp8_cast_bytes(m: ModelSpec, plan: ParallelPlan, moe: bool, fp8_tn_only: bool = False) -> Any:
    """HBM bytes of one layer's fp8 casts per pass (the step's forward and backward casts over the 3 passes that
    stage_compute counts the memory-bound traffic in), one micro-batch, one rank. Every GEMM input is cast before
    its GEMM (read 2 bytes, write the recipe's copies: CAST_BYTES; on Hopper, `fp8_tn_only`, the per-tensor and
    blockwise casts also write the transposed copy): forward the QKV and fc1 inputs (h each per token) and the
    output-projection and fc2 inputs; backward the output gradients of the output projection and fc2 (h each)
    and of QKV and fc1. Weights are cast once per step and left out. Under sequence parallelism the h-wide
    tensors that TP all-gathers (the two inputs, the two gradients; DTensor gathers its gradients in bf16) are
    cast on the rank's sequence shard before the gather (as comm.gather_bytes sends them); a per-tensor fp8
    tensor gathers its row-wise data only, so on Hopper the transposed copy of each gathered tensor, wanted by
    the weight-gradient GEMM, is made after the gather (read 1 byte, write 1). An MoE layer and a hybrid stack keep
    the earlier count (each GEMM input cast in forward as if gathered whole, backward twice that): the experts'
    inputs are k permuted rows per token, and the Mamba mixers' projections have casts of their own, which
    neither count holds. Source: Transformer Engine fp8 primer; transformer_engine/pytorch/module/linear.py and
    layernorm_linear.py (quantise, then gather_along_first_dim; backward: "If data is in FP8, we compute FP8
    transposes manually"); cuBLASLt FP8 TN requirement (common/gemm/cublaslt_gemm.cu).
    Derived: docs/formulas.md#compute.memory_bound"""
    if not plan.low_precision:
        return 0.0
    s, b, h, t = plan.seq_len / plan.cp, plan.micro_batch, m.hidden_size, plan.tp
    f = (m.expert_ffn * m.num_experts_per_tok + m.shared_ffn) if moe else m.intermediate_size
    d_v = attention_head_dims(m)[1]
    transposed = 1.0 if fp8_tn_only and plan.recipe in ("tensorwise", "blockwise") else 0.0
    cast = quantize_bytes(plan) + transposed
    share = plan.low_precision_layer_fraction(m.num_hidden_layers)
    if moe or m.is_hybrid:
        return cast * s * b * (2 * h + (m.num_attention_heads * d_v + f) / t) * share
    # What each rank holds whole: the output-projection and fc2 inputs (forward), the output gradients of QKV
    # (MLA: its projections) and fc1 (backward); the h-wide inputs and gradients below, gathered under SP.
    qkv_out = sum(n for _, n in attention_shapes(m, t)[:-1])
    local = (m.num_attention_heads * d_v + f) / t + qkv_out + (2 if m.gated_mlp else 1) * f / t
    sp = plan.sp & (t > 1) & (plan.recipe in QUANTIZED_GATHER_RECIPES)
    grads_sp = sp & (plan.tp_impl == "megatron")
    # per gathered h-wide tensor: its shard's cast, and (per-tensor recipe) the transposed copy after the gather
    shard = (quantize_bytes(plan) / t + 2 * transposed) if plan.recipe == "tensorwise" else cast / t
    gathered = 2 * h * (where(sp, shard, cast) + where(grads_sp, shard, cast))
    return (cast * local + gathered) * s * b * share / 3


@dataclass(frozen=True)
class StageCompute(Breakdown):
    """Compute time of one micro-batch on one pipeline stage (forward + backward, recompute included);
    gemm + attention + memory_bound = total."""

    PARTS: ClassVar[tuple[str, ...]] = ("gemm", "attention", "memory_bound")

    gemm: Any
    attention: Any
    memory_bound: Any
    forward: Any
    """Forward part of the total (for overlap windows)."""


def stage_compute(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec, n_dense: Any, n_moe: Any,
                  last: Any) -> StageCompute:
    """Time of one micro-batch's forward and backward on a stage of n_dense + n_moe layers (plus the output
    layer when `last`): backward = 2 x forward; full recompute adds a forward of the layers, selective a
    forward of the attention core, op a forward of every other matmul and of the memory-bound operators.
    Derived: docs/formulas.md#compute.time"""
    per_layer = {moe: layer_seconds(m, plan, gpu, moe) for moe in ((False, True) if m.is_moe else (False,))}
    r = recomputed_share(plan, n_dense + n_moe)  # 1 under full recompute of every layer
    op = where(plan.op, 1.0, 0.0)  # op-level checkpointing: every other matmul and the memory-bound ops again
    q = op * op_recomputed_share(m)
    passes = 3 + r + op
    core = plan.recomputes("core_attn")
    attn_passes = 3 + (where(plan.full | core, 1, 0) if plan.recompute_layers is None else where(core, 1, r))
    gemm = attention = membound = fwd = 0.0
    for n, moe in ((n_dense, False), (n_moe, True)):
        if moe not in per_layer:
            continue
        (g1, g_back), a1, mb1 = per_layer[moe]
        # Selective recompute_modules: the share of the layer's forward matmuls they run again.
        # (a layer without matmuls, as a hybrid's mixer-only variants in cost.hybrid_stage price it: none)
        layer_gemm = layer_flops(m, plan, moe).gemm
        modules = (where(layer_gemm > 0, module_recompute_flops(m, plan, moe) / maximum(layer_gemm, 1.0), 0.0)
                   if plan.recompute_modules else 0.0)
        gemm = gemm + n * (g1 * (1 + r + q + modules) + g_back)
        attention = attention + n * a1 * attn_passes
        membound = membound + n * mb1 * passes
        fwd = fwd + n * (g1 + a1 + mb1)
    head, loss_s = output_seconds(m, plan, gpu)
    out, loss = where(last, head, 0.0), where(last, loss_s, 0.0)
    return StageCompute(gemm=gemm + 3 * out, attention=attention, memory_bound=membound + loss,
                        forward=fwd + out + loss / 3)


EXPERT_GEMM_S = 24.75e-6
"""Time one local expert's GEMM costs on Transformer Engine's per-expert grouped-GEMM path (ParallelPlan.expert_gemm
"per-expert": GroupedLinear's general_grouped_gemm, one cuBLASLt matmul per expert over its compute streams) beyond
its share of one grouped kernel, at rows too few for the matmul itself to matter. Measured: NVIDIA/
TransformerEngine pull request 3134 (SM100, benchmarks/linear/benchmark_grouped_linear.py, kernel-for-kernel
"pure" rows): 8 experts of 128 rows (N = K = 2048) take 0.267 ms on the multi-stream path and 0.069 ms as one
CUTLASS grouped launch, (0.267 - 0.069) / 8 = 24.75 us per expert GEMM. Taken as published, not fitted.
Derived: docs/formulas.md#compute.expert_gemms"""


def expert_gemm_seconds(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Forward time one MoE layer's expert GEMMs cost per micro-batch beyond the grouped GEMM the FLOPs are priced
    as (layer_gemm_seconds), per call: its two expert matmuls once per local expert (E / ep), as launches
    (KERNEL_LAUNCH_S) without fused kernels, EXPERT_GEMM_S each on Transformer Engine's per-expert path, nothing in
    one grouped kernel. Charged with the memory-bound time, so the stage counts it once per pass (3 + r: the
    backward's input- and weight-gradient GEMMs per forward GEMM). Derived: docs/formulas.md#compute.expert_gemms"""
    calls = 2 * m.num_experts / plan.ep
    per_call = where(plan.fused_kernels, where(plan.expert_gemm == "per-expert", EXPERT_GEMM_S, 0.0),
                     KERNEL_LAUNCH_S)
    return calls * per_call


def bf16_kernel_format(plan: ParallelPlan) -> str:
    """The format of the kernels a low-precision recipe leaves in bf16 (attention, the output layer): bf16
    under one, else the plan's dtype (the same rule as ParallelPlan.mfu_format, for another reason).
    Source: NVIDIA/TransformerEngine transformer_engine/common/recipe/__init__.py (fp8_dpa False by default in
    every recipe: attention outside FP8, ParallelPlan.fp8_attention); output_seconds (the output layer)."""
    return "bf16" if plan.low_precision else plan.dtype


def layer_seconds(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec, moe: bool) -> tuple[Any, Any, Any]:
    """(GEMM, attention, memory-bound) forward seconds of one layer and micro-batch: the same on every stage,
    so computed once per plan arrays."""
    def compute() -> tuple[Any, Any, Any]:
        split = where(plan.flash_attention, attention_rate_ratio(m, plan, gpu), 1.0)  # the calls' length
        peak_attn = (gpu.sustained_flops(bf16_kernel_format(plan))
                     * attention_fraction(gpu, plan, m) * split * fp8_attention_ratio(m, plan, gpu))
        # Without a grouped GEMM every local expert's two matmuls are separate launches (expert_gemm_seconds).
        launches = expert_gemm_seconds(m, plan) if moe else 0.0
        return (layer_gemm_seconds(m, plan, gpu, moe), layer_flops(m, plan, moe).attention / peak_attn,
                elementwise_bytes(m, plan, moe, gpu.fp8_tn_only) / (gpu.hbm_bytes_per_s * gpu.hbm_efficiency)
                + launches)
    return memoized(plan, ("layer_seconds", m, gpu, moe), compute)


ATTENTION_TILE = 128
"""Rows of a fused attention kernel's tile at head dim 128: FlashAttention-3's Hopper forward and backward
(kBlockM = kBlockN = 128, Dao-AILab/flash-attention hopper/tile_size.h) and FlashAttention-2's forward. A
forward CTA owns one query tile of one head (of one sequence) and loops over the key tiles; a backward CTA
owns one key tile and loops over the query tiles. Derived: docs/formulas.md#compute.cp_attention"""

ATTENTION_FIXED_KEYS = {"native": (237.0, 420.0), "flash2": (105.0, 271.0)}
"""(forward, backward) keys' worth of time a fused attention kernel spends per CTA outside its loop over the
other side's tiles (loading its own tile, filling the pipeline, the epilogue: the output and log-sum-exp, or
dK and dV), so that a CTA looping over k keys (queries, in backward) runs at k / (k + k0) of the kernel's rate.
Solved from two published rates on H100 (bf16, head dim 128, batch x sequence = 16k tokens, so the CTA count
is the same at every length) at 512 and 16k tokens, k0 = 512·16384·(1 - r) / (r·16384 - 512) with r their
ratio. FlashAttention-3 (the native kernel on Hopper): forward 430.3 and 620.7 TFLOP/s (pytorch/benchmark PR
#2391, commit ff65cb6), backward 316 and 561 (Shah et al. 2024, FlashAttention-3, Figure 6). FlashAttention-2:
forward 309 and 370, backward 214 and 322 (Shah et al. 2024, Figures 5-6). The same form gives the 1k-8k points
within 5% (tests/test_cp_short.py). Derived: docs/formulas.md#compute.cp_attention"""


def attention_call_seconds(rows: Any, work: Any, longest: Any, sms: int, fixed_keys: float) -> Any:
    """Time of one fused-attention call, in key-tile iterations of one SM: `rows` CTAs (query tiles x heads x
    sequences in forward, key tiles x ... in backward) that together run `work` tile iterations, the longest
    CTA `longest` of them, each CTA fixed_keys / ATTENTION_TILE iterations more (ATTENTION_FIXED_KEYS), one CTA
    per SM at a time. The call takes its share of the SMs' time, rows / sms waves of the mean CTA, but never
    less than its longest CTA: a call of fewer CTAs than SMs leaves SMs idle, and a causal call's last query
    tile sees every key tile. (A partly filled last wave is not charged: Transformer Engine runs successive
    ring steps' attention on two alternating streams, so the next call's CTAs fill it.)
    Source: Dao 2023, FlashAttention-2 §3.2 (one thread block per query block and head; the backward per key
    block); Transformer Engine context_parallel.py (flash_attn_streams). Derived:
    docs/formulas.md#compute.cp_attention"""
    rows = maximum(rows, 1.0)
    fixed = fixed_keys / ATTENTION_TILE
    return maximum(rows / sms * (work / rows + fixed), longest + fixed)


def attention_rate_ratio(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec) -> Any:
    """The fused attention kernel's rate on a rank's calls of one layer over its asymptotic rate
    (GpuSpec.attention_efficiency: one long causal call, the per-CTA fixed work amortised, every SM busy).
    At cp = 1 a rank runs one causal call over s: its diagonal tiles are computed whole (masked) and each CTA
    pays ATTENTION_FIXED_KEYS once, so short sequences run below the asymptote. With context parallelism and
    load balancing (Megatron / Transformer Engine's zigzag, torchtitan's round-robin) each rank holds two
    chunks of c = s/2cp tokens and runs, per layer and pass, one causal call on its own 2c x 2c and cp - 1 ring
    steps on c x 2c halves: steps i <= rank take the first half of the received K/V (queries 2c x keys c),
    the others the second half of the queries (c x 2c). The same tiles as one causal call over s, in short
    calls: fewer keys per CTA (ATTENTION_FIXED_KEYS weighs more) and, once a call has fewer CTAs than the
    GPU has SMs, idle SMs. Rank r runs r calls of the first kind and cp - 1 - r of the second, and every rank
    waits for the slowest at the layer's end: cp - 1 times the slower kind. Forward (CTAs over query tiles)
    once, backward (over key tiles) twice. The asymptote is a rank's share of s^2/2 useful (query, key) pairs
    per head at one tile iteration per SM, no fixed work. k0 is H100's (FA3 for the native kernel, FA2 for
    flash2 and where the native kernel is FA2) on every GPU.
    Source: Dao 2023, FlashAttention-2 §3.2 (causal: blocks above the diagonal skipped, the diagonal block
    masked); Transformer Engine attention context_parallel.py (AttnFuncWithCPAndKVP2P: the per-step
    sections); Megatron-LM megatron/training/utils.py get_batch_on_this_cp_rank (2·cp chunks: rank r holds
    chunks r and 2cp - 1 - r). Derived: docs/formulas.md#compute.cp_attention"""
    sms = gpu.sm_count
    H = plan.micro_batch * m.num_attention_heads / plan.tp  # (head, sequence) pairs per call
    n = np.ceil(plan.seq_len / (2 * plan.cp * ATTENTION_TILE))  # tiles per chunk
    fa2 = (plan.attention_kernel == "flash2") | gpu.native_attention_flash2
    k_fwd = where(fa2, ATTENTION_FIXED_KEYS["flash2"][0], ATTENTION_FIXED_KEYS["native"][0])
    k_bwd = where(fa2, ATTENTION_FIXED_KEYS["flash2"][1], ATTENTION_FIXED_KEYS["native"][1])

    def passes(q: Any, k: Any, tiles: Any, q_loop: Any, k_loop: Any) -> Any:  # forward + backward of one call
        return (attention_call_seconds(q * H, tiles * H, q_loop, sms, k_fwd)
                + 2 * attention_call_seconds(k * H, tiles * H, k_loop, sms, k_bwd))

    halves = maximum(passes(2 * n, n, 2 * n * n, n, 2 * n), passes(n, 2 * n, 2 * n * n, 2 * n, n))
    ring = passes(2 * n, 2 * n, 2 * n * n + n, 2 * n, 2 * n) + (plan.cp - 1) * halves
    N = np.ceil(plan.seq_len / ATTENTION_TILE)
    whole = passes(N, N, N * (N + 1) / 2, N, N)  # one causal call over s
    useful = 3 * H * (plan.seq_len / ATTENTION_TILE) ** 2 / 2 / sms  # the asymptote's time, all ranks
    return useful / plan.cp / where(plan.cp > 1, ring, whole)


def attention_fraction(gpu: GpuSpec, plan: ParallelPlan, m: ModelSpec) -> Any:
    """Achieved fraction of the sustained peak on the attention-score FLOPs: for a fused kernel the GPU's
    native kernel's asymptotic rate (attention_efficiency), times FlashAttention-2's ratio to it when the
    plan runs FA2, times the GPU's softmax (exp-rate) ratio, times the kernel's rate at the model's head
    dimension (head_dim_attention_ratio); the calls' length enters apart (attention_rate_ratio). Unfused
    attention runs its score matmuls at unfused_attention_efficiency (its score traffic is priced in
    elementwise_bytes). Source: Shah et al. 2024 (FlashAttention-3), abstract; NVIDIA, "Making Softmax More
    Efficient with NVIDIA Blackwell Ultra". Derived: docs/formulas.md#compute.attention"""
    flash2 = plan.attention_kernel == "flash2"
    ratio = gpu.flash2_attention_ratio if flash2 else 1.0
    d0 = gpu.flash2_softmax_head_dim if flash2 else gpu.attention_softmax_head_dim
    fused = gpu.attention_efficiency * head_dim_attention_ratio(m, d0)
    unfused = gpu.unfused_attention_efficiency * unaligned_bmm_ratio(m, plan, gpu)
    return where(plan.flash_attention, fused, unfused) * ratio * gpu.softmax_attention_ratio


def grad_accumulation_bytes(plan: ParallelPlan) -> float:
    """HBM bytes per parameter that one micro-batch's gradient accumulation moves outside the weight-gradient
    GEMM (ParallelPlan.grad_accumulation): fused 0 (the GEMM accumulates into the main gradient); add reads
    the micro-batch's gradient (2 bytes; 4 in fp32 training) and reads and writes the accumulated one (grad
    dtype g): 2 + 2g; cast-add first writes and reads the gradient cast to the accumulated dtype: 2 + 4g.
    Source: NVIDIA/Megatron-LM megatron/model/distributed.py at 50a4b5fa02 (param_hook:
    param.main_grad.add_(param.grad.data)), gradient accumulation fusion from 83b1e42f30 (2022-02-16);
    microsoft/DeepSpeed runtime/bf16_optimizer.py update_hp_grads at v0.6.3 (hp_grad.add_(lp.grad.to(fp32)),
    called after every micro-batch's backward by runtime/pipe/engine.py). Derived:
    docs/formulas.md#step.grad_accumulation"""
    new = 4.0 if plan.dtype == "fp32" else 2.0
    g = plan.grad_bytes
    return {"fused": 0.0, "add": new + 2 * g, "cast-add": new + 4 * g}[plan.grad_accumulation]


def grad_accumulation_seconds(params_on_rank: Any, plan: ParallelPlan, gpu: GpuSpec) -> Any:
    """Time of one micro-batch's gradient accumulation on a rank holding `params_on_rank` parameters: their
    grad_accumulation_bytes at the GPU's achieved HBM bandwidth. Derived: docs/formulas.md#step.grad_accumulation"""
    return params_on_rank * grad_accumulation_bytes(plan) / (gpu.hbm_bytes_per_s * gpu.hbm_efficiency)


CUBLAS_TENSOR_CORE_ALIGN_BYTES = 16
"""cuBLAS's alignment for its tensor-core kernels at full speed: the leading dimensions, the contiguous
extents and the pointers of a GEMM a multiple of 16 bytes (NVIDIA cuBLAS documentation, 2.1.11 "Tensor Core
Usage": "the best performance when using Tensor Cores"; since cuBLAS 11.0 other shapes may still use them, at
a rate it does not give). Derived: docs/formulas.md#compute.unaligned_bmm"""


def unaligned_bmm_ratio(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec) -> float:
    """The unfused attention's score matmuls' rate relative to their tensor-core rate: 1 when the head
    dimension meets cuBLAS's 16-byte alignment, else the GPU's CUDA-core (fp32) peak over its tensor-core peak
    of the compute dtype. Megatron's unfused path (2020-22) runs QK^T, AV and their gradients as batched
    matmuls over heads whose inner or outer extent is the head dimension d, each batch starting d x 3
    elements further into the fused QKV projection (an odd multiple of d), so d x element bytes off a
    multiple of 16 breaks the contiguous extent and every other batch's pointer: BLOOM's 128-head
    h = 13,824 (d = 108) trials. Priced at the rate of a kernel without tensor cores (cuBLAS does not
    document the rate of its unaligned tensor-core paths). NVIDIA GPUs only (cuBLAS); 1 where the profile
    lists no fp32 peak.
    Source: NVIDIA cuBLAS documentation, 2.1.11 "Tensor Core Usage"; NVIDIA/Megatron-LM
    megatron/model/transformer.py ParallelAttention (torch.baddbmm / torch.bmm over [b * np, s, hn]).
    Derived: docs/formulas.md#compute.unaligned_bmm"""
    dtype = bf16_kernel_format(plan)  # low-precision recipes run the unfused scores in bf16
    size = 4 if dtype == "fp32" else 2
    aligned = all(d * size % CUBLAS_TENSOR_CORE_ALIGN_BYTES == 0 for d in attention_head_dims(m))
    if aligned or gpu.vendor != "nvidia" or "fp32" not in gpu.tflops or dtype not in gpu.tflops:
        return 1.0
    return min(1.0, gpu.peak_flops("fp32") / gpu.peak_flops(dtype))


def fp8_attention_ratio(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec) -> Any:
    """Speed of FP8 fused attention (ParallelPlan.fp8_attention) over bf16 at the model's head dimension d: per
    (query, key) pair the kernel's 4d matmul FLOPs run at twice the tensor rate and its softmax work (d0, the GPU's
    attention_softmax_head_dim, as in head_dim_attention_ratio) at the same, so the rate goes from d / (d + d0) to
    d / (d / 2 + d0): (d + d0) / (d / 2 + d0), 1.60 at d = 128 and d0 = 43. Check: Shah et al. 2024
    (FlashAttention-3), abstract: on H100 FP8 reaches close to 1.2 PFLOP/s against 740 TFLOP/s in BF16, 1.62x.
    1 without FP8 attention. Derived: docs/formulas.md#compute.fp8_attention"""
    qk, v = attention_head_dims(m)
    d, d0 = (qk + v) / 2, gpu.attention_softmax_head_dim
    return where(plan.fp8_attention, (d + d0) / (d / 2 + d0), 1.0)


def head_dim_attention_ratio(m: ModelSpec, d0: float) -> float:
    """A fused attention kernel's rate at the model's head dimension d relative to d = 128 (where
    attention_efficiency is measured). Per (query, key) pair the kernel does 4d matmul FLOPs and a fixed amount
    of softmax work (the exponential on the special-function units, the scale, max and sum), so its rate
    goes as d / (d + d0), d0 the head dimension at which the two take as long. MLA's d is the mean of its
    query-key and value dims. Source: Shah et al. 2024 (FlashAttention-3), Figures 5-6 (H100, 4k tokens:
    head dim 64 runs forward + backward at 0.79x (cuDNN), 0.81x (FA3), 0.89x (FA2) of head dim 128).
    Derived: docs/formulas.md#compute.attention"""
    qk, v = attention_head_dims(m)
    d = (qk + v) / 2
    return (d / (d + d0)) / (128 / (128 + d0))


def output_seconds(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec) -> tuple[Any, Any]:
    """(output-layer GEMM, loss) seconds of one micro-batch on the last stage (once more per MTP module). The
    output layer stays in bf16 under every low-precision recipe (Megatron-Core's fp8 autocast covers the
    decoder layers only; torchtitan's float8 / MX converters skip the output layer)."""
    def compute() -> tuple[Any, Any]:
        s, b = plan.seq_len / plan.cp, plan.micro_batch
        fmt = bf16_kernel_format(plan)
        eff = gemm_shape_efficiency(gpu, fmt, s * b, padded_vocab(m.vocab_size, plan.tp) / plan.tp, m.hidden_size)
        heads = 1 + m.num_nextn_predict_layers  # multi-token prediction runs the output head once more per module
        return (heads * logits_flops(m, plan) / (gpu.sustained_flops(fmt) * eff),
                heads * loss_bytes(m, plan) / (gpu.hbm_bytes_per_s * gpu.hbm_efficiency))
    return memoized(plan, ("output_seconds", m, gpu), compute)


def loss_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """HBM traffic of the output layer's loss, forward and backward, one micro-batch, one rank: the logits
    written in bf16, read and turned into fp32 softmax, read again for the loss and the gradient, and the
    gradient written: about 16 bytes per logit. Derived: docs/formulas.md#compute.memory_bound"""
    return 16 * plan.seq_len / plan.cp * plan.micro_batch * padded_vocab(m.vocab_size, plan.tp) / plan.tp


def optimizer_step_seconds(params_on_rank: Any, plan: ParallelPlan, gpu: GpuSpec, expert_on_rank: Any = 0.0) -> Any:
    """Gradient clipping and the Adam update, memory-bound: read the gradients for their norm, read and write
    them to scale them; read fp32 master, moments and the gradient, write them back and the bf16 copy:
    (2 x optimizer bytes + 4 x gradient + weight) per parameter of the rank's optimizer shard. The rank's
    `expert_on_rank` routed-expert parameters are sharded over the expert data-parallel group,
    world / (etp x ep x pp) ranks (as cost.memory.stage_memory), the rest over dp x cp.
    Source: Megatron-LM megatron/core/parallel_state.py (expert data-parallel group).
    Derived: docs/formulas.md#compute.optimizer"""
    per_param = 2 * plan.optimizer_bytes + 4 * plan.grad_bytes + plan.weight_bytes
    sharded = where(plan.zero >= 1, (params_on_rank - expert_on_rank) / plan.zero_shard + expert_on_rank / plan.expert_dp,
                    params_on_rank)
    return sharded * per_param / (gpu.hbm_bytes_per_s * gpu.hbm_efficiency)
