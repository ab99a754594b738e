"""Token mixers other than softmax attention: Mamba-2 (SSD), Gated DeltaNet and lightning linear attention, and the
per-kind shares a hybrid layer stack prices its average layer with.

Symbols follow the papers: h hidden, H SSM heads, P head dim, N state size, G groups, k convolution width,
Q scan chunk (Dao & Gu 2024); H_k / H_v key / value heads of dims d_k / d_v, C chunk (Yang et al. 2024);
t tensor-parallel degree, L layers.

A hybrid model's layers are priced as their average: every layer holds the model's mean mixer (the share
of attention layers x an attention block + the mean recurrent mixer) and, in the layers without experts,
the share of them that has a dense MLP. The whole-model totals are exact; a pipeline stage is priced at
the average composition (cost.stages.stage_kind_counts gives the exact one; cost.hybrid_stage prices it).
"""

from __future__ import annotations

from typing import Any

from llmplan.arith import where
from llmplan.specs.model import ModelSpec

GDN_CHUNK = 64
"""Chunk length C of the chunkwise gated delta rule (flash-linear-attention chunk_gated_delta_rule)."""
LIGHTNING_BLOCK = 256
"""Block length B of lightning attention (MiniMaxAI/MiniMax-M1 modeling_minimax_m1.py BLOCK; MiniMax-01 §2.2)."""
SSD_SCAN_EFFICIENCY = 0.214
"""Rate of the Mamba-2 SSD scan's matmul FLOPs (mamba_scan_flops) in state-spaces/mamba's Triton kernels, as a
fraction of the GPU's dense bf16 peak: Triton's chunk_scan forward (mamba-ssm 2.2.6.post3, Triton 3.5.0) runs
at about 91 TFLOP/s on an H800 at 8 x 8,192 tokens, 80 heads of 64, state 128, one group, chunk 256
(tile-ai/tilelang benchmark/mamba2/README.md and its figure mamba_benchmark_result.png, at 4f3523dc); with the
kernel's own HBM traffic priced as elementwise traffic is, its FLOPs take the rest of the time at 21.4% of the
989.4 TFLOP/s peak. A GPU with its own measured fraction (GpuSpec.ssd_scan_efficiency: the Blackwell profiles) uses
that instead. Derived: docs/formulas.md#mixers.ssd_rate"""


def mamba_params(m: ModelSpec) -> int:
    """One Mamba-2 mixer: in_proj h x (2HP + 2GN + H) (z, x, B, C, dt), the depthwise convolution over x, B, C
    with its bias, dt_bias, A_log and D per head, the gated RMSNorm over HP, out_proj HP x h.
    Source: Megatron-LM megatron/core/ssm/mamba_mixer.py (MambaMixer.__init__); Dao & Gu 2024 §7 (Mamba-2 block)."""
    h, H, P, N, G = m.hidden_size, m.mamba_num_heads or 0, m.mamba_head_dim or 0, m.ssm_state_size or 0, \
        m.n_groups or 0
    d_in = H * P
    return h * (2 * d_in + 2 * G * N + H) + d_in * h + mamba_nonmatrix_params(m)


def mamba_nonmatrix_params(m: ModelSpec) -> int:
    """The parameters of one Mamba-2 mixer that are no linear-layer weight (mamba_params less in_proj and
    out_proj): the depthwise convolution over x, B, C (k weights and a bias a channel), dt_bias, A_log and D per
    head, the gated RMSNorm over HP. Megatron-Core holds them as plain parameters (conv1d_weight, conv1d_bias,
    dt_bias, A_log, D, ExtendedRMSNorm), which Transformer Engine's quantized init leaves in bf16.
    Source: NVIDIA/Megatron-LM at d98e8a64dd, megatron/core/ssm/mamba_mixer.py (MambaMixer.__init__).
    Derived: docs/formulas.md#mem.nonmatrix_params"""
    H, P, N, G, k = m.mamba_num_heads or 0, m.mamba_head_dim or 0, m.ssm_state_size or 0, m.n_groups or 0, \
        m.conv_kernel
    return (H * P + 2 * G * N) * (k + 1) + 3 * H + H * P


