"""DeepSpeed's pipeline TrainSchedule against llmplan's 1F1B simulation.

bloom and mtnlg (Megatron-DeepSpeed) are priced with pp_schedule 1f1b: bubble (p - 1)(F + B) with equal stages,
n·max + sum - max in general. DeepSpeed's pipeline engine (deepspeed/runtime/pipe/schedule.py, TrainSchedule,
v0.5.4, 2021-10: the release of MT-NLG's time) runs a different instruction order: 2(n + p - 1) steps, even
and odd stages in opposite phase, and at every step a stage exchanges with one neighbour through two blocking
transfers (a forward step receives the activation from stage s - 1, then sends it the gradient of the previous
step's backward; a backward step sends the previous step's activation to stage s + 1, then receives the
gradient). In closed form: the forward of micro-batch j runs on stage s at step 2j + s, its backward at step
2j + 2p - 1 - s. The tests below simulate that order with rendezvous transfers and check that it takes exactly
as long as llmplan's 1F1B (cost.schedule.makespan) for any stage times: the engine loses nothing to its
lock-step exchanges, so the pipeline is not where MT-NLG's per-step residual comes from
(docs/validation.md#mtnlg-per-step).
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from deepspeed_pipe import deepspeed_makespan, deepspeed_programs
from llmplan.cost.schedule import makespan


def test_step_map_is_the_engines():
    # TrainSchedule's own examples of the map (schedule.py: stage 0 forwards micro-batch 0 at step 0 and runs
    # its backward at step 2p - 1, after the last stage's at step p); every pass appears once per stage.
    p, n = 4, 6
    progs = deepspeed_programs(p, n)
    for prog in progs:
        passes = [op for op in prog if op[0] in ("F", "B")]
        assert sorted(passes) == sorted([("F", j) for j in range(n)] + [("B", j) for j in range(n)])
        assert passes[0] == ("F", 0)
    assert [op for op in progs[0] if op[0] in ("F", "B")][:p + 1] == [("F", j) for j in range(p)] + [("B", 0)]


def test_equal_stages_take_the_1f1b_time():
    # Narayanan et al. 2021 §2.2: (n + p - 1)(F + B); MT-NLG's shape (p 35, n 160 / 192 / 240, backward with
    # recompute three forwards).
    for n in (160, 192, 240):
        assert abs(deepspeed_makespan([1.0] * 35, [3.0] * 35, n) - (n + 34) * 4.0) < 1e-9


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.integers(2, 9), st.integers(1, 24),
       st.lists(st.floats(0.1, 3.0), min_size=9, max_size=9), st.lists(st.floats(0.1, 6.0), min_size=9, max_size=9))
def test_any_stage_times_take_llmplans_1f1b_time(p, n, f, b):
    assert abs(deepspeed_makespan(f[:p], b[:p], n) - makespan(f[:p], b[:p], n)) < 1e-9 * makespan(f[:p], b[:p], n)


def test_transfers_on_the_critical_path():
    # What the engine's serial exchanges do cost: with a transfer time c and p >= 3 the step holds
    # 4n + 2(p - 4) transfers (two per step of a middle stage), where llmplan's pp exposure counts the 2n sends
    # of one stage (cost.step.pp_exposed_per_step); docs/validation.md#mtnlg-per-step prices the difference.
    c = 1e-3
    for p, n in ((3, 6), (8, 16), (35, 40)):
        extra = deepspeed_makespan([1.0] * p, [3.0] * p, n, c) - (n + p - 1) * 4.0
        assert abs(extra / c - (4 * n + 2 * (p - 4))) < 1e-6
