"""The 25.09 DeepSeek-V3 H100 row's DP overlap as its preset set it, and a published on / off pair of
Megatron-Core's EP overlap with DeepEP across H100 nodes (docs/validation.md#dsv3-h100-shares)."""

from __future__ import annotations

import pytest

from llmplan.estimate import estimate_training

DSV3_H100 = "mbridge-25.09-pretrain-deepseekv3-dropless-dgx-h100-1024gpu-fp8-tp2pp8cp1ep64vp4gbs8192mbs1"
DSV3_25_09_BLACKWELL = ("mbridge-25.09-pretrain-deepseekv3-tokendrop-dgx-gb200-256gpu-fp8-tp1pp4cp1ep64vp4gbs2048mbs1",
                        "mbridge-25.09-pretrain-deepseekv3-tokendrop-dgx-b200-256gpu-fp8-tp1pp16cp1ep8vp1gbs2048mbs1")
QWEN3_235B_H100 = "mbridge-26.04.01-pretrain-qwen3-235b-a22b-dgx-h100-256gpu-fp8-tp2pp8cp1ep32vp4gbs8192mbs1"


def test_dsv3_25_09_h100_reduces_gradients_after_the_backward(row_plan):
    # NVIDIA-NeMo/Megatron-Bridge scripts/performance/run_script.py at v0.1.0rc4 (6725f7049): DeepSeek-V3
    # `elif args.gpu.lower() in ["h100"]: recipe.comm_overlap.overlap_grad_reduce = False`, True on gb200 / b200
    assert row_plan(DSV3_H100).overlap_grad_reduce is False
    for rid in DSV3_25_09_BLACKWELL:
        assert row_plan(rid).overlap_grad_reduce is True


def modelzoo_pair(row_setup, overlap: bool):
    """yanring/Megatron-MoE-ModelZoo at 8017e11 (2025-05-27), examples/qwen3/readme.md and run_235b.sh: Qwen3-235B-A22B
    on 256 H100 (8 a node, 8 x 50 GB/s InfiniBand), BF16, DeepEP (--moe-token-dispatcher-type flex
    --moe-enable-deepep, Megatron-Core's 20 SMs), TP2 PP8 VPP4 EP32 (4 nodes) ETP1, MBS 1, GBS 2048, sequence 4,096,
    selective recompute of moe_act and layernorm, forced load balancing; its model_configs/benchmarking/
    Qwen3-235B-A22B.yaml: the distributed optimizer with both DP overlaps, no TP overlap, router or loss fusion,
    fp32 gradient reduction (no --grad-reduce-in-bf16), the embedding and the loss counted in the pipeline split
    (3 of 96 units a chunk). The overlap arm adds --combined-1f1b --combined-1f1b-recipe ep_a2a; read with delayed
    weight gradients (the recipe's split dgrad / wgrad). Measured: 19.7 s off, 17.6 s on (moe_dev f3e6c5)."""
    model, cluster, plan = row_setup(QWEN3_235B_H100)  # the same model and DGX-H100 cluster, 256 GPUs
    plan = plan.model_copy(update=dict(
        dtype="bf16", fp8_params=False, fp8_scaling="delayed", recipe="tensorwise", global_batch=2048,
        recompute="selective", recompute_modules=("moe_act", "layernorm"), moe_dispatcher="deepep",
        moe_flex_backend="deepep", moe_dispatch_sms=None, tp_comm_overlap=False, tp_overlap_margin_sms=None,
        pp_first=None, pp_last=None, pp_layout=("Ett",) + ("ttt",) * 30 + ("ttL",),
        overlap_param_gather_with_optimizer_step=False, moe_router_fusion=False, fused_loss=False,
        grad_dtype="fp32", param_remainders=False, ep_comm_overlap=overlap, delay_wgrad=overlap))
    return float(estimate_training(model, cluster, plan).time.total)


def test_modelzoo_deepep_pair_off_arm(row_setup):
    # the arm without the overlap: DeepEP's network rate across 4 H100 nodes and the step around it (-1.9%)
    assert modelzoo_pair(row_setup, False) == pytest.approx(19.7, rel=0.04)


@pytest.mark.xfail(strict=True, reason=(
    "llmplan credits the EP overlap with DeepEP across 4 H100 nodes a 20% saving against the measured 10.7% (16.0 s "
    "against 17.6 s): the pair reads EP_OVERLAP_HIDDEN 0.40 against PR 5094's 0.74; no mechanism sourced yet "
    "(docs/validation.md#dsv3-h100-shares)"))
def test_modelzoo_deepep_pair_on_arm(row_setup):
    assert modelzoo_pair(row_setup, True) == pytest.approx(17.6, rel=0.04)
