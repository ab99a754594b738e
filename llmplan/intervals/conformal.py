"""Choosing a band's quantile pair by left-out coverage (split-conformal calibration; docs/validation.md#intervals):
each record's band from the other families' (and sources') residuals, the coverage per family left out, the
all-regime pair (choose_nominal) and the regime pools' and cells' own choices (choose_pools) that
benchmarks/intervals.py writes into llmplan/data/residuals.json."""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

import numpy as np

from llmplan.intervals.bands import (LEVEL, MIN_SOURCES, SOURCE_CHOICES, UNCOVERED, WEIGHTINGS, Band, Choice,
                                     family_weights, min_sources_of, nominal_of, quantile_band, select)
from llmplan.intervals.regimes import POOLS, cell_of, pool_of, record_regime, source_of

POOL_MIN_FAMILIES = 3
"""Fewest families (of POOL_MIN_RECORDS runs or more) a pool needs to choose its own pair."""
POOL_MIN_RECORDS = 3
"""Fewest runs a family needs in a pool to count towards POOL_MIN_FAMILIES."""
POOL_RULE = 6
"""The rule the file's `pools` were chosen by (benchmarks/intervals.py writes it; its report rechooses older
files' pools and pair): 2 adds the regime cells (cell_of) and the choice of weighting (WEIGHTINGS); 3 makes the
nested check leave out the whole source (source_of), not only the family; 4 draws bands from MIN_SOURCES
sources (select) and takes the honest side where no choice is inside TARGET: the narrowest covering at least
its lower edge (covers), not a fallback that covers less (docs/validation.md#intervals-min-sources); 5 chooses
the fewest sources a band is drawn from (SOURCE_CHOICES) per cell and pool with its pair, by the same left-out
coverage, and carries it into the runtime band; the choice is tried at rising lower edges (LOWERS) until its
nested coverage reaches 75% (docs/validation.md#intervals-cell-sources); 6: a cell of POOL_MIN_FAMILIES+
families without its own choice takes its pool's (or the all-regime pair) only where that covers the cell's
runs left out at least 75%, else that choice widened until it does, nested-checked (_widen_fallback;
docs/validation.md#intervals-cell-fallback)."""
NOMINAL_CHOICES = (0.8, 0.85, 0.9, 0.925, 0.95, 0.975, 0.99)
"""The quantile pairs (as central probabilities) the residual script chooses the shipped one from."""
POOL_CHOICES: tuple[Choice, ...] = tuple((q, w) for w in WEIGHTINGS for q in NOMINAL_CHOICES)
"""What a regime pool or cell chooses its own band from: every pair, with every run or every family alike."""
TARGET = (0.75, 0.85)
"""The left-out coverage an 80% interval is meant to reach (issue 33)."""

LeftOut = tuple[np.ndarray, np.ndarray, bool]
"""A record's left-out band material: the residuals select() gives it, their family weights, widened or not."""
Sourced = dict[int, dict[str, LeftOut]]
"""Left-out band material per record (left_out_pools) for each of SOURCE_CHOICES."""
Cand = tuple[float, str, int]
"""What a cell or pool chooses: (quantile pair, weighting, fewest sources its bands are drawn from)."""


def left_out_pools(records: list[dict[str, Any]], without: str | None = None,
                   ids: set[str] | None = None, min_sources: int = MIN_SOURCES) -> dict[str, LeftOut]:
    """Per record (id; only `ids` when given): the residuals select() gives it with its own family and every
    family of its source (source_of) left out, their family weights (family_weights) and whether its band is
    widened; `without` is a source (source_of: a family in a file without sources) whose every family is left
    out of the records and of their bands, as if it were unpublished."""
    out = {}
    pool = [x for x in records if source_of(x) != without]
    for r in records:
        if source_of(r) == without or (ids is not None and r["id"] not in ids):
            continue
        others = [x for x in pool if source_of(x) != source_of(r)]
        hits, dropped = select(others, record_regime(r), r["family"], min_sources)
        out[r["id"]] = (np.array([h["r"] for h in hits]), family_weights(h["family"] for h in hits),
                        any(t in UNCOVERED for t in dropped))
    return out


def left_out_sourced(records: list[dict[str, Any]], without: str | None = None,
                     ids: set[str] | None = None) -> Sourced:
    """left_out_pools under each of SOURCE_CHOICES."""
    return {n: left_out_pools(records, without, ids, n) for n in SOURCE_CHOICES}


