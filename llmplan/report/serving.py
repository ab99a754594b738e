"""`llmplan estimate --mode infer` and `llmplan search --mode infer`."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.table import Table

from llmplan.advice import advice_json
from llmplan.intervals import serving_interval, serving_interval_withheld
from llmplan.cost.inference import ENGINES, admitted_tokens
from llmplan.cost.serve_phase import PhaseTiming
from llmplan.cost.speculative import SpeculativeStep, draft_passes
from llmplan.cost.serve_step import (decode_graph_step, effective_graph_sizes, graph_padded_rows,
                                     graph_padded_tokens, graph_sizes_count_tokens, sglang_default_list_empty)
from llmplan.report.common import ReportTable, SCHEMA, gib
from llmplan.report.training import advice_table
from llmplan.search.disagg import DisaggPlan, DisaggResult, Pool
from llmplan.search.serve import ServeSearchResult, slo_text
from llmplan.serving import ServeEstimate
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ClusterSpec
from llmplan.specs.serve import LengthDistribution, ServeJob, ServePlan



def serve_json(e: ServeEstimate, advice: list | None = None, fitting: ServeEstimate | None = None) -> dict[str, Any]:
    """`fitting`: for a plan that does not fit, the same plan at the most sequences that fit
    (serving.largest_fitting); its figures go under "at_fitting_batch" and "achievable" says the plan's own
    ttft_s, tpot_s and throughput are not."""
    mem, t, p, j = e.memory, e.timing, e.plan, e.job
    return {
        "schema": SCHEMA, "mode": "infer", "model": e.model.name, "hardware": e.cluster.system.name,
        "nodes": e.cluster.num_nodes, "gpus": e.cluster.num_gpus,
        "plan": p.model_dump(mode="json"), "workload": j.model_dump(mode="json"),
        # independent copies of the layout (ServePlan.copies: replicas, or DP-attention servers of ep GPUs each)
        "copies": p.copies, "gpus_per_copy": p.gpus_per_copy,
        "memory": {"weights": mem.weights, "kv_cache": mem.kv_cache, "activations": mem.activations,
                   "other": mem.other, "total": mem.total, "capacity": mem.capacity, "fits": mem.fits,
                   "kv_available": mem.kv_available, "kv_blocks": mem.kv_blocks,
                   "recurrent_state": mem.recurrent_state},
        "kv_bytes_per_token": e.kv_bytes_per_token,
        "max_concurrent_seqs": mem.max_concurrent_seqs,
        **decode_graph_json(e),
        "ttft_s": float(t.ttft), "tpot_s": float(t.tpot), "e2e_s": float(t.e2e),
        "queue_wait_s": e.queue_wait_s, "ttft_includes_queueing": e.queue_wait_s is not None,
        "achievable": bool(mem.fits),
        **({} if mem.fits else {"at_fitting_batch": fitting_json(fitting)}),
        "throughput": {"tokens_per_s": e.tokens_per_s, "tokens_per_s_per_replica": float(t.tokens_per_s_replica),
                       "tokens_per_s_per_gpu": e.tokens_per_s / p.num_gpus},
        "slo": {"ttft_s": j.ttft_slo_s, "tpot_s": j.tpot_slo_s, "max_batch": e.slo_batch,
                "tokens_per_s": e.slo_tokens_per_s},
        "prefix_cache": {"hit_rate": j.prefix_hit_rate, "prefill_tokens_saved_fraction": e.prefill_saved_fraction,
                         "ttft_without_cache_s": e.ttft_without_prefix_cache},
        "warnings": list(e.warnings),
        **({"interval": iv} if (iv := serving_interval(e)) is not None else {}),
        **({"interval_withheld": why} if (why := serving_interval_withheld(e)) is not None else {}),
        "operators": [{"operator": u.operator, "kernel": u.kernel, "available": u.available, "fallback": u.fallback,
                       "modelled": u.modelled} for u in e.operators],
        "fallback_cost": {"memory_bytes": e.fallback_cost[0], "tpot_s": e.fallback_cost[1],
                          "ttft_s": e.fallback_cost[2]},
        **({"advice": advice_json(advice)} if advice is not None else {}),
        **({"speculative": speculative_json(e)} if e.speculative is not None else {}),
        **({"length_distribution": lengths_json(e)} if e.lengths is not None else {}),
        **({"phase": phase_json(e)} if e.phase is not None else {}),
    }


def decode_graphs_off(j: ServeJob) -> str:
    """Why a job's decode runs without a CUDA graph (its server of the plan: serving.job_for_plan)."""
    if not j.cuda_graphs:
        return "--no-cuda-graphs: every decode step launched eagerly"
    if sglang_default_list_empty(j):
        return ("SGLang's default decode capture list keeps no size for this server (its alignment and request "
                "pool; SGLang 0.5.23 refuses to start with none), so the export turns decode graphs off "
                "(--disable-decode-cuda-graph) and the decode is priced eager; --cuda-graph-sizes gives a list")
    return "no captured size is left for this server (the engine's rule on its list): the decode is priced eager"


