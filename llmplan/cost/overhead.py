"""Time per training step outside the model's kernels and collectives: the host's kernel launches and waits
the GPU idles for, and the stragglers of a large job (step overhead; called by cost.step.step_time).

Works on one ParallelPlan and, elementwise, on plan arrays (see llmplan/arith.py).
"""

from __future__ import annotations

from typing import Any

from llmplan.arith import expected_max_normal, maximum, minimum, where
from llmplan.cost.comm import STAGED_GATHER_BYTES, megatron_fsdp_mxfp8_cast, mxfp8_staged_gather
from llmplan.cost.compute import KERNEL_LAUNCH_S, optimizer_queued_share
from llmplan.cost.model_states import bf16_parts_extra_bytes, grad_prescaled
from llmplan.cost.moe import EAGER_OP_HOST_S, HOST_SYNC_S, MOE_CYCLE_HOST_OPS, MOE_POST_SYNC_HOST_OPS
from llmplan.cost.stages import mtp_weight_sets
from llmplan.specs.hardware import GpuSpec
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan
from llmplan.units import MXFP8_BYTES

GPU_SPEED_SPREAD = 0.012
"""Standard deviation of one GPU's sustained speed around its fleet's mean, as a fraction. Sinha et al. 2022
("Not All GPUs Are Created Equal", SC'22, abstract) measure an 8% average performance variation (22% at most)
among the identical GPUs of each of five clusters of hundreds to thousands of GPUs; read as the range of
about 1,000 normal draws (2 x 3.24 standard deviations, expected_max_normal), that is 1.2%.
Derived: docs/formulas.md#step.overhead"""
LAYER_KERNELS = 12
"""Kernels one transformer layer launches in a forward pass with fused kernels: four GEMMs (QKV, output
projection, the two MLP GEMMs; the gate fused with the up projection), the attention kernel, and about seven
memory-bound ones (two norms, rotary, activation, two residual adds, a cast); the TP collectives come on top
(two per layer). Backward launches about twice as many, recompute one forward more. Priced only where
host_seconds is given no model's count: the step prices cost.kernels' structural count
(docs/formulas.md#step.kernel_count)."""

EAGER_LAYER_KERNELS = 36
"""Kernels one dense transformer layer launches in a forward pass as PyTorch eager ops (ParallelPlan.fused_kernels
False: torchtitan without torch.compile), in place of LAYER_KERNELS: two RMSNorms of eight each (the fp32 cast,
pow, mean, the eps add, rsqrt, the product, the cast back, the weight's product), the q, k and v projections (3),
the rotary on q and k (the fp32 cast, the complex product, the cast back: 6), repeat_kv's copies of k and v (2),
the attention kernel, the output projection, w1, w3, silu, their product and w2 (5), two residual adds.
Source: pytorch/torchtitan torchtitan/models/llama/model.py and models/norms.py at 9dec370 (TransformerBlock,
Attention, FeedForward, RMSNorm), counted along one forward. Derived: docs/formulas.md#compute.eager_ops"""

CP_STEP_KERNELS = 4
"""Launches per ring step of a context-parallel attention forward, in place of the one attention kernel: the
send and receive of the next K/V (one NCCL group call), the step's attention kernel, the merge of its
log-sum-exp and the merge of its partial output into the layer's. Source: Transformer Engine attention
context_parallel.py (AttnFuncWithCPAndKVP2P.forward: flash_attn_p2p_communicate, the per-step attention
call, flash_attn_fwd_softmax_lse_correction, flash_attn_fwd_out_correction), counted along one step.
Derived: docs/formulas.md#step.overhead"""

