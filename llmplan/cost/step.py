"""Step time of a training plan: compute, pipeline bubble, exposed communication and optimizer step, and
the throughput that follows (tokens/s, TFLOP/s per GPU, MFU, HFU).

Works on one ParallelPlan and, elementwise, on plan arrays (see cost/arith.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from llmplan.cost.arith import maximum, where
from llmplan.cost.breakdown import Breakdown
from llmplan.cost.compute import (
    StageCompute, model_flops_per_step, optimizer_step_seconds, recompute_flops_per_step, stage_compute,
)
from llmplan.cost.memory import candidate_stages, each_stage
from llmplan.cost.params import max_stage_layers, stage_layers
from llmplan.specs.hardware import GpuSpec
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan

BOTTLENECKS = ("compute", "attention", "memory-bound", "bubble", "tp", "pp", "dp", "cp", "ep", "optimizer")


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
    """One training step of the most-loaded rank; compute + bubble + comm_exposed + optimizer = total."""

    PARTS: ClassVar[tuple[str, ...]] = ("compute", "bubble", "comm_exposed", "optimizer")

    compute: Any
    bubble: Any
    comm_exposed: Any
    optimizer: Any
    exposed: dict[str, Any]
    """Exposed seconds per axis (tp, pp, dp, cp, ep); they sum to comm_exposed."""
    stage: StageCompute
    """Per-micro-batch compute of the slowest stage."""
    model_flops: Any
    hardware_flops: Any


def stage_times(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec) -> list[tuple[Any, StageCompute, Any, Any]]:
    """(stage, per-micro-batch compute, its layers, its MoE layers) of every candidate stage."""
    def one(st: Any) -> tuple[Any, StageCompute, Any, Any]:
        n_dense, n_moe = stage_layers(m, plan, st)
        return st, stage_compute(m, plan, gpu, n_dense, n_moe, st == plan.pp - 1), n_dense + n_moe, n_moe

    return each_stage(candidate_stages(m, plan), one)


def _pick_stage(cond: Any, a: StageCompute, b: StageCompute) -> StageCompute:
    return StageCompute(*(where(cond, getattr(a, f), getattr(b, f)) for f in ("gemm", "attention", "memory_bound",
                                                                                "forward")))


def pipeline_sum(plan: ParallelPlan, per_mb: list[Any]) -> Any:
    """Sum over all pipeline stages of one micro-batch's time, from the candidate stages' times (first,
    second, heaviest MoE, last; every stage for an explicit per-stage list): the middle stages take the
    slower of the second and the heaviest MoE stage."""
    if getattr(plan, "pp_layers", None) is not None:
        return sum(per_mb)
    p = plan.pp
    return per_mb[0] + where(p > 1, per_mb[3], 0.0) + maximum(p - 2, 0) * maximum(per_mb[1], per_mb[2])


def step_time(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec, comm: CommSeconds, params_on_rank: Any) -> StepTime:
    """Pipeline schedule with its bubble and the overlap of each axis's communication.

    1F1B over stages of per-micro-batch times t_i takes n·max(t) + (sum(t) - max(t)) for any n >= 1
    (Narayanan et al. 2021 §2.2 with equal stages: (n + p - 1)·t); interleaving divides the fill and drain
    by v and needs n >= p (check_plan). TP, CP and EP communication sits inside every micro-batch of every
    stage, in proportion to its layers (TP hidden behind GEMMs with tp-comm-overlap, CP's ring behind the
    attention blocks); the DP gradient reduction hides behind the last micro-batch's backward
    (overlap-grad-reduce), the weight all-gather behind the first forward (overlap-param-gather), ZeRO-3's
    per-micro-batch gathers behind compute. Derived: docs/formulas.md#step.time"""
    stages = stage_times(m, plan, gpu)
    n, v = plan.num_microbatches, plan.vpp
    l_max = maximum(max_stage_layers(m, plan), 1)
    moe_max = 1
    for s in stages:
        moe_max = maximum(moe_max, s[3])
    z3 = plan.zero >= 3
    per_mb, parts = [], []
    for _, sc, layers, moe_layers in stages:
        tp_mb = comm.tp / n * layers / l_max
        tp_mb = where(plan.tp_comm_overlap & plan.sp, maximum(0.0, tp_mb - sc.gemm), tp_mb)
        cp_mb = maximum(0.0, comm.cp / n * layers / l_max - sc.attention)
        ep_mb = comm.ep / n * moe_layers / moe_max
        z3_mb = where(z3, maximum(0.0, comm.dp_gather / n - sc.total), 0.0)
        per_mb.append(sc.total + tp_mb + cp_mb + ep_mb + z3_mb)
        parts.append((sc, tp_mb, cp_mb, ep_mb, z3_mb))
    sc, tp_mb, cp_mb, ep_mb, z3_mb = parts[0]
    worst = per_mb[0]
    for t, (sc_i, tp_i, cp_i, ep_i, z3_i) in zip(per_mb[1:], parts[1:]):
        c = t > worst
        sc, tp_mb, cp_mb, ep_mb, z3_mb = (_pick_stage(c, sc_i, sc), where(c, tp_i, tp_mb), where(c, cp_i, cp_mb),
                                          where(c, ep_i, ep_mb), where(c, z3_i, z3_mb))
        worst = maximum(worst, t)
    backward = sc.total - sc.forward
    reduce = where(z3, n * maximum(0.0, comm.dp_reduce / n - backward),
                   where(plan.overlap_grad_reduce, maximum(0.0, comm.dp_reduce - backward), comm.dp_reduce))
    gather = where(z3, n * z3_mb,
                   where(plan.overlap_param_gather & (plan.zero >= 1), maximum(0.0, comm.dp_gather - sc.forward),
                         comm.dp_gather))
    p2p = comm.pp / maximum(2 * n * v, 1)
    p = plan.pp
    pp_exposed = where(v == 1, 2 * (n + p - 1) * p2p, 2 * (p - 1) * v * p2p)
    exposed = {"tp": n * tp_mb, "pp": pp_exposed, "dp": reduce + gather, "cp": n * cp_mb, "ep": n * ep_mb}
    model = model_flops_per_step(m, plan)
    return StepTime(
        compute=n * sc.total, bubble=(pipeline_sum(plan, per_mb) - worst) / v, comm_exposed=sum(exposed.values()),
        optimizer=optimizer_step_seconds(params_on_rank, plan, gpu), exposed=exposed, stage=sc,
        model_flops=model, hardware_flops=model + recompute_flops_per_step(m, plan),
    )


