"""The inference search: every TP / PP / replica / EP layout of a GPU budget, at the largest concurrency
that fits in the KV cache and meets the SLOs, ranked by throughput per GPU or by the fewest GPUs."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from llmplan.cost.inference import batches_under_slo, serve_memory, serve_timing
from llmplan.errors import LlmplanError, PlanViolationError
from llmplan.search.run import Pruned
from llmplan.serving import (ServeEstimate, estimate_serving, job_for_plan, loaded_model, replica_spans, slo_batch_of,
                             slo_candidates)
from llmplan.specs.check import (Violation, check_serve_plan, divisors, engine_capped, serve_moe_violations,
                                 speculative_violations, valid_tp)
from llmplan.specs.model import ModelSpec
from llmplan.specs.options import SERVE_PLAN_FLAGS, SERVE_PLAN_OPTIONS
from llmplan.specs.registry import build
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
    refusal: str | None = None
    """Why this system tried no layout when a search over pools goes on without it (refuse_pins False): the
    --dp-attention refusal of refuse_dp_attention, which one system raises (None otherwise)."""


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


MOE_SEARCH_FIELDS = ("dp_attention", "two_batch_overlap", "redundant_experts", "ep_imbalance", "expert_dtype",
                     "moe_dispatcher")
"""The MoE serving options (ServePlan fields) the serving search honours when they are given (--moe-dispatcher
as `estimate --mode infer` reads it: the one flag serving shares with training)."""

WIDE_EP_REDUNDANT = (0, 32)
"""EPLB redundant experts tried for a wide-EP layout whose GPUs do not divide the experts (DeepSeek's and
SGLang's 32: 256 + 32 = 288 experts over EP 72 or 144)."""


def wide_ep_sizes(cluster: ClusterSpec) -> list[int]:
    """GPUs of the DP-attention wide-EP layouts tried: even shares of a node (halving, at least 2 GPUs: SGLang
    starts a server on consecutive GPUs from --base-gpu-id, several on one node; sgl-project/sglang @001067ff,
    python/sglang/srt/entrypoints/engine.py, _launch_scheduler_processes), whole nodes, doubling, and the whole
    budget."""
    n, per_node = cluster.num_gpus, cluster.gpus_per_node_used
    shares = [per_node // 2 ** k for k in range(1, per_node.bit_length())
              if per_node % 2 ** k == 0 and per_node // 2 ** k >= 2]
    g, out = per_node, sorted(s for s in shares if s <= n)
    while 1 < g <= n:
        out.append(g)
        g *= 2
    return out + ([n] if n > 1 and n not in out else [])


def wide_ep_plans(m: ModelSpec, cluster: ClusterSpec, pins: dict, base: ServePlan, moe: dict) -> list[ServePlan]:
    """DP-attention wide-EP layouts of a MoE model (as the disaggregated search's instances): tp 1, attention on
    every GPU of a group of g (wide_ep_sizes, or a pinned --ep above 1 dividing the GPUs), experts over ep = g
    with DeepEP, two-batch overlap when the group leaves the NVLink domain, EPLB's redundant experts (the given
    number, else 0 or 32) where they make ep divide the experts; as many groups (independent servers, dp = g x
    copies) as the GPUs hold, as the TP / PP layouts' replicas fill them."""
    if not m.is_moe or pins.get("tp") not in (None, 1) or pins.get("pp") not in (None, 1):
        return []
    out, n, pinned = [], cluster.num_gpus, pins.get("ep")
    sizes = wide_ep_sizes(cluster) + ([pinned] if pinned and 1 < pinned < n and n % pinned == 0 else [])
    for g in sorted(set(sizes)):
        given = moe.get("redundant_experts")
        red = given if given is not None else next(
            (r for r in WIDE_EP_REDUNDANT if (m.num_experts + r) % g == 0), None)
        if red is None or pins.get("ep") not in (None, g):
            continue
        out.append(base.model_copy(update={"tp": 1, "pp": 1, "dp": n // g * g, "ep": g, "dp_attention": True,
                                           "moe_dispatcher": "deepep", "redundant_experts": red,
                                           "two_batch_overlap": g > cluster.system.domain_gpus}))
    return out


def with_moe_options(m: ModelSpec, plan: ServePlan, moe: dict | None) -> ServePlan | None:
    """A candidate layout under the MoE serving options the user gave (MOE_SEARCH_FIELDS), or None when they
    exclude it: --dp-attention keeps only DP-attention layouts, --no-dp-attention drops them;
    --two-batch-overlap, --redundant-experts and --moe-dispatcher apply to layouts with ep > 1 (a layout
    without EP runs no expert all-to-all: check_serve_plan's moe_serving_needs_ep); --ep-imbalance and
    --expert-dtype to every layout of a MoE model."""
    moe = moe or {}
    if "dp_attention" in moe and bool(moe["dp_attention"]) != plan.dp_attention:
        return None
    keys = (("ep_imbalance", "expert_dtype") if m.is_moe else ()) + (
        ("two_batch_overlap", "redundant_experts", "moe_dispatcher") if plan.ep > 1 else ())
    update = {k: moe[k] for k in keys if k in moe}
    return plan.model_copy(update=update) if update else plan


def refuse_disagg_pins(tp: int | None, pp: int | None, ep: int | None) -> None:
    """A disaggregated search (one system or pools) searches each phase's instance layouts: pins are refused."""
    if any(v is not None for v in (tp, pp, ep)):
        raise LlmplanError("--tp/--pp/--ep with --disaggregated: each phase's instance layouts are searched; drop "
                           "the pins")


def refuse_search_phase(moe: dict) -> None:
    """--phase is estimate's: every serving search chooses the phases itself."""
    if moe.get("phase", "both") != "both":
        raise LlmplanError(f"--phase {moe['phase']} with search --mode infer: the search chooses the phases "
                           "(co-located, or prefill and decode pools with --disaggregated); price one pool with "
                           f"`estimate --mode infer --phase {moe['phase']}`")


def check_search_moe(m: ModelSpec, weight_dtype: str, kv_dtype: str, moe: dict, ep: int | None = None) -> dict:
    """The MoE serving options given to a serving search, checked: --phase is estimate's (the search chooses
    the phases), each value must be one a ServePlan takes, and an option that acts on the expert-parallel
    all-to-all needs a layout with ep > 1 (none has it on a dense model or with --ep 1 pinned: check_serve_plan's
    SERVE_MOE_RULES, as `estimate --mode infer` refuses it). Returns the MoE options (MOE_SEARCH_FIELDS) given."""
    refuse_search_phase(moe)
    given = {k: v for k, v in moe.items() if k in MOE_SEARCH_FIELDS}
    plan = build(ServePlan, {"weight_dtype": weight_dtype, "kv_dtype": kv_dtype,
                             **{k: v for k, v in given.items() if k != "dp_attention" or not m.is_moe}},
                 SERVE_PLAN_OPTIONS, SERVE_PLAN_FLAGS)  # a MoE model's --dp-attention: refuse_dp_attention
    if not m.is_moe or ep == 1:  # every layout the search tries has ep 1
        bad = serve_moe_violations(m, plan)
        if bad:
            raise PlanViolationError(bad)
    unset = (None, False, "alltoall")  # a value that asks for nothing (alltoall: ServePlan's default dispatcher)
    if not m.is_moe and any(v not in unset for v in given.values()):
        flags = ", ".join("--" + k.replace("_", "-") for k, v in given.items() if v not in unset)
        raise LlmplanError(f"{flags}: MoE serving options, but {m.name} is dense; drop them")
    return given


def refuse_dp_attention(m: ModelSpec, cluster: ClusterSpec, pins: dict, moe: dict) -> None:
    """The serving search's up-front refusal of --dp-attention on a MoE model when no DP-attention layout it
    tries fits the pins (wide_ep_plans: tp 1, pp 1, ep over every GPU of the group): the SERVE_MOE_RULES that
    `estimate --mode infer` meets with the same pins on the budget (tp and pp pinned or 1, dp filling the GPUs,
    ep pinned or over them all), as check_serve_plan words them, or where those hold (one GPU; no group size
    dividing the experts) the group sizes tried, rather than a search that finds no plan. A dense model's
    --dp-attention is check_search_moe's (rule dp_attention_moe)."""
    if not (m.is_moe and moe.get("dp_attention")):
        return
    base = ServePlan()
    if wide_ep_plans(m, cluster, pins, base, moe):
        return
    tp, pp = pins.get("tp") or 1, pins.get("pp") or 1
    dp = pins.get("dp") or max(1, cluster.num_gpus // (tp * pp))
    plan = base.model_copy(update={"tp": tp, "pp": pp, "dp": dp, "ep": pins.get("ep") or tp * pp * dp,
                                   "dp_attention": True})
    bad = serve_moe_violations(m, plan)
    if bad:
        raise PlanViolationError(bad)
    sizes = ", ".join(map(str, wide_ep_sizes(cluster))) or "none: one GPU"
    raise LlmplanError(f"--dp-attention: no DP-attention layout of {m.name} on {cluster.num_gpus} GPUs: the search "
                       f"tries wide-EP groups of even shares of a node, whole nodes, doubling, and every GPU "
                       f"({sizes}), each with ep over "
                       f"its GPUs dividing the {m.num_experts} experts (with --redundant-experts, else 0 or "
                       f"{WIDE_EP_REDUNDANT[-1]} redundant); add GPUs or drop --dp-attention")


EP_RULES = ("ep_experts", "ep_serve", "ep_serve_engine", "dp_attention_nodes")
"""check_serve_plan's rules on the EP degree itself (a pinned --ep that breaks one of them on every layout the
search tries is refused by pinned_ep_refusal)."""


def ep_breaks(m: ModelSpec, cluster: ClusterSpec, job: ServeJob, pins: dict, weight_dtype: WeightDtype,
              kv_dtype: KvDtype, moe: dict | None) -> list[Violation] | None:
    """The EP rules (EP_RULES) the layouts the search tries with these pins break, one violation per rule, or
    None when some layout breaks none (or the search tries no layout)."""
    seen: dict[str, Violation] = {}
    layouts = serve_candidates(m, cluster, pins, weight_dtype, kv_dtype, moe)
    for plan in layouts:
        bad = [v for v in check_serve_plan(m, plan, job, sub_cluster(cluster, plan.num_gpus)) if v.rule in EP_RULES]
        if not bad:
            return None
        for v in bad:
            seen.setdefault(v.rule, v)
    return list(seen.values()) or None


def pinned_ep_refusal(m: ModelSpec, cluster: ClusterSpec, job: ServeJob, pins: dict, weight_dtype: WeightDtype,
                      kv_dtype: KvDtype, moe: dict | None) -> str | None:
    """Why no layout of the serving search takes the pinned --ep (ep_breaks), with the EP degrees some layout
    takes on these GPUs (the experts' divisors, EPLB's sum with --redundant-experts, and the wide-EP group sizes,
    wide_ep_sizes), or None when some layout takes it. One line: what (values); the rules; the valid choices."""
    ep = pins.get("ep")
    if not m.is_moe or not ep or ep == 1:
        return None
    bad = ep_breaks(m, cluster, job, pins, weight_dtype, kv_dtype, moe)
    if bad is None:
        return None
    red = (moe or {}).get("redundant_experts") or 0
    tried = sorted({e for e in divisors(m.num_experts + red) + wide_ep_sizes(cluster) if e <= cluster.num_gpus})
    valid = [e for e in tried if e == 1 or ep_breaks(m, cluster, job, {**pins, "ep": e}, weight_dtype, kv_dtype,
                                                     moe) is None]
    return (f"--ep {ep}: no serving layout of {m.name} on {cluster.num_gpus} GPUs takes it: "
            + "; ".join(f"{v.message} (rule {v.rule})" for v in bad)
            + f"; the search tries ep over the TP ranks, up to tp x replicas, and DP-attention wide-EP groups of "
            f"{', '.join(map(str, wide_ep_sizes(cluster))) or 'none'} GPUs; pin one of --ep "
            f"{', '.join(map(str, valid))} on these GPUs, or drop --ep")


def serve_candidates(m: ModelSpec, cluster: ClusterSpec, pins: dict, weight_dtype: WeightDtype, kv_dtype: KvDtype,
                     moe: dict | None = None) -> list[ServePlan]:
    """Every layout the serving search prices: the TP / PP / EP replicas of serve_layouts filling the budget
    and, for MoE models, the DP-attention wide-EP layouts (wide_ep_plans), under the MoE serving options
    given (with_moe_options)."""
    base = ServePlan(weight_dtype=weight_dtype, kv_dtype=kv_dtype)
    plans = [base.model_copy(update={"tp": tp, "pp": pp, "ep": ep,
                                     "dp": pins.get("dp") or cluster.num_gpus // (tp * pp)})
             for tp, pp, ep in serve_layouts(m, cluster, pins)] + wide_ep_plans(m, cluster, pins, base, moe or {})
    return [q for q in (with_moe_options(m, p, moe) for p in plans) if q is not None]


def sub_cluster(cluster: ClusterSpec, gpus: int) -> ClusterSpec:
    """The first `gpus` GPUs of the cluster (whole nodes, or part of one)."""
    gpn = cluster.gpus_per_node_used
    return ClusterSpec(system=cluster.system, num_nodes=math.ceil(gpus / gpn), gpus_per_node=min(gpn, gpus))


def refuse_speculation(m: ModelSpec, job: ServeJob) -> None:
    """The serving searches' (co-located and disaggregated, on one system or over pools) up-front refusal of a
    job whose speculative decoding no layout can run: check.speculative_violations at one stage (MTP without MTP
    layers, no acceptance rate, a draft of another vocabulary; its one rule that depends on the layout, one
    pipeline stage, holds there), rather than a search that reports that nothing fits."""
    bad = speculative_violations(m, ServePlan(), job)
    if bad:
        raise PlanViolationError(bad)


def refuse_no_layout(m: ModelSpec, cluster: ClusterSpec, pins: dict, where: str = "the budget") -> None:
    """Pins that leave the serving search no layout to price (serve_layouts: tp x pp above the GPUs) are
    refused in one line rather than a search that prices nothing and exits 3."""
    given = " ".join(f"--{k} {pins[k]}" for k in ("tp", "pp") if pins.get(k))
    if given:
        tp, pp = pins.get("tp") or 1, pins.get("pp") or 1
        raise LlmplanError(f"{given}: tp x pp (at least {tp} x {pp} = {tp * pp}) exceeds the {cluster.num_gpus} GPUs "
                           f"of {where}: each serving replica of {m.name} takes tp x pp GPUs; lower --tp / --pp "
                           f"so that tp x pp <= {cluster.num_gpus}, or add GPUs")


def search_serving(m: ModelSpec, cluster: ClusterSpec, job: ServeJob, weight_dtype: WeightDtype, kv_dtype: KvDtype,
                   objective: str = "throughput", top: int = 5, request_rate: float | None = None,
                   allowance: MemoryAllowance | None = None, pins: dict | None = None,
                   moe: dict | None = None, refuse_pins: bool = True) -> ServeSearchResult:
    """Rank the serving layouts (serve_candidates) of a GPU budget; `moe` the MoE serving options given. A job
    whose speculation no layout can run is refused up front (refuse_speculation); a pinned --ep that no layout
    takes (pinned_ep_refusal) is refused when nothing is served, and pins that leave no layout at all up front
    (refuse_no_layout), where `refuse_pins` (the search over pools refuses a pinned --ep only when no pool takes it).
    --dp-attention with no DP-attention layout for these GPUs and pins (refuse_dp_attention) is refused up front
    on one system; over pools (`refuse_pins` False) the pool tries nothing and `refusal` says why."""
    refuse_speculation(m, job)
    job = engine_capped(job)  # --max-batch above what the engine starts with (vLLM: max_num_batched_tokens)
    t0 = time.perf_counter()
    pins = pins or {}
    refusal = None
    try:
        refuse_dp_attention(m, cluster, pins, moe or {})
    except LlmplanError as e:
        if refuse_pins:
            raise
        refusal = str(e)
    pruned: dict[str, list] = {}
    found: list[ServeEstimate] = []
    misses: list[Miss] = []
    layouts = [] if refusal else serve_candidates(m, cluster, pins, weight_dtype, kv_dtype, moe)
    if not layouts and refuse_pins:
        refuse_no_layout(m, cluster, pins)
    lm = loaded_model(m, job)
    for plan in layouts:
        tp, pp, ep, dp = plan.tp, plan.pp, plan.ep, plan.dp
        sub = sub_cluster(cluster, plan.num_gpus)
        if sub.num_gpus != plan.num_gpus:
            _count(pruned, "gpus", f"tp {tp} x pp {pp} x {dp} replicas = {plan.num_gpus} GPUs do not fill whole nodes "
                   f"of {cluster.gpus_per_node_used}")
            continue
        bad = check_serve_plan(m, plan, job, sub)
        if bad:
            _count(pruned, bad[0].rule, bad[0].message)
            continue
        pj = job_for_plan(lm, job, plan, cluster.system)  # the captured sizes and fraction estimate_serving prices
        mem = serve_memory(lm, plan, pj, cluster.system.gpu.hbm_bytes, allowance)
        if mem.max_concurrent_seqs < 1:
            _count(pruned, "memory", f"tp {tp} pp {pp}: weights and runtime leave {mem.kv_available / GIB:.1f} GiB "
                   f"for the KV cache, not one sequence of {job.context:,} tokens")
            continue
        limit, spans = min(job.batch, mem.max_concurrent_seqs), replica_spans(plan, sub)
        batch = limit
        if job.ttft_slo_s is not None or job.tpot_slo_s is not None:
            ok = batches_under_slo(lm, plan, cluster.system, spans, pj, limit)
            batch = slo_batch_of(lm, pj, plan, plan, cluster.system, spans, slo_candidates(pj, ok))
        if batch < 1:
            one = serve_timing(lm, plan, cluster.system, spans, pj, 1)
            misses.append(Miss(tp, pp, ep, "slo", float(one.ttft), float(one.tpot)))
            _count(pruned, "slo", f"tp {tp} pp {pp}: at one sequence TTFT {float(one.ttft):.3g} s / TPOT "
                   f"{float(one.tpot):.3g} s, asked {slo_text(job)}")
            continue
        found.append(estimate_serving(m, sub, plan, pj.model_copy(update={"batch": batch}), allowance))
    if objective == "min-gpus":
        found, over = _min_gpus(found, request_rate, cluster.num_gpus, allowance)
        misses += over
        found.sort(key=lambda e: (e.plan.num_gpus, -e.tokens_per_s, e.plan.tp, e.plan.pp))
    else:
        found.sort(key=lambda e: (-e.tokens_per_s / e.plan.num_gpus, e.plan.tp, e.plan.pp, e.plan.ep))
    why = pinned_ep_refusal(m, cluster, job, pins, weight_dtype, kv_dtype, moe) if refuse_pins and not found else None
    if why is not None:
        raise LlmplanError(why)
    return ServeSearchResult(
        considered=len(layouts), feasible=len(found),
        pruned=[Pruned(rule, count, example) for rule, (count, example) in pruned.items()],
        ranked=found[:top], objective=objective, seconds=time.perf_counter() - t0, request_rate=request_rate,
        misses=sorted(misses, key=lambda x: (x.rule != "gpus", x.gpus_needed, x.tpot_s + x.ttft_s)),
        refusal=refusal,
    )


def slo_text(job: ServeJob) -> str:
    """The SLOs that were given, e.g. "TPOT <= 0.02 s"."""
    parts = [f"TTFT <= {job.ttft_slo_s:g} s" if job.ttft_slo_s is not None else "",
             f"TPOT <= {job.tpot_slo_s:g} s" if job.tpot_slo_s is not None else ""]
    return " and ".join(p for p in parts if p) or "no SLO"


def _min_gpus(found: list[ServeEstimate], rate: float | None, budget: int,
              allowance: MemoryAllowance | None) -> tuple[list[ServeEstimate], list[Miss]]:
    """Each layout with just enough copies (replicas; DP-attention servers of ep GPUs) for `rate` requests/s
    (one without a rate), estimated with the same memory allowance as the search; and the layouts whose copies
    exceed the budget."""
    out, over = [], []
    for e in found:
        unit = e.plan.gpus_per_copy
        # requests/s of one copy (tokens_per_s_replica: one attention rank's under DP attention)
        per_copy = float(e.timing.tokens_per_s_replica) * e.plan.attn_dp / e.job.output_len
        replicas = max(1, math.ceil(rate / per_copy)) if rate else 1
        if replicas * unit > budget:
            over.append(Miss(e.plan.tp, e.plan.pp, e.plan.ep, "gpus", float(e.timing.ttft), float(e.timing.tpot),
                             replicas * unit))
        else:
            est = _at_replicas(e, replicas, allowance)
            # The queue before prefill shrinks as replicas are added: add them, within the budget, until the
            # queued TTFT meets the SLO (cost.queueing).
            more = iter(range(replicas + 1, budget // unit + 1))
            while est is not None and _queued_miss(est) and (r := next(more, None)) is not None:
                est = _at_replicas(e, r, allowance) or est
            if est is not None and _queued_miss(est):
                over.append(Miss(e.plan.tp, e.plan.pp, e.plan.ep, "slo", float(est.timing.ttft),
                                 float(est.timing.tpot)))
            elif est is not None:
                out.append(est)
    return out, over


def _queued_miss(e: ServeEstimate) -> bool:
    """The TTFT, queueing included, misses the job's TTFT SLO."""
    return e.job.ttft_slo_s is not None and not float(e.timing.ttft) <= e.job.ttft_slo_s


def _at_replicas(e: ServeEstimate, replicas: int, allowance: MemoryAllowance | None) -> ServeEstimate | None:
    """The estimate's layout with `replicas` copies (ServePlan.copies; None when they do not fill whole nodes)."""
    plan = e.plan.model_copy(update={"dp": replicas * e.plan.attn_dp})
    cluster = sub_cluster(e.cluster, plan.num_gpus)
    return estimate_serving(e.model, cluster, plan, e.job, allowance) if cluster.num_gpus == plan.num_gpus else None
