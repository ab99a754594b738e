"""Four small mechanisms of the Megatron-FSDP / MoE presets (docs/validation.md#fsdp-bits): the pinned host blocks of
the fine-grained offload, the step-end TP all-reduce of the local gradient shard, the routing-map padding's extra
rows, and the DP-Outer groups of hybrid sharding.

Prints, for the two Nemotron-3 Ultra 26.08 rows (as benchmarks/accuracy.py reads them): predicted and measured
tokens/s per GPU, the host bytes per GPU the offload holds (raw and pinned), and the step-end TP all-reduce (whole
gradients against the DP-Shard slice); then router_padding_share for DeepSeek-V3 / Qwen3-235B at the alignments
Megatron-Core uses; then, for some hybrid-sharded layouts, the (size, stride) of llmplan's dense and expert
DP-Outer groups. Nothing is fitted.

    python benchmarks/fsdp_bits.py
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

import accuracy  # noqa: E402
from conftest import load_runs, runs_path  # noqa: E402

from llmplan.cost.comm import fsdp_tp_sync_shard, tp_synced_params  # noqa: E402
from llmplan.cost.gemm import router_padding_align, router_padding_share  # noqa: E402
from llmplan.cost.memory import inflight_microbatches  # noqa: E402
from llmplan.cost.offload import moe_act_offload_bytes, moe_act_offloaded_groups, moe_layer_pinned_bytes  # noqa: E402
from llmplan.cost.params import stage_layers  # noqa: E402
from llmplan.estimate import estimate_training  # noqa: E402
from llmplan.specs.plan import ParallelPlan  # noqa: E402
from llmplan.specs.registry import builtin_models  # noqa: E402
from llmplan.topology.placement import axis_dims  # noqa: E402


def ultra_rows() -> None:
    print("Nemotron-3 Ultra 26.08 rows")
    for r in load_runs(runs_path()):
        if "nemotron-3-ultra" not in r["id"]:
            continue
        fam = accuracy.family(r["id"])
        got = {q: (p, m) for q, p, m in accuracy.predict(r, fam)}
        m, c, p = accuracy.record_setup(r, fam)[:3]
        e = estimate_training(m, c, p)
        groups = moe_act_offloaded_groups(stage_layers(m, p, 0)[1], inflight_microbatches(p, 0))
        raw, pinned = moe_act_offload_bytes(m, p), moe_layer_pinned_bytes(m, p)
        summed, _ = tp_synced_params(m, p, 0)
        shard = fsdp_tp_sync_shard(p)
        pred, meas = got["tok/s/GPU"]
        print(f"  {r['id']}\n    tok/s/GPU predicted {float(pred):.1f} measured {float(meas):.1f} "
              f"({float(pred) / float(meas) - 1:+.1%})\n"
              f"    offload: {int(groups)} groups x {float(raw):,.0f} B raw -> {float(pinned):,.0f} B pinned: "
              f"{float(groups * raw) / 1e9:.2f} -> {float(e.memory.activation_parts.offloaded) / 1e9:.2f} GB a GPU\n"
              f"    step-end TP all-reduce: {float(summed * shard):,.0f} gradients whole -> {float(summed):,.0f} "
              f"(DP-Shard {int(shard)}), exposed tp {float(e.time.exposed['tp']) * 1e3:.1f} ms a step")


def padding() -> None:
    print("router padding: extra routed rows over the mean (4,096 tokens a rank, random routing)")
    M = builtin_models()
    for name in ("deepseek-v3", "qwen3-235b-a22b"):
        m = M[name]
        for recipe, gemm, disp in (("mxfp8", "per-expert", "alltoall"), ("blockwise", "per-expert", "alltoall"),
                                   ("mxfp8", "per-expert", "deepep"), ("mxfp8", "grouped", "alltoall")):
            p = ParallelPlan(dp=64, ep=64, etp=1, global_batch=1024, seq_len=4096, dtype="fp8", recipe=recipe,
                             expert_gemm=gemm, moe_dispatcher=disp, moe_router_padding=True)
            print(f"  {name:16s} {recipe:9s} {gemm:10s} {disp:8s} align {int(router_padding_align(m, p)):3d}: "
                  f"{float(router_padding_share(m, p)):+.3f}")


def outer_groups() -> None:
    print("hybrid sharding: (size, stride) of the dense and expert DP-Outer groups")
    for kw in (dict(tp=2, etp=1, dp=128, ep=64, dp_replicate=4), dict(tp=1, dp=256, ep=64, dp_replicate=4),
               dict(tp=4, cp=2, dp=32, ep=8, etp=1, dp_replicate=2, pp=2),
               dict(tp=8, dp=16, ep=32, etp=2, dp_replicate=2)):
        p = ParallelPlan(global_batch=4096, seq_len=8192, zero=3, **kw)
        d = axis_dims(p.degrees)
        print(f"  {kw}: dense {d['dpcp_out']} expert {d['edp_out']}")


if __name__ == "__main__":
    ultra_rows()
    padding()
    outer_groups()
