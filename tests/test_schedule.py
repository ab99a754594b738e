"""The pipeline-schedule timeline that `llmplan report` draws (llmplan/cost/schedule.py)."""

from hypothesis import given
from hypothesis import strategies as st

from llmplan.cost.schedule import pipeline_schedule, stage_order


def makespan(slots):
    return max(s.end for s in slots)


def test_equal_stages_match_the_published_bubble():
    # Narayanan et al. 2021 §2.2: with equal stages, 1F1B takes (n + p - 1)(f + b) and interleaving over v chunks
    # shrinks the bubble to (p - 1)(f + b) / v (n a multiple of p).
    for p, n, v in [(4, 8, 1), (4, 8, 2), (8, 16, 2), (4, 12, 3), (2, 2, 1), (1, 5, 1)]:
        f, b = 1.0, 2.0
        assert abs(makespan(pipeline_schedule([f] * p, [b] * p, n, v)) - (n * (f + b) + (p - 1) * (f + b) / v)) < 1e-9


def test_warm_up_counts():
    # Stage i of 1F1B warms up with p - i - 1 forwards; interleaved with 2(p - i - 1) + (v - 1)p.
    order = stage_order(4, 8, 1, 1)
    assert [k for k, _, _ in order[:3]] == ["forward", "forward", "forward"] and order[3][0] == "backward"
    order = stage_order(4, 8, 2, 0)
    assert all(k == "forward" for k, _, _ in order[:10]) and order[11][0] == "backward"


@given(st.integers(1, 6), st.integers(1, 12), st.lists(st.floats(0.1, 5.0), min_size=6, max_size=6))
def test_slots_respect_order_and_dependencies(p, n, times):
    f = times[:p]
    b = [2 * x for x in f]
    slots = pipeline_schedule(f, b, n)
    assert len(slots) == 2 * p * n
    end = {(s.kind, s.stage, s.microbatch): s.end for s in slots}
    for s in slots:
        if s.kind == "forward" and s.stage > 0:
            assert s.start >= end[("forward", s.stage - 1, s.microbatch)] - 1e-12
        if s.kind == "backward":
            prior = ("backward", s.stage + 1, s.microbatch) if s.stage < p - 1 else ("forward", s.stage, s.microbatch)
            assert s.start >= end[prior] - 1e-12
    for i in range(p):  # a stage runs one slot at a time
        mine = sorted((s for s in slots if s.stage == i), key=lambda s: s.start)
        assert all(a.end <= c.start + 1e-12 for a, c in zip(mine, mine[1:]))
    # The step-time model's closed form n·max + Σ − max bounds the 1F1B makespan from above, and no schedule
    # beats n micro-batches on the slowest stage.
    per = [x + y for x, y in zip(f, b)]
    assert n * max(per) - 1e-9 <= makespan(slots) <= n * max(per) + sum(per) - max(per) + 1e-9
