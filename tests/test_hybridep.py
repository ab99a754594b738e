"""HybridEP's all-to-all inside one NVLink domain, priced from DeepEP's published GB200 table
(docs/formulas.md#comm.hybridep)."""

from __future__ import annotations

import pytest

from llmplan.cost.comm import (
    HYBRIDEP_BENCH,
    Dispatch,
    Transfer,
    hybridep_prob_share,
    hybridep_rate,
    ranks_per_token,
    transfer_seconds,
)
from llmplan.specs.plan import ClusterSpec
from llmplan.specs.registry import builtin_systems
from llmplan.topology.placement import span_of_ranks

# Published: deepseek-ai/DeepEP docs/README_Hybrid-EP.md at 94a9f8f6 (hybrid-ep branch), "GB200 Platform",
# HybridEP, kernel time only: 4,096 tokens per rank of hidden 7,168, top-8, 8 local experts per rank, uniform
# random routing; algorithm bandwidth in GB/s = the rows a rank receives / time (tests/test_hybrid_ep.py,
# nvl_recv_bytes). Columns: dispatch FP8, dispatch BF16, combine; rows: ranks, SMs. (The torch API columns add the
# copy out of / into the registered buffer, which Megatron's dispatch_with_permute does as the permute llmplan
# prices on its own: docs/formulas.md#comm.hybridep.)
PUBLISHED = {
    (8, 16): (620.98, 750.15, 684.27), (8, 32): (713.98, 764.03, 737.13),
    (16, 16): (577.17, 661.93, 600.75), (16, 32): (650.48, 706.95, 666.26),
    (24, 16): (360.12, 637.80, 565.53), (24, 32): (577.96, 665.97, 639.80),
    (32, 16): (286.93, 629.79, 547.25), (32, 32): (538.86, 642.23, 605.15),
    (36, 16): (260.53, 612.85, 543.27), (36, 32): (489.27, 632.31, 596.99),
}
FP8_BYTES = (1 + 4 / 128) / 2  # the benchmark's FP8 bytes per BF16 byte: one byte a value, one fp32 scale per 128


