"""The pipeline schedule as a timeline: when each stage runs each micro-batch's forward and backward.

The step-time model prices the schedule in closed form (docs/formulas.md#step.time); this simulation
lays the same schedule out slot by slot so that `llmplan report` can draw it, interleaving included. It
ignores point-to-point transfer time (drawn schedules show compute and bubbles).
"""

from __future__ import annotations

from dataclasses import dataclass


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


def stage_order(p: int, n: int, v: int, i: int) -> list[tuple[str, int, int]]:
    """(kind, micro-batch, chunk) in the order stage i runs them: warm-up forwards, then one forward / one
    backward, then the remaining backwards. Interleaved (v > 1): micro-batches go through the chunks in groups
    of p, and stage i warms up with 2(p - i - 1) + (v - 1)p forwards.
    Source: Narayanan et al. 2021 §2.2 (1F1B and interleaved 1F1B); Megatron-LM pipeline_parallel/schedules.py.
    Derived: docs/formulas.md#pipeline.schedule"""
    fwd = [(mb, c) for g in range(0, n, p) for c in range(v) for mb in range(g, min(g + p, n))]
    bwd = [(mb, c) for g in range(0, n, p) for c in reversed(range(v)) for mb in range(g, min(g + p, n))]
    warm = min(p - i - 1 if v == 1 else 2 * (p - i - 1) + (v - 1) * p, n * v)
    ops = [("forward", *x) for x in fwd[:warm]]
    for k in range(n * v - warm):
        ops += [("forward", *fwd[warm + k]), ("backward", *bwd[k])]
    ops += [("backward", *x) for x in bwd[n * v - warm:]]
    return ops


def pipeline_schedule(forward_s: list[float], backward_s: list[float], n: int, v: int = 1,
                      chunk_share: list[list[float]] | None = None) -> list[Slot]:
    """Every slot of one step: forward_s / backward_s are each stage's per-micro-batch times (all its chunks
    together), n the micro-batches, v the virtual stages per rank, chunk_share[i][c] the share of stage i's
    time its chunk c takes (default 1/v each; a custom pipeline layout's chunks differ). Each stage runs its
    slots in stage_order, a slot starting when the stage is free and its input has arrived."""
    slots: list[Slot] = []
    _simulate(forward_s, backward_s, n, v, chunk_share, slots)
    return sorted(slots, key=lambda s: (s.stage, s.start))


def _simulate(forward_s: list[float], backward_s: list[float], n: int, v: int,
              chunk_share: list[list[float]] | None, slots: list[Slot] | None) -> list[float]:
    """Each stage's end time under pipeline_schedule's rules (appending every slot to `slots` when given).
    Finish times live in per-stage lists indexed by micro-batch x v + chunk (-1: not run yet). A forward waits
    for the previous stage's forward of its chunk (stage 0's chunk c > 0: the last stage's chunk c - 1); a
    backward for the next stage's backward (the last stage's chunk c < v - 1: stage 0's chunk c + 1; its last
    chunk: its own forward)."""
    p = len(forward_s)
    share = chunk_share or [[1 / v] * v for _ in range(p)]
    orders = [stage_order(p, n, v, i) for i in range(p)]
    fdone = [[-1.0] * (n * v) for _ in range(p)]
    bdone = [[-1.0] * (n * v) for _ in range(p)]
    nxt, free = [0] * p, [0.0] * p
    left = sum(len(o) for o in orders)
    while left:
        moved = False
        for i in range(p):
            order, k = orders[i], nxt[i]
            while k < len(order):
                kind, mb, c = order[k]
                j = mb * v + c
                if kind == "forward":
                    dep = fdone[i - 1][j] if i > 0 else (fdone[p - 1][j - 1] if c > 0 else 0.0)
                else:
                    dep = bdone[i + 1][j] if i < p - 1 else (bdone[0][j + 1] if c < v - 1 else fdone[p - 1][j])
                if dep < 0:
                    break
                start = max(free[i], dep)
                end = start + (forward_s[i] if kind == "forward" else backward_s[i]) * share[i][c]
                (fdone if kind == "forward" else bdone)[i][j] = end
                free[i] = end
                k += 1
                if slots is not None:
                    slots.append(Slot(i, kind, mb, c, start, end))
            if k > nxt[i]:
                left -= k - nxt[i]
                nxt[i], moved = k, True
        if not moved:
            raise RuntimeError(f"pipeline schedule deadlocked (p={p}, n={n}, v={v})")  # a bug, not user input
    return free


def makespan(forward_s: list[float], backward_s: list[float], n: int, v: int = 1,
             chunk_share: list[list[float]] | None = None) -> float:
    """Seconds from the first forward to the last backward of pipeline_schedule (a stage's slots end in order,
    so its last one ends latest)."""
    return max(_simulate(forward_s, backward_s, n, v, chunk_share, None))
