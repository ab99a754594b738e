"""`llmplan estimate` (training): plan, memory, communication and step-time documents and tables."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from llmplan.cost.comm import CommBreakdown, comm_seconds, cp_mixer_split, transfer_seconds
from llmplan.cost.goodput import Goodput
from llmplan.cost.grad_lifetime import chunk_gradients_freed
from llmplan.cost.memory import TrainingMemory
from llmplan.cost.model_states import grad_prescaled, optimizer_parts
from llmplan.cost.sparse_gather import indexer_loss
from llmplan.cost.params import ParamCounts
from llmplan.cost.runtime_memory import mla_turns_tp_overlap_off, userbuffers_on
from llmplan.cost.step import StepTime, Throughput
from llmplan.advice import advice_json
from llmplan.estimate import TrainingEstimate
from llmplan.intervals import training_interval
from llmplan.report.common import (ReportTable, SCHEMA, billions, capped_text, counted, fabric_names,
                                   flex_backend_shown, gib, human_bytes, power_text)
from llmplan.units import DAY, GIB
from llmplan.specs.hardware import SystemSpec
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ClusterSpec, ParallelPlan, bf16_layer_counts

PLAN_KEYS = ("tp", "pp", "dp", "cp", "ep", "vpp", "sp", "zero", "recompute", "micro_batch", "global_batch",
             "seq_len", "dtype")




def plan_json(plan: ParallelPlan) -> dict[str, Any]:
    """The plan's fields, and only those (a tool rebuilds ParallelPlan(**plan) from them): etp resolved
    (etp_resolved), grad_prescale as the plan asks it (what runs is the estimate's top-level grad_prescaled)."""
    d = flex_backend_shown(plan.model_dump())  # null where the dispatcher has no backend (read back as default)
    return {**{k: d[k] for k in PLAN_KEYS}, "etp": plan.etp_resolved,
            **{k: d[k] for k in d if k not in PLAN_KEYS and k != "etp"}}


def host_json(mem: TrainingMemory, cluster: ClusterSpec) -> dict[str, Any]:
    """The node's host memory against what activation offload puts there (bytes; None where not known)."""
    s, g = cluster.system, cluster.gpus_per_node_used
    per_node = float(mem.activation_parts.offloaded) * g
    usable = s.host_usable_bytes
    return {"offloaded_per_node": per_node, "gpus_per_node": g, "host_memory_gb": s.host_memory_gb,
            "usable_fraction": s.host_memory_usable_fraction, "usable_per_node": usable,
            "fits": None if usable is None else bool(per_node <= usable)}


def memory_json(mem: TrainingMemory, plan: ParallelPlan, cluster: ClusterSpec | None = None) -> dict[str, Any]:
    a = mem.activation_parts
    f = float
    parts = optimizer_parts(plan, mem.optimizer, mem.muon_saving)
    host = {"host": host_json(mem, cluster)} if cluster is not None else {}
    return {**host, "optimizer_parts": {"master": f(parts.master), "moments": f(parts.moments)},
            "weights": f(mem.weights), "gradients": f(mem.gradients), "optimizer": f(mem.optimizer),
            "activations": f(mem.activations), "other": f(mem.other), "total": f(mem.total),
            "capacity": f(mem.capacity), "fits": bool(mem.fits), "headroom": f(mem.headroom), "stage": int(mem.stage),
            "activation_parts": {"layers": f(a.layers), "recompute_working": f(a.recompute_working),
                                 "embedding": f(a.embedding), "output": f(a.output),
                                 "cp_workspace": f(a.cp_workspace), "indexer_workspace": f(a.indexer_workspace)},
            "offloaded_to_host": f(a.offloaded),
            "optimizer_copies": f(mem.optimizer_copies), "after_backward": f(mem.after_backward),
            "fresh_grad": f(mem.fresh_grad),
            "fragmentation": f(mem.fragmentation), "churned": f(mem.churned),
            "runtime_parts": None if mem.runtime is None else {
                "context": f(mem.runtime.context), "cublas": f(mem.runtime.cublas), "nccl": f(mem.runtime.nccl),
                "userbuffers": f(mem.runtime.userbuffers), "nccl_communicators": int(mem.runtime.communicators)}}


def comm_json(comm: CommBreakdown, system: SystemSpec) -> dict[str, Any]:
    up, down = fabric_names(system)
    out: dict[str, Any] = {}
    for axis, a in comm.axes.items():
        group = a.transfers[0].group if a.transfers else None
        out[axis] = {
            "bytes": float(a.bytes), "seconds": float(a.seconds), "collective": a.collectives,
            "group": group.describe(up, down) if group else "1 GPU (no communication)",
            "transfers": [{"collective": t.collective,
                           "calls": t.calls if isinstance(t.calls, int) else float(t.calls),
                           "message_bytes": float(t.message), "bytes": float(t.bytes), "group_size": t.group.size,
                           "nodes": t.group.nodes, "step_end": bool(t.step_end)}
                          for t in a.transfers],
        }
    # The cp axis's seconds by kind: the ring (and PyTorch's CP), a hybrid's mixer all-to-alls, Transformer
    # Engine's a2a and all_gather collectives (CommSeconds; docs/formulas.md#comm.cp_a2a)
    cs = comm_seconds(comm, system)
    ring = sum(transfer_seconds(t, system) for t in cp_mixer_split(comm.axes["cp"].transfers)[0] if not t.te_cp)
    out["cp"]["seconds_by_kind"] = {"cp_ring": float(ring),
                                    "cp_mixers": float(cs.cp_mixers), "cp_a2a": float(cs.cp_a2a),
                                    "cp_allgather": float(cs.cp_allgather)}
    # the tp axis's once-a-step all-reduce of the duplicated parameters' gradients (docs/formulas.md#comm.tp_grad_sync)
    out["tp"]["step_end_seconds"] = float(cs.tp_step_end)
    return out


def comm_table(comm: CommBreakdown, system: SystemSpec) -> Table:
    up, down = fabric_names(system)
    t = ReportTable(title="Communication per step per GPU (most-loaded rank)")
    for col in ("axis", "collective", "calls", "message", "GiB sent", "group", "time s"):
        t.add_column(col, justify="right" if col in ("calls", "message", "GiB sent", "time s") else "left")
    for axis, a in comm.axes.items():
        if not a.transfers:
            t.add_row(axis, "-", "0", "-", "0", "none (1 GPU)", "0")  # short: no word folded at 80 columns
            continue
        for i, x in enumerate(a.transfers):  # a group named where it changes (hybrid sharding's replicas)
            new_group = i == 0 or x.group != a.transfers[i - 1].group
            t.add_row(axis if i == 0 else "", x.collective, f"{x.calls:,.0f}", human_bytes(x.message),
                      f"{x.bytes / GIB:,.2f}", x.group.describe(up, down) if new_group else "",
                      f"{a.seconds:,.3f}" if i == 0 else "")
    t.add_row("[bold]total[/]", "", "", "", f"[bold]{comm.bytes / GIB:,.2f}[/]", "", f"[bold]{comm.seconds:,.3f}[/]")
    return t


def time_json(st: StepTime) -> dict[str, Any]:
    return {"step_s": float(st.total), "compute_s": float(st.compute), "bubble_s": float(st.bubble),
            "comm_exposed_s": float(st.comm_exposed), "optimizer_s": float(st.optimizer),
            "overhead_s": float(st.overhead),
            "overheads_s": {k: float(v) for k, v in st.overheads.items()},
            "exposed_s": {k: float(v) for k, v in st.exposed.items()},
            "compute_split_s": {"gemm": float(st.stage.gemm), "attention": float(st.stage.attention),
                                "memory_bound": float(st.stage.memory_bound), "per": "micro-batch"}}


def throughput_json(tp: Throughput, st: StepTime) -> dict[str, Any]:
    return {"tokens_per_s": float(tp.tokens_per_s), "tflops_per_gpu": float(tp.tflops_per_gpu),
            "mfu": float(tp.mfu), "hfu": float(tp.hfu), "comm_ratio": float(tp.comm_ratio),
            "mfu_low_precision": None if tp.mfu_low_precision is None else float(tp.mfu_low_precision),
            "model_flops_per_step": float(st.model_flops), "hardware_flops_per_step": float(st.hardware_flops)}


def goodput_json(g: Goodput, tokens_per_s: float | None = None) -> dict[str, Any]:
    """The goodput block of a training plan (docs/formulas.md#goodput.fraction); seconds and bytes. With the
    plan's tokens/s: the tokens/s that survive failures and the wall-clock days per trillion tokens."""
    f = float
    eff = {} if tokens_per_s is None else {"effective_tokens_per_s": tokens_per_s * f(g.useful),
                                           "effective_days_per_trillion_tokens": _days_per_trillion(tokens_per_s, g)}
    return {"mtbf_h": f(g.mtbf_s) / 3600, "checkpoint_bytes": f(g.checkpoint_bytes), "checkpoint_s": f(g.checkpoint_s),
            "interval_s": f(g.interval_s), "restart_s": f(g.restart_s), "goodput": f(g.useful), "mode": g.mode,
            "checkpoint_rank_bytes": f(g.rank_bytes), "blocking_s": f(g.blocking_s), "lost_s": f(g.lost_s),
            "shares": {k: f(getattr(g, k)) for k in g.PARTS}, **eff}


def duration(seconds: float) -> str:
    """Seconds in the unit that reads best: 2.8 s, 4.2 min, 3.1 h."""
    if seconds != seconds or seconds == float("inf"):
        return "never"
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min" if seconds < 7200 else \
        f"{seconds / 3600:,.1f} h"


def _days_per_trillion(tokens_per_s: float, g: Goodput) -> float:
    share = float(g.useful)
    return 1e12 / (tokens_per_s * share) / DAY if share > 0 and tokens_per_s > 0 else float("inf")


def goodput_lines(g: Goodput, tokens_per_s: float) -> list[str]:
    """Two lines under 80 columns: the goodput, the failure rate and the effective time per trillion tokens;
    the checkpoint and the restart."""
    where = {"sync": "storage", "async": "storage, async", "memory": "peer memory"}[g.mode]
    return [f"goodput {100 * float(g.useful):.1f}% (job MTBF {duration(float(g.mtbf_s))}, {g.mode} checkpoints): "
            f"1T tokens in {_days_per_trillion(tokens_per_s, g):,.1f} days",
            f"  checkpoint {float(g.checkpoint_bytes) / 1e12:,.2f} TB to {where} in "
            f"{duration(float(g.checkpoint_s))} every {duration(float(g.interval_s))}; restart "
            f"{duration(float(g.restart_s))}"]


def sustained_fraction(e: TrainingEstimate) -> float:
    """The share of the peak the plan's tensor-core work is priced at: the GPU's sustained clock fraction
    (after any power cap; docs/formulas.md#step.power)."""
    return e.cluster.system.gpu.sustained_clock_fraction


def estimate_json(e: TrainingEstimate, advice: list | None = None) -> dict[str, Any]:
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
        # True wherever the buckets are pre-scaled as the plan runs, the fp32-sum reduce-scatter forcing it too
        # (cost.model_states.grad_prescaled, the rule the pricing and the exports read); the plan's grad_prescale
        # keeps the value asked (keys are added, never given a new meaning)
        "grad_prescaled": bool(grad_prescaled(e.plan)),
        # how the DSA lightning indexer is trained as priced (cost.sparse_gather.indexer_loss: the plan's
        # indexer_loss, else the model's, else the V4 path's; "off" for a model without an indexer); the plan's
        # indexer_loss keeps the value asked (None: the default)
        "indexer_loss_priced": indexer_loss(e.model, e.plan, c.system.gpu),
        "stage_layers": list(e.stage_layers),
        "params": {"total": e.params.total, "active": e.params.active, "per_gpu": float(e.memory.params_on_rank)},
        "memory": memory_json(e.memory, e.plan, c),
        "time": {**time_json(e.time), "sustained_fraction": sustained_fraction(e)},
        "throughput": throughput_json(e.throughput, e.time),
        "bottleneck": e.bottleneck,
        "achievable": bool(e.memory.fits),
        "interval": training_interval(e),
        "comm": comm_json(e.comm, c.system),
        "operators": [{"operator": u.operator, "kernel": u.kernel, "available": u.available, "fallback": u.fallback,
                       "modelled": u.modelled} for u in e.operators],
        "fallback_cost": {"memory_bytes": e.fallback_cost[0], "step_s": e.fallback_cost[1]},
        **({"advice": advice_json(advice)} if advice is not None else {}),
        **({"context_extension": ext} if (ext := context_extension(e.model, e.plan)) else {}),
        **({"tp_overlap_off": tp_note} if (tp_note := tp_overlap_note(e.model, e.plan)) else {}),
        **({"tp_overlap_gain_s": e.tp_overlap_gain} if e.tp_overlap_gain is not None else {}),
        **({"tp_overlap_slower": loss} if (loss := tp_overlap_loss_note(e)) else {}),
        **({"bf16_layers": bf16_layers_json(e.model, e.plan)} if e.plan.low_precision else {}),
        **({"goodput": goodput_json(e.goodput, float(e.throughput.tokens_per_s))} if e.goodput is not None else {}),
    }