def gdn_params(m: ModelSpec) -> int:
    """One Gated DeltaNet mixer: in_proj_qkvz h x (2 H_k d_k + 2 H_v d_v), in_proj_ba h x 2H_v, the depthwise
    convolution over q, k, v (no bias), dt_bias and A_log per value head, the gated RMSNorm over d_v, out_proj
    H_v d_v x h. Source: Hugging Face transformers models/qwen3_next/modeling_qwen3_next.py
    (Qwen3NextGatedDeltaNet); Yang et al. 2024 (Gated Delta Networks) §3."""
    h, Hk, Hv = m.hidden_size, m.linear_num_key_heads or 0, m.linear_num_value_heads or 0
    dk, dv = m.linear_key_head_dim or 0, m.linear_value_head_dim or 0
    return h * (2 * Hk * dk + 2 * Hv * dv) + h * 2 * Hv + Hv * dv * h + gdn_nonmatrix_params(m)


def gdn_nonmatrix_params(m: ModelSpec) -> int:
    """The parameters of one Gated DeltaNet mixer that are no linear-layer weight (gdn_params less in_proj and
    out_proj): the depthwise convolution over q, k, v (no bias), dt_bias and A_log per value head, the gated
    RMSNorm over d_v; plain parameters (nn.Conv1d, nn.Parameter, the out_norm) in Megatron-Core.
    Source: NVIDIA/Megatron-LM at d98e8a64dd, megatron/core/ssm/gated_delta_net/common.py (conv1d, dt_bias, A_log,
    out_norm). Derived: docs/formulas.md#mem.nonmatrix_params"""
    Hk, Hv = m.linear_num_key_heads or 0, m.linear_num_value_heads or 0
    dk, dv, k = m.linear_key_head_dim or 0, m.linear_value_head_dim or 0, m.linear_conv_kernel_dim
    return (2 * Hk * dk + Hv * dv) * k + 2 * Hv + dv


def lightning(m: ModelSpec) -> bool:
    """Whether the model's linear_attention layers are lightning attention (else Gated DeltaNet)."""
    return m.linear_attention_rule == "lightning"


def lightning_params(m: ModelSpec) -> int:
    """One lightning-attention mixer: qkv_proj h x H(2d_k + d_v), output_gate h x H d_v, the RMSNorm over
    H d_v, out_proj H d_v x h (no biases, no convolution). Source: MiniMaxAI/MiniMax-M1 modeling_minimax_m1.py
    (MiniMaxM1LightningAttention); MiniMax-01 (arXiv 2501.08313) §2.2. Derived: docs/formulas.md#mixers.hybrid"""
    h, H = m.hidden_size, m.linear_num_value_heads or 0
    dk, dv = m.linear_key_head_dim or 0, m.linear_value_head_dim or 0
    return h * H * (2 * dk + dv) + h * H * dv + H * dv * h + lightning_nonmatrix_params(m)


def lightning_nonmatrix_params(m: ModelSpec) -> int:
    """The one lightning-attention parameter that is no linear-layer weight: its RMSNorm over H d_v.
    Source: MiniMaxAI/MiniMax-M1 modeling_minimax_m1.py (MiniMaxM1LightningAttention.norm).
    Derived: docs/formulas.md#mem.nonmatrix_params"""
    return (m.linear_num_value_heads or 0) * (m.linear_value_head_dim or 0)


def linear_params(m: ModelSpec) -> int:
    """One linear_attention mixer under the model's rule (lightning or Gated DeltaNet)."""
    return lightning_params(m) if lightning(m) else gdn_params(m)


def recurrent_params(m: ModelSpec) -> int:
    """Parameters of all the model's recurrent mixers (Mamba-2 and linear-attention layers)."""
    return m.count_layers("mamba") * mamba_params(m) + m.count_layers("linear_attention") * linear_params(m)


def mean_recurrent_nonmatrix_params(m: ModelSpec) -> float:
    """The average layer's recurrent-mixer parameters that are no linear-layer weight (mamba_nonmatrix_params,
    gdn_nonmatrix_params or lightning_nonmatrix_params of each recurrent layer, over the layers).
    Derived: docs/formulas.md#mem.nonmatrix_params"""
    linear = lightning_nonmatrix_params(m) if lightning(m) else gdn_nonmatrix_params(m)
    return (m.count_layers("mamba") * mamba_nonmatrix_params(m)
            + m.count_layers("linear_attention") * linear) / m.num_hidden_layers


