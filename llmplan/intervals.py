"""Prediction intervals from llmplan's own left-out validation errors (docs/validation.md#intervals).

`benchmarks/intervals.py --write` scores every published run with the constants fitted without its family
(leave-one-family-out) and ships each record's signed log-residual, r = log(measured rate / predicted rate),
with its regime tags in llmplan/data/residuals.json. Here a plan's interval is built from the records nearest
its regime: the empirical 10th and 90th percentiles of their residuals (numpy.quantile) scale the predicted
rate (tokens/s, MFU) and, inverted, the step time. The rule that picks the records:

1. the records sharing all four tags of the plan: dense or MoE, GPU generation, framework family (PyTorch
   FSDP-style stacks: fp32 parameter shards or DTensor TP; else Megatron-style) and scale (<= 64, <= 512,
   > 512 GPUs);
2. while fewer than MIN_RECORDS match, drop a tag in RELAX_ORDER (scale, then framework, then GPU generation,
   then dense/MoE);
3. when the tag dropped was the GPU generation or dense/MoE, no validation family covers the plan's regime:
   the basis says so and the interval is widened to WIDEN x its width about its centre (in log space).

The quantiles taken are the plan's regime cell's choice (cell_of: its pool on its GPU generation), else its
regime pool's (POOLS: dense Megatron-style with and without flash attention, dense FSDP-style, MoE; both in the
file's `pools`), else the file's `nominal` pair. A cell's or pool's choice is, of POOL_CHOICES (the
NOMINAL_CHOICES pairs, 10th/90th up to 0.5th/99.5th percentiles, each with every run or every family weighted
alike: WEIGHTINGS), the one of narrowest median half-width whose coverage on families left out one at a time
is inside TARGET (75-85%) both per record and per family over its runs, and whose choice made without each
family in turn still covers that family 75-85% (nested). A cell or pool with fewer than POOL_MIN_FAMILIES
families of POOL_MIN_RECORDS runs, or with no choice passing both, has none; the all-regime pair is the
narrowest NOMINAL_CHOICES pair (every run alike) inside the target over every run, else the one nearest LEVEL. A
family's residuals share its bias, so residuals pooled from other families under-cover it at their own 10th
and 90th percentiles; choosing the pair by left-out coverage is split-conformal calibration, and the residual
script reports the coverage with the pair itself chosen without the family it scores (nested). Memory and
serving bands take the 10th and 90th percentiles of their own (one-family) residuals.

Two plans' difference is known far better than either plan: errors a family shares (its clock, its software)
cancel. The tie resolution is the 0.8 quantile of |r_i - r_j| over pairs of layouts of one job (one source and
software stack, the same model, GPUs, global batch, sequence length and format: the alternatives a search
ranks); two plans whose predicted rates differ by less than that (in log) are tied.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Callable, Iterable

import numpy as np

LEVEL = 0.8
"""Probability the interval is meant to hold (the 10th to the 90th percentile of left-out residuals)."""
MIN_RECORDS = 10
"""Fewest records an interval is built from."""
TAGS = ("moe", "generation", "framework", "scale")
"""The regime tags, in the order the basis names them."""
RELAX_ORDER = ("scale", "framework", "generation", "moe")
"""The order the regime tags are dropped in when too few records match."""
UNCOVERED = ("generation", "moe")
"""Tags whose loss means that no validation family covers the plan's regime."""
WIDEN = 1.5
"""Width factor of an interval whose regime no family covers."""
DATA = "residuals.json"


@dataclass(frozen=True)
class Regime:
    moe: bool
    generation: str
    framework: str
    gpus: int
    flash: bool = True
    """Flash attention (the plan's flash_attention): not a selection tag, it picks the regime pool (POOLS)."""

    @property
    def scale(self) -> str:
        return scale_bucket(self.gpus)

    def tag(self, name: str) -> Any:
        return getattr(self, name)

    def describe(self, tags: Iterable[str]) -> str:
        words = {"moe": "MoE" if self.moe else "dense", "generation": self.generation,
                 "framework": f"{self.framework}-style", "scale": f"{self.scale} GPUs"}
        return ", ".join(words[t] for t in TAGS if t in tags)


def scale_bucket(gpus: int) -> str:
    return "<=64" if gpus <= 64 else "<=512" if gpus <= 512 else ">512"


def generation(gpu_name: str) -> str:
    """The GPU's generation from its profile name (a100 -> ampere, h100/h200/h800/h20 -> hopper, b200 ... ->
    blackwell); other GPUs keep their name (no validation record shares it)."""
    g = gpu_name.lower()
    if g.startswith("a100"):
        return "ampere"
    if g.startswith(("h100", "h200", "h800", "h20")):
        return "hopper"
    if g.startswith(("b200", "b300", "gb200", "gb300")):
        return "blackwell"
    return g


