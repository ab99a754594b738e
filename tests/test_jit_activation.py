"""Megatron-Core's jit_fuser SwiGLU forward priced at its published H100 rate (GpuSpec.jit_activation_hbm_efficiency,
ParallelPlan.jit_activation; docs/formulas.md#compute.jit_activation).

Published: linkedin/Liger-Kernel benchmark/data/all_benchmark_data.csv at ead96b61 (megatron_swiglu, speed, forward,
NVIDIA H100 80GB HBM3, liger 0.8.1, 2026-07-26; S 2048 x B 4 = 8,192 tokens, bf16 [S, B, 2 ffn_local] input,
triton.testing.do_bench median, benchmark/scripts/benchmark_megatron_swiglu.py): provider "megatron" is
megatron.core.fusions.fused_bias_swiglu.bias_swiglu_impl(y, None, False, False), provider "liger" Liger's Triton
kernel. Bytes per pass: read the 2f-wide bf16 input, write f (6 bytes per token and column)."""
import numpy as np
import pytest

from llmplan.cost.compute import jit_activation_share, layer_seconds, memory_seconds
from llmplan.cost.elementwise import activation_pass_bytes, jit_activation_bytes, jit_routed_bytes
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_gpus, builtin_models

G = builtin_gpus()
M = builtin_models()
TOKENS, PEAK = 8192, 3350e9  # the rows' S x B; H100 SXM's datasheet HBM3 bandwidth
MEGATRON_FWD_MS = {2048: 0.060416001826524734, 4096: 0.11369600147008896, 8192: 0.22015999257564545,
                   16384: 0.4328640103340149, 32768: 0.8584960103034973}  # the CSV's y_value_50, ffn_local >= 2048
LIGER_FWD_MS = {2048: 0.039583999663591385, 4096: 0.07251200079917908, 8192: 0.13708800077438354,
                16384: 0.2670080065727234, 32768: 0.5275039970874786}


def _share(ffn: int, ms: float) -> float:
    return 6 * TOKENS * ffn / (ms * 1e-3) / PEAK


def test_the_h100_profile_carries_the_published_forward_rate():
    shares = {f: _share(f, t) for f, t in MEGATRON_FWD_MS.items()}
    assert min(shares.values()) == pytest.approx(0.497, abs=0.002)  # 101 MB
    assert shares[32768] == pytest.approx(0.560, abs=0.002)  # 1.6 GB
    x = np.array([6 * TOKENS * f for f in MEGATRON_FWD_MS])  # time = t0 + bytes / (R x peak), least squares
    t0, slope = np.linalg.lstsq(np.column_stack([np.ones(len(x)), x]),
                                np.array(list(MEGATRON_FWD_MS.values())) * 1e-3, rcond=None)[0]
    assert 1 / slope / PEAK == pytest.approx(0.565, abs=0.002) and t0 == pytest.approx(7.3e-6, abs=0.3e-6)
    assert G["h100-sxm"].jit_activation_hbm_efficiency == pytest.approx(shares[32768], abs=0.01)
    # the same rows' Triton kernel on the same bytes: the rate belongs to the kernel, not to H100's HBM
    assert all(_share(f, LIGER_FWD_MS[f]) > shares[f] + 0.2 for f in (4096, 8192, 16384, 32768))


def test_unpublished_gpus_keep_hbm_efficiency():
    published = [name for name, gpu in G.items() if gpu.jit_activation_hbm_efficiency is not None]
    assert published == ["h100-sxm"]  # Blackwell, H200, H800, A100: no published jit-kernel timing
    for name in ("b200", "gb200", "gb300", "h200", "h800", "a100-80gb"):
        assert jit_activation_share(G[name]) == pytest.approx(G[name].hbm_efficiency, rel=1e-12)


def test_share_and_memory_seconds_by_hand():
    gpu = G["h100-sxm"]
    assert jit_activation_share(gpu) == pytest.approx(3 / (1 / 0.56 + 2 / 0.8), rel=1e-12)  # 0.700
    got = memory_seconds(10e9, 1e9, gpu, (3e9, 0.5e9))
    want = 5.5e9 / (PEAK * 0.8) + 1e9 / (PEAK * gpu.copy_hbm_efficiency) + 3e9 / (PEAK * 0.7) + 0.5e9 / (PEAK * 0.56)
    assert got == pytest.approx(want, rel=1e-9)


def test_bytes_by_hand_dense_and_moe():
    llama = M["llama-3.1-70b"]
    plan = ParallelPlan(tp=4, dp=2, seq_len=8192, micro_batch=1, jit_activation=True)
    one, rerun = jit_activation_bytes(llama, plan, False)
    assert one == pytest.approx(6 * 8192 * llama.intermediate_size / 4) and rerun == 0.0
    assert jit_activation_bytes(llama, plan.model_copy(update={"jit_activation": False}), False) == (0.0, 0.0)
    assert jit_activation_bytes(llama, plan.model_copy(update={"fused_kernels": False}), False)[0] == 0.0
    qwen = M["qwen3-30b-a3b"]
    moe = ParallelPlan(dp=16, ep=16, seq_len=4096, jit_activation=True, recompute="selective",
                       recompute_modules=("moe_act",))
    routed, rerun = jit_routed_bytes(qwen, moe)
    assert routed == pytest.approx(activation_pass_bytes(qwen) * 4096 * qwen.expert_ffn * qwen.num_experts_per_tok)
    assert rerun == pytest.approx(routed / 3)
    assert jit_activation_bytes(qwen, moe, True) == pytest.approx((routed + 6 * 4096 * (qwen.shared_ffn or 0), rerun))


