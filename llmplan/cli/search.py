"""`llmplan search`: rank every training plan (or, --mode infer, every serving layout) of a cluster."""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Annotated, Any, Callable, NamedTuple, Optional

import typer
from rich.console import Console

from llmplan import report
from llmplan.cli import options as opt
from llmplan.cli.app import app, emit, out, progress_bar, save_best, stderr_line
from llmplan.errors import EXIT_NO_FIT, LlmplanError, not_one_of
from llmplan.specs.defaults import (DEFAULT_BATCH_TOKENS, default_bias_dropout_fusion, default_seq_len,
                                    global_batch_from_tokens, min_headroom_bytes)
from llmplan.specs.model import ModelSpec
from llmplan.specs.options import (SERVE_PLAN_FLAGS, SERVE_PLAN_OPTIONS, CheckpointOptions, ClusterOptions,
                                   MemoryOptions, MoeServingOptions, OutputOptions, PipelineSplitOptions, SearchGoal,
                                   SearchPins, ServingOptions, SwitchOptions)
from llmplan.specs.plan import ClusterSpec, MemoryAllowance, ParallelPlan, trained_model
from llmplan.specs.resilience import CheckpointPolicy
from llmplan.specs.serve import ServePlan
from llmplan.units import parse_count

if TYPE_CHECKING:
    from llmplan.estimate import TrainingEstimate
    from llmplan.search.filtered import Walk
    from llmplan.search.grid import Workload
    from llmplan.search.run import NoPlanLeft, SearchResult


ShareRun = Callable[[ClusterSpec], "SearchResult | None"]
"""A setting's search on a cluster of the same system with another NVLink-domain share (best_domain, share_only,
other_share): its result, or None where the share has nothing the full domain cannot hold."""


WALK = 40
"""Ranked layouts a targeted serving search asks for and walks (its --top when larger): how deep it looks for
plans the target accepts (cli.target.serving_walk). A serving layout has no variants to walk (search.serve prices
one plan per tp, pp, ep and replica count), so the walk is the ranking's; where it ends here with fewer than --top
kept and more layouts fitting, the output says so."""


def run_search(*args: Any, **kwargs: Any) -> SearchResult:
    """search.run.search, imported on the first search (not when the command is registered)."""
    from llmplan.search.run import search as run
    return run(*args, **kwargs)


@app.command(cls=opt.SectionedCommand)
@opt.grouped
def search(
    *,
    cluster: Annotated[ClusterOptions, opt.CLUSTER],
    mode: str = opt.MODE,
    pins: Annotated[SearchPins, opt.SEARCH_PINS],
    goal: Annotated[SearchGoal, opt.SEARCH_GOAL],
    training: Annotated[SwitchOptions, opt.SEARCH_SWITCHES],
    split: Annotated[PipelineSplitOptions, opt.PIPELINE_SPLIT],
    memory: Annotated[MemoryOptions, opt.MEMORY],
    checkpoints: Annotated[CheckpointOptions, opt.CHECKPOINTS],
    serving: Annotated[ServingOptions, opt.SERVING],
    moe_serving: Annotated[MoeServingOptions, opt.MOE_SERVING],
    max_batch: int = typer.Option(1024, "--max-batch", min=1, rich_help_panel=opt.SERVING.panel,
                                  help="Inference: most concurrent sequences per replica."),
    request_rate: Optional[float] = typer.Option(None, "--request-rate", rich_help_panel=opt.SERVING.panel,
                                                 help="Inference, --objective min-gpus: requests/s to sustain."),
    output: Annotated[OutputOptions, opt.OUTPUT],
    disaggregated: bool = typer.Option(False, "--disaggregated", rich_help_panel=opt.SERVING.panel,
                                       help="Inference: a prefill pool and a decode pool (P:D split, KV transfer), "
                                            "against the best co-located plan."),
    target: Optional[str] = typer.Option(None, "--target", rich_help_panel=opt.OUTPUT.panel,
                                         help="Keep only plans `export --to TARGET` accepts (a training or "
                                              "serving target of `export`)."),
    ctx: typer.Context = None,  # type: ignore[assignment]  # typer passes the context; None is never seen
) -> None:
    """Rank every way to run a training job (or, --mode infer, to serve a model) on a cluster; exit 3 when
    none fits."""
    from llmplan.cli.inputs import named_options, refuse_other_mode
    from llmplan.cli.pools import single_pool_options
    from llmplan.cli.pools_serve import search_pools_serving
    from llmplan.cli.systems import refuse_serving_comparison, wants_comparison
    from llmplan.cli.target import check_target_mode
    from llmplan.fileio import check_target
    from llmplan.specs.registry import is_pool_file
    if mode not in ("train", "infer"):
        raise LlmplanError(not_one_of("--mode", mode, ("train", "infer")))
    refuse_other_mode(ctx, mode, opt.SERVING_READS | {"objective", "top", "disaggregated", "target"})
    check_target_mode(target, mode)
    if "nodes" in named_options(ctx):  # --nodes 1 typed: the default's value, but two sizes all the same
        refuse_typed_nodes(cluster, goal)
    if target is not None and (is_pool_file(cluster.hardware) and single_pool_options(cluster, goal) is None
                               or disaggregated or mode == "train" and wants_comparison(cluster, goal)):
        raise LlmplanError(f"--target {target} filters the search of one system and one pool; drop it here and "
                           "export the saved plan with `llmplan export --to`")
    if output.save is not None:  # refuse an existing --save file before the search, not after it ran and printed
        check_target(output.save, output.force)
    if mode == "infer":
        refuse_serving_comparison(cluster)
    if mode == "infer" and is_pool_file(cluster.hardware):  # one pool is that system's search; several, pools'
        one = single_pool_options(cluster, goal)
        if one is None:
            return search_pools_serving(cluster, pins, goal, training.dtype, serving, max_batch, request_rate,
                                        memory, output, disaggregated,
                                        given_moe(ctx, moe_serving, training.moe_dispatcher))
        cluster = one
    if mode == "infer" and disaggregated:
        search_disagg(cluster, pins, goal, training.dtype, serving, max_batch, request_rate, memory, output,
                      given_moe(ctx, moe_serving, training.moe_dispatcher))
    elif mode == "infer":
        search_infer(cluster, pins, goal, training.dtype, serving, max_batch, request_rate, memory, output,
                     given_moe(ctx, moe_serving, training.moe_dispatcher), target)
    else:
        search_train(cluster, pins, goal, training, split, memory, checkpoints, output, named_options(ctx), target)


def refuse_typed_nodes(c: ClusterOptions, goal: SearchGoal) -> None:
    """--nodes typed beside what sizes the cluster already (--budget-gpus; a cluster file's pools), whatever its
    value: the checks after this one see --nodes only when it differs from its default, 1."""
    from llmplan.specs.registry import is_pool_file
    if goal.budget_gpus is not None:
        raise LlmplanError(f"--budget-gpus {goal.budget_gpus} and --nodes {c.nodes} each size the cluster; give one")
    if is_pool_file(c.hardware):
        raise LlmplanError(f"{c.hardware} lists pools with their nodes; drop --nodes (set each pool's nodes, or its "
                           "system file's keys, in the cluster file)")


