"""The tie pool (search.ties.resolve_pool) and layout codes (search.variants): properties (issue 33's ties)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings, strategies as st

from llmplan.search.ties import TIE_POOL, apart, resolve, resolve_pool
from llmplan.search.variants import best_layouts, layout_codes, robust_pick
from llmplan.units import GIB

DEGREES = st.sampled_from([1, 2, 4, 8])
CAPACITY = 80 * GIB


def _mem(headroom: float) -> SimpleNamespace:
    """A fake estimate's memory on an 80 GiB GPU with `headroom` bytes free (the fields the tie rules read)."""
    return SimpleNamespace(headroom=headroom, total=CAPACITY - headroom, capacity=CAPACITY)


@st.composite
def ranked_plans(draw):  # type: ignore[no-untyped-def]
    """Fake estimates, fastest first: the fields the tie rules (ties.decide) read."""
    n = draw(st.integers(1, 12))
    rates = sorted(draw(st.lists(st.floats(1e3, 1e5), min_size=n, max_size=n)), reverse=True)
    out = []
    for r in rates:
        plan = SimpleNamespace(tp=draw(DEGREES), pp=draw(DEGREES), dp=draw(DEGREES), cp=draw(DEGREES), ep=1,
                               vpp=draw(st.sampled_from([1, 2, 4])), zero=draw(st.integers(0, 3)),
                               recompute=draw(st.sampled_from(["none", "selective", "full"])))
        out.append(SimpleNamespace(plan=plan, model=SimpleNamespace(is_moe=draw(st.booleans())),
                                   cluster=SimpleNamespace(system=SimpleNamespace(domain_gpus=8)),
                                   memory=_mem(draw(st.floats(0, 40)) * GIB),
                                   throughput=SimpleNamespace(tokens_per_s=r)))
    return out


@settings(max_examples=200, derandomize=True, deadline=None)
@given(ranked_plans(), st.floats(0.0, 0.5), st.integers(1, 12))
def test_a_shorter_ranking_is_a_prefix_of_a_longer_one(ranked, resolution, top):
    # --top only cuts the list resolve_pool sees (at max(top, TIE_POOL)): the order and the ties of the rows
    # shown must be the first rows of the longest one's
    full_order, full_ties, full_notes = resolve_pool(ranked, resolution)
    cut = max(top, TIE_POOL)
    order, ties, notes = resolve_pool(ranked[:cut], resolution)
    k = min(top, len(ranked))
    assert order[:k] == full_order[:k]
    assert [[j for j in t if j <= k] for t in ties[:k]] == [[j for j in t if j <= k] for t in full_ties[:k]]
    assert [n for n in notes if n.lower <= k] == [n for n in full_notes if n.lower <= k]
    # below the pool the predicted order stands
    assert full_order[TIE_POOL:] == list(range(min(TIE_POOL, len(ranked)), len(ranked)))


@settings(max_examples=100, derandomize=True, deadline=None)
@given(st.lists(st.tuples(DEGREES, DEGREES, st.integers(1, 300), DEGREES, DEGREES, DEGREES,
                          st.sampled_from([1, 2, 3, 4, 20])), min_size=1, max_size=40))
def test_layout_codes_are_equal_exactly_when_layouts_are(rows):
    a = np.asarray(rows, dtype=np.int64)
    plans = SimpleNamespace(**{k: a[:, j] for j, k in enumerate(("tp", "pp", "dp", "cp", "ep", "etp_resolved",
                                                                  "vpp"))})
    codes = layout_codes(_Sized(plans, len(rows)))
    key = [(*r[:6], r[6] > 1) for r in rows]
    for i in range(len(rows)):
        for j in range(len(rows)):
            assert (codes[i] == codes[j]) == (key[i] == key[j])


class _Sized:
    def __init__(self, ns: SimpleNamespace, n: int) -> None:
        self.__dict__.update(vars(ns))
        self._n = n

    def __len__(self) -> int:
        return self._n


@settings(max_examples=100, derandomize=True, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.floats(1.0, 100.0)), min_size=1, max_size=30),
       st.integers(0, 30), st.integers(1, 8))
