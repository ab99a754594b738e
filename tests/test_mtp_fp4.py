"""An MTP module's layer runs in bf16 under an fp4 recipe (docs/formulas.md#mixers.mtp_fp4).

Source: NVIDIA/Megatron-LM megatron/core/transformer/multi_token_prediction.py at d98e8a6
(_proj_and_transformer_layer): the module's eh_proj and its transformer layer enter Transformer Engine's
quantisation context only when config.fp8 is set ("currently ignoring FP4 in MTP layers"), so under NVFP4 they
run in bf16; under MXFP8 they run in the recipe's format. Megatron-Bridge's Nemotron-3 Super NVFP4 presets also
match "mtp.*" to bf16 (te_quant.cfg, v0.4.0 - v0.6.0). The rows are the 26.08 Super GB300 pair of
NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md at 067f987df (MXFP8 9,856, NVFP4 10,240 tokens/s/GPU).
"""

from __future__ import annotations

import pytest

from llmplan.cost.hybrid_stage import balanced_stage_compute, mtp_layer_extra, single_kind, with_mtp_layers
from llmplan.cost.stages import stage_layers
from llmplan.cost.compute import stage_compute

SUPER = "mbridge-26.08-pretrain-nemotron-3-super-dgx-gb300-64gpu-{}-tp1pp1cp1ep64vpnagbs512mbs1"


def _setup(published_runs, acc, row_setup, precision):
    rec = published_runs[SUPER.format(precision)]
    m, _, plan = row_setup(rec["id"])
    return m, plan, acc.builtin_systems()[acc.record_system(rec)].gpu


def _mtp_cost(m, plan, gpu):
    """Last-stage compute with one MTP module less without it (PP 1: the stage is the whole stack)."""
    with_mtp, without = (m.model_copy(update={"num_nextn_predict_layers": k}) for k in (1, 0))
    return [float(balanced_stage_compute(x, plan, gpu, 0, *stage_layers(x, plan, 0), True).gemm)
            for x in (with_mtp, without)]


def _all_bf16(m, plan):
    """The plan with every layer kept in bf16 (Megatron --num-layers-at-end-in-bf16 = all)."""
    return plan.model_copy(update={"bf16_layers_start": 0, "bf16_layers_end": m.num_hidden_layers})


def test_nvfp4_mtp_module_costs_a_bf16_attention_moe_layer(published_runs, acc, row_setup):
    m, plan, gpu = _setup(published_runs, acc, row_setup, "nvfp4")
    assert plan.dtype == "fp4" and plan.bf16_layers_end == 14  # the preset's 14 bf16 layers stay as they are
    attention_only = single_kind(m, "full_attention")
    a, b = _mtp_cost(m, plan, gpu)
    c, d = _mtp_cost(attention_only, _all_bf16(m, plan), gpu)
    # the MTP module's GEMMs on the hybrid's NVFP4 plan = the same "*E" block with every matmul in bf16
    assert a - b == pytest.approx(c - d, rel=1e-6)
    # and more than the block at the stack's NVFP4 / bf16 layer mix (which the MXFP8 rule keeps)
    e, f = (float(stage_compute(attention_only, plan, gpu, 0, k, False).gemm) for k in (1, 0))
    assert a - b > 1.5 * (e - f)


def test_mxfp8_mtp_module_stays_in_the_recipe_format(published_runs, acc, row_setup):
    m, plan, gpu = _setup(published_runs, acc, row_setup, "mxfp8")
    assert plan.dtype == "fp8"
    assert all(v == 0.0 for v in mtp_layer_extra(single_kind(m, "full_attention"), plan, gpu).values())
    a, b = _mtp_cost(m, plan, gpu)
    c, d = _mtp_cost(m, _all_bf16(m, plan), gpu)
    assert a - b < 0.95 * (c - d)  # MXFP8 matmuls, faster than the bf16 ones


def test_non_hybrid_mtp_under_fp4(row_setup, published_runs, acc):
    # a non-hybrid stack's MTP modules ride on the last stage as MoE layers (stages._stage_layers): under fp4 each
    # adds the bf16 layer less the mixed one, under the MXFP8 recipe nothing
    m, plan, gpu = _setup(published_runs, acc, row_setup, "nvfp4")
    dense = single_kind(m, "full_attention").model_copy(update={"num_nextn_predict_layers": 2})
    sc = stage_compute(dense, plan, gpu, 0, 1, True)
    # one MoE layer of the stack with every matmul in bf16, less that layer on the plan's own NVFP4 / bf16 mix
    bf16, mixed = (float(stage_compute(dense, x, gpu, 0, 1, False).gemm) for x in (_all_bf16(dense, plan), plan))
    assert bf16 > mixed
    got = with_mtp_layers(sc, dense, plan, gpu, plan.pp - 1)
    assert float(got.gemm) == pytest.approx(float(sc.gemm) + 2 * (bf16 - mixed), rel=1e-9)
    _, _, mx = row_setup(SUPER.format("mxfp8"))
    assert with_mtp_layers(sc, dense, mx, gpu, mx.pp - 1) is sc



