"""ZeRO-3 over thousands of GPUs without a pipeline, priced as Megatron-FSDP runs it: one collective per unit
(docs/formulas.md#comm.zero3_unit, docs/validation.md#unusual-layout)."""

import pytest

from llmplan.cost.comm import dp_transfers, transfer_seconds
from llmplan.estimate import estimate_training
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems
from llmplan.topology.placement import DEFAULT_ORDER, place

DSV3 = builtin_models()["deepseek-v3"]
GB300 = builtin_systems()["gb300-nvl72"].with_options(domain_gpus=64)
CLUSTER = ClusterSpec(system=GB300, num_nodes=512, gpus_per_node=4)  # 2,048 GPUs in 32 NVLink domains of 64

# NCCL v2.21.5-1 src/graph/tuning.cc: ring LL128 baseLat 14 us, hwLat NVLink 1.9 us a step, network 4.0 us;
# an all-gather / reduce-scatter over n ranks in k domains takes n - 1 steps, k - 1 of them over the network.
LL128_2048 = 14e-6 + (2047 - 31) * 1.9e-6 + 31 * 4.0e-6
LL128_128 = 14e-6 + (127 - 31) * 1.9e-6 + 31 * 4.0e-6


def first_plan(**kw) -> ParallelPlan:
    """The reference search's #1 before docs/validation.md#unusual-layout: tp1 pp1 dp2048 ep16 ZeRO-3 mb2,
    Megatron-FSDP, MXFP8, DeepEP (Hybrid-EP), global batch 4,096 x 4,096 (one micro-batch a step)."""
    base = dict(tp=1, pp=1, dp=2048, ep=16, etp=1, zero=3, recompute="none", micro_batch=2, global_batch=4096,
                seq_len=4096, dtype="fp8", recipe="mxfp8", grad_dtype="bf16", megatron_fsdp=True,
                moe_dispatcher="deepep", moe_flex_backend="hybridep")
    return ParallelPlan(**{**base, **kw})


def test_megatron_fsdp_zero3_gathers_and_reduces_each_unit_on_its_own_group():
    # Megatron-FSDP (NVIDIA/Megatron-LM d98e8a64dd, megatron_fsdp/param_and_grad_buffer.py): the FSDP units are
    # the transformer layers (61, and the MTP module's layer), each unit's expert and non-expert buckets are two
    # bucket groups, each coalesced into one all-gather / reduce-scatter on its own DP group; the embedding and
    # output layer sit outside the units (counted as one more dense unit). A micro-batch gathers every unit
    # twice and reduce-scatters it once.
    p = first_plan()
    assert not check_plan(DSV3, p, CLUSTER)
    spans = place(p.degrees, CLUSTER)
    t = {(x.collective, x.group.size): x for x in dp_transfers(DSV3, p, spans["dpcp"], spans["edp"])
         if x.calls > 0}
    dense, expert = 61 + 1 + 1, 58 + 1  # layers + MTP (+ root); MoE layers + the MTP's MoE layer
    assert t[("all-gather", 2048)].calls == 2 * dense
    assert t[("reduce-scatter", 2048)].calls == dense
    assert t[("all-gather", 128)].calls == 2 * expert
    assert t[("reduce-scatter", 128)].calls == expert
    # each call pays its ring's start: at least NCCL's LL128 latency over 2,048 ranks in 32 domains (3.97 ms)
    for (op, n), x in t.items():
        assert transfer_seconds(x, GB300) / x.calls >= (LL128_2048 if n == 2048 else LL128_128) * (1 - 1e-9)


def test_the_unit_latencies_are_what_the_zero3_plan_pays_at_2048_gpus():
    # 3 x 63 dense calls at >= 3.97 ms: 0.75 s of ring starts a micro-batch beside 1.26 s of compute, where
    # priced as three calls the dense group took 0.17 s in all
    e = estimate_training(DSV3, CLUSTER, first_plan())
    dense = [x for x in e.comm.axes["dp"].transfers if x.group.size == 2048]
    assert sum(transfer_seconds(x, GB300) for x in dense) >= 189 * LL128_2048
    assert float(e.time.exposed["dp"]) > 0.5


def test_the_search_arrays_price_the_units_as_the_estimate():
    from llmplan.search.evaluate import evaluate
    from llmplan.search.grid import from_plan
    for p in (first_plan(), first_plan(zero=2), first_plan(megatron_fsdp=False)):
        vec, scalar = evaluate(DSV3, CLUSTER, from_plan(p)), estimate_training(DSV3, CLUSTER, p)
        assert float(vec.step.total[0]) == pytest.approx(float(scalar.time.total), rel=1e-9)


