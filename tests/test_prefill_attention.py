"""SGLang's MLA prefill attention priced as FlashAttention-3's varlen causal forward
(docs/formulas.md#infer.prefill_attention, docs/validation.md#wideep-prefill-length): the kernel's published rate
curve, a DeepSeek-V3 prefill step's attention against a hand-worked price, the wideep H100 rows against the LMSYS
blog, and training / other engines untouched."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from llmplan.cost.attention_rate import prefill_call_ratio, serving_prefill_asymptote
from llmplan.cost.serve_step import step_compute_parts
from llmplan.estimate import estimate_training
from llmplan.serving import replica_spans
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems
from llmplan.specs.serve import ServePlan

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from accuracy import WIDE_EP_RUNS, predict_wide_ep

M = builtin_models()
S = builtin_systems()
DSV3 = M["deepseek-v3"]

# FlashAttention-3 forward, H100 SXM5, bf16, causal, head dim 128, 16 heads, batch x s = 16k tokens, TFLOP/s
# (causal FLOPs halved): Shah et al. 2024 (FlashAttention-3, arXiv 2407.08608), Figure 5.
FA3_CAUSAL_FORWARD = {512: 292, 1024: 423, 2048: 521, 4096: 579, 8192: 602, 16384: 616}
H100_BF16_PEAK = 989e12  # the profile's dense bf16 peak, the figure's GPU


@pytest.mark.parametrize("s", sorted(FA3_CAUSAL_FORWARD))
def test_fa3_forward_rate_follows_the_published_causal_curve(s):
    # The shipped asymptote (0.66, the mean of the 4k-16k points) times the call's ratio must give the published
    # absolute rate: within 3% at 4k-16k, 8% at 1k-2k (the fixed-work form's tolerance on H100,
    # tests/test_attention_rate.py), 30% at 512 (four tiles a call: the form is known to miss there).
    gpu = S["dgx-h100"].gpu
    ratio = float(prefill_call_ratio(s, 16384 / s, 16, gpu.sm_count))
    rate = gpu.fa3_forward_efficiency * H100_BF16_PEAK * ratio / 1e12
    tol = 0.03 if s >= 4096 else 0.08 if s >= 1024 else 0.30
    assert rate == pytest.approx(FA3_CAUSAL_FORWARD[s], rel=tol)


def test_deepseek_v3_prefill_step_attention_against_a_hand_price():
    # One H100, DP attention (all 128 heads), 16,384 prompt tokens as 4 prompts of 4,096, SGLang. Hand price:
    # 32 query tiles a prompt; 512 (prompt, head) calls of 32 x 33 / 2 tiles each, 237 / 128 fixed tiles a CTA;
    # 16,384 CTAs over 132 SMs: ratio = (512 x 32^2 / 2 / 132) / (16384 / 132 x (16.5 + 237/128)) = 0.8718.
    # Rate = 989e12 x 0.66 (FA3 forward, published_rate_clock at 700 W = 1 / 0.825 against the sustained peak)
    # x 0.8718 x head dims (160 / 203) / (128 / 171) = 1.05296. FLOPs = 2 x 16384 x 2048 x 128 x (192 + 128) x 61.
    system = S["dgx-h100"]
    plan = ServePlan(tp=1, pp=1, dp=8, ep=8, dp_attention=True, phase="prefill", weight_dtype="fp8")
    spans = replica_spans(plan, ClusterSpec(system=system, num_nodes=1))
    T, pairs = 16384.0, 16384.0 * 2048
    with_attn, _ = step_compute_parts(DSV3, plan, system, spans, T, pairs, 0.0, False, "sglang")
    without, _ = step_compute_parts(DSV3, plan, system, spans, T, 0.0, 0.0, False, "sglang")
    ratio = (512 * 32 ** 2 / 2 / 132) / (16384 / 132 * (32 * 33 / 2 / 32 + 237 / 128))
    rate = 989e12 * 0.66 * ratio * (160 / 203) / (128 / 171)
    flops = 2 * 16384 * 2048 * 128 * (192 + 128) * 61
    assert float(with_attn - without) == pytest.approx(flops / rate, rel=1e-3)


def _prefill_record(rid: str) -> dict:
    return next(r for r in yaml.safe_load(WIDE_EP_RUNS.read_text()) if r["id"] == rid)


@pytest.mark.parametrize("rid, published", [
    # LMSYS, 2025-05-05-large-scale-ep: 57,674 / 54,543 / 50,302 input tokens/s per 8-GPU node.
    ("wideep-lmsys-h100-prefill-1k", 57674 / 8),
    ("wideep-lmsys-h100-prefill-2k", 54543 / 8),
    ("wideep-lmsys-h100-prefill-4k", 50302 / 8),
])
def test_wideep_h100_prefill_rows_within_ten_percent(rid, published):
    # Tolerance 10% (before the FA3 forward price the 4k row was +11.0%).
    pred, meas, _ = predict_wide_ep(_prefill_record(rid))
    assert meas == pytest.approx(published)
    assert pred == pytest.approx(published, rel=0.10)


def test_only_sglang_mla_prefill_on_a_published_fa3_gpu_moves():
    h100 = S["dgx-h100"].gpu
    bare = h100.model_copy(update={"fa3_forward_efficiency": None})
    fa3 = serving_prefill_asymptote(DSV3, h100, True, 128, 16384.0, 16384.0 * 500)
    assert fa3 < serving_prefill_asymptote(DSV3, bare, True, 128, 16384.0, 16384.0 * 500)
    # another engine, a model without MLA, or a GPU without the published rate: the native asymptote
    llama = M["llama-3.1-8b"]
    for args in ((DSV3, h100, False), (llama, h100, True), (DSV3, bare, True)):
        assert serving_prefill_asymptote(*args, 32, 8192.0, 8192.0 * 500) == h100.attention_efficiency


def test_training_does_not_read_the_fa3_forward_rate():
    system = S["dgx-h100"]
    bare = system.model_copy(update={"gpu": system.gpu.model_copy(update={"fa3_forward_efficiency": None})})
    cases = ((M["llama-3.1-70b"], 4, ParallelPlan(tp=8, dp=4, seq_len=8192, micro_batch=1, global_batch=64)),
             (DSV3, 32, ParallelPlan(tp=1, pp=16, dp=16, ep=16, pp_first=3, pp_last=2, seq_len=4096,
                                     micro_batch=1, global_batch=256, recompute="full")))
    for m, nodes, plan in cases:
        a = estimate_training(m, ClusterSpec(system=system, num_nodes=nodes), plan)
        b = estimate_training(m, ClusterSpec(system=bare, num_nodes=nodes), plan)
        assert a.time == b.time
