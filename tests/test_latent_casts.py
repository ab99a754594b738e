"""A latent MoE's two projections quantise their GEMM inputs like any Transformer Engine Linear.

Architecture: NVIDIA/Megatron-LM megatron/core/transformer/moe/moe_layer.py at d98e8a6 (fc1_latent_proj h -> l and
fc2_latent_proj l -> h are TELinear, parallel_mode "duplicated", on the rank's sequence shard);
NVIDIA/TransformerEngine transformer_engine/pytorch/module/linear.py (the input quantised in forward, the output
gradient in backward). Nemotron-3 Super: h = 4096, l = 1024 (nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16
config.json). docs/formulas.md#moe.latent_casts.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.quantize import fp8_cast_bytes, quantize_bytes
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models

# The four tensors the two projections quantise per token over a step, read off the module shapes above:
# forward fc1_latent_proj's input (h) and fc2_latent_proj's input (l); backward their output gradients (l, h).
SUPER_LATENT_ELEMENTS = 4096 + 1024 + 1024 + 4096


def _super() -> ModelSpec:
    return builtin_models()["nemotron-3-super"]


def _extra(m: ModelSpec, plan: ParallelPlan) -> float:
    """fp8_cast_bytes of an MoE layer less the same model's without the latent width, less the routed experts'
    change of width: their fc1 input (forward) and fc2 output gradient (backward) are l wide, not h, on the k
    permuted rows of each token (k·etp/t rows on the rank under SP: k at etp = tp; docs/formulas.md#moe.expert_casts),
    so that what is left is the two projections' own casts."""
    full = m.model_copy(update={"moe_latent_size": None})
    rows = m.num_experts_per_tok * plan.etp_resolved / (plan.tp if plan.sp else 1)
    share = plan.low_precision_layer_fraction(m.num_hidden_layers) if plan.low_precision else 0.0
    routed = float(quantize_bytes(plan)) * share * plan.seq_len * plan.micro_batch * 2 * rows \
        * (m.expert_width - m.hidden_size) / 3
    return float(fp8_cast_bytes(m, plan, True) - fp8_cast_bytes(full, plan, True)) - routed


def test_the_projections_cast_their_four_tensors_on_the_sequence_shard():
    plan = ParallelPlan(tp=2, sp=True, dp=32, ep=64, global_batch=512, seq_len=8192, dtype="fp8", recipe="mxfp8")
    tokens_on_shard = 8192 / 2
    # fp8_cast_bytes is per pass (the step over its three passes)
    expected = float(quantize_bytes(plan)) * tokens_on_shard * SUPER_LATENT_ELEMENTS / 3
    assert _extra(_super(), plan) == pytest.approx(expected, rel=1e-9)


def test_none_in_bf16_or_where_the_plan_keeps_the_projections_in_bf16():
    bf16 = ParallelPlan(tp=2, sp=True, dp=32, ep=64, global_batch=512, seq_len=8192)
    kept = ParallelPlan(tp=2, sp=True, dp=32, ep=64, global_batch=512, seq_len=8192, dtype="fp4", recipe="nvfp4",
                        bf16_modules=("attention", "latent_proj"))
    assert _extra(_super(), bf16) == 0.0
    assert _extra(_super(), kept) == pytest.approx(0.0, abs=1e-3)  # bytes; float rounding of two ~1e9 terms


@settings(max_examples=25, derandomize=True, deadline=None)
@given(tp=st.sampled_from([1, 2, 4]), mbs=st.sampled_from([1, 2]), recipe=st.sampled_from(["mxfp8", "blockwise"]))
def test_the_cast_grows_with_the_shard_tokens_and_never_reaches_a_full_width_moe(tp: int, mbs: int, recipe: str):
    plan = ParallelPlan(tp=tp, sp=tp > 1, dp=8, ep=8, micro_batch=mbs, global_batch=64 * mbs, seq_len=4096,
                        dtype="fp8", recipe=recipe)
    extra = _extra(_super(), plan)
    assert extra == pytest.approx(float(quantize_bytes(plan)) * 4096 * mbs / tp * SUPER_LATENT_ELEMENTS / 3)
    nano = builtin_models()["nemotron-3-nano"]  # no latent width: nothing added
    assert nano.moe_latent_size is None and _extra(nano, plan) == 0.0
