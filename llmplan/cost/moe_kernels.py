"""The small per-call kernels of an MoE layer in training whose time is not their HBM bytes: the alltoall
dispatcher's chunk-sort map, the permute's row-id argsort and the router's multi-block radix top-k. Each is
priced as its calls a layer (read from the Megatron-Core / Transformer Engine / PyTorch source) times a time
per call that scales with the call's work, at the rate one published Nsight profile measured
(docs/formulas.md#moe.small_kernels). Works on one ParallelPlan and, elementwise, on plan arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llmplan.arith import where
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan

# The measurement every rate below is read from (S1): NVIDIA-NeMo/Megatron-Bridge branch
# zhiyul/determinism-debug-tool at 6d780951a, scripts/performance/perf_leaderboard/analysis_report_det_vs_nondet.md,
# non-deterministic arm, rank 0 of a Nemotron-3 Ultra step on 96 GB200 (TP2 PP3 EP32 ETP1, sequence 8,192, MBS1,
# alltoall dispatcher, router fusion off, forced balanced routing): 4,096 tokens a rank (8,192 / TP2, sequence
# parallel), E = 512 experts, k = 22, so 90,112 received rows a rank and 512 chunks.
S1_TOKENS, S1_EXPERTS, S1_TOPK = 4096, 512, 22

SORT_MAP_S = 280.4e-3 / 1536 / (S1_TOKENS * S1_TOPK * S1_EXPERTS)
"""Seconds per (received row x chunk) of Transformer Engine's _make_chunk_sort_map_kernel: one program per
received row, each loading the chunk sizes and the sorted chunk order (num_splits = E x etp entries) and
summing the sizes before its chunk. S1: 280.4 ms over 1,536 calls (182.6 us a call) at 90,112 rows x 512 chunks:
3.96 ps. Source: NVIDIA/TransformerEngine transformer_engine/common/triton/permutation.py and
pytorch/triton/permutation.py (make_chunk_sort_map: grid = (num_tokens,)) at d0067d0; S1 section 4.2.
Derived: docs/formulas.md#moe.small_kernels"""

ROW_ID_ARGSORT_S = 166.2e-3 / 768 / (S1_TOKENS * S1_EXPERTS * 45)
"""Seconds per (token x padded expert slot x bitonic stage) of Transformer Engine's _row_id_map_pass_3_kernel: one
program per token sorts its row of the row-id map, next_power_of_2(E) = P wide, by a bitonic argsort of
log2(P)(log2(P) + 1)/2 compare-exchange stages. S1: 166.2 ms over 768 calls (216.4 us a call) at 4,096 tokens x
512 slots x 45 stages: 2.29 ps. Source: NVIDIA/TransformerEngine transformer_engine/common/triton/permutation.py at
d0067d0 (_row_id_map_pass_3_kernel, _argsort, _bitonic_merge); S1 section 4.2.
Derived: docs/formulas.md#moe.small_kernels"""

TOPK_PASS_S = (70.5e-3 + 58.3e-3) / 7680 / (S1_TOKENS * S1_EXPERTS)
"""Seconds per (token x expert) of one radix pass of PyTorch's multi-block top-k (mbtopk: computeBlockDigitCounts
and computeBlockwiseWithinKCounts, one of each a pass). S1: 70.5 + 58.3 ms over 7,680 calls of each (9.2 + 7.6 us)
at 4,096 x 512 fp32 scores: 8.0 ps. Source: pytorch/pytorch aten/src/ATen/native/cuda/TensorTopK.cu at 6ed5926
(mbtopk::launch); S1 section 3.3. Derived: docs/formulas.md#moe.small_kernels"""

TOPK_RADIX_PASSES = 4
"""Radix passes of one multi-block top-k over fp32 scores: 8 bits a pass over 32 (mbtopk::launch's loop from
sizeof(T) * 8 - RADIX_BITS down to 0, RADIX_BITS 8). Source: pytorch/pytorch
aten/src/ATen/native/cuda/TensorTopK.cu at 6ed5926. Derived: docs/formulas.md#moe.small_kernels"""

