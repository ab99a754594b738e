"""Ties: ranked plans whose predicted difference is inside the model's resolution (llmplan.intervals), and
the robust preference among them (docs/validation.md#intervals). Being tied is pairwise, not a chain: a plan
is ranked above one ranked ahead of it (faster) only when the two are within the resolution of each other."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from collections.abc import Callable
from typing import Any

import numpy as np

from llmplan.units import GIB

TIE_POOL = 5
"""Distinct layouts (search.variants: degrees, interleaved or not; each represented by its best variant) among
which ties are resolved: the TIE_POOL best, whatever --top is, so the ranking at any --top is the first --top
rows of the same ranking (a plan below the pool is shown in predicted order, and marked tied where it is).
More would cost a scalar estimate each (about 20 ms for DeepSeek-V3)."""

HEADROOM_STEP = 2 * GIB
"""Width of the memory tiers (bytes) that order tied plans at risk of running out of memory (oom_tier)."""


@lru_cache(maxsize=1)
def memory_upper() -> float:
    """The factor on a predicted memory peak that gives the upper end of its interval: exp of the 0.9 quantile
    of log(measured / predicted) over the published memory peaks (llmplan.intervals.memory_band; 1.25 on the
    shipped data, docs/validation.md#headroom-tiers); 1 where too few peaks are shipped to measure it."""
    from llmplan.intervals import memory_band

    band = memory_band()
    return math.exp(band.hi) if band is not None else 1.0


def oom_tier(total: Any, capacity: Any) -> Any:
    """0 for a plan whose predicted memory peak stays within the GPU at its interval's upper end (ample
    headroom); else by how much the upper end exceeds the GPU, in HEADROOM_STEP tiers (1 = up to 2 GiB over).
    Elementwise over arrays. Derived: docs/validation.md#headroom-tiers"""
    over = np.asarray(total, dtype=float) * memory_upper() - np.asarray(capacity, dtype=float)
    return np.where(over > 0, np.ceil(over / HEADROOM_STEP), 0).astype(int)


def _tier(e: Any) -> int:
    return int(oom_tier(e.memory.total, e.memory.capacity))


def at_risk(e: Any) -> bool:
    """Whether a training estimate's memory interval's upper end passes the GPU (oom_tier > 0): the first rule
    among tied plans (decide), and among tied systems' best plans (search.systems.compare)."""
    return _tier(e) > 0


@dataclass(frozen=True)
class TieNote:
    """Why a plan sits above the next one it is tied with."""

    upper: int
    """Rank (1-based) of the preferred plan."""
    lower: int
    """Rank of the plan it is tied with."""
    apart: float
    """|log| of the two plans' predicted tokens/s ratio."""
    rule: str
    """The rule that decided, in words."""


def _axes(p: Any) -> int:
    return sum(d > 1 for d in (p.tp, p.pp, p.dp, p.cp, p.ep)) + (p.vpp > 1)


def _gathers_every_expert(e: Any) -> bool:
    """ZeRO-3 of an MoE model without expert parallelism: every expert's weights gathered to every GPU each
    micro-batch, though a token uses k of them (2.5-3x the bytes per GPU of the best EP plan in
    docs/validation.md#layout-audit; the published MoE runs all use EP)."""
    return e.plan.ep == 1 and e.plan.zero >= 3 and bool(e.model.is_moe)


def _tp_crosses_node(e: Any) -> bool:
    return e.plan.tp > e.cluster.system.domain_gpus


HEAVY_AXES = ("ep", "cp")
"""Axes besides TP whose traffic is on the step's critical path every layer (EP's dispatch and combine
all-to-alls, CP's K/V exchange), so that their place (NVLink domain or network) decides what they cost."""


def heavy_across(e: Any) -> tuple[str, ...]:
    """The axes of HEAVY_AXES whose groups span more than one NVLink domain as topology.placement lays the plan
    out on its cluster in the estimate's axis order (TrainingEstimate.order, --axis-order: the order it was
    priced in), so the network carries their traffic; () for a plan without degrees (a stand-in)."""
    degrees = getattr(e.plan, "degrees", None)
    if degrees is None:
        return ()
    from llmplan.topology.placement import DEFAULT_ORDER, place

    spans = place(degrees, e.cluster, getattr(e, "order", DEFAULT_ORDER))
    return tuple(a for a in HEAVY_AXES if spans[a].size > 1 and spans[a].uses_nic)


def across_words(inside: Any, other: Any) -> str:
    """Why `inside` is preferred on placement: the other plan's axes that leave the NVLink domain (placed in
    its estimate's axis order, as heavy_across places them)."""
    from llmplan.topology.placement import DEFAULT_ORDER, place

    spans = place(other.plan.degrees, other.cluster, getattr(other, "order", DEFAULT_ORDER))
    out = [a for a in heavy_across(other) if a not in heavy_across(inside)]
    where = ", ".join(f"{a} {spans[a].size} spans {spans[a].domains} domains" for a in out)
    return f"{'/'.join(a.upper() for a in out) or 'EP/CP'} inside the NVLink domain (the other: {where})"


def decide(a: Any, b: Any) -> tuple[int, str]:
    """-1 when tied plan a is preferred to b, 1 when b is, 0 when no robustness rule separates them (the
    faster prediction then stays first); with the rule that decided. Rules in order: a plan whose memory
    interval's upper end fits the GPU before one at risk of running out of memory (oom_tier 0 or not); TP
    inside the NVLink domain; an MoE model's experts on their EP ranks rather than gathered by ZeRO-3; fewer of
    EP and CP across NVLink domains (heavy_across); fewer parallel axes; a smaller CP degree; between two plans at risk,
    the one less over the GPU (a lower
    oom_tier); lower ZeRO stage; less recompute.
    Memory comes first: a plan that may not run at all (one published memory peak in ten measured more than
    its interval's upper end over the prediction) goes after plans that will, whatever else they cost; two
    plans whose memory intervals both fit the GPU are not separated by headroom, so the faster prediction
    stays first unless a later rule decides (docs/validation.md#headroom-tiers). Then each extra axis (a CP
    ring at a 4k sequence, say) adds communication and a way to fail, and a wider ring splits the sequence into
    shorter chunks, whose steps the model prices least well (docs/formulas.md#compute.cp_attention).
    EP and CP inside the NVLink domain, as TP: their traffic is on every layer's critical path, and the
    published runs on NVL72 racks keep EP on one domain (Megatron-Bridge's Slurm executor asks for a --segment
    of whole racks so that a 256-GPU job's EP groups do not straddle two, docs/validation.md#moe-mechanisms,
    "EP across NVLink domains"); it comes after the ZeRO-3 rule (ep 1 never leaves a domain, but gathers every
    expert) and before fewer axes (an in-domain EP plan with a pipeline against a flat one whose EP crosses the
    network; docs/validation.md#tie-placement)."""
    ta, tb = _tier(a), _tier(b)
    if (ta > 0) != (tb > 0):
        return (-1 if ta < tb else 1), risk_words(a if ta < tb else b, b if ta < tb else a)
    ca, cb = _tp_crosses_node(a), _tp_crosses_node(b)
    if ca != cb:
        return (1 if ca else -1), "TP inside the NVLink domain"
    ga, gb = (_gathers_every_expert(a), _gathers_every_expert(b)) if a.plan.ep != b.plan.ep else (False, False)
    if ga != gb:  # across layouts only (EP is a degree), so search.variants.robust_pick needs no twin
        return (1 if ga else -1), "experts kept on their EP ranks, not gathered by ZeRO-3 each micro-batch"
    na, nb = len(heavy_across(a)), len(heavy_across(b))
    if na != nb:  # across layouts only (the degrees place the groups): robust_pick needs no twin either
        return (-1, across_words(a, b)) if na < nb else (1, across_words(b, a))
    xa, xb = _axes(a.plan), _axes(b.plan)
    if xa != xb:
        return (-1 if xa < xb else 1), f"fewer parallel axes ({min(xa, xb)} vs {max(xa, xb)})"
    if a.plan.cp != b.plan.cp:
        return (-1 if a.plan.cp < b.plan.cp else 1), f"smaller CP degree ({min(a.plan.cp, b.plan.cp)} vs " \
            f"{max(a.plan.cp, b.plan.cp)}: longer sequence chunks per rank)"
    if ta != tb:  # both at risk: the one less over the GPU
        return (-1 if ta < tb else 1), risk_words(a if ta < tb else b, b if ta < tb else a)
    if a.plan.zero != b.plan.zero:
        return (-1 if a.plan.zero < b.plan.zero else 1), "lower ZeRO stage (fewer shards to gather)"
    order = {"none": 0, "selective": 1, "op": 2, "full": 3}
    ra, rb = order.get(a.plan.recompute, 0), order.get(b.plan.recompute, 0)
    if ra != rb:
        return (-1 if ra < rb else 1), "less recompute"
    return 0, "faster prediction (no robustness rule separates them)"


def risk_words(safer: Any, other: Any) -> str:
    """Why `safer` is preferred on memory: the upper ends of both plans' memory intervals against the GPU."""
    up = memory_upper()
    hi_s, hi_o = float(safer.memory.total) * up, float(other.memory.total) * up
    cap = float(other.memory.capacity)
    if float(safer.memory.capacity) != cap:  # two systems' GPUs (search.systems.compare): each against its own
        cap_s = float(safer.memory.capacity)
        return (f"memory {'within' if _tier(safer) == 0 else 'less over'} the GPU at the interval's upper end "
                f"({hi_s / GIB:.1f} of {cap_s / GIB:.1f} GiB; the other {hi_o / GIB:.1f} of {cap / GIB:.1f})")
    if _tier(safer) == 0:
        return (f"memory within the GPU at the interval's upper end ({hi_s / GIB:.1f} GiB; the other "
                f"{hi_o / GIB:.1f} GiB of {cap / GIB:.1f})")
    return f"less over the GPU at the memory interval's upper end ({hi_s / GIB:.1f} vs {hi_o / GIB:.1f} GiB of " \
           f"{cap / GIB:.1f})"


def apart(a: Any, b: Any) -> float:
    """|log| of the two plans' predicted tokens/s ratio."""
    return abs(math.log(float(a.throughput.tokens_per_s) / float(b.throughput.tokens_per_s)))


def resolve_pool(ranked: list[Any], resolution: float) -> tuple[list[int], list[list[int]], list[TieNote]]:
    """resolve() over the first TIE_POOL of `ranked` (one plan per layout, best first); the rest follow in
    their predicted order. Per new rank: the ranks it is tied with (within the resolution, pool or not)."""
    head, _, notes = resolve(ranked[:TIE_POOL], resolution)
    order = head + list(range(len(head), len(ranked)))
    return order, tied_ranks(ranked, order, resolution), notes


def tied_ranks(ranked: list[Any], order: list[int], resolution: float) -> list[list[int]]:
    """Per new rank (`order`: indices into `ranked`), the ranks (1-based) within the resolution of it."""
    return [[k + 1 for k, j in enumerate(order) if j != i and apart(ranked[i], ranked[j]) <= resolution]
            for i in order]


def resolve(ranked: list[Any], resolution: float) -> tuple[list[int], list[list[int]], list[TieNote]]:
    """The ranked estimates (best first) reordered so that a plan goes above one ranked ahead of it only when
    the two are within the resolution of each other, and then only when it is the more robust (decide).
    Row by row: among the plans not yet placed, those within the resolution of every unplaced plan ranked
    ahead of them are open (the first unplaced plan always is, and the open plans are pairwise tied); the
    most robust open plan (robust_first) takes the row. So a tie is never a chain: a plan that is tied with
    a faster one only through a third plan stays below it. Returns the new order (indices into `ranked`),
    per new rank the ranks (1-based) it is tied with, and a note for each adjacent tied pair."""
    order = row_order(len(ranked), lambda j, i: apart(ranked[j], ranked[i]) <= resolution,
                      lambda open_: robust_first(ranked, open_))
    tied_with = tied_ranks(ranked, order, resolution)
    notes = []
    for k in range(len(order) - 1):
        a, b = ranked[order[k]], ranked[order[k + 1]]
        if apart(a, b) <= resolution:
            sign, rule = decide(a, b)
            notes.append(TieNote(k + 1, k + 2, apart(a, b), rule if sign < 0 else
                                 "faster prediction (no robustness rule prefers the other)"))
    return order, tied_with, notes


def row_order(n: int, within: Callable[[int, int], bool], first: Callable[[list[int]], int]) -> list[int]:
    """resolve's row-by-row rule over n items ranked best first: among the items not yet placed, those within
    (`within(j, i)`: inside the resolution of each other) every unplaced item ranked ahead of them are open (the
    first unplaced item always is); `first` picks the row's item among them. Indices in the new order."""
    rest = list(range(n))
    order: list[int] = []
    while rest:
        # rest keeps the given order: item i is open when no unplaced item ahead of it is beyond the resolution
        open_ = [i for k, i in enumerate(rest) if all(within(j, i) for j in rest[:k])]
        pick = first(open_)
        order.append(pick)
        rest.remove(pick)
    return order


def robust_first(ranked: list[Any], tied: list[int]) -> int:
    """The plan of `tied` (indices into `ranked`, pairwise within the resolution, in ranked order) that the
    rules put first: the least robust_key, a total order (decide's rules as one lexicographic key, not applied
    pair by pair), so no cycle of pairwise decisions can leave a plan first that another rule puts below a
    third plan of the group (docs/validation.md#tie-order)."""
    return min(tied, key=lambda i: robust_key(ranked, tied, i))


def robust_key(ranked: list[Any], group: list[int], i: int) -> tuple[Any, ...]:
    """decide's rules, in order, as one sort key for plan i of `group`: at risk of running out of memory or
    not (oom_tier > 0); TP inside the NVLink domain; where the
    group holds a plan that does not gather every expert (an EP plan, or ZeRO 0-2 at ep 1), plans gathering
    every expert by ZeRO-3 last (decide compares them across EP degrees only, so that rule alone made a cycle
    through a third plan with fewer axes, and left dp-only ZeRO-3 of an MoE model first among tied layouts
    whose EP plan ranked just outside the pool, docs/validation.md#tie-order); fewer of EP and CP across NVLink
    domains (heavy_across); fewer axes; smaller CP; the
    out-of-memory tier (absolute, not relative to the group, so one order: 0 for every plan not at risk); lower
    ZeRO; less recompute; then the ranked order (faster prediction). Memory counts by oom_tier only: between
    plans whose memory intervals both fit the GPU the faster stays first (docs/validation.md#headroom-tiers)."""
    e, es = ranked[i], [ranked[j] for j in group]
    gathers = _gathers_every_expert(e) and any(not _gathers_every_expert(x) for x in es)
    order = {"none": 0, "selective": 1, "op": 2, "full": 3}
    tier = _tier(e)
    return (tier > 0, _tp_crosses_node(e), gathers, len(heavy_across(e)), _axes(e.plan), e.plan.cp, tier, e.plan.zero,
            order.get(e.plan.recompute, 0), i)
