"""Balanced pipeline layouts in `search`: the interleave degrees the vectorised pass cannot express.

The vectorised pass (search.grid) tries an interleave degree v only where it splits every stage's layers
evenly (check.vpp_fits), since its plan arrays carry no per-plan layout and an uneven-chunk schedule is
simulated plan by plan. So DeepSeek-V3's 61 layers on 8 stages never interleave 4 ways there, which is what
Megatron-Bridge's recipes run (--pipeline-model-parallel-layout "Et|(tt|)*30mL"). This second pass takes the
best few pipelined shapes the vectorised pass ranked and prices each with the balanced layout
(specs.layout.balanced_layout) at the degrees it could not try, with the scalar estimate (the one `estimate
--pp-layout balanced` prints), and merges those that keep the rules and fit into the ranking.
Derived: docs/formulas.md#pipeline.layout
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from llmplan.cost.memory import training_memory
from llmplan.cost.operators import operator_uses, with_fallbacks
from llmplan.errors import LlmplanError, bounded_list
from llmplan.cost.exposure import gathers_on_warmup_chain
from llmplan.estimate import TrainingEstimate, estimate_training
from llmplan.specs.check import check_plan
from llmplan.specs.stages import balanced_split, pinned_split, vpp_fits
from llmplan.specs.layout import balanced_layout
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.search.variants import Group, merge

SHAPES = 3
"""Distinct pipelined shapes (tp, pp, dp, cp, ep, recompute, micro-batch) of the ranking that get a balanced
layout, best first (each at its best-ranked plan's ZeRO stage, sp and etp: the same layout at another ZeRO
stage is the same plan with more shards, as search.variants.equivalent counts it)."""
DEGREES = 2
"""Interleave degrees tried per shape: the smallest ones the even split cannot take (the bubble shrinks as
1/v, so each further degree gains less; the vectorised pass already tried the even ones)."""
SHAPE_AXES = ("tp", "pp", "dp", "cp", "ep", "recompute_code", "micro_batch")


@dataclass(frozen=True)
class LayoutPins:
    """What the layout pass needs to know of the pins: a pinned --vpp, and the stage counts whose even split
    cannot take it (searched at vpp 1 as stand-ins, then priced with the balanced layout at the pin)."""

    vpp: int | None = None
    stand_ins: frozenset[int] = frozenset()


def _even_split(L: int, pp: int) -> tuple[tuple[int, int, int], int]:
    """((first, middle, last) stage layers, middle stages) of the search's split of L layers over pp."""
    return pinned_split(L, pp, *balanced_split(L, pp))


