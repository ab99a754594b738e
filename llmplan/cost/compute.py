"""Compute time: a stage's forward and backward seconds per micro-batch (GEMMs, attention, memory-bound
operators, recompute), one layer's forward seconds, the experts' per-GEMM cost, the output layer and loss,
gradient accumulation, and the optimizer step.

FLOPs live in cost.flops, GEMM efficiency and time in cost.gemm, the memory-bound operators' HBM traffic in
cost.elementwise, the low-precision casts in cost.quantize and the attention kernels' achieved rate in
cost.attention_rate; their names are re-exported here.
Works on one ParallelPlan and, elementwise, on plan arrays (see llmplan/arith.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from llmplan.arith import maximum, where
from llmplan.cost.attention_rate import (  # noqa: F401  (re-exported: their home was this module)
    ATTENTION_FIXED_KEYS,
    ATTENTION_TILE,
    attention_call_seconds,
    attention_fraction,
    attention_rate_ratio,
    fp8_attention_ratio,
    head_dim_attention_ratio,
    layer_attention_rate_ratio,
    published_rate_clock,
    unaligned_bmm_ratio,
)
from llmplan.cost.breakdown import Breakdown
from llmplan.cost.moe_kernels import moe_kernel_seconds
from llmplan.cost.elementwise import (  # noqa: F401  (re-exported: their home was this module)
    ALLTOALL_SORT_BYTES,
    EAGER_FC1_BIAS_BYTES,
    EAGER_ROPE_BYTES,
    GLU_CLAMP_BYTES,
    SINK_RESCALE_BYTES,
    alltoall_sort_bytes,
    alltoall_sort_layer_bytes,
    elementwise_bytes,
    expert_activation_extra_bytes,
    expert_bias_bytes,
    expert_copy_bytes,
    expert_fc1_bias_bytes,
    expert_node_bytes,
    jit_activation_bytes,
    jit_routed_bytes,
    loss_bytes,
    moe_routing_bytes,
    sink_rescale_bytes,
    te_mask_layer_bytes,
)
from llmplan.cost.flops import (  # noqa: F401  (re-exported: their home was this module)
    LayerFlops,
    attended_keys,
    attention_groups,
    attention_head_dims,
    attention_keys,
    attention_score_flops,
    layer_flops,
    layer_windows,
    logits_flops,
    model_flops_per_step,
    module_recompute_flops,
    op_matmul_widths,
    op_recomputed_share,
    recompute_flops_per_step,
    recurrent_scan_flops,
)
from llmplan.cost.gemm import (  # noqa: F401  (re-exported: their home was this module)
    GEMM_HALF_DIM,
    GEMM_OPERAND_BYTES,
    TE_PIPELINE_SPLITS,
    TILE,
    attention_shapes,
    block_scaled_gemm_factor,
    chunk_rows,
    gemm_efficiency,
    gemm_shape_efficiency,
    grouped_gemm_bytes,
    grouped_gemm_efficiency,
    layer_gemm_seconds,
    layer_gemms,
)
from llmplan.cost.memo import memoized
from llmplan.cost.mixers import (
    SSD_SCAN_EFFICIENCY,
    mean_mamba_scan_flops,
    mean_mamba_scan_step_flops,
)
from llmplan.cost.model_states import optimizer_share, stored_kept_extra_bytes, stored_weight_bytes
from llmplan.cost.params import RankParams, padded_vocab
from llmplan.cost.quantize import (  # noqa: F401  (re-exported: their home was this module)
    CAST_BYTES,
    QUANTIZED_COPY_BYTES,
    QUANTIZED_GATHER_RECIPES,
    bf16_kernel_format,
    fp8_cast_bytes,
    nvfp4_quantize_bytes,
    quantize_bytes,
)
from llmplan.cost.sparse_gather import fused_csa_priced, gather_layer_seconds, indexer_loss_layer_seconds, reference_indexer_seconds
from llmplan.cost.stages import recomputed_share
from llmplan.specs.hardware import GpuSpec
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.plan_choices import OPTIMIZER_STATE_BYTES

KERNEL_LAUNCH_S = 5e-6  # one CUDA kernel launch from the host (a few microseconds; CUDA Programming Guide)


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
    forward of the attention core (a hybrid's recurrent scans not: recurrent_scan_seconds), op a forward of every
    other matmul and of the memory-bound operators; Transformer Engine's unfused-attention mask
    (te_mask_layer_bytes) is built in each forward of the attention core, backward none.
    Derived: docs/formulas.md#compute.time, docs/formulas.md#compute.core_attn_recompute"""
    per_layer = {moe: layer_seconds(m, plan, gpu, moe) for moe in ((False, True) if m.is_moe else (False,))}
    r = recomputed_share(plan, n_dense + n_moe)  # 1 under full recompute of every layer
    op = where(plan.op, 1.0, 0.0)  # op-level checkpointing: every other matmul and the memory-bound ops again
    q = op * op_recomputed_share(m)
    passes = 3 + r + op
    core = plan.recomputes("core_attn")
    attn_passes = 3 + (where(plan.full | core, 1, 0) if plan.recompute_layers is None else where(core, 1, r))
    # a hybrid's recurrent scans are no part of the attention core: they run again only under full recompute
    scan = recurrent_scan_seconds(m, plan, gpu)
    # Transformer Engine's mask build runs in forward only: once, and again wherever the attention core's forward
    # reruns (attn_passes - 3: full or core_attn recompute), at the read-modify-write rate of memory_seconds
    mask = te_mask_layer_bytes(m, plan) / gpu.hbm_achieved_bytes_per_s
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
        attention = attention + n * ((a1 - scan) * attn_passes + scan * (3 + r))
        membound = membound + n * (mb1 * passes + mask * (attn_passes - 2))
        fwd = fwd + n * (g1 + a1 + mb1 + mask)
    head, loss_s = output_seconds(m, plan, gpu)
    out, loss = where(last, head, 0.0), where(last, loss_s, 0.0)
    return StageCompute(gemm=gemm + 3 * out, attention=attention, memory_bound=membound + loss,
                        forward=fwd + out + loss / 3)


