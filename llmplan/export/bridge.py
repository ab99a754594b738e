"""Megatron-Bridge: its library pretrain recipe for the model, run by `scripts/training/run_recipe.py` with the
plan as trailing KEY=VALUE ConfigContainer overrides (Hydra override syntax, applied to the recipe's
ConfigContainer in OmegaConf struct mode: megatron/bridge/training/utils/omegaconf_utils.py).

Megatron-Bridge 0.6.2 (PyPI; scripts from its r0.6.0 branch, 6124fbe). tests/test_export_bridge.py checks every
override key against the fields recorded by tools/bridge_fields.py (tests/data/launchers/megatron-bridge.json).
The recipe builds the model from its Hugging Face config (AutoBridge), so the overrides carry the plan only;
a model with no recipe is refused (the run_recipe.py CLI takes a recipe or a recipe stem, not a model id)."""

from __future__ import annotations

from typing import Any

import numpy as np

from llmplan.cost.params import stage_layer_list
from llmplan.cost.model_states import grad_prescaled
from llmplan.cost.muon import MUON_NS_STEPS
from llmplan.cost.sparse_gather import fused_csa_priced, indexer_loss
from llmplan.export.common import unfused_loss_refusal
from llmplan.export.common import (cast_add_refusal, check_ep_overlap, delayed_bf16_layers_refusal,
                                   kept_grad_shards_refusal, fp32_embedding_grads_refusal, whole_embedding_refusal,
                                   launcher_schedule, megatron_expert_notes, megatron_expert_refusals, megatron_layout,
                                   pp_sync_notes, need_mode, op_fuser, op_fuser_blocked, refuse, refuse_first,
                                   rendezvous_lines,
                                   sh_header, squared_relu, tp_refusals, norm_kernel_refusals, softmax_kernel_refusals,
                                   parallel_block_refusal, torch_ring_refusal, fused_expert_bias_refusal)
from llmplan.export.bridge_precision import written_out
from llmplan.export.megatron import (FSDP_STRATEGY, MANUAL_GC_INTERVAL, outer_dp_strategy, balance_pairs,
                                     fsdp_zero2_refusals, graphed_modules, rank_capacity,
                                     precision_aware)
from llmplan.planfile import PlanFile
from llmplan.specs.quantities import bf16_layer_counts

TARGET = "megatron-bridge"
VERSION = "0.6.2"

RECIPES: dict[str, str] = {
    "llama-2-7b": "llama2_7b_pretrain_config",          # meta-llama/Llama-2-7b-hf
    "llama-3.1-8b": "llama31_8b_pretrain_config",       # meta-llama/Meta-Llama-3.1-8B
    "llama-3.1-70b": "llama31_70b_pretrain_config",     # meta-llama/Meta-Llama-3.1-70B
    "llama-3.1-405b": "llama31_405b_pretrain_config",   # meta-llama/Meta-Llama-3.1-405B
    "qwen2.5-72b": "qwen25_72b_pretrain_config",        # Qwen/Qwen2.5-72B
    "qwen3-8b": "qwen3_8b_pretrain_config",             # Qwen/Qwen3-8B
    "qwen3-30b-a3b": "qwen3_30b_a3b_pretrain_config",   # Qwen/Qwen3-30B-A3B
    "qwen3-235b-a22b": "qwen3_235b_a22b_pretrain_config",  # Qwen/Qwen3-235B-A22B
    "deepseek-v3": "deepseek_v3_pretrain_config",       # deepseek-ai/DeepSeek-V3
    # moonshotai/Kimi-K2-Instruct (recipes/kimi/kimi_k2.py at 6124fbe, as at v0.6.0: the alias of the h100
    # kimi_k2_pretrain_512gpu_h100_bf16_config, which runs dist_muon over an all-reducing DDP)
    "kimi-k2": "kimi_k2_pretrain_config",
    "gpt-oss-20b": "gpt_oss_20b_pretrain_config",       # openai/gpt-oss-20b
    "gpt-oss-120b": "gpt_oss_120b_pretrain_config",     # openai/gpt-oss-120b
    "gpt3-175b": "gpt3_175b_pretrain_32gpu_h100_bf16_config",  # GPTModelProvider(96 layers, h 12288)
    # deepseek-ai/DeepSeek-V4-Flash and -Pro (recipes/deepseek/deepseek_v4.py at 6124fbe: the h100 32-GPU and
    # gb300 32-GPU bf16 recipes); their DSv4 attention and hyper-connections need Megatron-Core's dev branch
    "deepseek-v4-flash": "deepseek_v4_flash_pretrain_config",
    "deepseek-v4-pro": "deepseek_v4_pro_pretrain_config",
}
"""Built-in model -> Megatron-Bridge 0.6.2 library recipe (megatron.bridge.recipes, or its h100 module where
the package exports no short name; the model it builds)."""

PRESETS: dict[tuple[str, str], tuple[str, bool, bool]] = {
    ("bf16", ""): ("bf16_mixed", False, True),
    ("fp16", ""): ("fp16_mixed", False, False),
    ("fp8", "tensorwise"): ("bf16_with_fp8_current_scaling_mixed", True, True),
    ("fp8", "delayed"): ("bf16_with_fp8_delayed_scaling_mixed", True, True),
    ("fp8", "blockwise"): ("bf16_with_fp8_subchannel_scaling_mixed", False, True),
    ("fp8", "mxfp8"): ("bf16_with_mxfp8_mixed", True, True),
    ("fp4", "nvfp4"): ("bf16_with_nvfp4_mixed", True, True),
}
"""(dtype, recipe) -> (mixed-precision preset, weights kept in the low-precision format, gradients reduced in
fp32), as megatron/bridge/training/mixed_precision.py defines each preset (fp8_param_gather / fp4_param_gather,
grad_reduce_in_fp32; fp8 per-tensor keyed "tensorwise" under current scaling, "delayed" under delayed scaling:
ParallelPlan.fp8_scaling). The preset's values reach the model, optimizer and DDP configs at setup (it overwrites
their fields of the same name), so the plan must match them."""


PRESET_BF16_LAYERS: dict[str, tuple[int, int]] = {
    "bf16_with_fp8_current_scaling_mixed": (1, 1), "nemotron_h_bf16_with_fp8_current_scaling_mixed": (2, 2),
    "nemotron_3_super_bf16_with_nvfp4_mixed": (0, 14),
}
"""Transformer layers at the start / end each preset keeps in bf16 (first_last_layers_bf16 with
num_layers_at_start_in_bf16 / _end_in_bf16 in megatron/bridge/training/mixed_precision.py at 067f987d; the
presets not listed keep none)."""
ALTERNATE_PRESETS: dict[tuple[str, str, int, int], str] = {
    ("fp8", "tensorwise", 2, 2): "nemotron_h_bf16_with_fp8_current_scaling_mixed",
    ("fp4", "nvfp4", 0, 14): "nemotron_3_super_bf16_with_nvfp4_mixed",
}
"""(dtype, recipe, bf16 layers at the start, at the end) -> the preset that keeps those layers in bf16 where the
base preset of PRESETS keeps others (same weights and gradient settings)."""


def preset_key(p: Any) -> tuple[str, str]:
    """The plan's key of PRESETS: (dtype, recipe), fp8 per-tensor keyed "delayed" under delayed scaling."""
    key = (p.dtype, p.recipe if p.dtype in ("fp8", "fp4") else "")
    return ("fp8", "delayed") if key == ("fp8", "tensorwise") and p.fp8_scaling == "delayed" else key


