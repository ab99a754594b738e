"""The routed experts' GEMM path (ParallelPlan.expert_gemm, docs/formulas.md#compute.expert_gemms): Transformer
Engine's GroupedLinear runs one GEMM per local expert, each costing EXPERT_GEMM_S beyond its share of one grouped
kernel, in forward and twice in backward; one grouped kernel (Megatron-Bridge 26.06's fused grouped MLP) does not.
And the Megatron-Bridge presets that decide which rows run which path, dispatcher and EP overlap
(benchmarks/accuracy.py mbridge_expert_gemm, mbridge_moe_recipe)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.compute import EXPERT_GEMM_S, KERNEL_LAUNCH_S, expert_gemm_seconds, stage_compute
from llmplan.cost.gemm import layer_gemm_seconds
from llmplan.search.grid import from_plan
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M = builtin_models()
S = builtin_systems()


def _plan(**kw) -> ParallelPlan:
    base = dict(ep=8, dp=8, etp=1, micro_batch=1, global_batch=64, seq_len=4096, zero=1)
    return ParallelPlan(**{**base, **kw})


def test_published_cost_per_expert_gemm():
    # NVIDIA/TransformerEngine PR 3134, SM100: 8 experts x 128 rows, multi-stream 0.267 ms, one launch 0.069 ms
    assert EXPERT_GEMM_S == pytest.approx((0.267e-3 - 0.069e-3) / 8)


def test_two_calls_per_local_expert_on_the_per_expert_path_only():
    m = M["qwen3-30b-a3b"]  # 128 experts: 16 per rank at EP 8
    assert float(expert_gemm_seconds(m, _plan(expert_gemm="per-expert"))) == pytest.approx(2 * 16 * EXPERT_GEMM_S)
    assert float(expert_gemm_seconds(m, _plan())) == 0.0  # one grouped kernel
    # without fused kernels a grouped path's expert matmuls are eager launches ...
    assert float(expert_gemm_seconds(m, _plan(fused_kernels=False))) == pytest.approx(2 * 16 * KERNEL_LAUNCH_S)
    # ... and the per-expert path keeps its per-call cost: turning fusions off never makes the experts cheaper
    off = float(expert_gemm_seconds(m, _plan(expert_gemm="per-expert", fused_kernels=False)))
    assert off == pytest.approx(2 * 16 * EXPERT_GEMM_S)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(ep=st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128]))
def test_cost_falls_as_experts_spread_over_more_ranks(ep):
    m = M["qwen3-30b-a3b"]
    t = float(expert_gemm_seconds(m, _plan(ep=ep, dp=128, expert_gemm="per-expert")))
    assert t == pytest.approx(2 * m.num_experts / ep * EXPERT_GEMM_S)


def test_the_stage_pays_it_in_every_pass_of_its_moe_layers():
    # forward, and the backward's input- and weight-gradient GEMMs: 3 passes of 48 MoE layers
    m, gpu = M["qwen3-30b-a3b"], S["dgx-b200"].gpu
    grouped = stage_compute(m, _plan(), gpu, 0, 48, False)
    per_expert = stage_compute(m, _plan(expert_gemm="per-expert"), gpu, 0, 48, False)
    extra = float(per_expert.total) - float(grouped.total)
    assert extra == pytest.approx(3 * 48 * 2 * 16 * EXPERT_GEMM_S, rel=1e-9)
    assert float(per_expert.gemm) == float(grouped.gemm)  # the FLOPs' time is the grouped GEMM's either way


def test_vectorised_plans_agree_with_scalar_ones():
    m = M["qwen3-30b-a3b"]
    eps = np.array([2, 4, 8, 16])
    arr = ParallelPlan.model_construct(**{**_plan(expert_gemm="per-expert").__dict__, "ep": eps,
                                          "dp": np.full(4, 16)})
    t = expert_gemm_seconds(m, arr)
    for i, ep in enumerate(eps):
        assert t[i] == pytest.approx(float(expert_gemm_seconds(m, _plan(ep=int(ep), dp=16, expert_gemm="per-expert"))))



def test_grouped_with_expert_tp_runs_per_expert_under_megatron_tp():
    # NVIDIA/Megatron-LM megatron/core/transformer/moe/experts.py at d98e8a6, _is_fused_impl_supported: the fused
    # grouped MLP needs expert TP 1, so a grouped plan at etp > 1 builds TEGroupedMLP (one GEMM per local expert);
    # torch._grouped_mm on DTensor shards (tp_impl dtensor) stays one kernel.
    m = M["deepseek-v3"]  # 256 experts, all local at EP 1
    etp4 = dict(tp=4, ep=1, dp=2, etp=4)
    assert float(expert_gemm_seconds(m, _plan(**etp4))) == pytest.approx(2 * 256 * EXPERT_GEMM_S)
    assert float(expert_gemm_seconds(m, _plan(**etp4, tp_impl="dtensor"))) == 0.0
    assert float(expert_gemm_seconds(m, _plan(tp=4, ep=8, dp=2, etp=1))) == 0.0  # the fused path runs
    for etp in (1, 2, 4):  # the search's plan arrays agree with the scalar plan
        p = _plan(tp=4, ep=1, dp=2, etp=etp)
        assert float(expert_gemm_seconds(m, from_plan(p))[0]) == pytest.approx(float(expert_gemm_seconds(m, p)))


# Megatron-Bridge's Qwen3-30B-A3B on 8 B200 at micro-batch 1 (26.02 table: 9,691 tokens/s per GPU; 16 local
# experts) against the same plan on 8 B200 at micro-batch 4 (26.02.01: 26,695): the per-expert cost does not grow
# with the micro-batch, so the small micro-batch pays it on 4x fewer tokens.
B200_MBS1 = "mbridge-26.02-pretrain-qwen3-30b-a3b-dgx-b200-8gpu-mxfp8-tp1pp1cp1ep8vpnagbs512mbs1"
B200_MBS4 = "mbridge-26.02.01-pretrain-qwen3-30b-a3b-dgx-b200-8gpu-mxfp8-tp1pp1cp1ep8vpnagbs512mbs4"


def _row(acc, rec: dict) -> tuple[float, float]:
    (_, pred, meas), *_ = acc.predict(rec, acc.family(rec["id"]))
    return pred, meas


def test_per_expert_rows_and_fused_grouped_mlp_rows(published_runs, acc):
    assert acc.mbridge_expert_gemm(published_runs[B200_MBS1]) == "per-expert"
    # 26.06 MXFP8 presets: cutedsl_fused_grouped_mlp (v0.5.0 qwen3_workload_base_configs.py)
    fused = "mbridge-26.06-pretrain-qwen3-30b-a3b-dgx-gb300-8gpu-mxfp8-tp1pp1cp1ep8vpnagbs512mbs8"
    assert acc.mbridge_expert_gemm(published_runs[fused]) == "grouped"


def test_micro_batch_4_row_within_15_percent(published_runs, acc):
    # +11.6% before the per-expert path was priced; tolerance 15%: issue 32's target for mbridge's MoE rows
    pred, meas = _row(acc, published_runs[B200_MBS4])
    assert meas == 26695
    assert pred == pytest.approx(meas, rel=0.15)


def test_small_micro_batch_pays_more_per_token(published_runs, acc, monkeypatch):
    # published: micro-batch 1 runs 9,691 / 26,695 = 0.36 of micro-batch 4's tokens/s per GPU; before the
    # per-expert path was priced llmplan gave 0.98 (29,217 / 29,801); priced, the ratio must fall below 0.8.
    # The micro-batch 1 row is not scored since docs/validation.md#qwen3-h100-fp8-rows (Megatron-Bridge issue
    # #1998: the 25.11 / 26.02 dropless B200 and H100 runs are a known 2x regression; 25.09's token-drop B200 run
    # at micro-batch 1 read 18,066, 0.68 of 26,695), so part of the published 0.36 is that regression; the
    # model's ratio is priced here with the skip list emptied.
    monkeypatch.setattr(acc, "MBRIDGE_SKIP", ())
    small, big = _row(acc, published_runs[B200_MBS1]), _row(acc, published_runs[B200_MBS4])
    assert small[1] / big[1] < 0.4
    assert small[0] / big[0] < 0.8


@pytest.mark.parametrize("rid, flex, overlap", [
    # v0.2.0 configs/qwen3/workload_base_configs.py: the B200 and H100 presets set no flex backend (the Qwen3
    # provider's alltoall), the H100 ones moe_a2a_overlap=True
    ("mbridge-25.11-pretrain-qwen3-30b-a3b-dgx-b200-8gpu-fp8mx-tp1pp1cp1ep8vp1gbs512mbs1", False, False),
    ("mbridge-25.11-pretrain-qwen3-30b-a3b-dgx-h100-16gpu-fp8cs-tp1pp2cp1ep8vp24gbs512mbs2", False, True),
    ("mbridge-25.11-pretrain-qwen3-30b-a3b-dgx-gb200-8gpu-fp8mx-tp1pp1cp1ep8vp1gbs512mbs4", True, False),
    # v0.3.0 configs/qwen/qwen3_workload_base_configs.py: B200 as before; H100 deepep with moe_a2a_overlap
    (B200_MBS1, False, False),
    ("mbridge-26.02-pretrain-qwen3-30b-a3b-dgx-h100-16gpu-fp8-tp1pp2cp1ep8vp12gbs1024mbs1", True, True),
    # v0.3.0's Qwen3-235B B300 presets: moe_a2a_overlap=True (v0.3.1 sets False)
    ("mbridge-26.02-pretrain-qwen3-235b-a22b-dgx-b300-256gpu-mxfp8-tp1pp8cp1ep8vp4gbs8192mbs1", False, True),
    # v0.2.0's DeepSeek-V3 B200 preset: no flex backend (the DeepSeek provider's alltoall); GB200 hybridep
    ("mbridge-25.11-pretrain-deepseekv3-w-mtp-dgx-b200-256gpu-fp8mx-tp1pp16cp1ep8vp1gbs2048mbs1", False, False),
    ("mbridge-25.11-pretrain-deepseekv3-w-o-mtp-dgx-gb200-256gpu-fp8mx-tp1pp8cp1ep32vp4gbs4096mbs1", True, False),
    # 25.09's token-drop runs: apply_moe_token_drop asserts the alltoall dispatcher (v0.1.0rc3 run_script.py)
    ("mbridge-25.09-pretrain-qwen3-30b-a3b-tokendrop-dgx-gb200-8gpu-fp8-tp1pp1cp1ep8vp1gbs512mbs4", False, False),
    # v0.3.1 (26.02.01) on: hybridep on B200 (BASE config deepep, the B200 preset hybridep)
    ("mbridge-26.02.01-pretrain-qwen3-30b-a3b-dgx-b200-8gpu-mxfp8-tp1pp1cp1ep8vpnagbs512mbs4", True, False),
])
def test_qwen3_presets_per_release(published_runs, acc, rid, flex, overlap):
    assert acc.mbridge_moe_recipe(published_runs[rid]) == (flex, overlap)


def test_token_drop_rows_pad_every_expert_to_capacity_one(published_runs, acc):
    # moe_token_drop.py (v0.1.0rc3): moe_expert_capacity_factor 1.0, moe_pad_expert_input_to_capacity True
    rid = "mbridge-25.09-pretrain-qwen3-30b-a3b-tokendrop-dgx-b200-8gpu-fp8-tp1pp1cp1ep8vp1gbs512mbs1"
    assert acc.plan_for(published_runs[rid], "mbridge-moe", 8).moe_capacity_factor == 1.0
    dropless = "mbridge-25.11-pretrain-qwen3-30b-a3b-dgx-b200-8gpu-fp8mx-tp1pp1cp1ep8vp1gbs512mbs1"
    assert acc.plan_for(published_runs[dropless], "mbridge-moe", 8).moe_capacity_factor is None


def test_deepseek_b300_26_06_runs_its_bf16_preset(published_runs, acc):
    # v0.5.0 deepseek_workload_base_configs.py: DEEPSEEK_V3_PRETRAIN_CONFIG_B300_FP8_MX_V2 = the BF16 V2 preset (TE
    # graphs of attn / moe_router / moe_preprocess, moe_a2a_overlap False, no fused grouped MLP, no FP8 attention)
    rec = published_runs["mbridge-26.06-pretrain-deepseekv3-dgx-b300-256gpu-mxfp8-tp1pp8cp1ep8vpnagbs4096mbs2"]
    assert acc.mbridge_cuda_graphs(rec) == "layers"
    assert acc.mbridge_moe_recipe(rec) == (True, False)
    assert acc.mbridge_expert_gemm(rec) == "per-expert" and not acc.mbridge_fp8_attention(rec)


def test_deepseek_b200_26_04_01_runs_its_mxfp8_v2_preset(published_runs, acc):
    # v0.4.2 deepseek_workload_base_configs.py: DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2 = deepep, PP8 VP2 EP32,
    # moe_a2a_overlap=True, cuda_graph_impl transformer_engine (attn / moe_router / moe_preprocess), recompute
    # mla_up_proj and mlp, pp_layout "Et*4|(t*4|)*14tmL"; the PP16 EP8 rows of 26.02 / 26.04 run the V1 preset
    rec = published_runs["mbridge-26.04.01-pretrain-deepseekv3-dgx-b200-256gpu-mxfp8-tp1pp8cp1ep32vp2gbs4096mbs1"]
    assert acc.mbridge_moe_recipe(rec) == (True, True)
    assert acc.mbridge_cuda_graphs(rec) == "layers"
    assert acc.mbridge_recompute_modules(rec) == ("mla_up_proj", "mlp")
    assert acc.mbridge_layout(rec, 8, 2) == ("Etttt",) + ("tttt",) * 14 + ("tmL",)
    pp16 = published_runs["mbridge-26.04-pretrain-deepseekv3-dgx-b200-256gpu-mxfp8-tp1pp16cp1ep8vpnagbs4096mbs1"]
    assert acc.mbridge_moe_recipe(pp16) == (True, False) and acc.mbridge_cuda_graphs(pp16) == "none"


def test_cli_switch_reaches_the_plan_and_the_step(cli):
    args = ("estimate", "--model", "qwen3-30b-a3b", "--hardware", "dgx-b200", "--ep", "8", "--global-batch", "64",
            "--json")
    grouped, per_expert = cli(*args), cli(*args, "--expert-gemm", "per-expert")
    assert grouped.code == 0 and per_expert.code == 0, per_expert.err
    assert per_expert.json()["plan"]["expert_gemm"] == "per-expert" and grouped.json()["plan"]["expert_gemm"] == "grouped"
    assert per_expert.json()["time"]["step_s"] > grouped.json()["time"]["step_s"]
    bad = cli(*args, "--expert-gemm", "loop")
    assert bad.code == 2 and "--expert-gemm loop" in bad.err and "Traceback" not in bad.err


def test_search_conventional_ep1_plan_pays_per_expert_calls_once_per_pass_and_weights_once():
    # The search's former "conventional" Qwen3-30B-A3B plan on 4 x DGX H100 (before docs/validation.md#conv-ep
    # gave MoE models EP inside the NVLink domain): tp4 sp ep1 (etp = tp = 4, Megatron-Core's
    # default), so TEGroupedMLP runs (the fused grouped MLP needs expert TP 1) over all 128 experts on every
    # rank. Hand count, per micro-batch: 2 linears x 128 local experts x 3 passes x 48 MoE layers = 36,864
    # per-expert GEMM calls at EXPERT_GEMM_S (0.912 s), nothing else per expert (docs/validation.md#conv-moe).
    m, gpu = M["qwen3-30b-a3b"], S["dgx-h100"].gpu
    conv = ParallelPlan(tp=4, dp=8, ep=1, sp=True, zero=1, recompute="selective", micro_batch=1,
                        global_batch=1024, seq_len=4096)
    etp1 = conv.model_copy(update={"etp": 1})  # the same plan on one grouped kernel
    extra = float(stage_compute(m, conv, gpu, 0, 48, True).memory_bound) - float(
        stage_compute(m, etp1, gpu, 0, 48, True).memory_bound)
    assert extra == pytest.approx(2 * 128 * 3 * 48 * EXPERT_GEMM_S, rel=0.01)
    # The experts' weights are read once per pass and micro-batch (a grouped GEMM), not once per expert call:
    # 128 x 3 x 2048 x 768 / etp 4 x 2 bytes = 302 MB a layer, 3 passes x 48 layers at the achieved HBM rate.
    floor = 3 * 48 * 128 * 3 * 2048 * 768 / 4 * 2 / gpu.hbm_achieved_bytes_per_s  # 16.2 ms on H100
    f, b = layer_gemm_seconds(m, conv, gpu, True, only="expert")
    assert floor <= 48 * float(f + b) < 4 * floor
