"""The padding of a speculative verification step to a captured CUDA graph (docs/formulas.md#infer.graph_padding).

vLLM's captured sizes count tokens: a verification step of b requests with k draft tokens carries b x (1 + k)
tokens, which the dispatcher pads to the smallest captured size >= that count, and runs without a graph above
the largest (vllm-project/vllm vllm/v1/cudagraph_dispatcher.py @ae2e8e62cea0f6c030f92234cb863acdc48658cb:
_compute_bs_to_padded_graph_size maps every count up to max_cudagraph_capture_size to the next captured size;
dispatch returns NONE above it). The default list (vllm/config/vllm.py @000fc94b754f66aeb60ef5acf1ea2e94cdc65164,
_set_cudagraph_sizes) adds n x (1 + k) for the request counts n, and under FULL decode graphs the model runner
rounds every size up to a multiple of 1 + k (vllm/config/compilation.py @ee525ce4fc8c9cfdedbbad878dcb2bccbb3c4b95,
adjust_cudagraph_sizes_for_spec_decode). TensorRT-LLM's and SGLang's sizes count
requests; each padding request carries 1 + k tokens. Expected values are worked out by hand from those rules.
"""

from __future__ import annotations

from llmplan.cost.serve_step import graph_padded_tokens, vllm_graph_sizes, vllm_spec_decode_sizes

# k = 2 (q = 3), max_num_seqs 64 on a 512-token platform: C = min(64 x 3 x 2, 512) = 384; the grid
# [1, 2, 4] + range(8, 256, 8) + range(256, 385, 16), and the uniform decode sizes 3, 6, 12 that the grid lacks
Q3_LIST = tuple(sorted({1, 2, 4, *range(8, 256, 8), *range(256, 385, 16), 3, 6, 12}))


def test_vllm_rounds_its_sizes_to_whole_requests_under_speculation():
    # vllm/config/compilation.py @ee525ce4fc8c9cfdedbbad878dcb2bccbb3c4b95, adjust_cudagraph_sizes_for_spec_decode:
    # round_up(size, 1 + k), kept while <= max_cudagraph_capture_size; [1 + k] if none is left
    assert vllm_graph_sizes(64, 8192, 512, query_len=3) == Q3_LIST
    rounded = vllm_spec_decode_sizes(Q3_LIST, 3)
    assert rounded[:12] == (3, 6, 9, 12, 18, 24, 33, 42, 48, 57, 66, 72)  # 1, 2 -> 3; 4 -> 6; 8 -> 9; 16 -> 18 ...
    assert rounded[-4:] == (336, 354, 369, 384) and all(r % 3 == 0 for r in rounded)
    assert vllm_spec_decode_sizes((1, 2, 4, 8, 512), 4) == (4, 8, 512)  # multiples of 4 already, or rounded to 4
    assert vllm_spec_decode_sizes((2, 5), 4) == (4,)  # 2 -> 4 kept; 5 -> 8 above 5 goes
    assert vllm_spec_decode_sizes((2,), 4) == ()  # 4 > 2: none fits (vLLM raises at start)
    assert vllm_spec_decode_sizes(Q3_LIST, 1) == Q3_LIST  # no speculation: unchanged


def test_vllm_pads_the_verification_tokens_against_its_token_sizes():
    sizes = vllm_spec_decode_sizes(Q3_LIST, 3)
    assert graph_padded_tokens(4, 3, sizes, True) == 12.0  # 12 tokens: a uniform decode size, captured
    assert graph_padded_tokens(5, 3, sizes, True) == 18.0  # 15 tokens -> 18 (16 rounded up to whole requests)
    assert graph_padded_tokens(50, 3, sizes, True) == 153.0  # 150 -> 153 (152 rounded)
    assert graph_padded_tokens(100, 3, sizes, True) == 306.0  # 300 -> 306 (304 rounded)
    assert graph_padded_tokens(128, 3, sizes, True) == 384.0  # 384: the largest size
    assert graph_padded_tokens(129, 3, sizes, True) == 387.0  # 387 > 384: no graph, unpadded
    assert graph_padded_tokens(5, 3, None, True) == 15.0  # CUDA graphs off
    assert graph_padded_tokens(5, 3, Q3_LIST, True) == 16.0  # the rule itself: smallest size >= the tokens


def test_request_lists_pad_requests_each_carrying_its_tokens():
    sizes = (1, 2, 4, 8, 16, 32, 64, 128)
    assert graph_padded_tokens(100, 4, sizes, False) == 512.0  # 100 requests -> 128 x 4 tokens
    assert graph_padded_tokens(200, 4, sizes, False) == 800.0  # above 128: eager, unpadded


def _est(cli, *extra: str) -> dict:
    r = cli("estimate", "--mode", "infer", "-m", "deepseek-v3", "--hardware", "dgx-h200", "--tp", "8",
            "--speculative", "mtp", "--spec-tokens", "3", "--json", *extra)
    assert r.code == 0, r.err
    return r.json()


