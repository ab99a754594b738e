"""Pipeline exchanges that block (ParallelPlan.pp_blocking_sends, docs/formulas.md#step.pp_blocking): Megatron-LM
from 2021-02 until overlap_p2p_comm (2023-05) waits on every batched send/receive of its interleaved schedule and
synchronises the device (NVIDIA/Megatron-LM megatron/p2p_communication.py and megatron/schedules.py at 50a4b5fa02).
The closed form is checked against a simulation of that schedule in which each exchange is a rendezvous."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.comm import pp_sends
from llmplan.cost.moe import EAGER_OP_HOST_S, HOST_SYNC_S
from llmplan.cost.overhead import pp_sync_seconds
from llmplan.cost.schedule import stage_order
from llmplan.cost.step import pp_blocking_exchanges, pp_exposed_per_step
from llmplan.specs.plan import ParallelPlan

DELTA = 1e-4
"""Seconds of one exchange in the simulation: small against a chunk pass (1/3 s forward, 2/3 s backward)."""

Pass = tuple[str, int, int]


def _plan(p: int, v: int, n: int, blocking: bool = True) -> ParallelPlan:
    return ParallelPlan(pp=p, vpp=v, dp=1, global_batch=n, seq_len=4096, pp_blocking_sends=blocking)


def _segments(p: int, n: int, v: int, r: int) -> list[list[Pass]]:
    """Rank r's passes between two of its exchanges, as 50a4b5fa02's interleaved schedule calls _communicate:
    after each warm-up forward, after each steady-state forward-backward pair, after each cool-down backward."""
    order = stage_order(p, n, v, r)
    warm = next(i for i, o in enumerate(order) if o[0] == "backward") - 1
    segs: list[list[Pass]] = [[]]
    for i, o in enumerate(order):
        segs[-1].append(o)
        if o[0] == "backward" or i < warm:
            segs.append([])
    return [s for s in segs if s]


def _blocking_makespan(p: int, n: int, v: int, delta: float, forward: float = 1 / 3) -> float:
    """The step of equal stages when every exchange (before each segment, and one after the last) sends the
    previous segment's outputs and receives the next one's inputs at once, and ends `delta` after the last of
    the exchanges holding its partners' halves has begun (NCCL's batched point-to-point: nothing moves until both
    sides have posted)."""
    def out(r: int, kind: str, mb: int, c: int) -> tuple | None:
        if kind == "forward":
            return ("a", r + 1, mb, c) if r < p - 1 else (("a", 0, mb, c + 1) if c < v - 1 else None)
        return ("g", r - 1, mb, c) if r > 0 else (("g", p - 1, mb, c - 1) if c > 0 else None)

    def inp(r: int, kind: str, mb: int, c: int) -> tuple | None:
        first = r == 0 and c == 0 if kind == "forward" else r == p - 1 and c == v - 1
        return None if first else ("a" if kind == "forward" else "g", r, mb, c)

    segs = [_segments(p, n, v, r) for r in range(p)]
    ex: list[list[tuple[list, list]]] = []
    holder: dict[tuple, tuple[int, int]] = {}
    for r in range(p):
        ex.append([])
        for j in range(len(segs[r]) + 1):
            sends = [m for o in (segs[r][j - 1] if j else []) if (m := out(r, *o))]
            recvs = [m for o in (segs[r][j] if j < len(segs[r]) else []) if (m := inp(r, *o))]
            holder.update({("s", *m): (r, j) for m in sends} | {("r", *m): (r, j) for m in recvs})
            ex[r].append((sends, recvs))
    begun: dict[tuple[int, int], float] = {}
    t, at = [0.0] * p, [0] * p
    moved = True
    while moved:
        moved = False
        for r in range(p):
            while at[r] < 2 * len(segs[r]) + 1:
                if at[r] % 2:
                    t[r] += sum(forward if o[0] == "forward" else 1 - forward for o in segs[r][at[r] // 2])
                else:
                    j = at[r] // 2
                    begun.setdefault((r, j), t[r])
                    sends, recvs = ex[r][j]
                    partners = [holder[("r", *m)] for m in sends] + [holder[("s", *m)] for m in recvs]
                    if any(q not in begun for q in partners):
                        break
                    if partners:
                        t[r] = max([t[r], *(begun[q] for q in partners)]) + delta
                at[r] += 1
                moved = True
    assert all(at[r] == 2 * len(segs[r]) + 1 for r in range(p)), "the simulated schedule deadlocked"
    return max(t)


def _waited(p: int, v: int, n: int) -> float:
    """Exchanges pp_exposed_per_step puts on the critical path with pp_blocking_sends (nothing charged for
    sends beside compute: contention 0, a long window), in exchanges."""
    plan = _plan(p, v, n)
    return float(pp_exposed_per_step(plan, float(pp_sends(plan)) * DELTA, 1e6, 0.0)) / DELTA


@pytest.mark.parametrize("p,v,n", [(2, 2, 8), (2, 3, 4), (4, 2, 8), (4, 3, 8), (3, 4, 9), (8, 2, 16), (8, 4, 32),
                                   (16, 2, 144), (35, 3, 280)])
def test_blocking_exchanges_on_the_path_are_the_simulated_ones(p, v, n):
    # (35, 3, 280) is Narayanan et al. 2021 Table 1's 529.6B row (pp 35, one layer per virtual stage, 280
    # micro-batches); the other rows of the table are (4, 15, 56), (8, 10, 96), (16, 6, 144), (64, 2, 512).
    simulated = (_blocking_makespan(p, n, v, DELTA) - _blocking_makespan(p, n, v, 0.0)) / DELTA
    assert _waited(p, v, n) == pytest.approx(simulated, abs=1e-6)


@settings(max_examples=20, deadline=None, derandomize=True)
@given(p=st.integers(2, 6), v=st.integers(2, 4), groups=st.integers(2, 4), forward=st.floats(0.2, 0.5))
def test_the_closed_form_matches_the_simulation_for_any_forward_share(p, v, groups, forward):
    n = p * groups
    simulated = (_blocking_makespan(p, n, v, DELTA, forward) - _blocking_makespan(p, n, v, 0.0, forward)) / DELTA
    assert _waited(p, v, n) == pytest.approx(simulated, abs=1e-6)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(p=st.integers(2, 16), v=st.integers(1, 8), groups=st.integers(1, 8), kappa=st.floats(0.0, 0.3),
       window=st.floats(1e-3, 10.0))
def test_blocking_sends_never_expose_less_than_overlapped_ones(p, v, groups, kappa, window):
    n, pp_s = p * groups, 0.01
    on, off = _plan(p, v, n), _plan(p, v, n, blocking=False)
    assert float(pp_exposed_per_step(on, pp_s, window, kappa)) >= float(pp_exposed_per_step(off, pp_s, window, kappa))
    if v == 1:  # Megatron-LM's 1F1B already blocks: only the synchronisation differs
        assert float(pp_exposed_per_step(on, pp_s, window, kappa)) == float(pp_exposed_per_step(off, pp_s, window,
                                                                                                kappa))


def test_each_exchange_synchronises_the_device_only_with_the_switch():
    # One host wait per _communicate call: the wake-up and the next op's issue (step.host_sync)
    on, off = _plan(35, 3, 280), _plan(35, 3, 280, blocking=False)
    exchanges = pp_blocking_exchanges(on)
    assert exchanges == 280 * 3 + 2 * 35 + 2 * 34
    assert float(pp_sync_seconds(on, exchanges, 2.0)) == pytest.approx(exchanges * (HOST_SYNC_S + 2 * EAGER_OP_HOST_S))
    assert float(pp_sync_seconds(off, exchanges, 2.0)) == 0.0


def test_the_switch_is_refused_without_pipeline_stages(cli):
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1", "--tp", "8",
            "--pp", "1", "--pp-blocking-sends")
    assert r.code == 2, r.out
    assert "pp_blocking_sends with pp 1" in r.err and "--pp-blocking-sends" in r.err, r.err


def test_exports_run_the_blocking_exchanges_or_refuse_them(cli, tmp_path):
    # Megatron-LM: --no-overlap-p2p-communication (batch_p2p_comm, synchronised: core_r0.9.0 arguments.py);
    # Megatron-Bridge: ModelParallelConfig overlap_p2p_comm / batch_p2p_comm; torchtitan and DeepSpeed have no
    # synchronised exchange and refuse in one line
    from test_export_switches import export, saved
    args = ("--nodes", "4", "--tp", "8", "--pp", "4", "--vpp", "2", "--dp", "1")
    for blocking in (False, True):
        flag = "--pp-blocking-sends" if blocking else "--no-pp-blocking-sends"
        plan = saved(cli, tmp_path / flag, *args, flag)
        code, files, err = export(cli, plan, "megatron", tmp_path / f"m{flag}")
        assert code == 0, err
        assert ("--no-overlap-p2p-communication" in files) == blocking
        code, files, err = export(cli, plan, "megatron-bridge", tmp_path / f"b{flag}")
        assert code == 0, err
        assert f"model.overlap_p2p_comm={str(not blocking).lower()}" in files.lower(), files
    code, _, err = export(cli, plan, "torchtitan", tmp_path / "torchtitan")
    assert code == 2 and "pp_blocking_sends" in err and "--no-pp-blocking-sends" in err, err
    # tp 1: DeepSpeed's pipeline engine runs without AutoTP (deepspeed.pipelined_autotp_refusal)
    plan = saved(cli, tmp_path / "ds", "--nodes", "1", "--tp", "1", "--pp", "4", "--dp", "2", "--zero", "1",
                 "--no-overlap-param-gather", "--pp-blocking-sends")
    code, _, err = export(cli, plan, "deepspeed", tmp_path / "deepspeed")
    assert code == 2 and "pp_blocking_sends" in err and "--no-pp-blocking-sends" in err, err
