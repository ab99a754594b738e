"""Rank placement: which physical GPUs form each group of each parallel axis.

Ranks are numbered node-major (rank r sits on node r // gpus_per_node). The dense grid orders the axes
innermost first, by default tp, cp, dp, pp (Megatron-LM's `tp-cp-ep-dp-pp`, whose dense grid skips ep);
the expert grid is etp, ep, expert-dp, pp (Megatron-LM's expert grid). Source: Megatron-LM
megatron/core/parallel_state.py (rank order tp-cp-ep-dp-pp)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from llmplan.errors import LlmplanError
from llmplan.specs.plan import ClusterSpec, Degrees

DEFAULT_ORDER = ("tp", "cp", "ep", "dp", "pp")
DENSE_AXES = ("tp", "cp", "dp", "pp")


def parse_order(text: str | tuple[str, ...]) -> tuple[str, ...]:
    """'tp-cp-ep-dp-pp' -> ('tp', 'cp', 'ep', 'dp', 'pp'); every dense axis must appear exactly once."""
    order = tuple(text.split("-")) if isinstance(text, str) else tuple(text)
    unknown = [a for a in order if a not in DEFAULT_ORDER]
    dense = [a for a in order if a != "ep"]
    if unknown or sorted(dense) != sorted(DENSE_AXES):
        raise LlmplanError(f"axis order '{'-'.join(order)}' must list tp, cp, dp and pp once each (ep optional), "
                           "innermost first, e.g. tp-cp-ep-dp-pp")
    return order


@dataclass(frozen=True)
class GroupSpan:
    """Where the groups of one axis sit (the widest group when they differ)."""

    axis: str
    size: int
    """Ranks in one group."""
    groups: int
    """Groups of this axis."""
    nodes: int
    """Nodes one group spans."""
    per_node: int
    """Ranks of the group on its fullest node."""
    domains: int
    """NVLink domains the group spans (1: it never leaves the scale-up fabric)."""
    leaves: int
    """Leaf-switch groups the group spans (>1: traffic crosses the spine)."""
    gpus_per_nic: int
    """GPUs of a node whose traffic shares one NIC when this axis communicates (0: no NIC used)."""

    @property
    def uses_nic(self) -> bool:
        return self.domains > 1

    def describe(self, fabric: str = "NVLink", network: str = "IB") -> str:
        if self.size == 1:
            return "1 GPU (no communication)"
        if not self.uses_nic:
            where = f" over {self.nodes} nodes" if self.nodes > 1 else ""
            return f"{self.size} GPUs, {fabric}{where}"
        spine = f", {self.leaves} leaf groups (spine)" if self.leaves > 1 else ""
        return f"{self.size} GPUs over {self.nodes} nodes ({self.per_node}/node), {network}{spine}"


def axis_dims(plan: Degrees, order: tuple[str, ...] = DEFAULT_ORDER) -> dict[str, tuple[tuple[int, int], ...]]:
    """For each axis, the (size, stride) of the rank dimensions its groups run along (dpcp: two dims). A new dict
    each call, from _axis_dims' cache: each of a command's searches asks for the same rank layouts again."""
    return dict(_axis_dims(plan, order))


@lru_cache(maxsize=4096)
def _axis_dims(plan: Degrees, order: tuple[str, ...]) -> dict[str, tuple[tuple[int, int], ...]]:
    """axis_dims, once per (degrees, order); the caller copies it (the values are tuples)."""
    dense_order = [a for a in order if a != "ep"]  # innermost first
    sizes = {"tp": plan.tp, "cp": plan.cp, "dp": plan.dp, "pp": plan.pp}
    stride, strides = 1, {}
    for a in dense_order:
        strides[a] = stride
        stride *= sizes[a]
    etp, ep = plan.etp, plan.ep
    edp = plan.num_gpus // (etp * ep * plan.pp)
    dims: dict[str, tuple[tuple[int, int], ...]] = {a: ((sizes[a], strides[a]),) for a in DENSE_AXES}
    dims["dpcp"] = ((plan.cp, strides["cp"]), (plan.dp, strides["dp"]))
    # the MoE router's token-count groups (Megatron-Core tp_cp_group, tp_dp_cp_group: cost.comm.aux_loss_transfers)
    dims["tpcp"] = ((plan.tp, strides["tp"]), (plan.cp, strides["cp"]))
    dims["tpdpcp"] = ((plan.tp, strides["tp"]), (plan.cp, strides["cp"]), (plan.dp, strides["dp"]))
    dims["ep"] = ((ep, etp),)
    # the expert-TP group (Megatron-Core expt_tp: the alltoall dispatcher's gather, cost.comm.tp_transfers) and the
    # expert-TP x EP group (tp_ep: the flex dispatcher's, cost.comm.ep_transfers), consecutive ranks of the expert
    # grid (parallel_state.py expert_decoder_rank_generator.get_ranks('tp'), get_ranks('tp-ep'))
    dims["etp"] = ((etp, 1),)
    dims["tpep"] = ((etp * ep, 1),)
    dims["edp"] = ((edp, etp * ep),)
    # hybrid sharding (Megatron-LM parallel_state.py: the partial groups are contiguous slices of each group's
    # ranks): the shard groups inside, their replicas across (docs/formulas.md#mem.hsdp)
    r = plan.replicate
    dims["dpcp_in"] = ((plan.cp, strides["cp"]), (plan.dp // r, strides["dp"]))
    dims["dpcp_out"] = ((r, strides["dp"] * (plan.dp // r)),)
    dims["edp_in"] = ((max(1, edp // r), etp * ep),)
    dims["edp_out"] = ((r, etp * ep * max(1, edp // r)),)
    # hierarchical context parallelism (a2a+p2p): the a2a level is consecutive ranks of each cp group, the ring
    # across them (Megatron-LM@d98e8a6 parallel_state.py create_hierarchical_groups;
    # docs/formulas.md#comm.cp_hierarchical)
    k = plan.cp_a2a if plan.cp % plan.cp_a2a == 0 else 1
    dims["cp_a2a"] = ((k, strides["cp"]),)
    dims["cp_ring"] = ((plan.cp // k, strides["cp"] * k),)
    return dims


def groups_of(n_ranks: int, dims: tuple[tuple[int, int], ...]) -> np.ndarray:
    """Array (groups, size): ranks whose coordinates differ only along `dims` form one group."""
    offsets = np.zeros(1, dtype=np.int64)
    r = np.arange(n_ranks)
    base = np.ones(n_ranks, dtype=bool)
    for size, stride in dims:
        offsets = (offsets[:, None] + stride * np.arange(size)[None, :]).ravel()
        base &= (r // stride) % size == 0
    return r[base][:, None] + offsets[None, :]


def rank_grid(plan: Degrees, order: tuple[str, ...] = DEFAULT_ORDER) -> dict[str, np.ndarray]:
    """For each axis, an array (groups, size) of the global ranks of every group."""
    return {axis: groups_of(plan.num_gpus, dims) for axis, dims in axis_dims(plan, order).items()}


def _span(axis: str, groups: np.ndarray, cluster: ClusterSpec) -> GroupSpan:
    s = cluster.system
    gpn = cluster.gpus_per_node_used
    nodes = groups // gpn
    domains = nodes // max(1, s.domain_gpus // s.gpus_per_node)
    leaves = nodes // s.nodes_per_leaf

    def distinct(a: np.ndarray) -> np.ndarray:
        srt = np.sort(a, axis=1)
        return 1 + (np.diff(srt, axis=1) != 0).sum(axis=1)

    n_nodes = distinct(nodes)
    worst = int(np.argmax(n_nodes))
    per_node = int(np.bincount(nodes[worst] - nodes[worst].min()).max())
    n_domains = int(distinct(domains).max())
    nics = s.nics_per_node
    return GroupSpan(
        axis=axis, size=groups.shape[1], groups=groups.shape[0], nodes=int(n_nodes[worst]), per_node=per_node,
        domains=n_domains, leaves=int(distinct(leaves).max()),
        gpus_per_nic=max(1, gpn // nics) if (n_domains > 1 and nics) else 0,
    )


_SPAN_CACHE: dict[tuple, GroupSpan] = {}


def axis_span(axis: str, n_ranks: int, dims: tuple[tuple[int, int], ...], cluster: ClusterSpec) -> GroupSpan:
    """Span of an axis's groups, cached by the rank layout and the node shape (the search asks for the same
    few layouts many times)."""
    s = cluster.system
    key = (axis, n_ranks, dims, cluster.gpus_per_node_used, s.domain_gpus, s.gpus_per_node, s.nodes_per_leaf,
           s.nics_per_node)
    if key not in _SPAN_CACHE:
        if len(_SPAN_CACHE) > 4096:
            _SPAN_CACHE.clear()
        _SPAN_CACHE[key] = _span(axis, groups_of(n_ranks, dims), cluster)
    return _SPAN_CACHE[key]


def place(plan: Degrees, cluster: ClusterSpec, order: tuple[str, ...] = DEFAULT_ORDER) -> dict[str, GroupSpan]:
    """The span of every axis of a plan's degrees on `cluster` (axes: tp, cp, dp, pp, ep, edp, and dpcp: the
    dp x cp group that reduces gradients and shards ZeRO states; etp and tpep: the expert-TP and expert-TP x EP
    groups)."""
    if plan.num_gpus != cluster.num_gpus:
        raise LlmplanError(f"the plan uses {plan.num_gpus} GPUs (tp x pp x cp x dp) but the cluster has "
                           f"{cluster.num_gpus} ({cluster.num_nodes} nodes x {cluster.gpus_per_node_used}); "
                           "its groups cannot be placed")
    return {axis: axis_span(axis, plan.num_gpus, dims, cluster) for axis, dims in axis_dims(plan, order).items()}


def domain_ranks(cluster: ClusterSpec) -> int:
    """Ranks of one NVLink domain as the job fills it: the domain's nodes (domain_gpus / gpus_per_node, at least
    one) times the GPUs used a node, so that rank // domain_ranks is the domain _span counts."""
    s = cluster.system
    return cluster.gpus_per_node_used * max(1, s.domain_gpus // s.gpus_per_node)


def on_cluster(plan: Any, cluster: ClusterSpec) -> Any:
    """The plan with ParallelPlan.nvlink_domain_ranks set from the cluster (a ParallelPlan or a Workload's plan
    arrays: model_copy), for the cost functions that need the NVLink domain without the cluster."""
    D = domain_ranks(cluster)
    return plan if plan.nvlink_domain_ranks == D else plan.model_copy(update={"nvlink_domain_ranks": D})


def span_of_ranks(ranks: list[int], cluster: ClusterSpec, axis: str = "group") -> GroupSpan:
    """The span of one explicit group of global ranks (e.g. `llmplan collective --gpus N`)."""
    return _span(axis, np.asarray(ranks)[None, :], cluster)
