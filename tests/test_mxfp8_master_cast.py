"""Megatron-FSDP's cast of the fp32 master shards into MXFP8 weights after the optimizer step, a host loop
(docs/formulas.md#step.mxfp8_master_cast), counted by hand from the code: per MXFP8 weight 3 shard slices in
copy_main_weights_to_model_weights (NVIDIA/Megatron-LM megatron_fsdp/param_and_grad_buffer.py at cd4afffa6) and, in
Transformer Engine's _cast_master_weights_to_fp8_mxfp8_scaling (transformer_engine/pytorch/tensor/utils.py at
v2.14 - v2.17.1), 2 slices and 2 reshapes of the packed amaxes; per weight overlapping the rank's shard
quantize_master_weights' master_weight.to(model dtype) and the partial-amax call (the partial cast runs after the
amax all-reduce, behind it); per other parameter 2 get_item, and view + copy_ where it overlaps the shard."""

from __future__ import annotations

import pytest

from llmplan.cost.moe import EAGER_OP_HOST_S
from llmplan.cost.overhead import (BF16_CAST_SHARD_OPS, BF16_CAST_VIEW_OPS, MXFP8_CAST_SHARD_OPS,
                                   MXFP8_CAST_VIEW_OPS, mxfp8_cast_tensors, mxfp8_master_cast_seconds,
                                   mxfp8_weight_tensors)
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models

M = builtin_models()
ULTRA = M["nemotron-3-ultra"]
GB300 = "mbridge-26.08-pretrain-nemotron-3-ultra-dgx-gb300-256gpu-mxfp8-tp1pp1cp1ep64vpnagbs256mbs1"
GB200 = "mbridge-26.08-pretrain-nemotron-3-ultra-dgx-gb200-256gpu-mxfp8-tp2pp1cp1ep64vpnagbs256mbs1"
SUPER = "mbridge-26.08-pretrain-nemotron-3-super-dgx-gb300-64gpu-mxfp8-tp1pp1cp1ep64vpnagbs512mbs1"


def plan(**kw) -> ParallelPlan:
    base = dict(ep=64, dp=256, zero=3, micro_batch=1, global_batch=256, seq_len=8192, dtype="fp8", recipe="mxfp8",
                fp8_params=True, megatron_fsdp=True)
    return ParallelPlan(**{**base, **kw})


def test_ops_counted_from_the_code():
    # get_item x 3 (model, transpose, main buffer); amax slice x 2, reshape x 2 -- every MXFP8 weight
    assert MXFP8_CAST_VIEW_OPS == 3 + 4
    # master_weight.to(model_weight.dtype), mxfp8_scaling_compute_partial_amax -- a weight with a local shard
    assert MXFP8_CAST_SHARD_OPS == 2
    # get_item x 2 (model, main buffer: no transpose buffer); main_weight.view + copy_ where local
    assert (BF16_CAST_VIEW_OPS, BF16_CAST_SHARD_OPS) == (2, 2)


# Nemotron-3 Ultra (nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16, the built-in): 48 Mamba-2 and 12 attention
# mixers (in / out, QKV / proj: 2 each), 48 latent-MoE layers of 512 experts with a shared expert, one MTP module
# (eh_proj, attention, MoE). At EP64 8 local experts x (fc1, fc2).
DENSE = 2 * 60 + 48 * (2 + 2) + (1 + 2 + 2 + 2)  # mixers; shared fc1 / fc2, latent down / up; MTP
EXPERT = 48 * 16 + 16
# Other tensors: a Mamba-2 mixer's fused pre-norm, conv1d weight and bias, A_log, D, dt_bias, gated norm (7);
# attention's fused pre-norm (1); a MoE layer's pre-norm, router weight, expert bias (3); embedding, final norm,
# output layer (3); the MTP module's enorm, hnorm, final norm and its attention's and MoE's (3 + 1 + 3)
OTHER = 48 * 7 + 12 * 1 + 48 * 3 + 3 + 7


