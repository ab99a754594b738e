"""Per-GPU memory the framework's runtime holds outside the model's tensors: the CUDA context with its loaded
kernel images, cuBLAS workspaces, NCCL's communicator buffers (docs/formulas.md#mem.runtime) and Transformer
Engine's userbuffers of the TP communication overlap (docs/formulas.md#mem.userbuffers).

All functions are pure and return bytes; they work on one ParallelPlan and, elementwise, on plan arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from llmplan.arith import where
from llmplan.cost.breakdown import Breakdown
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan

CUDA_CONTEXT_LAZY_BYTES = 287_047_680.0
"""Device memory of a PyTorch process's CUDA context with lazy module loading (CUDA_MODULE_LOADING=LAZY, the
default from PyTorch 1.13 with CUDA >= 11.7): pytorch/pytorch PR #86509, cudaMemGetInfo after one small tensor."""
CUDA_CONTEXT_EAGER_BYTES = 666_632_192.0
"""The same with every kernel image loaded when the library loads (CUDA_MODULE_LOADING=DEFAULT; CUDA before
11.7 had only this): pytorch/pytorch PR #86509, same measurement."""
CUBLAS_WORKSPACE_BYTES = 4096 * 1024 * 2 + 16 * 1024 * 8
"""cuBLAS workspace PyTorch gives each (handle, stream) through its caching allocator when
CUBLAS_WORKSPACE_CONFIG is unset, on GPUs outside compute capability majors 9-12 (":4096:2:16:8"):
pytorch/pytorch aten/src/ATen/cuda/CublasHandlePool.cpp @26a39059ec580351411f180816c47e2ef5134ae1,
parseChosenWorkspaceSize."""
CUBLAS_WORKSPACE_SM90_BYTES = 4096 * 8 * 1024
"""The same on compute capability majors 9 to 12 (Hopper, Blackwell), 32 MiB: 9.0 only at 26a39059; 10 and 12
from pytorch/pytorch pull request 175344 (merged 2026-02-19), 11 from pull request 189312 (2026-07). Source: as
CUBLAS_WORKSPACE_BYTES, and those pull requests."""
CUBLAS_TRAINING_HANDLES = 2
"""(cuBLAS handle, stream) pairs that run PyTorch's own cuBLAS GEMMs in a training step, each keeping its workspace
(PyTorch 2.0 until the per-operation workspaces of pull request 194311, 2026-08, docs/formulas.md#mem.runtime): the
Python thread's handle (the forward) and the handle of autograd's CUDA device thread (the backward and its recompute),
both on the compute
stream. ATen gives each host thread its own handle (DeviceThreadHandlePool::PoolWindow::reserve) and keys each
workspace by (handle, stream) (CublasHandlePool.cpp setWorkspaceForHandle, never freed but by
clearCublasWorkspaces); the autograd engine runs a CUDA device's backward functions on a thread of its own
(torch/csrc/autograd/engine.cpp, Note [Allocating GPUs to autograd threads]). Source: pytorch/pytorch
aten/src/ATen/cuda/CublasHandlePool.cpp @26a39059ec580351411f180816c47e2ef5134ae1, aten/src/ATen/cuda/detail/
DeviceThreadHandles.h @06d733a5cf2a06665241a75b98720a8497f7b4b7, torch/csrc/autograd/engine.cpp
@00c0674d50704c8c59a0a79ee4e82bbf7cc3e9f9."""
TE_WORKSPACE_HOPPER_BYTES = 33_554_432
"""Transformer Engine's cuBLAS(Lt) GEMM workspace on compute capability major >= 9 (32 MiB), one tensor outside
PyTorch's cuBLAS pool: NVIDIA/TransformerEngine transformer_engine/pytorch/module/base.py
@fecb10bdf13c26a213807bc310b0ec438462614e, get_cublas_workspace_size_bytes / get_workspace."""
TE_WORKSPACE_BYTES = 4_194_304
"""The same before Hopper (4 MiB). Source: as TE_WORKSPACE_HOPPER_BYTES."""
TE_UB_STREAMS = 3
"""Copies of that workspace initialize_ub keeps, one per concurrent GEMM stream of the userbuffers overlap
(get_workspace().repeat(_NUM_MAX_UB_STREAMS)). Source: as TE_WORKSPACE_HOPPER_BYTES."""
NCCL_CONNECTION_BYTES = float((1 << 22) + 120 * 640 * 8 * 8 + 8 * 512 * 8 * 16)
"""Buffers of one NCCL connection per channel, one per protocol: Simple DEFAULT_BUFFSIZE (4 MiB, NCCL_BUFFSIZE),
LL128 DEFAULT_LL128_BUFFSIZE (NCCL_LL128_ELEMS_PER_THREAD 120 x NCCL_LL128_MAX_NTHREADS 640 x NCCL_STEPS 8 x 8 B)
and LL DEFAULT_LL_BUFFSIZE (8 lines x 512 threads x 8 steps x 16 B): NVIDIA/nccl src/init.cc."""
UB_ALL_GATHER_BUFFERS = 8
"""Userbuffers of Transformer Engine's all-gather overlaps (qkv / fc1 fprop, qkv / proj / fc1 / fc2 dgrad, proj /
fc2 wgrad): initialize_ub's layers_all_gather_overlap (NVIDIA/TransformerEngine pytorch/module/base.py)."""
UB_WGRAD_ALL_GATHER_BUFFERS = 2
"""Of those, the weight-gradient ones (proj / fc2 wgrad, the "external" method) that Transformer Engine registers
from 2.7 (NVIDIA/TransformerEngine 077e26c31, #1982; ParallelPlan.ub_wgrad_buffers); v1.8 ... v2.6 register the
other six all-gather buffers only (pytorch/module/base.py initialize_ub at v1.8, 3ec998e96c)."""
UB_REDUCE_SCATTER_BUFFERS = 4
"""Userbuffers of its reduce-scatter overlaps (proj / fc2 fprop, qkv / fc1 wgrad): layers_reduce_scatter_overlap."""
TREE_CONNECTIONS = 2
"""Tree connections per channel that receive into a rank's buffers in a chain (one from the parent, one from the
child: NCCL's trees are chains inside a node); the ring adds one (from the previous rank)."""