MOE_LAYER_KERNELS = 14
"""Kernels a dropless MoE layer's forward launches beyond a dense layer's LAYER_KERNELS, in Megatron-Core with
the fused router, permute and grouped GEMM: the router GEMM, the fused top-k and its auxiliary loss (2), the
token counts and their gather over the EP group (2), the copy of the counts to the host, the permute, the two
all-to-alls, the sort of the received rows by local expert and its inverse, the unpermute, and the quantisation
of the two grouped GEMMs' inputs (2); the two grouped GEMMs and the activation take the dense MLP's three
places. Source: Megatron-LM megatron/core/transformer/moe/ (router.py, token_dispatcher.py, experts.py) at
d98e8a6, counted along the forward. Derived: docs/formulas.md#step.host_sync. Like LAYER_KERNELS, priced only
where host_seconds is given no model's count (cost.kernels.layer_launch_average)."""
P2P_CHUNK_LAUNCHES = 4
"""NCCL calls a pipeline rank launches per model chunk and micro-batch beside the chunk's kernels: after its
forward the send of the output and the receive of the next input, after its backward the same for the
gradients (Megatron-LM's interleaved schedule with overlap_p2p_comm posts each isend / irecv on its own,
_p2p_ops), so a rank of v chunks launches 4v per micro-batch, however few layers a chunk holds.
Source: NVIDIA/Megatron-LM megatron/core/pipeline_parallel/schedules.py and p2p_communication.py at
core_r0.9.0 (send_forward_recv_forward, send_backward_recv_backward per chunk pass).
Derived: docs/formulas.md#step.pp_critical"""
GRAPH_LAUNCHES = 2
"""Graph launches per layer's forward under per-layer CUDA graphs (cuda_graphs "layers"): the attention part and
the MLP (a dense layer) or the router and preprocessing (a MoE layer), one launch each."""
GRAPHED_MOE_EAGER = 8
"""Kernels of a MoE layer's forward that stay eager under per-layer CUDA graphs: the permute, all-to-alls, grouped
GEMMs, activation and unpermute after the host's wait."""
GRAPHED_LAYER_KERNELS = GRAPH_LAUNCHES + GRAPHED_MOE_EAGER
"""Launches left per MoE layer's forward under per-layer CUDA graphs."""

FULL_GRAPH_LAUNCHES = 1
"""Host launches at the start of a step under a full-iteration CUDA graph (cuda_graphs "full-iteration"), where
eager and per-layer-graph steps launch their first layer: the graph's one replay. FullCudaGraphWrapper's data_read
copies every micro-batch's inputs into the graph's static buffers before it (StaticBufferLoader: a copy_ per sample
tensor between two wait_stream calls), but the host issues those right after the previous step's optimizer read
the gradient norm back (clip_grads.py get_grad_norm_fp32 .item(), then step_with_ready_grads launches the update),
while the GPU still runs that update: not priced. Source: NVIDIA/Megatron-LM megatron/core/full_cuda_graph.py,
megatron/core/optimizer/optimizer.py and clip_grads.py at d98e8a6. Derived: docs/formulas.md#step.host_sync"""


def straggler_seconds(plan: ParallelPlan, busy: Any) -> Any:
    """Time the job loses to its slowest GPU: every collective waits for the last rank to arrive, and the
    GPUs of one type differ in sustained speed by GPU_SPEED_SPREAD (one standard deviation), so a step whose
    GPUs compute for `busy` seconds takes busy x spread x E[max of N normal draws] longer with N GPUs.
    Derived: docs/formulas.md#step.overhead"""
    return busy * GPU_SPEED_SPREAD * expected_max_normal(plan.num_gpus)


def grad_buffer_seconds(plan: ParallelPlan, params_on_rank: Any, gpu: GpuSpec) -> Any:
    """Seconds per step of Megatron-LM's DDP passes over the rank's gradient buffer before each data-parallel
    reduction, on the compute stream: the NaN check's norm of every bucket (grad_nan_check: one read) and the
    1/(dp x cp) pre-scaling (grad_prescale, or grad_reduce_fp32_sum where it acts: grad_prescaled; a read and a
    write), each grad_bytes per parameter of the rank, once
    per step (ZeRO 0/1, or any pipeline: one reduction per step) or once per micro-batch (ZeRO-2/3 without a
    pipeline reduce every micro-batch), at the GPU's achieved HBM bandwidth. The host's wait on each bucket's
    norm is not priced (about HOST_SYNC_S + EAGER_OP_HOST_S per bucket).
    Source: NVIDIA/Megatron-LM megatron/core/distributed/param_and_grad_buffer.py at core_r0.8.0
    (Bucket.start_grad_sync: grad_data.norm, grad_data *= gradient_scaling_factor).
    Derived: docs/formulas.md#step.grad_buffer"""
    passes = where(plan.grad_nan_check, 1, 0) + where(grad_prescaled(plan), 2, 0)
    reductions = where(plan.sharded_per_microbatch, plan.num_microbatches, 1)
    return passes * reductions * plan.grad_bytes * params_on_rank / gpu.hbm_achieved_bytes_per_s


