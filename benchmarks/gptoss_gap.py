"""GPT-OSS's unplaced step time against the shape mechanisms issue 32 names (docs/validation.md#gptoss-gemm-shapes).

For every scored mbridge-moe row of GPT-OSS 120B and Qwen3-30B-A3B it prints, per MoE layer and micro-batch on
the most-loaded stage: the measured step less the predicted one ("gap"), llmplan's priced GEMM, attention and
memory-bound time (forward + backward), and what each shape mechanism would add if priced:

* tile256: the matmuls' tile and wave quantisation at Blackwell's 2-SM 256 x 256 output tiles (half as many
  tile slots as SMs) on each pass's own output shape (forward M x N, input gradient M x K, weight gradient
  N x K, that one floored at 0.9 for split-K / stream-K), against the 128 x 128 forward shape priced
  (cost.gemm.grouped_gemm_efficiency), less the expert matmuls already priced at 256 (cost.gemm.expert_gemm_tile);
* perexp: the expert matmuls' waves counted per expert (one cuBLAS call each, as Transformer Engine's
  multi-stream grouped GEMM issues them) instead of over the rank's experts together: an upper bound, the
  streams overlap the calls' tails;
* kblk: an MXFP8 K block of 128 padding K (2,880 = 22.5 blocks);
* router: the 128-expert router matmul as priced; out/L: output layer and loss per layer as priced;
* imb: the force-balanced routing's most-loaded-rank factor as priced (cost.moe.routing_imbalance).

tile and perexp are for Blackwell's 2-SM tiles (nan elsewhere). Nothing here changes a prediction:
`python benchmarks/gptoss_gap.py` (about 10 s).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).parent))
import accuracy as A  # noqa: E402

from llmplan.cost.compute import layer_seconds, output_seconds  # noqa: E402
from llmplan.cost.gemm import TILE, expert_gemm_tile, grouped_gemm_efficiency, layer_gemms  # noqa: E402
from llmplan.cost.moe import routing_imbalance  # noqa: E402
from llmplan.estimate import estimate_training  # noqa: E402
from llmplan.specs.registry import builtin_systems  # noqa: E402

MODELS = ("gpt-oss-120b", "qwen3-30b-a3b")


def fill(M: Any, N: Any, groups: Any, tile: int, slots: int) -> Any:
    """Tile fill times wave fill of `groups` M x N outputs in tile x tile tiles over `slots` concurrent tiles
    (NVIDIA Matrix Multiplication Background User's Guide: tile and wave quantization)."""
    tm, tn = np.ceil(M / tile), np.ceil(N / tile)
    tiles = tm * tn * groups
    return M * N / (tm * tn * tile * tile) * tiles / (np.ceil(tiles / slots) * slots)


def row(rec: dict) -> str | None:
    fam = A.family(rec["id"])
    if fam != "mbridge-moe" or not any(k in rec["id"] for k in MODELS) or A.skip_reason(rec):
        return None
    rows = A.predict(rec, fam)
    if not rows:
        return None
    system = builtin_systems()[A.record_system(rec)]
    gpus = rec["hardware"]["gpus"]
    if A.nvlink_segment_gpus(rec, system):
        system = system.with_options(domain_gpus=A.nvlink_segment_gpus(rec, system))
    plan, m = A.plan_for(rec, fam, gpus), A.model_for(rec, fam)
    e = estimate_training(m, A.cluster_of(system, gpus), plan)
    gpu, fmt = system.gpu, plan.gemm_format
    pred = float(e.time.total)
    meas = pred * rows[0][1] / rows[0][2]  # throughput rows: measured step = predicted x predicted / measured rate
    layers_mb = m.num_hidden_layers / plan.pp * float(e.time.compute / e.time.stage.total)
    (g1, gb), a1, mb1 = layer_seconds(m, plan, gpu, True)
    gemms = layer_gemms(m, plan, True)
    groups = [m.num_experts / plan.ep if g.module == "expert" else 1 for g in gemms]
    tiles = [expert_gemm_tile(plan, fmt) if g.module == "expert" else TILE for g in gemms]
    weight = [g.flops / grouped_gemm_efficiency(gpu, fmt, g.M, g.N, g.K, n, t)
              for g, n, t in zip(gemms, groups, tiles, strict=True)]
    secs = [(g1 + gb) * w / sum(weight) for w in weight]
    tile = perexp = kblk = 0.0
    for g, n, s in zip(gemms, groups, secs, strict=True):
        old = fill(g.M, g.N, n, 128, gpu.sm_count)
        half = gpu.sm_count // 2
        passes = (fill(g.M, g.N, n, 256, half), fill(g.M, g.K, n, 256, half), max(fill(g.N, g.K, n, 256, half), 0.9))
        if not (g.module == "expert" and expert_gemm_tile(plan, fmt) != TILE):  # priced at 256 already
            tile += s * (old * sum(1 / p for p in passes) / 3 - 1)
        if g.module == "expert":
            perexp += s * (old / fill(g.M, g.N, 1, 256, half) - 1)
        if fmt == "mxfp8":
            kblk += s * (np.ceil(g.K / 128) * 128 / g.K - 1)
    head, loss = output_seconds(m, plan, gpu)
    ms = 1e3
    if not gpu.name.lower().startswith(("b", "gb")):  # 2-SM tiles are Blackwell's (tcgen05); Hopper has none
        tile = perexp = float("nan")
    return (f"{rec['id'][7:56]:49s} {100 * (pred - meas) / meas:+6.1f}% {(meas - pred) / layers_mb * ms:6.2f} "
            f"{(g1 + gb) * ms:5.2f} {3 * a1 * ms:5.2f} {3 * mb1 * ms:5.2f} {tile * ms:+5.2f} {perexp * ms:+5.2f} "
            f"{kblk * ms:+5.2f} {secs[-1] * ms:6.3f} {(3 * head + loss) / m.num_hidden_layers * ms:5.2f} "
            f"{float(routing_imbalance(m, plan)):.4f}")


def main() -> int:
    print(f"{'row (ms per MoE layer and micro-batch)':49s} {'step':>7s} {'gap':>6s} {'gemm':>5s} {'attn':>5s} "
          f"{'mem':>5s} {'tile':>5s} {'perex':>5s} {'kblk':>5s} {'router':>6s} {'out/L':>5s} {'imb':>6s}")
    for rec in yaml.safe_load(A.DEFAULT_RUNS.read_text()):
        line = row(rec)
        if line:
            print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
