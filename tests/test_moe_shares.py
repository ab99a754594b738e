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
def test_an_hbm_fraction_outside_zero_to_one_is_refused_in_one_line(value, capsys):
    script = Path(__file__).parents[1] / "benchmarks" / "moe_shares.py"
    if value == "0":  # the script as a child process: its real exit status, no traceback from the interpreter
        r = subprocess.run([sys.executable, str(script), "--hbm-efficiency", value], capture_output=True, text=True,
                           check=False, timeout=120)
        code, err = r.returncode, r.stderr
    else:  # its main() in-process, as the script calls it; any exception but argparse's exit fails the test
        with pytest.raises(SystemExit) as stop:
            S.main(["--hbm-efficiency", value])
        code, err = stop.value.code, capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert code == 2 and "Traceback" not in err, err
    assert len(errors) == 1 and f"--hbm-efficiency {float(value)}" in errors[0] and "(0, 1]" in errors[0], err


# NVIDIA/cudnn-frontend benchmark/norms/results/h200/all_models_20260227_035147.csv at 3929da2ef4, the cudnn
# backend's RMSNorm rows (bf16): (N tokens, C hidden, forward GB/s, backward GB/s), the harness's columns.
H200_RMSNORM = ((16384, 4096, 3708.1, 3801.0), (8192, 8192, 3770.9, 3526.2), (4096, 16384, 3845.2, 3420.0),
                (8192, 5120, 3762.0, 3658.5), (8192, 4096, 3790.3, 3499.9), (4096, 6144, 3461.6, 3086.8),
                (4096, 8192, 3311.3, 3279.2), (2048, 4096, 3351.7, 2795.1), (131072, 128, 3202.5, 2922.5),
                (8192, 128, 1435.9, 729.3), (8192, 5120, 3770.2, 3631.5), (4096, 2048, 3228.4, 2596.9),
                (131072, 128, 3187.7, 2882.6), (16384, 128, 1957.0, 1110.3))


def test_the_size_curve_is_the_published_h200_rows_fitted():
    """H200_NORM_CURVE is the least-squares line time = t0 + bytes / (share x 4,800 GB/s) through the published
    rows, weighted by 1 / time, each pass apart, with the harness's own bytes."""
    import numpy as np
    for k, (t0, share) in enumerate(S.H200_NORM_CURVE):
        nbytes = np.array([(2 * n * c + c) * 2 + 4 * n if k == 0 else (3 * n * c + 2 * c) * 2 + 4 * n
                           for n, c, _, _ in H200_RMSNORM], float)
        seconds = nbytes / (np.array([row[2 + k] for row in H200_RMSNORM]) * 1e9)
        a = np.column_stack([np.ones_like(nbytes), nbytes]) / seconds[:, None]
        (t0_fit, inv), *_ = np.linalg.lstsq(a, np.ones_like(seconds), rcond=None)
        assert t0 == pytest.approx(t0_fit, abs=0.02e-6)
        assert share == pytest.approx(1 / inv / 4800e9, abs=0.001)


def test_size_share_by_hand_and_against_the_published_small_and_large_shapes():
    # Qwen3-30B's norm at MBS 1 (4,096 tokens x 2,048) on H100's 3,350 GB/s: forward 4 bytes an element, backward 6
    n = 4096 * 2048
    e_fwd = 4 * n / (1.90e-6 + 4 * n / (0.795 * 3350e9)) / 3350e9
    e_bwd = 6 * n / (7.20e-6 + 6 * n / (0.811 * 3350e9)) / 3350e9
    assert S.size_share(4096, 2048, 3350e9) == pytest.approx(10 / (4 / e_fwd + 6 / e_bwd), rel=1e-12)
    # on H200 the curve gives the published combined share 2.5 / (1/fwd + 1.5/bwd) within 4% at Qwen3-30B's and
    # Llama 3 8B's shapes; DeepSeek-V3's 2,048 x 4,096 (the same bytes as Qwen3-30B's) ran 10% faster than the curve:
    # the bytes alone do not set the time
    for (n_tok, c, fwd, bwd), tol in ((H200_RMSNORM[11], 0.04), (H200_RMSNORM[0], 0.04), (H200_RMSNORM[7], 0.10)):
        published = 2.5 / (4800 / fwd + 1.5 * 4800 / bwd)
        assert S.size_share(n_tok, c, 4800e9) == pytest.approx(published, rel=tol), (n_tok, c)
    # the size dependence: 4,096 x 2,048 reaches less than 16,384 x 4,096, both less than the asymptotes
    assert S.size_share(4096, 2048, 4800e9) < S.size_share(16384, 4096, 4800e9) < 0.811


def test_the_size_probe_moves_only_h100_and_the_row_slows(published_runs):
    systems = builtin_systems()
    gb200 = systems["gb200-nvl72"].gpu
    assert S.size_probe_gpu(gb200, None, None) is gb200  # type: ignore[arg-type]
    rid = next(r for r in published_runs if "qwen3-30b-a3b" in r and "h100" in r and "26.04.01" in r)
    err, parts = S.shares(published_runs[rid])
    err_size, parts_size = S.shares(published_runs[rid], hbm_size=True)
    assert parts_size["memory_bound"] > parts["memory_bound"] and err_size < err  # 0.8 -> about 0.62 at 4,096 x 2,048


def test_residual_fit_recovers_a_planted_trend_and_leaves_the_excess():
    """--residual: the fit over the other models' rows recovers an exact linear trend, so a model planted
    10 points above it reads a residual of +10 points."""
    trend = (0.05, -0.5, 0.2)
    pts = [(trend[0] + trend[1] * a + trend[2] * m, {"attention": a, "memory_bound": m})
           for a, m in ((0.1, 0.2), (0.3, 0.1), (0.2, 0.4), (0.05, 0.3))]
    assert list(S.fit(pts)) == pytest.approx(trend, abs=1e-9)
    a, m = 0.12, 0.3
    rows = {("other", "bw"): pts, ("x", "bw"): [(trend[0] + trend[1] * a + trend[2] * m + 0.10,
                                                  {"attention": a, "memory_bound": m, "comm": 0.1})]}
    import io
    from contextlib import redirect_stdout
    out = io.StringIO()
    with redirect_stdout(out):
        S.print_residuals(rows, {("other", "bw"): ["o"] * 4, ("x", "bw"): ["mbridge-x-row"]}, "x")
    assert "median residual +10.0 points" in out.getvalue()
