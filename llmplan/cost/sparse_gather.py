"""DeepSeek-V4's attention core in training: one index-driven (gather) sparse attention call per layer over a
fixed number of key slots per query, priced at its published kernel rates instead of the dense fused kernel's.

Every DeepSeek-V4 layer, the window-only ones included, runs one sparse call whose per-query index list is the
128-token window (its positions before the sequence start set to -1) plus, in a CSA layer, the indexer's top-k
compressed keys (padded to index_topk with -1) and, in an HCA layer, every compressed key; the list is padded to
a multiple of 64 slots, and every slot is computed (no topk_length is passed), so the work does not shrink with
the causal prefix. Forward: FlashMLA's flash_mla_sparse_fwd; backward: cuDNN Frontend's DSA sparse attention
backward (NVIDIA/Megatron-LM experimental_attention_variant/csa.py and csa_kernels.py at 1e23526adc, the
dsv4_fused_rope_output_alias branch the 26.08 Megatron-Bridge runs use: _forward_fused_no_indexer,
FusedCSAIndexerSparseAttnFunc, _get_topk_alignment, CSASparseAttnFunc).

Symbols: s tokens of a sequence (s/cp on a rank), b the micro-batch, a query heads (a/t on a rank), d the head
dimension (key = value), w the window, k = index_topk, m' the HCA compression rate, K the slots of a call,
k0 the kernel's fixed slots (GATHER_FIXED_SLOTS).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llmplan.specs.hardware import GpuSpec
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.rule import as_bool

GATHER_TOPK_ALIGN = 64
"""Slots a sparse call's index list is padded to a multiple of on SM100 (the head-64 kernels' B_TOPK).
Source: NVIDIA/Megatron-LM megatron/core/transformer/experimental_attention_variant/csa_kernels.py at 1e23526adc
(_get_topk_alignment: 64 at compute capability >= 10, 128 below). Derived: docs/formulas.md#compute.sparse_gather"""

GATHER_REF_SLOTS = 640
"""Slots per query at which GpuSpec.sparse_gather_efficiency is measured: DeepSeek-V4-Flash's CSA call, its 512
indexer keys and 128-token window. Source: NVIDIA/cudnn-frontend benchmark/dsa/configs/deepseek_v4.py
(DSV4_FLASH: topk 640, indexer_topk 512, 64 heads, d_qk = d_v = 512). Derived: docs/formulas.md#compute.sparse_gather"""

GATHER_FIXED_SLOTS = 140.7
"""Slots' worth of time a sparse gather call spends per query outside its loop over the slots (the dKV clear
and convert, the O·dO preprocessing, the pipeline fill and epilogue), so a call of K slots runs at K / (K + k0)
of the kernel's asymptote. Solved from two published backward times of one kernel on B200 (64 heads, d = 512,
4,096 queries): top-k 512 in 1.243 ms and 2,048 in 4.168 ms, k0 = (2048 - 512·r) / (r - 1) with r their ratio.
The same line gives top-k 1,024 within 1% (2.218 against 2.198 ms) and 128 within 9% (0.512 against 0.563).
Source: NVIDIA/cudnn-frontend benchmark/dsa/README.md ("Sparse Attention Backward", B200 results table).
Derived: docs/formulas.md#compute.sparse_gather"""

INDEXER_BACKWARD_GEMMS = 3
"""Matmuls of the CSA indexer's sparse backward, each 2·(s/cp)·b·H_I·d_I·k FLOPs over the k selected keys (the
recomputed index scores, the query gradient, the key gradient). Source: NVIDIA/cudnn-frontend
benchmark/dsa/benchmark_dsa_indexer_h32.py at 8f6dd62b4e ("Three GEMMs each contribute 2*B*Sq*H*D*TopK FLOPs",
DSA.indexer_backward_wrapper). Derived: docs/formulas.md#compute.indexer_loss"""

