"""BLOOM's micro-batch pairs (issue 32, docs/validation.md#mbs-gain): the runs of one chronicle table that differ
in the micro-batch alone, the throughput gain of the larger micro-batch measured and priced, and what each
candidate mechanism would price. Analysis only: nothing in llmplan reads this file; candidates are applied by
patching a copy of the cost functions in this process.

Pairs: BLOOM records whose ids differ only in `mbsN` (N -> 2N); gain = t(N) / t(2N) - 1 of the measured and the
priced iteration time; gap = measured - priced gain, in points. `F` is the fixed time per layer and micro-batch
slot (n + p - 1 slots a step) that, added to both rows, would make the priced gain the measured one.

Candidates (--candidate):
  none        as shipped
  shapes      backward GEMMs at their own shapes: dgrad M x K x N, wgrad K x N x M (reduction over b.s tokens)
              in place of the forward's shape (NVIDIA Matrix Multiplication Background guide: the same
              tile / wave / short-K terms, on each GEMM's own dimensions)
  tile256     A100 GEMMs in 256 x 128 (or 128 x 256) tiles, one a SM, wave 108 (the guide's A100 example),
              the better orientation, in place of 128 x 128 tiles
  fused       the fused softmax on every row (the prequel's eager-fp32 fallback removed), to show how much of
              the priced TP8 2 -> 4 gain the kernel switch already gives
  fixed=X     X ms more per layer and micro-batch slot (a sweep of the unsourced fixed cost)
  launches=F,B  F forward and B backward host launches per layer (cost.kernels counts Megatron-Core's 19, 27):
              what a count of the legacy Megatron-DeepSpeed layer would price under CUDA_LAUNCH_BLOCKING=1
--simulate: DeepSpeed's TrainSchedule (deepspeed/runtime/pipe/schedule.py at 2151c787a) executed instruction by
instruction with blocking send / receive rendezvous, against 1F1B's (n - 1) max + sum of the stages.

    PYTHONPATH=. python benchmarks/mbs_pairs.py [--candidate NAME] [--simulate]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import accuracy as A  # noqa: E402

import llmplan.cost.compute as C  # noqa: E402
import llmplan.cost.gemm as G  # noqa: E402
from llmplan.estimate import estimate_training  # noqa: E402

OUTLIER = ("bloom-prequel-nheads-round2-L78h13824a64-dp8tp4pp12mbsX", 1)
"""The nheads-round2 micro-batch-1 row: 148.2 s measured against 103.5 s at micro-batch 2, +43%; +37% off on its
own (docs/validation.md#nemo-mbs), left out of the clean pairs' statistics."""


def pairs(records: list[dict]) -> list[tuple[str, dict, dict]]:
    """(key, lower-mbs record, doubled-mbs record) of every BLOOM iteration-time pair that differs in mbs alone."""
    groups: dict[str, dict[int, dict]] = {}
    for r in records:
        mb = re.search(r"mbs(\d+)", r["id"])
        if A.family(r["id"]) != "bloom" or not mb or "iteration_time_s" not in r.get("measured", {}):
            continue
        groups.setdefault(r["id"].replace(mb.group(0), "mbsX"), {})[int(mb.group(1))] = r
    out = []
    for key, d in groups.items():
        for a in sorted(d):
            if 2 * a in d:
                out.append((key, d[a], d[2 * a]))
    return out


def slots(plan: Any) -> int:
    """Micro-batch slots of one pipeline's step: n + p - 1."""
    return int(plan.global_batch // (plan.micro_batch * plan.dp) + plan.pp - 1)


def priced(rec: dict) -> tuple[float, Any, Any]:
    """(iteration seconds, estimate, plan) as accuracy.py prices the record (shipped constants)."""
    m, c, p = A.record_setup(rec, "bloom")
    e = estimate_training(m, c, p)
    return float(e.time.total), e, p


def shapes_patch() -> None:
    """Backward GEMMs at their own shapes (dgrad M x K x N, wgrad K x N x M); BLOOM has no chunked TP overlap."""
    def seconds(m: Any, plan: Any, gpu: Any, moe: bool, only: str | None = None) -> tuple[Any, Any]:
        gemms = G.layer_gemms(m, plan, moe)
        per_flop = G.layer_flops(m, plan, moe).gemm / sum(g.flops for g in gemms)
        fmt = plan.gemm_format
        scale = per_flop / gpu.sustained_flops(fmt)
        eff = G.grouped_gemm_efficiency
        fwd = bwd = 0.0
        for f, M, N, K, _role, _module in gemms:
            fwd += f / eff(gpu, fmt, M, N, K, 1) * scale
            bwd += f / eff(gpu, fmt, M, K, N, 1) * scale + f / eff(gpu, fmt, K, N, M, 1) * scale
        return fwd, bwd
    C.layer_gemm_seconds = seconds  # type: ignore[assignment]


def tile256_patch() -> None:
    """A100 GEMMs in 256 x 128 tiles (either orientation, the better), one a SM: waves of sm_count tiles."""
    orig = G.grouped_gemm_efficiency

    def eff(gpu: Any, dtype: str, M: Any, N: Any, K: Any, groups: Any, tile: int = G.TILE) -> Any:
        if "a100" not in gpu.name.lower() or gpu.gemm_efficiency or tile != G.TILE:
            return orig(gpu, dtype, M, N, K, groups, tile)

        def fill(tm: int, tn: int) -> Any:
            a, b = np.ceil(np.maximum(M, 1) / tm), np.ceil(np.maximum(N, 1) / tn)
            tiles = a * b * groups
            waves = np.ceil(tiles / gpu.sm_count)
            return np.maximum(M, 1) * np.maximum(N, 1) / (a * b * tm * tn) * tiles / (waves * gpu.sm_count)
        best = np.maximum(fill(256, 128), fill(128, 256))
        return gpu.max_gemm_fraction(dtype) * best * K / (K + gpu.gemm_k_half_for(dtype))
    G.grouped_gemm_efficiency = eff  # type: ignore[assignment]


def fused_patch() -> None:
    """The fused softmax on every BLOOM row."""
    A.bigscience_softmax_kernel = lambda rec, fam, heads, tp, mb: "fused"  # type: ignore[assignment]


def launches_patch(fwd: float, bwd: float) -> None:
    """Every plan's layers launch `fwd` kernels forward and `bwd` backward (the host's launches, cost.step)."""
    import llmplan.cost.step as S
    from llmplan.cost.kernels import Kernels
    S.layer_launch_average = lambda m, plan: Kernels(fwd, bwd)  # type: ignore[assignment]


SHORT = (("bloom-prequel-", ""), ("48-node-contenders", "contenders"), ("gbs-and-tp-variations", "gbs-tp"),
         ("nheads-round2", "nheads2"), ("rebalancing-layers", "rebalance"), ("mbsX", ""), ("z1", ""))


def label(key: str) -> str:
    """A pair's key, short enough for an 80-column table."""
    for a, b in SHORT:
        key = key.replace(a, b)
    return key


def table(fixed_s: float = 0.0) -> list[float]:
    """Print every pair; return the clean pairs' gaps (points)."""
    recs = yaml.safe_load(A.DEFAULT_RUNS.read_text())
    gaps = []
    print(f"{'pair (table-model-layout)':44s} {'mbs':>5s} {'meas':>6s} {'priced':>6s} {'gap':>5s} {'F ms':>6s}")
    for key, lo, hi in pairs(recs):
        ta, _, pa = priced(lo)
        tb, _, pb = priced(hi)
        layers = -(-lo["model"]["layers"] // pa.pp)
        na, nb = slots(pa), slots(pb)
        ta, tb = ta + fixed_s * layers * na, tb + fixed_s * layers * nb
        g = lo["measured"]["iteration_time_s"] / hi["measured"]["iteration_time_s"]
        gap = 100 * (g - ta / tb)
        need = (g * tb - ta) / (na - g * nb) / layers  # fixed s per layer and slot that closes it
        print(f"{label(key)[:44]:44s} {pa.micro_batch:>2d}->{pb.micro_batch:<2d} {100 * (g - 1):+6.1f} "
              f"{100 * (ta / tb - 1):+6.1f} {gap:+5.1f} {1e3 * need:6.2f}")
        if (key.startswith(OUTLIER[0]), pa.micro_batch) != (True, OUTLIER[1]):
            gaps.append(gap)
    print(f"clean pairs {len(gaps)}: gap median {statistics.median(gaps):+.2f}, mean {statistics.mean(gaps):+.2f}, "
          f"|gap| median {statistics.median(abs(x) for x in gaps):.2f} points;\n"
          f"  measured > priced in {sum(x > 0 for x in gaps)}")
    return gaps


def schedule_ops(stage: int, stages: int, n: int) -> list[tuple[str, Any]]:
    """One stage's instructions in DeepSpeed's TrainSchedule (schedule.py at 2151c787a: 2(n + p - 1) steps, a
    forward on steps of the stage's parity, the receive before the send in a forward step, the send before the
    receive in a backward step): ("F" | "B", micro-batch) and ("x", exchange id) for each blocking transfer."""
    def step(k: int) -> tuple[int, bool]:
        if k % 2 == stage % 2:
            return (k if k % 2 == 0 else k - 1) // 2 - stage // 2, True
        if k % 2 == 0:
            return k // 2 - stages + (stage + 1) // 2, False
        return (k - 1) // 2 - stages + 1 + stage // 2, False
    ops: list[tuple[str, Any]] = []
    prev = -1
    for k in range(2 * (n + stages - 1)):
        mb, fwd = step(k)
        ok, was = 0 <= mb < n, 0 <= prev < n
        if fwd and stage > 0:
            ops += [("x", ("act", stage - 1, k))] if ok else []
            ops += [("x", ("grad", stage - 1, k))] if was else []
        if not fwd and stage < stages - 1:
            ops += [("x", ("act", stage, k))] if was else []
            ops += [("x", ("grad", stage, k))] if ok else []
        if ok:
            ops.append(("F" if fwd else "B", mb))
        prev = mb
    return ops


def simulate(fwd: list[float], bwd: list[float], n: int, transfer_s: float = 0.0) -> float:
    """Makespan of DeepSpeed's TrainSchedule with stage s's forward fwd[s] and backward bwd[s], each exchange a
    rendezvous of its two stages taking transfer_s."""
    p = len(fwd)
    ops = [schedule_ops(s, p, n) for s in range(p)]
    at, t, waiting = [0] * p, [0.0] * p, {}
    moved = True
    while moved:
        moved = False
        for s in range(p):
            while at[s] < len(ops[s]):
                kind, v = ops[s][at[s]]
                if kind != "x":
                    t[s] += fwd[s] if kind == "F" else bwd[s]
                    at[s] += 1
                    moved = True
                    continue
                if v in waiting and waiting[v][0] != s:
                    other, when = waiting.pop(v)
                    t[s] = t[other] = max(t[s], when) + transfer_s
                    at[s] += 1
                    at[other] += 1
                    moved = True
                    continue
                waiting[v] = (s, t[s])
                break
    if any(at[s] < len(ops[s]) for s in range(p)):
        raise RuntimeError("schedule deadlocked")
    return max(t)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--candidate", default="none")
    ap.add_argument("--simulate", action="store_true")
    args = ap.parse_args()
    fixed = 0.0
    name, _, value = args.candidate.partition("=")
    try:
        if name == "shapes":
            shapes_patch()
        elif name == "tile256":
            tile256_patch()
        elif name == "fused":
            fused_patch()
        elif name == "launches":
            f, b = (float(x) for x in value.split(","))
            launches_patch(f, b)
        elif name == "fixed":
            fixed = float(value) / 1e3
        elif name != "none":
            raise ValueError
    except ValueError:
        print(f"error: --candidate {args.candidate!r}: expected none, shapes, tile256, fused, fixed=MS or "
              "launches=FWD,BWD", file=sys.stderr)
        return 2
    print(f"candidate: {args.candidate}")
    table(fixed)
    if args.simulate:
        print("\nDeepSpeed TrainSchedule simulated (forward 1, backward 2 a stage; last x1.12);")
        print("xfers: transfers on the critical path per micro-batch slot")
        for p, n in ((2, 42), (6, 64), (12, 128), (12, 256)):
            f, b = [1.0] * p, [2.0] * p
            f[-1], b[-1] = 1.12, 2.24
            tot = [x + y for x, y in zip(f, b)]
            one_f_one_b = (n - 1) * max(tot) + sum(tot)
            c = 0.01
            extra = (simulate(f, b, n, c) - simulate(f, b, n)) / c / (n + p - 1)
            print(f"  p {p:2d} n {n:3d}: makespan {simulate(f, b, n):8.2f}, (n-1)max + sum {one_f_one_b:8.2f}, "
                  f"xfers {extra:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
