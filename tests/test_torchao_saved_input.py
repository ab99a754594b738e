"""torchao's Float8Linear saves its bf16 input (docs/formulas.md#precision.torchao_saved_input).

Derivation, read at the cited commits:
- pytorch/ao@36027d82d1 torchao/float8/float8_linear.py: Float8Linear.forward calls
  matmul_with_hp_or_float8_args.apply(input, self.weight.t(), ...), whose forward runs
  ctx.save_for_backward(input_hp, weight_hp_t) and casts the input inside unless tensor_already_casted_to_fp8;
  backward casts input_hp again (cast_config_input_for_grad_weight) for the grad_weight mm. So each linear keeps
  the bf16 tensor it was given, the same tensor wq / wk / wv (and w1 / w3) are given: one tensor saved once,
  and wo's input is the attention core's output, which SDPA saves too. weight_hp_t is a view of the parameter.
  Since 12396c648 (v0.9.0) the per-tensor path passes the input in bf16 too; at eab345c (torchtitan's December
  2024 benchmarks) it cast the input first and manual_float8_matmul_with_args_in_float8 saved input_fp8.
- float8_tensor_parallel.py: under float8 TP (torchtitan v0.2.2 models/llama3/infra/parallelize.py:
  enable_float8_tensorwise_tp = enable_float8_linear and not float8_is_rowwise) PrepareFloat8ModuleInput and
  Float8Colwise/RowwiseParallel cast the input to fp8 before the redistribute, so the function gets (and
  saves) that fp8 copy; SDPA still saves its bf16 output beside wo's copy.
Llama 3.1 8B: h = 4096, 32 heads of 128, f = 14336 (SwiGLU), s = 8192, b = 1.
"""

from __future__ import annotations

import pytest

from llmplan.cost.activations import layer_activation_parts
from llmplan.cost.model_states import low_precision_weight_cache
from llmplan.cost.quantize import TORCHAO_REQUANTIZE_BYTES, fp8_cast_bytes, torchao_requantize_bytes
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models

L8 = builtin_models()["llama-3.1-8b"]
H, F, S = 4096, 14336, 8192


def plan(**kw) -> ParallelPlan:
    base = {"tp": 1, "pp": 1, "dp": 8, "zero": 3, "seq_len": S, "micro_batch": 1, "global_batch": 8,
            "dtype": "fp8", "recipe": "rowwise", "tp_impl": "dtensor", "flash_attention": True}
    return ParallelPlan(**{**base, **kw})


@pytest.mark.parametrize("recipe", ["rowwise", "tensorwise"])
def test_hp_saved_inputs_by_hand(recipe):
    """The QKV and MLP inputs once at 2 bytes (2sh each), wo's input the core's bf16 output (2sh, saved once),
    w2's input the gated product at 2 bytes: as bf16 keeps them."""
    p = layer_activation_parts(L8, plan(recipe=recipe, fp8_scaling="current"), moe=False)
    assert p.attn_input == 2 * S * H
    assert p.mlp_input == 2 * S * H
    assert p.attn_out == 2 * S * 32 * 128
    bf16 = layer_activation_parts(L8, plan(dtype="bf16", recipe="tensorwise"), moe=False)
    assert p.mlp == bf16.mlp and p.total == bf16.total


def test_pre_v09_tensorwise_saves_fp8_copies():
    """torchao < v0.9.0: fp8 copies (1 byte) of the QKV, MLP and w2 inputs; wo's fp8 copy beside the core's
    bf16 output (1 + 2 bytes)."""
    old = layer_activation_parts(L8, plan(recipe="tensorwise", fp8_scaling="current", torchao_saves_hp_input=False),
                                 moe=False)
    new = layer_activation_parts(L8, plan(recipe="tensorwise", fp8_scaling="current"), moe=False)
    assert old.attn_input == S * H and old.mlp_input == S * H
    assert old.attn_out == 3 * S * H
    assert new.mlp - old.mlp == S * F  # w2's input: 2 bytes against 1


def test_float8_tp_saves_the_gathered_fp8_copy():
    """Tensorwise with tp 2 (float8 TP): the gathered fp8 copy (1 byte, all s tokens under DTensor TP), and wo's
    fp8 copy of the rank's heads beside the core's bf16 output."""
    tp2 = plan(recipe="tensorwise", fp8_scaling="current", tp=2, sp=True)
    p = layer_activation_parts(L8, tp2, moe=False)
    assert p.attn_input == S * H
    assert p.attn_out == 3 * S * H / 2
    # so the torchao version switch does nothing there (check_switches: torchao_saves_hp_input_tp1)
    old = tp2.model_copy(update={"torchao_saves_hp_input": False})
    assert layer_activation_parts(L8, old, moe=False) == p
    assert fp8_cast_bytes(L8, old, False, fp8_tn_only=True) == fp8_cast_bytes(L8, tp2, False, fp8_tn_only=True)


