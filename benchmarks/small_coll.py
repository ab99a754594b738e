"""Probe: llmplan's all-reduce time per size against published nccl-tests all_reduce_perf tables, 8 B - 16 GiB.

Each case is one published table (in-place column, microseconds), read from:
  h100-1n  NVIDIA/exemplar-performance b4ac983a microbenchmarks/nccl/README.md (DGX H100, 8 GPUs, sample
           AllReduce output)
  h100-2n  NVIDIA/nccl-tests issue #309 (github.com/NVIDIA/nccl-tests/issues/309), first table: Dell XE9680,
           8 x H100 + 8 x CX-7 400 Gb/s IB a node, NCCL 2.26.2, 2 nodes (16 ranks)
  h100-4n  the same issue, 4 nodes (32 ranks), same hosts and NCCL
  h100-8n  the same issue, comment by gj-aion 2025-06-18, 8 nodes (64 ranks), IB 400G, 1 MiB - 8 GiB, defaults
  a100-2n  oracle-quickstart/oci-hpc-oke 72d816ea README.md, "Run the NCCL test" sample: BM.GPU4.8 (8 x
           A100-SXM4-40GB), 2 nodes (16 ranks)
Predicted: llmplan.topology.collectives.collective_time("all-reduce", S, every GPU) on the named built-in profile.
The 2-node H100 run uses NVLSTree (its 16 GiB busbw, 469 GB/s, is above the NICs' 400): its large sizes are not a
test of the ring / tree bandwidth; its small sizes are a test of the latency.

Usage: PYTHONPATH=. python benchmarks/small_coll.py [--case h100-2n] [--summary]
"""

from __future__ import annotations

import argparse
import math

from llmplan.specs.cluster import ClusterSpec
from llmplan.specs.registry import builtin_systems
from llmplan.topology.collectives import collective_time
from llmplan.topology.placement import span_of_ranks

K, M, G = 2**10, 2**20, 2**30
_SIZES = [8 * 2**i for i in range(32)]  # 8 B .. 16 GiB

# name: (profile, nodes, first size, in-place times in us from the first size up)
CASES: dict[str, tuple[str, int, int, list[float]]] = {
    "h100-1n": ("dgx-h100", 1, 8, [
        13.03, 13.07, 13.52, 14.72, 15.79, 15.77, 16.01, 16.17, 16.43, 16.46, 16.83, 17.24, 18.68, 18.85, 19.19,
        19.50, 19.70, 26.93, 42.09, 53.82, 82.03, 123.0, 198.9, 324.7, 586.0, 1113.4, 2149.3, 4016.4, 7938.0,
        15754, 31328, 62636]),
    "h100-2n": ("dgx-h100", 2, 8, [
        24.70, 24.93, 25.02, 25.21, 25.62, 25.90, 26.31, 26.65, 28.22, 29.72, 31.67, 32.24, 33.47, 33.08, 38.12,
        46.79, 70.33, 71.47, 76.62, 94.22, 131.4, 183.8, 267.7, 466.3, 749.2, 1276.0, 2355.1, 4470.2, 8717.2,
        17284, 34365, 68668]),
    "h100-4n": ("dgx-h100", 4, 8, [
        34.75, 34.45, 35.55, 34.92, 35.04, 35.82, 36.72, 37.10, 40.03, 41.42, 45.55, 46.39, 46.79, 47.60, 55.06,
        66.86, 72.78, 82.21, 132.2, 154.0, 202.4, 258.3, 370.3, 574.4, 1013.1, 1772.4, 3111.7, 5802.8, 11501,
        22874, 45573, 91081]),
    "h100-8n": ("dgx-h100", 8, M, [
        115.7, 143.3, 203.8, 321.4, 373.5, 508.2, 709.2, 1149.5, 2028.1, 3509.4, 7414.5, 13300, 26340, 52754]),
    "a100-2n": ("dgx-a100-40gb", 2, 8, [
        34.74, 35.65, 35.41, 37.05, 37.21, 38.52, 39.35, 40.56, 41.29, 43.36, 46.51, 48.00, 49.17, 50.09, 53.31,
        65.81, 72.87, 84.50, 100.1, 127.8, 168.4, 265.9, 452.0, 812.7, 1546.1, 3065.9, 6070.5, 9073.4, 17557,
        34417, 67811]),
}


def rows(case: str) -> list[tuple[int, float, float, str]]:
    """(size, measured s, predicted s, llmplan's algorithm) for each size of a case's table."""
    prof, nodes, first, times = CASES[case]
    s = builtin_systems()[prof]
    g = s.gpus_per_node
    cl = ClusterSpec(system=s, num_nodes=nodes, gpus_per_node=g)
    span = span_of_ranks(list(range(nodes * g)), cl)
    sizes = [x for x in _SIZES if x >= first][: len(times)]
    out = []
    for S, t in zip(sizes, times):
        ct = collective_time("all-reduce", float(S), span, s)
        out.append((S, t * 1e-6, ct.seconds, ct.algorithm))
    return out


def _fmt(S: int) -> str:
    for unit, v in (("G", G), ("M", M), ("K", K)):
        if S >= v:
            return f"{S // v}{unit}"
    return str(S)


def band(case: str, lo: int, hi: int) -> float:
    """Geometric mean of predicted / measured over the sizes lo <= S <= hi."""
    r = [p / m for S, m, p, _ in rows(case) if lo <= S <= hi]
    return math.exp(sum(map(math.log, r)) / len(r)) if r else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", choices=sorted(CASES), action="append")
    ap.add_argument("--summary", action="store_true", help="one line per case: pred/meas by size band")
    a = ap.parse_args()
    cases = a.case or list(CASES)
    if a.summary:
        print(f"{'case':8} {'<=64K':>7} {'128K-1M':>8} {'2M-16M':>7} {'32M-256M':>9} {'>=512M':>7}  (pred/meas)")
        for c in cases:
            b = [band(c, *x) for x in ((0, 64 * K), (128 * K, M), (2 * M, 16 * M), (32 * M, 256 * M), (512 * M, 64 * G))]
            print(f"{c:8} " + " ".join(f"{v:>{w}.2f}" for v, w in zip(b, (7, 8, 7, 9, 7))))
        return
    for c in cases:
        print(f"{c} ({CASES[c][0]}, {CASES[c][1]} node(s))")
        print(f"  {'size':>5} {'meas us':>9} {'pred us':>9} {'pred/meas':>9}  pick")
        for S, m, p, alg in rows(c):
            print(f"  {_fmt(S):>5} {m * 1e6:>9.1f} {p * 1e6:>9.1f} {p / m:>9.2f}  {alg}")


if __name__ == "__main__":
    main()
