"""Hybrid sharding's collectives across the replicas run once a step (docs/formulas.md#step.hsdp_outer), also where
the shard group's ZeRO-3 collectives run every micro-batch: Megatron-FSDP reduces across DP-Outer only in the last
micro-batch's backward (NVIDIA/Megatron-LM d98e8a64dd megatron/core/distributed/fsdp/src/megatron_fsdp/
param_and_grad_buffer.py: the "DP-Outer Gradient Reduction" under outer_fsdp_group_grad_reduce, bucket by bucket
on its own stream after the DP-Shard reduce-scatter) and gathers across it in the first micro-batch's forward
(megatron_fsdp.py: outer_fsdp_group_param_gather while microbatch_count == 0).

So they hide behind one backward and one forward, as ZeRO-1's once-a-step reduce-scatter and gather do, not
behind every micro-batch's. The check: ZeRO-3 with a shard group of one rank (dp_replicate = dp) and the
optimizer sharded across the replicas is ZeRO-1 by another road: the weights and gradients whole on every rank,
the optimizer sharded over dp, one reduce-scatter of the gradients and one all-gather of the updated weights a
step over the same dp ranks (Rajbhandari et al. 2020, arXiv:1910.02054 §5.1 / §7: P_os moves 2Ψ a step like
plain data parallelism). Before, the replicas' reduce-scatter was spread over the 16 micro-batches' backwards
and that plan priced 357 tok/s per GPU against ZeRO-1's 263 (llama-3.1-70b tp8 on Jean Zay's A100s)."""

from __future__ import annotations

import pytest

from llmplan.cost.comm import comm_seconds
from llmplan.estimate import estimate_training
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

TOLERANCE = 0.01
"""The two differ only in the buckets: Megatron-Core's distributed optimizer reduces ZeRO-1's gradients in
max(40M, 1M x dp)-parameter buckets, the replicas' reduce-scatter here is one call (Megatron-FSDP's units are not
split further by llmplan), so one edge bucket of different size is exposed; and Megatron-FSDP's memory terms."""


@pytest.mark.parametrize("nodes", [2, 4, 8])
def test_a_one_rank_shard_group_with_the_optimizer_across_prices_as_zero1(nodes):
    m, c = builtin_models()["llama-3.1-70b"], ClusterSpec(system=builtin_systems()["jean-zay-a100"], num_nodes=nodes)
    base = dict(tp=8, dp=nodes, micro_batch=1, global_batch=16 * nodes, seq_len=4096)
    zero1 = ParallelPlan(**base, zero=1)
    hfsdp = ParallelPlan(**base, zero=3, dp_replicate=nodes, dp_outer_optimizer=True)
    assert not check_plan(m, zero1, c) and not check_plan(m, hfsdp, c)
    a, b = estimate_training(m, c, zero1), estimate_training(m, c, hfsdp)
    assert b.comm.axes["dp"].seconds == pytest.approx(a.comm.axes["dp"].seconds, rel=TOLERANCE)  # the same bytes
    assert b.time.exposed["dp"] == pytest.approx(a.time.exposed["dp"], rel=TOLERANCE)
    assert b.time.total == pytest.approx(a.time.total, rel=TOLERANCE)


def test_the_replicas_reduction_hides_behind_one_backward_not_every_micro_batchs():
    # 16 micro-batches a step: the replicas' reduce-scatter of the whole 8.8B-parameter shard (Omni-Path, 4 nodes)
    # takes far longer than one micro-batch's backward, so nearly all of it is exposed
    m, c = builtin_models()["llama-3.1-70b"], ClusterSpec(system=builtin_systems()["jean-zay-a100"], num_nodes=4)
    p = ParallelPlan(tp=8, dp=4, micro_batch=1, global_batch=64, seq_len=4096, zero=3, dp_replicate=4,
                     dp_outer_optimizer=True)
    e = estimate_training(m, c, p)
    dp = e.comm.axes["dp"].seconds
    assert e.time.exposed["dp"] > 0.9 * dp


