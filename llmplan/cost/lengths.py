"""Request lengths as distributions: TTFT and TPOT percentiles, KV capacity and throughput when prompts and
outputs vary (independently) instead of being one fixed length.

Symbols: I input tokens, O output tokens (random), B concurrent sequences, u a probability (quantile level).
Expectations over a lognormal by Gauss-Hermite quadrature, percentiles from the exact quantile (TTFT rises
with the prompt), step-to-step TPOT spread by seeded numpy sampling of the running batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from llmplan.cost.inference import (ENGINES, Spans, job_tpot, kv_bytes_per_seq_gpu, prefill_seconds,
                                    prefill_work_seconds)
from llmplan.specs.hardware import SystemSpec
from llmplan.specs.model import ModelSpec
from llmplan.specs.serve import LengthDistribution, ServeJob, ServePlan

TRACE_SHAPES: dict[str, tuple[float, float, str]] = {
    # Source: Kwon et al. 2023, Efficient Memory Management for LLM Serving with PagedAttention (SOSP), Fig. 11:
    # ShareGPT mean input 161.31 and output 337.99 tokens.
    "sharegpt": (161.31, 337.99, "ShareGPT (Kwon et al. 2023, Fig. 11)"),
    # Source: Zheng et al. 2024, LMSYS-Chat-1M (ICLR), Table 1: 69.5 tokens per prompt, 214.5 per response.
    "lmsys-chat": (69.5, 214.5, "LMSYS-Chat-1M (Zheng et al. 2024, Table 1)"),
    # Source: Qin et al. 2025, Mooncake (FAST '25), its open trace: average input 7,590, output 182 tokens
    # (long prompts: document / RAG-style chat on Kimi).
    "rag-long": (7590.0, 182.0, "Mooncake trace (Qin et al. 2025)"),
}
"""Named public trace shapes: (mean input tokens, mean output tokens, source)."""

TRACE_SIGMA = 1.0
"""Log-space standard deviation given to a named trace shape: an assumption (the sources publish means, not
the spread); give lognormal:mean=...,sigma=... to set it."""

QUADRATURE_POINTS = 48
"""Gauss-Hermite points for expectations over a lognormal (exact for polynomials of degree < 96 in log-space)."""

PERCENTILES = (50, 90, 99)
TPOT_SAMPLES = 1000
"""Decode steps sampled for the TPOT percentiles (batches drawn with a fixed seed)."""
SEED = 0


def _mu(d: LengthDistribution) -> float:
    assert d.mean is not None and d.sigma is not None  # the spec's validator requires both for a lognormal
    return float(np.log(d.mean) - d.sigma ** 2 / 2)


def points(d: LengthDistribution) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, weights summing to 1) over which expectations are taken: a histogram's own points, or the
    Gauss-Hermite nodes of a lognormal (X = exp(mu + sigma sqrt(2) z), mu = ln mean - sigma^2/2 so that its
    mean is the given one). Source: Abramowitz & Stegun 25.4.46 (Gauss-Hermite quadrature)."""
    if d.kind == "histogram":
        w = np.asarray(d.weights, dtype=float)
        return np.asarray(d.lengths, dtype=float), w / w.sum()
    assert d.sigma is not None
    z, w = np.polynomial.hermite.hermgauss(QUADRATURE_POINTS)
    return np.exp(_mu(d) + d.sigma * np.sqrt(2.0) * z), w / np.sqrt(np.pi)


def mean_length(d: LengthDistribution) -> float:
    """The distribution's mean (a lognormal's is its parameter; a histogram's its weighted mean)."""
    if d.mean is not None:
        return float(d.mean)
    x, w = points(d)
    return float(w @ x)


