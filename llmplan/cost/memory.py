"""Training memory per GPU: weights, gradients, optimizer states, activations and the stated allowance.

The model states are priced in cost.model_states, one layer's activations in cost.activations (their names are
re-exported here); this module holds the pipeline stage's activation peak and the totals per rank.

All functions are pure and return bytes. They work on one ParallelPlan (Python numbers) and, unchanged, on
search.grid.PlanArrays (numpy arrays of many plans): see llmplan/arith.py.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import lru_cache
from typing import Any, ClassVar

import numpy as np

from llmplan.arith import maximum, minimum, where
from llmplan.cost.activations import (  # noqa: F401  (re-exported: their home was this module)
    SAVED_INPUT_BYTES, LayerActivationParts, LayerActivations, cp_comm_workspace_bytes, dispatched_rows,
    layer_activation_bytes,
    layer_activation_no_recompute, layer_activation_parts, layer_activations, linear_input_split,
    csa_reference_transient_bytes, indexer_reference_transient_bytes, moe_saved_input_bytes, op_checkpoint_bytes, paged_stash_transient_bytes, recomputed_module_bytes,
)
from llmplan.cost.breakdown import Breakdown
from llmplan.cost.model_states import (  # noqa: F401  (re-exported: their home was this module)
    ADAM_STATE_BYTES, FP8_TRANSPOSE, LOW_PRECISION_WEIGHT_CACHE, ModelStateBytes, low_precision_weight_cache,
    megatron_fsdp_acts, model_state_bytes,
)
from llmplan.cost.model_states import (after_backward_peak, bf16_gathered_params, bf16_kept_params, fresh_grad_bytes,
                                       hp_grad_cast_bytes,
                                       churned_gradients, lp_grad_bytes,
                                       bf16_parts_extra_bytes, fp32_embedding_grad_bytes, fp32_shards_are_master,
                                       gradient_params,
                                       stored_weight_bytes,
                                       kept_copy_extra_bytes)
from llmplan.cost.grad_lifetime import pipelined_gradient_bytes
from llmplan.cost.muon import muon_moment_saving, muon_params
from llmplan.cost.offload import fine_grained_offloaded, offloaded_share
from llmplan.cost.runtime_memory import RuntimeBytes, runtime_bytes, userbuffer_bytes
from llmplan.cost.params import (
    ALL_BUT_ZERO, explicit_stages, paired_rank_params, heaviest_moe_stage, chunk_layers, memoized,
    padded_vocab, per_distinct, rank_params, vocab_shard_params,
    recomputed_share, stage_end_params, stage_kind_counts, stage_layer_count, stage_layers,
)
from llmplan.cost.schedule import stage_order_cached
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import MemoryAllowance, ParallelPlan, has_layout
from llmplan.specs.quantities import bf16_layer_counts
from llmplan.specs.schedule import schedule_of
from llmplan.units import GIB

ZERO3_MAX_LIVE_PARAMS = 1e9  # DeepSpeed stage3_max_live_parameters default (DeepSpeed docs, config-json)
MFSDP_COMM_UNIT_FLOOR = 1e9
"""Megatron-FSDP's suggested_communication_unit_size floor in elements: max(1e9, 2 x the units' mean) under
optim_grads_params, max(1e9, bucket_size or 1e9) under optim_grads; the reduce-scatter queue's capacity, half of
it the all-gather prefetch size. Source: NVIDIA/Megatron-LM d98e8a64dd (and cd4afffa6) megatron/core/distributed/
fsdp/src/megatron_fsdp/megatron_fsdp.py, MegatronFSDP._init_fsdp_param_and_grad_buffer."""


def megatron_fsdp_held_params(unit: Any, ends: Any, layers: Any, zero: Any) -> tuple[Any, Any]:
    """(weights gathered, unsharded gradients) in elements that Megatron-FSDP holds on a rank without a pipeline,
    of its mean FSDP unit `unit` (a decoder layer), the non-unit parameters `ends` (embedding, final norm, output
    layer) and `layers` units. Weights, ZeRO-3 only: the unit in use, the units prefetched until max(5e8, unit)
    elements are asked for ahead (AllGatherPipeline.all_gather_params, counting without the unit in use:
    base_all_gather_size; so at least one), and the non-unit bucket, never released
    within the step (AllGatherPipeline.reset(preserve_non_fsdp_units=True)). Gradients, ZeRO 2 and 3: a launched
    unit's bucket is freed only once the queue passes C = MFSDP_COMM_UNIT_FLOOR (max with two units at ZeRO-3)
    elements (GradReducePipeline.wait_for_previous_grad_reduce), so floor(C / unit) + 1 launched units and the
    one being filled, at most the layers. Source: NVIDIA/Megatron-LM d98e8a64dd megatron/core/distributed/fsdp/
    src/megatron_fsdp/param_and_grad_buffer.py, megatron_fsdp.py (_register_fsdp_hooks). Derived:
    docs/formulas.md#mem.megatron_fsdp"""
    u = maximum(unit, 1.0)
    capacity = where(zero >= 3, maximum(MFSDP_COMM_UNIT_FLOOR, 2 * u), MFSDP_COMM_UNIT_FLOOR)
    ahead = minimum(maximum(layers - 1, 0), np.ceil(capacity / 2 / u))
    weights = where(zero >= 3, (1 + ahead) * u + ends, 0.0)
    return weights, minimum(layers, np.floor(capacity / u) + 2) * u


def zero3_layer_tensors(m: ModelSpec) -> tuple[float, float, float, float]:
    """Elements of the four weight tensors of a Megatron-LM layer that ZeRO-3 gathers one at a time, in forward
    order: the fused query_key_value, the attention output dense, dense_h_to_4h (both halves when gated) and
    dense_4h_to_h. Derived: docs/formulas.md#comm.zero3_unit"""
    h, f, a, kv, d = m.hidden_size, m.intermediate_size, m.num_attention_heads, m.kv_heads, m.d_head
    return (float(h * (a + 2 * kv) * d), float(a * d * h), float(h * f * (2 if m.gated_mlp else 1)), float(f * h))


