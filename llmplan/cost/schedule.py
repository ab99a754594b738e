"""The pipeline schedule as a timeline: when each stage runs each micro-batch's forward and backward.

The step-time model prices the schedule in closed form (docs/formulas.md#step.time); this simulation
lays the same schedule out slot by slot so that `llmplan report` can draw it, interleaving included. It
draws no point-to-point transfer time (drawn schedules show compute and bubbles); `makespan` can give each
send between stages a time, which shows how many sends lie on the step's critical path (step.pp_critical).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Union

import numpy as np


@dataclass(frozen=True)
class Slot:
    """One forward or backward of one micro-batch (one model chunk with interleaving) on one stage."""

    stage: int
    kind: str
    """"forward" or "backward"."""
    microbatch: int
    chunk: int
    """Virtual-pipeline chunk (0 without interleaving)."""
    start: float
    """Seconds from the start of the step."""
    end: float


def warmup_forwards(p: int, n: int, v: int, i: int) -> int:
    """Forwards stage i runs before its first backward: p - i - 1 in 1F1B, 2(p - i - 1) + (v - 1)p interleaved,
    at most all n·v of them. Source: Narayanan et al. 2021 §2.2; Megatron-LM pipeline_parallel/schedules.py.
    Derived: docs/formulas.md#pipeline.schedule"""
    return min(p - i - 1 if v == 1 else 2 * (p - i - 1) + (v - 1) * p, n * v)


