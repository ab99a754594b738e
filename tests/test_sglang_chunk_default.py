"""SGLang's own default chunked-prefill size and decode CUDA-graph max_bs (docs/formulas.md#infer.sglang_chunk),
and the SGLang export's flags checked against SGLang 0.5.23. Source: the PyPI wheel sglang-0.5.23
(sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl), python/sglang/srt/arg_groups/memory_hook.py,
handle_gpu_memory_settings: with gpu_mem in MiB, chunked_prefill_size 2,048 below 20 x 1,024, 4,096 below 35 x 1,024
and below 60 x 1,024, 8,192 below 90 x 1,024 and below 160 x 1,024, else 16,384 (4,096 when the memory is unknown),
no TP or model term; the decode max_bs (8; 48 / 160; 32 / 160; 256 / 512; 256 / 512; 512 by the same rows, the
second value from tp_size 4) is cut to a given --max-running-requests when it is the default. Under DP attention
arg_groups/parallel_hook.py, handle_data_parallelism (after the memory hook) gives each attention rank
chunked_prefill_size // attn_dp_size. Expected values are these rows, or worked by hand from them."""

from __future__ import annotations

import pytest
from exported import unwrapped
from test_export import command_argv, recorded_parser

from llmplan.cost.serve_memory import sglang_chunked_prefill_size, sglang_server_of
from llmplan.cost.serve_step import sglang_graph_max_bs
from llmplan.serving import estimate_serving
from llmplan.specs.plan import ClusterSpec
from llmplan.specs.registry import builtin_models, builtin_systems
from llmplan.specs.serve import ServeJob, ServePlan

M = builtin_models()
S = builtin_systems()
GIB = 2**30


@pytest.mark.parametrize("gib,tokens", [
    (16, 2048), (19.99, 2048), (20, 4096), (34.99, 4096), (35, 4096), (59.99, 4096), (60, 8192), (89.99, 8192),
    (90, 8192), (159.99, 8192), (160, 16384), (288, 16384)])
def test_the_default_chunk_at_the_sources_thresholds(gib, tokens):
    assert sglang_chunked_prefill_size(gib * GIB) == tokens


def test_unknown_memory_and_the_decode_max_bs_rows():
    assert sglang_chunked_prefill_size(None) == 4096
    # decode max_bs by the same rows (tp < 4, tp >= 4)
    for gib, small, large in ((19.99, 8, 8), (20, 48, 160), (35, 32, 160), (60, 256, 512), (90, 256, 512),
                              (160, 512, 512)):
        assert (sglang_graph_max_bs(gib * GIB, 3), sglang_graph_max_bs(gib * GIB, 4)) == (small, large)


def _estimate(system: str, job: ServeJob, plan: ServePlan | None = None, model: str = "llama-3.1-8b",
              gpus: int = 1):
    cluster = ClusterSpec(system=S[system], num_nodes=1, gpus_per_node=gpus)
    return estimate_serving(M[model], cluster, plan or ServePlan(tp=1), job)


def test_an_sglang_job_without_a_budget_is_priced_at_sglangs_chunk_for_the_gpu():
    # L40S (45 GiB) 4,096; A100-40GB (39.4 GiB) 4,096; H100 (79.2 GiB) 8,192; B200 (179.1 GiB) 16,384.
    for system, tokens in (("l40s-8", 4096), ("dgx-a100-40gb", 4096), ("dgx-h100", 8192), ("dgx-b200", 16384)):
        e = _estimate(system, ServeJob(engine="sglang"))
        assert e.job.max_num_batched_tokens_default and e.job.max_num_batched_tokens == tokens, system
    # A given budget wins, also the one equal to llmplan's former default.
    e = _estimate("dgx-b200", ServeJob(engine="sglang", max_num_batched_tokens=8192))
    assert not e.job.max_num_batched_tokens_default and e.job.max_num_batched_tokens == 8192


def test_the_chunk_feeds_sglangs_default_memory_fraction_by_hand():
    # L40S, 45 x 1,024 = 46,080 MiB, tp 1, batch 64: chunk 4,096; decode max_bs 32 (35-60 GiB, tp < 4; under the
    # batch); 50 prefill graph sizes up to 4,096 (8 + 14 + 8 + 8 + 12). Reserve 512 + 1.5 x 4,096 + 128 + 2 x 32 +
    # 8 x 50 = 7,248 MiB (no 10 GiB floor at or below 60 GiB): round(1 - 7,248 / 46,080, 3) = 0.843 (0.708 at the
    # former 8,192: 512 + 12,288 + 128 + 64 + 464 = 13,456).
    assert _estimate("l40s-8", ServeJob(engine="sglang")).job.gpu_memory_utilization == 0.843
    # B200, 179.1 x 1,024 = 183,398.4 MiB: chunk 16,384; max_bs 512 cut to the batch of 64; 74 prefill graph sizes
    # (50 + 24 from 4,608 to 16,384 by 512). 512 + 24,576 + 128 + 128 + 592 = 25,936 -> round(0.85858, 3) = 0.859.
    assert _estimate("dgx-b200", ServeJob(engine="sglang")).job.gpu_memory_utilization == 0.859


def test_a_running_request_cap_cuts_the_decode_graph_reserve():
    # 0.5.23 cuts a default decode max_bs above a given --max-running-requests (the export writes the batch, x dp
    # under DP attention) to it; a user's capture list is kept.
    llama, h100 = M["llama-3.1-8b"], S["dgx-h100"].gpu
    for batch, max_bs in ((64, 64), (256, 256), (512, 256)):
        assert sglang_server_of(llama, ServePlan(tp=1), ServeJob(engine="sglang", batch=batch), h100
                                ).decode_graph_max_bs == max_bs
    dsv3 = M["deepseek-v3"]
    dp8 = ServePlan(tp=1, dp=8, ep=8, dp_attention=True)
    assert sglang_server_of(dsv3, dp8, ServeJob(engine="sglang", batch=16), h100).decode_graph_max_bs == 128
    mine = ServeJob(engine="sglang", batch=8, cuda_graph_batch_sizes=(1, 96))
    assert sglang_server_of(llama, ServePlan(tp=1), mine, h100).decode_graph_max_bs == 96