def zero3_tensor_backward_bytes(m: ModelSpec, plan: ParallelPlan, working: Any) -> Any:
    """DeepSpeed stage 3 of 2021 per tensor (plan.zero3_unit tensor, no pipeline): the largest of one layer's
    backward moments, each tensor's gradient hook, of the layer's activations then alive plus the ZeRO-3 tensors
    beside them. The hook (an AccumulateGrad post-hook, which autograd runs before the module's post-backward
    release) finds the tensor gathered and its full gradient, and reduces the previous tensor's gradient, still
    whole (partitioned only at the next reduction), through a flattened copy (buffered_reduce_fallback,
    contiguous_gradients false; true: the list reduce_scatter, which ProcessGroupNCCL flattens): weight +
    gradient + 2 x previous gradient, whatever stage3_max_live_parameters says (it gates the prefetch only). The
    output layer's logits are freed by then; a tied output weight's gradient waits in autograd's input buffer for
    the embedding's.
    Activations: `working` (the layer's working set) at the first weight (dense_4h_to_h); from dense_h_to_4h on,
    the MLP's inner activations are consumed and its fc1 output's gradient is alive.
    Source: microsoft/DeepSpeed v0.3.13 .. v0.4.0 runtime/zero/stage3.py (reduce_independent_p_g_buckets_and_
    remove_grads, reduce_ipg_grads, allreduce_and_copy), partition_parameters.py (_partition_gradient);
    pytorch/pytorch torch/csrc/autograd/functions/accumulate_grad.cpp (sequence_nr UINT64_MAX).
    Derived: docs/formulas.md#mem.zero3_tensor_peak"""
    s, b, h, t, w = plan.seq_len / plan.cp, plan.micro_batch, m.hidden_size, plan.tp, plan.weight_bytes
    back = [n / t for n in zero3_layer_tensors(m)[::-1]]  # dense_4h_to_h, dense_h_to_4h, dense, qkv
    moments = [w * (2 * n + 2 * back[j - 1]) for j, n in enumerate(back)]  # j = 0: the layer above's qkv
    consumed = maximum(layer_activation_parts(m, plan, False).mlp - 2 * s * b * back[1] / h, 0.0)
    after_fc2 = maximum(maximum(moments[1], moments[2]), moments[3])
    tied = where(m.tie_word_embeddings, w * vocab_shard_params(m, t), 0.0)
    return maximum(working + moments[0], working - consumed + after_fc2) + tied


LOGIT_BYTES_UNFUSED = 12.0
"""Bytes per logit at the backward of an eager cross_entropy on fp32-cast logits: log_softmax keeps its fp32
output for backward, and its backward holds the incoming fp32 gradient and builds the fp32 input gradient
(PyTorch autograd formulas for log_softmax / nll_loss). Derived: docs/formulas.md#mem.activations"""

LOGIT_BYTES_VOCAB_PARALLEL = 6.0
"""Bytes per logit at the peak of Megatron's _VocabParallelCrossEntropy on fp32-cast logits
(ParallelPlan.unfused_loss_impl vocab-parallel): forward the 16-bit logits beside their fp32 copy (2 + 4), which
the Function subtracts the max from, exponentiates and divides in place and saves as the softmax; backward that
softmax scaled in place beside autograd's 16-bit cast of it (4 + 2). Source: NVIDIA/Megatron-LM
megatron/mpu/cross_entropy.py at 6985e58938 (sub_, exp out=, div_, mul_), megatron/model/gpt_model.py
(output.float()); megatron/core/tensor_parallel/cross_entropy.py at core_r0.8.0. Derived:
docs/formulas.md#mem.activations"""

LOGIT_BYTES_VOCAB_PARALLEL_COPY = 10.0
"""The same Function where the max is subtracted into a new fp32 tensor while the fp32 input stays alive
(`vocab_parallel_logits = vocab_parallel_logits - logits_max...`): 2 + 4 + 4 forward. Source: NVIDIA/Megatron-LM
megatron/core/tensor_parallel/cross_entropy.py from 55817ec9b9 (2022-09-27) to 9634c0e4a3 (2024-06-13), e.g.
285068c810. Derived: docs/formulas.md#mem.activations"""


LOGIT_BYTES_EXP_VOCAB_PARALLEL = 14.0
"""Bytes per logit at the forward peak of a vocabulary-parallel loss of eager ops with nothing in place
(ParallelPlan.unfused_loss_impl eager-vocab-parallel at tp > 1): the 16-bit logits, their fp32 copy
(`logits = vocab_parallel_logits.float()`), `logits - global_max` and its `torch.exp` at once (2 + 4 + 4 + 4); the
exp is saved, and backward holds it beside `exp_logits / sum` and that gradient's 16-bit cast (4 + 4 + 2 = 10).
Source: deepspeedai/DeepSpeed deepspeed/sequence/cross_entropy.py at a64a221ef (_VocabParallelCrossEntropy,
backend torch). Derived: docs/formulas.md#mem.activations"""


def logit_bytes_of(impl: Any, tp: Any) -> Any:
    """Bytes per logit the unfused loss `impl` (ParallelPlan.unfused_loss_impl) holds at its peak at tensor
    parallelism `tp`: PyTorch's eager cross_entropy (LOGIT_BYTES_UNFUSED), Megatron's vocab-parallel one in place
    or with its copy, or the eager-op vocabulary-parallel one (eager at tp 1). Derived:
    docs/formulas.md#mem.activations"""
    exp = where(tp > 1, LOGIT_BYTES_EXP_VOCAB_PARALLEL, LOGIT_BYTES_UNFUSED)
    return where(impl == "vocab-parallel", LOGIT_BYTES_VOCAB_PARALLEL,
                 where(impl == "vocab-parallel-copy", LOGIT_BYTES_VOCAB_PARALLEL_COPY,
                       where(impl == "eager-vocab-parallel", exp, LOGIT_BYTES_UNFUSED)))


def unfused_logit_bytes(plan: ParallelPlan) -> Any:
    """Bytes per logit the plan's unfused loss holds at its peak (logit_bytes_of its unfused_loss_impl and tp).
    Derived: docs/formulas.md#mem.activations"""
    return logit_bytes_of(plan.unfused_loss_impl, plan.tp)



