"""1F1B pipeline transfers one at a time (ParallelPlan.pp_unbatched_sends, docs/formulas.md#step.pp_unbatched):
DeepSpeed's pipeline engine (BLOOM's and MT-NLG's runs) gives each step of its 1F1B schedule a receive and a send,
each a blocking p2p.send / p2p.recv (microsoft/DeepSpeed deepspeed/runtime/pipe/schedule.py TrainSchedule.steps and
p2p.py at v0.5.0 .. v0.6.0), where Megatron pairs them in one batched exchange. The closed form is checked against a
simulation of that schedule in which every transfer is a rendezvous of its two stages."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deepspeed_pipe import deepspeed_makespan
from llmplan.cost.comm import pp_sends
from llmplan.cost.step import pp_exposed_per_step
from llmplan.specs.plan import ParallelPlan

DELTA = 1e-4
"""Seconds of one transfer in the simulation: small against a stage's pass (1/3 s forward, 2/3 s backward)."""


def _plan(p: int, n: int, unbatched: bool = True) -> ParallelPlan:
    return ParallelPlan(pp=p, dp=1, global_batch=n, seq_len=4096, pp_unbatched_sends=unbatched)


def _makespan(p: int, n: int, delta: float, forward: float = 1 / 3, last: float = 1.0) -> float:
    """The step of equal stages (a micro-batch's forward `forward` s, its backward 1 - forward) under DeepSpeed's
    TrainSchedule when each transfer ends `delta` after both of its stages have posted it (NCCL's point-to-point:
    nothing moves until both sides are there); the last stage's passes take `last` times as long (the LM head)."""
    scale = [1.0] * (p - 1) + [last]
    return deepspeed_makespan([k * forward for k in scale], [k * (1 - forward) for k in scale], n, delta)


def _waited(p: int, n: int, delta: float = DELTA, slack: float = 0.0) -> float:
    """Transfers pp_exposed_per_step puts on the critical path with pp_unbatched_sends (contention 0), the last
    stage `slack` seconds a micro-batch slower than the others."""
    plan = _plan(p, n)
    return float(pp_exposed_per_step(plan, float(pp_sends(plan)) * delta, 1e6, 0.0, slack)) / delta


@pytest.mark.parametrize("p,n", [(2, 1), (2, 4), (3, 1), (3, 6), (4, 2), (4, 8), (4, 16), (8, 1), (8, 4), (8, 16),
                                 (12, 6), (12, 128), (35, 70)])
def test_unbatched_transfers_on_the_path_are_the_simulated_ones(p, n):
    # (12, 128) is BLOOM-176B's layout (pp 12, global batch 2048 over dp 8 at micro-batch 2)
    simulated = (_makespan(p, n, DELTA) - _makespan(p, n, 0.0)) / DELTA
    assert _waited(p, n) == pytest.approx(simulated, abs=1e-6)


@settings(max_examples=20, deadline=None, derandomize=True)
@given(p=st.integers(2, 8), n=st.integers(1, 40), forward=st.floats(0.2, 0.5))
def test_the_closed_form_matches_the_simulation_for_any_forward_share(p, n, forward):
    simulated = (_makespan(p, n, DELTA, forward) - _makespan(p, n, 0.0, forward)) / DELTA
    assert _waited(p, n) == pytest.approx(simulated, abs=1e-6)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(p=st.integers(3, 16), groups=st.integers(1, 8), kappa=st.floats(0.0, 0.3), window=st.floats(1e-3, 10.0))
def test_unbatched_transfers_never_expose_less_than_batched_exchanges(p, groups, kappa, window):
    # Megatron's 1F1B: 2(n + p - 1) exchanges of a send and a receive at once (step.pp_critical); with a middle
    # stage (p >= 3) DeepSpeed's four transfers a micro-batch expose as much, more from the fourth micro-batch
    n = p * groups
    on, off = _plan(p, n), _plan(p, n, unbatched=False)
    more = float(pp_exposed_per_step(on, 0.01, window, kappa)) - float(pp_exposed_per_step(off, 0.01, window, kappa))
    assert more > 0 if n > 3 else more == pytest.approx(0.0, abs=1e-12)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(p=st.integers(3, 12), groups=st.integers(1, 4), forward=st.floats(0.2, 0.5), k=st.floats(0.0, 4.0))
def test_a_slower_last_stage_hides_the_middle_stages_extra_transfers(p, groups, forward, k):
    # step.pp_unbatched_slack: the last stage slower by k transfers a micro-batch (its LM head): the middle
    # stages' second pair of transfers waits in its shadow, min(k, 2)·(n - 2) fewer on the path
    n, delta = p * groups, 1e-3
    last = 1.0 + k * delta
    simulated = (_makespan(p, n, delta, forward, last) - _makespan(p, n, 0.0, forward, last)) / delta
    assert _waited(p, n, delta, k * delta) == pytest.approx(simulated, abs=1e-6)
    if k >= 2 and n >= 2:
        assert simulated == pytest.approx(2 * n + 2 * p - 4, abs=1e-6)


def test_the_switch_is_refused_with_interleaving(cli):
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "2", "--tp", "8",
            "--pp", "2", "--vpp", "2", "--pp-unbatched-sends")
    assert r.code == 2, r.out
    assert "pp_unbatched_sends with pp 2, vpp 2" in r.err and "--pp-unbatched-sends" in r.err, r.err


def test_exports_refuse_unbatched_transfers_but_deepspeed(cli, tmp_path):
    # Megatron-LM / Megatron-Bridge pair each send with a receive (batch_isend_irecv) and torchtitan posts a step's
    # isend / irecv together: each refuses in one line; DeepSpeed's pipeline engine is what the switch describes
    from test_export_switches import export, saved
    plan = saved(cli, tmp_path / "on", "--nodes", "4", "--tp", "8", "--pp", "4", "--dp", "1", "--no-sp",
                 "--zero", "1", "--grad-reduce", "all-reduce", "--pp-unbatched-sends", "--unfused-loss")
    fsdp = saved(cli, tmp_path / "fsdp", "--nodes", "4", "--tp", "8", "--pp", "4", "--dp", "1", "--no-sp",
                 "--zero", "3", "--pp-unbatched-sends")
    for target, p in (("megatron", plan), ("megatron-bridge", plan), ("torchtitan", fsdp)):
        code, _, err = export(cli, p, target, tmp_path / target)
        assert code == 2 and "pp_unbatched_sends" in err and "--no-pp-unbatched-sends" in err, (target, err)
    # DeepSpeed's pipeline engine runs without AutoTP (deepspeed.pipelined_autotp_refusal): tp 1, and the weights
    # gathered after the optimizer step (deepspeed.overlapped_gather_refusal)
    ds = saved(cli, tmp_path / "ds", "--nodes", "1", "--tp", "1", "--pp", "4", "--dp", "2", "--zero", "1",
               "--grad-reduce", "all-reduce", "--pp-unbatched-sends", "--no-overlap-param-gather")
    code, _, err = export(cli, ds, "deepspeed", tmp_path / "deepspeed")
    assert code == 0, err