def given_moe(ctx: typer.Context, o: MoeServingOptions, dispatcher: str) -> dict[str, object]:
    """The MoE serving options given on the command line, and --moe-dispatcher (`dispatcher`, shared with
    training) where given (the search's own choices stand for the others)."""
    given = lambda f: getattr(ctx.get_parameter_source(f), "name", None) in ("COMMANDLINE", "ENVIRONMENT")  # noqa: E731
    return {**{f: getattr(o, f) for f in MoeServingOptions.model_fields if given(f)},
            **({"moe_dispatcher": dispatcher} if given("moe_dispatcher") else {})}


def search_infer(c: ClusterOptions, pins: SearchPins, goal: SearchGoal, dtype: str, s: ServingOptions,
                 max_batch: int, request_rate: float | None, memory: MemoryOptions, output: OutputOptions,
                 moe: dict[str, object] | None = None, target: str | None = None) -> None:
    """The serving path of `search`: pins' tp, pp and ep, the serving options, --max-batch and --request-rate
    (`target`: keep only the plans that export writes for it, cli.target)."""
    from llmplan.cli.inputs import checked_pins, cluster_of, make_allowance, make_job, with_hardware_options
    from llmplan.cli.target import refuse_unexportable, serving_walk, walk
    from llmplan.cost.serve_step import GraphHost
    from llmplan.planfile import save_refs, serve_plan_document
    from llmplan.search.serve import SERVE_OBJECTIVES, check_search_moe, search_serving
    from llmplan.specs.registry import build, resolve_model
    if goal.objective not in SERVE_OBJECTIVES:
        raise LlmplanError(not_one_of("--objective", goal.objective, SERVE_OBJECTIVES, "a serving objective"))
    m = resolve_model(c.model)
    cluster = cluster_of(c)
    job = make_job(s, max_batch, request_rate, host=GraphHost.of(cluster.system, m))
    moe = check_search_moe(m, dtype, s.kv_dtype, moe or {}, pins.ep)
    dtypes = build(ServePlan, {"weight_dtype": dtype, "kv_dtype": s.kv_dtype}, SERVE_PLAN_OPTIONS, SERVE_PLAN_FLAGS)
    allowance = make_allowance(memory)
    refs = save_refs(c.model, c.hardware, output.save)
    doc_of = lambda e: {**serve_plan_document(e, allowance, report.serve_json(e), refs), **with_hardware_options(c)}
    deep = max(goal.top, WALK)
    res = search_serving(m, cluster, job, dtypes.weight_dtype, dtypes.kv_dtype, goal.objective,
                         deep if target else goal.top, job.request_rate, allowance,
                         checked_pins(ServePlan, {"tp": pins.tp, "pp": pins.pp, "ep": pins.ep}), moe)
    dropped = 0
    walked = None
    if target is not None:
        t0 = time.perf_counter()
        kept, why = walk(res.ranked, target, doc_of, goal.top)
        if res.ranked and not kept:
            refuse_unexportable(target, why)
        walked = serving_walk(kept, why, len(res.ranked), res.feasible, goal.top, deep, time.perf_counter() - t0)
        res, dropped = dataclasses.replace(res, ranked=[res.ranked[i] for i in kept]), walked.dropped

    def view() -> None:
        report.serve_search_view(out, res, m, cluster, job)
        if target is not None:
            for line in report.target_lines(target, dropped, walked, unit="layouts"):
                out.print(line, highlight=False)

    emit({**report.serve_search_json(res, m, cluster, job), **report.target_json(target, dropped, walked)},
         output.json_mode, view)
    if not res.ranked:
        stderr_line("error", f"no serving plan for {m.name} on {cluster.num_gpus} GPUs fits and meets the SLOs; "
                    "see the pruned table")
        raise typer.Exit(EXIT_NO_FIT)
    if output.save is not None:
        save_best(output.save, doc_of(res.ranked[0]), output.force, output.json_mode)


def search_disagg(c: ClusterOptions, pins: SearchPins, goal: SearchGoal, dtype: str, s: ServingOptions,
                  max_batch: int, request_rate: float | None, memory: MemoryOptions, output: OutputOptions,
                  moe: dict[str, object] | None = None) -> None:
    """`search --mode infer --disaggregated`: prefill and decode pools split over the GPUs (search.disagg);
    each phase's layouts are searched, so --tp / --pp / --ep pins are refused (as over pools)."""
    from llmplan.cli.inputs import cluster_of, make_allowance, make_job
    from llmplan.cost.serve_step import GraphHost
    from llmplan.search.disagg import search_disaggregated
    from llmplan.search.serve import check_search_moe, refuse_disagg_pins
    from llmplan.specs.registry import build, resolve_model
    refuse_disagg_pins(pins.tp, pins.pp, pins.ep)
    if output.save is not None:
        raise LlmplanError("--save with --disaggregated: a plan file holds one pool; save each pool with "
                           "`estimate --mode infer --phase prefill|decode ... --save`")
    m = resolve_model(c.model)
    cluster = cluster_of(c)
    job = make_job(s, max_batch, request_rate, host=GraphHost.of(cluster.system, m))
    dtypes = build(ServePlan, {"weight_dtype": dtype, "kv_dtype": s.kv_dtype}, SERVE_PLAN_OPTIONS, SERVE_PLAN_FLAGS)
    res = search_disaggregated(m, cluster, job, dtypes.weight_dtype, dtypes.kv_dtype, goal.top, job.request_rate,
                               make_allowance(memory), check_search_moe(m, dtype, s.kv_dtype, moe or {}))
    emit(report.disagg_json(res, m, cluster, job), output.json_mode,
         lambda: report.disagg_view(out, res, m, cluster, job))
    if not res.plans:
        stderr_line("error", f"no prefill / decode split of {cluster.num_gpus} GPUs fits and meets the SLOs")
        raise typer.Exit(EXIT_NO_FIT)


def tp_overlap_loses(res: SearchResult) -> bool:
    """Whether a plan the search ranks prices its userbuffer TP overlap slower than without it
    (TrainingEstimate.tp_overlap_gain < 0; docs/formulas.md#step.ub_loses), among the rows of its tie pool
    whatever --top cut (SearchResult.tp_overlap_loses) or those it shows."""
    return res.tp_overlap_loses or any(e.tp_overlap_gain is not None and e.tp_overlap_gain < 0 for e in res.ranked)


class TrainSearch(NamedTuple):
    """One system's training search as `search` shows it (train_search)."""

    model: ModelSpec
    result: SearchResult
    cluster: ClusterSpec
    workload: Workload
    options: ClusterOptions
    """The cluster options that made the shown result (domain_gpus set when a domain share won)."""
    allowance: MemoryAllowance
    order: tuple[str, ...]
    tokens: float


