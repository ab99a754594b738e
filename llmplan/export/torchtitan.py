"""torchtitan, two releases that take different files.

- `torchtitan` (release 0.3.x): a launch script. 0.3 dropped TOML job configs; a job names a config_registry
  function (`--module llama3 --config llama3_70b`) and overrides its fields on the command line
  (`--parallelism.tensor-parallel-degree 8`), parsed by tyro in torchtitan/config/manager.py (ConfigManager);
  field names from torchtitan/config/configs.py (ParallelismConfig, TrainingConfig, CompileConfig) and the
  activation-checkpoint subcommands of torchtitan/distributed/activation_checkpoint.py, release 0.3.0.
  tests/test_export.py parses the exported arguments with ConfigManager itself when torchtitan is installed.
- `torchtitan-0.2` (v0.2.2, the last release with TOML job configs): the TOML file; section and field names
  from torchtitan/config/job_config.py at v0.2.2, recorded in tests/data/launchers/torchtitan-v0.2.2.json.
"""

from __future__ import annotations

from typing import Any

from functools import partial

from llmplan.arith import where
from llmplan.export.common import unfused_loss_refusal
from llmplan.export.common import (accumulation_notes, bias_add_notes, bias_add_refusal, bias_gelu_refusal,
                                   check_accumulation,
                                   hidden_dropout_refusal, offload_moe_act_refusal, paged_stash_refusal,
                                   expert_bias, header_lines, hf_repo,
                                   launch_env_lines, launcher_schedule, need_mode, op_fuser_refusals, refuse,
                                   refuse_first,
                                   sh_header, tp_refusals, virtual_stage_layers, norm_kernel_refusals,
                                   swiglu_fp8_refusal, jit_activation_refusal, megatron_fsdp_refusal,
                                   parallel_block_refusal, whole_embedding_refusal, delay_wgrad_refusal,
                                   ep_overlap_refusal, router_fusion_refusal, router_padding_refusal)
from llmplan.planfile import PlanFile
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.quantities import bf16_layer_counts

TARGET = "torchtitan"
AC_MODE = {"none": "none", "full": "full", "op": "selective"}
"""llmplan recompute -> torchtitan activation-checkpoint mode: its "selective" is the per-op policy (0.3.0's
only selective mode; v0.2.2's with selective_ac_option "op"); llmplan's Megatron-style selective is refused."""
TORCHTITAN_VERSION = "0.3.0"
LEGACY_TARGET = "torchtitan-0.2"
LEGACY_VERSION = "v0.2.2"
CONFIGS = {
    "llama-3.1-8b": ("llama3", "llama3_8b", None), "llama-3.1-70b": ("llama3", "llama3_70b", None),
    "llama-3.1-405b": ("llama3", None, "llama3_405b"),
    "deepseek-v3": ("deepseek_v3", "deepseek_v3_671b", "deepseek_v3_671b_float8"),
    "qwen3-30b-a3b": ("qwen3", "qwen3_30b_a3b", None), "gpt-oss-120b": ("gpt_oss", "gpt_oss_120b", None),
}
"""Built-in model -> (module, bf16 config function, float8 config function) of torchtitan 0.3.0 (its
models/*/config_registry.py). 0.3 turns float8 on inside a config function's model spec, with no
command-line switch either way: llama3_405b trains in float8 (rowwise, output layer in bf16), so a bf16
405B plan has no config function."""
FLAVORS = {
    "llama-3.1-8b": ("llama3", "8B"), "llama-3.1-70b": ("llama3", "70B"), "llama-3.1-405b": ("llama3", "405B"),
    "deepseek-v3": ("deepseek_v3", "671B"), "qwen3-30b-a3b": ("qwen3", "30B-A3B"),
    "qwen3-235b-a22b": ("qwen3", "235B-A22B"), "gpt-oss-120b": ("gpt_oss", "120b"),
}
"""Built-in model -> (model name, flavour) of torchtitan v0.2.2's TOML [model] section."""

stash_refusal = partial(paged_stash_refusal, note="; this export writes no saved-tensor hooks")
"""export.common.paged_stash_refusal with torchtitan's reason."""

moe_act_refusal = partial(offload_moe_act_refusal, note="; this export writes no offload hooks")
"""export.common.offload_moe_act_refusal with torchtitan's reason."""


def accumulation(pf: PlanFile) -> tuple[str, str]:
    """(ParallelPlan.grad_accumulation torchtitan runs, why). FSDP2 (ZeRO-2/3) reduce-scatters every micro-batch's
    gradient and adds the fp32 shard into the sharded gradient (torch.distributed.fsdp fully_shard,
    foreach_reduce); DDP (ZeRO-0) trains fp32 parameters under torch.autocast (torchtitan config
    mixed_precision_param: "via torch.autocast ... under DDP"), so each bf16 weight gradient is cast to fp32 by
    the autocast cast's backward, then autograd's AccumulateGrad adds it into param.grad."""
    if pf.plan.zero >= 2:
        return "add", "FSDP2 adds each micro-batch's reduce-scattered fp32 shard into the sharded gradient"
    return "cast-add", ("DDP's autocast casts each bf16 weight gradient to the fp32 parameter's dtype, then "
                        "autograd adds it into param.grad")


def grad_reduce_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """Gradients reduced in bf16, refused whatever else the plan sets (export.EVERY_PLAN: a search holding the
    switch need not ask about its plans one by one)."""
    return ("bf16 gradient reduction (torchtitan's mixed_precision_reduce takes float32 only)",
            p.grad_dtype != "fp32" or p.grad_reduce_dtype != "grad_dtype",
            "re-plan with --grad-dtype fp32 --grad-reduce-dtype grad_dtype")


def optimizer_dtype_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """Adam states below fp32, refused whatever else the plan sets (export.EVERY_PLAN)."""
    return (f"optimizer states master {p.optimizer_master_dtype} / moments {p.optimizer_moment_dtype} (torchtitan's "
            "AdamW keeps its states in the fp32 parameter shards' dtype)",
            p.optimizer_master_dtype != "fp32" or p.optimizer_moment_dtype != "fp32",
            "re-plan with --optimizer-master-dtype fp32 --optimizer-moment-dtype fp32, or export to megatron")


def param_remainders_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """The master kept as remainders, refused whatever else the plan sets (export.EVERY_PLAN)."""
    return ("the fp32 master kept as 16-bit remainders (Megatron-Core's store_param_remainders; torchtitan's fp32 "
            "parameter shards are the master)", bool(p.param_remainders),
            "re-plan with --no-param-remainders, or export to megatron")


