"""Training model states per GPU: weights, gradients and optimizer states under ZeRO, and the low-precision
weight copies a recipe caches across micro-batches.

All functions are pure and return bytes. They work on one ParallelPlan (Python numbers) and, unchanged, on
search.grid.PlanArrays (numpy arrays of many plans): see llmplan/arith.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from llmplan.arith import maximum, minimum, where
from llmplan.cost.breakdown import Breakdown
from llmplan.cost.compressed import hc_head_params
from llmplan.cost.memo import memoized
from llmplan.cost.params import (RankParams, mtp_projection_params, nonmatrix_layer_params, norm_params, param_counts,
                                 rank_params, router_params, stage_end_params, stepped_rank_params, vocab_shard_params,
                                 input_embedding_params)
from llmplan.cost.quantize import torchao_float8, torchao_fp8_params
from llmplan.cost.stages import mtp_weight_sets, stage_weight_layers
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.quantities import megatron_fsdp_acts
from llmplan.specs.schedule import schedule_of

ADAM_STATE_BYTES = 12.0  # fp32 master weights + first + second moments


@dataclass(frozen=True)
class ModelStateBytes(Breakdown):
    """Weights, gradients and optimizer states of one rank; parts sum to total."""

    PARTS: ClassVar[tuple[str, ...]] = ("weights", "gradients", "optimizer")
    weights: Any
    gradients: Any
    optimizer: Any


def model_state_bytes(n_params: Any, shard: Any, zero: Any, weight_bytes: Any, grad_bytes: Any,
                      optim_bytes: Any = ADAM_STATE_BYTES, optim_shard: Any = None) -> ModelStateBytes:
    """Mixed-precision Adam model states of n_params replicated parameters under ZeRO over `shard` ranks.

    Source: Rajbhandari et al. 2020 (ZeRO), Section 5: 2Ψ+2Ψ+KΨ with K=12; stage 1 shards K, stage 2 also the
    gradients, stage 3 also the parameters. Megatron's distributed optimizer is stage 1 with fp32 gradients
    (6 + 12/d bytes/param, Megatron-LM docs). K is ParallelPlan.optimizer_bytes: master + two moments in their
    dtypes (8 with bf16 moments, DeepSeek-V3 report §3.3.3). Hybrid sharding shards the optimizer over
    `optim_shard` ranks (default `shard`; Megatron-FSDP's outer optim sharding: every replica's ranks).
    Derived: docs/formulas.md#mem.model_states, docs/formulas.md#mem.hsdp"""
    o = shard if optim_shard is None else optim_shard
    return ModelStateBytes(
        weights=n_params * weight_bytes / where(zero >= 3, shard, 1),
        gradients=n_params * grad_bytes / where(zero >= 2, shard, 1),
        optimizer=n_params * optim_bytes / where(zero >= 1, o, 1),
    )


def gradient_params(plan: ParallelPlan, rp: RankParams) -> Any:
    """Parameters whose gradients a rank holding `rp` keeps: ZeRO-2/3 shard them (the dense over zero_shard, the
    routed experts over expert_shard, as model_state_bytes does), but under a pipeline they stay whole until the last
    micro-batch (PyTorch pipelining with FSDP2). Derived: docs/formulas.md#mem.other"""
    sharded = plan.sharded_per_microbatch
    return rp.dense / where(sharded, plan.zero_shard, 1) + rp.expert / where(sharded, plan.expert_shard, 1)


@dataclass(frozen=True)
class OptimizerParts(Breakdown):
    """The optimizer states of one rank: Adam's master weights and its two moments; parts sum to total."""

    PARTS: ClassVar[tuple[str, ...]] = ("master", "moments")
    master: Any
    """Master weights: fp32 (4 B/param), the 16-bit remainder beside bf16 weights (param_remainders, 2 B),
    fp16 / bf16, or none; 0 where FSDP's fp32 parameter shard is the master (counted in the weights)."""
    moments: Any


def fp32_shards_are_master(plan: ParallelPlan) -> Any:
    """Whether FSDP's fp32 parameter shard is the optimizer's master copy (ZeRO-3 with fp32_param_shards in mixed
    precision): no compute-dtype shard beside it and no separate master. Elementwise over the search's arrays.
    Source: PyTorch torch.distributed.fsdp.MixedPrecisionPolicy docstring. Derived: docs/formulas.md#mem.model_states"""
    return (plan.zero >= 3) & (plan.fp32_param_shards and plan.dtype != "fp32")


def optimizer_parts(plan: ParallelPlan, optimizer: Any, muon_saving: Any = 0.0) -> OptimizerParts:
    """Split a rank's optimizer bytes (TrainingMemory.optimizer) into master weights and moments, in the ratio
    of their bytes per parameter: both are sharded alike (ZeRO stage >= 1 over the same ranks). Under Muon the
    Adam-priced total (optimizer + muon_saving, TrainingMemory.muon_saving) sets the master, the moments are the rest
    (Muon's one momentum, Adam's two). Derived: docs/formulas.md#mem.param_remainders, #optim.muon_memory"""
    fp32_shards = fp32_shards_are_master(plan)
    moments_b = plan.optimizer_bytes - plan.master_bytes
    master_b = where(fp32_shards, 0.0, plan.master_bytes)
    share = where(master_b + moments_b > 0, master_b / maximum(master_b + moments_b, 1e-30), 0.0)
    master = (optimizer + muon_saving) * share
    return OptimizerParts(master=master, moments=optimizer - master)


def optimizer_share(plan: ParallelPlan, rp: RankParams) -> Any:
    """Parameters of `rp` whose optimizer states and step one rank holds and runs: all of them without ZeRO, else
    the dense ones over optimizer_shard and the routed experts over expert_optimizer_shard (their expert
    data-parallel group). Derived: docs/formulas.md#mem.model_states"""
    return where(plan.zero >= 1, rp.dense / plan.optimizer_shard + rp.expert / plan.expert_optimizer_shard,
                 rp.dense + rp.expert)


