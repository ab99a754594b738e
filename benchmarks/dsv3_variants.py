"""DeepSeek-V3's Megatron-Bridge variant rows against the main rows of the same GPU and layout
(docs/validation.md#dsv3-variants).

The 25.09 table labels its DeepSeek-V3 rows token-drop (B200, GB200) and dropless (H100), the 25.11 table 'w/ MTP'
(B200) and 'w/o MTP' (GB200, GB300); from 26.02 the rows carry no label. Prints every DeepSeek-V3 (and V4 Flash)
row of the mbridge-moe family with what its preset sets that moves the step (dispatcher and flex backend,
capacity factor, CUDA graphs, recompute modules, EP overlap, MTP), llmplan's signed error, and the time the
measured step leaves unplaced per micro-batch and per MoE layer a stage and micro-batch (hybrid_gap.unplaced);
then the like-for-like series: one GPU and layout across releases, with each row's step terms per micro-batch.

    python benchmarks/dsv3_variants.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
import accuracy as A
import hybrid_gap as H

SERIES = {  # (GPU, layout) -> id fragment shared by the rows of one GPU and layout across releases
    "B200 PP16 EP8 MBS1": ("-dgx-b200-", "tp1pp16cp1ep8"),
    "GB200 PP4 VP4 EP64 MBS1": ("-dgx-gb200-", "tp1pp4cp1ep64vp4"),
}


def rows() -> list[tuple[dict, dict]]:
    """(record, row summary) of every scored DeepSeek-V3 / V4 row of mbridge-moe, oldest release first."""
    out = []
    for rec in yaml.safe_load(A.DEFAULT_RUNS.read_text()):
        rid = rec["id"]
        if not (rid.startswith("mbridge-") and ("deepseekv3" in rid or "deepseekv4" in rid)):
            continue
        m, cluster, plan = A.record_setup(rec, "mbridge-moe")
        r = H.row(rec)
        tps, parts = H.terms(m, cluster, plan)
        moe_layers = m.num_hidden_layers - (m.first_k_dense_replace or 0) + m.num_nextn_predict_layers
        per_stage = moe_layers / (plan.pp * plan.vpp) * plan.vpp  # a rank's MoE layers
        r |= {"per_moe_layer_mb_ms": r["per_mb_ms"] / per_stage, "parts": parts, "release": A.source_ref(rec)}
        out.append((rec, r))
    return sorted(out, key=lambda x: x[1]["release"])


def describe(rec: dict, r: dict) -> str:
    p = r["plan"]
    label = rec["model"]["name"].split("[")[-1].rstrip("]")
    disp = p.moe_dispatcher + (f"/{p.moe_flex_backend}" if p.moe_dispatcher == "deepep" else "")
    return (f"{'.'.join(map(str, r['release'])):8s} {rec['hardware']['gpu'].split()[0]:5s} "
            f"tp{p.tp}pp{p.pp}vp{p.vpp}ep{p.ep} gbs{p.global_batch:5d} {label[:22]:22s} {disp:15s} "
            f"cf {p.moe_capacity_factor or '-'} graphs {p.cuda_graphs:14s} rc {','.join(p.recompute_modules) or '-':16s} "
            f"ovl {int(p.ep_comm_overlap)} {100 * r['err']:+6.1f}%  unplaced/mb {r['per_mb_ms']:6.1f} ms, "
            f"/MoE layer/mb {r['per_moe_layer_mb_ms']:5.2f} ms")


def main() -> int:
    got = rows()
    for rec, r in got:
        print(describe(rec, r))
    for name, (gpu, layout) in SERIES.items():
        print(f"\n{name}: measured / predicted tokens/s per GPU, and the predicted terms per micro-batch (ms)")
        for rec, r in got:
            if gpu in rec["id"] and layout in rec["id"]:
                mb = r["plan"].num_microbatches
                terms = " ".join(f"{k} {v / mb:.1f}" for k, v in r["parts"].items() if k != "total")
                print(f"  {'.'.join(map(str, r['release'])):8s} {r['meas']:6.0f} / {r['pred']:6.0f} "
                      f"({100 * r['err']:+5.1f}%) mb {mb:3d}: {terms}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
