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
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from llmplan.estimate import TrainingEstimate
from llmplan.search.variants import LAYOUT_KEY, Group, plan_code, representative, variants_of
from llmplan.specs.plan import ParallelPlan

CHECKS = 5000
"""Most plans one walk asks `refused` about (a search's plans that fit run to hundreds of thousands): where none
or few are accepted (a model the target cannot express, a switch setting it refuses) the walk ends there, with
what it kept. Measured on llama-3.1-70b, 8 x dgx-h100: about 0.2 ms a plan of the arrays (the caller screens it
against a plan file it already holds), so a walk that meets no accepted plan costs about a second; the walks that
kept --top 5 asked about 786 (megatron-bridge), 1,268 (torchtitan) and 2,158 (deepspeed) plans."""


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

    def best_first(self) -> np.ndarray:
        """Every plan, the search's ranking first, the rest by score (stable)."""
        rest = np.ones(len(self.score), dtype=bool)
        rest[self.ranking] = False
        if self.skip is not None:
            rest &= ~self.skip
        tail = np.flatnonzero(rest)
        head = self.ranking if self.skip is None else self.ranking[~self.skip[self.ranking]]
        return np.concatenate((head, tail[np.argsort(-self.score[tail], kind="stable")])).astype(int)

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
        return representative(i, self.codes, self.score, self.headroom, self.plans, self.resolution)


@dataclass(frozen=True)
class Candidate:
    """A plan the walk asks about: the plan, and its scalar estimate (priced on demand)."""

    plan: ParallelPlan
    estimate: Callable[[], TrainingEstimate]
    like: TrainingEstimate
    """A priced plan of the same search (same model, cluster, allowance, checkpoint policy): the rest of a
    plan file for this plan but its predictions."""
    priced: bool = False
    """Whether the estimate is at hand already (a ranked row), so that screening it first saves nothing."""


def priced(e: TrainingEstimate) -> Candidate:
    """A plan already priced (a ranked row) as a Candidate."""
    return Candidate(e.plan, lambda: e, e, True)


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


def keep_accepted(res: Any, refused: Callable[[Candidate], bool], top: int,
                  checks: int = CHECKS) -> tuple[Any, Walk]:
    """The search result `res` (search.run.SearchResult, searched with keep_plans) with only the best `top`
    layouts' plans that `refused` accepts, one row per layout (module docstring), ranked and tied again."""
    lp: LayoutPlans | None = res.layout_plans
    from llmplan.search.layouts import rank, score

    t0 = time.perf_counter()
    rows = [Group(e, n, v) for e, n, v in zip(res.ranked, res.equivalents, res.variants, strict=True)]
    lead = [max(g.variants.best, score(g.estimate, res.objective)) for g in rows]
    by_lead = sorted(range(len(rows)), key=lambda k: -lead[k])
    stream = lp.best_first() if lp is not None else np.zeros(0, dtype=int)
    stream_codes = lp.codes[stream].tolist() if lp is not None else []
    stream_scores = lp.score[stream].tolist() if lp is not None else []
    skip: set[int] = set()  # the array codes of the layouts done (a cheap test for the many plans passed over)
    shown = {plan_code(g.estimate.plan): g.estimate.plan for g in rows}
    kept: list[Group] = []
    done: set[tuple[int, ...]] = set()
    tried: set[int] = set()
    turned: set[tuple[int, ...]] = set()  # layouts with a plan refused: their row is not the search's
    checked = refusals = 0
    like = rows[0].estimate if rows else None
    r = j = 0

    def ask(c: Candidate) -> bool:
        nonlocal checked, refusals
        checked += 1
        bad = refused(c)
        refusals += bad
        if bad:
            turned.add(plan_code(c.plan))
        return not bad

    def from_arrays(i: int) -> Candidate:
        assert lp is not None and like is not None
        tried.add(i)
        return Candidate(lp.plans.plan(i), lambda: lp.estimate(i), like)

    while len(kept) < top and checked < checks and (r < len(rows) or j < len(stream)):
        next_row = lead[by_lead[r]] if r < len(rows) else -np.inf
        if lp is not None and j < len(stream) and stream_scores[j] > next_row:
            i, array_code = int(stream[j]), stream_codes[j]
            j += 1
            if array_code in skip or i in tried:
                continue
            code = lp.key(i)
            if code in done:
                skip.add(array_code)
                continue
            c = from_arrays(i)
            if c.plan == shown.get(code) or not ask(c):
                continue
            rep = lp.robust(i)  # the more robust plan tied with it, where it is accepted too
            if rep != i and rep not in tried and checked < checks:
                alt = from_arrays(rep)
                if alt.plan != shown.get(code) and ask(alt):
                    i = rep
            kept.append(lp.row(i))
            done.add(code)
        else:
            g = rows[by_lead[r]]
            r += 1
            code = plan_code(g.estimate.plan)
            if code in done or not ask(priced(g.estimate)):
                continue
            kept.append(g)
            done.add(code)
    complete = len(kept) == top or (r == len(rows) and j == len(stream))
    out = dataclasses.replace(res, ranked=[g.estimate for g in kept], equivalents=[g.equivalents for g in kept],
                              variants=[g.variants for g in kept], tied_with=[], tie_notes=[], layout_plans=None)
    out = rank(out, max(len(kept), 1))
    other = tuple(k for k, e in enumerate(out.ranked, 1) if plan_code(e.plan) in turned)
    return out, Walk(checked, refusals, other, complete, checks, time.perf_counter() - t0)