REDUCE_BUCKET_ELEMENTS = 5e8
"""DeepSpeed's reduce_bucket_size default (elements): the ZeRO-1/2 optimizer flattens at most this many
gradient elements into one tensor for each DP reduction (deepspeed/runtime/zero/constants.py,
ZERO_OPTIMIZATION_REDUCE_BUCKET_SIZE_DEFAULT; stage_1_and_2.py allreduce_bucket: self.flatten(bucket))."""


@dataclass(frozen=True)
class OptimizerCopies(Breakdown):
    """Transient gradient copies of DeepSpeed's ZeRO-1 optimizer after the backward; parts sum to total."""

    PARTS: ClassVar[tuple[str, ...]] = ("bucket", "flat", "cast", "reduce_cast", "sum_scratch")
    bucket: Any
    """The flattened reduction bucket (min(reduce_bucket_size, params) x grad bytes) the all-reduce runs on."""
    flat: Any
    """The step's flat 16-bit copy of the rank's gradient partition (grad bytes x params / shard)."""
    cast: Any
    """That copy cast to the master dtype (master bytes x params / shard) for the fp32 master's update."""
    reduce_cast: Any = 0.0
    """The bf16 copy of the fp32 gradients the all-reduce sends under grad_reduce_dtype bf16 (reduce bytes x
    params, unsharded: reduce_cast_bytes)."""
    sum_scratch: Any = 0.0
    """Megatron-Core's all-to-all outputs and fp32 sums live at once under grad_reduce_fp32_sum
    (fp32_sum_scratch_bytes)."""


def optimizer_copies(plan: ParallelPlan, n_params: Any, shard: Any, stage: Any = 0) -> OptimizerCopies:
    """The gradient copies DeepSpeed's ZeRO-1 (stage_1_and_2.py, grad_reduce all-reduce) makes after the
    backward of a rank holding n_params replicated over `shard` ranks: each reduction bucket flattened
    (allreduce_bucket), then at the step its partition's 16-bit gradients flattened and cast to the fp32
    master's dtype (step: self.flatten(self.averaged_gradients[i]).to(fp32)); none where the gradients are
    already in the master's dtype (BF16_Optimizer's fp32 gradients) or reduce-scattered (Megatron).
    Under Muon (Megatron's layer-wise optimizer, which all-reduces the DDP buffer in place) only the cast remains:
    Float16OptimizerWithFloat16Params casts each owned parameter's main_grad to fp32 (main_grad.float()).
    Source: microsoft/DeepSpeed deepspeed/runtime/zero/stage_1_and_2.py at 2151c787a (2022-02-18); NVIDIA/Megatron-LM
    at d0b3b7754, megatron/core/optimizer/optimizer.py (_copy_model_grads_to_main_grads).
    Derived: docs/formulas.md#mem.optimizer_copies"""
    on = (plan.grad_reduce == "all-reduce") & (plan.zero >= 1) & (plan.grad_bytes < plan.master_bytes)
    deepspeed = on & (plan.optimizer != "muon")
    part = n_params / shard
    return OptimizerCopies(bucket=where(deepspeed, minimum(REDUCE_BUCKET_ELEMENTS, n_params) * plan.grad_bytes, 0.0),
                           flat=where(deepspeed, part * plan.grad_bytes, 0.0),
                           cast=where(on, part * plan.master_bytes, 0.0),
                           reduce_cast=reduce_cast_bytes(plan, n_params),
                           sum_scratch=fp32_sum_scratch_bytes(plan, n_params, shard, stage))


def bf16_reduction(plan: Any) -> Any:
    """Whether a plan's fp32 gradients are cast to bf16 for the data-parallel all-reduce (grad_reduce_dtype bf16
    where it acts: DeepSpeed's BF16_Optimizer, bf16_optimizer; check_plan rule grad_reduce_dtype_bf16_optimizer).
    Derived: docs/formulas.md#mem.reduce_cast"""
    return bf16_optimizer(plan) & (plan.grad_reduce_dtype == "bf16")


def reduce_cast_bytes(plan: Any, n_params: Any) -> Any:
    """Bytes of the bf16 copy DeepSpeed's engine makes of a rank's fp32 gradients for their all-reduce under
    grad_reduce_dtype bf16: the pipeline engine's _bf16_reduce_grads hands the BF16_Optimizer's flat fp32 groups
    to buffered_allreduce_fallback; allreduce_no_retain sends each group (past 500M elements) alone to
    allreduce_bucket, whose flatten of one tensor is a view and whose `tensor.to(communication_data_type)` is a
    new bf16 tensor of the whole group, copied back into the fp32 group after the all-reduce and then dropped:
    2 B a parameter of the rank (the weight-decay group, nearly all of them), beside the held states for the
    group's all-reduce. 0 elsewhere. Source: deepspeedai/DeepSpeed at 56c522386, deepspeed/runtime/engine.py
    (communication_data_type, allreduce_bucket, allreduce_no_retain), pipe/engine.py (_bf16_reduce_grads),
    bf16_optimizer.py (get_grads_for_reduction). Derived: docs/formulas.md#mem.reduce_cast"""
    return where(bf16_reduction(plan), plan.reduce_bytes * n_params, 0.0)


def fp32_sum_reduction(plan: Any) -> Any:
    """Whether a plan's gradient reduce-scatter sums in fp32 by an all-to-all (grad_reduce_fp32_sum where it
    acts: Megatron-Core's distributed optimizer, zero 1 with grad_reduce reduce-scatter, 2-byte gradients, no
    Megatron-FSDP, one optimizer instance and not Muon; check_plan rule grad_reduce_fp32_sum_rs). Source:
    NVIDIA/Megatron-LM d98e8a64dd megatron/core/distributed/param_and_grad_buffer.py (the fp32-accumulation
    reduce-scatter only under use_distributed_optimizer; asserted off with num_distributed_optimizer_instances > 1),
    megatron/training/arguments.py (turned off under --accumulate-allreduce-grads-in-fp32; use_distributed_optimizer
    set False for Muon, the layer-wise optimizer). Derived: docs/formulas.md#comm.fp32_sum"""
    return (plan.grad_reduce_fp32_sum & grad_shards_reduce_scattered(plan) & (plan.grad_bytes == 2.0)
            & np.logical_not(megatron_fsdp_acts(plan)) & (plan.dp_replicate == 1) & (plan.optimizer != "muon"))