def zero3_copy_out_seconds(plan: ParallelPlan, params_on_rank: Any, gpu: GpuSpec, kept_on_rank: Any = 0.0) -> Any:
    """Seconds per step of FSDP2's all-gather copy-out (plan.zero3_copy_out) on the compute stream: every gather's
    weight_bytes per parameter of the rank read from the flat all-gather buffer and written into the parameters,
    at the GPU's achieved HBM bandwidth; two gathers a micro-batch without a pipeline (forward, and backward after
    reshard_after_forward), one a step with one (the weights stay gathered across the micro-batches: torchtitan
    reshard_after_forward = not pp_enabled). The reduce-scatter's copy-in runs on its own stream and is not priced.
    Source: pytorch/pytorch torch/distributed/_composable/fsdp/_fsdp_collectives.py (foreach_all_gather_copy_out:
    split_with_sizes_copy after the all-gather event, on the current stream). Under fp8_params `kept_on_rank` of
    the parameters (cost.model_states.bf16_gathered_params: the kept ones, on torchao the experts too) are gathered
    and copied at 2 bytes (bf16_parts_extra_bytes).
    Derived: docs/formulas.md#step.zero3_copy_out, docs/formulas.md#mem.fp8_param_bf16_parts"""
    gathers = where(plan.gathered_per_microbatch, 2 * plan.num_microbatches, 1)
    on = plan.zero3_copy_out & (plan.zero >= 3) & (plan.dp * plan.cp > 1)
    copied = plan.weight_bytes * params_on_rank + bf16_parts_extra_bytes(plan) * kept_on_rank
    return where(on, gathers * 2 * copied / gpu.hbm_achieved_bytes_per_s, 0.0)


MXFP8_UNSTAGE_BYTES = STAGED_GATHER_BYTES + 2 * MXFP8_BYTES + STAGED_GATHER_BYTES
"""HBM bytes a weight costs after Megatron-Core's staged MXFP8 gather (mxfp8_param_unstage_seconds): read its
bf16 value, write the MXFP8 rowwise and columnwise copies (E8M0 scale per 32 each), zero its bf16 slice."""


def mxfp8_param_unstage_seconds(plan: ParallelPlan, weights: Any, gpu: GpuSpec) -> Any:
    """Seconds per step, on the compute stream, of casting the bf16 weights Megatron-Core's distributed
    optimizer gathers for MXFP8 parameters (param_gather_bytes) into the rank's MXFP8 weights and zeroing the
    gradient buffer's slice they were gathered into: MXFP8_UNSTAGE_BYTES per low-precision weight of the rank
    (`weights`, cost.model_states.low_precision_weights), once a step (the gather is one a step), at the GPU's
    achieved HBM bandwidth. It runs in finish_param_sync, from the forward pre-hook after the bucket's gather
    completes (or in start_param_sync after a synchronous one), on the current stream; a data-parallel group of
one rank stages and casts alike.
    Source: NVIDIA/Megatron-LM megatron/core/distributed/param_and_grad_buffer.py at 0d8e0714cd ("The
    parameters are cast from bf16 to MXFP8 during copy": param.data.copy_(param_slice), then
    bucket.param_data.zero_()) .. 2a75ac12c (_post_param_sync: copy_tensors_to_quantized_params, then
    bucket.param_data.zero_()). Derived: docs/formulas.md#step.mxfp8_param_unstage"""
    return where(mxfp8_staged_gather(plan), MXFP8_UNSTAGE_BYTES * weights / gpu.hbm_achieved_bytes_per_s, 0.0)


