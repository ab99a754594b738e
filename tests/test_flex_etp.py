"""Routed experts at expert TP 2 across 2 nodes, per token dispatcher, counted by hand (docs/formulas.md#comm.etp_flex,
#comm.etp_pair): which group each collective runs over and how many bytes a token puts on InfiniBand and on NVLink.

Sources, read at named commits:
* NVIDIA/Megatron-LM d98e8a6 `megatron/core/parallel_state.py`: the expert grid is RankGenerator(tp=etp, ep, ...)
  in the order tp-cp-ep-dp-pp, so the expert-TP group (get_ranks('tp')) is `etp` consecutive ranks, the EP group
  (get_ranks('ep')) `ep` ranks `etp` apart, and the expert-TP x EP group (get_ranks('tp-ep')) `etp·ep` consecutive
  ranks. `megatron/core/transformer/moe/token_dispatcher.py`: MoEAlltoAllTokenDispatcher all-to-alls over
  self.ep_group, then gathers the received rows over self.tp_group = pg_collection.expt_tp
  (dispatch_postprocess) and reduce-scatters the output over it (combine_preprocess), whatever the attention TP;
  MoEFlexTokenDispatcher dispatches over self.tp_ep_group with the routing map expanded over the expert-TP ranks
  (_initialize_metadata: [tokens, ep, tp_size, local experts]), so a token goes to every one of the etp ranks of
  each EP rank it reaches.
* deepseek-ai/DeepEP dd758ca `csrc/kernels/legacy/internode.cu` (the `deep_ep.Buffer` normal kernels Megatron's
  fused_a2a.py calls): the dispatch's kRDMASender copies a token once into the RDMA buffer of each node whose 8
  is_token_in_rank flags hold any, and kRDMAAndNVLForwarder forwards it over NVLink to each flagged rank there;
  HybridEP (94a9f8f `tests/utils.py` count_rdma_send_from_routing_map) counts its network tokens once a node.

The cluster: 2 DGX H100 nodes (8 GPUs an NVLink domain), ranks 0-7 on node 0, 8-15 on node 1. Model: qwen3-30b-a3b,
128 experts, top-8, hidden 2,048, 48 MoE layers, no shared expert. ep 8, etp 2: the expert-TP x EP group is ranks
0-15 (EP rank j on ranks 2j and 2j + 1; EP ranks 0-3 on node 0, 4-7 on node 1), the EP group ranks 0, 2, ..., 14 (4 a
node), the expert-TP group ranks {0, 1}. Contiguous routing (NeMo AutoModel's FakeBalancedGate: token i takes experts
8i .. 8i + 7 mod 128) puts a token's 8 experts on one EP rank (16 experts a rank), EP rank (i mod 16) // 2: every
EP rank equally often, so a token's one destination node is the other node for half the tokens.
"""

from __future__ import annotations

import numpy as np
import pytest

from llmplan.cost.comm import (Dispatch, a2a_shares, blocks_hit, dispatch_coeffs, ep_transfers, hybridep_prob_share,
                               ranks_per_token, step_comm)
from llmplan.cost.moe import routing_imbalance
from llmplan.estimate import estimate_training
from llmplan.search.evaluate import evaluate
from llmplan.search.grid import PlanArrays, Workload, from_plan
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems
from llmplan.topology.collectives import bus_factor
from llmplan.topology.placement import on_cluster, place

M = builtin_models()["qwen3-30b-a3b"]
CLUSTER = ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=2)
S, H, K = 4096, 2048, 8  # sequence, hidden, top-k


def _plan(tp: int, dispatcher: str, backend: str = "deepep", etp: int = 2, ep: int = 8, **kw) -> ParallelPlan:
    kw.setdefault("moe_routing", "contiguous")  # balanced: every EP rank gets the mean rows
    return ParallelPlan(tp=tp, sp=tp > 1, ep=ep, etp=etp, dp=16 // tp, global_batch=16 // tp, seq_len=S,
                        recompute="none", moe_dispatcher=dispatcher, moe_flex_backend=backend, **kw)


def _comm(plan: ParallelPlan):
    plan = on_cluster(plan, CLUSTER)
    assert not check_plan(M, plan, CLUSTER)
    return step_comm(M, plan, place(plan.degrees, CLUSTER), CLUSTER.system)


