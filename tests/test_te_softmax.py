"""Transformer Engine's unfused attention softmax (softmax_kernel te) and attention sinks without fused attention,
counted by hand from the sources (docs/formulas.md#compute.te_softmax), at s = 2,048 and 4,096.

Sources, read at NVIDIA/TransformerEngine@d0067d0da6:
- transformer_engine/pytorch/attention/dot_product_attention/softmax.py: is_kernel_available (16 < sk < 16384,
  sk % 8 == 0, sq % 4 == 0, sq % get_batch_per_block); forward_fused_softmax runs scaled_masked_softmax for a
  causal mask (the aligned causal kernel's call commented out); forward_torch_softmax (fp32: float(), masked_fill_,
  softmax, cast back; no scale).
- transformer_engine/common/fused_softmax/scaled_masked_softmax.cu: forward loads the whole row (2 bytes a score)
  and stores it (2); backward loads gradient and output (2 + 2) and stores the input gradient (2): 4 + 6.
- backends.py UnfusedDotProductAttention._forward: get_full_mask every forward; softmax_type learnable: torch.cat
  of the sink column (16 bits: read 2, write 2), F.pad of the mask, attn_mask_type arbitrary, the probabilities
  sliced back (backward: a zero-filled gradient, write 2, and the copy in, read 2 write 2).
- utils.py get_full_mask (causal): int32 arange difference (write 4), swa_left / swa_right (read 4, write 4 each),
  two compares (read 4, write 1 each), ~ (1, 1), & (2, 1), logical_not (1, 1): 37 bytes a position; the loader
  mask's logical_or (read 1 + b, write b).
Megatron-Core's own path with sinks, NVIDIA/Megatron-LM@d98e8a64dd megatron/core/fusions/fused_softmax.py: the
kernel only where softmax_offset is None, so forward_torch_softmax with SoftmaxOne (cat and slice in fp32: 4 + 4,
then 4 + 4 + 4) on top of the fp32 chain llmplan prices as 36 + 40 (docs/formulas.md#compute.eager_softmax).
Saved for backward (PyTorch tools/autograd/derivatives.yaml: _softmax keeps its result, bmm its inputs): 2 bytes a
score on a kernel path (its 16-bit output), 6 on an fp32 torch path (the fp32 result and the 16-bit cast)."""

from __future__ import annotations

import pytest

from llmplan.cost.activations import layer_activation_parts
from llmplan.cost.compute import stage_compute
from llmplan.cost.elementwise import sink_rescale_bytes, softmax_launches, te_mask_launches
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_systems

HEADS, TP = 32, 8  # 4 heads a rank
GPU = builtin_systems()["dgx-h100"].gpu


def model(sinks: bool = False, heads: int = HEADS) -> ModelSpec:
    return ModelSpec(name="tiny", hidden_size=64 * heads, num_attention_heads=heads, num_key_value_heads=heads,
                     intermediate_size=512, num_hidden_layers=2, vocab_size=1000, max_position_embeddings=65536,
                     attention_sinks=sinks)


def plan(s: int, kernel: str, **kw) -> ParallelPlan:
    return ParallelPlan(**{"seq_len": s, "micro_batch": 1, "tp": TP, "flash_attention": False,
                           "softmax_kernel": kernel, **kw})


def score_traffic(m: ModelSpec, p: ParallelPlan) -> float:
    """One layer's bytes of the unfused scores over a micro-batch's forward, backward and any rerun: the stage's
    memory-bound time, less a flash plan's (no scores), at the rate the stage prices those bytes at."""
    flash = p.model_copy(update={"flash_attention": True})
    one, none = (stage_compute(m, q, GPU, 1, 0, False).memory_bound for q in (p, flash))
    return float(one - none) * GPU.hbm_achieved_bytes_per_s


# bytes of one layer, forward and backward, at micro-batch 1 and 4 heads a rank, by hand:
HAND = {
    # TE's masked kernel: (4 + 6) a score x 4 heads, plus the mask: 37 + the loader OR (1 + 2) = 40 a position
    ("te", False, 2048): (10 * 4 + 40) * 2048 ** 2,  # 335,544,320
    ("te", False, 4096): (10 * 4 + 40) * 4096 ** 2,  # 1,342,177,280
    # with a sink column sk = s + 1 is no multiple of 8: TE's fp32 torch path (28 + 32) plus the 16-bit cat and
    # slice (4 + 6) a score; the mask 40 + the pad's 2
    ("te", True, 2048): ((60 + 10) * 4 + 42) * 2048 ** 2,  # 1,350,565,888
    ("te", True, 4096): ((60 + 10) * 4 + 42) * 4096 ** 2,  # 5,402,263,552
    # Megatron-Core's kernel over the triangle (3 + 4); with sinks its fp32 chain (36 + 40) and SoftmaxOne's fp32
    # cat and slice (8 + 12)
    ("fused", False, 2048): 7 * 4 * 2048 ** 2,  # 117,440,512
    ("fused", False, 4096): 7 * 4 * 4096 ** 2,
    ("fused", True, 2048): (76 + 20) * 4 * 2048 ** 2,  # 1,610,612,736
    ("fused", True, 4096): (76 + 20) * 4 * 4096 ** 2,
}


