"""benchmarks/tp2_width.py (docs/validation.md#n3-tp2): whether the Nemotron-3 GB200 TP2 excess scales per call
or per unit of work. Asserted: the excess arithmetic by hand, and the TP collectives a GB200 TP2 micro-batch
counts, by hand from Transformer Engine's sequence-parallel path (NVIDIA/TransformerEngine
transformer_engine/pytorch/module/linear.py and layernorm_linear.py at d0067d0: forward the column-parallel
input's all-gather and the row-parallel output's reduce-scatter; backward the input's all-gather again for the
weight gradient, the input gradient's reduce-scatter and the output gradient's all-gather: 5 a block) over the
models' blocks (Nemotron-3 Super 88, Ultra 108: their Hugging Face configs' hybrid_override_pattern lengths)."""

from __future__ import annotations

import accuracy as A  # benchmarks/ is on the path (conftest)
import hybrid_gap as H
import pytest
import tp2_width as W


def test_excess_by_hand():
    # TP2 leaves 90 ms a micro-batch, TP1 40 ms a micro-batch of twice the work: 90 - 20 = 70 ms if the TP1
    # residual is per unit of work, 90 - 40 = 50 ms if it is per micro-batch
    assert W.tp2_excess(90.0, 40.0) == pytest.approx((70.0, 50.0))


@pytest.mark.parametrize("model,blocks", [("super", 88), ("ultra", 108)])
def test_tp_collectives_a_micro_batch_by_hand(published_runs, model, blocks):
    rec = published_runs[H.ROWS[(model, "gb200")]]
    m, _, plan = A.record_setup(rec, "mbridge-moe")
    assert (plan.tp, plan.sp) == (2, True)
    assert W.scales(rec)["tp collectives"] == pytest.approx(5 * blocks)
