"""Eager Megatron-Core MoE steps: published Nsight kernel counts and idle gaps against llmplan's host model
(issues 32 and 40; docs/validation.md#eager-idle-gaps).

For the two H100 Megatron-Bridge MoE cards whose tuning campaigns publish rank-0 Nsight Systems numbers
(Megatron-Bridge PR 5098, branch yuya/qwen35-text-h100-perf at 7e4a6d11e: skills/nemo-mbridge-perf-moe-
optimization-workflow/references/qwen35-h100-campaign.md, skills/nemo-mbridge-perf-moe-comm-overlap/SKILL.md,
skills/nemo-mbridge-perf-expert-parallel-overlap/SKILL.md), at the profiled configuration (the card's row with
its layout changed to the profiled one): the measured kernels per step and per layer and micro-batch, the
GPU-active union, idle gaps and capture span where published, the host time per kernel they imply; and
llmplan's predicted step, compute, host term, its count of launches per step and their host time
(KERNEL_LAUNCH_S each), and the per-expert GEMM charge (EXPERT_GEMM_S).

    python benchmarks/eager_gaps.py
"""

from __future__ import annotations

from typing import Any

import accuracy as A
from runs import load_runs

from llmplan.cost.compute import EXPERT_GEMM_S, KERNEL_LAUNCH_S, runs_per_expert
from llmplan.cost.elementwise import softmax_launches, te_mask_launches
from llmplan.cost.moe import EAGER_OP_HOST_S, host_syncs_per_layer
from llmplan.cost.kernels import layer_launch_average
from llmplan.cost.overhead import (
    EAGER_LAYER_KERNELS,
    MOE_LAYER_KERNELS,
    host_seconds,
)
from llmplan.cost.step import max_stage_layers
from llmplan.estimate import estimate_training

PROFILES: tuple[dict[str, Any], ...] = (
    # qwen35-h100-campaign.md: static dispatch + grouped_mm, no EP overlap, HybridEP 16 SMs (32 at connections 32);
    # "kernel-active union from 22.448 to 21.844", "401,840 without overlap", "capture span ... from 26.048",
    # "idle gaps ... 4.204"; steps 5-8 mean 23,516.2 ms (32 SMs; 23.228 s at 16 SMs, connections 32).
    {"name": "qwen3.5 ep16 nooverlap c32", "row": "bridgecard-h100-bf16-qwen3.5-35b-a3b-16gpu-gbs1024",
     "plan": {"ep": 16, "moe_dispatch_sms": 32}, "kernels": 401_840, "union": 21.844, "idle": 4.204,
     "span": 26.048, "step": 23.516},
    # same, CUDA_DEVICE_MAX_CONNECTIONS=1, 16 SMs: "idle gaps increased 15.02%, from 4.204 to 4.836", kernel count
    # 401,840, HybridEP union -8.77%, expert/linear -1.58%; eager steps 5-8 22.439 s. Union and span not printed:
    # the union below is 21.844 less those two reductions (7.376 x 8.77% + 8.115 x 1.58%).
    {"name": "qwen3.5 ep16 nooverlap c1", "row": "bridgecard-h100-bf16-qwen3.5-35b-a3b-16gpu-gbs1024",
     "plan": {"ep": 16, "moe_dispatch_sms": 16}, "kernels": 401_840,
     "union": 21.844 - 7.376 * 0.0877 - 8.115 * 0.0158, "idle": 4.836, "span": None, "step": 22.439},
    # moe-comm-overlap SKILL.md: Qwen3-30B-A3B, EP16, HybridEP, router + preprocess graphs, overlap off / on:
    # 463,348 rank-0 kernels each; GPU-active union 22.821 / 21.221 s; steps 24.7138 / 20.9920 s. No idle or span.
    {"name": "qwen3-30b ep16 overlap off", "row": "bridgecard-h100-bf16-qwen3-30b-a3b-16gpu-gbs1024",
     "plan": {"ep_comm_overlap": False}, "kernels": 463_348, "union": 22.821, "idle": None, "span": None,
     "step": 24.7138},
    {"name": "qwen3-30b ep16 overlap on", "row": "bridgecard-h100-bf16-qwen3-30b-a3b-16gpu-gbs1024",
     "plan": {}, "kernels": 463_348, "union": 21.221, "idle": None, "span": None, "step": 20.9920},
)
"""Published rank-0 Nsight numbers (seconds, kernels per step) and the plan changes that make the card's row the
profiled configuration."""


