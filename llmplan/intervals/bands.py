"""Bands of left-out log-residuals (docs/validation.md#intervals): the shipped residual file, the records nearest
a plan's regime (select), the quantile pair its band takes (nominal_of) and the training, memory and serving
bands built from them (llmplan.intervals' module docstring states the rule)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Iterable

import numpy as np

from llmplan.intervals.regimes import (POOLS, RELAX_ORDER, TAGS, UNCOVERED, Regime, cell_of, describe_key,
                                       pool_of, record_regime, source_of)

LEVEL = 0.8
"""Probability the interval is meant to hold (the 10th to the 90th percentile of left-out residuals)."""
MIN_RECORDS = 10
"""Fewest records an interval is built from."""
MIN_SOURCES = 3
"""Fewest sources (source_of) a band's runs come from before select keeps the scale and framework tags. A
left-out band is read for a new source, whose error is one draw of a source's bias: a band of one or two
sources' runs (NeMo 24.07's <= 64-GPU H100 runs drew on 12, nine of them Megatron-Bridge's; BLOOM's 384-GPU runs
on Megatron-LM's and MegaScale's) spans their biases, not the spread of biases a new source draws from, and no
quantile pair chosen over a cell corrects bands that span one source here and three there
(docs/validation.md#intervals-min-sources). The generation and dense/MoE tags are not dropped for it: losing
them means no family covers the plan (UNCOVERED, widened)."""
SOURCE_CHOICES = (MIN_SOURCES, 1)
"""The fewest sources a regime cell's or pool's bands may be drawn from, chosen per cell or pool by left-out
coverage like its quantile pair (conformal.choose_pools; docs/validation.md#intervals-cell-sources): MIN_SOURCES,
or 1 (select keeps the scale and framework tags whenever MIN_RECORDS runs match). Where a source's error grows
with the scale (NeMo CP's long-sequence rows), the scale-matched band of one or two sources is the one that
covers; where one or two sources' biases are not a new source's, the band of MIN_SOURCES is. A plan without
a cell or pool choice takes MIN_SOURCES."""
WIDEN = 1.5
"""Width factor of an interval whose regime no family covers."""
DATA = "residuals.json"


WEIGHTINGS = ("run", "family")
"""How a band's quantiles weigh the runs it is drawn from: every run alike (numpy.quantile), or every family
alike (each run 1 / its family's runs among them; weighted_quantile). A plan from a new software stack is one
draw of a family bias, so weighing families alike keeps one large family (NeMo 24.07: 11 of the 28 Hopper
<= 64-GPU runs) from setting the band's edges by itself; which one a pool takes is chosen by left-out
coverage like the pair."""

Choice = tuple[float, str]
"""(quantile pair as its central probability, weighting): what a band is drawn with."""


def min_sources_of(data: dict[str, Any], want: Regime) -> int:
    """The fewest sources (SOURCE_CHOICES) a plan's band is drawn from: that of the cell or pool whose own choice
    the plan takes (nominal_of), else MIN_SOURCES (also for a file written before the choice existed)."""
    _, _, _, key = nominal_of(data, want)
    info = data.get("pools", {}).get(key) if key else None
    return int(info.get("min_sources", MIN_SOURCES)) if info else MIN_SOURCES


def nominal_of(data: dict[str, Any], want: Regime) -> tuple[float, str, str, str]:
    """The quantile pair (central probability) of a plan's band, its weighting (WEIGHTINGS), where it comes from
    (its regime cell's own choice, else its pool's, else the all-regime pair with the reason the pool has none;
    "" for a file without pools) and the cell or pool whose own choice it is ("" for the all-regime pair)."""
    pools = data.get("pools", {})
    default = float(data.get("nominal", LEVEL))
    pool = pool_of(want)
    for key in (cell_of(want), pool):
        info = pools.get(key)
        if info is not None and info.get("nominal") is not None:
            weighting = str(info.get("weighting", "run"))
            how = "" if weighting == "run" else ", every family weighted alike"
            target = "75-85%" if info.get("inside", True) else "75% or more (no choice inside 75-85% is as narrow)"
            if info.get("fallback") == "widened":
                return float(info["nominal"]), weighting, (
                    f"the {100 * info['nominal']:g}% pair{how}: "
                    + ("the cell's pool's choice" if info.get("fallback_from", "pool") == "pool"
                       else "the all-regime pair") + " widened until its left-out "
                    f"coverage over the {info['families']} {describe_key(key)} families is {target}"
                    + ("; made without one of its sources, it covers that source's runs under 75%"
                       if info.get("nested_ok") is False else "")), key
            return float(info["nominal"]), weighting, (
                f"the {100 * info['nominal']:g}% pair{how}, the narrowest whose left-out coverage over the "
                f"{info['families']} {describe_key(key)} families is {target}"), key
    info = pools.get(pool)
    if info is None:
        return default, "run", "", ""
    cell = pools.get(cell_of(want), {}).get("why")
    return default, "run", (f"the all-regime {100 * default:g}% pair: "
                            + (f"the {want.generation} cell {cell}; " if cell else "")
                            + f"the {POOLS[pool]} pool {info['why']}"), ""


@lru_cache(maxsize=1)
def shipped() -> dict[str, Any]:
    """The residual file shipped in the package (llmplan/data/residuals.json)."""
    return json.loads((resources.files("llmplan") / "data" / DATA).read_text(encoding="utf-8"))


@dataclass(frozen=True)
class Band:
    """Log-residual quantiles: a rate's interval is [rate * exp(lo), rate * exp(hi)]."""

    lo: float
    hi: float
    n: int
    basis: str
    widened: bool = False
    short: str = ""
    """The basis in a few words, for text output."""
    pool: str = ""
    """The regime cell or pool (cell_of, POOLS) whose runs' coverage chose the quantile pair, or "" (the
    all-regime pair)."""
    nominal: float = LEVEL
    """The quantile pair taken, as its central probability."""
    weighting: str = "run"
    """How the quantiles weigh the runs (WEIGHTINGS)."""
    min_sources: int = MIN_SOURCES
    """The fewest sources the band's runs were selected from (SOURCE_CHOICES)."""

    def rate(self, x: float) -> list[float]:
        return [float(x * np.exp(self.lo)), float(x * np.exp(self.hi))]

    def time(self, x: float) -> list[float]:
        return [float(x * np.exp(-self.hi)), float(x * np.exp(-self.lo))]


def weighted_quantile(values: Iterable[float], weights: Iterable[float], q: float) -> float:
    """The q quantile of `values` with `weights` (midpoint rule on the weighted empirical distribution: with
    equal weights, numpy.quantile's 'hazen' method)."""
    v, w = np.asarray(list(values), dtype=float), np.asarray(list(weights), dtype=float)
    order = np.argsort(v, kind="stable")
    v, w = v[order], w[order]
    return float(np.interp(q, (np.cumsum(w) - w / 2) / w.sum(), v))


def family_weights(families: Iterable[str]) -> np.ndarray:
    """Each run's weight when every family weighs alike: 1 / its family's runs among `families`."""
    fams = list(families)
    n = Counter(fams)
    return np.array([1 / n[f] for f in fams], dtype=float)


def quantile_band(r: Iterable[float], basis: str, widen: bool = False, nominal: float = LEVEL,
                  weights: Iterable[float] | None = None) -> Band:
    """The band between the (1 - nominal) / 2 and (1 + nominal) / 2 quantiles of the residuals `r` (every run
    alike, numpy.quantile; with `weights`, weighted_quantile), widened WIDEN x about its centre when `widen`."""
    arr = np.asarray(list(r), dtype=float)
    qs = [(1 - nominal) / 2, (1 + nominal) / 2]
    if weights is None:
        lo, hi = (float(v) for v in np.quantile(arr, qs))
    else:
        w = list(weights)
        lo, hi = weighted_quantile(arr, w, qs[0]), weighted_quantile(arr, w, qs[1])
    if widen:
        mid, half = (lo + hi) / 2, WIDEN * (hi - lo) / 2
        lo, hi = mid - half, mid + half
    return Band(lo, hi, len(arr), basis, widen)


def _relax_key(g: Regime) -> tuple[Any, ...]:
    """A regime's tags in RELAX_ORDER: the records sharing the tags kept after dropping n share key[n:]."""
    return tuple(g.tag(t) for t in RELAX_ORDER)


def select(records: list[dict[str, Any]], want: Regime, exclude_family: str | None = None,
           min_sources: int = MIN_SOURCES) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
    """The records nearest `want` (module docstring) and the tags dropped: a tag goes (RELAX_ORDER) while fewer
    than MIN_RECORDS runs match, or while they come from fewer than `min_sources` sources (SOURCE_CHOICES) and
    the tag is not one whose loss leaves the plan uncovered (UNCOVERED)."""
    pool = [r for r in records if r["family"] != exclude_family]
    keys = [_relax_key(record_regime(r)) for r in pool]
    mine = _relax_key(want)
    for n in range(len(RELAX_ORDER)):
        hits = [r for r, k in zip(pool, keys, strict=True) if k[n:] == mine[n:]]
        sources = RELAX_ORDER[n] in UNCOVERED or len({source_of(r) for r in hits}) >= min_sources
        if len(hits) >= MIN_RECORDS and sources:
            return hits, RELAX_ORDER[:n]
    return pool, RELAX_ORDER


def training_band(want: Regime, data: dict[str, Any] | None = None, exclude_family: str | None = None) -> Band:
    """The rate band of a training plan in regime `want` (exclude_family: as if that family were unpublished,
    for the coverage test). Its quantiles are the pair of the plan's regime pool where the file gives it one,
    else the file's `nominal` pair (docs/validation.md#intervals: the pairs choose_pools and choose_nominal
    pick by left-out coverage); the basis says which, and why a pool has none."""
    data = data or shipped()
    sources = min_sources_of(data, want)
    hits, dropped = select(data["training"], want, exclude_family, sources)
    kept = [t for t in TAGS if t not in dropped]
    uncovered = [t for t in dropped if t in UNCOVERED]
    widen = bool(uncovered)
    fams = sorted({r["family"] for r in hits})
    nominal, weighting, how, own = nominal_of(data, want)
    basis = (f"left-out residuals of {len(hits)} runs ({', '.join(fams)})"
             + (f" matching {want.describe(kept)}" if kept else "") + (f"; quantiles: {how}" if how else ""))
    if sources != MIN_SOURCES:
        basis += (f"; runs of any number of sources (the cell's choice by left-out coverage, not the "
                  f"{MIN_SOURCES} sources of the default)")
    if widen:
        basis += f"; no validation family covers {want.describe(uncovered)}: widened {WIDEN:g}x"
    weights = family_weights(r["family"] for r in hits) if weighting == "family" else None
    band = quantile_band((r["r"] for r in hits), basis, widen, nominal, weights)
    short = f"{len(hits)} left-out runs" + (f" ({want.describe(kept)})" if kept else " (all regimes)")
    if widen:
        short += f", widened {WIDEN:g}x: no family covers {want.describe(uncovered)}"
    return Band(band.lo, band.hi, band.n, basis, widen, short, own, nominal, weighting, sources)


def memory_band(data: dict[str, Any] | None = None) -> Band | None:
    records = (data or shipped()).get("memory", [])
    if len(records) < MIN_RECORDS:
        return None
    fams = sorted({r["family"] for r in records})
    b = quantile_band((r["r"] for r in records), "")
    return Band(b.lo, b.hi, b.n, f"{b.n} published memory peaks ({', '.join(fams)}; memory has no fitted "
                f"constant)")


def serving_band(data: dict[str, Any] | None = None) -> Band | None:
    records = (data or shipped()).get("serving", [])
    if len(records) < MIN_RECORDS:
        return None
    b = quantile_band((r["r"] for r in records), "")
    models = len({r["model"] for r in records})
    return Band(b.lo, b.hi, b.n, f"left-out residuals of {b.n} TensorRT-LLM throughput runs ({models} models, "
                f"each scored with constants fitted without it); TTFT and TPOT scaled as times")