def stage_order_arrays(p: int, n: int, v: int, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """stage_order as arrays, one entry per pass: (whether it is a forward, its micro-batch, its chunk); built in
    numpy since the memory model walks hundreds of pipeline shapes of up to ~10^5 passes (cost.grad_lifetime).
    Derived: docs/formulas.md#pipeline.schedule"""
    # micro-batches go through the chunks p at a time: n // p groups of p, then one of the n % p left
    blocks = [(start, count, size) for start, count, size in ((0, n // p, p), (n - n % p, 1, n % p)) if count * size]
    shapes = [(count, v, size) for _, count, size in blocks]
    mb = np.concatenate([np.broadcast_to(start + np.arange(count)[:, None, None] * size + np.arange(size), shape)
                         .ravel() for (start, count, size), shape in zip(blocks, shapes, strict=True)])
    fwd_chunk, bwd_chunk = (np.concatenate([np.broadcast_to(order[:, None], shape).ravel() for shape in shapes])
                            for order in (np.arange(v), np.arange(v)[::-1]))
    warm = warmup_forwards(p, n, v, i)
    steady = n * v - warm

    def weave(fwd: np.ndarray, bwd: np.ndarray) -> np.ndarray:  # warm-up, forward / backward pairs, cool-down
        mid = np.empty(2 * steady, dtype=fwd.dtype)
        mid[0::2], mid[1::2] = fwd[warm:], bwd[:steady]
        return np.concatenate([fwd[:warm], mid, bwd[steady:]])

    forward = weave(np.ones(n * v, dtype=bool), np.zeros(n * v, dtype=bool))
    return forward, weave(mb, mb), weave(fwd_chunk, bwd_chunk)


def stage_order(p: int, n: int, v: int, i: int) -> list[tuple[str, int, int]]:
    """(kind, micro-batch, chunk) in the order stage i runs them: warm-up forwards (warmup_forwards), then one
    forward / one backward, then the remaining backwards. Interleaved (v > 1): micro-batches go through the
    chunks in groups of p, the backwards through them last chunk first.
    Source: Narayanan et al. 2021 §2.2 (1F1B and interleaved 1F1B); Megatron-LM pipeline_parallel/schedules.py.
    Derived: docs/formulas.md#pipeline.schedule"""
    forward, mb, chunk = stage_order_arrays(p, n, v, i)
    return [("forward" if f else "backward", b, c) for f, b, c in zip(forward.tolist(), mb.tolist(), chunk.tolist(),
                                                                      strict=True)]


@lru_cache(maxsize=1024)
def stage_order_cached(p: int, n: int, v: int, i: int) -> tuple[tuple[str, int, int], ...]:
    """stage_order as a tuple, built once per (p, n, v, i) in a process: the search's layout pass prices
    several plans of one pipeline shape, each walking every stage's order for its memory and its schedule."""
    return tuple(stage_order(p, n, v, i))


def pipeline_schedule(forward_s: list[float], backward_s: list[float], n: int, v: int = 1,
                      chunk_share: list[list[float]] | None = None, transfer_s: float = 0.0) -> list[Slot]:
    """Every slot of one step: forward_s / backward_s are each stage's per-micro-batch times (all its chunks
    together), n the micro-batches, v the virtual stages per rank, chunk_share[i][c] the share of stage i's
    time its chunk c takes (default 1/v each; a custom pipeline layout's chunks differ). Each stage runs its
    slots in stage_order, a slot starting when the stage is free and its input has arrived.
    Derived: docs/formulas.md#pipeline.schedule"""
    slots: list[Slot] = []
    _simulate(forward_s, backward_s, n, v, chunk_share, slots, transfer_s)
    return sorted(slots, key=lambda s: (s.stage, s.start))


def _simulate(forward_s: list[float], backward_s: list[float], n: int, v: int,
              chunk_share: list[list[float]] | None, slots: list[Slot] | None,
              transfer_s: float = 0.0) -> list[float]:
    """Each stage's end time under pipeline_schedule's rules (appending every slot to `slots` when given).
    A forward waits for the previous stage's forward of its chunk (stage 0's chunk c > 0: the last stage's
    chunk c - 1); a backward for the next stage's backward (the last stage's chunk c < v - 1: stage 0's chunk
    c + 1; its last chunk: its own forward). Each pass starts when its stage is free and its input is done, in
    an order where both are known (_pass_order, from the dependencies alone). An input made on another stage
    arrives transfer_s after its pass ends (the send between the two ranks)."""
    p = len(forward_s)
    share = chunk_share or [[1 / v] * v for _ in range(p)]
    passes, last = _pass_order(p, n, v)
    # seconds of each stage's pass kinds: stage i's forward of chunk c at 2vi + c, its backward at 2vi + v + c
    took = [t * share[i][c] for i in range(p) for t in (forward_s[i], backward_s[i]) for c in range(v)]
    done = [0.0] * (2 * p * n * v + 1)  # finish times; the last entry: the input of a pass that waits for nothing
    if transfer_s:
        nv, zero = n * v, 2 * p * n * v
        hop = [transfer_s if dep < zero and dep // nv % p != own // nv % p else 0.0 for own, _, dep, _ in passes]
    else:
        hop = [0.0] * len(passes)
    for (own, prev, dep, kind), h in zip(passes, hop, strict=True):
        done[own] = max(done[prev], done[dep] + h) + took[kind]
    if slots is not None:
        for (own, prev, dep, kind), h in zip(passes, hop, strict=True):
            i, (mb, c) = own // (n * v) % p, divmod(own % (n * v), v)
            start = max(done[prev], done[dep] + h)
            slots.append(Slot(i, "forward" if kind % (2 * v) < v else "backward", mb, c, start, done[own]))
    return [done[k] for k in last]


@lru_cache(maxsize=256)
def _pass_order(p: int, n: int, v: int) -> tuple[tuple[tuple[int, int, int, int], ...], tuple[int, ...]]:
    """Every pass of the schedule as (where its finish time goes, where its stage's previous pass's is, where
    its input's is, its kind's index in _simulate's seconds), in the order the stages can run them: sweeps over
    the stages, each running its passes in stage_order while their inputs are done; and each stage's last pass."""
    steps = _steps(p, n, v)
    zero = 2 * p * n * v
    finished = [False] * zero + [True]
    nxt, prev = [0] * p, [zero] * p
    out: list[tuple[int, int, int, int]] = []
    while len(out) < zero:
        moved = False
        for i in range(p):
            order, k = steps[i], nxt[i]
            while k < len(order) and finished[order[k][1]]:
                own, dep, kind = order[k]
                out.append((own, prev[i], dep, 2 * v * i + kind))
                finished[own], prev[i] = True, own
                k += 1
            moved = moved or k > nxt[i]
            nxt[i] = k
        if not moved:
            raise RuntimeError(f"pipeline schedule deadlocked (p={p}, n={n}, v={v})")  # a bug, not user input
    return tuple(out), tuple(prev)


@lru_cache(maxsize=256)
def _steps(p: int, n: int, v: int) -> tuple[tuple[tuple[int, int, int], ...], ...]:
    """Per stage, its passes in stage_order as (where its finish time goes, where its input's is, pass kind:
    c for a forward of chunk c, v + c for a backward) in _simulate's list: stage i's forward of micro-batch
    mb, chunk c at i·n·v + mb·v + c, its backward p·n·v further, 2·p·n·v for no input."""
    nv = n * v
    fwd = lambda i, j: i * nv + j  # noqa: E731
    bwd = lambda i, j: (p + i) * nv + j  # noqa: E731
    out = []
    for i in range(p):
        row = []
        for kind, mb, c in stage_order_cached(p, n, v, i):
            j = mb * v + c
            if kind == "forward":
                dep = fwd(i - 1, j) if i > 0 else (fwd(p - 1, j - 1) if c > 0 else 2 * p * nv)
                row.append((fwd(i, j), dep, c))
            else:
                dep = bwd(i + 1, j) if i < p - 1 else (bwd(0, j + 1) if c < v - 1 else fwd(p - 1, j))
                row.append((bwd(i, j), dep, v + c))
        out.append(tuple(row))
    return tuple(out)


def makespan(forward_s: list[float], backward_s: list[float], n: int, v: int = 1,
             chunk_share: list[list[float]] | None = None, transfer_s: float = 0.0) -> float:
    """Seconds from the first forward to the last backward of pipeline_schedule (a stage's slots end in order,
    so its last one ends latest), each send between stages taking transfer_s. Derived:
    docs/formulas.md#pipeline.schedule, docs/formulas.md#step.pp_critical"""
    return max(_simulate(forward_s, backward_s, n, v, chunk_share, None, transfer_s))


# Schedules that split the backward (zero bubble, DualPipe) run three kinds of pass: the forward, the backward
# for the input gradient ("backward-input", half the backward here: W = B/2 as in step.schedule) and the
# backward for the weight gradient ("backward-weight", the other half), which waits for nothing but its own
# backward-input and so can fill a bubble. Derived: docs/formulas.md#pipeline.schedule
Op = tuple[str, int, int]
"""(kind, micro-batch, chunk): the chunk is DualPipe's direction (0: entered at stage 0, 1: at the last)."""
Key = tuple[str, int, int, int]
"""(pass class F / B / W, rank, micro-batch, chunk): a finished pass."""
WEIGHT: Op = ("backward-weight", -1, -1)
"""In an order: run the oldest weight pass waiting on this rank."""
_CLASS = {"forward": "F", "backward": "B", "backward-input": "B", "backward-weight": "W"}


Entry = Union[Op, tuple[Op, Op]]
"""One entry of a rank's order: a pass, or a forward and a backward that run as one unit (DualPipe's paired
F&B: it starts once both inputs have arrived)."""


@dataclass
class _Rank:
    """Where one rank is in its order while simulate runs."""

    order: list[Entry]
    k: int = 0
    """Next entry of order."""
    free: float = 0.0
    held: int = 0
    """Micro-batches forwarded whose last backward pass has not run."""
    waiting: deque[Op] = field(default_factory=deque)
    """Weight passes whose input-gradient pass has run, oldest first."""


def _next(r: _Rank, ready: float | None, cap: int) -> tuple[float, bool] | None:
    """(start, whether the next pass is a waiting weight pass rather than order[k]) of a rank whose order[k]'s
    input arrives at `ready` (None: not yet known, so later than any start still to come). cap > 0 (ZB-H1):
    a waiting weight pass runs when order[k] would idle the rank, or before a forward past cap micro-batches
    held; cap 0: weight passes run only where the order says (WEIGHT)."""
    if r.k >= len(r.order) or r.order[r.k] == WEIGHT:
        return (r.free, True) if r.waiting else None
    forward = _passes(r.order[r.k])[0][0] == "forward"
    if cap and r.waiting and (ready is None or ready > r.free or (forward and r.held >= cap)):
        return r.free, True
    return None if ready is None else (max(r.free, ready), False)


def _ready(entry: Entry, done: dict[Key, float], dep: Callable[[int, Op], Key | None], i: int) -> float | None:
    """When every input of rank i's order entry has arrived (0 for none); None while one is not yet known."""
    times = [0.0 if d is None else done.get(d) for d in (dep(i, op) for op in _passes(entry))]
    return None if None in times else max(t for t in times if t is not None)


def _passes(entry: Entry) -> list[Op]:
    """The passes of an order entry, one or a pair."""
    return list(entry) if isinstance(entry[0], tuple) else [entry]


def simulate(orders: list[list[Entry]], seconds: Callable[[int, Op], float],
             dep: Callable[[int, Op], Key | None], cap: int = 0) -> list[Slot]:
    """Every slot of orders[i] on rank i: a pass (or pair, Entry) starts when its rank is free and its inputs
    (dep: the pass it waits for, None for none) have finished; of all ranks, the pass that can start earliest
    goes first, so that a rank knows, when it is free, whether its next input has arrived (_next).
    Derived: docs/formulas.md#pipeline.schedule"""
    ranks = [_Rank(o) for o in orders]
    done: dict[Key, float] = {}
    slots: list[Slot] = []
    while True:
        best: tuple[float, int, bool] | None = None
        for i, r in enumerate(ranks):
            ready = _ready(r.order[r.k], done, dep, i) if r.k < len(r.order) and r.order[r.k] != WEIGHT else 0.0
            c = _next(r, ready, cap)
            if c is not None and (best is None or c[0] < best[0]):
                best = (c[0], i, c[1])
        if best is None:
            break
        t, i, weight = best
        r = ranks[i]
        if weight:
            ops = [r.waiting.popleft()]
            r.held -= 1
            r.k += r.k < len(r.order) and r.order[r.k] == WEIGHT
        else:
            ops = _passes(r.order[r.k])
            r.k += 1
        for op in ops:
            r.held += (op[0] == "forward") - (op[0] == "backward")
            if op[0] == "backward-input":
                r.waiting.append(("backward-weight", op[1], op[2]))
            end = t + seconds(i, op)
            done[(_CLASS[op[0]], i, op[1], op[2])] = r.free = end
            slots.append(Slot(i, op[0], op[1], op[2], t, end))
            t = end
    if any(r.k < len(r.order) or r.waiting for r in ranks):
        raise RuntimeError(f"pipeline schedule deadlocked (p={len(ranks)})")  # a bug, not user input
    return sorted(slots, key=lambda s: (s.stage, s.start))


def zero_bubble_schedule(forward_s: list[float], backward_s: list[float], n: int) -> list[Slot]:
    """ZB-H1: 1F1B's order of forwards and input-gradient backwards on each stage, each weight pass deferred
    into the gaps that order leaves, with at most p micro-batches held (1F1B's peak, stage 0's).
    Source: Qi et al. 2024, "Zero Bubble Pipeline Parallelism", §3.1 and Figure 3 (ZB-H1).
    Derived: docs/formulas.md#pipeline.schedule"""
    p = len(forward_s)
    orders: list[list[Entry]] = [[("backward-input" if k == "backward" else k, mb, 0)
                                  for k, mb, _ in stage_order(p, n, 1, i)] for i in range(p)]

    def dep(i: int, op: Op) -> Key | None:
        if op[0] == "forward":
            return ("F", i - 1, op[1], 0) if i > 0 else None
        return ("B", i + 1, op[1], 0) if i < p - 1 else ("F", i, op[1], 0)

    def seconds(i: int, op: Op) -> float:
        return forward_s[i] if op[0] == "forward" else backward_s[i] / 2

    return simulate(orders, seconds, dep, cap=p)


def dualpipe_order(p: int, n: int, rank: int) -> list[Entry]:
    """The passes of one DualPipe rank in order, for p ranks (even) and n micro-batches (even, at least 2p):
    half enter at rank 0 (direction 0) and half at rank p-1 (direction 1), and rank r holds stage r of the
    first pipeline and stage p-1-r of the second. Its "near" pipeline is the one whose stage on it sits h =
    min(r, p-1-r) from the entry. Eight steps: 2(p/2-h-1) near forwards; h+1 near/far forward pairs;
    p/2-h-1 x (far backward-input, weight, far forward); n/2-p+h+1 x (near forward, far backward, far forward,
    near backward), the paired forward and backward of the steady state; p/2-h-1 x (far backward, far
    forward, near backward); h+1 backward pairs, the second half split (weight deferred); p/2-h-1 x (weight,
    near backward-input); the h+1 weights left. Source: DeepSeek-V3 technical report (Liu et al. 2024) §3.2.1
    and Figure 5; the step counts of deepseek-ai/DualPipe (dualpipe.py, DualPipe.step)."""
    half, h, m = p // 2, min(rank, p - 1 - rank), n // 2
    near = int(rank >= half)  # the direction whose stage on this rank is h from its entry
    count = {0: 0, 1: 0}, {0: 0, 1: 0}  # forwards, backwards issued per direction

    def f(far: int) -> Op:
        d = near ^ far
        count[0][d] += 1
        return "forward", d * m + count[0][d] - 1, d

    def b(far: int, split: bool = False) -> Op:
        d = near ^ far
        count[1][d] += 1
        return "backward-input" if split else "backward", d * m + count[1][d] - 1, d

    ops: list[Entry] = [f(0) for _ in range(2 * (half - h - 1))]
    for _ in range(h + 1):
        ops += [f(0), f(1)]
    for _ in range(half - h - 1):
        ops += [b(1, True), WEIGHT, f(1)]
    for i in range(m - p + h + 1):  # the middle ranks run their first pair one pass after the other
        ops += [f(0), b(1)] if i == 0 and h == half - 1 else [(f(0), b(1))]
        ops.append((f(1), b(0)))
    for _ in range(half - h - 1):
        ops += [b(1), (f(1), b(0))]
    for i in range(h + 1):  # from the middle on, the backwards leave their weight pass for later
        ops.append(b(1, i > (h + 1) // 2 or (i == (h + 1) // 2 and h % 2 == 1)))
        ops.append(b(0, i >= (h + 1) // 2))
    for _ in range(half - h - 1):
        ops += [WEIGHT, b(0, True)]
    return ops + [WEIGHT] * (h + 1)


def dualpipe_schedule(forward_s: list[float], backward_s: list[float], n: int) -> list[Slot]:
    """Every slot of a DualPipe step over the ranks of forward_s (stage i's per-micro-batch times; rank r
    runs stage r for direction 0 and stage p-1-r for direction 1), n rounded up to an even count of at least
    2p (DualPipe's minimum). The paired forward and backward are drawn one after the other (their overlap
    hides communication, not compute). Derived: docs/formulas.md#pipeline.schedule"""
    p = len(forward_s)
    n = max(n + n % 2, 2 * p)

    def stage(r: int, d: int) -> int:
        return r if d == 0 else p - 1 - r

    def dep(r: int, op: Op) -> Key | None:
        d, step = op[2], 1 if op[2] == 0 else -1
        if op[0] == "forward":
            return ("F", r - step, op[1], d) if stage(r, d) > 0 else None
        return ("B", r + step, op[1], d) if stage(r, d) < p - 1 else ("F", r, op[1], d)

    def seconds(r: int, op: Op) -> float:
        i = stage(r, op[2])
        return {"forward": forward_s[i], "backward": backward_s[i]}.get(op[0], backward_s[i] / 2)

    return simulate([dualpipe_order(p, n, r) for r in range(p)], seconds, dep)


ORDERS: dict[str, Callable[..., list[Slot]]] = {
    "1f1b": pipeline_schedule,
    "zb-h1": lambda forward_s, backward_s, n, v=1, chunk_share=None: zero_bubble_schedule(forward_s, backward_s, n),
    "dualpipe": lambda forward_s, backward_s, n, v=1, chunk_share=None: dualpipe_schedule(forward_s, backward_s, n),
}
"""Slot layout of each drawing a schedule's record names (specs.schedule.Schedule.drawing), all called as
pipeline_schedule (forward_s, backward_s, n, v, chunk_share)."""