def bf16_layers_json(m: ModelSpec, plan: ParallelPlan) -> dict[str, Any]:
    """The layers a low-precision plan keeps in bf16 as priced: the pinned counts or the recipe's default, and
    the share of the layers whose GEMMs run in the recipe's format (docs/formulas.md#precision)."""
    start, end = bf16_layer_counts(plan, m.num_hidden_layers)
    pinned = plan.bf16_layers_start is not None or plan.bf16_layers_end is not None
    return {"start": start, "end": end, "pinned": pinned,
            "low_precision_layer_fraction": plan.low_precision_layer_fraction(m.num_hidden_layers)}


def context_extension(m: Any, plan: ParallelPlan) -> dict[str, Any] | None:
    """A training sequence past the model's max_position_embeddings (context extension, RoPE scaled): its
    lengths and their ratio, the least RoPE scaling factor that covers it; None within the model's context."""
    if plan.seq_len <= m.max_position_embeddings:
        return None
    return {"seq_len": plan.seq_len, "max_position_embeddings": m.max_position_embeddings,
            "factor": plan.seq_len / m.max_position_embeddings, "rope_scaling": m.rope_scaling}


def context_note(m: Any, plan: ParallelPlan) -> str | None:
    """One line on context extension for the text views (None within the model's context)."""
    ext = context_extension(m, plan)
    if ext is None:
        return None
    return (f"note: seq_len {plan.seq_len:,} > max_position_embeddings {m.max_position_embeddings:,} of {m.name}: "
            f"context extension, RoPE scaled >= {ext['factor']:.3g}x (e.g. YaRN; exported where the launcher takes it)")