def memory_seconds(total: Any, copies: Any, gpu: GpuSpec, jit: tuple[Any, Any] = (0.0, 0.0)) -> Any:
    """Seconds of `total` memory-bound HBM bytes of which `copies` are streaming copies and `jit` the (pass,
    rerun) bytes of Megatron-Core's jit_fuser activation (jit_activation_bytes): copies at the copy bandwidth
    (GpuSpec.copy_achieved_bytes_per_s), the jit pass at jit_activation_share and its rerun (a forward) at the
    jit kernel's forward rate, the rest at the achieved bandwidth of the read-modify-write kernels
    (hbm_achieved_bytes_per_s). Derived: docs/formulas.md#compute.copy_bandwidth, #compute.jit_activation"""
    one, rerun = jit
    forward = gpu.hbm_efficiency if gpu.jit_activation_hbm_efficiency is None else gpu.jit_activation_hbm_efficiency
    return ((total - copies - one - rerun) / gpu.hbm_achieved_bytes_per_s + copies / gpu.copy_achieved_bytes_per_s
            + one / (gpu.hbm_bytes_per_s * jit_activation_share(gpu)) + rerun / (gpu.hbm_bytes_per_s * forward))


def jit_activation_share(gpu: GpuSpec) -> float:
    """Share of HBM peak at which a jit_fuser activation's bytes, counted in forward-equivalent units (the stage
    charges them three times: the forward, then twice in backward), run on average: the forward at
    GpuSpec.jit_activation_hbm_efficiency (published for the forward alone), the backward (swiglu_back, no
    usable published timing) at hbm_efficiency: 3 / (1 / e_jit + 2 / e). hbm_efficiency where e_jit is not
    published. Derived: docs/formulas.md#compute.jit_activation"""
    e = gpu.hbm_efficiency
    e_jit = e if gpu.jit_activation_hbm_efficiency is None else gpu.jit_activation_hbm_efficiency
    return 3.0 / (1.0 / e_jit + 2.0 / e)