def as_sourced(records: list[dict[str, Any]], pools: dict[Any, Any]) -> Sourced:
    """`pools` as Sourced: itself when keyed by SOURCE_CHOICES, else (left_out_pools at MIN_SOURCES) with the
    other choices' material computed for the same records."""
    if pools and all(isinstance(k, int) for k in pools):
        return pools
    ids = set(pools)
    return {n: pools if n == MIN_SOURCES else left_out_pools(records, None, ids, n) for n in SOURCE_CHOICES}


def merged_pools(records: list[dict[str, Any]], data: dict[str, Any], sourced: Sourced) -> dict[str, LeftOut]:
    """Per record: its left-out band material under the fewest sources its cell or pool chose in `data`
    (min_sources_of), as the runtime band draws it."""
    base = sourced[MIN_SOURCES]
    return {r["id"]: sourced[min_sources_of(data, record_regime(r))][r["id"]] for r in records if r["id"] in base}


def as_choice(x: float | Choice) -> Choice:
    """A pair given as its central probability alone is run-weighted."""
    return (float(x), "run") if isinstance(x, (int, float)) else (float(x[0]), str(x[1]))


def left_out_band(material: LeftOut, choice: float | Choice) -> Band:
    """A record's left-out band (left_out_pools) under a pair, or a (pair, weighting) choice."""
    values, weights, widen = material
    nominal, weighting = as_choice(choice)
    return quantile_band(values, "", widen, nominal, weights if weighting == "family" else None)


def half_width(b: Band) -> float:
    """A band's half-width as a fraction of the point: (exp(hi) - exp(lo)) / 2."""
    return float(np.exp(b.hi) - np.exp(b.lo)) / 2


def coverage(records: list[dict[str, Any]],
             nominal: float | Choice | Callable[[dict[str, Any]], float | Choice],
             pools: dict[str, LeftOut] | None = None) -> dict[str, tuple[int, int, float]]:
    """Per family left out: (records inside, records, median half-width as a fraction of the point) of the
    band each of its records gets from the other families' residuals by the rule above (`nominal`: one pair or
    (pair, weighting) choice, or the choice of each record)."""
    pools = pools if pools is not None else left_out_pools(records)

    def pair(r: dict[str, Any]) -> float | Choice:
        return nominal(r) if callable(nominal) else nominal

    out: dict[str, tuple[int, int, float]] = {}
    for fam in sorted({r["family"] for r in records if r["id"] in pools}):
        inside, halves = 0, []
        mine = [r for r in records if r["family"] == fam and r["id"] in pools]
        for r in mine:
            b = left_out_band(pools[r["id"]], pair(r))
            inside += int(b.lo <= r["r"] <= b.hi)
            halves.append(half_width(b))
        out[fam] = (inside, len(mine), float(np.median(halves)))
    return out


def median_half(records: list[dict[str, Any]], choice: float | Choice, pools: dict[str, LeftOut]) -> float:
    """The median half-width (fraction of the point) of the left-out bands of `records` under `choice`."""
    return float(np.median([half_width(left_out_band(pools[r["id"]], choice)) for r in records if r["id"] in pools]))


def mean_coverage(cov: dict[str, tuple[int, int, float]]) -> float:
    """Coverage with every family weighted alike (MPT's 216 scans count as one family)."""
    return float(np.mean([i / n for i, n, _ in cov.values()]))


def per_record(cov: dict[str, tuple[int, int, float]]) -> float:
    """Coverage with every record weighted alike."""
    return sum(c[0] for c in cov.values()) / max(1, sum(c[1] for c in cov.values()))


def inside_target(cov: dict[str, tuple[int, int, float]]) -> bool:
    return all(TARGET[0] <= x <= TARGET[1] for x in (per_record(cov), mean_coverage(cov)))


def covers(cov: dict[str, tuple[int, int, float]], lower: float = TARGET[0]) -> bool:
    """Coverage at least `lower` (TARGET's lower edge unless given) both per record and per family: the honest
    side of the target (an 80% interval that covers more is wider than it needs to be; one that covers less
    misleads)."""
    return all(lower <= x for x in (per_record(cov), mean_coverage(cov)))


