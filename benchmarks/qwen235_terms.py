"""Qwen3-235B-A22B's Megatron-Bridge rows term by term, with two what-ifs (docs/validation.md#qwen235-terms).

For every scored mbridge-moe row whose id holds PATTERN (default qwen3-235b; e.g. deepseekv3 to compare) it prints
the signed error (+ = predicted faster than measured), the predicted and measured step, the step's parts (compute,
bubble, exposed EP, the rest), the slowest-stage compute per micro-batch split into GEMM / attention / memory-bound,
and the last stage (output layer and loss) against the busiest middle stage. Two what-ifs re-price a row with one
thing changed in memory (nothing shipped, no file written):

* ``nic`` (H100 rows whose NCCL all-to-all leaves the node): the profile's nic_efficiency (0.75, a B200-over-EFA
  measurement) set to the share HybridEP's published H100 internode kernels reach at the row's node count
  (cost.comm.ep_rdma_efficiency: 0.86 at 4 nodes), i.e. NCCL's alltoall as fast on the wire as HybridEP;
* ``mid`` (rows with pp > 1): the step's compute scaled by middle / last stage, an upper bound of what the output
  layer and loss beyond the one layer that account_for_loss_in_pipeline_split credits cost the pipeline.

    python benchmarks/qwen235_terms.py [PATTERN]   (about 20 s)
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
import accuracy as A

from llmplan.cost.comm import ep_rdma_efficiency
from llmplan.cost.step import stage_times
from llmplan.estimate import estimate_training


def scored_setup(rec: dict) -> tuple[tuple, float] | None:
    """(model, cluster, plan) and measured tokens/s per GPU of a scored mbridge-moe row; None for any other row."""
    fam = A.family(rec["id"])
    setup = A.record_setup(rec, fam) if fam == "mbridge-moe" else None
    if setup is None or not A.predict(rec, fam):
        return None
    return setup, rec["measured"]["tokens_per_s_per_gpu"]


def row(rec: dict) -> dict | None:
    """Terms and what-ifs of one scored mbridge-moe row; None where the row is not scored."""
    scored = scored_setup(rec)
    if scored is None:
        return None
    (m, c, p), measured = scored

    def err(cluster) -> tuple[float, object]:  # type: ignore[no-untyped-def]
        e = estimate_training(m, cluster, p)
        return float(e.throughput.tokens_per_s) / cluster.num_gpus / measured - 1, e

    signed, e = err(c)
    t = e.time
    stages = stage_times(m, p, c.system.gpu)
    last = float(stages[-1][1].total)
    middle = max(float(s[1].total) for s in stages[:-1]) if len(stages) > 1 else last
    out = {"id": rec["id"], "gpu": str(rec["hardware"]["gpu"]).lower(), "signed": signed,
           "step": float(t.total), "measured_step": float(t.total) * (1 + signed),
           "compute": float(t.compute), "bubble": float(t.bubble), "ep": float(t.exposed["ep"]),
           "other": float(t.total) - float(t.compute) - float(t.bubble) - float(t.exposed["ep"]),
           "gemm": float(t.stage.gemm), "attention": float(t.stage.attention),
           "memory_bound": float(t.stage.memory_bound), "last_over_middle": last / middle,
           "dispatcher": p.moe_dispatcher, "nic": None, "mid": None}
    nodes = p.ep * p.etp_resolved // c.system.gpus_per_node  # the EP group fills nodes in order (dgx-h100: 8)
    if p.moe_dispatcher == "alltoall" and "h100" in out["gpu"] and nodes > 1:
        system = c.system.model_copy(update={"nic_efficiency": ep_rdma_efficiency(nodes)})
        out["nic"] = err(c.model_copy(update={"system": system}))[0]
    if p.pp > 1 and last > middle:
        new_step = float(t.total) - float(t.compute) * (1 - middle / last)
        out["mid"] = float(t.total) / new_step * (1 + signed) - 1
    return out


def main(argv: list[str]) -> int:
    pattern = argv[0] if argv else "qwen3-235b"
    rows = [r for rec in yaml.safe_load(A.DEFAULT_RUNS.read_text())
            if pattern in rec["id"] and (r := row(rec)) is not None]
    print(f"{'row':62s} {'signed':>7s} {'step':>6s} {'meas':>6s} {'comp':>6s} {'bubl':>5s} {'EP':>5s} "
          f"{'rest':>5s} {'gemm':>6s} {'attn':>6s} {'membd':>6s} {'last/mid':>8s} {'nic':>7s} {'mid':>7s}")
    for r in rows:
        f = (lambda v: f"{100 * v:+6.1f}%" if v is not None else "      -")
        print(f"{r['id'][7:69]:62s} {100 * r['signed']:+6.1f}% {r['step']:6.2f} {r['measured_step']:6.2f} "
              f"{r['compute']:6.2f} {r['bubble']:5.2f} {r['ep']:5.2f} {r['other']:5.2f} "
              f"{1e3 * r['gemm']:6.1f} {1e3 * r['attention']:6.1f} {1e3 * r['memory_bound']:6.1f} "
              f"{r['last_over_middle']:8.3f} {f(r['nic'])} {f(r['mid'])}")
    groups = [("all", rows), ("h100", [r for r in rows if "h100" in r["gpu"]]),
              ("blackwell", [r for r in rows if "h100" not in r["gpu"]])]
    groups += [(g, [r for r in rows if r["gpu"] == g]) for g in sorted({r["gpu"] for r in rows})]
    for name, sel in groups:
        if not sel:
            continue
        line = f"{name}: {len(sel)} rows, median signed {100 * statistics.median(r['signed'] for r in sel):+.1f}%"
        for k in ("nic", "mid"):
            vals = [r[k] if r[k] is not None else r["signed"] for r in sel]
            line += f", {k} {100 * statistics.median(vals):+.1f}%"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