def group_limited_routing(m: ModelSpec) -> bool:
    """Whether Megatron-Core's router takes group_limited_topk: moe_router_group_topk set at all (`if group_topk:`
    in topk_routing_with_score_function), a limit or not. Megatron-Bridge maps the HF config's n_group / topk_group
    onto moe_router_num_groups / moe_router_group_topk (model_bridge.py CONFIG_MAPPING at 067f987), and the
    Nemotron-3 configs give 1 / 1, so their routers run it. Source: NVIDIA/Megatron-LM
    megatron/core/transformer/moe/moe_utils.py at d98e8a6 (_compute_topk).
    Derived: docs/formulas.md#moe.small_kernels"""
    return bool(m.topk_group)


def routing_topk_calls(m: ModelSpec) -> int:
    """torch.topk calls over E scores a token of the unfused routing (topk_routing_with_score_function): one, or
    with group-limited routing (group_limited_routing) two, group_limited_topk's top-(k / topk_group) within each
    of the n_group groups of E / n_group scores and its final top-k over the masked E scores; its group pick over
    the [tokens, n_group] group scores is PyTorch's single-block kernel (n_group < 400) and not priced. Source:
    NVIDIA/Megatron-LM megatron/core/transformer/moe/moe_utils.py at d98e8a6 (group_limited_topk).
    Derived: docs/formulas.md#moe.small_kernels"""
    return 2 if group_limited_routing(m) else 1


def router_topk_calls(m: ModelSpec, plan: ParallelPlan) -> int:
    """torch.topk calls over E scores a token of one router forward with gradients enabled: none with
    moe_router_fusion (Transformer Engine's fused kernels select in registers: fused=config.moe_router_fusion in
    topk_routing_with_score_function and compute_routing_scores_for_aux_loss, moe_utils.py at d98e8a6), else the
    routing's (routing_topk_calls) and, with an auxiliary loss (cost.kernels.aux_loss_on), the aux-loss scores'
    one. Derived: docs/formulas.md#moe.router_fusion"""
    from llmplan.cost.kernels import aux_loss_on
    if plan.moe_router_fusion:
        return 0
    return routing_topk_calls(m) + (1 if aux_loss_on(m) else 0)


def router_tokens(plan: ParallelPlan) -> Any:
    """Tokens one rank routes a micro-batch: s/cp x b, split over TP under sequence parallelism."""
    return plan.seq_len / plan.cp * plan.micro_batch / where(plan.sp, plan.tp, 1)


def multiblock_topk(slices: Any, size: int) -> Any:
    """Whether torch.topk over `slices` rows of `size` runs PyTorch's multi-block kernels (else the single-block
    sbtopk, not priced here). Source: pytorch/pytorch aten/src/ATen/native/cuda/TensorTopK.cu at 6ed5926
    (should_use_multiblock). Derived: docs/formulas.md#moe.small_kernels"""
    bands = ((0, 20, 20000), (21, 40, 10000), (41, 80, 8000), (81, 199, 5000), (200, 799, 3000),
             (800, 4000, 800))
    out: Any = (slices > 4000) & (size >= 400)
    for lo, hi, need in bands:
        out = out | ((slices >= lo) & (slices <= hi) & (size >= need))
    return out


