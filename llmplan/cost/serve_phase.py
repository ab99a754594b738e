"""One pool serving one phase (a disaggregated deployment's prefill or decode instances): input tokens/s per
GPU and TTFT of a prefill pool, output tokens/s per GPU and TPOT of a decode pool, and the KV cache a prefill
hands over per request.

Symbols: T prompt tokens per prefill batch (per replica), s input tokens, B sequences per replica, c context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmplan.cost.inference import (Spans, batched_draft_prompt_seconds, decode_graphs, expert_exchange_seconds,
                                    job_tpot, kv_bytes_per_token, prefill_work_seconds, step_host_seconds)
from llmplan.cost.speculative import (SpeculativeStep, acceptance_of, draft_model, draft_passes, draft_plan,
                                      speculative_step, tokens_per_step)
from llmplan.specs.hardware import SystemSpec
from llmplan.specs.model import ModelSpec
from llmplan.specs.serve import ServeJob, ServePlan


@dataclass(frozen=True)
class PhaseTiming:
    """One phase served on its own by every replica of the plan, at full load."""

    phase: str
    """prefill or decode."""
    step_s: float
    """One engine step: a batch of T prompt tokens (prefill) or one token for each of B sequences (decode)."""
    exchange_s: float
    """The step's expert dispatch + combine, exposed or not (part of step_s unless two-batch overlap hides it)."""
    tokens_per_step: float
    """Prompt tokens per prefill batch, or sequences per decode step, per replica."""
    context: float
    """Tokens each sequence attends to: the prompt (prefill), input + output/2 on average (decode)."""
    ttft_s: float | None
    """Prefill: the steps one prompt's uncached tokens take (its batch's, or its chunks'), no queueing."""
    tpot_s: float | None
    """Decode: time per output token at B sequences per replica."""
    input_tokens_per_s_per_gpu: float
    """Prefill: uncached prompt tokens processed per second per GPU (0 for decode)."""
    output_tokens_per_s_per_gpu: float
    """Decode: tokens generated per second per GPU (prefill: the first token of each prompt)."""
    kv_transfer_bytes_per_request: float
    """KV cache of one request's prompt (every layer, all heads): what a prefill pool sends to a decode pool."""
    draft_prefill_s: float = 0.0
    """Prefill under speculative decoding: the draft's pass over the step's prompt tokens, part of step_s
    (cost.inference.batched_draft_prompt_seconds); 0 otherwise."""
    speculative: SpeculativeStep | None = None
    """Decode under speculative decoding: the step's draft and verification seconds and the tokens a sequence
    gains per step (step_s = draft + verify, tpot_s = step_s / tokens_per_step); None otherwise."""


def prefill_phase(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, job: ServeJob) -> PhaseTiming:
    """A prefill pool: each replica runs batches of T = max_num_batched_tokens uncached prompt tokens (several
    prompts, or chunks of one long prompt), each token attending to the cached prefix and half its prompt
    on average, and under speculative decoding the draft's pass over them (prefill_work_seconds); input
    tokens/s per GPU = T / step / GPUs per replica; TTFT = ceil(s_new / T) steps.
    Derived: docs/formulas.md#serve.phase"""
    T = float(job.max_num_batched_tokens)
    new = max(job.uncached_input, 1.0)
    step = prefill_work_seconds(m, plan, system, spans, job) * T / new
    exchange = float(expert_exchange_seconds(m, plan, system, spans, T, False, job.engine)) * plan.pp
    gpus = plan.gpus_per_replica
    return PhaseTiming(
        phase="prefill", step_s=step, exchange_s=exchange, tokens_per_step=T, context=float(job.input_len),
        ttft_s=math.ceil(new / T) * step, tpot_s=None, input_tokens_per_s_per_gpu=T / step / gpus,
        output_tokens_per_s_per_gpu=T / step / gpus / new,
        kv_transfer_bytes_per_request=float(kv_bytes_per_token(m, plan.kv_dtype)) * job.input_len,
        draft_prefill_s=batched_draft_prompt_seconds(m, plan, system, spans, job))


def decode_phase(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, job: ServeJob) -> PhaseTiming:
    """A decode pool: each replica decodes B = job.batch sequences of average context input + output/2 (their
    KV received from the prefill pool), DeepEP's low-latency kernels, at the job's TPOT (job_tpot, as the
    co-located estimate): one token per sequence per step, or under speculative decoding the speculative step
    (k draft steps + one verification step of k + 1 tokens per sequence, padded as the speculative server's
    captured graphs; cost.speculative) over the tokens it yields; output tokens/s per GPU = B / TPOT / GPUs
    per replica. Derived: docs/formulas.md#serve.phase"""
    B = float(job.batch)
    context = job.input_len + job.output_len / 2
    spec = None if job.speculative is None else speculative_step(
        m, plan, system, spans, job.speculative, B, context, step_host_seconds(m, plan, job), job.engine,
        **decode_graphs(job, plan, system, m))
    # the speculative step once: its TPOT is speculative_tpot's step.total / step.tokens_per_step
    tpot = float(job_tpot(m, plan, system, spans, job, B, context) if spec is None
                 else spec.total / spec.tokens_per_step)
    return PhaseTiming(
        phase="decode", step_s=tpot if spec is None else float(spec.total),
        exchange_s=decode_exchange_seconds(m, plan, system, spans, job), tokens_per_step=B, context=float(context),
        ttft_s=None, tpot_s=tpot, input_tokens_per_s_per_gpu=0.0,
        output_tokens_per_s_per_gpu=B / tpot / plan.gpus_per_replica,
        kv_transfer_bytes_per_request=float(kv_bytes_per_token(m, plan.kv_dtype)) * job.input_len, speculative=spec)


def decode_exchange_seconds(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, job: ServeJob) -> float:
    """Expert dispatch + combine of one decode step of b = B / p sequences per stage: b tokens, or under
    speculative decoding b (k + 1) in the verification step plus the draft's passes (draft_passes: b tokens
    each, vLLM's first b (k + 1), SGLang's draft extend b x the tokens gained) through the draft's MoE layers
    (MTP; none for a dense EAGLE head or n-gram). Derived: docs/formulas.md#serve.phase"""
    b = max(job.batch / plan.pp, 1.0)
    spec = job.speculative
    k = 0 if spec is None else spec.num_speculative_tokens
    out = float(expert_exchange_seconds(m, plan, system, spans, b * (k + 1), True, job.engine)) * plan.pp
    draft = None if spec is None else draft_model(m, spec)
    if spec is not None and draft is not None:
        gained = tokens_per_step(acceptance_of(spec), k)
        out += sum(float(expert_exchange_seconds(draft, draft_plan(plan), system, spans, b * q, True, job.engine))
                   for q in draft_passes(k, job.engine, gained))
    return out


def phase_timing(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, job: ServeJob) -> PhaseTiming | None:
    """The plan's phase on its own (None when it serves both, co-located)."""
    if plan.phase == "prefill":
        return prefill_phase(m, plan, system, spans, job)
    if plan.phase == "decode":
        return decode_phase(m, plan, system, spans, job)
    return None

