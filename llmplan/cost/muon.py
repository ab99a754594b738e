"""The Muon optimizer (ParallelPlan.optimizer muon): which parameters it updates, the bytes it keeps and the
Newton-Schulz GEMMs of its step.

Megatron-LM's Muon (NVIDIA/Megatron-LM at d0b3b7754, megatron/core/optimizer/emerging_optimizers.py, with
NVIDIA-NeMo/Emerging-Optimizers v0.2.0, the release Megatron-LM and Megatron-Bridge v0.5.0 pin) updates every 2-D
parameter except the word embedding and the output layer (_is_nonlinear_or_embedding: is_embedding_or_output_parameter
or len(shape) != 2); the rest (norms, biases, the two vocabulary matrices) go to AdamW. Its state is one
momentum buffer (OrthogonalizedOptimizer._init_group: state["momentum_buffer"] = torch.zeros_like(p.data), the fp32
master). Under --muon-tp-mode blockwise each TP rank orthogonalises its own shard (newton_schulz_tp with partition_dim
None: no TP collective); Megatron fuses a layer's gate and up projections into one linear_fc1 matrix and splits only
linear_qkv into its Q, K and V blocks (muon_split_qkv, default True).

All functions are pure and elementwise over the search's plan arrays (llmplan/arith.py).
"""

from __future__ import annotations

from typing import Any

from llmplan.arith import maximum, minimum
from llmplan.cost.compressed import hyper_connection_params, is_v4_attention
from llmplan.cost.gemm import gemm_shape_efficiency
from llmplan.cost.mixers import mean_recurrent_params
from llmplan.cost.model_states import held_stages, optimizer_share
from llmplan.cost.params import RankParams, kv_heads_per_rank
from llmplan.cost.sparse import indexer_params
from llmplan.cost.stages import stage_weight_layers
from llmplan.specs.hardware import GpuSpec
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.plan_choices import OPTIMIZER_STATE_BYTES

MUON_NS_STEPS = 5
"""Newton-Schulz iterations per Muon step. Source: NVIDIA/Megatron-LM at d0b3b7754, megatron/core/optimizer/
optimizer_config.py (muon_num_ns_steps = 5); NVIDIA-NeMo/Megatron-Bridge v0.5.0 src/megatron/bridge/recipes/utils/
optimizer_utils.py (distributed_muon_with_cosine_annealing: muon_num_ns_steps 5)."""

Shapes = tuple[tuple[Any, Any, Any], ...]
"""(matrices, rows, cols): that many rows x cols matrices on one TP rank."""


def newton_schulz_gemms(rows: Any, cols: Any) -> tuple[tuple[Any, Any, Any], ...]:
    """(M, N, K) of the three GEMMs of one quintic Newton-Schulz iteration on a rows x cols matrix, with m =
    min(rows, cols), n = max (the matrix transposed so that X X^T is the small Gram matrix): A = X X^T (m, m, n),
    A A inside B = b A + c A A (m, m, m), and B X in X <- a X + B X (m, n, m); the scalings and the normalisation
    are elementwise and left out. Source: NVIDIA-NeMo/Emerging-Optimizers v0.2.0 (1effa026),
    emerging_optimizers/orthogonalized_optimizers/muon_utils.py (newton_schulz, newton_schulz_step: X @ X.mT,
    addmm(A, A, A), addmm(X, B, X)). Derived: docs/formulas.md#optim.muon_ns"""
    m, n = minimum(rows, cols), maximum(rows, cols)
    return (m, m, n), (m, m, m), (m, n, m)


def newton_schulz_flops(rows: Any, cols: Any, steps: int = MUON_NS_STEPS) -> Any:
    """FLOPs of `steps` Newton-Schulz iterations on one rows x cols matrix (newton_schulz_gemms): steps x
    (4 m^2 n + 2 m^3). Derived: docs/formulas.md#optim.muon_ns"""
    return steps * sum(2 * M * N * K for M, N, K in newton_schulz_gemms(rows, cols))


