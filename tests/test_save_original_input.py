"""Transformer Engine's save_original_input where Megatron-Core sets it under the recompute / offload modules
(docs/formulas.md#precision.save_original_input).

Derivation, read at the cited commits:
- NVIDIA/Megatron-LM d98e8a64dd megatron/core/transformer/moe/experts.py TEGroupedMLP.__init__:
  set_save_original_input(linear_fc2) when "moe_act" is in recompute_modules and fp8 / fp4;
  set_save_original_input(linear_fc1) under the expert_fc1 offload unless the recipe is mxfp8 / nvfp4.
  transformer_layer.py: "layernorm" recompute of a separate input norm with fp8 / fp4 calls
  self_attention.set_for_recompute_input_layernorm(), which on MLA (multi_latent_attention.py) sets it on
  linear_q_down_proj (with a query rank) and linear_kv_down_proj.
- NVIDIA/TransformerEngine d0067d0da6 transformer_engine/pytorch/module/linear.py and grouped_linear.py: with the
  flag the forward cast is rowwise only (columnwise=... and not save_original_input), the bf16 input is saved,
  and backward quantises it again for the wgrad GEMM (Linear: columnwise only; GroupedLinear's split path:
  rowwise and columnwise for Float8Quantizer / Float8CurrentScalingQuantizer, columnwise only otherwise);
  DelayedScaling raises ("DelayedScaling recipe is not supported with save_original_input").
So per element of such an input: one more read of the bf16 input (2 bytes) and, under current scaling, one more
amax read (2); the columnwise copy moves from forward to backward; on Hopper the split path's per-tensor
quantizer writes the rowwise byte again (1).
"""

from __future__ import annotations

import pytest

from llmplan.cost.quantize import fp8_cast_bytes
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models

M = builtin_models()
S = 4096


def plan(**kw) -> ParallelPlan:
    base = {"tp": 1, "pp": 1, "dp": 16, "ep": 16, "seq_len": S, "micro_batch": 1, "global_batch": 1024,
            "dtype": "fp8", "recipe": "mxfp8", "expert_gemm": "per-expert"}
    return ParallelPlan(**{**base, **kw})


def extra(m, p: ParallelPlan, moe: bool, hopper: bool = False, **kw) -> float:
    """Cast bytes per token of s·b over the step that the switches `kw` add to plan `p` (fp8_cast_bytes charges a
    third per pass and scales by the low-precision layer share, 1 here)."""
    with_kw = p.model_copy(update=kw)
    return (float(fp8_cast_bytes(m, with_kw, moe, hopper)) - float(fp8_cast_bytes(m, p, moe, hopper))) * 3 / S


def test_moe_act_recompute_reads_fc2_input_again_mxfp8():
    # Qwen3-30B-A3B (config.json): top-8 experts of 768. fc2's input is 8·768 elements a token at TP 1; MXFP8
    # backward re-reads it (2 bytes), the columnwise copy only moves from forward to backward: 2·8·768.
    m = M["qwen3-30b-a3b"]
    p = plan()
    assert extra(m, p, True, recompute="selective", recompute_modules=("moe_act",)) == pytest.approx(2 * 8 * 768)


def test_moe_act_recompute_hopper_current_scaling():
    # Per-tensor fp8, current scaling, on Hopper: the re-read (2), its amax read (2) and, on GroupedLinear's split
    # path, the rowwise byte written again (1): 5·8·768 a token.
    m = M["qwen3-30b-a3b"]
    p = plan(recipe="tensorwise", fp8_scaling="current")
    got = extra(m, p, True, True, recompute="selective", recompute_modules=("moe_act",))
    assert got == pytest.approx(5 * 8 * 768)
    # delayed scaling: Transformer Engine refuses the flag; nothing priced
    p = plan(recipe="tensorwise", fp8_scaling="delayed")
    assert extra(m, p, True, True, recompute="selective", recompute_modules=("moe_act",)) == 0.0


def test_moe_act_recompute_on_the_fused_grouped_mlp_adds_nothing():
    # The fused MXFP8 grouped MLP's ops do not go through linear_fc2's module flag (and its epilogue quantises
    # fc2's input): nothing added.
    m = M["qwen3-30b-a3b"]
    p = plan(expert_gemm="grouped")
    assert extra(m, p, True, recompute="selective", recompute_modules=("moe_act",)) == 0.0


def test_expert_fc1_offload_rereads_fc1_input_unless_mx():
    # expert_fc1 offload sets the flag on fc1 (8 rows of h = 2048 a token) except under MXFP8 / NVFP4.
    m = M["qwen3-30b-a3b"]
    p = plan(recipe="tensorwise", fp8_scaling="current")
    assert extra(m, p, True, True, offload_modules=("expert_fc1",)) == pytest.approx(5 * 8 * 2048)
    assert extra(m, plan(), True, offload_modules=("expert_fc1",)) == 0.0


