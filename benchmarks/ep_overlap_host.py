"""The host's issue time of Megatron-Core's EP-overlap (combined-1F1B) schedule per layer and micro-batch, against
the GPU time of the pair it issues (issue 32; docs/validation.md#ep-overlap-host).

With `overlap_moe_expert_parallel_comm` the host issues a layer's forward for one micro-batch and the same layer's
backward for another in one Python call (NVIDIA/Megatron-LM megatron/core/models/common/model_chunk_schedule_plan.py
at d98e8a6, `TransformerLayerSchedulePlan.run`), each of the ten node passes inside a ScheduleNode's stream context
(`pipeline_parallel/utils.py` `ScheduleNode._forward`, `_backward`, `stream_acquire_context`), and the dispatcher's
token-count wait once per pair. Between two waits the host therefore issues: the forward's eager ops
(MOE_CYCLE_HOST_OPS, EAGER_OP_HOST_S each), the backward's launches (cost.kernels' structural count,
KERNEL_LAUNCH_S each, from autograd's engine) and the schedule nodes' own stream, event and tensor calls
(NODE_HOST_OPS), all at the row's host CPU factor (GpuSpec.host_op_factor). If that outlasts the pair's GPU time
(one layer's forward and backward on the slowest stage), the GPU runs at the host's pace: the host-bound floor the
brief asked for. `need` is the per-op factor over x86 at which this count alone would last the measured step's
time per layer pair. Rows: every scored mbridge / bridgecard row whose plan has the overlap outside a
full-iteration CUDA graph (per-layer graphs counted as eager: an upper bound), and the three Qwen3-235B-A22B rows
skipped for it (MBRIDGE_SKIP); then Megatron-Bridge PR #1760's two published pairs.

    python benchmarks/ep_overlap_host.py
"""

from __future__ import annotations

from typing import Any

import accuracy as A
from runs import load_runs

from llmplan.cost.compute import KERNEL_LAUNCH_S
from llmplan.cost.kernels import layer_launch_average
from llmplan.cost.moe import EAGER_OP_HOST_S, MOE_CYCLE_HOST_OPS
from llmplan.cost.step import max_stage_layers
from llmplan.estimate import estimate_training

NODE_HOST_OPS = 52
"""Host calls of the schedule nodes of one layer pair besides the modules' own ops, counted along NVIDIA/Megatron-LM
megatron/core/pipeline_parallel/utils.py at d98e8a6: a forward pass (4 a pair: pre-dispatch, dispatch, experts,
combine) makes the event wait, the stream switch in and out, the input's detach and the event record (5); a
backward pass (4) the event wait, the two stream switches, the autograd engine call, the event record and the
gradient's record_stream (6); a weight-gradient pass (2: experts, pre-dispatch; delay_wgrad_compute) the wait, the
two switches and the record (4). 4 x 5 + 4 x 6 + 2 x 4 = 52, each priced as one eager op (EAGER_OP_HOST_S)."""

SKIPPED = ("mbridge-25.11-pretrain-qwen3-235b-a22b-dgx-b200-", "mbridge-26.02-pretrain-qwen3-235b-a22b-dgx-b300-",
           "mbridge-26.02.01-pretrain-qwen3-235b-a22b-dgx-b300-")
"""The rows MBRIDGE_SKIP holds for the overlap's host cost (accuracy.py)."""

PR1760 = {  # NVIDIA-NeMo/Megatron-Bridge PR #1760 (a6e92de5f, 2025-12-17): the preset's step, overlap on -> fixed
    "bf16, VP4 kept": ({"dtype": "bf16", "fp8_params": False, "vpp": 4}, 17.2, 16.0),
    "mxfp8, VP4 -> none": ({"vpp": 4}, 20.1, 16.9),
}
"""Step seconds, on and off, of the v0.2.0 B200 presets (64 GPUs, PP8 VP4 EP8, GBS 1024, alltoall): BF16 only the
overlap off; MXFP8 the overlap and VP off ("MXFP8 step time improved from 20.1s to 16.9s. BF16 step time improved
from 17.2s to 16s. Disable moe_a2a_overlap due to CPU overhead for BF16 and MXFP8. Disable VP for mxfp8.")."""


