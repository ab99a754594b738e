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
    """(activation bytes of one forward, gradient bytes) of each of stage `stage`'s vpp chunks, shape (v, ...):
    a chunk's layers (pp_layout chunks, else the stage's layers in v equal chunks) at the layer activations
    and gradients of the stage's layers; the embedding's gradients in the first stage's first chunk, the
    output layer's in the last stage's last chunk. Derived: docs/formulas.md#mem.grad_lifetime"""
    la = layer_activations(m, plan)
    n_dense, n_moe = stage_layers(m, plan, stage)
    end = stage_end_params(m, plan, stage)
    layers = maximum(n_dense + n_moe, 1)
    per_layer_grad = (rp.total - end) * grad_b / layers
    v = int(np.max(plan.vpp))
    if has_layout(plan):
        split = chunk_layers(m, plan)[int(stage)]
    else:
        split = [(n_dense / v, n_moe / v)] * v
    act = np.stack(np.broadcast_arrays(*(d * la.dense + e * la.moe for d, e in split)))
    grad = np.stack(np.broadcast_arrays(*(
        (d + e) * per_layer_grad
        + where((c == 0) & (stage == 0), end, 0.0) * grad_b
        + where((c == v - 1) & (stage == plan.pp - 1), end, 0.0) * grad_b
        for c, (d, e) in enumerate(split))))
    return act * 1.0, grad * 1.0


def pipelined_gradient_bytes(m: ModelSpec, plan: Any, stage: Any, rp: RankParams, whole: Any,
                             grad_b: Any) -> Any:
    """The gradient bytes a rank of stage `stage` adds to its peak: `whole` (every chunk's unsharded
    gradients, rp x grad_b) where chunk_gradients_freed is off, else chunk_gradient_peak over its schedule.
    Plan arrays: walked once per pipeline shape (pp, micro-batches, vpp, stage).
    Derived: docs/formulas.md#mem.grad_lifetime"""
    on = chunk_gradients_freed(plan)
    if not np.any(on):
        return whole
    if np.ndim(plan.pp) == 0:  # one plan
        act, grad = chunk_bytes(m, plan, stage, rp, grad_b)
        walk = _walk(int(plan.pp), int(plan.num_microbatches), int(plan.vpp), int(stage))
        return chunk_gradient_peak(*walk, act, grad)
    return _on_shapes(m, plan, stage, rp, whole, grad_b, np.asarray(on))


def _on_shapes(m: ModelSpec, plan: Any, stage: Any, rp: RankParams, whole: Any, grad_b: Any,
               on: np.ndarray) -> Any:
    """pipelined_gradient_bytes on plan arrays: each pipeline shape's plans walked together."""
    out = np.array(np.broadcast_to(whole, on.shape), dtype=float)
    stages = np.broadcast_to(stage, on.shape)
    shape = np.stack([np.broadcast_to(x, on.shape) for x in
                      (plan.pp, plan.num_microbatches, plan.vpp, stages)], axis=1).astype(np.int64)
    for key in np.unique(shape[on], axis=0):
        rows = np.flatnonzero(on & (shape == key).all(axis=1))
        sub = plan.take(rows)
        sub_rp = RankParams(dense=np.asarray(rp.dense)[rows] if np.ndim(rp.dense) else rp.dense,
                            expert=np.asarray(rp.expert)[rows] if np.ndim(rp.expert) else rp.expert)
        g = np.asarray(grad_b)[rows] if np.ndim(grad_b) else grad_b
        act, grad = chunk_bytes(m, sub, int(key[3]), sub_rp, g)
        out[rows] = chunk_gradient_peak(*_walk(*(int(x) for x in key)), act, grad)
    return out
