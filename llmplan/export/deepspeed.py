"""DeepSpeed: ds_config.json and a launch command (keys: DeepSpeed docs, config-json)."""

from __future__ import annotations

from typing import Any

import json

from llmplan.arith import where
from llmplan.export.common import unfused_loss_refusal
from llmplan.export.common import (WIDTH, accumulation_notes, bias_add_notes, bias_add_refusal, bias_gelu_refusal,
                                   check_accumulation,
                                   comment_strings, header_lines, offload_moe_act_refusal, paged_stash_refusal,
                                   is_uneven, launch_env_lines, launcher_schedule, need_mode, op_fuser_refusals,
                                   kept_grad_shards_refusal, fp32_embedding_grads_refusal, fp32_sum_refusal,
                                   delay_wgrad_refusal, refuse, refuse_first, router_fusion_refusal,
                                   router_padding_refusal, sh_header, swiglu_fp8_refusal, megatron_fsdp_refusal,
                                   jit_activation_refusal)
from llmplan.planfile import PlanFile
from llmplan.specs.plan import ParallelPlan

TARGET = "deepspeed"


def muon_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """The Muon optimizer, refused whatever else the plan sets (export.EVERY_PLAN): DeepSpeed's Muon
    (deepspeed/runtime/zero/muon, blogs/muon-optimizer) runs its update inside
    DeepSpeedZeroOptimizer.get_flat_partition, not as Megatron's layer-wise optimizer that cost.muon prices."""
    return ("the Muon optimizer (llmplan prices Megatron-LM's layer-wise Muon; DeepSpeed's applies it in its ZeRO "
            "optimizer's gradient partitioning, whose step is not priced)", p.optimizer == "muon",
            "export to megatron or megatron-bridge, or re-plan with --optimizer adam")


def grad_checks_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """Megatron-LM's gradient NaN check, pre-scaling or its optimizer's fp32 passes, refused whatever else the plan
    sets (export.EVERY_PLAN)."""
    passes = bool(p.optimizer_fp32_passes)
    checks = bool(p.grad_nan_check or p.grad_prescale)
    checks_text = "Megatron-LM's gradient NaN check or 1/dp pre-scaling (grad_nan_check / grad_prescale)"
    what = ([checks_text] * (checks or not passes)
            + ["Megatron-LM's optimizer fp32 passes (optimizer_fp32_passes)"] * passes)
    keys = ["grad_nan_check and grad_prescale"] * (checks or not passes) + ["optimizer_fp32_passes"] * passes
    return ", and ".join(what), checks or passes, f"set {' and '.join(keys)} false, or export to megatron"


def context_parallel_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """Context parallelism, refused whatever else the plan sets (export.EVERY_PLAN)."""
    hierarchical = ", Transformer Engine's hierarchical a2a+p2p" if p.cp_impl == "te" and p.cp_comm_type == "a2a+p2p" \
        else ""  # DeepSpeed has no context parallelism of any kind; a2a+p2p only Megatron-Core runs
    return (f"context parallelism (cp {p.cp}{hierarchical})", p.cp > 1,
            "re-plan with --cp 1 or export to megatron" + ("" if hierarchical else " / torchtitan"))


def expert_parallel_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """Expert parallelism, refused whatever else the plan sets (export.every_plan_refusal: a search need not ask
    about its plans with ep > 1 one by one)."""
    return f"expert parallelism (ep {p.ep}; DeepSpeed-MoE sets it in the model code)", p.ep > 1, "export to megatron"


def sequence_parallel_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """Megatron sequence parallelism, refused whatever else the plan sets (export.EVERY_PLAN)."""
    return "Megatron sequence parallelism", p.sp, "re-plan with --no-sp or export to megatron"


def low_precision_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """fp8 / fp4 training, refused whatever else the plan sets (export.EVERY_PLAN)."""
    return (f"{p.dtype} training (Transformer Engine is configured in model code)", p.dtype in ("fp8", "fp4"),
            "export to megatron")


def optimizer_dtype_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """Adam states below fp32, refused whatever else the plan sets (export.EVERY_PLAN)."""
    return (f"optimizer states master {p.optimizer_master_dtype} / moments {p.optimizer_moment_dtype} (this export "
            "writes DeepSpeed's fp32 master and moments; its bf16 section keeps bf16 states only together with bf16 "
            "master weights and gradients, bf16_master_weights_and_grads)",
            p.optimizer_master_dtype != "fp32" or p.optimizer_moment_dtype != "fp32",
            "re-plan with --optimizer-master-dtype fp32 --optimizer-moment-dtype fp32, or export to megatron")


