"""--cuda-graph-sizes and the engine's default captured CUDA graph sizes on the command line
(cli.inputs.graph_sizes_of, cost.serve_step.default_graph_sizes; docs/formulas.md#infer.graph_padding)."""

from __future__ import annotations

import json

import pytest
from exported import unwrapped
from typer.testing import CliRunner

from llmplan.cli.app import app

BASE = ["estimate", "--mode", "infer", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--tp", "1",
        "--batch", "48", "--json"]


def _run(*extra: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, [*BASE, *extra])
    return r.exit_code, r.output


def _json(*extra: str) -> dict:
    code, out = _run(*extra)
    assert code == 0, out
    return json.loads(out)


def test_trtllm_gets_the_perf_overview_sizes_cut_to_its_limits():
    # TensorRT-LLM perf overview's padded list (1, 2, 4, ..., 256, 384, 512, 1024, ..., 8192) cut to
    # min(max_batch_size = --batch 48, max_num_tokens 8192) and ending in the bound 48 itself
    # (model_engine.py _filter_cuda_graph_batch_sizes): the CLI priced trtllm decode unpadded before.
    d = _json("--engine", "trtllm")
    assert d["workload"]["cuda_graph_batch_sizes"] == [1, 2, 4, 8, 16, 32, 48]
    assert d["decode_graph_batch"] == 48  # a captured size: not padded


def test_vllm_captures_a_batch_between_two_default_sizes():
    # vLLM 0.33.0 (PyPI sdist) vllm/config/vllm.py _set_cudagraph_sizes: max_num_seqs = --batch 50, so the capture
    # ceiling is min(2 x 50, 512) = 100, then min(8192, 100) = 100: the sizes [1, 2, 4] + range(8, 101, 8), and
    # without speculation max_num_seqs 50 itself (50 <= 100: uniform_decode_sizes = [max_num_seqs]). 50
    # sequences replay the 50 graph, not the 56 one (000fc94b, without that append, padded them to 56).
    d = _json("--engine", "vllm", "--batch", "50")
    assert d["workload"]["cuda_graph_batch_sizes"] == [1, 2, 4, 8, 16, 24, 32, 40, 48, 50, 56, 64, 72, 80, 88, 96]
    assert d["decode_graph_batch"] == 50
    exact = _json("--engine", "vllm", "--batch", "50", "--cuda-graph-sizes", "50")
    assert exact["decode_graph_batch"] == 50
    assert d["tpot_s"] == pytest.approx(exact["tpot_s"], rel=1e-12)  # no dummy rows either way
    # a user list without 50 still pads: 50 replays the 56 graph, 6 dummy rows in the element-wise ops and
    # all-reduces
    padded = _json("--engine", "vllm", "--batch", "50", "--cuda-graph-sizes", "48,56")
    assert padded["decode_graph_batch"] == 56 and padded["tpot_s"] > exact["tpot_s"]


def test_sglang_captures_the_planned_batch_up_to_its_default_max_bs():
    # sgl-project/sglang arg_groups/memory_hook.py @a82da8da: dgx-h100 (80 GB, "H100, A100" row) at tp_size 1
    # captures up to max_bs 256, at tp_size >= 4 up to 512; cuda_graph_hook.py @399499ca: 1, 2, 4, 8, 12, every 8
    # from 16 to 256, every 16 from 272 to 496, 512; base_runner.py @f438a118 get_batch_sizes_to_capture adds the
    # request pool's size and drops larger sizes, and llmplan's SGLang export sets --max-running-requests to the
    # batch: so the planned batch is captured exactly (the stop-54 merge padded 100 to 104), up to max_bs.
    d = _json("--engine", "sglang", "--batch", "100")
    assert d["workload"]["cuda_graph_batch_sizes"][:6] == [1, 2, 4, 8, 12, 16]
    assert d["workload"]["cuda_graph_batch_sizes"][-2:] == [96, 100]
    assert d["decode_graph_batch"] == 100
    assert _json("--engine", "sglang", "--batch", "48")["decode_graph_batch"] == 48
    eager = _json("--engine", "sglang", "--batch", "257")  # over tp 1's max_bs 256: no graph
    assert eager["workload"]["cuda_graph_batch_sizes"][-1] == 256 and eager["decode_graph_batch"] == 257
    tp4 = _json("--engine", "sglang", "--batch", "257", "--tp", "4")  # max_bs 512 at tp 4: captured
    assert tp4["workload"]["cuda_graph_batch_sizes"][-1] == 257 and tp4["decode_graph_batch"] == 257
    # A user's list goes through the same runner rule (base_cuda_graph_runner.py get_batch_sizes_to_capture in
    # the 0.5.23 wheel): pool 100, alignment 1 at tp 1, so N = 100; the list reaches above it (104 > 100), so
    # 100 is added and 104 dropped: [32, 100]. The batch is captured exactly, as with the default list (the
    # list kept as given padded it to 104); the workload keeps the user's list as given.
    given = _json("--engine", "sglang", "--batch", "100", "--cuda-graph-sizes", "32,104")
    assert given["workload"]["cuda_graph_batch_sizes"] == [32, 104]
    assert given["decode_graph_batch"] == 100 and given["tpot_s"] == pytest.approx(d["tpot_s"], rel=1e-12)


