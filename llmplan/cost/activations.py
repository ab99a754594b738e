"""Training activations of one transformer layer: the bytes one micro-batch keeps for backward on one rank, by
module, under each recompute mode (none, selective, recompute_modules, op-level, full) and low-precision recipe.

All functions are pure and return bytes. They work on one ParallelPlan (Python numbers) and, unchanged, on
search.grid.PlanArrays (numpy arrays of many plans): see llmplan/arith.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from llmplan.arith import maximum, where
from llmplan.cost.breakdown import Breakdown
from llmplan.cost.compressed import compressor_token_bytes, hc_activation_bytes, is_v4_attention
from llmplan.cost.compute import QUANTIZED_COPY_BYTES, attention_head_dims, op_matmul_widths
from llmplan.cost.elementwise import fp32_softmax
from llmplan.cost.gemm import fused_grouped_mlp
from llmplan.cost.memo import ALL_BUT_ZERO, memoized, per_distinct
from llmplan.cost.mixers import attention_share, dense_mlp_share, mean_recurrent_activation_bytes, norms_per_layer
from llmplan.cost.params import kv_heads_per_rank, token_ffn_width
from llmplan.cost.quantize import proj_saves_original_input, torchao_fp8_copy_share, torchao_hp_saved_share
from llmplan.cost.sparse_gather import asked_indexer_loss, fused_csa
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan, cp_a2a_group, cp_ring_size


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
                                        "mlp", "recurrent", "cp_a2a_out")
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
    cp_a2a_out: Any = 0.0
    """Transformer Engine's a2a context parallelism: the attention output kept in its head-split layout beside
    the output projection's input (cp_a2a_saved_bytes); 0 otherwise."""


FP32_SOFTMAX_SAVED_BYTES = (4.0, 2.0)
"""Bytes per score Megatron's fp32 torch softmax (cost.elementwise.fp32_softmax) keeps for backward beyond what
the fused kernel's path keeps, without and with attention dropout. torch softmax saves its fp32 output
(_softmax_backward_data reads it: 4); the casts and the scalar scale save nothing, masked_fill_ only the one
s x s bool mask shared by the batch and heads. Without dropout the matmul over V keeps the 16-bit cast of the
probabilities, as it keeps the fused kernel's output (2 either way): 4 more. With dropout the matmul keeps the
dropout's output and dropout its 1-byte mask, as on the fused path, where the kernel's backward also keeps its
16-bit output (2 + 1 + 2 = 5); the fallback's 16-bit cast is kept by nothing (4 + 1 + 2 = 7): 2 more.
Source: NVIDIA/Megatron-LM@d98e8a64dd megatron/core/fusions/fused_softmax.py (forward_torch_softmax),
megatron/core/transformer/dot_product_attention.py (attention_dropout of scale_mask_softmax's output, then
bmm with V); PyTorch tools/autograd/derivatives.yaml (_softmax: result; native_dropout: the mask; bmm: both
inputs; _to_copy, mul by a scalar: none). Derived: docs/formulas.md#compute.softmax_fallback"""


def fp32_softmax_saved_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """FP32_SOFTMAX_SAVED_BYTES (without or with the model's attention dropout) where the scores' softmax runs as
    fp32 torch ops (cost.elementwise.fp32_softmax: Megatron's, with the model's attention sinks, or Transformer
    Engine's, whose saved tensors are the same), else 0. Derived: docs/formulas.md#compute.softmax_fallback,
    #compute.te_softmax"""
    return where(fp32_softmax(m, plan), FP32_SOFTMAX_SAVED_BYTES[m.attention_dropout > 0], 0.0)


def layer_activation_parts(m: ModelSpec, plan: ParallelPlan, moe: bool, scores: bool = True) -> LayerActivationParts:
    """One layer's stored activations by module (LayerActivationParts). Derived: docs/formulas.md#mem.activations"""
    s, b, h, a, t = plan.seq_len / plan.cp, plan.micro_batch, m.hidden_size, m.num_attention_heads, plan.tp
    sp = where(plan.sp, t, 1)
    # Two norm inputs (4sbh), two 1-byte dropout masks (2sbh) when the model uses hidden dropout; the QKV and
    # MLP inputs (2sbh each): DTensor TP keeps them gathered (tp_impl).
    saved = saved_input_discount(m, plan)
    linear_in = (2.0 - saved) * s * b * h / linear_input_split(plan)
    no_scores = plan.flash_attention | plan.recomputes("core_attn") if scores else plan.flash_attention
    # Softmax output (2 bytes per score), and with attention dropout its mask (1) and output (2); Megatron's fp32
    # torch softmax keeps its fp32 output too, and with dropout no 16-bit one (4 or 2: fp32_softmax_saved_bytes)
    per_score = (5 if m.attention_dropout > 0 else 2) + fp32_softmax_saved_bytes(m, plan)
    f = token_ffn_width(m, moe)
    # The core's output, the output projection's input: kept once at 2 bytes where linear_proj saves the core's
    # own bf16 tensor (proj_saves_original_input), else as the projection's quantised copy, beside the fused
    # core's own bf16 output where TE's core keeps it (core_output_beside_copy: fp8 delayed scaling).
    out = 2 * s * b * a * attention_head_dims(m)[1] / t
    latents = 2 * s * b * latent_width(m)
    # An MoE layer's router reads the pre-MLP norm's output unquantised and keeps it (2sbh); the experts' fc1
    # reads the dispatched rows and keeps their quantised cast (moe_saved_input_bytes).
    # A shared expert's fc1 saves its quantised copy beside it where it has no save_original_input (delayed scaling).
    mlp_input = (2.0 + shared_fc1_copy_share(m, plan) * quantized_saved_bytes(plan)) * s * b * h \
        / linear_input_split(plan) if moe else linear_in
    # A hybrid's average layer (mixers.py): its share of attention layers, of dense MLPs, of sub-blocks.
    at, ff, blocks = attention_share(m), 1.0 if moe else dense_mlp_share(m), norms_per_layer(m) / 2
    return LayerActivationParts(
        residual=(4 + (2 if m.hidden_dropout > 0 else 0)) * s * b * h / sp * blocks + hc_saved_bytes(m, plan),
        attn_input=linear_in * at,
        latents=latents * at, qkv=(_attention_stored(m, plan) - out - latents) * at,
        attn_out=out * (1 - saved * (1 - proj_saves_original_input(plan)) / 2 + core_output_beside_copy(m, plan)) * at,
        scores=where(no_scores, 0.0, per_score * a * s * s * b / t) * at,
        mlp_input=mlp_input * ff,
        mlp=(_mlp_stored(m, plan, moe) - saved * s * b * f / t - (moe_saved_input_bytes(m, plan) if moe else 0.0)) * ff,
        recurrent=mean_recurrent_activation_bytes(m, s * b, t, sp),
        cp_a2a_out=cp_a2a_saved_bytes(m, plan, out, scores) * at)


