"""llmplan's price, term by term, of the one Nemotron-3 configuration with a published per-kernel Nsight
profile (docs/validation.md#nemotron-sources-2026-12-06).

Source: NVIDIA-NeMo/Megatron-Bridge branch zhiyul/determinism-debug-tool at 6d780951a,
scripts/performance/perf_leaderboard/analysis_report_det_vs_nondet.md (2026-06-12): Nemotron-3 Ultra, 96 GB200
(24 NVL72 trays), container nemo 26.04.01, BF16, TP2 PP3 EP32 ETP1, MBS1, GBS128 (8 micro-batches a rank),
sequence 8,192, alltoall dispatcher (HybridEP off), no CUDA graphs, selective recompute of moe, layernorm,
core_attn, moe_act, mlp and shared_experts; rank 0 (first pipeline stage), iterations 15-17 captured. Its
non-deterministic arm (job 2103635) is the one read here. Prints the first stage's per-micro-batch compute as
llmplan prices it beside the profile's kernel totals over the window / 24 micro-batches.

    python benchmarks/ultra_profile.py
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).parent))
import accuracy as A
from runs import load_runs

from llmplan.cost import compute as C
from llmplan.cost import mixers
from llmplan.cost.step import stage_times
from llmplan.estimate import estimate_training

ROW = "mbridge-26.08-pretrain-nemotron-3-ultra-dgx-gb200-256gpu-mxfp8-tp2pp1cp1ep64vpnagbs256mbs1"
WINDOW_MB = 24  # 3 iterations x 8 micro-batches on rank 0
PUBLISHED_MS = {  # non-deterministic arm, rank 0, 3-iteration window (report sections 3.1-3.3, 4.2, 5)
    "gemm (nvjet, all 60 kernels)": 8912.0,
    "attention (cuDNN fprop + bprop)": 69.80 + 95.57,
    "SSM kernels (Mamba-2 SSD, Triton)": 913.0,
    "MoE permute / sort / row-id kernels": 280.4 + 240.8 + 166.2 + 78.1 + 77.2,
    "router top-k (mbtopk, two kernels)": 70.5 + 58.3,
}
STEP_MS = {"nsys window / 3": 27608 / 3, "log, iteration 50": 8041.0,
           "pinned nodes, no nsys, router fusion (2026-07-06 report)": 8797.0}


def setup():
    """The profiled run as llmplan reads it: the 26.08 GB200 Ultra row with the profile's layout, batch,
    precision, dispatcher, recompute and per-expert GEMMs."""
    recs = {r["id"]: r for r in load_runs()}
    r = copy.deepcopy(recs[ROW])
    r["id"] = "mbridge-26.04.01-pretrain-nemotron-3-ultra-dgx-gb200-96gpu-bf16-tp2pp3cp1ep32vpnagbs128mbs1"
    r["hardware"]["gpus"] = 96
    r["parallel"].update(tp=2, pp=3, ep=32, dp=16, global_batch=128, micro_batch=1, precision="BF16")
    model, cluster, plan = A.record_setup(r, A.family(r["id"]))
    plan = plan.model_copy(update={
        "recompute_modules": ("moe", "layernorm", "core_attn", "moe_act", "mlp", "shared_experts"),
        "moe_dispatcher": "alltoall", "moe_dispatch_sms": None, "moe_flex_backend": "deepep",
        "offload_moe_act": False, "expert_gemm": "per-expert", "cuda_graphs": "none"})
    return model, cluster, plan


def first_stage_ms(model, plan, gpu):
    (_, sc, layers, moe), *_ = stage_times(model, plan, gpu)
    return {"gemm": 1e3 * float(sc.gemm), "attention+ssd": 1e3 * float(sc.attention),
            "memory_bound": 1e3 * float(sc.memory_bound), "total": 1e3 * float(sc.total)}, layers, moe


def ssd_kernel_bytes(model) -> float:
    """HBM bytes a token of the 20 Triton SSD kernels (all heads): mixers.mamba_forward_bytes and
    mamba_backward_bytes less the causal convolution's and the gated norm's terms (tests/test_ssd_blackwell.py)."""
    d, g, S, GQ, H = mixers._mamba_widths(model)
    return (10 * d + 8 * g + 12 * S + 8 * GQ + 26 * H) + (34 * d + 54 * g + 34 * S + 32 * GQ + 70 * H)


def main() -> int:
    model, cluster, plan = setup()
    gpu = cluster.system.gpu
    base, layers, moe = first_stage_ms(model, plan, gpu)
    with mock.patch.object(C, "mean_mamba_scan_step_flops", lambda m: 0.0):
        no_scan, *_ = first_stage_ms(model, plan.model_copy(), gpu)
    with mock.patch.multiple(mixers, mamba_memory_bytes=lambda m, b=1: 0.0):
        no_traffic, *_ = first_stage_ms(model, plan.model_copy(), gpu)
    mamba = layers - moe - sum(1 for t in model.layer_types[:layers] if t == "full_attention")
    charged = base["attention+ssd"] - no_scan["attention+ssd"]  # 3 forward-equivalents: core_attn leaves the scan
    scan = 1e3 * 3 * float(C.ssd_scan_seconds(model, plan, gpu)[1]) * layers  # one forward and one backward
    ssd_traffic = 1e3 * mamba * plan.seq_len / plan.tp * ssd_kernel_bytes(model) / gpu.hbm_achieved_bytes_per_s
    e = estimate_training(model, cluster, plan)
    print(f"plan: tp {plan.tp} pp {plan.pp} ep {plan.ep} dp {plan.dp} {plan.dtype} {plan.moe_dispatcher} "
          f"expert_gemm {plan.expert_gemm} recompute {plan.recompute_modules}; GPU ssd_scan_efficiency "
          f"{getattr(gpu, 'ssd_scan_efficiency', None)}")
    print(f"first stage: {layers} layers ({mamba} Mamba-2, {moe} MoE); predicted step {float(e.time.total):.3f} s "
          f"(compute {float(e.time.compute):.3f}, exposed comm {float(e.time.comm_exposed):.3f} "
          f"of which EP {float(e.time.exposed['ep']):.3f}, bubble {float(e.time.bubble):.3f})")
    for k, v in STEP_MS.items():
        print(f"  measured step, {k}: {v / 1e3:.3f} s")
    print("llmplan, first stage, ms a micro-batch:", {k: round(v, 1) for k, v in base.items()})
    print(f"  GEMMs {base['gemm']:.1f}; attention (SSD apart) {base['attention+ssd'] - charged:.1f}; "
          f"SSD kernels {scan + ssd_traffic:.1f} (scan FLOPs {scan:.1f} + their traffic {ssd_traffic:.1f}; "
          f"the stage charges the scan {charged:.1f}, which core_attn recompute does not re-run); "
          f"whole Mamba-2 traffic {base['memory_bound'] - no_traffic['memory_bound']:.1f}")
    for k, v in PUBLISHED_MS.items():
        print(f"published, {k}: {v / WINDOW_MB:.1f} ms a micro-batch")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
