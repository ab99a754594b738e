"""Megatron-LM `pretrain_gpt.py`: a bash launch script. Flag names: Megatron-LM megatron/training/arguments.py;
tests/test_export.py parses every exported flag with the flags of that parser, recorded by
tools/launcher_flags.py from commit d98e8a6 (main after core_v0.19.0, August 2026)."""

from __future__ import annotations

from typing import Any

import functools

import numpy as np

from llmplan.cost.model_states import grad_prescaled
from llmplan.cost.kernels import graph_scopes
from llmplan.cost.muon import MUON_NS_STEPS
from llmplan.export.common import unfused_loss_refusal
from llmplan.export.common import (as_flags, cast_add_refusal, check_ep_overlap, delayed_bf16_layers_refusal,
                                   expert_bias, fused_expert_bias_refusal,
                                   kept_grad_shards_refusal, fp32_embedding_grads_refusal, whole_embedding_refusal,
                                   launcher_schedule, need_mode, refuse, refuse_first, rendezvous_lines,
                                   sh_header, megatron_expert_notes, megatron_expert_refusals, megatron_layout,
                                   norm_kernel_refusals, softmax_kernel_refusals, softmax_kernel_refusal,
                                   SOFTMAX_KERNEL_WORDS,
                                   pp_sync_notes, op_fuser,
                                   parallel_block_refusal, squared_relu,
                                   torch_ring_refusal, tp_refusals)
from llmplan.export.hybrid import check_hybrid, hybrid_model_pairs, megatron_layer_count, pattern_variable
from llmplan.cost.activations import RANK_CAPACITY_DEFAULT
from llmplan.cost.comm import TE_UB_SMS, te_default_margin_sms
from llmplan.cost.params import stage_layer_list
from llmplan.cost.runtime_memory import mla_turns_tp_overlap_off, tp_overlap_asked, userbuffers_on
from llmplan.planfile import PlanFile
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.quantities import bf16_layer_counts

TARGET = "megatron"


def model_flags(pf: PlanFile) -> list[str]:
    """The model's architecture as Megatron-LM flags: sizes, attention and position embedding
    (attention_pairs), norms, biases, dropout, the MoE (moe_model_pairs) and a hybrid stack's pattern."""
    m, p = pf.model, pf.plan
    llama_like = m.model_type != "gpt" and m.model_type != "gpt2"
    hybrid = m.is_hybrid  # Megatron-LM's hybrid stack: one Megatron layer per pattern symbol (export/hybrid.py)
    pairs: list[tuple[str, object]] = [
        ("--num-layers", megatron_layer_count(m) if hybrid else m.num_hidden_layers), ("--hidden-size", m.hidden_size),
        ("--ffn-hidden-size", m.intermediate_size), ("--num-attention-heads", m.num_attention_heads),
        ("--kv-channels", m.head_dim), ("--seq-length", p.seq_len),
        ("--max-position-embeddings", max(m.max_position_embeddings, p.seq_len)),  # Megatron: >= --seq-length
        *attention_pairs(pf),
    ]
    pairs += [*window_pairs(pf), ("--softmax-type", "learnable" if m.attention_sinks else None), *glu_pairs(pf),
              ("--normalization", "RMSNorm" if m.norm_type == "rmsnorm" else "LayerNorm"),
              ("--disable-bias-linear", llama_like and not m.attention_bias and not m.mlp_bias),
              ("--add-qkv-bias", m.qkv_bias), ("--qk-layernorm", m.qk_norm),
              ("--untie-embeddings-and-output-weights", not m.tie_word_embeddings),
              # Megatron defaults both to 0.1; state the model's own values (0 for Llama-style models).
              ("--attention-dropout", f"{m.attention_dropout:g}"), ("--hidden-dropout", f"{m.hidden_dropout:g}")]
    if m.is_moe:
        pairs += moe_model_pairs(pf)
    if hybrid:
        pairs += hybrid_model_pairs(pf)
    return as_flags(pairs + mtp_pairs(pf))


def mtp_pairs(pf: PlanFile) -> list[tuple[str, object]]:
    """The trained model's MTP modules, dense or MoE, hybrid or not: --mtp-num-layers (TransformerConfig.
    mtp_num_layers; a hybrid's unified pattern gives the same count after '/', which arguments.py checks it
    against), and whether its depths run one module's weights (ModelSpec.mtp_repeated_layer, as priced:
    cost.stages.mtp_weight_sets): --mtp-use-repeated-layer, the flag Megatron-LM's ArgumentGroupFactory makes of
    TransformerConfig.mtp_use_repeated_layer (NVIDIA/Megatron-LM@d98e8a64dd transformer_config.py;
    MultiTokenPredictionBlock builds one layer under it, a hybrid pattern's MTP depths too; NVIDIA's Nemotron-3.5
    Lightning functional test passes it with the pattern's "/*E/*E"). pf.model is the trained model
    (specs.plan.trained_model), whose MTP depth is 0 at --mtp-layers 0: neither flag."""
    m = pf.model
    return [("--mtp-num-layers", m.num_nextn_predict_layers or None),
            ("--mtp-use-repeated-layer", m.mtp_repeated_layer and m.num_nextn_predict_layers > 0)]


def attention_pairs(pf: PlanFile) -> list[tuple[str, object]]:
    """The attention's (flag, value) pairs: MLA's ranks and head dims or grouped-query attention, then the
    position embedding (learned, none for Nemotron-H, else RoPE with its base, context extension, YaRN and
    Llama 3 scaling)."""
    m = pf.model
    pairs: list[tuple[str, object]] = []
    if (mla := m.mla) is not None:
        pairs += [("--multi-latent-attention", True), ("--q-lora-rank", mla.q_lora_rank),
                  ("--kv-lora-rank", mla.kv_lora_rank), ("--qk-head-dim", mla.qk_nope_head_dim),
                  ("--qk-pos-emb-head-dim", mla.qk_rope_head_dim), ("--v-head-dim", mla.v_head_dim)]
    elif m.kv_heads != m.num_attention_heads:
        pairs += [("--group-query-attention", True), ("--num-query-groups", m.kv_heads)]
    if m.learned_position_embeddings:
        pairs.append(("--position-embedding-type", "learned_absolute"))
    elif m.model_type == "nemotron_h":  # its attention layers take no position embedding (Megatron-Bridge NemotronH)
        pairs.append(("--position-embedding-type", "none"))
    else:
        pairs += [("--position-embedding-type", "yarn" if context_pairs(pf) or yarn_pairs(pf) else "rope"),
                  ("--rotary-base", int(m.rope_theta or 10000)), *context_pairs(pf), *yarn_pairs(pf)]
        scaling = m.rope_scaling or {}
        if scaling.get("rope_type") == "llama3":
            pairs += [("--use-rope-scaling", True), ("--rope-scaling-factor", scaling.get("factor", 8.0))]
    return pairs


def moe_model_pairs(pf: PlanFile) -> list[tuple[str, object]]:
    """A MoE model's (flag, value) pairs: experts, top-k, expert and shared sizes, the MoE layers' places, the
    token dispatcher, the experts' GEMM path, the router (router_pairs), the EP overlap and delayed wgrad."""
    m, p = pf.model, pf.plan
    hybrid = m.is_hybrid
    freq = f'"([0]*{m.first_k_dense_replace}+[1]*{m.num_moe_layers})"' if m.first_k_dense_replace and not hybrid \
        else None  # a hybrid pattern places its E layers itself
    if m.mlp_layer_types is not None and not hybrid:  # MoE layers anywhere (Llama 4 Maverick: every other)
        freq = '"[' + ",".join("1" if f == "moe" else "0" for f in m.mlp_layer_types) + ']"'
    return [("--num-experts", m.num_experts), ("--moe-router-topk", m.num_experts_per_tok),
            ("--moe-ffn-hidden-size", m.expert_ffn),
            # TransformerConfig.moe_latent_size (a flag through ArgumentGroupFactory; NVIDIA/Megatron-LM
            # examples/post_training/modelopt/conf/nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16.sh)
            ("--moe-latent-size", m.moe_latent_size),
            ("--moe-shared-expert-intermediate-size", m.shared_ffn or None), ("--moe-layer-freq", freq),
            # DeepEP runs under the flex dispatcher (TransformerConfig: moe_enable_deepep is deprecated
            # for --moe-flex-dispatcher-backend deepep)
            ("--moe-token-dispatcher-type", "flex" if p.moe_dispatcher == "deepep" else "alltoall"),
            # the plan's own backend: a full-iteration graph needs hybridep (check_plan cuda_graphs_flex_backend)
            ("--moe-flex-dispatcher-backend", p.moe_flex_backend if p.moe_dispatcher == "deepep" else None),
            # TransformerConfig.moe_flex_dispatcher_num_sms (a flag through ArgumentGroupFactory)
            ("--moe-flex-dispatcher-num-sms", p.moe_dispatch_sms if p.moe_dispatcher == "deepep" else None),
            # the experts' GEMM path the plan prices (common.op_fuser): one grouped kernel through
            # Transformer Engine's op fuser, else TEGroupedMLP's one GEMM per local expert
            ("--moe-grouped-gemm", True), ("--use-transformer-engine-op-fuser", op_fuser(pf)),
            ("--use-fused-weighted-squared-relu", op_fuser(pf) and squared_relu(m)),
            *router_pairs(pf),
            ("--overlap-moe-expert-parallel-comm", p.ep_comm_overlap),
            # TransformerConfig.delay_wgrad_compute (ModelParallelConfig; a flag through ArgumentGroupFactory)
            ("--delay-wgrad-compute", p.delay_wgrad)]


def rope_type(m: object) -> str | None:
    """The model's RoPE scaling type (HF rope_scaling's rope_type, or its older name type); None without scaling."""
    scaling = getattr(m, "rope_scaling", None) or {}
    return scaling.get("rope_type", scaling.get("type"))


def yarn_pairs(pf: PlanFile) -> list[tuple[str, object]]:
    """A non-MLA model's own YaRN (HF rope_scaling rope_type yarn: GPT-OSS) as Megatron-LM's yarn rotary embedding:
    factor, original context, beta fast / slow, and the correction range left unrounded where HF's truncate is
    false (transformers' _compute_yarn_parameters rounds by default, as Megatron-LM does); no mscale flags, since
    Megatron-LM's defaults (mscale 1, mscale_all_dim 0) give HF's default attention factor 0.1 ln(factor) + 1.
    Source: NVIDIA/Megatron-LM@d98e8a6 megatron/training/argument_utils.py (_apply_yarn_config_from_args: the
    flags -> yarn_* config), megatron/core/models/common/embeddings/yarn_rotary_pos_embedding.py;
    NVIDIA-NeMo/Megatron-Bridge@067f987 src/megatron/bridge/models/gpt_oss/gpt_oss_bridge.py (provider_bridge:
    factor 32, original 4096, beta 32 / 1, yarn_correction_range_round_to_int False)."""
    m = pf.model
    if m.is_mla or rope_type(m) != "yarn" or context_pairs(pf):
        return []
    s = m.rope_scaling or {}
    return [("--yarn-original-max-position-embeddings", s.get("original_max_position_embeddings")),
            ("--rotary-scaling-factor", f"{s.get('factor', 1.0):g}"),
            ("--yarn-beta-fast", f"{s.get('beta_fast', 32.0):g}"), ("--yarn-beta-slow", f"{s.get('beta_slow', 1.0):g}"),
            ("--no-yarn-correction-range-round-to-int", s.get("truncate", True) is False)]


