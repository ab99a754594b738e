"""benchmarks/mxfp8_gain.py (docs/validation.md#mxfp8-gain): precision pairs across releases. The published
values: Megatron-Bridge docs/performance-summary-archive.md at 4ab94dfad, Qwen3-235B-A22B on 256 GB200, TP1 PP8
VP3 EP32, micro-batch 1, global batch 8,192: 25.11 BF16 4,916 and 26.04 MXFP8 5,672 tokens/s per GPU; the
Nemotron-3.5 Lightning GB200 pair (the BF16 verification card's 28,750.07 at 067f987df, the 26.08 table's MXFP8
28,672 at 4ab94dfad). What is asserted: the cross-release key pairs rows that precision_pairs (same release only)
does not, each pair's measured ratio is the two published values' ratio, and the Qwen3-235B MXFP8 / BF16 ratio,
a MoE model without Mamba layers, latent MoE or shared experts on the same per-expert cuBLASLt path and per-layer
CUDA graphs as the Lightning MXFP8 row, is priced within GOLDEN_TOLERANCE of the measured one."""

from __future__ import annotations

import mxfp8_gain as G  # benchmarks/ is on the path (conftest)
import precision_pairs as P
import pytest

QWEN = ("mbridge-25.11-pretrain-qwen3-235b-a22b-dgx-gb200-256gpu-bf16-tp1pp8cp1ep32vp3gbs8192mbs1",
        "mbridge-26.04-pretrain-qwen3-235b-a22b-dgx-gb200-256gpu-mxfp8-tp1pp8cp1ep32vp3gbs8192mbs1")

GOLDEN_TOLERANCE = 0.05
"""|predicted / measured - 1| of a cross-release ratio: two table rows, each rounded to the tokens/s, five months
apart (whatever changed between 25.11 and 26.04 besides the precision is in the measured ratio)."""


@pytest.fixture(scope="module")
def subset(published_runs):
    return [published_runs[i] for i in (*QWEN, *P.LIGHTNING)]


def test_cross_release_pairs_are_found_and_carry_the_published_ratio(subset):
    found = {(p["hi"], p["lo"]): p for p in G.all_pairs(subset)}
    assert set(found) == {QWEN, P.LIGHTNING}
    assert found[QWEN]["measured"] == pytest.approx(5672 / 4916, rel=1e-9)
    assert found[P.LIGHTNING]["measured"] == pytest.approx(28672 / 28750.07, rel=1e-9)
    assert found[QWEN]["pair"] == "mxfp8/bf16" and found[QWEN]["rel"] == "nemo:25.11|nemo:26.04"
    # the same-release pairing leaves the Qwen3 rows apart (different containers)
    assert [(p["bf16"], p["low"]) for p in P.pairs(subset)] == [P.LIGHTNING]


def test_qwen3_235b_mxfp8_gain_is_priced_within_tolerance(subset):
    (pair,) = [p for p in G.all_pairs(subset) if (p["hi"], p["lo"]) == QWEN]
    assert pair["predicted"] / pair["measured"] == pytest.approx(1.0, abs=GOLDEN_TOLERANCE)


def test_rows_fit_80_columns(subset):
    for p in G.all_pairs(subset):
        assert len(G.row(p)) <= 80
