"""Memory-bound operators' HBM traffic: one layer's norms, residual adds, rotary, activation, MoE routing and
expert bias, unfused attention scores, a hybrid's recurrent passes and the fp8 casts (elementwise_bytes), and
the output layer's loss (loss_bytes). Split out of cost.compute (issue 35), which re-exports these names.
Works on one ParallelPlan and, elementwise, on plan arrays (see llmplan/arith.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llmplan.arith import where
from llmplan.cost.compressed import compressor_token_bytes, hc_memory_bytes
from llmplan.cost.flops import attention_head_dims
from llmplan.cost.gemm import fused_grouped_mlp
from llmplan.cost.mixers import (
    attention_share,
    dense_mlp_share,
    mean_recurrent_memory_bytes,
    norms_per_layer,
)
from llmplan.cost.params import kv_heads_per_rank, padded_vocab
from llmplan.cost.quantize import fp8_cast_bytes
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan


def elementwise_bytes(m: ModelSpec, plan: ParallelPlan, moe: bool, fp8_tn_only: bool = False) -> Any:
    """HBM traffic of one layer's memory-bound operators in forward, one micro-batch, one rank: norms
    (eager_norm_bytes per element: fused, read + write 2h forward and 1.5x that backward), residual adds (read
    4h, write 2h each), rotary on q and k and, with qk_norm, their per-head norms (as the norms), the MLP activation
    (gated: read 2f, write f; GELU: read f, write f) and an eager fc1 expert bias (expert_fc1_bias_bytes), an MoE
    layer's routing and permutes (moe_routing_train_bytes, forward, backward and `moe` rerun) and what else its
    `moe` recompute runs again (moe_recompute_bytes)
    and, without fused attention, the causal softmax and dropout over the scores (score_bytes), and output biases
    added apart from the residual add (bias_add_bytes), and a GeLU MLP's fc1 bias added apart from the GeLU
    (bias_gelu_bytes). Derived: docs/formulas.md#compute.memory_bound"""
    s, b, h, t = plan.seq_len / plan.cp, plan.micro_batch, m.hidden_size, plan.tp
    T = s * b
    sp = where(plan.sp, t, 1)
    # Unfused (fused_kernels False: PyTorch eager, torchtitan without torch.compile): an RMSNorm as its eager ops
    # (eager_norm_bytes); a LayerNorm reads its input twice and writes and re-reads the normalised tensor (3x);
    # the rotary as torchtitan's eager complex product (EAGER_COMPLEX_ROPE_BYTES), compiled or not (rope_complex:
    # Inductor runs complex operators as their eager kernels)
    norm = eager_norm_bytes(m, plan)
    norms_residual = (2 * norm + 12) * T * h / sp * norms_per_layer(m) / 2  # a norm and an add per sub-block
    qk_width = m.d_head * (m.num_attention_heads / t + kv_heads_per_rank(m, t)) * attention_share(m)
    fused_rope = where(plan.fused_kernels and not plan.rope_complex, 4.0, sum(EAGER_COMPLEX_ROPE_BYTES) / 3)
    rope_pass = where(plan.rope_fusion, fused_rope, sum(EAGER_ROPE_BYTES) / 3)  # per element of q and k
    rope = 0 if m.learned_position_embeddings else rope_pass * T * qk_width
    qk_norm = norm * T * qk_width if m.qk_norm else 0.0  # per-head RMSNorm of q and k, as a norm above
    # the dense MLP's or the shared experts' activation (a hybrid: its share of dense MLPs); the routed experts'
    # in expert_node_bytes
    f = m.shared_ffn if moe else m.intermediate_size * dense_mlp_share(m)
    act = (eager_activation_bytes(m, plan) + bias_gelu_bytes(m, plan, moe)) * T * f / t
    # attention sinks applied after a kernel that lacks them (AutoModel's FlexAttention): the output rescaled
    sinks = sink_rescale_bytes(m, plan) * T * m.num_attention_heads * m.d_head / t * attention_share(m)
    merges = cp_merge_bytes(m, plan) * attention_share(m)  # the ring's merges of its calls' partial results
    # selective recompute of the attention core (core_attn) runs the softmax and dropout forward once more
    rerun = where(plan.recomputes("core_attn"), score_forward_bytes(m, plan) / 3, 0.0)
    # a hybrid's softmax-attention layers alone hold scores, as the sinks and merges beside them; Transformer
    # Engine's mask build, forward only, is charged per build by cost.compute.stage_compute (te_mask_layer_bytes)
    scores = where(plan.flash_attention, 0.0,
                   (score_bytes(m, plan) + rerun) * m.num_attention_heads * s * T / t * attention_share(m))
    routing = (moe_routing_train_bytes(m, plan) * T / sp + expert_node_bytes(m, plan) + moe_recompute_bytes(m, plan)
               if moe else 0.0)
    recurrent = mean_recurrent_memory_bytes(m, b) * T / t  # a hybrid's convolutions, scans and norms
    casts = fp8_cast_bytes(m, plan, moe, fp8_tn_only)
    # DeepSeek-V4: the hyper-connections' passes over the n streams and the compressors' pooling of their
    # projected series, per average layer (cost.compressed)
    v4 = (hc_memory_bytes(m) + compressor_token_bytes(m) / m.num_hidden_layers) * T / sp
    bias_add = bias_add_bytes(m, plan, moe) * T * h / sp  # output biases added apart from the residual
    return norms_residual + rope + qk_norm + act + scores + routing + recurrent + casts + v4 + sinks + merges + bias_add


UNFUSED_BIAS_ADD_BYTES = (4.0, 0.0)
"""(forward, backward) HBM bytes per element of a projection's h-wide bf16 output of its bias added in its own
pass before the residual add (ParallelPlan.bias_dropout_fusion False), beyond what the fused bias-dropout-add
costs: forward x + bias reads x and writes the sum (2 + 2; dropout at p 0 returns its input, no kernel); backward
nothing more: the add passes the gradient through, and the bias gradient's sum over the tokens is paid either way
(the fused torch.compile'd bias-dropout-add reduces it too). The residual add after it is the norms_residual add
priced for every layer. Source: NVIDIA/Megatron-LM megatron/core/fusions/fused_bias_dropout.py
_bias_dropout_add_func (x = x + bias, then residual + out), transformer/attention.py (linear_proj with
skip_bias_add=True) at core_v0.16.0 and d98e8a6; NVIDIA-NeMo/Megatron-Bridge gpt_oss_provider.py /
gpt_oss_bridge.py (bias_dropout_fusion False, v0.2.0 - v0.6.0). Derived: docs/formulas.md#compute.bias_add"""

UNFUSED_DROPOUT_BYTES = (4.0, 0.0)
"""(forward, backward) HBM bytes per element of a sub-block's h-wide bf16 output of the hidden dropout run as its
own kernel (ParallelPlan.bias_dropout_fusion False, ModelSpec.hidden_dropout > 0), beyond the fused
bias-dropout-add: forward F.dropout reads its input and writes the dropped output (2 + 2), which the residual add
then reads in place of the input; the 1-byte mask is written by both paths. Backward the same mask multiply in
either. Source: NVIDIA/Megatron-LM megatron/core/fusions/fused_bias_dropout.py _bias_dropout_add_func at d98e8a6
(out = dropout(x, p), then residual + out); pytorch/pytorch aten/src/ATen/native/Dropout.cpp (native_dropout
for 0 < p < 1). Derived: docs/formulas.md#compute.bias_add"""


def bias_add_bytes(m: ModelSpec, plan: ParallelPlan, moe: bool) -> Any:
    """HBM bytes per token and hidden element of one layer's unfused bias-dropout-add passes
    (ParallelPlan.bias_dropout_fusion False), in the forward-equivalent units of elementwise_bytes (the stage
    charges three times them): the output biases added on their own, the attention output projection's
    (attention_bias; qkv_bias has none) and a dense MLP's fc2 bias (mlp_bias; an MoE layer adds its experts'
    biases inside the experts and hands the bias-dropout-add none), and with hidden_dropout > 0 the dropout's own
    kernel after each sub-block. 0 with the fused bias-dropout-add. Derived: docs/formulas.md#compute.bias_add"""
    passes = (attention_share(m) if m.attention_bias else 0.0) + (
        dense_mlp_share(m) if m.mlp_bias and not moe else 0.0)
    dropouts = norms_per_layer(m) if m.hidden_dropout > 0 else 0.0  # one bias-dropout-add per sub-block
    unfused = sum(UNFUSED_BIAS_ADD_BYTES) * passes + sum(UNFUSED_DROPOUT_BYTES) * dropouts
    return where(plan.bias_dropout_fusion, 0.0, unfused / 3)


UNFUSED_BIAS_GELU_BYTES = (4.0, 0.0)
"""(forward, backward) HBM bytes per element of a non-gated MLP's f-wide 16-bit fc1 output of its bias added in
its own pass before the GeLU (ParallelPlan.bias_gelu_fusion False), beyond the fused bias-GeLU: forward
x + bias reads x and writes the sum (2 + 2), which F.gelu then reads as bias_gelu would have read x; backward
nothing more: gelu's backward reads the gradient and its saved input (the sum) and writes the input gradient as
bias_gelu_back does, the add passes that gradient through, and the bias gradient's sum over the tokens is paid
either way (GeLUFunction.backward returns the full-size gradient for the bias too). The saved tensor is one f-wide
copy either way. Source: NVIDIA/Megatron-LM megatron/model/transformer.py ParallelMLP.forward
(activation_func(intermediate_parallel + bias_parallel) without --bias-gelu-fusion, an opt-in store_true flag
in megatron/arguments.py) and megatron/model/fused_bias_gelu.py at 19301985dd; megatron/core/transformer/mlp.py
MLP.forward (intermediate_parallel + bias_parallel without bias_activation_fusion) at d98e8a6.
Derived: docs/formulas.md#compute.bias_gelu"""


def bias_gelu_bytes(m: ModelSpec, plan: ParallelPlan, moe: bool) -> Any:
    """HBM bytes per token and MLP column of a dense non-gated MLP's fc1 bias added apart from the GeLU
    (ParallelPlan.bias_gelu_fusion False), in the forward-equivalent units of elementwise_bytes (the stage charges
    three times them): UNFUSED_BIAS_GELU_BYTES over 3; 0 with the fusion, for a gated MLP, an MLP without biases
    or an MoE layer. Derived: docs/formulas.md#compute.bias_gelu"""
    if moe or m.gated_mlp or not m.mlp_bias:
        return 0.0
    return where(plan.bias_gelu_fusion, 0.0, sum(UNFUSED_BIAS_GELU_BYTES) / 3)


CP_MERGE_BYTES = {"out_fill": 2.0, "out_merge": 6.0, "dq_first": 4.0, "dq_add": 6.0, "dkv_setup": 4.0,
                  "dkv_cat": 4.0, "dkv_first": 4.0, "dkv_add": 6.0}
"""HBM bytes per element of Transformer Engine's p2p ring (AttnFuncWithCPAndKVP2P, bf16) beyond the attention
kernels, which write each call's partial result to its own buffer: forward, the output's zero fill (write 2) and
one merge per call, out += out_step * exp(lse_step - lse) (one fused kernel: read out_step 2, read out 2, write
out 2); backward, the first call's dQ copied into dq (read 2, write 2) and every later call's added (read 2 + 2,
write 2), the local K/V copied into the send buffer once (read 2, write 2), and per call dK and dV concatenated
into one tensor (read 2, write 2) and added into the dK/dV that travels the ring (read 2 + 2, write 2; the
first call copies instead, read 2, write 2). The log-sum-exp merges (per row and head, 1/d of these, kept in
fp64 in forward) are not counted. Source: NVIDIA/TransformerEngine transformer_engine/pytorch/attention.py at
v1.10 (08a85d3, 2024-09-11): AttnFuncWithCPAndKVP2P.forward (torch.zeros_like(q), flash_attn_fwd_out_correction)
and .backward (dq.copy_ / dq.add_, p2p_comm_buffers[0][0].copy_(kv), torch.cat((dk_, dv_)), dkv.add_).
Derived: docs/formulas.md#compute.cp_merge"""


