"""HBM bytes of the attention scores without fused attention (cost.elementwise.score_bytes,
docs/formulas.md#compute.score_bytes): Megatron-LM's fused causal softmax (CAUSAL_SOFTMAX_BYTES) and PyTorch's
dropout over the probabilities (DROPOUT_BYTES), forward and backward counted apart.

The softmax counts are checked against the kernel's own guards, replayed here: NVIDIA/Megatron-LM
megatron/fused_kernels/scaled_upper_triang_masked_softmax.h at 50a4b5fa02 loads an element of row r (blockIdx.x)
only if element_index < local_seq = r + 1, in the forward (the scores) and the backward (the output gradient and
the saved probabilities), and stores every element_count element of the row (zeros above the diagonal forward:
copy_zero_vector; the backward's store loop is guarded by element_index < element_count only)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from llmplan.cost.elementwise import (
    CAUSAL_SOFTMAX_BYTES,
    DROPOUT_BYTES,
    EAGER_FP32_SOFTMAX_BYTES,
    EAGER_FP32_SOFTMAX_KERNELS,
    EAGER_SOFTMAX_BYTES,
    EAGER_SOFTMAX_KERNELS,
    elementwise_bytes,
    score_bytes,
    softmax_launches,
)
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan

HALF = 2  # bytes of an fp16 / bf16 element


def replayed_kernel_bytes(s: int) -> tuple[float, float]:
    """(forward, backward) bytes per score of one s x s head, counted from the kernel's guards: a load where
    column < row + 1, a store at every column."""
    row, col = np.indices((s, s))
    loaded = float(np.count_nonzero(col < row + 1)) / (s * s)
    stored = 1.0
    return HALF * (loaded + stored), HALF * (2 * loaded + stored)


@pytest.mark.parametrize("s", [64, 512, 2048])
def test_causal_softmax_bytes_match_the_kernels_guards(s: int) -> None:
    """The priced (forward, backward) are the replayed guards' counts to within the diagonal (1/s of a load); a
    kernel that read the whole row (4 and 6, the count before) fails at every s."""
    fwd, bwd = replayed_kernel_bytes(s)
    assert CAUSAL_SOFTMAX_BYTES[0] == pytest.approx(fwd, abs=2 * HALF / s)
    assert CAUSAL_SOFTMAX_BYTES[1] == pytest.approx(bwd, abs=4 * HALF / s)


def test_dropout_bytes_read_the_mask_once_each_way() -> None:
    # forward: read x, write y and a one-byte mask; backward: read dy and the mask, write dx
    assert DROPOUT_BYTES == (HALF + HALF + 1, HALF + 1 + HALF)


DENSE: dict = {"name": "tiny", "intermediate_size": 512, "num_hidden_layers": 2, "vocab_size": 1000,
               "max_position_embeddings": 8192, "num_key_value_heads": None}


@seed(21)
@settings(max_examples=40, deadline=None)
@given(a=st.sampled_from([8, 16, 32]), s=st.sampled_from([512, 1024, 2048]), b=st.integers(1, 4),
       t=st.sampled_from([1, 2, 4, 8]), dropout=st.booleans(), kernel=st.sampled_from(["fused", "eager", "eager-fp32"]))
def test_scores_are_priced_per_head_and_score_without_fused_attention(a, s, b, t, dropout, kernel) -> None:
    """Without fused attention a layer's traffic grows by score_bytes per score of the rank's a/t heads
    (s x s x b of them), forward and backward over the 3 passes the stage charges; with it, by nothing. The
    backward moves less than twice the forward (the count before charged 2x: 4 and 9 per forward-equivalent).
    Each kernel's softmax count is the one beside it; the dropout (on the 16-bit probabilities every kernel writes)
    comes on top of each alike."""
    m = ModelSpec(**{**DENSE, "num_key_value_heads": a}, hidden_size=64 * a, num_attention_heads=a,
                  attention_dropout=0.1 if dropout else 0.0)
    flash = ParallelPlan(seq_len=s, micro_batch=b, tp=t)
    unfused = flash.model_copy(update={"flash_attention": False, "softmax_kernel": kernel})
    extra = elementwise_bytes(m, unfused, False) - elementwise_bytes(m, flash, False)
    # Megatron's is_kernel_available (NVIDIA/Megatron-LM@d98e8a64dd fused_softmax.py): b x a/t rows a multiple of
    # 4 (and, above 128 keys, of the kernel's 4 rows a block), else the fp32 torch fallback
    fused = CAUSAL_SOFTMAX_BYTES if (b * a // t) % 4 == 0 else EAGER_FP32_SOFTMAX_BYTES
    softmax = {"fused": fused, "eager": EAGER_SOFTMAX_BYTES, "eager-fp32": EAGER_FP32_SOFTMAX_BYTES}[kernel]
    fwd, bwd = softmax[0] + (DROPOUT_BYTES[0] if dropout else 0), softmax[1] + (DROPOUT_BYTES[1] if dropout else 0)
    assert extra * 3 == pytest.approx((fwd + bwd) * a / t * s * s * b)
    assert score_bytes(m, unfused) * 3 < 3 * fwd


def test_eager_softmax_reads_every_score_and_the_mask_pass_once_more() -> None:
    """The 2020 eager path: masked_fill_ (read, write) and softmax (read, write) forward; the softmax's backward
    (read y and dy, write dx) and the mask's (read, write); every pass over whole rows, so each count is at least
    the fused causal kernel's."""
    assert EAGER_SOFTMAX_BYTES == (2 * (HALF + HALF), 3 * HALF + 2 * HALF)
    assert all(e > c for e, c in zip(EAGER_SOFTMAX_BYTES, CAUSAL_SOFTMAX_BYTES))


