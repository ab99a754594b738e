"""The library entry point for one serving plan: memory, KV capacity, TTFT/TPOT, throughput, prefix reuse."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from llmplan.cost.inference import (ServeMemory, ServeTiming, Spans, batches_under_slo, kv_bytes_per_token,
                                    prefill_seconds, slo_met, serve_compute_format, serve_memory, serve_timing,
                                    step_host_seconds)
from llmplan.cost.lengths import LengthStats, length_stats
from llmplan.cost.operators import OperatorUse
from llmplan.cost.queueing import prefill_queue_seconds
from llmplan.cost.speculative import SpeculativeStep, draft_weight_bytes, speculative_step
from llmplan.cost.serve_phase import PhaseTiming, phase_timing
from llmplan.cost.serve_memory import batched_tokens_for_plan, sglang_mem_fraction_static, sglang_server_of
from llmplan.cost.serve_step import GraphHost, SglangRanks, decode_graphs, graph_sizes_at
from llmplan.errors import PlanViolationError
from llmplan.specs.check import check_serve_plan, engine_capped
from llmplan.specs.hardware import SystemSpec
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ClusterSpec, MemoryAllowance
from llmplan.specs.serve import ServeJob, ServePlan
from llmplan.topology.placement import place
from llmplan.units import GIB


@dataclass(frozen=True)
class SpeculativeSummary:
    """Speculative decoding at the job's batch against the same plan decoding one token per step."""

    step: SpeculativeStep
    """One speculative step (draft + verification seconds, tokens per step, acceptance rate)."""
    tpot_without_s: float
    tokens_per_s_without: float
    """Output tokens per second of the deployment without speculation."""
    max_concurrent_seqs_without: int
    draft_weight_bytes: float
    """Draft weights per GPU beyond the target's (included in memory.weights)."""
    kv_bytes_per_seq: float
    """KV bytes per running sequence per GPU with the draft's cache and the k draft slots."""
    kv_bytes_per_seq_without: float


@dataclass(frozen=True)
class ServeEstimate:
    model: ModelSpec
    cluster: ClusterSpec
    plan: ServePlan
    job: ServeJob
    memory: ServeMemory
    timing: ServeTiming
    kv_bytes_per_token: float
    slo_batch: int | None
    """Largest concurrency meeting the SLOs (None when no SLO is given)."""
    slo_tokens_per_s: float | None
    prefill_saved_fraction: float
    ttft_without_prefix_cache: float
    warnings: tuple[str, ...]
    operators: tuple = ()
    """The fused kernels the plan relies on and whether the GPU has them (cost.operators)."""
    fallback_cost: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """(extra bytes per GPU at the job's batch, extra seconds per output token, extra seconds to the first
    token) of the missing kernels."""
    speculative: SpeculativeSummary | None = None
    """Speculative decoding's step and its effect against plain decoding (None without it)."""
    lengths: LengthStats | None = None
    """Percentiles, capacity and throughput under the job's length distributions (None without them)."""
    phase: PhaseTiming | None = None
    """The plan's phase priced on its own when it is one pool of a disaggregated deployment (plan.phase)."""
    queue_wait_s: float | None = None
    """Mean wait before prefill at job.request_rate spread over the replicas (cost.queueing), included in
    timing.ttft, timing.e2e and the TTFT percentiles; None without a request rate (TTFT of an idle server)."""

    @property
    def tokens_per_s(self) -> float:
        """Output tokens per second of the whole deployment (all replicas)."""
        return float(self.timing.tokens_per_s_replica) * self.plan.dp


def replica_spans(plan: ServePlan, cluster: ClusterSpec) -> Spans:
    spans = place(plan.degrees, cluster)
    return Spans(tp=spans["tp"], pp=spans["pp"], ep=spans["ep"])


