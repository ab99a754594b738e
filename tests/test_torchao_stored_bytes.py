"""torchao fp8_params keeps the high-precision weight (pytorch/ao@36027d82d1 torchao/float8/fsdp_utils.py
WeightWithDynamicFloat8CastTensor wraps the original tensor and casts it to fp8 only to all-gather it), so the
optimizer step writes and a checkpoint holds the stored 2 B weight, as the ZeRO-3 shard (docs/formulas.md#mem.torchao_fp8_shard,
cost.model_states.stored_weight_bytes; docs/validation.md#small-leftovers). Expected values are written out by hand:
mixed-precision Adam stores a 4 B fp32 master and two 4 B moments (optimizer_bytes 12); the plan's gradients are fp32
(grad_bytes 4, its default)."""

from __future__ import annotations

import pytest

from llmplan.cost.compute import optimizer_step_seconds
from llmplan.cost.goodput import checkpoint_bytes_per_param
from llmplan.cost.params import RankParams
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_systems

H100 = builtin_systems()["dgx-h100"].gpu
PARAMS = 8_030_261_248  # meta-llama/Llama-3.1-8B: 8.03B parameters (model card / safetensors index)
KEPT = 1_050_677_248  # any count of bf16-kept parameters (embedding + output layer of Llama 3.1 8B: 2 x 128256 x 4096)


def plan(**kw) -> ParallelPlan:
    """torchtitan's Llama 3.1 8B fp8 plan: FSDP over 8 ranks, torchao tensorwise, float8 all-gather."""
    base = {"tp": 1, "pp": 1, "dp": 8, "zero": 3, "seq_len": 8192, "micro_batch": 1, "global_batch": 32,
            "dtype": "fp8", "recipe": "tensorwise", "fp8_scaling": "current", "tp_impl": "dtensor",
            "flash_attention": True, "fp8_params": True}
    return ParallelPlan(**{**base, **kw})


def test_the_optimizer_writes_the_stored_bf16_weight_under_torchao_fp8_params():
    """By hand: (2 x 12 + 4 x 4 + 2) = 42 B per parameter of the 1/8 shard, no kept-part extra (every stored
    weight is bf16 already); before, 41 B plus 1 B per kept parameter. The same with fp8_params off."""
    p = plan()
    assert (p.optimizer_bytes, p.grad_bytes) == (12, 4)
    by_hand = PARAMS / 8 * 42 / H100.hbm_achieved_bytes_per_s
    kept = RankParams(dense=KEPT, expert=0.0)
    assert optimizer_step_seconds(PARAMS, p, H100, 0.0, kept) == pytest.approx(by_hand, rel=1e-12)
    assert optimizer_step_seconds(PARAMS, plan(fp8_params=False), H100, 0.0, kept) == pytest.approx(by_hand, rel=1e-12)


def test_the_megatron_stack_still_writes_fp8_weights_and_bf16_kept_parts():
    """Megatron's fp8_params (tp_impl megatron, Transformer Engine) stores fp8 weights: 2 x 12 + 4 x 4 + 1 = 41 B
    per parameter, the kept ones 1 B more."""
    p = plan(tp_impl="megatron", zero=1)
    kept = RankParams(dense=KEPT, expert=0.0)
    by_hand = (PARAMS / 8 * 41 + KEPT / 8 * 1) / H100.hbm_achieved_bytes_per_s
    assert optimizer_step_seconds(PARAMS, p, H100, 0.0, kept) == pytest.approx(by_hand, rel=1e-12)


def test_a_checkpoint_holds_the_stored_bf16_weight_under_torchao_fp8_params():
    """Without FSDP's fp32 shards as the master: 2 + 12 = 14 B a parameter (was 1 + 12); with them, 12."""
    assert checkpoint_bytes_per_param(plan()) == 14
    assert checkpoint_bytes_per_param(plan(tp_impl="megatron", zero=1)) == 13
    assert checkpoint_bytes_per_param(plan(fp32_param_shards=True)) == 12