def framework(plan: Any) -> str:
    """'fsdp' for plans priced as PyTorch FSDP stacks run (fp32 parameter shards or DTensor TP), else
    'megatron'."""
    return "fsdp" if getattr(plan, "fp32_param_shards", False) or getattr(plan, "tp_impl", "") == "dtensor" \
        else "megatron"


def regime_of(model: Any, plan: Any, cluster: Any) -> Regime:
    return Regime(moe=bool(model.num_experts), generation=generation(cluster.system.gpu.name),
                  framework=framework(plan), gpus=int(cluster.num_gpus),
                  flash=bool(getattr(plan, "flash_attention", True)))


def record_regime(rec: dict[str, Any]) -> Regime:
    return Regime(moe=bool(rec["moe"]), generation=rec["generation"], framework=rec["framework"],
                  gpus=int(rec["gpus"]), flash=rec.get("stack", "flash") == "flash")


POOLS = {"dense-megatron": "dense Megatron-style with flash attention",
         "dense-megatron-noflash": "dense Megatron-style without flash attention (the 2020-22 stacks)",
         "dense-fsdp": "dense FSDP-style", "moe": "MoE"}
"""The regime pools whose quantile pair is calibrated on their own left-out coverage (Mondrian conformal
prediction: Vovk, Gammerman and Shafer, Algorithmic Learning in a Random World, 2005, ch. 4), by what a plan
has: experts, the framework family its flags imply, flash attention."""
POOL_MIN_FAMILIES = 3
"""Fewest families (of POOL_MIN_RECORDS runs or more) a pool needs to choose its own pair."""
POOL_MIN_RECORDS = 3
"""Fewest runs a family needs in a pool to count towards POOL_MIN_FAMILIES."""
POOL_RULE = 2
"""The rule the file's `pools` were chosen by (benchmarks/intervals.py writes it; its report rechooses older
files' pools): 2 adds the regime cells (cell_of) and the choice of weighting (WEIGHTINGS)."""


def pool_of(regime: Regime) -> str:
    """The regime pool (POOLS) of a plan or a record."""
    if regime.moe:
        return "moe"
    if regime.framework == "fsdp":
        return "dense-fsdp"
    return "dense-megatron" if regime.flash else "dense-megatron-noflash"


def cell_of(regime: Regime) -> str:
    """The regime cell of a plan or a record: its pool (POOLS) on its GPU generation ("dense-megatron/hopper").
    A cell's own choice comes before its pool's (nominal_of): the generation is one of the regime tags the
    band's runs already share, so a cell's runs are scored on bands drawn from runs like themselves."""
    return f"{pool_of(regime)}/{regime.generation}"


def describe_key(key: str) -> str:
    """A pool or cell key in words ("dense Megatron-style with flash attention on hopper")."""
    pool, _, gen = key.partition("/")
    return POOLS[pool] + (f" on {gen}" if gen else "")


WEIGHTINGS = ("run", "family")
"""How a band's quantiles weigh the runs it is drawn from: every run alike (numpy.quantile), or every family
alike (each run 1 / its family's runs among them; weighted_quantile). A plan from a new software stack is one
draw of a family bias, so weighing families alike keeps one large family (NeMo 24.07: 11 of the 28 Hopper
<= 64-GPU runs) from setting the band's edges by itself; which one a pool takes is chosen by left-out
coverage like the pair."""

Choice = tuple[float, str]
"""(quantile pair as its central probability, weighting): what a band is drawn with."""


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
            return float(info["nominal"]), weighting, (
                f"the {100 * info['nominal']:g}% pair{how}, the narrowest whose left-out coverage over the "
                f"{info['families']} {describe_key(key)} families is 75-85%"), key
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


def select(records: list[dict[str, Any]], want: Regime,
           exclude_family: str | None = None) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
    """The records nearest `want` (module docstring) and the tags dropped to reach MIN_RECORDS."""
    pool = [r for r in records if r["family"] != exclude_family]
    dropped: tuple[str, ...] = ()
    for n in range(len(RELAX_ORDER) + 1):
        dropped = RELAX_ORDER[:n]
        keep = [t for t in RELAX_ORDER if t not in dropped]
        hits = [r for r in pool if all(record_regime(r).tag(t) == want.tag(t) for t in keep)]
        if len(hits) >= MIN_RECORDS or n == len(RELAX_ORDER):
            return hits, dropped
    return pool, dropped


