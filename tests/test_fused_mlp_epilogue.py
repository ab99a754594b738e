"""Transformer Engine's fused MXFP8 grouped MLP runs the experts' activation and the MXFP8 quantisation of its
output in its grouped GEMMs' epilogues (docs/formulas.md#moe.fused_mlp).

Forward, ForwardGroupedMLP_CuTeGEMMSwiGLU_MXFP8 calls cudnn-frontend's grouped_gemm_glu_wrapper_sm100 with
act_func "swiglu" (clamped: "geglu"), the router's probabilities (prob_tensor) and d_dtype float8_e4m3fn: it
returns fc1's output for backward (c_tensor, bf16) and fc2's input as MXFP8 rowwise and columnwise copies
(d_tensor, d_col_tensor), which fc2's grouped GEMM reads as they are. Backward,
BackwardGroupedMLP_CuTeGEMMDSwiGLU_MXFP8's grouped_gemm_dglu_wrapper_sm100 (act_func "dswiglu", generate_dbias
for fc1's bias) returns fc1's output gradient quantised (d_row_tensor, d_col_tensor). fc1's input and fc2's output
gradient are still quantised by tex.group_quantize. (NVIDIA/TransformerEngine transformer_engine/pytorch/ops/
fused/forward_grouped_mlp.py and backward_grouped_mlp.py at v2.16.) The fused path therefore spends neither the
activation's memory-bound pass nor the cast kernels of fc2's input and fc1's output gradient.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.compute import elementwise_bytes
from llmplan.cost.gemm import fused_grouped_mlp
from llmplan.cost.quantize import CAST_BYTES, fp8_cast_bytes
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models

MOE_MODELS = ("qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-120b", "deepseek-v4-flash",
              "nemotron-3-ultra", "nemotron-3-super", "mixtral-8x7b")


def _plan(**kw: object) -> ParallelPlan:
    base: dict[str, object] = {"dp": 8, "ep": 8, "seq_len": 4096, "micro_batch": 1, "global_batch": 64,
                               "dtype": "fp8", "recipe": "mxfp8"}
    base.update(kw)
    return ParallelPlan(**base)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(name=st.sampled_from(MOE_MODELS), tp=st.sampled_from([1, 2, 4]), etp=st.sampled_from([1, 2]),
       mb=st.integers(1, 4), seq=st.sampled_from([2048, 4096, 8192]), moe_act=st.booleans(),
       bf16_start=st.integers(0, 2), tp_impl=st.sampled_from(["megatron", "dtensor"]),
       clamp_fused=st.booleans(), recipe=st.sampled_from(["mxfp8", "blockwise"]))
def test_the_fused_grouped_mlp_never_costs_more_memory_bound_bytes(name, tp, etp, mb, seq, moe_act, bf16_start,
                                                                   tp_impl, clamp_fused, recipe):
    m = builtin_models()[name]
    kw: dict[str, object] = {"tp": tp, "sp": tp > 1, "etp": etp, "micro_batch": mb, "seq_len": seq,
                             "tp_impl": tp_impl, "bf16_layers_start": bf16_start, "glu_clamp_fusion": clamp_fused,
                             "recipe": recipe}
    if moe_act:
        kw.update(recompute="selective", recompute_modules=("moe_act",))
    fused, unfused = _plan(expert_gemm="grouped", **kw), _plan(expert_gemm="per-expert", **kw)
    on = bool(fused_grouped_mlp(m, fused))
    assert not fused_grouped_mlp(m, unfused)
    assert on == (recipe == "mxfp8" and tp_impl == "megatron" and etp == 1)
    after, before = elementwise_bytes(m, fused, True), elementwise_bytes(m, unfused, True)
    assert after <= before
    assert fp8_cast_bytes(m, fused, True) <= fp8_cast_bytes(m, unfused, True)
    if on:  # every layer but the bf16 ones (at most 2 of many) runs the fusion: strictly fewer bytes
        assert after < before
    else:  # off the fusion only TEGroupedMLP (per-expert) pads its rows for the fp8 GEMMs and unpads them
        # (docs/formulas.md#moe.quant_padding: 4 passes x 4 bytes on k rows of width w a token, a third charged)
        pad = 4 * 4 * m.num_experts_per_tok * m.expert_width / 3 * seq * mb / tp
        assert before - after == pytest.approx(pad, rel=1e-9)
    # the dense layers of the same model have no grouped MLP to fuse
    assert elementwise_bytes(m, fused, False) == pytest.approx(elementwise_bytes(m, unfused, False))


def test_a_glu_expert_saves_its_activation_pass_and_two_of_its_casts_by_hand():
    # Qwen3-30B-A3B, one rank, every layer MXFP8: per token k f_e = 8 x 768 routed FFN columns. Unfused, the
    # stage charges per column the SwiGLU's pass (read 2 bf16 halves, write 1: 6 bytes, forward-equivalent) and
    # fc2's input cast forward plus fc1's 2-wide output gradient cast backward ((1 + 2) casts over 3 passes: one
    # cast per pass), each read 2 bytes bf16, write a rowwise and a columnwise MXFP8 copy (1 + 1/32 each).
    m = builtin_models()["qwen3-30b-a3b"]
    fused, unfused = _plan(expert_gemm="grouped"), _plan(expert_gemm="per-expert")
    tokens, cols = 4096 * 1, 8 * 768
    mxfp8_cast = 2 + 2 * (1 + 1 / 32)
    assert CAST_BYTES["mxfp8"] == pytest.approx(mxfp8_cast)
    saved = elementwise_bytes(m, unfused, True) - elementwise_bytes(m, fused, True)
    assert saved == pytest.approx(tokens * cols * (6 + mxfp8_cast))
    cast_saved = fp8_cast_bytes(m, unfused, True) - fp8_cast_bytes(m, fused, True)
    assert cast_saved == pytest.approx(tokens * cols * mxfp8_cast)


def test_squared_relu_experts_save_one_wide_cast_each_way():
    # Nemotron-3 Ultra's squared-ReLU experts (ungated, TE >= 2.17's ScaledSReLU path): the activation reads f and
    # writes f (4 bytes a column) and fc1's output gradient is f wide, so two casts over the 3 passes
    m = builtin_models()["nemotron-3-ultra"]
    fused, unfused = _plan(expert_gemm="grouped"), _plan(expert_gemm="per-expert")
    assert fused_grouped_mlp(m, fused)
    cols = m.num_experts_per_tok * m.expert_ffn
    cast_saved = fp8_cast_bytes(m, unfused, True) - fp8_cast_bytes(m, fused, True)
    assert cast_saved == pytest.approx(4096 * cols * CAST_BYTES["mxfp8"] * 2 / 3)
    saved = elementwise_bytes(m, unfused, True) - elementwise_bytes(m, fused, True)
    assert saved == pytest.approx(4096 * cols * (4 + CAST_BYTES["mxfp8"] * 2 / 3))


def test_off_the_mxfp8_op_fuser_path_nothing_is_fused():
    m = builtin_models()["qwen3-30b-a3b"]
    assert fused_grouped_mlp(m, _plan())
    assert not fused_grouped_mlp(m, _plan(dtype="bf16", recipe="tensorwise"))  # the fusion is MXFP8 only
    assert not fused_grouped_mlp(m, _plan(recipe="blockwise"))
    assert not fused_grouped_mlp(m, _plan(fused_kernels=False))
    assert not fused_grouped_mlp(m, _plan(etp=2, tp=2, sp=True))  # _is_fused_impl_supported: no expert TP
    assert not fused_grouped_mlp(builtin_models()["llama-3.1-70b"], _plan())  # a dense model


def test_a_recomputed_moe_act_on_the_fused_path_drops_its_rerun_by_hand():
    # With moe_act recomputed, Megatron-Core's unfused TEGroupedMLP reruns bias_act_func's forward in backward
    # (CheckpointWithoutOutput): the fused SwiGLU's read 2f, write f again (6 bytes a row and column, a third of
    # it in the stage's forward-equivalent units). The fused MXFP8 path (_fused_forward at d98e8a6) checkpoints
    # nothing, so it drops that rerun beside the pass (6); the casts it drops are fp8_cast_bytes' (taken out here).
    m = builtin_models()["qwen3-30b-a3b"]
    act = {"recompute": "selective", "recompute_modules": ("moe_act",)}
    fused, unfused = _plan(expert_gemm="grouped", **act), _plan(expert_gemm="per-expert", **act)
    tokens, cols = 4096 * 1, 8 * 768
    fused_pass = 2 + 2 + 2
    saved = elementwise_bytes(m, unfused, True) - elementwise_bytes(m, fused, True)
    cast_saved = fp8_cast_bytes(m, unfused, True) - fp8_cast_bytes(m, fused, True)
    assert saved - cast_saved == pytest.approx(tokens * cols * (fused_pass + fused_pass / 3))