def fp8_attention_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """FP8 attention, refused whatever else the plan sets (export.EVERY_PLAN)."""
    return ("FP8 dot-product attention (Transformer Engine's fp8_dpa; torchao's float8 covers the linear layers)",
            bool(p.fp8_attention), "re-plan without fp8_attention, or export to megatron-bridge")


def delayed_scaling_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """fp8 per-tensor delayed scaling, refused by torchtitan 0.2's float8 converter whatever else the plan sets
    (export.EVERY_PLAN): torchao float8 training scales each cast from its own amax (float8_scaling_utils
    hp_tensor_to_float8_dynamic); the converter sets no delayed scaling. (0.3.0 refuses per-tensor fp8 whole.)"""
    bad = (p.dtype == "fp8") & (p.recipe == "tensorwise") & (p.fp8_scaling == "delayed")
    return ("fp8 per-tensor delayed scaling (torchtitan's float8 converter runs torchao's dynamic scaling: each "
            "cast's own amax)", bad, "re-plan with --fp8-scaling current")


def dtype_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """fp16 / fp32 training, refused whatever else the plan sets (export.EVERY_PLAN)."""
    return f"{p.dtype} training (torchtitan trains in bf16 or float8)", p.dtype in ("fp16", "fp32"), "use --dtype bf16"


def tensorwise_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """fp8 per-tensor scaling, refused by torchtitan 0.3.0 whatever else the plan sets (export.EVERY_PLAN): its
    float8 config functions set rowwise scaling. (Other fp8 recipes and fp4 meet _check_common's recipe rule
    first, in both releases.)"""
    return (f"fp8 {p.recipe} scaling (torchtitan {TORCHTITAN_VERSION}'s float8 config functions use rowwise "
            "scaling)", p.dtype == "fp8" and p.recipe == "tensorwise",
            "re-plan with --precision fp8-rowwise, or export to torchtitan-0.2 / megatron")


def saved_input_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """torchao_saves_hp_input False (torchao before v0.9.0 saved the per-tensor linear's fp8 input), refused: the
    torchao a torchtitan release runs is not a job-config key, and both releases here run a torchao that saves the
    bf16 input (v0.2.2 pins a torchao nightly; 0.3.0 is rowwise, which saves it at every version)."""
    return ("torchao_saves_hp_input false (torchao < v0.9.0's per-tensor Float8Linear, which saved its fp8 input; "
            "torchtitan's job config cannot pin torchao, and the torchao it runs saves the bf16 input)",
            p.dtype == "fp8" and not p.torchao_saves_hp_input,
            "set torchao_saves_hp_input true in the plan and re-estimate")


def muon_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """The Muon optimizer, refused whatever else the plan sets (export.EVERY_PLAN): torchtitan v0.2.2
    components/optimizer.py builds Adam or AdamW only (its DistMuon came on main 2026-08-13, bb90ff9c2,
    unverified in a release llmplan targets)."""
    return ("the Muon optimizer (torchtitan's optimizer.name builds Adam or AdamW)", p.optimizer == "muon",
            "export to megatron or megatron-bridge, or re-plan with --optimizer adam")


def grad_checks_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """Megatron-LM's gradient NaN check, pre-scaling or its optimizer's fp32 passes, refused whatever else the plan
    sets (export.EVERY_PLAN)."""
    passes = bool(p.optimizer_fp32_passes)
    checks = bool(p.grad_nan_check or p.grad_prescale)
    checks_text = ("Megatron-LM's gradient NaN check or 1/dp pre-scaling (grad_nan_check / grad_prescale: "
                   "FSDP2 averages inside its reduce-scatter)")
    what = ([checks_text] * (checks or not passes)
            + ["Megatron-LM's optimizer fp32 passes (optimizer_fp32_passes)"] * passes)
    keys = ["grad_nan_check and grad_prescale"] * (checks or not passes) + ["optimizer_fp32_passes"] * passes
    return ", and ".join(what), checks or passes, f"set {' and '.join(keys)} false, or export to megatron"


def unfused_attention_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """Attention without a fused kernel (flash_attention false, its scores written to HBM and priced by
    softmax_kernel), refused whatever else the plan sets (export.EVERY_PLAN): torchtitan's attention is SDPA, whose
    ScaledDotProductAttentionWrapper asks for the cuDNN, flash and memory-efficient kernels ahead of the math
    one (sdpa_kernel with set_priority), or FlexAttention / varlen attention, compiled kernels that write no scores;
    no job option runs a softmax over stored scores. Source: pytorch/torchtitan torchtitan/models/attention.py at
    0012170a (ScaledDotProductAttentionWrapper, FlexAttentionWrapper, VarlenAttentionWrapper)."""
    return ("attention without a fused kernel (flash_attention false: a softmax over stored scores; torchtitan's "
            "attention is SDPA's cuDNN / flash / memory-efficient kernels or FlexAttention, which store none)",
            where(p.flash_attention, False, True), "re-plan with --flash-attention")


def dp_outer_optimizer_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """The optimizer sharded across replicas, refused whatever else the plan sets (export.EVERY_PLAN)."""
    return ("the optimizer sharded across the hybrid-sharding replicas (Megatron-FSDP's outer optim sharding; "
            "FSDP2's HSDP replicates the shard group's optimizer states)", bool(p.dp_outer_optimizer),
            "re-plan without --dp-outer-optimizer")


def offload_modules_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """Megatron's fine-grained offload of listed modules, refused whatever else the plan sets (export.EVERY_PLAN)."""
    return (f"fine-grained activation offload of {', '.join(p.offload_modules)} (Megatron-Core's offload_modules; "
            "this export writes no offload hooks)", bool(p.offload_modules),
            "re-plan without --offload-modules, or export to megatron")


def offload_layers_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """Megatron's activation offload, refused whatever else the plan sets (export.EVERY_PLAN)."""
    return (f"activation offload of {p.offload_layers} layers (Megatron-Core's cpu_offloading_num_layers through "
            "Transformer Engine's offload context; this export writes no offload hooks)", p.offload_layers > 0,
            "re-plan without --offload-activations-layers, or export to megatron")


def recompute_layers_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """Recompute of the first layers only, refused whatever else the plan sets (export.EVERY_PLAN)."""
    return (f"full recompute of the first {p.recompute_layers} layers of each chunk (torchtitan's layer "
            "checkpointing takes every layer, or every Nth layer: a different set)", p.recompute_layers is not None,
            "re-plan without --recompute-layers, or export to megatron")


