"""Signed error of each Megatron-Bridge model against the shares of its predicted step
(docs/validation.md#moe-gap-shared).

For every scored row of the mbridge-moe and mbridge-dense families it splits the predicted step into the slowest
stage's GEMM, attention (a hybrid's Mamba-2 scans included), memory-bound (with the per-expert GEMM cost that
cost.compute.layer_seconds adds to it, expert_gemm_seconds) and exposed-communication time, and
prints per model and GPU generation (H100, Blackwell) the median signed error (+ = predicted faster than
measured) beside the median share of each part, then the least-squares fit of the signed error on the
attention and memory-bound shares and each share's correlation with it, per generation.

Two probes re-price every row with one profile field changed in memory (no file is written; neither is a
shipped value):

* --published-attention: the Blackwell profiles' fused attention at cuDNN's published asymptote, 1.16, with
  B200 / GB200's softmax ratio 0.91 instead of 0.74 (docs/validation.md#blackwell-attention: NVIDIA/cudnn-frontend
  benchmark/sdpa_benchmark_training/results/llama3.1/{gb200,gb300}, cuDNN 9.22);
* --hbm-efficiency X: every H100 / Blackwell profile's achieved HBM fraction (GpuSpec.hbm_efficiency: cuDNN's
  published norm bandwidth on Blackwell, 0.66 / 0.67, and 0.8 assumed on H100; docs/formulas.md#compute.hbm_efficiency)
  set to X.
* --hbm-size: every H100 profile's achieved HBM fraction set, row by row, to what a fused RMSNorm reaches at the
  row's own size (the rank's tokens x hidden, bf16) on the size curve of cuDNN's published norm benchmark on H200,
  the same GH100 die: each pass's time a fixed part plus its bytes over an asymptotic rate (H200_NORM_CURVE,
  docs/validation.md#hbm-rate).

* --jit-activation: every row's gated activation priced as Megatron-Core's jit_fuser kernel
  (ParallelPlan.jit_activation, accuracy.runs_jit_activation): its forward at the GPU's published jit rate
  (GpuSpec.jit_activation_hbm_efficiency: H100 0.56 from Liger-Kernel's megatron_swiglu rows; none elsewhere, so
  Blackwell rows do not move; docs/formulas.md#compute.jit_activation).

* --residual MODEL: the Blackwell fit refitted without MODEL's rows, then each MODEL row's signed error less what
  that fit gives at the row's shares (how much of its error the cross-model trend leaves; docs/validation.md#gptoss).

`python benchmarks/moe_shares.py [--published-attention] [--hbm-efficiency 0.55] [--hbm-size] [--jit-activation]
[--residual gpt-oss-120b]` (about 30 s).
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

sys.path.insert(0, str(Path(__file__).parent))
import accuracy as A

from llmplan.cost.elementwise import FUSED_NORM_BYTES
from llmplan.estimate import estimate_training
from llmplan.specs.hardware import GpuSpec
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan

FAMILIES = ("mbridge-moe", "mbridge-dense")
BLACKWELL = ("b200", "b300", "gb200", "gb300")
PUBLISHED_ATTENTION = 1.16  # cuDNN 9.22's GB300 asymptote, llmplan's count (docs/validation.md#blackwell-attention)
PUBLISHED_SOFTMAX_RATIO = 0.91  # GB200 / GB300 bf16 causal forward + backward, same benchmark
H200_NORM_CURVE = ((1.90e-6, 0.795), (7.20e-6, 0.811))
"""(fixed seconds, asymptotic share of peak) of cuDNN's fused RMSNorm forward (one kernel) and backward (the input
gradient, then the weight gradient's reduction) on H200: time = t0 + bytes / (share x 4,800 GB/s), least squares
weighted by 1 / time over the 14 RMSNorm rows (2,048-131,072 tokens x 128-16,384 hidden, 4-403 MB) of
NVIDIA/cudnn-frontend benchmark/norms/results/h200/all_models_20260227_035147.csv at 3929da2ef4 (bf16, cuDNN
Frontend 1.19, the harness's bytes: forward reads x and the weight and writes y and the fp32 inverse RMS; backward
reads x, dy, the weight and the inverse RMS and writes dx and the weight gradient). docs/validation.md#hbm-rate"""


