"""`llmplan search --hardware A,B,C [--budget-gpus N] [--price SYSTEM=USD,...]`: which system to rent, the
command-line side (the loop is search.systems, the output report.systems)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import typer

from llmplan import report
from llmplan.cli.app import emit, out, stderr_line
from llmplan.errors import EXIT_NO_FIT, LlmplanError, not_one_of
from llmplan.search.grid import Workload
from llmplan.search.systems import COMPARE_OBJECTIVES, PER_SYSTEM_OBJECTIVE, budget_nodes, compare, prices_for
from llmplan.specs.options import ClusterOptions, OutputOptions, SearchGoal
from llmplan.specs.plan import ClusterSpec
from llmplan.specs.registry import resolve_system
from llmplan.units import parse_count


def system_names(hardware: str) -> list[str]:
    """--hardware A,B,C as names, each once."""
    names = [h.strip() for h in hardware.split(",")]
    if any(not n for n in names):
        raise LlmplanError(f"--hardware {hardware!r}: an empty system name; list systems as A,B,C (e.g. "
                           "dgx-h100,dgx-b200,gb200-nvl72)")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise LlmplanError(f"--hardware lists {', '.join(twice)} more than once; name each system once")
    return names


def wants_comparison(c: ClusterOptions, goal: SearchGoal) -> bool:
    """Whether `search` compares systems: several in --hardware, or a budget, a price or the cost objective."""
    return "," in c.hardware or goal.budget_gpus is not None or goal.price is not None or goal.objective == "cost"


def refuse_serving_comparison(c: ClusterOptions) -> None:
    """Several systems in --hardware compare training runs; serving searches one system at a time."""
    if "," in c.hardware:
        raise LlmplanError(f"--hardware {c.hardware} with --mode infer: comparing systems ranks training runs; "
                           "search serving on one system at a time")


def parse_prices(text: str | None, names: list[str]) -> dict[str, float]:
    """--price SYSTEM=USD,...: a non-negative price per GPU-hour for systems of --hardware."""
    prices: dict[str, float] = {}
    for item in (text or "").split(","):
        name, eq, usd = (part.strip() for part in item.partition("="))
        if not item.strip():
            continue
        if not eq or not name:
            raise LlmplanError(f"--price {item.strip()!r}: give SYSTEM=USD per GPU-hour, e.g. --price "
                               f"{names[0]}=3.99")
        if name not in names:
            raise LlmplanError(f"--price {name}: not a system of --hardware ({', '.join(names)}); price only the "
                               "systems searched")
        try:
            value = float(usd)
        except ValueError:
            raise LlmplanError(f"--price {name}={usd}: not a number; give US dollars per GPU-hour, e.g. "
                               f"{name}=3.99") from None
        if not (math.isfinite(value) and value >= 0):
            raise LlmplanError(f"--price {name}={usd}: a price per GPU-hour is a finite number of US dollars, 0 or "
                               "more")
        if name in prices:
            raise LlmplanError(f"--price names {name} twice; give each system one price")
        prices[name] = value
    return prices


def search_systems(c: ClusterOptions, goal: SearchGoal, output: OutputOptions,
                   search_one: Callable[[ClusterOptions, SearchGoal], Any]) -> None:
    """Rank the systems of --hardware by their best plans (search.systems.compare); search_one runs one
    system's search as `search` does (cli.search.train_search) and returns its TrainSearch."""
    names = system_names(c.hardware)
    if goal.objective not in COMPARE_OBJECTIVES:
        raise LlmplanError(not_one_of("--objective", goal.objective, COMPARE_OBJECTIVES,
                                      "an objective for comparing systems"))
    for flag, given in (("--save", output.save is not None), ("--explain", goal.explain_opt),
                        ("--wide", goal.wide)):
        if given:
            raise LlmplanError(f"{flag} shows one system's search: compare the systems first, then search the "
                               "chosen one alone (--hardware NAME --nodes N)")
    if len(names) > 1:
        for flag, value in (("--gpus-per-node", c.gpus_per_node), ("--domain-gpus", c.domain_gpus)):
            if value is not None:
                raise LlmplanError(f"{flag} {value} is one system's node shape; with several systems give "
                                   "--budget-gpus, or search each system alone")
    if goal.budget_gpus is not None and c.nodes != 1:
        raise LlmplanError(f"--budget-gpus {goal.budget_gpus} and --nodes {c.nodes} each size the cluster; give one")
    systems = [resolve_system(n) for n in names]
    prices = prices_for(names, systems, parse_prices(goal.price, names), goal.objective)
    nodes = [c.nodes] * len(names)
    if goal.budget_gpus is not None:
        nodes = [budget_nodes(s, goal.budget_gpus) for s in systems]
        small = [f"{n} ({s.gpus_per_node})" for n, s, k in zip(names, systems, nodes, strict=True) if k == 0]
        if small:
            raise LlmplanError(f"--budget-gpus {goal.budget_gpus} is less than one node of {', '.join(small)} "
                               f"(GPUs per node); give at least {max(s.gpus_per_node for s in systems)}")
    tokens = parse_count(goal.train_tokens, "--train-tokens")
    per_system = goal.model_copy(update={"objective": PER_SYSTEM_OBJECTIVE.get(goal.objective, goal.objective)})
    shown: dict[str, tuple[Workload, ClusterSpec]] = {}
    model: list[Any] = []

    def one(i: int, name: str) -> Any:
        t = search_one(c.model_copy(update={"hardware": name, "nodes": nodes[i]}), per_system)
        shown[name] = (t.workload, t.cluster)
        model[:] = [t.model]
        return t.result

    order = {n: i for i, n in enumerate(names)}
    cmp = compare(names, prices, lambda n: one(order[n], n), goal.objective, tokens)
    emit(report.systems_json(cmp, model[0], shown, goal.budget_gpus), output.json_mode,
         lambda: report.systems_view(out, cmp, model[0], shown, goal.budget_gpus))
    if all(r.budget is None for r in cmp.systems):
        stderr_line("error", f"no plan fits {model[0].name} on any of {', '.join(names)}")
        raise typer.Exit(EXIT_NO_FIT)
