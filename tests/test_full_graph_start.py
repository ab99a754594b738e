"""The start of a step under a full-iteration CUDA graph (cuda_graphs "full-iteration", docs/formulas.md#step.host_sync):
Megatron-Core's FullCudaGraphWrapper (NVIDIA/Megatron-LM megatron/core/full_cuda_graph.py at d98e8a6) replays the
whole forward-backward with one launch; it launches no layer's kernels one by one, so its step starts with that
launch, not with the first layer's. Its static input copies (data_read) are issued while the GPU runs the previous
step's optimizer update, after the gradient norm's read (megatron/core/optimizer/clip_grads.py .item()): unpriced."""

from __future__ import annotations

import pytest

from llmplan.cost.overhead import KERNEL_LAUNCH_S, host_seconds
from llmplan.estimate import estimate_training
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M, S = builtin_models(), builtin_systems()


@pytest.mark.parametrize(("pp", "vpp", "gbs"), [(1, 1, 8), (1, 1, 64), (4, 2, 64)])
def test_full_iteration_start_is_one_replay(pp, vpp, gbs):
    plan = ParallelPlan(tp=1, pp=pp, vpp=vpp, dp=8 // pp, global_batch=gbs // pp, seq_len=4096,
                        cuda_graphs="full-iteration")
    # the GPU's per micro-batch work (1 s) hides every queued launch: what is left is the start
    assert float(host_seconds(plan, 32, 1.0, 0)) == pytest.approx(KERNEL_LAUNCH_S, rel=1e-12)


def test_full_iteration_starts_sooner_than_per_layer_graphs():
    # the same GPU work (no dropout, no MoE: nothing else that the two graphs price apart): one replay against a
    # graphed layer's launches at the start, nothing queued after it
    m = M["llama-3.1-8b"]
    cluster = ClusterSpec(system=S["dgx-h100"], num_nodes=1)
    host = {g: float(estimate_training(m, cluster, ParallelPlan(tp=2, dp=4, global_batch=64, seq_len=4096,
                                                                  cuda_graphs=g)).time.overheads["host"])
            for g in ("layers", "full-iteration")}
    assert host["full-iteration"] == pytest.approx(KERNEL_LAUNCH_S, rel=1e-9)
    assert host["full-iteration"] < host["layers"]
