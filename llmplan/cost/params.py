"""Parameter counts: whole model (total, active) and the shard one rank holds under TP / PP / EP.

Symbols follow the papers: h hidden, f FFN width, a query heads, K key/value heads, d head dim, V vocab,
L layers, E routed experts, k experts per token, t tensor-parallel degree.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar

import numpy as np

from llmplan.arith import maximum, minimum, where
from llmplan.cost.breakdown import Breakdown
from llmplan.cost.mixers import (
    attention_share,
    dense_mlp_share,
    mean_recurrent_params,
    norms_per_layer,
    recurrent_params,
)
from llmplan.cost.sparse import indexer_params
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan, PlanLike, has_layout


@dataclass(frozen=True)
class ParamCounts(Breakdown):
    """Parameters of the whole model by part; the parts sum to `total`."""

    PARTS: ClassVar[tuple[str, ...]] = ("embedding", "output", "attention", "dense_mlp", "routed_experts",
                                        "shared_experts", "router", "norms", "recurrent_mixers",
                                        "latent_projections")

    embedding: int
    """Input token embedding (+ learned position embedding)."""
    output: int
    """Output layer (0 when tied to the embedding)."""
    attention: int
    """All attention projections (and their biases, q/k norms) of all layers."""
    dense_mlp: int
    """MLPs of dense layers."""
    routed_experts: int
    """All routed experts of all MoE layers."""
    shared_experts: int
    """Shared experts of all MoE layers."""
    router: int
    """Router (gate) matrices."""
    norms: int
    """Layer norms of all layers and the final norm."""
    recurrent_mixers: int
    """Mamba-2 and Gated DeltaNet mixers of a hybrid model's recurrent layers (0 for a transformer)."""
    latent_projections: int
    """A latent MoE's h -> latent and latent -> h projections around the routed experts (0 without one)."""
    experts_per_token_fraction: float
    """k / E: the fraction of routed-expert weights one token uses (1.0 for dense models)."""

    @property
    def active(self) -> float:
        """Parameters one token touches: everything except the routed experts it is not sent to."""
        return self.total - self.routed_experts * (1.0 - self.experts_per_token_fraction)


def attention_params(m: ModelSpec) -> int:
    """Parameters of one attention block.

    Source: Hugging Face modeling code (LlamaAttention projection shapes; DeepseekV3Attention for MLA)."""
    h, a, K, d = m.hidden_size, m.num_attention_heads, m.kv_heads, m.d_head
    if (mla := m.mla) is not None:
        nope, rope, v, kv_r = mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim, mla.kv_lora_rank
        q_r = mla.q_lora_rank
        q = (h * q_r + q_r + q_r * a * (nope + rope)) if q_r else h * a * (nope + rope)
        kv = h * (kv_r + rope) + kv_r + kv_r * a * (nope + v)
        return q + kv + a * v * h + indexer_params(m)  # DeepSeek Sparse Attention's indexer (cost.sparse)
    n = h * a * d * (2 if m.attention_output_gate else 1) + 2 * h * K * d + a * d * h
    if m.attention_bias or m.qkv_bias:
        n += a * d + 2 * K * d
    if m.attention_bias:
        n += h
    if m.qk_norm:
        n += 2 * d
    return n


def mlp_params(m: ModelSpec, f: int, width: int | None = None) -> int:
    """Parameters of one MLP of width f on inputs of `width` (default h): 3·h·f gated (SwiGLU), 2·h·f plain;
    biases where the model has them.

    Source: Hugging Face modeling code (LlamaMLP: gate, up and down projections)."""
    h = width or m.hidden_size
    if m.gated_mlp:
        return 3 * h * f + ((2 * f + h) if m.mlp_bias else 0)
    return 2 * h * f + ((f + h) if m.mlp_bias else 0)


def expert_params(m: ModelSpec) -> int:
    """One routed expert: an MLP of width f_e on the expert width (the latent width of a latent MoE).

    Source: NVIDIA/Megatron-LM megatron/core/transformer/moe/moe_layer.py (the experts read the
    fc1_latent_proj output). Derived: docs/formulas.md#moe.latent"""
    return mlp_params(m, m.expert_ffn, m.expert_width)


