"""Memory of the switches modern recipes set: transposed fp8 weight copies only where FP8 GEMMs are TN-only,
primary weights in the recipe's low-precision format (fp8, NVFP4), and `search` trying bf16 gradient buffers
and low-precision primary weights where the recipe allows them, saying which it chose (text and JSON)."""

from __future__ import annotations

import pytest
from conftest import one_train_search

from llmplan.cost.memory import low_precision_weight_cache, training_memory
from llmplan.cost.model_states import bf16_kept_params
from llmplan.cost.params import rank_params
from llmplan.estimate import estimate_training
from llmplan.search.grid import Workload
from llmplan.search.run import switch_variants
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems
from llmplan.units import GIB

M = builtin_models()
S = builtin_systems()


def _cache_per_linear_weight(plan: ParallelPlan, tn_only: bool) -> float:
    m = M["llama-3.1-70b"]
    # a middle stage (20 of the 80 layers at pp 4; no embedding, no output layer): its linear weights are its
    # parameters less two RMSNorms (h each, replicated over TP) a layer
    linear = float(rank_params(m, plan, 1).total) - 20 * 2 * m.hidden_size
    return float(low_precision_weight_cache(m, plan, 1, tn_only)) / linear


def test_fp8_weight_cache_keeps_the_transpose_only_where_fp8_gemms_are_tn_only():
    # Transformer Engine pytorch/csrc/quantizer.cpp: the Float8 quantizers allocate the columnwise (transposed)
    # copy only when nvte_is_non_tn_fp8_gemm_supported() is false (Hopper); Blackwell multiplies any layout.
    plan = ParallelPlan(pp=4, tp=8, dtype="fp8", recipe="tensorwise", global_batch=64, seq_len=4096)
    assert _cache_per_linear_weight(plan, True) == pytest.approx(2.0, rel=1e-12)
    assert _cache_per_linear_weight(plan, False) == pytest.approx(1.0, rel=1e-12)
    kept = plan.model_copy(update={"fp8_params": True})  # the fp8 model copy is the rowwise copy
    assert _cache_per_linear_weight(kept, True) == pytest.approx(1.0, rel=1e-12)
    assert _cache_per_linear_weight(kept, False) == 0.0
    mx = plan.model_copy(update={"recipe": "mxfp8"})  # rowwise + columnwise MXFP8 copies on every GPU
    assert _cache_per_linear_weight(mx, False) == pytest.approx(2 + 2 / 32, rel=1e-12)


def test_nvfp4_primary_weights_hold_four_bits_and_a_scale_per_16():
    # Megatron-LM --fp4-param-gather: the compute parameter is NVFP4 (E2M1 values, an E4M3 scale per 16).
    plan = ParallelPlan(pp=4, tp=8, dtype="fp4", recipe="nvfp4", global_batch=64, seq_len=4096)
    kept = plan.model_copy(update={"fp8_params": True})
    assert plan.weight_bytes == 2.0 and kept.weight_bytes == pytest.approx(0.5 + 1 / 16)
    share = plan.low_precision_layer_fraction(80)
    assert _cache_per_linear_weight(plan, False) == pytest.approx(share * (1 + 2 / 16), rel=1e-12)
    assert _cache_per_linear_weight(kept, False) == pytest.approx(share * (0.5 + 1 / 16), rel=1e-12)


def test_blackwell_estimate_prices_no_fp8_transpose_and_hopper_does():
    m = M["llama-3.1-70b"]
    plan = ParallelPlan(tp=4, pp=4, dp=4, sp=True, zero=1, dtype="fp8", fp8_params=True, grad_dtype="bf16",
                        global_batch=64, seq_len=4096)
    h100 = estimate_training(m, ClusterSpec(system=S["dgx-h100"], num_nodes=8), plan).memory
    gb200 = estimate_training(m, ClusterSpec(system=S["gb200-nvl72"], num_nodes=16), plan).memory
    rp = rank_params(m, plan, int(h100.stage))
    # every weight 1 byte, the recipe's cache, and 1 more a parameter kept in bf16 (embedding / output layer,
    # norms: docs/formulas.md#mem.fp8_param_bf16_parts)
    kept = float(bf16_kept_params(m, plan, int(h100.stage)).total)
    assert float(h100.weights) == pytest.approx(float(rp.total) * 1.0 + float(low_precision_weight_cache(
        m, plan, int(h100.stage), True)) + kept * 1.0, rel=1e-9)
    assert float(gb200.weights) < float(h100.weights)


def test_memory_mechanisms_agree_between_plan_arrays_and_one_plan():
    from llmplan.search.grid import from_plan

    m = M["llama-3.1-405b"]
    for dtype, recipe in (("fp8", "tensorwise"), ("fp8", "mxfp8"), ("fp4", "nvfp4")):
        plan = ParallelPlan(tp=4, pp=8, pp_first=15, pp_last=15, vpp=1, dp=8, sp=True, zero=1, dtype=dtype,
                            recipe=recipe, fp8_params=True, grad_dtype="bf16", global_batch=512, seq_len=8192)
        for tn in (True, False):
            one = training_memory(m, plan, 180 * GIB, None, tn)
            many = training_memory(m, from_plan(plan), 180 * GIB, None, tn)
            assert float(many.total[0]) == pytest.approx(float(one.total), rel=1e-12)


