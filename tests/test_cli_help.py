"""`--help` of every command fits 80 columns and names every option whole (issue 35: rich's option tables cut
`--account-for-embedding-in-pipeline-split` to `--account-for-…` at 80 columns), and the option groups
estimate and search take are typed records whose fields are exactly their flags."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Annotated

import pytest
import typer.main
from pydantic import ValidationError

from llmplan.cli import app
from llmplan.cli import options as opt
from llmplan.specs import options as groups


def _commands(cmd, path: list[str]):
    if hasattr(cmd, "commands"):
        for name, sub in cmd.commands.items():
            yield from _commands(sub, [*path, name])
    else:
        yield path, cmd


COMMANDS = list(_commands(typer.main.get_command(app), []))


def test_every_command_is_listed():
    assert {" ".join(p) for p, _ in COMMANDS} >= {"estimate", "search", "export", "check", "bench", "report"}


HELP_RUN = """
import sys
from llmplan.cli import main
for i, path in enumerate(eval(sys.argv[1])):
    try:
        main([*path, "--help"])
        code = 0
    except SystemExit as e:
        code = e.code
    sys.stdout.flush()
    print(f"\\n@@help {i} exit {code}@@", flush=True)
"""
"""Every command's --help in one fresh interpreter (the console entry point, llmplan.cli.main, as `python -m
llmplan` calls it), each help followed by a line of its index and exit code: one
start-up (about 0.5 s of CPU: a command imports its libraries when it runs) for all of them, not one a command.
test_search_help_lists_its_options_in_sections checks that `python -m llmplan search --help` prints the same text."""


@pytest.fixture(scope="module")
def helps() -> dict[str, tuple[int, str]]:
    """Each command's (exit code, --help text) at 80 columns, no colour, a dumb terminal."""
    env = {**os.environ, "COLUMNS": "80", "NO_COLOR": "1", "TERM": "dumb"}
    run = subprocess.run([sys.executable, "-c", HELP_RUN, repr([p for p, _ in COMMANDS])], check=False,
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    parts = re.split(r"\n@@help (\d+) exit (\S+)@@\n", run.stdout)
    assert len(parts) == 3 * len(COMMANDS) + 1 and parts[-1] == "", run.stdout[-500:]
    return {" ".join(COMMANDS[int(i)][0]): (0 if code == "None" else int(code), text)
            for text, i, code in zip(parts[0::3], parts[1::3], parts[2::3])}


@pytest.mark.parametrize("path,cmd", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_help_fits_80_columns_with_every_option_whole(helps, path, cmd):
    code, text = helps[" ".join(path)]
    assert code == 0, text[-500:]
    assert f"Usage: llmplan {' '.join(path)} " in text  # this command's help, not another's
    wide = [line for line in text.splitlines() if len(line) > 80]
    assert not wide, f"{' '.join(path)} --help has lines over 80 columns: {wide[:3]}"
    assert "…" not in text
    names = [name for p in cmd.params if not getattr(p, "hidden", False)
             for name in (*p.opts, *getattr(p, "secondary_opts", ())) if name.startswith("-")]
    assert names, path
    missing = [n for n in names if not re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", text)]
    assert not missing, f"{' '.join(path)} --help does not show {missing} whole"


def test_search_help_lists_its_options_in_sections(helps):
    """search's help lists its 75 options in sections; it was 386 lines of rich tables at 80 columns. The real
    `python -m llmplan search --help` prints what the one-interpreter run of every help (helps) printed."""
    env = {**os.environ, "COLUMNS": "80", "NO_COLOR": "1", "TERM": "dumb"}
    text = subprocess.run([sys.executable, "-m", "llmplan", "search", "--help"], check=False, capture_output=True,
                          text=True, env=env, timeout=120).stdout
    assert text == helps["search"][1]
    for section in ("Cluster:", "Search space:", "Training switches:", "Serving (--mode infer):", "Output:"):
        assert section in text.splitlines(), section


@pytest.mark.parametrize("model,flags", [
    (groups.ClusterOptions, opt.CLUSTER), (groups.MemoryOptions, opt.MEMORY),
    (groups.CheckpointOptions, opt.CHECKPOINTS), (groups.OutputOptions, opt.OUTPUT),
    (groups.SwitchOptions, opt.SWITCHES), (groups.SwitchOptions, opt.SEARCH_SWITCHES),
    (groups.PipelineSplitOptions, opt.PIPELINE_SPLIT), (groups.PlanOptions, opt.PLAN),
    (groups.SearchPins, opt.SEARCH_PINS), (groups.SearchGoal, opt.SEARCH_GOAL),
    (groups.ServingOptions, opt.SERVING)])
def test_each_group_field_has_one_flag_and_a_docstring(model, flags):
    assert set(model.model_fields) == set(flags.options)
    assert all(f.description for f in model.model_fields.values()), model.__name__
    assert model.model_config.get("frozen") and model.model_config.get("extra") == "forbid"


def test_a_group_is_frozen_and_refuses_unknown_fields():
    m = groups.MemoryOptions(overhead_gib=2.0, fragmentation=0.1)
    with pytest.raises(ValidationError):
        m.overhead_gib = 3.0  # type: ignore[misc]
    with pytest.raises(ValidationError):
        groups.MemoryOptions(overhead_gib=2.0, fragmentation=0.1, fixed_gib=1.0)  # type: ignore[call-arg]


PARTIAL = opt.Flags("Memory", {"overhead_gib": opt.OVERHEAD_GIB})


def test_grouped_refuses_a_group_whose_flags_miss_a_field():
    def command(*, memory: Annotated[groups.MemoryOptions, PARTIAL]) -> None: ...

    with pytest.raises(TypeError, match="fragmentation"):
        opt.grouped(command)


def test_tp_reaches_parallel_plan_through_the_typed_group(capsys):
    """estimate --tp 4 --json: the plan's tp is 4 (PlanOptions.tp -> ParallelPlan.tp)."""
    from llmplan.cli import main

    with pytest.raises(SystemExit) as e:
        main(["estimate", "-m", "llama-3.1-8b", "--hardware", "dgx-h100", "--tp", "4", "--json"])
    assert e.value.code == 0
    import json
    assert json.loads(capsys.readouterr().out)["plan"]["tp"] == 4
