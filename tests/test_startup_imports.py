"""Start-up cost of the command line, checked by structure rather than by timing: which modules a fresh
process has loaded after `import llmplan.cli` and after a cheap command. The heavy ones (networkx, the cost
and search engines, exporters, bench, the HTML report, serving) load only inside the commands that use them;
the commands that load them late still work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Run in a fresh interpreter: the command (or none), then the names in sys.modules as JSON into the file argv[2].
_PROBE = """
import json, sys
argv = json.loads(sys.argv[1])
import llmplan.cli
code = 0
if argv:
    try:
        llmplan.cli.main(argv)
    except SystemExit as e:
        code = e.code
with open(sys.argv[2], "w") as f:
    json.dump({"code": code, "modules": sorted(sys.modules)}, f)
"""

LAZY = ("networkx", "llmplan.cost", "llmplan.search", "llmplan.export", "llmplan.bench", "llmplan.report.html",
        "llmplan.serving", "llmplan.estimate", "llmplan.advice", "llmplan.planfile", "llmplan.calibrate",
        "llmplan.intervals", "rich.progress")
"""Modules (and packages, with everything under them) that `import llmplan.cli` must not load."""


def _probe(*args: str) -> tuple[int, set[str], str]:
    """(exit code, loaded module names, stdout) of one fresh process running `llmplan ARGS` (none: the import
    alone)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80"}
    with tempfile.TemporaryDirectory() as folder:
        where = Path(folder) / "modules.json"
        proc = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(list(args)), str(where)], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=300)
        assert where.exists(), proc.stderr
        report = json.loads(where.read_text())
    return report["code"], set(report["modules"]), proc.stdout


def _loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


def test_import_cli_loads_no_heavy_module():
    code, modules, _ = _probe()
    assert code == 0
    assert "llmplan.cli.estimate" in modules  # the commands are registered
    assert _loaded(modules, LAZY) == []


def test_help_lists_the_commands_without_heavy_modules():
    code, modules, out = _probe("--help")
    assert code == 0
    assert "estimate" in out and "search" in out and "report" in out
    assert _loaded(modules, LAZY) == []


LISTING_LAZY = ("networkx", "llmplan.estimate", "llmplan.cost.step", "llmplan.cost.memory", "llmplan.search",
                "llmplan.serving", "llmplan.export", "rich.progress")
"""What `models` and `hardware` must not load (the listing's tables read cost.params' counts, no more)."""


def test_models_loads_parameter_counts_not_the_step_time_engine():
    code, modules, out = _probe("models", "--json")
    assert code == 0
    names = [m["name"] for m in json.loads(out)["models"]]
    assert "llama-3.1-8b" in names and names == sorted(names)
    assert _loaded(modules, LISTING_LAZY) == []


def test_hardware_loads_no_engine():
    code, modules, out = _probe("hardware", "--json")
    assert code == 0
    assert json.loads(out)["gpus"]
    assert _loaded(modules, LISTING_LAZY) == []


@pytest.mark.parametrize("mode", ["train", "infer"])
def test_unknown_model_is_refused_before_the_cost_modules_load(mode):
    code, modules, _ = _probe("estimate", "--model", "nope", "--hardware", "dgx-h100", "--mode", mode)
    assert code == 2
    assert _loaded(modules, ("networkx", "llmplan.cost", "llmplan.estimate", "llmplan.serving")) == []


@pytest.mark.parametrize("args", [
    ("--tp", "2", "--json"),
    ("--pp", "2", "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
     "--json"),  # cli.inputs' lazy accounted_split
    ("--mode", "infer", "--tp", "1", "--json"),  # lazy default_graph_sizes
    ("--mode", "infer", "--tp", "1", "--input-len-dist", "sharegpt", "--output-len-dist",  # lazy cost.lengths
     "lognormal:mean=300,sigma=0.8", "--json"),
])
def test_commands_that_load_late_still_work(args):
    code, modules, out = _probe("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1",
                                *args)
    assert code == 0, out
    doc = json.loads(out)
    assert doc["schema"] == 1
    assert "llmplan.cost.step" in modules or "llmplan.serving" in modules
