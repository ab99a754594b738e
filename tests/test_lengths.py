"""Request-length distributions (issue 36): TTFT/TPOT percentiles, KV capacity and throughput when prompts
and outputs vary instead of being one fixed length."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cli.inputs import make_cluster
from llmplan.cost.lengths import TRACE_SHAPES, mean_length, points, quantile
from llmplan.serving import estimate_serving
from llmplan.specs.registry import resolve_model
from llmplan.specs.serve import LengthDistribution, ServeJob, ServePlan, SpeculativeSpec

LLAMA70B = resolve_model("llama-3.1-70b")
CLUSTER = make_cluster("dgx-h100", 1, None)
PLAN = ServePlan(tp=4, dp=2)


def _one_point(n: int) -> LengthDistribution:
    return LengthDistribution(kind="histogram", lengths=(n,), weights=(3.0,))


@pytest.mark.parametrize("engine", ["vllm", "trtllm", "sglang"])
@pytest.mark.parametrize("spec", [None, SpeculativeSpec(method="eagle", num_speculative_tokens=3)])
def test_one_point_distribution_gives_todays_numbers(engine, spec):
    job = ServeJob(input_len=3000, output_len=400, batch=48, engine=engine, speculative=spec, ttft_slo_s=0.5,
                   tpot_slo_s=0.04)
    today = estimate_serving(LLAMA70B, CLUSTER, PLAN, job)
    for dists in ({"input_len_dist": _one_point(3000), "output_len_dist": _one_point(400)},
                  {"input_len_dist": LengthDistribution(kind="lognormal", mean=3000, sigma=0.0)}):
        e = estimate_serving(LLAMA70B, CLUSTER, PLAN, job.model_copy(update=dists))
        s = e.lengths
        assert s is not None
        for p in (50, 90, 99):
            assert s.ttft_s[p] == pytest.approx(float(today.timing.ttft), rel=1e-9)
            assert s.tpot_s[p] == pytest.approx(float(today.timing.tpot), rel=1e-9)
        assert s.ttft_mean_s == pytest.approx(float(today.timing.ttft), rel=1e-9)
        assert s.tpot_mean_s == pytest.approx(float(today.timing.tpot), rel=1e-9)
        assert s.tokens_per_s_replica == pytest.approx(float(today.timing.tokens_per_s_replica), rel=1e-9)
        assert s.max_concurrent_seqs == today.memory.max_concurrent_seqs
        assert s.slo_batch == today.slo_batch


@settings(max_examples=20, deadline=None)
@given(mean_in=st.floats(50, 20_000), mean_out=st.floats(20, 4_000), sigma=st.floats(0.05, 1.5))
def test_percentiles_rise_and_spread_costs_capacity(mean_in, mean_out, sigma):
    job = ServeJob(input_len=round(mean_in), output_len=round(mean_out), batch=16,
                   input_len_dist=LengthDistribution(kind="lognormal", mean=mean_in, sigma=sigma),
                   output_len_dist=LengthDistribution(kind="lognormal", mean=mean_out, sigma=sigma))
    e = estimate_serving(LLAMA70B, CLUSTER, PLAN, job)
    s = e.lengths
    assert s is not None
    assert s.ttft_s[50] <= s.ttft_s[90] <= s.ttft_s[99]
    assert s.tpot_s[50] <= s.tpot_s[90] <= s.tpot_s[99]
    # Long outputs stay longer in the batch: E[O^2]/E[O] >= E[O], so a running sequence holds more than
    # E[I] + E[O]/2 and fewer fit than at the mean lengths (Jensen).
    assert s.held_tokens >= mean_in + mean_out / 2 - 1e-6
    assert s.slo_batch is None
    fixed = estimate_serving(LLAMA70B, CLUSTER, PLAN, job.model_copy(update={"input_len_dist": None,
                                                                           "output_len_dist": None}))
    assert s.max_concurrent_seqs <= fixed.memory.max_concurrent_seqs + 1


@pytest.mark.parametrize("mean,sigma", [(161.31, 1.0), (7590.0, 0.8), (2000.0, 1.5)])
def test_lognormal_quadrature_and_quantiles_keep_the_mean(mean, sigma):
    d = LengthDistribution(kind="lognormal", mean=mean, sigma=sigma)
    x, w = points(d)
    assert float(w @ x) == pytest.approx(mean, rel=1e-6)
    assert float(w @ x ** 2) == pytest.approx(mean ** 2 * np.exp(sigma ** 2), rel=1e-4)
    # The median of a lognormal is its mean / exp(sigma^2 / 2).
    assert quantile(d, 0.5) == pytest.approx(mean / np.exp(sigma ** 2 / 2), rel=1e-9)


def test_trace_shapes_carry_their_published_means():
    # Published means: Kwon et al. 2023 Fig. 11 (ShareGPT 161.31 in / 337.99 out); Zheng et al. 2024 Table 1
    # (LMSYS-Chat-1M 69.5 / 214.5); Qin et al. 2025 (Mooncake trace 7,590 / 182).
    assert TRACE_SHAPES["sharegpt"][:2] == (161.31, 337.99)
    assert TRACE_SHAPES["lmsys-chat"][:2] == (69.5, 214.5)
    assert TRACE_SHAPES["rag-long"][:2] == (7590.0, 182.0)


def test_long_prompt_tail_lowers_the_slo_concurrency():
    # A TTFT SLO met at the mean prompt can fail at its p99: the distribution's SLO concurrency is never above
    # the mean's when the p99 prompt is longer than the mean.
    job = ServeJob(input_len=4000, output_len=256, batch=16, ttft_slo_s=1.0, tpot_slo_s=0.05,
                   input_len_dist=LengthDistribution(kind="lognormal", mean=4000, sigma=0.8))
    e = estimate_serving(LLAMA70B, CLUSTER, PLAN, job)
    assert e.lengths is not None and e.slo_batch is not None and e.slo_batch > 0
    assert e.lengths.slo_batch is not None and e.lengths.slo_batch < e.slo_batch


def test_histogram_quantile_and_mean():
    d = LengthDistribution(kind="histogram", lengths=(100, 1000, 10_000), weights=(0.5, 0.4, 0.1))
    assert mean_length(d) == pytest.approx(1450.0)
    assert (quantile(d, 0.5), quantile(d, 0.9), quantile(d, 0.99)) == (100.0, 1000.0, 10_000.0)


BASE = ["estimate", "--mode", "infer", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--nodes", "1",
        "--tp", "4"]


def test_cli_named_trace_and_histogram_file(cli, tmp_path):
    r = cli(*BASE, "--input-len-dist", "rag-long", "--output-len-dist", "lognormal:mean=300,sigma=0.5", "--json")
    assert r.code == 0, r.err
    d = r.json()
    assert d["workload"]["input_len"] == 7590 and d["workload"]["output_len"] == 300
    ld = d["length_distribution"]
    assert set(ld["ttft_s"]) == {"p50", "p90", "p99"} and ld["ttft_s"]["p99"] > d["ttft_s"]
    hist = tmp_path / "lengths.csv"
    hist.write_text("length,weight\n# a comment\n500,3\n4000,1\n")
    r = cli(*BASE, "--input-len-dist", str(hist), "--json")
    assert r.code == 0, r.err
    assert r.json()["workload"]["input_len"] == 1375
    assert r.json()["length_distribution"]["input"]["lengths"] == [500, 4000]


@pytest.mark.parametrize("args,needle", [
    (["--input-len-dist", "lognormal:mean=2000"], "write lognormal:mean=M,sigma=S"),
    (["--input-len-dist", "lognormal:mean=2000,sigma=9"], "sigma"),
    (["--input-len-dist", "lognormal:mean=0,sigma=1"], "mean"),
    (["--input-len-dist", "sharegtp"], "not lognormal:mean=M,sigma=S, a trace shape"),
    (["--input-len-dist", "sharegpt", "--input-len", "500"], "both set the input length"),
])
def test_cli_bad_distribution_exits_2(cli, args, needle):
    r = cli(*BASE, *args)
    assert r.code == 2
    assert needle in r.err and "Traceback" not in r.err


def test_cli_bad_histogram_file_exits_2(cli, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("500,3\nlots,1\n")
    r = cli(*BASE, "--input-len-dist", str(bad))
    assert r.code == 2 and "line 2" in r.err and "length,weight" in r.err
    zero = tmp_path / "zero.csv"
    zero.write_text("500,0\n")
    r = cli(*BASE, "--input-len-dist", str(zero))
    assert r.code == 2 and "not all 0" in r.err


@pytest.mark.parametrize("target,program,flag", [("vllm", "vllm serve", "max_model_len"),
                                                 ("sglang", "python -m sglang.launch_server", "context_length")])
def test_export_context_limit_covers_the_p99_request(target, program, flag):
    # The engines refuse a request longer than the context limit: with distributions it is the p99 prompt +
    # the p99 output (a lognormal's p99 is its median x exp(2.326 sigma)), not the means.
    import dataclasses

    from llmplan.planfile import load_plan
    from test_export import PLANS, parse_serve_export

    base = load_plan(PLANS / "serve.json")
    d = LengthDistribution(kind="lognormal", mean=2048, sigma=0.8)
    pf = dataclasses.replace(base, job=base.serve_job.model_copy(update={"input_len_dist": d}))
    ns, unknown = parse_serve_export(pf, target)
    assert not unknown
    p99 = 2048 / np.exp(0.8 ** 2 / 2) * np.exp(0.8 * 2.3263478740)
    assert int(getattr(ns, flag)) == int(np.ceil(p99 + 512))