def attention_share(m: ModelSpec) -> float:
    """Share of the layers that hold softmax attention (1 for a plain transformer)."""
    return m.num_attention_layers / m.num_hidden_layers


def dense_mlp_share(m: ModelSpec) -> float:
    """Share of the layers without experts that hold a dense MLP (1 unless some layer is mixer-only)."""
    return m.num_mlp_layers / m.num_dense_layers if m.num_dense_layers else 0.0


def norms_per_layer(m: ModelSpec) -> float:
    """Pre-norms of the average layer: one per sub-block (mixer, MLP) it holds; 2 for a plain transformer."""
    L = m.num_hidden_layers
    return (L - m.count_layers("none") + m.num_mlp_layers + m.num_moe_layers) / L


def mean_recurrent_params(m: ModelSpec) -> float:
    """Recurrent-mixer parameters of the average layer. Derived: docs/formulas.md#mixers.hybrid"""
    return recurrent_params(m) / m.num_hidden_layers


def mamba_scan_flops(m: ModelSpec) -> float:
    """Forward FLOPs per token of one Mamba-2 layer's SSD scan (beyond its projections): within each chunk of
    Q tokens the G groups' C B^T scores (2QN) and their product with every head's x (2QP), then per head the
    chunk state B^T x (2NP) and the output from the carried state C h (2NP). Linear in the sequence length,
    full chunks counted as attention's MFU count is (no causal halving).
    Source: Dao & Gu 2024 (Transformers are SSMs), §6 (SSD algorithm: block decomposition, Q-chunk)."""
    H, P, N, G, Q = m.mamba_num_heads or 0, m.mamba_head_dim or 0, m.ssm_state_size or 0, m.n_groups or 0, \
        m.mamba_chunk_size
    return G * 2 * Q * N + H * (2 * Q * P + 4 * N * P)


def mamba_scan_backward_flops(m: ModelSpec) -> float:
    """Backward FLOPs per token of one Mamba-2 layer's SSD scan as state-spaces/mamba's Triton backward runs it:
    the forward's C B^T (2QN a group) and chunk states B^T x (2NP a head) recomputed; per head the state
    gradients C^T dout (2NP), dx from (C B^T)^T dout (2QP) and B dstates (2NP), dB's x dstates (2NP), dC's
    dout states (2NP), the score gradient dout x^T (2QP) and the decay gradient's dout x^T (2QP); per group dB
    and dC from the score gradient (2QN each): 3 G 2QN + H(6QP + 10NP), against twice the forward's
    2 G 2QN + H(4QP + 8NP) (Nemotron-3 Nano: 2.69 times the forward).
    Source: state-spaces/mamba mamba_ssm/ops/triton/ssd_combined.py (_mamba_chunk_scan_combined_bwd: _bmm_chunk_fwd,
    _chunk_state_fwd, _chunk_scan_bwd_dstates, _chunk_scan_chunk_state_bwd_dx, _chunk_state_bwd_db,
    _chunk_scan_bwd_dC, _chunk_scan_bwd_dcb, _bmm_chunk_bwd twice, _chunk_scan_bwd_ddAcs_stable).
    Derived: docs/formulas.md#mixers.ssd_rate"""
    H, P, N, G, Q = m.mamba_num_heads or 0, m.mamba_head_dim or 0, m.ssm_state_size or 0, m.n_groups or 0, \
        m.mamba_chunk_size
    return 3 * G * 2 * Q * N + H * (6 * Q * P + 10 * N * P)


def mean_mamba_scan_flops(m: ModelSpec) -> float:
    """Mamba-2 scan FLOPs per token of the average layer (forward), the part of mean_scan_flops that runs in
    the Triton SSD kernels (SSD_SCAN_EFFICIENCY). Derived: docs/formulas.md#mixers.ssd_rate"""
    return m.count_layers("mamba") * mamba_scan_flops(m) / m.num_hidden_layers


