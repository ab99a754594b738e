"""Search over a cluster of several pools (specs.pools): the best plan of each pool alone (the single-system
search), then the plans that spread over pools, built from the best shapes of the single-system search on
all the cluster's GPUs: pipeline stages placed on pools in consecutive blocks (every order of the pools, the
SPLITS counts of stages per pool nearest the pools' capacity) with the layers split by pool speed, and
data-parallel replicas on every pool with batch shares by speed. Each is priced by llmplan.hetero.estimate_hetero and
ranked by tokens/s."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from llmplan.errors import LlmplanError, PlanViolationError
from llmplan.estimate import TrainingEstimate
from llmplan.hetero import (
    HeteroEstimate,
    estimate_hetero,
    pool_use,
    replica_counts,
    replica_plan,
    stage_counts,
    stage_plan,
)
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ClusterSpec, MemoryAllowance, ParallelPlan
from llmplan.specs.pools import HeteroPlan, PoolCluster
from llmplan.specs.resilience import CheckpointPolicy
from llmplan.topology.placement import DEFAULT_ORDER

SHAPES = 8
"""Distinct plan shapes of the single-system searches that are spread over pools (the best by tokens/s)."""
SPLITS = 4
"""Stage counts per pool order tried for one shape: those nearest to each pool's share of the stages its GPUs
could hold (a pipeline over pools gains most from GPUs it uses; the speed split balances the rest)."""
SPLIT_TRIES = 8
"""Times a stage split that does not fit is retried with one layer fewer on the pools that overflow."""

Searcher = Callable[[ClusterSpec], "list[TrainingEstimate]"]
"""The single-system search of one cluster: its ranked plans (best first), with the command's pins."""


@dataclass
class PoolSearchResult:
    ranked: list[HeteroEstimate]
    considered: int
    """Plans over several pools priced (beside the single-system searches)."""
    feasible: int
    pruned: dict[str, int] = field(default_factory=dict)
    """Plans over several pools cut, per rule (check_pools / check_plan rule names, `memory`, `batch_split`)."""
    alone: dict[str, float] = field(default_factory=dict)
    """Highest tokens/s of the plans of each pool alone the single-system search ranked (0 where none fits)."""
    seconds: float = 0.0


def _shape_key(p: ParallelPlan) -> tuple:
    return (p.tp, p.pp, p.dp, p.cp, p.ep, p.etp, p.sp, p.zero, p.recompute, p.micro_batch)


