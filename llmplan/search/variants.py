"""Layouts and their variants in `search`: the ranked table and the tie pool hold one row per distinct layout.

A layout is what the tie rules (search.ties.decide) look at: the degrees (tp, pp, dp, cp, ep and the expert
TP) and whether the pipeline is interleaved (an interleaved schedule is one more axis there). Plans of one
layout that differ only in the interleave degree, the pipeline split or layout, the micro-batch, ZeRO stage,
recompute or sequence parallelism are its variants: the best-scoring one represents the layout and the rest
are counted beside it (Variants). Without this, the five interleave degrees of one layout, 0.1% apart,
filled the tie pool and a different layout 0.8% slower entered it, and then led on fewer axes, only once
--top was wider than the pool (issue 33's ties)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llmplan.specs.check import divisors, te_comm_types
from llmplan.specs.model import ModelSpec
from llmplan.specs.options import SwitchOptions
from llmplan.specs.plan import ClusterSpec
from llmplan.units import GIB

LAYOUT_KEY = ("tp", "pp", "dp", "cp", "ep", "etp_resolved")
"""Degrees that make a layout (with interleaved or not)."""


@dataclass(frozen=True)
class Variants:
    """The other plans that fit of a shown plan's layout (same degrees, interleaved or not alike)."""

    count: int = 0
    """Other plans of the layout that fit, its equivalents (identical predictions) not counted."""
    near: int = 0
    """Of those, how many are predicted within the tie resolution of the shown one."""
    vpp: tuple[int, ...] = ()
    """Interleave degrees of the shown plan and its near variants (ascending)."""
    micro_batch: tuple[int, ...] = ()
    """Micro-batch sizes of the shown plan and its near variants (ascending)."""
    worst: float = 0.0
    """The largest |log| of the score ratio of the shown plan to a near variant."""
    best: float = 0.0
    """The best score of any plan of the layout (the shown one is the more robust of those tied with it):
    what places the layout in the ranking and the tie pool."""


@dataclass
class Group:
    """One layout while the ranking is assembled: its best estimate, equivalents and variants."""

    estimate: Any
    equivalents: int
    variants: Variants = field(default_factory=Variants)


def layout_codes(plans: Any) -> np.ndarray:
    """One integer per plan naming its layout (LAYOUT_KEY degrees and vpp > 1), equal exactly when the layouts
    are (mixed radix over the degrees' ranges)."""
    code = np.zeros(len(plans), dtype=np.int64)
    for a in LAYOUT_KEY:
        col = np.asarray(getattr(plans, a), dtype=np.int64)
        code = code * (int(col.max(initial=0)) + 1) + col
    return code * 2 + (np.asarray(plans.vpp) > 1)


def plan_code(p: Any) -> tuple[int, ...]:
    """The layout of one ParallelPlan, as a tuple (for plans priced outside the plan arrays)."""
    return (*(int(getattr(p, a)) for a in LAYOUT_KEY), int(p.vpp > 1))


def best_layouts(ranking: np.ndarray, codes: np.ndarray, score: np.ndarray, n: int) -> list[int]:
    """The best-ranked plan of each of the first n distinct layouts: from the sorted `ranking` (whose order
    among equal scores stands), then, when it holds fewer layouts, the best plan by score of each further one."""
    seen: dict[int, int] = {}
    for i in ranking:
        c = int(codes[i])
        if c not in seen:
            seen[c] = int(i)
            if len(seen) == n:
                return list(seen.values())
    rest = np.flatnonzero(~np.isin(codes, np.fromiter(seen, dtype=np.int64, count=len(seen))))
    if len(rest):
        by = rest[np.lexsort((-score[rest], codes[rest]))]  # per layout, best score first
        first = by[np.concatenate(([True], codes[by][1:] != codes[by][:-1]))]
        extra = first[np.argsort(-score[first], kind="stable")][:n - len(seen)]
        return list(seen.values()) + [int(i) for i in extra]
    return list(seen.values())


RECOMPUTE_RANK = (0, 1, 3, 2)
"""Recompute codes (specs.plan.RECOMPUTE: none, selective, full, op) in ties.decide's order of less recompute."""


