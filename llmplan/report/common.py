"""What every report shares: the JSON schema number, number formats, fabric names."""

from __future__ import annotations

import json
import math
import textwrap
from typing import Any

from rich import box
from rich.table import Table

from llmplan.specs.hardware import SystemSpec
from llmplan.units import GIB

SCHEMA = 1
PLAN_KEYS = ("tp", "pp", "dp", "cp", "ep", "vpp", "sp", "zero", "recompute", "micro_batch", "global_batch",
             "seq_len", "dtype")


def gib(x: float) -> str:
    return f"{x / GIB:,.2f}"


def billions(x: float) -> str:
    return f"{x / 1e9:,.2f}B"


def dump_json(doc: dict[str, Any]) -> str:
    """The JSON document; a number that is not finite becomes null, so the output is always valid JSON."""
    return json.dumps(_finite(doc), indent=2, sort_keys=False, allow_nan=False)


def _finite(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    if hasattr(x, "item") and getattr(x, "shape", None) == ():  # numpy scalars
        return _finite(x.item())
    return x



def flex_backend_shown(d: dict[str, Any]) -> dict[str, Any]:
    """A plan's or switch setting's fields with moe_flex_backend null where moe_dispatcher is not deepep (the
    flex dispatcher): Megatron-Core reads moe_flex_dispatcher_backend only in its flex dispatcher
    (MoEFlexTokenDispatcher, NVIDIA/Megatron-LM megatron/core/transformer/moe/token_dispatcher.py at d98e8a64dd),
    so on an alltoall plan the key means nothing. The key stays (JSON contract: keys are not removed)."""
    if "moe_flex_backend" in d and d.get("moe_dispatcher", "deepep") != "deepep":
        return {**d, "moe_flex_backend": None}
    return d


def counted(n: int, one: str, many: str) -> str:
    """`n` and the noun in the number it takes: 1 micro-batch, 4 micro-batches."""
    return f"{n:,} {one if n == 1 else many}"


def human_bytes(x: float) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if x >= size:
            return f"{x / size:,.1f} {unit}"
    return f"{x:,.0f} B"


def power_text(cluster: Any) -> str:
    """", at 500 W" where the GPUs run capped below their profile's power limit (--power-limit or the system's
    fleet default), else nothing: the reader sees which clock the numbers assume."""
    gpu = cluster.system.gpu
    return f", at {gpu.power_limit_w:g} W" if gpu.capped_from_w is not None else ""


def fabric_names(system: SystemSpec) -> tuple[str, str]:
    up = {"nvswitch": "NVLink", "nvlink-mesh": "NVLink", "infinity-fabric": "Infinity Fabric",
          "pcie": "PCIe"}[system.intra_node_fabric]
    down = {"infiniband": "IB", "roce": "RoCE", "efa": "EFA", "omnipath": "OPA",
            "none": "network"}[system.scaleout_fabric]
    return up, down


CAPPED = "!"
"""The mark on an interval that stops at the best published MFU below its point (the point lies outside)."""


def capped_text(iv: dict[str, Any]) -> str:
    """', capped at the best published 65.3% MFU' for an interval whose point lies above its ceiling, else ''
    (the bands then hold their points)."""
    if not iv.get("point_above_ceiling"):
        return ""
    return f", capped at the best published {100 * iv['ceiling_mfu']:.1f}% MFU"


TERMINAL_WIDTH = 80
"""The widest a message line is drawn on a terminal (the brief's 80 columns)."""


def message_text(kind: str, message: str, columns: int | None = None) -> str:
    """`kind: message` and a newline: one line when `columns` is None (piped: scripts and logs read one line),
    else folded at spaces within min(columns, 80) columns, the lines after the first indented by two, so that a
    long error reads whole on a terminal rather than broken mid-word by it. Words are never cut."""
    text = f"{kind}: {message}"
    if columns is None:
        return text + "\n"
    rows = textwrap.wrap(text, max(20, min(columns, TERMINAL_WIDTH)), subsequent_indent="  ",
                         break_long_words=False, break_on_hyphens=False)
    return "\n".join(rows or [text]) + "\n"


def capped_note(what: str = "interval") -> str:
    return (f"{CAPPED}: the {what} stops at the best published MFU of the GPU and number format, which the "
            "predicted point exceeds (read the point as an upper bound)")


class ReportTable(Table):
    """A table that fits the console: light borders, numbers never wrapped or cut (text columns wrap first),
    long text folded rather than ellipsised."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("box", box.SIMPLE_HEAD)
        kwargs.setdefault("pad_edge", False)
        super().__init__(*args, **kwargs)

    # Rich's keyword-typed signature is passed through *args/**kwargs unchanged; the headers here are text.
    def add_column(self, header: str = "", *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        if kwargs.get("justify") == "right":
            kwargs.setdefault("no_wrap", True)
        kwargs.setdefault("overflow", "fold")
        super().add_column(header, *args, **kwargs)

    def _calculate_column_widths(self, console: Any, options: Any) -> list[int]:
        """Rich's widths, then a column narrower than its longest word (which rich would fold mid-word:
        "infinity-fa/bric", a lone ")") takes the columns' slack above their own longest words."""
        widths: list[int] = super()._calculate_column_widths(console, options)
        words = [self._measure_column(console, options, c).minimum for c in self.columns]
        slack = [w - m if not c.no_wrap and c.width is None else 0
                 for w, m, c in zip(widths, words, self.columns)]
        for i, need in enumerate(m - w for w, m in zip(widths, words)):
            if need <= 0 or need > sum(x for j, x in enumerate(slack) if j != i):
                continue
            for j in sorted(range(len(widths)), key=lambda j: -slack[j]):
                take = min(need, slack[j]) if j != i else 0
                widths[j] -= take
                slack[j] -= take
                widths[i] += take
                need -= take
            slack[i] = 0
        return widths