def window_pairs(pf: PlanFile) -> list[tuple[str, object]]:
    """The model's sliding-window layers as Megatron-Core's window attention: --window-size (left, right) with the
    left window one less than HF's sliding_window (HF's mask keeps a key when q - k < sliding_window, the query's
    own position among them; Transformer Engine's (left, 0) keeps q - left <= k <= q), and, where full layers mix
    in, --window-attn-skip-freq as the per-layer list (1: windowed; is_layer_window_attention reads entry
    layer_number - 1). Source: NVIDIA/Megatron-LM@d98e8a6 megatron/training/arguments.py (--window-size tuple_type,
    --window-attn-skip-freq moe_freq_type), megatron/core/transformer/utils.py (is_layer_window_attention);
    NVIDIA-NeMo/Megatron-Bridge@067f987 gpt_oss_bridge.py (window_size = (sliding_window - 1, 0))."""
    m = pf.model
    window, windowed = m.sliding_window, m.count_layers("sliding_attention")
    if window is None or not windowed or m.is_hybrid or m.layer_types is None:  # check_hybrid refuses windows
        return []
    pattern = None if windowed == m.num_hidden_layers else \
        '"[' + ",".join("1" if t == "sliding_attention" else "0" for t in m.layer_types) + ']"'
    return [("--window-size", f"{window - 1},0"), ("--window-attn-skip-freq", pattern)]


def glu_pairs(pf: PlanFile) -> list[tuple[str, object]]:
    """The gated MLP's activation: SwiGLU (--swiglu), or GPT-OSS's clamped GLU, gate * sigmoid(1.702 gate) *
    (linear + 1) with the gate clamped at most swiglu_limit and the linear half within +/- it, which is
    Megatron-Core's quick GEGLU (quick_gelu = x sigmoid(1.702 x)) with glu_linear_offset 1 and
    activation_func_clamp_value; a clamp on another model's SwiGLU is the same clamp on --swiglu (Megatron-Core
    takes it on MoE models only: check refuses it on a dense one). Source: huggingface/transformers
    models/gpt_oss/modeling_gpt_oss.py (GptOssExperts: alpha 1.702, limit, (up + 1) * glu); NVIDIA/Megatron-LM
    @d98e8a6 megatron/training/argument_utils.py (--quick-geglu -> quick_gelu with gated_linear_unit),
    megatron/core/transformer/mlp.py (glu: clamp, activation_func(x_glu) * (x_linear + glu_linear_offset));
    NVIDIA-NeMo/Megatron-Bridge@067f987 gpt_oss_bridge.py (quick_gelu, clamp 7.0, glu_linear_offset 1.0)."""
    m = pf.model
    if not m.gated_mlp:
        return []
    limit = None if m.swiglu_limit is None else f"{m.swiglu_limit:g}"
    if m.model_type == "gpt_oss":
        return [("--quick-geglu", True), ("--glu-linear-offset", 1), ("--activation-func-clamp-value", limit)]
    return [("--swiglu", True), ("--activation-func-clamp-value", limit)]


def router_pairs(pf: PlanFile) -> list[tuple[str, object]]:
    """The model's router as Megatron-Core routes (moe_utils.py,
    topk_routing_with_score_function): softmax after top-k renormalises, --moe-router-pre-softmax keeps the
    softmax over all experts; sigmoid scores are renormalised whenever top-k > 1; the expert bias picks
    experts only; the group limit sums each group's top k/t scores (DeepSeek-V3's rule)."""
    m = pf.model
    return [("--moe-router-score-function", m.scoring_func),
            ("--moe-router-pre-softmax", m.scoring_func == "softmax" and not m.norm_topk_prob),
            ("--moe-router-num-groups", m.n_group), ("--moe-router-group-topk", m.topk_group),
            ("--moe-router-topk-scaling-factor", f"{m.routed_scaling_factor:g}" if m.routed_scaling_factor != 1
             else None),
            ("--moe-router-enable-expert-bias", m.expert_bias),
            # the router as priced for every MoE model: fp32 logits and probs (cost.elementwise.ROUTER_BYTES,
            # cost.comm.ROUTER_PROB_BYTES, cost.kernels' fp32 casts), Transformer Engine's permute (ROW_ID_MAP_BYTES,
            # PERMUTE_BYTES: docs/formulas.md#moe.routing_passes) and its fused router where the plan prices it
            # (plan.moe_router_fusion: cost.kernels.router_kernels, cost.moe_kernels.router_topk_calls; Megatron-
            # Core's defaults are None, False, False: TransformerConfig at d98e8a6)
            ("--moe-router-dtype", "fp32"), ("--moe-router-fusion", pf.plan.moe_router_fusion),
            # plan.moe_router_padding (cost.moe.router_padding_share; TransformerConfig at cd4afffa6)
            ("--moe-router-padding-for-quantization", pf.plan.moe_router_padding),
            ("--moe-permute-fusion", True),
            *balance_pairs(pf)]


AUX_LOSS_COEFF_DEFAULT = 1e-3
"""--moe-aux-loss-coeff for a model spec without router_aux_loss_coef: the default Megatron-Bridge takes where a
config.json omits router_aux_loss_coef (NVIDIA-NeMo/Megatron-Bridge@067f987 models/minimax_m2/minimax_m2_bridge.py,
models/ernie/ernie_45_bridge.py: getattr(hf_config, "router_aux_loss_coef", 1e-3)), the value of Megatron-LM's own
Qwen3 and Llama 4 examples (NVIDIA/Megatron-LM@d98e8a6 examples/post_training/modelopt/conf/)."""


def aux_loss_coeff(m: object) -> float:
    """The coefficient the export trains the model's auxiliary load-balancing loss with: the spec's
    router_aux_loss_coef, else AUX_LOSS_COEFF_DEFAULT."""
    coef = getattr(m, "router_aux_loss_coef", None)
    return AUX_LOSS_COEFF_DEFAULT if coef is None else float(coef)


def balance_pairs(pf: PlanFile) -> list[tuple[str, object]]:
    """The router's load balancing as priced: an auxiliary loss computed in every MoE layer's forward (the fused
    scores, token counts with their all-reduce, the loss and its trackers: cost.kernels.router_kernels,
    cost.moe.MOE_CYCLE_HOST_OPS, cost.overhead.MOE_LAYER_KERNELS), which Megatron-Core computes only with a
    coefficient above 0 (--moe-aux-loss-coeff defaults to 0.0: arguments.py; router.py is_aux_loss_enabled at
    d98e8a6). Per sequence (seq_aux_loss) where the model's loss is (seq_aux: DeepSeek-V2/V3's complementary
    sequence-wise loss), over the global batch (global_aux_loss) where the model's is (global_aux: Qwen3-Next as
    Megatron-Bridge trains it), else over the micro-batch (aux_loss: the Switch / GShard loss of Mixtral's and
    Qwen-MoE's HF load_balancing_loss_func); none where the model trains without one (router_aux_loss_coef 0:
    balance_notes). DeepSeek-V3's aux-loss-free bias is --moe-router-enable-expert-bias (router_pairs)."""
    coef = aux_loss_coeff(pf.model)
    if coef == 0:
        return [("--moe-router-load-balancing-type", "none")]
    kind = "seq_aux_loss" if pf.model.seq_aux else "global_aux_loss" if pf.model.global_aux else "aux_loss"
    return [("--moe-router-load-balancing-type", kind),
            ("--moe-aux-loss-coeff", f"{coef:g}")]


def balance_notes(pf: PlanFile) -> tuple[str, ...]:
    """The header note of an MoE model whose spec gives no auxiliary-loss coefficient (the script writes
    AUX_LOSS_COEFF_DEFAULT); one that trains without the loss (router_aux_loss_coef 0) is priced without its
    kernels (cost.kernels.aux_loss_on), so it needs no note."""
    m = pf.model
    if not m.is_moe:
        return ()
    if m.router_aux_loss_coef is None:
        return (f"note: {m.name}'s spec gives no router_aux_loss_coef (config.json's router_aux_loss_coef or "
                f"aux_loss_alpha), so the script trains its load-balancing loss with --moe-aux-loss-coeff "
                f"{AUX_LOSS_COEFF_DEFAULT:g}, as priced (Megatron-LM's default 0 turns the loss off); set "
                "router_aux_loss_coef in the spec to train the model's own",)
    return ()


def check_model_features(pf: PlanFile) -> None:
    """What Megatron-LM's flags cannot say of the model itself, so that the script would train another model: a
    RoPE scaling other than llama3 or YaRN (or YaRN's attention_factor), biases on the attention but not the MLP or
    the reverse (add_bias_linear sets both), and a GLU clamp on a dense MLP (TransformerConfig takes
    activation_func_clamp_value on SwiGLU with MoE only). Source: NVIDIA/Megatron-LM@d98e8a6
    megatron/training/arguments.py, megatron/core/transformer/transformer_config.py (__post_init__)."""
    m = pf.model
    kind = rope_type(m)
    fix = "export to a launcher that runs the model's own layers, or change the model spec"
    if not m.is_mla and not m.learned_position_embeddings and kind not in (None, "default", "llama3", "yarn"):
        raise refuse(TARGET, f"RoPE scaling {kind} ({m.name}: Megatron-LM at d98e8a6 takes llama3 scaling "
                     "(--use-rope-scaling) and YaRN (--position-embedding-type yarn) only)", fix)
    if not m.is_mla and kind == "yarn" and "attention_factor" in (m.rope_scaling or {}):
        raise refuse(TARGET, f"YaRN with its own attention_factor ({m.name}: Megatron-LM's yarn embedding derives "
                     "the factor from --mscale / --mscale-all-dim)", fix)
    if m.model_type not in ("gpt", "gpt2") and m.attention_bias != m.mlp_bias:
        raise refuse(TARGET, f"biases on the {'attention' if m.attention_bias else 'MLP'} projections only "
                     f"({m.name}: Megatron-LM's --disable-bias-linear drops, and its default keeps, the biases of "
                     "every linear layer; --add-qkv-bias adds the q, k, v ones)", fix)
    if m.swiglu_limit is not None and m.gated_mlp and not m.is_moe:
        raise refuse(TARGET, f"a clamped GLU on a dense MLP ({m.name}: Megatron-Core's TransformerConfig takes "
                     "activation_func_clamp_value on SwiGLU with MoE only, and its dense MLP fuses no clamped quick "
                     "GEGLU)", fix)