@dataclass(frozen=True)
class RuntimeBytes(Breakdown):
    """Runtime memory of one rank outside the tensors; parts sum to total."""

    PARTS: ClassVar[tuple[str, ...]] = ("context", "cublas", "nccl", "userbuffers")

    context: Any
    """CUDA context and the kernel images loaded into it (eager or lazy module loading)."""
    cublas: Any
    """cuBLAS workspaces: PyTorch's, one per (handle, stream) that runs its GEMMs, held in the caching allocator
    (pytorch_cublas_bytes), and, under its userbuffers overlap, Transformer Engine's (te_workspace_bytes)."""
    nccl: Any
    """NCCL buffers of every communicator the rank belongs to."""
    userbuffers: Any = 0.0
    """Transformer Engine's userbuffers of the TP communication overlap (userbuffer_bytes), 0 without it."""
    communicators: Any = 0
    """Not a part: the number of NCCL communicators counted."""


def nccl_communicators(plan: ParallelPlan, stage: Any) -> Any:
    """NCCL communicators a rank of pipeline stage `stage` holds, one per process group it runs collectives
    in: TP, CP and EP groups of more than one rank, the gradient group over DP x CP (Megatron's dp_cp group,
    torchtitan's dp_shard_cp mesh); under a pipeline, one two-rank communicator per neighbouring stage it
    sends to or receives from (PyTorch's ProcessGroupNCCL keys send / recv communicators by the peer pair,
    getKeySendRecv), the first and last stages' embedding group (Megatron's tied-embedding all-reduce), and
    with TP as well the model-parallel group (TP x PP) of the gradient norm.
    Derived: docs/formulas.md#mem.runtime"""
    p = plan.pp
    piped = p > 1
    ends = (stage == 0) | (stage == p - 1)
    p2p = where(piped, where(ends | (p == 2), 1, 2), 0)
    embedding = where(piped & ends, 1, 0)
    model_parallel = where(piped & (plan.tp > 1), 1, 0)
    groups = where(plan.tp > 1, 1, 0) + where(plan.cp > 1, 1, 0) + where(plan.ep > 1, 1, 0) \
        + where(plan.dp * plan.cp > 1, 1, 0)
    return groups + p2p + embedding + model_parallel


def tp_overlap_asked(plan: ParallelPlan) -> Any:
    """Whether the plan asks Megatron-Core for TP communication overlap where it can act: tp_comm_overlap with sp
    over more than one rank (what the Megatron-LM export writes as --tp-comm-overlap and the Megatron-Bridge
    export refuses; check rule fp8_output_proj_tp_overlap)."""
    return plan.tp_comm_overlap & plan.sp & (plan.tp > 1)


