"""What every exporter shares: the plan file it renders, its header comment, and the refusal error."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable
from typing import Any

from llmplan import __version__
from llmplan.arith import where
from llmplan.cost.params import stage_layer_list
from llmplan.cost.compute import runs_per_expert
from llmplan.cost.gemm import squared_relu_mlp
from llmplan.cost.memory import logit_bytes_of
from llmplan.errors import LlmplanError
from llmplan.specs.rule import as_bool
from llmplan.planfile import PlanFile
from llmplan.specs.check import check_plan, te_comm_types
from llmplan.specs.layout import format_layout
from llmplan.specs.plan import ParallelPlan
from llmplan.units import GIB


class CannotExpress(LlmplanError):
    """The target launcher cannot express this plan; nothing is written."""


def refuse(target: str, what: str, fix: str) -> CannotExpress:
    return CannotExpress(f"{target} cannot express this plan: {what}; {fix}")


def refuse_first(target: str, rules: Iterable[tuple[str, Any, str]]) -> None:
    """Raise refuse(target, what, fix) for the first rule (what, whether the plan has it, fix) the plan has; the
    order of the rules is the order of the refusals a user meets."""
    for what, bad, fix in rules:
        if bad:
            raise refuse(target, what, fix)


LAUNCHER_SCHEDULES: dict[str, dict[str, tuple[str, str | None] | None]] = {
    # Megatron-LM / Megatron-Core: 1F1B by default, interleaved with virtual stages (no schedule flag);
    # pipeline_parallel/schedules.py has neither zero-bubble nor DualPipe.
    "megatron": {"1f1b": ("1F1B", "interleaved 1F1B"), "zero-bubble": None, "dualpipe": None},
    "megatron-bridge": {"1f1b": ("1F1B", "interleaved 1F1B"), "zero-bubble": None, "dualpipe": None},
    # torchtitan --parallelism.pipeline-parallel-schedule (torch.distributed.pipelining schedule classes);
    # its ZBVZeroBubble and DualPipeV need two V-shaped stages per rank, which this export does not write.
    "torchtitan": {"1f1b": ("1F1B", "Interleaved1F1B"), "zero-bubble": None, "dualpipe": None},
    # DeepSpeed's pipeline engine (deepspeed.runtime.pipe.schedule.TrainSchedule): 1F1B, no virtual stages.
    "deepspeed": {"1f1b": ("1F1B", None), "zero-bubble": None, "dualpipe": None},
}
"""Launcher -> --pp-schedule name -> what the launcher calls it (one stage per rank, interleaved; None where
it cannot interleave), or None where the export cannot express the schedule (it refuses). Every launcher has
an entry for every schedule of specs.schedule.SCHEDULES (tested)."""


def launcher_schedule(launcher: str, schedule: str, vpp: int = 1) -> str | None:
    """What `launcher` calls `schedule` at `vpp` virtual stages per rank; None: it cannot express it (a
    schedule missing from LAUNCHER_SCHEDULES is refused too)."""
    names = LAUNCHER_SCHEDULES[launcher].get(schedule)
    return None if names is None else names[1] if vpp > 1 else names[0]


def header_lines(pf: PlanFile, target: str, notes: tuple[str, ...] = ()) -> list[str]:
    """The comment every exported file starts with: plan, model, hardware, predictions, and the target's `notes`
    (where it runs something the plan priced otherwise, and by how much that matters)."""
    c, pred = pf.cluster, pf.predictions
    gib = GIB
    mem = pred.get("memory", {})
    if pf.mode == "infer":
        shape = pf.plan.describe()
        perf = serve_perf(pred)
    else:
        shape = pf.plan.describe(batch=True)
        t = pred.get("time", {})
        perf = (f"step {t.get('step_s', 0):.3f} s, MFU {100 * pred.get('throughput', {}).get('mfu', 0):.1f}%, "
                f"{pred.get('throughput', {}).get('tokens_per_s', 0):,.0f} tokens/s")
    return [
        f"llmplan {__version__} export for {target}",
        f"plan: {shape}",
        f"model: {pf.model.name} ({pf.model.source or 'no source given'})",
        f"hardware: {c.num_nodes} x {c.system.name} = {c.num_gpus} x {c.system.gpu.name}",
        f"predicted: {mem.get('total', 0) / gib:.1f} of {mem.get('capacity', 0) / gib:.1f} GiB per GPU; {perf}",
        *notes,
    ]


def serve_perf(pred: dict) -> str:
    """A serving plan's predicted timing for the header: for a batch that does not fit (the estimate gives no
    timing for it), the timing at the most sequences that fit, which the export admits (export.serve.admission)."""
    fit = pred.get("at_fitting_batch")
    if pred.get("achievable", True) is False:
        if not isinstance(fit, dict):
            return "the planned batch does not fit, so no TTFT or TPOT is achievable for it"
        return (f"the planned batch does not fit; at the {fit['batch']:,} sequences per replica that fit: TTFT "
                f"{fit['ttft_s'] * 1e3:.1f} ms, TPOT {fit['tpot_s'] * 1e3:.2f} ms, {fit['tokens_per_s']:,.0f} output "
                "tokens/s")
    return (f"TTFT {pred.get('ttft_s', 0) * 1e3:.1f} ms, TPOT {pred.get('tpot_s', 0) * 1e3:.2f} ms, "
            f"{pred.get('throughput', {}).get('tokens_per_s', 0):,.0f} output tokens/s")


WIDTH = 80  # exported files fit 80 columns (the brief's output rule)


def comment_lines(text: str, mark: str = "#") -> list[str]:
    """`text` as `mark` comment lines of at most WIDTH columns: words kept whole and in order, continuation lines
    indented under the first ('#   '); a single word longer than a line stays whole on its own line."""
    return textwrap.wrap(text, WIDTH, initial_indent=f"{mark} ", subsequent_indent=f"{mark}   ",
                         break_long_words=False, break_on_hyphens=False) or [mark]


def comment_block(lines: Iterable[str], mark: str = "#") -> str:
    """Each of `lines` wrapped by comment_lines, newline-terminated: the one writer of exported comments."""
    return "".join(f"{row}\n" for line in lines for row in comment_lines(line, mark))


def comment_strings(lines: Iterable[str], room: int) -> list[str]:
    """`lines` as strings of at most `room` columns, for a file without comments (JSON: a string is one value on
    one line, so a long note becomes a list of them): words kept whole and in order, continuation lines
    indented ('  ') as comment_lines indents them."""
    return [row for line in lines for row in textwrap.wrap(line, room, subsequent_indent="  ",
                                                           break_long_words=False, break_on_hyphens=False)]


COMMENTED = (".sh", ".sbatch", ".toml", ".yaml", ".yml")
"""Exported file kinds whose comments start with '#' (JSON has none: its notes are lists of comment_strings)."""


def fit_comments(name: str, text: str) -> str:
    """`text` of the exported file `name` with every whole-line '# ' comment wrapped by comment_lines; commands,
    settings and their trailing comments are left as written."""
    if not name.endswith(COMMENTED):
        return text
    return "".join(comment_block([line[2:]]) if line.startswith("# ") and len(line) > WIDTH else line + "\n"
                   for line in text.split("\n")[:-1]) + text.split("\n")[-1]


def sh_header(pf: PlanFile, target: str, notes: tuple[str, ...] = ()) -> str:
    return "#!/usr/bin/env bash\n" + comment_block(header_lines(pf, target, notes))


def accumulation_notes(pf: PlanFile, launcher: str, runs: str, why: str) -> tuple[str, ...]:
    """The header note of a launcher without gradient accumulation fused into the weight-gradient GEMM, for a plan
    priced with the default `fused` (ParallelPlan.grad_accumulation): it exports as the launcher runs it and says
    so, with the flag that prices it; a plan that names another value the launcher does not run is refused."""
    if pf.plan.grad_accumulation != "fused" or runs == "fused":
        return ()
    return (f"note: priced with gradient accumulation fused into the GEMM; {launcher} runs {runs} ({why}): "
            f"re-plan with --grad-accumulation {runs} to price it",)


def check_accumulation(pf: PlanFile, target: str, launcher: str, runs: str, why: str) -> None:
    """Refuse a plan that names a grad_accumulation a launcher without accumulation fusion does not run (`runs`,
    because `why`); the default fused is exported with accumulation_notes instead."""
    if pf.plan.grad_accumulation not in ("fused", runs):
        raise refuse(target, f"gradient accumulation {pf.plan.grad_accumulation} ({launcher} has no accumulation "
                     f"fused into the weight-gradient GEMM: {why}, i.e. {runs})",
                     f"re-plan with --grad-accumulation {runs}")


def cast_add_refusal(pf: PlanFile) -> tuple[str, bool, str]:
    """(what, whether the plan needs it, fix) for grad_accumulation cast-add on a Megatron-Core launch, which fuses
    the accumulation into the weight-gradient GEMM or adds into main_grad, never casts first."""
    return ("gradients cast and then added after each micro-batch (grad_accumulation cast-add, DeepSpeed's "
            "BF16_Optimizer; Megatron-Core fuses the accumulation or adds into main_grad)",
            pf.plan.grad_accumulation == "cast-add", "re-plan with --grad-accumulation fused or add")


def megatron_fsdp_refusal(p: Any) -> tuple[str, bool, str]:
    """(what, whether the plan needs it, fix) for a plan priced as Megatron-FSDP runs ZeRO-2 / 3
    (plan.megatron_fsdp), on a launcher whose sharding is DeepSpeed's or FSDP's."""
    # Megatron-LM and Megatron-Bridge export ZeRO-2 (optim_grads) and ZeRO-3 (optim_grads_params)
    return ("ZeRO priced as Megatron-FSDP runs it (megatron_fsdp: its gradient-bucket queue and prefetch; "
            "Megatron-LM / Megatron-Bridge)", bool(p.megatron_fsdp), "re-plan with --no-megatron-fsdp"
            + (", or export to megatron" if p.zero >= 2 else ""))


def swiglu_fp8_refusal(p: Any) -> tuple[str, bool, str]:
    """The SwiGLU input kept in fp8, which torchtitan and DeepSpeed refuse whatever else the plan sets
    (export.EVERY_PLAN)."""
    return ("the SwiGLU input kept in fp8 (Megatron-Core's activation_func_fp8_input_store)",
            bool(p.swiglu_fp8_input), "re-plan with --no-swiglu-fp8-input, or export to megatron-bridge")


def jit_activation_refusal(p: Any) -> tuple[str, bool, str]:
    """The gated activation priced as Megatron-Core's jit_fuser kernel (ParallelPlan.jit_activation:
    bias_swiglu_impl, torch.compile'd; docs/formulas.md#compute.jit_activation), which torchtitan and DeepSpeed
    refuse whatever else the plan sets (export.EVERY_PLAN): neither runs that kernel (torchtitan's FeedForward.forward
    is F.silu(self.w1(x)) * self.w3(x), pytorch/torchtitan torchtitan/models/llama3/model/model.py at 6404b93,
    compiled with the block, if at all; a ds_config.json carries no activation kernel). The rule reads the plan
    alone (search --target words it on plans without their model: export.every_plan_reason), so it names both gated
    kernels the switch prices (check_plan rule jit_activation takes any gated MLP): SwiGLU's bias_swiglu_impl and
    GeGLU's bias_geglu_impl (NVIDIA/Megatron-LM megatron/core/fusions/fused_bias_swiglu.py, fused_bias_geglu.py,
    both @jit_fuser)."""
    return ("the gated activation priced as Megatron-Core's jit_fuser kernel (jit_activation: bias_swiglu_impl for "
            "SwiGLU, bias_geglu_impl for GeGLU), a kernel this launcher does not run", bool(p.jit_activation),
            "set jit_activation false in the plan, or export to megatron / megatron-bridge")


UNFUSED_LOSS_RUNS: dict[str, str] = {
    "megatron": "vocab-parallel", "megatron-bridge": "vocab-parallel",
    "deepspeed": "eager-vocab-parallel", "torchtitan": "eager", "torchtitan-0.2": "eager"}
"""Training target -> the ParallelPlan.unfused_loss_impl whose memory prices the loss it runs with fused_loss off,
the one rule that both its export (unfused_loss_refusal) and a search for it (cli.search.train_search) read.
Megatron-LM (d98e8a6) and Megatron-Bridge (its Megatron-Core, cd4afffa6) run Megatron-Core's
vocab_parallel_cross_entropy (megatron/core/tensor_parallel/cross_entropy.py: .float() in calculate_logits_max,
then -=, exp(out=), div_ and the backward's mul_ in place on that one fp32 copy): vocab-parallel. torchtitan runs
PyTorch's eager cross_entropy on the fp32-cast logits: eager. DeepSpeed runs the Hugging Face model's loss (eager
cross_entropy on fp32 logits) at tp 1 and, at tp > 1, its AutoTP vocabulary-parallel loss
(deepspeed/sequence/cross_entropy.py _VocabParallelCrossEntropy, backend torch, read at a64a221ef: logits.float(),
then exp(logits - max) into new fp32 tensors, exp saved, backward exp / sum a new tensor): nothing in place, 14 bytes
a logit at its forward: eager-vocab-parallel, which is eager at tp 1 (docs/validation.md#loss-mend, #edges-70). A
plan whose implementation is priced with the same bytes at its tp is not refused (eager at tp 1 for deepspeed)."""

_UNFUSED_LOSS_CODE = {"vocab-parallel": "Megatron-Core's vocab_parallel_cross_entropy, in place on one fp32 copy",
                      "eager": "PyTorch's cross_entropy on fp32 logits, with no in-place step",
                      "eager-vocab-parallel": "the model's eager cross_entropy at tp 1, at tp > 1 a "
                                              "vocabulary-parallel loss of new fp32 tensors"}


def unfused_loss_refusal(p: Any, target: str) -> tuple[str, Any, str]:
    """(what, whether the plan has it, fix) for an unfused loss priced with another implementation's memory than
    the one `target` runs (UNFUSED_LOSS_RUNS), refused whatever else the plan sets (export.EVERY_PLAN)."""
    runs = UNFUSED_LOSS_RUNS[target]
    return (f"the unfused loss priced as unfused_loss_impl {p.unfused_loss_impl} (fused_loss off), but this "
            f"launcher runs {runs} ({_UNFUSED_LOSS_CODE[runs]})",
            ~as_bool(p.fused_loss) & as_bool(logit_bytes_of(p.unfused_loss_impl, p.tp) != logit_bytes_of(runs, p.tp)),
            f"re-plan with --unfused-loss-impl {runs}, or --fused-loss")


def delayed_bf16_layers_refusal(p: Any) -> tuple[str, bool, str]:
    """(what, whether the plan needs it, fix) for layers kept in bf16 under fp8 per-tensor delayed scaling, which
    Megatron-LM and Megatron-Bridge refuse whatever else the plan sets (export.EVERY_PLAN): Megatron-LM
    transformer_config.py (d98e8a6), "Delayed scaling does not support first / last layer in BF16." Under an fp8
    recipe the layers kept are the pinned ones (specs.quantities.bf16_layer_counts: NVFP4 alone has a default)."""
    delayed = p.dtype == "fp8" and p.recipe == "tensorwise" and p.fp8_scaling == "delayed"
    return ("layers kept in bf16 under fp8 delayed scaling (Megatron-Core keeps them only under current scaling)",
            delayed and bool(p.bf16_layers_start or p.bf16_layers_end), "re-plan with --fp8-scaling current")


def rendezvous_lines(pf: PlanFile) -> list[str]:
    """The start of a Megatron-Core torchrun script's body: strict bash, then the node and rendezvous variables,
    each overridable from the environment, and the plan's environment (op_fuser_env_lines too)."""
    c = pf.cluster
    return ["set -euo pipefail", "", f"GPUS_PER_NODE=${{GPUS_PER_NODE:-{c.gpus_per_node_used}}}",
            f"NNODES=${{NNODES:-{c.num_nodes}}}", "NODE_RANK=${NODE_RANK:-0}",
            "MASTER_ADDR=${MASTER_ADDR:-localhost}", "MASTER_PORT=${MASTER_PORT:-6000}", *launch_env_lines(pf),
            *op_fuser_env_lines(pf)]


def launch_env_lines(pf: PlanFile) -> list[str]:
    """The environment the plan prices, exported before the launcher (its workers inherit it): CUDA_LAUNCH_BLOCKING=1
    with launch_blocking (every kernel launch returns when the kernel is done; CUDA C++ Programming Guide,
    "Concurrent Execution between Host and Device"), and CUDA_MODULE_LOADING=EAGER without cuda_lazy_loading
    (PyTorch sets LAZY only where the variable is unset, pytorch/pytorch PR #86509; CUDA Programming Guide,
    Lazy Loading)."""
    p = pf.plan
    return ((["export CUDA_LAUNCH_BLOCKING=1   # the plan's launch_blocking (priced: the GPU idles between launches)"]
             if p.launch_blocking else [])
            + (["export CUDA_MODULE_LOADING=EAGER   # the plan's cuda_lazy_loading off (priced: every kernel image "
                "in the CUDA context)"] if not p.cuda_lazy_loading else []))


def tp_refusals(pf: PlanFile) -> list[tuple[str, bool, str]]:
    """(what, whether the plan needs it, fix) for the TP / pipeline switches a Megatron-Core or torchtitan launch
    cannot turn: synchronous backward TP collectives (tp_backward_overlap off: Megatron-LM's
    --async-tensor-model-parallel-allreduce is gone, the overlap always on; DTensor's are scheduled by the
    compiler) and pipeline scatter/gather without sp (Megatron-Core's p2p sends a stage's whole output from every
    TP rank; Megatron-LM dropped scatter/gather when the pipeline moved into Megatron-Core)."""
    p = pf.plan
    return [
        ("synchronous backward TP collectives (tp_backward_overlap off; the launcher always overlaps the "
         "input-gradient collectives with the weight-gradient GEMMs)",
         not p.tp_backward_overlap and p.tp > 1 and not (p.tp_comm_overlap and p.sp),
         "re-plan with --tp-backward-overlap"),
        (f"pipeline scatter/gather without sp (tp {p.tp}, pp {p.pp}; the launcher sends a stage's whole output "
         "from every TP rank)", p.pp_scatter_gather and p.pp > 1 and p.tp > 1 and not p.sp,
         "re-plan with --no-pp-scatter-gather, or with --sp"),
    ]


def norm_kernel_refusals(pf: PlanFile) -> list[tuple[str, bool, str]]:
    """(what, whether the plan needs it, fix) for a norm backward priced in two passes (ParallelPlan.norm_kernel
    two-pass: Apex FusedLayerNorm, Megatron-LM's 2020-21 fused_kernels copy, PyTorch's F.layer_norm) on a launcher
    whose norms run one pass (Megatron-Core's and Megatron-Bridge's Transformer Engine norms; torchtitan's RMSNorm
    compiled with its block); docs/formulas.md#compute.norm_bytes."""
    p = pf.plan
    what = ("a norm backward in two passes (norm_kernel two-pass: Apex FusedLayerNorm, F.layer_norm; this "
            "launcher's norms reduce the weight gradient in the input gradient's pass)")
    return [(what, p.norm_kernel == "two-pass" and p.fused_kernels, "re-plan with --norm-kernel fused-one-pass")]


SOFTMAX_KERNEL_WORDS = {
    "fused": "Megatron's fused causal softmax (softmax_kernel fused: scaled_upper_triang_masked_softmax over the lower "
             "triangle, or its fp32 torch fallback past 4096 keys)",
    "eager": "an eager attention softmax (softmax_kernel eager: masked_fill_ and torch softmax, Megatron-LM 2020)",
    "eager-fp32": "an attention softmax as fp32 PyTorch ops (softmax_kernel eager-fp32: Megatron-DeepSpeed's "
                  "fallback)",
    "te": "Transformer Engine's unfused attention softmax (softmax_kernel te: the mask built in every layer, then "
          "scaled_masked_softmax over whole rows)"}
"""How softmax_kernel_refusals names each ParallelPlan.softmax_kernel value."""


def softmax_kernel_refusals(pf: PlanFile, runs: str = "fused", fix: str | None = None) -> list[tuple[str, bool, str]]:
    """(what, whether the plan needs it, fix) for an unfused attention whose softmax the plan prices by a kernel
    path other than `runs`, the one this launcher's unfused attention runs: fused for Megatron-Core's own
    FusedScaleMaskSoftmax (masked_softmax_fusion on by default; no export target runs it now); te for Megatron-LM's
    --attention-backend unfused under its default Transformer Engine layer spec (NVIDIA/Megatron-LM@d98e8a64dd
    gpt_builders.py, language_module.py _set_attention_backend: NVTE_UNFUSED_ATTN only; --attention-backend local
    asserts --spec local), which runs TE's UnfusedDotProductAttention and FusedScaleMaskSoftmax. `fix` replaces
    "re-plan with --softmax-kernel <runs>" where the launcher refuses unfused attention anyway (Megatron-Bridge).
    docs/formulas.md#compute.score_bytes, #compute.eager_softmax, #compute.te_softmax."""
    return [softmax_kernel_refusal(pf.plan, kernel, runs, fix) for kernel in SOFTMAX_KERNEL_WORDS if kernel != runs]


def softmax_kernel_refusal(p: Any, kernel: str, runs: str = "fused", fix: str | None = None) -> tuple[str, bool, str]:
    """(what, whether the plan needs it, fix) for one softmax_kernel value `kernel` of an unfused attention on a
    launcher whose unfused attention runs `runs` (softmax_kernel_refusals); its condition reads the plan's
    softmax_kernel and flash_attention alone, elementwise on a search's arrays, so that a target refusing every
    unfused plan of that kernel lists it in export.EVERY_PLAN (the Megatron-LM export: every kernel but te)."""
    bad = where(p.flash_attention, False, p.softmax_kernel == kernel)
    return (f"{SOFTMAX_KERNEL_WORDS[kernel]}; this launcher runs {SOFTMAX_KERNEL_WORDS[runs].split(' (')[0]}", bad,
            fix or f"re-plan with --softmax-kernel {runs}")


EP_OVERLAP_RULES = ("ep_comm_overlap_ep", "recompute_moe_overlap", "ep_overlap_vpp", "ep_overlap_full_recompute",
                    "ep_overlap_mtp", "ep_overlap_dtype")
"""check_plan's rules for the EP all-to-all overlap, which Megatron-Core's TransformerConfig and Megatron-Bridge's
CommOverlapConfig assert (a plan built in memory, or a plan file written before the rules, may break them): the
Megatron-Core exports refuse such a plan in check_plan's words rather than restate the rules."""


def check_ep_overlap(pf: PlanFile, target: str) -> None:
    """Refuse, for `target`, a plan that breaks one of check_plan's EP_OVERLAP_RULES (none can unless it turns the
    EP overlap on): the first violation's message and rule, as check_plan words them."""
    if not (pf.model.is_moe and pf.plan.ep_comm_overlap):
        return
    for v in check_plan(pf.model, pf.plan):
        if v.rule in EP_OVERLAP_RULES:
            raise CannotExpress(f"{target} cannot express this plan: {v.message} (check_plan rule {v.rule})")


def ep_overlap_refusal(pf: PlanFile) -> tuple[str, bool, str]:
    """(what, whether the plan needs it, fix) for the EP all-to-all overlap (ep_comm_overlap, priced by
    cost.moe's overlap windows) on a launcher that does not run Megatron-Core's combined-1F1B schedule
    (--overlap-moe-expert-parallel-comm): the all-to-alls would run exposed, slower than priced."""
    p = pf.plan
    return ("the EP all-to-all overlap (ep_comm_overlap: Megatron-Core's combined-1F1B schedule, which this launcher "
            "does not run)", pf.model.is_moe and p.ep_comm_overlap and p.ep > 1,
            "re-plan with --no-ep-comm-overlap, or export to megatron or megatron-bridge")


def router_fusion_refusal(pf: PlanFile) -> tuple[str, bool, str]:
    """(what, whether the plan needs it, fix) for Transformer Engine's fused MoE router (moe_router_fusion): a
    Megatron-Core option (router.py, moe_utils.py fused=config.moe_router_fusion at d98e8a6); a launcher with its
    own router runs torch.topk eagerly, so the run would launch what the unfused plan prices
    (docs/formulas.md#moe.router_fusion)."""
    return ("Transformer Engine's fused MoE router (moe_router_fusion: a Megatron-Core option; this launcher's "
            "router runs eager torch.topk)", pf.model.is_moe and pf.plan.moe_router_fusion,
            "re-plan with --no-moe-router-fusion, or export to megatron or megatron-bridge")


def router_padding_refusal(pf: PlanFile) -> tuple[str, bool, str]:
    """(what, whether the plan needs it, fix) for the routing map padded to the GEMM alignment (moe_router_padding):
    a Megatron-Core option (TransformerConfig.moe_router_padding_for_quantization at cd4afffa6); a launcher with its
    own router and experts does not pad there (docs/formulas.md#moe.router_padding)."""
    return ("the routing map padded to the fp8 / fp4 GEMM alignment (moe_router_padding: a Megatron-Core option)",
            pf.model.is_moe and pf.plan.moe_router_padding,
            "re-plan with --no-moe-router-padding, or export to megatron or megatron-bridge")


def delay_wgrad_refusal(pf: PlanFile) -> tuple[str, bool, str]:
    """(what, whether the plan needs it, fix) for delayed weight gradients (delay_wgrad): Megatron-Core's
    combined-1F1B EP overlap defers them (--delay-wgrad-compute); a launcher without that schedule has nothing to
    defer them behind, so the run would not hide what the plan prices (docs/formulas.md#moe.delay_wgrad)."""
    return ("delayed weight gradients inside the EP overlap (delay_wgrad: Megatron-Core's combined-1F1B schedule, "
            "which this launcher does not run)", pf.model.is_moe and pf.plan.delay_wgrad,
            "re-plan with --no-delay-wgrad, or export to megatron or megatron-bridge")


def torch_ring_refusal(pf: PlanFile) -> tuple[str, bool, str]:
    """(what, whether the plan needs it, fix) for PyTorch's context-parallel ring (cp_impl torch-allgather /
    torch-alltoall, with cp_kv_repeated and cp_comm_overlap) on a Megatron-Core launch, whose attention runs
    Transformer Engine's context parallelism (--cp-comm-type p2p / all_gather / a2a), never
    torch.distributed.tensor.experimental.context_parallel (docs/formulas.md#comm.cp)."""
    p = pf.plan
    runs = te_comm_types(pf.model)
    fix = (f"re-plan with --cp-impl te --cp-comm-type {runs[0]}, or export to torchtitan" if runs and runs[0] != "p2p"
           else "re-plan with --cp-impl te, or export to torchtitan" if runs else
           "export to torchtitan (Transformer Engine's context parallelism cannot run this model's attention masks)")
    return (f"PyTorch's context-parallel ring (cp_impl {p.cp_impl}, cp {p.cp}; Megatron-Core's attention runs "
            "Transformer Engine's)", p.cp > 1 and p.cp_impl != "te", fix)


def kept_grad_shards_refusal(pf: PlanFile) -> tuple[str, bool, str]:
    """(what, whether the plan needs it, fix) for the gradient shards Apex DistributedFusedAdam keeps to the next
    zero_grad (kept_grad_shards, NeMo 1.x): no training target here runs Apex's optimizer (Megatron-Core's
    distributed optimizer reduce-scatters in place, DeepSpeed and FSDP2 keep their own buffers), so the run
    would not hold what the plan prices (docs/formulas.md#mem.kept_grad_shards)."""
    return ("gradient shards kept to the next zero_grad (kept_grad_shards: Apex DistributedFusedAdam, as NeMo 1.x "
            "runs it; this launcher's optimizer does not)", pf.plan.kept_grad_shards,
            "re-plan with --no-kept-grad-shards")


def fp32_sum_refusal(pf: PlanFile) -> tuple[str, bool, str]:
    """(what, whether the plan needs it, fix) for Megatron-Core's fp32-sum reduce-scatter (grad_reduce_fp32_sum:
    an all-to-all of the 16-bit bucket and a local fp32 sum, reduce_scatter_with_fp32_accumulation at NVIDIA/
    Megatron-LM d98e8a64dd): a launcher whose reduce-scatter is NCCL's sums in the wire dtype, so the run would
    not hold what the plan prices (docs/formulas.md#comm.fp32_sum)."""
    return ("a reduce-scatter of 16-bit gradients summed in fp32 by an all-to-all (grad_reduce_fp32_sum: "
            "Megatron-Core's reduce_scatter_with_fp32_accumulation; this launcher's reduce-scatter sums in the "
            "gradients' dtype)", pf.plan.grad_reduce_fp32_sum,
            "re-plan with --no-grad-reduce-fp32-sum, or export to megatron or megatron-bridge")


def fp32_embedding_grads_refusal(pf: PlanFile) -> tuple[str, bool, str]:
    """(what, whether the plan needs it, fix) for the embeddings' fp32 gradient buckets of NeMo 1.x under Apex
    DistributedFusedAdam (fp32_embedding_grads): no training target here runs Apex's optimizer, whose buckets
    carry the per-parameter gradient dtype, so the run would not hold what the plan prices
    (docs/formulas.md#mem.fp32_embedding_grads)."""
    return ("the embeddings' gradients in fp32 beside 2-byte ones (fp32_embedding_grads: Apex DistributedFusedAdam "
            "under NeMo 1.x; this launcher's optimizer keeps one gradient dtype)", pf.plan.fp32_embedding_grads,
            "re-plan with --no-fp32-embedding-grads")


def whole_embedding_refusal(pf: PlanFile) -> tuple[str, bool, str]:
    """(what, whether the plan needs it, fix) for an untied input embedding priced whole on every TP rank
    (tp_whole_embedding, cost.params.whole_embedding: DeepSpeed's AutoTP) on a launcher that splits it over its
    vocabulary: Megatron-Core's VocabParallelEmbedding (NVIDIA/Megatron-LM megatron/core/tensor_parallel/layers.py)
    and torchtitan's RowwiseParallel tok_embeddings (pytorch/torchtitan torchtitan/models/llama3/infra/parallelize.py
    apply_non_moe_tp: RowwiseParallel shards nn.Embedding's weight over dim 0)."""
    from llmplan.cost.params import whole_embedding
    return (f"the input embedding priced whole on each of tp {pf.plan.tp} ranks (tp_whole_embedding, as DeepSpeed's "
            "AutoTP holds it; this launcher splits it over the vocabulary)", bool(whole_embedding(pf.model, pf.plan)),
            "re-plan with --vocab-parallel-embedding")


def parallel_block_refusal(pf: PlanFile) -> tuple[str, bool, str]:
    """(what, whether the plan needs it, fix) for a model with the parallel transformer block
    (ModelSpec.parallel_block: attention and MLP side by side on one norm's output) on a launcher that builds the
    serial block: Megatron-LM at d98e8a6 has no flag for it (tests/data/launchers/megatron-lm.json), Megatron-Core's
    TransformerLayer (Megatron-Bridge) runs attention then MLP, and torchtitan's models are serial."""
    return (f"the parallel transformer block ({pf.model.name}: parallel_block, attention and MLP side by side; "
            "this launcher's layers run attention, then the MLP)", pf.model.parallel_block,
            "set parallel_block false in the model spec, or export to deepspeed (its model code is yours)")


def op_fuser_refusals(pf: PlanFile) -> list[tuple[str, bool, str]]:
    """(what, whether the plan needs it, fix) for the routed experts' clamp and fc2 bias fused into Transformer
    Engine's grouped MLP ops (ParallelPlan.glu_clamp_fusion, expert_bias_fusion, on a model with the clamp or the
    biases) on a launcher without Megatron-Core's op-fuser expert path
    (TransformerConfig.use_transformer_engine_op_fuser with NVTE_CUTEDSL_FUSED_GROUPED_MLP=1, moe/experts.py at
    d98e8a6): torchtitan, DeepSpeed."""
    p, m = pf.plan, pf.model
    clamp = p.glu_clamp_fusion and expert_clamp(m)
    bias = p.expert_bias_fusion and expert_bias(m)
    return [("the experts' clamped GLU and fc2 bias fused into Transformer Engine's grouped MLP ops "
             "(glu_clamp_fusion / expert_bias_fusion: Megatron-Core's use_transformer_engine_op_fuser with "
             "NVTE_CUTEDSL_FUSED_GROUPED_MLP=1, which this export does not write)", bool(clamp or bias),
             "set glu_clamp_fusion and expert_bias_fusion false in the plan (Megatron-Core's eager clamp and bias)")]


def grouped_experts(pf: PlanFile) -> bool:
    """Whether the plan prices the routed experts in one grouped kernel: a MoE model, fused kernels, expert_gemm
    grouped."""
    p = pf.plan
    return bool(pf.model.is_moe and p.fused_kernels and p.expert_gemm == "grouped")


def op_fuser_blocked(pf: PlanFile) -> str | None:
    """Why Megatron-Core's fused grouped MLP cannot run a plan priced with the routed experts in one grouped kernel
    (ParallelPlan.expert_gemm grouped, the default), so that a Megatron-Core launch runs TEGroupedMLP instead
    (None: it can, or the plan is not grouped): the fused path runs without expert TP and fuses only a gated MLP's
    or the weighted squared ReLU's activation (NVIDIA/Megatron-LM megatron/core/transformer/moe/experts.py at
    d98e8a6, _is_fused_impl_supported)."""
    p, m = pf.plan, pf.model
    if not grouped_experts(pf):
        return None
    if p.etp_resolved > 1:
        return f"it runs without expert tensor parallelism; etp {p.etp_resolved}"
    if not m.gated_mlp and not squared_relu(m):
        return "it fuses only a gated MLP's or squared ReLU's activation; this model's MLP is neither"
    return None


def op_fuser(pf: PlanFile) -> bool:
    """Whether a Megatron-Core export runs the routed experts on Transformer Engine's fused grouped MLP (one grouped
    kernel, ParallelPlan.expert_gemm grouped, where op_fuser_blocked allows it): --moe-grouped-gemm alone builds
    TEGroupedMLP, whose GroupedLinear issues one cuBLASLt GEMM per local expert (expert_gemm per-expert); the
    grouped kernel needs use_transformer_engine_op_fuser and, for a GLU, NVTE_CUTEDSL_FUSED_GROUPED_MLP=1
    (NVIDIA/Megatron-LM megatron/core/transformer/moe/experts.py at d98e8a6, _is_fused_impl_supported;
    Megatron-Bridge's cutedsl_fused_grouped_mlp performance overrides set both)."""
    return grouped_experts(pf) and op_fuser_blocked(pf) is None


def pp_sync_notes(pf: PlanFile, launcher: str) -> tuple[str, ...]:
    """The header note of a non-interleaved pipeline (pp > 1, vpp 1) priced without pp_blocking_sends: Megatron-
    Core's 1F1B then exchanges through batch_p2p_comm with batch_p2p_sync (Megatron-LM's validate_args sets
    overlap_p2p_comm False without interleaving, and batch_p2p_comm = not overlap_p2p_comm; ModelParallelConfig
    defaults batch_p2p_sync True), a torch.cuda.synchronize() after each exchange, which the plan prices only
    with the switch (docs/formulas.md#step.pp_blocking)."""
    p = pf.plan
    if p.pp == 1 or p.vpp > 1 or p.pp_blocking_sends:
        return ()
    return (f"note: {launcher}'s non-interleaved pipeline synchronises the device after each exchange "
            "(batch_p2p_comm with batch_p2p_sync), which this plan was priced without, so this runs a little "
            "slower than priced: re-plan with --pp-blocking-sends to price it",)


def megatron_expert_notes(pf: PlanFile) -> tuple[str, ...]:
    """The export header's notes of a Megatron-Core launch that runs the routed experts otherwise than the plan
    prices them, for the defaults a search saves (expert_gemm grouped; glu_clamp_fusion / expert_bias_fusion
    false): exported as the launcher runs them, with the setting that prices it."""
    p, m = pf.plan, pf.model
    why = op_fuser_blocked(pf)
    eager = (expert_clamp(m) and not p.glu_clamp_fusion) or (expert_bias(m) and not p.expert_bias_fusion)
    notes = []
    if why and runs_per_expert(p):  # priced as it runs
        notes.append(f"note: Megatron-Core's fused grouped MLP cannot run here ({why}), so this runs "
                     "TEGroupedMLP, one GEMM per local expert, as priced")
    elif why:
        notes.append(f"note: priced with the routed experts in one grouped kernel (expert_gemm grouped); "
                     f"Megatron-Core's fused grouped MLP cannot run here ({why}), so this runs TEGroupedMLP, one "
                     "GEMM per local expert: re-plan with --expert-gemm per-expert to price it")
    if op_fuser(pf) and eager:
        notes.append("note: priced with the experts' clamp / fc2 bias eager (glu_clamp_fusion / expert_bias_fusion "
                     "false); the fused grouped MLP this runs fuses them, so it runs a little faster than priced")
    if expert_bias(m) and not p.expert_fc1_bias_fusion:
        notes.append("note: priced with the experts' fc1 bias added after the grouped matmul "
                     "(expert_fc1_bias_fusion false); Transformer Engine's GroupedLinear adds it in the GEMM, so "
                     "this runs a little faster than priced")
    if m.attention_sinks and not p.sink_fusion:
        notes.append("note: priced with the attention sinks applied after the kernel (sink_fusion false); "
                     "Transformer Engine's cuDNN attention takes them in its softmax, so this runs a little faster "
                     "than priced")
    return tuple(notes)


def op_fuser_env_lines(pf: PlanFile) -> list[str]:
    """The environment Megatron-Core's fused grouped MLP reads (op_fuser): Transformer Engine's CuTe DSL grouped
    GLU kernel, without which _is_fused_impl_supported turns a GLU down and the experts' init asserts."""
    return (["export NVTE_CUTEDSL_FUSED_GROUPED_MLP=1   # the plan's expert_gemm grouped (Transformer Engine's "
             "fused grouped MLP, TE >= 2.14)"] if op_fuser(pf) and pf.model.gated_mlp else [])


def expert_clamp(m: Any) -> bool:
    """Whether the model's routed experts clamp their GLU (swiglu_limit: gpt-oss), which glu_clamp_fusion fuses."""
    return bool(m.is_moe and m.gated_mlp and m.swiglu_limit is not None)


def expert_bias(m: Any) -> bool:
    """Whether the model's routed experts carry biases (mlp_bias), which expert_bias_fusion and
    expert_fc1_bias_fusion fuse."""
    return bool(m.is_moe and m.mlp_bias)


def squared_relu(m: Any) -> bool:
    """Whether the Megatron exports run the model's MLP as squared ReLU (--squared-relu: Nemotron-H's ungated MLP;
    cost.gemm.squared_relu_mlp, the rule the fused grouped MLP's pricing reads)."""
    return squared_relu_mlp(m)


def megatron_expert_refusals(pf: PlanFile) -> list[tuple[str, bool, str]]:
    """(what, whether the plan needs it, fix) for the routed-expert path of a Megatron-Core export: the clamp and
    the fc2 bias fused (ParallelPlan.glu_clamp_fusion, expert_bias_fusion, set in the plan) beside one GEMM per
    local expert (TEGroupedMLP applies them eagerly; only the fused grouped MLP fuses them: NVIDIA/Megatron-LM
    megatron/core/transformer/moe/experts.py at d98e8a6). The defaults a search saves are exported with notes
    instead (megatron_expert_notes). Also Megatron-Core's two routed-expert limits at d98e8a6, launcher limits
    (DeepSpeed's AutoTP and torchtitan's DTensor TP have neither): transformer_config.py __post_init__ asserts
    expert TP 1 on a MoE model with linear biases ("Bias in Moe is only supported when ETP==1"), and
    moe/moe_layer.py MoELayer.forward raises in training at TP > 1 without sequence parallelism."""
    p, m = pf.plan, pf.model
    fused = (expert_clamp(m) and p.glu_clamp_fusion) or (expert_bias(m) and p.expert_bias_fusion)
    return [
        (f"expert tp {p.etp_resolved} with {m.name}'s expert biases (Megatron-Core asserts biased experts at "
         "expert tp 1: transformer_config.py, 'Bias in Moe is only supported when ETP==1')",
         expert_bias(m) and p.etp_resolved != 1, "re-plan with --etp 1"),
        (f"tp {p.tp} without sequence parallelism on {m.name}'s MoE layers (Megatron-Core's MoE layer raises in "
         "training at tp > 1 without sp: moe_layer.py, 'During training, performance may degrade if MoE and "
         "tensor parallelism are enabled without also enabling sequence parallelism.')",
         bool(m.is_moe) and p.tp > 1 and not p.sp, "re-plan with --sp"),
        ("the experts' clamped GLU and fc2 bias fused into Transformer Engine's grouped MLP ops "
         "(glu_clamp_fusion / expert_bias_fusion) beside one GEMM per local expert (TEGroupedMLP, which applies "
         "them eagerly)", not op_fuser(pf) and bool(fused),
         "re-plan with --expert-gemm grouped and expert TP 1 (Megatron-Core's op-fuser path), or set "
         "glu_clamp_fusion and expert_bias_fusion false in the plan"),
        # Megatron-LM fused_a2a.py at 02ad939 (Megatron-Bridge's pin) and d98e8a6: DeepEP is handed the bf16
        # tokens, init_hybrid_ep_buffer asserts fp8_dispatch off; d98e8a6's moe_dispatch_fwd_dtype mxfp8
        # (--moe-dispatch-fwd-dtype, transformer_config.py) is for the ncclep backend only
        ("the EP dispatch in fp8 through DeepEP (ep_dispatch_fp8; Megatron-Core's flex dispatcher hands DeepEP "
         "bf16 tokens and asserts HybridEP's fp8 dispatch off; its moe_dispatch_fwd_dtype mxfp8 needs the "
         "ncclep backend, which llmplan does not model)", m.is_moe and p.ep_dispatch_fp8,
         "re-plan with --no-ep-dispatch-fp8"),
    ]


def need_mode(pf: PlanFile, mode: str, target: str) -> None:
    if pf.mode != mode:
        kind = "serving" if mode == "infer" else "training"
        have = "serving" if pf.mode == "infer" else "training"  # "a infer plan" read as a typo
        raise refuse(target, f"it is a {have} plan and {target} takes {kind} plans",
                     f"save a {kind} plan with `llmplan search --mode {mode} --save`")


def hf_repo(model_name: str) -> str:
    """The Hugging Face repository a built-in model is usually served from (a placeholder otherwise)."""
    known = {
        "llama-2-7b": "meta-llama/Llama-2-7b-hf", "llama-2-13b": "meta-llama/Llama-2-13b-hf",
        "llama-2-70b": "meta-llama/Llama-2-70b-hf", "llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct",
        "llama-3.1-70b": "meta-llama/Llama-3.1-70B-Instruct", "llama-3.1-405b": "meta-llama/Llama-3.1-405B-Instruct",
        "mixtral-8x7b": "mistralai/Mixtral-8x7B-Instruct-v0.1",
        "mixtral-8x22b": "mistralai/Mixtral-8x22B-Instruct-v0.1",
        "qwen2.5-72b": "Qwen/Qwen2.5-72B-Instruct", "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
        "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B", "deepseek-v3": "deepseek-ai/DeepSeek-V3",
        "gpt-oss-120b": "openai/gpt-oss-120b", "nemotron-h-8b": "nvidia/Nemotron-H-8B-Base-8K",
        "nemotron-h-56b": "nvidia/Nemotron-H-56B-Base-8K",
        "nemotron-3-nano": "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
        "qwen3-next-80b-a3b": "Qwen/Qwen3-Next-80B-A3B-Instruct",
        "nemotron-3-super": "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16", "minimax-m1": "MiniMaxAI/MiniMax-M1-80k",
    }
    return known.get(model_name, f"path/to/{model_name}")


def as_flags(pairs: list[tuple[str, Any]]) -> list[str]:
    """['--flag value', '--switch'] from (flag, value) pairs; True is a bare switch, None/False is left out."""
    out = []
    for flag, value in pairs:
        if value is None or value is False:
            continue
        out.append(flag if value is True else f"{flag} {value}")
    return out


def megatron_layout(pf: PlanFile, mtp: int, commas: bool = True) -> str:
    """The plan's stage layout as Megatron-Core's pipeline layout string (PipelineParallelLayerLayout: E
    embedding, t transformer layer, m MTP layer, L loss; virtual stages in model order split by '|'): the
    plan's own pp_layout, or E, t*n and, on the last stage, `mtp` m's and L over virtual_stage_layers. `mtp` is
    the MTP layers the launcher builds (a pp_layout's m's are dropped when it builds none: Megatron-LM requires
    the layout's m count to equal mtp_num_layers). Commas are cosmetic to Megatron; `commas=False` leaves them
    out for Hydra, which reads them as a sweep."""
    if pf.plan.pp_layout is not None:
        text = format_layout(pf.plan.pp_layout if mtp else tuple(c.replace("m", "") for c in pf.plan.pp_layout))
    else:
        stages = virtual_stage_layers(pf)
        tail = "," + "m" * mtp + "L"
        text = "|".join(("E" if s == 0 else "") + (f"t*{n}" if n > 1 else "t" * n) + (tail if s == len(stages) - 1
                                                                                       else "")
                        for s, n in enumerate(stages))
    return text if commas else text.replace(",", "")


def virtual_stage_layers(pf: PlanFile) -> list[int]:
    """Transformer layers of each virtual pipeline stage in model order: stage s sits on pipeline rank
    s mod pp as its chunk s // pp (Megatron's and torchtitan's interleaved assignment). A first or last rank one
    layer short of an even split gives up that layer in its outer chunk (where the embedding / loss sit)."""
    p = pf.plan
    if p.pp_layout is not None:  # the plan lists its chunks (in model order already)
        return [c.count("t") for c in p.pp_layout]
    per_rank = stage_layer_list(pf.model, p)
    chunks = []
    for rank, n in enumerate(per_rank):
        size = -(-n // p.vpp)
        sizes = [size] * p.vpp
        short = size * p.vpp - n
        if short:
            sizes[0 if rank == 0 else -1] -= short
        chunks.append(sizes)
    return [chunks[s % p.pp][s // p.pp] for s in range(p.pp * p.vpp)]


def is_uneven(pf: PlanFile) -> bool:
    return len(set(stage_layer_list(pf.model, pf.plan))) > 1


def bias_fields(m: Any) -> str:
    """The model's output-bias fields as a refusal names them: 'gpt-1.7b: attention_bias true, mlp_bias true'."""
    return f"{m.name}: attention_bias {str(m.attention_bias).lower()}, mlp_bias {str(m.mlp_bias).lower()}"


def unfused_bias_add(pf: PlanFile) -> bool:
    """Whether the plan prices output biases added in their own pass (the biases' part of
    cost.elementwise.bias_add_bytes, UNFUSED_BIAS_ADD_BYTES): bias_dropout_fusion off on a model with an attention
    output bias, or with an fc2 bias on dense MLP layers (an MoE layer adds its experts' biases inside the
    experts). Not its dropout part (UNFUSED_DROPOUT_BYTES, hidden_dropout > 0 with or without biases): the
    launchers that add biases in the GEMM run that dropout as its own kernel too (DeepSpeed's Hugging Face
    blocks: nn.Dropout then the residual add) or run none (torchtitan: hidden_dropout_refusal), so the dropout
    alone is never refused here."""
    m = pf.model
    return not pf.plan.bias_dropout_fusion and bool(m.attention_bias or (m.mlp_bias and m.num_mlp_layers > 0))


def bias_add_refusal(pf: PlanFile, linears: str) -> tuple[str, bool, str]:
    """(what, whether, fix) for a launcher whose `linears` add their bias in the GEMM (torchtitan, DeepSpeed's
    Hugging Face models): the plan priced the biases added in their own pass by choice. Where the pass is the
    default the model settles (expert biases: specs.defaults.default_bias_dropout_fusion), bias_add_notes notes
    it instead, so that the model's default plan exports."""
    m = pf.model
    return (f"the output biases added apart from the residual (bias_dropout_fusion off, Megatron-Core's unfused "
            f"bias-dropout-add; {bias_fields(m)}): {linears} add their bias in the GEMM",
            unfused_bias_add(pf) and not expert_bias(m),
            "set bias_dropout_fusion true in the plan, or export to megatron")


def bias_gelu_refusal(pf: PlanFile, linears: str) -> tuple[str, bool, str]:
    """(what, whether, fix) for a launcher whose `linears` add their bias in the GEMM (torchtitan, DeepSpeed's
    Hugging Face models): the plan priced a GeLU MLP's fc1 bias added in its own pass before the GeLU
    (bias_gelu_fusion off on a dense non-gated MLP with biases: cost.elementwise.bias_gelu_bytes), which
    does not run there."""
    m = pf.model
    return (f"the fc1 bias added apart from the GeLU (bias_gelu_fusion off; {bias_fields(m)}): {linears} add "
            "their bias in the GEMM", not pf.plan.bias_gelu_fusion and bool(m.mlp_bias and not m.gated_mlp
                                                                              and m.num_mlp_layers > 0),
            "set bias_gelu_fusion true in the plan, or export to megatron")


def hidden_dropout_refusal(pf: PlanFile, target: str) -> tuple[str, bool, str]:
    """(what, whether, fix) for a launcher whose model code has no hidden dropout (torchtitan's llama3, llama4,
    qwen3, deepseek_v3, gpt_oss modules: no dropout after the attention or MLP block, pytorch/torchtitan@73a0e69
    torchtitan/models): a model with hidden_dropout > 0, whose plan prices the dropout's masks and, with
    bias_dropout_fusion off, its own kernel (cost.elementwise.bias_add_bytes), neither of which runs."""
    m = pf.model
    return (f"hidden dropout {m.hidden_dropout:g} ({m.name}; priced: its masks, and its own pass with "
            f"bias_dropout_fusion {str(pf.plan.bias_dropout_fusion).lower()}): {target}'s models run no dropout",
            m.hidden_dropout > 0, "set hidden_dropout 0 in the model, or export to megatron")


def bias_add_notes(pf: PlanFile, target: str) -> tuple[str, ...]:
    """The note for a plan that prices the output biases in their own pass because its model's experts carry biases
    (the default for it, as Megatron-Core must run it), exported to a launcher that adds them in the GEMM."""
    m = pf.model
    if not (unfused_bias_add(pf) and expert_bias(m)):
        return ()
    return (f"note: priced with the output biases added in their own pass (bias_dropout_fusion false, the "
            f"default for {m.name}'s expert biases, as Megatron-Core's TEGroupedMLP must run them); {target} adds "
            "them in the GEMM, so this runs a little faster than priced: set bias_dropout_fusion true in the plan "
            "to price it",)


def fused_expert_bias_refusal(pf: PlanFile) -> tuple[str, bool, str]:
    """(what, whether, fix) for Megatron-LM and Megatron-Bridge: the bias-dropout-add priced fused on a model with
    expert biases. Megatron-Core builds the routed experts (--moe-grouped-gemm) as TEGroupedMLP, whose __init__
    asserts not (add_bias_linear and bias_dropout_fusion) (NVIDIA/Megatron-LM
    megatron/core/transformer/moe/experts.py:205-207 at d98e8a6, from a329dd6da5), and Megatron-Bridge's GPT-OSS
    bridge sets bias_dropout_fusion False (gpt_oss_bridge.py at 067f987df)."""
    m = pf.model
    return (f"the bias-dropout-add fused (bias_dropout_fusion true) with expert biases ({bias_fields(m)}, "
            f"{m.num_experts} experts): Megatron-Core's TEGroupedMLP asserts not (add_bias_linear and "
            "bias_dropout_fusion) (megatron/core/transformer/moe/experts.py at d98e8a6), and Megatron-Bridge's "
            "GPT-OSS bridge sets it false",
            pf.plan.bias_dropout_fusion and expert_bias(m),
            "set bias_dropout_fusion false in the plan, or re-plan with --no-bias-dropout-fusion")


def paged_stash_refusal(p: ParallelPlan, note: str = "") -> tuple[str, bool, str]:
    """Megatron-Core's paged stash of the experts' saved tensors, refused by a launcher without it whatever else
    the plan sets (export.EVERY_PLAN); note: the launcher's own reason, after the pool factor."""
    return (f"the paged stash of the experts' saved tensors (Megatron-Core's moe_paged_stash, pool factor "
            f"{p.moe_paged_stash}{note})", p.moe_paged_stash is not None,
            "re-plan without --moe-paged-stash, or export to megatron")


def offload_moe_act_refusal(p: ParallelPlan, note: str = "") -> tuple[str, bool, str]:
    """Offload of the experts' fc1 output, refused by a launcher without it whatever else the plan sets
    (export.EVERY_PLAN); note: the launcher's own reason, after Megatron-Core's option."""
    return (f"fine-grained offload of the experts' fc1 output (Megatron-Core's offload_modules moe_act{note})",
            bool(p.offload_moe_act), "re-plan without --offload-moe-act, or export to megatron")
