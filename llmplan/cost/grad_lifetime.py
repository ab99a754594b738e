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

from llmplan.arith import minimum, where
from llmplan.cost.activations import shared_layer_activations
from llmplan.cost.params import layer_params, mtp_block_extra_params, stage_end_params
from llmplan.cost.schedule import stage_order_arrays
from llmplan.cost.stages import (
    chunk_kinds,
    chunk_layers,
    layout_grid,
    mtp_weight_sets,
    layers_before,
    stage_layer_count,
    stage_mtp_modules,
)
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
    first_step, step_set = np.unique(_live_key(live), return_index=True, return_inverse=True)[1:]
    grads = _weighted_sum(live[first_step].astype(float), grad)[step_set.reshape(-1)]  # the few distinct live sets
    return (moment + grads).max(axis=0) - held.max(axis=0)


def _live_key(live: np.ndarray) -> np.ndarray:
    """One integer per row of a (steps, v) bool array, equal where the rows are equal."""
    packed = np.packbits(live, axis=1, bitorder="little")  # (steps, bytes)
    if packed.shape[1] > 7:
        return np.unique(packed, axis=0, return_inverse=True)[1].reshape(-1)
    return packed.astype(np.int64) @ (256 ** np.arange(packed.shape[1], dtype=np.int64))


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
    la = shared_layer_activations(m, plan)
    dense_p, moe_p = layer_params(m, plan)
    return dense * la.dense + moe * la.moe, (dense * dense_p + moe * moe_p) * grad_b


def mtp_weight_correction(m: ModelSpec, plan: Any, mtp: Any) -> Any:
    """Parameters to add to a chunk's layers for its `mtp` MTP modules, which it counts as layers (stage_layers'
    kind): each weight set's block extra (mtp_block_extra_params) less, under mtp_repeated_layer, the layers of
    the depths that rerun one module's weights (cost.stages.mtp_weight_sets), whose gradients are the one
    module's. Elementwise. Derived: docs/formulas.md#mem.grad_lifetime"""
    sets = minimum(mtp, mtp_weight_sets(m)) if m.mtp_repeated_layer else mtp
    dense_p, moe_p = layer_params(m, plan)
    return sets * mtp_block_extra_params(m, plan) - (mtp - sets) * (moe_p if m.is_moe else dense_p)


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
    mtp = np.asarray([c.count("m") for c in layout_grid(plan)[int(stage)]], dtype=float)  # MTP blocks' extra
    grad = grad + (mtp_weight_correction(m, plan, mtp) * grad_b).reshape((-1,) + (1,) * np.ndim(plan.pp))
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


def _upper_rows(rows: np.ndarray) -> np.ndarray:
    """The distinct rows of `rows` that no other row bounds from above in every column: with non-negative
    weights, the largest weighted sum over all rows is among them."""
    r = np.unique(rows, axis=0)
    below = np.all(r[:, None, :] <= r[None, :, :], axis=2)  # below[a, b]: row b >= row a in every column
    return r[below.sum(axis=1) == 1]  # bounded only by itself (the rows are distinct)


@lru_cache(maxsize=4096)
def _chunk_counts(p: int, n: int, v: int, i: int) -> tuple[np.ndarray, np.ndarray]:
    """Chunks of unlike sizes: the rows (chunk c's forwards held at a step's moment, for each c, as
    chunk_gradient_peak counts them; then whether chunk c's gradients are live, for each c), shape (rows, 2v),
    and the rows of chunk forwards held after a step, shape (rows, v), that stage i's walk shows, less those
    another row bounds from above (bytes are non-negative, so the peaks are among the rest): a few dozen rows
    per pipeline shape, kept once the walk is dropped. Derived: docs/formulas.md#mem.grad_lifetime"""
    forward, _, chunk = stage_order_arrays(p, n, v, i)
    k, sign, back = np.arange(len(forward)), np.where(forward, 1, -1), ~forward
    bits = int(np.max(np.cumsum(sign) + back)).bit_length()  # a chunk holds at most every held forward
    place = _fields([bits] * v + [1] * v)  # each step's row packed: chunk c's count, then its live flag
    at = np.asarray(place[:v])  # (word, shift) of each chunk's count
    word, shift = at[chunk, 0], at[chunk, 1]
    held = [np.cumsum(np.where(word == w, sign << shift, 0)) for w in range(place[-1][0] + 1)]
    joint = [h + np.where((word == w) & back, 1 << shift, 0) for w, h in enumerate(held)]
    first, last = np.zeros(v, dtype=np.int64), np.zeros(v, dtype=np.int64)
    first[chunk[back][::-1]], last[chunk[back]] = k[back][::-1], k[back]  # each chunk's first and last backward
    flag, flag_shift = (np.asarray(x) for x in zip(*place[v:], strict=True))
    for w in range(len(joint)):  # live: from a chunk's first backward through the step after its last
        step = np.zeros(len(k) + 2, dtype=np.int64)
        np.add.at(step, first, np.where(flag == w, 1 << flag_shift, 0))
        np.add.at(step, last + 2, np.where(flag == w, -(1 << flag_shift), 0))
        joint[w] = joint[w] + np.cumsum(step[:-2])
    # a forward's row is bounded by the next step's (it counts the same forwards held, or one more) unless a
    # chunk's gradients stop being live between them; a backward's held row by the step's before it
    ends = np.zeros(len(k) + 1, dtype=bool)
    ends[last + 1], ends[-2] = True, True
    ends = ends[:-1]
    joint_rows = _unpack([x[back | ends] for x in joint], place)
    return _upper_rows(joint_rows), _upper_rows(_unpack([x[forward] for x in held], place[:v]))


