"""Serving on a cluster of several pools (specs.pools.PoolCluster, issue 37):

- disaggregated (`search --mode infer --disaggregated --hardware cluster.yaml`): every assignment of the two
  phases to pools (prefill on pool i, decode on pool j, i = j allowed), each phase's instances priced on its
  own pool's GPU (search.disagg), the KV cache sent over the inter-pool fabric when i != j;
- co-located (`search --mode infer --hardware cluster.yaml`): each pool's best replica layout (its own shape,
  search.serve on the pool alone), the request rate split over the pools in proportion to their capacity under
  the SLOs.

A cluster of one pool gives exactly the single-system searches' plans (tests)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from llmplan.cost.hetero import cross_pool_kv_seconds
from llmplan.search.disagg import (
    DisaggPlan,
    Pool,
    best_split,
    instance_plans,
    kv_shards,
    kv_transfer,
    moe_plans,
    price_decode,
    price_prefill,
    queued_split,
    refuse_speculation,
)
from llmplan.errors import LlmplanError
from llmplan.search.serve import (ServeSearchResult, pinned_ep_refusal, refuse_dp_attention, refuse_no_layout,
                                  search_serving, sub_cluster)
from llmplan.serving import ServeEstimate, estimate_serving
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import MemoryAllowance
from llmplan.specs.pools import PoolCluster
from llmplan.specs.serve import KvDtype, ServeJob, WeightDtype

INTER_POOL = "inter-pool fabric"
"""The kv_link of a split whose phases sit on different pools."""


@dataclass(frozen=True)
class PoolDisaggPlan:
    """A prefill / decode split whose phases sit on pools prefill_pool and decode_pool (equal: one pool)."""

    split: DisaggPlan
    prefill_pool: int
    """Index into PoolCluster.pools of the pool holding the prefill instances."""
    decode_pool: int
    """Index into PoolCluster.pools of the pool holding the decode instances."""
    max_requests_per_s: float
    """Requests/s these two instance layouts sustain on every GPU the assignment may use (both pools' GPUs,
    or the one pool's split at its best P:D)."""


@dataclass(frozen=True)
class PoolDisaggResult:
    plans: list[PoolDisaggPlan]
    colocated: PoolServeResult
    """The co-located search over the same pools, for comparison."""
    considered: int
    """Instance layouts priced, over every pool."""
    seconds: float
    winner: str
    why: str


@dataclass(frozen=True)
class PoolShare:
    """One pool's part of a co-located deployment over pools: its best replica layout and its request share."""

    pool: int
    estimate: ServeEstimate
    """The pool's plan with the copies it runs (plan.copies: replicas, or DP-attention servers) at their batch."""
    capacity_requests_per_s: float
    """Requests/s of every replica the pool holds, at the largest concurrency meeting the SLOs."""
    requests_per_s: float
    """The pool's share of the request rate (its capacity without a rate)."""

    @property
    def gpus(self) -> int:
        return self.estimate.plan.num_gpus


@dataclass(frozen=True)
class PoolServeResult:
    shares: list[PoolShare]
    """Pools that serve, in the cluster's order (empty when none can, or the rate exceeds their capacity)."""
    per_pool: list[ServeSearchResult]
    """Each pool's own search (the pool alone), in the cluster's order."""
    request_rate: float | None
    capacity_requests_per_s: float
    """Requests/s every pool's best layout sustains on all its GPUs, together."""
    seconds: float

    @property
    def gpus(self) -> int:
        return sum(s.gpus for s in self.shares)

    @property
    def tokens_per_s(self) -> float:
        """Output tokens/s of the deployment at its request rate (at capacity without one)."""
        return sum(s.requests_per_s * s.estimate.job.output_len for s in self.shares)


def rate_shares(rate: float, capacities: list[float]) -> list[float]:
    """The request rate split in proportion to each pool's capacity (every pool equally loaded).
    Derived: docs/formulas.md#serve.pools"""
    total = sum(capacities)
    return [rate * c / total for c in capacities]


def search_colocated_pools(m: ModelSpec, pc: PoolCluster, job: ServeJob, weight_dtype: WeightDtype,
                           kv_dtype: KvDtype, request_rate: float | None = None,
                           allowance: MemoryAllowance | None = None, pins: dict | None = None,
                           moe: dict | None = None) -> PoolServeResult:
    """Each pool's best layout by output tokens/s per GPU (search.serve on the pool alone: its own TP / PP / EP
    shape on its own GPU, under the MoE serving options given, `moe`, as the one-system search applies them), the
    rate split over the pools in proportion to their capacity (rate_shares), each
    pool running the fewest replicas of its layout that carry its share. Without a rate every replica of every
    pool serves. A rate above the pools' total capacity gives no shares."""
    t0 = time.perf_counter()
    refuse_pools_dp_attention(m, pc, pins or {}, moe or {})
    per_pool = [search_serving(m, p.cluster, job, weight_dtype, kv_dtype, "throughput", 5, None, allowance, pins, moe,
                               refuse_pins=False) for p in pc.pools]
    best = [(g, r.ranked[0]) for g, r in enumerate(per_pool) if r.ranked]
    if not any(r.considered for r in per_pool):  # the pins leave no pool a layout: as on one system, refused
        refuse_no_layout(m, max((p.cluster for p in pc.pools), key=lambda c: c.num_gpus), pins or {},
                         "the largest pool")
    refuse_pinned_ep(m, pc, job, weight_dtype, kv_dtype, pins or {}, moe, bool(best))
    caps = [e.tokens_per_s / e.job.output_len for _, e in best]
    total = sum(caps)
    shares: list[PoolShare] = []
    if best and (request_rate is None or request_rate <= total):
        rates = caps if request_rate is None else rate_shares(request_rate, caps)
        for (g, e), cap, r in zip(best, caps, rates, strict=True):
            per_replica = cap / e.plan.copies  # a replica, or a DP-attention server of ep GPUs
            replicas = e.plan.copies if request_rate is None else min(e.plan.copies, max(1, math.ceil(
                r / per_replica - 1e-12)))
            est = e if replicas == e.plan.copies else resized(e, replicas, allowance)
            shares.append(PoolShare(g, est, cap, r))
    return PoolServeResult(shares, per_pool, request_rate, total, time.perf_counter() - t0)


def refuse_pinned_ep(m: ModelSpec, pc: PoolCluster, job: ServeJob, weight_dtype: WeightDtype, kv_dtype: KvDtype,
                     pins: dict, moe: dict | None, served: bool) -> None:
    """A pinned --ep that no layout of any pool takes is refused (search.serve.pinned_ep_refusal, each pool's
    reason named); where one pool takes it the others only serve nothing."""
    if served or not pins.get("ep"):
        return
    why = [pinned_ep_refusal(m, p.cluster, job, pins, weight_dtype, kv_dtype, moe) for p in pc.pools]
    if all(w is not None for w in why):
        if len(set(why)) == 1:
            raise LlmplanError(f"pools {', '.join(p.name for p in pc.pools)}: {why[0]}")
        raise LlmplanError(" | ".join(f"pool {p.name}: {w}" for p, w in zip(pc.pools, why, strict=True)))


def refuse_pools_dp_attention(m: ModelSpec, pc: PoolCluster, pins: dict, moe: dict) -> None:
    """--dp-attention follows a pinned --ep over pools: each pool takes it as its system alone would
    (search.serve.refuse_dp_attention), a pool with no DP-attention layout serves nothing (its search's
    `refusal` says why), and the search is refused only when no pool has one, naming every pool and its reason.
    The disaggregated search applies the same rule to its instances: a role (prefill or decode) needs a pool
    with a DP-attention layout, and both roles may sit on any pool that has one."""
    why: dict[str, list[str]] = {}
    for p in pc.pools:
        try:
            refuse_dp_attention(m, p.cluster, pins, moe)
        except LlmplanError as e:
            why.setdefault(str(e), []).append(f"{p.name} ({p.nodes} x {p.system.name}, {p.num_gpus} GPUs)")
    if sum(len(ps) for ps in why.values()) == len(pc.pools):
        raise LlmplanError(" | ".join(f"pool{'s' * (len(ps) > 1)} {', '.join(ps)}: {w}" for w, ps in why.items()))


def resized(e: ServeEstimate, replicas: int, allowance: MemoryAllowance | None) -> ServeEstimate:
    """The estimate with at least `replicas` copies of its layout (replicas; DP-attention servers of ep GPUs),
    rounded up to fill whole nodes when they take more than one (as the single-system search's sub-clusters),
    re-estimated on those GPUs."""
    gpn, gpr = e.cluster.gpus_per_node_used, e.plan.gpus_per_copy
    if replicas * gpr > gpn:
        replicas = min(e.plan.copies, math.ceil(replicas * gpr / gpn) * gpn // gpr)
    plan = e.plan.model_copy(update={"dp": replicas * e.plan.attn_dp})
    sub = sub_cluster(e.cluster, plan.num_gpus)
    return e if sub.num_gpus != plan.num_gpus else estimate_serving(e.model, sub, plan, e.job, allowance)


def max_rate(p: Pool, d: Pool, new_input: float, output_len: int, gpus_p: int, gpus_d: int | None) -> float:
    """Requests/s one prefill layout and one decode layout sustain: on two pools (gpus_d given) every instance
    of each, the smaller of the two rates; on one pool of gpus_p GPUs, the best split of it.
    Derived: docs/formulas.md#serve.pools"""
    req_p, req_d = p.requests_per_s(new_input), d.requests_per_s(output_len)
    if gpus_d is not None:
        return min(gpus_p // p.gpus_per_instance * req_p, gpus_d // d.gpus_per_instance * req_d)
    return max((min(x * req_p, (gpus_p - x * p.gpus_per_instance) // d.gpus_per_instance * req_d)
                for x in range(1, gpus_p // p.gpus_per_instance + 1)), default=0.0)


def split_across(p: Pool, d: Pool, gpus_p: int, gpus_d: int, new_input: float, output_len: int,
                 rate: float | None) -> tuple[int, int] | None:
    """(prefill instances on one pool, decode instances on another): with a rate, the fewest of each that
    sustain it within each pool's GPUs; otherwise the split whose smaller rate is largest per GPU used (for
    each prefill count, the decode counts either side of the balance)."""
    gp, gd = p.gpus_per_instance, d.gpus_per_instance
    req_p, req_d = p.requests_per_s(new_input), d.requests_per_s(output_len)
    if rate is not None:
        x, y = math.ceil(rate / req_p), math.ceil(rate / req_d)
        return (x, y) if x * gp <= gpus_p and y * gd <= gpus_d else None
    best, out = 0.0, None
    for x in range(1, gpus_p // gp + 1):
        even = x * req_p / req_d
        for y in {max(1, min(gpus_d // gd, math.floor(even))), max(1, min(gpus_d // gd, math.ceil(even)))}:
            if y * gd > gpus_d:
                continue
            per_gpu = min(x * req_p, y * req_d) / (x * gp + y * gd)
            if per_gpu > best or (per_gpu == best and out is not None and (x, y) < out):
                best, out = per_gpu, (x, y)
    return out


def search_disaggregated_pools(m: ModelSpec, pc: PoolCluster, job: ServeJob, weight_dtype: WeightDtype,
                               kv_dtype: KvDtype, top: int = 5, request_rate: float | None = None,
                               allowance: MemoryAllowance | None = None, moe: dict | None = None) -> PoolDisaggResult:
    """Every assignment (prefill pool i, decode pool j) and every pair of instance layouts priced on those
    pools' GPUs: on one pool (i = j) exactly search.disagg's pairing, P:D split and KV transfer; on two, each
    phase within its own pool's GPUs (split_across) and the KV cache over the fabric (cross_pool_kv_seconds),
    TTFT (prefill + KV transfer) and TPOT within the SLOs. Ranked as search.disagg ranks: output tokens/s per
    GPU, or with a request rate the fewest GPUs; compared with the co-located search over the same pools. A
    job whose speculation no layout can run is refused up front, as search.disagg refuses it (refuse_speculation).
    `moe`: the MoE serving options given, applied to every pool's instance layouts and to the co-located search
    as search.disagg applies them (moe_plans)."""
    refuse_speculation(m, job)
    refuse_pools_dp_attention(m, pc, {}, moe or {})
    t0 = time.perf_counter()
    rated, job = job, job.model_copy(update={"request_rate": None})  # instances priced idle; the queue per split
    prefills = [[e for e in (price_prefill(m, p.cluster, x, job, allowance)
                             for x in moe_plans(m, instance_plans(m, p.cluster, weight_dtype, kv_dtype, "prefill",
                                                        len(pc.pools) > 1), moe))
                  if e is not None]
                for p in pc.pools]
    decodes = [[e for e in (price_decode(m, p.cluster, x, job, allowance)
                            for x in moe_plans(m, instance_plans(m, p.cluster, weight_dtype, kv_dtype, "decode",
                                                        len(pc.pools) > 1), moe))
                 if e is not None]
               for p in pc.pools]
    new_input = max(job.uncached_input, 1.0)
    plans: list[PoolDisaggPlan] = []
    for i, pi in enumerate(pc.pools):
        for j, pj in enumerate(pc.pools):
            for ep_ in prefills[i]:
                if i == j:
                    size, kv_s, link = kv_transfer(m, pi.cluster, ep_.plan, job)
                else:
                    size, link = kv_transfer(m, pi.cluster, ep_.plan, job)[0], INTER_POOL
                    kv_s = cross_pool_kv_seconds(size, kv_shards(m, ep_.plan), pc.fabric)
                ttft = float(ep_.phase.ttft_s or 0.0) + kv_s  # type: ignore[union-attr]  # prefill has a phase
                if job.ttft_slo_s is not None and ttft > job.ttft_slo_s:
                    continue
                for ed in decodes[j]:
                    p, d = Pool(ep_, 1), Pool(ed, 1)
                    split = (best_split(p, d, pi.num_gpus, new_input, job.output_len, request_rate) if i == j else
                             split_across(p, d, pi.num_gpus, pj.num_gpus, new_input, job.output_len, request_rate))
                    if split is None:
                        continue
                    top_rate = max_rate(p, d, new_input, job.output_len, pi.num_gpus, None if i == j else pj.num_gpus)
                    # the prefill queue as search.disagg prices it; on its own pool, prefill has that pool's GPUs
                    x, wait = queued_split(m, ep_, split, d.gpus_per_instance if i == j else 0, pi.num_gpus, job,
                                           ttft, request_rate)
                    if x is None:
                        continue
                    p, d = Pool(ep_, x), Pool(ed, split[1])
                    req = min(p.rate_per_gpu * p.gpus / new_input, d.rate_per_gpu * d.gpus / job.output_len)
                    plans.append(PoolDisaggPlan(DisaggPlan(p, d, size, kv_s, link, req, job.output_len, wait), i, j,
                                                top_rate))
    if request_rate is not None:
        plans.sort(key=lambda x: (x.split.gpus, -x.split.tokens_per_s))
    else:
        plans.sort(key=lambda x: -x.split.tokens_per_s / x.split.gpus)
    co = search_colocated_pools(m, pc, rated, weight_dtype, kv_dtype, request_rate, allowance, moe=moe)
    winner, why = pools_verdict(plans[0] if plans else None, co)
    considered = sum(len(x) for x in prefills) + sum(len(x) for x in decodes)
    return PoolDisaggResult(plans[:top], co, considered, time.perf_counter() - t0, winner, why)


def pools_verdict(best: PoolDisaggPlan | None, co: PoolServeResult) -> tuple[str, str]:
    """Which wins on output tokens/s per GPU used, and why in one sentence."""
    if best is None and not co.shares:
        return "none", "no disaggregated split and no co-located plan fits and meets the SLOs on these pools"
    if best is None:
        return "co-located", "no prefill / decode assignment to these pools fits and meets the SLOs"
    if not co.shares:
        return "disaggregated", "no co-located plan over the pools meets the SLOs (and the rate)"
    d, c = best.split.tokens_per_s / best.split.gpus, co.tokens_per_s / co.gpus
    if d >= c:
        return "disaggregated", f"{d / c:.2f}x the co-located output tokens/s per GPU over the pools"
    return "co-located", f"{c / d:.2f}x the disaggregated output tokens/s per GPU over the pools"
