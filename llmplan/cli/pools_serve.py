"""`llmplan search --mode infer --hardware cluster.yaml` where the file lists several pools: serving over pools
(search.hetero_serve), co-located or, with --disaggregated, prefill and decode assigned to pools. Called by
cli.search before the single-system serving paths."""

from __future__ import annotations

from pathlib import Path

import typer

from llmplan.cli.app import emit, out, stderr_line
from llmplan.cli.inputs import checked_pins, make_allowance, make_job
from llmplan.cli.pools import refuse_single_system_flags
from llmplan.errors import EXIT_NO_FIT, LlmplanError
from llmplan.report.pools_serve import (
    pools_disagg_json,
    pools_disagg_view,
    pools_serve_json,
    pools_serve_view,
)
from llmplan.search.hetero_serve import (
    search_colocated_pools,
    search_disaggregated_pools,
)
from llmplan.search.serve import check_search_moe, refuse_disagg_pins, refuse_search_phase
from llmplan.specs.options import (
    SERVE_PLAN_FLAGS,
    SERVE_PLAN_OPTIONS,
    ClusterOptions,
    MemoryOptions,
    OutputOptions,
    SearchGoal,
    SearchPins,
    ServingOptions,
)
from llmplan.specs.registry import build, load_pool_file, resolve_model
from llmplan.specs.serve import ServePlan


def search_pools_serving(c: ClusterOptions, pins: SearchPins, goal: SearchGoal, dtype: str, s: ServingOptions,
                         max_batch: int, request_rate: float | None, memory: MemoryOptions, output: OutputOptions,
                         disaggregated: bool, moe: dict[str, object] | None = None) -> None:
    """Serving over a cluster file of several pools: each pool's replicas (or each phase's instances) on its own
    GPU, sized to the SLOs and --request-rate. `moe`: the MoE serving options given (cli.search.given_moe),
    checked as the one-system search checks them (search.serve.check_search_moe) and applied to every pool's
    layouts as that search applies them (search.serve.with_moe_options)."""
    refuse_single_system_flags(c, goal)
    refuse_search_phase(moe or {})
    if output.save is not None:
        raise LlmplanError(f"--save with {c.hardware}'s pools in --mode infer: a serving plan file holds one "
                           "system; save each pool's plan with `estimate --mode infer --hardware SYSTEM ... --save`")
    if disaggregated:
        refuse_disagg_pins(pins.tp, pins.pp, pins.ep)
    pc = load_pool_file(Path(c.hardware))
    m = resolve_model(c.model)
    moe = check_search_moe(m, dtype, s.kv_dtype, moe or {}, None if disaggregated else pins.ep)
    job = make_job(s, max_batch, request_rate)  # SGLang's graph sizes: estimate_serving, at each pool's GPU
    dtypes = build(ServePlan, {"weight_dtype": dtype, "kv_dtype": s.kv_dtype}, SERVE_PLAN_OPTIONS, SERVE_PLAN_FLAGS)
    allowance = make_allowance(memory)
    if disaggregated:
        res = search_disaggregated_pools(m, pc, job, dtypes.weight_dtype, dtypes.kv_dtype, goal.top,
                                         job.request_rate, allowance, moe)
        emit(pools_disagg_json(res, m, pc, job), output.json_mode, lambda: pools_disagg_view(out, res, m, pc, job))
        if not res.plans:
            stderr_line("error", f"no prefill / decode assignment to the pools of {pc.name} fits and meets the "
                        "SLOs" + (" and the request rate" if job.request_rate is not None else ""))
            raise typer.Exit(EXIT_NO_FIT)
        return
    pinned = checked_pins(ServePlan, {"tp": pins.tp, "pp": pins.pp, "ep": pins.ep})
    co = search_colocated_pools(m, pc, job, dtypes.weight_dtype, dtypes.kv_dtype, job.request_rate, allowance,
                                pinned, moe)
    emit(pools_serve_json(co, m, pc, job), output.json_mode, lambda: pools_serve_view(out, co, m, pc, job))
    if not co.shares:
        more = (f"; the pools sustain {co.capacity_requests_per_s:.3g} requests/s, asked {job.request_rate:g}"
                if co.capacity_requests_per_s > 0 and job.request_rate is not None else "")
        stderr_line("error", f"no serving plan for {m.name} on the pools of {pc.name} fits and meets the SLOs{more}")
        raise typer.Exit(EXIT_NO_FIT)

