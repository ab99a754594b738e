"""The CUDA graphs a serving plan was priced with, launched by its vLLM and SGLang exports: --no-cuda-graphs
(a kernel launch per kernel priced, docs/formulas.md#infer.step) as vLLM 0.33.0's --enforce-eager and SGLang
0.5.23's --disable-decode-cuda-graph / --disable-prefill-cuda-graph; a user's --cuda-graph-sizes (the sizes a
decode step pads to, docs/formulas.md#infer.graph_padding) as vLLM's --cudagraph-capture-sizes and SGLang's
--cuda-graph-bs-decode; neither written for a plan priced with the engine's own default list. Each launch line is
parsed with the engine's recorded parser (tests/data/launchers/vllm.json, sglang.json)."""

from __future__ import annotations

import pytest
from test_serve_max_seqs import exported, parsed


def _launch(cli, tmp_path, name: str, *args: str) -> dict:
    _, files = exported(cli, tmp_path, name, "--batch", "64", *args)
    return {t: (parsed(text, t), text) for t, text in files.items()}


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_plan_priced_without_cuda_graphs_launches_eager(cli, tmp_path, engine):
    out = _launch(cli, tmp_path, "eager", "--engine", engine, "--no-cuda-graphs")
    vllm, sglang = out["vllm"][0], out["sglang"][0]
    assert vllm.enforce_eager and vllm.cudagraph_capture_sizes is None
    assert sglang.disable_decode_cuda_graph and sglang.disable_prefill_cuda_graph
    assert sglang.cuda_graph_bs_decode is None


def test_a_plan_priced_with_the_engines_default_graphs_leaves_them_to_the_engine(cli, tmp_path):
    out = _launch(cli, tmp_path, "default")
    vllm, sglang = out["vllm"][0], out["sglang"][0]
    assert not vllm.enforce_eager and vllm.cudagraph_capture_sizes is None
    assert not (sglang.disable_decode_cuda_graph or sglang.disable_prefill_cuda_graph)
    assert sglang.cuda_graph_bs_decode is None


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_users_cuda_graph_sizes_are_written_as_priced(cli, tmp_path, engine):
    out = _launch(cli, tmp_path, "sizes", "--engine", engine, "--cuda-graph-sizes", "64,1,8")
    (vllm, vllm_text), (sglang, sglang_text) = out["vllm"], out["sglang"]
    assert vllm.cudagraph_capture_sizes == ["1", "8", "64"] and not vllm.enforce_eager
    assert sglang.cuda_graph_bs_decode == ["1", "8", "64"] and not sglang.disable_decode_cuda_graph
    # the launch line of the other engine says whose graphs were priced
    other, text = ("sglang", sglang_text) if engine == "vllm" else ("vllm", vllm_text)
    flag = {"vllm": "--cudagraph-capture-sizes", "sglang": "--cuda-graph-bs-decode"}
    assert f"# {flag[other]}: the plan's --cuda-graph-sizes, priced with {engine}'s CUDA graphs" in text
    assert "the plan's --cuda-graph-sizes" not in out[engine][1]