def expert_node_seconds(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec) -> tuple[Any, Any]:
    """(forward, backward) seconds of one MoE layer's routed experts, one micro-batch: Megatron-Core's `mlp`
    node (the permutes after dispatch and before combine, the expert GEMMs, their activation): the experts'
    matmuls as layer_gemm_seconds prices them in the layer, expert_node_bytes at the achieved HBM bandwidth and
    the per-expert GEMM cost (expert_gemm_seconds), the memory-bound part twice in backward as stage_compute
    counts it. Source: NVIDIA/Megatron-LM megatron/core/models/gpt/fine_grained_callables.py at d98e8a6
    (submodule_moe_forward: routed_experts_compute). Derived: docs/formulas.md#moe.overlap"""
    def compute() -> tuple[Any, Any]:
        fwd, bwd = layer_gemm_seconds(m, plan, gpu, True, only="expert")
        mem = (memory_seconds(expert_node_bytes(m, plan), expert_copy_bytes(m, plan), gpu, jit_routed_bytes(m, plan))
               + expert_gemm_seconds(m, plan)
               + moe_kernel_seconds(m, plan, ("sort_map",)))
        return fwd + mem, bwd + 2 * mem
    return memoized(plan, ("expert_node_seconds", m, gpu), compute)


def ep_pair_windows(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec) -> tuple[Any, Any, Any, Any]:
    """The compute of one MoE layer and micro-batch that Megatron-Core's combined-1F1B schedule
    (overlap_moe_expert_parallel_comm) runs beside each of the other micro-batch's four all-to-alls, in the
    order TransformerLayerSchedulePlan.run issues them: the combine's backward beside the attention node's
    forward (attention, pre-MLP norm, router, shared experts, dispatch preprocess), the forward dispatch beside
    the experts' backward (input and weight gradients; delay_wgrad: ep_deferred_wgrad), the dispatch's backward
    beside the experts' forward, the forward combine beside the attention node's backward (with what the
    layer recomputes). The layer is stage_compute's MoE layer; the experts' part is expert_node_seconds.
    Source: NVIDIA/Megatron-LM megatron/core/models/common/model_chunk_schedule_plan.py at d98e8a6
    (TransformerLayerSchedulePlan.run). Derived: docs/formulas.md#moe.overlap"""
    layer = stage_compute(m, plan, gpu, 0, 1, False)
    expert_fwd, expert_bwd = expert_node_seconds(m, plan, gpu)
    return (layer.forward - expert_fwd, expert_bwd, expert_fwd, layer.total - layer.forward - expert_bwd)