def training_band(want: Regime, data: dict[str, Any] | None = None, exclude_family: str | None = None) -> Band:
    """The rate band of a training plan in regime `want` (exclude_family: as if that family were unpublished,
    for the coverage test). Its quantiles are the pair of the plan's regime pool where the file gives it one,
    else the file's `nominal` pair (docs/validation.md#intervals: the pairs choose_pools and choose_nominal
    pick by left-out coverage); the basis says which, and why a pool has none."""
    data = data or shipped()
    hits, dropped = select(data["training"], want, exclude_family)
    kept = [t for t in TAGS if t not in dropped]
    widen = any(t in UNCOVERED for t in dropped)
    fams = sorted({r["family"] for r in hits})
    nominal, weighting, how, own = nominal_of(data, want)
    basis = (f"left-out residuals of {len(hits)} runs ({', '.join(fams)})"
             + (f" matching {want.describe(kept)}" if kept else "") + (f"; quantiles: {how}" if how else ""))
    if widen:
        uncovered = [t for t in dropped if t in UNCOVERED]
        basis += f"; no validation family covers {want.describe(uncovered)}: widened {WIDEN:g}x"
    weights = family_weights(r["family"] for r in hits) if weighting == "family" else None
    band = quantile_band((r["r"] for r in hits), basis, widen, nominal, weights)
    short = f"{len(hits)} left-out runs" + (f" ({want.describe(kept)})" if kept else " (all regimes)")
    if widen:
        short += f", widened {WIDEN:g}x: no family covers {want.describe([t for t in dropped if t in UNCOVERED])}"
    return Band(band.lo, band.hi, band.n, basis, widen, short, own, nominal, weighting)


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


def resolution(data: dict[str, Any] | None = None, moe: bool | None = None) -> float:
    """The tie resolution: the LEVEL quantile of |r_i - r_j| between layouts of one job (log units); with `moe`,
    from the dense or the MoE jobs only where the file has them."""
    res = (data or shipped())["resolution"]
    key = None if moe is None else ("moe" if moe else "dense")
    return float(res.get(key, res["value"]) if key else res["value"])


def tied(rate_a: float, rate_b: float, res: float | None = None) -> bool:
    """Whether two predicted rates are inside the model's resolution of each other."""
    res = resolution() if res is None else res
    return abs(float(np.log(rate_a / rate_b))) <= res


NOMINAL_CHOICES = (0.8, 0.85, 0.9, 0.925, 0.95, 0.975, 0.99)
"""The quantile pairs (as central probabilities) the residual script chooses the shipped one from."""
POOL_CHOICES: tuple[Choice, ...] = tuple((q, w) for w in WEIGHTINGS for q in NOMINAL_CHOICES)
"""What a regime pool or cell chooses its own band from: every pair, with every run or every family alike."""
TARGET = (0.75, 0.85)
"""The left-out coverage an 80% interval is meant to reach (issue 33)."""

LeftOut = tuple[np.ndarray, np.ndarray, bool]
"""A record's left-out band material: the residuals select() gives it, their family weights, widened or not."""


def source_of(record: dict[str, Any]) -> str:
    """The source a residual's family shares with others (its `source` key: benchmarks/accuracy.py
    SOURCE_GROUPS, docs/validation.md#lofo-source), else its family."""
    return str(record.get("source", record["family"]))


def left_out_pools(records: list[dict[str, Any]], without: str | None = None,
                   ids: set[str] | None = None) -> dict[str, LeftOut]:
    """Per record (id; only `ids` when given): the residuals select() gives it with its own family and every
    family of its source (source_of) left out (and `without`), their family weights (family_weights) and
    whether its band is widened."""
    out = {}
    pool = [x for x in records if x["family"] != without]
    for r in records:
        if r["family"] == without or (ids is not None and r["id"] not in ids):
            continue
        others = [x for x in pool if source_of(x) != source_of(r)]
        hits, dropped = select(others, record_regime(r), exclude_family=r["family"])
        out[r["id"]] = (np.array([h["r"] for h in hits]), family_weights(h["family"] for h in hits),
                        any(t in UNCOVERED for t in dropped))
    return out


def as_choice(x: float | Choice) -> Choice:
    """A pair given as its central probability alone is run-weighted."""
    return (float(x), "run") if isinstance(x, (int, float)) else (float(x[0]), str(x[1]))


