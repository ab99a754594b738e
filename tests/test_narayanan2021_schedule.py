"""Narayanan et al. 2021 (arXiv:2104.04473, SC'21) as Megatron-LM ran it: Table 1 with the settings of the
authors' artifact scripts (NVIDIA/Megatron-LM examples/sc21/run_table_1.sh at 6985e58938, the commit the
directory's README names for replicating the results). docs/validation.md#sc21-rows, #narayanan-interleaved."""

from __future__ import annotations

FAMILY = "narayanan2021"
# run_table_1.sh at 6985e58938, per MODEL_SIZE: MBS, layers / --num-layers-per-virtual-pipeline-stage (virtual
# stages a rank: none where the flag is absent) and --DDP-impl (torch: overlapped with the last backward)
SC21_TABLE1 = {
    "narayanan2021-t1-1.7b": (16, 1, "torch"),    # TP1 PP1 MBS=16 GBS=512, NLS=24
    "narayanan2021-t1-3.6b": (16, 1, "torch"),    # TP2 PP1 MBS=16 GBS=512, NLS=30
    "narayanan2021-t1-7.5b": (16, 1, "torch"),    # TP4 PP1 MBS=16 GBS=512, NLS=36
    "narayanan2021-t1-18.4b": (8, 1, "torch"),    # TP8 PP1 MBS=8 GBS=1024, NLS=40
    "narayanan2021-t1-39.1b": (4, 1, "local"),    # TP8 PP2 MBS=4 GBS=1536, NLS=48
    "narayanan2021-t1-76.1b": (2, 3, "local"),    # TP8 PP4 MBS=2 GBS=1792, NLS=60, 5 layers a virtual stage
    "narayanan2021-t1-145.6b": (2, 2, "local"),   # TP8 PP8 MBS=2 GBS=2304, NLS=80, 5 layers a virtual stage
    "narayanan2021-t1-310.1b": (1, 2, "local"),   # TP8 PP16 MBS=1 GBS=2160, NLS=96, 3 layers a virtual stage
    "narayanan2021-t1-529.6b": (1, 3, "local"),   # TP8 PP35 MBS=1 GBS=2520, NLS=105, 1 layer a virtual stage
    "narayanan2021-t1-1008b": (1, 2, "local"),    # TP8 PP64 MBS=1 GBS=3072, NLS=128, no flag: see below
}
# The one row where the script and the paper disagree: run_table_1.sh (de7dc40f88 .. 4d1c207597) gives the 1T row no
# --num-layers-per-virtual-pipeline-stage, while section 5.1 of the paper, above Table 1, says the runs used "the
# interleaved pipeline schedule with the scatter/gather optimization enabled"; the paper, which describes the
# measured runs, is read, at the only size 2 layers a stage allow (1 layer a virtual stage: v = 2)
PAPER_INTERLEAVED = {"narayanan2021-t1-1008b": 163.0}
# Table 1, "Achieved teraFLOP/s per GPU", of the rows the script interleaves
TABLE1_INTERLEAVED = {"narayanan2021-t1-76.1b": 140.0, "narayanan2021-t1-145.6b": 148.0,
                      "narayanan2021-t1-310.1b": 155.0, "narayanan2021-t1-529.6b": 163.0}


def _plan(acc, rec):
    return acc.plan_for(rec, FAMILY, rec["hardware"]["gpus"])


def test_table1_rows_run_the_artifact_scripts_settings(published_runs, acc):
    for rid, (mb, vpp, ddp) in SC21_TABLE1.items():
        plan = _plan(acc, published_runs[rid])
        assert (plan.micro_batch, plan.vpp, plan.recompute) == (mb, vpp, "full"), rid
        assert plan.overlap_grad_reduce == (ddp == "torch"), rid


def test_table1_batches_allow_the_interleaved_schedule(published_runs, acc):
    # Megatron-LM's interleaved schedule asserts that the micro-batches per pipeline are a multiple of PP
    # (megatron/training.py train_step) and PP > 2 (megatron/arguments.py, at 50a4b5fa02 and 6985e58938); the
    # batches meet it: 28, 48, 144, 280, 512 over PP 4, 8, 16, 35, 64
    for rid in {**TABLE1_INTERLEAVED, **PAPER_INTERLEAVED}:
        plan = _plan(acc, published_runs[rid])
        assert plan.global_batch % (plan.dp * plan.micro_batch * plan.pp) == 0, rid


def test_only_the_script_and_paper_interleaved_rows_interleave(published_runs, acc):
    for rid, rec in published_runs.items():
        if not rid.startswith("narayanan2021-") or "-oom" in rid:
            continue
        plan = _plan(acc, rec)
        if rid in TABLE1_INTERLEAVED or rid in PAPER_INTERLEAVED:
            assert plan.vpp == SC21_TABLE1[rid][1] and plan.vpp > 1, rid
        else:  # Table 1's 39.1B row (PP 2: no interleaving), Table 2 (section 5.2 names no schedule)
            assert plan.vpp == 1, rid


def test_interleaved_table1_rows_within_5_percent_of_the_published_rate(published_runs, acc):
    # Table 1 (arXiv:2104.04473), "Achieved teraFLOP/s per GPU" of the interleaved rows; read without
    # interleaving the 145.6B and 529.6B rows were 7.3-7.8% slow (docs/validation.md#narayanan-interleaved), the
    # 1T row 7.4% (docs/validation.md#nar-mbs)
    rows = {**TABLE1_INTERLEAVED, **PAPER_INTERLEAVED}
    errs = {rid: p / meas - 1 for rid, meas in rows.items()
            for (q, p, m) in acc.predict(published_runs[rid], FAMILY) if q == "hw TFLOP/s" and m == meas}
    assert len(errs) == len(rows)
    assert max(abs(e) for e in errs.values()) < 0.05, errs
