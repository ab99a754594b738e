"""vLLM's default captured CUDA graph sizes (cost.serve_step.vllm_graph_sizes, default_graph_sizes;
docs/formulas.md#infer.graph_padding). Expected lists are written out by hand from the source's rule:
vLLM vllm/config/vllm.py @000fc94b754f66aeb60ef5acf1ea2e94cdc65164 (_set_cudagraph_sizes). SGLang gets none:
its default depends on GPU memory and TP and was not pinned at one upstream commit."""

from __future__ import annotations

from llmplan.cost.serve_step import (
    default_graph_sizes,
    graph_padded_rows,
    vllm_graph_sizes,
)

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


def test_default_graph_sizes_per_engine_and_the_padding():
    assert default_graph_sizes("vllm", 64, 8192) == vllm_graph_sizes(64, 8192)
    assert default_graph_sizes("sglang", 1000, 8192) is None
    assert graph_padded_rows(50, default_graph_sizes("vllm", 64, 8192)) == 56
    assert graph_padded_rows(600, default_graph_sizes("vllm", 300, 8192)) == 600  # above 512: eager, unpadded