def param_remainders_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """The master kept as remainders, refused whatever else the plan sets (export.EVERY_PLAN)."""
    return ("the fp32 master kept as 16-bit remainders (Megatron-Core's store_param_remainders; DeepSpeed keeps a "
            "whole fp32 master)", bool(p.param_remainders), "re-plan with --no-param-remainders, or export to megatron")


def offload_layers_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """Megatron's activation offload, refused whatever else the plan sets (export.EVERY_PLAN)."""
    return (f"activation offload of {p.offload_layers} layers (Megatron-Core's cpu_offloading_num_layers; "
            "DeepSpeed's cpu_checkpointing offloads only the checkpointed layer inputs of full recompute)",
            p.offload_layers > 0, "re-plan without --offload-activations-layers, or export to megatron")


def dp_replicate_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """Hybrid sharding, refused whatever else the plan sets (export.EVERY_PLAN)."""
    return (f"hybrid sharding over {p.dp_replicate} replicas (Megatron's num_distributed_optimizer_instances; this "
            "export writes ZeRO over the whole data-parallel group)", p.dp_replicate > 1,
            "re-plan with --dp-replicate 1, or export to megatron")


def offload_modules_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """Megatron's fine-grained offload of listed modules, refused whatever else the plan sets (export.EVERY_PLAN)."""
    return (f"fine-grained activation offload of {', '.join(p.offload_modules)} (Megatron-Core's offload_modules; "
            "DeepSpeed's cpu_checkpointing offloads only the checkpointed layer inputs of full recompute)",
            bool(p.offload_modules), "re-plan without --offload-modules, or export to megatron")


def te_softmax_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """Transformer Engine's unfused attention softmax (softmax_kernel te, without fused attention), refused whatever
    else the plan sets (export.EVERY_PLAN): its mask build and scaled_masked_softmax are Megatron-Core's TE layer
    spec (Megatron-LM --attention-backend unfused), not the attention a DeepSpeed train.py runs."""
    return ("Transformer Engine's unfused attention softmax (softmax_kernel te: Megatron-Core's TE layer, whose "
            "mask build and kernel a DeepSpeed training script does not run)",
            where(p.flash_attention, False, p.softmax_kernel == "te"),
            "re-plan with --softmax-kernel fused or --flash-attention, or export to megatron")


def fp8_attention_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """FP8 attention, refused whatever else the plan sets (export.EVERY_PLAN)."""
    return ("FP8 dot-product attention (Transformer Engine's fp8_dpa)", bool(p.fp8_attention),
            "re-plan without fp8_attention, or export to megatron-bridge")


def overlapped_gather_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """The weight all-gather priced overlapped (overlap_param_gather) at ZeRO-1/2 with dp > 1, with or without a
    pipeline. DeepSpeed 0.19.8 gathers the updated weights inside the optimizer's step, on the compute stream, whole,
    before step() returns: runtime/zero/stage_1_and_2.py DeepSpeedZeroOptimizer.step -> all_gather_dp_groups, and
    BF16_Optimizer.step -> update_lp_params -> all_gather_dp_groups (runtime/bf16_optimizer.py), which is one
    dist.all_gather_into_tensor per parameter group (runtime/utils.py all_gather_into_tensor_dp_groups). That is the
    synchronous gather llmplan prices with overlap_param_gather false (docs/formulas.md#step.dp), not the gather
    hidden behind the first forward (pp 1) or waiting on the 1F1B warm-up's chain (pp > 1,
    docs/formulas.md#step.dp_later_stages). ZeRO-3 gathers per module as it runs (zero3_unit), not per step."""
    where = (f"under the pipeline (pp {p.pp}: Megatron-Core's later stages gather on the 1F1B warm-up's chain)"
             if p.pp > 1 else "behind the first forward")
    return (f"the weight all-gather overlapped {where} (overlap_param_gather, ZeRO-{p.zero}, dp {p.dp}; DeepSpeed "
            "gathers the weights whole inside the optimizer step, before the next forward)",
            p.overlap_param_gather and p.zero in (1, 2) and p.dp > 1,
            "re-plan with --no-overlap-param-gather, or search with --target deepspeed")


