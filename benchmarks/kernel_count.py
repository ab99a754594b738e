"""Kernels per layer kind, micro-batch and step, counted from the modules Megatron-Core runs (llmplan.cost.kernels),
against the two published rank-0 Nsight counts (issues 32 and 40; docs/validation.md#kernel-count).

For each profiled configuration (the card's row, its layout changed to the profiled one, as benchmarks/eager_gaps.py
sets it): the forward and backward kernels of each sub-module and layer kind, the MTP module and the head, the
per-step arithmetic (micro-batches x (layers + MTP + head)) and the ratio to the published count; with CUDA graph
scopes, the host's launches (a graph one) beside the GPU's kernels.

    python benchmarks/kernel_count.py
"""

from __future__ import annotations

from typing import Any

import accuracy as A
from runs import load_runs

from llmplan.cost import kernels as K

PROFILES: tuple[dict[str, Any], ...] = (
    # Megatron-Bridge PR 5098 at 7e4a6d11e, qwen35-h100-campaign.md: "401,840 without overlap" (and with
    # connections 1, and with shared-expert overlap: "kept kernel count at 401,840"). Recipe
    # perf_recipes/qwen/h100/qwen35.py: static HybridEP (moe_expert_rank_capacity_factor 1.05), permute fused
    # into HybridEP, forced balancing, eager, grouped_mm experts (modeling_qwen35/runtime_patch.py).
    {"name": "Qwen3.5-35B-A3B EP16 eager", "row": "bridgecard-h100-bf16-qwen3.5-35b-a3b-16gpu-gbs1024",
     "plan": {"ep": 16}, "kernels": 401_840, "scopes": (),
     "moe": {"static_capacity": True, "fused_permute": True, "force_balance": True}},
    # moe-comm-overlap SKILL.md (HybridEP production-shape validation): 463,348 rank-0 kernels, overlap off and
    # on alike. Recipe at 8198fd9cd: HybridEP blocking dispatch, TEGroupedMLP, TE graphs of moe_router and
    # moe_preprocess, forced balancing.
    {"name": "Qwen3-30B-A3B EP16, router+preprocess graphs", "row": "bridgecard-h100-bf16-qwen3-30b-a3b-16gpu-gbs1024",
     "plan": {"ep_comm_overlap": False, "expert_gemm": "per-expert"}, "kernels": 463_348,
     "scopes": ("moe_router", "moe_preprocess"),
     "moe": {"static_capacity": False, "fused_permute": False, "force_balance": True}},
)


def _row(label: str, k: K.Kernels) -> str:
    return f"  {label:<40} fwd {float(k.fwd):6.0f}  bwd {float(k.bwd):6.0f}  total {float(k.total):6.0f}"


def report(p: dict[str, Any], recs: dict[str, dict]) -> None:
    rec = recs[p["row"]]
    m, _, plan = A.record_setup(rec, A.family(rec["id"]))  # type: ignore[misc]
    plan = plan.model_copy(update=p["plan"])
    moe, scopes = p["moe"], p["scopes"]
    n = plan.num_microbatches
    print(f"\n{p['name']}  (row {p['row']}, {n} micro-batches, ep {plan.ep}, experts {plan.expert_gemm})")
    kinds = sorted(set(m.layer_types or ("full_attention",)))
    for kind in kinds:
        print(_row(f"mixer {kind}", K.mixer_kernels(m, plan, kind)))
    print(_row("MoE block (norm, router, EP, experts)", K.moe_kernels(m, plan, **moe)))
    for kind in kinds:
        count = (m.layer_types or ("full_attention",) * m.num_hidden_layers).count(kind)
        layer = K.layer_kernels(m, plan, kind, "moe", **moe) + K.graph_io(kind, "moe", scopes)
        print(_row(f"layer {kind} x {count}", layer))
    layers = K.model_layer_kernels(m, plan, scopes, **moe)
    mtp = K.mtp_kernels(m, plan, **moe)
    print(_row("all layers, one micro-batch", layers))
    print(_row(f"MTP modules ({m.num_nextn_predict_layers})", mtp))
    print(_row("head (embedding, norm, output, loss)", K.HEAD))
    per_mb = layers.total + mtp.total + K.HEAD.total
    total = K.step_kernels(m, plan, scopes, **moe)
    k = p["kernels"]
    print(f"  step: {n} x ({float(layers.total):,.0f} + {float(mtp.total):,.0f} + {K.HEAD.total}) = {float(total):,.0f}"
          f" kernels ({float(per_mb) / m.num_hidden_layers:.1f} a layer and micro-batch); published {k:,}"
          f" ({k / n / m.num_hidden_layers:.1f}); ratio {float(total) / k:.3f}")
    if scopes:
        launches = K.step_kernels(m, plan, scopes, True, **moe)
        print(f"  host launches (a graph one): {float(launches):,.0f}, ratio to the published kernels "
              f"{float(launches) / k:.3f}")


def main() -> None:
    recs = {r["id"]: r for r in load_runs()}
    print("kernels per micro-batch (forward, backward) from cost.kernels; the optimizer step's kernels not itemised")
    for p in PROFILES:
        report(p, recs)


if __name__ == "__main__":
    main()
