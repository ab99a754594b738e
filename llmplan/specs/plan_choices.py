"""The choices of ParallelPlan's switch fields (one Literal type per field, with its values as a tuple for
the CLI and the search), the bytes per optimizer-state dtype and the --precision recipes."""

from __future__ import annotations

from typing import Literal, get_args

Recompute = Literal["none", "selective", "full", "op"]
RECOMPUTE: tuple[str, ...] = get_args(Recompute)
RecomputeModule = Literal["core_attn", "layernorm", "mla_up_proj", "mlp", "moe", "moe_act", "shared_experts", "mhc"]
RECOMPUTE_MODULES: tuple[str, ...] = get_args(RecomputeModule)
"""Megatron-Core's --recompute-modules choices llmplan prices (TransformerConfig.recompute_modules; mhc: the
hyper-connections of Megatron-Bridge's DeepSeek-V4 recipes; the Gated-DeltaNet modules belong to layers llmplan
does not model)."""
OffloadModule = Literal["attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act"]
OFFLOAD_MODULES: tuple[str, ...] = get_args(OffloadModule)
"""Megatron-Core's --offload-modules choices llmplan prices (TransformerConfig.offload_modules with
fine_grained_activation_offloading, NVIDIA/Megatron-LM transformer_config.py at d98e8a64dd): each moves its
module's input, as the module saves it for backward, to host memory. fused_group_mlp (its whole fused grouped MLP,
filtered by min_offloaded_tensor_size) stays the Nemotron-3 Ultra reading of ParallelPlan.offload_moe_act, and
gdp_qkv belongs to Gated-DeltaNet layers llmplan does not model. docs/formulas.md#mem.offload_modules"""
MOE_OFFLOAD_MODULES: tuple[str, ...] = ("mlp_norm", "expert_fc1", "moe_act")
"""The offload modules whose groups sit in an MoE layer's MLP (mlp_norm: the dense layers' pre-MLP norm is fused
into fc1's LayerNormLinear, an IdentityOp that Megatron skips)."""
Bf16Module = Literal["attention", "latent_proj"]
BF16_MODULES: tuple[str, ...] = get_args(Bf16Module)
"""Modules a low-precision plan can keep in bf16 in every layer (ParallelPlan.bf16_modules)."""
Mxfp8Module = Literal["mamba_out_proj"]
MXFP8_MODULES: tuple[str, ...] = get_args(Mxfp8Module)
"""Modules an NVFP4 plan can run in MXFP8 in every low-precision layer (ParallelPlan.mxfp8_modules)."""