def fused_loss_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """A fused loss at tp > 1. This export writes tensor_parallel.vocab_parallel_lm_head true (config), so DeepSpeed
    0.19.8's AutoTP keeps the output head's logits vocabulary-parallel (module_inject/layers.py VocabParallelLinear:
    ColumnParallel, no output gather) and swaps in its own loss (sequence/cross_entropy.py
    configure_vocab_parallel_loss; backend torch: _VocabParallelCrossEntropy), which all-reduces the row max, the exp
    sum and the target logit in three calls of one fp32 a token, kernel by kernel on an fp32 copy: Megatron's
    unfused vocab-parallel loss, priced with fused_loss false (docs/formulas.md#comm.tp_edge, #compute.loss). The
    fused losses are priced as other calls (native: two all-reduces; te: one all-gather) on one fp32 copy."""
    return (f"the fused cross entropy at tp {p.tp} (fused_loss, fused_loss_impl {p.fused_loss_impl}: priced as "
            + ("Megatron-Core's fused_vocab_parallel_cross_entropy, two all-reduces a micro-batch" if
               p.fused_loss_impl == "native" else "Transformer Engine's parallel_cross_entropy, one all-gather")
            + "; DeepSpeed's vocabulary-parallel loss all-reduces three times, unfused)",
            p.fused_loss and p.tp > 1,
            "re-plan with --unfused-loss, or export to megatron")


def split_embedding_refusal(pf: PlanFile) -> tuple[str, bool, str]:
    """An untied input embedding priced as its vocabulary shard at tp > 1 (tp_whole_embedding false). DeepSpeed 0.19.8's
    training AutoTP (runtime/engine.py) converts the model's Hugging Face tp_plan (module_inject/tp_plan_converter.py)
    and its _replace_module (module_inject/auto_tp.py) shards an nn.Embedding only where a non-SKIP spec matches it:
    a Llama-style plan names no embed_tokens (untied), or embedding_rowwise, a SKIP spec; a tied one is sharded with
    the vocabulary-parallel head (_create_vocab_parallel_layer). So each TP rank holds an untied embedding whole, its
    gradient and optimizer states too (cost.params.whole_embedding)."""
    from llmplan.cost.params import vocab_shard_params
    m, p = pf.model, pf.plan
    whole, shard = m.vocab_size * m.hidden_size, vocab_shard_params(m, p.tp)
    return (f"the input embedding split over tp {p.tp} ({shard / 1e9:.2f} G parameters a rank priced; DeepSpeed's "
            f"AutoTP keeps an untied embed_tokens whole on each rank, {whole / 1e9:.2f} G)",
            p.tp > 1 and not m.tie_word_embeddings and not p.tp_whole_embedding,
            "re-plan with --tp-whole-embedding, or search with --target deepspeed")


def tp_synced_refusal(pf: PlanFile) -> tuple[str, bool, str]:
    """Weights every TP rank holds whole whose gradients llmplan sums (averages) over TP at tp > 1 without sequence
    parallelism (which DeepSpeed refuses): the per-head q/k norms and DeepSeek Sparse Attention's indexer
    (cost.comm.tp_synced_params), priced as Megatron-Core's one coalesced all-reduce at the step's end
    (docs/formulas.md#comm.tp_grad_sync). DeepSpeed 0.19.8's AutoTP hooks each such parameter's gradient instead
    (module_inject/auto_tp.py register_replicated_grad_hooks, the replicated_with_grad_allreduce entries of the
    model's HuggingFace tp_plan): one all-reduce per parameter per backward, in the model dtype, every micro-batch."""
    from llmplan.cost.params import tp_synced_layer_params
    from llmplan.cost.sparse import indexer_params
    m, p = pf.model, pf.plan
    qk = tp_synced_layer_params(m)[2] > 0
    indexer = m.mla is not None and indexer_params(m) > 0
    what = " and ".join(w for w, on in (("the per-head q/k norms (qk_norm)", qk),
                                        ("the sparse-attention indexer", indexer)) if on)
    return (f"{what or 'no TP-synced weights'} at tp {p.tp} (priced as Megatron-Core's one step-end TP all-reduce "
            "of their gradients; DeepSpeed's AutoTP all-reduces each one's gradient in its own call every "
            "micro-batch)", p.tp > 1 and bool(what), "re-plan with --tp 1, or export to megatron")


