"""Reports of plans on a cluster of several pools: the JSON of each plan's pools and the search's table."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from llmplan.hetero import HeteroEstimate, PoolUse, pool_cluster
from llmplan.report.common import SCHEMA
from llmplan.report.search import plan_label
from llmplan.report.training import estimate_json, estimate_view, hardware_text, memory_json
from llmplan.search.hetero import PoolSearchResult
from llmplan.specs.model import ModelSpec
from llmplan.specs.pools import PoolCluster
from llmplan.specs.plan import ParallelPlan
from llmplan.units import GIB


def cluster_json(pc: PoolCluster) -> dict[str, Any]:
    return {"name": pc.name, "gpus": pc.num_gpus,
            "pools": [{"name": p.name, "system": p.system.name, "nodes": p.nodes, "gpus": p.num_gpus}
                      for p in pc.pools],
            "fabric": {"gb_per_s": pc.fabric.gb_per_s, "latency_s": pc.fabric.latency_s,
                       "efficiency": pc.fabric.efficiency, "allreduce_efficiency": pc.fabric.allreduce_efficiency}}


def pool_use_json(u: PoolUse, plan: ParallelPlan) -> dict[str, Any]:
    return {"pool": u.pool, "name": u.name, "system": u.system, "gpus": u.gpus, "stages": list(u.stages),
            "replicas": u.replicas, "global_batch": u.global_batch, "stage_layers": list(u.layers),
            "memory": memory_json(u.memory, plan), "time": {"step_s": u.step_s, "compute_s": u.compute_s}}


def pools_json(h: HeteroEstimate) -> dict[str, Any]:
    """Which pool holds which stages / replicas of a plan, with each pool's memory and time."""
    hp = h.hetero
    return {"assignment": hp.assignment if len(h.pools) > 1 else "single",
            "stage_pools": list(hp.stage_pools) if hp.stage_pools is not None else None,
            "replica_pools": list(hp.replica_pools) if hp.replica_pools is not None else None,
            "replica_batches": list(hp.replica_batches) if hp.replica_batches is not None else None,
            "cross_pool_s": h.cross_pool_s, "by_pool": [pool_use_json(u, h.estimate.plan) for u in h.pools]}


def hetero_json(h: HeteroEstimate) -> dict[str, Any]:
    """A plan's estimate document (the single-system keys) with its GPUs over every pool and `pools`."""
    return {**estimate_json(h.estimate), "gpus": sum(u.gpus for u in h.pools), "pools": pools_json(h)}


def pinned_view(console: Console, h: HeteroEstimate, pc: PoolCluster) -> None:
    """A saved plan priced on its pinned pools (`estimate --plan`): which pool holds what, as the search's row
    shows it, then the estimate's tables under a header that names each pool the plan runs on (the combined
    estimate's cluster is the slowest pool's system at the plan's GPU count, which no pool is)."""
    assignment = h.hetero.assignment if len(h.pools) > 1 else "one pool"
    console.print(f"pools ({assignment}, as pinned in the plan file): {where_cell(h)}")
    hardware = ", ".join(f"pool {u.name}: {hardware_text(pool_cluster(pc.pools[u.pool].system, u.gpus))}"
                         for u in h.pools)
    estimate_view(console, h.estimate, hardware=hardware)
    if h.cross_pool_s:
        console.print(f"between pools: {h.cross_pool_s:.3f} s per step on the inter-pool fabric")


def pool_search_json(res: PoolSearchResult, pc: PoolCluster, m: ModelSpec, global_batch: int,
                     seq_len: int) -> dict[str, Any]:
    return {"schema": SCHEMA, "mode": "train", "model": m.name, "hardware": pc.name, "gpus": pc.num_gpus,
            "cluster": cluster_json(pc), "objective": "throughput",
            "workload": {"global_batch": global_batch, "seq_len": seq_len},
            "considered": res.considered, "feasible": res.feasible, "pruned": res.pruned, "search_s": res.seconds,
            "alone": res.alone,
            "plans": [{"rank": i, **hetero_json(h)} for i, h in enumerate(res.ranked, 1)]}


def where_cell(h: HeteroEstimate) -> str:
    """Which pool holds what, e.g. 'h100 s0-3 (15,16,15,15) | a100 s4-7 (5,5,5,4)' or 'h100 x2 b188 | ...'."""
    parts = []
    for u in h.pools:
        if h.hetero.assignment == "replicas" and len(h.pools) > 1:
            parts.append(f"{u.name} dp{u.replicas} b{u.global_batch}")
        else:
            s = f"s{u.stages[0]}-{u.stages[-1]}" if len(u.stages) > 1 else f"s{u.stages[0]}"
            parts.append(f"{u.name} {s} ({','.join(str(x) for x in u.layers)})")
    return " | ".join(parts)


def pool_search_view(console: Console, res: PoolSearchResult, pc: PoolCluster, m: ModelSpec) -> None:
    console.print(f"{m.name} on {pc.name}: " + ", ".join(
        f"{p.nodes} x {p.system.name}" + (f" ({p.name})" if p.name != p.system.name else "") for p in pc.pools)
                  + f"; {pc.fabric.gb_per_s:g} GB/s per GPU between pools")
    t = Table(title=f"{len(res.ranked)} best plans", show_edge=False, pad_edge=False)
    for col in ("#", "plan / where", "tok/s", "step s", "MFU", "GiB max"):
        t.add_column(col, overflow="fold")
    for i, h in enumerate(res.ranked, 1):
        p, e = h.hetero.plan, h.estimate
        gib = max(float(u.memory.total) for u in h.pools) / GIB
        t.add_row(str(i), plan_label(p) + "\n" + where_cell(h), f"{float(e.throughput.tokens_per_s):,.0f}",
                  f"{float(e.time.total):.2f}", f"{float(e.throughput.mfu):.0%}", f"{gib:.1f}")
    console.print(t)
    console.print("alone: " + ", ".join(f"{k} {v:,.0f} tok/s" if v > 0 else f"{k} no plan fits"
                                        for k, v in res.alone.items())
                  + f"; over pools: {res.considered} priced, {res.feasible} fit")