BACKWARD_FLOP_RATIO = 2.5
"""Backward FLOPs of a sparse gather call over its forward's: five matmuls (the recomputed scores, dV, dP, dQ,
dK) against two, 2·s·a·K·(3d_qk + 2d_v) against 2·s·a·K·(d_qk + d_v), 2.5 at d_qk = d_v (the count the
published backward rates use). Source: NVIDIA/cudnn-frontend benchmark/dsa/README.md ("TFLOPS count only the
gathered rows"). Derived: docs/formulas.md#compute.sparse_gather"""


def fused_csa_priced(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec) -> Any:
    """Whether the plan's DeepSeek-V4 attention is priced as Megatron-LM's fused CSA path runs it (the sparse
    gather calls and, in training, the indexer-loss kernels at their published rates): a model with compressed
    layers, fused attention, a GPU with a published sparse gather rate. Else the dense fused kernel's rate prices
    it. The launcher turns that path on with apply_dsa_kernel_fusion (dsa_kernel_backend "cudnn") and trains
    the indexer with the sparse KL loss. Source: NVIDIA/Megatron-LM transformer_config.py (apply_dsa_kernel_fusion
    -> dsa_kernel_backend) and csa.py (_forward_fused_indexer_training) at 1e23526adc. A Python bool
    for one plan (the export's question, which Hydra writes as true/false), a bool array for plans whose
    flash_attention is an array (check_plan's rule indexer_reference_rate and cost.compute.attention_seconds
    ask it of either).
    Derived: docs/formulas.md#compute.indexer_loss"""
    return fused_csa(m, plan, gpu.has_sparse_gather_rate)


def fused_csa(m: ModelSpec, plan: ParallelPlan, gather_rate: bool) -> Any:
    """fused_csa_priced's condition given whether the GPU lists GpuSpec.sparse_gather_efficiency (`gather_rate`:
    what the memory functions receive): a Python bool for one plan, a bool array for plan arrays.
    Derived: docs/formulas.md#compute.indexer_loss"""
    r = bool(m.compressed_layers) & as_bool(plan.flash_attention) & bool(gather_rate)
    return bool(r) if np.ndim(r) == 0 else r


def asked_indexer_loss(m: ModelSpec, plan: ParallelPlan) -> str | None:
    """The indexer's training as the plan or the model sets it (ParallelPlan.indexer_loss, else
    ModelSpec.indexer_loss); None where neither does and indexer_loss decides from the GPU (DeepSeek-V4), or
    "off" for a model without an indexer. Derived: docs/formulas.md#compute.indexer_training"""
    if not m.is_sparse_attention:
        return "off"
    return str(plan.indexer_loss) if plan.indexer_loss is not None else m.indexer_loss


def indexer_loss(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec, fused: bool | None = None) -> str:
    """How the plan trains the lightning indexer ("off", "dense" or "sparse"; "off" for a model without one):
    ParallelPlan.indexer_loss, else ModelSpec.indexer_loss (the model's public Megatron config), else, for
    DeepSeek-V4, "sparse" where its fused CSA path is priced (fused_csa_priced: fused attention on a GPU with a
    published sparse gather rate; Megatron-Bridge's perf recipes with that path:
    perf_recipes/deepseek/gb200/deepseek_v4.py at 067f987df, dsa_indexer_loss_coeff 0.01, dsa_indexer_use_sparse_loss True) and "off" elsewhere (its library recipes:
    recipes/deepseek/h100/deepseek_v4.py, coefficient 0.0), else "off" (Megatron-Core's dsa_indexer_loss_coeff
    None). The Megatron-Bridge export writes it (export.bridge.dsa_overrides). `fused` says whether the fused
    CSA path runs where the caller already knows (a pricing of that path alone, over a batch of plans whose
    flash_attention varies); None asks fused_csa_priced of the one plan.
    Derived: docs/formulas.md#compute.indexer_training"""
    asked = asked_indexer_loss(m, plan)
    if asked is not None:
        return asked
    return "sparse" if (fused_csa_priced(m, plan, gpu) if fused is None else fused) else "off"