def fitting_json(f: ServeEstimate | None) -> dict[str, Any] | None:
    """What a plan that does not fit achieves at the most sequences that fit (None: not even one fits)."""
    if f is None:
        return None
    return {"batch": f.job.batch, "ttft_s": float(f.timing.ttft), "tpot_s": float(f.timing.tpot),
            "e2e_s": float(f.timing.e2e), "tokens_per_s": f.tokens_per_s,
            "tokens_per_s_per_gpu": f.tokens_per_s / f.plan.num_gpus, "kv_available": f.memory.kv_available,
            "kv_blocks": f.memory.kv_blocks, "max_concurrent_seqs": f.memory.max_concurrent_seqs}


def decode_graph_json(e: ServeEstimate) -> dict[str, Any]:
    """What a decode step (under speculative decoding, the verification step) runs against the captured CUDA
    graph sizes (None: CUDA graphs off, no padding). decode_graph_batch / _tokens / _eager describe the
    workload's whole batch, as since they were added: decode_graph_batch, the requests a step of the batch runs
    once padded to the smallest captured size that holds it (vLLM's sizes count tokens, 1 + k per request under
    speculative decoding, rounded to whole requests: cost.serve_step.effective_graph_sizes), or the batch itself
    above every size (decode_graph_eager: no graph); decode_graph_tokens, the tokens it runs once padded;
    decode_graph_unit: what the engine's capture list counts, "tokens" for vLLM, "requests" for TensorRT-LLM and
    SGLang. The step the cost prices is one pipeline group's (cost.serve_step.decode_graph_step):
    decode_graph_groups (pp) groups of decode_graph_requests = batch / pp sequences take turns;
    decode_graph_group_batch / _tokens / _eager are that step's, the group rounded up to ceil(batch / pp)
    requests (the larger group: it pads to the captured size the cost pads batch / pp to).
    decode_graph_sizes: the captured sizes a step pads against, in decode_graph_unit (null: no decode graph);
    decode_graphs_off: why no decode graph is priced (null where one is), in words."""
    j = e.job
    g = decode_graph_step(j, e.plan, e.cluster.system, e.model)
    sizes = effective_graph_sizes(j, plan=e.plan)
    if g is None or not sizes:
        return {**{k: None for k in ("decode_graph_batch", "decode_graph_unit", "decode_graph_tokens",
                                     "decode_graph_eager", "decode_graph_requests", "decode_graph_groups",
                                     "decode_graph_group_batch", "decode_graph_group_tokens",
                                     "decode_graph_group_eager", "decode_graph_sizes")},
                "decode_graphs_off": decode_graphs_off(j)}
    batch, tokens, eager = _padded_step(j.batch, g.queries, sizes, graph_sizes_count_tokens(j.engine))
    group_batch, group_tokens, _ = _padded_step(math.ceil(g.requests), g.queries, sizes,
                                                graph_sizes_count_tokens(j.engine))
    return {"decode_graph_sizes": list(sizes), "decode_graphs_off": None,
            "decode_graph_batch": batch,
            "decode_graph_unit": "tokens" if graph_sizes_count_tokens(j.engine) else "requests",
            "decode_graph_tokens": tokens, "decode_graph_eager": eager,
            "decode_graph_requests": _whole(g.requests), "decode_graph_groups": e.plan.pp,
            "decode_graph_group_batch": group_batch, "decode_graph_group_tokens": group_tokens,
            "decode_graph_group_eager": g.eager}


def _padded_step(batch: int, q: int, sizes: tuple[int, ...], count_tokens: bool) -> tuple[int, int, bool]:
    """A decode step of `batch` requests of q tokens each against the captured `sizes` (in tokens where
    count_tokens, vLLM): the requests and tokens it runs once padded, and whether it is above every size."""
    listed = batch * q if count_tokens else batch
    padded = int(graph_padded_rows(listed, sizes))  # in the list's unit; whole requests (effective_graph_sizes)
    return (padded // q if count_tokens else padded, int(graph_padded_tokens(batch, q, sizes, count_tokens)),
            listed > max(sizes))


def _whole(x: float) -> float | int:
    """x as an int where it is whole (a request or token count), else as it is."""
    return int(x) if float(x).is_integer() else x


