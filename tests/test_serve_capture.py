"""The decode CUDA-graph capture list llmplan prices against the server its export launches (docs/validation.md#serve-capture,
docs/formulas.md#infer.graph_padding). Each expected list is derived here by hand from the engine's own rule applied to
the exported flags (parsed with the engine's recorded parser), not by the code under test:

SGLang 0.5.23 (PyPI wheel sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl): arg_groups/memory_hook.py
handle_gpu_memory_settings (decode max_bs from the GPU's memory and --tp-size: 256 below tp_size 4, 512 from it, on a
60-160 GiB GPU; cut to --max-running-requests), arg_groups/cuda_graph_hook.py generate_decode_cuda_graph_batch_sizes
(the plain and the speculative grids), mem_cache/kv_cache_configurator.py resolve_max_num_reqs (each attention rank a
pool of --max-running-requests // --attn-dp-size), model_executor/runner/base_cuda_graph_runner.py
get_batch_sizes_to_capture with utils/common.py get_cuda_graph_batch_size_alignment (the pool rounded up to the
alignment and added, sizes above it dropped, sizes whose tokens are off the alignment dropped; alignment 2 with
--enable-two-batch-overlap, times the attention TP size --tp-size / --attn-dp-size where the input is gathered).

vLLM (vllm/config/vllm.py VllmConfig._set_cudagraph_sizes at 000fc94b and in the v0.33.0 sdist; vllm/config/
compilation.py adjust_cudagraph_sizes_for_spec_decode at ee525ce4 and in v0.33.0): sizes in tokens, the ceiling
min(2 x max_num_seqs x (1 + k), 512 on an H100), the uniform decode sizes n x (1 + k), then every size rounded up to
a multiple of 1 + k."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from exported import unwrapped
from test_serve_max_seqs import parsed

from llmplan.specs.registry import builtin_systems

DPA = ("--mode", "infer", "-m", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--tp", "1", "--dp", "8", "--ep", "8",
       "--dp-attention", "--engine", "sglang", "--batch", "300")
ONE_H100 = ("--mode", "infer", "-m", "llama-3.1-8b", "--hardware", "dgx-h100", "--gpus-per-node", "1")


def _plain_grid(max_bs: int) -> list[int]:
    """SGLang's plain decode grid (cuda_graph_hook.py), written out from the source."""
    grid = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    return [b for b in grid if b <= max_bs] + ([max_bs] if max_bs not in grid else [])


def _spec_grid(max_bs: int) -> list[int]:
    """SGLang's speculative decode grid (cuda_graph_hook.py), written out from the source."""
    grid = [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8), *range(272, max_bs + 1, 16)]
    return [b for b in grid if b <= max_bs] + ([max_bs] if max_bs not in grid else [])