def inflight_microbatches(plan: ParallelPlan, stage: Any) -> Any:
    """Micro-batches whose activations pipeline rank `stage` holds at its peak, in whole-stage units.

    1F1B: min(pp - i, m). Interleaved: (2(pp-i-1) + (vpp-1)·pp + 1) chunk micro-batches of 1/vpp of the
    stage each, which for i = 0 is L·(1 + (pp-1)/(pp·vpp)) layers' worth (Korthikanti et al. 2022, §4.2.3).
    A paired schedule (DualPipe) feeds half the micro-batches from each end; the rank holding stage i holds
    pp - i of them for it (min(pp - i, m/2)), and stage_memory adds the paired stage's.
    Derived: docs/formulas.md#mem.inflight (warm-up counts of Megatron-LM's schedules; DualPipe.step)."""
    p, v, n = plan.pp, plan.vpp, plan.num_microbatches
    sched = schedule_of(plan)
    plain = minimum(p - stage, n / sched.param_copies)
    interleaved = minimum(2 * (p - stage - 1) + (v - 1) * p + 1, n * v) / v
    return where(v == 1, plain * 1.0, interleaved)


def ep_overlap_microbatch_steps(plan: ParallelPlan, stage: Any) -> Any:
    """Whether the combined-1F1B schedule (ep_comm_overlap) runs a forward beside another micro-batch's
    backward on rank `stage`: without pipeline stages once there are two micro-batches; with them where the
    rank's warm-up, 2(p - i - 1) + (v - 1)p + 1 chunk passes with the forward the overlap adds, leaves a steady
    state. Source: NVIDIA/Megatron-LM megatron/core/pipeline_parallel/schedules.py (get_pp_rank_microbatches,
    forward_backward_pipelining_with_interleaving) and combined_1f1b.py at d98e8a6.
    Derived: docs/formulas.md#mem.ep_overlap"""
    p, v, n = plan.pp, plan.vpp, plan.num_microbatches
    warmup = 2 * (p - stage - 1) + (v - 1) * p + 1
    return where(p == 1, n > 1, n * v > warmup) & (plan.ep > 1)


def ep_overlap_layer_bytes(m: ModelSpec, plan: ParallelPlan, n_dense: Any, n_moe: Any, dense_b: Any,
                           moe_b: Any) -> Any:
    """Activation bytes the EP overlap holds beyond the micro-batches in flight (inflight_microbatches): its
    combined step runs forward layer j of one micro-batch beside backward layer L-1-j of another, and the
    forward's pre-dispatch node (norms, attention, router) is built while the backward layer still holds its
    own pre-dispatch activations (its MLP's are freed first: mlp.backward and backward_dw run before the
    forward's mlp), so the peak is the L layers' worth plus one layer's pre-dispatch part (the larger of the
    stage's dense and MoE layers', at most the layer's stored bytes). The warm-up forward the overlap adds
    takes the place of the plain schedule's forward-before-backward, so the count of whole micro-batches is
    unchanged. Source: NVIDIA/Megatron-LM megatron/core/models/common/model_chunk_schedule_plan.py at d98e8a6
    (TransformerModelChunkSchedulePlan.run, TransformerLayerSchedulePlan.run).
    Derived: docs/formulas.md#mem.ep_overlap"""
    if not (m.is_moe and plan.ep_comm_overlap) or schedule_of(plan).hides_ep:
        return 0.0
    dense, moe = layer_activation_parts(m, plan, False), layer_activation_parts(m, plan, True)
    pre_dense = where(n_dense > 0, minimum(dense_b, dense.total - dense.mlp), 0.0)
    pre_moe = where(n_moe > 0, minimum(moe_b, moe.total - moe.mlp), 0.0)
    return maximum(pre_dense, pre_moe)


def layout_peak_layers(m: ModelSpec, plan: ParallelPlan, stage: int, dense_b: Any, moe_b: Any) -> Any:
    """Activation bytes of the layers pipeline rank `stage` of an interleaved pp_layout plan holds at its peak:
    walking its schedule (stage_order), each chunk forward adds that chunk's dense and MoE layers
    (dense_b / moe_b bytes each, one micro-batch), each backward frees them. With equal chunks the peak is the
    warm-up's, inflight_microbatches x the stage's layers; with unequal chunks it is where the heavy chunks
    overlap. Derived: docs/formulas.md#pipeline.layout"""
    chunks = chunk_layers(m, plan)[stage]
    sign, chunk = _order_steps(plan.pp, plan.num_microbatches, len(chunks), stage)
    per_chunk = np.stack(np.broadcast_arrays(*(d * dense_b + e * moe_b for d, e in chunks)))
    # The running sum of the order's steps (np.cumsum adds in order, as a walk would) and its largest value.
    held = np.cumsum(sign.reshape(-1, *[1] * (per_chunk.ndim - 1)) * per_chunk[chunk], axis=0)
    return maximum(0.0 * dense_b, held.max(axis=0))


@lru_cache(maxsize=1024)
def _order_steps(p: int, n: int, v: int, i: int) -> tuple[np.ndarray, np.ndarray]:
    """(+1 per forward / -1 per backward, chunk) of each step of stage i's order (schedule.stage_order)."""
    order = stage_order_cached(p, n, v, i)
    sign = np.asarray([1.0 if kind == "forward" else -1.0 for kind, _, _ in order])
    chunk = np.asarray([c for _, _, c in order], dtype=np.intp)
    sign.setflags(write=False)
    chunk.setflags(write=False)
    return sign, chunk