def _links(t) -> tuple[float, float]:
    """(NVLink, InfiniBand) bytes one call of a DeepEP transfer puts on the links, by its shares."""
    intra, inter = a2a_shares(t.dispatch, t.group)
    return t.message * intra, t.message * inter


@pytest.mark.parametrize("tp", [1, 2])
def test_deepep_sends_a_token_once_a_node_over_infiniband_at_expert_tp_2(tp):
    # MoEFlexTokenDispatcher, DeepEP: a rank's T = s·b/tp tokens (SP at tp 2), each to the 2 expert-TP ranks of its
    # one EP rank. Per token and dispatch: the send buffer holds 2 rows (2 x 2,048 x 2 bytes); InfiniBand carries
    # the row once when the destination node is the other one (half the tokens): 0.5 rows; NVLink fans it out to
    # the 2 ranks there, the model's (g - 1)/g of the buffer at g = 8 ranks a node: 1.75 rows. Before: the EP
    # group's split put 1 row a token on InfiniBand (the 2 copies, half remote).
    comm = _comm(_plan(tp, "deepep"))
    (a2a,) = [t for t in comm.axes["ep"].transfers if t.collective == "all-to-all"]
    assert (a2a.group.size, a2a.group.domains) == (16, 2)  # the expert-TP x EP group, not the EP group's 8
    assert a2a.dispatch.copies == 2
    T = S / tp
    row = H * 2
    assert float(a2a.message) == pytest.approx(T * 2 * row)
    nvlink, ib = _links(a2a)
    assert ib / T == pytest.approx(0.5 * row)
    assert nvlink / T == pytest.approx(2 * 7 / 8 * row)
    # 4 calls a layer (dispatch and combine, forward and backward), 48 layers, 1 micro-batch
    assert float(a2a.calls) == pytest.approx(4 * 48)


def test_deepep_infiniband_bytes_a_token_do_not_grow_with_expert_tp():
    # Random routing. The same 16 ranks over 2 nodes as ep 16 etp 1 and as ep 8 etp 2: a node holds 64 experts
    # either way, so a token reaches the same nodes (blocks_hit(128, 8, 64)) and crosses InfiniBand as often;
    # only NVLink carries the expert-TP copies. ep 8 etp 1 would stay on one node: the layouts compared are the
    # ones that span both.
    # The buffer is sized for the most-loaded rank (routing_imbalance u, which differs with ep): per token of
    # the mean rank, bytes / u.
    nodes = blocks_hit(128, 8, 64, "random")
    ib = {}
    for ep, etp in ((16, 1), (8, 2)):
        plan = _plan(1, "deepep", ep=ep, etp=etp, moe_routing="random")
        comm = _comm(plan)
        (a2a,) = [t for t in comm.axes["ep"].transfers if t.collective == "all-to-all"]
        assert a2a.group.domains == 2
        u = routing_imbalance(M, plan)
        rows = ranks_per_token(128, 8, ep, "random") * etp  # the buffer's rows a token
        assert float(a2a.message) == pytest.approx(S * rows * H * 2 * u)
        ib[etp] = _links(a2a)[1] / S / u
        assert ib[etp] == pytest.approx(nodes / 2 * H * 2)
    assert ib[2] == pytest.approx(ib[1])


def test_hybridep_routing_map_and_probs_span_the_expert_tp_x_ep_group():
    # HybridEP over the same 16-rank group: its probs a row are every local expert of the node's ranks,
    # E/ep = 16 experts a rank x 8 ranks a node = 128 fp32 values, against a 2,048 x 2-byte row, in half the calls
    # (forward dispatch, backward combine): 0.5 x 512 / 4,096. The routing-map all-gather runs over the 16 ranks.
    comm = _comm(_plan(1, "deepep", "hybridep"))
    a2a, gather = comm.axes["ep"].transfers
    assert (a2a.group.size, gather.group.size) == (16, 16)
    assert hybridep_prob_share(a2a.dispatch, a2a.group.size, 8) == pytest.approx(0.5 * 128 * 4 / (H * 2))
    # tokens x (etp x E) columns x (etp x ep) ranks, one byte a bool
    assert float(gather.message) == pytest.approx(S * 128 * 2 * 8 * 2)
    # the kernels' per-byte time carries the probs: the dispatch coefficient is the rows' times (1 + share)
    (c,) = dispatch_coeffs("all-to-all", a2a.group, CLUSTER.system, a2a.dispatch)
    (bare,) = dispatch_coeffs("all-to-all", a2a.group, CLUSTER.system, Dispatch(128, 8, "contiguous", None, 32,
                                                                                "hybridep", 0, copies=2))
    assert c.beta == pytest.approx(bare.beta * (1 + 0.5 * 128 * 4 / (H * 2)))