def _check_common(pf: PlanFile, target: str) -> None:
    """Refuse, with the rule and its fix, what neither torchtitan version runs as priced: not a training plan, a
    hybrid or latent-MoE model, then the optimizer, ZeRO-1, dtype, kernels and pipeline sends, then
    _check_precision and _check_recompute_moe."""
    need_mode(pf, "train", target)
    if pf.model.is_hybrid:
        raise refuse(target, f"the hybrid layer stack of {pf.model.name} (Mamba-2 / Gated DeltaNet / mixer-only "
                     "layers: torchtitan's models are transformers of one layer kind)", "export to megatron")
    if pf.model.moe_latent_size:
        raise refuse(target, f"the latent MoE of {pf.model.name} (moe_latent_size {pf.model.moe_latent_size}: "
                     "torchtitan's MoE has no latent projections around its experts)", "export to megatron")
    refuse_first(target, [mtp_refusal(pf)])
    p = pf.plan
    refuse_first(target, [muon_refusal(p)])
    # Also refuses kept_grad_shards and fp32_embedding_grads: check_plan (kept_grad_shards_zero,
    # fp32_embedding_grads_zero) keeps both to zero 1 with grad_reduce reduce-scatter, so no plan file gets past here
    if p.zero == 1:
        raise refuse(target, "ZeRO-1 (FSDP2 shards gradients and weights too)",
                     "re-plan with --zero 2 (FSDP without resharding after forward) or --zero 3")
    refuse_first(target, [dtype_refusal(p)])
    refuse_first(target, [grad_checks_refusal(p)])
    refuse_first(target, [*tp_refusals(pf), *op_fuser_refusals(pf), *norm_kernel_refusals(pf),
                          unfused_attention_refusal(p), parallel_block_refusal(pf), whole_embedding_refusal(pf),
                          ep_overlap_refusal(pf),
                          delay_wgrad_refusal(pf), router_fusion_refusal(pf), router_padding_refusal(pf)])
    if p.pp_blocking_sends and p.pp > 1:  # torch.distributed.pipelining posts isend / irecv, no device sync
        raise refuse(target, "pipeline exchanges that block and synchronise the device (pp_blocking_sends: "
                     "Megatron-LM 2021-22; torchtitan's pipeline schedules wait for a receive only before its use)",
                     "re-plan with --no-pp-blocking-sends")
    if p.pp_unbatched_sends and p.pp > 1:  # torch.distributed.pipelining posts a step's isend / irecv together
        raise refuse(target, "1F1B pipeline transfers one at a time (pp_unbatched_sends: DeepSpeed's pipeline "
                     "engine; torchtitan's schedules post a step's sends and receives together)",
                     "re-plan with --no-pp-unbatched-sends, or export to deepspeed")
    if launcher_schedule("torchtitan", p.pp_schedule) is None:
        raise refuse(target, f"the {p.pp_schedule} schedule (torchtitan's ZBVZeroBubble / DualPipeV run two "
                     "V-shaped stages per rank, a layout this export does not write)",
                     "re-plan with --pp-schedule 1f1b")
    _check_precision(pf, target)
    _check_recompute_moe(pf, target)


def loss_impl_refusal(p: Any) -> tuple[str, Any, str]:
    """An unfused loss priced with another implementation's memory than this launcher runs (common.UNFUSED_LOSS_RUNS),
    refused whatever else the plan sets (export.EVERY_PLAN)."""
    return unfused_loss_refusal(p, "torchtitan")


def _check_precision(pf: PlanFile, target: str) -> None:
    """Refuse the fp8 / fp4 recipes, optimizer dtypes, bf16 layers, activation and attention precision, the
    unfused rotary and the gradient reduction that torchtitan does not run as priced."""
    p = pf.plan
    if p.dtype == "fp8" and p.recipe == "blockwise":
        # check_switches rule dtensor_recipe: torchao's prototype Float8BlockwiseLinear (pytorch/ao@db46a188
        # torchao/prototype/blockwise_fp8_training/linear.py); torchtitan registers no converter for it
        # (components/quantization: float8, mx, nvfp4 only, at 01472ad4)
        raise refuse(target, "the blockwise recipe (1x128 / 128x128 block scaling runs in torchao's prototype "
                     "Float8BlockwiseLinear, for which torchtitan has no converter)",
                     "export to megatron, or re-plan with --precision fp8-rowwise")
    refuse_first(target, (converter_refusal(p), optimizer_dtype_refusal(p), param_remainders_refusal(p)))
    if sum(bf16_layer_counts(p, pf.model.num_hidden_layers)) or p.bf16_modules:
        raise refuse(target, "layers or modules kept in bf16 under the fp8 recipe (Megatron's "
                     "--first-last-layers-bf16, --te-precision-config-file; this export writes no float8 filter)",
                     "re-plan with --bf16-layers-start 0 --bf16-layers-end 0 and no --bf16-modules, or export to "
                     "megatron")
    refuse_first(target, (swiglu_fp8_refusal(p), jit_activation_refusal(p), megatron_fsdp_refusal(p)))
    # fp8_params with rowwise: check_plan
    refuse_first(target, (fp8_attention_refusal(p), saved_input_refusal(p), loss_impl_refusal(p)))
    if p.fused_kernels and not p.rope_fusion:
        raise refuse(target, "the rotary embedding unfused (rope_fusion off, Megatron-Core's eager rotary) with "
                     "fused kernels: torch.compile of the model, which this export turns on for them, fuses it",
                     "set rope_fusion true in the plan, or export to megatron")
    refuse_first(target, [hidden_dropout_refusal(pf, "torchtitan"), bias_add_refusal(pf, "torchtitan's linears"),
                          bias_gelu_refusal(pf, "torchtitan's linears"),
                          grad_reduce_refusal(p)])