def preset_refusal(p: Any) -> tuple[str, bool, str]:
    """(what, whether the plan breaks it, fix) for the plan's precision against Megatron-Bridge's presets: no
    preset for it, or weights other than its preset sets. The workload's fields alone: refused whatever else the
    plan sets (export.EVERY_PLAN). A gradient reduction other than the preset's is not refused: reduction_overrides
    writes the preset out with the plan's grad_reduce_in_fp32."""
    key = preset_key(p)
    if key not in PRESETS:
        what = "fp32 training" if p.dtype == "fp32" else f"{p.dtype} {p.recipe} scaling"
        return (f"{what} (Megatron-Bridge's mixed-precision presets: bf16, fp16, fp8 tensorwise, blockwise, mxfp8, "
                "nvfp4)", True, "re-plan with --precision bf16 or fp8-tensorwise, or export to torchtitan")
    name, low_weights, _ = PRESETS[key]
    if p.dtype in ("fp8", "fp4") and p.fp8_params != low_weights and not (low_weights and p.optimizer == "muon"):
        flag = "--fp8-params" if low_weights else "--no-fp8-params"
        return (f"{p.dtype} {p.recipe} with weights {'not ' if low_weights else ''}kept in {p.dtype} (its preset "
                f"{name} sets {p.dtype}_param_gather {str(low_weights).lower()})", True, f"re-plan with {flag}")
    # a gradient reduction other than the preset's is written out (reduction_overrides), not refused
    return (f"{p.dtype} precision (its preset {name})", False, "")


def preset(pf: PlanFile) -> str:
    p = pf.plan
    refuse_first(TARGET, [preset_refusal(p)])
    counts = bf16_layer_counts(p, pf.model.num_hidden_layers)
    refuse_first(TARGET, (delayed_bf16_layers_refusal(p), preset_layers_refusal(p, counts)))
    return preset_layers(p, counts)[0]


def preset_layers(p: Any, counts: tuple[int, int]) -> tuple[str, tuple[int, int]]:
    """(the preset of a plan keeping `counts` layers in bf16 at the start / end, the layers that preset keeps)."""
    key = preset_key(p)
    name = ALTERNATE_PRESETS.get((*key, *counts), PRESETS[key][0])
    return name, PRESET_BF16_LAYERS.get(name, (0, 0))


def preset_layers_refusal(p: Any, counts: tuple[int, int] | None = None) -> tuple[str, bool, str]:
    """(what, whether the plan breaks it, fix) for a plan keeping other layers in bf16 than its preset (a preset
    name takes no per-field override); `counts`: the layers the plan keeps (bf16_layer_counts on the model). None,
    export.EVERY_PLAN's rule: under an fp8 recipe the counts are the workload's own (they read no pipeline
    degree: bf16_layer_counts), so that the rule refuses whatever else the plan sets; under NVFP4 its default
    follows the plan's pp, and the rule says nothing (the check, with the counts, refuses)."""
    if counts is None:
        if p.dtype != "fp8" or preset_key(p) not in PRESETS:
            return "", False, ""
        counts = bf16_layer_counts(p, 0)  # fp8: the pinned counts, whatever the number of layers
    low = p.dtype in ("fp8", "fp4") and preset_key(p) in PRESETS
    name, kept = preset_layers(p, counts) if low else ("", (0, 0))
    return (f"{counts[0]} / {counts[1]} layers kept in bf16 at the start / end with {p.dtype} {p.recipe} (its "
            f"preset {name} keeps {kept[0]} / {kept[1]}; a preset name takes no per-field override)",
            low and tuple(counts) != kept,
            f"re-plan with --bf16-layers-start {kept[0]} --bf16-layers-end {kept[1]}, or export to megatron "
            "(--num-layers-at-start-in-bf16 / --num-layers-at-end-in-bf16)")


def muon_weight_gather_off(pf: PlanFile) -> list[tuple[str, object]]:
    """The preset fields that turn its low-precision weight gather off under Muon, whose plan keeps bf16 weights
    (check_plan's muon_fp8_params keeps fp8_params off): as Megatron-Bridge's Kimi-K2 configs do for MXFP8
    (scripts/performance/configs/kimi/kimi_llm_pretrain.py v0.3.1 - v0.5.0: fp8_param_gather and
    reuse_grad_buf_for_mxfp8_param_ag False under dist_muon), and the fp8 / fp4 weight gather of the other presets
    that set it (MixedPrecisionConfig.fp8_param_gather, fp4_param_gather: training/mixed_precision.py at v0.6.0).
    None under adam or a preset that keeps bf16 weights."""
    p = pf.plan
    if p.optimizer != "muon" or p.dtype not in ("fp8", "fp4"):
        return []
    key = ("fp8", "delayed") if (p.recipe, p.fp8_scaling) == ("tensorwise", "delayed") else (p.dtype, p.recipe)
    if not PRESETS.get(key, ("", False, False))[1]:
        return []
    out: list[tuple[str, object]] = [(f"mixed_precision.{p.dtype}_param_gather", False)]
    if p.recipe == "mxfp8":
        out.append(("mixed_precision.reuse_grad_buf_for_mxfp8_param_ag", False))
    return out


MUON_RECIPES = frozenset({"kimi-k2"})
"""Models whose recipe sets the Muon optimizer (recipes/kimi/h100/kimi_k2.py at 6124fbe, _apply_kimi_k2_optimizer:
distributed_muon_with_cosine_annealing, optimizer "dist_muon"); the others keep OptimizerConfig's adam."""


def muon_overrides(pf: PlanFile) -> list[tuple[str, object]]:
    """The Muon optimizer as Megatron-Bridge's distributed_muon_with_cosine_annealing writes it (recipes/utils/
    optimizer_utils.py v0.3.1 - v0.6.0): dist_muon (Megatron's layer-wise distributed optimizer) with zero 1, muon
    with zero 0; 5 Newton-Schulz steps, blockwise TP mode, bf16 Newton-Schulz GEMMs (fp32_matmul_prec medium), AdamW
    for the rest; the DDP all-reduces (kimi_k2.py: use_distributed_optimizer False, "Muon needs this to be False").
    Under adam only the optimizer's name, where the recipe sets Muon (MUON_RECIPES), so that the plan's AdamW runs."""
    p = pf.plan
    if p.optimizer != "muon":
        return [("optimizer.optimizer", "adam")] if pf.model.name in MUON_RECIPES else []
    out: list[tuple[str, object]] = [
        ("optimizer.optimizer", "dist_muon" if p.zero == 1 else "muon"), ("optimizer.muon_num_ns_steps", MUON_NS_STEPS),
        ("optimizer.muon_tp_mode", "blockwise"), ("optimizer.muon_fp32_matmul_prec", "medium"),
        ("optimizer.muon_scalar_optimizer", "adam")]
    return out + muon_weight_gather_off(pf)


def attention_kernel_refusal(p: Any) -> tuple[str, bool, str]:
    """An attention kernel other than native flash, refused whatever else the plan sets (export.EVERY_PLAN)."""
    return (f"the {p.attention_kernel if p.flash_attention else 'unfused'} attention kernel (model.attention_backend "
            "holds an AttnBackend enum, which a KEY=VALUE override would set as text)",
            not p.flash_attention or p.attention_kernel != "native",
            "re-plan with --flash-attention --attention-kernel native, or export to megatron")


