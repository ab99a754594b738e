"""Qwen3-235B-A22B's Megatron-Bridge rows split by what differs, and what each priced piece alone would have to
shrink by (docs/validation.md#qwen235).

For every scored mbridge-moe row whose id holds PATTERN (default qwen3-235b; deepseek-v3 or qwen3-30b to compare)
it prints the signed error (+ = predicted faster than measured), the row's GPU, release, precision, dispatcher,
PP / VP / EP, whether the EP overlap is on, then the share of the step each piece takes (the slowest stage's
compute, the exposed expert all-to-all, the rest) and the factor each alone would need to match the measured step
(compute x fc, or exposed EP x fe; '-' where the piece is too small to close it). Then medians of the signed error
per factor value, and, for rows that share GPU, layout and precision with another release, the release-to-release
ratio of tokens/s, predicted against measured (a piece priced wrong by a constant factor moves no such ratio).
Nothing is written; no llmplan code is changed.

    python benchmarks/qwen235_split.py [PATTERN]   (about 30 s)
"""

from __future__ import annotations

import itertools
import statistics
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
import accuracy as A
from qwen235_terms import scored_setup

from llmplan.estimate import estimate_training


def row(rec: dict) -> dict | None:
    """The row's factors, error and the per-piece factors; None where it is not a scored mbridge-moe row."""
    scored = scored_setup(rec)
    if scored is None:
        return None
    (m, c, p), measured = scored
    e = estimate_training(m, c, p)
    signed = float(e.throughput.tokens_per_s) / c.num_gpus / measured - 1
    t = e.time
    step, meas_step = float(t.total), float(t.total) * (1 + signed)
    comp, ep = float(t.compute), float(t.exposed["ep"])
    gap = step - meas_step  # seconds the prediction is too long (> 0 when signed < 0)
    release = rec["id"].split("-pretrain")[0].removeprefix("mbridge-")
    return {"id": rec["id"], "signed": signed, "gpu": rec["hardware"]["gpu"].split(" ")[0].lower(),
            "release": release, "precision": rec["parallel"]["precision"].lower(),
            "dispatcher": p.moe_flex_backend if p.moe_dispatcher == "deepep" and p.moe_flex_backend else
            p.moe_dispatcher, "layout": f"tp{p.tp} pp{p.pp} vp{p.vpp} ep{p.ep} mbs{p.micro_batch}",
            "overlap": "ovl" if p.ep_comm_overlap else "-", "drop": "drop" if "tokendrop" in rec["id"] else "-",
            "step": step, "meas_step": meas_step, "comp_share": comp / step, "ep_share": ep / step,
            "fc": (comp - gap) / comp if gap < comp else None, "fe": (ep - gap) / ep if 0 < gap < ep else None,
            "tok_pred": float(e.throughput.tokens_per_s) / c.num_gpus, "tok_meas": measured}


def main(argv: list[str]) -> int:
    pattern = argv[0] if argv else "qwen3-235b"
    rows = [r for rec in yaml.safe_load(A.DEFAULT_RUNS.read_text())
            if pattern in rec["id"] and (r := row(rec)) is not None]
    f = (lambda v: f"{v:5.2f}" if v is not None else "    -")
    print(f"{'release':9s} {'gpu':6s} {'prec':6s} {'disp':9s} {'layout':22s} {'ovl':3s} {'drop':4s} {'signed':>7s} "
          f"{'step':>6s} {'meas':>6s} {'comp%':>5s} {'ep%':>4s} {'fc':>5s} {'fe':>5s}")
    for r in rows:
        print(f"{r['release']:9s} {r['gpu']:6s} {r['precision']:6s} {r['dispatcher']:9s} {r['layout']:22s} "
              f"{r['overlap']:3s} {r['drop']:4s} {100 * r['signed']:+6.1f}% {r['step']:6.2f} {r['meas_step']:6.2f} "
              f"{100 * r['comp_share']:5.1f} {100 * r['ep_share']:4.1f} {f(r['fc'])} {f(r['fe'])}")
    dropless = [r for r in rows if r["drop"] == "-"]
    print(f"\nmedian signed error of the {len(dropless)} dropless rows by factor:")
    for key in ("gpu", "precision", "dispatcher", "overlap", "layout", "release"):
        groups: dict[str, list[float]] = {}
        for r in dropless:
            groups.setdefault(r[key], []).append(r["signed"])
        print(f"  {key:10s} " + ", ".join(f"{k} {100 * statistics.median(v):+.1f} ({len(v)})"
                                         for k, v in sorted(groups.items())))
    fcs = [r["fc"] for r in dropless if r["fc"] is not None]
    if fcs:
        print(f"  compute factor fc: median {statistics.median(fcs):.3f}, range {min(fcs):.3f}-{max(fcs):.3f}")
    fes = [r["fe"] for r in dropless if r["fe"] is not None]
    print(f"  exposed-EP factor fe: {len(fes)} of {len(dropless)} rows can close with EP alone"
          + (f", median {statistics.median(fes):.3f}, range {min(fes):.3f}-{max(fes):.3f}" if fes else ""))
    print("\nrelease to release, same GPU, layout, precision and dispatcher (tokens/s new / old):")
    same: dict[tuple, list[dict]] = {}
    for r in dropless:
        same.setdefault((r["gpu"], r["layout"], r["precision"], r["dispatcher"]), []).append(r)
    for key, group in same.items():
        group = sorted(group, key=lambda r: r["release"])
        for old, new in itertools.pairwise(group):
            pred, meas = new["tok_pred"] / old["tok_pred"], new["tok_meas"] / old["tok_meas"]
            print(f"  {key[0]:6s} {key[1]:22s} {key[2]:6s} {old['release']:>8s} -> {new['release']:8s} "
                  f"predicted {pred:5.3f} measured {meas:5.3f} ({100 * (pred / meas - 1):+5.1f}%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
