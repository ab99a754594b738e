"""Issue 32 (docs/validation.md#mla-tp-latent): Megatron-Core's multi-latent attention gathers its latents, not
the hidden size, across the tensor-parallel group.

NVIDIA/Megatron-LM d98e8a6 megatron/core/transformer/multi_latent_attention.py (the default MLA spec of
megatron/core/models/gpt/gpt_layer_specs.py: linear_q_down_proj / linear_kv_down_proj = TELinear, built with
parallel_mode "duplicated"; the up-projections column-parallel; linear_proj row-parallel). With sequence
parallelism, per attention layer and micro-batch:
  forward: the down-projections run on the rank's s/t tokens (no collective); the column-parallel
    linear_q_up_proj and linear_kv_up_proj all-gather their inputs (q_lora_rank 1,536 and kv_lora_rank 512
    per token); the rope key (qk_pos_emb_head_dim 64) is gathered by gather_from_sequence_parallel_region;
    linear_proj reduce-scatters its h-wide output.
  backward: linear_proj all-gathers its output gradient (h); the two up-projections re-gather their saved
    shards for the weight gradients (1,536 + 512) and reduce-scatter their input gradients (1,536 + 512); the
    rope key's gradient is reduce-scattered (64).
Every other TP pair (the dense MLP of the first 3 layers, the shared expert of the other 58) moves h five times:
forward gather and reduce-scatter, backward gather of the output gradient, re-gather, reduce-scatter.
Ring all-gather / reduce-scatter: (t-1)/t of the full buffer per rank (nccl-tests convention). The plans set
expert TP 1: at expert TP > 1 the routed experts' dispatcher adds a pair of its own (tests/test_tp_routed_etp.py)."""

from __future__ import annotations

import pytest

from llmplan.cost.comm import tp_transfers
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import resolve_model

S, H, Q_R, KV_R, ROPE, LAYERS = 4096, 7168, 1536, 512, 64, 61  # DeepSeek-V3's config.json


def _bytes(m, plan):
    return sum(float(x.bytes) for x in tp_transfers(m, plan, _Span(plan.tp)))


class _Span:
    def __init__(self, size: int):
        self.size = size


def test_deepseek_v3_layer_tp4_sp_moves_the_latents():
    m = resolve_model("deepseek-v3")
    plan = ParallelPlan(tp=4, etp=1, pp=1, dp=1, global_batch=1, micro_batch=1, seq_len=S, sp=True)
    attention = (Q_R + KV_R + ROPE) + (Q_R + KV_R) + (Q_R + KV_R + ROPE) + 2 * H  # 20,608 elements a token
    mlp = 5 * H  # 35,840
    expected = LAYERS * (attention + mlp) * S * 2 * 3 / 4  # bf16, bus factor 3/4
    assert _bytes(m, plan) == pytest.approx(expected, rel=1e-12)
    # what llmplan priced before (hidden size on every column side): 10 h a layer; 21.25% more
    assert expected / (LAYERS * 10 * H * S * 2 * 3 / 4) == pytest.approx(0.7875)


def test_deepseek_v3_tp4_without_sp_all_reduces_the_two_latents():
    # without SP: linear_proj all-reduces its output (h), the up-projections' input gradients are all-reduced
    # (copy_to_tensor_model_parallel_region's backward); the rope key meets no mapping. Ring all-reduce 2(t-1)/t.
    m = resolve_model("deepseek-v3")
    plan = ParallelPlan(tp=4, etp=1, pp=1, dp=1, global_batch=1, micro_batch=1, seq_len=S, sp=False)
    per_layer = (H + Q_R + KV_R) + 2 * H
    assert _bytes(m, plan) == pytest.approx(LAYERS * per_layer * S * 2 * 2 * 3 / 4, rel=1e-12)


def test_uncompressed_query_gathers_the_hidden_size():
    # q_lora_rank None (DeepSeek-V2-Lite's layout): linear_q_proj is column-parallel on the hidden states, so the
    # query side gathers, re-gathers and reduce-scatters h; the kv latent and rope key as above.
    m = resolve_model("deepseek-v3").model_copy(update={"q_lora_rank": None})
    plan = ParallelPlan(tp=4, etp=1, pp=1, dp=1, global_batch=1, micro_batch=1, seq_len=S, sp=True)
    attention = (H + KV_R + ROPE) + (H + KV_R) + (H + KV_R + ROPE) + 2 * H
    assert _bytes(m, plan) == pytest.approx(LAYERS * (attention + 5 * H) * S * 2 * 3 / 4, rel=1e-12)


def test_tp1_sends_nothing():
    m = resolve_model("deepseek-v3")
    for sp in (True, False):
        plan = ParallelPlan(tp=1, pp=1, dp=1, global_batch=1, micro_batch=1, seq_len=S, sp=sp)
        assert _bytes(m, plan) == 0.0


def test_full_recompute_gathers_the_latents_again():
    # full recompute re-runs the forward: the latents and rope key gathered again, linear_proj's output
    # reduce-scattered again; nothing more in backward
    m = resolve_model("deepseek-v3")
    plan = ParallelPlan(tp=4, etp=1, pp=1, dp=1, global_batch=1, micro_batch=1, seq_len=S, sp=True, recompute="full")
    attention = 2 * (Q_R + KV_R + ROPE) + (Q_R + KV_R) + (Q_R + KV_R + ROPE) + 3 * H
    assert _bytes(m, plan) == pytest.approx(LAYERS * (attention + 7 * H) * S * 2 * 3 / 4, rel=1e-12)


def test_dtensor_tp_gathers_the_hidden_size():
    # torchtitan (pytorch/torchtitan 018740b7 deepseek_v3/infra/parallelize.py apply_non_moe_tp) gathers the
    # attention input whole before its NoParallel wkv_a / wq_a: h on both sides, no backward re-gather, 8 h a layer
    m = resolve_model("deepseek-v3")
    plan = ParallelPlan(tp=4, etp=1, pp=1, dp=1, global_batch=1, micro_batch=1, seq_len=S, sp=True, tp_impl="dtensor")
    assert _bytes(m, plan) == pytest.approx(LAYERS * 8 * H * S * 2 * 3 / 4, rel=1e-12)