def hardware_warnings(plan: ServePlan, cluster: ClusterSpec) -> tuple[str, ...]:
    gpu = cluster.system.gpu
    out = []
    if plan.weight_dtype in ("mxfp8", "nvfp4") and serve_compute_format(plan, gpu) == "bf16":
        out.append(f"{gpu.name} has no {plan.weight_dtype} tensor cores (Blackwell has): {plan.weight_dtype} weights "
                   "are dequantised to bf16, saving memory and bandwidth but no compute")
    if plan.weight_dtype == "fp8" and "fp8" not in gpu.tflops:
        out.append(f"{gpu.name} has no fp8 tensor cores: fp8 weights run as weight-only (W8A16) kernels that "
                   "dequantise to bf16, saving memory and bandwidth but no compute")
    if plan.kv_dtype == "fp8" and "fp8" not in gpu.tflops:
        out.append(f"{gpu.name} has no fp8 tensor cores: an fp8 KV cache is stored in fp8 and upcast for attention")
    if plan.weight_dtype in ("int4", "int8"):
        out.append(f"{plan.weight_dtype} weights are modelled as weight-only quantisation (compute in bf16)")
    return tuple(out)


def tp_span_warning(plan: ServePlan, cluster: ClusterSpec, spans: Spans) -> tuple[str, ...]:
    """A TP group wider than the NVLink domain (a pinned --tp: the search tries TP within it) runs, as vLLM
    (Ray or multiprocessing over nodes) and SGLang (--nnodes) run it, but each of its all-reduces crosses the
    scale-out network: the price says so (replica_spans places the group; the collective model times it over
    the NICs), and the warning says where the time goes and the layout that keeps TP on NVLink. `spans`: the
    plan's replica_spans, placed once by the caller."""
    span, dom = spans.tp, cluster.system.domain_gpus
    if span.domains <= 1:
        return ()
    fix = (f"--tp {dom} --pp {plan.pp * plan.tp // dom}" if plan.tp % dom == 0
           else "TP within a domain and --pp across domains")
    fabric = cluster.system.scaleout_fabric
    net = "scale-out network" if fabric == "none" else f"{fabric} network"
    return (f"tp {plan.tp} spans {span.domains} NVLink domains of {dom} GPUs: each TP all-reduce crosses the "
            f"{net} between them (priced so); {fix} keeps TP on NVLink",)


def loaded_model(m: ModelSpec, job: ServeJob) -> ModelSpec:
    """The model as the engines load it for the job: without its multi-token-prediction modules unless the job
    decodes speculatively with them (vLLM's DeepSeek loader skips the spec-decode layers for the main model,
    vllm/model_executor/models/deepseek_v2.py load_weights; SGLang loads them only in its NEXTN draft worker)."""
    if m.num_nextn_predict_layers and (job.speculative is None or job.speculative.method != "mtp"):
        return m.model_copy(update={"num_nextn_predict_layers": 0})
    return m


def job_for_plan(m: ModelSpec, job: ServeJob, plan: ServePlan, system: SystemSpec,
                 batch: int | None = None) -> ServeJob:
    """The job as a server of `plan` on `system` runs `m` (at `batch` sequences, else the job's): the engine's
    default captured CUDA graph sizes depend on the plan's TP (SGLang: its exported server's --tp-size, tp x
    dp under DP attention, and the alignment of its attention ranks, cost.serve_step.SglangRanks), the GPU's
    memory and compute capability, the model, speculative decoding and the batch (cost.serve_step.graph_sizes_at),
    SGLang's default chunked-prefill size on the GPU's memory
    (cost.serve_memory.batched_tokens_for_plan) and its default memory fraction on the GPU's memory, TP, chunk and
    graphs (cost.serve_memory.sglang_mem_fraction_static) where none was given; idempotent. Every caller
    that prices a plan's decode (estimate_serving,
    the searches' SLO batch) takes the job from here, so that they agree."""
    update: dict[str, Any] = {"cuda_graph_batch_sizes": graph_sizes_at(job, batch, tp=plan.tp,
                                                                      host=GraphHost.of(system, m),
                                                                      ranks=SglangRanks.of(plan))}
    if job.engine == "sglang" and job.max_num_batched_tokens_default:  # SGLang's default chunk for this GPU
        update["max_num_batched_tokens"] = batched_tokens_for_plan(job, plan, system.gpu.hbm_gib * GIB)
    if job.engine == "sglang" and job.memory_fraction_default:  # SGLang's default fraction for this server
        # read with the list derived for it: an empty default list turns decode graphs off (their reserve too)
        listed = job.model_copy(update={"cuda_graph_batch_sizes": update["cuda_graph_batch_sizes"]})
        update["gpu_memory_utilization"] = sglang_mem_fraction_static(sglang_server_of(m, plan, listed, system.gpu))
    return job.model_copy(update=update)