def train_search(c: ClusterOptions, pins: SearchPins, goal: SearchGoal, s: SwitchOptions,
                 split: PipelineSplitOptions, memory: MemoryOptions, checkpoints: CheckpointOptions,
                 output: OutputOptions, named: frozenset[str] = frozenset(), target: str | None = None) -> TrainSearch:
    """The search of the training path of `search` on one system: the switch settings and NVLink domain shares
    tried, the best kept (`named`: the options the command line set, search.run.refuse_unused_switches;
    `target`: each search keeps only the plans that export writes for it, cli.target)."""
    from llmplan.search.grid import Workload
    from llmplan.cli.inputs import cluster_of, make_allowance, make_checkpoint
    from llmplan.export import (MEGATRON_FSDP_TARGETS, SYNC_GATHER_TARGETS, UNFUSED_LOSS_TARGETS,
                                WHOLE_EMBEDDING_TARGETS)
    from llmplan.export.common import UNFUSED_LOSS_RUNS
    from llmplan.planfile import plan_document, save_refs
    from llmplan.specs.check_switches import MEGATRON_FSDP_UNITS, UB_UNSUPPORTED_RECIPES
    from llmplan.specs.registry import build, resolve_model
    from llmplan.specs.thresholds import CheckThresholds
    from llmplan.topology.placement import parse_order
    refuse_bad_goal_pins(goal, pins)
    m = resolve_model(c.model)
    cluster = cluster_of(c)
    order = parse_order(s.axis_order)
    build(CheckThresholds, {"min_headroom_gib": goal.min_headroom}, "--min-headroom")  # the range check uses
    base = search_workload(m, pins, s)
    if m.is_mla and base.tp_impl == "megatron" and "tp_comm_overlap" not in named:
        # Megatron-Core turns TP overlap off at an MLA model's first linear (step.mla_tp_overlap), and
        # Megatron-Bridge's DeepSeek / Kimi-K2 recipes set it off: the search does not default it on there
        base = Workload(**{**base.fields(), "tp_comm_overlap": False})
    if base.tp_impl == "megatron" and base.dtype in ("fp8", "fp4") and base.recipe in UB_UNSUPPORTED_RECIPES:
        # TE's userbuffers cannot gather NVFP4 / blockwise tensors (check rule tp_comm_overlap_recipe), and
        # Megatron-Bridge's NVFP4 presets set the overlap off: the search does not default it on there
        if "tp_comm_overlap" in named and base.tp_comm_overlap:
            raise LlmplanError(f"--tp-comm-overlap with recipe {base.recipe}: Transformer Engine's userbuffers "
                               "all-gather only per-tensor fp8 and MXFP8 tensors (check rule "
                               "tp_comm_overlap_recipe), so no plan with tp > 1 and sp could run it; drop "
                               "--tp-comm-overlap, or use --precision mxfp8")
        base = Workload(**{**base.fields(), "tp_comm_overlap": False})
    if m.is_moe and "moe_flex_backend" in named and "moe_dispatcher" not in named:
        # a backend named alone asks for the flex dispatcher: Megatron-Core reads moe_flex_dispatcher_backend only
        # in MoEFlexTokenDispatcher (NVIDIA/Megatron-LM d98e8a64dd megatron/core/transformer/moe/
        # token_dispatcher.py; transformer_config.py asserts the flex type for ncclep), so it pins deepep here
        base = Workload(**{**base.fields(), "moe_dispatcher": "deepep"})
    if target in SYNC_GATHER_TARGETS and "overlap_param_gather" not in named:  # it gathers after the step
        base = Workload(**{**base.fields(), "overlap_param_gather": False})
    if target in UNFUSED_LOSS_TARGETS and "fused_loss" not in named:  # its tp > 1 loss is three all-reduces
        base = Workload(**{**base.fields(), "fused_loss": False})
    if target in UNFUSED_LOSS_RUNS and "unfused_loss_impl" not in named and not base.fused_loss:
        # the unfused loss priced as the one the target runs (export.common.UNFUSED_LOSS_RUNS, its export's rule)
        base = Workload(**{**base.fields(), "unfused_loss_impl": UNFUSED_LOSS_RUNS[target]})
    if target in MEGATRON_FSDP_TARGETS and "megatron_fsdp" not in named and base.zero3_unit == "tensor":
        raise LlmplanError(f"--zero3-unit tensor with --target {target}: this target's ZeRO-3 is Megatron-FSDP's, "
                           f"which gathers a layer at a time (check rule megatron_fsdp_unit: {MEGATRON_FSDP_UNITS}); "
                           "drop --zero3-unit, or use --target deepspeed")
    if target in MEGATRON_FSDP_TARGETS and "megatron_fsdp" not in named:
        base = Workload(**{**base.fields(), "megatron_fsdp": True})  # its ZeRO-2 / 3 is Megatron-FSDP's; settled
        # off where it does nothing (ZeRO 0-1, a pipeline)
    if target in WHOLE_EMBEDDING_TARGETS and "tp_whole_embedding" not in named:  # AutoTP leaves embed_tokens whole
        base = Workload(**{**base.fields(), "tp_whole_embedding": True})
    refuse_missing_format(m, base, cluster)
    refuse_a2a_size_over_cluster(s.cp_a2a_size, cluster.num_gpus)
    tokens = parse_count(goal.train_tokens, "--train-tokens")  # before the search, not after it
    allowance = make_allowance(memory)
    refs = save_refs(c.model, c.hardware, output.save)
    ss = SettingSearch(m, c, cluster, pins, goal, s, search_pins(m, pins, split), allowance, order,
                       make_checkpoint(checkpoints), named, target,
                       lambda e: plan_document(e, allowance, order, report.estimate_json(e), refs),
                       auto_fsdp=target is None and "megatron_fsdp" not in named and base.zero3_unit == "layer")
    with progress_bar(not output.json_mode) as say:
        ss.say = say
        ss.every_setting(base)
    return ss.shown(tokens)


def refuse_bad_goal_pins(goal: SearchGoal, pins: SearchPins) -> None:
    """--objective, --recompute and --zero outside their values: one line each (train_search)."""
    from llmplan.search.grid import RECOMPUTE
    from llmplan.search.run import OBJECTIVES
    if goal.objective not in OBJECTIVES:
        raise LlmplanError(not_one_of("--objective", goal.objective, OBJECTIVES))
    if pins.recompute is not None and pins.recompute not in RECOMPUTE:
        raise LlmplanError(not_one_of("--recompute", pins.recompute, RECOMPUTE))
    if pins.zero is not None and not 0 <= pins.zero <= 3:
        raise LlmplanError(f"--zero {pins.zero}: ZeRO stages are 0, 1, 2 and 3")


if TYPE_CHECKING:
    Tried = tuple[dict, SearchResult, ClusterSpec, Workload, ClusterOptions]
    """One setting train_search searched: (its switch values, the result, the cluster and share, the workload,
    the cluster options that made it)."""


