"""vLLM's default captured CUDA graph sizes (cost.serve_step.vllm_graph_sizes, default_graph_sizes;
docs/formulas.md#infer.graph_padding). Expected lists are written out by hand from the source's rule:
vLLM vllm/config/vllm.py @000fc94b754f66aeb60ef5acf1ea2e94cdc65164 (_set_cudagraph_sizes); SGLang
sgl-project/sglang python/sglang/srt/arg_groups/memory_hook.py @a82da8da159ec67038d9357c172fba89ad8af6a3
(handle_gpu_memory_settings: max_bs by GPU memory in MiB and tp_size) and arg_groups/cuda_graph_hook.py
@399499ca159da099c16d20ddc2f5898491071431 (generate_decode_cuda_graph_batch_sizes)."""

from __future__ import annotations

from types import SimpleNamespace

from llmplan.cost.serve_step import (
    GraphHost,
    default_graph_sizes,
    graph_padded_rows,
    graph_sizes_at,
    sglang_graph_max_bs,
    sglang_graph_sizes,
    vllm_graph_sizes,
)

GIB = 2**30

def test_vllm_small_max_num_seqs_caps_at_twice_it():
    # ceiling min(2 x 64, 512, 8192) = 128: [1, 2, 4] then every 8 to 128
    assert vllm_graph_sizes(64, 8192) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128)
    assert vllm_graph_sizes(4, 8192) == (1, 2, 4, 8)  # ceiling 8


def test_vllm_large_max_num_seqs_caps_at_512_with_steps_of_16_above_256():
    s = vllm_graph_sizes(300, 8192)  # ceiling min(600, 512) = 512
    # [1,2,4], 8..248 by 8, 256..512 by 16, and (vLLM 0.33.0 _set_cudagraph_sizes, no speculation)
    # max_num_seqs 300 itself since 300 <= the ceiling 512: 300 is off the 16-step grid (288, 304), so one more
    assert s[:4] == (1, 2, 4, 8) and len(s) == 3 + 31 + 17 + 1
    assert (248, 256, 272) == s[33:36] and s[-1] == 512 and 264 not in s
    assert s[s.index(288):s.index(288) + 3] == (288, 300, 304)


def test_vllm_adds_max_num_batched_tokens_under_the_ceiling():
    # ceiling min(128, 512, 100) = 100: every 8 to 96, then max_num_batched_tokens 100 itself
    assert vllm_graph_sizes(64, 100) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 100)


def test_default_graph_sizes_per_engine_and_the_padding():
    assert default_graph_sizes("vllm", 64, 8192) == vllm_graph_sizes(64, 8192)
    assert default_graph_sizes("sglang", 1000, 8192, 1, GraphHost(79.1 * GIB)) == sglang_graph_sizes(256)
    # speculative decoding: SGLang 0.5.23's speculative grid (cuda_graph_hook.py generate_decode_cuda_graph_batch_sizes,
    # written out here from the source: 1-8, every 2 to 32, every 4 to 64, every 8 to 256), max_bs 256 on an H100 at tp 1
    spec = (*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8))
    assert default_graph_sizes("sglang", 1000, 8192, 1, GraphHost(79.1 * GIB), draft_tokens=1) == spec
    # the pool of llmplan's export (--max-running-requests = the batch) under max_bs: captured exactly
    assert default_graph_sizes("sglang", 100, 8192, 1, GraphHost(79.1 * GIB)) == (*sglang_graph_sizes(96), 100)
    assert graph_padded_rows(50, default_graph_sizes("vllm", 64, 8192)) == 56
    assert graph_padded_rows(600, default_graph_sizes("vllm", 300, 8192)) == 600  # above 512: eager, unpadded


def test_sglang_max_bs_by_gpu_memory_and_tp():
    # memory_hook.py @a82da8da handle_gpu_memory_settings, gpu_mem in MiB: "H100, A100" (60-90 GiB) and
    # "H20, H200" (90-160 GiB): 256 if tp_size < 4 else 512; "A100 (40GB), L40" (35-60 GiB): 32 / 160;
    # "A10, 4090, 5090" (20-35 GiB): 48 / 160; below 20 GiB: 8; "B200, MI300" (160 GiB and up): 512;
    # gpu_mem None: 160.
    assert sglang_graph_max_bs(79.1 * GIB, 1) == 256 and sglang_graph_max_bs(79.1 * GIB, 8) == 512  # H100 SXM
    assert sglang_graph_max_bs(139.8 * GIB, 2) == 256 and sglang_graph_max_bs(139.8 * GIB, 4) == 512  # H200
    assert sglang_graph_max_bs(39.4 * GIB, 1) == 32 and sglang_graph_max_bs(39.4 * GIB, 4) == 160  # A100 40GB
    assert sglang_graph_max_bs(23.6 * GIB, 1) == 48 and sglang_graph_max_bs(15 * GIB, 8) == 8
    assert sglang_graph_max_bs(178 * GIB, 1) == 512 and sglang_graph_max_bs(None, 1) == 160  # B200; unknown