def slo_candidates(job: ServeJob, ok: Any) -> Any:
    """The SLO grid's passing concurrencies `ok` with the job's captured decode sizes up to the largest of them,
    largest first: where a server set up for a grid point leaves it eager (slo_batch_of), a captured size
    below it is the next candidate, not only the grid's next point."""
    if not len(ok):
        return ok
    sizes = [float(x) for x in (job.cuda_graph_batch_sizes or ()) if x <= max(ok)]
    return np.unique(np.concatenate([np.asarray(ok, dtype=float), np.asarray(sizes, dtype=float)]))[::-1]


def slo_batch_of(m: ModelSpec, job: ServeJob, plan: ServePlan, runs: ServePlan, system: SystemSpec, spans: Spans,
                 batches: Any, ttft: bool = True) -> int:
    """The first of `batches` (in the order given) whose TPOT (and TTFT, unless `ttft` is False) meets the job's
    SLOs as a server set up for that many sequences runs it (job_for_plan at the batch: SGLang cuts its capture
    list to it, so a batch off its alignment runs eager, docs/validation.md#sglang-cut); 0 if none does. The SLO
    grids price one job's list, so each pick is checked here before it is reported.
    Derived: docs/formulas.md#infer.throughput"""
    for b in batches:
        at = job_for_plan(m, job, plan, system, int(b))
        t = serve_timing(m, runs, system, spans, at, float(b))
        if slo_met(job, t.ttft if ttft else None, t.tpot):
            return int(b)
    return 0


def sglang_fraction_warning(job: ServeJob) -> tuple[str, ...]:
    """A warning where SGLang's own default --mem-fraction-static (job_for_plan) is <= 0: its reserve for
    activations and CUDA graphs (with DP attention 4.5 MiB per decode-graph request per attention rank) exceeds
    the GPU, so a server left at its default would not start."""
    u = job.gpu_memory_utilization
    if job.engine != "sglang" or not job.memory_fraction_default or u > 0:
        return ()
    return (f"SGLang's default --mem-fraction-static for this server is {u:g}: its reserve for activations and CUDA "
            "graphs exceeds the GPU, so it would not start (cost.serve_memory.sglang_mem_fraction_static); give "
            "--memory-fraction",)