@dataclasses.dataclass
class SettingSearch:
    """train_search's searches on one system: the memory switch settings (each with both NVLink-domain shares),
    then, at the setting that won, the MoE dispatchers, the later CP comm type, the EP overlap under each and the
    TP overlap off where it loses; `tried` holds every setting searched, in that order."""

    m: ModelSpec
    c: ClusterOptions
    full_cluster: ClusterSpec
    pins: SearchPins
    goal: SearchGoal
    s: SwitchOptions
    pinned: dict
    allowance: MemoryAllowance
    order: tuple[str, ...]
    checkpoint: CheckpointPolicy | None
    named: frozenset[str]
    target: str | None
    doc_of: Callable[[TrainingEstimate], dict]
    say: Callable[[str], None] | None = None
    tried: list[Tried] = dataclasses.field(default_factory=list)
    walks: list[tuple[Workload, ClusterSpec, Walk]] = dataclasses.field(default_factory=list)
    """With a target: every search's walk (SearchResult.walks)."""
    screens: dict = dataclasses.field(default_factory=dict)
    """Memory screens (with the comm seconds but EP's), shared by the searches that differ only in the MoE
    dispatcher, and each space's enumerated axes (search.run.search's screens)."""
    hybrid: dict = dataclasses.field(default_factory=dict)
    """Per index of `tried`: the hybrid-sharding variants hybrid_rows priced on that setting's rows
    (search.hybrid.HybridTry)."""
    auto_fsdp: bool = False
    """Whether the search settles megatron_fsdp per setting (as_run): no --target, --megatron-fsdp not named, the
    ZeRO-3 unit per layer."""

    def as_run(self, wv: Workload) -> Workload:
        """`wv` with megatron_fsdp on where only Megatron-LM / Megatron-Bridge run its ZeRO-2 plans
        (export.megatron_only, read on one ZeRO-2 plan without a pipeline at an ep > 1 where its plans can take one):
        their ZeRO-2 / 3 is Megatron-FSDP's optim_grads / optim_grads_params, priced so
        (docs/formulas.md#mem.megatron_fsdp); off
        elsewhere (DeepSpeed's or torchtitan's ZeRO-2). With auto_fsdp only."""
        from llmplan.export import megatron_only
        from llmplan.search.grid import Workload
        if not self.auto_fsdp:
            return wv
        off = Workload(**{**wv.fields(), "megatron_fsdp": False})
        wide = next((d for d in range(2, self.m.num_experts + 1) if self.m.num_experts % d == 0), 1)
        ep = (self.pinned.get("ep") or wide) if self.m.is_moe else 1  # DeepSpeed refuses any ep > 1 alike
        try:
            on = megatron_only(self.m, off.plan(ep=ep, dp=ep, zero=2))
        except ValueError:  # no such plan to read the targets' rules on: as before, off
            on = False
        return Workload(**{**off.fields(), "megatron_fsdp": on}) if on != wv.megatron_fsdp else wv

    def run(self, cc: ClusterSpec, wv: Workload, full: int | None = None,
            beat: float | None = None) -> SearchResult | None:
        """One search of workload `wv` on `cc` (`full`: only the plans that straddle a domain of that many GPUs;
        `beat`: search.run.search's); with a target, its plans kept for it (None: an empty straddling space).
        Its side outputs are left pending, priced for the result shown (shown): no other setting's reach the
        output (the cross-setting rule and a target's walk read the ranked rows and the plans only)."""
        from llmplan.cli.target import keep_training
        from llmplan.search.grid import default_space
        from llmplan.search.run import straddling_space
        from llmplan.search.ties import TIE_POOL
        pins, goal = self.pins, self.goal
        whole = default_space(self.m, cc, wv, self.pinned, pins.max_tp, pins.max_pp, pins.max_cp)
        space = straddling_space(whole, full) if full else whole
        if space is None:
            return None
        res = run_search(self.m, cc, space, wv, goal.objective, max(goal.top, TIE_POOL), self.allowance, self.order,
                         progress=self.say, min_headroom=min_headroom_bytes(goal.min_headroom, cc.system.gpu.hbm_bytes),
                         checkpoint=self.checkpoint, vpp_pin=pins.vpp, named=self.named,
                         keep_plans=self.target is not None, screens=self.screens,
                         beat=beat if self.target is None else None, sides=False)
        if self.target is None:  # the tie pool's rows whatever --top is (hybrid_rows varies them); shown cuts
            return res
        # the tie pool's layouts whatever --top is, as the untargeted search ranks them (search.run: max(top,
        # TIE_POOL)): a setting's #1 is then its robust pick, which first_setting compares across settings; a walk
        # of --top 1 kept one layout, its fastest, and a slower setting's robust #1 could win against it while
        # the faster setting held that plan too (docs/validation.md#search-superset); shown cuts to --top
        kept = keep_training(res, self.target, self.doc_of, max(goal.top, TIE_POOL))
        if kept.walk is not None:  # its position marks the shown walk (shown; report.search target_walks)
            self.walks.append((wv, cc, kept.walk))
            kept = dataclasses.replace(kept, walk_index=len(self.walks) - 1)
        return kept

    def keeps_fp8_params(self, wv: Workload) -> bool:
        """Whether some plan of `wv`'s space on the full racks (fp8_params on), enumerated as the search does with
        the workload as it runs there (search.run.runs_on), passes check_plan's rules (search.run.any_passes):
        torchao_fp8_params_gather reads the axes (zero >= 2 over more than one shard rank), and fp8_params_dtype
        cuts it whole where the GPU has no fp8 GEMM and the plan runs bf16."""
        from llmplan.search.grid import default_space, enumerate_plans
        from llmplan.search.run import any_passes, runs_on
        cc, pins = self.full_cluster, self.pins
        m = trained_model(self.m, wv.base)
        space = default_space(m, cc, wv, self.pinned, pins.max_tp, pins.max_pp, pins.max_cp)
        return any_passes(m, enumerate_plans(space, cc, runs_on(m, cc, wv), self.screens), cc)

    def full_of(self, cluster: ClusterSpec) -> int | None:
        """The `full` of run() for a search on `cluster`: the domain's GPUs on a share, None on the full racks."""
        return self.full_cluster.system.domain_gpus if cluster is not self.full_cluster else None

    def every_setting(self, base: Workload) -> None:
        """Every setting train_search tries, in its order (the class's docstring)."""
        cp_later = self.memory_settings(base)
        self.megatron_for_the_first()  # before the steps whose floors read the winner (win_floor)
        self.at_the_winner(cp_later)
        self.without_tp_overlap()
        for last in (False, True):  # a later winner re-priced: floors read before it may be stale, and the
            if not self.megatron_for_the_first():  # new winner's TP overlap may lose (one more drop, then stop)
                break
            self.rerun_outrun()
            if not last:
                self.without_tp_overlap()
        self.hybrid_rows()
        self.screens.clear()

    def rerun_outrun(self) -> None:
        """Search again, with no floor, every setting that was cut short by a floor (SearchResult.outrun: no plan
        above the best so far): megatron_for_the_first can re-price the setting that set that floor lower, after
        which an outrun setting may hold the best plan (docs/validation.md#stop-66-mends)."""
        for k, (v, res, cluster, w, chosen) in enumerate(self.tried):
            if res.outrun:
                ro = self.run(cluster, w, full=self.full_of(cluster))
                if ro is not None:
                    self.tried[k] = (v, ro, cluster, w, chosen)

    def memory_settings(self, base: Workload) -> list:
        """The memory switch settings (search.run.switch_variants) with the CP comm types that run the model, each
        on the full racks and, where they have a power-of-two share, on it (best_domain); returns the CP comm
        types tried later, at the winner (search.variants.cp_comm_settings)."""
        from llmplan.export import TE_SOFTMAX_TARGETS
        from llmplan.search.grid import Workload
        from llmplan.search.run import NoPlanLeft, cp_comm_variants, power_of_two_domain, switch_variants
        from llmplan.search.variants import cp_comm_settings
        m, s, c, full_cluster, pins = self.m, self.s, self.c, self.full_cluster, self.pins
        cp_free = self.pinned.get("cp", 2) != 1 and (pins.max_cp or 2) > 1
        cp_types, cp_later = cp_comm_settings(cp_comm_variants(m, base, s.cp_comm_type is not None, cp_free), m,
                                              base, full_cluster, s, self.pinned, pins.max_tp, pins.max_cp, cp_free)
        if len(cp_types) == 1:  # the one comm type that runs the model (or the pinned one)
            base = Workload(**{**base.fields(), **cp_types[0]})
        for v in switch_variants(base, s.grad_dtype is not None, s.fp8_params is not None,
                                 try_scalings=self.target is not None and "fp8_scaling" not in self.named,
                                 cp_comm_types=tuple(cp_types), overlap_pinned="overlap_grad_reduce" in self.named,
                                 try_te_softmax=(self.target in TE_SOFTMAX_TARGETS
                                                 and "softmax_kernel" not in self.named)):
            wv = self.as_run(Workload(**{**base.fields(), **v}))
            if s.fp8_params is None and v["fp8_params"] and self.tried and not self.keeps_fp8_params(wv):
                continue  # fp8_params the search turned on itself, cut from every plan: the plain setting stands
            used = power_of_two_domain(full_cluster.system)
            shares = bool(used) and c.domain_gpus is None and c.gpus_per_node is None \
                and self.goal.objective != "headroom"

            def on_share(cc: ClusterSpec, wv: Workload = wv) -> SearchResult | None:
                return self.run(cc, wv, full=full_cluster.system.domain_gpus)
            try:
                res = self.run(full_cluster, wv)
            except NoPlanLeft as full_error:  # the rules leave no plan on the full racks (a pin no plan there can
                # use): the share the free search also tries may have some (share_only), else the refusal stands
                if not (shares and used is not None):
                    raise
                res, cluster, cv = share_only(full_error, full_cluster, used, c, on_share)
                self.tried.append((v, res, cluster, wv, cv))
                continue
            if res is None:  # only a straddling space can be empty; the full one never is
                continue
            cluster, cv = full_cluster, c
            if shares and used is not None:
                res, cluster, cv = best_domain(res, full_cluster, used, c, on_share)
            self.tried.append((v, res, cluster, wv, cv))
        return cp_later

    def at_the_winner(self, cp_later: list) -> None:
        """At the memory setting and share that won: the MoE dispatchers (search.run.dispatcher_variants) and the
        later CP comm type, then the EP all-to-all overlap under each of those (search.run.ep_overlap_variants).
        A setting none of whose plans comes within the resolution of the fastest so far cannot win (win_floor): its
        search stops before ranking; tokens/s objective only (win_floor compares tokens/s)."""
        from llmplan.export import FLEX_DISPATCH_TARGETS
        from llmplan.search.run import dispatcher_variants, first_setting, win_floor
        from llmplan.search.variants import cp_later_worth
        v, res, cluster, w, chosen = self.tried[first_setting([t[1] for t in self.tried])]  # the first of equals wins
        flex = self.target in (None, *FLEX_DISPATCH_TARGETS)
        dispatchers = dispatcher_variants(self.m, self.full_cluster, w, bool({"moe_dispatcher", "moe_flex_backend"}
                                                                              & self.named),
                                          self.pinned.get("ep") != 1) if flex else []
        base_dispatch = {"moe_dispatcher": w.moe_dispatcher, "moe_flex_backend": w.moe_flex_backend}
        if dispatchers:  # tried at the memory setting and NVLink-domain share that won
            self.tried = [({**t[0], **base_dispatch}, *t[1:]) for t in self.tried]
            v = {**v, **base_dispatch}
        later = cp_later_worth(cp_later, res.ranked[0] if res.ranked else None)  # a2a+p2p
        if later:  # the settings searched before it name their CP comm type too, so the one shown says which won
            self.tried = [({"cp_comm_type": t[3].cp_comm_type, **t[0]}, *t[1:]) for t in self.tried]
            v = {"cp_comm_type": w.cp_comm_type, **v}
        beat = win_floor(*(t[1] for t in self.tried)) if self.goal.objective == "throughput" else None
        at_winner = [(v, res, cluster, w, chosen)]  # the memory setting that won, under each dispatcher
        for d in dispatchers + later:
            n = len(self.tried)
            beat = self.one_more(d, v, w, res, cluster, chosen, beat)
            at_winner += self.tried[n:]
        self.ep_overlaps(w, res, at_winner, beat, flex)

    def ep_overlaps(self, w: Workload, res: SearchResult, at_winner: list[Tried], beat: float | None,
                    flex: bool) -> None:
        """The EP all-to-all overlap under each setting of `at_winner` (its gain depends on the dispatcher's
        all-to-all time), the most promising first, pruned as at_the_winner's; their plans are alike: one memory
        screen. `res`: the winning memory setting's result."""
        from llmplan.search.run import best_score, ep_overlap_variants
        overlaps = ep_overlap_variants(self.m, w, "ep_comm_overlap" in self.named, self.pinned.get("ep") != 1,
                                       self.pinned) if flex else []
        if overlaps:
            self.tried = [({**t[0], "ep_comm_overlap": t[3].ep_comm_overlap}, *t[1:]) for t in self.tried]
            at_winner = [({**t[0], "ep_comm_overlap": t[3].ep_comm_overlap}, *t[1:]) for t in at_winner]
        for d in overlaps:
            for t in sorted(at_winner, key=lambda t: -(t[1].top_score if t[1].outrun else best_score(t[1])[0])):
                beat = self.one_more(d, t[0], t[3], res, t[2], t[4], beat)  # beat: the best of every setting tried

    def one_more(self, d: dict, v: dict, w: Workload, res: SearchResult, cluster: ClusterSpec,
                 chosen: ClusterOptions, beat: float | None) -> float | None:
        """Search setting `d` on top of the winning setting (v, w, its cluster and share): appended to `tried`
        unless a rule refuses it whatever the axes; returns the score a later setting must beat."""
        from llmplan.search.grid import Workload
        from llmplan.search.run import win_floor
        wd = self.as_run(Workload(**{**w.fields(), **d}))
        try:
            rd = self.run(cluster, wd, full=self.full_of(cluster), beat=beat)
        except LlmplanError:  # a rule the setting breaks whatever the axes: not a setting to try
            return beat
        if rd is not None and res.domain is not None and not rd.outrun:  # the other share, same setting
            rd, dcluster, dchosen = other_share(rd, cluster, self.full_cluster, res.domain.used, self.c,
                                                lambda cc: self.run(cc, wd, full=self.full_of(cc)))
            self.tried.append(({**v, **d}, rd, dcluster, wd, dchosen))
        elif rd is not None:
            self.tried.append(({**v, **d}, rd, cluster, wd, chosen))
        return beat if beat is None or rd is None else max(beat, win_floor(rd))

    def without_tp_overlap(self) -> None:
        """step.ub_loses: an overlap the search turned on itself that prices slower than none on a plan it shows:
        the winning setting is searched again without it, and so is every other setting whose #1 also loses by it
        and whose fastest plan is within the resolution of the fastest so far (win_floor: one that could lead; a
        setting as_run prices otherwise, megatron_fsdp, can lose the tie rule to a robust one and still lead
        without the overlap). Plans it beats win; tokens/s prunes as above (the headroom objective: the winner
        only)."""
        from llmplan.search.grid import Workload
        from llmplan.search.run import best_score, first_setting, win_floor
        if "tp_comm_overlap" in self.named:
            return
        win = self.tried[first_setting([t[1] for t in self.tried])]
        throughput = self.goal.objective == "throughput"
        floor = win_floor(*(t[1] for t in self.tried)) if throughput else None
        others = sorted((t for t in self.tried if t is not win and throughput and t[1].ranked and not t[1].outrun
                         and floor is not None and t[1].top_score >= floor), key=lambda t: -best_score(t[1])[0])
        added: list[Tried] = []
        for v, res, cluster, w, chosen in [win, *others]:
            if not w.tp_comm_overlap or not res.ranked or not tp_overlap_loses(res):
                continue
            wo = self.as_run(Workload(**{**w.fields(), "tp_comm_overlap": False}))
            ro = self.run(cluster, wo, full=self.full_of(cluster),
                          beat=win_floor(*(t[1] for t in [*self.tried, *added])) if throughput else None)
            if ro is not None:
                added.append(({**v, "tp_comm_overlap": False}, ro, cluster, wo, chosen))
        if added:
            self.tried = [({**t[0], "tp_comm_overlap": t[3].tp_comm_overlap}, *t[1:]) for t in self.tried] + added

    def hybrid_rows(self) -> None:
        """Hybrid sharding (search.hybrid) on the rows of the settings that can lead: the winning one and, for
        tokens/s, each whose fastest plan is within the resolution of the fastest so far (win_floor), as
        without_tp_overlap picks them. Its variants are priced on the rows as the setting holds them (its
        workload, cluster and share) and kept only where some target writes them (export.exports: the
        optimizer across the replicas by the Megatron exports alone, Megatron-FSDP's outer optim). Not with
        --target, nor where --dp-replicate or --dp-outer-optimizer is named (the user set it for every plan)."""
        from llmplan.search.hybrid import hybrid_pass
        from llmplan.search.layouts import price
        from llmplan.search.run import first_setting, win_floor
        from llmplan.search.ties import TIE_POOL
        if self.target is not None or {"dp_replicate", "dp_outer_optimizer"} & self.named:
            return
        win = first_setting([t[1] for t in self.tried])
        throughput = self.goal.objective == "throughput"
        floor = win_floor(*(t[1] for t in self.tried)) if throughput else None
        for k, (v, res, cluster, w, chosen) in enumerate(self.tried):
            if not res.ranked or (k != win and (floor is None or res.outrun or res.top_score < floor)):
                continue
            m = trained_model(self.m, w.base)
            headroom = min_headroom_bytes(self.goal.min_headroom, cluster.system.gpu.hbm_bytes)

            def priced(p: Any, m: ModelSpec = m, cc: ClusterSpec = cluster, h: float = headroom) -> Any:
                got = price(m, cc, [p], self.allowance, self.order, self.checkpoint, h)
                return got[0] if got else None

            new, tried = hybrid_pass(res, cluster, priced, self.written, max(self.goal.top, TIE_POOL))
            if tried:
                self.tried[k] = (v, new, cluster, w, chosen)
                self.hybrid[k] = tried

    def written(self, e: TrainingEstimate) -> bool:
        """Whether some training target writes plan `e` (export.exports on its plan document)."""
        from llmplan.export import exports
        from llmplan.planfile import document_plan
        return any(why is None for why in exports(document_plan(self.doc_of(e))).values())

    def needs_megatron(self, first: TrainingEstimate) -> bool:
        """Whether `first`, a ZeRO-2 / 3 plan without a pipeline priced without megatron_fsdp, is one only
        Megatron-LM / Megatron-Bridge run for a reason of its own axes (torchtitan's selective recompute, expert
        TP, ...; DeepSpeed's EP, ...): no target writes it (export.exports) and, priced with megatron_fsdp, one of
        MEGATRON_FSDP_TARGETS would (export.refusal)."""
        from llmplan.export import MEGATRON_FSDP_TARGETS, exports, refusal
        from llmplan.planfile import document_plan
        p = first.plan
        if p.megatron_fsdp or p.zero < 2 or p.pp > 1:
            return False
        pf = document_plan(self.doc_of(first))
        if any(why is None for why in exports(pf).values()):
            return False
        on = dataclasses.replace(pf, plan=pf.plan.model_copy(update={"megatron_fsdp": True}))
        return any(refusal(on, t) is None for t in MEGATRON_FSDP_TARGETS)

    def megatron_for_the_first(self) -> bool:
        """The per-plan part of as_run (docs/validation.md#mfsdp-plan): where the winning setting's #1 is a ZeRO-2 /
        3 plan that only Megatron runs (needs_megatron) although the setting prices megatron_fsdp off, the setting
        is searched again with it on and that search replaces it (its plans priced as the one launcher that runs
        its best one runs them, or none where none is left); then the first of the settings wins again, and is
        re-priced in turn where it needs Megatron too. At most once per setting. Without
        --target only, with auto_fsdp (the user named neither --megatron-fsdp nor --no-megatron-fsdp). Whether it
        re-priced a setting."""
        from llmplan.search.grid import Workload
        from llmplan.search.run import first_setting
        if not self.auto_fsdp:
            return False
        redone: set[int] = set()
        while True:
            i = first_setting([t[1] for t in self.tried])
            v, res, cluster, w, chosen = self.tried[i]
            if i in redone or w.megatron_fsdp or not res.ranked or not self.needs_megatron(res.ranked[0]):
                return bool(redone)
            won = Workload(**{**w.fields(), "megatron_fsdp": True})
            ro = self.run(cluster, won, full=self.full_of(cluster))
            if ro is None:
                return bool(redone)
            self.tried[i] = (v, ro, cluster, won, chosen)  # no plan left: the setting leaves the contest
            redone.add(i)

    def shown(self, tokens: float) -> TrainSearch:
        """The best setting tried (the first of equals: plain wins ties), as `search` shows it."""
        from llmplan.cli.target import refuse_every_setting, training_sides
        from llmplan.search.hybrid import HybridChoice
        from llmplan.search.run import SwitchChoice, best_score, complete_sides, first_setting
        from llmplan.search.run import shown as shown_rows
        if self.target is not None:  # none kept a plan: what refused them, over every setting tried
            refuse_every_setting(self.target, [(t[0], t[1]) for t in self.tried])
        chose_fsdp = self.auto_fsdp and any(t[3].megatron_fsdp for t in self.tried)
        if chose_fsdp:  # as_run turned it on somewhere: the switches line says which way the shown plans run
            self.tried = [({**t[0], "megatron_fsdp": t[3].megatron_fsdp}, *t[1:]) for t in self.tried]
        i = first_setting([t[1] for t in self.tried])
        v, res, cluster, w, chosen = self.tried[i]
        res = complete_sides(res)  # priced for the result shown only (run: sides=False)
        if self.target is None:  # run kept the tie pool's rows: the first --top of them, with their ties
            res = shown_rows(res, self.goal.top)
        if self.hybrid.get(i):  # what hybrid_rows tried on the rows shown, and whether #1 runs it
            p = res.ranked[0].plan
            res = dataclasses.replace(res, hybrid=HybridChoice(tuple(self.hybrid[i]), (
                p.dp_replicate, p.dp_outer_optimizer) if p.dp_replicate > 1 else None))
        if self.target is not None:  # the side outputs of the result shown only, its --top rows (run kept the pool)
            res = shown_rows(res, self.goal.top)
            if res.walk is not None:  # the rows of another plan of their layout among those shown
                was = res.walk
                now = dataclasses.replace(was, other_plan=tuple(k for k in was.other_plan if k <= self.goal.top))
                res = dataclasses.replace(res, walk=now)
                if res.walk_index is not None:  # the shown walk, at the position run recorded
                    a, b, _ = self.walks[res.walk_index]
                    self.walks[res.walk_index] = (a, b, now)
            res = training_sides(res, self.target, self.doc_of)
            res = dataclasses.replace(res, walks=tuple(self.walks))
        if len(self.tried) > 1:  # a dispatcher outrun (no plan above the best so far): its best plan's score
            res = dataclasses.replace(res, switches=SwitchChoice(v, tuple(
                (t[0], t[1].top_score if t[1].outrun else best_score(t[1])[0]) for t in self.tried)))
        return TrainSearch(self.m, res, cluster, w, chosen, self.allowance, self.order, tokens)