def left_out_band(material: LeftOut, choice: float | Choice) -> Band:
    """A record's left-out band (left_out_pools) under a pair, or a (pair, weighting) choice."""
    values, weights, widen = material
    nominal, weighting = as_choice(choice)
    return quantile_band(values, "", widen, nominal, weights if weighting == "family" else None)


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
            halves.append(float(np.exp(b.hi) - np.exp(b.lo)) / 2)
        out[fam] = (inside, len(mine), float(np.median(halves)))
    return out


def median_half(records: list[dict[str, Any]], choice: float | Choice, pools: dict[str, LeftOut]) -> float:
    """The median half-width (fraction of the point) of the left-out bands of `records` under `choice`."""
    bands = [left_out_band(pools[r["id"]], choice) for r in records if r["id"] in pools]
    return float(np.median([float(np.exp(b.hi) - np.exp(b.lo)) / 2 for b in bands]))


def mean_coverage(cov: dict[str, tuple[int, int, float]]) -> float:
    """Coverage with every family weighted alike (MPT's 216 scans count as one family)."""
    return float(np.mean([i / n for i, n, _ in cov.values()]))


def per_record(cov: dict[str, tuple[int, int, float]]) -> float:
    """Coverage with every record weighted alike."""
    return sum(c[0] for c in cov.values()) / max(1, sum(c[1] for c in cov.values()))


def inside_target(cov: dict[str, tuple[int, int, float]]) -> bool:
    return all(TARGET[0] <= x <= TARGET[1] for x in (per_record(cov), mean_coverage(cov)))


def choose_nominal(records: list[dict[str, Any]], pools: dict[str, LeftOut] | None = None) -> float:
    """The narrowest NOMINAL_CHOICES pair (every run alike) whose left-out coverage is inside TARGET both per
    record and with every family weighted alike; when none is, the one whose mean over families is nearest
    LEVEL."""
    pools = pools if pools is not None else left_out_pools(records)
    covs = {q: coverage(records, q, pools) for q in NOMINAL_CHOICES}
    inside = [q for q, cov in covs.items() if inside_target(cov)]
    if inside:
        return min(inside)
    return min(NOMINAL_CHOICES, key=lambda q: abs(mean_coverage(covs[q]) - LEVEL))


def _narrowest_inside(records: list[dict[str, Any]], pools: dict[str, LeftOut]) -> Choice | None:
    """Of POOL_CHOICES whose left-out coverage over `records` is inside TARGET, the one with the narrowest
    median half-width (ties: the smaller pair, then every run alike); None when none is."""
    inside = [c for c in POOL_CHOICES if inside_target(coverage(records, c, pools))]
    if not inside:
        return None
    return min(inside, key=lambda c: (round(median_half(records, c, pools), 6), c[0], WEIGHTINGS.index(c[1])))


def _nested_coverage(records: list[dict[str, Any]], mine: list[dict[str, Any]], pools: dict[str, LeftOut],
                     default: float) -> tuple[dict[str, tuple[int, int, float]], float]:
    """Coverage of a pool's runs (`mine`) when each family's choice is made as choose_pools does, without that
    family (its pool's other families; `default` where none of their choices is inside the target), and the
    median half-width of those bands over the runs."""
    chosen: dict[str, Choice] = {}
    for fam in sorted({r["family"] for r in mine}):
        rest = [r for r in mine if r["family"] != fam]
        c = _narrowest_inside(rest, left_out_pools(records, fam, {r["id"] for r in rest}))
        chosen[fam] = as_choice(default) if c is None else c
    bands = [left_out_band(pools[r["id"]], chosen[r["family"]]) for r in mine if r["id"] in pools]
    half = float(np.median([float(np.exp(b.hi) - np.exp(b.lo)) / 2 for b in bands])) if bands else 0.0
    return coverage(mine, lambda r: chosen[r["family"]], pools), half


def choose_pools(records: list[dict[str, Any]], pools: dict[str, LeftOut] | None = None,
                 default: float | None = None, nested: bool = True) -> dict[str, dict[str, Any]]:
    """Per regime pool (POOLS) and per regime cell (cell_of: a pool on one GPU generation): its own choice, the
    POOL_CHOICES pair and weighting of narrowest median half-width whose left-out coverage over its runs is
    inside TARGET both per record and per family, kept only when that choice is stable: with the choice made the
    same way without each family in turn, the coverage of the family left out (nested) is inside TARGET too.
    None (the all-regime pair, `default`) when it has fewer than POOL_MIN_FAMILIES families of
    POOL_MIN_RECORDS runs, no choice is inside the target, or the nested coverage is not; "why" says which.
    Cells are listed only where some record falls in them."""
    pools = pools if pools is not None else left_out_pools(records)
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
        own = _narrowest_inside(mine, pools)
        if own is None:
            info["why"] = "has no pair whose left-out coverage is 75-85% both per run and per family"
            continue
        if nested:
            cov, half = _nested_coverage(records, mine, pools, default)
            info["nested"] = [round(per_record(cov), 4), round(mean_coverage(cov), 4)]
            info["nested_half"] = round(half, 4)
            if not inside_target(cov):
                info["why"] = (f"has its own {100 * own[0]:g}% pair ({own[1]}-weighted), but chosen without the "
                               f"family it scores that choice covers {100 * per_record(cov):.1f}% of the runs "
                               f"({100 * mean_coverage(cov):.1f}% per family), outside 75-85%")
                continue
        info["nominal"], info["weighting"] = own
    return out