def mean_mamba_scan_step_flops(m: ModelSpec) -> float:
    """Mamba-2 scan FLOPs per token of the average layer, forward and backward (mamba_scan_backward_flops)
    together, in forward-equivalent units (the stage charges three times them). Derived:
    docs/formulas.md#mixers.ssd_rate"""
    return m.count_layers("mamba") * (mamba_scan_flops(m) + mamba_scan_backward_flops(m)) / 3 / m.num_hidden_layers


def gdn_scan_flops(m: ModelSpec) -> float:
    """Forward FLOPs per token of one Gated DeltaNet layer's chunkwise delta rule (beyond its projections): per
    value head, the chunk's Q K^T and K K^T (2C d_k each, the latter for the WY/UT transform) and their
    product with the values (2C d_v), and with the carried d_k x d_v state: K S for the delta correction, Q S
    for the output and the state update K^T U (2 d_k d_v each). Linear in the sequence length.
    Source: Yang et al. 2024 (Gated Delta Networks: Improving Mamba2 with Delta Rule) §3.3 (chunkwise
    parallel form); Yang et al. 2024 (Parallelizing Linear Transformers with the Delta Rule) §3."""
    Hv, dk, dv, C = m.linear_num_value_heads or 0, m.linear_key_head_dim or 0, m.linear_value_head_dim or 0, \
        GDN_CHUNK
    return Hv * (2 * C * (2 * dk + dv) + 6 * dk * dv)


def lightning_scan_flops(m: ModelSpec) -> float:
    """Forward FLOPs per token of one lightning-attention layer beyond its projections: per head, within its
    block of B tokens the decay-masked Q K^T (2B d_k) and its product with V (2B d_v); across blocks the
    output from the carried d_k x d_v state Q S (2 d_k d_v) and the state update K^T V (2 d_k d_v). Full
    blocks counted (no causal halving), linear in the sequence length.
    Source: MiniMax-01 (arXiv 2501.08313) §2.2.1, Algorithm 1 (intra- and inter-block lightning attention)."""
    H, dk, dv, B = m.linear_num_value_heads or 0, m.linear_key_head_dim or 0, m.linear_value_head_dim or 0, \
        LIGHTNING_BLOCK
    return H * (2 * B * (dk + dv) + 4 * dk * dv)


def mean_scan_flops(m: ModelSpec) -> float:
    """Recurrent-mixer scan FLOPs per token of the average layer (forward). Derived: docs/formulas.md#mixers.hybrid"""
    linear = lightning_scan_flops(m) if lightning(m) else gdn_scan_flops(m)
    return (m.count_layers("mamba") * mamba_scan_flops(m)
            + m.count_layers("linear_attention") * linear) / m.num_hidden_layers


def decode_scan_flops(m: ModelSpec) -> float:
    """Recurrent FLOPs per generated token of the whole model (serving's decode step): a Mamba-2 head decays
    and updates its P x N state and reads it out (4NP), a Gated DeltaNet value head reads, corrects and reads
    out its d_k x d_v state (6 d_k d_v). Constant in the context length.
    Source: Dao & Gu 2024 §3 (recurrent mode); Yang et al. 2024 (Gated Delta Networks) Eq. 10."""
    mamba = (m.mamba_num_heads or 0) * 4 * (m.ssm_state_size or 0) * (m.mamba_head_dim or 0)
    per_head = 4 if lightning(m) else 6  # lightning: decay and add k^T v, read out q S (MiniMax-01 §2.2)
    gdn = (m.linear_num_value_heads or 0) * per_head * (m.linear_key_head_dim or 0) * (m.linear_value_head_dim or 0)
    return m.count_layers("mamba") * mamba + m.count_layers("linear_attention") * gdn


