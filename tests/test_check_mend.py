"""`llmplan check` on a saved plan that now breaks a rule ends its finding with how to mend the file, as export
and report do (planfile.mend_note): the rule names a command-line flag, and the file holds plan keys."""

from __future__ import annotations

import json

from test_switch_cli import edited


def test_check_says_how_to_mend_a_saved_plan(cli, tmp_path):
    path = edited(tmp_path, "fsdp_train", tp_comm_overlap=True)  # tp 1, no SP: the switch has nothing to act on
    r = cli("check", path, "--format", "json")
    assert r.code == 1 and "Traceback" not in r.err, r.err
    (finding,) = json.loads(r.out)["checks"]
    assert not finding["ok"]
    assert "tp_comm_overlap with tp 1 and sp off" in finding["message"]
    assert f"To mend {path}: a flag is the plan key of its name" in finding["message"]
    assert "tp_comm_overlap: false here, which prices the plan the same" in finding["message"]