def test_best_layouts_takes_each_layouts_best_plan_in_ranked_order(rows, sorted_part, n):
    # the search's ranking sorts only its best plans (TOP_SORTED): layouts it does not reach are found by score
    codes = np.asarray([c for c, _ in rows], dtype=np.int64)
    score = np.asarray([s for _, s in rows])
    ranking = np.argsort(-score, kind="stable")[:sorted_part]
    picked = best_layouts(ranking, codes, score, n)
    assert len(picked) == min(n, len(set(codes.tolist())))
    assert len({int(codes[i]) for i in picked}) == len(picked)  # one plan per layout
    for i in picked:  # each is the best plan of its layout
        assert score[i] == score[codes == codes[i]].max()
    assert [score[i] for i in picked] == sorted((score[i] for i in picked), reverse=True)


@settings(max_examples=100, derandomize=True, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 20), st.integers(0, 3), st.integers(0, 3)), min_size=1, max_size=12))
def test_robust_pick_applies_the_tie_rules_as_decide_does(rows):
    # plans of one layout (same degrees): only the memory tier, ZeRO and recompute separate them in ties.decide
    from llmplan.search.ties import decide
    from llmplan.specs.plan import RECOMPUTE

    headroom = np.asarray([h * GIB for h, _, _ in rows])
    zero = np.asarray([z for _, z, _ in rows])
    code = np.asarray([c for _, _, c in rows])
    fake = [SimpleNamespace(plan=SimpleNamespace(tp=4, pp=2, dp=8, cp=1, ep=1, vpp=1, zero=z, recompute=RECOMPUTE[c]),
                            cluster=SimpleNamespace(system=SimpleNamespace(domain_gpus=8)),
                            memory=_mem(h * GIB)) for h, z, c in rows]
    k = 0
    for j in range(1, len(rows)):
        if decide(fake[j], fake[k])[0] < 0:
            k = j
    assert robust_pick(np.arange(len(rows)), headroom, zero, code, CAPACITY - headroom) == k


def _fake(rate: float, axes: int) -> SimpleNamespace:
    """A fake estimate with `axes` parallel axes (tp, then pp, dp, cp at 2) and the given tokens/s."""
    deg = [2 if k < axes else 1 for k in range(4)]
    plan = SimpleNamespace(tp=deg[0], pp=deg[1], dp=deg[2], cp=deg[3], ep=1, vpp=1, zero=1, recompute="none")
    return SimpleNamespace(plan=plan, model=SimpleNamespace(is_moe=False),
                           cluster=SimpleNamespace(system=SimpleNamespace(domain_gpus=8)),
                           memory=_mem(10 * GIB), throughput=SimpleNamespace(tokens_per_s=rate))


def test_a_tie_is_not_a_chain():
    # a ~ b and b ~ c within the resolution, a and c not (103 / 97 is 6%). search.layouts.rank places a layout
    # by its best plan's score and shows a more robust plan tied with it, so the pool's first row (b here) need
    # not be its fastest shown plan. The rules prefer c (1 axis) to b (2) to a (3): c may pass b, but not a,
    # which is faster beyond the resolution (the old rule, a cluster within the resolution of the first row,
    # put c first: #1 tied with #2 only through #3)
    resolution = 0.04
    a, b, c = _fake(103.0, 3), _fake(100.0, 2), _fake(97.0, 1)
    ranked = [b, a, c]
    assert apart(a, b) <= resolution and apart(b, c) <= resolution < apart(a, c)
    order, tied, notes = resolve(ranked, resolution)
    assert [ranked[i] for i in order] == [b, a, c]
    assert tied == [[2, 3], [1], [1]]
    assert [(n.upper, n.lower) for n in notes] == [(1, 2)]
    assert notes[0].rule.startswith("fewer parallel axes")
    # with a gone, c is tied with every plan ranked ahead of it and goes first
    order, _, _ = resolve([b, c], resolution)
    assert order == [1, 0]


@st.composite
def shuffled_plans(draw):  # type: ignore[no-untyped-def]
    """ranked_plans with each rate moved by up to 4% (the pool's rows are placed by their layout's best plan,
    not by the plan shown), so the given order is not always the fastest first."""
    out = draw(ranked_plans())
    for e in out:
        e.throughput.tokens_per_s *= math.exp(draw(st.floats(-0.04, 0.04)))
    return out