def layout_degrees(L: int, pp: int, first: int, last: int, pin: int | None) -> list[int]:
    """Interleave degrees v > 1 of a pp-stage pipeline that the even split rejects (check.vpp_fits) and a
    balanced layout holds with every one of its pp x v chunks non-empty (pp x v <= L + 2: the embedding and
    the loss take a slot each); only the pin when --vpp is pinned, else the DEGREES smallest. None for a
    pinned first/last split (the layout would override it)."""
    if pp < 2 or (first, last) != balanced_split(L, pp):
        return []
    (f, mid, l), middle = _even_split(L, pp)
    vs = [pin] if pin is not None else range(2, (L + 2) // pp + 1)
    out = [v for v in vs if v > 1 and pp * v <= L + 2 and not vpp_fits(f, mid, l, middle, v)]
    return out if pin is not None else out[:DEGREES]


def stand_in_space(m: ModelSpec, space: Any, vpp: int | None) -> tuple[Any, LayoutPins]:
    """`space` with each pinned-vpp pipeline entry that only a balanced layout can take replaced by the same
    stages at vpp 1 (its stand-in in the vectorised ranking), and the pins for layout_pass."""
    if vpp is None or vpp == 1:
        return space, LayoutPins(vpp)
    L = m.num_hidden_layers
    pipeline, stand_ins = [], set()
    for pp, v, first, last in space.pipeline:
        if v == vpp and layout_degrees(L, pp, first, last, vpp):
            pipeline.append((pp, 1, first, last))
            stand_ins.add(pp)
        else:
            pipeline.append((pp, v, first, last))
    if not stand_ins:
        return space, LayoutPins(vpp)
    return dataclasses.replace(space, pipeline=tuple(pipeline)), LayoutPins(vpp, frozenset(stand_ins))


def with_layout(m: ModelSpec, plan: ParallelPlan, v: int) -> ParallelPlan:
    """The plan with v virtual chunks per stage placed by the balanced layout."""
    layout = balanced_layout(m.num_hidden_layers, plan.pp, v, m.num_nextn_predict_layers)
    return ParallelPlan(**{**plan.model_dump(), "vpp": v, "pp_first": 0, "pp_last": 0, "pp_layers": None,
                           "pp_layout": layout})


def candidates(m: ModelSpec, plans: Any, ranking: np.ndarray, pins: LayoutPins, top: int) -> list[ParallelPlan]:
    """The balanced-layout plans to price: for each of the SHAPES best distinct pipelined shapes of the
    ranking that has a degree to try (layout_degrees), its best-ranked plan at each such degree; with a
    pinned --vpp whose stand-ins these are, `top` shapes if more (they are the only plans shown)."""
    L, seen, out, shapes = m.num_hidden_layers, set(), [], 0
    cols = [getattr(plans, a) for a in SHAPE_AXES]
    for i in ranking:
        pp = int(plans.pp[i])
        if pp < 2 or (pins.vpp is not None and (pp not in pins.stand_ins or int(plans.vpp[i]) != 1)):
            continue
        key = tuple(int(c[i]) for c in cols)
        if key in seen:
            continue
        seen.add(key)
        vs = layout_degrees(L, pp, int(plans.pp_first[i]), int(plans.pp_last[i]), pins.vpp)
        p = plans.plan(int(i))
        # check_plan's vpp_microbatches refuses a partial last group of pp micro-batches once interleaved:
        # skip such shapes here so that they take no slot of the SHAPES priced
        if not vs or p.num_microbatches % pp:
            continue
        out += [chosen_gather(plans, int(i), with_layout(m, p, v)) for v in vs]
        shapes += 1
        if shapes == (max(SHAPES, top) if pins.stand_ins else SHAPES):
            break
    return out


def chosen_gather(plans: Any, i: int, p: ParallelPlan) -> ParallelPlan:
    """The balanced-layout plan `p` made from plan `i` of the arrays with the search's weight-gather choice
    (search.run.sync_gather_choice) only where the choice applies to it: the workload's overlapped gather back
    where `p` no longer waits on the 1F1B warm-up's chain (an interleaved layout). Derived:
    docs/formulas.md#step.dp_later_stages"""
    if plans.gather_sync is None or not plans.gather_sync[i] or bool(gathers_on_warmup_chain(
            p.model_copy(update={"overlap_param_gather": True}))):
        return p
    return p.model_copy(update={"overlap_param_gather": plans.w.overlap_param_gather})


def score(e: TrainingEstimate, objective: str) -> float:
    """A priced plan's objective score: search.run.objective_score of its estimate."""
    from llmplan.search.run import objective_score

    return float(objective_score(e, objective, e.goodput.useful if e.goodput is not None else None))


def price(m: ModelSpec, cluster: ClusterSpec, plans: list[ParallelPlan], allowance: Any, order: tuple[str, ...],
          checkpoint: Any, min_headroom: float) -> list[TrainingEstimate]:
    """The scalar estimate of each plan that keeps check_plan's rules and leaves min_headroom free (its memory,
    as the estimate computes it, first: most layout plans of the reference searches do not fit)."""
    out, gpu = [], cluster.system.gpu
    for p in plans:
        if check_plan(m, p, cluster):
            continue
        mem = training_memory(m, with_fallbacks(p, operator_uses(m, p, gpu)), gpu.hbm_bytes, allowance,
                              gpu.fp8_tn_only, gpu.nccl_sms, gpu.compute_capability,
                              gpu.has_sparse_gather_rate)
        if float(mem.total) + min_headroom > float(mem.capacity):
            continue
        e = estimate_training(m, cluster, p, allowance, order, checkpoint)
        if float(e.memory.total) + min_headroom <= float(e.memory.capacity):
            out.append(e)
    return out


def layout_pass(res: Any, pins: LayoutPins, m: ModelSpec, cluster: ClusterSpec, plans: Any, ranking: np.ndarray,
                allowance: Any, order: tuple[str, ...], checkpoint: Any, min_headroom: float, top: int,
                fitted: list | None = None) -> Any:
    """The search result `res` (search.run.SearchResult) with the balanced-layout plans of the best shapes
    merged into its ranking (and the vpp-1 stand-ins of a pinned --vpp taken out of it); `fitted`, where given,
    receives the balanced-layout plans priced that fit."""
    tried = candidates(m, plans, ranking, pins, top)
    if not tried and not pins.stand_ins:
        return res
    fit = price(m, cluster, tried, allowance, order, checkpoint, min_headroom)
    if fitted is not None:
        fitted.extend(fit)
    if pins.stand_ins and not fit and not any(e.plan.pp not in pins.stand_ins for e in res.ranked):
        raise LlmplanError(_none_message(pins, plans, ranking, len(tried)))
    groups = [Group(e, n, v) for e, n, v in zip(res.ranked, res.equivalents, res.variants, strict=True)
              if not _stand_in(e, pins.stand_ins)]
    groups = merge(groups, fit, lambda e: score(e, res.objective), res.resolution)
    merged = functools.partial(merged_front, stand_ins=pins.stand_ins, fit=fit)
    front = {"pareto": merged(res.pareto)} if res.pending is None else \
        {"pending": dataclasses.replace(res.pending, merge=merged)}  # priced later: search.run.complete_sides
    return dataclasses.replace(res, ranked=[g.estimate for g in groups], equivalents=[g.equivalents for g in groups],
                               variants=[g.variants for g in groups], **front)


def _stand_in(e: TrainingEstimate, stand_ins: frozenset[int]) -> bool:
    """A vpp-1 stand-in of a pinned --vpp (stand_in_space), which the layout pass takes out."""
    return e.plan.pp in stand_ins and e.plan.pp_layout is None


def merged_front(pareto: list[TrainingEstimate], stand_ins: frozenset[int],
                 fit: list[TrainingEstimate]) -> list[TrainingEstimate]:
    """The Pareto front of the vectorised front's rows (less the stand-ins) and the layout plans that fit."""
    return _front([e for e in pareto if not _stand_in(e, stand_ins)] + fit)


def _none_message(pins: LayoutPins, plans: Any, ranking: np.ndarray, tried: int) -> str:
    """Why a pinned --vpp that only a balanced layout can take left no plan."""
    n, pp = int(plans.num_microbatches[ranking[0]]), int(plans.pp[ranking[0]])
    why = (f"none of the {tried} balanced-layout plans priced keeps the rules and fits" if tried else
           f"the {n} micro-batches per step are not a multiple of pp ({pp}), which Megatron-Core's interleaved "
           f"schedule needs")
    return (f"--vpp {pins.vpp}: the even split cannot take it on pp {bounded_list(sorted(pins.stand_ins))} and "
            f"{why}; change --global-batch or --micro-batch, try another --vpp, or unpin it")


def rank(res: Any, pool: int) -> Any:
    """The result's layouts (one estimate each, search.variants) by their best score, exactly (stable, so the
    vectorised order stands only among identical scores), the first `pool` kept, ties resolved among the first
    TIE_POOL of them (search.ties.resolve_pool), whose last key is this order: the faster prediction
    (docs/validation.md#headroom-tiers). Scores were compared to 4 significant digits, which left two layouts
    0.005% apart in the vectorised pass's order, i.e. by more headroom to 0.1 GiB (search.run._order), a rule
    the tie resolution gives headroom only through the out-of-memory tier. Its top_score is raised to the best
    layout's score where a balanced-layout plan beats every plan of the vectorised pass."""
    if not res.ranked:
        return res
    # each layout placed by its best plan's score (the one shown may be a more robust one tied with it)
    lead = [max(v.best, score(e, res.objective)) for e, v in zip(res.ranked, res.variants, strict=True)]
    idx = sorted(range(len(res.ranked)), key=lambda i: -lead[i])[:pool]
    tied_with: list[list[int]] = []
    notes: list[Any] = []
    if res.resolution is not None:
        from llmplan.search.ties import resolve_pool

        new, tied_with, notes = resolve_pool([res.ranked[i] for i in idx], res.resolution)
        idx = [idx[k] for k in new]
    # the fastest plan that fits, the balanced-layout plans priced included, whatever --top later cuts: the
    # settings' comparison (search.run.first_setting, win_floor) reads it from the result's shown rows' search
    top_score = max(res.top_score, max(lead))
    return dataclasses.replace(res, ranked=[res.ranked[i] for i in idx], equivalents=[res.equivalents[i] for i in idx],
                               variants=[res.variants[i] for i in idx], tied_with=tied_with, tie_notes=notes,
                               top_score=top_score)


def _front(estimates: list[TrainingEstimate]) -> list[TrainingEstimate]:
    """The Pareto front (search.run.pareto_front) of the vectorised front and the layout plans that fit."""
    if not estimates:
        return []
    from llmplan.search.run import pareto_front

    tokens = np.asarray([float(e.throughput.tokens_per_s) for e in estimates])
    headroom = np.asarray([float(e.memory.headroom) for e in estimates])
    return [estimates[i] for i in pareto_front(tokens, headroom)]