def test_switch_variants_follow_the_recipe_and_the_pins():
    both = [{"grad_dtype": g, "fp8_params": p} for g in ("fp32", "bf16") for p in (False, True)]
    assert switch_variants(Workload(dtype="fp8", recipe="tensorwise"), False, False) == both
    assert switch_variants(Workload(dtype="fp4", recipe="nvfp4"), False, False) == both
    # torchao's rowwise recipe casts inside each GEMM: no fp8 model copy to keep
    assert switch_variants(Workload(dtype="fp8", recipe="rowwise"), False, False) == \
        [{"grad_dtype": g, "fp8_params": False} for g in ("fp32", "bf16")]
    assert switch_variants(Workload(dtype="bf16"), False, False) == \
        [{"grad_dtype": "fp32", "fp8_params": False}, {"grad_dtype": "bf16", "fp8_params": False}]
    assert switch_variants(Workload(dtype="fp32"), False, False) == [{"grad_dtype": "fp32", "fp8_params": False}]
    pinned = Workload(dtype="fp8", grad_dtype="fp32", fp8_params=False)
    assert switch_variants(pinned, True, True) == [{"grad_dtype": "fp32", "fp8_params": False}]


MLPERF_405B = ("--model", "llama-3.1-405b", "--hardware", "dgx-h100", "--nodes", "64", "--seq-len", "8192",
               "--global-batch", "1152", "--dtype", "fp8", "--tp", "8", "--pp", "8", "--vpp", "8", "--cp", "2",
               "--pp-first-layers", "15", "--pp-last-layers", "15", "--recompute", "none", "--zero", "1",
               "--micro-batch", "1")


def test_search_tries_the_switches_and_says_which_it_chose(cli):
    # Llama 3.1 405B in MLPerf's layout on 512 H100 (TP8 PP8 VPP8 CP2, fp8): with fp32 gradient buffers and
    # bf16 primary weights the layout needs 89.6 GiB (issue 32); the search tries the four settings.
    with one_train_search():  # the text below renders this search's result: one search, not two
        r, text = cli("search", *MLPERF_405B, "--json"), cli("search", *MLPERF_405B)
    assert r.code == 0, r.err
    doc = r.json()
    s = doc["switches"]
    assert (s["grad_dtype"], s["fp8_params"]) == ("bf16", True)
    assert [(t["grad_dtype"], t["fp8_params"]) for t in s["tried"]] == \
        [("fp32", False), ("fp32", True), ("bf16", False), ("bf16", True)]
    assert s["tried"][0]["score"] == 0.0  # nothing fits with fp32 gradients and bf16 weights
    assert s["tried"][-1]["score"] == max(t["score"] for t in s["tried"]) > 0
    best = doc["plans"][0]["plan"]
    assert (best["grad_dtype"], best["fp8_params"]) == ("bf16", True)
    assert text.code == 0
    assert "switches: gradient buffers bf16, low-precision primary weights on" in " ".join(text.out.split())


def test_pinned_switches_are_not_tried(cli):
    r = cli("search", *MLPERF_405B, "--grad-dtype", "bf16", "--fp8-params", "--json")
    assert r.code == 0, r.err
    assert "switches" not in r.json()
    assert r.json()["plans"][0]["plan"]["grad_dtype"] == "bf16"


@pytest.mark.parametrize("dtype,recipe,kept", [("fp8", "tensorwise", 1.0), ("fp8", "mxfp8", 1 + 1 / 32),
                                               ("fp8", "blockwise", 1 + 4 / 128), ("fp4", "nvfp4", 0.5 + 1 / 16)])
def test_low_precision_keeps_the_quantised_gemm_inputs_for_backward(dtype, recipe, kept):
    # Transformer Engine saves the quantised input of each GEMM (the copy wgrad reads): 1 fp8 byte, with an
    # fp32 scale per 128 (blockwise), an E8M0 scale per 32 (MXFP8), or 4 bits and an E4M3 scale per 16
    # (NVFP4, on its 85% of quantised layers), instead of bf16's 2. Llama-3.1-70B, TP8 + SP, 4,096 tokens.
    from llmplan.cost.memory import layer_activation_bytes

    m = M["llama-3.1-70b"]
    base = dict(tp=8, sp=True, seq_len=4096, micro_batch=1, global_batch=8)
    bf16 = layer_activation_bytes(m, ParallelPlan(**base), False)
    low = ParallelPlan(**base, dtype=dtype, recipe=recipe)
    s, h, t = 4096, m.hidden_size, 8
    # The output projection's input: under the recipes other than delayed scaling Megatron-Core's
    # save_original_input keeps the core's bf16 output there, as bf16 does; under delayed scaling linear_proj
    # keeps its fp8 copy and the fused core its bf16 output beside it (TE FusedAttnFunc saves out): `kept` more
    # (docs/formulas.md#precision.save_original_input)
    proj = m.num_attention_heads * m.d_head / t * s if recipe == "tensorwise" else 0
    elements = s * (2 * h / t + m.intermediate_size / t)
    share = low.low_precision_layer_fraction(m.num_hidden_layers)
    assert float(bf16 - layer_activation_bytes(m, low, False)) == pytest.approx(
        share * ((2 - kept) * elements - kept * proj))
