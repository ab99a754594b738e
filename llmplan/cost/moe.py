"""Mixture-of-experts mechanisms shared by compute, communication and the step: how unevenly the router loads
the expert-parallel ranks, and how much of the expert all-to-alls an overlapped schedule hides.

Works on one ParallelPlan and, elementwise, on plan arrays (see llmplan/arith.py).
"""

from __future__ import annotations

from itertools import combinations
from typing import Any

import numpy as np

from llmplan.arith import expected_max_normal, maximum, minimum, where
from llmplan.cost.runtime_memory import userbuffers_on
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.quantities import megatron_fsdp_acts
from llmplan.specs.schedule import schedule_of

EP_OVERLAP_HIDDEN = 0.74
"""Share of the paired all-to-all time (what each of a MoE layer's four all-to-alls can hide behind the compute
chunk the combined-1F1B schedule pairs it with, summed over the paired micro-batches, (1 - kappa) of it:
cost.moe.ep_exposed) that Megatron-Core's EP overlap (`overlap_moe_expert_parallel_comm`) hides: the part of the
measured saving the pairing does not explain, read off a controlled pair as a relative saving. Megatron-Bridge
PR 5094 (merged 2026-07-25, 7ded17dae, skills/nemo-mbridge-perf-moe-comm-overlap/card.yaml measured_result) ran the
Qwen3-30B-A3B verification card's recipe (16 H100, BF16, EP16 over two nodes, HybridEP on 32 SMs, TE graphs of the
router and preprocessing, delay_wgrad_compute off, CUDA_DEVICE_MAX_CONNECTIONS 32) with only the overlap toggled:
24.714 s per step off, 21.073 s on (same window, steps 5-20; 20.992 s in the card's independent steps 41-50), a
saving r = 14.73% (15.06%). There every all-to-all (0.51 ms) is shorter than its paired chunk (0.99-1.99 ms), so
the pairing alone would save 18.8%. The share is s = r x T_off / H, T_off and H = T_off - T(s = 1) llmplan's step
without overlap and its paired all-to-all on that plan (25.28 s, 4.66 s): 0.80 (0.82), so a scale error common to
the step cancels (re-read when the network's bytes of a two-node HybridEP all-to-all were priced at its published
H100 rate, comm.ep_rdma: 0.80 before, docs/validation.md#h100-moe-spread; when the routing's passes were priced from
the kernels: 26.02 s and 0.82 before,
docs/validation.md#routing-passes; 24.86 s and 0.785 before HybridEP's own permutes were priced,
docs/validation.md#hybridep-permute). The alltoall pair of Megatron-Bridge PR 3862 (41.25 -> 31.31 s,
CUDA_DEVICE_MAX_CONNECTIONS 8) reads 0.69 under the pairing (0.59 before it): not used, docs/validation.md#ep-pairing.
tests/test_moe_mechanisms.py
re-reads both. The DeepEP pair across four H100 nodes of yanring/Megatron-MoE-ModelZoo 8017e11 (Qwen3-235B, 19.7 -> 17.6
s)
reads 0.40, about EP_OVERLAP_ONE_QUEUE of this share: its committed config runs one hardware queue
(overlap_queues), docs/validation.md#dsv3-h100-shares, #cuda-connections.
Source: NVIDIA-NeMo/Megatron-Bridge @7ded17dae, skills/nemo-mbridge-perf-moe-comm-overlap/card.yaml (PR 5094).
Derived: docs/formulas.md#moe.overlap"""


