"""`llmplan bench` on CPU with gloo (2 and 4 processes): every collective runs; the bytes the reference
layer sends equal the TP/SP communication formula exactly; its saved-for-backward bytes match the activation
formula within 1% for none / selective / full recompute with and without SP. The 1% covers what the formula
neglects: each layer norm saves its mean and 1/std (2 small tensors of s·b elements). Two platform facts are
added to the expectation, not hidden in the tolerance: this CPU build keeps dropout masks at 2 bytes per
element (Korthikanti counts 1; CUDA keeps bool masks), and unfused GQA attention keeps K and V expanded to
the query heads. Also: calibration round trip, missing torch, a failing or hung rank."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from llmplan.bench.run import BenchConfig, OPS, bench_notes, compare, launch  # noqa: E402
from llmplan.specs.model import ModelSpec  # noqa: E402
from llmplan.specs.plan import ClusterSpec, ParallelPlan  # noqa: E402
from llmplan.specs.registry import resolve_system  # noqa: E402

TINY = ModelSpec(name="tiny-gqa", model_type="llama", hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                 num_attention_heads=8, num_key_value_heads=4, vocab_size=1024, max_position_embeddings=4096)
SIZES = (1 << 20, 1 << 22)


def tiny_spec(folder: Path) -> Path:
    """TINY as a spec file for `llmplan bench --model`: the CLI tests check the command's plumbing (exit codes,
    notes, JSON keys, verdicts), which is the same for any model; a built-in 8B model's GEMMs (a 4096 x 128256
    float32 logits matrix per rank) made each of them spend 10-20 s multiplying on CPU (issue 39)."""
    path = folder / "tiny-gqa.json"
    path.write_text(TINY.model_dump_json(exclude_defaults=True))
    return path


def config(nproc: int, components=("gemm", "collectives", "layer"), timeout=120.0, model=TINY) -> BenchConfig:
    return BenchConfig(model=model, plan=ParallelPlan(tp=nproc, seq_len=128, micro_batch=2, global_batch=2),
                       cluster=ClusterSpec(system=resolve_system("dgx-h100"), num_nodes=1), nproc=nproc,
                       backend="gloo", components=components, sizes=SIZES, timeout_s=timeout)


@pytest.fixture(scope="module", params=[2, 4])
def bench_run(request):
    cfg = config(request.param)
    t0 = time.perf_counter()
    run = launch(cfg)
    return cfg, run, time.perf_counter() - t0


def test_every_collective_runs(bench_run):
    cfg, run, _ = bench_run
    assert not run.failures and len(run.ranks) == cfg.nproc
    for rank in run.ranks:
        done = {(c["op"], c["bytes"]) for c in rank["collectives"]}
        assert {op for op, _ in done} == set(OPS)
        assert all(c["seconds"] > 0 for c in rank["collectives"])


def test_layer_bytes_sent_and_saved_match_the_formulas(bench_run):
    cfg, run, _ = bench_run
    rows = compare(cfg, run)
    sent = [r for r in rows if r.component == "layer TP bytes sent"]
    saved = [r for r in rows if r.component == "layer saved bytes"]
    assert len(sent) == 6 and len(saved) == 6  # none/selective/full x sp off/on
    for r in sent:
        assert r.measured == r.predicted, r.item
    for r in saved:
        assert abs(r.error) <= 0.01, (r.item, r.error)
    calls = {(l["recompute"], l["sp"]): l["calls"] for l in min(run.ranks, key=lambda r: r["rank"])["layer"]}
    assert calls[("none", False)] == {"all-reduce": 4}
    assert calls[("none", True)] == {"all-gather": 6, "reduce-scatter": 4}
    assert calls[("full", True)] == {"all-gather": 8, "reduce-scatter": 6}


def test_small_cpu_bench_is_quick(bench_run):
    _, run, seconds = bench_run
    assert seconds < 60 and run.seconds < 60


def test_cli_bench_json_and_calibrate_round_trip(cli, tmp_path):
    out = tmp_path / "results.json"
    r = cli("bench", "--model", tiny_spec(tmp_path), "--nproc", "2", "--seq-len", "128", "--gemm-tokens", "128",
            "--components", "gemm,layer", "--out", out, "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["backend"] == "gloo" and {c["component"] for c in doc["comparisons"]} >= {"gemm", "layer saved bytes"}
    assert any("1 of the 4 layers of tiny-gqa" in n for n in doc["notes"])
    r = cli("calibrate", out, "--hardware", "dgx-h100", "-o", tmp_path / "p.yaml")
    assert r.code == 2 and "not measured on GPUs" in r.err

    # A GPU run's results (as `llmplan bench --backend nccl --out` writes them) with slow GEMMs and collectives.
    def results(tflops: float, busbw: float) -> dict:
        gemms = [{"name": n, "m": 4096, "k": k, "n": 4096, "seconds": 1.0, "tflops": tflops}
                 for n, k in (("a", 1024), ("b", 4096), ("c", 8192))]
        size = 1 << 30
        coll = [{"op": "all-gather", "bytes": size, "ranks": 8, "seconds": size * 7 / 8 / busbw}]
        return {"backend": "nccl", "host": "node0", "device": "NVIDIA H100 80GB HBM3",
                "raw": [{"rank": 0, "gemm": gemms, "collectives": coll}]}

    base = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--tp", "8", "--json").json()
    for tflops, busbw, slower in ((300.0, 200e9, True), (850.0, 420e9, False)):
        res = tmp_path / f"gpu-{tflops}.json"
        res.write_text(json.dumps(results(tflops, busbw)))
        prof = tmp_path / f"cal-{tflops}.yaml"
        r = cli("calibrate", res, "--hardware", "dgx-h100", "-o", prof)
        assert r.code == 0, r.err
        est = cli("estimate", "--model", "llama-3.1-8b", "--hardware", prof, "--tp", "8", "--json").json()
        assert est["calibrated"] and "node0" in est["calibrated"]
        if slower:
            assert est["time"]["step_s"] > base["time"]["step_s"]
            assert est["comm"]["tp"]["seconds"] > base["comm"]["tp"]["seconds"]
        else:
            assert est["time"]["step_s"] < base["time"]["step_s"]
        assert "calibrated profile" in cli("estimate", "--model", "llama-3.1-8b", "--hardware", prof, "--tp", "8").out
    assert cli("calibrate", res, "--hardware", "dgx-h100", "-o", prof).code == 2  # exists, no --force


def test_missing_torch_names_the_extra(cli, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    r = cli("bench", "--model", "llama-3.1-8b")
    assert r.code == 2 and "pip install 'llmplan[bench]'" in r.err


def _stray(folder: Path) -> list[str]:
    """Workers of this test's runs still alive (their config lies in `folder`; other benches running on the
    machine at the same time are not this test's)."""
    out = subprocess.run(["pgrep", "-f", f"llmplan.bench.worker {folder}"], capture_output=True, text=True).stdout
    return [p for p in out.split() if p and int(p) != os.getpid()]