def grad_prescaled(plan: Any) -> Any:
    """Whether Megatron-LM's DDP multiplies each bucket by 1/(dp x cp) and reduces with a sum: grad_prescale, or
    grad_reduce_fp32_sum where it acts, since reduce_scatter_with_fp32_accumulation asserts a SUM op and
    average_in_collective would make it AVG. Source: NVIDIA/Megatron-LM d98e8a64dd megatron/core/distributed/
    reduce_scatter_with_fp32_accumulation.py (assert op == ReduceOp.SUM), param_and_grad_buffer.py
    (start_grad_sync: reduce_op AVG under average_in_collective). Derived: docs/formulas.md#step.grad_buffer"""
    return plan.grad_prescale | fp32_sum_reduction(plan)


def fp32_sum_live_params(plan: Any, n_params: Any, stage: Any = 0) -> Any:
    """Parameters of one bucket list (dense or expert) of a rank of pipeline stage `stage` whose
    reduce_scatter_with_fp32_accumulation scratch is live at once at the step's finish_grad_sync (Megatron-Core's
    DDP, one per model chunk). With overlap_grad_reduce each bucket group drains only its predecessor in its own
    list, and the list's last group waits for finish_grad_sync: on the first stage the first model chunk's last
    bucket (exposure.bucket_params) beside the vpp - 1 later chunks, each one bucket (disable_bucketing for
    model_chunk_idx > 0); past stage 0 (bucket_size None, exposure.later_stage_unbucketed) all vpp chunks whole.
    Without the overlap each call is dispatched and waited in turn: one whole chunk (bucket_size None).
    Source: NVIDIA/Megatron-LM d98e8a64dd megatron/core/distributed/distributed_data_parallel.py (__init__:
    previous_grad_reduce_bucket_group per list; bucket_size None for disable_bucketing or pp_rank > 0),
    megatron/training/models/dist_utils.py (disable_bucketing = model_chunk_idx > 0), finalize_model_grads.py
    (finish_grad_sync of every chunk). Derived: docs/formulas.md#mem.fp32_sum"""
    from llmplan.cost.exposure import bucket_params, later_stage_unbucketed  # exposure imports memory, then this
    chunk = n_params / plan.vpp
    bucketed = plan.overlap_grad_reduce & np.logical_not(later_stage_unbucketed(plan, stage))
    first = where(bucketed, minimum(bucket_params(plan), chunk), chunk)
    return where(plan.overlap_grad_reduce, (plan.vpp - 1) * chunk + first, chunk)


FP32_SUM_BYTES = 4.0
"""Bytes of an element of the fp32 sum Megatron-Core's reduce_scatter_with_fp32_accumulation accumulates
(`torch.sum(..., dtype=torch.float32)`)."""


def fp32_sum_scratch_bytes(plan: Any, n_params: Any, shard: Any, stage: Any = 0) -> Any:
    """Bytes Megatron-Core's reduce_scatter_with_fp32_accumulation holds at once under grad_reduce_fp32_sum, for
    one bucket list of a rank's `n_params` reduce-scattered over `shard` ranks: for each call live together
    (fp32_sum_live_params) the all-to-all's output, `torch.empty_like(input_tensor)` of the whole bucket in the
    gradient dtype, and the fp32 sum of the rank's 1/shard of it. 0 where it does not act.
    Source: NVIDIA/Megatron-LM d98e8a64dd megatron/core/distributed/reduce_scatter_with_fp32_accumulation.py,
    param_and_grad_buffer.py (start_grad_sync: previous_grad_reduce_bucket_group).
    Derived: docs/formulas.md#mem.fp32_sum"""
    live = fp32_sum_live_params(plan, n_params, stage)
    return where(fp32_sum_reduction(plan) & (n_params > 0),
                 live * plan.grad_bytes + live / maximum(shard, 1) * FP32_SUM_BYTES, 0.0)


def kept_grad_shard_bytes(plan: ParallelPlan, rp: RankParams, emb32: Any = 0.0) -> Any:
    """Bytes of the gradient shards a rank holding `rp` keeps from the end of the backward to the next step's
    zero_grad under kept_grad_shards (Apex DistributedFusedAdam): each bucket's reduce-scatter output, a new tensor
    of 1/shards of the bucket in the gradient dtype, so grad bytes x the dense parameters / optimizer_shard (and the
    experts' over expert_optimizer_shard); none over one rank, where the shard is the bucket itself, nor where the
    switch does not act (zero 1 with grad_reduce reduce-scatter: check_plan rule kept_grad_shards_zero). `emb32`:
    the bytes fp32_embedding_grads adds to the whole gradients (fp32_embedding_grad_bytes), whose buckets' shards
    are kept in fp32 too, 1/optimizer_shard of it more.
    Source: NVIDIA/apex apex/contrib/optimizers/distributed_fused_adam.py @f3f049246e5bdf6fdddf251ebe6b65dd4ca1ee29
    (_start_bucket_grad_sync: sync_grads_shard = torch.empty; _finish_bucket_grad_sync: grads_shard; zero_grad:
    _grads_buckets.clear()). Derived: docs/formulas.md#mem.kept_grad_shards"""
    od, oe, g = plan.optimizer_shard, plan.expert_optimizer_shard, plan.grad_bytes
    shards = where(od > 1, (rp.dense * g + emb32) / od, 0.0) + where(oe > 1, rp.expert * g / oe, 0.0)
    return where(plan.kept_grad_shards & grad_shards_reduce_scattered(plan), shards, 0.0)