def _check_recompute_moe(pf: PlanFile, target: str) -> None:
    """Refuse Megatron's selective recompute, per-expert GEMMs, MoE dispatch and routing, and the optimizer
    placement, offloading and partial recompute that torchtitan does not run as priced."""
    p = pf.plan
    if p.recompute == "selective":
        raise refuse(target, "selective recompute as llmplan costs it (Megatron's: the attention core, which "
                     "fused attention does not store anyway); torchtitan's selective checkpointing (op policy) "
                     "recomputes every other matmul instead, at other memory and time",
                     "re-plan with --recompute op (torchtitan's policy), --recompute none (the same memory "
                     "with fused attention) or --recompute full")
    if pf.model.is_moe and p.expert_gemm == "per-expert":
        raise refuse(target, "one GEMM per local expert (expert_gemm per-expert, Transformer Engine's GroupedLinear; "
                     "torchtitan's GroupedExperts run one torch._grouped_mm, use_grouped_mm in the model's config "
                     "function, which this export does not write)", "re-plan with --expert-gemm grouped, or export "
                     "to megatron")
    if pf.model.is_moe and (p.moe_dispatcher != "alltoall" or p.moe_routing != "random"):
        raise refuse(target, f"MoE dispatch {p.moe_dispatcher} with {p.moe_routing} routing (torchtitan selects "
                     "DeepEP in a model's config function, which this export does not write, and routes with the "
                     "model's own router)", "re-plan with --moe-dispatcher alltoall --moe-routing random, or "
                     "export to megatron")
    refuse_first(target, (dp_outer_optimizer_refusal(p), moe_act_refusal(p), stash_refusal(p),
                          offload_modules_refusal(p), offload_layers_refusal(p), recompute_layers_refusal(p)))


def mtp_refusal(pf: PlanFile) -> tuple[str, bool, str]:
    """(what, whether the plan needs it, fix) for MTP modules the estimate priced (the trained model's
    num_nextn_predict_layers, 0 at --mtp-layers 0). v0.2.2 has no MTP; 0.3.0 (0.3.0rc1, pytorch/torchtitan@1fdf90d)
    has DeepSeek-V3's since #3392 (f59c215e), built only from model_registry(..., num_mtp_layers=N) with an MTPLoss
    in a config function (deepseek_v3_debugmodel_mtp); deepseek_v3_671b builds none, num_mtp_layers is no config
    field a command-line override reaches, and MTPDecoder rejects PP and CP (models/deepseek_v3/MTP.md)."""
    n = pf.model.num_nextn_predict_layers
    return (f"the {n} MTP module{'s' if n > 1 else ''} the estimate priced for {pf.model.name} (torchtitan "
            f"{LEGACY_VERSION} has none; {TORCHTITAN_VERSION} builds DeepSeek-V3's only from model_registry's "
            "num_mtp_layers with MTPLoss in a config function, which its deepseek_v3_671b does not set and no "
            "command-line field reaches)", n > 0, "re-plan with --mtp-layers 0, or export to megatron")


def converter_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """(what, whether the plan needs it, fix) for a low-precision recipe other than float8 tensorwise / rowwise
    (both releases: the export writes torchtitan's float8 converter only); reads the workload's dtype alone."""
    return (f"the {p.recipe} recipe (this export writes torchtitan's float8 converter only; "
            "MXFP8 and NVFP4 live in config functions / quantize sections it does not write)",
            p.dtype == "fp4" or (p.dtype == "fp8" and p.recipe not in ("tensorwise", "rowwise")),
            "export to megatron, or re-plan with --precision fp8-rowwise")


def check(pf: PlanFile) -> None:
    """What torchtitan 0.3.0 cannot express."""
    _check_common(pf, TARGET)
    p, m = pf.plan, pf.model
    if m.name not in CONFIGS:
        raise refuse(TARGET, f"torchtitan {TORCHTITAN_VERSION} has no config function for {m.name}",
                     f"use one of {', '.join(sorted(CONFIGS))}, or export to megatron"
                     + (" or torchtitan-0.2" if m.name in FLAVORS else ""))
    module, bf16, fp8 = CONFIGS[m.name]
    refuse_first(TARGET, [tensorwise_refusal(p)])  # _check_common refused the other fp8 recipes
    if (fp8 if p.dtype == "fp8" else bf16) is None:
        other = "bf16" if p.dtype == "fp8" else "fp8"
        raise refuse(TARGET, f"{p.dtype} training of {m.name} (torchtitan {TORCHTITAN_VERSION} sets float8 in a "
                     f"config function's model spec, and its {module} functions for this model are {other} only)",
                     f"re-plan with --dtype {other}, or export to torchtitan-0.2 or megatron")
    if p.ep > 1 and p.etp_resolved != 1:
        raise refuse(TARGET, f"expert TP {p.etp_resolved} (torchtitan {TORCHTITAN_VERSION} has no expert TP: "
                     "EP borrows ranks from data x tensor parallelism and experts are not TP-sharded)",
                     "re-plan with --etp 1")
    if p.zero >= 3 and p.zero3_unit != "layer":
        raise refuse(TARGET, f"ZeRO-3 gathers per {p.zero3_unit} (torchtitan's FSDP2 applies fully_shard to each "
                     "transformer block: one all-gather and one reduce-scatter per layer)",
                     "re-plan with --zero3-unit layer, or export to deepspeed")
    if p.cp > 1 and p.cp_impl != "torch-allgather":
        te = f" cp_comm_type {p.cp_comm_type}" if p.cp_impl == "te" else ""  # a2a+p2p: TE's hierarchical CP
        raise refuse(TARGET, f"context parallelism priced as cp_impl {p.cp_impl}{te} "
                     f"(torchtitan {TORCHTITAN_VERSION} has no rotate method: its FlexAttention all-gathers the K/V "
                     "once per layer, nearest torch-allgather)", "re-plan with --cp-impl torch-allgather, or export to "
                     + ("megatron" if p.cp_impl == "te" else "torchtitan-0.2"))  # 0.2 refuses te too
    _check_tp_impl(pf, TARGET)
    _check_layout(pf, TARGET)
    check_accumulation(pf, TARGET, "torchtitan", *accumulation(pf))  # last, after the plan's other refusals


def notes(pf: PlanFile) -> tuple[str, ...]:
    """The export header's notes: the gradient accumulation torchtitan runs where the plan priced the default;
    biased experts' fc1 bias, which torchtitan's grouped matmul (torch._grouped_mm) takes no bias for and adds
    after it, where the plan priced it inside the GEMM (ParallelPlan.expert_fc1_bias_fusion); and attention sinks,
    which torchtitan applies after the kernel (gpt_oss Attention.forward: flex_attention with return_lse, then
    the output scaled by sigmoid(lse - sinks)), where the plan priced them in its softmax (sink_fusion)."""
    m, p = pf.model, pf.plan
    bias = (("note: priced with the experts' fc1 bias inside the grouped GEMM (expert_fc1_bias_fusion true); "
             "torchtitan adds it after torch._grouped_mm, so this runs a little slower than priced: set "
             "expert_fc1_bias_fusion false in the plan to price it",)
            if expert_bias(m) and p.expert_fc1_bias_fusion else ())
    sinks = (("note: priced with the attention sinks in the kernel's softmax (sink_fusion true); torchtitan "
              "rescales flex_attention's output by them after the kernel, so this runs a little slower than "
              "priced: set sink_fusion false in the plan to price it",)
             if m.attention_sinks and p.sink_fusion else ())
    return (accumulation_notes(pf, "torchtitan", *accumulation(pf)) + bias + sinks
            + bias_add_notes(pf, "torchtitan"))


