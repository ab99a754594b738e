"""PyTorch's context-parallel ring traced by torch.compile (ParallelPlan.cp_comm_overlap off): every K/V gather
and K/V-gradient send is waited for where it is issued, so all of the ring's transfer time is exposed
(docs/formulas.md#step.cp_compiled). Against torchtitan's published Table 6 CP scaling."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.exposure import cp_exposed
from llmplan.specs.plan import ParallelPlan

TABLE6 = {cp: f"torchtitan-2412-t6-llama31-405b-512gpu-cp{cp}" for cp in (1, 2, 4, 8)}


def _plan(cp: int, impl: str, overlap: bool, recompute: str = "full") -> ParallelPlan:
    return ParallelPlan(tp=8, cp=cp, dp=1, seq_len=32768 * cp, micro_batch=1, global_batch=1, recompute=recompute,
                        cp_impl=impl, cp_kv_repeated=True, cp_comm_overlap=overlap)  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(cp=st.sampled_from([2, 4, 8, 16]), comm=st.floats(0.0, 10.0), attention=st.floats(0.01, 100.0),
       full=st.booleans(), impl=st.sampled_from(["torch-allgather", "torch-alltoall"]))
def test_a_traced_ring_exposes_every_transfer_and_never_less_than_the_eager_ring(cp, comm, attention, full, impl):
    recompute, r, kappa = ("full", 1.0, 0.12) if full else ("none", 0.0, 0.12)
    waited = float(cp_exposed(_plan(cp, impl, False, recompute), comm, attention, kappa, r))
    eager = float(cp_exposed(_plan(cp, impl, True, recompute), comm, attention, kappa, r))
    assert waited == pytest.approx(comm, rel=1e-12, abs=1e-12)
    assert waited >= eager - 1e-9 * (1 + comm)


def test_torchtitan_reads_its_compiled_cp_rows_as_waited_for(acc, published_runs):
    # torchtitan 9dec370 compiles each TransformerBlock (apply_compile, fullgraph=True): every published CP row
    # ran torch.compile, so its ring is traced; rows without CP keep the default (the switch acts on nothing)
    seen = 0
    for rid, rec in published_runs.items():
        if rid.startswith("torchtitan-2412-"):
            plan = acc.plan_for(rec, "torchtitan", rec["hardware"]["gpus"])
            cp = rec["parallel"].get("cp", 1) > 1
            assert plan.cp_comm_overlap is not (cp and rec["parallel"].get("compile") is not False), rid
            seen += cp
    assert seen == 6


def _tokens(acc, rec: dict, overlap: bool) -> float:
    plan = acc.plan_for(rec, "torchtitan", rec["hardware"]["gpus"])
    if plan.cp > 1:
        plan = plan.model_copy(update={"cp_comm_overlap": overlap})
    system = acc.builtin_systems()[acc.record_system(rec)]
    system = system.model_copy(update={"gpu": system.gpu.at_power_limit(rec["hardware"]["power_limit_w"])})
    cluster = acc.cluster_of(system, rec["hardware"]["gpus"])
    return float(acc.estimate_training(acc.model_for(rec, "torchtitan"), cluster, plan).throughput.tokens_per_s)


def test_table6_cp_slowdown_with_the_traced_ring(acc, published_runs):
    # torchtitan's Table 6 (pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md): Llama 3.1 405B on
    # 512 H100 at 500 W, TP 8 in the node and CP across nodes, 76 / 47 / 31 / 16 tokens/s per GPU at CP 1 / 2 /
    # 4 / 8 (32k tokens per rank throughout): slowdowns 1.62 / 2.45 / 4.75. With the ring's transfers waited
    # for, each predicted slowdown is within 12% of the published one (the table gives two significant
    # figures: 31 and 16 are +-1.6% and +-3%) and the summed |log| miss is under 0.15; with them overlapped
    # (the eager ring) the miss is larger.
    rows = {cp: published_runs[rid] for cp, rid in TABLE6.items()}
    measured = {cp: rows[cp]["measured"]["tokens_per_s_per_gpu"] for cp in rows}

    def slowdowns(overlap: bool) -> dict[int, float]:
        pred = {cp: _tokens(acc, rows[cp], overlap) for cp in rows}
        return {cp: pred[1] / pred[cp] for cp in (2, 4, 8)}

    def miss(s: dict[int, float]) -> float:
        return sum(abs(math.log(s[cp] / (measured[1] / measured[cp]))) for cp in s)

    waited, eager = slowdowns(False), slowdowns(True)
    for cp, s in waited.items():
        assert s == pytest.approx(measured[1] / measured[cp], rel=0.12), (cp, s)
    assert miss(waited) < 0.15
    assert miss(waited) < miss(eager)


def test_switch_off_without_pytorchs_ring_is_refused(cli):
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--dp", "4", "--cp", "2",
            "--no-cp-comm-overlap")
    line = r.refusal()
    assert "cp_comm_overlap off with cp 2 and cp_impl te" in line and "--no-cp-comm-overlap" in line, line


def test_switch_off_with_pytorchs_ring_runs_slower(cli):
    base = ("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "2", "--dp", "4",
            "--cp", "4", "--seq-len", "131072", "--global-batch", "4", "--cp-impl", "torch-allgather", "--json")
    on, off = cli(*base), cli(*base, "--no-cp-comm-overlap")
    assert on.code == 0 and off.code == 0, (on.err, off.err)
    t_on, t_off = (json.loads(r.out)["time"]["step_s"] for r in (on, off))
    assert t_off > t_on
