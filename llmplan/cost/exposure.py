"""Communication exposed beside compute in a training step: the overlap of a transfer with the compute it runs
beside, and the exposed TP, ZeRO / FSDP and DP-bucket time of a stage (called by cost.step.step_time).

Works on one ParallelPlan and, elementwise, on plan arrays (see llmplan/arith.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from llmplan.arith import maximum, minimum, where
from llmplan.cost.attention_rate import ATTENTION_BACKWARD_WEIGHT
from llmplan.cost.compute import TE_PIPELINE_SPLITS, StageCompute
from llmplan.cost.memory import ZERO3_MAX_LIVE_PARAMS, zero3_layer_tensors
from llmplan.cost.params import rank_params, stage_end_params
from llmplan.cost.stages import explicit_stages, recomputed_share
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan, cp_ring_size
from llmplan.specs.quantities import dp_first_chunk_unbucketed, megatron_fsdp_acts, param_gather_optstep

BUCKET_PARAMS, BUCKET_PARAMS_PER_DP = 40e6, 1e6
"""Megatron-Core's default gradient bucket: max(40M, 1M x dp) parameters (DistributedDataParallelConfig
.bucket_size: "larger DP sizes need larger buckets to ensure collectives do not become latency-bound")."""


@dataclass(frozen=True)
class CommSeconds:
    """Per-step communication time of each axis (all calls, before overlap); dp split into the gradient
    reduction and the weight gather."""

    tp: Any
    pp: Any
    cp: Any
    ep: Any
    dp_reduce: Any
    dp_gather: Any
    cp_mixers: Any = 0.0
    """The part of cp that a hybrid's Mamba-2 and linear-attention layers spend in their head-split all-to-alls
    (cost.comm.cp_mixer_transfers), in line with compute: exposed whole (docs/formulas.md#comm.cp_mixers)."""
    cp_a2a: Any = 0.0
    """The part of cp in Transformer Engine's a2a all-to-alls of Q, K, V, the output and their gradients
    (cost.comm.te_cp_split; docs/formulas.md#comm.cp_a2a): exposed whole (step.cp)."""
    cp_allgather: Any = 0.0
    """The part of cp in Transformer Engine's all_gather K/V gathers and dK/dV reduce-scatters (cost.comm.te_cp_split;
    docs/formulas.md#comm.cp_allgather): exposed whole (step.cp)."""
    router: Any = 0.0
    """The auxiliary loss's token-count all-reduces of a step on the stage with the most MoE layers
    (cost.comm.aux_loss_transfers, CommBreakdown.axes["router"]), in line with the router's forward: exposed
    whole (StepTime.exposed["router"]; docs/formulas.md#comm.aux_loss_counts)."""
    host: Any = 0.0
    """Seconds to copy one offloaded layer's saved activations of one micro-batch to host memory (or back)
    over the GPU's share of the host link (ParallelPlan.offload_layers; 0 without offload)."""
    host_moe_act: Any = 0.0
    """Seconds to copy one MoE layer's fine-grained offload groups of one micro-batch to host memory (or back)
    over the GPU's share of the host link (ParallelPlan.offload_moe_act, offload_modules; 0 without them)."""
    host_attn: Any = 0.0
    """Seconds to copy one attention layer's fine-grained offload groups of one micro-batch to host memory (or
    back) over the GPU's share of the host link (ParallelPlan.offload_modules; 0 without them)."""
    dp_host: Any = 0.0
    """Host seconds per step that the ZeRO-3 collectives spend launching their per-rank copies while the GPU
    waits (cost.comm.zero3_host_seconds; 0 but with zero3_unit tensor)."""
    dp_outer_reduce: Any = 0.0
    """The part of dp_reduce across hybrid sharding's replicas (cost.comm.hsdp_split; 0 with dp_replicate 1): once a
    step, behind the last micro-batch's backward, also where the shard group reduces every micro-batch
    (docs/formulas.md#step.hsdp_outer)."""
    dp_outer_gather: Any = 0.0
    """The part of dp_gather across hybrid sharding's replicas (cost.comm.hsdp_split): once a step, before the
    first micro-batch's forward (docs/formulas.md#step.hsdp_outer)."""
    dp_step_end: Any = 0.0
    """Seconds per step of the DP collectives that run after the optimizer step, serial with it (the first
    stage's rank: cost.comm.mxfp8_amax_transfers; 0 but for Megatron-FSDP's MXFP8 weights)."""
    tp_step_end: Any = 0.0
    """Seconds per step of the TP all-reduces of the whole-on-every-rank parameters' gradients that Megatron-Core
    runs once a step after the DP reduction, serial with the step (cost.comm.tp_step_end_transfers); not in tp."""
    tp_edge: Any = 0.0
    """Seconds per step of the synchronous TP collectives outside the decoder layers on the rank of the stage
    being priced (cost.comm.tp_edge_transfers: embedding, output heads, their loss, MTP modules; step.stage_comm
    picks them from tp_edge_stages); not in tp."""
    tp_edge_async: Any = 0.0
    """Seconds per step of the output heads' asynchronous backward TP collectives on that rank (tp_edge_transfers);
    not in tp."""
    tp_edge_stages: tuple[tuple[Any, Any], ...] = ()
    """(tp_edge, tp_edge_async) of a rank of each candidate stage (cost.memory.candidate_stages, in order).
    Empty: none (docs/formulas.md#comm.tp_edge)."""
    dp_stages: tuple[tuple[Any, Any], ...] = ()
    """(dp_reduce, dp_gather) of a rank of each candidate stage (cost.memory.candidate_stages, in order), each
    of its own parameters (docs/formulas.md#step.stage_tail); dp_reduce / dp_gather are the first stage's.
    Empty: every stage's are dp_reduce / dp_gather."""


GRAD_RING_BYTES = 4.0
"""Bytes per element of the K/V gradients PyTorch's ring passes on: fp32, the accumulation dtype of
_templated_ring_attention_backward (_ContextParallelOptions.convert_to_f32, True). Source: pytorch/pytorch
torch/distributed/tensor/experimental/_attention.py. Derived: docs/formulas.md#comm.cp"""


def overlap(comm: Any, window: Any, kappa: float) -> Any:
    """Time a transfer of `comm` seconds adds when it runs beside `window` seconds of compute: what does not
    fit in the window, plus the compute it slows while they share the GPU (kappa of the overlapped time).
    Never less than without overlap's zero, never more than comm (1 + kappa).
    Derived: docs/formulas.md#step.overlap"""
    return maximum(0.0, comm - window) + kappa * minimum(comm, window)


def te_ring_exposed(sends: Any, attention: Any, ring: Any, r: Any, kappa: float) -> Any:
    """Exposed seconds of Transformer Engine's p2p ring (AttnFuncWithCPAndKVP2P) over `ring` ranks: `sends`
    seconds of K/V sends beside `attention` seconds of attention kernels, `r` the layers' share whose attention
    forward runs again (recompute). Per layer, each forward pass runs ring calls and ring - 1 K/V sends, one beside
    each call but the last (the last call has nothing to send); the backward runs ring calls and ring sends, one
    beside every call (K/V at the first, K/V with the partial dK/dV between, the dK/dV at the last), each waited
    after its own call. So the forward passes' sends, (1 + r) of the (3 + r) send units (cost.comm.cp_transfers),
    hide behind (ring - 1)/ring of the forward passes' attention, (1 + r) of its (1 + r + w) units (w the backward
    weight, ATTENTION_BACKWARD_WEIGHT); the backward's behind all of the backward's; what outlasts its window is
    exposed, the rest slows the compute by kappa (overlap).
    Source: NVIDIA/TransformerEngine@d0067d0 transformer_engine/pytorch/attention/dot_product_attention/
    context_parallel.py (AttnFuncWithCPAndKVP2P.forward: flash_attn_p2p_communicate for i < cp_size - 1, waited
    at the start of step i + 1; .backward: flash_attn_p2p_communicate at every step, send_tensor[0] K/V at i = 0,
    send_tensor[1] dK/dV at i = cp_size - 1, "wait until dKV is received" after the step's attention call).
    Derived: docs/formulas.md#step.cp"""
    fwd_sends = (1 + r) / (3 + r)
    fwd_time = (1 + r) / (1 + r + ATTENTION_BACKWARD_WEIGHT)
    return (overlap(sends * fwd_sends, attention * fwd_time * (ring - 1) / ring, kappa)
            + overlap(sends * (1 - fwd_sends), attention * (1 - fwd_time), kappa))


def cp_exposed(plan: ParallelPlan, cp: Any, attention: Any, kappa: float, r: Any = None, a2a: Any = 0.0) -> Any:
    """Exposed ring-attention time of one micro-batch on one stage, `cp` seconds of sends beside `attention`
    seconds of attention kernels (`r`: the stage's share of layers whose attention forward runs again; by
    default 1 under full recompute). Transformer Engine's p2p ring: te_ring_exposed (the forward's sends behind
    all but the last call, the backward's behind every call). PyTorch's ring (cp_impl torch-*;
    torch_ring_exposed) differs. Transformer Engine's all_gather and a2a (cp_comm_type) wait for their
    collectives before the attention (and the a2a of its output before the next linear): exposed whole.
    Source: Transformer Engine attention context_parallel.py (AttnFuncWithCPAndKVP2P: te_ring_exposed;
    AttnFuncWithCPAndKVAllGather: gather_along_first_dim before the attention steps; AttnFuncWithCPAndQKVOA2A:
    flash_attn_a2a_communicate waits each all_to_all_single before the attention); NVIDIA/Megatron-LM@d98e8a6
    transformer_config.py (cp_comm_type: "The all-gather is not async, and cannot be overlapped"). a2a+p2p: its
    all-to-alls (`a2a` seconds of the `cp`) exposed whole as a2a's, the rest, its ring, as p2p's over the ring's
    ranks (cp_ring_size; docs/formulas.md#comm.cp_hierarchical).
    Derived: docs/formulas.md#step.cp"""
    rr = where(plan.full, 1, 0) if r is None else r
    if plan.cp_impl != "te":  # a workload switch: one value for all plans of a search
        return torch_ring_exposed(plan, cp, attention, kappa, rr)
    if plan.cp_comm_type == "a2a+p2p":  # a workload switch too
        return a2a + te_ring_exposed(cp - a2a, attention, cp_ring_size(plan), rr, kappa)
    if plan.cp_comm_type != "p2p":  # in line (CommSeconds.cp_a2a, cp_allgather)
        return cp
    return te_ring_exposed(cp, attention, plan.cp, rr, kappa)


def torch_ring_grad_share(plan: ParallelPlan, r: Any) -> Any:
    """The K/V gradients' share of PyTorch's ring seconds (comm.cp): per layer a rank moves (2 + r)(cp - 1)
    K/V chunks of S bytes (forward, recompute and backward) and cp fp32 gradient chunks of 2S, so the share
    of the bytes it moves (the links, not latency, setting the time). Derived: docs/formulas.md#step.cp"""
    kv = (2 + r) * (plan.cp - 1)
    grads = plan.cp * GRAD_RING_BYTES / 2
    return grads / (kv + grads)


def torch_ring_exposed(plan: ParallelPlan, cp: Any, attention: Any, kappa: float, r: Any) -> Any:
    """Exposed time of PyTorch's ring (cp_impl torch-allgather / torch-alltoall), `cp` seconds of its
    transfers beside `attention` seconds of attention calls (3 + r forward-equivalents: one call of a forward
    pass takes attention / (3 + r) / cp, a backward one twice that). The K/V of each pass (forward, recompute,
    backward): torch-allgather gathers them once, beside the pass's first call only, which the second call waits
    for; torch-alltoall sends one step's beside each call, as Transformer Engine does. The K/V gradients: after
    each of its cp backward calls a rank adds its part to the fp32 gradients it received and sends them on;
    call i + 1 runs beside the send of step i, and the last send, back to the chunk's owner, is waited for
    with nothing beside it. Without cp_comm_overlap (the ring traced by torch.compile) every transfer is waited
    for where it is issued: all `cp` seconds are exposed (docs/formulas.md#step.cp_compiled).
    Source: pytorch/pytorch torch/distributed/tensor/experimental/_attention.py (_templated_ring_attention and
    _templated_ring_attention_backward: the rotater's exchange_buffers before the step's op call and
    next_buffer at the next step, _AllGatherRotater gathering once; dkv_rotater's next_buffer after the loop);
    pytorch/torchtitan torchtitan/config_manager.py at 9dec370 (context_parallel_rotate_method, default
    allgather). Derived: docs/formulas.md#step.cp"""
    grads = cp * torch_ring_grad_share(plan, r)
    per_pass = (cp - grads) / (2 + r)  # one pass's K/V
    call = attention / (3 + r) / plan.cp  # one forward call
    steps = 1 if plan.cp_impl == "torch-allgather" else plan.cp - 1  # the calls a pass's K/V run beside
    kv = (1 + r) * overlap(per_pass, call * steps, kappa) + overlap(per_pass, 2 * call * steps, kappa)
    last = grads / plan.cp
    return where(plan.cp_comm_overlap, kv + last + overlap(grads - last, 2 * call * (plan.cp - 1), kappa), cp)


def tp_exposed(plan: ParallelPlan, tp: Any, sc: StageCompute, kappa: float, r: Any = None,
               rs_share: Any = 0.0, unfused_share: Any = 0.0, ub_kappa: Any = None, step_waits: Any = 0.0) -> Any:
    """Exposed TP time of one micro-batch on one stage. Megatron-LM by default overlaps the backward
    collectives of the column-parallel linears (SP: the re-gather of the saved input beside the input-gradient
    GEMM, the input gradient's reduce-scatter beside the weight-gradient GEMM: 4 of a layer's 10 + 4r) with
    about the forward GEMM time; forward and recompute collectives, and with SP the row-parallel linears'
    output-gradient all-gathers (synchronous before their input-gradient GEMM), are exposed. With
    --tp-comm-overlap (and SP) Transformer Engine's userbuffers overlap every collective with a GEMM by its
    default methods: a ring exchange for the all-gathers feeding a GEMM (forward QKV and fc1, the output
    gradients of the output projection and fc2), whose first GEMM chunk is the rank's own shard, so nothing
    waits; bulk overlaps in backward (the re-gathers beside the input-gradient GEMMs, the input-gradient
    reduce-scatters beside the weight-gradient GEMMs); the forward reduce-scatters (`rs_share` of the TP
    seconds, comm.tp_forward_rs_share) pipelined in TE_PIPELINE_SPLITS chunks, each beside the next chunk's
    GEMM, the last one after the last GEMM; where a chunk step's transfer outlasts its GEMM chunk, the GEMMs
    wait `step_waits` more (comm.tp_chunk_step_waits), neither hidden nor counted as overlapped. DTensor TP
    (tp_impl, torchtitan: each TransformerBlock compiled as its own graph, Inductor's
    reorder_for_compute_comm_overlap off by default) waits for every collective where the graph uses its
    result, so without async TP nothing hides; async TP splits each fused
    collective into tp chunks, all but the first beside the GEMMs, and the backward's input-gradient
    reduce-scatters it cannot fuse (`unfused_share` of the TP seconds, comm.tp_unfused_rs_share) stay
    exposed. What overlaps costs its contention (overlap): NCCL's kappa, but under userbuffers `ub_kappa`,
    the SMs their methods hold (comm.tp_overlap_contention). With tp_backward_overlap off, nothing hides.
    Source: Korthikanti et al. 2022 §4.2.2; Megatron-LM tensor_parallel/layers.py (async gradient
    communication, 3f65246911) and mappings.py (_ReduceScatterToSequenceParallelRegion.backward, d98e8a6);
    Transformer Engine module/base.py grad_output_preprocess (d0067d0); TE v2.8 initialize_ub
    (methods, num_splits) and common/comm_gemm_overlap/comm_gemm_overlap.cpp (CommOverlapP2PBase::
    split_overlap_ag: chunk i = 0 is the local shard; CommOverlapBase::split_overlap_rs); Wang et al. 2022
    (overlap by decomposition). Derived: docs/formulas.md#step.tp"""
    r = where(plan.full, 1, 0) if r is None else r  # the share of the stage's layers recomputed
    megatron = plan.tp_impl == "megatron"  # rs_share, ub_kappa, step_waits apply here; unfused_share elsewhere
    # Megatron-LM / Transformer Engine with SP: of a layer's 10 + 4r collectives the 2 re-gathers and the 2
    # input-gradient reduce-scatters run asynchronously (layers.py LinearWithGradAccumulationAndAsync-
    # Communication, TE _Linear.backward async_op=True); the 2 output-gradient all-gathers of the row-parallel
    # linears do not (mappings.py _ReduceScatterToSequenceParallelRegion.backward, TE grad_output_preprocess).
    # DTensor TP (tp_impl) issues each collective in program order and waits where its result is used: the
    # input-gradient reduce-scatter follows the weight-gradient matmuls of its linears, and no pass reorders
    # them (torch/_inductor/config.py reorder_for_compute_comm_overlap False; torchtitan 9dec370 sets only
    # _micro_pipeline_tp), so none of its 8 + 4r collectives hides.
    sp_share = where(megatron, 4 / (10 + 4 * r), 0.0)
    # without the asynchronous backward collectives (tp_backward_overlap off: Megatron-LM before 2021-09, the
    # Megatron-DeepSpeed forks of 2021-22) every collective waits for its GEMM and blocks the next
    backward = where(plan.tp_backward_overlap, where(plan.sp, sp_share, 2 / (4 + 2 * r)), 0.0) * tp
    wgrad = sc.gemm / (3 + r)
    default = tp - backward + overlap(backward, wgrad, kappa)
    unfused = where(megatron, 0.0, tp * unfused_share)  # exposed whole
    waits = where(megatron, tp * rs_share / TE_PIPELINE_SPLITS + step_waits, (tp - unfused) / plan.tp)
    ub = where(megatron, kappa if ub_kappa is None else ub_kappa, kappa)
    chunked = unfused + waits + overlap(tp - unfused - waits, sc.gemm, ub)
    return where(plan.tp_comm_overlap & plan.sp, chunked, default)


def tp_edge_exposed(plan: ParallelPlan, sync: Any, async_: Any, window: Any, kappa: float) -> Any:
    """Exposed seconds of one micro-batch's TP collectives outside the decoder layers on one stage
    (cost.comm.tp_edge_transfers): the synchronous ones whole (the embedding's, the loss's, the heads' forward
    gathers: no userbuffers outside the TE decoder linears); the heads' backward collectives, issued async_op,
    beside `window`, the heads' weight-gradient GEMMs (one pass of their forward GEMMs), at NCCL's contention;
    all exposed with tp_backward_overlap off. Source: NVIDIA/Megatron-LM at core_v0.14.0 and d98e8a64dd,
    megatron/core/tensor_parallel/layers.py (LinearWithGradAccumulationAndAsyncCommunication.backward).
    Derived: docs/formulas.md#step.tp_edge"""
    return sync + where(plan.tp_backward_overlap, overlap(async_, window, kappa), async_)


def dp_exposed_per_mb(plan: ParallelPlan, comm: CommSeconds, sc: StageCompute, kappa: float,
                      layers: Any, m: ModelSpec) -> Any:
    """ZeRO-2/3 and FSDP, per micro-batch: ZeRO-3's forward weight all-gather hides in the forward; its
    backward all-gather and the gradient reduce-scatter of ZeRO >= 2 share the backward window and its links,
    so their times add before the window hides them. Switching an overlap off exposes that collective. Each
    layer is gathered and reduced on its own (one FSDP unit per layer of the stage's `layers`): the first
    layer's forward gather has no compute before it and the last layer's reduce-scatter none after it, so
    those two are exposed even with overlap. Per tensor (DeepSpeed stage 3 of 2021, zero3_unit tensor, with
    the model `m`), only the prefetched share of each pass's gathers can hide, and the backward skips the kept
    share (zero3_tensor_shares).
    Source: Rajbhandari et al. 2020 §7; PyTorch FSDP (Zhao et al. 2023 §3.3, prefetch). Derived:
    docs/formulas.md#step.dp"""
    n = plan.num_microbatches  # under a pipeline they run once per step (PlanQuantities.sharded_per_microbatch)
    _, pre_f, pre_r, pre_b = zero3_tensor_shares(m)
    tensor, r = plan.zero3_unit == "tensor", recomputed_share(plan, layers)
    pre_f, pre_b = where(tensor, pre_f, 1.0), where(tensor, r * pre_r + (1 - r) * pre_b, 1.0)
    gathers = zero3_gathers(plan, layers, m)
    # the replicas' once-a-step collectives are the step's (dp_exposed_per_step; step.hsdp_outer)
    ag = where(plan.gathered_per_microbatch, (comm.dp_gather - comm.dp_outer_gather) / (gathers * n), 0.0)
    ag_b = ag * (gathers - 1)  # the backward's gather, and a per-tensor recompute's
    rs = where(plan.sharded_per_microbatch, (comm.dp_reduce - comm.dp_outer_reduce) / n, 0.0)
    backward = sc.total - sc.forward
    edge = 1 - 1 / maximum(layers, 1)  # the share of a pass's gather or reduction that has compute beside it
    mf, unit_share = megatron_fsdp_unit_share(plan, m)
    # Megatron-FSDP: the non-unit bucket gathered once a step, exposed; its reduce-scatter and the last unit's
    # backward gather exposed too (megatron_fsdp_unit_share). Derived: docs/formulas.md#step.megatron_fsdp_edges
    ag_once = where(mf, ag * (1 - unit_share) / n, 0.0)
    ag, ag_b = ag * unit_share, ag_b * unit_share
    hide_f = where(plan.overlap_param_gather, ag * edge * pre_f, 0.0)
    hide_b = where(plan.overlap_param_gather, ag_b * pre_b * where(mf, edge, 1.0), 0.0) \
        + where(plan.overlap_grad_reduce, rs * edge * unit_share, 0.0)
    host = where(plan.gathered_per_microbatch, comm.dp_host / n, 0.0)  # serial with the GPU (zero3_host_seconds)
    return (ag - hide_f) + overlap(hide_f, sc.forward, kappa) + (ag_b + rs - hide_b) + overlap(hide_b, backward,
                                                                                             kappa) + host + ag_once


def megatron_fsdp_unit_share(plan: ParallelPlan, m: ModelSpec) -> tuple[Any, Any]:
    """(whether Megatron-FSDP runs the plan's ZeRO-2/3: plan.megatron_fsdp without a pipeline, the share of the
    rank's parameters in its FSDP units, the decoder layers; 1 where it does not run). The embedding, final norm
    and output layer share one non-unit bucket: gathered at its first use once a step and kept whole
    (AllGatherPipeline.reset(preserve_non_fsdp_units=True)), its gradients reduce-scattered once the embedding's
    backward has made them, after the last unit's. Only units carry the pre-backward hook that gathers and
    prefetches in backward order, so the last unit, freed after its forward, is gathered with nothing beside it.
    Source: NVIDIA/Megatron-LM d98e8a64dd megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py
    (_register_fsdp_hooks) and param_and_grad_buffer.py (AllGatherPipeline, GradReducePipeline)."""
    mf = megatron_fsdp_acts(plan)
    if not np.any(mf):
        return mf, 1.0
    total = rank_params(m, plan, 0).total
    return mf, where(mf, 1 - stage_end_params(m, plan, 0) / maximum(total, 1.0), 1.0)


def zero3_gathers(plan: ParallelPlan, layers: Any, m: ModelSpec) -> Any:
    """ZeRO-3 all-gathers of the weights per micro-batch: forward and backward; per tensor (plan.zero3_unit),
    the recompute forward of the stage's recomputed layers gathers again, as each module's weights are
    released after its forward (DeepSpeed stage 3 of 2021: release_sub_module after every forward, the
    forward pre-hook fetching again), but the kept share of a layer's weights (zero3_tensor_shares of `m`)
    stays gathered from its recompute forward to its backward, which then gathers only the rest.
    Source: microsoft/DeepSpeed v0.3.13 runtime/zero/stage3.py
    (pre_sub_module_forward_function / post_sub_module_forward_function, PartitionedParameterCoordinator).
    Derived: docs/formulas.md#comm.zero3_unit"""
    kept = zero3_tensor_shares(m)[0]
    return 2 + where(plan.zero3_unit == "tensor", recomputed_share(plan, layers) * (1 - kept), 0.0)


ZERO3_MAX_REUSE_DISTANCE = 1e9
"""DeepSpeed's stage3_max_reuse_distance default in elements (deepspeed/runtime/zero/constants.py at v0.3.13 ..
v0.4.0): a released module's weights stay gathered when fewer elements are used before their next use."""


def zero3_tensor_shares(m: ModelSpec) -> tuple[float, float, float, float]:
    """DeepSpeed stage 3 of 2021 per tensor, shares of a layer's gathered elements: (kept, prefetched in the
    forward, prefetched in a recomputed layer's backward, prefetched in a plain backward).
    Kept: tensor j is kept from its recompute forward to its backward when the elements used in between, the
    later tensors' recompute forward and backward (2 x their sum), are under stage3_max_reuse_distance
    (_keep_for_later); the layer's last weight always is. Prefetched: the next tensor is gathered ahead, beside
    the current module's compute, only while the tensor just fetched is under stage3_max_live_parameters
    (prefetch_next_sub_modules: total_available_parameter_numel < max_available_parameters_in_numel); the others
    wait for their own gather. Source: microsoft/DeepSpeed v0.3.13 .. v0.4.0 runtime/zero/stage3.py
    (PartitionedParameterCoordinator, PrefetchCoordinator), constants.py (both defaults 1e9).
    Derived: docs/formulas.md#comm.zero3_unit"""
    t = zero3_layer_tensors(m)
    kept = [2 * sum(t[j + 1:]) < ZERO3_MAX_REUSE_DISTANCE for j in range(len(t))]
    rev, every = t[::-1], (True,) * len(t)
    return (sum(n for n, k in zip(t, kept, strict=True) if k) / sum(t),
            _prefetched(t, every),
            _prefetched(t + rev, every + tuple(not k for k in kept[::-1])),
            _prefetched(rev, every))


def _prefetched(seq: tuple[float, ...], gathered: tuple[bool, ...]) -> float:
    """Share of the gathered elements of one layer's fetch sequence `seq` (repeating layer after layer) that
    are prefetched: those fetched after a tensor under stage3_max_live_parameters."""
    total = sum(n for n, g in zip(seq, gathered, strict=True) if g)
    ahead = sum(n for i, (n, g) in enumerate(zip(seq, gathered, strict=True))
                if g and seq[i - 1] < ZERO3_MAX_LIVE_PARAMS)
    return ahead / total if total else 1.0


def chunked_sync_window(plan: ParallelPlan, sync: Any, per_mb: Any) -> Any:
    """Compute that one step's DP synchronisation of `sync` seconds can hide behind, given `per_mb`, one
    micro-batch's backward (reduction) or forward (gather) over the whole stage. Without interleaving: that one
    pass. Interleaved over v chunks, Megatron-LM syncs each chunk on its own: a chunk's gradients are reduced
    once its last backward is done, which is p chunk-passes before the next chunk's, and a chunk's weights are
    gathered while the chunk before it runs its first p micro-batches. On one link in order, what stays
    exposed is the larger of the last chunk's share beyond its own pass (sync/v - w) and the whole sync beyond
    the (v-1)p + 1 chunk-passes it can start before (w = per_mb / v); at v = 1 both are sync - per_mb.
    Source: Megatron-LM core/pipeline_parallel/schedules.py, interleaved schedule (grad_sync_func and
    param_sync_func per model chunk). Derived: docs/formulas.md#step.dp"""
    v, p = plan.vpp, plan.pp
    w = per_mb / v
    return minimum(sync * (v - 1) / v + w, ((v - 1) * p + 1) * w)


def bucket_params(plan: ParallelPlan) -> Any:
    """Parameters in one Megatron-Core DDP bucket: max(40M, 1M x dp) (BUCKET_PARAMS; dp is the gradient's
    reduction group, dp x cp ranks, as Megatron-Core's DDP reduces over the data-parallel group with context
    parallel), or the plan's own dp_bucket_params where it sets one (Megatron-Bridge's 128 x 2^20).
    Derived: docs/formulas.md#step.dp"""
    if plan.dp_bucket_params is not None:
        return plan.dp_bucket_params * 1.0
    return maximum(BUCKET_PARAMS, BUCKET_PARAMS_PER_DP * plan.dp * plan.cp)


def bucket_share(plan: ParallelPlan, params_on_rank: Any, last_param: Any = 0.0) -> Any:
    """The share of a rank's gradients (and gathered weights) in the DP bucket reduced last and gathered first,
    at most all of them: one bucket (bucket_params), or more where that bucket's last parameter, `last_param`
    (the first stage's word embedding, whose gradient backward makes last), is larger, since a bucket takes
    whole parameters and closes only once it holds bucket_params. Source: NVIDIA/Megatron-LM
    megatron/core/distributed/param_and_grad_buffer.py at core_r0.8.0 (ParamAndGradBuffer.__init__: params
    in reverse order, a bucket closed when data_end_index - bucket_data_start_index >= bucket_size).
    Derived: docs/formulas.md#step.dp_last_bucket"""
    return minimum(1.0, maximum(bucket_params(plan), last_param) / maximum(params_on_rank, 1.0))


def optstep_gather_exposed(plan: ParallelPlan, gather: Any, optimizer_s: Any, kappa: float) -> Any:
    """Exposed seconds of the first model chunk's weight all-gather under
    overlap_param_gather_with_optimizer_step, of a step's whole gather `gather` and optimizer step `optimizer_s`:
    the chunk (1/v of the rank's weights, one bucket) is gathered whole right after its own optimizer step,
    beside the other v - 1 chunks' steps, and must end before its first forward.
    Source: NVIDIA/Megatron-LM core_v0.14.0 megatron/core/optimizer/__init__.py (get_megatron_optimizer: the
    first chunk's optimizer apart), optimizer/optimizer.py (ChainedOptimizer.step_with_ready_grads:
    start_param_sync(force_dispatch=True) after optimizer 0), training/training.py (get_model:
    disable_bucketing). Derived: docs/formulas.md#step.dp_optstep_gather"""
    v = plan.vpp
    return overlap(gather / v, optimizer_s * (v - 1) / v, kappa)


def edge_buckets(plan: ParallelPlan, comm: CommSeconds, share: Any, optimizer_s: Any,
                 kappa: float) -> tuple[Any, Any, Any]:
    """(seconds of the last reduced bucket, of the first gathered bucket, and the first's exposed seconds before
    the chunked overlap) of dp_exposed_per_step, of the bucket `share`: one bucket each; where the first model
    chunk is one bucket (dp_first_chunk_unbucketed, Megatron-Core's DDP buckets: ZeRO 0-1) its whole gather,
    1/v of the rank's (step.dp_one_bucket); under overlap_param_gather_with_optimizer_step the last reduced
    bucket at least 1/v too and the first gather exposed beside the other chunks' step (optstep_gather_exposed).
    Nothing selected where no plan has either. Derived: docs/formulas.md#step.dp_optstep_gather,
    docs/formulas.md#step.dp_one_bucket"""
    one = dp_first_chunk_unbucketed(plan) & (plan.zero <= 1)
    first = where(one, comm.dp_gather / plan.vpp, comm.dp_gather * share) if np.any(one) else comm.dp_gather * share
    optstep = param_gather_optstep(plan)
    if optstep is False:
        return comm.dp_reduce * share, first, first
    last = comm.dp_reduce * where(optstep, maximum(share, 1 / plan.vpp), share)
    return last, first, where(optstep, optstep_gather_exposed(plan, comm.dp_gather, optimizer_s, kappa), first)


def gathers_on_warmup_chain(plan: ParallelPlan) -> Any:
    """Elementwise: a later pipeline stage's weight all-gather waits whole on the 1F1B warm-up's chain. Megatron-
    Core's DDP builds every stage after the first unbucketed (one bucket per buffer); without interleaving
    align_param_gather is off, so the gather is dispatched by the first forward pre-hook, which runs after the
    stage has received its input: stage j's whole gather delays its first forward and, through the chain, every
    later stage's (the step's). The distributed optimizer's overlapped gather (ZeRO-1, overlap_param_gather) on
    Megatron-Core's 1F1B only. Source: NVIDIA/Megatron-LM d98e8a64dd megatron/core/distributed/
    distributed_data_parallel.py (__init__: "if disable_bucketing or pp_rank > 0: self.bucket_size = None"),
    param_and_grad_buffer.py (finish_param_sync: "If current bucket's param AG has not been dispatched,
    dispatch it now"), training/arguments.py (align_param_gather False without interleaving),
    pipeline_parallel/schedules.py (forward_backward_pipelining_without_interleaving: recv_forward, then
    forward_step). Derived: docs/formulas.md#step.dp_later_stages"""
    return ((plan.pp > 1) & (plan.vpp == 1) & (plan.pp_schedule == "1f1b") & (plan.zero == 1)
            & plan.overlap_param_gather)


def later_stage_unbucketed(plan: ParallelPlan, stage: Any) -> Any:
    """Elementwise: pipeline stage `stage` runs Megatron-Core's DDP with the gradient-reduce overlap and without
    buckets, one reduction and one gather per model chunk: a stage after the first (its DDP sets bucket_size
    None for pp_rank > 0, whatever the flags), on Megatron-Core's schedules (pp_schedule 1f1b, interleaved or
    not), ZeRO 0-1. Without the overlap every stage is one bucket per chunk already (comm.dp_bucket).
    Source: NVIDIA/Megatron-LM d98e8a64dd megatron/core/distributed/distributed_data_parallel.py (__init__:
    "if disable_bucketing or pp_rank > 0: self.bucket_size = None"). Derived: docs/formulas.md#step.dp_later_rs"""
    return (stage > 0) & (plan.pp_schedule == "1f1b") & (plan.zero <= 1) & plan.overlap_grad_reduce


def later_stage_reduce_exposed(plan: ParallelPlan, reduce: Any, slack: Any, backward: Any, kappa: float) -> Any:
    """Exposed seconds, after the first stage's last backward, of a later stage's unbucketed gradient reduction
    of `reduce` seconds (later_stage_unbucketed), `slack` seconds of the 1F1B cool-down after its own last
    backward (cooldown_slack), `backward` one micro-batch's backward of the stage. Each chunk is one
    reduction, dispatched once the chunk's last backward is over: the last chunk's, 1/v, in the slack beside no
    compute of the stage. Interleaved, the other chunks' are dispatched in step with the first stage's
    (align_grad_reduce), chunk k about k·p chunk-backwards before the end, and share one link in order: the
    whole `reduce` ends no earlier than (v-1)·p chunk-backwards after chunk v-1's dispatch; they slow the compute
    beside them by kappa (overlap). At v = 1: max(0, reduce - slack). Elementwise.
    Source: NVIDIA/Megatron-LM d98e8a64dd megatron/core/pipeline_parallel/schedules.py
    (forward_backward_pipelining_without_interleaving: "Other pipeline stages do grad reduction during
    pipeline bubble", grad_sync_func after the cool-down; interleaved: grad_sync_func at virtual_microbatch_id -
    pipeline_parallel_rank, the chunks left after the cool-down). Derived: docs/formulas.md#step.dp_later_rs"""
    v = plan.vpp
    ahead = (v - 1) * plan.pp * backward / v  # chunk v-1's dispatch before the first stage's last backward ends
    rest = reduce * (v - 1) / v
    busy = where(v > 1, reduce - ahead, 0.0)  # the link still carrying the earlier chunks
    return maximum(0.0, maximum(reduce / v - slack, busy)) + kappa * minimum(rest, ahead)


def cooldown_slack(plan: ParallelPlan, stages: list[Any], backwards: list[Any], per_mb: list[Any],
                   chunk0: list[Any] | None = None) -> list[Any]:
    """Seconds from each stage of `stages`' last backward to the first stage's in the pipeline's cool-down: the
    stages before stage j run their last (chunk-)backward in turn after it, each its own: sum_{i<j} b_i / v,
    `backwards` (b) one micro-batch's backward compute of each candidate stage; an interleaved pp_layout plan's
    chunk 0 is its share of the stage (`chunk0`, layout_chunk_shares), not 1/v: sum_{i<j} b_i·chunk0_i. The
    stages between are priced as the bubble prices them (middle_stage): every stage where the plan lists its
    stages; else the first stage's and, for each of stages 1 .. j-1, the middle backward b_mid. The pipeline
    sends between them are not counted. A lower bound: a stage whose earlier work outlasts the later stage's
    last backward starts its own later (a middle stage lighter than b_mid gets more). Elementwise.
    Source: Narayanan et al. 2021 (§2.2, Fig. 4: the cool-down's backwards in turn, stage p-1 first);
    NVIDIA/Megatron-LM d98e8a64dd megatron/core/pipeline_parallel/schedules.py
    (forward_backward_pipelining_without_interleaving: the cool-down loop, recv_backward then its own backward).
    Derived: docs/formulas.md#step.dp_later_rs"""
    v = plan.vpp
    if explicit_stages(plan) is not None:  # stages = every stage, in order (candidate_stages)
        out, total = [], 0.0 * backwards[0]
        for i, b in enumerate(backwards):  # every stage, in order
            out.append(total if chunk0 is not None else total / v)
            total = total + (b * chunk0[i] if chunk0 is not None else b)
        return out
    t_mid = middle_stage(plan, stages, per_mb)
    b_mid = t_mid - middle_stage(plan, stages, [t - b for t, b in zip(per_mb, backwards, strict=True)])
    return [where(stage > 0, backwards[0] + maximum(stage - 1, 0) * b_mid, 0.0) / v for stage in stages]


def middle_stage(plan: ParallelPlan, stages: list[Any], x: list[Any]) -> Any:
    """The value each of the pp - 2 middle stages is priced at, from `x` of the candidate stages (first, second,
    heaviest MoE, last; candidate_stages): max(x_1, x_2) where candidate 2 is a middle stage (0 < stage < pp - 1),
    else x_1 (a heaviest MoE stage that is the last holds the LM head). The bubble prices the middle micro-batch
    at T = middle_stage(t) (pipeline_sum), the cool-down its backward at b_mid = T - F, F = middle_stage(t - b):
    continuous in every t and b, and min(b_1, b_2) <= b_l <= b_mid <= b_k <= max(b_1, b_2), k the candidate of the
    larger t, l of the larger t - b (T = t_k <= F + b_k, T >= t_l = F + b_l); b_mid = b_1 or b_2 exactly where one
    candidate is both. Bubble less slack (v 1), stage j >= 1: pipeline_sum - cooldown_slack_j = (t_0 - b_0) +
    t_last + (p - 1 - j)·T + (j - 1)·F, coefficients >= 0 and T, F never smaller for more work on any stage: a
    stage's last backward never ends earlier for more work. Elementwise. Derived: docs/formulas.md#step.dp_later_rs"""
    ok = (stages[2] > 0) & (stages[2] < plan.pp - 1)
    return where(ok, maximum(x[1], x[2]), x[1])


def dp_exposed_per_step(plan: ParallelPlan, comm: CommSeconds, sc: StageCompute, kappa: float,
                        params_on_rank: Any, last_param: Any, optimizer_s: Any = 0.0) -> Any:
    """ZeRO 0-1 (distributed optimizer), and ZeRO 2-3 under a pipeline, per step: the gradient reduction
    hides behind the last micro-batch's backward (overlap-grad-reduce); the weights' all-gather behind the
    first forward (overlap-param-gather); interleaved, behind more (chunked_sync_window). The reduction of the
    last bucket starts when the backward is over and the gather of the first bucket must end before the
    forward starts, so one bucket of each (bucket_share; on the first stage the word embedding's, `last_param`)
    is exposed even with overlap. Where the first model chunk is one bucket (dp_first_chunk_unbucketed: no
    gradient-reduce overlap), its whole gather, 1/vpp of the rank's, is what the first forward waits for.
    Source: Megatron-Core distributed/param_and_grad_buffer.py (buckets reduced as their gradients are ready,
    in reverse order; gathered in forward order; finish_param_sync waits on the bucket group's handle).
    Derived: docs/formulas.md#step.dp, docs/formulas.md#step.dp_one_bucket"""
    reduce, gather = _step_windows(plan, comm, sc, kappa, params_on_rank, last_param, optimizer_s)
    # where the shard group reduces (gathers) every micro-batch (dp_exposed_per_mb), only hybrid sharding's
    # collectives across the replicas are the step's, in the same windows (docs/formulas.md#step.hsdp_outer)
    per_mb, gathered = plan.sharded_per_microbatch, plan.gathered_per_microbatch
    if np.any(per_mb & (plan.dp_replicate > 1)):
        o_reduce, o_gather = _step_windows(plan, replace(comm, dp_reduce=comm.dp_outer_reduce,
                                                         dp_gather=comm.dp_outer_gather),
                                           sc, kappa, params_on_rank, last_param, optimizer_s)
    else:
        o_reduce, o_gather = 0.0, 0.0
    return where(per_mb, o_reduce, reduce) + where(gathered, o_gather, gather)


def _step_windows(plan: ParallelPlan, comm: CommSeconds, sc: StageCompute, kappa: float, params_on_rank: Any,
                  last_param: Any, optimizer_s: Any) -> tuple[Any, Any]:
    """(exposed reduction, exposed gather) of comm.dp_reduce / dp_gather run once a step: the reduction behind
    the last backward, the gather behind the first forward, one edge bucket of each exposed (dp_exposed_per_step).
    Derived: docs/formulas.md#step.dp"""
    backward = sc.total - sc.forward
    share = bucket_share(plan, params_on_rank, last_param)
    last, first, first_exposed = edge_buckets(plan, comm, share, optimizer_s, kappa)
    reduce = where(plan.overlap_grad_reduce,
                   last + overlap(comm.dp_reduce - last, chunked_sync_window(plan, comm.dp_reduce - last, backward),
                                  kappa),
                   comm.dp_reduce)
    gather = where(plan.overlap_param_gather & (plan.zero >= 1),
                   first_exposed + overlap(comm.dp_gather - first,
                                           chunked_sync_window(plan, comm.dp_gather - first, sc.forward), kappa),
                   comm.dp_gather)
    return reduce, gather
