"""The DP weight gather of Megatron-Core's DDP when the first model chunk is one bucket (docs/formulas.md#comm.dp_bucket,
#step.dp_one_bucket, #step.dp_optstep_gather; docs/validation.md#gather-bucket).

Sources (NVIDIA/Megatron-LM at 14346b65a, the submodule pin of Megatron-Bridge 79308d0d9, the DeepSeek-V3 H100 card):
- megatron/core/distributed/distributed_data_parallel.py DistributedDataParallel.__init__ lines 70-72: "Set
  bucket_size to infinity if overlap_grad_reduce is False" (bucket_size = None): one bucket per buffer and chunk.
- megatron/core/distributed/param_and_grad_buffer.py _ParamAndGradBucketGroup.start_param_sync: one all-gather per
  bucket of the group inside one _coalescing_manager, async only under overlap_param_gather; partition_buckets
  (no fp8 buffer: one bucket per group), so the gather runs over the reduction's buckets either way.
- megatron/core/pipeline_parallel/schedules.py lines 1201-1203: the interleaved schedule dispatches the first two
  chunks' gathers before the first forward; finish_param_sync (the forward pre-hook) waits on the chunk's handle.
- megatron/training/models/dist_utils.py: disable_bucketing = (model_chunk_idx > 0) or
  overlap_param_gather_with_optimizer_step.
- megatron/training/arguments.py validate_args: --overlap-param-gather asserts --overlap-grad-reduce;
  megatron/core/optimizer/__init__.py get_megatron_optimizer reads no DP overlap for the flag. Megatron-Bridge
  (79308d0d9 perf_recipes/deepseek/h100/deepseek_v3.py lines 45-51) sets overlap_grad_reduce False and then the flag.
Hand values are computed in the docstrings, not by the code under test; exact arithmetic (tolerance 1e-12).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from llmplan.cost.compute import StageCompute
from llmplan.cost.exposure import CommSeconds, dp_exposed_per_step
from llmplan.estimate import estimate_training
from llmplan.export import bridge, megatron
from llmplan.planfile import load_plan
from llmplan.search.grid import Workload, default_space, enumerate_plans
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec
from llmplan.specs.registry import builtin_models, builtin_systems
from agreement import assert_arrays_agree, valid_sample

PLANS = Path(__file__).parent / "data" / "plans"


def _dense(**update):
    """tests/data/plans/dense_train.json (pp 4, vpp 5, zero 1, dp 2, both overlaps on) with `update` on its plan."""
    pf = load_plan(PLANS / "dense_train.json")
    return dataclasses.replace(pf, plan=pf.plan.model_copy(update=update))


def _exposed(plan, optimizer_s=0.0):
    """A step's gather of 1.0 s and no reduction, beside 10 s of forward (30 s a micro-batch), kappa 0.1, on a
    rank of 1e9 parameters (bucket share 40e6 / 1e9 = 0.04 at dp 2: max(40M, 2M))."""
    comm = CommSeconds(tp=0.0, pp=0.0, cp=0.0, ep=0.0, dp_reduce=0.0, dp_gather=1.0)
    sc = StageCompute(gemm=30.0, attention=0.0, memory_bound=0.0, forward=10.0)
    return float(dp_exposed_per_step(plan, comm, sc, 0.1, 1e9, 0.0, optimizer_s))


def test_first_chunk_gather_waits_whole_without_the_gradient_overlap():
    """vpp 5, pp 4, forward 10 s: w = 10/5 = 2 s a chunk pass. Both overlaps on: the first bucket, 0.04 s, waits;
    the other 0.96 s hide in min(0.96 x 4/5 + 2, (4 x 4 + 1) x 2) = 2.768 s -> 0.1 x 0.96 = 0.096; 0.136 s.
    overlap_grad_reduce off (bucket_size None): the first chunk, 1/5 of the gather = 0.2 s, waits whole; the other
    0.8 s hide in min(0.8 x 4/5 + 2, 34) = 2.64 s -> 0.08; 0.28 s."""
    assert _exposed(_dense().plan) == pytest.approx(0.136, abs=1e-12)
    assert _exposed(_dense(overlap_grad_reduce=False).plan) == pytest.approx(0.28, abs=1e-12)


def test_optstep_acts_without_the_gradient_overlap():
    """overlap_grad_reduce off and overlap_param_gather_with_optimizer_step on (the DeepSeek-V3 H100 card): the first
    chunk's 0.2 s beside the other chunks' step, 0.5 s x 4/5 = 0.4 s -> 0.1 x 0.2 = 0.02 s, + 0.08 s as above = 0.10 s.
    check_plan accepts the plan (Megatron-Core asks the distributed optimizer, the gather overlap and vpp > 1)."""
    pf = _dense(overlap_grad_reduce=False, overlap_param_gather_with_optimizer_step=True)
    assert not [v for v in check_plan(pf.model, pf.plan) if v.rule == "param_gather_optstep_interleaved"]
    assert _exposed(pf.plan, optimizer_s=0.5) == pytest.approx(0.10, abs=1e-12)


def _dp_calls(pf):
    """{(collective, group axis): calls} of the step's DP transfers of stage 0."""
    e = estimate_training(pf.model, pf.cluster, pf.plan)
    return {(t.collective, t.group.axis): int(t.calls) for t in e.comm.axes["dp"].transfers if t.calls}