def search_pools(m: ModelSpec, pc: PoolCluster, run: Searcher, allowance: MemoryAllowance | None = None,
                 order: tuple[str, ...] = DEFAULT_ORDER, checkpoint: CheckpointPolicy | None = None,
                 headroom: Callable[[float], float] = lambda capacity: 0.0, top: int = 5) -> PoolSearchResult:
    """Rank the plans of `pc`: each pool alone (run on the pool), and over pools (shapes from run on a
    cluster of all the GPUs of the fastest pool's system, when its node shape tiles them). `headroom`: the
    free bytes a GPU of that capacity must keep."""
    t0 = time.perf_counter()
    cands: list[HeteroEstimate] = []
    alone: dict[str, float] = {}
    shapes: dict[tuple, ParallelPlan] = {}
    refused: list[LlmplanError] = []
    runs = 0

    def searched(cc: ClusterSpec) -> list[TrainingEstimate]:
        """run(cc); with several pools, a search that no plan passes (e.g. a pinned shape larger than one
        pool, which only a pipeline over pools holds) ranks nothing instead of ending the search."""
        nonlocal runs
        runs += 1
        try:
            return run(cc)
        except LlmplanError as e:
            if len(pc.pools) == 1:
                raise
            refused.append(e)
            return []

    for g, pool in enumerate(pc.pools):
        ranked = searched(pool.cluster)
        alone[pool.name] = max((float(e.throughput.tokens_per_s) for e in ranked), default=0.0)
        for e in ranked:
            hp = HeteroPlan(plan=e.plan, assignment="stages", stage_pools=(g,) * e.plan.pp)
            cands.append(HeteroEstimate(e, hp, (pool_use(pc, g, e, tuple(range(e.plan.pp)), e.plan.dp,
                                                         e.plan.global_batch),)))
    pruned: dict[str, int] = {}
    considered = feasible = 0
    if len(pc.pools) > 1:
        fastest = max(pc.pools, key=lambda p: p.system.gpu.sustained_flops("bf16"))
        per = fastest.system.gpus_per_node
        if pc.num_gpus % per == 0:
            for e in searched(ClusterSpec(system=fastest.system, num_nodes=pc.num_gpus // per)):
                shapes.setdefault(_shape_key(e.plan), e.plan)
        for h in cands:  # the single pools' shapes too, with more replicas
            shapes.setdefault(_shape_key(h.hetero.plan), h.hetero.plan)
        for plan in list(shapes.values())[:SHAPES * (len(pc.pools) + 1)]:
            for hp_or_rule in _assignments(m, pc, plan, allowance, order):
                considered += 1
                if isinstance(hp_or_rule, str):
                    pruned[hp_or_rule] = pruned.get(hp_or_rule, 0) + 1
                    continue
                got = _fitting(m, pc, hp_or_rule, allowance, order, checkpoint, headroom)
                if isinstance(got, str):
                    pruned[got] = pruned.get(got, 0) + 1
                    continue
                feasible += 1
                cands.append(got)
    if refused and len(refused) == runs:  # no search had a plan to rank: the last one's rules say why
        raise refused[-1]
    if len(pc.pools) > 1:  # one pool keeps the single-system search's ranking (search.rank's tie rules)
        cands.sort(key=lambda h: -float(h.estimate.throughput.tokens_per_s))
    out: list[HeteroEstimate] = []
    seen: set = set()
    for h in cands:
        key = (h.hetero.model_dump_json(), round(float(h.estimate.throughput.tokens_per_s), 3))
        if key not in seen:
            seen.add(key)
            out.append(h)
    return PoolSearchResult(out[:top], considered, feasible, pruned, alone, time.perf_counter() - t0)


def _assignments(m: ModelSpec, pc: PoolCluster, plan: ParallelPlan, allowance: MemoryAllowance | None,
                 order: tuple[str, ...]) -> list[HeteroPlan | str]:
    """Every spread of `plan`'s shape over two or more pools (a rule name where one cannot be built)."""
    out: list[HeteroPlan | str] = []
    n = len(pc.pools)
    width = plan.tp * plan.cp * plan.dp
    for k in range(2, n + 1):
        for pools in itertools.permutations(range(n), k):
            room = [pc.pools[g].num_gpus // width for g in pools]
            near = sorted(stage_counts(pc, plan, pools) if plan.pp >= k else (),
                          key=lambda sp: sum(abs(sp.count(g) - plan.pp * r / sum(room))
                                             for g, r in zip(pools, room, strict=True)))
            for stages in near[:SPLITS]:
                try:
                    out.append(stage_plan(m, pc, plan, stages))
                except ValueError:
                    out.append("stage_split")
    reps = replica_counts(pc, plan)
    if sum(1 for r in reps if r) >= 2:
        try:
            hp = replica_plan(m, pc, plan, reps, allowance, order)
            out.append(hp if hp is not None else "batch_split")
        except PlanViolationError as e:
            out.append(e.violations[0].rule)
        except LlmplanError:
            out.append("pool_placement")
    return out


def _fitting(m: ModelSpec, pc: PoolCluster, hp: HeteroPlan, allowance: MemoryAllowance | None,
             order: tuple[str, ...], checkpoint: CheckpointPolicy | None,
             headroom: Callable[[float], float]) -> HeteroEstimate | str:
    """The estimate of hp, its stage split moved off the pools that overflow (one layer fewer per stage there,
    up to SPLIT_TRIES times) until every pool keeps its headroom; else the rule that cut it."""
    for _ in range(SPLIT_TRIES):
        try:
            e = estimate_hetero(m, pc, hp, allowance, order, checkpoint)
        except PlanViolationError as err:
            return err.violations[0].rule
        except LlmplanError:  # a shape the pool's node size cannot place (e.g. part of a node)
            return "pool_placement"
        over = {u.pool for u in e.pools if float(u.memory.capacity - u.memory.total)
                < headroom(float(u.memory.capacity))}
        if not over:
            return e
        if hp.assignment != "stages" or hp.stage_pools is None:
            return "memory"
        caps = [layers - 1 if g in over else m.num_hidden_layers
                for g, layers in zip(hp.stage_pools, e.estimate.stage_layers, strict=True)]
        if min(caps) < 0:
            return "memory"
        try:
            hp = stage_plan(m, pc, hp.plan, hp.stage_pools, caps)
        except ValueError:
            return "memory"
    return "memory"