def test_the_option_overrides_and_pads_the_decode_step():
    padded = _json("--engine", "trtllm", "--cuda-graph-sizes", "64,1,2,4,8,16,32")
    assert padded["workload"]["cuda_graph_batch_sizes"] == [1, 2, 4, 8, 16, 32, 64]  # sorted
    assert padded["decode_graph_batch"] == 64  # 48 sequences replay the 64-row graph
    exact = _json("--engine", "trtllm")
    assert padded["tpot_s"] > exact["tpot_s"]  # 16 dummy rows in the element-wise ops and all-reduces
    assert _json("--engine", "vllm", "--cuda-graph-sizes", "64")["decode_graph_batch"] == 64


def test_no_cuda_graphs_pads_nothing():
    d = _json("--engine", "trtllm", "--no-cuda-graphs")
    assert d["workload"]["cuda_graph_batch_sizes"] is None and d["decode_graph_batch"] is None


@pytest.mark.parametrize("bad", ["0,2", "abc", "1,,2", "-4", "2.5", ",".join(str(i) for i in range(1, 70))])
def test_bad_sizes_are_one_line_exit_2(cli, bad):
    # through the real entry point (conftest.cli): one line on stderr, exit 2, no traceback
    assert "--cuda-graph-sizes" in cli(*BASE[:-1], "--engine", "trtllm", f"--cuda-graph-sizes={bad}").refusal()


def test_sizes_with_no_cuda_graphs_are_refused(cli):
    assert "--no-cuda-graphs" in cli(*BASE[:-1], "--engine", "trtllm", "--no-cuda-graphs", "--cuda-graph-sizes",
                                     "4").refusal()


def test_a_users_list_is_kept_even_when_it_equals_a_default_one():
    # The review of stop 54: a --cuda-graph-sizes list equal to SGLang's tp-1 default (up to 256) was taken for
    # llmplan's own default and replaced by the tp-8 one (up to 512): batch 300 priced on a 304-row graph.
    # ServeJob.cuda_graph_sizes_default now says whose list it is; the user's stays as given (300 runs eager).
    from llmplan.cost.serve_step import sglang_graph_sizes
    given = ",".join(str(b) for b in sglang_graph_sizes(256))
    d = _json("--engine", "sglang", "--tp", "8", "--batch", "300", "--cuda-graph-sizes", given)
    assert d["workload"]["cuda_graph_batch_sizes"] == list(sglang_graph_sizes(256))
    assert d["decode_graph_batch"] == 300 and d["workload"]["cuda_graph_sizes_default"] is False
    ours = _json("--engine", "sglang", "--tp", "8", "--batch", "300")
    assert ours["workload"]["cuda_graph_sizes_default"] is True
    assert ours["workload"]["cuda_graph_batch_sizes"][-1] == 300


def test_sglang_speculative_summary_prices_the_plain_server_as_a_plain_run():
    # SGLang captures another list with speculation (priced unpadded) and its default list without; the
    # summary's "without speculation" TPOT must be the plain run's (it priced the plain decode unpadded).
    plain = _json("--engine", "sglang", "--batch", "100", "--tp", "4")
    spec = _json("--engine", "sglang", "--batch", "100", "--tp", "4", "--speculative", "eagle", "--spec-tokens", "3")
    assert spec["speculative"]["tpot_without_s"] == plain["tpot_s"]


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_a_batch_above_every_captured_size_runs_as_without_cuda_graphs(engine):
    # TensorRT-LLM model_engine.py _get_padded_batch, vLLM's cudagraph dispatch, SGLang's can_run: no graph
    # above the largest captured size, so the step pays every kernel launch, as --no-cuda-graphs prices it
    # (before: the graph's host time only, 1.8 ms a step less for llama-3.1-8b at tp 1).
    over = _json("--engine", engine, "--batch", "257", "--cuda-graph-sizes", "128,256")
    eager = _json("--engine", engine, "--batch", "257", "--no-cuda-graphs")
    covered = _json("--engine", engine, "--batch", "256", "--cuda-graph-sizes", "128,256")
    assert over["decode_graph_batch"] == 257
    assert over["tpot_s"] == pytest.approx(eager["tpot_s"], rel=1e-12)
    assert over["tpot_s"] - covered["tpot_s"] > 1e-3  # the launches, not only one more row