def recurrent_state_bytes(m: ModelSpec, state_bytes: float = 2.0, tp: int = 1) -> float:
    """Bytes of the recurrent state one sequence keeps on one TP rank in serving (all its recurrent layers):
    per Mamba-2 layer the SSM state H x P x N and the convolution's last k - 1 inputs of x, B, C; per Gated
    DeltaNet layer the H_v states of d_k x d_v and the convolution's last k - 1 inputs of q, k, v. Fixed per
    sequence, whatever its length: it replaces the KV cache of those layers.
    Source: vLLM vllm/model_executor/layers/mamba/mamba_utils.py (MambaStateShapeCalculator: mamba2 and
    gated_delta_net state shapes). Derived: docs/formulas.md#mixers.state"""
    H, P, N, G = m.mamba_num_heads or 0, m.mamba_head_dim or 0, m.ssm_state_size or 0, m.n_groups or 0
    mamba = H * P * N / tp + (H * P + 2 * G * N) / tp * (m.conv_kernel - 1)
    Hk, Hv = m.linear_num_key_heads or 0, m.linear_num_value_heads or 0
    dk, dv = m.linear_key_head_dim or 0, m.linear_value_head_dim or 0
    conv = 0 if lightning(m) else m.linear_conv_kernel_dim - 1  # lightning attention has no convolution
    gdn = Hv * dk * dv / tp + (2 * Hk * dk + Hv * dv) / tp * conv
    return state_bytes * (m.count_layers("mamba") * mamba + m.count_layers("linear_attention") * gdn)


def mean_recurrent_activation_bytes(m: ModelSpec, tokens: Any, t: Any, sp: Any) -> Any:
    """Activation bytes the average layer's recurrent mixer keeps for backward, for `tokens` tokens on one TP
    rank, 2 bytes each: the in-projection's input (the norm output, h wide, split by sp), Mamba-2's z, x, B, C,
    dt projection (the fused conv + scan kernel recomputes the rest) and its fp32 chunk states (H P N per Q
    tokens); Gated DeltaNet's q, k, v, z, the gates, the convolution input and the fp32 chunk states (H_v d_k
    d_v per C tokens); and the out-projection's input. Derived: docs/formulas.md#mixers.activations"""
    h, L = m.hidden_size, m.num_hidden_layers
    H, P, N, G = m.mamba_num_heads or 0, m.mamba_head_dim or 0, m.ssm_state_size or 0, m.n_groups or 0
    mamba = 2 * h / sp + (2 * (2 * H * P + 2 * G * N + H) + 2 * H * P + 4 * H * P * N / m.mamba_chunk_size) / t
    Hk, Hv = m.linear_num_key_heads or 0, m.linear_num_value_heads or 0
    dk, dv = m.linear_key_head_dim or 0, m.linear_value_head_dim or 0
    conv = 2 * Hk * dk + Hv * dv
    gdn = 2 * h / sp + (2 * (conv + Hv * dv + 2 * Hv) + 2 * conv + 2 * Hv * dv + 4 * Hv * dk * dv / GDN_CHUNK) / t
    if lightning(m):  # q, k, v and the output gate, the out-projection's input, fp32 block states
        gdn = 2 * h / sp + (2 * (conv + Hv * dv) + 2 * Hv * dv + 4 * Hv * dk * dv / LIGHTNING_BLOCK) / t
    return tokens * (m.count_layers("mamba") * mamba + m.count_layers("linear_attention") * gdn) / L


def mamba_memory_bytes(m: ModelSpec, micro_batch: Any = 1) -> Any:
    """HBM bytes per token of one Mamba-2 layer's memory-bound kernels, all heads (divide by t), forward and
    backward together in the forward-equivalent units of elementwise.elementwise_bytes (the stage charges three
    times them): (mamba_forward_bytes + mamba_backward_bytes) / 3. Derived: docs/formulas.md#mixers.traffic"""
    return (mamba_forward_bytes(m, micro_batch) + mamba_backward_bytes(m, micro_batch)) / 3


def _mamba_widths(m: ModelSpec) -> tuple[float, float, float, float, float]:
    """(d, g, S, GQ, H) per token of one Mamba-2 layer: the heads' width HP (x, z, y), one of B / C (GN), the
    chunk-state elements HPN/Q, the chunk-score elements GQ and the heads H."""
    H, P, N, G, Q = m.mamba_num_heads or 0, m.mamba_head_dim or 0, m.ssm_state_size or 0, m.n_groups or 0, \
        m.mamba_chunk_size
    return H * P, G * N, H * P * N / Q, G * Q, H