def speculative_json(e: ServeEstimate) -> dict[str, Any]:
    """Speculative decoding's step and its effect (seconds, tokens/s, bytes per GPU)."""
    sp, spec = e.speculative, e.job.speculative
    assert sp is not None and spec is not None  # the caller's branch
    return {"method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens,
            **speculative_step_json(sp.step), "acceptance_default": spec.acceptance_rate is None,
            "draft_model": spec.draft_model, "step_s": float(sp.step.total),
            "verify_tokens_per_seq": spec.num_speculative_tokens + 1,
            "draft_pass_tokens_per_seq": list(draft_passes(spec.num_speculative_tokens, e.job.engine,
                                                           sp.step.tokens_per_step))
            if spec.method != "ngram" else [],
            "tpot_without_s": sp.tpot_without_s, "tpot_speedup": sp.tpot_without_s / float(e.timing.tpot),
            "tokens_per_s_without": sp.tokens_per_s_without,
            "throughput_speedup": e.tokens_per_s / sp.tokens_per_s_without if sp.tokens_per_s_without else None,
            "draft_weight_bytes": sp.draft_weight_bytes, "kv_bytes_per_seq": sp.kv_bytes_per_seq,
            "kv_bytes_per_seq_without": sp.kv_bytes_per_seq_without,
            "max_concurrent_seqs_without": sp.max_concurrent_seqs_without}


def _dist_json(d: LengthDistribution | None, fixed: int) -> dict[str, Any]:
    return {"fixed": fixed} if d is None else d.model_dump(mode="json", exclude_defaults=True)


def lengths_json(e: ServeEstimate) -> dict[str, Any]:
    """The plan under the job's length distributions: percentiles keyed p50/p90/p99, seconds."""
    st, j = e.lengths, e.job
    assert st is not None  # the caller's branch
    return {"input": _dist_json(j.input_len_dist, j.input_len), "output": _dist_json(j.output_len_dist, j.output_len),
            "input_mean": st.input_mean, "output_mean": st.output_mean, "held_tokens_per_seq": st.held_tokens,
            "ttft_s": {f"p{p}": v for p, v in st.ttft_s.items()}, "ttft_mean_s": st.ttft_mean_s,
            "tpot_s": {f"p{p}": v for p, v in st.tpot_s.items()}, "tpot_mean_s": st.tpot_mean_s,
            "max_concurrent_seqs": st.max_concurrent_seqs, "slo_max_batch_p99_ttft": st.slo_batch,
            "tokens_per_s": st.tokens_per_s_replica * e.plan.dp,
            "tokens_per_s_per_gpu": st.tokens_per_s_replica * e.plan.dp / e.plan.num_gpus}


def phase_json(e: ServeEstimate) -> dict[str, Any]:
    """The pool's one phase (estimate --phase prefill|decode): rates per GPU, latency, KV capacity per GPU."""
    ph = e.phase
    assert ph is not None  # callers check
    return {"name": ph.phase, "step_s": ph.step_s, "expert_exchange_s": ph.exchange_s,
            "tokens_per_step": ph.tokens_per_step, "context_tokens": ph.context, "ttft_s": ph.ttft_s,
            "tpot_s": ph.tpot_s, "input_tokens_per_s_per_gpu": ph.input_tokens_per_s_per_gpu,
            "output_tokens_per_s_per_gpu": ph.output_tokens_per_s_per_gpu,
            "kv_capacity_tokens_per_gpu": e.memory.kv_blocks * e.job.block_size,
            "max_concurrent_seqs": e.memory.max_concurrent_seqs,
            "kv_transfer_bytes_per_request": ph.kv_transfer_bytes_per_request,
            **({"draft_prefill_s": ph.draft_prefill_s} if ph.phase == "prefill" else {}),
            **({"speculative": phase_speculative_json(ph)} if ph.speculative is not None else {})}


def speculative_step_json(sp: SpeculativeStep) -> dict[str, Any]:
    """One speculative step (seconds): step = draft_s + verify_s, in which a sequence gains tokens_per_step."""
    return {"draft_s": float(sp.draft), "verify_s": float(sp.verify), "tokens_per_step": sp.tokens_per_step,
            "acceptance_rate": sp.acceptance_rate}


def phase_speculative_json(ph: PhaseTiming) -> dict[str, Any]:
    """A speculative decode phase's step (seconds): step_s = draft_s + verify_s, tpot_s = step_s / tokens_per_step."""
    assert ph.speculative is not None  # the caller's branch
    return speculative_step_json(ph.speculative)


