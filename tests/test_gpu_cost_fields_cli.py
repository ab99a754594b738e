"""The GPU fields the cost model added (GpuSpec.host_op_factor / host_op_source, sparse_gather_efficiency,
ssd_scan_efficiency), given wrong in a user's hardware file: the real command refuses them in one line naming
the field and the rule, with exit code 2 and no traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from test_bad_input_files import llmplan, one_line


def estimate(hardware: Path) -> subprocess.CompletedProcess:
    return llmplan("estimate", "--model", "llama-3.1-8b", "--hardware", hardware, timeout=120)


@pytest.mark.parametrize("gpu, expected", [
    ("{host_op_factor: 2.0}", ["field 'gpu'", "host_op_factor 2 needs host_op_source"]),
    ("{sparse_gather_efficiency: [0.5, 1.5]}",
     ["field 'gpu.sparse_gather_efficiency.1'", "less than or equal to 1", "1.5"]),
    ("{ssd_scan_efficiency: 0}", ["field 'gpu.ssd_scan_efficiency'", "greater than 0"]),
])
def test_a_bad_gpu_cost_field_is_one_line_and_exit_2(tmp_path, gpu, expected):
    f = tmp_path / "cluster.yaml"
    f.write_text(f"base: dgx-h100\ngpu: {gpu}\n")
    r = estimate(f)
    assert r.returncode == 2, r.stdout + r.stderr
    line = one_line(r.stderr)
    assert line.startswith("error: ") and all(e in line for e in expected), line


def test_a_sourced_host_op_factor_is_accepted(tmp_path):
    f = tmp_path / "cluster.yaml"
    f.write_text('base: dgx-h100\ngpu: {host_op_factor: 2.0, host_op_source: "per-op CPU times, both hosts"}\n')
    r = estimate(f)
    assert r.returncode == 0, r.stderr
