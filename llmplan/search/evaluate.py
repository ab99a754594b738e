"""Vectorised evaluation of many plans: the same cost functions as `llmplan estimate`, on arrays.

Communication is the one part that depends on where groups sit: spans are computed once per distinct
layout (tp, pp, dp, cp, ep, etp), and each collective's cost is affine in its size per algorithm, so the
per-plan time is calls x min over algorithms of (alpha + size x beta) with alpha, beta gathered by layout.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from llmplan.cost.comm import (aux_loss_transfers, copy_seconds, cp_mixer_split, cp_transfers, dispatch_coeffs,
                               dp_transfers, te_cp_split, ep_transfers, mxfp8_amax_transfers, pp_transfers,
                               torchao_amax_transfers,
                               reduce_gather_split, hsdp_split, tp_edge_transfers, tp_step_end_transfers,
                               tp_transfers)
from llmplan.cost.memory import (ActivationBytes, TrainingMemory, candidate_stages, each_stage, stage_memory,
                                 training_memory)
from llmplan.cost.offload import attention_offload_bytes, moe_layer_offload_bytes, offload_layer_bytes
from llmplan.cost.step import CommSeconds, StepTime, Throughput, step_time, throughput
from llmplan.search.grid import PlanArrays
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ClusterSpec, Degrees, MemoryAllowance, cp_a2a_group
from llmplan.topology.placement import DEFAULT_ORDER, axis_dims, axis_span, on_cluster, place


@dataclass(frozen=True)
class Evaluation:
    plans: PlanArrays
    memory: TrainingMemory
    step: StepTime
    throughput: Throughput
    comm: CommSeconds | None = None
    """The communication seconds the step time was priced with (comm_seconds_arrays)."""


def evaluate_memory(m: ModelSpec, cluster: ClusterSpec, plans: PlanArrays,
                    allowance: MemoryAllowance | None = None,
                    known: dict[int, TrainingMemory] | None = None) -> TrainingMemory:
    """training_memory of the plan arrays on the cluster's GPU (`known`: training_memory's)."""
    gpu = cluster.system.gpu
    return training_memory(m, plans.as_plan, gpu.hbm_bytes, allowance, gpu.fp8_tn_only, gpu.nccl_sms,
                           gpu.compute_capability, gpu.has_sparse_gather_rate, known)


SCREEN_STAGE = 2
"""The candidate stage (cost.memory.candidate_stages: first, second, first all-MoE, last) whose memory screens
the plans before the full memory model: the one that rules out the most on the reference searches (DeepSeek-V3
on 256 H800: 66% of the plans, the first stage 64%, the last 63%)."""


@dataclass(frozen=True)
class Screened:
    """The memory of the plans that fit, found by screening (screened_memory)."""

    fits: np.ndarray
    """Per plan of the input: it leaves the headroom free (the full memory model's verdict)."""
    memory: TrainingMemory | None
    """training_memory of the plans that fit, in their order (None when none fits)."""
    least: int | None
    """The plan that does not fit with the least memory (the memory rule's example), None when all fit."""
    least_total: float
    """Its memory per GPU, bytes."""


def screened_memory(m: ModelSpec, cluster: ClusterSpec, plans: PlanArrays, allowance: MemoryAllowance | None,
                    headroom: float) -> Screened:
    """Which plans fit and the memory of those, with the full model (every candidate stage) run only where
    one stage alone leaves the headroom: a stage's memory is at most the most-loaded stage's, which is the
    plan's (training_memory), so a plan whose SCREEN_STAGE is already too big cannot fit. The same answer as
    training_memory on every plan, elementwise: the least-memory misfit too, its rivals computed in full
    where their screening stage is below the least found (tests/test_search_fast_paths.py)."""
    gpu = cluster.system.gpu
    stage = candidate_stages(m, plans.as_plan)[SCREEN_STAGE]
    screen = stage_memory(m, plans.as_plan, stage, allowance or MemoryAllowance(), gpu.hbm_bytes, gpu.fp8_tn_only,
                          gpu.nccl_sms, gpu.compute_capability, gpu.has_sparse_gather_rate)
    bound = np.asarray(screen.total, dtype=np.float64)
    maybe = np.flatnonzero(bound + headroom <= gpu.hbm_bytes)
    fits = np.zeros(len(plans), dtype=bool)
    known = np.full(len(plans), np.inf)  # exact memory where computed
    memory = None

    def full(at: np.ndarray) -> TrainingMemory:  # the full model on the plans at `at`, the screened stage reused
        return evaluate_memory(m, cluster, plans.take(at), allowance, {SCREEN_STAGE: take_tree(screen, at, len(plans))})
    if len(maybe):
        mem = full(maybe)
        total = np.asarray(mem.total, dtype=np.float64)
        ok = total + headroom <= mem.capacity
        fits[maybe[ok]] = True
        known[maybe] = total
        memory = take_memory(mem, np.flatnonzero(ok))
    least_seen = float(np.min(known[~fits])) if (~fits).any() else np.inf
    rivals = np.flatnonzero(~fits & np.isinf(known) & (bound <= least_seen))
    if len(rivals):
        known[rivals] = np.asarray(full(rivals).total, dtype=np.float64)
    if fits.all():
        return Screened(fits, memory, None, 0.0)
    least = int(np.argmin(np.where(~fits, known, np.inf)))
    return Screened(fits, memory, least, float(known[least]))


def take_memory(mem: TrainingMemory, idx: np.ndarray) -> TrainingMemory:
    """The memory breakdown of the plans at idx."""
    a = mem.activation_parts
    pick = lambda v: v[idx] if isinstance(v, np.ndarray) and v.shape else v  # noqa: E731
    return TrainingMemory(
        stage=pick(mem.stage), params_on_rank=pick(mem.params_on_rank), weights=pick(mem.weights),
        gradients=pick(mem.gradients), optimizer=pick(mem.optimizer), activations=pick(mem.activations),
        other=pick(mem.other), capacity=mem.capacity, muon_saving=pick(mem.muon_saving),
        activation_parts=ActivationBytes(pick(a.layers), pick(a.recompute_working), pick(a.embedding), pick(a.output),
                                         pick(a.offloaded), pick(a.cp_workspace), pick(a.stash_transient),
                                         pick(a.indexer_workspace)),
    )


def unique_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of a small-integer matrix and each row's index among them: one integer key per row
    (mixed radix) and a 1-D unique, much faster than np.unique(axis=0)."""
    dims = rows.max(axis=0) + 1
    if float(np.prod(dims.astype(float))) < 2**62:
        keys = np.ravel_multi_index(rows.T, dims)
        _, first, inv = np.unique(keys, return_index=True, return_inverse=True)
        return rows[first], inv.ravel()
    uniq, inv = np.unique(rows, axis=0, return_inverse=True)
    return uniq, inv.ravel()


def fastest(A: np.ndarray, B: np.ndarray, row: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Seconds of one call of `size` bytes per plan by its fastest algorithm: min over algorithms k of A[k, row]
    + size x B[k, row] (`row`: each plan's span among the distinct ones), one algorithm column at a time (no
    plans x algorithms array)."""
    t = None
    for a, b in zip(A, B, strict=True):
        t_k = (a[0] if len(a) == 1 else a[row]) + size * (b[0] if len(b) == 1 else b[row])
        t = t_k if t is None else np.minimum(t, t_k)
    return t if t is not None else np.full(np.shape(size), np.inf)  # no algorithm: never


def comm_seconds_arrays(m: ModelSpec, cluster: ClusterSpec, plans: PlanArrays,
                        order: tuple[str, ...] = DEFAULT_ORDER, known: CommSeconds | None = None) -> CommSeconds:
    """Per-plan communication seconds of each axis (same transfers as cost.comm.step_comm). `known`: these plans'
    seconds under another MoE dispatcher (search.run.DISPATCH_FIELDS): every axis but ep is taken from it, and tp
    too where no plan runs expert TP > 1 (only the alltoall dispatcher gathers over expert TP:
    comm.tp_routed_blocks_per_layer), as no other transfer reads the dispatcher (tests/test_search_deepep.py and
    tests/test_flex_etp.py check them alike)."""
    layout = np.stack([plans.tp, plans.pp, plans.dp, plans.cp, plans.ep, plans.etp_resolved,
                       np.broadcast_to(plans.dp_replicate, np.shape(plans.tp)),
                       np.broadcast_to(cp_a2a_group(plans), np.shape(plans.tp))], axis=1)
    uniq, inv = unique_rows(layout)
    degrees = [Degrees(int(t), int(p), int(d), int(c), int(e), int(x), int(r), int(k))
               for t, p, d, c, e, x, r, k in uniq]
    misfit = next((d for d in degrees if d.num_gpus != cluster.num_gpus), None)
    if misfit is not None:
        place(misfit, cluster, order)  # says why its groups cannot be placed
    dims = [axis_dims(d, order) for d in degrees]
    system = cluster.system
    coeff_cache: dict[tuple[str, str, Any], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    span_index: dict[str, tuple[list, np.ndarray]] = {}

    def spans_of(axis: str) -> tuple[list, np.ndarray]:
        """The distinct spans of an axis over all layouts (a few), and each layout's index among them: what
        placement gives each layout's groups of that axis (topology.placement.place), placed once per
        distinct rank layout of the axis."""
        if axis not in span_index:
            ids: dict[tuple, int] = {}
            idx = np.asarray([ids.setdefault(d[axis], len(ids)) for d in dims], dtype=np.int64)
            span_index[axis] = ([axis_span(axis, cluster.num_gpus, key, cluster) for key in ids], idx)
        return span_index[axis]

    def seconds(op: str, axis: str, calls: Any, message: Any, dispatch: Any = None) -> np.ndarray:
        key = (op, axis, dispatch)
        if key not in coeff_cache:  # cost each distinct (collective, span) once, then gather by layout
            distinct, idx = spans_of(axis)
            per_span = [dispatch_coeffs(op, span, system, dispatch) for span in distinct]
            width = max(len(c) for c in per_span)
            A = np.full((len(distinct), width), np.inf)
            B = np.zeros((len(distinct), width))
            for i, cs in enumerate(per_span):
                for j, c in enumerate(cs):
                    A[i, j], B[i, j] = c.alpha, c.beta
            coeff_cache[key] = np.ascontiguousarray(A.T), np.ascontiguousarray(B.T), idx[inv]
        A, B, row = coeff_cache[key]
        size, calls = np.asarray(message, dtype=float), np.asarray(calls, dtype=float)
        if calls.ndim == 0 and calls <= 0 or size.ndim == 0 and size <= 0:  # no plan makes the call
            return np.zeros(inv.shape)
        size, calls = np.broadcast_to(size, inv.shape), np.broadcast_to(calls, inv.shape)
        sent = (calls > 0) & (size > 0)
        if sent.all():
            return calls * fastest(A, B, row, size)
        out = np.zeros(inv.shape)  # only the plans that make the call: the same values, 0 elsewhere
        at = np.flatnonzero(sent)
        if len(at):
            out[at] = calls[at] * fastest(A, B, row[at], size[at])
        return out

    def copies(x: Any) -> np.ndarray:  # the HBM copies around a call (Transfer.copy_bytes), as transfer_seconds
        calls = np.asarray(x.calls, dtype=float)
        if calls.ndim == 0 and calls <= 0:  # no plan makes the call: no copies around it
            return np.zeros(inv.shape)
        called = np.broadcast_to(calls, inv.shape) > 0
        if not called.any():
            return np.zeros(inv.shape)
        copied = np.broadcast_to(np.asarray(copy_seconds(x, system.gpu), dtype=float), inv.shape)
        return np.where(called, copied, 0.0)

    def total(transfers: list, axis: str | None = None) -> np.ndarray:
        return sum((seconds(x.collective, axis or x.group, x.calls, x.message, x.dispatch) + copies(x)
                    for x in transfers), np.zeros(len(plans)))

    if known is not None:  # the routed experts' expert-TP pair is the alltoall dispatcher's alone (comm.tp)
        tp = total(tp_transfers(m, plans.as_plan, "tp", "etp")) if np.any(np.asarray(plans.etp_resolved) > 1) \
            else known.tp
        return replace(known, tp=tp, ep=total(ep_transfers(m, plans.as_plan, "ep", "tpep")))
    # each candidate stage's rank reduces and gathers its own parameters (docs/formulas.md#step.stage_tail)
    stages = each_stage(candidate_stages(m, plans.as_plan),
                        lambda i: dp_transfers(m, plans.as_plan, "dpcp_in", "edp_in", i, "dpcp_out", "edp_out"))
    dp_stages = each_stage(tuple(stages), lambda x: tuple(map(total, reduce_gather_split(x))))  # repeated: once
    dp = stages[0]
    step_end = total(mxfp8_amax_transfers(m, plans.as_plan, ("dpcp", "dpcp_in"), ("edp", "edp_in"))
                     + torchao_amax_transfers(m, plans.as_plan, "dpcp_in"))
    return CommSeconds(
        tp=total(tp_transfers(m, plans.as_plan, "tp", "etp")),
        tp_step_end=total(tp_step_end_transfers(m, plans.as_plan, "tp")),
        pp=total(pp_transfers(m, plans.as_plan, "pp")),
        cp=total(cp := cp_transfers(m, plans.as_plan, "cp", "cp_a2a", "cp_ring")),
        cp_mixers=total(cp_mixer_split(cp)[1]),
        cp_a2a=total(te_cp_split(cp)[0]),
        cp_allgather=total(te_cp_split(cp)[1]),
        ep=total(ep_transfers(m, plans.as_plan, "ep", "tpep")),
        router=total(aux_loss_transfers(m, plans.as_plan, "tpcp", "tpdpcp")),
        dp_reduce=dp_stages[0][0],
        dp_gather=dp_stages[0][1],
        dp_outer_reduce=total(hsdp_split(dp)[0]), dp_outer_gather=total(hsdp_split(dp)[1]),
        dp_stages=tuple(dp_stages),
        tp_edge_stages=tuple(each_stage(candidate_stages(m, plans.as_plan), lambda i: tuple(
            total(x) for x in tp_edge_transfers(m, plans.as_plan, "tp", i)))),
        host=offload_layer_bytes(m, plans.as_plan) / cluster.system.host_bytes_per_s,
        host_moe_act=moe_layer_offload_bytes(m, plans.as_plan) / cluster.system.host_bytes_per_s,
        host_attn=attention_offload_bytes(m, plans.as_plan) / cluster.system.host_bytes_per_s,
        dp_host=sum((x.calls * x.host_s for x in dp), np.zeros(len(plans))),
        dp_step_end=step_end,
    )


def evaluate(m: ModelSpec, cluster: ClusterSpec, plans: PlanArrays, allowance: MemoryAllowance | None = None,
             order: tuple[str, ...] = DEFAULT_ORDER, memory: TrainingMemory | None = None,
             comm: CommSeconds | None = None) -> Evaluation:
    """Memory, step time and throughput of every plan (arrays), with the cluster's NVLink domain
    (ParallelPlan.nvlink_domain_ranks: search.run.runs_on has set it already; otherwise a copy of the arrays).
    `comm`: the same plans' communication seconds under another MoE dispatcher (comm_seconds_arrays' known)."""
    plans = on_cluster(plans, cluster)
    mem = memory if memory is not None else evaluate_memory(m, cluster, plans, allowance)
    gpu = cluster.system.gpu
    seconds = comm_seconds_arrays(m, cluster, plans, order, known=comm)
    st = step_time(m, plans.as_plan, gpu, seconds)
    return Evaluation(plans, mem, st, throughput(plans.as_plan, gpu, st), seconds)


def take_tree(value: Any, idx: np.ndarray, n: int) -> Any:
    """The elements at `idx` of every per-plan array (first axis of length `n`) in a result (a frozen
    dataclass, tuple or dict of them, field by field); scalars and other values unchanged."""
    if isinstance(value, np.ndarray) and value.ndim and value.shape[0] == n:
        return value[idx]
    if isinstance(value, tuple):
        return tuple(take_tree(v, idx, n) for v in value)
    if isinstance(value, dict):
        return {k: take_tree(v, idx, n) for k, v in value.items()}
    if hasattr(value, "__dataclass_fields__") and not isinstance(value, PlanArrays):
        return type(value)(**{f.name: take_tree(getattr(value, f.name), idx, n) for f in fields(value) if f.init})
    return value


def put_tree(full: Any, sub: Any, at: np.ndarray, n: int) -> Any:
    """`full` (a result over `n` plans) with the plans at `at` replaced by `sub` (the same result over those
    plans), leaf by leaf: a scalar of `full` becomes an array where `sub` differs from it."""
    if isinstance(full, tuple):
        return tuple(put_tree(f, s, at, n) for f, s in zip(full, sub, strict=True))
    if isinstance(full, dict):
        return {k: put_tree(full.get(k, 0.0), sub.get(k, 0.0), at, n) for k in {**full, **sub}}
    if hasattr(full, "__dataclass_fields__") and not isinstance(full, PlanArrays):
        return type(full)(**{f.name: put_tree(getattr(full, f.name), getattr(sub, f.name), at, n)
                             for f in fields(full) if f.init})
    if not isinstance(full, (np.ndarray, float, int, np.number)) or isinstance(full, bool):
        return full
    if not (isinstance(full, np.ndarray) and full.ndim) and not (isinstance(sub, np.ndarray) and sub.ndim) \
            and full == sub:
        return full
    out = np.array(np.broadcast_to(full, (n,) + np.shape(full)[1:]), dtype=np.result_type(full, sub))
    out[at] = sub
    return out
