"""`llmplan search --hardware A,B,C`: which system to rent, one row per system (its best plan), ranked."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console

from llmplan.cost.budget import RunBudget
from llmplan.intervals import training_interval
from llmplan.report.common import CAPPED, SCHEMA, ReportTable, capped_note, capped_text, gib
from llmplan.report.search import log_percent, plan_label, search_json
from llmplan.search.grid import Workload
from llmplan.search.systems import Comparison, SystemBest
from llmplan.search.ties import at_risk, memory_upper
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ClusterSpec
from llmplan.units import DAY

COLUMN = {"throughput": "tok/s", "time-to-train": "days", "gpu-hours": "GPU-h", "cost": "cost"}
"""The column each objective ranks by (it carries the 80% interval)."""


def compact(x: float | None) -> str:
    """1,234,567 -> '1.23M', 152,300 -> '152k', 12.34 -> '12.3'; None -> '-'."""
    if x is None:
        return "-"
    for size, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= size:
            v = x / size
            return f"{v:.3g}{unit}" if v < 100 else f"{v:.0f}{unit}"
    return f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"


def _values(r: SystemBest, b: RunBudget) -> dict[str, float | None]:
    """A run's figures under each column (tokens/s from the run: tokens / seconds)."""
    return {"tok/s": b.tokens / b.seconds, "days": b.effective_seconds / DAY, "GPU-h": b.effective_gpu_hours,
            "cost": b.cost_usd, "MWh": b.energy_kwh / 1000 if b.energy_kwh is not None else None}


def _cell(r: SystemBest, col: str, ranked: str) -> str:
    assert r.budget is not None and r.slow is not None and r.fast is not None  # rows that fit only
    dollars = "$" if col == "cost" and r.budget.cost_usd is not None else ""
    point = dollars + compact(_values(r, r.budget)[col])
    if col != ranked:
        return point
    ends = sorted(v for v in (_values(r, r.slow)[col], _values(r, r.fast)[col]) if v is not None)
    if len(ends) != 2:
        return point
    value = _values(r, r.budget)[col]
    mark = CAPPED if value is not None and not ends[0] <= value <= ends[-1] else ""  # capped at the best MFU
    return f"{point} ({compact(ends[0])}-{compact(ends[-1])}{mark})"


def systems_table(cmp: Comparison) -> ReportTable:
    """One row per system: its best plan's tokens/s and the run's days, GPU-hours, cost and GPU energy; the
    objective's column with its 80% interval; '=' marks systems tied with another."""
    ranked = COLUMN[cmp.objective]
    t = ReportTable(title=f"Systems by {cmp.objective}: {cmp.tokens / 1e12:g}T tokens, best plan of each")
    cols = ["tok/s", "days", "GPU-h", "cost", "MWh"]
    for col in ["#", "system", "GPUs", *cols]:
        t.add_column(col + (" (80%)" if col == ranked else ""), justify="left" if col == "system" else "right")
    for i, r in enumerate(cmp.systems, 1):
        if r.budget is None:
            t.add_row("-", r.name, "-", "no plan fits", *[""] * (len(cols) - 1))
            continue
        tie = "=" if i <= len(cmp.tied_with) and cmp.tied_with[i - 1] else ""
        cells = [_cell(r, c, ranked) for c in cols]
        t.add_row(f"{i}{tie}", r.name, f"{r.budget.gpus:,}", *cells)
        if any(c.endswith(f"{CAPPED})") for c in cells):
            t.caption = capped_note()
    return t