def estimate_serving(m: ModelSpec, cluster: ClusterSpec, plan: ServePlan, job: ServeJob,
                     allowance: MemoryAllowance | None = None) -> ServeEstimate:
    violations = check_serve_plan(m, plan, job, cluster)
    if violations:
        raise PlanViolationError(violations)
    spec_m, m = m, loaded_model(m, job)
    system = cluster.system
    job = job_for_plan(m, job, plan, system)
    spans = replica_spans(plan, cluster)
    uses = serving_operator_uses(m, system.gpu)
    runs = running_plan(plan, uses)
    mem = serve_memory(m, runs, job, system.gpu.hbm_bytes, allowance)
    timing = serve_timing(m, runs, system, spans, job, job.batch)
    extra = (0.0, 0.0, 0.0)
    if runs is not plan:  # the same job with the kernel, for what its absence costs
        ideal_mem = serve_memory(m, plan, job, system.gpu.hbm_bytes, allowance)
        ideal = serve_timing(m, plan, system, spans, job, job.batch)
        extra = (float(mem.total - ideal_mem.total), float(timing.tpot - ideal.tpot), float(timing.ttft - ideal.ttft))
    slo_batch = slo_tps = None
    if job.ttft_slo_s is not None or job.tpot_slo_s is not None:
        ok = batches_under_slo(m, runs, system, spans, job, max(mem.max_concurrent_seqs, 0))
        slo_batch = slo_batch_of(m, job, plan, runs, system, spans, slo_candidates(job, ok))
        at_slo = job_for_plan(m, job, plan, system, slo_batch)
        slo_tps = float(serve_timing(m, runs, system, spans, at_slo, slo_batch).tokens_per_s_replica) * plan.dp \
            if slo_batch else 0.0
    cold = job.model_copy(update={"prefix_hit_rate": 0.0})
    spec = speculative_summary(m, cluster, runs, job, allowance, spans) if job.speculative is not None else None
    lengths = length_stats(m, runs, system, spans, job, mem.kv_available) \
        if job.input_len_dist is not None or job.output_len_dist is not None else None
    wait = None
    if job.request_rate is not None:
        # Each replica (attention rank under DP attention) is one prefill server; the rate spreads evenly.
        wait = prefill_queue_seconds(m, runs, system, spans, job, job.request_rate / plan.dp)
        timing = replace(timing, ttft=timing.ttft + wait, e2e=timing.e2e + wait)
        if lengths is not None:
            lengths = replace(lengths, ttft_s={p: v + wait for p, v in lengths.ttft_s.items()},
                              ttft_mean_s=lengths.ttft_mean_s + wait)
    return ServeEstimate(
        model=spec_m, cluster=cluster, plan=plan, job=job, memory=mem, timing=timing, queue_wait_s=wait,
        kv_bytes_per_token=kv_bytes_per_token(m, plan.kv_dtype), slo_batch=slo_batch, slo_tokens_per_s=slo_tps,
        prefill_saved_fraction=job.prefix_hit_rate,
        ttft_without_prefix_cache=float(prefill_seconds(m, runs, system, spans, cold, job.batch)),
        warnings=(hardware_warnings(plan, cluster) + tp_span_warning(plan, cluster, spans)
                  + kv_replication_warning(m, plan) + sglang_fraction_warning(job)),
        operators=tuple(uses), fallback_cost=extra, speculative=spec, lengths=lengths,
        phase=phase_timing(m, runs, system, spans, job),
    )


def speculative_summary(m: ModelSpec, cluster: ClusterSpec, plan: ServePlan, job: ServeJob,
                        allowance: MemoryAllowance | None, spans: Spans) -> SpeculativeSummary:
    """The speculative step at the job's batch and the same job without speculation (TPOT, throughput, KV)."""
    assert job.speculative is not None  # the caller's branch
    system = cluster.system
    # the same server without speculation: SGLang's default capture list differs with it (job_for_plan)
    plain = job_for_plan(m, job.model_copy(update={"speculative": None}), plan, system)
    base = serve_timing(loaded_model(m, plain), plan, system, spans, plain, job.batch)
    mem, base_mem = (serve_memory(loaded_model(m, j), plan, j, system.gpu.hbm_bytes, allowance) for j in (job, plain))
    context = job.input_len + job.output_len / 2
    step = speculative_step(m, plan, system, spans, job.speculative, job.batch, context,
                            step_host_seconds(m, plan, job), job.engine,
                            **decode_graphs(job, plan, system, m))
    return SpeculativeSummary(
        step=step, tpot_without_s=float(base.tpot), tokens_per_s_without=float(base.tokens_per_s_replica) * plan.dp,
        max_concurrent_seqs_without=base_mem.max_concurrent_seqs,
        draft_weight_bytes=draft_weight_bytes(m, plan, job.speculative),
        kv_bytes_per_seq=mem.kv_cache / job.batch, kv_bytes_per_seq_without=base_mem.kv_cache / job.batch)