def unflagged_copy_share(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Share of layers on which a Transformer Engine linear whose input another module keeps in bf16 saves its
    own quantised copy beside it, Megatron-Core not having set save_original_input there: a Megatron-Core / TE
    stack (tp_impl megatron, not ep_dispatch_fp8) under a low-precision recipe without the flag
    (proj_saves_original_input 0: fp8 delayed scaling), on the share of layers in the low format (a bf16 layer's
    linear saves the same tensor). 0 elsewhere (torchao's Float8Linear: torchao_fp8_copy_share).
    Source: NVIDIA/Megatron-LM d98e8a64dd megatron/core/transformer/attention.py, moe/shared_experts.py (the
    flag set under fp8 with fp8_recipe != 'delayed' or fp4: "the output of the fused core_attn is saved by
    itself, and linear_proj also saves the quantized tensor of this output"; "the output of pre_mlp_layernorm is
    saved by router, and the shared expert linear_fc1 also saves the quantized tensor of this output").
    Derived: docs/formulas.md#precision.save_original_input"""
    if not plan.low_precision or plan.tp_impl != "megatron" or plan.recipe == "rowwise":
        return 0.0
    share = (1 - proj_saves_original_input(plan)) * plan.low_precision_layer_fraction(m.num_hidden_layers)
    return where(plan.ep_dispatch_fp8, 0.0, share)


def core_output_beside_copy(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Share of layers on which the attention core's bf16 output stays saved beside the output projection's
    quantised copy (unflagged_copy_share; torchao's Float8Linear where it saves an fp8 copy, torchao_fp8_copy_share):
    the fused core in bf16 (flash_attention, not fp8_attention) saves its output for its own backward (the
    softmax gradient's rowsum(dO·O)) unless core_attn recompute discards it; an unfused core saves the scores and
    V, not its output. Source: NVIDIA/TransformerEngine d0067d0da6
    pytorch/attention/dot_product_attention/backends.py (FusedAttnFunc.forward: f16_tensors = (q, k, v, out_f16)
    saved); PyTorch aten/src/ATen/native/transformers (_scaled_dot_product_flash_attention returns the output
    and log-sum-exp its backward takes). Derived: docs/formulas.md#precision.save_original_input"""
    dropped = plan.recomputes("core_attn") | plan.fp8_attention
    copy = unflagged_copy_share(m, plan) + torchao_fp8_copy_share(m, plan)
    return where(dropped, 0.0, where(plan.flash_attention, copy, 0.0))


def shared_fc1_copy_share(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Share of MoE layers on which the shared expert's fc1 saves its quantised input (the pre-MLP norm's output on
    the rank's sequence shard) beside the router's bf16 copy (unflagged_copy_share); 0 without a shared expert or
    with shared_experts recompute (the checkpoint keeps neither). Source: NVIDIA/Megatron-LM d98e8a64dd
    moe/shared_experts.py (SharedExpertMLP.__init__). Derived: docs/formulas.md#precision.save_original_input"""
    if not m.shared_ffn:
        return 0.0
    return where(plan.recomputes("shared_experts"), 0.0, unflagged_copy_share(m, plan))


def te_cp_tensor_bytes(m: ModelSpec, plan: ParallelPlan) -> tuple[Any, Any, Any]:
    """(Q, K, V) bytes of one softmax-attention layer on one rank as Transformer Engine's context-parallel
    attention gets them: the rank's s/cp tokens of its TP rank's heads, bf16; MLA's K and V at the query heads,
    q and k qk_head_dim wide, v v_head_dim (else d_head). Derived: docs/formulas.md#mem.cp_comm"""
    tokens = 2 * plan.seq_len / plan.cp * plan.micro_batch
    if (mla := m.mla) is not None:
        hq = hkv = m.num_attention_heads / plan.tp
        dqk, dv = mla.qk_head_dim, mla.v_head_dim
    else:
        hq, hkv, dqk, dv = m.num_attention_heads / plan.tp, kv_heads_per_rank(m, plan.tp), m.d_head, m.d_head
    return tokens * hq * dqk, tokens * hkv * dqk, tokens * hkv * dv


def cp_a2a_saved_bytes(m: ModelSpec, plan: ParallelPlan, out: Any, stored: bool) -> Any:
    """What Transformer Engine's a2a context parallelism (cp_impl te, cp_comm_type a2a, cp > 1) saves for
    backward beyond p2p, per softmax-attention layer: its saved q, k, v, out are the post-all-to-all tensors
    (all s tokens, heads/cp: as many bytes as the rank's s/cp tokens of all heads), but the output it saves
    (out_part) is not the tensor it returns (out_, after the reverse all-to-all), which the output projection
    keeps as its input: one more output, `out` bytes. p2p and all_gather save and return the same output, and
    all_gather saves the rank's own K and V chunk (it gathers them again in backward): nothing more. `stored`:
    the bytes kept (core_attn recompute checkpoints the core and drops it); else a rebuilt layer's working set.
    Source: NVIDIA/TransformerEngine@d0067d0da6 transformer_engine/pytorch/attention/dot_product_attention/
    context_parallel.py (AttnFuncWithCPAndQKVOA2A.forward: f16_tensors = (q_part, k_part, v_part, out_part),
    out_ = flash_attn_a2a_communicate(out_, ...), out_ret = out_f16 = out_; AttnFuncWithCPAndKVAllGather.forward:
    f16_tensors = (q, k, v, out_f16), out_ret = out_f16). a2a+p2p alike where its a2a level has 2 or more ranks
    (AttnFuncWithCPAndKVP2P.forward: out_f16 = out_part saved, out_ret after the a2a of out).
    Derived: docs/formulas.md#mem.cp_comm"""
    if plan.cp_impl != "te" or plan.cp_comm_type not in ("a2a", "a2a+p2p"):  # workload switches: one value
        return 0.0
    kept = where(plan.recomputes("core_attn"), 0.0, out) if stored else out
    return where((plan.cp > 1) & (cp_a2a_group(plan) > 1) if plan.cp_comm_type == "a2a+p2p" else plan.cp > 1,
                 kept, 0.0)


def te_cp_out_lse_bytes(m: ModelSpec, plan: ParallelPlan) -> tuple[Any, Any]:
    """(O, L) bytes of one softmax-attention layer on one rank as Transformer Engine's context-parallel attention
    makes them: the output, the rank's s/cp tokens of its TP rank's query heads at v's head width (bf16), and the
    softmax statistics, one fp32 per query head and token. Derived: docs/formulas.md#mem.cp_comm"""
    tokens = plan.seq_len / plan.cp * plan.micro_batch
    heads = m.num_attention_heads / plan.tp
    dv = m.mla.v_head_dim if m.mla is not None else m.d_head
    return 2 * tokens * heads * dv, 4 * tokens * heads


def p2p_ring_workspace_bytes(m: ModelSpec, plan: ParallelPlan, ring: Any = None) -> Any:
    """Transient bytes of Transformer Engine's p2p K/V ring (AttnFuncWithCPAndKVP2P, bf16, causal with 2cp
    chunks, cp > 1) beyond the layer's own Q, K, V, O and their gradients, the larger of its two passes, on the
    rank where it peaks. Forward, at the output correction (every list still referenced): the cp K/V buffers
    (the cat copy of k, v and cp - 1 received ones: cp(K + V)) and each step's output and softmax statistics
    (rank r: r + 1 full steps and cp - 1 - r steps of the second half of q; rank cp - 1: cp(O + L)). Backward,
    at the last (diagonal) step: the two [2, K + V] send/receive buffers of K/V and dK/dV (4(K + V), one K + V of
    which becomes the returned dK, dV), that step's dq, dk, dv pieces (Q + K + V) and the second half of the
    softmax statistics copied contiguous (L/2): Q + 4(K + V) + L/2.
    Source: NVIDIA/TransformerEngine@d0067d0da6 transformer_engine/pytorch/attention/dot_product_attention/
    context_parallel.py (AttnFuncWithCPAndKVP2P.forward: p2p_comm_buffers[0] = torch.cat((k.view(-1),
    v.view(-1))), p2p_comm_buffers[i + 1] = torch.empty_like(...), out_per_step, softmax_lse_per_step;
    cp_p2p_fwd_prepare_qkv sections; AttnFuncWithCPAndKVP2P.backward: p2p_comm_buffers = two torch.empty((2,
    *kv.shape)), dq_buffer = torch.empty_like(q), softmax_lse_[..., 1, :].contiguous(), cp_p2p_bwd_fused_attn
    dq_, dk_, dv_). `ring`: its ranks (cp, or cp_ring_size under a2a+p2p, whose post-a2a Q, K, V, O and L have
    the bytes of the rank's s/cp tokens of all its heads). Derived: docs/formulas.md#mem.cp_comm"""
    q, k, v = te_cp_tensor_bytes(m, plan)
    o, lse = te_cp_out_lse_bytes(m, plan)
    forward = (plan.cp if ring is None else ring) * (k + v + o + lse)
    backward = q + 4 * (k + v) + lse / 2
    return maximum(forward, backward)


def cp_comm_workspace_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Transient bytes one softmax-attention layer's context-parallel collectives hold at their peak beyond the
    layer's own Q, K, V and their gradients (one layer at a time), Transformer Engine (cp_impl te), cp > 1:
    a2a: each all-to-all of [q, k, v] (forward) and [dq, dk, dv] (backward) holds a contiguous send copy and a
    received (re-ordered) copy of each while the originals stay referenced: 2(Q + K + V). all_gather, the
    backward (the larger pass): the gathered K and V (cp(K + V)), the full-length dK and dV (cp(K + V)), the two
    steps' dK/dV pieces over their visible K/V range under a causal mask ((r + 1) + (2cp - r) of 2cp chunks on
    rank r: (cp + 1/2)(K + V)) and the re-ordered copy of dK (then dV) before the reduce-scatter (cp max(K, V)).
    p2p: its ring's K/V (and dK/dV) buffers and per-step pieces (p2p_ring_workspace_bytes). a2a+p2p: the larger
    of its a2a level's 2(Q + K + V) (where that level has 2 or more ranks) and its ring's workspace at the ring's
    cp_ring_size ranks (docs/formulas.md#comm.cp_hierarchical).
    Source: NVIDIA/TransformerEngine@d0067d0da6 context_parallel.py
    (flash_attn_a2a_communicate: movedim(...).contiguous() / reorder, torch.empty_like output;
    AttnFuncWithCPAndKVAllGather.backward: gather_along_first_dim of k and v, torch.zeros dk, dv of
    k_shape[0] * cp_size, dk_per_step / dv_per_step, get_kv_seq_info_after_all_gather, torch.index_select,
    reduce_scatter_along_first_dim). Derived: docs/formulas.md#mem.cp_comm"""
    if plan.cp_impl != "te" or m.num_attention_layers == 0:
        return 0.0
    cp = plan.cp
    if plan.cp_comm_type == "p2p":
        return where(cp > 1, p2p_ring_workspace_bytes(m, plan), 0.0)
    q, k, v = te_cp_tensor_bytes(m, plan)
    if plan.cp_comm_type == "a2a+p2p":
        a2a = where(cp_a2a_group(plan) > 1, 2 * (q + k + v), 0.0)
        return where(cp > 1, maximum(a2a, p2p_ring_workspace_bytes(m, plan, cp_ring_size(plan))), 0.0)
    if plan.cp_comm_type == "a2a":
        return where(cp > 1, 2 * (q + k + v), 0.0)
    return where(cp > 1, (3 * cp + 0.5) * (k + v) + cp * maximum(k, v), 0.0)


def hc_saved_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Bytes one layer's hyper-connections keep for backward (part of the residual), one micro-batch, one rank:
    hc_activation_bytes per token, split over the TP ranks with SP as the residual stream is (0 for a plain
    residual). Derived: docs/formulas.md#compressed.hyper_connections"""
    return hc_activation_bytes(m) * (plan.seq_len / plan.cp) * plan.micro_batch / where(plan.sp, plan.tp, 1)


def moe_saved_input_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Bytes an MoE layer's experts save below bf16 on their dispatched rows, one micro-batch, one rank: the
    grouped fc1 keeps each (token, expert) row's input as the recipe's quantised cast for its weight-gradient
    GEMM (SAVED_INPUT_BYTES), not the bf16 rows it received; the permute keeps only its index map. bf16: 0.
    Source: Transformer Engine pytorch/module/grouped_linear.py (forward saves the quantised inputmats,
    columnwise usage, for backward); Megatron-LM moe/moe_utils.py permute (fused: saves row_id_map).
    Derived: docs/formulas.md#mem.activations"""
    return saved_input_discount(m, plan) * dispatched_rows(m, plan) * m.expert_width


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
    original input and discards it), shared_experts the shared MLP's insides, mhc the hyper-connections'
    streams and weights (hc_activation_bytes). Source: Megatron-LM
    transformer_config.py (recompute_modules), transformer_layer.py, moe/experts.py, multi_latent_attention.py;
    gpt_layer_specs.py (which norms are fused). Derived: docs/formulas.md#mem.recompute_modules"""
    if not m.is_mla and not moe and m.hc_mult == 1 and not m.q_lora_rank:
        return where(plan.recomputes("mlp"), parts.mlp_input + parts.mlp, 0.0)
    up = m.is_mla or bool(m.q_lora_rank)  # DeepSeek-V4 recomputes its query up-projection under mla_up_proj
    attn = where(plan.recomputes("layernorm") & m.is_mla, parts.attn_input, 0.0) \
        + where(plan.recomputes("mla_up_proj") & up, parts.qkv, 0.0) \
        + where(plan.recomputes("mhc"), hc_saved_bytes(m, plan), 0.0)  # the hyper-connections' streams, weights
    if not moe:
        return attn + where(plan.recomputes("mlp"), parts.mlp_input + parts.mlp, 0.0)
    s, b, t = plan.seq_len / plan.cp, plan.micro_batch, plan.tp
    saved = saved_input_discount(m, plan)
    tokens = s * b / where(plan.sp, t, 1)
    routed_rows = tokens * plan.etp_resolved * m.num_experts_per_tok * plan.expert_padding
    clamp = glu_clamp_saved_bytes(m, plan)
    # the fused GLU's layers keep fc2's input (and any clamp copy) whatever moe_act says (fused_moe_act_kept_share)
    kept = fused_moe_act_kept_share(m, plan) * (quantized_saved_bytes(plan) + clamp)
    act = maximum((2 + clamp) * routed_rows * m.expert_ffn / plan.etp_resolved
                  - saved * s * b * m.expert_ffn * m.num_experts_per_tok / t
                  - kept * routed_rows * m.expert_ffn / plan.etp_resolved, 0.0)
    shared = (mlp_inner_bytes(m, plan) - saved) * s * b * m.shared_ffn / t
    parts_of_moe = where(plan.recomputes("layernorm"), parts.mlp_input, 0.0) \
        + where(plan.recomputes("moe_act"), act, 0.0) + where(plan.recomputes("shared_experts"), shared, 0.0)
    return attn + where(plan.recomputes("moe"), parts.mlp_input + parts.mlp, parts_of_moe)


def fused_moe_act_kept_share(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Share of an MoE model's layers whose experts' activation output moe_act recompute cannot drop: those that
    run Transformer Engine's fused MXFP8 grouped MLP (cost.gemm.fused_grouped_mlp, on the share of layers in
    MXFP8) with a GLU. There fc1's grouped GEMM writes fc2's input in its epilogue and the fused op saves its
    columnwise MXFP8 copy for fc2's wgrad with fc1's bf16 output; Megatron-Core's fused branch checkpoints nothing
    and passes moe_act only as activation_recompute_in_mlp, which TE v2.17 honours for squared ReLU alone (the
    dSReLU epilogue rebuilds fc2's input, which is then not saved) and TE v2.16 does not take. 0 for squared
    ReLU and off the fused path. Source: NVIDIA/TransformerEngine transformer_engine/pytorch/ops/fused/
    forward_grouped_mlp.py at v2.16 (fc1_ctx / swiglu_ctx / fc2_ctx.save_for_backward; rowwise_data = None) and
    ops/fused/grouped_mlp.py at v2.17.1 (recompute_srelu_fc2_x, saved_grouped_fc2_x); NVIDIA/Megatron-LM
    megatron/core/transformer/moe/experts.py at d98e8a6 (_make_fused_ops: activation_recompute_in_mlp).
    Derived: docs/formulas.md#mem.fused_mlp_saved"""
    if not (m.is_moe and m.gated_mlp):
        return 0.0
    return where(fused_grouped_mlp(m, plan), plan.low_precision_layer_fraction(m.num_hidden_layers), 0.0)


def quantized_saved_bytes(plan: ParallelPlan) -> float:
    """Bytes per element of a GEMM input the recipe keeps quantised for backward (SAVED_INPUT_BYTES; 2 in bf16).
    Derived: docs/formulas.md#mem.activations"""
    return SAVED_INPUT_BYTES[plan.recipe] if plan.low_precision else 2.0


SAVED_INPUT_BYTES = QUANTIZED_COPY_BYTES
"""Bytes per element of a GEMM input that a low-precision recipe keeps for backward (the quantised copy the
wgrad GEMM reads, in place of the bf16 input's 2): one quantised copy of the recipe (cost.quantize.
QUANTIZED_COPY_BYTES: one fp8 byte, with its block scales; NVFP4 4 bits and an E4M3 scale per 16, on the share
of layers the recipe quantises). Source: Transformer Engine (the Linear modules save
the quantised input, columnwise usage only, for backward); OCP Microscaling spec; NVIDIA NVFP4 pretraining
(arXiv 2509.25149). Derived: docs/formulas.md#mem.activations"""


def saved_input_discount(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Bytes per element a low-precision recipe saves below bf16 on a GEMM input it keeps for backward, averaged
    over the layers: (2 - SAVED_INPUT_BYTES) on the share of layers in the low format that save the quantised
    copy (the bf16 layers keep 2; so do the layers whose torchao Float8Linear saves its bf16 input,
    torchao_hp_saved_share: one tensor however many linears read it); 0 in bf16.
    Derived: docs/formulas.md#mem.activations, docs/formulas.md#precision.torchao_saved_input"""
    if not plan.low_precision:
        return 0.0
    share = plan.low_precision_layer_fraction(m.num_hidden_layers) - torchao_hp_saved_share(m, plan)
    return (2.0 - SAVED_INPUT_BYTES[plan.recipe]) * share


def swiglu_input_bytes(m: ModelSpec, plan: ParallelPlan) -> float:
    """Bytes per element of the activation's input (the first linear's 2f-wide output) that a gated MLP keeps for
    backward: 2 (bf16), or with swiglu_fp8_input one fp8 byte, with the recipe's scale where it quantises in
    blocks (blockwise: an fp32 scale per 1x128 tile, DeepSeek-V3's format; MXFP8: E8M0 per 32; NVFP4 recipes
    still cast this input to fp8). Source: Megatron-LM megatron/core/fusions/fused_bias_swiglu.py
    (fp8_input_store saves input.to(torch.float8_e4m3fn) and casts it back in backward, since core_v0.10.0);
    DeepSeek-V3 report (arXiv 2412.19437) §3.3.3 Low-Precision Activation (2). Derived:
    docs/formulas.md#mem.swiglu_fp8_input"""
    if not (plan.swiglu_fp8_input and m.gated_mlp):
        return 2.0
    return max(SAVED_INPUT_BYTES[plan.recipe], 1.0) if plan.low_precision else 1.0


def mlp_inner_bytes(m: ModelSpec, plan: ParallelPlan) -> float:
    """Bytes an MLP keeps per (token, ffn column) beside its input: GELU the fc1 and GELU outputs (2 + 2);
    gated the 2f-wide fc1 output (the SwiGLU input, swiglu_input_bytes each) and the product (2): 6 in bf16.
    Source: Korthikanti et al. 2022, Table 2 (fc1 and GeLU outputs, 8sbh each at f = 4h).
    Derived: docs/formulas.md#mem.swiglu_fp8_input"""
    return 2 * swiglu_input_bytes(m, plan) + 2.0 if m.gated_mlp else 4.0


def glu_clamp_saved_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Bytes per (token, expert) row and expert-FFN column that the routed experts' eager clamp keeps beyond the
    fused activation's saved input: each clamp saves its input for its backward (the 2f-wide fc1 output, 4
    bytes) while the compiled activation saves the clamped concatenation, a second 2f-wide copy. 0 without a
    clamp (ModelSpec.swiglu_limit) or with it fused (ParallelPlan.glu_clamp_fusion); moe_act recompute drops
    it with the activation's output (recomputed_module_bytes). Source: NVIDIA/Megatron-LM
    megatron/core/fusions/fused_bias_geglu.py (weighted_bias_quick_geglu_impl, WeightedQuickGeGLUFunction
    save_for_backward), core_v0.15.0 - core_v0.19.0; PyTorch derivatives.yaml (clamp saves self).
    Derived: docs/formulas.md#moe.glu_clamp"""
    if not (m.is_moe and m.gated_mlp and m.swiglu_limit is not None):
        return 0.0
    return where(plan.glu_clamp_fusion, 0.0, 4.0)


def linear_input_split(plan: ParallelPlan) -> Any:
    """How many ways the saved input of a column-parallel linear (QKV, fc1, the output layer) is split across
    the TP group: tp with sequence parallelism as Megatron-LM keeps it (the sequence shard, gathered again in
    backward), 1 under DTensor TP, whose autograd saves the all-gathered input (torchtitan's
    PrepareModuleInput to Replicate), and 1 without SP. Source: Korthikanti et al. 2022 §4.2.2; PyTorch
    torch.distributed.tensor.parallel (ColwiseParallel), torchtitan parallelize_llama.py apply_tp."""
    return where(plan.sp & (plan.tp_impl == "megatron"), plan.tp, 1)


def latent_width(m: ModelSpec) -> int:
    """Per-token width of the low-rank latents an attention layer keeps (bf16) as its up-projections' inputs:
    MLA's query latent, compressed KV and decoupled rope key (q_rank + kv_lora_rank + d_rope); DeepSeek-V4's
    query latent (q_lora_rank); 0 otherwise. Source: Megatron-LM multi_latent_attention.py; transformers
    modeling_deepseek_v4.py (DeepseekV4Attention: wq_a, wq_b). Derived: docs/formulas.md#mem.activations"""
    if (mla := m.mla) is not None:
        return mla.q_rank + mla.kv_lora_rank + mla.qk_rope_head_dim
    return m.q_lora_rank or 0


def _attention_stored(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Q, K, V and the attention output (input of the output projection), 2 bytes each, on one TP rank, and the
    latents (latent_width). Derived: docs/formulas.md#mem.activations, docs/formulas.md#compressed.attention"""
    s, b, t = plan.seq_len / plan.cp, plan.micro_batch, plan.tp
    heads = m.num_attention_heads / t
    if (mla := m.mla) is not None:
        return 2 * s * b * (heads * (2 * mla.qk_head_dim + 2 * mla.v_head_dim) + latent_width(m))
    d, kvh = m.d_head, kv_heads_per_rank(m, t)
    if is_v4_attention(m):
        # DeepSeek-V4: q, the shared key/value head, the output and its group projection's output, the query
        # latent, and the compressors' series per average layer (cost.compressed)
        kv = d if m.shared_key_value else 2 * d * kvh
        grouped = (m.o_groups or 0) * (m.o_lora_rank or 0) / t
        return 2 * s * b * (2 * heads * d + kv + grouped + latent_width(m)) \
            + s * b * compressor_token_bytes(m) / m.num_hidden_layers
    return 2 * s * b * d * (2 * heads + 2 * kvh)


def _mlp_stored(m: ModelSpec, plan: ParallelPlan, moe: bool) -> Any:
    """MLP activations: 4sbf/t for GELU (fc1 output + GELU output), 6sbf/t gated (fc1 output 2f + product f).

    MoE: each of the rank's input tokens goes to k experts; every (token, expert) row keeps its dispatched
    input (2h; h the latent width of a latent MoE, which also keeps the combined latent rows 2l per token for
    its l -> h projection) and the expert's fc1/activation outputs (c·f_e/etp), plus fp32 router
    probabilities. Source: Korthikanti et al. 2022, Table 2 (fc1 and GeLU outputs, 8sbh each at f = 4h).
    Derived: docs/formulas.md#mem.activations"""
    s, b, t = plan.seq_len / plan.cp, plan.micro_batch, plan.tp
    c = mlp_inner_bytes(m, plan)
    if not moe:
        return c * s * b * m.intermediate_size / t
    etp = plan.etp_resolved
    tokens = s * b / where(plan.sp, t, 1)
    rows = tokens * etp * m.num_experts_per_tok * plan.expert_padding  # padded to capacity when a factor is set
    rows = rows * budget_row_factor(m, plan)  # the static per-rank budget's padded rows (full-iteration graph)
    routed = rows * (2 * m.expert_width + (c + glu_clamp_saved_bytes(m, plan)) * m.expert_ffn / etp) \
        + tokens * (m.num_experts * 4 + aux_loss_saved_bytes(m))
    latent = 2 * tokens * m.moe_latent_size if m.moe_latent_size else 0.0  # fc2_latent_proj's saved input
    return routed + latent + c * s * b * m.shared_ffn / t + paged_stash_headroom_bytes(m, plan)


MXFP8_COLUMNWISE_BYTES = 33 / 32
"""Bytes an element of an MXFP8 tensor saved columnwise: one FP8 byte and one E8M0 scale per 32 elements."""


def paged_stash_row_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Bytes a routed (token, expert) row of the grouped tensors Transformer Engine's fused MXFP8 grouped MLP marks
    for Megatron's paged stash (mark_grouped_tensor): fc1's input, columnwise MXFP8 (h x 33/32); fc1's bf16
    output (activation_in: 2 x 2f_e/etp with a GLU, 2 x f_e/etp without); the row's fp32 probability; fc2's
    input, columnwise MXFP8 (f_e/etp x 33/32). Source: NVIDIA/TransformerEngine
    transformer_engine/pytorch/ops/fused/grouped_mlp.py (mark_grouped_tensor(saved_fc1_x, activation_in, scales,
    grouped_fc2_x); c_dtype bfloat16) and pytorch/utils.py (mark_grouped_tensor) at d0067d0da.
    Derived: docs/formulas.md#mem.paged_stash"""
    f = m.expert_ffn / plan.etp_resolved
    fc1_out = 2 * (2 if m.gated_mlp else 1) * f
    return MXFP8_COLUMNWISE_BYTES * (m.expert_width + f) + fc1_out + 4


RANK_CAPACITY_DEFAULT = 1.5
"""moe_expert_rank_capacity_factor of Megatron-Bridge's full-iteration presets (perf_recipes/{deepseek,gpt_oss,
qwen}/common.py at 4ab94dfad), taken where a plan with the budget gives no ParallelPlan.moe_rank_capacity_factor."""


def paged_stash_transient_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Bytes beyond the pool that one MoE layer's marked tensors take at the static budget's rows while paged:
    in forward the padded originals live until the next layer's grouped MLP waits for their stash, in backward
    the reload fills a fresh tensor of the original (budget) shape while the pool stays allocated; one layer at
    a time: rank capacity factor x dispatched rows x paged_stash_row_bytes where any MoE layer runs the fused
    MXFP8 grouped MLP (one whole layer, not a share). Where every layer's MoE part is rebuilt in its backward
    (full recompute without a layer count, selective module moe) the recompute working set already holds that
    layer's marked tensors at 1 x the rows, so only the budget's padding beyond them: (factor - 1). 0 when off.
    Source: NVIDIA/Megatron-LM megatron/core/transformer/moe/paged_stash.py at 1e23526adc
    (wait_for_stash_to_complete, reload_paged_tensors: torch.empty(original_shape)) and
    moe/token_dispatcher.py (_HybridEPManager.setup_metadata: num_permuted_tokens = T x topk x factor).
    Derived: docs/formulas.md#mem.paged_stash"""
    if plan.moe_paged_stash is None or not m.is_moe:
        return 0.0
    fused = fused_grouped_mlp(m, plan) & (plan.low_precision_layer_fraction(m.num_hidden_layers) > 0)
    rank = plan.moe_rank_capacity_factor or RANK_CAPACITY_DEFAULT
    rebuilt = (plan.full & (plan.recompute_layers is None)) | plan.recomputes("moe")
    return where(fused, 1.0, 0.0) * (rank - where(rebuilt, 1.0, 0.0)) * dispatched_rows(m, plan) \
        * paged_stash_row_bytes(m, plan)


def budget_row_factor(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Factor on the routed rows an MoE layer saves for backward under the static per-rank budget of a dropless
    layer in a full-iteration graph (where llmplan's plans carry --moe-expert-rank-capacity-factor): HybridEP's
    dispatch output has num_permuted_tokens = T x topk x rank capacity factor rows, and the experts' saved
    tensors after it have that shape, the used rows counted on the GPU. The paged stash keeps the fused MXFP8
    layers' share at their used rows (1 x here; its pool headroom and one-layer transient are priced apart). 1
    elsewhere. Source: NVIDIA/Megatron-LM megatron/core/transformer/moe/token_dispatcher.py
    (_HybridEPManager.setup_metadata, dispatch) and moe/experts.py (_fused_forward: max_num_tokens =
    permuted_local_hidden_states.shape[0]) at 1e23526adc. Derived: docs/formulas.md#mem.paged_stash"""
    if not m.is_moe or plan.moe_capacity_factor is not None or plan.cuda_graphs != "full-iteration":
        return 1.0
    rank = plan.moe_rank_capacity_factor or RANK_CAPACITY_DEFAULT
    if plan.moe_paged_stash is None:
        return rank
    paged = where(fused_grouped_mlp(m, plan), plan.low_precision_layer_fraction(m.num_hidden_layers), 0.0)
    return rank - (rank - 1.0) * paged


def paged_stash_headroom_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Bytes one MoE layer's paged stash adds to its saved activations, one micro-batch, one rank: the page pool
    is sized at moe_paged_stash (Megatron's moe_paged_stash_buffer_size_factor_cuda) x the average rows of the
    layers in flight (max_num_tokens // rank capacity factor, peak over the schedule) and holds the marked grouped
    tensors (paged_stash_row_bytes) in their stead, so each layer's share is the factor x its dispatched rows;
    the dynamic model already charges 1 x. Only the layers on the fused MXFP8 grouped MLP (the stash context is
    opened in TEGroupedMLP._fused_forward). 0 when off. Source: NVIDIA/Megatron-LM
    megatron/core/transformer/moe/paged_stash.py (allocate_stash_buffers, on_save_for_backward) and
    moe/experts.py (_fused_forward) at 1e23526adc. Derived: docs/formulas.md#mem.paged_stash"""
    if plan.moe_paged_stash is None or not m.is_moe:
        return 0.0
    share = where(fused_grouped_mlp(m, plan), plan.low_precision_layer_fraction(m.num_hidden_layers), 0.0)
    return share * (plan.moe_paged_stash - 1.0) * dispatched_rows(m, plan) * paged_stash_row_bytes(m, plan)



AUX_LOSS_SAVED_BYTES = 4
"""Bytes per token and expert the auxiliary load-balancing loss keeps for backward: its fp32 [T, E] scores.
Fused (moe_router_fusion): FusedComputeScoresForMoEAuxLoss.forward saves the kernel's fp32 intermediate_output
(at::kFloat, the logits' shape) and FusedAuxLoss saves only its constant and the E token counts. Eager:
torch.softmax(logits, dtype=float32) saves its fp32 output (sigmoid / sqrtsoftplus save the activation's fp32
output, which the normalising division saves again as the same tensor); probs.sum(dim=0) and the [E] product
save nothing of [T, E]. Source: NVIDIA/TransformerEngine at d0067d0, transformer_engine/pytorch/router.py
(FusedComputeScoresForMoEAuxLoss, FusedAuxLoss), pytorch/csrc/extensions/router.cpp
(fused_score_for_moe_aux_loss_fwd); NVIDIA/Megatron-LM at d98e8a6, megatron/core/transformer/moe/moe_utils.py
(compute_routing_scores_for_aux_loss, switch_load_balancing_loss_func), router.py (TopKRouter.routing).
Derived: docs/formulas.md#mem.aux_loss_scores"""


def aux_loss_saved_bytes(m: ModelSpec) -> float:
    """Bytes per token of one MoE layer's stored activations that the auxiliary loss keeps (AUX_LOSS_SAVED_BYTES
    x E) where the model trains with one (cost.kernels.aux_loss_on), else 0. TopKRouter.routing computes the
    loss only with gradients enabled, so `moe` recompute's no-grad forward stores none (it is in the `mlp`
    part that recompute drops) and its rerun rebuilds it. Derived: docs/formulas.md#mem.aux_loss_scores"""
    from llmplan.cost.kernels import aux_loss_on  # kernels builds on comm, which imports this module
    return AUX_LOSS_SAVED_BYTES * m.num_experts if aux_loss_on(m) else 0.0


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


def shared_layer_activations(m: ModelSpec, plan: ParallelPlan) -> LayerActivations:
    """layer_activations, on plan arrays computed once per distinct row of ALL_BUT_ZERO (what it reads) and
    kept in the plans' memo, so that every caller within one evaluation (cost.memory's stages, the gradient
    lifetime) shares one computation; the same values elementwise. A single plan computes directly."""
    return per_distinct(plan, ALL_BUT_ZERO, 0, lambda p, _: memoized(p, ("layer_activations", m),
                                                                       lambda: layer_activations(m, p)))


def _rebuilt(m: ModelSpec, plan: ParallelPlan, moe: bool) -> Any:
    """The activations selective recompute_modules rebuild in one layer's backward (0 without them)."""
    if not plan.recompute_modules:
        return 0.0
    return recomputed_module_bytes(m, plan, moe, layer_activation_parts(m, plan, moe, scores=True))



INDEXER_SCORE_COPIES = 2
"""fp32 [s/cp, b, H_I, s] index-score tensors alive at once in the DSA indexer's reference scores
(_compute_index_scores): the einsum's output beside the ReLU's, then beside the head-weighted product, each
freed when the next is assigned; every setting runs it (under torch.no_grad with the loss off), the loss's
backward again. Source: NVIDIA/Megatron-LM megatron/core/transformer/experimental_attention_variant/dsa.py at
1e23526adc (_compute_index_scores, fused_qk_topk_naive). Derived: docs/formulas.md#mem.indexer_reference"""

INDEXER_LOSS_SCORE_BYTES = 4 * 4 + 1
"""Bytes per (main head, query, key) of the indexer loss's KL target at its peak: the fp32 [b, a/t, s/cp, s]
QK^T (torch.bmm(query.float(), key.float())) held while dsa_masking.masked_softmax builds its masked copy, the
difference and its exp (four fp32 copies at once, and again at each later masked_fill and division), plus
~valid_mask expanded over the heads (1-byte bool); the same in the backward (bwd_fused_indexer_loss_naive
recomputes the product, adds the mask out of place, then the same softmax). Nothing of it is saved for the
backward (FusedDSAIndexerLoss saves q, weights, k, query, key, topk_indices). Source: NVIDIA/Megatron-LM
experimental_attention_variant/dsa.py (compute_dsa_indexer_loss, bwd_fused_indexer_loss_naive) and
dsa_masking.py (masked_softmax) at 1e23526adc. Derived: docs/formulas.md#mem.indexer_reference"""

INDEXER_LOSS_PAIR_BYTES = 4 + 4
"""Bytes per (query, key) beside the KL target: the fp32 [b, s/cp, s] index scores and the fp32 top-k index_mask
(torch.full(..., -inf)). Source: dsa.py at 1e23526adc (compute_dsa_indexer_loss).
Derived: docs/formulas.md#mem.indexer_reference"""


INDEXER_BACKWARD_SCORE_BYTES = 4 + 1 + 4 + 4
"""Bytes per (indexer head, query, key) at the peak of the indexer loss's backward through the index scores
(bwd_fused_indexer_loss_naive, loss on): with the ReLU, the fp32 grad_scores [s/cp, b, H_I, s], the bool
relu_mask, relu_mask.float() and their product (the old grad_scores freed only when the product is assigned), four
tensors at once; the recomputed scores and scores_for_weights are freed before. Source: NVIDIA/Megatron-LM
megatron/core/transformer/experimental_attention_variant/dsa.py at 1e23526adc (bwd_fused_indexer_loss_naive:
`grad_scores = grad_scores * relu_mask.float()`). Derived: docs/formulas.md#mem.indexer_reference"""

INDEXER_BACKWARD_PAIR_BYTES = 4
"""Bytes per (query, key) beside INDEXER_BACKWARD_SCORE_BYTES: the fp32 grad_weighted_scores [s/cp, b, 1, s].
Source: dsa.py at 1e23526adc (bwd_fused_indexer_loss_naive). Derived: docs/formulas.md#mem.indexer_reference"""


def indexer_reference_transient_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Peak bytes of one DeepSeek-V3.2 layer's DSA indexer on Megatron-Core's reference path (no fused DSA kernel
    is priced for it), a transient of the forward and the backward, one micro-batch: the larger of the index
    scores (INDEXER_SCORE_COPIES x 4 B x H_I per pair, the indexer replicated on every TP rank) and, with the
    loss on (dense or sparse alike: the sparse mask is added to full matrices), the KL target
    (INDEXER_LOSS_SCORE_BYTES x a/t + INDEXER_LOSS_PAIR_BYTES per pair) and the backward through the scores
    (INDEXER_BACKWARD_SCORE_BYTES x H_I + INDEXER_BACKWARD_PAIR_BYTES per pair), over b x (s/cp) queries (the rank's
    rows; all-gather CP gathers the keys) x s keys. 0 for a model without an indexer and for DeepSeek-V4 (its
    reference path: csa_reference_transient_bytes). Derived: docs/formulas.md#mem.indexer_reference"""
    if not m.is_sparse_attention or m.compressed_layers:
        return 0.0
    loss = asked_indexer_loss(m, plan) or "off"  # V4 (left by the guard above) is the only one it leaves None
    pairs = plan.micro_batch * plan.seq_len / plan.cp * plan.seq_len
    scores = INDEXER_SCORE_COPIES * 4.0 * (m.index_n_heads or 0) * pairs
    target = (INDEXER_LOSS_SCORE_BYTES * m.num_attention_heads / plan.tp + INDEXER_LOSS_PAIR_BYTES) * pairs
    backward = (INDEXER_BACKWARD_SCORE_BYTES * (m.index_n_heads or 0) + INDEXER_BACKWARD_PAIR_BYTES) * pairs
    return maximum(maximum(scores, target), backward) if loss != "off" else scores


def csa_reference_transient_bytes(m: ModelSpec, plan: ParallelPlan, gather_rate: Any) -> Any:
    """Peak bytes of one DeepSeek-V4 compressed sparse attention layer's indexer on Megatron-Core's reference path
    (CompressedSparseAttention._forward_unfused_csa), a transient of the forward and the backward, one micro-batch:
    where the fused CSA path is not priced (unfused attention, or `gather_rate` False: the GPU lists no
    GpuSpec.sparse_gather_efficiency; the condition of cost.sparse_gather.fused_csa_priced). In training that path
    calls FusedDSAIndexerLoss whatever dsa_indexer_loss_coeff is (the coefficient scales the loss; the KL target is
    built anyway), so the larger of the index scores, the KL target and the backward through the scores as
    indexer_reference_transient_bytes prices V3.2's with the loss on, over b x s/cp queries x s/compress_rate_csa
    compressed keys, beside the fp32 causal mask [s/cp, n_compressed] the path builds first. 0 for a model without
    CSA layers. Source: NVIDIA/Megatron-LM megatron/core/transformer/experimental_attention_variant/csa.py
    (_forward_unfused_csa: causal_mask, FusedDSAIndexerLoss.apply) and dsa.py (fwd_fused_indexer_loss_naive,
    compute_dsa_indexer_loss) at 1e23526adc. Derived: docs/formulas.md#mem.indexer_reference"""
    if not m.is_sparse_attention or not m.count_layers("compressed_sparse_attention"):
        return 0.0
    queries, keys = plan.seq_len / plan.cp, plan.seq_len / m.compress_rate_csa
    pairs = plan.micro_batch * queries * keys
    scores = INDEXER_SCORE_COPIES * 4.0 * (m.index_n_heads or 0) * pairs
    target = (INDEXER_LOSS_SCORE_BYTES * m.num_attention_heads / plan.tp + INDEXER_LOSS_PAIR_BYTES) * pairs
    backward = (INDEXER_BACKWARD_SCORE_BYTES * (m.index_n_heads or 0) + INDEXER_BACKWARD_PAIR_BYTES) * pairs
    return where(fused_csa(m, plan, gather_rate), 0.0, maximum(maximum(scores, target), backward) + 4.0 * queries * keys)