def split_text(layers: tuple[int, ...] | list[int]) -> str:
    """Stage layer counts in short form: '7+8x14+7' (runs of equal counts collapsed)."""
    runs: list[list[int]] = []
    for n in layers:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    return "+".join(f"{n}x{k}" if k > 1 else str(n) for n, k in runs)


def advice_table(items: list, base_tokens_per_s: float | None, serving: bool = False, to_fit: bool = False) -> Table:
    """What to change next: each change, the flags that make it, and what it predicts; `to_fit`: the plan does
    not fit and each change makes it fit; the % against `base_tokens_per_s` (none when it is None)."""
    t = ReportTable(title="What makes it fit (predicted by the same model)" if to_fit else
                    "What to change next (each alone, predicted by the same model)")
    t.add_column("change")
    t.add_column("add flags", style="cyan")
    t.add_column("tokens/s", justify="right")
    t.add_column("TTFT ms" if serving else "mem GiB", justify="right")
    for a in items:
        p = a.predicted
        last = f"{1000 * p['ttft_s']:,.1f}" if serving else f"{p['memory_gib']:,.1f}"
        tokens = f"{p['tokens_per_s']:,.0f}"
        if base_tokens_per_s:
            tokens += f" ({100 * (p['tokens_per_s'] / base_tokens_per_s - 1):+.1f}%)"
        if "effective_tokens_per_s" in p:  # a checkpointing change: the tokens/s that survive failures
            tokens = f"{p['effective_tokens_per_s']:,.0f} eff. ({100 * a.gain:+.1f}%)"
        t.add_row(a.change, flags_text(a.flags), tokens, last)
    return t