def choose_nominal(records: list[dict[str, Any]], pools: dict[str, LeftOut] | None = None) -> float:
    """The narrowest NOMINAL_CHOICES pair (every run alike) whose left-out coverage is inside TARGET both per
    record and with every family weighted alike; when none is, the narrowest covering at least TARGET's lower
    edge both ways (covers: the honest side); when none does, the one whose mean over families is nearest
    LEVEL."""
    pools = pools if pools is not None else left_out_pools(records)
    covs = {q: coverage(records, q, pools) for q in NOMINAL_CHOICES}
    for ok in (inside_target, covers):
        good = [q for q, cov in covs.items() if ok(cov)]
        if good:
            return min(good)
    return min(NOMINAL_CHOICES, key=lambda q: abs(mean_coverage(covs[q]) - LEVEL))


def _narrowest_inside(records: list[dict[str, Any]], sourced: Sourced, lower: float = TARGET[0]) -> Cand | None:
    """Of POOL_CHOICES under each of SOURCE_CHOICES (the bands of `sourced`) whose left-out coverage over
    `records` is at least `lower` both per record and per family, the one with the narrowest median half-width
    (ties: one inside TARGET, more sources, the smaller pair, every run alike); None when none covers `lower`.
    A narrowest one inside TARGET is taken before any wider; one covering more than TARGET's upper edge is taken
    only when it is narrower than every one inside (it is better on both counts)."""
    cands = [(c[0], c[1], n) for n in sourced for c in POOL_CHOICES]
    covs = {c: coverage(records, c[:2], sourced[c[2]]) for c in cands}
    good = [c for c in cands if covers(covs[c], lower)]
    if not good:
        return None
    # the narrowest covering `lower`: one inside the target is taken unless one covering more is narrower still
    # (it is better on both counts); ties: inside the target, more sources, the smaller pair, every run alike
    return min(good, key=lambda c: (round(median_half(records, c[:2], sourced[c[2]]), 6), not inside_target(covs[c]),
                                    -c[2], c[0], WEIGHTINGS.index(c[1])))


def _nested_coverage(records: list[dict[str, Any]], mine: list[dict[str, Any]],
                     pools: dict[str, LeftOut] | Sourced, default: float, lower: float = TARGET[0],
                     cache: dict[str, Sourced] | None = None) -> tuple[dict[str, tuple[int, int, float]], float]:
    """Coverage of a pool's runs (`mine`) when the choice that scores each family is made as choose_pools does
    (_narrowest_inside at `lower`), without every family of its source (source_of: the pool's runs of other
    sources, their bands drawn without that source either; `default` at MIN_SOURCES where none of their
    choices covers `lower`), and the median half-width of those bands over the runs (`pools`: left_out_pools,
    or left_out_sourced; `cache`: the left-out material without each source, kept between calls)."""
    return _nested_by(records, mine, as_sourced(records, pools), lambda rest, s: _narrowest_inside(rest, s, lower),
                      (*as_choice(default), MIN_SOURCES), {} if cache is None else cache)


def _nested_by(records: list[dict[str, Any]], mine: list[dict[str, Any]], sourced: Sourced,
               choose: Callable[[list[dict[str, Any]], Sourced], Cand | None], fallback: Cand,
               cache: dict[str, Sourced]) -> tuple[dict[str, tuple[int, int, float]], float]:
    """The nested check's one computation (_nested_coverage, _widened_nested): coverage of `mine` when each
    source's runs are scored by the choice `choose` makes on the other sources' runs of `mine` (their bands
    drawn without that source either; `fallback` where it makes none), and the median half-width of those
    bands (`cache`: the left-out material without each source, filled here and kept between calls)."""
    chosen: dict[str, Cand] = {}
    for src in sorted({source_of(r) for r in mine}):
        rest = [r for r in mine if source_of(r) != src]
        if rest and src not in cache:
            cache[src] = left_out_sourced(records, src, {r["id"] for r in rest})
        c = choose(rest, cache[src]) if rest else None
        chosen[src] = fallback if c is None else c
    mats = {r["id"]: sourced[chosen[source_of(r)][2]][r["id"]] for r in mine if r["id"] in sourced[MIN_SOURCES]}
    halves = [half_width(left_out_band(mats[r["id"]], chosen[source_of(r)][:2])) for r in mine if r["id"] in mats]
    half = float(np.median(halves)) if halves else 0.0
    return coverage(mine, lambda r: chosen[source_of(r)][:2], mats), half

