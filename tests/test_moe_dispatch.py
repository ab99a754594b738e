"""MoE token dispatch: how many rows a token sends (alltoall: its k copies; DeepEP: one per destination rank),
the routing's memory traffic, and the switches that carry them (check, CLI, export)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.comm import (Dispatch, a2a_shares, blocks_hit, dispatch_rows, ep_rdma_efficiency, expert_groups,
                               ranks_per_token, transfer_seconds)
from llmplan.cost.compute import elementwise_bytes, moe_routing_bytes
from llmplan.cost.moe import routing_imbalance
from llmplan.export import render_all
from llmplan.export.common import CannotExpress
from llmplan.planfile import load_plan
from llmplan.specs.check import check_plan
from llmplan.specs.hf import from_hf_config
from llmplan.specs.model import ModelSpec
from llmplan.estimate import estimate_training
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems
from llmplan.topology.collectives import collective_coeffs

from test_export import PLANS, parse_megatron
from test_specs import DEEPSEEK_V3


@pytest.mark.parametrize("E,k,ep", [(128, 8, 8), (256, 8, 64), (32, 4, 8), (64, 6, 16), (8, 2, 4)])
def test_random_routing_reaches_the_ranks_a_simulation_counts(E, k, ep):
    # k distinct experts drawn uniformly per token, E/ep experts per rank in order: the closed form
    # ep * (1 - C(E - E/ep, k) / C(E, k)) against a seeded count over 20,000 simulated tokens.
    rng = np.random.default_rng(0)
    experts = np.argsort(rng.random((20_000, E)), axis=1)[:, :k]
    ranks = experts // (E // ep)
    counted = np.mean([len(set(row)) for row in ranks])
    assert ranks_per_token(E, k, ep, "random") == pytest.approx(counted, rel=0.01)


@pytest.mark.parametrize("E,k,ep,expected", [
    (32, 4, 8, 1.0),    # GPT-OSS 20B on 8 GPUs (AutoModel): 4 experts per rank, runs of 4 from multiples of 4
    (128, 8, 8, 1.0),   # Qwen3 30B-A3B on 8 GPUs: 16 per rank
    (32, 4, 16, 2.0),   # 2 experts per rank: a run of 4 spans 2 ranks
    (12, 8, 3, 2.0),    # runs start at 0, 8, 4 (i*8 mod 12), 4 per rank: 0..7 -> ranks 0, 1; 8..11, 0..3 -> 2, 0;
])                      # 4..11 -> 1, 2
def test_contiguous_routing_counts_the_ranks_each_run_spans(E, k, ep, expected):
    # NeMo AutoModel's FakeBalancedGate gives token i the experts i*k .. i*k+k-1 (mod E).
    assert ranks_per_token(E, k, ep, "contiguous") == pytest.approx(expected)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.sampled_from([8, 16, 32, 64, 128, 256]), st.integers(1, 8), st.sampled_from([1, 2, 4, 8, 16, 32, 64]),
       st.sampled_from(["random", "contiguous"]))
def test_deepep_never_sends_more_rows_than_the_copies_or_the_ranks(E, k, ep, routing):
    if ep > E or k > E:
        return
    r = ranks_per_token(E, k, ep, routing)
    assert 1.0 - 1e-9 <= r <= min(k, ep) + 1e-9


def test_deepep_sends_a_rank_count_of_rows_and_alltoall_k_copies():
    m = builtin_models()["qwen3-30b-a3b"]
    plan = ParallelPlan(dp=8, ep=8, global_batch=64)
    assert dispatch_rows(m, plan) == m.num_experts_per_tok
    deepep = plan.model_copy(update={"moe_dispatcher": "deepep"})
    assert dispatch_rows(m, deepep) == pytest.approx(ranks_per_token(128, 8, 8, "random"))
    arr = dispatch_rows(m, dataclasses.replace(_Arrays(), moe_dispatcher="deepep"))
    assert arr.tolist() == pytest.approx([ranks_per_token(128, 8, e, "random") for e in (1, 8, 2, 8)])


@dataclasses.dataclass
class _Arrays:
    """The attributes dispatch_rows reads, as a search's plan arrays hold them."""
    ep: np.ndarray = dataclasses.field(default_factory=lambda: np.array([1, 8, 2, 8]))
    moe_dispatcher: str = "alltoall"
    moe_routing: str = "random"


