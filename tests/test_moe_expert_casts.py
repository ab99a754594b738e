"""The routed experts' low-precision casts, on the k permuted rows of each token (docs/formulas.md#moe.expert_casts).

Derivation, read at the cited commits:
- NVIDIA/Megatron-LM d98e8a64dd megatron/core/transformer/moe/token_dispatcher.py: the alltoall dispatcher permutes
  the bf16 hidden states into one row per (token, expert) before the all-to-all (dispatch_preprocess:
  permute(hidden_states, routing_map, ...)), all-gathers them over the expert-TP group after it
  (dispatch_postprocess: gather_from_sequence_parallel_region); DeepEP dispatches bf16 tokens and permutes them
  after (_DeepepManager). experts.py TEGroupedMLP.forward hands that buffer to linear_fc1.
- NVIDIA/TransformerEngine d0067d0da6 transformer_engine/pytorch/module/grouped_linear.py: forward
  _split_quantize of all m_splits rows of the input (columnwise usage too when the weight needs a gradient),
  backward group_quantize of grad_output (rowwise for dgrad, columnwise for wgrad).
So per token and MoE layer over the step: forward fc1's input k·w and fc2's input k·f_e, backward fc2's output
gradient k·w and fc1's c·k·f_e (c = 2 for a GLU), each cast as a dense linear's input is.

The attention's output projection (linear_proj) casts its input, the core's output (a·d_v/t), once more under the
recipes these goldens run (MXFP8, fp8 current scaling, blockwise): Megatron-LM d98e8a64dd attention.py /
multi_latent_attention.py set_save_original_input(self.linear_proj) under fp8 with fp8_recipe != 'delayed' or fp4,
and TransformerEngine d0067d0da6 pytorch/module/linear.py then casts the input rowwise only in forward and
quantises the saved bf16 input again (columnwise) in backward: one more read of it (2 B an element) and, under
current scaling, one more amax read (2 B); the columnwise copy is written in backward instead of forward. The same
holds for a shared expert's linear_fc1 (moe/shared_experts.py, SharedExpertMLP.__init__, unless shared_experts is
recomputed): its h-wide input re-quantised in backward. docs/formulas.md#precision.save_original_input.
"""

from __future__ import annotations

import pytest

from llmplan.cost.quantize import CAST_BYTES, fp8_cast_bytes, quantize_bytes
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models

M = builtin_models()
S = 4096
MX = 2 + 2 * (1 + 1 / 32)  # an MXFP8 cast: read the bf16 input, write a rowwise and a columnwise copy (E8M0 per 32)


def qwen(**kw) -> ParallelPlan:
    base = {"tp": 1, "pp": 1, "dp": 16, "ep": 16, "seq_len": S, "micro_batch": 1, "global_batch": 1024,
            "dtype": "fp8", "recipe": "mxfp8", "expert_gemm": "per-expert"}
    return ParallelPlan(**{**base, **kw})


def per_token(m, p, hopper: bool = False) -> float:
    """Cast bytes per token of the layer's s·b over the step (fp8_cast_bytes charges a third per pass)."""
    return float(fp8_cast_bytes(m, p, True, hopper)) * 3 / (p.seq_len * p.micro_batch)


def test_qwen3_30b_a3b_counted_by_hand_at_tp1():
    # Qwen3-30B-A3B (config.json): h 2048, 32 query heads and 4 KV heads of 128, top-8 of 128 experts of 768, SwiGLU,
    # no shared expert. Attention: forward QKV input h and output-projection input 32·128; backward the output
    # projection's output gradient h and QKV's (32 + 2·4)·128. Routed: 2·8·2048 (fc1 input, fc2 output gradient)
    # + (1 + 2)·8·768 (fc2 input, fc1 output gradient).
    m = M["qwen3-30b-a3b"]
    attention = (2048 + 32 * 128) + (2048 + 40 * 128)
    routed = 2 * 8 * 2048 + 3 * 8 * 768
    assert attention + routed == 64512  # docs/validation.md#fp8-small-gemm's hand count; the old count: 43,008
    assert CAST_BYTES["mxfp8"] == pytest.approx(MX)
    # each element cast once (MX bytes); linear_proj's input, 32·128, read once more in backward (2 B, no amax pass)
    assert per_token(m, qwen()) == pytest.approx(64512 * MX + 2 * 32 * 128)


