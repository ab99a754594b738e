"""Every published pair of runs that differ only in precision: the measured low-precision / BF16 throughput
ratio beside llmplan's (docs/validation.md#precision-pairs).

A pair is two scored records (accuracy.record_setup prices both) of the same model, GPU, GPU count, release
(accuracy.record_container, where the source names one) and layout (tp, pp, cp, ep, vp, micro-batch, global
batch, sequence), one bf16 and one in an 8- or 4-bit recipe. The ratio is the low-precision row's quantity over
the BF16 row's, each as accuracy.predict scores it (tokens/s per GPU for the Megatron-Bridge tables and cards,
model TFLOP/s or MFU elsewhere), measured and predicted; `pred/meas` is the predicted ratio over the measured
one (> 1: llmplan credits the low precision with more than the runs show). With `--parts` each pair's predicted
step is split, BF16 and low precision side by side, into the slowest stage's GEMM, attention and memory-bound
time and the exposed communication, in seconds a step. With `--launches` each arm's host launches a micro-batch
(cost.kernels.layer_launch_average over the slowest stage's layers, Transformer Engine's quantisation kernels
included), their host time at the row's CPU (KERNEL_LAUNCH_S x GpuSpec.host_op_factor), the predicted micro-batch
and `need`: the factor over x86's launch time at which the launches alone would last the micro-batch
(docs/validation.md#quant-launches).

    python benchmarks/precision_pairs.py [--parts] [--launches]
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import accuracy as A
from runs import load_runs

from llmplan.cost.compute import KERNEL_LAUNCH_S
from llmplan.cost.gemm import MXFP8_CUBLAS_GEMM_TIME, gemm_shape_efficiency
from llmplan.cost.kernels import layer_launch_average
from llmplan.cost.quantize import CAST_BYTES, QUANTIZED_COPY_BYTES
from llmplan.cost.step import max_stage_layers
from llmplan.estimate import estimate_training
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

LAYOUT = ("tp", "pp", "cp", "ep", "vpp", "micro_batch", "global_batch", "seq_len")


def precision(plan: Any) -> str:
    """The plan's GEMM recipe: bf16, or the low-precision recipe (tensorwise / mxfp8 / nvfp4 ...)."""
    return plan.recipe if plan.low_precision else plan.dtype


def pair_key(rec: dict, plan: Any) -> tuple:
    """What two records must share to be a precision pair (the precision left out)."""
    hw = rec["hardware"]
    return (str(rec["model"].get("name")), str(hw.get("gpu")), int(hw.get("gpus") or 1), A.record_container(rec),
            *(getattr(plan, k) for k in LAYOUT))


def scored(rec: dict) -> tuple[Any, float, float] | None:
    """(plan, predicted, measured) of a record's first scored quantity, or None where it is not scored."""
    fam = A.family(rec["id"])
    setup = A.record_setup(rec, fam)
    if setup is None:
        return None
    got = [q for q in A.predict(rec, fam) if q[0] != "fits"]
    return (setup[2], float(got[0][1]), float(got[0][2])) if got else None


def grouped(records: list[dict], key: Any) -> list[list[tuple[dict, Any, float, float]]]:
    """The scored BF16 and low-precision records (record, plan, predicted, measured) in groups of one `key`
    (record, plan -> what paired records share)."""
    groups: dict[tuple, list[tuple[dict, Any, float, float]]] = {}
    for rec in records:
        got = scored(rec)
        if got is not None and (got[0].low_precision or got[0].dtype == "bf16"):
            groups.setdefault(key(rec, got[0]), []).append((rec, *got))
    return list(groups.values())


def pairs(records: list[dict]) -> list[dict[str, Any]]:
    """Every (BF16 row, low-precision row) pair of the records, with both ratios."""
    out = []
    for rows in grouped(records, pair_key):
        for hi in (r for r in rows if precision(r[1]) == "bf16"):
            for lo in (r for r in rows if precision(r[1]) != "bf16"):
                out.append({"bf16": hi[0]["id"], "low": lo[0]["id"], "recipe": precision(lo[1]),
                            "gpu": str(hi[0]["hardware"]["gpu"]), "model": str(hi[0]["model"].get("name")),
                            "measured": lo[3] / hi[3], "predicted": lo[2] / hi[2]})
    return sorted(out, key=lambda p: (p["model"], p["gpu"], p["recipe"]))


def parts(rid: str, records: dict[str, dict]) -> dict[str, float]:
    """Seconds a step of one record's predicted step: the slowest stage's GEMM, attention and memory-bound
    share of the compute, exposed communication, the rest (bubble, optimizer, overheads) and the total."""
    rec = records[rid]
    m, cluster, plan = A.record_setup(rec, A.family(rid))
    t = estimate_training(m, cluster, plan).time
    s, compute = t.stage, float(t.compute)
    out = {p: compute * float(getattr(s, p)) / float(s.total) for p in ("gemm", "attention", "memory_bound")}
    out["comm"] = float(t.comm_exposed)
    out["total"] = float(t.total)
    out["rest"] = out["total"] - compute - out["comm"]
    return out


