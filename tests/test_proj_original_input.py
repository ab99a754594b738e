"""Megatron-Core's save_original_input on the attention output projection (linear_proj) under fp8 non-delayed / fp4
(docs/formulas.md#precision.save_original_input).

Derivation, read at the cited commits:
- NVIDIA/Megatron-LM d98e8a64dd megatron/core/transformer/attention.py and multi_latent_attention.py: with
  fp8 and fp8_recipe != 'delayed' (TE >= 2.6) or fp4 (TE >= 2.7), set_save_original_input(self.linear_proj),
  "the output of the fused core_attn is saved by itself, and linear_proj also saves the quantized tensor of
  this output"; with the flag linear_proj keeps that bf16 output instead.
- NVIDIA/TransformerEngine d0067d0da6 pytorch/module/linear.py: with the flag the forward cast is rowwise only,
  the bf16 input is saved, and backward quantises it again (columnwise) for the wgrad: one more read of the
  input (2 B an element) and under current scaling one more amax read (2 B).
Llama 3.1 70B (a = 64 heads, d = 128), TP 4, SP, s = 8192, b = 1, fp8 per-tensor current scaling:
- kept for linear_proj's input: the core's output once, 2 B an element: 2·8192·64·128/4 = 33,554,432 B a layer
  (llmplan priced the fp8 copy alone before: 1 B an element, 16,777,216 B);
- backward re-quantisation: (2 + 2) B per element of a·d/t = 2,048 elements a token: 8,192 B a token over the step.
Delayed scaling (TE refuses the flag there): linear_proj saves its fp8 cast (1 B an element, 16,777,216 B) and
the fused core keeps its own bf16 output beside it for its backward (TransformerEngine d0067d0da6
pytorch/attention/dot_product_attention/backends.py, FusedAttnFunc.forward: f16_tensors = (q, k, v, out_f16)
saved; Megatron's comment above says both are saved): 2 + 1 B an element, 50,331,648 B a layer; 1 B where the
core keeps no output (core_attn recompute, an unfused core). torchao's Float8Linear (docs/formulas.md#precision.
torchao_saved_input; pytorch/ao@36027d82d1 float8_linear.py, float8_tensor_parallel.py): per-tensor at TP 4
(float8 TP casts wo's input before the function, which saves that fp8 copy) 1 B beside the core's bf16 output,
3 B an element; rowwise (plain DTensor TP) saves the core's bf16 output itself, 2 B.
"""

from __future__ import annotations

import pytest

from llmplan.cost.activations import layer_activation_parts
from llmplan.cost.quantize import fp8_cast_bytes, save_original_input_cast_bytes
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models

M = builtin_models()["llama-3.1-70b"]
S = 8192


def plan(**kw) -> ParallelPlan:
    base = {"tp": 4, "sp": True, "pp": 1, "dp": 1, "seq_len": S, "micro_batch": 1, "global_batch": 64,
            "dtype": "fp8", "recipe": "tensorwise", "fp8_scaling": "current"}
    return ParallelPlan(**{**base, **kw})


def test_megatron_current_scaling_keeps_the_core_output_once_in_bf16():
    assert float(layer_activation_parts(M, plan(), False).attn_out) == 33_554_432


def test_delayed_scaling_keeps_the_core_output_and_the_fp8_copy():
    # 2·8192·64·128/4 B of bf16 output (the fused core's) + 8192·64·128/4 B of fp8 cast (linear_proj's)
    assert float(layer_activation_parts(M, plan(fp8_scaling="delayed"), False).attn_out) == 33_554_432 + 16_777_216
    # the core keeps no output of its own: core_attn recompute discards it, an unfused core saves scores and V
    dropped = plan(fp8_scaling="delayed", recompute="selective", recompute_modules=("core_attn",))
    assert float(layer_activation_parts(M, dropped, False).attn_out) == 16_777_216
    unfused = plan(fp8_scaling="delayed", flash_attention=False)
    assert float(layer_activation_parts(M, unfused, False).attn_out) == 16_777_216


def test_torchao_keeps_its_fp8_copy_beside_the_core_output_or_the_bf16_output_alone():
    assert float(layer_activation_parts(M, plan(tp_impl="dtensor"), False).attn_out) == 33_554_432 + 16_777_216
    assert float(layer_activation_parts(M, plan(recipe="rowwise"), False).attn_out) == 33_554_432


def test_only_attn_out_moves_against_delayed():
    # delayed and current scaling differ here only by what linear_proj and the core keep: nothing counted twice
    cur, dly = layer_activation_parts(M, plan(), False), layer_activation_parts(M, plan(fp8_scaling="delayed"), False)
    assert float(cur.total) - float(dly.total) == 33_554_432 - (33_554_432 + 16_777_216)


def test_backward_requantises_linear_projs_input(monkeypatch):
    assert float(save_original_input_cast_bytes(M, plan(), False, 0.0, 1 / 4)) == 8_192
    assert float(save_original_input_cast_bytes(M, plan(fp8_scaling="delayed"), False, 0.0, 1 / 4)) == 0
    assert float(save_original_input_cast_bytes(M, plan(tp_impl="dtensor"), False, 0.0, 1 / 4)) == 0
    # fp8_cast_bytes carries it: a third per pass, times s·b (Hopper; the transposed byte only moves to backward)
    import llmplan.cost.quantize as q
    with_flag = float(fp8_cast_bytes(M, plan(), False, True))
    monkeypatch.setattr(q, "proj_saves_original_input", lambda p: 0.0)
    assert with_flag - float(fp8_cast_bytes(M, plan(), False, True)) == pytest.approx(8_192 * S / 3, rel=1e-9)
