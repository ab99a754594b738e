"""The Nemotron-3 validation rows read in the Megatron-Bridge performance presets of their release (the tag of each
table's container: 26.02.01 = v0.3.1, 26.04 = v0.4.0, 26.04.01 = v0.4.2, 26.06 = v0.5.0, 26.08 = v0.6.0).
Expected values are copied from those files, not from the code under test:
scripts/performance/configs/nemotronh/nemotron_3_nano_workload_base_configs.py (v0.3.1),
nemotron_3_workload_base_configs.py (v0.4.0 - v0.5.0), src/megatron/bridge/perf_recipes/nemotronh/*/nemotronh.py
(v0.6.0) and src/megatron/bridge/recipes/nemotronh/nemotron_3_super.py (mtp_num_layers)."""

from __future__ import annotations

import pytest

NANO_H100 = "mbridge-26.04-pretrain-nemotron-3-nano-dgx-h100-16gpu-fp8-tp1pp1cp1ep8vpnagbs1024mbs1"
NANO_GB300 = "mbridge-26.06-pretrain-nemotron-3-nano-dgx-gb300-8gpu-mxfp8-tp1pp1cp1ep8vpnagbs512mbs4"
SUPER = "mbridge-26.06-pretrain-nemotron-3-super-dgx-{}-64gpu-{}-tp{}pp1cp1ep{}vpnagbs512mbs1"


def test_nano_presets_run_te_graphs_and_recompute_the_moe_block_on_h100(published_runs, acc):
    # BASE_NEMOTRON_3_NANO_CONFIG: cuda_graph_impl "transformer_engine", scope attn, mamba, moe_router,
    # moe_preprocess (overriding the recipe's "none"); NEMOTRON_3_NANO_PRETRAIN_CONFIG_H100_FP8_CS_V1: scope
    # mamba, recompute_modules ["moe", "layernorm", "core_attn", "moe_act"].
    h100, gb300 = published_runs[NANO_H100], published_runs[NANO_GB300]
    assert acc.mbridge_cuda_graphs(h100) == acc.mbridge_cuda_graphs(gb300) == "layers"
    assert set(acc.mbridge_recompute_modules(h100)) == {"moe", "layernorm", "core_attn", "moe_act"}
    assert acc.mbridge_recompute_modules(gb300) == ()


@pytest.mark.parametrize("gpu,precision,tp,ep,modules,graphs", [
    ("gb300", "mxfp8", 1, 64, (), "layers"),
    ("gb200", "mxfp8", 2, 64, (), "layers"),      # BASE_NEMOTRON_3_SUPER_CONFIG_GB200: TP2 only
    ("b300", "mxfp8", 1, 8, (), "layers"),
    ("b300", "nvfp4", 1, 8, ("moe_act", "layernorm"), "layers"),  # = the B300 BF16 preset
])
def test_super_presets_per_gpu_and_precision(published_runs, acc, gpu, precision, tp, ep, modules, graphs):
    rec = published_runs[SUPER.format(gpu, precision, tp, ep)]
    assert set(acc.mbridge_recompute_modules(rec)) == set(modules)
    assert acc.mbridge_cuda_graphs(rec) == graphs


def test_super_b200_presets(published_runs, acc):
    # BASE_NEMOTRON_3_SUPER_CONFIG_B200 (MXFP8): no graphs, moe_act + layernorm; the NVFP4 one: TP2, TE graphs,
    # recompute_modules None.
    mx = next(r for r in published_runs.values() if r["id"].startswith("mbridge-26.04-pretrain-nemotron-3-super-dgx-b200")
              and "mxfp8" in r["id"])
    fp4 = next(r for r in published_runs.values() if r["id"].startswith("mbridge-26.04-pretrain-nemotron-3-super-dgx-b200")
               and "nvfp4" in r["id"])
    assert set(acc.mbridge_recompute_modules(mx)) == {"moe_act", "layernorm"}
    assert acc.mbridge_cuda_graphs(mx) == "none"
    assert acc.mbridge_recompute_modules(fp4) == () and acc.mbridge_cuda_graphs(fp4) == "layers"


def test_super_trains_its_mtp_module_twice(published_runs, acc):
    # nemotron_3_super_pretrain_config: mtp_num_layers = 2, mtp_use_repeated_layer = True (v0.4.0 on).
    rec = published_runs[SUPER.format("gb300", "mxfp8", 1, 64)]
    assert acc.model_for(rec, "mbridge-moe").num_nextn_predict_layers == 2


def test_recomputing_the_moe_block_runs_its_all_to_alls_again():
    # Megatron-LM moe_layer.py: with "moe" in recompute_modules the layer's whole forward (router, dispatch,
    # experts, combine) is checkpointed, so backward dispatches and combines once more: 6 all-to-alls per MoE
    # layer and micro-batch instead of 4. moe_act alone recomputes the activation, no communication.
    from llmplan.cost.comm import ep_transfers
    from llmplan.specs.plan import ParallelPlan
    from llmplan.specs.registry import builtin_models

    m = builtin_models()["nemotron-3-nano"]
    base = {"tp": 1, "pp": 1, "dp": 16, "ep": 8, "etp": 1, "micro_batch": 1, "global_batch": 1024,
            "seq_len": 8192, "zero": 1, "moe_dispatcher": "deepep"}
    n = 1024 // 16 * m.num_moe_layers

    def calls(**kw) -> float:
        (t,) = ep_transfers(m, ParallelPlan(**base, **kw), "ep")
        return t.calls

    assert calls() == 4 * n
    assert calls(recompute="selective", recompute_modules=("moe_act", "layernorm")) == 4 * n
    assert calls(recompute="selective", recompute_modules=("moe", "layernorm", "core_attn", "moe_act")) == 6 * n


