"""Golden tests for the Megatron-LM README's A100 weak-scaling table of 2020 (records megatron2020-a100-*):
NVIDIA/Megatron-LM images/tables.tex at 5281919420 (2020-09-11), "DGX-A100 batch size 16" and "batch size
2048" columns, GPT-2-style 1.2B-8.3B, sequence 1024, vocabulary 51,200, hardware TFLOP/s counting the
recompute pass. The table was committed two months before NVIDIA announced the A100 80GB (SC20, 2020-11-16;
AnandTech, "NVIDIA Announces A100 80GB: Ampere Gets HBM2e Memory Upgrade": the first A100 had 40 GB of HBM2
at 1.6 TB/s, the 80GB part 2.0 TB/s), so the runs had A100 40GB GPUs: the records say so and accuracy.py reads
them on dgx-a100-40gb (docs/validation.md#megatron2020-a100-40gb)."""

from __future__ import annotations

import pytest

from llmplan.estimate import estimate_training
from llmplan.specs.registry import builtin_systems

ONE_GPU = "megatron2020-a100-1b-1gpu"  # 1,076 ms, 149.8 TFLOP/s: one A100, no communication at all


def _rows(published_runs: dict) -> dict[str, dict]:
    return {rid: r for rid, r in published_runs.items() if rid.startswith("megatron2020-a100-")}


def test_the_2020_table_runs_on_the_40gb_a100(published_runs, acc):
    rows = _rows(published_runs)
    assert len(rows) == 8
    for rid, rec in rows.items():
        system = builtin_systems()[acc.record_system(rec)]
        assert system.gpu.name == "a100-40gb" and system.gpu.hbm_gb_per_s == 1555, rid


def test_single_a100_row_within_5_percent_of_the_published_rate(published_runs, acc):
    # Megatron-LM README tables.tex at 5281919420: case 1B on one A100, 149.8 TFLOP/s (1,076 ms). No network
    # enters this row, so it tests the on-GPU pricing alone. On the 80GB profile (2,039 GB/s) it read +9.1%.
    (quantity, pred, meas), *_ = acc.predict(published_runs[ONE_GPU], "megatron2020")
    assert quantity == "hw TFLOP/s" and meas == pytest.approx(149.8)
    assert abs(pred / meas - 1) < 0.05


def test_every_row_of_the_table_within_10_percent(published_runs, acc):
    # The same table's 8 A100 rows (1 to 1,024 GPUs); on the 80GB profile they read +8.6% to +14.8%.
    errs = {rid: p / m - 1 for rid, rec in _rows(published_runs).items()
            for (q, p, m) in acc.predict(rec, "megatron2020") if q == "hw TFLOP/s"}
    assert len(errs) == 8
    assert max(abs(e) for e in errs.values()) < 0.10, errs


def test_memory_bound_time_goes_as_the_hbm_bandwidth(published_runs, acc):
    # The same plan on the A100 40GB and 80GB profiles: the GEMMs and attention take the same time, the
    # memory-bound operators and the optimizer step 2,039 / 1,555 times longer on the 40GB part.
    rec = published_runs[ONE_GPU]
    plan, m = acc.plan_for(rec, "megatron2020", 1), acc.model_for(rec, "megatron2020")
    t = {name: estimate_training(m, acc.cluster_of(builtin_systems()[name], 1), plan).time
         for name in ("dgx-a100-40gb", "dgx-a100")}
    small, big = t["dgx-a100-40gb"], t["dgx-a100"]
    assert small.stage.gemm == pytest.approx(big.stage.gemm)
    assert small.stage.attention == pytest.approx(big.stage.attention)
    assert small.stage.memory_bound / big.stage.memory_bound == pytest.approx(2039 / 1555)
    assert small.optimizer / big.optimizer == pytest.approx(2039 / 1555)


def test_the_2020_release_ran_its_fusions_as_opt_in_flags(published_runs, acc):
    # NVIDIA/Megatron-LM megatron/arguments.py at 19301985dd (the merge that carried the table, 2020-09-11):
    # --bias-gelu-fusion, --bias-dropout-fusion and --scaled-upper-triang-masked-softmax-fusion are
    # action='store_true' and neither the README nor examples/*.sh pass them; they default to on only from
    # 9acc895632 (2021-01-06). So the table's bias-dropout-add and softmax ran as eager ops. training.py
    # backward_step zeroes the gradients with set_grads_to_None=True before a single backward per step (no
    # micro-batches, no main_grad): autograd takes the GEMM's gradient as param.grad, no accumulation pass.
    from llmplan.cost.compute import grad_accumulation_bytes
    from llmplan.cost.elementwise import bias_add_bytes

    for rid, rec in _rows(published_runs).items():
        gpus = rec["parallel"].get("tp", 1) * rec["parallel"].get("dp", 1)
        plan, m = acc.plan_for(rec, "megatron2020", gpus), acc.model_for(rec, "megatron2020")
        assert plan.bias_dropout_fusion is False, rid
        assert plan.bias_gelu_fusion is False, rid  # F.gelu(x + bias): --bias-gelu-fusion opt-in too
        assert plan.softmax_kernel == "eager", rid
        assert grad_accumulation_bytes(plan) == 0, rid
        assert plan.micro_batch == plan.global_batch // plan.dp, rid  # one micro-batch a step
        # GPT-2-style layers carry the attention output and fc2 biases, so the unfused add is priced
        assert m.attention_bias and m.mlp_bias and bias_add_bytes(m, plan, False) > 0, rid


def test_the_2021_release_turned_them_on(published_runs, acc):
    # 9acc895632 made them --no-bias-dropout-fusion / --no-masked-softmax-fusion opt-outs: Narayanan et al.
    # 2021's release (50a4b5fa02) runs the fused bias-dropout-add.
    rows = [r for rid, r in published_runs.items() if rid.startswith("narayanan2021")]
    assert rows
    for rec in rows[:3]:
        assert acc.plan_for(rec, "narayanan2021", 8).bias_dropout_fusion is True
