"""How much the small per-call MoE kernels (docs/formulas.md#moe.small_kernels) move each MoE model's published
rows, and the second published profile's check of the chunk-sort map's rate (docs/validation.md#moe-small-kernels).

For every mbridge-moe and bridgecard row: the predicted throughput with cost.moe_kernels priced against the same
prediction with it set to 0, median and largest change per model (the id's model part).

    python benchmarks/moe_small_kernels.py
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).parent))
import accuracy as A
from runs import load_runs

from llmplan.cost import compute as C
from llmplan.cost import moe_kernels as MK

# Second profile: "GLM-5.2 131K Flex dispatcher: all-to-all vs DeepEP (16 SMs)", a public GitHub report found in the
# code index (its repository is not named there), all-to-all arm: GLM-5.2 (hidden 6,144, 256 routed experts, top-8)
# on 16 B300, TP1 PP2 EP8 CP8, sequence 131,072, rank 0; _make_chunk_sort_map_kernel 560 calls 0.102 s,
# _sort_chunks_by_map_kernel 840 calls 0.397 s.
GLM_TOKENS, GLM_EXPERTS, GLM_TOPK, GLM_HIDDEN = 131072 // 8, 256, 8, 6144
GLM_SORT_MAP_S, GLM_SORT_S = 0.102 / 560, 0.397 / 840


def row_changes() -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for r in load_runs():
        fam = A.family(r["id"])
        if fam not in ("mbridge-moe", "bridgecard"):
            continue
        rows = A.predict(r, fam)
        with mock.patch.object(C, "moe_kernel_seconds", lambda *a, **k: 0.0):
            rows0 = A.predict(r, fam)
        if not rows or not rows0 or not rows[0][1] or not rows0[0][1]:
            continue
        key = r["id"].split("-pretrain-")[-1].split("-dgx")[0] if "-pretrain-" in r["id"] else r["id"][:40]
        out.setdefault(key, []).append(100 * (rows[0][1] / rows0[0][1] - 1))
    return out


def main() -> int:
    print("model (row id part)                       rows  throughput change: median   largest")
    for k, v in sorted(row_changes().items()):
        print(f"{k:42s} {len(v):4d}  {statistics.median(v):+8.2f}%  {min(v):+8.2f}%")
    rows = GLM_TOKENS * GLM_TOPK
    priced = MK.SORT_MAP_S * rows * GLM_EXPERTS
    per_row = 280.4e-3 / 1536 / (MK.S1_TOKENS * MK.S1_TOPK) * rows
    print(f"\nGLM-5.2 B300 chunk-sort map: measured {1e6 * GLM_SORT_MAP_S:.1f} us a call; priced (rows x chunks at S1's "
          f"rate) {1e6 * priced:.1f} us ({100 * (priced / GLM_SORT_MAP_S - 1):+.0f}%); per row alone at S1's rate "
          f"{1e6 * per_row:.1f} us ({100 * (per_row / GLM_SORT_MAP_S - 1):+.0f}%)")
    sort_bytes = rows * GLM_HIDDEN * 4
    s1_bytes = MK.S1_TOKENS * MK.S1_TOPK * 2048 * 4  # Ultra's latent width 2,048
    print(f"sort by local expert (_sort_chunks_by_map_kernel), effective bandwidth: GLM-5.2 B300 "
          f"{sort_bytes / GLM_SORT_S / 1e12:.2f} TB/s, Nemotron-3 Ultra GB200 (S1) "
          f"{s1_bytes / (240.8e-3 / 2304) / 1e12:.2f} TB/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
