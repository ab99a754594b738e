"""check_plan's rules on a training plan's feature switches, as Megatron-Core's TransformerConfig and optimizer
combine them: activation recompute (recompute_layers, op, recompute_modules), precision (fp8 attention, SwiGLU
fp8 input, parameter remainders, the layers and modules kept in bf16), the MoE dispatcher and CUDA graphs, and
activation offload with the host memory it takes; and the switches that act only on a model feature or a plan
axis the plan may lack (MoE switches on a dense model, SWITCH_USES: ZeRO-3's unit without ZeRO-3, ...), so that
a switch the user sets never silently does nothing. RULES in specs/check.py runs them, in this order, after the
expert rules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Collection

import numpy as np

from llmplan.cost.model_states import (bf16_optimizer, fp32_embedding_grads_act, fp32_sum_reduction,
                                       grad_shards_reduce_scattered)
from llmplan.cost.muon import muon_unpriced
from llmplan.cost.memory import inflight_microbatches
from llmplan.cost.offload import fine_grained_host_bytes, host_offload_bytes
from llmplan.cost.runtime_memory import tp_overlap_asked
from llmplan.cost.sparse_gather import fused_csa_priced, reference_dtype
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.plan_choices import MOE_OFFLOAD_MODULES
from llmplan.specs.quantities import param_gather_optstep_axes
from llmplan.specs.rule import Rule, Violation, as_bool
from llmplan.units import GIB


def _absent_bf16_modules(m: ModelSpec, p: Any) -> list[str]:
    """The plan's bf16_modules the model does not have."""
    has = {"attention": m.num_attention_layers > 0, "latent_proj": bool(m.moe_latent_size)}
    return [x for x in p.bf16_modules if not has.get(x, False)]


def _bf16_stage_ok(m: ModelSpec, p: Any) -> Any:
    """Each pinned bf16 layer count within one pipeline stage's share of the layers (num_layers // pp), as
    Megatron-Core's TransformerConfig requires; elementwise over the search's arrays."""
    per_stage = m.num_hidden_layers // p.pp
    return ((p.bf16_layers_start or 0) <= per_stage) & ((p.bf16_layers_end or 0) <= per_stage)


def _release_known(p: Any, c: ClusterSpec) -> bool:
    """The plan names no attention release, or one the cluster's GPU has a published rate for."""
    return p.attention_release is None or p.attention_release in c.system.gpu.attention_release_efficiency


def _release_native(p: Any) -> Any:
    """The plan names no attention release, or runs the native fused kernel (the release is cuDNN's)."""
    return (p.attention_release is None) | (p.flash_attention & (p.attention_kernel == "native"))


def _foreign_modules(m: ModelSpec, p: ParallelPlan) -> list[str]:
    """The plan's recompute_modules that name a kind of layer the model lacks."""
    has = {"mla_up_proj": m.is_mla or bool(m.q_lora_rank), "moe": m.is_moe, "moe_act": m.is_moe,
           "shared_experts": bool(m.shared_ffn), "mhc": m.hc_mult > 1}
    return [x for x in p.recompute_modules if not has.get(x, True)]


def _listed_modules(p: ParallelPlan) -> str:
    """The plan's recompute_modules in words (Megatron-Core's default core_attn where it lists none)."""
    return ", ".join(p.recompute_modules) or "none listed, so Megatron-Core's default core_attn"


def _host_bytes(m: ModelSpec, p: Any, c: ClusterSpec) -> tuple[Any, float]:
    """Offloaded activation bytes per GPU and the host bytes each GPU may take (the node's usable host memory over
    the GPUs used of it; the bytes are priced in cost/offload.py)."""
    usable = c.system.host_usable_bytes
    return host_offload_bytes(m, p), (usable or 0.0) / c.gpus_per_node_used


def _host_fits(m: ModelSpec, p: Any, c: ClusterSpec) -> Any:
    """Offloaded activations of the node's GPUs within the usable host memory (ParallelPlan.offload_layers,
    SystemSpec.host_memory_gb); no offload or an unknown host memory: true. Derived: docs/formulas.md#mem.host"""
    if c.system.host_usable_bytes is None or not np.any(np.asarray(p.offload_layers) > 0):
        return True
    used, share = _host_bytes(m, p, c)
    return (p.pp != 1) | (used <= share)  # with pipeline stages rule offload_pp refuses the plan already