def test_dp_attention_splits_the_default_chunk_over_the_attention_ranks():
    # 8 B200 attention ranks: SGLang's 16,384 for the server, 16,384 // 8 = 2,048 per rank; an explicit budget is
    # per rank (x 8 on the server), as before.
    plan = ServePlan(tp=1, dp=8, ep=8, weight_dtype="fp8", dp_attention=True)
    e = _estimate("dgx-b200", ServeJob(engine="sglang", memory_fraction_default=False, gpu_memory_utilization=0.85),
                  plan, "deepseek-v3", 8)
    assert e.job.max_num_batched_tokens == 2048
    assert sglang_server_of(M["deepseek-v3"], plan, e.job, S["dgx-b200"].gpu).chunked_prefill_size == 16384
    given = ServeJob(engine="sglang", max_num_batched_tokens=4096)
    assert sglang_server_of(M["deepseek-v3"], plan, given, S["dgx-b200"].gpu).chunked_prefill_size == 32768


def test_vllm_and_trtllm_jobs_are_unchanged():
    # Without a budget vLLM and TensorRT-LLM keep 8,192 on every GPU, priced as with an explicit 8,192.
    for engine in ("vllm", "trtllm"):
        for system in ("l40s-8", "dgx-b200"):
            default, given = (_estimate(system, ServeJob(engine=engine, **kw)) for kw in
                              ({}, {"max_num_batched_tokens": 8192}))
            assert default.job.max_num_batched_tokens == 8192 == given.job.max_num_batched_tokens
            assert (default.timing, default.memory) == (given.timing, given.memory)


BASE = ("estimate", "--mode", "infer", "--model", "llama-3.1-8b", "--gpus-per-node", "1", "--batch", "64")


def _export(cli, tmp_path, name: str, *args: str) -> dict[str, str]:
    plan, out = tmp_path / f"{name}.json", tmp_path / name
    r = cli(*BASE, *args, "--save", plan)
    assert r.code == 0, r.err
    r = cli("export", plan, "--to", "all", "-o", out)
    assert r.code == 0, r.err
    return {p.name: p.read_text() for p in out.iterdir()}


def test_the_sglang_export_writes_sglangs_default_chunk_and_an_explicit_one(cli, tmp_path):
    ap, _ = recorded_parser("sglang")
    files = _export(cli, tmp_path, "b200", "--hardware", "dgx-b200", "--engine", "sglang")
    text = unwrapped(files["sglang_serve.sh"])
    ns, unknown = ap.parse_known_args(command_argv(files["sglang_serve.sh"], "python -m sglang.launch_server"))
    assert not unknown and int(ns.chunked_prefill_size) == 16384
    assert "# --chunked-prefill-size 16384: SGLang 0.5.23's own default for b200's 179.1 GiB" in text
    # the vLLM file of the same plan keeps llmplan's 8,192 and says what the plan was priced at
    assert "--max-num-batched-tokens 8192" in files["vllm_serve.sh"]
    assert "SGLang's own default chunk of 16,384" in unwrapped(files["vllm_serve.sh"])
    given = _export(cli, tmp_path, "given", "--hardware", "dgx-b200", "--engine", "sglang",
                    "--max-num-batched-tokens", "8192")
    assert "--chunked-prefill-size 8192" in given["sglang_serve.sh"]
    assert "own default for b200" not in unwrapped(given["sglang_serve.sh"])
    l40s = _export(cli, tmp_path, "l40s", "--hardware", "l40s-8", "--engine", "sglang")
    assert "--chunked-prefill-size 4096" in l40s["sglang_serve.sh"]


def test_no_cuda_graphs_is_written_with_0_5_23s_flags(cli, tmp_path):
    # --disable-cuda-graph is deprecated in 0.5.23 (server_args.py registers it as a DeprecatedStoreTrueAction
    # pointing to --cuda-graph-backend-{decode,prefill}=disabled); --disable-decode-cuda-graph and
    # --disable-prefill-cuda-graph set the same two backends (arg_groups/cuda_graph_hook.py).
    ap, _ = recorded_parser("sglang")
    eager = _export(cli, tmp_path, "eager", "--hardware", "dgx-h100", "--engine", "sglang", "--no-cuda-graphs")
    ns, unknown = ap.parse_known_args(command_argv(eager["sglang_serve.sh"], "python -m sglang.launch_server"))
    assert not unknown and ns.disable_decode_cuda_graph and ns.disable_prefill_cuda_graph
    graphs = _export(cli, tmp_path, "graphs", "--hardware", "dgx-h100", "--engine", "sglang")
    assert "cuda-graph" not in graphs["sglang_serve.sh"]


def test_a_vllm_plans_export_is_unchanged_by_the_rule(cli, tmp_path):
    default = _export(cli, tmp_path, "vd", "--hardware", "dgx-b200", "--engine", "vllm")
    given = _export(cli, tmp_path, "vg", "--hardware", "dgx-b200", "--engine", "vllm", "--max-num-batched-tokens", "8192")
    assert default["vllm_serve.sh"] == given["vllm_serve.sh"]
    assert "--max-num-batched-tokens 8192" in default["vllm_serve.sh"]
    # a vLLM plan exported to SGLang writes the budget it was priced at, not SGLang's default
    assert "--chunked-prefill-size 8192" in default["sglang_serve.sh"]
