"""Does the Nemotron-3 GB200 TP2 excess scale per call or per unit of work? (docs/validation.md#n3-tp2)

Super and Ultra run the same recipe shape at Megatron-Bridge 26.08 (MXFP8, EP64, expert TP 1, 8,192-token
micro-batches; GB300 TP1 against GB200 TP2 + SP, no TP overlap) but Ultra is about twice as wide (hidden 8,192
against 4,096, latent 2,048 against 1,024, 256 Mamba heads against 128) with about as many layers (108 + 2 MTP
passes against 88 + 2). A cost paid per kernel, per collective or per HybridEP call grows from Super to Ultra with
the calls (about 1.1-1.2x); a cost paid per byte or per FLOP grows with the width (2-3x). This prints, per row,
the time llmplan leaves unplaced a micro-batch; then the TP2 excess a micro-batch (the GB200 TP2 row's unplaced
time less the GB300 TP1 row's, the latter halved as its micro-batch carries twice a TP2 rank's work, and not
halved) and, for each candidate scale llmplan prices a TP2 micro-batch, its Ultra / Super ratio and the factor on
it that would hold Super's excess and Ultra's. A candidate whose two factors agree scales as the excess does.

    python benchmarks/tp2_width.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
import accuracy as A
import hybrid_gap as H

import llmplan.cost.comm as C
from llmplan.cost.compute import KERNEL_LAUNCH_S
from llmplan.cost.kernels import layer_launch_average
from llmplan.cost.stages import max_stage_layers, recomputed_share
from llmplan.estimate import estimate_training


def scales(rec: dict) -> dict[str, float]:
    """What llmplan prices one micro-batch of a row at: seconds of GPU compute (and its GEMM, attention and
    memory-bound parts), of EP and TP communication (all, hidden or not), host launch seconds at the Grace factor,
    kernel launches and MoE layers (HybridEP calls are four a MoE layer: dispatch and combine, each way)."""
    m, cluster, plan = A.record_setup(rec, "mbridge-moe")
    e = estimate_training(m, cluster, plan)
    n = plan.num_microbatches
    t, s = e.time, e.time.stage
    lk = layer_launch_average(m, plan)
    layers = max_stage_layers(m, plan)
    r = float(recomputed_share(plan, layers))
    launches = float((lk.fwd * (1 + r) + lk.bwd) * layers)
    out = {f"compute.{q}": float(t.compute) * float(getattr(s, q)) / float(s.total) / n
           for q in ("gemm", "attention", "memory_bound")}
    out["compute"] = float(t.compute) / n
    for k in ("tp", "ep"):
        out[f"{k} (all)"] = float(e.comm.axes[k].seconds) / n
        out[f"{k} (exposed)"] = float(t.exposed.get(k, 0.0)) / n
    out["tp collectives"] = float(sum(x.calls for x in e.comm.axes["tp"].transfers if not x.step_end)) / n
    out["tp bytes (MB)"] = float(sum(x.calls * x.message for x in e.comm.axes["tp"].transfers
                                     if not x.step_end)) / n / 1e6
    out["stragglers"] = float(t.overheads.get("stragglers", 0.0)) / n
    out["ep hybridep bytes term"], out["ep hybridep per-peer term"] = ep_parts(m, cluster, plan)
    out["launches"] = launches
    out["launch seconds (Grace)"] = launches * KERNEL_LAUNCH_S * cluster.system.gpu.host_op_factor
    out["MoE layers"] = float(m.num_moe_layers + m.num_nextn_predict_layers * m.is_moe)
    out["width (hidden)"] = float(m.hidden_size)
    return out


def ep_parts(m, cluster, plan) -> tuple[float, float]:
    """HybridEP's seconds a micro-batch that are its bytes term and its per-peer term (comm.hybridep: t = beta x
    bytes + alpha x peers): the EP axis priced with each term set to 0 in turn (llmplan.cost.comm.hybridep_rate
    replaced for the call, then restored), subtracted from the whole."""
    orig = C.hybridep_rate
    got = []
    try:
        for fb, fa in ((1.0, 1.0), (0.0, 1.0), (1.0, 0.0)):
            C.hybridep_rate = lambda sms, fb=fb, fa=fa: (orig(sms)[0] * fb, orig(sms)[1] * fa)  # type: ignore
            got.append(float(estimate_training(m, cluster, plan).comm.axes["ep"].seconds) / plan.num_microbatches)
    finally:
        C.hybridep_rate = orig
    return got[0] - got[1], got[0] - got[2]


def tp2_excess(tp2_gap_mb: float, tp1_gap_mb: float) -> tuple[float, float]:
    """The TP2 row's unplaced time a micro-batch beyond what the TP1 row leaves: (a) the TP1 residual read as per
    unit of work (a TP1 micro-batch carries twice a TP2 rank's, so half of it is expected at TP2), (b) read as per
    micro-batch (all of it expected again). Any unit in, the same out."""
    return tp2_gap_mb - tp1_gap_mb / 2, tp2_gap_mb - tp1_gap_mb


def main() -> int:
    recs = {r["id"]: r for r in yaml.safe_load(A.DEFAULT_RUNS.read_text())}
    got = {k: H.row(recs[rid]) for k, rid in H.ROWS.items()}
    print(f"{'model':6s} {'gpu':6s} {'tp':>2s} {'mb':>3s} {'signed':>7s} {'gap/mb ms':>9s}")
    for (model, gpu), r in got.items():
        print(f"{model:6s} {gpu:6s} {r['plan'].tp:2d} {r['plan'].num_microbatches:3d} {100 * r['err']:+6.1f}% "
              f"{r['per_mb_ms']:9.1f}")
    excess = {}
    for model in ("super", "ultra"):
        excess[model] = tp2_excess(got[(model, "gb200")]["per_mb_ms"], got[(model, "gb300")]["per_mb_ms"])
        print(f"TP2 excess a micro-batch, {model}: {excess[model][0]:.1f} ms (TP1 residual per work) / "
              f"{excess[model][1]:.1f} ms (per micro-batch)")
    lo = excess["ultra"][1] / excess["super"][0]
    hi = excess["ultra"][0] / excess["super"][1]
    print(f"excess ratio ultra / super: {lo:.2f} .. {hi:.2f}")
    sc = {model: scales(recs[H.ROWS[(model, "gb200")]]) for model in ("super", "ultra")}
    print(f"{'scale a GB200 TP2 micro-batch':30s} {'super':>10s} {'ultra':>10s} {'u/s':>5s} "
          f"{'k super':>10s} {'k ultra':>10s}")
    for key in sc["super"]:
        a, b = sc["super"][key], sc["ultra"][key]
        secs = not key.startswith(("launches", "MoE", "width", "tp collectives", "tp bytes"))
        f = 1e3 if secs else 1.0
        ks = (f"{excess['super'][1] / (1e3 * a):5.2f}-{excess['super'][0] / (1e3 * a):4.2f} "
              f"{excess['ultra'][1] / (1e3 * b):5.2f}-{excess['ultra'][0] / (1e3 * b):4.2f}") if secs and a and b \
            else ""
        print(f"{key:30s} {f * a:10.1f} {f * b:10.1f} {b / a if a else float('nan'):5.2f} {ks}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
