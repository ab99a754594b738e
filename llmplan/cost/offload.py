"""Activation offload to host memory (ParallelPlan.offload_layers): what leaves HBM and what the copies cost.

Megatron-Core's layer-level offload (--cpu-offloading-num-layers N) runs every transformer layer under
Transformer Engine's CPU-offload context: the saved activations of the first N layers are copied to pinned host
memory on a side stream during forward and copied back during backward, beside the compute. Transformer
Engine's default schedule (transformer_engine/pytorch/cpu_offload.py, DefaultOffloadSynchronizer, TE >= 2.10)
lets layer i's copy run until layer L - N + i starts its forward, and starts its reload L - N - 1 layers
before its backward, so that at most L - N layers' activations are on the GPU at once.

All functions are pure and work elementwise on plan arrays (llmplan/arith.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llmplan.arith import maximum, minimum, where
from llmplan.cost.activations import (dispatched_rows, layer_activation_parts, layer_activations, quantized_saved_bytes,
                                      saved_input_discount)
from llmplan.cost.mixers import attention_share
from llmplan.cost.flops import layer_flops, routed_expert_flops
from llmplan.cost.params import stage_layers
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan


def offloaded_share(plan: ParallelPlan, layers: Any) -> Any:
    """Share of a stage's transformer-layer activations (one micro-batch) that sit in host memory at the peak,
    the end of the forward pass: N of its L layers, the average layer's bytes each (exact for a stack of
    identical layers). Source: NVIDIA/TransformerEngine transformer_engine/pytorch/cpu_offload.py
    (get_cpu_offload_context: activation memory (num_layers - num_offloaded_layers) x T).
    Derived: docs/formulas.md#mem.offload"""
    return where(layers > 0, minimum(plan.offload_layers, layers) / maximum(layers, 1), 0.0)


def offload_layer_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Bytes of one average layer's saved activations of one micro-batch: what one offloaded layer copies to
    host memory in forward and back in backward (offload runs without pipeline stages, check_plan, so the
    stage is the whole stack). 0 without offload. Derived: docs/formulas.md#mem.offload"""
    if not plan.offload_layers:
        return 0.0
    la = layer_activations(m, plan)
    n_dense, n_moe = stage_layers(m, plan, 0)
    return (n_dense * la.dense + n_moe * la.moe) / maximum(n_dense + n_moe, 1)


def offload_exposed(m: ModelSpec, plan: ParallelPlan, copy_s: Any, pass_s: Any) -> Any:
    """Seconds one pass (forward or backward) of one micro-batch waits for the offload copies. The pass runs
    L layers of t = pass_s / L each; the N = offload_layers copies (copy_s each) run one after another on a
    side stream. Forward: layer q's copy to host starts when its compute ends, and layer L - N + q starts only
    when it is done. Backward, in backward order: the reload of layer N - 1 - q starts as step q + 1 begins,
    and that layer's backward, step L - N + q, waits for it. Both: the q-th copy is released at the end of
    step q and due before step q + 1 + g, g = L - N - 1; a late copy holds the compute back, which delays the
    later releases. Walked layer by layer (elementwise on arrays): exact for that schedule.
    Source: NVIDIA/TransformerEngine transformer_engine/pytorch/cpu_offload.py (DefaultOffloadSynchronizer:
    finish_offload_map, start_reload_map). Derived: docs/formulas.md#mem.offload"""
    L = m.num_hidden_layers
    n = min(int(plan.offload_layers), L - 1)
    t = pass_s / L
    gap = L - n - 1
    end, free, waited = 0.0 * t, 0.0 * t, 0.0 * t
    done: list[Any] = []  # when each copy is done
    for k in range(L if n > 0 else 0):
        if 0 <= k - gap - 1 < n:  # this layer waits for copy k - gap - 1
            late = maximum(done[k - gap - 1] - end, 0.0)
            waited, end = waited + late, end + late
        end = end + t
        if k < n:
            free = maximum(free, end) + copy_s
            done.append(free)
    return waited