def test_hopper_current_scaling_bytes_by_hand():
    # The H100 FP8-CS rows' recipe: per-tensor fp8, current scaling. Every cast reads 2 bytes, writes the fp8 copy
    # (1) and, on Hopper, its transpose (1); every input but the QKV one (the fused norm's output) is read once more
    # for its amax (2). linear_proj's input (32·128) is cast rowwise in forward and again in backward for its
    # transpose: a second read (2) and a second amax read (2). Qwen3-30B-A3B at TP1, bytes a token and layer:
    m = M["qwen3-30b-a3b"]
    p = qwen(recipe="tensorwise", fp8_scaling="current")
    got = per_token(m, p, True)
    assert got == pytest.approx(4 * 64512 + 2 * (64512 - 2048) + (2 + 2) * 32 * 128)


def test_expert_tensor_parallel_forms():
    # TP2 with SP: the attention's h-wide tensors cast on the sequence shard, its heads split (32·128/2 and
    # (16 + 2·2)·128). Expert TP 1: the rank's experts get its k/t = 4 rows a token, whole f_e. Expert TP 2: the
    # bf16 rows all-gathered over the expert-TP group first, k·etp/t = 8 rows a token, f_e/2 wide. linear_proj
    # is row-parallel: its input, the rank's 16 heads (32·128/2), is re-read in backward where it lies (2 B).
    m = M["qwen3-30b-a3b"]
    attention = 2 * 2048 / 2 + 32 * 128 / 2 + 20 * 128
    proj = 2 * 32 * 128 / 2
    assert per_token(m, qwen(tp=2, sp=True, dp=8, etp=1)) == pytest.approx(
        (attention + 2 * 4 * 2048 + 3 * 4 * 768) * MX + proj)
    assert per_token(m, qwen(tp=2, sp=True, dp=8, etp=2)) == pytest.approx(
        (attention + 2 * 8 * 2048 + 3 * 8 * 384) * MX + proj)


def test_capacity_padding_casts_the_padded_rows():
    # Token drop with padding to capacity (Megatron --moe-pad-expert-input-to-capacity): the buffer the GroupedLinear
    # quantises holds capacity-factor times the routed rows (the attention's casts, linear_proj's included, alike).
    m = M["qwen3-30b-a3b"]
    routed = 2 * 8 * 2048 + 3 * 8 * 768
    assert per_token(m, qwen(moe_capacity_factor=1.25)) - per_token(m, qwen()) == pytest.approx(0.25 * routed * MX)


def test_fp8_dispatch_casts_one_row_per_token():
    # DeepSeek-V3 report §3.3.2: the activation before the up-projection and the gradient before the
    # down-projection are quantised before the dispatch, once per token; the weight gradient's 128x1 copy is made
    # from the k dispatched rows ("read out, dequantized, transposed, re-quantized", §3.5.2): read 1, write 1 on
    # Hopper. DeepSeek-V3: h 7168, top-8, blockwise (fp8 + an fp32 scale per 128: 2 + 1 + 4/128 a cast). Without
    # the fp8 dispatch the plan is Megatron-Core's on TE, whose blockwise linear_proj and shared-expert fc1 save
    # their bf16 inputs and re-read them in backward (2 B an element, no amax pass): the core's output, 128 heads of
    # v_head_dim 128, and the shared expert's h-wide input; DeepSeek-V3's own stack (ep_dispatch_fp8) sets no flag.
    m = M["deepseek-v3"]
    base = ParallelPlan(tp=1, pp=16, dp=128, ep=64, seq_len=S, micro_batch=1, global_batch=15360, dtype="fp8",
                        recipe="blockwise", moe_dispatcher="deepep")
    on = base.model_copy(update={"ep_dispatch_fp8": True})
    q = float(quantize_bytes(base))
    assert q == pytest.approx(2 + 1 + 4 / 128)
    per_token = (float(fp8_cast_bytes(m, base, True, True)) - float(fp8_cast_bytes(m, on, True, True))) * 3 / S
    share = base.low_precision_layer_fraction(m.num_hidden_layers)
    flagged = 2 * 128 * 128 + 2 * 7168
    assert per_token == pytest.approx(share * (2 * 7168 * (8 * (q + 1) - (q + 8 * 2)) + flagged))
