"""Serving model: KV bytes, capacity, TTFT/TPOT invariants, prefix reuse, golden TensorRT-LLM throughput,
and the inference CLI (estimate / search --mode infer)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.inference import kv_bytes_per_seq_gpu, kv_bytes_per_token, serve_weight_bytes
from llmplan.serving import estimate_serving
from llmplan.specs.check import valid_tp
from llmplan.specs.plan import ClusterSpec
from llmplan.specs.registry import builtin_models, builtin_systems
from llmplan.specs.serve import ServeJob, ServePlan

M = builtin_models()
S = builtin_systems()


def test_kv_bytes_per_token_hand_computed():
    # Llama-3.1-70B: 80 layers x 2 (K,V) x 8 KV heads x 128 x 2 bytes
    assert kv_bytes_per_token(M["llama-3.1-70b"]) == 80 * 2 * 8 * 128 * 2 == 327_680
    # Mixtral-8x7B: 32 x 2 x 8 x 128 x 2
    assert kv_bytes_per_token(M["mixtral-8x7b"]) == 32 * 2 * 8 * 128 * 2 == 131_072
    # DeepSeek-V3 MLA: 61 layers x (kv_lora_rank 512 + rope 64) x 2 bytes, one latent per token
    assert kv_bytes_per_token(M["deepseek-v3"]) == 61 * (512 + 64) * 2 == 70_272
    assert kv_bytes_per_token(M["llama-3.1-70b"], "fp8") == 327_680 / 2


@pytest.mark.parametrize("record,model", [("kv-cache-derived-llama3-8b", "llama-3.1-8b"),
                                          ("kv-cache-derived-llama3-70b", "llama-3.1-70b"),
                                          ("kv-cache-derived-llama3-405b", "llama-3.1-405b")])
def test_kv_records(published_runs, record, model):
    assert kv_bytes_per_token(M[model]) == published_runs[record]["measured"]["kv_cache_bytes_per_token_bf16"]


def test_kv_sharding_and_replication():
    m = M["llama-3.1-70b"]  # 8 KV heads
    full = kv_bytes_per_seq_gpu(m, ServePlan(tp=1), 1000)
    assert kv_bytes_per_seq_gpu(m, ServePlan(tp=8), 1000) == pytest.approx(full / 8)
    assert kv_bytes_per_seq_gpu(m, ServePlan(tp=16, dp=1), 1000) == pytest.approx(full / 8)  # replicated heads
    ds = M["deepseek-v3"]  # MLA latent replicated on every TP rank
    assert kv_bytes_per_seq_gpu(ds, ServePlan(tp=8), 1000) == kv_bytes_per_seq_gpu(ds, ServePlan(tp=1), 1000)


def test_sliding_window_layers_keep_at_most_the_window():
    m = M["gpt-oss-120b"]  # half the layers slide over 128 tokens
    per_layer = kv_bytes_per_token(m) / m.num_hidden_layers
    got = kv_bytes_per_seq_gpu(m, ServePlan(tp=1), 100_000)
    assert got == pytest.approx(18 * 100_000 * per_layer + 18 * 128 * per_layer)


def test_model_that_does_not_fit_says_so():
    cluster = ClusterSpec(system=S["dgx-h100"], num_nodes=1, gpus_per_node=1)
    e = estimate_serving(M["llama-3.1-405b"], cluster, ServePlan(), ServeJob())
    assert not e.memory.fits and e.memory.kv_available < 0 and e.memory.max_concurrent_seqs == 0


@st.composite
def serving_case(draw):
    name = draw(st.sampled_from(["llama-3.1-8b", "llama-3.1-70b", "mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3",
                                 "gpt-oss-120b"]))
    m = M[name]
    tp = draw(st.sampled_from(valid_tp(m, 8)))
    job = ServeJob(input_len=draw(st.integers(16, 8000)), output_len=draw(st.integers(1, 4000)),
                   batch=draw(st.integers(1, 512)), prefix_hit_rate=draw(st.floats(0, 0.95)))
    plan = ServePlan(tp=tp, weight_dtype=draw(st.sampled_from(["bf16", "fp8", "int4"])))
    return m, plan, job


@settings(max_examples=50, deadline=None)
@given(serving_case())
def test_tpot_never_below_reading_the_weights(case):
    m, plan, job = case
    cluster = ClusterSpec(system=S["dgx-h100"], num_nodes=1, gpus_per_node=plan.tp)
    e = estimate_serving(m, cluster, plan, job)
    gpu = cluster.system.gpu
    dense_part = serve_weight_bytes(m, plan) if not m.is_moe else 0.0  # MoE reads only the experts it routes to
    assert float(e.timing.tpot) >= dense_part / gpu.hbm_bytes_per_s


@settings(max_examples=40, deadline=None)
@given(serving_case())
def test_more_tp_never_raises_weight_bytes(case):
    m, plan, _ = case
    for t in [t for t in valid_tp(m, 64) if t > plan.tp]:
        assert serve_weight_bytes(m, plan.model_copy(update={"tp": t})) <= serve_weight_bytes(m, plan) + 1e-6


@settings(max_examples=40, deadline=None)
@given(serving_case(), st.floats(0, 0.95))
def test_higher_prefix_hit_rate_never_raises_ttft(case, extra):
    m, plan, job = case
    cluster = ClusterSpec(system=S["dgx-h100"], num_nodes=1, gpus_per_node=plan.tp)
    lo = estimate_serving(m, cluster, plan, job)
    higher = min(0.99, job.prefix_hit_rate + extra)
    hi = estimate_serving(m, cluster, plan, job.model_copy(update={"prefix_hit_rate": higher}))
    assert float(hi.timing.ttft) <= float(lo.timing.ttft) * (1 + 1e-9)


# TensorRT-LLM perf overview (H100, fp8, offline, trtllm-bench): output tokens/s of the TP group. Tolerance 20%:
# the model's per-record errors on this family are listed in docs/validation.md#serving (median 9.2%).
@pytest.mark.parametrize("record,model,tp", [
    ("trtllm-perf-llama3.1-405b-h100-tp8-1000-1000", "llama-3.1-405b", 8),
    ("trtllm-perf-llama3.3-70b-h100-tp2-2048-2048", "llama-3.1-70b", 2),
    ("trtllm-perf-llama3.1-8b-h100-tp1-5000-500", "llama-3.1-8b", 1),
])
def test_trtllm_throughput(published_runs, record, model, tp):
    r = published_runs[record]
    job = ServeJob(input_len=r["workload"]["input_len"], output_len=r["workload"]["output_len"], batch=1,
                   engine="trtllm")
    plan = ServePlan(tp=tp, weight_dtype="fp8", kv_dtype="fp8")
    cluster = ClusterSpec(system=S["dgx-h100"], num_nodes=1, gpus_per_node=tp)
    cap = estimate_serving(M[model], cluster, plan, job).memory.max_concurrent_seqs
    e = estimate_serving(M[model], cluster, plan, job.model_copy(update={"batch": min(cap, 4096)}))
    assert e.tokens_per_s == pytest.approx(r["measured"]["output_tokens_per_s_total"], rel=0.20)


# TensorRT-LLM perf overview (docs/source/performance/perf-overview.md at 00f37686), Qwen3-235B-A22B-FP8 on H100,
# trtllm-bench --tp 8 --ep 8: TP8 attention (the page's enable_attention_dp sits inside cuda_graph_config, whose
# strict CudaGraphConfig rejects it: benchmarks/accuracy.py TRTLLM_ATTENTION_DP) and the experts on the TP
# group's replicated tokens, combined by its all-reduce (modeling_qwen3_moe.py: no all-to-all). Tolerance 20%,
# as for the dense rows above. The decode-heavy 128/2048 and 128/4096 rows (+15% and +25% on this reading) are
# left out, as 405B's 128/4096 (+41%) is: docs/validation.md#trtllm-qwen3-attention-dp.
@pytest.mark.parametrize("record", [
    "trtllm-perf-qwen3-235b-a22b-h100-tp8-500-2000",
    "trtllm-perf-qwen3-235b-a22b-h100-tp8-1000-1000",
    "trtllm-perf-qwen3-235b-a22b-h100-tp8-1000-2000",
    "trtllm-perf-qwen3-235b-a22b-h100-tp8-2048-2048",
    "trtllm-perf-qwen3-235b-a22b-h100-tp8-5000-500",
])
def test_trtllm_qwen3_moe_tp8_ep8_throughput(published_runs, record):
    r = published_runs[record]
    job = ServeJob(input_len=r["workload"]["input_len"], output_len=r["workload"]["output_len"], batch=1,
                   engine="trtllm")
    plan = ServePlan(tp=8, ep=8, weight_dtype="fp8", kv_dtype="fp8")
    cluster = ClusterSpec(system=S["dgx-h100"], num_nodes=1, gpus_per_node=8)
    m = M["qwen3-235b-a22b"]
    cap = estimate_serving(m, cluster, plan, job).memory.max_concurrent_seqs
    e = estimate_serving(m, cluster, plan, job.model_copy(update={"batch": min(cap, 4096)}))
    assert e.tokens_per_s == pytest.approx(r["measured"]["output_tokens_per_s_total"], rel=0.20)


def test_estimate_infer_json(cli):
    r = cli("estimate", "--mode", "infer", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--tp", "8",
            "--input-len", "2048", "--output-len", "512", "--batch", "32", "--kv-dtype", "fp8", "--json")
    assert r.code == 0, r.err
    d = r.json()
    assert set(d["memory"]) >= {"weights", "kv_cache", "activations", "other", "total", "capacity", "fits"}
    assert d["kv_bytes_per_token"] == 327_680 / 2
    assert d["max_concurrent_seqs"] > 32 and d["ttft_s"] > 0 and d["tpot_s"] > 0
    assert d["throughput"]["tokens_per_s"] > 0


def test_estimate_infer_context_limit_and_fp8_warning(cli):
    r = cli("estimate", "--mode", "infer", "--model", "llama-2-7b", "--hardware", "dgx-h100", "--input-len", "4000",
            "--output-len", "200")
    assert r.code == 2
    assert "input_len + output_len (4000 + 200 = 4200) exceeds max_position_embeddings (4096) of llama-2-7b" in r.err
    r = cli("estimate", "--mode", "infer", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--input-len",
            "200000")
    assert r.code == 2 and "rope_scaling" in r.err
    r = cli("estimate", "--mode", "infer", "--model", "llama-3.1-8b", "--hardware", "dgx-a100", "--dtype", "fp8")
    assert r.code == 0 and "no fp8 tensor cores" in r.out and "W8A16" in r.out


def test_search_infer(cli):
    r = cli("search", "--mode", "infer", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--dtype", "fp8",
            "--tpot-slo", "0.03", "--json")
    assert r.code == 0, r.err
    d = r.json()
    per_gpu = [p["throughput"]["tokens_per_s_per_gpu"] for p in d["plans"]]
    assert per_gpu == sorted(per_gpu, reverse=True)
    assert all(p["tpot_s"] <= 0.03 for p in d["plans"])
    r = cli("search", "--mode", "infer", "--model", "mixtral-8x7b", "--hardware", "dgx-h100", "--nodes", "2",
            "--objective", "min-gpus", "--request-rate", "5", "--json")
    gpus = [p["gpus"] for p in r.json()["plans"]]
    assert gpus == sorted(gpus)
    r = cli("search", "--mode", "infer", "--model", "llama-3.1-405b", "--hardware", "dgx-h100", "--json")
    assert r.code == 3 and "no serving plan" in r.err


def test_min_gpus_keeps_the_memory_allowance(cli):
    # Issue 11: --objective min-gpus re-estimated its layouts without the allowance (--overhead-gib 20 showed
    # 1.5 GiB of "other").
    r = cli("search", "--mode", "infer", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--objective",
            "min-gpus", "--overhead-gib", "20", "--json")
    assert r.code == 0, r.err
    assert r.json()["plans"][0]["memory"]["other"] >= 20 * 2**30


def test_min_gpus_that_finds_nothing_lists_the_near_misses(cli):
    # Issue 16: a min-gpus search that serves nothing lists the layouts that fit in memory but miss an SLO or
    # the GPU budget, with the SLO and the value achieved.
    args = ("search", "--mode", "infer", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--objective",
            "min-gpus", "--request-rate", "1000", "--tpot-slo", "0.05")
    r = cli(*args, "--json")
    assert r.code == 3
    misses = r.json()["misses"]
    over = [x for x in misses if x["rule"] == "gpus"]
    slow = [x for x in misses if x["rule"] == "slo"]
    assert over and slow
    assert all(x["gpus_needed"] > 8 and x["tpot_s"] <= 0.05 for x in over)  # meets the SLO, needs more GPUs
    assert all(x["tpot_s"] > 0.05 for x in slow)  # even one sequence misses the TPOT objective
    table = cli(*args)
    assert "Layouts that fit but are not served" in table.out and "TPOT <= 0.05 s" in table.out
    assert f"needs {over[0]['gpus_needed']} GPUs" in table.out and "misses TPOT" in table.out
