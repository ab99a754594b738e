"""SGLang's default --mem-fraction-static (cost.serve_memory.sglang_mem_fraction_static, docs/formulas.md#infer.capacity):
SGLang 0.5.23 derives it from the GPU's memory, tp_size x pp_size, the chunked-prefill size and its CUDA graphs
(python/sglang/srt/arg_groups/memory_hook.py, handle_gpu_memory_settings and reserve_for_graph_mb). Expected
values are a published SGLang log line, or worked by hand from the source's constants and thresholds:
reserve R = 512 + 1.5 x max(chunked prefill, 2,048) + tp x pp / 8 x 1,024 + graphs (MiB), at least 10 GiB on a GPU
above 60 GiB, + 2 GiB for DeepEP under decode graphs; fraction round((G - R) / G, 3)."""

from __future__ import annotations

import re

from exported import unwrapped

from llmplan.cost.serve_memory import (
    SglangServer,
    sglang_mem_fraction_static,
    sglang_prefill_graph_sizes,
    sglang_server_of,
)
from llmplan.serving import estimate_serving
from llmplan.specs.plan import ClusterSpec
from llmplan.specs.registry import builtin_models, builtin_systems
from llmplan.specs.serve import ServeJob, ServePlan

M = builtin_models()
S = builtin_systems()
MIB = 2**20


def _f(gpu_mib: float, **kw) -> float:
    return sglang_mem_fraction_static(SglangServer(gpu_mem_bytes=gpu_mib * MIB, **kw))


def test_h100_default_against_the_published_sglang_docs_log():
    # Published: SGLang's documentation build of 2026-03-03 (wxsms/sgl-project.github.io @000c89824a95,
    # _sources/basic_usage/offline_engine_api.ipynb, the Engine's "server_args=ServerArgs(...)" line): an H100 (fa3,
    # the Hopper default attention backend), tp_size=1, pp_size=1, chunked_prefill_size=8192, decode graphs to 256,
    # piecewise prefill graphs on over the 58 token counts it lists, no --mem-fraction-static given:
    # "mem_fraction_static=0.83". llmplan's estimate on one DGX H100 GPU: 0.829. Tolerance 0.001: SGLang divides
    # by nvidia-smi's memory.total, a little more than the deviceQuery total llmplan's hbm_gib (79.2 GiB) holds.
    assert sglang_prefill_graph_sizes(8192) == 58  # the log's piecewise_cuda_graph_tokens: 4 ... 8192, 58 of them
    cluster = ClusterSpec(system=S["dgx-h100"], num_nodes=1, gpus_per_node=1)
    # The log's capture list runs to 256: a batch (the export's --max-running-requests) of 256 leaves 0.5.23's
    # default max_bs uncut (a smaller one cuts it: test_a_running_request_cap_cuts_the_decode_graph_reserve).
    e = estimate_serving(M["llama-3.1-8b"], cluster, ServePlan(tp=1), ServeJob(engine="sglang", batch=256))
    assert e.job.memory_fraction_default
    assert round(abs(e.job.gpu_memory_utilization - 0.83), 9) <= 0.001
    # The rule without the prefill graphs' 8 MiB per size (1 - 13,440 / 81,100.8 = 0.834) misses it, as did
    # llmplan's former constant 0.9.
    assert abs(_f(81_100.8, chunked_prefill_size=8192, decode_graph_max_bs=256) - 0.83) > 0.001


def test_the_rule_by_hand_at_the_sources_thresholds():
    # 60 GiB: above it the reserve is at least 10,240 MiB (gpu_mem > 60 x 1,024). Chunk 2,048, no graphs, tp 1:
    # 512 + 3,072 + 128 = 3,712 MiB.
    assert _f(81_920, chunked_prefill_size=2048) == 0.875  # 1 - 10,240 / 81,920
    assert _f(61_441, chunked_prefill_size=2048) == 0.833  # 1 - 10,240 / 61,441 = 0.83334
    assert _f(61_440, chunked_prefill_size=2048) == 0.94  # not above 60 GiB: 1 - 3,712 / 61,440 = 0.93958
    assert _f(49_152, chunked_prefill_size=2048) == 0.924  # 1 - 3,712 / 49,152 = 0.92448
    # The activation floor of 2,048 tokens: a chunk of 1,024 reserves as much as 2,048.
    assert _f(49_152, chunked_prefill_size=1024) == 0.924
    # tp x pp / 8 x 1,024: tp 8 x pp 2 on 141 GiB, chunk 8,192: 512 + 12,288 + 2,048 = 14,848 -> 0.89716.
    assert _f(144_384, tp_size=8, pp_size=2, chunked_prefill_size=8192) == 0.897
    # MLA prefill graphs reserve a flat 1.5 GiB: 80 GiB, tp 8, decode graphs to 512:
    # 512 + 12,288 + 1,024 + 2 x 512 + 1,536 = 16,384 -> 0.8.
    assert _f(81_920, tp_size=8, chunked_prefill_size=8192, decode_graph_max_bs=512, prefill_graph_max_tokens=8192,
              mla=True) == 0.8
    # Other models: 8 MiB per captured prefill size (58 up to 8,192): 512 + 12,288 + 1,024 + 1,024 + 464 = 15,312.
    assert _f(81_920, tp_size=8, chunked_prefill_size=8192, decode_graph_max_bs=512,
              prefill_graph_max_tokens=8192) == 0.813  # 1 - 15,312 / 81,920 = 0.81309


