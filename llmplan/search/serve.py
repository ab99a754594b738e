"""The inference search: every TP / PP / replica / EP layout of a GPU budget, at the largest concurrency
that fits in the KV cache and meets the SLOs, ranked by throughput per GPU or by the fewest GPUs."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from llmplan.cost.inference import max_batch_under_slo, serve_memory, serve_timing
from llmplan.search.run import Pruned
from llmplan.serving import ServeEstimate, estimate_serving, loaded_model, replica_spans
from llmplan.specs.check import check_serve_plan, divisors, valid_tp
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ClusterSpec, MemoryAllowance
from llmplan.specs.serve import KvDtype, ServeJob, ServePlan, WeightDtype
from llmplan.units import GIB

SERVE_OBJECTIVES = ("throughput", "min-gpus")


@dataclass(frozen=True)
class Miss:
    """A layout that fits in memory but was not served: what it achieves against what was asked."""

    tp: int
    pp: int
    ep: int
    rule: str
    """slo (even one sequence misses an SLO) or gpus (meets the SLOs but needs more GPUs for the rate)."""
    ttft_s: float
    """TTFT: at one concurrent sequence (the best this layout can do) for rule slo; at the largest
    concurrency meeting the SLOs for rule gpus."""
    tpot_s: float
    """TPOT, at the same concurrency as ttft_s."""
    gpus_needed: int = 0
    """GPUs the rate needs with this layout (rule gpus)."""


@dataclass
class ServeSearchResult:
    considered: int
    feasible: int
    pruned: list[Pruned]
    ranked: list[ServeEstimate]
    objective: str
    seconds: float
    request_rate: float | None = None
    misses: list[Miss] = field(default_factory=list)
    """Layouts that fit but miss an SLO or the GPU budget, best first (shown when nothing is served)."""


def _count(pruned: dict[str, list], rule: str, example: str) -> None:
    pruned.setdefault(rule, [0, example])[0] += 1


def serve_layouts(m: ModelSpec, cluster: ClusterSpec, pins: dict) -> list[tuple[int, int, int]]:
    """(tp, pp, ep) candidates: TP inside the NVLink domain, PP up to 8 stages, EP off or over the TP ranks."""
    n, dom = cluster.num_gpus, cluster.system.domain_gpus
    tps = [pins["tp"]] if pins.get("tp") else [t for t in valid_tp(m, min(n, dom))]
    pps = [pins["pp"]] if pins.get("pp") else [p for p in divisors(m.num_hidden_layers) if p <= 8]
    out = []
    for tp in tps:
        for pp in pps:
            if tp * pp > n:
                continue
            eps = [pins["ep"]] if pins.get("ep") else ([1, tp] if m.is_moe and tp > 1 else [1])
            out += [(tp, pp, ep) for ep in eps]
    return out


def search_serving(m: ModelSpec, cluster: ClusterSpec, job: ServeJob, weight_dtype: WeightDtype, kv_dtype: KvDtype,
                   objective: str = "throughput", top: int = 5, request_rate: float | None = None,
                   allowance: MemoryAllowance | None = None, pins: dict | None = None) -> ServeSearchResult:
    t0 = time.perf_counter()
    pins = pins or {}
    pruned: dict[str, list] = {}
    found: list[ServeEstimate] = []
    misses: list[Miss] = []
    layouts = serve_layouts(m, cluster, pins)
    for tp, pp, ep in layouts:
        dp = pins.get("dp") or cluster.num_gpus // (tp * pp)
        plan = ServePlan(tp=tp, pp=pp, dp=dp, ep=ep, weight_dtype=weight_dtype, kv_dtype=kv_dtype)
        sub = ClusterSpec(system=cluster.system, num_nodes=math.ceil(plan.num_gpus / cluster.gpus_per_node_used),
                          gpus_per_node=min(cluster.gpus_per_node_used, plan.num_gpus))
        if sub.num_gpus != plan.num_gpus:
            _count(pruned, "gpus", f"tp {tp} x pp {pp} x {dp} replicas = {plan.num_gpus} GPUs do not fill whole nodes "
                   f"of {cluster.gpus_per_node_used}")
            continue
        bad = check_serve_plan(m, plan, job, sub)
        if bad:
            _count(pruned, bad[0].rule, bad[0].message)
            continue
        mem = serve_memory(loaded_model(m, job), plan, job, cluster.system.gpu.hbm_bytes, allowance)
        if mem.max_concurrent_seqs < 1:
            _count(pruned, "memory", f"tp {tp} pp {pp}: weights and runtime leave {mem.kv_available / GIB:.1f} GiB "
                   f"for the KV cache, not one sequence of {job.context} tokens")
            continue
        limit = min(job.batch, mem.max_concurrent_seqs)
        batch = limit
        if job.ttft_slo_s is not None or job.tpot_slo_s is not None:
            batch = max_batch_under_slo(loaded_model(m, job), plan, cluster.system, replica_spans(plan, sub), job,
                                        limit)
        if batch < 1:
            one = serve_timing(loaded_model(m, job), plan, cluster.system, replica_spans(plan, sub), job, 1)
            misses.append(Miss(tp, pp, ep, "slo", float(one.ttft), float(one.tpot)))
            _count(pruned, "slo", f"tp {tp} pp {pp}: at one sequence TTFT {float(one.ttft):.3g} s / TPOT "
                   f"{float(one.tpot):.3g} s, asked {slo_text(job)}")
            continue
        found.append(estimate_serving(m, sub, plan, job.model_copy(update={"batch": batch}), allowance))
    if objective == "min-gpus":
        found, over = _min_gpus(found, request_rate, cluster.num_gpus, allowance)
        misses += over
        found.sort(key=lambda e: (e.plan.num_gpus, -e.tokens_per_s, e.plan.tp, e.plan.pp))
    else:
        found.sort(key=lambda e: (-e.tokens_per_s / e.plan.num_gpus, e.plan.tp, e.plan.pp, e.plan.ep))
    return ServeSearchResult(
        considered=len(layouts), feasible=len(found),
        pruned=[Pruned(rule, count, example) for rule, (count, example) in pruned.items()],
        ranked=found[:top], objective=objective, seconds=time.perf_counter() - t0, request_rate=request_rate,
        misses=sorted(misses, key=lambda x: (x.rule != "gpus", x.gpus_needed, x.tpot_s + x.ttft_s)),
    )


def slo_text(job: ServeJob) -> str:
    """The SLOs that were given, e.g. "TPOT <= 0.02 s"."""
    parts = [f"TTFT <= {job.ttft_slo_s:g} s" if job.ttft_slo_s is not None else "",
             f"TPOT <= {job.tpot_slo_s:g} s" if job.tpot_slo_s is not None else ""]
    return " and ".join(p for p in parts if p) or "no SLO"


def _min_gpus(found: list[ServeEstimate], rate: float | None, budget: int,
              allowance: MemoryAllowance | None) -> tuple[list[ServeEstimate], list[Miss]]:
    """Each layout with just enough replicas for `rate` requests/s (one replica without a rate), estimated
    with the same memory allowance as the search; and the layouts whose replicas exceed the budget."""
    out, over = [], []
    for e in found:
        per_replica = float(e.timing.tokens_per_s_replica) / e.job.output_len  # requests/s
        replicas = max(1, math.ceil(rate / per_replica)) if rate else 1
        if replicas * e.plan.gpus_per_replica > budget:
            over.append(Miss(e.plan.tp, e.plan.pp, e.plan.ep, "gpus", float(e.timing.ttft), float(e.timing.tpot),
                             replicas * e.plan.gpus_per_replica))
        else:
            plan = e.plan.model_copy(update={"dp": replicas})
            cluster = ClusterSpec(system=e.cluster.system,
                                  num_nodes=math.ceil(plan.num_gpus / e.cluster.gpus_per_node_used),
                                  gpus_per_node=min(e.cluster.gpus_per_node_used, plan.num_gpus))
            if cluster.num_gpus == plan.num_gpus:
                out.append(estimate_serving(e.model, cluster, plan, e.job, allowance))
    return out, over