def phase_lines(e: ServeEstimate) -> list[str]:
    """The phase block of the serving view, each line within 80 columns."""
    ph = e.phase
    if ph is None:
        return []
    kv = f"KV per GPU {e.memory.kv_blocks * e.job.block_size:,} tokens"
    if ph.phase == "prefill":
        return [f"prefill pool: {ph.tokens_per_step:,.0f} prompt tokens per batch per replica, "
                f"{ph.context:,.0f}-token prompts",
                f"  {ph.input_tokens_per_s_per_gpu:,.0f} input tokens/s per GPU; TTFT {(ph.ttft_s or 0) * 1e3:,.1f} ms "
                f"(no queueing); step {ph.step_s * 1e3:,.1f} ms",
                *([f"  of which the draft's pass over the prompt tokens {ph.draft_prefill_s * 1e3:,.1f} ms"]
                  if ph.draft_prefill_s else []),
                f"  expert dispatch + combine {ph.exchange_s * 1e3:,.1f} ms per step; {kv}",
                f"  KV sent to decode: {ph.kv_transfer_bytes_per_request / 2**20:,.1f} MiB per request"]
    return [f"decode pool: {ph.tokens_per_step:,.0f} sequences per replica at {ph.context:,.0f} tokens of "
            "context",
            f"  {ph.output_tokens_per_s_per_gpu:,.0f} output tokens/s per GPU; TPOT {(ph.tpot_s or 0) * 1e3:,.2f} ms",
            *([f"  speculative step {ph.step_s * 1e3:,.2f} ms = draft {float(sp.draft) * 1e3:,.2f} + verify "
               f"{float(sp.verify) * 1e3:,.2f}; {sp.tokens_per_step:.2f} tokens/seq"]
              if (sp := ph.speculative) is not None else []),
            f"  expert dispatch + combine {ph.exchange_s * 1e3:,.2f} ms per step; {kv}",
            f"  KV received per request: {ph.kv_transfer_bytes_per_request / 2**20:,.1f} MiB"]


def recurrent_kinds(m: ModelSpec) -> str:
    """The recurrent layer kinds a model has, as the view names them (Mamba-2, Gated DeltaNet, lightning)."""
    linear = "lightning attention" if m.linear_attention_rule == "lightning" else "Gated DeltaNet"
    kinds = [n for k, n in (("mamba", "Mamba-2"), ("linear_attention", linear)) if m.count_layers(k)]
    return " and ".join(kinds) or "recurrent"


def serve_view(console: Console, e: ServeEstimate, advice: list | None = None,
               fitting: ServeEstimate | None = None) -> None:
    mem, t, p, j = e.memory, e.timing, e.plan, e.job
    console.print(f"[bold]{e.model.name}[/] serving on {e.cluster.num_nodes} x {e.cluster.system.name}: "
                  f"{p.describe()}; "
                  f"{j.input_len:,} in / {j.output_len:,} out tokens, {j.batch:,} concurrent sequences per replica")
    for w in e.warnings:
        console.print(f"[yellow]warning[/]: {w}")
    for u in e.operators:
        if not u.available:
            cost = (f": +{gib(e.fallback_cost[0])} GiB per GPU, +{e.fallback_cost[1] * 1e3:,.2f} ms per "
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
                      f"whatever its length ({recurrent_kinds(e.model)} layers hold it instead of a KV cache)")
    console.print(kv_capacity_line(e, fitting))
    if mem.fits:
        console.print(f"[bold green]FITS[/]: {j.batch:,} sequences need {gib(mem.total)} of {gib(mem.capacity)} GiB")
    elif mem.kv_available <= 0:
        console.print(f"[bold red]DOES NOT FIT[/]: weights, activations and runtime exceed the usable memory by "
                      f"{gib(-mem.kv_available)} GiB; raise tp/pp or quantise the weights")
    else:
        most = fitting.job.batch if fitting is not None else mem.max_concurrent_seqs
        console.print(f"[bold red]DOES NOT FIT[/]: {j.batch:,} sequences need {gib(mem.total)} of {gib(mem.capacity)} "
                      f"GiB; at most {most:,} fit")
    if e.phase is not None:  # one pool of a disaggregated deployment: its phase, not co-located timing
        for line in phase_lines(e):
            console.print(line)
    elif not mem.fits:  # no timing for a batch that cannot run; the batch that fits instead, labelled
        not_fit_view(console, e, fitting)
    else:
        console.print(f"TTFT {float(t.ttft) * 1e3:,.1f} ms, TPOT {float(t.tpot) * 1e3:,.2f} ms, end-to-end "
                      f"{float(t.e2e):,.2f} s; {e.tokens_per_s:,.0f} output tokens/s "
                      f"({e.tokens_per_s / p.num_gpus:,.0f} per GPU)")
        console.print(queue_note(e.queue_wait_s, e.job.request_rate))
    iv = serving_interval(e) if e.phase is None and mem.fits else None
    if iv is not None:
        (flo, fhi), (plo, phi), (rlo, rhi) = iv["ttft_s"], iv["tpot_s"], iv["tokens_per_s"]
        console.print(f"80% interval: TTFT {flo * 1e3:,.1f}-{fhi * 1e3:,.1f} ms, TPOT {plo * 1e3:,.2f}-"
                      f"{phi * 1e3:,.2f} ms, {rlo:,.0f}-{rhi:,.0f} output tokens/s (from {iv['records']} "
                      "left-out TensorRT-LLM runs)")
    elif mem.fits and (why := serving_interval_withheld(e)) is not None:
        console.print(f"no 80% interval: {why}")
    if j.prefix_hit_rate:
        console.print(f"prefix cache: {100 * j.prefix_hit_rate:.0f}% of each prompt cached; TTFT "
                      f"{float(t.ttft) * 1e3:,.1f} ms instead of {e.ttft_without_prefix_cache * 1e3:,.1f} ms")
    if e.slo_batch is not None:
        console.print(f"SLOs (TTFT {j.ttft_slo_s} s, TPOT {j.tpot_slo_s} s): up to {e.slo_batch:,} concurrent "
                      f"sequences per replica, {e.slo_tokens_per_s or 0:,.0f} output tokens/s"
                      if e.slo_batch else "[bold red]no concurrency meets the SLOs[/]")
    if e.speculative is not None:
        speculative_view(console, e)
    if e.lengths is not None:
        lengths_view(console, e)
    if advice:
        base = e.tokens_per_s if mem.fits else (fitting.tokens_per_s if fitting is not None else None)
        console.print(advice_table(advice, base, serving=True, to_fit=not mem.fits))
    elif advice is not None and not mem.fits:
        console.print("No single change on these options makes it fit: try llmplan search --mode infer")