def master_dtype_refusal(p: Any) -> tuple[str, bool, str]:
    """A bf16 master or none, refused whatever else the plan sets (export.EVERY_PLAN)."""
    return (f"optimizer master weights {p.optimizer_master_dtype} (Megatron-Core's main_params_dtype is float32 "
            "or float16)", p.optimizer_master_dtype in ("bf16", "none"),
            "re-plan with --optimizer-master-dtype fp32 or fp16, or export to megatron")


def fp8_moments_refusal(p: Any) -> tuple[str, bool, str]:
    """fp8 Adam moments, refused whatever else the plan sets (export.EVERY_PLAN)."""
    return ("fp8 Adam moments (OptimizerConfig.exp_avg_dtype holds a torch dtype, which a KEY=VALUE override "
            "would set as text; Megatron-LM's --exp-avg-dtype fp8 maps it to uint8)", p.optimizer_moment_dtype == "fp8",
            "export to megatron")


GRAPH_SOURCE = ("NVIDIA-NeMo/Megatron-Bridge r0.6.0 (6124fbe): scripts/performance/utils/overrides.py "
                "_set_cuda_graph_overrides, src/megatron/bridge/utils/cuda_graph.py, training/config.py")
"""Where the CUDA-graph overrides are read (cuda_graph_overrides), on the TransformerConfig of the Megatron-LM
commit that branch pins (cd4afffa6)."""


def cuda_graph_overrides(pf: PlanFile) -> list[tuple[str, object]]:
    """The plan's CUDA graphs as Megatron-Bridge's performance scripts write them (GRAPH_SOURCE): cuda_graph_impl,
    the per-layer modules in cuda_graph_modules with the deprecated cuda_graph_scope null (set_cuda_graph_modules;
    the library recipes set the scope, which TransformerConfig refuses beside modules), and Transformer Engine's
    RNG tracker (ConfigContainer syncs rng.te_rng_tracker to it). layers: transformer_engine graphs of the modules
    the Megatron-LM export graphs (megatron.graphed_modules); full-iteration: one graph (set_full_iteration_cuda_graph:
    no modules), the loss NaN check off (ConfigContainer.validate asserts it), and, for a dropless MoE layer, the
    static per-rank budget and paged stash the plan prices (budget_overrides). Megatron-FSDP's graph-safe mode and,
    under one graph, no gather in start_param_sync: Megatron-LM's training.py sets both at cd4afffa6, Bridge's GB300
    DeepSeek-V3 preset writes them. none: cuda_graph_impl none over a recipe's own (qwen3_30b_a3b_pretrain_config
    graphs moe_router and moe_preprocess: recipes/qwen/h100/qwen3_moe.py at 6124fbe), with its TE RNG tracker off."""
    p = pf.plan
    if p.cuda_graphs == "none":  # and the recipe's TE RNG tracker off, both fields: ConfigContainer turns both on
        # if either is (training/config.py at 6124fbe); the tracker is priced nowhere
        return [("model.cuda_graph_impl", "none"), ("model.use_te_rng_tracker", False), ("rng.te_rng_tracker", False)]
    full = p.cuda_graphs == "full-iteration"
    modules = () if full else graphed_modules(pf)
    out: list[tuple[str, object]] = [
        ("model.cuda_graph_impl", "full_iteration" if full else "transformer_engine"),
        ("model.cuda_graph_modules", "[" + ",".join(modules) + "]"), ("model.cuda_graph_scope", None),
        ("model.use_te_rng_tracker", True)]
    if p.zero >= 2:
        out.append(("ddp.megatron_fsdp_cuda_graph_mode", True))
    if not full:
        return out
    out.append(("rerun_state_machine.check_for_nan_in_loss", False))
    if p.zero >= 2:
        out.append(("ddp.fsdp_all_gather_in_start_param_sync", False))
    if p.fine_grained_offload_modules:  # the in-flight cap TransformerConfig asserts (megatron.offload_pairs)
        out.append(("model.fine_grained_offloading_max_inflight_offloads", 1))
    return out + budget_overrides(pf)


def budget_overrides(pf: PlanFile) -> list[tuple[str, object]]:
    """A dropless MoE layer's static per-rank budget under the full-iteration graph (megatron.rank_capacity, 1.5 as
    Bridge's DeepSeek perf presets set it: perf_recipes/deepseek/common.py at 6124fbe) and the paged stash of its
    saved tensors where the plan prices it (TransformerConfig moe_paged_stash and its device pool's factor)."""
    p = pf.plan
    if not (pf.model.is_moe and p.cuda_graphs == "full-iteration" and p.moe_capacity_factor is None):
        return []
    out: list[tuple[str, object]] = [("model.moe_expert_rank_capacity_factor", rank_capacity(p))]
    if p.moe_paged_stash is not None:
        out += [("model.moe_paged_stash", True), ("model.moe_paged_stash_buffer_size_factor_cuda", p.moe_paged_stash)]
    return out


def cuda_graphs_refusal(pf: PlanFile) -> tuple[str, bool, str]:
    """A full-iteration graph over dropless MoE layers whose experts the fused grouped MLP does not run: the
    static budget needs it at Megatron-Bridge 0.6's pin (TransformerConfig at cd4afffa6: moe_expert_rank_capacity_factor
    with hybridep requires use_transformer_engine_op_fuser; moe_use_grouped_tensor, the Megatron-LM export's path
    without it, came later, d98e8a6)."""
    p = pf.plan
    why = op_fuser_blocked(pf) or ("one GEMM per local expert: expert_gemm per-expert" if p.fused_kernels
                                   else "the plan's unfused kernels")
    return (f"cuda_graphs full-iteration over dropless MoE layers without Transformer Engine's fused grouped MLP "
            f"({why}): at Megatron-Bridge {VERSION}'s Megatron-Core (cd4afffa6) the static per-rank budget "
            "(moe_expert_rank_capacity_factor) with hybridep requires use_transformer_engine_op_fuser",
            bool(budget_overrides(pf)) and not op_fuser(pf),
            "export to megatron (moe_use_grouped_tensor, d98e8a6), or re-plan with --moe-capacity-factor or "
            "--train-cuda-graphs layers")


def _quant_recipe_refusal(what: str, modules: Any, flag: str) -> tuple[str, bool, str]:
    """Modules the plan runs at another precision (`what`), which Megatron-Bridge sets only through
    model.quant_recipe: (what, whether the plan lists any, fix: the Megatron-LM export, or re-plan without
    `flag`)."""
    return (f"{what} ({', '.join(modules)}: Megatron-Bridge sets them with model.quant_recipe, a RecipeConfig "
            "object that a KEY=VALUE override cannot hold)", bool(modules),
            f"export to megatron (--te-precision-config-file), or re-plan without {flag}")


def bf16_modules_refusal(p: Any) -> tuple[str, bool, str]:
    """Modules kept in bf16, refused whatever else the plan sets (export.EVERY_PLAN)."""
    return _quant_recipe_refusal("modules kept in bf16", p.bf16_modules, "--bf16-modules")


def mxfp8_modules_refusal(p: Any) -> tuple[str, bool, str]:
    """Modules run in MXFP8 under NVFP4, refused whatever else the plan sets (export.EVERY_PLAN)."""
    return _quant_recipe_refusal("modules run in MXFP8 under NVFP4", p.mxfp8_modules, "--mxfp8-modules")


def loss_impl_refusal(p: Any) -> tuple[str, Any, str]:
    """An unfused loss priced with another implementation's memory than this launcher runs (common.UNFUSED_LOSS_RUNS),
    refused whatever else the plan sets (export.EVERY_PLAN)."""
    return unfused_loss_refusal(p, TARGET)