def robust_pick(near: np.ndarray, headroom: np.ndarray, zero: np.ndarray, recompute: np.ndarray,
                memory: np.ndarray) -> int:
    """The plan of one layout that search.ties.decide prefers among `near` (its plans tied with its best one,
    best score first): the rules that can separate plans of one layout (TP placement, the axes and the CP
    degree are the layout's): the out-of-memory tier (search.ties.oom_tier of each plan's `memory` peak on
    the GPU's memory, headroom + memory), lower ZeRO, less recompute, then the better score."""
    from llmplan.search.ties import oom_tier

    tier = oom_tier(memory[near], memory[near] + headroom[near]).tolist()
    z, r = zero[near].tolist(), [RECOMPUTE_RANK[int(c)] for c in recompute[near]]
    return int(near[min(range(len(z)), key=lambda j: (tier[j], z[j], r[j], j))])


def representative(best: int, codes: np.ndarray, score: np.ndarray, headroom: np.ndarray, plans: Any,
                   resolution: float | None, memory: np.ndarray) -> int:
    """The plan shown for the layout of plan `best` (its best-scoring one): the more robust of the layout's
    plans tied with it (robust_pick; `memory`: each plan's predicted peak), `best` itself when ties are not
    resolved (the headroom objective)."""
    if resolution is None or score[best] <= 0:
        return best
    same = np.flatnonzero(codes == codes[best])
    near = same[np.log(score[best] / np.maximum(score[same], 1e-300)) <= resolution]
    near = np.concatenate(([best], near[near != best][np.argsort(-score[near[near != best]], kind="stable")]))
    return robust_pick(near, headroom, np.asarray(plans.zero), np.asarray(plans.recompute_code), memory)


def equivalent(score: Any, score0: float, memory: Any, memory0: float, same_but_zero: Any) -> Any:
    """Whether plans (elementwise over arrays) are equivalent to one scoring score0 with memory0 bytes: the same
    predicted score (to 1e-4) and memory (to 0.05 GiB), or the same plan at another ZeRO stage (same_but_zero:
    every axis but ZeRO equal); variants_of counts them with it."""
    return (np.abs(score - score0) <= 1e-4 * abs(score0)) & ((np.abs(memory - memory0) <= 0.05 * GIB) | same_but_zero)


def variants_of(i: int, codes: np.ndarray, score: np.ndarray, memory: np.ndarray, full: np.ndarray,
                plans: Any, resolution: float | None) -> tuple[int, Variants]:
    """(equivalents, variants) of plan i among the plans of its layout: equivalents predict the same score
    (to 1e-4) and memory (to 0.05 GiB) or are the same plan at another ZeRO stage (`full`: every axis but
    ZeRO), as equivalent() says; the rest are variants, near when within
    `resolution` (|log| of the score ratio, either way) of plan i."""
    same = np.flatnonzero(codes == codes[i])
    same = same[same != i]
    return variants_among(float(score[i]), float(memory[i]), int(plans.vpp[i]), int(plans.micro_batch[i]),
                          score[same], memory[same], (full[same] == full[i]).all(axis=1),
                          np.asarray(plans.vpp)[same], np.asarray(plans.micro_batch)[same], resolution)


def variants_among(s0: float, m0: float, vpp0: int, mb0: int, score: np.ndarray, memory: np.ndarray,
                   same_but_zero: np.ndarray, vpp: np.ndarray, mb: np.ndarray,
                   resolution: float | None) -> tuple[int, Variants]:
    """variants_of for a plan scoring s0 with m0 bytes, interleave vpp0 and micro-batch mb0, among the other
    plans of its layout given as arrays (their scores, memory, whether each is the plan at another ZeRO stage,
    interleave degrees and micro-batches): the plans a caller keeps (search.filtered: those a target accepts)."""
    twin = equivalent(score, s0, memory, m0, same_but_zero)
    other = ~twin
    if resolution is None or s0 <= 0:
        return int(twin.sum()), Variants(count=int(other.sum()))
    ratio = np.abs(np.log(s0 / np.maximum(score[other], 1e-300)))
    close = ratio <= resolution
    worst = float(ratio[close].max(initial=0.0))
    vpps = tuple(sorted({vpp0, *map(int, vpp[other][close])}))
    mbs = tuple(sorted({mb0, *map(int, mb[other][close])}))
    best = max(s0, float(score.max(initial=s0)))
    return int(twin.sum()), Variants(int(other.sum()), int(close.sum()), vpps, mbs, worst, best)