LOWERS = (0.75, 0.775, 0.8, 0.825, 0.85)
"""The lower coverage edges a cell's or pool's choice is tried at, in turn (choose_pools): the first whose
choice, made the same way without each source, still covers 75% of that source's runs (nested) is kept. A
choice that just reaches 75% over the sources it was chosen on covers less of a new one; asking it for more
is the margin the nested check measures (docs/validation.md#intervals-cell-sources)."""


def choose_pools(records: list[dict[str, Any]], pools: dict[str, LeftOut] | None = None,
                 default: float | None = None, nested: bool = True,
                 sourced: Sourced | None = None) -> dict[str, dict[str, Any]]:
    """Per regime pool (POOLS) and per regime cell (cell_of: a pool on one GPU generation): its own choice, the
    POOL_CHOICES pair and weighting, and the fewest sources of its bands (SOURCE_CHOICES), of narrowest median
    half-width whose left-out coverage over its runs is at least a lower edge both per record and per family
    (_narrowest_inside; `inside`: whether it is inside TARGET), kept only when that choice is stable: with the
    choice made the same way without each source in turn (every family of it: source_of), the coverage of the
    runs left out (nested, per run and per family) is at least TARGET's lower edge too (covers). The lower edge
    is TARGET's, else the first of LOWERS whose choice passes the nested check (`lower` in the file).
    None (the all-regime pair, `default`) when it has fewer than POOL_MIN_FAMILIES families of
    POOL_MIN_RECORDS runs, no choice covers 75%, or the nested coverage does not; "why" says which.
    The choice includes the fewest sources its bands are drawn from (SOURCE_CHOICES; `sourced`: each one's
    left-out material, computed from `records` when not given), `min_sources` in the file.
    Cells are listed only where some record falls in them."""
    sourced = sourced if sourced is not None else as_sourced(
        records, pools if pools is not None else left_out_pools(records))
    pools = sourced[MIN_SOURCES]
    default = default if default is not None else choose_nominal(records, pools)
    cells = sorted({cell_of(record_regime(r)) for r in records if r["id"] in pools})
    out: dict[str, dict[str, Any]] = {}
    for name in (*POOLS, *cells):
        key = cell_of if "/" in name else pool_of
        mine = [r for r in records if r["id"] in pools and key(record_regime(r)) == name]
        fams = sum(n >= POOL_MIN_RECORDS for n in Counter(r["family"] for r in mine).values())
        info: dict[str, Any] = {"nominal": None, "weighting": None, "families": fams, "records": len(mine)}
        out[name] = info
        if fams < POOL_MIN_FAMILIES:
            info["why"] = (f"has {fams} famil{'y' if fams == 1 else 'ies'} of {POOL_MIN_RECORDS}+ runs (fewer than "
                           f"{POOL_MIN_FAMILIES})")
            continue
        cache: dict[str, Sourced] = {}
        why = ""
        for lower in LOWERS if nested else LOWERS[:1]:
            own = _narrowest_inside(mine, sourced, lower)
            if own is None:
                why = why or (f"has no pair whose left-out coverage is {100 * TARGET[0]:g}% or more both per run "
                              "and per family")
                break
            info["inside"] = inside_target(coverage(mine, own[:2], sourced[own[2]]))
            if nested:
                cov, half = _nested_coverage(records, mine, sourced, default, lower, cache)
                info["nested"] = [round(per_record(cov), 4), round(mean_coverage(cov), 4)]
                info["nested_half"] = round(half, 4)
                if not covers(cov):
                    why = (f"has its own {100 * own[0]:g}% pair ({own[1]}-weighted), but chosen without the source "
                           f"it scores that choice covers {100 * per_record(cov):.1f}% of the runs "
                           f"({100 * mean_coverage(cov):.1f}% per family), under {100 * TARGET[0]:g}%, asking "
                           f"{100 * lower:g}% or more of the others")
                    continue
            info["nominal"], info["weighting"], info["min_sources"] = own
            info["lower"] = lower
            why = ""
            break
        if why:
            info["why"] = why
            if "/" in name:  # a cell (rule 6); a pool's fallback is the all-regime pair, as before
                _widen_fallback(records, mine, sourced, out.get(pool_of(record_regime(mine[0])), {}), default,
                                info, cache, nested)
    return out