def kv_capacity_line(e: ServeEstimate, fitting: ServeEstimate | None) -> str:
    """The KV-capacity line. For a batch that does not fit, the capacity of the engine that runs the batch that
    does (`fitting`): the engine sizes its cache once, after a profiling step that samples as many sequences as
    it admits (docs/formulas.md#infer.activations), so the asked batch's larger sampler workspace is given apart."""
    j, mem = e.job, (fitting or e).memory
    held = "whole context reserved" if ENGINES[j.engine].reserve_whole_context else "input + output/2 held on average"
    line = (f"KV cache: {e.kv_bytes_per_token / 1024:,.1f} KiB per token (whole model, one sequence); "
            f"{gib(max(mem.kv_available, 0))} GiB free for it per GPU = {mem.kv_blocks:,} blocks of "
            f"{j.block_size} tokens = at most {mem.max_concurrent_seqs:,} running sequences of "
            f"{admitted_tokens(j):,.0f} tokens ({j.engine}: {held})")
    if fitting is not None and fitting.memory.max_concurrent_seqs != e.memory.max_concurrent_seqs:
        line += (f"; an engine set to admit {j.batch:,} sequences profiles their sampled logits "
                 f"({gib(e.memory.activations)} GiB of activations) and leaves room for "
                 f"{e.memory.max_concurrent_seqs:,}")
    return line


def not_fit_view(console: Console, e: ServeEstimate, fitting: ServeEstimate | None) -> None:
    """A plan that does not fit: its TTFT, TPOT and throughput are not achievable, so none is printed; what
    the most sequences that fit would give (serving.largest_fitting), labelled as such."""
    console.print(f"[bold red]not achievable[/]: {e.job.batch:,} sequences per replica do not fit, so no TTFT, "
                  "TPOT or throughput is given for them")
    if fitting is None:
        return
    f, t = fitting, fitting.timing
    console.print(f"at the {f.job.batch:,} sequences that fit: TTFT {float(t.ttft) * 1e3:,.1f} ms, TPOT "
                  f"{float(t.tpot) * 1e3:,.2f} ms, end-to-end {float(t.e2e):,.2f} s; {f.tokens_per_s:,.0f} "
                  f"output tokens/s ({f.tokens_per_s / f.plan.num_gpus:,.0f} per GPU)")
    console.print(queue_note(f.queue_wait_s, f.job.request_rate))