def check(pf: PlanFile) -> None:
    """Refuse, with the rule and its fix, a plan Megatron-Bridge cannot run as priced: not a training plan, a
    hybrid stack, a model without a recipe, then the first of _layout_rules and _feature_rules the plan has."""
    need_mode(pf, "train", TARGET)
    m = pf.model
    if m.is_hybrid:
        # Megatron-Bridge r0.6.0 (6124fbe) has recipes for the Nemotron-3 models (recipes/nemotronh), built by
        # models/hybrid/hybrid_provider.py, whose hybrid_layer_pattern carries the pipeline split ('|') and the
        # MTP modules ('/'): overrides this export does not write (it splits a GPT stack's pipeline).
        raise refuse(TARGET, f"the hybrid layer stack of {m.name} (Megatron-Bridge {VERSION}'s hybrid provider "
                     "takes its pipeline split and MTP modules in hybrid_layer_pattern, which this export does "
                     "not override)", "export to megatron (pretrain_hybrid.py with --hybrid-layer-pattern)")
    if m.name not in RECIPES:
        raise refuse(TARGET, f"Megatron-Bridge {VERSION} has no pretrain recipe for {m.name} (recipes for "
                     f"{', '.join(sorted(RECIPES))})", "export to megatron")
    refuse_first(TARGET, _layout_rules(pf) + _feature_rules(pf))
    check_ep_overlap(pf, TARGET)  # check_plan's EP-overlap rules (common.EP_OVERLAP_RULES)
    preset(pf)


def _layout_rules(pf: PlanFile) -> list[tuple[str, bool, str]]:
    """(what, whether the plan has it, fix) for the parallel layout, schedule, kernels, recompute and routing
    that Megatron-Bridge does not run as priced; check refuses the first the plan has, these before
    _feature_rules."""
    p, m = pf.plan, pf.model
    return [
        ("1F1B pipeline transfers one at a time (pp_unbatched_sends: DeepSpeed's pipeline engine; Megatron-Core "
         "pairs each send with a receive in one exchange)", p.pp_unbatched_sends and p.pp > 1,
         "re-plan with --no-pp-unbatched-sends, or export to deepspeed"),
        *fsdp_zero2_rules(pf),
        ("fp32 gradients reduced in bf16 (grad_reduce_dtype bf16: DeepSpeed's BF16_Optimizer cast; Megatron-Core's "
         "DDP reduces its gradient buffer in place in the buffer's dtype, DistributedDataParallelConfig "
         "grad_reduce_in_fp32)", p.grad_reduce_dtype == "bf16",
         "re-plan with --grad-reduce-dtype grad_dtype (with --grad-dtype bf16 for gradients reduced in bf16), "
         "or export to deepspeed"),
        ("ZeRO-1 gradients all-reduced whole (grad_reduce all-reduce; Megatron-Core's distributed optimizer "
         "reduce-scatters them)", p.grad_reduce == "all-reduce" and p.zero == 1 and p.optimizer != "muon",
         "re-plan with --grad-reduce reduce-scatter"),
        ("Muon over reduce-scattered gradients (Megatron-Bridge's dist_muon recipes run the layer-wise optimizer "
         "over an all-reducing DDP, use_distributed_optimizer False)", p.optimizer == "muon" and p.zero == 1
         and p.grad_reduce == "reduce-scatter", "re-plan with --grad-reduce all-reduce, or export to megatron"),
        *tp_refusals(pf), *megatron_expert_refusals(pf), *norm_kernel_refusals(pf),
        # Megatron-Core's TE layer spec: TE's unfused attention, which this export refuses (attention_kernel_refusal)
        *softmax_kernel_refusals(pf, "te", "re-plan with --flash-attention --attention-kernel native, or export to "
                                 "megatron"),
        parallel_block_refusal(pf), torch_ring_refusal(pf), kept_grad_shards_refusal(pf),
        fp32_embedding_grads_refusal(pf), whole_embedding_refusal(pf),
        (f"the {p.pp_schedule} pipeline schedule (Megatron-Core runs 1F1B and interleaved 1F1B)",
         launcher_schedule("megatron-bridge", p.pp_schedule) is None, "re-plan with --pp-schedule 1f1b"),
        ("op-level selective checkpointing (torchtitan's per-op policy)", p.recompute == "op",
         "re-plan with --recompute selective or full, or export to torchtitan"),
        ("contiguous MoE routing (NeMo AutoModel's benchmark gate)", m.is_moe and p.moe_routing == "contiguous",
         "re-plan with --moe-routing random"),
    ]


def _feature_rules(pf: PlanFile) -> list[tuple[str, bool, str]]:
    """(what, whether the plan has it, fix) for the attention kernel, TP overlap, optimizer precision, CUDA graphs
    and context length that Megatron-Bridge's overrides cannot set as priced."""
    p, m = pf.plan, pf.model
    return [
        attention_kernel_refusal(p),
        fused_expert_bias_refusal(pf),
        # the EP overlap and delay_wgrad need no CommOverlapConfig: they are TransformerConfig fields (ep_overlap)
        ("TP communication overlap (Megatron-Bridge turns it on with a CommOverlapConfig object holding a "
         "userbuffers shape, tp_comm_overlap_cfg, which a KEY=VALUE override cannot build)",
         p.tp_comm_overlap and p.sp and p.tp > 1,
         "re-plan with --no-tp-comm-overlap, or export to megatron"),
        master_dtype_refusal(p),  # these two before zero 0's rule: no axis makes them export
        fp8_moments_refusal(p),
        ("the precision-aware optimizer (Adam states below fp32 or param_remainders) with zero 0 (Megatron-Core "
         "runs it only in the distributed optimizer)", precision_aware(p) and p.zero == 0, "re-plan with --zero 1"),
        bf16_modules_refusal(p),
        mxfp8_modules_refusal(p),
        loss_impl_refusal(p),
        # TP > 1 and core_attn recompute, which DSv4HybridAttention asserts against: check_plan (tp_dsv4,
        # recompute_core_attn_dsv4)
        cast_add_refusal(pf),
        cuda_graphs_refusal(pf),
        (f"a sequence of {p.seq_len} tokens past {m.name}'s max_position_embeddings ({m.max_position_embeddings}): "
         "the context extension's RoPE scaling, which this export does not write",
         p.seq_len > m.max_position_embeddings,
         "export to megatron (it writes YaRN), or re-plan with --seq-len at most max_position_embeddings"),
    ]


def ep_overlap(pf: PlanFile) -> list[tuple[str, object]]:
    """The EP all-to-all overlap (Megatron-Core's combined 1F1B) and its delayed weight gradients, as the
    TransformerConfig fields overlap_moe_expert_parallel_comm and delay_wgrad_compute, which Megatron-Bridge's
    performance presets turn on through comm_overlap (scripts/performance/utils/overrides.py v0.3.0 - v0.6.0,
    _set_moe_a2a_overlap_overrides: both True, model.moe_shared_expert_overlap False). Written on the model: the
    export sets comm_overlap null (CommOverlapConfig.setup would overwrite the plan's DDP bucket and overlap
    settings), a KEY=VALUE override cannot set a field of a null or absent comm_overlap (OmegaConf struct mode;
    the Qwen3 and GPT-OSS recipes leave it None), and with comm_overlap None the model's fields reach
    TransformerConfig unchanged. Off unless the plan prices them (ep > 1, delay_wgrad only under the overlap)."""
    p = pf.plan
    on = p.ep_comm_overlap and p.ep > 1
    out: list[tuple[str, object]] = [("model.overlap_moe_expert_parallel_comm", on),
                                     ("model.delay_wgrad_compute", on and p.delay_wgrad)]
    if on and p.moe_dispatcher != "deepep":  # Megatron-Core asserts it off (flex sets it off already)
        out.append(("model.moe_shared_expert_overlap", False))
    return out


TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
"""llmplan's optimizer state dtypes as the torch.dtype names Megatron-Core's OptimizerConfig holds."""


FSDP_SOURCE = "NVIDIA-NeMo/Megatron-Bridge v0.6.0 (51885cf1; r0.6.0 6124fbe)"
"""Where the Megatron-FSDP settings of the ZeRO-2 export are read: src/megatron/bridge/training/config.py
(ConfigContainer.validate -> _validate_and_apply_megatron_fsdp_configs) on the DistributedDataParallelConfig of
the Megatron-LM commit it pins (cd4afffa6)."""


def fsdp_overrides(pf: PlanFile) -> list[tuple[str, object]]:
    """ZeRO-2 / ZeRO-3 as Megatron-Bridge runs them: Megatron-FSDP's optim_grads / optim_grads_params through its DDP
    config (use_megatron_fsdp, data_parallel_sharding_strategy, megatron.FSDP_STRATEGY: the main weights and the
    gradients sharded, the model weights whole at ZeRO-2 and sharded at ZeRO-3; the Megatron-LM export's fsdp_pairs),
    the plan's master and gradient dtypes (Megatron-FSDP's main_grads_dtype None
    keeps the gradients in the weights' bf16), the checkpoint format Megatron-Bridge asserts when a run saves or
    loads, and, where the plan averages inside the collective (grad_prescale off), disable_symmetric_registration:
    Megatron-Bridge turns average_in_collective off under Megatron-FSDP unless it is set, and it acts only with
    nccl_ub, which the export leaves off. Source: FSDP_SOURCE. Nothing for other stages."""
    p = pf.plan
    if p.zero < 2:
        return []
    grads = "bfloat16" if p.grad_dtype == "bf16" and p.dtype != "fp32" else "float32"
    out: list[tuple[str, object]] = [
        ("ddp.data_parallel_sharding_strategy", FSDP_STRATEGY[p.zero]), ("checkpoint.ckpt_format", "fsdp_dtensor"),
        ("ddp.megatron_fsdp_main_params_dtype", TORCH_DTYPES[p.optimizer_master_dtype]),
        ("ddp.megatron_fsdp_main_grads_dtype", grads), ("ddp.megatron_fsdp_grad_comm_dtype", grads)]
    if p.dp_replicate > 1:  # Megatron-FSDP HSDP (model_overrides writes num_distributed_optimizer_instances):
        # DistributedDataParallelConfig.outer_dp_sharding_strategy, as perf_recipes/deepseek/gb300/deepseek_v3.py
        # deepseek_v3_pretrain_128gpu_gb300_fp8mx_hsdp_config sets it ("optim", 4 instances; FSDP_SOURCE)
        out.append(("ddp.outer_dp_sharding_strategy", outer_dp_strategy(p)))
    if not grad_prescaled(p):
        out.append(("ddp.disable_symmetric_registration", True))
    return out


def fsdp_zero2_rules(pf: PlanFile) -> list[tuple[str, bool, str]]:
    """(what, whether the plan has it, fix) for the ZeRO-2 / 3 plans that Megatron-FSDP's optim_grads /
    optim_grads_params under Megatron-Bridge (fsdp_overrides) refuses or does not run as priced: the Megatron-LM
    export's reasons (megatron.fsdp_zero2_refusals: a pipeline, no overlapped reduction or (ZeRO-3) weight gather,
    the optimizer sharded across replicas below ZeRO-3, an added gradient, a plan priced without megatron_fsdp), and
    CUDA_DEVICE_MAX_CONNECTIONS 1, which _validate_and_apply_megatron_fsdp_configs asserts against (FSDP_SOURCE;
    TE's TP overlap, which wants 1 before Blackwell, is refused on its own). Derived: docs/formulas.md#comm.dp"""
    p = pf.plan
    on = p.zero >= 2
    z2 = f"ZeRO-{p.zero} (Megatron-FSDP {FSDP_STRATEGY[p.zero]})" if on else "ZeRO-2"
    # Megatron-LM's rules Megatron-Bridge shares, by id (its own CUDA_DEVICE_MAX_CONNECTIONS rule below; the TP
    # userbuffer one is refused on its own)
    keep = ("pipeline", "no_overlap", "no_gather_overlap", "hybrid", "grad_accumulation", "unpriced")
    shared = fsdp_zero2_refusals(pf)
    return [
        *(shared[k] for k in keep),
        (f"{z2} with CUDA_DEVICE_MAX_CONNECTIONS 1 (Megatron-Bridge asserts it is not 1 under Megatron-FSDP)",
         on and p.cuda_max_connections == 1,
         "re-plan without --cuda-max-connections, or with " + ("--zero 1" if p.zero == 2 else "--zero 2 or 1")),
    ]


def router_overrides(pf: PlanFile) -> list[tuple[str, object]]:
    """The router as priced, over the recipe's own (the Qwen3-MoE and Kimi-K2 H100 recipes set moe_router_fusion
    False, the Qwen3-MoE bridge no router dtype, the gpt-oss bridge load balancing none, the DeepSeek-V4 bridge a
    coefficient 0: NVIDIA-NeMo/Megatron-Bridge@067f987 recipes/qwen/h100/qwen3_moe.py, recipes/kimi/h100/
    kimi_k2.py, models/qwen/qwen3_moe_bridge.py, models/gpt_oss/gpt_oss_bridge.py, models/deepseek/
    deepseek_v4_bridge.py): TransformerConfig's moe_router_fusion (plan.moe_router_fusion), moe_router_dtype fp32,
    and the load balancing of the Megatron-LM export (megatron.balance_pairs: the spec's coefficient and loss
    type, none at 0), each a model field of the ConfigContainer."""
    pairs = dict(balance_pairs(pf))
    coef = pairs.get("--moe-aux-loss-coeff")
    return [("model.moe_router_fusion", pf.plan.moe_router_fusion), ("model.moe_router_dtype", "fp32"),
            ("model.moe_router_padding_for_quantization", pf.plan.moe_router_padding),
            ("model.moe_router_load_balancing_type", pairs["--moe-router-load-balancing-type"]),
            ("model.moe_aux_loss_coeff", float(str(coef)) if coef is not None else 0.0)]


def overrides(pf: PlanFile) -> list[tuple[str, object]]:
    """(ConfigContainer key, value) for the plan: parallelism, stages, batch, length, recompute, MoE dispatch,
    DDP / optimizer and precision. The recipe's own settings for these are overwritten, not inherited."""
    p = pf.plan
    out = (parallel_overrides(pf) + (moe_overrides(pf) if pf.model.is_moe else []) + model_overrides(pf)
           + train_overrides(pf) + ddp_optimizer_overrides(pf))
    out += muon_overrides(pf)  # after the preset, whose low-precision weight gather it turns off
    if p.fp8_attention:  # MixedPrecisionConfig.fp8_dot_product_attention, after the preset that it amends
        out.append(("mixed_precision.fp8_dot_product_attention", True))
    if p.fp8_output_proj:  # GPTModelProvider (TransformerConfig).fp8_output_proj: a model field, not a preset's
        out.append(("model.fp8_output_proj", True))
    return reduction_overrides(pf, out)