def launches_per_step(m: Any, plan: Any) -> float:
    """llmplan's count of host launches per step (cost.overhead.host_seconds, one rank, no pipeline, no
    recompute): with fused kernels the structural count of cost.kernels (layer_launch_average: every layer kind,
    the per-expert GEMMs where they run per expert, graphed scopes as one launch), forward and backward; unfused,
    EAGER_LAYER_KERNELS + MOE_LAYER_KERNELS per layer forward + the per-expert calls, three passes; per
    micro-batch."""
    if plan.fused_kernels:
        return float(layer_launch_average(m, plan).total) * m.num_hidden_layers * plan.num_microbatches
    per_expert = 2 * m.num_experts / plan.ep
    fwd = EAGER_LAYER_KERNELS * m.num_hidden_layers + (MOE_LAYER_KERNELS + per_expert) * m.num_moe_layers
    return 3 * fwd * plan.num_microbatches


def llmplan_side(p: dict[str, Any], recs: dict[str, dict]) -> dict[str, float]:
    """llmplan's numbers at the profiled configuration."""
    rec = recs[p["row"]]
    m, cluster, plan = A.record_setup(rec, A.family(rec["id"]))  # type: ignore[misc]
    plan = plan.model_copy(update=p["plan"])
    e = estimate_training(m, cluster, plan)
    t = e.time
    n = plan.num_microbatches
    expert = 3 * 2 * m.num_experts / plan.ep * EXPERT_GEMM_S * m.num_moe_layers * n if bool(runs_per_expert(plan)) else 0.0
    launches = launches_per_step(m, plan)
    layers, syncs = max_stage_layers(m, plan), host_syncs_per_layer(m, plan)
    bound = float(host_seconds(plan, layers, 0.0, 0.0, m.num_moe_layers, syncs, 0.0, 1.0,
                               layer_launch_average(m, plan), softmax=softmax_launches(m, plan),
                               mask_kernels=te_mask_launches(plan)))  # GPU at zero time
    return {"step": float(t.total), "compute": float(t.compute), "host": float(t.overheads["host"]),
            "comm": float(t.comm_exposed), "launches": launches, "launch_s": launches * KERNEL_LAUNCH_S,
            "expert_gemm_s": expert, "bound": bound, "n": n, "layers": m.num_hidden_layers, "moe_layers": m.num_moe_layers}


def main() -> None:
    recs = {r["id"]: r for r in load_runs()}
    print("per step, rank 0, seconds; k/l-mb: kernels per layer and micro-batch (fwd + bwd);")
    print("h_idle: idle / kernels; h_span: (span - unprofiled step) / kernels (profiler's share per kernel)")
    for p in PROFILES:
        q = llmplan_side(p, recs)
        k = p["kernels"]
        print(f"\n{p['name']}  (row {p['row']}, plan {p['plan']})")
        idle_u = p["step"] - p["union"]
        line = (f"  measured: kernels {k:,} ({k / q['n']:,.0f}/mb, {k / q['n'] / q['layers']:.0f} k/l-mb), "
                f"union {p['union']:.3f}, step {p['step']:.3f}, step - union {idle_u:+.3f}")
        if p["idle"] is not None:
            line += f", idle {p['idle']:.3f} (h_idle {p['idle'] / k * 1e6:.1f} us)"
        if p["span"] is not None:
            line += f", span {p['span']:.3f} (h_span {(p['span'] - p['step']) / k * 1e6:.1f} us)"
        print(line)
        print(f"  llmplan:  step {q['step']:.3f}, compute {q['compute']:.3f}, comm exposed {q['comm']:.3f}, "
              f"host {q['host']:.3f}; launches {q['launches']:,.0f} ({q['launches'] / q['n'] / q['layers']:.0f}"
              f" k/l-mb) x {KERNEL_LAUNCH_S * 1e6:.0f} us = {q['launch_s']:.2f}; per-expert GEMM charge "
              f"{q['expert_gemm_s']:.3f}; host with the GPU at zero time {q['bound']:.2f}")
        print(f"  llmplan GPU work (compute + comm exposed) {q['compute'] + q['comm']:.3f} against union "
              f"{p['union']:.3f}: {q['compute'] + q['comm'] - p['union']:+.3f}; llmplan kernels / measured "
              f"{q['launches'] / k:.2f}")
        need = (p["step"]) / k
        print(f"  whole step host-paced needs {need * 1e6:.1f} us a kernel; measured kernels x EAGER_OP_HOST_S "
              f"({EAGER_OP_HOST_S * 1e6:.0f} us) = {k * EAGER_OP_HOST_S:.2f} s against union {p['union']:.2f} s")


if __name__ == "__main__":
    main()