MXFP8_CAST_VIEW_OPS = 3 + 4
"""Eager view operators per MXFP8 weight of the rank, its shard empty or not, before the amax all-reduce of
Megatron-FSDP's cast of the updated fp32 master shards into MXFP8 weights (mxfp8_master_cast_seconds):
copy_main_weights_to_model_weights slices the weight's shard out of the model, transpose and main weight buffers
(3 get_item), then Transformer Engine's _cast_master_weights_to_fp8_mxfp8_scaling slices and reshapes its rowwise
and columnwise amax views out of the packed buffer (4) in its first loop. Source: NVIDIA/Megatron-LM
megatron/core/distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py at cd4afffa6
(copy_main_weights_to_model_weights, DataParallelBuffer.get_item); NVIDIA/TransformerEngine
transformer_engine/pytorch/tensor/utils.py at v2.14 - v2.17.1 (_cast_master_weights_to_fp8_mxfp8_scaling).
None launches a kernel; each is charged EAGER_OP_HOST_S, a kernel-launching operator's time, standing in for the
view and the per-weight Python around it, which is not counted apart (docs/validation.md#grace-host-tp2: charged
at kernel launches only the Ultra rows move 10 points away from their measurements).
Derived: docs/formulas.md#step.mxfp8_master_cast"""
MXFP8_CAST_SHARD_OPS = 2
"""Kernel-launching operators per MXFP8 weight overlapping the rank's main-weight shard, before the amax
all-reduce: quantize_master_weights' master_weight.to(model_weight.dtype) (an fp32 -> bf16 copy) and the first
loop's mxfp8_scaling_compute_partial_amax; the second loop's mxfp8_scaling_partial_cast is issued after the
all-reduce, behind it (not counted). Source: as MXFP8_CAST_VIEW_OPS (quantize_master_weights: master_weight is
None where model_param.numel() == 0). Derived: docs/formulas.md#step.mxfp8_master_cast"""
BF16_CAST_VIEW_OPS = 2
"""Eager operators per non-MXFP8 parameter of the rank in copy_main_weights_to_model_weights: get_item of its
model and main weight buffers; one overlapping the rank's shard adds main_weight.view and model_param.copy_
(BF16_CAST_SHARD_OPS). Source: as MXFP8_CAST_VIEW_OPS. Derived: docs/formulas.md#step.mxfp8_master_cast"""
BF16_CAST_SHARD_OPS = 2
"""main_weight.view and model_param.data.copy_ of a non-MXFP8 parameter overlapping the rank's shard."""
RECURRENT_SMALL_TENSORS = 7
"""Non-GEMM parameters of a Mamba-2 (or linear-attention) mixer: the pre-norm weight fused into in_proj
(layer_norm_weight), conv1d weight and bias, A_log, D, dt_bias, the gated norm's weight. Source: NVIDIA/Megatron-LM
megatron/core/ssm/mamba_mixer.py at cd4afffa6. Derived: docs/formulas.md#step.mxfp8_master_cast"""


def mxfp8_cast_tensors(m: ModelSpec, plan: ParallelPlan) -> tuple[Any, Any, Any]:
    """(dense MXFP8 weights, routed-expert MXFP8 weights, other parameters) whose tensors a rank holds, the layers
    spread evenly over the pp stages. MXFP8: 2 per mixer layer (attention's QKV and output projections, Mamba-2's
    or a linear-attention mixer's in- and out-projections; MLA's down / up projections 2 or 3 more), 2 per dense
    MLP, per MoE layer 2 per local routed expert (TE GroupedLinear registers weight0 .. weight{E-1} unless
    moe_single_grouped_weight, default off) plus 2 for a shared expert and 2 for a latent MoE's projections; per
    MTP module (one under mtp_repeated_layer) its eh_proj and one attention and MLP / MoE layer's; the bf16 layers
    (bf16_layers_start / _end) and bf16_modules hold none. Other: every layer's norms (a Mamba-2 mixer's
    RECURRENT_SMALL_TENSORS), q/k norms, router weight and expert bias; embedding, final norm, output layer;
    the bf16 layers' and modules' GEMM weights (biases not counted).
    Source: NVIDIA/TransformerEngine transformer_engine/pytorch/module/grouped_linear.py at v2.17.1
    (register_parameter(f"weight{i}"), single_grouped_weight False); NVIDIA/Megatron-LM
    megatron/core/extensions/transformer_engine.py at cd4afffa6 (moe_single_grouped_weight, default False).
    Derived: docs/formulas.md#step.mxfp8_master_cast"""
    attn = 2 + (0 if m.mla is None else (3 if m.q_lora_rank else 2))
    attn_mx = 0 if "attention" in plan.bf16_modules else attn
    latent_mx = 2 * (m.moe_latent_size is not None) * ("latent_proj" not in plan.bf16_modules)
    latent_bf = 2 * (m.moe_latent_size is not None) - latent_mx
    n_attn, n_moe = m.num_attention_layers, m.num_moe_layers
    n_rec = m.num_hidden_layers - m.count_layers("none") - n_attn
    attn_small = 1 + 2 * m.qk_norm + (0 if m.mla is None else 1 + (m.q_lora_rank is not None))
    moe_small = 2 + m.expert_bias
    dense_l = 2 * n_rec + attn_mx * n_attn + 2 * m.num_mlp_layers + (2 * (m.shared_ffn > 0) + latent_mx) * n_moe
    expert_l = 2 * m.num_experts / plan.ep * n_moe
    small_l = RECURRENT_SMALL_TENSORS * n_rec + (attn_small + attn - attn_mx) * n_attn + m.num_mlp_layers \
        + (moe_small + latent_bf) * n_moe
    mtp = mtp_weight_sets(m)
    mtp_dense = 1 + attn_mx + (2 * (m.shared_ffn > 0) + latent_mx if m.is_moe else 2)
    mtp_expert = 2 * m.num_experts / plan.ep if m.is_moe else 0.0
    mtp_small = 3 + attn_small + attn - attn_mx + (moe_small + latent_bf if m.is_moe else 1)
    frac = plan.low_precision_layer_fraction(m.num_hidden_layers)
    dense = frac * dense_l + mtp * mtp_dense
    expert = frac * expert_l + mtp * mtp_expert
    other = small_l + (1 - frac) * (dense_l + expert_l) + 2 + (not m.tie_word_embeddings) + mtp * mtp_small
    return dense / plan.pp, expert / plan.pp, other / plan.pp


