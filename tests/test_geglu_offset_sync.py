"""The blocking copy in Megatron-Core's weighted quick-GeGLU (GPT-OSS's experts): every call builds its linear offset
with torch.tensor(linear_offset, device=input.device) (megatron/core/fusions/fused_bias_geglu.py,
weighted_bias_quick_geglu_impl, core_v0.15.0 - d98e8a6), a host-to-device copy PyTorch makes with
cudaMemcpyAsync then cudaStreamSynchronize (aten/src/ATen/native/cuda/Copy.cu, copy_kernel_cuda with
non_blocking False). Counted by hand: one wait per call, calls = forward + moe_act rerun + full recompute."""

from __future__ import annotations

import pytest

from llmplan.cost.moe import EAGER_OP_HOST_S, HOST_SYNC_S
from llmplan.cost.overhead import geglu_offset_calls, geglu_offset_sync_seconds
from llmplan.estimate import estimate_training
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M, S = builtin_models(), builtin_systems()
OSS = M["gpt-oss-120b"]
H100 = S["dgx-h100"]


def plan(**kw) -> ParallelPlan:
    base = dict(pp=4, ep=8, dp=16, micro_batch=1, global_batch=1280, seq_len=4096, recompute="selective",
                recompute_modules=("layernorm", "moe_act"))
    return ParallelPlan(**{**base, **kw})


def test_calls_per_layer_counted_from_the_code_path():
    # forward once; CheckpointWithoutOutput reruns bias_act_func before fc2's backward under moe_act recompute
    assert geglu_offset_calls(OSS, plan()) == 2.0
    assert geglu_offset_calls(OSS, plan(recompute="none", recompute_modules=())) == 1.0
    # full recompute repeats the whole forward (share r of the stage's layers)
    assert geglu_offset_calls(OSS, plan(recompute="full", recompute_modules=()), r=1.0) == 2.0


def test_only_megatrons_quick_geglu_pays_it():
    # SwiGLU (weighted_bias_swiglu_impl) has no such copy, clamp or not (DeepSeek-V4 Flash clamps its SwiGLU)
    assert geglu_offset_calls(M["qwen3-30b-a3b"], plan()) == 0.0
    assert geglu_offset_calls(M["deepseek-v4-flash"], plan()) == 0.0
    # Transformer Engine's grouped MLP ops run the activation (op fuser; AutoModel's fused clamp)
    assert geglu_offset_calls(OSS, plan(glu_clamp_fusion=True)) == 0.0
    # a full-iteration CUDA graph could not capture a synchronising copy
    assert geglu_offset_calls(OSS, plan(cuda_graphs="full-iteration")) == 0.0


def test_seconds_by_hand_on_the_h100_row_layout():
    p = plan()
    n_mb = 1280 // 16  # global batch over data-parallel replicas at micro-batch 1
    layers = 36 // 4  # MoE layers of a stage
    waits = n_mb * layers * 2
    assert float(geglu_offset_sync_seconds(OSS, p, layers)) == pytest.approx(waits * (HOST_SYNC_S + EAGER_OP_HOST_S))
    # a slower host CPU issues the next op slower; the wake-up is not scaled
    assert float(geglu_offset_sync_seconds(OSS, p, layers, host_factor=2.75)) == pytest.approx(
        waits * (HOST_SYNC_S + 2.75 * EAGER_OP_HOST_S))


def test_it_reaches_the_step_as_its_own_overhead():
    p = plan()
    e = estimate_training(OSS, ClusterSpec(system=H100, num_nodes=8), p)
    got = float(e.time.overheads["geglu_offset_sync"])
    assert got == pytest.approx(80 * 9 * 2 * (HOST_SYNC_S + EAGER_OP_HOST_S * H100.gpu.host_op_factor))
    fused = estimate_training(OSS, ClusterSpec(system=H100, num_nodes=8), plan(glu_clamp_fusion=True))
    assert float(fused.time.overheads["geglu_offset_sync"]) == 0.0