@dataclass(frozen=True)
class ActivationBytes(Breakdown):
    """Activation memory of one rank; parts sum to total."""

    PARTS: ClassVar[tuple[str, ...]] = ("layers", "recompute_working", "embedding", "output", "cp_workspace",
                                        "indexer_workspace")

    layers: Any
    """Transformer layers x micro-batches in flight (with the EP overlap, one layer's pre-dispatch part more:
    ep_overlap_layer_bytes)."""
    recompute_working: Any
    """Full recompute: one layer's activations rebuilt during its backward (selective recompute_modules: the
    parts of one layer they dropped)."""
    embedding: Any
    """First stage: embedding dropout masks of the micro-batches in flight."""
    output: Any
    """Last stage: input of the output layer and fp32 logits for the loss."""
    offloaded: Any = 0.0
    """Not a part (not in HBM): the offloaded layers' activations in host memory at the peak
    (ParallelPlan.offload_layers; docs/formulas.md#mem.offload)."""
    cp_workspace: Any = 0.0
    """Transformer Engine's context parallelism (p2p ring, a2a, all_gather): one attention layer's transient
    collective buffers at their peak (cost.activations.cp_comm_workspace_bytes; docs/formulas.md#mem.cp_comm)."""
    stash_transient: Any = 0.0
    """Not a part (already in `layers`): the paged stash's one MoE layer at the static budget's rows
    (cost.activations.paged_stash_transient_bytes), one layer per rank however many stages it holds."""
    indexer_workspace: Any = 0.0
    """DeepSeek-V3.2's DSA indexer on Megatron-Core's reference path: one layer's fp32 score matrices at their
    peak, a transient of the forward and the backward (cost.activations.indexer_reference_transient_bytes;
    docs/formulas.md#mem.indexer_reference)."""



def activation_bytes(m: ModelSpec, plan: ParallelPlan, stage: Any,
                     per_layer: LayerActivations | None = None, gather_rate: bool = False) -> ActivationBytes:
    """Activation bytes of pipeline rank `stage` at its peak; `gather_rate`: whether the GPU lists a sparse gather
    rate (GpuSpec.sparse_gather_efficiency), which puts DeepSeek-V4's CSA on its fused path.

    Source: Korthikanti et al. 2022, Table 2 and §4.3 (embedding / output layer); docs/formulas.md#mem.activations"""
    s, b, h, t = plan.seq_len / plan.cp, plan.micro_batch, m.hidden_size, plan.tp
    V = padded_vocab(m.vocab_size, t)
    sp = where(plan.sp, t, 1)
    la = per_layer or layer_activations(m, plan)
    n_dense, n_moe = stage_layers(m, plan, stage)
    if plan.recompute_layers is None:  # every layer alike (la.dense / la.moe already follow the recompute mode)
        dense_b, moe_b = la.dense, la.moe
    else:  # block recompute: the layers it leaves out keep all their activations
        r = recomputed_share(plan, n_dense + n_moe)
        dense_b, moe_b = r * la.dense + (1 - r) * la.kept_dense, r * la.moe + (1 - r) * la.kept_moe
    per_mb = n_dense * dense_b + n_moe * moe_b
    inflight = inflight_microbatches(plan, stage)
    if has_layout(plan) and plan.vpp > 1:  # unequal chunks: walk the schedule
        held = layout_peak_layers(m, plan, int(stage), dense_b, moe_b)
    else:
        held = inflight * per_mb
    # EP overlap: one layer's pre-dispatch activations beyond them (Derived: docs/formulas.md#mem.ep_overlap)
    paired = ep_overlap_microbatch_steps(plan, stage) if m.is_moe and plan.ep_comm_overlap else False
    overlap = where(paired, ep_overlap_layer_bytes(m, plan, n_dense, n_moe, dense_b, moe_b), 0.0)
    # Paged stash: one MoE layer's marked tensors at the static budget's rows beside the pool (Derived:
    # docs/formulas.md#mem.paged_stash)
    stash = where(n_moe > 0, paged_stash_transient_bytes(m, plan), 0.0)
    overlap = overlap + stash
    # Activation offload: the first N layers' activations wait in host memory (Derived: docs/formulas.md#mem.offload)
    offloaded = held * offloaded_share(plan, n_dense + n_moe)
    # Fine-grained offload of the experts' fc1 output: every MoE layer's in flight but the last (nothing to move
    # where the whole layer is recomputed; check_plan's offload_moe_act_recompute refuses it with recompute
    # module moe; Derived: docs/formulas.md#mem.offload_moe_act)
    # and the other fine-grained offload modules (ParallelPlan.offload_modules): the HBM they free, the host bytes
    # they take (they differ where expert_fc1 moves a bf16 input the recipe would keep quantised; Derived:
    # docs/formulas.md#mem.offload_modules)
    freed, host = fine_grained_offloaded(m, plan, n_dense, n_moe, inflight)
    freed, host = where(plan.full, 0.0, freed), where(plan.full, 0.0, host)
    # Full / op recompute rebuild one whole layer in its backward; selective recompute_modules the parts they
    # dropped of one layer (Derived: docs/formulas.md#mem.recompute_modules).
    rebuilt = where(n_moe > 0, maximum(la.rebuilt_moe, where(n_dense > 0, la.rebuilt_dense, 0.0)), la.rebuilt_dense)
    working = where(plan.full | plan.op, where(n_moe > 0, la.working_moe, la.working_dense), rebuilt)
    # The embedding dropout's mask (1 byte), and an embedding norm's saved 16-bit input (Megatron-DeepSpeed
    # VocabParallelEmbedding self.norm at 99c8fe07). Derived: docs/formulas.md#mem.activations
    # Without pipeline stages the overlap embeds the next micro-batch before the last one's embedding backward.
    extra = where(paired & (plan.pp == 1), 1.0, 0.0)
    embedding = where(stage == 0, (inflight + extra) * s * b * h / sp * (3.0 if m.embedding_norm else 1.0), 0.0)
    heads = 1 + m.num_nextn_predict_layers  # each MTP module keeps its own head input and logits
    logit_bytes = where(plan.fused_loss, 4.0, unfused_logit_bytes(plan))
    output = where(stage == plan.pp - 1,
                   heads * (2 * s * b * h / linear_input_split(plan) + logit_bytes * s * b * V / t), 0.0)
    # TE's context parallelism (p2p, a2a, all_gather): one attention layer's collective buffers at a time.
    # Derived: docs/formulas.md#mem.cp_comm
    cp_workspace = cp_comm_workspace_bytes(m, plan)
    # DSA's reference indexer path: one layer's fp32 score matrices. Derived: docs/formulas.md#mem.indexer_reference
    # DeepSeek-V4's CSA off its fused path: the same over the compressed keys. Derived: the same section
    indexer = where(n_dense + n_moe > 0, indexer_reference_transient_bytes(m, plan)
                    + csa_reference_transient_bytes(m, plan, gather_rate), 0.0)
    return ActivationBytes(layers=held - offloaded - freed + overlap, recompute_working=working, embedding=embedding,
                           output=output, offloaded=offloaded + host, cp_workspace=cp_workspace,
                           stash_transient=stash, indexer_workspace=indexer)