def search_train(c: ClusterOptions, pins: SearchPins, goal: SearchGoal, s: SwitchOptions,
                 split: PipelineSplitOptions, memory: MemoryOptions, checkpoints: CheckpointOptions,
                 output: OutputOptions, named: frozenset[str] = frozenset(), target: str | None = None) -> None:
    """The training path of `search`: one system (train_search) or, with several, which to rent (cli.systems)."""
    from llmplan.advice import advise_training
    from llmplan.cli.inputs import with_hardware_options
    from llmplan.cli.pools import search_pools_cli, single_pool_options
    from llmplan.cli.systems import search_systems, wants_comparison
    from llmplan.export import exports
    from llmplan.planfile import document_plan, plan_document, save_refs
    from llmplan.specs.registry import is_pool_file
    if is_pool_file(c.hardware):  # a cluster file: one pool is that system's search, several are cli.pools'
        one = single_pool_options(c, goal)
        if one is None:
            return search_pools_cli(c, pins, goal, s, split, memory, checkpoints, output)
        c = one
    def with_exports(found: TrainSearch, cv: ClusterOptions) -> TrainSearch:
        """train_search's result with, without --target, which targets write the #1 shown
        (report.search.exports_lines): one system's search and each row of a comparison alike."""
        res = found.result
        if target is not None or not res.ranked:
            return found
        doc = {**plan_document(res.ranked[0], found.allowance, found.order, report.estimate_json(res.ranked[0]),
                               save_refs(cv.model, cv.hardware, output.save)), **with_hardware_options(found.options)}
        return found._replace(result=dataclasses.replace(res, exports=exports(document_plan(doc))))

    if wants_comparison(c, goal):
        return search_systems(c, goal, output, lambda cv, g: with_exports(
            train_search(cv, pins, g, s, split, memory, checkpoints, output, named), cv))
    m, res, cluster, w, chosen, allowance, order, tokens = with_exports(
        train_search(c, pins, goal, s, split, memory, checkpoints, output, named, target), c)
    console = Console(width=max(out.width, 160)) if goal.wide else out
    advice = advise_training(res.ranked[0], allowance, order) if goal.explain_opt and res.ranked else None
    refs = save_refs(c.model, c.hardware, output.save)
    best_doc = lambda: {**plan_document(res.ranked[0], allowance, order,  # noqa: E731
                                        report.estimate_json(res.ranked[0]), refs), **with_hardware_options(chosen)}

    emit(report.search_json(res, w, cluster, m, tokens, advice), output.json_mode,
         lambda: report.search_view(console, res, w, cluster, m, tokens, goal.explain_opt, advice, goal.wide))
    if not res.ranked:
        stderr_line("error", f"no plan fits {m.name} on {cluster.num_nodes} x {cluster.system.name}"
                    + (f"; it would fit with {'; '.join(res.suggestions)}" if res.suggestions else ""))
        raise typer.Exit(EXIT_NO_FIT)
    if output.save is not None:
        save_best(output.save, {**best_doc(), "search": report.search_points(res)}, output.force, output.json_mode)


