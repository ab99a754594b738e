"""llmplan's price, term by term, of the one Nemotron-3 configuration with a published per-kernel Nsight
profile (docs/validation.md#nemotron-sources-2026-12-06).

Source: NVIDIA-NeMo/Megatron-Bridge branch zhiyul/determinism-debug-tool at 6d780951a,
scripts/performance/perf_leaderboard/analysis_report_det_vs_nondet.md (2026-06-12): Nemotron-3 Ultra, 96 GB200
(24 NVL72 trays), container nemo 26.04.01, BF16, TP2 PP3 EP32 ETP1, MBS1, GBS128 (8 micro-batches a rank),
sequence 8,192, alltoall dispatcher (HybridEP off), no CUDA graphs, selective recompute of moe, layernorm,
core_attn, moe_act, mlp and shared_experts; rank 0 (first pipeline stage), iterations 15-17 captured. Its
non-deterministic arm (job 2103635) is the one read here. Prints the first stage's per-micro-batch compute as
llmplan prices it beside the profile's kernel totals over the window / 24 micro-batches, then every kernel category
the report itemises beside the llmplan part (by function) that prices it (docs/validation.md#ultra-itemised).

    python benchmarks/ultra_profile.py
"""

from __future__ import annotations

import contextlib
import copy
import sys
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).parent))
import accuracy as A
from runs import load_runs

from llmplan.cost import compute as C
from llmplan.cost import elementwise as EW
from llmplan.cost import mixers
from llmplan.cost import moe_kernels as MK
from llmplan.cost import step as ST
from llmplan.cost.gemm import layer_gemm_seconds
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
WINDOW_MS = 27608.0  # nsys window, 3 iterations (report section "Runs Compared")
# Every kernel category the report itemises, non-deterministic arm, rank 0, ms over the window (calls):
# sections 2 (streams, stream-7 buckets, the det-substitute kernels' non-det column), 3.1-3.3, 4.1, 4.2.
KERNELS_MS = {
    "nvjet GEMMs (60 kernels)": (8912.0, 59712),
    "cuDNN SDPA fprop (knob_7)": (69.80, 192),
    "cuDNN SDPA bprop (knob_31, 1 pass)": (95.57, 96),
    "Mamba-2 SSD (Triton, 20 kernels)": (913.0, 7680),
    "_layer_norm_bwd_kernel (Mamba gated RMSNorm bwd)": (87.4, 384),
    "_make_chunk_sort_map_kernel": (280.4, 1536),
    "_sort_chunks_by_map_kernel": (240.8, 2304),
    "_row_id_map_pass_3_kernel": (166.2, 768),
    "_unpermute_kernel": (78.1, 1152),
    "_permute_kernel": (77.2, 1152),
    "mbtopk computeBlockwiseWithinKCounts": (70.5, 7680),
    "mbtopk computeBlockDigitCounts": (58.3, 7680),
    "FillFunctor bf16 / fp32, reduce_kernel, arange": (24.5 + 12.9 + 75.1 + 0.04, 120 + 6975 + 11913 + 24),
    "multi_tensor_adam (TE)": (95.1, 834),
}
NCCL_MS = {  # section 4.1, by collective: (ms, calls)
    "SendRecv": (4771.0, 3486), "ReduceScatter bf16": (596.0, 2730), "AllGather": (753.0, 4362),
    "AllReduce (bf16, f32, u32)": (44.0 + 14.0 + 10.0 + 0.1 + 0.3, 9 + 30 + 6), "Broadcast": (0.06, 3),
}
STREAM_MS = {  # section 2 / 5: stream -> busy ms over the window
    "7 (compute + sync NCCL)": 10433.0, "42 (NCCL SendRecv, PP p2p)": 3448.0, "30 (NCCL RS / AG, DP)": 373.0,
    "50 (NCCL AllReduce)": 183.0, "155-158 (expert GEMMs, 4 streams)": 4522.0,
}
STREAM7_MS = {"NCCL": 2189.0, "compute (nvjet / cudnn / triton / SSM)": 6113.0, "other": 2131.0}
STEP_MS = {"nsys window / 3": 27608 / 3, "log, iteration 50": 8041.0,
           "pinned nodes, no nsys, router fusion (2026-07-06 report)": 8797.0}


