"""Megatron's core_attn recompute re-runs the softmax-attention layers' core only, not a hybrid's recurrent mixers.

Megatron-Core checkpoints `Attention.core_attention` (transformer/attention.py: checkpoint_core_attention,
_checkpointed_attention_forward) when recompute_modules holds core_attn; the Mamba-2 mixer (ssm/mamba_mixer.py,
built by ssm/mamba_layer.py) and the Gated DeltaNet (ssm/gated_delta_net/common.py, _GDNBase, a MegatronModule
whose only selective option is gdn_norm_out) are not Attention modules and checkpoint nothing under core_attn
(NVIDIA/Megatron-LM at d98e8a6). So under core_attn a Mamba-2 or GDN layer costs what it costs without
recompute, in time and in saved activations, and an attention layer one more forward of its core.

Expected values are written out from the model dimensions (Hugging Face configs) and the cost parts
(docs/formulas.md#compute.core_attn_recompute), not read back from the stage total under test.
"""

from __future__ import annotations

import pytest

from llmplan.cost.activations import layer_activation_parts
from llmplan.cost.compute import layer_seconds, recompute_flops_per_step, stage_compute
from llmplan.cost.hybrid_stage import single_kind
from llmplan.cost.memory import layer_activation_bytes
from llmplan.cost.mixers import SSD_SCAN_EFFICIENCY
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M = builtin_models()
NANO, QWEN_NEXT = M["nemotron-3-nano"], M["qwen3-next-80b-a3b"]
H100 = builtin_systems()["dgx-h100"].gpu
SEQ = 8192


def _plans(**kw) -> tuple[ParallelPlan, ParallelPlan]:
    """(no recompute, selective recompute of core_attn: Megatron's default module) on one H100."""
    base = dict(tp=1, pp=1, dp=1, micro_batch=1, global_batch=8, seq_len=SEQ, **kw)
    return ParallelPlan(recompute="none", **base), ParallelPlan(recompute="selective", **base)


def _parts(m, plan, n_dense, n_moe):
    sc = stage_compute(m, plan, H100, n_dense, n_moe, False)
    return float(sc.gemm), float(sc.attention), float(sc.memory_bound)


def test_a_mamba2_layer_costs_the_same_under_core_attn_recompute():
    # Nemotron-3 Nano's Mamba-2 mixer (config.json: 64 heads of 64, state 128, 8 groups; chunk 128) before its
    # MoE block, one micro-batch of 8,192 tokens on one H100: the SSD scan forward
    # G 2QN + H(2QP + 4NP) and backward 3 G 2QN + H(6QP + 10NP) FLOPs a token (docs/formulas.md#mixers.ssd_rate)
    # at 0.214 of the H100's bf16 peak at its own clock, charged once each (forward + backward), recompute or not.
    none, core = _plans()
    mamba = single_kind(NANO, "mamba")
    H, P, N, G, Q = 64, 64, 128, 8, 128
    fwd = G * 2 * Q * N + H * (2 * Q * P + 4 * N * P)
    bwd = 3 * G * 2 * Q * N + H * (6 * Q * P + 10 * N * P)
    rate = SSD_SCAN_EFFICIENCY * H100.capped_clock_ratio * H100.peak_flops("bf16")
    scan_s = SEQ * (fwd + bwd) / rate
    g0, a0, mb0 = _parts(mamba, none, 0, 1)
    g1, a1, mb1 = _parts(mamba, core, 0, 1)
    assert a0 == pytest.approx(scan_s, rel=1e-9)
    assert a1 == pytest.approx(scan_s, rel=1e-9)  # was 4/3 of it: the scan re-run with the attention core
    assert (g1, mb1) == pytest.approx((g0, mb0), rel=1e-12)