def host_offload_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Bytes of host memory one GPU's offloaded activations take at the peak (the end of the forward pass): N of
    the L layers at offload_layer_bytes each, one micro-batch in flight (offload runs without pipeline stages,
    check_plan). Equals ActivationBytes.offloaded of training_memory (tested); the GPUs of a node share its
    host memory (SystemSpec.host_usable_bytes, check_plan rule offload_host_memory).
    Derived: docs/formulas.md#mem.host"""
    return offload_layer_bytes(m, plan) * minimum(plan.offload_layers, m.num_hidden_layers)


def offloads_moe_act(m: ModelSpec, plan: ParallelPlan) -> bool:
    """Whether the plan's fine-grained offload moves anything out of an MoE layer's MLP: moe_act
    (ParallelPlan.offload_moe_act), expert_fc1 or mlp_norm in ParallelPlan.offload_modules, on a model with expert
    layers (a dense model has no such group). Derived: docs/formulas.md#mem.offload_moe_act"""
    return bool(m.is_moe and any(plan.offloads(x) for x in ("moe_act", "expert_fc1", "mlp_norm")))


def expert_fc1_offload_bytes(m: ModelSpec, plan: ParallelPlan, held: bool = False) -> Any:
    """Bytes expert_fc1 copies to host memory per MoE layer per micro-batch, each way: fc1's saved input on the
    rank's dispatched (token, expert) rows, expert_width wide. Megatron makes fc1 save its original bf16 input
    for the copy (set_save_original_input) except under MXFP8 / NVFP4, whose quantised copy moves
    (quantized_saved_bytes). `held`: the bytes of it the GPU kept as activations price it (2 less
    saved_input_discount: what the offload frees). 0 without expert_fc1 in ParallelPlan.offload_modules.
    Source: NVIDIA/Megatron-LM megatron/core/transformer/moe/experts.py at d98e8a64dd (expert_fc1_manager wraps
    linear_fc1 on permuted_local_hidden_states; set_save_original_input unless mxfp8 / nvfp4).
    Derived: docs/formulas.md#mem.offload_modules"""
    if not (m.is_moe and plan.offloads("expert_fc1")):
        return 0.0
    mx = plan.low_precision and plan.recipe in ("mxfp8", "nvfp4")
    per = (2.0 - saved_input_discount(m, plan)) if held else (quantized_saved_bytes(plan) if mx else 2.0)
    return per * dispatched_rows(m, plan) * m.expert_width


def norm_input_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Bytes of one norm's saved input (the residual stream, bf16), one micro-batch, one rank: 2sbh / t with
    sequence parallelism. Derived: docs/formulas.md#mem.offload_modules"""
    return 2.0 * plan.seq_len / plan.cp * plan.micro_batch * m.hidden_size / where(plan.sp, plan.tp, 1)


def moe_layer_offload_bytes(m: ModelSpec, plan: ParallelPlan, held: bool = False) -> Any:
    """Bytes one MoE layer's fine-grained offload groups copy to host memory per micro-batch, each way: mlp_norm
    (the pre-MLP norm's input: the norm is separate in an MoE layer), expert_fc1, moe_act. `held`: what the GPU
    frees (expert_fc1_offload_bytes). Derived: docs/formulas.md#mem.offload_modules"""
    if not offloads_moe_act(m, plan):
        return 0.0
    norm = norm_input_bytes(m, plan) if plan.offloads("mlp_norm") else 0.0
    return norm + expert_fc1_offload_bytes(m, plan, held) + moe_act_offload_bytes(m, plan)


def attention_offload_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Bytes one attention layer's fine-grained offload groups copy to host memory per micro-batch, each way:
    attn_norm the input norm's input (where the norm is separate: MLA; Transformer Engine fuses it into the QKV
    LayerNormLinear otherwise, an IdentityOp Megatron skips), qkv_linear the QKV input (with a fused norm, the
    LayerNormLinear's saved input too), core_attn Q, K, V (and an unfused core's scores), attn_proj the core's
    output (it needs core_attn: check_plan). Source: NVIDIA/Megatron-LM megatron/core/transformer/
    transformer_layer.py (_set_offload_modules), attention.py at d98e8a64dd.
    Derived: docs/formulas.md#mem.offload_modules"""
    at = attention_share(m)
    if at <= 0 or not any(plan.offloads(x) for x in ("attn_norm", "qkv_linear", "core_attn", "attn_proj")):
        return 0.0
    parts = layer_activation_parts(m, plan, False)  # per average layer; the attention parts alike in every layer
    separate = m.is_mla
    norm = norm_input_bytes(m, plan)
    out = (norm if plan.offloads("attn_norm") and separate else 0.0) \
        + ((parts.attn_input / at + (0.0 if separate else norm)) if plan.offloads("qkv_linear") else 0.0) \
        + ((parts.qkv + parts.scores) / at if plan.offloads("core_attn") else 0.0) \
        + (parts.attn_out / at if plan.offloads("attn_proj") else 0.0)
    return out