def reduction_overrides(pf: PlanFile, out: list[tuple[str, object]]) -> list[tuple[str, object]]:
    """`out` as is where the plan reduces its gradients as its preset does (PRESETS: grad_reduce_in_fp32) and
    amends none of its fields; else the preset written out field by field with the plan's grad_reduce_in_fp32
    (bridge_precision.written_out: bf16 gradients under a bf16 / fp8 / fp4 preset, fp32 ones under fp16_mixed),
    the mixed_precision.* settings (muon_weight_gather_off, fp8 attention) folded in: after a preset's name,
    Hydra's struct mode refuses a mixed_precision.* key ("Could not override"), whether the recipe holds the
    name or a MixedPrecisionConfig."""
    p = pf.plan
    fp32 = p.grad_dtype == "fp32"
    amend = {k.split(".", 1)[1]: v for k, v in out if k.startswith("mixed_precision.")}
    if fp32 == PRESETS[preset_key(p)][2] and not amend:
        return out
    name = str(dict(out)["mixed_precision"])
    kept = [(k, v) for k, v in out if k != "mixed_precision" and not k.startswith("mixed_precision.")]
    return kept + written_out(name, {**amend, "grad_reduce_in_fp32": fp32})


def parallel_overrides(pf: PlanFile) -> list[tuple[str, object]]:
    """The parallel sizes, the stage layout (stage_overrides) and the context-parallel communication the plan
    priced, as model fields of the ConfigContainer."""
    p = pf.plan
    out: list[tuple[str, object]] = [
        ("model.tensor_model_parallel_size", p.tp), ("model.pipeline_model_parallel_size", p.pp),
        ("model.virtual_pipeline_model_parallel_size", p.vpp if p.vpp > 1 else None),
        ("model.context_parallel_size", p.cp), ("model.sequence_parallel", p.sp),
        *stage_overrides(pf),
    ]
    if p.cp > 1:  # the TE attention the plan priced (cp_impl te), over a recipe's own (gpt_oss and gemma3_vl set
        out.append(("model.cp_comm_type", p.cp_comm_type))  # a2a, glm5 allgather: Megatron-Bridge@067f987 recipes/)
    if p.cp > 1 and p.cp_comm_type == "a2a+p2p":  # its levels, a2a first (no recipe sets them: Megatron-Bridge@067f987
        # docs/fern/versions/0.4.2/pages/skills/perf-techniques/hybrid-context-parallel/SKILL.mdx:
        # cfg.model.hierarchical_context_parallel_sizes = [2, 2])
        out.append(("model.hierarchical_context_parallel_sizes", f"[{p.cp_a2a_size},{p.cp // p.cp_a2a_size}]"))
    return out


def moe_overrides(pf: PlanFile) -> list[tuple[str, object]]:
    """A MoE model's expert parallelism, token dispatcher, capacity, expert GEMM path, router (router_overrides)
    and EP overlap (ep_overlap), as model fields of the ConfigContainer."""
    p, m = pf.plan, pf.model
    flex = p.moe_dispatcher == "deepep"
    out: list[tuple[str, object]] = [
        ("model.expert_model_parallel_size", p.ep), ("model.expert_tensor_parallel_size", p.etp_resolved),
        ("model.moe_token_dispatcher_type", "flex" if flex else "alltoall"),
        ("model.moe_flex_dispatcher_backend", p.moe_flex_backend if flex else None),
        ("model.moe_expert_capacity_factor", p.moe_capacity_factor),
        ("model.moe_pad_expert_input_to_capacity", p.moe_capacity_factor is not None),
        # the experts' GEMM path the plan prices (common.op_fuser; its environment in the script)
        ("model.use_transformer_engine_op_fuser", op_fuser(pf)),
        *router_overrides(pf)]
    if op_fuser(pf) and squared_relu(m):  # the fused grouped MLP's squared-ReLU kernel (common.op_fuser)
        out.append(("model.use_fused_weighted_squared_relu", True))
    if flex:
        out.append(("model.moe_shared_expert_overlap", False))  # as apply_flex_dispatcher_backend sets it
    out += ep_overlap(pf)
    if flex and p.moe_dispatch_sms is not None:  # else the recipe's own (Megatron-Core: 20 for DeepEP)
        out.append(("model.moe_flex_dispatcher_num_sms", p.moe_dispatch_sms))
    return out


def dsa_overrides(pf: PlanFile) -> list[tuple[str, object]]:
    """DeepSeek-V4's fused CSA path where the plan prices it (cost.sparse_gather.fused_csa_priced: the sparse
    gather calls and the indexer-loss kernels, docs/formulas.md#compute.indexer_loss), as the 26.08 perf recipe
    sets it (Megatron-Bridge perf_recipes/deepseek/gb200/deepseek_v4.py at 6124fbe: apply_dsa_kernel_fusion True,
    dsa_indexer_loss_coeff 0.01, dsa_indexer_use_sparse_loss True) over the library recipes' unfused path
    (recipes/deepseek/h100/deepseek_v4.py and gb300/deepseek_v4.py: False, 0.0, False). apply_dsa_kernel_fusion
    is a TransformerConfig field of Megatron-Core's dev branch (1e23526adc; Optional[bool], mapped to
    dsa_kernel_backend "cudnn"), which the DSv4 recipes need and assign; the recorded cd4afff config lacks it.
    dsa_kernel_backend alone would not do: the recipes' apply_dsa_kernel_fusion False maps to "none" and
    TransformerConfig.__post_init__ raises on the conflict. Where the plan is priced on the dense kernel the
    recipe's unfused path stays. The indexer's training is written as the plan prices it
    (cost.sparse_gather.indexer_loss, docs/formulas.md#compute.indexer_training): dsa_indexer_loss_coeff 0.0 when
    off, else DSA_INDEXER_LOSS_COEFF; dsa_indexer_use_sparse_loss True for sparse and, at coefficient 0, on the
    fused path (its KL target then spans the k selected keys, as priced), False for dense."""
    p, m = pf.plan, pf.model
    if not m.compressed_layers or not m.is_sparse_attention:
        return []
    gpu = pf.cluster.system.gpu
    loss, fused = indexer_loss(m, p, gpu), fused_csa_priced(m, p, gpu)
    out: list[tuple[str, object]] = [("model.apply_dsa_kernel_fusion", True)] if fused else []
    return out + [("model.dsa_indexer_loss_coeff", 0.0 if loss == "off" else DSA_INDEXER_LOSS_COEFF),
                  ("model.dsa_indexer_use_sparse_loss", loss == "sparse" or (loss == "off" and fused))]


DSA_INDEXER_LOSS_COEFF = 0.01
"""The CSA indexer's KL-loss coefficient of Megatron-Bridge's DeepSeek-V4 perf recipes (perf_recipes/deepseek/
gb200/deepseek_v4.py at 6124fbe), which the fused path's indexer-loss kernels priced run under (they run only
at a coefficient above 0: csa.py at 1e23526adc)."""