def paired_activations(a: ActivationBytes, b: ActivationBytes) -> ActivationBytes:
    """Activations of a rank that holds two stages (DualPipe: i and pp-1-i), each with its own micro-batches in
    flight (inflight_microbatches): their layers, embedding and output parts add; one layer is recomputed at a
    time, so the larger recompute working set counts once, as does the paged stash's one-layer transient.
    Derived: docs/formulas.md#mem.inflight"""
    once = minimum(a.stash_transient, b.stash_transient)
    return ActivationBytes(layers=a.layers + b.layers - once, recompute_working=maximum(a.recompute_working,
                                                                                     b.recompute_working),
                           embedding=a.embedding + b.embedding, output=a.output + b.output,
                           offloaded=a.offloaded + b.offloaded,
                           cp_workspace=maximum(a.cp_workspace, b.cp_workspace),
                           stash_transient=maximum(a.stash_transient, b.stash_transient),
                           indexer_workspace=maximum(a.indexer_workspace, b.indexer_workspace))


@dataclass(frozen=True)
class TrainingMemory(Breakdown):
    """Memory of the most-loaded rank; weights + gradients + optimizer + activations + other = total."""

    PARTS: ClassVar[tuple[str, ...]] = ("weights", "gradients", "optimizer", "activations", "other")

    stage: Any
    """Pipeline stage of the most-loaded rank."""
    params_on_rank: Any
    """Parameters held by that rank (before ZeRO sharding)."""
    weights: Any
    gradients: Any
    optimizer: Any
    activations: Any
    other: Any
    """Runtime bytes (the priced CUDA context, cuBLAS workspace and NCCL buffers, or the stated fixed
    allowance), fragmentation (a fraction of the churned tensors: `fragmentation`), ZeRO-3 gathered-layer
    buffers (per tensor: what its backward's gradient hooks hold beyond the start of the backward,
    docs/formulas.md#mem.zero3_tensor_peak)."""
    activation_parts: ActivationBytes
    capacity: float
    runtime: RuntimeBytes | None = None
    """The runtime bytes inside `other` where they are priced (MemoryAllowance.fixed_gib None); None where
    the stated fixed allowance stands in for them."""
    optimizer_copies: Any = 0.0
    """Not a part: the transient gradient copies DeepSpeed's ZeRO-1 optimizer makes after the backward
    (cost.model_states.optimizer_copies: reduction bucket, flat partition, its fp32 cast), bytes."""
    after_backward: Any = 0.0
    """Not a part: bytes inside `other` by which the peak after the backward (the reduction with its bucket,
    or the step with its copies) exceeds the backward's peak (docs/formulas.md#mem.optimizer_copies)."""
    fresh_grad: Any = 0.0
    """Not a part: bytes inside `other` by which the backward's peak exceeds the priced activations while a
    micro-batch's fresh weight gradient waits to be added into the accumulated one (grad_accumulation add;
    cost.model_states.fresh_grad_bytes, docs/formulas.md#mem.fresh_grads) or, under DeepSpeed's BF16_Optimizer,
    while the largest bf16 gradient's fp32 copy is added into the fp32 one (cost.model_states.hp_grad_cast_bytes,
    docs/formulas.md#mem.hp_grad_cast); 0 otherwise."""
    muon_saving: Any = 0.0
    """Not a part: the Adam moment bytes `optimizer` leaves out under Muon (cost.muon.muon_moment_saving;
    docs/formulas.md#optim.muon_memory); 0 under adam."""
    fragmentation: Any = 0.0
    """Not a part: bytes inside `other` for the caching allocator's fragmentation, MemoryAllowance.fragmentation
    x `churned` (docs/formulas.md#mem.fragmentation)."""
    churned: Any = 0.0
    """Not a part: the tensor bytes freed and allocated again every micro-batch or step that the fragmentation
    allowance is a fraction of (churned_bytes); the buffers held all run carry none."""

    @property
    def fits(self) -> Any:
        return self.total <= self.capacity

    @property
    def headroom(self) -> Any:
        return self.capacity - self.total


def churned_bytes(activations: Any, fresh: Any, gathered: Any, gradients: Any) -> Any:
    """The tensor bytes that PyTorch's caching allocator sees freed and allocated again every micro-batch or step,
    which its freed blocks, split by smaller requests, can fragment: the activations (and recompute working set),
    the fresh weight gradients, the gathered / queued ZeRO-3 and FSDP buffers, and the gradients where the
    optimizer frees them at each step (`gradients`: cost.model_states.churned_gradients, else 0). The buffers
    held all run are left out: an allocation of 10 MiB or more gets a segment of its own, its size rounded up to
    2 MiB (get_allocation_size: kMinLargeAlloc 10 MiB, kRoundLarge 2 MiB), so a weight, gradient-buffer or
    optimizer-state buffer allocated once wastes under 2 MiB. Source: pytorch/pytorch
    c10/cuda/CUDACachingAllocator.cpp at 001074d25084 (kMinLargeAlloc, kRoundLarge, get_allocation_size).
    Derived: docs/formulas.md#mem.fragmentation"""
    return activations + fresh + gathered + gradients


