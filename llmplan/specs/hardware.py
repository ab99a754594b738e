"""GpuSpec and SystemSpec: what one accelerator and one node (or NVLink domain) can do.

Keys that are not in base units name their unit (hbm_gib, hbm_gb_per_s, intra_node_gb_per_s, nic_gbit_per_s);
the properties convert them once, here, to bytes and bytes per second for the cost functions.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from llmplan.errors import bounded_list
from llmplan.specs.base import Name
from llmplan.specs.model import SPEC_CONFIG, Spec
from llmplan.specs.plan_choices import AttentionRelease
from llmplan.units import GB, GIB, TERA

Dtype = Literal["fp32", "tf32", "bf16", "fp16", "fp8", "mxfp8", "fp4", "mxfp4"]
KERNELS: dict[str, str] = {
    "flash_attention": "fused attention that never stores the scores (FlashAttention 2/3, cuDNN, CK on ROCm)",
    "mla": "multi-head latent attention with qk and v head dims apart (FlashMLA, FA3 on Hopper+, AITER on MI300)",
    "grouped_gemm": "one grouped GEMM for all local experts of a MoE layer",
    "fp8_gemm": "fp8 tensor-core GEMMs with per-tensor / block scaling",
    "fp4_gemm": "fp4 / nvfp4 tensor-core GEMMs",
    "fused_norm": "fused RMSNorm / LayerNorm",
    "fused_rope": "fused rotary position embedding",
}
"""Fused kernels a GPU's software stack may ship (docs/formulas.md#operators for the sources)."""
Kernel = Literal["flash_attention", "mla", "grouped_gemm", "fp8_gemm", "fp4_gemm", "fused_norm", "fused_rope"]
Fp8AttentionFormat = Literal["fp8", "mxfp8"]
"""FP8 fused attention's scaling (GpuSpec.fp8_attention_points): per-tensor scales, or MXFP8's block scales."""
Fp8AttentionPoint = tuple[Annotated[float, Field(gt=0, le=1024)], Annotated[float, Field(gt=0, le=4)],
                          Annotated[float, Field(gt=0, le=4)]]
"""(mean head dimension, forward speed ratio, backward speed ratio): one published FP8-over-bf16 attention point."""


MIN_POWER_LIMIT_FRACTION = 0.25
"""Lowest board power limit, as a fraction of the GPU's TDP, that llmplan models: NVIDIA's allowable minimum is
200 W on the 700 W H100 SXM (29%) and 200 W on B200 (DGX H100/H200 and DGX B200 User Guides, "Managing Power
Capping": PowerLimitWatts AllowableMin), so below a quarter no datacenter GPU accepts the cap (1 W is a typo)
and the cube-root clock law of at_power_limit has no data there."""


REQUIRED_KEYS: dict[str, str] = {
    "sustained_clock_fraction": "the tensor-core clock sustained under training load as a fraction of the boost "
                                "clock the peak assumes; typical 0.825 (H100 SXM) to 0.85 (A100), fitted on "
                                "published training runs (docs/validation.md#constants)",
    "sm_count": "streaming multiprocessors (NVIDIA) or compute units (AMD) per GPU, from the vendor's "
                "architecture whitepaper (H100 SXM 132, A100 108, MI300X 304)",
}
"""GPU profile keys with no default, since a default would stand for one GPU's fitted or datasheet value, and
what each means with a sourced typical value: the error for a profile that lacks one (registry.validation_message)."""


def power_clock_ratio(watts: float, from_w: float) -> float:
    """The sustained clock at a board power limit of `watts` over the clock at `from_w`: (watts / from_w)^(1/3)
    (dynamic power ~ C·V²·f with the voltage roughly proportional to the clock over the DVFS range).
    Derived: docs/formulas.md#step.power"""
    return float((watts / from_w) ** (1 / 3))