COMPLEX_ROPE = ("llama3", "deepseek_v3")
"""torchtitan model modules whose rotary is complex arithmetic (view_as_complex, times the complex freqs_cis):
0.3.0's ComplexRoPE (models/common/rope.py; llama3 and deepseek_v3 build it, qwen3 and gpt_oss CosSinRoPE) and
v0.2.2's apply_rotary_emb (models/llama3/model/model.py, models/deepseek_v3/model/model.py). Inductor runs
complex operators eager (torch/_inductor/lowering.py: "Torchinductor does not support code generation for
complex operators"), ParallelPlan.rope_complex."""


def switch_notes(pf: PlanFile, module: str) -> tuple[str, ...]:
    """Header notes where the plan priced a kernel torchtitan does not run: the rotary compiled where the
    model's rotary is complex (runs eager: rope_complex) or eager where it is real, and ZeRO-3 without FSDP2's
    copy of every all-gather into the parameters (torch.distributed.fsdp _fully_shard/_fsdp_collectives.py
    foreach_all_gather_copy_out, split_with_sizes_copy: zero3_copy_out), which fully_shard always runs; and the
    context-parallel transfers overlapped where the blocks are compiled, or waited for where they run eager
    (cp_comm_overlap, docs/formulas.md#step.cp_compiled)."""
    p, m = pf.plan, pf.model
    rope = not m.learned_position_embeddings and p.fused_kernels
    complex_rope = module in COMPLEX_ROPE
    notes: tuple[str, ...] = ()
    if rope and complex_rope and not p.rope_complex:
        notes += (f"note: priced with the rotary compiled (rope_complex false); torchtitan's {module} rotary is "
                  "complex arithmetic, which torch.compile runs eager, so this runs slower than priced: "
                  "re-plan with --rope-complex to price it",)
    if rope and not complex_rope and p.rope_complex:
        notes += (f"note: priced with an eager complex rotary (rope_complex true); torchtitan's {module} rotary "
                  "is real (cos/sin) and compiles, so this runs a little faster than priced: re-plan with "
                  "--rope-real to price it",)
    if p.zero >= 3 and p.dp * p.cp > 1 and not p.zero3_copy_out:
        notes += ("note: priced without FSDP2's copy-out (zero3_copy_out false); fully_shard copies every "
                  "all-gather into the parameters on the compute stream, so this runs slower than priced: "
                  "re-plan with --zero3-copy-out to price it",)
    ring = p.cp > 1 and p.cp_impl != "te"  # step.cp_compiled: compiled, the CP transfers wait where issued
    if ring and p.cp_comm_overlap and "model" in compiled_components(p):
        notes += ("note: priced with the context-parallel transfers beside the attention (cp_comm_overlap true, "
                  "as eager PyTorch runs them); this export compiles the blocks, where each is waited for where "
                  "issued, so this runs slower than priced: re-plan with --no-cp-comm-overlap to price it",)
    if ring and not p.cp_comm_overlap and "model" not in compiled_components(p):
        notes += ("note: priced with the context-parallel transfers waited for where issued (cp_comm_overlap "
                  "false, the compiled ring); this export runs the blocks eager (fused_kernels false), where they "
                  "run beside the attention, so this runs faster than priced: re-plan with --cp-comm-overlap",)
    return notes


def cp_notes(pf: PlanFile) -> tuple[str, ...]:
    """torchtitan 0.3.0's context parallelism, where the plan has it: no rotate method (0.2's
    context_parallel_rotate_method is gone); Llama and the other built-in models attend with FlexAttention
    (model_registry's attn_backend "flex", models/llama3/__init__.py at 0.3.0rc1 1fdf90d and main b5bcd76), whose
    CP all-gathers the K/V heads over the cp ranks (models/common/attention.py: "CP all-gathers k/v"; at rc1
    distributed/context_parallel/api.py apply_cp_to_forward calls PyTorch's flex_cp_allgather) and runs one
    attention call on them: no ring steps, no per-step merges. The plan's torch-allgather pricing keeps the
    per-step merges and the K/V gradients' fp32 sends, so 0.3 runs a little faster than priced."""
    p = pf.plan
    if p.cp == 1:
        return ()
    kv = ("; it gathers the KV heads (FlexAttention's enable_gqa), not the query heads the plan priced "
          "(cp_kv_repeated): set cp_kv_repeated false to price it" if p.cp_kv_repeated else "")
    return (f"note: context parallelism: torchtitan {TORCHTITAN_VERSION} all-gathers the K/V for FlexAttention "
            "(no rotate method), priced as cp_impl torch-allgather with its per-step merges" + kv,)


def _check_layout(pf: PlanFile, target: str) -> None:
    """torchtitan states a layout as the modules of each model part (module_fqns_per_model_part): every part
    needs a transformer layer, and its models have no MTP modules to place."""
    chunks = pf.plan.pp_layout or ()
    bare = [k for k, c in enumerate(chunks) if "t" not in c]
    if bare:
        raise refuse(target, f"pipeline layout chunk(s) {', '.join(map(str, bare[:8]))} without a transformer layer "
                     "(a torchtitan model part is a list of modules; the embedding, loss and MTP are not parts of "
                     "their own)", "re-plan with a --pp-layout whose every chunk holds a t, or export to megatron")


def _check_tp_impl(pf: PlanFile, target: str) -> None:
    """torchtitan's TP is PyTorch DTensor's: with sequence parallelism it keeps the gathered inputs of QKV,
    fc1 and the output layer (more activation memory than Megatron's shards), so a plan costed as Megatron's
    would run with less memory to spare than llmplan said."""
    p = pf.plan
    if p.tp > 1 and p.sp and p.tp_impl != "dtensor":
        raise refuse(target, "TP costed as Megatron-LM's (sequence-parallel linears that keep the input shard); "
                     "torchtitan's DTensor TP keeps the gathered inputs, at more activation memory",
                     "re-plan with --tp-impl dtensor")