def stage_memory(m: ModelSpec, plan: ParallelPlan, stage: Any, allowance: MemoryAllowance,
                 capacity: float, fp8_tn_only: bool = True, nccl_channels: int = 16,
                 compute_capability: float | None = None, gather_rate: bool = False) -> TrainingMemory:
    """Memory of one rank of pipeline stage `stage`; `nccl_channels`, `compute_capability`: the GPU's
    GpuSpec.nccl_sms and GpuSpec.compute_capability (the cuBLAS workspaces, docs/formulas.md#mem.runtime);
    `gather_rate`: whether it lists GpuSpec.sparse_gather_efficiency (activation_bytes).
    Derived: docs/formulas.md#mem.total"""
    weight_b, grad_b, optim_b = stored_weight_bytes(plan), plan.grad_bytes, plan.optimizer_bytes
    fp32_shards = fp32_shards_are_master(plan)  # FSDP's fp32 shard: the master, no compute-dtype shard
    state_w, state_o = where(fp32_shards, 4.0, weight_b), where(fp32_shards, optim_b - plan.master_bytes, optim_b)
    paired = schedule_of(plan).param_copies == 2  # DualPipe: each rank holds stages i and pp-1-i
    rp = paired_rank_params(m, plan, stage) if paired else rank_params(m, plan, stage)
    dense = model_state_bytes(rp.dense, plan.zero_shard, plan.zero, state_w, grad_b, state_o, plan.optimizer_shard)
    expert = model_state_bytes(rp.expert, plan.expert_shard, plan.zero, state_w, grad_b, state_o,
                               plan.expert_optimizer_shard)
    # NeMo 1.x under Apex: the embeddings' gradients in fp32 buckets; one stage a rank (check_plan refuses them
    # under DualPipe, fp32_embedding_grads_act). Derived: docs/formulas.md#mem.fp32_embedding_grads
    emb32 = fp32_embedding_grad_bytes(m, plan, stage)
    # DeepSpeed's BF16_Optimizer: the bf16 param.grad kept beside the fp32 flat gradient.
    # Derived: docs/formulas.md#mem.bf16_optimizer_grads
    lp = lp_grad_bytes(plan, rp)
    dense = ModelStateBytes(weights=dense.weights, gradients=dense.gradients + emb32 + lp, optimizer=dense.optimizer)

    def stage_act(s: Any) -> ActivationBytes:
        return per_distinct(plan, ALL_BUT_ZERO, s, lambda p, s: activation_bytes(
            m, p, s, memoized(p, ("layer_activations", m), lambda: layer_activations(m, p)), gather_rate))
    act = stage_act(stage)
    cache = low_precision_weight_cache(m, plan, stage, fp8_tn_only)
    if paired:
        mirror = plan.pp - 1 - stage
        act = paired_activations(act, stage_act(mirror))
        cache = cache + low_precision_weight_cache(m, plan, mirror, fp8_tn_only)
    # fp8_params: the embedding, output layer, norms, routers and bf16 layers stay 2 bytes a weight.
    # Derived: docs/formulas.md#mem.fp8_param_bf16_parts
    kept, kept_b = bf16_kept_params(m, plan, stage), bf16_parts_extra_bytes(plan)  # kept_b: the gathered copy
    kept_w = kept_copy_extra_bytes(plan) * (kept.dense / where(plan.zero >= 3, plan.zero_shard, 1)
                                                + kept.expert / where(plan.zero >= 3, plan.expert_shard, 1))
    cache = cache + kept_w
    # Muon: one momentum buffer on its matrices instead of Adam's two moments. Derived:
    # docs/formulas.md#optim.muon_memory
    saving = muon_moment_saving(plan, muon_params(m, plan, stage))
    optimizer = dense.optimizer + expert.optimizer - saving
    states = dense.weights + dense.gradients + expert.weights + expert.gradients + optimizer + cache
    # Autograd's add of each micro-batch's fresh weight gradient (grad_accumulation add): the largest one beside
    # what its moment holds. Derived: docs/formulas.md#mem.fresh_grads
    # DeepSpeed's BF16_Optimizer: the fp32 copy of the largest bf16 gradient after each micro-batch's backward
    # (grad_accumulation cast-add; 0 under add). Derived: docs/formulas.md#mem.hp_grad_cast
    one_mb = act.layers / maximum(inflight_microbatches(plan, stage), 1)
    fresh = fresh_grad_bytes(m, plan, stage, act.recompute_working, one_mb) \
        + hp_grad_cast_bytes(m, plan, stage, act.recompute_working, one_mb)
    tensors = states + act.total + fresh
    layers = maximum(stage_layer_count(m, plan, stage), 1)
    # ZeRO-3: the layer in use whole, and the next one prefetched up to stage3_max_live_parameters (the cap
    # gates the prefetch only: a module over it is still gathered whole to run). Derived: docs/formulas.md#mem.other
    live = maximum(rp.total / layers, minimum(2 * rp.total / layers, ZERO3_MAX_LIVE_PARAMS))
    # Megatron-FSDP (no pipeline: check_plan's megatron_fsdp_zero): its prefetch, its non-unit weights kept
    # gathered, its queue of unsharded gradient buckets. Derived: docs/formulas.md#mem.megatron_fsdp
    mfsdp = megatron_fsdp_acts(plan)
    queued = 0.0
    if np.any(mfsdp):
        ends = stage_end_params(m, plan, stage)
        mf_live, mf_grads = megatron_fsdp_held_params((rp.total - ends) / layers, ends, layers, plan.zero)
        live, queued = where(mfsdp & (plan.zero >= 3), mf_live, live), where(mfsdp, mf_grads * grad_b, 0.0)
    # ZeRO-2/3 under a pipeline keep the stage's gradients unsharded (and ZeRO-3 its weights gathered) until
    # the last micro-batch: PyTorch pipelining with FSDP2. Derived: docs/formulas.md#mem.other
    piped = plan.pp > 1
    # Sharded gradients under an interleaved pipeline: each chunk's unsharded gradients live from its first
    # backward to its reduce-scatter (FSDP). Derived: docs/formulas.md#mem.grad_lifetime
    gradients = pipelined_gradient_bytes(m, plan, stage, gradient_params(plan, rp) * grad_b, grad_b) + emb32 + lp
    tensors = tensors + gradients - (dense.gradients + expert.gradients)
    wide = bf16_gathered_params(m, plan, stage).total  # gathered at 2 B under fp8_params (torchao: the experts too)
    gathered = where(plan.zero >= 3, where(piped, rp.total, live) * weight_b
                     + where(piped, wide, live * wide / maximum(rp.total, 1.0)) * kept_b, 0.0)
    # FSDP2 without a pipeline: one layer's unsharded gradients (param dtype) beside the previous layer's
    # reduce-scatter input (reduce dtype), held until the next reduce. Derived: docs/formulas.md#mem.other
    gathered = gathered + where(fp32_shards & (plan.pp == 1),
                                rp.total / layers * (where(plan.dtype == "fp32", 4.0, 2.0) + grad_b), 0.0) + queued
    # DeepSpeed 2021 per tensor: a gradient hook's moment in the backward, the logits freed, beside the gathered
    # tensor, its gradient and the previous one's under reduction. Derived: docs/formulas.md#mem.zero3_tensor_peak
    per_tensor = plan.gathered_per_microbatch & (plan.zero3_unit == "tensor")
    if np.any(per_tensor):
        moment = tensors - act.output - act.recompute_working + zero3_tensor_backward_bytes(m, plan,
                                                                                           act.recompute_working)
        gathered = gathered + where(per_tensor, maximum(moment - tensors - gathered, 0.0), 0.0)
    # After the backward (activations freed): DeepSpeed ZeRO-1's reduction bucket beside the whole gradient, then
    # its step's flat partition copies beside the partition's gradients. Derived: docs/formulas.md#mem.optimizer_copies
    copies, peak = after_backward_peak(plan, rp, states, gradients, emb32, stage)
    after = maximum(peak - tensors, 0.0)
    # Runtime bytes priced unless a fixed allowance is stated. Derived: docs/formulas.md#mem.runtime
    stated = allowance.fixed_gib
    # Transformer Engine's userbuffers of the TP overlap. Derived: docs/formulas.md#mem.userbuffers
    ub = userbuffer_bytes(m.hidden_size, plan, sum(bf16_layer_counts(plan, m.num_hidden_layers)))
    runtime = runtime_bytes(plan, stage, nccl_channels, plan.cuda_lazy_loading, ub,
                            compute_capability) if stated is None else None
    fixed = stated * GIB if stated is not None else runtime.total if runtime is not None else 0.0
    # The caching allocator's fragmentation, a fraction of the tensors freed and allocated again every micro-batch
    # or step (activations, fresh gradients, gathered / queued buffers; DeepSpeed ZeRO-1/2's param.grad); none
    # on the buffers held all run (weights, held gradient buffers, optimizer states, weight caches), each a
    # segment of its own. Derived: docs/formulas.md#mem.fragmentation
    churned = churned_bytes(act.total, fresh, gathered, where(churned_gradients(plan), gradients, 0.0))
    frag = allowance.fragmentation * churned
    other = fixed + frag + gathered + after + fresh
    return TrainingMemory(
        stage=stage, params_on_rank=rp.total, weights=dense.weights + expert.weights + cache,
        gradients=gradients, optimizer=optimizer,
        activations=act.total, other=other, activation_parts=act, capacity=capacity, runtime=runtime,
        optimizer_copies=copies, after_backward=after, fresh_grad=fresh, muon_saving=saving,
        fragmentation=frag, churned=churned,
    )


