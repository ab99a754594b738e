"""benchmarks/mamba_bound.py (docs/validation.md#nano-per-token, #mamba-dense-hybrid): it runs and fits 80
columns; the Mamba-2 cost it prices and what a row leaves unplaced add up to the measured step the record
publishes; its probe (llmplan's Mamba-2 cost scaled by k) slows a Mamba-2 row and leaves a model without
Mamba-2 layers alone; it quotes state-spaces/mamba issue 904's throughputs as published, and the k it derives
from them does make llmplan's step ratio the measured one (the step is linear in k on one GPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import mamba_bound as M  # benchmarks/ is on the path (conftest)
import pytest

from llmplan.estimate import estimate_training
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_systems

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "mamba_bound.py"
NANO = M.ROWS[1]
QWEN = "mbridge-26.04.01-pretrain-qwen3-30b-a3b-dgx-gb200-8gpu-mxfp8-tp1pp1cp1ep8vpnagbs512mbs4"


def test_the_script_runs_and_fits_80_columns():
    r = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, check=False, timeout=300)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    lines = r.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    rows = [line for line in lines if " | " in line and line.startswith("  ")]
    assert [line.split()[3] for line in rows] == [rid.replace("-pretrain-", "-")[:59] for rid in M.ROWS], r.stdout
    assert sum(line.lstrip().startswith("k_A100 ") for line in lines) == 3, r.stdout


def test_the_rows_it_names_are_published(published_runs):
    assert all(rid in published_runs for rid in M.ROWS)


def test_priced_and_unplaced_add_up_to_the_published_step(published_runs):
    rec = published_runs[NANO]
    priced, unplaced, n_mb, layers = M.priced_and_unplaced(rec)
    p = rec["parallel"]
    assert n_mb == p["global_batch"] // (p["dp"] * p["micro_batch"])
    measured = p["global_batch"] * rec["model"]["seq_len"] / (rec["measured"]["tokens_per_s_per_gpu"]
                                                              * rec["hardware"]["gpus"])
    predicted, _, _, _ = M.step(rec)
    assert predicted + unplaced == pytest.approx(measured, rel=1e-9)
    with M.scaled(0.0):
        without, _, _, _ = M.step(rec)
    assert 0 < priced < predicted and without + priced == pytest.approx(predicted, rel=1e-9)
    assert layers > 0


def test_scaling_the_mamba_cost_slows_a_mamba_row_and_leaves_others_alone(published_runs):
    nano, qwen = published_runs[NANO], published_runs[QWEN]
    base_nano, base_qwen = M.step(nano)[0], M.step(qwen)[0]
    with M.scaled(2.0):
        twice_nano, twice_qwen = M.step(nano)[0], M.step(qwen)[0]
    assert twice_nano > base_nano
    assert twice_qwen == base_qwen  # no Mamba-2 layer: nothing to scale
    assert M.group(QWEN) == "qwen3" and M.group(NANO) == "nano"


def test_issue_904_throughputs_are_quoted_as_published():
    # state-spaces/mamba issue 904 (2026-04-06), 'Training throughput' table: Mamba2 at 102.5 TFLOP/s on A100,
    # 239.2 on H200, 360.4 on GB200 (d_model 2048, 48 layers, batch 4, seq_len 4096, bf16)
    assert M.ISSUE_904_TFLOPS == {"dgx-a100": 102.5, "dgx-h200": 239.2, "gb200-nvl72": 360.4}
    model = M.mamba2_1b3()
    assert (model.hidden_size, model.count_layers("mamba"), model.ssm_state_size) == (2048, 48, 128)


def test_the_derived_k_makes_the_step_ratio_the_measured_one():
    split = M.issue904_split()
    (ra, ma), (rh, mh) = split["dgx-a100"], split["dgx-h200"]
    assert ma > 0 and mh > 0 and ra > 0 and rh > 0
    tf = M.ISSUE_904_TFLOPS
    t_h = (ra + ma) * tf["dgx-a100"] / tf["dgx-h200"]  # the script's k_A100 = 1 line
    k_h = (t_h - rh) / mh
    plan = ParallelPlan(tp=1, pp=1, dp=1, seq_len=4096, micro_batch=4, global_batch=4, dtype="bf16",
                        recompute="none")
    cluster = ClusterSpec(system=builtin_systems()["dgx-h200"], num_nodes=1, gpus_per_node=1)
    with M.scaled(k_h):
        step_h = float(estimate_training(M.mamba2_1b3(), cluster, plan).time.total)
    assert (ra + ma) / step_h == pytest.approx(tf["dgx-h200"] / tf["dgx-a100"], rel=1e-6)
