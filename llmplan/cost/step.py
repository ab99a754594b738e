"""Step time of a training plan: compute, pipeline bubble, exposed communication and optimizer step, and
the throughput that follows (tokens/s, TFLOP/s per GPU, MFU, HFU).

Works on one ParallelPlan and, elementwise, on plan arrays (see llmplan/arith.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from llmplan.arith import expected_max_normal, maximum, minimum, where
from llmplan.cost.breakdown import Breakdown
from llmplan.cost.compute import (
    KERNEL_LAUNCH_S,
    StageCompute,
    model_flops_per_step,
    optimizer_step_seconds,
    recompute_flops_per_step,
    stage_compute,
)
from llmplan.cost.hybrid_stage import balanced_stage_compute
from llmplan.cost.memory import candidate_stages, each_stage
from llmplan.cost.moe import (
    EAGER_OP_HOST_S,
    HOST_SYNC_S,
    MOE_CYCLE_HOST_OPS,
    MOE_POST_SYNC_HOST_OPS,
    dispatch_contention,
    ep_exposed,
    host_syncs_per_layer,
)
from llmplan.cost.params import (
    ALL_BUT_ZERO,
    chunk_layers,
    explicit_stages,
    max_stage_layers,
    per_distinct,
    rank_params,
    recomputed_share,
    stage_layers,
)
from llmplan.cost.schedule import makespan
from llmplan.specs.hardware import GpuSpec
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan, has_layout
from llmplan.specs.schedule import schedule_of

GPU_SPEED_SPREAD = 0.012
"""Standard deviation of one GPU's sustained speed around its fleet's mean, as a fraction. Sinha et al. 2022
("Not All GPUs Are Created Equal", SC'22, abstract) measure an 8% average performance variation (22% at most)
among the identical GPUs of each of five clusters of hundreds to thousands of GPUs; read as the range of
about 1,000 normal draws (2 x 3.24 standard deviations, expected_max_normal), that is 1.2%.
Derived: docs/formulas.md#step.overhead"""
BUCKET_PARAMS, BUCKET_PARAMS_PER_DP = 40e6, 1e6
"""Megatron-Core's default gradient bucket: max(40M, 1M x dp) parameters (DistributedDataParallelConfig
.bucket_size: "larger DP sizes need larger buckets to ensure collectives do not become latency-bound")."""
LAYER_KERNELS = 12
"""Kernels one transformer layer launches in a forward pass with fused kernels: four GEMMs (QKV, output
projection, the two MLP GEMMs; the gate fused with the up projection), the attention kernel, and about seven
memory-bound ones (two norms, rotary, activation, two residual adds, a cast); the TP collectives come on top
(two per layer). Backward launches about twice as many, recompute one forward more."""

MOE_LAYER_KERNELS = 14
"""Kernels a dropless MoE layer's forward launches beyond a dense layer's LAYER_KERNELS, in Megatron-Core with
the fused router, permute and grouped GEMM: the router GEMM, the fused top-k and its auxiliary loss (2), the
token counts and their gather over the EP group (2), the copy of the counts to the host, the permute, the two
all-to-alls, the sort of the received rows by local expert and its inverse, the unpermute, and the quantisation
of the two grouped GEMMs' inputs (2); the two grouped GEMMs and the activation take the dense MLP's three
places. Source: Megatron-LM megatron/core/transformer/moe/ (router.py, token_dispatcher.py, experts.py) at
d98e8a6, counted along the forward. Derived: docs/formulas.md#step.host_sync"""
GRAPH_LAUNCHES = 2
"""Graph launches per layer's forward under per-layer CUDA graphs (cuda_graphs "layers"): the attention part and
the MLP (a dense layer) or the router and preprocessing (a MoE layer), one launch each."""
GRAPHED_MOE_EAGER = 8
"""Kernels of a MoE layer's forward that stay eager under per-layer CUDA graphs: the permute, all-to-alls, grouped
GEMMs, activation and unpermute after the host's wait."""
GRAPHED_LAYER_KERNELS = GRAPH_LAUNCHES + GRAPHED_MOE_EAGER
"""Launches left per MoE layer's forward under per-layer CUDA graphs."""

BOTTLENECKS = ("compute", "attention", "memory-bound", "bubble", "tp", "pp", "dp", "cp", "ep", "optimizer", "overhead")


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


@dataclass(frozen=True)
class StepTime(Breakdown):
    """One training step of the most-loaded rank; compute + bubble + comm_exposed + optimizer + overhead =
    total."""

    PARTS: ClassVar[tuple[str, ...]] = ("compute", "bubble", "comm_exposed", "optimizer", "overhead")

    compute: Any
    bubble: Any
    comm_exposed: Any
    """Communication not hidden behind compute, plus the compute slowed by communication beside it."""
    optimizer: Any
    """Optimizer step and gradient clipping."""
    overhead: Any
    """Time per step outside the model's kernels and collectives: the sum of `overheads`."""
    exposed: dict[str, Any]
    """Exposed seconds per axis (tp, pp, dp, cp, ep); they sum to comm_exposed."""
    stage: StageCompute
    """Per-micro-batch compute of the slowest stage."""
    model_flops: Any
    hardware_flops: Any
    overheads: dict[str, Any]
    """The parts of `overhead` (they sum to it): host (kernel launches the GPU waits for), stragglers (the
    slowest of the job's GPUs sets the pace) and measured (GpuSpec.step_overhead_s, 0 unless a fleet's
    profile sets it)."""


def stage_times(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec,
                stage_gpus: tuple[GpuSpec, ...] | None = None) -> list[tuple[Any, StageCompute, Any, Any]]:
    """(stage, per-micro-batch compute, its layers, its MoE layers) of every candidate stage; `stage_gpus`
    (a plan that lists its stages, one GPU per stage: a pipeline over pools of different GPUs, cost.hetero)
    runs each stage on its own GPU."""
    same: dict[tuple, StageCompute] = {}  # an explicit per-stage list repeats its layer counts stage after stage

    def priced(g: GpuSpec) -> Any:
        """A stage's compute on GPU g: a hybrid stack's stage at the mixer kinds it holds (cost.hybrid_stage),
        so stages with equal layer counts may differ."""
        if m.is_hybrid:
            return lambda p, i: balanced_stage_compute(m, p, g, i, *stage_layers(m, p, i), i == p.pp - 1)
        return lambda p, i: stage_compute(m, p, g, *stage_layers(m, p, i), i == p.pp - 1)

    def one(stage: Any) -> tuple[Any, StageCompute, Any, Any]:
        n_dense, n_moe = stage_layers(m, plan, stage)
        last = stage == plan.pp - 1
        g = stage_gpus[stage] if stage_gpus is not None else gpu
        key = (n_dense, n_moe, last, id(g)) if isinstance(stage, int) and not m.is_hybrid else None
        sc = same.get(key) if key else None
        if sc is None:  # on plan arrays, once per plan group that differs in the ZeRO stage alone
            sc = per_distinct(plan, ALL_BUT_ZERO, stage, priced(g))
            if key:
                same[key] = sc
        return stage, sc, n_dense + n_moe, n_moe

    return each_stage(candidate_stages(m, plan), one)


def _pick_stage(cond: Any, a: StageCompute, b: StageCompute) -> StageCompute:
    return StageCompute(*(where(cond, getattr(a, f), getattr(b, f)) for f in ("gemm", "attention", "memory_bound",
                                                                                "forward")))


def pipeline_sum(plan: ParallelPlan, per_mb: list[Any]) -> Any:
    """Sum over all pipeline stages of one micro-batch's time, from the candidate stages' times (first,
    second, heaviest MoE, last; every stage for an explicit per-stage list): the middle stages take the
    slower of the second and the heaviest MoE stage."""
    if explicit_stages(plan) is not None:
        return sum(per_mb)
    p = plan.pp
    return per_mb[0] + where(p > 1, per_mb[3], 0.0) + maximum(p - 2, 0) * maximum(per_mb[1], per_mb[2])


def layout_chunk_shares(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec) -> tuple[list[list[Any]], list[Any]]:
    """([stage][chunk] share of the stage's micro-batch compute, [stage] forward share of it) of a pp_layout
    plan: stage_compute of each chunk's layers, the loss with the chunk that holds L (the last one). Elementwise
    where the GPU's constants are arrays. Derived: docs/formulas.md#pipeline.layout"""
    v, share, forward = plan.vpp, [], []
    same: dict[tuple[int, int, bool], StageCompute] = {}  # chunks of equal layer counts: priced once
    for i, row in enumerate(chunk_layers(m, plan)):
        times = [chunk_compute(m, plan, gpu, d, e, i == plan.pp - 1 and c == v - 1, same)
                 for c, (d, e) in enumerate(row)]
        total = sum(t.total for t in times)
        some = total > 0
        share.append([where(some, t.total / where(some, total, 1.0), 1 / v) for t in times])
        forward.append(where(some, sum(t.forward for t in times) / where(some, total, 1.0), 1 / 3))
    return share, forward


def chunk_compute(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec, d: int, e: int, last: bool,
                  same: dict[tuple[int, int, bool], StageCompute]) -> StageCompute:
    """stage_compute of a chunk of d dense and e MoE layers (with the loss when `last`), once per such chunk."""
    if (d, e, last) not in same:
        same[(d, e, last)] = stage_compute(m, plan, gpu, d, e, last)
    return same[(d, e, last)]


def layout_bubble(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec, per_mb: list[Any], worst: Any) -> Any:
    """Bubble of an interleaved pp_layout plan, whose chunks differ: the schedule simulation (cost.schedule)
    with each stage's micro-batch time (per_mb, every stage) split over its chunks as layout_chunk_shares,
    minus the n micro-batches of the slowest stage. With equal stages and chunks it is the closed form's
    (p - 1)t/v. The simulation is scalar: where the times are arrays (a GPU whose constants are arrays) it runs
    once per element. Derived: docs/formulas.md#pipeline.layout"""
    share, forward = layout_chunk_shares(m, plan, gpu)
    n = plan.num_microbatches
    shape = np.broadcast_shapes(*(np.shape(x) for x in (*per_mb, worst, *forward, *(y for row in share for y in row))))
    out = np.empty(shape)
    for k in np.ndindex(shape):
        at = lambda x: float(np.broadcast_to(x, shape)[k])
        fwd = [at(t) * at(f) for t, f in zip(per_mb, forward)]
        bwd = [at(t) * (1 - at(f)) for t, f in zip(per_mb, forward)]
        out[k] = max(makespan(fwd, bwd, n, plan.vpp, [[at(x) for x in row] for row in share]) - n * at(worst), 0.0)
    return float(out) if out.ndim == 0 else out


def schedule_bubble_factor(plan: ParallelPlan, sc: StageCompute) -> Any:
    """The schedule's bubble over 1F1B's (p - 1)(F + B), with F the forward and B the backward of a
    micro-batch on a stage and W = B/2 its weight-gradient half, from the schedule's record (specs.schedule):
    (p/pipes - 1)(F + b·B - w·W). 1F1B (pipes 1, b 1, w 0): 1; zero-bubble (ZB1P) (p - 1)(F + B - 2W);
    DualPipe (p/2 - 1)(F&B + B - 3W) with F&B = F + B (a paired forward and backward).
    Source: DeepSeek-V3 technical report (Liu et al. 2024), Table 2; Qi et al. 2024 (zero bubble).
    Derived: docs/formulas.md#step.schedule"""
    s = schedule_of(plan)
    F = sc.forward
    B = sc.total - sc.forward
    W = B / 2
    p = plan.pp
    stages = maximum(p / s.bubble_pipes - 1, 0) / maximum(p - 1, 1)
    return stages * (F + s.bubble_backward * B - s.bubble_weight * W) / maximum(F + B, 1e-30)


def overlap(comm: Any, window: Any, kappa: float) -> Any:
    """Time a transfer of `comm` seconds adds when it runs beside `window` seconds of compute: what does not
    fit in the window, plus the compute it slows while they share the GPU (kappa of the overlapped time).
    Never less than without overlap's zero, never more than comm (1 + kappa).
    Derived: docs/formulas.md#step.overlap"""
    return maximum(0.0, comm - window) + kappa * minimum(comm, window)


def tp_exposed(plan: ParallelPlan, tp: Any, sc: StageCompute, kappa: float, r: Any = None) -> Any:
    """Exposed TP time of one micro-batch on one stage. Megatron-LM by default overlaps the backward
    collectives of the input gradients (SP: the re-gather and the reduce-scatter) with the weight-gradient
    GEMMs (about the forward GEMM time); forward and recompute collectives are exposed. With
    --tp-comm-overlap the collectives are split into tp ring chunks that overlap the GEMMs, all but the
    first chunk. Source: Korthikanti et al. 2022 §4.2.2; Megatron-LM tensor_parallel/layers.py (async
    gradient communication); Wang et al. 2022 (overlap by decomposition). Derived: docs/formulas.md#step.tp"""
    r = where(plan.full, 1, 0) if r is None else r  # the share of the stage's layers recomputed
    # DTensor TP (tp_impl) gathers nothing again in backward: of its 8 + 4r collectives the same ones hide
    # (the input-gradient reduce-scatters and the row-parallel gradient gathers), by the compiler's scheduling.
    sp_share = where(plan.tp_impl == "megatron", 6 / (10 + 4 * r), 4 / (8 + 4 * r))
    backward = where(plan.sp, sp_share, 2 / (4 + 2 * r)) * tp
    wgrad = sc.gemm / (3 + r)
    default = tp - backward + overlap(backward, wgrad, kappa)
    chunked = tp / plan.tp + overlap(tp * (1 - 1 / plan.tp), sc.gemm, kappa)
    return where(plan.tp_comm_overlap & plan.sp, chunked, default)


def dp_exposed_per_mb(plan: ParallelPlan, comm: CommSeconds, sc: StageCompute, kappa: float,
                      layers: Any = 1) -> Any:
    """ZeRO-2/3 and FSDP, per micro-batch: ZeRO-3's forward weight all-gather hides in the forward; its
    backward all-gather and the gradient reduce-scatter of ZeRO >= 2 share the backward window and its links,
    so their times add before the window hides them. Switching an overlap off exposes that collective. Each
    layer is gathered and reduced on its own (one FSDP unit per layer of the stage's `layers`): the first
    layer's forward gather has no compute before it and the last layer's reduce-scatter none after it, so
    those two are exposed even with overlap.
    Source: Rajbhandari et al. 2020 §7; PyTorch FSDP (Zhao et al. 2023 §3.3, prefetch). Derived:
    docs/formulas.md#step.dp"""
    n, flat = plan.num_microbatches, plan.pp == 1  # under a pipeline they run once per step (comm.dp_transfers)
    ag = where((plan.zero >= 3) & flat, comm.dp_gather / (2 * n), 0.0)
    rs = where((plan.zero >= 2) & flat, comm.dp_reduce / n, 0.0)
    backward = sc.total - sc.forward
    edge = 1 - 1 / maximum(layers, 1)  # the share of a pass's gather or reduction that has compute beside it
    hide_f = where(plan.overlap_param_gather, ag * edge, 0.0)
    hide_b = where(plan.overlap_param_gather, ag, 0.0) + where(plan.overlap_grad_reduce, rs * edge, 0.0)
    return (ag - hide_f) + overlap(hide_f, sc.forward, kappa) + (ag + rs - hide_b) + overlap(hide_b, backward, kappa)


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


def bucket_share(plan: ParallelPlan, params_on_rank: Any) -> Any:
    """The share of a rank's gradients (and gathered weights) in one DP bucket: max(40M, 1M x dp) parameters
    (BUCKET_PARAMS) of the stage's parameters, at most all of them. Derived: docs/formulas.md#step.dp"""
    bucket = maximum(BUCKET_PARAMS, BUCKET_PARAMS_PER_DP * plan.dp * plan.cp)
    return minimum(1.0, bucket / maximum(params_on_rank, 1.0))


def dp_exposed_per_step(plan: ParallelPlan, comm: CommSeconds, sc: StageCompute, kappa: float,
                        params_on_rank: Any = 0.0) -> Any:
    """ZeRO 0-1 (distributed optimizer), and ZeRO 2-3 under a pipeline, per step: the gradient reduction
    hides behind the last micro-batch's backward (overlap-grad-reduce); the weights' all-gather behind the
    first forward (overlap-param-gather); interleaved, behind more (chunked_sync_window). The reduction of the
    last bucket starts when the backward is over and the gather of the first bucket must end before the
    forward starts, so one bucket of each (bucket_share) is exposed even with overlap.
    Source: Megatron-Core distributed/param_and_grad_buffer.py (buckets reduced as their gradients are ready,
    in reverse order; gathered in forward order). Derived: docs/formulas.md#step.dp"""
    backward = sc.total - sc.forward
    share = bucket_share(plan, params_on_rank)
    last, first = comm.dp_reduce * share, comm.dp_gather * share
    reduce = where(plan.overlap_grad_reduce,
                   last + overlap(comm.dp_reduce - last, chunked_sync_window(plan, comm.dp_reduce - last, backward),
                                  kappa),
                   comm.dp_reduce)
    gather = where(plan.overlap_param_gather & (plan.zero >= 1),
                   first + overlap(comm.dp_gather - first,
                                   chunked_sync_window(plan, comm.dp_gather - first, sc.forward), kappa),
                   comm.dp_gather)
    flat = plan.pp == 1
    return where((plan.zero >= 2) & flat, 0.0, reduce) + where((plan.zero >= 3) & flat, 0.0, gather)


def straggler_seconds(plan: ParallelPlan, busy: Any) -> Any:
    """Time the job loses to its slowest GPU: every collective waits for the last rank to arrive, and the
    GPUs of one type differ in sustained speed by GPU_SPEED_SPREAD (one standard deviation), so a step whose
    GPUs compute for `busy` seconds takes busy x spread x E[max of N normal draws] longer with N GPUs.
    Derived: docs/formulas.md#step.overhead"""
    return busy * GPU_SPEED_SPREAD * expected_max_normal(plan.num_gpus)


def host_seconds(plan: ParallelPlan, layers: Any, per_mb: Any, r: Any, moe_layers: Any = 0,
                 syncs_per_layer: Any = 0.0, layer_gpu_s: Any = 0.0) -> Any:
    """Time the GPU waits for the host to launch kernels: at the start of the step (the optimizer step reads
    the gradient norm back to the host, so the queue is empty) one layer's forward launches; and, per
    micro-batch, whatever the host's launches (LAYER_KERNELS per layer forward plus the TP collectives, and
    MOE_LAYER_KERNELS more per MoE layer; twice that in backward, once more under recompute; KERNEL_LAUNCH_S
    each) take beyond the GPU's `per_mb`; plus the host waits of the MoE layers (host_sync_seconds, with
    `layer_gpu_s` one layer's forward on the GPU). Per-layer CUDA graphs leave 2 launches per dense layer
    (attention, MLP) and GRAPHED_LAYER_KERNELS per MoE layer; a full-iteration graph none inside the step.
    Source: CUDA C++ Programming Guide (asynchronous launches: the host runs ahead of the GPU until it
    synchronises). Derived: docs/formulas.md#step.overhead, #step.host_sync"""
    graphed = plan.cuda_graphs == "layers"
    per_layer = where(graphed, GRAPH_LAUNCHES, LAYER_KERNELS + where(plan.tp > 1, 2, 0)) * KERNEL_LAUNCH_S
    per_moe = where(graphed, GRAPHED_MOE_EAGER, MOE_LAYER_KERNELS) * KERNEL_LAUNCH_S
    launches = (per_layer * layers + per_moe * moe_layers) * (3 + r)
    launches = where(plan.cuda_graphs == "full-iteration", 0.0, launches)
    ops = where(graphed, MOE_POST_SYNC_HOST_OPS + GRAPH_LAUNCHES, MOE_CYCLE_HOST_OPS)
    sync = host_sync_seconds(moe_layers, r, syncs_per_layer, ops, layer_gpu_s)
    return per_layer + plan.num_microbatches * (maximum(launches - per_mb, 0.0) + sync)


def host_sync_seconds(moe_layers: Any, r: Any, syncs_per_layer: Any, cycle_ops: Any = 0,
                      layer_gpu_s: Any = 0.0) -> Any:
    """GPU idle time of one micro-batch's host waits. Each MoE layer's forward (once more under recompute) waits
    `syncs_per_layer` times for its token counts on the host (cost.moe.host_syncs_per_layer): the host cannot
    queue work past the wait, so the GPU drains its queue and idles for the wake-up (HOST_SYNC_S); from there on
    the GPU runs at the host's pace. With the host issuing ops at h_i and the GPU running them in g_i, the GPU
    idles max_j(h_1 + .. + h_j - g_1 - .. - g_(j-1)) until the next wait drains the queue again; over the
    `cycle_ops` eager ops (EAGER_OP_HOST_S each) between two waits and one layer's forward on the GPU
    (`layer_gpu_s`), that is at least the first op's issue and at least the cycle's host time beyond its GPU
    time: HOST_SYNC_S + max(EAGER_OP_HOST_S, cycle_ops x EAGER_OP_HOST_S - layer_gpu_s) per wait. Backward is
    driven by autograd's C++ engine with the forward's counts and does not wait.
    Source: CUDA C++ Programming Guide (a wait on an event blocks the host until the GPU has reached it).
    Derived: docs/formulas.md#step.host_sync"""
    paced = maximum(EAGER_OP_HOST_S, cycle_ops * EAGER_OP_HOST_S - layer_gpu_s)
    return syncs_per_layer * moe_layers * (1 + r) * (HOST_SYNC_S + paced)


def step_time(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec, comm: CommSeconds, params_on_rank: Any,
              per_stage: tuple[tuple[GpuSpec, CommSeconds], ...] | None = None) -> StepTime:
    """Pipeline schedule with its bubble and the overlap of each axis's communication.

    1F1B over stages of per-micro-batch times t_i takes n·max(t) + (sum(t) - max(t)) for any n >= 1
    (Narayanan et al. 2021 §2.2 with equal stages: (n + p - 1)·t); interleaving divides the fill and drain
    by v and needs n >= p (check_plan). Each stage's micro-batch time is its compute plus the exposed part of
    the TP, CP, EP and ZeRO-3 communication inside it (tp_exposed, overlap); the DP reduction and gather of
    ZeRO 0-2 are per step. `per_stage` (one (GPU, communication) per stage of a plan that lists its stages:
    stages on pools of different GPUs, cost.hetero) prices each stage's compute and its TP, CP, EP and ZeRO-3
    traffic on its own pool; `gpu` and `comm` then price the per-step parts (the caller passes the slowest
    pool's). Derived: docs/formulas.md#step.time, docs/formulas.md#hetero.stages"""
    if per_stage is not None and (explicit_stages(plan) is None or len(per_stage) != plan.pp):
        raise ValueError("per_stage needs a plan that lists its stages (pp_layout or pp_layers), one per stage")
    stages = stage_times(m, plan, gpu, tuple(g for g, _ in per_stage) if per_stage is not None else None)
    n, v, kappa = plan.num_microbatches, plan.vpp, gpu.contention
    l_max = maximum(max_stage_layers(m, plan), 1)
    moe_top = 0  # MoE layers of the stage that has most
    for s in stages:
        moe_top = maximum(moe_top, s[3])
    moe_max = maximum(moe_top, 1)
    per_mb, parts = [], []
    for stage, sc, layers, moe_layers in stages:
        g_i, c_i = per_stage[stage] if per_stage is not None else (gpu, comm)
        k_i = g_i.contention
        tp_i = tp_exposed(plan, c_i.tp / n * layers / l_max, sc, k_i, recomputed_share(plan, layers))
        cp_i = overlap(c_i.cp / n * layers / l_max, sc.attention, k_i)
        ep_k = dispatch_contention(plan, g_i.sm_count, k_i)  # cost.moe: the dispatch kernels' SMs
        ep_i = ep_exposed(plan, c_i.ep / n * moe_layers / moe_max, sc.total, ep_k)  # cost.moe
        z3_i = dp_exposed_per_mb(plan, c_i, sc, k_i, layers)
        per_mb.append(sc.total + tp_i + cp_i + ep_i + z3_i)
        parts.append((sc, tp_i, cp_i, ep_i, z3_i))
    sc, tp_mb, cp_mb, ep_mb, z3_mb = parts[0]
    worst = per_mb[0]
    for t, (sc_i, tp_i, cp_i, ep_i, z3_i) in zip(per_mb[1:], parts[1:]):
        c = t > worst
        sc, tp_mb, cp_mb, ep_mb, z3_mb = (_pick_stage(c, sc_i, sc), where(c, tp_i, tp_mb), where(c, cp_i, cp_mb),
                                          where(c, ep_i, ep_mb), where(c, z3_i, z3_mb))
        worst = maximum(worst, t)
    p2p = comm.pp / maximum(2 * n * v, 1)
    p = plan.pp
    # The fill and drain sends wait on the pipeline; the steady-state sends run beside compute and slow it
    # by the contention factor like every overlapped transfer (interleaving multiplies them by v).
    # Derived: docs/formulas.md#step.overlap
    waited = where(v == 1, minimum(2 * (n + p - 1), 2 * n * v), minimum(2 * (p - 1) * v, 2 * n * v))
    pp_exposed = waited * p2p + overlap((2 * n * v - waited) * p2p, n * sc.total, kappa)
    exposed = {"tp": n * tp_mb, "pp": pp_exposed,
               "dp": n * z3_mb + dp_exposed_per_step(plan, comm, sc, kappa, params_on_rank),
               "cp": n * cp_mb, "ep": n * ep_mb}
    model = model_flops_per_step(m, plan)
    if has_layout(plan) and v > 1:  # unequal chunks: simulate the schedule
        bubble = layout_bubble(m, plan, gpu, per_mb, worst)
    else:
        bubble = (pipeline_sum(plan, per_mb) - worst) / v * schedule_bubble_factor(plan, sc)
    # Derived: docs/formulas.md#step.overhead
    r_max = recomputed_share(plan, l_max)
    layer_gpu = (sc.forward + ep_mb / (2 + r_max)) / l_max  # one layer's forward, its dispatch and combine
    overheads = {"host": host_seconds(plan, l_max, worst, r_max, moe_top, host_syncs_per_layer(m, plan),
                                      layer_gpu),
                 "stragglers": straggler_seconds(plan, n * sc.total + bubble),
                 "measured": gpu.step_overhead_s + 0 * n}
    return StepTime(
        compute=n * sc.total, bubble=bubble, comm_exposed=sum(exposed.values()),
        optimizer=optimizer_step_seconds(params_on_rank, plan, gpu,
                                         _expert_on_rank(m, plan, stages, params_on_rank)),
        overhead=sum(overheads.values()),
        exposed=exposed, stage=sc, model_flops=model, hardware_flops=model + recompute_flops_per_step(m, plan),
        overheads=overheads,
    )


def _expert_on_rank(m: ModelSpec, plan: ParallelPlan, stages: list[Any], params_on_rank: Any) -> Any:
    """Routed-expert parameters of the rank whose optimizer step is priced: the most of any candidate stage
    (the schedule's parameter copies, two under DualPipe, as memory counts them), at most the rank's parameters."""
    if not m.is_moe:
        return 0.0
    expert = 0.0
    for stage, *_ in stages:
        expert = maximum(expert, rank_params(m, plan, stage).expert)
    return minimum(schedule_of(plan).param_copies * expert, params_on_rank)


@dataclass(frozen=True)
class Throughput:
    tokens_per_s: Any
    tflops_per_gpu: Any
    """Model FLOPs per second per GPU, in TFLOP/s."""
    mfu: Any
    """Model FLOPs / (time x GPUs x peak): against the bf16 peak for the low-precision recipes (as most
    published tables report), else the dtype's own."""
    hfu: Any
    comm_ratio: Any
    """Exposed communication / step time."""
    mfu_low_precision: Any = None
    """MFU against the peak of the recipe's GEMM format (fp8, mxfp8, fp4); None for bf16 / fp16 / fp32."""


def throughput(plan: ParallelPlan, gpu: GpuSpec, st: StepTime) -> Throughput:
    """Tokens/s, model TFLOP/s per GPU, MFU and HFU (against the bf16 peak for low-precision recipes, with
    the MFU against the recipe's own format beside it).
    Source: Korthikanti et al. 2022 §6 (MFU / HFU definitions)."""
    step, gpus = st.total, plan.num_gpus
    peak = gpu.peak_flops(plan.mfu_format)  # MFU against the nominal peak, whatever the sustained clock
    low = st.model_flops / (step * gpus * gpu.peak_flops(plan.gemm_format)) if plan.low_precision else None
    return Throughput(
        tokens_per_s=plan.global_batch * plan.seq_len / step,
        tflops_per_gpu=st.model_flops / (step * gpus) / 1e12,
        mfu=st.model_flops / (step * gpus * peak),
        hfu=st.hardware_flops / (step * gpus * peak),
        comm_ratio=st.comm_exposed / step,
        mfu_low_precision=low,
    )


def bottleneck(st: StepTime) -> Any:
    """Name of the largest part of the step (compute split into GEMM / attention / memory-bound)."""
    n = st.compute / np.maximum(st.stage.total, 1e-30)
    parts = [n * st.stage.gemm, n * st.stage.attention, n * st.stage.memory_bound, st.bubble,
             *(st.exposed[a] for a in ("tp", "pp", "dp", "cp", "ep")), st.optimizer, st.overhead]
    idx = np.argmax(np.stack(np.broadcast_arrays(*parts)), axis=0)
    return np.asarray(BOTTLENECKS)[idx]
