"""Training memory per GPU: weights, gradients, optimizer states, activations and the stated allowance.

All functions are pure and return bytes. They work on one ParallelPlan (Python numbers) and, unchanged, on
search.grid.PlanArrays (numpy arrays of many plans): see llmplan/arith.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar

import numpy as np

from llmplan.arith import maximum, minimum, where
from llmplan.cost.breakdown import Breakdown
from llmplan.cost.compute import attention_head_dims, op_matmul_widths
from llmplan.cost.mixers import attention_share, dense_mlp_share, mean_recurrent_activation_bytes, norms_per_layer
from llmplan.cost.params import (
    ALL_BUT_ZERO, RankParams, explicit_stages, heaviest_moe_stage, kv_heads_per_rank, chunk_layers, memoized,
    padded_vocab, per_distinct, rank_params,
    recomputed_share, stage_layer_count, stage_layers,
)
from llmplan.cost.schedule import stage_order_cached
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import MemoryAllowance, ParallelPlan, has_layout
from llmplan.specs.schedule import schedule_of
from llmplan.units import GIB

ADAM_STATE_BYTES = 12.0  # fp32 master weights + first + second moments
ZERO3_MAX_LIVE_PARAMS = 1e9  # DeepSpeed stage3_max_live_parameters default (DeepSpeed docs, config-json)
LOGIT_BYTES_UNFUSED = 12.0
"""Bytes per logit at the backward of an eager cross_entropy on fp32-cast logits: log_softmax keeps its fp32
output for backward, and its backward holds the incoming fp32 gradient and builds the fp32 input gradient
(PyTorch autograd formulas for log_softmax / nll_loss). Derived: docs/formulas.md#mem.activations"""


@dataclass(frozen=True)
class ModelStateBytes(Breakdown):
    """Weights, gradients and optimizer states of one rank; parts sum to total."""

    PARTS: ClassVar[tuple[str, ...]] = ("weights", "gradients", "optimizer")
    weights: Any
    gradients: Any
    optimizer: Any


def model_state_bytes(n_params: Any, shard: Any, zero: Any, weight_bytes: Any, grad_bytes: Any,
                      optim_bytes: Any = ADAM_STATE_BYTES) -> ModelStateBytes:
    """Mixed-precision Adam model states of n_params replicated parameters under ZeRO over `shard` ranks.

    Source: Rajbhandari et al. 2020 (ZeRO), Section 5: 2Ψ+2Ψ+KΨ with K=12; stage 1 shards K, stage 2 also the
    gradients, stage 3 also the parameters. Megatron's distributed optimizer is stage 1 with fp32 gradients
    (6 + 12/d bytes/param, Megatron-LM docs). K is ParallelPlan.optimizer_bytes: master + two moments in their
    dtypes (8 with bf16 moments, DeepSeek-V3 report §3.3.3). Derived: docs/formulas.md#mem.model_states"""
    return ModelStateBytes(
        weights=n_params * weight_bytes / where(zero >= 3, shard, 1),
        gradients=n_params * grad_bytes / where(zero >= 2, shard, 1),
        optimizer=n_params * optim_bytes / where(zero >= 1, shard, 1),
    )


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


def low_precision_weight_cache(m: ModelSpec, plan: ParallelPlan, rp: RankParams, stage: Any,
                               fp8_tn_only: bool = True) -> Any:
    """Bytes of the recipe's cached low-precision weight copies on one rank of `stage`: its linear weights
    (not the embedding or the bf16 output layer) x LOW_PRECISION_WEIGHT_CACHE (less the transpose where the
    GPU's FP8 GEMMs take any layout), less the model copy itself where it is kept in the recipe's format
    (fp8_params: 1 byte, or NVFP4's 4 bits and scales); none under ZeRO-3 / FSDP, which gathers and frees each
    layer, unless a pipeline keeps the stage gathered (mem.other). Derived: docs/formulas.md#precision"""
    if not plan.low_precision:
        return 0.0
    cache = LOW_PRECISION_WEIGHT_CACHE[plan.recipe] - (0.0 if fp8_tn_only else FP8_TRANSPOSE.get(plan.recipe, 0.0))
    per_weight = cache - (plan.weight_bytes if plan.fp8_params and plan.dtype != "bf16" else 0.0)
    vocab = padded_vocab(m.vocab_size, plan.tp) * m.hidden_size / plan.tp
    ends = where(stage == 0, vocab, 0.0) + where(stage == plan.pp - 1, vocab, 0.0)
    linear = maximum(rp.total - ends, 0.0) * plan.low_precision_layer_fraction
    return where((plan.zero >= 3) & (plan.pp == 1), 0.0, linear * max(per_weight, 0.0))


