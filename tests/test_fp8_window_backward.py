"""FP8 attention on a sliding-window layer (docs/formulas.md#compute.fp8_window_backward): cuDNN's FP8 SDPA
backward computes every causal tile of a windowed call, so on Blackwell a 128-token window in FP8 runs several
times slower than in bf16, more so the longer the sequence.

Source: NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training/results/gpt_oss/{gb200,gb300}/
gpt_oss_20260424_1000{11,22}.csv at 3929da2 (cuDNN 9.22.0, configs/gpt_oss.py: batch 2, 128 query / 128 KV heads,
head dim 64, top_left causal mask with sliding_window_size 128; forward and non-deterministic backward, ms)."""

from __future__ import annotations

import pytest

from llmplan.cost.attention_rate import backward_window_tiles, window_call_tiles
from llmplan.cost.compute import layer_seconds
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

# (system, tokens): ((bf16 forward, bf16 backward), (fp8 forward, fp8 backward)) in ms, as published
PUBLISHED_MS = {
    ("gb200-nvl72", 2048): ((0.109, 0.237), (0.101, 0.536)),
    ("gb200-nvl72", 4096): ((0.210, 0.465), (0.195, 1.731)),
    ("gb200-nvl72", 8192): ((0.414, 0.911), (0.385, 6.176)),
    ("gb300-nvl72", 2048): ((0.104, 0.227), (0.086, 0.467)),
    ("gb300-nvl72", 4096): ((0.202, 0.442), (0.167, 1.480)),
    ("gb300-nvl72", 8192): ((0.397, 0.862), (0.327, 5.189)),
}
TOLERANCE = (0.7, 1.0)  # the priced FP8 / bf16 slow-down between 70% and 100% of the published one
FLOOR = 0.9  # the FP8 layer priced at least 90% of the measured kernel time (as tests/test_gpt_oss_attention_bound.py)


def _window_layer_ms(system: str, s: int, fp8_attention: bool) -> float:
    """Priced forward + backward attention of one windowed layer at the benchmark's shape, ms."""
    base = builtin_models()["gpt-oss-120b"]
    m = base.model_copy(update={"num_attention_heads": 128, "num_key_value_heads": 128,
                                "layer_types": ("sliding_attention",) * base.num_hidden_layers})
    plan = ParallelPlan(micro_batch=2, global_batch=2, seq_len=s, dtype="fp8", fp8_attention=fp8_attention)
    return 3 * float(layer_seconds(m, plan, builtin_systems()[system].gpu, True)[1]) * 1e3


@pytest.mark.parametrize("system, s", sorted(PUBLISHED_MS))
def test_fp8_window_layer_slows_down_as_cudnn_measured(system, s):
    (bf_f, bf_b), (f8_f, f8_b) = PUBLISHED_MS[(system, s)]
    published = (f8_f + f8_b) / (bf_f + bf_b)
    priced = _window_layer_ms(system, s, True) / _window_layer_ms(system, s, False)
    assert TOLERANCE[0] * published <= priced <= TOLERANCE[1] * published, (priced, published)


@pytest.mark.parametrize("system, s", sorted(PUBLISHED_MS))
def test_fp8_window_layer_never_priced_faster_than_cudnn_measured_it(system, s):
    assert _window_layer_ms(system, s, True) >= FLOOR * sum(PUBLISHED_MS[(system, s)][1])


def test_bf16_backward_keeps_the_window_and_fp8_takes_the_causal_tiles():
    N, j = 32, 2
    bf16 = ParallelPlan(seq_len=4096)
    fp8 = ParallelPlan(seq_len=4096, dtype="fp8", fp8_attention=True)
    assert backward_window_tiles(bf16, N, j) == j
    assert window_call_tiles(N, backward_window_tiles(fp8, N, j)) == N * (N + 1) / 2
