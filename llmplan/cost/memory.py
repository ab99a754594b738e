"""Training memory per GPU: weights, gradients, optimizer states, activations and the stated allowance.

All functions are pure and return bytes. The most-loaded rank is found by evaluating every pipeline stage.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmplan.cost.params import kv_heads_per_rank, padded_vocab, rank_params, stage_layers
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import MemoryAllowance, ParallelPlan
from llmplan.units import DTYPE_BYTES, GIB

ADAM_STATE_BYTES = 12.0  # fp32 master weights + first + second moments


@dataclass(frozen=True)
class ModelStateBytes:
    """Weights, gradients and optimizer states of one rank; parts sum to total."""

    weights: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer


def model_state_bytes(n_params: float, shard: int, zero: int, weight_bytes: float, grad_bytes: float,
                      optim_bytes: float = ADAM_STATE_BYTES) -> ModelStateBytes:
    """Mixed-precision Adam model states of n_params replicated parameters under ZeRO over `shard` ranks.

    Source: Rajbhandari et al. 2020 (ZeRO), Section 5: 2Ψ+2Ψ+KΨ with K=12; stage 1 shards K, stage 2 also the
    gradients, stage 3 also the parameters. Megatron's distributed optimizer is stage 1 with fp32 gradients
    (6 + 12/d bytes/param, Megatron-LM docs)."""
    return ModelStateBytes(
        weights=n_params * weight_bytes / (shard if zero >= 3 else 1),
        gradients=n_params * grad_bytes / (shard if zero >= 2 else 1),
        optimizer=n_params * optim_bytes / (shard if zero >= 1 else 1),
    )


def layer_activation_bytes(m: ModelSpec, plan: ParallelPlan, moe: bool) -> float:
    """Activation bytes one transformer layer keeps for backward, per micro-batch, on one rank.

    Source: Korthikanti et al. 2022, Table 2 (sbh(10 + 24/t + 5as/ht); SP divides the 10; selective
    recompute drops 5as²b/t; full recompute keeps 2sbh), generalised to GQA/MLA, gated MLP, MoE and CP
    in docs/formulas.md#mem.activations."""
    s, b, h, a, t = plan.seq_len / plan.cp, plan.micro_batch, m.hidden_size, m.num_attention_heads, plan.tp
    sp = t if plan.sp else 1
    if plan.recompute == "full":
        return 2 * s * b * h / sp
    # Two norm inputs (4sbh), QKV input (2sbh), MLP input (2sbh), two 1-byte dropout masks (2sbh).
    replicated = 10 * s * b * h / sp
    scores = 0.0 if (plan.recompute == "selective" or plan.flash_attention) else 5 * a * s * s * b / t
    return replicated + _attention_stored(m, plan) + scores + _mlp_stored(m, plan, moe)


def _attention_stored(m: ModelSpec, plan: ParallelPlan) -> float:
    """Q, K, V and the attention output (input of the output projection), 2 bytes each, on one TP rank."""
    s, b, t = plan.seq_len / plan.cp, plan.micro_batch, plan.tp
    heads = m.num_attention_heads / t
    if m.is_mla:
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        latents = (m.q_lora_rank or 0) + m.kv_lora_rank + m.qk_rope_head_dim
        return 2 * s * b * (heads * (2 * qk + 2 * m.v_head_dim) + latents)
    d, kvh = m.d_head, kv_heads_per_rank(m, t)
    return 2 * s * b * d * (2 * heads + 2 * kvh)


def _mlp_stored(m: ModelSpec, plan: ParallelPlan, moe: bool) -> float:
    """MLP activations: 4sbf/t for GELU (fc1 output + GELU output), 6sbf/t gated (fc1 output 2f + product f).

    MoE: each of the rank's input tokens goes to k experts; every (token, expert) row keeps its dispatched
    input (2h) and the expert's fc1/activation outputs (c·f_e/etp), plus fp32 router probabilities."""
    s, b, h, t = plan.seq_len / plan.cp, plan.micro_batch, m.hidden_size, plan.tp
    c = 6 if m.gated_mlp else 4
    if not moe:
        return c * s * b * m.intermediate_size / t
    etp = plan.etp_resolved
    tokens = s * b / (t if plan.sp else 1)
    rows = tokens * etp * m.num_experts_per_tok
    routed = rows * (2 * h + c * m.expert_ffn / etp) + tokens * m.num_experts * 4
    return routed + c * s * b * m.shared_ffn / t


def inflight_microbatches(plan: ParallelPlan, stage: int) -> float:
    """Micro-batches whose activations pipeline rank `stage` holds at its peak, in whole-stage units.

    1F1B: min(pp - i, m). Interleaved: (2(pp-i-1) + (vpp-1)·pp + 1) chunk micro-batches of 1/vpp of the
    stage each, which for i = 0 is L·(1 + (pp-1)/(pp·vpp)) layers' worth (Korthikanti et al. 2022, §4.2.3).
    Derived: docs/formulas.md#mem.inflight (warm-up counts of Megatron-LM's schedules)."""
    p, v, n = plan.pp, plan.vpp, plan.num_microbatches
    if v == 1:
        return float(min(p - stage, n))
    chunks = min(2 * (p - stage - 1) + (v - 1) * p + 1, n * v)
    return chunks / v


