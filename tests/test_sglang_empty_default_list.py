"""SGLang's default decode capture list, when its runner keeps none of it for the plan's server: SGLang 0.5.23
refuses to start (python/sglang/srt/model_executor/runner/base_cuda_graph_runner.py, get_batch_sizes_to_capture:
`assert len(capture_bs) > 0`), so the plan is priced eager, the export writes --disable-decode-cuda-graph (the
server then runs decode eager, as priced) and the JSON says so (decode_graphs_off) with the captured list
(decode_graph_sizes, null). Before, the export left the default list to the engine: a server that would not start.

The case by hand from SGLang 0.5.23's rules (PyPI wheel): a GPU under 20 GiB gets the default decode max_bs 8
(arg_groups/memory_hook.py handle_gpu_memory_settings), so the list is 1, 2, 4, 8 (cuda_graph_hook.py
generate_decode_cuda_graph_batch_sizes); a DeepEP all-to-all at tp 8 with two-batch overlap aligns sizes to
2 x 8 = 16 (utils/common.py get_cuda_graph_batch_size_alignment); the pool of 16 requests is already a multiple of
16 and not below the list's 8, so nothing is added, and no listed size is a multiple of 16: none left."""

from __future__ import annotations

import pytest

SMALL = "base: dgx-h100\nname: small-gpu\ngpu: {hbm_gib: 16.0}\n"


@pytest.fixture
def small(tmp_path):
    p = tmp_path / "small.yaml"
    p.write_text(SMALL)
    return str(p)


def _args(hw: str, *extra: str) -> tuple[str, ...]:
    return ("estimate", "--mode", "infer", "--model", "qwen3-30b-a3b", "--hardware", hw, "--tp", "8", "--ep", "8",
            "--moe-dispatcher", "deepep", "--two-batch-overlap", "--engine", "sglang", "--dtype", "fp8",
            "--input-len", "1024", "--output-len", "256", "--batch", "16", *extra)


def test_the_json_says_decode_graphs_are_off_and_why(cli, small):
    r = cli(*_args(small, "--json"))
    assert r.code == 0, r.err
    d = r.json()
    assert d["workload"]["cuda_graphs"] is True and d["workload"]["cuda_graph_batch_sizes"] is None
    assert d["decode_graph_sizes"] is None and d["decode_graph_batch"] is None
    assert "SGLang 0.5.23 refuses to start" in d["decode_graphs_off"]
    assert "--disable-decode-cuda-graph" in d["decode_graphs_off"]


def test_the_export_disables_decode_graphs_that_sglang_could_not_capture(cli, small, tmp_path):
    plan = tmp_path / "p.json"
    assert cli(*_args(small, "--save", str(plan))).code == 0
    r = cli("export", str(plan), "--to", "sglang", "-o", str(tmp_path / "out"))
    assert r.code == 0, r.err
    text = (tmp_path / "out" / "sglang_serve.sh").read_text()
    flags = [ln.strip().rstrip("\\").strip() for ln in text.splitlines() if ln.startswith("    --")]
    assert "--disable-decode-cuda-graph" in flags and "--disable-prefill-cuda-graph" not in flags


def test_a_server_that_captures_keeps_its_graphs_and_lists_them(cli):
    """The same plan on an 80 GiB H100: max_bs 512 at tp 8, the pool of 16 captured (16 is a multiple of 16)."""
    r = cli(*_args("dgx-h100", "--json"))
    assert r.code == 0, r.err
    d = r.json()
    assert d["decode_graphs_off"] is None and d["decode_graph_sizes"] == [16]