def test_a_sharded_first_plan_without_a_pipeline_across_domains_is_set_beside_the_usual_kind():
    # the search's explanation for an unusual #1 (report.search.usual_line): ZeRO-3 with no pipeline over 32
    # NVLink domains against the best ZeRO-1 plan, with what each moves and how often
    from llmplan.report.search import usual_line, usual_why
    from llmplan.search.run import usual_kind
    a = estimate_training(DSV3, CLUSTER, first_plan())
    b = estimate_training(DSV3, CLUSTER, first_plan(tp=2, sp=True, dp=1024, ep=64, zero=1, megatron_fsdp=False))
    assert usual_kind(a, CLUSTER, DEFAULT_ORDER) == "zero"
    assert usual_kind(b, CLUSTER, DEFAULT_ORDER) is None  # ZeRO-1, EP fills the domain
    why = usual_why(a, b, CLUSTER)
    calls = 3 * (63 + 59)  # docs/formulas.md#comm.zero3_unit, one micro-batch a step
    assert why[0].startswith(f"#1 shards its weights and gradients every micro-batch (ZeRO-3, no pipeline) over "
                             f"dp x cp 2,048 on 32 NVLink domains: {calls:,} DP calls a step")
    assert "it, ZeRO-1 pp 1" in why[0]
    assert why[1] == "#1's ep 16 on 16 GPUs, NVLink over 4 nodes, its ep 64 on 64 GPUs, NVLink over 16 nodes"
    line = usual_line(a, b, CLUSTER)
    assert line.startswith("#1 vs best usual layout (tp2 sp pp1 dp1024 ep64/etp1 zero1 none mb2): ")
    assert "exposed dp +" in line  # #1's per-unit gathers and reductions are what it pays


def test_a_narrow_ep_group_is_set_beside_a_wider_one_in_its_domain():
    from llmplan.search.run import usual_kind
    p = first_plan(zero=1, megatron_fsdp=False, micro_batch=1)
    e = estimate_training(DSV3, CLUSTER, p)
    assert usual_kind(e, CLUSTER, DEFAULT_ORDER) == "ep"  # ep 16 of a 64-GPU domain, tp 1
    wide = estimate_training(DSV3, CLUSTER, p.model_copy(update={"ep": 32}))
    assert usual_kind(wide, CLUSTER, DEFAULT_ORDER) is None  # half the domain


def test_a_dense_fsdp_across_nodes_is_not_unusual():
    # review-70c: llama-3.1-8b on 2 DGX A100 put first dp16 ZeRO-2, the FSDP layout the PyTorch-native stacks
    # publish (torchtitan, LLM Foundry), and the line called it unusual; the 'zero' kind is for MoE models
    from llmplan.search.run import usual_kind
    cluster = ClusterSpec(system=builtin_systems()["dgx-a100"], num_nodes=2)
    plan = ParallelPlan(tp=1, pp=1, dp=16, zero=2, recompute="none", micro_batch=2, global_batch=64, seq_len=8192)
    m = builtin_models()["llama-3.1-8b"]
    assert not check_plan(m, plan, cluster) and place(plan.degrees, cluster, DEFAULT_ORDER)["dpcp"].uses_nic
    assert usual_kind(estimate_training(m, cluster, plan), cluster, DEFAULT_ORDER) is None


QWEN = ("search", "--model", "qwen3-30b-a3b", "--hardware", "gb200-nvl72", "--nodes", "18", "--global-batch", "512",
        "--seq-len", "4096", "--top", "3")


def test_search_says_why_a_narrow_ep_first_plan_wins(cli_once):
    # Qwen3-30B-A3B on one GB200 NVL72 rack (64 of its 72 GPUs): #1 runs ep 16 in a 64-GPU NVLink domain, where
    # the published MoE recipes fill the domain with EP; the output sets it beside the best plan with a wider EP
    # in one domain and says where each EP group runs (text and JSON; added keys only)
    text = cli_once(*QWEN, "--explain")
    assert text.code == 0, text.err
    first = cli_once(*QWEN, "--json").json()
    p = first["plans"][0]["plan"]
    assert p["tp"] == 1 and 4 * p["ep"] <= 64
    usual = first["usual_layout"]["plan"]
    assert usual["ep"] >= 2 * p["ep"] and usual["ep"] * usual["etp"] <= 64
    assert set(first["explain"]["vs_usual_layout"]) >= {"throughput_ratio", "exposed_ep_s", "memory_bytes"}
    why = first["usual_layout_why"]
    assert any(w.startswith(f"#1's ep {p['ep']} on {p['ep']} GPUs, NVLink") for w in why)
    flat = " ".join(text.out.split())
    assert "#1 vs best usual layout (" in flat and f"#1's ep {p['ep']} on {p['ep']} GPUs, NVLink" in flat
    assert "Why #1 (" in flat and "beats best usual layout" in flat
    assert max(len(line) for line in text.out.splitlines()) <= 80