def test_ultra_tensors_by_hand():
    assert mxfp8_cast_tensors(ULTRA, plan()) == pytest.approx((DENSE, EXPERT, OTHER))
    assert (DENSE, EXPERT, DENSE + EXPERT) == (319, 784, 1103)
    assert mxfp8_weight_tensors(ULTRA, plan(ep=32, dp=128)) == pytest.approx(DENSE + 48 * 32 + 32)
    # a dense model: attention and MLP, 2 each a layer; even over the stages
    llama = M["llama-3.1-8b"]
    assert mxfp8_weight_tensors(llama, plan(ep=1, pp=2, dp=128)) == pytest.approx(32 * 4 / 2)


def test_a_repeated_mtp_layer_holds_one_module():
    # Megatron-Bridge's Ultra recipe: mtp_num_layers 2 with mtp_use_repeated_layer -- one module's weights
    two = ULTRA.model_copy(update={"num_nextn_predict_layers": 2, "mtp_repeated_layer": False})  # two modules
    assert mxfp8_weight_tensors(two, plan()) == pytest.approx(1103 + 1 + 2 + 4 + 16)
    rep = two.model_copy(update={"mtp_repeated_layer": True})
    assert mxfp8_cast_tensors(rep, plan()) == pytest.approx((DENSE, EXPERT, OTHER))


def test_bf16_layers_hold_no_mxfp8_weights():
    # 10 of the 108 layers in bf16 at the start, 8 at the end: their GEMM weights are walked as other tensors
    p = plan(bf16_layers_start=10, bf16_layers_end=8)
    frac = 1 - 18 / 108
    layers_d, layers_e = DENSE - 7, EXPERT - 16
    got = mxfp8_cast_tensors(ULTRA, p)
    assert got == pytest.approx((frac * layers_d + 7, frac * layers_e + 16, OTHER + (1 - frac) * (layers_d + layers_e)))
    assert mxfp8_weight_tensors(ULTRA, p) < 1103
    # attention kept in bf16 (bf16_modules): its QKV and output projections in every layer and the MTP module's
    att = mxfp8_cast_tensors(ULTRA, plan(bf16_modules=("attention",)))
    assert att == pytest.approx((DENSE - 2 * 13, EXPERT, OTHER + 2 * 13))


def host_by_hand(dense: float, expert: float, other: float, units: float, moe_units: float, shard: int,
                 expert_shard: int) -> float:
    local = min(dense, dense / shard + units) + min(expert, expert / expert_shard + moe_units)
    ops = 7 * (dense + expert) + 2 * local + 2 * other + 2 * min(other, other / shard + units)
    return ops * EAGER_OP_HOST_S * 2.75  # Grace's host_op_factor


def test_seconds_by_hand_and_only_under_megatron_fsdp_mxfp8_weights():
    p = plan()
    # 108 decoder layers + the MTP module: one bucket each (its routed experts one more); dense shard 256, expert 4
    host = host_by_hand(DENSE, EXPERT, OTHER, 109, 49, 256, 4)
    assert host == pytest.approx((7 * 1103 + 2 * (319 / 256 + 109 + 784 / 4 + 49) + 2 * 502
                                  + 2 * (502 / 256 + 109)) * 8e-6 * 2.75)
    # the optimizer step but the grad norm's read, fp32 gradients here: (2 x 12 + 3 x 4 + 1) / (2 x 12 + 4 x 4 + 1)
    assert (p.optimizer_bytes, p.grad_bytes, p.weight_bytes) == (12, 4, 1)
    queued = 37 / 41
    assert float(mxfp8_master_cast_seconds(ULTRA, p, 0.01, 2.75)) == pytest.approx(host - 0.01 * queued)
    assert float(mxfp8_master_cast_seconds(ULTRA, p, 1.0, 2.75)) == 0.0  # hidden behind a longer optimizer step
    for off in (dict(zero=1, megatron_fsdp=False), dict(fp8_params=False), dict(recipe="tensorwise"),
                dict(megatron_fsdp=False)):  # ZeRO-3 on DeepSpeed / FSDP2 runs no such loop
        assert float(mxfp8_master_cast_seconds(ULTRA, plan(**off), 0.0, 2.75)) == 0.0, off


def test_the_reviewers_zero3_plan_without_megatron_fsdp_pays_nothing(acc):
    from llmplan.cost.comm import mxfp8_amax_transfers
    p = plan(megatron_fsdp=False, ep=16, pp=4, dp=64)
    assert float(mxfp8_master_cast_seconds(ULTRA, p, 0.0, 2.75)) == 0.0
    assert not [t for t in mxfp8_amax_transfers(ULTRA, p, ("dpcp", "dpcp_in"), ("edp", "edp_in")) if t.calls]


