"""GEMM time: a matmul's achieved fraction of peak from its shape (tile and wave quantisation, grouped expert
GEMMs, the HBM-bound side of a few rows per expert), the matmuls of one layer with their shapes, and one
layer's forward and backward GEMM seconds (chunked TP overlap included).

Works on one ParallelPlan and, elementwise, on plan arrays (see llmplan/arith.py). Split out of cost.compute,
which re-exports its names.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

import numpy as np

from llmplan.arith import maximum, minimum, where
from llmplan.cost.compressed import compressor_gemm_widths, hc_fn_shape, is_v4_attention
from llmplan.cost.flops import layer_flops
from llmplan.cost.mixers import attention_share, dense_mlp_share, recurrent_gemm_shapes
from llmplan.cost.moe import routing_imbalance
from llmplan.cost.params import kv_heads_per_rank
from llmplan.cost.sparse_gather import indexer_loss
from llmplan.specs.hardware import GpuSpec
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan
from llmplan.units import MXFP8_BYTES, NVFP4_BYTES

GEMM_HALF_DIM = 512.0  # serving's default curve: efficiency reaches half its best at a smallest dimension of 512
TILE = 128  # output tile edge of the large-GEMM kernels (cuBLAS / CUTLASS 128 x 128 .. 256 x 128 tiles)


def gemm_shape_efficiency(gpu: GpuSpec, dtype: str, M: Any, N: Any, K: Any) -> Any:
    """Achieved fraction of peak of one M x N x K GEMM from its own shape: the best large-GEMM fraction, times
    tile quantisation (M and N padded to whole 128-tiles), wave quantisation (the tiles over the SMs, the last
    wave partly idle) and a short-reduction term K / (K + k_half), k_half the format's (GpuSpec.gemm_k_half_for:
    longer for fp8 than bf16). Large GEMMs of TP4 and TP8 run alike; a GEMM with few rows (small micro-batch, an
    expert's share of the tokens) pays for its idle tiles and SMs.
    Source: NVIDIA Matrix Multiplication Background User's Guide (tile and wave quantization).
    Derived: docs/formulas.md#compute.gemm"""
    return grouped_gemm_efficiency(gpu, dtype, M, N, K, 1)


def grouped_gemm_efficiency(gpu: GpuSpec, dtype: str, M: Any, N: Any, K: Any, groups: Any,
                            tile: int = TILE) -> Any:
    """Achieved fraction of peak of a grouped GEMM: `groups` experts' M x N x K matmuls in one launch (a rank's
    local experts, M its rows per expert). Each expert's rows start a new row of output tiles, so tile
    quantisation is the expert's own (M and N padded to whole 128-tiles: DeepGEMM's contiguous layout aligns
    every expert's segment to the M block); the tiles of all the experts fill the SMs together, so wave
    quantisation counts groups x tiles; the short-reduction term is the expert's K. groups = 1 is
    gemm_shape_efficiency. Small experts pay where their N or K are short (Qwen3-30B-A3B: f_e 768), not for
    waves. `tile` the output tile's edge: a `tile` of 256 (FUSED_MLP_TILE) runs on a pair of SMs, so
    sm_count x 128 / tile tiles make a wave. Source: Gale et al. 2023 (MegaBlocks) §5 (all experts' blocks in
    one kernel); DeepGEMM README (m-grouped contiguous layout); NVIDIA Matrix Multiplication Background (tile
    and wave quantization). Derived: docs/formulas.md#compute.gemm"""
    if gpu.gemm_efficiency:  # a calibrated profile measured the curve by smallest dimension
        return gemm_efficiency(gpu, dtype, minimum(M, minimum(N, K)))
    tm, tn = np.ceil(np.maximum(M, 1) / tile), np.ceil(np.maximum(N, 1) / tile)
    tiles = tm * tn * groups
    tile_fill = np.maximum(M, 1) * np.maximum(N, 1) / (tm * tn * tile * tile)
    slots = gpu.sm_count * TILE // tile  # a 256-wide tile spans two SMs (a 2-CTA cluster)
    wave_fill = tiles / (np.ceil(tiles / slots) * slots)
    return gpu.max_gemm_fraction(dtype) * tile_fill * wave_fill * K / (K + gpu.gemm_k_half_for(dtype))


FUSED_MLP_TILE = 256
"""Output tile edge of Transformer Engine's fused MXFP8 grouped MLP (ParallelPlan.expert_gemm grouped on
Megatron-Core's TP, the op fuser's ForwardGroupedMLP_CuTeGEMMSwiGLU_MXFP8 / BackwardGroupedMLP that
Megatron-Bridge's cutedsl_fused_grouped_mlp presets select): it calls cudnn-frontend's CuTeDSL SM100 grouped
GEMMs (grouped_gemm_glu_wrapper_sm100, grouped_gemm_quant_wrapper_sm100, grouped_gemm_dglu_wrapper_sm100)
without mma_tiler_mn, so they run their default (256, 256) tile on a 2-SM cluster. An N of 2,880 (GPT-OSS's
fc2) fills 2,880 / 3,072 = 93.75% of its 256-wide tiles against 97.8% of 128-wide ones; the fusion takes dims
that are multiples of 64 (256 before v2.15). Source: NVIDIA/TransformerEngine
transformer_engine/pytorch/ops/fused/forward_grouped_mlp.py and ops/_common.py (validate_grouped_mlp_dims,
fuse_grouped_mlp_ops) at v2.16; NVIDIA/cudnn-frontend python/cudnn grouped_gemm_glu_wrapper_sm100
(mma_tiler_mn = (256, 256), m_aligned = 256). Derived: docs/formulas.md#compute.gemm"""


def fused_mlp_path(plan: ParallelPlan) -> Any:
    """Whether the plan puts the routed experts on Megatron-Core's op-fuser path, where Transformer Engine fuses
    the grouped MLP under MXFP8 (Megatron-Bridge's cutedsl_fused_grouped_mlp presets): fused kernels,
    expert_gemm grouped, Megatron-Core's TP and expert TP 1 (the fused implementation takes no expert TP).
    Source: NVIDIA/Megatron-LM megatron/core/transformer/moe/experts.py at d98e8a6 (_is_fused_impl_supported).
    Derived: docs/formulas.md#moe.fused_mlp"""
    return (plan.fused_kernels & (plan.expert_gemm == "grouped") & (plan.tp_impl == "megatron")
            & (plan.etp_resolved == 1))


def router_padding_align(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Rows each expert's token count is padded to a multiple of under moe_router_padding: 256 where the experts
    run on the op-fuser path (use_transformer_engine_op_fuser, which a Megatron-Core export of expert_gemm grouped
    sets for a GLU or squared-ReLU MLP: export.common.op_fuser), else the recipe's: 16 for fp8 per-tensor /
    blockwise, 32 for MXFP8, 128 for NVFP4. Source: NVIDIA/Megatron-LM at cd4afffa6,
    megatron/core/transformer/moe/moe_utils.py
    (get_align_size_for_quantization), fp8_utils.py (get_fp8_align_size), fp4_utils.py (get_fp4_align_size).
    Derived: docs/formulas.md#moe.router_padding"""
    recipe = 128 if plan.recipe == "nvfp4" else 32 if plan.recipe == "mxfp8" else 16
    fused = bool(m.is_moe and (m.gated_mlp or squared_relu_mlp(m)))
    return where(fused_mlp_path(plan) & fused, 256, recipe)


PAD_WINDOW, PAD_BLOCKS = 64, 16
"""Counts summed one by one (0 to PAD_WINDOW - 1) for means of at most PAD_WINDOW / 4, and multiples of the alignment
summed (PAD_BLOCKS) for larger means: fixed array sizes, whatever the spread (expected_alignment_pad)."""


def _normal_sf(z: Any) -> Any:
    """P(Z > z) for a standard normal Z, elementwise, absolute error below 1e-7 (erfc by Abramowitz & Stegun,
    Handbook of Mathematical Functions, 1964, formula 7.1.26). Derived: docs/formulas.md#moe.router_padding"""
    x = np.abs(z) / np.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * x)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    half = 0.5 * poly * np.exp(-x * x)
    return np.where(z >= 0, half, 1.0 - half)


def _pad_counted(mu: Any, v: Any, a: Any) -> Any:
    """E[(-n) mod a] summed over n = 0 .. PAD_WINDOW - 1, n Binomial(mu / q, q) with q = 1 - v / mu (Poisson(mu)
    where v >= mu): the pmf by its ratio p(n + 1) / p(n) = (mu - n q) / ((n + 1) (1 - q)) from p(0) = (1 - q)^(mu/q).
    Exact for a binomial count of mean at most PAD_WINDOW / 4. Derived: docs/formulas.md#moe.router_padding"""
    q = np.clip(1.0 - v / np.where(mu > 0, mu, 1.0), 0.0, 1.0 - 1e-12)
    n = np.arange(PAD_WINDOW, dtype=float).reshape((-1,) + (1,) * mu.ndim)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_p0 = np.where(q > 0, mu / np.where(q > 0, q, 1.0) * np.log1p(-q), -mu)
        log_ratio = np.log(np.maximum(mu - n[:-1] * q, 0.0)) - np.log((n[:-1] + 1) * (1 - q))
    log_p = np.concatenate([log_p0[None], log_p0 + np.cumsum(log_ratio, axis=0)])
    return (np.exp(log_p) * np.mod(-n, a)).sum(axis=0)


def _pad_blocks(mu: Any, sd: Any, a: Any) -> Any:
    """E[(-n) mod a] = a E[ceil(n / a)] - E[n], E[n] = mu, E[ceil(n / a)] = sum over m >= 0 of P(n > m a), n a
    normal law rounded to the integers (P(n > m a) = P(X > m a + 1/2)) with the binomial's skewness (1 - 2 p) / sd
    as its first Edgeworth term (Feller, An Introduction to Probability Theory and Its Applications II, 1971,
    XVI.4): the PAD_BLOCKS multiples from 8 sd below the mean counted, those below it 1 each; (a - 1) / 2 (a uniform
    residue, error below e^(-2 pi^2 (sd / a)^2)) where 8 sd covers more of them.
    Derived: docs/formulas.md#moe.router_padding"""
    lo = np.maximum(np.floor((mu - 8 * sd) / a), 0.0)
    m = lo + np.arange(PAD_BLOCKS, dtype=float).reshape((-1,) + (1,) * mu.ndim)
    s = np.where(sd > 0, sd, 1.0)
    z = (m * a + 0.5 - mu) / s
    skew = (2 * sd * sd / np.where(mu > 0, mu, 1.0) - 1) / s
    tail = (_normal_sf(z) + skew / 6 * (z * z - 1) * np.exp(-z * z / 2) / np.sqrt(2 * np.pi)).sum(axis=0)
    blocks = a * (lo + tail) - mu
    return np.where(16 * sd + 2 * a <= PAD_BLOCKS * a, blocks, (a - 1) / 2)


def expected_alignment_pad(mean: Any, var: Any, align: Any) -> Any:
    """Expected rows (-n) mod align that pad a count n up to a multiple of align, n a binomial count of mean
    `mean` and variance `var` (Binomial(T, p): mean T p, var T p (1 - p); var 0: n = round(mean)). Means up to
    PAD_WINDOW / 4: the pmf summed (_pad_counted, exact); above: by multiples of align over a normal law
    (_pad_blocks), about (align - 1) / 2 once the spread covers several multiples of align. Array sizes fixed
    (PAD_WINDOW, PAD_BLOCKS), whatever the spread. Elementwise. Derived: docs/formulas.md#moe.router_padding"""
    mu, v, a = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (mean, var, align)))
    v = np.maximum(v, 0.0)
    fixed = np.mod(-np.maximum(np.round(mu), 0.0), a)
    out = np.where(v <= 0, fixed, np.where(mu <= PAD_WINDOW / 4, _pad_counted(mu, v, a),
                                           _pad_blocks(mu, np.sqrt(v), a)))
    return float(out) if out.ndim == 0 else out


