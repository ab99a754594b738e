"""What Transformer Engine's fused MXFP8 grouped MLP keeps for backward, and what moe_act recompute drops on it
(docs/formulas.md#mem.fused_mlp_saved).

TE v2.16 ForwardGroupedMLP_CuTeGEMMSwiGLU_MXFP8.fuser_forward (transformer_engine/pytorch/ops/fused/
forward_grouped_mlp.py at 4220403e, the 26.06 container's pin) saves fc1's input as MXFP8 (rowwise_data set to
None: the columnwise copy fc1's wgrad reads), fc1's output c_tensor (c_dtype bfloat16, 2 f_e wide for a GLU) and
the probabilities for the activation's backward, and fc2's input d_col_tensor (MXFP8 columnwise; the rowwise
d_tensor is dropped once fc2's GEMM has read it). v2.17.1 (ops/fused/grouped_mlp.py at 4329ff84, the 26.08 pin)
saves the same, except that a squared ReLU built with activation_recompute_in_mlp does not save fc2's input: the
dSReLU epilogue rebuilds it. Megatron-LM's fused branch (megatron/core/transformer/moe/experts.py at d98e8a6,
_make_fused_ops) has no CheckpointWithoutOutput and passes moe_act only as activation_recompute_in_mlp, so for a
GLU moe_act recompute drops nothing on the fused path.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.activations import layer_activation_bytes, layer_activation_parts, recomputed_module_bytes
from llmplan.cost.gemm import fused_grouped_mlp
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models

MXFP8 = 1 + 1 / 32  # one E4M3 byte and an E8M0 scale per 32 elements (OCP Microscaling spec v1.0)
GLU_MODELS = ("qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-120b", "deepseek-v4-flash",
              "mixtral-8x7b")


def _plan(**kw: object) -> ParallelPlan:
    base: dict[str, object] = {"dp": 8, "ep": 8, "seq_len": 4096, "micro_batch": 1, "global_batch": 64,
                               "dtype": "fp8", "recipe": "mxfp8", "expert_gemm": "grouped"}
    base.update(kw)
    return ParallelPlan(**base)  # type: ignore[arg-type]


MOE_ACT = {"recompute": "selective", "recompute_modules": ("moe_act",)}


def test_the_fused_glu_experts_saved_tensors_by_hand():
    # Qwen3-30B-A3B (h 2,048, 128 experts, k 8, f_e 768, no shared expert), one rank, T = 4,096 tokens, every layer
    # MXFP8. Per (token, expert) row the fused op keeps fc1's input columnwise (h MXFP8), fc1's bf16 output
    # (2 f_e x 2 bytes), fc2's input columnwise (f_e MXFP8); per token the router's fp32 probabilities (E x 4)
    # and, Qwen3 training with the aux loss, the loss's saved fp32 scores (E x 4, docs/formulas.md#mem.aux_loss_scores).
    m = builtin_models()["qwen3-30b-a3b"]
    plan = _plan()
    assert fused_grouped_mlp(m, plan)
    tokens = 4096
    rows = tokens * 8
    hand = rows * (2048 * MXFP8 + 2 * 768 * 2 + 768 * MXFP8) + tokens * 128 * 4 + tokens * 128 * 4
    assert float(layer_activation_parts(m, plan, True).mlp) == pytest.approx(hand)
    # moe_act recompute drops none of it on the fused path ...
    fused = _plan(**MOE_ACT)
    assert float(recomputed_module_bytes(m, fused, True, layer_activation_parts(m, fused, True))) == 0.0
    assert float(layer_activation_bytes(m, fused, True)) == pytest.approx(float(layer_activation_bytes(m, plan, True)))
    # ... while the unfused grouped MLP (per-expert GEMMs) drops fc2's saved MXFP8 input, f_e per row
    unfused = _plan(expert_gemm="per-expert", **MOE_ACT)
    assert not fused_grouped_mlp(m, unfused)
    dropped = recomputed_module_bytes(m, unfused, True, layer_activation_parts(m, unfused, True))
    assert float(dropped) == pytest.approx(rows * 768 * MXFP8)


def test_the_fused_squared_relu_rebuilds_fc2s_input_in_its_dsrelu_epilogue():
    # Nemotron-3 Ultra's squared-ReLU experts on TE v2.17.1: with moe_act (activation_recompute_in_mlp) fc2's MXFP8
    # input is not saved, f_e per row; the fused path keeps the same credit as the unfused one.
    m = builtin_models()["nemotron-3-ultra"]
    fused = _plan(**MOE_ACT)
    assert fused_grouped_mlp(m, fused) and not m.gated_mlp
    rows = 4096 * m.num_experts_per_tok
    dropped = recomputed_module_bytes(m, fused, True, layer_activation_parts(m, fused, True))
    assert float(dropped) == pytest.approx(rows * m.expert_ffn * MXFP8)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(name=st.sampled_from(GLU_MODELS), tp=st.sampled_from([1, 2, 4]), mb=st.integers(1, 4),
       seq=st.sampled_from([2048, 4096, 8192]), bf16_start=st.integers(0, 2), clamp_fused=st.booleans(),
       layernorm=st.booleans())
def test_moe_act_recompute_never_lowers_memory_on_the_fused_glu_path(name, tp, mb, seq, bf16_start, clamp_fused,
                                                                     layernorm):
    m = builtin_models()[name]
    kw: dict[str, object] = {"tp": tp, "sp": tp > 1, "etp": 1, "micro_batch": mb, "seq_len": seq,
                             "bf16_layers_start": bf16_start, "glu_clamp_fusion": clamp_fused}
    others = ("layernorm",) if layernorm else ()
    without = _plan(**kw, recompute="selective", recompute_modules=others or ("core_attn",))
    with_act = _plan(**kw, recompute="selective", recompute_modules=(*others, "moe_act"))
    unfused = _plan(**{**kw, "expert_gemm": "per-expert"}, recompute="selective",
                    recompute_modules=(*others, "moe_act"))
    assert fused_grouped_mlp(m, with_act)
    kept, base = layer_activation_bytes(m, with_act, True), layer_activation_bytes(m, without, True)
    # the fused path never credits moe_act more than the unfused one does
    assert float(kept) >= float(layer_activation_bytes(m, unfused, True)) - 1e-6 * float(kept)
    if bf16_start == 0:  # every layer fused: moe_act recompute lowers nothing
        assert float(kept) == pytest.approx(float(base))
    else:  # only the bf16 layers (unfused) drop their activation output
        assert float(kept) <= float(base)