def test_super_and_ultra_tp2_presets_run_without_tp_comm_overlap(published_runs, acc, row_plan):
    # Megatron-Bridge recipes/nemotronh/nemotron_3_super.py (v0.4.0 - v0.5.0) and recipes/nemotronh/h100/
    # nemotron_3_{super,ultra}.py (v0.6.0) set no comm_overlap (recipes/common.py: comm_overlap=None); the
    # perf_recipes/nemotronh/gb200 Super / Ultra builders set none either, where the Nano builders set
    # comm_overlap.tp_comm_overlap = True. Megatron-Core's tp_comm_overlap default is False.
    rows = [r for r in published_runs.values() if acc.family(r["id"]) == "mbridge-moe" and "-tp2" in r["id"]
            and ("nemotron-3-super" in r["id"] or "nemotron-3-ultra" in r["id"])]
    assert len(rows) >= 10
    for rec in rows:
        plan = row_plan(rec["id"])
        assert plan.tp == 2 and plan.sp and not plan.tp_comm_overlap, rec["id"]
    # Qwen3-235B-A22B on H100 (TP2, moe_a2a_overlap): utils/overrides.py _set_moe_a2a_overlap_overrides builds
    # CommOverlapConfig(tp_comm_overlap=tp > 1), so it keeps the overlap
    other = next(r for r in published_runs.values() if r["id"].startswith("mbridge-26.04-pretrain-qwen3-235b")
                 and "-h100-" in r["id"] and "-tp2" in r["id"])
    assert row_plan(other["id"]).tp_comm_overlap


def test_ultra_presets_run_the_fused_grouped_mlp(published_runs, acc):
    # v0.6.0 perf_recipes/nemotronh/common.py _apply_nemotron_3_ultra_perf_defaults sets
    # use_transformer_engine_op_fuser = True after _benchmark_common, and use_fused_weighted_squared_relu; the GB200
    # / GB300 Ultra builders export NVTE_CUTEDSL_FUSED_GROUPED_MLP=1. Megatron-LM at the v0.6.0 pin (cd4afff)
    # fuses the weighted squared ReLU (experts.py _is_fused_impl_supported): one grouped kernel, not one GEMM
    # per local expert. The Super presets of the same release set neither (their rows stay per-expert).
    ultra = [r for r in published_runs.values() if "nemotron-3-ultra" in r["id"]]
    assert len(ultra) == 2 and all(acc.mbridge_expert_gemm(r) == "grouped" for r in ultra)
    sup = published_runs[SUPER.format("gb300", "mxfp8", 1, 64)]
    assert acc.mbridge_expert_gemm(sup) == "per-expert"


def test_a_hybrid_mtp_module_is_an_attention_and_moe_block_with_its_projection(published_runs, acc, row_setup):
    # Megatron-LM multi_token_prediction.py (cd4afff): a hybrid's MTP module builds its block from
    # mtp_hybrid_override_pattern, "*E" in Nemotron-3 Super's config.json (attention, then the MoE layer), after
    # eh_proj (2h -> h, column-parallel). So on the last stage one MTP module must cost what the same module
    # costs in an all-attention copy of the model (where the average mixer is attention), whatever the
    # hybrid's mix of Mamba-2 and attention, plus nothing else; and eh_proj's FLOPs are two per weight element
    # of the rank's projection (cost.params.mtp_projection_params less its two norms) and token.
    from llmplan.cost.compute import mtp_projection_seconds
    from llmplan.cost.gemm import gemm_shape_efficiency
    from llmplan.cost.hybrid_stage import balanced_stage_compute, single_kind
    from llmplan.cost.params import mtp_projection_params, norm_params
    from llmplan.cost.stages import stage_layers

    rec = published_runs[SUPER.format("gb300", "mxfp8", 1, 64)]
    base, _, plan = row_setup(rec["id"])
    gpu = acc.builtin_systems()[acc.record_system(rec)].gpu

    def mtp_cost(m):
        with_mtp, without = (m.model_copy(update={"num_nextn_predict_layers": k}) for k in (1, 0))
        total = [balanced_stage_compute(x, plan, gpu, 0, *stage_layers(x, plan, 0), True).total
                 for x in (with_mtp, without)]
        return total[0] - total[1]

    attention_only = single_kind(base, "full_attention")
    assert mtp_cost(base) == pytest.approx(mtp_cost(attention_only), rel=1e-6)  # the GEMM-efficiency mix
    mamba_only = single_kind(base, "mamba")
    assert mtp_cost(base) != pytest.approx(mtp_cost(mamba_only), rel=1e-3)  # a Mamba-2 mixer costs otherwise

    one = base.model_copy(update={"num_nextn_predict_layers": 1})
    T = plan.seq_len * plan.micro_batch
    weights = mtp_projection_params(one, plan.tp) - 2 * norm_params(one)
    eff = gemm_shape_efficiency(gpu, plan.gemm_format, T, one.hidden_size / plan.tp, 2 * one.hidden_size)
    # an MXFP8 TE linear on cuBLASLt takes the block-scaled rate (docs/formulas.md#compute.mxfp8_cublas_rate)
    cublas = 171.869 / 163.493 if plan.gemm_format == "mxfp8" else 1.0
    assert mtp_projection_seconds(one, plan, gpu) == pytest.approx(
        2 * T * weights * cublas / (gpu.sustained_flops(plan.gemm_format) * eff), rel=1e-9)