@dataclass(frozen=True)
class Throughput:
    tokens_per_s: Any
    tflops_per_gpu: Any
    """Model FLOPs per second per GPU, in TFLOP/s."""
    mfu: Any
    hfu: Any
    comm_ratio: Any
    """Exposed communication / step time."""


def throughput(plan: ParallelPlan, gpu: GpuSpec, st: StepTime) -> Throughput:
    """Tokens/s, model TFLOP/s per GPU, MFU and HFU (against the peak of the plan's dtype).
    Source: Korthikanti et al. 2022 §6 (MFU / HFU definitions)."""
    step, gpus = st.total, plan.num_gpus
    peak = gpu.peak_flops(plan.dtype)
    return Throughput(
        tokens_per_s=plan.global_batch * plan.seq_len / step,
        tflops_per_gpu=st.model_flops / (step * gpus) / 1e12,
        mfu=st.model_flops / (step * gpus * peak),
        hfu=st.hardware_flops / (step * gpus * peak),
        comm_ratio=st.comm_exposed / step,
    )


def bottleneck(st: StepTime) -> Any:
    """Name of the largest part of the step (compute split into GEMM / attention / memory-bound)."""
    n = st.compute / np.maximum(st.stage.total, 1e-30)
    parts = [n * st.stage.gemm, n * st.stage.attention, n * st.stage.memory_bound, st.bubble,
             *(st.exposed[a] for a in ("tp", "pp", "dp", "cp", "ep")), st.optimizer]
    idx = np.argmax(np.stack(np.broadcast_arrays(*parts)), axis=0)
    return np.asarray(BOTTLENECKS)[idx]
