"""Transformer Engine's userbuffer TP overlap against the published operation-level measurements of the Flux
paper (docs/validation.md#te-overlap-data). A probe: nothing here is priced by llmplan.

Published (Chang et al. 2024, "FLUX: Fast Software-based Communication Overlap On GPUs Through Kernel Fusion",
arXiv 2406.06858v1, §2.3, §5.1, §6): GPT-3 175B MLP GEMMs, bf16, 8-way TP on one node, (n, k) = (49152, 12288)
for AllGather + GEMM and (12288, 49152) for GEMM + ReduceScatter, m = 1,024 to 8,192 tokens; Transformer Engine
1.4.0 with userbuffers, "the best of all configurations"; the baseline is PyTorch's GEMM plus NCCL, unoverlapped.
Overlap efficiency E = 1 - ECT_overlap / ECT_baseline, ECT = overall time - the fastest unsplit GEMM's time (so
E = 1 - (T_TE - GEMM) / NCCL). Quoted from the text (the per-shape values are only in the figures):

- H800 NVLink (Figure 13): TE's E from -40% to 80%; Flux 1.10x to 1.51x faster than TE; Flux's E 37% to 93%.
- A100 NVLink (Figure 12): TE's E from -99% to 74%; Flux 1.01x to 1.33x faster than TE.
- §6, averaged over the operation-level evaluation: TE 20% on H800 NVLink, -61% on A100 NVLink.
- Figure 4 (H800, TE against PyTorch): at small m TE is slower than the unoverlapped baseline; TE does better on
  AllGather than on ReduceScatter, "mainly because the splited GEMM operations in AllGather might run
  concurrently through GPU multiplexing, but ReduceScatter cannot".

The absolute times at m = 4,096 come from the Flux repository's own table (bytedance/flux
docs/performance_report.md at 79807b71f5, 8 x H800 and 8 x A800, TP8): PyTorch GEMM 0.846 / 0.818 ms and NCCL
0.583 / 0.590 ms (AllGather / ReduceScatter) on H800, 2.438 / 2.453 ms and 0.662 / 0.646 ms on A800 (A800:
A100 silicon, 400 GB/s NVLink, standing in for the paper's A100 NVLink cluster's communication); other m scale
them (GEMM by llmplan's whole-GEMM time, NCCL in proportion to the bytes).

What each reading predicts for TE's time (llmplan's tile and wave model, `cost.gemm.grouped_gemm_efficiency`):

- `shared`: the pieces share one GEMM's waves (shipped: `cost.gemm.chunked_gemm_efficiency`);
- `own`: every piece pays its own wave quantisation (the what-if of docs/validation.md#meg-lofo);

each with TE's overlap schedule and no other cost (no launch or synchronisation gap, no SM given to the
communication, no memory-bandwidth contention: generous to TE), in two configurations: `default`, TE's and
Megatron-Core's defaults (the AllGather as a ring exchange in 8 pieces of m/8 rows, piece i computed while piece
i + 1 moves, one NVLink step = NCCL / 7; the ReduceScatter as the 4-piece pipeline, each piece's reduce-scatter
behind the next piece's GEMM, the last one exposed), and `best`, the faster of that and the other form (the
aggregated ring exchange in 4 pieces of m/4 rows; the 8-piece ring-exchange reduce-scatter), as the paper reports
TE's best configuration.

    PYTHONPATH=$PWD python benchmarks/te_overlap_flux.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import llmplan.cost.gemm as G  # noqa: E402
from llmplan.specs.registry import builtin_systems  # noqa: E402

TP = 8
N_FFN, H = 49152, 12288
MS = (1024, 2048, 4096, 8192)
# bytedance/flux docs/performance_report.md at 79807b71f5, m = 4,096, TP8: (GEMM ms, NCCL ms, Flux total ms)
ANCHOR = {"dgx-h800": {"ag": (0.846, 0.583, 0.957), "rs": (0.818, 0.590, 0.932)},
          "dgx-a100": {"ag": (2.438, 0.662, 2.469), "rs": (2.453, 0.646, 2.508)}}
# arXiv 2406.06858v1 §5.1 / §6: TE's overlap efficiency (min, max, mean) and Flux's speedup over TE (min, max)
PUBLISHED = {"dgx-h800": ((-0.40, 0.80, 0.20), (1.10, 1.51)), "dgx-a100": ((-0.99, 0.74, -0.61), (1.01, 1.33))}


def shape(op: str, m: int) -> tuple[int, int, int]:
    """(rows, N, K) of the rank's GEMM: AllGather feeds m x 12288 into the 12288 x 6144 shard; the
    ReduceScatter's GEMM is m x 6144 into 6144 x 12288."""
    return (m, N_FFN // TP, H) if op == "ag" else (m, H, N_FFN // TP)


def piece_time(gpu, whole_s: float, m: int, N: int, K: int, pieces: int, reading: str) -> float:
    """One piece's GEMM time when the m-row GEMM (whole_s) runs as `pieces` pieces."""
    rows = m / pieces
    e_whole = float(G.grouped_gemm_efficiency(gpu, "bf16", m, N, K, 1))
    e_piece = float(G.grouped_gemm_efficiency(gpu, "bf16", rows, N, K, pieces if reading == "shared" else 1))
    return whole_s / pieces * e_whole / e_piece


def te_times(gpu, op: str, m: int, gemm_s: float, nccl_s: float, reading: str) -> dict[str, float]:
    """TE's time per configuration: "default" (Megatron-Core's and TE's defaults: ring exchange in 8 pieces for
    the AllGather, the 4-piece pipeline for the ReduceScatter) and "best" (the faster of the two forms each)."""
    _, N, K = shape(op, m)
    step = nccl_s / (TP - 1)  # one ring step of one piece on one NVLink peer
    ring = piece_time(gpu, gemm_s, m, N, K, TP, reading)
    ring_t = ring + (TP - 1) * max(ring, step)
    if op == "ag":
        agg = piece_time(gpu, gemm_s, m, N, K, TP // 2, reading)
        other = agg + (TP // 2 - 1) * max(agg, step)
        return {"default": ring_t, "best": min(ring_t, other)}
    pipe = piece_time(gpu, gemm_s, m, N, K, G.TE_PIPELINE_SPLITS, reading)
    c = nccl_s / G.TE_PIPELINE_SPLITS
    pipe_t = pipe + (G.TE_PIPELINE_SPLITS - 1) * max(pipe, c) + c
    return {"default": pipe_t, "best": min(pipe_t, ring_t + step)}


def main() -> int:
    systems = builtin_systems()
    readings = ("shared", "own")
    for name, ops in ANCHOR.items():
        gpu = systems[name].gpu
        (lo, hi, mean), (s_lo, s_hi) = PUBLISHED[name]
        print(f"{name} ({gpu.sm_count} SMs): TE's overlap efficiency E, published {lo:+.0%} to {hi:+.0%},"
              f" mean {mean:+.0%}")
        print("  TE ms and E per reading (shared / own) at TE's best / default configuration")
        print("  op m     GEMM  NCCL | TE shared b/d  own b/d   | E shared b/d  own b/d")
        es: dict[tuple[str, str], list[float]] = {(rd, c): [] for rd in readings for c in ("best", "default")}
        for op, (g4096, c4096, flux) in ops.items():
            r, N, K = shape(op, 4096)
            t4096 = float(2 * r * N * K / G.grouped_gemm_efficiency(gpu, "bf16", r, N, K, 1))
            for m in MS:
                rows, N, K = shape(op, m)
                t_m = float(2 * rows * N * K / G.grouped_gemm_efficiency(gpu, "bf16", rows, N, K, 1))
                gemm, nccl = g4096 * t_m / t4096, c4096 * m / 4096
                te = {rd: te_times(gpu, op, m, gemm, nccl, rd) for rd in readings}
                e = {(rd, c): 1 - (te[rd][c] - gemm) / nccl for rd in readings for c in ("best", "default")}
                for k, v in e.items():
                    es[k].append(v)
                print(f"  {op} {m:<5} {gemm:.3f} {nccl:.3f} | {te['shared']['best']:.3f} "
                      f"{te['shared']['default']:.3f} {te['own']['best']:.3f} {te['own']['default']:.3f} | "
                      f"{e['shared', 'best']:+5.0%} {e['shared', 'default']:+5.0%} {e['own', 'best']:+5.0%} "
                      f"{e['own', 'default']:+5.0%}")
                if m == 4096:
                    sp = {(rd, c): te[rd][c] / flux for rd in readings for c in ("best", "default")}
                    print(f"     TE / Flux ({flux:.3f} ms): shared {sp['shared', 'best']:.2f} / "
                          f"{sp['shared', 'default']:.2f}, own {sp['own', 'best']:.2f} / "
                          f"{sp['own', 'default']:.2f} (pub. {s_lo:.2f}-{s_hi:.2f})")
        for (rd, c), v in es.items():
            print(f"  {rd} {c}: E from {min(v):+.0%} to {max(v):+.0%}, mean {sum(v) / len(v):+.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