def flags_text(flags: tuple[str, ...] | list[str]) -> str:
    """The flags as one would type them, each value joined to its flag (`--dp=2`, click's long-option form) so
    that a wrapped table cell never parts a flag from its value."""
    words: list[str] = []
    for f in flags:
        if words and words[-1].startswith("--") and "=" not in words[-1] and not f.startswith("--"):
            words[-1] += f"={f}"
        else:
            words.append(f)
    return " ".join(words)


def tp_overlap_note(m: ModelSpec, plan: ParallelPlan) -> str | None:
    """One line where the plan asks for TP overlap that Megatron-Core turns off for an MLA model
    (cost.runtime_memory.mla_turns_tp_overlap_off; docs/formulas.md#step.mla_tp_overlap); None otherwise."""
    if not (mla_turns_tp_overlap_off(m, plan) and bool(userbuffers_on(plan))):
        return None
    return (f"note: tp_comm_overlap: Megatron-Core turns TP overlap off at {m.name}'s first MLA linear (TELinear: "
            "userbuffer names q_down_proj / q_proj are not qkv, proj, fc1 or fc2), so the step is priced with every "
            "TP collective unoverlapped (the userbuffers' memory kept)")


def tp_overlap_loss_note(e: TrainingEstimate) -> str | None:
    """One line where the plan's userbuffer TP overlap prices slower than the same plan without it
    (TrainingEstimate.tp_overlap_gain < 0; docs/formulas.md#step.ub_loses); None otherwise."""
    if e.tp_overlap_gain is None or e.tp_overlap_gain >= 0:
        return None
    step = float(e.time.total)
    return (f"note: tp_comm_overlap prices {-e.tp_overlap_gain:,.3f} s a step slower than without it "
            f"({-e.tp_overlap_gain / (step + e.tp_overlap_gain):.1%}): set_sm_margin takes its SMs from the forward "
            "reduce-scatters' GEMMs for their whole length, more time than those collectives take at this TP "
            "and width; --no-tp-comm-overlap, or price a userbuffer config whose forward reduce-scatters take "
            "fewer SMs (tp_overlap_sms / tp_overlap_margin_sms in the plan file)")