def test_dp_attention_deepep_and_disaggregation_by_hand():
    # DP attention: 3 MiB per decode-graph request per attention rank, 1.5 more above max_bs 300. 80 GiB, tp 8,
    # 8 attention ranks, chunk 8,192, no prefill graphs:
    # max_bs 512: 512 + 12,288 + 1,024 + 1,024 + 512 x 8 x 3 + 512 x 8 x 1.5 = 33,280 -> 0.59375;
    # max_bs 256: 512 + 12,288 + 1,024 + 512 + 256 x 8 x 3 = 20,480 -> 0.75.
    dp = {"gpu_mem_bytes": 81_920 * MIB, "tp_size": 8, "chunked_prefill_size": 8192, "attn_dp_size": 8}
    assert sglang_mem_fraction_static(SglangServer(**dp, decode_graph_max_bs=512)) == 0.594
    assert sglang_mem_fraction_static(SglangServer(**dp, decode_graph_max_bs=256)) == 0.75
    # DeepEP: 2 GiB on top of the 10 GiB floor under decode graphs: 1 - 12,288 / 81,920 = 0.85; none without.
    assert _f(81_920, chunked_prefill_size=2048, decode_graph_max_bs=8, deepep=True) == 0.85
    assert _f(81_920, chunked_prefill_size=2048, deepep=True) == 0.875
    # A decode server's activation tokens: max(max_bs x draft tokens, 2,048), no prefill-graph reserve; 48 GiB,
    # max_bs 512, 8 draft tokens: 512 + 1.5 x 4,096 + 128 + 1,024 = 7,808 -> 0.84115.
    assert _f(49_152, chunked_prefill_size=8192, decode_graph_max_bs=512, prefill_graph_max_tokens=8192,
              phase="decode", draft_tokens=8) == 0.841
    # SGLang reads --max-running-requests first (memory_hook.py: max_running_requests or the decode max_bs): a decode
    # server of 1,024 running requests and 4 draft tokens: 512 + 1.5 x 4,096 + 128 + 1,024 = 7,808 -> 0.841 too,
    # and 2,048 of them: 512 + 1.5 x 8,192 + 128 + 1,024 = 13,952 -> 0.71615.
    assert _f(49_152, decode_graph_max_bs=512, max_running_requests=1024, phase="decode", draft_tokens=4) == 0.841
    assert _f(49_152, decode_graph_max_bs=512, max_running_requests=2048, phase="decode", draft_tokens=4) == 0.716
    # DP attention with decode graphs off: no 2 MiB per request, no DeepEP buffers, but the DP term stays:
    # 80 GiB, tp 8, 8 ranks, max_bs 256: 512 + 12,288 + 1,024 + 256 x 8 x 3 = 19,968 -> 0.75625.
    dp_off = {**dp, "decode_graph_max_bs": 256, "decode_graphs": False, "deepep": True}
    assert sglang_mem_fraction_static(SglangServer(**dp_off)) == 0.756
    # A prefill server keeps no decode-graph reserve: 512 + 12,288 + 128 + 58 x 8 = 13,392 -> 0.72754.
    assert _f(49_152, chunked_prefill_size=8192, decode_graph_max_bs=32, prefill_graph_max_tokens=8192,
              phase="prefill") == 0.728