def grad_shards_reduce_scattered(plan: Any) -> Any:
    """Whether a distributed optimizer reduce-scatters the gradients into shards it steps beside a whole gradient
    buffer (zero 1 with grad_reduce reduce-scatter): where kept_grad_shards acts, the one condition
    kept_grad_shard_bytes prices and check_plan's rule kept_grad_shards_zero holds. Under zero 2 the priced
    gradients are that shard alone (Apex drops the bucket, grads_bucket = None, unless a contiguous buffer keeps
    it: the zero 1 layout), so the switch adds nothing there. Source: NVIDIA/apex
    apex/contrib/optimizers/distributed_fused_adam.py @f3f049246e5bdf6fdddf251ebe6b65dd4ca1ee29
    (_finish_bucket_grad_sync). Derived: docs/formulas.md#mem.kept_grad_shards"""
    return (plan.zero == 1) & (plan.grad_reduce == "reduce-scatter")


def fp32_embedding_grads_act(plan: Any) -> Any:
    """Whether fp32_embedding_grads changes what a plan holds: Apex's layout (zero 1 with grad_reduce
    reduce-scatter, grad_shards_reduce_scattered) with 2-byte gradients (fp32 ones are fp32 already), under a
    schedule that holds one stage a rank (NeMo 1.x, the only stack with these buckets, runs Megatron-Core's
    schedules, never DualPipe's paired stages). The one condition fp32_embedding_grad_bytes prices and
    check_plan's rule fp32_embedding_grads_zero holds. Derived: docs/formulas.md#mem.fp32_embedding_grads"""
    return grad_shards_reduce_scattered(plan) & (plan.grad_bytes < 4.0) & (schedule_of(plan).param_copies == 1)


def fp32_embedding_grad_bytes(m: ModelSpec, plan: ParallelPlan, stage: Any) -> Any:
    """Bytes fp32_embedding_grads adds to the gradients of one rank of `stage`: (4 - grad bytes) x the word
    embedding's vocabulary shard (vocab_shard_params) and the learned position table on the first stage, and the
    tied output layer's copy of the word embedding on the last stage of a pipeline (at pp 1 the same tensor); 0
    where the switch does not act (fp32_embedding_grads_act).
    Source: NVIDIA/NeMo @579983fbfc85533df0fb53b30b5e9fca1a1159c9 (r2.0.0rc1, NeMo 24.07),
    nemo/collections/nlp/models/language_modeling/megatron_gpt_model.py configure_optimizers
    (with_fp32_embedding_grads, default True: _with_fp32_optimizer on the first stage's word and position
    embeddings and the last stage's shared_embedding_or_output_weight), nemo/core/optim/distributed_adam.py
    init_params_bucket (those parameters bucketed with grad_sync_dtype torch.float32); NVIDIA/apex
    @810ffae374 apex/contrib/optimizers/distributed_fused_adam.py _init_grad_buffer (a zeroed buffer per bucket
    dtypes, in its grad_sync_dtype). Derived: docs/formulas.md#mem.fp32_embedding_grads"""
    vocab = vocab_shard_params(m, plan.tp)
    positions = m.max_position_embeddings * m.hidden_size if m.learned_position_embeddings else 0
    first = where(stage == 0, input_embedding_params(m, plan) + positions, 0.0)
    tied_copy = where((stage == plan.pp - 1) & (plan.pp > 1) & bool(m.tie_word_embeddings), vocab, 0.0)
    on = plan.fp32_embedding_grads & fp32_embedding_grads_act(plan)
    return where(on, (4.0 - plan.grad_bytes) * (first + tied_copy), 0.0)


def churned_gradients(plan: ParallelPlan) -> Any:
    """Whether the priced gradients are freed and allocated again every step, so inside the fragmentation
    allowance's churned bytes (docs/formulas.md#mem.fragmentation): DeepSpeed's ZeRO-1/2 optimizer
    (stage_1_and_2.py, the grad_reduce all-reduce path with 16-bit gradients under a wider master, as
    optimizer_copies) frees every param.grad at its step (free_grad_in_param_list of the partition's and the
    other parameters) and autograd allocates them again in the next backward. Elsewhere the gradients live in
    buffers allocated once and held all run: Megatron-Core's contiguous grad buffer (param_and_grad_buffer.py),
    Apex DistributedFusedAdam's buckets, DeepSpeed BF16_Optimizer's fp32 flat gradients (its master dtype).
    Also churned: ZeRO-2/3 under a pipeline without Megatron-FSDP, which only PyTorch pipelining with FSDP2
    runs (DeepSpeed's export refuses it, check_plan keeps Megatron-FSDP to pp 1): the stage's unsharded
    gradients, held whole to the last micro-batch (gradient_params), are freed after each reduce-scatter and
    allocated again by the next step's backward (FSDP2's post-backward foreach_reduce).
    Source: microsoft/DeepSpeed deepspeed/runtime/zero/stage_1_and_2.py at 2151c787a (step:
    free_grad_in_param_list); NVIDIA/Megatron-LM megatron/core/distributed/param_and_grad_buffer.py;
    pytorch/pytorch torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py (foreach_reduce)."""
    deepspeed = (plan.grad_reduce == "all-reduce") & (plan.zero >= 1) & (plan.grad_bytes < plan.master_bytes) \
        & (plan.optimizer != "muon")
    return deepspeed | ((plan.zero >= 2) & (plan.pp > 1) & np.logical_not(megatron_fsdp_acts(plan)))