def test_gather_runs_over_the_reduction_buckets():
    """One bucket layout for both collectives. overlap_grad_reduce off: one bucket per chunk, vpp = 5 calls of each
    (also with the gather overlap on). overlap_param_gather off, overlap_grad_reduce on: the gather still runs per
    bucket (start_param_sync loops the bucket groups), as many calls as the reduce-scatter, more than 5."""
    off = _dp_calls(_dense(overlap_grad_reduce=False))
    assert off and set(off.values()) == {5}
    on = _dp_calls(_dense(overlap_param_gather=False))
    assert any(coll == "all-gather" for coll, _ in on)  # the loop below checks something
    for (coll, axis), calls in on.items():
        if coll == "all-gather":
            assert calls == on[("reduce-scatter", axis)] and calls > 5


def test_exports():
    """Megatron-LM: --overlap-param-gather asserts --overlap-grad-reduce in validate_args, so neither it nor the
    optimizer-step flag is written without it; Megatron-Bridge (no validate_args) writes both, as the card ran."""
    pf = _dense(overlap_grad_reduce=False, overlap_param_gather_with_optimizer_step=True)
    flags = megatron.parallel_flags(pf)
    assert "--overlap-param-gather" not in flags and "--overlap-param-gather-with-optimizer-step" not in flags
    ov = bridge.overrides(pf)
    assert ("ddp.overlap_param_gather", True) in ov and ("ddp.overlap_grad_reduce", False) in ov
    assert ("optimizer.overlap_param_gather_with_optimizer_step", True) in ov
    assert "--overlap-param-gather-with-optimizer-step" in megatron.parallel_flags(
        _dense(overlap_param_gather_with_optimizer_step=True))


def test_card_reads_the_flag():
    """The DeepSeek-V3 H100 card's record carries the recipe's overlap_param_gather_with_optimizer_step
    (perf_recipes/deepseek/h100/deepseek_v3.py line 51 at 79308d0d9) with overlap_grad_reduce False: the plan the
    reader builds has both, and check_plan accepts it."""
    import accuracy  # benchmarks/accuracy.py (conftest puts benchmarks/ on the path)
    import yaml

    runs = yaml.safe_load(accuracy.DEFAULT_RUNS.read_text())
    rec = next(r for r in runs if r["id"] == "bridgecard-h100-bf16-deepseek-v3-1024gpu-gbs16384")
    model, cluster, plan = accuracy.record_setup(rec, "bridgecard", None)
    assert plan.overlap_param_gather_with_optimizer_step and not plan.overlap_grad_reduce and plan.vpp == 4
    assert not [v for v in check_plan(model, plan, cluster) if v.rule == "param_gather_optstep_interleaved"]


@pytest.mark.parametrize("optstep", [False, True])
def test_vectorised_search_agrees_without_the_gradient_overlap(optstep):
    m, cluster = builtin_models()["llama-3.1-70b"], ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=8)
    w = Workload(global_batch=256, seq_len=4096, overlap_grad_reduce=False,
                 overlap_param_gather_with_optimizer_step=optstep)
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    idx = valid_sample(m, cluster, plans, 7, 400, 12, keep=lambda p: p.zero == 1 and p.vpp > 1)
    assert_arrays_agree(m, cluster, plans, idx)
    assert np.all(np.asarray([plans.plan(i).overlap_grad_reduce for i in idx]) == False)  # noqa: E712
