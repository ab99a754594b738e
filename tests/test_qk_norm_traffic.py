"""The per-head q and k RMSNorm (qk_norm: Qwen3; Megatron-Core SelfAttention q_layernorm / k_layernorm) is a
memory-bound pass over q and k: counted by hand."""

from __future__ import annotations

import pytest

from llmplan.cost.compute import elementwise_bytes
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan

DENSE: dict = {"name": "tiny", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
               "max_position_embeddings": 4096}


# unfused: PyTorch's eager RMSNorm ops, as the layer norms (cost.elementwise.EAGER_RMSNORM_BYTES, counted by
# hand in tests/test_eager_ops.py): forward 36 bytes an element, backward 92, over the stage's three passes
@pytest.mark.parametrize("fused, per_element", [(True, (4 + 6) / 3), (False, (36 + 92) / 3)])
def test_qk_norm_reads_and_writes_q_and_k_once(fused, per_element):
    # q is 4 heads x 64, k 2 heads x 64 on one rank: a fused norm reads 2 bytes and writes 2 an element forward,
    # reads x and dy and writes dx backward (6), over the stage's three passes; the unfused one as the layer
    # norms' eager ops.
    plan = ParallelPlan(seq_len=1024, micro_batch=2, fused_kernels=fused)
    T, width = 2048, (4 + 2) * 64
    extra = elementwise_bytes(ModelSpec(**DENSE, qk_norm=True), plan, False) \
        - elementwise_bytes(ModelSpec(**DENSE), plan, False)
    assert extra == pytest.approx(T * per_element * width)
