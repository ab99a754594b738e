"""The Megatron-Bridge MoE rows' signed error grouped by the switches a row's id names (docs/validation.md#hybrid-bw).

For every scored mbridge-moe row (and, with --dense, mbridge-dense) it reads GPU, precision, TP, EP, GBS / MBS
and the release from the record id, the CUDA-graph scope and recompute modules from the release's preset
(accuracy.mbridge_cuda_graphs, mbridge_recompute_modules), and prints the signed error (+ = predicted faster than
measured) of each row, then the median and range per (model, switch) for each switch, so that a gap that follows
a switch (TP2, a release, a precision) rather than a model shows as such.

    python benchmarks/nemotron_switches.py [--all-models] [--dense]
"""

from __future__ import annotations

import re
import statistics
import sys
from collections import defaultdict

import yaml

import accuracy as A

ID = re.compile(r"(\d\d\.\d\d(?:\.\d\d)?)-pretrain-(.*)-dgx-(\w+?)-(\d+)gpu-(\w+)-tp(\d+)pp(\d+)cp\d+ep(\w+?)vp\w+?"
                r"gbs(\d+)mbs(\d+)")
FIELDS = ("model", "gpu", "precision", "tp", "pp", "ep", "gbs", "mbs", "release", "graphs", "recompute")


def rows(all_models: bool, dense: bool) -> list[dict]:
    """One dict a scored row: the FIELDS, the measured and predicted tokens/s per GPU and the signed error (%)."""
    fams = ("mbridge-moe", "mbridge-dense") if dense else ("mbridge-moe",)
    out = []
    for rec in yaml.safe_load(A.DEFAULT_RUNS.read_text()):
        fam = A.family(rec["id"])
        if fam not in fams or not (all_models or "nemotron" in rec["model"]["name"].lower()):
            continue
        match = ID.search(rec["id"])
        try:
            got = [q for q in A.predict(rec, fam) if q[0] != "fits"]
        except (A.LlmplanError, ValueError):
            continue
        if not got or not match:
            continue
        release, model, gpu, _, precision, tp, pp, ep, gbs, mbs = match.groups()
        _, pred, meas = got[0]
        out.append({"id": rec["id"], "model": model, "gpu": gpu, "precision": precision, "tp": tp, "pp": pp,
                    "ep": ep, "gbs": gbs, "mbs": mbs, "release": release, "graphs": A.mbridge_cuda_graphs(rec),
                    "recompute": ",".join(A.mbridge_recompute_modules(rec)) or "-", "measured": meas,
                    "predicted": pred, "err": 100 * (pred - meas) / meas})
    return out


def main(argv: list[str]) -> int:
    got = rows("--all-models" in argv, "--dense" in argv)
    for r in sorted(got, key=lambda r: (r["model"], r["gpu"], r["release"], r["precision"])):
        print(f"{r['err']:+6.1f}%  {r['measured']:8.0f} {r['predicted']:8.0f}  " + " ".join(str(r[k]) for k in FIELDS))
    for switch in FIELDS[1:]:
        by: dict[tuple[str, str], list[float]] = defaultdict(list)
        for r in got:
            by[(r["model"], r[switch])].append(r["err"])
        print(f"\nby {switch}:")
        for (model, value), errs in sorted(by.items()):
            print(f"  {model:28s} {value:24s} {len(errs):3d} rows  median {statistics.median(errs):+6.1f}%  "
                  f"[{min(errs):+.1f}, {max(errs):+.1f}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