def bf16_optimizer(plan: ParallelPlan) -> Any:
    """Whether a plan runs DeepSpeed's BF16_Optimizer: bf16 weights with fp32 gradients at ZeRO 1 (its own
    partition of the fp32 master and moments), each micro-batch's gradient cast and added into the fp32 flat
    gradient (grad_accumulation cast-add) and that gradient all-reduced whole (grad_reduce all-reduce), as the
    DeepSpeed export runs such a plan (export.deepspeed.accumulation) and BLOOM trained; under Adam (AdamW) only:
    BF16_Optimizer wraps a DeepSpeed/torch Adam-family optimizer, and a Muon plan is Megatron's (its layer-wise
    optimizer keeps no bf16 param.grad beside an fp32 flat gradient).
    Source: deepspeedai/DeepSpeed deepspeed/runtime/bf16_optimizer.py at 56c522386 (bf16_groups_flat,
    fp32_groups_gradients_flat, update_hp_grads)."""
    return (plan.grad_accumulation == "cast-add") & (plan.zero == 1) & (plan.grad_reduce == "all-reduce") \
        & (plan.dtype == "bf16") & (plan.grad_bytes == 4.0) & (plan.optimizer == "adam")


def lp_grad_bytes(plan: ParallelPlan, rp: RankParams) -> Any:
    """Bytes of the bf16 gradients (param.grad, 2 B a parameter of the rank, unsharded) that DeepSpeed's
    BF16_Optimizer keeps beside its fp32 flat gradient: autograd writes each micro-batch's gradient into
    param.grad, update_hp_grads(clear_lp_grads=False) casts and adds it into the fp32 buffer and leaves it, and only
    the next backward's clear_lp_grads drops it (2022: param.grad = None; later releases zero it in place, a
    buffer held all run), so through the forwards and the backward's peak the rank holds both. 0 elsewhere.
    Source: deepspeedai/DeepSpeed deepspeed/runtime/pipe/engine.py _exec_backward_pass and bf16_optimizer.py
    (clear_lp_grads, update_hp_grads) at 56c522386 (2022-04-19, bf16 + pipeline) and edaa72212 (2026-08-22).
    Derived: docs/formulas.md#mem.bf16_optimizer_grads"""
    return where(bf16_optimizer(plan), 2.0 * rp.total, 0.0)


def after_backward_peak(plan: ParallelPlan, rp: RankParams, states: Any, gradients: Any,
                        emb32: Any = 0.0, stage: Any = 0) -> tuple[Any, Any]:
    """(bytes of the optimizer_copies, the allocated peak after the backward) of a rank holding `rp` whose
    model states (weights, gradients, optimizer, weight caches) take `states` bytes, `gradients` of them: the
    larger of the reduction's (the states beside each bucket) and the step's (the partition's gradients
    beside its flat copy and its cast, the rest of the gradients freed), each beside the gradient shards the
    optimizer keeps to the next zero_grad (kept_grad_shard_bytes; `emb32`: the embeddings' fp32 gradient bytes
    beyond 2-byte ones, fp32_embedding_grad_bytes; `stage`: the rank's pipeline stage, for the fp32-sum scratch).
    Derived: docs/formulas.md#mem.optimizer_copies, docs/formulas.md#mem.kept_grad_shards,
    docs/formulas.md#mem.fp32_sum"""
    od, oe = plan.optimizer_shard, plan.expert_optimizer_shard  # the optimizer's partitions
    cd, ce = optimizer_copies(plan, rp.dense, od, stage), optimizer_copies(plan, rp.expert, oe, stage)
    grad_b = plan.grad_bytes
    # the bf16 copy of the group under all-reduce (reduce_cast_bytes), one group at a time
    # and Megatron-Core's fp32-sum scratch (fp32_sum_scratch_bytes): with the overlap the dense and expert lists
    # each hold theirs to finish_grad_sync, together; without it one call at a time
    sums = where(plan.overlap_grad_reduce, cd.sum_scratch + ce.sum_scratch,
                 maximum(cd.sum_scratch, ce.sum_scratch))
    reduce_peak = states + cd.bucket + ce.bucket + maximum(cd.reduce_cast, ce.reduce_cast) + sums
    step_peak = states - gradients + rp.dense * grad_b / od + rp.expert * grad_b / oe \
        + cd.flat + cd.cast + ce.flat + ce.cast
    return cd.total + ce.total, maximum(reduce_peak, step_peak) + kept_grad_shard_bytes(plan, rp, emb32)


def fresh_grad_bytes(m: ModelSpec, plan: ParallelPlan, stage: Any, working: Any, per_microbatch: Any) -> Any:
    """Bytes by which one rank's backward peak exceeds the priced activations where each micro-batch's weight
    gradient is a fresh tensor added into the accumulated one (grad_accumulation add: autograd's AccumulateGrad
    adds the new gradient into an existing param.grad in place and frees it; Megatron-LM 2021's DDP hook adds
    param.grad into main_grad and frees it): the largest such tensor at its moment, in the compute dtype.
    `working`: the recompute working set (ActivationBytes.recompute_working); `per_microbatch`: one micro-batch's
    layer activations on this stage. Moments: a layer's first weight gradient (fc2, f·h/t) beside the whole
    recomputed layer; the first stage's word embedding (embedding_dense_backward writes a zeroed V/t x h
    gradient) after the micro-batch's layers and working set are freed; the last stage's output weight before
    any layer is recomputed. Source: pytorch/pytorch torch/csrc/autograd/functions/accumulate_grad.h at
    035290b77d (accumulateGrad: `variable_grad += new_grad`), aten/src/ATen/native/cuda/Embedding.cu
    (embedding_dense_backward_cuda: at::zeros({num_weights, ...})); NVIDIA/Megatron-LM megatron/model/
    distributed.py at 50a4b5fa02 (param_hook). Derived: docs/formulas.md#mem.fresh_grads"""
    if plan.grad_accumulation != "add":
        return 0.0
    new = 4.0 if plan.dtype == "fp32" else 2.0
    layer = new * m.intermediate_size * m.hidden_size / plan.tp
    first = where(stage == 0, new * input_embedding_params(m, plan) - working - per_microbatch, 0.0)
    last = where(stage == plan.pp - 1, new * vocab_shard_params(m, plan.tp) - working, 0.0)
    return maximum(maximum(layer, first), maximum(last, 0.0))