def pipelined_autotp_refusal(p: ParallelPlan) -> tuple[str, bool, str]:
    """Tensor parallelism (AutoTP) under the pipeline engine, which DeepSpeed 0.19.8 does not run, refused whatever
    else the plan sets (export.EVERY_PLAN: a search passes over its plans with both unasked). AutoTP training
    is TP + DP + ZeRO 0-2 (deepspeed.ai/tutorials/autotp-training): runtime/engine.py
    _configure_tensor_parallel_states puts the groups module in place of the PipelineModule's grid as the engine's
    mpu, whose _init_tp_mesh_device (utils/groups.py) builds a (world / tp, tp) data x tensor mesh with no pipeline
    axis, so the data-parallel group spans the stages and PipelineEngine.__init__ (runtime/pipe/engine.py) asserts
    dp_world_size == grid.data_parallel_size; before that, a PipelineModule builds only its stage's layers
    (runtime/pipe/module.py _build) under indexed names and has no Hugging Face tp_plan, so the fallback path of
    _apply_autotp_partitioning finds no nn.Linear named lm_head for the vocab_parallel_lm_head this export writes
    (module_inject/auto_tp.py _resolve_vocab_parallel_lm_head raises), and the last stage, with loss_fn and no
    loss_function, could not take DeepSpeed's loss (sequence/cross_entropy.py _set_vocab_parallel_loss)."""
    return (f"tensor parallelism (AutoTP, tp {p.tp}) with pipeline parallelism (pp {p.pp}) (DeepSpeed's AutoTP "
            "training runs TP with data parallelism and ZeRO only: its data x tensor mesh has no pipeline axis, "
            "and it finds no lm_head in a pipeline stage, runtime/engine.py _apply_autotp_partitioning)",
            (p.tp > 1) & (p.pp > 1),  # elementwise on a search's arrays (export.EVERY_PLAN)
            "re-plan with --pp 1 or --tp 1, or search with --target deepspeed, or export to megatron")


def check(pf: PlanFile) -> None:
    """Refuse, with the rule and its fix, a plan DeepSpeed cannot run as priced: not a training plan, the
    optimizer and the EVERY_PLAN rules, AutoTP or the pipeline engine under a ZeRO stage they refuse, then the
    first of _feature_rules and _layout_rules the plan has; last the gradient settings (check_grads)."""
    need_mode(pf, "train", TARGET)
    p = pf.plan
    # the optimizer first: no other change to the plan makes DeepSpeed run it, so a search's walk names it
    refuse_first(TARGET, (
        muon_refusal(p),
        kept_grad_shards_refusal(pf), fp32_embedding_grads_refusal(pf), fp32_sum_refusal(pf), delay_wgrad_refusal(pf),
        router_fusion_refusal(pf), router_padding_refusal(pf),
    ))
    if p.tp > 1 and p.zero >= 3:
        raise refuse(TARGET, f"tensor parallelism (AutoTP, tp {p.tp}) with ZeRO stage 3 (DeepSpeed's AutoTP training "
                     "supports ZeRO stages 0-2)", "re-plan with --zero 2 or --tp 1, or export to torchtitan")
    if p.pp > 1 and p.zero >= 2:
        raise refuse(TARGET, f"pipeline parallelism (pp {p.pp}) with ZeRO stage {p.zero} (DeepSpeed's pipeline engine "
                     "refuses ZeRO-2 and ZeRO-3)", "re-plan with --zero 1 or --pp 1, or export to megatron")
    refuse_first(TARGET, _feature_rules(p) + _layout_rules(pf) + [bias_add_refusal(pf, "the Hugging Face linears"),
                                                                 bias_gelu_refusal(pf, "the Hugging Face linears")])
    check_grads(pf)


def _feature_rules(p: ParallelPlan) -> list[tuple[str, bool, str]]:
    """(what, whether the plan has it, fix) for the parallel axes, precision, optimizer dtypes, kernels and
    offloading that DeepSpeed does not run; check refuses these before _layout_rules."""
    return [
        context_parallel_refusal(p),
        grad_checks_refusal(p),
        expert_parallel_refusal(p),
        sequence_parallel_refusal(p),
        (f"the {p.pp_schedule} pipeline schedule (DeepSpeed's pipeline engine runs 1F1B)",
         launcher_schedule("deepspeed", p.pp_schedule) is None,
         "re-plan with --pp-schedule 1f1b"),
        low_precision_refusal(p),
        (f"interleaved pipeline stages (vpp {p.vpp})", p.vpp > 1, "re-plan with --vpp 1 or export to megatron"),
        optimizer_dtype_refusal(p),
        param_remainders_refusal(p),
        swiglu_fp8_refusal(p),
        jit_activation_refusal(p),
        megatron_fsdp_refusal(p),
        offload_layers_refusal(p),
        dp_replicate_refusal(p),
        offload_moe_act_refusal(p),
        paged_stash_refusal(p),
        offload_modules_refusal(p),
        fp8_attention_refusal(p),
        te_softmax_refusal(p),
        loss_impl_refusal(p),
        pipelined_autotp_refusal(p),  # after the EVERY_PLAN rules, which a plan with it may also meet
    ]