def check_router(pf: PlanFile) -> None:
    """What Megatron-Core's router cannot run (TransformerConfig: expert bias with sigmoid / sqrtsoftplus only;
    sigmoid weights always renormalised above top-1)."""
    m = pf.model
    if not m.is_moe:
        return
    if m.expert_bias and m.scoring_func != "sigmoid":
        raise refuse(TARGET, f"an expert bias with {m.scoring_func} scores ({m.name}; Megatron-Core's aux-loss-free "
                     "bias takes sigmoid scores)", "set scoring_func sigmoid or expert_bias false in the model spec")
    if m.scoring_func == "sigmoid" and not m.norm_topk_prob and m.num_experts_per_tok > 1:
        raise refuse(TARGET, f"sigmoid routing weights without renormalisation ({m.name}; Megatron-Core "
                     "renormalises sigmoid top-k weights)", "set norm_topk_prob true in the model spec")


def parallel_flags(pf: PlanFile) -> list[str]:
    """The plan as Megatron-LM flags: the parallel sizes, then ddp_pairs, kernel_pairs, the MoE capacity,
    recompute_pairs, offload_pairs, precision_pairs and the CUDA graphs (cuda_graph_pairs)."""
    p, m = pf.plan, pf.model
    pairs: list[tuple[str, object]] = [
        ("--tensor-model-parallel-size", p.tp), ("--pipeline-model-parallel-size", p.pp), *pipeline_pairs(pf),
        ("--sequence-parallel", p.sp), ("--context-parallel-size", p.cp),
        # Transformer Engine's CP attention the plan priced, one for every layer (Megatron-LM@d98e8a6 arguments.py
        # --cp-comm-type, nargs='+'); TE's own spelling: its attn_forward_func_with_cp dispatches on "all_gather"
        # (Megatron's help says "allgather", which only its DSA layers normalise)
        ("--cp-comm-type", p.cp_comm_type if p.cp > 1 and p.cp_comm_type != "p2p" else None),
        # a2a+p2p's two levels, a2a first (Megatron-LM@d98e8a6 model_parallel_config.py
        # hierarchical_context_parallel_sizes; tests/functional_tests/test_cases/gpt/
        # gpt3_mcore_te_tp1_pp2_cp4_a2a_p2p_nondeterministic/model_config.yaml: "--hierarchical-context-parallel-sizes:
        # 2 2")
        ("--hierarchical-context-parallel-sizes", f"{p.cp_a2a_size} {p.cp // p.cp_a2a_size}"
         if p.cp > 1 and p.cp_comm_type == "a2a+p2p" else None),
    ]
    if m.is_moe:
        pairs += [("--expert-model-parallel-size", p.ep), ("--expert-tensor-parallel-size", p.etp_resolved)]
    pairs += ddp_pairs(pf) + kernel_pairs(pf)
    if m.is_moe and p.moe_capacity_factor is not None:
        pairs += [("--moe-expert-capacity-factor", f"{p.moe_capacity_factor:g}"),
                  ("--moe-pad-expert-input-to-capacity", True)]
    pairs += recompute_pairs(pf) + offload_pairs(pf) + precision_pairs(pf)
    return as_flags(pairs + cuda_graph_pairs(pf))


def ddp_pairs(pf: PlanFile) -> list[tuple[str, object]]:
    """The data-parallel side as priced: the distributed optimizer or Megatron-FSDP (fsdp_pairs), optimizer
    instances, the reduction and gather overlaps, TP overlap, the in-collective average, the bucket and the
    gradient accumulation fusion."""
    p = pf.plan
    return [("--use-distributed-optimizer", p.zero >= 1), ("--overlap-grad-reduce", p.overlap_grad_reduce),
            *fsdp_pairs(pf),
            # megatron/training/arguments.py (2a75ac12c): the distributed optimizer sharded within each of N
            # partial data-parallel groups, the gradients all-reduced across them (docs/formulas.md#mem.hsdp)
            ("--num-distributed-optimizer-instances", p.dp_replicate if p.dp_replicate > 1 else None),
            ("--overlap-param-gather", p.overlap_param_gather and p.zero >= 1 and p.overlap_grad_reduce),
            # core_v0.14.0 arguments.py: needs the distributed optimizer, --overlap-param-gather and
            # --num-layers-per-virtual-pipeline-stage (check_plan: param_gather_optstep_interleaved); and since
            # --overlap-param-gather asserts --overlap-grad-reduce there, written only beside both (a plan with
            # the gather overlap and without the reduction's is refused: param_gather_refusal)
            ("--overlap-param-gather-with-optimizer-step", p.overlap_param_gather_with_optimizer_step
             and p.overlap_param_gather and p.zero == 1 and p.overlap_grad_reduce),
            ("--tp-comm-overlap", bool(tp_overlap_asked(p))),  # check rule fp8_output_proj_tp_overlap shares it
            # Megatron-LM's defaults are the NaN check's bucket norms and the 1/dp pre-scaling before the
            # reduction (docs/formulas.md#step.grad_buffer). The pre-scaling is off where the plan priced it
            # off; the NaN check, a safety check, stays on (grad_nan_notes says what that costs; a
            # full-iteration graph writes the NaN flag itself: cuda_graph_pairs). Never beside
            # --ddp-reduce-scatter-with-fp32-accumulation, which asserts a SUM reduction (grad_prescaled)
            ("--ddp-average-in-collective", not bool(grad_prescaled(p))),
            # the DDP bucket the plan priced (exposure.bucket_params); unset: Megatron-Core's max(40M, 1M x dp)
            ("--ddp-bucket-size", p.dp_bucket_params),
            # grad_accumulation add: the DDP hook's main_grad.add_ instead of the fused weight-gradient GEMM
            # copy: Megatron-FSDP's optim_grads without the fusion, each gradient copied into its bucket
            ("--no-gradient-accumulation-fusion", p.grad_accumulation in ("add", "copy"))]


def kernel_pairs(pf: PlanFile) -> list[tuple[str, object]]:
    """RoPE fusion, the interleaved pipeline's exchanges, the fused loss, the attention backend and the batch
    sizes."""
    p = pf.plan
    return [("--no-rope-fusion", not p.rope_fusion),  # Megatron-Core's eager rotary (apply_rope_fusion off)
            # the output biases added in their own pass (_bias_dropout_add_func unfused:
            # docs/formulas.md#compute.bias_add)
            ("--no-bias-dropout-fusion", not p.bias_dropout_fusion),
            # a GeLU MLP's fc1 bias added in its own pass (bias_activation_fusion off:
            # docs/formulas.md#compute.bias_gelu; a SwiGLU model reads --no-bias-swiglu-fusion instead)
            ("--no-bias-gelu-fusion", not p.bias_gelu_fusion),
            # batch_p2p_comm: the interleaved exchanges waited for and synchronised (step.pp_blocking)
            ("--no-overlap-p2p-communication", p.pp_blocking_sends and p.pp > 1 and p.vpp > 1),
            # the fused loss llmplan priced (Megatron-LM's default is the unfused vocab-parallel cross
            # entropy, docs/formulas.md#compute.loss); its default --cross-entropy-fusion-impl native
            ("--cross-entropy-loss-fusion", p.fused_loss),
            # which fused loss (fused_loss_impl; te is refused below: d98e8a6 rejects it with the fusion)
            ("--cross-entropy-fusion-impl", "native" if p.fused_loss else None),
            # Megatron-Core's backends: flash = the flash-attn package (FlashAttention-2), fused = cuDNN /
            # Transformer Engine (the native kernel, and the default it picks), unfused = scores in memory.
            ("--attention-backend", None if p.flash_attention and p.attention_kernel == "native"
             else ("flash" if p.flash_attention else "unfused")),
            ("--micro-batch-size", p.micro_batch), ("--global-batch-size", p.global_batch)]


def recompute_pairs(pf: PlanFile) -> list[tuple[str, object]]:
    """The recompute as priced: selective modules (recompute_module_pairs), the first N layers of each chunk in a
    block, or every layer; none without recompute."""
    p = pf.plan
    pairs: list[tuple[str, object]] = []
    if p.recompute == "selective":
        pairs += [("--recompute-granularity", "selective"), *recompute_module_pairs(pf)]
    elif p.recompute == "full" and p.recompute_layers is not None:  # the first N layers of each virtual chunk
        pairs += [("--recompute-granularity", "full"), ("--recompute-method", "block"),
                  ("--recompute-num-layers", p.recompute_layers)]
    elif p.recompute == "full":
        pairs += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"), ("--recompute-num-layers", 1)]
    return pairs


def offload_pairs(pf: PlanFile) -> list[tuple[str, object]]:
    """Activation offloading as priced: whole layers (--cpu-offloading-num-layers) and the fine-grained modules
    with their in-flight cap under full-iteration graphs."""
    p = pf.plan
    # Megatron-LM arguments.py (d98e8a6): --cpu-offloading-num-layers N > 0 sets cpu_offloading (activations only)
    pairs: list[tuple[str, object]] = [("--cpu-offloading-num-layers", p.offload_layers or None)]
    # Megatron-LM fine-grained activation offloading (docs/user-guide/features/fine_grained_activation_offloading.md
    # at 2a75ac12c): the experts' fc1 output is the moe_act module's input; offload_modules as Megatron names
    # them (space-separated after the flag, as --recompute-modules: arguments.py nargs '*', d98e8a64dd)
    off = p.fine_grained_offload_modules
    pairs += [("--fine-grained-activation-offloading", bool(off)),
              ("--offload-modules", " ".join(off) if off else None),
              # TransformerConfig.__post_init__ (d98e8a6, transformer_config.py:2967-2975) asserts a non-negative
              # fine_grained_offloading_max_inflight_offloads with full_iteration graphs (no record_stream inside
              # the capture: the main stream joins each name's D2H copies itself). 1, as Megatron-Bridge's GB300
              # DeepSeek-V3 full-iteration preset sets it (perf_recipes/deepseek/gb300/deepseek_v3.py at
              # 067f987df), is the one-copy-per-name window moe_act_offload_exposed prices; the cap only adds
              # waits, it holds no extra HBM (docs/formulas.md#mem.offload_modules)
              ("--fine-grained-offloading-max-inflight-offloads",
               1 if off and p.cuda_graphs == "full-iteration" else None)]
    return pairs


