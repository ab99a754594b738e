"""What a whole training run costs: its wall-clock time, GPU-hours, price and GPU energy for a token budget, from
a plan's throughput and goodput (docs/formulas.md#budget.run)."""

from __future__ import annotations

from dataclasses import dataclass

from llmplan.cost.goodput import HOUR

KWH_J = 3.6e6
"""Joules in a kilowatt-hour."""


@dataclass(frozen=True)
class RunBudget:
    """A training run of `tokens` tokens on `gpus` GPUs. The effective figures include the time lost to
    failures, checkpoints and restarts (cost.goodput): what a rented cluster is billed for."""

    tokens: float
    """Tokens trained."""
    gpus: int
    """GPUs the run holds."""
    seconds: float
    """Training time at the predicted throughput, no failures (s)."""
    effective_seconds: float
    """Wall-clock time: seconds / goodput (inf at zero goodput)."""
    gpu_hours: float
    """GPUs x seconds, in GPU-hours."""
    effective_gpu_hours: float
    """GPUs x effective_seconds, in GPU-hours."""
    cost_usd: float | None
    """effective_gpu_hours x the price per GPU-hour (US dollars); None without a price."""
    energy_kwh: float | None
    """GPU board energy over the wall-clock time at the board power limit (kWh): an upper bound for the GPUs,
    which rarely draw their full limit for a whole run; hosts, network and cooling are not counted. None
    without a power figure."""


def run_budget(tokens: float, tokens_per_s: float, goodput: float, gpus: int,
               price_per_gpu_hour: float | None = None, watts_per_gpu: float | None = None) -> RunBudget:
    """The run's time, GPU-hours, cost and GPU energy. Derived: docs/formulas.md#budget.run"""
    seconds = tokens / tokens_per_s
    wall = seconds / goodput if goodput > 0 else float("inf")
    gpu_hours = seconds * gpus / HOUR
    effective = wall * gpus / HOUR
    cost = effective * price_per_gpu_hour if price_per_gpu_hour is not None else None
    energy = wall * gpus * watts_per_gpu / KWH_J if watts_per_gpu is not None else None
    return RunBudget(tokens, gpus, seconds, wall, gpu_hours, effective, cost, energy)
