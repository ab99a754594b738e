"""Every pair of scored runs that differ in precision, across releases too: the measured low-precision / BF16
(and MXFP8 / FP8-CS, NVFP4 / MXFP8) throughput ratio beside llmplan's (docs/validation.md#mxfp8-gain).

benchmarks/precision_pairs.py pairs records of one release container only; this script drops the release from
the key (same model, GPU, GPU count and layout: tp, pp, cp, ep, vpp, micro-batch, global batch, sequence), so a
BF16 row of one Megatron-Bridge table is paired with the MXFP8 row of another. `releases` prints both (BF16 or wider row | narrower row); a
cross-release pair also carries whatever changed between the containers, so it is weaker evidence than a
same-release pair. `pred/meas` > 1: llmplan credits the lower precision with more than the runs show.

    python benchmarks/mxfp8_gain.py
"""

from __future__ import annotations

import statistics
from typing import Any

import accuracy as A
from precision_pairs import LAYOUT, grouped, precision
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
    out = []
    for rows in grouped(records, key):
        for hi in rows:
            for lo in rows:
                a, b = precision(hi[1]), precision(lo[1])
                if a in ORDER and b in ORDER and ORDER.index(a) < ORDER.index(b):
                    out.append({"hi": hi[0]["id"], "lo": lo[0]["id"], "pair": f"{b}/{a}",
                                "rel": f"{A.record_container(hi[0])}|{A.record_container(lo[0])}",
                                "gpu": str(hi[0]["hardware"]["gpu"]).split(" ")[0],
                                "model": str(hi[0]["model"].get("name")),
                                "layout": "t{}p{}e{}m{}".format(hi[1].tp, hi[1].pp, hi[1].ep, hi[1].micro_batch),
                                "measured": lo[3] / hi[3], "predicted": lo[2] / hi[2],
                                "signed_hi": hi[2] / hi[3] - 1, "signed_lo": lo[2] / lo[3] - 1})
    return sorted(out, key=lambda p: (p["pair"], p["model"], p["gpu"], p["rel"]))


SHORT = {"bf16": "bf16", "tensorwise": "fp8", "current": "fp8", "delayed": "fp8d", "blockwise": "fp8b",
         "mxfp8": "mx8", "nvfp4": "nv4"}
"""Column names of the precisions (80-column output)."""


SHORT_NAMES = (("Nemotron_3_5_", "N3.5-"), ("Nemotron_3_", "N3-"), ("Llama-3/3.1-", "L3-"), ("Llama-3.1-", "L3.1-"),
               ("Llama 3.1 ", "L3.1-"), ("Llama 3 ", "L3-"), ("DeepSeek-", "DS-"), ("gpt-oss-", "GPT-OSS-"))


def short_model(name: str) -> str:
    """The record's model name in at most 10 characters (no bracketed or parenthesised tail)."""
    name = name.split(" [")[0].split(" (")[0]
    for a, b in SHORT_NAMES:
        name = name.replace(a, b)
    return name[:10]


def row(p: dict[str, Any]) -> str:
    """One pair in 80 columns: model, GPU, pair, layout, releases, measured, predicted, p/m, both rows' signed %."""
    lo, hi = p["pair"].split("/")
    rel = p["rel"].replace("nemo:", "")
    return (f"{short_model(p['model']):10s} {p['gpu'][:5]:5s} {SHORT[lo] + '/' + SHORT[hi]:8s} {p['layout'][:10]:10s} "
            f"{rel[:13]:13s} {p['measured']:5.3f} {p['predicted']:5.3f} {p['predicted'] / p['measured']:5.3f} "
            f"{100 * p['signed_hi']:+5.1f} {100 * p['signed_lo']:+5.1f}")


def main() -> int:
    found = all_pairs(load_runs(A.DEFAULT_RUNS))
    print(f"{'model':10s} {'gpu':5s} {'pair':8s} {'layout':10s} {'releases':13s} {'meas':>5s} {'pred':>5s} "
          f"{'p/m':>5s} {'hi%':>5s} {'lo%':>5s}")
    for p in found:
        print(row(p))
    by: dict[str, list[float]] = {}
    for p in found:
        by.setdefault(p["pair"], []).append(p["predicted"] / p["measured"])
    for k, v in by.items():
        print(f"{k}: {len(v)} pairs, median p/m {statistics.median(v):.3f}, {min(v):.3f}-{max(v):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