def check_legacy(pf: PlanFile) -> None:
    """What torchtitan v0.2.2's TOML cannot express."""
    _check_common(pf, LEGACY_TARGET)
    _check_layout(pf, LEGACY_TARGET)
    p, m = pf.plan, pf.model
    refuse_first(LEGACY_TARGET, [delayed_scaling_refusal(p)])
    if m.name not in FLAVORS:
        raise refuse(LEGACY_TARGET, f"torchtitan {LEGACY_VERSION} has no model flavour for {m.name}",
                     f"use one of {', '.join(sorted(FLAVORS))}, or export to megatron")
    if p.cp > 1 and FLAVORS[m.name][0] == "gpt_oss":  # pytorch/torchtitan@73a0e69 models/gpt_oss/model/args.py
        raise refuse(
            LEGACY_TARGET,
            f"context parallelism (cp {p.cp}) of {m.name} (torchtitan {LEGACY_VERSION}'s gpt_oss "
            "raises NotImplementedError: 'CP support for gpt-oss model is still in progress')",
            "export to torchtitan (0.3), or re-plan with --cp 1",
        )
    if p.tp > 1 and not p.sp:
        raise refuse(LEGACY_TARGET, f"TP without sequence parallelism (torchtitan {LEGACY_VERSION} always shards "
                     "norms with TP)", "re-plan with --sp, or export to torchtitan (0.3)")
    if p.ep > 1 and p.etp_resolved not in (1, p.tp):
        raise refuse(LEGACY_TARGET, f"expert TP {p.etp_resolved} (torchtitan takes 1 or tp)", "re-plan with --etp 1")
    if p.launch_blocking:
        raise refuse(LEGACY_TARGET, "CUDA_LAUNCH_BLOCKING=1 (launch_blocking: an environment variable, and this "
                     "export writes only the TOML)", "export to torchtitan (0.3), or re-plan with --no-launch-blocking")
    if not p.cuda_lazy_loading:
        raise refuse(LEGACY_TARGET, "CUDA_MODULE_LOADING=EAGER (cuda_lazy_loading off: an environment variable, and "
                     "this export writes only the TOML)", "export to torchtitan (0.3), or set cuda_lazy_loading true "
                     "in the plan")
    _check_tp_impl(pf, LEGACY_TARGET)
    _check_legacy_fp8(pf)
    if p.cp > 1 and p.cp_impl == "te":
        raise refuse(LEGACY_TARGET, f"context parallelism priced as Transformer Engine's (cp_impl te, cp_comm_type "
                     f"{p.cp_comm_type}); torchtitan "
                     f"{LEGACY_VERSION} runs PyTorch's (query-head K/V, fp32 K/V gradients: more traffic)",
                     "re-plan with --cp-impl torch-allgather (its default rotate method) or torch-alltoall")
    check_accumulation(pf, LEGACY_TARGET, "torchtitan", *accumulation(pf))


def _check_legacy_fp8(pf: PlanFile) -> None:
    """Refuse the fp8 plans torchtitan v0.2.2 does not run as priced: float8 TP, fp8 routed experts outside its
    rowwise grouped GEMMs, fp8_params where FSDP does not shard the weights."""
    p, m = pf.plan, pf.model
    if p.dtype == "fp8" and p.recipe == "tensorwise" and p.tp > 1:  # torchtitan@73a0e69 models/*/infra/parallelize.py
        raise refuse(LEGACY_TARGET, f"float8 tensor parallelism (fp8 tensorwise at tp {p.tp}: torchtitan "
                     f"{LEGACY_VERSION} turns it on only when model.converters holds \"float8\", a name it no longer "
                     "registers (\"quantize.linear.float8\"), so its TP gathers bf16 and the linears save other "
                     "inputs than priced)", "re-plan with --tp 1 or --precision fp8-rowwise, or export to megatron")
    if p.dtype == "fp8" and m.is_moe and (p.recipe != "rowwise" or p.pp > 1 or p.cp > 1):
        # torchtitan@73a0e69 components/quantization/float8.py Float8GroupedMMConverter: torchao's MoETrainingConfig
        # (dynamic float8 rowwise scaled grouped GEMMs) and asserts pipeline_parallel_degree == 1 and
        # context_parallel_degree == 1; without it the routed experts run bf16 grouped GEMMs, priced here in fp8
        why = (f"recipe {p.recipe}: its float8 grouped GEMMs are rowwise only" if p.recipe != "rowwise" else
               f"pp {p.pp}, cp {p.cp}: its float8 grouped GEMMs assert pipeline and context parallelism off")
        raise refuse(LEGACY_TARGET, f"fp8 routed experts of {m.name} ({why}, quantize.grouped_mm.float8 in torchtitan "
                     f"{LEGACY_VERSION}; without it the experts run bf16 and the plan prices them in fp8)",
                     "re-plan with --precision fp8-rowwise --pp 1 --cp 1, or export to megatron")
    if p.dtype == "fp8" and p.fp8_params and _fsdp(pf)[1] == 1:
        raise refuse(LEGACY_TARGET, f"fp8_params with zero {p.zero} and dp {p.dp} (torchtitan {LEGACY_VERSION} "
                     "enables the float8 all-gather only where FSDP shards the weights, data_parallel_shard_degree "
                     "> 1: this plan's weights would stay bf16)", "re-plan with --no-fp8-params, or --zero 3")


def stage_modules(pf: PlanFile) -> list[list[str]]:
    """The modules of every virtual pipeline stage in model order: the embedding with the first, the final
    norm and output with the last. Stating them pins the layout llmplan evaluated (torchtitan's own split
    otherwise weighs the embedding and output as layers)."""
    parts, start = [], 0
    stages = virtual_stage_layers(pf)
    for s, n in enumerate(stages):
        names = (["tok_embeddings"] if s == 0 else []) + [f"layers.{i}" for i in range(start, start + n)]
        parts.append(names + (["norm", "output"] if s == len(stages) - 1 else []))
        start += n
    return parts


def model_parts(pf: PlanFile) -> str:
    """stage_modules as a TOML list of lists."""
    return "[" + ", ".join("[" + ", ".join(f'"{x}"' for x in part) + "]" for part in stage_modules(pf)) + "]"