def test_verification_step_pays_its_padded_tokens(cli):
    # 100 requests x 4 tokens = 400 tokens; a list holding 400 replays it unpadded, one whose next size is 512
    # pads it by 112 tokens, which its element-wise operators and all-reduces carry (before: both priced alike)
    exact = _est(cli, "--batch", "100", "--cuda-graph-sizes", "1,2,4,8,16,32,64,128,256,400,512")
    padded = _est(cli, "--batch", "100", "--cuda-graph-sizes", "1,2,4,8,16,32,64,128,256,512")
    assert exact["decode_graph_tokens"] == 400 and padded["decode_graph_tokens"] == 512
    assert padded["speculative"]["verify_s"] > exact["speculative"]["verify_s"]
    # the draft's first pass runs the same 400 tokens on the same sizes (cost.speculative.draft_pass_graphs)
    assert padded["speculative"]["draft_s"] > exact["speculative"]["draft_s"]


def test_decode_graph_batch_counts_requests_under_speculation(cli):
    # vLLM's default list for max_num_seqs 101 at k = 3 holds 101 x 4 = 404 (the request count max_num_seqs is
    # one of request_counts): the step runs 404 tokens unpadded, 101 requests. Before, 101 requests were padded
    # against the token list to 104. decode_graph_batch stays in requests (its meaning since it was added).
    d = _est(cli, "--batch", "101")
    assert 404 in d["workload"]["cuda_graph_batch_sizes"]
    assert (d["decode_graph_batch"], d["decode_graph_unit"], d["decode_graph_tokens"], d["decode_graph_eager"]) \
        == (101, "tokens", 404, False)
    # 200 x 4 = 800 tokens above the H200's 512: eager, unpadded
    over = _est(cli, "--batch", "200")
    assert (over["decode_graph_batch"], over["decode_graph_tokens"], over["decode_graph_eager"]) == (200, 800, True)
    # 102 requests, 408 tokens: the next captured multiple of 4 holds them (vllm_spec_decode_sizes)
    pad = _est(cli, "--batch", "102")
    assert pad["decode_graph_tokens"] % 4 == 0 and pad["decode_graph_batch"] == pad["decode_graph_tokens"] // 4


def test_decode_graph_fields_without_speculation_and_without_graphs(cli):
    def est(*extra: str) -> dict:
        r = cli("estimate", "--mode", "infer", "-m", "llama-3.1-8b", "--hardware", "dgx-h100", "--tp", "1",
                "--json", *extra)
        assert r.code == 0, r.err
        return r.json()
    # one token per request: tokens and requests agree; max_num_seqs 100 <= the ceiling min(200, 512) = 200, so
    # vLLM 0.33.0 appends 100 to the grid (8, ..., 96, 104, ...): captured exactly (it padded to 104 before)
    d = est("--batch", "100")
    assert (d["decode_graph_batch"], d["decode_graph_unit"], d["decode_graph_tokens"]) == (100, "tokens", 100)
    t = est("--batch", "100", "--engine", "trtllm", "--cuda-graph-sizes", "64,128")
    assert (t["decode_graph_batch"], t["decode_graph_unit"], t["decode_graph_tokens"]) == (128, "requests", 128)
    off = est("--batch", "100", "--no-cuda-graphs")
    assert off["decode_graph_batch"] is None and off["decode_graph_tokens"] is None


def test_decode_phase_prices_the_speculative_servers_verification_step(cli):
    # The disaggregated decode phase of a speculative job runs the speculative step (docs/formulas.md#serve.phase):
    # at 200 requests x 4 tokens = 800 > the H100's 512 captured tokens the verification step runs without a graph
    # (graph_ceiling: 512 / 4 = 128 requests), as the co-located estimate prices it; the plain job's one-token
    # step of 200 requests stays within its own list. (Before, the phase priced one-token steps for both jobs.)
    import json
    docs = {}
    for phase in ("decode", "both"):
        for name, extra in (("plain", []), ("spec", ["--speculative", "eagle", "--spec-tokens", "3"])):
            r = cli("estimate", "--mode", "infer", "--phase", phase, "-m", "llama-3.1-8b", "--hardware", "dgx-h100",
                    "--tp", "1", "--batch", "200", "--engine", "vllm", *extra, "--json")
            assert r.code == 0, r.err
            docs[phase, name] = json.loads(r.out)
    spec, co = docs["decode", "spec"], docs["both", "spec"]
    assert co["decode_graph_eager"] is True and docs["both", "plain"]["decode_graph_eager"] is False
    assert spec["phase"]["step_s"] == co["speculative"]["step_s"]
    assert spec["phase"]["speculative"]["verify_s"] == co["speculative"]["verify_s"]
    assert spec["phase"]["step_s"] > docs["decode", "plain"]["phase"]["step_s"]