def mxfp8_weight_tensors(m: ModelSpec, plan: ParallelPlan) -> Any:
    """MXFP8 weight tensors (Transformer Engine GEMM weights, one optimizer parameter each) a rank holds: dense
    and routed-expert ones of mxfp8_cast_tensors. Derived: docs/formulas.md#step.mxfp8_master_cast"""
    dense, expert, _ = mxfp8_cast_tensors(m, plan)
    return dense + expert


def shard_overlaps(tensors: Any, buckets: Any, shard: Any) -> Any:
    """Tensors of `buckets` buckets (one per FSDP unit and kind) overlapping one rank's contiguous 1/`shard` of
    each bucket: at most tensors / shard + 1 a bucket (each tensor boundary inside a shard adds one), at most all.
    Source: NVIDIA/Megatron-LM megatron_fsdp/param_and_grad_buffer.py at cd4afffa6 (DataParallelBuffer:
    _get_item_local_shard_index, an even split of the bucket). Derived: docs/formulas.md#step.mxfp8_master_cast"""
    return minimum(tensors, tensors / shard + buckets)


def mxfp8_master_cast_seconds(m: ModelSpec, plan: ParallelPlan, optimizer_s: Any, host_factor: Any = 1.0) -> Any:
    """GPU idle time per step of Megatron-FSDP's cast of the updated fp32 master shards into MXFP8 weights
    (comm.megatron_fsdp_mxfp8_cast: ZeRO-3, fp8_params, recipe mxfp8): a host loop, before the amax all-reduce,
    of MXFP8_CAST_VIEW_OPS per MXFP8 weight and MXFP8_CAST_SHARD_OPS per one overlapping the rank's main-weight
    shard (shard_overlaps: a bucket per decoder layer and MTP module, the routed experts' apart, over
    optimizer_shard / expert_optimizer_shard), BF16_CAST_VIEW_OPS per other parameter and BF16_CAST_SHARD_OPS per
    local one (a bucket a layer), each EAGER_OP_HOST_S at the host CPU's `host_factor`, whose kernels take
    microseconds, so the GPU runs at the loop's pace once the optimizer step's kernels issued after its grad-norm
    host sync (`optimizer_s` x compute.optimizer_queued_share) are done. The second loop (one partial cast per
    local weight) runs while the block-amax all-reduce (comm.mxfp8_amax_transfers, exposed whole) does: not
    counted. Once a step, after the last micro-batch. Derived: docs/formulas.md#step.mxfp8_master_cast"""
    dense, expert, other = mxfp8_cast_tensors(m, plan)
    n_mtp = mtp_weight_sets(m)
    units = (m.num_hidden_layers + n_mtp) / plan.pp
    moe_units = (m.num_moe_layers + n_mtp * m.is_moe) / plan.pp
    local = shard_overlaps(dense, units, plan.optimizer_shard) + shard_overlaps(expert, moe_units,
                                                                                  plan.expert_optimizer_shard)
    ops = MXFP8_CAST_VIEW_OPS * (dense + expert) + MXFP8_CAST_SHARD_OPS * local \
        + BF16_CAST_VIEW_OPS * other + BF16_CAST_SHARD_OPS * shard_overlaps(other, units, plan.optimizer_shard)
    host = ops * EAGER_OP_HOST_S * host_factor
    queued = optimizer_s * optimizer_queued_share(plan)
    return where(megatron_fsdp_mxfp8_cast(plan), maximum(host - queued, 0.0), 0.0)


