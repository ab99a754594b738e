"""The framework key of a plan's interval regime: Megatron-style stacks shard at most the optimizer states
(the distributed optimizer, ZeRO-1); gradients or weights sharded over data parallelism (ZeRO-2/3) are the
FSDP-style stacks, whether or not check_switches.settle has cleared the fp32-shard flag (below ZeRO-3)."""

from __future__ import annotations

import pytest

from llmplan.intervals.regimes import framework
from llmplan.specs.plan import ParallelPlan


@pytest.mark.parametrize("plan, expected", [
    (ParallelPlan(dp=8, zero=1), "megatron"),
    (ParallelPlan(dp=8, zero=0), "megatron"),
    (ParallelPlan(dp=8, zero=2), "fsdp"),  # llm-foundry's SHARD_GRAD_OP, fp32_param_shards cleared
    (ParallelPlan(dp=8, zero=3), "fsdp"),
    (ParallelPlan(dp=8, zero=3, fp32_param_shards=True), "fsdp"),
])
def test_zero_2_and_3_are_fsdp_style(plan, expected):
    assert framework(plan) == expected