def loss_impl_refusal(p: Any) -> tuple[str, Any, str]:
    """An unfused loss priced with another implementation's memory than this launcher runs (common.UNFUSED_LOSS_RUNS),
    refused whatever else the plan sets (export.EVERY_PLAN)."""
    return unfused_loss_refusal(p, TARGET)


def _layout_rules(pf: PlanFile) -> list[tuple[str, bool, str]]:
    """(what, whether the plan has it, fix) for the recompute, stage layout and pipeline exchanges DeepSpeed does
    not run, then the switches of the plan's pricing (tp_synced, fused loss, split embedding, overlapped gather),
    last."""
    p = pf.plan
    return [
        ("op-level selective checkpointing (torchtitan's per-op policy; DeepSpeed checkpoints whole layers)",
         p.recompute == "op", "re-plan with --recompute full or export to torchtitan"),
        (f"Megatron's per-module recompute ({', '.join(p.recompute_modules)}; DeepSpeed checkpoints whole layers)",
         bool(p.recompute_modules), "re-plan without --recompute-modules or export to megatron"),
        (f"recompute of the first {p.recompute_layers} layers only (DeepSpeed's activation checkpointing is set in "
         "model code)", p.recompute_layers is not None, "re-plan without --recompute-layers or export to megatron"),
        ("uneven pipeline stages (PipelineModule's partition_method is 'uniform', 'parameters' or 'type:REGEX'; "
         "none pins a layer count per stage)", is_uneven(pf),
         "re-plan with a pp that divides the layers, or export to megatron / torchtitan"),
        ("pipeline exchanges that synchronise the device (pp_blocking_sends: Megatron-LM 2021-22; DeepSpeed's "
         "pipeline engine sends with plain blocking send / recv, runtime/pipe/p2p.py)",
         p.pp_blocking_sends and p.pp > 1, "re-plan with --no-pp-blocking-sends, or export to megatron"),
        *op_fuser_refusals(pf),
        # last: the refusals above name a change to the plan's layout or features; these a switch of its pricing
        tp_synced_refusal(pf),
        fused_loss_refusal(p),
        split_embedding_refusal(pf),
        overlapped_gather_refusal(p),
    ]


# DeepSpeed 0.19.8 picks the optimizer wrapper from (model dtype, data_types.grad_accum_dtype, ZeRO stage,
# pipeline engine) in deepspeed/runtime/engine.py DeepSpeedEngine._do_optimizer_sanity_check:
#  - bf16 + fp32 accumulation + ZeRO stage 1 -> BF16_Optimizer (runtime/bf16_optimizer.py): a whole fp32
#    gradient buffer, all-reduced whole over DP (engine.buffered_allreduce_fallback; under the pipeline engine
#    PipelineEngine._bf16_reduce_grads), the fp32 master partitioned, the bf16 weights all-gathered after step;
#  - any other ZeRO stage -> the ZeRO optimizer (runtime/zero/stage_1_and_2.py, stage3.py): gradients kept in
#    grad_accum_dtype (ZeRO-2/3 in a partition of that dtype), reduced per zero_optimization.reduce_scatter;
#  - no ZeRO: the model dtype must equal grad_accum_dtype (else NotImplementedError); bf16 -> DDP_BFLOAT16
#    (FP16_Optimizer: whole fp32 master, bf16 gradients all-reduced), or under the pipeline engine
#    BF16_Optimizer (its fp32 master partitioned over DP and the weights all-gathered: ZeRO-1's pattern).
# The gradients cross the wire in communication_data_type (engine.allreduce_bucket and the ZeRO optimizer's
# reductions cast to it), so the export writes it as the plan's gradient dtype, or bf16 under grad_reduce_dtype
# bf16 (BF16_Optimizer's fp32 groups cast to a bf16 copy for the all-reduce: reduce_dtype). Always written,
# never left to the default, which DeepSpeed changed twice (engine.py communication_data_type): from d14baad94
# (v0.5.8) fp16 for fp16 or any ZeRO stage >= 1 (so bf16 gradients cast to fp16 there), bf16 for bf16 at stage
# 0, else fp32; from 261d63708 (v0.9.0) fp16 for fp16, else fp32 (bf16 runs reduced in fp32); from d56268f37
# (v0.9.2) the model dtype, as at 0.19.8. A config read by another release then reduces what the plan prices.
_RULE = "DeepSpeed 0.19.8 runtime/engine.py _do_optimizer_sanity_check"