def hp_grad_cast_bytes(m: ModelSpec, plan: ParallelPlan, stage: Any, working: Any, per_microbatch: Any) -> Any:
    """Bytes by which one rank's peak exceeds the priced activations under DeepSpeed's BF16_Optimizer
    (bf16_optimizer): after each micro-batch's backward, update_hp_grads adds every bf16 param.grad into the fp32
    flat gradient through an fp32 copy (`hp_grad.add_(lp.grad.to(fp32))`), one parameter at a time, so the
    largest parameter's 4-byte copy lives once the micro-batch's working set and layer activations are freed.
    It walks every parameter of the rank, so the largest is the biggest layer weight, and on the first stage
    the word embedding (V/t x h) if larger, on the last the tied or untied output weight if larger. The layer
    weight is the MLP's first matrix as the DeepSpeed export's pipelined target (bigscience-workshop/
    Megatron-DeepSpeed ae6277f5 megatron/model/transformer.py ParallelMLP) builds it: dense_h_to_4h of
    2f x h / t with glu_activation (gate and up fused), f x h / t otherwise (the size of fc2); the fused
    query_key_value (3h x h / t) exceeds it only below f = 1.5h gated, 3h not, and is not priced.
    `working`, `per_microbatch` as in fresh_grad_bytes. Source: deepspeedai/DeepSpeed
    deepspeed/runtime/bf16_optimizer.py update_hp_grads at 15293139f (2022-02-28) and 56c522386, called by
    pipe/engine.py _exec_backward_pass after torch.autograd.backward. Derived: docs/formulas.md#mem.hp_grad_cast"""
    layer = (2 if m.gated_mlp else 1) * m.intermediate_size * m.hidden_size / plan.tp
    largest = maximum(layer, where(stage == 0, input_embedding_params(m, plan),
                                   where(stage == plan.pp - 1, vocab_shard_params(m, plan.tp), 0.0)))
    return where(bf16_optimizer(plan), maximum(4.0 * largest - working - per_microbatch, 0.0), 0.0)


LOW_PRECISION_WEIGHT_CACHE = {"tensorwise": 2.0, "rowwise": 0.0, "blockwise": 2.0 + 8 / 128**2,
                              "mxfp8": 2.0 + 2 / 32, "nvfp4": 1.0 + 2 / 16}
"""Bytes per linear-layer weight of the low-precision copies a recipe keeps across the micro-batches of a
step (Transformer Engine casts once, on the first micro-batch): an fp8 copy and its transpose (per-tensor,
blockwise with an fp32 scale per 128x128 block) on a GPU whose FP8 GEMMs take only the TN layout (Hopper),
the copy alone elsewhere (FP8_TRANSPOSE); MXFP8 a rowwise and a columnwise copy with an E8M0 scale per 32
each; NVFP4 two 4-bit copies with an E4M3 scale per 16. torchao's rowwise recipe casts inside each GEMM and
keeps none. Derived: docs/formulas.md#precision (Transformer Engine docs: is_first_microbatch weight
caching, MXFP8 / NVFP4 recipes; torchao float8 README)."""
FP8_TRANSPOSE = {"tensorwise": 1.0, "blockwise": 1.0 + 4 / 128**2}
"""The transposed fp8 copy within LOW_PRECISION_WEIGHT_CACHE, kept only where FP8 GEMMs are TN-only
(GpuSpec.fp8_tn_only). Source: Transformer Engine pytorch/csrc/quantizer.cpp (Float8 quantizers create the
columnwise transpose only when `!nvte_is_non_tn_fp8_gemm_supported()`, false on Blackwell)."""


def low_precision_weight_cache(m: ModelSpec, plan: ParallelPlan, stage: Any, fp8_tn_only: bool = True) -> Any:
    """Bytes of the recipe's cached low-precision weight copies on one rank of `stage` (that stage alone): its
    low-precision weights (low_precision_weights) x LOW_PRECISION_WEIGHT_CACHE (less the transpose where the
    GPU's FP8 GEMMs take any layout), less the model copy itself where it is kept in the recipe's format
    (fp8_params: 1 byte, or NVFP4's 4 bits and scales), and the MXFP8 output layer's weight (head_cast_params)
    x the whole cache, its model copy bf16 under every fp8_params; none under ZeRO-3 / FSDP, which gathers and frees
    each layer, unless a pipeline keeps the stage gathered (mem.other); none for torchao's Float8Linear
    (quantize.torchao_float8), which casts the weight in every forward and again in backward and keeps no copy
    (pytorch/ao@36027d82d1 torchao/float8/float8_linear.py: weight_hp_t = self.weight.t(), a view, saved; with
    FSDP2's fp8 all-gather the gathered fp8 weight is FSDP's unsharded parameter, fsdp_utils.py
    WeightWithDynamicFloat8CastTensor.fsdp_post_all_gather). Derived: docs/formulas.md#precision"""
    if not plan.low_precision or torchao_float8(plan):
        return 0.0
    cache = LOW_PRECISION_WEIGHT_CACHE[plan.recipe] - (0.0 if fp8_tn_only else FP8_TRANSPOSE.get(plan.recipe, 0.0))
    per_weight = cache - (plan.weight_bytes if plan.fp8_params and plan.dtype != "bf16" else 0.0)
    linear = low_precision_weights(m, plan, stage, paired=False)
    head = head_cast_params(m, plan, stage) * max(cache, 0.0)  # a bf16 parameter: the whole cache on top of it
    return where(plan.gathered_per_microbatch, 0.0, linear * max(per_weight, 0.0) + head)