def launches(rid: str, records: dict[str, dict]) -> dict[str, float]:
    """Host launches of one record's micro-batch (the slowest stage's layers, forward and backward once, graphed
    scopes one launch each: cost.kernels.layer_launch_average), their host seconds at the row's host CPU, the
    predicted micro-batch (step / micro-batches) and the per-launch factor over x86 at which the launches alone
    would last it (`need`)."""
    rec = records[rid]
    m, cluster, plan = A.record_setup(rec, A.family(rid))
    k = layer_launch_average(m, plan)
    n = float(k.total) * float(max_stage_layers(m, plan))
    mb = float(estimate_training(m, cluster, plan).time.total) / plan.num_microbatches
    f = cluster.system.gpu.host_op_factor
    return {"launches": n, "host_ms": 1e3 * n * KERNEL_LAUNCH_S * f, "mb_ms": 1e3 * mb,
            "need": mb / (n * KERNEL_LAUNCH_S)}


LIGHTNING = ("bridgecard-gb200-bf16-nemotron-3.5-lightning-8gpu-gbs512",
             "mbridge-26.08-pretrain-nemotron-3-5-lightning-dgx-gb200-8gpu-mxfp8-tp1pp1cp1ep8vpnagbs512mbs2")
"""The Nemotron-3.5 Lightning GB200 pair (issues 32 / 40): the BF16 verification card and the 26.08 table's MXFP8
row, both nemo:26.08, TP1 PP1 EP8, micro-batch 2, global batch 512."""

ULTRA_MEASURED = {"bf16": 8891.0, "mxfp8": 8758.0}
"""Nemotron-3 Ultra A/B published in Megatron-Bridge's perf leaderboard (scripts/performance/perf_leaderboard at
6d780951a, nemo:26.04.01, 96 GB200, TP2 PP3 EP32, micro-batch 1, global batch 128, alltoall dispatcher, no CUDA
graphs, no EP overlap, selective recompute), deterministic arms without nsys, ms a step:
analysis-report-det-vs-nondet-routerfusion-24n.md (bf16, pinned quad, median 8,891, mean 8,972) and
analysis-report-mxfp8-ultra-24n-vs-3072.md (MXFP8 with fp8_param_gather, the median of 8,735 / 8,756 / 8,760 /
9,063 ms; 447.5-448.8 TFLOP/s against bf16's ~432). Another allocation than the bf16 arms: a reading, not a
record."""


def ultra_ab() -> tuple[float, float]:
    """(predicted, measured) MXFP8 / BF16 throughput ratio of the Ultra A/B (ULTRA_MEASURED), priced at the
    reports' layout: nemotron-3-ultra on 96 GB200 in 16-GPU NVLink domains (the reports' "NVL16"), TP2 with SP,
    PP3, EP32, the recompute modules the MXFP8 report lists (bf16's `mlp` has no dense MLP to act on), the
    alltoall dispatcher, per-expert GEMMs, no graphs or EP / TP overlap; MXFP8 with MXFP8 primary weights."""
    m = builtin_models()["nemotron-3-ultra"]
    cluster = A.cluster_of(builtin_systems()["gb200-nvl72"].with_options(domain_gpus=16), 96)
    base = dict(tp=2, pp=3, cp=1, ep=32, etp=1, dp=16, micro_batch=1, global_batch=128, seq_len=8192, sp=True,
                recompute="selective", recompute_modules=("moe", "layernorm", "core_attn", "moe_act", "shared_experts"),
                moe_dispatcher="alltoall", cuda_graphs="none", ep_comm_overlap=False, tp_comm_overlap=False,
                expert_gemm="per-expert")
    step = {name: float(estimate_training(m, cluster, ParallelPlan(**base, **kw)).time.total)
            for name, kw in (("bf16", {"dtype": "bf16"}),
                             ("mxfp8", {"dtype": "fp8", "recipe": "mxfp8", "fp8_params": True}))}
    return step["bf16"] / step["mxfp8"], ULTRA_MEASURED["bf16"] / ULTRA_MEASURED["mxfp8"]


TE_PROFILE_B300 = {"bf16": 12.758, "mxfp8": 8.984, "mxfp8_kernels": 7.161, "bf16_kernels": 13.102,
                   "fp8_kernels": 6.812}