class GpuSpec(Spec):
    """One accelerator: peak dense throughput per dtype, HBM capacity and bandwidth."""

    model_config = SPEC_CONFIG

    name: Name
    """Name users pass (e.g. h100-sxm)."""
    source: str = ""
    """Where the numbers come from."""
    vendor: Literal["nvidia", "amd"] = "nvidia"
    """Vendor, for the collective library (NCCL / RCCL)."""
    tflops: dict[Dtype, float] = Field(min_length=1)
    """Peak dense (no 2:4 sparsity) TFLOP/s per dtype; a dtype that is absent is not supported."""
    hbm_gib: float = Field(gt=0, le=65_536)
    """Memory per GPU in GiB that CUDA can allocate (deviceQuery's total global memory, not nvidia-smi's, which
    adds driver-reserved memory); the runtime's own buffers are charged against it. docs/formulas.md#mem.capacity"""
    hbm_gb_per_s: float = Field(gt=0, le=1e6)
    """Memory bandwidth in GB/s (decimal)."""
    max_gemm_tflops_bf16: float | None = Field(default=None, gt=0, le=1e6)
    """Highest measured bf16 matmul TFLOP/s (an MFU ceiling), if published."""
    max_gemm_tflops_fp8: float | None = Field(default=None, gt=0, le=1e6)
    """Highest measured fp8 matmul TFLOP/s, if published."""
    fp4_gemm_speedup: float | None = Field(default=None, gt=0, le=8)
    """Measured NVFP4 over per-tensor fp8 GEMM kernel throughput on the same shapes and GPU (inputs already
    quantised), if published: the fp4 large-GEMM fraction is then the fp8 one times this over the peak ratio
    (tflops fp4 / fp8), so fp4 GEMMs run this much faster than fp8 ones, not the datasheet's ratio. None: fp4
    assumed to reach the fp8 fraction. B300: 1.81 where its peaks say 3.1 (docs/formulas.md#compute.gemm)."""
    fused_dglu_ratio: float = Field(default=1.0, ge=1, le=4)
    """Time of the fused MXFP8 grouped MLP's backward dGLU kernel (fc2's input gradient with the dSwiGLU epilogue:
    reads the saved 2N-wide pre-activation, writes the 2N-wide gradient quantised rowwise and columnwise) over a
    plain-activation kernel's of the same GEMM shape and GPU, where published: fc2's dgrad on the fused GLU
    path (cost.gemm.fused_dglu_factor) takes this much longer than its GEMM is priced. 1: no gap known.
    GB200 1.135, GB300 1.106 (cudnn-frontend's cutedsl_fusion_kernels benchmark; docs/formulas.md#compute.gemm)."""
    best_published_mfu: float | None = Field(default=None, gt=0, le=1)
    """Highest dense bf16 MFU a published training run reached on this GPU, its model FLOPs counted as llmplan
    counts them (attention not halved for the causal mask; a source that halves it is restated): a prediction
    above it is flagged as a likely modelling artefact until measured (source in the profile)."""
    best_published_mfu_fp8: float | None = Field(default=None, gt=0, le=4)
    """Highest MFU a published fp8 / MXFP8 training run reached on this GPU, against the bf16 peak as llmplan
    reports MFU (the run's model FLOP/s, counted as best_published_mfu, over the bf16 peak): the ceiling check
    of fp8 plans."""
    best_published_mfu_fp4: float | None = Field(default=None, gt=0, le=8)
    """As best_published_mfu_fp8, for NVFP4 runs."""
    attention_efficiency: float = Field(default=0.7, gt=0, le=2)
    """Asymptotic rate of the GPU's native fused attention kernel, forward and backward, as a fraction of the
    sustained peak on the attention-score FLOPs llmplan counts (QK^T and AV, no causal halving, backward
    twice the forward: a causal kernel doing its real work at 50% of peak scores 1.0, hence the bound 2): one
    long causal call, the per-CTA fixed work amortised and every SM busy. Shorter calls run below it
    (cost.attention_rate.attention_rate_ratio, docs/formulas.md#compute.cp_attention). The GH100 profiles
    set the published 1.0, which the leave-one-family-out fit also picks (benchmarks/accuracy.py,
    docs/validation.md#refit); the default 0.7 is the earlier all-family fit, kept for the GPUs without one;
    replaced by `llmplan calibrate`."""
    attention_release_efficiency: dict[AttentionRelease, Annotated[float, Field(gt=0, le=2)]] = Field(
        default_factory=dict)
    """The native fused attention kernel's asymptote (as attention_efficiency: llmplan's count, over the peak,
    the rate curve at the benchmark's shape divided out) per software release (ParallelPlan.attention_release),
    from that release's published training rate on this GPU or one of the same die and clock: a plan naming
    the release runs attention at it instead of attention_efficiency. Empty: no release published
    (docs/formulas.md#compute.attention_release)."""
    ssd_scan_efficiency: float | None = Field(default=None, gt=0, le=1)
    """Rate of the Mamba-2 SSD scan's matmul FLOPs in state-spaces/mamba's Triton kernels on this GPU, as a
    fraction of the bf16 peak at the clock the kernels were timed at (cost.compute.ssd_scan_seconds), read off
    a published per-kernel time of the SSD kernels with their HBM traffic priced as elementwise traffic.
    None: the H800 measurement, cost.mixers.SSD_SCAN_EFFICIENCY (docs/formulas.md#mixers.ssd_rate)."""
    sparse_gather_efficiency: tuple[Annotated[float, Field(gt=0, le=1)], Annotated[float, Field(gt=0, le=1)]] \
        | None = None
    """(forward, backward) rate of the index-driven sparse attention kernels DeepSeek-V4 trains with (64 heads,
    d = 512, 640 slots per query, 4,096 queries), as a fraction of the dense bf16 tensor-core peak at the clock the
    benchmark sampled: its published TFLOP/s over its peak_mma_tflops (cost.sparse_gather,
    docs/formulas.md#compute.sparse_gather). None: no published rate; such a GPU prices DeepSeek-V4's attention
    as the dense fused kernel."""
    unfused_attention_efficiency: float = Field(default=0.7, gt=0, le=1)
    """Achieved fraction of the sustained peak of the unfused attention path's score matmuls (batched QK^T and
    AV over all s x s scores: no causal skipping, so the counted FLOPs are the work done). Not measured: the
    0.7 that attention_efficiency was fitted to when one constant served both paths (docs/validation.md#constants)."""
    native_attention_flash2: bool = False
    """The native fused attention kernel is FlashAttention-2 (Ampere): its per-CTA fixed work
    (ATTENTION_FIXED_KEYS["flash2"]) prices its short calls."""
    flash2_attention_ratio: float = Field(default=1.0, gt=0, le=1)
    """FlashAttention-2's attention throughput on this GPU relative to its native fused kernel
    (ParallelPlan.attention_kernel): 1 where FA2 is the native kernel (Ampere); on Hopper FlashAttention-3
    runs 1.5-2.0x FA2 (Shah et al. 2024, FlashAttention-3, abstract): the H100-class profiles take 1/1.75.
    Used only where flash2_attention_efficiency (FA2's own published rate) is None."""
    flash2_attention_efficiency: float | None = Field(default=None, gt=0, le=2)
    """FlashAttention-2's own asymptote on this GPU (as attention_efficiency: llmplan's count, over the peak,
    the rate curve at the benchmark's shape divided out), from its published forward + backward rate: the
    kernel ParallelPlan.attention_kernel flash2 runs, and the native kernel where that is FA2
    (native_attention_flash2). A100: 1.07 (Dao 2023, FlashAttention-2, Figure 4d); GH100: 0.58
    (Dao-AILab/flash-attention assets/flash2_h100_fwd_bwd_benchmark.png); docs/formulas.md#compute.flash2_rate.
    None: FA2 runs at flash2_attention_ratio x the native kernel's asymptote."""
    fa3_forward_efficiency: float | None = Field(default=None, gt=0, le=1)
    """FlashAttention-3's causal forward asymptote on this GPU, on the kernel's own count (causal pairs halved,
    QK^T and PV: 2 x 2d FLOPs a pair) over the dense bf16 peak at the clock it was published at, the rate curve
    at the benchmark's shape divided out (cost.attention_rate.prefill_call_ratio): the kernel a serving engine's
    prefill runs where EngineRule.fa3_mla_prefill says so (cost.attention_rate.serving_prefill_asymptote). GH100:
    0.66 (Shah et al. 2024, FlashAttention-3, arXiv 2407.08608, Figure 5, H100 SXM5, causal, head dim 128, 16
    heads, batch x s = 16k: 579 / 602 / 616 TFLOP/s at 4k / 8k / 16k, asymptotes 0.672 / 0.653 / 0.646, the
    mean; docs/formulas.md#infer.prefill_attention). None: no published FA3 forward rate; the prefill is
    priced at serving_attention_asymptote."""
    attention_dropout_ratio: float | None = Field(default=None, ge=1, le=10)
    """Forward + backward time of the native fused attention kernel with attention dropout over its time
    without, bf16, head dim 128, as published for this GPU's die (Hopper cuDNN 1.034, B300 cuDNN 1.094:
    NVIDIA/TransformerEngine#3312, sbhd). None: no published number; the native kernel is priced at
    FlashAttention-2's (cost.attention_rate.FLASH2_DROPOUT_RATIO), as the flash2 kernel always is
    (docs/formulas.md#compute.attention_dropout)."""
    attention_softmax_head_dim: float = Field(default=43.0, ge=0, le=1024)
    """Head dimension at which the native fused attention kernel's per-(query, key) softmax work takes as
    long as its 4d matmul FLOPs: its rate goes as d / (d + this), relative to d = 128 (head_dim_attention_ratio,
    docs/formulas.md#compute.attention). H100: 47 for cuDNN and 39 for FlashAttention-3 from Shah et al. 2024
    (FlashAttention-3), Figures 5-6, forward + backward at 4k tokens, head dim 64 vs 128: the middle, 43."""
    flash2_softmax_head_dim: float = Field(default=18.0, ge=0, le=1024)
    """As attention_softmax_head_dim, for FlashAttention-2 (ParallelPlan.attention_kernel flash2): 18 on H100
    (same figures: head dim 64 at 0.89x of 128)."""
    fp8_attention_points: dict[Fp8AttentionFormat, tuple[Fp8AttentionPoint, ...]] = Field(default_factory=dict)
    """cuDNN's FP8 fused attention (ParallelPlan.fp8_attention) over its bf16 kernel on this GPU's die, per FP8
    attention format (fp8: per-tensor scales, the FP8 delayed / current-scaling recipes; mxfp8: the MXFP8
    recipe's block scales) as published: (mean head dimension (d_qk + d_v) / 2, forward speed ratio, backward
    speed ratio) points, each bf16 time over FP8 time of one causal call at 4,096 tokens
    (cost.attention_rate.fp8_attention_ratio, docs/formulas.md#compute.fp8_attention). A format left out:
    the d0 rule (FP8 matmuls at twice the bf16 rate)."""
    fp8_tn_only: bool = False
    """FP8 GEMMs take only the TN layout (Hopper, Ada: cuBLASLt's FP8 requirement; Transformer Engine keeps a
    transposed "column-wise" FP8 copy of every operand it casts for that, cublaslt_gemm.cu): each per-tensor or
    blockwise cast writes two FP8 copies. Blackwell takes any layout: one copy."""
    softmax_attention_ratio: float = Field(default=1.0, gt=0, le=1)
    """Attention throughput relative to a GPU whose softmax exponentials keep pace with its tensor cores:
    below 1 where the special-function units' exp rate stalls the attention loop (Blackwell B200 / GB200:
    Blackwell Ultra doubles that rate and measures about 35% more FP8 attention-forward throughput, NVIDIA
    technical blog "Making Softmax More Efficient with NVIDIA Blackwell Ultra"); 1 elsewhere."""
    hbm_efficiency: float = Field(default=0.8, gt=0, le=1)
    """Achieved fraction of HBM bandwidth by memory-bound kernels (training's norms, activations, casts; decode
    weight and KV reads): where NVIDIA publishes cuDNN's RMSNorm forward + backward at training shapes, that
    (GB200 0.67, GB300 0.68, H200 0.75; B200 / B300 carry GB200's / GB300's); elsewhere 0.8, an assumption
    neither fitted nor measured here (docs/formulas.md#compute.hbm_efficiency, #infer.decode). A decode attention
    kernel's KV-cache reads take decode_kv_hbm_efficiency where it is published."""
    copy_hbm_efficiency: float | None = Field(default=None, gt=0, le=1)
    """Achieved fraction of HBM bandwidth by a streaming copy (read each element once, write it once, no
    reduction): where a STREAM-like run of this die and memory is published, its copy or triad rate over the
    peak; the MoE sort-by-local-expert copy is priced at it (docs/formulas.md#compute.copy_bandwidth). None:
    hbm_efficiency."""
    jit_activation_hbm_efficiency: float | None = Field(default=None, gt=0, le=1)
    """Achieved fraction of HBM bandwidth by the forward of Megatron-Core's jit_fuser SwiGLU (bias_swiglu_impl:
    torch.compile of chunk, silu and product over the 2f-wide fc1 output), where it is published for this GPU:
    H100 SXM 0.56 (linkedin/Liger-Kernel benchmark/data/all_benchmark_data.csv at ead96b61, megatron_swiglu
    rows). Plans with ParallelPlan.jit_activation price their gated activation's forward at it; None:
    hbm_efficiency (docs/formulas.md#compute.jit_activation)."""
    decode_kv_hbm_efficiency: float | None = Field(default=None, gt=0, le=1)
    """Achieved fraction of HBM bandwidth by a decode attention kernel streaming the KV cache (one query row per
    sequence against its whole cache: long contiguous reads, no write-back), where it is published for this GPU's
    die and memory: H800 SXM5 / H100 SXM (HBM3, 3.35 TB/s) 0.90, FlashMLA's dense decoding kernel at 3,000 GB/s
    in its memory-bound configuration (deepseek-ai/FlashMLA README.md and docs/20250422-new-kernel-deep-dive.md
    at 9241ae3). None: hbm_efficiency, the training kernels' share (docs/formulas.md#infer.decode_kv_bandwidth)."""
    gemm_efficiency: tuple[tuple[float, float], ...] | None = None
    """Measured GEMM efficiency by shape: (smallest GEMM dimension, achieved / peak) pairs, written by
    `llmplan calibrate`; None means the default curve (docs/formulas.md#compute.gemm)."""
    gemm_k_half: float = Field(default=128.0, gt=0, le=65536)
    """Reduction length at which a GEMM runs at half its best rate (tile prologue / epilogue and pipeline
    fill; docs/formulas.md#compute.gemm). Not fitted: cuBLAS's bf16 rate against K on H100 (OpenXLA's measured
    matmul table for sm_90, matmul_interpolator_data.h) gives 125 per tile, 123-131 leaving out any one shape
    (docs/validation.md#gemm-k-half); 128 lies within. No A100 curve is published; it takes the same."""
    gemm_k_half_by_rate: bool = False
    """The reduction half-length of fp8, MXFP8 and NVFP4 GEMMs is gemm_k_half times that format's
    measured large-GEMM rate over bf16's (GpuSpec.gemm_k_half_for: the fixed work per output tile takes the same
    seconds in every format). True where a published per-shape bf16 / fp8 table of this die confirms it: the B200
    die (b200, gb200), OpenXLA's sm_100 matmul table (fitted fp8 half-length 680 against bf16's 225, 3.0x, where
    the measured rates give 2.0x; docs/validation.md#fp8-small-gemm). False: one half-length for every format (the
    same table's sm_90 fp8 entries run above H100's FP8 peak and cannot be used; no sm_103 table)."""
    kernels: tuple[Kernel, ...] | None = None
    """Fused kernels the GPU's software stack ships (KERNELS); None means all of them. A model operator whose
    kernel is missing falls back to the unfused path (docs/formulas.md#operators)."""
    sm_count: int = Field(ge=1, le=4096)
    """Streaming multiprocessors (NVIDIA) or compute units (AMD): the tiles of one GEMM wave, and what NCCL's
    kernels take from compute (docs/formulas.md#compute.gemm, #step.overlap). Required: a datasheet fact that
    differs by GPU (REQUIRED_KEYS)."""
    compute_capability: float | None = Field(default=None, ge=1, le=99)
    """CUDA compute capability, major.minor (H100 9.0, B200 10.0, B300 10.3), from NVIDIA's CUDA GPU Compute
    Capability table (developer.nvidia.com/cuda-gpus); None for a GPU that is not NVIDIA's or not listed.
    vLLM's default CUDA graph ceiling reads its major (cost.serve_step.vllm_platform_max_capture)."""
    sustained_clock_fraction: float = Field(ge=0.1, le=1)
    """Sustained tensor-core clock under training load as a fraction of the boost clock the peak assumes
    (below 1 on power-capped fleets). Every time formula runs at peak x this; MFU stays against the peak.
    At least 0.1: the lowest power cap a GPU accepts (MIN_POWER_LIMIT_FRACTION) keeps about two thirds of the
    clock by at_power_limit's cube-root law, so a tenth is far below any running GPU (1e-12 is a typo).
    Required (REQUIRED_KEYS): a fitted value, and the 1.0 it once defaulted to predicted about 14% too fast."""
    power_limit_w: float | None = Field(default=None, gt=0, le=5000)
    """Board power limit the sustained clock belongs to (W; the vendor's default TDP in the shipped profiles);
    `at_power_limit` derives a capped GPU from it."""
    capped_from_w: float | None = Field(default=None, gt=0, le=5000)
    """The profile's power limit this GPU was capped from (`at_power_limit`); None for an uncapped profile."""
    failures_per_gpu_hour: float = Field(default=1.56e-5, ge=0, le=1)
    """Job-interrupting failures per GPU-hour that scale with the GPU count: the GPU itself (faulty GPU, HBM,
    SRAM, system processor, thermal interface, silent data corruption) and the software on it (bugs, NCCL
    watchdog timeouts, dependencies). Llama 3 405B pre-training, 16,384 H100 over 54 days, 331 of its 419
    unexpected interruptions (Dubey et al. 2024, The Llama 3 Herd of Models, Table 5): 331 / (16,384 x 1,296 h).
    Used by cost.goodput (docs/formulas.md#goodput.failures)."""
    hbm_reserve_gib: float = Field(default=0.0, ge=-65_536, le=65_536)
    """Memory per GPU this stack holds beyond what llmplan counts (GiB; `llmplan calibrate --memory-gib` sets it
    from a measured peak, negative when llmplan over-counts the stack): the usable capacity is hbm_gib minus
    it, so predicted headroom matches the measured run."""
    nccl_sms: int = Field(default=16, ge=0, le=256)
    """SMs NCCL's kernels occupy while a collective runs beside compute (one CTA per channel; NCCL uses
    16-32 channels on NVLink/IB systems): the compute under communication slows by nccl_sms / sm_count. An
    assumption (the low end of that range), not fitted; NCCL_MAX_CTAS / NCCL_MIN_CTAS set the real count."""
    step_overhead_s: float = Field(default=0.0, ge=0, le=60)
    """A measured host time per training step that the step-time model does not price (a fleet's data loader,
    logging or checkpoint hooks), seconds, added to every step; 0 in the shipped profiles. The launch waits,
    the exposed DP buckets, the optimizer step and the stragglers are priced from the plan
    (docs/formulas.md#step.overhead); the fitted 0.15 s that stood in for them until this release is gone."""
    host_op_factor: float = Field(default=1.0, gt=0, le=100)
    """Host (CPU) time of one framework operator on this GPU's host CPU (Python, PyTorch's dispatcher and
    autograd, the launch) over its time on the x86 server hosts the per-op constants were measured on
    (cost.compute.KERNEL_LAUNCH_S, cost.moe.EAGER_OP_HOST_S): it scales the launches and eager ops the step's
    host part prices (cost.overhead.host_seconds). 1.0 for a GPU in an x86 server (DGX H100's Xeon Platinum
    8480C and its kin); a superchip carries its CPU: GB200 / GB300 / GH200 run on Grace (72 Neoverse V2
    cores), where a torch.nn.Linear forward (bf16, hidden 2,048, 8,192 tokens) costs 37.08 us of CPU time
    against 13.48 us on a DGX H100 (NVIDIA/TransformerEngine issue 2053): 2.75. A measured ratio, not fitted;
    host_op_source is required with any other value. docs/formulas.md#step.host_cpu"""
    host_op_source: str = ""
    """Where host_op_factor comes from (the per-op CPU times on both hosts, and the page); required unless it is 1."""

    @model_validator(mode="after")
    def _positive_tflops(self) -> "GpuSpec":
        bad = {k: v for k, v in self.tflops.items() if not 0 < v <= 1e6}
        if bad:
            raise ValueError(f"tflops must be positive and below 10^6 per dtype, got {bad}")
        return self

    @model_validator(mode="after")
    def _host_op_sourced(self) -> "GpuSpec":
        if self.host_op_factor != 1.0 and not self.host_op_source.strip():
            raise ValueError(f"host_op_factor {self.host_op_factor:g} needs host_op_source: the per-op CPU times "
                             "measured on this host and on an x86 one, and where they were published")
        return self

    @model_validator(mode="after")
    def _reserve_below_capacity(self) -> "GpuSpec":
        if not -self.hbm_gib <= self.hbm_reserve_gib < self.hbm_gib:
            raise ValueError(f"hbm_reserve_gib ({self.hbm_reserve_gib:g}) must be between -hbm_gib and hbm_gib "
                             f"({self.hbm_gib:g}): it is memory the stack holds beyond llmplan's count")
        return self

    @property
    def hbm_bytes(self) -> float:
        """Usable memory per GPU: HBM less the calibrated reserve (hbm_reserve_gib)."""
        return (self.hbm_gib - self.hbm_reserve_gib) * GIB

    @property
    def has_sparse_gather_rate(self) -> bool:
        """The GPU lists a sparse gather rate (sparse_gather_efficiency): DeepSeek-V4's fused CSA path is priced on
        it (cost.sparse_gather.fused_csa); the memory functions take it as `gather_rate`."""
        return self.sparse_gather_efficiency is not None

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_gb_per_s * GB

    @property
    def hbm_achieved_bytes_per_s(self) -> float:
        """HBM bandwidth a memory-bound kernel achieves: the peak times hbm_efficiency
        (docs/formulas.md#compute.memory_bound)."""
        return self.hbm_bytes_per_s * self.hbm_efficiency

    @property
    def copy_achieved_bytes_per_s(self) -> float:
        """HBM bandwidth a streaming copy kernel achieves: the peak times copy_hbm_efficiency, or hbm_efficiency
        where none is published (docs/formulas.md#compute.copy_bandwidth)."""
        share = self.hbm_efficiency if self.copy_hbm_efficiency is None else self.copy_hbm_efficiency
        return self.hbm_bytes_per_s * share

    @property
    def decode_kv_achieved_bytes_per_s(self) -> float:
        """HBM bandwidth a decode attention kernel's KV-cache reads achieve: the peak times
        decode_kv_hbm_efficiency, or hbm_efficiency where none is published
        (docs/formulas.md#infer.decode_kv_bandwidth)."""
        share = self.hbm_efficiency if self.decode_kv_hbm_efficiency is None else self.decode_kv_hbm_efficiency
        return self.hbm_bytes_per_s * share

    def max_gemm_fraction(self, dtype: str) -> float:
        """Best achieved fraction of peak for large GEMMs: measured where published (bf16 for bf16 / fp16,
        fp8 for fp8 / mxfp8 at the same rate), else 0.75; fp4 at the fp8 fraction, or where the GPU's NVFP4 /
        fp8 kernel ratio is measured (fp4_gemm_speedup), at the fp8 rate times that ratio.
        Derived: docs/formulas.md#compute.gemm"""
        fp8 = self.max_gemm_tflops_fp8 / self.tflops["fp8"] if self.max_gemm_tflops_fp8 and "fp8" in self.tflops \
            else None
        bf16 = (
            self.max_gemm_tflops_bf16 / self.tflops[dtype]
            if self.max_gemm_tflops_bf16 and dtype in ("bf16", "fp16") and dtype in self.tflops
            else None
        )
        fp4 = fp8
        if self.fp4_gemm_speedup and "fp8" in self.tflops and "fp4" in self.tflops:
            fp4 = (fp8 or 0.75) * self.fp4_gemm_speedup * self.tflops["fp8"] / self.tflops["fp4"]
        return {"bf16": bf16, "fp16": bf16, "fp8": fp8, "mxfp8": fp8, "fp4": fp4}.get(dtype) or 0.75

    def gemm_k_half_for(self, dtype: str) -> float:
        """Reduction half-length of a GEMM in `dtype` (docs/formulas.md#compute.gemm_k_half_format): the fixed
        time per output tile (prologue, pipeline fill, epilogue) is the same in seconds whatever the operands'
        format, while the main loop runs each K step at the format's rate, so the half-length in K elements
        grows with the format's large-GEMM rate over bf16's (measured rates: max_gemm_fraction x peak). The
        low-precision formats (fp8, MXFP8; NVFP4 by the same rule, no fp4 table being published) on a GPU with
        gemm_k_half_by_rate (a published per-shape fp8 table of its die); every other case keeps gemm_k_half.
        Source: OpenXLA matmul_interpolator_data.h (sm_100 table, bf16 and f8e4m3fn on one shape grid;
        tensorflow/tensorflow at a305421c45, docs/validation.md#fp8-small-gemm).
        Derived: docs/formulas.md#compute.gemm_k_half_format"""
        if not self.gemm_k_half_by_rate or dtype not in ("fp8", "mxfp8", "fp4") or "bf16" not in self.tflops \
                or dtype not in self.tflops:
            return self.gemm_k_half
        ratio = (self.max_gemm_fraction(dtype) * self.tflops[dtype]  # type: ignore[index]
                 / (self.max_gemm_fraction("bf16") * self.tflops["bf16"]))
        return self.gemm_k_half * max(1.0, ratio)

    def peak_flops(self, dtype: str) -> float:
        """Peak dense FLOP/s for a dtype (KeyError if the GPU lacks it; check_plan reports that first)."""
        return self.tflops[dtype] * TERA  # type: ignore[index]  # any format name: a missing one is the KeyError

    def has_kernel(self, kernel: str) -> bool:
        return self.kernels is None or kernel in self.kernels

    def at_power_limit(self, watts: float) -> "GpuSpec":
        """This GPU under a lower board power limit: the sustained clock scales as (watts / power_limit_w)^(1/3)
        (dynamic power ~ C·V²·f with the voltage roughly proportional to the clock over the DVFS range), so a
        700 W H100 capped at 500 W keeps 89% of its clock. HBM bandwidth is left as is.
        Derived: docs/formulas.md#step.power"""
        problem = self.power_limit_problem(watts)
        if problem:
            raise ValueError(problem)
        assert self.power_limit_w is not None  # power_limit_problem says so otherwise
        clock = self.sustained_clock_fraction * power_clock_ratio(watts, self.power_limit_w)
        return self.model_copy(update={"sustained_clock_fraction": clock, "power_limit_w": watts,
                                       "capped_from_w": self.capped_from_w or self.power_limit_w})

    @property
    def capped_clock_ratio(self) -> float:
        """The clock this GPU keeps under its power cap over its clock at the profile's uncapped limit
        (power_clock_ratio; 1 for an uncapped GPU): what a kernel's published absolute rate, measured at the
        vendor's power limit, is multiplied by here. Derived: docs/formulas.md#step.power"""
        if self.capped_from_w is None or self.power_limit_w is None:
            return 1.0
        return power_clock_ratio(self.power_limit_w, self.capped_from_w)

    def power_limit_problem(self, watts: float) -> str | None:
        """Why a board power limit cannot apply to this GPU, or None: the one rule for --power-limit, a plan's
        hardware_options and a system's default_power_limit_w. It must lie between MIN_POWER_LIMIT_FRACTION of
        the GPU's TDP (the profile's uncapped power_limit_w) and its present power_limit_w."""
        if self.power_limit_w is None:
            return f"{self.name} states no power_limit_w to scale from; add it to the GPU profile"
        tdp = self.capped_from_w or self.power_limit_w
        low = MIN_POWER_LIMIT_FRACTION * tdp
        if not low <= watts <= self.power_limit_w:
            return (f"power limit {watts:g} W is outside {self.name}'s range {low:g}-{self.power_limit_w:g} W "
                    f"(from a quarter of its {tdp:g} W TDP, as low as GPUs accept a cap, up to the profile's "
                    f"limit); give a limit in that range")
        return None

    def sustained_flops(self, dtype: str) -> float:
        """The peak at the sustained clock: what every time formula divides by."""
        return self.peak_flops(dtype) * self.sustained_clock_fraction

    @property
    def contention(self) -> float:
        """Fraction by which compute slows while a collective runs beside it."""
        return min(self.nccl_sms / self.sm_count, 0.5)


