"""vLLM's default CUDA graph capture ceiling: the platform's (1024 on compute capability 10.x, else 512), a
model's own (GPT-OSS 1024), and the speculative factor (sizes count tokens, 1 + k per decode request).
Expected lists are written out by hand from the source's rule (docs/formulas.md#infer.graph_padding):
vllm-project/vllm vllm/config/vllm.py @000fc94b754f66aeb60ef5acf1ea2e94cdc65164, VllmConfig._set_cudagraph_sizes
(default_max_graph_size = 1024 if current_platform.is_device_capability_family(100) else 512;
max_cudagraph_capture_size = min(max_num_seqs * uniform_decode_query_len * 2, default_max_graph_size);
request_counts and uniform_decode_sizes for uniform_decode_query_len > 1) and uniform_decode_query_len
(1 + num_speculative_tokens); vllm/model_executor/models/config.py @1936cf3841edb9781b06c50fc4daf4bac9d3b23e,
GptOssForCausalLMConfig.verify_and_update_config (max_cudagraph_capture_size = 1024 when the user set neither
it nor cudagraph_capture_sizes)."""

from __future__ import annotations

from types import SimpleNamespace

from llmplan.cost.serve_step import (
    GraphHost,
    default_graph_sizes,
    graph_ceiling,
    vllm_graph_sizes,
    vllm_platform_max_capture,
)

GIB = 2**30
GRID_512 = (1, 2, 4, *range(8, 256, 8), *range(256, 513, 16))  # [1, 2, 4] + range(8, 256, 8) + range(256, 513, 16)
GRID_1024 = (1, 2, 4, *range(8, 256, 8), *range(256, 1025, 16))


def test_platform_ceiling_follows_the_compute_capability_family():
    # is_device_capability_family(100): capability.to_int() // 10 == 10, i.e. major 10 (B200 10.0, B300 10.3)
    assert vllm_platform_max_capture(10.0) == 1024 and vllm_platform_max_capture(10.3) == 1024
    assert vllm_platform_max_capture(9.0) == 512  # Hopper
    assert vllm_platform_max_capture(12.0) == 512  # RTX Blackwell is family 120, not 100
    assert vllm_platform_max_capture(None) == 512  # unknown / not CUDA


def test_blackwell_list_reaches_1024():
    # min(2 x 600, 1024, 8192) = 1024: 3 + 31 + 49 = 83 grid sizes (vLLM's GPT-OSS comment: "from 67 to 83"),
    # and vLLM 0.33.0 appends max_num_seqs 600 itself (600 <= 1024; off the 16-step grid: 592, 608): 84 sizes
    assert vllm_graph_sizes(600, 8192, 1024) == tuple(sorted({*GRID_1024, 600})) and len(GRID_1024) == 83
    # elsewhere 512: 600 > 512 is not appended (and runs eagerly)
    assert vllm_graph_sizes(600, 8192) == GRID_512 and len(GRID_512) == 51
    assert vllm_graph_sizes(64, 8192, 1024) == vllm_graph_sizes(64, 8192)  # 2 x max_num_seqs binds first


def test_gpt_oss_sets_1024_whatever_max_num_seqs():
    # the hook sets max_cudagraph_capture_size itself, so 2 x max_num_seqs no longer bounds it
    assert vllm_graph_sizes(64, 8192, 512, model_max=1024) == GRID_1024
    # only max_num_batched_tokens cuts it, and is then captured itself
    assert vllm_graph_sizes(64, 1000, 512, model_max=1024) == (*GRID_1024[:GRID_1024.index(992) + 1], 1000)
    host = GraphHost(79.1 * GIB, 9.0, "gpt_oss")
    assert default_graph_sizes("vllm", 64, 8192, 1, host) == GRID_1024
    assert default_graph_sizes("vllm", 64, 8192, 1, GraphHost(79.1 * GIB, 9.0, "llama"))[-1] == 128


def test_speculative_sizes_count_tokens_and_add_the_uniform_decode_sizes():
    # k = 2, q = 3, max_num_seqs 64: C = min(64 x 3 x 2, 512) = 384; request counts 1, 2, 4, 8, ..., 64 times 3
    # add 3, 6, 12 (24, 48, ..., 192 are on the grid already)
    grid_384 = (1, 2, 4, *range(8, 256, 8), *range(256, 385, 16))
    assert vllm_graph_sizes(64, 8192, 512, query_len=3) == tuple(sorted({*grid_384, 3, 6, 12}))
    # k = 1, q = 2, max_num_seqs 300: C = 512; counts 1, 2, 4, 8..248, 256..288 by 16, 300: none x 2 <= 512
    # that are not on the grid already (544, 576, 600 exceed 512): the list is the 512 grid
    assert vllm_graph_sizes(300, 8192, 512, query_len=2) == GRID_512
    # uniform sizes above max_num_batched_tokens are dropped: q 3, C = min(384, 100) = 100; 3 x 40 = 120 goes
    assert vllm_graph_sizes(64, 100, 512, query_len=3) == (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 40, 48, 56, 64, 72,
                                                           80, 88, 96, 100)


