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
    """One H100, tp 1 (max_bs 256), a pool of 64 requests and EAGLE with 3 draft tokens: the grid up to 64. A
    verification of 61 requests pads to 64 (the next grid size: 60, 64), each carrying 4 tokens."""
    args = (*ONE_H100, "--engine", "sglang", "--speculative", "eagle", "--spec-tokens", "3")
    d, ns = _export(cli, tmp_path, (*args, "--batch", "64"), "sglang")
    by_hand = _sglang_by_hand(ns, _h100(), speculative=True)
    assert by_hand[-4:] == [52, 56, 60, 64] and d["workload"]["cuda_graph_batch_sizes"] == by_hand
    r = cli("estimate", *args, "--batch", "61", "--cuda-graph-sizes", ",".join(map(str, by_hand)), "--json").json()
    assert (r["decode_graph_batch"], r["decode_graph_tokens"], r["decode_graph_eager"]) == (64, 256, False)


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