def _fields(widths: list[int]) -> list[tuple[int, int]]:
    """(word, shift) of bit fields of `widths`, packed in order into 63-bit words."""
    out, w, s = [], 0, 0
    for width in widths:
        if s + width > 63:
            w, s = w + 1, 0
        out.append((w, s))
        s += width
    return out


def _unpack(words: list[np.ndarray], place: list[tuple[int, int]]) -> np.ndarray:
    """The distinct rows of packed step words (`place`: _fields' (word, shift) of each column; a column runs to
    the next one's shift or to 63 bits), unpacked to floats, shape (rows, len(place))."""
    if len(words) == 1:
        rows = np.unique(words[0]).reshape(1, -1)
    else:
        order = np.lexsort(words[::-1])
        packed = np.stack(words)[:, order]
        rows = packed[:, np.concatenate([[True], np.any(packed[:, 1:] != packed[:, :-1], axis=0)])]
    ends = [s2 if w2 == w else 63 for (w, _), (w2, s2) in zip(place, place[1:] + [(-1, 63)], strict=True)]
    return np.stack([rows[w] >> s & ((1 << (e - s)) - 1) for (w, s), e in zip(place, ends, strict=True)],
                    axis=1).astype(float)


@lru_cache(maxsize=4096)
def _kind_counts(shape: tuple[int, int, int, int], dense: tuple[float, ...],
                 moe: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    """_chunk_counts' rows for chunks of `dense` / `moe` layers each (chunk_kinds), summed over the chunks by
    layer kind: (dense layers' forwards held, MoE layers' held, dense layers' gradients live, MoE layers' live,
    chunk 0's gradients live, chunk v - 1's), shape (rows, 6), and (dense held, MoE held) after a step, shape
    (rows, 2), less the rows another bounds from above. Derived: docs/formulas.md#mem.grad_lifetime"""
    joint, held = _chunk_counts(*shape)
    v = shape[2]
    d, e = np.asarray(dense, dtype=float), np.asarray(moe, dtype=float)
    moment, live = joint[:, :v], joint[:, v:]
    rows = np.stack([moment @ d, moment @ e, live @ d, live @ e, live[:, 0], live[:, -1]], axis=1)
    return _upper_rows(rows), _upper_rows(np.stack([held @ d, held @ e], axis=1))


def kind_chunk_peak(shape: tuple[int, int, int, int], dense: tuple[float, ...], moe: tuple[float, ...],
                    layer: tuple[Any, Any, Any, Any, Any], first: Any, last: Any) -> Any:
    """chunk_gradient_peak of stage shape[3] of a (pp, micro-batches, vpp, stage) pipeline whose chunks hold
    `dense` / `moe` layers each, in closed form: with layer = (a dense layer's activation bytes, a MoE layer's,
    a dense layer's parameters, a MoE layer's, bytes per gradient) and `first` / `last` gradient bytes more on
    chunk 0 / v - 1, max over _kind_counts' rows of row x (layer bytes, first, last) less max over its held
    rows x activations; equal_chunk_peak where every chunk is alike. Elementwise over plans of that shape and
    those chunks (one plan or an array: the same bits). Derived: docs/formulas.md#mem.grad_lifetime"""
    act_d, act_e, param_d, param_e, grad_b = layer
    if len(set(zip(dense, moe, strict=True))) == 1:  # v equal chunks
        act, grad = dense[0] * act_d + moe[0] * act_e, (dense[0] * param_d + moe[0] * param_e) * grad_b
        return equal_chunk_peak(_counts(*shape), act, grad, first, last)
    rows, held = _kind_counts(shape, dense, moe)
    coef = np.stack(np.broadcast_arrays(act_d * 1.0, act_e * 1.0, param_d * grad_b, param_e * grad_b,
                                        first * 1.0, last * 1.0))
    return _weighted_sum(rows, coef).max(axis=0) - _weighted_sum(held, coef[:2]).max(axis=0)


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
    stage's chunk 0, the output layer's on the last stage's chunk v - 1, by kind_chunk_peak). Plan arrays:
    once per pipeline shape (pp, micro-batches, vpp, stage) and chunks' layers.
    Derived: docs/formulas.md#mem.grad_lifetime"""
    on = chunk_gradients_freed(plan)
    if not np.any(on):
        return whole
    if has_layout(plan):
        act, grad = chunk_bytes(m, plan, stage, grad_b)
        walk = _walk(int(plan.pp), int(plan.num_microbatches), int(plan.vpp), int(stage))
        return chunk_gradient_peak(*walk, act, grad)
    la = shared_layer_activations(m, plan)
    dense_p, moe_p = layer_params(m, plan)
    end = stage_end_params(m, plan, stage) * grad_b
    mtp = mtp_weight_correction(m, plan, stage_mtp_modules(m, plan, stage)) * grad_b  # last stage's last chunk
    parts = (la.dense, la.moe, dense_p, moe_p, grad_b, where(stage == 0, end, 0.0),
             where(stage == plan.pp - 1, end, 0.0) + mtp)
    rank = (plan.pp, plan.num_microbatches, plan.vpp, stage, stage_layer_count(m, plan, stage),
            stage_mtp_modules(m, plan, stage), layers_before(m, plan, stage))
    if np.ndim(plan.pp) == 0:  # one plan
        return _rank_peak(m, tuple(int(x) for x in rank), parts)
    out = np.array(np.broadcast_to(whole, np.shape(on)), dtype=float)
    idx = np.flatnonzero(on)
    cols = [np.broadcast_to(x, np.shape(on))[idx].astype(np.int64) for x in rank]
    _, pick, group = np.unique(_rank_keys(cols), return_index=True, return_inverse=True)
    chosen = [np.broadcast_to(x, np.shape(on))[idx] for x in parts]
    members = np.argsort(group.reshape(-1), kind="stable")  # each rank's plans in order, one sort for all ranks
    ends = np.cumsum(np.bincount(group.reshape(-1), minlength=len(pick)))
    for k, at in enumerate(pick):  # a few hundred distinct ranks in a search
        sel = members[(ends[k - 1] if k else 0):ends[k]]
        out[idx[sel]] = _rank_peak(m, tuple(int(col[at]) for col in cols), [x[sel] for x in chosen])
    return out


def _rank_keys(cols: list[np.ndarray]) -> np.ndarray:
    """One integer per plan, equal where every column is (mixed radix over each column's range: one sort for
    np.unique, not one per column; np.unique(axis=0) sorts slowly); ranks of the columns' values where the
    radix product would not fit 62 bits."""
    key = np.zeros(len(cols[0]), dtype=np.int64)
    if float(np.prod([float(c.max() - c.min() + 1) for c in cols])) < 2.0**62:
        for col in cols:
            key = key * int(col.max() - col.min() + 1) + (col - col.min())
        return key
    for col in cols:
        values, which = np.unique(col, return_inverse=True)
        key = np.unique(key * len(values) + which.reshape(-1), return_inverse=True)[1].reshape(-1)
    return key


def _rank_peak(m: ModelSpec, rank: tuple[int, ...], parts: Any) -> Any:
    """kind_chunk_peak of the rank (pp, micro-batches, vpp, stage, its layers, its MTP modules, layers before
    it) without a pp_layout; parts: (kind_chunk_peak's five layer parts, first, last), one plan's or arrays."""
    p, n, v, i, layers, mtp, before = rank
    dense, moe = chunk_kinds(m, layers, mtp, before, v)
    return kind_chunk_peak((p, n, v, i), tuple(float(x) for x in dense), tuple(float(x) for x in moe),
                           (parts[0], parts[1], parts[2], parts[3], parts[4]), parts[5], parts[6])