def precision_pairs(pf: PlanFile) -> list[tuple[str, object]]:
    """The training precision: bf16 / fp16, the fp8 or fp4 format and recipe, the low-precision weight gathers,
    the gradient buffer's dtype (NVIDIA/Megatron-LM d98e8a6 arguments.py: --bf16 accumulates and reduces in fp32
    unless --grad-reduce-in-bf16; --fp16 in fp16 unless --accumulate-allreduce-grads-in-fp32) and its fp32-sum
    reduce-scatter, optimizer states (optimizer_state_pairs), bf16 layers and Muon (muon_pairs)."""
    p = pf.plan
    recipe = fp8_recipe(pf)
    return [("--bf16", p.dtype in ("bf16", "fp8", "fp4")), ("--fp16", p.dtype == "fp16"),
            ("--fp8-format", ("e4m3" if recipe in ("blockwise", "mxfp8") else "hybrid") if p.dtype == "fp8" else None),
            ("--fp8-recipe", recipe),
            ("--fp4-format", "e2m1" if p.dtype == "fp4" else None),
            ("--fp4-recipe", "nvfp4" if p.dtype == "fp4" else None),
            ("--fp8-param-gather", p.dtype == "fp8" and p.fp8_params),
            # TransformerConfig.fp8_output_proj (Megatron-LM 3f6a2ed844; an argument from its dataclass field)
            ("--fp8-output-proj", p.dtype == "fp8" and p.fp8_output_proj),
            ("--fp4-param-gather", p.dtype == "fp4" and p.fp8_params),
            ("--grad-reduce-in-bf16", p.grad_dtype == "bf16" and p.dtype in ("bf16", "fp8", "fp4")),
            # fp16 keeps fp16 main_grads unless asked (d98e8a6 validate_args forces fp32 ones under --bf16 only)
            ("--accumulate-allreduce-grads-in-fp32", p.dtype == "fp16" and p.grad_dtype == "fp32"),
            # Megatron-Core's reduce_scatter_with_fp32_accumulation (check_plan: zero 1, reduce-scatter, 2 B)
            ("--ddp-reduce-scatter-with-fp32-accumulation", p.grad_reduce_fp32_sum), *optimizer_state_pairs(pf),
            *bf16_layer_pairs(pf), *muon_pairs(pf)]


def muon_pairs(pf: PlanFile) -> list[tuple[str, object]]:
    """The Muon flags of a plan with optimizer muon (none under adam), as the plan prices it (cost.muon): --optimizer
    muon, with zero 1 beside --use-distributed-optimizer, which Megatron-LM turns into its layer-wise distributed
    optimizer (arguments.py: use_layer_wise_distributed_optimizer), over a reduce-scattering DDP (its shard-aligned
    parameter layout, the default from core_v0.18.0) or, with grad_reduce all-reduce, the all-reducing ping-pong
    path (--no-use-layer-wise-param-layout); 5 Newton-Schulz steps and --muon-tp-mode blockwise (each TP shard on its
    own; the command-line default is duplicated, which all-gathers TP-split matrices). Source: NVIDIA/Megatron-LM
    at d98e8a6, megatron/training/arguments.py (--optimizer muon from 5548cdc57b, core_v0.16.0; --muon-num-ns-steps,
    --muon-tp-mode; --no-use-layer-wise-param-layout from 0044db1f20, core_v0.18.0)."""
    p = pf.plan
    if p.optimizer != "muon":
        return []
    return [("--optimizer", "muon"), ("--muon-num-ns-steps", MUON_NS_STEPS), ("--muon-tp-mode", "blockwise"),
            ("--muon-scalar-optimizer", "adam"),
            ("--no-use-layer-wise-param-layout", p.zero == 1 and p.grad_reduce == "all-reduce")]


def fp8_recipe(pf: PlanFile) -> str | None:
    """The --fp8-recipe the export writes: None (Megatron-Core's TransformerConfig.fp8_recipe default 'delayed'
    at d98e8a6) for per-tensor delayed scaling, tensorwise for per-tensor current scaling
    (ParallelPlan.fp8_scaling), blockwise and mxfp8 for those recipes."""
    p = pf.plan
    if p.dtype != "fp8":
        return None
    tensorwise = "tensorwise" if p.fp8_scaling == "current" else None
    return {"blockwise": "blockwise", "mxfp8": "mxfp8"}.get(p.recipe, tensorwise)


def stores_remainders(pf: PlanFile) -> bool:
    """Whether Megatron-Core, given --use-precision-aware-optimizer, keeps the plan's fp32 master as 16-bit
    remainders: OptimizerConfig.store_param_remainders is on by default (core_v0.13+; hard-wired on in
    core_v0.11-0.12) and takes effect with bf16 weights whose optimizer Transformer Engine's FusedAdam runs
    (main_params_dtype fp32 and no fp8 recipe past delayed scaling: optimizer_config.py
    use_precision_aware_optimizer_no_fp8_or_ds_fp8; distrib_optimizer.py: an int16 master with bf16).
    fp8 primary weights are left out: the remainder completes a bf16 weight (TE fused_adam.py); so is fp8 current
    scaling (fp8_recipe tensorwise), for which Megatron-Core keeps its own fp32 master."""
    p = pf.plan
    return (p.dtype in ("bf16", "fp8", "fp4") and not p.fp8_params and p.recipe in ("tensorwise", "nvfp4")
            and fp8_recipe(pf) is None and p.optimizer_master_dtype == "fp32" and p.zero >= 1)


def precision_aware(p: ParallelPlan) -> bool:
    """Whether the export turns on Transformer Engine's precision-aware FusedAdam: for Adam states below fp32
    or for the master kept as remainders (param_remainders)."""
    return p.optimizer_master_dtype != "fp32" or p.optimizer_moment_dtype != "fp32" or p.param_remainders


MODULE_PATTERNS = {"attention": ("*.linear_qkv", "*.linear_proj"), "latent_proj": ("*mlp.fc[12]_latent_proj",)}
"""llmplan's bf16_modules -> the module-name globs of Megatron-Core's quantization recipe (the matchers of
megatron/core/extensions/TransformerEngineMixedPrecision.md and Megatron-Bridge's Nemotron-3 Super te_quant.cfg)."""
MXFP8_MODULE_PATTERNS = {"mamba_out_proj": ("*mixer.out_proj",)}
"""llmplan's mxfp8_modules -> the module-name globs of Megatron-Core's quantization recipe (Megatron-Bridge's
Nemotron-3 Super te_quant.cfg, matcher mamba_outproj_mxfp8)."""
MLA_ATTENTION_PATTERNS = ("*.linear_q_proj", "*.linear_q_down_proj", "*.linear_q_up_proj", "*.linear_kv_down_proj",
                          "*.linear_kv_up_proj", "*.linear_proj")
"""The attention projections of an MLA model (Megatron-Core multi_latent_attention.py, MLASelfAttention: no
linear_qkv), all of which llmplan prices in bf16 under bf16_modules attention (cost.gemm's attention tag)."""
TE_PRECISION_FILE = "te_precision.yaml"
SCRIPT_DIR = '$(dirname "$0")'
"""The folder of the running script, where its companion files lie (a SLURM batch script runs from a spool copy:
launch.render_slurm reads them from the submit folder instead)."""


def te_precision_config(pf: PlanFile) -> str:
    """The --te-precision-config-file YAML that keeps the plan's bf16_modules in bf16 (a 'bf16' config with an
    empty training recipe, one glob matcher per module name) and runs its mxfp8_modules in MXFP8 (an 'mxfp8' config),
    as Megatron-LM's load_quantization_recipe reads it."""
    lines = ["configs:", "  bf16:", '    transformer_engine_config_type: "TEQuantizationParams"',
             "    training_recipe: {}"]
    if pf.plan.mxfp8_modules:
        lines += ["  mxfp8:", '    transformer_engine_config_type: "TEQuantizationParams"', "    training_recipe:",
                  '      fp8_quantization_recipe: "mxfp8"']
    lines += ["matchers:"]
    for module in pf.plan.mxfp8_modules:
        for i, pattern in enumerate(MXFP8_MODULE_PATTERNS[module]):
            lines += [f"  {module}_{i}_mxfp8:", '    config: "mxfp8"', '    type: "glob"', f'    pattern: "{pattern}"',
                      "    enabled: true"]
    for module in pf.plan.bf16_modules:
        mla = module == "attention" and pf.model.is_mla
        for i, pattern in enumerate(MLA_ATTENTION_PATTERNS if mla else MODULE_PATTERNS[module]):
            lines += [f"  {module}_{i}_bf16:", '    config: "bf16"', '    type: "glob"', f'    pattern: "{pattern}"',
                      "    enabled: true"]
    return "\n".join(lines) + "\n"


def bf16_layer_pairs(pf: PlanFile) -> list[tuple[str, object]]:
    """The layers the plan keeps in bf16 under its fp8 / fp4 recipe (TransformerConfig.first_last_layers_bf16,
    num_layers_at_start_in_bf16 / num_layers_at_end_in_bf16, Megatron-LM at d98e8a6; both counts written, as
    Megatron-Core's default for each is 1)."""
    start, end = bf16_layer_counts(pf.plan, pf.model.num_hidden_layers)
    modules: list[tuple[str, object]] = ([("--te-precision-config-file", f'"{SCRIPT_DIR}/{TE_PRECISION_FILE}"')]
                                         if pf.plan.bf16_modules or pf.plan.mxfp8_modules else [])
    if not start + end:
        return modules
    return [("--first-last-layers-bf16", True), ("--num-layers-at-start-in-bf16", start),
            ("--num-layers-at-end-in-bf16", end), *modules]


def optimizer_state_pairs(pf: PlanFile) -> list[tuple[str, object]]:
    """Adam's state dtypes through Transformer Engine's precision-aware FusedAdam (Megatron-LM arguments.py:
    --use-precision-aware-optimizer with --main-params-dtype fp32|fp16 and --exp-avg-dtype / --exp-avg-sq-dtype
    fp32|fp16|bf16|fp8); nothing when every state is fp32 and the master is whole. With it Megatron-Core keeps
    the master as 16-bit remainders where stores_remainders says so, and Megatron-LM has no flag to stop it
    (training.py builds OptimizerConfig from the arguments, none of which is store_param_remainders), so
    such a plan must say param_remainders (refusals)."""
    p = pf.plan
    if not precision_aware(p):
        return []
    return [("--use-precision-aware-optimizer", True),
            ("--main-params-dtype", p.optimizer_master_dtype if p.optimizer_master_dtype != "fp32" else None),
            ("--exp-avg-dtype", p.optimizer_moment_dtype if p.optimizer_moment_dtype != "fp32" else None),
            ("--exp-avg-sq-dtype", p.optimizer_moment_dtype if p.optimizer_moment_dtype != "fp32" else None)]