def test_the_megatron_core_stacks_are_named_and_validation_leaves_them_off():
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    import accuracy as A
    import yaml
    seen = {}
    for rec in yaml.safe_load(A.DEFAULT_RUNS.read_text()):
        fam = A.family(rec["id"])
        if fam in ("mbridge-moe", "mbridge-dense", "torchtitan", "automodel") and fam not in seen:
            setup = A.record_setup(rec, fam)
            if setup is not None:
                seen[fam] = (A.runs_jit_activation(rec, fam), setup[2].jit_activation)
    assert seen == {"mbridge-moe": (True, False), "mbridge-dense": (True, False), "torchtitan": (False, False),
                    "automodel": (False, False)}


def test_the_layer_slows_by_the_jit_bytes_only_where_published():
    m, plan = M["llama-3.1-70b"], ParallelPlan(tp=4, dp=2, seq_len=8192, micro_batch=1)
    jit = plan.model_copy(update={"jit_activation": True})
    h100 = G["h100-sxm"]
    one = 6 * 8192 * m.intermediate_size / 4
    extra = layer_seconds(m, jit, h100, False)[2] - layer_seconds(m, plan, h100, False)[2]
    assert extra == pytest.approx(one / (PEAK * 0.7) - one / (PEAK * 0.8), rel=1e-6) and extra > 0
    gb200 = G["gb200"]
    assert layer_seconds(m, jit, gb200, False)[2] == pytest.approx(layer_seconds(m, plan, gb200, False)[2], rel=1e-12)


def test_moe_recompute_reruns_the_activation_in_the_jit_kernel():
    """Under `moe` recompute Megatron-Core checkpoints MoELayer.forward whole, so the shared and routed experts'
    activation reruns in the same jit_fuser kernels (bias_swiglu_impl, weighted_bias_swiglu_impl): the rerun's
    bytes, a third of each pass (one forward of three forward-equivalents), go to the jit rerun, the part of
    moe_recompute_bytes that is the activation's (with EP 1 no alltoall sort, and Qwen3 has no clamp: all of it)."""
    from llmplan.cost.elementwise import moe_recompute_bytes
    qwen = M["qwen3-30b-a3b"]
    plan = ParallelPlan(dp=8, seq_len=4096, jit_activation=True, recompute="selective", recompute_modules=("moe",))
    routed = activation_pass_bytes(qwen) * 4096 * qwen.expert_ffn * qwen.num_experts_per_tok
    shared = activation_pass_bytes(qwen) * 4096 * (qwen.shared_ffn or 0)
    one, rerun = jit_activation_bytes(qwen, plan, True)
    assert one == pytest.approx(routed + shared) and rerun == pytest.approx((routed + shared) / 3) and rerun > 0
    assert rerun == pytest.approx(moe_recompute_bytes(qwen, plan), rel=1e-12)
    assert jit_activation_bytes(qwen, plan.model_copy(update={"jit_activation": False}), True) == (0.0, 0.0)
    both = plan.model_copy(update={"recompute_modules": ("moe", "moe_act")})
    assert jit_activation_bytes(qwen, both, True)[1] == pytest.approx((routed + shared) / 3 + routed / 3)


def test_check_plan_refuses_the_switch_where_it_does_nothing():
    """jit_activation prices Megatron-Core's gated (SwiGLU / GeGLU) jit_fuser kernel, which runs only with fused
    kernels: on a model whose MLP is not gated (GPT-3's GELU) or with fused_kernels off the switch changes nothing
    (jit_activation_bytes is 0), so check_plan refuses it there (rules jit_activation, jit_activation_fused),
    as swiglu_fp8_input on a GELU MLP, and takes it on a gated MLP with fused kernels."""
    from llmplan.specs.check import check_plan
    plan = ParallelPlan(tp=1, dp=8, global_batch=8, jit_activation=True)
    gpt3, llama = M["gpt3-175b"], M["llama-3.1-8b"]
    assert jit_activation_bytes(gpt3, plan, False) == (0.0, 0.0)
    assert "jit_activation" in [v.rule for v in check_plan(gpt3, plan)]
    assert not [v for v in check_plan(llama, plan) if v.rule.startswith("jit_activation")]
    eager = plan.model_copy(update={"fused_kernels": False})
    assert jit_activation_bytes(llama, eager, False) == (0.0, 0.0)
    why = [v for v in check_plan(llama, eager) if v.rule == "jit_activation_fused"]
    assert len(why) == 1 and "fused_kernels off" in why[0].message