def layer_activation_bytes(m: ModelSpec, plan: ParallelPlan, moe: bool) -> Any:
    """Activation bytes one transformer layer keeps for backward, per micro-batch, on one rank.

    Source: Korthikanti et al. 2022, Table 2 (sbh(10 + 24/t + 5as/ht); SP divides the 10; selective
    recompute drops 5as²b/t; full recompute keeps 2sbh), generalised to GQA/MLA, gated MLP, MoE and CP
    in docs/formulas.md#mem.activations."""
    s, b, h = plan.seq_len / plan.cp, plan.micro_batch, m.hidden_size
    sp = where(plan.sp, plan.tp, 1)
    parts = layer_activation_parts(m, plan, moe, scores=True)
    selective = parts.total - recomputed_module_bytes(m, plan, moe, parts)
    kept = where(plan.op, op_checkpoint_bytes(m, plan), selective)
    return where(plan.full, 2 * s * b * h / sp, kept)


def op_checkpoint_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """What op-level checkpointing keeps of one dense layer: its input (2sbh), the bf16 outputs of the odd-
    numbered matmuls in torchtitan's order (Llama: wq, wv, w1, w2; op_matmul_widths) and of the fused attention
    with its fp32 log-sum-exp per head. Row-parallel outputs count at full width under TP (the partial sums
    the mm writes before the reduce-scatter). Source: torchtitan 0.3.0 distributed/activation_checkpoint.py
    (SelectiveAC save list); PyTorch SDPA flash / efficient kernels return the log-sum-exp for backward.
    Derived: docs/formulas.md#mem.activations"""
    s, b, h, a, t = plan.seq_len / plan.cp, plan.micro_batch, m.hidden_size, m.num_attention_heads, plan.tp
    sp = where(plan.sp, t, 1)
    widths = op_matmul_widths(m)
    per_rank = [n / t for _, n in widths]
    per_rank[1] = per_rank[2] = kv_heads_per_rank(m, t) * m.d_head  # K and V: at least one KV head per rank
    per_rank[3] = per_rank[-1] = h  # wo and w2 (row-parallel): h wide on every rank
    saved = sum(n for i, n in enumerate(per_rank) if i % 2 == 0)
    return 2 * s * b * h / sp + 2 * s * b * saved + s * b * a / t * (2 * m.d_head + 4)


def layer_activation_no_recompute(m: ModelSpec, plan: ParallelPlan, moe: bool, scores: bool = True) -> Any:
    """One layer's activations without full recompute (selective recompute or fused attention drop the
    attention-score term when `scores`; the working set of a fully recomputed layer keeps it)."""
    return layer_activation_parts(m, plan, moe, scores).total


@dataclass(frozen=True)
class LayerActivationParts(Breakdown):
    """One layer's activations for backward (one micro-batch, one rank) by the module that keeps them, each at
    the bytes the recipe stores (low-precision GEMM inputs at SAVED_INPUT_BYTES); parts sum to the total.
    Source: Korthikanti et al. 2022, Table 2, split by module (docs/formulas.md#mem.recompute_modules)."""

    PARTS: ClassVar[tuple[str, ...]] = ("residual", "attn_input", "latents", "qkv", "attn_out", "scores", "mlp_input",
                                        "mlp", "recurrent")
    residual: Any
    """The two norms' inputs (the residual stream) and the hidden-dropout masks."""
    attn_input: Any
    """The input norm's output: the QKV (MLA: down-projection) input."""
    latents: Any
    """MLA: the compressed Q and KV latents and the shared RoPE key (the up-projections' inputs); else 0."""
    qkv: Any
    """Q, K and V as the attention core keeps them (MLA: the up-projected heads)."""
    attn_out: Any
    """The attention core's output, the output projection's input."""
    scores: Any
    """Softmax scores (and dropout) of an unfused attention core."""
    mlp_input: Any
    """The pre-MLP norm's output: the MLP's (MoE: the router's and shared experts') input."""
    mlp: Any
    """Inside the MLP: fc1 and activation outputs; MoE: dispatched rows, experts, router probabilities."""
    recurrent: Any
    """A hybrid's recurrent mixers (Mamba-2, Gated DeltaNet), per average layer (mixers.py); 0 otherwise."""


