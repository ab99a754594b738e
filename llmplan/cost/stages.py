"""Which transformer layers each pipeline stage holds: the first / middle / last split, explicit pp_layers and
pp_layout stages, the (dense, MoE) layers and mixer kinds of a stage (virtual chunks included), the heaviest
MoE stage, and the share of a stage's layers full recompute repeats.

Works on one ParallelPlan and, elementwise, on plan arrays (see llmplan/arith.py). Split out of cost.params,
which re-exports its names.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from llmplan.arith import maximum, minimum, where
from llmplan.cost.memo import LAYOUT_AXES, memoized, per_distinct
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan, PlanLike, has_layout
from llmplan.specs.stages import pinned_split


def layer_split(m: ModelSpec, plan: PlanLike) -> tuple[Any, Any, Any]:
    """Transformer layers on the first stage, on each middle stage and on the last stage.

    Megatron's --decoder-first/last-pipeline-num-layers pin the first and last stage; the other stages share
    the rest evenly (0 pins nothing: an even split). Source: Megatron-LM arguments.py (validate_args checks
    that the remaining layers divide the remaining stages); check_plan enforces it here."""
    return memoized(plan, ("split", m.num_hidden_layers),
                    lambda: pinned_split(m.num_hidden_layers, plan.pp, plan.pp_first, plan.pp_last)[0])


def explicit_stages(plan: PlanLike) -> tuple[int, ...] | None:
    """Transformer layers of every pipeline stage when the plan lists them (pp_layers, or the pp_layout chunks
    of each rank summed); None for a first/last or even split, for plan arrays and for serving plans."""
    if has_layout(plan):
        return _layout_stages(plan.pp, tuple(getattr(plan, "pp_layout", None) or ()))  # has_layout: a ParallelPlan
    return getattr(plan, "pp_layers", None)


@lru_cache(maxsize=256)
def _layout_stages(p: int, layout: tuple[str, ...]) -> tuple[int, ...]:
    """Transformer layers of every rank of a layout (its chunks' t symbols), once per layout in a process."""
    v = max(1, len(layout) // p)
    return tuple(sum(layout[c * p + i].count("t") for c in range(v)) for i in range(p))


def layout_grid(plan: ParallelPlan) -> list[list[str]]:
    """pp_layout as [stage][virtual chunk] symbol runs: chunk k of the list is rank k mod pp's chunk k // pp.
    Source: Megatron-LM PipelineParallelLayerLayout (megatron/core/transformer/pipeline_parallel_layer_layout.py)."""
    chunks, p = plan.pp_layout or (), plan.pp
    v = max(1, len(chunks) // p)
    return [[chunks[c * p + i] for c in range(v)] for i in range(p)]


def chunk_layers(m: ModelSpec, plan: ParallelPlan) -> list[list[tuple[int, int]]]:
    """layout_chunk_layers, once per plan (a plan's memory and step time read it stage by stage)."""
    return memoized(plan, ("layout_chunk_layers", m), lambda: layout_chunk_layers(m, plan))


def layout_chunk_layers(m: ModelSpec, plan: ParallelPlan) -> list[list[tuple[int, int]]]:
    """(dense, MoE) layers of every [stage][virtual chunk] of a pp_layout plan: the t symbols are the model's
    layers in list order (the first first_k_dense_replace of them dense), the m symbols its MTP modules
    (priced as MoE layers, as _stage_layers does). Derived: docs/formulas.md#pipeline.layout"""
    k = m.first_k_dense_replace if m.is_moe else 0
    p, start = plan.pp, 0
    out: list[list[tuple[int, int]]] = [[] for _ in range(p)]
    for i, chunk in enumerate((plan.pp_layout or ())[: len(layout_grid(plan)[0]) * p]):
        n, mtp = chunk.count("t"), chunk.count("m")
        dense = max(0, min(start + n, k) - start) if m.is_moe else n + mtp
        if m.is_moe and m.mlp_layer_types is not None:
            dense = n - moe_layers_between(m, start, start + n)
        out[i % p].append((dense, n + mtp - dense))
        start += n
    return out


def stage_layer_count(m: ModelSpec, plan: PlanLike, stage: Any) -> Any:
    """Transformer layers held by pipeline rank `stage` (all its virtual chunks together)."""
    stages = explicit_stages(plan)
    if stages is not None:
        return stages[int(stage)]
    first, mid, last = layer_split(m, plan)
    return where(stage == 0, first, where(stage == plan.pp - 1, last, mid))


def layers_before(m: ModelSpec, plan: PlanLike, stage: Any) -> Any:
    """Transformer layers held by the pipeline ranks before `stage`."""
    stages = explicit_stages(plan)
    if stages is not None:
        return sum(stages[: int(stage)])
    first, mid, _ = layer_split(m, plan)
    return where(stage == 0, 0, first + (stage - 1) * mid)


def stage_layer_list(m: ModelSpec, plan: ParallelPlan) -> list[int]:
    """Transformer layers of every pipeline stage, first to last (one plan)."""
    stages = explicit_stages(plan)
    if stages is not None:
        return list(stages)
    first, mid, last = (int(x) for x in layer_split(m, plan))  # stage_layer_count of each stage, split read once
    return [first if i == 0 else last if i == plan.pp - 1 else mid for i in range(plan.pp)]


def max_stage_layers(m: ModelSpec, plan: PlanLike) -> Any:
    """Layers of the pipeline rank that holds the most."""
    stages = explicit_stages(plan)
    if stages is not None:
        return max(stages)
    first, mid, last = layer_split(m, plan)
    return maximum(first, maximum(where(plan.pp > 2, mid, 0), last))


def stage_layers(m: ModelSpec, plan: PlanLike, stage: Any) -> tuple[Any, Any]:
    """(dense layers, MoE layers) held by pipeline rank `stage`.

    With vpp virtual stages every rank's layers form vpp equal chunks; virtual round j holds chunk j of
    every rank in order, so rank i's chunk j starts at j·L/vpp + (layers before rank i)/vpp (Megatron's
    interleaved assignment, uneven first/last stages included). Works elementwise on plan arrays."""
    return memoized(plan, ("stage_layers", m, stage),
                    lambda: per_distinct(plan, LAYOUT_AXES, stage, lambda p, i: _stage_layers(m, p, i)))


def _stage_layers(m: ModelSpec, plan: PlanLike, stage: Any) -> tuple[Any, Any]:
    if has_layout(plan):  # it places every layer and MTP module
        chunks = chunk_layers(m, plan)[int(stage)]
        return sum(d for d, _ in chunks), sum(e for _, e in chunks)
    n = stage_layer_count(m, plan, stage)
    mtp = stage_mtp_modules(m, plan, stage)  # MTP modules ride on the last stage
    if not m.is_moe:
        return n + mtp, 0 * n
    v, k = plan.vpp, m.first_k_dense_replace
    chunk, offset, round_ = n // v, layers_before(m, plan, stage) // v, m.num_hidden_layers // v
    if m.mlp_layer_types is not None:  # MoE layers anywhere in the stack (a hybrid pattern): count them
        moe = 0 * n
        for j in range(int(np.max(v))):
            start = j * round_ + offset
            moe = moe + where(j < v, moe_layers_between(m, start, start + chunk), 0)
        return n - moe, moe + mtp
    dense = 0 * n
    # Only virtual rounds that start before layer k can hold dense layers: round j starts at j·L/vpp or later.
    rounds = min(int(np.max(v)), int(np.ceil(k / max(1, int(np.min(round_))))) + 1)
    for j in range(rounds):
        start = j * round_ + offset
        dense = dense + where(j < v, maximum(0, minimum(start + chunk, k) - start), 0)
    return dense, n - dense + mtp


def interleaved_chunk_layers(m: ModelSpec, plan: PlanLike, stage: Any) -> tuple[np.ndarray, np.ndarray]:
    """(dense, MoE) layers of each virtual chunk of rank `stage` without a pp_layout, shape (max vpp, ...): chunk j
    holds the stage's layers / vpp (a mean where vpp does not divide them) from j·L/vpp + (layers before the
    rank) / vpp, as _stage_layers counts them (zero past a plan's own vpp); the MTP modules on the last stage's
    last chunk, after its last layer. Sums over the chunks equal stage_layers. Elementwise on plan arrays.
    Derived: docs/formulas.md#mem.grad_lifetime"""
    return chunk_kinds(m, stage_layer_count(m, plan, stage), stage_mtp_modules(m, plan, stage),
                       layers_before(m, plan, stage), plan.vpp)


def chunk_kinds(m: ModelSpec, n: Any, mtp: Any, before: Any, v: Any) -> tuple[np.ndarray, np.ndarray]:
    """interleaved_chunk_layers of a rank of `n` layers and `mtp` MTP modules after `before` layers, at `v`
    virtual chunks (elementwise; the search calls it once per distinct rank). Derived:
    docs/formulas.md#mem.grad_lifetime"""
    k = m.first_k_dense_replace if m.is_moe else 0
    chunk, offset, round_ = n // v, before // v, m.num_hidden_layers // v
    dense, moe = [], []
    for j in range(int(np.max(v))):
        start, extra = j * round_ + offset, where(j == v - 1, mtp, 0)
        # n / v layers a chunk (a mean where v does not divide n: torchtitan's uneven stages), the kinds counted
        # over its n // v whole layers as _stage_layers counts them
        if not m.is_moe:
            d = n / v + extra
        elif m.mlp_layer_types is not None:
            d = n / v - moe_layers_between(m, start, start + chunk)
        else:
            d = maximum(0, minimum(start + chunk, k) - start)
        e = n / v - d + (extra if m.is_moe else 0 * extra)
        dense.append(where(j < v, d + 0 * e, 0))
        moe.append(where(j < v, e + 0 * d, 0))
    return np.stack(np.broadcast_arrays(*dense)) * 1.0, np.stack(np.broadcast_arrays(*moe)) * 1.0


def stage_mtp_modules(m: ModelSpec, plan: PlanLike, stage: Any) -> Any:
    """Multi-token-prediction modules held by pipeline rank `stage`: the m symbols of its pp_layout chunks, else
    all of them on the last stage (_stage_layers counts them among the stage's layers). Elementwise on plan
    arrays."""
    if has_layout(plan):
        return sum(chunk.count("m") for chunk in layout_grid(plan)[int(stage)])
    return where(stage == plan.pp - 1, m.num_nextn_predict_layers, 0)


def mtp_weight_sets(m: ModelSpec) -> int:
    """Distinct MTP modules' weights the model holds: one under mtp_repeated_layer (one module run at every depth),
    else one per module (num_nextn_predict_layers); 0 without MTP. Weight-proportional counts (parameters, their
    memory, gradient reduction, gathers) read this; compute and activations run stage_mtp_modules, once per depth.
    Source: NVIDIA/Megatron-LM@d98e8a64dd megatron/core/transformer/multi_token_prediction.py
    (MultiTokenPredictionBlock._build_layers: one layer under mtp_use_repeated_layer, layer_idx 0 at every depth)."""
    n = m.num_nextn_predict_layers
    return min(n, 1) if m.mtp_repeated_layer else n


def stage_mtp_weight_sets(m: ModelSpec, plan: PlanLike, stage: Any) -> Any:
    """MTP modules' weight sets held by pipeline rank `stage`: its stage_mtp_modules, at most one under
    mtp_repeated_layer (Megatron-Core keeps all depths on one stage). Elementwise on plan arrays."""
    mtp = stage_mtp_modules(m, plan, stage)
    return minimum(mtp, mtp_weight_sets(m)) if m.mtp_repeated_layer else mtp


def stage_weight_layers(m: ModelSpec, plan: PlanLike, stage: Any) -> tuple[Any, Any]:
    """(dense, MoE) layers whose weights rank `stage` holds: stage_layers less the MTP depths that rerun the
    repeated module's weights (mtp_repeated_layer), counted as stage_layers counts an MTP module (MoE where the
    model has experts). Elementwise on plan arrays. Derived: docs/formulas.md#params.rank"""
    dense, moe = stage_layers(m, plan, stage)
    if not m.mtp_repeated_layer:
        return dense, moe
    reruns = stage_mtp_modules(m, plan, stage) - stage_mtp_weight_sets(m, plan, stage)
    return (dense, moe - reruns) if m.is_moe else (dense - reruns, moe)


def moe_layers_between(m: ModelSpec, start: Any, end: Any) -> Any:
    """MoE layers among layers [start, end) of a model whose mlp_layer_types places them (elementwise)."""
    return _flagged_between([x == "moe" for x in (m.mlp_layer_types or ())], start, end)


def kind_layers_between(m: ModelSpec, kind: str, start: Any, end: Any) -> Any:
    """Layers whose mixer is `kind` among layers [start, end) (elementwise)."""
    return _flagged_between([x == kind for x in (m.layer_types or ())], start, end)


def stage_kind_counts(m: ModelSpec, plan: PlanLike, stage: Any) -> dict[str, Any]:
    """Layers of each mixer kind (layer_types) that pipeline rank `stage` holds, all its virtual chunks
    together (the chunks of _stage_layers: chunk j of rank i starts at j·L/vpp + layers before i / vpp).
    Elementwise on plan arrays; a stage's kinds sum to its layers."""
    n = stage_layer_count(m, plan, stage)
    v = plan.vpp
    chunk, offset, round_ = n // v, layers_before(m, plan, stage) // v, m.num_hidden_layers // v
    out: dict[str, Any] = {}
    for kind in dict.fromkeys(m.layer_types or ()):
        count = 0 * n
        for j in range(int(np.max(v))):
            start = j * round_ + offset
            count = count + where(j < v, kind_layers_between(m, kind, start, start + chunk), 0)
        out[kind] = count
    return out


def _flagged_between(flags: list[bool], start: Any, end: Any) -> Any:
    prefix = np.concatenate([[0], np.cumsum(flags)]).astype(int)
    L = len(flags)
    lo = np.clip(np.asarray(start, dtype=int), 0, L)
    hi = np.clip(np.asarray(end, dtype=int), 0, L)
    out = prefix[hi] - prefix[lo]
    return int(out) if np.ndim(out) == 0 else out


def heaviest_moe_stage(m: ModelSpec, plan: PlanLike) -> Any:
    """The memory candidate among MoE ranks (cost.memory.candidate_stages): the first pipeline rank that holds no
    dense layer (the most in-flight micro-batches among such ranks); 0 for models without leading dense layers. A
    model whose mlp_layer_types places its MoE layers (Llama 4 Maverick every other layer, a hybrid pattern): the
    first middle rank that holds the most of them. Not always the rank with the most MoE layers (a split that
    counts the embedding and the loss as layers leaves rank 0 fewer; MTP modules add to the last): the EP
    traffic is priced on most_moe_layers' rank."""
    if m.is_moe and m.mlp_layer_types is not None:
        return _most_moe_middle_stage(m, plan)
    if not m.is_moe or not m.first_k_dense_replace:
        return 0 * plan.pp
    if explicit_stages(plan) is not None:
        return next((i for i in range(plan.pp) if stage_layers(m, plan, i)[0] == 0), plan.pp - 1)
    first, mid, _ = layer_split(m, plan)
    kv = m.first_k_dense_replace * plan.vpp  # chunk 0 of rank i starts at layers_before(i) / vpp
    i = where(kv <= first, 1, 1 - (-(kv - first) // maximum(mid, 1)))
    return minimum(i, plan.pp - 1)


def most_moe_layers(m: ModelSpec, plan: PlanLike, stages: tuple[Any, ...]) -> tuple[Any, Any]:
    """(dense, MoE) layers of the first of `stages` (the step's candidate stages, cost.memory.candidate_stages)
    that holds the most MoE layers, elementwise: the rank whose all-to-alls step_time scales the others' from
    (moe_layers / moe_max, step._stage_micro_batches). Derived: docs/formulas.md#comm.ep_stage"""
    dense, moe = stage_layers(m, plan, stages[0])
    for stage in stages[1:]:
        d, e = stage_layers(m, plan, stage)
        more = e > moe
        dense, moe = where(more, d, dense), where(more, e, moe)
    return dense, moe


def _most_moe_middle_stage(m: ModelSpec, plan: PlanLike) -> Any:
    """The first of ranks 1 .. pp-2 holding the most MoE layers (rank 1, or pp-1 when pp <= 2); elementwise."""
    best = minimum(1, plan.pp - 1) + 0 * plan.pp
    if explicit_stages(plan) is not None:
        return best
    count = stage_layers(m, plan, 1)[1] if int(np.max(plan.pp)) > 1 else 0 * plan.pp
    for i in range(2, int(np.max(plan.pp)) - 1):
        n = stage_layers(m, plan, i)[1]
        better = (i < plan.pp - 1) & (n > count)
        best, count = where(better, i, best), where(better, n, count)
    return best


def attention_rerun_share(plan: ParallelPlan, layers: Any) -> Any:
    """Share of a stage's attention layers whose attention core runs its forward once more before the backward:
    every one under selective recompute of core_attn (Megatron-Core's _checkpointed_attention_forward re-calls
    the core attention inside tensor_parallel.checkpoint), else recomputed_share. Source: NVIDIA/Megatron-LM at
    d98e8a64dd, megatron/core/transformer/attention.py (checkpoint_core_attention, _checkpointed_attention_forward).
    Derived: docs/formulas.md#comm.cp"""
    return where(plan.recomputes("core_attn"), 1.0, recomputed_share(plan, layers))


def recomputed_share(plan: ParallelPlan, layers: Any) -> Any:
    """Share of a stage's `layers` whose forward full recompute repeats: every layer, or with
    recompute_layers N the first N of each of the stage's vpp virtual chunks (Megatron's block method); 0
    without full recompute. Source: Megatron-LM --recompute-method block. Derived: docs/formulas.md#mem.activations"""
    if plan.recompute_layers is None:
        return where(plan.full, 1, 0)
    return where(plan.full, minimum(plan.recompute_layers * plan.vpp / maximum(layers, 1), 1.0), 0.0)
