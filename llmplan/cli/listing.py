"""`llmplan models` and `llmplan hardware`."""

from __future__ import annotations

from llmplan import report
from llmplan.cli import options as opt
from llmplan.cli.app import app, emit, out, print_each


@app.command()
def models(json_mode: bool = opt.JSON) -> None:
    """List the built-in models."""
    from llmplan.cost.params import param_counts  # not llmplan.estimate: the step-time modules are not needed
    from llmplan.specs.registry import builtin_models
    rows = [(m, param_counts(m)) for m in sorted(builtin_models().values(), key=lambda m: m.name)]
    emit(report.models_json(rows), json_mode, lambda: out.print(report.models_table(rows, with_type=out.width >= 100)))


@app.command()
def hardware(json_mode: bool = opt.JSON) -> None:
    """List the built-in GPUs and systems."""
    from llmplan.specs.registry import builtin_gpus, builtin_systems
    gpus = sorted(builtin_gpus().values(), key=lambda g: g.name)
    systems = sorted(builtin_systems().values(), key=lambda s: s.name)
    emit(report.hardware_json(gpus, systems), json_mode,
         lambda: print_each(report.hardware_tables(gpus, systems)))
