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

from llmplan.arith import where
from llmplan.cost.activations import layer_activations
from llmplan.cost.params import layer_params, stage_end_params
from llmplan.cost.schedule import stage_order_arrays
from llmplan.cost.stages import chunk_layers, interleaved_chunk_layers
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
    sets, step_set = np.unique(live, axis=0, return_inverse=True)  # the few distinct live chunk sets
    grads = _weighted_sum(sets.astype(float), grad)[step_set.reshape(-1)]
    return (moment + grads).max(axis=0) - held.max(axis=0)


def _weighted_sum(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """sum over k of w[:, k] * x[k], shape (rows, ...), added in k's order elementwise: the same bits for one
    plan (x: (k,)) as for each plan of an array (x: (k, plans)), which a BLAS tensordot does not promise."""
    shape = (-1,) + (1,) * (x.ndim - 1)
    out = w[:, 0].reshape(shape) * x[0]
    for k in range(1, w.shape[1]):
        out = out + w[:, k].reshape(shape) * x[k]
    return np.asarray(out, dtype=float)


def _layer_bytes(m: ModelSpec, plan: Any, dense: Any, moe: Any, grad_b: Any) -> tuple[np.ndarray, np.ndarray]:
    """(activation bytes of one forward, gradient bytes) of chunks of `dense` dense and `moe` MoE layers, shape
    (v, ...): a dense layer's and a MoE layer's activations and parameters (its routed experts included), as
    _rank_params counts them. Derived: docs/formulas.md#mem.grad_lifetime"""
    la = layer_activations(m, plan)
    dense_p, moe_p = layer_params(m, plan)
    return dense * la.dense + moe * la.moe, (dense * dense_p + moe * moe_p) * grad_b


def chunk_bytes(m: ModelSpec, plan: Any, stage: Any, grad_b: Any) -> tuple[np.ndarray, np.ndarray]:
    """(activation bytes of one forward, gradient bytes) of each of stage `stage`'s vpp pp_layout chunks, shape
    (v, ...) (one plan; layouts are not searched as arrays): a chunk's dense and MoE layers (_layer_bytes); the
    embedding's gradients in the first stage's first chunk, the output layer's in the last stage's last chunk.
    Derived: docs/formulas.md#mem.grad_lifetime"""
    split = chunk_layers(m, plan)[int(stage)]
    dense, moe = (np.asarray([x[k] for x in split], dtype=float) for k in (0, 1))
    act, grad = _layer_bytes(m, plan, dense.reshape((-1,) + (1,) * np.ndim(plan.pp)),
                             moe.reshape((-1,) + (1,) * np.ndim(plan.pp)), grad_b)
    end = stage_end_params(m, plan, stage) * grad_b
    return act * 1.0, _with_ends(grad, where(stage == 0, end, 0.0), where(stage == plan.pp - 1, end, 0.0))


def _with_ends(grad: np.ndarray, first: Any, last: Any) -> np.ndarray:
    """Chunk gradients (v, ...) with the embedding's on chunk 0 and the output layer's on chunk v - 1."""
    out = np.array(np.broadcast_arrays(grad, first, last)[0], dtype=float)
    out[0] = out[0] + first
    out[-1] = out[-1] + last
    return out


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
    return _weighted_sum(rows, coef).max(axis=0) - most * coef[0]


def pipelined_gradient_bytes(m: ModelSpec, plan: Any, stage: Any, whole: Any, grad_b: Any) -> Any:
    """The gradient bytes a rank of stage `stage` adds to its peak: `whole` (every chunk's unsharded
    gradients) where chunk_gradients_freed is off, else chunk_gradient_peak over its schedule (pp_layout chunks
    as they are; otherwise stages.interleaved_chunk_layers' chunks, the embedding's gradients on the first
    stage's chunk 0, the output layer's on the last stage's chunk v - 1; chunks alike by _counts). Plan
    arrays: once per pipeline shape (pp, micro-batches, vpp, stage). Derived: docs/formulas.md#mem.grad_lifetime"""
    on = chunk_gradients_freed(plan)
    if not np.any(on):
        return whole
    if has_layout(plan):
        act, grad = chunk_bytes(m, plan, stage, grad_b)
        walk = _walk(int(plan.pp), int(plan.num_microbatches), int(plan.vpp), int(stage))
        return chunk_gradient_peak(*walk, act, grad)
    dense, moe = interleaved_chunk_layers(m, plan, stage)  # (max vpp, ...)
    act, grad = _layer_bytes(m, plan, dense, moe, grad_b)
    end = stage_end_params(m, plan, stage) * grad_b
    first, last = where(stage == 0, end, 0.0), where(stage == plan.pp - 1, end, 0.0)
    # chunks that differ from chunk 0 (a dense first layer, a hybrid's MoE layers, the MTP modules) are walked
    alike = np.all((dense == dense[:1]) & (moe == moe[:1]) | (np.arange(len(dense)).reshape(
        (-1,) + (1,) * (dense.ndim - 1)) >= plan.vpp), axis=0)
    if np.ndim(plan.pp) == 0:  # one plan
        shape = (int(plan.pp), int(plan.num_microbatches), int(plan.vpp), int(stage))
        if alike:
            return equal_chunk_peak(_counts(*shape), act[0], grad[0], first, last)
        v = shape[2]
        return chunk_gradient_peak(*_walk(*shape), act[:v], _with_ends(grad[:v], first, last))
    return _per_pipeline_shape(plan, stage, np.asarray(on), whole, act, grad, first, last, alike)


WALK_BLOCK = 256
"""Plans walked together in the plan-array path's step-by-step walk (bounds its (steps, plans) arrays)."""


def _per_pipeline_shape(plan: Any, stage: Any, on: np.ndarray, whole: Any, act: np.ndarray, grad: np.ndarray,
                        first: Any, last: Any, alike: Any) -> np.ndarray:
    """pipelined_gradient_bytes over plan arrays: `whole` where `on` is off, else the peak of the plan's (pp,
    micro-batches, vpp, stage) walk, each distinct shape once: equal_chunk_peak where the plan's chunks are
    alike, else chunk_gradient_peak on its chunks (act / grad: (max vpp, plans))."""
    n = on.shape
    out = np.array(np.broadcast_to(whole, n), dtype=float)
    idx = np.flatnonzero(on)
    cols = [np.broadcast_to(x, n)[idx] for x in (plan.pp, plan.num_microbatches, plan.vpp, stage)]
    keys, group = np.unique(np.stack(cols, axis=1).astype(np.int64), axis=0, return_inverse=True)
    act, grad = (np.broadcast_to(x, x.shape[:1] + n)[:, idx] for x in (act, grad))
    first, last, same = (np.broadcast_to(x, n)[idx] for x in (first, last, alike))
    for k, key in enumerate(keys):
        shape = tuple(int(x) for x in key)
        sel = np.flatnonzero((group.reshape(-1) == k) & same)
        out[idx[sel]] = equal_chunk_peak(_counts(*shape), act[0, sel], grad[0, sel], first[sel], last[sel])
        walked = np.flatnonzero((group.reshape(-1) == k) & ~same)
        for b in range(0, len(walked), WALK_BLOCK):
            w, v = walked[b:b + WALK_BLOCK], shape[2]
            g = _with_ends(grad[:v, w], first[w], last[w])
            out[idx[w]] = chunk_gradient_peak(*_walk(*shape), act[:v, w], g)
    return out
