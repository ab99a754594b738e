"""The expert output bias added outside the grouped GEMM (Megatron-Core TEGroupedMLP._apply_bias): its
memory-bound traffic, counted by hand from the operations the code runs, and where it does not apply."""

from __future__ import annotations

import pytest

from llmplan.cost.compute import elementwise_bytes, expert_bias_bytes
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan

TINY: dict = {"name": "tiny-moe", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
              "num_attention_heads": 4, "vocab_size": 1000, "max_position_embeddings": 4096,
              "learned_position_embeddings": True, "num_experts": 16, "num_experts_per_tok": 2,
              "moe_intermediate_size": 128}


@pytest.mark.parametrize("dispatcher, fwd, bwd", [
    # DeepEP / HybridEP carry fp32 probabilities: per element of the k fc2 output copies (width h), forward
    # b*p written in fp32 (4), t + bp read 2 + 4 and written 4, torch.cat read 4 written 4, .to(bf16) read 4
    # written 2; backward the gradient cast to fp32 (2 + 4) and back for t (4 + 2), grad*p written and summed
    # (4 + 4 + 4), grad*b likewise
    ("deepep", 4 + (2 + 4 + 4) + (4 + 4) + (4 + 2), (2 + 4) + (4 + 2) + (4 + 4 + 4) + (4 + 4 + 4)),
    # alltoall keeps the router's bf16 probabilities: every tensor 2 bytes, the final cast a no-op
    ("alltoall", 2 + (2 + 2 + 2) + (2 + 2), (2 + 2 + 2) + (2 + 2 + 2)),
])
def test_expert_bias_traffic_by_hand(dispatcher, fwd, bwd):
    # The stage charges memory-bound traffic three times, so the layer's forward bytes carry (fwd + bwd) / 3.
    biased = ModelSpec(**TINY, mlp_bias=True)
    plain = ModelSpec(**TINY)
    plan = ParallelPlan(seq_len=1024, micro_batch=2, moe_dispatcher=dispatcher)
    T, h, k = 2048, 256, 2
    assert (fwd, bwd) == ((28, 36) if dispatcher == "deepep" else (12, 12))
    assert expert_bias_bytes(biased, plan) == pytest.approx((fwd + bwd) / 3 * k * h)
    assert elementwise_bytes(biased, plan, True) - elementwise_bytes(plain, plan, True) == pytest.approx(
        T * (fwd + bwd) / 3 * k * h)


def test_no_expert_bias_traffic_without_biases_or_outside_moe_layers():
    biased = ModelSpec(**TINY, mlp_bias=True)
    plan = ParallelPlan(seq_len=1024, micro_batch=2, moe_dispatcher="deepep")
    assert expert_bias_bytes(ModelSpec(**TINY), plan) == 0.0
    dense = {k: v for k, v in TINY.items() if k not in ("num_experts", "num_experts_per_tok", "moe_intermediate_size")}
    assert expert_bias_bytes(ModelSpec(**dense, mlp_bias=True), plan) == 0.0
    # the dense layers of a biased MoE model keep their fused bias (the GEMM epilogue): no extra traffic
    assert elementwise_bytes(biased, plan, False) == elementwise_bytes(ModelSpec(**TINY), plan, False)
