"""The library entry point for one training plan: memory, communication, step time and throughput."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

from llmplan.cost.comm import CommBreakdown, comm_seconds, step_comm
from llmplan.cost.goodput import Goodput, plan_goodput
from llmplan.cost.compute import stage_compute
from llmplan.cost.memory import TrainingMemory, stage_memory, training_memory
from llmplan.cost.operators import OperatorUse, operator_uses, with_fallbacks
from llmplan.cost.params import ParamCounts, param_counts, stage_layer_list, stage_layers
from llmplan.cost.runtime_memory import mla_turns_tp_overlap_off, tp_overlap_as_run, userbuffers_on
from llmplan.cost.step import StepTime, Throughput, bottleneck, step_time, throughput
from llmplan.errors import LlmplanError, PlanViolationError
from llmplan.specs.check import check_plan
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ClusterSpec, MemoryAllowance, ParallelPlan, trained_model
from llmplan.specs.resilience import CheckpointPolicy
from llmplan.topology.placement import DEFAULT_ORDER, on_cluster, place


@dataclass(frozen=True)
class TrainingEstimate:
    model: ModelSpec
    cluster: ClusterSpec
    plan: ParallelPlan
    params: ParamCounts
    memory: TrainingMemory
    comm: CommBreakdown
    time: StepTime
    throughput: Throughput
    bottleneck: str
    stage_layers: tuple[int, ...] = ()
    """Transformer layers of every pipeline stage, first to last."""
    operators: tuple[OperatorUse, ...] = ()
    """The fused kernels the plan relies on and whether the GPU has them."""
    fallback_cost: tuple[float, float] = (0.0, 0.0)
    """(extra bytes per GPU, extra seconds per step) the fallbacks of missing kernels cost."""
    goodput: Goodput | None = None
    """Failures, checkpoints and restarts: the share of wall-clock time that trains (cost.goodput)."""
    checkpoint: CheckpointPolicy = CheckpointPolicy()
    """How the job checkpoints (what `goodput` was priced with)."""
    order: tuple[str, ...] = DEFAULT_ORDER
    """The axis order the plan was placed in (topology.placement.place)."""
    single_system: bool = True
    """False for a plan across pools (llmplan.hetero), whose overlap-off price this estimate cannot make."""

    @cached_property
    def tp_overlap_gain(self) -> float | None:
        """Seconds a step Transformer Engine's userbuffer TP overlap saves against the same plan without it
        (negative: the overlap costs more than it hides); None where no userbuffer overlap runs. Priced when
        first asked (the report, the search's ub_loses check), not with every estimate (tp_overlap_gain)."""
        if not self.single_system:
            return None
        runs = with_fallbacks(self.plan, list(self.operators))
        return tp_overlap_gain(self.model, self.cluster, runs, float(self.time.total), self.order)


def estimate_training(m: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan,
                      allowance: MemoryAllowance | None = None,
                      order: tuple[str, ...] = DEFAULT_ORDER,
                      checkpoint: CheckpointPolicy | None = None) -> TrainingEstimate:
    """Everything llmplan predicts for one plan; raises PlanViolationError when the plan breaks a rule."""
    violations = check_plan(m, plan, cluster)
    if violations:
        raise PlanViolationError(violations)
    m = trained_model(m, plan)  # the MTP modules the plan trains (ParallelPlan.mtp_layers)
    gpu = cluster.system.gpu
    uses = operator_uses(m, plan, gpu)
    runs = with_fallbacks(plan, uses)
    mem, comm, step = _evaluate(m, cluster, runs, allowance, order)
    extra = (0.0, 0.0)
    if runs is not plan:  # what the missing kernels cost: the same plan as if the GPU had them
        ideal_mem, _, ideal_step = _evaluate(m, cluster, plan, allowance, order)
        extra = (float(mem.total - ideal_mem.total), float(step.total - ideal_step.total))
    checkpoint = checkpoint or CheckpointPolicy()
    return TrainingEstimate(m, cluster, plan, param_counts(m), mem, comm, step, throughput(runs, gpu, step),
                            str(bottleneck(step)), tuple(stage_layer_list(m, plan)), tuple(uses), extra,
                            plan_goodput(m, cluster, runs, float(step.total), checkpoint), checkpoint, order)


def tp_overlap_gain(m: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, step_s: float,
                    order: tuple[str, ...] = DEFAULT_ORDER) -> float | None:
    """Seconds a step (`step_s`, the plan's own) the userbuffer TP overlap saves against the same plan with
    tp_comm_overlap off, negative where it loses (set_sm_margin's SMs taken from the forward reduce-scatters'
    GEMMs for their whole length cost more than the collectives it hides: large h at TP 2); None where no
    userbuffer overlap runs (userbuffers_on; Megatron-Core turns it off on MLA models).
    Derived: docs/formulas.md#step.ub_loses"""
    if not bool(userbuffers_on(plan)) or mla_turns_tp_overlap_off(m, plan):
        return None
    off = plan.model_copy(update={"tp_comm_overlap": False})
    return float(_evaluate(m, cluster, off, None, order)[2].total) - step_s  # priced as the plan itself is


def with_checkpoint(e: TrainingEstimate, checkpoint: CheckpointPolicy) -> TrainingEstimate:
    """e priced with another checkpoint policy: of an estimate only its goodput depends on the policy, so the
    plan's memory, communication and step are e's (estimate_training's goodput of the same step)."""
    runs = with_fallbacks(e.plan, list(e.operators))
    return replace(e, goodput=plan_goodput(e.model, e.cluster, runs, float(e.time.total), checkpoint),
                   checkpoint=checkpoint)


def _evaluate(m: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, allowance: MemoryAllowance | None,
              order: tuple[str, ...]) -> tuple[TrainingMemory, CommBreakdown, StepTime]:
    gpu = cluster.system.gpu
    plan = on_cluster(plan, cluster)  # the NVLink domain the compute costs read (ParallelPlan.nvlink_domain_ranks)
    mem = training_memory(m, plan, gpu.hbm_bytes, allowance, gpu.fp8_tn_only, gpu.nccl_sms,
                          gpu.compute_capability, gpu.has_sparse_gather_rate)
    comm = step_comm(m, plan, place(plan.degrees, cluster, order), cluster.system)
    return mem, comm, step_time(m, plan, gpu, comm_seconds(comm, cluster.system))

@dataclass(frozen=True)
class StageView:
    """One pipeline stage of a training plan, as `llmplan report` draws it."""

    stage: int
    layers: int
    memory: TrainingMemory
    """Memory per GPU of this stage's ranks."""
    forward_s: float
    """One micro-batch's forward on this stage (all its chunks), seconds."""
    backward_s: float
    """One micro-batch's backward (recompute included), seconds."""


def stage_views(e: TrainingEstimate, allowance: MemoryAllowance | None = None) -> list[StageView]:
    """Every stage's memory and per-micro-batch compute, with the kernels the GPU has (as the estimate)."""
    m, plan, gpu = e.model, e.plan, e.cluster.system.gpu
    runs = on_cluster(with_fallbacks(plan, operator_uses(m, plan, gpu)), e.cluster)
    allowance = allowance or MemoryAllowance()
    out = []
    for i in range(plan.pp):
        dense, moe = stage_layers(m, runs, i)
        sc = stage_compute(m, tp_overlap_as_run(m, runs), gpu, dense, moe, i == plan.pp - 1)  # as step_time
        mem = stage_memory(m, runs, i, allowance, gpu.hbm_bytes, gpu.fp8_tn_only, gpu.nccl_sms, gpu.compute_capability,
                           gpu.has_sparse_gather_rate)
        out.append(StageView(i, e.stage_layers[i], mem, float(sc.forward), float(sc.total - sc.forward)))
    return out


@dataclass(frozen=True)
class ScalePoint:
    """The plan's model at another GPU count, as `llmplan report` draws goodput against scale."""

    gpus: int
    goodput: float
    """Share of wall-clock time that trains (cost.goodput)."""
    tokens_per_s: float
    """Without failures."""
    effective_tokens_per_s: float
    """tokens_per_s x goodput: what survives failures, checkpoints and restarts."""
    mtbf_s: float


SCALE_FACTORS = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1, 2, 4, 8, 16, 32)