def layer_activation_parts(m: ModelSpec, plan: ParallelPlan, moe: bool, scores: bool = True) -> LayerActivationParts:
    """One layer's stored activations by module (LayerActivationParts). Derived: docs/formulas.md#mem.activations"""
    s, b, h, a, t = plan.seq_len / plan.cp, plan.micro_batch, m.hidden_size, m.num_attention_heads, plan.tp
    sp = where(plan.sp, t, 1)
    # Two norm inputs (4sbh), two 1-byte dropout masks (2sbh) when the model uses hidden dropout; the QKV and
    # MLP inputs (2sbh each): DTensor TP keeps them gathered (tp_impl).
    saved = (2.0 - SAVED_INPUT_BYTES[plan.recipe]) * plan.low_precision_layer_fraction if plan.low_precision else 0.0
    linear_in = (2.0 - saved) * s * b * h / linear_input_split(plan)
    no_scores = plan.flash_attention | plan.recomputes("core_attn") if scores else plan.flash_attention
    # Softmax output (2 bytes per score), and with attention dropout its mask (1) and output (2).
    per_score = 5 if m.attention_dropout > 0 else 2
    f = (m.expert_ffn * m.num_experts_per_tok + m.shared_ffn) if moe else m.intermediate_size
    out = 2 * s * b * a * attention_head_dims(m)[1] / t
    mla = m.mla
    latents = 2 * s * b * (mla.q_rank + mla.kv_lora_rank + mla.qk_rope_head_dim) if mla is not None else 0.0
    # An MoE layer's router reads the pre-MLP norm's output unquantised and keeps it (2sbh); the experts' fc1
    # reads the dispatched rows and keeps their quantised cast (moe_saved_input_bytes).
    mlp_input = 2.0 * s * b * h / linear_input_split(plan) if moe else linear_in
    # A hybrid's average layer (mixers.py): its share of attention layers, of dense MLPs, of sub-blocks.
    at, ff, blocks = attention_share(m), 1.0 if moe else dense_mlp_share(m), norms_per_layer(m) / 2
    return LayerActivationParts(
        residual=(4 + (2 if m.hidden_dropout > 0 else 0)) * s * b * h / sp * blocks, attn_input=linear_in * at,
        latents=latents * at, qkv=(_attention_stored(m, plan) - out - latents) * at,
        attn_out=out * (1 - saved / 2) * at, scores=where(no_scores, 0.0, per_score * a * s * s * b / t) * at,
        mlp_input=mlp_input * ff,
        mlp=(_mlp_stored(m, plan, moe) - saved * s * b * f / t - (moe_saved_input_bytes(m, plan) if moe else 0.0)) * ff,
        recurrent=mean_recurrent_activation_bytes(m, s * b, t, sp))


def moe_saved_input_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Bytes an MoE layer's experts save below bf16 on their dispatched rows, one micro-batch, one rank: the
    grouped fc1 keeps each (token, expert) row's input as the recipe's quantised cast for its weight-gradient
    GEMM (SAVED_INPUT_BYTES), not the bf16 rows it received; the permute keeps only its index map. bf16: 0.
    Source: Transformer Engine pytorch/module/grouped_linear.py (forward saves the quantised inputmats,
    columnwise usage, for backward); Megatron-LM moe/moe_utils.py permute (fused: saves row_id_map).
    Derived: docs/formulas.md#mem.activations"""
    if not plan.low_precision:
        return 0.0
    saved = (2.0 - SAVED_INPUT_BYTES[plan.recipe]) * plan.low_precision_layer_fraction
    return saved * dispatched_rows(m, plan) * m.expert_width


def dispatched_rows(m: ModelSpec, plan: ParallelPlan) -> Any:
    """(token, expert) rows of one MoE layer's experts on one rank, one micro-batch: the rank's T = sb/t_sp
    tokens x k x etp, padded to capacity when a capacity factor is set. Derived: docs/formulas.md#mem.activations"""
    tokens = plan.seq_len / plan.cp * plan.micro_batch / where(plan.sp, plan.tp, 1)
    return tokens * plan.etp_resolved * m.num_experts_per_tok * plan.expert_padding