def speculative_view(console: Console, e: ServeEstimate) -> None:
    """Speculative decoding in a few lines under 80 columns."""
    d = speculative_json(e)
    rate = f"{d['acceptance_rate']:g}" + (" (published default)" if d["acceptance_default"] else "")
    console.print(f"speculative {d['method']}: k {d['num_speculative_tokens']}, acceptance {rate}, "
                  f"{d['tokens_per_step']:.2f} tokens per step")
    console.print(f"  step {d['step_s'] * 1e3:,.2f} ms = draft {d['draft_s'] * 1e3:,.2f} + verify "
                  f"{d['verify_s'] * 1e3:,.2f} ({d['verify_tokens_per_seq']} tokens per sequence)")
    if d["draft_pass_tokens_per_seq"]:
        console.print(f"  draft passes of {' + '.join(f'{q:.3g}' for q in d['draft_pass_tokens_per_seq'])} "
                      "tokens per sequence")
    speed = f"x{d['throughput_speedup']:.2f}" if d["throughput_speedup"] else "n/a"
    console.print(f"  TPOT {float(e.timing.tpot) * 1e3:,.2f} ms vs {d['tpot_without_s'] * 1e3:,.2f} ms without "
                  f"(x{d['tpot_speedup']:.2f}); throughput {speed}")
    console.print(f"  draft weights {gib(d['draft_weight_bytes'])} GiB per GPU; KV per sequence "
                  f"{d['kv_bytes_per_seq'] / 2**20:,.1f} MiB vs {d['kv_bytes_per_seq_without'] / 2**20:,.1f} MiB")
    console.print(f"  (draft cache + {d['num_speculative_tokens']} draft slots): {e.memory.max_concurrent_seqs:,} "
                  f"sequences fit vs {d['max_concurrent_seqs_without']:,} without")


def lengths_view(console: Console, e: ServeEstimate) -> None:
    """Percentiles and capacity under the length distributions, against the fixed mean lengths above."""
    d = lengths_json(e)
    t, p = d["ttft_s"], d["tpot_s"]
    console.print(f"length distribution: mean {d['input_mean']:,.0f} in / {d['output_mean']:,.0f} out; "
                  f"{d['held_tokens_per_seq']:,.0f} tokens held per sequence")
    console.print(f"  TTFT p50/p90/p99 {t['p50'] * 1e3:,.1f} / {t['p90'] * 1e3:,.1f} / {t['p99'] * 1e3:,.1f} ms "
                  f"(at the mean length {float(e.timing.ttft) * 1e3:,.1f})")
    console.print(f"  TPOT p50/p90/p99 {p['p50'] * 1e3:,.2f} / {p['p90'] * 1e3:,.2f} / {p['p99'] * 1e3:,.2f} ms "
                  f"(steps of {e.job.batch:,} sequences)")
    console.print(f"  at most {d['max_concurrent_seqs']:,} running sequences; {d['tokens_per_s']:,.0f} output "
                  f"tokens/s ({d['tokens_per_s_per_gpu']:,.0f} per GPU)")
    if st_batch := d["slo_max_batch_p99_ttft"]:
        console.print(f"  SLOs at the p99 prompt: up to {st_batch:,} concurrent sequences per replica "
                      f"(vs {e.slo_batch or 0:,} at the mean lengths)")
    elif d["slo_max_batch_p99_ttft"] == 0:
        console.print("  [bold red]no concurrency meets the SLOs at the p99 prompt[/]")


def serve_layout(p: ServePlan) -> str:
    """A co-located serving layout as every report table shows it (one system or a pool): "tp4 pp1 x2 ep8", or
    under DP attention "dpa8 ep8" (a server with attention data-parallel on 8 GPUs, the experts over them) and
    "dpa8 ep8 x2" for two such servers; " tbo" with two-batch overlap."""
    layout = (f"dpa{p.attn_dp} ep{p.ep}" + (f" x{p.copies}" if p.copies > 1 else "") if p.dp_attention
              else f"tp{p.tp} pp{p.pp} x{p.dp}" + (f" ep{p.ep}" if p.ep > 1 else ""))
    return layout + (" tbo" if p.two_batch_overlap else "")


def wide_layout_note(plans: list[ServePlan]) -> str:
    """The caption's key to serve_layout's dpaN and tbo, where a row shows them."""
    wide = any(p.dp_attention or p.two_batch_overlap for p in plans)
    return ("; dpaN: DP attention on N GPUs, experts over them, one server (x R: R servers); tbo: two-batch "
            "overlap" if wide else "")


