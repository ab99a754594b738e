"""BLOOM's micro-batch pairs (docs/validation.md#mbs-gain): the probe finds the pairs the finding is about, and
DeepSpeed's pipeline schedule, executed as its source orders it, has 1F1B's makespan, so the bubble is no
candidate for the gain llmplan under-prices.

Sources: deepspeedai/DeepSpeed deepspeed/runtime/pipe/schedule.py at 2151c787a (2022-02-17, the release line the
BLOOM prequel ran: TrainSchedule.steps, _step_to_micro_batch); Narayanan et al. 2021 (SC'21) §2.2 (1F1B:
(n + p - 1) micro-batch times with equal stages); the chronicle's timings (bigscience-workshop/bigscience
train/tr11-176B-ml/chronicles-prequel.md, '48-node-contenders')."""

from __future__ import annotations

import pytest

import mbs_pairs as P


@pytest.mark.parametrize("p,n", [(2, 8), (4, 16), (6, 64), (12, 128)])
@pytest.mark.parametrize("last", [1.0, 1.12])
def test_deepspeed_train_schedule_takes_1f1b_time(p: int, n: int, last: float) -> None:
    """Blocking exchanges every step, forward 1 and backward 2 (the last stage `last` times slower, as BLOOM's
    output layer makes it): the makespan is (n - 1) max + sum of the stages' micro-batch times, 1F1B's."""
    fwd, bwd = [1.0] * p, [2.0] * p
    fwd[-1], bwd[-1] = last, 2 * last
    tot = [f + b for f, b in zip(fwd, bwd)]
    assert P.simulate(fwd, bwd, n) == pytest.approx((n - 1) * max(tot) + sum(tot), rel=1e-12)


def test_each_stage_runs_every_micro_batch_once_each_way() -> None:
    """The instruction stream of every stage holds n forwards and n backwards, each micro-batch's forward before
    its backward, and 2(n + p - 1) steps' worth of exchanges only with its neighbours (no deadlock)."""
    p, n = 6, 10
    for s in range(p):
        ops = P.schedule_ops(s, p, n)
        f = [mb for kind, mb in ops if kind == "F"]
        b = [mb for kind, mb in ops if kind == "B"]
        assert f == list(range(n)) and b == list(range(n))
        assert all(ops.index(("F", i)) < ops.index(("B", i)) for i in range(n))
    P.simulate([1.0] * p, [2.0] * p, n)  # raises on a deadlock


def test_the_pairs_are_the_clean_ones_of_the_tables(published_runs: dict[str, dict]) -> None:
    """20 BLOOM pairs differ in the micro-batch alone; the 48-node-contenders DP4 PP12 rows are three of them,
    143.31 -> 134.02 -> 123.69 -> 129.26 s in the chronicle (the table's Sec/it column, 02-21, micro-batch 1, 2,
    4, 8), so the measured gains are +6.9%, +8.4% and -4.3%."""
    found = P.pairs(list(published_runs.values()))
    assert len(found) == 20
    key = "bloom-prequel-48-node-contenders-L72h14336a64-dp4tp8pp12mbsXgbs2048z1"
    chain = [(lo["measured"]["iteration_time_s"], hi["measured"]["iteration_time_s"]) for k, lo, hi in found
             if k == key]
    gains = [round(100 * (a / b - 1), 1) for a, b in chain]
    assert gains == [6.9, 8.4, -4.3]