def router_padding_share(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Extra routed rows a rank's experts compute under moe_router_padding, as a share of its mean rows (T k a
    layer and micro-batch), added to the most-loaded rank's load (routing_imbalance). Megatron's pad_routing_map
    turns zeros of the routing map into ones until each expert's count is a multiple of the alignment a
    (router_padding_align): (-n) mod a rows per count n (expected_alignment_pad). The alltoall dispatcher pads the
    rank's own map before the all-to-all: E counts of its T tokens, each Binomial(T, k/E) under random routing
    (T k / E exactly under contiguous routing), and sends the extra rows too; DeepEP pads the received map after
    it: E / ep counts of the ep T tokens of the group.
    HybridEP pads in its dispatch and never reads the switch: 0. 0 with the switch off or outside fp8 / fp4.
    Source: NVIDIA/Megatron-LM at cd4afffa6, megatron/core/transformer/moe/token_dispatcher.py
    (MoEAlltoAllTokenDispatcher.dispatch_preprocess: pad_routing_map before preprocess; _DeepepManager.
    setup_metadata: _pad_routing_map of the dispatched map; _HybridEPManager: no read), moe_utils.py
    (pad_routing_map). Derived: docs/formulas.md#moe.router_padding"""
    hybridep = plan.moe_dispatcher == "deepep" and plan.moe_flex_backend == "hybridep"
    if not (m.is_moe and plan.moe_router_padding and plan.low_precision) or hybridep:
        return 0.0  # workload switches: one value for all plans of a search
    E, k = m.num_experts, m.num_experts_per_tok
    tokens = plan.seq_len / plan.cp * plan.micro_batch / where(plan.sp, plan.tp, 1)
    alltoall = plan.moe_dispatcher == "alltoall"
    counts, drawn = (E, tokens) if alltoall else (E / plan.ep, tokens * plan.ep)
    var = 0.0 if plan.moe_routing == "contiguous" else drawn * k / E * (1 - k / E)
    return counts * expected_alignment_pad(drawn * k / E, var, router_padding_align(m, plan)) / (tokens * k)