def absorb(kept: Variants, e: Any, score_kept: float, score_e: float, resolution: float | None) -> Variants:
    """`kept`'s variants with one more plan of its layout (estimate e, priced outside the plan arrays)."""
    best = max(kept.best, score_e)
    if resolution is None or score_kept <= 0:
        return Variants(kept.count + 1, best=best)
    gap = abs(math.log(score_kept / max(score_e, 1e-300)))
    if gap > resolution:
        return Variants(kept.count + 1, kept.near, kept.vpp, kept.micro_batch, kept.worst, best)
    return Variants(kept.count + 1, kept.near + 1, tuple(sorted({*kept.vpp, e.plan.vpp})),
                    tuple(sorted({*kept.micro_batch, e.plan.micro_batch})), max(kept.worst, gap), best)


def takes_over(e: Any, shown: Any, score_e: float, score_shown: float, resolution: float | None) -> bool:
    """Whether plan e (priced outside the plan arrays) is shown for its layout instead of `shown`: when
    faster beyond the resolution, else when search.ties.decide prefers it, else when faster."""
    from llmplan.search.ties import decide

    if resolution is None or score_shown <= 0 or score_e <= 0 or abs(math.log(score_e / score_shown)) > resolution:
        return score_e > score_shown
    sign, _ = decide(e, shown)
    return sign < 0 or (sign == 0 and score_e > score_shown)


def merge(groups: list[Group], extra: list[Any], score: Any, resolution: float | None) -> list[Group]:
    """`groups` (one per layout) with the priced plans `extra` joined to their layout: a plan preferred to its
    layout's shown one (takes_over) takes its place, the shown one becoming a variant; another becomes a
    variant; a plan of a layout not yet shown starts its own group."""
    out = list(groups)
    for e in extra:
        k = next((j for j, g in enumerate(out) if plan_code(g.estimate.plan) == plan_code(e.plan)), None)
        se = float(score(e))
        if k is None:
            out.append(Group(e, 0, Variants(best=se) if resolution is None else
                             Variants(0, 0, (e.plan.vpp,), (e.plan.micro_batch,), 0.0, se)))
            continue
        g, sg = out[k], float(score(out[k].estimate))
        if takes_over(e, g.estimate, se, sg, resolution):
            out[k] = Group(e, g.equivalents, replaced(g.variants, g.estimate, e, abs(math.log(se / sg))
                                                      if sg > 0 and se > 0 else math.inf, resolution, se))
        else:
            out[k] = Group(g.estimate, g.equivalents, absorb(g.variants, e, sg, se, resolution))
    return out


def replaced(old: Variants, was: Any, new: Any, gap: float, resolution: float | None, score_new: float) -> Variants:
    """The variants of a layout whose shown plan `was` gives way to `new`, `gap` (|log|) apart: `was` joins
    them; its near variants stay near when the farthest of them still is (else only `was` is counted near, a
    lower bound: the variants priced in arrays are not kept one by one)."""
    best = max(old.best, score_new)
    if resolution is None:
        return Variants(old.count + 1, best=best)
    if old.worst + gap <= resolution:
        return Variants(old.count + 1, old.near + 1, tuple(sorted({*old.vpp, new.plan.vpp})),
                        tuple(sorted({*old.micro_batch, new.plan.micro_batch})), old.worst + gap, best)
    if gap <= resolution:
        return Variants(old.count + 1, 1, tuple(sorted({was.plan.vpp, new.plan.vpp})),
                        tuple(sorted({was.plan.micro_batch, new.plan.micro_batch})), gap, best)
    return Variants(old.count + 1, 0, (new.plan.vpp,), (new.plan.micro_batch,), 0.0, best)