def running_plan(plan: ServePlan, uses: list[OperatorUse]) -> ServePlan:
    """The plan as the engine runs it on this GPU: without an MLA kernel the KV cache is expanded per head,
    without a fused attention kernel the scores are materialised (cost.operators)."""
    missing = {u.kernel for u in uses if not u.available}
    return plan.model_copy(update={"mla_latent_cache": False}) if "mla" in missing else \
        plan.model_copy(update={"fused_attention": False}) if "flash_attention" in missing else plan


@dataclass(frozen=True)
class LoadPoint:
    """The plan at one concurrency per replica (every replica equally loaded)."""

    concurrency: int
    ttft_s: float
    tpot_s: float
    tokens_per_s_per_gpu: float
    """Output tokens per second of the deployment over its GPU count."""
    meets_slos: bool
    """TTFT and TPOT within the job's SLOs (True when it sets none)."""


LOAD_POINTS = 96
"""Concurrencies of a load curve, geometrically spaced (as batches_under_slo's grid)."""


def load_curve(e: ServeEstimate) -> list[LoadPoint]:
    """Throughput per GPU, TTFT and TPOT of the plan from 1 concurrent sequence per replica up to what its KV
    cache admits, the job's batch and the SLOs' largest concurrency among them: the curve of throughput per
    GPU against concurrency and against TPOT. Empty when not one sequence fits. Each point is priced as a
    server set up for that concurrency runs it (job_for_plan at the point: SGLang cuts its capture list to its
    --max-running-requests, so a point off the list's alignment runs eager, docs/validation.md#sglang-cut), as
    slo_batch_of checks an SLO batch: the same timing as estimate_serving of the job at that batch, the points
    that share a server's captured sizes priced together. Derived: docs/formulas.md#infer.throughput"""
    limit = e.memory.max_concurrent_seqs
    if limit < 1:
        return []
    extra = [b for b in (e.job.batch, e.slo_batch) if b and b <= limit]
    grid = np.unique(np.concatenate([np.round(np.geomspace(1, limit, LOAD_POINTS)), extra])).astype(float)
    runs, lm, system = running_plan(e.plan, list(e.operators)), loaded_model(e.model, e.job), e.cluster.system
    spans = replica_spans(e.plan, e.cluster)
    ttft, tpot, rate = (np.empty(grid.shape) for _ in range(3))
    servers: dict[str, tuple[ServeJob, list[int]]] = {}
    for i, b in enumerate(grid):
        at = job_for_plan(lm, e.job, e.plan, system, int(b))
        servers.setdefault(at.model_dump_json(), (at, []))[1].append(i)
    for at, idx in servers.values():
        t = serve_timing(lm, runs, system, spans, at, grid[idx])
        for out, v in ((ttft, t.ttft), (tpot, t.tpot), (rate, t.tokens_per_s_replica)):
            out[idx] = np.broadcast_to(v, (len(idx),))
    ok = slo_met(e.job, ttft, tpot)
    per_gpu = rate * e.plan.dp / e.plan.num_gpus
    return [LoadPoint(int(b), float(f), float(d), float(r), bool(k))
            for b, f, d, r, k in zip(grid, ttft, tpot, per_gpu, ok, strict=True)]


