"""When a pipeline rank's unsharded gradients are live under sharded gradients (ZeRO-2/3, FSDP) with an
interleaved pipeline: each virtual chunk's gradients exist from that chunk's first backward to its
reduce-scatter after its last backward, not through the whole step.

FSDP builds a module's unsharded gradient in its first backward (autograd creates .grad; the accumulated
gradient is kept across micro-batches while gradient sync is off) and frees it when its post-backward hands
it to the reduce-scatter; PyTorch pipelining turns the sync on for each stage's (chunk's) last backward.
So the rank's memory peak is the largest, over its schedule's steps, of the activations held then plus the
gradients of the chunks live then, not the activation peak plus every chunk's gradients.

All functions are pure and return bytes. They work on one ParallelPlan and, unchanged, on search.grid
PlanArrays (grouped by pipeline shape).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from llmplan.arith import maximum, where
from llmplan.cost.activations import layer_activations
from llmplan.cost.params import RankParams, stage_end_params
from llmplan.cost.schedule import stage_order_arrays
from llmplan.cost.stages import chunk_layers, stage_layers
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan, has_layout


def chunk_gradients_freed(plan: ParallelPlan) -> Any:
    """Whether a rank's gradients live chunk by chunk (chunk_gradient_peak applies): gradients sharded (ZeRO
    stage >= 2) under an interleaved 1F1B pipeline (vpp > 1), every layer's activations alike (no block
    recompute, no activation offload). With one chunk (vpp 1) its gradients are live from the first backward,
    where the activation peak stands: the whole stage's, as before. Elementwise over plan arrays."""
    return ((plan.zero >= 2) & (plan.pp > 1) & (plan.vpp > 1) & (plan.pp_schedule == "1f1b")
            & (plan.recompute_layers is None) & (plan.offload_layers == 0))


def _schedule_walk(p: int, n: int, v: int, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sign, chunk, live) of stage i's order (schedule.stage_order_arrays): +1 per forward / -1 per backward,
    its chunk, and which chunks' gradients are live at that step (from the chunk's first backward through the
    step after its last, while its reduce-scatter runs beside the next backward). Derived:
    docs/formulas.md#mem.grad_lifetime"""
    forward, _, chunk = stage_order_arrays(p, n, v, i)
    sign = np.where(forward, 1.0, -1.0)
    k = np.arange(len(sign))
    live = np.zeros((len(sign), v), dtype=bool)
    for c in range(v):
        back = k[~forward & (chunk == c)]
        live[:, c] = (k >= back.min()) & (k <= back.max() + 1)
    for a in (sign, chunk, live):
        a.setflags(write=False)
    return sign, chunk, live


_walk = lru_cache(maxsize=64)(_schedule_walk)
"""_schedule_walk once per shape in a process (pp_layout plans; a walk holds ~10^5 steps x v)."""


