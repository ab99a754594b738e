"""The disaggregated serving search (`search --mode infer --disaggregated`): a prefill pool and a decode pool,
each of identical instances with its own layout, split over a GPU budget (the P:D ratio) so that prefill's
request rate matches decode's, under the TTFT / TPOT SLOs, with the KV cache sent from prefill to decode;
compared with the best co-located plan on the same GPUs."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from llmplan.cost.inference import job_tpot, kv_bytes_per_token, serve_memory, slo_met
from llmplan.cost.queueing import prefill_queue_seconds
from llmplan.search.serve import refuse_speculation, search_serving, sub_cluster, wide_ep_sizes, with_moe_options
from llmplan.serving import ServeEstimate, estimate_serving, job_for_plan, loaded_model, replica_spans, slo_batch_of
from llmplan.specs.check import check_serve_plan, engine_capped, valid_tp
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ClusterSpec, MemoryAllowance
from llmplan.specs.serve import KvDtype, Phase, ServeJob, ServePlan, WeightDtype
from llmplan.topology.collectives import collective_time
from llmplan.topology.placement import span_of_ranks

REDUNDANT_CHOICES = (0, 32)
"""EPLB redundant experts tried for a wide-EP instance whose GPUs do not divide the experts (DeepSeek's and
SGLang's 32: 256 + 32 = 288 experts over EP 72 or 144)."""


@dataclass(frozen=True)
class Pool:
    """One phase's instances: the layout of one instance, priced at its load point."""

    estimate: ServeEstimate
    """One instance (its plan, sub-cluster and phase timing)."""
    instances: int

    @property
    def gpus_per_instance(self) -> int:
        return self.estimate.plan.num_gpus

    @property
    def gpus(self) -> int:
        return self.instances * self.gpus_per_instance

    @property
    def rate_per_gpu(self) -> float:
        """Input tokens/s per GPU (prefill) or output tokens/s per GPU (decode)."""
        ph = self.estimate.phase
        assert ph is not None
        return ph.input_tokens_per_s_per_gpu if ph.phase == "prefill" else ph.output_tokens_per_s_per_gpu

    def requests_per_s(self, tokens_per_request: float) -> float:
        """Requests/s one instance sustains when each brings `tokens_per_request` tokens of its phase (the
        uncached prompt for prefill, the output for decode)."""
        return self.rate_per_gpu * self.gpus_per_instance / tokens_per_request


@dataclass(frozen=True)
class DisaggPlan:
    prefill: Pool
    decode: Pool
    kv_bytes_per_request: float
    kv_seconds: float
    """Time to send one request's KV cache from its prefill rank(s) to the decode pool."""
    kv_link: str
    requests_per_s: float
    """What the split sustains: the smaller of the pools' request rates."""
    output_len: int
    queue_s: float = 0.0
    """Mean wait before prefill at the request rate asked (cost.queueing; 0 without one: an idle pool)."""

    @property
    def gpus(self) -> int:
        return self.prefill.gpus + self.decode.gpus

    @property
    def tokens_per_s(self) -> float:
        return self.requests_per_s * self.output_len

    @property
    def ttft_s(self) -> float:
        """Queueing before prefill (with a request rate), prefill TTFT and the KV transfer."""
        ph = self.prefill.estimate.phase
        return self.queue_s + (float(ph.ttft_s or 0.0) if ph is not None else 0.0) + self.kv_seconds

    @property
    def tpot_s(self) -> float:
        return float(self.decode.estimate.phase.tpot_s or 0.0)  # type: ignore[union-attr]


@dataclass(frozen=True)
class DisaggResult:
    plans: list[DisaggPlan]
    colocated: ServeEstimate | None
    considered: int
    """Instance layouts priced (each for the phases it could serve)."""
    seconds: float
    winner: str
    why: str


def instance_plans(m: ModelSpec, cluster: ClusterSpec, weight_dtype: WeightDtype, kv_dtype: KvDtype,
                   phase: Phase, other_pool: bool = False) -> list[ServePlan]:
    """One instance's candidate layouts for `phase`: TP instances inside the NVLink domain (EP over their TP
    ranks or not, for MoE) and, for MoE, DP-attention wide-EP instances of the co-located search's sizes
    (search.serve.wide_ep_sizes: even shares of a node, whole nodes, doubling, and the whole pool; SGLang
    --base-gpu-id / --nnodes, vLLM's DP over nodes) with DeepEP, two-batch overlap when the group leaves the NVLink
    domain, and EPLB's redundant experts
    where the GPUs do not divide the experts. A DP-attention instance leaves the other phase at least one GPU
    of the pool unless `other_pool` (the other phase may sit on another pool of a PoolCluster), when it may
    take the whole pool."""
    n, dom = cluster.num_gpus, cluster.system.domain_gpus
    out = []
    for tp in valid_tp(m, min(n, dom)):
        for ep in ([1, tp] if m.is_moe and tp > 1 else [1]):
            out.append(ServePlan(tp=tp, ep=ep, phase=phase, weight_dtype=weight_dtype, kv_dtype=kv_dtype))
    for g in (wide_ep_sizes(cluster) if m.is_moe else []):
        red = next((r for r in REDUNDANT_CHOICES if (m.num_experts + r) % g == 0), None)
        if red is not None and (other_pool or g <= n - 1):
            out.append(ServePlan(tp=1, dp=g, ep=g, phase=phase, dp_attention=True, moe_dispatcher="deepep",
                                 two_batch_overlap=g > dom, redundant_experts=red, weight_dtype=weight_dtype,
                                 kv_dtype=kv_dtype))
    return out


def moe_plans(m: ModelSpec, plans: list[ServePlan], moe: dict | None) -> list[ServePlan]:
    """The instance layouts under the MoE serving options given (search.serve.with_moe_options)."""
    return [q for q in (with_moe_options(m, p, moe) for p in plans) if q is not None]


def price_prefill(m: ModelSpec, cluster: ClusterSpec, plan: ServePlan, job: ServeJob,
                  allowance: MemoryAllowance | None) -> ServeEstimate | None:
    """A prefill instance at one prompt per replica in flight (its batch of T tokens), or None when it breaks a
    rule or does not fit."""
    sub = sub_cluster(cluster, plan.num_gpus)
    one = job.model_copy(update={"batch": 1})
    if sub.num_gpus != plan.num_gpus or check_serve_plan(m, plan, one, sub):
        return None
    e = estimate_serving(m, sub, plan, one, allowance)
    return e if e.memory.fits else None


def price_decode(m: ModelSpec, cluster: ClusterSpec, plan: ServePlan, job: ServeJob,
                 allowance: MemoryAllowance | None) -> ServeEstimate | None:
    """A decode instance at the most sequences per replica its KV cache admits (at most job.batch) whose TPOT
    meets the SLO; None when not one does, or the layout breaks a rule. TPOT and KV capacity are the job's
    (job_tpot, serve_memory): under speculative decoding the speculative step and the draft's weights and KV,
    as serve.phase prices the chosen batch."""
    sub, job = sub_cluster(cluster, plan.num_gpus), engine_capped(job)
    if sub.num_gpus != plan.num_gpus or check_serve_plan(m, plan, job, sub):
        return None
    lm, job = loaded_model(m, job), job_for_plan(m, job, plan, cluster.system)  # the sizes estimate_serving prices
    limit = min(job.batch, serve_memory(lm, plan, job, cluster.system.gpu.hbm_bytes, allowance).max_concurrent_seqs)
    if limit < 1:
        return None
    grid, spans = np.unique(np.round(np.geomspace(1, limit, 48))).astype(float), replica_spans(plan, sub)
    tpot = np.asarray(job_tpot(lm, plan, cluster.system, spans, job, grid, job.input_len + job.output_len / 2))
    ok = slo_met(job, None, tpot)
    if not ok.any():
        return None
    order = grid[ok][np.argsort(-(grid / tpot)[ok], kind="stable")]  # the most sequences per TPOT first
    best = slo_batch_of(lm, job, plan, plan, cluster.system, spans, order, ttft=False)
    if best < 1:
        return None
    e = estimate_serving(m, sub, plan, job.model_copy(update={"batch": best}), allowance)
    return e if e.memory.fits else None


def kv_transfer(m: ModelSpec, cluster: ClusterSpec, plan: ServePlan, job: ServeJob) -> tuple[float, float, str]:
    """(bytes, seconds, link) of one request's KV cache from the prefill pool to the decode pool: the whole
    model's KV of its prompt; sent over NVLink when both pools fit in one NVLink domain, else over the
    network (a point-to-point send between nodes); the ranks holding distinct shards (TP ranks of distinct KV
    heads; one rank for MLA's replicated latent or DP attention) send in parallel.
    Derived: docs/formulas.md#serve.disagg"""
    size = float(kv_bytes_per_token(m, plan.kv_dtype)) * job.input_len
    gpn = cluster.gpus_per_node_used
    inside = cluster.num_gpus <= cluster.system.domain_gpus
    span = span_of_ranks([0, 1] if inside or cluster.num_gpus <= gpn else [0, gpn], cluster)
    shards = kv_shards(m, plan)
    seconds = collective_time("send-recv", size / shards, span, cluster.system).seconds
    return size, seconds, "NVLink" if not span.uses_nic else "network"


def kv_shards(m: ModelSpec, plan: ServePlan) -> int:
    """Ranks of a prefill instance holding distinct shards of a request's KV cache, which send in parallel: one
    for MLA's replicated latent or DP attention, min(tp, KV heads) otherwise. Derived: docs/formulas.md#serve.disagg"""
    return 1 if (m.is_mla or plan.dp_attention) else min(plan.tp, m.kv_heads)


def best_split(p: Pool, d: Pool, budget: int, new_input: float, output_len: int,
               rate: float | None) -> tuple[int, int] | None:
    """(prefill instances, decode instances) within `budget` GPUs: with a request rate, the fewest GPUs that
    sustain it; otherwise the split whose smaller pool rate is largest per GPU used."""
    gp, gd = p.gpus_per_instance, d.gpus_per_instance
    req_p, req_d = p.requests_per_s(new_input), d.requests_per_s(output_len)
    if rate is not None:
        x, y = math.ceil(rate / req_p), math.ceil(rate / req_d)
        return (x, y) if x * gp + y * gd <= budget else None
    best, out = 0.0, None
    for x in range(1, budget // gp + 1):
        y = (budget - x * gp) // gd
        if y < 1:
            break
        per_gpu = min(x * req_p, y * req_d) / (x * gp + y * gd)
        if per_gpu > best:
            best, out = per_gpu, (x, y)
    return out


def queued_split(m: ModelSpec, e: ServeEstimate, split: tuple[int, int], decode_gpus: int, budget: int,
                 job: ServeJob, idle_ttft: float, rate: float | None) -> tuple[int | None, float]:
    """(prefill instances, mean queueing wait) of a split at the request rate: each prefill replica is an
    M/G/1 server of rate / (instances x replicas) requests/s (cost.queueing); instances are added, within
    the GPU budget, until the queue is stable and the queued TTFT meets the SLO (None when none does).
    Without a rate: no queue."""
    if rate is None:
        return split[0], 0.0
    x, lm, spans = split[0], loaded_model(m, job), replica_spans(e.plan, e.cluster)
    while x * e.plan.num_gpus + split[1] * decode_gpus <= budget:
        wait = prefill_queue_seconds(lm, e.plan, e.cluster.system, spans, job, rate / (x * e.plan.dp))
        if math.isfinite(wait) and (job.ttft_slo_s is None or idle_ttft + wait <= job.ttft_slo_s):
            return x, wait
        x += 1
    return None, 0.0


def search_disaggregated(m: ModelSpec, cluster: ClusterSpec, job: ServeJob, weight_dtype: WeightDtype,
                         kv_dtype: KvDtype, top: int = 5, request_rate: float | None = None,
                         allowance: MemoryAllowance | None = None, moe: dict | None = None) -> DisaggResult:
    """Every pair of a prefill instance layout and a decode instance layout, split over the GPUs (best_split),
    TTFT (prefill + KV transfer) and TPOT within the SLOs, ranked by output tokens/s per GPU (or, with a
    request rate, by the fewest GPUs); and the best co-located plan on the same GPUs for comparison. A job
    whose speculative decoding no layout can run (check.speculative_violations: MTP without MTP layers, no
    acceptance rate, a draft of another vocabulary) is refused up front (refuse_speculation)."""
    refuse_speculation(m, job)
    t0 = time.perf_counter()
    rated, job = job, job.model_copy(update={"request_rate": None})  # instances priced idle; the queue per split
    plans_of = {ph: moe_plans(m, instance_plans(m, cluster, weight_dtype, kv_dtype, ph), moe)
                for ph in ("prefill", "decode")}
    prefills = [e for e in (price_prefill(m, cluster, p, job, allowance) for p in plans_of["prefill"]) if e is not None]
    decodes = [e for e in (price_decode(m, cluster, p, job, allowance) for p in plans_of["decode"]) if e is not None]
    new_input = max(job.uncached_input, 1.0)
    plans = []
    for ep_ in prefills:
        size, kv_s, link = kv_transfer(m, cluster, ep_.plan, job)
        ttft = float(ep_.phase.ttft_s or 0.0) + kv_s  # type: ignore[union-attr]
        if job.ttft_slo_s is not None and ttft > job.ttft_slo_s:
            continue
        for ed in decodes:
            p, d = Pool(ep_, 1), Pool(ed, 1)
            split = best_split(p, d, cluster.num_gpus, new_input, job.output_len, request_rate)
            if split is None:
                continue
            x, wait = queued_split(m, ep_, split, d.gpus_per_instance, cluster.num_gpus, job, ttft, request_rate)
            if x is None:
                continue
            p, d = Pool(ep_, x), Pool(ed, split[1])
            req = min(p.rate_per_gpu * p.gpus / new_input, d.rate_per_gpu * d.gpus / job.output_len)
            plans.append(DisaggPlan(p, d, size, kv_s, link, req, job.output_len, wait))
    if request_rate is not None:
        plans.sort(key=lambda x: (x.gpus, -x.tokens_per_s))
    else:
        plans.sort(key=lambda x: -x.tokens_per_s / x.gpus)
    co = search_serving(m, cluster, rated, weight_dtype, kv_dtype, "throughput", 1, None, allowance, moe=moe)
    colocated = co.ranked[0] if co.ranked else None
    winner, why = verdict(plans[0] if plans else None, colocated)
    return DisaggResult(plans[:top], colocated, len(prefills) + len(decodes), time.perf_counter() - t0, winner, why)


def verdict(best: DisaggPlan | None, co: ServeEstimate | None) -> tuple[str, str]:
    """Which wins on output tokens/s per GPU, and why in one sentence."""
    if best is None and co is None:
        return "none", "no disaggregated split and no co-located plan fits and meets the SLOs"
    if best is None:
        return "co-located", "no prefill / decode split fits and meets the SLOs on these GPUs"
    if co is None:
        return "disaggregated", "no co-located plan meets the SLOs: prefill chunks in every decode step cost TPOT"
    d, c = best.tokens_per_s / best.gpus, co.tokens_per_s / co.plan.num_gpus
    if d >= c:
        return "disaggregated", (f"{d / c:.2f}x the co-located output tokens/s per GPU: decode steps carry no "
                                 "prompt chunks and each phase runs its own layout")
    return "co-located", (f"{c / d:.2f}x the disaggregated output tokens/s per GPU: whole instances per phase and "
                          "the KV transfer cost more than separating the phases gains")