def test_the_server_llmplans_export_launches():
    # --tp-size tp x dp and --chunked-prefill-size x dp under DP attention (export/serve.py); decode graphs at
    # SGLang's max_bs for that tp-size (512 at tp >= 4 on an H100); prefill graphs off with pipeline parallelism,
    # on an AMD GPU (not CUDA) and with --no-cuda-graphs; the user's capture sizes give their largest.
    dsv3, h100 = M["deepseek-v3"], S["dgx-h100"].gpu
    job = ServeJob(engine="sglang", max_num_batched_tokens=4096)
    s = sglang_server_of(dsv3, ServePlan(tp=1, dp=8, ep=8, dp_attention=True), job, h100)
    assert (s.tp_size, s.chunked_prefill_size, s.attn_dp_size, s.decode_graph_max_bs, s.mla) == (8, 32768, 8, 512, True)
    llama = M["llama-3.1-8b"]
    assert sglang_server_of(llama, ServePlan(tp=1, pp=2), job, h100).prefill_graph_max_tokens is None
    assert sglang_server_of(llama, ServePlan(tp=1), job, h100).prefill_graph_max_tokens == 4096
    assert sglang_server_of(llama, ServePlan(tp=1), job, S["mi300x-8"].gpu).prefill_graph_max_tokens is None
    eager = sglang_server_of(llama, ServePlan(tp=1), job.model_copy(update={"cuda_graphs": False}), h100)
    # --no-cuda-graphs: no graphs captured, but SGLang still resolves the decode max_bs (256 on an H100 at tp-size 1,
    # cut to --max-running-requests 64: memory_hook.py handle_gpu_memory_settings reads no backend), which its
    # DP-attention reserve reads (reserve_for_graph_mb); --max-running-requests is the batch x the attention ranks
    assert not eager.decode_graphs and eager.decode_graph_max_bs == 64 and eager.prefill_graph_max_tokens is None
    assert (s.max_running_requests, eager.max_running_requests) == (8 * job.batch, job.batch)
    mine = job.model_copy(update={"cuda_graph_batch_sizes": (1, 8, 96), "cuda_graph_sizes_default": False})
    assert sglang_server_of(llama, ServePlan(tp=1), mine, h100).decode_graph_max_bs == 96


def test_a_given_fraction_wins_and_a_saved_default_is_derived_again():
    cluster = ClusterSpec(system=S["dgx-h100"], num_nodes=1, gpus_per_node=1)
    m = M["llama-3.1-8b"]
    given = estimate_serving(m, cluster, ServePlan(tp=1), ServeJob(engine="sglang", gpu_memory_utilization=0.9))
    assert given.job.gpu_memory_utilization == 0.9 and not given.job.memory_fraction_default
    # A plan file saves the derived value with the flag: read back, it is derived again (even where it was <= 0).
    saved = ServeJob.model_validate({"engine": "sglang", "gpu_memory_utilization": -1.2, "memory_fraction_default": True})
    # (0.833 at the default batch of 64: test_each_engines_default_memory_fraction, by hand)
    assert estimate_serving(m, cluster, ServePlan(tp=1), saved).job.gpu_memory_utilization == 0.833
    # A plan file saved before the rule (0.9, no flag) keeps its 0.9.
    old = ServeJob.model_validate({"engine": "sglang", "gpu_memory_utilization": 0.9})
    assert estimate_serving(m, cluster, ServePlan(tp=1), old).job.gpu_memory_utilization == 0.9


def test_a_default_that_leaves_sglang_nothing_is_said():
    # 72 attention-DP ranks at SGLang's max_bs 512: the graph reserve alone (512 x 72 x 4.5 MiB) exceeds an H100.
    cluster = ClusterSpec(system=S["dgx-h100"], num_nodes=9, gpus_per_node=8)
    plan = ServePlan(tp=1, dp=72, ep=72, weight_dtype="fp8", dp_attention=True, phase="decode",
                     redundant_experts=32)
    e = estimate_serving(M["deepseek-v3"], cluster, plan, ServeJob(engine="sglang", input_len=2000, output_len=100))
    assert e.job.gpu_memory_utilization < 0 and not e.memory.fits
    assert any("would not start" in w and "--memory-fraction" in w for w in e.warnings)


def test_sglang_export_writes_the_fraction_it_was_priced_with(cli, tmp_path):
    base = ("estimate", "--mode", "infer", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--gpus-per-node", "1",
            "--engine", "sglang", "--batch", "64")
    for extra, fraction, said in (((), 0.833, True), (("--memory-fraction", "0.85"), 0.85, False)):
        plan = tmp_path / f"plan{len(extra)}.json"
        assert cli(*base, *extra, "--save", plan).code == 0
        out = tmp_path / f"out{len(extra)}"
        assert cli("export", plan, "--to", "all", "-o", out).code == 0
        text = (out / "sglang_serve.sh").read_text()
        assert float(re.search(r"--mem-fraction-static ([0-9.]+)", unwrapped(text)).group(1)) == fraction
        assert (f"# --mem-fraction-static {fraction:g}: SGLang 0.5.23's own default" in text) == said
        assert f"its fraction {fraction:g}" in (out / "vllm_serve.sh").read_text()