def at_max_load(m: ModelSpec, cluster: ClusterSpec, plan: ServePlan, job: ServeJob,
                allowance: MemoryAllowance | None = None, cap: int | None = None) -> ServeJob:
    """The job at full load under continuous batching: as many running sequences as the engine's KV cache
    admits (ServeMemory.max_concurrent_seqs, by the engine's rule), at most `cap`, at least one.
    Derived: docs/formulas.md#infer.capacity"""
    def admitted(batch: int) -> int:  # the activation peak (sampled logits) grows with the batch
        at = job.model_copy(update={"batch": batch})
        return estimate_serving(m, cluster, plan, at, allowance).memory.max_concurrent_seqs

    batch = max(1, admitted(1))
    if cap:
        batch = min(batch, cap)
    batch = min(batch, engine_capped(job.model_copy(update={"batch": batch})).batch)  # vLLM: max_num_batched_tokens
    for _ in range(8):  # capacity never rises with the batch: step down to a batch that admits itself
        fits = max(1, admitted(batch))
        if fits >= batch:
            break
        batch = fits
    return job.model_copy(update={"batch": batch})


def largest_fitting(e: ServeEstimate, allowance: MemoryAllowance | None = None) -> ServeEstimate | None:
    """A plan that does not fit, priced at the most running sequences per replica that do (at_max_load, capped
    by its batch): what it can achieve; None when it fits, or when not even one sequence fits.
    Derived: docs/formulas.md#infer.capacity"""
    if e.memory.fits or e.memory.kv_available <= 0:
        return None
    job = at_max_load(e.model, e.cluster, e.plan, e.job, allowance, cap=e.job.batch)
    fit = estimate_serving(e.model, e.cluster, e.plan, job, allowance)
    return fit if fit.memory.fits and job.batch < e.job.batch else None


def admitted_run(e: ServeEstimate, allowance: MemoryAllowance | None = None) -> ServeEstimate | None:
    """What an engine started for the plan runs at its admission cap (admission_cap): the plan itself when it
    fits; else the plan at the most sequences that fit (largest_fitting: the engine's cache is sized for that
    cap, its activation peak profiled at it); None when not one sequence fits.
    Derived: docs/formulas.md#infer.capacity"""
    return e if e.memory.fits else largest_fitting(e, allowance)


def admission_cap(e: ServeEstimate, allowance: MemoryAllowance | None = None) -> int:
    """The running sequences per replica an engine started for the plan should admit (vLLM --max-num-seqs,
    SGLang --max-running-requests): the plan's batch when it fits; else the most that fit (largest_fitting,
    the engine's cache sized for that cap), so that the rest of the offered batch queues instead of being
    admitted and preempted; 0 when not one sequence fits. Derived: docs/formulas.md#infer.capacity"""
    run = admitted_run(e, allowance)
    return run.job.batch if run is not None else 0


def serving_operator_uses(m: ModelSpec, gpu) -> list[OperatorUse]:
    """Serving relies on fused attention (an MLA decode kernel for latent attention; without it the engine
    caches expanded K and V; without flash attention the scores go through memory; both counted) and, for fp8
    weights, fp8 GEMMs (see hardware_warnings)."""
    kernel = "mla" if m.is_mla else "flash_attention"
    fallback = ("the expanded per-head K and V are cached and read every decode step" if m.is_mla else
                "unfused attention: scores and probabilities written to and read from memory (prefill "
                "workspace and traffic counted)")
    available = gpu.has_kernel(kernel)
    return [OperatorUse("multi-head latent attention" if m.is_mla else "attention", kernel, available,
                        "" if available else fallback, modelled=True)]


def kv_replication_warning(m: ModelSpec, plan: ServePlan) -> tuple[str, ...]:
    """Serving engines accept tp above the KV heads by replicating them (vLLM: each KV head on tp / K
    ranks); training refuses it (check_plan). Say so, with what it costs."""
    if m.is_mla or plan.tp <= m.kv_heads:
        return ()
    return (f"tp {plan.tp} exceeds the {m.kv_heads} KV heads of {m.name}: each KV head is replicated on "
            f"{plan.tp // m.kv_heads} GPUs (as vLLM does), so the KV cache per GPU does not shrink beyond tp "
            f"{m.kv_heads}",)
