"""What the megatron family's rows would read at its left-out fold's constants if Transformer Engine's chunked
TP-overlap GEMM pieces, or the TP overlap as a whole, hid less than llmplan prices (docs/validation.md#meg-lofo).
A probe: nothing here is priced by llmplan; each variant is applied in this process only.

Columns (signed error, predicted / measured - 1, + = predicted faster, at the fold's constants):

- `shipped`: llmplan as it is (cost.gemm.chunked_gemm_efficiency: the pieces of a userbuffer-overlapped GEMM run on
  three streams and share one GEMM's waves, docs/formulas.md#compute.gemm_chunks);
- `no TP overlap`: the Megatron-Core r0.8 rows with --tp-comm-overlap off (every TP collective exposed);
- `own waves r0.8` / `own waves all`: every piece pays its own wave quantisation, as llmplan prices PyTorch's
  async TP (the pieces one after another), on the r0.8 rows only / on every row of the family;

then, per r0.8 row with pipeline stages, the time per micro-batch on the slowest stage that the measured figure
leaves unpriced (the predicted step x error / micro-batches: the measured step is the predicted one x (1 + error)), and what the two readings predict for
a one-GPU micro-benchmark that would decide between them (eight 512-row pieces against the whole 4,096-row GEMM).

    PYTHONPATH=$PWD python benchmarks/megatron_tp_pieces.py
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import benchmarks.accuracy as A  # noqa: E402
import llmplan.cost.gemm as G  # noqa: E402
from llmplan.estimate import estimate_training  # noqa: E402
from llmplan.specs.registry import builtin_systems  # noqa: E402

# The megatron fold's constants as `accuracy.py --quiet` prints them on main at b2e9764c.
FOLD = {"attention_efficiency": 1.0, "clock_a100": 0.8, "clock_h100": 0.8375}
R08 = "megatron-core-r0.8-"
SHIPPED_PIECES = G.chunked_gemm_efficiency
SHIPPED_PLAN = A.plan_for


def own_waves(gpu: Any, dtype: str, plan: Any, M: Any, rows: Any, N: Any, K: Any) -> Any:
    """Every piece at its own tile and wave quantisation (no sharing of waves between pieces)."""
    return G.grouped_gemm_efficiency(gpu, dtype, rows, N, K, 1.0)


def no_overlap(rec: dict, fam: str, gpus: int) -> Any:
    plan = SHIPPED_PLAN(rec, fam, gpus)
    if not rec["id"].startswith(R08):
        return plan
    return plan.model_copy(update={"tp_comm_overlap": False, "tp_overlap_sms": None, "tp_overlap_margin_sms": None})


def errors(recs: list[dict], pieces: Callable[[dict], bool], plan_for: Any = SHIPPED_PLAN) -> dict[str, float]:
    out = {}
    A.plan_for = plan_for
    try:
        for rec in recs:
            G.chunked_gemm_efficiency = own_waves if pieces(rec) else SHIPPED_PIECES
            _, pred, meas = A.predict(rec, "megatron", FOLD)[0]
            out[rec["id"]] = 100 * (pred - meas) / meas
    finally:
        G.chunked_gemm_efficiency, A.plan_for = SHIPPED_PIECES, SHIPPED_PLAN
    return out


def main() -> int:
    recs = [r for r in yaml.safe_load(A.DEFAULT_RUNS.read_text()) if A.family(r["id"]) == "megatron"]
    cols = {"shipped": errors(recs, lambda r: False),
            "no TP overlap": errors(recs, lambda r: False, no_overlap),
            "own waves r0.8": errors(recs, lambda r: r["id"].startswith(R08)),
            "own waves all": errors(recs, lambda r: True)}
    print("row | " + " | ".join(cols))
    for rec in recs:
        print(rec["id"].replace("megatron-", "") + " | " + " | ".join(f"{c[rec['id']]:+.1f}" for c in cols.values()))
    for name, c in cols.items():
        v = [abs(x) for x in c.values()]
        print(f"{name}: median |error| {statistics.median(v):.2f}, mean {sum(v) / len(v):.2f}")
    print("unpriced per micro-batch on the slowest stage (shipped, fold):")
    for rec in recs:
        m, cluster, plan = A.record_setup(rec, "megatron", FOLD)
        if not rec["id"].startswith(R08) or plan.pp == 1:
            continue
        e = estimate_training(m, cluster, plan)
        err = cols["shipped"][rec["id"]] / 100
        gap = float(e.time.total) * err / plan.num_microbatches  # measured step = predicted x (1 + error)
        layers = m.num_hidden_layers // plan.pp
        print(f"  {rec['id'].replace(R08, '')}: {1e3 * gap:.1f} ms ({1e3 * gap / layers:.2f} ms a layer; stage "
              f"{1e3 * float(e.time.stage.total):.1f} ms a micro-batch, {layers} layers)")
    gpu = builtin_systems()["dgx-h100"].gpu
    print("micro-benchmark, eight 512-row pieces over the whole 4,096-row GEMM (time ratio):")
    for name, N, K in (("177B QKV", 4608, 12288), ("177B fc1", 6144, 12288), ("314B QKV", 6144, 16384)):
        whole = float(G.grouped_gemm_efficiency(gpu, "bf16", 4096, N, K, 1))
        shared = float(G.grouped_gemm_efficiency(gpu, "bf16", 512, N, K, 8))
        own = float(G.grouped_gemm_efficiency(gpu, "bf16", 512, N, K, 1))
        print(f"  {name} 4096 x {N} x {K}: shared waves {whole / shared:.3f}, own waves {whole / own:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