def candidate_stages(m: ModelSpec, plan: ParallelPlan) -> tuple[Any, ...]:
    """Stages that can hold the most memory or take the longest: the first (embedding, most micro-batches in
    flight), the second (the busiest middle stage when the first is lighter), the first one without dense
    layers (MoE models with leading dense layers), the last (output layer, logits). Other middle stages
    hold as many layers as the second and fewer micro-batches (tests check this). An explicit per-stage
    list (one plan, not arrays) is evaluated stage by stage."""
    if explicit_stages(plan) is not None:
        return tuple(range(plan.pp))
    second = minimum(1, plan.pp - 1)
    placed = m.first_k_dense_replace or m.mlp_layer_types is not None  # MoE layers not on every stage alike
    moe = heaviest_moe_stage(m, plan) if m.is_moe and placed else second
    return 0 * plan.pp, second, moe, plan.pp - 1


def each_stage(stages: tuple[Any, ...], f: Any, key: Any = None) -> list[Any]:
    """f of every candidate stage, computed once for a stage that appears twice (the same value object) and,
    given `key` (a stage's stage_class, or None), once per stage class: the later stages of a class get the
    first one's result object."""
    done: dict[Any, Any] = {}
    out = []
    for stage in stages:
        k = key(stage) if key is not None else None
        k = ("stage", id(stage)) if k is None else k
        if k not in done:
            done[k] = f(stage)
        out.append(done[k])
    return out


def stage_class(m: ModelSpec, plan: ParallelPlan, stage: Any) -> tuple | None:
    """What a rank's parameters, compute, communication and tail depend on in a plan that lists its stages:
    whether it is the first or the last stage, its (dense, MoE) layers (MTP modules included) and its layers of
    each mixer kind. Stages of one class cost alike (memory also by its micro-batches in flight:
    training_memory), so an explicit list of 4,096 equal stages is priced a few times, not 4,096. None (every
    stage its own class) for other plans and where a stage's position matters beyond these: pp_layout chunks,
    interleaving (chunk offsets), DualPipe's paired stages."""
    classes = stage_classes(m, plan)
    return None if classes is None else classes[int(stage)]


def stage_classes(m: ModelSpec, plan: ParallelPlan) -> tuple[tuple, ...] | None:
    """stage_class of every stage, once per plan (None where stage_class is)."""
    if explicit_stages(plan) is None or has_layout(plan) or plan.vpp != 1 or schedule_of(plan).param_copies != 1:
        return None

    def one(i: int) -> tuple:
        kinds = tuple(stage_kind_counts(m, plan, i).items()) if m.layer_types else ()
        return i == 0, i == plan.pp - 1, stage_layers(m, plan, i), kinds

    return memoized(plan, ("stage_classes", m), lambda: tuple(one(i) for i in range(plan.pp)))


def class_key(m: ModelSpec, plan: ParallelPlan) -> Any:
    """stage -> stage_class for each_stage's key, the classes read once; None where there are none."""
    classes = stage_classes(m, plan)
    return None if classes is None else classes.__getitem__


