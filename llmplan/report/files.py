"""`llmplan export` and `llmplan collective`."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from llmplan.report.common import SCHEMA, human_bytes
from llmplan.specs.hardware import SystemSpec
from llmplan.topology.collectives import CollectiveTime

def export_view(console: Console, paths: list, skipped: dict[str, str]) -> None:
    for p in paths:
        console.print(f"wrote {p}")
    for target, why in skipped.items():
        console.print(f"[yellow]skipped {target}[/]: {why}")



def collective_json(ct: CollectiveTime, group: str) -> dict[str, Any]:
    return {"schema": SCHEMA, "op": ct.op, "size_bytes": ct.size, "gpus": ct.ranks, "group": group,
            "algorithm": ct.algorithm, "time_s": ct.seconds, "algbw_gbps": ct.algbw / 1e9,
            "busbw_gbps": ct.busbw / 1e9}


def collective_view(console: Console, ct: CollectiveTime, group: str, system: SystemSpec) -> None:
    console.print(f"{ct.op} of {human_bytes(ct.size)} over {group} on {system.name} "
                  f"({'calibrated: ' + system.calibrated if system.calibrated else 'default efficiencies'})")
    console.print(f"algorithm {ct.algorithm}: time {ct.seconds * 1e6:,.1f} us, algbw {ct.algbw / 1e9:,.1f} GB/s, "
                  f"busbw {ct.busbw / 1e9:,.1f} GB/s (compare with nccl-tests' busbw column)")