def setup():
    """The profiled run as llmplan reads it: the 26.08 GB200 Ultra row with the profile's layout, batch,
    precision, dispatcher, recompute, unfused router and per-expert GEMMs."""
    recs = {r["id"]: r for r in load_runs()}
    r = copy.deepcopy(recs[ROW])
    r["id"] = "mbridge-26.04.01-pretrain-nemotron-3-ultra-dgx-gb200-96gpu-bf16-tp2pp3cp1ep32vpnagbs128mbs1"
    r["hardware"]["gpus"] = 96
    r["parallel"].update(tp=2, pp=3, ep=32, dp=16, global_batch=128, micro_batch=1, precision="BF16")
    model, cluster, plan = A.record_setup(r, A.family(r["id"]))
    plan = plan.model_copy(update={
        "recompute_modules": ("moe", "layernorm", "core_attn", "moe_act", "mlp", "shared_experts"),
        "moe_dispatcher": "alltoall", "moe_dispatch_sms": None, "moe_flex_backend": "deepep",
        "offload_moe_act": False, "expert_gemm": "per-expert", "cuda_graphs": "none",
        "moe_router_fusion": False})  # S1's router ran unfused (its mbtopk kernels); the 26.08 preset fuses it
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


def stage_total(model, plan, gpu, **patches) -> float:
    """The first stage's compute a micro-batch (ms) with the named functions replaced: `module__name=fn`."""
    mods = {"EW": EW, "C": C, "ST": ST, "mixers": mixers}
    with contextlib.ExitStack() as stack:
        for key, fn in patches.items():
            mod, name = key.split("__", 1)
            stack.enter_context(mock.patch.object(mods[mod], name, fn))
        return first_stage_ms(model, plan.model_copy(), gpu)[0]["total"]


def priced_parts(model, plan, gpu) -> dict[str, float]:
    """llmplan's first-stage compute a micro-batch (ms), by the function that prices each part: each part is the
    stage's total less the total with that function returning 0 (the stage is linear in them)."""
    base = stage_total(model, plan, gpu)
    zero = lambda *a, **k: 0.0  # noqa: E731
    d = {k: base - stage_total(model, plan, gpu, **{k: zero}) for k in (
        "EW__eager_norm_bytes", "EW__norms_per_layer", "EW__eager_activation_bytes",
        "EW__expert_activation_extra_bytes", "EW__alltoall_sort_bytes", "EW__mean_recurrent_memory_bytes",
        "EW__fp8_cast_bytes", "EW__moe_recompute_bytes", "C__expert_gemm_seconds",
        "ST__grad_accumulation_bytes")}
    none = lambda m, *_: (0.0, 0.0)  # noqa: E731
    d["router"] = base - stage_total(model, plan, gpu, EW__moe_router_passes=none)
    d["permute"] = base - stage_total(model, plan, gpu, EW__moe_permute_passes=none)
    d["residual"] = d.pop("EW__norms_per_layer") - d["EW__eager_norm_bytes"]
    return d