TORCH_CP_MERGE_BYTES = {"out_merge": 10.0, "out_first_last": -4.0, "dq_add": 10.0, "dq_first_last": 4.0,
                        "dkv_ends": 12.0, "dkv_add": 9.0, "kv_send": 4.0}
"""HBM bytes per element of PyTorch's experimental ring (cp_impl torch-*, convert_to_f32 on by default) beyond the
attention kernels, each statement between two SDPA calls fused into one kernel with its casts (torchtitan compiles
the block: Inductor fuses pointwise chains, the SDPA calls stay extern kernels). Forward, _SDPAMerger keeps the
output in fp32: each of the cp - 1 merges out - sigmoid(lse_i - lse)·(out - out_i) reads the fp32 accumulator and
the call's bf16 output and writes the accumulator (4 + 2, 4: 10), the first reading two bf16 outputs (2 + 2, 4)
and the last writing bf16 (results' .to(out_dtype): 4 + 2, 2): 10·(cp - 1) - 4. Backward, dQ accumulates in a
zeroed fp32 tensor (grad_query += grad_query_: 4 + 2, 4 per call; the first only casts, 2, 4; the last cast back,
4 + 2, 2): 10·(cp - 1) + 4; dK/dV: the first call's fp32 copy written as the send buffer (2, 4), each later
call's received fp32 dK/dV with the half-chunk gradient added (_partial_update's add and cat, then the send
cat: read 4 + half of 2, write 4: 9), and the final received buffer cast to bf16 (4, 2): 12 + 9·(cp - 1). The
K/V send buffer (torch.cat of K and V: read 2, write 2) once per pass with all-gather, cp - 1 times with
all-to-all, forward and backward. The per-row log-sum-exp merges (1/d of these) are not counted. Source:
pytorch/pytorch torch/distributed/tensor/experimental/_attention.py (_SDPAMerger, _templated_ring_attention,
_templated_ring_attention_backward, _ContextParallelOptions.convert_to_f32; read at 0123248, the same merger as
the torch 1963fc8 torchtitan's Dec 2024 runs used per docs/formulas.md#comm.cp).
Derived: docs/formulas.md#compute.cp_merge"""


def _ring_rank_elements(m: ModelSpec, plan: ParallelPlan, kv_repeated: bool) -> tuple[Any, Any, Any]:
    """Elements one CP rank's ring merges touch per micro-batch: its output (s/cp·b tokens x a/t heads x d_v),
    its dQ (x d_qk) and its K and V (kv heads per rank, or the query heads where kv_repeated, x (d_qk + d_v)).
    Derived: docs/formulas.md#compute.cp_merge"""
    d_qk, d_v = attention_head_dims(m)
    tokens = plan.seq_len / plan.cp * plan.micro_batch
    heads = m.num_attention_heads / plan.tp
    kv_heads = heads if kv_repeated else kv_heads_per_rank(m, plan.tp)
    return tokens * heads * d_v, tokens * heads * d_qk, tokens * kv_heads * (d_qk + d_v)


def torch_cp_merge_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """cp_merge_bytes of PyTorch's ring (TORCH_CP_MERGE_BYTES) on rank cp - 1, which with load balancing runs
    every call on its whole query (i <= rank) and adds half-chunk dK/dV: forward (10·(cp - 1) - 4) per element of
    its output, backward (10·(cp - 1) + 4) per dQ element and (12 + 9·(cp - 1)) per K/V element, plus the K/V
    send buffers; the K/V at the query heads where the model repeats them (cp_kv_repeated).
    Derived: docs/formulas.md#compute.cp_merge"""
    cp, c = plan.cp, TORCH_CP_MERGE_BYTES
    out, dq_elems, kv = _ring_rank_elements(m, plan, plan.cp_kv_repeated)
    sends = 1 if plan.cp_impl == "torch-allgather" else cp - 1  # K/V send buffers per pass
    forward = (c["out_merge"] * (cp - 1) + c["out_first_last"]) * out + sends * c["kv_send"] * kv
    dq = (c["dq_add"] * (cp - 1) + c["dq_first_last"]) * dq_elems
    dkv = (c["dkv_ends"] + c["dkv_add"] * (cp - 1) + sends * c["kv_send"]) * kv
    return where(cp > 1, (forward + dq + dkv) / 3, 0.0)


def cp_merge_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """HBM bytes of one attention layer's ring merges (CP_MERGE_BYTES) on the slowest rank, one micro-batch, in
    the forward-equivalent units of elementwise_bytes (forward + backward over 3: the stage charges three times
    them); 0 at cp = 1 (one kernel writes the output). With load balancing rank cp - 1 merges whole chunks at
    every one of its cp calls (the others merge half of theirs at some), so it sets the layer's pace: forward
    out_fill + cp·out_merge per element of its output (s/cp·b tokens x a/t heads x d_v), backward dq_first +
    (cp - 1)·dq_add per element of dQ (d_qk), and per element of its K and V (kv heads per rank x (d_qk + d_v))
    dkv_setup + cat and add at each call, of whole chunks at the last call and half chunks at the others:
    (cp + 1)/2·(dkv_cat + dkv_add) less (dkv_add - dkv_first)/2 (the first call, a half, copies).
    PyTorch's rings (cp_impl torch-*) merge in fp32: torch_cp_merge_bytes.
    Derived: docs/formulas.md#compute.cp_merge"""
    if plan.cp_impl != "te":
        return torch_cp_merge_bytes(m, plan)
    cp, c = plan.cp, CP_MERGE_BYTES
    out, dq_elems, kv = _ring_rank_elements(m, plan, False)
    forward = (c["out_fill"] + cp * c["out_merge"]) * out
    dq = (c["dq_first"] + (cp - 1) * c["dq_add"]) * dq_elems
    halves = (cp + 1) / 2 * (c["dkv_cat"] + c["dkv_add"]) - (c["dkv_add"] - c["dkv_first"]) / 2
    dkv = (c["dkv_setup"] + halves) * kv
    return where(cp > 1, (forward + dq + dkv) / 3, 0.0)


SINK_RESCALE_BYTES = (12.0, 34.0)
"""(forward, backward) HBM bytes per element of the attention output (a·d per token) of attention sinks applied
after a kernel run without them (ParallelPlan.sink_fusion False): forward the bf16 output times the fp32 row scale
sigmoid(lse - sink), written in fp32 (read 2, write 4), and cast back to bf16 (read 4, write 2); backward the cast's
gradient to fp32 (read 2, write 4), the output's gradient grad x scale in fp32 and cast to bf16 (read 4, write 4,
read 4, write 2) and the scale's gradient, grad x output written in fp32 and summed over d (read 4 + 2, write 4,
read 4). The per-row sigmoid is 1/d of that and not counted. Source: NVIDIA-NeMo/Automodel
nemo_automodel/components/attention/flex_attention.py at 36044ad3d (FlexAttention.forward: out * attn_scale,
out.to(q.dtype)); PyTorch tools/autograd/derivatives.yaml (mul, _to_copy).
Derived: docs/formulas.md#compute.sink_rescale"""


def sink_rescale_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """HBM bytes per element of the attention output that sinks applied outside the attention kernel cost, in
    the forward-equivalent units of elementwise_bytes (the stage charges three times them): SINK_RESCALE_BYTES
    where the model has sinks and the plan's fused attention does not take them (sink_fusion False), else 0.
    Derived: docs/formulas.md#compute.sink_rescale"""
    if not m.attention_sinks:
        return 0.0
    # without fused attention the sink is a column of the scores' softmax (softmax_bytes), not a rescale
    return where(plan.flash_attention, where(plan.sink_fusion, 0.0, sum(SINK_RESCALE_BYTES) / 3), 0.0)


EAGER_RMSNORM_BYTES = (36.0, 92.0)
"""(forward, backward) HBM bytes per element of a bf16 RMSNorm written as PyTorch eager ops (torchtitan's RMSNorm:
x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps), cast back, times the weight), against a fused
kernel's 4 + 6 (FUSED_NORM_BYTES). Forward: x.float() (read 2, write 4), pow(2) (read 4, write 4), the row mean
(read 4), x times the row's rsqrt (read 4, write 4), type_as (read 4, write 2), times the weight (read 2, write
2); the per-row eps and rsqrt are 1/h of that. Backward: the weight's mul (grad * weight: read 2, write 2; grad *
output, read 2 + 2, write 2, summed over tokens, read 2), the cast's gradient to fp32 (read 2, write 4), the rsqrt mul's
(grad * rsqrt: read 4, write 4; grad * x, read 4 + 4, write 4, summed over the row, read 4), the mean's
expanded gradient (write 4), pow's (self.pow(1) copied, read 4, write 4; times 2, read 4, write 4; times the
gradient, read 4 + 4, write 4), the two branches into x summed (read 4 + 4, write 4) and the cast back to bf16
(read 4, write 2). Source: pytorch/torchtitan torchtitan/models/norms.py at 9dec370 (RMSNorm._norm, forward);
PyTorch tools/autograd/derivatives.yaml and FunctionsManual.cpp (mul, _to_copy, mean, pow_backward).
Derived: docs/formulas.md#compute.eager_ops"""

EAGER_COMPLEX_ROPE_BYTES = (20.0, 20.0)
"""(forward, backward) HBM bytes per element of q and k of torchtitan's eager rotary in bf16 (apply_rotary_emb:
view_as_complex of the fp32 copy times freqs_cis, view_as_real, type_as), against the fused kernel's 4 + 8.
Forward: .float() (read 2, write 4), the complex product (read 4, write 4; freqs_cis is one row per position,
shared by the batch and heads), type_as (read 4, write 2); the views are free. Backward: the cast's gradient to
fp32 (read 2, write 4), the product's (grad times conj(freqs_cis): read 4, write 4; freqs_cis needs no gradient)
and the cast back to bf16 (read 4, write 2). Source: pytorch/torchtitan torchtitan/models/llama/model.py at
9dec370 (apply_rotary_emb); PyTorch tools/autograd/derivatives.yaml (mul, _to_copy, view_as_complex).
Derived: docs/formulas.md#compute.eager_ops"""

EAGER_SWIGLU_BYTES = (10.0, 18.0)
"""(forward, backward) HBM bytes per element of the f-wide MLP intermediate of a gated MLP written as PyTorch
eager ops (torchtitan's FeedForward: F.silu(w1(x)) * w3(x)), against the fused activation's 6 + 12. Forward:
silu (read 2, write 2), the product (read 2 + 2, write 2). Backward: the product's two gradients (grad times
each factor: read 2 + 2, write 2, twice) and silu_backward (read 2 + 2, write 2). Source: pytorch/torchtitan
torchtitan/models/llama/model.py at 9dec370 (FeedForward.forward); PyTorch tools/autograd/derivatives.yaml (mul,
silu). Derived: docs/formulas.md#compute.eager_ops"""


CAUSAL_SOFTMAX_BYTES = (3.0, 4.0)
"""(forward, backward) HBM bytes per attention score of Megatron-LM's fused causal softmax in 16 bits, averaged over
the s x s scores of a head: forward reads the scores on and below the diagonal only (2 bytes on half of them: 1)
and writes every probability, zeros above the diagonal (2); backward reads the output gradient and the saved
probabilities on and below the diagonal (1 + 1) and writes every input gradient (2). Source: NVIDIA/Megatron-LM
megatron/fused_kernels/scaled_upper_triang_masked_softmax.h at 50a4b5fa02 (scaled_upper_triang_masked_softmax_
warp_forward / _backward: loads guarded by element_index < local_seq = row + 1, stores over element_count, with
copy_zero_vector above the diagonal), the kernel megatron/model/fused_softmax.py selects for a causal mask of
16 < s <= 2048 in fp16 (GPT, --masked-softmax-fusion on by default); the same kernel from d73def35a3 (2020-09) and
in bigscience-workshop/Megatron-DeepSpeed (causal mask, s <= 4096). Derived: docs/formulas.md#compute.score_bytes"""