def grad_accum_dtype(pf: PlanFile) -> str:
    """DeepSpeed's name of the dtype the plan keeps and reduces its gradients in."""
    p = pf.plan
    if p.dtype == "fp32" or p.grad_dtype == "fp32":
        return "fp32"
    return "fp16" if p.dtype == "fp16" else "bf16"


def reduce_dtype(pf: PlanFile) -> str:
    """DeepSpeed's communication_data_type for the plan: bf16 under grad_reduce_dtype bf16 (check_plan holds it to
    the BF16_Optimizer's plans, whose engine.allreduce_bucket casts each fp32 group to it), else the gradient dtype
    (grad_accum_dtype: no cast)."""
    return "bf16" if pf.plan.grad_reduce_dtype == "bf16" else grad_accum_dtype(pf)


def accumulation(pf: PlanFile) -> tuple[str, str]:
    """(ParallelPlan.grad_accumulation DeepSpeed runs, why): it has no gradient accumulation fusion. ZeRO-2/3
    add each micro-batch's reduced partition into the grad_accum_dtype partition (runtime/zero/stage_1_and_2.py,
    stage3.py); BF16_Optimizer (16-bit weights, fp32 accumulation, ZeRO <= 1) casts each micro-batch's gradient
    to fp32 and adds it (runtime/bf16_optimizer.py update_hp_grads); otherwise autograd adds into param.grad."""
    p = pf.plan
    if p.zero >= 2:
        return "add", "ZeRO-2/3 add each micro-batch's reduced partition into the accumulated one"
    if p.dtype in ("bf16", "fp16") and grad_accum_dtype(pf) != p.dtype:
        return "cast-add", ("each micro-batch's 16-bit gradient is cast to the fp32 accumulation dtype, then "
                            "added (BF16_Optimizer update_hp_grads)")
    return "add", "autograd adds each micro-batch's gradient into param.grad"


def check_grads(pf: PlanFile) -> None:
    """Refuse the plans whose gradient dtype / reduction / accumulation DeepSpeed would run otherwise than llmplan
    prices (the accumulation last)."""
    p = pf.plan
    if p.dtype in ("bf16", "fp16"):
        check_grad_dtype(pf)
    check_accumulation(pf, TARGET, "DeepSpeed", *accumulation(pf))  # the default fused: a note (notes)


def notes(pf: PlanFile) -> tuple[str, ...]:
    """The export header's notes: the gradient accumulation DeepSpeed runs where the plan priced the default; how
    a ZeRO-3 plan gathering per tensor runs (zero3_tensor); the pipeline transfers it runs one at a time; at
    tp > 1, that the loss must go through the model's labels (vocab_parallel_notes)."""
    return (accumulation_notes(pf, "DeepSpeed", *accumulation(pf)) + zero3_notes(pf) + pp_send_notes(pf)
            + vocab_parallel_notes(pf) + bias_add_notes(pf, "DeepSpeed"))


def vocab_parallel_notes(pf: PlanFile) -> tuple[str, ...]:
    """The note of a tp > 1 plan, written with tensor_parallel.vocab_parallel_lm_head (config): DeepSpeed 0.19.8
    keeps the head's logits split over the TP ranks (module_inject/layers.py VocabParallelLinear, no output
    gather) and puts its vocabulary-parallel loss in the Hugging Face model's loss_function hook
    (sequence/cross_entropy.py configure_vocab_parallel_loss -> _set_vocab_parallel_loss), which the model runs
    only when its forward is given labels. A script's own cross entropy on .logits sees one rank's shard of the
    vocabulary: a wrong loss, with no error where it reads the class count off the logits."""
    p = pf.plan
    if p.tp == 1:
        return ()
    return (f"note: tp {p.tp}: the output head stays vocabulary-parallel (tensor_parallel.vocab_parallel_lm_head), "
            f"so .logits holds 1/{p.tp} of the vocabulary on each TP rank and DeepSpeed's loss runs only through "
            "the model's labels: take loss = model(input_ids, labels=labels).loss; cross entropy computed on "
            ".logits in the training script is wrong",)