def quantile(d: LengthDistribution, u: float) -> float:
    """Length at probability u: exp(mu + sigma Phi^-1(u)) for a lognormal; the smallest histogram length whose
    cumulative weight reaches u. Derived: docs/formulas.md#infer.lengths"""
    if d.kind == "lognormal":
        assert d.sigma is not None
        return float(np.exp(_mu(d) + d.sigma * NormalDist().inv_cdf(u)))
    order = np.argsort(d.lengths)
    x, w = np.asarray(d.lengths, dtype=float)[order], np.asarray(d.weights, dtype=float)[order]
    cum = np.cumsum(w) / w.sum()
    return float(x[min(int(np.searchsorted(cum, u - 1e-12)), len(x) - 1)])


def sample(d: LengthDistribution, n: int, rng: np.random.Generator, length_biased: bool = False) -> np.ndarray:
    """n lengths drawn from d, or from d weighted by the length (a running batch holds a request for as long
    as its output lasts: the length-biased lognormal is lognormal(mu + sigma^2, sigma)).
    Derived: docs/formulas.md#infer.lengths"""
    if d.kind == "lognormal":
        assert d.sigma is not None
        return rng.lognormal(_mu(d) + (d.sigma ** 2 if length_biased else 0.0), d.sigma, n)
    x, w = np.asarray(d.lengths, dtype=float), np.asarray(d.weights, dtype=float)
    p = w * x if length_biased else w
    return rng.choice(x, size=n, p=p / p.sum())


def point(length: float) -> LengthDistribution:
    """One fixed length as a distribution (a one-point histogram)."""
    return LengthDistribution(kind="histogram", lengths=(int(length),), weights=(1.0,))


def lengths_of(job: ServeJob) -> tuple[LengthDistribution, LengthDistribution]:
    """The job's input and output distributions; a fixed length where it gives none."""
    return (job.input_len_dist or point(job.input_len), job.output_len_dist or point(job.output_len))


def held_tokens(job: ServeJob) -> tuple[float, float]:
    """(KV tokens a running sequence holds on average, mean context its decode steps attend to): a request
    stays in the batch for O steps, so the running batch is weighted by O: E[O (I + O/2)] / E[O] =
    E[I] + E[O^2] / (2 E[O]) held as blocks grow (whole context E[I] + E[O^2]/E[O] where the engine reserves
    it, as admitted_tokens); one fixed length gives I + O/2. Derived: docs/formulas.md#infer.lengths"""
    (xi, wi), (xo, wo) = (points(d) for d in lengths_of(job))
    mean_in, mean_out, second_out = float(wi @ xi), float(wo @ xo), float(wo @ xo ** 2)
    context = mean_in + second_out / (2 * mean_out)
    held = mean_in + second_out / mean_out if ENGINES[job.engine].reserve_whole_context else context
    return held, context


@dataclass(frozen=True)
class LengthStats:
    """A serving plan under the job's length distributions, at one concurrency."""

    input_mean: float
    output_mean: float
    held_tokens: float
    """KV tokens a running sequence holds on average (length-weighted)."""
    ttft_s: dict[int, float]
    """TTFT at each percentile of the prompt length (TTFT rises with it), one request alone with the batch."""
    ttft_mean_s: float
    tpot_s: dict[int, float]
    """Decode-step time at each percentile over steps, the batch's composition drawn at random."""
    tpot_mean_s: float
    """TPOT at the length-weighted mean context (the throughput's)."""
    max_concurrent_seqs: int
    tokens_per_s_replica: float
    slo_batch: int | None = None
    """Largest concurrency whose p99 TTFT and mean TPOT meet the job's SLOs (None without SLOs)."""


def ttft_percentiles(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, job: ServeJob,
                     batch: Any) -> tuple[dict[int, float], float]:
    """TTFT at the prompt length's percentiles and its mean over the prompt lengths (quadrature).
    Derived: docs/formulas.md#infer.lengths"""
    d = lengths_of(job)[0]

    def ttft(n: float) -> float:
        return float(prefill_seconds(m, plan, system, spans, job.model_copy(update={"input_len": n}), batch))

    x, w = points(d)
    mean = float(sum(wi * ttft(xi) for xi, wi in zip(x, w, strict=True)))
    return {p: ttft(quantile(d, p / 100)) for p in PERCENTILES}, mean