# --- the MTP stage among stages of equal layer counts (step.stage_times cache, layout shares, pools) -------

def _v3_cut():
    """DeepSeek-V3 cut to 7 layers (3 dense, 4 MoE) with its one MTP module, and an NVFP4 plan at PP 4 whose
    stages 1 and 2 hold two MoE layers each, the MTP module being one of stage 2's (or stage 1's) two."""
    from llmplan.specs.registry import builtin_gpus, builtin_models

    m = builtin_models()["deepseek-v3"].model_copy(update={"num_hidden_layers": 7})
    assert m.num_nextn_predict_layers == 1 and m.first_k_dense_replace == 3
    return m, builtin_gpus()["b200"]


def _plan(layout, vpp=1):
    from llmplan.specs.plan import ParallelPlan

    return ParallelPlan(pp=4, vpp=vpp, dtype="fp4", recipe="nvfp4", pp_layout=layout, global_batch=8,
                        micro_batch=1)


def _moe_layer(m, plan, gpu):
    """gemm of one MoE layer in NVFP4, and of one MoE layer in bf16 (every layer kept in bf16), by hand."""
    return [float(stage_compute(m, x, gpu, 0, 1, False).gemm) for x in (plan, _all_bf16(m, plan))]


@pytest.mark.parametrize("layout,mtp_stage", [(("Ettt", "tt", "tm", "tL"), 2), (("Ettt", "tm", "tt", "tL"), 1)])
def test_stage_with_mtp_not_priced_as_its_equal_count_neighbour(layout, mtp_stage):
    from llmplan.cost.step import stage_times

    m, gpu = _v3_cut()
    plan = _plan(layout)
    fp4, bf16 = _moe_layer(m, plan, gpu)
    assert bf16 > 1.2 * fp4  # the bf16 layer is the slower one: the cases below can tell them apart
    got = {s: float(sc.gemm) for s, sc, _, _ in stage_times(m, plan, gpu)}
    other = 3 - mtp_stage
    # the stage without the module: two NVFP4 MoE layers; the stage with it: one NVFP4 layer and the module's
    # bf16 one (before the fix the second of the two was read from the first's cache entry)
    assert got[other] == pytest.approx(2 * fp4, rel=1e-9)
    assert got[mtp_stage] == pytest.approx(fp4 + bf16, rel=1e-9)


def test_layout_chunk_shares_count_the_mtp_module_in_bf16():
    from llmplan.cost.step import layout_chunk_shares

    m, gpu = _v3_cut()
    # vpp 2: stage 1's chunks are "tt" (layers 3, 4) and "tm" (layer 6 and the MTP module)
    plan = _plan(("Ettt", "tt", "t", "", "", "tm", "", "L"), vpp=2)
    # one MoE layer's whole compute in NVFP4 and in bf16 (every layer kept in bf16), by hand
    fp4, bf16 = (float(stage_compute(m, x, gpu, 0, 1, False).total) for x in (plan, _all_bf16(m, plan)))
    share, _ = layout_chunk_shares(m, plan, gpu)
    a, b = (float(x) for x in share[1])
    # chunk "tt": two NVFP4 MoE layers; chunk "tm": one NVFP4 layer and the module's bf16 one
    assert b / a == pytest.approx((fp4 + bf16) / (2 * fp4), rel=1e-6)
    assert b / a > 1.1


def test_pool_busy_time_counts_the_mtp_module_in_bf16():
    from llmplan.hetero import estimate_hetero
    from llmplan.specs.pools import HeteroPlan, InterPoolFabric, PoolCluster, PoolSpec
    from llmplan.specs.registry import builtin_systems

    m, gpu = _v3_cut()
    system = builtin_systems()["dgx-b200"]
    assert system.gpu.name == gpu.name
    pc = PoolCluster(pools=tuple(PoolSpec(name=f"b200-{i}", system=system, nodes=1) for i in range(2)),
                     fabric=InterPoolFabric(gb_per_s=50, latency_s=1e-5))
    plan = _plan(("Etttt", "tt", "t", "mL"))
    est = estimate_hetero(m, pc, HeteroPlan(plan=plan, assignment="stages", stage_pools=(0, 0, 0, 1)))
    pool1 = next(u for u in est.pools if u.pool == 1)
    assert pool1.stages == (3,)
    # pool 1's one stage: the loss and the MTP module, whose layer runs in bf16: the stage priced with an NVFP4
    # MoE layer, that layer swapped for its bf16 self (one MoE layer's compute in each format, by hand)
    fp4, bf16 = (float(stage_compute(m, x, gpu, 0, 1, False).total) for x in (plan, _all_bf16(m, plan)))
    want = float(stage_compute(m, plan, gpu, 0, 1, True).total) - fp4 + bf16
    assert pool1.compute_s / plan.num_microbatches == pytest.approx(want, rel=1e-6)