def estimate_view(console: Console, e: TrainingEstimate, advice: list | None = None,
                  hardware: str | None = None) -> None:
    """The estimate's tables; `hardware` names the GPUs in the header instead of e.cluster (a plan over pools:
    report.pools.pinned_view)."""
    memory_view(console, e.model, e.cluster, e.plan, e.params, e.memory, hardware)
    if len(set(e.stage_layers)) > 1:
        console.print(f"uneven pipeline stages: {split_text(e.stage_layers)} layers (first to last)")
    if e.plan.pp_layout is not None:
        chunks = [c.count("t") for c in e.plan.pp_layout]
        console.print(f"pipeline layout: {len(chunks)} virtual chunks (pp {e.plan.pp} x vpp {e.plan.vpp}) of "
                      f"{split_text(chunks)} layers in model order")
    if note := context_note(e.model, e.plan):
        console.print(note)
    if note := tp_overlap_note(e.model, e.plan):
        console.print(note)
    if note := tp_overlap_loss_note(e):
        console.print(note)
    for u in e.operators:
        if not u.available:
            cost = (f": +{e.fallback_cost[0] / GIB:,.2f} GiB per GPU, +{e.fallback_cost[1]:,.3f} s per step"
                    if u.modelled else "")
            console.print(f"[yellow]kernel missing[/]: {u.operator} needs '{u.kernel}', which "
                          f"{e.cluster.system.gpu.name} does not list; falls back to {u.fallback}{cost}")
    console.print(comm_table(e.comm, e.cluster.system))
    console.print(time_table(e))
    for line in goodput_lines(e.goodput, float(e.throughput.tokens_per_s)) \
            if e.goodput is not None and e.memory.fits else ():  # a plan that does not fit trains no tokens
        console.print(line, highlight=False)
    if advice:
        fits = bool(e.memory.fits)
        console.print(advice_table(advice, float(e.throughput.tokens_per_s) if fits else None, to_fit=not fits))
    elif advice is not None and not e.memory.fits:
        console.print("No change llmplan tried makes it fit: llmplan search ranks the plans that do, or says "
                      "how many nodes it needs")