def best_domain(res: SearchResult, cluster: ClusterSpec, used: int, c: ClusterOptions,
                run: ShareRun) -> tuple[SearchResult, ClusterSpec, ClusterOptions]:
    """Search again with `used` GPUs of each NVLink domain (DomainChoice) and keep the result whose #1 leads
    (search.run.first_setting); records the choice on the result and returns the cluster options that made the winner
    (with domain_gpus = used when the share wins, so that --save records it)."""
    from llmplan.cli.inputs import cluster_of
    from llmplan.search.run import nodes_using
    nodes = nodes_using(cluster, used)
    try:
        alt_cluster = cluster_of(c, nodes=nodes, domain_gpus=used)
        alt = run(alt_cluster)
    except LlmplanError:  # pins that only the full domain allows: keep the full-domain result
        return res, cluster, c
    if alt is None:  # no expert-parallel degree that the full domain cannot hold (dense models)
        return res, cluster, c
    return pick_domain(res, cluster, alt, alt_cluster, used, c)


def share_only(full_error: NoPlanLeft, cluster: ClusterSpec, used: int, c: ClusterOptions,
               run: ShareRun) -> tuple[SearchResult, ClusterSpec, ClusterOptions]:
    """best_domain where the search on the full domains was refused (`full_error`: a pinned switch that no plan
    there can use, e.g. --ep-comm-overlap where every ep > 1 plan breaks a rule on 72-GPU racks) but the
    power-of-two share, which the free search also tries, has plans that use it: the share's result, its
    choice recorded with nothing on the full domains (DomainChoice, 0 tokens/s); `full_error` raised when the
    share has no plan either, so that a pin no share mends is refused as before (quoting the plans of both
    searches where both were refused a named switch: NoPlanLeft.unused)."""
    from llmplan.cli.inputs import cluster_of
    from llmplan.search.run import NoPlanLeft, nodes_using
    try:
        alt_cluster = cluster_of(c, nodes=nodes_using(cluster, used), domain_gpus=used)
        alt = run(alt_cluster)
    except NoPlanLeft as share_error:
        full = full_error.unused
        if full is None:
            raise full_error from None
        # the share searched too: its plans left by the rules (none where no plan passed them there)
        share_plans = share_error.unused.plans if share_error.unused is not None else 0
        raise NoPlanLeft(full.on_shares(cluster.system.domain_gpus, used, share_plans), full) from None
    except LlmplanError:
        raise full_error from None
    if alt is None:  # no expert-parallel degree the full domain cannot hold: nothing the share could mend
        raise full_error
    return share_alone(alt, cluster, alt_cluster, used), alt_cluster, c.model_copy(update={"domain_gpus": used})


