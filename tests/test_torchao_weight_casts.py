"""torchao's Float8Linear casts its weights in every micro-batch (docs/formulas.md#precision.torchao_weight_casts).

Derivation, read at pytorch/ao@36027d82d1:
- torchao/float8/float8_linear.py, matmul_with_hp_or_float8_args: forward casts weight_hp_t (a view of the bf16
  parameter) with hp_tensor_to_float8_dynamic (cast_config_weight); backward casts it again for the grad_input mm
  (cast_config_weight_for_grad_input); neither when tensor_already_casted_to_fp8(weight_hp_t). Float8Linear keeps
  no fp8 weight between calls, so both casts run in every micro-batch.
- fsdp_utils.py, WeightWithDynamicFloat8CastTensor: with enable_fsdp_float8_all_gather the shard is cast before
  FSDP's all-gather (fsdp_pre_all_gather) and fsdp_post_all_gather hands the linear a Float8TrainingTensor: the
  linear casts nothing.
- A cast compiled: the amax pass reads the bf16 weight (2 B), the cast reads it (2 B) and writes fp8 (1 B): 5 B an
  element, twice a micro-batch. Eager: tensor_to_amax (abs 2 + 2, max 2), the cast's float32 ops (2 + 4, 4 + 4,
  4 + 4, 4 + 1) = 33 B; backward's operand (the weight, row-major) copied column-major by preprocess_addmm
  (float8_ops.py: b_data.t().contiguous().t(), 1 + 1): 35 B.
Llama 3.1 8B: h 4096, 32 heads of 128, 8 KV heads, SwiGLU f 14336, 32 layers. One layer's linears at tp 1:
wq 4096·4096 + wk 4096·1024 + wv 4096·1024 + wo 4096·4096 = 41,943,040; w1 + w3 + w2 3·4096·14336 =
176,160,768; together 218,103,808 weights.
"""

from __future__ import annotations

import numpy as np
import pytest
from agreement import assert_arrays_agree

from llmplan.cost import kernels as K
from llmplan.cost.quantize import fp8_cast_bytes, torchao_weight_cast_bytes
from llmplan.search.grid import Workload, default_space, enumerate_plans
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

L8 = builtin_models()["llama-3.1-8b"]
WEIGHTS = 4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096 + 3 * 4096 * 14336
LAYERS, MICRO_BATCHES = 32, 4


def plan(**kw) -> ParallelPlan:
    """torchtitan's Llama 3.1 8B fp8 plan (FSDP over 8, torchao tensorwise, compiled), 4 micro-batches a step."""
    base = {"tp": 1, "pp": 1, "dp": 8, "zero": 3, "seq_len": 8192, "micro_batch": 1, "global_batch": 32,
            "dtype": "fp8", "recipe": "tensorwise", "fp8_scaling": "current", "tp_impl": "dtensor",
            "flash_attention": True}
    return ParallelPlan(**{**base, **kw})


def test_weights_of_one_layer_by_hand():
    assert WEIGHTS == 218_103_808


@pytest.mark.parametrize(("fused", "per_element"), [(True, 5 + 5), (False, 33 + 35)])
def test_step_weight_cast_bytes_by_hand(fused, per_element):
    """Weights x micro-batches x bytes per element: 218,103,808 x 32 layers x 4 micro-batches x 10 B compiled
    (279,172,874,240 B a step), x 68 B eager."""
    p = plan(fused_kernels=fused)
    assert p.num_microbatches == MICRO_BATCHES
    step = torchao_weight_cast_bytes(L8, p, False) * LAYERS * p.num_microbatches
    assert step == WEIGHTS * LAYERS * MICRO_BATCHES * per_element
    if fused:
        assert step == 279_172_874_240
    # fp8_cast_bytes carries them per micro-batch in its per-pass units (÷ 3); FSDP's float8 all-gather removes them
    with_casts, gathered_fp8 = fp8_cast_bytes(L8, p, False, True), fp8_cast_bytes(L8, p.model_copy(
        update={"fp8_params": True}), False, True)
    assert (with_casts - gathered_fp8) * 3 == pytest.approx(WEIGHTS * per_element)


def test_rowwise_and_tp_shards():
    """Rowwise casts the same bytes (an amax per row or column instead of one); at tp 2 each rank casts its shard:
    wq / wo / w1 / w2 / w3 halved, 4 KV heads of wk / wv."""
    assert torchao_weight_cast_bytes(L8, plan(recipe="rowwise"), False) == 10 * WEIGHTS
    tp2 = (2 * 4096 * 4096 + 3 * 4096 * 14336) / 2 + 2 * 4096 * 128 * 4
    assert torchao_weight_cast_bytes(L8, plan(tp=2, sp=True, dp=4), False) == 10 * tp2


def test_transformer_engine_and_bf16_unchanged():
    """Transformer Engine's weight casts stay once a step (not in fp8_cast_bytes); bf16 has none."""
    assert torchao_weight_cast_bytes(L8, plan(tp_impl="megatron"), False) == 0
    assert torchao_weight_cast_bytes(L8, plan(dtype="bf16"), False) == 0
    assert torchao_weight_cast_bytes(L8, plan(fp8_params=True), False) == 0


def test_weight_cast_launches_every_micro_batch():
    """Per micro-batch, current scaling (3 kernels a cast as counted for Transformer Engine), attention's 4
    Float8Linears and the MLP's 3 each cast once forward and once backward; Transformer Engine's fused QKV and
    projection weights twice a step (0.5 a micro-batch each over 4), forward only."""
    def weight_part(p: ParallelPlan, kernels) -> tuple[float, float]:
        a, b = kernels(p), kernels(p.model_copy(update={"fp8_params": True}))
        return a[0] - b[0], a[1] - b[1]

    def attn(p: ParallelPlan) -> tuple[float, float]:
        return tuple(K.attention_kernels(L8, p))

    def mlp(p: ParallelPlan) -> tuple[float, float]:
        layer, a = K.layer_kernels(L8, p, "attention", "dense"), K.attention_kernels(L8, p)
        return layer[0] - a[0], layer[1] - a[1]
    assert weight_part(plan(), attn) == pytest.approx((4 * 3, 4 * 3))
    assert weight_part(plan(), mlp) == pytest.approx((3 * 3, 3 * 3))
    assert weight_part(plan(tp_impl="megatron"), attn) == pytest.approx((2 * 3 / MICRO_BATCHES, 0))


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_the_search_prices_the_weight_casts_as_the_scalar_estimate(recipe):
    """Plan arrays (tp, micro-batch and so the micro-batch count varying) price each plan's step as the scalar
    estimate does."""
    cluster = ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=2)
    w = Workload(global_batch=64, seq_len=4096, dtype="fp8", recipe=recipe, fp8_scaling="current", tp_impl="dtensor")
    plans = enumerate_plans(default_space(L8, cluster, w), cluster, w)
    order = np.random.default_rng(11).permutation(len(plans))
    idx = [int(i) for i in order[:200] if not check_plan(L8, plans.plan(int(i)), cluster)][:6]
    assert len({int(plans.plan(i).num_microbatches) for i in idx}) > 1
    assert_arrays_agree(L8, cluster, plans, idx)
