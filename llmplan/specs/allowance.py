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
    """Fraction added to the tensor memory for caching-allocator fragmentation."""