def test_failing_rank_is_named(cli, monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("LLMPLAN_BENCH_FAIL_RANK", "1")
    r = cli("bench", "--model", "llama-3.1-8b", "--nproc", "2", "--seq-len", "64", "--components", "collectives",
            "--sizes", "1MiB", "--timeout", "60")
    assert r.code == 1
    assert "rank 1 failed while 'collective all-reduce" in r.err and "injected failure" in r.err
    assert not _stray(tmp_path)


def test_hung_rank_stops_within_the_timeout_and_leaves_no_processes(cli, monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("LLMPLAN_BENCH_HANG_RANK", "1")
    t0 = time.perf_counter()
    r = cli("bench", "--model", "llama-3.1-8b", "--nproc", "2", "--seq-len", "64", "--components", "collectives",
            "--sizes", "1MiB", "--timeout", "15", "--json")
    wall = time.perf_counter() - t0
    assert r.code == 1
    assert "rank 1 failed while 'collective all-reduce" in r.err and "--timeout" in r.err
    doc = r.json()
    # --timeout counts from the end of start-up (every rank past init_process_group, which a busy machine can
    # make slower than 15 s: it failed once so), as seconds without progress: the hang is stopped 15 s after the
    # hung rank's last phase, not before, and within 25 s more (the 0.2 s poll, the kill's 5 s waits). The
    # command's own wall clock adds its import (about 10 s on this busy 2-core machine) and start-up: bounded
    # by the start-up timeout (120 s) plus that
    assert doc["timed_out"] and doc["startup_s"] is not None
    assert 15 <= doc["seconds"] - doc["startup_s"] < 40
    assert wall < 120 + 40 + 30
    time.sleep(0.5)
    assert not _stray(tmp_path)


def test_bench_checks_the_plan_like_estimate(cli):
    r = cli("bench", "--model", "llama-3.1-8b", "--tp", "3", "--nproc", "3")
    assert r.code == 2 and "tp (3) must divide num_attention_heads (32)" in r.err


def test_cpu_times_are_not_scored(cli, tmp_path):
    # gloo on CPU: GEMM and collective times say "n/a on CPU" instead of errors in the millions of percent.
    r = cli("bench", "--model", tiny_spec(tmp_path), "--nproc", "2", "--seq-len", "64", "--gemm-tokens", "64",
            "--components", "gemm,collectives", "--sizes", "64KiB")
    assert r.code == 0, r.err
    assert "n/a on CPU" in r.out


def test_cpu_note_says_what_a_cpu_run_still_checks():
    # issue 39: the note stopped at "saved bytes and bytes sent are"; it is a whole sentence now.
    note = [n for n in bench_notes(config(2)) if n.startswith("CPU run")]
    assert len(note) == 1 and not note[0].rstrip().endswith(" are")
    assert note[0].endswith("saved bytes and bytes sent are the same on any backend and are checked as on GPUs")


def test_attention_pair_runs_and_prices_the_head_dim_curve(cli):
    # GPT-OSS 20B (head dim 64, 64 query / 8 KV heads) at TP 1: its causal attention and the same width at head
    # dim 128 (32 / 4 heads), forward + backward through SDPA. On CPU the times get no verdict; the rows and the
    # shapes are what a GPU run scores (0.25 on the time, 0.1 on the head-dim rate ratio).
    r = cli("bench", "--model", "gpt-oss-20b", "--nproc", "1", "--seq-len", "128", "--components", "attention",
            "--json")
    assert r.code == 0, r.err
    doc = r.json()
    cases = doc["raw"][0]["attention"]
    assert [(c["name"], c["a"], c["kv"], c["qk"]) for c in cases] == [("model", 64, 8, 64), ("head dim 128", 32, 4, 128)]
    assert all(c["seconds"] > 0 for c in cases)
    rows = {c["component"]: c for c in doc["comparisons"]}
    curve = rows["attention head-dim curve"]
    assert curve["predicted"] == pytest.approx((64 / 107) / (128 / 171))  # d0 43: head_dim_attention_ratio
    assert curve["verdict"] == "n/a" and rows["attention"]["verdict"] == "n/a"


def test_calibrate_solves_the_head_dim_curve_from_the_attention_pair(cli, tmp_path):
    # A GPU run whose head-dim-64 attention runs at 0.80x the rate of head dim 128 (FlashAttention-3's ratio,
    # Shah et al. 2024, Figures 5-6) and FA2 at 0.89x: calibrate writes d0 = 64·128·0.2 / (0.8·128 - 64) = 42.7
    # and 18.0, the values that reproduce those ratios.
    def case(name, a, kv, d, kernel, seconds):
        return {"name": name, "b": 1, "a": a, "kv": kv, "s": 4096, "qk": d, "v": d, "kernel": kernel, "seconds": seconds}
    att = [case("model", 64, 8, 64, "native", 1.0 / 0.8), case("head dim 128", 32, 4, 128, "native", 1.0),
           case("model", 64, 8, 64, "flash2", 1.0 / 0.8902), case("head dim 128", 32, 4, 128, "flash2", 1.0)]
    gemms = [{"name": "a", "m": 4096, "k": 4096, "n": 4096, "seconds": 1.0, "tflops": 700.0}]
    res = tmp_path / "gpu.json"
    res.write_text(json.dumps({"backend": "nccl", "host": "node0", "device": "NVIDIA H100 80GB HBM3",
                               "raw": [{"rank": 0, "gemm": gemms, "attention": att}]}))
    prof = tmp_path / "cal.yaml"
    r = cli("calibrate", res, "--hardware", "dgx-h100", "-o", prof)
    assert r.code == 0, r.err
    import yaml
    gpu = yaml.safe_load(prof.read_text())["gpu"]
    assert gpu["attention_softmax_head_dim"] == pytest.approx(42.7) and gpu["flash2_softmax_head_dim"] == pytest.approx(18.0)
    assert "attention_softmax_head_dim 42.7" in yaml.safe_load(prof.read_text())["calibrated"]


def test_an_attention_backend_without_a_kernel_is_reported_on_its_row(tmp_path):
    # cuDNN attention has no CPU kernel: the worker records why for each case (after retrying with K and V
    # expanded to the query heads) instead of failing the rank, and the comparison shows it without a verdict.
    from llmplan.bench.run import attention_cases, attention_rows
    from llmplan.bench.worker import run_attention
    cfg = config(1, components=("attention",))
    wcfg = {"attention": attention_cases(cfg), "attention_kernels": ["native"], "attention_dtype": "float32",
            "warmup": 1, "iters": 1}
    got = run_attention(wcfg, "cpu", tmp_path, 0)
    assert len(got) == 2 and all(c.get("error") for c in got)
    rows = attention_rows(cfg, got, on_gpu=True)
    assert [r.verdict for r in rows] == ["n/a", "n/a"] and all(r.note for r in rows)


def test_attention_row_prices_the_kernel_rate_curve():
    # One call of 512 tokens runs below the kernel's long-sequence rate (docs/formulas.md#compute.cp_attention):
    # the price per FLOP of a short case is higher than of a 16k case of the same heads (it was equal before the
    # curve reached bench's rows).
    from llmplan.bench.compare import attention_rows
    from llmplan.bench.run import attention_flops

    cfg = config(1, components=("attention",))
    cases = [{"name": "model", "kernel": "native", "b": 1, "a": 32, "kv": 8, "s": s, "qk": 128, "v": 128,
              "seconds": 1.0} for s in (512, 16384)]
    short, long_ = (r for r in attention_rows(cfg, cases, on_gpu=False) if r.component == "attention")
    assert short.predicted / attention_flops(cases[0]) > 1.1 * long_.predicted / attention_flops(cases[1])