EP_OVERLAP_ONE_QUEUE = 0.50
"""Part of the EP overlap's hidden time that stays hidden at CUDA_DEVICE_MAX_CONNECTIONS=1 (one hardware queue:
the communication stream's kernels run in launch order behind the compute stream's). Megatron-LM PR 6311 (merged
into dev as 1ea5c3472e, 2026-08-19; its description's table) measured the DeepSeek-V3 benchmark recipe cut to 14
layers on 64 H100 (TP1 PP4 EP16, alltoall dispatcher, BF16, full recompute): 184.2 TFLOP/s/GPU without the overlap
(at 1 connection), 191.1 with it at 1 connection, 198.5 at 32. Saved time a step, 1/184.2 - 1/191.1 against
1/184.2 - 1/198.5 (the same FLOPs): 0.501 (in throughput +3.7% against +7.8%, as the PR states it). The arm without
the overlap was run at 1 only; the step without the overlap is priced the same at any count. That A/B ran with full
recompute, a regime llmplan does not price the overlap in (check_plan's rule ep_overlap_full_recompute refuses it,
as Megatron-Core does); the check in llmplan's regime is yanring/Megatron-MoE-ModelZoo @8017e11's Qwen3-235B DeepEP
pair on four H100 nodes (selective recompute of moe_act and layernorm, its config at one queue), whose own reading
is 0.40 of the 0.74 share, about 0.54 (docs/validation.md#cuda-connections).
Source: NVIDIA/Megatron-LM PR 6311 description (@1ea5c3472e). Derived: docs/formulas.md#moe.overlap_queues"""


def overlap_queues(plan: ParallelPlan, compute_capability: float | None = None) -> Any:
    """Factor on the EP overlap's hidden share for the plan's hardware queue count: EP_OVERLAP_ONE_QUEUE at
    cuda_max_connections 1, else 1 (EP_OVERLAP_HIDDEN was read at 32 and 8: PR 5094, PR 3862). Unset, on a GPU
    before Blackwell (compute capability < 10) beside Transformer Engine's userbuffer TP overlap, the count is the
    one queue that overlap needs (what the Megatron-LM export writes then): EP_OVERLAP_ONE_QUEUE; but not where
    Megatron-FSDP runs the plan's ZeRO-2 / 3 (megatron_fsdp, no pipeline), which asserts more than one queue
    (Megatron-LM d98e8a6 arguments.py; Transformer Engine orders its TP overlap behind them on Hopper, PR #1308).
    Elementwise on plan arrays. Derived: docs/formulas.md#moe.overlap_queues"""
    if plan.cuda_max_connections == 1:  # a workload switch: one value for all plans of a search
        return EP_OVERLAP_ONE_QUEUE
    if plan.cuda_max_connections is None and compute_capability is not None and compute_capability < 10:
        return where(userbuffers_on(plan) & np.logical_not(megatron_fsdp_acts(plan)), EP_OVERLAP_ONE_QUEUE, 1.0)
    return 1.0


DEEPEP_NUM_SMS = 20
"""SMs the deepep dispatcher's kernels run on where the plan gives none: Megatron-Core's default for DeepEP
(moe_deepep_num_sms 20; at 2026 HEAD megatron/core/transformer/moe/token_dispatcher.py sets 20 when
moe_flex_dispatcher_num_sms is unset). Derived: docs/formulas.md#comm.ep_sms"""


HYBRIDEP_NUM_SMS = 24
"""SMs HybridEP's dispatch and combine run on where the plan gives none inside one NVLink domain: DeepEP's
default (csrc/hybrid_ep/config.cuh at 94a9f8f6: num_sms_dispatch_api.value_or(24 in one domain, 8 across)),
which Megatron-Core passes on when moe_flex_dispatcher_num_sms is unset. Derived: docs/formulas.md#comm.hybridep"""


def dispatch_sms(plan: ParallelPlan) -> int:
    """SMs the deepep dispatcher's kernels hold: the plan's, else its backend's default (DEEPEP_NUM_SMS,
    HYBRIDEP_NUM_SMS). Derived: docs/formulas.md#comm.ep_sms"""
    default = HYBRIDEP_NUM_SMS if plan.moe_flex_backend == "hybridep" else DEEPEP_NUM_SMS
    return plan.moe_dispatch_sms or default


def dispatch_contention(plan: ParallelPlan, sm_count: int, kappa: float) -> float:
    """Fraction by which compute slows while the expert all-to-alls run beside it: the deepep dispatcher's
    kernels hold their SMs (moe_dispatch_sms) for the whole dispatch or combine, so the compute overlapped with
    them runs on the rest, sms / sm_count (at most half, as GpuSpec.contention); NCCL's alltoall takes the
    GPU's nccl_sms (kappa). Source: DeepSeek-V3 technical report §3.2.2 (20 of the H800's 132 SMs given to
    communication). Derived: docs/formulas.md#comm.ep_sms"""
    if plan.moe_dispatcher != "deepep":  # a workload switch: one value for all plans of a search
        return kappa
    return min(dispatch_sms(plan) / sm_count, 0.5)


