"""The shared expert's linear_fc1 under Megatron-Core's save_original_input (docs/formulas.md#precision.save_original_input).

Derivation, read at the cited commits:
- NVIDIA/Megatron-LM d98e8a64dd megatron/core/transformer/moe/shared_experts.py, SharedExpertMLP.__init__: under fp8
  with fp8_recipe != 'delayed' (TE >= 2.6) or fp4 (TE >= 2.7), unless "shared_experts" is in recompute_modules,
  set_save_original_input(self.linear_fc1) ("the output of pre_mlp_layernorm is saved by router, and the shared
  expert linear_fc1 also saves the quantized tensor of this output"); linear_fc1 is TE's column-parallel linear
  (models/gpt/moe_module_specs.py, backend.column_parallel_linear()).
- NVIDIA/TransformerEngine d0067d0da6 pytorch/module/linear.py: with the flag the forward casts the input
  rowwise only (then all-gathers it under SP) and saves the bf16 input (the rank's sequence shard); backward
  quantises that shard again before gather_along_first_dim: columnwise only where the quantizer can gather
  columnwise data (MXFP8, blockwise, NVFP4), rowwise where it cannot (Float8Quantizer,
  Float8CurrentScalingQuantizer: supports_only_rowwise_all_gather), the transpose made after the gather as
  without the flag. So per element of the shard: one more read (2), under current scaling one more amax read
  (2), and for a gathered per-tensor input the rowwise byte written again (1); NVFP4 two one-usage casts, each
  an amax pass and a read (8 B), against the fused kernel's two reads (4) or the unfused kernels' three (6).
- Without the flag (fp8 delayed scaling) fc1 saves its fp8 copy of the shard (1 B an element) beside the
  router's bf16 input; with shared_experts recompute the checkpoint keeps neither.
DeepSeek-V3: h = 7168, one shared expert. Bytes a token of the layer's s·b, over the step, one MoE layer.
"""

from __future__ import annotations

from llmplan.cost.activations import layer_activation_parts
from llmplan.cost.quantize import save_original_input_cast_bytes
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models

M = builtin_models()
DSV3 = M["deepseek-v3"]
H = 7168


def plan(**kw) -> ParallelPlan:
    base = {"tp": 1, "pp": 1, "dp": 8, "ep": 8, "seq_len": 4096, "micro_batch": 1, "global_batch": 64,
            "dtype": "fp8", "recipe": "mxfp8"}
    return ParallelPlan(**{**base, **kw})


def moe_part(m, p, hopper: float = 0.0) -> float:
    """What an MoE layer adds to the flagged modules' casts (the attention's alike in both): here the shared fc1."""
    on_shard = 1 / p.tp if p.sp and p.tp > 1 else 1.0
    return float(save_original_input_cast_bytes(m, p, True, hopper, on_shard)) - \
        float(save_original_input_cast_bytes(m, p, False, hopper, on_shard))


def test_mxfp8_rereads_the_norm_output_once_more():
    assert moe_part(DSV3, plan()) == 2 * H
    assert moe_part(DSV3, plan(tp=2, sp=True, dp=4)) == 2 * H / 2  # the sequence shard, before the gather


def test_hopper_current_scaling():
    cs = {"recipe": "tensorwise", "fp8_scaling": "current"}
    assert moe_part(DSV3, plan(**cs), hopper=1.0) == (2 + 2) * H
    # gathered under SP: the backward cast writes the rowwise byte again (TE gathers per-tensor fp8 rowwise only)
    assert moe_part(DSV3, plan(tp=2, sp=True, dp=4, **cs), hopper=1.0) == (2 + 2 + 1) * H / 2


def test_nvfp4_fused_and_unfused_kernels():
    fp4 = {"dtype": "fp4", "recipe": "nvfp4"}
    assert moe_part(DSV3, plan(**fp4)) == (8 - 4) * H
    assert moe_part(DSV3, plan(**fp4, nvfp4_rht_cast_fusion=False)) == (8 - 6) * H


def test_no_flag_no_reread():
    assert moe_part(DSV3, plan(recipe="tensorwise", fp8_scaling="delayed")) == 0
    assert moe_part(DSV3, plan(tp_impl="dtensor")) == 0
    assert moe_part(DSV3, plan(dtype="bf16", recipe="tensorwise")) == 0
    assert moe_part(M["qwen3-30b-a3b"], plan()) == 0  # no shared expert
    # shared_experts recompute: no flag, but the checkpoint's rerun casts fc1's input again (priced alike)
    assert moe_part(DSV3, plan(recompute="selective", recompute_modules=("shared_experts",))) == 2 * H


def test_delayed_scaling_keeps_fc1s_fp8_copy_beside_the_routers_input():
    # TP2 SP, s 4096: the router's bf16 shard 2·4096·7168/2 B; under delayed scaling fc1's fp8 copy, 1 B more
    p = plan(tp=2, sp=True, dp=4, recipe="tensorwise", fp8_scaling="current")
    assert p.low_precision_layer_fraction(DSV3.num_hidden_layers) == 1
    router = 2 * 4096 * H / 2
    assert float(layer_activation_parts(DSV3, p, True).mlp_input) == router
    delayed = p.model_copy(update={"fp8_scaling": "delayed"})
    assert float(layer_activation_parts(DSV3, delayed, True).mlp_input) == router + 4096 * H / 2
    dropped = delayed.model_copy(update={"recompute": "selective", "recompute_modules": ("shared_experts",)})
    assert float(layer_activation_parts(DSV3, dropped, True).mlp_input) == router