def instance_layout(pool: Pool) -> str:
    """A disaggregated phase's instance layout and count: "tp4 ep4 x2", "dpa ep16 x1"."""
    p = pool.estimate.plan
    one = f"dpa ep{p.ep}" if p.dp_attention else f"tp{p.tp}" + (f" ep{p.ep}" if p.ep > 1 else "")
    return f"{one} x{pool.instances}"


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
        t.add_row(str(i), serve_layout(p), str(p.num_gpus), f"{e.job.batch:,}/{e.memory.max_concurrent_seqs:,}",
                  f"{float(e.timing.ttft) * 1e3:,.1f}", f"{float(e.timing.tpot) * 1e3:,.2f}",
                  f"{e.tokens_per_s:,.0f}", f"{e.tokens_per_s / p.num_gpus:,.0f}")
    dtypes = {(e.plan.weight_dtype, e.plan.kv_dtype) for e in rows}
    iv = serving_interval(rows[0]) if rows else None
    band = (f"; 80% interval: tokens/s x{iv['tokens_per_s'][0] / rows[0].tokens_per_s:.2f}-"
            f"{iv['tokens_per_s'][1] / rows[0].tokens_per_s:.2f}, TTFT/TPOT inversely" if iv else "")
    t.caption = ("layout: tp, pp, x replicas, ep" + wide_layout_note([e.plan for e in rows])
                 + "; batch: running sequences / the most the KV cache admits" + band
                 + (f"; weights {rows[0].plan.weight_dtype}, KV {rows[0].plan.kv_dtype}" if len(dtypes) == 1 else ""))
    return t


def serve_search_json(res: ServeSearchResult, model: ModelSpec, cluster: ClusterSpec, job: ServeJob) -> dict[str, Any]:
    return {"schema": SCHEMA, "mode": "infer", "model": model.name, "hardware": cluster.system.name,
            "gpus": cluster.num_gpus, "objective": res.objective, "request_rate": res.request_rate,
            "workload": job.model_dump(mode="json"), "considered": res.considered, "feasible": res.feasible,
            "pruned": {p.rule: p.count for p in res.pruned}, "pruned_examples": {p.rule: p.example for p in res.pruned},
            "search_s": res.seconds, "plans": [{"rank": i, **serve_json(e)} for i, e in enumerate(res.ranked, 1)],
            "misses": [asdict(x) for x in res.misses]}


def queue_note(wait_s: float | None, rate: float | None) -> str:
    """What the TTFT shown includes: the mean queueing wait at the request rate, or nothing (idle server)."""
    if wait_s is None or rate is None:
        return "TTFT: an idle server's, no queueing (search --request-rate adds the wait)"
    return (f"TTFT includes the mean queueing wait before prefill at {rate:g} requests/s "
            f"({wait_s * 1e3:,.1f} ms; M/G/1)")


def serve_search_view(console: Console, res: ServeSearchResult, model: ModelSpec, cluster: ClusterSpec,
                      job: ServeJob) -> None:
    slo = f", SLOs {slo_text(job)}" if job.ttft_slo_s is not None or job.tpot_slo_s is not None else ""
    console.print(f"[bold]{model.name}[/] serving on up to {cluster.num_gpus} x {cluster.system.gpu.name}: "
                  f"{job.input_len:,} in / {job.output_len:,} out tokens{slo}; objective {res.objective}"
                  + (f" at {res.request_rate} requests/s" if res.request_rate else ""))
    console.print(f"evaluated {res.considered} layouts in {res.seconds:.2f} s; {res.feasible} fit")
    if res.ranked:
        console.print(serve_search_table("Best serving plans", res.ranked))
        for w in res.ranked[0].warnings:
            console.print(f"[yellow]warning[/] (#1): {w}")
        console.print(queue_note(res.ranked[0].queue_wait_s, res.ranked[0].job.request_rate)
                      .replace("TTFT includes", "TTFT (#1) includes"))
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


def pool_json(pool: Pool) -> dict[str, Any]:
    """One phase's pool of a disaggregated plan: its instance's layout, instances, GPUs and load point."""
    e, ph = pool.estimate, pool.estimate.phase
    assert ph is not None
    p = e.plan
    doc: dict[str, Any] = {"tp": p.tp, "pp": p.pp, "ep": p.ep, "dp_attention": p.dp_attention,
                           "moe_dispatcher": p.moe_dispatcher, "two_batch_overlap": p.two_batch_overlap,
                           "redundant_experts": p.redundant_experts, "gpus_per_instance": pool.gpus_per_instance,
                           "instances": pool.instances, "gpus": pool.gpus}
    if ph.phase == "prefill":
        doc.update({"tokens_per_batch": ph.tokens_per_step, "input_tokens_per_s_per_gpu": ph.input_tokens_per_s_per_gpu,
                    "ttft_s": ph.ttft_s, "draft_prefill_s": ph.draft_prefill_s})
    else:
        doc.update({"batch_per_replica": ph.tokens_per_step,
                    "output_tokens_per_s_per_gpu": ph.output_tokens_per_s_per_gpu, "tpot_s": ph.tpot_s,
                    **({"speculative": phase_speculative_json(ph)} if ph.speculative is not None else {})})
    return doc