def training_memory(m: ModelSpec, plan: ParallelPlan, capacity: float,
                    allowance: MemoryAllowance | None = None, fp8_tn_only: bool = True,
                    nccl_channels: int = 16, compute_capability: float | None = None,
                    gather_rate: bool = False,
                    known: dict[int, TrainingMemory] | None = None) -> TrainingMemory:
    """Memory per GPU of the most-loaded rank (elementwise for plan arrays); `fp8_tn_only`: the GPU's
    GpuSpec.fp8_tn_only (Hopper keeps transposed fp8 weight copies, Blackwell does not); `nccl_channels`:
    its GpuSpec.nccl_sms; `compute_capability`: its GpuSpec.compute_capability; `gather_rate`: whether it lists
    GpuSpec.sparse_gather_efficiency (activation_bytes). `known`: stage_memory of some candidate stages (by
    their index in candidate_stages) on these plan arrays, already priced (the search's memory screen,
    search.evaluate.screened_memory)."""
    allowance = allowance or MemoryAllowance()
    stages, classes = candidate_stages(m, plan), class_key(m, plan)

    def one(p: ParallelPlan, stage: Any) -> TrainingMemory:
        return stage_memory(m, p, stage, allowance, capacity, fp8_tn_only, nccl_channels, compute_capability,
                            gather_rate)
    if getattr(type(plan), "take", None) is not None:  # plan arrays: each stage where it is a new one
        results = _new_stages(plan, stages, one, known or {})
    else:
        results = each_stage(stages, lambda stage: one(plan, stage),
                             None if classes is None else  # a class with as many micro-batches in flight
                             lambda stage: classes(stage) + (inflight_microbatches(plan, stage),))
    if classes is not None:  # one plan: the first stage with the largest total
        top = 0
        for i in range(1, len(results)):
            top = i if results[i].total > results[top].total else top
        return results[top] if results[top].stage == stages[top] else replace(results[top], stage=stages[top])
    totals = [r.total for r in results]
    if any(isinstance(t, np.ndarray) for t in totals):  # plan arrays: the first stage with the largest total
        return _choose(np.argmax(np.stack(np.broadcast_arrays(*totals)), axis=0), results)
    best = results[0]
    for r in results[1:]:
        best = _pick(r.total > best.total, r, best)
    return best


def _new_stages(plans: Any, stages: tuple[Any, ...], one: Any, known: dict[int, TrainingMemory]) -> list[Any]:
    """one(plans, stage) of each candidate stage of plan arrays (`known`: those already priced), priced only on
    the plans where the stage is none of the earlier candidates (pp 1: all four are stage 0; pp 2: the second is
    the last); elsewhere the first candidate's values stand in. training_memory picks the first stage with the
    largest total: a stage equal to an earlier one is never that stage, and the stand-ins are a candidate's own
    values, so the pick and its values are those of pricing every stage on every plan."""
    n = len(plans)
    results: list[TrainingMemory] = []
    for k, stage in enumerate(stages):
        s = np.broadcast_to(stage, (n,))
        new = np.ones(n, dtype=bool)
        for earlier in stages[:k]:
            new &= s != np.broadcast_to(earlier, (n,))
        if k in known:
            results.append(known[k])
        elif new.all():
            results.append(one(plans, stage))
        elif not new.any():
            results.append(results[0])
        else:
            at = np.flatnonzero(new)
            results.append(_put_memory(results[0], one(plans.take(at).as_plan, s[at]), at, n))
    return results


def _put_memory(full: TrainingMemory, sub: TrainingMemory, at: np.ndarray, n: int) -> TrainingMemory:
    """`full` (a breakdown over n plans) with the plans at `at` given `sub`'s values (a breakdown over those)."""
    def put(get: Any) -> Any:
        a, b = get(full), get(sub)
        if not isinstance(a, np.ndarray) and not isinstance(b, np.ndarray) and a == b:
            return a
        out = np.array(np.broadcast_to(a, (n,)), dtype=np.result_type(a, b))
        out[at] = b
        return out
    return _fieldwise(put, full, full.runtime is not None and sub.runtime is not None)


def _field_names(cls: type, *skip: str) -> tuple[str, ...]:
    """The dataclass's field names but `skip`, in their order: what _fieldwise selects."""
    return tuple(f.name for f in fields(cls) if f.name not in skip)


def _fieldwise(select: Any, first: TrainingMemory, runtime: bool) -> TrainingMemory:
    """A TrainingMemory of `select(get)` for each value `get(breakdown)` of the breakdowns it chooses among (their
    activation parts and, where `runtime`, their runtime bytes too); `first`'s capacity."""
    act = ActivationBytes(*(select(lambda r, f=f: getattr(r.activation_parts, f))
                            for f in _field_names(ActivationBytes)))
    parts = RuntimeBytes(*(select(lambda r, f=f: getattr(r.runtime, f)) for f in _field_names(RuntimeBytes))) \
        if runtime else None
    picked = _field_names(TrainingMemory, "activation_parts", "capacity", "runtime")
    return TrainingMemory(**{f: select(lambda r, f=f: getattr(r, f)) for f in picked}, activation_parts=act,
                          capacity=first.capacity, runtime=parts)


def _choose(which: np.ndarray, results: list[TrainingMemory]) -> TrainingMemory:
    """Fieldwise results[which] over breakdowns of plan arrays (what the chain of _pick selects, in one pass)."""
    flat = which * len(which) + np.arange(len(which))  # the chosen element in the stages' stacked values

    def pick(get: Any) -> np.ndarray:
        return np.stack([np.broadcast_to(get(r), which.shape) for r in results]).ravel().take(flat)

    return _fieldwise(pick, results[0], results[0].runtime is not None)


def _pick(cond: Any, a: TrainingMemory, b: TrainingMemory) -> TrainingMemory:
    """Fieldwise `a if cond else b` over two breakdowns (elementwise for arrays)."""
    return _fieldwise(lambda get: where(cond, get(a), get(b)), a, a.runtime is not None and b.runtime is not None)