def _job(k: int | None, sizes: tuple[int, ...] | None = None) -> SimpleNamespace:
    spec = None if k is None else SimpleNamespace(num_speculative_tokens=k)
    return SimpleNamespace(engine="vllm", speculative=spec, batch=200, max_num_batched_tokens=8192,
                           decode_graph_sizes=sizes or GRID_512, cuda_graph_sizes_default=sizes is None)


def test_graph_ceiling_in_requests_is_the_tokens_over_one_plus_k():
    plan = SimpleNamespace(tp=8)
    h100, b200 = GraphHost(79.1 * GIB, 9.0, "deepseek_v3"), GraphHost(179.1 * GIB, 10.0, "deepseek_v3")
    assert graph_ceiling(_job(None), plan, h100) == 512 and graph_ceiling(_job(None), plan, b200) == 1024
    assert graph_ceiling(_job(3), plan, h100) == 128  # 512 tokens / 4 per request
    assert graph_ceiling(_job(3), plan, b200) == 256
    # k = 2: the runner rounds every size up to a multiple of 3 and drops those above 512 (vllm/config/
    # compilation.py @ee525ce4, adjust_cudagraph_sizes_for_spec_decode): 512 -> 513 goes, 496 -> 498, and the
    # largest left is the uniform decode size 168 x 3 = 504 (no size rounds to 510): 168 requests, not 170
    assert graph_ceiling(_job(2), plan, h100) == 168
    assert graph_ceiling(_job(3, (1, 2, 4, 8, 1000)), plan, h100) == 250  # a user's list: its own largest, in tokens


def _spec(cli, *extra: str) -> dict:
    r = cli("estimate", "--mode", "infer", "-m", "deepseek-v3", "--hardware", "dgx-h200", "--tp", "8", "--batch",
            "200", "--speculative", "mtp", "--spec-tokens", "3", "--json", *extra)
    assert r.code == 0, r.err
    return r.json()


def test_speculative_verification_above_the_ceiling_pays_the_eager_launches(cli):
    # 200 requests x 4 tokens = 800 > 512 on an H200 (capability 9.0): vLLM verifies them without a graph.
    # Before, the speculative step ignored the ceiling and priced it as a captured one; a user's list reaching
    # 1024 tokens (256 requests) covers it, so the two verification steps now differ by the launches; and so do
    # the draft's first passes over the same 800 tokens (cost.speculative.draft_pass_graphs).
    default, wide = _spec(cli), _spec(cli, "--cuda-graph-sizes", "1,2,4,8,16,32,64,128,256,512,800,1024")
    assert default["workload"]["cuda_graph_batch_sizes"][-1] == 512
    assert default["speculative"]["verify_s"] > wide["speculative"]["verify_s"]
    assert default["speculative"]["draft_s"] > wide["speculative"]["draft_s"]


def test_cli_gpt_oss_and_blackwell_capture_up_to_1024(cli):
    def est(model: str, hardware: str) -> dict:
        r = cli("estimate", "--mode", "infer", "-m", model, "--hardware", hardware, "--tp", "1", "--batch", "600",
                "--json")
        assert r.code == 0, r.err
        return r.json()
    # GPT-OSS's hook sets max_cudagraph_capture_size = 1024 itself, so _set_cudagraph_sizes skips its default
    # branch and appends no max_num_seqs: 600 pads to the grid's 608, not eager
    d = est("gpt-oss-120b", "dgx-h100")
    assert tuple(d["workload"]["cuda_graph_batch_sizes"]) == GRID_1024
    assert d["decode_graph_batch"] == 608
    # Blackwell's platform ceiling: min(2 x 600, 1024) = 1024, and vLLM 0.33.0 appends max_num_seqs 600
    # (<= 1024): the batch is captured exactly
    d = est("llama-3.1-8b", "dgx-b200")
    assert tuple(d["workload"]["cuda_graph_batch_sizes"]) == tuple(sorted({*GRID_1024, 600}))
    assert d["decode_graph_batch"] == 600
    d = est("llama-3.1-8b", "dgx-h100")
    assert d["workload"]["cuda_graph_batch_sizes"][-1] == 512 and d["decode_graph_batch"] == 600  # eager above
