"""Goodput at scale: failures, checkpoints and restarts (docs/formulas.md#goodput.failures ...).

The pure functions work on one ParallelPlan (Python numbers) and, unchanged, on search.grid.PlanArrays
(numpy arrays), as the other cost functions do (llmplan/arith.py). Seconds and bytes throughout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from llmplan.arith import maximum, minimum, where
from llmplan.cost.breakdown import Breakdown
from llmplan.cost.memory import candidate_stages, class_key, each_stage
from llmplan.cost.model_states import (bf16_kept_params, fp32_shards_are_master, kept_copy_extra_bytes,
                                       model_bf16_kept_params, stored_weight_bytes)
from llmplan.cost.muon import model_muon_params, muon_params
from llmplan.cost.params import RankParams, mtp_params, param_counts, rank_params
from llmplan.specs.hardware import SystemSpec
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.plan_choices import OPTIMIZER_STATE_BYTES
from llmplan.specs.resilience import CheckpointPolicy
from llmplan.units import GB

HOUR = 3600.0


def job_failure_rate(system: SystemSpec, gpus: int, nodes: int, per_gpu_hour: float | None = None) -> float:
    """Job-interrupting failures per second of a job on `gpus` GPUs in `nodes` nodes: every GPU, host and
    scale-out NIC is one component in series (any one failing stops the synchronous job).
    Source: Dubey et al. 2024 (The Llama 3 Herd of Models), Table 5: 419 unexpected interruptions of a 16,384-GPU
    job in 54 days, by root cause (GPU and software / host / network switches and cables)."""
    if per_gpu_hour is not None:
        return gpus * per_gpu_hour / HOUR
    nics = nodes * system.nics_per_node
    per_hour = (gpus * system.gpu.failures_per_gpu_hour + nodes * system.failures_per_node_hour
                + nics * system.failures_per_nic_hour)
    return per_hour / HOUR


def checkpoint_bytes_per_param(plan: ParallelPlan) -> Any:
    """Bytes a checkpoint holds per parameter: the model copy and the optimizer state (mixed-precision Adam:
    2 + 12; FSDP's fp32 shards are the master copy: 12). Gradients are not saved. The model copy at its stored
    bytes (cost.model_states.stored_weight_bytes: bf16 under torchao's fp8_params).
    Source: Rajbhandari et al. 2020 (ZeRO), Section 3.1 (2Ψ + 12Ψ model states without the 2Ψ gradients).
    Derived: docs/formulas.md#mem.torchao_fp8_shard"""
    return where(fp32_shards_are_master(plan), plan.optimizer_bytes, stored_weight_bytes(plan) + plan.optimizer_bytes)


def checkpoint_job_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Bytes of one checkpoint of the whole job: every parameter once (data-parallel replicas write one copy),
    the MTP modules' too (cost.params.mtp_params, which the published counts leave out: one weight set under
    mtp_repeated_layer, as checkpoint_rank_bytes' stages hold them), the bf16-kept ones (model_bf16_kept_params)
    at their 2 bytes under fp8_params. Derived: docs/formulas.md#goodput.checkpoint"""
    return (param_counts(m).total + mtp_params(m)) * checkpoint_bytes_per_param(plan) \
        + model_bf16_kept_params(m, plan) * kept_copy_extra_bytes(plan) - muon_checkpoint_saving(m, plan)


def muon_checkpoint_saving(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Bytes a checkpoint of the whole job does not hold under Muon: one moment of each Muon parameter (its single
    momentum buffer; cost.muon.model_muon_params); 0 under adam. Derived: docs/formulas.md#optim.muon_memory"""
    if plan.optimizer != "muon":
        return 0.0
    return model_muon_params(m) * OPTIMIZER_STATE_BYTES[plan.optimizer_moment_dtype]


def checkpoint_rank_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Bytes the busiest rank writes: its stage's parameters x checkpoint bytes, the replicated ones split over
    the dp x cp ranks that hold them (expert weights over their expert-data-parallel group), the stage's
    bf16-kept ones at their 2 bytes under fp8_params, as a fully parallel distributed save assigns them
    (Megatron-LM dist_checkpointing, fully_parallel_save), less one moment of its Muon matrices under Muon
    (optim.muon_memory). Derived: docs/formulas.md#goodput.checkpoint, docs/formulas.md#optim.muon_memory"""
    per, extra = checkpoint_bytes_per_param(plan), kept_copy_extra_bytes(plan)

    def share(rp: RankParams) -> Any:
        return rp.dense / (plan.dp * plan.cp) + rp.expert / plan.expert_dp
    moment = OPTIMIZER_STATE_BYTES[plan.optimizer_moment_dtype]  # Muon's matrices hold one (optim.muon_memory)
    shares = each_stage(candidate_stages(m, plan),
                        lambda s: share(rank_params(m, plan, s)) * per
                        + share(bf16_kept_params(m, plan, s, paired=False)) * extra
                        - share(muon_params(m, plan, s, paired=False)) * moment, class_key(m, plan))
    best = shares[0]
    for s in shares[1:]:
        best = maximum(best, s)
    return best


def storage_seconds(job_bytes: Any, rank_bytes: Any, cluster: ClusterSpec) -> Any:
    """Seconds to write (or read) one checkpoint: the busiest node at its own storage bandwidth or the whole
    job at the storage's aggregate bandwidth, whichever is slower (balanced shards: job bytes over
    min(nodes x per-node, aggregate)). Derived: docs/formulas.md#goodput.checkpoint"""
    s = cluster.system
    node = rank_bytes * cluster.gpus_per_node_used / (s.checkpoint_node_gb_per_s * GB)
    return maximum(node, job_bytes / (s.checkpoint_gb_per_s * GB))


def host_copy_seconds(rank_bytes: Any, system: SystemSpec) -> Any:
    """Seconds one rank's device-to-host copy of its shard takes (all of an asynchronous checkpoint that
    blocks training), every GPU of the node copying at once (SystemSpec.host_bytes_per_s).
    Source: Megatron-LM --async-save (the copy to pinned host memory is synchronous)."""
    return rank_bytes / system.host_bytes_per_s


def peer_copy_seconds(rank_bytes: Any, system: SystemSpec) -> Any:
    """Seconds to send one rank's shard to a peer node's memory over its share of the node's NICs (in-memory
    checkpoints). Source: Wang et al. 2023 (Gemini, SOSP), Section 4 (checkpoints to remote CPU memory)."""
    per_gpu = system.nics_per_node * system.nic_bytes_per_s / system.gpus_per_node
    return rank_bytes / per_gpu if per_gpu > 0 else host_copy_seconds(rank_bytes, system)


def young_interval(cost_s: Any, mtbf_s: Any) -> Any:
    """The first-order optimal compute time between checkpoints. Source: Young 1974, "A first order
    approximation to the optimum checkpoint interval", CACM 17(9): sqrt(2 C M)."""
    return (2 * cost_s * mtbf_s) ** 0.5


def daly_interval(cost_s: Any, mtbf_s: Any) -> Any:
    """Daly's higher-order optimum: sqrt(2CM)[1 + sqrt(C/2M)/3 + (C/2M)/9] - C for C < 2M, else M.
    Source: Daly 2006, "A higher order estimate of the optimum checkpoint interval for restart dumps", FGCS
    22(3), Eq. 37."""
    x = cost_s / (2 * mtbf_s)
    tau = young_interval(cost_s, mtbf_s) * (1 + np.sqrt(x) / 3 + x / 9) - cost_s
    return where(cost_s < 2 * mtbf_s, tau, mtbf_s * 1.0)


@dataclass(frozen=True)
class Goodput(Breakdown):
    """Shares of a training job's wall-clock time: useful + checkpointing + lost_work + restarting = 1;
    useful is the goodput. The other fields are the inputs and intermediate values (seconds, bytes)."""

    PARTS: ClassVar[tuple[str, ...]] = ("useful", "checkpointing", "lost_work", "restarting")
    useful: Any
    """Training that survives: the goodput fraction."""
    checkpointing: Any
    """Training blocked while checkpoints are taken."""
    lost_work: Any
    """Training redone after failures (since the last complete checkpoint)."""
    restarting: Any
    """Detection, rescheduling, loading the checkpoint and warm-up after failures."""
    mode: str
    """CheckpointPolicy.mode."""
    mtbf_s: Any
    """Mean time between job-interrupting failures (inf with a zero failure rate)."""
    checkpoint_bytes: Any
    """One checkpoint of the whole job."""
    rank_bytes: Any
    """What the busiest rank writes."""
    checkpoint_s: Any
    """Until a checkpoint is safe: written to storage (sync, async) or to a peer's memory (memory)."""
    blocking_s: Any
    """What training waits for per checkpoint."""
    interval_s: Any
    """Training between checkpoints."""
    restart_s: Any
    """Detection + rescheduling + loading + warm-up per failure."""
    lost_s: Any
    """Training lost per failure on average."""

    @property
    def goodput(self) -> Any:
        return self.useful


def goodput_shares(interval_s: Any, blocking_s: Any, lost_s: Any, restart_s: Any, rate: Any) -> tuple[Any, ...]:
    """(useful, checkpointing, lost, restarting) shares of the wall-clock time: a cycle of interval_s training
    and blocking_s checkpointing takes (interval + blocking) / (1 - rate (restart + lost)) with failures at
    `rate` per second, each costing a restart and the lost work; no useful time when a failure comes faster
    than the job recovers. Source: Daly 2006, FGCS 22(3), Section 3 (first order: one failure per segment)."""
    if rate <= 0:  # no failures: only the checkpoints cost time
        return 1 / (1 + blocking_s / interval_s), blocking_s / interval_s / (1 + blocking_s / interval_s), 0.0, 0.0
    down = rate * (restart_s + lost_s)
    up = maximum(1 - down, 0.0)
    ratio = blocking_s / interval_s
    lost = where(down < 1, rate * lost_s, lost_s / maximum(restart_s + lost_s, 1e-300))
    return up / (1 + ratio), up * ratio / (1 + ratio), lost, minimum(down, 1.0) - lost


def plan_goodput(m: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, step_s: Any,
                 policy: CheckpointPolicy | None = None) -> Goodput:
    """Goodput of a plan on its cluster: checkpoint bytes from the plan's shards, their write, the optimal
    interval for the blocking part (Daly), restarts and lost work. Derived: docs/formulas.md#goodput.fraction"""
    policy = policy or CheckpointPolicy()
    s = cluster.system
    rate = job_failure_rate(s, cluster.num_gpus, cluster.num_nodes, policy.failures_per_gpu_hour)
    mtbf = 1 / rate if rate > 0 else float("inf")
    job, rank = checkpoint_job_bytes(m, plan), checkpoint_rank_bytes(m, plan)
    storage, host = storage_seconds(job, rank, cluster), host_copy_seconds(rank, s)
    write = peer_copy_seconds(rank, s) if policy.mode == "memory" else storage
    blocking = maximum(storage, host) if policy.mode == "sync" else host
    interval = policy.interval_s or maximum(maximum(daly_interval(blocking, mtbf), write), step_s)
    lost = (interval + blocking) / 2 + (0.0 if policy.mode == "sync" else write)
    restart = s.failure_detection_s + s.restart_overhead_s + s.restart_warmup_s + write
    useful, checkpointing, lost_work, restarting = goodput_shares(interval, blocking, lost, restart, rate)
    return Goodput(useful, checkpointing, lost_work, restarting, mode=policy.mode, mtbf_s=mtbf, checkpoint_bytes=job,
                   rank_bytes=rank, checkpoint_s=write, blocking_s=blocking, interval_s=interval, restart_s=restart,
                   lost_s=lost)
