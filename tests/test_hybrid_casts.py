"""fp8 casts of a hybrid stack, per sub-block kind (docs/formulas.md#mixers.casts): each Transformer Engine
linear casts its input in forward and its output gradient in backward. Megatron-LM's Mamba-2 mixer has two such
linears (megatron/core/ssm/mamba_mixer.py: in_proj h -> 2HP + 2GN + H, out_proj HP -> h; its convolution and
SSD kernels run in bf16), Megatron's attention two (linear_qkv, linear_proj), an MoE block its shared expert's two
and its routed experts' two GroupedLinears on the k permuted rows of each token (docs/formulas.md#moe.expert_casts:
Megatron-LM d98e8a6 token_dispatcher.py / experts.py, TransformerEngine d0067d0 grouped_linear.py).

Under MXFP8 (these goldens' recipe) Megatron-LM d98e8a64dd sets Transformer Engine's save_original_input on the
attention's linear_proj (attention.py: fp8 with fp8_recipe != 'delayed', or fp4) and on the shared expert's
linear_fc1 (moe/shared_experts.py SharedExpertMLP.__init__, unless shared_experts is recomputed). TE d0067d0
pytorch/module/linear.py then writes only the rowwise copy in forward and quantises the saved bf16 input again in
backward for the columnwise copy: the same bytes written, the input read once more, 2 B an element (MXFP8 takes no
separate amax pass). Per token: linear_proj's input a·d/t on each attention layer, fc1's h-wide input (on the
sequence shard under SP, before TP's gather) on each MoE layer with a shared expert."""

from __future__ import annotations

import pytest

from llmplan.cost.quantize import CAST_BYTES, fp8_cast_bytes
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models

M = builtin_models()
S = 4096
MX = 2 + 2 * (1 + 1 / 32)  # an MXFP8 cast: read the bf16 input, write a rowwise and a columnwise copy (E8M0 per 32)
REREAD = 2.0  # save_original_input's backward read of the bf16 input (MXFP8: no amax pass)


def plan(**kw) -> ParallelPlan:
    # per-expert: TEGroupedMLP, whose experts' GEMM inputs are all cast by kernels (the fused grouped MLP casts two
    # of them in its epilogues: docs/formulas.md#moe.fused_mlp, the last assertion of the first test)
    base = {"tp": 1, "pp": 1, "dp": 8, "zero": 1, "seq_len": S, "micro_batch": 1, "global_batch": 64, "dtype": "fp8",
            "recipe": "mxfp8", "expert_gemm": "per-expert"}
    return ParallelPlan(**{**base, **kw})


def step_bytes(m, p) -> float:
    """Cast bytes per token over the step, all layers (the function charges a third of it per pass)."""
    assert CAST_BYTES["mxfp8"] == pytest.approx(MX)
    return sum(n * fp8_cast_bytes(m, p, moe) * 3 / S
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
    # save_original_input: linear_proj's input (32·128) on the 6 attention layers, the shared fc1's (h) on the 23
    flagged = REREAD * (6 * 32 * 128 + 23 * h)
    assert step_bytes(m, plan()) == pytest.approx((23 * mamba + 6 * attention + 23 * moe) * MX + flagged)
    # TE's fused MXFP8 grouped MLP (squared ReLU, TE >= 2.17) quantises fc2's input (forward) and fc1's output
    # gradient (backward) of the routed experts in its GEMMs' epilogues: 2 x 6 x 1856 fewer per MoE layer; the
    # shared expert (TE Linear modules) and linear_proj keep their flag
    fused = moe - 2 * 6 * 1856
    assert step_bytes(m, plan(expert_gemm="grouped")) == pytest.approx(
        (23 * mamba + 6 * attention + 23 * fused) * MX + flagged)


def test_sequence_parallelism_casts_the_hidden_wide_tensors_on_the_shard():
    # At TP2 with SP the rank casts its half of the heads' widths and, before the gather, its sequence shard of
    # each h-wide input and output gradient (as the transformer count does): every term halves. The routed
    # experts at expert TP 2 (etp unset: tp) all-gather the bf16 rows over the expert-TP group before casting them:
    # k·etp/t = 6 rows a token of width h, f_e/etp wide; at expert TP 1 the rank's k/t = 3 rows of the whole f_e.
    # The flagged inputs: linear_proj's 16 local heads (row-parallel), the shared fc1's sequence shard h/2.
    h, HP, GN, H = 2688, 4096, 1024, 64
    mamba = (h + HP) + (h + 2 * HP + 2 * GN + H)
    attention = (h + 32 * 128) + (h + (32 + 2 * 2) * 128)
    shared = (h + 3712) * 2 / 2
    moe = 6 * (h + 1856 / 2) * 2 + shared
    moe_etp1 = 3 * (h + 1856) * 2 + shared
    flagged = REREAD * (6 * 32 * 128 / 2 + 23 * h / 2)
    m = M["nemotron-3-nano"]
    assert step_bytes(m, plan(tp=2, dp=4, sp=True)) == pytest.approx(
        (23 * mamba / 2 + 6 * attention / 2 + 23 * moe) * MX + flagged)
    assert step_bytes(m, plan(tp=2, dp=4, sp=True, etp=1)) == pytest.approx(
        (23 * mamba / 2 + 6 * attention / 2 + 23 * moe_etp1) * MX + flagged)
    assert step_bytes(m, plan(tp=2, dp=4, sp=False)) > step_bytes(m, plan(tp=2, dp=4, sp=True))


def test_a_dense_hybrid_casts_its_mlps_only_where_it_has_them():
    # Nemotron-H 56B (the nemotron-h-56b built-in): 54 Mamba-2 (256 heads of 64, 8 groups of 256),
    # 10 attention (64 heads, 8 KV heads of 128), 54 squared-ReLU MLPs of 32,768; 118 layers in all.
    h, HP, GN, H, f = 8192, 16384, 2048, 256, 32768
    mamba = (h + HP) + (h + 2 * HP + 2 * GN + H)
    attention = (h + 64 * 128) + (h + (64 + 2 * 8) * 128)
    mlp = (h + f) + (h + f)
    flagged = REREAD * 10 * 64 * 128  # linear_proj's input on the 10 attention layers; no MoE, no shared expert
    assert step_bytes(M["nemotron-h-56b"], plan()) == pytest.approx(
        (54 * mamba + 10 * attention + 54 * mlp) * MX + flagged)