REFERENCE_SCORE_PASSES = (1, 4)
"""Passes over the indexer's scores, in units of its forward (2·H_I·d_I + 2·H_I a scored pair), that Megatron-Core's
reference indexer loss runs (FusedDSAIndexerLoss, no fused DSA kernel): forward one (fused_qk_topk_naive's
_compute_index_scores, shared by the top-k and the loss); backward four (bwd_fused_indexer_loss_naive recomputes
the weighted scores, the unweighted einsum again, then dQ and dK), every scored key whatever the loss's mask.
Source: NVIDIA/Megatron-LM megatron/core/transformer/experimental_attention_variant/dsa.py at 1e23526adc.
Derived: docs/formulas.md#compute.indexer_training"""

REFERENCE_TARGET_PASSES = (1, 1)
"""Passes of the KL target (the main attention's QK^T of the rank's heads over every scored key, query and key
detached) in Megatron-Core's reference indexer loss: compute_dsa_indexer_loss in the forward, recomputed by
bwd_fused_indexer_loss_naive in the backward. Source: NVIDIA/Megatron-LM dsa.py at 1e23526adc.
Derived: docs/formulas.md#compute.indexer_training"""


def reference_rate(gpu: GpuSpec) -> float:
    """FLOP/s of the reference indexer loss's fp32 matmuls (q.float(), query.float() before einsum / bmm): the
    sustained TF32 peak where the GPU lists one, else its fp32 peak: Megatron-LM does not set allow_tf32, but the
    NGC PyTorch containers the recipes run in set ENV TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1, so cuBLAS takes fp32
    matmuls to TF32. Source: MONAI docs, "Precision and Accelerating" (docs.monai.io/en/stable/
    precision_accelerating.html). A GPU profile listing neither rate (a user profile with bf16 alone) gives NaN:
    check_plan's rule indexer_reference_rate refuses those plans, so the value is never reported.
    Derived: docs/formulas.md#compute.indexer_training"""
    dtype = reference_dtype(gpu)
    return gpu.sustained_flops(dtype) if dtype else float("nan")


def reference_dtype(gpu: GpuSpec) -> str | None:
    """The GpuSpec.tflops key the reference indexer loss's fp32 matmuls run at (reference_rate): tf32 where
    listed, else fp32, else None (the profile lists neither)."""
    return next((k for k in ("tf32", "fp32") if gpu.tflops.get(k)), None)  # type: ignore[call-overload]


def indexer_target_flops(m: ModelSpec, plan: ParallelPlan, scores: Any) -> Any:
    """Forward FLOPs of the indexer loss's KL target over the keys the indexer scores, one layer, one micro-batch,
    one rank, from the scores' FLOPs (scores / (2·H_I·d_I + 2·H_I) scored pairs): the main attention's QK^T of the
    rank's a/t heads at d_qk over each scored pair (MLA: the query-key head dimension; DeepSeek-V4: d).
    Derived: docs/formulas.md#compute.indexer_training"""
    from llmplan.cost.flops import attention_head_dims
    from llmplan.cost.sparse import indexer_flops_per_pair
    pairs = scores / max(indexer_flops_per_pair(m), 1.0)
    return pairs * 2.0 * m.num_attention_heads / plan.tp * attention_head_dims(m)[0]


