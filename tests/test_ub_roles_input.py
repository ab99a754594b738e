"""A saved plan's per-role userbuffer SMs (ParallelPlan.tp_overlap_sms / tp_overlap_margin_sms, four numbers in
cost.comm.RoleSms order, each 0 - 1024) are user input: a wrong count or a negative number is refused in one
line with exit 2, never reaching cost.comm's role tuples. The real command runs in a child process for one case
(its real exit status, and no traceback from the interpreter); the other cases run the same entry point
in-process (the `cli` fixture: exit code and stderr; an uncaught exception would fail the test), which spares
each about 1 s of CPU of imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_cli
from refusal import one_line

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
ENV.pop("LLMPLAN_DEBUG", None)


def llmplan(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llmplan", *map(str, args)], env=ENV, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("plan")
    r = run_cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--save", folder / "p.json")
    assert r.code == 0, r.err  # the plan is the tests' input, saved in-process
    return json.loads((folder / "p.json").read_text())


@pytest.mark.parametrize("field", ["tp_overlap_sms", "tp_overlap_margin_sms"])
@pytest.mark.parametrize("value, says", [([1, -3, 16, 16], "greater than or equal to 0 (got -3)"),
                                         # a wrong count: how many the field takes and what they are, not
                                         # pydantic's "field 'tp_overlap_sms.3': Field required"
                                         ([1, 16, 16], "takes 4 numbers, one per TP-overlap role"),
                                         ([1, 16, 16, 16, 16], "takes 4 numbers, one per TP-overlap role")])
def test_bad_role_sms_in_a_plan_file_is_one_line_and_exit_2(tmp_path, saved, cli, field, value, says):
    doc = {**saved, "plan": {**saved["plan"], field: value}}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    args = ("export", path, "--to", "megatron", "--out", tmp_path / "out")
    if field == "tp_overlap_sms" and value == [1, -3, 16, 16]:  # the child process
        p = llmplan(*args)
        code, err = p.returncode, p.stderr
    else:
        r = cli(*args)
        code, err = r.code, r.err
    line = one_line(err)
    assert code == 2, err
    assert f"field '{field}" in line and says in line and "Field required" not in line
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()
