"""The Mamba-2 mixer's memory-bound traffic (cost.mixers.mamba_forward_bytes / mamba_backward_bytes) against an
itemised count of the tensors each kernel reads and writes, taken from the source the formula cites:
state-spaces/mamba mamba_ssm/ops/triton/ssd_combined.py (MambaSplitConv1dScanCombinedFn, _mamba_chunk_scan_combined_fwd
/ _bwd, e9594ce) and NVIDIA/Megatron-LM megatron/core/ssm/mamba_mixer.py (_ssm_training). The table below lists
tensors by name and dtype, not by the formula's grouped coefficients, so a wrong coefficient fails it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.mixers import (
    mamba_backward_bytes,
    mamba_forward_bytes,
    mamba_memory_bytes,
    mamba_transpose_bytes,
)
from llmplan.specs.registry import builtin_models

BF16, FP32 = 2, 4


def _per_token(m) -> dict[str, float]:
    """Elements per token of each tensor the kernels touch (nemotron_h config.json widths)."""
    H, P, N, G, Q = m.mamba_num_heads, m.mamba_head_dim, m.ssm_state_size, m.n_groups, m.mamba_chunk_size
    return {"x": H * P, "z": H * P, "y": H * P, "dout": H * P, "B": G * N, "C": G * N, "xBC": H * P + 2 * G * N,
            "dt": H, "states": H * P * N / Q, "CB": G * Q}


def _kernels(m) -> tuple[list[tuple[str, str, int]], list[tuple[str, str, int]]]:
    """(tensor, read|write, bytes an element) of each forward and backward kernel, layout copies left out."""
    fwd = [  # causal_conv1d_fwd
        ("xBC", "r", BF16), ("xBC", "w", BF16),
        # _chunk_cumsum_fwd: dt in, dt (softplus) and dA_cumsum out in fp32
        ("dt", "r", BF16), ("dt", "w", FP32), ("dt", "w", FP32),
        # _chunk_state_fwd: B, x, dt, dA_cumsum in; fp32 chunk states out
        ("B", "r", BF16), ("x", "r", BF16), ("dt", "r", FP32), ("dt", "r", FP32), ("states", "w", FP32),
        # _state_passing_fwd: fp32 in, out in C's dtype
        ("states", "r", FP32), ("states", "w", BF16),
        # _bmm_chunk_fwd: C B^T in fp32
        ("C", "r", BF16), ("B", "r", BF16), ("CB", "w", FP32),
        # _chunk_scan_fwd with z: CB, x, C, z, states, dt, dA in; out and out_x out
        ("CB", "r", FP32), ("x", "r", BF16), ("C", "r", BF16), ("z", "r", BF16), ("states", "r", BF16),
        ("dt", "r", FP32), ("dt", "r", FP32), ("y", "w", BF16), ("y", "w", BF16),
        # Megatron's RMSNorm on y
        ("y", "r", BF16), ("y", "w", BF16)]
    bwd = [  # RMSNorm backward: dy and y in, dx out
        ("dout", "r", BF16), ("y", "r", BF16), ("dout", "w", BF16),
        # recomputed: conv, cumsum, CB, chunk states, state passing (fp32 out in backward)
        ("xBC", "r", BF16), ("xBC", "w", BF16),
        ("dt", "r", BF16), ("dt", "w", FP32), ("dt", "w", FP32),
        ("C", "r", BF16), ("B", "r", BF16), ("CB", "w", FP32),
        ("B", "r", BF16), ("x", "r", BF16), ("dt", "r", FP32), ("dt", "r", FP32), ("states", "w", FP32),
        ("states", "r", FP32), ("states", "w", FP32),
        # _chunk_scan_bwd_dz: x, z, out_x, dout in; dz and dout_x out
        ("x", "r", BF16), ("z", "r", BF16), ("y", "r", BF16), ("dout", "r", BF16), ("z", "w", BF16),
        ("dout", "w", BF16),
        # _chunk_scan_bwd_dstates: C, dout, dA in; fp32 state gradients out
        ("C", "r", BF16), ("dout", "r", BF16), ("dt", "r", FP32), ("states", "w", FP32),
        # _state_passing_bwd: fp32 states and gradients in, both out in bf16
        ("states", "r", FP32), ("states", "r", FP32), ("states", "w", BF16), ("states", "w", BF16),
        # _chunk_scan_chunk_state_bwd_dx: x, B, CB, dout, dstates, dt, dA in; dx and ddt (fp32) out
        ("x", "r", BF16), ("B", "r", BF16), ("CB", "r", FP32), ("dout", "r", BF16), ("states", "r", BF16),
        ("dt", "r", FP32), ("dt", "r", FP32), ("x", "w", BF16), ("dt", "w", FP32),
        # _chunk_state_bwd_db: x, dstates, B, dt, dA in; fp32 dB out, then summed over the head splits
        ("x", "r", BF16), ("states", "r", BF16), ("B", "r", BF16), ("dt", "r", FP32), ("dt", "r", FP32),
        ("B", "w", FP32), ("B", "r", FP32), ("B", "w", FP32),
        # _chunk_scan_bwd_dC: states, dout, C in; fp32 dC out, summed
        ("states", "r", BF16), ("dout", "r", BF16), ("C", "r", BF16), ("C", "w", FP32), ("C", "r", FP32),
        ("C", "w", FP32),
        # _chunk_scan_bwd_dcb: x, dout, dt, dA in; fp32 dCB out, summed
        ("x", "r", BF16), ("dout", "r", BF16), ("dt", "r", FP32), ("dt", "r", FP32), ("CB", "w", FP32),
        ("CB", "r", FP32), ("CB", "w", FP32),
        # _bmm_chunk_bwd twice: C (B), dCB, the fp32 residual dB (dC) in; bf16 out
        ("C", "r", BF16), ("CB", "r", FP32), ("B", "r", FP32), ("B", "w", BF16),
        ("B", "r", BF16), ("CB", "r", FP32), ("C", "r", FP32), ("C", "w", BF16),
        # _chunk_scan_bwd_ddAcs_stable: x, dout, CB, dt, dA in
        ("x", "r", BF16), ("dout", "r", BF16), ("CB", "r", FP32), ("dt", "r", FP32), ("dt", "r", FP32),
        # _chunk_cumsum_bwd: ddA, ddt (fp32), dt in; ddt out
        ("dt", "r", FP32), ("dt", "r", FP32), ("dt", "r", BF16), ("dt", "w", BF16),
        # causal_conv1d_bwd: xBC and its gradient in, the input gradient out
        ("xBC", "r", BF16), ("xBC", "r", BF16), ("xBC", "w", BF16)]
    return fwd, bwd


def _total(m, kernels) -> float:
    n = _per_token(m)
    return sum(n[name] * size for name, _, size in kernels)


def test_nano_traffic_is_the_kernels_tensors():
    # Nemotron-3 Nano: 64 heads of 64, state 128, 8 groups, chunk 128; one sequence a micro-batch (no copies).
    m = builtin_models()["nemotron-3-nano"]
    fwd, bwd = _kernels(m)
    assert mamba_forward_bytes(m, 1) == _total(m, fwd)
    assert mamba_backward_bytes(m, 1) == _total(m, bwd)
    assert mamba_memory_bytes(m, 1) == (_total(m, fwd) + _total(m, bwd)) / 3


def test_layout_copies_only_with_several_sequences():
    # Megatron's rearrange(zxBCdt, "l b d -> b l d").contiguous() and y back copy only when b > 1 (a (l, 1, d)
    # tensor's transposed view is contiguous): read and write zxBCdt (2HP + 2GN + H) and y (HP), bf16.
    m = builtin_models()["nemotron-3-super"]
    n = _per_token(m)
    assert mamba_transpose_bytes(m, 1) == 0
    copies = 2 * BF16 * (n["z"] + n["xBC"] + n["dt"]) + 2 * BF16 * n["y"]
    assert mamba_transpose_bytes(m, 4) == copies
    assert mamba_forward_bytes(m, 2) - mamba_forward_bytes(m, 1) == copies
    assert mamba_backward_bytes(m, 2) - mamba_backward_bytes(m, 1) == copies


@settings(max_examples=60, derandomize=True, deadline=None)
@given(heads=st.sampled_from([8, 32, 64, 128, 256]), head_dim=st.sampled_from([32, 64, 128]),
       state=st.sampled_from([16, 64, 128, 256]), groups=st.sampled_from([1, 2, 8]), b=st.integers(1, 8))
def test_backward_moves_more_than_twice_the_forward(heads, head_dim, state, groups, b):
    # The backward recomputes the forward's conv, C B^T, chunk states and state passing before its own ten
    # kernels: pricing it as twice the forward (the stage's default for memory-bound operators) undercounts it.
    m = builtin_models()["nemotron-3-nano"].model_copy(update={
        "mamba_num_heads": heads, "mamba_head_dim": head_dim, "ssm_state_size": state, "n_groups": groups})
    assert mamba_backward_bytes(m, b) > 2 * mamba_forward_bytes(m, b)
    assert mamba_memory_bytes(m, b) > mamba_forward_bytes(m, b)


def test_a_hybrid_layer_runs_one_sub_block_of_tp_collectives():
    # Megatron's hybrid stack: an M, -, * or E layer holds one block (mamba_mixer.py: in_proj column-parallel,
    # out_proj row-parallel; the MLP and attention layers likewise). Under TP with SP, per layer and
    # micro-batch: forward the in_proj input all-gather and the out_proj reduce-scatter, backward their
    # gradients (a reduce-scatter and an all-gather) and the re-gather of the saved input shard for the weight
    # gradient: 3 all-gathers and 2 reduce-scatters, half a transformer layer's (attention + MLP).
    from llmplan.cost.comm import tp_transfers
    from llmplan.specs.plan import ParallelPlan

    m = builtin_models()["nemotron-h-56b"]
    plan = ParallelPlan(tp=4, pp=1, dp=32, sp=True, micro_batch=2, global_batch=384, seq_len=8192, zero=1)
    n = plan.num_microbatches * m.num_hidden_layers
    calls = {}
    for t in tp_transfers(m, plan, "tp"):
        calls[t.collective] = calls.get(t.collective, 0) + t.calls
    assert calls["all-gather"] == 3 * n and calls["reduce-scatter"] == 2 * n
    dense = m.model_copy(update={"layer_types": None, "mlp_layer_types": None})
    assert sum(t.calls for t in tp_transfers(dense, plan, "tp") if t.collective == "reduce-scatter") == 4 * n
