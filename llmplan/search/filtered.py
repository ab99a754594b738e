"""A search's ranking kept to the plans a caller accepts (`search --target`: those `export --to` writes), layout
by layout: where a layout's shown plan is refused, its other plans that fit are tried in ranked order and the best
one accepted stands for it, placed by its own score.

The walk goes down every plan that fits, best score first (the search's own ranking, then by score), beside the
ranked rows, each placed by its layout's best score (search.variants). A ranked row is tried as shown; a plan of
the arrays is tried where its layout has no accepted row yet. The first plan accepted of a layout is its row (the
more robust plan tied with it when that one is accepted too, as search.variants.representative picks), so the rows
kept are the best `top` layouts among the plans accepted. Ties are then resolved again among the rows kept
(search.layouts.rank): a tie note joins only rows shown next to each other. No rule of the caller lives here: the
walk only asks `refused`."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

from llmplan.estimate import TrainingEstimate
from llmplan.search.variants import (LAYOUT_KEY, Group, Variants, plan_code, representative, variants_among,
                                     variants_of)
from llmplan.specs.plan import ParallelPlan

CHECKS = 5000
"""Most plans one walk asks `refused` about (a search's plans that fit run to hundreds of thousands): where none
or few are accepted (a model the target cannot express, a switch setting it refuses) the walk ends there, with
what it kept. Measured on llama-3.1-70b, 8 x dgx-h100: about 0.2 ms a plan of the arrays when this limit was set
(about 30 us since: docs/validation.md#walk-fast), so a walk that meets no accepted plan costs about a second (now
0.15 s); the walks that kept --top 5 asked about 786 (megatron-bridge), 1,268 (torchtitan) and 2,158 (deepspeed)
plans. Plans of a class the caller refuses whole (keep_accepted's `known`) are passed over, not asked: not
counted here."""


@dataclass
class LayoutPlans:
    """The plans that fit of one search, kept for a caller that looks past a layout's shown plan
    (SearchResult.layout_plans): indices into the search's plan arrays, with what search.variants needs."""

    plans: Any
    """The search's PlanArrays of the plans that fit."""
    ranking: np.ndarray
    """The search's ranking (search.run._order: its best plans, sorted)."""
    codes: np.ndarray
    score: np.ndarray
    headroom: np.ndarray
    memory: np.ndarray
    full: np.ndarray
    """Every axis of each plan but ZeRO (search.variants.equivalent)."""
    resolution: float | None
    estimate: Callable[[int], TrainingEstimate]
    """The scalar estimate of plan i (the search's, memoised)."""
    skip: np.ndarray | None = None
    """Plans that are stand-ins, not plans (search.layouts: a pinned --vpp's vpp-1 stand-ins); None: none."""
    tokens: np.ndarray | None = None
    """Each plan's tokens/s (the Pareto front's axis; None: the score)."""
    priced: list = field(default_factory=list)
    """The balanced-layout plans the layout pass priced and found fitting (search.layouts), outside the arrays."""
    built: dict[int, ParallelPlan] = field(default_factory=dict, repr=False)
    """The plans of the arrays built so far (plan): the walk and the side walks ask about many of the same."""

    def plan(self, i: int) -> ParallelPlan:
        """Plan i of the arrays as a ParallelPlan (PlanArrays.plan, built once: about 10 us a plan)."""
        if i not in self.built:
            self.built[i] = self.plans.plan(i)
        return self.built[i]

    def best_first(self) -> np.ndarray:
        """Every plan, the search's ranking first, the rest by score (stable)."""
        rest = np.ones(len(self.score), dtype=bool)
        rest[self.ranking] = False
        if self.skip is not None:
            rest &= ~self.skip
        tail = np.flatnonzero(rest)
        head = self.ranking if self.skip is None else self.ranking[~self.skip[self.ranking]]
        return np.concatenate((head, tail[np.argsort(-self.score[tail], kind="stable")])).astype(int)

    def plans_in(self, mask: np.ndarray) -> np.ndarray:
        """The plans of a mask over the arrays that are plans, not stand-ins."""
        return np.flatnonzero(mask if self.skip is None else mask & ~self.skip)

    def layout_of(self, p: ParallelPlan) -> np.ndarray:
        """The plans of the arrays of plan p's layout (plan_code)."""
        a = self.plans
        mask = (np.asarray(a.vpp) > 1) == (p.vpp > 1)
        for k in LAYOUT_KEY:
            mask &= np.asarray(getattr(a, k)) == int(getattr(p, k))
        return self.plans_in(mask)

    def index_of(self, p: ParallelPlan, among: np.ndarray) -> int | None:
        """Plan p's index among the plans `among` of the arrays; None where it is not one of them (a plan with a
        pipeline layout)."""
        if p.pp_layout is not None:
            return None
        a = self.plans
        hit = among[(np.asarray(a.zero)[among] == p.zero) & (np.asarray(a.micro_batch)[among] == p.micro_batch)
                    & (np.asarray(a.vpp)[among] == p.vpp) & (np.asarray(a.sp)[among] == p.sp)]
        return next((int(j) for j in hit if self.plan(int(j)) == p), None)

    def key(self, i: int) -> tuple[int, ...]:
        """Plan i's layout as search.variants.plan_code gives it."""
        p = self.plans
        return (*(int(getattr(p, a)[i]) for a in LAYOUT_KEY), int(p.vpp[i] > 1))

    def row(self, i: int) -> Group:
        """Plan i as the row of its layout: its estimate, equivalents and variants (search.variants.variants_of),
        the layout placed by plan i's score."""
        n, v = variants_of(i, self.codes, self.score, self.memory, self.full, self.plans, self.resolution)
        return Group(self.estimate(i), n, dataclasses.replace(v, best=float(self.score[i])))

    def robust(self, i: int) -> int:
        """The plan search.variants.representative would show for a layout whose best plan is i."""
        return representative(i, self.codes, self.score, self.headroom, self.plans, self.resolution, self.memory)


@dataclass(frozen=True)
class Candidate:
    """A plan the walk asks about."""

    plan: ParallelPlan
    like: TrainingEstimate
    """A priced plan of the same search (same model, cluster, allowance, checkpoint policy): the rest of a
    plan file for this plan but its predictions."""


def priced(e: TrainingEstimate) -> Candidate:
    """A plan already priced (a ranked row) as a Candidate."""
    return Candidate(e.plan, e)


@dataclass(frozen=True)
class Walk:
    """What a walk did."""

    checked: int
    """Plans asked about."""
    refused: int
    """Of those, the ones refused."""
    other_plan: tuple[int, ...]
    """Ranks (1-based) of the rows kept whose layout had a plan refused: each shows another plan of its layout
    than the search without a caller would."""
    complete: bool
    """False when the walk stopped at `limit` plans asked about before keeping `top` rows or running out of
    plans."""
    limit: int = CHECKS
    seconds: float = 0.0
    """Wall time of the walk (the search's own is SearchResult.seconds)."""
    dropped: int = 0
    """Of the refused, those asked before the last row kept: the better-ranked plans the caller refused (all of
    the refused where the walk kept `top` rows; fewer where it ran out of plans or stopped at `limit` after),
    with the plans passed over before it."""
    passed: int = 0
    """Plans of the arrays passed over unasked, as the caller refuses every plan of their class (keep_accepted's
    `known`): each one the walk would have asked about and found refused; not in `checked` nor `limit`."""
    passed_plans: tuple[int, ...] = ()
    """Those plans (indices into the search's plan arrays), in the walk's order, to word why."""


def in_score_order(stream_scores: list[float], leads: list[float]) -> Iterator[tuple[bool, int]]:
    """The walk's order: positions in the plan stream (True, j) and in the rows sorted by lead (False, r),
    merged best first; a plan of the stream goes first only where it scores above the next row (a tie: the
    row). Both lists run best first."""
    j = r = 0
    while r < len(leads) or j < len(stream_scores):
        if j < len(stream_scores) and stream_scores[j] > (leads[r] if r < len(leads) else -np.inf):
            yield True, j
            j += 1
        else:
            yield False, r
            r += 1


@dataclass
class Walker:
    """keep_accepted's state: the rows kept, the layouts done, the plans asked about and the counts."""

    refused: Callable[[Candidate], bool]
    lp: LayoutPlans | None
    like: TrainingEstimate | None
    shown: dict[tuple[int, ...], ParallelPlan]
    """Each ranked row's layout -> its shown plan (asked about as a row, not again as a plan of the stream)."""
    checks: int
    kept: list[Group] = field(default_factory=list)
    done: set[tuple[int, ...]] = field(default_factory=set)
    skip: set[int] = field(default_factory=set)
    """The array codes of the layouts done (a cheap test for the many plans passed over)."""
    tried: set[int] = field(default_factory=set)
    turned: set[tuple[int, ...]] = field(default_factory=set)
    """Layouts with a plan refused: their row is not the search's."""
    known: list[bool] | None = None
    """Plans of the arrays the caller refuses without being asked (keep_accepted's `known`)."""
    layouts: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Array code -> layout (LayoutPlans.key), each worked out once."""
    checked: int = 0
    refusals: int = 0
    dropped: int = 0
    passed: int = 0
    passed_plans: list[int] = field(default_factory=list)

    def ask(self, c: Candidate) -> bool:
        """Whether the caller accepts c, counted."""
        self.checked += 1
        bad = self.refused(c)
        self.refusals += bad
        if bad:
            self.turned.add(plan_code(c.plan))
        return not bad

    def keep(self, g: Group, code: tuple[int, ...], dropped: int | None = None) -> None:
        """Keep row g of layout `code`; `dropped`: the refusals ranked above it (default: all so far)."""
        self.kept.append(g)
        self.done.add(code)
        self.dropped = self.refusals + self.passed if dropped is None else dropped

    def known_refused(self, i: int, code: tuple[int, ...]) -> bool:
        """Plan i (of layout `code`) is of a class the caller refuses whole: passed over, counted as the refusal
        an ask would give (where the walk would ask: plan i is not the shown plan of its layout, asked as its
        row)."""
        assert self.lp is not None
        if self.known is None or not self.known[i]:
            return False
        self.tried.add(i)
        if code not in self.shown or self.lp.plan(i) != self.shown[code]:
            self.passed += 1
            self.turned.add(code)
            self.passed_plans.append(i)
        return True

    def from_arrays(self, i: int) -> Candidate:
        assert self.lp is not None and self.like is not None
        self.tried.add(i)
        return of_arrays(self.lp, i, self.like)

    def plan(self, i: int, array_code: int) -> None:
        """A plan of the stream: asked where its layout has no row yet and it is not the layout's shown plan
        (asked as a row); where accepted, its layout's row, or the more robust plan tied with it where that one
        is accepted too (LayoutPlans.robust)."""
        assert self.lp is not None
        if array_code in self.skip or i in self.tried:
            return
        code = self.layouts.get(array_code)
        if code is None:
            code = self.layouts[array_code] = self.lp.key(i)
        if code in self.done:
            self.skip.add(array_code)
            return
        if self.known_refused(i, code):
            return
        c = self.from_arrays(i)
        if c.plan == self.shown.get(code) or not self.ask(c):
            return
        above = self.refusals + self.passed  # the tied plan asked next is not ranked above this one
        rep = self.lp.robust(i)
        if rep != i and rep not in self.tried and self.checked < self.checks and not self.known_refused(rep, code):
            alt = self.from_arrays(rep)
            if alt.plan != self.shown.get(code) and self.ask(alt):
                i = rep
        self.keep(self.lp.row(i), code, above)

    def row(self, g: Group) -> None:
        """A ranked row: asked as shown where its layout has no row yet; kept where accepted."""
        code = plan_code(g.estimate.plan)
        if code not in self.done and self.ask(priced(g.estimate)):
            self.keep(g, code)


def keep_accepted(res: Any, refused: Callable[[Candidate], bool], top: int, checks: int = CHECKS,
                  known: Callable[[Any], np.ndarray] | None = None) -> tuple[Any, Walk]:
    """The search result `res` (search.run.SearchResult, searched with keep_plans) with only the best `top`
    layouts' plans that `refused` accepts, one row per layout (module docstring), ranked and tied again.
    `known(plans)`: which of the search's plan arrays `refused` refuses whatever else they set (a class it
    refuses whole, export.every_plan_mask), passed over unasked and counted as refused (Walk.passed): the rows
    kept are the same, found after fewer asks."""
    lp: LayoutPlans | None = res.layout_plans
    from llmplan.search.layouts import rank, score

    t0 = time.perf_counter()
    rows = [Group(e, n, v) for e, n, v in zip(res.ranked, res.equivalents, res.variants, strict=True)]
    lead = [max(g.variants.best, score(g.estimate, res.objective)) for g in rows]
    by_lead = sorted(range(len(rows)), key=lambda k: -lead[k])
    stream = lp.best_first() if lp is not None else np.zeros(0, dtype=int)
    codes = lp.codes[stream].tolist() if lp is not None else []
    walker = Walker(refused, lp, rows[0].estimate if rows else None,
                    {plan_code(g.estimate.plan): g.estimate.plan for g in rows}, checks,
                    known=known(lp.plans).tolist() if known is not None and lp is not None else None)
    order = in_score_order(lp.score[stream].tolist() if lp is not None else [], [lead[k] for k in by_lead])
    complete = False
    while len(walker.kept) < top and walker.checked < checks:
        step = next(order, None)
        if step is None:  # every plan and row walked
            complete = True
            break
        is_plan, k = step
        if is_plan:
            walker.plan(int(stream[k]), codes[k])
        else:
            walker.row(rows[by_lead[k]])
    complete = complete or len(walker.kept) == top or next(order, None) is None
    kept = walker.kept
    out = dataclasses.replace(res, ranked=[g.estimate for g in kept], equivalents=[g.equivalents for g in kept],
                              variants=[g.variants for g in kept], tied_with=[], tie_notes=[], layout_plans=None)
    out = rank(out, max(len(kept), 1))
    other = tuple(k for k, e in enumerate(out.ranked, 1) if plan_code(e.plan) in walker.turned)
    return out, Walk(walker.checked, walker.refusals, other, complete, checks, time.perf_counter() - t0,
                     walker.dropped, walker.passed, tuple(walker.passed_plans))


ROW_CHECKS = 400
"""Most plans of one shown row's layout asked about when its `+N` equivalents and variants are counted again
(recount); the plans left unasked are counted as accepted, and the row's counts then read as upper bounds."""


@dataclass(frozen=True)
class Side:
    """One comparison a targeted search shows beside its rows (the conventional plan, the best plan without CP,
    the best with EP), kept to the plans the caller accepts."""

    status: str
    """'accepted': the comparison shows a plan the caller accepts; 'refused': the conventional plan is refused
    (no other stands for it); 'none': no plan of the comparison is accepted (of those asked, `complete`)."""
    checked: int = 0
    """Plans asked about."""
    complete: bool = True
    """False when the walk stopped at its limit before finding an accepted plan or running out of plans."""
    refused_plan: ParallelPlan | None = None
    """The conventional plan the caller refused (status 'refused'), to name it."""
    refused_every: str | None = None
    """Why the caller refuses every plan of the comparison, where it says so without being asked plan by plan
    (status 'none', nothing asked)."""


@dataclass(frozen=True)
class Sides:
    """What a targeted search shows beside its rows, each part kept to the plans the caller accepts
    (keep_sides)."""

    pareto_checked: int
    pareto_complete: bool
    """False when the front's walk stopped at its limit: the front holds the accepted plans found until then."""
    conventional: Side | None
    """None: the search has no conventional plan."""
    without_cp: Side | None
    """None: not shown (#1 runs no CP, or the search holds no plan without it)."""
    with_ep: Side | None
    """None: not shown (not an MoE model, #1 runs EP, or the search holds no plan with it)."""
    recount_checked: int
    """Plans of the shown rows' layouts asked about to count their equivalents and variants."""
    upper_bound: tuple[int, ...]
    """Ranks (1-based) whose counts include plans left unasked (ROW_CHECKS): upper bounds."""
    seconds: float


def of_arrays(lp: LayoutPlans, i: int, like: TrainingEstimate) -> Candidate:
    """Plan i of the arrays as a Candidate."""
    return Candidate(lp.plan(i), like)


def first_accepted(lp: LayoutPlans, idx: np.ndarray, like: TrainingEstimate, refused: Callable[[Candidate], bool],
                   checks: int) -> tuple[TrainingEstimate | None, Side]:
    """The best-scoring plan of the arrays' plans `idx` that `refused` accepts, and what the walk did."""
    order = idx[np.argsort(-lp.score[idx], kind="stable")]
    for n, i in enumerate(order.tolist()):
        if n == checks:
            return None, Side("none", n, False)
        if not refused(of_arrays(lp, i, like)):
            return lp.estimate(i), Side("accepted", n + 1)
    return None, Side("none", len(order))


def accepted_front(lp: LayoutPlans, like: TrainingEstimate, refused: Callable[[Candidate], bool],
                   checks: int) -> tuple[list[TrainingEstimate], int, bool]:
    """The Pareto front of the plans that `refused` accepts, built as the search builds its own
    (search.run.pareto_front over the arrays, thinned, then search.layouts._front with the layout pass's plans):
    the arrays' plans fastest first, a plan asked about only when it has more headroom than every faster one
    accepted (else it is off the front whatever the answer), the walk ending below half the best accepted
    throughput; then the layout pass's plans that are accepted join it. Refusing nothing, it is the search's
    front."""
    from llmplan.search.layouts import _front
    from llmplan.search.run import PARETO_WITHIN, pareto_front

    idx = lp.plans_in(np.ones(len(lp.score), dtype=bool))
    tokens = (lp.tokens if lp.tokens is not None else lp.score)[idx]
    room = lp.headroom[idx]
    order = np.lexsort((-room, -tokens)).tolist()
    checked, complete = 0, True
    front: list[int] = []
    most, floor = -np.inf, -np.inf
    for k in order:
        if tokens[k] < floor:
            break
        if room[k] <= most:
            continue
        if checked == checks:
            complete = False
            break
        checked += 1
        if not refused(of_arrays(lp, int(idx[k]), like)):
            front.append(k)
            most, floor = room[k], max(floor, PARETO_WITHIN * tokens[k])
    at = np.asarray(front, dtype=int)
    shown = [int(at[j]) for j in pareto_front(tokens[at], room[at])] if front else []
    extra = []
    for e in lp.priced:
        checked += 1
        if not refused(priced(e)):
            extra.append(e)
    return _front([lp.estimate(int(idx[k])) for k in shown] + extra), checked, complete


def recount(lp: LayoutPlans, e: TrainingEstimate, old: Variants, objective: str, like: TrainingEstimate,
            refused: Callable[[Candidate], bool], checks: int = ROW_CHECKS) -> tuple[int, Variants, int, bool]:
    """Row e's equivalents and variants (search.variants.variants_among) among the plans of its layout that
    `refused` accepts (the arrays' and the layout pass's), the best score kept from `old` (what placed the row);
    with the plans asked about, and whether some were left unasked (counted as accepted: an upper bound)."""
    from llmplan.search.layouts import score as priced_score

    same = lp.layout_of(e.plan)
    me = lp.index_of(e.plan, same)
    same = same[same != me] if me is not None else same
    extra = [x for x in lp.priced if plan_code(x.plan) == plan_code(e.plan) and x.plan != e.plan]
    keep = np.ones(len(same), dtype=bool)
    asked = 0
    for k, i in enumerate(same.tolist()):
        if asked == checks:
            break
        asked += 1
        keep[k] = not refused(of_arrays(lp, i, like))
    kept_extra = []
    for x in extra:
        if asked == checks:
            kept_extra.append(x)
            continue
        asked += 1
        if not refused(priced(x)):
            kept_extra.append(x)
    capped = asked < len(same) + len(extra)
    same = same[keep]
    a = lp.plans
    twin = (lp.full[same] == lp.full[me]).all(axis=1) if me is not None else np.zeros(len(same), dtype=bool)
    eq, v = variants_among(
        priced_score(e, objective), float(e.memory.total), e.plan.vpp, e.plan.micro_batch,
        np.concatenate((lp.score[same], [priced_score(x, objective) for x in kept_extra])).astype(float),
        np.concatenate((lp.memory[same], [float(x.memory.total) for x in kept_extra])).astype(float),
        np.concatenate((twin, [x.plan.model_copy(update={"zero": e.plan.zero}) == e.plan
                               for x in kept_extra])).astype(bool),
        np.concatenate((np.asarray(a.vpp)[same], [x.plan.vpp for x in kept_extra])).astype(int),
        np.concatenate((np.asarray(a.micro_batch)[same], [x.plan.micro_batch for x in kept_extra])).astype(int),
        lp.resolution)
    return eq, dataclasses.replace(v, best=old.best), asked, capped


def keep_sides(kept: Any, lp: LayoutPlans | None, refused: Callable[[Candidate], bool], checks: int = CHECKS,
               every: Callable[[str, int], str | None] | None = None) -> tuple[Any, Sides | None]:
    """The walk's result `kept` (keep_accepted; `lp` its search's plans) with what it shows beside its rows kept to the
    plans `refused` accepts: the Pareto front (accepted_front), the conventional plan where accepted, the best
    plan without CP and with EP that is accepted (where the search shows them), and each row's equivalents and
    variants counted among the plans of its layout that `refused` accepts (recount); `every(axis, degree)` says
    why the
    caller refuses every plan with that axis above 1 (None: it cannot say), and then the comparison with EP
    asks about none. None: no plans kept (searched without keep_plans), or no row."""
    if lp is None or not kept.ranked:
        return kept, None
    t0 = time.perf_counter()
    like = kept.ranked[0]
    conventional, conv = kept.conventional, None
    if conventional is not None:
        conv = Side("accepted", 1) if not refused(priced(conventional)) else \
            Side("refused", 1, refused_plan=conventional.plan)
        conventional = conventional if conv.status == "accepted" else None
    no_cp, cp_side = None, None
    if like.plan.cp > 1 and kept.without_cp is not None:
        no_cp, cp_side = first_accepted(lp, lp.plans_in(np.asarray(lp.plans.cp) == 1), like, refused, checks)
    ep, ep_side = None, None
    if like.plan.ep == 1 and kept.with_ep is not None:
        with_ep = lp.plans_in(np.asarray(lp.plans.ep) > 1)
        why = every("ep", int(np.asarray(lp.plans.ep)[with_ep].min())) if every and len(with_ep) else None
        ep, ep_side = (None, Side("none", refused_every=why)) if why else \
            first_accepted(lp, with_ep, like, refused, checks)
    front, front_checked, front_complete = accepted_front(lp, like, refused, checks)
    equivalents, variants, asked, capped = [], [], 0, []
    for k, (e, v) in enumerate(zip(kept.ranked, kept.variants, strict=True), 1):
        n, w, a, cap = recount(lp, e, v, kept.objective, like, refused)
        equivalents.append(n)
        variants.append(w)
        asked += a
        if cap:
            capped.append(k)
    # the wider-EP and usual-layout comparisons (search.run.wide_ep_index, usual_index) are not walked: shown
    # only without a target
    out = dataclasses.replace(kept, pareto=front, conventional=conventional, without_cp=no_cp, with_ep=ep,
                              wide_ep=None, usual=None, equivalents=equivalents, variants=variants)
    return out, Sides(front_checked, front_complete, conv, cp_side, ep_side, asked, tuple(capped),
                      time.perf_counter() - t0)
