"""Pipeline balance of a hybrid layer stack: a stage priced at the mixer kinds it holds, not the model's average.

The cost functions price a hybrid's average layer (cost.mixers); a stage of mostly Mamba-2 layers and one of
the attention layers then cost the same. A stage's compute is linear in its layers' mixer shares, so with
SC(m_k) the stage's compute were every layer's mixer of kind k (its MLPs unchanged), the stage holding c_k of
its n layers of kind k costs SC(m) + sum_k (c_k / n - share_k) SC(m_k), share_k the model's share of kind k.
A multi-token-prediction module on the stage is one layer more whose mixer is attention (MTP_MIXER); under an
fp4 recipe its layer runs in bf16 (mtp_layer_extra).
Derived: docs/formulas.md#mixers.balance, docs/formulas.md#mixers.mtp
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llmplan.arith import maximum, where
from llmplan.cost.compute import StageCompute, stage_compute
from llmplan.cost.params import memoized, stage_kind_counts, stage_layer_count
from llmplan.cost.stages import stage_mtp_modules
from llmplan.specs.hardware import GpuSpec
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan

PARTS = ("gemm", "attention", "memory_bound", "forward")
MTP_MIXER = "full_attention"
"""The mixer of a hybrid's multi-token-prediction module: softmax attention before its MoE block (Nemotron-3's
mtp_hybrid_override_pattern "*E"; Megatron-LM multi_token_prediction.py builds the module's HybridStack from that
pattern, after its eh_proj). Derived: docs/formulas.md#mixers.mtp"""


def single_kind(m: ModelSpec, kind: str) -> ModelSpec:
    """The model with every layer's mixer of `kind` (its MLPs, widths and layer count unchanged; built without
    re-validation: a layer may then hold neither mixer nor MLP, which prices as nothing)."""
    return m.model_copy(update={"layer_types": (kind,) * m.num_hidden_layers})


def mtp_layer_extra(layer_model: ModelSpec, plan: ParallelPlan, gpu: GpuSpec) -> dict[str, Any]:
    """Compute of one MTP module's layer (of `layer_model`'s mixer, one MoE or dense layer) in bf16, less that
    layer as the stack's average layer prices it, per part: Megatron-LM runs the MTP modules under its fp8 context
    only and never in FP4, so under an fp4 recipe their layers run in bf16 (as mtp_projection_seconds prices their
    eh_proj); zero under every other recipe. The bf16 layer is the plan's own bf16 layer (every layer kept in bf16:
    bf16_layers_start / _end). Source: NVIDIA/Megatron-LM megatron/core/transformer/multi_token_prediction.py
    (_proj_and_transformer_layer: fp8_context only with config.fp8, "currently ignoring FP4 in MTP layers") at
    d98e8a6. Derived: docs/formulas.md#mixers.mtp_fp4"""
    if plan.dtype != "fp4":  # a workload switch: one value for every plan of a search
        return {f: 0.0 for f in PARTS}
    dense, moe = (0, 1) if layer_model.is_moe else (1, 0)
    kept = plan.model_copy(update={"bf16_layers_start": 0, "bf16_layers_end": layer_model.num_hidden_layers})
    low = stage_compute(layer_model, plan, gpu, dense, moe, False)
    high = stage_compute(layer_model, kept, gpu, dense, moe, False)
    return {f: getattr(high, f) - getattr(low, f) for f in PARTS}


def with_mtp_layers(sc: StageCompute, m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec, stage: Any) -> StageCompute:
    """A non-hybrid stage's compute with its MTP modules' layers at their own format (mtp_layer_extra: bf16
    under fp4). Derived: docs/formulas.md#mixers.mtp_fp4"""
    mtp = stage_mtp_modules(m, plan, stage) if m.num_nextn_predict_layers and plan.dtype == "fp4" else 0
    return with_mtp_count(sc, m, plan, gpu, mtp)


def with_mtp_count(sc: StageCompute, layer_model: ModelSpec, plan: ParallelPlan, gpu: GpuSpec,
                   mtp: Any) -> StageCompute:
    """sc (compute of layers that count `mtp` MTP modules among them, each priced as `layer_model`'s layer)
    with each module's layer at its own format: plus mtp_layer_extra per module (bf16 under fp4; nothing
    otherwise). Derived: docs/formulas.md#mixers.mtp_fp4"""
    if plan.dtype != "fp4" or not np.any(mtp):
        return sc
    extra = mtp_layer_extra(layer_model, plan, gpu)
    return StageCompute(**{f: getattr(sc, f) + mtp * extra[f] for f in PARTS})