def test_alltoall_at_tp_1_gathers_over_expert_tp():
    # MoEAlltoAllTokenDispatcher at tp 1, etp 2: each rank (a data-parallel replica of the dense layers) sends its
    # s·b tokens' 8 copies over the EP group (ranks 0, 2, ..., 14: 4 a node), the uniform split: 4 of the 8 rows
    # a token cross InfiniBand, 3 NVLink; then gathers the received rows over ranks {0, 1} (NVLink): the gathered
    # buffer is 2 x 8 = 16 rows a token. Before: no routed pair priced at tp 1 (the TP group has one rank).
    comm = _comm(_plan(1, "alltoall"))
    tokens, probs = comm.axes["ep"].transfers
    assert (tokens.group.size, tokens.group.per_node, tokens.group.domains) == (8, 4, 2)
    assert float(tokens.message) == pytest.approx(S * K * H * 2)
    assert bus_factor("all-to-all", 8) * 4 / 7 == pytest.approx(4 / 8)  # the network's share of the buffer
    routed = [t for t in comm.axes["tp"].transfers if t.group.size > 1]
    assert {t.group.size for t in routed} == {2} and all(t.group.domains == 1 for t in routed)
    rows = 2 * K  # the gathered buffer, rows a token of the sequence
    per_layer = {"all-gather": rows * (H * 2 + 4 + H * 4), "reduce-scatter": rows * (H * 4 + H * 2 + 4)}
    for op, expected in per_layer.items():
        moved = sum(float(t.calls) * float(t.message) for t in routed if t.collective == op) / 48
        assert moved / S == pytest.approx(expected)
    # each rank sends half the buffer over NVLink (bus factor 1/2): 8 rows' worth a gather
    sent = sum(float(t.bytes) for t in routed) / 48 / S
    assert sent == pytest.approx(0.5 * (per_layer["all-gather"] + per_layer["reduce-scatter"]))


def test_alltoall_at_tp_2_gathers_over_the_same_ranks_as_tp():
    # tp 2 = etp 2 (SP): T = s·b/2 tokens a rank, the gathered buffer 2 x (s·b/2) x 8 = 8 rows a token of the
    # sequence, over ranks {0, 1}: the TP group's ranks, as before this change.
    comm = _comm(_plan(2, "alltoall"))
    routed = [t for t in comm.axes["tp"].transfers if t.collective == "reduce-scatter" and t.message > S * H * 2]
    assert routed and {t.group.size for t in routed} == {2}
    # the fp32 output's reduce-scatter: 8 rows x 2,048 x 4 bytes a token of the sequence
    assert max(float(t.message) for t in routed) / S == pytest.approx(K * H * 4)


def test_alltoall_expert_tp_group_is_not_the_tp_group():
    # tp 4, etp 2 on 16 GPUs (dp 4): the routed pair runs over 2 consecutive ranks, the attention's over 4. A
    # gather's bytes a rank are the buffer's (n - 1)/n: 1/2 over the expert-TP group (3/4 before, priced over TP).
    plan = ParallelPlan(tp=4, sp=True, ep=8, etp=2, dp=4, global_batch=4, seq_len=S, recompute="none",
                        moe_routing="contiguous")
    comm = _comm(plan)
    assert {t.group.size for t in comm.axes["tp"].transfers if t.calls} == {2, 4}
    fp32_out = [t for t in comm.axes["tp"].transfers if t.collective == "reduce-scatter" and t.group.size == 2]
    # rows a token of the sequence: etp x k / tp = 4; the output in fp32
    assert max(float(t.message) for t in fp32_out) / S == pytest.approx(4 * H * 4)
    assert all(float(t.bytes) == pytest.approx(float(t.calls * t.message) / 2) for t in fp32_out)