@pytest.mark.parametrize("kernel,fused_total,dropout_total", [("fused", 7, 17), ("eager", 18, 28),
                                                               ("eager-fp32", 76, 86)])
def test_each_kernels_bytes_a_score_with_and_without_dropout(kernel, fused_total, dropout_total) -> None:
    """Bytes a score forward + backward by kernel, counted from the sources' operations (fused: Megatron-LM
    50a4b5fa02's causal kernel 3 + 4; eager: d73def35a3's masked_fill_ + softmax 8 + 10; eager-fp32:
    Megatron-DeepSpeed ae6277f5's forward_torch_softmax chain 36 + 40), with PyTorch's dropout 5 + 5 on top: the
    layer's traffic per score (x 3, elementwise_bytes' units) is these totals."""
    m = ModelSpec(**{**DENSE, "num_key_value_heads": 8}, hidden_size=512, num_attention_heads=8, attention_dropout=0.1)
    flash = ParallelPlan(seq_len=1024, micro_batch=1, tp=1)
    unfused = flash.model_copy(update={"flash_attention": False, "softmax_kernel": kernel})
    per_score = 3 * (elementwise_bytes(m, unfused, False) - elementwise_bytes(m, flash, False)) / (8 * 1024 * 1024)
    assert per_score == pytest.approx(dropout_total)
    assert score_bytes(m.model_copy(update={"attention_dropout": 0.0}), unfused) * 3 == pytest.approx(fused_total)


def test_softmax_launches_by_kernel() -> None:
    """Kernels beyond the fused one per layer forward: eager adds the masked_fill_, eager-fp32 the casts, scale and
    mask; none with fused attention (no scores)."""
    m = ModelSpec(**{**DENSE, "num_key_value_heads": 8}, hidden_size=512, num_attention_heads=8)
    plan = ParallelPlan(seq_len=1024, micro_batch=1, tp=1, flash_attention=False)
    got = {k: softmax_launches(m, plan.model_copy(update={"softmax_kernel": k}))
           for k in ("fused", "eager", "eager-fp32")}
    assert got == {"fused": 0, "eager": EAGER_SOFTMAX_KERNELS, "eager-fp32": EAGER_FP32_SOFTMAX_KERNELS}
    assert (EAGER_SOFTMAX_KERNELS, EAGER_FP32_SOFTMAX_KERNELS) == (1, 4)
    assert softmax_launches(m, ParallelPlan(seq_len=1024, micro_batch=1, tp=1)) == 0


def test_selective_recompute_reruns_the_softmax_and_dropout_forward() -> None:
    """Selective recompute of the attention core adds one forward of the softmax and dropout per score, which the
    stage charges three times in forward-equivalent units."""
    m = ModelSpec(**{**DENSE, "num_key_value_heads": 16}, hidden_size=1024, num_attention_heads=16,
                  attention_dropout=0.1)
    plan = ParallelPlan(seq_len=2048, micro_batch=1, tp=2, flash_attention=False)
    sel = plan.model_copy(update={"recompute": "selective"})
    extra = elementwise_bytes(m, sel, False) - elementwise_bytes(m, plan, False)
    assert extra * 3 == pytest.approx((CAUSAL_SOFTMAX_BYTES[0] + DROPOUT_BYTES[0]) * 16 / 2 * 2048 * 2048)


def test_the_cli_prices_the_eager_softmax_and_refuses_it_with_flash_attention(cli) -> None:
    """--softmax-kernel eager lengthens an unfused-attention step (more bytes a score than the fused kernel); with
    flash attention it acts on nothing and is refused in one line; an unknown value is named."""
    base = ("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-a100", "--nodes", "1", "--tp", "8", "--json")
    fused = cli(*base, "--no-flash-attention")
    eager = cli(*base, "--no-flash-attention", "--softmax-kernel", "eager")
    assert fused.code == 0 and eager.code == 0, (fused.err, eager.err)
    import json
    step = [json.loads(r.out)["time"]["step_s"] for r in (fused, eager)]
    assert step[1] > step[0], step
    r = cli(*base, "--softmax-kernel", "eager")
    assert r.code == 2 and "softmax_kernel eager with flash_attention on" in r.err and "--softmax-kernel" in r.err, r.err
    r = cli(*base, "--no-flash-attention", "--softmax-kernel", "triton")
    assert r.code == 2 and "--softmax-kernel triton is not a softmax kernel" in r.err, r.err
