"""The library entry point for a training plan on a cluster of several pools (specs.pools): the plan's layer
split by each pool's speed, and its memory per pool, step time and throughput.

Two ways to spread a plan over pools:
- stages: pipeline stage i (all its data-parallel copies) runs on pool stage_pools[i]; the stages' layers are
  split by each pool's speed (cost.hetero.speed_layout), each stage is priced on its own pool's GPU and links
  (cost.step.step_time's per_stage), the slowest stage paces the pipeline; sends between stages of different
  pools cross the inter-pool fabric.
- replicas: each pool runs whole (tp, pp, cp) replicas of the plan with a share of the global batch in
  proportion to its speed (cost.hetero.batch_shares); each pool's part is the single-system estimate, the
  step is the slowest pool's plus the gradient reduction between pools (cost.hetero.cross_pool_reduce_seconds).
A cluster of one pool, or a plan all on one pool, is exactly the single-system estimate.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from llmplan.cost.comm import comm_seconds, pp_sends, reduce_wire_bytes, step_comm
from llmplan.cost.compute import stage_compute
from llmplan.cost.hybrid_stage import priced_stage_compute
from llmplan.cost.goodput import plan_goodput
from llmplan.cost.hetero import (
    batch_shares,
    cross_pool_p2p_seconds,
    cross_pool_reduce_seconds,
    speed_layout,
)
from llmplan.cost.memory import TrainingMemory, stage_memory
from llmplan.cost.operators import operator_uses, with_fallbacks
from llmplan.cost.params import param_counts, stage_layer_list, stage_layers
from llmplan.cost.runtime_memory import tp_overlap_as_run
from llmplan.cost.step import bottleneck, step_time, throughput
from llmplan.errors import LlmplanError, PlanViolationError
from llmplan.estimate import TrainingEstimate, estimate_training
from llmplan.specs.check import check_plan, check_pools
from llmplan.specs.hardware import SystemSpec
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ClusterSpec, MemoryAllowance, ParallelPlan, trained_model
from llmplan.specs.pools import HeteroPlan, PoolCluster
from llmplan.specs.resilience import CheckpointPolicy
from llmplan.topology.placement import DEFAULT_ORDER, on_cluster, place
from llmplan.units import GIB


@dataclass(frozen=True)
class PoolUse:
    """What one pool holds of a plan and what it costs there."""

    pool: int
    """Index into PoolCluster.pools."""
    name: str
    system: str
    gpus: int
    """GPUs of the pool the plan uses."""
    stages: tuple[int, ...]
    """Pipeline stages on the pool (assignment stages; every stage for replicas)."""
    replicas: int
    """Data-parallel replicas on the pool (all dp for assignment stages)."""
    global_batch: int
    """Sequences per step the pool's GPUs process (the whole global batch for assignment stages)."""
    layers: tuple[int, ...]
    """Transformer layers of each of its stages."""
    memory: TrainingMemory
    """Memory per GPU of the pool's most-loaded rank."""
    compute_s: float
    """Compute per step of the pool's slowest stage (stages) or of its replicas' step (replicas), seconds."""
    step_s: float
    """The pool's own step: the shared pipeline's step (stages) or its replicas' step without the
    cross-pool reduction (replicas), seconds."""


@dataclass(frozen=True)
class HeteroEstimate:
    """A plan on several pools: the combined estimate (the JSON keys of a single-system plan, its memory the
    most-loaded rank relative to its pool's capacity) and what each pool holds."""

    estimate: TrainingEstimate
    hetero: HeteroPlan
    pools: tuple[PoolUse, ...]
    cross_pool_s: float = 0.0
    """Seconds per step on the inter-pool fabric: the exposed gradient reduction between pools (replicas) or
    the pipeline sends' extra over the pool's own links (stages)."""

    @property
    def fits(self) -> bool:
        return all(bool(u.memory.fits) for u in self.pools)


