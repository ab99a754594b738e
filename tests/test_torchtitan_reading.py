"""How benchmarks/accuracy.py reads torchtitan's December 2024 runs (torch 1963fc8, torchtitan 9dec370): the
pipeline rows' FSDP reduce-scatter after the stage's last backward, eager rows without fused kernels, and
FlashAttention-2 for every SDPA call, CP included."""

from __future__ import annotations

import pytest

PP = ["torchtitan-2412-t5-llama31-405b-512gpu-1f1b", "torchtitan-2412-t5-llama31-405b-512gpu-interleaved-1f1b",
      "torchtitan-2412-t6-llama31-405b-512gpu-cp2"]
FLAT = ["torchtitan-2412-t1-llama31-8b-8gpu-fsdp", "torchtitan-2412-t2-llama31-8b-8gpu-cp4",
        "torchtitan-2412-t4-llama31-70b-256gpu-2d"]


@pytest.mark.parametrize("rid", PP + FLAT)
def test_pipeline_rows_reduce_after_the_stage_backward(row_plan, rid):
    # torch.distributed.pipelining's stage turns FSDP's gradient sync off for every backward and runs
    # post_backward by hand after the stage's last one (pytorch/pytorch#134052); FSDP2 alone reduce-scatters
    # each layer's gradients as its backward ends
    plan = row_plan(rid)
    assert plan.overlap_grad_reduce is (rid in FLAT)
    assert plan.overlap_param_gather is True


def test_every_row_runs_flash2_and_eager_rows_run_unfused(published_runs, row_plan):
    # torchtitan utils.py at 9dec370 enters sdpa_kernel([FLASH_ATTENTION, EFFICIENT_ATTENTION]) under CP, and
    # SDPA's default order put FLASH first since cuDNN was deprioritised (pytorch/pytorch#138522, #141274)
    for rid, rec in published_runs.items():
        if not rid.startswith("torchtitan-2412-"):
            continue
        plan = row_plan(rid)
        assert plan.attention_kernel == "flash2"
        assert plan.fused_kernels is (rec["parallel"].get("compile") is not False)


def test_exposing_the_stage_reduction_slows_the_pipeline_rows(acc, published_runs):
    # the stage's fp32 gradient reduce-scatter (25 GB a rank at 405B, FSDP 8 across nodes) no longer hides
    # behind the last micro-batch's backward: the 1F1B row runs slower than with the overlap
    rec = published_runs[PP[0]]
    plan = acc.plan_for(rec, "torchtitan", rec["hardware"]["gpus"])
    overlapped = plan.model_copy(update={"overlap_grad_reduce": True})
    system = acc.builtin_systems()[acc.record_system(rec)]
    system = system.model_copy(update={"gpu": system.gpu.at_power_limit(rec["hardware"]["power_limit_w"])})
    cluster = acc.cluster_of(system, rec["hardware"]["gpus"])
    m = acc.model_for(rec, "torchtitan")
    late = acc.estimate_training(m, cluster, plan).time
    early = acc.estimate_training(m, cluster, overlapped).time
    assert late.exposed["dp"] > early.exposed["dp"] + 0.5
    assert late.total > early.total
