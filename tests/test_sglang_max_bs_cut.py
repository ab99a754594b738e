"""SGLang's default decode max_bs cut to --max-running-requests (docs/validation.md#sglang-cut).

SGLang 0.5.23 (PyPI wheel sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl), python/sglang/srt/:
- arg_groups/memory_hook.py handle_gpu_memory_settings, lines 182-188: a default decode max_bs (512 on an
  80 GiB GPU at tp_size >= 4, lines 134-145) above --max-running-requests is set to it; lines 201-205 then list
  the sizes up to it (arg_groups/cuda_graph_hook.py generate_decode_cuda_graph_batch_sizes, lines 500-532:
  1, 2, 4, 8, 12, every 8 from 16, ..., and max_bs itself);
- model_executor/runner/base_cuda_graph_runner.py get_batch_sizes_to_capture, lines 93-104: the pool rounded up
  to the alignment (8 here: a DeepEP all-to-all at attention TP 8 gathers the input), added only when the list
  reaches above it, sizes off the alignment dropped, and `assert len(capture_bs) > 0`;
- memory_hook.py reserve_for_graph_mb (2 MiB per decode max_bs, only with the decode backend on) and
  reserve_for_deepep_a2a_mb (2 GiB, only with the decode backend on).

Qwen3-30B-A3B, one H100 node, tp 8 ep 8 DeepEP, SGLang (--max-running-requests = the batch):
batch 20: the list 1, 2, 4, 8, 12, 16, 20; the pool 20 rounds to 24, not added (20 < 24); kept 8, 16: a step of 20
runs eager (llmplan padded it to 24 in a graph before). Batch 24: 8, 16, 24, captured. Batch 7: 1, 2, 4, 7, pool 8 not
added, none kept: SGLang refuses to start; the export writes --disable-decode-cuda-graph and the decode is priced
eager (llmplan captured 8 before)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_serve_capture import _export, _h100, _sglang_by_hand

PLAN = ("--mode", "infer", "-m", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--tp", "8", "--ep", "8",
        "--moe-dispatcher", "deepep", "--engine", "sglang", "--dtype", "fp8", "--input-len", "1024",
        "--output-len", "256")


def _tpot(cli, *args: str) -> float:
    r = cli("estimate", *PLAN, *args, "--json")
    assert r.code == 0, r.err
    return r.json()["tpot_s"]


def test_a_batch_off_the_alignment_is_left_eager(cli, tmp_path: Path):
    d, ns = _export(cli, tmp_path, (*PLAN, "--batch", "20"), "sglang")
    assert (int(ns.tp_size), int(ns.max_running_requests)) == (8, 20)
    by_hand = _sglang_by_hand(ns, _h100(), speculative=False)
    assert by_hand == [8, 16]
    assert d["workload"]["cuda_graph_batch_sizes"] == by_hand == d["decode_graph_sizes"]
    assert d["decode_graph_eager"] is True
    # the decode step runs eager, as with decode graphs off (--no-cuda-graphs)
    assert d["tpot_s"] == pytest.approx(_tpot(cli, "--batch", "20", "--no-cuda-graphs"), rel=1e-9)


def test_a_batch_on_the_alignment_is_captured(cli, tmp_path: Path):
    d, ns = _export(cli, tmp_path, (*PLAN, "--batch", "24"), "sglang")
    assert _sglang_by_hand(ns, _h100(), speculative=False) == [8, 16, 24] == d["decode_graph_sizes"]
    assert (d["decode_graph_batch"], d["decode_graph_eager"]) == (24, False)
    assert d["tpot_s"] < _tpot(cli, "--batch", "24", "--no-cuda-graphs")


def test_a_batch_whose_list_keeps_none_exports_decode_graphs_off(cli, tmp_path: Path):
    d, ns = _export(cli, tmp_path, (*PLAN, "--batch", "7"), "sglang")
    assert ns.disable_decode_cuda_graph and not ns.disable_prefill_cuda_graph
    assert d["workload"]["cuda_graph_batch_sizes"] is None and d["decode_graph_sizes"] is None
    assert "refuses to start" in d["decode_graphs_off"]
    assert d["tpot_s"] == pytest.approx(_tpot(cli, "--batch", "7", "--no-cuda-graphs"), rel=1e-9)
    # SGLang's default fraction without the decode graphs' reserve: vs the same server given --cuda-graph-sizes 8
    # (kept: 8 is on the alignment), 2 x 8 MiB and DeepEP's 2,048 MiB less (reserve_for_graph_mb,
    # reserve_for_deepep_a2a_mb), rounded to 3 decimals by SGLang
    graphs = cli("estimate", *PLAN, "--batch", "7", "--cuda-graph-sizes", "8", "--json").json()
    assert graphs["decode_graph_sizes"] == [8]
    gpu_mib = _h100() * 1024
    diff = d["workload"]["gpu_memory_utilization"] - graphs["workload"]["gpu_memory_utilization"]
    assert diff == pytest.approx((2 * 8 + 2048) / gpu_mib, abs=1e-3)
    assert float(ns.mem_fraction_static) == d["workload"]["gpu_memory_utilization"]


@pytest.mark.parametrize("slo", [0.006, 0.008])
def test_the_slo_batch_meets_the_slo_as_its_own_server_runs_it(cli, slo):
    """Under the cut, a batch off the alignment runs eager: the SLO concurrency is checked as a server set up
    for it runs it (serving.slo_batch_of), so the search's row and estimate's slo.max_batch meet the TPOT SLO
    (stop 61 review: the search reported batch 133 at 9.31 ms under a 6 ms SLO, the grid priced with the
    --max-batch server's list)."""
    s = cli("search", *PLAN, "--tpot-slo", str(slo), "--json")
    assert s.code == 0, s.err
    rows = s.json()["plans"]
    assert rows and all(r["tpot_s"] <= slo for r in rows), [(r["workload"]["batch"], r["tpot_s"]) for r in rows]
    top = rows[0]["slo"]["max_batch"]
    e = cli("estimate", *PLAN, "--batch", str(top), "--json")
    assert e.code == 0, e.err
    assert e.json()["tpot_s"] <= slo, (top, e.json()["tpot_s"])