@pytest.mark.parametrize("tp, dispatcher, backend", [(1, "alltoall", "deepep"), (2, "alltoall", "deepep"),
                                                      (1, "deepep", "deepep"), (2, "deepep", "deepep"),
                                                      (2, "deepep", "hybridep")])
def test_vectorised_search_agrees_with_the_estimate(tp, dispatcher, backend):
    # search.evaluate resolves the groups by axis name ("etp", "tpep") and splits the flex transfers by expert-TP
    # degree; a search prices a second dispatcher with the first one's seconds for every axis but EP
    # (comm_seconds_arrays' known), which took the alltoall dispatcher's expert-TP pair into a DeepEP plan's TP
    # seconds (and left it out of an alltoall plan's) before the TP axis was priced again at expert TP > 1.
    plan = _plan(tp, dispatcher, backend, moe_routing="random")
    other = plan.model_copy(update={"moe_dispatcher": "deepep" if dispatcher == "alltoall" else "alltoall"})
    scalar = float(estimate_training(M, CLUSTER, plan).time.total)
    assert float(evaluate(M, CLUSTER, from_plan(plan)).step.total[0]) == pytest.approx(scalar, rel=1e-9)
    known = evaluate(M, CLUSTER, from_plan(other)).comm
    assert float(evaluate(M, CLUSTER, from_plan(plan), comm=known).step.total[0]) == pytest.approx(scalar, rel=1e-9)


def _arrays(plans: list[ParallelPlan]) -> PlanArrays:
    """Plans that differ only in their axes as one PlanArrays (as the search holds them)."""
    a = lambda f: np.asarray([getattr(p, f) for p in plans])  # noqa: E731
    return PlanArrays(tp=a("tp"), pp=a("pp"), dp=a("dp"), cp=a("cp"), ep=a("ep"), etp_resolved=a("etp_resolved"),
                      vpp=a("vpp"), pp_first=a("pp_first"), pp_last=a("pp_last"), sp=a("sp"), zero=a("zero"),
                      recompute_code=a("recompute_code"), micro_batch=a("micro_batch"), w=Workload.of(plans[0]))


@pytest.mark.parametrize("backend", ["deepep", "hybridep"])
def test_plans_of_two_expert_tp_degrees_price_together_as_alone(backend):
    # one array of plans at etp 1 and etp 2 (the search grid's etp 1 and etp = tp): each flex transfer carries its
    # plans' degree (Dispatch.copies), with the other plans' calls zero
    plans = [_plan(2, "deepep", backend, etp=etp, moe_routing="random") for etp in (1, 2)]
    arrays = _arrays(plans)
    ts = [t for t in ep_transfers(M, arrays.as_plan, "ep", "tpep") if t.collective == "all-to-all"]
    assert [t.dispatch.copies for t in ts] == [1, 2] and all(t.group == "tpep" for t in ts)
    assert [list(np.asarray(t.calls) > 0) for t in ts] == [[True, False], [False, True]]
    ev = evaluate(M, CLUSTER, arrays)
    for i, p in enumerate(plans):
        assert float(ev.step.total[i]) == pytest.approx(float(estimate_training(M, CLUSTER, p).time.total), rel=1e-9)


def test_expert_tp_1_keeps_the_ep_group_split():
    # property: at etp 1 the expert-TP x EP group is the EP group and Dispatch.copies 1 gives the EP group's shares
    span = place(_plan(1, "deepep", etp=1, ep=16).degrees, CLUSTER)
    assert (span["tpep"].size, span["tpep"].domains, span["tpep"].per_node) == (
        span["ep"].size, span["ep"].domains, span["ep"].per_node)
    d = Dispatch(128, 8, "random", None)
    assert a2a_shares(d, span["tpep"]) == a2a_shares(d, span["ep"])
    assert np.isclose(a2a_shares(d, span["ep"])[1], blocks_hit(128, 8, 64, "random") / 2
                      / ranks_per_token(128, 8, 16, "random"))
