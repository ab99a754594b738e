"""Where the Nemotron-3 Ultra rows' error sits against the Nemotron-3 Super rows of the same table
(docs/validation.md#hybrid-gap).

The two scored Ultra rows (Megatron-Bridge 26.08, MXFP8, 256 GPUs) differ from Super's 26.08 MXFP8 rows in two
ways that the table itself separates: the GPU and tensor parallelism (GB300 TP1 against GB200 TP2 with SP, both
models at EP64 in one NVLink domain) and the model with its preset (Megatron-FSDP, no CUDA graphs, one or two
micro-batches a step for Ultra; DDP, per-layer graphs, 8 or 16 micro-batches for Super). Prints, per row, llmplan's
step against the measured one (the measured step is the predicted step times predicted over measured tokens/s),
the time llmplan leaves unplaced per micro-batch and per layer and micro-batch, then the two factors:

* gb200_tp2: measured and predicted GB200-TP2 over GB300-TP1 tokens/s per GPU, per model;
* model: (1 + Ultra's signed error) / (1 + Super's) on the same GPU and layout, per GPU;

and the precision pairs that price the same stacks in BF16 (benchmarks/precision_pairs.py). Then the predicted
GB200-TP2 / GB300-TP1 ratio split into its GPU and TP parts with two counterfactual plans (docs/validation.md#moe-tp2):
each model's GB300 TP1 row, the GB200 row's plan at TP1 (DP doubled, no SP: same GPUs, same tokens a rank a step),
the GB300 row's plan at TP2 with SP (DP halved), and the GB200 TP2 row, each with its predicted tokens/s per GPU
relative to the first and its step terms (ms).

    python benchmarks/hybrid_gap.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).parent))
import accuracy as A
import precision_pairs as P

from llmplan.estimate import estimate_training

ROWS = {  # (model, GPU) -> record id; NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md, 26.08 pretrain table
    ("super", "gb300"): "mbridge-26.08-pretrain-nemotron-3-super-dgx-gb300-64gpu-mxfp8-tp1pp1cp1ep64vpnagbs512mbs1",
    ("super", "gb200"): "mbridge-26.08-pretrain-nemotron-3-super-dgx-gb200-64gpu-mxfp8-tp2pp1cp1ep64vpnagbs512mbs1",
    ("ultra", "gb300"): "mbridge-26.08-pretrain-nemotron-3-ultra-dgx-gb300-256gpu-mxfp8-tp1pp1cp1ep64vpnagbs256mbs1",
    ("ultra", "gb200"): "mbridge-26.08-pretrain-nemotron-3-ultra-dgx-gb200-256gpu-mxfp8-tp2pp1cp1ep64vpnagbs256mbs1",
}


def unplaced(predicted_step_s: float, predicted_tps: float, measured_tps: float, microbatches: int,
             layers: int) -> dict[str, float]:
    """The measured step (the predicted step scaled by predicted over measured throughput: both count the same
    tokens a step) and what llmplan leaves unplaced of it, in ms: per step, per micro-batch, per layer and
    micro-batch."""
    measured_step = predicted_step_s * predicted_tps / measured_tps
    gap = measured_step - predicted_step_s
    return {"measured_ms": 1e3 * measured_step, "predicted_ms": 1e3 * predicted_step_s, "gap_ms": 1e3 * gap,
            "per_mb_ms": 1e3 * gap / microbatches, "per_layer_mb_ms": 1e3 * gap / microbatches / layers}


def row(rec: dict) -> dict[str, Any]:
    """One row: its plan, predicted and measured tokens/s per GPU and the unplaced time."""
    fam = A.family(rec["id"])
    m, cluster, plan = A.record_setup(rec, fam)
    e = estimate_training(m, cluster, plan)
    pred = float(e.throughput.tokens_per_s) / cluster.num_gpus
    meas = float(rec["measured"]["tokens_per_s_per_gpu"])
    layers = m.num_hidden_layers + m.num_nextn_predict_layers
    return {"plan": plan, "pred": pred, "meas": meas, "err": pred / meas - 1, "layers": layers,
            **unplaced(float(e.time.total), pred, meas, plan.num_microbatches, layers)}


def counterfactuals(recs: dict[str, dict], model: str) -> dict[str, tuple[Any, Any, Any]]:
    """(model, cluster, plan) of the four layouts of one model: the two published rows and the two plans that
    swap their GPU and tensor parallelism (DP scaled so the GPUs and the tokens a rank a step stay the same)."""
    m3, c3, p3 = A.record_setup(recs[ROWS[(model, "gb300")]], "mbridge-moe")
    m2, c2, p2 = A.record_setup(recs[ROWS[(model, "gb200")]], "mbridge-moe")
    return {"gb300 tp1": (m3, c3, p3),
            "gb200 tp1": (m2, c2, p2.model_copy(update={"tp": 1, "sp": False, "dp": p2.dp * p2.tp})),
            "gb300 tp2": (m3, c3, p3.model_copy(update={"tp": p2.tp, "sp": True, "dp": p3.dp // p2.tp})),
            "gb200 tp2": (m2, c2, p2)}


def terms(m: Any, cluster: Any, plan: Any) -> tuple[float, dict[str, float]]:
    """Predicted tokens/s per GPU and the step's terms in ms: the slowest stage's compute split as its
    micro-batch is (gemm, attention, memory_bound), the exposed communication and the overheads (nonzero ones)."""
    e = estimate_training(m, cluster, plan)
    t, s = e.time, e.time.stage
    out = {q: 1e3 * float(t.compute) * float(getattr(s, q)) / float(s.total)
           for q in ("gemm", "attention", "memory_bound")}
    out |= {k: 1e3 * float(v) for k, v in {**t.exposed, **t.overheads}.items() if float(v)}
    out["total"] = 1e3 * float(t.total)
    return float(e.throughput.tokens_per_s) / cluster.num_gpus, out


def main() -> int:
    recs = {r["id"]: r for r in yaml.safe_load(A.DEFAULT_RUNS.read_text())}
    got = {k: row(recs[rid]) for k, rid in ROWS.items()}
    print(f"{'model':6s} {'gpu':6s} {'tp':>2s} {'mb':>3s} {'signed':>7s} {'pred ms':>8s} {'meas ms':>8s} "
          f"{'gap/mb':>7s} {'gap/layer/mb':>12s}")
    for (model, gpu), r in got.items():
        print(f"{model:6s} {gpu:6s} {r['plan'].tp:2d} {r['plan'].num_microbatches:3d} {100 * r['err']:+6.1f}% "
              f"{r['predicted_ms']:8.0f} {r['measured_ms']:8.0f} {r['per_mb_ms']:7.1f} {r['per_layer_mb_ms']:12.2f}")
    for model in ("super", "ultra"):
        a, b = got[(model, "gb200")], got[(model, "gb300")]
        print(f"gb200_tp2 {model}: measured {a['meas'] / b['meas']:.3f}, predicted {a['pred'] / b['pred']:.3f}")
    for gpu in ("gb300", "gb200"):
        u, s = got[("ultra", gpu)], got[("super", gpu)]
        print(f"model {gpu}: (1 + ultra) / (1 + super) = {(1 + u['err']) / (1 + s['err']):.3f}")
    for p in P.pairs(list(recs.values())):
        if p["model"] in ("Nemotron_3_Super", "Nemotron_3_5_Lightning"):
            print(f"pair {p['model']} {p['gpu'][:5]} {p['recipe']}: low / bf16 measured {p['measured']:.3f}, "
                  f"predicted {p['predicted']:.3f}")
    pred, meas = P.ultra_ab()
    print(f"pair Nemotron_3_Ultra (perf leaderboard A/B, GB200 TP2 PP3): mxfp8 / bf16 measured {meas:.3f}, "
          f"predicted {pred:.3f}")
    for model in ("super", "ultra"):
        base = None
        for name, setup in counterfactuals(recs, model).items():
            tps, parts = terms(*setup)
            base = base or tps
            print(f"layout {model} {name}: {tps / base:.3f} of gb300 tp1, mb {setup[2].num_microbatches:2d}, ms "
                  + " ".join(f"{k} {v:.0f}" for k, v in parts.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