def host_seconds(plan: ParallelPlan, layers: Any, per_mb: Any, r: Any, moe_layers: Any = 0,
                 syncs_per_layer: Any = 0.0, layer_gpu_s: Any = 0.0, host_factor: Any = 1.0,
                 layer_kernels: Any = None, router_ops: Any = 0, softmax: Any = 0,
                 mask_kernels: Any = 0) -> Any:
    """Time the GPU waits for the host to launch kernels: at the start of the step (the optimizer step reads
    the gradient norm back to the host, so the queue is empty) one layer's forward launches; and, per
    micro-batch, whatever the host's launches (LAYER_KERNELS per layer forward plus the TP collectives and, with
    CP, CP_STEP_KERNELS per ring step for the attention kernel, and MOE_LAYER_KERNELS more per MoE layer; twice
    that in backward, once more under recompute; KERNEL_LAUNCH_S
    each; with a pipeline, P2P_CHUNK_LAUNCHES per model chunk) take beyond the GPU's `per_mb`; plus the host
    waits of the MoE layers (host_sync_seconds, with
    `layer_gpu_s` one layer's forward on the GPU). Per-layer CUDA graphs leave 2 launches per dense layer
    (attention, MLP) and GRAPHED_LAYER_KERNELS per MoE layer; a full-iteration graph none inside the step, and
    its start is its one replay (FULL_GRAPH_LAUNCHES), not a layer's launches.
    Every launch and eager op costs `host_factor` times its x86 time (GpuSpec.host_op_factor: Grace 2.75).
    With fused kernels and `layer_kernels` (cost.kernels.layer_launch_average: the model's structural launches
    per layer, forward and backward apart, graphed scopes as one launch), the layers' launches are those,
    forward once more under recompute, in place of the LAYER_KERNELS / MOE_LAYER_KERNELS / GRAPH_LAUNCHES
    estimate (kept for callers without a model spec). `router_ops`: the eager operators a MoE layer's router
    issues beyond the fused router with an auxiliary loss that MOE_CYCLE_HOST_OPS counts (cost.kernels
    router_host_ops: one operator a kernel; outside per-layer graphs, which capture the router). `softmax`: an
    unfused softmax's launches per layer forward beyond the fused kernel's (cost.elementwise.softmax_launches(m,
    plan)), charged (3 + r) as the layer's; `mask_kernels`: Transformer Engine's mask build's
    (cost.elementwise.te_mask_launches), forward only, charged (1 + r); both 0 for callers without a model.
    Derived: docs/formulas.md#step.kernel_count, #moe.router_fusion
    Source: CUDA C++ Programming Guide (asynchronous launches: the host runs ahead of the GPU until it
    synchronises). Derived: docs/formulas.md#step.overhead, #step.host_sync, #step.host_cpu"""
    graphed = plan.cuda_graphs == "layers"
    ring = where(plan.cp > 1, CP_STEP_KERNELS * plan.cp - 1, 0)  # the attention kernel becomes cp ring steps
    launch_s = KERNEL_LAUNCH_S * host_factor
    kernels = where(plan.fused_kernels, LAYER_KERNELS, EAGER_LAYER_KERNELS)  # eager: the ops one by one
    # TE's mask build: once per forward (1 + r), beside the softmax's kernels charged (3 + r) in per_layer
    mask = where(graphed, 0, mask_kernels) * launch_s
    per_layer = where(graphed, GRAPH_LAUNCHES, kernels + where(plan.tp > 1, 2, 0) + ring + softmax) * launch_s
    per_moe = where(graphed, GRAPHED_MOE_EAGER, MOE_LAYER_KERNELS) * launch_s
    p2p = where(plan.pp > 1, P2P_CHUNK_LAUNCHES * plan.vpp, 0) * launch_s  # per chunk, whatever its layers
    launches = (per_layer * layers + per_moe * moe_layers) * (3 + r) + mask * (1 + r) * layers + p2p
    start = per_layer + mask
    if layer_kernels is not None:  # the structural count (cost.kernels), fused plans
        extra = where(graphed, 0, softmax) * launch_s  # an unfused softmax's kernels, as in per_layer
        counted = (layer_kernels.fwd * (1 + r) + layer_kernels.bwd) * launch_s + extra * (3 + r) + mask * (1 + r)
        launches = where(plan.fused_kernels, counted * layers + p2p, launches)
        start = where(plan.fused_kernels, layer_kernels.fwd * launch_s + extra + mask, start)
    full = plan.cuda_graphs == "full-iteration"
    launches = where(full, 0.0, launches)
    start = where(full, FULL_GRAPH_LAUNCHES * launch_s, start)
    ops = where(graphed, MOE_POST_SYNC_HOST_OPS + GRAPH_LAUNCHES, MOE_CYCLE_HOST_OPS + router_ops)
    sync = host_sync_seconds(moe_layers, r, syncs_per_layer, ops, layer_gpu_s, host_factor)
    queued = maximum(launches - per_mb, 0.0)
    blocking = blocking_seconds(launches, host_factor)
    return start + plan.num_microbatches * (where(plan.launch_blocking, blocking, queued) + sync)


