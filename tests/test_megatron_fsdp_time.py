"""ParallelPlan.megatron_fsdp: the micro-batch edges Megatron-FSDP leaves exposed beyond llmplan's default ZeRO-2/3
(docs/formulas.md#step.megatron_fsdp_edges, cost.exposure.dp_exposed_per_mb).

Expected values by hand from NVIDIA/Megatron-LM d98e8a64dd megatron/core/distributed/fsdp/src/megatron_fsdp/:
only the FSDP units (the decoder layers) carry the pre-backward hook that gathers and prefetches in backward order
(megatron_fsdp.py _register_fsdp_hooks), so the last unit, freed after its forward, is gathered in the backward with
nothing beside it; the embedding, final norm and output layer share one non-unit bucket, gathered once a step at its
first use and kept whole (param_and_grad_buffer.py AllGatherPipeline.reset(preserve_non_fsdp_units=True)), whose
gradients are reduce-scattered after the embedding's backward, behind the last unit's reduce-scatter. llmplan's
default (docs/formulas.md#step.dp) exposes a pass's first-layer gather and last-layer reduce-scatter, 1/L of each."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from llmplan.cost.exposure import dp_exposed_per_mb
from llmplan.estimate import estimate_training
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M = builtin_models()["llama-3.1-8b"]
H100 = ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=1)
# Llama 3.1 8B at TP 1 by hand (config.json: h 4096, 32 layers, 32 heads of 128, 8 KV heads, ffn 14336, vocab
# 128256, untied): a decoder layer's parameters and the non-unit ones (embedding, output layer, final norm)
H, F, V, L = 4096, 14336, 128256, 32
UNIT = H * (H + 2 * 8 * 128) + H * H + 3 * H * F + 2 * H
ENDS = 2 * V * H + H
NON_UNIT = ENDS / (L * UNIT + ENDS)  # the non-unit share of the rank's parameters, about 0.13
N = 8  # micro-batches: global batch 64 over dp 8 at micro-batch 1
G, R = 0.8, 0.4  # one step's weight all-gathers (two passes a micro-batch) and reduce-scatters, seconds (chosen)
# compute windows far longer than the collectives, and no contention: what is hidden costs nothing
SC = SimpleNamespace(total=100.0, forward=40.0)
COMM = SimpleNamespace(dp_gather=G, dp_reduce=R, dp_host=0.0, dp_outer_gather=0.0, dp_outer_reduce=0.0)  # no replicas


def plan(zero: int, on: bool) -> ParallelPlan:
    return ParallelPlan(tp=1, pp=1, dp=8, zero=zero, micro_batch=1, global_batch=64, seq_len=4096,
                        megatron_fsdp=on)


def exposed(zero: int, on: bool) -> float:
    p = plan(zero, on)
    assert not check_plan(M, p, H100) and p.num_microbatches == N
    return float(dp_exposed_per_mb(p, COMM, SC, 0.0, L, M))


def test_zero2_exposes_the_last_unit_and_the_non_unit_reduce_scatter():
    rs = R / N
    assert exposed(2, False) == pytest.approx(rs / L)  # the last layer's share of the pass
    assert exposed(2, True) == pytest.approx(rs * (1 - NON_UNIT) / L + rs * NON_UNIT)
    assert NON_UNIT == pytest.approx(0.131, abs=1e-3)


def test_zero3_gathers_the_non_unit_bucket_once_a_step_and_the_last_unit_unprefetched():
    ag, rs = G / 2 / N, R / N  # one pass's gather of a micro-batch
    default = ag / L + rs / L  # the first layer's forward gather and the last layer's reduce-scatter
    assert exposed(3, False) == pytest.approx(default)
    units = ag * (1 - NON_UNIT) / L  # one unit's gather
    megatron = units + units + ag * NON_UNIT / N + rs * (1 - NON_UNIT) / L + rs * NON_UNIT
    assert exposed(3, True) == pytest.approx(megatron)


@pytest.mark.parametrize("zero", [2, 3])
def test_the_step_is_slower_with_it_and_unchanged_without(zero):
    on = estimate_training(M, H100, plan(zero, True)).time.total
    off = estimate_training(M, H100, plan(zero, False)).time.total
    assert on > off
    assert (on - off) / off < 0.03  # edges of a micro-batch: a few per cent at most (docs/validation.md#mfsdp-zero3)


def test_vectorised_search_prices_the_edges_as_the_scalar_estimate():
    from agreement import assert_arrays_agree
    from llmplan.search.grid import Workload, default_space, enumerate_plans
    cluster = ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=2)
    for zero in (2, 3):
        w = Workload(global_batch=64, seq_len=4096, megatron_fsdp=True)
        plans = enumerate_plans(default_space(M, cluster, w, pins={"zero": zero, "pp": 1}), cluster, w)
        idx = [i for i in range(len(plans)) if not check_plan(M, plans.plan(i), cluster)][:40:4]
        assert len(idx) >= 5
        moved = [i for i in idx if float(estimate_training(M, cluster, plans.plan(i)).time.total) != float(
            estimate_training(M, cluster, plans.plan(i).model_copy(update={"megatron_fsdp": False})).time.total)]
        # a plan whose per-unit DP collectives (docs/formulas.md#comm.zero3_unit) outlast the backward beside them
        # is exposed whole either way, so the edges cannot move it: dp 2 across the two nodes, 32 micro-batches
        for i in set(idx) - set(moved):
            e = estimate_training(M, cluster, plans.plan(i))
            assert float(e.time.exposed["dp"]) > 0.4 * float(e.time.total)
        assert len(moved) >= len(idx) - 1
        assert_arrays_agree(M, cluster, plans, idx)
