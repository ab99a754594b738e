"""benchmarks/hopper_budget.py (docs/validation.md#hopper-budget): a family it does not price is refused in one
line with exit code 2, naming the valid ones, before any row is priced."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "hopper_budget.py"


@pytest.mark.parametrize("family", ["nope", "torchtitan", "trtllm"])
def test_an_unpriced_family_is_refused_in_one_line(family, capsys):
    argv = ["--family", "megatron", "--family", family]
    if family == "nope":  # the script as a child process: its real exit status, no traceback from the interpreter
        r = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, check=False,
                           timeout=120)
        code, out, err = r.returncode, r.stdout, r.stderr
    else:  # its main() in-process, as `python hopper_budget.py` calls it (about 1.5 s of CPU of imports less)
        import hopper_budget  # benchmarks/ is on the path (conftest)

        with pytest.raises(SystemExit) as stop:  # argparse's refusal; any other exception fails the test
            hopper_budget.main(argv)
        code, (out, err) = stop.value.code, capsys.readouterr()
    errors = [line for line in err.splitlines() if "error:" in line]
    assert code == 2 and "Traceback" not in err and not out, err
    assert len(errors) == 1 and f"--family {family}:" in errors[0] and "valid: " in errors[0], err
    assert "megatron" in errors[0].split("valid: ")[1] and family not in errors[0].split("valid: ")[1]