@pytest.mark.parametrize("kernel,sinks,s", sorted(HAND))
def test_score_traffic_by_hand(kernel, sinks, s):
    assert score_traffic(model(sinks), plan(s, kernel)) == pytest.approx(HAND[(kernel, sinks, s)])


def test_hand_counts_spelled_out():
    assert HAND[("te", False, 2048)] == 335_544_320 and HAND[("te", True, 4096)] == 5_402_263_552
    assert HAND[("fused", True, 2048)] == 1_610_612_736


@pytest.mark.parametrize("s", [2048, 4096])
@pytest.mark.parametrize("kernel,sinks,per_score", [
    ("te", False, 2), ("te", True, 6), ("fused", False, 2), ("fused", True, 6)])
def test_saved_scores_by_hand(kernel, sinks, s, per_score):
    scores = layer_activation_parts(model(sinks), plan(s, kernel), False).scores
    assert scores == pytest.approx(per_score * HEADS / TP * s * s)


def test_te_past_its_kernel_falls_back_to_fp32_torch_ops():
    # 16,384 keys fail sk < 16384; 4,092 fail sk % 8 (and Megatron-Core's kernel takes 4,092): fp32 chain 28 + 32,
    # the mask 40 + the fallback's second OR (1 + 2)
    for s in (4092, 16384):
        assert score_traffic(model(), plan(s, "te")) == pytest.approx((60 * 4 + 43) * s ** 2)
        assert layer_activation_parts(model(), plan(s, "te"), False).scores == pytest.approx(6 * 4 * s * s)
    # 8,192 keys: TE's kernel (Megatron-Core's would fall back)
    assert score_traffic(model(), plan(8192, "te")) == pytest.approx(80 * 8192 ** 2)


def test_core_attn_recompute_reruns_the_forward_and_rebuilds_the_mask():
    # the rerun: the kernel's forward (4 a score x 4 heads) and the mask again (40 a position)
    base, rerun = plan(2048, "te"), plan(2048, "te", recompute="selective")
    assert rerun.recomputes("core_attn")
    assert score_traffic(model(), rerun) - score_traffic(model(), base) == pytest.approx((4 * 4 + 40) * 2048 ** 2)


def test_full_recompute_builds_the_mask_twice():
    # full recompute: the layer's memory-bound ops are charged a fourth forward-equivalent pass (the kernel's
    # (4 + 6) x 4 heads / 3 once more), and the mask, built in forward only, is built twice: 2 x 40 a position
    # (main charged the mask 4/3 x 40)
    full = plan(2048, "te", recompute="full")
    assert score_traffic(model(), full) == pytest.approx((4 * (10 * 4) / 3 + 2 * 40) * 2048 ** 2)


def test_te_kernel_needs_micro_batch_times_heads_a_rank_a_multiple_of_4():
    # TE is_kernel_available: attn_batches = b x np % 4 == 0. 40 heads at TP 8: 5 a rank. Micro-batch 1: 5 rows,
    # the fp32 fallback (28 + 32) x 5 heads and the mask 37 + (1 + 2) + the fallback's (1 + 2) = 43; micro-batch
    # 4: 20 rows, the kernel (4 + 6) x 5 heads x 4 samples and the mask 37 + (1 + 2 x 4) = 46
    m, s = model(heads=40), 2048
    assert score_traffic(m, plan(s, "te")) == pytest.approx((60 * 5 + 43) * s * s)
    assert score_traffic(m, plan(s, "te", micro_batch=4)) == pytest.approx((10 * 5 * 4 + 46) * s * s)
    assert layer_activation_parts(m, plan(s, "te"), False).scores == pytest.approx(6 * 5 * s * s)
    assert layer_activation_parts(m, plan(s, "te", micro_batch=4), False).scores == pytest.approx(2 * 5 * 4 * s * s)


def test_launches():
    # te: 11 mask kernels, forward only (te_mask_launches); the fallback 4 more; sinks: cat, pad, and the fp32
    # path's 3 (no causal OR); Megatron-Core with sinks: its fp32 chain's 4 and the cat
    assert softmax_launches(model(), plan(2048, "te")) == 0 and te_mask_launches(plan(2048, "te")) == 11
    assert softmax_launches(model(), plan(16384, "te")) == 4
    assert softmax_launches(model(True), plan(2048, "te")) == 5
    assert softmax_launches(model(True), plan(2048, "fused")) == 5
    assert softmax_launches(model(), plan(2048, "te", flash_attention=True)) == 0
    assert te_mask_launches(plan(2048, "te", flash_attention=True)) == te_mask_launches(plan(2048, "fused")) == 0


def _host(m: ModelSpec, p: ParallelPlan) -> float:
    """The step's host launch time of 4 layers on a GPU with no work to hide them behind (per_mb 0)."""
    from llmplan.cost.overhead import host_seconds
    from llmplan.cost.stages import recomputed_share
    r = recomputed_share(p, 4)
    return float(host_seconds(p, 4, 0.0, r, softmax=softmax_launches(m, p), mask_kernels=te_mask_launches(p)))