@settings(max_examples=300, derandomize=True, deadline=None)
@given(shuffled_plans(), st.floats(0.0, 0.1))
def test_a_plan_passes_only_plans_tied_with_it(ranked, resolution):
    order, tied, notes = resolve(ranked, resolution)
    assert sorted(order) == list(range(len(ranked)))
    pos = {i: k for k, i in enumerate(order)}
    for i in range(len(ranked)):
        for j in range(i):  # j is ranked ahead of i: i above j only when the two are within the resolution
            if pos[i] < pos[j]:
                assert apart(ranked[i], ranked[j]) <= resolution
                assert pos[j] + 1 in tied[pos[i]]
    # a note for each adjacent tied pair, and no reordering without a tie
    assert [(n.upper, n.lower) for n in notes] == [(k, k + 1) for k in range(1, len(order)) if k + 1 in tied[k - 1]]
    if all(apart(ranked[i], ranked[j]) > resolution for i in range(len(ranked)) for j in range(i)):
        assert order == list(range(len(ranked)))


def _plan_est(rate: float, headroom_gib: float, ep: int = 1, zero: int = 1, axes: int = 1) -> SimpleNamespace:
    """A fake estimate of an MoE model: `axes` parallel axes (pp, dp, tp at 2 in turn; ep beside them)."""
    deg = [2 if k < axes else 1 for k in range(3)]
    plan = SimpleNamespace(tp=deg[2], pp=deg[0], dp=deg[1], cp=1, ep=ep, vpp=1, zero=zero, recompute="none")
    return SimpleNamespace(plan=plan, model=SimpleNamespace(is_moe=True),
                           cluster=SimpleNamespace(system=SimpleNamespace(domain_gpus=8)),
                           memory=_mem(headroom_gib * GIB),
                           throughput=SimpleNamespace(tokens_per_s=rate))


def test_tied_plans_are_ordered_by_one_key_not_by_neighbours():
    # a, b, c of one shape, all tied, all at risk of running out of memory (their memory intervals' upper ends
    # past the GPU), c the least. Inserting by neighbours once kept a first; one key (the out-of-memory tier,
    # absolute) cannot leave a plan first that another plan of the group is preferred to.
    from llmplan.search.ties import decide, oom_tier

    # headrooms 2, 4, 6 GiB of 80: at risk at any memory band above x1.09 (the shipped residuals' upper end)
    a, b, c = _plan_est(100.0, 2.0), _plan_est(99.5, 4.0), _plan_est(99.0, 6.0)
    assert [int(oom_tier(x.memory.total, x.memory.capacity)) > 0 for x in (a, b, c)] == [True] * 3
    assert decide(c, a)[0] < 0
    order, _, _ = resolve([a, b, c], 0.1)
    first = [a, b, c][order[0]]
    assert first is c
    assert all(decide(x, first)[0] >= 0 for x in (a, b, c) if x is not first)


def test_a_cycle_of_pairwise_rules_cannot_put_zero3_gathering_every_expert_first():
    # z: dp-only ZeRO-3 of an MoE model (1 axis); m: ep 1, ZeRO-1, 2 axes; e: ep 2, 3 axes. decide goes round:
    # z over m (fewer axes), m over e (fewer axes), e over z (experts on their EP ranks). In every ranked order
    # of the three (all tied) the resolved order is the same, m, e, z: one key, gatherers last beside an EP plan.
    from itertools import permutations

    from llmplan.search.ties import decide

    z, m, e = _plan_est(1.0, 10.0, zero=3, axes=1), _plan_est(1.0, 10.0, axes=2), _plan_est(1.0, 10.0, ep=2, axes=2)
    assert decide(z, m)[0] < 0 and decide(m, e)[0] < 0 and decide(e, z)[0] < 0
    for perm in permutations((z, m, e)):
        ranked = [SimpleNamespace(**{**vars(x), "throughput": SimpleNamespace(tokens_per_s=100.0 - k)})
                  for k, x in enumerate(perm)]
        order, _, _ = resolve(ranked, 0.1)
        assert [perm[i] for i in order] == [m, e, z]
