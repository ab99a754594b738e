"""GPT-OSS's attention sinks applied after a kernel that runs without them, as NeMo AutoModel's FlexAttention path
does (ParallelPlan.sink_fusion False): the output rescaled by sigmoid(lse - sink) in fp32 and cast back. Its HBM
traffic counted by hand, its scaling over the attention output, the readers and which validation rows run it
(docs/formulas.md#compute.sink_rescale). Source: NVIDIA-NeMo/Automodel
nemo_automodel/components/attention/flex_attention.py at 36044ad3d (FlexAttention.forward)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.compute import SINK_RESCALE_BYTES, elementwise_bytes, sink_rescale_bytes
from llmplan.specs.hf import from_hf_config
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models

TINY: dict = {"name": "tiny", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
              "num_attention_heads": 4, "vocab_size": 1000, "max_position_embeddings": 4096}
UNFUSED = {"sink_fusion": False}


def test_rescale_bytes_counted_from_the_operations():
    # Per element of the attention output [b, a, s, d]. Forward: out (bf16) * attn_scale (fp32 [b, a, s, 1])
    # promotes to fp32: read 2, write 4; .to(bf16): read 4, write 2. Backward (autograd): _to_copy's gradient
    # to fp32 (read 2, write 4); mul's gradient for out, grad * scale in fp32 then cast to out's bf16 (read 4,
    # write 4, read 4, write 2); mul's gradient for the scale, grad * out in fp32 then summed over d to the
    # scale's shape (read 4 + 2, write 4, read 4).
    bf16, fp32 = 2, 4
    forward = (bf16 + fp32) + (fp32 + bf16)
    backward = (bf16 + fp32) + (fp32 + fp32 + fp32 + bf16) + (fp32 + bf16 + fp32 + fp32)
    assert SINK_RESCALE_BYTES == (forward, backward)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(s=st.sampled_from([512, 4096]), b=st.integers(1, 4), a=st.sampled_from([4, 8, 64]),
       t=st.sampled_from([1, 2, 4]), moe=st.booleans())
def test_rescale_is_its_passes_over_the_attention_output(s, b, a, t, moe):
    spec = {**TINY, "num_attention_heads": a, "head_dim": 64}
    sinks, plain = ModelSpec(**spec, attention_sinks=True), ModelSpec(**spec)
    fused = ParallelPlan(seq_len=s, micro_batch=b, tp=t, sp=t > 1)
    unfused = fused.model_copy(update=UNFUSED)
    extra = elementwise_bytes(sinks, unfused, moe) - elementwise_bytes(sinks, fused, moe)
    # the stage charges memory-bound traffic three times its forward: (fwd + bwd) / 3 per element
    assert extra == pytest.approx(sum(SINK_RESCALE_BYTES) / 3 * s * b * a * 64 / t)
    assert elementwise_bytes(plain, unfused, moe) == pytest.approx(elementwise_bytes(plain, fused, moe))


def test_gpt_oss_has_sinks_from_its_config_and_the_built_ins():
    cfg = {"model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 24,
           "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 201088,
           "max_position_embeddings": 131072, "num_local_experts": 32, "num_experts_per_tok": 4,
           "sliding_window": 128}
    assert ModelSpec(**from_hf_config(cfg, default_name="gpt-oss")).attention_sinks
    assert builtin_models()["gpt-oss-20b"].attention_sinks and builtin_models()["gpt-oss-120b"].attention_sinks
    assert not builtin_models()["qwen3-30b-a3b"].attention_sinks
    assert sink_rescale_bytes(builtin_models()["gpt-oss-20b"], ParallelPlan()) == 0.0  # fused by default


def test_validation_rows_read_their_stack(published_runs, acc):
    # AutoModel's GPT-OSS attention (backend attn flex) rescales after FlexAttention; Megatron-Bridge's passes
    # softmax_type "learnable" to Transformer Engine, which hands the sink to cuDNN
    auto = published_runs["automodel-h100-bf16-gpt-oss-20b-8gpu-gbs256"]
    assert not acc.plan_for(auto, "automodel", 8).sink_fusion
    bridge = published_runs["mbridge-26.04.01-pretrain-gpt-oss-120b-dgx-b200-64gpu-bf16-tp1pp1cp1ep8vpnagbs1280mbs4"]
    assert acc.plan_for(bridge, "mbridge-moe", 64).sink_fusion
