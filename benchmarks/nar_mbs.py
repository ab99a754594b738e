"""Narayanan et al. 2021's small Table 1 rows at the script's micro-batch and at 1 (issue 32,
docs/validation.md#nar-mbs): the priced step of a row (shipped profiles, as benchmarks/accuracy.py builds it)
broken into its pieces at micro-batches 16, 8, 4, 2 and 1 (the same global batch), and the time the Table 1 rate
implies (Eq. 3's FLOPs over the measured TFLOP/s). Analysis only: nothing in llmplan reads this file.

    PYTHONPATH=. python benchmarks/nar_mbs.py [row id ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import accuracy as A  # noqa: E402

import llmplan.cost.compute as C  # noqa: E402
from llmplan.estimate import estimate_training  # noqa: E402

ROWS = ("narayanan2021-t1-1.7b", "narayanan2021-t1-3.6b", "narayanan2021-t1-7.5b")
FAMILY = "narayanan2021"


def pieces(rec: dict, micro_batch: int) -> dict[str, float]:
    """Seconds of one step of `rec` at `micro_batch` (the rest of its plan as accuracy.py reads it): the
    GEMMs, attention scores and memory-bound kernels of every micro-batch (recompute and output layer included),
    the rest of the compute (autograd's gradient accumulation over the micro-batches after the first), the
    exposed TP and DP collectives, the optimizer, the stragglers' and host overhead, and the total."""
    m, c, p = A.record_setup(rec, FAMILY)
    plan = p.model_copy(update={"micro_batch": micro_batch})
    n = plan.global_batch // (micro_batch * plan.dp)
    e = estimate_training(m, c, plan)
    sc = C.stage_compute(m, plan, c.system.gpu, m.num_hidden_layers, 0, True)
    gemm, attn, mem = (float(x) * n for x in (sc.gemm, sc.attention, sc.memory_bound))
    exposed = e.time.exposed
    return {"n": n, "gemm": gemm, "attn": attn, "membound": mem,
            "other": float(e.time.compute) - gemm - attn - mem,
            "tp": float(exposed.get("tp", 0.0)), "dp": float(exposed.get("dp", 0.0)),
            "optim": float(e.time.optimizer), "overhead": float(e.time.overhead), "total": float(e.time.total)}


def measured_seconds(rec: dict) -> float:
    """The step Table 1's rate implies: the priced step's hardware FLOPs (Eq. 3) over the measured TFLOP/s."""
    m, c, p = A.record_setup(rec, FAMILY)
    e = estimate_training(m, c, p)
    peak = c.system.gpu.peak_flops(p.mfu_format) / 1e12
    return float(e.time.total) * float(e.throughput.hfu) * peak / rec["measured"]["tflops_per_gpu"]


def main(argv: list[str]) -> int:
    recs = {r["id"]: r for r in yaml.safe_load(A.DEFAULT_RUNS.read_text())}
    cols = ("gemm", "attn", "membound", "other", "tp", "dp", "optim", "overhead", "total")
    for rid in argv or ROWS:
        rec = recs[rid]
        print(f"{rid}: Table 1 {rec['measured']['tflops_per_gpu']:.0f} TFLOP/s = {measured_seconds(rec):.3f} s a step")
        print("  mbs   n " + " ".join(f"{c[:8]:>8}" for c in cols))
        for mb in (16, 8, 4, 2, 1):
            row = pieces(rec, mb)
            print(f"  {mb:3d} {row['n']:3d} " + " ".join(f"{row[c]:8.3f}" for c in cols))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
