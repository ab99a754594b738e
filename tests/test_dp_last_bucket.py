"""The DP bucket reduced last and gathered first holds the first stage's word embedding whole (issue 32):
Megatron-Core fills its buckets with whole parameters in reverse registration order and closes one only once it
holds bucket_size parameters (NVIDIA/Megatron-LM megatron/core/distributed/param_and_grad_buffer.py at
core_r0.8.0, ParamAndGradBuffer.__init__), so the embedding, registered first and made last by the backward,
sits in the last bucket, which is V·h / t parameters at least. docs/formulas.md#step.dp_last_bucket"""

from __future__ import annotations

import pytest
from hypothesis import given, settings, seed
from hypothesis import strategies as st

from llmplan.cost.comm import comm_seconds
from llmplan.cost.exposure import bucket_params, bucket_share
from llmplan.cost.params import word_embedding_on_rank
from llmplan.estimate import estimate_training
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M, S = builtin_models(), builtin_systems()
H100 = S["dgx-h100"]


def test_embedding_bucket_is_exposed_whole_on_a_tp1_plan():
    # Llama 3.1 8B at TP1 DP8: the embedding is 128,256 x 4,096 = 525M parameters, 13x the 40M bucket; its
    # reduction starts when the backward is over and its gather must end before the forward starts.
    m = M["llama-3.1-8b"]
    plan = ParallelPlan(tp=1, pp=1, dp=8, zero=1, global_batch=64, seq_len=4096)
    emb = float(word_embedding_on_rank(m, plan, 0))
    assert emb == 128256 * 4096  # hand count: V·h / t (128,256 = 1,002 x 128: no padding)
    e = estimate_training(m, ClusterSpec(system=H100, num_nodes=1), plan)
    p = float(e.memory.params_on_rank)
    share = float(bucket_share(plan, p, emb))
    assert share == pytest.approx(emb / p) and share > 10 * float(bucket_share(plan, p))
    cs = comm_seconds(e.comm, H100)
    assert float(e.time.exposed["dp"]) >= share * (cs.dp_reduce + cs.dp_gather) * (1 - 1e-9)


def test_only_the_first_stage_holds_the_embedding():
    m = M["llama-3.1-70b"]
    plan = ParallelPlan(tp=8, pp=4, dp=8, global_batch=256, seq_len=4096)
    # Megatron pads the vocabulary to a multiple of 128 x tp (megatron/training/vocab_utils.py): 128,256 rows
    # to 129,024 (126 x 1,024), the rows the rank's embedding shard holds.
    assert float(word_embedding_on_rank(m, plan, 0)) == pytest.approx(129024 * 8192 / 8)
    assert [float(word_embedding_on_rank(m, plan, s)) for s in (1, 2, 3)] == [0.0, 0.0, 0.0]


@seed(8)
@settings(max_examples=60, deadline=None)
@given(params=st.floats(1e6, 1e11), last=st.floats(0, 2e10), dp=st.integers(1, 512))
def test_last_bucket_is_one_bucket_or_the_embedding_whichever_is_larger(params: float, last: float, dp: int) -> None:
    plan = ParallelPlan(dp=dp, global_batch=dp, seq_len=2048)
    share = float(bucket_share(plan, params, last))
    assert share >= float(bucket_share(plan, params)) - 1e-12  # never smaller than one bucket
    assert share <= 1.0
    if last <= float(bucket_params(plan)):
        assert share == pytest.approx(float(bucket_share(plan, params)))
    else:
        assert share == pytest.approx(min(1.0, last / params))
