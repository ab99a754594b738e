"""Issue 36 follow-ups: co-located EP that spans replicas (vLLM's DP + EP), the ordinary serving search over
wide-EP layouts and the MoE serving options, queueing in TTFT, and two-batch overlap in prefill."""

from __future__ import annotations

import pytest

from llmplan.cost.inference import Spans, expert_exchange_seconds, step_compute_seconds
from llmplan.serving import replica_spans
from llmplan.specs.check import check_serve_plan
from llmplan.specs.plan import ClusterSpec
from llmplan.specs.registry import builtin_models, builtin_systems
from llmplan.specs.serve import ServeJob, ServePlan
from llmplan.topology.collectives import collective_time

DSV3 = builtin_models()["deepseek-v3"]
H100 = builtin_systems()["dgx-h100"]


def _node(nodes: int = 2) -> ClusterSpec:
    return ClusterSpec(system=H100, num_nodes=nodes)


# --- 1. vLLM's DP + EP: the experts see every DP rank's tokens ------------------------------------------------

def test_vllm_dp_plus_ep_experts_see_every_replicas_tokens():
    """vLLM docs (Expert Parallel Deployment): with --enable-expert-parallel and --data-parallel-size the EP
    group is TP x DP ranks and attention runs data-parallel, so the expert GEMMs and weight reads of such a
    plan are those of the same layout under --dp-attention: each rank's experts get the tokens of all 16."""
    cluster = _node(2)
    vllm = ServePlan(tp=1, dp=16, ep=16, weight_dtype="fp8")
    dpa = vllm.model_copy(update={"dp_attention": True})
    spans = replica_spans(vllm, cluster)
    for tokens in (8.0, 64.0, 512.0):
        a = step_compute_seconds(DSV3, vllm, H100, spans, tokens, tokens * 2000, 0.0, True)
        b = step_compute_seconds(DSV3, dpa, H100, spans, tokens, tokens * 2000, 0.0, True)
        assert float(a) == pytest.approx(float(b), rel=1e-12)


def test_vllm_dp_plus_ep_exchange_is_an_all_gather_and_a_reduce_scatter():
    """vLLM's default all2all backend (allgather_reducescatter): per MoE layer every rank gathers the 16-bit
    hidden states of all ep / tp replicas, then reduce-scatters the expert outputs back."""
    cluster = _node(2)
    plan = ServePlan(tp=2, dp=8, ep=16, weight_dtype="fp8")
    spans = replica_spans(plan, cluster)
    T = 256.0
    got = float(expert_exchange_seconds(DSV3, plan, H100, spans, T, True))
    imb = 1.0
    from llmplan.cost.serve_moe import serve_ep_imbalance
    imb = float(serve_ep_imbalance(DSV3, plan, T))
    S = 2.0 * DSV3.hidden_size * T * imb * 16 / 2
    per_layer = (collective_time("all-gather", S, spans.ep, H100).seconds
                 + collective_time("reduce-scatter", S, spans.ep, H100).seconds)
    assert got == pytest.approx(DSV3.num_moe_layers * per_layer, rel=1e-9)
    assert imb > 1.0  # the busiest of 16 EP ranks sets the pace, as under DP attention


@pytest.mark.parametrize("engine", ["sglang", "trtllm"])
def test_ep_across_replicas_without_dp_attention_is_vllm_only(engine):
    """SGLang splits TP ranks into EP groups (--ep-size divides --tp-size) and TensorRT-LLM its TP ranks
    (moe_ep_size x moe_tp_size = tp_size): neither spreads experts over replicas without attention DP."""
    plan = ServePlan(tp=1, dp=16, ep=16, weight_dtype="fp8")
    job = ServeJob(input_len=1000, output_len=100, engine=engine)
    assert "ep_serve_engine" in [v.rule for v in check_serve_plan(DSV3, plan, job, _node(2))]
    assert "ep_serve_engine" not in [v.rule for v in check_serve_plan(DSV3, plan, job.model_copy(
        update={"engine": "vllm"}), _node(2))]


def test_ep_across_replicas_with_sglang_exits_2(cli):
    r = cli("estimate", "--mode", "infer", "-m", "deepseek-v3", "--hardware", "dgx-h100", "--nodes", "2",
            "--tp", "1", "--dp", "16", "--ep", "16", "--dtype", "fp8", "--engine", "sglang")
    assert r.code == 2, r.out
    assert "--dp-attention" in r.err and "Traceback" not in r.err


# --- 2. the serving search: wide-EP layouts and the MoE serving options --------------------------------------

SEARCH = ("search", "--mode", "infer", "-m", "deepseek-v3", "--hardware", "dgx-h100", "--nodes", "4", "--dtype",
          "fp8", "--input-len", "2000", "--output-len", "500", "--json")


def test_serving_search_ranks_dp_attention_wide_ep_layouts_for_moe(cli):
    """DeepSeek-V3 in fp8 does not fit a TP-8 replica on H100 with room for the KV cache (LMSYS 2025-05-05
    serve it with DP attention and EP 32 on 4 nodes): the search must reach the wide-EP layouts."""
    r = cli(*SEARCH)
    assert r.code == 0, r.err
    plans = r.json()["plans"]
    assert plans and all(p["plan"]["dp_attention"] for p in plans)
    assert {p["plan"]["ep"] for p in plans} >= {32}
    assert all(p["plan"]["moe_dispatcher"] == "deepep" for p in plans)


def test_serving_search_honours_the_moe_serving_options(cli):
    base = cli(*SEARCH).json()["plans"]
    r = cli(*SEARCH, "--no-two-batch-overlap", "--ep-imbalance", "2.5", "--redundant-experts", "32",
            "--expert-dtype", "fp8")
    assert r.code == 0, r.err
    given = r.json()["plans"]
    for p in given:
        assert p["plan"]["two_batch_overlap"] is False and p["plan"]["redundant_experts"] == 32
        assert p["plan"]["ep_imbalance"] == 2.5 and p["plan"]["expert_dtype"] == "fp8"
    per_gpu = {p["plan"]["ep"]: p["throughput"]["tokens_per_s"] / p["plan"]["dp"] for p in base}
    assert all(p["throughput"]["tokens_per_s"] / p["plan"]["dp"] < per_gpu[p["plan"]["ep"]] for p in given)
    r = cli(*SEARCH, "--no-dp-attention")
    assert r.code == 3 and all(not p["plan"]["dp_attention"] for p in r.json()["plans"])


@pytest.mark.parametrize("extra,needle", [
    (("--phase", "prefill"), "estimate --mode infer --phase prefill"),
    (("--expert-dtype", "fp9"), "expert_dtype"),
])
def test_serving_search_refuses_bad_moe_options(cli, extra, needle):
    r = cli(*SEARCH, *extra)
    assert r.code == 2 and needle in r.err and "Traceback" not in r.err
    r = cli("search", "--mode", "infer", "-m", "llama-3.1-8b", "--hardware", "dgx-h100", "--two-batch-overlap")
    assert r.code == 2 and "dense" in r.err