def pair_host(m: Any, plan: Any, factor: float) -> float:
    """Host seconds to issue one layer pair of the paired schedule (module docstring)."""
    bwd = float(layer_launch_average(m, plan).bwd)
    return ((MOE_CYCLE_HOST_OPS + NODE_HOST_OPS) * EAGER_OP_HOST_S + bwd * KERNEL_LAUNCH_S) * factor


def row(rec: dict) -> dict[str, Any] | None:
    """The numbers of one record whose plan runs the overlap (None otherwise)."""
    fam = A.family(rec["id"])
    skip = A.skip_reason
    if any(k in rec["id"] for k in SKIPPED):  # priced as the preset ran, the skip set aside
        A.skip_reason = lambda r: None
    try:
        setup = A.record_setup(rec, fam)
    finally:
        A.skip_reason = skip
    if setup is None or not setup[2].ep_comm_overlap or "tokens_per_s_per_gpu" not in rec["measured"]:
        return None
    m, cluster, plan = setup
    e = estimate_training(m, cluster, plan)
    f, n, layers = cluster.system.gpu.host_op_factor, plan.num_microbatches, int(max_stage_layers(m, plan))
    gpu = float(e.time.stage.total) / layers
    tokens, gpus = plan.global_batch * plan.seq_len, rec["hardware"]["gpus"]
    meas = tokens / (rec["measured"]["tokens_per_s_per_gpu"] * gpus)
    return {"id": rec["id"], "f": f, "gpu": gpu, "host": pair_host(m, plan, f), "x86": pair_host(m, plan, 1.0),
            "need": meas / (n * layers) / pair_host(m, plan, 1.0), "err": 100 * (meas / float(e.time.total) - 1),
            "path": f"{plan.moe_flex_backend if plan.moe_dispatcher == 'deepep' else plan.moe_dispatcher}/{plan.cuda_graphs}"}


def main() -> None:
    recs = [r for r in load_runs() if A.family(r["id"]) in ("mbridge-moe", "bridgecard")]
    every = [x for r in recs for x in [row(r)] if x is not None]
    rows = [r for r in every if not r["path"].endswith("full-iteration")]
    print(f"{len(every) - len(rows)} overlap rows run inside a full-iteration CUDA graph (one launch a step: no host "
          f"pair to count) and are left out; {len(rows)} eager or per-layer-graphed rows:")
    print("per layer pair (one layer's forward + another micro-batch's backward), ms; err: tokens/s, llmplan vs measured")
    print(f"{'row':50s} {'dispatch/graphs':>22s} {'f':>4s} {'gpu':>5s} {'host':>5s} {'h/g':>5s} {'need':>5s} {'err':>7s}")
    for r in sorted(rows, key=lambda r: -r["host"] / r["gpu"]):
        tag = " (skipped)" if any(k in r["id"] for k in SKIPPED) else ""
        print(f"{(r['id'][8:] + tag)[:50]:50s} {r['path'][:22]:>22s} {r['f']:4.2f} {r['gpu'] * 1e3:5.2f} {r['host'] * 1e3:5.2f} "
              f"{r['host'] / r['gpu']:5.2f} {r['need']:5.1f} {r['err']:+7.1f}")
    base = next(r for r in recs if r["id"].startswith(SKIPPED[0]))
    A.skip_reason, skip = (lambda r: None), A.skip_reason
    m, cluster, plan = A.record_setup(base, "mbridge-moe")
    A.skip_reason = skip
    print("Megatron-Bridge PR #1760 (B200, 64 GPUs, PP8 EP8): step s, overlap on -> off, published and llmplan")
    for name, (upd, on, off) in PR1760.items():
        p_on = plan.model_copy(update=upd)
        p_off = p_on.model_copy(update={"ep_comm_overlap": False, "vpp": 4 if "kept" in name else 1})
        e_on, e_off = (estimate_training(m, cluster, p).time for p in (p_on, p_off))
        ratio = pair_host(m, p_on, 1.0) * int(max_stage_layers(m, p_on)) / float(e_on.stage.total)
        print(f"  {name:20s} published {on:5.1f} -> {off:5.1f} ({on / off:5.3f}x)   llmplan {float(e_on.total):6.2f} "
              f"-> {float(e_off.total):6.2f} ({float(e_on.total) / float(e_off.total):5.3f}x)   host/gpu a pair {ratio:4.2f}")


if __name__ == "__main__":
    main()
