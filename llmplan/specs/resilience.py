"""CheckpointPolicy: how a training job checkpoints and what failure rate it plans for (cost.goodput)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from llmplan.specs.model import SPEC_CONFIG, Spec

CHECKPOINT_MODES = ("sync", "async", "memory")


class CheckpointPolicy(Spec):
    """The checkpointing choices of a training job; the hardware profile holds the failure rates and the
    storage bandwidths (SystemSpec, GpuSpec). Derived: docs/formulas.md#goodput.fraction"""

    model_config = SPEC_CONFIG

    mode: Literal["sync", "async", "memory"] = "sync"
    """sync: training waits while every rank writes its shard to storage (Megatron-LM's default save);
    async: training waits only for the device-to-host copy, the write to storage runs behind the next steps
    (Megatron-LM --async-save, torchtitan async checkpointing); memory: the host copy goes to a peer node's
    memory over the network (Gemini, Wang et al. SOSP 2023) and a restart reads it back from there."""
    interval_s: float | None = Field(default=None, gt=0, le=1e8)
    """Seconds of training between checkpoints; None: the optimal interval (Daly 2006)."""
    failures_per_gpu_hour: float | None = Field(default=None, ge=0, le=1)
    """Job-interrupting failures per GPU-hour, all causes, replacing the profile's per-GPU, per-node and
    per-NIC rates; None: the profile's."""