@pytest.mark.parametrize("recompute,builds", [("none", 1), ("full", 2)])
def test_host_launches_count_the_mask_once_a_forward_and_the_sink_kernels(recompute, builds):
    # 4 layers, one micro-batch, every launch waited for: te's 11 mask launches once per forward (twice under full
    # recompute: 22 a layer, not 11 x 4/3), plus the step start's first layer (11); a sink model's 5 softmax
    # kernels (cat, pad, the fp32 path's 3) in forward, backward (2x) and the rerun: (3 + r) x 5 a layer
    from llmplan.cost.compute import KERNEL_LAUNCH_S
    te, flash = plan(2048, "te", recompute=recompute), plan(2048, "te", recompute=recompute, flash_attention=True)
    r = builds - 1
    assert _host(model(), te) - _host(model(), flash) == pytest.approx(KERNEL_LAUNCH_S * (11 * builds * 4 + 11))
    extra = _host(model(True), te) - _host(model(), te)
    assert extra == pytest.approx(KERNEL_LAUNCH_S * 5 * ((3 + r) * 4 + 1))


def test_sink_launches_reach_a_real_estimate():
    # gpt-oss-20b (attention sinks) without flash attention: the estimate's host time counts the sink path's
    # launches (cost.step passes the model to softmax_launches); the same plan on a model copy without sinks
    # launches 5 kernels fewer a layer forward
    from llmplan.estimate import estimate_training
    from llmplan.specs.plan import ClusterSpec
    from llmplan.specs.registry import builtin_models
    m = builtin_models()["gpt-oss-20b"]
    assert m.attention_sinks
    cluster = ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=1)
    p = ParallelPlan(seq_len=2048, micro_batch=1, tp=8, global_batch=8, flash_attention=False, softmax_kernel="te")
    host = [float(estimate_training(x, cluster, p).time.overheads["host"])
            for x in (m, m.model_copy(update={"attention_sinks": False}))]
    assert host[0] > host[1]


def test_unfused_sinks_are_not_rescaled_after_the_kernel():
    # without fused attention the sink is a column of the softmax: no rescale, whatever sink_fusion says
    unfused = plan(2048, "te", sink_fusion=False)
    assert sink_rescale_bytes(model(True), unfused) == 0.0
    assert sink_rescale_bytes(model(True), unfused.model_copy(update={"flash_attention": True})) > 0.0


@pytest.mark.parametrize("name,seq", [("llama-3.1-8b", 4096), ("gpt-oss-20b", 2048), ("llama-3.1-8b", 4092),
                                      ("llama-2-13b", 2048)])
def test_vectorised_search_agrees_with_scalar(name, seq):
    # the search prices plan arrays (micro-batch, tp, recompute as arrays): each plan's memory and step time must
    # equal its scalar estimate on the te path, with sinks (gpt-oss) and on TE's fallback length (4,092)
    import itertools

    import numpy as np

    from llmplan.estimate import estimate_training
    from llmplan.search.evaluate import evaluate
    from llmplan.search.grid import Workload, default_space, enumerate_plans
    from llmplan.specs.check import check_plan
    from llmplan.specs.plan import ClusterSpec
    from llmplan.specs.registry import builtin_models, builtin_systems

    m, cluster = builtin_models()[name], ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=1)
    w = Workload(global_batch=64, seq_len=seq, flash_attention=False, softmax_kernel="te")
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    rng = np.random.default_rng(7)
    valid = (int(i) for i in rng.permutation(len(plans)) if not check_plan(m, plans.plan(int(i)), cluster))
    idx = list(itertools.islice(valid, 12))
    assert len(idx) == 12
    # and the first valid plan at TP 8 of micro-batch 1 and of 4 (40 heads: 5 a rank, 5 and 20 rows)
    tp, mb = np.asarray(plans.tp), np.asarray(plans.micro_batch)
    rows = [next(int(i) for i in np.flatnonzero((tp == 8) & (mb == b)) if not check_plan(m, plans.plan(int(i)), cluster))
            for b in (1, 4)]
    idx += rows
    if m.num_attention_heads == 40:  # the arrays' kernel choice: the fallback at micro-batch 1, the kernel at 4
        from llmplan.cost.elementwise import fp32_softmax
        assert [bool(fp32_softmax(m, plans.plan(i))) for i in rows] == [True, False]
        assert np.asarray(fp32_softmax(m, plans.take(np.asarray(rows)))).tolist() == [True, False]
    vec = evaluate(m, cluster, plans.take(np.asarray(idx)))
    for j, i in enumerate(idx):
        scalar = estimate_training(m, cluster, plans.plan(i))
        assert float(vec.memory.total[j]) == pytest.approx(float(scalar.memory.total), rel=1e-9)
        assert float(vec.step.total[j]) == pytest.approx(float(scalar.time.total), rel=1e-9)