def muon_unpriced(m: ModelSpec) -> str | None:
    """What of `m` Muon's parameter split is not priced for (None: a transformer whose layers are attention, GQA or
    MLA, and a dense or MoE MLP): recurrent mixers, hyper-connections, DeepSeek-V4 or sparse attention's indexer, a
    latent MoE, a gated attention output, MTP modules. Derived: docs/formulas.md#optim.muon_params"""
    parts = [("recurrent mixers", m.is_hybrid or mean_recurrent_params(m) > 0),
             ("hyper-connections", hyper_connection_params(m) > 0), ("DeepSeek-V4 attention", is_v4_attention(m)),
             ("a sparse-attention indexer", indexer_params(m) > 0), ("a latent MoE", bool(m.moe_latent_size)),
             ("a gated attention output", m.attention_output_gate),
             ("MTP modules", m.num_nextn_predict_layers > 0)]
    named = [what for what, on in parts if on]
    return ", ".join(named) if named else None


def attention_matrices(m: ModelSpec, t: Any) -> Shapes:
    """The attention block's Muon matrices on one TP rank of degree t: MLA's replicated down-projections and its
    split up-projections and output (Megatron's linear_q_down_proj, linear_q_up_proj or linear_q_proj,
    linear_kv_down_proj, linear_kv_up_proj, linear_proj), else Q, K and V as split blocks of linear_qkv and the output
    projection. Derived: docs/formulas.md#optim.muon_params"""
    h, a = m.hidden_size, m.num_attention_heads
    if (mla := m.mla) is not None:
        qk, q_r, kv_r = mla.qk_nope_head_dim + mla.qk_rope_head_dim, mla.q_lora_rank, mla.kv_lora_rank
        q = ((1, q_r, h), (1, a * qk / t, q_r)) if q_r else ((1, a * qk / t, h),)
        return (*q, (1, kv_r + mla.qk_rope_head_dim, h), (1, a * (mla.qk_nope_head_dim + mla.v_head_dim) / t, kv_r),
                (1, h, a * mla.v_head_dim / t))
    d, kv = m.d_head, kv_heads_per_rank(m, t)
    return (1, a * d / t, h), (2, kv * d, h), (1, h, a * d / t)


def mlp_matrices(m: ModelSpec, f: Any, t: Any, width: int | None = None) -> Shapes:
    """An MLP of width f split over t ranks: linear_fc1 (gate and up fused, 2f/t rows when gated) and linear_fc2.
    Derived: docs/formulas.md#optim.muon_params"""
    h = width or m.hidden_size
    return (1, (2 if m.gated_mlp else 1) * f / t, h), (1, h, f / t)


def layer_matrices(m: ModelSpec, t: Any, ep: Any, etp: Any) -> tuple[Shapes, Shapes, Shapes]:
    """(a dense layer's, a MoE layer's non-expert, a MoE layer's routed experts') Muon matrices on one rank of TP
    degree t: the router (E x h, replicated) and the shared expert with the MoE layer, E/ep experts of expert-TP etp.
    Derived: docs/formulas.md#optim.muon_params"""
    attn = attention_matrices(m, t)
    dense = attn + mlp_matrices(m, m.intermediate_size, t)
    if not m.is_moe:
        return dense, (), ()
    shared = mlp_matrices(m, m.shared_ffn, t) if m.shared_ffn else ()
    experts = tuple((n * m.num_experts / ep, r, c) for n, r, c in mlp_matrices(m, m.expert_ffn, etp))
    return dense, attn + ((1, m.num_experts, m.hidden_size),) + shared, experts


def model_muon_params(m: ModelSpec) -> Any:
    """Parameters of the whole model (each once) that Muon updates: every layer's matrices unsplit (the checkpoint
    holds their momentum). Derived: docs/formulas.md#optim.muon_memory"""
    dense, moe, experts = layer_matrices(m, 1, 1, 1)
    n_moe = m.num_moe_layers
    return (m.num_hidden_layers - n_moe) * _total(dense, _elements) + n_moe * (_total(moe, _elements)
                                                                               + _total(experts, _elements))


