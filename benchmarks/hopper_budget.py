"""Where the H100 families split: each dense H100 training row's step priced in parts against its measured step
(docs/validation.md#hopper-budget).

    python benchmarks/hopper_budget.py [--family NAME ...] [--rows] [--attention-releases MODE]

For every H100 record of a dense, non-hybrid model (torchtitan left out: its rows run under a power cap), with
the shipped profiles: the signed throughput error (+ = llmplan faster than measured); `compute`, llmplan's
compute (GEMMs, attention, memory-bound operators, every micro-batch of the slowest stage) over the measured step;
`bound`, the error llmplan would make if every other part of the step (exposed communication, bubble, optimizer,
overhead) cost nothing: a row whose bound is still negative cannot be mended by any overlap, bubble, optimizer
or overhead mechanism, only by its compute; `clock`, the H100 sustained clock at which the row's error is zero
(interpolated over accuracy.GRID's clocks; nan outside them). Medians per group (Megatron-LM's rows split into
Megatron-Core r0.8 and examples/llama)."""

from __future__ import annotations

import argparse
import statistics
import sys

import accuracy as A
import numpy as np
import yaml

from llmplan.estimate import estimate_training

CLOCKS = A.GRID["clock_h100"]
FAMILIES = tuple(f for f in A.FAMILIES if f not in ("torchtitan", "trtllm"))
"""The training families split here: torchtitan's rows run under a power cap, trtllm's are serving."""


def group(record_id: str) -> str:
    """The record's family, Megatron-LM's rows split by release."""
    fam = A.family(record_id)
    if fam == "megatron":
        return "megatron-r0.8" if record_id.startswith("megatron-core-r0.8") else "megatron-examples"
    return fam


def h100_dense(records: list[dict], families: list[str] | None) -> list[dict]:
    """The H100 records of dense, non-hybrid models that predict() scores, torchtitan's left out."""
    out = []
    for rec in records:
        fam = A.family(rec["id"])
        if fam not in FAMILIES or (families and fam not in families):
            continue
        if A.clock_group(rec) != "h100" or A.skip_reason(rec):
            continue
        try:
            m = A.model_for(rec, fam)
        except (A.LlmplanError, ValueError, KeyError):
            continue
        if m.num_experts == 0 and not m.is_hybrid:
            out.append(rec)
    return out


def budget(rec: dict) -> tuple[float, float, float, float] | None:
    """(signed error %, priced compute / measured step, error % with the non-compute parts at zero, zero-error
    H100 clock) of one record; None where predict() scores nothing."""
    fam = A.family(rec["id"])
    try:
        rows = [r for r in A.predict(rec, fam) if r[0] != "fits"]
        errors = [next(100 * (p - m) / m for q, p, m in A.predict(rec, fam, {"clock_h100": c}) if q != "fits")
                  for c in CLOCKS]
    except (A.LlmplanError, ValueError, StopIteration):
        return None
    if not rows:
        return None
    setup = A.record_setup(rec, fam)
    if setup is None:
        return None
    _, pred, meas = rows[0]
    ratio = pred / meas  # measured step over predicted step
    t = estimate_training(*setup).time
    total, compute = float(t.total), float(t.compute)
    clock = float(np.interp(0.0, errors, CLOCKS)) if errors[0] <= 0 <= errors[-1] else float("nan")
    return 100 * (ratio - 1), compute / (total * ratio), 100 * (ratio * total / compute - 1), clock


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", action="append")
    ap.add_argument("--rows", action="store_true", help="print every record, not only the medians")
    ap.add_argument("--attention-releases", choices=A.ATTENTION_RELEASE_MODES, default="off",
                    help="read the stacks' cuDNN releases onto published attention rates, as accuracy.py does")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.family or ()) - set(FAMILIES))
    if unknown:
        ap.error(f"--family {', '.join(unknown)}: not a family this split prices; valid: {', '.join(FAMILIES)}")
    A.attention_release_mode = args.attention_releases
    records = h100_dense(yaml.safe_load(A.DEFAULT_RUNS.read_text()), args.family)
    by: dict[str, list[tuple[float, float, float, float]]] = {}
    for rec in records:
        b = budget(rec)
        if b is None:
            continue
        by.setdefault(group(rec["id"]), []).append(b)
        if args.rows:
            print(f"{b[0]:+6.1f}% compute {b[1]:.2f} bound {b[2]:+6.1f}% clock {b[3]:.3f}  {rec['id']}")
    print(f"{'group':18s} {'rows':>4s} {'error':>7s} {'compute':>8s} {'bound':>7s} {'clock':>6s}")
    for g, v in sorted(by.items()):
        med = [statistics.median(x[i] for x in v) for i in range(3)]
        clocks = [x[3] for x in v if x[3] == x[3]]
        clock = f"{statistics.median(clocks):.3f}" if clocks else "nan"
        print(f"{g:18s} {len(v):4d} {med[0]:+6.1f}% {med[1]:8.2f} {med[2]:+6.1f}% {clock:>6s}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
