"""Megatron-Core's alltoall dispatcher sorts the rows an EP rank receives by local expert and restores their order
before the combine (MoEAlltoAllTokenDispatcher.dispatch_postprocess, "Permutation 2", and combine_preprocess,
"Unpermutation 2": sort_chunks_by_idxs, NVIDIA/Megatron-LM megatron/core/transformer/moe/token_dispatcher.py,
core_r0.9.0 - core_v0.19.0) whenever a rank holds more than one expert: its HBM traffic, counted by hand, and
where it is paid (docs/formulas.md#moe.alltoall_sort)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.compute import ALLTOALL_SORT_BYTES, alltoall_sort_bytes, elementwise_bytes
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan

TINY: dict = {"name": "tiny-moe", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
              "num_attention_heads": 4, "vocab_size": 1000, "max_position_embeddings": 4096,
              "num_experts": 16, "num_experts_per_tok": 2, "moe_intermediate_size": 128}


def test_one_sort_reads_and_writes_every_received_row_once():
    elem = 2  # bf16 hidden states: the fused sort_chunks kernel gathers each row once into a new buffer
    assert ALLTOALL_SORT_BYTES == elem + elem


@settings(max_examples=30, deadline=None, derandomize=True)
@given(s=st.sampled_from([512, 4096]), b=st.integers(1, 4), k=st.integers(1, 8), h=st.sampled_from([256, 2880]),
       ep=st.sampled_from([1, 2, 8, 16]), capacity=st.sampled_from([None, 1.0, 1.25]))
def test_two_sorts_each_way_over_every_received_copy(s, b, k, h, ep, capacity):
    m = ModelSpec(**{**TINY, "num_experts_per_tok": k, "hidden_size": h})
    a2a = ParallelPlan(seq_len=s, micro_batch=b, ep=ep, dp=ep, moe_capacity_factor=capacity)
    flex = a2a.model_copy(update={"moe_dispatcher": "deepep"})
    extra = elementwise_bytes(m, a2a, True) - elementwise_bytes(m, flex, True)
    local = m.num_experts // ep
    # two sorts in forward (dispatch, combine) and their inverses in backward; the stage charges three forwards
    expected = (4 * ALLTOALL_SORT_BYTES * k * h * (capacity or 1.0) / 3 * s * b) if local > 1 and ep > 1 else 0.0
    assert extra == pytest.approx(expected)
    assert elementwise_bytes(m, a2a, False) == elementwise_bytes(m, flex, False)  # dense layers: no dispatcher


def test_one_local_expert_or_no_expert_parallelism_needs_no_sort():
    m = ModelSpec(**TINY)
    assert alltoall_sort_bytes(m, ParallelPlan(ep=16, dp=16)) == 0.0
    assert alltoall_sort_bytes(m, ParallelPlan()) == 0.0  # ep 1: no all-to-all, rows permuted into expert order
    assert alltoall_sort_bytes(m, ParallelPlan(ep=8, dp=8)) > 0.0