def _dp_calls(e, collective, outer):
    return sum(t.calls for t in e.comm.axes["dp"].transfers if t.collective == collective and t.outer == outer)


@pytest.mark.parametrize("n", [1, 4])
def test_fsdp2_hsdp_all_reduces_across_the_replicas_every_micro_batch(n):
    # PyTorch FSDP2 (torchtitan's HSDP): each post_backward runs foreach_reduce, the reduce-scatter over the shard
    # group and, with all_reduce_grads (True unless set_requires_all_reduce(False)), the all-reduce of its output
    # over the replicate group (pytorch/pytorch 002a76fbf torch/distributed/fsdp/_fully_shard/
    # _fsdp_param_group.py); torchtitan 1fdf90d / v0.2.2 train_step never turn it off between micro-batches. So
    # per step: n x units reduce-scatters and n x units all-reduces, none of them in the once-a-step windows.
    m, c = builtin_models()["llama-3.1-8b"], ClusterSpec(system=builtin_systems()["jean-zay-a100"], num_nodes=2)
    p = ParallelPlan(tp=1, dp=16, micro_batch=1, global_batch=16 * n, seq_len=2048, zero=3, dp_replicate=2)
    assert not check_plan(m, p, c)
    e = estimate_training(m, c, p)
    # one call a unit (docs/formulas.md#comm.zero3_unit: 32 layers and the root unit): n x 33 a step
    units = m.num_hidden_layers + 1
    assert _dp_calls(e, "reduce-scatter", False) == n * units
    assert _dp_calls(e, "all-reduce", False) == n * units
    assert _dp_calls(e, "all-reduce", True) == 0
    assert comm_seconds(e.comm, c.system).dp_outer_reduce == 0.0  # nothing in the once-a-step windows


def test_megatron_fsdp_hsdp_all_reduces_across_the_replicas_once_a_step():
    # Megatron-FSDP (outer no_shard): the DP-Outer all-reduce only in the last micro-batch (step.hsdp_outer)
    m, c = builtin_models()["llama-3.1-8b"], ClusterSpec(system=builtin_systems()["jean-zay-a100"], num_nodes=2)
    p = ParallelPlan(tp=1, dp=16, micro_batch=1, global_batch=64, seq_len=2048, zero=3, dp_replicate=2,
                     megatron_fsdp=True)
    assert not check_plan(m, p, c)
    e = estimate_training(m, c, p)
    units = m.num_hidden_layers + 1  # one call a unit and micro-batch (docs/formulas.md#comm.zero3_unit)
    assert _dp_calls(e, "reduce-scatter", False) == 4 * units  # the shard group's, every micro-batch
    assert _dp_calls(e, "all-reduce", True) == units  # the replicas', once a step (one per unit's bucket group)
    assert _dp_calls(e, "all-reduce", False) == 0


@pytest.mark.parametrize("megatron_fsdp", [False, True])
@pytest.mark.parametrize("zero", [2, 3])
def test_the_search_prices_the_replicas_reduction_as_the_estimate(megatron_fsdp, zero):
    from llmplan.search.evaluate import evaluate
    from llmplan.search.grid import from_plan
    m, c = builtin_models()["llama-3.1-8b"], ClusterSpec(system=builtin_systems()["jean-zay-a100"], num_nodes=2)
    p = ParallelPlan(tp=1, dp=16, micro_batch=1, global_batch=64, seq_len=2048, zero=zero, dp_replicate=2,
                     megatron_fsdp=megatron_fsdp)
    assert not check_plan(m, p, c), check_plan(m, p, c)
    vec, scalar = evaluate(m, c, from_plan(p)), estimate_training(m, c, p)
    assert float(vec.step.total[0]) == pytest.approx(float(scalar.time.total), rel=1e-9)
