"""torchtitan's Table 2 (Llama 3.1 8B, 8 H100 96 GB at 500 W, FSDP + CP + torch.compile + Float8, full AC):
the slowdown from CP 1 to CP 2 / 4 / 8 as a golden. Every row runs 32,768 tokens a rank (sequence 32k x cp),
so the slowdown is the growth of the per-rank attention work (cp ring steps a layer-pass) over the rest.
docs/validation.md#tt-table2-attention says what was checked and why the CP 4 / 8 rows stay unexplained."""

from __future__ import annotations

import pytest

TABLE2 = {cp: f"torchtitan-2412-t2-llama31-8b-8gpu-cp{cp}" for cp in (1, 2, 4, 8)}


def _step(acc, rec: dict) -> float:
    plan = acc.plan_for(rec, "torchtitan", rec["hardware"]["gpus"])
    system = acc.builtin_systems()[acc.record_system(rec)]
    system = system.model_copy(update={"gpu": system.gpu.at_power_limit(rec["hardware"]["power_limit_w"])})
    cluster = acc.cluster_of(system, rec["hardware"]["gpus"])
    est = acc.estimate_training(acc.model_for(rec, "torchtitan"), cluster, plan)
    return float(est.time.total)


def test_table2_rows_hold_32k_tokens_a_rank(published_runs):
    # the reading the slowdowns rest on: sequence 32,768 x cp, local batch 1 (Table 2's Sequence Length column)
    for cp, rid in TABLE2.items():
        rec = published_runs[rid]
        assert rec["model"]["seq_len"] == 32768 * cp and rec["parallel"]["cp"] == cp, rid
        assert rec["parallel"]["micro_batch"] == 1, rid


@pytest.mark.xfail(strict=True, reason="CP 4 / 8 ring steps measure ~1.55x their predicted FlashAttention-2 "
                   "time while CP 2's measures 0.86x; no mechanism found (docs/validation.md#tt-table2-attention)")
def test_table2_cp_slowdown(acc, published_runs):
    # pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Table 2: 3,890 / 2,540 / 1,071 / 548
    # tokens/s per GPU at CP 1 / 2 / 4 / 8, slowdowns 1.53 / 3.63 / 7.10 (four significant figures: the
    # published rounding is under 0.1%). Each predicted slowdown (step at CP c over the CP 1 step; the tokens
    # per rank are equal) within 10% of the published one.
    rows = {cp: published_runs[rid] for cp, rid in TABLE2.items()}
    measured = {cp: rows[1]["measured"]["tokens_per_s_per_gpu"] / rows[cp]["measured"]["tokens_per_s_per_gpu"]
                for cp in (2, 4, 8)}
    assert measured == pytest.approx({2: 1.53, 4: 3.63, 8: 7.10}, abs=0.006)
    steps = {cp: _step(acc, rows[cp]) for cp in rows}
    for cp in (2, 4, 8):
        assert steps[cp] / steps[1] == pytest.approx(measured[cp], rel=0.10), (cp, steps[cp] / steps[1])
