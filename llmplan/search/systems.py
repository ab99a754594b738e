"""Which cluster to rent: one training search per system (each with the single-system search's rules), the
best plan of each priced for the whole run (cost.budget), and the systems ranked by the objective, ties marked
with the single-system search's resolution (llmplan.intervals; issue 37)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from llmplan.cost.budget import RunBudget, run_budget
from llmplan.errors import LlmplanError
from llmplan.intervals import resolution as model_resolution
from llmplan.intervals import tied, training_interval
from llmplan.search.run import SearchResult
from llmplan.search.ties import at_risk, risk_words, row_order
from llmplan.specs.hardware import SystemSpec

COMPARE_OBJECTIVES = ("throughput", "time-to-train", "gpu-hours", "cost")
"""What a comparison of systems ranks by: the best plan's tokens/s (higher first), or the run's wall-clock time,
GPU-hours or cost (lower first; all three include the goodput)."""
PER_SYSTEM_OBJECTIVE = {"cost": "gpu-hours"}
"""The objective each system's own search ranks its plans by: on one system at a fixed GPU count and price the
cheapest run is the one with the fewest GPU-hours."""


@dataclass(frozen=True)
class Price:
    """A price per GPU-hour (US dollars) and where it comes from."""

    usd: float
    source: str


@dataclass(frozen=True)
class SystemBest:
    """One system's search and its best plan's run, at the point and at the ends of its 80% interval."""

    name: str
    """The system as --hardware named it."""
    result: SearchResult
    price: Price | None
    budget: RunBudget | None = None
    """The best plan's run; None when no plan fits."""
    slow: RunBudget | None = None
    """The run at the low end of the best plan's tokens/s interval (llmplan.intervals)."""
    fast: RunBudget | None = None
    """The run at the high end."""
    tokens_per_s: tuple[float, float, float] | None = None
    """The best plan's tokens/s: point, interval low, interval high."""


@dataclass(frozen=True)
class Comparison:
    """The systems ranked (those where nothing fits last), with ties as the single-system search marks them."""

    objective: str
    tokens: float
    systems: list[SystemBest]
    tied_with: list[list[int]] = field(default_factory=list)
    """Per rank: the ranks (1-based) whose ranked figure is inside the model's resolution of it."""
    resolution: float | None = None
    """|log| of a ratio inside which two figures are tied (intervals.resolution); None when nothing fits."""
    seconds: float = 0.0
    tie_notes: list[str] = field(default_factory=list)
    """Where a system goes above one with a better figure it is tied with: why (search.ties.risk_words)."""


def budget_nodes(system: SystemSpec, budget_gpus: int) -> int:
    """Whole nodes of `system` inside a budget of GPUs (0 when one node has more)."""
    return budget_gpus // system.gpus_per_node


def prices_for(names: Sequence[str], systems: Sequence[SystemSpec], given: Mapping[str, float],
               objective: str) -> list[Price | None]:
    """Each system's price: the one given (--price), else its profile's; with the cost objective every system
    needs one (LlmplanError names those without)."""
    out = [Price(given[n], "--price") if n in given else
           Price(s.price_per_gpu_hour, s.price_source) if s.price_per_gpu_hour is not None else None
           for n, s in zip(names, systems, strict=True)]
    missing = [n for n, p in zip(names, out, strict=True) if p is None]
    if objective == "cost" and missing:
        raise LlmplanError(f"--objective cost needs a price per GPU-hour for every system; {', '.join(missing)} "
                           f"cite(s) none in the profile: give it, e.g. --price {missing[0]}=USD")
    return out


def figure(b: RunBudget, tokens_per_s: float, objective: str) -> float:
    """The ranked quantity of a run: tokens/s, wall-clock seconds, GPU-hours or US dollars."""
    if objective == "throughput":
        return tokens_per_s
    if objective == "time-to-train":
        return b.effective_seconds
    if objective == "gpu-hours":
        return b.effective_gpu_hours
    return b.cost_usd if b.cost_usd is not None else math.inf


def ranked_figure(r: SystemBest, objective: str) -> float:
    """figure() of a system whose best plan fits."""
    assert r.budget is not None and r.tokens_per_s is not None  # compare ranks the rows that fit only
    return figure(r.budget, r.tokens_per_s[0], objective)


def priced(name: str, res: SearchResult, price: Price | None, tokens: float) -> SystemBest:
    """The system's best plan priced for the run at its point and at its 80% interval's ends."""
    if not res.ranked:
        return SystemBest(name, res, price)
    e = res.ranked[0]
    share = float(e.goodput.useful) if e.goodput is not None else 1.0
    watts = e.cluster.system.gpu.power_limit_w
    usd = price.usd if price is not None else None
    point = float(e.throughput.tokens_per_s)
    lo, hi = training_interval(e)["tokens_per_s"]
    runs = [run_budget(tokens, r, share, e.cluster.num_gpus, usd, watts) for r in (point, lo, hi)]
    return SystemBest(name, res, price, runs[0], runs[1], runs[2], (point, lo, hi))


def compare(names: Sequence[str], prices: Sequence[Price | None], search_one: Callable[[str], SearchResult],
            objective: str, tokens: float) -> Comparison:
    """Search each system (search_one: one system's search, as `search` runs it) and rank their best plans by
    the objective, the ones where nothing fits last; ties by the single-system rule (intervals.resolution on
    the ranked figure), and among tied systems the one search's first tie rule: a best plan whose memory
    interval's upper end passes the GPU (search.ties.at_risk) goes after tied ones that fit there, row by row
    as search.ties.resolve orders tied plans (docs/validation.md#headroom-tiers)."""
    t0 = time.perf_counter()
    rows = [priced(n, search_one(n), p, tokens) for n, p in zip(names, prices, strict=True)]
    fit = [r for r in rows if r.budget is not None]
    sign = -1.0 if objective == "throughput" else 1.0
    fit.sort(key=lambda r: sign * ranked_figure(r, objective))
    if not fit:
        return Comparison(objective, tokens, fit + rows, [[] for _ in rows], None, time.perf_counter() - t0)
    res = model_resolution(moe=bool(fit[0].result.ranked[0].model.num_experts))
    figs = [ranked_figure(r, objective) for r in fit]
    order = row_order(len(fit), lambda j, i: tied_figures(figs[j], figs[i], res),
                      lambda open_: min(open_, key=lambda i: (at_risk(fit[i].result.ranked[0]), i)))
    notes = [f"{fit[i].name} before {fit[j].name} ({objective} tied): "
             + risk_words(fit[i].result.ranked[0], fit[j].result.ranked[0])
             for i, j in zip(order, order[1:]) if i > j]
    fit, figs = [fit[i] for i in order], [figs[i] for i in order]
    ranked = fit + [r for r in rows if r.budget is None]
    tied = [[j + 1 for j, g in enumerate(figs) if j != i and tied_figures(f, g, res)] for i, f in enumerate(figs)]
    return Comparison(objective, tokens, ranked, tied + [[] for _ in ranked[len(fit):]], res,
                      time.perf_counter() - t0, notes)


def tied_figures(a: float, b: float, res: float) -> bool:
    """Whether two figures are inside the resolution of each other (intervals.tied; never when one is 0 or inf)."""
    return 0 < a < math.inf and 0 < b < math.inf and tied(a, b, res)