class SystemSpec(Spec):
    """A node (or NVLink domain) shape and its scale-out fabric, built from one GPU type."""

    model_config = SPEC_CONFIG

    name: Name
    """Name users pass to --hardware (e.g. dgx-h100)."""
    source: str = ""
    """Where the numbers come from."""
    gpu: GpuSpec
    """The accelerator of every slot."""
    gpus_per_node: int = Field(gt=0, le=4096)
    """GPUs in one server (one OS image, one set of NICs)."""
    nvlink_domain_gpus: int | None = Field(default=None, gt=0, le=1_000_000)
    """GPUs reachable over the scale-up fabric (72 for GB200 NVL72); None means one node."""
    intra_node_fabric: Literal["nvswitch", "nvlink-mesh", "infinity-fabric", "pcie"] = "nvswitch"
    """Scale-up fabric kind: switched (all pairs at full rate) or a mesh (a pair gets one link)."""
    intra_node_gb_per_s: float = Field(gt=0, le=1e6)
    """Scale-up bandwidth per GPU, one direction, GB/s."""
    pair_gb_per_s: float | None = Field(default=None, gt=0, le=1e6)
    """Bandwidth between one pair of GPUs, one direction, GB/s, where a mesh gives less than the total."""
    nvls: bool = False
    """NVLink SHARP (in-switch reduction) for all-reduce."""
    nics_per_node: int = Field(default=0, ge=0, le=1024)
    """Scale-out NICs per node for the compute fabric (0: single-node system)."""
    nic_gbit_per_s: float = Field(default=0.0, ge=0, le=1e6)
    """Rate of one NIC, Gb/s (bits), one direction."""
    scaleout_fabric: Literal["infiniband", "roce", "efa", "omnipath", "none"] = "infiniband"
    """Scale-out network kind (omnipath: Intel Omni-Path, which NCCL drives through its IB verbs transport)."""
    rail_optimized: bool = True
    """GPU i of every node sits on leaf switch i (NCCL rings stay on one rail)."""
    default_power_limit_w: float | None = Field(default=None, gt=0, le=5000)
    """Board power limit the system runs its GPUs at unless --power-limit says otherwise (a fleet default below
    the GPU's TDP, e.g. 500 W on 700 W H100s; the command line and plan files apply it); None: the GPU's own
    power_limit_w."""
    failures_per_node_hour: float = Field(default=2.0e-5, ge=0, le=1)
    """Job-interrupting failures per node-hour of the host (host maintenance, NIC, SSD, power supply, chassis,
    IO board, CPU, system memory): 53 of Llama 3 405B's 419 unexpected interruptions over 2,048 nodes x 1,296 h
    (Dubey et al. 2024, Table 5). docs/formulas.md#goodput.failures"""
    failures_per_nic_hour: float = Field(default=1.65e-6, ge=0, le=1)
    """Job-interrupting failures per scale-out NIC-hour from the fabric beyond the node (network switches and
    cables): 35 of the 419 over 16,384 NICs x 1,296 h (Dubey et al. 2024, Table 5). docs/formulas.md#goodput.failures"""
    checkpoint_gb_per_s: float = Field(default=2000.0, gt=0, le=1e7)
    """Aggregate write (and read) bandwidth of the checkpoint storage the whole job shares, GB/s: Meta's
    Tectonic sustained 2 TB/s for Llama 3 (Dubey et al. 2024, Section 3.3.1: 2 TB/s sustained, 7 TB/s peak).
    docs/formulas.md#goodput.checkpoint"""
    checkpoint_node_gb_per_s: float = Field(default=20.0, gt=0, le=1e5)
    """Checkpoint write (and read) bandwidth of one node to that storage, GB/s: half the 40 GB/s a GPUDirect
    Storage read reaches per DGX H100 node on the SuperPOD storage fabric (NVIDIA DGX SuperPOD H100 reference
    architecture; writes taken at half the reads). docs/formulas.md#goodput.checkpoint"""
    host_copy_gb_per_s: float = Field(default=25.0, gt=0, le=1e4)
    """The link between one GPU and host memory, GB/s, one direction: what an asynchronous or in-memory
    checkpoint's device-to-host copy and activation offload (ParallelPlan.offload_layers) move over. Default
    PCIe Gen4 x16 (32 GB/s line rate, about 25 measured); PCIe Gen5 x16 64 (x86 DGX B200 / H100, 128 GB/s
    both directions), NVLink-C2C 450 (Grace: 900 GB/s both directions per GPU link; Transformer Engine
    docs/features/other_optimizations/cpu_offloading, NVIDIA Grace Blackwell datasheets)."""
    host_memory_gb_per_s: float | None = Field(default=None, gt=0, le=1e6)
    """Bandwidth of the node's CPU memory, GB/s, all sockets together, which the node's GPUs share when they
    copy to host memory at once (Grace LPDDR5X: up to 512 GB/s per Grace CPU; Megatron-Bridge's performance
    guide: offload efficiency depends on the GPU-host link and the host memory bandwidth). None: not
    limiting. docs/formulas.md#mem.offload"""
    host_memory_gb: float | None = Field(default=None, gt=0, le=1e7)
    """CPU (host) memory of one node, GB (1e9 bytes), all sockets together: where activation offload
    (ParallelPlan.offload_layers) puts the offloaded layers' activations of every GPU of the node (DGX H100 /
    H200 / B200: 2 TB of DDR5; a GB200 / GB300 compute tray: 2 Grace CPUs of 480 GB LPDDR5X). None: not
    known, and the host capacity is not checked. docs/formulas.md#mem.host"""
    host_memory_source: str = ""
    """Where host_memory_gb comes from (vendor guide, datasheet, cloud instance page); required with it."""
    host_cpu: Literal["intel", "amd", "arm"] | None = None
    """The node's host CPU vendor / architecture (x86 Intel, x86 AMD, ARM such as Grace), which NCCL's tuner
    reads: on an x86 AMD host a network post costs 2 us (1 us on Intel, ARM and any other host) and the LL
    protocol's busbw ceiling across nodes is 22.5 GB/s at 2 nodes, 19.0 beyond (39 / 20.4 otherwise). None:
    not stated, priced as NCCL's non-AMD default (1 us, 39 / 20.4 GB/s). Source: NVIDIA/nccl v2.21.5-1
    src/graph/tuning.cc getNetOverhead, llMaxBws. docs/formulas.md#comm.nccl_latency"""
    host_cpu_source: str = ""
    """Where host_cpu comes from (vendor user guide, datasheet, cloud instance page); required with it."""
    host_memory_usable_fraction: float = Field(default=0.9, gt=0, le=1)
    """Share of host_memory_gb the job's offloaded activations may take; the rest is left to the OS, the
    framework's pinned staging buffers, the data loader's workers and an asynchronous checkpoint's host copy.
    An assumption (no public measurement of that rest was found), not a measured value: set it in a profile
    (--hardware FILE) to what a cluster leaves free. check_plan rule offload_host_memory;
    docs/formulas.md#mem.host"""
    failure_detection_s: float = Field(default=120.0, ge=0, le=1e6)
    """Seconds from a failure to the job knowing of it: a crash is seen at once, a hang waits for the NCCL
    watchdog (PyTorch's default process-group timeout is 10 min); an assumption, overridable."""
    restart_overhead_s: float = Field(default=300.0, ge=0, le=1e6)
    """Seconds to reschedule after a failure: replace or drain the node, requeue, start every process and
    initialise the communicators (purpose-built systems: 150 s on 4,800 accelerators, FlashRecovery, arXiv
    2509.03047; about 20 s with standby machines, TrainMover, arXiv 2412.12636); an assumption, overridable."""
    restart_warmup_s: float = Field(default=60.0, ge=0, le=1e6)
    """Seconds the first steps after a restart lose to warm-up (data loader, allocator, lazy NCCL setup,
    compilation caches); an assumption, overridable."""
    oversubscription: float = Field(default=1.0, ge=1.0, le=1024)
    """Leaf-to-spine oversubscription ratio (1.0: non-blocking fat tree)."""
    nodes_per_leaf: int = Field(default=32, ge=1, le=1_000_000)
    """Nodes under one leaf switch per rail (32 = one DGX SuperPOD scalable unit); traffic between nodes
    under different leaves crosses the spine and its oversubscription."""
    intra_node_links: tuple[tuple[int, int], ...] | None = None
    """Explicit GPU pairs joined by a direct link (meshes only); None means a full mesh or a switch."""

    ring_efficiency: float = Field(default=0.80, gt=0, le=1.5)
    """Achieved fraction of the per-GPU scale-up bandwidth for ring collectives (nccl-tests busbw / spec:
    8xA100 0.78, 8xH200 0.82; nccl-tests busbw measurements in ml-engineering network/README.md)."""
    mesh_efficiency: float = Field(default=0.72, gt=0, le=1.5)
    """The same for a point-to-point mesh (8xMI300X 0.70, 2xMI300X 0.75; nccl-tests busbw measurements in
    ml-engineering network/README.md)."""
    nvls_factor: float = Field(default=1.07, gt=0, le=2)
    """All-reduce busbw / per-GPU spec with NVLink SHARP (8xH200 1.07; nccl-tests busbw measurements in
    ml-engineering network/README.md)."""
    nic_efficiency: float = Field(default=0.75, gt=0, le=1.5)
    """Achieved fraction of the NIC rate across nodes (4 x 8 B200 over EFA: 0.74; nccl-tests busbw measurements in
    ml-engineering network/README.md;
    DGX H100 over NDR InfiniBand, NVIDIA's published 32-GPU nccl-tests alltoall busbw 48 GB/s: 0.74,
    docs/validation.md#h100-ib-rates)."""
    allreduce_nic_efficiency: float | None = Field(default=None, gt=0, le=1.5)
    """Achieved fraction of the NIC rate for NCCL's ring collectives across nodes, one share for all of them:
    the ring / tree all-reduce and the ring all-gather / reduce-scatter, which run on the same ring graph at the
    same per-channel rate (NVIDIA/nccl v2.21.5-1 src/graph/tuning.cc: busBw = nChannels x bwInter). For a
    cluster file or a calibrated profile; no built-in profile sets it: the standalone nccl-tests readings
    (DGX H100 all-reduce 370 GB/s over 8 x 400 Gb/s, 0.925; DGX A100 192 over 8 x 200, 0.96) made the published
    training steps worse (docs/validation.md#ar-mend). A cluster file with `base:` that changes nic_efficiency,
    nic_gbit_per_s or scaleout_fabric does not inherit it. None: nic_efficiency."""
    intra_latency_s: float = Field(default=1.0e-6, ge=0, le=1.0)
    """Latency of one step of a collective over the scale-up fabric, seconds (NCCL alpha; approximate)."""
    inter_latency_s: float = Field(default=5.0e-6, ge=0, le=1.0)
    """Latency of one step across the scale-out network, seconds (approximate)."""
    calibrated: str | None = None
    """Where and when the efficiencies were measured (set by `llmplan calibrate`); None: defaults."""
    price_per_gpu_hour: float | None = Field(default=None, ge=0, le=10_000)
    """What one GPU of this system costs to rent for an hour, US dollars (a provider's on-demand or list rate,
    read on the date price_source gives): `search --objective cost` and the cost column of a comparison of
    systems multiply GPU-hours by it. None: no public price is cited, and the user supplies one (`search
    --price SYSTEM=USD`). A rate differs by provider, region, commitment and cluster size; it is no property of
    the hardware, so a cited one is an example, not a quote."""
    price_source: str = ""
    """Where and when price_per_gpu_hour was read (provider page, offering, date); required with a price."""

    @model_validator(mode="after")
    def _rules(self) -> "SystemSpec":
        dom = self.nvlink_domain_gpus
        if dom is not None and dom % self.gpus_per_node:
            raise ValueError(
                f"nvlink_domain_gpus ({dom}) must be a multiple of gpus_per_node ({self.gpus_per_node})"
            )
        if self.default_power_limit_w is not None:
            problem = self.gpu.power_limit_problem(self.default_power_limit_w)
            if problem:  # the rule every command applies to this default (GpuSpec.at_power_limit)
                raise ValueError(f"default_power_limit_w: {problem}")
        if self.price_per_gpu_hour is not None and not self.price_source.strip():
            raise ValueError("price_per_gpu_hour needs price_source: the provider page, offering and date it was "
                             "read from")
        if self.host_memory_gb is not None and not self.host_memory_source.strip():
            raise ValueError("host_memory_gb needs host_memory_source: the vendor guide, datasheet or instance page it "
                             "was read from")
        if self.host_cpu is not None and not self.host_cpu_source.strip():
            raise ValueError(f"host_cpu ({self.host_cpu}) needs host_cpu_source: the vendor guide, datasheet or "
                             "instance page it was read from")
        if self.nics_per_node and self.nic_gbit_per_s <= 0:
            raise ValueError(f"nic_gbit_per_s must be > 0 when nics_per_node is {self.nics_per_node}")
        for i, j in self.intra_node_links or ():
            if not (0 <= i < self.gpus_per_node and 0 <= j < self.gpus_per_node) or i == j:
                raise ValueError(f"intra_node_links pair ({i}, {j}) must name two different GPUs among the "
                                 f"{self.gpus_per_node} of a node (0..{self.gpus_per_node - 1})")
        return self

    def with_options(self, power_limit: float | None = None, domain_gpus: int | None = None) -> "SystemSpec":
        """This system with its GPUs capped at `power_limit` watts (GpuSpec.at_power_limit) and `domain_gpus`
        GPUs used of each NVLink domain (whole nodes, e.g. 64 of a 72-GPU rack); ValueError names a bad value.
        Derived: docs/formulas.md#topo.placement, docs/formulas.md#step.power"""
        system = self
        if domain_gpus is not None:
            full = self.domain_gpus
            if domain_gpus > full or domain_gpus % self.gpus_per_node:
                raise ValueError(f"use whole {self.name} nodes of {self.gpus_per_node} GPUs, at most the domain's "
                                 f"{full}; valid: " + bounded_list(range(self.gpus_per_node, full + 1,
                                                                         self.gpus_per_node), 20))
            system = system.model_copy(update={"nvlink_domain_gpus": domain_gpus})
        if power_limit is not None:
            system = system.model_copy(update={"gpu": system.gpu.at_power_limit(power_limit)})
        return system

    @property
    def domain_gpus(self) -> int:
        """GPUs in one scale-up (NVLink) domain."""
        return self.nvlink_domain_gpus or self.gpus_per_node

    @property
    def host_bytes_per_s(self) -> float:
        """One GPU's copy rate to (or from) host memory, bytes/s, while every GPU of the node copies at once:
        its host link, or its share of the node's CPU memory bandwidth where that is lower.
        Derived: docs/formulas.md#mem.offload"""
        share = (self.host_memory_gb_per_s / self.gpus_per_node if self.host_memory_gb_per_s is not None
                 else self.host_copy_gb_per_s)
        return min(self.host_copy_gb_per_s, share) * GB

    @property
    def host_usable_bytes(self) -> float | None:
        """Host memory bytes of one node that offloaded activations may take: host_memory_gb times
        host_memory_usable_fraction; None where host_memory_gb is not known. Derived: docs/formulas.md#mem.host"""
        if self.host_memory_gb is None:
            return None
        return self.host_memory_gb * GB * self.host_memory_usable_fraction

    @property
    def intra_node_bytes_per_s(self) -> float:
        return self.intra_node_gb_per_s * GB

    @property
    def nic_bytes_per_s(self) -> float:
        """Rate of one NIC, one direction, bytes/s."""
        return self.nic_gbit_per_s * GB / 8

    @property
    def pair_bytes_per_s(self) -> float:
        """One direct GPU-GPU link, one direction, bytes/s (the full per-GPU rate on a switch)."""
        return (self.pair_gb_per_s or self.intra_node_gb_per_s) * GB