def recomputed_module_bytes(m: ModelSpec, plan: ParallelPlan, moe: bool, parts: LayerActivationParts) -> Any:
    """Bytes of one layer's activations that the selective recompute_modules drop (beyond core_attn's scores,
    which `parts` already leaves out): layernorm the outputs of the norms not fused into a linear (Transformer
    Engine fuses the others into LayerNormLinear: MLA's input norm and an MoE layer's pre-MLP norm are
    separate), mla_up_proj MLA's Q, K, V, mlp / moe the whole MLP but its input (normal checkpointing),
    moe_act the experts' activation output (fc2's input, bf16 or quantised: Megatron makes fc2 save the
    original input and discards it), shared_experts the shared MLP's insides. Source: Megatron-LM
    transformer_config.py (recompute_modules), transformer_layer.py, moe/experts.py, multi_latent_attention.py;
    gpt_layer_specs.py (which norms are fused). Derived: docs/formulas.md#mem.recompute_modules"""
    if not m.is_mla and not moe:
        return where(plan.recomputes("mlp"), parts.mlp_input + parts.mlp, 0.0)
    attn = where(plan.recomputes("layernorm") & m.is_mla, parts.attn_input, 0.0) \
        + where(plan.recomputes("mla_up_proj") & m.is_mla, parts.qkv, 0.0)
    if not moe:
        return attn + where(plan.recomputes("mlp"), parts.mlp_input + parts.mlp, 0.0)
    s, b, t = plan.seq_len / plan.cp, plan.micro_batch, plan.tp
    saved = (2.0 - SAVED_INPUT_BYTES[plan.recipe]) * plan.low_precision_layer_fraction if plan.low_precision else 0.0
    tokens = s * b / where(plan.sp, t, 1)
    routed_rows = tokens * plan.etp_resolved * m.num_experts_per_tok * plan.expert_padding
    act = maximum(2 * routed_rows * m.expert_ffn / plan.etp_resolved - saved * s * b * m.expert_ffn
                  * m.num_experts_per_tok / t, 0.0)
    shared = ((6 if m.gated_mlp else 4) - saved) * s * b * m.shared_ffn / t
    parts_of_moe = where(plan.recomputes("layernorm"), parts.mlp_input, 0.0) \
        + where(plan.recomputes("moe_act"), act, 0.0) + where(plan.recomputes("shared_experts"), shared, 0.0)
    return attn + where(plan.recomputes("moe"), parts.mlp_input + parts.mlp, parts_of_moe)


SAVED_INPUT_BYTES = {"tensorwise": 1.0, "rowwise": 1.0, "blockwise": 1.0 + 4 / 128, "mxfp8": 1.0 + 1 / 32,
                     "nvfp4": 0.5 + 1 / 16}
"""Bytes per element of a GEMM input that a low-precision recipe keeps for backward (the quantised copy the
wgrad GEMM reads, in place of the bf16 input's 2): one fp8 byte (per-tensor; torchao rowwise), with an fp32
scale per 128 (blockwise 1x128 tiles), an E8M0 scale per 32 (MXFP8), or 4 bits and an E4M3 scale per 16
(NVFP4, on the share of layers the recipe quantises). Source: Transformer Engine (the Linear modules save
the quantised input, columnwise usage only, for backward); OCP Microscaling spec; NVIDIA NVFP4 pretraining
(arXiv 2509.25149). Derived: docs/formulas.md#mem.activations"""


def linear_input_split(plan: ParallelPlan) -> Any:
    """How many ways the saved input of a column-parallel linear (QKV, fc1, the output layer) is split across
    the TP group: tp with sequence parallelism as Megatron-LM keeps it (the sequence shard, gathered again in
    backward), 1 under DTensor TP, whose autograd saves the all-gathered input (torchtitan's
    PrepareModuleInput to Replicate), and 1 without SP. Source: Korthikanti et al. 2022 §4.2.2; PyTorch
    torch.distributed.tensor.parallel (ColwiseParallel), torchtitan parallelize_llama.py apply_tp."""
    return where(plan.sp & (plan.tp_impl == "megatron"), plan.tp, 1)