@dataclass(frozen=True)
class ActivationBytes:
    """Activation memory of one rank; parts sum to total."""

    layers: float
    """Transformer layers x micro-batches in flight."""
    recompute_working: float
    """Full recompute: one layer's activations rebuilt during its backward."""
    embedding: float
    """First stage: embedding dropout masks of the micro-batches in flight."""
    output: float
    """Last stage: input of the output layer and fp32 logits for the loss."""

    @property
    def total(self) -> float:
        return self.layers + self.recompute_working + self.embedding + self.output


def activation_bytes(m: ModelSpec, plan: ParallelPlan, stage: int) -> ActivationBytes:
    """Activation bytes of pipeline rank `stage` at its peak.

    Source: Korthikanti et al. 2022, Table 2 and §4.3 (embedding / output layer); docs/formulas.md#mem.activations"""
    s, b, h, t = plan.seq_len / plan.cp, plan.micro_batch, m.hidden_size, plan.tp
    V = padded_vocab(m.vocab_size, t)
    sp = t if plan.sp else 1
    n_dense, n_moe = stage_layers(m, plan, stage)
    per_mb = n_dense * layer_activation_bytes(m, plan, False) + n_moe * layer_activation_bytes(m, plan, True)
    inflight = inflight_microbatches(plan, stage)
    working = 0.0
    if plan.recompute == "full":
        no_rc = plan.model_copy(update={"recompute": "none"})
        working = layer_activation_bytes(m, no_rc, n_moe > 0)
    embedding = inflight * s * b * h / sp if stage == 0 else 0.0
    output = (2 * s * b * h / sp + 4 * s * b * V / t) if stage == plan.pp - 1 else 0.0
    return ActivationBytes(layers=inflight * per_mb, recompute_working=working, embedding=embedding, output=output)


@dataclass(frozen=True)
class TrainingMemory:
    """Memory of the most-loaded rank; weights + gradients + optimizer + activations + other = total."""

    stage: int
    """Pipeline stage of the most-loaded rank."""
    params_on_rank: float
    """Parameters held by that rank (before ZeRO sharding)."""
    weights: float
    gradients: float
    optimizer: float
    activations: float
    other: float
    """The stated allowance: fixed runtime bytes, fragmentation, ZeRO-3 gathered-layer buffers."""
    activation_parts: ActivationBytes
    capacity: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.other

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    @property
    def headroom(self) -> float:
        return self.capacity - self.total


def stage_memory(m: ModelSpec, plan: ParallelPlan, stage: int, allowance: MemoryAllowance,
                 capacity: float) -> TrainingMemory:
    """Memory of one rank of pipeline stage `stage`. Derived: docs/formulas.md#mem.total"""
    w = DTYPE_BYTES["fp32" if plan.dtype == "fp32" else "bf16"]
    g = DTYPE_BYTES["fp32" if plan.dtype == "fp32" else plan.grad_dtype]
    optim = 8.0 if plan.dtype == "fp32" else ADAM_STATE_BYTES  # no fp32 master copy in pure fp32
    rp = rank_params(m, plan, stage)
    edp = plan.num_gpus // (plan.etp_resolved * plan.ep * plan.pp)
    dense = model_state_bytes(rp.dense, plan.zero_shard, plan.zero, w, g, optim)
    expert = model_state_bytes(rp.expert, max(1, edp), plan.zero, w, g, optim)
    act = activation_bytes(m, plan, stage)
    tensors = dense.total + expert.total + act.total
    n_dense, n_moe = stage_layers(m, plan, stage)
    gathered = 2 * rp.total / max(1, n_dense + n_moe) * w if plan.zero >= 3 else 0.0  # Derived: #mem.other
    other = allowance.fixed_gib * GIB + allowance.fragmentation * tensors + gathered
    return TrainingMemory(
        stage=stage, params_on_rank=rp.total, weights=dense.weights + expert.weights,
        gradients=dense.gradients + expert.gradients, optimizer=dense.optimizer + expert.optimizer,
        activations=act.total, other=other, activation_parts=act, capacity=capacity,
    )


def training_memory(m: ModelSpec, plan: ParallelPlan, capacity: float,
                    allowance: MemoryAllowance | None = None) -> TrainingMemory:
    """Memory per GPU of the most-loaded rank: the pipeline stage with the largest total."""
    allowance = allowance or MemoryAllowance()
    return max((stage_memory(m, plan, i, allowance, capacity) for i in range(plan.pp)), key=lambda r: r.total)