def _widened(mine: list[dict[str, Any]], sourced: Sourced, start: Cand, lower: float) -> Cand | None:
    """The first pair from `start`'s on (NOMINAL_CHOICES, its weighting and fewest sources kept) whose left-out
    coverage over `mine` is at least `lower` both per run and per family; None when none is."""
    q, weighting, n = start
    for p in (x for x in NOMINAL_CHOICES if x >= q):
        if covers(coverage(mine, (p, weighting), sourced[n]), lower):
            return p, weighting, n
    return None


def _widen_fallback(records: list[dict[str, Any]], mine: list[dict[str, Any]], sourced: Sourced,
                    pool: dict[str, Any], default: float, info: dict[str, Any], cache: dict[str, Sourced],
                    nested: bool) -> None:
    """A cell of POOL_MIN_FAMILIES+ families with no own choice falls back to its pool's choice (else the
    all-regime pair) only where that covers the cell's runs left out at least TARGET's lower edge both per run
    and per family. Else (rule 6, docs/validation.md#intervals-cell-fallback) it takes that choice widened: the
    first wider pair (weighting and fewest sources kept) covering a lower edge of LOWERS, the first edge whose
    widening, done the same way without each source in turn, covers that source's runs 75% or more (nested);
    when no edge passes, the widening at TARGET's lower edge (it covers the cell's known sources where the
    fallback does not), its nested coverage kept in the file (`nested_ok` false) and reported. Sets `info`'s
    choice (`fallback`: "widened"), or leaves it without one (`fallback`: "pool" or "all-regime"); with the
    fallback's coverage over the cell (`fallback_coverage`)."""
    start: Cand = ((float(pool["nominal"]), str(pool["weighting"]), int(pool.get("min_sources", MIN_SOURCES)))
                   if pool.get("nominal") is not None else (float(default), "run", MIN_SOURCES))
    cov = coverage(mine, start[:2], sourced[start[2]])
    info["fallback"] = "pool" if pool.get("nominal") is not None else "all-regime"
    info["fallback_coverage"] = [round(per_record(cov), 4), round(mean_coverage(cov), 4)]
    if covers(cov):
        return
    taken: tuple[Cand, float, dict[str, tuple[int, int, float]] | None, float] | None = None
    for lower in LOWERS if nested else LOWERS[:1]:
        own = _widened(mine, sourced, start, lower)
        if own is None:
            break
        ncov, half = _widened_nested(records, mine, sourced, start, lower, cache) if nested else (None, 0.0)
        if taken is None or ncov is None or covers(ncov):
            taken = (own, lower, ncov, half)
        if ncov is None or covers(ncov):
            break
    if taken is None:
        return
    own, lower, ncov, half = taken
    info["nominal"], info["weighting"], info["min_sources"] = own
    info["inside"] = inside_target(coverage(mine, own[:2], sourced[own[2]]))
    info["lower"] = lower
    info["fallback_from"], info["fallback"] = info["fallback"], "widened"
    info["why_own"] = info.pop("why")
    if ncov is not None:
        info["nested"] = [round(per_record(ncov), 4), round(mean_coverage(ncov), 4)]
        info["nested_half"] = round(half, 4)
        info["nested_ok"] = covers(ncov)


def _widened_nested(records: list[dict[str, Any]], mine: list[dict[str, Any]], sourced: Sourced, start: Cand,
                    lower: float, cache: dict[str, Sourced]) -> tuple[dict[str, tuple[int, int, float]], float]:
    """Coverage of a cell's runs (`mine`) when _widened is done without each source in turn (its runs' bands
    drawn without it too; `start` where it finds none) and scores that source's runs, and the median
    half-width of those bands (_nested_by)."""
    return _nested_by(records, mine, sourced, lambda rest, s: _widened(rest, s, start, lower), start, cache)

def pair_of(data: dict[str, Any]) -> Callable[[dict[str, Any]], Choice]:
    """The (pair, weighting) choice each record's band takes under the file's pools and cells (nominal_of)."""
    def choice(r: dict[str, Any]) -> Choice:
        nominal, weighting, _, _ = nominal_of(data, record_regime(r))
        return nominal, weighting

    return choice