def mamba_transpose_bytes(m: ModelSpec, micro_batch: Any = 1) -> Any:
    """HBM bytes per token of the layout copies Megatron-LM's MambaMixer makes around the fused kernel, in one
    pass (forward, or backward for their gradients): zxBCdt from (s, b) to (b, s) order and y back (read and
    write 2 + 2 bytes each of 2d + 2g + H and d elements). With one sequence per micro-batch the transposed view
    is already contiguous and .contiguous() copies nothing. Source: NVIDIA/Megatron-LM
    megatron/core/ssm/mamba_mixer.py (_ssm_training, core_v0.15.0 - core_v0.19.0: rearrange(...).contiguous()).
    Derived: docs/formulas.md#mixers.traffic"""
    d, g, _, _, H = _mamba_widths(m)
    copies = 4 * (2 * d + 2 * g + H) + 4 * d
    return where(micro_batch > 1, copies, 0.0)


def mamba_forward_bytes(m: ModelSpec, micro_batch: Any = 1) -> Any:
    """HBM bytes per token of one Mamba-2 layer's memory-bound forward, all heads, as Megatron-LM runs it
    (mamba_split_conv1d_scan_combined, then its RMSNorm): the causal convolution reads and writes x, B, C
    (4d + 8g); chunk_cumsum reads dt and writes dt and dA_cumsum in fp32 (10H); chunk_state reads B, x, dt and
    dA and writes the fp32 chunk states (2g + 2d + 8H + 4S); state_passing reads them and writes bf16 states
    (6S); bmm_chunk writes C B^T in fp32 (4g + 4GQ); chunk_scan reads C B^T, x, C, z, the states, dt and dA
    and writes the gated output and the ungated one it saves (4GQ + 8d + 2g + 2S + 8H); the RMSNorm reads and
    writes y (4d); plus the layout copies (mamba_transpose_bytes). d, g, S, GQ, H: _mamba_widths.
    Source: state-spaces/mamba mamba_ssm/ops/triton/ssd_combined.py (MambaSplitConv1dScanCombinedFn.forward,
    _mamba_chunk_scan_combined_fwd; at e9594ce, structure unchanged since v2.0); Megatron-LM mamba_mixer.py
    (_ssm_training). Derived: docs/formulas.md#mixers.traffic"""
    d, g, S, GQ, H = _mamba_widths(m)
    return 18 * d + 16 * g + 12 * S + 8 * GQ + 26 * H + mamba_transpose_bytes(m, micro_batch)


def mamba_backward_bytes(m: ModelSpec, micro_batch: Any = 1) -> Any:
    """HBM bytes per token of one Mamba-2 layer's memory-bound backward, all heads: the norm's backward (6d);
    the convolution, chunk_cumsum, C B^T, chunk states and fp32 state passing recomputed (4d + 8g, 10H,
    4g + 4GQ, 2d + 2g + 8H + 4S, 8S); chunk_scan_bwd_dz (12d); the fp32 state gradients (2g + 2d + 4H + 4S)
    and their passing back, written in bf16 with the states (12S); dx (6d + 2g + 4GQ + 2S + 12H); dB and dC,
    each written in fp32 and summed over the head splits (2d + 14g + 2S + 8H; 2d + 14g + 2S); the chunk-score
    gradient in fp32 and its sum (4d + 12GQ + 8H) and its two products with B and C (16g + 8GQ); ddA
    (4d + 4GQ + 8H); the dt gradients (12H); the convolution's backward (6d + 12g); plus the layout copies of
    the gradients (mamba_transpose_bytes). Source: state-spaces/mamba ssd_combined.py
    (MambaSplitConv1dScanCombinedFn.backward, _mamba_chunk_scan_combined_bwd: _chunk_scan_bwd_dz,
    _chunk_scan_bwd_dstates, _state_passing_bwd, _chunk_scan_chunk_state_bwd_dx, _chunk_state_bwd_db,
    _chunk_scan_bwd_dC, _chunk_scan_bwd_dcb, _bmm_chunk_bwd, _chunk_scan_bwd_ddAcs_stable, _chunk_cumsum_bwd;
    causal_conv1d_bwd). Derived: docs/formulas.md#mixers.traffic"""
    d, g, S, GQ, H = _mamba_widths(m)
    return 50 * d + 74 * g + 34 * S + 32 * GQ + 70 * H + mamba_transpose_bytes(m, micro_batch)