def _attention_stored(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Q, K, V and the attention output (input of the output projection), 2 bytes each, on one TP rank."""
    s, b, t = plan.seq_len / plan.cp, plan.micro_batch, plan.tp
    heads = m.num_attention_heads / t
    if (mla := m.mla) is not None:
        latents = mla.q_rank + mla.kv_lora_rank + mla.qk_rope_head_dim
        return 2 * s * b * (heads * (2 * mla.qk_head_dim + 2 * mla.v_head_dim) + latents)
    d, kvh = m.d_head, kv_heads_per_rank(m, t)
    return 2 * s * b * d * (2 * heads + 2 * kvh)


def _mlp_stored(m: ModelSpec, plan: ParallelPlan, moe: bool) -> Any:
    """MLP activations: 4sbf/t for GELU (fc1 output + GELU output), 6sbf/t gated (fc1 output 2f + product f).

    MoE: each of the rank's input tokens goes to k experts; every (token, expert) row keeps its dispatched
    input (2h; h the latent width of a latent MoE, which also keeps the combined latent rows 2l per token for
    its l -> h projection) and the expert's fc1/activation outputs (c·f_e/etp), plus fp32 router
    probabilities."""
    s, b, t = plan.seq_len / plan.cp, plan.micro_batch, plan.tp
    c = 6 if m.gated_mlp else 4
    if not moe:
        return c * s * b * m.intermediate_size / t
    etp = plan.etp_resolved
    tokens = s * b / where(plan.sp, t, 1)
    rows = tokens * etp * m.num_experts_per_tok * plan.expert_padding  # padded to capacity when a factor is set
    routed = rows * (2 * m.expert_width + c * m.expert_ffn / etp) + tokens * m.num_experts * 4
    latent = 2 * tokens * m.moe_latent_size if m.moe_latent_size else 0.0  # fc2_latent_proj's saved input
    return routed + latent + c * s * b * m.shared_ffn / t


def inflight_microbatches(plan: ParallelPlan, stage: Any) -> Any:
    """Micro-batches whose activations pipeline rank `stage` holds at its peak, in whole-stage units.

    1F1B: min(pp - i, m). Interleaved: (2(pp-i-1) + (vpp-1)·pp + 1) chunk micro-batches of 1/vpp of the
    stage each, which for i = 0 is L·(1 + (pp-1)/(pp·vpp)) layers' worth (Korthikanti et al. 2022, §4.2.3).
    Derived: docs/formulas.md#mem.inflight (warm-up counts of Megatron-LM's schedules)."""
    p, v, n = plan.pp, plan.vpp, plan.num_microbatches
    extra = schedule_of(plan).extra_inflight  # DualPipe keeps PP + 1 (DeepSeek-V3 Table 2)
    plain = minimum(p - stage + extra, n)
    interleaved = minimum(2 * (p - stage - 1) + (v - 1) * p + 1, n * v) / v
    return where(v == 1, plain * 1.0, interleaved)


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

    PARTS: ClassVar[tuple[str, ...]] = ("layers", "recompute_working", "embedding", "output")

    layers: Any
    """Transformer layers x micro-batches in flight."""
    recompute_working: Any
    """Full recompute: one layer's activations rebuilt during its backward (selective recompute_modules: the
    parts of one layer they dropped)."""
    embedding: Any
    """First stage: embedding dropout masks of the micro-batches in flight."""
    output: Any
    """Last stage: input of the output layer and fp32 logits for the loss."""


@dataclass(frozen=True)
class LayerActivations:
    """Per-layer activation bytes of one micro-batch, the same on every stage (computed once per plan)."""

    dense: Any
    moe: Any
    working_dense: Any
    """Full recompute: a dense layer's activations rebuilt in its backward."""
    working_moe: Any
    kept_dense: Any = 0.0
    """A dense layer that full recompute leaves out (block method): all its activations stay."""
    kept_moe: Any = 0.0
    rebuilt_dense: Any = 0.0
    """Selective recompute_modules: what a dense layer's backward rebuilds (recomputed_module_bytes)."""
    rebuilt_moe: Any = 0.0


def layer_activations(m: ModelSpec, plan: ParallelPlan) -> LayerActivations:
    dense = layer_activation_bytes(m, plan, False)
    working_dense = layer_activation_no_recompute(m, plan, False, scores=False)
    block = plan.recompute_layers is not None  # only block recompute keeps some layers whole
    kept_dense = layer_activation_no_recompute(m, plan, False, scores=True) if block else 0.0
    rebuilt_dense = _rebuilt(m, plan, False)
    if not m.is_moe:
        return LayerActivations(dense, 0.0, working_dense, working_dense, kept_dense, kept_dense,
                                rebuilt_dense, rebuilt_dense)
    return LayerActivations(dense, layer_activation_bytes(m, plan, True), working_dense,
                            layer_activation_no_recompute(m, plan, True, scores=False), kept_dense,
                            layer_activation_no_recompute(m, plan, True, scores=True) if block else 0.0,
                            rebuilt_dense, _rebuilt(m, plan, True))


def _rebuilt(m: ModelSpec, plan: ParallelPlan, moe: bool) -> Any:
    """The activations selective recompute_modules rebuild in one layer's backward (0 without them)."""
    if not plan.recompute_modules:
        return 0.0
    return recomputed_module_bytes(m, plan, moe, layer_activation_parts(m, plan, moe, scores=True))


def activation_bytes(m: ModelSpec, plan: ParallelPlan, stage: Any,
                     per_layer: LayerActivations | None = None) -> ActivationBytes:
    """Activation bytes of pipeline rank `stage` at its peak.

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
    # Full / op recompute rebuild one whole layer in its backward; selective recompute_modules the parts they
    # dropped of one layer (Derived: docs/formulas.md#mem.recompute_modules).
    rebuilt = where(n_moe > 0, maximum(la.rebuilt_moe, where(n_dense > 0, la.rebuilt_dense, 0.0)), la.rebuilt_dense)
    working = where(plan.full | plan.op, where(n_moe > 0, la.working_moe, la.working_dense), rebuilt)
    embedding = where(stage == 0, inflight * s * b * h / sp, 0.0)
    heads = 1 + m.num_nextn_predict_layers  # each MTP module keeps its own head input and logits
    logit_bytes = where(plan.fused_loss, 4.0, LOGIT_BYTES_UNFUSED)
    output = where(stage == plan.pp - 1,
                   heads * (2 * s * b * h / linear_input_split(plan) + logit_bytes * s * b * V / t), 0.0)
    return ActivationBytes(layers=held, recompute_working=working, embedding=embedding, output=output)


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
    """The stated allowance: fixed runtime bytes, fragmentation, ZeRO-3 gathered-layer buffers."""
    activation_parts: ActivationBytes
    capacity: float

    @property
    def fits(self) -> Any:
        return self.total <= self.capacity

    @property
    def headroom(self) -> Any:
        return self.capacity - self.total


def stage_memory(m: ModelSpec, plan: ParallelPlan, stage: Any, allowance: MemoryAllowance,
                 capacity: float, fp8_tn_only: bool = True) -> TrainingMemory:
    """Memory of one rank of pipeline stage `stage`. Derived: docs/formulas.md#mem.total"""
    weight_b, grad_b, optim_b = plan.weight_bytes, plan.grad_bytes, plan.optimizer_bytes
    # FSDP's fp32 parameter shard is the optimizer's master copy: no separate compute-dtype shard.
    # Source: PyTorch torch.distributed.fsdp.MixedPrecisionPolicy docstring. Derived: docs/formulas.md#mem.model_states
    fp32_shards = (plan.zero >= 3) & (plan.fp32_param_shards and plan.dtype != "fp32")
    state_w, state_o = where(fp32_shards, 4.0, weight_b), where(fp32_shards, optim_b - plan.master_bytes, optim_b)
    rp = rank_params(m, plan, stage)
    copies = schedule_of(plan).param_copies  # DualPipe: each rank holds stages i and pp-1-i
    if copies != 1:
        rp = RankParams(dense=copies * rp.dense, expert=copies * rp.expert)
    dense = model_state_bytes(rp.dense, plan.zero_shard, plan.zero, state_w, grad_b, state_o)
    expert = model_state_bytes(rp.expert, plan.expert_dp, plan.zero, state_w, grad_b, state_o)
    act = per_distinct(plan, ALL_BUT_ZERO, stage, lambda p, s: activation_bytes(
        m, p, s, memoized(p, ("layer_activations", m), lambda: layer_activations(m, p))))
    cache = low_precision_weight_cache(m, plan, rp, stage, fp8_tn_only)
    tensors = dense.total + expert.total + act.total + cache
    layers = maximum(stage_layer_count(m, plan, stage), 1)
    live = minimum(2 * rp.total / layers, ZERO3_MAX_LIVE_PARAMS)
    # ZeRO-2/3 under a pipeline keep the stage's gradients unsharded (and ZeRO-3 its weights gathered) until
    # the last micro-batch: PyTorch pipelining with FSDP2. Derived: docs/formulas.md#mem.other
    piped = plan.pp > 1
    gradients = where((plan.zero >= 2) & piped, rp.total * grad_b, dense.gradients + expert.gradients)
    tensors = tensors + gradients - (dense.gradients + expert.gradients)
    gathered = where(plan.zero >= 3, where(piped, rp.total, live) * weight_b, 0.0)
    other = allowance.fixed_gib * GIB + allowance.fragmentation * (tensors + gathered) + gathered
    return TrainingMemory(
        stage=stage, params_on_rank=rp.total, weights=dense.weights + expert.weights + cache,
        gradients=gradients, optimizer=dense.optimizer + expert.optimizer,
        activations=act.total, other=other, activation_parts=act, capacity=capacity,
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


def each_stage(stages: tuple[Any, ...], f: Any) -> list[Any]:
    """f of every candidate stage, computed once for a stage that appears twice (the same value object)."""
    done: dict[int, Any] = {}
    for stage in stages:
        if id(stage) not in done:
            done[id(stage)] = f(stage)
    return [done[id(stage)] for stage in stages]


def training_memory(m: ModelSpec, plan: ParallelPlan, capacity: float,
                    allowance: MemoryAllowance | None = None, fp8_tn_only: bool = True) -> TrainingMemory:
    """Memory per GPU of the most-loaded rank (elementwise for plan arrays); `fp8_tn_only`: the GPU's
    GpuSpec.fp8_tn_only (Hopper keeps transposed fp8 weight copies, Blackwell does not)."""
    allowance = allowance or MemoryAllowance()
    results = each_stage(candidate_stages(m, plan),
                         lambda stage: stage_memory(m, plan, stage, allowance, capacity, fp8_tn_only))
    totals = [r.total for r in results]
    if any(isinstance(t, np.ndarray) for t in totals):  # plan arrays: the first stage with the largest total
        return _choose(np.argmax(np.stack(np.broadcast_arrays(*totals)), axis=0), results)
    best = results[0]
    for r in results[1:]:
        best = _pick(r.total > best.total, r, best)
    return best


def _choose(which: np.ndarray, results: list[TrainingMemory]) -> TrainingMemory:
    """Fieldwise results[which] over breakdowns of plan arrays (what the chain of _pick selects, in one pass)."""
    flat = which * len(which) + np.arange(len(which))  # the chosen element in the stages' stacked values

    def pick(get: Any) -> np.ndarray:
        return np.stack([np.broadcast_to(get(r), which.shape) for r in results]).ravel().take(flat)

    act = ActivationBytes(*(pick(lambda r, f=f: getattr(r.activation_parts, f))
                            for f in ("layers", "recompute_working", "embedding", "output")))
    fields = ("stage", "params_on_rank", "weights", "gradients", "optimizer", "activations", "other")
    return TrainingMemory(**{f: pick(lambda r, f=f: getattr(r, f)) for f in fields}, activation_parts=act,
                          capacity=results[0].capacity)


def _pick(cond: Any, a: TrainingMemory, b: TrainingMemory) -> TrainingMemory:
    """Fieldwise `a if cond else b` over two breakdowns (elementwise for arrays)."""
    act = ActivationBytes(*(where(cond, getattr(a.activation_parts, f), getattr(b.activation_parts, f))
                            for f in ("layers", "recompute_working", "embedding", "output")))
    fields = ("stage", "params_on_rank", "weights", "gradients", "optimizer", "activations", "other")
    return TrainingMemory(**{f: where(cond, getattr(a, f), getattr(b, f)) for f in fields},
                          activation_parts=act, capacity=a.capacity)