def model_overrides(pf: PlanFile) -> list[tuple[str, object]]:
    """The model features the plan priced over the recipe's: MTP layers, the SwiGLU fp8 input, activation
    offloading, optimizer instances, gradient accumulation fusion, interleaved pipeline sends, RoPE fusion."""
    p, m = pf.plan, pf.model
    out: list[tuple[str, object]] = []
    if m.num_nextn_predict_layers:
        out.append(("model.mtp_num_layers", m.num_nextn_predict_layers))
        # one module's weights at every depth, as priced (cost.stages.mtp_weight_sets): GPTModelProvider's
        # TransformerConfig.mtp_use_repeated_layer (NVIDIA-NeMo/Megatron-Bridge@067f987 recipes/nemotronh/h100/
        # nemotron_3_super.py sets it with mtp_num_layers 2); False, Megatron-Core's default, builds one per
        # depth: written either way, since a recipe may set True itself
        out.append(("model.mtp_use_repeated_layer", bool(m.mtp_repeated_layer)))
    elif p.mtp_layers == 0:  # --mtp-layers 0 turns off a recipe's own MTP (deepseek_v3_pretrain_config sets 1:
        out.append(("model.mtp_num_layers", None))  # "Set to 0 or None to disable MTP")
    if p.swiglu_fp8_input:  # TransformerConfig.activation_func_fp8_input_store (Megatron-Core, SwiGLU only)
        out.append(("model.activation_func_fp8_input_store", True))
    # TransformerConfig.cpu_offloading / cpu_offloading_num_layers, as scripts/performance/utils/overrides.py
    # (_set_recompute_overrides) sets them for the Megatron-FSDP Llama presets (activations, not weights); the
    # recipes run_recipe.py builds leave them off
    if p.offload_layers:
        out += [("model.cpu_offloading", True), ("model.cpu_offloading_num_layers", p.offload_layers),
                ("model.cpu_offloading_weights", False)]
    if p.dp_replicate > 1:  # DistributedDataParallelConfig.num_distributed_optimizer_instances (2a75ac12c)
        out.append(("ddp.num_distributed_optimizer_instances", p.dp_replicate))
    if off := p.fine_grained_offload_modules:  # TransformerConfig.fine_grained_activation_offloading /
        # offload_modules (2a75ac12c; the Lightning H100 recipe's [expert_fc1]: Megatron-Bridge cba5742e3)
        out += [("model.fine_grained_activation_offloading", True),
                ("model.offload_modules", "[" + ",".join(off) + "]")]
    # ModelParallelConfig.gradient_accumulation_fusion off: main_grad.add_, or under Megatron-FSDP (ZeRO-2) the copy
    # into the reduce-scatter's bucket (megatron_fsdp.py _grad_acc at cd4afffa6)
    if p.grad_accumulation in ("add", "copy"):
        out.append(("model.gradient_accumulation_fusion", False))
    if p.pp > 1 and p.vpp > 1:  # ModelParallelConfig: overlapped interleaved sends, or the batched, synchronised
        # ones (batch_p2p_comm with batch_p2p_sync) that pp_blocking_sends prices (docs/formulas.md#step.pp_blocking)
        out += [("model.overlap_p2p_comm", not p.pp_blocking_sends), ("model.batch_p2p_comm", p.pp_blocking_sends)]
    if not p.rope_fusion:  # TransformerConfig.apply_rope_fusion: Megatron-Core's eager rotary
        out.append(("model.apply_rope_fusion", False))
    if not p.bias_dropout_fusion:  # TransformerConfig.bias_dropout_fusion: the output biases' own pass
        out.append(("model.bias_dropout_fusion", False))
    if not p.bias_gelu_fusion and not m.gated_mlp:  # TransformerConfig.bias_activation_fusion: a GeLU MLP's fc1
        out.append(("model.bias_activation_fusion", False))  # bias in its own pass (a gated MLP's is jit_activation)
    return out + dsa_overrides(pf) + cuda_graph_overrides(pf)


def train_overrides(pf: PlanFile) -> list[tuple[str, object]]:
    """Recompute (recompute_overrides), the loss fusion, the sequence length and batch sizes, the manual garbage
    collection and the dataset's attention mask."""
    p = pf.plan
    return [*recompute_overrides(pf), ("model.cross_entropy_loss_fusion", p.fused_loss),
            # ModelParallelConfig.cross_entropy_fusion_impl (ParallelPlan.fused_loss_impl)
            ("model.cross_entropy_fusion_impl", p.fused_loss_impl),
            ("model.seq_length", p.seq_len), ("dataset.seq_length", p.seq_len),
            ("train.micro_batch_size", p.micro_batch), ("train.global_batch_size", p.global_batch),
            # TrainingConfig.manual_gc / manual_gc_interval: Python's collections at the same step on every rank,
            # whatever the recipe sets (megatron.MANUAL_GC_INTERVAL); GPTDatasetConfig.create_attention_mask off:
            # the default skip_getting_attention_mask_from_dataset never hands the mask to the model, and the
            # attention this export writes (native flash only: attention_kernel_refusal) ignores it, so the loader
            # need not build, stack and pin an s x s mask per sample (perf_recipes/gpt_oss/common.py at 6124fbe)
            ("train.manual_gc", True), ("train.manual_gc_interval", MANUAL_GC_INTERVAL),
            ("dataset.create_attention_mask", False)]


def ddp_optimizer_overrides(pf: PlanFile) -> list[tuple[str, object]]:
    """The DDP and optimizer settings the plan priced (distributed optimizer or Megatron-FSDP, gradient reduction
    and gather overlap, bucket, master and moment dtypes), then comm_overlap null and the precision preset, which
    stay the last two entries."""
    p = pf.plan
    low_states = precision_aware(p)
    out: list[tuple[str, object]] = [
        # Muon's layer-wise optimizer runs beside an all-reducing DDP (muon_overrides)
        # ZeRO-2 too: Megatron-FSDP's v1 sets both (fsdp_overrides), written so that it does not print
        ("ddp.use_distributed_optimizer", p.zero >= 1 and p.optimizer != "muon"),
        ("optimizer.use_distributed_optimizer", p.zero >= 1 and p.optimizer != "muon"),
        ("ddp.use_megatron_fsdp", p.zero >= 2), *fsdp_overrides(pf),
        ("ddp.overlap_grad_reduce", p.overlap_grad_reduce),
        # Megatron-Core's fp32-sum reduce-scatter (DistributedDataParallelConfig at cd4afffa6, Megatron-Bridge
        # 0.6's pin; check_plan holds grad_reduce_fp32_sum to zero 1, reduce-scatter and 2-byte gradients)
        *([("ddp.reduce_scatter_with_fp32_accumulation", True)] if p.grad_reduce_fp32_sum else []),
        # DistributedDataParallelConfig: the NaN check's bucket norms and the 1/dp pre-scaling the plan prices
        # (never average_in_collective beside the fp32 accumulation, which asserts a SUM reduction: grad_prescaled)
        ("ddp.check_for_nan_in_grad", p.grad_nan_check), ("ddp.average_in_collective", not bool(grad_prescaled(p))),
        # the DDP bucket the plan priced (exposure.bucket_params): comm_overlap is null, so nothing sets
        # CommOverlapConfig's 128 x 2^20; None leaves Megatron-Core's max(40M, 1M x dp)
        *([("ddp.bucket_size", p.dp_bucket_params)] if p.dp_bucket_params is not None else []),
        # without overlap_grad_reduce too: Megatron-Bridge calls no validate_args, and Megatron-Core runs the
        # gather overlap with one bucket a chunk (the DeepSeek-V3 H100 card, perf_recipes/deepseek/h100/
        # deepseek_v3.py at 79308d0d9; docs/formulas.md#step.dp_one_bucket)
        # ZeRO-2 (Megatron-FSDP): the updated weights gathered per bucket ahead of the next forward; ZeRO-3: each
        # unit's gather prefetched (optim_grads_params turns it on itself; fsdp_zero2_rules no_gather_overlap)
        ("ddp.overlap_param_gather", p.overlap_param_gather and p.zero >= 1),
        # the plan's master weights and Adam moments (DeepSeek-V3's recipe keeps bf16 moments), through
        # Transformer Engine's precision-aware FusedAdam when either is below fp32
        ("optimizer.use_precision_aware_optimizer", low_states),
        ("optimizer.main_params_dtype", TORCH_DTYPES[p.optimizer_master_dtype]),
        ("optimizer.main_grads_dtype", "float32"),
        *((f"optimizer.{k}", TORCH_DTYPES[p.optimizer_moment_dtype]) for k in ("exp_avg_dtype",
                                                                               "exp_avg_sq_dtype")),
        ("comm_overlap", None), ("mixed_precision", preset(pf))]
    if p.overlap_param_gather_with_optimizer_step:  # OptimizerConfig's flag, which get_model's disable_bucketing
        # reads too (Megatron-Bridge v0.2.0 src/megatron/bridge/training/setup.py line 212)
        out.insert(len(out) - 2, ("optimizer.overlap_param_gather_with_optimizer_step", True))
    if low_states:  # OptimizerConfig.store_param_remainders (default True): written out, as the plan prices it
        out.insert(len(out) - 2, ("optimizer.store_param_remainders", p.param_remainders))
    return out