def _bench(n: int, sms: int) -> tuple[Transfer, ClusterSpec, float]:
    """A dispatch and a combine of the benchmark's rows on n GB200 of one NVL72 domain, and their bytes."""
    cluster = ClusterSpec(system=builtin_systems()["gb200-nvl72"], num_nodes=n // 4)
    span = span_of_ranks(list(range(n)), cluster)
    assert span.domains == 1
    T, h, k, local = HYBRIDEP_BENCH
    B = T * ranks_per_token(local * n, k, n, "random") * h * 2.0
    return Transfer("all-to-all", 2, B, span, Dispatch(local * n, k, "random", None, sms, "hybridep", h)), cluster, B


@pytest.mark.parametrize("n,sms", sorted(PUBLISHED))
def test_hybridep_dispatch_and_combine_match_the_published_gb200_table(n, sms):
    # Tolerance: 3% at 32 SMs (the recipes' count), 8% at 16 (the table's 16-SM column is less regular). The
    # latency term is part of the price, not removed. Priced on gb200-nvl72, whose NVLink is the table's.
    t, cluster, B = _bench(n, sms)
    _, bf16, combine = PUBLISHED[(n, sms)]
    published = B / (bf16 * 1e9) + B / (combine * 1e9)
    assert transfer_seconds(t, cluster.system) == pytest.approx(published, rel=0.03 if sms == 32 else 0.08)


@pytest.mark.parametrize("n", [8, 16, 24, 32, 36])
def test_the_fp8_column_says_ranks_add_latency_not_time_per_byte(n):
    # The FP8 dispatch (not used to read the rates) moves about half the BF16 bytes at the same ranks and tokens,
    # and the same probs (4 bytes for each of the domain's 8n experts a row: the benchmark's dispatch passes
    # topk_weights). Priced with the per-peer latency and the per-byte time read from the BF16 columns, it lands
    # within 9% of the published FP8 kernel time at 32 SMs (the price is the dispatch-and-combine mean; the
    # dispatch alone runs a few % faster a byte); had the ranks slowed every byte instead (the same BF16 points,
    # read as a per-byte time that grows with the ranks), the FP8 dispatch at 36 ranks would be priced 20% fast.
    beta, peer = hybridep_rate(32)
    t, _, B = _bench(n, 32)
    fp8 = FP8_BYTES * B
    probs = 2 * hybridep_prob_share(t.dispatch, n, n) * B  # the dispatch carries them all; the share is a mean
    published = fp8 / (PUBLISHED[(n, 32)][0] * 1e9)
    assert beta * (fp8 + probs) + peer * (n - 1) == pytest.approx(published, rel=0.09)
    bf16_rate = 2 / (1 / PUBLISHED[(n, 32)][1] + 1 / PUBLISHED[(n, 32)][2]) * 1e9
    if n == 36:
        assert fp8 / bf16_rate < 0.85 * published


def test_hybridep_copies_the_domains_probs_with_each_row():
    # deepseek-ai/DeepEP csrc/hybrid_ep/backend/hybrid_ep_backend.cuh at 17cfb81: the forward dispatch stores,
    # with each row, NUM_OF_EXPERTS_PER_RANK x NUM_OF_RANKS_PER_NODE fp32 probs on the receiving rank, and the
    # backward combine loads as many; Megatron-LM's HybridEPDispatch passes the probs forward and their gradient
    # back, so half of a layer's calls carry them. By hand, as a share of the rows' bf16 bytes over all calls:
    # Nemotron-3 Super on EP64 in one NVL72 domain, 8 x 64 = 512 probs (2,048 bytes) on 1,024-wide latent rows
    # (2,048 bytes) in half the calls: 0.5; DeepSeek-V3 on EP64, 4 x 64 x 4 = 1,024 bytes on 14,336: 0.5 / 14;
    # on H100 EP16 (two 8-GPU domains) a Qwen3-30B-A3B row carries 8 experts x 8 ranks, 256 bytes on 4,096: 1/32.
    from llmplan.cost.comm import dispatch_coeffs
    assert hybridep_prob_share(Dispatch(512, 22, "random", None, 32, "hybridep", 1024), 64, 64) == 0.5
    assert hybridep_prob_share(Dispatch(256, 8, "random", None, 32, "hybridep", 7168), 64, 64) == pytest.approx(
        0.5 / 14)
    assert hybridep_prob_share(Dispatch(128, 8, "random", None, 32, "hybridep", 2048), 16, 8) == 1 / 32
    assert hybridep_prob_share(Dispatch(512, 22, "random", None, 32, "hybridep"), 64, 64) == 0.0
    # ... and the per-byte time of a Super call on 64 GB200 grows by that share; the peers' latency does not
    cluster = ClusterSpec(system=builtin_systems()["gb200-nvl72"], num_nodes=16)
    span = span_of_ranks(list(range(64)), cluster)
    (bare,) = dispatch_coeffs("all-to-all", span, cluster.system, Dispatch(512, 22, "random", None, 32, "hybridep"))
    (rows,) = dispatch_coeffs("all-to-all", span, cluster.system,
                              Dispatch(512, 22, "random", None, 32, "hybridep", 1024))
    assert rows.beta == pytest.approx(1.5 * bare.beta) and rows.alpha == bare.alpha


def test_a_64_rank_domain_pays_its_peers_latency_at_the_recipes_message():
    # Nemotron-3 Super on 64 GB200 (EP64, 4,096 tokens a rank after TP2's sequence split, 1,024-wide latent rows):
    # its ~160 MB per call costs more in per-peer latency (63 peers x ~4.7 us) than in bytes at ~800 GB/s, and
    # more ranks never make a call cheaper.
    times = []
    for n in (8, 16, 32, 64):
        cluster = ClusterSpec(system=builtin_systems()["gb200-nvl72"], num_nodes=n // 4)
        span = span_of_ranks(list(range(n)), cluster)
        t = Transfer("all-to-all", 1, 160e6, span, Dispatch(512, 22, "random", None, 32, "hybridep"))
        times.append(transfer_seconds(t, cluster.system))
    assert times == sorted(times)
    beta, peer = hybridep_rate(32)
    assert 63 * peer > 160e6 * beta


def test_hybridep_sms_below_the_published_range_bind_and_above_it_do_not():
    # Between 16 and 32 SMs the table's rates are interpolated; above 32 they hold (at 8 ranks the published
    # BF16 dispatch is the same at 16 and 32 SMs); below 16 the bytes a second fall with the SMs.
    assert hybridep_rate(48) == hybridep_rate(32)
    assert hybridep_rate(8)[0] == pytest.approx(2 * hybridep_rate(16)[0])
    assert hybridep_rate(16)[0] >= hybridep_rate(24)[0] >= hybridep_rate(32)[0]


def test_the_backend_reaches_the_estimate():
    # The deepep backend keeps DeepEP's per-SM rate (comm.ep_sms); the hybridep one prices the domain's peers.
    from llmplan.estimate import estimate_training
    from llmplan.specs.plan import ParallelPlan
    from llmplan.specs.registry import builtin_models
    cluster = ClusterSpec(system=builtin_systems()["gb200-nvl72"], num_nodes=16)
    plan = ParallelPlan(dp=64, ep=64, etp=1, global_batch=64, seq_len=4096, moe_dispatcher="deepep",
                        moe_dispatch_sms=32)
    m = builtin_models()["qwen3-30b-a3b"]
    ep = {b: float(estimate_training(m, cluster, plan.model_copy(update={"moe_flex_backend": b})).comm.axes["ep"]
                   .seconds) for b in ("deepep", "hybridep")}
    assert ep["hybridep"] > ep["deepep"]


def test_hybridep_gathers_the_routing_map_before_each_forward_dispatch():
    # DeepEP csrc/hybrid_ep/executor/executor.cu (allgather_routing_map): an NCCL all-gather of the bool
    # [tokens, experts] map over the EP group, once per forward dispatch (the backward reuses the handle).
    # By hand: 4,096 tokens a rank x 128 experts x 1 byte, gathered over 64 ranks = 33,554,432 bytes a call,
    # one call per MoE layer and micro-batch; DeepEP's deepep backend gathers no map.
    from llmplan.estimate import estimate_training
    from llmplan.specs.plan import ParallelPlan
    from llmplan.specs.registry import builtin_models
    cluster = ClusterSpec(system=builtin_systems()["gb200-nvl72"], num_nodes=16)
    plan = ParallelPlan(dp=64, ep=64, etp=1, global_batch=128, seq_len=4096, moe_dispatcher="deepep",
                        moe_dispatch_sms=32, moe_flex_backend="hybridep")
    m = builtin_models()["qwen3-30b-a3b"]
    assert m.num_experts == 128
    ep = estimate_training(m, cluster, plan).comm.axes["ep"].transfers
    gathers = [t for t in ep if t.collective == "all-gather"]
    assert len(gathers) == 1 and gathers[0].message == 4096 * 128 * 64
    assert gathers[0].calls == plan.num_microbatches * m.num_hidden_layers
    deepep = estimate_training(m, cluster, plan.model_copy(update={"moe_flex_backend": "deepep"})).comm.axes["ep"]
    assert [t.collective for t in deepep.transfers] == ["all-to-all"]


def test_vectorised_search_prices_hybridep_as_the_scalar_estimate():
    # The search's array path (search.evaluate) and estimate_training give the same step for a HybridEP plan,
    # inside one NVL72 domain and across two of them.
    from llmplan.estimate import estimate_training
    from llmplan.search.evaluate import evaluate
    from llmplan.search.grid import from_plan
    from llmplan.specs.plan import ParallelPlan
    from llmplan.specs.registry import builtin_models
    m = builtin_models()["qwen3-30b-a3b"]
    for system, nodes in (("gb200-nvl72", 16), ("dgx-h100", 2)):
        cluster = ClusterSpec(system=builtin_systems()[system], num_nodes=nodes)
        gpus = cluster.num_gpus
        plan = ParallelPlan(dp=gpus, ep=gpus, etp=1, global_batch=2 * gpus, seq_len=4096, moe_dispatcher="deepep",
                            moe_flex_backend="hybridep", moe_dispatch_sms=32, ep_comm_overlap=True)
        scalar = estimate_training(m, cluster, plan)
        vec = evaluate(m, cluster, from_plan(plan))
        assert float(vec.step.total[0]) == pytest.approx(float(scalar.time.total), rel=1e-9)


def test_megatron_export_names_the_plans_backend():
    # --moe-flex-backend reaches Megatron-LM's --moe-flex-dispatcher-backend, under a full-iteration graph too
    # (where check_plan cuda_graphs_flex_backend admits hybridep alone).
    import dataclasses

    from test_export import PLANS, parse_megatron

    from llmplan.export import render_all
    from llmplan.planfile import load_plan
    base = load_plan(PLANS / "moe_train.json")
    for backend in ("deepep", "hybridep"):
        plan = base.plan.model_copy(update={"moe_dispatcher": "deepep", "moe_flex_backend": backend})
        ns, _ = parse_megatron(render_all(dataclasses.replace(base, plan=plan), "megatron")[0]["megatron_pretrain.sh"])
        assert ns.moe_token_dispatcher_type == "flex" and ns.moe_flex_dispatcher_backend == backend


def test_the_published_rate_scales_with_the_gpus_nvlink():
    # Inside an NVSwitch domain HybridEP's per-byte time is the published GB200 one scaled by the NVLink's
    # bandwidth (900 GB/s a direction on GB200, 450 on H100: twice the time), not NCCL's ring efficiency; the
    # per-peer latency is the published one on both.
    from llmplan.cost.comm import dispatch_coeffs
    beta, peer = hybridep_rate(32)
    for system, ratio in (("gb200-nvl72", 1.0), ("dgx-h100", 2.0)):
        cluster = ClusterSpec(system=builtin_systems()[system], num_nodes=2 if system == "gb200-nvl72" else 1)
        span = span_of_ranks(list(range(8)), cluster)
        (c,) = dispatch_coeffs("all-to-all", span, cluster.system, Dispatch(64, 8, "random", None, 32, "hybridep"))
        assert c.beta == pytest.approx(ratio * beta)
        assert c.alpha == pytest.approx(7 * peer)


def test_mbridge_rows_run_their_presets_flex_backend(published_runs, acc):
    # Megatron-Bridge's presets, read by hand: Qwen3-30B-A3B's H100 preset ran deepep at v0.3.0 (26.02) and
    # hybridep from v0.3.1 (26.02.01; f29a269f8 "Update Qwen3 30B H100 Base Configs with HybridEP"); DeepSeek-V3's
    # B200 MXFP8 V2 preset sets deepep (deepseek_workload_base_configs.py DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2
    # at v0.4.2); the other flex presets hybridep (scripts/performance/configs/*/*_workload_base_configs.py)
    expected = {
        "mbridge-26.02-pretrain-qwen3-30b-a3b-dgx-h100-16gpu-fp8-tp1pp2cp1ep8vp12gbs1024mbs1": "deepep",
        "mbridge-26.02.01-pretrain-qwen3-30b-a3b-dgx-h100-16gpu-fp8-tp1pp2cp1ep8vp12gbs1024mbs1": "hybridep",
        "mbridge-26.04.01-pretrain-deepseekv3-dgx-b200-256gpu-mxfp8-tp1pp8cp1ep32vp2gbs4096mbs1": "deepep",
        "mbridge-26.06-pretrain-qwen3-30b-a3b-dgx-h100-16gpu-fp8-tp1pp1cp1ep16vpnagbs1024mbs1": "hybridep",
    }
    for rid, backend in expected.items():
        rec = published_runs[rid]  # the 26.02 row is read, not scored (MBRIDGE_SKIP: Megatron-Bridge issue #1998)
        plan = acc.plan_for(rec, acc.family(rid), rec["hardware"]["gpus"])
        assert (plan.moe_dispatcher, plan.moe_flex_backend) == ("deepep", backend), rid


def test_the_2509_deepseek_v3_h100_row_runs_deepep(published_runs, acc):
    # Megatron-Bridge scripts/performance/run_script.py at v0.1.0rc4 (6725f7049, the 25.09 container):
    # enable_deepep = gpu in ["h100"] for DeepSeek-V3, passed to deepseek_v3_pretrain_config, which sets
    # moe_token_dispatcher_type "flex" and moe_enable_deepep True (DeepEP, not HybridEP; issue #1731: the H100
    # baseline ran DeepEP and went OOM with HybridEP). The B200 / GB200 rows of that release run token drop (alltoall).
    rid = "mbridge-25.09-pretrain-deepseekv3-dropless-dgx-h100-1024gpu-fp8-tp2pp8cp1ep64vp4gbs8192mbs1"
    rec = published_runs[rid]
    plan = acc.plan_for(rec, acc.family(rid), rec["hardware"]["gpus"])
    assert (plan.moe_dispatcher, plan.moe_flex_backend) == ("deepep", "deepep")
    for drop in ("mbridge-25.09-pretrain-deepseekv3-tokendrop-dgx-b200-256gpu-fp8-tp1pp16cp1ep8vp1gbs2048mbs1",
                 "mbridge-25.09-pretrain-deepseekv3-tokendrop-dgx-gb200-256gpu-fp8-tp1pp4cp1ep64vp4gbs2048mbs1"):
        assert acc.mbridge_moe_recipe(published_runs[drop])[0] is False, drop


def test_fp8_dispatch_carries_the_same_absolute_prob_bytes_a_row_as_bf16():
    # HybridEP's probs are fp32 (hybrid_ep_backend.cuh at 17cfb81) whatever the rows' dtype: with ep_dispatch_fp8
    # the dispatch rows shrink to 1 + 4/128 bytes an element, the probs a row do not. Prob bytes a call =
    # share x the call's message; the fp8 and the bf16 transfer (same calls, same rows) must carry the same.
    from llmplan.cost.comm import ep_transfers
    from llmplan.specs.plan import ParallelPlan
    from llmplan.specs.registry import builtin_models

    m = builtin_models()["qwen3-30b-a3b"]
    plan = ParallelPlan(dp=8, ep=8, moe_dispatcher="deepep", moe_flex_backend="hybridep", ep_dispatch_fp8=True)
    fp8, bf16 = ep_transfers(m, plan, "ep")[:2]
    assert fp8.message < 0.6 * bf16.message and fp8.calls == bf16.calls
    probs = [hybridep_prob_share(t.dispatch, 8, 8) * t.message for t in (fp8, bf16)]
    assert probs[1] > 0
    assert probs[0] == pytest.approx(probs[1], rel=1e-12)
    # and by hand: half the calls carry 4 x E probs a row (E/8 a rank x 8 ranks) beside the bf16 row's 2 x w
    assert probs[1] / bf16.message == pytest.approx(0.5 * 4 * m.num_experts / (2 * m.expert_width), rel=1e-12)
