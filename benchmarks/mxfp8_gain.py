"""Every pair of scored runs that differ in precision, across releases too: the measured low-precision / BF16
(and MXFP8 / FP8-CS, NVFP4 / MXFP8) throughput ratio beside llmplan's (docs/validation.md#mxfp8-gain).

benchmarks/precision_pairs.py pairs records of one release container only; this script drops the release from
the key (same model, GPU, GPU count and layout: tp, pp, cp, ep, vpp, micro-batch, global batch, sequence), so a
BF16 row of one Megatron-Bridge table is paired with the MXFP8 row of another. `rel` prints both releases; a
cross-release pair also carries whatever changed between the containers, so it is weaker evidence than a
same-release pair. `pred/meas` > 1: llmplan credits the lower precision with more than the runs show.

    python benchmarks/mxfp8_gain.py
"""

from __future__ import annotations

import statistics
from typing import Any

import accuracy as A
from precision_pairs import LAYOUT, precision, scored
from runs import load_runs

ORDER = ("bf16", "tensorwise", "current", "delayed", "blockwise", "mxfp8", "nvfp4")
"""Precisions from the widest; a pair is (wider, narrower) in this order."""


def key(rec: dict, plan: Any) -> tuple:
    """What two records must share to be paired (precision and release left out)."""
    hw = rec["hardware"]
    return (str(rec["model"].get("name")), str(hw.get("gpu")), int(hw.get("gpus") or 1),
            *(getattr(plan, k) for k in LAYOUT))


def all_pairs(records: list[dict]) -> list[dict[str, Any]]:
    """Every (wider, narrower precision) pair of records sharing `key`, with both ratios."""
    groups: dict[tuple, list[tuple[dict, Any, float, float]]] = {}
    for rec in records:
        got = scored(rec)
        if got is not None and (got[0].low_precision or got[0].dtype == "bf16"):
            groups.setdefault(key(rec, got[0]), []).append((rec, *got))
    out = []
    for rows in groups.values():
        for hi in rows:
            for lo in rows:
                a, b = precision(hi[1]), precision(lo[1])
                if a in ORDER and b in ORDER and ORDER.index(a) < ORDER.index(b):
                    out.append({"hi": hi[0]["id"], "lo": lo[0]["id"], "pair": f"{b}/{a}",
                                "rel": f"{A.record_container(hi[0])}|{A.record_container(lo[0])}",
                                "gpu": str(hi[0]["hardware"]["gpu"]).split(" ")[0],
                                "model": str(hi[0]["model"].get("name")),
                                "layout": "tp{} pp{} ep{} mb{}".format(hi[1].tp, hi[1].pp, hi[1].ep, hi[1].micro_batch),
                                "measured": lo[3] / hi[3], "predicted": lo[2] / hi[2],
                                "signed_hi": hi[2] / hi[3] - 1, "signed_lo": lo[2] / lo[3] - 1})
    return sorted(out, key=lambda p: (p["pair"], p["model"], p["gpu"], p["rel"]))


def main() -> int:
    found = all_pairs(load_runs(A.DEFAULT_RUNS))
    print(f"{'model':24s} {'gpu':6s} {'pair':17s} {'layout':18s} {'releases':22s} {'meas':>6s} {'pred':>6s} "
          f"{'p/m':>6s} {'hi%':>6s} {'lo%':>6s}")
    for p in found:
        print(f"{p['model'][:24]:24s} {p['gpu'][:6]:6s} {p['pair']:17s} {p['layout']:18s} {p['rel'][:22]:22s} "
              f"{p['measured']:6.3f} {p['predicted']:6.3f} {p['predicted'] / p['measured']:6.3f} "
              f"{100 * p['signed_hi']:+6.1f} {100 * p['signed_lo']:+6.1f}")
    by: dict[str, list[float]] = {}
    for p in found:
        by.setdefault(p["pair"], []).append(p["predicted"] / p["measured"])
    for k, v in by.items():
        print(f"{k}: {len(v)} pairs, median pred/meas {statistics.median(v):.3f}, min {min(v):.3f}, max {max(v):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
