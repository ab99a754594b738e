"""`llmplan estimate --mode infer` and `llmplan search --mode infer`."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.table import Table

from llmplan.advice import advice_json
from llmplan.intervals import serving_interval
from llmplan.cost.inference import ENGINES, admitted_tokens
from llmplan.report.common import ReportTable, SCHEMA, gib
from llmplan.report.training import advice_table
from llmplan.search.serve import ServeSearchResult, slo_text
from llmplan.serving import ServeEstimate
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ClusterSpec
from llmplan.specs.serve import ServeJob
from llmplan.units import GIB



def serve_json(e: ServeEstimate, advice: list | None = None) -> dict[str, Any]:
    mem, t, p, j = e.memory, e.timing, e.plan, e.job
    return {
        "schema": SCHEMA, "mode": "infer", "model": e.model.name, "hardware": e.cluster.system.name,
        "nodes": e.cluster.num_nodes, "gpus": e.cluster.num_gpus,
        "plan": p.model_dump(mode="json"), "workload": j.model_dump(mode="json"),
        "memory": {"weights": mem.weights, "kv_cache": mem.kv_cache, "activations": mem.activations,
                   "other": mem.other, "total": mem.total, "capacity": mem.capacity, "fits": mem.fits,
                   "kv_available": mem.kv_available, "kv_blocks": mem.kv_blocks,
                   "recurrent_state": mem.recurrent_state},
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
        **({"interval": iv} if (iv := serving_interval(e)) is not None else {}),
        "operators": [{"operator": u.operator, "kernel": u.kernel, "available": u.available, "fallback": u.fallback,
                       "modelled": u.modelled} for u in e.operators],
        "fallback_cost": {"memory_bytes": e.fallback_cost[0], "tpot_s": e.fallback_cost[1],
                          "ttft_s": e.fallback_cost[2]},
        **({"advice": advice_json(advice)} if advice is not None else {}),
    }


def serve_view(console: Console, e: ServeEstimate, advice: list | None = None) -> None:
    mem, t, p, j = e.memory, e.timing, e.plan, e.job
    console.print(f"[bold]{e.model.name}[/] serving on {e.cluster.num_nodes} x {e.cluster.system.name}: "
                  f"{p.describe()}; "
                  f"{j.input_len} in / {j.output_len} out tokens, {j.batch} concurrent sequences per replica")
    for w in e.warnings:
        console.print(f"[yellow]warning[/]: {w}")
    for u in e.operators:
        if not u.available:
            cost = (f": +{e.fallback_cost[0] / GIB:,.2f} GiB per GPU, +{e.fallback_cost[1] * 1e3:,.2f} ms per "
                    f"output token, +{e.fallback_cost[2] * 1e3:,.1f} ms to the first token" if u.modelled else "")
            console.print(f"[yellow]kernel missing[/]: {u.operator} needs '{u.kernel}', which "
                          f"{e.cluster.system.gpu.name} does not list; {u.fallback}{cost}")
    tb = ReportTable(title="Memory per GPU")
    for col in ("part", "GiB", "% of usable", "formula"):
        tb.add_column(col, justify="right" if col in ("GiB", "% of usable") else "left")
    state = (("recurrent state (fixed per sequence)", mem.recurrent_state, "mixers.state"),) \
        if mem.recurrent_state else ()
    for name, val, ref in (("weights", mem.weights, "infer.weights"), ("KV cache", mem.kv_cache, "infer.kv"),
                           *state, ("activations", mem.activations, "infer.activations"),
                           ("other (CUDA graphs, NCCL, runtime)", mem.other, "mem.other")):
        tb.add_row(name, gib(val), f"{100 * val / mem.capacity:.1f}%", ref)
    tb.add_row("[bold]total[/]", f"[bold]{gib(mem.total)}[/]", f"{100 * mem.total / mem.capacity:.1f}%", "")
    tb.add_row(f"usable ({j.engine} memory fraction {j.gpu_memory_utilization:g})", gib(mem.capacity), "100.0%", "")
    console.print(tb)
    if mem.recurrent_state:
        console.print(f"Recurrent state: {mem.recurrent_state / j.batch / 2**20:,.1f} MiB per sequence per GPU, "
                      "whatever its length (Mamba-2 / Gated DeltaNet layers hold it instead of a KV cache)")
    console.print(f"KV cache: {e.kv_bytes_per_token / 1024:,.1f} KiB per token (whole model, one sequence); "
                  f"{gib(max(mem.kv_available, 0))} GiB free for it per GPU = {mem.kv_blocks:,} blocks of "
                  f"{j.block_size} tokens = at most {mem.max_concurrent_seqs:,} running sequences of "
                  f"{admitted_tokens(j):,.0f} tokens ({j.engine}: "
                  f"{'whole context reserved' if ENGINES[j.engine].reserve_whole_context else 'input + output/2 held on average'})")
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
    iv = serving_interval(e)
    if iv is not None:
        (flo, fhi), (plo, phi), (rlo, rhi) = iv["ttft_s"], iv["tpot_s"], iv["tokens_per_s"]
        console.print(f"80% interval: TTFT {flo * 1e3:,.1f}-{fhi * 1e3:,.1f} ms, TPOT {plo * 1e3:,.2f}-"
                      f"{phi * 1e3:,.2f} ms, {rlo:,.0f}-{rhi:,.0f} output tokens/s (from {iv['records']} "
                      "left-out TensorRT-LLM runs)")
    if j.prefix_hit_rate:
        console.print(f"prefix cache: {100 * j.prefix_hit_rate:.0f}% of each prompt cached; TTFT "
                      f"{float(t.ttft) * 1e3:,.1f} ms instead of {e.ttft_without_prefix_cache * 1e3:,.1f} ms")
    if e.slo_batch is not None:
        console.print(f"SLOs (TTFT {j.ttft_slo_s} s, TPOT {j.tpot_slo_s} s): up to {e.slo_batch} concurrent "
                      f"sequences per replica, {e.slo_tokens_per_s or 0:,.0f} output tokens/s"
                      if e.slo_batch else "[bold red]no concurrency meets the SLOs[/]")
    if advice:
        console.print(advice_table(advice, e.tokens_per_s, serving=True))


def serve_search_table(title: str, rows: list[ServeEstimate]) -> Table:
    """Ranked serving layouts in 80 columns: the layout as one cell (tp, pp, replicas, ep), the dtypes in the
    caption when every row shares them."""
    t = ReportTable(title=title)
    t.add_column("#", justify="right")
    t.add_column("layout")
    for col in ("GPUs", "batch", "TTFT ms", "TPOT ms", "tokens/s", "per GPU"):
        t.add_column(col, justify="right")
    for i, e in enumerate(rows, 1):
        p = e.plan
        layout = f"tp{p.tp} pp{p.pp} x{p.dp}" + (f" ep{p.ep}" if p.ep > 1 else "")
        t.add_row(str(i), layout, str(p.num_gpus), f"{e.job.batch:,}/{e.memory.max_concurrent_seqs:,}",
                  f"{float(e.timing.ttft) * 1e3:,.1f}", f"{float(e.timing.tpot) * 1e3:,.2f}",
                  f"{e.tokens_per_s:,.0f}", f"{e.tokens_per_s / p.num_gpus:,.0f}")
    dtypes = {(e.plan.weight_dtype, e.plan.kv_dtype) for e in rows}
    iv = serving_interval(rows[0]) if rows else None
    band = (f"; 80% interval: tokens/s x{iv['tokens_per_s'][0] / rows[0].tokens_per_s:.2f}-"
            f"{iv['tokens_per_s'][1] / rows[0].tokens_per_s:.2f}, TTFT/TPOT inversely" if iv else "")
    t.caption = ("layout: tp, pp, x replicas, ep; batch: running sequences / the most the KV cache admits" + band
                 + (f"; weights {rows[0].plan.weight_dtype}, KV {rows[0].plan.kv_dtype}" if len(dtypes) == 1 else ""))
    return t


def serve_search_json(res: ServeSearchResult, model: ModelSpec, cluster: ClusterSpec, job: ServeJob) -> dict[str, Any]:
    return {"schema": SCHEMA, "mode": "infer", "model": model.name, "hardware": cluster.system.name,
            "gpus": cluster.num_gpus, "objective": res.objective, "request_rate": res.request_rate,
            "workload": job.model_dump(mode="json"), "considered": res.considered, "feasible": res.feasible,
            "pruned": {p.rule: p.count for p in res.pruned}, "pruned_examples": {p.rule: p.example for p in res.pruned},
            "search_s": res.seconds, "plans": [{"rank": i, **serve_json(e)} for i, e in enumerate(res.ranked, 1)],
            "misses": [asdict(x) for x in res.misses]}


def serve_search_view(console: Console, res: ServeSearchResult, model: ModelSpec, cluster: ClusterSpec,
                      job: ServeJob) -> None:
    slo = f", SLOs {slo_text(job)}" if job.ttft_slo_s is not None or job.tpot_slo_s is not None else ""
    console.print(f"[bold]{model.name}[/] serving on up to {cluster.num_gpus} x {cluster.system.gpu.name}: "
                  f"{job.input_len} in / {job.output_len} out tokens{slo}; objective {res.objective}"
                  + (f" at {res.request_rate} requests/s" if res.request_rate else ""))
    console.print(f"evaluated {res.considered} layouts in {res.seconds:.2f} s; {res.feasible} fit")
    if res.ranked:
        console.print(serve_search_table("Best serving plans", res.ranked))
    if not res.ranked and res.misses:
        console.print(misses_table(res, job))
    if not res.pruned:
        return
    t = ReportTable(title="Pruned layouts")
    t.add_column("rule")
    t.add_column("layouts", justify="right")
    t.add_column("example")
    for p in res.pruned:
        t.add_row(p.rule, str(p.count), p.example)
    console.print(t)


def misses_table(res: ServeSearchResult, job: ServeJob) -> Table:
    """Layouts that fit in memory but miss an SLO or the GPU budget: what each achieves at best."""
    t = ReportTable(title=f"Layouts that fit but are not served ({slo_text(job)}"
                    + (f", {res.request_rate:g} requests/s" if res.request_rate else "") + ")")
    t.caption = "TTFT/TPOT at one sequence for an SLO miss, at the concurrency meeting the SLOs for a GPU miss"
    for col in ("tp", "pp", "ep", "TTFT s", "TPOT s", "why"):
        t.add_column(col, justify="left" if col == "why" else "right")
    for x in res.misses:
        why = (f"needs {x.gpus_needed} GPUs" if x.rule == "gpus" else
               "misses " + " and ".join(n for n, v, lim in (("TTFT", x.ttft_s, job.ttft_slo_s),
                                                             ("TPOT", x.tpot_s, job.tpot_slo_s))
                                        if lim is not None and v > lim))
        t.add_row(str(x.tp), str(x.pp), str(x.ep), f"{x.ttft_s:.3g}", f"{x.tpot_s:.3g}", why)
    return t