def blocking_seconds(launches: Any, host_factor: Any = 1.0) -> Any:
    """GPU idle time of kernels launched with CUDA_LAUNCH_BLOCKING=1 (plan.launch_blocking), given `launches`,
    their asynchronous launch time (KERNEL_LAUNCH_S x host_factor each): nothing is queued, so after each kernel
    the GPU waits for the host to wake from the launch's wait (HOST_SYNC_S), run the next op (EAGER_OP_HOST_S)
    and launch it, the op and the launch at the host CPU's `host_factor`.
    Source: CUDA C++ Programming Guide (CUDA_LAUNCH_BLOCKING: launches become synchronous).
    Derived: docs/formulas.md#step.overhead, #step.host_cpu"""
    per_op = (EAGER_OP_HOST_S + KERNEL_LAUNCH_S) * host_factor
    return launches / (KERNEL_LAUNCH_S * host_factor) * (HOST_SYNC_S + per_op)


def host_sync_seconds(moe_layers: Any, r: Any, syncs_per_layer: Any, cycle_ops: Any = 0,
                      layer_gpu_s: Any = 0.0, host_factor: Any = 1.0) -> Any:
    """GPU idle time of one micro-batch's host waits. Each MoE layer's forward (once more under recompute) waits
    `syncs_per_layer` times for its token counts on the host (cost.moe.host_syncs_per_layer): the host cannot
    queue work past the wait, so the GPU drains its queue and idles for the wake-up (HOST_SYNC_S); from there on
    the GPU runs at the host's pace. With the host issuing ops at h_i and the GPU running them in g_i, the GPU
    idles max_j(h_1 + .. + h_j - g_1 - .. - g_(j-1)) until the next wait drains the queue again; over the
    `cycle_ops` eager ops (EAGER_OP_HOST_S each) between two waits and one layer's forward on the GPU
    (`layer_gpu_s`), that is at least the first op's issue and at least the cycle's host time beyond its GPU
    time: HOST_SYNC_S + max(h, cycle_ops x h - layer_gpu_s) per wait, h = EAGER_OP_HOST_S x host_factor (the
    host CPU's, GpuSpec.host_op_factor; the wake-up is not scaled). Backward is driven by autograd's C++ engine
    with the forward's counts and does not wait.
    Source: CUDA C++ Programming Guide (a wait on an event blocks the host until the GPU has reached it).
    Derived: docs/formulas.md#step.host_sync, #step.host_cpu"""
    h = EAGER_OP_HOST_S * host_factor
    paced = maximum(h, cycle_ops * h - layer_gpu_s)
    return syncs_per_layer * moe_layers * (1 + r) * (HOST_SYNC_S + paced)


