"""Export a plan file to the launcher that runs it. Each target renders {filename: text} and never writes;
`write_files` writes them atomically and refuses to overwrite without force. Launcher vocabulary lives only
in this package."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Sequence, cast

import numpy as np

from llmplan.errors import LlmplanError, not_one_of
from llmplan.export import bridge, deepspeed, launch, megatron, pools, torchtitan
from llmplan.export.common import (CannotExpress, delayed_bf16_layers_refusal, ep_overlap_refusal, fit_comments,
                                   jit_activation_refusal, refuse, swiglu_fp8_refusal)
from llmplan.export.launch import WRAPPABLE, render_slurm, render_torchrun
from llmplan.export.serve import check_sglang, check_vllm, render_sglang, render_vllm
from llmplan.export.shell_lines import fit_shell
from llmplan.export.toml_lines import fit_toml
from llmplan.fileio import check_target, make_folder, publish
from llmplan.planfile import PlanFile
from llmplan.specs.plan import ParallelPlan

TRAIN_TARGETS = ("megatron", "megatron-bridge", "deepspeed", "torchtitan", "torchtitan-0.2", "torchrun", "slurm")
FLEX_DISPATCH_TARGETS = ("megatron", "megatron-bridge", "torchrun", "slurm")
"""Training targets whose export writes Megatron's flex token dispatcher (megatron.py --moe-token-dispatcher-type
flex --moe-flex-dispatcher-backend; bridge.py moe_flex_dispatcher_backend; torchrun / slurm wrap them): a targeted
search tries the dispatchers only for these (cli.search.train_search); torchtitan refuses them, DeepSpeed EP."""
SYNC_GATHER_TARGETS = ("deepspeed",)
"""Training targets that gather ZeRO-1/2 weights synchronously after the optimizer step (deepspeed.py refuses
overlap_param_gather at ZeRO 1-2): a targeted search searches them with the synchronous gather (cli.search.train_search)
unless the user named --overlap-param-gather."""
UNFUSED_LOSS_TARGETS = ("deepspeed",)
"""Training targets whose loss at tp > 1 is the unfused vocabulary-parallel one (deepspeed.py fused_loss_refusal:
DeepSpeed's AutoTP loss all-reduces three times): a targeted search searches them with fused_loss false
(cli.search.train_search) unless the user named --fused-loss or --unfused-loss."""
TE_SOFTMAX_TARGETS = ("megatron", "torchrun", "slurm")
"""Targets whose unfused attention runs Transformer Engine's softmax (softmax_kernel te): Megatron-LM's
--attention-backend unfused under its default TE layer spec, and torchrun / slurm, which wrap it (default_wrap). A
search for one of them without fused attention also tries softmax_kernel te (search.run.switch_variants)."""

MEGATRON_FSDP_TARGETS = ("megatron", "megatron-bridge")
"""Training targets whose export writes ZeRO-2 / ZeRO-3 as Megatron-FSDP's optim_grads / optim_grads_params
(megatron.fsdp_pairs, bridge.fsdp_overrides) and refuses such a plan priced without megatron_fsdp
(megatron.fsdp_zero2_refusals): a targeted search prices its ZeRO-2 / 3 plans with megatron_fsdp
(cli.search.train_search) unless the user named --megatron-fsdp / --no-megatron-fsdp. Not torchrun / slurm: a search
does not know
which target their launch wraps (export --wrap; default_wrap: the first that accepts the plan), and the
DeepSpeed and torchtitan wraps refuse megatron_fsdp (common.megatron_fsdp_refusal), so pricing it would keep
only the plans Megatron-LM runs."""
WHOLE_EMBEDDING_TARGETS = ("deepspeed",)
"""Training targets that hold an untied input embedding whole on every TP rank (deepspeed.py split_embedding_refusal:
AutoTP shards only what the Hugging Face tp_plan names): a targeted search searches them with tp_whole_embedding true
(cli.search.train_search) unless the user named --tp-whole-embedding or --vocab-parallel-embedding."""
SERVE_TARGETS = ("vllm", "sglang")
TARGETS = TRAIN_TARGETS + SERVE_TARGETS
SCRIPTS = (".sh", ".sbatch")
"""Suffixes of the exported shell scripts: fitted by shell_lines.fit_shell and written executable."""


def renderer(target: str, wrap: str = "megatron") -> Callable[[PlanFile], dict[str, str]]:
    table: dict[str, Callable[[PlanFile], dict[str, str]]] = {
        "megatron": megatron.render, "megatron-bridge": bridge.render, "deepspeed": deepspeed.render,
        "torchtitan": torchtitan.render,
        "torchtitan-0.2": torchtitan.render_legacy,
        "torchrun": lambda pf: render_torchrun(pf, wrap), "slurm": lambda pf: render_slurm(pf, wrap),
        "vllm": render_vllm, "sglang": render_sglang,
    }
    if target not in table:
        raise LlmplanError(not_one_of("--to", target, [*TARGETS, "all"], "a target"))
    return table[target]


def checker(target: str, wrap: str = "megatron") -> Callable[[PlanFile], None]:
    """The refusal checks renderer(target, wrap) runs before it writes a line: each raises CannotExpress with the
    reason. Every refusal rule lives in one such check, which the render calls; nothing after it refuses
    (tests/test_export_refusal.py holds the two to the same answer)."""
    table: dict[str, Callable[[PlanFile], None]] = {
        "megatron": megatron.check, "megatron-bridge": bridge.check, "deepspeed": deepspeed.check,
        "torchtitan": torchtitan.check, "torchtitan-0.2": torchtitan.check_legacy,
        "torchrun": lambda pf: launch.check(pf, "torchrun", wrap), "slurm": lambda pf: launch.check(pf, "slurm", wrap),
        "vllm": check_vllm, "sglang": check_sglang,
    }
    renderer(target)  # an unknown target: named as the render names it
    return table[target]


def render_all(pf: PlanFile, target: str, wrap: str | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """Files for `target` as _render_all renders them, fitted to 80 columns here, the one place every exported
    file passes through: each whole-line comment wrapped (common.fit_comments), in a shell script each longer
    command line broken between its words (shell_lines.fit_shell), and in a TOML file each longer setting's
    trailing comment moved above it and a long array broken over lines (toml_lines.fit_toml)."""
    files, skipped = _render_all(pf, target, wrap)
    return {name: _fit(name, text) for name, text in files.items()}, skipped


def _fit(name: str, text: str) -> str:
    text = fit_comments(name, text)
    if name.endswith(".toml"):
        return fit_toml(text)
    return fit_shell(text) if name.endswith(SCRIPTS) else text


def _render_all(pf: PlanFile, target: str, wrap: str | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """Files for `target` (or every target of the plan's mode with 'all'): (files, {target: why skipped}).
    torchrun and slurm wrap `wrap`, or by default the first training target that can express the plan."""
    if wrap is not None and wrap not in WRAPPABLE:
        raise LlmplanError(not_one_of("--wrap", wrap, WRAPPABLE, "a training target"))
    if wrap is not None and (target not in ("torchrun", "slurm", "all") or pf.mode != "train"):
        what = f"--to {target}" if pf.mode == "train" else "a serving plan"
        raise LlmplanError(f"--wrap {wrap} picks the training target a torchrun / slurm launch runs, and {what} "
                           "writes no such launch; drop --wrap or use --to torchrun, slurm or all")
    mixed = pools.pool_plan(pf)
    if mixed is not None:  # a pipeline over pools of different GPUs: export.pools
        renderer(target) if target != "all" else None  # an unknown target is named first
        return pools.render_all(pf, target, wrap or "megatron", mixed, TRAIN_TARGETS)
    if wrap is None and target in ("torchrun", "slurm", "all"):  # the others wrap nothing: render no other target
        wrap = default_wrap(pf)
    if target != "all":
        return renderer(target, wrap or "megatron")(pf), {}
    files: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for t in (TRAIN_TARGETS if pf.mode == "train" else SERVE_TARGETS):
        try:
            files.update(renderer(t, wrap or "megatron")(pf))
        except CannotExpress as e:
            skipped[t] = str(e)
    if not files:
        raise LlmplanError("no target can express this plan: " + "; ".join(dict.fromkeys(skipped.values())))
    return files, skipped


def target_mode(target: str) -> str:
    """The plan mode a target takes ('train' or 'infer'); an unknown target is one clear error."""
    if target not in TARGETS:
        raise LlmplanError(not_one_of("--target", target, TARGETS, "a target"))
    return "train" if target in TRAIN_TARGETS else "infer"


TORCHTITAN_COMMON: dict[str, Callable[[ParallelPlan], tuple[str, bool, str]]] = {
    "optimizer": torchtitan.muon_refusal, "dtype": torchtitan.dtype_refusal,
    "grad_checks": torchtitan.grad_checks_refusal, "flash_attention": torchtitan.unfused_attention_refusal,
    "optimizer_dtypes": torchtitan.optimizer_dtype_refusal,
    "param_remainders": torchtitan.param_remainders_refusal, "swiglu_fp8_input": swiglu_fp8_refusal,
    "jit_activation": jit_activation_refusal, "fp8_attention": torchtitan.fp8_attention_refusal,
    "unfused_loss_impl": torchtitan.loss_impl_refusal,
    "grad_dtype": torchtitan.grad_reduce_refusal,
    "dp_outer_optimizer": torchtitan.dp_outer_optimizer_refusal, "offload_moe_act": torchtitan.moe_act_refusal,
    "moe_paged_stash": torchtitan.stash_refusal, "offload_modules": torchtitan.offload_modules_refusal,
    "offload_layers": torchtitan.offload_layers_refusal, "recompute_layers": torchtitan.recompute_layers_refusal}
"""The EVERY_PLAN rules of torchtitan's check_common (both releases), in its order."""

EVERY_PLAN: dict[str, dict[str, Callable[[ParallelPlan], tuple[str, bool, str]]]] = {
    "megatron": {"fp8_attention": megatron.fp8_attention_refusal, "param_gather": megatron.param_gather_refusal,
                 "unfused_loss_impl": megatron.loss_impl_refusal,
                 **megatron.SOFTMAX_REFUSALS,
                 "master_dtype": megatron.master_dtype_refusal, "bf16_layers": delayed_bf16_layers_refusal},
    "megatron-bridge": {"attention_kernel": bridge.attention_kernel_refusal,
                        "master_dtype": bridge.master_dtype_refusal,
                        "fp8_moments": bridge.fp8_moments_refusal,
                        "precision": bridge.preset_refusal, "bf16_layers": delayed_bf16_layers_refusal,
                        "preset_layers": bridge.preset_layers_refusal, "bf16_modules": bridge.bf16_modules_refusal,
                        "mxfp8_modules": bridge.mxfp8_modules_refusal,
                        "unfused_loss_impl": bridge.loss_impl_refusal},
    "deepspeed": {"optimizer": deepspeed.muon_refusal, "cp": deepspeed.context_parallel_refusal,
                  "grad_checks": deepspeed.grad_checks_refusal, "ep": deepspeed.expert_parallel_refusal,
                  "sp": deepspeed.sequence_parallel_refusal, "dtype": deepspeed.low_precision_refusal,
                  "optimizer_dtypes": deepspeed.optimizer_dtype_refusal,
                  "param_remainders": deepspeed.param_remainders_refusal,
                  "swiglu_fp8_input": swiglu_fp8_refusal, "jit_activation": jit_activation_refusal,
                  "offload_layers": deepspeed.offload_layers_refusal, "dp_replicate": deepspeed.dp_replicate_refusal,
                  "offload_moe_act": deepspeed.offload_moe_act_refusal,
                  "moe_paged_stash": deepspeed.paged_stash_refusal,
                  "offload_modules": deepspeed.offload_modules_refusal,
                  "fp8_attention": deepspeed.fp8_attention_refusal, "softmax_te": deepspeed.te_softmax_refusal,
                  "unfused_loss_impl": deepspeed.loss_impl_refusal,
                  "tp_pp": deepspeed.pipelined_autotp_refusal},
    "torchtitan": {**TORCHTITAN_COMMON, "fp8_recipe": torchtitan.tensorwise_refusal},
    "torchtitan-0.2": {**TORCHTITAN_COMMON, "fp8_scaling": torchtitan.delayed_scaling_refusal},
}
"""Target -> the plan field a rule reads (a name for the fields, where it reads several) -> a rule of the target's
check (the same function, called there) whose only condition is on that field: a plan axis (the target refuses every
plan with it, whatever else the plan sets: DeepSpeed's CP, EP and SP), or a workload switch (it refuses every plan
of a search holding it: torchtitan's Muon, fp16 / fp32 training, Megatron's gradient NaN check / pre-scaling, Adam
states below fp32, remainders, the SwiGLU input in fp8, the jit_fuser activation, FP8 attention, bf16 gradient
reduction, outer optimizer sharding, activation / expert fc1 offload, recompute of the first layers, and 0.3.0's fp8
tensorwise scaling; DeepSpeed's Muon, gradient NaN check / pre-scaling, fp8 / fp4 training, Adam states below fp32,
remainders, the SwiGLU input in fp8, the jit_fuser activation, activation and expert fc1 offload, hybrid sharding,
FP8 attention, Transformer Engine's unfused softmax and TP with PP (tp_pp: AutoTP under its pipeline engine);
torchtitan's unfused attention (its attention is SDPA or FlexAttention); Megatron's FP8 attention, an unfused softmax
other than Transformer Engine's (softmax_<kernel>), bf16 layers under fp8 delayed scaling and a bf16 / no master;
Megatron-Bridge's attention kernel other than native flash, bf16 / no master, fp8 moments, a precision it
has no preset for, or fp8 layers kept in bf16 other than its preset keeps). Each target's rules in the order its check
meets them, so that the first rule that refuses a plan is the one its check names (where no other rule of the check
comes first). search --target passes over the plans these rules refuse (every_plan_mask)."""


def every_plan_refusal(plan: ParallelPlan, target: str, axis: str, degree: int) -> str | None:
    """Why `target` refuses every training plan with `axis` above 1, worded as its refusal of `plan` with `axis`
    set to `degree` (EVERY_PLAN); None where no such rule is known (some plan with it may be accepted). A plan
    with it may meet another of the check's rules first: refused all the same, with that rule's words."""
    rule = EVERY_PLAN.get(target, {}).get(axis)
    if rule is None or degree <= 1:
        return None
    return _worded(target, rule, plan.model_copy(update={axis: degree}))


def _worded(target: str, rule: Callable[[ParallelPlan], tuple[str, bool, str]], plan: ParallelPlan) -> str | None:
    """The target's refusal of `plan` by `rule` (an EVERY_PLAN rule), in its check's words; None if it accepts."""
    what, bad, fix = rule(plan)
    return str(refuse(target, what, fix)) if bad else None


def every_plan_mask(plans: Any, target: str) -> np.ndarray:
    """Which of many plans (search.grid.PlanArrays, whose attributes are arrays) `target` refuses whatever else
    they set: each EVERY_PLAN rule of the target called on the arrays, the same function its check calls on one
    plan, its condition read elementwise (tests/test_export_refusal.py holds the mask to `refusal`)."""
    n = len(plans)
    out = np.zeros(n, dtype=bool)
    for rule in EVERY_PLAN.get(target, {}).values():
        out |= _refused(rule, plans)
    return out


def _refused(rule: Callable[[ParallelPlan], tuple[str, bool, str]], plans: Any) -> np.ndarray:
    """Which of the arrays `plans` the EVERY_PLAN `rule` refuses: its condition read elementwise, one bool a plan
    (a condition on no array field, a scalar, is broadcast)."""
    return np.broadcast_to(np.asarray(rule(plans)[1], dtype=bool), (len(plans),))


def every_plan_reason(plan: ParallelPlan, target: str) -> str | None:
    """The refusal of the first EVERY_PLAN rule of `target` that refuses `plan` (what every_plan_mask marks it
    for), in the words of the target's check; None where none does."""
    return next((w for rule in EVERY_PLAN.get(target, {}).values() if (w := _worded(target, rule, plan))), None)


def every_plan_reasons(plans: Any, target: str, idx: Sequence[int], plan: Callable[[int], ParallelPlan]) -> Counter:
    """The plans `idx` of the arrays `plans` (each marked by every_plan_mask) counted by the EVERY_PLAN rule of
    `target` that refuses each first (every_plan_reason's), in that rule's words on the first of them (`plan(i)`:
    plan i of the arrays; a rule that names a degree names that plan's)."""
    left = np.asarray(idx, dtype=int)
    out: Counter = Counter()
    for rule in EVERY_PLAN.get(target, {}).values():
        bad = _refused(rule, plans)[left]
        if bad.any():
            out[_worded(target, rule, plan(int(left[bad][0]))) or "refused whole"] += int(bad.sum())
        left = left[~bad]
    return out


def every_plan_blocks(plans: Any, target: str, plan: Callable[[int], ParallelPlan]) -> list[tuple[str, str]]:
    """(what, fix) of each EVERY_PLAN rule of `target` that refuses every one of the arrays `plans` (a search's
    plans that fit), in the words of the target's check on `plan(0)` and in the order the check meets them: all
    such rules, not only the first each plan meets (every_plan_reasons), since each must be mended before any of
    the plans exports. [] where no rule refuses them all (a refused plan was refused for what it sets)."""
    n = len(plans)
    out: list[tuple[str, str]] = []
    for rule in EVERY_PLAN.get(target, {}).values() if n else ():
        if _refused(rule, plans).all():
            what, _, fix = rule(plan(0))
            out.append((what, fix))
    return out


def megatron_only(model: Any, plan: ParallelPlan) -> bool:
    """Whether only Megatron-LM and Megatron-Bridge (MEGATRON_FSDP_TARGETS, and torchrun / slurm wrapping them)
    run the ZeRO-2 of a search's plans holding `plan`'s switches, whatever their other axes: DeepSpeed and both
    torchtitan releases refuse `plan` (the workload on one ZeRO-2 plan without a pipeline, with the ep > 1 its
    MoE plans can take) by a rule that reads no other axis: an EVERY_PLAN rule, the EP all-to-all overlap and
    the MoE dispatch (common.ep_overlap_refusal, torchtitan's check), a recipe other than float8's
    (torchtitan.converter_refusal), or a model / dtype with no torchtitan config. An untargeted search
    prices those plans' ZeRO-2 as Megatron-FSDP runs it (plan.megatron_fsdp, cli.search.SettingSearch.as_run),
    so that its plans name a target that runs them as priced."""
    from types import SimpleNamespace
    if every_plan_reason(plan, "deepspeed") is None:
        return False
    moe_ep = model.is_moe and plan.ep > 1
    if moe_ep and (ep_overlap_refusal(cast(PlanFile, SimpleNamespace(model=model, plan=plan)))[1]
                   or plan.moe_dispatcher != "alltoall" or plan.moe_routing != "random"):
        return True  # torchtitan's check (_check_common) refuses both releases
    if torchtitan.converter_refusal(plan)[1]:  # both releases
        return True
    configs = torchtitan.CONFIGS.get(model.name)
    no_config = {"torchtitan": configs is None or configs[2 if plan.dtype == "fp8" else 1] is None,
                 "torchtitan-0.2": model.name not in torchtitan.FLAVORS}
    return all(no_config[t] or every_plan_reason(plan, t) is not None for t in no_config)


def default_wrap(pf: PlanFile) -> str:
    """The training target torchrun / slurm wrap without --wrap: the first of WRAPPABLE that accepts the plan."""
    return next((w for w in WRAPPABLE if _expresses(pf, w)), "megatron")


def refusal(pf: PlanFile, target: str) -> str | None:
    """Why `export --to target` refuses the plan (the CannotExpress message), or None where it writes it. It runs
    the refusal checks `export` runs before it renders (checker; for a plan over pools, export.pools'), and
    renders nothing: the answer and its text are the render's (tests/test_export_refusal.py), at the cost of
    the checks alone."""
    target_mode(target)
    try:
        mixed = pools.pool_plan(pf)
        if mixed is not None:
            pools.check_all(pf, target, "megatron", mixed)
        else:
            checker(target, default_wrap(pf) if target in ("torchrun", "slurm") else "megatron")(pf)
    except CannotExpress as e:
        return str(e)
    return None


def exports(pf: PlanFile) -> dict[str, str | None]:
    """Each target of the plan's mode and its answer for the plan: None where `export --to target` writes it, else
    its refusal (`refusal`: the checks alone, nothing rendered)."""
    return {t: refusal(pf, t) for t in (TRAIN_TARGETS if pf.mode == "train" else SERVE_TARGETS)}


def _expresses(pf: PlanFile, target: str) -> bool:
    try:
        checker(target)(pf)
        return True
    except CannotExpress:
        return False


def write_files(files: dict[str, str], out_dir: Path, force: bool = False) -> list[Path]:
    """Write the set all-or-nothing (fileio.publish): every target is checked before anything is written, and a
    failure part-way removes the files already written and restores the ones --force replaced."""
    out_dir = Path(out_dir)
    make_folder(out_dir)
    paths = {out_dir / name: text for name, text in files.items()}
    for p in paths:
        check_target(p, force=True)  # a folder in the way or a name too long, before the clash below
    clash = [str(p) for p in paths if os.path.lexists(p)]
    if clash and not force:
        raise LlmplanError(f"{', '.join(clash)} already exist(s); pass --force to overwrite")
    publish(paths, force, executable=frozenset(p for p in paths if p.suffix in SCRIPTS))
    return list(paths)