def moe_kernel_calls(m: ModelSpec, plan: ParallelPlan) -> dict[str, Any]:
    """Calls of each small kernel in one MoE layer and micro-batch, forward, selective `moe` recompute's rerun
    (r = 1, else 0) and backward together: the chunk-sort map twice a forward with the alltoall dispatcher's sort
    by local expert (dispatch_postprocess and combine_preprocess; the backward sorts reuse the saved map; dropless
    only: padded to capacity a transpose reorders the rows), the row-id argsort once a forward (the permute in
    dispatch preprocess; its backward reuses the map; not with HybridEP's own permute), and the top-k radix passes
    (TOPK_RADIX_PASSES a call) of the calls PyTorch runs multi-block: the routing's (routing_topk_calls; the group
    scores' over tokens x n_group rows of E / n_group) each forward, and the aux-loss scores' once, in the one
    forward that runs with gradients enabled: tensor_parallel.checkpoint (and Transformer Engine's) runs the
    checkpointed forward under torch.no_grad() and the rerun under torch.enable_grad(), and TopKRouter.routing
    computes the aux loss only where torch.is_grad_enabled(). So (1 + r) x routing + aux calls; none fused.
    Source: NVIDIA/Megatron-LM megatron/core/transformer/moe/token_dispatcher.py, moe_layer.py, router.py and
    tensor_parallel/random.py (CheckpointFunction) at d98e8a6; NVIDIA/TransformerEngine
    transformer_engine/pytorch/permutation.py (_moe_chunk_sort, _moe_permute_mask_map: backward with the forward's
    row_id_map) and pytorch/distributed.py (_CheckpointFunction) at d0067d0.
    Derived: docs/formulas.md#moe.small_kernels"""
    # padded to capacity (drop_and_pad) the received rows are reordered by a transpose copy, with no map
    sorted_rows = ((plan.moe_dispatcher == "alltoall") & (plan.ep > 1) & (m.num_experts / plan.ep > 1)
                   & (plan.moe_capacity_factor is None))
    te_permute = not (plan.moe_dispatcher == "deepep" and plan.moe_flex_backend == "hybridep")
    forwards = 1 + where(plan.recomputes("moe"), 1, 0)
    T, E, groups = router_tokens(plan), m.num_experts, m.n_group or 1
    full = where(multiblock_topk(T, E), 1, 0)  # a top-k over the tokens' E scores
    grouped = where(multiblock_topk(T * groups, E // groups), 1, 0) if group_limited_routing(m) else 0
    calls = router_topk_calls(m, plan)  # 0 with the fused router; the aux loss's is the one beyond the routing's
    routing, aux = (full + grouped, full * (calls - routing_topk_calls(m))) if calls else (0, 0)
    return {"sort_map": where(sorted_rows, 2, 0) * forwards, "row_id_argsort": (1 if te_permute else 0) * forwards,
            "topk_pass": TOPK_RADIX_PASSES * (routing * forwards + aux)}


def moe_kernel_call_seconds(m: ModelSpec, plan: ParallelPlan) -> dict[str, Any]:
    """Seconds of one call of each small kernel: the chunk-sort map over the received rows (tokens x k x etp) and
    E x etp chunks (SORT_MAP_S); the row-id argsort over the permute's tokens and
    P = next_power_of_2 of its map's experts, log2(P)(log2(P) + 1)/2 stages (ROW_ID_ARGSORT_S; with the deepep
    flex dispatcher the received tokens, dispatch_rows a token, and the E / ep local experts); one top-k radix
    pass over tokens x E (TOPK_PASS_S). Rates measured on GB200, used as GPU-independent.
    Derived: docs/formulas.md#moe.small_kernels"""
    from llmplan.cost.comm import dispatch_rows  # comm builds on the compute modules: imported where used
    T, etp = router_tokens(plan), plan.etp_resolved
    rows = T * m.num_experts_per_tok * etp
    flex = plan.moe_dispatcher == "deepep"
    tokens = T * dispatch_rows(m, plan) if flex else T
    experts = m.num_experts / plan.ep if flex else m.num_experts
    pow2 = where(experts > 1, 2.0 ** _ceil_log2(experts), 1.0)
    stages = _ceil_log2(experts) * (_ceil_log2(experts) + 1) / 2
    return {"sort_map": SORT_MAP_S * rows * m.num_experts * etp,
            "row_id_argsort": ROW_ID_ARGSORT_S * tokens * pow2 * stages,
            "topk_pass": TOPK_PASS_S * T * m.num_experts}


def _ceil_log2(x: Any) -> Any:
    """ceil(log2(x)) for x >= 1, elementwise."""
    out = np.ceil(np.log2(np.maximum(np.asarray(x, dtype=float), 1.0)))
    return float(out) if out.ndim == 0 else out


def moe_kernel_seconds(m: ModelSpec, plan: ParallelPlan, kernels: tuple[str, ...] | None = None) -> Any:
    """Seconds of one MoE layer's small per-call kernels (moe_kernel_calls x moe_kernel_call_seconds: forward,
    `moe` rerun and backward), one micro-batch, in the forward-equivalent units of layer_seconds' memory-bound part
    (the stage charges three times it): over 3. `kernels` picks some of them (expert_node_seconds takes the sort
    map, which runs in the experts' node). Derived: docs/formulas.md#moe.small_kernels"""
    if not m.is_moe:
        return 0.0
    calls, each = moe_kernel_calls(m, plan), moe_kernel_call_seconds(m, plan)
    return sum(calls[k] * each[k] for k in (kernels or tuple(calls))) / 3
