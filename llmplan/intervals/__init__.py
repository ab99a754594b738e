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
   then dense/MoE); while the matches come from fewer than MIN_SOURCES sources (source_of), drop the scale and
   then the framework tag too (a band of one or two sources spans their biases, not a new source's), unless
   the plan's regime cell or pool chose 1 (SOURCE_CHOICES, by left-out coverage with its quantile pair);
3. when the tag dropped was the GPU generation or dense/MoE, no validation family covers the plan's regime:
   the basis says so and the interval is widened to WIDEN x its width about its centre (in log space).

The quantiles taken are the plan's regime cell's choice (cell_of: its pool on its GPU generation), else its
regime pool's (POOLS: dense Megatron-style with and without flash attention, dense FSDP-style, MoE; both in the
file's `pools`), else the file's `nominal` pair. A cell's or pool's choice is, of POOL_CHOICES (the
NOMINAL_CHOICES pairs, 10th/90th up to 0.5th/99.5th percentiles, each with every run or every family weighted
alike: WEIGHTINGS), each with bands of MIN_SOURCES or of any number of sources (SOURCE_CHOICES: the choice
carries into select at run time), the one of narrowest median half-width whose coverage on families left out
one at a time is at least 75% both per record and per family over its runs (one inside TARGET, 75-85%, before
any wider; one covering more only when narrower still), and whose choice made without each source in turn
(every family of it: source_of) still covers that source's runs at least 75% (nested); when it does not, the
choice asks more coverage of the runs it is made on (LOWERS) before the cell gives up. A cell or pool with
fewer than POOL_MIN_FAMILIES families of POOL_MIN_RECORDS runs, or with no choice passing both, has none (a cell
of POOL_MIN_FAMILIES+ families whose fallback, its pool's choice else the all-regime pair, covers its runs left
out under 75% takes that fallback widened to the first wider pair that covers 75%: rule 6); the
all-regime pair is the narrowest NOMINAL_CHOICES pair (every run alike) inside the target over every run, else
the narrowest covering at least 75%, else the one nearest LEVEL. A family's residuals share its bias, so
residuals pooled from other families under-cover it at their own 10th and 90th percentiles; choosing the pair by
left-out coverage is split-conformal
calibration, and the residual script reports the coverage with the pair itself chosen without the source it
scores (nested). Memory and serving bands take the 10th and 90th percentiles of their own (one-family) residuals.

Two plans' difference is known far better than either plan: errors a family shares (its clock, its software)
cancel. The tie resolution is the 0.8 quantile of |r_i - r_j| over pairs of layouts of one job (one source and
software stack, the same model, GPUs, global batch, sequence length and format: the alternatives a search
ranks); two plans whose predicted rates differ by less than that (in log) are tied.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# re-exported: the regime tags, pools and cells (llmplan.intervals.regimes)
from llmplan.intervals.regimes import (POOLS, RELAX_ORDER, TAGS, UNCOVERED, Regime, cell_of, describe_key,
                                       framework, generation, pool_of, record_regime, regime_of, scale_bucket,
                                       source_of)
# re-exported: the residual file and the bands built from it (llmplan.intervals.bands)
from llmplan.intervals.bands import (DATA, LEVEL, MIN_RECORDS, MIN_SOURCES, SOURCE_CHOICES, WEIGHTINGS, WIDEN, Band,
                                     Choice, family_weights, memory_band, min_sources_of, nominal_of, quantile_band,
                                     select, serving_band, shipped, training_band, weighted_quantile)
# re-exported: the quantile pairs chosen by left-out coverage (llmplan.intervals.conformal)
from llmplan.intervals.conformal import (LOWERS, NOMINAL_CHOICES, POOL_CHOICES, POOL_MIN_FAMILIES, POOL_MIN_RECORDS,
                                         POOL_RULE, TARGET, Cand, LeftOut, Sourced, as_choice, as_sourced,
                                         choose_nominal, choose_pools, coverage, covers, half_width, inside_target,
                                         left_out_band, left_out_pools, left_out_sourced, mean_coverage, median_half,
                                         merged_pools, pair_of, per_record)

__all__ = [
    "DATA",
    "LEVEL",
    "LOWERS",
    "MIN_RECORDS",
    "MIN_SOURCES",
    "NOMINAL_CHOICES",
    "POOLS",
    "POOL_CHOICES",
    "POOL_MIN_FAMILIES",
    "POOL_MIN_RECORDS",
    "POOL_RULE",
    "RELAX_ORDER",
    "SOURCE_CHOICES",
    "TAGS",
    "TARGET",
    "UNCOVERED",
    "WEIGHTINGS",
    "WIDEN",
    "Band",
    "Cand",
    "Choice",
    "LeftOut",
    "Regime",
    "Sourced",
    "as_choice",
    "as_sourced",
    "best_published_mfu",
    "cell_of",
    "choose_nominal",
    "choose_pools",
    "coverage",
    "covers",
    "describe_key",
    "family_weights",
    "framework",
    "generation",
    "half_width",
    "inside_target",
    "left_out_band",
    "left_out_pools",
    "left_out_sourced",
    "mean_coverage",
    "median_half",
    "memory_band",
    "merged_pools",
    "min_sources_of",
    "nominal_of",
    "pair_of",
    "per_record",
    "pool_of",
    "quantile_band",
    "record_regime",
    "regime_of",
    "resolution",
    "scale_bucket",
    "select",
    "serving_band",
    "serving_interval",
    "serving_interval_withheld",
    "shipped",
    "source_of",
    "tied",
    "training_band",
    "training_interval",
    "weighted_quantile",
]


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

def best_published_mfu(gpu: Any, dtype: str) -> float | None:
    """The profile's best published MFU (against the bf16 peak) in the plan's number format."""
    return {"bf16": gpu.best_published_mfu, "fp8": gpu.best_published_mfu_fp8,
            "fp4": gpu.best_published_mfu_fp4}.get(dtype)


def training_interval(e: Any, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """The LEVEL interval of a training estimate's step time, tokens/s, MFU and memory per GPU, with its
    basis. An upper bound above the best published MFU of the GPU in the plan's format is capped there
    (`ceiling`): no published run reached more, and when the point itself is above, the basis says so; a band
    lying wholly above the ceiling is moved down under it with its width kept (not collapsed to a point)."""
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
    lo_factor = float(np.exp(band.lo))
    if lo_factor > hi_factor:  # the whole band lies above the ceiling: moved down under it, its width kept
        lo_factor = hi_factor * float(np.exp(band.lo - band.hi))
        basis += "; the whole band lay above it and is moved down under it, its width kept"
    mem = memory_band(data)
    total = float(e.memory.total)
    if mem is not None:
        basis += f"; memory: {mem.basis}"
    return {"level": LEVEL, "step_s": [step / hi_factor, step / lo_factor],
            "tokens_per_s": [tps * lo_factor, tps * hi_factor], "mfu": [mfu * lo_factor, mfu * hi_factor],
            "memory_bytes": mem.rate(total) if mem is not None else None, "basis": basis,
            "records": band.n, "widened": band.widened, "ceiling_mfu": ceiling,
            "point_above_ceiling": ceiling is not None and mfu > ceiling,
            "pool": pool_of(regime), "pool_pair": bool(band.pool), "quantile_pair": band.nominal,
            "quantile_weighting": band.weighting, "pool_cell": band.pool, "min_sources": band.min_sources,
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
