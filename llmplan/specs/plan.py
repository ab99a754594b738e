"""ParallelPlan (how a training job is split over GPUs). The choices of its switch fields live in
specs/plan_choices.py, ClusterSpec (how many of which nodes) in specs/cluster.py and MemoryAllowance (the stated
allowance for buffers and fragmentation) in specs/allowance.py; this module re-exports them."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional

from pydantic import Field, field_validator, model_validator

from llmplan.specs.allowance import MemoryAllowance  # noqa: F401  (re-exported: its home was this module)
from llmplan.specs.cluster import MAX_GPUS, ClusterSpec  # noqa: F401  (re-exported: their home was this module)
from llmplan.specs.model import SPEC_CONFIG, ModelSpec, Spec
from llmplan.specs.plan_choices import (  # noqa: F401  (the unused ones are re-exported: their home was this module)
    ATTENTION_KERNELS, ATTENTION_RELEASES, BF16_MODULES, CUDA_GRAPHS, EXPERT_GEMMS, MOE_DISPATCHERS, MOE_FLEX_BACKENDS,
    MOE_ROUTINGS,
    OPTIMIZERS, Optimizer,
    OPTIMIZER_MASTER_DTYPES, OPTIMIZER_MOMENT_DTYPES, OPTIMIZER_STATE_BYTES, PRECISIONS, RECOMPUTE, RECOMPUTE_MODULES,
    FUSED_LOSS_IMPLS, FusedLossImpl, UNFUSED_LOSS_IMPLS, UnfusedLossImpl,
    TP_IMPLS, AttentionKernel, AttentionRelease, Bf16Module, CudaGraphs, ExpertGemm,
    MoeDispatcher, MoeFlexBackend,
    MoeRouting, FP8_SCALINGS, Fp8Scaling,
    OptimizerMasterDtype, OptimizerMomentDtype, Recipe, Recompute, RecomputeModule, TpImpl, TrainDtype,
    CP_IMPLS, CpImpl, CP_COMM_TYPES, CpCommType, NORM_KERNELS, NormKernel, SOFTMAX_KERNELS, SoftmaxKernel,
    OFFLOAD_MODULES, OffloadModule,
    MXFP8_MODULES, Mxfp8Module,
)
from llmplan.specs.quantities import (  # noqa: F401  (re-exported: their home was this module)
    ETP_SAME_AS_TP, NVFP4_LAYER_FRACTION, RECIPE_GEMM_FORMAT, Degrees, cp_a2a_group, cp_ring_size, PlanLike,
    PlanQuantities, bf16_layer_counts,
    has_layout, resolve_etp,
)
from llmplan.specs.schedule import ScheduleName
from llmplan.units import NVFP4_BYTES


MAX_TOKENS_PER_STEP = 1 << 30
"""Most tokens one optimizer step may hold (global_batch x seq_len, about 1.07 billion): 17 times the largest
published batch, DeepSeek-V3's 15,360 sequences of 4,096 tokens (63M; DeepSeek-V3 Technical Report, section
4.2) and 64 times Llama 3 405B's 16M (The Llama 3 Herd of Models, section 3.4.1). A larger one is a typo
(--global-batch 1000000001 predicted a 441-million-second step)."""

SmCount = Annotated[float, Field(ge=0, le=1024)]
"""SMs of one GPU (a userbuffer method's num_sm, or the SMs set_sm_margin takes; averaged, so not whole)."""
SmsPerRole = tuple[SmCount, SmCount, SmCount, SmCount]
"""SMs per TP-overlap role, in ParallelPlan.tp_overlap_sms's order."""

TUPLE_ITEMS = {f: "numbers, one per TP-overlap role (all-gathers, forward reduce-scatters, backward re-gathers, "
                  "input-gradient reduce-scatters)" for f in ("tp_overlap_sms", "tp_overlap_margin_sms")}
"""What the items of a fixed-length tuple field are, for the error that names its length (registry.
validation_message)."""

PLAN_FILE_ONLY = ("tp_overlap_sms", "tp_overlap_margin_sms", "torchao_saves_hp_input", "jit_activation",
                  "overlap_param_gather_with_optimizer_step", "bias_gelu_fusion")
"""ParallelPlan fields with no command-line flag: set only by editing a plan file (or by a family's recipe)."""


class ParallelPlan(PlanQuantities, Spec):
    """One way to run a training step: parallel degrees, sharding, recompute and batch shape.

    Rules that relate the plan to a model or cluster live in check_plan, not here."""

    model_config = SPEC_CONFIG

    tp: int = Field(default=1, ge=1, le=65_536)
    """Tensor-parallel degree (Megatron column/row-parallel linears)."""
    pp: int = Field(default=1, ge=1, le=4_096)
    """Pipeline-parallel stages."""
    dp: int = Field(default=1, ge=1, le=10_000_000)
    """Data-parallel replicas (GPUs / (tp * pp * cp))."""
    cp: int = Field(default=1, ge=1, le=65_536)
    """Context-parallel degree (sequence split for attention)."""
    ep: int = Field(default=1, ge=1, le=65_536)
    """Expert-parallel degree (experts split over ranks; carved out of dp * cp * tp)."""
    etp: int = Field(default=ETP_SAME_AS_TP, ge=0, le=65_536)
    """Expert tensor-parallel degree; ETP_SAME_AS_TP (0) means equal to tp (Megatron's default); None (no
    --etp given) reads as 0."""
    vpp: int = Field(default=1, ge=1, le=4_096)
    """Virtual pipeline stages per rank (interleaved 1F1B); 1 = plain 1F1B."""
    pp_first: int = Field(default=0, ge=0, le=4_096)
    """Transformer layers on the first pipeline stage (Megatron --decoder-first-pipeline-num-layers); 0 means
    an even share. The stages without a pinned count share the remaining layers evenly."""
    pp_last: int = Field(default=0, ge=0, le=4_096)
    """Transformer layers on the last pipeline stage (Megatron --decoder-last-pipeline-num-layers); 0 means an
    even share."""
    pp_layers: Optional[tuple[Annotated[int, Field(ge=0, le=4_096)], ...]] = Field(default=None, min_length=1,
                                                                             max_length=4_096)
    """Transformer layers on every pipeline stage, first to last (an explicit uneven split, as Megatron's
    --pipeline-model-parallel-layout); None means pp_first / pp_last or an even split."""
    pp_layout: Optional[tuple[Annotated[str, Field(pattern=r"^[EtmL]*$", max_length=65_536)], ...]] = Field(
        default=None, min_length=1, max_length=65_536)
    """Every virtual pipeline chunk in model order, each a run of symbols: E the embedding, t a transformer
    layer, m an MTP layer, L the loss ('' an empty chunk); chunk k runs on pipeline rank k mod pp as its virtual
    chunk k // pp, so there are pp x vpp chunks (Megatron-LM --pipeline-model-parallel-layout, unrolled;
    docs/formulas.md#pipeline.layout). None means pp_layers, pp_first / pp_last or an even split. check_plan
    holds Megatron's rules for it (rule pp_layout)."""
    sp: bool = False
    """Megatron sequence parallelism (norm/dropout activations split over tp)."""
    zero: int = Field(default=0, ge=0, le=3)
    """ZeRO stage over the data-parallel (x cp) group: 1 optimizer (= Megatron distributed optimizer),
    2 + gradients, 3 + parameters."""
    dp_replicate: int = Field(default=1, ge=1, le=10_000_000)
    """Hybrid sharding (HSDP): replicas of the ZeRO shard group. The data-parallel (x cp) group, and the routed
    experts' data-parallel group, split into this many contiguous groups that each shard the ZeRO states;
    the replicas reduce each shard's gradients across them (Megatron-LM num_distributed_optimizer_instances,
    Megatron-FSDP's outer DP; torchtitan data_parallel_replicate_degree). 1: shard over the whole group.
    check_plan: it divides dp and the expert data-parallel degree (docs/formulas.md#mem.hsdp)."""
    dp_outer_optimizer: bool = False
    """With dp_replicate > 1 and ZeRO-3: the optimizer states (master and moments) sharded over every replica
    too, the weights and gradients within the shard group (Megatron-FSDP outer_dp_sharding_strategy optim,
    "HFSDP"); off: the replicas hold the shard group's optimizer shards alike (outer no_shard)."""
    recompute: Recompute = "none"
    """Activation recomputation: none, selective (Megatron's: the attention core), full (every layer) or op
    (torchtitan's per-op selective checkpointing: every layer keeps its input, the outputs of every other
    matmul and of the fused attention, and recomputes the rest in backward; docs/formulas.md#mem.activations)."""
    recompute_layers: Optional[int] = Field(default=None, ge=1, le=1 << 20)
    """With full recompute, recompute only the first N layers of each virtual pipeline chunk and keep the
    others' activations (Megatron --recompute-method block --recompute-num-layers N); None: every layer.
    A plan with it and another recompute mode fails check_plan (rule recompute-layers)."""
    recompute_modules: tuple[RecomputeModule, ...] = Field(default=(), max_length=len(RECOMPUTE_MODULES))
    """With recompute selective, the modules whose activations are dropped in forward and rebuilt in backward
    (Megatron --recompute-granularity selective --recompute-modules): core_attn (the attention core),
    layernorm (the norms not fused into a linear: MLA's input norm, the MoE layers' pre-MLP norm), mla_up_proj
    (MLA's Q/K/V up-projections and RoPE), mlp (the dense layers' MLP), moe (the whole MoE layer), moe_act
    (the experts' activation function), shared_experts and mhc (the hyper-connections' kept streams and
    weights, Megatron-Bridge's DeepSeek-V4 recipes); empty means Megatron's default, core_attn alone
    (docs/formulas.md#mem.recompute_modules). Given without recompute selective it fails check_plan (rule
    recompute_modules)."""
    mtp_layers: Optional[int] = Field(default=None, ge=0, le=16)
    """Multi-token-prediction modules the run trains (Megatron-LM --mtp-num-layers, Megatron-Bridge
    model.mtp_num_layers): None, the model's own num_nextn_predict_layers (DeepSeek-V3 1, Qwen3-Next 1); 0
    trains the model without its MTP module, as Megatron-Bridge's Qwen3-Next provider does by default
    (mtp_num_layers None: NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/models/qwen/qwen_provider.py
    @fb8a4d6bffdc, Qwen3NextModelProvider80B_A3B; its DeepSeek-V3 recipe sets 1, which the export then overrides
    with null); at most the model's count (check_plan rule mtp_layers). Every price (parameters, FLOPs, memory, the
    last stage's layers) and the export follow it (specs.plan.trained_model)."""
    indexer_loss: Optional[Literal["off", "dense", "sparse"]] = None
    """How DeepSeek Sparse Attention's lightning indexer (DeepSeek-V3.2's layers, DeepSeek-V4's CSA layers) is
    trained, as Megatron-Core's dsa_indexer_loss_coeff and dsa_indexer_use_sparse_loss set it: off (coefficient
    0: the indexer runs forward only, under no_grad, so its projections compute no gradient and its scores no
    backward), dense (a KL loss against the attention's scores over every key the indexer scores: their backward
    and the target over all of them) or sparse (the KL over the index_topk keys it picks). Its inputs are
    detached in every case (no input gradient). None: the recipe's (cost.sparse_gather.indexer_loss:
    ModelSpec.indexer_loss; DeepSeek-V4 sparse where its fused CSA path is priced, as Megatron-Bridge's perf
    recipes set it, else off, as its library recipes do; Megatron-Core's coefficient 0 otherwise).
    Only for a model with an indexer (check_plan rule indexer_loss_model; docs/formulas.md#compute.indexer_training)."""
    offload_layers: int = Field(default=0, ge=0, le=1 << 16)
    """Transformer layers whose saved activations go to host memory in forward and come back in backward
    (Megatron-Core --cpu-offloading-num-layers N, TransformerConfig.cpu_offloading; Megatron-Bridge's
    Megatron-FSDP Llama presets set 5-95): the first N layers of the stack, copied asynchronously beside
    compute over the host link (SystemSpec.host_bytes_per_s) by Transformer Engine's offload context, which
    keeps at most L - N layers' activations in HBM. 0: none. Megatron-Core refuses it with pipeline
    parallelism, with activation recompute and with per-layer CUDA graphs, and needs N < L (check_plan
    rules offload_*; docs/formulas.md#mem.offload)."""
    offload_moe_act: bool = False
    """The experts' fc1 output (the activation's input, kept for its backward) goes to host memory in forward and
    comes back in backward, one MoE layer at a time (Megatron-Core --fine-grained-activation-offloading with
    --offload-modules moe_act, or fused_group_mlp with min_offloaded_tensor_size above fc1's input: Megatron-
    Bridge's Nemotron-3 Ultra presets): every MoE layer's but the last one's, copied on side streams over the
    host link (SystemSpec.host_bytes_per_s), each due one MoE layer later. False: none
    (docs/formulas.md#mem.offload_moe_act)."""
    moe_rank_capacity_factor: Optional[float] = Field(default=None, ge=1.0, le=64)
    """The static per-rank budget of a dropless MoE layer in a full-iteration graph (Megatron-Core
    --moe-expert-rank-capacity-factor): HybridEP's dispatch output and the experts' tensors after it have
    tokens x topk x this factor rows (rounded up to the quantisation alignment), the used rows computed on the
    GPU. At least 1: below the average rows HybridEP drops tokens (Megatron-Core does not bound it), and
    llmplan prices a dropless layer. None: 1.5, the value Megatron-Bridge's presets set and llmplan's export
    writes. Priced in memory: the routed rows the experts save at this factor, or with moe_paged_stash the
    stash's one-layer transient at it (docs/formulas.md#mem.paged_stash). Needs cuda_graphs full-iteration
    with a dropless MoE layer (check_plan rule rank_capacity_budget)."""
    moe_paged_stash: Optional[float] = Field(default=None, ge=1.0, le=4.0)
    """Paged stash of the routed experts' saved tensors (Megatron-Core --moe-paged-stash with
    --moe-paged-stash-buffer-size-factor-cuda, the value): under the static per-rank budget of a full-iteration
    graph (--moe-expert-rank-capacity-factor) Transformer Engine's fused MXFP8 grouped MLP saves its grouped
    tensors (fc1's columnwise MXFP8 input and scales, fc1's output, the probabilities, fc2's columnwise MXFP8
    input and scales) at the budget's rows; the stash copies each layer's used rows into one device page pool
    sized at this factor x the average rows in flight and frees the padded tensors, copying back before the
    layer's backward, on a side stream beside the next layer. Priced: the pool's headroom (factor - 1) on those
    tensors and one layer of them at the budget's rows (moe_rank_capacity_factor), no time
    (docs/formulas.md#mem.paged_stash). Needs cuda_graphs full-iteration with a dropless MoE
    layer and no offload of the experts' tensors (check_plan rules paged_stash_*). None: off."""
    offload_modules: tuple[OffloadModule, ...] = Field(default=(), max_length=len(OFFLOAD_MODULES))
    """Modules whose input (as the module saves it for backward) goes to host memory in forward and comes back in
    backward, one layer's group at a time (Megatron-Core --fine-grained-activation-offloading --offload-modules
    ..., Megatron-Bridge model.fine_grained_activation_offloading / model.offload_modules): attn_norm, qkv_linear,
    core_attn, attn_proj, mlp_norm, expert_fc1, moe_act (OFFLOAD_MODULES). Every layer's group but the last one's
    per module name, copied on side streams over the host link (SystemSpec.host_bytes_per_s). moe_act here is
    offload_moe_act; empty: none. Megatron-Core refuses attn_proj without core_attn, the MoE modules with
    recompute module moe and any of them with offload_layers (check_plan rules offload_modules_*;
    docs/formulas.md#mem.offload_modules)."""
    micro_batch: int = Field(default=1, ge=1, le=1 << 20)
    """Sequences per micro-batch per model replica."""
    global_batch: int = Field(default=1, ge=1, le=1 << 30)
    """Sequences per optimizer step over all replicas."""
    seq_len: int = Field(default=4096, ge=1, le=1 << 30)
    """Tokens per sequence."""
    dtype: TrainDtype = "bf16"
    """Compute dtype of the matmuls (fp8 keeps bf16 weights, as Transformer Engine does; fp4 is NVFP4)."""
    recipe: Recipe = "tensorwise"
    """Low-precision recipe with dtype fp8 / fp4 (--precision): per-tensor scaling (Transformer Engine
    delayed or current scaling), rowwise (torchao), blockwise (1x128 activations, 128x128 weights,
    DeepSeek-V3 style), MXFP8 (32-element blocks, E8M0 scales; Blackwell) or NVFP4 (16-element blocks, E4M3
    scales; fp4 only)."""
    fp8_scaling: Fp8Scaling = "delayed"
    """With dtype fp8 and recipe tensorwise, how the per-tensor scale is found: delayed (from the amax history;
    the cast writes the tensor's amax as a side output, no extra pass: Transformer Engine DelayedScaling,
    Megatron-LM's default --fp8-recipe delayed, TE's default recipe on Hopper) or current (before each cast an
    amax kernel reads the whole tensor once more, then the scale, then the cast; under sequence parallelism the
    gathered tensors' amax is all-reduced over TP: TE Float8CurrentScaling, Megatron --fp8-recipe tensorwise,
    Megatron-Bridge's fp8 "cs" presets, torchao float8 tensorwise dynamic scaling as torchtitan runs it).
    Priced in the casts' bytes (docs/formulas.md#precision.fp8_scaling)."""
    bf16_layers_start: Optional[int] = Field(default=None, ge=0, le=1 << 16)
    """With dtype fp8 / fp4, transformer layers at the start of the stack whose GEMMs stay in bf16 (Megatron
    --first-last-layers-bf16 --num-layers-at-start-in-bf16 N). None, with bf16_layers_end None too: the recipe's
    default (NVFP4 keeps the last 15% of the layers in bf16, arXiv 2509.25149; the fp8 recipes none, as
    Megatron-Core); one of the two pinned: the other is 0 (docs/formulas.md#precision)."""
    bf16_layers_end: Optional[int] = Field(default=None, ge=0, le=1 << 16)
    """With dtype fp8 / fp4, transformer layers at the end of the stack whose GEMMs stay in bf16 (Megatron
    --num-layers-at-end-in-bf16 N; Megatron-Bridge's Nemotron-3 Super NVFP4 preset keeps 14). None: as
    bf16_layers_start says."""
    bf16_modules: tuple[Bf16Module, ...] = ()
    """With dtype fp8 / fp4, modules whose GEMMs stay in bf16 in every layer: attention (the QKV and output
    projections) and latent_proj (a latent MoE's h -> l and l -> h projections). Megatron-Core's quantization
    recipe (--te-precision-config-file; matchers *.linear_qkv, *.linear_proj, *mlp.fc[12]_latent_proj), as
    Megatron-Bridge's Nemotron-3 Super NVFP4 presets set them (te_quant.cfg). Priced in the GEMM time only
    (docs/formulas.md#precision)."""
    mxfp8_modules: tuple[Mxfp8Module, ...] = ()
    """With recipe nvfp4, modules whose GEMMs run in MXFP8 in every low-precision layer: mamba_out_proj (the
    Mamba-2 mixer's out_proj). Megatron-Core's quantization recipe (--te-precision-config-file; matcher
    *mixer.out_proj to an mxfp8 config), as Megatron-Bridge's Nemotron-3 Super NVFP4 presets set it (te_quant.cfg).
    Priced in the GEMM time only (docs/formulas.md#precision.mxfp8_modules)."""
    grad_dtype: Literal["fp32", "bf16"] = "fp32"
    """Dtype of the gradient buffer: fp32 (Megatron's default main_grad) or bf16 (the ZeRO paper's 16 B/param)."""
    optimizer: Optimizer = "adam"
    """The optimizer the training recipe runs: adam (AdamW: master weights and two moments for every parameter) or
    muon (Muon, Jordan et al. 2024; Liu et al. 2025, arXiv 2502.16982): one momentum buffer per 2-D hidden weight
    matrix, whose update is orthogonalised by 5 Newton-Schulz iterations in bf16 GEMMs, each TP shard on its own
    (Megatron-LM --muon-tp-mode blockwise: no TP communication), each matrix whole on the one data-parallel rank that
    owns it under zero 1 (Megatron's layer-wise distributed optimizer); the word embedding, the output layer and the
    1-D parameters (norms, biases) keep AdamW (--muon-scalar-optimizer adam). A training-recipe choice, not a
    parallelism one: search keeps the one given (default adam) and never tries the other. check_plan holds where
    it is priced (zero 0 or 1, fp32 states, the architectures of cost.muon.muon_unpriced). Source:
    NVIDIA/Megatron-LM at d0b3b7754, megatron/core/optimizer/emerging_optimizers.py (TensorParallelMuon,
    _is_nonlinear_or_embedding); docs/formulas.md#optim.muon_params."""
    optimizer_master_dtype: OptimizerMasterDtype = "fp32"
    """Adam's master copy of the weights: fp32 (Megatron's default), fp16 (Megatron --use-precision-aware-optimizer
    --main-params-dtype fp16), bf16 (Apex DistributedFusedAdam with dtype bf16 and stored params, as NeMo 1.x sets it
    with fp8_params) or none (no copy: the optimizer updates the model's own weights, as NeMo 1.x's distributed
    Adam does when its state dtype equals the model's). Pure fp32 training keeps no separate copy whatever this
    says; a master below fp32 with dtype fp32 fails validation (docs/formulas.md#mem.model_states)."""
    optimizer_moment_dtype: OptimizerMomentDtype = "fp32"
    """Dtype of Adam's first and second moments: fp32 (default), bf16 (DeepSeek-V3 report §3.3.3; Megatron
    --use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16; NeMo 1.x optim.dtype bf16), fp16
    or fp8 (Megatron's --exp-avg-dtype choices; a per-tensor fp32 scale, negligible). Below fp32 needs dtype
    below fp32 (docs/formulas.md#mem.model_states)."""
    param_remainders: bool = False
    """Megatron-Core's distributed optimizer keeps the fp32 master weights as the 16 low bits the bf16 weights
    lack (OptimizerConfig.store_param_remainders, on by default since core_v0.11.0 whenever
    --use-precision-aware-optimizer runs with bf16 weights; Transformer Engine >= 2.1 FusedAdam; NeMo 1.x's
    Apex DistributedFusedAdam with fp32 states, store_param_remainders): 2 bytes per
    master weight instead of 4. Needs an fp32 master, bf16 weights (dtype bf16, or fp8 / fp4 without
    fp8_params) and a recipe whose optimizer Transformer Engine runs (tensorwise or nvfp4: Megatron-Core keeps
    its own fp32 master for blockwise and MXFP8); check_plan also needs zero 1 or 2 (the distributed
    optimizer) (docs/formulas.md#mem.param_remainders)."""
    kept_grad_shards: bool = False
    """The distributed optimizer writes each bucket's reduce-scattered gradient shard into a tensor of its own,
    in the gradient dtype, kept until the next step's zero_grad: Apex DistributedFusedAdam without NCCL user buffers
    (sync_grads_shard, then grads_shard), as NeMo 1.x's distributed_fused_adam runs it, which zeroes the gradients
    at the start of the next training_step. Priced in the peak after the backward (grad bytes x the rank's
    parameters / the optimizer's shards; none over one rank: the shard is then a view of the bucket). False:
    Megatron-Core's distributed optimizer, which reduce-scatters in place. Needs zero 1 with grad_reduce
    reduce-scatter (under zero 2 the priced gradients are that shard already; docs/formulas.md#mem.kept_grad_shards)."""
    fp32_embedding_grads: bool = False
    """The word embedding, the learned position table and, on the last stage of a pipeline, the tied output layer's
    copy of the word embedding keep fp32 gradients whatever grad_dtype: NeMo 1.x's with_fp32_embedding_grads
    (default True) under Apex DistributedFusedAdam gives those parameters buckets of their own with grad_sync_dtype
    fp32, and Apex keeps one contiguous gradient buffer per bucket dtype. Priced: (4 - grad bytes) per such parameter
    of the rank, in the gradients. Needs zero 1 with grad_reduce reduce-scatter (Apex's layout, as kept_grad_shards)
    and 2-byte gradients (docs/formulas.md#mem.fp32_embedding_grads)."""
    flash_attention: bool = True
    """Fused attention that never stores the s x s score matrix (Korthikanti's 5as^2b term vanishes)."""
    attention_kernel: AttentionKernel = "native"
    """Which fused attention kernel runs: the GPU's native one (cuDNN fused attention / FlashAttention-3 on
    Hopper and later, FlashAttention-2 on Ampere) or FlashAttention-2 everywhere (the flash-attn 2 package;
    PyTorch SDPA's flash backend, which FSDP stacks such as torchtitan ran on H100 in 2024), which reaches a
    lower fraction of Hopper's peak (GpuSpec.flash2_attention_ratio)."""
    attention_release: Optional[AttentionRelease] = None
    """The software release of the native fused attention kernel (cuDNN's fused SDPA, which Transformer Engine
    runs on Hopper), where the stack that runs the plan names it: its asymptote is then the rate published for
    that release on the GPU (GpuSpec.attention_release_efficiency) instead of GpuSpec.attention_efficiency.
    None: the GPU's attention_efficiency. check_plan refuses a release the GPU has no published rate for
    (docs/formulas.md#compute.attention_release)."""
    fp8_params: bool = False
    """With dtype fp8 or fp4, keep the model's weight copy in the recipe's format: fp8 (Megatron
    --fp8-param-gather, NeMo fp8_params) or NVFP4 (Megatron --fp4-param-gather)."""
    overlap_grad_reduce: bool = True
    """Reduce gradients in buckets during the last micro-batch's backward (Megatron --overlap-grad-reduce)."""
    overlap_param_gather: bool = True
    """All-gather updated weights during the next forward (Megatron --overlap-param-gather; needs zero >= 1).
    Without overlap_grad_reduce Megatron-Core's DDP keeps each model chunk one bucket, so the first forward waits
    for the first chunk's whole gather (docs/formulas.md#step.dp_one_bucket); Megatron-Bridge runs that,
    Megatron-LM's validate_args refuses it (export --to megatron then leaves the flag out)."""
    overlap_param_gather_with_optimizer_step: bool = False
    """Megatron-Core --overlap-param-gather-with-optimizer-step (interleaved pipeline, distributed optimizer,
    overlap_param_gather): the first model chunk is one DP bucket with an optimizer of its own, stepped first;
    its whole weight all-gather is launched right after, beside the other chunks' optimizer step, instead of
    before the first forward; its gradients, unbucketed, are reduced after the last backward.
    docs/formulas.md#step.dp_optstep_gather"""
    dp_bucket_params: Optional[Annotated[int, Field(gt=0)]] = None
    """Parameters in one data-parallel gradient bucket of Megatron-Core's DDP (DistributedDataParallelConfig
    bucket_size; Megatron-LM --ddp-bucket-size). None: Megatron-Core's default, max(40M, 1M x dp x cp).
    Megatron-Bridge's CommOverlapConfig sets 128 x 1024 x 1024 with the distributed optimizer and dp > 1
    (docs/formulas.md#step.dp; docs/validation.md#bridge-bucket). Held fixed by the search."""
    launch_blocking: bool = False
    """CUDA_LAUNCH_BLOCKING=1: every kernel launch returns only when the kernel is done, so the GPU idles while
    the host returns, runs the next op's Python and launches it (BigScience's tr11-176B-ml.slurm exports it
    against NCCL hangs on Jean Zay). docs/formulas.md#step.overhead"""
    cuda_lazy_loading: bool = True
    """CUDA loads kernel images into the context as kernels first run (CUDA_MODULE_LOADING=LAZY, CUDA >= 11.7,
    PyTorch's default from 1.13); False: every image at start (older stacks), a larger context
    (docs/formulas.md#mem.runtime)."""
    grad_reduce: Literal["reduce-scatter", "all-reduce"] = "reduce-scatter"
    """How ZeRO-1 reduces the gradients over DP: reduce-scatter (Megatron's distributed optimizer: each rank
    receives the shard it updates) or all-reduce of the whole gradient, each rank then reading its shard
    (DeepSpeed's BF16_Optimizer under its pipeline engine, Megatron-DeepSpeed as BLOOM ran it:
    engine.py _bf16_reduce_grads all-reduces the fp32 gradients). docs/formulas.md#comm.dp"""
    grad_reduce_dtype: Literal["grad_dtype", "bf16"] = "grad_dtype"
    """The dtype the data-parallel gradient reduction sends: grad_dtype (the gradients' own dtype, reduced in
    place) or bf16, gradients accumulated in fp32 but cast to a bf16 copy for the all-reduce and copied back
    after it: DeepSpeed's BF16_Optimizer under its pipeline engine at its default communication_data_type (bf16
    at ZeRO stage 0 with bf16; engine.py allreduce_bucket `tensor.to(self.communication_data_type)`), as BLOOM
    ran it. 2 bytes an element on the wire, and the bf16 copy of each flat fp32 group (2 B a parameter of the
    rank) beside the held states during its all-reduce. Acts only where that optimizer runs
    (cost.model_states.bf16_optimizer: dtype bf16, grad_dtype fp32, zero 1, grad_reduce all-reduce,
    grad_accumulation cast-add; check_plan rule grad_reduce_dtype_bf16_optimizer). Source:
    deepspeedai/DeepSpeed deepspeed/runtime/engine.py at 56c522386 (communication_data_type, allreduce_bucket),
    pipe/engine.py (_bf16_reduce_grads). docs/formulas.md#comm.reduce_dtype, docs/formulas.md#mem.reduce_cast"""
    grad_reduce_fp32_sum: bool = False
    """The distributed optimizer's gradient reduce-scatter sums in fp32 though its buffer and wire are 16-bit:
    Megatron-Core's reduce_scatter_with_fp32_accumulation (Megatron-LM --ddp-reduce-scatter-with-fp32-accumulation,
    Megatron-Bridge ddp.reduce_scatter_with_fp32_accumulation). Each bucket is sent by an all-to-all at the gradient
    dtype into a new tensor of the bucket's size, summed locally in fp32 and written back downcast: the same bytes on
    the wire as a ring reduce-scatter, an all-to-all on the network, scratch buckets (and their fp32 sums of
    1/N of them) beside the held states (docs/formulas.md#mem.fp32_sum), and the sum's HBM passes. Acts only
    with zero 1, grad_reduce reduce-scatter and 2-byte gradients without megatron_fsdp, dp_replicate or Muon
    (check_plan rule grad_reduce_fp32_sum_rs: Megatron-LM turns it off under --accumulate-allreduce-grads-in-fp32).
    It asserts a SUM reduction, so where it acts the gradients are pre-scaled by 1/(dp x cp) and priced so, whatever
    grad_prescale says (cost.model_states.grad_prescaled; the exports never write average_in_collective). Source:
    NVIDIA/Megatron-LM d98e8a64dd megatron/core/distributed/reduce_scatter_with_fp32_accumulation.py,
    param_and_grad_buffer.py. docs/formulas.md#comm.fp32_sum, docs/formulas.md#mem.fp32_sum"""
    grad_accumulation: Literal["fused", "add", "cast-add", "copy"] = "fused"
    """How each micro-batch's weight gradient joins the accumulated one: fused (inside the weight-gradient GEMM:
    Megatron-LM's --gradient-accumulation-fusion since 2022-02, Transformer Engine), add (a separate in-place
    add: Megatron-LM's DDP hook main_grad.add_(param.grad) before that, autograd's accumulation into
    param.grad), cast-add (the gradient cast to the accumulated dtype first, then added: DeepSpeed's
    BF16_Optimizer update_hp_grads) or copy (Megatron-FSDP without gradient accumulation fusion: each
    micro-batch's whole gradient copied into the unsharded bucket its reduce-scatter sends).
    docs/formulas.md#step.grad_accumulation"""
    optimizer_fp32_passes: bool = False
    """Megatron-LM's mixed-precision Adam (Float16OptimizerWithFloat16Params, DistributedOptimizer, without
    --use-precision-aware-optimizer) runs its own passes over the rank's optimizer shard beside the update: each
    16-bit gradient cast to a new fp32 main gradient (`main_param.grad = model_param.grad.float()`; none where
    the gradients already are fp32), so the norm, clipping and Adam read 4-byte gradients; under fp16 the grad
    scaler's unscale with its inf/nan check; and the fp32 master read again by the copy to the model's weights.
    False: the update priced as one pass over the gradients in their own dtype that writes the weights itself
    (cost.compute.optimizer_bytes_per_param). Plan-file only; Megatron-LM runs them by default, so its export
    writes nothing for it, and torchtitan and DeepSpeed refuse it. Source: NVIDIA/Megatron-LM 6985e58938
    megatron/optimizer/optimizer.py, core_r0.8.0 megatron/core/optimizer/distrib_optimizer.py.
    docs/formulas.md#compute.optimizer_fp32_passes"""
    grad_nan_check: bool = False
    """Megatron-LM's NaN check of the gradients before each bucket's data-parallel reduction
    (--check-for-nan-in-loss-and-grad, on by default in Megatron-LM: DistributedDataParallelConfig
    check_for_nan_in_grad), the L2 norm of the bucket's gradient buffer on every rank: one read of the rank's
    gradients per reduction. False: priced without it; the Megatron-LM export keeps the check on and says so in
    its header (docs/formulas.md#step.grad_buffer)."""
    grad_prescale: bool = False
    """Megatron-LM's DDP multiplies each bucket's gradients by 1/(dp x cp) before reducing them with a sum
    (gradient_scaling_factor, its default), a read and a write of the rank's gradients per reduction. False:
    the average taken inside the collective (--ddp-average-in-collective; Megatron-Bridge and NeMo 2 recipes),
    except where grad_reduce_fp32_sum acts, whose reduction must be a sum (docs/formulas.md#step.grad_buffer)."""
    zero3_unit: Literal["layer", "tensor"] = "layer"
    """What ZeRO-3 gathers and reduces in one collective: a layer (PyTorch FSDP / FSDP2 units, the default: the
    recompute forward runs on the backward's gather) or each weight tensor on its own (DeepSpeed's stage 3 of
    2021: each module's parameters fetched before it runs and released after, so a recompute forward gathers
    again, three gathers per micro-batch under full recompute; each call copies one slice per rank on a host
    that never runs ahead of the GPU). docs/formulas.md#comm.zero3_unit"""
    zero3_copy_out: bool = False
    """ZeRO-3 as PyTorch FSDP2 (fully_shard) runs it: each all-gather lands in one flat buffer whose slices are
    then copied into the unsharded parameters on the compute stream (foreach_all_gather_copy_out,
    torch.split_with_sizes_copy), a read and a write of the gathered bytes before the layer can run
    (docs/formulas.md#step.zero3_copy_out). False: the collective writes the parameters in place (FSDP1's flat
    parameter, Megatron's buffers)."""
    pp_blocking_sends: bool = False
    """Every pipeline exchange waited for where it is issued, then the device synchronised, as Megatron-LM's
    p2p_communication._communicate did from 2021-02 until overlap_p2p_comm (2023-05): the interleaved schedule's
    sends and receives all sit on the critical path, one exchange per chunk pass, and each exchange's
    torch.cuda.synchronize() drains the GPU's queue (docs/formulas.md#step.pp_blocking). False: Megatron-Core's
    interleaved schedule with overlap_p2p_comm (the sends wait only before the pass that needs them)."""
    norm_kernel: NormKernel = "fused-one-pass"
    """Which kernel runs a fused norm's backward (with fused_kernels): fused-one-pass reads the saved x and dy once,
    writes dx and sums the weight gradient in the same pass (Transformer Engine's rmsnorm_bwd / layernorm_bwd,
    Apex's persistent FastLayerNorm that Megatron-LM takes from 2021-11 for the hidden sizes of its
    persist_ln_hidden_sizes): 4 + 6 bytes an element. two-pass: a second kernel (cuComputePartGradGammaBeta,
    GammaBetaBackwardCUDAKernel) reads dy and x again for the weight and bias gradients: 4 + 10 (Apex
    FusedLayerNorm, Megatron-LM's and Megatron-DeepSpeed's fused_kernels copy of it, PyTorch's native
    F.layer_norm). docs/formulas.md#compute.norm_bytes"""
    softmax_kernel: SoftmaxKernel = "fused"
    """Which kernels run the attention scale, causal mask and softmax without fused attention (flash_attention off):
    fused, Megatron's scaled_upper_triang_masked_softmax (one kernel that reads only the scores on and below the
    diagonal: 3 + 4 bytes a score forward and backward); eager, an in-place masked_fill_ and torch softmax in 16
    bits (8 + 10), as Megatron-LM's 2020 release ran without its opt-in fusion flags; eager-fp32, the PyTorch ops
    Megatron falls back to where its fused kernel's checks fail (FusedScaleMaskSoftmax.forward_torch_softmax with
    softmax_in_fp32, which apply_query_key_layer_scaling forces): the scores cast to fp32, scaled, masked,
    softmaxed and cast back (36 + 40); te, Transformer Engine's UnfusedDotProductAttention (what Megatron-LM's
    --attention-backend unfused runs): the causal mask built in every layer, then scaled_masked_softmax over whole
    rows (4 + 6) where its checks pass, else its fp32 torch ops (28 + 32). Attention dropout's bytes come on top
    of each. docs/formulas.md#compute.score_bytes, #compute.eager_softmax, #compute.te_softmax"""
    pp_unbatched_sends: bool = False
    """Every 1F1B pipeline transfer on its own, one after another on the stage's stream, as DeepSpeed's pipeline
    engine runs them (deepspeed/runtime/pipe/schedule.py TrainSchedule: each step a receive and a send, each a
    blocking p2p.send / p2p.recv): a micro-batch's four transfers in a row where Megatron's 1F1B pairs them into
    two batched exchanges (docs/formulas.md#step.pp_unbatched). Non-interleaved schedules only."""
    tp_comm_overlap: bool = False
    """Overlap TP all-gather/reduce-scatter with the GEMMs (Megatron --tp-comm-overlap; needs sp)."""
    tp_overlap_sms: Optional[SmsPerRole] = None
    """SMs Transformer Engine's userbuffers hold beside a TP GEMM under tp_comm_overlap, as a layer's TP
    overlap config sets them (its num_sm; 1 for a ring exchange on copy engines), averaged over the layer's two
    GEMMs of each role: (forward and output-gradient all-gathers: qkv_fprop / fc1_fprop / proj_dgrad /
    fc2_dgrad; forward reduce-scatters: proj_fprop / fc2_fprop; backward re-gathers: qkv_dgrad / fc1_dgrad;
    input-gradient reduce-scatters: qkv_wgrad / fc1_wgrad). None: Transformer Engine's initialize_ub defaults
    (1, 16, 16, 16: docs/formulas.md#step.ub_sms)."""
    tp_overlap_margin_sms: Optional[SmsPerRole] = None
    """SMs Transformer Engine's set_sm_margin takes from each overlapped TP GEMM for its whole length (it runs
    on N_SM minus these), per role as tp_overlap_sms orders them, averaged over the role's two GEMMs: a
    userbuffer config's num_sm where it sets set_sm_margin, 0 where it does not. None: what NVIDIA's published
    userbuffer configs set (the forward reduce-scatters' role only: (0, its tp_overlap_sms, 0, 0)). Transformer
    Engine 2.0 and later without a config also margins the bulk overlaps ((0, 16, 16, 16)); 1.x margins
    nothing: (0, 0, 0, 0) (docs/formulas.md#step.ub_margin)."""
    tp_backward_overlap: bool = True
    """The backward TP collectives of the input gradients run beside the weight-gradient GEMMs (Megatron-LM's
    asynchronous all-reduce, --async-tensor-model-parallel-allreduce, on by default since 2021-09; with sp,
    the re-gather and reduce-scatter, Korthikanti et al. 2022 §4.2.2). False: every TP collective is
    synchronous, as in Megatron-LM before 2021-09 and the Megatron-DeepSpeed forks of 2021-22
    (docs/formulas.md#step.tp)."""
    pp_scatter_gather: bool = False
    """Without sp, each TP rank sends only its 1/tp slice of a stage's output (and of its gradient) to the next
    pipeline stage, and the receiving stage all-gathers it over its TP group (Narayanan et al. 2021 §4.1:
    Megatron-LM from 2021-02 until the pipeline moved into Megatron-Core in 2023, on by default; DeepSpeed's
    pipeline engine, is_pipe_partitioned). Megatron-Core sends the whole replicated tensor from every TP rank
    (docs/formulas.md#comm.pp)."""
    fused_kernels: bool = True
    """Fused norm, rotary and grouped expert GEMM kernels (False: the unfused fallback of a GPU whose stack
    lacks them, and PyTorch eager as torchtitan runs without torch.compile: the norms, rotary and SwiGLU as their
    eager ops' memory traffic and launches, one GEMM per expert; set from the GPU profile,
    docs/formulas.md#operators, #compute.eager_ops)."""
    rope_fusion: bool = True
    """Rotary position embedding in one fused kernel on q and k (Transformer Engine's fused RoPE, NeMo AutoModel's
    rope_fusion). False: Megatron-Core's eager rotary (_apply_rotary_pos_emb_bshd: multiplies, a rotate-half
    copy, an add and a concatenation), which Megatron-Bridge runs for YaRN position embeddings (GPT-OSS:
    validate_rope_fusion_compatibility turns apply_rope_fusion off for any embedding but "rope") and
    Megatron-Core whenever the YaRN concentration is not 1 (docs/formulas.md#compute.memory_bound)."""
    bias_dropout_fusion: bool = True
    """A biased projection's output bias added in the bias-dropout-add kernel with the residual (Megatron-Core's
    jit-fused bias_dropout_add; a bias inside the GEMM elsewhere). False: Megatron-Core's unfused
    _bias_dropout_add_func adds the attention output projection's bias (and a dense MLP's fc2 bias) in its own
    pass before the residual add, and with hidden dropout the dropout in its own kernel, which Megatron-Bridge's
    GPT-OSS bridge runs (bias_dropout_fusion False; docs/formulas.md#compute.bias_add). Priced only for a model with
    those biases or hidden dropout. estimate and search settle it False for a model with expert biases (GPT-OSS:
    Megatron-Core's TEGroupedMLP refuses the fusion with biases; specs.defaults.default_bias_dropout_fusion) unless
    --bias-dropout-fusion is given."""
    bias_gelu_fusion: bool = True
    """A non-gated biased MLP's fc1 bias added inside the fused bias-GeLU kernel (Megatron's bias_gelu_impl: one
    pass over the fc1 output). False: the bias added in its own pass, then F.gelu (Megatron-Core's MLP without
    bias_activation_fusion, Megatron-LM's --no-bias-gelu-fusion; Megatron-LM 2020's default, where
    --bias-gelu-fusion was opt-in), priced as that pass (docs/formulas.md#compute.bias_gelu). Priced only for a
    dense MLP with mlp_bias and no gate; set in a plan file."""
    rope_complex: bool = False
    """The rotary is PyTorch complex arithmetic (torchtitan's Llama at 9dec370, apply_rotary_emb: the fp32 copy
    viewed as complex, times freqs_cis, viewed back and cast), which torch.compile's Inductor does not generate
    code for: it warns "Torchinductor does not support code generation for complex operators" and runs the eager
    kernels (pytorch/torchtitan#15), so with fused_kernels the rotary still costs its eager passes
    (docs/formulas.md#compute.eager_ops). Without fused_kernels the eager rotary is priced this way already."""
    glu_clamp_fusion: bool = False
    """With a model whose gated MLP clamps its halves (ModelSpec.swiglu_limit: GPT-OSS), the clamp runs inside
    the experts' fused activation kernel (True: Transformer Engine's ScaledClampedQGeGLU op in Megatron-Core's
    op-fuser path, NeMo AutoModel's compiled quick_geglu_deepep). False: as Megatron-Core's TEGroupedMLP runs
    it by default (core_v0.15 - core_v0.19, weighted_bias_quick_geglu_impl): two eager clamps and a
    concatenation before the compiled activation, priced as extra HBM passes and one more saved copy of the
    fc1 output (docs/formulas.md#moe.glu_clamp)."""
    jit_activation: bool = False
    """A gated MLP's activation (dense MLP, shared and routed experts) runs as Megatron-Core's jit_fuser kernels
    (bias_activation_fusion: bias_swiglu_impl, weighted_bias_swiglu_impl, weighted_bias_quick_geglu_impl, each
    torch.compile'd with torch >= 2.2), whose forward is priced at GpuSpec.jit_activation_hbm_efficiency where
    published. False: a fused activation at hbm_efficiency, as a Triton / TE / Inductor-fused kernel runs it
    (docs/formulas.md#compute.jit_activation). check_plan refuses it on a model whose MLP is not gated and
    without fused kernels (rules jit_activation, jit_activation_fused); export to torchtitan and DeepSpeed refuses
    it (export.EVERY_PLAN: neither runs that kernel)."""
    expert_bias_fusion: bool = False
    """With biased experts (ModelSpec.mlp_bias: GPT-OSS), the fc2 bias is scaled and added inside the grouped
    GEMM (Transformer Engine's GroupedLinear op in Megatron-Core's op-fuser path, use_transformer_engine_op_fuser,
    with TE >= 2.14). False: Megatron-Core's eager TEGroupedMLP._apply_bias (docs/formulas.md#moe.expert_bias)."""
    expert_fc1_bias_fusion: bool = True
    """With biased experts (ModelSpec.mlp_bias: GPT-OSS), the fc1 (gate / up) bias is added by the grouped GEMM
    itself (Transformer Engine's GroupedLinear, which Megatron-Core builds with skip_bias_add False). False: the
    grouped matmul takes no bias (torch._grouped_mm, grouped_gemm's gmm) and the bias is repeated per routed row
    and added after it, as NeMo AutoModel and torchtitan run GPT-OSS (docs/formulas.md#moe.expert_fc1_bias)."""
    sink_fusion: bool = True
    """With attention sinks (ModelSpec.attention_sinks: GPT-OSS), the sink is in the fused attention kernel's
    softmax (cuDNN's sink token through Transformer Engine >= 2.9). False: the kernel runs without it and the
    output is rescaled after it by sigmoid(lse - sink) in fp32 and cast back, as NeMo AutoModel's FlexAttention
    path does (docs/formulas.md#compute.sink_rescale)."""
    nvfp4_rht_cast_fusion: bool = True
    """With the NVFP4 recipe, Transformer Engine quantises each GEMM input (an activation or an output gradient)
    in one kernel after its amax pass: the rowwise 4-bit copy and, after the 16x16 random Hadamard transform, the
    columnwise copy the weight-gradient GEMM reads (TE 2.15 on, NVIDIA/TransformerEngine#2555). False: TE 2.9 -
    2.14, whose rowwise cast and RHT-columnwise cast are two kernels that each read the bf16 tensor (as
    Megatron-Bridge v0.2.2 - v0.4.2 pin TE). Priced in the casts' bytes (docs/formulas.md#precision)."""
    ub_wgrad_buffers: bool = True
    """Under Transformer Engine's userbuffers TP overlap (tp_comm_overlap), initialize_ub registers the two
    weight-gradient all-gather buffers (proj_wgrad, fc2_wgrad: the "external" method, Transformer Engine >= 2.7,
    NVIDIA/TransformerEngine 077e26c31, #1982) beside the other ten. False: Transformer Engine before 2.7 (v1.8
    ... v2.6 base.py initialize_ub: six all-gather and four reduce-scatter buffers), as NeMo 24.07's TE 1.8 ran
    (docs/formulas.md#mem.userbuffers)."""
    torchao_saves_hp_input: bool = True
    """With dtype fp8 on the PyTorch-native stack (tp_impl dtensor: torchao's Float8Linear as torchtitan converts
    nn.Linear), each linear saves its bf16 input for backward and quantises it again there for the
    weight-gradient GEMM (torchao >= v0.9.0, 12396c648: the per-tensor path too; the rowwise recipes at every
    version), unless float8 tensor parallelism already cast it (tensorwise, tp > 1). False: torchao < v0.9.0's
    tensorwise path, which cast the input before its autograd function and saved the fp8 copy, as torchtitan's
    December 2024 benchmarks ran it (torchao eab345c). docs/formulas.md#precision.torchao_saved_input"""
    fused_loss: bool = True
    """The loss runs fused on the logits (Megatron's --cross-entropy-loss-fusion, a compiled loss): one fp32
    copy of the logits per rank (its traffic: cost.elementwise.FUSED_LOSS_BYTES per logit). False: kernel by
    kernel on logits cast to fp32 (UNFUSED_LOSS_BYTES per logit; docs/formulas.md#compute.loss): PyTorch's
    eager cross_entropy (torchtitan up to its loss compilation), whose backward holds three fp32 copies at once
    (docs/formulas.md#mem.activations), or Megatron's unfused vocab-parallel cross entropy (its default), whose
    memory unfused_loss_impl tells apart."""
    unfused_loss_impl: UnfusedLossImpl = "eager"
    """Which loss runs with fused_loss off, for its memory at the last stage (cost.memory.unfused_logit_bytes;
    docs/formulas.md#mem.activations): eager, PyTorch's cross_entropy on fp32-cast logits (12 bytes a logit at
    its backward); vocab-parallel, Megatron's _VocabParallelCrossEntropy, which subtracts the max, exponentiates
    and divides in place on its fp32 copy and scales that copy in place backward (6: the 16-bit logits beside
    the fp32 copy forward, the fp32 softmax beside its 16-bit cast backward; Megatron-LM 57064fd6f2 2020-03 ..
    55817ec9b9 2022-09, and from 9634c0e4a3 2024-06); vocab-parallel-copy, the same Function with the max
    subtracted into a new fp32 tensor (10 forward; 55817ec9b9 .. 9634c0e4a3); eager-vocab-parallel, eager at tp 1
    and at tp > 1 a vocabulary-parallel loss that exponentiates into new fp32 tensors and divides into another
    backward (14 at its forward: the 16-bit logits, their fp32 copy, the copy less the max and its exp; DeepSpeed's
    _VocabParallelCrossEntropy, backend torch). The traffic is the same UNFUSED_LOSS_BYTES for all
    (docs/formulas.md#compute.loss)."""
    tp_whole_embedding: bool = False
    """At tp > 1, every TP rank holds the input word embedding whole (V·h, unpadded) instead of its vocabulary
    shard (Megatron's VocabParallelEmbedding, V·h / t and one all-reduce of its output forward): DeepSpeed's
    AutoTP training, which shards only the modules the model's Hugging Face tp_plan names (a Llama-style plan
    names none of embed_tokens, or marks it embedding_rowwise, a skipped spec). A tied embedding still shares the
    vocabulary-parallel head's shard (AutoTP's VocabParallelEmbedding), so this acts on an untied one only.
    Priced in the rank's parameters (weights, gradients, optimizer states, the DP gradient sync), no forward
    all-reduce (docs/formulas.md#params.rank)."""
    fused_loss_impl: FusedLossImpl = "native"
    """Which fused loss runs under fused_loss on Megatron-Core (cross_entropy_fusion_impl; Megatron-Core's
    default native, as Megatron-LM runs it: d98e8a6 arguments.py rejects te with the fusion, #5115): native
    (fused_vocab_parallel_cross_entropy: an all-reduce of the row max, then one of the target logit and the exp
    sum, 1 and 2 fp32 per token) or te (Transformer Engine's parallel_cross_entropy, which Megatron-Bridge's
    performance recipes set: one all-gather of each rank's max, exp sum and target logit, 3 fp32 per token).
    Both keep one fp32 logits-sized tensor for backward (native its softmax; te, from TE 2.18, its gradient;
    TE 2.2 - 2.17 wrote the gradient over the bf16 logits, half that: an over-count there). Priced in the
    head's TP collectives (docs/formulas.md#comm.tp_edge)."""
    tp_impl: TpImpl = "megatron"
    """How tensor parallelism with sequence parallelism keeps the column-parallel linears' input: megatron
    (Megatron-LM, Transformer Engine) saves the sequence shard and all-gathers it again in backward for the
    weight gradient, and overlaps the backward collectives with the weight-gradient GEMMs; dtensor (PyTorch
    DTensor as torchtitan applies it: PrepareModuleInput to Replicate before wq/wk/wv and w1/w3, and before
    the output layer) lets autograd save the gathered full-sequence input, so backward gathers nothing again
    and issues its collectives in line (docs/formulas.md#mem.activations, #comm.tp, #step.tp)."""
    cp_impl: CpImpl = "te"
    """Which ring runs context parallelism: te (Transformer Engine's AttnFuncWithCPAndKVP2P, as Megatron-LM and
    NeMo run it: K/V at the model's KV heads, one send per step beside that step's attention call, bf16 K/V
    gradients) or PyTorch's experimental context_parallel (torch.distributed.tensor.experimental, as torchtitan
    and NeMo AutoModel run it), which rings the K/V its SDPA call receives (cp_kv_repeated: at the query
    heads) and passes the K/V gradients on in fp32; torch-allgather gathers every rank's K/V once,
    beside only the first step's call (torchtitan's default rotate method), torch-alltoall passes them one step
    at a time. Both torch rings merge each step's output and accumulate the gradients in fp32 outside the
    kernel (docs/formulas.md#comm.cp, #step.cp, #compute.cp_merge)."""
    cp_comm_type: CpCommType = "p2p"
    """Which Transformer Engine context-parallel attention runs under cp_impl te (Megatron-LM --cp-comm-type,
    Megatron-Bridge model.cp_comm_type): p2p (the K/V ring, its sends beside the attention calls), a2a (Ulysses,
    arXiv 2309.14509: all-to-alls of Q, K, V before the attention and of its output after, each rank running
    every token of heads/cp heads; needs the heads and KV heads per TP rank divisible by cp; the only one that
    runs a learnable softmax offset, GPT-OSS's sinks) or all_gather (Llama 3, arXiv 2407.21783 sec. 3.3.2:
    every rank gathers the whole K/V, and reduce-scatters their gradients). a2a and all_gather run sliding
    windows, p2p does not; neither overlaps its collectives with the attention (docs/formulas.md#comm.cp_a2a,
    #comm.cp_allgather, #step.cp)."""
    cp_a2a_size: int = Field(default=1, ge=1, le=65_536)
    """The inner (a2a) level of cp_comm_type a2a+p2p: Q, K, V and the output are all-to-all'ed inside groups of
    this many consecutive CP ranks (heads scattered, sequence gathered), and the p2p K/V ring runs across the
    cp / cp_a2a_size groups, one ring per inner rank (Megatron-LM --hierarchical-context-parallel-sizes
    cp_a2a_size cp/cp_a2a_size; Megatron-Bridge model.hierarchical_context_parallel_sizes). 1: no inner level
    (every other cp_comm_type). check_plan needs 1 < cp_a2a_size < cp dividing cp and the TP rank's heads
    (docs/formulas.md#comm.cp_hierarchical)."""
    cp_kv_repeated: bool = False
    """PyTorch's ring (cp_impl torch-*) passes K/V already repeated to the query heads: the model expands the KV
    heads before its SDPA call (torchtitan's Llama at 9dec370, repeat_kv; its v0.2.2 passes enable_gqa instead,
    and the ring then moves the KV heads). docs/formulas.md#comm.cp"""
    cp_comm_overlap: bool = True
    """PyTorch's ring (cp_impl torch-*) runs its K/V gathers and K/V-gradient sends beside the attention calls,
    as it does eagerly (functional collectives wait at first use). False: each transfer is waited for where it
    is issued, so every second of it is exposed: the ring traced by torch.compile, as torchtitan compiles each
    block (fullgraph) with torch of late 2024, where functional collectives wait at once under tracing and
    Inductor keeps that order in training graphs unless its compute-communication reordering is turned on
    (off by default). docs/formulas.md#step.cp_compiled"""
    pp_schedule: ScheduleName = "1f1b"
    """Pipeline schedule: 1F1B (interleaved when vpp > 1); zero-bubble (ZB-H1, Qi et al. 2024: the
    weight-gradient pass fills the bubble at 1F1B's memory); DualPipe (DeepSeek-V3: two pipelines in opposite
    directions, twice the parameters per rank, and the EP all-to-alls hidden behind the paired micro-batch)."""
    moe_capacity_factor: Optional[float] = Field(default=None, gt=0, le=64)
    """MoE expert capacity factor (Megatron --moe-expert-capacity-factor with
    --moe-pad-expert-input-to-capacity): tokens over capacity are dropped and every expert's input is padded
    to capacity, so expert GEMMs, their activations and the dispatch run at factor x the average tokens;
    None: dropless (every routed token runs, no padding). With moe_dispatcher deepep it needs moe_flex_backend
    hybridep: Megatron's deepep backend does not pad (check_plan rule deepep_capacity)."""
    ep_comm_overlap: bool = False
    """Overlap the expert-parallel all-to-alls with another micro-batch's compute (Megatron
    --overlap-moe-expert-parallel-comm, DeepEP / DualPipe-style); off: the all-to-alls are exposed."""
    cuda_max_connections: Optional[int] = Field(default=None, ge=1, le=32)
    """CUDA_DEVICE_MAX_CONNECTIONS: the hardware work queues a GPU's streams are multiplexed onto (CUDA C++
    Programming Guide, CUDA Environment Variables: 1-32, default 8). At 1 every stream's kernels run in launch
    order on one queue, so the EP overlap's communication kernels wait behind the compute launched before them and
    the overlap hides part of what it hides with more queues (docs/formulas.md#moe.overlap_queues). None: as the
    launcher leaves it, priced as more than one queue (the exports write 1 only where Megatron-LM asks for it),
    except beside Transformer Engine's userbuffer TP overlap before Blackwell, priced and exported as one queue."""
    delay_wgrad: bool = False
    """Under the EP overlap (ep_comm_overlap), defer each MoE layer's weight-gradient GEMMs (the routed experts',
    and the attention node's: attention projections and shared experts) out of their node's backward, so the
    dispatch backward starts after the experts' input gradient and the next layer's combine backward after the
    attention's, each running beside the deferred GEMMs (Megatron-Core --delay-wgrad-compute,
    TransformerConfig.delay_wgrad_compute; Megatron-Bridge comm_overlap.delay_wgrad_compute, which its
    performance presets' moe_a2a_overlap turns on). No extra FLOPs and no memory priced: the deferred GEMMs run
    before the other micro-batch's next node allocates. Needs ep_comm_overlap (Megatron-Core asserts it)
    (docs/formulas.md#moe.delay_wgrad)."""
    moe_dispatcher: MoeDispatcher = "alltoall"
    """How MoE tokens travel to their experts' EP ranks: alltoall (Megatron's alltoall token dispatcher)
    permutes each token into its k expert copies and sends every copy; deepep (DeepEP: Megatron's flex
    dispatcher with the deepep backend, NeMo AutoModel's deepep dispatcher) sends a token once to each EP
    rank that holds at least one of its experts, and the combine returns one row per rank, the rank's expert
    outputs already summed (docs/formulas.md#comm.ep)."""
    moe_dispatch_sms: Optional[int] = Field(default=None, ge=1, le=1024)
    """SMs the deepep dispatcher's dispatch and combine kernels run on (Megatron's moe_flex_dispatcher_num_sms,
    formerly moe_deepep_num_sms / moe_hybridep_num_sms); its kernels move at most this many SMs' worth of bytes
    a second (docs/formulas.md#comm.ep_sms). None: Megatron-Core's default, 20 (DeepEP). Unused by alltoall."""
    moe_flex_backend: MoeFlexBackend = "deepep"
    """Which kernels run the deepep dispatcher (Megatron's moe_flex_dispatcher_backend): deepep (DeepEP's normal
    kernels, bound by their SMs: docs/formulas.md#comm.ep_sms) or hybridep (NVIDIA's Hybrid-EP in DeepEP: TMA
    kernels whose NVLink time grows with the ranks of the domain, little with their SMs:
    docs/formulas.md#comm.hybridep). Unused by alltoall: the JSON writes it null there (report.common.
    flex_backend_shown), and null reads back as the default. A full-iteration CUDA graph needs hybridep
    (check_plan rule cuda_graphs_flex_backend: DeepEP's normal dispatch waits on the host)."""
    nvlink_domain_ranks: int = Field(default=0, ge=0, exclude=True)
    """Ranks of one NVLink domain as the job fills it (the cluster's domain_gpus / gpus_per_node nodes times the
    GPUs it uses a node), which the compute cost functions read without the cluster: estimate and search set it
    from the cluster (topology.placement.on_cluster) before pricing, whatever a plan gives. HybridEP's metadata
    scan and probs' permute read the EP ranks of one domain from it (cost.comm.hybridep_domain_ranks). 0: not
    known, the EP group taken as one domain (an upper bound). Derived from the cluster, so never written out
    (excluded from model_dump: the JSON output and plan files hold the plan as given)."""
    ep_dispatch_fp8: bool = False
    """Send the EP dispatch's tokens in FP8 with one fp32 scale per 128 elements (DeepSeek-V3 report §3.3.2:
    the activations quantised before the dispatch feed the FP8 up-projection; DeepEP's dispatch takes an
    (fp8 tensor, scales) tuple), forward and backward dispatches alike; the combines stay bf16. The fc1 input's
    fp8 cast (and fc2's output gradient's) moves before the dispatch: once per token, not per permuted row
    (docs/formulas.md#moe.expert_casts). Needs dtype fp8 and moe_dispatcher deepep with
    moe_flex_backend deepep (docs/formulas.md#comm.ep_fp8). Off: every all-to-all in bf16."""
    moe_routing: MoeRouting = "random"
    """How the router spreads each token's k experts, which sets how many EP ranks a deepep dispatch reaches:
    random (a trained, balanced router, or Megatron's --moe-router-force-load-balancing: k distinct experts
    drawn uniformly) or contiguous (k consecutive experts from a multiple of k, NeMo AutoModel's
    FakeBalancedGate, the benchmark gate of its performance tables). The alltoall dispatcher sends k copies
    either way."""
    moe_router_fusion: bool = False
    """Run the MoE router in Transformer Engine's fused kernels (Megatron-Core --moe-router-fusion,
    TransformerConfig.moe_router_fusion; Megatron-Bridge model.moe_router_fusion): one kernel each for the
    score function with top-k, the auxiliary loss's scores and the auxiliary loss, forward and backward. Off
    (Megatron-Core's default, and most Megatron-Bridge recipes'): the same steps as eager PyTorch ops, two
    torch.topk calls a layer (one without an auxiliary loss) and more launches (docs/formulas.md#moe.router_fusion)."""
    moe_router_padding: bool = False
    """Pad each expert's token count to the fp8 / fp4 GEMM alignment in the routing map (Megatron-Core
    --moe-router-padding-for-quantization, alias --moe-router-padding-for-fp8; TransformerConfig.
    moe_router_padding_for_quantization; Megatron-Bridge model.moe_router_padding_for_quantization): the alltoall
    dispatcher pads the rank's routing map before the all-to-all, DeepEP the received one, so the experts compute
    (and alltoall sends) extra rows and TEGroupedMLP skips its own padding copies. Needs an MoE model in fp8 / fp4
    and not the allgather dispatcher (check_plan rule moe_router_padding_quant); HybridEP pads in its dispatch and
    never reads it (no effect). Off: Megatron-Core's default (docs/formulas.md#moe.router_padding)."""
    cuda_graphs: CudaGraphs = "none"
    """Which CUDA graphs replay the training step's kernels (Megatron-Core's cuda_graph_impl; estimate / search
    --train-cuda-graphs): none, every kernel launched by the host one by one; layers, per-layer graphs of the attention and the MoE router and
    preprocessing (--cuda-graph-impl transformer_engine --cuda-graph-modules attn moe_router moe_preprocess):
    each captured part is one launch, but a dropless MoE layer still copies its tokens per expert to the host
    and waits for them every forward; full-iteration, one graph of the whole forward-backward
    (--cuda-graph-impl full_iteration) with the MoE layers' static buffers (Megatron-Bridge's presets set
    --moe-expert-rank-capacity-factor with it): no launches and no host waits inside the step
    (docs/formulas.md#step.host_sync)."""
    expert_gemm: ExpertGemm = "grouped"
    """How the routed experts' matmuls run with fused kernels: grouped, one kernel over all the rank's local
    experts (DeepGEMM's m-grouped GEMM, torch._grouped_mm, Transformer Engine's fused grouped MLP that
    Megatron-Bridge's cutedsl_fused_grouped_mlp presets select, and the Megatron exports write); per-expert,
    Transformer Engine's GroupedLinear (Megatron-Core's TEGroupedMLP), one cuBLASLt GEMM per local expert over
    its streams, each costing
    EXPERT_GEMM_S more than its share of one grouped kernel (docs/formulas.md#compute.expert_gemms); grouped at
    etp > 1 with tp_impl megatron is priced per-expert (the fused grouped MLP needs expert TP 1). Without
    fused kernels every expert's matmuls are separate eager launches either way."""
    fp8_attention: bool = False
    """Run the fused attention's matmuls in FP8 (Transformer Engine's FP8 dot-product attention, cuDNN's FP8
    fused attention: Megatron --fp8-dot-product-attention, Megatron-Bridge mixed_precision.fp8_dot_product_attention)
    under the fp8 recipes. Its QK^T and PV run at twice the bf16 tensor rate, its softmax does not speed up
    (docs/formulas.md#compute.fp8_attention). Off: the attention in bf16."""
    fp8_output_proj: bool = False
    """Run the output layer (LM head) as a Transformer Engine Linear under the MXFP8 recipe: its forward,
    input-gradient and weight-gradient GEMMs in MXFP8 as the decoder's linears, where Megatron-Core otherwise
    keeps it a bf16 ColumnParallelLinear (Megatron-LM --fp8-output-proj, TransformerConfig.fp8_output_proj;
    Megatron-Bridge model.fp8_output_proj). Needs --precision mxfp8 and an output layer with its own weight on its
    stage (docs/formulas.md#compute.fp8_output_proj). Off: the head in bf16."""
    swiglu_fp8_input: bool = False
    """Keep the SwiGLU activation's input (the first MLP linear's 2f-wide output) for backward in fp8, cast back
    in the backward pass: Megatron-Core TransformerConfig.activation_func_fp8_input_store (one float8_e4m3fn
    byte, no scale; SwiGLU only; Megatron-LM has no flag for it, Megatron-Bridge sets it), DeepSeek-V3's MoE
    SwiGLU inputs in its 1x128-tile FP8 (report §3.3.3). Off: bf16, 2 bytes (docs/formulas.md#mem.swiglu_fp8_input)."""
    fp32_param_shards: bool = False
    """Under ZeRO-3 with mixed precision, each rank keeps only the fp32 shard of its parameters, which the
    optimizer updates in place, and all-gathers it in the compute dtype (PyTorch FSDP / FSDP2 with a mixed
    precision policy: torchtitan, NeMo AutoModel): 4 + 8 bytes of weights and moments per parameter shard.
    Off: a compute-dtype shard beside the optimizer's fp32 master (DeepSpeed ZeRO-3, Megatron-FSDP): 2 + 12
    (docs/formulas.md#mem.model_states)."""
    megatron_fsdp: bool = False
    """ZeRO-2 / ZeRO-3 without a pipeline as Megatron-FSDP runs them (Megatron-LM --use-megatron-fsdp, Megatron-Bridge
    ddp.use_megatron_fsdp: optim_grads / optim_grads_params): the launched reduce-scatters' unsharded gradient
    buckets kept until the queue passes max(1e9, two layers) elements, and under ZeRO-3 the weights it holds
    gathered, the layer in use, max(5e8, a layer) elements prefetched and the embedding and output layer whole.
    Off: DeepSpeed's / FSDP's (docs/formulas.md#mem.megatron_fsdp)."""

    @field_validator("moe_flex_backend", mode="before")
    @classmethod
    def _null_flex_backend_is_the_default(cls, v: Any) -> Any:
        """JSON null (what the output writes for an alltoall plan, whose backend means nothing) as the default,
        so that ParallelPlan(**plan) rebuilds a plan from its JSON."""
        return cls.model_fields["moe_flex_backend"].default if v is None else v

    @model_validator(mode="after")
    def _recipe_matches_dtype(self) -> "ParallelPlan":
        if (self.dtype == "fp4") != (self.recipe == "nvfp4"):
            raise ValueError(f"dtype {self.dtype} with recipe {self.recipe}: NVFP4 is the fp4 recipe, the others "
                             "are fp8 recipes; use --precision nvfp4, or one of fp8-tensorwise, fp8-rowwise, "
                             "fp8-blockwise, mxfp8")
        if self.recipe != "tensorwise" and not self.low_precision:
            raise ValueError(f"recipe {self.recipe} needs dtype fp8 or fp4 (got {self.dtype}); use --precision")
        return self

    @model_validator(mode="after")
    def _bf16_layers_need_low_precision(self) -> "ParallelPlan":
        pinned = [f"{k} {v}" for k, v in (("bf16_layers_start", self.bf16_layers_start),
                                          ("bf16_layers_end", self.bf16_layers_end),
                                          ("bf16_modules", ",".join(self.bf16_modules))) if v]
        if pinned and not self.low_precision:
            raise ValueError(f"{' and '.join(pinned)} with dtype {self.dtype}: layers kept in bf16 are an exception "
                             "to an fp8 / fp4 recipe; give --precision (e.g. nvfp4, mxfp8) or drop the bf16 layers")
        return self

    @model_validator(mode="after")
    def _optimizer_states_below_compute(self) -> "ParallelPlan":
        low = [f"{k} {v}" for k, v in (("optimizer_master_dtype", self.optimizer_master_dtype),
                                       ("optimizer_moment_dtype", self.optimizer_moment_dtype)) if v != "fp32"]
        if self.dtype == "fp32" and low:
            raise ValueError(f"{' and '.join(low)} with dtype fp32: low-precision optimizer states are a mixed-"
                             "precision option (the fp32 weights are the master copy); train in bf16 / fp16 / fp8, "
                             "or keep the optimizer states in fp32")
        return self

    @model_validator(mode="after")
    def _grad_reduce_with_zero1(self) -> "ParallelPlan":
        if self.grad_reduce == "all-reduce" and self.zero >= 2:
            raise ValueError(f"grad_reduce all-reduce with zero {self.zero}: ZeRO-2/3 keep only their gradient "
                             "shard, so they reduce-scatter; use zero 1 (or 0, which all-reduces anyway) or "
                             "grad_reduce reduce-scatter")
        return self

    @model_validator(mode="after")
    def _optimizer_fp32_passes_need_fp32_states(self) -> "ParallelPlan":
        # Megatron-LM's Float16Optimizer / DistributedOptimizer keep an fp32 master and fp32 moments; its
        # precision-aware optimizer (16-bit states or remainders) and Megatron-FSDP update in their own kernels
        if not self.optimizer_fp32_passes:
            return self
        bad = [f"{k} {v}" for k, v in (("dtype", self.dtype), ("optimizer_master_dtype", self.optimizer_master_dtype),
                                       ("optimizer_moment_dtype", self.optimizer_moment_dtype))
               if (v == "fp32") == (k == "dtype")]
        bad += ["param_remainders"] * self.param_remainders + ["megatron_fsdp"] * self.megatron_fsdp
        if bad:
            raise ValueError(f"optimizer_fp32_passes with {', '.join(bad)}: Megatron-LM's mixed-precision "
                             "optimizer runs them with 16-bit weights, an fp32 master and fp32 moments, without "
                             "Megatron-FSDP; set optimizer_fp32_passes false or change those settings")
        return self

    @model_validator(mode="after")
    def _nan_check_outside_full_graphs(self) -> "ParallelPlan":
        # Megatron-LM arguments.py (d98e8a6): --cuda-graph-impl full_iteration asserts the NaN check is off
        if self.grad_nan_check and self.cuda_graphs == "full-iteration":
            raise ValueError("grad_nan_check with cuda_graphs full-iteration: Megatron-LM requires "
                             "--no-check-for-nan-in-loss-and-grad with a full-iteration graph; set grad_nan_check "
                             "false or cuda_graphs none or layers")
        return self

    @model_validator(mode="after")
    def _remainders_need_bf16_weights(self) -> "ParallelPlan":
        if not self.param_remainders:
            return self
        # Source: Megatron-Core optimizer_config.py (use_precision_aware_optimizer_no_fp8_or_ds_fp8) and
        # distrib_optimizer.py (int16 master with bf16); Transformer Engine fused_adam.py (store_param_remainders)
        why = ("an fp32 master (optimizer_master_dtype is " + self.optimizer_master_dtype + ")"
               if self.optimizer_master_dtype != "fp32" else
               f"bf16 weights (dtype is {self.dtype})" if self.dtype not in ("bf16", "fp8", "fp4") else
               f"a recipe whose master Transformer Engine keeps (recipe {self.recipe}: Megatron-Core keeps its "
               "own fp32 master for blockwise and MXFP8)" if self.recipe in ("blockwise", "mxfp8", "rowwise") else
               None)
        if why:
            raise ValueError(f"param_remainders needs {why}: the 16-bit remainder rebuilds an fp32 master from "
                             "bf16 weights only (Megatron-Core store_param_remainders); drop --param-remainders")
        return self

    @model_validator(mode="after")
    def _tokens_per_step(self) -> "ParallelPlan":
        tokens = self.global_batch * self.seq_len
        if tokens > MAX_TOKENS_PER_STEP:
            raise ValueError(f"global_batch ({self.global_batch:,}) x seq_len ({self.seq_len:,}) = {tokens:,} tokens "
                             f"per step is beyond any training run (at most {MAX_TOKENS_PER_STEP:,}); lower "
                             f"--global-batch to at most {MAX_TOKENS_PER_STEP // self.seq_len:,}")
        return self

    @model_validator(mode="after")
    def _modules_once(self) -> "ParallelPlan":
        twice = sorted({x for x in self.recompute_modules if self.recompute_modules.count(x) > 1})
        if twice:
            raise ValueError(f"recompute_modules lists {', '.join(twice)} more than once; name each module once")
        twice_off = sorted({str(x) for x in self.offload_modules if self.offload_modules.count(x) > 1})
        if twice_off:
            raise ValueError(f"offload_modules lists {', '.join(twice_off)} more than once; name each module once")
        return self

    @model_validator(mode="after")
    def _one_way_to_split(self) -> "ParallelPlan":
        if self.pp_layers is not None and (self.pp_first or self.pp_last):
            raise ValueError("give either pp_layers (every stage) or pp_first / pp_last, not both")
        if self.pp_layout is not None and (self.pp_layers is not None or self.pp_first or self.pp_last):
            raise ValueError("give either pp_layout (every virtual chunk) or pp_layers / pp_first / pp_last, not "
                             "both (Megatron-LM refuses --pipeline-model-parallel-layout with the other split flags)")
        if self.pp_layers is not None and len(self.pp_layers) != self.pp:
            raise ValueError(f"pp_layers lists {len(self.pp_layers)} stages but pp is {self.pp}; give one layer "
                             f"count per pipeline stage")
        return self

    @field_validator("etp", mode="before")
    @classmethod
    def _etp_unset(cls, v: Any) -> Any:
        return ETP_SAME_AS_TP if v is None else v

    @property
    def etp_resolved(self) -> int:
        return int(resolve_etp(self.etp, self.tp))

    @property
    def degrees(self) -> Degrees:
        return Degrees(self.tp, self.pp, self.dp, self.cp, self.ep, self.etp_resolved, self.dp_replicate,
                       cp_a2a_group(self))

    def describe(self, batch: bool = False) -> str:
        """The plan in one line, every degree and switch named (search's pruning notes, the estimate view,
        export headers); `batch` adds the global batch, the sequence length and the dtype."""
        text = (f"tp {self.tp} pp {self.pp} dp {self.dp} cp {self.cp} ep {self.ep} vpp {self.vpp} "
                f"sp {'on' if self.sp else 'off'} zero {self.zero} "
                + (f"dp-replicate {self.dp_replicate} " if self.dp_replicate > 1 else "")
                + ("(optimizer sharded across replicas) " if self.dp_replicate > 1 and self.dp_outer_optimizer
                   else "")
                + f"recompute {self.recompute} micro-batch {self.micro_batch}"
                + (" optimizer muon" if self.optimizer == "muon" else ""))
        return f"{text} global batch {self.global_batch} seq {self.seq_len} {self.dtype}" if batch else text

    @property
    def recompute_code(self) -> int:
        """Index of `recompute` in RECOMPUTE (the plan arrays store this code)."""
        return RECOMPUTE.index(self.recompute)

    @property
    def weight_bytes(self) -> float:
        """Bytes per weight in the model copy: bf16 for bf16/fp16 training and for fp8 / fp4 training unless
        fp8_params (Transformer Engine otherwise keeps low-precision copies only as a cache), fp32 for fp32
        training; with fp8_params 1 byte (fp8) or NVFP4's 4 bits and an E4M3 scale per 16 (fp4).
        Source: Megatron-LM --fp8-param-gather / --fp4-param-gather; NVIDIA NVFP4 format (16-element blocks)."""
        if self.dtype == "fp32":
            return 4.0
        if self.fp8_params and self.dtype in ("fp8", "fp4"):
            return 1.0 if self.dtype == "fp8" else NVFP4_BYTES
        return 2.0

    @property
    def grad_bytes(self) -> float:
        return 4.0 if self.dtype == "fp32" or self.grad_dtype == "fp32" else 2.0

    @property
    def reduce_bytes(self) -> float:
        """Bytes per gradient element the data-parallel reduction sends where grad_reduce_dtype acts
        (cost.model_states.bf16_reduction; elsewhere grad_bytes): 2 under bf16 (a bf16 copy of the fp32
        gradients), else grad_bytes. Source: deepspeedai/DeepSpeed deepspeed/runtime/engine.py at
        56c522386 (allreduce_bucket). Derived: docs/formulas.md#comm.reduce_dtype"""
        return 2.0 if self.grad_reduce_dtype == "bf16" else self.grad_bytes

    @property
    def master_bytes(self) -> float:
        """Bytes per parameter of Adam's master weights (optimizer_master_dtype); 0 in pure fp32 training, whose
        weights are the master copy; 2 with param_remainders (an int16 remainder beside the bf16 weights).
        Source: Megatron-LM megatron/core/optimizer/optimizer_config.py (main_params_dtype,
        store_param_remainders); Apex DistributedFusedAdam (store_params)."""
        if self.dtype == "fp32":
            return 0.0
        if self.param_remainders:
            # Source: Megatron-Core optimizer_config.py store_param_remainders (16 low bits of the fp32 master)
            return OPTIMIZER_STATE_BYTES["bf16"]
        return OPTIMIZER_STATE_BYTES[self.optimizer_master_dtype]

    @property
    def optimizer_bytes(self) -> float:
        """Adam: master weights + first and second moments (12 B with fp32 states; 8 B in pure fp32 training,
        which needs no master copy). Source: Rajbhandari et al. 2020 (ZeRO) §3.1 (K = 12); DeepSeek-V3 report
        §3.3.3 (bf16 moments); Megatron-LM optimizer_config.py (exp_avg_dtype, exp_avg_sq_dtype).
        Derived: docs/formulas.md#mem.model_states"""
        return self.master_bytes + 2 * OPTIMIZER_STATE_BYTES[self.optimizer_moment_dtype]


def trained_model(m: ModelSpec, plan: Any) -> ModelSpec:
    """The model a training plan builds: `m` with plan.mtp_layers MTP modules where the plan trains fewer than
    the model's num_nextn_predict_layers, else `m` itself (more than the model has is check_plan's rule
    mtp_layers, which reads `m`); idempotent, and the same for every plan of a search (a workload field)."""
    n = getattr(plan, "mtp_layers", None)
    if n is None or int(n) >= m.num_nextn_predict_layers:
        return m
    return m.model_copy(update={"num_nextn_predict_layers": int(n),  # none left to repeat at 0
                                "mtp_repeated_layer": m.mtp_repeated_layer and int(n) > 0})