def test_moe_layer_traffic_counts_the_routing_and_permutes_by_hand():
    # One MoE layer's forward-equivalent memory-bound bytes, tp 1, fused kernels and attention, no rotary: two
    # norms (forward 4 and backward 6 an element, over the stage's three passes) and two residual adds (6 each)
    # T h, the gated activation 6 T k f, and the routing's kernels forward + backward over 3 (docs/formulas.md
    # #moe.routing_passes; Transformer Engine d0067d0): the router, unfused by default, 37 E forward (two fills,
    # two out-of-place scatters' copies, .int() and .bool()) and 4 E backward (moe.router_fusion); the row-id map 1 + 4 +
    # 4 + 4 + 4 = 17 E forward; permute (read h, write k h) and unpermute (read k h, write h) in bf16 each way;
    # the permute's backward zero-fills the fp32 probs-gradient row, 4 E. Serving's forward-only
    # moe_routing_bytes stays 8 E + 8 k h.
    m = ModelSpec(name="tiny-moe", hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=4, vocab_size=1000, max_position_embeddings=4096,
                  learned_position_embeddings=True, num_experts=16, num_experts_per_tok=2, moe_intermediate_size=128)
    plan = ParallelPlan(seq_len=1024, micro_batch=2)
    T, h, k, f, E = 2048, 256, 2, 128, 16
    assert moe_routing_bytes(m) == 8 * E + 8 * k * h
    norms_adds = 2 * (4 + 6) / 3 + 2 * 6
    # the auxiliary loss the spec trains (no coefficient given), unfused: 38 E forward, 28 E backward
    # (docs/formulas.md#moe.aux_loss_bytes)
    forward = 37 * E + 38 * E + 17 * E + (2 * h + 2 * k * h) + (2 * k * h + 2 * h)
    backward = 4 * E + 28 * E + (2 * h + 2 * k * h) + (2 * k * h + 2 * h) + 4 * E
    assert elementwise_bytes(m, plan, True) == pytest.approx(
        T * (norms_adds * h + 6 * k * f + (forward + backward) / 3))


def test_deepep_cannot_pad_to_capacity():
    m = builtin_models()["qwen3-30b-a3b"]
    plan = ParallelPlan(dp=8, ep=8, global_batch=64, moe_dispatcher="deepep", moe_capacity_factor=1.25)
    v = [x for x in check_plan(m, plan) if x.rule == "deepep_capacity"]
    assert len(v) == 1 and "moe_capacity_factor (1.25)" in v[0].message and "--moe-dispatcher alltoall" in v[0].message


def test_cli_refuses_deepep_backend_padding_in_one_line(cli):
    # Megatron-Core TransformerConfig.__post_init__ (NVIDIA/Megatron-LM 6513e3e23, d98e8a6): "Flex token dispatcher
    # with deepep backend does not support moe_pad_expert_input_to_capacity" (core_v0.14.0: any flex dispatcher)
    args = ("estimate", "--model", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--ep", "8", "--dp", "8",
            "--moe-dispatcher", "deepep", "--moe-capacity-factor", "1.25")
    r = cli(*args)
    assert r.code == 2 and r.out == "" and len(r.err.strip().splitlines()) == 1
    assert "moe_capacity_factor (1.25)" in r.err and "deepep backend" in r.err and "hybridep" in r.err
    assert "Traceback" not in r.err
    assert cli(*args, "--moe-flex-backend", "hybridep").code == 0


