"""The routed experts' fc1 (gate / up) bias added after a grouped matmul that takes none, as NeMo AutoModel and
torchtitan run GPT-OSS (ParallelPlan.expert_fc1_bias_fusion False): its HBM traffic counted by hand from the
operations, its scaling over every routed row and fc1 column, and which validation rows run it
(docs/formulas.md#moe.expert_fc1_bias). Source: NVIDIA-NeMo/Automodel nemo_automodel/components/moe/experts.py
at 36044ad3d (GroupedExpertsDeepEP.forward, _apply_bias); pytorch/torchtitan
torchtitan/models/gpt_oss/model/moe.py at 09e93ca (_run_experts_grouped_mm)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.compute import EAGER_FC1_BIAS_BYTES, elementwise_bytes, expert_fc1_bias_bytes
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan

TINY: dict = {"name": "tiny-moe", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
              "num_attention_heads": 4, "vocab_size": 1000, "max_position_embeddings": 4096,
              "num_experts": 16, "num_experts_per_tok": 2, "moe_intermediate_size": 128}
EAGER = {"expert_fc1_bias_fusion": False}


def test_fc1_bias_bytes_counted_from_the_operations():
    # Per bf16 element of the fc1 output. Forward: torch.repeat_interleave writes the bias once per routed row,
    # flat_value + expanded_bias reads both and writes the sum (the .to(value.dtype) is a no-op in bf16).
    # Backward: the add hands the same gradient to both inputs (no copy); the repeat's backward
    # (_DeterministicBiasRepeatInterleave: a per-expert reduction) reads it once.
    elem = 2
    forward = elem + (elem + elem) + elem
    backward = elem
    assert EAGER_FC1_BIAS_BYTES == (forward, backward)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(s=st.sampled_from([512, 1024, 4096]), b=st.integers(1, 4), k=st.integers(1, 8),
       f=st.sampled_from([128, 768, 2880]), ep=st.sampled_from([1, 2, 8]), gated=st.booleans())
def test_eager_fc1_bias_is_its_passes_over_every_routed_row_and_column(s, b, k, f, ep, gated):
    spec = {**TINY, "num_experts_per_tok": k, "moe_intermediate_size": f, "gated_mlp": gated}
    biased, plain = ModelSpec(**spec, mlp_bias=True), ModelSpec(**spec)
    fused = ParallelPlan(seq_len=s, micro_batch=b, ep=ep, dp=ep)
    eager = fused.model_copy(update=EAGER)
    c = 2 if gated else 1  # fc1 writes gate and up halves for a gated MLP
    rows_cols = s * b * k * f * c
    # the stage charges memory-bound traffic three times: forward-equivalent bytes are (fwd + bwd) / 3
    extra = elementwise_bytes(biased, eager, True) - elementwise_bytes(biased, fused, True)
    assert extra == pytest.approx(sum(EAGER_FC1_BIAS_BYTES) / 3 * rows_cols)
    # no bias, no pass; dense layers are not the experts'
    assert elementwise_bytes(plain, eager, True) == pytest.approx(elementwise_bytes(plain, fused, True))
    assert elementwise_bytes(biased, eager, False) == pytest.approx(elementwise_bytes(biased, fused, False))


def test_fused_is_the_default_and_dense_models_pay_nothing():
    biased = ModelSpec(**TINY, mlp_bias=True)
    assert ParallelPlan().expert_fc1_bias_fusion  # Transformer Engine's GroupedLinear adds it (Megatron-Core)
    assert expert_fc1_bias_bytes(biased, ParallelPlan()) == 0.0
    dense = ModelSpec(**{k: v for k, v in TINY.items()
                         if k not in ("num_experts", "num_experts_per_tok", "moe_intermediate_size")},
                      mlp_bias=True)
    assert expert_fc1_bias_bytes(dense, ParallelPlan(**EAGER)) == 0.0


def test_validation_rows_read_their_stack(published_runs, acc):
    # AutoModel's GPT-OSS 20B row runs grouped_gemm's gmm and adds the bias after it; Megatron-Bridge's rows
    # build linear_fc1 as TE GroupedLinear with skip_bias_add False (megatron/core/transformer/moe/experts.py)
    auto = published_runs["automodel-h100-bf16-gpt-oss-20b-8gpu-gbs256"]
    assert not acc.plan_for(auto, "automodel", 8).expert_fc1_bias_fusion
    bridge = published_runs["mbridge-26.04.01-pretrain-gpt-oss-120b-dgx-b200-64gpu-bf16-tp1pp1cp1ep8vpnagbs1280mbs4"]
    assert acc.plan_for(bridge, "mbridge-moe", 64).expert_fc1_bias_fusion
