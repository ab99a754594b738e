"""benchmarks/moe_shares.py (docs/validation.md#moe-gap-shared): the parts it splits a predicted step into add up
to the step's compute and exposed communication, each probe moves the part it names and the row's error the
way it must, and a row it cannot score is left out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import moe_shares as S  # benchmarks/ is on the path (conftest)
import pytest

from llmplan.specs.registry import builtin_systems

NANO = "mbridge-26.04.01-pretrain-nemotron-3-nano-dgx-gb200-8gpu-mxfp8-tp1pp1cp1ep8vpnagbs512mbs2"
LLAMA = "mbridge-26.04-pretrain-llama3.1-405b-dgx-gb300-256gpu-mxfp8-tp2pp8cp2epnavp4gbs1536mbs1"


@pytest.mark.parametrize("rid", [NANO, LLAMA])
def test_parts_add_up_to_the_step_less_its_bubble_and_overhead(published_runs, acc, rid):
    rec = published_runs[rid]
    err, parts = S.shares(rec)
    assert all(0.0 <= v < 1.0 for v in parts.values()), parts
    # the same error accuracy.py prints for the row
    (_, pred, meas), *_ = acc.predict(rec, acc.family(rid))
    assert err == pytest.approx(pred / meas - 1, rel=1e-9)
    # compute and exposed communication are what the parts cover; bubble, optimizer and overhead the rest
    assert 0.85 < sum(parts.values()) <= 1.0


def test_published_attention_shrinks_attention_and_speeds_the_row(published_runs):
    rec = published_runs[NANO]
    err, parts = S.shares(rec)
    err_pub, parts_pub = S.shares(rec, published_attention=True)
    assert parts_pub["attention"] < parts["attention"]
    assert err_pub > err  # a faster attention kernel predicts more tokens per second


def test_slower_memory_bound_operators_grow_their_share_and_slow_the_row(published_runs):
    rec = published_runs[NANO]
    err, parts = S.shares(rec)
    err_slow, parts_slow = S.shares(rec, hbm_efficiency=0.55)
    assert parts_slow["memory_bound"] > parts["memory_bound"]
    assert err_slow < err


def test_probes_leave_other_gpus_and_the_shipped_profiles_alone():
    systems = builtin_systems()
    a100 = systems["dgx-a100"].gpu
    assert S.probe_gpu(a100, True, 0.5) is a100
    gb200 = systems["gb200-nvl72"].gpu
    probed = S.probe_gpu(gb200, True, 0.5)
    assert (probed.attention_efficiency, probed.softmax_attention_ratio, probed.hbm_efficiency) == (1.16, 0.91, 0.5)
    assert builtin_systems()["gb200-nvl72"].gpu.attention_efficiency == gb200.attention_efficiency


def test_an_unscored_row_is_left_out(published_runs):
    skipped = next(r for rid, r in published_runs.items() if "26.06.01-pretrain-gpt-oss" in rid)
    assert S.shares(skipped) is None  # the footnoted cudnn-frontend regression rows (MBRIDGE_SKIP)
    assert S.model_key("mbridge-25.09-pretrain-deepseekv3-tokendrop-dgx-b200-256gpu-fp8") == "deepseekv3"


@pytest.mark.parametrize("value", ["0", "1.5"])
def test_an_hbm_fraction_outside_zero_to_one_is_refused_in_one_line(value):
    script = Path(__file__).parents[1] / "benchmarks" / "moe_shares.py"
    r = subprocess.run([sys.executable, str(script), "--hbm-efficiency", value], capture_output=True, text=True,
                       check=False, timeout=120)
    errors = [line for line in r.stderr.splitlines() if "error:" in line]
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len(errors) == 1 and f"--hbm-efficiency {float(value)}" in errors[0] and "(0, 1]" in errors[0], r.stderr
