"""MemoryAllowance: the stated allowance for buffers and fragmentation."""

from __future__ import annotations

from pydantic import Field

from llmplan.specs.model import SPEC_CONFIG, Spec


class MemoryAllowance(Spec):
    """The stated allowance for what the formulas do not count (docs/formulas.md#mem.other)."""

    model_config = SPEC_CONFIG

    fixed_gib: float | None = Field(default=None, ge=0, le=65_536)
    """Per-GPU bytes outside the tensors (CUDA context, cuBLAS workspace, NCCL communicator buffers), GiB, when
    stated; None: priced from the plan (cost.runtime_memory, docs/formulas.md#mem.runtime)."""
    fragmentation: float = Field(default=0.05, ge=0, le=1)
    """Fraction added for caching-allocator fragmentation, of the tensors freed and allocated again every
    micro-batch or step (activations, fresh weight gradients, gathered ZeRO-3 / FSDP buffers, gradients an
    optimizer frees at its step: TrainingMemory.churned); the buffers held all run (weights, gradient buffers,
    optimizer states) get none: each is a segment of its own, rounded up to 2 MiB
    (docs/formulas.md#mem.fragmentation)."""