def test_backward_requantisation_bytes():
    """Per token, one layer, over the step: each distinct saved input cast again in backward, h + a·d_v (QKV
    and wo inputs) + h + f (w1/w3 and w2 inputs) = 26624 elements, at 5 bytes compiled (amax read 2, cast read
    2, write 1), less the transposed fp8 byte fp8_cast_bytes counts in forward on Hopper for tensorwise; 35
    eager; 0 where the fp8 copy is saved."""
    widths = H + H + H + F
    assert widths == 26624
    assert torchao_requantize_bytes(L8, plan(), False, 0.0) == 5 * widths
    assert torchao_requantize_bytes(L8, plan(recipe="tensorwise", fp8_scaling="current"), False, 1.0) == 4 * widths
    assert torchao_requantize_bytes(L8, plan(fused_kernels=False), False, 0.0) == 35 * widths
    assert TORCHAO_REQUANTIZE_BYTES["eager"] == 6 + 27 + 2
    assert torchao_requantize_bytes(L8, plan(recipe="tensorwise", fp8_scaling="current",
                                             torchao_saves_hp_input=False), False, 1.0) == 0
    assert torchao_requantize_bytes(L8, plan(recipe="tensorwise", fp8_scaling="current", tp=2, sp=True),
                                    False, 1.0) == 0
    # fp8_cast_bytes adds it per pass (÷ 3) over the layer's s·b tokens
    hp = fp8_cast_bytes(L8, plan(recipe="tensorwise", fp8_scaling="current"), False, fp8_tn_only=True)
    old = fp8_cast_bytes(L8, plan(recipe="tensorwise", fp8_scaling="current", torchao_saves_hp_input=False), False,
                         fp8_tn_only=True)
    assert hp - old == pytest.approx(4 * widths * S / 3)


def test_megatron_stack_unchanged():
    """A Megatron-Core / TE plan (tp_impl megatron, per-tensor) still saves the quantised copy and its casts
    carry no torchao re-quantisation."""
    p = plan(recipe="tensorwise", fp8_scaling="current", tp_impl="megatron")
    assert layer_activation_parts(L8, p, moe=False).attn_input == S * H
    assert torchao_requantize_bytes(L8, p, False, 1.0) == 0


def test_no_weight_cache_for_torchao():
    """torchao keeps no fp8 weight copies across micro-batches (it casts the bf16 weight in each forward and
    backward): none even where a pipeline keeps FSDP's stage gathered; Transformer Engine's cache is kept."""
    piped = {"pp": 2, "dp": 4, "global_batch": 32, "recipe": "tensorwise", "fp8_scaling": "current"}
    assert low_precision_weight_cache(L8, plan(**piped), 0) == 0
    assert low_precision_weight_cache(L8, plan(**piped, tp_impl="megatron"), 0) > 0


def test_torchtitan_2412_rows_read_with_pre_v09_torchao(row_setup):
    """torchtitan's December 2024 rows ran torchao eab345c (benchmarks/llama3_h100_202412_torchtitan.md), before
    v0.9.0: read with torchao_saves_hp_input False (kept where it acts: tp 1); the 405B pipeline row (FSDP2's fp8 all-gather, the stage kept
    gathered) counts no fp8 weight cache, which torchao does not keep."""
    _, _, p = row_setup("torchtitan-2412-t2-llama31-8b-8gpu-cp1")
    assert p.tp == 1 and p.tp_impl == "dtensor" and p.recipe == "tensorwise"
    assert p.torchao_saves_hp_input is False
    m, _, p = row_setup("torchtitan-2412-t5-llama31-405b-512gpu-1f1b")
    assert p.tp_impl == "dtensor" and p.recipe == "tensorwise" and p.pp > 1
    assert low_precision_weight_cache(m, p, 0) == 0


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_the_search_prices_torchao_saves_as_the_scalar_estimate(recipe):
    """The search's plan arrays (tp varying: float8 TP at tp > 1) give each plan's scalar saved bytes and casts."""
    import numpy as np

    from llmplan.search.grid import Workload, default_space, enumerate_plans
    from llmplan.specs.plan import ClusterSpec
    from llmplan.specs.registry import builtin_systems

    cluster = ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=2)
    w = Workload(global_batch=64, seq_len=4096, dtype="fp8", recipe=recipe, fp8_scaling="current", tp_impl="dtensor")
    plans = enumerate_plans(default_space(L8, cluster, w), cluster, w)
    idx = np.random.default_rng(7).permutation(len(plans))[:8]
    sub = plans.take(idx)
    assert len(set(int(t) for t in np.asarray(sub.tp))) > 1
    vec = np.asarray(layer_activation_parts(L8, sub, False).total)
    scalar = [layer_activation_parts(L8, plans.plan(int(i)), False).total for i in idx]
    assert vec == pytest.approx(scalar)
    casts = np.asarray(fp8_cast_bytes(L8, sub, False))
    assert casts == pytest.approx([fp8_cast_bytes(L8, plans.plan(int(i)), False) for i in idx])