def latent_proj_params(m: ModelSpec) -> int:
    """A latent MoE layer's two projections, h -> l before dispatch and l -> h after combine (2·h·l, biases
    where the model has them); 0 without a latent width. Megatron-LM replicates them on every TP rank
    (parallel_mode "duplicated") and counts them with the layer's non-expert weights.

    Source: NVIDIA/Megatron-LM megatron/core/transformer/moe/moe_layer.py (fc1_latent_proj, fc2_latent_proj).
    Derived: docs/formulas.md#moe.latent"""
    l, h = m.moe_latent_size, m.hidden_size
    return 2 * h * l + ((l + h) if m.mlp_bias else 0) if l else 0


def norm_params(m: ModelSpec) -> int:
    """One norm: h weights (RMSNorm) or h weights + h biases (LayerNorm)."""
    return m.hidden_size * (2 if m.norm_type == "layernorm" else 1)


def param_counts(m: ModelSpec) -> ParamCounts:
    """Whole-model parameter counts by part: attention in the attention layers, the recurrent mixers in the
    others, a pre-norm per sub-block (mixer, MLP) and the final norm.

    Source: Hugging Face modeling code (MixtralSparseMoeBlock, DeepseekV3MoE: E experts + router;
    NemotronHBlock: one norm and one mixer or MLP per block)."""
    h, V, L = m.hidden_size, m.vocab_size, m.num_hidden_layers
    E, n_moe = m.num_experts, m.num_moe_layers
    pos = m.max_position_embeddings * h if m.learned_position_embeddings else 0
    return ParamCounts(
        embedding=V * h + pos,
        output=0 if m.tie_word_embeddings else V * h,
        attention=m.num_attention_layers * attention_params(m),
        dense_mlp=m.num_mlp_layers * mlp_params(m, m.intermediate_size),
        routed_experts=n_moe * E * expert_params(m),
        shared_experts=n_moe * (mlp_params(m, m.shared_ffn) if m.shared_ffn else 0),
        router=n_moe * (h * E + (E if m.mlp_bias else 0)),
        norms=(L - m.count_layers("none") + m.num_mlp_layers + n_moe + 1) * norm_params(m),
        recurrent_mixers=recurrent_params(m),
        latent_projections=n_moe * latent_proj_params(m),
        experts_per_token_fraction=(m.num_experts_per_tok / E) if E else 1.0,
    )


def memoized(plan: Any, key: tuple, compute: Any) -> Any:
    """compute() once per plan and key (the arrays path evaluates the same split and stage layers for several
    candidate stages; a single plan's estimate reads its layer times and split once per stage). Keys hold the
    objects they depend on, compared by identity (and numbers and strings by value). A single plan's results
    live as long as the plan object (_plan_memo)."""
    memo = getattr(plan, "__dict__", {}).get("memo")  # plan arrays carry theirs (not pydantic's __getattr__)
    same = _same
    if memo is None:
        memo, same = _plan_memo(plan), _same_value
        if memo is None:
            return compute()
    bucket = _bucket(key)  # a hashable digest: the scan below runs over keys with the same numbers and strings
    for k, value in memo.get(bucket, ()):
        if len(k) == len(key) and all(same(a, b) for a, b in zip(k, key)):
            return value
    value = compute()
    memo.setdefault(bucket, []).append((key, value))
    return value


def _bucket(key: tuple) -> tuple:
    """memoized's dictionary key for `key`: its numbers and strings by value, any other part by its type (so that
    a plan listing 4,096 stages finds stage i's entry at once, not after scanning the others)."""
    return ("memoized",) + tuple(k if type(k) in (int, float, str, bool) else type(k).__name__ for k in key)


_PLAN_MEMOS: dict[int, dict] = {}
"""memoized's results of single plans, by id(plan); an entry goes when its plan is collected (weakref.finalize),
so an id is never reused while its entry lives. Specs hold no cache themselves."""


def _plan_memo(plan: Any) -> dict | None:
    memo = _PLAN_MEMOS.get(id(plan))
    if memo is None:
        try:
            weakref.finalize(plan, _PLAN_MEMOS.pop, id(plan), None)
        except TypeError:  # an object without weak references: no memo
            return None
        memo = _PLAN_MEMOS[id(plan)] = {}
    return memo


def _same_value(a: Any, b: Any) -> bool:
    """Key parts of a single plan's memo: the same object, or equal numbers / strings (never __eq__ of specs,
    whose array-valued fields, as in accuracy's grid, have no truth value)."""
    return a is b or (type(a) is type(b) and type(a) in (int, float, str, bool) and a == b)


