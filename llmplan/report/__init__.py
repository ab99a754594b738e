"""The report layer: every table and JSON document llmplan prints, one module per command family. Nothing
else formats output."""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llmplan.report.bench import anchor_json, anchor_view, bench_json, bench_tables
    from llmplan.report.ci import check_github, check_json, check_junit, check_view
    from llmplan.report.common import SCHEMA, dump_json, fabric_names, gib, message_text
    from llmplan.report.files import collective_json, collective_view, export_view
    from llmplan.report.listing import hardware_json, hardware_tables, models_json, models_table
    from llmplan.report.search import plan_label, search_json, search_points, search_view, target_json, target_lines
    from llmplan.report.systems import systems_json, systems_view
    from llmplan.report.serving import (disagg_json, disagg_view, serve_json, serve_search_json, serve_search_view,
                                        serve_view)
    from llmplan.report.training import estimate_json, estimate_view

_HOME = {
    **dict.fromkeys(('anchor_json', 'anchor_view', 'bench_json', 'bench_tables'), "bench"),
    **dict.fromkeys(('check_github', 'check_json', 'check_junit', 'check_view'), "ci"),
    **dict.fromkeys(('SCHEMA', 'dump_json', 'fabric_names', 'gib', 'message_text'), "common"),
    **dict.fromkeys(('collective_json', 'collective_view', 'export_view'), "files"),
    **dict.fromkeys(('hardware_json', 'hardware_tables', 'models_json', 'models_table'), "listing"),
    **dict.fromkeys(('plan_label', 'search_json', 'search_points', 'search_view', 'target_json', 'target_lines'),
                    "search"),
    **dict.fromkeys(('systems_json', 'systems_view'), "systems"),
    **dict.fromkeys(('disagg_json', 'disagg_view', 'serve_json', 'serve_search_json', 'serve_search_view',
                     'serve_view'), "serving"),
    **dict.fromkeys(('estimate_json', 'estimate_view'), "training"),
}
"""Where each name lives: a submodule is imported on first use (PEP 562), so that a command imports only the
reports it prints (`llmplan --help` none of them)."""


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"llmplan.report.{_HOME[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))


__all__ = [
    "SCHEMA", "anchor_json", "anchor_view", "bench_json", "bench_tables", "check_github", "check_json", "check_junit",
    "check_view",
    "collective_json", "collective_view", "dump_json", "estimate_json", "estimate_view", "export_view",
    "fabric_names", "gib", "hardware_json", "hardware_tables", "message_text", "models_json", "models_table",
    "plan_label", "search_json", "search_points",
    "search_view", "disagg_json", "disagg_view", "serve_json", "serve_search_json", "serve_search_view", "serve_view",
    "systems_json", "systems_view", "target_json", "target_lines",
]