def test_an_attention_layer_grows_by_one_forward_of_its_core():
    none, core = _plans()
    attn = single_kind(NANO, "full_attention")
    forward = float(layer_seconds(attn, none, H100, True)[1])  # the attention core's forward, one layer
    g0, a0, mb0 = _parts(attn, none, 0, 1)
    g1, a1, mb1 = _parts(attn, core, 0, 1)
    assert a0 == pytest.approx(3 * forward, rel=1e-9)
    assert a1 == pytest.approx(4 * forward, rel=1e-9)
    assert (g1, mb1) == pytest.approx((g0, mb0), rel=1e-12)  # fused attention: no score traffic to re-run


@pytest.mark.parametrize("m, kind", [(NANO, "mamba"), (QWEN_NEXT, "linear_attention")])
def test_the_whole_hybrid_stage_grows_by_its_attention_layers_forward_only(m, kind):
    # The average-layer stage of all the model's layers: core_attn adds one attention-core forward per softmax
    # attention layer (Nano: 6 of 52; Qwen3-Next: 12 of 48), nothing for the Mamba-2 / Gated DeltaNet layers.
    none, core = _plans()
    forward = float(layer_seconds(single_kind(m, "full_attention"), none, H100, True)[1])
    n = (m.num_dense_layers, m.num_moe_layers)
    grown = _parts(m, core, *n)[1] - _parts(m, none, *n)[1]
    assert grown == pytest.approx(m.count_layers("full_attention") * forward, rel=1e-9)
    # the recurrent kind alone: unchanged
    variant = single_kind(m, kind)
    assert _parts(variant, core, *n) == pytest.approx(_parts(variant, none, *n), rel=1e-12)


def test_full_recompute_still_reruns_the_scan():
    none, _ = _plans()
    full = ParallelPlan(**{**none.model_dump(), "recompute": "full"})
    mamba = single_kind(NANO, "mamba")
    assert _parts(mamba, full, 0, 1)[1] == pytest.approx(4 / 3 * _parts(mamba, none, 0, 1)[1], rel=1e-9)


def test_core_attn_recompute_flops_are_the_attention_layers_scores_only():
    # Nano, 8 sequences of 8,192 tokens: 6 attention layers x QK^T and AV, 2 s b s a (d + d) FLOPs each
    # (32 heads of 128, all keys counted as for MFU), once more per micro-batch; the 23 Mamba-2 scans not.
    _, core = _plans()
    a, d, b = 32, 128, 1
    per_mb = 6 * 2 * SEQ * b * SEQ * a * (d + d)
    assert float(recompute_flops_per_step(NANO, core)) == pytest.approx(per_mb * 8 / b, rel=1e-9)


def test_core_attn_recompute_keeps_the_recurrent_mixers_activations():
    # Megatron checkpoints no Mamba-2 / GDN tensor under core_attn: their saved activations stay. Unfused
    # attention: what core_attn frees is the attention layers' softmax scores only, 2 (+ 4, below) bytes x a x
    # s^2 x b / t a layer (attention dropout 0), over the average layer 6 / 52 of it.
    none, core = _plans()
    for m, kind in ((NANO, "mamba"), (QWEN_NEXT, "linear_attention")):
        kept = [float(layer_activation_parts(m, p, True).recurrent) for p in (none, core)]
        assert kept[1] == pytest.approx(kept[0], rel=1e-12)
        variant = single_kind(m, kind)
        layer = [float(layer_activation_bytes(variant, p, True)) for p in (none, core)]
        assert layer[1] == pytest.approx(layer[0], rel=1e-12)
    none, core = _plans(flash_attention=False)
    freed = float(layer_activation_bytes(NANO, none, True) - layer_activation_bytes(NANO, core, True))
    # 8,192 keys are past Megatron's fused softmax (16 < sk <= 4096: megatron/core/fusions/fused_softmax.py at
    # d98e8a64dd), whose fp32 torch fallback keeps its fp32 output (4 bytes a score) beside the 16-bit scores
    assert freed == pytest.approx((2 + 4) * 32 * SEQ * SEQ * 1 * 6 / 52, rel=1e-9)
