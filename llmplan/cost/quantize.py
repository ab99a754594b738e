"""Low-precision recipes' quantisation: the bytes of a tensor's quantised copies, the recipes whose TP gathers
move them, the HBM traffic to quantise a GEMM input (NVFP4 as its kernels run) and one layer's casts per pass
(fp8_cast_bytes), and the format of the kernels a recipe leaves in bf16. Split out of cost.compute (issue 35),
which re-exports these names. Works on one ParallelPlan and, elementwise, on plan arrays (see llmplan/arith.py).
"""

from __future__ import annotations

from typing import Any

from llmplan.arith import where
from llmplan.cost.compressed import is_v4_attention
from llmplan.cost.flops import attention_head_dims
from llmplan.cost.gemm import attention_shapes, fused_grouped_mlp
from llmplan.cost.mixers import attention_share, dense_mlp_share, recurrent_gemm_shapes
from llmplan.cost.params import attention_params_per_rank, attention_replicated_params
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan
from llmplan.units import MXFP8_BYTES, NVFP4_BYTES

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


AMAX_READ_BYTES = 2.0
"""HBM bytes per element that current per-tensor scaling adds to a cast whose input no earlier kernel took the
amax of: the amax kernel reads the bf16 tensor once before the cast (its scale a few bytes). Source:
NVIDIA/TransformerEngine transformer_engine/pytorch/csrc/quantizer.cpp at v2.8 (40c69e7)
Float8CurrentScalingQuantizer::quantize_impl: nvte_compute_amax_with_config, the TP all-reduce where
with_amax_reduction, nvte_compute_scale_from_amax, nvte_quantize_v2; a fused norm's output skips the pass
(quantize_with_amax, csrc/extensions/normalization.cpp). Derived: docs/formulas.md#precision.fp8_scaling"""


def amax_read_bytes(plan: ParallelPlan) -> float:
    """AMAX_READ_BYTES under current per-tensor scaling (plan.fp8_scaling current, fp8 tensorwise), else 0:
    delayed scaling takes its scale from the amax history and the cast writes the new amax as a side output.
    Derived: docs/formulas.md#precision.fp8_scaling"""
    current = plan.fp8_scaling == "current" and plan.dtype == "fp8" and plan.recipe == "tensorwise"
    return AMAX_READ_BYTES if current else 0.0


