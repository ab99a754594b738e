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
from llmplan.cost.schedule import stage_order_cached
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


@lru_cache(maxsize=1024)
def _walk(p: int, n: int, v: int, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sign, chunk, live) of stage i's order: +1 per forward / -1 per backward, its chunk, and which chunks'
    gradients are live at that step (from the chunk's first backward through the step after its last, while
    its reduce-scatter runs beside the next backward). Derived: docs/formulas.md#mem.grad_lifetime"""
    order = stage_order_cached(p, n, v, i)
    sign = np.asarray([1.0 if kind == "forward" else -1.0 for kind, _, _ in order])
    chunk = np.asarray([c for _, _, c in order], dtype=np.intp)
    k = np.arange(len(order))
    live = np.zeros((len(order), v))
    for c in range(v):
        back = k[(sign < 0) & (chunk == c)]
        live[:, c] = (k >= back.min()) & (k <= back.max() + 1)
    for a in (sign, chunk, live):
        a.setflags(write=False)
    return sign, chunk, live


def chunk_gradient_peak(sign: np.ndarray, chunk: np.ndarray, live: np.ndarray, act: np.ndarray,
                        grad: np.ndarray) -> Any:
    """Gradient bytes at the rank's joint peak beyond its activation peak: max over steps of (activations held
    + live chunks' gradients) - max over steps of activations held. act / grad: (v, ...) bytes of one chunk
    forward's activations / one chunk's gradients. A forward counts after it stores its activations, a
    backward before it frees them. Derived: docs/formulas.md#mem.grad_lifetime"""
    step = act[chunk]  # (steps, ...)
    shape = (-1,) + (1,) * (step.ndim - 1)
    held = np.cumsum(sign.reshape(shape) * step, axis=0)
    moment = held + np.where(sign.reshape(shape) < 0, step, 0.0)
    grads = np.tensordot(live, grad, axes=(1, 0))
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
    i's order shows, the most chunk forwards held at such a step (as chunk_gradient_peak counts them), and the
    most held at any step. Builds schedule.stage_order's sequence in numpy (the search asks for hundreds of
    shapes of up to ~10^5 steps); tests/test_grad_lifetime.py checks it against the walk of stage_order."""
    if n % p == 0:  # whole groups of p micro-batches (what interleaving runs)
        fwd, bwd = np.tile(np.repeat(np.arange(v), p), n // p), np.tile(np.repeat(np.arange(v)[::-1], p), n // p)
    else:
        sizes = [min(g + p, n) - g for g in range(0, n, p)]
        fwd = np.concatenate([np.repeat(np.arange(v), s) for s in sizes])
        bwd = np.concatenate([np.repeat(np.arange(v)[::-1], s) for s in sizes])
    warm = min(p - i - 1 if v == 1 else 2 * (p - i - 1) + (v - 1) * p, n * v)
    steady = n * v - warm
    mid_sign, mid_chunk = np.tile([1.0, -1.0], steady), np.empty(2 * steady, dtype=np.intp)
    mid_chunk[0::2], mid_chunk[1::2] = fwd[warm:], bwd[:steady]
    sign = np.concatenate([np.ones(warm), mid_sign, -np.ones(warm)])
    chunk = np.concatenate([fwd[:warm], mid_chunk, bwd[steady:]])
    held = np.cumsum(sign)
    moment = held + (sign < 0)
    k, back = np.arange(len(sign)), np.flatnonzero(sign < 0)
    first, last = np.full(v, len(sign)), np.zeros(v, dtype=np.intp)
    np.minimum.at(first, chunk[back], back)
    np.maximum.at(last, chunk[back], back)
    diff = np.zeros(len(sign) + 2)
    np.add.at(diff, first, 1.0)
    np.add.at(diff, last + 2, -1.0)
    live = np.cumsum(diff)[: len(sign)]
    ends = [((k >= first[c]) & (k <= last[c] + 1)).astype(np.intp) for c in (0, v - 1)]
    key = (live.astype(np.intp) * 2 + ends[0]) * 2 + ends[1]
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
    on = np.asarray(on)
    out = np.array(np.broadcast_to(whole, on.shape), dtype=float)
    cols = [np.broadcast_to(x, on.shape) for x in (plan.pp, plan.num_microbatches, v, stage)]
    shape = np.stack(cols, axis=1).astype(np.int64)[on]
    idx = np.flatnonzero(on)
    keys, group = np.unique(shape, axis=0, return_inverse=True)
    parts = [np.broadcast_to(x, on.shape)[idx] for x in (act, grad, first, last)]
    for k, key in enumerate(keys):
        sel = group.reshape(-1) == k
        out[idx[sel]] = equal_chunk_peak(_counts(*(int(x) for x in key)), *(x[sel] for x in parts))
    return out