def reference_indexer_seconds(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec, scores: Any) -> Any:
    """Forward-equivalent seconds (stage_compute charges them three times) of the mean layer's indexer scores and
    loss where no fused DSA kernel runs (DeepSeek-V3.2; DeepSeek-V4 off its fused CSA path), one micro-batch, one
    rank, given the scores' forward FLOPs: Megatron-Core's reference path in fp32 (reference_rate). With the
    loss off (DeepSeek-V3.2 at dsa_indexer_loss_coeff 0: the indexer under torch.no_grad) the scores' forward
    alone; else FusedDSAIndexerLoss's REFERENCE_SCORE_PASSES over the scores and REFERENCE_TARGET_PASSES over
    the KL target (indexer_target_flops), every scored key for the dense and the sparse loss alike (the sparse
    mask is applied to full score matrices). DeepSeek-V4's CSA layers run it at any coefficient: csa.py's
    _forward_unfused_csa calls FusedDSAIndexerLoss in every training step and attaches its loss
    (DSAIndexerLossAutoScaler), so its backward runs, scaled by 0. Source: NVIDIA/Megatron-LM
    experimental_attention_variant/dsa.py (use_indexer_loss, FusedDSAIndexerLoss, fwd_ / bwd_fused_indexer_loss_naive)
    and csa.py (_forward_unfused_csa) at 1e23526adc. Derived: docs/formulas.md#compute.indexer_training"""
    rate = reference_rate(gpu)
    if not m.compressed_layers and indexer_loss(m, plan, gpu) == "off":
        return scores / rate / 3
    work = sum(REFERENCE_SCORE_PASSES) * scores + sum(REFERENCE_TARGET_PASSES) * indexer_target_flops(m, plan, scores)
    return work / rate / 3


def padded_slots(K: Any) -> Any:
    """K slots rounded up to GATHER_TOPK_ALIGN. Derived: docs/formulas.md#compute.sparse_gather"""
    return np.ceil(np.asarray(K, dtype=float) / GATHER_TOPK_ALIGN) * GATHER_TOPK_ALIGN


def gather_calls(m: ModelSpec, s: Any) -> list[tuple[Any, int]]:
    """(slots per query, layers) of the model's sparse calls for a sequence of s tokens: a window-only layer
    w, a CSA layer w + k (the indexer's list is padded to k whatever s), an HCA layer w + s/m' (every
    compressed key), each padded to GATHER_TOPK_ALIGN; [] for models without compressed attention.
    Source: NVIDIA/Megatron-LM csa.py at 1e23526adc (get_window_topk_idxs, get_compress_topk_idxs: s/m' columns;
    FusedCSAIndexerSparseAttnFunc: indexer_topk passed unclamped so the list is padded to it).
    Derived: docs/formulas.md#compute.sparse_gather"""
    if not m.compressed_layers:
        return []
    w, k = m.sliding_window or 0, m.index_topk or 0
    s = np.asarray(s, dtype=float)
    kinds = (("sliding_attention", w + 0 * s), ("compressed_sparse_attention", w + k + 0 * s),
             ("heavily_compressed_attention", w + np.floor(s / m.compress_rate_hca)))
    return [(padded_slots(K), m.count_layers(kind)) for kind, K in kinds if m.count_layers(kind)]


def gather_rate_ratio(K: Any) -> Any:
    """A sparse gather call's rate at K slots per query over its rate at GATHER_REF_SLOTS:
    [K/(K + k0)] / [K_ref/(K_ref + k0)]. Derived: docs/formulas.md#compute.sparse_gather"""
    K = np.asarray(K, dtype=float)
    ref = GATHER_REF_SLOTS / (GATHER_REF_SLOTS + GATHER_FIXED_SLOTS)
    return K / (K + GATHER_FIXED_SLOTS) / ref