def userbuffers_on(plan: ParallelPlan) -> Any:
    """Whether Transformer Engine's userbuffers carry the plan's TP collectives: tp_overlap_asked on
    Megatron-Core's TP (tp_impl megatron). Here rather than in cost.comm (which prices
    what they do to the step) because comm imports the memory modules: one predicate for both."""
    return (plan.tp_impl == "megatron") & tp_overlap_asked(plan)


MCORE_UB_NAMES = ("qkv", "proj", "fc1", "fc2")
"""The userbuffer names Megatron-Core keeps TP overlap for; a TE linear built with any other name under
tp_comm_overlap sets the shared TransformerConfig's tp_comm_overlap to False.
Source: NVIDIA/Megatron-LM d98e8a6, megatron/core/extensions/transformer_engine.py, TELinear.__init__."""


def mla_turns_tp_overlap_off(m: ModelSpec, plan: ParallelPlan) -> bool:
    """Whether Megatron-Core runs this plan's TP collectives unoverlapped although it asks for TP overlap: an
    MLA model under tp_impl megatron. MLASelfAttention builds linear_q_down_proj / linear_q_proj (userbuffer
    names q_down_proj, q_proj; qkv_down_proj fused) before the layer's MLP, and TELinear then turns
    tp_comm_overlap off on the config every later layer shares: of a pipeline rank's model only the first
    layer's linear_proj keeps userbuffers (priced as none: docs/formulas.md#step.mla_tp_overlap). The
    userbuffers are still allocated (initialize_ub runs before the model is built), so memory keeps them.
    Source: NVIDIA/Megatron-LM d98e8a6, megatron/core/transformer/multi_latent_attention.py
    (MLASelfAttention.__init__ tp_comm_buffer_name) and extensions/transformer_engine.py (TELinear.__init__)."""
    return bool(m.is_mla and plan.tp_comm_overlap and plan.tp_impl == "megatron")


def tp_overlap_as_run(m: ModelSpec, plan: ParallelPlan) -> ParallelPlan:
    """The plan whose TP overlap the step prices: tp_comm_overlap off where Megatron-Core turns it off
    (mla_turns_tp_overlap_off), else `plan` itself. One place for the estimate and the search (step_time).
    Derived: docs/formulas.md#step.mla_tp_overlap"""
    if not mla_turns_tp_overlap_off(m, plan):
        return plan
    return plan.model_copy(update={"tp_comm_overlap": False})


def userbuffer_bytes(hidden: int, plan: ParallelPlan, bf16_layers: Any = 0) -> Any:
    """Transformer Engine's userbuffers under Megatron's TP communication overlap (--tp-comm-overlap with SP):
    initialize_ub registers one buffer per overlapped GEMM, UB_ALL_GATHER_BUFFERS all-gather ones and
    UB_REDUCE_SCATTER_BUFFERS reduce-scatter ones, each of Megatron's input shape (s x b / cp, h), in bf16, the
    all-gather ones in fp8 (1 B) under an fp8 / fp4 recipe, plus a bf16 set when such a recipe keeps bf16
    layers (`bf16_layers` > 0: one set per quantization mode); two all-gather buffers fewer before Transformer
    Engine 2.7 (ParallelPlan.ub_wgrad_buffers False). Registered outside PyTorch's caching allocator.
    0 without the overlap, or with PyTorch's DTensor TP (tp_impl dtensor: no userbuffers).
    Source: NVIDIA/TransformerEngine pytorch/module/base.py initialize_ub, common/comm_gemm_overlap/
    comm_gemm_overlap.cpp (CommOverlapBase / CommOverlapP2PBase buffers) at d0067d0, and base.py initialize_ub at
    v1.8 (3ec998e96c); NVIDIA/Megatron-LM megatron/training/initialize.py _initialize_tp_communicators at d98e8a6"""
    row = plan.seq_len * plan.micro_batch / plan.cp * hidden
    gathers = UB_ALL_GATHER_BUFFERS - (0 if plan.ub_wgrad_buffers else UB_WGRAD_ALL_GATHER_BUFFERS)  # TE < 2.7: 6
    bf16_set = (gathers + UB_REDUCE_SCATTER_BUFFERS) * 2.0 * row
    low_set = (gathers * 1.0 + UB_REDUCE_SCATTER_BUFFERS * 2.0) * row  # the all-gather ones in fp8
    sets = low_set + where(bf16_layers > 0, bf16_set, 0.0) if plan.low_precision else bf16_set
    return where(userbuffers_on(plan), sets, 0.0)