DROPOUT_BYTES = (5.0, 5.0)
"""(forward, backward) HBM bytes per element of PyTorch's CUDA dropout on a 16-bit tensor: forward reads the input
and writes the output and a one-byte keep mask (2 + 2 + 1); backward reads the gradient and the mask and writes the
scaled gradient (2 + 1 + 2). Source: pytorch/pytorch aten/src/ATen/native/cuda/Dropout.cu (fused_dropout_cuda:
mask in kByte / kBool; masked_scale_cuda: grad * mask * scale). Derived: docs/formulas.md#compute.score_bytes"""


EAGER_SOFTMAX_BYTES = (8.0, 10.0)
"""(forward, backward) HBM bytes per attention score of the eager 16-bit softmax of Megatron-LM's 2020 release
(softmax_kernel eager): forward, the in-place causal masked_fill_ (read 2, write 2; the broadcast [1, 1, s, s] mask
is one head's worth) and torch softmax (read 2, write 2); backward, the softmax's (read y and dy, write dx: 6) and
the mask's, dx.masked_fill(mask, 0) (read 2, write 2). Source: NVIDIA/Megatron-LM at d73def35a3
megatron/model/fused_softmax.py (FusedScaleMaskSoftmax.forward: the eager branch unless
--scaled-upper-triang-masked-softmax-fusion, an opt-in store_true in megatron/arguments.py that no script under
examples/ sets; no fp32 copy or scaling without --apply-query-key-layer-scaling / --attention-softmax-in-fp32,
opt-in too) and megatron/model/gpt2_model.py (gpt2_attention_mask_func: masked_fill_).
Derived: docs/formulas.md#compute.score_bytes"""


EAGER_FP32_SOFTMAX_BYTES = (36.0, 40.0)
"""(forward, backward) HBM bytes per attention score of Megatron's unfused scale-mask-softmax in fp32
(ParallelPlan.softmax_kernel eager-fp32), in place of the fused causal kernel's 3 + 4 (CAUSAL_SOFTMAX_BYTES): the
chain starts from the 16-bit scores and ends in the 16-bit probabilities the dropout reads (DROPOUT_BYTES, charged
beside it as after the fused kernel). Forward: input.float() (read 2, write 4), input * scale (read 4, write 4),
masked_fill_ with the causal mask (read 4, write 4; the s x s bool mask, broadcast over the batch and heads, is
L2-resident and not counted), the fp32 softmax (read 4, write 4), the cast back to 16 bits (read 4, write 2): 36.
Backward, autograd's chain in reverse: the cast's gradient to fp32 (read 2, write 4), _softmax_backward_data (read
the gradient and the saved output, 4 + 4, write 4), masked_fill's gradient (read 4, write 4), the scale's (read 4,
write 4), the cast's to 16 bits (read 4, write 2): 40. Every op reads whole rows (no triangle). Source:
bigscience-workshop/Megatron-DeepSpeed megatron/model/fused_softmax.py at ae6277f5
(FusedScaleMaskSoftmax.forward_torch_softmax), megatron/model/utils.py (attention_mask_func: masked_fill_),
megatron/model/transformer.py (ParallelAttention: softmax_in_fp32 and scale = layer_number under
apply_query_key_layer_scaling, the default); PyTorch tools/autograd/derivatives.yaml (_to_copy, _softmax,
masked_fill_, mul). Derived: docs/formulas.md#compute.eager_softmax"""


EAGER_SOFTMAX_KERNELS = 1
"""Kernels the eager 16-bit softmax (softmax_kernel eager) launches per layer forward beyond the fused kernel's one:
the masked_fill_ beside the softmax (EAGER_SOFTMAX_BYTES). Source: NVIDIA/Megatron-LM at d73def35a3
megatron/model/fused_softmax.py (FusedScaleMaskSoftmax.forward, the eager branch: mask_func, then
torch.nn.Softmax). Derived: docs/formulas.md#compute.score_bytes"""

EAGER_FP32_SOFTMAX_KERNELS = 4
"""Kernels the eager fp32 softmax launches per layer forward beyond the fused kernel's one: the two casts, the scale
and the mask beside the softmax (EAGER_FP32_SOFTMAX_BYTES). Derived: docs/formulas.md#compute.eager_softmax"""


FUSED_SOFTMAX_MAX_KEYS = 4096
"""Most keys a row Megatron's fused scale-mask-softmax takes (FusedScaleMaskSoftmax.is_kernel_available:
16 < sk <= 4096); past it Megatron runs forward_torch_softmax (fused_softmax_fits). Source: NVIDIA/Megatron-LM at
d98e8a64dd megatron/core/fusions/fused_softmax.py; the same bound from 7a77abd9b6 (2022-01-12,
megatron/model/fused_softmax.py), 2048 before it (0fa7175f09). Derived: docs/formulas.md#compute.softmax_fallback"""