def test_sglang_capture_list_written_out_from_the_rule():
    # cuda_graph_hook.py @399499ca: [1, 2, 4, 8, 12] + range(16, 257, 8) + range(272, 512, 16)
    # + range(512, max_bs + 1, 32), those <= max_bs, then max_bs itself if missing
    assert sglang_graph_sizes(32) == (1, 2, 4, 8, 12, 16, 24, 32)
    assert sglang_graph_sizes(48) == (1, 2, 4, 8, 12, 16, 24, 32, 40, 48)
    assert sglang_graph_sizes(8) == (1, 2, 4, 8)
    s = sglang_graph_sizes(512)
    assert len(s) == 5 + 31 + 15 + 1 and s[-4:] == (464, 480, 496, 512) and (256, 272) == s[35:37]
    assert sglang_graph_sizes(20) == (1, 2, 4, 8, 12, 16, 20)  # an off-list max_bs is appended
    assert graph_padded_rows(100, sglang_graph_sizes(256)) == 104
    assert graph_padded_rows(257, sglang_graph_sizes(256)) == 257  # above max_bs: eager, unpadded
    # base_runner.py @f438a118: a request pool under max_bs is added to the list and larger sizes dropped
    assert sglang_graph_sizes(256, 100) == (*sglang_graph_sizes(96), 100)
    assert sglang_graph_sizes(256, 96) == sglang_graph_sizes(96)
    assert sglang_graph_sizes(32, 100) == sglang_graph_sizes(32)


def test_sglang_default_follows_the_plans_tp_but_not_a_users_list():
    h100 = 79.1 * GIB
    job = SimpleNamespace(engine="sglang", speculative=None, batch=300, max_num_batched_tokens=8192,
                          cuda_graph_batch_sizes=sglang_graph_sizes(256), cuda_graph_sizes_default=True)
    assert graph_sizes_at(job, tp=8, host=GraphHost(h100)) == sglang_graph_sizes(512, 300)  # 300 captured at tp 8
    assert graph_sizes_at(job, tp=2, host=GraphHost(h100)) == sglang_graph_sizes(256)  # 300 over tp 2's max_bs
    assert graph_sizes_at(job, batch=64, tp=2, host=GraphHost(h100)) == sglang_graph_sizes(256, 64)  # a pool of 64
    assert graph_sizes_at(job, batch=64) == job.cuda_graph_batch_sizes  # no TP: kept until job_for_plan
    mine = SimpleNamespace(**{**vars(job), "cuda_graph_batch_sizes": (64, 128), "cuda_graph_sizes_default": False})
    assert graph_sizes_at(mine, tp=8, host=GraphHost(h100)) == (64, 128)
    # a user's list that happens to equal a default one is the user's too (the review's case: it was replaced)
    given = SimpleNamespace(**{**vars(job), "cuda_graph_sizes_default": False})
    assert graph_sizes_at(given, tp=8, host=GraphHost(h100)) == sglang_graph_sizes(256)
    unknown = SimpleNamespace(**{**vars(job), "cuda_graph_batch_sizes": sglang_graph_sizes(160)})
    assert graph_sizes_at(unknown, tp=1, host=GraphHost(h100)) == sglang_graph_sizes(256)  # pools: GPU known later


def test_sglang_search_picks_the_slo_batch_at_each_plans_own_capture_sizes(cli):
    # The search's SLO batch and the row's estimate must price the same captured sizes: SGLang's default list
    # at the plan's TP (H100, tp 4: max_bs 512), not the list at tp 1 (max_bs 256) the CLI's job carries.
    # Before: tp4 pp1 took batch 410 (eager at tp 1's list) and its row said TPOT 0.05004 s > the 0.05 s SLO.
    r = cli("search", "--mode", "infer", "-m", "llama-3.1-70b", "--hardware", "dgx-h100", "--engine", "sglang",
            "--tpot-slo", "0.05", "--json")
    assert r.code == 0, r.err
    plans = r.json()["plans"]
    assert any(p["plan"]["tp"] >= 4 and p["workload"]["batch"] > 256 for p in plans)
    for p in plans:
        assert p["tpot_s"] <= 0.05, (p["plan"]["tp"], p["workload"]["batch"], p["tpot_s"])
