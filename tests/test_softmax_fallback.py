"""Megatron's fused causal softmax falls back to PyTorch ops where its kernel does not take the scores (stop 65 #7):
priced as the fp32 torch chain (EAGER_FP32_SOFTMAX_BYTES, its launches, its saved fp32 output), not as the fused
kernel, past 4,096 keys or where b x heads/tp is off the kernel's rows (a multiple of 4 and of its rows per
block; held back at stop 65, docs/validation.md#export-mtp, applied since tidy-68).

The rule is replayed here from the source, not from llmplan: NVIDIA/Megatron-LM@d98e8a64dd
megatron/core/fusions/fused_softmax.py FusedScaleMaskSoftmax.is_kernel_available (16 < sk <= 4096, sq % 4 == 0,
sk % 4 == 0, b*np % 4 == 0, b*np % batch_per_block == 0 on the causal path) and get_batch_per_block as
megatron/fused_kernels/scaled_masked_softmax.h@7a77abd9b6 computes it (128 threads, warps of
min(next_pow2(sk), 32) lanes, 2 rows a warp while next_pow2(sk) <= 128); forward_torch_softmax with
softmax_in_fp32 (TransformerConfig.attention_softmax_in_fp32 defaults to True) casts to fp32, scales, masks,
softmaxes (autograd keeps the fp32 result for _softmax_backward_data) and casts back.

Saved bytes per score, by hand from megatron/core/transformer/dot_product_attention.py@d98e8a64dd (probs =
attention_dropout(scale_mask_softmax(scores)); bmm(probs, V)) and PyTorch's derivatives.yaml (_softmax keeps
its result, native_dropout its bool mask, bmm its inputs, casts nothing): fused, no dropout: the 16-bit
probabilities (2); fused with dropout: those (the kernel's backward), the mask (1) and the dropout output the
bmm keeps (2) = 5; fallback, no dropout: the fp32 softmax output (4) and its 16-bit cast the bmm keeps (2) = 6;
fallback with dropout: 4 + 1 + 2 = 7, the 16-bit cast kept by nothing.

llmplan applies the whole check, lengths and row counts (b*np), as it applies Transformer Engine's
(tests/test_te_softmax.py)."""

from __future__ import annotations

import pytest

from llmplan.cost.activations import layer_activation_parts
from llmplan.cost.elementwise import (
    CAUSAL_SOFTMAX_BYTES,
    EAGER_FP32_SOFTMAX_BYTES,
    EAGER_FP32_SOFTMAX_KERNELS,
    EAGER_SOFTMAX_BYTES,
    softmax_bytes,
    softmax_launches,
)
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan


def rows_fit(b: int, np_: int, s: int) -> bool:
    """is_kernel_available's row counts on the causal path."""
    pow2 = 1 << (s - 1).bit_length()
    warp = min(pow2, 32)
    per_block = (128 // warp) * (2 if pow2 <= 128 else 1)
    rows = b * np_
    return rows % 4 == 0 and rows % per_block == 0


def kernel_available(b: int, np_: int, s: int) -> bool:
    """is_kernel_available on the causal path, sq = sk = s: its lengths and its row counts."""
    return 16 < s <= 4096 and s % 4 == 0 and rows_fit(b, np_, s)


def model(heads: int, dropout: float = 0.0) -> ModelSpec:
    return ModelSpec(name="tiny", hidden_size=64 * heads, num_attention_heads=heads, num_key_value_heads=heads,
                     intermediate_size=512, num_hidden_layers=2, vocab_size=1000, max_position_embeddings=65536,
                     attention_dropout=dropout)


# saved bytes per score (module docstring): {(fallback, attention dropout): bytes}
SAVED = {(False, False): 2, (False, True): 5, (True, False): 6, (True, True): 7}


CASES = [  # (heads, tp, micro-batch, seq): the limit, the rows, the short-row blocks
    (32, 8, 1, 4096), (32, 8, 1, 4100), (32, 8, 1, 8192), (32, 8, 1, 32768),
    (48, 8, 1, 2048), (48, 8, 2, 2048), (80, 8, 1, 2048), (80, 8, 2, 2048),
    (32, 8, 1, 128), (32, 4, 1, 128), (32, 4, 2, 128), (16, 1, 1, 16)]


@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("heads,tp,mb,s", CASES)
def test_fused_softmax_is_priced_only_where_megatrons_kernel_takes_the_scores(heads, tp, mb, s, dropout):
    m, plan = model(heads, dropout), ParallelPlan(seq_len=s, micro_batch=mb, tp=tp, flash_attention=False)
    fused = kernel_available(mb, heads // tp, s)
    assert softmax_bytes(m, plan) == (CAUSAL_SOFTMAX_BYTES if fused else EAGER_FP32_SOFTMAX_BYTES)
    assert softmax_launches(m, plan) == (0 if fused else EAGER_FP32_SOFTMAX_KERNELS)
    per_score = SAVED[(not fused, dropout > 0)]
    scores = layer_activation_parts(m, plan, False).scores
    assert scores == pytest.approx(per_score * heads / tp * s * s * mb)


def test_eager_fp32_plans_keep_the_same_saved_bytes():
    """softmax_kernel eager-fp32 (the 2020-22 chain at any length) keeps what the fallback keeps."""
    plan = ParallelPlan(seq_len=2048, micro_batch=1, tp=8, flash_attention=False, softmax_kernel="eager-fp32")
    for dropout in (0.0, 0.1):
        scores = layer_activation_parts(model(32, dropout), plan, False).scores
        assert scores == pytest.approx(SAVED[(True, dropout > 0)] * 4 * 2048 * 2048)


def test_the_cases_cover_both_sides():
    got = {kernel_available(mb, h // t, s) for h, t, mb, s in CASES}
    assert got == {True, False}
    assert not kernel_available(1, 4, 8192) and kernel_available(1, 4, 4096)  # the 4,096-key bound
    # the row counts alone send a shape to the fallback: 48 and 80 heads at TP 8, micro-batch 1 (6 and 10 rows,
    # not a multiple of 4), and 4 rows of 128 keys (a block takes 8); micro-batch 2 fuses all three
    assert not kernel_available(1, 6, 2048) and kernel_available(2, 6, 2048)
    assert not kernel_available(1, 10, 2048) and kernel_available(2, 10, 2048)
    assert not kernel_available(1, 4, 128) and kernel_available(2, 4, 128) and kernel_available(1, 4, 132)


def test_other_kernels_and_fused_attention_are_unchanged():
    m = model(32)
    long = ParallelPlan(seq_len=8192, micro_batch=1, tp=8, flash_attention=False)
    # the 2020 eager path has no fused kernel to fall back from
    assert softmax_bytes(m, long.model_copy(update={"softmax_kernel": "eager"})) == EAGER_SOFTMAX_BYTES
    # fused attention writes no scores: no softmax launches, no stored scores
    flash = long.model_copy(update={"flash_attention": True})
    assert softmax_launches(m, flash) == 0
    assert layer_activation_parts(m, flash, False).scores == 0
    # at 4,096 keys the fused kernel runs
    short = long.model_copy(update={"seq_len": 4096})
    assert softmax_bytes(m, short) == CAUSAL_SOFTMAX_BYTES and softmax_launches(m, short) == 0
