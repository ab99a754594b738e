"""Serving: prefill (TTFT) and decode (TPOT) time, throughput, and the effect of prefix caching, built on the
serving memory (cost.serve_memory) and the engine step (cost.serve_step), whose names are re-exported here.

Symbols: B concurrent sequences, c context tokens, L layers, K KV heads, d head dim, t TP, p PP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from llmplan.cost.compute import attended_keys
from llmplan.cost.serve_memory import (  # noqa: F401  (re-exported: their home was this module)
    ENGINES, KV_BYTES, EngineRule, ServeMemory, activation_peak_bytes, admitted_tokens, kv_bytes_per_seq_gpu,
    kv_bytes_per_token, kv_capacity_bytes, kv_layer_bytes, recurrent_state_per_seq_gpu, serve_memory,
    serve_weight_bytes, weight_bytes_per_param,
)
# The engine step, re-exported likewise. Its fitted constants SERVE_GEMM_M_HALF and SERVE_COLLECTIVE_FLOOR_S
# are read in cost.serve_step: set them there (benchmarks/accuracy.py does).
from llmplan.cost.serve_moe import tbo_split_share
from llmplan.cost.serve_step import (  # noqa: F401  (re-exported: their home was this module)
    SERVE_FORMATS, Spans, attention_pair_dims, elementwise_serve_bytes, expert_compute_format,
    expert_exchange_seconds, graph_padded_rows, layer_linear_shapes, linear_seconds, serve_compute_format,
    serve_gemm_efficiency, stage_hop_seconds, step_compute_parts, step_compute_seconds, step_host_seconds,
    step_seconds, uncaptured_launch_seconds, decode_graphs, GraphHost,
    graph_padded_tokens, graph_sizes_count_tokens, decode_group,
)
from llmplan.specs.hardware import SystemSpec
from llmplan.specs.model import ModelSpec
from llmplan.specs.serve import Engine, ServeJob, ServePlan


def decode_tpot(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, batch: Any, context: Any,
                overhead: float = 0.0, queries: float = 1, engine: Engine = "vllm",
                graph_sizes: tuple[int, ...] | None = None, graph_top: int | None = None,
                sample_last: bool = False) -> Any:
    """Time per output token at `batch` sequences of average `context`: with p stages the batch splits into p
    groups that take turns, so a sequence gets a token every p stage-steps of batch/p sequences (each step
    reading the stage's weights once and the group's KV), plus the engine's host time per step (`overhead`).
    `queries` tokens per sequence per step (speculative verification: k + 1) share the step's KV reads.
    With `graph_sizes` (CUDA graphs with padding) the step's element-wise operators, sampler, all-reduces and
    stage hop carry the padded tokens (graph_padded_tokens: vLLM pads b x queries tokens against its token
    sizes, the other engines b requests of `queries` tokens); its matmuls, attention and KV reads the real
    ones (docs/formulas.md#infer.graph_padding). `sample_last`: the output layer and the sampler over one row
    per sequence, not each of its `queries` tokens (a drafter's pass, which samples each request's last token:
    docs/formulas.md#infer.speculative). Derived: docs/formulas.md#infer.decode"""
    b = decode_group(batch, plan.pp)
    # A hybrid's recurrent layers read and write each sequence's fixed state once per step.
    kv = b * (kv_bytes_per_seq_gpu(m, plan, context) + 2 * recurrent_state_per_seq_gpu(m, plan))
    q = b * queries
    rows = graph_padded_tokens(b, queries, graph_sizes, graph_sizes_count_tokens(engine))
    stage = step_seconds(m, plan, system, spans, q, q * attended_keys(m, context), kv, decode_only=True,
                         engine=engine, rows=rows if graph_sizes else None, logit_rows=b if sample_last else None)
    hop = stage_hop_seconds(m, plan, system, spans, rows)
    # a batch above every captured size runs without a graph: its launches join the host time
    return plan.pp * (stage + hop) + overhead + uncaptured_launch_seconds(m, plan, b, graph_top)


def job_tpot(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, job: ServeJob, batch: Any,
             context: Any) -> Any:
    """TPOT of the job's decoding at `batch` sequences of average `context`: one token per step, or under
    speculative decoding the step of draft + verification over the tokens it yields (cost.speculative).
    Derived: docs/formulas.md#infer.decode"""
    overhead = step_host_seconds(m, plan, job)
    if job.speculative is None:
        return decode_tpot(m, plan, system, spans, batch, context, overhead, engine=job.engine,
                           **decode_graphs(job, plan, system, m))
    from llmplan.cost.speculative import speculative_tpot  # builds on this module: imported where used
    return speculative_tpot(m, plan, system, spans, job, batch, context, overhead)


def prefill_seconds(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, job: ServeJob,
                    batch: Any) -> Any:
    """Time to first token of one request while `batch` sequences decode: its uncached prompt runs in chunks
    of (max_num_batched_tokens - batch) tokens, each chunk sharing an engine step with the decodes and
    passing every pipeline stage; causal attention covers the cached prefix too. The output layer and the
    sampler run over one row per request in the step (the chunk's last token and each decode's token:
    prefill_logit_rows). Derived: docs/formulas.md#infer.prefill"""
    new = max(job.uncached_input, 1.0)
    cached = job.input_len - job.uncached_input
    chunk = np.maximum(job.max_num_batched_tokens - np.asarray(batch, dtype=float), 256.0)
    chunk = np.minimum(chunk, new)
    n_chunks = np.ceil(new / chunk)
    pairs = chunk * attended_keys(m, cached + new / 2)  # per chunk, on average
    decodes = np.asarray(batch, dtype=float) / plan.pp
    kv = decodes * kv_bytes_per_seq_gpu(m, plan, job.input_len + job.output_len / 2)
    stage = step_seconds(m, plan, system, spans, chunk + decodes,
                         pairs + decodes * attended_keys(m, job.context / 2), kv, engine=job.engine,
                         logit_rows=prefill_logit_rows(1.0, decodes))
    hop = stage_hop_seconds(m, plan, system, spans, chunk)
    # under speculative decoding the draft runs over each chunk too (cost.speculative.draft_prompt_seconds)
    from llmplan.cost.speculative import draft_prompt_seconds  # builds on this module: imported where used
    draft = draft_prompt_seconds(m, plan, system, spans, job, chunk, cached + new / 2, 1.0)
    return n_chunks * (plan.pp * (stage + hop) + draft + step_host_seconds(m, plan, job))


def batched_prompts(job: ServeJob) -> float:
    """Prompts in one batched prefill step of T = max_num_batched_tokens tokens: T / s_new, at least one (a
    prompt longer than T fills the step with one chunk of it). Derived: docs/formulas.md#infer.throughput"""
    return max(float(job.max_num_batched_tokens) / max(job.uncached_input, 1.0), 1.0)


def batched_prefill_context(job: ServeJob) -> float:
    """Keys a prompt token of a batched prefill step of T = max_num_batched_tokens tokens attends to on average:
    the cached prefix and half the step's part of its prompt, cached + min(s_new, T) / 2.
    Derived: docs/formulas.md#infer.throughput"""
    T = float(job.max_num_batched_tokens)
    cached = job.input_len - job.uncached_input
    return cached + min(max(job.uncached_input, 1.0), T) / 2


def prefill_logit_rows(prompts: Any, decodes: Any = 0.0) -> Any:
    """Rows of a prefill step's output layer and sampler (step_seconds' `logit_rows`): one per request in the
    step, each prompt (or chunk of one) at its last token, each decode at its one token, not every prompt
    token. Source: vllm-project/vllm vllm/v1/worker/gpu_model_runner.py
    @4e1790651fc758c06c7a903dd4cd82364ac91b27, GPUModelRunner._prepare_inputs (logits_indices =
    query_start_loc[1:] - 1, a partial prefill's chunk included) and execute_model (compute_logits on
    hidden_states[logits_indices]); sgl-project/sglang python/sglang/srt/layers/logits_processor.py
    @009db01a7c0d5460611d543516401eb497641918, LogitsProcessor.forward (an extend batch without input logprobs
    keeps hidden_states[cumsum(extend_seq_lens) - 1]); NVIDIA/TensorRT-LLM
    tensorrt_llm/_torch/modules/logits_processor.py @89fd9b74ab7ae753b4c6b3db25a400dca7ea54a0,
    LogitsProcessor.forward (hidden_states[cumsum(seq_lens) - 1] unless return_context_logits), which
    tensorrt_llm/_torch/pyexecutor/py_executor.py @9521caf4696c1fb79b0f946f0d980f8f0ebd3e64,
    PyExecutor._forward_step sets only when a context request asks for its context logits.
    Derived: docs/formulas.md#infer.prefill_logits"""
    return np.asarray(prompts, dtype=float) + np.asarray(decodes, dtype=float)


def prefill_work_seconds(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, job: ServeJob) -> float:
    """Engine time one request's prefill costs when prompts are batched: a full step of
    max_num_batched_tokens prompt tokens (several requests' prompts, reading the weights once, the output
    layer and sampler over one row per prompt, prefill_logit_rows; under speculative decoding the draft's
    pass over them, batched_draft_prompt_seconds) times the request's share of it.
    Derived: docs/formulas.md#infer.throughput"""
    T = float(job.max_num_batched_tokens)
    new = max(job.uncached_input, 1.0)
    stage = step_seconds(m, plan, system, spans, T, T * attended_keys(m, batched_prefill_context(job)), 0.0,
                         engine=job.engine, logit_rows=prefill_logit_rows(batched_prompts(job)),
                         tbo_share=tbo_split_share(new, T) if plan.two_batch_overlap else 0.5)
    hop = stage_hop_seconds(m, plan, system, spans, T)
    draft = batched_draft_prompt_seconds(m, plan, system, spans, job)
    return float(plan.pp * (stage + hop) + draft + step_host_seconds(m, plan, job)) * new / T


def batched_draft_prompt_seconds(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans,
                                 job: ServeJob) -> float:
    """The draft's pass over a batched prefill step of T = max_num_batched_tokens prompt tokens, T / s_new
    prompts (at least one) each sampled once (cost.speculative.draft_prompt_seconds); 0 without a draft.
    Derived: docs/formulas.md#infer.speculative"""
    from llmplan.cost.speculative import draft_prompt_seconds  # builds on this module: imported where used
    T = float(job.max_num_batched_tokens)
    return float(draft_prompt_seconds(m, plan, system, spans, job, T, batched_prefill_context(job),
                                      batched_prompts(job)))


@dataclass(frozen=True)
class ServeTiming:
    ttft: Any
    tpot: Any
    e2e: Any
    """TTFT + (output_len - 1) x TPOT."""
    tokens_per_s_replica: Any
    """Output tokens per second of one replica in steady state (prefills included)."""


def serve_timing(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, job: ServeJob,
                 batch: Any) -> ServeTiming:
    """TTFT, TPOT, end-to-end latency and steady-state throughput at `batch` concurrent sequences: per
    output_len decode steps the replica also prefills `batch` new prompts, so throughput =
    batch x output_len / (output_len x TPOT + batch x batched prefill time per request).
    Derived: docs/formulas.md#infer.throughput"""
    context = job.input_len + job.output_len / 2
    tpot = job_tpot(m, plan, system, spans, job, batch, context)
    ttft = prefill_seconds(m, plan, system, spans, job, batch)
    b = np.asarray(batch, dtype=float)
    period = job.output_len * tpot + b * prefill_work_seconds(m, plan, system, spans, job)
    return ServeTiming(ttft=ttft, tpot=tpot, e2e=ttft + (job.output_len - 1) * tpot,
                       tokens_per_s_replica=b * job.output_len / period)


def slo_met(job: ServeJob, ttft: Any, tpot: Any) -> np.ndarray:
    """Where the TTFT (None: not checked, as a decode pool's) and TPOT meet the job's SLOs (no SLO: met)."""
    ok = np.ones(np.shape(tpot), dtype=bool)
    if ttft is not None and job.ttft_slo_s is not None:
        ok &= np.asarray(ttft) <= job.ttft_slo_s
    if job.tpot_slo_s is not None:
        ok &= np.asarray(tpot) <= job.tpot_slo_s
    return ok


def batches_under_slo(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, job: ServeJob,
                      limit: int) -> np.ndarray:
    """The concurrencies of a geometric grid up to `limit` whose TTFT and TPOT meet the job's SLOs, ascending
    (empty if none does), each priced with the one job given (its capture list among them; serving.slo_batch_of
    checks a pick as a server set up for that concurrency runs it)."""
    if limit < 1:
        return np.zeros(0)
    grid = np.unique(np.round(np.geomspace(1, limit, 96))).astype(float)
    timing = serve_timing(m, plan, system, spans, job, grid)
    ok = slo_met(job, np.broadcast_to(timing.ttft, grid.shape), np.broadcast_to(timing.tpot, grid.shape))
    return grid[ok]