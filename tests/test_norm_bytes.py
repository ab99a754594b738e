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

from llmplan.cost.elementwise import FUSED_NORM_BYTES, elementwise_bytes
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan

# (norm, N tokens, C hidden, forward ms, backward ms, forward GB/s, backward GB/s): the cudnn rows of
# NVIDIA/cudnn-frontend benchmark/norms/results/<gpu>/all_models_<stamp>.csv at 3929da2ef4 (bf16, cuDNN
# Frontend 1.19), every row with N and C >= 4096 and GPT-3 175B's LayerNorm (with bias) at 1,024 tokens.
ROWS = {
    "gb200": (  # gb200/all_models_20260226_180237.csv
        ("llama3-8b", 16384, 4096, 0.042, 0.065, 6424.6, 6187.3),
        ("llama3-70b", 8192, 8192, 0.045, 0.077, 5997.4, 5200.5),
        ("llama31-405b", 4096, 16384, 0.044, 0.084, 6119.7, 4787.2),
        ("llama4-e16", 8192, 5120, 0.028, 0.051, 5986.8, 4950.7),
        ("gpt3-175b", 1024, 12288, 0.013, 0.053, 3758.4, 1413.4),
        ("mixtral-8x7b", 8192, 4096, 0.023, 0.036, 5843.7, 5633.7),
        ("mixtral-8x22b", 4096, 6144, 0.017, 0.036, 5848.7, 4184.4),
        ("nemotronh-56b", 4096, 8192, 0.023, 0.041, 5934.0, 4885.9),
        ("qwen3-235b", 8192, 5120, 0.028, 0.050, 6000.5, 5051.7),
    ),
    "gb300": (  # gb300/all_models_20260226_190305.csv
        ("llama3-8b", 16384, 4096, 0.042, 0.066, 6459.5, 6133.5),
        ("llama3-70b", 8192, 8192, 0.045, 0.074, 5962.9, 5467.3),
        ("llama31-405b", 4096, 16384, 0.044, 0.082, 6079.4, 4896.8),
        ("llama4-e16", 8192, 5120, 0.028, 0.050, 5979.9, 5058.6),
        ("gpt3-175b", 1024, 12288, 0.013, 0.052, 3775.9, 1467.0),
        ("mixtral-8x7b", 8192, 4096, 0.022, 0.036, 5968.1, 5534.3),
        ("mixtral-8x22b", 4096, 6144, 0.017, 0.035, 5959.5, 4338.2),
        ("nemotronh-56b", 4096, 8192, 0.022, 0.041, 5976.0, 4908.6),
        ("qwen3-235b", 8192, 5120, 0.027, 0.050, 6105.0, 5071.9),
    ),
    "h200": (  # h200/all_models_20260227_035147.csv
        ("llama3-8b", 16384, 4096, 0.072, 0.106, 3708.1, 3801.0),
        ("llama3-70b", 8192, 8192, 0.071, 0.114, 3770.9, 3526.2),
        ("llama31-405b", 4096, 16384, 0.070, 0.118, 3845.2, 3420.0),
        ("llama4-e16", 8192, 5120, 0.045, 0.069, 3762.0, 3658.5),
        ("gpt3-175b", 1024, 12288, 0.016, 0.080, 3227.0, 945.9),
        ("mixtral-8x7b", 8192, 4096, 0.035, 0.058, 3790.3, 3499.9),
        ("mixtral-8x22b", 4096, 6144, 0.029, 0.049, 3461.6, 3086.8),
        ("nemotronh-56b", 4096, 8192, 0.041, 0.061, 3311.3, 3279.2),
        ("qwen3-235b", 8192, 5120, 0.045, 0.069, 3770.2, 3631.5),
    ),
}


@pytest.mark.parametrize("gpu", sorted(ROWS))
def test_published_time_times_bandwidth_is_the_fused_norms_bytes(gpu: str) -> None:
    """Per row, ms x GB/s / (N x C) is 4 forward and 6 backward (the old count, backward twice forward, would
    be 8). Tolerance: the CSV rounds the times to the microsecond (half of it over the time) plus 0.01 bytes
    an element for the weight, bias and fp32 per-row statistics (at most (8N + 6C) / (N C) < 0.01 here)."""
    for name, n, c, fwd_ms, bwd_ms, fwd_gb_s, bwd_gb_s in ROWS[gpu]:
        for per_element, ms, gb_s in ((FUSED_NORM_BYTES[0], fwd_ms, fwd_gb_s), (FUSED_NORM_BYTES[1], bwd_ms, bwd_gb_s)):
            recovered = ms * 1e-3 * gb_s * 1e9 / (n * c)
            tol = per_element * 0.0005 / ms + 0.01
            assert recovered == pytest.approx(per_element, abs=tol), (gpu, name, ms)


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
