"""Operator coverage: which fused kernels a plan's operators need, whether the GPU's stack ships them, and the
unfused fallback when it does not (with its memory and time counted by the same cost functions).
Derived: docs/formulas.md#operators"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmplan.specs.hardware import GpuSpec
from llmplan.specs.model import ModelSpec


@dataclass(frozen=True)
class OperatorUse:
    """One operator of the model and the kernel it runs on."""

    operator: str
    kernel: str
    available: bool
    fallback: str
    """What runs instead when the kernel is missing ('' when it is there)."""
    modelled: bool = True
    """Whether the fallback's memory and time are in the estimate."""


def operator_uses(m: ModelSpec, plan: Any, gpu: GpuSpec) -> list[OperatorUse]:
    """The fused kernels the plan relies on: fused attention (MLA's for latent attention), fp8 GEMMs, a
    grouped expert GEMM, fused norms and rotary."""
    uses = []
    if plan.flash_attention:
        kernel = "mla" if m.is_mla else "flash_attention"
        what = "multi-head latent attention" if m.is_mla else "attention"
        uses.append(OperatorUse(what, kernel, gpu.has_kernel(kernel),
                                "unfused attention: the s x s scores are stored and softmax runs over them in HBM"))
    if plan.dtype == "fp8":
        uses.append(OperatorUse("fp8 GEMMs", "fp8_gemm", gpu.has_kernel("fp8_gemm"), "bf16 GEMMs"))
    if plan.dtype == "fp4":
        uses.append(OperatorUse("fp4 GEMMs", "fp4_gemm", gpu.has_kernel("fp4_gemm"), "bf16 GEMMs"))
    if m.is_moe:
        uses.append(OperatorUse("MoE experts", "grouped_gemm", gpu.has_kernel("grouped_gemm"),
                                "one GEMM launch per local expert and matmul"))
    uses.append(OperatorUse("norms", "fused_norm", gpu.has_kernel("fused_norm"),
                            "unfused norm in three passes over HBM"))
    if not m.learned_position_embeddings:
        uses.append(OperatorUse("rotary embedding", "fused_rope", gpu.has_kernel("fused_rope"),
                                "unfused rotary in three passes over HBM"))
    return [u if not u.available else OperatorUse(u.operator, u.kernel, True, "", u.modelled) for u in uses]


def with_fallbacks(plan: Any, uses: list[OperatorUse]) -> Any:
    """The plan as it actually runs on the GPU: unfused attention where the attention kernel is missing,
    bf16 GEMMs where fp8 / fp4 ones are missing."""
    missing = {u.kernel for u in uses if not u.available and u.modelled}
    update: dict[str, Any] = {}
    if missing & {"flash_attention", "mla"}:
        update["flash_attention"] = False
    if missing & {"fp8_gemm", "fp4_gemm"}:
        update["dtype"], update["recipe"] = "bf16", "tensorwise"
    if missing & {"grouped_gemm", "fused_norm", "fused_rope"}:
        update["fused_kernels"] = False
    return plan.model_copy(update=update) if update else plan

