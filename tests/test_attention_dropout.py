"""Attention dropout's cost (docs/formulas.md#compute.attention_dropout): inside a fused kernel, per-pair work
(a Philox draw in forward and again in backward, a select) priced from the published dropout / no-dropout
times; on the unfused path, the mask's HBM traffic (elementwise_bytes)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.attention_rate import (
    DROPOUT_BENCH_CALL,
    FLASH2_DROPOUT_RATIO,
    attention_rate_ratio,
    dropout_tile_factor,
    layer_attention_rate_ratio,
)
from llmplan.cost.elementwise import elementwise_bytes
from llmplan.cost.flops import layer_flops
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_gpus, builtin_models

G = builtin_gpus()
M = builtin_models()
B, S, A = DROPOUT_BENCH_CALL
# the published calls' layer: 16 heads of 128 (MHA), 4 sequences of 1,024 tokens
BENCH = M["llama-3.1-8b"].model_copy(update={"num_attention_heads": A, "num_key_value_heads": A, "head_dim": 128,
                                             "hidden_size": A * 128})


def _slowdown(gpu: str, kernel: str = "native", d: int = 128, s: int = S, b: int = B) -> float:
    """The fused kernel's forward + backward time with dropout 0.1 over without, as llmplan prices one
    causal call: the rate curve (attention_rate_ratio) without over with."""
    m = BENCH.model_copy(update={"head_dim": d})
    plan = ParallelPlan(seq_len=s, micro_batch=b, attention_kernel=kernel)
    drop = m.model_copy(update={"attention_dropout": 0.1})
    return float(attention_rate_ratio(m, plan, G[gpu]) / attention_rate_ratio(drop, plan, G[gpu]))


@pytest.mark.parametrize("gpu, published", [
    # NVIDIA/TransformerEngine#3312 (2026-08-04): DotProductAttention, fused (cuDNN) backend forced, bf16, sbhd,
    # 16 heads of 128, 4 sequences, 4096 tokens, forward + backward, dropout 0.1 vs 0.0: 0.614 / 0.594 ms on H200
    ("h200", 0.614 / 0.594), ("h100-sxm", 0.614 / 0.594),  # H200 (sm90): the GH100 die of every H100 profile
    ("b300", 0.525 / 0.480),                               # B300 (sm103)
    # NVIDIA/TransformerEngine PR #3313 (2026-08-05): flash-attn 2.7.4 (thd, same shape) on GB200, 0.728 / 0.695
    # ms; FA2 is A100's native kernel
    ("a100-80gb", 0.728 / 0.695),
])
def test_fused_dropout_slowdown_of_the_published_call_is_the_published_one(gpu, published):
    assert _slowdown(gpu) == pytest.approx(published, rel=2e-3)  # the profiles round to three decimals


def test_flash2_pays_fa2_s_published_dropout_cost_on_hopper_too():
    """FA2 runs its one Ampere-style kernel on every GPU: PR #3313's ratio, not cuDNN's."""
    assert _slowdown("h100-sxm", "flash2") == pytest.approx(0.728 / 0.695, rel=2e-3)
    assert FLASH2_DROPOUT_RATIO == pytest.approx(0.728 / 0.695, rel=1e-12)


def test_longer_calls_pay_more_and_smaller_heads_pay_more():
    """The dropout's work is in the loop over tiles, not in a CTA's fixed work: a long call, mostly loop, pays
    more than the published short one. Per pair it is fixed work against 4d matmul FLOPs, so the ratio falls
    with d (as the CuTe DSL SM121 dropout benchmark shows: 11-16% at d = 64, -1.5..+5.7% at d = 128,
    Dao-AILab/flash-attention PR #2439)."""
    assert _slowdown("h100-sxm", s=8192, b=1) > _slowdown("h100-sxm") > 1.0
    r = [_slowdown("h100-sxm", d=d, s=4096, b=1) for d in (64, 128, 256)]
    assert r[0] > r[1] > r[2] > 1.0


@settings(max_examples=40, deadline=None, derandomize=True)
@given(gpu=st.sampled_from(sorted(G)), kernel=st.sampled_from(["native", "flash2"]),
       fused=st.booleans(), d=st.sampled_from([64, 96, 128, 192, 256]),
       s=st.sampled_from([1024, 4096, 32768]), cp=st.sampled_from([1, 2, 4]), p=st.floats(0.01, 0.5))
def test_no_dropout_prices_exactly_as_before(gpu, kernel, fused, d, s, cp, p):
    """Dropout 0: no factor at all (the rate curve as it was); any p > 0 costs the same (one Philox draw per pair
    whatever p); the dropout stretches only the tile loop, so the rate falls by at most its factor; unfused
    attention is untouched (its dropout is memory traffic)."""
    g = G[gpu]
    m = BENCH.model_copy(update={"head_dim": d})
    plan = ParallelPlan(seq_len=s, cp=cp, attention_kernel=kernel, flash_attention=fused)
    drop, other = (m.model_copy(update={"attention_dropout": q}) for q in (p, 0.1))
    assert dropout_tile_factor(m, plan, g) == 1.0
    x = float(dropout_tile_factor(drop, plan, g))
    assert x == float(dropout_tile_factor(other, plan, g))
    base, slow = float(attention_rate_ratio(m, plan, g)), float(attention_rate_ratio(drop, plan, g))
    if not fused:
        assert x == 1.0 and slow == base
        return
    assert x > 1.0
    assert base / x * (1 - 1e-12) <= slow < base
    flops = layer_flops(drop, plan, False).attention
    assert float(layer_attention_rate_ratio(drop, plan, g, flops)) == slow


def test_unfused_dropout_mask_traffic_is_in_the_memory_bound_bytes():
    """Megatron's 2020-22 unfused path: dropout over the s x s probabilities reads them (2 bytes), writes its
    1-byte mask and its output (2), 5 bytes per score in forward (Korthikanti et al. 2022, §4.1: the mask of
    as x s x b bytes), and its backward reads the gradient and the mask and writes dx (5 more): in the
    forward-equivalent units of elementwise_bytes (three passes), 10 / 3 a score (docs/formulas.md#compute.score_bytes);
    with fused attention none of it reaches HBM."""
    m = BENCH
    drop = m.model_copy(update={"attention_dropout": 0.1})
    plan = ParallelPlan(seq_len=2048, micro_batch=2, tp=2, flash_attention=False)
    scores = m.num_attention_heads / plan.tp * plan.seq_len ** 2 * plan.micro_batch
    extra = float(elementwise_bytes(drop, plan, False) - elementwise_bytes(m, plan, False))
    assert 3 * extra == pytest.approx((5 + 5) * scores, rel=1e-12)
    fused = plan.model_copy(update={"flash_attention": True})
    assert float(elementwise_bytes(drop, fused, False)) == float(elementwise_bytes(m, fused, False))