def cuda_graph_pairs(pf: PlanFile) -> list[tuple[str, object]]:
    """The plan's CUDA graphs in Megatron-Core's vocabulary (TransformerConfig.cuda_graph_impl and
    cuda_graph_modules at d98e8a6): layers = Transformer Engine's per-layer graphs of the attention, and of a
    dropless MoE layer's router and preprocessing (a dense layer's MLP too); full-iteration = one graph of the
    forward-backward, which needs the NaN check off and, for a dropless MoE layer, the static per-rank budget
    (--moe-expert-rank-capacity-factor, 1.5 as Megatron-Bridge's performance presets set it with HybridEP; it
    needs the HybridEP backend and Transformer Engine's grouped-tensor GEMMs, whose split sizes stay on the GPU)."""
    p, m = pf.plan, pf.model
    if p.cuda_graphs == "layers":
        return [("--cuda-graph-impl", "transformer_engine"), ("--cuda-graph-modules", " ".join(graphed_modules(pf)))]
    if p.cuda_graphs == "full-iteration":
        budget = m.is_moe and p.moe_capacity_factor is None
        return [("--cuda-graph-impl", "full_iteration"), ("--no-check-for-nan-in-loss-and-grad", True),
                ("--moe-expert-rank-capacity-factor", f"{rank_capacity(p):g}" if budget else None),
                ("--moe-use-grouped-tensor", budget),  # split sizes on the GPU (TransformerConfig rule)
                # the paged stash of the fused grouped MLP's saved tensors and its device pool's factor
                # (TransformerConfig moe_paged_stash, moe_paged_stash_buffer_size_factor_cuda at 1e23526adc)
                ("--moe-paged-stash", budget and p.moe_paged_stash is not None),
                ("--moe-paged-stash-buffer-size-factor-cuda",
                 f"{p.moe_paged_stash:g}" if budget and p.moe_paged_stash is not None else None)]
    return []


def graphed_modules(pf: PlanFile) -> tuple[str, ...]:
    """The per-layer graphs of cuda_graphs layers, as TransformerConfig.cuda_graph_modules names them (d98e8a6):
    the attention, a dense layer's MLP where Megatron-Core lets it be graphed, and a MoE layer's router and
    preprocessing unless recompute module moe (cost.kernels.graph_scopes)."""
    p, m = pf.plan, pf.model
    # cost.kernels.graph_scopes decides them, for pricing and export alike; its names are the launcher's
    # (CudaGraphModule). TransformerConfig (d98e8a6, transformer_config.py:2862-2869) refuses recompute module moe
    # around a graphed moe_router: the router stays eager then, as Megatron-Bridge's Nemotron-3 Nano H100 BF16
    # recipe runs it (graphs attn, mamba with recompute_modules moe, layernorm: perf_recipes/nemotronh/h100/
    # nemotronh.py at 067f987df)
    return graph_scopes(m, not bool(p.recomputes("moe")))


def rank_capacity(p: ParallelPlan) -> float:
    """The static per-rank budget factor the export writes (ParallelPlan.moe_rank_capacity_factor; None: 1.5,
    as Megatron-Bridge's performance presets set it with HybridEP)."""
    return p.moe_rank_capacity_factor or RANK_CAPACITY_DEFAULT


def recompute_module_pairs(pf: PlanFile) -> list[tuple[str, object]]:
    """The modules selective recompute covers, as Megatron-LM's --recompute-modules takes them (space-separated
    after the flag, e.g. `--recompute-modules mla_up_proj layernorm moe_act`, Megatron-LM
    megatron/core/transformer/moe/README.md); none for the default (core_attn alone)."""
    modules = pf.plan.recompute_modules
    return [("--recompute-modules", " ".join(modules))] if modules else []