def probe_gpu(gpu: GpuSpec, published_attention: bool, hbm_efficiency: float | None) -> GpuSpec:
    """The profile with the probes applied: Blackwell attention at the published asymptote (and B200 / GB200's
    softmax ratio at the measured 0.91), and the achieved HBM fraction on H100 / Blackwell."""
    name = gpu.name.lower()
    update: dict[str, Any] = {}
    if published_attention and name in BLACKWELL:
        update["attention_efficiency"] = PUBLISHED_ATTENTION
        if gpu.softmax_attention_ratio < 1.0:
            update["softmax_attention_ratio"] = PUBLISHED_SOFTMAX_RATIO
    if hbm_efficiency is not None and (name in BLACKWELL or name.startswith("h100")):
        update["hbm_efficiency"] = hbm_efficiency
    return gpu.model_copy(update=update) if update else gpu


def size_share(tokens: float, hidden: int, peak_bytes_per_s: float) -> float:
    """Share of peak a fused RMSNorm forward + backward over `tokens` x `hidden` reaches on H200_NORM_CURVE (the
    bytes of compute.norm_bytes, FUSED_NORM_BYTES an element), the two passes combined as the stage spends their
    time: (fwd + bwd) / (fwd / e_fwd + bwd / e_bwd), e = bytes / (t0 + bytes / (share x peak)) / peak."""
    shares = []
    for per_element, (t0, share) in zip(FUSED_NORM_BYTES, H200_NORM_CURVE, strict=True):
        nbytes = per_element * tokens * hidden
        shares.append(nbytes / (t0 + nbytes / (share * peak_bytes_per_s)) / peak_bytes_per_s)
    fwd, bwd = FUSED_NORM_BYTES
    return (fwd + bwd) / (fwd / shares[0] + bwd / shares[1])


def size_probe_gpu(gpu: GpuSpec, m: ModelSpec, plan: ParallelPlan) -> GpuSpec:
    """An H100 profile with its achieved HBM fraction at the row's norm size (size_share: the rank's tokens, the
    sequence split by CP and, with sequence parallelism, by TP, times the hidden size); other GPUs unchanged."""
    if not gpu.name.lower().startswith("h100"):
        return gpu
    tokens = plan.seq_len / plan.cp * plan.micro_batch / (plan.tp if plan.sp else 1)
    return gpu.model_copy(update={"hbm_efficiency": size_share(tokens, m.hidden_size, gpu.hbm_bytes_per_s)})


def model_key(rid: str) -> str:
    """The model of a Megatron-Bridge row id (the token-drop / dropless / MTP variants folded into their model)."""
    found = re.search(r"pretrain-(.+?)-dgx-", rid)
    name = found.group(1) if found else rid
    return re.sub(r"-(tokendrop|dropless|w-o-mtp|w-mtp)$", "", name)