def in_domain_shares(m: ModelSpec, cluster: ClusterSpec, tp: int | None, max_tp: int | None,
                     max_cp: int | None) -> list[int]:
    """The a2a level sizes of cp_comm_type a2a+p2p a search tries: for each TP degree it may enumerate (the pin,
    or default_space's: the head counts' divisors up to --max-tp or the NVLink domain), the CP ranks beside it
    in one NVLink domain (domain_gpus / tp, the largest power of two, the search's cp degrees being powers of
    two), where that leaves a ring of 2 or more at the search's largest cp; none on a cluster of one domain,
    where no CP group crosses the network (Megatron-LM@d98e8a6 transformer_config.py cp_comm_type "a2a+p2p":
    "A2A communications in low-level CP groups (e.g., via NVLink), and P2P communications in high-level CP
    groups (e.g., via IBLink)"). Largest first. Derived: docs/formulas.md#comm.cp_hierarchical"""
    n, domain = cluster.num_gpus, min(cluster.system.domain_gpus, cluster.num_gpus)
    if n <= domain:
        return []
    tps = [tp] if tp else [t for t in divisors(m.num_attention_heads) if t <= min(max_tp or domain, n)]
    top = min(max_cp or 32, n)
    shares = {1 << int(math.log2(domain // t)) for t in tps if domain // t >= 2}
    return sorted((k for k in shares if 2 * k <= top), reverse=True)


def cp_comm_settings(plain: list[str], m: ModelSpec, w: Any, cluster: ClusterSpec, s: SwitchOptions,
                     pinned: dict[str, Any], max_tp: int | None, max_cp: int | None,
                     cp_free: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The workload settings of Transformer Engine's context parallelism a search tries, one search each, as
    (tried under every memory setting, tried after them at the one that won, as the MoE dispatchers are: their
    searches stop early where no plan beats the best so far): first the comm types of search.run.
    cp_comm_variants (`plain`), then a2a+p2p at each in-domain share (in_domain_shares) where its masks run the
    model (check.te_comm_types: as p2p's) and --cp-comm-type pins no other type. A pinned --cp-a2a-size
    (meaningful only under a2a+p2p) or --cp-comm-type a2a+p2p tries a2a+p2p only, in the first list: at the
    pinned size, else at each share (each power of two up to half the largest cp where the cluster is one
    domain)."""
    out = _cp_comm_settings(plain, m, w, cluster, s, pinned, max_tp, max_cp, cp_free)
    later = [x for x in out if x["cp_comm_type"] == "a2a+p2p"] \
        if any(x["cp_comm_type"] != "a2a+p2p" for x in out) else []
    return [x for x in out if x not in later], later


def _cp_comm_settings(plain: list[str], m: ModelSpec, w: Any, cluster: ClusterSpec, s: SwitchOptions,
                      pinned: dict[str, Any], max_tp: int | None, max_cp: int | None,
                      cp_free: bool) -> list[dict[str, Any]]:
    """cp_comm_settings' settings in one list."""
    hier = s.cp_comm_type == "a2a+p2p" or (s.cp_comm_type is None and s.cp_a2a_size is not None)
    out = [] if hier else [{"cp_comm_type": t} for t in plain]
    if w.cp_impl != "te" or not cp_free or (s.cp_comm_type is not None and not hier) \
            or "a2a+p2p" not in te_comm_types(m):
        return out or [{"cp_comm_type": "a2a+p2p", "cp_a2a_size": s.cp_a2a_size or w.cp_a2a_size}]
    if s.cp_a2a_size is not None:
        return [{"cp_comm_type": "a2a+p2p", "cp_a2a_size": s.cp_a2a_size}]
    sizes = in_domain_shares(m, cluster, pinned.get("tp"), max_tp, max_cp)
    cp = pinned.get("cp")
    if cp:  # a pinned cp: the sizes check_plan's cp_hierarchical_sizes allows (1 < size < cp, dividing it)
        sizes = [k for k in sizes if 1 < k < cp and cp % k == 0]
    if hier and not sizes:  # pinned a2a+p2p on one domain, or no share divides the pinned cp: every split
        sizes = [k for k in (2, 4, 8, 16) if (k < cp and cp % k == 0 if cp else
                                              2 * k <= min(max_cp or 32, cluster.num_gpus))] or [2]
    return out + [{"cp_comm_type": "a2a+p2p", "cp_a2a_size": k} for k in sizes]


def cp_later_worth(later: list[dict[str, Any]], best: Any) -> list[dict[str, Any]]:
    """The a2a+p2p settings (cp_comm_settings' second list) still worth a search once the memory settings are
    searched: all where the best plan so far (`best`, a TrainingEstimate; None: none fits) runs context
    parallelism, none where it runs cp 1 (the search then found the sequence split no gain even with the plain
    ring, and each share's search would cost as much as one over the whole space: benchmarks/search_speed.py)."""
    return later if best is not None and best.plan.cp > 1 else []