def head_cast_params(m: ModelSpec, plan: ParallelPlan, stage: Any) -> Any:
    """Output-layer parameters of a rank of `stage` (that stage alone) the recipe casts without storing them in
    its format: the head's V·h/t on the last stage under fp8_output_proj (mxfp8). Megatron-Core's
    TELMHeadColumnParallelLinear runs in the fp8 autocast, so TE caches its MXFP8 rowwise and columnwise copies
    (LOW_PRECISION_WEIGHT_CACHE), but gpt_model builds it outside get_fp8_context(..., is_init=True) (which wraps
    only the transformer, MTP and hybrid layers' construction) and TELinear's own init context is
    _get_fp8_model_init_for_quant_params -> nullcontext without a quant_recipe: a bf16 parameter even under
    fp8_params (bf16_kept_params), gathered in bf16, never unstaged. Source: NVIDIA/Megatron-LM d98e8a6
    megatron/core/models/gpt/gpt_model.py (output_layer_cls), extensions/transformer_engine.py (TELinear,
    TELMHeadColumnParallelLinear), transformer/transformer_block.py (_build_layers).
    Derived: docs/formulas.md#compute.fp8_output_proj"""
    if not (plan.fp8_output_proj and plan.dtype == "fp8" and plan.recipe == "mxfp8"):
        return 0.0
    return where(stage == plan.pp - 1, vocab_shard_params(m, plan.tp), 0.0)


def low_precision_weights(m: ModelSpec, plan: ParallelPlan, stage: Any, paired: bool = True) -> Any:
    """Weights of a rank of `stage` (and of its paired stage under DualPipe) that the recipe runs in low precision
    (low_precision_params, dense and expert together). Derived: docs/formulas.md#mem.fp8_param_bf16_parts"""
    return low_precision_params(m, plan, stage, paired).total


def low_precision_params(m: ModelSpec, plan: ParallelPlan, stage: Any, paired: bool = True) -> RankParams:
    """Parameters of a rank of `stage` (and of its paired stage under DualPipe, the rank's stepped_rank_params)
    that are linear-layer weight matrices in the layers the recipe covers: what fp8_params stores in its format
    (gathers in it, MXFP8's unstaging and block amaxes) and what the recipe casts besides the MXFP8 output
    layer (head_cast_params: cast, cached, but a bf16 parameter). The one rule, per
    stage: the stage's parameters less those kept in bf16 (_bf16_kept: embedding, position embedding, final norm,
    output layer, bf16 layers, and every layer's non-matrix parameters: nonmatrix_layer_params); bf16_kept_params
    is its complement. A tied embedding at pp 1 is
    one tensor (separate_output_layer), kept once. Derived: docs/formulas.md#mem.fp8_param_bf16_parts"""
    def compute() -> RankParams:
        dense, expert = 0.0, 0.0
        for s in held_stages(plan, stage, paired):
            rp = rank_params(m, plan, s)
            kept_d, kept_e = _bf16_kept(m, plan, s)
            dense, expert = dense + rp.dense - kept_d, expert + rp.expert - kept_e
        return RankParams(dense=dense, expert=expert)
    return memoized(plan, ("low_precision_params", m, stage, paired), compute)  # read by several memory terms


def held_stages(plan: ParallelPlan, stage: Any, paired: bool) -> tuple[Any, ...]:
    """The stages a rank of `stage` holds: it and, under a schedule with two parameter copies (DualPipe) when
    `paired`, stage pp-1-stage. Derived: docs/formulas.md#mem.inflight"""
    return (stage, plan.pp - 1 - stage) if paired and schedule_of(plan).param_copies == 2 else (stage,)


def bf16_kept_params(m: ModelSpec, plan: ParallelPlan, stage: Any, paired: bool = True) -> RankParams:
    """Parameters of a rank of `stage` (and of its paired stage under DualPipe) that stay in bf16 when the
    plan keeps its weights in the recipe's format (fp8_params): all but the GEMM weights Transformer Engine
    builds quantized inside the transformer layers, i.e. the rank's parameters less low_precision_params (one
    rule; a tied embedding that DualPipe's rank of both ends holds once is kept once). Kept (_bf16_kept, per
    stage): the word (and position) embedding, the final norm and
    the output layer (Megatron-Core's VocabParallelEmbedding and ColumnParallelLinear; under fp8_output_proj a
    TE Linear, but built outside the quantized-init context: head_cast_params), the
    layers the recipe keeps in bf16 (bf16_layer_counts: built outside the quantized-init context), and in the
    quantized layers every parameter that is no TE GEMM weight (nonmatrix_layer_params: norms, biases, q/k and
    latent norms, MoE routers, the recurrent mixers' convolution, A, D, dt-bias and gated norm; TE quantizes only
    parameters with an fp8_meta_index, the GEMM weights; TopKRouter's weight is a plain parameter). MTP
    projections are built quantized.
    Source: NVIDIA/Megatron-LM at 2a75ac12c, megatron/core/fp8_utils.py (get_fp8_context(is_init=True):
    fp8_model_init unless is_first_last_bf16_layer), transformer/transformer_block.py (_build_layers under
    that context), models/gpt/gpt_model.py, transformer/moe/router.py; NVIDIA/TransformerEngine at d0067d0da6
    transformer_engine/pytorch/module/base.py (reset_parameters: primary_weights_in_fp8 and fp8_meta_index),
    module/linear.py and module/grouped_linear.py (weights registered with an fp8_meta_index, biases without).
    Derived: docs/formulas.md#mem.fp8_param_bf16_parts"""
    rp = stepped_rank_params(m, plan, stage) if paired else rank_params(m, plan, stage)
    low = low_precision_params(m, plan, stage, paired)
    return RankParams(dense=rp.dense - low.dense, expert=rp.expert - low.expert)