def stage_overrides(pf: PlanFile) -> list[tuple[str, object]]:
    """The stage layout llmplan evaluated, in one of Megatron-Core's exclusive forms (TransformerConfig: a
    layout excludes first/last stage counts and the embedding / loss accounting): an explicit layout string
    (E embedding, t layer, m MTP, L loss; stages split by '|', no commas, which Hydra reads as a sweep), first
    and last stage layers, or an even split. All are set, so a recipe's own layout does not survive."""
    p, m = pf.plan, pf.model
    even_chunks = p.vpp == 1 or all(n % p.vpp == 0 for n in stage_layer_list(m, p))
    layout = first = last = None
    # DeepSeek-V4's hash-routed layers need an explicit layout at PP > 1 (Megatron-Bridge deepseek_v4_bridge.py,
    # set_deepseek_v4_pipeline_model_parallel_layout): written whenever the model has them
    if p.pp_layout is not None or (p.pp > 1 and (p.pp_layers is not None or not even_chunks or m.num_hash_layers)):
        layout = megatron_layout(pf, m.num_nextn_predict_layers, commas=False)
    elif p.pp > 1:
        first, last = p.pp_first or None, p.pp_last or None
    return [("model.pipeline_model_parallel_layout", f'"{layout}"' if layout else None),
            ("model.num_layers_in_first_pipeline_stage", first), ("model.num_layers_in_last_pipeline_stage", last),
            ("model.account_for_embedding_in_pipeline_split", False),
            ("model.account_for_loss_in_pipeline_split", False)]


def recompute_overrides(pf: PlanFile) -> list[tuple[str, object]]:
    """Selective recompute is Megatron-Core's recompute_modules (the plan's, core_attn when it names none); full
    recomputes whole layers (uniform, one per group) or the first N of each chunk (block)."""
    p = pf.plan
    granularity, method, layers, modules = None, None, None, None
    if p.recompute == "selective":
        granularity, modules = "selective", "[" + ",".join(p.recompute_modules or ("core_attn",)) + "]"
    elif p.recompute == "full":
        granularity = "full"
        method, layers = ("block", p.recompute_layers) if p.recompute_layers is not None else ("uniform", 1)
    return [("model.recompute_granularity", granularity), ("model.recompute_method", method),
            ("model.recompute_num_layers", layers), ("model.recompute_modules", modules)]


def hydra_value(value: object) -> str:
    """A value in Hydra's override grammar: null, true/false, numbers as written, text as is."""
    if value is None:
        return "null"
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value)).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


BRIDGE_ENTRY = '"$MEGATRON_BRIDGE/scripts/training/run_recipe.py" "${RECIPE[@]}" "${TRAIN[@]}" "${OVERRIDES[@]}"'


def arrays(pf: PlanFile) -> str:
    """The shell lines that define the recipe, its training length and the overrides (checked first)."""
    check(pf)
    args = [f"{key}={hydra_value(value)}" for key, value in overrides(pf)]
    return "\n".join([
        *connections_env(pf),
        "MEGATRON_BRIDGE=${MEGATRON_BRIDGE:-/opt/Megatron-Bridge}",
        f"RECIPE=(--recipe {RECIPES[pf.model.name]} --mode pretrain --dataset mock)"
        "   # real data: --dataset megatron-indexed dataset.data_path=PREFIX",
        "TRAIN=(train.train_iters=${TRAIN_ITERS:-1000})",
        "OVERRIDES=(", *(f"    '{a}'" for a in args), ")"])


def connections_env(pf: PlanFile) -> list[str]:
    """The plan's cuda_max_connections where it gives one; else, under the EP overlap, the CUDA work queues
    Megatron-Bridge's performance presets give it, so that its communication stream is not serialised behind
    compute (scripts/performance/utils/overrides.py at 6124fbe: CUDA_DEVICE_MAX_CONNECTIONS 32 with the deepep /
    hybridep dispatcher, else 8 with moe_a2a_overlap on H100)."""
    p = pf.plan
    if p.cuda_max_connections is not None:
        return [f"export CUDA_DEVICE_MAX_CONNECTIONS={p.cuda_max_connections}   # the plan's cuda_max_connections"]
    if not (pf.model.is_moe and p.ep_comm_overlap and p.ep > 1):
        # Megatron-FSDP (ZeRO-2 / 3): Megatron-Bridge asserts the variable is not 1 (fsdp_zero2_rules)
        return ([f"unset CUDA_DEVICE_MAX_CONNECTIONS   # Megatron-FSDP (ZeRO-{p.zero}) asserts it is not 1"]
                if p.zero >= 2 else [])
    n = 32 if p.moe_dispatcher == "deepep" else 8
    return [f"export CUDA_DEVICE_MAX_CONNECTIONS={n}   # the EP all-to-all overlap's streams (not 1)"]


def ep_overlap_notes(pf: PlanFile) -> tuple[str, ...]:
    """What the EP overlap and delay_wgrad need of the software (Megatron-Core TransformerConfig at cd4afffa6 and
    Megatron-Bridge training/comm_overlap.py at 6124fbe: torch >= 2.6; Transformer Engine >= 2.7 for delayed
    weight gradients with overlap_grad_reduce or gradient_accumulation_fusion)."""
    p = pf.plan
    if not (pf.model.is_moe and p.ep_comm_overlap and p.ep > 1):
        return ()
    return ("note: the EP all-to-all overlap (overlap_moe_expert_parallel_comm) needs torch >= 2.6"
            + ("; delay_wgrad_compute needs Transformer Engine >= 2.7" if p.delay_wgrad else ""),)


def render(pf: PlanFile) -> dict[str, str]:
    defs = arrays(pf)
    lines = [
        *rendezvous_lines(pf),
        defs,
        "",
        "torchrun --nproc-per-node \"$GPUS_PER_NODE\" --nnodes \"$NNODES\" --node-rank \"$NODE_RANK\" "
        "--master-addr \"$MASTER_ADDR\" --master-port \"$MASTER_PORT\" \\",
        "    " + BRIDGE_ENTRY,
    ]
    header = sh_header(pf, f"Megatron-Bridge {VERSION} run_recipe.py (recipe {RECIPES[pf.model.name]})",
                       megatron_expert_notes(pf) + pp_sync_notes(pf, "Megatron-Bridge") + ep_overlap_notes(pf))
    return {"megatron_bridge_pretrain.sh": header + "\n".join(lines) + "\n"}
