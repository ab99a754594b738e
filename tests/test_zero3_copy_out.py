"""FSDP2's all-gather copy-out on the compute stream (ParallelPlan.zero3_copy_out,
docs/formulas.md#step.zero3_copy_out): every gather's bytes read from the flat all-gather buffer and written into
the parameters (pytorch/pytorch torch/distributed/_composable/fsdp/_fsdp_collectives.py,
foreach_all_gather_copy_out)."""

from __future__ import annotations

import pytest

from llmplan.cost.overhead import zero3_copy_out_seconds
from llmplan.specs.hardware import GpuSpec
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_gpus

P = 8.0e9  # parameters on the rank before data-parallel sharding


def _gpu() -> GpuSpec:
    return builtin_gpus()["h100-sxm"]


def test_two_gathers_per_microbatch_without_a_pipeline():
    # forward and the backward's gather (reshard_after_forward), each read from the flat buffer and written
    # into the parameters in bf16: 2 gathers x (2 + 2) bytes a parameter per micro-batch
    gpu = _gpu()
    plan = ParallelPlan(dp=8, zero=3, micro_batch=1, global_batch=16, seq_len=8192, zero3_copy_out=True)
    assert plan.num_microbatches == 2
    want = 2 * 2 * 2 * 2.0 * P / gpu.hbm_achieved_bytes_per_s
    assert zero3_copy_out_seconds(plan, P, gpu) == pytest.approx(want)


def test_one_gather_per_step_with_a_pipeline():
    # torchtitan 9dec370: reshard_after_forward = not pp_enabled, the weights stay gathered across micro-batches
    gpu = _gpu()
    plan = ParallelPlan(dp=8, pp=2, zero=3, micro_batch=1, global_batch=64, seq_len=8192, zero3_copy_out=True)
    assert zero3_copy_out_seconds(plan, P, gpu) == pytest.approx(2 * 2.0 * P / gpu.hbm_achieved_bytes_per_s)


def test_nothing_without_fsdp2_or_sharding():
    gpu = _gpu()
    base = dict(micro_batch=1, global_batch=16, seq_len=8192)
    assert zero3_copy_out_seconds(ParallelPlan(dp=8, zero=3, **base), P, gpu) == 0  # FSDP1 / Megatron buffers
    assert zero3_copy_out_seconds(ParallelPlan(dp=8, zero=1, zero3_copy_out=True, **base), P, gpu) == 0
    one = dict(base, global_batch=2)
    assert zero3_copy_out_seconds(ParallelPlan(dp=1, zero=3, zero3_copy_out=True, **one), P, gpu) == 0


def test_it_is_part_of_the_step_overhead(acc, published_runs):
    # the torchtitan and AutoModel rows read it (FSDP2), and it is one of the overhead's parts
    rec = published_runs["torchtitan-2412-t1-llama31-8b-8gpu-fsdp-compile"]
    plan = acc.plan_for(rec, "torchtitan", 8)
    assert plan.zero3_copy_out and not acc.plan_for(rec, "mpt", 8).zero3_copy_out
    from llmplan.estimate import estimate_training
    system = acc.builtin_systems()[acc.record_system(rec)]
    e = estimate_training(acc.model_for(rec, "torchtitan"), acc.cluster_of(system, 8), plan)
    assert e.time.overheads["zero3_copy_out"] > 0
    assert sum(e.time.overheads.values()) == pytest.approx(e.time.overhead)


def test_the_text_report_names_the_copy_out():
    # a plan file with zero3_copy_out reaches the step-time table as its own row (report layer: OVERHEAD_ROWS)
    import io

    from rich.console import Console

    from llmplan.estimate import estimate_training
    from llmplan.report.training import time_table
    from llmplan.specs.plan import ClusterSpec
    from llmplan.specs.registry import builtin_models, builtin_systems

    plan = ParallelPlan(dp=8, zero=3, micro_batch=1, global_batch=16, seq_len=4096, zero3_copy_out=True)
    cluster = ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=1)
    e = estimate_training(builtin_models()["llama-3.1-8b"], cluster, plan)
    out = io.StringIO()
    Console(file=out, width=80).print(time_table(e))
    assert "FSDP2 all-gather copy-out" in out.getvalue() and "step.zero3_copy_out" in out.getvalue()