def pp_send_notes(pf: PlanFile) -> tuple[str, ...]:
    """The note of a pipelined plan priced with Megatron's paired exchanges (pp_unbatched_sends false): DeepSpeed's
    pipeline engine runs each step's receive and send one after the other (deepspeed/runtime/pipe/schedule.py
    TrainSchedule; docs/formulas.md#step.pp_unbatched), whatever the config says."""
    p = pf.plan
    if p.pp == 1 or p.pp_unbatched_sends:
        return ()
    return ("note: priced with 1F1B's sends and receives paired into batched exchanges (pp_unbatched_sends "
            "false); DeepSpeed's pipeline engine runs them one at a time, so this runs slower than priced: "
            "re-plan with --pp-unbatched-sends to price it",)


# DeepSpeed's ZeRO-3 gathers each submodule's own parameters (one coalesced all-gather per module; per tensor for
# bias-free linears and norms) when its forward or backward hook fires, and prefetches the next ones in the
# recorded trace only while stage3_prefetch_bucket_size > 0; after the module it releases every parameter not
# used again within stage3_max_reuse_distance elements of the trace, so at 0 a recompute forward gathers again.
# Source: deepspeedai/DeepSpeed deepspeed/runtime/zero/partitioned_param_coordinator.py at 00a31c99
# (fetch_sub_module: `if self.__prefetch_bucket_sz > 0`; __params_to_release: max_reuse_dist_in_numel);
# docs/_pages/config-json.md (stage3_prefetch_bucket_size, stage3_max_reuse_distance).
ZERO3_TENSOR = {"stage3_prefetch_bucket_size": 0, "stage3_max_reuse_distance": 0}
"""What makes DeepSpeed gather ZeRO-3 weights per tensor, as llmplan prices zero3_unit tensor: each module's
weights when it runs (no prefetch), released after it (a recompute forward gathers them again)."""


def zero3_notes(pf: PlanFile) -> tuple[str, ...]:
    """The note of a ZeRO-3 plan priced per tensor (zero3_unit tensor, DeepSpeed's stage 3 of 2021): written with
    ZERO3_TENSOR, it gathers as priced, but DeepSpeed 0.19 issues the gathers on a side stream without 2021's
    device synchronisation around each one (priced as host waits, cost.comm.zero3_host_seconds) and reduces the
    gradients in buckets, not per tensor."""
    p = pf.plan
    if p.zero < 3 or p.zero3_unit != "tensor":
        return ()
    return ("note: zero3_unit tensor: each module's weights are gathered when it runs and released after it "
            "(stage3_prefetch_bucket_size 0, stage3_max_reuse_distance 0), so a recompute forward gathers them "
            "again, as priced; DeepSpeed 0.19 skips the 2021 stage 3's device synchronisation around each gather "
            "(priced as host waits) and reduces gradients in reduce_bucket_size buckets, so it runs a little "
            "faster than priced",)


def check_grad_dtype(pf: PlanFile) -> None:
    """The 16-bit plans' gradient dtype and reduction as DeepSpeed's optimizer wrapper runs them."""
    p = pf.plan
    g = grad_accum_dtype(pf)
    if p.zero == 0 and g != p.dtype:
        raise refuse(TARGET, f"{g} gradients with {p.dtype} weights and ZeRO stage 0 ({_RULE}: without ZeRO the "
                     "gradient accumulation dtype must equal the model dtype, else 'unsupported mix')",
                     "re-plan with --grad-dtype bf16 (16-bit gradients), or --zero 1 --grad-reduce all-reduce")
    # edaa72212 engine.py _do_optimizer_sanity_check: model_dtype == grad_accum_dtype == bf16 under a
    # PipelineModule returns BFLOAT16 at any DP size; bf16_optimizer.py keeps a flat gradient in grad_acc_dtype
    # (bf16 here) beside each param.grad, which update_hp_grads(clear_lp_grads=False) leaves
    if p.zero == 0 and p.dtype == "bf16" and p.pp > 1:
        why = ("which partitions the fp32 master over DP and all-gathers the weights after each step, i.e. ZeRO-1"
               if p.dp > 1 else "whose bf16 flat gradient sits beside the kept bf16 param.grad, 4 bytes a "
               "parameter where 2 are priced")
        raise refuse(TARGET, f"ZeRO stage 0 with bf16 under the pipeline engine (pp {p.pp}, dp {p.dp}; {_RULE}: "
                     f"this runs BF16_Optimizer, {why})", "re-plan with --zero 1 --grad-reduce all-reduce")
    if p.zero == 1 and p.dtype == "bf16" and g == "fp32" and p.grad_reduce != "all-reduce":
        raise refuse(TARGET, f"ZeRO-1 fp32 gradients reduce-scattered (grad_dtype fp32, grad_reduce "
                     f"{p.grad_reduce}; {_RULE}: bf16 + fp32 grad_accum_dtype + ZeRO stage 1 runs BF16_Optimizer, "
                     "which all-reduces the whole fp32 gradient)",
                     "re-plan with --grad-reduce all-reduce (as DeepSpeed runs it) or --grad-dtype bf16 "
                     "(the ZeRO optimizer)")