def gather_layer_seconds(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec) -> tuple[Any, Any]:
    """(forward, backward) seconds of the mean layer's sparse gather call, one micro-batch, one rank: per call
    2·(s/cp)·b·(a/t)·K·(d_qk + d_v) forward FLOPs and BACKWARD_FLOP_RATIO times that backward, at the GPU's
    sustained bf16 peak x GpuSpec.sparse_gather_efficiency (forward, backward) x gather_rate_ratio(K), summed
    over the layers and divided by their number. Derived: docs/formulas.md#compute.sparse_gather"""
    eff = gpu.sparse_gather_efficiency
    if eff is None:
        raise ValueError(f"{gpu.name} lists no sparse gather attention rate (GpuSpec.sparse_gather_efficiency)")
    q = plan.seq_len / plan.cp * plan.micro_batch * m.num_attention_heads / plan.tp  # (query, head) pairs
    per_slot = 2.0 * q * 2 * m.d_head  # forward FLOPs per slot: QK^T and PV at d_qk = d_v = d
    peak = gpu.sustained_flops("bf16")
    fwd = bwd = 0.0
    for K, n in gather_calls(m, plan.seq_len):
        rate = peak * gather_rate_ratio(K)
        fwd = fwd + n * per_slot * K / (rate * eff[0])
        bwd = bwd + n * BACKWARD_FLOP_RATIO * per_slot * K / (rate * eff[1])
    L = m.num_hidden_layers
    return fwd / L, bwd / L


def indexer_loss_layer_seconds(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec) -> tuple[Any, Any]:
    """(target recompute, indexer backward) seconds of the mean layer's CSA indexer-loss kernels, one micro-batch,
    one rank. In training Megatron-LM's fused CSA path (FusedCSAIndexerSparseAttnFunc, apply_dsa_kernel_fusion)
    runs, in the forward, two sparse kernels beside the attention call of every compressed_sparse_attention layer:
    the attention scores recomputed over the indexer's k selected compressed keys (cuDNN
    sparse_attn_score_recompute, the KL target: QK^T of the a/t heads at d_qk, 2·(s/cp)·b·(a/t)·k·d FLOPs) and
    the indexer's own sparse backward (indexer_backward_wrapper: INDEXER_BACKWARD_GEMMS matmuls of
    2·(s/cp)·b·H_I·d_I·k, the indexer replicated on every TP rank); its autograd backward then only scales the
    gradients precomputed. Priced at the published gather rates (GpuSpec.sparse_gather_efficiency, forward for the
    recompute, backward for the indexer backward) at k slots (padded_slots, gather_rate_ratio): no rate of either
    kernel is published. As the plan trains the indexer (indexer_loss): sparse as above; dense over every
    compressed key (s/m, padded: the dense target _compute_dense_attn_score and dense_indexer_backward_wrapper);
    off (dsa_indexer_loss_coeff 0, which the Megatron-Bridge export writes with the sparse flag) the target over
    the k keys, which the kernel computes at any coefficient, and no indexer backward (its gradients are zeros).
    0 without a published rate or a CSA indexer.
    Source: NVIDIA/Megatron-LM megatron/core/transformer/experimental_attention_variant/csa.py
    (_forward_fused_indexer_training) and csa_kernels.py (FusedCSAIndexerSparseAttnFunc: _compute_attn_target,
    indexer_backward_wrapper "eagerly computed in the forward pass") at 1e23526adc.
    Derived: docs/formulas.md#compute.indexer_loss"""
    eff = gpu.sparse_gather_efficiency
    n = m.count_layers("compressed_sparse_attention")
    if eff is None or not n or not m.index_topk:
        return 0.0, 0.0
    T = plan.seq_len / plan.cp * plan.micro_batch
    loss = indexer_loss(m, plan, gpu, fused=True)  # the fused path's kernels: attention_seconds picks them
    k = padded_slots(plan.seq_len / m.compress_rate_csa if loss == "dense" else m.index_topk)
    rate = gpu.sustained_flops("bf16") * gather_rate_ratio(k)
    target = 2.0 * T * m.num_attention_heads / plan.tp * k * m.d_head / (rate * eff[0])
    H, dI = m.index_n_heads or 0, m.index_head_dim or 0
    backward = INDEXER_BACKWARD_GEMMS * 2.0 * T * H * dI * k / (rate * eff[1]) * (loss != "off")
    L = m.num_hidden_layers
    return n * target / L, n * backward / L
