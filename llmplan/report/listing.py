"""`llmplan models` and `llmplan hardware`."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from llmplan.cost.params import ParamCounts
from llmplan.report.common import ReportTable, SCHEMA
from llmplan.specs.hardware import GpuSpec, SystemSpec
from llmplan.specs.model import ModelSpec



def models_table(models: list[tuple[ModelSpec, ParamCounts]], with_type: bool = True) -> Table:
    """One row per model; without `with_type` (consoles under 100 columns) the architecture column is left out
    so that the rest fits 80 columns without wrapping a number (`--json` has it); one space between columns."""
    t = ReportTable(title="Built-in models", padding=(0, 0))
    cols = ("name", "type", "layers", "hidden", "heads/kv", "experts", "params", "active", "context")
    for col in cols if with_type else tuple(c for c in cols if c != "type"):
        # numbers never wrap (ReportTable's default for right-justified columns); `experts` ("256 top-8") folds
        # at its space, and the type column, where shown, wraps first
        t.add_column(col, justify="left" if col in ("name", "type") else "right",
                     no_wrap=col not in ("type", "experts"))
    for m, p in models:
        experts = f"{m.num_experts} top-{m.num_experts_per_tok}" if m.is_moe else "-"
        row = [m.name, m.model_type, str(m.num_hidden_layers), str(m.hidden_size),
               f"{m.num_attention_heads}/{m.kv_heads}", experts, _short_billions(p.total), _short_billions(p.active),
               f"{m.max_position_embeddings:,}"]
        t.add_row(*(row if with_type else row[:1] + row[2:]))
    return t


def _short_billions(x: float) -> str:
    b = x / 1e9
    return f"{b:,.0f}B" if b >= 100 else f"{b:.1f}B" if b >= 10 else f"{b:.2f}B"


def models_json(models: list[tuple[ModelSpec, ParamCounts]]) -> dict[str, Any]:
    return {"schema": SCHEMA, "models": [
        {"name": m.name, "model_type": m.model_type, "params": {"total": p.total, "active": p.active},
         "source": m.source} for m, p in models]}


def hardware_tables(gpus: list[GpuSpec], systems: list[SystemSpec]) -> list[Table]:
    g = ReportTable(title="GPUs")
    for col in ("name", "bf16 TFLOP/s", "fp8 TFLOP/s", "memory GiB", "HBM GB/s"):
        g.add_column(col, justify="left" if col == "name" else "right")
    for x in gpus:
        fp8 = x.tflops.get("fp8")
        g.add_row(x.name, f"{x.tflops.get('bf16', 0):g}", f"{fp8:g}" if fp8 else "-", f"{x.hbm_gib:g}",
                  f"{x.hbm_gb_per_s:g}")
    s = ReportTable(title="Systems (--hardware)", collapse_padding=True)
    for col in ("name", "GPU", "GPUs/node", "scale-up", "GB/s per GPU", "scale-out"):
        # the name (what --hardware takes) never wraps; the fabric descriptions fold first
        s.add_column(col, justify="left" if col in ("name", "GPU", "scale-up", "scale-out") else "right",
                     no_wrap=col in ("name", "GPU"))
    for y in systems:
        dom = f" ({y.domain_gpus}-GPU domain)" if y.domain_gpus != y.gpus_per_node else ""
        out = f"{y.nics_per_node} x {y.nic_gbit_per_s:g} Gb/s {y.scaleout_fabric}" if y.nics_per_node else "-"
        s.add_row(y.name, y.gpu.name, str(y.gpus_per_node), y.intra_node_fabric + dom,
                  f"{y.intra_node_gb_per_s:g}", out)
    return [g, s]


def hardware_json(gpus: list[GpuSpec], systems: list[SystemSpec]) -> dict[str, Any]:
    return {"schema": SCHEMA, "gpus": [g.model_dump() for g in gpus],
            "systems": [{**s.model_dump(exclude={"gpu"}), "gpu": s.gpu.name} for s in systems]}
