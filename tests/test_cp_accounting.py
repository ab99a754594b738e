"""What context parallelism charges a rank, checked against how Megatron-LM and Transformer Engine split the work
(issue 32: NVIDIA's short-sequence CP rows, docs/validation.md#cpslow).

- Load balancing: Megatron-LM cuts each sequence into 2·cp chunks and rank r holds chunks r and 2cp - 1 - r
  (megatron/training/utils.py get_batch_on_this_cp_rank); Transformer Engine's p2p ring then runs, per layer, one
  causal call on the rank's own two chunks and cp - 1 unmasked calls on half of them (AttnFuncWithCPAndKVP2P,
  transformer_engine/pytorch/attention.py at v1.8). Every rank thus computes 1/cp of the causal tiles, its 2n
  diagonal tiles computed whole as the cp = 1 call computes its N = 2n·cp.
- The gradient reduction: Megatron-Core's DistributedDataParallel reduces over the data-parallel group with the
  context-parallel ranks in it (parallel_state.get_data_parallel_group(with_context_parallel=True),
  megatron/core/distributed/distributed_data_parallel.py at core_r0.8.0), and the distributed optimizer shards
  over the same dp x cp ranks.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.attention_rate import ATTENTION_TILE, attention_rate_ratio
from llmplan.estimate import estimate_training
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M = builtin_models()
S = builtin_systems()
H100 = S["dgx-h100"].gpu


@settings(max_examples=80, deadline=None, derandomize=True)
@given(st.sampled_from(["llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b"]), st.sampled_from([1, 2, 4, 8]),
       st.sampled_from([2, 4, 8, 16, 32]), st.sampled_from([1, 2]), st.integers(1, 64))
def test_each_rank_computes_one_cp_th_of_the_causal_tiles(name, tp, cp, b, chunk_tiles):
    # With no per-CTA fixed work and one SM a call's time is its tile count, so the rate over the asymptote is
    # the useful (query, key) tiles over the tiles computed. A rank's ring (one causal call on its 2c x 2c, cp - 1
    # half calls of 2c x c or c x 2c) must compute exactly 1/cp of the whole causal call's tiles, its diagonal
    # tiles whole: the same ratio as one causal call over s, N / (N + 1) with N = s / 128 tiles.
    m = M[name]
    s = 2 * cp * ATTENTION_TILE * chunk_tiles
    one_sm = H100.model_copy(update={"sm_count": 1})
    ring = float(attention_rate_ratio(m, ParallelPlan(tp=tp, cp=cp, seq_len=s, micro_batch=b), one_sm, (0.0, 0.0)))
    whole = float(attention_rate_ratio(m, ParallelPlan(tp=tp, cp=1, seq_len=s, micro_batch=b), one_sm, (0.0, 0.0)))
    n_tiles = s / ATTENTION_TILE
    assert whole == pytest.approx(n_tiles / (n_tiles + 1), rel=1e-12)
    assert ring == pytest.approx(whole, rel=1e-12)


@pytest.mark.parametrize("name, tp, nodes", [("llama-3.1-8b", 1, 1), ("llama-3.1-70b", 4, 2)])
def test_gradient_reduction_spans_dp_times_cp(name, tp, nodes):
    # The same GPUs as cp2 x dp or cp1 x 2dp: the gradient reduce-scatter and parameter all-gather run over the
    # same dp x cp ranks with the same messages, so their bytes and seconds are equal; the optimizer's shard is the
    # same (the distributed optimizer shards over dp x cp).
    m = M[name]
    cluster = ClusterSpec(system=S["dgx-h100"], num_nodes=nodes)
    replicas = 8 * nodes // tp

    def run(cp: int):
        plan = ParallelPlan(tp=tp, cp=cp, dp=replicas // cp, sp=tp > 1, seq_len=8192, global_batch=128, zero=1)
        return estimate_training(m, cluster, plan)

    ring, flat = run(2), run(1)
    a, b = ring.comm.axes["dp"], flat.comm.axes["dp"]
    assert [t.group.size for t in a.transfers] == [t.group.size for t in b.transfers] == [replicas] * len(a.transfers)
    assert float(a.bytes) == pytest.approx(float(b.bytes), rel=1e-12)
    assert float(a.seconds) == pytest.approx(float(b.seconds), rel=1e-12)
    assert float(ring.time.optimizer) == pytest.approx(float(flat.time.optimizer), rel=1e-12)
    assert float(ring.memory.optimizer) == pytest.approx(float(flat.memory.optimizer), rel=1e-12)