def priced_stage_compute(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec, stage: Any, n_dense: Any, n_moe: Any,
                         last: Any) -> StageCompute:
    """Per-micro-batch compute of pipeline rank `stage` (n_dense and n_moe layers, its MTP modules among them;
    the loss when `last`) as the step prices it: a hybrid stack's at the mixer kinds it holds
    (balanced_stage_compute), another's with its MTP modules' layers at their own format (with_mtp_layers).
    Derived: docs/formulas.md#mixers.balance, docs/formulas.md#mixers.mtp_fp4"""
    if m.is_hybrid:
        return balanced_stage_compute(m, plan, gpu, stage, n_dense, n_moe, last)
    return with_mtp_layers(stage_compute(m, plan, gpu, n_dense, n_moe, last), m, plan, gpu, stage)


def mtp_chunk_compute(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec, n_dense: int, n_moe: int, last: bool,
                      mtp: int) -> StageCompute:
    """stage_compute of a virtual chunk of n_dense and n_moe layers, `mtp` MTP modules among them (a pp_layout
    chunk's m symbols), each module's layer at its own format (with_mtp_count; a hybrid's module holds the
    MTP_MIXER). Derived: docs/formulas.md#pipeline.layout, docs/formulas.md#mixers.mtp_fp4"""
    sc = stage_compute(m, plan, gpu, n_dense, n_moe, last)
    if not m.num_nextn_predict_layers:
        return sc
    layer_model = single_kind(m, MTP_MIXER) if m.is_hybrid else m
    return with_mtp_count(sc, layer_model, plan, gpu, mtp)


def balanced_stage_compute(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec, stage: Any, n_dense: Any, n_moe: Any,
                           last: Any) -> StageCompute:
    """stage_compute of pipeline rank `stage` at the mixer kinds it holds (stage_kind_counts), its MTP modules
    (stage_mtp_modules, priced as MoE layers) with the MTP_MIXER, in bf16 under fp4 (mtp_layer_extra); the
    average-layer stage_compute for a model whose layers share one mixer kind. Derived:
    docs/formulas.md#mixers.balance, docs/formulas.md#mixers.mtp, docs/formulas.md#mixers.mtp_fp4"""
    base = stage_compute(m, plan, gpu, n_dense, n_moe, last)
    kinds = tuple(dict.fromkeys(m.layer_types or ()))
    if len(kinds) < 2:
        return with_mtp_layers(base, m, plan, gpu, stage)
    counts = stage_kind_counts(m, plan, stage)
    n = maximum(stage_layer_count(m, plan, stage), 1)
    parts = {f: getattr(base, f) for f in PARTS}
    has_mtp = bool(m.num_nextn_predict_layers) and MTP_MIXER in kinds
    mtp = stage_mtp_modules(m, plan, stage) if has_mtp else 0
    for kind in kinds:
        variant = memoized(plan, ("single_kind", m, kind), lambda k=kind: single_kind(m, k))
        sc = stage_compute(variant, plan, gpu, n_dense, n_moe, False)  # the output layer cancels: sum_k = 0
        share = m.count_layers(kind) / m.num_hidden_layers
        weight = counts[kind] / n - share
        for f in PARTS:
            parts[f] = parts[f] + weight * getattr(sc, f)
        if has_mtp:
            # the stage's MTP modules (MoE layers of n_moe; dense ones without experts) hold attention, not the
            # stage's mixer mix: one layer of the attention variant each, less what the average and weighted
            # variants gave them
            one = stage_compute(variant, plan, gpu, 0 if m.is_moe else 1, 1 if m.is_moe else 0, False)
            own = (1.0 if kind == MTP_MIXER else 0.0) - weight - share
            for f in PARTS:
                parts[f] = parts[f] + mtp * own * getattr(one, f)
            if kind == MTP_MIXER:  # the module's layer in its own format (bf16 under fp4)
                extra = mtp_layer_extra(variant, plan, gpu)
                for f in PARTS:
                    parts[f] = parts[f] + mtp * extra[f]
    return StageCompute(**{f: where(parts[f] > 0, parts[f], 0.0) for f in PARTS})