GRAPH_KEYS_968A3F0 = {"decode_graph_batch", "decode_graph_unit", "decode_graph_tokens", "decode_graph_eager"}
GRAPH_KEYS_GROUP = {"decode_graph_requests", "decode_graph_groups", "decode_graph_group_batch",
                    "decode_graph_group_tokens", "decode_graph_group_eager"}
GRAPH_KEYS_SIZES = {"decode_graph_sizes", "decode_graphs_off"}  # added (branch search-edges): the captured list, why off


def _graph_keys(*args: str) -> dict:
    d = _json("--tp", "1", *args)
    assert {k for k in d if k.startswith("decode_graph")} == GRAPH_KEYS_968A3F0 | GRAPH_KEYS_GROUP | GRAPH_KEYS_SIZES
    keys = {k: v for k, v in d.items() if k.startswith("decode_graph") and k not in GRAPH_KEYS_SIZES}
    return keys | {"sizes": d["workload"]["cuda_graph_batch_sizes"]}


@pytest.mark.parametrize("args, whole, group", [
    # vLLM 0.33.0's default list at max_num_seqs 90 (C = 180: 1, 2, 4 and every 8 to 176, as below, and 90
    # itself, 90 <= 180): at pp 1 the group is the batch, captured exactly at 90.
    (("--pp", "1", "--dp", "8", "--batch", "90", "--engine", "vllm"), (90, "tokens", 90, False),
     (90, 1, 90, 90, False)),
    # max_num_seqs 1025: C = min(2050, 512, 8192) = 512, the list ends at 512. The batch 1025 is above it (eager,
    # itself: the integer 1025 as at 968a3f0, not 512.5); a group is 512.5 requests on average, the larger 513,
    # above 512 too (the cost prices 512.5 > 512 eager).
    (("--pp", "2", "--dp", "4", "--batch", "1025", "--engine", "vllm"), (1025, "tokens", 1025, True),
     (512.5, 2, 513, 513, True)),
    # TensorRT-LLM's list at max_batch_size 301: 1, 2, 4, ..., 256 and the bound 301. The batch 301 is a size;
    # a group of 301 / 4 = 75.25, the larger 76, pads to 128.
    (("--pp", "4", "--dp", "2", "--batch", "301", "--engine", "trtllm"), (301, "requests", 301, False),
     (75.25, 4, 128, 128, False)),
    # SGLang's list at TP 1 ends at 256 (1, 2, 4, 8, 12, 16, 24, then every 8): the batch 301 is above it; a
    # group of 75.25, the larger 76, pads to 80.
    (("--pp", "4", "--dp", "2", "--batch", "301", "--engine", "sglang"), (301, "requests", 301, True),
     (75.25, 4, 80, 80, False)),
])
def test_decode_graph_keys_keep_the_whole_batch_and_add_the_group(args, whole, group):
    # decode_graph_batch / _tokens / _eager keep their meaning at 968a3f0 (the workload's whole batch padded, an
    # int); decode_graph_group_* are one pipeline group's step, the one decode_tpot pads (batch / pp sequences,
    # docs/formulas.md#infer.decode), rounded up to whole requests.
    d = _graph_keys(*args)
    assert (d["decode_graph_batch"], d["decode_graph_unit"], d["decode_graph_tokens"], d["decode_graph_eager"]) == whole
    assert (d["decode_graph_requests"], d["decode_graph_groups"], d["decode_graph_group_batch"],
            d["decode_graph_group_tokens"], d["decode_graph_group_eager"]) == group
    for k in ("decode_graph_batch", "decode_graph_tokens", "decode_graph_group_batch", "decode_graph_group_tokens"):
        assert type(d[k]) is int, k