def cublas_workspace_bytes(compute_capability: float | None) -> float:
    """PyTorch's cuBLAS workspace of one (handle, stream) pair with CUBLAS_WORKSPACE_CONFIG unset, as
    current PyTorch sizes it: 32 MiB on compute capability major 9 to 12 (Hopper and Blackwell), else 8 MiB +
    128 KiB (None, a GPU of unknown capability: the latter). Releases before pytorch/pytorch pull request 175344
    (merged 2026-02-19, "re-enable 32MiB workspaces on Blackwell"; major 11 from pull request 189312, 2026-07)
    gave Blackwell the smaller one, 24 MiB less per rank.
    Source: pytorch/pytorch aten/src/ATen/cuda/CublasHandlePool.cpp @26a39059ec580351411f180816c47e2ef5134ae1
    (parseChosenWorkspaceSize, setWorkspaceForHandle) and the two pull requests above."""
    large = compute_capability is not None and 9 <= int(compute_capability) <= 12
    return float(CUBLAS_WORKSPACE_SM90_BYTES if large else CUBLAS_WORKSPACE_BYTES)


def pytorch_cublas_bytes(compute_capability: float | None) -> float:
    """PyTorch's cuBLAS workspaces a training rank keeps: one per (handle, stream) pair that runs its GEMMs,
    CUBLAS_TRAINING_HANDLES (the forward thread's and autograd's device thread's, on the compute stream) x
    cublas_workspace_bytes: 64 MiB on Hopper, 2 x 8 MiB + 128 KiB on Ampere.
    Source: pytorch/pytorch aten/src/ATen/cuda/CublasHandlePool.cpp @26a39059ec580351411f180816c47e2ef5134ae1
    (setWorkspaceForHandle); Derived: docs/formulas.md#mem.runtime"""
    return CUBLAS_TRAINING_HANDLES * cublas_workspace_bytes(compute_capability)


def te_workspace_bytes(plan: ParallelPlan, compute_capability: float | None) -> Any:
    """Transformer Engine's GEMM workspace where the plan says its GEMMs are Transformer Engine's: under its
    userbuffers TP overlap (userbuffers_on), TE_UB_STREAMS copies of 32 MiB on compute capability >= 9, 4 MiB
    before (None: unknown, 4 MiB); 0 otherwise (a plan without the overlap does not say whether TE runs it).
    Source: NVIDIA/TransformerEngine transformer_engine/pytorch/module/base.py
    @fecb10bdf13c26a213807bc310b0ec438462614e, get_cublas_workspace_size_bytes, initialize_ub."""
    hopper = compute_capability is not None and compute_capability >= 9
    one = TE_WORKSPACE_HOPPER_BYTES if hopper else TE_WORKSPACE_BYTES
    return where(userbuffers_on(plan), TE_UB_STREAMS * float(one), 0.0)


def runtime_bytes(plan: ParallelPlan, stage: Any, nccl_channels: int, lazy_loading: bool,
                  userbuffers: Any = 0.0, compute_capability: float | None = None) -> RuntimeBytes:
    """Runtime bytes of a rank of stage `stage` on a GPU of `compute_capability`: the CUDA context, PyTorch's
    cuBLAS workspaces (pytorch_cublas_bytes) and Transformer Engine's (te_workspace_bytes), per NCCL
    communicator `channels x (1 ring + 2 tree) x` one connection's protocol buffers (NCCL before 2.22 connects
    rings and trees at init; from 2.22, NCCL_RUNTIME_CONNECT, at the first collective that uses them, which a
    training step runs), and the TP overlap's `userbuffers` (userbuffer_bytes). Channels: GpuSpec.nccl_sms
    (one CTA per channel).
    Source: NVIDIA/nccl src/init.cc (DEFAULT_*_BUFFSIZE); pytorch/pytorch PR #86509 (context)"""
    context = CUDA_CONTEXT_LAZY_BYTES if lazy_loading else CUDA_CONTEXT_EAGER_BYTES
    comms = nccl_communicators(plan, stage)
    nccl = comms * nccl_channels * (1 + TREE_CONNECTIONS) * NCCL_CONNECTION_BYTES
    cublas = pytorch_cublas_bytes(compute_capability) + te_workspace_bytes(plan, compute_capability)
    return RuntimeBytes(context=context + 0.0 * comms, cublas=cublas + 0.0 * comms,
                        nccl=nccl * 1.0, userbuffers=userbuffers + 0.0 * comms, communicators=comms)