LAYOUT_AXES = ("pp", "vpp", "pp_first", "pp_last")
"""The plan fields that fix which layers each pipeline stage holds."""
ALL_BUT_ZERO = ("tp", "pp", "dp", "cp", "ep", "etp_resolved", "vpp", "pp_first", "pp_last", "sp", "recompute_code",
                "micro_batch")
"""Every searched plan field but the ZeRO stage: what activation memory and a stage's compute time depend on
(on plan arrays they are computed once per distinct combination of these; a search seeds the grouping as it
enumerates, search.grid.enumerate_plans)."""


def per_distinct(plan: Any, columns: tuple[str, ...], stage: Any, f: Any) -> Any:
    """f(plan, stage), computed once per distinct combination of `columns` on plan arrays (search.grid
    PlanArrays.on_distinct): a stage's layers and parameters depend on a few axes, so a few hundred
    evaluations stand for hundreds of thousands of plans. Single plans compute directly."""
    on_distinct = getattr(type(plan), "on_distinct", None)  # on the class: no pydantic __getattr__ per call
    return f(plan, stage) if on_distinct is None else on_distinct(plan, columns, stage, f)


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return False
    return bool(a == b)


def layer_split(m: ModelSpec, plan: PlanLike) -> tuple[Any, Any, Any]:
    """Transformer layers on the first stage, on each middle stage and on the last stage.

    Megatron's --decoder-first/last-pipeline-num-layers pin the first and last stage; the other stages share
    the rest evenly (0 pins nothing: an even split). Source: Megatron-LM arguments.py (validate_args checks
    that the remaining layers divide the remaining stages); check_plan enforces it here."""
    return memoized(plan, ("split", m.num_hidden_layers), lambda: _layer_split(m.num_hidden_layers, plan))


def _layer_split(L: int, plan: PlanLike) -> tuple[Any, Any, Any]:
    p, f, l = plan.pp, plan.pp_first, plan.pp_last
    middle_stages = p - where(f > 0, 1, 0) - where(l > 0, 1, 0)
    mid = (L - f - l) // maximum(middle_stages, 1)
    return where(f > 0, f, mid), mid, where(l > 0, l, mid)


def explicit_stages(plan: PlanLike) -> tuple[int, ...] | None:
    """Transformer layers of every pipeline stage when the plan lists them (pp_layers, or the pp_layout chunks
    of each rank summed); None for a first/last or even split, for plan arrays and for serving plans."""
    if has_layout(plan):
        return _layout_stages(plan.pp, tuple(getattr(plan, "pp_layout", None) or ()))  # has_layout: a ParallelPlan
    return getattr(plan, "pp_layers", None)