def fine_grained_offloaded(m: ModelSpec, plan: ParallelPlan, n_dense: Any, n_moe: Any, inflight: Any
                           ) -> tuple[Any, Any]:
    """(HBM freed, host bytes) of fine-grained offload at the peak, one rank: every group of the micro-batches in
    flight but the last one per module name (moe_act_offloaded_groups): the MoE layers' groups and the attention
    layers' (attention_share of the layers). Derived: docs/formulas.md#mem.offload_modules"""
    layers = (n_dense + n_moe) * attention_share(m)
    attn = attention_offload_bytes(m, plan) * moe_act_offloaded_groups(layers, inflight)
    moe = moe_act_offloaded_groups(n_moe, inflight)
    return moe_layer_offload_bytes(m, plan, True) * moe + attn, moe_layer_pinned_bytes(m, plan) * moe + attn


def pinned_block_bytes(n: Any) -> Any:
    """Bytes of pinned host memory PyTorch's caching host allocator takes for a request of n bytes: the next power
    of two (0 for 0), elementwise. Every `torch.empty(..., pin_memory=True)` goes through it; a freed block is
    cached and reused by a later request of the same rounded size, never returned (no empty_cache call), so the
    host memory held is the peak count of live blocks times their rounded size. Rounding is on by default
    (pinned_max_round_threshold and pinned_max_cached_size unset: SIZE_MAX).
    Source: pytorch/pytorch v2.13.0 (cf30153c4c) aten/src/ATen/core/CachingHostAllocator.h
    (CachingHostAllocatorImpl::allocate: roundSize = c10::llvm::PowerOf2Ceil(size), then
    allocate_host_memory(roundSize)), c10/core/AllocatorConfig.h (the two thresholds' defaults).
    Derived: docs/formulas.md#mem.host"""
    x = np.asarray(n, dtype=float)
    r = np.where(x > 0, np.exp2(np.ceil(np.log2(np.maximum(x, 1.0)))), 0.0)
    return float(r) if r.ndim == 0 else r


def moe_layer_pinned_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Pinned host bytes one MoE layer's fine-grained offload groups hold per micro-batch: each group's one
    tensor (mlp_norm's input, expert_fc1's bf16 input, moe_act's fc1 output) rounded up by the caching host
    allocator (pinned_block_bytes); an MXFP8 / NVFP4 expert_fc1 input (a quantised tensor of data and scale
    parts) at its raw bytes. These groups bypass the offload's shape-keyed CPU pool and take a fresh pinned
    tensor per copy. Source: NVIDIA/Megatron-LM megatron/core/pipeline_parallel/fine_grained_activation_offload.py
    at cd4afffa6 (OffloadTensorGroup.__init__: use_cpu_pool False for expert_fc1, moe_act, fused_group_mlp;
    ChunkOffloadHandler.offload: torch.empty(..., pin_memory=True)). Derived: docs/formulas.md#mem.host"""
    if not offloads_moe_act(m, plan):
        return 0.0
    norm = pinned_block_bytes(norm_input_bytes(m, plan)) if plan.offloads("mlp_norm") else 0.0
    fc1 = expert_fc1_offload_bytes(m, plan)
    mx = plan.low_precision and plan.recipe in ("mxfp8", "nvfp4")
    return norm + (fc1 if mx else pinned_block_bytes(fc1)) + pinned_block_bytes(moe_act_offload_bytes(m, plan))


def moe_act_offload_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Bytes one MoE layer's fine-grained offload copies to host memory per micro-batch, each way: the experts'
    fc1 output, bf16 (2 bytes) on each of the rank's dispatched (token, expert) rows, f_e / etp wide (2 f_e / etp
    with a GLU: gate and up; the GEMM writes bf16 under every recipe; its quantised input stays). 0 without
    ParallelPlan.offload_moe_act.
    Source: NVIDIA/Megatron-LM megatron/core/transformer/moe/experts.py at 2a75ac12c (moe_act's group starts at
    fc1's output; fused_group_mlp offloads the fused op's saved tensors of min_offloaded_tensor_size elements
    or more). Derived: docs/formulas.md#mem.offload_moe_act"""
    if not (m.is_moe and plan.offloads("moe_act")):
        return 0.0
    width = (2 if m.gated_mlp else 1) * m.expert_ffn
    return 2.0 * dispatched_rows(m, plan) * width / plan.etp_resolved