def pool_cluster(system: SystemSpec, gpus: int) -> ClusterSpec:
    """`gpus` GPUs of `system` as a one-system cluster (whole nodes, or part of one node)."""
    per = system.gpus_per_node
    if gpus < per:
        return ClusterSpec(system=system, num_nodes=1, gpus_per_node=gpus)
    return ClusterSpec(system=system, num_nodes=gpus // per)


def layer_seconds(m: ModelSpec, plan: ParallelPlan, system: SystemSpec) -> float:
    """One transformer layer's forward and backward of one micro-batch on the system's GPU (the pool's speed
    for the layer split; a MoE layer where the model has them)."""
    moe = 1 if m.is_moe else 0
    plan = on_cluster(plan, pool_cluster(system, plan.num_gpus))  # the pool's NVLink domain (HybridEP's scan)
    return float(stage_compute(m, tp_overlap_as_run(m, plan), system.gpu, 1 - moe, moe, False).total)


def stage_plan(m: ModelSpec, pc: PoolCluster, plan: ParallelPlan, stage_pools: tuple[int, ...],
               caps: list[int] | None = None) -> HeteroPlan:
    """`plan` with its stages on `stage_pools` and its layers split by each pool's speed (one chunk per
    stage); ValueError when the split is impossible."""
    m = trained_model(m, plan)
    if m.num_nextn_predict_layers:
        raise ValueError("a model with MTP layers is split by the single-system layout")
    base = plan.model_copy(update={"vpp": 1, "pp_layout": None, "pp_layers": None, "pp_first": 0, "pp_last": 0})
    speed = {g: layer_seconds(m, base, pc.pools[g].system) for g in set(stage_pools)}
    layout = speed_layout(m.num_hidden_layers, [speed[g] for g in stage_pools], caps)
    return HeteroPlan(plan=base.model_copy(update={"pp_layout": layout}), assignment="stages",
                      stage_pools=stage_pools)


def replica_plan(m: ModelSpec, pc: PoolCluster, plan: ParallelPlan, replica_pools: tuple[int, ...],
                 allowance: MemoryAllowance | None = None,
                 order: tuple[str, ...] = DEFAULT_ORDER) -> HeteroPlan | None:
    """`plan` with replica_pools[g] replicas on pool g and the global batch shared by each pool's speed
    (sequences per second of its replicas at an even share, from the single-system estimate); None when the
    batch cannot be shared in whole micro-batches."""
    total = sum(replica_pools)
    speeds, units = [], []
    for g, r in enumerate(replica_pools):
        if not r:
            continue
        part = plan.model_copy(update={"dp": r, "global_batch": plan.micro_batch * r * max(
            1, plan.global_batch // (plan.micro_batch * total))})
        e = estimate_training(m, pool_cluster(pc.pools[g].system, part.num_gpus), part, allowance, order)
        speeds.append(part.global_batch / float(e.time.total))
        units.append(plan.micro_batch * r)
    shares = batch_shares(plan.global_batch, units, speeds)
    if shares is None:
        return None
    it = iter(shares)
    return HeteroPlan(plan=plan.model_copy(update={"dp": total}), assignment="replicas",
                      replica_pools=replica_pools, replica_batches=tuple(next(it) if r else 0 for r in replica_pools))


def estimate_hetero(m: ModelSpec, pc: PoolCluster, hp: HeteroPlan, allowance: MemoryAllowance | None = None,
                    order: tuple[str, ...] = DEFAULT_ORDER,
                    checkpoint: CheckpointPolicy | None = None) -> HeteroEstimate:
    """Everything llmplan predicts for a plan on several pools; raises PlanViolationError when the plan breaks
    a rule (check_pools, and check_plan on every pool's part)."""
    violations = check_pools(m, hp, pc)
    if violations:
        raise PlanViolationError(violations)
    m = trained_model(m, hp.plan)  # the MTP modules the plan trains (ParallelPlan.mtp_layers)
    if hp.assignment == "replicas":
        return _replicas(m, pc, hp, allowance, order, checkpoint)
    return _stages(m, pc, hp, allowance, order, checkpoint)


def _replicas(m: ModelSpec, pc: PoolCluster, hp: HeteroPlan, allowance: MemoryAllowance | None,
              order: tuple[str, ...], checkpoint: CheckpointPolicy | None) -> HeteroEstimate:
    plan, parts = hp.plan, []
    for g, (r, b) in enumerate(zip(hp.replica_pools or (), hp.replica_batches or (), strict=True)):
        if r:
            part = plan.model_copy(update={"dp": r, "global_batch": b})
            parts.append((g, estimate_training(m, pool_cluster(pc.pools[g].system, part.num_gpus), part,
                                               allowance, order, checkpoint)))
    if len(parts) == 1:
        e = parts[0][1]
        return HeteroEstimate(e, hp, (pool_use(pc, parts[0][0], e, tuple(range(plan.pp)), plan.dp, plan.global_batch),))
    # the bytes on the wire: 2 an element under grad_reduce_dtype bf16 (comm.reduce_wire_bytes)
    grad = max(float(e.memory.params_on_rank) for _, e in parts) * float(reduce_wire_bytes(plan))
    cross = cross_pool_reduce_seconds(grad, list(hp.replica_pools or ()), pc.fabric)
    _, slow = max(parts, key=lambda x: float(x[1].time.total))
    st = slow.time
    st = dataclasses.replace(st, comm_exposed=st.comm_exposed + cross, exposed={**st.exposed, "dp": st.exposed["dp"]
                                                                                 + cross})
    return _combine(m, pc, hp, slow, st, [(g, e, e.plan.num_gpus) for g, e in parts], cross,
                    [pool_use(pc, g, e, tuple(range(plan.pp)), e.plan.dp, e.plan.global_batch) for g, e in parts])


def _stages(m: ModelSpec, pc: PoolCluster, hp: HeteroPlan, allowance: MemoryAllowance | None,
            order: tuple[str, ...], checkpoint: CheckpointPolicy | None) -> HeteroEstimate:
    plan, sp = hp.plan, hp.stage_pools or ()
    used = sorted(set(sp))
    if len(used) == 1:  # all on one pool: the single-system estimate
        e = estimate_training(m, pool_cluster(pc.pools[used[0]].system, plan.num_gpus), plan, allowance, order,
                              checkpoint)
        return HeteroEstimate(e, hp, (pool_use(pc, used[0], e, tuple(range(plan.pp)), plan.dp, plan.global_batch),))
    clusters = {g: pool_cluster(pc.pools[g].system, plan.num_gpus) for g in used}
    for c in clusters.values():
        violations = check_plan(m, plan, c)
        if violations:
            raise PlanViolationError(violations)
    slow = min(used, key=lambda g: (pc.pools[g].system.gpu.sustained_flops(plan.gemm_format), g))
    # one NVLink domain per plan (ParallelPlan.nvlink_domain_ranks): the slowest pool's, which paces the step
    runs = on_cluster(with_fallbacks(plan, operator_uses(m, plan, pc.pools[slow].system.gpu)), clusters[slow])
    comms = {g: step_comm(m, runs, place(runs.degrees, clusters[g], order), pc.pools[g].system) for g in used}
    secs = {g: comm_seconds(comms[g], pc.pools[g].system) for g in used}
    allowance = allowance or MemoryAllowance()
    mems = [stage_memory(m, runs, i, allowance, pc.pools[g].system.gpu.hbm_bytes, pc.pools[g].system.gpu.fp8_tn_only,
                         pc.pools[g].system.gpu.nccl_sms, pc.pools[g].system.gpu.compute_capability,
                         pc.pools[g].system.gpu.has_sparse_gather_rate)
            for i, g in enumerate(sp)]
    worst = max(range(plan.pp), key=lambda i: (float(mems[i].total / mems[i].capacity), -i))
    # Sends between stages of two pools cross the inter-pool fabric: the slowest link paces every send.
    msg = comms[slow].axes["pp"].transfers[0].message
    calls = pp_sends(runs)
    cross_pp = calls * cross_pool_p2p_seconds(msg, pc.fabric)
    comm_slow = secs[slow]
    cross = max(cross_pp - comm_slow.pp, 0.0)
    comm_slow = dataclasses.replace(comm_slow, pp=max(comm_slow.pp, cross_pp))
    per_stage = tuple((pc.pools[g].system.gpu, secs[g]) for g in sp)
    st = step_time(m, runs, pc.pools[slow].system.gpu, comm_slow, per_stage)
    e = TrainingEstimate(m, clusters[slow], plan, param_counts(m), mems[worst], comms[slow], st,
                         throughput(runs, pc.pools[slow].system.gpu, st), str(bottleneck(st)),
                         tuple(stage_layer_list(m, plan)), tuple(operator_uses(m, plan, pc.pools[slow].system.gpu)),
                         (0.0, 0.0), plan_goodput(m, clusters[slow], runs, float(st.total), checkpoint or
                                                  CheckpointPolicy()), checkpoint or CheckpointPolicy(),
                         single_system=False)
    n, uses = runs.num_microbatches, []
    for g in used:
        mine = tuple(i for i, x in enumerate(sp) if x == g)
        top = max(mine, key=lambda i: (float(mems[i].total / mems[i].capacity), -i))
        busy = max(float(priced_stage_compute(m, tp_overlap_as_run(m, runs), pc.pools[g].system.gpu, i,
                                              *stage_layers(m, runs, i), i == plan.pp - 1).total) for i in mine)
        uses.append(PoolUse(g, pc.pools[g].name, pc.pools[g].system.name, len(mine) * plan.tp * plan.cp * plan.dp,
                            mine, plan.dp, plan.global_batch, tuple(e.stage_layers[i] for i in mine), mems[top],
                            n * busy, float(st.total)))
    return _combine(m, pc, hp, e, st, [(u.pool, e, u.gpus) for u in uses], cross, uses)


def pool_use(pc: PoolCluster, g: int, e: TrainingEstimate, stages: tuple[int, ...], replicas: int,
         batch: int) -> PoolUse:
    return PoolUse(g, pc.pools[g].name, pc.pools[g].system.name, e.plan.num_gpus, stages, replicas, batch,
                   e.stage_layers, e.memory, float(e.time.compute), float(e.time.total))


def _combine(m: ModelSpec, pc: PoolCluster, hp: HeteroPlan, base: TrainingEstimate, st, gpus, cross: float,
             uses: list[PoolUse]) -> HeteroEstimate:
    """The combined estimate: the whole plan, its step `st`, the most-loaded pool's memory, and the
    throughput with MFU against the sum of every used GPU's peak."""
    plan = hp.plan
    peak = sum(n * pc.pools[g].system.gpu.peak_flops(plan.mfu_format) for g, _, n in gpus)
    low = sum(n * pc.pools[g].system.gpu.peak_flops(plan.gemm_format) for g, _, n in gpus) if plan.low_precision \
        else None
    step = float(st.total)
    model_flops = float(st.model_flops) * (plan.global_batch / base.plan.global_batch)
    hardware_flops = float(st.hardware_flops) * (plan.global_batch / base.plan.global_batch)
    st = dataclasses.replace(st, model_flops=model_flops, hardware_flops=hardware_flops)
    thr = dataclasses.replace(
        throughput(base.plan, base.cluster.system.gpu, st),
        tokens_per_s=plan.global_batch * plan.seq_len / step,
        tflops_per_gpu=model_flops / (step * plan.num_gpus) / 1e12,
        mfu=model_flops / (step * peak),
        hfu=hardware_flops / (step * peak),
        mfu_low_precision=model_flops / (step * low) if low else None,
    )
    worst = max(uses, key=lambda u: (float(u.memory.total / u.memory.capacity), -u.pool))
    e = dataclasses.replace(base, cluster=pool_cluster(base.cluster.system, plan.num_gpus), plan=plan,
                            memory=worst.memory, time=st, throughput=thr, bottleneck=str(bottleneck(st)))
    return HeteroEstimate(e, hp, tuple(uses), cross)


def replica_counts(pc: PoolCluster, plan: ParallelPlan) -> tuple[int, ...]:
    """Replicas of plan's (tp, pp, cp) shape each pool holds in whole nodes (at most its GPUs)."""
    size = plan.tp * plan.pp * plan.cp
    out = []
    for p in pc.pools:
        r = p.num_gpus // size
        while r and (r * size) % p.system.gpus_per_node and r * size > p.system.gpus_per_node:
            r -= 1
        out.append(r)
    return tuple(out)


def stage_counts(pc: PoolCluster, plan: ParallelPlan, order: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every stage_pools of plan's pp stages over the pools in `order` (consecutive blocks, each pool at least
    one stage and at most what its GPUs hold)."""
    width = plan.tp * plan.cp * plan.dp
    room = [pc.pools[g].num_gpus // width for g in order]
    out: list[tuple[int, ...]] = []

    def walk(i: int, left: int, acc: tuple[int, ...]) -> None:
        if i == len(order) - 1:
            if 1 <= left <= room[i]:
                out.append(acc + (order[i],) * left)
            return
        for k in range(1, min(room[i], left - (len(order) - 1 - i)) + 1):
            walk(i + 1, left - k, acc + (order[i],) * k)

    walk(0, plan.pp, ())
    return out


def no_fit(e: HeteroEstimate) -> LlmplanError:
    over = [u for u in e.pools if not bool(u.memory.fits)]
    return LlmplanError(", ".join(f"pool {u.name} needs {float(u.memory.total) / GIB:.1f} GiB of "
                                  f"{float(u.memory.capacity) / GIB:.1f}" for u in over))