EXPOSED_ROWS = {"offload": ("waiting for offload copies", "mem.offload"),
                "router": ("aux-loss token-count all-reduces", "comm.aux_loss_counts")}
"""(row name, formula id) of the step-time table's exposed parts that are not a parallel axis's communication."""
OVERHEAD_ROWS = {"host": ("waiting for kernel launches", "step.overhead"),
                 "stragglers": ("slowest GPU (stragglers)", "step.overhead"),
                 "measured": ("measured per-step overhead", "step.overhead"),
                 "grad_buffer": ("gradient NaN check / 1/dp scaling", "step.grad_buffer"),
                 "zero3_copy_out": ("FSDP2 all-gather copy-out", "step.zero3_copy_out"),
                 "mxfp8_param_unstage": ("MXFP8 cast after gather", "step.mxfp8_param_unstage"),
                 "pp_sync": ("device syncs after pipeline sends", "step.pp_blocking"),
                 "geglu_offset_sync": ("GeGLU offset copies (host waits)", "step.geglu_offset_sync"),
                 "mxfp8_master_cast": ("MXFP8 master-weight cast (host)", "step.mxfp8_master_cast")}
"""(row name, formula id) of the step-time table's overheads (StepTime.overheads)."""


def time_table(e: TrainingEstimate) -> Table:
    st, tp = e.time, e.throughput
    t = ReportTable(title="Step time (most-loaded stage)")
    t.add_column("part")
    t.add_column("seconds", justify="right")
    t.add_column("% of step", justify="right")
    t.add_column("formula", style="dim")
    rows = [("compute", st.compute, "compute.time"), ("pipeline bubble", st.bubble, "step.time"),
            *((name, v, ref) for a, v in st.exposed.items() if v > 0
              for name, ref in [EXPOSED_ROWS.get(a, (f"exposed {a.upper()} communication", "step.time"))]),
            ("optimizer step + clipping" + (" + Newton-Schulz" if e.plan.optimizer == "muon" else ""), st.optimizer,
             "compute.optimizer" + (", optim.muon_ns" if e.plan.optimizer == "muon" else "")),
            *((name, v, ref) for k, v in st.overheads.items() if v > 0 for name, ref in [OVERHEAD_ROWS[k]])]
    for name, val, ref in rows:
        t.add_row(name, f"{val:,.4f}", f"{100 * val / st.total:.1f}%", ref)
    t.add_row("[bold]step[/]", f"[bold]{st.total:,.4f}[/]", "100.0%", "")
    low = (f" (vs bf16; {100 * tp.mfu_low_precision:.1f}% vs the {e.plan.gemm_format} peak)"
           if tp.mfu_low_precision is not None else "")
    # a plan that does not fit cannot run: its step time is what the cost model gives, not what it achieves
    t.caption = ("" if e.memory.fits else "[bold red]not achievable[/] (the plan does not fit): ") + (
        f"{tp.tokens_per_s:,.0f} tokens/s, {tp.tflops_per_gpu:,.1f} TFLOP/s per GPU, MFU {100 * tp.mfu:.1f}%{low}, "
        f"HFU {100 * tp.hfu:.1f}%, exposed communication {100 * tp.comm_ratio:.1f}% of the step; "
        f"bottleneck: {e.bottleneck}; tensor cores priced at {100 * sustained_fraction(e):.1f}% of "
        f"peak (step.power)"
    )
    iv = training_interval(e)
    (slo, shi), (tlo, thi), (mlo, mhi) = iv["step_s"], iv["tokens_per_s"], iv["mfu"]
    mem = iv["memory_bytes"]
    t.caption += (f"\n80% interval: step {slo:,.3f}-{shi:,.3f} s, {tlo:,.0f}-{thi:,.0f} tokens/s, MFU "
                  f"{100 * mlo:.1f}-{100 * mhi:.1f}%{capped_text(iv)}"
                  + (f", memory {mem[0] / GIB:,.1f}-{mem[1] / GIB:,.1f} GiB{memory_risk(e, mem)}" if mem else "")
                  + f"; from {iv['summary']}")
    return t