"""Transformer Engine's GEMM-profiling tutorial on one B300 (NVIDIA/TransformerEngine
docs/examples/gemm_profiling/gemm_profiling.rst and benchmarks/gemm/benchmark_gemm.py at 1609c890e): the 12 GEMMs of
one layer of a 5B model (hidden 4,096, intermediate 16,384, 32 heads, M = 31 x 512 = 15,872 tokens; fprop (M, K,
N), dgrad (M, N, K), wgrad (K, M, N)), ms a layer: "autocast" times a te.Linear forward of each shape in its recipe
(the input quantised rowwise and columnwise, the bf16 weight rowwise, then the GEMM), "--pre-quantize" the GEMM
kernels alone ("fp8_kernels": Float8CurrentScaling's per-tensor FP8 GEMMs pre-quantised, 163.493 ms over 24
layers). MXFP8 over BF16: 1.42x with the casts, 1.83x kernels only."""


def te_profile_shapes() -> list[tuple[int, int, int]]:
    """(M, K, N) of the 12 GEMMs of TE_PROFILE_B300 (benchmark_gemm.py compute_gemm_shapes)."""
    M, H, I, Q = 15872, 4096, 16384, 3 * 4096
    fprop = [(M, H, Q), (M, H, H), (M, H, I), (M, I, H)]
    return fprop + [(m, n, k) for m, k, n in fprop] + [(k, m, n) for m, k, n in fprop]


def te_profile_priced() -> dict[str, float]:
    """llmplan's ms for TE_PROFILE_B300's layer on the b300 profile: each GEMM at gemm_shape_efficiency in its
    format; MXFP8's autocast adds the casts a te.Linear forward makes (the M x K input rowwise and columnwise,
    CAST_BYTES; the N x K bf16 weight rowwise: read 2 bytes, write one MXFP8 copy) at the achieved HBM rate."""
    gpu = builtin_systems()["dgx-b300"].gpu
    def kernels(fmt: str) -> float:
        cublas = MXFP8_CUBLAS_GEMM_TIME if fmt == "mxfp8" else 1.0  # tex.generic_gemm: cuBLASLt
        return sum(2 * m * n * k * cublas
                   / (gpu.sustained_flops(fmt) * float(gemm_shape_efficiency(gpu, fmt, m, n, k)))
                   for m, k, n in te_profile_shapes())
    casts = sum(m * k * CAST_BYTES["mxfp8"] + n * k * (2 + QUANTIZED_COPY_BYTES["mxfp8"])
                for m, k, n in te_profile_shapes()) / gpu.hbm_achieved_bytes_per_s
    return {"bf16": 1e3 * kernels("bf16"), "mxfp8": 1e3 * (kernels("mxfp8") + casts),
            "mxfp8_kernels": 1e3 * kernels("mxfp8"), "bf16_kernels": 1e3 * kernels("bf16"),
            "fp8_kernels": 1e3 * kernels("fp8")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", action="store_true", help="each pair's predicted step split into its parts")
    ap.add_argument("--launches", action="store_true", help="each arm's host launches a micro-batch and their time")
    args = ap.parse_args(argv)
    records = load_runs(A.DEFAULT_RUNS)
    found = pairs(records)
    print(f"{'model':26s} {'gpu':22s} {'recipe':10s} {'measured':>8s} {'predicted':>9s} {'pred/meas':>9s}")
    for p in found:
        print(f"{p['model'][:26]:26s} {p['gpu'][:22]:22s} {p['recipe']:10s} {p['measured']:8.3f} "
              f"{p['predicted']:9.3f} {p['predicted'] / p['measured']:9.3f}")
        if args.parts:
            by_id = {r["id"]: r for r in records}
            for arm in ("bf16", "low"):
                q = parts(p[arm], by_id)
                print(f"    {arm:4s} " + " ".join(f"{k} {v:7.3f}" for k, v in q.items()) + f"  {p[arm]}")
        if args.launches:
            by_id = {r["id"]: r for r in records}
            for arm in ("bf16", "low"):
                q = launches(p[arm], by_id)
                print(f"    {arm:4s} launches/mb {q['launches']:7.0f} host {q['host_ms']:6.1f} ms  micro-batch "
                      f"{q['mb_ms']:7.1f} ms  need x{q['need']:5.1f}")
    if found:
        r = [p["predicted"] / p["measured"] for p in found]
        print(f"{len(found)} pairs: median pred/meas {statistics.median(r):.3f}, min {min(r):.3f}, max {max(r):.3f}")
    te = te_profile_priced()
    print("TE GEMM profile, B300, one 5B layer (ms): " + ", ".join(
        f"{k} {TE_PROFILE_B300[k]:.3f} published / {te[k]:.3f} priced" for k in TE_PROFILE_B300)
        + f"; MXFP8 speed-up with casts {TE_PROFILE_B300['bf16'] / TE_PROFILE_B300['mxfp8']:.3f} published, "
        f"{te['bf16'] / te['mxfp8']:.3f} priced")
    pred, meas = ultra_ab()
    print(f"outside the data: Nemotron-3 Ultra A/B (Megatron-Bridge perf leaderboard, 96 GB200, mxfp8): measured "
          f"{meas:.3f}, predicted {pred:.3f}, pred/meas {pred / meas:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