def routing_imbalance(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Rows the most-loaded EP rank computes and receives over the mean, per MoE layer and micro-batch
    (the slowest rank sets the pace of the grouped GEMM and of the all-to-all that waits on it):
    * padded to capacity (moe_capacity_factor c): c, as priced before (moe.capacity);
    * contiguous routing (NeMo AutoModel's fake balanced gate): 1, every rank gets the same rows;
    * random routing (Megatron's --moe-router-force-load-balancing, the benchmark tables' force-balanced
      case): each of the ep·T tokens of the group draws k distinct of the E experts uniformly, so a rank's
      rows have mean T·k and variance T·k·(1 - 1/ep)·(E - k)/(E - 1) (hypergeometric per token); the most
      loaded of ep ranks is 1 + z(ep)·sqrt((1 - 1/ep)(E - k)/((E - 1)·T·k)) of the mean, z the expected
      largest of ep normal draws. DeepSeek-V3 at one 4,096-token micro-batch on EP64: 1.3%. A trained router's
      own imbalance is not in this term. Derived: docs/formulas.md#moe.imbalance"""
    if plan.moe_capacity_factor:  # a workload switch: one value for all plans of a search
        return plan.expert_padding
    if plan.moe_routing == "contiguous":
        return 1.0
    E, k = m.num_experts, m.num_experts_per_tok
    tokens = plan.seq_len / plan.cp * plan.micro_batch / where(plan.sp, plan.tp, 1)
    ep = np.asarray(plan.ep)
    z = expected_max_normal(ep)
    spread = np.sqrt((1 - 1 / ep) * (E - k) / max(E - 1, 1) / np.maximum(tokens * k, 1.0))
    out = 1.0 + z * spread
    return float(out) if np.ndim(out) == 0 else out


def ep_exposed(plan: ParallelPlan, ep: Any, window: Any, kappa: float, pair: tuple[Any, ...] = (),
               layers: Any = 1, deferred: tuple[Any, Any] = (0.0, 0.0),
               compute_capability: float | None = None) -> Any:
    """Time the expert all-to-alls of `ep` seconds add to a micro-batch whose compute takes `window` seconds:
    all of it without overlap; with DualPipe, what does not fit in the window plus the compute its SMs slow
    (kappa), as step.overlap (DeepSeek-V3 report §3.2.1: the all-to-alls hide in full). With Megatron-Core's EP
    overlap each of a MoE layer's four all-to-alls (ep / layers / 4 each) runs beside the one compute chunk of
    the other micro-batch that the combined-1F1B schedule pairs it with (`pair`: cost.compute.ep_pair_windows),
    so it hides at most that chunk's length: min(t, w_i), summed over the four and the `layers` MoE layers; the
    micro-batches the schedule runs unpaired (unpaired_microbatches) hide nothing; of the rest EP_OVERLAP_HIDDEN
    hides (as measured; times overlap_queues at one hardware queue, `compute_capability` the GPU's), the compute
    beside it slowed by kappa. With
    delay_wgrad (`deferred`: the attention node's and the experts' deferred weight-gradient seconds,
    cost.compute.ep_deferred_wgrad) two windows grow
    (delayed_windows); the deferral gains the smaller of what the two placements of the share's residual allow:
    the share of the grown windows (the residual on the compute), and what the grown windows free of transfers
    stretched to the exposure without it (on the communication stream: stretched_transfer).
    Derived: docs/formulas.md#moe.overlap, docs/formulas.md#moe.delay_wgrad"""
    if schedule_of(plan).hides_ep:
        return ep - minimum(ep, window) * (1.0 - kappa)
    if not plan.ep_comm_overlap:  # a workload switch: one value for all plans of a search
        return ep
    t = ep / maximum(layers, 1) / 4  # one all-to-all of one MoE layer
    n = plan.num_microbatches
    paired = maximum(n - unpaired_microbatches(plan), 0) / n
    share = EP_OVERLAP_HIDDEN * overlap_queues(plan, compute_capability) * (1.0 - kappa)
    hidden = on_compute = 0.0 * t
    for w, w_dw in zip(pair, delayed_windows(pair, t, deferred), strict=True):
        hidden = hidden + minimum(t, w)
        on_compute = on_compute + share * (minimum(t, w_dw) - minimum(t, w))
    stretched = stretched_transfer(pair, 4 * t - share * hidden)
    on_comm = 0.0 * t
    for w, w_dw in zip(pair, delayed_windows(pair, stretched, deferred), strict=True):
        on_comm = on_comm + maximum(stretched - w, 0.0) - maximum(stretched - w_dw, 0.0)
    return ep - paired * layers * (share * hidden + minimum(on_compute, on_comm))


def stretched_transfer(pair: tuple[Any, ...], exposed: Any) -> Any:
    """Length of each of a MoE layer's four all-to-alls for which the two streams, every transfer in its window
    (the pairing at share 1), leave `exposed` seconds of a layer pair exposed: the t' with
    sum_i max(t' - w_i, 0) = exposed. That sum is the largest of k·t' - (the k smallest windows' sum) over k, so
    t' is the smallest (exposed + sum of a subset of the windows) / the subset's size. The residual read as
    stretched transfers: PR 3862's overlap arm (31.31 s) implies transfers of 2.42 ms against the 1.73 ms its off
    arm (41.25 s) implies, longer than every window, and the same run measured the deferral neutral (31.20 s),
    which only a saturated communication stream gives.
    Derived: docs/formulas.md#moe.delay_wgrad"""
    best: Any = None
    for size in range(1, len(pair) + 1):
        for subset in combinations(pair, size):
            v = (exposed + sum(subset)) / size
            best = v if best is None else minimum(best, v)
    return exposed if best is None else best


def delayed_windows(pair: tuple[Any, ...], t: Any, deferred: tuple[Any, Any]) -> tuple[Any, ...]:
    """The four windows (A_f, M_b, M_f, A_b: cost.compute.ep_pair_windows) the all-to-alls of `t` seconds each
    hide behind when the layer's weight gradients are deferred (a_dw of the attention node, e_dw of the
    experts, inside A_b and M_b): the dispatch backward waits only for the experts' input gradient and runs
    beside their weight gradient where the forward dispatch, ahead of it on the communication stream, has left
    it free: M_f + min(e_dw, max(M_b - t, 0)); the next layer's combine backward likewise beside the attention
    node's: A_f + min(a_dw, max(A_b - t, 0)). The forward transfers keep their windows (the chunk they wait
    behind still holds the deferred GEMMs). Source: NVIDIA/Megatron-LM megatron/core/models/common/
    model_chunk_schedule_plan.py at d98e8a6 (TransformerLayerSchedulePlan.run: mlp.backward_dw before
    moe_dispatch.backward, pre_dispatch_computation.backward_dw last). Derived: docs/formulas.md#moe.delay_wgrad"""
    if not pair:
        return pair
    a_dw, e_dw = deferred
    a_f, m_b, m_f, a_b = pair
    return (a_f + minimum(a_dw, maximum(a_b - t, 0.0)), m_b, m_f + minimum(e_dw, maximum(m_b - t, 0.0)), a_b)


def unpaired_microbatches(plan: ParallelPlan) -> Any:
    """Micro-batches of a step, on the first pipeline rank, whose all-to-alls the combined-1F1B schedule runs
    with no pass of another micro-batch beside them: without pipeline stages the first forward and the last
    backward run alone (one micro-batch's worth); with them (Megatron-Core requires virtual stages) the first
    rank's warm-up forwards, 2(p - 1) + (v - 1)·p plus the one the overlap adds, and as many cool-down backwards,
    over the v chunk passes of a micro-batch. Source: NVIDIA/Megatron-LM megatron/core/pipeline_parallel/
    combined_1f1b.py (combined_1f1b_schedule_for_no_pipelining) and schedules.py
    (get_pp_rank_microbatches: "one extra micro-batch forward step") at d98e8a6.
    Derived: docs/formulas.md#moe.overlap"""
    p, v = plan.pp, plan.vpp
    warmup = where(p > 1, 2 * (p - 1) + (v - 1) * p + 1, 1)
    return minimum(warmup / v, plan.num_microbatches)


HOST_SYNC_S = 6e-6
"""Time the GPU idles at one host synchronisation besides the launch that follows it: the copy's event
completes, the waiting host thread wakes and returns to Python. NVIDIA Technical Blog, "Getting Started with
CUDA Graphs" (A. Gray, 2019): a stream of 20 short kernels ran at 3.8 us per kernel with one synchronisation per
iteration and 9.6 us with one after every kernel, about 6 us per synchronisation.
Derived: docs/formulas.md#step.host_sync"""


EAGER_OP_HOST_S = 8e-6
"""Host time to issue one eager PyTorch operator on CUDA tensors from Python (argument parsing, the dispatcher,
autograd recording, the launch), while the GPU's queue is empty. Measured: FlagOS Torch-FL pull request 27
(github.com/flagos-ai/Torch-FL/pull/27, "dispatch-overhead microbenchmark": torch.add on 512x512 CUDA tensors,
A100, ops issued back to back and synchronised once: 8 us per op on PyTorch's own CUDA path); PyTorch issue
41383 (2020: about 7 us per elementwise op with autograd recording, 5 us without). Taken as published, not
fitted. Derived: docs/formulas.md#step.host_sync"""
MOE_CYCLE_HOST_OPS = 80
"""Eager operators the host issues from one MoE layer's token-count wait to the next MoE layer's (a transformer
layer's forward with the alltoall dispatcher, EP > 1, fused router and permute, auxiliary loss on), counted along
Megatron-LM's code path at d98e8a6: after the wait (moe/token_dispatcher.py token_dispatch .. combine_postprocess,
moe/experts.py TEGroupedMLP.forward) the two dispatch all-to-alls with their output buffers (4), sort by local
expert (2), the quantisation padding and probs reshape (3), the two grouped linears (3 each besides the per-expert
GEMMs, which compute.layer_seconds prices as launches), the weighted SwiGLU (2), the unsort (2), the combine
all-to-all (2), the unpermute and reshape (2), the residual add (2): about 25; then the next layer's attention
half (two norms, QKV and output projections with their casts, rotary, the attention kernel and its wrappers, the
residual: about 15), the router (gating GEMM, fused top-k, scores and auxiliary loss with its all-reduce and
tracker: about 14), the dispatcher's preprocess (token counts, their all-gather over the EP group, the splits:
about 14), the device-to-host copies on the side stream (7) and the permute (3). Another router (eager, or
without the loss) adds cost.kernels.router_host_ops (overhead.host_seconds). Derived:
docs/formulas.md#step.host_sync"""
MOE_POST_SYNC_HOST_OPS = 25
"""Of MOE_CYCLE_HOST_OPS, those after the wait: what stays eager under per-layer CUDA graphs (Megatron's
attn / moe_router / moe_preprocess graphs replay the rest as 2 graph launches). Derived:
docs/formulas.md#step.host_sync"""


def host_syncs_per_layer(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Host synchronisations of one MoE layer's forward (recompute runs it again): 1 where the layer is dropless
    and not inside a full-iteration CUDA graph, else 0. Dropless, the rows each rank sends and each local expert
    computes are known only on the GPU: Megatron-Core's alltoall dispatcher copies the token counts to the host
    and waits at `cuda_sync_point` (before the all-to-all with EP, before returning without) to size the
    all-to-all and the permute buffers; the flex dispatcher (DeepEP, HybridEP) reads the received counts back to
    size its output; the grouped GEMM takes host split sizes (`tokens_per_expert.tolist()`). Padded to capacity
    (--moe-pad-expert-input-to-capacity) every count is known on the host; a full-iteration graph runs with a
    static per-rank budget (--moe-expert-rank-capacity-factor) and never waits. Per-layer graphs
    (cuda_graphs "layers") capture the router and preprocessing, not the wait.
    Source: Megatron-LM megatron/core/transformer/moe/token_dispatcher.py (MoEAlltoAllTokenDispatcher.preprocess,
    _HybridEPManager.dispatch) and moe/experts.py (TEGroupedMLP.forward) at d98e8a6.
    Derived: docs/formulas.md#step.host_sync"""
    synced = (plan.moe_capacity_factor is None) & (plan.cuda_graphs != "full-iteration")
    return where(synced, 1.0, 0.0) if m.is_moe else 0.0