@lru_cache(maxsize=256)
def _layout_stages(p: int, layout: tuple[str, ...]) -> tuple[int, ...]:
    """Transformer layers of every rank of a layout (its chunks' t symbols), once per layout in a process."""
    v = max(1, len(layout) // p)
    return tuple(sum(layout[c * p + i].count("t") for c in range(v)) for i in range(p))


def layout_grid(plan: ParallelPlan) -> list[list[str]]:
    """pp_layout as [stage][virtual chunk] symbol runs: chunk k of the list is rank k mod pp's chunk k // pp.
    Source: Megatron-LM PipelineParallelLayerLayout (megatron/core/transformer/pipeline_parallel_layer_layout.py)."""
    chunks, p = plan.pp_layout or (), plan.pp
    v = max(1, len(chunks) // p)
    return [[chunks[c * p + i] for c in range(v)] for i in range(p)]


def chunk_layers(m: ModelSpec, plan: ParallelPlan) -> list[list[tuple[int, int]]]:
    """layout_chunk_layers, once per plan (a plan's memory and step time read it stage by stage)."""
    return memoized(plan, ("layout_chunk_layers", m), lambda: layout_chunk_layers(m, plan))


def layout_chunk_layers(m: ModelSpec, plan: ParallelPlan) -> list[list[tuple[int, int]]]:
    """(dense, MoE) layers of every [stage][virtual chunk] of a pp_layout plan: the t symbols are the model's
    layers in list order (the first first_k_dense_replace of them dense), the m symbols its MTP modules
    (priced as MoE layers, as _stage_layers does). Derived: docs/formulas.md#pipeline.layout"""
    k = m.first_k_dense_replace if m.is_moe else 0
    p, start = plan.pp, 0
    out: list[list[tuple[int, int]]] = [[] for _ in range(p)]
    for i, chunk in enumerate((plan.pp_layout or ())[: len(layout_grid(plan)[0]) * p]):
        n, mtp = chunk.count("t"), chunk.count("m")
        dense = max(0, min(start + n, k) - start) if m.is_moe else n + mtp
        if m.is_moe and m.mlp_layer_types is not None:
            dense = n - moe_layers_between(m, start, start + n)
        out[i % p].append((dense, n + mtp - dense))
        start += n
    return out


def stage_layer_count(m: ModelSpec, plan: PlanLike, stage: Any) -> Any:
    """Transformer layers held by pipeline rank `stage` (all its virtual chunks together)."""
    stages = explicit_stages(plan)
    if stages is not None:
        return stages[int(stage)]
    first, mid, last = layer_split(m, plan)
    return where(stage == 0, first, where(stage == plan.pp - 1, last, mid))


def layers_before(m: ModelSpec, plan: PlanLike, stage: Any) -> Any:
    """Transformer layers held by the pipeline ranks before `stage`."""
    stages = explicit_stages(plan)
    if stages is not None:
        return sum(stages[: int(stage)])
    first, mid, _ = layer_split(m, plan)
    return where(stage == 0, 0, first + (stage - 1) * mid)


def stage_layer_list(m: ModelSpec, plan: ParallelPlan) -> list[int]:
    """Transformer layers of every pipeline stage, first to last (one plan)."""
    stages = explicit_stages(plan)
    if stages is not None:
        return list(stages)
    first, mid, last = (int(x) for x in layer_split(m, plan))  # stage_layer_count of each stage, split read once
    return [first if i == 0 else last if i == plan.pp - 1 else mid for i in range(plan.pp)]


def max_stage_layers(m: ModelSpec, plan: PlanLike) -> Any:
    """Layers of the pipeline rank that holds the most."""
    stages = explicit_stages(plan)
    if stages is not None:
        return max(stages)
    first, mid, last = layer_split(m, plan)
    return maximum(first, maximum(where(plan.pp > 2, mid, 0), last))


def stage_layers(m: ModelSpec, plan: PlanLike, stage: Any) -> tuple[Any, Any]:
    """(dense layers, MoE layers) held by pipeline rank `stage`.

    With vpp virtual stages every rank's layers form vpp equal chunks; virtual round j holds chunk j of
    every rank in order, so rank i's chunk j starts at j·L/vpp + (layers before rank i)/vpp (Megatron's
    interleaved assignment, uneven first/last stages included). Works elementwise on plan arrays."""
    return memoized(plan, ("stage_layers", m, stage),
                    lambda: per_distinct(plan, LAYOUT_AXES, stage, lambda p, i: _stage_layers(m, p, i)))


def _stage_layers(m: ModelSpec, plan: PlanLike, stage: Any) -> tuple[Any, Any]:
    if has_layout(plan):  # it places every layer and MTP module
        chunks = chunk_layers(m, plan)[int(stage)]
        return sum(d for d, _ in chunks), sum(e for _, e in chunks)
    n = stage_layer_count(m, plan, stage)
    mtp = where(stage == plan.pp - 1, m.num_nextn_predict_layers, 0)  # MTP modules ride on the last stage
    if not m.is_moe:
        return n + mtp, 0 * n
    v, k = plan.vpp, m.first_k_dense_replace
    chunk, offset, round_ = n // v, layers_before(m, plan, stage) // v, m.num_hidden_layers // v
    if m.mlp_layer_types is not None:  # MoE layers anywhere in the stack (a hybrid pattern): count them
        moe = 0 * n
        for j in range(int(np.max(v))):
            start = j * round_ + offset
            moe = moe + where(j < v, moe_layers_between(m, start, start + chunk), 0)
        return n - moe, moe + mtp
    dense = 0 * n
    # Only virtual rounds that start before layer k can hold dense layers: round j starts at j·L/vpp or later.
    rounds = min(int(np.max(v)), int(np.ceil(k / max(1, int(np.min(round_))))) + 1)
    for j in range(rounds):
        start = j * round_ + offset
        dense = dense + where(j < v, maximum(0, minimum(start + chunk, k) - start), 0)
    return dense, n - dense + mtp


def moe_layers_between(m: ModelSpec, start: Any, end: Any) -> Any:
    """MoE layers among layers [start, end) of a model whose mlp_layer_types places them (elementwise)."""
    return _flagged_between([x == "moe" for x in (m.mlp_layer_types or ())], start, end)


def kind_layers_between(m: ModelSpec, kind: str, start: Any, end: Any) -> Any:
    """Layers whose mixer is `kind` among layers [start, end) (elementwise)."""
    return _flagged_between([x == kind for x in (m.layer_types or ())], start, end)


def stage_kind_counts(m: ModelSpec, plan: PlanLike, stage: Any) -> dict[str, Any]:
    """Layers of each mixer kind (layer_types) that pipeline rank `stage` holds, all its virtual chunks
    together (the chunks of _stage_layers: chunk j of rank i starts at j·L/vpp + layers before i / vpp).
    Elementwise on plan arrays; a stage's kinds sum to its layers."""
    n = stage_layer_count(m, plan, stage)
    v = plan.vpp
    chunk, offset, round_ = n // v, layers_before(m, plan, stage) // v, m.num_hidden_layers // v
    out: dict[str, Any] = {}
    for kind in dict.fromkeys(m.layer_types or ()):
        count = 0 * n
        for j in range(int(np.max(v))):
            start = j * round_ + offset
            count = count + where(j < v, kind_layers_between(m, kind, start, start + chunk), 0)
        out[kind] = count
    return out


def _flagged_between(flags: list[bool], start: Any, end: Any) -> Any:
    prefix = np.concatenate([[0], np.cumsum(flags)]).astype(int)
    L = len(flags)
    lo = np.clip(np.asarray(start, dtype=int), 0, L)
    hi = np.clip(np.asarray(end, dtype=int), 0, L)
    out = prefix[hi] - prefix[lo]
    return int(out) if np.ndim(out) == 0 else out


def heaviest_moe_stage(m: ModelSpec, plan: PlanLike) -> Any:
    """The first pipeline rank that holds no dense layer (it holds the most MoE layers and the most in-flight
    micro-batches among such ranks); 0 for models without leading dense layers. A model whose
    mlp_layer_types places its MoE layers (Llama 4 Maverick every other layer, a hybrid pattern): the first
    middle rank that holds the most of them."""
    if m.is_moe and m.mlp_layer_types is not None:
        return _most_moe_middle_stage(m, plan)
    if not m.is_moe or not m.first_k_dense_replace:
        return 0 * plan.pp
    if explicit_stages(plan) is not None:
        return next((i for i in range(plan.pp) if stage_layers(m, plan, i)[0] == 0), plan.pp - 1)
    first, mid, _ = layer_split(m, plan)
    kv = m.first_k_dense_replace * plan.vpp  # chunk 0 of rank i starts at layers_before(i) / vpp
    i = where(kv <= first, 1, 1 - (-(kv - first) // maximum(mid, 1)))
    return minimum(i, plan.pp - 1)


def _most_moe_middle_stage(m: ModelSpec, plan: PlanLike) -> Any:
    """The first of ranks 1 .. pp-2 holding the most MoE layers (rank 1, or pp-1 when pp <= 2); elementwise."""
    best = minimum(1, plan.pp - 1) + 0 * plan.pp
    if explicit_stages(plan) is not None:
        return best
    count = stage_layers(m, plan, 1)[1] if int(np.max(plan.pp)) > 1 else 0 * plan.pp
    for i in range(2, int(np.max(plan.pp)) - 1):
        n = stage_layers(m, plan, i)[1]
        better = (i < plan.pp - 1) & (n > count)
        best, count = where(better, i, best), where(better, n, count)
    return best


@dataclass(frozen=True)
class RankParams(Breakdown):
    """Parameters one rank holds, split by the group that replicates them (for ZeRO sharding)."""

    PARTS: ClassVar[tuple[str, ...]] = ("dense", "expert")

    dense: Any
    """Non-expert parameters (replicated over dp x cp)."""
    expert: Any
    """Routed-expert parameters (replicated over the expert-data-parallel group)."""


def kv_heads_per_rank(m: ModelSpec, t: Any) -> Any:
    """KV heads on one TP rank: K/t, or one replicated head when t exceeds K (check_plan keeps t | K or K | t)."""
    return maximum(m.kv_heads / t, 1.0)


def attention_params_per_rank(m: ModelSpec, t: Any) -> Any:
    """One attention block's parameters on one TP rank (column/row-parallel projections split by heads).

    Derived: docs/formulas.md#params.rank"""
    h, d = m.hidden_size, m.d_head
    if (mla := m.mla) is not None:
        # Down-projections (and their norms) are replicated; per-head up-projections and the output split by t.
        rope, kv_r, q_r = mla.qk_rope_head_dim, mla.kv_lora_rank, mla.q_lora_rank
        down = (h * q_r + q_r if q_r else 0) + h * (kv_r + rope) + kv_r + indexer_params(m)  # indexer replicated
        return down + (attention_params(m) - down) / t
    kv = 2 * (h * d + (d if (m.attention_bias or m.qkv_bias) else 0)) * kv_heads_per_rank(m, t)
    full_kv = 2 * (h * d + (d if (m.attention_bias or m.qkv_bias) else 0)) * m.kv_heads
    return (attention_params(m) - full_kv) / t + kv


def padded_vocab(V: int, t: int, divisor: int = 128) -> int:
    """Vocabulary rows after Megatron's padding to a multiple of divisor x t (an upper bound for launchers
    that do not pad). Source: Megatron-LM megatron/training/vocab_utils.py (vocabulary padded to a multiple of 128 x tp)."""
    unit = divisor * t
    return -(-V // unit) * unit  # ceil division; elementwise on arrays


def rank_params(m: ModelSpec, plan: PlanLike, stage: Any) -> RankParams:
    """Parameters held by one rank of pipeline stage `stage` (see _rank_params)."""
    return per_distinct(plan, LAYOUT_AXES + ("tp", "ep", "etp_resolved"), stage, lambda p, i: _rank_params(m, p, i))


def _rank_params(m: ModelSpec, plan: PlanLike, stage: Any) -> RankParams:
    """Parameters held by one rank of pipeline stage `stage`: its layers sharded by TP (norms and router
    replicated), experts split by EP and expert-TP, the embedding on the first stage and the output layer
    on the last (a tied embedding keeps a copy on the last stage when pp > 1, as Megatron does).

    Derived: docs/formulas.md#params.rank"""
    n_dense, n_moe = stage_layers(m, plan, stage)
    dense_layer, moe_layer, expert_layer, embedding, head = memoized(
        plan, ("rank_param_parts", m), lambda: _rank_param_parts(m, plan))
    first = where(stage == 0, embedding, 0)
    last = where(stage == plan.pp - 1, head, 0)
    return RankParams(dense=n_dense * dense_layer + n_moe * moe_layer + first + last, expert=n_moe * expert_layer)


def _rank_param_parts(m: ModelSpec, plan: PlanLike) -> tuple[Any, Any, Any, Any, Any]:
    """Per rank: a dense layer, a MoE layer's non-expert part, its expert part, the first stage's embedding and
    the last stage's norm, output layer and MTP projections (stage-independent, computed once per plan)."""
    t, etp, h = plan.tp, plan.etp_resolved, m.hidden_size
    # A hybrid stack's average layer: its share of attention, its mean recurrent mixer (split by t, as
    # Megatron-LM's MambaMixer splits heads and groups), its norms (mixers.py).
    attn = attention_share(m) * attention_params_per_rank(m, t) + mean_recurrent_params(m) / t \
        + norms_per_layer(m) * norm_params(m)
    dense_layer = attn + dense_mlp_share(m) * mlp_params(m, m.intermediate_size) / t
    moe_layer = attn + h * m.num_experts + (mlp_params(m, m.shared_ffn) / t if m.shared_ffn else 0) \
        + latent_proj_params(m)  # replicated on every TP rank
    expert_layer = (m.num_experts / plan.ep) * expert_params(m) / etp if m.is_moe else 0 * t
    V = padded_vocab(m.vocab_size, t)
    positions = m.max_position_embeddings * h if m.learned_position_embeddings else 0
    has_output = where(plan.pp > 1, True, not m.tie_word_embeddings)
    mtp_proj = m.num_nextn_predict_layers * (2 * h * h / t + 2 * norm_params(m))  # eh_proj and its two norms
    head = norm_params(m) + where(has_output, V * h / t, 0) + mtp_proj
    return dense_layer, moe_layer, expert_layer, V * h / t + positions, head


def recomputed_share(plan: ParallelPlan, layers: Any) -> Any:
    """Share of a stage's `layers` whose forward full recompute repeats: every layer, or with
    recompute_layers N the first N of each of the stage's vpp virtual chunks (Megatron's block method); 0
    without full recompute. Source: Megatron-LM --recompute-method block. Derived: docs/formulas.md#mem.activations"""
    if plan.recompute_layers is None:
        return where(plan.full, 1, 0)
    return where(plan.full, minimum(plan.recompute_layers * plan.vpp / maximum(layers, 1), 1.0), 0.0)