def share_alone(alt: SearchResult, cluster: ClusterSpec, alt_cluster: ClusterSpec, used: int) -> SearchResult:
    """`alt` (the search on `used` GPUs of each domain) with its DomainChoice where the full domains of
    `cluster` had no plan (refused there: 0 tokens/s, as pick_domain records a share where nothing fits)."""
    from llmplan.search.run import DomainChoice
    full = cluster.system.domain_gpus
    best = float(alt.ranked[0].throughput.tokens_per_s) if alt.ranked else 0.0
    return dataclasses.replace(alt, domain=DomainChoice(full=full, used=used, gpus={full: cluster.num_gpus,
                                                                                    used: alt_cluster.num_gpus},
                                                        tokens_per_s={full: 0.0, used: best}))


def other_share(rd: SearchResult, cluster: ClusterSpec, full_cluster: ClusterSpec, used: int, c: ClusterOptions,
                run: ShareRun) -> tuple[SearchResult, ClusterSpec, ClusterOptions]:
    """A dispatcher's search on the NVLink-domain share that won (`cluster`, with `used` GPUs a domain), compared
    again with the other share at that dispatcher, so that the domain line states one dispatcher's numbers."""
    from llmplan.cli.inputs import cluster_of
    from llmplan.search.run import nodes_using, power_of_two_domain
    share = power_of_two_domain(full_cluster.system) or used
    alt_cluster = cluster_of(c, nodes=nodes_using(full_cluster, share), domain_gpus=share)
    try:
        other = run(full_cluster if cluster is not full_cluster else alt_cluster)
    except LlmplanError:
        other = None
    if other is None and cluster is not full_cluster:  # the full domains refused it: the share alone (share_only)
        return share_alone(rd, full_cluster, cluster, share), cluster, c.model_copy(update={"domain_gpus": share})
    if other is None:
        return rd, cluster, c
    full_res, alt_res = (other, rd) if cluster is not full_cluster else (rd, other)
    return pick_domain(full_res, full_cluster, alt_res, alt_cluster, share, c)


