"""The workload defaults the commands share, written once: sequence length, tokens per step and the serving
runtime allowance."""

from __future__ import annotations

from llmplan.specs.model import ModelSpec
from llmplan.units import GIB

DEFAULT_SEQ_LEN = 4096
"""Training sequence length when none is given (capped by the model's context)."""
DEFAULT_BATCH_TOKENS = 4 * 1024**2
"""Tokens per optimizer step when neither --global-batch nor --batch-tokens is given (4M, as Llama 2/3)."""
BATCH_ROUNDING = 0.05
"""--batch-tokens becomes the nearby global batch (within 5%) that the most data-parallel degrees divide."""
SERVE_RUNTIME_GIB = 1.5
"""The stated per-GPU allowance for a serving engine's runtime (CUDA context, NCCL, CUDA graphs) where
--overhead-gib is not given (docs/formulas.md#mem.other): the training side prices its runtime instead."""


def default_seq_len(m: ModelSpec) -> int:
    return min(DEFAULT_SEQ_LEN, m.max_position_embeddings)


def global_batch_from_tokens(tokens: float, seq_len: int) -> int:
    """Sequences per step for a token budget per step: tokens / seq_len, moved (by at most 5%) to the nearby
    count with the largest power-of-two factor, so that '16M' tokens at seq 8192 is 2048 sequences (Llama 3's
    batch) whether M is read as 10^6 or 2^20."""
    exact = max(1.0, tokens / seq_len)
    lo, hi = max(1, int(exact * (1 - BATCH_ROUNDING))), max(1, int(exact * (1 + BATCH_ROUNDING)))
    if hi - lo > 100_000:  # huge budgets: no search over the range (the batch is beyond any real one anyway)
        return max(1, round(exact))
    best = max(1, round(exact))
    for b in range(lo, hi + 1):
        if _twos(b) > _twos(best) or (_twos(b) == _twos(best) and abs(b - exact) < abs(best - exact)):
            best = b
    return best


def _twos(n: int) -> int:
    return (n & -n).bit_length() - 1


DEFAULT_MIN_HEADROOM_FRACTION = 0.05
"""Memory a training plan must leave free per GPU beyond the stated allowance, as a fraction of the GPU's
memory (4 GiB on an 80 GB GPU), unless --min-headroom says otherwise: search and check use the same rule."""


def min_headroom_bytes(min_headroom_gib: float | None, capacity_bytes: float) -> float:
    """--min-headroom in bytes: the value given (GiB), or the default fraction of the GPU's memory."""
    if min_headroom_gib is None:
        return DEFAULT_MIN_HEADROOM_FRACTION * capacity_bytes
    return min_headroom_gib * GIB


def default_bias_dropout_fusion(m: ModelSpec) -> bool:
    """ParallelPlan.bias_dropout_fusion where --bias-dropout-fusion is not given: False for a model whose routed
    experts carry biases (is_moe and mlp_bias: GPT-OSS), which Megatron-Core builds as TEGroupedMLP, whose
    __init__ asserts not (add_bias_linear and bias_dropout_fusion) (NVIDIA/Megatron-LM
    megatron/core/transformer/moe/experts.py at d98e8a6, from a329dd6da5), and whose Megatron-Bridge bridge sets
    it False (gpt_oss_bridge.py); True (Megatron-LM's default) otherwise."""
    return not (m.is_moe and m.mlp_bias)
