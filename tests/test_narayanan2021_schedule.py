"""Narayanan et al. 2021 (arXiv:2104.04473, SC'21) as Megatron-LM ran it: Table 1's pipelines interleaved
("In particular, we use the interleaved pipeline schedule with the scatter/gather optimization enabled",
section 5.1). docs/validation.md#narayanan-interleaved."""

from __future__ import annotations

FAMILY = "narayanan2021"
# Table 1, "Achieved teraFLOP/s per GPU", the rows whose pipeline Megatron-LM of April 2021 could interleave
# (megatron/arguments.py at 50a4b5fa02: "pipeline-model-parallel size should be greater than 2 with
# interleaved schedule"): 76.1B pp4, 145.6B pp8, 310.1B pp16, 529.6B pp35, 1008B pp64
TABLE1_INTERLEAVED = {"narayanan2021-t1-76.1b": 140.0, "narayanan2021-t1-145.6b": 148.0,
                      "narayanan2021-t1-310.1b": 155.0, "narayanan2021-t1-529.6b": 163.0,
                      "narayanan2021-t1-1008b": 163.0}


def _plan(acc, rec):
    return acc.plan_for(rec, FAMILY, rec["hardware"]["gpus"])


def test_table1_batches_allow_the_interleaved_schedule(published_runs):
    # Megatron-LM's interleaved schedule asserts that the micro-batches per pipeline are a multiple of PP
    # (training.py at 50a4b5fa02); every Table 1 row with PP > 2 meets it at micro-batch 1 (the 2,160 and 2,520
    # batches are what make 144 = 9 x 16 and 280 = 8 x 35)
    for rid in TABLE1_INTERLEAVED:
        par = published_runs[rid]["parallel"]
        assert par["global_batch"] % (par["dp"] * par["pp"]) == 0, rid


def test_table1_pipelines_interleave_one_layer_per_virtual_stage(published_runs, acc):
    for rid, rec in published_runs.items():
        if not rid.startswith("narayanan2021-") or "-oom" in rid:
            continue
        plan = _plan(acc, rec)
        layers = rec["model"]["layers"]
        if rid in TABLE1_INTERLEAVED:
            assert plan.vpp == layers // plan.pp and plan.vpp > 1, rid
        else:  # Table 1's pp 1-2 rows and Table 2 (section 5.2 names no schedule)
            assert plan.vpp == 1, rid


def test_interleaved_table1_rows_within_5_percent_of_the_published_rate(published_runs, acc):
    # Table 1 (arXiv:2104.04473); read without interleaving they were 7.3-7.8% slow (145.6B, 529.6B, 1T)
    errs = {rid: p / meas - 1 for rid, meas in TABLE1_INTERLEAVED.items()
            for (q, p, m) in acc.predict(published_runs[rid], FAMILY) if q == "hw TFLOP/s" and m == meas}
    assert len(errs) == len(TABLE1_INTERLEAVED)
    assert max(abs(e) for e in errs.values()) < 0.05, errs
