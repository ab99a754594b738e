"""Queueing before prefill: a request that arrives while the server is busy with earlier prompts waits for
them. Each replica (attention rank, under DP attention) is one M/G/1 server of prompts: Poisson arrivals at
λ = the request rate over the replicas, service time S(x) = the engine time one prompt of x tokens costs when
prompts are batched (cost.inference.prefill_work_seconds), served first come first served.

Symbols: λ arrivals per second per server, S service seconds, ρ = λ E[S] utilisation.
"""

from __future__ import annotations

from typing import Any

from llmplan.cost.inference import Spans, prefill_work_seconds
from llmplan.cost.lengths import lengths_of, points
from llmplan.specs.hardware import SystemSpec
from llmplan.specs.model import ModelSpec
from llmplan.specs.serve import ServeJob, ServePlan


def pk_mean_wait(rate: float, mean_s: float, second_moment_s2: float) -> float:
    """Mean time in queue of an M/G/1 server (Pollaczek-Khinchine mean-value formula):
    W_q = λ E[S²] / (2 (1 - ρ)), ρ = λ E[S]; infinite when ρ >= 1 (the queue grows without bound). With one
    fixed service time (M/D/1) E[S²] = E[S]², so W_q = ρ E[S] / (2 (1 - ρ)).
    Source: Kleinrock 1975, Queueing Systems Vol. 1, ch. 5 (M/G/1, P-K mean-value formula)."""
    rho = rate * mean_s
    if rho >= 1.0:
        return float("inf")
    return rate * second_moment_s2 / (2.0 * (1.0 - rho))


def prefill_service_moments(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans,
                            job: ServeJob) -> tuple[float, float]:
    """(E[S], E[S²]) of one prompt's prefill service on a replica over the input-length distribution (one
    point for a fixed length): S(x) = prefill_work_seconds at input x. Derived: docs/formulas.md#infer.queue"""
    x, w = points(lengths_of(job)[0])
    s = [prefill_work_seconds(m, plan, system, spans, job.model_copy(update={"input_len": float(xi)})) for xi in x]
    mean = float(sum(wi * si for wi, si in zip(w, s, strict=True)))
    return mean, float(sum(wi * si * si for wi, si in zip(w, s, strict=True)))


def prefill_queue_seconds(m: ModelSpec, plan: ServePlan, system: SystemSpec, spans: Spans, job: ServeJob,
                          rate_per_replica: Any) -> float:
    """Mean wait before prefill of a request at `rate_per_replica` requests/s on one replica (M/G/1 over the
    prompt lengths; pk_mean_wait). Derived: docs/formulas.md#infer.queue"""
    mean, second = prefill_service_moments(m, plan, system, spans, job)
    return pk_mean_wait(float(rate_per_replica), mean, second)