def config(pf: PlanFile) -> dict:
    p = pf.plan
    zero = {"stage": p.zero, "overlap_comm": p.overlap_grad_reduce, "contiguous_gradients": True,
            "reduce_scatter": p.grad_reduce == "reduce-scatter", "reduce_bucket_size": int(5e8),
            "allgather_bucket_size": int(5e8)}
    if p.zero == 3:
        zero.update({"stage3_prefetch_bucket_size": int(5e7), "stage3_param_persistence_threshold": int(1e5),
                     "stage3_max_live_parameters": int(1e9)})
        if p.zero3_unit == "tensor":
            zero.update(ZERO3_TENSOR)
    cfg = {
        # one string per line, each fitting 80 columns as json.dumps(indent=2) lays it out: '    "...",'
        "comment": comment_strings(header_lines(pf, "DeepSpeed (config checked with DeepSpeed 0.19.8)", notes(pf)),
                                   WIDTH - 7),
        "train_batch_size": p.global_batch,
        "train_micro_batch_size_per_gpu": p.micro_batch,
        "gradient_accumulation_steps": p.num_microbatches,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": p.dtype == "bf16"},
        "fp16": {"enabled": p.dtype == "fp16"},
        "zero_optimization": zero,
        "steps_per_print": 10,
    }
    if p.dtype in ("bf16", "fp16"):  # DeepSpeed's defaults for both are the model dtype
        cfg["data_types"] = {"grad_accum_dtype": grad_accum_dtype(pf)}
        cfg["communication_data_type"] = reduce_dtype(pf)
    if p.recompute != "none":
        cfg["activation_checkpointing"] = {"partition_activations": p.tp > 1, "contiguous_memory_optimization": False,
                                           "cpu_checkpointing": False, "number_checkpoints": None,
                                           "synchronize_checkpoint_boundary": False, "profile": False}
    if p.tp > 1:  # the head's logits vocabulary-parallel and DeepSpeed's loss over them (fused_loss_refusal)
        cfg["tensor_parallel"] = {"autotp_size": p.tp, "vocab_parallel_lm_head": True,
                                  "vocab_parallel_ce_backend": "torch"}
    return cfg


def render(pf: PlanFile) -> dict[str, str]:
    check(pf)
    c, p = pf.cluster, pf.plan
    env = launch_env_lines(pf)
    launch = (sh_header(pf, "DeepSpeed launcher", notes(pf))
              + "set -euo pipefail\n" + "".join(f"{line}\n" for line in env)
              + f"# train_batch_size {p.global_batch} = micro-batch {p.micro_batch} x gradient accumulation "
              f"{p.num_microbatches} x data parallel {p.dp}\n"
              + (f"# pipeline stages ({p.pp}) are set in the training script: PipelineModule(num_stages={p.pp}, "
                 f"partition_method=\"type:<transformer block class>\") splits the {pf.model.num_hidden_layers} "
                 f"layers evenly\n" if p.pp > 1 else "")
              +
              f"deepspeed --num_nodes {c.num_nodes} --num_gpus {c.gpus_per_node_used} "
              f"--hostfile \"${{HOSTFILE:-hostfile}}\" "
              f"\"${{TRAIN_SCRIPT:-train.py}}\" --deepspeed --deepspeed_config ds_config.json\n")
    files = {"ds_config.json": json.dumps(config(pf), indent=2) + "\n", "deepspeed_launch.sh": launch}
    # DeepSpeed's multi-node runner forwards only NCCL_*, PYTHON*, ... and the lines of ./.deepspeed_env
    # (deepspeed/launcher/runner.py: EXPORT_ENVS, DEEPSPEED_ENVIRONMENT_NAME); it runs from this folder
    if env and c.num_nodes > 1:
        files[".deepspeed_env"] = "".join(line.split()[1] + "\n" for line in env)  # NAME=VALUE of each export
    return files
