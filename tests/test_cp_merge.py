"""Transformer Engine's p2p ring merges each attention call's partial output, dQ and dK/dV into the layer's on the
GPU, memory-bound passes a cp = 1 call does not run (docs/formulas.md#compute.cp_merge). The counts are read off
NVIDIA/TransformerEngine transformer_engine/pytorch/attention.py at v1.10 (AttnFuncWithCPAndKVP2P); these tests
check the priced bytes against a hand count of rank cp - 1's operations and their scaling."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.elementwise import cp_merge_bytes, elementwise_bytes
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models

TINY: dict = {"name": "tiny", "hidden_size": 1024, "intermediate_size": 2048, "num_hidden_layers": 2,
              "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 1000,
              "max_position_embeddings": 65536}


def test_cp2_bytes_are_rank_1s_operations_counted_by_hand():
    # cp = 2, rank 1 holds chunks 1 and 2 (2c = s/2 tokens). bf16 = 2 bytes.
    # Forward: out = zeros_like(q) (write 2); calls 0 and 1 both merge whole rows (i <= rank):
    #   read out_step, read out, write out = 6 each -> 2 + 12 = 14 per output element.
    # Backward: call 0 (i == cp - 1 - rank == 0, rank == cp - 1) copies dq_ whole (4); call 1 adds (6) -> 10
    #   per dQ element. K/V: p2p_comm_buffers[0][0].copy_(kv) (4); call 0's dK/dV are a half chunk (i >= 0 and
    #   i != cp - 1): cat (4) and copy (4) over half the rows; call 1's whole: cat (4) and add (6) -> 4 + 4 + 10.
    m = ModelSpec(**TINY)
    plan = ParallelPlan(seq_len=8192, cp=2)
    d, tokens = m.d_head, 8192 / 2
    q_elems, kv_elems = tokens * 8 * d, tokens * 2 * 2 * d  # 8 query heads; K and V of 2 kv heads
    forward = 14 * q_elems
    backward = 10 * q_elems + (4 + 4 + 10) * kv_elems
    assert cp_merge_bytes(m, plan) == pytest.approx((forward + backward) / 3)


def test_no_merges_without_context_parallelism():
    m = builtin_models()["llama-3.1-405b"]
    assert cp_merge_bytes(m, ParallelPlan(seq_len=8192, tp=8, sp=True)) == 0.0


@settings(max_examples=40, deadline=None, derandomize=True)
@given(cp=st.sampled_from([2, 4, 8, 16]), t=st.sampled_from([1, 2, 4, 8]), s=st.sampled_from([4096, 8192, 32768]),
       b=st.integers(1, 2), moe=st.booleans())
def test_merges_are_the_only_cp_term_and_grow_with_cp_per_token(cp, t, s, b, moe):
    m = ModelSpec(**TINY)
    plan = ParallelPlan(seq_len=s, micro_batch=b, tp=t, sp=t > 1, cp=cp)
    ring, one = elementwise_bytes(m, plan, moe), elementwise_bytes(m, plan.model_copy(update={"cp": 1}), moe)
    # elementwise traffic per token is the same at cp 1 but for the merges
    assert ring - cp_merge_bytes(m, plan) == pytest.approx(one / cp)
    # per token of the rank the merges cost more the longer the ring (a merge per call): O(cp) passes
    per_token = cp_merge_bytes(m, plan) / (s / cp * b)
    wider = plan.model_copy(update={"cp": 2 * cp})
    assert cp_merge_bytes(m, wider) / (s / (2 * cp) * b) > per_token
    # and across the ring's ranks at most ~6 bytes x cp per element: never more than the cp = 1 layer's
    # output written (cp + 1) times over, forward and backward
    out = s * b * m.num_attention_heads / t * m.d_head
    assert cp_merge_bytes(m, plan) * cp <= 12 * (cp + 1) * out


@pytest.mark.parametrize("impl,repeated", [("torch-allgather", False), ("torch-alltoall", True)])
def test_torch_ring_merges_in_fp32_counted_by_hand(impl, repeated):
    # PyTorch's ring (torch/distributed/tensor/experimental/_attention.py: _SDPAMerger, convert_to_f32 True),
    # cp = 4, rank 3 (runs every call on its whole query), each statement between SDPA calls one fused kernel.
    # Forward per output element: merge 1 reads two bf16 outputs, writes fp32 (2 + 2 + 4); merge 2 reads fp32 and
    #   bf16, writes fp32 (4 + 2 + 4); merge 3 also casts the result to bf16 (4 + 2 + 2): 8 + 10 + 8 = 26.
    # Backward per dQ element: call 0 casts into the zeroed fp32 dq (2 + 4), calls 1-2 add (4 + 2 + 4 each), call
    #   3 adds and casts to bf16 (4 + 2 + 2): 6 + 20 + 8 = 34. Per K/V element: call 0's fp32 copy into the send
    #   buffer (2 + 4), calls 1-3 add a half-chunk bf16 gradient to the received fp32 and cat it (4 + 1 + 4 each),
    #   the final received buffer cast to bf16 (4 + 2): 6 + 27 + 6 = 39. The K/V send buffer (cat, 2 + 2) once per
    #   pass (all-gather) or at cp - 1 = 3 steps (all-to-all), forward and backward.
    m = ModelSpec(**TINY)
    plan = ParallelPlan(seq_len=16384, cp=4, cp_impl=impl, cp_kv_repeated=repeated)
    d, tokens = m.d_head, 16384 / 4
    q_elems = tokens * 8 * d
    kv_elems = tokens * (8 if repeated else 2) * 2 * d
    sends = 1 if impl == "torch-allgather" else 3
    forward = 26 * q_elems + 4 * sends * kv_elems
    backward = 34 * q_elems + (39 + 4 * sends) * kv_elems
    assert cp_merge_bytes(m, plan) == pytest.approx((forward + backward) / 3)
    # fp32 accumulators: more bytes than Transformer Engine's bf16 merges of the same layout
    te = cp_merge_bytes(m, ParallelPlan(seq_len=16384, cp=4))
    assert cp_merge_bytes(m, plan) > te