def pair_of(data: dict[str, Any]) -> Callable[[dict[str, Any]], Choice]:
    """The (pair, weighting) choice each record's band takes under the file's pools and cells (nominal_of)."""
    def choice(r: dict[str, Any]) -> Choice:
        nominal, weighting, _, _ = nominal_of(data, record_regime(r))
        return nominal, weighting

    return choice


def best_published_mfu(gpu: Any, dtype: str) -> float | None:
    """The profile's best published MFU (against the bf16 peak) in the plan's number format."""
    return {"bf16": gpu.best_published_mfu, "fp8": gpu.best_published_mfu_fp8,
            "fp4": gpu.best_published_mfu_fp4}.get(dtype)


def training_interval(e: Any, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """The LEVEL interval of a training estimate's step time, tokens/s, MFU and memory per GPU, with its
    basis. An upper bound above the best published MFU of the GPU in the plan's format is capped there
    (`ceiling`): no published run reached more, and when the point itself is above, the basis says so."""
    regime = regime_of(e.model, e.plan, e.cluster)
    band = training_band(regime, data)
    step, tps, mfu = float(e.time.total), float(e.throughput.tokens_per_s), float(e.throughput.mfu)
    hi_factor = float(np.exp(band.hi))
    basis = band.basis
    best = best_published_mfu(e.cluster.system.gpu, e.plan.dtype)
    ceiling = None
    if best is not None and mfu * hi_factor > best:
        ceiling = float(best)
        hi_factor = best / mfu
        basis += (f"; upper bound capped at the best published {e.plan.dtype} MFU on {e.cluster.system.gpu.name} "
                  f"({100 * best:.1f}%)" + (", which the point exceeds" if mfu > best else ""))
    lo_factor = min(float(np.exp(band.lo)), hi_factor)
    mem = memory_band(data)
    total = float(e.memory.total)
    if mem is not None:
        basis += f"; memory: {mem.basis}"
    return {"level": LEVEL, "step_s": [step / hi_factor, step / lo_factor],
            "tokens_per_s": [tps * lo_factor, tps * hi_factor], "mfu": [mfu * lo_factor, mfu * hi_factor],
            "memory_bytes": mem.rate(total) if mem is not None else None, "basis": basis,
            "records": band.n, "widened": band.widened, "ceiling_mfu": ceiling,
            "pool": pool_of(regime), "pool_pair": bool(band.pool), "quantile_pair": band.nominal,
            "quantile_weighting": band.weighting, "pool_cell": band.pool,
            "summary": band.short + ("; capped at the best published MFU" if ceiling is not None else "")}


def serving_interval_withheld(e: Any) -> str | None:
    """Why a serving estimate gets no interval: its plan is outside the regime of the residuals' records
    (TensorRT-LLM runs of one co-located pool without speculative decoding or DP attention); None if inside."""
    if getattr(e, "speculative", None) is not None:
        return "no published speculative-decoding run is among the interval's records"
    if getattr(e.plan, "dp_attention", False) or getattr(e, "phase", None) is not None:
        return ("the interval's records are co-located TensorRT-LLM pools; wide-EP and one-phase pools are "
                "scored apart (benchmarks/accuracy.py, family wideep)")
    return None


def serving_interval(e: Any, data: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The LEVEL interval of a serving estimate's TTFT, TPOT and throughput (TensorRT-LLM residuals), None when
    the residuals do not cover the plan (serving_interval_withheld)."""
    band = serving_band(data)
    if band is None or serving_interval_withheld(e) is not None:
        return None
    t = e.timing
    return {"level": LEVEL, "ttft_s": band.time(float(t.ttft)), "tpot_s": band.time(float(t.tpot)),
            "tokens_per_s": band.rate(float(e.tokens_per_s)), "basis": band.basis, "records": band.n}