def moe_act_offloaded_groups(n_moe: Any, inflight: Any) -> Any:
    """MoE layers whose fc1 output sits in host memory at the peak: every MoE layer of the micro-batches in
    flight but one, the last in forward order, which the manager keeps on the GPU so that its reload cannot
    hold the backward up (post_warmup_callback: the offload margin, one group per module name).
    Source: NVIDIA/Megatron-LM megatron/core/pipeline_parallel/fine_grained_activation_offload.py at 2a75ac12c.
    Derived: docs/formulas.md#mem.offload_moe_act"""
    return maximum(inflight * n_moe - 1, 0)


def expert_flop_share(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Share of an MoE layer's matmul and attention FLOPs in its routed experts (k experts per token): the
    share of an MoE layer's backward its expert MLP takes, read as a share of time.
    Derived: docs/formulas.md#mem.offload_moe_act"""
    f = layer_flops(m, plan, True)
    return minimum(routed_expert_flops(m, plan) / maximum(f.gemm + f.attention, 1e-30), 1.0)


def moe_act_offload_exposed(copy_s: Any, step_s: Any, copies: Any, window_s: Any) -> Any:
    """Seconds one pass of one micro-batch waits for the fine-grained offload copies. The pass is a run of steps
    of step_s, one per MoE layer; copy q (q < copies) is released at the end of step q onto one stream (a copy
    stream runs its copies in order) and is due window_s later (window_s <= step_s: before the next copy is
    released); a late copy holds the compute back, and with it the later releases. Forward: the
    D2H copy is issued as the expert MLP ends and, with at most one copy in flight per group name (the
    GB200 preset's fine_grained_offloading_max_inflight_offloads 1), joined at the next MoE layer's: window
    one step (without the cap the copy is due only at its reload; a bound). Backward: a group's reload is
    issued as the next-later MoE layer's expert MLP backward ends and joined before its own: window one step
    less the expert MLP's backward. Walked copy by copy (elementwise on arrays, `copies` too: each plan stops at
    its own count).
    Source: NVIDIA/Megatron-LM megatron/core/pipeline_parallel/fine_grained_activation_offload.py at 2a75ac12c
    (on_group_commit_forward, _drain_offload_pending, on_group_start_backward, bulk_reload,
    on_group_commit_backward). Derived: docs/formulas.md#mem.offload_moe_act"""
    free, waited = 0.0 * step_s, 0.0 * step_s
    count = np.asarray(copies)
    for q in range(int(np.max(count, initial=0))):  # the longest walk; a plan with fewer copies stops early
        release = (q + 1) * step_s + waited  # the waits so far came before this release (window <= step)
        free = maximum(free, release) + copy_s
        late = where(q < count, maximum(free - (release + window_s), 0.0), 0.0)
        waited = waited + late
    return waited


def fine_grained_host_bytes(m: ModelSpec, plan: ParallelPlan, inflight: Any) -> Any:
    """Host bytes one GPU's fine-grained offload takes at the peak, on the first pipeline stage (the most micro-
    batches in flight, `inflight`): fine_grained_offloaded's host part. Equals ActivationBytes.offloaded of
    that stage (tested); check_plan rule offload_modules_host_memory. Derived: docs/formulas.md#mem.host"""
    n_dense, n_moe = stage_layers(m, plan, 0)
    return where(plan.full, 0.0, fine_grained_offloaded(m, plan, n_dense, n_moe, inflight)[1])