def pipeline_pairs(pf: PlanFile) -> list[tuple[str, object]]:
    """The stage layout in one of Megatron's three exclusive forms: layers per virtual stage (even split),
    first/last stage layers with virtual stages per rank, or an explicit --pipeline-model-parallel-layout
    (E embedding, t layer, L loss; stages split by '|', virtual stages in model order)."""
    p, m = pf.plan, pf.model
    if m.is_hybrid:  # the '|' segments of --hybrid-layer-pattern say it (Megatron refuses the others)
        return []
    if p.pp_layout is not None:
        return layout_pairs(pf)
    even_chunks = p.vpp == 1 or all(n % p.vpp == 0 for n in stage_layer_list(m, p))
    if p.pp_layers is not None or not even_chunks:
        return [("--pipeline-model-parallel-layout", f'"{megatron_layout(pf, built_mtp(pf))}"')]
    if p.pp_first or p.pp_last:
        return [("--decoder-first-pipeline-num-layers", p.pp_first or None),
                ("--decoder-last-pipeline-num-layers", p.pp_last or None),
                ("--num-virtual-stages-per-pipeline-rank", p.vpp if p.vpp > 1 else None)]
    return [("--num-layers-per-virtual-pipeline-stage", m.num_hidden_layers // (p.pp * p.vpp) if p.vpp > 1 else None)]


def context_pairs(pf: PlanFile) -> list[tuple[str, object]]:
    """Training past the model's max_position_embeddings (context extension): YaRN over the model's context,
    scaled by seq_len / max_position_embeddings (Megatron-LM --position-embedding-type yarn,
    --yarn-original-max-position-embeddings, and --rotary-scaling-factor, which argument_utils.py maps to
    yarn_rotary_scaling_factor for non-MLA models). Empty within the model's context."""
    p, m = pf.plan, pf.model
    if p.seq_len <= m.max_position_embeddings:
        return []
    return [("--yarn-original-max-position-embeddings", m.max_position_embeddings),
            ("--rotary-scaling-factor", f"{p.seq_len / m.max_position_embeddings:g}")]


def layout_pairs(pf: PlanFile) -> list[tuple[str, object]]:
    """A plan's pp_layout as --pipeline-model-parallel-layout (Megatron-LM infers vpp from its chunk count, and
    refuses it beside the other split flags). MTP layers (m) are written only when the script builds them
    (--mtp-num-layers among the model flags): Megatron-LM requires the layout's m count to equal
    mtp_num_layers, or none without it (PipelineParallelLayerLayout.validate_layer_layout)."""
    return [("--pipeline-model-parallel-layout", f'"{megatron_layout(pf, built_mtp(pf))}"')]


def built_mtp(pf: PlanFile) -> int:
    """MTP layers the script builds (its --mtp-num-layers; 0 without the flag), which a layout must list."""
    for flag in model_flags(pf):
        if flag.startswith("--mtp-num-layers "):
            return int(flag.split()[1])
    return 0


def fp8_attention_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """FP8 attention, refused whatever else the plan sets (export.EVERY_PLAN)."""
    return ("FP8 dot-product attention (Megatron-Core's TransformerConfig.fp8_dot_product_attention; Megatron-LM's "
            "arguments.py at d98e8a6 has no flag for it)", bool(p.fp8_attention),
            "export to megatron-bridge, or re-plan without fp8_attention")


SOFTMAX_REFUSALS = {f"softmax_{kernel}": functools.partial(softmax_kernel_refusal, kernel=kernel, runs="te")
                    for kernel in SOFTMAX_KERNEL_WORDS if kernel != "te"}
"""The unfused softmax kernels this export refuses whatever else the plan sets (export.EVERY_PLAN; the check's
softmax_kernel_refusals(pf, "te")): every one but Transformer Engine's, which --attention-backend unfused runs."""


def master_dtype_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """A bf16 master or none, refused whatever else the plan sets (export.EVERY_PLAN)."""
    return (f"optimizer master weights {p.optimizer_master_dtype} (Megatron-LM's --main-params-dtype takes fp32 or "
            "fp16)", p.optimizer_master_dtype in ("bf16", "none"), "re-plan with --optimizer-master-dtype fp32 or fp16")


def param_gather_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """The overlapped parameter gather of ZeRO-1 (and its optimizer-step variant) without the overlapped gradient
    reduction, refused whatever else the plan sets (export.EVERY_PLAN): Megatron-LM's validate_args asserts
    --overlap-grad-reduce beside --overlap-param-gather (megatron/training/arguments.py at core_v0.14.0), so the
    script could not carry the gather overlap that llmplan priced (cost.exposure.dp_exposed). Elementwise on plan
    arrays."""
    bad = np.logical_and(np.logical_and(p.zero == 1, p.overlap_param_gather), np.logical_not(p.overlap_grad_reduce))
    return ("the overlapped parameter gather without the overlapped gradient reduction (Megatron-LM asserts "
            "--overlap-grad-reduce beside --overlap-param-gather)", bad,
            "re-plan with --overlap-grad-reduce, or with --no-overlap-param-gather")


def check(pf: PlanFile) -> None:
    """Refuse, with the rule and its fix, a plan the Megatron-LM script cannot run as priced, in the order a user
    meets them: not a training plan, the hybrid stack, the model (_check_model_builds, check_model_features,
    check_router, the EP overlap), then _check_parallel, _check_kernels and _check_optimizer."""
    need_mode(pf, "train", TARGET)
    if pf.model.is_hybrid:
        check_hybrid(pf)
    _check_model_builds(pf)
    check_model_features(pf)
    check_router(pf)
    check_ep_overlap(pf, TARGET)  # check_plan's EP-overlap rules (common.EP_OVERLAP_RULES)
    _check_parallel(pf)
    _check_kernels(pf)
    _check_optimizer(pf)


def _check_model_builds(pf: PlanFile) -> None:
    """Refuse the model parts Megatron-LM's flags do not build (DeepSeek-V4's compressed attention, DeepSeek Sparse
    Attention, chunked attention, a norm on the embedding output): the script would train another model."""
    if pf.model.compressed_layers or pf.model.hc_mult > 1:
        raise refuse(TARGET, f"DeepSeek-V4's compressed attention and hyper-connections ({pf.model.name}: "
                     "Megatron-Core builds them as DSv4HybridSelfAttention and HyperConnectionModule from its dev "
                     "branch, configured by Megatron-Bridge's model provider (csa_compress_ratios, o_groups, "
                     "hc_mult), not by Megatron-LM command-line flags)",
                     "export to megatron-bridge (its deepseek_v4 recipes)")
    if pf.model.is_sparse_attention:
        raise refuse(TARGET, f"DeepSeek Sparse Attention ({pf.model.name}: Megatron-LM at d98e8a6 builds it as its "
                     "hybrid pattern's D layers with the --dsa-indexer-* flags, which this export does not write; "
                     "writing the model as dense MLA would train another model)",
                     "export the dense deepseek-v3 spec, or write the DSA flags by hand")
    if pf.model.count_layers("chunked_attention"):
        raise refuse(TARGET, f"chunked local attention ({pf.model.name}: Megatron-LM at d98e8a6 has a sliding window, "
                     "--window-size, whose keys cross chunk boundaries, and no chunked attention)",
                     "export to a launcher that runs the model's own attention, or a spec with full attention")
    if pf.model.embedding_norm:
        raise refuse(TARGET, f"a norm on the embedding output ({pf.model.name}: Megatron-DeepSpeed's "
                     "--embed-layernorm; Megatron-LM at d98e8a6 has no flag for it, so the script would train "
                     "the model without it)", "export to deepspeed with a Megatron-DeepSpeed training script, "
                     "or use a spec without embedding_norm")


def _check_parallel(pf: PlanFile) -> None:
    """Refuse Megatron-FSDP's ZeRO-2 / ZeRO-3 rules, a second RoPE scaling, the fused loss, the dtype and
    the pipeline transfers and schedule that the Megatron-LM script does not run as priced."""
    p = pf.plan
    refuse_first(TARGET, fsdp_zero2_refusals(pf).values())
    if context_pairs(pf) and (pf.model.is_mla or pf.model.rope_scaling):
        raise refuse(TARGET, f"seq_len {p.seq_len} past max_position_embeddings {pf.model.max_position_embeddings} "
                     f"of {pf.model.name}, which already scales RoPE "
                     f"({'MLA YaRN' if pf.model.is_mla else 'rope_scaling'}; Megatron-LM takes one scaling)",
                     "re-plan with --seq-len at most max_position_embeddings")
    if p.fused_loss and p.fused_loss_impl == "te":  # arguments.py at d98e8a6 asserts against it (#5115)
        raise refuse(TARGET, "Transformer Engine's fused cross entropy (fused_loss_impl te: Megatron-LM at d98e8a6 "
                     "rejects --cross-entropy-fusion-impl te with --cross-entropy-loss-fusion, NVIDIA/Megatron-LM "
                     "#5115)", "re-plan with --fused-loss-impl native, or export to megatron-bridge")
    if p.dtype == "fp32":
        raise refuse(TARGET, "fp32 training (the script targets --bf16/--fp16 mixed precision)", "use --dtype bf16")
    if p.pp_unbatched_sends and p.pp > 1:  # Megatron-Core's 1F1B pairs a send and a receive per exchange
        raise refuse(TARGET, "1F1B pipeline transfers one at a time (pp_unbatched_sends: DeepSpeed's pipeline "
                     "engine; Megatron-LM pairs each send with a receive in one exchange)",
                     "re-plan with --no-pp-unbatched-sends, or export to deepspeed")
    if launcher_schedule("megatron", p.pp_schedule) is None:
        raise refuse(TARGET, f"the {p.pp_schedule} pipeline schedule (Megatron-LM runs 1F1B and interleaved 1F1B)",
                     "re-plan with --pp-schedule 1f1b")


def loss_impl_refusal(p: Any) -> tuple[str, Any, str]:
    """An unfused loss priced with another implementation's memory than this launcher runs (common.UNFUSED_LOSS_RUNS),
    refused whatever else the plan sets (export.EVERY_PLAN)."""
    return unfused_loss_refusal(p, TARGET)


def _check_kernels(pf: PlanFile) -> None:
    """Refuse the kernels, recompute, routing and TP / expert / embedding features that Megatron-LM's flags do
    not set as priced."""
    p = pf.plan
    if p.swiglu_fp8_input:
        raise refuse(TARGET, "the SwiGLU input kept in fp8 (Megatron-Core's TransformerConfig."
                     "activation_func_fp8_input_store, which Megatron-LM's arguments.py at d98e8a6 excludes from "
                     "its flags)", "export to megatron-bridge, or re-plan with --no-swiglu-fp8-input")
    refuse_first(TARGET, (fp8_attention_refusal(p), param_gather_refusal(p), loss_impl_refusal(p)))
    if p.recompute == "op":
        raise refuse(TARGET, "op-level selective checkpointing (torchtitan's per-op policy; Megatron-LM recomputes "
                     "the attention core, whole layers or a block of them)",
                     "re-plan with --recompute selective or full, or export to torchtitan")
    if pf.model.is_moe and p.moe_routing == "contiguous":
        raise refuse(TARGET, "contiguous MoE routing (NeMo AutoModel's benchmark gate; Megatron-LM's "
                     "--moe-router-force-load-balancing draws random experts)", "re-plan with --moe-routing random")
    refuse_first(TARGET, [*tp_refusals(pf), *megatron_expert_refusals(pf), fused_expert_bias_refusal(pf),
                          cast_add_refusal(pf),
                          *norm_kernel_refusals(pf), *softmax_kernel_refusals(pf, "te"),
                          parallel_block_refusal(pf),
                          torch_ring_refusal(pf), kept_grad_shards_refusal(pf), fp32_embedding_grads_refusal(pf),
                          whole_embedding_refusal(pf), connections_refusal(pf), tp_overlap_queues_refusal(pf)])


def _check_optimizer(pf: PlanFile) -> None:
    """Refuse the gradient reduction, Muon, master and moment dtypes, remainders and fp8 recipe that
    Megatron-Core's optimizer does not run as priced."""
    p = pf.plan
    # grad_reduce_dtype bf16 needs no rule here: check_plan holds it to grad_accumulation cast-add
    # (grad_reduce_dtype_bf16_optimizer), which _check_kernels refuses first (cast_add_refusal). Megatron-LM has
    # no such reduction either (d98e8a6 arguments.py: --accumulate-allreduce-grads-in-fp32 accumulates and reduces
    # in fp32, --grad-reduce-in-bf16 keeps a bf16 buffer for both).
    if p.grad_reduce == "all-reduce" and p.zero == 1 and p.optimizer != "muon":  # Muon: muon_pairs' ping-pong path
        raise refuse(TARGET, "ZeRO-1 gradients all-reduced whole (grad_reduce all-reduce; Megatron-Core's "
                     "distributed optimizer reduce-scatters them)", "re-plan with --grad-reduce reduce-scatter")
    if p.optimizer == "muon" and p.zero == 1 and p.grad_reduce == "reduce-scatter" and expert_bias(pf.model):
        # d98e8a6 megatron/core/optimizer/__init__.py (_get_megatron_emerging_optimizer): on the layer-wise +
        # distributed-optimizer path every AdamW group must be non-expert; routed experts' biases are not
        raise refuse(TARGET, f"Muon over reduce-scattered gradients with {pf.model.name}'s expert biases "
                     "(Megatron-LM's layer-wise param layout hands the AdamW parameters to a distributed optimizer "
                     "that takes no expert-parallel ones)", "re-plan with --grad-reduce all-reduce (its legacy "
                     "layer-wise path)")
    refuse_first(TARGET, [master_dtype_refusal(p)])  # before zero 0's rule: no axis makes a bf16 master export
    if precision_aware(p) and p.zero == 0:
        raise refuse(TARGET, "the precision-aware optimizer (Adam states below fp32 or param_remainders) with zero "
                     "0: Megatron-Core runs it only in the distributed optimizer", "re-plan with --zero 1")
    refuse_first(TARGET, [delayed_bf16_layers_refusal(p)])
    if p.param_remainders and not stores_remainders(pf):
        raise refuse(TARGET, f"the fp32 master kept as 16-bit remainders with fp8 current scaling (--fp8-recipe "
                     f"{fp8_recipe(pf)}: Megatron-Core keeps its own fp32 master unless the fp8 recipe is delayed "
                     "scaling)", "re-plan with --no-param-remainders")
    if precision_aware(p) and stores_remainders(pf) and not p.param_remainders:
        raise refuse(TARGET, f"an fp32 master with moments {p.optimizer_moment_dtype}: Megatron-LM's "
                     "--use-precision-aware-optimizer then keeps the master as 16-bit remainders "
                     "(store_param_remainders, on by default, no flag to turn it off), 2 bytes per parameter "
                     "less than this plan prices", "re-plan with --param-remainders, or export to megatron-bridge")
    if p.dtype == "fp8" and p.recipe == "rowwise":
        raise refuse(TARGET, "fp8 rowwise scaling (torchao's recipe; Megatron-LM's --fp8-recipe takes delayed, "
                     "tensorwise, blockwise or mxfp8)", "re-plan with --precision fp8-blockwise or "
                     "fp8-tensorwise, or export to torchtitan")


FSDP_SOURCE = "NVIDIA/Megatron-LM@d98e8a6"
"""The Megatron-LM commit whose Megatron-FSDP the ZeRO-2 / ZeRO-3 export is read from
(tests/data/launchers/megatron-lm.json's
parser): megatron/training/arguments.py validate_args and megatron/core/distributed/fsdp/src/megatron_fsdp/."""


FSDP_STRATEGY = {2: "optim_grads", 3: "optim_grads_params"}
"""Megatron-FSDP's --data-parallel-sharding-strategy (Megatron-LM d98e8a6 arguments.py: choices no_shard, optim,
optim_grads, optim_grads_params; Megatron-Core DistributedDataParallelConfig.data_parallel_sharding_strategy, the
same values) for each ZeRO stage it runs: 2 shards the main weights and gradients, 3 the model weights too."""


def fsdp_pairs(pf: PlanFile) -> list[tuple[str, object]]:
    """ZeRO-2 / ZeRO-3 as Megatron-LM runs them: Megatron-FSDP with the optim_grads / optim_grads_params sharding
    strategy (FSDP_STRATEGY; param_and_grad_buffer.py _init_each_parameter_group_buffers at d98e8a6: the optimizer's
    main weights and the gradient buffer sharded over DP x CP, the model weights whole under optim_grads and
    sharded, gathered unit by unit, under optim_grads_params), with the checkpoint format validate_args asserts beside
    it (fsdp_dtensor),
    the distributed optimizer its v1 requires (validate_args sets it; written so that it is not a warning), and the
    plan's gradient and master dtypes (Megatron-FSDP's own: 'auto' keeps the gradients in the weights' dtype).
    Nothing for other stages (fsdp_zero2_refusals: the ZeRO-2 / 3 plans it does not run as priced)."""
    p = pf.plan
    if p.zero < 2:
        return []
    grads = "bf16" if p.grad_dtype == "bf16" and p.dtype != "fp32" else "fp32"
    return [("--use-megatron-fsdp", True), ("--data-parallel-sharding-strategy", FSDP_STRATEGY[p.zero]),
            # hybrid sharding (HSDP): ddp_pairs writes --num-distributed-optimizer-instances dp_replicate, which
            # mcore_fsdp_adapter.py _init_dist_index (d98e8a6) reads as enable_hsdp: shard over the partial
            # (intra-instance) DP x CP group, replicate over the inter-instance group; the outer strategy "optim"
            # shards the optimizer across the replicas too (dp_outer_optimizer), "no_shard" replicates it
            ("--outer-dp-sharding-strategy", outer_dp_strategy(p) if p.dp_replicate > 1 else None),
            ("--ckpt-format", "fsdp_dtensor"), ("--megatron-fsdp-main-params-dtype", p.optimizer_master_dtype),
            ("--megatron-fsdp-main-grads-dtype", grads), ("--megatron-fsdp-grad-comm-dtype", grads)]


def outer_dp_strategy(p: ParallelPlan) -> str:
    """Megatron-FSDP's outer (inter-replica) sharding strategy for a hybrid-sharded plan: "optim" where the plan
    shards the optimizer across the replicas (dp_outer_optimizer), else "no_shard" (Megatron-LM d98e8a6
    arguments.py --outer-dp-sharding-strategy choices no_shard / optim; Megatron-Core
    DistributedDataParallelConfig.outer_dp_sharding_strategy, the same values)."""
    return "optim" if p.dp_outer_optimizer else "no_shard"


def fsdp_zero2_refusals(pf: PlanFile) -> dict[str, tuple[str, bool, str]]:
    """Rule id -> (what, whether the plan has it, fix) for the ZeRO-2 / ZeRO-3 plans that Megatron-FSDP's optim_grads /
    optim_grads_params (fsdp_pairs) refuses or does not run as llmplan priced them. Source: NVIDIA/Megatron-LM@d98e8a6
    megatron/training/arguments.py validate_args (under --use-megatron-fsdp: `assert
    os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS') != "1"`; its
    `assert args.optimizer in ('sgd', 'adam')` is check_plan's muon_zero rule, met before any export);
    megatron/core/distributed/fsdp/src/megatron_fsdp/
    megatron_fsdp.py (optim_grads forces overlap_grad_reduce on, optim_grads_params overlap_param_gather too; its
    backward hook reduces every backward,
    grad_reduce_every_bprop; param.overwrite_main_grad: each micro-batch's gradient written, not added, into the
    bucket); NVIDIA/TransformerEngine 64126aa8c (PR #1308, comm_gemm_overlap.cpp CommOverlapCore: with
    CUDA_DEVICE_MAX_CONNECTIONS > 1 an event launches the userbuffer communication ahead of its GEMM on compute
    capability 9 only; tests/pytorch/distributed/test_comm_gemm_overlap.py at d0067d0 runs the 8-connection case on
    Hopper only). Derived: docs/formulas.md#comm.dp (a pipeline's ZeRO-2 priced once per step; megatron_fsdp priced
    without a pipeline only); the last: a plan priced without Megatron-FSDP's memory
    (docs/formulas.md#mem.megatron_fsdp),
    so that price and export agree."""
    p, gpu = pf.plan, pf.cluster.system.gpu.name
    on = p.zero >= 2
    z2 = (f"ZeRO-{p.zero} (Megatron-FSDP {FSDP_STRATEGY[p.zero]})" if on else "ZeRO-2 (Megatron-FSDP optim_grads)")
    lower = "--zero 1" if p.zero == 2 else "--zero 2 or 1"
    return {
        "pipeline": (f"{z2} under a pipeline (PP {p.pp}): " + (
            "llmplan prices its gradients reduced once per step and Megatron-FSDP reduce-scatters them after every "
            "micro-batch's backward" if p.zero == 2 else "llmplan prices Megatron-FSDP (megatron_fsdp) only "
            "without a pipeline: its ZeRO-3 under one is DeepSpeed's / FSDP's"), on and p.pp > 1,
         "re-plan with --zero 1, or with --pp 1"),  # ZeRO-2 under a pipeline is refused alike
        "no_overlap": (f"{z2} without the overlapped gradient reduction (Megatron-FSDP turns it on for sharded "
         "gradients)", on and not p.overlap_grad_reduce, f"re-plan with --overlap-grad-reduce, or {lower}"),
        "no_gather_overlap": (f"{z2} without the overlapped weight gather (Megatron-FSDP turns it on for sharded "
         "weights)", p.zero == 3 and not p.overlap_param_gather,
         "re-plan with --overlap-param-gather, or --zero 2 or 1"),
        # Megatron-FSDP HSDP is written (fsdp_pairs); what its code rejects: the optimizer sharded across the
        # replicas without full sharding inside them (param_and_grad_buffer.py at d98e8a6 / cd4afffa6 raises
        # NotImplementedError; check_plan's dp_outer_optimizer rule refuses it first)
        "hybrid": (f"{z2} with the optimizer sharded across {p.dp_replicate} replicas (Megatron-FSDP raises "
         "\"[Megatron-FSDP] Optimizer fully-sharded HFSDP is only supported with full-sharding on DP-Shard.\")",
         on and p.dp_replicate > 1 and p.dp_outer_optimizer and p.zero != 3,
         "re-plan without --dp-outer-optimizer, or with --zero 3"),
        "grad_accumulation": (f"{z2} with grad_accumulation {p.grad_accumulation} (Megatron-FSDP writes each "
         "micro-batch's sharded gradient into its bucket: fused in the GEMM, or copied)",
         on and p.grad_accumulation in ("add", "cast-add"),
         f"re-plan with --grad-accumulation fused or copy, or {lower}"),
        "max_connections": (f"{z2} with CUDA_DEVICE_MAX_CONNECTIONS 1 (Megatron-LM asserts it is not 1 with "
         "--use-megatron-fsdp)",
         on and p.cuda_max_connections == 1, f"re-plan without --cuda-max-connections, or with {lower}"),
        "tp_userbuffers": (f"{z2} beside TP {p.tp}'s userbuffer overlap on {gpu} (Megatron-LM asserts "
         "CUDA_DEVICE_MAX_CONNECTIONS is not 1 with Megatron-FSDP, and Transformer Engine orders its TP overlap "
         "behind more than one queue only from Hopper on, compute capability 9)",
         on and tp_userbuffers_before_hopper(pf), f"re-plan with --no-tp-comm-overlap, or with {lower}"),
        "unpriced": (f"{z2} priced without megatron_fsdp (zero {p.zero}, megatron_fsdp {p.megatron_fsdp}: the "
         "plan's memory omits Megatron-FSDP's queue of unsharded gradient buckets" + (
             "" if p.zero == 2 else " and its prefetched units") + ", docs/formulas.md#mem.megatron_fsdp, so the run "
         "may hold more than priced)", on and not p.megatron_fsdp,
         "set \"megatron_fsdp\": true in the plan file's plan (estimate --plan FILE prices it so), or re-run the "
         "estimate or search that saved it with --megatron-fsdp (a search: or --target megatron / megatron-bridge)"
         + ("" if p.zero != 3 or pf.model.is_hybrid else ", or export to deepspeed / torchtitan (their ZeRO-3)")),
    }


def ep_overlap_on(pf: PlanFile) -> bool:
    """Whether the script runs Megatron-Core's EP overlap (--overlap-moe-expert-parallel-comm)."""
    return pf.model.is_moe and pf.plan.ep_comm_overlap and pf.plan.ep > 1


def connections_lines(pf: PlanFile) -> list[str]:
    """CUDA_DEVICE_MAX_CONNECTIONS for the script: the plan's cuda_max_connections where it gives one; else 1 with
    TP or CP > 1 (Megatron-LM asserts it before Blackwell), except under the EP overlap, which wants more than one
    queue (megatron/core/transformer/moe/README.md at core_v0.16.0: "CUDA_DEVICE_MAX_CONNECTIONS > 1"; arguments.py
    at core_v0.14.0 ... v0.16.0 only warns then, "1 or 32"): 32, the queues llmplan's overlap share was read at
    (cost.moe.overlap_queues); but 1 beside Transformer Engine's TP overlap before Blackwell
    (tp_userbuffers_before_blackwell), where cost.moe.overlap_queues prices the EP overlap at one queue. Under
    Megatron-FSDP (ZeRO-2 / 3), which asserts it is not 1: 32 under the EP overlap, else unset."""
    p = pf.plan
    if p.cuda_max_connections is not None:
        return [f"export CUDA_DEVICE_MAX_CONNECTIONS={p.cuda_max_connections}   # the plan's cuda_max_connections"]
    if p.zero >= 2:  # Megatron-FSDP asserts it is not 1 (fsdp_zero2_refusals); with TP / CP Megatron-LM only warns
        return (["export CUDA_DEVICE_MAX_CONNECTIONS=32   # the EP overlap's streams; Megatron-FSDP: not 1"]
                if ep_overlap_on(pf) else
                [f"unset CUDA_DEVICE_MAX_CONNECTIONS   # Megatron-FSDP (ZeRO-{p.zero}) asserts it is not 1"])
    if ep_overlap_on(pf) and tp_userbuffers_before_blackwell(pf):
        return ["export CUDA_DEVICE_MAX_CONNECTIONS=1   # TE's TP overlap before Blackwell; the EP overlap priced "
                "at one queue (docs/formulas.md#moe.overlap_queues)"]
    if ep_overlap_on(pf):
        return ["export CUDA_DEVICE_MAX_CONNECTIONS=32   # the EP overlap's streams side by side (Megatron-Core: > 1)"]
    if p.tp > 1 or p.cp > 1:
        return ["export CUDA_DEVICE_MAX_CONNECTIONS=1   # Megatron-LM expects it with TP/CP before Blackwell"]
    return []


def connections_refusal(pf: PlanFile) -> tuple[str, bool, str]:
    """(what, whether the plan needs it, fix) for a queue count Megatron-LM refuses: more than one with TP or CP > 1
    on a GPU before Blackwell (compute capability < 10) without the EP overlap (megatron/training/arguments.py
    validate_args at core_v0.14.0 ... v0.16.0: `assert os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS') == "1"`)."""
    p, cc = pf.plan, pf.cluster.system.gpu.compute_capability
    n = p.cuda_max_connections
    bad = (n is not None and n > 1 and (p.tp > 1 or p.cp > 1) and cc is not None and cc < 10
           and not ep_overlap_on(pf) and p.zero < 2)  # under Megatron-FSDP (ZeRO-2 / 3) it only warns
    return (f"CUDA_DEVICE_MAX_CONNECTIONS {n} with TP {p.tp} / CP {p.cp} on {pf.cluster.system.gpu.name} (Megatron-LM "
            "asserts 1 with TP or CP > 1 before Blackwell unless the EP overlap runs)", bad,
            "re-plan with --cuda-max-connections 1 (or leave it unset)")


def tp_userbuffers_before_blackwell(pf: PlanFile) -> bool:
    """Whether the script runs Transformer Engine's userbuffer TP overlap (--tp-comm-overlap: TP > 1 with SP) on a
    GPU before Blackwell (compute capability < 10), where it wants CUDA_DEVICE_MAX_CONNECTIONS=1: the predicate
    cost.moe.overlap_queues prices the one queue by (cost.runtime_memory.userbuffers_on)."""
    cc = pf.cluster.system.gpu.compute_capability
    return bool(userbuffers_on(pf.plan)) and cc is not None and cc < 10


def tp_userbuffers_before_hopper(pf: PlanFile) -> bool:
    """Whether the script runs Transformer Engine's userbuffer TP overlap on a GPU before Hopper (compute capability
    < 9), where TE orders its communication kernels ahead of the GEMMs only with one CUDA work queue
    (TransformerEngine 64126aa8c, PR #1308: the launch-order event is created for compute capability 9 only;
    Blackwell needs neither, Megatron-LM arguments.py at d98e8a6)."""
    cc = pf.cluster.system.gpu.compute_capability
    return bool(userbuffers_on(pf.plan)) and cc is not None and cc < 9


def tp_overlap_queues_refusal(pf: PlanFile) -> tuple[str, bool, str]:
    """(what, whether the plan needs it, fix) for a cuda_max_connections above 1 beside Transformer Engine's
    userbuffer TP overlap before Blackwell (tp_userbuffers_before_blackwell). TE's TP overlap there wants one queue
    (with more, its communication kernels may be scheduled behind the GEMMs they should overlap: Megatron-Bridge
    v0.1.0rc4 training/comm_overlap.py; Megatron-LM arguments.py at core_v0.14.0 ... v0.16.0 warns under the EP
    overlap to choose 1 or 32 by the overlap to favour), and llmplan prices the TP overlap the same at any queue
    count: the script would not run what was priced. Unset, the export writes 1 there and llmplan prices the EP
    overlap at one queue (cost.moe.overlap_queues, docs/formulas.md#moe.overlap_queues)."""
    p, n = pf.plan, pf.plan.cuda_max_connections
    # under Megatron-FSDP (ZeRO-2 / 3) the queues are more than one anyway: fsdp_zero2_refusals' tp_userbuffers
    bad = n is not None and n > 1 and tp_userbuffers_before_blackwell(pf) and p.zero < 2
    return (f"CUDA_DEVICE_MAX_CONNECTIONS {n} beside TP {p.tp}'s userbuffer overlap on {pf.cluster.system.gpu.name} "
            "(Transformer Engine's TP overlap before Blackwell needs 1 queue; llmplan prices it as if it had it)", bad,
            "re-plan with --cuda-max-connections 1 (or unset: favours the TP overlap, the EP overlap priced at one "
            "queue, docs/formulas.md#moe.overlap_queues), or with --no-tp-comm-overlap (then 32 favours the EP "
            "overlap)")


MANUAL_GC_INTERVAL = 100
"""Training steps between the collections of Python's garbage collector that --manual-gc runs on every rank at
once (the automatic, threshold-triggered collector off; Megatron-LM@d98e8a6 megatron/training/training.py:
gc.disable() before the loop, gc.collect() every manual_gc_interval steps). 100 as NVIDIA-NeMo/Megatron-Bridge's
pretrain recipes set it (src/megatron/bridge/recipes/common.py _pretrain_common at 6124fbe) and as Megatron-LM's
MoE guide names it against CPU jitter (megatron/core/transformer/moe/README.md at d98e8a6); 0 would never collect
during training, and unaligned collections are what --manual-gc exists to avoid."""


def data_loader_flags(pf: PlanFile) -> list[str]:
    """The data loader's dense causal mask left out where the plan's attention never reads it: Megatron-LM's dataset
    hands a [1, s, s] mask with every sample unless --no-create-attention-mask-in-dataloader
    (megatron/core/datasets/gpt_dataset.py create_attention_mask, True by default), which the loader stacks and pins
    per micro-batch and get_batch copies to the GPU and broadcasts over TP (pretrain_gpt.py, megatron/core/utils.py
    get_batch_on_this_tp_rank at d98e8a6), none of it priced. Transformer Engine's and flash-attn's causal kernels
    ignore it. The unfused path keeps it: Megatron-Core's torch softmax (FusedScaleMaskSoftmax.forward_torch_softmax,
    where the fused kernel's checks fail, e.g. s > 4096) would otherwise build a new s x s mask on the GPU in every
    layer (get_default_causal_mask)."""
    return ["--no-create-attention-mask-in-dataloader"] if pf.plan.flash_attention else []


def script_body(pf: PlanFile, launcher: str) -> str:
    """The shared body: node/rendezvous variables, argument arrays; `launcher` is the command that runs."""
    p = pf.plan
    model, pattern_lines = pattern_variable(model_flags(pf))  # a hybrid's pattern, built 56 symbols a line
    arrays = {"MODEL_ARGS": model, "PARALLEL_ARGS": parallel_flags(pf)}
    data = " ".join(["--mock-data --tokenizer-type NullTokenizer", f"--vocab-size {pf.model.vocab_size}",
                     *data_loader_flags(pf)])
    lines = [
        *rendezvous_lines(pf),
        "MEGATRON_LM=${MEGATRON_LM:-/workspace/Megatron-LM}",
        f"DATA_ARGS=({data})"
        '   # real data: --data-path "$DATA_PATH" --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$TOKENIZER"',
        # Python's garbage collection at the same step on every rank (MANUAL_GC_INTERVAL), as NVIDIA's examples run
        "TRAIN_ARGS=(--train-iters ${TRAIN_ITERS:-1000} --lr 3.0e-4 --min-lr 3.0e-5 --lr-decay-style cosine "
        f"--weight-decay 0.1 --clip-grad 1.0 --log-interval 10 --manual-gc --manual-gc-interval {MANUAL_GC_INTERVAL})",
    ]
    lines += connections_lines(pf)
    if p.fine_grained_offload_modules:  # megatron/training/arguments.py (2a75ac12c): required with TE >= 2.10
        lines.append("export NVTE_CPU_OFFLOAD_V1=1   # fine-grained activation offload: offload activations only")
    lines += pattern_lines
    for name, flags in arrays.items():
        lines.append(f"{name}=(")
        lines += [f"    {f}" for f in flags]
        lines.append(")")
    lines += ["", launcher]
    return "\n".join(lines) + "\n"


MEGATRON_ENTRY = ('"$MEGATRON_LM/pretrain_gpt.py" "${MODEL_ARGS[@]}" "${PARALLEL_ARGS[@]}" '
                  '"${TRAIN_ARGS[@]}" "${DATA_ARGS[@]}"')


def grad_nan_notes(pf: PlanFile) -> tuple[str, ...]:
    """The header note of a plan priced without Megatron-LM's gradient NaN check (grad_nan_check false, the
    default): the launch keeps Megatron's check on, a safety net a planner should not switch off unasked, and
    runs its one read of the gradient buffer per step more than priced (docs/formulas.md#step.grad_buffer)."""
    p = pf.plan
    if p.grad_nan_check or p.cuda_graphs == "full-iteration":
        return ()
    return ("note: Megatron-LM's gradient NaN check stays on (its default): one read of the fp32 gradient "
            "buffer per step that this plan was priced without; set grad_nan_check: true in the plan file to "
            "price it, or add --no-check-for-nan-in-loss-and-grad to skip it",)


def mla_tp_overlap_notes(pf: PlanFile) -> tuple[str, ...]:
    """The header note of an MLA plan with TP overlap: Megatron-Core turns it off at the first MLA linear
    (cost.runtime_memory.mla_turns_tp_overlap_off), so the flag only allocates the userbuffers; the plan was
    priced that way (docs/formulas.md#step.mla_tp_overlap)."""
    p = pf.plan
    if not (mla_turns_tp_overlap_off(pf.model, p) and p.sp and p.tp > 1):
        return ()
    return ("note: --tp-comm-overlap does not overlap this MLA model's TP collectives: Megatron-Core turns it off "
            "at the first MLA linear (TELinear: userbuffer name q_down_proj / q_proj is not qkv, proj, fc1 or "
            "fc2), leaving only the userbuffers' memory, and the step was priced without the overlap; drop "
            "--tp-comm-overlap (and re-plan with --no-tp-comm-overlap) to free that memory",)


def ub_margin_notes(pf: PlanFile) -> tuple[str, ...]:
    """The header note of a plan priced with TP communication overlap at the published userbuffer configs'
    SM margins (tp_overlap_margin_sms unset): --tp-comm-overlap without --tp-comm-overlap-cfg runs Transformer
    Engine 2.x's defaults, which also run the bulk overlaps' GEMMs on 16 SMs fewer
    (docs/formulas.md#step.ub_margin)."""
    p = pf.plan
    if not tp_overlap_asked(p) or p.tp_overlap_margin_sms is not None \
            or mla_turns_tp_overlap_off(pf.model, p):  # no userbuffer GEMMs run (mla_tp_overlap_notes)
        return ()
    fp8 = ("; the forward reduce-scatters as their fp8 configs run them (proj_fprop / fc2_fprop a 1-SM ring "
           "exchange, where Transformer Engine's default is a 16-SM pipeline)" if p.tp_overlap_sms is None
           and p.dtype in ("fp8", "fp4") else "")  # cost.comm.tp_role_sms, docs/formulas.md#step.ub_low_precision
    return ("note: priced with the SM margins of NVIDIA's published userbuffer configs (set_sm_margin on "
            f"proj_fprop / fc2_fprop only{fp8}); without --tp-comm-overlap-cfg Transformer Engine 2.x also runs "
            "the bulk overlaps' GEMMs on 16 SMs fewer: pass a config with set_sm_margin false on the bulk methods, "
            "or set tp_overlap_margin_sms: [0, 16, 16, 16] in the plan file to price the defaults",)


def ub_config_notes(pf: PlanFile) -> tuple[str, ...]:
    """The header note of a plan priced at userbuffer SMs or SM margins of its own (tp_overlap_sms,
    tp_overlap_margin_sms away from what the script runs): it passes no --tp-comm-overlap-cfg, so Transformer
    Engine 2.x runs initialize_ub's defaults (cost.comm.TE_UB_SMS, te_default_margin_sms;
    docs/formulas.md#step.ub_sms, #step.ub_margin)."""
    p = pf.plan
    if not tp_overlap_asked(p) or mla_turns_tp_overlap_off(pf.model, p):
        return ()
    if p.tp_overlap_sms in (None, TE_UB_SMS) and p.tp_overlap_margin_sms in (None, te_default_margin_sms()):
        return ()
    return ("note: priced with the plan's own userbuffer SMs (tp_overlap_sms / tp_overlap_margin_sms); the script "
            "passes no --tp-comm-overlap-cfg, so Transformer Engine runs its defaults: add the userbuffer config "
            "they come from with --tp-comm-overlap-cfg, or set tp_overlap_sms: null and tp_overlap_margin_sms: "
            "[0, 16, 16, 16] in the plan file to price the defaults",)


def entry_script(pf: PlanFile) -> str:
    """Megatron-LM's training script for the model: pretrain_hybrid.py for a hybrid stack, else pretrain_gpt.py."""
    return "pretrain_hybrid.py" if pf.model.is_hybrid else "pretrain_gpt.py"


def entry_command(pf: PlanFile) -> str:
    """MEGATRON_ENTRY with the model's training script."""
    return MEGATRON_ENTRY.replace("pretrain_gpt.py", entry_script(pf))


def render(pf: PlanFile) -> dict[str, str]:
    check(pf)
    entry = entry_script(pf)
    launcher = ("torchrun --nproc-per-node \"$GPUS_PER_NODE\" --nnodes \"$NNODES\" --node-rank \"$NODE_RANK\" "
                "--master-addr \"$MASTER_ADDR\" --master-port \"$MASTER_PORT\" \\\n    " + entry_command(pf))
    header = sh_header(pf, f"Megatron-LM {entry} (flags of main d98e8a6, 2026-08, after core_v0.19.0)",
                       megatron_expert_notes(pf) + balance_notes(pf) + grad_nan_notes(pf) + ub_margin_notes(pf)
                       + ub_config_notes(pf) + mla_tp_overlap_notes(pf)
                       + pp_sync_notes(pf, "Megatron-LM"))
    return {"megatron_pretrain.sh": header + script_body(pf, launcher), **companion_files(pf)}


def companion_files(pf: PlanFile) -> dict[str, str]:
    """The files the script's flags read beside it: the --te-precision-config-file YAML for bf16_modules and
    mxfp8_modules."""
    return {TE_PRECISION_FILE: te_precision_config(pf)} if pf.plan.bf16_modules or pf.plan.mxfp8_modules else {}
