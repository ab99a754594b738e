"""ModelSpec: the architecture of a transformer language model, with Hugging Face config.json field names."""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field, model_validator

from llmplan.specs.base import (  # noqa: F401  (re-exported: their home was this module)
    SPEC_CONFIG,
    Name,
    Spec,
    loose_value,
    number_kind,
)
from llmplan.specs.mla import MLA
from llmplan.specs.model_kinds import (  # noqa: F401  (re-exported: their home was this module)
    ATTENTION_KINDS,
    COMPRESSED_KINDS,
    LINEAR_FIELDS,
    MAMBA_FIELDS,
    RECURRENT_KINDS,
    ROUTING_FIELDS,
    SUPPORTED_MODEL_TYPES,
    LayerType,
    MlpType,
    ModelType,
)
from llmplan.specs.model_limits import (  # noqa: F401  (re-exported: their home was this module)
    MODEL_LIMITS,
    beyond_limits,
    unknown_kinds,
    unknown_layer_types,
)


class ModelSpec(Spec):
    """A decoder-only transformer. Field names follow Hugging Face config.json; llmplan keys are marked."""

    name: Name
    """llmplan key: the name users pass to --model."""
    source: str = ""
    """llmplan key: where the dimensions come from (paper, config.json URL, model card)."""
    model_type: ModelType = "gpt"
    """Architecture family, as Hugging Face names it ('gpt' = plain Megatron-style GPT)."""

    hidden_size: int = Field(gt=0)
    """Model width h."""
    intermediate_size: int = Field(gt=0)
    """FFN width f of dense layers (per expert for Mixtral and gpt-oss, where every layer is MoE)."""
    num_hidden_layers: int = Field(gt=0)
    """Number of transformer layers L."""
    num_attention_heads: int = Field(gt=0)
    """Query heads a."""
    num_key_value_heads: int | None = Field(default=None, gt=0)
    """Key/value heads (GQA/MQA); None means equal to num_attention_heads (MHA)."""
    head_dim: int | None = Field(default=None, gt=0)
    """Per-head dimension; None means hidden_size / num_attention_heads."""
    vocab_size: int = Field(gt=0)
    """Vocabulary size V (unpadded)."""
    max_position_embeddings: int = Field(gt=0)
    """Longest context the model supports."""
    tie_word_embeddings: bool = False
    """Whether the output layer shares the input embedding matrix."""

    gated_mlp: bool = True
    """llmplan key: SwiGLU/GeGLU MLP with gate, up and down projections (False: plain two-matrix GELU MLP)."""
    hidden_act: str | None = Field(default=None, max_length=64)
    """The MLP's activation as config.json names it (hidden_act; Gemma's hidden_activation, GPT-2's
    activation_function, Nemotron-H's mlp_hidden_act); None where the spec does not name it. Named by the rules
    (mlp_activation); the cost reads gated_mlp."""
    parallel_block: bool = False
    """llmplan key: the parallel transformer block, y = x + Attention(LN(x)) + MLP(LN(x)) (GPT-J, PaLM; MegaScale
    §3.1): attention and MLP read one norm's output and their outputs are summed, so under Megatron-style TP the
    QKV and first MLP projections take one all-gather (or all-reduce) and the output projection and second MLP
    projection one reduce-scatter: one column- / row-parallel pair of TP collectives per layer, not two
    (docs/formulas.md#comm.tp). Dense softmax-attention models only. Its one norm per layer (not two) is not
    priced apart."""
    norm_type: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    """llmplan key: RMSNorm (weight only) or LayerNorm (weight and bias)."""
    learned_position_embeddings: bool = False
    """llmplan key: learned absolute position embeddings (GPT-2/GPT-3) instead of RoPE."""
    embedding_norm: bool = False
    """A norm on the embedding output before the first layer (BLOOM's word_embeddings_layernorm; Megatron-DeepSpeed
    --embed-layernorm): on the first stage it keeps its input for the backward, per micro-batch in flight (its 2h
    weights are left out of the counts)."""
    attention_bias: bool = False
    """Biases on the q, k, v and output projections."""
    qkv_bias: bool = False
    """Biases on the q, k and v projections only (Qwen2)."""
    mlp_bias: bool = False
    """Biases on the MLP (and expert) projections."""
    attention_sinks: bool = False
    """A learned per-head logit in every attention softmax's denominator (GPT-OSS's "sinks", Megatron's
    softmax_type "learnable"): the probabilities over the keys sum to less than one."""
    swiglu_limit: float | None = Field(default=None, gt=0, le=1e6)
    """Clamp on the gated MLP's two halves before the activation (HF GPT-OSS name): the gate at most the
    limit, the linear half within +/- the limit (GPT-OSS: 7.0); None: no clamp."""
    qk_norm: bool = False
    """llmplan key: RMSNorm on queries and keys per head (Qwen3)."""
    attention_dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout on the attention probabilities (HF attention_dropout / attn_pdrop); when > 0 unfused attention
    keeps the s x s dropout mask and output for backward."""
    hidden_dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout after the attention and MLP blocks (HF hidden_dropout / resid_pdrop); when > 0 each keeps a
    1-byte mask per activation for backward."""
    rope_theta: float | None = Field(default=None, gt=0)
    """RoPE base frequency (informational)."""
    rope_scaling: dict | None = None
    """RoPE scaling block as in config.json (informational; shown when a length exceeds the context)."""
    sliding_window: int | None = Field(default=None, gt=0)
    """Sliding-window size of windowed attention layers, if any."""
    layer_types: tuple[LayerType, ...] | None = Field(default=None, max_length=4_096)
    """Per-layer token mixer (LayerType) where the model mixes kinds: sliding / full / chunked attention,
    linear_attention (Gated DeltaNet), mamba (Mamba-2) or none; None: every layer is full attention."""
    mlp_layer_types: tuple[MlpType, ...] | None = Field(default=None, max_length=4_096)
    """llmplan key: per-layer block after the mixer (dense MLP, moe, none) where the model mixes them beyond
    leading dense layers (Nemotron-H's pattern, Llama 4's interleaved MoE); None: first_k_dense_replace dense
    layers, then MoE (all dense for a dense model)."""
    attention_chunk_size: int | None = Field(default=None, gt=0)
    """Chunk of chunked local attention (HF Llama 4 name): a query sees the keys of its own chunk only."""
    attention_output_gate: bool = False
    """llmplan key: a sigmoid gate on the attention output computed by the query projection (Qwen3-Next's
    gated attention: q_proj is twice as wide)."""

    index_topk: int | None = Field(default=None, gt=0)
    """DeepSeek Sparse Attention (HF deepseek_v32 name): keys each query attends to, chosen by the lightning
    indexer from all preceding keys; None: dense attention."""
    index_n_heads: int | None = Field(default=None, gt=0)
    """DeepSeek Sparse Attention: heads of the lightning indexer."""
    index_head_dim: int | None = Field(default=None, gt=0)
    """DeepSeek Sparse Attention: head dimension of the lightning indexer (its key cache per token)."""
    indexer_loss: Literal["off", "dense", "sparse"] | None = None
    """llmplan key: how the model's public Megatron training config trains the lightning indexer (the default of
    ParallelPlan.indexer_loss): off (dsa_indexer_loss_coeff 0), dense or sparse (dsa_indexer_use_sparse_loss);
    None: no config says, the launcher's default decides (cost.sparse_gather.indexer_loss)."""

    compress_rate_csa: int = Field(default=4, gt=1, le=65_536)
    """DeepSeek-V4 compressed sparse attention (HF deepseek_v4 name): tokens pooled into one compressed key of a
    compressed_sparse_attention layer (4), over overlapping windows of twice that; the indexer (index_topk,
    index_n_heads, index_head_dim) picks index_topk of them per query."""
    compress_rate_hca: int = Field(default=128, gt=1, le=65_536)
    """DeepSeek-V4 heavily compressed attention (HF deepseek_v4 name): tokens pooled into one compressed key of a
    heavily_compressed_attention layer (128), every compressed key attended."""
    shared_key_value: bool = False
    """llmplan key: one key/value head whose key and value are the same projection, read as both (DeepSeek-V4's
    shared-KV multi-query attention: kv_proj h -> head_dim and its RMSNorm); needs num_key_value_heads 1."""
    o_lora_rank: int | None = Field(default=None, gt=0, le=262_144)
    """Grouped low-rank output projection (HF deepseek_v4 name): the width d_g each of the o_groups head groups
    is projected to before one o_groups·d_g -> h projection; None: the full a·d -> h output projection."""
    o_groups: int | None = Field(default=None, gt=0, le=4_096)
    """Grouped low-rank output projection: head groups g, each of a·d/g inputs (HF deepseek_v4 name)."""
    hc_mult: int = Field(default=1, ge=1, le=64)
    """Manifold-constrained hyper-connections (HF deepseek_v4 name; DeepSeek-V4: 4): residual streams n of width h
    each token carries; each sub-block reads a learned mix of them (pre), and writes its output into all of
    them (post) after mixing them by a doubly stochastic n x n matrix (comb). 1: a plain residual."""
    num_hash_layers: int = Field(default=0, ge=0, le=4_096)
    """Leading MoE layers whose experts are chosen by a fixed token-id -> experts table (HF deepseek_v4 name;
    tid2eid, a buffer): their router still scores the experts to weight the chosen ones, without top-k or
    selection bias."""

    mamba_num_heads: int | None = Field(default=None, gt=0)
    """Mamba-2: SSM heads H (HF nemotron_h name)."""
    mamba_head_dim: int | None = Field(default=None, gt=0)
    """Mamba-2: head dimension P; the inner width is H x P."""
    ssm_state_size: int | None = Field(default=None, gt=0)
    """Mamba-2: state dimension N per group (HF name)."""
    n_groups: int | None = Field(default=None, gt=0)
    """Mamba-2: groups G sharing the B and C projections (HF name; the heads split into G equal groups)."""
    conv_kernel: int = Field(default=4, gt=0)
    """Mamba-2: width of the short causal convolution (HF name)."""
    mamba_chunk_size: int = Field(default=128, gt=0)
    """Mamba-2: chunk length Q of the SSD scan (HF chunk_size; Megatron-LM's default 128)."""
    linear_num_key_heads: int | None = Field(default=None, gt=0)
    """Gated DeltaNet: query/key heads (HF qwen3_next name)."""
    linear_num_value_heads: int | None = Field(default=None, gt=0)
    """Gated DeltaNet: value heads (each holds one d_k x d_v state)."""
    linear_key_head_dim: int | None = Field(default=None, gt=0)
    """Gated DeltaNet: query/key head dimension d_k."""
    linear_value_head_dim: int | None = Field(default=None, gt=0)
    """Gated DeltaNet: value head dimension d_v."""
    linear_conv_kernel_dim: int = Field(default=4, gt=0)
    """Gated DeltaNet: width of the short convolution on q, k and v (HF name)."""
    linear_attention_rule: Literal["gated_delta", "lightning"] = "gated_delta"
    """llmplan key: the recurrence of the linear_attention layers. gated_delta: Gated DeltaNet (Qwen3-Next;
    Yang et al. 2024), a gated delta-rule update of each value head's d_k x d_v state after a short
    convolution. lightning: MiniMax's lightning attention (MiniMax-01, arXiv 2501.08313 §2.2), plain linear
    attention with a fixed per-head decay, S_t = λ S_{t-1} + k_t^T v_t, computed in blocks of 256 (intra-block
    masked QK^T V, inter-block Q S); one head count for q, k and v (linear_num_key_heads =
    linear_num_value_heads), an output gate and an RMSNorm, no convolution."""

    declared_params: float | None = Field(default=None, gt=0)
    """llmplan key: the published total parameter count; `llmplan check` fails when the count computed
    from the dimensions differs by more than its --param-tolerance."""

    num_experts: int = Field(default=0, ge=0)
    """Routed experts per MoE layer (HF: num_local_experts / num_experts / n_routed_experts); 0 = dense."""
    num_experts_per_tok: int = Field(default=0, ge=0)
    """Routed experts each token is sent to (top-k)."""
    moe_intermediate_size: int | None = Field(default=None, gt=0)
    """FFN width of one routed expert; None means intermediate_size."""
    n_shared_experts: int = Field(default=0, ge=0)
    """Shared experts (DeepSeek), each of width moe_intermediate_size, seen by every token."""
    shared_expert_intermediate_size: int | None = Field(default=None, gt=0)
    """Total FFN width of the shared expert (Qwen2-MoE); overrides n_shared_experts x moe_intermediate_size."""
    moe_latent_size: int | None = Field(default=None, gt=0)
    """Latent MoE (HF / Megatron-LM name; Nemotron-3 Super: 1024 of h = 4096): each MoE layer projects its
    tokens h -> moe_latent_size before dispatch and back after combine (two h x latent matrices, replicated
    across TP), so the routed experts' GEMMs and the all-to-all run at this width; the router and the shared
    expert read the full-width token. None: experts at hidden_size. Source: NVIDIA/Megatron-LM
    megatron/core/transformer/moe/moe_layer.py (fc1_latent_proj, fc2_latent_proj)."""
    first_k_dense_replace: int = Field(default=0, ge=0)
    """Number of leading layers that use a dense MLP instead of experts (DeepSeek)."""
    n_group: int | None = Field(default=None, ge=1)
    """Expert groups of group-limited routing (HF name; DeepSeek-V3: 8): the experts split into n_group equal
    groups in order; None: routing over all experts."""
    topk_group: int | None = Field(default=None, ge=1)
    """Groups a token's experts may come from under group-limited routing (HF name; DeepSeek-V3: 4)."""
    scoring_func: Literal["softmax", "sigmoid", "sqrtsoftplus"] = "softmax"
    """Router score function (HF name; DeepSeek-V3: sigmoid, each expert's affinity scored on its own;
    DeepSeek-V4: sqrtsoftplus, sqrt(softplus(x)), also per expert; softmax over the experts otherwise)."""
    norm_topk_prob: bool = True
    """Whether a token's top-k routing weights are renormalised to sum to 1 (HF name). True for Mixtral,
    gpt-oss and Qwen3-MoE (softmax over the chosen experts) and DeepSeek-V3; Qwen1.5/2-MoE keep the softmax
    over all experts (false)."""
    routed_scaling_factor: float = Field(default=1.0, gt=0, le=100)
    """Factor on the routed experts' weights (HF name; DeepSeek-V3: 2.5)."""
    expert_bias: bool = False
    """llmplan key: auxiliary-loss-free balancing, a learned per-expert bias added to the scores to pick the
    experts, not to weight them (DeepSeek-V3's e_score_correction_bias; HF topk_method "noaux_tc")."""
    router_aux_loss_coef: float | None = Field(default=None, ge=0, le=10)
    """Coefficient of the router's auxiliary load-balancing loss in training (HF name: Mixtral, Qwen2/3-MoE,
    gpt-oss, Llama 4; DeepSeek's config.json calls it aux_loss_alpha, read into this key); 0: trained without
    one; None: not given (the Megatron-LM export then writes transformers' MoE default, 1e-3, and says so)."""
    seq_aux: bool = False
    """Whether that loss is taken per sequence rather than over the batch (HF name, DeepSeek-V2/V3's
    complementary sequence-wise balance loss: Megatron-Core's seq_aux_loss)."""
    global_aux: bool = False
    """llmplan key: whether that loss counts each expert's tokens over the global batch (Megatron-Core's
    global_aux_loss: the counts all-reduced over the tensor x data x context parallel ranks and averaged over the
    micro-batches of the step; the Global Load Balancing Loss, arXiv 2501.11873), as Qwen3-Next trains it
    (NVIDIA-NeMo/Megatron-Bridge@067f987 models/qwen/qwen3_next_bridge.py: moe_router_load_balancing_type
    "global_aux_loss"). Exclusive with seq_aux."""
    num_nextn_predict_layers: int = Field(default=0, ge=0, le=16)
    """Multi-token-prediction modules (HF name; DeepSeek-V3: 1). Each is one more transformer layer (MoE when
    the model is) with a 2h -> h projection and two norms on the last pipeline stage, sharing the output head,
    which computes its logits once more. Not in the published parameter count (DeepSeek-V3's 671B)."""
    mtp_repeated_layer: bool = False
    """llmplan key (Megatron-Core TransformerConfig.mtp_use_repeated_layer; no Hugging Face config.json key): the
    num_nextn_predict_layers MTP depths run one module's weights over and over, as Megatron-Bridge's Nemotron-3
    recipes train depth 2 from the checkpoint's one module. One module's parameters exist (its eh_proj, norms and
    layer: NVIDIA/Megatron-LM@d98e8a64dd multi_token_prediction.py MultiTokenPredictionBlock._build_layers builds
    one MultiTokenPredictionLayer, gpt_layer_specs.py one layer spec), so every weight-proportional count (the
    parameters, weight, gradient and optimizer memory, the DP gradient reduction, the FSDP gathers, the MXFP8
    cast) holds one module (cost.stages.mtp_weight_sets); compute and activations still run once per depth.
    Needs num_nextn_predict_layers > 0; a built-in checkpoint spec of one module leaves it false."""

    q_lora_rank: int | None = Field(default=None, gt=0)
    """MLA: rank of the compressed query (None: queries are not compressed)."""
    kv_lora_rank: int | None = Field(default=None, gt=0)
    """MLA: rank of the compressed key/value latent; setting it turns on multi-head latent attention."""
    qk_nope_head_dim: int | None = Field(default=None, gt=0)
    """MLA: per-head query/key dimension without rotary embedding."""
    qk_rope_head_dim: int | None = Field(default=None, gt=0)
    """MLA: per-head query/key dimension with rotary embedding (the key part is shared by all heads)."""
    v_head_dim: int | None = Field(default=None, gt=0)
    """MLA: per-head value dimension."""

    @model_validator(mode="before")
    @classmethod
    def _within_any_model(cls, data: Any) -> Any:
        problem = (beyond_limits(data) or unknown_layer_types(data.get("layer_types"))
                   or unknown_kinds("mlp_layer_types", data.get("mlp_layer_types"), get_args(MlpType))) \
            if isinstance(data, dict) else None
        if problem:
            raise ValueError(problem)
        return data

    @model_validator(mode="after")
    def _cross_field_rules(self) -> "ModelSpec":
        a, K = self.num_attention_heads, self.kv_heads
        if self.head_dim is None and self.hidden_size % a:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads ({a}) "
                "when head_dim is not given; set head_dim"
            )
        if a % K:
            raise ValueError(f"num_attention_heads ({a}) must be a multiple of num_key_value_heads ({K})")
        if self.layer_types is not None and len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types lists {len(self.layer_types)} layers but num_hidden_layers is "
                             f"{self.num_hidden_layers}; give one attention kind per layer")
        self._hybrid_rules()
        if self.mtp_repeated_layer and not self.num_nextn_predict_layers:
            raise ValueError("mtp_repeated_layer is set but num_nextn_predict_layers is 0: a repeated MTP layer "
                             "runs one multi-token-prediction module at every depth, and there is none; give "
                             "num_nextn_predict_layers > 0 or leave mtp_repeated_layer out")
        if self.parallel_block and (self.num_experts or self.is_hybrid):
            kind = (f"num_experts {self.num_experts}" if self.num_experts
                    else "a layer without softmax attention or without an MLP")
            raise ValueError(f"parallel_block is set on a MoE or hybrid model ({kind}); the parallel transformer "
                             "block runs one softmax attention and one dense MLP side by side in every layer: set "
                             "parallel_block false or leave it out")
        if self.num_experts:
            if not 0 < self.num_experts_per_tok <= self.num_experts:
                raise ValueError(
                    f"num_experts_per_tok ({self.num_experts_per_tok}) must be between 1 and "
                    f"num_experts ({self.num_experts})"
                )
            if (self.n_group is None) != (self.topk_group is None):
                raise ValueError("group-limited routing needs both n_group and topk_group (or neither)")
            if self.seq_aux and self.global_aux:
                raise ValueError("seq_aux and global_aux both set: the load-balancing loss is taken per sequence "
                                 "(seq_aux) or over the global batch (global_aux), not both; keep one")
            n_group, topk_group = self.n_group, self.topk_group
            if n_group is not None and topk_group is not None and (
                    self.num_experts % n_group or topk_group > n_group
                    or topk_group * self.num_experts // n_group < self.num_experts_per_tok):
                raise ValueError(
                    f"n_group ({self.n_group}) must divide num_experts ({self.num_experts}), and topk_group "
                    f"({self.topk_group}) groups must hold at least num_experts_per_tok "
                    f"({self.num_experts_per_tok}) experts, with topk_group <= n_group"
                )
            if self.first_k_dense_replace >= self.num_hidden_layers:
                raise ValueError(
                    f"first_k_dense_replace ({self.first_k_dense_replace}) must be below "
                    f"num_hidden_layers ({self.num_hidden_layers})"
                )
        elif self.moe_latent_size is not None:
            raise ValueError(f"moe_latent_size ({self.moe_latent_size}) is set on a dense model; the latent "
                             "projections wrap routed experts (give num_experts, or leave moe_latent_size out)")
        elif self.num_experts_per_tok or self.n_shared_experts or self.n_group or self.topk_group:
            raise ValueError("num_experts_per_tok / n_shared_experts / n_group / topk_group need num_experts > 0")
        elif self.routing_fields_set:
            raise ValueError(f"{', '.join(self.routing_fields_set)} set on a dense model; routing fields need "
                             "num_experts > 0 (leave them out)")
        if self.kv_lora_rank is not None:
            missing = [
                f for f in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim") if getattr(self, f) is None
            ]
            if missing:
                raise ValueError(f"MLA (kv_lora_rank set) also needs {', '.join(missing)}")
        else:
            stray = [f for f in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim") if getattr(self, f) is not None]
            if stray:  # without kv_lora_rank the model is priced as plain attention and these would be ignored
                raise ValueError(f"{', '.join(stray)} set without kv_lora_rank: multi-head latent attention needs "
                                 "kv_lora_rank (give it, or leave the MLA fields out for plain attention)")
        self._deepseek_v4_rules()
        return self

    def _deepseek_v4_rules(self) -> None:
        """The grouped output projection, the shared key/value head and hash routing fit the model's widths."""
        if (self.o_lora_rank is None) != (self.o_groups is None):
            raise ValueError("the grouped output projection needs o_lora_rank and o_groups together (or neither)")
        a, d = self.num_attention_heads, self.d_head
        if self.o_groups is not None and (a * d) % self.o_groups:
            raise ValueError(f"o_groups ({self.o_groups}) must divide num_attention_heads x head_dim ({a * d}): "
                             "each group projects an equal share of the heads")
        if self.shared_key_value and (self.kv_heads != 1 or self.is_mla):
            raise ValueError(f"shared_key_value reads one projection as key and value: it needs num_key_value_heads "
                             f"1 (got {self.kv_heads}) and no multi-head latent attention")
        if self.num_hash_layers > self.num_moe_layers:
            raise ValueError(f"num_hash_layers ({self.num_hash_layers}) must be at most the MoE layers "
                             f"({self.num_moe_layers}): hash routing picks experts")

    def _hybrid_rules(self) -> None:
        """The per-layer lists agree with the layer count and the dimensions each kind needs are given."""
        kinds = self.layer_types or ()
        if self.mlp_layer_types is not None:
            if len(self.mlp_layer_types) != self.num_hidden_layers:
                raise ValueError(f"mlp_layer_types lists {len(self.mlp_layer_types)} layers but num_hidden_layers "
                                 f"is {self.num_hidden_layers}; give one of dense, moe, none per layer")
            if ("moe" in self.mlp_layer_types) != bool(self.num_experts):
                raise ValueError("mlp_layer_types lists moe layers but num_experts is 0 (or the reverse); give "
                                 "num_experts with moe layers")
            if self.first_k_dense_replace:
                raise ValueError("give either mlp_layer_types or first_k_dense_replace, not both (list the "
                                 "leading dense layers in mlp_layer_types)")
            # without layer_types every layer has attention, so kinds is () and no layer can be empty
            empty = [i for i, (k, f) in enumerate(zip(kinds, self.mlp_layer_types, strict=False))
                     if k == "none" and f == "none"]
            if empty:
                raise ValueError(f"layer {empty[0]} has neither a mixer nor an MLP (layer_types none and "
                                 "mlp_layer_types none); drop the layer")
        for kind, fields in (("mamba", MAMBA_FIELDS), ("linear_attention", LINEAR_FIELDS)):
            missing = [f for f in fields if getattr(self, f) is None]
            if kind in kinds and missing:
                raise ValueError(f"layer_types lists {kind} layers, which also need {', '.join(missing)}")
        if "mamba" in kinds and self.mamba_num_heads and self.n_groups and self.mamba_num_heads % self.n_groups:
            raise ValueError(f"mamba_num_heads ({self.mamba_num_heads}) must be a multiple of n_groups "
                             f"({self.n_groups}): the heads split into equal groups")
        Hv, Hk = self.linear_num_value_heads, self.linear_num_key_heads
        if "linear_attention" in kinds and self.linear_attention_rule == "lightning" and Hv != Hk:
            raise ValueError(f"lightning attention has one head count for q, k and v; linear_num_value_heads ({Hv}) "
                             f"must equal linear_num_key_heads ({Hk})")
        if "linear_attention" in kinds and Hv and Hk and Hv % Hk:
            raise ValueError(f"linear_num_value_heads ({self.linear_num_value_heads}) must be a multiple of "
                             f"linear_num_key_heads ({self.linear_num_key_heads})")
        sparse = [f for f in ("index_topk", "index_n_heads", "index_head_dim") if getattr(self, f) is None]
        csa = "compressed_sparse_attention" in kinds
        if len(sparse) not in (0, 3) or (not sparse and not self.is_mla and not csa) or (csa and sparse):
            raise ValueError("DeepSeek Sparse Attention needs index_topk, index_n_heads and index_head_dim together, "
                             "on a multi-head latent attention model (kv_lora_rank set) or for the indexer of "
                             "compressed_sparse_attention layers")
        if any(k in kinds for k in COMPRESSED_KINDS) and self.sliding_window is None:
            raise ValueError("compressed attention layers attend to a sliding window of recent tokens besides the "
                             "compressed keys; give sliding_window")
        if "chunked_attention" in kinds and self.attention_chunk_size is None:
            raise ValueError("layer_types lists chunked_attention layers, which also need attention_chunk_size")

    # Derived quantities (no state is stored twice: these are computed from the fields).
    def count_layers(self, kind: str) -> int:
        """Layers whose mixer is `kind` (every layer is full attention when layer_types is None)."""
        if self.layer_types is None:
            return self.num_hidden_layers if kind == "full_attention" else 0
        return self.layer_types.count(kind)

    @property
    def mlp_activation(self) -> str:
        """The MLP's activation in words: hidden_act where the spec names it, else what the spec implies: a
        Nemotron-H ungated MLP is squared ReLU (relu2, its config's default; hf.py then names none), another ungated
        MLP GELU (gated_mlp's plain two-matrix MLP), a gated one SwiGLU / GeGLU unnamed."""
        if self.hidden_act:
            return f"{self.hidden_act} (hidden_act)"
        if not self.gated_mlp:
            return (
                "squared ReLU (relu2, Nemotron-H's default; the spec names no hidden_act)"
                if self.model_type == "nemotron_h"
                else "GELU (a plain two-matrix MLP; the spec names no hidden_act)"
            )
        return "a gated activation not named in the spec (hidden_act)"

    @property
    def is_sparse_attention(self) -> bool:
        """DeepSeek Sparse Attention: a lightning indexer picks index_topk keys per query."""
        return self.index_topk is not None

    @property
    def is_dsa(self) -> bool:
        """DeepSeek-V3.2's sparse attention: the indexer on every (MLA) attention layer over all preceding keys
        (DeepSeek-V4 puts its indexer on the compressed_sparse_attention layers only)."""
        return self.is_sparse_attention and self.is_mla

    @property
    def compressed_layers(self) -> int:
        """Layers with compressed attention (DeepSeek-V4's CSA and HCA)."""
        return sum(self.count_layers(k) for k in COMPRESSED_KINDS)

    @property
    def is_hybrid(self) -> bool:
        """Some layer's mixer is not softmax attention, or some layer lacks a mixer or an MLP."""
        kinds = self.layer_types or ()
        return any(k not in ATTENTION_KINDS for k in kinds) or "none" in (self.mlp_layer_types or ())

    @property
    def num_attention_layers(self) -> int:
        """Layers with softmax attention (full, sliding or chunked): the layers that keep a KV cache."""
        return sum(self.count_layers(k) for k in ATTENTION_KINDS)

    @property
    def num_mlp_layers(self) -> int:
        """Layers with a dense MLP after the mixer."""
        if self.mlp_layer_types is not None:
            return self.mlp_layer_types.count("dense")
        return self.num_dense_layers

    @property
    def kv_heads(self) -> int:
        """Key/value heads, defaulting to the query heads."""
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def d_head(self) -> int:
        """Per-head dimension, defaulting to hidden_size / num_attention_heads."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def routing_fields_set(self) -> list[str]:
        """Router fields given a value other than their default (plain softmax top-k routing)."""
        return [f for f in ROUTING_FIELDS if getattr(self, f) != type(self).model_fields[f].default]

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def mla(self) -> MLA | None:
        """The MLA dimensions as ints, or None when the model has no multi-head latent attention."""
        kv_r, nope, rope, v = self.kv_lora_rank, self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim
        if kv_r is None:
            return None
        if nope is None or rope is None or v is None:  # refused by _cross_field_rules; model_construct skips it
            raise ValueError("MLA (kv_lora_rank set) also needs qk_nope_head_dim, qk_rope_head_dim and v_head_dim")
        return MLA(self.q_lora_rank, kv_r, nope, rope, v)

    @property
    def expert_ffn(self) -> int:
        """FFN width of one routed expert."""
        return self.moe_intermediate_size or self.intermediate_size

    @property
    def expert_width(self) -> int:
        """Width of the routed experts' input and output, and of the tokens the all-to-all moves: the latent
        width of a latent MoE (moe_latent_size), else hidden_size."""
        return self.moe_latent_size or self.hidden_size

    @property
    def shared_ffn(self) -> int:
        """Total FFN width of the shared experts of one MoE layer (0 when there are none)."""
        if self.shared_expert_intermediate_size is not None:
            return self.shared_expert_intermediate_size
        return self.n_shared_experts * self.expert_ffn

    @property
    def num_moe_layers(self) -> int:
        if self.mlp_layer_types is not None:
            return self.mlp_layer_types.count("moe")
        return self.num_hidden_layers - self.first_k_dense_replace if self.is_moe else 0

    @property
    def num_dense_layers(self) -> int:
        """Layers without routed experts (a hybrid's mixer-only layers among them; num_mlp_layers counts
        the ones with a dense MLP)."""
        return self.num_hidden_layers - self.num_moe_layers
