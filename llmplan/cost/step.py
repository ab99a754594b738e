"""Step time of a training plan: compute, pipeline bubble, exposed communication and optimizer step, and
the throughput that follows (tokens/s, TFLOP/s per GPU, MFU, HFU).

Works on one ParallelPlan and, elementwise, on plan arrays (see llmplan/arith.py).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

import numpy as np

from llmplan.arith import (  # noqa: F401  (expected_max_normal: re-exported, tests import it from here)
    expected_max_normal,
    maximum,
    minimum,
    where,
)
from llmplan.cost.breakdown import Breakdown
from llmplan.cost.compute import (
    StageCompute,
    ep_deferred_wgrad,
    ep_pair_windows,
    grad_accumulation_bytes,
    grad_accumulation_seconds,
    model_flops_per_step,
    optimizer_step_seconds,
    output_seconds,
    recompute_flops_per_step,
)
from llmplan.cost.exposure import (  # noqa: F401  (re-exported: their home was this module)
    BUCKET_PARAMS,
    BUCKET_PARAMS_PER_DP,
    CommSeconds,
    bucket_share,
    chunked_sync_window,
    cooldown_slack,
    cp_exposed,
    dp_exposed_per_mb,
    dp_exposed_per_step,
    gathers_on_warmup_chain,
    later_stage_reduce_exposed,
    later_stage_unbucketed,
    middle_stage,
    overlap,
    tp_edge_exposed,
    tp_exposed,
)
from llmplan.cost.comm import (
    pp_sends,
    symm_mem_tp_seconds,
    tp_forward_rs_share,
    tp_overlap_contention,
    tp_chunk_step_waits,
    tp_role_bytes,
    tp_sm_margin_seconds,
    tp_unfused_rs_share,
)
from llmplan.cost.hybrid_stage import mtp_chunk_compute, priced_stage_compute
from llmplan.cost.elementwise import softmax_launches, te_mask_launches
from llmplan.cost.kernels import layer_launch_average, router_host_ops
from llmplan.cost.memory import candidate_stages, class_key, each_stage
from llmplan.cost.model_states import (bf16_gathered_params, bf16_kept_params, gradient_params,
                                       low_precision_weights)
from llmplan.cost.offload import (attention_offload_bytes, expert_flop_share, moe_act_offload_exposed, offload_exposed,
                                  offloads_moe_act)
from llmplan.cost.mixers import attention_share
from llmplan.cost.moe import dispatch_contention, ep_exposed, host_syncs_per_layer
from llmplan.cost.muon import muon_params, newton_schulz_seconds
from llmplan.cost.overhead import (  # noqa: F401  (re-exported: their home was this module)
    GPU_SPEED_SPREAD,
    GRAPH_LAUNCHES,
    GRAPHED_LAYER_KERNELS,
    GRAPHED_MOE_EAGER,
    LAYER_KERNELS,
    MOE_LAYER_KERNELS,
    grad_buffer_seconds,
    host_seconds,
    host_sync_seconds,
    mxfp8_master_cast_seconds,
    mxfp8_param_unstage_seconds,
    geglu_offset_sync_seconds,
    pp_sync_seconds,
    straggler_seconds,
    zero3_copy_out_seconds,
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
    stepped_rank_params,
    word_embedding_on_rank,
)
from llmplan.cost.runtime_memory import tp_overlap_as_run
from llmplan.cost.schedule import makespan
from llmplan.cost.stages import attention_rerun_share, layout_grid, stage_mtp_modules
from llmplan.specs.hardware import GpuSpec
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan, has_layout
from llmplan.specs.schedule import schedule_of

BOTTLENECKS = ("compute", "attention", "memory-bound", "bubble", "tp", "pp", "dp", "cp", "ep", "optimizer", "overhead",
               "offload", "router")


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
    """Exposed seconds per axis (tp, pp, dp, cp, ep) and of the activation-offload copies to host memory
    (offload); they sum to comm_exposed."""
    stage: StageCompute
    """Per-micro-batch compute of the slowest stage."""
    model_flops: Any
    hardware_flops: Any
    overheads: dict[str, Any]
    """The parts of `overhead` (they sum to it): host (kernel launches the GPU waits for), stragglers (the
    slowest of the job's GPUs sets the pace), measured (GpuSpec.step_overhead_s, 0 unless a fleet's
    profile sets it) and grad_buffer (Megatron-LM's NaN check and pre-scaling of the gradient buffer before the
    DP reduction, grad_nan_check / grad_prescale; 0 with both off) and zero3_copy_out (FSDP2's copy of every
    all-gather into the parameters on the compute stream; 0 without ParallelPlan.zero3_copy_out) and
    mxfp8_param_unstage (Megatron-Core's cast of the bf16-gathered weights into MXFP8 weights; 0 unless ZeRO-1
    with MXFP8 fp8_params) and pp_sync
    (the device synchronised after each blocking pipeline exchange; 0 without ParallelPlan.pp_blocking_sends)
    and mxfp8_master_cast (Megatron-FSDP's host-paced cast of the fp32 master shards into MXFP8 weights after
    the optimizer step; 0 unless Megatron-FSDP's ZeRO-3 with MXFP8 fp8_params: comm.megatron_fsdp_mxfp8_cast)."""


def stage_times(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec,
                stage_gpus: tuple[GpuSpec, ...] | None = None) -> list[tuple[Any, StageCompute, Any, Any]]:
    """(stage, per-micro-batch compute, its layers, its MoE layers) of every candidate stage; `stage_gpus`
    (a plan that lists its stages, one GPU per stage: a pipeline over pools of different GPUs, cost.hetero)
    runs each stage on its own GPU."""
    same: dict[tuple, StageCompute] = {}  # an explicit per-stage list repeats its layer counts stage after stage

    def priced(g: GpuSpec) -> Any:
        """A stage's compute on GPU g: a hybrid stack's stage at the mixer kinds it holds (cost.hybrid_stage),
        so stages with equal layer counts may differ."""
        return lambda p, i: priced_stage_compute(m, p, g, i, *stage_layers(m, p, i), i == p.pp - 1)

    def one(stage: Any) -> tuple[Any, StageCompute, Any, Any]:
        n_dense, n_moe = stage_layers(m, plan, stage)
        last = stage == plan.pp - 1
        g = stage_gpus[stage] if stage_gpus is not None else gpu
        # the stage's MTP modules too: under fp4 their layers run in bf16 (with_mtp_layers), so two stages of equal
        # layer counts differ when one holds them
        key = ((n_dense, n_moe, last, id(g), stage_mtp_modules(m, plan, stage))
               if isinstance(stage, int) and not m.is_hybrid else None)
        sc = same.get(key) if key else None
        if sc is None:  # on plan arrays, once per plan group that differs in the ZeRO stage alone
            sc = per_distinct(plan, ALL_BUT_ZERO, stage, priced(g))
            if key:
                same[key] = sc
        if grad_accumulation_bytes(plan):  # the stage's own parameters (the first stage's embedding too)
            # ZeRO-2/3 accumulate only their gradient shard, but whole gradients under a pipeline (cost.memory);
            # Megatron-FSDP's copy moves the whole gradient into the bucket before its reduce-scatter
            rp = rank_params(m, plan, stage)
            accumulated = rp.total if plan.grad_accumulation == "copy" else gradient_params(plan, rp)
            sc = replace(sc, memory_bound=sc.memory_bound + grad_accumulation_seconds(accumulated, plan, g))
        return stage, sc, n_dense + n_moe, n_moe

    classes = class_key(m, plan)

    def kind(stage: Any) -> tuple:  # a stage class on one GPU
        return classes(stage) + (id(stage_gpus[stage]) if stage_gpus is not None else 0,)

    stages = candidate_stages(m, plan)
    results = each_stage(stages, one, kind if classes is not None else None)
    return [r if r[0] is s else (s,) + r[1:] for s, r in zip(stages, results, strict=True)]


def _pick_stage(cond: Any, a: StageCompute, b: StageCompute) -> StageCompute:
    return StageCompute(*(where(cond, getattr(a, f.name), getattr(b, f.name)) for f in fields(StageCompute)))


def pipeline_sum(plan: ParallelPlan, per_mb: list[Any], stages: list[Any]) -> Any:
    """Sum over all pipeline stages of one micro-batch's time, from the candidate stages' times (first,
    second, heaviest MoE, last, `stages` their indices; every stage for an explicit per-stage list): the middle
    stages at middle_stage's, the slower of the second and a middle heaviest MoE stage."""
    if explicit_stages(plan) is not None:
        return sum(per_mb)
    p = plan.pp
    return per_mb[0] + where(p > 1, per_mb[3], 0.0) + maximum(p - 2, 0) * middle_stage(plan, stages, per_mb)


def layout_chunk_shares(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec) -> tuple[list[list[Any]], list[Any]]:
    """([stage][chunk] share of the stage's micro-batch compute, [stage] forward share of it) of a pp_layout
    plan: stage_compute of each chunk's layers, the loss with the chunk that holds L (the last one). Elementwise
    where the GPU's constants are arrays. Derived: docs/formulas.md#pipeline.layout"""
    v, share, forward = plan.vpp, [], []
    same: dict[tuple[int, int, bool, int], StageCompute] = {}  # chunks of equal layer counts: priced once
    grid = layout_grid(plan)
    for i, row in enumerate(chunk_layers(m, plan)):
        times = [chunk_compute(m, plan, gpu, d, e, i == plan.pp - 1 and c == v - 1, same, grid[i][c].count("m"))
                 for c, (d, e) in enumerate(row)]
        total = sum(t.total for t in times)
        some = total > 0
        share.append([where(some, t.total / where(some, total, 1.0), 1 / v) for t in times])
        forward.append(where(some, sum(t.forward for t in times) / where(some, total, 1.0), 1 / 3))
    return share, forward


def chunk_compute(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec, d: int, e: int, last: bool,
                  same: dict[tuple[int, int, bool, int], StageCompute], mtp: int = 0) -> StageCompute:
    """stage_compute of a chunk of d dense and e MoE layers (with the loss when `last`), `mtp` MTP modules among
    them at their own format (mtp_chunk_compute), once per such chunk."""
    if (d, e, last, mtp) not in same:
        same[(d, e, last, mtp)] = mtp_chunk_compute(m, plan, gpu, d, e, last, mtp)
    return same[(d, e, last, mtp)]


def layout_bubble(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec, per_mb: list[Any], worst: Any,
                  shares: tuple[list[list[Any]], list[Any]] | None = None) -> Any:
    """Bubble of an interleaved pp_layout plan, whose chunks differ: the schedule simulation (cost.schedule)
    with each stage's micro-batch time (per_mb, every stage) split over its chunks as layout_chunk_shares,
    minus the n micro-batches of the slowest stage. With equal stages and chunks it is the closed form's
    (p - 1)t/v. The simulation is scalar: where the times are arrays (a GPU whose constants are arrays) it runs
    once per element; `shares` layout_chunk_shares' result where the caller has it. Derived:
    docs/formulas.md#pipeline.layout"""
    share, forward = shares if shares is not None else layout_chunk_shares(m, plan, gpu)
    n = plan.num_microbatches
    shape = np.broadcast_shapes(*(np.shape(x) for x in (*per_mb, worst, *forward, *(y for row in share for y in row))))
    out = np.empty(shape)
    for k in np.ndindex(shape):
        at = lambda x, k=k: float(np.broadcast_to(x, shape)[k])
        fwd = [at(t) * at(f) for t, f in zip(per_mb, forward, strict=True)]
        bwd = [at(t) * (1 - at(f)) for t, f in zip(per_mb, forward, strict=True)]
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


def step_time(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec, comm: CommSeconds,
              per_stage: tuple[tuple[GpuSpec, CommSeconds], ...] | None = None) -> StepTime:
    """Pipeline schedule with its bubble and the overlap of each axis's communication.

    1F1B over stages of per-micro-batch times t_i takes n·max(t) + (sum(t) - max(t)) for any n >= 1
    (Narayanan et al. 2021 §2.2 with equal stages: (n + p - 1)·t); interleaving divides the fill and drain
    by v and needs n >= p (check_plan). Each stage's micro-batch time is its compute plus the exposed part of
    the TP, CP, EP and ZeRO-3 communication inside it (tp_exposed, overlap); the DP reduction and gather of
    ZeRO 0-2 are per step. `per_stage` (one (GPU, communication) per stage of a plan that lists its stages:
    stages on pools of different GPUs, cost.hetero) prices each stage's compute and its TP, CP, EP and ZeRO-3
    traffic on its own pool; `gpu` and `comm` then price the per-step parts (the caller passes the slowest
    pool's). The per-step tail (the DP reduction and gather left exposed, the optimizer step, the gradient buffer's
    passes, FSDP2's copy-out) is each stage's own, of its own parameters (stage_tails), and the slowest tail ends
    the step. Derived: docs/formulas.md#step.time, docs/formulas.md#hetero.stages, docs/formulas.md#step.stage_tail"""
    plan = tp_overlap_as_run(m, plan)  # Megatron-Core's MLA turns TP overlap off (docs/formulas.md#step.mla_tp_overlap)
    if per_stage is not None and (explicit_stages(plan) is None or len(per_stage) != plan.pp):
        raise ValueError("per_stage needs a plan that lists its stages (pp_layout or pp_layers), one per stage")
    stages = stage_times(m, plan, gpu, tuple(g for g, _ in per_stage) if per_stage is not None else None)
    n, v, kappa = plan.num_microbatches, plan.vpp, gpu.contention
    l_max = maximum(max_stage_layers(m, plan), 1)
    moe_top = 0  # MoE layers of the stage that has most
    for s in stages:
        moe_top = maximum(moe_top, s[3])
    per_mb, worst, (sc, tp_mb, cp_mb, ep_mb, z3_mb, router_mb) = _stage_micro_batches(
        m, plan, stages, (gpu, comm), per_stage, l_max, maximum(moe_top, 1)
    )
    pp_exposed = pp_exposed_per_step(plan, comm.pp, sc.total, kappa, last_stage_slack(per_mb))
    # Activation offload: the copies to host memory and back that outlast their window, forward and backward
    # (cost.offload; Derived: docs/formulas.md#mem.offload)
    offload = n * (offload_exposed(m, plan, comm.host, sc.forward)
                   + offload_exposed(m, plan, comm.host, sc.total - sc.forward))
    if offloads_moe_act(m, plan):  # one step per MoE layer; every layer's copy but the last one's
        groups = moe_top  # each plan's own count (a batch-wide max would price a plan by its neighbours)
        fwd, bwd = sc.forward / maximum(moe_top, 1), (sc.total - sc.forward) / maximum(moe_top, 1)
        offload = offload + n * (moe_act_offload_exposed(comm.host_moe_act, fwd, groups - 1, fwd)
                                 + moe_act_offload_exposed(comm.host_moe_act, bwd, groups - 1,
                                                           bwd * (1 - expert_flop_share(m, plan))))
    attn_groups = l_max * attention_share(m)  # attention layers of each plan's largest stage
    if np.any(np.asarray(attention_offload_bytes(m, plan)) > 0) and np.any(np.asarray(attn_groups) >= 1):
        # one step per attention layer, each copy due one step later both ways (a bound: the reload is issued
        # as the next-later group's backward starts; Derived: docs/formulas.md#mem.offload_modules)
        fwd, bwd = sc.forward / maximum(attn_groups, 1), (sc.total - sc.forward) / maximum(attn_groups, 1)
        k = np.floor(attn_groups) - 1  # no copy where a stage has under one attention layer
        offload = offload + n * (moe_act_offload_exposed(comm.host_attn, fwd, k, fwd)
                                 + moe_act_offload_exposed(comm.host_attn, bwd, k, bwd))
    layout = layout_chunk_shares(m, plan, gpu) if has_layout(plan) and v > 1 else None  # unequal chunks
    dp_tail, optimizer, grad_buffer, copy_out, unstage = stage_tails(m, plan, gpu, comm, stages, kappa, per_mb,
                                                                     [row[0] for row in layout[0]] if layout else None)
    exposed = {"tp": n * tp_mb + comm.tp_step_end, "pp": pp_exposed,  # docs/formulas.md#comm.tp_grad_sync
               "dp": n * z3_mb + dp_tail + comm.dp_step_end,
               "cp": n * cp_mb, "ep": n * ep_mb, "offload": offload, "router": n * router_mb}
    model = model_flops_per_step(m, plan)
    if layout is not None:  # unequal chunks: simulate the schedule
        bubble = layout_bubble(m, plan, gpu, per_mb, worst, layout)
    else:
        bubble = (pipeline_sum(plan, per_mb, [s[0] for s in stages]) - worst) / v * schedule_bubble_factor(plan, sc)
    # Derived: docs/formulas.md#step.overhead
    r_max = recomputed_share(plan, l_max)
    layer_gpu = (sc.forward + ep_mb / (2 + r_max)) / l_max  # one layer's forward, its dispatch and combine
    overheads = {"host": host_seconds(plan, l_max, worst, r_max, moe_top, host_syncs_per_layer(m, plan),
                                      layer_gpu, gpu.host_op_factor, layer_launch_average(m, plan),
                                      router_host_ops(m, plan) if m.is_moe else 0, softmax_launches(m, plan),
                                      te_mask_launches(plan)),
                 "stragglers": straggler_seconds(plan, n * sc.total + bubble),
                 "measured": gpu.step_overhead_s + 0 * n,
                 "grad_buffer": grad_buffer,
                 "zero3_copy_out": copy_out,
                 "mxfp8_param_unstage": unstage,
                 "pp_sync": pp_sync_seconds(plan, pp_blocking_exchanges(plan), gpu.host_op_factor),
                 "geglu_offset_sync": geglu_offset_sync_seconds(m, plan, moe_top, r_max, gpu.host_op_factor),
                 "mxfp8_master_cast": mxfp8_master_cast_seconds(m, plan, optimizer, gpu.host_op_factor)}
    return StepTime(
        compute=n * sc.total, bubble=bubble, comm_exposed=sum(exposed.values()),
        optimizer=optimizer,
        overhead=sum(overheads.values()),
        exposed=exposed, stage=sc, model_flops=model, hardware_flops=model + recompute_flops_per_step(m, plan),
        overheads=overheads,
    )


def _stage_micro_batches(m: ModelSpec, plan: ParallelPlan, stages: list[tuple[Any, StageCompute, Any, Any]],
                         default: tuple[GpuSpec, CommSeconds],
                         per_stage: tuple[tuple[GpuSpec, CommSeconds], ...] | None, l_max: Any,
                         moe_max: Any) -> tuple[list[Any], Any, tuple[StageCompute, Any, Any, Any, Any, Any]]:
    """Each candidate stage's micro-batch time (its compute and the exposed TP, CP, EP and ZeRO-3 traffic
    inside it: step_time's docstring), the slowest one's, and that stage's (compute, tp, cp, ep, zero-3)
    parts, picked elementwise; a stage runs on its own (GPU, communication) of `per_stage`, else on `default`'s."""
    n = plan.num_microbatches
    per_mb, parts = [], []
    done: dict[tuple, tuple[Any, tuple]] = {}  # stages of one class on one GPU and communication: priced once
    classes = class_key(m, plan)
    for j, (stage, sc, layers, moe_layers) in enumerate(stages):
        key = None if classes is None else classes(stage) + (id(sc),) + (
            (id(per_stage[stage][0]), id(per_stage[stage][1])) if per_stage is not None
            else default[1].dp_stages[j:j + 1])
        if key is not None and key in done:
            per_mb.append(done[key][0])
            parts.append(done[key][1])
            continue
        g_i, c_i = (per_stage[stage][0], edge_comm(per_stage[stage][1], stage)) if per_stage is not None \
            else (default[0], stage_comm(default[1], j))
        k_i = g_i.contention
        r_i = recomputed_share(plan, layers)
        tp_s = c_i.tp / n * layers / l_max
        roles = tp_role_bytes(m, plan, r_i)  # the TP collectives' bytes per role: priced once, used thrice
        tp_i = tp_exposed(plan, tp_s, sc, k_i, r_i, rs_share=tp_forward_rs_share(m, plan, r_i, roles),
                          unfused_share=tp_unfused_rs_share(m, plan, r_i),
                          ub_kappa=tp_overlap_contention(m, plan, r_i, g_i.sm_count, roles),
                          step_waits=tp_chunk_step_waits(m, plan, tp_s, sc.gemm, r_i, roles)) \
            + symm_mem_tp_seconds(m, plan, g_i, layers, r_i) \
            + tp_sm_margin_seconds(m, plan, sc.gemm, r_i, g_i.sm_count) \
            + tp_edge_exposed(plan, c_i.tp_edge / n, c_i.tp_edge_async / n, output_seconds(m, plan, g_i)[0], k_i)
        # set_sm_margin's slower GEMMs; the embedding's, heads' and MTP modules' TP collectives (step.tp_edge)
        # the ring hides behind the attention; a hybrid's mixer all-to-alls run in line (comm.cp_mixers)
        cp_i = cp_exposed(plan, (c_i.cp - c_i.cp_mixers) / n * layers / l_max, sc.attention, k_i,
                          attention_rerun_share(plan, layers), c_i.cp_a2a / n * layers / l_max) \
            + c_i.cp_mixers / n * layers / l_max
        ep_k = dispatch_contention(plan, g_i.sm_count, k_i)  # cost.moe: the dispatch kernels' SMs
        pair = ep_pair_windows(m, plan, g_i) if plan.ep_comm_overlap and m.is_moe else ()  # a workload switch
        dw = ep_deferred_wgrad(m, plan, g_i) if pair else (0.0, 0.0)  # delay_wgrad: a workload switch
        ep_i = ep_exposed(plan, c_i.ep / n * moe_layers / moe_max, sc.total, ep_k, pair, moe_layers, dw,
                          g_i.compute_capability)  # cost.moe
        router_i = c_i.router / n * moe_layers / moe_max  # the aux loss's token counts: in line (comm.aux_loss_counts)
        z3_i = dp_exposed_per_mb(plan, c_i, sc, k_i, layers, m)
        per_mb.append(sc.total + tp_i + cp_i + ep_i + z3_i + router_i)
        parts.append((sc, tp_i, cp_i, ep_i, z3_i, router_i))
        if key is not None:
            done[key] = per_mb[-1], parts[-1]
    sc, tp_mb, cp_mb, ep_mb, z3_mb, router_mb = parts[0]
    worst = per_mb[0]
    for t, (sc_i, tp_i, cp_i, ep_i, z3_i, router_i) in zip(per_mb[1:], parts[1:], strict=True):
        c = t > worst
        sc, tp_mb, cp_mb, ep_mb, z3_mb = (_pick_stage(c, sc_i, sc), where(c, tp_i, tp_mb), where(c, cp_i, cp_mb),
                                          where(c, ep_i, ep_mb), where(c, z3_i, z3_mb))
        router_mb = where(c, router_i, router_mb)
        worst = maximum(worst, t)
    return per_mb, worst, (sc, tp_mb, cp_mb, ep_mb, z3_mb, router_mb)


def last_stage_slack(per_mb: list[Any]) -> Any:
    """Seconds a micro-batch takes longer on the last pipeline stage than on the slowest other candidate stage
    (0 when it is not the slowest): the time the other stages wait for it each micro-batch.
    Derived: docs/formulas.md#step.pp_unbatched_slack"""
    if len(per_mb) < 2:
        return 0.0
    others = per_mb[0]
    for t in per_mb[1:-1]:
        others = maximum(others, t)
    return maximum(per_mb[-1] - others, 0.0)


def pp_exposed_per_step(plan: ParallelPlan, pp_seconds: Any, stage_total: Any, kappa: float,
                        last_slack: Any = 0.0) -> Any:
    """Exposed seconds of a step's pipeline sends (pp_seconds, the comm.pp_sends sends of one micro-batch's
    activation or gradient): the sends on the step's critical path wait on the pipeline; the others run beside the
    slowest stage's compute (stage_total a micro-batch) and slow it by the contention factor like every overlapped
    transfer (interleaving multiplies them by v). 1F1B's sends block (Megatron-LM's batched send-recv), 2(n + p - 1)
    of them in a row; the interleaved schedule waits for a send only before the pass that needs it, and the sends
    on its critical path are the first micro-batch's through every chunk boundary forward and the last one's
    backward, 2(pv - 1), whatever n (cost.schedule.makespan with a time per send; the v - 1 hops from the last
    rank back to the first included). Source: NVIDIA/Megatron-LM megatron/core/pipeline_parallel/schedules.py at
    core_r0.9.0 (forward_backward_pipelining_with_interleaving: overlap_p2p_comm, req.wait() before the pass).
    With pp_unbatched_sends (DeepSpeed's TrainSchedule: a step's receive and send in a row, blocking) a middle
    stage waits for four transfers a micro-batch: 4n + 2p - 8 on the path (2(p - 1) for one micro-batch, 2n with two
    stages), by a rendezvous
    simulation (tests/test_pp_unbatched.py). A last stage slower than the others by `last_slack` a micro-batch
    (the LM head on it) lets the middle stages' extra transfers wait in its shadow: min(slack / transfer, 2)·(n - 2)
    fewer on the path, 2n + 2p - 4 at two transfers' slack (the same simulation, step.pp_unbatched_slack).
    Derived: docs/formulas.md#step.overlap, docs/formulas.md#step.pp_critical, docs/formulas.md#step.pp_unbatched"""
    n, v, p, sends = plan.num_microbatches, plan.vpp, plan.pp, pp_sends(plan)
    p2p = pp_seconds / maximum(sends, 1)
    waited = where(v == 1, 2 * (n + p - 1), minimum(2 * (p * v - 1), sends))  # 1F1B: the fill's and drain's too
    # step.pp_unbatched: DeepSpeed's engine runs each 1F1B step's receive and send one after the other, four a
    # micro-batch on a middle stage (two stages: two, neither has a middle)
    waited = where(plan.pp_unbatched_sends & (v == 1),
                   where(p == 2, 2 * n, maximum(4 * n + 2 * p - 8, 2 * p - 2)), waited)  # one micro-batch: 2(p - 1)
    # step.pp_unbatched_slack: the last stage's own two transfers a micro-batch stay on the path, the middle
    # stages' other two fit in the time they wait for it
    shadow = minimum(last_slack / maximum(p2p, 1e-30), 2.0) * maximum(n - 2, 0)
    waited = where(plan.pp_unbatched_sends & (v == 1) & (p > 2), waited - where(p2p > 0, shadow, 0.0), waited)
    # step.pp_blocking: every exchange of the first rank but its last, which sends nothing (chunk 0's gradient)
    waited = where(plan.pp_blocking_sends & (v > 1), pp_blocking_exchanges(plan) - 1, waited)
    left = where(plan.pp_blocking_sends & (v > 1), 0, maximum(sends - waited, 0))  # an exchange's two sends at once
    return waited * p2p + overlap(left * p2p, n * stage_total, kappa)


def pp_blocking_exchanges(plan: ParallelPlan) -> Any:
    """Blocking pipeline exchanges (each a batched send/receive waited for, then torch.cuda.synchronize()) of the
    pipeline's first rank in a step, the rank with the longest warm-up: 1F1B's 2(n + p - 1) (a send and a receive
    per pass), the interleaved schedule's one per chunk pass of the warm-up and steady state (n·v, the steady
    state's forward and backward sends in one exchange) and one per backward of the cool-down, whose length is the
    warm-up's (v - 1)p + 2(p - 1) (the last carries nothing: pp_exposed_per_step waits for one fewer); 0 without
    pipeline stages.
    Source: NVIDIA/Megatron-LM megatron/schedules.py, p2p_communication.py at 50a4b5fa02
    (forward_backward_pipelining_with_interleaving: num_warmup_microbatches; _communicate: req.wait(),
    torch.cuda.synchronize()). Derived: docs/formulas.md#step.pp_blocking"""
    n, v, p = plan.num_microbatches, plan.vpp, plan.pp
    interleaved = n * v + minimum((v - 1) * p + 2 * (p - 1), n * v)
    return where(p > 1, where(v == 1, 2 * (n + p - 1), interleaved), 0)


def stage_comm(comm: CommSeconds, j: int) -> CommSeconds:
    """comm with the DP reduction and gather of the rank of candidate stage j (CommSeconds.dp_stages) and its TP
    collectives outside the decoder layers (edge_comm)."""
    comm = edge_comm(comm, j)
    if not comm.dp_stages:
        return comm
    reduce, gather = comm.dp_stages[j]
    return replace(comm, dp_reduce=reduce, dp_gather=gather)


def edge_comm(comm: CommSeconds, j: int) -> CommSeconds:
    """comm with the TP collectives outside the decoder layers of the rank of candidate stage j
    (CommSeconds.tp_edge_stages; docs/formulas.md#comm.tp_edge)."""
    if not comm.tp_edge_stages:
        return comm
    sync, async_ = comm.tp_edge_stages[j]
    return replace(comm, tp_edge=sync, tp_edge_async=async_)


def stage_tails(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec, comm: CommSeconds,
                stages: list[tuple[Any, StageCompute, Any, Any]], kappa: float, per_mb: list[Any],
                chunk0: list[Any] | None = None) -> tuple[Any, Any, Any, Any, Any]:
    """(DP exposed per step, optimizer, gradient-buffer passes, ZeRO-3 copy-out, MXFP8 unstaging) of the step's
    tail, elementwise. Each stage reduces its own gradients behind its own last backward and steps and gathers
    its own parameters (stepped_rank_params), all stages in parallel; the gradient norm's all-reduce over the
    model-parallel group (pipeline stages included) sits between: every stage's update waits for the slowest
    reduction. The tail is the slowest stage's (buffer passes + reduction) plus the slowest stage's (optimizer +
    gather + copy-out or unstaging), not the fullest stage's (memory's) nor the slowest compute's.
    A later stage of Megatron-Core's DDP reduces unbucketed in the cool-down's slack
    (later_stage_reduce_exposed; cooldown_slack: the earlier stages' backwards, `per_mb` each candidate stage's
    micro-batch time, `chunk0` an interleaved pp_layout plan's chunk-0 share of each stage). On Megatron-Core's
    1F1B with the overlapped gather (gathers_on_warmup_chain) a later stage's whole gather sits on the warm-up's
    chain instead: out of the tail, the later stages' gathers added (later_stage_chain).
    Source: NVIDIA/Megatron-LM megatron/core/optimizer/clip_grads.py at 0293807e53 (get_grad_norm_fp32:
    all_reduce over grad_stats_parallel_group). Derived: docs/formulas.md#step.stage_tail,
    docs/formulas.md#step.dp_later_stages, docs/formulas.md#step.dp_later_rs"""
    before: tuple[Any, ...] = ()
    after: tuple[Any, ...] = ()
    done: dict[tuple, tuple] = {}  # stages of one class with equal DP seconds: priced once
    classes = class_key(m, plan)
    chain_on = gathers_on_warmup_chain(plan)
    backwards = [sc.total - sc.forward for _, sc, _, _ in stages]
    slack = cooldown_slack(plan, [stage for stage, _, _, _ in stages], backwards, per_mb, chunk0)
    wholes: list[tuple[Any, Any]] = []  # (stage, its rank's whole gather seconds)
    for j, (stage, sc, _, _) in enumerate(stages):
        key = None if classes is None else classes(stage) + (id(sc),) + (comm.dp_stages[j] if comm.dp_stages else ())
        if key is None or key not in done:
            tail = _stage_tail(m, plan, gpu, stage_comm(comm, j), stage, sc, kappa)
            if key is not None:
                done[key] = tail
        else:
            tail = done[key]
        wholes.append((stage, tail[2]))
        # a later stage's one reduction in the cool-down's slack (step.dp_later_rs)
        later = later_stage_reduce_exposed(plan, tail[3], slack[j], backwards[j], kappa)
        before_i = (where(later_stage_unbucketed(plan, stage), later, tail[0][0]), tail[0][1])
        on_chain = chain_on & (stage > 0)  # its gather waits on the warm-up's chain, not in the tail
        after_i = (where(on_chain, 0.0, tail[1][0]),) + tail[1][1:]
        before, after = _slower(before, before_i), _slower(after, after_i)
    chain = where(chain_on, later_stage_chain(plan, wholes, explicit_stages(plan) is not None), 0.0)
    return before[0] + after[0] + chain, after[1], before[1], after[2], after[3]


def _stage_tail(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec, c: CommSeconds, stage: Any, sc: StageCompute,
                kappa: float) -> tuple:
    """((exposed reduction at the bucket share, buffer passes), (exposed gather, optimizer, copy-out, unstaging),
    the whole gather, the whole reduction) of a rank of `stage`, `c` its DP seconds (stage_comm).
    Derived: docs/formulas.md#step.dp_later_rs, docs/formulas.md#step.stage_tail"""
    rp = stepped_rank_params(m, plan, stage)
    emb = word_embedding_on_rank(m, plan, stage)  # the last bucket's last parameter (step.dp_last_bucket)
    kept = bf16_kept_params(m, plan, stage)  # fp8_params' bf16 parts (mem.fp8_param_bf16_parts)
    opt = (optimizer_step_seconds(rp.total, plan, gpu, rp.expert, kept, muon_params(m, plan, stage))
           + newton_schulz_seconds(m, plan, gpu, stage))  # Muon's step (optim.muon_ns)
    reduce = dp_exposed_per_step(plan, replace(c, dp_gather=0.0, dp_outer_gather=0.0), sc, kappa, rp.total, emb)
    # the first chunk's gather beside the other chunks' step (step.dp_optstep_gather)
    gather = dp_exposed_per_step(plan, replace(c, dp_reduce=0.0, dp_outer_reduce=0.0), sc, kappa, rp.total, emb, opt)
    return ((reduce, grad_buffer_seconds(plan, rp.total, gpu)),
            (gather, opt, zero3_copy_out_seconds(plan, rp.total, gpu, bf16_gathered_params(m, plan, stage).total),
             mxfp8_param_unstage_seconds(plan, low_precision_weights(m, plan, stage), gpu)),
            c.dp_gather, c.dp_reduce)


def later_stage_chain(plan: ParallelPlan, wholes: list[tuple[Any, Any]], every_stage: bool) -> Any:
    """Seconds the later stages' whole weight gathers add to a 1F1B step on the warm-up's chain
    (gathers_on_warmup_chain): the sum over stages 1 .. pp-1 of a rank's whole gather, of `wholes` ((stage,
    seconds) of the candidate stages): every stage where `every_stage` (a plan that lists its stages), else the
    pp - 2 middle stages at the largest middle candidate's and the last stage's own. Elementwise.
    Derived: docs/formulas.md#step.dp_later_stages"""
    if every_stage:
        return sum((where(stage > 0, g, 0.0) for stage, g in wholes), 0.0 * plan.pp)
    mid, last = 0.0 * plan.pp, 0.0 * plan.pp
    for stage, g in wholes:
        mid = where((stage > 0) & (stage < plan.pp - 1), maximum(mid, g), mid)
        last = where((stage > 0) & (stage == plan.pp - 1), g, last)
    return maximum(plan.pp - 2, 0) * mid + last


def _slower(best: tuple[Any, ...], parts: tuple[Any, ...]) -> tuple[Any, ...]:
    """parts where their sum exceeds best's (elementwise; best empty: parts)."""
    if not best:
        return parts
    c = sum(parts) > sum(best)
    return tuple(where(c, a, b) for a, b in zip(parts, best, strict=True))


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
    named = {"compute": n * st.stage.gemm, "attention": n * st.stage.attention,
             "memory-bound": n * st.stage.memory_bound, "bubble": st.bubble, "optimizer": st.optimizer,
             "overhead": st.overhead, **st.exposed}  # exposed: tp, pp, dp, cp, ep, offload, router
    parts = [named[name] for name in BOTTLENECKS]  # in BOTTLENECKS' order: a tie goes to the earlier name
    idx = np.argmax(np.stack(np.broadcast_arrays(*parts)), axis=0)
    return np.asarray(BOTTLENECKS)[idx]