def pp_sync_seconds(plan: ParallelPlan, exchanges: Any, host_factor: Any = 1.0) -> Any:
    """GPU idle time of the torch.cuda.synchronize() after each blocking pipeline exchange (plan.pp_blocking_sends,
    `exchanges` of them per step, cost.step.pp_blocking_exchanges): the GPU's queue drains, the host wakes
    (HOST_SYNC_S) and issues the next op (EAGER_OP_HOST_S, scaled by the host CPU's factor) before the GPU runs
    again, as at every host wait (step.host_sync). 0 with the switch off.
    Source: NVIDIA/Megatron-LM megatron/p2p_communication.py at 50a4b5fa02 (_communicate: "To protect against
    race condition when using batch_isend_irecv()", torch.cuda.synchronize()).
    Derived: docs/formulas.md#step.pp_blocking, #step.host_sync"""
    return where(plan.pp_blocking_sends, exchanges * (HOST_SYNC_S + EAGER_OP_HOST_S * host_factor), 0 * exchanges)


def geglu_offset_calls(m: ModelSpec, plan: ParallelPlan, r: Any = 0.0) -> Any:
    """Calls per MoE layer and micro-batch of Megatron-Core's weighted quick-GeGLU (GPT-OSS's experts:
    model_type gpt_oss, quick_gelu with glu_linear_offset, bias_activation_fusion) that each make the blocking
    host-to-device copy geglu_offset_sync_seconds prices: the forward, once more when moe_act (or the whole moe
    layer) is recomputed (CheckpointWithoutOutput reruns bias_act_func before fc2's backward), and the share `r`
    of the forward that full recompute repeats. 0 for another activation (weighted_bias_swiglu_impl has no such
    copy), with glu_clamp_fusion (Transformer Engine's grouped MLP ops run the activation) or inside a
    full-iteration CUDA graph. Source: NVIDIA/Megatron-LM megatron/core/fusions/fused_bias_geglu.py
    weighted_bias_quick_geglu_impl and moe/experts.py TEGroupedMLP.forward (core_v0.15.0 - d98e8a6).
    Derived: docs/formulas.md#step.geglu_offset_sync"""
    if not (m.is_moe and m.model_type == "gpt_oss" and m.gated_mlp):
        return 0.0
    rerun = where(plan.recomputes("moe_act") | plan.recomputes("moe"), 1.0, 0.0)
    off = where(plan.glu_clamp_fusion, True, plan.cuda_graphs == "full-iteration")
    return where(off, 0.0, 1.0 + rerun + r)


def geglu_offset_sync_seconds(m: ModelSpec, plan: ParallelPlan, moe_layers: Any, r: Any = 0.0,
                              host_factor: Any = 1.0) -> Any:
    """GPU idle time per step of the offset copies in Megatron-Core's weighted quick-GeGLU: every call builds its
    linear offset as `torch.tensor(linear_offset, dtype, device=input.device)`, a copy from host memory that
    PyTorch makes blocking (copy_kernel_cuda with non_blocking False: cudaMemcpyAsync, then
    cudaStreamSynchronize), so the host waits for the GPU's queue to drain and the GPU then idles for the
    wake-up (HOST_SYNC_S) and the next op's issue (EAGER_OP_HOST_S at the host CPU's `host_factor`), as at
    every host wait (step.host_sync): geglu_offset_calls per MoE layer of the stage (`moe_layers`) and
    micro-batch. Source: NVIDIA/Megatron-LM megatron/core/fusions/fused_bias_geglu.py
    (weighted_bias_quick_geglu_impl, core_v0.15.0 - d98e8a6); pytorch/pytorch aten/src/ATen/native/cuda/Copy.cu
    (copy_kernel_cuda: at::cuda::memcpy_and_sync). Derived: docs/formulas.md#step.geglu_offset_sync"""
    per_wait = HOST_SYNC_S + EAGER_OP_HOST_S * host_factor
    return plan.num_microbatches * moe_layers * geglu_offset_calls(m, plan, r) * per_wait