def test_megatron_fsdp_zero2_refuses_fp8_params():
    # Megatron-LM cd4afffa6 megatron/core/distributed/fsdp/src/README.md: "Only FSDP / ZeRO-3 supports FP8 parameters"
    from llmplan.specs.cluster import ClusterSpec
    from llmplan.specs.registry import builtin_systems
    c = ClusterSpec(system=builtin_systems()["gb300-nvl72"], num_nodes=64)
    why = check_plan(ULTRA, plan(zero=2), c)
    hit = [v for v in why if v.rule == "megatron_fsdp_fp8_params"]
    assert hit and "megatron_fsdp with fp8_params at zero 2" in hit[0].message, why
    assert not [v for v in check_plan(ULTRA, plan(), c) if v.rule == "megatron_fsdp_fp8_params"]
    assert not [v for v in check_plan(ULTRA, plan(zero=2, fp8_params=False), c) if v.rule == "megatron_fsdp_fp8_params"]


def test_the_ultra_rows_pay_it_and_the_super_row_does_not(acc, published_runs):
    from llmplan.estimate import estimate_training
    got = {}
    for rid in (GB300, GB200, SUPER):
        m, cluster, p = acc.record_setup(published_runs[rid], acc.family(rid))
        e = estimate_training(m, cluster, p)
        got[rid] = (float(e.time.overheads["mxfp8_master_cast"]), float(e.time.optimizer))
    # the rows train MTP depth 2 on one repeated module: W 1,103 (not 1,126); HSDP's optimizer over the whole
    # dp group (256 at TP1, 128 at TP2), the experts' over 4; bf16 gradients: (24 + 3 x 2 + 1) / (24 + 4 x 2 + 1)
    for rid, shard in ((GB300, 256), (GB200, 128)):
        cast, opt = got[rid]
        assert cast == pytest.approx(host_by_hand(DENSE, EXPERT, OTHER, 109, 49, shard, 4) - opt * 31 / 33)
        assert 0.19 < cast < 0.21
    assert got[SUPER][0] == 0.0  # Megatron-Core's distributed optimizer (ZeRO-1)


def test_the_fp8_params_rule_leaves_the_plans_megatron_fsdp_does_not_touch():
    # The rule binds only where Megatron-FSDP acts (zero 2 without a pipeline; SwitchUse megatron_fsdp_zero): at
    # ZeRO-1 Megatron-Core's distributed optimizer gathers fp8 weights (--fp8-param-gather), and a pipelined plan
    # runs no Megatron-FSDP. Its fix names exits that export (not "--zero 2 --megatron-fsdp", which it refuses).
    from llmplan.specs.cluster import ClusterSpec
    from llmplan.specs.registry import builtin_systems
    c = ClusterSpec(system=builtin_systems()["gb300-nvl72"], num_nodes=64)
    for ok in (dict(zero=1), dict(zero=0), dict(zero=2, pp=4, dp=64, ep=16)):
        assert not [v for v in check_plan(ULTRA, plan(**ok), c) if v.rule == "megatron_fsdp_fp8_params"], ok
    hit = [v for v in check_plan(ULTRA, plan(zero=2), c) if v.rule == "megatron_fsdp_fp8_params"]
    assert hit and "use --zero 1 --no-megatron-fsdp" in hit[0].message, hit


def test_search_target_megatron_keeps_fp8_weights_at_zero_1():
    # Regression (review of cast-mend): the rule refused every fp8-weights plan of search --target megatron, which
    # turns megatron_fsdp on for all plans, so the search found none (rc 2).
    import json

    from typer.testing import CliRunner

    from llmplan.cli import app
    r = CliRunner().invoke(app, ["search", "-m", "llama-3.1-8b", "--hardware", "gb200-nvl72", "--nodes", "1",
                                 "--precision", "mxfp8", "--fp8-params", "--target", "megatron", "--global-batch",
                                 "64", "--top", "1", "--json"])
    assert r.exit_code == 0, r.output
    best = json.loads(r.stdout)["plans"][0]["plan"]
    assert best["fp8_params"] is True and best["zero"] <= 1, best
