"""How much of the Nemotron-3 rows' per-micro-batch gap the host could hold (issue 40;
docs/validation.md#nemotron-host-pacing).

Per mbridge MoE row of the models in MODELS: the predicted micro-batch (step / micro-batches), the gap (measured
minus predicted step, per micro-batch), the host time llmplan prices (cost.overhead.host_seconds at the row's
plan, per micro-batch), and the same host count with the GPU taking no time at all (every launch and every eager
op after a MoE wait exposed: an upper bound on host pacing as llmplan counts the work), at the row's host CPU
(GpuSpec.host_op_factor: Grace 2.75) and at x86's 1. `need` is the per-op factor over x86 at which that
zero-GPU host count alone would last the measured micro-batch (the host pacing the whole step). Last, the
rows run on a Grace and an x86 host at the same model, release, precision, layout and micro-batch size.

    python benchmarks/host_bound.py
"""

from __future__ import annotations

import statistics
from typing import Any

import accuracy as A
from runs import load_runs

from llmplan.cost.elementwise import softmax_launches, te_mask_launches
from llmplan.cost.moe import host_syncs_per_layer
from llmplan.cost.overhead import host_seconds
from llmplan.cost.step import max_stage_layers
from llmplan.estimate import estimate_training

MODELS = ("nemotron-3-nano", "nemotron-3-super", "nemotron-3-ultra", "nemotron-3-5-lightning")
"""Id parts of the rows printed."""


def row(rec: dict) -> dict[str, Any] | None:
    """The numbers of one tokens/s record (None where it is not scored)."""
    fam = A.family(rec["id"])
    setup = A.record_setup(rec, fam)
    scored = [(p, m) for q, p, m in A.predict(rec, fam) if q == "tok/s/GPU"] if setup else []
    if setup is None or not scored:
        return None
    m, cluster, plan = setup
    (pred, meas), gpus, n = scored[0], rec["hardware"]["gpus"], plan.num_microbatches
    tokens = plan.global_batch * plan.seq_len
    step_p, step_m = tokens / (pred * gpus), tokens / (meas * gpus)
    f = cluster.system.gpu.host_op_factor
    layers, syncs = max_stage_layers(m, plan), host_syncs_per_layer(m, plan)
    launches = {"softmax": softmax_launches(m, plan), "mask_kernels": te_mask_launches(plan)}
    bound = [float(host_seconds(plan, layers, 0.0, 0.0, m.num_moe_layers, syncs, 0.0, k, **launches)) / n
             for k in (f, 1.0)]
    return {"id": rec["id"], "f": f, "plan": plan, "n": n, "pred_mb": step_p / n, "gap_mb": (step_m - step_p) / n,
            "host_mb": float(estimate_training(m, cluster, plan).time.overheads["host"]) / n,
            "bound": bound[0], "bound_x86": bound[1], "need": step_m / n / bound[1], "err": 100 * (pred / meas - 1)}


def key(r: dict[str, Any]) -> tuple[Any, ...]:
    """Model, release, precision and layout: what a Grace / x86 pair must share."""
    rid, p = r["id"], r["plan"]
    model = next(x for x in MODELS if x in rid)
    return model, rid.split("-")[1], rid.split("gpu-")[1].split("-")[0], p.tp, p.ep, p.micro_batch, p.cuda_graphs


def main() -> None:
    rows = [r for rec in load_runs() if rec["id"].startswith("mbridge-") and any(x in rec["id"] for x in MODELS)
            for r in [row(rec)] if r is not None]
    rows.sort(key=lambda r: (key(r), r["f"]))
    print("ms per micro-batch; bound: host count with the GPU at zero time (row's host")
    print("CPU / x86); row: release, model, GPU, format, tp/ep/mbs, graphs (l, n, f)")
    print(f"{'row':35s} {'pred':>5s} {'gap':>4s} {'host':>4s} {'bound':>11s} {'need':>4s} {'err':>6s}")
    for r in rows:
        p, rid = r["plan"], r["id"]
        model, rel, prec = key(r)[:3]
        gpu = rid.split("dgx-")[1].split("-")[0]
        name = f"{rel} {model[11:16]} {gpu} {prec} {p.tp}/{p.ep}/{p.micro_batch} {p.cuda_graphs[0]}"[:35]
        print(f"{name:35s} {r['pred_mb'] * 1e3:5.0f} {r['gap_mb'] * 1e3:4.0f} {r['host_mb'] * 1e3:4.1f} "
              f"{r['bound'] * 1e3:5.1f}/{r['bound_x86'] * 1e3:5.1f} {r['need']:4.0f} {r['err']:+6.1f}")
    print("gap ms/mb, Grace against x86 at one model, release, format, layout, graphs:")
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r)
    for k, g in groups.items():
        grace = [r["gap_mb"] * 1e3 for r in g if r["f"] > 1]
        x86 = [r["gap_mb"] * 1e3 for r in g if r["f"] == 1]
        if grace and x86:
            print(f"  {k[0][11:]} {k[1]} {k[2]} tp{k[3]} ep{k[4]} mbs{k[5]} {k[6]}: Grace "
                  f"{statistics.median(grace):.0f} x86 {statistics.median(x86):.0f}")


if __name__ == "__main__":
    main()
