"""ZeRO-3 over thousands of GPUs without a pipeline, priced as Megatron-FSDP runs it: one collective per unit
(docs/formulas.md#comm.zero3_unit, docs/validation.md#unusual-layout)."""

import pytest

from llmplan.cost.comm import dp_transfers, transfer_seconds
from llmplan.estimate import estimate_training
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems
from llmplan.topology.placement import place

DSV3 = builtin_models()["deepseek-v3"]
GB300 = builtin_systems()["gb300-nvl72"].with_options(domain_gpus=64)
CLUSTER = ClusterSpec(system=GB300, num_nodes=512, gpus_per_node=4)  # 2,048 GPUs in 32 NVLink domains of 64

# NCCL v2.21.5-1 src/graph/tuning.cc: ring LL128 baseLat 14 us, hwLat NVLink 1.9 us a step, network 4.0 us;
# an all-gather / reduce-scatter over n ranks in k domains takes n - 1 steps, k - 1 of them over the network.
LL128_2048 = 14e-6 + (2047 - 31) * 1.9e-6 + 31 * 4.0e-6
LL128_128 = 14e-6 + (127 - 31) * 1.9e-6 + 31 * 4.0e-6


def first_plan(**kw) -> ParallelPlan:
    """The reference search's #1 before docs/validation.md#unusual-layout: tp1 pp1 dp2048 ep16 ZeRO-3 mb2,
    Megatron-FSDP, MXFP8, DeepEP (Hybrid-EP), global batch 4,096 x 4,096 (one micro-batch a step)."""
    base = dict(tp=1, pp=1, dp=2048, ep=16, etp=1, zero=3, recompute="none", micro_batch=2, global_batch=4096,
                seq_len=4096, dtype="fp8", recipe="mxfp8", grad_dtype="bf16", megatron_fsdp=True,
                moe_dispatcher="deepep", moe_flex_backend="hybridep")
    return ParallelPlan(**{**base, **kw})


def test_megatron_fsdp_zero3_gathers_and_reduces_each_unit_on_its_own_group():
    # Megatron-FSDP (NVIDIA/Megatron-LM d98e8a64dd, megatron_fsdp/param_and_grad_buffer.py): the FSDP units are
    # the transformer layers (61, and the MTP module's layer), each unit's expert and non-expert buckets are two
    # bucket groups, each coalesced into one all-gather / reduce-scatter on its own DP group; the embedding and
    # output layer sit outside the units (counted as one more dense unit). A micro-batch gathers every unit
    # twice and reduce-scatters it once.
    p = first_plan()
    assert not check_plan(DSV3, p, CLUSTER)
    spans = place(p.degrees, CLUSTER)
    t = {(x.collective, x.group.size): x for x in dp_transfers(DSV3, p, spans["dpcp"], spans["edp"])
         if x.calls > 0}
    dense, expert = 61 + 1 + 1, 58 + 1  # layers + MTP (+ root); MoE layers + the MTP's MoE layer
    assert t[("all-gather", 2048)].calls == 2 * dense
    assert t[("reduce-scatter", 2048)].calls == dense
    assert t[("all-gather", 128)].calls == 2 * expert
    assert t[("reduce-scatter", 128)].calls == expert
    # each call pays its ring's start: at least NCCL's LL128 latency over 2,048 ranks in 32 domains (3.97 ms)
    for (op, n), x in t.items():
        assert transfer_seconds(x, GB300) / x.calls >= (LL128_2048 if n == 2048 else LL128_128) * (1 - 1e-9)


def test_the_unit_latencies_are_what_the_zero3_plan_pays_at_2048_gpus():
    # 3 x 63 dense calls at >= 3.97 ms: 0.75 s of ring starts a micro-batch beside 1.26 s of compute, where
    # priced as three calls the dense group took 0.17 s in all
    e = estimate_training(DSV3, CLUSTER, first_plan())
    dense = [x for x in e.comm.axes["dp"].transfers if x.group.size == 2048]
    assert sum(transfer_seconds(x, GB300) for x in dense) >= 189 * LL128_2048
    assert float(e.time.exposed["dp"]) > 0.5


def test_the_search_arrays_price_the_units_as_the_estimate():
    from llmplan.search.evaluate import evaluate
    from llmplan.search.grid import from_plan
    for p in (first_plan(), first_plan(zero=2), first_plan(megatron_fsdp=False)):
        vec, scalar = evaluate(DSV3, CLUSTER, from_plan(p)), estimate_training(DSV3, CLUSTER, p)
        assert float(vec.step.total[0]) == pytest.approx(float(scalar.time.total), rel=1e-9)