def squared_relu_mlp(m: ModelSpec) -> bool:
    """Whether the model's MLP is squared ReLU (Nemotron-H's ungated MLP; the Megatron exports' --squared-relu).
    Source: Nemotron-H's Hugging Face config, mlp_hidden_act "relu2" (as NVIDIA/TensorRT-LLM's NemotronH
    modeling test copies it). Derived: docs/formulas.md#moe.fused_mlp"""
    return bool(m.model_type == "nemotron_h" and not m.gated_mlp)


def fused_grouped_mlp(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Whether the routed experts run Transformer Engine's fused MXFP8 grouped MLP: an MoE model whose experts'
    activation the fusion takes (a GLU: SwiGLU, GPT-OSS's clamped GLU; or squared ReLU), MXFP8 GEMMs, on the
    op-fuser path (fused_mlp_path). TE's fuse_grouped_mlp_ops replaces GroupedLinear + activation + GroupedLinear
    with ForwardGroupedMLP_CuTeGEMMSwiGLU_MXFP8 / BackwardGroupedMLP_CuTeGEMMDSwiGLU_MXFP8 (v2.14 - v2.16; from
    v2.17 one class in ops/fused/grouped_mlp.py, ScaledSReLU too). Source: NVIDIA/Megatron-LM
    megatron/core/transformer/moe/experts.py at d98e8a6 (_is_fused_impl_supported: SwiGLU, quick GEGLU,
    weighted squared ReLU); NVIDIA/TransformerEngine transformer_engine/pytorch/ops/fused/forward_grouped_mlp.py,
    backward_grouped_mlp.py at v2.16. Derived: docs/formulas.md#moe.fused_mlp"""
    takes = bool(m.is_moe and (m.gated_mlp or squared_relu_mlp(m)))
    return takes & (plan.gemm_format == "mxfp8") & fused_mlp_path(plan)


def expert_gemm_tile(plan: ParallelPlan, fmt: str) -> Any:
    """Output tile edge of the routed experts' grouped GEMM: FUSED_MLP_TILE where Transformer Engine's fused
    MXFP8 grouped MLP runs it (mxfp8, fused_mlp_path), TILE elsewhere. Derived: docs/formulas.md#compute.gemm"""
    return where((fmt == "mxfp8") & fused_mlp_path(plan), FUSED_MLP_TILE, TILE)


def fused_dglu_factor(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec, fmt: str) -> Any:
    """Time of fc2's input gradient on Transformer Engine's fused MXFP8 grouped MLP over its GEMM's price: the
    GPU's published dGLU kernel ratio (GpuSpec.fused_dglu_ratio) where a GLU's experts run the fused path in
    mxfp8 (fused_grouped_mlp; squared ReLU's dSReLU kernel shows no gap), else 1. Source: NVIDIA/cudnn-frontend
    benchmark/cutedsl_fusion_kernels results/GB200/output.txt at 3d44fdb0f4, results/GB300/output.txt at
    51023a1f23 (dswiglu over srelu, same GEMM shape). Derived: docs/formulas.md#compute.gemm"""
    glu = fused_grouped_mlp(m, plan) & bool(m.gated_mlp) & (fmt == "mxfp8")
    return where(glu, gpu.fused_dglu_ratio, 1.0)


GEMM_OPERAND_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "mxfp8": MXFP8_BYTES, "fp4": NVFP4_BYTES}
"""Bytes per element of a GEMM operand in each tensor-core format, block scales included (MXFP8: an E8M0
scale per 32; NVFP4: an E4M3 scale per 16). Derived: docs/formulas.md#compute.gemm"""


def grouped_gemm_bytes(fmt: str, M: Any, N: Any, K: Any, groups: Any) -> Any:
    """HBM bytes of one grouped GEMM of `groups` experts: every expert's N x K weights and M x K inputs read in
    the format, its M x N output written in bf16. At a few rows per expert the weights dominate and the GEMM is
    bound by HBM, not by the tensor cores: a small expert batch runs far below peak (the roofline's memory
    side; Williams, Waterman and Patterson 2009, "Roofline"). Derived: docs/formulas.md#compute.gemm"""
    b = GEMM_OPERAND_BYTES.get(fmt, 2.0)
    return groups * (b * (N * K + M * K) + 2.0 * M * N)


def gemm_efficiency(gpu: GpuSpec, dtype: str, d_min: Any) -> Any:
    """Achieved fraction of peak for a GEMM whose smallest dimension is d_min (serving's decode and prefill
    steps; training uses gemm_shape_efficiency).

    Default curve e_max·d/(d + 512), e_max the best measured large-GEMM fraction (Stas Bekman, ml-engineering
    compute/accelerator/README.md:
    A100 0.87, H100 0.80); a calibrated profile's measured (d, efficiency) table replaces it (interpolated in
    log d). Derived: docs/formulas.md#compute.gemm"""
    if gpu.gemm_efficiency:
        d, e = zip(*sorted(gpu.gemm_efficiency), strict=True)
        return np.interp(np.log(np.maximum(d_min, 1.0)), np.log(d), e)
    return gpu.max_gemm_fraction(dtype) * d_min / (d_min + GEMM_HALF_DIM)


def attention_shapes(m: ModelSpec, t: Any) -> list[tuple[Any, Any]]:
    """(K, N) of each attention projection on one of t TP ranks: fused QKV and output (the rank's heads, at
    least one KV head), or MLA's query down/up, KV down (latent + rope key, replicated) and up, and output.
    Derived: docs/formulas.md#compute.gemm"""
    h, a_t = m.hidden_size, m.num_attention_heads / t
    if is_v4_attention(m):
        # DeepSeek-V4 (cost.compressed): query down / up, the shared key/value head, the grouped output
        # projection as one matmul of its FLOPs (a·d -> d_g) and the g·d_g -> h mix
        d, r_q, d_g, g = m.d_head, m.q_lora_rank, m.o_lora_rank, m.o_groups or 1
        q = [(h, r_q), (r_q, a_t * d)] if r_q else [(h, a_t * d)]
        kv = [(h, d)] if m.shared_key_value else [(h, 2 * kv_heads_per_rank(m, t) * d)]
        out = [(a_t * d, d_g), (g * d_g / t, h)] if d_g else [(a_t * d, h)]
        return q + kv + out
    if (mla := m.mla) is not None:
        nope, rope, v, kv_r, q_r = (mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim, mla.kv_lora_rank,
                                    mla.q_lora_rank)
        q = [(h, q_r), (q_r, a_t * (nope + rope))] if q_r else [(h, a_t * (nope + rope))]
        return q + [(h, kv_r + rope), (kv_r, a_t * (nope + v)), (a_t * v, h)]
    return [(h, (a_t + 2 * kv_heads_per_rank(m, t)) * m.d_head), (a_t * m.d_head, h)]


GemmModule = Literal["attention", "grouped_out", "recurrent", "mamba_out_proj", "mlp", "shared_expert", "expert",
                     "router", "latent_proj", "compressor", "indexer", "indexer_query", "hyper_connection",
                     "dsa_indexer"]
"""What a matmul of layer_gemms' list computes: the pricing picks its matmuls by this tag, never by position."""

UNQUANTIZED_MODULES: frozenset[str] = frozenset({"grouped_out", "compressor", "indexer", "router"})
"""Matmuls Megatron-LM runs in bf16 under every low-precision recipe, outside Transformer Engine's FP8 autocast:
DeepSeek-V4's grouped output projection (a torch.einsum over the plain linear_o_group_proj parameter, a·d/g ->
d_g per group) and its compressors' kv / gate and indexer head-weight projections (built and run under
get_fp8_disabled_context); every MoE router's gating matmul (TopKRouter.gating: router_gating_linear, a torch
matmul over the plain weight parameter in the input's dtype or moe_router_dtype, never a TE module; priced in
bf16, an fp32 router_dtype not modelled). Source: NVIDIA/Megatron-LM experimental_attention_variant/
deepseek_v4_hybrid_attention.py (torch.einsum "...gd,grd->...gr") and csa.py at 1e23526adc;
megatron/core/transformer/moe/router.py (gating) and moe_utils.py (RouterGatingLinearFunction) at 24bad8e677.
Derived: docs/formulas.md#compressed.unquantized"""


DETACHED_INPUT_MODULES: frozenset[str] = frozenset({"indexer", "indexer_query", "dsa_indexer"})
"""Matmuls whose input is detached from the graph, so their backward runs the weight gradient alone (no
input-gradient matmul): DeepSeek-V4's CSA indexer (its compressor's kv / gate, query and head-weight
projections), which Megatron-LM feeds x.detach() and qr.detach() on every path (trained by its own KL loss, its
gradients kept from the main model). Source: NVIDIA/Megatron-LM experimental_attention_variant/csa.py at
1e23526adc (_forward_unfused_csa, _forward_fused_indexer_training: x_det, qr_det before
indexer.forward_before_topk); DeepSeek-V3.2's indexer projections ("dsa_indexer": wq_b, wk, weights_proj),
which dsa.py feeds x.detach() and qr.detach() and, with the loss off, runs under torch.no_grad (no weight
gradient either: layer_gemm_seconds). Source: NVIDIA/Megatron-LM experimental_attention_variant/dsa.py at
1e23526adc (DSAttention.forward: torch.enable_grad() if use_indexer_loss else torch.no_grad(); the indexer's
linears parallel_mode "duplicated"). Derived: docs/formulas.md#compressed.unquantized"""


class Gemm(NamedTuple):
    """One matmul of one layer's forward on one rank, one micro-batch (layer_gemms)."""

    flops: Any
    """FLOPs of the matmul on the rank."""
    M: Any
    """Rows (tokens; a routed expert's rows per local expert)."""
    N: Any
    """Output columns."""
    K: Any
    """Reduction length."""
    tp_role: str
    """"ag": column-parallel, its input gathered by TP; "rs": row-parallel, its output reduce-scattered; ""."""
    module: GemmModule
    """What the matmul computes: "expert" marks the routed experts' grouped GEMMs."""


def layer_gemms(m: ModelSpec, plan: ParallelPlan, moe: bool) -> list[Gemm]:
    """(FLOPs, M, N, K, tp_role, module) of each matmul of one layer's forward on one rank, one micro-batch:
    the attention projections, the MLP (or the shared experts, the rank's experts at their rows per expert,
    the router, a latent MoE's two projections). tp_role: "ag" for a column-parallel matmul whose input TP
    gathers (QKV, MLP up), "rs" for a row-parallel one whose output TP reduces (attention output, MLP down),
    "" for the rest. module tags what each matmul is, for the pricing that treats some apart (the routed
    experts' grouped GEMM, the modules kept in bf16). Derived: docs/formulas.md#compute.gemm"""
    s, b, h, t = plan.seq_len / plan.cp, plan.micro_batch, m.hidden_size, plan.tp
    T = s * b
    c = 2 if m.gated_mlp else 1
    shapes = attention_shapes(m, t)
    roles = ["ag", "rs"] if len(shapes) == 2 else [""] * (len(shapes) - 1) + ["rs"]
    a_share = attention_share(m)  # a hybrid's average layer: its share of each mixer kind (mixers.py)
    out = [Gemm(2 * T * k * n * a_share, T, n, k, role, "attention")
           for (k, n), role in zip(shapes, roles, strict=True)]
    if is_v4_attention(m) and m.o_lora_rank:  # DeepSeek-V4's grouped projection, the last but one (attention_shapes)
        out[-2] = out[-2]._replace(module="grouped_out")
    # 0, 2 or 4 recurrent matmuls (Mamba-2's and the linear attention's in / out projections): roles cut to fit;
    # Mamba-2's out_proj (the first pair's second) tagged apart, for mxfp8_modules
    mamba = m.count_layers("mamba") > 0
    out += [Gemm(2 * T * k * n * share, T, n, k, role, "mamba_out_proj" if mamba and i == 1 else "recurrent")
            for i, ((k, n, share), role) in enumerate(zip(recurrent_gemm_shapes(m, t), ["ag", "rs"] * 2,
                                                          strict=False))]
    # DeepSeek-V4's compressors and indexer (their share of the layers) and the two hyper-connection
    # projections (n·h -> (2+n)n), replicated on every TP rank (cost.compressed)
    out += [Gemm(2 * T * k * n * share, T, n, k, "",
                 ("indexer_query" if quantized else "indexer") if indexer else "compressor")
            for k, n, share, quantized, indexer in compressor_gemm_widths(m)]
    # DeepSeek-V3.2's indexer projections (wq_b r_q x H_I·d_I, wk h x d_I, weights_proj h x H_I), whole on every
    # TP rank (dsa.py at 1e23526adc: parallel_mode "duplicated")
    if m.is_dsa:
        H, dI = m.index_n_heads or 0, m.index_head_dim or 0
        out += [Gemm(2 * T * k * n * a_share, T, n, k, "", "dsa_indexer")
                for k, n in ((m.q_lora_rank or h, H * dI), (h, dI), (h, H))]
    if m.hc_mult > 1:
        nh, w = hc_fn_shape(m)
        out += [Gemm(2 * T * nh * w, T, w, nh, "", "hyper_connection")] * 2
    dense_f = m.shared_ffn if moe else m.intermediate_size
    f_share = 1.0 if moe else dense_mlp_share(m)
    if dense_f and f_share:
        mod: GemmModule = "shared_expert" if moe else "mlp"
        out += [Gemm(2 * T * h * c * dense_f / t * f_share, T, c * dense_f / t, h, "ag", mod),
                Gemm(2 * T * dense_f / t * h * f_share, T, h, dense_f / t, "rs", mod)]
    if moe:
        etp, f_e, k_top, w = plan.etp_resolved, m.expert_ffn, m.num_experts_per_tok, m.expert_width
        # Rows per local expert (padded to capacity when a capacity factor is set).
        rows = T / where(plan.sp, t, 1) * k_top * etp * plan.ep / m.num_experts * plan.expert_padding
        routed = 2 * T * k_top * (c + 1) * w * f_e / t  # the experts read and write the expert width w
        out += [Gemm(routed * c / (c + 1), rows, c * f_e / etp, w, "", "expert"),
                Gemm(routed / (c + 1), rows, w, f_e / etp, "", "expert"),
                Gemm(2 * T * h * m.num_experts / t, T, m.num_experts, h, "", "router")]
        if m.moe_latent_size:  # a latent MoE's h -> l and l -> h projections, replicated across TP
            out += [Gemm(2 * T * h * w / t, T, w, h, "", "latent_proj"),
                    Gemm(2 * T * w * h / t, T, h, w, "", "latent_proj")]
    return out


TE_PIPELINE_SPLITS = 4  # Transformer Engine's default num_splits for its "pipeline" GEMM + reduce-scatter overlap


def chunk_rows(plan: ParallelPlan, M: Any, role: str) -> tuple[Any, Any]:
    """Rows of each GEMM call in the forward and in the backward's input-gradient matmul when chunked TP
    overlap (tp_comm_overlap with sp) splits a matmul beside its collective; the weight-gradient matmul
    always runs whole. Megatron-LM (Transformer Engine userbuffers, default methods): ring exchange, one
    chunk per TP rank, for the forward of "ag" matmuls and the input gradient of "rs" ones; the forward
    "rs" reduce-scatter in TE_PIPELINE_SPLITS chunks; the "ag" input gradients overlap in bulk (whole).
    DTensor async TP splits every gathered and reduce-scattered matmul per rank, in both passes.
    Source: Transformer Engine v1.8, pytorch/module/base.py initialize_ub (methods and num_splits);
    PyTorch symmetric_memory fused_all_gather_matmul / fused_matmul_reduce_scatter. Derived:
    docs/formulas.md#compute.gemm"""
    if not role or not plan.tp_comm_overlap:  # a workload switch: one value for all plans of a search
        return M, M
    dtensor = plan.tp_impl == "dtensor"  # likewise
    per_rank = M / plan.tp
    fwd = per_rank if role == "ag" or dtensor else M / TE_PIPELINE_SPLITS
    dgrad = per_rank if role == "rs" or dtensor else None  # None: the bulk-overlapped call runs whole
    return where(plan.sp, fwd, M), (M if dgrad is None else where(plan.sp, dgrad, M))


# Compute streams of a chunked GEMM. Source: NVIDIA/TransformerEngine common/comm_gemm_overlap
# (NVTE_COMM_OVERLAP_MAX_STREAMS 3, the default num_max_streams of CommOverlapBase / CommOverlapP2PBase)
TE_COMPUTE_STREAMS = 3


def chunked_gemm_efficiency(gpu: GpuSpec, dtype: str, plan: ParallelPlan, M: Any, rows: Any, N: Any,
                            K: Any) -> Any:
    """Achieved fraction of peak of an M x N x K matmul that chunked TP overlap runs as M / rows calls of `rows`
    rows each. Transformer Engine's userbuffers launch chunk i on compute stream i % min(3, chunks), and a
    chunk waits only for its own input (ring exchange: its piece's receive; pipeline: nothing), so a chunk's
    first wave starts beside the previous chunk's last, partial one: the chunks' tiles fill the SMs together,
    wave quantisation counts all of them (one GEMM's waves), while tile quantisation stays each chunk's own
    (grouped_gemm_efficiency with M / rows groups). PyTorch's async TP (dtensor) runs its pieces one after
    another on one stream: each pays its own waves. Source: NVIDIA/TransformerEngine
    common/comm_gemm_overlap/comm_gemm_overlap.cpp (v2.8: CommOverlapCore::initialize, split_overlap_rs,
    CommOverlapP2PBase::split_overlap_ag / split_overlap_rs; v1.8 pytorch/csrc/comm_gemm_overlap.h likewise).
    Derived: docs/formulas.md#compute.gemm_chunks"""
    chunks = np.round(M / np.maximum(rows, 1e-9))
    concurrent = plan.tp_impl != "dtensor"  # a workload switch: one value for all plans of a search
    streams = np.minimum(TE_COMPUTE_STREAMS, chunks)
    groups = where(streams >= 2, chunks, 1.0) if concurrent else 1.0
    return grouped_gemm_efficiency(gpu, dtype, rows, N, K, groups)


MXFP8_CUBLAS_GEMM_TIME = 171.869 / 163.493
"""Time of a cuBLASLt MXFP8 (E8M0 block scales per 32 elements) GEMM over a per-tensor-scaled FP8 one of the
same shape on the same Blackwell GPU: Transformer Engine's GEMM-profiling tutorial, one B300, the 12 GEMMs of a
5B layer at M = 15,872 pre-quantised and timed together (tex.generic_gemm, CUDA events, 100 iterations), 24
layers 171.869 ms MXFP8 against 163.493 ms Float8CurrentScaling (fprop 2.365 / 2.158, dgrad 2.397 / 2.329, wgrad
2.400 / 2.325 ms a layer); the MXFP8 time includes the operands' scale swizzles that tex.generic_gemm runs
before each GEMM (the tutorial's quantiser leaves the scales unswizzled). The GPU profiles' fp8 large-GEMM rate
(max_gemm_tflops_fp8) is a per-tensor FP8 measurement, so MXFP8 matmuls on cuBLAS take this ratio more.
Source: NVIDIA/TransformerEngine docs/examples/gemm_profiling/gemm_profiling.rst ("Autocast vs
Pre-quantized", per-layer table) and benchmarks/gemm/benchmark_gemm.py (benchmark_fp8_prequantized,
benchmark_fp8_current_prequantized) at 1609c890e. Derived: docs/formulas.md#compute.mxfp8_cublas_rate"""


def block_scaled_gemm_factor(m: ModelSpec, plan: ParallelPlan, fmt: str, module: str) -> Any:
    """Time factor of one matmul in `fmt` over the fp8 large-GEMM rate's pricing: MXFP8_CUBLAS_GEMM_TIME for an
    MXFP8 matmul on cuBLASLt (Transformer Engine's Linear, LayerNormLinear and GroupedLinear: general_gemm /
    general_grouped_gemm), 1 for the routed experts on the fused CuTeDSL grouped MLP (fused_grouped_mlp: their
    kernels are priced at the fp8 rate against cudnn-frontend's measured GB200 MXFP8 times, fused_dglu_factor)
    and for every other format. Derived: docs/formulas.md#compute.mxfp8_cublas_rate"""
    if fmt != "mxfp8":
        return 1.0
    if module == "expert":
        return where(fused_grouped_mlp(m, plan), 1.0, MXFP8_CUBLAS_GEMM_TIME)
    return MXFP8_CUBLAS_GEMM_TIME


def bf16_module_gemms(plan: ParallelPlan, gemms: list[Gemm]) -> frozenset[int]:
    """Indices into layer_gemms' list of the matmuls plan.bf16_modules keeps in bf16 under a low-precision
    recipe: those whose module tag is named (the attention projections; a latent MoE's two projections).
    Derived: docs/formulas.md#precision"""
    if not plan.low_precision or not plan.bf16_modules:
        return frozenset()
    return frozenset(i for i, g in enumerate(gemms) if g.module in plan.bf16_modules)


def mxfp8_module_gemms(plan: ParallelPlan, gemms: list[Gemm]) -> frozenset[int]:
    """Indices into layer_gemms' list of the matmuls plan.mxfp8_modules runs in MXFP8 under the NVFP4 recipe
    (Megatron-Core's quantization recipe: a module matched to an mxfp8 config inside the fp4 context), in the
    layers the recipe quantises; none under any other recipe. Source: NVIDIA-NeMo/Megatron-Bridge
    src/megatron/bridge/perf_recipes/nemotronh/te_quant.cfg at 067f987df (mamba_outproj_mxfp8: "*mixer.out_proj",
    fp8_quantization_recipe mxfp8). Derived: docs/formulas.md#precision.mxfp8_modules"""
    if plan.recipe != "nvfp4" or not plan.low_precision or not plan.mxfp8_modules:
        return frozenset()
    return frozenset(i for i, g in enumerate(gemms) if g.module in plan.mxfp8_modules)


def layer_gemm_seconds(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec, moe: bool,
                       only: str | None = None) -> tuple[Any, Any]:
    """(forward, backward) time of one layer's GEMMs: its GEMM FLOPs (layer_flops) at the FLOP-weighted
    harmonic mean of the efficiencies of its own matmuls, in the recipe's format (the plan's bf16 layers,
    low_precision_layer_fraction, in bf16: the average layer mixes both; bf16_module_gemms in bf16 in every
    layer; under NVFP4, mxfp8_module_gemms in MXFP8 in the low-precision layers). The backward is an input-gradient and
    a weight-gradient
    matmul of the forward's FLOPs each, priced at the forward's shape except where chunked TP overlap splits
    the call (chunk_rows). `only` (a module, e.g. "expert"): the time of that module's matmuls alone, each
    priced as in the whole layer. An MXFP8 matmul on cuBLASLt takes block_scaled_gemm_factor more. A matmul of
    DETACHED_INPUT_MODULES runs no input-gradient matmul.
    Derived: docs/formulas.md#compute.gemm, docs/formulas.md#precision, docs/formulas.md#compute.mxfp8_cublas_rate"""
    gemms = layer_gemms(m, plan, moe)
    total = sum(g.flops for g in gemms)
    # (a hybrid's layer variant without mixer or MLP has no matmul: cost.hybrid_stage)
    per_flop = where(total > 0, layer_flops(m, plan, moe).gemm / where(total > 0, total, 1.0), 0.0)
    # The routed experts' two matmuls (module "expert") run as one grouped GEMM over the rank's E/ep experts,
    # and the most-loaded rank computes routing_imbalance x the mean routed rows (capacity padding: the factor).
    load = routing_imbalance(m, plan) + router_padding_share(m, plan) if moe else 1.0  # moe.router_padding
    split = bool(plan.tp_comm_overlap and np.any(plan.sp))  # skip the piece shapes when no plan chunks
    kept = bf16_module_gemms(plan, gemms)
    mx = mxfp8_module_gemms(plan, gemms)
    dsa_no_grad = m.is_dsa and indexer_loss(m, plan, gpu) == "off"

    def seconds(low: str) -> tuple[Any, Any]:
        fwd = bwd = 0.0
        for i, (f, M, N, K, role, module) in enumerate(gemms):
            if only is not None and module != only:
                continue
            fmt = "bf16" if i in kept or module in UNQUANTIZED_MODULES else low
            fmt = "mxfp8" if i in mx and fmt != "bf16" else fmt  # the NVFP4 layers' MXFP8 modules
            scale = per_flop / gpu.sustained_flops(fmt) * block_scaled_gemm_factor(m, plan, fmt, module)
            x, g = (load, m.num_experts / plan.ep) if module == "expert" else (1.0, 1)
            tile = expert_gemm_tile(plan, fmt) if module == "expert" else TILE
            whole = f * x / grouped_gemm_efficiency(gpu, fmt, M, N, K, g, tile) * scale
            if module == "expert":  # few rows per expert: the weights' reads, not the tensor cores, set the time
                whole = maximum(whole, grouped_gemm_bytes(fmt, M * x, N, K, g) / gpu.hbm_achieved_bytes_per_s)
            if split and role:
                f_rows, d_rows = chunk_rows(plan, M, role)
                fwd = fwd + f * x / chunked_gemm_efficiency(gpu, fmt, plan, M, f_rows, N, K) * scale
                dgrad = whole if d_rows is M else f * x / chunked_gemm_efficiency(gpu, fmt, plan, M, d_rows, N,
                                                                                  K) * scale
                bwd = bwd + dgrad + whole
            else:  # fc2 (the experts' second matmul): its input gradient runs the fused dGLU kernel
                fc2 = module == "expert" and i > 0 and gemms[i - 1].module == "expert"
                dgrad = whole * fused_dglu_factor(m, plan, gpu, fmt) if fc2 else whole
                dgrad = 0.0 if module in DETACHED_INPUT_MODULES else dgrad  # a detached input: no dgrad
                wgrad = 0.0 if module == "dsa_indexer" and dsa_no_grad else whole  # V3.2's loss off: no_grad
                fwd, bwd = fwd + whole, bwd + dgrad + wgrad
        return fwd, bwd

    share = plan.low_precision_layer_fraction(m.num_hidden_layers)
    low = seconds(plan.gemm_format)
    if np.all(share == 1.0):
        return low
    high = seconds("bf16")
    return share * low[0] + (1 - share) * high[0], share * low[1] + (1 - share) * high[1]
