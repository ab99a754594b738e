"""The Megatron-Bridge performance tables' GPT-OSS 120B rows count model FLOPs three ways, and the
tokens/s llmplan scores does not follow them (docs/validation.md#gptoss).

Model TFLOP/s over tokens/s per GPU gives the FLOPs per token each table counted. The counts are written out
by hand from Megatron-Bridge's published formula (src/megatron/bridge/training/utils/flop_utils.py,
num_floating_point_operations):
* v0.2.0 - v0.4.2 (tables 26.02 - 26.04.01, and 25.11's B200 / H100 rows): the expert MLP counted gated only
  when `activation_func == F.silu`; GPT-OSS's quick-GELU GLU counts two projections, not three, and every
  layer's attention as full causal.
* v0.5.0 on (tables 26.06, 26.08; commit baa0259bd "fix flops computation", #3947): three projections for any
  gated_linear_unit, and the 128-token window's average context on every other layer (window_attn_skip_freq 2).
* 25.11's GB200 / GB300 rows: 6 x the model card's 5.13B active parameters (output layer included).
Tolerance 1%: the tables round tokens/s and TFLOP/s to a few digits.
"""

from __future__ import annotations

import pytest

H, LAYERS, HEADS, GROUPS, D, SEQ, VOCAB, FFN, TOPK, WINDOW = 2880, 36, 64, 8, 64, 4096, 201088, 2880, 4, 128
Q = HEADS * D


def bridge_v042() -> float:
    mlp = 12 * LAYERS * H * FFN * TOPK  # gated_linear_multiplier 1 (quick_gelu is not F.silu)
    attn = 12 * LAYERS * H * H * (1 + GROUPS / HEADS + SEQ / H / 2) * (Q / H)
    return mlp + attn + 6 * H * VOCAB


def bridge_v050() -> float:
    mlp = 6 * 3 * LAYERS * H * FFN * TOPK  # ffn_expansion_factor 3 for any gated_linear_unit
    proj = H * (Q + 2 * GROUPS * D) + Q * H
    swa = WINDOW - WINDOW * (WINDOW - 1) / (2 * SEQ)
    attn = 6 * (LAYERS // 2 * (proj + Q * SEQ) + LAYERS // 2 * (proj + 2 * Q * swa))
    return mlp + attn + 6 * H * VOCAB


def card_6n() -> float:
    active = LAYERS * (H * (Q + 2 * GROUPS * D) + Q * H + 3 * H * FFN * TOPK + H * 128) + H * VOCAB
    return 6 * active


def gpt_oss_rows(runs: dict[str, dict]) -> list[dict]:
    return [r for rid, r in runs.items() if rid.startswith("mbridge-") and "gpt-oss-120b" in rid]


def test_the_hand_counts_are_the_three_definitions():
    assert bridge_v042() == pytest.approx(27.16e9, rel=1e-3)
    assert bridge_v050() == pytest.approx(32.63e9, rel=1e-3)
    assert card_6n() == pytest.approx(6 * 5.13e9, rel=2e-3)  # openai/gpt-oss-120b model card: 5.13B active


def test_each_table_counts_flops_per_token_by_its_release(published_runs, acc):
    rows = [r for r in gpt_oss_rows(published_runs) if "tflops_per_gpu" in r["measured"]]
    assert len(rows) == 29  # the 26.06.01 regression rows print tokens/s only
    for r in rows:
        m = r["measured"]
        per_token = m["tflops_per_gpu"] * 1e12 / m["tokens_per_s_per_gpu"]
        ref, gpu = acc.source_ref(r), str(r["hardware"]["gpu"]).lower()
        want = (bridge_v050() if ref >= (26, 6) else
                card_6n() if ref[:2] == (25, 11) and gpu.startswith("gb") else bridge_v042())
        assert per_token == pytest.approx(want, rel=0.01), r["id"]


def test_tokens_per_second_does_not_follow_the_count(published_runs):
    """The GB200 EP64 BF16 row across the 25.11 (6N) -> 26.02 (v0.3.0 formula) switch (micro-batch 1 -> 4, its
    preset otherwise the same layout) keeps its tokens/s within 1% while its TFLOP/s falls by the two counts'
    ratio: each TFLOP/s is the row's measured rate times its release's count, so the count never reaches the
    tokens/s that accuracy.py scores."""
    base = "pretrain-gpt-oss-120b-dgx-gb200-64gpu-bf16-tp1pp1cp1ep64"
    old = published_runs[f"mbridge-25.11-{base}vp1gbs1280mbs1"]["measured"]
    new = published_runs[f"mbridge-26.02-{base}vpnagbs1280mbs4"]["measured"]
    assert new["tokens_per_s_per_gpu"] == pytest.approx(old["tokens_per_s_per_gpu"], rel=0.01)
    assert new["tflops_per_gpu"] / old["tflops_per_gpu"] == pytest.approx(bridge_v042() / card_6n(), rel=0.01)
