"""A fused norm's HBM bytes (cost.elementwise.FUSED_NORM_BYTES, docs/formulas.md#compute.norm_bytes): forward
reads x and writes y (4 bytes an element in bf16), backward reads x and dy and writes dx (6), the weight
gradient reduced in the same pass. Golden: NVIDIA's cuDNN norm benchmark publishes each kernel's median time
and GB/s, its harness dividing the bytes it counts by the time (NVIDIA/cudnn-frontend
benchmark/norms/benchmark_single_norm.py at 3929da2ef4, compute_bandwidth_bytes); time x GB/s recovers those
bytes, which must be FUSED_NORM_BYTES per element of the N x C tensor."""

from __future__ import annotations

import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from cudnn_norm_rows import ROUNDING, ROWS
from llmplan.cost.elementwise import FUSED_NORM_BYTES, elementwise_bytes
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan

# The published rows: tests/cudnn_norm_rows.py (each CSV's cudnn backend, every shape with N and C >= 4096 and
# GPT-3 175B's LayerNorm at 1,024 tokens).


@pytest.mark.parametrize("gpu", sorted(ROWS))
def test_published_time_times_bandwidth_is_the_fused_norms_bytes(gpu: str) -> None:
    """Per row, ms x GB/s / (N x C) is 4 forward and 6 backward (the old count, backward twice forward, would
    be 8). Tolerance: the CSV rounds the times to the microsecond (half of it over the time) plus 0.01 bytes
    an element for the weight, bias and fp32 per-row statistics (at most (8N + 6C) / (N C) < 0.01 here)."""
    for r in ROWS[gpu]:
        for per_element, ms, gb_s in ((FUSED_NORM_BYTES[0], r.cudnn_fwd_ms, r.cudnn_fwd_gb_s),
                                      (FUSED_NORM_BYTES[1], r.cudnn_bwd_ms, r.cudnn_bwd_gb_s)):
            recovered = ms * 1e-3 * gb_s * 1e9 / (r.n * r.c)
            tol = per_element * ROUNDING / ms + 0.01
            assert recovered == pytest.approx(per_element, abs=tol), (gpu, r.shape, ms)


def test_backward_moves_one_and_a_half_forwards() -> None:
    # read x and dy, write dx against read x, write y
    assert FUSED_NORM_BYTES == (4.0, 6.0)


DENSE: dict = {"name": "tiny", "intermediate_size": 512, "num_hidden_layers": 2, "vocab_size": 1000,
               "max_position_embeddings": 8192}


@seed(32)
@settings(max_examples=40, deadline=None)
@given(kv=st.sampled_from([1, 2, 4]), groups=st.sampled_from([1, 2, 4]), d=st.sampled_from([64, 128]),
       s=st.sampled_from([512, 1024, 4096]), b=st.integers(1, 4), t=st.sampled_from([1, 2, 4]))
def test_a_per_head_norm_costs_the_kernels_bytes_over_the_stages_three_passes(kv, groups, d, s, b, t) -> None:
    """Whatever the heads, sequence, micro-batch and TP, the per-head q/k norm adds (4 + 6) / 3 bytes per
    element of q and k to elementwise_bytes (the stage charges three times it: a forward and a backward of
    6), below the 2x count's 4."""
    a = kv * groups
    if a < t or a % t or kv % t and t % kv:
        return
    m = ModelSpec(**DENSE, hidden_size=a * d, num_attention_heads=a, num_key_value_heads=kv, head_dim=d)
    plan = ParallelPlan(seq_len=s, micro_batch=b, tp=t, sp=t > 1)
    extra = (elementwise_bytes(m.model_copy(update={"qk_norm": True}), plan, False)
             - elementwise_bytes(m, plan, False))
    width = d * (a / t + max(kv / t, 1))  # q heads and K/V heads per rank (K/V replicated when kv < t)
    per_element = extra * 3 / (s * b * width)
    assert per_element == pytest.approx(sum(FUSED_NORM_BYTES))
    assert per_element < 3 * FUSED_NORM_BYTES[0]