def fp8_cast_bytes(m: ModelSpec, plan: ParallelPlan, moe: bool, fp8_tn_only: bool = False) -> Any:
    """HBM bytes of one layer's fp8 casts per pass (the step's forward and backward casts over the 3 passes that
    stage_compute counts the memory-bound traffic in), one micro-batch, one rank. Every GEMM input is cast before
    its GEMM (read 2 bytes, write the recipe's copies: CAST_BYTES; on Hopper, `fp8_tn_only`, the per-tensor and
    blockwise casts also write the transposed copy): forward the QKV and fc1 inputs (h each per token) and the
    output-projection and fc2 inputs; backward the output gradients of the output projection and fc2 (h each)
    and of QKV and fc1. Transformer Engine's weights are cast once per step and left out; torchao's are cast in
    every micro-batch (torchao_weight_cast_bytes, added per micro-batch, not per token). Under sequence parallelism the
    h-wide
    tensors that TP all-gathers (the two inputs, the two gradients; torchao's float8 DTensor TP casts the
    gradient shard too: Float8RowwiseParallel at eab345c) are cast on the rank's sequence shard before the
    gather (as comm.gather_bytes sends them); a per-tensor fp8 tensor gathers its row-wise data only, so on
    Hopper the transposed copy of each gathered tensor, wanted by the weight-gradient GEMM, is made after the
    gather (read 1 byte, write 1). An MoE layer's MLP is counted apart (moe_mlp_cast_bytes: the routed experts
    cast their k permuted rows per token); a hybrid stack's average layer casts its own sub-blocks' projections
    (hybrid_cast_widths). Under current scaling (amax_read_bytes) every cast but those of a fused norm's outputs
    (the QKV and fc1 inputs, Megatron-Core's TE LayerNorm linears; a hybrid's h-wide inputs) reads its input once
    more, on the shard it is cast on. Source: Transformer Engine fp8 primer;
    transformer_engine/pytorch/module/linear.py and layernorm_linear.py (quantise, then gather_along_first_dim;
    backward: "If data is in FP8, we compute FP8 transposes manually"); cuBLASLt FP8 TN requirement
    (common/gemm/cublaslt_gemm.cu).
    Derived: docs/formulas.md#compute.memory_bound"""
    if not plan.low_precision:
        return 0.0
    s, b, h, t = plan.seq_len / plan.cp, plan.micro_batch, m.hidden_size, plan.tp
    d_v = attention_head_dims(m)[1]
    transposed = 1.0 if fp8_tn_only and plan.recipe in ("tensorwise", "blockwise") else 0.0
    cast = quantize_bytes(plan) + transposed
    share = plan.low_precision_layer_fraction(m.num_hidden_layers)
    amax = amax_read_bytes(plan)
    sp = plan.sp & (t > 1) & (plan.recipe in QUANTIZED_GATHER_RECIPES)
    # per gathered h-wide tensor: its shard's cast, and (per-tensor recipe) the transposed copy after the gather
    shard = (quantize_bytes(plan) / t + 2 * transposed) if plan.recipe == "tensorwise" else cast / t
    gathered, on_shard = where(sp, shard, cast), where(sp, 1 / t, 1)
    mlp = moe_mlp_cast_bytes(m, plan, transposed, h * gathered, on_shard) if moe else 0.0
    mlp = mlp + save_original_input_cast_bytes(m, plan, moe, transposed, on_shard) \
        + torchao_requantize_bytes(m, plan, moe, transposed)
    weights = torchao_weight_cast_bytes(m, plan, moe)  # per micro-batch, not per token
    if m.is_hybrid:  # its sub-blocks' own projections, the h-wide ones gathered under SP as below
        local, inputs, grads = hybrid_cast_widths(m, t, moe)
        own = amax * (local + h * grads * on_shard)  # the h-wide inputs are the norms'
        return (cast * local + h * (inputs + grads) * gathered + own + mlp) * s * b * share / 3
    # What each rank holds whole: the output-projection and fc2 inputs (forward), the output gradients of QKV
    # (MLA: its projections) and fc1 (backward); the h-wide inputs and gradients, gathered under SP. An MoE
    # layer: attention's alone here (its QKV input and output-projection gradient the h-wide ones).
    qkv_out = sum(n for _, n in attention_shapes(m, t)[:-1])
    f = 0 if moe else m.intermediate_size
    local = (m.num_attention_heads * d_v + f) / t + qkv_out + (2 if m.gated_mlp else 1) * f / t
    wide = 2 if moe else 4
    own = amax * (local + (wide // 2) * h * on_shard)  # the output gradients TP gathers; not the norms' outputs
    return ((cast * local + wide * h * gathered + own + mlp) * s * b + weights) * share / 3


def moe_mlp_cast_bytes(m: ModelSpec, plan: ParallelPlan, transposed: float, gathered: Any, on_shard: Any) -> Any:
    """HBM bytes per token of the layer's s·b, over the step, one rank, of an MoE layer's MLP casts (fp8_cast_bytes
    adds the mixer's). The routed experts are Transformer Engine GroupedLinear modules on the permuted buffer: k
    rows per token (Megatron-Core's dispatchers permute the bf16 tokens into their k expert copies before the
    all-to-all, or DeepEP / HybridEP after it; expert TP all-gathers the bf16 rows before the experts), r = k·etp
    (/ t under SP) rows per token on the rank, times the capacity padding. Forward fc1 casts its input (r·w, w the
    expert width) and fc2 its input (r·f_e/etp); backward fc2 casts its output gradient (r·w) and fc1 its own
    (r·c·f_e/etp, c = 2 for a GLU): each cast as a dense linear's (read 2, the recipe's copies, Hopper's transposed
    copy, current scaling's amax read). The fused grouped MLP quantises the two f_e-wide ones in its epilogues
    (fused_expert_cast_width). With ep_dispatch_fp8 the w-wide pair is cast on the rank's tokens before the
    forward and backward dispatches (1 row per token, not k) and Hopper's transposed copy is made from the k
    dispatched rows (read 1, write 1). The shared expert casts as a dense MLP of width f_s (its fc1 input and fc2
    output gradient h-wide, gathered under SP: `gathered` bytes each, `on_shard` of h read for the amax, none of
    it a norm's output: the MoE layer's norm is a separate TENorm), a latent MoE its two projections
    (latent_proj_cast_width). Source: NVIDIA/Megatron-LM megatron/core/transformer/moe/token_dispatcher.py at
    d98e8a6 (MoEAlltoAllTokenDispatcher.dispatch_preprocess: permute(hidden_states, routing_map);
    dispatch_postprocess: gather_from_sequence_parallel_region over the expert-TP group; _DeepepManager: permute
    after the dispatch), experts.py (TEGroupedMLP.forward: linear_fc1 on permuted_local_hidden_states);
    NVIDIA/TransformerEngine transformer_engine/pytorch/module/grouped_linear.py at d0067d0 (forward
    _split_quantize of the m_splits rows, columnwise usage when the weight needs a gradient; backward
    group_quantize of grad_output, rowwise and columnwise); DeepSeek-V3 report §3.3.2 (the activation before
    the up-projection and the gradient before the down-projection quantised before the dispatch).
    Derived: docs/formulas.md#moe.expert_casts"""
    h, t, k, etp, f_e, w = m.hidden_size, plan.tp, m.num_experts_per_tok, plan.etp_resolved, m.expert_ffn, \
        m.expert_width
    c, tokens = (2 if m.gated_mlp else 1), where(plan.sp, 1 / t, 1)  # the rank's tokens per token of s·b
    q, amax = quantize_bytes(plan), amax_read_bytes(plan)
    rows = k * etp * tokens * plan.expert_padding
    # the f_e-wide pair, none on the fused path (expert TP 1 there: its epilogues quantise all r·(1 + c)·f_e)
    f_wide = rows * (1 + c) * f_e / etp - 3 * fused_expert_cast_width(m, plan) * tokens * plan.expert_padding
    local = f_wide + 3 * latent_proj_cast_width(m, plan) + (1 + c) * m.shared_ffn / t
    w_rows = 2 * w * rows  # fc1's input (forward) and fc2's output gradient (backward)
    w_wide = where(plan.ep_dispatch_fp8, 2 * w * tokens * (q + amax) + w_rows * 2 * transposed,
                   w_rows * (q + transposed + amax))
    shared = 2 * (gathered + amax * h * on_shard) if m.shared_ffn else 0.0
    return (q + transposed + amax) * local + w_wide + shared


def requantize_bytes(plan: ParallelPlan, transposed: float, split: bool) -> Any:
    """HBM bytes per element that Transformer Engine's save_original_input adds to one GEMM input's casts: the
    forward cast writes the rowwise copy alone and backward quantises the saved bf16 input again for the wgrad
    operand, so the input is read once more (2) with current scaling's amax read again (amax_read_bytes), the
    columnwise copy written in backward instead of forward. On GroupedLinear's split-quantize path (`split`) a
    per-tensor fp8 quantizer is asked for both usages in backward, so Hopper (`transposed`) writes the rowwise
    byte again. NVFP4: both casts take their amax and read the tensor (8 B) where one fused pass read it twice
    (nvfp4_quantize_bytes' reads). 0 in bf16, under delayed scaling (TE raises "DelayedScaling recipe is not
    supported with save_original_input"), torchao's rowwise recipe and DeepSeek-V3's own stack (ep_dispatch_fp8):
    no Megatron-Core TE module sets the flag there.
    Source: NVIDIA/TransformerEngine transformer_engine/pytorch/module/linear.py at d0067d0 (_linear_forward:
    columnwise=not save_original_input, inputmat = inp saved; backward input_quantizer(inputmat_total) with
    columnwise usage), grouped_linear.py (_GroupedLinear.backward: _split_quantize with rowwise=True,
    columnwise=True for Float8Quantizer / Float8CurrentScalingQuantizer). Derived:
    docs/formulas.md#precision.save_original_input"""
    if not plan.low_precision or plan.recipe == "rowwise" or (plan.recipe == "tensorwise"
                                                              and plan.fp8_scaling == "delayed"):
        return 0.0
    if plan.recipe == "nvfp4":
        x: Any = 8.0 - 2.0 * where(plan.nvfp4_rht_cast_fusion, 2.0, 3.0)
    else:
        x = 2.0 + amax_read_bytes(plan) + (transposed if split and plan.recipe == "tensorwise" else 0.0)
    return where(plan.ep_dispatch_fp8, 0.0, x)


def proj_saves_original_input(plan: ParallelPlan) -> Any:
    """1 where Megatron-Core sets Transformer Engine's save_original_input on the attention / MLA output projection
    (linear_proj): fp8 under a non-delayed recipe (current scaling, blockwise, MXFP8; TE >= 2.6) or fp4, on a
    Megatron-Core / TE stack (tp_impl megatron; not torchao's Float8Linear as torchtitan runs it, tp_impl dtensor,
    nor its rowwise recipe, nor DeepSeek-V3's own stack, ep_dispatch_fp8); else 0. linear_proj then keeps the
    core's bf16 output, not a quantised copy. Source: NVIDIA/Megatron-LM d98e8a64dd
    megatron/core/transformer/attention.py, multi_latent_attention.py (Attention.__init__ / MLA __init__:
    set_save_original_input(self.linear_proj) under fp8 with fp8_recipe != 'delayed' or fp4).
    Derived: docs/formulas.md#precision.save_original_input"""
    if plan.tp_impl != "megatron":
        return 0.0
    return where(requantize_bytes(plan, 0.0, split=False) > 0, 1.0, 0.0)


def save_original_input_cast_bytes(m: ModelSpec, plan: ParallelPlan, moe: bool, transposed: float,
                                   on_shard: Any) -> Any:
    """HBM bytes per token of the layer's s·b, over the step, one rank, that Megatron-Core's
    set_save_original_input adds to the casts of the modules it sets it on under the recompute / offload
    modules (requantize_bytes per element of their input): on every softmax / MLA attention layer the output
    projection's input, the core's output (proj_saves_original_input); with `moe_act` recompute the routed experts' fc2
    (its k·etp rows of f_e/etp, not on the fused grouped MLP, whose ops ignore the module's flag), with
    `expert_fc1` offload fc1 (k·etp rows of the expert width) unless MXFP8 / NVFP4, with `layernorm` recompute
    MLA's down-projections (the query's where it has a rank, the key/value's; h-wide, on the sequence shard);
    on an MoE layer the shared expert's fc1 under linear_proj's recipes unless shared_experts is recomputed (h-wide,
    on the sequence shard before TP's gather, where a per-tensor quantizer writes its rowwise byte again as TE
    gathers that alone; with shared_experts recompute the rerun's cast of the same input, priced alike);
    dense layers' other norms are fused into a LayerNormLinear. The saved bytes: mem.recompute_modules and
    mem.offload_modules. Source: NVIDIA/Megatron-LM d98e8a64dd megatron/core/transformer/moe/experts.py
    (TEGroupedMLP.__init__: set_save_original_input(linear_fc2) under moe_act with fp8 / fp4; (linear_fc1)
    under expert_fc1 offload unless mxfp8 / nvfp4), multi_latent_attention.py set_for_recompute_input_layernorm,
    transformer_layer.py (recompute_input_layernorm), moe/shared_experts.py (SharedExpertMLP.__init__);
    NVIDIA/TransformerEngine d0067d0da6 pytorch/module/linear.py (_linear_backward: the saved input quantised,
    rowwise only where supports_only_rowwise_all_gather, before gather_along_first_dim).
    Derived: docs/formulas.md#precision.save_original_input"""
    lin = requantize_bytes(plan, transposed, split=False)
    mla = m.mla is not None and not is_v4_attention(m)
    downs = (2 if m.q_lora_rank else 1) if mla else 0
    attn = where(plan.recomputes("layernorm"), lin * downs * m.hidden_size * on_shard * attention_share(m), 0.0)
    # linear_proj re-quantises the core's output (a·d_v/t a token, TP-local) for its wgrad (proj_saves_original_input)
    proj = m.num_attention_heads * attention_head_dims(m)[1] / plan.tp
    attn = attn + lin * proj_saves_original_input(plan) * proj * attention_share(m)
    if not moe:
        return attn
    rows = m.num_experts_per_tok * plan.etp_resolved * where(plan.sp, 1 / plan.tp, 1) * plan.expert_padding
    fc2 = where(fused_grouped_mlp(m, plan), 0.0,
                where(plan.recomputes("moe_act"), rows * m.expert_ffn / plan.etp_resolved, 0.0))
    mx = plan.low_precision and plan.recipe in ("mxfp8", "nvfp4")
    fc1 = rows * m.expert_width if plan.offloads("expert_fc1") and not mx else 0.0
    # the shared expert's fc1 (flagged as linear_proj, unless shared_experts is recomputed) re-quantises the norm's
    # output (h, on the sequence shard before TP's gather); a per-tensor fp8 quantizer gathers rowwise data only,
    # so under SP that cast writes the rowwise byte again. Under shared_experts recompute the checkpoint's rerun
    # casts that input again instead: at least these bytes (reruns' casts are not priced otherwise)
    rowwise = where(plan.sp & (plan.tp > 1), 1.0, 0.0) if plan.recipe == "tensorwise" else 0.0
    shared = (proj_saves_original_input(plan) if m.shared_ffn else 0.0) * (lin + rowwise) * m.hidden_size * on_shard
    return attn + shared + requantize_bytes(plan, transposed, split=True) * (fc1 + fc2)


def torchao_float8(plan: ParallelPlan) -> bool:
    """fp8 linears run as torchao's Float8Linear: the rowwise recipe (torchao's alone), or per-tensor scaling on
    the PyTorch-native stack (tp_impl dtensor, as torchtitan's float8 converter runs it).
    Derived: docs/formulas.md#precision.torchao_saved_input"""
    return plan.dtype == "fp8" and (plan.recipe == "rowwise" or (plan.recipe == "tensorwise"
                                                                  and plan.tp_impl == "dtensor"))


def torchao_fp8_params(plan: ParallelPlan) -> Any:
    """fp8_params on torchao's float8 stack (torchao_float8): read as torchtitan's enable_fsdp_float8_all_gather,
    where torchao keeps the original-precision weight (stored at 2 B) and casts it to float8 only for FSDP2's
    all-gather of the Float8Linear weights (torchtitan's routed experts gather bf16); check_plan's
    torchao_fp8_params_gather and fp8_params_rowwise allow it only where that gather runs. One predicate for
    model_states.bf16_gathered_params, stored_weight_bytes, stored_kept_extra_bytes and comm.torchao_fp8_gather.
    Source: pytorch/ao@36027d82d1 torchao/float8/fsdp_utils.py (WeightWithDynamicFloat8CastTensor).
    Derived: docs/formulas.md#mem.torchao_fp8_shard"""
    return plan.fp8_params & torchao_float8(plan)


def torchao_hp_saved_share(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Share of the layers whose linears save their bf16 input for backward (0 elsewhere): fp8 on the
    PyTorch-native stack (torchao_float8: torchao's Float8Linear, as torchtitan converts nn.Linear) under the
    rowwise recipe (every torchao version) or tensorwise with plan.torchao_saves_hp_input (torchao >= v0.9.0),
    on the share of layers in the low format. Tensorwise with tp > 1 runs torchtitan's float8 tensor
    parallelism, which casts each linear's input to fp8 before the gather, so the function saves that fp8 copy.
    Source: pytorch/ao@36027d82d1 torchao/float8/float8_linear.py (matmul_with_hp_or_float8_args.forward:
    ctx.save_for_backward(input_hp, weight_hp_t), the input cast inside unless tensor_already_casted_to_fp8;
    backward casts input_hp again for grad_weight), 12396c648 (v0.9.0: the tensorwise input passed in bf16),
    eab345c (tensorwise cast before manual_float8_matmul_with_args_in_float8, which saved input_fp8);
    float8_tensor_parallel.py (PrepareFloat8ModuleInput, Float8ColwiseParallel / Float8RowwiseParallel cast
    before redistribute); pytorch/torchtitan v0.2.2 models/llama3/infra/parallelize.py
    (enable_float8_tensorwise_tp = enable_float8_linear and not float8_is_rowwise).
    Derived: docs/formulas.md#precision.torchao_saved_input"""
    return torchao_hp_saves(plan) * plan.low_precision_layer_fraction(m.num_hidden_layers)


def torchao_hp_saves(plan: ParallelPlan) -> Any:
    """1 where torchao's Float8Linear saves its bf16 input on the layers in fp8 (torchao_hp_saved_share), else 0.
    Derived: docs/formulas.md#precision.torchao_saved_input"""
    if not torchao_float8(plan):
        return 0.0
    if plan.recipe == "rowwise":
        return 1.0
    return where(plan.tp > 1, 0.0, 1.0) if plan.torchao_saves_hp_input else 0.0


def torchao_fp8_copy_share(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Share of the layers whose torchao Float8Linear saves an fp8 copy of its input (the layers in fp8 on the
    PyTorch-native stack less torchao_hp_saved_share): that copy is a tensor of its own beside whatever saved
    the bf16 one (the attention core its output). Derived: docs/formulas.md#precision.torchao_saved_input"""
    if not torchao_float8(plan):
        return 0.0
    return plan.low_precision_layer_fraction(m.num_hidden_layers) - torchao_hp_saved_share(m, plan)


TORCHAO_REQUANTIZE_BYTES = {"compiled": 2.0 + 2.0 + 1.0, "eager": 6.0 + 27.0 + 2.0}
"""HBM bytes per element for torchao's Float8Linear to quantise its saved bf16 input again in backward (the
weight-gradient operand, scaled along the token dimension): compiled (torch.compile fuses the pointwise
ops and the layout into one cast kernel after the amax reduction): the amax reads the input (2), the cast
reads it (2) and writes fp8 (1) in the column-major layout _scaled_mm takes. Eager: the amax as abs (read 2,
write 2) and max (read 2); the cast as .to(float32) (2, 4), * scale (4, 4), clamp (4, 4), .to(float8)
(4, 1); the column-major copy of the fp8 operand (1, 1). Source: pytorch/ao@36027d82d1 torchao/float8/
float8_utils.py (tensor_to_amax, to_fp8_saturated), float8_training_tensor.py (_ToFloat8ConstrFunc.forward:
tensor.to(torch.float32) * scale), float8_ops.py (preprocess_addmm: b_data.t().contiguous().t()).
Derived: docs/formulas.md#precision.torchao_saved_input"""


def torchao_requantize_bytes(m: ModelSpec, plan: ParallelPlan, moe: bool, transposed: float) -> Any:
    """HBM bytes per token of the layer's s·b, over the step, one rank, of torchao's backward casts of the bf16
    inputs its Float8Linear saves (torchao_hp_saves; fp8_cast_bytes applies the layer share): one cast per
    distinct saved tensor (wq / wk / wv read one norm output, w1 / w3 another: h wide, whole under DTensor TP,
    which saves the gathered input; wo the core's output, a·d_v/t; w2 the gated product, f/t; an MoE layer's
    shared expert as a dense MLP, its routed experts not being nn.Linear), each
    TORCHAO_REQUANTIZE_BYTES (compiled with fused_kernels), less the transposed fp8 copy (`transposed`,
    Hopper's per-tensor recipe) that fp8_cast_bytes counts in forward and torchao does not write there.
    0 for a hybrid stack (not a torchtitan model). Derived: docs/formulas.md#precision.torchao_saved_input"""
    if m.is_hybrid or not torchao_float8(plan):
        return 0.0
    on = torchao_hp_saves(plan)
    per = where(plan.fused_kernels, TORCHAO_REQUANTIZE_BYTES["compiled"], TORCHAO_REQUANTIZE_BYTES["eager"])
    attn = m.hidden_size + m.num_attention_heads * attention_head_dims(m)[1] / plan.tp
    f = m.shared_ffn if moe else m.intermediate_size
    mlp = m.hidden_size + f / plan.tp if f else 0.0
    return on * (per - transposed) * (attn * attention_share(m) + mlp)


def torchao_linear_weights(m: ModelSpec, plan: ParallelPlan, moe: bool) -> Any:
    """Weight elements one rank holds of one layer's Float8Linears (torchtitan's float8 converter swaps every
    nn.Linear but the output layer): the attention projections (attention_params_per_rank less the output bias
    and q/k norms every rank holds whole; a QKV bias, where a model has one, counted in) on the attention share,
    and the dense MLP's (an MoE layer's shared expert's: the routed experts and the router are no Float8Linear)
    2 or 3 matrices of h x f/t. Derived: docs/formulas.md#precision.torchao_weight_casts"""
    f = m.shared_ffn if moe else m.intermediate_size
    attn = attention_params_per_rank(m, plan.tp) - attention_replicated_params(m)
    return attn * attention_share(m) + (3 if m.gated_mlp else 2) * m.hidden_size * f / plan.tp


def torchao_weight_cast_bytes(m: ModelSpec, plan: ParallelPlan, moe: bool) -> Any:
    """HBM bytes, one micro-batch and rank, of one layer's torchao weight casts over the step (fp8_cast_bytes
    applies the layer share and the 3 passes): Float8Linear keeps no fp8 weight across micro-batches and casts
    the bf16 weight twice in each, in forward (cast_config_weight) and for the input-gradient GEMM
    (cast_config_weight_for_grad_input), each at TORCHAO_REQUANTIZE_BYTES (an amax pass, then the cast;
    compiled with fused_kernels, eager as its ops run, where the forward operand, weight.t(), is column-major
    already and skips preprocess_addmm's copy, 2 B). None where FSDP's float8 all-gather (fp8_params) hands
    the linear an fp8 weight (tensor_already_casted_to_fp8, both passes: zero >= 2 over more than one rank, FSDP2's
    float8 all-gather; fp8_params elsewhere is check_plan's torchao_fp8_params_gather refusal); 0 off torchao and
    for a hybrid stack.
    Source: pytorch/ao@36027d82d1 torchao/float8/float8_linear.py (matmul_with_hp_or_float8_args.forward /
    backward: hp_tensor_to_float8_dynamic(weight_hp_t) unless tensor_already_casted_to_fp8), fsdp_utils.py
    (WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather / fsdp_post_all_gather), float8_ops.py
    (preprocess_addmm). Derived: docs/formulas.md#precision.torchao_weight_casts"""
    if m.is_hybrid or not torchao_float8(plan):
        return 0.0
    eager = TORCHAO_REQUANTIZE_BYTES["eager"]
    per = where(plan.fused_kernels, 2 * TORCHAO_REQUANTIZE_BYTES["compiled"], 2 * eager - TORCHAO_COLUMN_MAJOR_COPY)
    gathered = plan.fp8_params & (plan.zero >= 2) & (plan.zero_shard > 1)  # comm.torchao_fp8_gather's predicate
    return where(gathered, 0.0, per * torchao_linear_weights(m, plan, moe))


TORCHAO_COLUMN_MAJOR_COPY = 1.0 + 1.0
"""HBM bytes per element of preprocess_addmm's column-major copy of a row-major fp8 second operand (read 1,
write 1), in TORCHAO_REQUANTIZE_BYTES["eager"]; the forward weight operand (weight.t()) needs none. Source:
pytorch/ao@36027d82d1 torchao/float8/float8_ops.py (preprocess_addmm: b_data.t().contiguous().t() where
is_row_major). Derived: docs/formulas.md#precision.torchao_weight_casts"""


def fused_expert_cast_width(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Elements per token, per pass (fp8_cast_bytes' units: the step's casts over its 3 passes), of the routed
    experts' GEMM inputs that Transformer Engine's fused MXFP8 grouped MLP (cost.gemm.fused_grouped_mlp)
    quantises in its GEMMs' epilogues instead of a cast kernel: forward fc2's input, the k·f_e activation
    output, which fc1's grouped GEMM writes as MXFP8 rowwise and columnwise copies; backward fc1's output
    gradient, c·k·f_e (c = 2 for a GLU, 1 for squared ReLU), which fc2's dgrad GEMM writes quantised after the
    dGLU / dSReLU. Together (1 + c)·k·f_e / 3: all the f_e-wide casts of moe_mlp_cast_bytes' k rows. fc1's
    input and fc2's output gradient are still cast by kernels (group_quantize). 0 off the fused path.
    Source: NVIDIA/TransformerEngine transformer_engine/pytorch/ops/fused/forward_grouped_mlp.py (d_tensor,
    d_col_tensor of grouped_gemm_glu_wrapper_sm100) and backward_grouped_mlp.py (d_row_tensor, d_col_tensor of
    grouped_gemm_dglu_wrapper_sm100; group_quantize of fc2's dy) at v2.16. Derived: docs/formulas.md#moe.fused_mlp"""
    c = 2 if m.gated_mlp else 1
    return where(fused_grouped_mlp(m, plan), (1 + c) * m.num_experts_per_tok * m.expert_ffn / 3, 0.0)


def latent_proj_cast_width(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Elements per token, per pass (fp8_cast_bytes' units), that a latent MoE's two projections quantise:
    fc1_latent_proj (h -> l) and fc2_latent_proj (l -> h) are Transformer Engine Linear modules under the
    recipe's autocast, each casting its input in forward (h, l) and its output gradient in backward (l, h):
    2(h + l) over the step. They run on the rank's sequence shard (parallel_mode "duplicated" after the SP
    scatter), so per token of the layer's s·b a 1/t share under SP. 0 without a latent width or where the plan
    keeps them in bf16 (bf16_modules "latent_proj"). Source: NVIDIA/Megatron-LM
    megatron/core/transformer/moe/moe_layer.py at d98e8a6 (fc1_latent_proj, fc2_latent_proj: TELinear);
    NVIDIA/TransformerEngine transformer_engine/pytorch/module/linear.py (input and grad_output quantised).
    Derived: docs/formulas.md#moe.latent_casts"""
    if not m.moe_latent_size or "latent_proj" in plan.bf16_modules:
        return 0.0
    return 2 * (m.hidden_size + m.moe_latent_size) / 3 / where(plan.sp, plan.tp, 1)


def block_cast_widths(shapes: list[tuple[Any, Any]], h: int) -> tuple[Any, float]:
    """(local elements, h-wide inputs) per token that one sub-block's chain of Transformer Engine linears,
    (K, N) each on a TP rank, casts over the step: forward every GEMM input (K), backward every output
    gradient (N). The hidden-state inputs (K = h, all but the last GEMM, whose K is the rank's own width) are
    counted apart, in units of h, and so is the last GEMM's output gradient (N = h, one per sub-block);
    the rest is local. Derived: docs/formulas.md#mixers.casts"""
    *first, (k_last, _) = shapes
    h_in = [isinstance(K, (int, float)) and K == h for K, _ in first]
    local = sum(N for _, N in first) + k_last + sum(K for (K, _), wide in zip(first, h_in, strict=True) if not wide)
    return local, float(sum(h_in))


def hybrid_cast_widths(m: ModelSpec, t: Any, moe: bool) -> tuple[Any, float, float]:
    """(local elements, h-wide inputs, h-wide output gradients) cast per token by a hybrid stack's average
    layer over the step, by sub-block kind (block_cast_widths of its projections), each at its share of the
    layers: softmax attention (attention_shapes), the Mamba-2 and linear-attention mixers (recurrent_gemm_shapes;
    Mamba-2: in_proj h -> 2HP + 2GN + H, out_proj HP -> h, so forward h + HP, backward h + 2HP + 2GN + H) and a
    dense MLP (fc1, fc2) where the layer holds one; an MoE layer's MLP is counted apart (moe_mlp_cast_bytes).
    Source: NVIDIA/Megatron-LM megatron/core/ssm/mamba_mixer.py (in_proj and out_proj, the mixer's only
    Transformer Engine linears; the convolution and SSD kernels run in bf16). Derived: docs/formulas.md#mixers.casts"""
    h = m.hidden_size
    rec = recurrent_gemm_shapes(m, t)
    blocks = [(attention_share(m), attention_shapes(m, t))]
    blocks += [(w, [(K1, N1), (K2, N2)]) for (K1, N1, w), (K2, N2, _) in zip(rec[::2], rec[1::2], strict=True)]
    if not moe and dense_mlp_share(m):
        f = m.intermediate_size / t
        blocks.append((dense_mlp_share(m), [(h, f * (2 if m.gated_mlp else 1)), (f, h)]))
    local: Any = 0.0
    inputs = grads = 0.0
    for w, shapes in blocks:
        lo, wide = block_cast_widths(shapes, h)
        local, inputs, grads = local + w * lo, inputs + w * wide, grads + w
    return local, inputs, grads


def bf16_kernel_format(plan: ParallelPlan) -> str:
    """The format of the kernels a low-precision recipe leaves in bf16 (attention, the output layer): bf16
    under one, else the plan's dtype (the same rule as ParallelPlan.mfu_format, for another reason).
    Source: NVIDIA/TransformerEngine transformer_engine/common/recipe/__init__.py (fp8_dpa False by default in
    every recipe: attention outside FP8, ParallelPlan.fp8_attention); output_seconds (the output layer).
    Derived: docs/formulas.md#precision"""
    return "bf16" if plan.low_precision else plan.dtype