def systems_view(console: Console, cmp: Comparison, model: ModelSpec, shown: Mapping[str, tuple[Workload, ClusterSpec]],
                 budget_gpus: int | None) -> None:
    w = next(iter(shown.values()))[0]
    size = f"{budget_gpus:,} GPUs per system (whole nodes)" if budget_gpus else "--nodes per system"
    console.print(f"[bold]{model.name}[/]: which system to rent, {size}: global batch {w.global_batch:,} x "
                  f"{w.seq_len:,} tokens, {w.dtype}; objective {cmp.objective}")
    plans = sum(r.result.considered for r in cmp.systems)
    console.print(f"evaluated {plans:,} plans on {len(cmp.systems)} systems in {cmp.seconds:.2f} s")
    console.print(systems_table(cmp))
    for i, r in enumerate(cmp.systems, 1):
        if r.budget is None:
            hint = (f"(it would fit with {'; '.join(r.result.suggestions)})" if r.result.suggestions and not budget_gpus
                    else "(search it alone for the closest plan and what would make it fit)")
            console.print(f"{r.name}: no plan fits on {shown[r.name][1].num_gpus:,} GPUs {hint}", highlight=False)
            continue
        e = r.result.ranked[0]
        iv = training_interval(e)
        console.print(f"#{i} {r.name}: {plan_label(e.plan)} on {e.cluster.num_nodes:,} nodes, MFU "
                      f"{100 * float(e.throughput.mfu):.1f}% ({100 * iv['mfu'][0]:.0f}-{100 * iv['mfu'][1]:.0f}"
                      f"{capped_text(iv)}), "
                      f"goodput {100 * r.budget.seconds / r.budget.effective_seconds:.1f}%"
                      + (f"; memory at risk: {gib(float(e.memory.total) * memory_upper())} GiB at the interval's upper "
                         f"end, of {gib(float(e.memory.capacity))}" if at_risk(e) else ""), highlight=False)
    notes = list(cmp.tie_notes)
    ties = [f"#{i}" for i, w in enumerate(cmp.tied_with, 1) if w]
    if ties and cmp.resolution is not None:
        notes.append(f"=: tied ({', '.join(ties)}): {cmp.objective} within the model's resolution "
                     f"({log_percent(cmp.resolution):.1f}%) of each other, as plans are tied")
    notes.append("days, GPU-h, cost and MWh include the time failures, checkpoints and restarts take (goodput); "
                 "80% intervals from each system's published-run residuals (llmplan.intervals)")
    notes.append("MWh: GPU boards at their power limit (board TDP unless capped) for the wall-clock time, an upper "
                 "bound for the GPUs; hosts, network and cooling are not counted")
    notes.append("price per GPU-hour: " + "; ".join(price_text(r) for r in cmp.systems))
    for n in notes:
        console.print(n, highlight=False)


def price_text(r: SystemBest) -> str:
    if r.price is None:
        return f"{r.name} none cited (give --price {r.name}=USD)"
    where = "--price" if r.price.source == "--price" else "profile, source in --json"
    return f"{r.name} ${r.price.usd:g} ({where})"


def run_json(b: RunBudget | None) -> dict[str, Any] | None:
    if b is None:
        return None
    return {"tokens_per_s": b.tokens / b.seconds, "time_to_train_s": b.seconds,
            "effective_time_to_train_s": b.effective_seconds,
            "effective_time_to_train_days": b.effective_seconds / DAY,
            "gpu_hours": b.gpu_hours, "effective_gpu_hours": b.effective_gpu_hours, "cost_usd": b.cost_usd,
            "energy_kwh": b.energy_kwh}


def systems_json(cmp: Comparison, model: ModelSpec, shown: Mapping[str, tuple[Workload, ClusterSpec]],
                 budget_gpus: int | None) -> dict[str, Any]:
    """The comparison: "systems" ranked, each with its best plan's run priced (point and 80% interval ends) and
    its whole search (as `search --json` on that system); "plans" the best plan of each, ranked, as search's
    plans are."""
    rows: list[dict[str, Any]] = []
    for i, r in enumerate(cmp.systems, 1):
        w, cluster = shown[r.name]
        doc = search_json(r.result, w, cluster, model, cmp.tokens)
        e = r.result.ranked[0] if r.result.ranked else None
        used = e.cluster if e else cluster  # the domain share the search chose, where it did
        interval = {"level": training_interval(e)["level"], "slow": run_json(r.slow), "fast": run_json(r.fast)} \
            if e else None
        rows.append({
            "rank": i if r.budget is not None else None, "system": r.name, "nodes": used.num_nodes,
            "gpus": used.num_gpus, "fits": r.budget is not None,
            "memory_at_risk": at_risk(e) if e else None,
            "tied_with": cmp.tied_with[i - 1] if i <= len(cmp.tied_with) else [],
            "price_per_gpu_hour": r.price.usd if r.price else None,
            "price_source": r.price.source if r.price else None,
            "power_per_gpu_w": e.cluster.system.gpu.power_limit_w if e else None,
            "power_basis": "board power limit (TDP unless capped): an upper bound for the GPUs; hosts, network and "
                           "cooling not counted",
            "run": run_json(r.budget), "run_interval": interval,
            "best": doc["plans"][0] if doc["plans"] else None, "search": doc})
    fits = [row for row in rows if row["best"] is not None]
    return {"schema": SCHEMA, "mode": "train", "model": model.name, "hardware": list(shown),
            "budget_gpus": budget_gpus, "objective": cmp.objective, "train_tokens": cmp.tokens,
            "resolution": cmp.resolution, "search_s": cmp.seconds, "tie_notes": list(cmp.tie_notes),
            "considered": sum(r.result.considered for r in cmp.systems),
            "feasible": sum(r.result.feasible for r in cmp.systems),
            "pruned": _summed({p.rule: p.count for p in r.result.pruned} for r in cmp.systems),
            "systems": rows,
            "plans": [{**row["best"], "rank": row["rank"], "system": row["system"], "run": row["run"]} for row in fits]}


def _summed(counts: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return out