def _sglang_by_hand(ns, hbm_gib: float, speculative: bool) -> list[int]:
    """SGLang's captured decode sizes of one attention rank for the parsed launch line `ns` on a GPU of `hbm_gib`."""
    assert 60 <= hbm_gib < 160  # memory_hook.py's H100/H200 rows
    tp_size, attn_dp = int(ns.tp_size), int(ns.attn_dp_size or 1)
    requests = int(ns.max_running_requests)
    max_bs = min(256 if tp_size < 4 else 512, requests)  # default max_bs, cut to --max-running-requests
    listed = _spec_grid(max_bs) if speculative else _plain_grid(max_bs)
    pool = requests // attn_dp
    align = (2 if ns.enable_two_batch_overlap else 1) * (tp_size // attn_dp)
    width = int(ns.speculative_num_draft_tokens) if speculative and not ns.enable_two_batch_overlap else 1
    top = -(-pool // align) * align
    if max(listed) > top:
        listed.append(top)
    return sorted({b for b in listed if b <= top and b * width % align == 0})


def _export(cli, tmp_path: Path, args: tuple[str, ...], target: str) -> tuple[dict, object]:
    """The estimate's JSON and the parsed launch line of `target` for the plan of `args`."""
    plan = tmp_path / "plan.json"
    assert cli("estimate", *args, "--save", plan).code == 0
    assert cli("export", plan, "--to", target, "-o", tmp_path / "out").code == 0
    text = unwrapped((tmp_path / "out" / f"{target}_serve.sh").read_text())
    return cli("estimate", *args, "--json").json(), parsed(text, target)


def _h100() -> float:
    return builtin_systems()["dgx-h100"].gpu.hbm_gib


def test_dp_attention_captures_at_the_instances_tp_size(cli, tmp_path):
    """DP attention over 8 GPUs: SGLang's --tp-size is 8, so its default max_bs is 512 (not tp 1's 256) and each
    rank's pool of 300 is captured exactly; before, llmplan took max_bs at the attention TP (256) and priced a batch
    of 300 as eager."""
    d, ns = _export(cli, tmp_path, DPA, "sglang")
    assert (int(ns.tp_size), int(ns.attn_dp_size), int(ns.max_running_requests)) == (8, 8, 2400)
    by_hand = _sglang_by_hand(ns, _h100(), speculative=False)
    assert by_hand[-3:] == [272, 288, 300] and by_hand[0] == 1
    assert d["workload"]["cuda_graph_batch_sizes"] == by_hand
    assert (d["decode_graph_batch"], d["decode_graph_eager"]) == (300, False)


def test_two_batch_overlap_keeps_even_sizes(cli, tmp_path):
    """--enable-two-batch-overlap doubles the runner's alignment: odd sizes are not captured (a batch of 1 replays 2)."""
    d, ns = _export(cli, tmp_path, (*DPA, "--two-batch-overlap", "--moe-dispatcher", "deepep"), "sglang")
    assert ns.enable_two_batch_overlap
    by_hand = _sglang_by_hand(ns, _h100(), speculative=False)
    assert by_hand[0] == 2 and all(b % 2 == 0 for b in by_hand)
    assert d["workload"]["cuda_graph_batch_sizes"] == by_hand


def test_sglang_speculative_grid_under_dp_attention(cli, tmp_path):
    """EAGLE with 3 draft tokens: SGLang captures its speculative grid (1-8 every 1, ... every 8 to 256, then every
    16), each graph a verification of 4 tokens a request; before, llmplan priced SGLang's speculative decode unpadded."""
    d, ns = _export(cli, tmp_path, (*DPA, "--speculative", "eagle", "--spec-tokens", "3"), "sglang")
    assert (ns.speculative_algorithm, int(ns.speculative_num_draft_tokens)) == ("EAGLE", 4)
    by_hand = _sglang_by_hand(ns, _h100(), speculative=True)
    assert by_hand[:10] == [1, 2, 3, 4, 5, 6, 7, 8, 10, 12] and by_hand[-3:] == [272, 288, 300]
    assert d["workload"]["cuda_graph_batch_sizes"] == by_hand


def test_sglang_speculative_pads_a_verification_to_the_grid(cli, tmp_path):
    """One H100, tp 1 (max_bs 256), a pool of 64 requests and EAGLE with 3 draft tokens: the grid up to 64. Given
    as --cuda-graph-sizes to a server of 61 requests, the runner rounds the pool 61 up to the alignment 1 (61),
    adds it since the list reaches above it (64 > 61) and drops 64: a verification of 61 requests is captured
    exactly, 61 x 4 = 244 tokens (the list kept as given padded it to 64, 256 tokens)."""
    args = (*ONE_H100, "--engine", "sglang", "--speculative", "eagle", "--spec-tokens", "3")
    d, ns = _export(cli, tmp_path, (*args, "--batch", "64"), "sglang")
    by_hand = _sglang_by_hand(ns, _h100(), speculative=True)
    assert by_hand[-4:] == [52, 56, 60, 64] and d["workload"]["cuda_graph_batch_sizes"] == by_hand
    given = ("--engine", "sglang", "--speculative", "eagle", "--spec-tokens", "3", "--batch", "61",
             "--cuda-graph-sizes", ",".join(map(str, by_hand)), "--json")
    r = cli("estimate", *ONE_H100, *given).json()
    assert (r["decode_graph_batch"], r["decode_graph_tokens"], r["decode_graph_eager"]) == (61, 244, False)


def test_vllm_speculative_capture_list_by_hand(cli, tmp_path):
    """vLLM, one H100, EAGLE with 3 draft tokens, max_num_seqs 61: ceiling min(2 x 61 x 4, 512) = 488 tokens; the
    grid 1, 2, 4, every 8 to 248, every 16 from 256 to 480, and the uniform decode sizes 4 x n for the request counts
    n (1, 2, 4, every 8 to 56, and 61 itself); rounded up to multiples of 4 for the FULL decode graphs. A
    verification of 61 requests is 244 tokens, captured exactly."""
    args = (*ONE_H100, "--engine", "vllm", "--speculative", "eagle", "--spec-tokens", "3", "--batch", "61")
    d, ns = _export(cli, tmp_path, args, "vllm")
    config = json.loads(ns.speculative_config.strip("'"))
    q, seqs, tokens = 1 + config["num_speculative_tokens"], int(ns.max_num_seqs), int(ns.max_num_batched_tokens)
    cap = min(2 * seqs * q, 512, tokens)
    grid = {b for b in (1, 2, 4) if b <= cap} | set(range(8, min(cap + 1, 256), 8)) | set(range(256, cap + 1, 16))
    counts = {1, 2, 4} | set(range(8, min(seqs + 1, 256), 8)) | {seqs}
    listed = sorted(grid | {n * q for n in counts if n * q <= cap})
    assert d["workload"]["cuda_graph_batch_sizes"] == listed
    fitted = sorted({-(-b // q) * q for b in listed if -(-b // q) * q <= max(listed)})
    assert 244 in fitted and max(fitted) == 480
    assert (d["decode_graph_batch"], d["decode_graph_tokens"], d["decode_graph_eager"]) == (61, 244, False)
    assert re.search(r"--speculative-config", unwrapped((tmp_path / "out" / "vllm_serve.sh").read_text()))


def _runner_by_hand(listed: list[int], ns) -> list[int]:
    """SGLang 0.5.23's get_batch_sizes_to_capture on a user's --cuda-graph-bs-decode `listed` for the parsed
    launch line `ns` (no speculation): pool = --max-running-requests // --attn-dp-size, alignment 2 with
    --enable-two-batch-overlap times the attention TP size (--tp-size // --attn-dp-size), N = the pool rounded up
    to it, N added when the list reaches above it, then the sizes <= N on the alignment."""
    pool = int(ns.max_running_requests) // int(ns.attn_dp_size or 1)
    align = (2 if ns.enable_two_batch_overlap else 1) * (int(ns.tp_size) // int(ns.attn_dp_size or 1))
    top = -(-pool // align) * align
    out = listed + ([top] if max(listed) > top else [])
    return sorted({b for b in out if b <= top and b % align == 0})


TBO = (*DPA, "--two-batch-overlap", "--moe-dispatcher", "deepep")


def test_a_users_list_goes_through_sglangs_runner_rule(cli, tmp_path):
    """Two-batch overlap doubles the alignment (2): of a user's 1, 3, 8, 150, 299, 320 SGLang drops the odd sizes,
    adds the pool 300 (the list reaches 320 > 300) and drops 320: 8, 150, 300. The batch of 300 is captured
    exactly (the list kept as given padded it to 320). The export writes the list as given and says what SGLang
    captures of it."""
    listed = [1, 3, 8, 150, 299, 320]
    d, ns = _export(cli, tmp_path, (*TBO, "--cuda-graph-sizes", ",".join(map(str, listed))), "sglang")
    assert [int(b) for b in ns.cuda_graph_bs_decode] == listed  # as given
    by_hand = _runner_by_hand(listed, ns)
    assert by_hand == [8, 150, 300]
    assert d["workload"]["cuda_graph_batch_sizes"] == listed and d["workload"]["cuda_graph_sizes_default"] is False
    assert (d["decode_graph_batch"], d["decode_graph_tokens"], d["decode_graph_eager"]) == (300, 300, False)
    text = unwrapped((tmp_path / "out" / "sglang_serve.sh").read_text())
    assert "# --cuda-graph-bs-decode: as given; SGLang's runner captures 8 150 300 of it for 300 running" in text


def test_a_users_size_off_the_alignment_runs_eagerly(cli, tmp_path):
    """The same server at 7 requests per rank with 2, 5, 7: the pool 7 rounds up to 8, the list does not reach
    above it (7 < 8), and 5 and 7 are odd: only 2 is captured, so the batch of 7 runs without a graph (the list
    kept as given captured it)."""
    args = ("--mode", "infer", "-m", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--tp", "1", "--dp", "8", "--ep", "8",
            "--dp-attention", "--engine", "sglang", "--batch", "7", "--two-batch-overlap", "--moe-dispatcher", "deepep")
    d, ns = _export(cli, tmp_path, (*args, "--cuda-graph-sizes", "2,5,7"), "sglang")
    assert (int(ns.max_running_requests), int(ns.attn_dp_size)) == (56, 8)
    assert _runner_by_hand([2, 5, 7], ns) == [2]
    assert (d["decode_graph_batch"], d["decode_graph_eager"]) == (7, True)
    # eager: the same step as a server without decode graphs
    plain = cli("estimate", *args, "--no-cuda-graphs", "--json").json()
    assert d["tpot_s"] == pytest.approx(plain["tpot_s"], rel=1e-12)


def test_a_users_list_sglang_keeps_none_of_is_refused(cli, tmp_path):
    """The same server at 7 requests per rank with 3, 5, 7: the pool 7 rounds up to 8 (alignment 2, two-batch
    overlap), the list does not reach above it and every size is odd, so SGLang's runner keeps none and SGLang
    refuses to start (get_batch_sizes_to_capture). estimate and export refuse in one line naming the even sizes up
    to 8 it keeps; search prunes the layout by the same rule."""
    args = ("--mode", "infer", "-m", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--tp", "1", "--dp", "8", "--ep", "8",
            "--dp-attention", "--engine", "sglang", "--batch", "7", "--two-batch-overlap", "--moe-dispatcher", "deepep")
    r = cli("estimate", *args, "--cuda-graph-sizes", "3,5,7")
    assert r.code == 2 and "Traceback" not in (r.out + r.err)
    assert "keeps none of --cuda-graph-sizes 3,5,7" in (r.out + r.err) and "(2, 4, 6, 8)" in (r.out + r.err)
    assert "--no-cuda-graphs" in (r.out + r.err)
    assert cli("estimate", *args, "--cuda-graph-sizes", "2,5,7").code == 0  # 2 kept: runs, priced eager at 7
    plan = tmp_path / "plan.json"
    assert cli("estimate", *args, "--cuda-graph-sizes", "2,5,7", "--save", plan).code == 0
    doc = json.loads(plan.read_text())
    doc["job"]["cuda_graph_batch_sizes"] = [3, 5, 7]
    plan.write_text(json.dumps(doc))
    r = cli("export", plan, "--to", "sglang", "-o", tmp_path / "out")
    assert r.code == 2 and "keeps none of --cuda-graph-sizes 3,5,7" in (r.out + r.err)
    assert not (tmp_path / "out" / "sglang_serve.sh").exists()
    s = cli("search", "--mode", "infer", "-m", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--dp-attention",
            "--engine", "sglang", "--max-batch", "7", "--two-batch-overlap", "--cuda-graph-sizes", "3,5,7")
    assert s.code == 3 and "sglang_graph_sizes" in (s.out + s.err)  # every layout pruned: search's "nothing fits"