def _host_message(m: ModelSpec, p: ParallelPlan, c: ClusterSpec) -> str:
    used, share = _host_bytes(m, p, c)
    s, g = c.system, c.gpus_per_node_used
    per_layer = float(used) / max(min(p.offload_layers, m.num_hidden_layers), 1)
    most = int(share // per_layer) if per_layer > 0 else p.offload_layers
    fix = (f"offload at most {most} layers (--offload-activations-layers {most})" if most > 0
           else "drop --offload-activations-layers")
    return (f"offloaded activations ({float(used) / GIB:.1f} GiB per GPU, {float(used) * g / GIB:.0f} GiB per node of "
            f"{g} GPUs) exceed host memory ({s.host_memory_gb:g} GB per {s.name} node, "
            f"{s.host_memory_usable_fraction:.0%} usable: {share * g / GIB:.0f} GiB); {fix}, lower --micro-batch, "
            "or set host_memory_gb / host_memory_usable_fraction in a --hardware profile")


def _fine_grained_host(m: ModelSpec, p: Any, c: ClusterSpec) -> tuple[Any, float]:
    """Fine-grained offload's host bytes per GPU (first stage) and the host bytes each GPU may take."""
    usable = c.system.host_usable_bytes
    return fine_grained_host_bytes(m, p, inflight_microbatches(p, 0)), (usable or 0.0) / c.gpus_per_node_used


def _fine_grained_host_fits(m: ModelSpec, p: Any, c: ClusterSpec) -> Any:
    """Fine-grained offload of the node's GPUs within the usable host memory (ParallelPlan.offload_modules,
    offload_moe_act); none or an unknown host memory: true. Derived: docs/formulas.md#mem.host"""
    if c.system.host_usable_bytes is None or not p.fine_grained_offload_modules:
        return True
    used, share = _fine_grained_host(m, p, c)
    return used <= share


def _fine_grained_host_message(m: ModelSpec, p: ParallelPlan, c: ClusterSpec) -> str:
    used, share = _fine_grained_host(m, p, c)
    s, g = c.system, c.gpus_per_node_used
    return (
        f"fine-grained offload of {', '.join(p.fine_grained_offload_modules)} ({float(used) / GIB:.1f} GiB per GPU, "
        f"{float(used) * g / GIB:.0f} GiB per node of {g} GPUs) exceeds host memory ({s.host_memory_gb:g} GB per "
        f"{s.name} node, {s.host_memory_usable_fraction:.0%} usable: {share * g / GIB:.0f} GiB); offload fewer "
        "modules (--offload-modules, --offload-moe-act), lower --micro-batch, or set host_memory_gb / "
        "host_memory_usable_fraction in a --hardware profile"
    )


MOE_SWITCHES = ("expert_gemm", "moe_dispatcher", "moe_routing", "moe_dispatch_sms", "moe_flex_backend",
                "moe_capacity_factor", "ep_comm_overlap", "delay_wgrad", "offload_moe_act",
                "ep_dispatch_fp8", "moe_router_fusion", "moe_router_padding", "moe_paged_stash",
                "moe_rank_capacity_factor")
"""The training switches that act on expert layers only (rule moe_switches_dense)."""


def _static_budget(p: Any) -> Any:
    """Whether the plan's MoE layers carry Megatron-Core's static per-rank budget: dropless, in a full-iteration
    graph."""
    return (p.cuda_graphs == "full-iteration") & (p.moe_capacity_factor is None)


_FULL_ITERATION_ADVICE = ("use --train-cuda-graphs full-iteration (a plan file's cuda_graphs key) without "
                          "--moe-capacity-factor, or drop")
"""The fix both static-budget rules give (paged_stash_budget, rank_capacity_budget), followed by the plan's flag."""


def _moe_offloads(p: Any) -> tuple[str, ...]:
    """The plan's offload_modules whose groups sit in an MoE layer's MLP (plan_choices.MOE_OFFLOAD_MODULES)."""
    return tuple(x for x in p.offload_modules if x in MOE_OFFLOAD_MODULES)


def _original_input_modules(m: ModelSpec, p: Any) -> dict[str, Any]:
    """The plan's switches on which Megatron-Core sets Transformer Engine's save_original_input (moe_act recompute
    and the expert_fc1 offload on an MoE model, layernorm recompute on MLA or on MoE layers with a shared expert
    not itself recomputed), each with whether it does (per plan of an array)."""
    shared = m.is_moe and bool(m.shared_ffn)
    return {"recompute module moe_act": p.recomputes("moe_act") & m.is_moe,
            "recompute module layernorm": p.recomputes("layernorm")
            & (m.is_mla or (shared & np.logical_not(p.recomputes("shared_experts")))),
            "offload module expert_fc1": m.is_moe and "expert_fc1" in p.offload_modules}


def _delayed_original_input_ok(m: ModelSpec, p: Any) -> Any:
    """False where fp8 delayed scaling meets a module Megatron-Core gives save_original_input."""
    if not (p.dtype == "fp8" and p.recipe == "tensorwise" and p.fp8_scaling == "delayed"):
        return True
    hit: Any = False
    for v in _original_input_modules(m, p).values():
        hit = hit | v
    return np.logical_not(hit)


def _delayed_original_input_names(m: ModelSpec, p: ParallelPlan) -> str:
    return ", ".join(k for k, v in _original_input_modules(m, p).items() if as_bool(v))


def _graphed_norms(m: ModelSpec, p: Any) -> list[str]:
    """The plan's norm offloads that cuda_graphs layers makes Megatron drop: attn_norm (the attn graph starts at
    the layer's input), mlp_norm in an MoE model (attn and moe_router graphed, the MLP of its dense layers not)."""
    mods = p.fine_grained_offload_modules
    return [x for x in ("attn_norm", "mlp_norm") if x in mods and (x == "attn_norm" or m.is_moe)]


def _graphed_dropout(m: ModelSpec, p: Any) -> dict[str, Any]:
    """Per selective recompute module captured in a CUDA graph whose forward draws dropout: whether the plan
    recomputes it (elementwise over recompute_code; cuda_graphs is one value per check)."""
    full, layers = p.cuda_graphs == "full-iteration", p.cuda_graphs == "layers"
    return {"core_attn": (full or layers) and m.attention_dropout > 0 and p.recomputes("core_attn"),
            "mlp": (full or (layers and not m.is_moe)) and m.hidden_dropout > 0 and p.recomputes("mlp"),
            "moe": full and m.hidden_dropout > 0 and p.recomputes("moe")}


def _graphed_dropout_ok(m: ModelSpec, p: Any) -> Any:
    hit = _graphed_dropout(m, p)
    return np.logical_not(np.logical_or.reduce([np.asarray(v, dtype=bool) for v in hit.values()]))


def _graphed_dropout_names(m: ModelSpec, p: Any) -> str:
    return ", ".join(k for k, v in _graphed_dropout(m, p).items() if np.any(v))


def _setting(p: Any, field: str) -> str:
    """A switch as a message names it: the field alone when on (ep_comm_overlap), else with its value."""
    value = getattr(p, field)
    return field if value is True else f"{field} {value}"


def _moe_switches(p: Any) -> list[str]:
    """The plan's MoE switches set away from their defaults (a workload's fields: one value for every plan)."""
    return [_setting(p, f) for f in MOE_SWITCHES if getattr(p, f) != ParallelPlan.model_fields[f].default]


def _flags(names: list[str]) -> str:
    """The command-line flags of switch settings ("expert_gemm per-expert" -> --expert-gemm)."""
    return ", ".join("--" + x.split()[0].replace("_", "-") for x in names)


def _dense_message(m: ModelSpec, names: list[str]) -> str:
    return (f"{', '.join(names)}: {'these switches act' if len(names) > 1 else 'it acts'} on mixture-of-experts "
            f"layers, and {m.name} is dense; drop {_flags(names)}")


@dataclass(frozen=True)
class SwitchUse:
    """A switch that acts only on plans with some axis (ZeRO-3, TP with sequence parallelism, pipeline stages,
    expert parallelism); on any other plan it changes nothing. check_plan refuses a plan that sets it without
    the axis (rule `name`), so estimate and export never take it silently. The search holds the switch for
    every plan it enumerates: it keeps the plans without the axis, priced as they are (the switch does nothing
    there), and gives them the switch's default (settle); it refuses only when none of its plans has the axis
    (search.run)."""

    name: str
    """The check_plan rule's name."""
    fields: tuple[str, ...]
    """The ParallelPlan fields of the switch."""
    uses: Callable[[Any], Any]
    """Elementwise over plans: the plan has the axis the switch acts on."""
    message: Callable[[Any], str]
    """What is wrong, the values, the rule and the fix, for one plan that sets the switch without the axis."""
    moe: bool = False
    """The switch acts on expert layers: on a dense model rule moe_switches_dense refuses it instead."""

    def given(self, p: Any) -> bool:
        """The switch is set away from its ParallelPlan default (a workload field: one value for every plan)."""
        return any(getattr(p, f) != ParallelPlan.model_fields[f].default for f in self.fields)

    def rule(self) -> Rule:
        return Rule(self.name, lambda m, p, c: (self.moe and not m.is_moe) | (not self.given(p))
                    | as_bool(self.uses(p)),
                    lambda m, p, c: self.message(p))


def _tp_sp(p: Any) -> Any:
    return (p.tp > 1) & as_bool(p.sp)


def _fp8_tensorwise(p: Any) -> bool:
    return p.dtype == "fp8" and p.recipe == "tensorwise"


SWITCH_USES: tuple[SwitchUse, ...] = (
    # the flex backend is the kernels of the deepep (flex) dispatcher: Megatron-Core reads
    # moe_flex_dispatcher_backend only in MoEFlexTokenDispatcher (NVIDIA/Megatron-LM d98e8a64dd
    # megatron/core/transformer/moe/token_dispatcher.py); named on an alltoall plan it asks for nothing
    SwitchUse("moe_flex_backend_deepep", ("moe_flex_backend",), lambda p: p.moe_dispatcher == "deepep",
              lambda p: f"moe_flex_backend {p.moe_flex_backend} with moe_dispatcher {p.moe_dispatcher}: the "
                        "backend is the kernels of the deepep (flex) dispatcher (Megatron "
                        "moe_flex_dispatcher_backend); the alltoall dispatcher runs NCCL's all-to-all; add "
                        "--moe-dispatcher deepep or drop --moe-flex-backend", moe=True),
    # NVIDIA/Megatron-LM core_v0.14.0 megatron/training/arguments.py validate_args (and megatron/core/optimizer
    # at d98e8a6): the flag asserts the distributed optimizer, --overlap-param-gather and interleaving
    SwitchUse("param_gather_optstep_interleaved", ("overlap_param_gather_with_optimizer_step",),
              param_gather_optstep_axes,
              lambda p: f"overlap_param_gather_with_optimizer_step with zero {p.zero}, overlap_param_gather "
                        f"{p.overlap_param_gather}, pp {p.pp}, vpp {p.vpp}: Megatron-LM asserts the distributed "
                        "optimizer, --overlap-param-gather and an interleaved pipeline for it; use --zero 1 "
                        "--overlap-param-gather with pp > 1 and vpp > 1, or set "
                        "overlap_param_gather_with_optimizer_step false in the plan"),
    SwitchUse("zero3_unit_zero", ("zero3_unit",), lambda p: p.zero == 3,
              lambda p: f"zero3_unit {p.zero3_unit} with zero {p.zero}: the unit is what one ZeRO-3 collective "
                        "gathers, and only ZeRO-3 gathers the weights (stages 1 and 2 keep them whole); use "
                        "--zero 3 or drop --zero3-unit"),
    SwitchUse("megatron_fsdp_zero", ("megatron_fsdp",), lambda p: (p.zero >= 2) & (p.pp == 1),
              lambda p: f"megatron_fsdp with zero {p.zero}, pp {p.pp}: Megatron-FSDP's buckets are priced for its "
                        "sharded gradients (zero 2 or 3) without a pipeline (Megatron-LM's and Megatron-Bridge's "
                        "exports refuse ZeRO-2 under one); use --zero 2 or 3 with --pp 1, or drop --megatron-fsdp"),
    SwitchUse("zero3_copy_out_zero", ("zero3_copy_out",), lambda p: (p.zero == 3) & (p.dp * p.cp > 1),
              lambda p: f"zero3_copy_out with zero {p.zero}, dp {p.dp}, cp {p.cp}: it copies each ZeRO-3 "
                        "all-gather into the parameters, so it acts only with zero 3 over more than one rank; use "
                        "--zero 3 with dp or cp > 1, or drop --zero3-copy-out"),
    SwitchUse("rope_complex_fused", ("rope_complex",), lambda p: p.fused_kernels & p.rope_fusion,
              lambda p: "rope_complex with fused_kernels or rope_fusion off: it says torch.compile leaves a complex "
                        "rotary eager, so it acts only where the rotary is fused; set fused_kernels and "
                        "rope_fusion true in the plan, or drop --rope-complex"),
    SwitchUse("norm_kernel_fused", ("norm_kernel",), lambda p: p.fused_kernels,
              lambda p: f"norm_kernel {p.norm_kernel} with fused_kernels off: it says which fused kernel runs the "
                        "norms' backward, so it acts only with fused kernels (unfused norms are priced as their "
                        "eager ops); set fused_kernels true in the plan, or drop --norm-kernel"),
    SwitchUse("jit_activation_fused", ("jit_activation",), lambda p: p.fused_kernels,
              lambda p: "jit_activation with fused_kernels off: it prices the gated activation as Megatron-Core's "
                        "jit_fuser kernel (bias_activation_fusion), which runs only with fused kernels (unfused, the "
                        "activation is priced as its eager ops); set fused_kernels true, or jit_activation false, in "
                        "the plan"),
    SwitchUse("softmax_kernel_unfused", ("softmax_kernel",), lambda p: ~as_bool(p.flash_attention),
              lambda p: f"softmax_kernel {p.softmax_kernel} with flash_attention on: it says how an unfused attention "
                        "runs its softmax over the scores, which a fused attention kernel never writes; set "
                        "flash_attention false in the plan (--no-flash-attention), or drop --softmax-kernel"),
    SwitchUse("fp8_scaling_tensorwise", ("fp8_scaling",), lambda p: (p.dtype == "fp8") & (p.recipe == "tensorwise"),
              lambda p: f"fp8_scaling {p.fp8_scaling} with dtype {p.dtype} and recipe {p.recipe}: it says how the "
                        "per-tensor fp8 recipe finds each cast's scale (amax history or an amax pass), so it acts "
                        "only with fp8 tensorwise; use --precision fp8-tensorwise, or drop --fp8-scaling"),
    SwitchUse("fp32_param_shards_zero", ("fp32_param_shards",), lambda p: (p.zero == 3) & (p.dtype != "fp32"),
              lambda p: f"fp32_param_shards with zero {p.zero} and dtype {p.dtype}: FSDP's fp32 parameter shard, "
                        "gathered in the compute dtype, exists only where ZeRO-3 shards the parameters of a "
                        "mixed-precision run (stages 0-2 keep whole 16-bit weights beside the optimizer's master; "
                        "fp32 training has no other copy); use --zero 3 with a 16-bit --dtype, or drop "
                        "--fp32-param-shards"),
    # (and, with expert TP, which grouped GEMM path the experts take: cost.compute.runs_per_expert; the rule reads
    # no model, so a dense model's tp > 1 without sp, whose etp is its tp, keeps it unrefused)
    # and, under fp8 per-tensor scaling, whether the linears are torchao's Float8Linear (dtensor) or Transformer
    # Engine's (docs/formulas.md#precision.torchao_saved_input), which acts at any tp
    SwitchUse("tp_impl_tp", ("tp_impl",), lambda p: _tp_sp(p) | (p.etp_resolved > 1) | _fp8_tensorwise(p),
              lambda p: f"tp_impl {p.tp_impl} with tp {p.tp} and sp {'on' if p.sp else 'off'}: it sets which input "
                        "the sequence-parallel linears keep for backward (and, with fp8 tensorwise, whose fp8 "
                        "linears run), so it acts only with tp > 1 and sequence parallelism, expert tp > 1 or fp8 "
                        "tensorwise; use --tp 2 or more with --sp, or drop --tp-impl"),
    SwitchUse("torchao_saves_hp_input_tp1", ("torchao_saves_hp_input",),
              lambda p: _fp8_tensorwise(p) & (p.tp_impl == "dtensor") & (p.tp == 1),
              lambda p: f"torchao_saves_hp_input {p.torchao_saves_hp_input} with dtype {p.dtype}, recipe {p.recipe}, "
                        f"tp_impl {p.tp_impl}, tp {p.tp}: it says whether torchao's per-tensor Float8Linear saves "
                        "its bf16 input (v0.9.0 on) or its fp8 copy, so it acts only with fp8 tensorwise, tp_impl "
                        "dtensor and tp 1 (float8 TP saves the fp8 copy at tp > 1); set those, or drop it"),
    # which fused loss Megatron-Core runs (ParallelPlan.fused_loss_impl): its TP collectives
    # (docs/formulas.md#comm.tp_edge); Megatron-Core's loss only, so not under DTensor TP (torchtitan, AutoModel)
    SwitchUse("fused_loss_impl_fused", ("fused_loss_impl",), lambda p: p.fused_loss & (p.tp_impl == "megatron"),
              lambda p: f"fused_loss_impl {p.fused_loss_impl} with fused_loss {'on' if p.fused_loss else 'off'} and "
                        f"tp_impl {p.tp_impl}: it picks which of Megatron-Core's fused cross-entropy losses runs "
                        "(cross_entropy_fusion_impl), so it acts only with fused_loss on the Megatron-Core stack; "
                        "use --fused-loss with --tp-impl megatron, or drop --fused-loss-impl"),
    # which unfused loss runs (ParallelPlan.unfused_loss_impl): its memory (docs/formulas.md#mem.activations)
    SwitchUse("unfused_loss_impl_unfused", ("unfused_loss_impl",), lambda p: ~as_bool(p.fused_loss),
              lambda p: f"unfused_loss_impl {p.unfused_loss_impl} with fused_loss on: it picks which unfused "
                        "cross entropy runs (PyTorch's eager one or Megatron's vocab-parallel one), so it acts only "
                        "with fused_loss off; use --unfused-loss, or drop --unfused-loss-impl"),
    SwitchUse("cp_impl_cp", ("cp_impl",), lambda p: p.cp > 1,
              lambda p: f"cp_impl {p.cp_impl} with cp {p.cp}: it sets how the context-parallel ring passes K/V "
                        "between ranks, so it acts only with cp > 1; use --cp 2 or more, or drop --cp-impl"),
    SwitchUse("cp_comm_type_te", ("cp_comm_type",), lambda p: (p.cp > 1) & (p.cp_impl == "te"),
              lambda p: f"cp_comm_type {p.cp_comm_type} with cp {p.cp} and cp_impl {p.cp_impl}: it picks which of "
                        "Transformer Engine's context-parallel attentions runs, so it acts only with cp > 1 and "
                        "cp_impl te; use --cp 2 or more with --cp-impl te, or drop --cp-comm-type"),
    SwitchUse("cp_a2a_size_hierarchical", ("cp_a2a_size",),
              lambda p: (p.cp > 1) & (p.cp_impl == "te") & (p.cp_comm_type == "a2a+p2p"),
              lambda p: f"cp_a2a_size {p.cp_a2a_size} with cp {p.cp}, cp_impl {p.cp_impl} and cp_comm_type "
                        f"{p.cp_comm_type}: it sizes the a2a level of Transformer Engine's hierarchical a2a+p2p, so it "
                        "acts only with cp > 1, cp_impl te and cp_comm_type a2a+p2p; set those (--cp-comm-type "
                        "a2a+p2p) or drop --cp-a2a-size"),
    SwitchUse("cp_kv_repeated_ring", ("cp_kv_repeated",), lambda p: (p.cp > 1) & (p.cp_impl != "te"),
              lambda p: f"cp_kv_repeated with cp {p.cp} and cp_impl {p.cp_impl}: it sets how many heads PyTorch's "
                        "context-parallel ring passes, so it acts only with cp > 1 and cp_impl torch-allgather or "
                        "torch-alltoall (Transformer Engine's ring moves the KV heads); set those or drop "
                        "--cp-kv-repeated"),
    SwitchUse("cp_comm_overlap_ring", ("cp_comm_overlap",), lambda p: (p.cp > 1) & (p.cp_impl != "te"),
              lambda p: f"cp_comm_overlap off with cp {p.cp} and cp_impl {p.cp_impl}: it says whether PyTorch's "
                        "context-parallel ring waits for its transfers where it issues them, so it acts only with "
                        "cp > 1 and cp_impl torch-allgather or torch-alltoall; set those or drop "
                        "--no-cp-comm-overlap"),
    SwitchUse("tp_comm_overlap_sp", ("tp_comm_overlap",), _tp_sp,
              lambda p: f"tp_comm_overlap with tp {p.tp} and sp {'on' if p.sp else 'off'}: it overlaps the "
                        "sequence-parallel all-gathers and reduce-scatters with the GEMMs (Megatron's "
                        "--tp-comm-overlap needs --sequence-parallel), so it acts only with tp > 1 and sequence "
                        "parallelism; use --tp 2 or more with --sp, or drop --tp-comm-overlap"),
    SwitchUse("tp_overlap_sms_ub", ("tp_overlap_sms", "tp_overlap_margin_sms"),
              lambda p: (p.tp_impl == "megatron") & as_bool(p.tp_comm_overlap) & _tp_sp(p),
              lambda p: f"tp_overlap_sms / tp_overlap_margin_sms with tp_comm_overlap "
                        f"{'on' if p.tp_comm_overlap else 'off'}, tp {p.tp}, sp {'on' if p.sp else 'off'}, tp_impl "
                        f"{p.tp_impl}: they set the SMs Transformer Engine's userbuffers take from the overlapped "
                        "TP GEMMs, so they act only with tp_comm_overlap, tp > 1, sp and tp_impl megatron; set "
                        "those (--tp-comm-overlap) or remove them from the plan file"),
    SwitchUse("pp_scatter_gather_pp", ("pp_scatter_gather",), lambda p: (p.pp > 1) & (p.tp > 1) & ~as_bool(p.sp),
              lambda p: f"pp_scatter_gather with tp {p.tp}, pp {p.pp}, sp {'on' if p.sp else 'off'}: it splits "
                        "a stage's output over the TP ranks for the send to the next stage, so it acts only with "
                        "pp > 1, tp > 1 and no sequence parallelism (whose output is already split); change those "
                        "or drop --pp-scatter-gather"),
    SwitchUse("kept_grad_shards_zero", ("kept_grad_shards",),
              grad_shards_reduce_scattered,
              lambda p: f"kept_grad_shards with zero {p.zero}, grad_reduce {p.grad_reduce}: it keeps the gradient "
                        "shards a distributed optimizer's reduce-scatter writes (Apex DistributedFusedAdam) beside "
                        "the whole gradient buffer, so it acts only with zero 1 and grad_reduce reduce-scatter (under "
                        "zero 2 the shard is the gradient already priced); use --zero 1 with --grad-reduce "
                        "reduce-scatter, or drop --kept-grad-shards"),
    SwitchUse("fp32_embedding_grads_zero", ("fp32_embedding_grads",),
              fp32_embedding_grads_act,
              lambda p: f"fp32_embedding_grads with zero {p.zero}, grad_reduce {p.grad_reduce}, grad_dtype "
                        f"{p.grad_dtype}, pp_schedule {p.pp_schedule}: it keeps the embeddings' gradients in fp32 "
                        "buckets of Apex DistributedFusedAdam beside 2-byte ones, as NeMo 1.x ran it, so it acts "
                        "only with zero 1, grad_reduce reduce-scatter, 2-byte gradients and one stage a rank (NeMo "
                        "1.x never ran DualPipe); use --zero 1 with --grad-reduce reduce-scatter, --grad-dtype bf16 "
                        "and --pp-schedule 1f1b or zero-bubble, or drop --fp32-embedding-grads"),
    SwitchUse("grad_reduce_dtype_bf16_optimizer", ("grad_reduce_dtype",), bf16_optimizer,
              lambda p: f"grad_reduce_dtype {p.grad_reduce_dtype} with optimizer {p.optimizer}, dtype {p.dtype}, "
                        f"grad_dtype {p.grad_dtype}, zero {p.zero}, grad_reduce {p.grad_reduce}, grad_accumulation "
                        f"{p.grad_accumulation}: a bf16 reduction of fp32-accumulated gradients is DeepSpeed's "
                        "BF16_Optimizer's (its communication_data_type bf16), so it acts only with optimizer adam, "
                        "dtype bf16, grad_dtype fp32, zero 1, grad_reduce all-reduce and grad_accumulation cast-add; "
                        "set those, or drop --grad-reduce-dtype (with --grad-dtype bf16 the gradients are already "
                        "reduced in bf16)"),
    SwitchUse("grad_reduce_fp32_sum_rs", ("grad_reduce_fp32_sum",), fp32_sum_reduction,
              lambda p: f"grad_reduce_fp32_sum with zero {p.zero}, grad_reduce {p.grad_reduce}, grad_dtype "
                        f"{p.grad_dtype}, dtype {p.dtype}, megatron_fsdp {p.megatron_fsdp}, dp_replicate "
                        f"{p.dp_replicate}, optimizer {p.optimizer}: Megatron-Core's "
                        "reduce_scatter_with_fp32_accumulation replaces the distributed optimizer's reduce-scatter "
                        "of 16-bit gradients (Megatron-LM turns it off under fp32 gradients, asserts one optimizer "
                        "instance, and runs Muon without the distributed optimizer), so it acts only with zero 1, "
                        "grad_reduce reduce-scatter, 2-byte gradients, no megatron_fsdp, dp_replicate 1 and not "
                        "Muon; use --zero 1 --grad-reduce reduce-scatter --grad-dtype bf16 --optimizer adam, or "
                        "drop --grad-reduce-fp32-sum"),
    SwitchUse("pp_blocking_sends_pp", ("pp_blocking_sends",), lambda p: p.pp > 1,
              lambda p: f"pp_blocking_sends with pp {p.pp}: it makes the sends between pipeline stages wait, so it "
                        "acts only with pp > 1; use --pp 2 or more or drop --pp-blocking-sends"),
    SwitchUse("pp_unbatched_sends_1f1b", ("pp_unbatched_sends",),
              lambda p: (p.pp > 1) & (p.vpp == 1) & (p.pp_schedule == "1f1b"),
              lambda p: f"pp_unbatched_sends with pp {p.pp}, vpp {p.vpp}, pp_schedule {p.pp_schedule}: it "
                        "serialises the sends of a non-interleaved 1F1B schedule (DeepSpeed's pipeline engine), so "
                        "it acts only with pp > 1, vpp 1 and pp_schedule 1f1b; use --pp 2 or more with --vpp 1 "
                        "and --pp-schedule 1f1b, or drop --pp-unbatched-sends"),
    SwitchUse("pp_schedule_pp", ("pp_schedule",), lambda p: p.pp > 1,
              lambda p: f"pp_schedule {p.pp_schedule} with pp {p.pp}: a pipeline schedule orders the micro-batches "
                        "over several stages; use --pp 2 or more or drop --pp-schedule"),
    SwitchUse("ep_comm_overlap_ep", ("ep_comm_overlap",), lambda p: p.ep > 1,
              lambda p: f"ep_comm_overlap with ep {p.ep}: it hides the expert-parallel all-to-alls, which run "
                        "only with ep > 1 (a mixture-of-experts model's experts over several ranks); raise --ep or "
                        "drop --ep-comm-overlap", moe=True),
    SwitchUse("delay_wgrad_ep_overlap", ("delay_wgrad",), lambda p: (p.ep > 1) & p.ep_comm_overlap,
              lambda p: f"delay_wgrad with ep {p.ep}{'' if p.ep_comm_overlap else ' and no ep_comm_overlap'}: it "
                        "defers the weight gradients for the EP overlap's backward all-to-alls, and Megatron-Core "
                        "asserts overlap_moe_expert_parallel_comm with it (TransformerConfig); add --ep-comm-overlap "
                        "with --ep 2 or more, or drop --delay-wgrad", moe=True),
    # Megatron-Core TransformerConfig.__post_init__ at cd4afffa6: "fp8/fp4 must be specified when
    # moe_router_padding_for_quantization is True" (llmplan prices no allgather dispatcher, which it also refuses)
    SwitchUse("moe_router_padding_quant", ("moe_router_padding",),
              lambda p: p.low_precision,
              lambda p: f"moe_router_padding with dtype {p.dtype}: Megatron-Core pads the routing map to the fp8 / "
                        "fp4 GEMM alignment and refuses it without fp8 / fp4 (TransformerConfig); use --precision "
                        "fp8-* / mxfp8 / nvfp4, or drop --moe-router-padding", moe=True),
    SwitchUse("moe_routing_ep", ("moe_routing",), lambda p: p.ep > 1,
              lambda p: f"moe_routing {p.moe_routing} with ep {p.ep}: the routing sets how many expert-parallel "
                        "ranks a token's copies reach, so it acts only with ep > 1; raise --ep or drop "
                        "--moe-routing", moe=True),
)
"""The switches that act only on plans with some axis, each with its check_plan rule (SwitchUse)."""


def unused_switches(plan: ParallelPlan) -> dict[str, Any]:
    """The switches of SWITCH_USES that `plan` sets but does nothing with, each at its default (field -> value)."""
    return {f: ParallelPlan.model_fields[f].default for u in SWITCH_USES
            if u.given(plan) and not bool(u.uses(plan)) for f in u.fields}


def asks_for(p: Any, field: str, named: Collection[str]) -> bool:
    """The user named switch `field` (in `named`) with a value that asks for something (not off, not unset; for
    a switch on by default, off: --no-cp-comm-overlap asks for the waited ring, --cp-comm-overlap for nothing)."""
    value = getattr(p, field)
    if ParallelPlan.model_fields[field].default is True:
        return field in named and value is False
    return field in named and value is not False and value is not None


def named_switch_violations(m: ModelSpec, plan: ParallelPlan, named: Collection[str]) -> list[Violation]:
    """The rules above on the switches the user named (`named`: ParallelPlan fields given on the command line),
    at whatever value, the default included: --zero3-unit layer with --zero 1, --expert-gemm grouped on a dense
    model ask for something the plan does not do, which check_plan, seeing only values away from the defaults,
    cannot tell. A switch turned off (--no-ep-comm-overlap) asks for nothing: never refused here."""
    def asks(f: str) -> bool:
        return asks_for(plan, f, named)

    dense = [_setting(plan, f) for f in MOE_SWITCHES if asks(f)] if not m.is_moe else []
    out = [Violation("moe_switches_dense", _dense_message(m, dense))] if dense else []
    return out + [Violation(u.name, u.message(plan)) for u in SWITCH_USES
                  if not (u.moe and not m.is_moe) and any(asks(f) for f in u.fields) and not bool(u.uses(plan))]


def settle(plan: ParallelPlan) -> ParallelPlan:
    """`plan` with every switch of SWITCH_USES that does nothing on it at its default: the same plan, priced the
    same, that keeps check_plan's rules on those switches (the search's plans, a published run's stack-wide
    settings)."""
    reset = unused_switches(plan)
    return plan.model_copy(update=reset) if reset else plan


def _fp8_params_low(p: Any) -> Any:
    """Rule fp8_params_dtype: fp8_params only with an fp8 / fp4 recipe."""
    return (not p.fp8_params) | p.low_precision


def _fp8_params_per_tensor(p: Any) -> Any:
    """Rule fp8_params_rowwise: fp8_params not with torchao's rowwise recipe (no float8 all-gather for it)."""
    return (not p.fp8_params) | (p.recipe != "rowwise")


def _fp8_params_gathered(p: Any) -> Any:
    """Rule torchao_fp8_params_gather: fp8_params on torchao's per-tensor Float8Linear (fp8 tensorwise, tp_impl
    dtensor) only where FSDP2's float8 all-gather runs (zero >= 2 over more than one shard rank): torchao keeps
    no fp8 weight anywhere else. Derived: docs/formulas.md#mem.torchao_fp8_shard"""
    torchao = (p.dtype == "fp8") & (p.recipe == "tensorwise") & (p.tp_impl == "dtensor")
    return (not p.fp8_params) | (not torchao) | ((p.zero >= 2) & (p.zero_shard > 1))


def _dtensor_recipe_ok(p: Any) -> Any:
    """Rule dtensor_recipe: on the PyTorch-native stack (tp_impl dtensor) low precision only in torchao's float8
    recipes llmplan models (tensorwise, rowwise: cost.quantize.torchao_float8)."""
    return (not p.low_precision) | (p.tp_impl != "dtensor") | (p.recipe in ("tensorwise", "rowwise"))


def _dtensor_recipe_message(p: Any) -> str:
    """Rule dtensor_recipe's line: what runs the recipe on the PyTorch-native stack, and the fix."""
    if p.recipe == "blockwise":
        what = ("block scaling (1x128 activation / 128x128 weight tiles) is torchao's prototype "
                "Float8BlockwiseLinear (torchao.prototype.blockwise_fp8_training), for which torchtitan has no "
                "converter and whose casts and saved tensors llmplan does not model")
    else:
        what = ("torchao's converters run it (torchtitan's quantize.linear.mx / quantize.grouped_mm.mx, "
                "MXFP8LinearConverter in 0.3.0), whose casts and saved tensors llmplan does not model and no "
                "torchtitan export writes")
    return (f"recipe {p.recipe} ({p.dtype}) with tp_impl {p.tp_impl}: on the PyTorch-native stack {what}; use "
            "--tp-impl megatron (Transformer Engine's recipe, export to megatron), or --precision fp8-rowwise / "
            "fp8-tensorwise")


def _fp8_params_adam(p: Any) -> Any:
    """Rule muon_fp8_params: fp8_params not with Muon's layer-wise optimizer."""
    return (p.optimizer != "muon") | (not p.fp8_params)


def fp8_params_allowed(plan: ParallelPlan) -> bool:
    """Whether check_plan's rules that read fp8_params with the workload's switches alone (dtype, recipe,
    optimizer: fp8_params_dtype, fp8_params_rowwise, muon_fp8_params; none reads the model or an axis) let
    `plan` turn fp8_params on: what search.run.switch_variants tries. torchao_fp8_params_gather reads the axes
    (zero, the shard ranks): the search prunes the plans it cuts, and cli.search skips a tried setting it cuts
    whole."""
    on = plan.model_copy(update={"fp8_params": True})
    return all(bool(ok(on)) for ok in (_fp8_params_low, _fp8_params_per_tensor, _fp8_params_adam))


MEGATRON_FSDP_UNITS = ("Megatron-FSDP gathers and frees whole decoder layers (its FSDP units, Megatron-LM's "
                       "mcore_fsdp_adapter.py), while the per-tensor unit is DeepSpeed's stage 3 of 2021")
"""Why rule megatron_fsdp_unit refuses the per-tensor unit beside megatron_fsdp (also `search --target megatron`'s
pre-check, cli.search.train_search)."""

UB_UNSUPPORTED_RECIPES = ("blockwise", "nvfp4")
"""Recipes whose quantised tensors Transformer Engine's userbuffers cannot all-gather:
fill_userbuffers_buffer_for_all_gather handles per-tensor fp8 (Float8Quantizer, Float8CurrentScalingQuantizer)
and MXFP8Quantizer and raises "Unsupported quantizer for Userbuffers" for any other (Float8BlockQuantizer,
NVFP4Quantizer), so Megatron-Core's --tp-comm-overlap with sequence parallelism fails at the first overlapped
gather. Source: NVIDIA/TransformerEngine transformer_engine/pytorch/module/base.py
(fill_userbuffers_buffer_for_all_gather) at v2.5, v2.8, v2.14, v2.16.1 and v2.17.1 (earlier releases not read).
v2.17 adds an opt-in cuBLASMp backend (initialize_ub with_cublasmp) that skips the check, which Megatron-LM
(d98e8a64dd) never passes. Megatron-Bridge's NVFP4 Llama presets set tp_comm_overlap False
(scripts/performance/configs/llama/llama3_llm_pretrain.py v0.3.0 - v0.5.0)."""


def _ub_recipe_ok(p: Any) -> Any:
    """Rule tp_comm_overlap_recipe: no userbuffer TP overlap of a recipe TE's userbuffers cannot gather."""
    bad = p.low_precision and p.recipe in UB_UNSUPPORTED_RECIPES
    return ~as_bool(bad & (p.tp_impl == "megatron") & as_bool(p.tp_comm_overlap) & _tp_sp(p))


def _head_ub_ok(m: ModelSpec, p: Any) -> Any:
    """Rule fp8_output_proj_tp_overlap: no MXFP8 output layer where userbuffers still carry TP on its stage.
    TELMHeadColumnParallelLinear passes tp_comm_buffer_name None to TELinear, whose __init__ asserts a buffer name
    whenever config.tp_comm_overlap is set (`assert tp_comm_buffer_name is not None, "Buffer name should be set
    to configure communication overlap settings"`): refused where the Megatron-LM export writes --tp-comm-overlap
    (tp_overlap_asked: tp_comm_overlap, sp, tp > 1). An MLA model's attention has already
    turned the shared config's tp_comm_overlap off when gpt_model builds the head after the decoder
    (mla_turns_tp_overlap_off), so it passes. Source: NVIDIA/Megatron-LM d98e8a6
    megatron/core/extensions/transformer_engine.py (TELinear.__init__, TELMHeadColumnParallelLinear),
    models/gpt/gpt_model.py; 3f6a2ed844 likewise. Derived: docs/formulas.md#compute.fp8_output_proj"""
    if not p.fp8_output_proj or m.is_mla:
        return True
    return ~as_bool(tp_overlap_asked(p))


SWITCH_RULES: tuple[Rule, ...] = (
    Rule("mtp_layers", lambda m, p, c: (p.mtp_layers is None) or p.mtp_layers <= m.num_nextn_predict_layers,
         lambda m, p, c: f"mtp_layers {p.mtp_layers} exceeds the {m.num_nextn_predict_layers} multi-token-prediction "
                         f"module{'s' * (m.num_nextn_predict_layers != 1)} of {m.name} "
                         "(num_nextn_predict_layers); use --mtp-layers "
                         + (f"0 to {m.num_nextn_predict_layers}" if m.num_nextn_predict_layers else "0 or drop it")),
    # Megatron-FSDP (2a75ac12c megatron_fsdp.py _grad_acc) copies into the bucket only where the gradient
    # buffer is sharded; unsharded, it adds (main_grad.add_: grad_accumulation add)
    Rule("grad_accumulation_copy", lambda m, p, c: (p.grad_accumulation != "copy") | (p.zero >= 2),
         lambda m, p, c: f"grad_accumulation copy with zero {p.zero}: the copy into the reduce-scatter's bucket is "
                         "Megatron-FSDP's path for sharded gradients (zero 2 or 3); use --zero 3, or "
                         "--grad-accumulation add (or fused)"),
    # Megatron-LM's Float16Optimizer / DistributedOptimizer: zero 0 or 1 (ZeRO 2 / 3 shard the gradients elsewhere)
    Rule("optimizer_fp32_passes_zero", lambda m, p, c: (not p.optimizer_fp32_passes) | (p.zero <= 1),
         lambda m, p, c: f"optimizer_fp32_passes with zero {p.zero}: Megatron-LM's mixed-precision optimizer runs "
                         "them over an unsharded or ZeRO-1 (distributed optimizer) shard; use --zero 1, or set "
                         "optimizer_fp32_passes false in the plan file"),
    Rule("recompute_layers", lambda m, p, c: True if p.recompute_layers is None else p.full,
         lambda m, p, c: f"recompute_layers ({p.recompute_layers}) recomputes whole layers (Megatron's block method), "
                         f"which needs recompute full (got {p.recompute}); use --recompute full or drop "
                         "--recompute-layers"),
    Rule("recompute_op", lambda m, p, c: (p.op == 0) | (not m.is_moe and not m.is_mla),
         lambda m, p, c: f"recompute op (torchtitan's per-op checkpointing, priced by the order of a dense "
                         f"layer's matmuls) is modelled for dense attention + MLP layers; {m.name} has "
                         f"{'expert' if m.is_moe else 'MLA'} layers: use --recompute full, selective or none"),
    Rule("recompute_op_dtype", lambda m, p, c: (p.op == 0) | (not p.low_precision),
         lambda m, p, c: f"recompute op with {p.dtype} matmuls: torchtitan's releases treat low-precision matmul "
                         "outputs differently (v0.2.2 recomputes them, 0.3.0 saves them), so the plan does not say "
                         "what runs; use --recompute full or none, or --dtype bf16"),
    Rule("recompute_modules", lambda m, p, c: (not p.recompute_modules) | p.selective,
         lambda m, p, c: f"recompute_modules ({', '.join(p.recompute_modules)}) are Megatron's selective recompute "
                         f"modules, but the plan recomputes {p.recompute}; use "
                         "--recompute selective or drop --recompute-modules"),
    Rule("recompute_modules_model", lambda m, p, c: not _foreign_modules(m, p),
         lambda m, p, c: f"recompute_modules {', '.join(_foreign_modules(m, p))} describe layers {m.name} does not "
                         "have (mla_up_proj: MLA attention or a query rank; moe, moe_act: expert layers; "
                         "shared_experts: shared experts; mhc: hyper-connections; Megatron TransformerConfig "
                         "rules); drop them from --recompute-modules"),
    Rule("indexer_loss_model", lambda m, p, c: (p.indexer_loss is None) | m.is_sparse_attention,
         lambda m, p, c: f"indexer_loss {p.indexer_loss} with {m.name}, which has no DeepSeek Sparse Attention "
                         "indexer (index_topk) to train; drop --indexer-loss"),
    # NVIDIA/Megatron-LM experimental_attention_variant/dsa.py at 1e23526adc: the reference indexer path's
    # matmuls run in fp32 (q.float(), query.float()), priced at the profile's tf32 or fp32 rate
    # (cost.sparse_gather.reference_rate); a profile listing neither cannot price them, unless the fused CSA
    # path prices the indexer instead (cost.sparse_gather.fused_csa_priced).
    Rule("indexer_reference_rate",
         lambda m, p, c: (not m.is_sparse_attention) | (reference_dtype(c.system.gpu) is not None)
         | fused_csa_priced(m, p, c.system.gpu),
         lambda m, p, c: f"{m.name}'s DeepSeek Sparse Attention indexer runs Megatron-Core's reference path in fp32 "
                         f"(dsa.py), but GPU profile {c.system.gpu.name} lists no tf32 or fp32 rate (tflops: "
                         f"{', '.join(sorted(c.system.gpu.tflops))}) to price it; add tflops.fp32 (or tf32) "
                         "from the GPU's datasheet to the profile",
         needs_cluster=True),
    # NVIDIA/Megatron-LM experimental_attention_variant/deepseek_v4_hybrid_attention.py at 1e23526adc
    # (DSv4HybridAttention.__init__: assert not self.checkpoint_core_attention)
    Rule("recompute_core_attn_dsv4", lambda m, p, c: (not m.compressed_layers) | ~as_bool(p.recomputes("core_attn")),
         lambda m, p, c: f"selective recompute of core_attn (recompute_modules: {_listed_modules(p)}) with "
                         f"{m.name}'s compressed attention: Megatron-Core's DSv4HybridAttention asserts that core "
                         "attention is not checkpointed (deepseek_v4_hybrid_attention.py); use --recompute-modules "
                         "mla_up_proj (or moe_act, mhc), as Megatron-Bridge's deepseek_v4 recipes do, or --recompute "
                         "full or none"),
    Rule("delay_wgrad_graphs",
         lambda m, p, c: not (p.delay_wgrad and p.overlap_grad_reduce and p.cuda_graphs == "layers")
         or (p.grad_accumulation == "fused" and not (m.attention_bias or m.qkv_bias)),  # workload fields
         lambda m, p, c: f"delay_wgrad with overlap_grad_reduce, cuda_graphs layers (the attention graphed), "
                         f"grad_accumulation {p.grad_accumulation}"
                         f"{', an attention bias' if m.attention_bias or m.qkv_bias else ''}: Megatron-LM asserts "
                         "gradient_accumulation_fusion and no attention bias for graphed delayed weight gradients "
                         "(arguments.py); use --grad-accumulation fused, --train-cuda-graphs none or "
                         "--no-delay-wgrad"),
    # deepspeedai/DeepSpeed edaa72212 (and 56c522386): BF16_Optimizer has no reduce_gradients, so the engine
    # all-reduces its fp32 groups in buffered_allreduce_fallback after the backward (engine.py allreduce_gradients
    # at the accumulation boundary; pipe/engine.py _exec_reduce_grads -> _bf16_reduce_grads), beside no compute
    Rule("bf16_optimizer_overlap",
         lambda m, p, c: ~as_bool(bf16_optimizer(p)) | ~as_bool(p.overlap_grad_reduce),
         lambda m, p, c: "overlap_grad_reduce with DeepSpeed's BF16_Optimizer (dtype bf16, grad_dtype fp32, zero 1, "
                         "grad_reduce all-reduce, grad_accumulation cast-add): it all-reduces the gradients after "
                         "the backward, not beside it (engine.py buffered_allreduce_fallback); use "
                         "--no-overlap-grad-reduce, or change one of those"),
    Rule("recompute_moe_overlap", lambda m, p, c: ("moe" not in p.recompute_modules) | (not p.ep_comm_overlap),
         lambda m, p, c: "recompute_modules moe (recomputing the whole MoE layer) with ep_comm_overlap: Megatron "
                         "refuses --overlap-moe-expert-parallel-comm with it (TransformerConfig); drop one"),
    # Megatron-Core TransformerConfig.__post_init__ (NVIDIA/Megatron-LM cd4afffa6, transformer_config.py) and
    # Megatron-Bridge CommOverlapConfig._get_model_comm_overlap_cfgs (NVIDIA-NeMo/Megatron-Bridge 6124fbe,
    # training/comm_overlap.py) assert these with overlap_moe_expert_parallel_comm (EP > 1: SwitchUse
    # ep_comm_overlap_ep; no moe recompute: recompute_moe_overlap; alltoall / flex: every MoeDispatcher)
    Rule("ep_overlap_vpp", lambda m, p, c: (not (m.is_moe and p.ep_comm_overlap)) | (p.ep == 1) | (p.pp == 1)
         | (p.vpp > 1) | (p.pp_schedule != "1f1b"),
         lambda m, p, c: f"ep_comm_overlap with pp {p.pp} and vpp {p.vpp}: Megatron-Core pairs the micro-batches "
                         "of the EP all-to-all overlap in the interleaved schedule and asserts virtual stages when "
                         "pp > 1 (TransformerConfig, overlap_moe_expert_parallel_comm); use --vpp 2 or more, "
                         "--pp 1, or --no-ep-comm-overlap"),
    Rule("ep_overlap_full_recompute", lambda m, p, c: (not (m.is_moe and p.ep_comm_overlap)) | (p.ep == 1)
         | (p.full == 0),
         lambda m, p, c: "ep_comm_overlap with recompute full: Megatron-Core asserts no full recompute (granularity, "
                         "method, recompute_num_layers) with overlap_moe_expert_parallel_comm (TransformerConfig); "
                         "use --recompute selective or none, or --no-ep-comm-overlap"),
    Rule("ep_overlap_mtp", lambda m, p, c: (not (m.is_moe and p.ep_comm_overlap)) | (p.ep == 1)
         | (m.num_nextn_predict_layers <= 1),
         lambda m, p, c: f"ep_comm_overlap with {m.num_nextn_predict_layers} multi-token-prediction modules of "
                         f"{m.name}: Megatron-Core asserts mtp_num_layers of at most 1 with "
                         "overlap_moe_expert_parallel_comm (TransformerConfig); use --mtp-layers 1 or 0, or "
                         "--no-ep-comm-overlap"),
    Rule("ep_overlap_dtype", lambda m, p, c: (not (m.is_moe and p.ep_comm_overlap)) | (p.ep == 1)
         | (p.dtype != "fp32"),
         lambda m, p, c: f"ep_comm_overlap with dtype {p.dtype}: Megatron-Core runs the EP all-to-all overlap only "
                         "on a bf16 or fp16 model (fp8 / fp4 recipes train one: TransformerConfig, "
                         "overlap_moe_expert_parallel_comm); use --dtype bf16, or --no-ep-comm-overlap"),
    Rule("tp_comm_overlap_recipe", lambda m, p, c: _ub_recipe_ok(p),
         lambda m, p, c: f"tp_comm_overlap with recipe {p.recipe} ({p.dtype}), tp {p.tp}, sp on: Transformer "
                         "Engine's userbuffers all-gather only per-tensor fp8 and MXFP8 tensors (v2.5 - v2.17.1 "
                         "fill_userbuffers_buffer_for_all_gather raises 'Unsupported quantizer for Userbuffers' for "
                         f"{p.recipe}), so Megatron's --tp-comm-overlap fails at the first gather; use "
                         "--no-tp-comm-overlap, or --precision mxfp8"),
    Rule("fp8_attention", lambda m, p, c: (not p.fp8_attention) | ((p.dtype == "fp8") & p.flash_attention),
         lambda m, p, c: f"fp8_attention with dtype {p.dtype}"
                         f"{'' if p.flash_attention else ' and unfused attention'}: FP8 dot-product attention is "
                         "Transformer Engine's fused (cuDNN) attention under an fp8 recipe (Megatron-Core "
                         "TransformerConfig.fp8_dot_product_attention with fp8 set); use an fp8 --precision with "
                         "fused attention, or drop --fp8-attention"),
    Rule("fp8_output_proj", lambda m, p, c: (not p.fp8_output_proj) | ((p.dtype == "fp8") & (p.recipe == "mxfp8")),
         lambda m, p, c: f"fp8_output_proj with dtype {p.dtype}, recipe {p.recipe}: Megatron-Core runs the output "
                         "layer in MXFP8 only under fp8 with fp8_recipe mxfp8 (TransformerConfig.__post_init__ "
                         "raises 'fp8_output_proj requires fp8_recipe=mxfp8', Megatron-LM 3f6a2ed844); use "
                         "--precision mxfp8, or drop --fp8-output-proj"),
    Rule("fp8_output_proj_tied", lambda m, p, c: (not p.fp8_output_proj) | (not m.tie_word_embeddings)
         | ((p.pp > 1) & (m.num_nextn_predict_layers == 0)),
         lambda m, p, c: f"fp8_output_proj with {m.name}'s tied embeddings, pp {p.pp}, "
                         f"{m.num_nextn_predict_layers} MTP layers: the output layer would use the embedding's "
                         "weight on its stage, which Megatron-Core's TELMHeadColumnParallelLinear refuses "
                         "(skip_weight_param_allocation / runtime weight, Megatron-LM 3f6a2ed844); use --pp 2 or "
                         "more without MTP, or drop --fp8-output-proj"),
    Rule("fp8_output_proj_tp_overlap", lambda m, p, c: _head_ub_ok(m, p),
         lambda m, p, c: f"fp8_output_proj with tp_comm_overlap, tp {p.tp}, sp {'on' if p.sp else 'off'}: "
                         "Megatron-Core's TELMHeadColumnParallelLinear gives TELinear no "
                         "userbuffer name, and TELinear.__init__ asserts 'tp_comm_buffer_name is not None' under "
                         "tp_comm_overlap (Megatron-LM d98e8a6 extensions/transformer_engine.py); drop "
                         "--tp-comm-overlap, or drop --fp8-output-proj"),
    Rule("attention_release_kernel", lambda m, p, c: _release_native(p),
         lambda m, p, c: f"attention_release {p.attention_release} with "
                         f"{'unfused attention' if not p.flash_attention else 'attention_kernel flash2'}: the "
                         "release is cuDNN's fused attention, which only the native kernel runs; drop "
                         "--attention-release or use --attention-kernel native with fused attention"),
    Rule("attention_release", lambda m, p, c: _release_known(p, c),
         lambda m, p, c: f"attention_release {p.attention_release} on {c.system.gpu.name}: no published attention "
                         f"rate of that release on this GPU (GpuSpec.attention_release_efficiency lists "
                         f"{', '.join(c.system.gpu.attention_release_efficiency) or 'none'}); drop "
                         "--attention-release or add the release's published rate to the GPU profile",
         needs_cluster=True),
    Rule("swiglu_fp8_input", lambda m, p, c: (not p.swiglu_fp8_input) | m.gated_mlp,
         lambda m, p, c: f"swiglu_fp8_input with {m.name}, whose MLP is not gated: Megatron stores the activation "
                         "input in fp8 for SwiGLU only (TransformerConfig, activation_func_fp8_input_store); drop "
                         "--swiglu-fp8-input"),
    Rule("jit_activation", lambda m, p, c: (not p.jit_activation) | m.gated_mlp,
         lambda m, p, c: f"jit_activation with {m.name}, whose MLP is not gated: its activation is "
                         f"{m.mlp_activation}; the jit_fuser rate priced is that of Megatron-Core's gated-MLP "
                         "kernels, the only activations it supports: SwiGLU (silu: bias_swiglu_impl, "
                         "fusions/fused_bias_swiglu.py) and GeGLU (gelu: bias_geglu_impl, "
                         "fusions/fused_bias_geglu.py), and an ungated MLP's activation is priced as one fused pass "
                         "already; set jit_activation false in the plan"),
    # Megatron-Core optimizer/__init__.py (d98e8a6): "--use-precision-aware-optimizer only supported with
    # distributed optimizer"; Megatron-FSDP keeps its own main-weight buffer (--megatron-fsdp-main-params-dtype);
    # fp8 primary weights leave no bf16 weight for the remainder to complete (TE FusedAdam: "Works only when
    # param type is BF16")
    Rule("param_remainders", lambda m, p, c: (not p.param_remainders) | ((p.zero >= 1) & (p.zero <= 2)
                                                                        & (not p.fp8_params)),
         lambda m, p, c: f"param_remainders with zero {p.zero}{' and fp8_params' if p.fp8_params else ''}: "
                         "Megatron-Core keeps the master as 16-bit remainders only in its distributed optimizer "
                         "(zero 1 or 2) beside bf16 weights; "
                         f"{'use --no-fp8-params' if p.fp8_params else 'use --zero 1'} or drop --param-remainders"),
    Rule("bf16_layers", lambda m, p, c: (p.bf16_layers_start or 0) + (p.bf16_layers_end or 0) <= m.num_hidden_layers,
         lambda m, p, c: f"bf16_layers_start ({p.bf16_layers_start or 0}) + bf16_layers_end ({p.bf16_layers_end or 0}) "
                         f"exceeds {m.name}'s {m.num_hidden_layers} layers: the layers kept in bf16 are counted within "
                         f"the stack; give at most {m.num_hidden_layers} in all with --bf16-layers-start / "
                         "--bf16-layers-end"),
    Rule("bf16_modules", lambda m, p, c: not _absent_bf16_modules(m, p),
         lambda m, p, c: f"bf16_modules {', '.join(_absent_bf16_modules(m, p))}: {m.name} has no such module "
                         "(attention: attention layers; latent_proj: a latent MoE, moe_latent_size); drop them "
                         "from --bf16-modules"),
    Rule("mxfp8_modules", lambda m, p, c: not p.mxfp8_modules or (p.recipe == "nvfp4" and p.low_precision),
         lambda m, p, c: f"mxfp8_modules {', '.join(p.mxfp8_modules)} with "
                         f"{f'recipe {p.recipe}' if p.low_precision else f'dtype {p.dtype}'}: MXFP8 modules are an "
                         "exception to an NVFP4 recipe; give --precision nvfp4 or drop --mxfp8-modules"),
    Rule("mxfp8_modules_model", lambda m, p, c: not p.mxfp8_modules or m.count_layers("mamba") > 0,
         lambda m, p, c: f"mxfp8_modules {', '.join(p.mxfp8_modules)}: {m.name} has no Mamba-2 layer "
                         "(mamba_out_proj: the Mamba-2 mixer's out_proj); drop --mxfp8-modules"),
    Rule("bf16_layers_stage", lambda m, p, c: _bf16_stage_ok(m, p),
         lambda m, p, c: f"bf16_layers_start ({p.bf16_layers_start or 0}) / bf16_layers_end ({p.bf16_layers_end or 0}) "
                         f"above the {m.num_hidden_layers // p.pp} layers of a pipeline stage ({m.num_hidden_layers} "
                         f"layers / pp {p.pp}): Megatron-Core keeps each count within one stage (TransformerConfig "
                         "num_layers_at_start_in_bf16 / _end_); lower them or use a smaller --pp"),
    # Megatron-Core TransformerConfig.__post_init__ (6513e3e23, the Megatron-LM Megatron-Bridge ffeb5a7ae pins):
    # "Flex token dispatcher with deepep backend does not support moe_pad_expert_input_to_capacity"; the hybridep
    # backend pads (Megatron-Bridge's Nemotron-3 Super H100 recipe: flex + hybridep, capacity factor 1.10, padded).
    # Before HybridEP (3df200905e, first in core_v0.16.0) flex meant DeepEP and refused padding outright
    # (core_v0.14.0 TransformerConfig.__post_init__ and MoEFlexTokenDispatcher's assert); a capacity factor
    # without padding only drops tokens there (_DeepepManager.setup_metadata), which llmplan does not price
    Rule("deepep_capacity", lambda m, p, c: p.moe_dispatcher != "deepep" or p.moe_capacity_factor is None
         or p.moe_flex_backend != "deepep",
         lambda m, p, c: f"moe_dispatcher deepep with moe_capacity_factor ({p.moe_capacity_factor}): Megatron's flex "
                         "dispatcher with the deepep backend does not pad experts to capacity (TransformerConfig "
                         "rule); drop --moe-capacity-factor, use --moe-flex-backend hybridep or --moe-dispatcher "
                         "alltoall"),
    # Megatron-Core TransformerConfig (d98e8a6): moe_expert_rank_capacity_factor, the static per-rank budget a
    # dropless MoE layer needs inside a full-iteration graph, requires the flex dispatcher's hybridep backend;
    # the alltoall dispatcher waits for its token counts on the host (token_dispatcher.py, cuda_sync_point)
    Rule("cuda_graphs_moe",
         lambda m, p, c: (p.cuda_graphs != "full-iteration") | (not m.is_moe) | (p.moe_dispatcher != "alltoall")
         | (p.moe_capacity_factor is not None),
         lambda m, p, c: f"cuda_graphs full-iteration with a dropless alltoall MoE dispatcher ({m.name}): the "
                         "alltoall dispatcher copies each layer's token counts to the host and waits for them, "
                         "which a CUDA graph cannot capture (Megatron's static per-rank budget, "
                         "--moe-expert-rank-capacity-factor, needs the flex dispatcher); use --moe-dispatcher "
                         "deepep, a --moe-capacity-factor, or --train-cuda-graphs layers / none"),
    # Megatron-LM d98e8a6: DeepEP's normal dispatch makes the CPU wait for the GPU's received counts, "not compatible
    # with CUDA graph" (moe/fused_a2a.py:107-108, FusedDispatch.forward); the static per-rank budget of a graphed
    # dropless layer "requires moe_flex_dispatcher_backend to be 'hybridep' or 'ncclep'"
    # (transformer_config.py:1868-1873)
    Rule("cuda_graphs_flex_backend",
         lambda m, p, c: (p.cuda_graphs != "full-iteration") | (not m.is_moe) | (p.moe_dispatcher != "deepep")
         | (p.moe_flex_backend != "deepep"),
         lambda m, p, c: f"cuda_graphs full-iteration with moe_dispatcher deepep and moe_flex_backend deepep "
                         f"({m.name}): DeepEP's normal dispatch waits on the host for its received token counts, "
                         "which a CUDA graph cannot capture, and Megatron's static per-rank budget "
                         "(--moe-expert-rank-capacity-factor) requires the hybridep backend (TransformerConfig "
                         "rule); set the plan key moe_flex_backend: hybridep (--moe-flex-backend hybridep where "
                         "the command takes it), or --train-cuda-graphs layers / none"),
    # Megatron-Core TransformerConfig.__post_init__ (d98e8a6, transformer_config.py:2836-2852; cd4afffa6 2506-2520):
    # per-layer graphs of moe_preprocess with the alltoall dispatcher and the routing map padded for fp8 / fp4
    # (moe_router_padding_for_fp8, the alias of moe_router_padding_for_quantization) are refused, "DtoH copies and
    # synchronizations in the preprocess step" (token_dispatcher.py preprocess: num_out_tokens is then summed on
    # the GPU and synced before permutation 1); padded to capacity (--moe-pad-expert-input-to-capacity) the
    # preprocess returns before that and the graph is allowed. The modules: cost.kernels.graph_scopes
    Rule("cuda_graphs_moe_preprocess",
         lambda m, p, c: (p.cuda_graphs != "layers") | (not m.is_moe) | (p.moe_dispatcher != "alltoall")
         | (p.moe_capacity_factor is not None) | np.logical_not(p.moe_router_padding)
         | as_bool(p.recomputes("moe")),
         lambda m, p, c: f"cuda_graphs layers with the alltoall dispatcher and moe_router_padding ({m.name}): "
                         "Megatron-Core graphs the MoE preprocess (cuda_graph_modules moe_preprocess) and refuses "
                         "it where the padded routing map makes the preprocess copy token counts to the host and "
                         "wait (TransformerConfig rule); drop --moe-router-padding, pad to capacity with "
                         "--moe-capacity-factor, or use --train-cuda-graphs none"),
    # Megatron-Core TransformerConfig (d98e8a6): "full recompute is only supported with full iteration CUDA graph"
    Rule("cuda_graphs_recompute", lambda m, p, c: (p.cuda_graphs != "layers") | (p.full == 0),
         lambda m, p, c: "cuda_graphs layers with recompute full: Megatron-Core captures per-layer graphs only "
                         "with selective or no recompute (full recompute needs the full-iteration graph); use "
                         "--train-cuda-graphs full-iteration or none, or --recompute selective"),
    # Megatron-Core TransformerConfig.__post_init__ (d98e8a6): cpu_offloading_num_layers within [0, num_layers),
    # no pipeline parallelism, no activation recompute, no CUDA graphs but the full-iteration one
    Rule("offload_layers", lambda m, p, c: p.offload_layers < m.num_hidden_layers,
         lambda m, p, c: f"offload_layers ({p.offload_layers}) must be below {m.name}'s {m.num_hidden_layers} layers: "
                         "Megatron-Core offloads the first N layers and keeps the rest on the GPU (cpu_offloading_"
                         f"num_layers < num_layers); use --offload-activations-layers 1 to {m.num_hidden_layers - 1}"),
    Rule("offload_pp", lambda m, p, c: (p.offload_layers == 0) | (p.pp == 1),
         lambda m, p, c: f"offload_layers ({p.offload_layers}) with pp {p.pp}: Megatron-Core has no activation offload "
                         "under pipeline parallelism (TransformerConfig: 'no support for Pipeline parallelism with CPU "
                         "offloading'); use --pp 1 or drop --offload-activations-layers"),
    Rule("offload_recompute", lambda m, p, c: (p.offload_layers == 0) | (p.recompute_code == 0),
         lambda m, p, c: f"offload_layers ({p.offload_layers}) with recompute {p.recompute}: Megatron-Core refuses "
                         "activation offload with activation recomputation (TransformerConfig); use --recompute none "
                         "or drop --offload-activations-layers"),
    Rule("offload_cuda_graphs", lambda m, p, c: (p.offload_layers == 0) | (p.cuda_graphs != "layers"),
         lambda m, p, c: f"offload_layers ({p.offload_layers}) with per-layer CUDA graphs: Megatron-Core supports CPU "
                         "offloading only with the full-iteration graph (TransformerConfig); use --train-cuda-graphs none "
                         "or full-iteration, or drop --offload-activations-layers"),
    Rule("offload_host_memory", lambda m, p, c: _host_fits(m, p, c), lambda m, p, c: _host_message(m, p, c),
         needs_cluster=True),
    # Megatron-Core TransformerConfig.__post_init__ (2a75ac12c): fine-grained offload "cannot be enabled with
    # cpu_offloading", nor offload inside an MoE layer whose whole forward recompute_modules "moe" checkpoints
    Rule("offload_moe_act_layers", lambda m, p, c: (p.offload_layers == 0) | (not p.offload_moe_act),
         lambda m, p, c: f"offload_moe_act with offload_layers ({p.offload_layers}): Megatron-Core refuses "
                         "fine-grained activation offload together with layer offload "
                         "(fine_grained_activation_offloading cannot be enabled with cpu_offloading); drop "
                         "--offload-moe-act or --offload-activations-layers"),
    Rule("offload_moe_act_recompute", lambda m, p, c: (not p.offload_moe_act) | np.logical_not(p.recomputes("moe")),
         lambda m, p, c: "offload_moe_act with recompute module moe: Megatron-Core refuses to offload inside an MoE "
                         "layer that is recomputed whole (TransformerConfig); drop moe from --recompute-modules or "
                         "drop --offload-moe-act"),
    # Megatron-Core TransformerConfig.__post_init__ (1e23526adc, transformer_config.py:2371-2386): "moe_paged_stash
    # requires moe_expert_rank_capacity_factor to be set", the static per-rank budget llmplan's plans carry only
    # as a dropless MoE layer in a full-iteration graph (export.megatron writes it there); the stash "cannot be
    # enabled with cpu_offloading" and offload_modules "must not include expert_fc1, moe_act, or fused_group_mlp"
    Rule("paged_stash_budget",
         lambda m, p, c: (p.moe_paged_stash is None) | _static_budget(p),
         lambda m, p, c: f"moe_paged_stash ({p.moe_paged_stash}) with cuda_graphs {p.cuda_graphs} and "
                         f"moe_capacity_factor {p.moe_capacity_factor}: Megatron-Core's paged stash needs the static "
                         "per-rank budget (--moe-expert-rank-capacity-factor) of a dropless MoE layer in a "
                         f"full-iteration CUDA graph (TransformerConfig); {_FULL_ITERATION_ADVICE} --moe-paged-stash"),
    # Megatron-Core TransformerConfig (1e23526adc): the rank capacity "requires moe_flex_dispatcher_backend to be
    # 'hybridep' or 'ncclep'" with the op fuser; llmplan prices the static budget (no host sync) only inside the
    # full-iteration graph (cost.moe.host_syncs_per_layer), where rule cuda_graphs_flex_backend asks for hybridep
    Rule("rank_capacity_budget",
         lambda m, p, c: (p.moe_rank_capacity_factor is None) | _static_budget(p),
         lambda m, p, c: f"moe_rank_capacity_factor ({p.moe_rank_capacity_factor}) with cuda_graphs "
                         f"{p.cuda_graphs} and moe_capacity_factor {p.moe_capacity_factor}: llmplan prices "
                         "Megatron-Core's static per-rank budget only for a dropless MoE layer in a full-iteration "
                         f"CUDA graph (HybridEP, TransformerConfig); {_FULL_ITERATION_ADVICE} "
                         "--moe-rank-capacity-factor"),
    Rule("paged_stash_offload",
         lambda m, p, c: (p.moe_paged_stash is None) | ((p.offload_layers == 0) & (not p.offload_moe_act)
                                                        & ("expert_fc1" not in p.offload_modules)
                                                        & ("moe_act" not in p.offload_modules)),
         lambda m, p, c: f"moe_paged_stash ({p.moe_paged_stash}) with offload_layers {p.offload_layers}, "
                         f"offload_moe_act {p.offload_moe_act}, offload_modules ({', '.join(p.offload_modules)}): "
                         "Megatron-Core refuses the paged stash with layer offload and with an offload of the "
                         "experts' tensors (expert_fc1, moe_act), which the stash already covers "
                         "(TransformerConfig); drop those offloads or --moe-paged-stash"),
    Rule("offload_modules_host_memory", lambda m, p, c: _fine_grained_host_fits(m, p, c),
         lambda m, p, c: _fine_grained_host_message(m, p, c), needs_cluster=True),
    # Megatron-Core TransformerConfig.__post_init__ (d98e8a64dd), the same rules for every offload_modules entry
    Rule("offload_modules_layers", lambda m, p, c: (p.offload_layers == 0) | (not p.offload_modules),
         lambda m, p, c: f"offload_modules ({', '.join(p.offload_modules)}) with offload_layers ({p.offload_layers}): "
                         "Megatron-Core refuses fine-grained activation offload together with layer offload "
                         "(fine_grained_activation_offloading cannot be enabled with cpu_offloading); drop "
                         "--offload-modules or --offload-activations-layers"),
    Rule("offload_modules_recompute", lambda m, p, c: (not _moe_offloads(p)) | np.logical_not(p.recomputes("moe")),
         lambda m, p, c: f"offload_modules {', '.join(_moe_offloads(p))} with recompute module moe: Megatron-Core "
                         "refuses to offload inside an MoE layer that is recomputed whole (TransformerConfig: 'moe' "
                         "in recompute_modules wraps the full MoE forward in a checkpoint); drop moe from "
                         f"--recompute-modules or drop {', '.join(_moe_offloads(p))} from --offload-modules"),
    Rule("offload_attn_proj",
         lambda m, p, c: ("attn_proj" not in p.offload_modules) | ("core_attn" in p.offload_modules),
         lambda m, p, c: "offload_modules attn_proj without core_attn: Megatron-Core refuses it (TransformerConfig: "
                         "attn_proj's input is core_attn's output, which core_attn's backward still needs); add "
                         "core_attn to --offload-modules or drop attn_proj"),
    Rule("offload_modules_dense", lambda m, p, c: m.is_moe or not _moe_offloads(p),
         lambda m, p, c: f"offload_modules {', '.join(_moe_offloads(p))} on {m.name}, which has no expert layers: "
                         "Megatron-Core registers these groups only in an MoE layer (moe/experts.py; mlp_norm: a "
                         "dense layer's pre-MLP norm is fused into fc1, an IdentityOp it skips), so nothing would "
                         f"move; drop {', '.join(_moe_offloads(p))} from --offload-modules"),
    # Megatron-Core d98e8a64dd (moe/experts.py, transformer_layer.py, multi_latent_attention.py, moe_layer.py) sets
    # Transformer Engine's save_original_input on these modules' linears with fp8; TE (v2.6 - d0067d0da6
    # linear.py / grouped_linear.py) raises "DelayedScaling recipe is not supported with save_original_input"
    Rule("delayed_scaling_original_input", lambda m, p, c: _delayed_original_input_ok(m, p),
         lambda m, p, c: f"fp8 delayed scaling with {_delayed_original_input_names(m, p)}: Megatron-Core makes that "
                         "module's linear save its original input, which Transformer Engine refuses under "
                         "DelayedScaling ('DelayedScaling recipe is not supported with save_original_input'); use "
                         "--fp8-scaling current (or another recipe), or drop the module"),
    # Megatron-Core TransformerLayer._set_offload_modules (d98e8a6, transformer_layer.py:1563-1597): with the attn
    # CUDA graph (and, in an MoE model, the moe_router one) the attn_norm / mlp_norm groups would cross a graph's
    # edge, so Megatron turns them off with a warning; the offload llmplan priced would not happen
    Rule("offload_norm_graphs", lambda m, p, c: p.cuda_graphs != "layers" or not _graphed_norms(m, p),
         lambda m, p, c: f"offload_modules {', '.join(_graphed_norms(m, p))} with cuda_graphs layers: Megatron-Core "
                         "drops these offloads when the attention (and MoE router) are graphed, their inputs crossing "
                         "a graph's edge (TransformerLayer: 'offloading is not supported with ... cudagraph'); drop "
                         f"{', '.join(_graphed_norms(m, p))} from --offload-modules, or use cuda_graphs full-iteration "
                         "or none"),
    # Megatron-Core TransformerConfig.__post_init__ (d98e8a6, transformer_config.py:2045-2051): NotImplementedError
    # for 'mhc' in recompute_modules with fine-grained activation offloading
    Rule("offload_modules_mhc",
         lambda m, p, c: (not p.fine_grained_offload_modules) | np.logical_not(p.recomputes("mhc")),
         lambda m, p, c: "fine-grained activation offload with recompute module mhc: Megatron-Core does not support "
                         "the two together (TransformerConfig: the mHC recompute hook fires before the offload "
                         "backward chunk exists); drop mhc from --recompute-modules, or drop --offload-modules / "
                         "--offload-moe-act"),
    # Megatron-Core TransformerConfig.__post_init__ (d98e8a6, transformer_config.py:2870-2905): a graphed module
    # that selective recompute rebuilds takes no random numbers: no attention dropout with core_attn recomputed
    # inside a graph, no hidden dropout with mlp / moe recomputed inside one (the full-iteration graph captures
    # all; cuda_graphs layers captures attn, and a dense model's mlp: cuda_graph_pairs)
    Rule("cuda_graphs_recompute_dropout", lambda m, p, c: _graphed_dropout_ok(m, p),
         lambda m, p, c: f"cuda_graphs {p.cuda_graphs} with recompute module {_graphed_dropout_names(m, p)} and "
                         f"dropout (attention {m.attention_dropout:g}, hidden {m.hidden_dropout:g} in {m.name}): "
                         "Megatron-Core refuses dropout in a recomputed module inside a CUDA graph (TransformerConfig: "
                         "'dropout is not supported with graphed ... recomputation'); drop "
                         f"{_graphed_dropout_names(m, p)} from --recompute-modules (core_attn is the default: "
                         "list others), use --recompute none (or full with --train-cuda-graphs full-iteration), or "
                         "--train-cuda-graphs none"),
    Rule("moe_switches_dense", lambda m, p, c: m.is_moe or not _moe_switches(p),
         lambda m, p, c: _dense_message(m, _moe_switches(p))),
    Rule("moe_dispatch_sms_deepep", lambda m, p, c: (p.moe_dispatch_sms is None) | (p.moe_dispatcher == "deepep")
         | (not m.is_moe),
         lambda m, p, c: f"moe_dispatch_sms {p.moe_dispatch_sms} with moe_dispatcher {p.moe_dispatcher}: the SMs are "
                         "those of the deepep dispatch and combine kernels (Megatron moe_flex_dispatcher_num_sms); "
                         "the alltoall dispatcher runs NCCL's all-to-all; add --moe-dispatcher deepep or drop "
                         "--moe-dispatch-sms"),
    # DeepSeek-V3 report §3.3.2 quantises the dispatch for its FP8 up-projection; DeepEP's dispatch takes the
    # (fp8, scales) tuple (deepseek-ai/DeepEP README); Megatron-LM d98e8a6 fused_a2a.py hands DeepEP bf16 and
    # init_hybrid_ep_buffer asserts fp8 dispatch off, the alltoall dispatcher permutes bf16 tokens
    Rule("ep_dispatch_fp8", lambda m, p, c: (not p.ep_dispatch_fp8) | (not m.is_moe)
         | ((p.dtype == "fp8") & (p.moe_dispatcher == "deepep") & (p.moe_flex_backend == "deepep")),
         lambda m, p, c: f"ep_dispatch_fp8 with dtype {p.dtype}, moe_dispatcher {p.moe_dispatcher}, moe_flex_backend "
                         f"{p.moe_flex_backend}: the dispatch carries the fp8 input of the experts' fp8 up-projection "
                         "through DeepEP's (fp8, scales) kernels (DeepSeek-V3 §3.3.2), which needs dtype fp8 and "
                         "DeepEP; use --precision fp8-blockwise --moe-dispatcher deepep --moe-flex-backend deepep, "
                         "or drop --ep-dispatch-fp8"),
    Rule("attention_kernel_fused", lambda m, p, c: (p.attention_kernel == "native") | p.flash_attention,
         lambda m, p, c: f"attention_kernel {p.attention_kernel} with unfused attention: the kernel named is the "
                         "fused attention kernel that runs, and unfused attention runs none; use --flash-attention "
                         "or drop --attention-kernel"),
    Rule("grad_dtype_fp32", lambda m, p, c: (p.grad_dtype == "fp32") | (p.dtype != "fp32"),
         lambda m, p, c: f"grad_dtype {p.grad_dtype} with dtype fp32: pure fp32 training keeps fp32 gradients (the "
                         "weights' own dtype); give a 16-bit or lower --dtype / --precision, or drop --grad-dtype"),
    Rule("fp8_params_dtype", lambda m, p, c: _fp8_params_low(p),
         lambda m, p, c: f"fp8_params with dtype {p.dtype}: it keeps the weights in an fp8 / NVFP4 recipe's format "
                         f"(Megatron --fp8-param-gather / --fp4-param-gather), and the plan's matmuls run in "
                         f"{p.dtype}; give an fp8 or fp4 --precision, or drop --fp8-params"),
    # torchao's float8 all-gather is per-tensor only. Source: pytorch/ao@36027d82d1 torchao/float8/config.py
    # (Float8LinearConfig.__post_init__: "enable_fsdp_float8_all_gather only supports tensorwise scaling
    # granularity"); pytorch/torchtitan v0.2.2 (73a0e69) components/quantization/float8.py (Float8LinearConverter:
    # asserts enable_fsdp_float8_all_gather off with a recipe_name)
    Rule("fp8_params_rowwise", lambda m, p, c: _fp8_params_per_tensor(p),
         lambda m, p, c: f"fp8_params with dtype {p.dtype}, recipe {p.recipe}: fp8_params keeps the weights in the "
                         "recipe's format and gathers them so (torchao's FSDP float8 all-gather, "
                         "enable_fsdp_float8_all_gather), which torchao runs for per-tensor scaling only; its rowwise "
                         "recipe casts inside each GEMM and gathers bf16 weights; use --precision fp8-tensorwise or "
                         "drop --fp8-params"),
    # On the PyTorch-native stack torchao's converters run every other recipe: pytorch/torchtitan v0.2.2 (73a0e69)
    # components/quantization/mx.py (MXLinearConverter, MXGroupedMMConverter: register_model_converter
    # "quantize.linear.mx", "quantize.grouped_mm.mx"; torchao MXLinearConfig / MoETrainingConfig(MXFP8)); 0.3.0
    # (PyPI wheel) mx.py MXFP8LinearConverter, MXFP8GroupedExpertsConverter, nvfp4.py NVFP4LinearConverter.
    # llmplan models their casts and saved tensors nowhere (cost.quantize.torchao_float8: Float8Linear alone), and
    # the torchtitan exports write the float8 converters only (export.torchtitan._check_common)
    # Block scaling (DeepSeek-V3's 1x128 activation / 128x128 weight tiles) is no MX recipe: torchao has it only as
    # the prototype Float8BlockwiseLinear (pytorch/ao@db46a188 torchao/prototype/blockwise_fp8_training/linear.py:
    # Float8BlockwiseLinearConfig, fp8_blockwise_mm, SM90 only), and torchtitan registers no converter for it
    # (components/quantization: float8, mx, nvfp4 only, at 01472ad4)
    Rule("dtensor_recipe", lambda m, p, c: _dtensor_recipe_ok(p), lambda m, p, c: _dtensor_recipe_message(p)),
    # torchao keeps fp8 weights only inside FSDP2's float8 all-gather. Source: pytorch/ao@36027d82d1
    # torchao/float8/fsdp_utils.py (WeightWithDynamicFloat8CastTensor holds the original-precision tensor and casts
    # it in fsdp_pre_all_gather), float8_linear.py (the weight cast every forward and backward unless
    # tensor_already_casted_to_fp8); pytorch/torchtitan v0.2.2 (73a0e69) components/quantization/float8.py
    # (enable_fsdp_float8_all_gather and dp_shard_enabled)
    Rule("torchao_fp8_params_gather", lambda m, p, c: _fp8_params_gathered(p),
         lambda m, p, c: f"fp8_params with torchao's Float8Linear (fp8 tensorwise, tp_impl {p.tp_impl}) at zero "
                         f"{p.zero} over {p.zero_shard} shard rank{'s' * (p.zero_shard != 1)}: torchao keeps fp8 "
                         "weights only in FSDP2's float8 all-gather (enable_fsdp_float8_all_gather), which needs "
                         "zero >= 2 over more than one rank; elsewhere it keeps the bf16 weights and casts them "
                         "every micro-batch; use --zero 3 with dp or cp > 1, or drop --fp8-params"),
    Rule("zero3_copy_out_unit", lambda m, p, c: (not p.zero3_copy_out) | (p.zero3_unit == "layer"),
         lambda m, p, c: "zero3_copy_out with zero3_unit tensor: the copy-out is FSDP2's, which gathers a module "
                         "at a time, and the per-tensor unit is DeepSpeed's stage 3 of 2021, whose own copies "
                         "around each call are priced already (comm.ZERO3_GATHER_COPIES); use --zero3-unit layer "
                         "or drop --zero3-copy-out"),
    # Megatron-FSDP's units are modules, the decoder layers: NVIDIA/Megatron-LM d98e8a64dd megatron/core/distributed/
    # fsdp/mcore_fsdp_adapter.py (FullyShardedDataParallel: fsdp_unit_modules defaults to TransformerLayer,
    # MoETransformerLayer, MambaLayer, and megatron/training passes none; nor does NVIDIA-NeMo/Megatron-Bridge at
    # 067f987), so it never gathers one weight at a time as the per-tensor unit (DeepSpeed's of 2021) is priced
    Rule("megatron_fsdp_unit", lambda m, p, c: (not p.megatron_fsdp) | (p.zero3_unit == "layer"),
         lambda m, p, c: f"megatron_fsdp with zero3_unit tensor: {MEGATRON_FSDP_UNITS}; use --zero3-unit layer, "
                         "or drop --megatron-fsdp"),
    # Megatron-FSDP keeps fp8 / NVFP4 weights only fully sharded: NVIDIA/Megatron-LM cd4afffa6 megatron/core/
    # distributed/fsdp/src/README.md ("Only FSDP / ZeRO-3 supports FP8 parameters") and megatron_fsdp/
    # param_and_grad_buffer.py (copy_main_weights_to_model_weights: TODO, ZeRO-1 / ZeRO-2 not supported)
    # Only where Megatron-FSDP acts (zero 2 without a pipeline, as SwitchUse megatron_fsdp_zero): at zero 0-1 or
    # pp > 1 the switch is inert and Megatron-Core's distributed optimizer gathers fp8 weights (--fp8-param-gather)
    Rule("megatron_fsdp_fp8_params",
         lambda m, p, c: (not p.megatron_fsdp) | (not p.fp8_params) | (p.zero != 2) | (p.pp > 1),
         lambda m, p, c: f"megatron_fsdp with fp8_params at zero {p.zero}: Megatron-FSDP keeps fp8 / fp4 weights "
                         "only with its weights sharded (optim_grads_params, ZeRO-3; its README: \"Only FSDP / "
                         "ZeRO-3 supports FP8 parameters\"); use --zero 1 --no-megatron-fsdp (Megatron-Core's "
                         "distributed optimizer gathers fp8 weights), --zero 3 (not written by the megatron and "
                         "megatron-bridge exports), or drop --fp8-params"),
    # Muon as Megatron-LM runs it (NVIDIA/Megatron-LM d98e8a6 arguments.py: "Emerging optimizer does not support
    # Torch-FSDP2 / Megatron-FSDP"; its layer-wise distributed optimizer owns whole matrices, ZeRO-1 alone).
    Rule("muon_zero", lambda m, p, c: (p.optimizer != "muon") | (p.zero <= 1),
         lambda m, p, c: f"optimizer muon with zero {p.zero}: Megatron-LM's Muon orthogonalises whole matrices, each "
                         "on the data-parallel rank that owns it (its layer-wise distributed optimizer, ZeRO-1), and "
                         "refuses FSDP; use --zero 1 (or 0), or --optimizer adam"),
    # NVIDIA/Megatron-LM d98e8a6 megatron/core/optimizer/layer_wise_optimizer.py (LayerWiseDistributedOptimizer
    # asserts intra_dp_cp == dp_cp: "does not support num_distributed_optimizer_instances > 1"); under an
    # all-reducing DDP (Megatron-Bridge's dist_muon) Megatron-Core's distributed_data_parallel.py asserts "Partial
    # DistOpt cannot be used without DistOpt" (cd4afffa, Megatron-Bridge v0.6.0's pin)
    Rule("muon_replicate", lambda m, p, c: (p.optimizer != "muon") | (p.dp_replicate == 1),
         lambda m, p, c: f"optimizer muon with dp_replicate {p.dp_replicate}: Megatron-LM's Muon assigns whole "
                         "matrices over the whole data-parallel group (its layer-wise distributed optimizer refuses "
                         "num_distributed_optimizer_instances > 1); use --dp-replicate 1, or --optimizer adam"),
    # NVIDIA/Megatron-LM d98e8a6 (and cd4afffa, Megatron-Bridge v0.6.0's pin) megatron/core/optimizer/__init__.py,
    # _get_megatron_emerging_optimizer: "emerging optimizer with fp16 is not supported."
    Rule("muon_fp16", lambda m, p, c: (p.optimizer != "muon") | (p.dtype != "fp16"),
         lambda m, p, c: "optimizer muon with dtype fp16: Megatron-Core builds its emerging optimizers for bf16 "
                         "(or fp32) training and raises under fp16; use --dtype bf16, or --optimizer adam"),
    # Emerging-Optimizers v0.2.0 orthogonalized_optimizer.py: the momentum is zeros_like the fp32 master, and the
    # layer-wise optimizer wraps its optimizers in Float16OptimizerWithFloat16Params (fp32 master, no remainders)
    Rule("muon_states", lambda m, p, c: (p.optimizer != "muon") | ((p.optimizer_master_dtype == "fp32")
                                                                    & (p.optimizer_moment_dtype == "fp32")
                                                                    & (not p.param_remainders)),
         lambda m, p, c: f"optimizer muon with optimizer_master_dtype {p.optimizer_master_dtype}, "
                         f"optimizer_moment_dtype {p.optimizer_moment_dtype}, param_remainders "
                         f"{p.param_remainders}: Megatron-LM's Muon keeps an fp32 master and an fp32 momentum (no "
                         "precision-aware optimizer); drop those options, or use --optimizer adam"),
    # Megatron-Bridge v0.3.1 - v0.5.0 scripts/performance/configs/kimi/kimi_llm_pretrain.py: MXFP8's fp8_param_gather
    # "require[s] DistributedOptimizer infrastructure, incompatible with Muon's LayerWiseDistributedOptimizer"
    Rule("muon_fp8_params", lambda m, p, c: _fp8_params_adam(p),
         lambda m, p, c: "optimizer muon with fp8_params: the low-precision weight gather needs Megatron's "
                         "distributed optimizer, which Muon's layer-wise optimizer replaces; drop --fp8-params, or "
                         "use --optimizer adam"),
    Rule("muon_model", lambda m, p, c: (p.optimizer != "muon") | (muon_unpriced(m) is None),
         lambda m, p, c: f"optimizer muon with {m.name}'s {muon_unpriced(m)}: which of those parameters Muon "
                         "updates, and its Newton-Schulz cost on them, is not priced (transformer layers with GQA "
                         "or MLA attention and dense or MoE MLPs are); use --optimizer adam"
                         + (" or --mtp-layers 0" if m.num_nextn_predict_layers else "")),
    *(u.rule() for u in SWITCH_USES),
)