def fused_softmax_fits(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Whether Megatron's fused causal softmax takes one layer's [b, np, sq, sk] scores (sq = sk the rank's
    sequence, np the query heads a TP rank): 16 < sk <= FUSED_SOFTMAX_MAX_KEYS, sq % 4 == 0, b x np % 4 == 0
    (softmax_rows_fit) and, on the causal path, b x np a multiple of get_batch_per_block(sk)
    (softmax_batch_per_block; TE's check holds sq to it instead: te_softmax_fits). Elementwise on plan arrays.
    Source: NVIDIA/Megatron-LM@d98e8a64dd megatron/core/fusions/fused_softmax.py (is_kernel_available; the row
    counts since 40becfc96c, 2021-08-13, b x np % 4 alone from 4916bae616, 2021-02-04).
    Derived: docs/formulas.md#compute.softmax_fallback"""
    s, heads = plan.seq_len / plan.cp, m.num_attention_heads / plan.tp
    lengths = (s > 16) & (s <= FUSED_SOFTMAX_MAX_KEYS) & (s % 4 == 0)
    per_block = (plan.micro_batch * heads) % softmax_batch_per_block(s) == 0
    return lengths & softmax_rows_fit(plan.micro_batch, heads) & per_block


TE_SOFTMAX_KEYS = (16, 16384, 8)
"""(low, high, multiple): Transformer Engine's FusedScaleMaskSoftmax.is_kernel_available takes low < sk < high keys
a row with sk % multiple == 0 (and sq % 4 == 0, b x np % 4 == 0, sq a multiple of get_batch_per_block(sk):
te_softmax_fits); else
forward_torch_softmax in fp32 (softmax_in_fp32 True by default). Source: NVIDIA/TransformerEngine@d0067d0da6
transformer_engine/pytorch/attention/dot_product_attention/softmax.py. Derived: docs/formulas.md#compute.te_softmax"""

TE_MASKED_SOFTMAX_BYTES = (4.0, 6.0)
"""(forward, backward) HBM bytes per attention score of Transformer Engine's scaled_masked_softmax in 16 bits, the
kernel TE's FusedScaleMaskSoftmax runs for a causal mask since TE 2.0 (the aligned causal kernel's call is
commented out, "until unalignment bug is fixed"): forward reads every score of the row (2) and writes every
probability (2); backward reads the output gradient and the saved probabilities over the whole row (2 + 2) and
writes the input gradient (2). The uint8 mask it reads beside the scores (its build: TE_MASK_BYTES) is not
counted: it is shared by the heads, but the grid runs every query row of one head before the next (blockIdx.x the
rows, fastest; y the heads), so the mask's s x s bytes come back for each head only if they stay in L2 across that
head's sweep (the mask and the 4 bytes a score the head reads and writes): a forward reads 1 byte a score more from
HBM (5 in place of 4) once the mask outgrows L2, e.g. s^2 > 50 MB (H100 SXM's L2, NVIDIA H100 Tensor Core GPU
Architecture whitepaper), s above about 7,000. GpuSpec holds no L2 size, so that read is not priced: te plans past
that length are up to a tenth of the kernel's bytes low (docs/validation.md#smx-mend).
Source: NVIDIA/TransformerEngine@d0067d0da6 transformer_engine/common/
fused_softmax/scaled_masked_softmax.cu (scaled_masked_softmax_warp_forward / _backward: loads and stores over
element_count, the key length; the grid dim3(sq / batches_per_block, heads, batches)) and pytorch/attention/
dot_product_attention/softmax.py (forward_fused_softmax).
Derived: docs/formulas.md#compute.te_softmax"""

TE_FP32_SOFTMAX_BYTES = (28.0, 32.0)
"""(forward, backward) HBM bytes per attention score of Transformer Engine's forward_torch_softmax (softmax_in_fp32,
no scale: the softmax scale is baddbmm's alpha, NVTE_APPLY_QK_LAYER_SCALING off by default): forward inp.float()
(read 2, write 4), masked_fill_ (read 4, write 4), softmax (read 4, write 4), the cast back (read 4, write 2): 28;
backward the cast's gradient to fp32 (read 2, write 4), _softmax_backward_data (read 4 + 4, write 4),
masked_fill_'s (read 4, write 4), the cast's to 16 bits (read 4, write 2): 32. Source: NVIDIA/TransformerEngine@
d0067d0da6 .../dot_product_attention/softmax.py (forward_torch_softmax), transformer_engine/pytorch/utils.py
(attention_mask_func: masked_fill_), .../dot_product_attention/backends.py (UnfusedDotProductAttention:
baddbmm(alpha=scale), scale_mask_softmax(..., softmax_scale None)); PyTorch tools/autograd/derivatives.yaml.
Derived: docs/formulas.md#compute.te_softmax"""

SINK_COLUMN_BYTES = {16: (4.0, 6.0), 32: (8.0, 12.0)}
"""(forward, backward) HBM bytes per attention score that a learnable softmax offset (attention sinks, softmax_type
learnable) adds to an unfused softmax, by the bits of the tensor it joins: forward torch.cat of the scores and the
sink column (read, write); backward the slice [..., :-1] of the probabilities gives a zero-filled gradient (write)
with the incoming one copied in (read, write); cat's backward is views. 16: Transformer Engine's
UnfusedDotProductAttention (the cat before its softmax, the slice after the cast back); 32: Megatron-Core's
SoftmaxOne on the fp32 torch path (which the offset forces). The extra column is 1/sk of it, not counted. Source:
NVIDIA/TransformerEngine@d0067d0da6 .../dot_product_attention/backends.py (UnfusedDotProductAttention._forward:
torch.cat, attention_probs[..., :-1]); NVIDIA/Megatron-LM@d98e8a64dd megatron/core/fusions/fused_softmax.py
(SoftmaxOne, FusedScaleMaskSoftmax.forward: the kernel only where softmax_offset is None); PyTorch
tools/autograd/derivatives.yaml (cat, slice). Derived: docs/formulas.md#compute.te_softmax"""

TE_MASK_BYTES = 37.0
"""HBM bytes per (query, key) position Transformer Engine's UnfusedDotProductAttention spends in every layer's
forward building its causal mask (dpa_utils.get_full_mask, attn_mask_type causal), shared by the batch and heads:
the int32 difference arange(sq)[:, None] - arange(sk) (write 4), swa_left = mask - sk and swa_right = mask + 0
(read 4, write 4 each), swa_left <= 0 and swa_right < 0 (read 4, write 1 each), the ~ (read 1, write 1), the &
(read 2, write 1) and logical_not (read 1, write 1). TE_MASK_OR_BYTES come on top. Source: NVIDIA/
TransformerEngine@d0067d0da6 transformer_engine/pytorch/attention/dot_product_attention/utils.py (get_full_mask),
backends.py (UnfusedDotProductAttention._forward calls it for every mask type). Derived:
docs/formulas.md#compute.te_softmax"""

TE_MASK_OR_BYTES = (1.0, 2.0)
"""(per position, per position and sample) HBM bytes of one logical_or of a [1, 1, s, s] mask with the data
loader's [b, 1, s, s] one (read 1 + b, write b): get_full_mask's with the loader mask (the Megatron-LM export keeps
it without flash attention: export.megatron's mask flag), and forward_torch_softmax's with its cached causal mask
on the fallback; the sink path's F.pad of the [b, 1, s, s] mask by a column costs the per-sample 2 alone.
Derived: docs/formulas.md#compute.te_softmax"""

TE_MASK_KERNELS = 11
"""Kernels Transformer Engine's unfused attention launches per layer forward building its mask (TE_MASK_BYTES: two
arange, the difference, two offsets, two compares, ~, &, logical_not, the loader mask's logical_or) beyond the one
softmax kernel (te_mask_launches: once per forward); its fp32 fallback adds TE_FP32_SOFTMAX_KERNELS, the sink path
2 (cat, F.pad).
Derived: docs/formulas.md#compute.te_softmax"""

TE_FP32_SOFTMAX_KERNELS = 4
"""Kernels Transformer Engine's fp32 torch softmax launches per layer forward beyond one: the two casts, the
masked_fill_ and the logical_or with its cached causal mask (TE_FP32_SOFTMAX_BYTES, TE_MASK_OR_BYTES).
Derived: docs/formulas.md#compute.te_softmax"""


SOFTMAX_ROW_MULTIPLE = 4
"""Multiple of rows (micro-batch x heads per tensor-parallel rank, attn_batches = b x np) that the fused
scale-mask-softmax kernels take: FusedScaleMaskSoftmax.is_kernel_available requires attn_batches % 4 == 0
(softmax_rows_fit). Source: NVIDIA/TransformerEngine@d0067d0da6 transformer_engine/pytorch/attention/
dot_product_attention/softmax.py; the same check in NVIDIA/Megatron-LM@d98e8a64dd megatron/core/fusions/
fused_softmax.py and bigscience-workshop/Megatron-DeepSpeed megatron/model/fused_softmax.py.
Derived: docs/formulas.md#compute.te_softmax"""


def softmax_rows_fit(micro_batch: Any, heads_per_rank: Any) -> Any:
    """Whether a layer's attn_batches = micro_batch x heads_per_rank is a multiple of SOFTMAX_ROW_MULTIPLE, as the
    fused softmax kernels' is_kernel_available requires. Elementwise on arrays. Derived:
    docs/formulas.md#compute.te_softmax"""
    return (micro_batch * heads_per_rank) % SOFTMAX_ROW_MULTIPLE == 0


def softmax_batch_per_block(sk: Any) -> Any:
    """Rows a thread block of the fused scale-mask-softmax kernels takes for sk keys a row (get_batch_per_block,
    the same in Transformer Engine and Megatron's CUDA extension): 128 threads in warps of min(next_pow2(sk), 32)
    lanes, two rows a warp while next_pow2(sk) <= 128: 8 from 17 to 128 keys, 4 above (both checks want
    sk > 16). Elementwise. Source: NVIDIA/TransformerEngine@d0067d0da6 .../dot_product_attention/softmax.py
    (get_batch_per_block); NVIDIA/Megatron-LM@7a77abd9b6 megatron/fused_kernels/scaled_masked_softmax.h.
    Derived: docs/formulas.md#compute.te_softmax"""
    return where(sk <= 128, 8, 4)


def te_softmax_fits(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Whether Transformer Engine's fused masked softmax takes one layer's [b, np, sq, sk] scores (sq the rank's
    sequence, sk = sq, one more with the model's attention sinks' column; np the query heads a TP rank):
    TE_SOFTMAX_KEYS, sq % 4 == 0, b x np % 4 == 0 (softmax_rows_fit) and sq a multiple of
    get_batch_per_block(sk) (softmax_batch_per_block). Elementwise on plan arrays. Source:
    NVIDIA/TransformerEngine@d0067d0da6 .../dot_product_attention/softmax.py (is_kernel_available,
    get_batch_per_block). Derived: docs/formulas.md#compute.te_softmax"""
    low, high, multiple = TE_SOFTMAX_KEYS
    sq = plan.seq_len / plan.cp
    sk = sq + (1 if m.attention_sinks else 0)
    rows = softmax_rows_fit(plan.micro_batch, m.num_attention_heads / plan.tp)
    return (sk > low) & (sk < high) & (sk % multiple == 0) & (sq % softmax_batch_per_block(sk) == 0) & rows


def fp32_softmax(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Whether the scores' softmax runs as fp32 torch ops (EAGER_FP32_SOFTMAX_BYTES, TE_FP32_SOFTMAX_BYTES): asked
    for (softmax_kernel eager-fp32); softmax_kernel fused where Megatron's kernel does not take the scores
    (fused_softmax_fits) or the model has attention sinks (Megatron-Core runs forward_torch_softmax whenever
    softmax_offset is set), which Megatron runs as forward_torch_softmax with softmax_in_fp32
    (TransformerConfig.attention_softmax_in_fp32 True at d98e8a64dd; forced by apply_query_key_layer_scaling, on
    by default, in Megatron-LM 2021-22 transformer.py); softmax_kernel te where TE's kernel does not
    (te_softmax_fits). Derived: docs/formulas.md#compute.softmax_fallback, #compute.te_softmax"""
    fallback = where(fused_softmax_fits(m, plan), m.attention_sinks, True)
    te_fallback = where(te_softmax_fits(m, plan), False, True)
    kernel = plan.softmax_kernel
    return where(kernel == "fused", fallback, where(kernel == "te", te_fallback, kernel == "eager-fp32"))


def softmax_bytes(m: ModelSpec, plan: ParallelPlan) -> tuple[Any, Any]:
    """(forward, backward) bytes per score of the plan's softmax kernel (ParallelPlan.softmax_kernel): Megatron-LM's
    fused causal kernel (CAUSAL_SOFTMAX_BYTES), the 2020 release's eager 16-bit ops (EAGER_SOFTMAX_BYTES),
    Megatron's fp32 torch ops (EAGER_FP32_SOFTMAX_BYTES), asked for or the fused kernel's fallback (fp32_softmax),
    or Transformer Engine's masked kernel or fp32 torch ops (TE_MASKED_SOFTMAX_BYTES, TE_FP32_SOFTMAX_BYTES), with
    the model's attention sinks' column (SINK_COLUMN_BYTES). The dropout after it and TE's mask build are not
    included (score_bytes, te_mask_bytes). Derived: docs/formulas.md#compute.score_bytes,
    #compute.softmax_fallback, #compute.te_softmax"""
    sinks = m.attention_sinks
    eager, fp32, te = plan.softmax_kernel == "eager", fp32_softmax(m, plan), plan.softmax_kernel == "te"
    out = []
    for i in (0, 1):
        sink16, sink32 = (SINK_COLUMN_BYTES[16][i], SINK_COLUMN_BYTES[32][i]) if sinks else (0.0, 0.0)
        te_bytes = where(fp32, TE_FP32_SOFTMAX_BYTES[i], TE_MASKED_SOFTMAX_BYTES[i]) + sink16
        megatron = where(fp32, EAGER_FP32_SOFTMAX_BYTES[i] + sink32,
                         where(eager, EAGER_SOFTMAX_BYTES[i] + sink16, CAUSAL_SOFTMAX_BYTES[i]))
        out.append(where(te, te_bytes, megatron))
    return out[0], out[1]


def te_mask_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """HBM bytes per (query, key) position of one layer's forward that Transformer Engine's unfused attention
    (softmax_kernel te) spends on its mask, whatever the heads: the build and the loader mask's logical_or
    (TE_MASK_BYTES + TE_MASK_OR_BYTES), the fp32 fallback's second logical_or, or, with the model's attention
    sinks, the pad (per sample 2); 0 for the other kernels. Derived: docs/formulas.md#compute.te_softmax"""
    fixed, per_sample = TE_MASK_OR_BYTES
    b = plan.micro_batch
    extra = (per_sample * b) if m.attention_sinks else where(fp32_softmax(m, plan), fixed + per_sample * b, 0.0)
    return where(plan.softmax_kernel == "te", TE_MASK_BYTES + fixed + per_sample * b + extra, 0.0)


def te_mask_layer_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """HBM bytes of one build of Transformer Engine's mask for one layer, one micro-batch (te_mask_bytes over the
    rank's s/cp x s/cp positions; a hybrid's attention layers' share): 0 with fused attention. Forward only, so
    cost.compute.stage_compute charges it once per forward the layer's attention core runs (twice under full or
    core_attn recompute), not in the three forward-equivalent passes of elementwise_bytes.
    Derived: docs/formulas.md#compute.te_softmax"""
    s = plan.seq_len / plan.cp
    return where(plan.flash_attention, 0.0, te_mask_bytes(m, plan) * s * s * attention_share(m))


def softmax_launches(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Kernels the plan's softmax launches per layer forward beyond the fused kernel's one (ParallelPlan.
    softmax_kernel: fused 0, eager EAGER_SOFTMAX_KERNELS, eager-fp32 and the fused kernel's fallback
    EAGER_FP32_SOFTMAX_KERNELS: fp32_softmax; te, falling back, TE_FP32_SOFTMAX_KERNELS), one more with the model's
    attention sinks' cat (te: and the mask's pad), in the units of cost.overhead.host_seconds, which charges
    (3 + r) times them for forward and backward; none with fused attention, which writes no scores. TE's mask
    build, forward only, is te_mask_launches. Derived: docs/formulas.md#compute.score_bytes,
    docs/formulas.md#compute.softmax_fallback, #compute.te_softmax"""
    sinks = m.attention_sinks
    fp32, te = fp32_softmax(m, plan), plan.softmax_kernel == "te"
    megatron = where(fp32, EAGER_FP32_SOFTMAX_KERNELS, where(plan.softmax_kernel == "eager", EAGER_SOFTMAX_KERNELS, 0))
    # the sink path's mask is arbitrary: no logical_or with the causal one on the fallback
    te_kernels = where(fp32, TE_FP32_SOFTMAX_KERNELS - (1 if sinks else 0), 0) + (2 if sinks else 0)
    extra = where(te, te_kernels, megatron + (1 if sinks else 0))
    return where(plan.flash_attention, 0, extra)


def te_mask_launches(plan: ParallelPlan) -> Any:
    """Kernels Transformer Engine's unfused attention (softmax_kernel te) launches per layer building its mask
    (TE_MASK_KERNELS), in forward only: cost.overhead.host_seconds charges them once per forward (1 + r), not
    (3 + r) as softmax_launches; 0 otherwise or with fused attention. Derived: docs/formulas.md#compute.te_softmax"""
    return where(plan.flash_attention, 0, where(plan.softmax_kernel == "te", TE_MASK_KERNELS, 0))


def score_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """HBM bytes per attention score of one head without fused attention, in the forward-equivalent units of
    elementwise_bytes (the stage charges three times them): the plan's softmax (softmax_bytes, with the model's
    attention sinks) and, with attention dropout, the dropout over the probabilities (DROPOUT_BYTES), forward and
    backward over 3. Derived: docs/formulas.md#compute.score_bytes"""
    fwd, bwd = softmax_bytes(m, plan)
    dropout = sum(DROPOUT_BYTES) if m.attention_dropout > 0 else 0.0
    return (fwd + bwd + dropout) / 3


def score_forward_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """HBM bytes per attention score of one head's forward softmax and, with attention dropout, dropout: what
    selective recompute of the attention core (core_attn) moves again before the backward.
    Source: Korthikanti et al. 2022 (arXiv:2205.05198) §5, the QK^T, softmax, softmax dropout and attention over V
    recomputed. Derived: docs/formulas.md#compute.score_bytes"""
    return softmax_bytes(m, plan)[0] + (DROPOUT_BYTES[0] if m.attention_dropout > 0 else 0.0)


FUSED_NORM_BYTES = (4.0, 6.0)
"""(forward, backward) HBM bytes per element of a fused bf16 RMSNorm / LayerNorm kernel. Forward: read x, write y
(2 + 2; the weight, bias and the fp32 per-row statistics are 1/h of that). Backward: read x (saved, not
recomputed) and dy, write dx (2 + 2 + 2); the weight gradient is reduced in the same pass into fp32 per-CTA
partials (rows/CTA of the tokens' h), summed by a small second kernel. Source: NVIDIA/TransformerEngine
transformer_engine/common/normalization/rmsnorm/rmsnorm_bwd_kernels.cuh at d0067d0 (rmsnorm_bwd_tuned_kernel:
dz and x loaded once, dx stored, dgamma_part per CTA) and pytorch/module/layernorm_linear.py (rmsnorm_bwd /
layernorm_bwd on the saved inputmat); NVIDIA/cudnn-frontend benchmark/norms/benchmark_single_norm.py at
3929da2ef4 (compute_bandwidth_bytes: forward X + Y, backward DY + X + DX).
Derived: docs/formulas.md#compute.norm_bytes"""


TWO_PASS_NORM_BYTES = (4.0, 10.0)
"""(forward, backward) HBM bytes per element of a fused bf16 / fp16 LayerNorm whose backward runs in two kernels
(ParallelPlan.norm_kernel two-pass). Forward as FUSED_NORM_BYTES (read x, write y: 2 + 2). Backward: the input
gradient's kernel reads dy and the saved x and writes dx (2 + 2 + 2), then the weight and bias gradients' kernel
reads dy and x again (2 + 2) into fp32 per-block partials (1/rows-per-block of that, not counted), which a third
small kernel sums. Source: NVIDIA/apex csrc/layer_norm_cuda_kernel.cu at 4ef930c1 (2020-08; HostLayerNormGradient
launches cuComputePartGradGammaBeta(dout, input, ...), cuComputeGradGammaBeta, then cuComputeGradInput(dout,
input, ...)); NVIDIA/Megatron-LM megatron/fused_kernels/layer_norm_cuda_kernel.cu at 50a4b5fa02 (the same three
kernels, MixedFusedLayerNorm); pytorch/pytorch aten/src/ATen/native/cuda/layer_norm_kernel.cu
(LayerNormBackwardKernelImplInternal: layer_norm_grad_input_kernel, then GammaBetaBackwardCUDAKernel(_32x32) on
dY and X). Derived: docs/formulas.md#compute.norm_bytes"""


def eager_norm_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """HBM bytes per element of one pre-norm, in the forward-equivalent units of elementwise_bytes (the stage
    charges three times them): fused, FUSED_NORM_BYTES over 3 (forward 4, backward 6), or TWO_PASS_NORM_BYTES
    over 3 (backward 10) where the plan's norm_kernel is two-pass; without fused kernels an RMSNorm's eager ops
    (EAGER_RMSNORM_BYTES over 3) and a LayerNorm's three passes (12).
    Derived: docs/formulas.md#compute.norm_bytes, docs/formulas.md#compute.eager_ops"""
    unfused = sum(EAGER_RMSNORM_BYTES) / 3 if m.norm_type == "rmsnorm" else 12.0
    fused = where(plan.norm_kernel == "two-pass", sum(TWO_PASS_NORM_BYTES) / 3, sum(FUSED_NORM_BYTES) / 3)
    return where(plan.fused_kernels, fused, unfused)


def eager_activation_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """HBM bytes per token and MLP column of the activation, in forward-equivalent units: the fused kernel's one
    pass (activation_pass_bytes); without fused kernels a gated MLP's eager silu and product (EAGER_SWIGLU_BYTES
    over 3). A GELU is one kernel either way. Derived: docs/formulas.md#compute.eager_ops"""
    if not m.gated_mlp:
        return activation_pass_bytes(m)
    return where(plan.fused_kernels, activation_pass_bytes(m), sum(EAGER_SWIGLU_BYTES) / 3)


def activation_forward_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """HBM bytes per token and MLP column of the activation's forward alone, as a recompute reruns it: the fused
    kernel's one pass (activation_pass_bytes); without fused kernels a gated MLP's eager silu and product
    (EAGER_SWIGLU_BYTES' forward). Derived: docs/formulas.md#moe.recompute_rerun"""
    if not m.gated_mlp:
        return activation_pass_bytes(m)
    return where(plan.fused_kernels, activation_pass_bytes(m), EAGER_SWIGLU_BYTES[0])


def activation_pass_bytes(m: ModelSpec) -> float:
    """HBM bytes per token and MLP column of the fused activation's one pass in bf16: gated, read the 2f-wide
    fc1 output and write f (6); GELU, read f and write f (4). Derived: docs/formulas.md#compute.memory_bound"""
    return 6.0 if m.gated_mlp else 4.0


def jit_routed_bytes(m: ModelSpec, plan: ParallelPlan) -> tuple[Any, Any]:
    """(pass, rerun) HBM bytes of an MoE layer's routed experts' gated activation that Megatron-Core's jit_fuser
    kernel runs (ParallelPlan.jit_activation), one micro-batch, one rank, in elementwise_bytes' forward-equivalent
    units (a part of expert_node_bytes): the one fused pass (activation_pass_bytes on the k rows a token of f_e,
    none on the fused MXFP8 grouped MLP's share) and, with moe_act recomputed, its forward once more (a third).
    (0, 0) without jit_activation, a gated MLP or fused kernels. Source: NVIDIA/Megatron-LM
    megatron/core/transformer/moe/experts.py (TEGroupedMLP: weighted_bias_swiglu_impl /
    weighted_bias_quick_geglu_impl under bias_activation_fusion), fusions/fused_bias_swiglu.py and
    fused_bias_geglu.py (@jit_fuser), jit.py (jit_fuser = torch.compile on torch >= 2.2, since 473225f9a5) at
    d98e8a6. Derived: docs/formulas.md#compute.jit_activation"""
    if not (m.is_moe and m.gated_mlp):
        return 0.0, 0.0
    on = where(plan.jit_activation & plan.fused_kernels, 1.0, 0.0)
    fused = where(fused_grouped_mlp(m, plan), plan.low_precision_layer_fraction(m.num_hidden_layers), 0.0)
    rows = plan.seq_len / plan.cp * plan.micro_batch * m.expert_ffn * m.num_experts_per_tok / plan.tp
    one = on * activation_pass_bytes(m) * rows * (1.0 - fused)
    return one, one * where(plan.recomputes("moe_act"), 1.0, 0.0) / 3


def jit_activation_bytes(m: ModelSpec, plan: ParallelPlan, moe: bool) -> tuple[Any, Any]:
    """(pass, rerun) HBM bytes of one layer's gated activation that Megatron-Core's jit_fuser kernel runs, in
    elementwise_bytes' forward-equivalent units (a part of them): the dense MLP's or shared experts' one fused
    pass (bias_swiglu_impl) and the routed experts' (jit_routed_bytes); the rerun is the routed experts' moe_act
    forward (jit_routed_bytes) and, with `moe` recomputed, the shared and routed passes' forward once more (a
    third each: the same kernels rerun inside the checkpointed MoELayer.forward, the part of moe_recompute_bytes
    that is theirs). Derived: docs/formulas.md#compute.jit_activation"""
    f = (m.shared_ffn or 0) if moe else m.intermediate_size * dense_mlp_share(m)
    on = where(plan.jit_activation & plan.fused_kernels, 1.0, 0.0) if m.gated_mlp else 0.0
    one = on * activation_pass_bytes(m) * plan.seq_len / plan.cp * plan.micro_batch * f / plan.tp
    routed, rerun = jit_routed_bytes(m, plan) if moe else (0.0, 0.0)
    if moe and m.is_moe and plan.recompute_modules:  # workload switches: one value for all plans of a search
        rerun = rerun + where(plan.recomputes("moe"), (one + routed) / 3, 0.0)
    return one + routed, rerun


def moe_routing_bytes(m: ModelSpec) -> float:
    """HBM bytes per token of one MoE layer's routing, forward, in 16 bits, as serving's step prices it: the
    router's fp32 scores over the E experts (softmax and top-k: read and write 8E) and the permute of the token
    into its k expert copies and back (read and write the k copies each way: 8kh; h the latent width of a latent
    MoE). Training prices the kernels' own passes instead (moe_routing_train_bytes).
    Derived: docs/formulas.md#compute.memory_bound"""
    return 8.0 * m.num_experts + 8.0 * m.num_experts_per_tok * m.expert_width


ROUTER_BYTES = (13.0, 13.0)
"""(forward, backward) HBM bytes per token and expert of Transformer Engine's fused router with fp32 logits
(Megatron-Core moe_router_dtype fp32; softmax, sigmoid or sqrtsoftplus, with or without group-limited top-k and
expert bias, all in one kernel's registers). Forward reads the logits (4) and writes the probs (4, zeros but the
k chosen), the fp32 intermediate_output saved for backward (4) and the routing map (1, bytemap): 13. Backward
reads the probs' gradient (4), intermediate_output (4) and the routing map (1) and writes the logits' gradient
(4): 13, one pass. Source: NVIDIA/TransformerEngine transformer_engine/common/fused_router/
fused_topk_with_score_function.cu at d0067d0 (fused_topk_with_score_function_forward_kernel, _backward_kernel);
pytorch/router.py FusedTopkScoreFunction. Derived: docs/formulas.md#moe.routing_passes"""

ROW_ID_MAP_BYTES = 17.0
"""HBM bytes per token and expert of Transformer Engine's row-id map, built in the permute's forward only (three
Triton passes over the int32 [T, 2E+1] map): pass 1 reads the bool routing map (1) and writes each token's
rank within its expert (4); pass 2 reads and rewrites it with the block offsets (4 + 4); pass 3 reads it (4) and
writes the k destination rows and expert ids (2k int32 a token, not counted). Source: NVIDIA/TransformerEngine
transformer_engine/common/triton/permutation.py at d0067d0 (_row_id_map_pass_1/2/3_kernel).
Derived: docs/formulas.md#moe.routing_passes"""

PERMUTE_BYTES = 4.0
"""HBM bytes per element of a token's k + 1 rows of width w in bf16 of one permute and its unpermute, either
direction: the permute reads the token's row once (2) and writes its k copies (2 each); the unpermute reads the k
copies (2 each) and writes the summed row (2), the fp32 accumulation in registers. Megatron-Core's dispatchers
permute with the probs and unpermute without them (the experts' activation applies the probs), so backward is
the same pair reversed: the unpermute's backward is a permute of the gradient (moe_unpermute_mask_map_backward_no
_probs), the permute's an unpermute (moe_permute_mask_map_backward). The k fp32 probs and int32 map entries a
token each kernel moves are not counted (under 1% at w >= 1024). Source: NVIDIA/TransformerEngine
transformer_engine/common/triton/permutation.py at d0067d0 (_permute_kernel, _unpermute_kernel);
pytorch/permutation.py; NVIDIA/Megatron-LM megatron/core/transformer/moe/token_dispatcher.py at d98e8a6.
Derived: docs/formulas.md#moe.routing_passes"""

PROB_GRAD_FILL_BYTES = 4.0
"""HBM bytes per token and expert the permute's backward writes into the probs' gradient: the whole fp32 row of
E zeroed before the k routed entries (_unpermute_kernel with PERMUTE_PROBS). Source: NVIDIA/TransformerEngine
transformer_engine/common/triton/permutation.py at d0067d0. Derived: docs/formulas.md#moe.routing_passes"""


ROUTER_EAGER_BYTES = (37.0, 4.0)
"""(forward, backward) HBM bytes per token and expert of the router without moe_router_fusion (Megatron-Core's
eager topk_routing_with_score_function, fp32 logits, not deterministic), beyond torch.topk's own passes (time:
cost.moe_kernels): forward the probs' zeros_like (write 4) and the out-of-place scatter's copy of it (read 4,
write 4), the map's zeros_like (write 4), .int() (read 4, write 4), the out-of-place scatter's copy (int32: read
4, write 4) and .bool() (read 4, write 1): 4 + 8 + 4 + 8 + 8 + 5 = 37; backward torch.topk's (or gather's)
zero-filled [T, E] gradient (write 4). The scatters' sources and the k-wide softmax are k a token, not counted;
a sigmoid or sqrtsoftplus score function's [T, E] passes and an expert bias's add are not counted either.
Tensor.scatter is out of place: ATen's scatter copies self into the new output before scattering into it.
Source: NVIDIA/Megatron-LM at d98e8a6, megatron/core/transformer/moe/moe_utils.py
(topk_routing_with_score_function: torch.zeros_like(logits).scatter(1, top_indices, probs) and
torch.zeros_like(logits).int().scatter(1, top_indices, 1).bool()); pytorch/pytorch
aten/src/ATen/native/TensorAdvancedIndexing.cpp (scatter_impl: out.copy_(self) when out is not self).
Derived: docs/formulas.md#moe.router_fusion"""


def moe_router_passes(m: ModelSpec, plan: ParallelPlan) -> tuple[Any, Any]:
    """(forward, backward) HBM bytes per token of one MoE layer's router: Transformer Engine's fused kernel
    (ROUTER_BYTES x E, one pass each way) with moe_router_fusion, else the eager ops (ROUTER_EAGER_BYTES x E).
    Derived: docs/formulas.md#moe.routing_passes, docs/formulas.md#moe.router_fusion"""
    E = m.num_experts
    return (where(plan.moe_router_fusion, ROUTER_BYTES[0], ROUTER_EAGER_BYTES[0]) * E,
            where(plan.moe_router_fusion, ROUTER_BYTES[1], ROUTER_EAGER_BYTES[1]) * E)


AUX_LOSS_BYTES = (18.0, 28.0)
"""(forward, backward) HBM bytes per token and expert of the auxiliary load-balancing loss with
moe_router_fusion and fp32 logits: forward Transformer Engine's fused scores for the loss (read the logits 4;
write the fp32 scores 4, the fp32 intermediate_output saved for backward 4 and the bool routing map 1: 13), the
token counts (routing_map.sum over tokens: read the map 1) and the fused loss (read the scores 4): 18; backward
the fused loss's (write the scores' gradient 4), the fused scores' (read that gradient 4 and intermediate_output
4, write the logits' gradient 4: 12) and the sum of the logits' two gradients, the top-k's and the loss's (read
4 + 4, write 4: 12): 28. seq_aux_loss and global_aux_loss reshape the same [T, E] tensors per sequence or sum
them into E counts: the same bytes. Source: NVIDIA/TransformerEngine at d0067d0,
transformer_engine/common/fused_router/fused_score_for_moe_aux_loss.cu (forward and backward kernels),
fused_moe_aux_loss.cu (fused_moe_aux_loss_forward_kernel reads probs once; _backward_kernel writes grad_probs),
pytorch/router.py (FusedComputeScoresForMoEAuxLoss, FusedAuxLoss); NVIDIA/Megatron-LM at d98e8a6,
megatron/core/transformer/moe/router.py (TopKRouter.routing, _apply_aux_loss, _apply_seq_aux_loss,
_apply_global_aux_loss), moe_utils.py (compute_routing_scores_for_aux_loss, switch_load_balancing_loss_func,
get_tokens_per_expert_and_token_count). Derived: docs/formulas.md#moe.aux_loss_bytes"""

AUX_LOSS_EAGER_FORWARD_BYTES = 38.0
"""HBM bytes per token and expert of the auxiliary loss's forward without moe_router_fusion (softmax scores,
compute_routing_scores_for_aux_loss fused=False): the softmax (read 4, write 4: 8), the routing map's
zeros_like (write fp32 4), .int() (read 4, write 4), the out-of-place scatter's copy (read 4, write 4) and
.bool() (read 4, write 1): 25, the token counts (read 1) and probs.sum over tokens (read 4): 38. torch.topk's
passes are time (cost.moe_kernels). The backward moves the fused path's 28: the expanded gradient of the sum
made contiguous (write 4), the softmax's backward (read 4 + 4, write 4) and the logits' two gradients' sum (12).
Source: NVIDIA/Megatron-LM at d98e8a6, megatron/core/transformer/moe/moe_utils.py
(compute_routing_scores_for_aux_loss, switch_load_balancing_loss_func with fused=False).
Derived: docs/formulas.md#moe.aux_loss_bytes"""


def moe_aux_loss_passes(m: ModelSpec, plan: ParallelPlan) -> tuple[Any, Any]:
    """(forward, backward) HBM bytes per token of one MoE layer's auxiliary load-balancing loss where the model
    trains with one (cost.kernels.aux_loss_on): AUX_LOSS_BYTES x E with moe_router_fusion, else
    AUX_LOSS_EAGER_FORWARD_BYTES x E forward and the same backward; (0, 0) without the loss.
    Derived: docs/formulas.md#moe.aux_loss_bytes"""
    from llmplan.cost.kernels import aux_loss_on  # kernels builds on overhead, which imports this module
    if not aux_loss_on(m):
        return 0.0, 0.0
    forward = where(plan.moe_router_fusion, AUX_LOSS_BYTES[0], AUX_LOSS_EAGER_FORWARD_BYTES)
    return forward * m.num_experts, AUX_LOSS_BYTES[1] * m.num_experts


def moe_permute_passes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """(forward, backward) HBM bytes per token of one MoE layer's permute and unpermute in training: forward the
    row-id map (ROW_ID_MAP_BYTES x E) and the pair (PERMUTE_BYTES x (k + 1) x w; w the latent width of a latent
    MoE), backward the pair reversed and the probs' gradient row (PROB_GRAD_FILL_BYTES x E). HybridEP runs
    neither Transformer Engine kernel: hybridep_permute_passes, and its metadata preprocessing in forward
    (hybridep_metadata_bytes). Derived: docs/formulas.md#moe.routing_passes"""
    if plan.moe_dispatcher == "deepep" and plan.moe_flex_backend == "hybridep":  # workload switches
        forward, backward = hybridep_permute_passes(m, plan)
        return forward + hybridep_metadata_bytes(m, plan), backward
    pair = PERMUTE_BYTES * (m.num_experts_per_tok + 1) * m.expert_width
    return ROW_ID_MAP_BYTES * m.num_experts + pair, PROB_GRAD_FILL_BYTES * m.num_experts + pair


def hybridep_permute_passes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """(forward, backward) HBM bytes per token of one MoE layer's token permute and unpermute with the flex
    dispatcher's HybridEP backend: Megatron-Core hands HybridEP's output straight to the experts
    (get_permuted_hidden_states_by_experts returns it unchanged), so no Transformer Engine permute, row-id map
    or probs-gradient fill runs. HybridEP's dispatch writes one bf16 row per (token, receiving rank) into the
    rank's registered buffer (the all-to-all, priced in comm), then its permute reads each received row once and
    writes its copies for the rank's routed experts into the experts' input (2 x (rows + k) x w a token); the
    combine's unpermute reads the k expert rows and writes one fp32-summed row per receiving rank (2 x (k + rows)
    x w): PERMUTE_BYTES x (k + rows) x w each way, rows = dispatch_rows (the ranks a token reaches). Backward
    runs the same pair (HybridEPDispatch.backward is combine_with_unpermute, HybridEPCombine.backward
    dispatch_with_permute). Fusing permute into dispatch (moe_permute_fusion_into_hybridep) moves the same
    bytes: its permute blocks read the received chunks from the same buffer. The int32 dense_to_expert_map
    entries (E/ep a received row) and the probs (hybridep_prob_permute_bytes) are not counted here.
    Source: deepseek-ai/DeepEP hybrid-ep @94a9f8f6, csrc/hybrid_ep/extension/permute.cu (permute_kernel,
    unpermute_kernel), executor/executor.cu (dispatch_with_permute: standalone permute reads
    expert_output_token); NVIDIA/Megatron-LM @d98e8a6, megatron/core/transformer/moe/token_dispatcher.py
    (_HybridEPManager), fused_a2a.py (HybridEPDispatch, HybridEPCombine). Derived:
    docs/formulas.md#moe.hybridep_permute"""
    from llmplan.cost.comm import dispatch_rows  # comm builds on this module: imported where used
    pair = PERMUTE_BYTES * (m.num_experts_per_tok + dispatch_rows(m, plan)) * m.expert_width
    return pair, pair


HYBRIDEP_METADATA_READS = 2
"""Reads of the gathered bool routing map by HybridEP's metadata preprocessing kernel (`scan`), one byte a
(token, expert): its step 0 loads each token's row to sum the tokens each rank of the NVLink domain needs, step 2
loads it again to write the exclusive scans (sparse_to_dense_map, the local experts' maps). Source:
deepseek-ai/DeepEP hybrid-ep @94a9f8f6, csrc/hybrid_ep/backend/hybrid_ep_backend.cuh (scan: routing_map_load_base_addr
in step 0 and step 2). Derived: docs/formulas.md#moe.hybridep_permute"""


def hybridep_metadata_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """HBM bytes per token of HybridEP's metadata preprocessing, once a forward dispatch (dispatch_with_permute
    without a handle: Megatron-Core's HybridEPDispatch.forward passes the routing map every forward, `moe`
    recompute's rerun included; the backward reuses the handle). Executor::metadata_preprocessing all-gathers the
    bool [tokens, E] map over the EP group (comm.hybridep: cost.comm.routing_map_bytes) and runs `scan` over every
    gathered token of the group, tokens x ep of them, each loading its NVLink domain's slice, E x g / ep bytes (g
    ranks a domain): g x E bytes per token of the rank, read HYBRIDEP_METADATA_READS times. g the EP ranks of
    one NVLink domain (cost.comm.hybridep_domain_ranks: ep with the EP group in one domain, as the Megatron-Bridge
    presets' NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN 64 = ep for Nemotron-3 Ultra on NVL72; 8 for an EP64 group
    over DGX B200 nodes; ep where ParallelPlan.nvlink_domain_ranks is not known). Its writes, 4 g bytes of
    sparse_to_dense_map a token and E / ep map entries
    a received row, are under 2% of that and not counted. 0 without expert parallelism.
    Source: deepseek-ai/DeepEP hybrid-ep @94a9f8f6, csrc/hybrid_ep/hybrid_ep.cu (metadata_preprocessing),
    executor/executor.cu (allgather_routing_map, metadata_preprocess_core), backend/hybrid_ep_backend.cuh (scan:
    num_of_total_attn_tokens = tokens x ranks per node x nodes, NUM_OF_BYTES_TO_LOAD_FOR_EACH_TOKEN = experts a
    rank x ranks per node), deep_ep/hybrid_ep_buffer.py (dispatch_with_permute: metadata_preprocessing when
    handle is None); NVIDIA/Megatron-LM @d98e8a6 megatron/core/transformer/moe/fused_a2a.py (HybridEPDispatch,
    HybridEPCombine.backward with the handle). Derived: docs/formulas.md#moe.hybridep_permute"""
    from llmplan.cost.comm import hybridep_domain_ranks  # comm builds on this module: imported where used
    return where(plan.ep > 1, HYBRIDEP_METADATA_READS * hybridep_domain_ranks(plan) * m.num_experts, 0.0)


def moe_routing_train_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """HBM bytes per token of one MoE layer's router and permutes in training, in the forward-equivalent units of
    elementwise_bytes (the stage charges three times them): forward, once more when the plan recomputes `moe`
    (Megatron-Core checkpoints MoELayer.forward whole), and the backward (moe_router_passes,
    moe_permute_passes, and the auxiliary loss's moe_aux_loss_passes), over 3.
    Derived: docs/formulas.md#moe.routing_passes"""
    passes = (moe_router_passes(m, plan), moe_aux_loss_passes(m, plan), moe_permute_passes(m, plan))
    forward, backward = sum(p[0] for p in passes), sum(p[1] for p in passes)
    return (forward * (1 + where(plan.recomputes("moe"), 1.0, 0.0)) + backward) / 3


ALLTOALL_SORT_BYTES = 4.0
"""HBM bytes per element of one received expert row (bf16) of one sort by local expert: read 2, write 2
(ParallelPlan.moe_dispatcher alltoall with more than one local expert). Derived: docs/formulas.md#moe.alltoall_sort"""


def alltoall_sort_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """HBM bytes per token of an MoE layer's second permutation with Megatron-Core's alltoall dispatcher, in the
    forward-equivalent units of elementwise_bytes (the stage charges three times them): the rows an EP rank
    receives arrive grouped by source rank, so with more than one local expert (E / ep > 1) dispatch_postprocess
    sorts them by local expert (sort_chunks_by_idxs: every received copy read and written once) and
    combine_preprocess restores the order before the combine all-to-all; backward runs the inverse sort on each
    gradient. On the k copies of width w per token (times the capacity factor when padded: drop_and_pad
    transposes the padded buffer into a contiguous copy instead) that is ALLTOALL_SORT_BYTES x k x w per sort,
    two sorts in forward and two in backward. The flex dispatcher (deepep) permutes straight into the local
    experts' order and pays no sort; neither does one local expert, nor a plan without expert parallelism (no
    all-to-all: Megatron-Core's default allgather dispatcher permutes straight into expert order). cost.compute
    prices these bytes at the copy bandwidth (alltoall_sort_layer_bytes, docs/formulas.md#compute.copy_bandwidth).
    Source: NVIDIA/Megatron-LM megatron/core/transformer/moe/token_dispatcher.py
    MoEAlltoAllTokenDispatcher.dispatch_postprocess
    ("Permutation 2: Sort tokens by local expert"), combine_preprocess ("Unpermutation 2"), core_r0.9.0 - core_v0.19.0.
    Derived: docs/formulas.md#moe.alltoall_sort"""
    if not m.is_moe:
        return 0.0
    sorted_rows = (plan.moe_dispatcher == "alltoall") & (plan.ep > 1) & (m.num_experts / plan.ep > 1)
    # the received rows, padded to capacity when a capacity factor is set (drop_and_pad: the transpose's copy)
    per_sort = ALLTOALL_SORT_BYTES * m.num_experts_per_tok * m.expert_width * plan.expert_padding
    return where(sorted_rows, (2 + 2) * per_sort / 3, 0.0)


QUANT_PADDING_BYTES = 4.0
"""HBM bytes per element of one routed row (bf16) of one pass of Transformer Engine's Fp8Padding / Fp8Unpadding
(fused_multi_row_padding / _unpadding: each row read once and written once into the padded or unpadded buffer).
Derived: docs/formulas.md#moe.quant_padding"""


def quant_padding_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """HBM bytes per token of TEGroupedMLP's quantisation padding in an fp8 / fp4 recipe, in the forward-equivalent
    units of elementwise_bytes (the stage charges three times them). Megatron-Core pads each local expert's rows
    to the recipe's GEMM alignment before the grouped linears (Fp8Padding, 16 rows; 32 for MXFP8 / NVFP4) and
    unpads the output (Fp8Unpadding); backward unpads the input's gradient and pads the output's. Transformer
    Engine skips both where every expert's count is aligned already: where the router pads the routing map
    (moe_router_padding_for_quantization: ParallelPlan.moe_router_padding, cost.gemm.router_padding_share), where
    HybridEP's dispatch pads to the
    alignment itself (moe_flex_backend hybridep), and where the rows are padded to a capacity the alignment
    divides (received rows an expert: ep x etp x ceil(tokens x k x c / E): the alltoall dispatcher all-gathers the
    received rows over expert TP). Otherwise (dropless, forced-balance routing:
    random counts) 4 passes of QUANT_PADDING_BYTES on the k routed copies of width w a token. Megatron-Core's
    expert paths pad: TEGroupedMLP (expert_gemm per-expert) and, at d0b3b775, the op-fuser's fused grouped MLP
    (fused_grouped_mlp); other grouped kernels (DeepGEMM, torch._grouped_mm) align in their own permute and pay
    none here. The probs' fp32 column (4 of 2w bytes a row) is left out. Source: NVIDIA/Megatron-LM
    megatron/core/transformer/moe/experts.py TEGroupedMLP.forward
    (quantization_padding) at 0d8e0714 / b0cc2706 / d0b3b775, moe_utils.py skip_routed_expert_padding at
    d0b3b775; NVIDIA/TransformerEngine transformer_engine/pytorch/module/fp8_padding.py (Fp8Padding.forward:
    "no padding needed"); the rows an expert at capacity: Megatron-LM core_v0.14.0 token_dispatcher.py
    MoEAlltoAllTokenDispatcher.preprocess (capacity * tp_size * ep_size, tp_size the expert-TP group's).
    Derived: docs/formulas.md#moe.quant_padding"""
    hybridep = plan.moe_dispatcher == "deepep" and plan.moe_flex_backend == "hybridep"
    if not (m.is_moe and plan.low_precision) or hybridep or plan.moe_router_padding:
        return 0.0  # workload switches: one value for all plans of a search
    k, w = m.num_experts_per_tok, m.expert_width
    megatron_experts = (plan.expert_gemm == "per-expert") | fused_grouped_mlp(m, plan)
    passes = where(megatron_experts, (2 + 2) * QUANT_PADDING_BYTES * k * w / 3, 0.0)
    if plan.moe_capacity_factor is None:
        return passes
    align = 32 if plan.gemm_format in ("mxfp8", "nvfp4") else 16
    tokens = plan.seq_len / plan.cp * plan.micro_batch / where(plan.sp, plan.tp, 1)
    received = plan.ep * plan.etp_resolved * np.ceil(tokens * k * plan.moe_capacity_factor / m.num_experts)
    return where(received % align == 0, 0.0, passes * plan.expert_padding)


def expert_copy_bytes(m: ModelSpec, plan: ParallelPlan, tokens: Any = None) -> Any:
    """HBM bytes of one MoE layer's streaming copies of the routed rows, one rank, in the forward-equivalent
    units of elementwise_bytes: the alltoall dispatcher's sort by local expert (alltoall_sort_bytes) and the
    quantisation padding (quant_padding_bytes) a token, times `tokens` (default the micro-batch's T = s / cp x b)
    over t_sp (tp with sequence parallelism, else 1). The one place of the expression expert_node_bytes,
    alltoall_sort_layer_bytes, moe_recompute_bytes (its forward half) and cost.compute.expert_node_seconds
    price. Derived: docs/formulas.md#compute.copy_bandwidth"""
    T = plan.seq_len / plan.cp * plan.micro_batch if tokens is None else tokens
    return (alltoall_sort_bytes(m, plan) + quant_padding_bytes(m, plan)) * T / where(plan.sp, plan.tp, 1)


def alltoall_sort_layer_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """The streaming copies' share of one MoE layer's elementwise_bytes, one micro-batch, one rank: the sort by
    local expert and the quantisation padding (expert_copy_bytes), and with `moe` recomputed the rerun's forward
    half of them (moe_recompute_bytes). cost.compute prices these bytes at the copy bandwidth.
    Derived: docs/formulas.md#compute.copy_bandwidth"""
    sorts = expert_copy_bytes(m, plan)
    rerun = where(plan.recomputes("moe"), 0.5, 0.0) if plan.recompute_modules else 0.0
    return sorts * (1 + rerun)


HYBRIDEP_PERMUTE_PROB_BYTES = 4.0
"""Bytes of one prob HybridEP's standalone permute and unpermute read or write (fp32: PermuteArgs' float
probs; deepseek-ai/DeepEP csrc/hybrid_ep/extension/permute.cuh at 17cfb81)."""


def hybridep_prob_permute_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """HBM bytes per token of HybridEP's standalone permute and unpermute on the fp32 probs (moe_flex_backend
    hybridep; Megatron-Core's moe_permute_fusion_into_hybridep is off by default), in the forward-equivalent
    units of elementwise_bytes (the stage charges three times them). Forward, the permute reads only the rank's
    routed entries of a received prob row and writes one prob per permuted row: 4k read, 4k written a token.
    Backward (HybridEPDispatch.backward's combine_with_unpermute on the probs' gradient) the unpermute reads
    the k permuted gradients (4k) and writes, zeros but the rank's routed entries, the whole prob row the
    backward combine sends: experts a rank (E/ep) times the NVLink domain's EP ranks g (cost.comm.
    hybridep_domain_ranks; E with the EP group in one domain, g = ep), for each received row, dispatch_rows(m,
    plan) a token: (12k + 4·(E/ep)·g·rows) / 3. deepep and alltoall carry no such row. Source: deepseek-ai/DeepEP
    csrc/hybrid_ep/extension/permute.cu at 17cfb81 (permute_kernel, unpermute_kernel "writes a full prob row").
    Derived: docs/formulas.md#moe.hybridep_prob_permute"""
    if not (m.is_moe and plan.moe_dispatcher == "deepep" and plan.moe_flex_backend == "hybridep"):
        return 0.0  # workload switches: one value for all plans of a search
    from llmplan.cost.comm import dispatch_rows, hybridep_domain_ranks  # comm builds on this module
    k, rows = m.num_experts_per_tok, dispatch_rows(m, plan)
    row = m.num_experts / plan.ep * hybridep_domain_ranks(plan)  # the domain's experts: a prob row's width
    total = HYBRIDEP_PERMUTE_PROB_BYTES * (3 * k + row * rows)
    return where(plan.ep > 1, total / 3, 0.0)


def expert_bias_bytes(m: ModelSpec, plan: ParallelPlan) -> float:
    """HBM bytes per token of an MoE layer's expert output bias (models with mlp_bias: GPT-OSS), in the
    forward-equivalent units of elementwise_bytes (the stage charges three times them). Megatron-Core builds the
    grouped fc2 with skip_bias_add and adds the bias outside the GEMM, expert by expert, as t + b * p, then
    concatenates and casts back, on the k output copies of width w. With fp32 probabilities p (DeepEP and
    HybridEP take only fp32 probs) forward writes b * p (4 bytes an element), reads t and it and writes the
    fp32 sum (10), copies it into the concatenation (8) and casts it to bf16 (6): 28; backward casts the
    gradient to fp32 (6) and back for t (6) and forms and reduces grad * p and grad * b (12 + 12): 36. With the
    alltoall dispatcher p stays in the router's bf16: 2 + 6 + 4 forward (the cast is a no-op), 6 + 6 backward.
    The fc1 bias rides the grouped GEMM (skip_bias_add False). Source: NVIDIA/Megatron-LM
    megatron/core/transformer/moe/experts.py TEGroupedMLP._apply_bias, token_dispatcher.py ("DeepEP only
    supports float32 probs") (core_v0.15.0 - core_v0.19.0). Derived: docs/formulas.md#moe.expert_bias"""
    if not (m.is_moe and m.mlp_bias):
        return 0.0
    forward, backward = (28.0, 36.0) if plan.moe_dispatcher == "deepep" else (12.0, 12.0)
    # TE's op-fuser GroupedLinear adds the bias in the GEMM (ParallelPlan.expert_bias_fusion)
    return where(plan.expert_bias_fusion, 0.0, (forward + backward) / 3 * m.num_experts_per_tok * m.expert_width)


def moe_recompute_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """HBM bytes per token of an MoE layer's memory-bound forward that selective recompute of `moe` runs once more
    in backward (Megatron-Core checkpoints MoELayer.forward whole), in the forward-equivalent units of
    elementwise_bytes (a third: the stage charges three times them): the alltoall dispatcher's two sorts by local
    expert (alltoall_sort_bytes' forward half), the routed experts' activation pass on their k rows of f_e
    (activation_forward_bytes, the kernels the forward ran rerun: the fused pass, or the eager silu and product
    without fused_kernels; none on the fused MXFP8 grouped MLP's share, whose GEMM epilogue runs it; a clamped
    GLU's eager clamp with it) and the shared experts' (f_s). The router and the permutes rerun in
    moe_routing_train_bytes (one place for their passes). 0 without `moe` in the recompute modules.
    Source: NVIDIA/Megatron-LM megatron/core/transformer/moe/moe_layer.py (MoELayer.forward,
    tensor_parallel.checkpoint(custom_forward) when moe_layer_recompute, core_v0.14.0 - core_v0.19.0);
    NVIDIA-NeMo/Megatron-Bridge scripts/performance/perf_leaderboard/analysis_report_det_vs_nondet.md at
    6d780951a (6 sorts and 4 sort maps a layer and micro-batch under it, Nsight). Derived:
    docs/formulas.md#moe.recompute_rerun"""
    if not (m.is_moe and plan.recompute_modules):
        return 0.0  # workload switches: one value for all plans of a search
    T, t = plan.seq_len / plan.cp * plan.micro_batch, plan.tp
    fused = where(fused_grouped_mlp(m, plan), plan.low_precision_layer_fraction(m.num_hidden_layers), 0.0)
    clamp = GLU_CLAMP_BYTES[0] if m.swiglu_limit is not None and m.gated_mlp else 0.0
    one = activation_forward_bytes(m, plan)  # the forward's kernels: fused, or eager without fused_kernels
    routed_act = ((one * (1.0 - fused) + where(plan.glu_clamp_fusion, 0.0, clamp))
                  * m.expert_ffn * m.num_experts_per_tok / t)
    shared_act = one * (m.shared_ffn or 0) / t
    # forward's two of the four sorts and of the four padding passes, a token: 3/2 of them in the third the stage
    # counts three times
    sorts = expert_copy_bytes(m, plan, 3 / 2)
    return where(plan.recomputes("moe"), (sorts + routed_act + shared_act) * T / 3, 0.0)


def expert_node_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """HBM bytes of one MoE layer's routed experts beside their GEMMs, forward, one micro-batch, one rank, in the
    forward-equivalent units of elementwise_bytes (which counts them): the experts' activation on their k rows
    a token (the fused pass, its eager clamp and its moe_act recompute, an eager fc1 bias, less what Transformer
    Engine's fused MXFP8 grouped MLP runs in its GEMMs' epilogues), the expert output bias, the alltoall
    dispatcher's sort by local expert and HybridEP's prob permute: the memory-bound work of Megatron-Core's
    `mlp` node (routed_experts_compute, between dispatch and combine), which the EP overlap schedules apart
    from the attention node (cost.compute.ep_pair_windows). Derived: docs/formulas.md#compute.memory_bound"""
    T, t = plan.seq_len / plan.cp * plan.micro_batch, plan.tp
    act = (eager_activation_bytes(m, plan) + expert_activation_extra_bytes(m, plan) + expert_fc1_bias_bytes(m, plan)
           - fused_expert_activation_bytes(m, plan)) * T * m.expert_ffn * m.num_experts_per_tok / t
    return act + expert_copy_bytes(m, plan) + (expert_bias_bytes(m, plan)
                                                + hybridep_prob_permute_bytes(m, plan)) * T / where(plan.sp, t, 1)


EAGER_ROPE_BYTES = (24.0, 26.0)
"""(forward, backward) HBM bytes per element of q and k of Megatron-Core's eager rotary in bf16 (ParallelPlan.
rope_fusion False), against the fused kernel's 4 + 8: forward t * cos (read 2, write 2), rotate-half's negated
half (2 an element) and its concatenation (4), the product with sin (4), the sum (read 4, write 2) and the
final torch.cat with the empty pass-through part (4); backward the two products' gradients (4 + 4), the
negation (2) and the chunk's concatenation (4), the two branches summed (6) and the slice t[..., :rot_dim]
scattered into a zeroed full-size gradient (6). Source: NVIDIA/Megatron-LM megatron/core/models/common/
embeddings/rope_utils.py _apply_rotary_pos_emb_bshd, _rotate_half (core_v0.15.0 - core_v0.19.0); PyTorch
tools/autograd/derivatives.yaml (slice_backward, split). Derived: docs/formulas.md#compute.memory_bound"""

GLU_CLAMP_BYTES = (16.0, 30.0)
"""(forward, backward) HBM bytes per (token, expert) row and expert-FFN column of a gated MLP's eager clamp
(Megatron-Core weighted_bias_quick_geglu_impl with activation_func_clamp_value), in bf16 over the 2f-wide fc1
output: forward the two clamps read and write their halves (8) and torch.cat copies them together (8);
backward the gate's one-sided clamp gradient compares its saved input (read 2, write a 1-byte mask) and
selects the gradient (read 1 + 2, write 2): 8; the linear half's two-sided one makes two masks, ANDs them
and selects: 14; the chunk's backward concatenates the two halves' gradients (8).
Source: NVIDIA/Megatron-LM megatron/core/fusions/fused_bias_geglu.py weighted_bias_quick_geglu_impl
(core_v0.15.0 - core_v0.19.0); PyTorch tools/autograd/derivatives.yaml and FunctionsManual.cpp clamp_backward
(where(self <= max, grad, 0); where((self >= min).logical_and_(self <= max), grad, 0)), split_backward
(concatenates). Derived: docs/formulas.md#moe.glu_clamp"""


EAGER_FC1_BIAS_BYTES = (8.0, 2.0)
"""(forward, backward) HBM bytes per element of the routed experts' fc1 output (c·f_e wide, bf16) of a fc1 bias
added after a grouped matmul that takes none (ParallelPlan.expert_fc1_bias_fusion False): forward the bias
repeated to every routed row (write 2) and the add (read 2 + 2, write 2); backward the add passes the gradient
through and the repeat's backward sums it per expert (read 2). Source: NVIDIA-NeMo/Automodel
nemo_automodel/components/moe/experts.py at 36044ad3d (GroupedExpertsDeepEP.forward, _apply_bias:
torch.repeat_interleave, flat_value + expanded_bias; _DeterministicBiasRepeatInterleave.backward); pytorch/torchtitan
torchtitan/models/gpt_oss/model/moe.py at 09e93ca (_run_experts_grouped_mm: b1.repeat_interleave, h + b1).
Derived: docs/formulas.md#moe.expert_fc1_bias"""


def expert_fc1_bias_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """HBM bytes per (token, expert) row and expert-FFN column of a biased expert's fc1 bias added outside the
    grouped GEMM (EAGER_FC1_BIAS_BYTES over the c = 2 columns a gated MLP's fc1 writes per FFN column), in the
    forward-equivalent units of elementwise_bytes (the stage charges three times them); 0 where the grouped GEMM
    adds it (expert_fc1_bias_fusion, Transformer Engine's GroupedLinear) or the experts have no bias.
    Derived: docs/formulas.md#moe.expert_fc1_bias"""
    if not (m.is_moe and m.mlp_bias):
        return 0.0
    c = 2 if m.gated_mlp else 1
    return where(plan.expert_fc1_bias_fusion, 0.0, c * sum(EAGER_FC1_BIAS_BYTES) / 3)


def expert_activation_extra_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """HBM bytes per (token, expert) row and expert-FFN column that the routed experts' activation costs beyond
    the pass expert_node_bytes charges (eager_activation_bytes: the fused kernel's read 2f, write f, or the eager
    ops without fused_kernels), in elementwise_bytes' forward-equivalent units (the stage charges three times
    them): the eager clamp of a clamped GLU
    (ModelSpec.swiglu_limit without ParallelPlan.glu_clamp_fusion: GLU_CLAMP_BYTES), and with moe_act in the
    recompute modules the activation's forward once more in backward, the clamp's forward with it (Megatron-Core
    checkpoints bias_act_func with CheckpointWithoutOutput and reruns it before fc2's backward). The rerun runs
    the kernels the forward ran (activation_forward_bytes): the fused pass with fused_kernels, a gated MLP's
    eager silu and product without (bias_act_func's eager branch when bias_activation_fusion is off).
    Source: NVIDIA/Megatron-LM megatron/core/transformer/moe/experts.py TEGroupedMLP.forward (bias_act_func,
    activation_recompute, core_v0.15.0 - core_v0.19.0). Derived: docs/formulas.md#moe.glu_clamp"""
    if not m.is_moe:
        return 0.0
    rerun = where(plan.recomputes("moe_act"), 1.0, 0.0)
    clamp_fwd, clamp_bwd = GLU_CLAMP_BYTES if m.swiglu_limit is not None and m.gated_mlp else (0.0, 0.0)
    clamp = where(plan.glu_clamp_fusion, 0.0, clamp_fwd * (1 + rerun) + clamp_bwd)
    return (clamp + rerun * activation_forward_bytes(m, plan)) / 3


def fused_expert_activation_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """HBM bytes per (token, expert) row and expert-FFN column of the routed experts' activation that Transformer
    Engine's fused MXFP8 grouped MLP (cost.gemm.fused_grouped_mlp) does not spend, in elementwise_bytes'
    forward-equivalent units, on the share of layers in MXFP8: the activation's pass as expert_node_bytes
    charges it (eager_activation_bytes, forward and, as the stage counts it, backward), which fc1's grouped GEMM
    applies in its epilogue with the router's probabilities (the dGLU / dSReLU in fc2's dgrad GEMM's), and with
    moe_act recomputed its rerun as expert_activation_extra_bytes charges it (activation_forward_bytes; the fused
    path checkpoints nothing; the dSReLU kernel rebuilds fc2's input in its epilogue): the fused path needs
    fused_kernels (fused_mlp_path), where both are the fused pass (activation_pass_bytes). The clamp of a
    clamped GLU stays with glu_clamp_fusion. 0 off the fused path. Source: NVIDIA/TransformerEngine
    transformer_engine/pytorch/ops/fused/forward_grouped_mlp.py (grouped_gemm_glu_wrapper_sm100, act_func and
    prob_tensor) and backward_grouped_mlp.py (grouped_gemm_dglu_wrapper_sm100) at v2.16; ops/fused/grouped_mlp.py
    at v2.17 (srelu, use_dsrelu_reuse); NVIDIA/Megatron-LM megatron/core/transformer/moe/experts.py at d98e8a6
    (_fused_forward: no CheckpointWithoutOutput). Derived: docs/formulas.md#moe.fused_mlp"""
    if not m.is_moe:
        return 0.0
    rerun = where(plan.recomputes("moe_act"), 1.0, 0.0)
    share = plan.low_precision_layer_fraction(m.num_hidden_layers)
    dropped = eager_activation_bytes(m, plan) + rerun * activation_forward_bytes(m, plan) / 3
    return where(fused_grouped_mlp(m, plan), dropped * share, 0.0)


FUSED_LOSS_BYTES = 16.0
"""HBM bytes per logit of a fused loss, forward and backward: the logits written in bf16, read and turned into
fp32 softmax, read again for the loss and the gradient, and the gradient written. Derived:
docs/formulas.md#compute.loss"""

UNFUSED_LOSS_BYTES = 54.0
"""HBM bytes per logit of Megatron's unfused vocab-parallel cross-entropy (ParallelPlan.fused_loss False), each
step a kernel over the whole logit tensor: the bf16 logits written (2), cast to fp32 (read 2, write 4), the max
(read 4), the max subtracted in place (8), exp in place (8), the sum (read 4), the division into the softmax
(8); backward the softmax scaled by the incoming gradient in place (8) and cast back to bf16 (read 4, write 2).
PyTorch's eager cross_entropy on fp32-cast logits (torchtitan, AutoModel) counts 50 the same way
(log_softmax's three reads and a write, nll_loss_backward's zeroed fp32 gradient, log_softmax_backward's row
sum and its two reads and a write): priced at the same 54. Source: NVIDIA/Megatron-LM
megatron/core/tensor_parallel/cross_entropy.py at core_r0.8.0 (_VocabParallelCrossEntropy, calculate_logits_max:
vocab_parallel_logits.float()). Derived: docs/formulas.md#compute.loss"""


def loss_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """HBM traffic of the output layer's loss, forward and backward, one micro-batch, one rank: FUSED_LOSS_BYTES
    per logit, UNFUSED_LOSS_BYTES without the fused loss. Derived: docs/formulas.md#compute.loss"""
    per_logit = where(plan.fused_loss, FUSED_LOSS_BYTES, UNFUSED_LOSS_BYTES)
    return per_logit * plan.seq_len / plan.cp * plan.micro_batch * padded_vocab(m.vocab_size, plan.tp) / plan.tp