def _fsdp(pf: PlanFile) -> tuple[int, int, str]:
    """(replicate degree, shard degree, reshard after forward): ZeRO-0 replicates (DDP), ZeRO-2 shards
    without resharding after forward, ZeRO-3 shards and reshards; hybrid sharding (dp_replicate) replicates
    dp_replicate groups of dp / dp_replicate shards (torchtitan's HSDP: FSDP2 over a 2-D mesh)."""
    p = pf.plan
    r = p.dp_replicate
    return (p.dp, 1, "default") if p.zero == 0 else (r, p.dp // r, "never" if p.zero == 2 else "default")


def compiled_components(p) -> list[str]:
    """What torch.compile must cover for torchtitan to run the kernels llmplan costed: the model blocks when
    the plan assumes fused norm / rotary / elementwise kernels (fused_kernels), the loss when it assumes a
    fused loss (fused_loss: one fp32 copy of the logits). torchtitan leaves compile off by default and its
    eager loss is PyTorch's cross_entropy on fp32 logits (torchtitan/components/loss.py)."""
    return [c for c, on in (("model", p.fused_kernels), ("loss", p.fused_loss)) if on]


def overrides(pf: PlanFile) -> list[str]:
    """Arguments after `-m torchtitan.train` for torchtitan 0.3.0, one option (with its value) per item."""
    p, m = pf.plan, pf.model
    module, bf16, fp8 = CONFIGS[m.name]
    config = fp8 if p.dtype == "fp8" else bf16
    replicate, shard, reshard = _fsdp(pf)
    repo = hf_repo(m.name)
    args = [
        f"--module {module} --config {config}",
        f"--hf-assets-path ./assets/hf/{repo.split('/')[-1]}"
        f"   # tokenizer: python scripts/download_hf_assets.py --repo_id {repo} --assets tokenizer",
        "--dump-folder ./outputs",
        "--dataloader.dataset c4   # or a dataset registered in torchtitan/hf_datasets",
        f"--training.local-batch-size {p.global_batch // p.dp if p.pp > 1 else p.micro_batch}",
        f"--training.global-batch-size {p.global_batch}", f"--training.seq-len {p.seq_len}",
        "--training.steps 1000", "--training.max-norm 1.0", "--training.mixed-precision-param bfloat16",
        "--training.mixed-precision-reduce float32",
        f"--parallelism.data-parallel-replicate-degree {replicate}",
        f"--parallelism.data-parallel-shard-degree {shard}",
        f"--parallelism.fsdp-reshard-after-forward {reshard}",
        f"--parallelism.tensor-parallel-degree {p.tp}",
        "--parallelism.enable-sequence-parallel" if p.sp or p.tp == 1 else "--parallelism.no-enable-sequence-parallel",
        f"--parallelism.pipeline-parallel-degree {p.pp}",
        f"--parallelism.context-parallel-degree {p.cp}"
        + ("   # K/V all-gathered: no rotate method" if p.cp > 1 else ""),
        f"--parallelism.expert-parallel-degree {p.ep}",
    ]
    if p.pp > 1:
        args += [f"--parallelism.pipeline-parallel-schedule {launcher_schedule('torchtitan', p.pp_schedule, p.vpp)}",
                 f"--parallelism.pipeline-parallel-microbatch-size {p.micro_batch}",
                 "--parallelism.module-fqns-per-model-part " + " ".join(",".join(x) for x in stage_modules(pf)),
                 "--training.disable-cuda-graphs   # torchtitan 0.3 has no CUDA graphs with pipeline parallelism"]
    parts = compiled_components(p)
    async_tp = "--compile.enable-async-tensor-parallel" if p.tp_comm_overlap and p.tp > 1 else \
        "--compile.no-enable-async-tensor-parallel"
    args.append(f"--compile.enable --compile.components {','.join(parts)} {async_tp}" if parts
                else f"--compile.no-enable {async_tp}   # eager: the plan's unfused kernels and loss")
    args.append(f"activation-checkpoint:{AC_MODE[p.recompute]}   # subcommand: keep it last")
    return args


TORCHTITAN_ENTRY = '-m torchtitan.train "${TORCHTITAN_ARGS[@]}"'


def args_array(pf: PlanFile) -> str:
    """The TORCHTITAN_ARGS bash array (comments allowed inside it)."""
    return "\n".join(["TORCHTITAN_ARGS=("] + [f"    {a}" for a in overrides(pf)] + [")"])


def render(pf: PlanFile) -> dict[str, str]:
    check(pf)
    c = pf.cluster
    script = (sh_header(pf, f"torchtitan {TORCHTITAN_VERSION} (config_registry + command-line overrides)",
                        notes(pf) + switch_notes(pf, CONFIGS[pf.model.name][0]) + cp_notes(pf))
              + "set -euo pipefail\n\n"
              + "".join(f"{line}\n" for line in launch_env_lines(pf))
              + f"GPUS_PER_NODE=${{GPUS_PER_NODE:-{c.gpus_per_node_used}}}\nNNODES=${{NNODES:-{c.num_nodes}}}\n"
              "NODE_RANK=${NODE_RANK:-0}\nMASTER_ADDR=${MASTER_ADDR:-localhost}\nMASTER_PORT=${MASTER_PORT:-29500}\n"
              + args_array(pf) + "\n\n"
              'torchrun --nproc-per-node "$GPUS_PER_NODE" --nnodes "$NNODES" --node-rank "$NODE_RANK" '
              '--master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \\\n    ' + TORCHTITAN_ENTRY + "\n")
    return {"torchtitan_train.sh": script}


def toml_text(pf: PlanFile) -> str:
    """torchtitan v0.2.2's TOML job config."""
    p, m = pf.plan, pf.model
    name, flavor = FLAVORS[m.name]
    replicate, shard, reshard = _fsdp(pf)
    local_batch = p.global_batch // p.dp
    schedule = launcher_schedule("torchtitan", p.pp_schedule, p.vpp)
    lines = [f"# {line}" for line in header_lines(pf, f"torchtitan {LEGACY_VERSION} (TOML job config)",
                                                  notes(pf) + switch_notes(pf, name))]
    lines += [
        f"# torchtitan version: {LEGACY_VERSION}, the last release that reads TOML job configs (0.3 takes "
        "--module/--config: export to torchtitan)",
        "", "[job]", 'dump_folder = "./outputs"', f'description = "llmplan: {m.name}"',
        "", "[model]", f'name = "{name}"', f'flavor = "{flavor}"',
        f'hf_assets_path = "./assets/hf/{hf_repo(m.name).split("/")[-1]}"'
        "  # tokenizer and config: python scripts/download_hf_assets.py --repo_id "
        f"{hf_repo(m.name)} --assets tokenizer",
    ]
    if p.dtype == "fp8":  # the names v0.2.2 registers (components/quantization/float8.py register_model_converter)
        lines.append("converters = [" + ", ".join(f'"{c}"' for c in float8_converters(pf)) + "]")
    lines += [
        "", "[training]",
        'dataset = "c4"  # or your dataset registered in torchtitan/datasets; dataset_path for local files',
        f"local_batch_size = {local_batch if p.pp > 1 else p.micro_batch}",
        f"global_batch_size = {p.global_batch}", f"seq_len = {p.seq_len}", "max_norm = 1.0", "steps = 1000",
        'mixed_precision_param = "bfloat16"',
        'mixed_precision_reduce = "float32"',
        "", "[parallelism]", f"data_parallel_replicate_degree = {replicate}",
        f"data_parallel_shard_degree = {shard}",
        f'fsdp_reshard_after_forward = "{reshard}"',
        f"tensor_parallel_degree = {p.tp}",
        f"enable_async_tensor_parallel = {str(p.tp_comm_overlap and p.tp > 1).lower()}",
        f"pipeline_parallel_degree = {p.pp}", f'pipeline_parallel_schedule = "{schedule}"',
        f"pipeline_parallel_microbatch_size = {p.micro_batch}",
    ]
    if p.pp > 1:
        lines.append(f"module_fqns_per_model_part = {model_parts(pf)}")
    if p.cp > 1:  # JobConfig.parallelism.context_parallel_rotate_method (v0.2.2 config/job_config.py)
        lines.append(f'context_parallel_rotate_method = "{p.cp_impl.removeprefix("torch-")}"')
    lines += [f"context_parallel_degree = {p.cp}", f"expert_parallel_degree = {p.ep}",
              f"expert_tensor_parallel_degree = {p.etp_resolved if p.ep > 1 else 1}",
              "", "[compile]", f"enable = {str(bool(compiled_components(p))).lower()}",
              "components = [" + ", ".join(f'"{c}"' for c in compiled_components(p)) + "]",
              "", "[activation_checkpoint]", f'mode = "{AC_MODE[p.recompute]}"']
    if p.recompute == "op":
        lines.append('selective_ac_option = "op"')
    return "\n".join(lines + float8_lines(pf)) + "\n"


GROUPED_MM_FQNS = ["moe.experts"]
"""What torchtitan v0.2.2's Float8GroupedMMConverter converts: the routed experts alone, the MoE layer's
GroupedExperts (models/moe/moe.py MoE.experts; DeepEPMoE and gpt_oss's GptOssMoE keep the name), as llmplan prices
them (their grouped GEMMs in fp8). The converter matches a substring of the module FQN
(components/quantization/float8.py Float8GroupedMMConverter.convert, moe_module_filter_fn: `target_fqn in
cur_fqn`), and torchao's quantize_ swaps every parameter under the first module that matches (pytorch/ao v0.16.0
quantization/quant_api.py _replace_with_custom_fn_if_matches_filter, prototype/moe_training/conversion_utils.py
_swap_params). So v0.2.2's own MoE configs' fqns = ["experts"] (models/deepseek_v3/train_configs/*.toml) also
match layers.N.moe.shared_experts, a FeedForward of nn.Linear: its w1 / w2 / w3 weights become
ScaledGroupedMMTensor, which intercepts torch._grouped_mm only and hands other ops the unwrapped tensor
(prototype/moe_training/tensor.py __torch_function__, __torch_dispatch__), gathering it bf16
(fsdp_pre_all_gather): a conversion llmplan does not price and no one ran here. "moe.experts" names the routed
experts alone (it is no substring of "moe.shared_experts"), so the converted set is the priced one."""


def float8_converters(pf: PlanFile) -> list[str]:
    """v0.2.2's converters for an fp8 plan: Float8Linear for the nn.Linear layers, and for an MoE model the
    routed experts' float8 grouped GEMMs too (their weights are GroupedExperts parameters, which the linear
    converter leaves in bf16, and llmplan prices their GEMMs in the recipe's format: cost.gemm.layer_gemm_seconds).
    Source: pytorch/torchtitan v0.2.2 (73a0e69) components/quantization/float8.py (register_model_converter)."""
    moe = ["quantize.grouped_mm.float8"] if pf.plan.dtype == "fp8" and pf.model.is_moe else []
    return ["quantize.linear.float8"] + moe


def float8_lines(pf: PlanFile) -> list[str]:
    """v0.2.2's [quantize.linear.float8] table for an fp8 plan (torchtitan/config/job_config.py Float8Linear): rowwise
    as recipe_name; per-tensor (no recipe_name: Float8LinearConverter builds the tensorwise config) with FSDP2's float8
    all-gather and its precomputed scale on exactly when the plan keeps fp8_params (llmplan prices the gather at 1 B
    a Float8Linear weight, the shard cast and the step's amax all-reduce: docs/formulas.md#comm.torchao_fp8_gather);
    the output layer, and an MoE model's router gate, left in bf16, as llmplan prices them (torchao_linear_weights)."""
    p, m = pf.plan, pf.model
    if p.dtype != "fp8":
        return []
    skip = ["output", "router.gate"] if m.is_moe else ["output"]
    lines = ["", f"# the quantize tables of torchtitan {LEGACY_VERSION} (config/job_config.py, 73a0e69); 0.3.0 dropped "
             "them for Float8LinearConverter.Config in config functions", "[quantize.linear.float8]"]
    if p.recipe == "rowwise":
        lines.append('recipe_name = "rowwise"')
    else:
        on = str(bool(p.fp8_params)).lower()
        lines += [f"enable_fsdp_float8_all_gather = {on}", f"precompute_float8_dynamic_scale_for_fsdp = {on}"]
    lines.append("filter_fqns = [" + ", ".join(f'"{x}"' for x in skip) + "]")
    if "quantize.grouped_mm.float8" in float8_converters(pf):  # config/job_config.py Float8GroupedMM.fqns
        lines += ["", f"# {LEGACY_VERSION} matches fqns as a substring of a module's FQN "
                  "(\"experts\" would also convert moe.shared_experts): the routed experts only;",
                  "# torchtitan 0.3.0 has no such table (Float8GroupedExpertsConverter.Config converts every "
                  "GroupedExperts, by type)",
                  "[quantize.grouped_mm.float8]", "fqns = [" + ", ".join(f'"{x}"' for x in GROUPED_MM_FQNS) + "]"]
    return lines


def render_legacy(pf: PlanFile) -> dict[str, str]:
    check_legacy(pf)
    return {"torchtitan-v0.2.2.toml": toml_text(pf)}