def ep_deferred_wgrad(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec) -> tuple[Any, Any]:
    """(attention node, experts) seconds of one MoE layer's weight-gradient GEMMs, one micro-batch, that
    delay_wgrad takes out of their node's backward (Megatron-Core's backward_dw: the attention node's
    self-attention and shared-expert linears, the routed experts' grouped linears): each weight gradient is one
    matmul of its forward's FLOPs at the forward's shape (layer_gemm_seconds), the experts' with their per-expert
    GEMM cost once (expert_gemm_seconds); the router's stays in the backward. (0, 0) without delay_wgrad.
    Source: NVIDIA/Megatron-LM megatron/core/models/common/utils.py (_BackwardDWWrapper) and
    transformer/moe/experts.py (backward_dw) at d98e8a6. Derived: docs/formulas.md#moe.delay_wgrad"""
    if not plan.delay_wgrad:  # a workload switch: one value for all plans of a search
        return 0.0, 0.0
    def compute() -> tuple[Any, Any]:
        layer_fwd = layer_gemm_seconds(m, plan, gpu, True)[0]
        expert = layer_gemm_seconds(m, plan, gpu, True, only="expert")[0]
        router = layer_gemm_seconds(m, plan, gpu, True, only="router")[0]
        return layer_fwd - expert - router, expert + expert_gemm_seconds(m, plan)
    return memoized(plan, ("ep_deferred_wgrad", m, gpu), compute)


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
    EXPERT_GEMM_S each on Transformer Engine's per-expert path (with or without fused kernels: GroupedLinear's
    per-call cost is not a fusion's), else as eager launches (KERNEL_LAUNCH_S) without fused kernels, nothing in
    one grouped kernel. Charged with the memory-bound time, so the stage counts it once per pass (3 + r: the
    backward's input- and weight-gradient GEMMs per forward GEMM). Derived: docs/formulas.md#compute.expert_gemms"""
    calls = 2 * m.num_experts / plan.ep
    per_call = where(runs_per_expert(plan), EXPERT_GEMM_S, where(plan.fused_kernels, 0.0, KERNEL_LAUNCH_S))
    return calls * per_call


def runs_per_expert(plan: ParallelPlan) -> Any:
    """Whether the routed experts run one GEMM per local expert with fused kernels: expert_gemm per-expert, or
    grouped with expert tensor parallelism (etp > 1) under Megatron-Core's TP (tp_impl megatron), whose fused
    grouped MLP runs only without expert TP, so the layer is TEGroupedMLP on GroupedLinear (the rule
    export.common.op_fuser_blocked writes into the exports). torch._grouped_mm on DTensor shards (tp_impl
    dtensor) stays one grouped kernel at any etp.
    Source: NVIDIA/Megatron-LM megatron/core/transformer/moe/experts.py at d98e8a6, _is_fused_impl_supported.
    Derived: docs/formulas.md#compute.expert_gemms"""
    return (plan.expert_gemm == "per-expert") | ((plan.etp_resolved > 1) & (plan.tp_impl == "megatron"))


def layer_seconds(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec, moe: bool) -> tuple[Any, Any, Any]:
    """(GEMM, attention, memory-bound) forward seconds of one layer and micro-batch: the GEMMs as
    layer_gemm_seconds prices them; the attention FLOPs at the sustained peak x attention_fraction x the calls'
    rate (layer_attention_rate_ratio) x fp8_attention_ratio, a hybrid's Mamba-2 scans apart (ssd_scan_seconds);
    the memory-bound bytes (elementwise_bytes) at the achieved HBM bandwidth, plus the per-expert GEMM cost
    (expert_gemm_seconds) and an MoE layer's small per-call kernels (moe_kernel_seconds). The same on every
    stage, so computed once per plan arrays. Derived: docs/formulas.md#compute.time"""
    def compute() -> tuple[Any, Any, Any]:
        flops = layer_flops(m, plan, moe)
        ssd_flops, ssd_seconds = ssd_scan_seconds(m, plan, gpu)  # the Mamba-2 scans: Triton, not the attention kernel
        attention = flops.attention - ssd_flops
        # the calls' length, and the sliding-window layers' short calls
        split = where(plan.flash_attention, layer_attention_rate_ratio(m, plan, gpu, attention), 1.0)
        peak_attn = (gpu.sustained_flops(bf16_kernel_format(plan))
                     * attention_fraction(gpu, plan, m) * split * fp8_attention_ratio(m, plan, gpu))
        # per-expert launches or GEMMs; the small per-call MoE kernels (sort map, row-id argsort, top-k)
        launches = expert_gemm_seconds(m, plan) + moe_kernel_seconds(m, plan) if moe else 0.0
        return (layer_gemm_seconds(m, plan, gpu, moe),
                attention_seconds(m, plan, gpu, attention, peak_attn) + ssd_seconds,
                memory_seconds(elementwise_bytes(m, plan, moe, gpu.fp8_tn_only),
                               alltoall_sort_layer_bytes(m, plan) if moe else 0.0, gpu,
                               jit_activation_bytes(m, plan, moe))
                + launches)
    return memoized(plan, ("layer_seconds", m, gpu, moe), compute)


def ssd_scan_seconds(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec) -> tuple[Any, Any]:
    """(FLOPs, forward-equivalent seconds) of the average layer's Mamba-2 SSD scan, one micro-batch, one rank:
    the scan FLOPs layer_flops counts in its attention part (the rank's s/cp x b tokens, its heads split by t),
    at the GPU's measured fraction of the peak of the plan's 16-bit kernels (GpuSpec.ssd_scan_efficiency; else
    SSD_SCAN_EFFICIENCY, the H800 one; bf16_kernel_format: the scan runs in bf16 under every fp8 / fp4 recipe), a
    published rate read at the clock it was measured at (published_rate_clock), the seconds for the forward and
    the backward's own FLOPs together (mean_mamba_scan_step_flops); its HBM traffic is elementwise_bytes'.
    Source: tile-ai/tilelang benchmark/mamba2 (Triton chunk_scan on H800); NVIDIA-NeMo/Megatron-Bridge
    scripts/performance/perf_leaderboard/analysis_report_det_vs_nondet.md at 6d780951a (the SSD kernels of a
    Nemotron-3 Ultra step on GB200, Nsight). Derived: docs/formulas.md#mixers.ssd_rate,
    docs/formulas.md#compute.published_clock"""
    tokens = plan.seq_len / plan.cp * plan.micro_batch / plan.tp
    eff = SSD_SCAN_EFFICIENCY if gpu.ssd_scan_efficiency is None else gpu.ssd_scan_efficiency
    rate = eff * published_rate_clock(gpu) * gpu.sustained_flops(bf16_kernel_format(plan))
    return tokens * mean_mamba_scan_flops(m), tokens * mean_mamba_scan_step_flops(m) / rate


def recurrent_scan_seconds(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec) -> Any:
    """The part of layer_seconds' attention (forward-equivalent seconds, one layer and micro-batch) that is the
    average layer's recurrent scans: the Mamba-2 SSD scan (ssd_scan_seconds) and the Gated DeltaNet / lightning
    scans' FLOPs (recurrent_scan_flops less the SSD's) at the rate layer_seconds gives attention FLOPs outside a
    sliding window (attention_rate_ratio with fused attention). 0 for a model without recurrent mixers.
    Source: NVIDIA/Megatron-LM at d98e8a6, megatron/core/transformer/attention.py (core_attn recompute
    checkpoints Attention.core_attention only), megatron/core/ssm/mamba_mixer.py and gated_delta_net/
    (no core_attn checkpoint). Derived: docs/formulas.md#compute.core_attn_recompute"""
    if not (m.count_layers("mamba") or m.count_layers("linear_attention")):
        return 0.0

    def compute() -> Any:
        ssd_flops, ssd_seconds = ssd_scan_seconds(m, plan, gpu)
        split = where(plan.flash_attention, attention_rate_ratio(m, plan, gpu), 1.0)
        peak_attn = (gpu.sustained_flops(bf16_kernel_format(plan))
                     * attention_fraction(gpu, plan, m) * split * fp8_attention_ratio(m, plan, gpu))
        return ssd_seconds + (recurrent_scan_flops(m, plan) - ssd_flops) / peak_attn
    return memoized(plan, ("recurrent_scan_seconds", m, gpu), compute)


def attention_seconds(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec, attention_flops: Any, peak_attn: Any) -> Any:
    """Forward-equivalent seconds of one layer's attention FLOPs (layer_flops(...).attention), one micro-batch:
    at peak_attn (the dense fused kernel's rate), except DeepSeek-V4's sparse calls under fused attention on a GPU
    with a published sparse gather rate: their forward and backward (cost.sparse_gather) as three
    forward-equivalents, since stage_compute charges the attention three times, with the CSA indexer-loss kernels
    (cost.sparse_gather.indexer_loss_layer_seconds) likewise; the rest of the FLOPs (the CSA indexers' scores) at
    peak_attn in the forward alone: the indexer's inputs are detached and its gradient comes from its sparse
    backward, so no backward of the dense scores runs. Without those kernels (DeepSeek-V3.2; DeepSeek-V4 on a
    GPU without a published rate or unfused) the indexer's scores and loss are Megatron-Core's reference path
    (cost.sparse_gather.reference_indexer_seconds) beside the core at peak_attn.
    Derived: docs/formulas.md#compute.sparse_gather, docs/formulas.md#compute.indexer_loss,
    docs/formulas.md#compute.indexer_training"""
    if not m.is_sparse_attention and not m.compressed_layers:
        return attention_flops / peak_attn
    core = attention_score_flops(m, plan, attention_keys(m, plan.seq_len))  # the counted (query, key) pairs
    scores = attention_flops - core  # the indexers' scores (forward FLOPs)
    unfused = core / peak_attn + reference_indexer_seconds(m, plan, gpu, scores)
    if not m.compressed_layers or not gpu.has_sparse_gather_rate:  # the gather rates below need both
        return unfused
    fwd, bwd = gather_layer_seconds(m, plan, gpu)
    target, indexer_bwd = indexer_loss_layer_seconds(m, plan, gpu)
    return where(fused_csa_priced(m, plan, gpu), (fwd + bwd + target + indexer_bwd + scores / peak_attn) / 3,
                 unfused)


def grad_accumulation_bytes(plan: ParallelPlan) -> float:
    """HBM bytes per parameter that one micro-batch's gradient accumulation moves outside the weight-gradient
    GEMM (ParallelPlan.grad_accumulation): fused 0 (the GEMM accumulates into the main gradient); add reads
    the micro-batch's gradient (2 bytes; 4 in fp32 training) and reads and writes the accumulated one (grad
    dtype g): 2 + 2g; cast-add first writes and reads the gradient cast to the accumulated dtype: 2 + 4g.
    Source: NVIDIA/Megatron-LM megatron/model/distributed.py at 50a4b5fa02 (param_hook:
    param.main_grad.add_(param.grad.data)), gradient accumulation fusion from 83b1e42f30 (2022-02-16);
    microsoft/DeepSpeed runtime/bf16_optimizer.py update_hp_grads at v0.6.3 (hp_grad.add_(lp.grad.to(fp32)),
    called after every micro-batch's backward by runtime/pipe/engine.py). Derived:
    docs/formulas.md#step.grad_accumulation
    copy reads the gradient and writes it into the unsharded bucket: 2 + g (Source: NVIDIA/Megatron-LM
    megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py at 2a75ac12c, _grad_acc:
    param.main_grad.copy_(param.grad) where the gradient buffer is sharded)."""
    new = 4.0 if plan.dtype == "fp32" else 2.0
    g = plan.grad_bytes
    return {"fused": 0.0, "add": new + 2 * g, "cast-add": new + 4 * g, "copy": new + g}[plan.grad_accumulation]


def grad_accumulation_seconds(params_on_rank: Any, plan: ParallelPlan, gpu: GpuSpec) -> Any:
    """Time of one micro-batch's gradient accumulation on a rank holding `params_on_rank` parameters: their
    grad_accumulation_bytes at the GPU's achieved HBM bandwidth. Derived: docs/formulas.md#step.grad_accumulation"""
    return params_on_rank * grad_accumulation_bytes(plan) / gpu.hbm_achieved_bytes_per_s


def output_seconds(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec) -> tuple[Any, Any]:
    """(output-layer GEMM, loss) seconds of one micro-batch on the last stage (once more per MTP module, with the
    module's eh_proj, 2h -> h split by TP, priced in the same format: mtp_projection_seconds). The output layer
    stays in bf16 under every low-precision recipe (Megatron-Core's fp8 autocast covers the decoder layers only;
    torchtitan's float8 / MX converters skip the output layer) unless plan.fp8_output_proj runs it as a
    Transformer Engine Linear in MXFP8 (output_head_format; its casts: output_cast_bytes, with the loss).
    Derived: docs/formulas.md#compute.fp8_output_proj"""
    def compute() -> tuple[Any, Any]:
        s, b = plan.seq_len / plan.cp, plan.micro_batch
        fmt, cublas = output_head_format(m, plan)
        eff = gemm_shape_efficiency(gpu, fmt, s * b, padded_vocab(m.vocab_size, plan.tp) / plan.tp, m.hidden_size)
        heads = 1 + m.num_nextn_predict_layers  # multi-token prediction runs the output head once more per module
        return (heads * logits_flops(m, plan) / (gpu.sustained_flops(fmt) * eff) * cublas
                + mtp_projection_seconds(m, plan, gpu),
                heads * (loss_bytes(m, plan) + output_cast_bytes(m, plan)) / gpu.hbm_achieved_bytes_per_s)
    return memoized(plan, ("output_seconds", m, gpu), compute)


def output_head_format(m: ModelSpec, plan: ParallelPlan) -> tuple[str, Any]:
    """(format, block_scaled_gemm_factor) of the output layer's GEMMs (forward, input and weight gradient):
    the recipe's MXFP8 on cuBLASLt under plan.fp8_output_proj (Megatron-Core's TELMHeadColumnParallelLinear, a
    TE Linear run inside the fp8 autocast, wgrad not deferred), else bf16_kernel_format. Source:
    NVIDIA/Megatron-LM 3f6a2ed844 (#4825) megatron/core/extensions/transformer_engine.py,
    fp8_utils.is_mxfp8_output_proj_active. Derived: docs/formulas.md#compute.fp8_output_proj"""
    if plan.fp8_output_proj and plan.dtype == "fp8" and plan.recipe == "mxfp8":
        return plan.gemm_format, block_scaled_gemm_factor(m, plan, plan.gemm_format, "lm_head")
    return bf16_kernel_format(plan), 1.0


def output_cast_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """HBM bytes of the MXFP8 output layer's input casts, one micro-batch, one rank, per head: its h-wide input
    (forward; on the sequence shard under SP, before TE's gather) and the V/t-wide logits' gradient (backward),
    each cast as fp8_cast_bytes casts a GEMM input (quantize_bytes: read bf16, write the rowwise and the
    columnwise copy); its weight is cast once per step (TE's first micro-batch), left out as for every TE
    linear. None without plan.fp8_output_proj. Derived: docs/formulas.md#compute.fp8_output_proj"""
    if output_head_format(m, plan)[0] == bf16_kernel_format(plan):
        return 0.0
    t = plan.tp
    rows = plan.seq_len / plan.cp * plan.micro_batch
    h_in = m.hidden_size * where(plan.sp & (t > 1), 1 / t, 1.0)
    return quantize_bytes(plan) * rows * (h_in + padded_vocab(m.vocab_size, t) / t)


def mtp_projection_seconds(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec) -> Any:
    """Forward seconds of the MTP modules' eh_proj on the last stage, one micro-batch: per module the
    concatenated [norm(embedding), norm(hidden)] (2h) projected to h, column-parallel without gathering its
    output, 2·s·b·2h·h/t FLOPs, inside the recipe's fp8 context but never in fp4 (Megatron-LM runs the MTP
    modules under the global fp8 context and leaves FP4 out of them); stage_compute charges it three times, as
    the head. Source: NVIDIA/Megatron-LM megatron/core/transformer/multi_token_prediction.py (eh_proj,
    _proj_and_transformer_layer: "currently ignoring FP4 in MTP layers", cd4afff); DeepSeek-V3 report §2.2
    (M_k). Derived: docs/formulas.md#mixers.mtp"""
    T, h = plan.seq_len / plan.cp * plan.micro_batch, m.hidden_size
    fmt = plan.gemm_format if plan.dtype == "fp8" else bf16_kernel_format(plan)
    eff = gemm_shape_efficiency(gpu, fmt, T, h / plan.tp, 2 * h)
    cublas = block_scaled_gemm_factor(m, plan, fmt, "mtp")  # a TE linear: MXFP8 on cuBLASLt
    return m.num_nextn_predict_layers * 2 * T * 2 * h * h / plan.tp / (gpu.sustained_flops(fmt) * eff) * cublas


def optimizer_bytes_per_param(plan: ParallelPlan) -> Any:
    """HBM bytes per parameter of the optimizer shard that optimizer_step_seconds prices: the gradient norm's read
    (1 x grad bytes), clipping's read and write (2), Adam's read and write of the master and moments and read of
    the gradient (2 x optimizer bytes + 1), the stored weight written. Derived: docs/formulas.md#compute.optimizer"""
    return 2 * plan.optimizer_bytes + 4 * plan.grad_bytes + stored_weight_bytes(plan)


def optimizer_fp32_pass_bytes(plan: ParallelPlan) -> Any:
    """HBM bytes per parameter of the optimizer shard that Megatron-LM's mixed-precision optimizer moves beyond
    optimizer_bytes_per_param (plan.optimizer_fp32_passes; 0 without it): 16-bit gradients cast to new fp32 main
    gradients (read grad_bytes, write 4), after which the norm's read, clipping's read and write and Adam's read
    see 4-byte gradients (4 - grad_bytes more each); none where the gradients are fp32 (`.float()` returns the
    tensor itself); with a grad scaler (fp16) `_amp_foreach_non_finite_check_and_unscale_` (read and write 4);
    and the fp32 master read again by the multi-tensor copy to the model's weights (their write is priced).
    Source: NVIDIA/Megatron-LM 6985e58938 megatron/optimizer/optimizer.py (_copy_model_grads_to_main_grads,
    _unscale_main_grads_and_check_for_nan, _copy_main_params_to_model_params); core_r0.8.0
    megatron/core/optimizer/distrib_optimizer.py (the same three on the shard).
    Derived: docs/formulas.md#compute.optimizer_fp32_passes"""
    g = plan.grad_bytes
    cast = (g + 4.0) + 4 * (4.0 - g) if g < 4 else 0.0
    unscale = 8.0 if plan.dtype == "fp16" else 0.0
    return where(plan.optimizer_fp32_passes, cast + unscale + plan.master_bytes, 0.0)


def optimizer_queued_share(plan: ParallelPlan) -> Any:
    """Share of optimizer_step_seconds still queued on the GPU when the host leaves the optimizer step: all but the
    gradient norm's read (1 x grad bytes of optimizer_bytes_per_param), which runs before get_grad_norm_fp32's
    total_norm.item() host sync; clipping's scale and the update are issued after it. Source: NVIDIA/Megatron-LM
    megatron/core/optimizer/clip_grads.py at cd4afffa6 (get_grad_norm_fp32: total_norm_cuda[0].item();
    clip_grad_by_total_norm_fp32 after it). Derived: docs/formulas.md#step.mxfp8_master_cast"""
    return 1.0 - plan.grad_bytes / optimizer_bytes_per_param(plan)


def optimizer_step_seconds(params_on_rank: Any, plan: ParallelPlan, gpu: GpuSpec, expert_on_rank: Any = 0.0,
                           kept: RankParams | None = None, muon: RankParams | None = None) -> Any:
    """Gradient clipping and the Adam update, memory-bound: read the gradients for their norm, read and write
    them to scale them; read fp32 master, moments and the gradient, write them back and the bf16 copy:
    (2 x optimizer bytes + 4 x gradient + weight) per parameter of the rank's optimizer shard. The rank's
    `expert_on_rank` routed-expert parameters are sharded over the expert data-parallel group,
    world / (etp x ep x pp) ranks (as cost.memory.stage_memory), the rest over dp x cp.
    The weight written is the stored copy's (cost.model_states.stored_weight_bytes: bf16 under torchao's
    fp8_params). Under fp8_params the `kept` parameters (cost.model_states.bf16_kept_params, sharded alike)
    write a bf16 copy, stored_kept_extra_bytes more each. The `muon` parameters (cost.muon.muon_params, sharded alike)
    read and
    write one momentum buffer instead of two moments (their Newton-Schulz GEMMs: cost.muon.newton_schulz_seconds).
    Megatron-LM's own fp32 passes where the plan runs them: optimizer_fp32_pass_bytes more per parameter.
    Source: Megatron-LM megatron/core/parallel_state.py (expert data-parallel group).
    Derived: docs/formulas.md#compute.optimizer, docs/formulas.md#compute.optimizer_fp32_passes,
    docs/formulas.md#mem.fp8_param_bf16_parts,
    docs/formulas.md#optim.muon_memory"""
    per_param = optimizer_bytes_per_param(plan) + optimizer_fp32_pass_bytes(plan)

    def shard(dense_and_expert: Any, expert: Any) -> Any:
        return optimizer_share(plan, RankParams(dense=dense_and_expert - expert, expert=expert))
    extra = 0.0 if kept is None else shard(kept.total, kept.expert) * stored_kept_extra_bytes(plan)
    if muon is not None:
        extra = extra - shard(muon.total, muon.expert) * 2 * OPTIMIZER_STATE_BYTES[plan.optimizer_moment_dtype]
    return (shard(params_on_rank, expert_on_rank) * per_param + extra) / gpu.hbm_achieved_bytes_per_s
