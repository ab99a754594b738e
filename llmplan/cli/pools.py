"""`llmplan search --hardware cluster.yaml` where the file lists several pools (`pools:`): the training search
over pools (search.hetero). Called by cli.search before the single-system path."""

from __future__ import annotations

from pathlib import Path

import typer

from llmplan.cli.app import emit, out, progress_bar, save_best, stderr_line
from llmplan.cli.inputs import make_allowance, make_checkpoint
from llmplan.errors import EXIT_NO_FIT, LlmplanError
from llmplan.estimate import TrainingEstimate
from llmplan.planfile import plan_document, save_refs
from llmplan.report.pools import hetero_json, pool_search_json, pool_search_view
from llmplan.search.grid import Workload, default_space
from llmplan.search.hetero import search_pools
from llmplan.search.run import cp_comm_variants
from llmplan.search.run import search as run_search
from llmplan.search.variants import cp_comm_settings, cp_later_worth
from llmplan.specs.defaults import min_headroom_bytes
from llmplan.specs.model import ModelSpec
from llmplan.specs.options import (
    CheckpointOptions,
    ClusterOptions,
    MemoryOptions,
    OutputOptions,
    PipelineSplitOptions,
    SearchGoal,
    SearchPins,
    SwitchOptions,
)
from llmplan.specs.plan import ClusterSpec
from llmplan.specs.registry import load_pool_file, resolve_model, single_pool
from llmplan.topology.placement import parse_order


def refuse_single_system_flags(c: ClusterOptions, goal: SearchGoal) -> None:
    """The flags that shape one system's cluster have no meaning for a file that gives each pool's nodes."""
    given = [flag for flag, v in (("--nodes", c.nodes != 1), ("--gpus-per-node", c.gpus_per_node is not None),
                                  ("--power-limit", c.power_limit is not None),
                                  ("--domain-gpus", c.domain_gpus is not None)) if v]
    if given:
        raise LlmplanError(f"{c.hardware} lists pools with their nodes; drop {', '.join(given)} (set each pool's "
                           f"nodes, or its system file's keys, in the cluster file)")
    if single_pool(Path(c.hardware)) is None:  # several pools
        unread = [flag for flag, v in (("--objective", goal.objective != "throughput"), ("--wide", goal.wide),
                                       ("--explain", goal.explain_opt)) if v]
        if unread:
            raise LlmplanError(f"{', '.join(unread)} with a cluster of several pools: the search over pools ranks "
                               f"by throughput in its own table; drop {', '.join(unread)}")


def single_pool_options(c: ClusterOptions, goal: SearchGoal) -> ClusterOptions | None:
    """The cluster options of a cluster file that lists one pool, as --hardware SYSTEM --nodes N (the
    single-system search, exactly); None for a file of several pools."""
    refuse_single_system_flags(c, goal)
    single = single_pool(Path(c.hardware))
    if single is None:
        return None
    return c.model_copy(update={"hardware": single[0], "nodes": single[1]})


def search_pools_cli(c: ClusterOptions, pins: SearchPins, goal: SearchGoal, s: SwitchOptions,
                     split: PipelineSplitOptions, memory: MemoryOptions, checkpoints: CheckpointOptions,
                     output: OutputOptions) -> None:
    """The training search over a cluster file of several pools."""
    from llmplan.cli.search import (  # the single-system path's option handling
        search_pins,
        search_workload,
    )

    refuse_single_system_flags(c, goal)
    pc = load_pool_file(Path(c.hardware))
    m: ModelSpec = resolve_model(c.model)
    order = parse_order(s.axis_order)
    w = search_workload(m, pins, s)
    allowance = make_allowance(memory)
    checkpoint = make_checkpoint(checkpoints)
    pinned = search_pins(m, pins, split)

    cp_free = pinned.get("cp", 2) != 1 and (pins.max_cp or 2) > 1
    plain = cp_comm_variants(m, w, s.cp_comm_type is not None, cp_free)

    with progress_bar(not output.json_mode) as say:
        def run(cc: ClusterSpec) -> list[TrainingEstimate]:
            """The single-system search of `cc` under each of Transformer Engine's CP attentions the model's masks
            allow (variants.cp_comm_settings, as the single-system search tries them), their plans merged by
            tokens/s (one setting: its own ranking); a setting no plan passes is skipped unless all are."""
            ranked: list[TrainingEstimate] = []
            first, later = cp_comm_settings(plain, m, w, cc, s, pinned, pins.max_tp, pins.max_cp, cp_free)
            refused: list[LlmplanError] = []

            def one(v: dict) -> None:
                wv = Workload(**{**w.fields(), **v})
                space = default_space(m, cc, wv, pinned, pins.max_tp, pins.max_pp, pins.max_cp)
                try:
                    res = run_search(m, cc, space, wv, "throughput", max(goal.top, 8), allowance, order,
                                     progress=say, min_headroom=min_headroom_bytes(goal.min_headroom,
                                                                                   cc.system.gpu.hbm_bytes),
                                     checkpoint=checkpoint, vpp_pin=pins.vpp, sides=False)  # ranked only
                except LlmplanError as e:
                    refused.append(e)
                    return
                ranked.extend(res.ranked)

            for v in first:
                one(v)
            best = max(ranked, key=lambda e: float(e.throughput.tokens_per_s), default=None)
            settings = first + cp_later_worth(later, best)  # a2a+p2p only where the best so far runs cp > 1
            for v in settings[len(first):]:
                one(v)
            if len(refused) == len(settings):
                raise refused[-1]
            if len(settings) > 1:
                ranked.sort(key=lambda e: -float(e.throughput.tokens_per_s))
            return ranked

        res = search_pools(m, pc, run, allowance, order, checkpoint,
                           lambda cap: min_headroom_bytes(goal.min_headroom, cap), goal.top)
    emit(pool_search_json(res, pc, m, w.global_batch, w.seq_len), output.json_mode,
         lambda: pool_search_view(out, res, pc, m))
    if not res.ranked:
        stderr_line("error", f"no plan fits {m.name} on {pc.name} ({pc.num_gpus} GPUs over {len(pc.pools)} pools)")
        raise typer.Exit(EXIT_NO_FIT)
    if output.save is not None:
        best = res.ranked[0]
        refs = save_refs(c.model, c.hardware, output.save)
        doc = plan_document(best.estimate, allowance, order, hetero_json(best), refs)
        doc.pop("hardware_ref", None)  # the cluster file is no one system: the snapshot stands for it
        doc["pools"] = {"cluster": pc.model_dump(mode="json"), "plan": best.hetero.model_dump(mode="json")}
        save_best(output.save, doc, output.force, output.json_mode)
