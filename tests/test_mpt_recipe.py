"""How benchmarks/accuracy.py reads MosaicML's llm-foundry MPT benchmark tables
(scripts/train/benchmarking/README.md): the benchmark models' architecture as MPTConfig's defaults build it
(learned positions, biases), checked against the tables' published NumParams column, and FSDP's gradient
reduction dtype from the table's 'MP Mode' column (docs/validation.md#mpt-benchmark-arch)."""

from __future__ import annotations

from llmplan.cost.elementwise import elementwise_bytes
from llmplan.cost.params import param_counts


def _mpt_rows(published_runs: dict) -> dict:
    return {rid: rec for rid, rec in published_runs.items() if rid.startswith("mpt-")}


def test_every_mpt_row_has_the_published_parameter_count(acc, published_runs):
    # Golden, exact (tolerance 0): the tables' NumParams column (Composer's n_params, mosaicml/llm-foundry
    # scripts/train/benchmarking/collect_results.py at b2a43a147 reads it from the run's log) counts the position
    # table (max_seq_len x d_model) and every bias: 64,862,437,376 for 70b, 12,853,954,560 for 13b at 2k,
    # 2,814,366,720 for 3b at 64k. A bias-free ALiBi reading misses 843,776 (350m, 512) .. 270,139,392 (7b, 64k).
    rows = _mpt_rows(published_runs)
    assert len(rows) == 216
    for rid, rec in rows.items():
        m = acc.model_for(rec, "mpt")
        assert param_counts(m).total == rec["model"]["params"], rid
        assert m.learned_position_embeddings and m.attention_bias and m.mlp_bias, rid


def test_mpt_rows_price_no_rotary_pass(acc, published_runs):
    # learned positions: no rotary on q and k in the layers' memory-bound traffic; the ALiBi reading (which
    # llmplan has no model of) fell back to a rotary pass these runs never ran
    rec = published_runs["mpt-h100_80gb-amp_bf16-1b-s2048-g8-mbs14-gbs112"]
    m, plan = acc.model_for(rec, "mpt"), acc.plan_for(rec, "mpt", 8)
    roped = m.model_copy(update={"learned_position_embeddings": False})
    assert float(elementwise_bytes(m, plan, False)) < float(elementwise_bytes(roped, plan, False))


def test_pure_rows_reduce_in_bf16_and_default_rows_in_fp32(acc, published_runs):
    # Composer's mixed_precision PURE sets FSDP's reduce_dtype to the autocast dtype, DEFAULT to float32
    # (composer/trainer/mosaic_fsdp_utils.py get_mixed_precision at v0.16.4 / v0.17.2; PURE alike in
    # mosaic_fsdp.py at v0.14.1): the May 2023 A100 tables ran PURE, the October 2023 / January 2024 ones DEFAULT
    rows = _mpt_rows(published_runs)
    modes = {rec["parallel"]["fsdp_mixed_precision"] for rec in rows.values()}
    assert modes == {"PURE", "DEFAULT"}
    for rid, rec in rows.items():
        plan = acc.plan_for(rec, "mpt", rec["hardware"]["gpus"])
        pure = rec["parallel"]["fsdp_mixed_precision"] == "PURE"
        assert plan.grad_dtype == ("bf16" if pure else "fp32"), rid


def test_pure_reduction_moves_half_the_bytes(acc, published_runs):
    # the reduce-scatter of a PURE row carries 2 bytes per gradient, a DEFAULT row's 4 (property: the same row
    # read both ways; nothing else in the plan changes)
    rec = published_runs["mpt-a100_40gb-bf16-13b-s2048-g16-mbs10-gbs160"]
    plan = acc.plan_for(rec, "mpt", 16)
    assert plan.grad_bytes == 2.0
    assert plan.model_copy(update={"grad_dtype": "fp32"}).grad_bytes == 2 * plan.grad_bytes
