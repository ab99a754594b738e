"""`llmplan bench`: measured vs predicted."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from llmplan.report.common import ReportTable, SCHEMA, human_bytes
from llmplan.units import GIB



def _fmt_value(v: float, unit: str) -> str:
    if unit == "B":
        return human_bytes(v)
    if unit == "s":
        return f"{v * 1e3:,.3f} ms" if v < 1 else f"{v:,.3f} s"
    return f"{v:,.4g} {unit}"


def bench_tables(rows: list, cpu: bool = False) -> list[Table]:
    """One table per component; on CPU (gloo) GEMM and collective times are not comparable with the GPU
    profile, so their error reads "n/a on CPU" instead of a percentage."""
    tables: list[Table] = []
    for component in dict.fromkeys(r.component for r in rows):
        t = ReportTable(title=component)
        for col in ("item", "predicted", "measured", "error", "verdict", "note"):
            t.add_column(col, justify="right" if col in ("predicted", "measured", "error") else "left")
        for r in (x for x in rows if x.component == component):
            style = {"ok": "green", "MISMATCH": "bold red"}.get(r.verdict, "dim")
            cpu_time = r.unit == "s" and cpu and r.component in ("gemm", "collective", "attention")
            error = "n/a on CPU" if cpu_time else (f"{100 * r.error:+.2f}%" if r.predicted else "-")
            t.add_row(r.item, _fmt_value(r.predicted, r.unit) if r.predicted else "-", _fmt_value(r.measured, r.unit),
                      error, f"[{style}]{r.verdict}[/]", r.note)
        tables.append(t)
    return tables


def bench_json(cfg, run, rows: list) -> dict[str, Any]:
    return {
        "schema": SCHEMA, "model": cfg.model.name, "hardware": cfg.cluster.system.name, "nproc": cfg.nproc,
        "backend": cfg.backend, "seconds": run.seconds, "startup_s": run.startup_s, "timed_out": run.timed_out,
        "failures": [{"rank": f.rank, "phase": f.phase, "error": f.error} for f in run.failures],
        "device": run.ranks[0]["device_name"] if run.ranks else None,
        "host": run.ranks[0]["host"] if run.ranks else None,
        "comparisons": [{"component": r.component, "item": r.item, "predicted": r.predicted, "measured": r.measured,
                         "unit": r.unit, "error": r.error, "verdict": r.verdict, "note": r.note} for r in rows],
        "raw": run.ranks,
    }


def anchor_json(anchor: Any, output: str, base: str | None) -> dict[str, Any]:
    """`calibrate --plan` as JSON: what moved and the anchor reproduced."""
    mem = anchor.memory
    return {"schema": SCHEMA, "profile": output, "base": base,
            "measured_step_s": anchor.measured_s, "predicted_step_s": anchor.predicted_s,
            "calibrated_step_s": anchor.calibrated_s,
            "calibrated_error": anchor.calibrated_s / anchor.measured_s - 1,
            "changes": [{"key": k, "before": b, "after": a, "ratio": a / b if b else None}
                        for k, b, a in anchor.changes],
            **({"attribution": anchor.shares} if anchor.shares else {}),
            **({"memory": {"predicted_bytes": mem[0], "measured_bytes": mem[1]}} if mem else {})}


def anchor_view(console: Console, anchor: Any, output: str) -> None:
    console.print(f"measured {anchor.measured_s:,.4g} s per step; llmplan predicted {anchor.predicted_s:,.4g} s "
                  f"({100 * (anchor.predicted_s / anchor.measured_s - 1):+.1f}%); the calibrated profile gives "
                  f"{anchor.calibrated_s:,.4g} s ({100 * (anchor.calibrated_s / anchor.measured_s - 1):+.2f}%)")
    if anchor.shares:
        sh = anchor.shares
        console.print(f"the predicted step is {100 * sh['clock']:.0f}% compute (the clock), "
                      f"{100 * sh['communication']:.0f}% exposed communication, {100 * sh['overhead']:.0f}% "
                      "overhead; the gap moves each constant by its share")
    t = ReportTable(title="Constants the run moved")
    for col in ("constant", "before", "after", "change"):
        t.add_column(col, justify="left" if col == "constant" else "right")
    for k, b, a in anchor.changes:
        change = f"{100 * (a / b - 1):+.1f}%" if b else f"{a - b:+.3g}"
        t.add_row(k, f"{b:.4g}", f"{a:.4g}", change)
    console.print(t)
    if anchor.memory:
        p, m = anchor.memory
        console.print(f"memory: predicted {p / GIB:,.2f} GiB, measured {m / GIB:,.2f} GiB per GPU; "
                      "gpu.hbm_reserve_gib holds the difference (usable memory is HBM less it)")
    console.print(f"wrote {output}: search or estimate with --hardware {output} to rank plans against your stack")
