"""The report layer: every table and JSON document llmplan prints, one module per command family. Nothing
else formats output."""

from llmplan.report.bench import anchor_json, anchor_view, bench_json, bench_tables
from llmplan.report.ci import check_github, check_json, check_junit, check_view
from llmplan.report.common import SCHEMA, dump_json, fabric_names, gib, message_text
from llmplan.report.files import collective_json, collective_view, export_view
from llmplan.report.listing import hardware_json, hardware_tables, models_json, models_table
from llmplan.report.search import plan_label, search_json, search_points, search_view, target_json, target_lines
from llmplan.report.systems import systems_json, systems_view
from llmplan.report.serving import disagg_json, disagg_view, serve_json, serve_search_json, serve_search_view, serve_view
from llmplan.report.training import estimate_json, estimate_view

__all__ = [
    "SCHEMA", "anchor_json", "anchor_view", "bench_json", "bench_tables", "check_github", "check_json", "check_junit", "check_view",
    "collective_json", "collective_view", "dump_json", "estimate_json", "estimate_view", "export_view",
    "fabric_names", "gib", "hardware_json", "hardware_tables", "message_text", "models_json", "models_table", "plan_label", "search_json", "search_points",
    "search_view", "disagg_json", "disagg_view", "serve_json", "serve_search_json", "serve_search_view", "serve_view",
    "systems_json", "systems_view", "target_json", "target_lines",
]