def _total(shapes: Shapes, f: Any) -> Any:
    return sum((n * f(r, c) for n, r, c in shapes), 0.0)


def _elements(rows: Any, cols: Any) -> Any:
    return rows * cols


def stage_sum(m: ModelSpec, plan: ParallelPlan, stage: Any, f: Any, paired: bool = True) -> RankParams:
    """Sum of f(rows, cols) over the Muon matrices of one rank of `stage` (and, `paired`, its paired stage under
    DualPipe), split into (dense, expert) as RankParams. Derived: docs/formulas.md#optim.muon_params"""
    dense, moe, experts = layer_matrices(m, plan.tp, plan.ep, plan.etp_resolved)
    out_d, out_e = 0.0, 0.0
    for s in held_stages(plan, stage, paired):
        n_dense, n_moe = stage_weight_layers(m, plan, s)
        out_d = out_d + n_dense * _total(dense, f) + n_moe * _total(moe, f)
        out_e = out_e + n_moe * _total(experts, f)
    return RankParams(dense=out_d, expert=out_e)


def muon_params(m: ModelSpec, plan: ParallelPlan, stage: Any, paired: bool = True) -> RankParams:
    """Parameters of one rank of `stage` (with its DualPipe pair, `paired`) that Muon updates (the rest keep AdamW);
    zero under adam.
    Source: NVIDIA/Megatron-LM at d0b3b7754, emerging_optimizers.py (_is_nonlinear_or_embedding).
    Derived: docs/formulas.md#optim.muon_params"""
    if plan.optimizer != "muon":
        return RankParams(dense=0.0, expert=0.0)
    return stage_sum(m, plan, stage, _elements, paired)


def muon_moment_saving(plan: ParallelPlan, muon: RankParams) -> Any:
    """Optimizer bytes a rank does not keep under Muon: Adam's second moment on each Muon parameter (one momentum
    buffer instead of two moments), sharded as the optimizer states are (zero 1: over optimizer_shard, the routed
    experts over expert_optimizer_shard). Source: Emerging-Optimizers v0.2.0 orthogonalized_optimizer.py
    (_init_group: momentum_buffer only). Derived: docs/formulas.md#optim.muon_memory"""
    return OPTIMIZER_STATE_BYTES[plan.optimizer_moment_dtype] * optimizer_share(plan, muon)


def newton_schulz_seconds(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec, stage: Any) -> Any:
    """Seconds of one rank's Newton-Schulz GEMMs per step: every Muon matrix of the stage (newton_schulz_gemms) at
    bf16 (muon_fp32_matmul_prec medium casts X to bf16) and each GEMM shape's efficiency, divided over the
    data-parallel ranks that own them whole under zero 1 (the dense over optimizer_shard, the experts over
    expert_optimizer_shard: the mean owner; the layer-wise optimizer balances by size, its imbalance not priced);
    zero under adam. Source: NVIDIA/Megatron-LM at d0b3b7754, layer_wise_optimizer.py (LayerWiseDistributedOptimizer:
    "each rank only keep its shard in its optimizer", then all-gather); Emerging-Optimizers v0.2.0 muon_utils.py.
    Derived: docs/formulas.md#optim.muon_ns"""
    if plan.optimizer != "muon":
        return 0.0
    rate = gpu.sustained_flops("bf16")

    def seconds(r: Any, c: Any) -> Any:
        return MUON_NS_STEPS * sum(2 * M * N * K / gemm_shape_efficiency(gpu, "bf16", M, N, K)
                                   for M, N, K in newton_schulz_gemms(r, c)) / rate
    return optimizer_share(plan, stage_sum(m, plan, stage, seconds))
