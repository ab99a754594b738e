"""The cluster as a networkx graph: GPUs, the scale-up fabric, NICs, leaf and spine switches.

Every edge carries `bw` (bytes/s, one direction), `latency` (s; a path's latency is the sum, so a hop
through a switch costs the system's per-step latency), `kind`, and `sharers`: how many GPUs'
traffic crosses that edge when every GPU communicates at once (the usual case: all groups of an axis run
their collective together). A GPU's fair share of an edge is bw / sharers; the share along a path is the
smallest share of its edges.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise
from typing import TYPE_CHECKING

from llmplan.errors import LlmplanError
from llmplan.specs.hardware import SystemSpec

if TYPE_CHECKING:
    import networkx as nx  # imported where a graph is built or walked: `llmplan --help` does not load it


def gpu(node: int, local: int) -> tuple:
    return ("gpu", node, local)


def build_graph(system: SystemSpec, num_nodes: int) -> nx.Graph:
    """The graph of `num_nodes` nodes of `system`. Derived: docs/formulas.md#topo.graph"""
    import networkx as nx
    g = nx.Graph()
    s = system
    gpn = s.gpus_per_node
    nodes_per_domain = s.domain_gpus // gpn
    for n in range(num_nodes):
        for j in range(gpn):
            g.add_node(gpu(n, j), kind="gpu")
        _scale_up(g, s, n, nodes_per_domain)
        _scale_out(g, s, n)
    n_leaves = -(-num_nodes // s.nodes_per_leaf)
    if s.nics_per_node and num_nodes > 1:
        per, ports = nic_ports(s)
        rails = ports if s.rail_optimized else 1
        for rail in range(rails):
            for leaf in range(n_leaves):
                below = min(s.nodes_per_leaf, num_nodes - leaf * s.nodes_per_leaf)
                nics_below = below * (per if s.rail_optimized else s.nics_per_node)
                gpus_below = below * max(1, gpn // rails)
                g.add_edge(("leaf", rail, leaf), ("spine",), kind="spine",
                           bw=nics_below * s.nic_bytes_per_s / s.oversubscription, latency=s.inter_latency_s / 2,
                           sharers=gpus_below)
    return g


def _scale_up(g: nx.Graph, s: SystemSpec, n: int, nodes_per_domain: int) -> None:
    gpn = s.gpus_per_node
    if s.intra_node_fabric in ("nvswitch", "pcie"):
        hub = ("nvswitch", n // nodes_per_domain) if s.intra_node_fabric == "nvswitch" else ("pcie", n)
        kind = "nvlink" if s.intra_node_fabric == "nvswitch" else "pcie"
        for j in range(gpn):
            g.add_edge(gpu(n, j), hub, kind=kind, bw=s.intra_node_bytes_per_s, latency=s.intra_latency_s / 2,
                       sharers=1)
        return
    pairs = s.intra_node_links or [(i, j) for i in range(gpn) for j in range(i + 1, gpn)]
    for i, j in pairs:
        g.add_edge(gpu(n, i), gpu(n, j), kind="mesh", bw=s.pair_bytes_per_s, latency=s.intra_latency_s, sharers=1)


def nic_ports(s: SystemSpec) -> tuple[int, int]:
    """(NICs per port, ports per node): a node with at least twice as many NICs as GPUs (AWS p5 / p5en: 32 or
    16 EFA NICs for 8 GPUs) gives each GPU its own nics // gpus NICs, one port of their summed bandwidth on
    its rail; otherwise each NIC is a port, shared by the GPUs mapped to it."""
    per = max(1, s.nics_per_node // s.gpus_per_node)
    return per, s.nics_per_node // per


def _scale_out(g: nx.Graph, s: SystemSpec, n: int) -> None:
    gpn = s.gpus_per_node
    per, ports = nic_ports(s) if s.nics_per_node else (1, 0)
    bw, sharers = per * s.nic_bytes_per_s, max(1, gpn // ports) if ports else 1
    for i in range(ports):
        leaf = ("leaf", i if s.rail_optimized else 0, n // s.nodes_per_leaf)
        g.add_edge(("nic", n, i), leaf, kind="nic", bw=bw, latency=s.inter_latency_s / 2, sharers=sharers)
    for j in range(gpn if ports else 0):
        g.add_edge(gpu(n, j), ("nic", n, j * ports // gpn), kind="pcie-nic", bw=bw, latency=0.0, sharers=sharers)


def validate(system: SystemSpec, num_nodes: int) -> None:
    """Every GPU must reach every other; bad shapes are one clear error."""
    import networkx as nx
    if num_nodes > 1 and not system.nics_per_node:
        raise LlmplanError(f"{system.name} has no scale-out NICs (nics_per_node 0), so {num_nodes} nodes cannot "
                           "be connected; use --nodes 1 or give the profile nics_per_node and nic_gbit_per_s")
    g = build_graph(system, min(num_nodes, 2))
    scale_up = g.edge_subgraph((u, v) for u, v, k in g.edges(data="kind") if k in ("nvlink", "mesh", "pcie"))
    for j in range(1, system.gpus_per_node):
        if not (scale_up.has_node(gpu(0, j)) and nx.has_path(scale_up, gpu(0, 0), gpu(0, j))):
            raise LlmplanError(f"GPU {j} of node 0 is not connected to GPU 0 over the scale-up fabric of "
                               f"{system.name} (check intra_node_links: every GPU needs a path to every other)")
    reach = nx.node_connected_component(g, gpu(0, 0))
    for node in g.nodes:
        if node[0] == "gpu" and node not in reach:
            raise LlmplanError(f"GPU {node[2]} of node {node[1]} is not connected to GPU 0 in {system.name}")


@dataclass(frozen=True)
class PathShare:
    """A GPU's fair share of bandwidth on the way to a peer, and the latency of that way."""

    bw: float
    latency: float
    kinds: tuple[str, ...]


def path_share(g: nx.Graph, a: tuple, b: tuple) -> PathShare:
    """Bottleneck share (min over edges of bw / sharers) and summed latency of the shortest path a -> b."""
    import networkx as nx
    path = nx.shortest_path(g, a, b)
    edges = [g.edges[u, v] for u, v in pairwise(path)]
    return PathShare(bw=min(e["bw"] / e["sharers"] for e in edges), latency=sum(e["latency"] for e in edges),
                     kinds=tuple(dict.fromkeys(e["kind"] for e in edges)))


@dataclass(frozen=True)
class LinkProfile:
    """Per-GPU bandwidth shares of one system, read once from its graph."""

    intra: PathShare
    """GPU to GPU inside a node (or NVLink domain)."""
    inter_leaf: PathShare | None
    """GPU to the same-rail GPU of another node under the same leaf."""
    inter_spine: PathShare | None
    """GPU to a GPU of a node under another leaf (crosses the spine)."""


def link_profile(system: SystemSpec) -> LinkProfile:
    """Cached by the profile's content (specs hold a dict, so they are not hashable themselves), and by the
    profile object: serialising it cost a search's collectives 5% of its step-time pass."""
    hit = _BY_OBJECT.get(id(system))
    if hit is not None and hit[0] is system:
        return hit[1]
    if len(_BY_OBJECT) >= 256:
        _BY_OBJECT.clear()
    prof = _link_profile(system.model_dump_json())
    _BY_OBJECT[id(system)] = (system, prof)  # the entry keeps its system alive: an id is not reused under it
    return prof


_BY_OBJECT: dict[int, tuple[SystemSpec, LinkProfile]] = {}


@lru_cache(maxsize=64)
def _link_profile(system_json: str) -> LinkProfile:
    """Representative paths of a small graph of this system (the shares do not depend on the node count):
    a peer in the same node, one in another NVLink domain under the same leaf, one under another leaf."""
    system = SystemSpec.model_validate_json(system_json)
    intra = path_share(build_graph(system, 1), gpu(0, 0), gpu(0, 1)) if system.gpus_per_node > 1 else \
        PathShare(float("inf"), 0.0, ())
    if not system.nics_per_node:
        return LinkProfile(intra, None, None)
    d = system.domain_gpus // system.gpus_per_node  # nodes per NVLink domain
    per_leaf = system.nodes_per_leaf
    spine_node = per_leaf * -(-d // per_leaf)
    g = build_graph(system, spine_node + 1)
    leaf = path_share(g, gpu(0, 0), gpu(d, 0)) if d < per_leaf else None
    return LinkProfile(intra, leaf, path_share(g, gpu(0, 0), gpu(spine_node, 0)))