def test_layernorm_recompute_rereads_mla_down_projection_inputs():
    # DeepSeek-V3 (q_lora_rank 1536): linear_q_down_proj and linear_kv_down_proj both read the h = 7168 norm
    # output; MXFP8: 2 bytes each again, 2·2·7168 a token; an MoE layer's pre-MLP norm adds nothing (its shared
    # expert's fc1 already has the flag).
    m = M["deepseek-v3"]
    p = plan(ep=8, dp=8, global_batch=512)
    assert extra(m, p, True, recompute="selective", recompute_modules=("layernorm",)) == pytest.approx(2 * 2 * 7168)
    assert extra(m, p, False, recompute="selective", recompute_modules=("layernorm",)) == pytest.approx(2 * 2 * 7168)
    # a dense GQA model: its input norm is fused into the QKV LayerNormLinear, no flag
    llama = M["llama-3.1-8b"]
    q = plan(ep=1, dp=16, global_batch=64)
    assert extra(llama, q, False, recompute="selective", recompute_modules=("layernorm",)) == 0.0


@pytest.mark.parametrize("name,fields", [
    ("qwen3-30b-a3b", {"dtype": "fp8", "recipe": "tensorwise", "fp8_scaling": "current",
                       "recompute_modules": ("moe_act", "layernorm"), "offload_modules": ("expert_fc1",)}),
    ("qwen3-30b-a3b", {"dtype": "fp8", "recipe": "blockwise", "recompute_modules": ("moe_act",)}),
])
def test_the_search_prices_the_flag_as_the_one_plan_estimate(name, fields):
    # The vectorised search (plan arrays: recompute selective among other modes, SP on and off, TP > 1) against
    # estimate_training plan by plan, with the modules that set the flag held by the workload.
    from itertools import islice

    from llmplan.search.grid import Workload, default_space, enumerate_plans
    from llmplan.specs.check import check_plan
    from llmplan.specs.plan import ClusterSpec
    from llmplan.specs.registry import builtin_systems
    from tests.agreement import assert_arrays_agree
    m, cluster = M[name], ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=2)
    w = Workload(global_batch=64, seq_len=4096, **fields)
    plans = enumerate_plans(default_space(m, cluster, w), cluster, w)
    ok = (i for i in range(len(plans)) if not check_plan(m, plans.plan(i), cluster))
    idx = list(islice(ok, 24))
    assert any(plans.plan(i).recomputes("moe_act") for i in idx)
    assert_arrays_agree(m, cluster, plans, idx)


def test_check_plan_refuses_delayed_scaling_with_a_flagged_module():
    # Transformer Engine v2.6 - d0067d0da6 (linear.py, grouped_linear.py): "DelayedScaling recipe is not supported
    # with save_original_input"; Megatron-Core sets the flag under these switches whatever the fp8 recipe.
    from llmplan.specs.check import check_plan
    m = M["qwen3-30b-a3b"]
    delayed = plan(recipe="tensorwise", fp8_scaling="delayed", recompute="selective")
    for kw in ({"recompute_modules": ("moe_act",)}, {"offload_modules": ("expert_fc1",)}):
        rules = [v.rule for v in check_plan(m, delayed.model_copy(update=kw))]
        assert "delayed_scaling_original_input" in rules
        current = delayed.model_copy(update={**kw, "fp8_scaling": "current"})
        assert "delayed_scaling_original_input" not in [v.rule for v in check_plan(m, current)]
    # layernorm: MLA's down-projections (DeepSeek-V3); a GQA model without a shared expert has no flagged linear
    ds = plan(ep=8, dp=8, global_batch=512, recipe="tensorwise", recompute="selective",
              recompute_modules=("layernorm",))
    assert "delayed_scaling_original_input" in [v.rule for v in check_plan(M["deepseek-v3"], ds)]
    assert "delayed_scaling_original_input" not in [
        v.rule for v in check_plan(m, delayed.model_copy(update={"recompute_modules": ("layernorm",)}))]


def test_deepseek_s_own_stack_is_not_priced_with_the_te_flag():
    # ep_dispatch_fp8 stands for DeepSeek-V3's own framework (the `deepseek` report row), which has no TE module
    m = M["deepseek-v3"]
    p = plan(ep=8, dp=8, global_batch=512, recipe="blockwise", ep_dispatch_fp8=True)
    assert extra(m, p, True, recompute="selective", recompute_modules=("moe_act", "layernorm")) == 0.0
    assert extra(m, p.model_copy(update={"ep_dispatch_fp8": False}), True, recompute="selective",
                 recompute_modules=("moe_act",)) > 0


def test_cli_refuses_delayed_scaling_with_moe_act_in_one_line(cli):
    line = cli("estimate", "--model", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--nodes", "2", "--ep", "8",
               "--precision", "fp8-tensorwise", "--recompute", "selective", "--recompute-modules", "moe_act").refusal()
    assert "delayed scaling" in line and "moe_act" in line and "--fp8-scaling current" in line, line
