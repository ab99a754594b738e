"""GPT-OSS's clamped GLU as Megatron-Core runs it (two eager clamps and a concatenation before the compiled
activation, weighted_bias_quick_geglu_impl): its memory-bound traffic counted by hand from the operations,
the second copy of the fc1 output the clamps keep, moe_act recompute, and the fused form (AutoModel)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.activations import glu_clamp_saved_bytes, layer_activation_parts, recomputed_module_bytes
from llmplan.cost.compute import (
    EAGER_ROPE_BYTES,
    GLU_CLAMP_BYTES,
    elementwise_bytes,
    expert_activation_extra_bytes,
    expert_bias_bytes,
)
from llmplan.specs.hf import from_hf_config
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan

TINY: dict = {"name": "tiny-moe", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
              "num_attention_heads": 4, "vocab_size": 1000, "max_position_embeddings": 4096,
              "num_experts": 16, "num_experts_per_tok": 2, "moe_intermediate_size": 128}
MOE_ACT = {"recompute": "selective", "recompute_modules": ("moe_act",)}


def test_clamp_bytes_counted_from_the_operations():
    # Per (row, FFN column) the fc1 output holds 2 bf16 elements (gate and linear half). Forward:
    # x_glu.clamp(max=l) and x_linear.clamp(-l, l) each read and write their half; torch.cat reads both halves
    # and writes the 2f-wide copy. Backward (PyTorch FunctionsManual.cpp clamp_backward): the gate's
    # where(self <= max, grad, 0) reads its saved input, writes a 1-byte mask, then reads mask and gradient and
    # writes the result; the linear half's where((self >= min).logical_and_(self <= max), grad, 0) makes two
    # masks, ANDs them in place and selects; the chunk's backward (split_backward) concatenates the two halves'
    # gradients into the fc1 output's gradient.
    elem, mask, per_row_col = 2, 1, 2
    clamps_fwd = per_row_col * (elem + elem)
    cat_fwd = per_row_col * (elem + elem)
    where = mask + elem + elem
    gate_bwd = (elem + mask) + where
    linear_bwd = 2 * (elem + mask) + (mask + mask + mask) + where
    split_bwd = per_row_col * (elem + elem)
    assert GLU_CLAMP_BYTES == (clamps_fwd + cat_fwd, gate_bwd + linear_bwd + split_bwd)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(s=st.sampled_from([512, 1024, 4096]), b=st.integers(1, 4), k=st.integers(1, 8),
       f=st.sampled_from([128, 768, 2880]), ep=st.sampled_from([1, 2, 8]), moe_act=st.booleans())
def test_clamp_traffic_is_its_passes_over_every_routed_row(s, b, k, f, ep, moe_act):
    spec = {**TINY, "num_experts_per_tok": k, "moe_intermediate_size": f}
    clamped, plain = ModelSpec(**spec, swiglu_limit=7.0), ModelSpec(**spec)
    plan = ParallelPlan(seq_len=s, micro_batch=b, ep=ep, dp=ep, **(MOE_ACT if moe_act else {}))
    fwd, bwd = GLU_CLAMP_BYTES
    r = 1 if moe_act else 0
    rows_cols = s * b * k * f
    # the stage charges memory-bound traffic three times: forward-equivalent bytes are (fwd (1 + r) + bwd) / 3
    extra = elementwise_bytes(clamped, plan, True) - elementwise_bytes(plain, plan, True)
    assert extra == pytest.approx((fwd * (1 + r) + bwd) / 3 * rows_cols)
    # fused (TE's ScaledClampedQGeGLU, AutoModel's compiled activation): no extra pass
    fused = plan.model_copy(update={"glu_clamp_fusion": True})
    assert elementwise_bytes(clamped, fused, True) == pytest.approx(elementwise_bytes(plain, fused, True))


def test_moe_act_recompute_reruns_the_activation_forward():
    # Megatron-Core checkpoints bias_act_func: its forward (read 2f, write f in bf16: 6 bytes a row and
    # column) runs again in backward; the stage's forward-equivalent units carry a third of it
    plain = ModelSpec(**TINY)
    plan, rec = ParallelPlan(seq_len=1024, micro_batch=2), ParallelPlan(seq_len=1024, micro_batch=2, **MOE_ACT)
    assert expert_activation_extra_bytes(plain, plan) == 0.0
    assert expert_activation_extra_bytes(plain, rec) == pytest.approx(6 / 3)
    rows_cols = 1024 * 2 * TINY["num_experts_per_tok"] * TINY["moe_intermediate_size"]
    assert elementwise_bytes(plain, rec, True) - elementwise_bytes(plain, plan, True) == pytest.approx(2 * rows_cols)
    # dense layers are not moe_act's
    assert elementwise_bytes(plain, rec, False) == elementwise_bytes(plain, plan, False)


def test_moe_act_rerun_runs_the_eager_activation_without_fused_kernels():
    # Megatron-Core (experts.py TEGroupedMLP.forward, core_v0.15.0 - core_v0.19.0) wraps bias_act_func in
    # CheckpointWithoutOutput, and _recompute calls the same function again: without the fused activation
    # (bias_activation_fusion off, fused_kernels False here) the rerun is the eager ops the forward ran, not the
    # fused kernel's pass. Per (row, FFN column) in bf16, forward: silu reads the gate half and writes its
    # output (2 + 2), the product reads both factors and writes the result (2 + 2 + 2): 10 bytes, against the
    # fused kernel's read 2f, write f (2 + 2 + 2 = 6). The stage charges three times the forward-equivalent bytes.
    silu, product, fused_pass = 2 + 2, 2 + 2 + 2, 2 + 2 + 2
    plain, clamped = ModelSpec(**TINY), ModelSpec(**TINY, swiglu_limit=7.0)
    eager = ParallelPlan(seq_len=1024, micro_batch=2, fused_kernels=False)
    eager_rec = ParallelPlan(seq_len=1024, micro_batch=2, fused_kernels=False, **MOE_ACT)
    assert expert_activation_extra_bytes(plain, eager) == 0.0
    assert expert_activation_extra_bytes(plain, eager_rec) == pytest.approx((silu + product) / 3)  # 10/3
    fused_rec = ParallelPlan(seq_len=1024, micro_batch=2, **MOE_ACT)
    assert expert_activation_extra_bytes(plain, fused_rec) == pytest.approx(fused_pass / 3)  # 6/3, unchanged
    rows_cols = 1024 * 2 * TINY["num_experts_per_tok"] * TINY["moe_intermediate_size"]
    extra = elementwise_bytes(plain, eager_rec, True) - elementwise_bytes(plain, eager, True)
    assert extra == pytest.approx(10 / 3 * rows_cols)
    # a clamped GLU: the clamp as priced (16 forward twice, 30 backward) beside the eager rerun's 10: 72 / 3
    assert expert_activation_extra_bytes(clamped, eager_rec) == pytest.approx((16 * 2 + 30 + 10) / 3)
    # an ungated MLP's activation is one kernel either way: read f, write f (4)
    gelu = ModelSpec(**TINY, gated_mlp=False)
    assert expert_activation_extra_bytes(gelu, eager_rec) == pytest.approx(4 / 3)
    assert expert_activation_extra_bytes(gelu, fused_rec) == pytest.approx(4 / 3)


def test_clamps_keep_a_second_copy_of_the_fc1_output_unless_moe_act_recomputes_it():
    clamped, plain = ModelSpec(**TINY, swiglu_limit=7.0), ModelSpec(**TINY)
    plan, rec = ParallelPlan(seq_len=1024, micro_batch=2), ParallelPlan(seq_len=1024, micro_batch=2, **MOE_ACT)
    rows_cols = 1024 * 2 * TINY["num_experts_per_tok"] * TINY["moe_intermediate_size"]
    # the clamps save their input (the 2f-wide bf16 fc1 output) beside the clamped copy the activation saves
    stored = layer_activation_parts(clamped, plan, True).mlp - layer_activation_parts(plain, plan, True).mlp
    assert stored == pytest.approx(2 * 2 * rows_cols)
    # moe_act recompute drops it with the activation's output: the layer then keeps what the unclamped one keeps
    kept = (layer_activation_parts(clamped, rec, True).mlp
            - recomputed_module_bytes(clamped, rec, True, layer_activation_parts(clamped, rec, True)))
    kept_plain = (layer_activation_parts(plain, rec, True).mlp
                  - recomputed_module_bytes(plain, rec, True, layer_activation_parts(plain, rec, True)))
    assert kept == pytest.approx(kept_plain)
    assert glu_clamp_saved_bytes(clamped, plan.model_copy(update={"glu_clamp_fusion": True})) == 0.0
    dense = {k: v for k, v in TINY.items() if k not in ("num_experts", "num_experts_per_tok", "moe_intermediate_size")}
    assert glu_clamp_saved_bytes(ModelSpec(**dense, swiglu_limit=7.0), plan) == 0.0


def test_gpt_oss_config_carries_its_clamp():
    # openai/gpt-oss-120b config.json: "swiglu_limit": 7.0
    cfg = {"model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 36,
           "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 201088,
           "max_position_embeddings": 131072, "num_local_experts": 128, "num_experts_per_tok": 4,
           "sliding_window": 128, "swiglu_limit": 7.0}
    assert ModelSpec(**from_hf_config(cfg, "gpt-oss-120b")).swiglu_limit == 7.0
    assert "swiglu_limit" not in from_hf_config({**cfg, "swiglu_limit": None}, "x")


def test_bridge_rows_clamp_eagerly_and_automodel_fused(published_runs):
    # Megatron-Bridge's GPT-OSS presets run Megatron-Core's TEGroupedMLP (op fuser off); NeMo AutoModel's
    # GPT-OSS 20B row runs its compiled quick_geglu_deepep (components/moe/experts.py at 36044ad3d)
    import accuracy  # benchmarks/accuracy.py (conftest puts benchmarks/ on the path)

    bridge = published_runs["mbridge-26.04.01-pretrain-gpt-oss-120b-dgx-b200-64gpu-bf16-tp1pp1cp1ep8vpnagbs1280mbs4"]
    auto = published_runs["automodel-h100-bf16-gpt-oss-20b-8gpu-gbs256"]
    assert accuracy.plan_for(bridge, "mbridge-moe", 64).glu_clamp_fusion is False
    assert accuracy.plan_for(auto, "automodel", 8).glu_clamp_fusion is True


def test_eager_rotary_bytes_counted_from_the_operations():
    # Megatron-Core _apply_rotary_pos_emb_bshd on a bf16 q or k (rot_dim = head dim, t_pass empty), per
    # element. Forward: t * cos_ (read 2, write 2); _rotate_half: -x2 on half the elements (read 2, write 2
    # each: 2 an element) and torch.cat((-x2, x1)) (read 2, write 2); * sin_ (4); the sum (read 2 + 2, write
    # 2); torch.cat((t, t_pass)) copies t (4). Backward: grad * sin_ and grad * cos_ (4 each; freqs need no
    # gradient), the negation's gradient on half (2), chunk's split_backward concatenation (4), the two
    # branches accumulated (read 4, write 2), slice_backward into a zero-filled full-size tensor (write 2,
    # read 2, write 2).
    fwd = 4 + 2 + 4 + 4 + 6 + 4
    bwd = 4 + 4 + 2 + 4 + 6 + 6
    assert EAGER_ROPE_BYTES == (fwd, bwd)
    m = ModelSpec(**{**TINY, "num_key_value_heads": 2})
    fused, eager = ParallelPlan(seq_len=1024, micro_batch=2), ParallelPlan(seq_len=1024, micro_batch=2,
                                                                          rope_fusion=False)
    qk = 1024 * 2 * (256 // 4) * (4 + 2)  # tokens x head dim x (query + key heads)
    # the fused kernel: read and write q and k once forward (4 bytes), twice that backward; the stage
    # charges three times the forward-equivalent bytes
    extra = elementwise_bytes(m, eager, False) - elementwise_bytes(m, fused, False)
    assert extra == pytest.approx((fwd + bwd - 3 * 4) / 3 * qk)
    # learned positions: no rotary either way
    learned = ModelSpec(**{**TINY, "learned_position_embeddings": True})
    assert elementwise_bytes(learned, eager, False) == elementwise_bytes(learned, fused, False)


def test_bridge_gpt_oss_rows_run_the_eager_rotary(published_runs):
    # Megatron-Bridge gpt_provider.py: validate_rope_fusion_compatibility is False for position_embedding_type
    # "yarn" (GPT-OSS), so apply_rope_fusion = False; other Bridge rows (Qwen3 "rope") keep TE's fused RoPE
    import accuracy  # benchmarks/accuracy.py (conftest puts benchmarks/ on the path)

    oss = published_runs["mbridge-26.04.01-pretrain-gpt-oss-120b-dgx-b200-64gpu-bf16-tp1pp1cp1ep8vpnagbs1280mbs4"]
    assert accuracy.plan_for(oss, "mbridge-moe", 64).rope_fusion is False
    auto = published_runs["automodel-h100-bf16-gpt-oss-20b-8gpu-gbs256"]
    assert accuracy.plan_for(auto, "automodel", 8).rope_fusion is True  # AutoModel's recipe: rope_fusion true


def test_te_op_fuser_adds_the_expert_bias_in_the_gemm():
    # Megatron-Core's op-fuser path builds fc2 as Transformer Engine's GroupedLinear op with the bias
    # (experts.py _make_fused_ops): no eager _apply_bias passes
    m = ModelSpec(**TINY, mlp_bias=True)
    eager = ParallelPlan(seq_len=1024, micro_batch=2, moe_dispatcher="deepep")
    fused = eager.model_copy(update={"expert_bias_fusion": True})
    assert expert_bias_bytes(m, eager) > 0
    assert expert_bias_bytes(m, fused) == 0.0
    assert elementwise_bytes(m, fused, True) == pytest.approx(elementwise_bytes(ModelSpec(**TINY), fused, True))


def test_bridge_gb_mxfp8_presets_run_the_op_fuser(published_runs):
    # Megatron-Bridge v0.5.0 GPT_OSS_120B_PRETRAIN_CONFIG_GB{200,300}_FP8_MX_V2 set cutedsl_fused_grouped_mlp
    # (utils/overrides.py: use_transformer_engine_op_fuser True); v0.6.0 _apply_gpt_oss_120b_full_iter_fp8mx_configs
    # sets the op fuser; the B300 MXFP8 preset (= its BF16 V2) and every BF16 preset do not
    import accuracy  # benchmarks/accuracy.py (conftest puts benchmarks/ on the path)

    on = ["mbridge-26.06-pretrain-gpt-oss-120b-dgx-gb300-64gpu-mxfp8-tp1pp1cp1ep16vpnagbs1280mbs4",
          "mbridge-26.08-pretrain-gpt-oss-120b-dgx-gb200-64gpu-mxfp8-tp1pp1cp1ep64vpnagbs1280mbs4"]
    off = ["mbridge-26.06-pretrain-gpt-oss-120b-dgx-b300-64gpu-mxfp8-tp1pp1cp1ep8vpnagbs1280mbs4",
           "mbridge-26.04.01-pretrain-gpt-oss-120b-dgx-gb300-64gpu-bf16-tp1pp1cp1ep64vpnagbs1280mbs4"]
    for rid in on + off:
        plan = accuracy.plan_for(published_runs[rid], "mbridge-moe", 64)
        assert (plan.glu_clamp_fusion, plan.expert_bias_fusion) == ((True, True) if rid in on else (False, False))


@pytest.mark.parametrize("name", ["gpt-oss-120b", "qwen3-30b-a3b"])
def test_the_search_prices_the_eager_moe_act_rerun_as_the_one_plan_estimate(name):
    # The vectorised search (plan arrays) against estimate_training plan by plan, with moe_act recomputed and
    # the eager activation (fused_kernels off), where the rerun takes activation_forward_bytes' eager branch.
    from itertools import islice

    from llmplan.search.grid import Workload, default_space, enumerate_plans
    from llmplan.specs.check import check_plan
    from llmplan.specs.plan import ClusterSpec
    from llmplan.specs.registry import builtin_models, builtin_systems
    from tests.agreement import assert_arrays_agree
    m = builtin_models()[name]
    cluster = ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=2)
    w = Workload(global_batch=64, seq_len=4096, fused_kernels=False, recompute_modules=("moe_act",))
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    ok = (i for i in range(len(plans)) if not check_plan(m, plans.plan(i), cluster))
    idx = list(islice(ok, 24))
    assert any(plans.plan(i).recomputes("moe_act") and not plans.plan(i).fused_kernels for i in idx)
    assert_arrays_agree(m, cluster, plans, idx)