def pick_domain(res: SearchResult, cluster: ClusterSpec, alt: SearchResult, alt_cluster: ClusterSpec, used: int,
                c: ClusterOptions) -> tuple[SearchResult, ClusterSpec, ClusterOptions]:
    """The better of a full-domain result and one with `used` GPUs of each domain, the choice recorded on it."""
    from llmplan.search.run import DomainChoice, first_setting
    full = cluster.system.domain_gpus
    best = lambda r: float(r.ranked[0].throughput.tokens_per_s) if r.ranked else 0.0
    pick_alt = first_setting([res, alt]) == 1  # the rule that orders plans, across the two searches
    choice = DomainChoice(full=full, used=used if pick_alt else full,
                          gpus={full: cluster.num_gpus, used: alt_cluster.num_gpus},
                          tokens_per_s={full: best(res), used: best(alt)})
    if pick_alt:
        return dataclasses.replace(alt, domain=choice), alt_cluster, c.model_copy(update={"domain_gpus": used})
    return dataclasses.replace(res, domain=choice), cluster, c


def refuse_overlapping_pins(pins: SearchPins) -> None:
    """Two search options that set one thing, so that one would be silently ignored: a bound (--max-tp, --max-pp,
    --max-cp) on a pinned axis, --no-cp beside --cp, --batch-tokens beside --global-batch."""
    from llmplan.fileio import excerpt
    for bound, limit, axis, pinned in (("--max-tp", pins.max_tp, "--tp", pins.tp),
                                       ("--max-pp", pins.max_pp, "--pp", pins.pp),
                                       ("--max-cp", pins.max_cp, "--cp", pins.cp),
                                       ("--max-cp", pins.max_cp, "--no-cp", 1 if pins.no_cp else None)):
        if limit is not None and pinned is not None:
            raise LlmplanError(f"{bound} {limit} bounds a free {axis.replace('--no-', '--')}, but {axis}"
                               f"{'' if axis == '--no-cp' else f' {pinned}'} pins it; drop one of them")
    if pins.no_cp and pins.cp not in (None, 1):
        raise LlmplanError(f"--no-cp and --cp {pins.cp} both set the context-parallel degree; give one of them")
    if pins.global_batch is not None and pins.batch_tokens is not None:
        raise LlmplanError(f"--global-batch {pins.global_batch} and --batch-tokens {excerpt(pins.batch_tokens)} both "
                           "set the batch; give one of them")


def refuse_missing_format(m: ModelSpec, w: Workload, cluster: ClusterSpec) -> None:
    """A --dtype / --precision whose tensor-core format the GPU does not have (fp8 on A100) is refused as
    `estimate` refuses it (check_plan's dtype_hardware); the search's kernel fallback (runs_on: bf16 GEMMs
    where a format's kernels are missing) would otherwise price bf16 under an fp8 heading, or stop on the
    fp8-params switch it tries (a rule the user never named)."""
    from llmplan.specs.check import RULES

    rule = next(r for r in RULES if r.name == "dtype_hardware")
    plan = w.plan()
    if not rule.ok(m, plan, cluster):
        raise LlmplanError(f"the workload breaks a rule: {rule.message(m, plan, cluster)}")


def refuse_a2a_size_over_cluster(size: int | None, gpus: int) -> None:
    """A pinned --cp-a2a-size that no cp degree on the cluster can hold (check_plan's cp_hierarchical_sizes wants
    cp above it and a multiple of it, so cp >= 2 x size GPUs) is refused by name, not as every plan's cp 1."""
    if size is not None and 2 * size > gpus:
        fits = [k for k in (2, 4, 8, 16, 32) if 2 * k <= gpus]
        fix = f"use --cp-a2a-size {fits[-1]} or less" if fits else "a2a+p2p needs 4 GPUs or more"
        raise LlmplanError(f"--cp-a2a-size {size} needs cp of at least {2 * size} (above it and a multiple of "
                           f"it: cp_hierarchical_sizes), more than the {gpus:,} GPUs searched; {fix}")


def search_workload(m: ModelSpec, pins: SearchPins, s: SwitchOptions) -> Workload:
    """What the search holds fixed: batch (from --global-batch or --batch-tokens), sequence and switches."""
    from llmplan.search.grid import Workload
    from llmplan.cli.inputs import OPTION_FLAGS, switches
    from llmplan.specs.registry import build
    seq = s.seq_len if s.seq_len is not None else default_seq_len(m)
    global_batch = pins.global_batch
    if global_batch is None:
        tokens = parse_count(pins.batch_tokens, "--batch-tokens") if pins.batch_tokens else DEFAULT_BATCH_TOKENS
        global_batch = global_batch_from_tokens(tokens, seq)
    flags = {"bias_dropout_fusion": default_bias_dropout_fusion(m), **switches(s)}  # the model's unless named
    if flags["grad_reduce"] == "all-reduce" and (pins.zero is None or pins.zero >= 2):
        zero = "a free --zero" if pins.zero is None else f"--zero {pins.zero}"
        raise LlmplanError(f"--grad-reduce all-reduce with {zero}: ZeRO-2/3 keep only their gradient shard, so "
                           "they reduce-scatter; pin --zero 1 (or 0) or drop --grad-reduce")
    # a value the user gave names its flag (as estimate's PLAN_FLAGS); a derived one names the field
    given = {**({"seq_len": "--seq-len"} if s.seq_len is not None else {}),
             **({"global_batch": "--global-batch"} if pins.global_batch is not None else {})}
    build(ParallelPlan, {"seq_len": seq, "global_batch": global_batch, **flags}, "workload options",
          {**OPTION_FLAGS, **given})  # validates
    return Workload(global_batch=global_batch, seq_len=seq, **flags)


def search_pins(m: ModelSpec, pins: SearchPins, split: PipelineSplitOptions) -> dict:
    """The axes the options pin (None: free)."""
    from llmplan.cli.inputs import checked_pins, pipeline_split
    refuse_overlapping_pins(pins)
    pp = pins.pp
    if (split.embedding_in_split or split.loss_in_split) and not pp:
        raise LlmplanError("--account-for-*-in-pipeline-split in search needs --pp (the split depends on it)")
    stages = pipeline_split(m, pp or 1, split.pp_first, split.pp_last, None, split.embedding_in_split,
                            split.loss_in_split)
    axes = {"pp_first": stages["pp_first"] or None, "pp_last": stages["pp_last"] or None, "tp": pins.tp, "pp": pp,
            "cp": 1 if pins.no_cp else pins.cp, "ep": pins.ep, "etp": pins.etp, "vpp": pins.vpp, "sp": pins.sp,
            "zero": pins.zero, "recompute": pins.recompute, "micro_batch": pins.micro_batch}
    return checked_pins(ParallelPlan, axes)