def shares(rec: dict, published_attention: bool = False,
           hbm_efficiency: float | None = None, hbm_size: bool = False,
           jit_activation: bool = False) -> tuple[float, dict[str, float]] | None:
    """(signed error, {part: share of the predicted step}) of one row: gemm, attention and memory_bound split
    the step's compute as the slowest stage's micro-batch does, comm is the exposed communication; None where
    the row is not scored."""
    fam = A.family(rec["id"])
    setup = A.record_setup(rec, fam) if fam in FAMILIES else None
    if setup is None or not A.predict(rec, fam):
        return None
    model, cluster, plan = setup
    if jit_activation and A.runs_jit_activation(rec, fam):
        plan = plan.model_copy(update={"jit_activation": True})
    gpu = probe_gpu(cluster.system.gpu, published_attention, hbm_efficiency)
    if hbm_size:
        gpu = size_probe_gpu(gpu, model, plan)
    cluster = cluster.model_copy(update={"system": cluster.system.model_copy(update={"gpu": gpu})})
    e = estimate_training(model, cluster, plan)
    t, s = e.time, e.time.stage
    total, stage = float(t.total), float(s.total)
    compute = float(t.compute) / total
    parts = {p: compute * float(getattr(s, p)) / stage for p in ("gemm", "attention", "memory_bound")}
    parts["comm"] = float(t.comm_exposed) / total
    err = float(e.throughput.tokens_per_s) / cluster.num_gpus / rec["measured"]["tokens_per_s_per_gpu"] - 1
    return err, parts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--published-attention", action="store_true")
    ap.add_argument("--hbm-efficiency", type=float, default=None)
    ap.add_argument("--hbm-size", action="store_true")
    ap.add_argument("--jit-activation", action="store_true")
    ap.add_argument("--residual", metavar="MODEL", default=None)
    args = ap.parse_args(argv)
    if args.hbm_efficiency is not None and not 0 < args.hbm_efficiency <= 1:
        ap.error(f"--hbm-efficiency {args.hbm_efficiency}: a bandwidth fraction, must be in (0, 1] (e.g. 0.55)")
    rows: dict[tuple[str, str], list[tuple[float, dict[str, float]]]] = {}
    ids: dict[tuple[str, str], list[str]] = {}
    for rec in yaml.safe_load(A.DEFAULT_RUNS.read_text()):
        got = shares(rec, args.published_attention, args.hbm_efficiency, args.hbm_size, args.jit_activation)
        if got is None:
            continue
        gen = "h100" if "h100" in str(rec["hardware"]["gpu"]).lower() else "bw"
        rows.setdefault((model_key(rec["id"]), gen), []).append(got)
        ids.setdefault((model_key(rec["id"]), gen), []).append(rec["id"])
    print(f"{'model':24s} {'gpu':4s} {'rows':>4s} {'signed':>7s} {'attn':>5s} {'membd':>5s} {'gemm':>5s} {'comm':>5s}")
    for (model, gen), v in sorted(rows.items()):
        def med(p: str, v: list = v) -> float:
            return 100 * statistics.median(x[1][p] for x in v)
        err = 100 * statistics.median(x[0] for x in v)
        print(f"{model[:24]:24s} {gen:4s} {len(v):4d} {err:+6.1f}% {med('attention'):4.1f}% "
              f"{med('memory_bound'):4.1f}% {med('gemm'):4.1f}% {med('comm'):4.1f}%")
    for gen in ("h100", "bw"):
        pts = [x for (_, g), v in rows.items() if g == gen for x in v]
        signed = np.array([x[0] for x in pts])
        attn = np.array([x[1]["attention"] for x in pts])
        mem = np.array([x[1]["memory_bound"] for x in pts])
        coef, *_ = np.linalg.lstsq(np.column_stack([np.ones(len(pts)), attn, mem]), signed, rcond=None)
        print(f"{gen}: {len(pts)} rows, signed error = {coef[0]:+.3f} {coef[1]:+.3f} x attention "
              f"{coef[2]:+.3f} x memory-bound; r(attention) {np.corrcoef(attn, signed)[0, 1]:+.2f}, "
              f"r(memory-bound) {np.corrcoef(mem, signed)[0, 1]:+.2f}")
    if args.residual:
        print_residuals(rows, ids, args.residual)
    return 0


def fit(pts: list[tuple[float, dict[str, float]]]) -> Any:
    """Least-squares [intercept, attention, memory-bound] coefficients of the signed error on the shares."""
    x = np.array([[1.0, p[1]["attention"], p[1]["memory_bound"]] for p in pts])
    return np.linalg.lstsq(x, np.array([p[0] for p in pts]), rcond=None)[0]


def print_residuals(rows: dict, ids: dict, model: str) -> None:
    """Each of `model`'s rows per generation: its signed error less the fit of the other models' rows."""
    for gen in ("h100", "bw"):
        own = rows.get((model, gen), [])
        others = [x for (m, g), v in rows.items() if g == gen and m != model for x in v]
        if not own or len(others) < 3:
            continue
        coef = fit(others)
        res = [e - (coef[0] + coef[1] * p["attention"] + coef[2] * p["memory_bound"]) for e, p in own]
        print(f"{model} {gen}: fit without it {coef[0]:+.3f} {coef[1]:+.3f} x attention {coef[2]:+.3f} x "
              f"memory-bound; median residual {100 * statistics.median(res):+.1f} points ({len(own)} rows)")
        for rid, (e, p), r in zip(ids[(model, gen)], own, res, strict=True):
            print(f"  {rid[7:62]:55s} {100 * e:+6.1f}% resid {100 * r:+5.1f} attn {100 * p['attention']:4.1f}% "
                  f"mem {100 * p['memory_bound']:4.1f}% comm {100 * p['comm']:4.1f}%")


if __name__ == "__main__":
    raise SystemExit(main())