def itemised(model, cluster, plan, e, base, ssd_traffic, charged, moe_layers) -> None:
    """Every kernel category S1 itemises beside llmplan's part for it (docs/validation.md#ultra-itemised)."""
    gpu = cluster.system.gpu
    p = priced_parts(model, plan, gpu)
    mb = WINDOW_MB
    K = {name: ms / mb for name, (ms, _) in KERNELS_MS.items()}
    gemm_on_7 = KERNELS_MS["nvjet GEMMs (60 kernels)"][0] - STREAM_MS["155-158 (expert GEMMs, 4 streams)"]
    attn_w = KERNELS_MS["cuDNN SDPA fprop (knob_7)"][0] + KERNELS_MS["cuDNN SDPA bprop (knob_31, 1 pass)"][0]
    rest_compute = (STREAM7_MS["compute (nvjet / cudnn / triton / SSM)"] - gemm_on_7 - attn_w
                    - KERNELS_MS["Mamba-2 SSD (Triton, 20 kernels)"][0]) / mb
    named_other = ("_layer_norm_bwd_kernel (Mamba gated RMSNorm bwd)", "_make_chunk_sort_map_kernel",
                   "_sort_chunks_by_map_kernel", "_row_id_map_pass_3_kernel", "_unpermute_kernel",
                   "_permute_kernel", "mbtopk computeBlockwiseWithinKCounts", "mbtopk computeBlockDigitCounts",
                   "FillFunctor bf16 / fp32, reduce_kernel, arange", "multi_tensor_adam (TE)")
    rest_other = STREAM7_MS["other"] / mb - sum(K[n] for n in named_other)
    mamba_other = p["EW__mean_recurrent_memory_bytes"] - ssd_traffic
    attention = base["attention+ssd"] - charged
    opt = 1e3 * float(e.time.optimizer)
    small = {k: 1e3 * 3 * moe_layers * float(MK.moe_kernel_seconds(model, plan, (k,)))  # the stage charges 3x
             for k in ("sort_map", "row_id_argsort", "topk_pass")}
    fwd, bwd = layer_gemm_seconds(model, plan, gpu, True, only="expert")  # `moe` recompute: the forward twice
    experts = 1e3 * moe_layers * float(2 * fwd + bwd) if plan.recomputes("moe") else 1e3 * moe_layers * float(fwd + bwd)
    rows = [
        ("GEMMs (nvjet, all streams)", K["nvjet GEMMs (60 kernels)"],
         "layer_gemm_seconds (+ module recompute) + expert_gemm_seconds",
         base["gemm"] + p["C__expert_gemm_seconds"]),
        ("  expert GEMMs (the 4 GEMM streams 155-158)", STREAM_MS["155-158 (expert GEMMs, 4 streams)"] / mb,
         "layer_gemm_seconds(only='expert') x 16 x (2 fwd + bwd)", experts),
        ("  per-expert GEMM cost", None, "expert_gemm_seconds", p["C__expert_gemm_seconds"]),
        ("  the other GEMMs (stream 7)", gemm_on_7 / mb, "the rest of layer_gemm_seconds", base["gemm"] - experts),
        ("attention fwd + bwd (cuDNN)", attn_w / mb, "attention_seconds x (3 + core_attn)", attention),
        ("SSD, 20 Triton kernels", K["Mamba-2 SSD (Triton, 20 kernels)"],
         "ssd_scan_seconds x (3 + core_attn) + SSD part of mamba_memory_bytes", charged + ssd_traffic),
        ("Mamba gated-norm bwd (_layer_norm_bwd_kernel)", K["_layer_norm_bwd_kernel (Mamba gated RMSNorm bwd)"],
         "mamba_memory_bytes less its SSD part (conv1d + gated norm, fwd + bwd)", mamba_other),
        ("rest of stream 7 'compute' (causal_conv1d, triton_*)", rest_compute, "(conv1d: row above)", None),
        ("pre-norms (RMSNorm, fwd + bwd)", None, "eager_norm_bytes (in elementwise_bytes)",
         p["EW__eager_norm_bytes"]),
        ("residual adds", None, "elementwise_bytes' residual term", p["residual"]),
        ("activation (squared ReLU, shared + routed)", None,
         "eager_activation_bytes + moe_recompute_bytes' activation reruns",
         p["EW__eager_activation_bytes"] + p["EW__moe_recompute_bytes"] - p["EW__alltoall_sort_bytes"] / 3),
        ("  moe_act recompute", None, "expert_activation_extra_bytes", p["EW__expert_activation_extra_bytes"]),
        ("permute / unpermute / row-id map", K["_permute_kernel"] + K["_unpermute_kernel"]
         + K["_row_id_map_pass_3_kernel"], "moe_permute_passes (in moe_routing_train_bytes) + moe_kernel_seconds "
         "row_id_argsort", p["permute"] + small["row_id_argsort"]),
        ("  of it the row-id argsort (_row_id_map_pass_3_kernel)", K["_row_id_map_pass_3_kernel"],
         "moe_kernel_seconds row_id_argsort", small["row_id_argsort"]),
        ("sort by local expert (_sort_chunks_by_map_kernel)", K["_sort_chunks_by_map_kernel"],
         "alltoall_sort_bytes (+ moe_recompute_bytes' 2 sorts)", p["EW__alltoall_sort_bytes"]),
        ("  its map (_make_chunk_sort_map_kernel)", K["_make_chunk_sort_map_kernel"], "moe_kernel_seconds sort_map",
         small["sort_map"]),
        ("router top-k (mbtopk; softmax not itemised)", K["mbtopk computeBlockwiseWithinKCounts"]
         + K["mbtopk computeBlockDigitCounts"], "moe_router_passes (in moe_routing_train_bytes) + moe_kernel_seconds "
         "topk_pass", p["router"] + small["topk_pass"]),
        ("casts (bf16 run)", None, "fp8_cast_bytes", p["EW__fp8_cast_bytes"]),
        ("fills / reduce / arange", K["FillFunctor bf16 / fp32, reduce_kernel, arange"], "(none)", 0.0),
        ("grad accumulation", None, "grad_accumulation_seconds", p["ST__grad_accumulation_bytes"]),
        ("rest of stream 7 'other' (elementwise, copies, norms fwd, ...)", rest_other, "(rows above)", None),
        ("optimizer (multi_tensor_adam), per step / 8", K["multi_tensor_adam (TE)"],  # 3 steps / 24
         "optimizer_step_seconds / 8", opt / plan.num_microbatches),
    ]
    print("\n| kernels (S1, rank 0) | measured ms / micro-batch | llmplan function | priced ms / micro-batch |")
    print("|---|---:|---|---:|")
    for name, meas, fn, priced in rows:
        a = "-" if meas is None else f"{meas:.1f}"
        b = "-" if priced is None else f"{priced:.1f}"
        print(f"| {name} | {a} | {fn} | {b} |")
    nonnccl = (STREAM7_MS["compute (nvjet / cudnn / triton / SSM)"] + STREAM7_MS["other"]
               + STREAM_MS["155-158 (expert GEMMs, 4 streams)"]) / mb
    print(f"| all non-NCCL kernels (stream 7 compute + other + GEMM streams) | {nonnccl:.1f} | "
          f"stage compute + optimizer / 8 | {base['total'] + opt / plan.num_microbatches:.1f} |")
    print("\nNCCL, ms a step (kernels wait-inclusive) against llmplan's per-axis time (comm_seconds) and its exposed part:")
    for name, (ms, n) in NCCL_MS.items():
        print(f"  measured {name}: {ms / 3:.1f} ms a step, {n / 3:.0f} calls")
    for k, s_ in STREAM_MS.items():
        print(f"  measured stream {k}: {s_ / 3:.1f} ms a step")
    sr7 = NCCL_MS["SendRecv"][0] - STREAM_MS["42 (NCCL SendRecv, PP p2p)"]
    print(f"  stream-7 SendRecv (all SendRecv less stream 42's; the synchronous EP all-to-alls): {sr7 / 3:.1f} ms a step; "
          f"stream-7 RS / AG / AR: {(STREAM7_MS['NCCL'] - sr7) / 3:.1f}")
    for ax, a in e.comm.axes.items():
        if a.transfers:
            calls = sum(float(t.calls) for t in a.transfers)
            print(f"  llmplan {ax}: {1e3 * float(a.seconds):.1f} ms a step ({a.collectives}, {calls:.0f} calls), "
                  f"exposed {1e3 * float(e.time.exposed[ax]):.1f}")
    inside = cluster.model_copy(update={"system": cluster.system.with_options(domain_gpus=32)})
    e32 = estimate_training(model, inside, plan)
    print(f"  llmplan ep with every EP group inside one 32-GPU NVLink domain (accuracy.py's 48-GPU segments put "
          f"the middle stage's across two): {1e3 * float(e32.comm.axes['ep'].seconds):.1f} ms a step; "
          f"predicted step {float(e32.time.total):.3f} s (compute {float(e32.time.compute):.3f}, exposed comm "
          f"{float(e32.time.comm_exposed):.3f}, bubble {float(e32.time.bubble):.3f}, overhead "
          f"{float(e32.time.overhead):.3f})")
    busy = sum(STREAM_MS.values())
    print(f"idle: window {WINDOW_MS:.0f} ms less the listed streams' busy time {busy:.0f} = {WINDOW_MS - busy:.0f} ms "
          f"({(WINDOW_MS - busy) / 3:.0f} ms a step) with no kernel on any listed stream, at least; llmplan's first "
          f"stage waits {1e3 * float(e.time.total) - plan.num_microbatches * (base['total']) - opt:.0f} ms a step "
          f"(step less its 8 micro-batches and the optimizer: bubble, exposed comm, overhead, the slower stages)")


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
    itemised(model, cluster, plan, e, base, ssd_traffic, charged, moe)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
