"""The report layer: every table and JSON document llmplan prints is built here, from result objects."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table

from llmplan.cost.comm import CommBreakdown
from llmplan.cost.memory import TrainingMemory
from llmplan.cost.step import StepTime, Throughput
from llmplan.estimate import TrainingEstimate
from llmplan.guard import Finding
from llmplan.search.grid import Workload
from llmplan.search.run import SearchResult, explain
from llmplan.search.serve import ServeSearchResult
from llmplan.serving import ServeEstimate
from llmplan.specs.serve import ServeJob
from llmplan.cost.params import ParamCounts
from llmplan.specs.hardware import GpuSpec, SystemSpec
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.topology.collectives import CollectiveTime
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
    f = float
    return {"weights": f(mem.weights), "gradients": f(mem.gradients), "optimizer": f(mem.optimizer),
            "activations": f(mem.activations), "other": f(mem.other), "total": f(mem.total),
            "capacity": f(mem.capacity), "fits": bool(mem.fits), "headroom": f(mem.headroom), "stage": int(mem.stage),
            "activation_parts": {"layers": f(a.layers), "recompute_working": f(a.recompute_working),
                                 "embedding": f(a.embedding), "output": f(a.output)}}


def fabric_names(system: SystemSpec) -> tuple[str, str]:
    up = {"nvswitch": "NVLink", "nvlink-mesh": "NVLink", "infinity-fabric": "Infinity Fabric",
          "pcie": "PCIe"}[system.intra_node_fabric]
    down = {"infiniband": "IB", "roce": "RoCE", "efa": "EFA", "none": "network"}[system.scaleout_fabric]
    return up, down


def comm_json(comm: CommBreakdown, system: SystemSpec) -> dict[str, Any]:
    up, down = fabric_names(system)
    out: dict[str, Any] = {}
    for axis, a in comm.axes.items():
        group = a.transfers[0].group if a.transfers else None
        out[axis] = {
            "bytes": a.bytes, "seconds": a.seconds, "collective": a.collectives,
            "group": group.describe(up, down) if group else "1 GPU (no communication)",
            "transfers": [{"collective": t.collective, "calls": t.calls, "message_bytes": t.message,
                           "bytes": t.bytes, "group_size": t.group.size, "nodes": t.group.nodes}
                          for t in a.transfers],
        }
    return out


def comm_table(comm: CommBreakdown, system: SystemSpec) -> Table:
    up, down = fabric_names(system)
    t = Table(title="Communication per step per GPU (most-loaded rank)")
    for col in ("axis", "collective", "calls", "message", "GiB sent", "group", "time s"):
        t.add_column(col, justify="right" if col in ("calls", "message", "GiB sent", "time s") else "left")
    for axis, a in comm.axes.items():
        if not a.transfers:
            t.add_row(axis, "-", "0", "-", "0", "1 GPU (no communication)", "0")
            continue
        for i, x in enumerate(a.transfers):
            t.add_row(axis if i == 0 else "", x.collective, f"{x.calls:,.0f}", human_bytes(x.message),
                      f"{x.bytes / GIB:,.2f}", x.group.describe(up, down) if i == 0 else "",
                      f"{a.seconds:,.3f}" if i == 0 else "")
    t.add_row("[bold]total[/]", "", "", "", f"[bold]{comm.bytes / GIB:,.2f}[/]", "", f"[bold]{comm.seconds:,.3f}[/]")
    return t


def human_bytes(x: float) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if x >= size:
            return f"{x / size:,.1f} {unit}"
    return f"{x:,.0f} B"


def collective_json(ct: CollectiveTime, group: str) -> dict[str, Any]:
    return {"schema": SCHEMA, "op": ct.op, "size_bytes": ct.size, "gpus": ct.ranks, "group": group,
            "algorithm": ct.algorithm, "time_s": ct.seconds, "algbw_gbps": ct.algbw / 1e9,
            "busbw_gbps": ct.busbw / 1e9}


def collective_view(console: Console, ct: CollectiveTime, group: str, system: SystemSpec) -> None:
    console.print(f"{ct.op} of {human_bytes(ct.size)} over {group} on {system.name} "
                  f"({'calibrated: ' + system.calibrated if system.calibrated else 'default efficiencies'})")
    console.print(f"algorithm {ct.algorithm}: time {ct.seconds * 1e6:,.1f} us, algbw {ct.algbw / 1e9:,.1f} GB/s, "
                  f"busbw {ct.busbw / 1e9:,.1f} GB/s (compare with nccl-tests' busbw column)")


def time_json(st: StepTime) -> dict[str, Any]:
    return {"step_s": float(st.total), "compute_s": float(st.compute), "bubble_s": float(st.bubble),
            "comm_exposed_s": float(st.comm_exposed), "optimizer_s": float(st.optimizer),
            "overhead_s": float(st.overhead),
            "exposed_s": {k: float(v) for k, v in st.exposed.items()},
            "compute_split_s": {"gemm": float(st.stage.gemm), "attention": float(st.stage.attention),
                                "memory_bound": float(st.stage.memory_bound), "per": "micro-batch"}}


def throughput_json(tp: Throughput, st: StepTime) -> dict[str, Any]:
    return {"tokens_per_s": float(tp.tokens_per_s), "tflops_per_gpu": float(tp.tflops_per_gpu),
            "mfu": float(tp.mfu), "hfu": float(tp.hfu), "comm_ratio": float(tp.comm_ratio),
            "model_flops_per_step": float(st.model_flops), "hardware_flops_per_step": float(st.hardware_flops)}


def estimate_json(e: TrainingEstimate) -> dict[str, Any]:
    c = e.cluster
    return {
        "schema": SCHEMA,
        "mode": "train",
        "model": e.model.name,
        "hardware": c.system.name,
        "calibrated": c.system.calibrated,
        "nodes": c.num_nodes,
        "gpus": c.num_gpus,
        "plan": plan_json(e.plan),
        "stage_layers": list(e.stage_layers),
        "params": {"total": e.params.total, "active": e.params.active, "per_gpu": float(e.memory.params_on_rank)},
        "memory": memory_json(e.memory),
        "time": time_json(e.time),
        "throughput": throughput_json(e.throughput, e.time),
        "bottleneck": e.bottleneck,
        "comm": comm_json(e.comm, c.system),
    }


def split_text(layers: tuple[int, ...] | list[int]) -> str:
    """Stage layer counts in short form: '7+8x14+7' (runs of equal counts collapsed)."""
    runs: list[list[int]] = []
    for n in layers:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    return "+".join(f"{n}x{k}" if k > 1 else str(n) for n, k in runs)


def estimate_view(console: Console, e: TrainingEstimate) -> None:
    memory_view(console, e.model, e.cluster, e.plan, e.params, e.memory)
    if len(set(e.stage_layers)) > 1:
        console.print(f"uneven pipeline stages: {split_text(e.stage_layers)} layers (first to last)")
    console.print(comm_table(e.comm, e.cluster.system))
    console.print(time_table(e))


def time_table(e: TrainingEstimate) -> Table:
    st, tp = e.time, e.throughput
    t = Table(title="Step time (most-loaded stage)")
    t.add_column("part")
    t.add_column("seconds", justify="right")
    t.add_column("% of step", justify="right")
    t.add_column("formula", style="dim")
    rows = [("compute", st.compute, "compute.time"), ("pipeline bubble", st.bubble, "step.time"),
            *((f"exposed {a.upper()} communication", v, "step.time") for a, v in st.exposed.items() if v > 0),
            ("optimizer step + clipping", st.optimizer, "compute.optimizer"),
            ("fixed per-step overhead", st.overhead, "step.overhead")]
    for name, val, ref in rows:
        t.add_row(name, f"{val:,.4f}", f"{100 * val / st.total:.1f}%", ref)
    t.add_row("[bold]step[/]", f"[bold]{st.total:,.4f}[/]", "100.0%", "")
    t.caption = (f"{tp.tokens_per_s:,.0f} tokens/s, {tp.tflops_per_gpu:,.1f} TFLOP/s per GPU, MFU {100 * tp.mfu:.1f}%, "
                 f"HFU {100 * tp.hfu:.1f}%, exposed communication {100 * tp.comm_ratio:.1f}% of the step; "
                 f"bottleneck: {e.bottleneck}")
    return t


def memory_view(console: Console, model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan,
                params: ParamCounts, mem: TrainingMemory) -> None:
    p = plan
    console.print(
        f"[bold]{model.name}[/] on {cluster.num_nodes} x {cluster.system.name} ({cluster.num_gpus} x "
        f"{cluster.system.gpu.name})  tp {p.tp} pp {p.pp} dp {p.dp} cp {p.cp} ep {p.ep} vpp {p.vpp}  "
        f"sp {'on' if p.sp else 'off'}  zero {p.zero}  recompute {p.recompute}  micro-batch {p.micro_batch}  "
        f"global batch {p.global_batch} ({p.num_microbatches} micro-batches/replica)  seq {p.seq_len}  {p.dtype}")
    if cluster.system.calibrated:
        console.print(f"[cyan]calibrated profile[/]: {cluster.system.calibrated}")
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


# --- search --------------------------------------------------------------------------------------------------


def plan_cells(p: ParallelPlan) -> list[str]:
    etp = f"/{p.etp_resolved}" if p.ep > 1 else ""
    uneven = "*" if (p.pp_first or p.pp_last or p.pp_layers) else ""
    return [str(p.tp), f"{p.pp}{uneven}", str(p.dp), str(p.cp), f"{p.ep}{etp}", str(p.vpp), "on" if p.sp else "off",
            str(p.zero), p.recompute, str(p.micro_batch)]


PLAN_HEAD = ["tp", "pp", "dp", "cp", "ep", "vpp", "sp", "zero", "recompute", "mb"]


def ranked_table(title: str, rows: list[TrainingEstimate], equivalents: list[int] | None = None) -> Table:
    t = Table(title=title)
    for col in ["#", *PLAN_HEAD, "mem GiB", "headroom", "step s", "tokens/s", "MFU", "bottleneck"]:
        t.add_column(col, justify="left" if col in ("recompute", "bottleneck") else "right")
    for i, e in enumerate(rows, 1):
        m, tp = e.memory, e.throughput
        same = equivalents[i - 1] if equivalents and i <= len(equivalents) else 0
        t.add_row(f"{i}" + (f" +{same}" if same else ""), *plan_cells(e.plan), gib(m.total), gib(m.headroom), f"{float(e.time.total):,.3f}",
                  f"{float(tp.tokens_per_s):,.0f}", f"{100 * float(tp.mfu):.1f}%", e.bottleneck)
    notes = []
    uneven = [f"#{i} {split_text(e.stage_layers)}" for i, e in enumerate(rows, 1) if len(set(e.stage_layers)) > 1]
    if uneven:
        notes.append("* uneven pipeline stages (layers, first to last): " + ", ".join(uneven))
    if equivalents and any(equivalents):
        notes.append("+N: N more plans with the same predicted throughput and memory (the one shown is preferred: "
                     "smaller cp, lower ZeRO stage, fewer stages, smaller micro-batch and TP)")
    t.caption = "\n".join(notes) or None
    return t


def plan_label(p: ParallelPlan) -> str:
    return (f"tp{p.tp} pp{p.pp} dp{p.dp} cp{p.cp}" + (f" ep{p.ep}" if p.ep > 1 else "") + (f" vpp{p.vpp}" if p.vpp > 1
            else "") + f" zero{p.zero} {p.recompute} mb{p.micro_batch}")


def explain_line(a: TrainingEstimate, b: TrainingEstimate, what: str) -> str:
    """One line: a's throughput against b's and the three largest step-time differences."""
    d = explain(a, b)
    parts = sorted(((k, v) for k, v in d.items() if k.endswith("_s") and k != "step_s" and abs(v) > 1e-9),
                   key=lambda kv: -abs(kv[1]))[:3]
    why = ", ".join(f"{k[:-2].replace('exposed_', 'exposed ')} {v:+.3g} s" for k, v in parts)
    return (f"#1 vs {what} ({plan_label(b.plan)}): {d['throughput_ratio']:.2f}x the throughput"
            + (f"; {why}" if why else "") + f"; memory {d['memory_bytes'] / GIB:+.1f} GiB")


def explain_table(a: TrainingEstimate, b: TrainingEstimate, what: str) -> Table:
    t = Table(title=f"Why #1 ({plan_label(a.plan)}) beats {what} ({plan_label(b.plan)})")
    t.add_column("part")
    t.add_column("#1 s", justify="right")
    t.add_column(f"{what} s", justify="right")
    t.add_column("difference", justify="right")
    rows = [("compute", a.time.compute, b.time.compute), ("bubble", a.time.bubble, b.time.bubble),
            *((f"exposed {k}", a.time.exposed[k], b.time.exposed[k]) for k in a.time.exposed),
            ("optimizer", a.time.optimizer, b.time.optimizer), ("step", a.time.total, b.time.total)]
    for name, x, y in rows:
        if float(x) or float(y):
            t.add_row(name, f"{float(x):,.3f}", f"{float(y):,.3f}", f"{float(x - y):+,.3f}")
    t.add_row("memory GiB", gib(a.memory.total), gib(b.memory.total), f"{float(a.memory.total - b.memory.total) / GIB:+,.2f}")
    return t


def pruned_table(res: SearchResult) -> Table:
    t = Table(title=f"Pruned: {res.considered - res.feasible:,} of {res.considered:,} plans")
    t.add_column("rule")
    t.add_column("plans cut", justify="right")
    t.add_column("example")
    for p in res.pruned:
        t.add_row(p.rule, f"{p.count:,}", p.example)
    return t


def budget_json(e: TrainingEstimate, train_tokens: float) -> dict[str, float]:
    seconds = train_tokens / float(e.throughput.tokens_per_s)
    return {"train_tokens": train_tokens, "time_to_train_s": seconds, "time_to_train_days": seconds / 86400,
            "gpu_hours": seconds * e.cluster.num_gpus / 3600}


def search_json(res: SearchResult, w: Workload, cluster: ClusterSpec, model: ModelSpec,
                train_tokens: float) -> dict[str, Any]:
    return {
        "schema": SCHEMA, "mode": "train", "model": model.name, "hardware": cluster.system.name,
        "nodes": cluster.num_nodes, "gpus": cluster.num_gpus, "objective": res.objective,
        "workload": {"global_batch": w.global_batch, "seq_len": w.seq_len, "dtype": w.dtype},
        "considered": res.considered, "feasible": res.feasible,
        "pruned": {p.rule: p.count for p in res.pruned},
        "pruned_examples": {p.rule: p.example for p in res.pruned},
        "search_s": res.seconds,
        "plans": [{"rank": i, **estimate_json(e), "budget": budget_json(e, train_tokens),
                   "equivalent": res.equivalents[i - 1] if i <= len(res.equivalents) else 0}
                  for i, e in enumerate(res.ranked, 1)],
        **({"conventional": estimate_json(res.conventional)} if res.conventional else {}),
        **({"explain": {**({"vs_second": explain(res.ranked[0], res.ranked[1])} if len(res.ranked) > 1 else {}),
                        **({"vs_conventional": explain(res.ranked[0], res.conventional)} if res.conventional else {})}}
           if res.ranked else {}),
        "pareto": [estimate_json(e) for e in res.pareto],
        **({"closest": estimate_json(res.closest), "suggestions": res.suggestions} if res.closest else {}),
    }


def search_view(console: Console, res: SearchResult, w: Workload, cluster: ClusterSpec, model: ModelSpec,
                train_tokens: float, full_explain: bool = False) -> None:
    console.print(f"[bold]{model.name}[/] on {cluster.num_nodes} x {cluster.system.name} ({cluster.num_gpus} GPUs): "
                  f"global batch {w.global_batch} x {w.seq_len} tokens, {w.dtype}; objective {res.objective}")
    console.print(f"evaluated {res.considered:,} plans in {res.seconds:.2f} s; {res.feasible:,} fit")
    if res.ranked:
        console.print(ranked_table("Best plans", res.ranked, res.equivalents))
        b = budget_json(res.ranked[0], train_tokens)
        console.print(f"best plan: {train_tokens / 1e12:g}T tokens in {b['time_to_train_days']:,.1f} days, "
                      f"{b['gpu_hours']:,.0f} GPU-hours")
        best = res.ranked[0]
        if res.conventional is not None and res.conventional.plan != best.plan:
            console.print(explain_line(best, res.conventional, "conventional"))
        if full_explain:
            if len(res.ranked) > 1:
                console.print(explain_table(best, res.ranked[1], "#2"))
            if res.conventional is not None:
                console.print(explain_table(best, res.conventional, "conventional"))
        console.print(ranked_table("Pareto front: throughput vs memory headroom (plans within 2x of the best)",
                                   res.pareto))
    console.print(pruned_table(res))
    if res.closest is not None:
        e = res.closest
        console.print(f"[bold red]NO PLAN FITS[/]. Closest: {' '.join(f'{h} {c}' for h, c in zip(PLAN_HEAD, plan_cells(e.plan)))} "
                      f"needs {gib(e.memory.total)} of {gib(e.memory.capacity)} GiB per GPU.")
        console.print("It would fit with: " + "; ".join(res.suggestions))


# --- inference -------------------------------------------------------------------------------------------------


def serve_json(e: ServeEstimate) -> dict[str, Any]:
    mem, t, p, j = e.memory, e.timing, e.plan, e.job
    return {
        "schema": SCHEMA, "mode": "infer", "model": e.model.name, "hardware": e.cluster.system.name,
        "nodes": e.cluster.num_nodes, "gpus": e.cluster.num_gpus,
        "plan": p.model_dump(mode="json"), "workload": j.model_dump(mode="json"),
        "memory": {"weights": mem.weights, "kv_cache": mem.kv_cache, "activations": mem.activations,
                   "other": mem.other, "total": mem.total, "capacity": mem.capacity, "fits": mem.fits,
                   "kv_available": mem.kv_available, "kv_blocks": mem.kv_blocks},
        "kv_bytes_per_token": e.kv_bytes_per_token,
        "max_concurrent_seqs": mem.max_concurrent_seqs,
        "ttft_s": float(t.ttft), "tpot_s": float(t.tpot), "e2e_s": float(t.e2e),
        "throughput": {"tokens_per_s": e.tokens_per_s, "tokens_per_s_per_replica": float(t.tokens_per_s_replica),
                       "tokens_per_s_per_gpu": e.tokens_per_s / p.num_gpus},
        "slo": {"ttft_s": j.ttft_slo_s, "tpot_s": j.tpot_slo_s, "max_batch": e.slo_batch,
                "tokens_per_s": e.slo_tokens_per_s},
        "prefix_cache": {"hit_rate": j.prefix_hit_rate, "prefill_tokens_saved_fraction": e.prefill_saved_fraction,
                         "ttft_without_cache_s": e.ttft_without_prefix_cache},
        "warnings": list(e.warnings),
    }


def serve_view(console: Console, e: ServeEstimate) -> None:
    mem, t, p, j = e.memory, e.timing, e.plan, e.job
    console.print(f"[bold]{e.model.name}[/] serving on {e.cluster.num_nodes} x {e.cluster.system.name}: "
                  f"tp {p.tp} pp {p.pp} replicas {p.dp} ep {p.ep}, weights {p.weight_dtype}, KV {p.kv_dtype}; "
                  f"{j.input_len} in / {j.output_len} out tokens, {j.batch} concurrent sequences per replica")
    for w in e.warnings:
        console.print(f"[yellow]warning[/]: {w}")
    tb = Table(title="Memory per GPU")
    for col in ("part", "GiB", "% of usable", "formula"):
        tb.add_column(col, justify="right" if col in ("GiB", "% of usable") else "left")
    for name, val, ref in (("weights", mem.weights, "infer.weights"), ("KV cache", mem.kv_cache, "infer.kv"),
                           ("activations", mem.activations, "infer.activations"),
                           ("other (CUDA graphs, NCCL, runtime)", mem.other, "mem.other")):
        tb.add_row(name, gib(val), f"{100 * val / mem.capacity:.1f}%", ref)
    tb.add_row("[bold]total[/]", f"[bold]{gib(mem.total)}[/]", f"{100 * mem.total / mem.capacity:.1f}%", "")
    tb.add_row("usable (utilisation x HBM)", gib(mem.capacity), "100.0%", "")
    console.print(tb)
    console.print(f"KV cache: {e.kv_bytes_per_token / 1024:,.1f} KiB per token (whole model, one sequence); "
                  f"{gib(max(mem.kv_available, 0))} GiB free for it per GPU = {mem.kv_blocks:,} blocks of "
                  f"{j.block_size} tokens = at most {mem.max_concurrent_seqs:,} sequences of {j.context} tokens")
    if mem.fits:
        console.print(f"[bold green]FITS[/]: {j.batch} sequences need {gib(mem.total)} of {gib(mem.capacity)} GiB")
    elif mem.kv_available <= 0:
        console.print(f"[bold red]DOES NOT FIT[/]: weights, activations and runtime exceed the usable memory by "
                      f"{gib(-mem.kv_available)} GiB; raise tp/pp or quantise the weights")
    else:
        console.print(f"[bold red]DOES NOT FIT[/]: {j.batch} sequences need {gib(mem.total)} of {gib(mem.capacity)} "
                      f"GiB; at most {mem.max_concurrent_seqs} fit")
    console.print(f"TTFT {float(t.ttft) * 1e3:,.1f} ms, TPOT {float(t.tpot) * 1e3:,.2f} ms, end-to-end "
                  f"{float(t.e2e):,.2f} s; {e.tokens_per_s:,.0f} output tokens/s "
                  f"({e.tokens_per_s / p.num_gpus:,.0f} per GPU)")
    if j.prefix_hit_rate:
        console.print(f"prefix cache: {100 * j.prefix_hit_rate:.0f}% of each prompt cached; TTFT "
                      f"{float(t.ttft) * 1e3:,.1f} ms instead of {e.ttft_without_prefix_cache * 1e3:,.1f} ms")
    if e.slo_batch is not None:
        console.print(f"SLOs (TTFT {j.ttft_slo_s} s, TPOT {j.tpot_slo_s} s): up to {e.slo_batch} concurrent "
                      f"sequences per replica, {e.slo_tokens_per_s or 0:,.0f} output tokens/s"
                      if e.slo_batch else "[bold red]no concurrency meets the SLOs[/]")


def serve_search_table(title: str, rows: list[ServeEstimate]) -> Table:
    t = Table(title=title)
    for col in ("#", "GPUs", "tp", "pp", "replicas", "ep", "weights", "KV", "batch", "max seqs", "TTFT ms",
                "TPOT ms", "tokens/s", "per GPU"):
        t.add_column(col, justify="right")
    for i, e in enumerate(rows, 1):
        p = e.plan
        t.add_row(str(i), str(p.num_gpus), str(p.tp), str(p.pp), str(p.dp), str(p.ep), p.weight_dtype, p.kv_dtype,
                  str(e.job.batch), f"{e.memory.max_concurrent_seqs:,}", f"{float(e.timing.ttft) * 1e3:,.1f}",
                  f"{float(e.timing.tpot) * 1e3:,.2f}", f"{e.tokens_per_s:,.0f}", f"{e.tokens_per_s / p.num_gpus:,.0f}")
    return t


def serve_search_json(res: ServeSearchResult, model: ModelSpec, cluster: ClusterSpec, job: ServeJob) -> dict[str, Any]:
    return {"schema": SCHEMA, "mode": "infer", "model": model.name, "hardware": cluster.system.name,
            "gpus": cluster.num_gpus, "objective": res.objective, "request_rate": res.request_rate,
            "workload": job.model_dump(mode="json"), "considered": res.considered, "feasible": res.feasible,
            "pruned": {p.rule: p.count for p in res.pruned}, "pruned_examples": {p.rule: p.example for p in res.pruned},
            "search_s": res.seconds, "plans": [{"rank": i, **serve_json(e)} for i, e in enumerate(res.ranked, 1)]}


def serve_search_view(console: Console, res: ServeSearchResult, model: ModelSpec, cluster: ClusterSpec,
                      job: ServeJob) -> None:
    slo = f", SLOs TTFT {job.ttft_slo_s} s / TPOT {job.tpot_slo_s} s" if job.ttft_slo_s or job.tpot_slo_s else ""
    console.print(f"[bold]{model.name}[/] serving on up to {cluster.num_gpus} x {cluster.system.gpu.name}: "
                  f"{job.input_len} in / {job.output_len} out tokens{slo}; objective {res.objective}"
                  + (f" at {res.request_rate} requests/s" if res.request_rate else ""))
    console.print(f"evaluated {res.considered} layouts in {res.seconds:.2f} s; {res.feasible} fit")
    if res.ranked:
        console.print(serve_search_table("Best serving plans", res.ranked))
    t = Table(title="Pruned layouts")
    t.add_column("rule")
    t.add_column("layouts", justify="right")
    t.add_column("example")
    for p in res.pruned:
        t.add_row(p.rule, str(p.count), p.example)
    console.print(t)


def export_view(console: Console, paths: list, skipped: dict[str, str]) -> None:
    for p in paths:
        console.print(f"wrote {p}")
    for target, why in skipped.items():
        console.print(f"[yellow]skipped {target}[/]: {why}")


# --- check -----------------------------------------------------------------------------------------------------


def check_json(findings: list[Finding], diff: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {"schema": SCHEMA, "passed": sum(f.ok for f in findings), "failed": sum(not f.ok for f in findings),
            "checks": [{"name": f.name, "file": f.file, "line": f.line, "field": f.field, "ok": f.ok,
                        "message": f.message, **({"details": f.details} if f.details else {})} for f in findings],
            **({"diff": diff} if diff is not None else {})}


def check_github(findings: list[Finding]) -> str:
    """GitHub Actions workflow commands: one ::error per failed check, pointing at the spec field."""
    def esc(s: str) -> str:
        return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")

    lines = []
    for f in findings:
        if f.ok:
            continue
        loc = f"file={f.file}" + (f",line={f.line}" if f.line else "")
        lines.append(f"::error {loc},title=llmplan check: {esc(f.name)}::{esc(f.message)}")
    lines.append(f"llmplan check: {sum(f.ok for f in findings)} passed, {sum(not f.ok for f in findings)} failed")
    return "\n".join(lines)


def check_junit(findings: list[Finding]) -> str:
    import xml.etree.ElementTree as ET

    suite = ET.Element("testsuite", name="llmplan check", tests=str(len(findings)),
                       failures=str(sum(not f.ok for f in findings)), errors="0")
    for f in findings:
        case = ET.SubElement(suite, "testcase", classname="llmplan.check", name=f.name, file=f.file,
                             **({"line": str(f.line)} if f.line else {}))
        if not f.ok:
            fail = ET.SubElement(case, "failure", message=f.message)
            fail.text = f.message + (f"\nfield: {f.field}" if f.field else "")
    suites = ET.Element("testsuites")
    suites.append(suite)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode")


def check_view(console: Console, findings: list[Finding], diff: list[dict[str, Any]] | None) -> None:
    t = Table(title="llmplan check")
    for col in ("check", "result", "where", "message"):
        t.add_column(col)
    for f in findings:
        where = f.file + (f":{f.line}" if f.line else "")
        t.add_row(f.name, "[green]pass[/]" if f.ok else "[bold red]FAIL[/]", where, f.message)
    console.print(t)
    for d in diff or []:
        if d["status"] == "added":
            console.print(f"{d['file']}: new since the base revision")
            continue
        a, b = d["params"]
        console.print(f"[bold]{d['file']}[/] changed: " + "; ".join(f"{k} {v[0]!r} -> {v[1]!r}"
                                                                   for k, v in d["fields"].items())
                      + f"; parameters {a / 1e9:.2f}B -> {b / 1e9:.2f}B")
        for row in d["plans"]:
            def fmt(x: dict) -> str:
                return "invalid" if not x.get("valid") else f"{x['memory_gib']:.1f} GiB, step {x['step_s']:.3f} s"
            console.print(f"  {row['plan']}: {fmt(row['base'])} -> {fmt(row['now'])}")
    console.print(f"{sum(f.ok for f in findings)} passed, {sum(not f.ok for f in findings)} failed")


# --- bench -----------------------------------------------------------------------------------------------------


def _fmt_value(v: float, unit: str) -> str:
    if unit == "B":
        return human_bytes(v)
    if unit == "s":
        return f"{v * 1e3:,.3f} ms" if v < 1 else f"{v:,.3f} s"
    return f"{v:,.4g} {unit}"


def bench_tables(rows: list) -> list[Table]:
    tables = []
    for component in dict.fromkeys(r.component for r in rows):
        t = Table(title=component)
        for col in ("item", "predicted", "measured", "error", "verdict", "note"):
            t.add_column(col, justify="right" if col in ("predicted", "measured", "error") else "left")
        for r in (x for x in rows if x.component == component):
            style = {"ok": "green", "MISMATCH": "bold red"}.get(r.verdict, "dim")
            t.add_row(r.item, _fmt_value(r.predicted, r.unit) if r.predicted else "-", _fmt_value(r.measured, r.unit),
                      f"{100 * r.error:+.2f}%" if r.predicted else "-", f"[{style}]{r.verdict}[/]", r.note)
        tables.append(t)
    return tables


def bench_json(cfg, run, rows: list) -> dict[str, Any]:
    return {
        "schema": SCHEMA, "model": cfg.model.name, "hardware": cfg.cluster.system.name, "nproc": cfg.nproc,
        "backend": cfg.backend, "seconds": run.seconds, "timed_out": run.timed_out,
        "failures": [{"rank": f.rank, "phase": f.phase, "error": f.error} for f in run.failures],
        "device": run.ranks[0]["device_name"] if run.ranks else None,
        "host": run.ranks[0]["host"] if run.ranks else None,
        "comparisons": [{"component": r.component, "item": r.item, "predicted": r.predicted, "measured": r.measured,
                         "unit": r.unit, "error": r.error, "verdict": r.verdict, "note": r.note} for r in rows],
        "raw": run.ranks,
    }