def hardware_text(cluster: ClusterSpec) -> str:
    """'4 x dgx-h100 (32 x h100-sxm)': the nodes and GPUs of a cluster of one system, as headers name them."""
    return (f"{cluster.num_nodes} x {cluster.system.name} ({cluster.num_gpus} x {cluster.system.gpu.name}"
            f"{power_text(cluster)})")


def memory_risk(e: TrainingEstimate, mem: list[float]) -> str:
    """A note where the memory interval's upper end passes the GPU's capacity while the point fits: within the
    80% interval the plan may run out of memory, which FITS alone does not say."""
    cap = float(e.memory.capacity)
    if not e.memory.fits or mem[1] <= cap:
        return ""
    return f" (above the {cap / GIB:,.1f} GiB capacity: it may not fit)"


def memory_view(console: Console, model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan,
                params: ParamCounts, mem: TrainingMemory, hardware: str | None = None) -> None:
    p = plan
    console.print(
        f"[bold]{model.name}[/] on {hardware or hardware_text(cluster)}  {p.describe(batch=True)}, "
        f"{counted(p.num_microbatches, 'micro-batch', 'micro-batches')} per replica")
    if model.is_sparse_attention:
        asked = "" if p.indexer_loss is not None else " (the default)"
        console.print(f"DSA indexer loss: {indexer_loss(model, p, cluster.system.gpu)}{asked}")
    if not p.bias_gelu_fusion and model.mlp_bias and not model.gated_mlp and model.num_mlp_layers > 0:
        console.print("bias-GeLU: unfused, the fc1 bias added in its own pass (bias_gelu_fusion off)")
    if cluster.system.calibrated:
        console.print(f"[cyan]calibrated profile[/]: {cluster.system.calibrated}")
    console.print(f"parameters: total {billions(params.total)}, active {billions(params.active)}, "
                  f"on the most-loaded GPU {billions(mem.params_on_rank)} (pipeline stage {mem.stage})")
    t = ReportTable(title="Memory per GPU (most-loaded rank)")
    t.add_column("part")
    t.add_column("GiB", justify="right")
    t.add_column("% of capacity", justify="right")
    t.add_column("formula", style="dim")
    a = mem.activation_parts
    opt = optimizer_parts(p, mem.optimizer, mem.muon_saving)
    rows = [
        ("weights", mem.weights, "mem.model_states"),
        ("gradients", mem.gradients, "mem.grad_lifetime" if chunk_gradients_freed(p) else "mem.model_states"),
        ("optimizer states", mem.optimizer, "mem.model_states"),
        ("  master as remainders" if p.param_remainders else f"  master weights ({p.optimizer_master_dtype})",
         opt.master,
         "mem.param_remainders" if p.param_remainders else "mem.model_states"),
        ("  moments (Muon + Adam)" if p.optimizer == "muon" else "  Adam moments", opt.moments,
         "optim.muon_memory" if p.optimizer == "muon" else "mem.model_states"),
        ("activations", mem.activations, "mem.activations"),
        ("  transformer layers", a.layers, "mem.activations, mem.inflight"),
        ("  recompute working set", a.recompute_working, "mem.activations"),
        ("  embedding (first stage)", a.embedding, "mem.activations"),
        ("  output + logits (last stage)", a.output, "mem.activations"),
        ("  CP ring / a2a / all-gather buffers", a.cp_workspace, "mem.cp_comm"),
        *([("  DSA indexer scores (fp32)", a.indexer_workspace, "mem.indexer_reference")]
          if float(a.indexer_workspace) else []),
        ("other (buffers, fragmentation)", mem.other, "mem.other"),
    ]
    if mem.runtime is not None:  # the priced runtime bytes inside other
        rows += [("  CUDA context", mem.runtime.context, "mem.runtime"),
                 ("  cuBLAS workspace", mem.runtime.cublas, "mem.runtime"),
                 (f"  NCCL buffers ({int(mem.runtime.communicators)} comms)", mem.runtime.nccl, "mem.runtime"),
                 ("  TP-overlap userbuffers", mem.runtime.userbuffers, "mem.userbuffers")]
    # the excess of the reduction / step peak (ZeRO-1 copies) over the backward's, not the copies themselves
    rows += [("  ZeRO-1 step peak excess", mem.after_backward, "mem.optimizer_copies"),
             ("  fresh weight gradient", mem.fresh_grad, "mem.fresh_grads, mem.hp_grad_cast"),
             ("  fragmentation (churned)", mem.fragmentation, "mem.fragmentation")]
    for name, val, ref in rows:
        if name.startswith("  ") and val == 0:
            continue
        t.add_row(name, gib(val), f"{100 * val / mem.capacity:.1f}%", ref)
    t.add_row("[bold]total[/]", f"[bold]{gib(mem.total)}[/]", f"[bold]{100 * mem.total / mem.capacity:.1f}%[/]", "")
    t.add_row("capacity", gib(mem.capacity), "100.0%", "")
    h = host_json(mem, cluster)
    usable = h["usable_per_node"]
    if a.offloaded > 0:  # beside the total, not in it: host memory, against the node's usable host memory
        what = f"{p.offload_layers} offloaded layers" if p.offload_layers else (
            "expert fc1 outputs" if p.fine_grained_offload_modules == ("moe_act",)
            else "offloaded " + ", ".join(p.fine_grained_offload_modules))
        t.add_row(f"host: {what}", gib(a.offloaded),
                  "-" if usable is None else f"{100 * h['offloaded_per_node'] / usable:.1f}% of host",
                  "mem.offload_moe_act, mem.host" if p.fine_grained_offload_modules == ("moe_act",)
                  else "mem.offload_modules, mem.host" if p.offload_modules else "mem.offload, mem.host")
    console.print(t)
    if a.offloaded > 0:
        used = f"host: {h['offloaded_per_node'] / GIB:,.1f} GiB offloaded per node ({h['gpus_per_node']} GPUs)"
        console.print(used + (", host memory not known (host_memory_gb)" if usable is None else
                              f" of {usable / GIB:,.0f} GiB usable ({h['host_memory_gb']:g} GB x "
                              f"{h['usable_fraction']:.0%})"))
    if mem.fits:
        console.print(f"[bold green]FITS[/]: {gib(mem.total)} of {gib(mem.capacity)} GiB, "
                      f"headroom {gib(mem.headroom)} GiB")
    else:
        console.print(f"[bold red]DOES NOT FIT[/]: {gib(mem.total)} of {gib(mem.capacity)} GiB, "
                      f"short by {gib(-mem.headroom)} GiB")