def split_json(x: DisaggPlan) -> dict[str, Any]:
    """One P:D split of the disaggregated search: each phase's pool, the KV transfer between them, totals."""
    return {"prefill": pool_json(x.prefill), "decode": pool_json(x.decode),
            "kv_transfer": {"bytes_per_request": x.kv_bytes_per_request, "seconds": x.kv_seconds,
                            "link": x.kv_link},
            "pd_ratio": f"{x.prefill.gpus}:{x.decode.gpus}", "gpus": x.gpus,
            "requests_per_s": x.requests_per_s, "tokens_per_s": x.tokens_per_s,
            "tokens_per_s_per_gpu": x.tokens_per_s / x.gpus, "ttft_s": x.ttft_s, "tpot_s": x.tpot_s,
            "queue_wait_s": x.queue_s}


def disagg_json(res: DisaggResult, model: ModelSpec, cluster: ClusterSpec, job: ServeJob) -> dict[str, Any]:
    """`search --mode infer --disaggregated --json`: each plan's "prefill", "decode" and "kv_transfer", the P:D
    split, and the best co-located plan it is compared with."""
    co = res.colocated
    return {"schema": SCHEMA, "mode": "infer", "disaggregated": True, "model": model.name,
            "hardware": cluster.system.name, "gpus": cluster.num_gpus, "workload": job.model_dump(mode="json"),
            "considered": res.considered, "search_s": res.seconds,
            "plans": [{"rank": i, **split_json(x)} for i, x in enumerate(res.plans, 1)],
            "colocated": None if co is None else {
                "plan": co.plan.model_dump(mode="json"), "gpus": co.plan.num_gpus, "batch": co.job.batch,
                "tokens_per_s": co.tokens_per_s, "tokens_per_s_per_gpu": co.tokens_per_s / co.plan.num_gpus,
                "ttft_s": float(co.timing.ttft), "tpot_s": float(co.timing.tpot)},
            "winner": res.winner, "why": res.why}


def disagg_view(console: Console, res: DisaggResult, model: ModelSpec, cluster: ClusterSpec, job: ServeJob) -> None:
    slo = f", SLOs {slo_text(job)}" if job.ttft_slo_s is not None or job.tpot_slo_s is not None else ""
    console.print(f"[bold]{model.name}[/] disaggregated serving on up to {cluster.num_gpus} x "
                  f"{cluster.system.gpu.name}: {job.input_len:,} in / {job.output_len:,} out tokens{slo}")
    console.print(f"priced {res.considered} instance layouts in {res.seconds:.2f} s")
    if res.plans:
        t = ReportTable(title="Best prefill / decode splits")
        t.add_column("#", justify="right")
        t.add_column("prefill")
        t.add_column("decode")
        for col in ("P:D GPUs", "TTFT ms", "TPOT ms", "per GPU"):
            t.add_column(col, justify="right")
        for i, x in enumerate(res.plans, 1):
            t.add_row(str(i), instance_layout(x.prefill), instance_layout(x.decode),
                      f"{x.prefill.gpus}:{x.decode.gpus}",
                      f"{x.ttft_s * 1e3:,.0f}", f"{x.tpot_s * 1e3:,.1f}", f"{x.tokens_per_s / x.gpus:,.0f}")
        queue = (f"mean queueing wait at {res_rate:g} requests/s (M/G/1) + " if (res_rate := job.request_rate)
                 else "")
        t.caption = (f"dpa: DP attention + wide EP (DeepEP); x instances; TTFT: {queue}prefill + KV transfer"
                     + ("" if queue else " (idle pool, no queueing)") + "; per GPU: output tokens/s")
        console.print(t)
        b = res.plans[0]
        console.print(f"KV transfer: {b.kv_bytes_per_request / 2**20:,.1f} MiB per request, "
                      f"{b.kv_seconds * 1e3:,.2f} ms over {b.kv_link}")
    co = res.colocated
    if co is not None:
        console.print(f"best co-located: {serve_layout(co.plan)}, "
                      f"{co.tokens_per_s / co.plan.num_gpus:,.0f} output tokens/s per GPU")
    console.print(f"[bold]{res.winner}[/]: {res.why}")
