"""Hybrid sharding (HSDP) in `search`: the tie pool's rows priced again with their ZeRO shard group kept inside
one NVLink domain and replicated across the domains (ParallelPlan.dp_replicate, dp_outer_optimizer).

dp_replicate is a workload field (every plan of one search holds it), and the values worth trying depend on each
plan's data-parallel span, so the search does not enumerate it: after the settings are searched, each shown row of
the settings that can lead (cli.search.SettingSearch.hybrid_rows) whose ZeRO data-parallel group (dp x cp ranks
beside their TP ranks; pp is the outermost axis, topology.placement) spans more than one NVLink domain is priced
with the most replicas that keep each shard group at least one domain wide and fit the memory, with and without
the optimizer sharded across the replicas (ZeRO-3 only: check rule dp_outer_optimizer); one faster than its row by
more than the tie resolution and written by some target takes the row (search.variants.merge). Gains within the
resolution leave the plain row, as plain wins ties between settings. Megatron-LM parallel_state.py (2a75ac12c)
places the partial groups as contiguous slices of each data-parallel group: shard groups inside a domain,
replicas across (docs/formulas.md#mem.hsdp)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable

from llmplan.estimate import TrainingEstimate
from llmplan.specs.check import divisors
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.topology.placement import domain_ranks

MAX_REPLICA_TRIES = 4
"""Replica counts priced per row and optimizer placement at most, the largest first (each smaller one spreads a
shard group over more domains): the first that fits is kept."""


@dataclass(frozen=True)
class HybridTry:
    """One hybrid-sharding variant priced for a shown row."""

    rank: int
    """The row (1-based, in the setting's ranking before the pass) it varies."""
    dp_replicate: int
    """Replicas of the shard group (ParallelPlan.dp_replicate)."""
    dp_outer_optimizer: bool
    """Whether the optimizer is sharded across the replicas too (ParallelPlan.dp_outer_optimizer)."""
    tokens_per_s: float
    """Its predicted tokens/s (0 where it did not fit)."""
    row_tokens_per_s: float
    """The row's tokens/s without hybrid sharding."""
    outcome: str
    """"shown" (it took its layout's row: faster beyond the tie resolution), "within resolution" (faster, but not by
    more than the resolution: the plain row stands, as plain wins ties between settings), "slower", "no fit" (no
    replica count tried keeps the rules and fits with the headroom asked for), "not exported" (faster beyond the
    resolution, but no target writes it), or "dp hidden" (not priced: saving all of the row's exposed
    data-parallel time would not gain the resolution, or not bring the row level with #1; tokens_per_s 0)."""


@dataclass(frozen=True)
class HybridChoice:
    """What the hybrid-sharding pass tried on the shown setting's rows, and whether #1 runs it."""

    tried: tuple[HybridTry, ...]
    first: tuple[int, bool] | None
    """#1's (dp_replicate, dp_outer_optimizer) where it runs hybrid sharding, else None."""


def domain_span(plan: ParallelPlan, cluster: ClusterSpec) -> tuple[int, int]:
    """(GPUs one ZeRO data-parallel group spans with its TP and CP ranks, GPUs of one NVLink domain): dp strides
    over tp x cp and pp is the outermost axis (topology.placement DEFAULT_ORDER), so one stage's data-parallel
    ranks lie on tp x cp x dp consecutive GPUs; the domain as the job fills it (topology.placement.domain_ranks)."""
    return plan.tp * plan.cp * plan.dp, domain_ranks(cluster)


def replica_counts(plan: ParallelPlan, cluster: ClusterSpec) -> list[int]:
    """The dp_replicate values worth pricing for `plan`, largest first: none where it runs no ZeRO (nothing to
    shard: check rule dp_replicate_zero), already replicates, or its data-parallel group fits one NVLink domain
    (its gathers already run there); else each r > 1 up to the domains the group spans (so that a shard group is
    at least a domain wide) that divides dp and the expert data-parallel degree (check rule dp_replicate_divides)
    and leaves at least two ranks to shard over, at most MAX_REPLICA_TRIES of them."""
    span, domain = domain_span(plan, cluster)
    if plan.zero < 1 or plan.dp_replicate > 1 or span <= domain:
        return []
    most = span // domain
    out = [r for r in divisors(math.gcd(plan.dp, plan.expert_dp))
           if 1 < r <= most and plan.dp * plan.cp // r >= 2]
    return sorted(out, reverse=True)[:MAX_REPLICA_TRIES]


def variants_of_row(plan: ParallelPlan, cluster: ClusterSpec) -> list[list[ParallelPlan]]:
    """Per optimizer placement (across the replicas first, ZeRO-3 only; then within the shard group), the row's
    hybrid plans in replica_counts' order."""
    counts = replica_counts(plan, cluster)
    if not counts:
        return []
    outer = (True, False) if plan.zero == 3 else (False,)
    return [[plan.model_copy(update={"dp_replicate": r, "dp_outer_optimizer": o}) for r in counts] for o in outer]


def hybrid_pass(res: Any, cluster: ClusterSpec, price: Callable[[ParallelPlan], Any],
                writes: Callable[[TrainingEstimate], bool], pool: int) -> tuple[Any, list[HybridTry]]:
    """`res` (search.run.SearchResult) with each ranked row's hybrid variants (variants_of_row: per optimizer
    placement the first that fits; `price`: its estimate, or None where it breaks a rule or does not fit) that
    score above the row by more than the tie resolution and are written (`writes`) merged into its layout
    (search.variants.merge: it takes the row) and the rows ranked again (search.layouts.rank, `pool` kept), and
    what was tried (HybridTry). Hybrid sharding moves only data-parallel traffic (and enlarges the shards a rank
    copies and updates), so it can save at most the row's exposed data-parallel time: a row where that is too
    little to gain the resolution, or to come level with #1, is not priced. Not under the headroom objective
    (smaller shard groups never free memory)."""
    from llmplan.search.layouts import rank, score
    from llmplan.search.variants import Group, merge

    tried: list[HybridTry] = []
    extra: dict[int, TrainingEstimate] = {}  # index in `tried` -> the estimate merged
    if res.objective == "headroom" or res.resolution is None or not res.ranked:
        return res, tried
    gain = math.exp(res.resolution)
    floor = score(res.ranked[0], res.objective) / gain
    for k, e in enumerate(res.ranked, start=1):
        base, row = float(e.throughput.tokens_per_s), score(e, res.objective)
        bound = 1 / max(1e-9, 1 - float(e.time.exposed["dp"]) / float(e.time.total))  # all exposed DP time saved
        hidden = bound <= gain or row * bound < floor
        for chain in variants_of_row(e.plan, cluster):
            if hidden:
                tried.append(HybridTry(k, chain[0].dp_replicate, chain[0].dp_outer_optimizer, 0.0, base, "dp hidden"))
                continue
            got = next((x for x in map(price, chain) if x is not None), None)
            if got is None:
                tried.append(HybridTry(k, chain[0].dp_replicate, chain[0].dp_outer_optimizer, 0.0, base, "no fit"))
                continue
            s = score(got, res.objective)
            outcome = ("slower" if s <= row else "within resolution" if s <= row * gain else
                       "not shown" if writes(got) else "not exported")
            if outcome == "not shown":
                extra[len(tried)] = got
            tried.append(HybridTry(k, got.plan.dp_replicate, got.plan.dp_outer_optimizer,
                                   float(got.throughput.tokens_per_s), base, outcome))
    if not extra:
        return res, tried
    groups = [Group(e, n, v) for e, n, v in zip(res.ranked, res.equivalents, res.variants, strict=True)]
    groups = merge(groups, list(extra.values()), lambda x: score(x, res.objective), res.resolution)
    out = rank(dataclasses.replace(res, ranked=[g.estimate for g in groups],
                                   equivalents=[g.equivalents for g in groups], variants=[g.variants for g in groups]),
               pool)
    shown = {id(x) for x in out.ranked}
    return out, [dataclasses.replace(t, outcome="shown") if j in extra and id(extra[j]) in shown else t
                 for j, t in enumerate(tried)]