def bf16_gathered_params(m: ModelSpec, plan: ParallelPlan, stage: Any) -> RankParams:
    """Parameters of a rank of `stage` (and of its paired stage under DualPipe) that FSDP / ZeRO gathers at 2 bytes
    under fp8_params: the bf16-kept ones (bf16_kept_params) and, on torchao (torchao_float8), the routed experts
    whole. torchao's float8 all-gather is Float8Linear's, and torchtitan's experts are no nn.Linear: its float8
    grouped-GEMM weights cast their fp32 shard to the mixed-precision param dtype before the gather, and
    unconverted experts are plain parameters FSDP2 casts alike. Source: pytorch/ao@36027d82d1
    torchao/prototype/moe_training/tensor.py (TrainingWeightWrapperBaseTensor.fsdp_pre_all_gather:
    self._data.to(mp_policy.param_dtype); ScaledGroupedMMTensor before b8708a2dd); pytorch/pytorch@010ae4a
    torch/distributed/fsdp/_fully_shard/_fsdp_param.py (all_gather_inputs: _to_dtype_if_needed(..., param_dtype)).
    Derived: docs/formulas.md#comm.torchao_fp8_gather"""
    kept = bf16_kept_params(m, plan, stage)
    experts = where(torchao_fp8_params(plan), low_precision_params(m, plan, stage).expert, 0.0)
    return RankParams(dense=kept.dense, expert=kept.expert + experts)


def _bf16_kept(m: ModelSpec, plan: ParallelPlan, stage: Any) -> tuple[Any, Any]:
    """(dense, expert) parameters one rank of `stage` alone keeps in bf16 under fp8_params (bf16_kept_params); the
    complement of low_precision_params. The output layer among them under fp8_output_proj too: gpt_model builds
    it outside fp8_model_init (head_cast_params)."""
    rp = rank_params(m, plan, stage)
    frac = plan.low_precision_layer_fraction(m.num_hidden_layers)
    quantized_mtp = mtp_weight_sets(m) * (mtp_projection_params(m, plan.tp) - 2 * norm_params(m))
    # the output layer stays bf16 even under fp8_output_proj (built outside fp8_model_init: head_cast_params)
    ends = stage_end_params(m, plan, stage) - where(stage == plan.pp - 1, quantized_mtp, 0.0)
    n_dense, n_moe = stage_weight_layers(m, plan, stage)
    dense_l, moe_l, expert_l = memoized(plan, ("nonmatrix_layer_params", m), lambda: nonmatrix_layer_params(
        m, plan.tp, plan.ep, plan.etp_resolved))
    return (_kept(ends, rp.dense - ends, n_dense * dense_l + n_moe * moe_l, frac),
            _kept(0.0, rp.expert, n_moe * expert_l, frac))


def _kept(ends: Any, layers: Any, small: Any, frac: Any) -> Any:
    """The bf16-kept share of `ends` (embedding, final norm, output layer) and `layers` (the transformer
    layers' parameters, `small` of them no linear-layer weight: nonmatrix_layer_params) when `frac` of the layers
    are quantized: the ends, the bf16 layers whole, the quantized layers' non-matrix parameters.
    Derived: docs/formulas.md#mem.fp8_param_bf16_parts"""
    return ends + (1.0 - frac) * maximum(layers, 0.0) + frac * small


def stored_weight_bytes(plan: ParallelPlan) -> Any:
    """Bytes per weight of the rank's stored model copy (its shard under ZeRO-3): weight_bytes, but 2 (the bf16
    weight, as without fp8_params) where fp8_params is torchao's FSDP2 float8 all-gather (torchao_float8; check_plan's
    torchao_fp8_params_gather allows it nowhere else): torchao keeps the original-precision tensor and casts it
    to fp8 only to gather it. Source: pytorch/ao@36027d82d1 torchao/float8/fsdp_utils.py
    (WeightWithDynamicFloat8CastTensor wraps the original tensor; fsdp_pre_all_gather casts it).
    Derived: docs/formulas.md#mem.torchao_fp8_shard"""
    return 2.0 if torchao_fp8_params(plan) else plan.weight_bytes


def kept_copy_extra_bytes(plan: ParallelPlan) -> Any:
    """Bytes a stored copy of a bf16-kept parameter (bf16_kept_params: the rank's weights, a checkpoint) holds
    beyond the low-precision weight bytes under fp8_params (bf16_parts_extra_bytes); none where FSDP's fp32
    shards are the only copy (fp32_shards_are_master). Derived: docs/formulas.md#mem.fp8_param_bf16_parts"""
    return where(fp32_shards_are_master(plan), 0.0, stored_kept_extra_bytes(plan))


def stored_kept_extra_bytes(plan: ParallelPlan) -> Any:
    """Bytes a bf16-kept parameter's stored copy (the rank's model copy, the copy the optimizer writes, a
    checkpoint's) holds beyond stored_weight_bytes: bf16_parts_extra_bytes, none under torchao's fp8_params
    (every stored weight bf16 already). Derived: docs/formulas.md#mem.torchao_fp8_shard"""
    return 0.0 if torchao_fp8_params(plan) else bf16_parts_extra_bytes(plan)


def model_bf16_kept_params(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Parameters of the whole model (each once: param_counts) that stay in bf16 under fp8_params, by the rule of
    bf16_kept_params: the embeddings, the output layer, the final norm and hyper-connection head, the bf16 layers
    whole, the quantized layers' non-matrix parameters (nonmatrix_layer_params of whole layers).
    Derived: docs/formulas.md#mem.fp8_param_bf16_parts"""
    c = param_counts(m)
    ends = c.embedding + c.output + norm_params(m) + hc_head_params(m)
    dense_l, moe_l, expert_l = nonmatrix_layer_params(m, 1, 1, 1)  # whole layers
    # param_counts' routers (its hash layers hold no selection bias) for the layers' routers
    small = m.num_dense_layers * dense_l + m.num_moe_layers * (moe_l + expert_l - router_params(m)) + c.router
    return _kept(ends, c.total - ends, small, plan.low_precision_layer_fraction(m.num_hidden_layers))


def bf16_parts_extra_bytes(plan: ParallelPlan) -> Any:
    """Bytes a bf16-kept parameter (bf16_kept_params) holds or gathers beyond weight_bytes: 2 - weight_bytes
    where fp8_params keeps the GEMM weights in fp8 / NVFP4, else 0.
    Derived: docs/formulas.md#mem.fp8_param_bf16_parts"""
    on = plan.fp8_params and plan.low_precision
    return 2.0 - plan.weight_bytes if on else 0.0
