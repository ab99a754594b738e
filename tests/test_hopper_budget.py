"""benchmarks/hopper_budget.py (docs/validation.md#hopper-budget): a family it does not price is refused in one
line with exit code 2, naming the valid ones, before any row is priced."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "hopper_budget.py"


@pytest.mark.parametrize("family", ["nope", "torchtitan", "trtllm"])
def test_an_unpriced_family_is_refused_in_one_line(family):
    r = subprocess.run([sys.executable, str(SCRIPT), "--family", "megatron", "--family", family],
                       capture_output=True, text=True, check=False, timeout=120)
    errors = [line for line in r.stderr.splitlines() if "error:" in line]
    assert r.returncode == 2 and "Traceback" not in r.stderr and not r.stdout, r.stderr
    assert len(errors) == 1 and f"--family {family}:" in errors[0] and "valid: " in errors[0], r.stderr
    assert "megatron" in errors[0].split("valid: ")[1] and family not in errors[0].split("valid: ")[1]