def _held(sign: np.ndarray, step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(activations held after each step, held at each step's moment): a forward counts after it stores its
    activations (`step` bytes), a backward before it frees them. Derived: docs/formulas.md#mem.grad_lifetime"""
    shape = (-1,) + (1,) * (step.ndim - 1)
    held = np.cumsum(sign.reshape(shape) * step, axis=0)
    return held, held + np.where(sign.reshape(shape) < 0, step, 0.0)


def chunk_gradient_peak(sign: np.ndarray, chunk: np.ndarray, live: np.ndarray, act: np.ndarray,
                        grad: np.ndarray) -> Any:
    """Gradient bytes at the rank's joint peak beyond its activation peak: max over steps of (activations held
    + live chunks' gradients) - max over steps of activations held. act / grad: (v, ...) bytes of one chunk
    forward's activations / one chunk's gradients. Derived: docs/formulas.md#mem.grad_lifetime"""
    held, moment = _held(sign, act[chunk])  # (steps, ...)
    grads = np.tensordot(live.astype(float), grad, axes=(1, 0))
    return (moment + grads).max(axis=0) - held.max(axis=0)


def chunk_bytes(m: ModelSpec, plan: Any, stage: Any, rp: RankParams,
                grad_b: Any) -> tuple[np.ndarray, np.ndarray]:
    """(activation bytes of one forward, gradient bytes) of each of stage `stage`'s vpp pp_layout chunks, shape
    (v, ...) (one plan; layouts are not searched as arrays): a chunk's layers at the layer activations
    and gradients of the stage's layers; the embedding's gradients in the first stage's first chunk, the
    output layer's in the last stage's last chunk. Derived: docs/formulas.md#mem.grad_lifetime"""
    la = layer_activations(m, plan)
    n_dense, n_moe = stage_layers(m, plan, stage)
    end = stage_end_params(m, plan, stage)
    layers = maximum(n_dense + n_moe, 1)
    per_layer_grad = (rp.total - end) * grad_b / layers
    split = chunk_layers(m, plan)[int(stage)]
    v = len(split)
    act = np.stack(np.broadcast_arrays(*(d * la.dense + e * la.moe for d, e in split)))
    grad = np.stack(np.broadcast_arrays(*(
        (d + e) * per_layer_grad
        + where((c == 0) & (stage == 0), end, 0.0) * grad_b
        + where((c == v - 1) & (stage == plan.pp - 1), end, 0.0) * grad_b
        for c, (d, e) in enumerate(split))))
    return act * 1.0, grad * 1.0


@lru_cache(maxsize=4096)
def _counts(p: int, n: int, v: int, i: int) -> tuple[np.ndarray, float]:
    """Equal chunks: for each (chunks' gradients live, chunk 0's live, chunk v-1's live) that a step of stage
    i's walk shows, the most chunk forwards held at such a step (as chunk_gradient_peak counts them), and the
    most held at any step: a few rows per pipeline shape, kept once the walk is dropped."""
    sign, _, live = _schedule_walk(p, n, v, i)
    held, moment = _held(sign, np.ones(len(sign)))
    key = (live.sum(axis=1) * 2 + live[:, 0]) * 2 + live[:, -1]
    keys, group = np.unique(key, return_inverse=True)
    most = np.full(len(keys), -np.inf)
    np.maximum.at(most, group.reshape(-1), moment)
    rows = np.stack([most, keys // 4, keys // 2 % 2, keys % 2], axis=1).astype(float)
    return rows, float(held.max())


def equal_chunk_peak(counts: tuple[np.ndarray, float], act: Any, grad: Any, first: Any, last: Any) -> Any:
    """chunk_gradient_peak for v equal chunks of `act` / `grad` bytes each, `first` more gradient bytes on chunk
    0 and `last` on chunk v - 1 (the embedding's, the output layer's), from _counts' distinct steps; elementwise
    over arrays of plans of one pipeline shape. Derived: docs/formulas.md#mem.grad_lifetime"""
    rows, most = counts
    coef = np.stack(np.broadcast_arrays(act * 1.0, grad * 1.0, first * 1.0, last * 1.0))  # (4, ...)
    return np.tensordot(rows, coef, axes=(1, 0)).max(axis=0) - most * coef[0]


def pipelined_gradient_bytes(m: ModelSpec, plan: Any, stage: Any, rp: RankParams, whole: Any,
                             grad_b: Any) -> Any:
    """The gradient bytes a rank of stage `stage` adds to its peak: `whole` (every chunk's unsharded
    gradients, rp x grad_b) where chunk_gradients_freed is off, else chunk_gradient_peak over its schedule
    (pp_layout chunks walked as they are; otherwise v equal chunks, the embedding's gradients on the first
    stage's chunk 0, the output layer's on the last stage's chunk v - 1). Plan arrays: once per pipeline
    shape (pp, micro-batches, vpp, stage). Derived: docs/formulas.md#mem.grad_lifetime"""
    on = chunk_gradients_freed(plan)
    if not np.any(on):
        return whole
    if has_layout(plan):
        act, grad = chunk_bytes(m, plan, stage, rp, grad_b)
        walk = _walk(int(plan.pp), int(plan.num_microbatches), int(plan.vpp), int(stage))
        return chunk_gradient_peak(*walk, act, grad)
    la = layer_activations(m, plan)
    n_dense, n_moe = stage_layers(m, plan, stage)
    end = stage_end_params(m, plan, stage) * grad_b
    v = plan.vpp
    act, grad = (n_dense * la.dense + n_moe * la.moe) / v, (rp.total * grad_b - end) / v
    first, last = where(stage == 0, end, 0.0), where(stage == plan.pp - 1, end, 0.0)
    if np.ndim(plan.pp) == 0:  # one plan
        counts = _counts(int(plan.pp), int(plan.num_microbatches), int(v), int(stage))
        return equal_chunk_peak(counts, act, grad, first, last)
    return _per_pipeline_shape(plan, stage, np.asarray(on), whole, (act, grad, first, last))


def _per_pipeline_shape(plan: Any, stage: Any, on: np.ndarray, whole: Any, parts: tuple[Any, ...]) -> np.ndarray:
    """equal_chunk_peak over plan arrays: `whole` where `on` is off, else the peak of the plan's (pp,
    micro-batches, vpp, stage) walk, each distinct shape walked once; parts: (act, grad, first, last)."""
    out = np.array(np.broadcast_to(whole, on.shape), dtype=float)
    idx = np.flatnonzero(on)
    cols = [np.broadcast_to(x, on.shape)[idx] for x in (plan.pp, plan.num_microbatches, plan.vpp, stage)]
    keys, group = np.unique(np.stack(cols, axis=1).astype(np.int64), axis=0, return_inverse=True)
    chosen = [np.broadcast_to(x, on.shape)[idx] for x in parts]
    for k, key in enumerate(keys):
        sel = group.reshape(-1) == k
        out[idx[sel]] = equal_chunk_peak(_counts(*(int(x) for x in key)), *(x[sel] for x in chosen))
    return out