def test_decode_graph_keys_under_speculation_count_verified_tokens():
    # vLLM, EAGLE-3 k = 3: each request verifies 1 + 3 = 4 tokens, and vLLM's sizes count tokens. The default
    # list for max_num_seqs 77 at 4 tokens a request (vllm_graph_sizes) holds 77 x 4 = 308, a multiple of 4 that
    # the speculative fit keeps: the step of 77 requests runs 308 tokens under a graph, as at 968a3f0; at pp 1
    # the group is the whole batch.
    d = _graph_keys("--pp", "1", "--dp", "8", "--batch", "77", "--engine", "vllm", "--speculative", "eagle3",
                    "--spec-tokens", "3", "--acceptance", "0.7")
    assert (d["decode_graph_batch"], d["decode_graph_tokens"], d["decode_graph_requests"], d["decode_graph_groups"],
            d["decode_graph_group_batch"], d["decode_graph_group_tokens"], d["decode_graph_eager"]) \
        == (77, 308, 77, 1, 77, 308, False)
    assert 308 in d["sizes"]


def test_decode_graph_keys_are_none_without_cuda_graphs():
    d = _graph_keys("--pp", "2", "--dp", "4", "--batch", "90", "--no-cuda-graphs")
    assert all(v is None for k, v in d.items() if k != "sizes")


def test_padded_step_is_the_pipeline_groups_step_the_cost_prices():
    # With pp stages a decode step holds batch / pp sequences (docs/formulas.md#infer.decode), and that is the
    # step decode_tpot pads. vLLM 0.33.0's default list at max_num_seqs 90 (VllmConfig._set_cudagraph_sizes):
    # C = min(2 x 90, 512, 8192) = 180, so [1, 2, 4], every 8 from 8 to 176, and max_num_seqs 90 itself
    # (90 <= 180). A step of 90 / 2 = 45 requests replays the 48 graph (decode_graph_group_*);
    # decode_graph_batch keeps its meaning at 968a3f0, the whole batch of 90, now captured exactly at 90.
    d = _graph_keys("--pp", "2", "--dp", "4", "--batch", "90", "--engine", "vllm")
    assert d["sizes"][-1] == 176 and 90 in d["sizes"]
    assert (d["decode_graph_batch"], d["decode_graph_tokens"], d["decode_graph_eager"]) == (90, 90, False)
    assert (d["decode_graph_groups"], d["decode_graph_requests"], d["decode_graph_group_batch"],
            d["decode_graph_group_tokens"], d["decode_graph_group_eager"]) == (2, 45, 48, 48, False)


def test_vllm_drops_a_users_sizes_above_max_num_batched_tokens(tmp_path):
    # vLLM 0.33.0 (PyPI sdist), vllm/config/vllm.py VllmConfig._set_cudagraph_sizes keeps a user's
    # cudagraph_capture_sizes `if i <= max_num_tokens` (max_num_batched_tokens). At --max-num-batched-tokens 256
    # a list 128,384 is captured as 128 alone: the batch of 200 runs eagerly (384 would have covered it), priced
    # as the list 128 and as a server without decode graphs; 256 is kept and pads 200 to 256.
    cap = ("--engine", "vllm", "--batch", "200", "--max-num-batched-tokens", "256")
    given, alone = _json(*cap, "--cuda-graph-sizes", "128,384"), _json(*cap, "--cuda-graph-sizes", "128")
    eager = _json(*cap, "--no-cuda-graphs")
    assert given["workload"]["cuda_graph_batch_sizes"] == [128, 384]  # the job keeps the list as given
    assert (given["decode_graph_tokens"], given["decode_graph_eager"]) == (200, True)
    assert given["tpot_s"] == pytest.approx(alone["tpot_s"], rel=1e-12)
    assert given["tpot_s"] == pytest.approx(eager["tpot_s"], rel=1e-12)
    kept = _json(*cap, "--cuda-graph-sizes", "128,256,384")
    assert (kept["decode_graph_tokens"], kept["decode_graph_eager"]) == (256, False)
    plan = tmp_path / "plan.json"
    r = CliRunner().invoke(app, [*BASE[:-1], *cap, "--cuda-graph-sizes", "128,384", "--save", str(plan)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["export", str(plan), "--to", "vllm", "-o", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    text = unwrapped((tmp_path / "out" / "vllm_serve.sh").read_text())
    assert "vLLM keeps 128 of it (the sizes <= --max-num-batched-tokens 256" in text