def test_megatron_export_pads_to_capacity_with_hybridep():
    # the HybridEP backend pads (token_dispatcher.py _HybridEPManager drop_and_pad at 6513e3e23): flex, hybridep,
    # the capacity factor and the padding flag, as Megatron-Bridge's Nemotron-3 Super H100 recipe runs them
    base = load_plan(PLANS / "moe_train.json")
    pf = dataclasses.replace(base, plan=base.plan.model_copy(update={
        "moe_dispatcher": "deepep", "moe_flex_backend": "hybridep", "moe_capacity_factor": 1.25}))
    assert check_plan(pf.model, pf.plan, pf.cluster) == []
    ns, _ = parse_megatron(render_all(pf, "megatron")[0]["megatron_pretrain.sh"])
    assert ns.moe_token_dispatcher_type == "flex" and ns.moe_flex_dispatcher_backend == "hybridep"
    assert float(ns.moe_expert_capacity_factor) == 1.25 and ns.moe_pad_expert_input_to_capacity
    deepep = dataclasses.replace(pf, plan=pf.plan.model_copy(update={"moe_flex_backend": "deepep"}))
    assert [v.rule for v in check_plan(deepep.model, deepep.plan, deepep.cluster)] == ["deepep_capacity"]


def test_moe_dispatcher_option_reaches_the_plan_and_the_ep_bytes(cli):
    args = ("estimate", "--model", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--ep", "8", "--dp", "8", "--json")
    a2a, deepep = cli(*args), cli(*args, "--moe-dispatcher", "deepep")
    fake = cli(*args, "--moe-dispatcher", "deepep", "--moe-routing", "contiguous")
    assert a2a.code == 0 and deepep.code == 0 and fake.code == 0, deepep.err
    assert deepep.json()["plan"]["moe_dispatcher"] == "deepep" and fake.json()["plan"]["moe_routing"] == "contiguous"
    bytes_ = [r.json()["comm"]["ep"]["bytes"] for r in (a2a, deepep, fake)]
    # the alltoall dispatcher also sends each row's fp32 routing probability in its own call, one for every two
    # token calls ((2 + r) against (4 + 2r)): 4 B / (2 B x 2,048) on half the calls (token_dispatch's second
    # all_to_all, Megatron-LM d98e8a64dd moe/token_dispatcher.py); DeepEP carries them in the dispatch
    probs = 1 + 0.5 * 4 / (2 * 2048)
    assert bytes_[1] / bytes_[0] == pytest.approx(ranks_per_token(128, 8, 8, "random") / 8 / probs)
    # The fake balanced gate loads every rank alike; random routing sizes the all-to-all for the most-loaded
    # rank (cost.moe.routing_imbalance: 4,096 tokens x 8 experts on EP 8, +0.7%)
    random_plan = ParallelPlan(**{k: v for k, v in a2a.json()["plan"].items() if k in ParallelPlan.model_fields})
    assert bytes_[2] / bytes_[0] == pytest.approx(1 / 8 / probs / routing_imbalance(builtin_models()["qwen3-30b-a3b"],
                                                                          random_plan))
    s = cli("search", "--model", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--moe-dispatcher", "deepep", "--json")
    assert s.code == 0 and s.json()["plans"][0]["plan"]["moe_dispatcher"] == "deepep"
    bad = cli(*args, "--moe-dispatcher", "nccl")
    assert bad.code == 2 and "--moe-dispatcher nccl is not an MoE dispatcher: it must be one of alltoall, deepep" in bad.err
    bad = cli(*args, "--moe-routing", "greedy")
    assert bad.code == 2 and "--moe-routing greedy is not a routing: it must be one of random, contiguous" in bad.err
    assert "Traceback" not in bad.err


def test_megatron_exports_deepep_as_the_flex_dispatcher_and_torchtitan_refuses_it():
    base = load_plan(PLANS / "moe_train.json")
    pf = dataclasses.replace(base, plan=base.plan.model_copy(update={"moe_dispatcher": "deepep"}))
    ns, _ = parse_megatron(render_all(pf, "megatron")[0]["megatron_pretrain.sh"])
    assert ns.moe_token_dispatcher_type == "flex" and ns.moe_flex_dispatcher_backend == "deepep"
    assert ns.moe_flex_dispatcher_num_sms is None  # the plan leaves Megatron's default
    sms = dataclasses.replace(pf, plan=pf.plan.model_copy(update={"moe_dispatch_sms": 32}))
    ns, _ = parse_megatron(render_all(sms, "megatron")[0]["megatron_pretrain.sh"])
    assert int(ns.moe_flex_dispatcher_num_sms) == 32
    ns, _ = parse_megatron(render_all(base, "megatron")[0]["megatron_pretrain.sh"])
    assert ns.moe_token_dispatcher_type == "alltoall"
    fsdp = dataclasses.replace(pf, plan=pf.plan.model_copy(update={"zero": 3}))
    with pytest.raises(CannotExpress, match="DeepEP in a model's config function"):
        render_all(fsdp, "torchtitan")
    gate = dataclasses.replace(base, plan=base.plan.model_copy(update={"moe_routing": "contiguous"}))
    with pytest.raises(CannotExpress, match="contiguous MoE routing"):
        render_all(gate, "megatron")


@pytest.mark.parametrize("E,k,b,G,t", [(256, 8, 4, 8, 4),    # DeepSeek-V3, a rank of EP 64 (inside a group)
                                       (256, 8, 32, 8, 4),   # a node of EP 64 (one group)
                                       (256, 8, 64, 8, 4),   # a node of EP 32 (two groups)
                                       (64, 6, 16, 16, 3)])  # 4-expert groups, blocks of 4 groups
def test_group_limited_routing_reaches_the_blocks_a_simulation_counts(E, k, b, G, t):
    # Group-limited routing (DeepSeek-V3: n_group 8, topk_group 4): t of the G groups per token, then k
    # distinct experts drawn uniformly from those t·E/G; blocks of b consecutive experts (a rank, a node).
    rng = np.random.default_rng(1)
    s = E // G
    groups = np.argsort(rng.random((20_000, G)), axis=1)[:, :t]
    pool = (groups[:, :, None] * s + np.arange(s)).reshape(20_000, t * s)
    pick = np.take_along_axis(pool, np.argsort(rng.random(pool.shape), axis=1)[:, :k], axis=1)
    counted = np.mean([len(set(row)) for row in pick // b])
    assert blocks_hit(E, k, b, "random", (G, t)) == pytest.approx(counted, rel=0.01)


def test_hf_group_limited_routing_is_read_and_checked():
    # DeepSeek-V3's config.json: n_group 8, topk_group 4 (the excerpt in tests/test_specs.py).
    hf = ModelSpec(**from_hf_config(DEEPSEEK_V3, "deepseek-v3"))
    assert (hf.n_group, hf.topk_group) == (8, 4)
    m = builtin_models()["deepseek-v3"]
    assert (m.n_group, m.topk_group) == (8, 4)
    assert expert_groups(m) == (8, 4)
    with pytest.raises(ValueError, match=r"n_group \(6\) must divide num_experts \(256\)"):
        ModelSpec.model_validate(m.model_dump() | {"n_group": 6})
    with pytest.raises(ValueError, match="both n_group and topk_group"):
        ModelSpec.model_validate(m.model_dump() | {"topk_group": None})


def test_deepep_across_nodes_sends_a_token_once_per_node_over_the_network():
    # DeepSeek-V3 on EP 64 over 8 DGX H800 nodes: the alltoall dispatcher puts each token's 8 copies on the
    # network in the uniform share (n - g)/n; DeepEP one row per remote node it reaches (3.63 of 8 nodes with
    # 4-group routing, 5.29 without). The network-bound time above the latency scales by nodes / k, and by the
    # profile's NIC efficiency over the DeepEP / HybridEP kernels' published rate across 8 nodes (comm.ep_rdma).
    m = builtin_models()["deepseek-v3"]
    cluster = ClusterSpec(system=builtin_systems()["dgx-h800"], num_nodes=8)
    base = ParallelPlan(dp=64, ep=64, etp=1, global_batch=64, seq_len=4096)
    times = {}
    for d in ("alltoall", "deepep"):
        e = estimate_training(m, cluster, base.model_copy(update={"moe_dispatcher": d}))
        t = e.comm.axes["ep"].transfers[0]
        alpha = collective_coeffs("all-to-all", t.group, cluster.system, shares=a2a_shares(t.dispatch, t.group))[0].alpha
        times[d] = transfer_seconds(t, cluster.system) - t.calls * alpha
        assert t.group.domains == 8
    nodes = blocks_hit(256, 8, 32, "random", (8, 4))
    assert nodes == pytest.approx(3.63, abs=0.01)
    rate = cluster.system.nic_efficiency / ep_rdma_efficiency(8)
    assert times["deepep"] / times["alltoall"] == pytest.approx(nodes / 8 * rate, rel=1e-9)
    shares = a2a_shares(Dispatch(256, 8, "random", (8, 4)), t.group)
    assert shares[0] == pytest.approx(7 / 8)


@pytest.mark.parametrize("sms,dispatch_gbps,combine_gbps", [(16, 348, 302), (24, 494, 420), (32, 619, 524)])
def test_deepep_all_to_all_is_bound_by_its_sms(sms, dispatch_gbps, combine_gbps):
    # Published: deepseek-ai/DeepEP docs/README_Hybrid-EP.md, "B200 Platform", DeepEP through the torch API
    # (8 ranks, 4,096 tokens of hidden 7,168, top-8, BF16; algorithm bandwidth = the rows' bytes / time).
    # A dispatch and a combine of those bytes, priced on 8 B200 over NVLink at `sms` SMs, take what the table's
    # two rates give, within 10% (the 24-SM point is the source of the per-SM rate; 16 and 32 are checks).
    # Without the SM bound they would take the NVLink's time, 27-58% less.
    from llmplan.cost.comm import Transfer
    cluster = ClusterSpec(system=builtin_systems()["dgx-b200"], num_nodes=1)
    plan = ParallelPlan(dp=8, ep=8, etp=1, global_batch=8, seq_len=4096, moe_dispatcher="deepep",
                        moe_dispatch_sms=sms)
    e = estimate_training(builtin_models()["qwen3-30b-a3b"], cluster, plan)
    group = e.comm.axes["ep"].transfers[0].group
    S = 4096 * 7168 * 2.0 * 8  # a large buffer: the latency term is negligible
    t = Transfer("all-to-all", 2, S, group, Dispatch(64, 8, "random", None, sms))
    published = S / (dispatch_gbps * 1e9) + S / (combine_gbps * 1e9)
    assert transfer_seconds(t, cluster.system) == pytest.approx(published, rel=0.10)
    unbound = Transfer("all-to-all", 2, S, group, Dispatch(64, 8, "random", None, 0))
    assert transfer_seconds(unbound, cluster.system) < 0.75 * published


def test_dispatch_sms_slow_the_overlapped_compute():
    # The deepep kernels hold their SMs while they run beside compute: the overlapped compute slows by
    # sms / sm_count (DeepSeek-V3 report §3.2.2: 20 of 132), not by the NCCL channels' share; more SMs price a
    # Blackwell NVLink all-to-all faster, and the plan's field reaches the estimate.
    from llmplan.cost.moe import DEEPEP_NUM_SMS, dispatch_contention
    deepep = ParallelPlan(dp=8, ep=8, etp=1, global_batch=8, moe_dispatcher="deepep", moe_dispatch_sms=32)
    assert dispatch_contention(deepep, 148, 0.1) == pytest.approx(32 / 148)
    assert dispatch_contention(deepep.model_copy(update={"moe_dispatch_sms": None}), 132, 0.1) == \
        pytest.approx(DEEPEP_NUM_SMS / 132)
    assert dispatch_contention(deepep.model_copy(update={"moe_dispatcher": "alltoall"}), 148, 0.1) == 0.1
    assert dispatch_contention(deepep.model_copy(update={"moe_dispatch_sms": 512}), 148, 0.1) == 0.5
    cluster = ClusterSpec(system=builtin_systems()["dgx-b200"], num_nodes=1)
    m = builtin_models()["qwen3-30b-a3b"]
    ep = {n: float(estimate_training(m, cluster, deepep.model_copy(update={"moe_dispatch_sms": n})).comm.axes["ep"].seconds)
          for n in (16, 32, 64)}
    assert ep[16] > ep[32] > ep[64]