def gdn_memory_bytes(m: ModelSpec) -> float:
    """HBM bytes per token of one Gated DeltaNet layer's memory-bound kernels, forward (divide by t): the
    convolution reads and writes q, k, v (4c, c = 2H_k d_k + H_v d_v); the L2 norms of q and k (8 H_k d_k); the
    WY transform reads k and v and writes and rereads w and u (2c + 4H_v(d_k + d_v)); the output kernel reads
    q, k and v and writes o (2c + 2H_v d_v); the fp32 chunk states are written and read (8 H_v d_k d_v / C);
    the gated RMSNorm reads o and z and writes its output (6 H_v d_v).
    Source: Yang et al. 2024 (Gated Delta Networks) §3.3; flash-linear-attention ops/gated_delta_rule/chunk.py
    (chunk_gated_delta_rule_fwd: WY representation, chunk states, output). Derived: docs/formulas.md#mixers.hybrid"""
    Hk, Hv = m.linear_num_key_heads or 0, m.linear_num_value_heads or 0
    dk, dv = m.linear_key_head_dim or 0, m.linear_value_head_dim or 0
    c = 2 * Hk * dk + Hv * dv
    return 4 * c + 8 * Hk * dk + 2 * c + 4 * Hv * (dk + dv) + 2 * c + 2 * Hv * dv + 8 * Hv * dk * dv / GDN_CHUNK \
        + 6 * Hv * dv


def lightning_memory_bytes(m: ModelSpec) -> float:
    """HBM bytes per token of one lightning-attention layer's memory-bound kernels, forward (divide by t): the
    SiLU on q, k, v reads and writes them (4c, c = H(2d_k + d_v)); the block kernels read q, k, v and write o
    (2c + 2H d_v); the fp32 block states are written and read (8 H d_k d_v / B); the RMSNorm and the sigmoid
    output gate read o and the gate and write the output (6 H d_v). Source: MiniMaxAI/MiniMax-M1
    modeling_minimax_m1.py (act, lightning attention, norm, output_gate). Derived: docs/formulas.md#mixers.hybrid"""
    H, dk, dv = m.linear_num_value_heads or 0, m.linear_key_head_dim or 0, m.linear_value_head_dim or 0
    c = H * (2 * dk + dv)
    return 4 * c + 2 * c + 2 * H * dv + 8 * H * dk * dv / LIGHTNING_BLOCK + 6 * H * dv


def mean_recurrent_memory_bytes(m: ModelSpec, micro_batch: Any = 1) -> Any:
    """Memory-bound HBM bytes per token of the average layer's recurrent mixer, all heads, in forward-equivalent
    units (Mamba-2: forward and backward counted apart, mamba_memory_bytes; the linear-attention kinds: their
    forward, the stage charging backward at twice it). Derived: docs/formulas.md#mixers.traffic"""
    linear = lightning_memory_bytes(m) if lightning(m) else gdn_memory_bytes(m)
    return (m.count_layers("mamba") * mamba_memory_bytes(m, micro_batch)
            + m.count_layers("linear_attention") * linear) / m.num_hidden_layers


def recurrent_gemm_shapes(m: ModelSpec, t: Any) -> list[tuple[Any, Any, float]]:
    """(K, N, layer share) of the recurrent mixers' projections on one of t TP ranks: in- and out-projection of
    the Mamba-2 and Gated DeltaNet layers, each weighted by the share of layers of its kind."""
    h, L = m.hidden_size, m.num_hidden_layers
    out: list[tuple[Any, Any, float]] = []
    n_mamba, n_gdn = m.count_layers("mamba"), m.count_layers("linear_attention")
    if n_mamba:
        H, P, N, G = m.mamba_num_heads or 0, m.mamba_head_dim or 0, m.ssm_state_size or 0, m.n_groups or 0
        out += [(h, (2 * H * P + 2 * G * N + H) / t, n_mamba / L), (H * P / t, h, n_mamba / L)]
    if n_gdn:
        Hk, Hv = m.linear_num_key_heads or 0, m.linear_num_value_heads or 0
        dk, dv = m.linear_key_head_dim or 0, m.linear_value_head_dim or 0
        gates = 0 if lightning(m) else 2 * Hv  # Gated DeltaNet's in_proj_ba; lightning's gate is in 2 Hv dv
        out += [(h, (2 * Hk * dk + 2 * Hv * dv + gates) / t, n_gdn / L), (Hv * dv / t, h, n_gdn / L)]
    return out

