"""Sliding-window layers' fused attention calls (compute.window_attention): a query tile's window spans a few
key tiles, the boundary ones computed whole, and every CTA pays the kernel's fixed work once, so a short window
runs far below the causal call's rate. Checks against a brute-force count of the tiles a window mask touches,
the causal call at w >= s, and properties of the layer's blended rate."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from llmplan.cost.attention_rate import (
    ATTENTION_TILE,
    attention_rate_ratio,
    layer_attention_rate_ratio,
    window_call_tiles,
    window_rate_ratio,
)
from llmplan.cost.compute import layer_flops, layer_seconds
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

S = builtin_systems()
M = builtin_models()


def _touched_tiles(s: int, w: int, T: int = ATTENTION_TILE) -> int:
    """(query tile, key tile) pairs holding at least one (q, k) with q - w + 1 <= k <= q: Transformer Engine's
    window (w - 1, 0) on a causal call of s tokens, counted pair by pair."""
    n = math.ceil(s / T)
    count = 0
    for qi in range(n):
        q_lo, q_hi = qi * T, min(s, (qi + 1) * T) - 1
        for ki in range(qi + 1):
            k_lo, k_hi = ki * T, min(s, (ki + 1) * T) - 1
            # some q in the tile sees some k in the tile: k_lo <= q_hi and k_hi >= q_lo - w + 1
            if k_lo <= q_hi and k_hi >= q_lo - w + 1:
                count += 1
    return count


@pytest.mark.parametrize("s, w", [(4096, 128), (4096, 129), (4096, 1), (2048, 4096), (4096, 1000), (1024, 256),
                                  (8192, 4096)])
def test_the_call_computes_the_tiles_its_window_mask_touches(s, w):
    n = math.ceil(s / ATTENTION_TILE)
    j = min(math.ceil((w - 1) / ATTENTION_TILE) + 1, n)
    assert window_call_tiles(n, j) == _touched_tiles(s, w)


def _with_window(w: int | None):
    return M["gpt-oss-120b"].model_copy(update={"sliding_window": w})


@pytest.mark.parametrize("s", [1024, 4096, 8192])
def test_a_window_as_long_as_the_sequence_runs_as_the_causal_call(s):
    gpu = S["dgx-h100"].gpu
    plan = ParallelPlan(seq_len=s, micro_batch=2)
    m = _with_window(s)
    assert float(window_rate_ratio(m, plan, gpu)) == pytest.approx(float(attention_rate_ratio(m, plan, gpu)), rel=1e-12)


@seed(41)
@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=1, max_value=64), st.integers(min_value=1, max_value=8192),
       st.sampled_from(["dgx-h100", "dgx-b200", "dgx-a100"]))
def test_a_window_shorter_than_the_sequence_never_runs_faster_than_the_causal_call(tiles, w, system):
    s = tiles * ATTENTION_TILE
    gpu = S[system].gpu
    plan = ParallelPlan(seq_len=s)
    m = _with_window(w)
    assert float(window_rate_ratio(m, plan, gpu)) <= float(attention_rate_ratio(m, plan, gpu)) * (1 + 1e-9)


def test_gpt_oss_128_token_window_runs_at_a_quarter_of_the_asymptote():
    """Each CTA of a 128-token window loops over 2 tiles, one of them useful, and pays FA3's fixed work (237
    keys forward, 420 backward: 1.9 and 3.3 tiles): about (1 + 2) / (3.85 + 2 x 5.28) = 0.21 of the asymptote."""
    gpu, m = S["dgx-h100"].gpu, M["gpt-oss-120b"]
    r = float(window_rate_ratio(m, ParallelPlan(seq_len=4096, micro_batch=4), gpu))
    assert 0.17 < r < 0.24


def test_the_layer_blends_the_window_and_the_causal_rates_by_their_flops():
    gpu, m = S["dgx-h100"].gpu, M["gpt-oss-120b"]
    plan = ParallelPlan(seq_len=4096, micro_batch=4)
    full, win = float(attention_rate_ratio(m, plan, gpu)), float(window_rate_ratio(m, plan, gpu))
    layer = float(layer_attention_rate_ratio(m, plan, gpu, layer_flops(m, plan, True).attention))
    assert win < layer < full
    # half the layers windowed at 252 of 4096 + 252 keys: the harmonic mean by hand
    share = 252 / (4096 + 252)
    assert layer == pytest.approx(1 / ((1 - share) / full + share / win), rel=1e-9)


def test_models_without_windows_and_context_parallel_rings_keep_the_causal_rate():
    gpu = S["dgx-h100"].gpu
    dense = M["llama-3.1-8b"]
    plan = ParallelPlan(seq_len=8192, tp=2)
    assert float(layer_attention_rate_ratio(dense, plan, gpu, layer_flops(dense, plan, False).attention)) \
        == float(attention_rate_ratio(dense, plan, gpu))
    m, ring = M["gpt-oss-120b"], ParallelPlan(seq_len=8192, cp=2)
    assert float(layer_attention_rate_ratio(m, ring, gpu, layer_flops(m, ring, True).attention)) \
        == pytest.approx(float(attention_rate_ratio(m, ring, gpu)), rel=1e-12)


def test_the_window_costs_gpt_oss_attention_time():
    """The same layer prices its attention slower with its 128-token window's short calls than if those
    FLOPs ran at the causal call's rate (a window as long as the sequence)."""
    gpu = S["dgx-h100"].gpu
    plan = ParallelPlan(seq_len=4096, micro_batch=4)
    windowed = float(layer_seconds(M["gpt-oss-120b"], plan, gpu, True)[1])
    m = M["gpt-oss-120b"]
    flops = layer_flops(m, plan, True).attention
    at_causal = windowed * float(layer_attention_rate_ratio(m, plan, gpu, flops)) / float(
        attention_rate_ratio(m, plan, gpu))
    assert windowed > 1.15 * at_causal
    assert np.isfinite(windowed)
