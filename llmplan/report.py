"""The report layer: every table and JSON document llmplan prints is built here, from result objects."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table

from llmplan.cost.memory import TrainingMemory
from llmplan.cost.params import ParamCounts
from llmplan.specs.hardware import GpuSpec, SystemSpec
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.units import GIB

SCHEMA = 1
PLAN_KEYS = ("tp", "pp", "dp", "cp", "ep", "vpp", "sp", "zero", "recompute", "micro_batch", "global_batch",
             "seq_len", "dtype")


def gib(x: float) -> str:
    return f"{x / GIB:,.2f}"


def billions(x: float) -> str:
    return f"{x / 1e9:,.2f}B"


def dump_json(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=False)


# --- listings ---------------------------------------------------------------------------------------------


def models_table(models: list[tuple[ModelSpec, ParamCounts]]) -> Table:
    t = Table(title="Built-in models")
    for col in ("name", "type", "layers", "hidden", "heads/kv", "experts", "params", "active", "context"):
        t.add_column(col, justify="left" if col in ("name", "type") else "right")
    for m, p in models:
        experts = f"{m.num_experts} (top-{m.num_experts_per_tok})" if m.is_moe else "-"
        t.add_row(m.name, m.model_type, str(m.num_hidden_layers), str(m.hidden_size),
                  f"{m.num_attention_heads}/{m.kv_heads}", experts, billions(p.total), billions(p.active),
                  f"{m.max_position_embeddings:,}")
    return t


def models_json(models: list[tuple[ModelSpec, ParamCounts]]) -> dict[str, Any]:
    return {"schema": SCHEMA, "models": [
        {"name": m.name, "model_type": m.model_type, "params": {"total": p.total, "active": p.active},
         "source": m.source} for m, p in models]}


def hardware_tables(gpus: list[GpuSpec], systems: list[SystemSpec]) -> list[Table]:
    g = Table(title="GPUs")
    for col in ("name", "bf16 TFLOP/s", "fp8 TFLOP/s", "memory GiB", "HBM GB/s"):
        g.add_column(col, justify="left" if col == "name" else "right")
    for x in gpus:
        fp8 = x.tflops.get("fp8")
        g.add_row(x.name, f"{x.tflops.get('bf16', 0):g}", f"{fp8:g}" if fp8 else "-", f"{x.hbm_gib:g}",
                  f"{x.hbm_gb_per_s:g}")
    s = Table(title="Systems (--hardware)")
    for col in ("name", "GPU", "GPUs/node", "scale-up", "GB/s per GPU", "scale-out"):
        s.add_column(col, justify="left" if col in ("name", "GPU", "scale-up", "scale-out") else "right")
    for x in systems:
        dom = f" ({x.domain_gpus}-GPU domain)" if x.domain_gpus != x.gpus_per_node else ""
        out = f"{x.nics_per_node} x {x.nic_gbit_per_s:g} Gb/s {x.scaleout_fabric}" if x.nics_per_node else "-"
        s.add_row(x.name, x.gpu.name, str(x.gpus_per_node), x.intra_node_fabric + dom,
                  f"{x.intra_node_gb_per_s:g}", out)
    return [g, s]


def hardware_json(gpus: list[GpuSpec], systems: list[SystemSpec]) -> dict[str, Any]:
    return {"schema": SCHEMA, "gpus": [g.model_dump() for g in gpus],
            "systems": [{**s.model_dump(exclude={"gpu"}), "gpu": s.gpu.name} for s in systems]}


# --- estimate (training) -------------------------------------------------------------------------------------


def plan_json(plan: ParallelPlan) -> dict[str, Any]:
    d = plan.model_dump()
    return {**{k: d[k] for k in PLAN_KEYS}, "etp": plan.etp_resolved,
            **{k: d[k] for k in d if k not in PLAN_KEYS and k != "etp"}}


def memory_json(mem: TrainingMemory) -> dict[str, Any]:
    a = mem.activation_parts
    return {"weights": mem.weights, "gradients": mem.gradients, "optimizer": mem.optimizer,
            "activations": mem.activations, "other": mem.other, "total": mem.total, "capacity": mem.capacity,
            "fits": mem.fits, "headroom": mem.headroom, "stage": mem.stage,
            "activation_parts": {"layers": a.layers, "recompute_working": a.recompute_working,
                                 "embedding": a.embedding, "output": a.output}}


def estimate_json(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, params: ParamCounts,
                  mem: TrainingMemory) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "mode": "train",
        "model": model.name,
        "hardware": cluster.system.name,
        "nodes": cluster.num_nodes,
        "gpus": cluster.num_gpus,
        "plan": plan_json(plan),
        "params": {"total": params.total, "active": params.active, "per_gpu": mem.params_on_rank},
        "memory": memory_json(mem),
    }


def estimate_view(console: Console, model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan,
                  params: ParamCounts, mem: TrainingMemory) -> None:
    p = plan
    console.print(
        f"[bold]{model.name}[/] on {cluster.num_nodes} x {cluster.system.name} ({cluster.num_gpus} x "
        f"{cluster.system.gpu.name})  tp {p.tp} pp {p.pp} dp {p.dp} cp {p.cp} ep {p.ep} vpp {p.vpp}  "
        f"sp {'on' if p.sp else 'off'}  zero {p.zero}  recompute {p.recompute}  micro-batch {p.micro_batch}  "
        f"global batch {p.global_batch} ({p.num_microbatches} micro-batches/replica)  seq {p.seq_len}  {p.dtype}")
    console.print(f"parameters: total {billions(params.total)}, active {billions(params.active)}, "
                  f"on the most-loaded GPU {billions(mem.params_on_rank)} (pipeline stage {mem.stage})")
    t = Table(title="Memory per GPU (most-loaded rank)")
    t.add_column("part")
    t.add_column("GiB", justify="right")
    t.add_column("% of capacity", justify="right")
    t.add_column("formula", style="dim")
    a = mem.activation_parts
    rows = [
        ("weights", mem.weights, "mem.model_states"),
        ("gradients", mem.gradients, "mem.model_states"),
        ("optimizer states", mem.optimizer, "mem.model_states"),
        ("activations", mem.activations, "mem.activations"),
        ("  transformer layers", a.layers, "mem.activations, mem.inflight"),
        ("  recompute working set", a.recompute_working, "mem.activations"),
        ("  embedding (first stage)", a.embedding, "mem.activations"),
        ("  output + logits (last stage)", a.output, "mem.activations"),
        ("other (buffers, fragmentation)", mem.other, "mem.other"),
    ]
    for name, val, ref in rows:
        if name.startswith("  ") and val == 0:
            continue
        t.add_row(name, gib(val), f"{100 * val / mem.capacity:.1f}%", ref)
    t.add_row("[bold]total[/]", f"[bold]{gib(mem.total)}[/]", f"[bold]{100 * mem.total / mem.capacity:.1f}%[/]", "")
    t.add_row("capacity", gib(mem.capacity), "100.0%", "")
    console.print(t)
    if mem.fits:
        console.print(f"[bold green]FITS[/]: {gib(mem.total)} of {gib(mem.capacity)} GiB, "
                      f"headroom {gib(mem.headroom)} GiB")
    else:
        console.print(f"[bold red]DOES NOT FIT[/]: {gib(mem.total)} of {gib(mem.capacity)} GiB, "
                      f"short by {gib(-mem.headroom)} GiB")
