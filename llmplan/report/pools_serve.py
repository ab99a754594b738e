"""Reports of serving on a cluster of several pools (search.hetero_serve): the disaggregated search's splits
with the pool of each phase, and the co-located deployment with each pool's layout and request share."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from llmplan.report.common import SCHEMA, ReportTable
from llmplan.report.pools import cluster_json
from llmplan.report.serving import instance_layout, serve_json, serve_layout, split_json, wide_layout_note
from llmplan.search.disagg import Pool
from llmplan.search.hetero_serve import PoolDisaggPlan, PoolDisaggResult, PoolServeResult
from llmplan.search.serve import ServeSearchResult, slo_text
from llmplan.specs.model import ModelSpec
from llmplan.specs.pools import PoolCluster
from llmplan.specs.serve import ServeJob


def _where(pc: PoolCluster, g: int) -> dict[str, Any]:
    p = pc.pools[g]
    return {"pool": p.name, "pool_index": g, "system": p.system.name}


def pools_disagg_json(res: PoolDisaggResult, model: ModelSpec, pc: PoolCluster, job: ServeJob) -> dict[str, Any]:
    """`search --mode infer --disaggregated --hardware cluster.yaml --json`: the single-system document's keys,
    each phase's "pool" (name, index, system), "max_requests_per_s", the cluster, and the co-located
    deployment over the pools it is compared with."""
    return {"schema": SCHEMA, "mode": "infer", "disaggregated": True, "model": model.name, "hardware": pc.name,
            "gpus": pc.num_gpus, "cluster": cluster_json(pc), "workload": job.model_dump(mode="json"),
            "considered": res.considered, "search_s": res.seconds,
            "plans": [_pool_split_json(i, x, pc) for i, x in enumerate(res.plans, 1)],
            "colocated": pools_serve_summary(res.colocated, pc),
            "winner": res.winner, "why": res.why}


def _pool_split_json(rank: int, x: PoolDisaggPlan, pc: PoolCluster) -> dict[str, Any]:
    """The single-system split's keys, each phase's pool, whether the KV crosses pools, and the split's
    "max_requests_per_s"."""
    doc = split_json(x.split)
    return {"rank": rank, **doc, "prefill": {**doc["prefill"], **_where(pc, x.prefill_pool)},
            "decode": {**doc["decode"], **_where(pc, x.decode_pool)},
            "kv_transfer": {**doc["kv_transfer"], "crosses_pools": x.prefill_pool != x.decode_pool},
            "max_requests_per_s": x.max_requests_per_s}


def pools_serve_summary(res: PoolServeResult, pc: PoolCluster) -> dict[str, Any]:
    """The co-located deployment over pools: totals and, per pool, its layout, replicas and request share."""
    return {"request_rate": res.request_rate, "capacity_requests_per_s": res.capacity_requests_per_s,
            "gpus": res.gpus, "tokens_per_s": res.tokens_per_s,
            "tokens_per_s_per_gpu": res.tokens_per_s / res.gpus if res.gpus else None,
            "by_pool": [{**_where(pc, s.pool), "gpus": s.gpus, "replicas": s.estimate.plan.copies,
                         "capacity_requests_per_s": s.capacity_requests_per_s, "requests_per_s": s.requests_per_s,
                         "tokens_per_s": s.requests_per_s * s.estimate.job.output_len,
                         "estimate": serve_json(s.estimate)} for s in res.shares]}


def pools_serve_json(res: PoolServeResult, model: ModelSpec, pc: PoolCluster, job: ServeJob) -> dict[str, Any]:
    """`search --mode infer --hardware cluster.yaml --json`: the co-located deployment over the pools
    ("by_pool": each pool's plan, replicas and share of the rate) and each pool's own search ("pools_alone")."""
    return {"schema": SCHEMA, "mode": "infer", "model": model.name, "hardware": pc.name, "gpus": pc.num_gpus,
            "cluster": cluster_json(pc), "objective": "throughput", "workload": job.model_dump(mode="json"),
            "search_s": res.seconds, **pools_serve_summary(res, pc),
            "pools_alone": [{**_where(pc, g), "feasible": r.feasible,
                             "pruned": {p.rule: p.count for p in r.pruned}, "refusal": r.refusal,
                             "best_tokens_per_s_per_gpu": (r.ranked[0].tokens_per_s / r.ranked[0].plan.num_gpus
                                                           if r.ranked else None)}
                            for g, r in enumerate(res.per_pool)]}


def _layout(pool: Pool, name: str) -> str:
    return f"{name} {instance_layout(pool)}"


def _head(console: Console, what: str, model: ModelSpec, pc: PoolCluster, job: ServeJob) -> None:
    slo = f", SLOs {slo_text(job)}" if job.ttft_slo_s is not None or job.tpot_slo_s is not None else ""
    console.print(f"[bold]{model.name}[/] {what} on {pc.name}: " + ", ".join(
        f"{p.nodes} x {p.system.name}" + (f" ({p.name})" if p.name != p.system.name else "") for p in pc.pools)
                  + f"; {job.input_len} in / {job.output_len} out tokens{slo}")


def pools_disagg_view(console: Console, res: PoolDisaggResult, model: ModelSpec, pc: PoolCluster,
                      job: ServeJob) -> None:
    _head(console, "disaggregated serving", model, pc, job)
    console.print(f"priced {res.considered} instance layouts over {len(pc.pools)} pools in {res.seconds:.2f} s")
    if res.plans:
        t = ReportTable(title="Best prefill / decode splits over pools")
        t.add_column("#", justify="right")
        t.add_column("prefill", overflow="fold")
        t.add_column("decode", overflow="fold")
        for col in ("P:D", "TTFT ms", "TPOT ms", "req/s", "per GPU"):
            t.add_column(col, justify="right")
        for i, x in enumerate(res.plans, 1):
            s = x.split
            t.add_row(str(i), _layout(s.prefill, pc.pools[x.prefill_pool].name),
                      _layout(s.decode, pc.pools[x.decode_pool].name), f"{s.prefill.gpus}:{s.decode.gpus}",
                      f"{s.ttft_s * 1e3:,.0f}", f"{s.tpot_s * 1e3:,.1f}", f"{s.requests_per_s:,.1f}",
                      f"{s.tokens_per_s / s.gpus:,.0f}")
        t.caption = ("pool layout x instances; dpa: DP attention + wide EP; TTFT: prefill + KV transfer (over "
                     "the fabric between pools when the phases sit apart), no queueing; per GPU: output tokens/s")
        console.print(t)
        b = res.plans[0].split
        console.print(f"KV transfer: {b.kv_bytes_per_request / 2**20:,.1f} MiB per request, "
                      f"{b.kv_seconds * 1e3:,.2f} ms over {b.kv_link}")
    co = res.colocated
    if co.shares:
        console.print(f"best co-located over the pools: {co.tokens_per_s / co.gpus:,.0f} output tokens/s per GPU")
    console.print(f"[bold]{res.winner}[/]: {res.why}")


def _no_layout(r: ServeSearchResult) -> str:
    """Why a pool serves nothing: its pruned layouts, its --dp-attention refusal, or pins above its GPUs."""
    if r.refusal:
        return f"no layout tried: {r.refusal}"
    return "no layout fits and meets the SLOs (" + (", ".join(f"{p.count} {p.rule}" for p in r.pruned) + " pruned)"
                                                    if r.considered else "none tried: tp x pp above the pool's GPUs)")


def pools_serve_view(console: Console, res: PoolServeResult, model: ModelSpec, pc: PoolCluster,
                     job: ServeJob) -> None:
    _head(console, "serving", model, pc, job)
    rate = f" at {res.request_rate:g} requests/s" if res.request_rate is not None else " at capacity"
    console.print(f"searched {len(pc.pools)} pools in {res.seconds:.2f} s; together they sustain "
                  f"{res.capacity_requests_per_s:,.2f} requests/s")
    for g, r in enumerate(res.per_pool):
        if not r.ranked:
            console.print(f"{pc.pools[g].name}: " + _no_layout(r))
    if not res.shares:
        return
    t = ReportTable(title=f"Replicas per pool{rate}")
    t.add_column("pool", overflow="fold")
    t.add_column("layout")
    for col in ("GPUs", "TTFT ms", "TPOT ms", "req/s", "of cap.", "tokens/s"):
        t.add_column(col, justify="right")
    for s in res.shares:
        e, p = s.estimate, s.estimate.plan
        t.add_row(pc.pools[s.pool].name, serve_layout(p),
                  str(p.num_gpus), f"{float(e.timing.ttft) * 1e3:,.1f}", f"{float(e.timing.tpot) * 1e3:,.2f}",
                  f"{s.requests_per_s:,.2f}", f"{s.requests_per_s / s.capacity_requests_per_s:.0%}",
                  f"{s.requests_per_s * e.job.output_len:,.0f}")
    t.caption = ("each pool's best layout on its own GPU; the rate split in proportion to each pool's capacity "
                 "under the SLOs; of cap.: share of the pool's capacity; layout: tp, pp, x replicas, ep"
                 + wide_layout_note([s.estimate.plan for s in res.shares]))
    console.print(t)
