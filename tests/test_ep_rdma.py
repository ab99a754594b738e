"""DeepEP / HybridEP all-to-alls across nodes: the network's bytes at the kernels' published H100 rate
(docs/formulas.md#comm.ep_rdma)."""

from __future__ import annotations

from math import comb

import pytest

from llmplan.cost.comm import (
    HYBRIDEP_BENCH,
    Dispatch,
    Transfer,
    ep_rdma_efficiency,
    ranks_per_token,
    transfer_seconds,
)
from llmplan.specs.plan import ClusterSpec
from llmplan.specs.registry import builtin_systems
from llmplan.topology.placement import span_of_ranks

# Published: deepseek-ai/DeepEP docs/README_Hybrid-EP.md at 41cad944, "H100 Platform", HybridEP internode, kernel
# time only, 16 SMs: 4,096 tokens per rank of hidden 7,168, top-8, 8 local experts per rank, uniform random routing,
# 8 GPUs a node, one CX7 400 Gb/s (50 GB/s) a GPU; GB/s of the bytes a rank sends to the nodes its tokens go to,
# its own node counted (tests/test_hybrid_ep.py count_rdma_send_from_routing_map). (BF16 dispatch, combine.)
PUBLISHED = {16: (71.71, 62.95), 32: (57.69, 57.46), 64: (49.97, 49.77)}


def test_efficiency_by_hand():
    # 2 nodes: harmonic mean 2 / (1/71.71 + 1/62.95) = 67.05 GB/s counted, half of it leaves the node: 33.52 GB/s
    # of 50. 8 nodes: 2 / (1/49.97 + 1/49.77) = 49.87, 7/8 of it: 43.64 GB/s of 50.
    assert ep_rdma_efficiency(2) == pytest.approx(33.52 / 50, abs=2e-4)
    assert ep_rdma_efficiency(4) == pytest.approx(57.57 * 0.75 / 50, abs=2e-4)
    assert ep_rdma_efficiency(8) == pytest.approx(43.64 / 50, abs=2e-4)
    assert ep_rdma_efficiency(3) == pytest.approx((ep_rdma_efficiency(2) + ep_rdma_efficiency(4)) / 2)
    assert ep_rdma_efficiency(32) == ep_rdma_efficiency(8)  # beyond the table: its last value


def _bench(n: int) -> tuple[Transfer, ClusterSpec, float]:
    """A dispatch and a combine of the benchmark on n H100 (n / 8 DGX nodes), and the bytes the table counts."""
    cluster = ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=n // 8)
    span = span_of_ranks(list(range(n)), cluster)
    assert span.domains == n // 8 and span.uses_nic
    T, h, k, local = HYBRIDEP_BENCH
    E, D = local * n, n // 8
    send = T * ranks_per_token(E, k, n, "random") * h * 2.0
    # nodes a token goes to, its own included: D x P(a node holds one of its k experts), by hand
    nodes = D * (1 - comb(E - E // D, k) / comb(E, k))
    counted = T * nodes * h * 2.0
    return Transfer("all-to-all", 2, send, span, Dispatch(E, k, "random", None, 16, "hybridep", h)), cluster, counted


@pytest.mark.parametrize("n", sorted(PUBLISHED))
def test_internode_hybridep_matches_the_published_h100_table(n):
    # Tolerance 3%: the price adds the peers' latency and the probs HybridEP copies with each row (under 1% here).
    t, cluster, counted = _bench(n)
    dispatch, combine = PUBLISHED[n]
    published = counted / (dispatch * 1e9) + counted / (combine * 1e9)
    assert transfer_seconds(t, cluster.system) == pytest.approx(published, rel=0.03)


def test_two_nodes_are_slower_a_byte_than_eight():
    # The published H100 table: a remote byte moves at 0.67 of the NIC's line rate across 2 nodes, 0.87 across 8;
    # NCCL's all-to-all (no dispatch) keeps the profile's nic_efficiency.
    assert ep_rdma_efficiency(2) < 0.7 < 0.85 < ep_rdma_efficiency(8)
    cluster = ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=2)
    span = span_of_ranks(list(range(16)), cluster)
    plain = Transfer("all-to-all", 1, 1e9, span, None)
    inter = 1e9 * 8 / 16 / (50e9 * cluster.system.nic_efficiency)  # half a rank's buffer leaves the node
    # plus the profile's step latencies: 7 NVLink peers at 1 us, 8 network peers at 5 us (topology a2a_latency)
    assert transfer_seconds(plain, cluster.system) == pytest.approx(inter + 8 * 5e-6 + 7 * 1e-6, rel=0.02)