def goodput_scaling(e: TrainingEstimate, allowance: MemoryAllowance | None = None,
                    order: tuple[str, ...] = DEFAULT_ORDER) -> list[ScalePoint]:
    """Goodput and the tokens/s that survive failures with the plan's data parallelism scaled (x1/16 .. x32;
    the global batch, the other degrees and the checkpoint policy kept), for every scale the plan's rules
    allow: where adding GPUs stops paying. Derived: docs/formulas.md#goodput.fraction"""
    out = []
    per_node = e.cluster.gpus_per_node_used
    for f in SCALE_FACTORS:
        dp = e.plan.dp * f
        if dp < 1 or dp != int(dp):
            continue
        plan = e.plan.model_copy(update={"dp": int(dp)})
        gpus = plan.num_gpus
        if gpus % per_node and gpus > per_node:
            continue
        try:
            cluster = ClusterSpec(system=e.cluster.system, num_nodes=max(gpus // per_node, 1),
                                  gpus_per_node=min(gpus, per_node) if gpus < per_node else e.cluster.gpus_per_node)
            x = e if plan == e.plan else estimate_training(e.model, cluster, plan, allowance, order, e.checkpoint)
        except (LlmplanError, ValueError):
            continue
        g = x.goodput
        if g is None:
            continue
        tps = float(x.throughput.tokens_per_s)
        out.append(ScalePoint(gpus, float(g.useful), tps, tps * float(g.useful), float(g.mtbf_s)))
    return out