TrainDtype = Literal["bf16", "fp16", "fp8", "fp4", "fp32"]
Recipe = Literal["tensorwise", "rowwise", "blockwise", "mxfp8", "nvfp4"]
Fp8Scaling = Literal["delayed", "current"]
FP8_SCALINGS: tuple[str, ...] = get_args(Fp8Scaling)
"""--fp8-scaling values, the per-tensor recipe's scale: delayed (from the amax history, the cast writing this
step's amax as a side output: Transformer Engine DelayedScaling) or current (each cast's own amax, reduced by a
kernel that reads the tensor before the cast: TE Float8CurrentScaling, torchao float8 tensorwise dynamic
scaling). docs/formulas.md#precision.fp8_scaling"""
AttentionKernel = Literal["native", "flash2"]
ATTENTION_KERNELS: tuple[str, ...] = get_args(AttentionKernel)
"""--attention-kernel values: the GPU's native fused kernel, or the flash-attn 2 package everywhere."""
AttentionRelease = Literal["cudnn-9.1", "cudnn-9.4", "cudnn-9.19"]
ATTENTION_RELEASES: tuple[str, ...] = get_args(AttentionRelease)
"""--attention-release values: the cuDNN releases whose fused attention (SDPA) training rate NVIDIA published
on Hopper (NVIDIA/cudnn-frontend benchmark results: 9.1.0 at commit b740542, May 2024; 9.4.0 at de355c7, Sep 2024,
whose v1.7.0 release notes say "Updated benchmark numbers with cudnn 9.4.0"; 9.19.1 in
benchmark/sdpa_benchmark_training/results/h200_919_only_cudnn, Feb 2026). GpuSpec.attention_release_efficiency
holds each one's asymptote (docs/formulas.md#compute.attention_release)."""
TpImpl = Literal["megatron", "dtensor"]
TP_IMPLS: tuple[str, ...] = get_args(TpImpl)
"""--tp-impl values: Megatron-LM's sequence-parallel linears, or PyTorch DTensor's (torchtitan)."""
FusedLossImpl = Literal["native", "te"]
FUSED_LOSS_IMPLS: tuple[str, ...] = get_args(FusedLossImpl)
"""--fused-loss-impl values: which fused vocab-parallel cross-entropy runs under fused_loss (Megatron-Core
cross_entropy_fusion_impl): native (Megatron-Core's fused_vocab_parallel_cross_entropy: two all-reduces over
TP) or te (Transformer Engine's parallel_cross_entropy: one all-gather over TP; docs/formulas.md#comm.tp_edge)."""
UnfusedLossImpl = Literal["eager", "vocab-parallel", "vocab-parallel-copy", "eager-vocab-parallel"]
UNFUSED_LOSS_IMPLS: tuple[str, ...] = get_args(UnfusedLossImpl)
"""--unfused-loss-impl values: which loss runs with fused_loss off: eager (PyTorch's cross_entropy on fp32-cast
logits), vocab-parallel (Megatron's _VocabParallelCrossEntropy, in place on its fp32 copy) or vocab-parallel-copy
(the same with the max subtracted into a new fp32 tensor, Megatron-LM 2022-09 .. 2024-06) or eager-vocab-parallel
(eager at tp 1; at tp > 1 a vocabulary-parallel loss of eager ops, nothing in place, as DeepSpeed's AutoTP runs;
docs/formulas.md#mem.activations)."""
CpImpl = Literal["te", "torch-allgather", "torch-alltoall"]
CP_IMPLS: tuple[str, ...] = get_args(CpImpl)
"""--cp-impl values: Transformer Engine's ring (Megatron, NeMo), or PyTorch's experimental context_parallel with
its all-gather or all-to-all K/V rotation (torchtitan, NeMo AutoModel; docs/formulas.md#comm.cp)."""
CpCommType = Literal["p2p", "a2a", "all_gather", "a2a+p2p"]
CP_COMM_TYPES: tuple[str, ...] = get_args(CpCommType)
"""--cp-comm-type values: which of Transformer Engine's context-parallel attentions runs under cp_impl te
(attn_forward_func_with_cp's cp_comm_type, spelled as TE spells it): the p2p K/V ring, a2a (Ulysses: heads
scattered by all-to-alls of Q, K, V and the output), all_gather (every rank gathers the whole K/V) or the
hierarchical a2a+p2p (a2a inside groups of cp_a2a_size ranks, the p2p ring across them; docs/formulas.md#comm.cp_a2a,
#comm.cp_allgather, #comm.cp_hierarchical)."""
NormKernel = Literal["fused-one-pass", "two-pass"]
NORM_KERNELS: tuple[str, ...] = get_args(NormKernel)
"""--norm-kernel values: the fused norm's backward in one pass (Transformer Engine, Apex's persistent
FastLayerNorm) or in two, the weight gradient's kernel reading dy and x again (Apex FusedLayerNorm,
Megatron-LM's fused_kernels copy before 2021-11, PyTorch's native layer_norm; docs/formulas.md#compute.norm_bytes)."""
SoftmaxKernel = Literal["fused", "eager", "eager-fp32", "te"]
SOFTMAX_KERNELS: tuple[str, ...] = get_args(SoftmaxKernel)
"""--softmax-kernel values, without fused attention: Megatron's fused causal softmax (scale, mask and softmax in one
kernel over the lower triangle: --masked-softmax-fusion, the default from 2021); eager, PyTorch's 16-bit ops (an
in-place masked_fill_, then torch softmax: Megatron-LM's 2020 release, whose fusion flags were opt-in); eager-fp32,
Megatron's fp32 torch fallback where the fused kernel's checks fail (forward_torch_softmax with softmax_in_fp32:
cast, scale, mask, softmax, cast back); te, Transformer Engine's unfused attention (Megatron-LM's --attention-backend
unfused): a causal mask built in every layer and the masked kernel over whole rows, or TE's fp32 torch ops where its
kernel's checks fail. docs/formulas.md#compute.score_bytes, #compute.eager_softmax, #compute.te_softmax."""
MoeDispatcher = Literal["alltoall", "deepep"]
MOE_DISPATCHERS: tuple[str, ...] = get_args(MoeDispatcher)
"""--moe-dispatcher values: every routed copy travels (alltoall), or one row per destination rank (deepep)."""
MoeFlexBackend = Literal["deepep", "hybridep"]
MOE_FLEX_BACKENDS: tuple[str, ...] = get_args(MoeFlexBackend)
"""--moe-flex-backend values: the kernels behind the deepep dispatcher (Megatron's moe_flex_dispatcher_backend):
DeepEP's normal kernels, or NVIDIA's Hybrid-EP (TMA) kernels in DeepEP."""
MoeRouting = Literal["random", "contiguous"]
MOE_ROUTINGS: tuple[str, ...] = get_args(MoeRouting)
"""--moe-routing values: k uniformly drawn experts per token, or k consecutive ones (a benchmark gate)."""
ExpertGemm = Literal["grouped", "per-expert"]
EXPERT_GEMMS: tuple[str, ...] = get_args(ExpertGemm)
"""expert_gemm values: one grouped kernel over the local experts, or one GEMM call per local expert."""
CudaGraphs = Literal["none", "layers", "full-iteration"]
CUDA_GRAPHS: tuple[str, ...] = get_args(CudaGraphs)
"""cuda_graphs values: no CUDA graphs (Megatron --cuda-graph-impl none), per-layer graphs of parts of each
layer (transformer_engine / local with --cuda-graph-modules), or one graph of the whole forward-backward
(--cuda-graph-impl full_iteration)."""
OptimizerMasterDtype = Literal["fp32", "bf16", "fp16", "none"]
OPTIMIZER_MASTER_DTYPES: tuple[str, ...] = get_args(OptimizerMasterDtype)
"""--optimizer-master-dtype values: the dtype of Adam's master weights, or none (the model's weights are updated)."""
OptimizerMomentDtype = Literal["fp32", "bf16", "fp16", "fp8"]
OPTIMIZER_MOMENT_DTYPES: tuple[str, ...] = get_args(OptimizerMomentDtype)
"""--optimizer-moment-dtype values (Megatron-LM --exp-avg-dtype / --exp-avg-sq-dtype choices)."""
Optimizer = Literal["adam", "muon"]
OPTIMIZERS: tuple[str, ...] = get_args(Optimizer)
"""--optimizer values: adam (AdamW on every parameter) or muon (Megatron-LM's Muon on the hidden weight matrices,
AdamW on the rest; ParallelPlan.optimizer)."""
OPTIMIZER_STATE_BYTES: dict[str, float] = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "none": 0.0}
"""Bytes per parameter of one optimizer state tensor in each dtype ('none': not kept)."""
PRECISIONS: dict[str, tuple[str, str]] = {
    "bf16": ("bf16", "tensorwise"), "fp8-tensorwise": ("fp8", "tensorwise"), "fp8-rowwise": ("fp8", "rowwise"),
    "fp8-blockwise": ("fp8", "blockwise"), "mxfp8": ("fp8", "mxfp8"), "nvfp4": ("fp4", "nvfp4"),
}
"""--precision NAME -> (dtype, recipe) (docs/formulas.md#precision)."""