def tpot_percentiles(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, job: ServeJob,
                     batch: int) -> dict[int, float]:
    """Decode-step time over TPOT_SAMPLES steps, each running `batch` sequences drawn with a fixed seed
    (prompts from the input distribution, outputs length-weighted, each halfway through its output).
    Derived: docs/formulas.md#infer.lengths"""
    rng = np.random.default_rng(SEED)
    d_in, d_out = lengths_of(job)
    n = TPOT_SAMPLES * max(batch, 1)
    ctx = (sample(d_in, n, rng) + sample(d_out, n, rng, length_biased=True) / 2).reshape(TPOT_SAMPLES, -1)
    steps = np.broadcast_to(job_tpot(m, plan, system, spans, job, batch, ctx.mean(axis=1)), (TPOT_SAMPLES,))
    return {p: float(np.percentile(steps, p)) for p in PERCENTILES}


def slo_batch(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, job: ServeJob,
              limit: int) -> int:
    """Largest concurrency (up to `limit`) whose TTFT at the p99 prompt and TPOT at the length-weighted mean
    context meet the job's SLOs (0 if none does), on batches_under_slo's grid.
    Derived: docs/formulas.md#infer.lengths"""
    if limit < 1:
        return 0
    grid = np.unique(np.round(np.geomspace(1, limit, 96))).astype(float)
    ok = np.ones(grid.shape, dtype=bool)
    if job.ttft_slo_s is not None:
        p99 = job.model_copy(update={"input_len": quantile(lengths_of(job)[0], 0.99)})
        ok &= np.asarray(prefill_seconds(m, plan, system, spans, p99, grid)) <= job.ttft_slo_s
    if job.tpot_slo_s is not None:
        ok &= np.asarray(job_tpot(m, plan, system, spans, job, grid, held_tokens(job)[1])) <= job.tpot_slo_s
    return int(grid[ok].max()) if ok.any() else 0


def length_stats(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, job: ServeJob,
                 kv_available: float) -> LengthStats:
    """TTFT/TPOT percentiles, KV capacity and throughput under the job's distributions at job.batch: capacity
    = KV memory over the length-weighted tokens a sequence holds; throughput = B E[O] / (E[O] TPOT + B
    E[prefill work]), today's formula with expectations (one fixed length gives today's numbers).
    Derived: docs/formulas.md#infer.lengths"""
    held, context = held_tokens(job)
    if job.speculative is not None:
        from llmplan.cost.speculative import speculative_kv_per_seq  # the draft's cache and slots as serve_memory
        per_seq = float(speculative_kv_per_seq(m, plan, job.speculative, held, job.block_size))
    else:
        per_seq = float(kv_bytes_per_seq_gpu(m, plan, held, job.block_size))
    (xi, wi), (xo, wo) = (points(d) for d in lengths_of(job))
    b = job.batch
    tpot = float(job_tpot(m, plan, system, spans, job, b, context))
    work = sum(w * prefill_work_seconds(m, plan, system, spans, job.model_copy(update={"input_len": x}))
               for x, w in zip(xi, wi, strict=True))
    out_mean = float(wo @ xo)
    ttft, ttft_mean = ttft_percentiles(m, plan, system, spans, job, b)
    seqs = max(0, int(kv_available // per_seq)) if per_seq else 0
    slos = job.ttft_slo_s is not None or job.tpot_slo_s is not None
    return LengthStats(
        input_mean=float(wi @ xi), output_mean=out_mean, held_tokens=held, ttft_s=ttft, ttft_mean_s=ttft_mean,
        tpot_s=tpot_percentiles(m, plan, system, spans, job, b), tpot_mean_s=tpot,
        max_concurrent_seqs=seqs, tokens_per_s_replica=b * out_mean / (out_mean * tpot + b * work),
        slo_batch=slo_batch(m, plan, system, spans, job, seqs) if slos else None)
