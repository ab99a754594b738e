"""fp8 casts of a hybrid stack, per sub-block kind (docs/formulas.md#mixers.casts): each Transformer Engine
linear casts its input in forward and its output gradient in backward. Megatron-LM's Mamba-2 mixer has two such
linears (megatron/core/ssm/mamba_mixer.py: in_proj h -> 2HP + 2GN + H, out_proj HP -> h; its convolution and
SSD kernels run in bf16), Megatron's attention two (linear_qkv, linear_proj), an MoE block its shared expert's two
and its routed experts' two GroupedLinears on the k permuted rows of each token (docs/formulas.md#moe.expert_casts:
Megatron-LM d98e8a6 token_dispatcher.py / experts.py, TransformerEngine d0067d0 grouped_linear.py)."""

from __future__ import annotations

import pytest

from llmplan.cost.quantize import CAST_BYTES, fp8_cast_bytes
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models


# the other casts: linear_proj's save_original_input is held out (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("without_linear_proj_flag")


M = builtin_models()
S = 4096


def plan(**kw) -> ParallelPlan:
    # per-expert: TEGroupedMLP, whose experts' GEMM inputs are all cast by kernels (the fused grouped MLP casts two
    # of them in its epilogues: docs/formulas.md#moe.fused_mlp, the last assertion of the first test)
    base = {"tp": 1, "pp": 1, "dp": 8, "zero": 1, "seq_len": S, "micro_batch": 1, "global_batch": 64, "dtype": "fp8",
            "recipe": "mxfp8", "expert_gemm": "per-expert"}
    return ParallelPlan(**{**base, **kw})


def step_elements(m, p) -> float:
    """Cast elements per token over the step, all layers (the function charges a third of it per pass)."""
    return sum(n * fp8_cast_bytes(m, p, moe) * 3 / S / CAST_BYTES["mxfp8"]
               for moe, n in ((False, m.num_dense_layers), (True, m.num_moe_layers)))


def test_nemotron_3_nano_casts_counted_by_hand_from_megatron_s_modules():
    # Nemotron-3 Nano (the nemotron-3-nano built-in): h 2688; 23 Mamba-2 layers of 64 heads
    # of 64 (HP 4096), 8 groups of state 128 (GN 1024); 6 attention layers of 32 query heads and 2 KV heads of
    # 128; 23 MoE layers, 6 routed experts of 1856 and a shared expert of 3712 a token.
    h, HP, GN, H = 2688, 4096, 1024, 64
    mamba = (h + HP) + (h + 2 * HP + 2 * GN + H)  # forward in_proj, out_proj inputs; backward their gradients
    assert mamba == 19776  # the count docs/validation.md#nemotron-ssd-rate states for Megatron's Mamba block
    attention = (h + 32 * 128) + (h + (32 + 2 * 2) * 128)
    # routed (squared ReLU, c = 1): forward fc1 input k·h and fc2 input k·f_e, backward fc2's output gradient k·h
    # and fc1's k·f_e; the shared expert the same at one row of width 3712
    moe = 6 * (h + 1856) * 2 + (h + 3712) * 2
    assert moe == 67328  # the count docs/validation.md#fp8-small-gemm states for this MoE layer
    m = M["nemotron-3-nano"]
    assert step_elements(m, plan()) == pytest.approx(23 * mamba + 6 * attention + 23 * moe)
    # TE's fused MXFP8 grouped MLP (squared ReLU, TE >= 2.17) quantises fc2's input (forward) and fc1's output
    # gradient (backward) of the routed experts in its GEMMs' epilogues: 2 x 6 x 1856 fewer per MoE layer
    fused = moe - 2 * 6 * 1856
    assert step_elements(m, plan(expert_gemm="grouped")) == pytest.approx(23 * mamba + 6 * attention + 23 * fused)


def test_sequence_parallelism_casts_the_hidden_wide_tensors_on_the_shard():
    # At TP2 with SP the rank casts its half of the heads' widths and, before the gather, its sequence shard of
    # each h-wide input and output gradient (as the transformer count does): every term halves. The routed
    # experts at expert TP 2 (etp unset: tp) all-gather the bf16 rows over the expert-TP group before casting them:
    # k·etp/t = 6 rows a token of width h, f_e/etp wide; at expert TP 1 the rank's k/t = 3 rows of the whole f_e.
    h, HP, GN, H = 2688, 4096, 1024, 64
    mamba = (h + HP) + (h + 2 * HP + 2 * GN + H)
    attention = (h + 32 * 128) + (h + (32 + 2 * 2) * 128)
    shared = (h + 3712) * 2 / 2
    moe = 6 * (h + 1856 / 2) * 2 + shared
    moe_etp1 = 3 * (h + 1856) * 2 + shared
    m = M["nemotron-3-nano"]
    assert step_elements(m, plan(tp=2, dp=4, sp=True)) == pytest.approx(23 * mamba / 2 + 6 * attention / 2 + 23 * moe)
    assert step_elements(m, plan(tp=2, dp=4, sp=True, etp=1)) == pytest.approx(
        23 * mamba / 2 + 6 * attention / 2 + 23 * moe_etp1)
    assert step_elements(m, plan(tp=2, dp=4, sp=False)) > step_elements(m, plan(tp=2, dp=4, sp=True))


def test_a_dense_hybrid_casts_its_mlps_only_where_it_has_them():
    # Nemotron-H 56B (the nemotron-h-56b built-in): 54 Mamba-2 (256 heads of 64, 8 groups of 256),
    # 10 attention (64 heads, 8 KV heads of 128), 54 squared-ReLU MLPs of 32,768; 118 layers in all.
    h, HP, GN, H, f = 8192, 16384, 2048, 256, 32768
    mamba = (h + HP) + (h + 2 * HP + 2 * GN + H)
    attention = (h + 64 * 128) + (h + (64 + 2 * 8) * 128)
    mlp = (h + f) + (h + f)
    assert step_elements(M["nemotron-h-56b"], plan()) == pytest.approx(54 * mamba + 10 * attention + 54 * mlp)
