"""TensorRT-LLM's CUDA-graph padding of decode steps (cost.serve_step.graph_padded_rows,
ServeJob.cuda_graph_batch_sizes) and the trtllm-bench limits that decide the captured sizes
(benchmarks/accuracy.py trtllm_bench_limits; cost.serve_step.trtllm_graph_sizes): docs/validation.md#trtllm-long-decode."""

from __future__ import annotations

import accuracy
import numpy as np
import pytest

from llmplan.cost.inference import decode_tpot
from llmplan.cost.serve_step import (
    TRTLLM_GRAPH_BATCH_SIZES, default_graph_sizes, graph_padded_rows, tp_allreduce_seconds, trtllm_graph_sizes,
)
from llmplan.serving import replica_spans
from llmplan.specs.plan import ClusterSpec
from llmplan.specs.registry import builtin_models, builtin_systems
from llmplan.specs.serve import ServeJob, ServePlan

PERF_LIST = (1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 1024, 2048, 4096, 8192)
LONG_405B = "trtllm-perf-llama3.1-405b-h100-tp8-128-4096"


def test_padded_rows_round_up_to_the_next_captured_size():
    sizes = (1, 2, 4, 128, 256)
    assert graph_padded_rows(206, sizes) == 256.0
    assert graph_padded_rows(256, sizes) == 256.0  # a captured size is not padded
    assert graph_padded_rows(300, sizes) == 300  # above every size: no graph, the real rows
    assert graph_padded_rows(206, None) == 206
    assert list(graph_padded_rows(np.array([3.0, 129.0, 400.0]), sizes)) == [4.0, 256.0, 400.0]


def test_trtllm_bench_limits_for_405b_tp8_by_hand(published_runs):
    # tuning.py at 04cba882 by hand, 405B FP8 on 8 H100 (79.2 GiB each), 128/4096, fraction 0.9:
    # (8 x 79.2 - 405e9 / 2^30) x 0.9 = 230.8 GiB; 2 x 126 x 8 x 128 bytes a token x 4224 tokens = 1.015 GiB;
    # 227 requests -> max_bs 32 x ceil(227 / 32) = 256; tokens 227 x (1 + 128 / 4096) -> 2048 >= 128 + 256
    m = accuracy.model_for(published_runs[LONG_405B], "trtllm")
    gpu = builtin_systems()["dgx-h100"].gpu
    max_bs, max_tokens = accuracy.trtllm_bench_limits(m, 8, 1, 128, 4096, gpu.hbm_bytes, 0.9)
    assert (max_bs, max_tokens) == (256, 2048)
    # model_engine._filter_cuda_graph_batch_sizes: the list up to min(256, 2048)
    assert trtllm_graph_sizes(PERF_LIST, max_bs, max_tokens) == (1, 2, 4, 8, 16, 32, 64, 128, 256)
    # a bound between listed sizes is kept as the last size (padding to it rather than past it)
    assert trtllm_graph_sizes(PERF_LIST, 896, 2048)[-2:] == (512, 896)


def test_padding_reaches_the_all_reduce_not_the_matmuls_or_kv_reads():
    m = builtin_models()["llama-3.1-405b"]
    system = builtin_systems()["dgx-h100"]
    plan = ServePlan(tp=8, weight_dtype="fp8", kv_dtype="fp8")
    spans = replica_spans(plan, ClusterSpec(system=system, num_nodes=1, gpus_per_node=8))
    plain = decode_tpot(m, plan, system, spans, 206, 2176, engine="trtllm")
    padded = decode_tpot(m, plan, system, spans, 206, 2176, engine="trtllm", graph_sizes=(128, 256))
    full = decode_tpot(m, plan, system, spans, 256, 2176, engine="trtllm")
    # 206 x 16384 x 2 = 6.75 MB fits TensorRT-LLM's 8e6-byte all-reduce workspace at TP8, 256 rows (8.39 MB)
    # go to NCCL: 252 all-reduces a step cost more; the matmuls and the 206 sequences' KV reads do not
    ar = 2 * m.num_hidden_layers * (tp_allreduce_seconds(system, spans.tp, 2.0 * m.hidden_size * 256, "trtllm")
                                    - tp_allreduce_seconds(system, spans.tp, 2.0 * m.hidden_size * 206, "trtllm"))
    assert ar > 0 and plain + ar < padded < full
    off = ServeJob(cuda_graph_batch_sizes=(128, 256), cuda_graphs=False)
    assert off.decode_graph_sizes is None  # eager steps are not padded


# Golden: TensorRT-LLM perf overview (docs/source/performance/perf-overview.md at 00f37686), H100 SXM, FP8,
# trtllm-bench throughput, Total Output Throughput: Qwen3-235B-A22B TP8 EP8 128/2048 19,658 tokens/s and
# Llama-3.1-405B TP8 128/2048 4,340 (10%: priced at the real rows they read +15.4% and +11.2%); 405B 128/4096
# 3,116 within the 20% of the other trtllm golden rows (tests/test_inference.py; unpadded it reads +41.3%).
@pytest.mark.parametrize("record,tol", [("trtllm-perf-qwen3-235b-a22b-h100-tp8-128-2048", 0.10),
                                        ("trtllm-perf-llama3.1-405b-h100-tp8-128-2048", 0.10),
                                        (LONG_405B, 0.20)])
def test_long_decode_rows_with_graph_padding(published_runs, monkeypatch, record, tol):
    rec = published_runs[record]
    (_, pred, meas), = accuracy.predict_serving(rec)
    assert pred == pytest.approx(meas, rel=tol)
    monkeypatch.setattr(accuracy, "TRTLLM_GRAPH_PADDING", False)
    (_, unpadded, _), = accuracy.predict_serving(rec)
    assert unpadded > meas * (1 + tol)  # the padded all-reduce is what moves it


def test_the_moved_rule_keeps_the_perf_overview_list_and_the_other_engines_their_own():
    # The list is the perf overview's llm_options.yml (PERF_LIST above, typed from the page); vLLM and SGLang get
    # vLLM its own default list (tests/test_engine_graph_sizes.py: ceiling min(2 x 896, 512, 2048) = 512), SGLang
    # none (not pinned at one upstream commit).
    assert TRTLLM_GRAPH_BATCH_SIZES == PERF_LIST
    assert default_graph_sizes("trtllm", 896, 2048) == trtllm_graph_sizes(PERF_LIST, 896, 2048)
    assert default_graph_sizes("vllm", 896, 2048)[-3:] == (480, 496, 512)
    assert default_graph_sizes("sglang", 896, 2048)[-1] == 160  # SGLang's own fallback, GPU memory unknown
