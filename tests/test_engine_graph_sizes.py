"""vLLM's and SGLang's default captured CUDA graph sizes (cost.serve_step.vllm_graph_sizes, sglang_max_bs,
sglang_graph_sizes, default_graph_sizes; docs/formulas.md#infer.graph_padding). Expected lists are written out
by hand from the sources' rules:
- vLLM vllm/config/vllm.py @000fc94b754f66aeb60ef5acf1ea2e94cdc65164 (_set_cudagraph_sizes);
- SGLang server_args.py (Fridge003/sglang fork @018c31119d31, _handle_gpu_memory_settings,
  _generate_cuda_graph_batch_sizes) and sgl-project/sglang cuda_graph_runner.py @0021673cd18b
  (get_batch_sizes_to_capture)."""

from __future__ import annotations

import pytest

from llmplan.cost.serve_step import (
    default_graph_sizes,
    graph_padded_rows,
    sglang_graph_sizes,
    sglang_max_bs,
    vllm_graph_sizes,
)

GIB = 2**30


def test_vllm_small_max_num_seqs_caps_at_twice_it():
    # ceiling min(2 x 64, 512, 8192) = 128: [1, 2, 4] then every 8 to 128
    assert vllm_graph_sizes(64, 8192) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128)
    assert vllm_graph_sizes(4, 8192) == (1, 2, 4, 8)  # ceiling 8


def test_vllm_large_max_num_seqs_caps_at_512_with_steps_of_16_above_256():
    s = vllm_graph_sizes(300, 8192)  # ceiling min(600, 512) = 512
    assert s[:4] == (1, 2, 4, 8) and len(s) == 3 + 31 + 17  # [1,2,4], 8..248 by 8, 256..512 by 16
    assert (248, 256, 272) == s[33:36] and s[-1] == 512 and 264 not in s


def test_vllm_adds_max_num_batched_tokens_under_the_ceiling():
    # ceiling min(128, 512, 100) = 100: every 8 to 96, then max_num_batched_tokens 100 itself
    assert vllm_graph_sizes(64, 100) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 100)


@pytest.mark.parametrize("mem_gib, tp, want", [(16, 8, 8), (24, 1, 24), (24, 4, 80), (40, 1, 32), (40, 8, 160),
                                               (80, 1, 256), (80, 4, 512), (141, 2, 256), (141, 8, 512),
                                               (192, 1, 512), (None, 1, 160)])
def test_sglang_cuda_graph_max_bs_follows_gpu_memory_and_tp(mem_gib, tp, want):
    assert sglang_max_bs(None if mem_gib is None else mem_gib * GIB, tp) == want


def test_sglang_default_list():
    # [1, 2, 4, 8, 12] + range(16, 257, 8) at cuda_graph_max_bs 256 (H100, tp < 4), pool above it
    assert sglang_graph_sizes(1000, 256) == (1, 2, 4, 8, 12, *range(16, 257, 8))
    # cuda_graph_max_bs 600: ... 496, then every 32 from 512: 512, 544, 576 (no 600)
    assert sglang_graph_sizes(1000, 600)[-6:] == (464, 480, 496, 512, 544, 576)
    # a 64-request pool below the list's top adds 63 and 64
    assert sglang_graph_sizes(64, 160) == (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 63, 64)


def test_default_graph_sizes_per_engine_and_the_padding():
    assert default_graph_sizes("vllm", 64, 8192) == vllm_graph_sizes(64, 8192)
    assert default_graph_sizes("sglang", 1000, 8192, 80 * GIB, 1) == sglang_graph_sizes(1000, 256)
    assert graph_padded_rows(50, default_graph_sizes("vllm", 64, 8192)) == 56
    assert graph_padded_rows(13, default_graph_sizes("sglang", 1000, 8192, 80 * GIB, 1)) == 16
    assert graph_padded_rows(300, default_graph_sizes("sglang", 1000, 8192, 80 * GIB, 1)) == 300  # eager
