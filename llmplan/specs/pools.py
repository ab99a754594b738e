"""A cluster of several pools (each a number of nodes of one system) and the fabric between them, and a
training plan placed on such a cluster (HeteroPlan: which pool holds which pipeline stages or data-parallel
replicas). A cluster of one system stays a ClusterSpec; these describe mixed fleets (issue 37)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from llmplan.specs.hardware import SystemSpec
from llmplan.specs.model import SPEC_CONFIG, Spec
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.units import GB

MAX_POOLS = 16
"""Most pools one cluster file may list (a mixed fleet has a handful; more is a typo or a list of nodes)."""


class PoolSpec(Spec):
    """Some nodes of one system: one pool of a mixed cluster."""

    model_config = SPEC_CONFIG

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    """How reports and exported files name the pool (defaults to the system's name; unique in the cluster)."""
    system: SystemSpec
    """The node shape of every node of the pool."""
    nodes: int = Field(ge=1, le=1_000_000)
    """Nodes in the pool."""

    @property
    def cluster(self) -> ClusterSpec:
        """The pool alone, as a one-system cluster."""
        return ClusterSpec(system=self.system, num_nodes=self.nodes)

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.system.gpus_per_node


class InterPoolFabric(Spec):
    """The network between pools, per GPU: what one GPU of a pool gets to a GPU of another pool."""

    model_config = SPEC_CONFIG

    gb_per_s: float = Field(gt=0, le=1e6)
    """Bandwidth per GPU between pools, one direction, GB/s (e.g. 50 for one 400 Gb/s NIC per GPU on a shared
    fat tree, less where the pools meet over a thinner spine or a data-centre interconnect)."""
    latency_s: float = Field(default=10e-6, ge=0, le=1.0)
    """Latency of one message between pools, seconds."""
    efficiency: float = Field(default=0.75, gt=0, le=1.0)
    """Achieved fraction of gb_per_s (as SystemSpec.nic_efficiency for the scale-out fabric)."""
    allreduce_efficiency: float | None = Field(default=None, gt=0, le=1.0)
    """Achieved fraction of gb_per_s for the ring all-reduce of the gradients between pools, as
    SystemSpec.allreduce_nic_efficiency for the scale-out fabric (topology.collectives.ring_share); at most 1,
    as efficiency: a ring over gb_per_s cannot beat its line rate. None: efficiency."""

    @property
    def bytes_per_s(self) -> float:
        """Achieved bandwidth per GPU between pools, bytes/s."""
        return self.gb_per_s * GB * self.efficiency


class PoolCluster(Spec):
    """Pools of different systems joined by one inter-pool fabric."""

    model_config = SPEC_CONFIG

    name: str = Field(default="pools", min_length=1)
    """Name of the cluster (the file's stem)."""
    pools: tuple[PoolSpec, ...] = Field(min_length=1, max_length=MAX_POOLS)
    """The pools, in the order the file lists them."""
    fabric: InterPoolFabric
    """The network between pools."""

    @model_validator(mode="after")
    def _unique_names(self) -> PoolCluster:
        names = [p.name for p in self.pools]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"pool name(s) {', '.join(twice)} appear more than once; give each pool its own "
                             f"`name` (e.g. h100-a, h100-b)")
        return self

    @property
    def num_gpus(self) -> int:
        return sum(p.num_gpus for p in self.pools)


Assignment = Literal["stages", "replicas"]


class HeteroPlan(Spec):
    """A training plan on a PoolCluster: the plan's shape and which pool holds which of its parts.

    stages: pipeline stage i runs (all its data-parallel copies) on pool stage_pools[i]; the plan's pp_layout
    splits the layers by each pool's speed. replicas: replica_pools[g] data-parallel replicas of the whole
    (tp, pp, cp) shape run on pool g with replica_batches[g] sequences of the global batch each step; the
    gradients are reduced across pools over the inter-pool fabric."""

    model_config = SPEC_CONFIG

    plan: ParallelPlan
    """The shape (dp: all replicas, on every pool together)."""
    assignment: Assignment
    """What is split over pools: pipeline stages or data-parallel replicas."""
    stage_pools: tuple[int, ...] | None = None
    """assignment stages: the pool index (into PoolCluster.pools) of every pipeline stage, first to last."""
    replica_pools: tuple[int, ...] | None = None
    """assignment replicas: data-parallel replicas on each pool (one entry per pool, 0 for an unused pool)."""
    replica_batches: tuple[int, ...] | None = None
    """assignment replicas: sequences of the global batch each pool's replicas take together per step."""

    @model_validator(mode="after")
    def _one_assignment(self) -> HeteroPlan:
        p = self.plan
        if self.assignment == "stages":
            if self.stage_pools is None or self.replica_pools is not None or self.replica_batches is not None:
                raise ValueError("assignment stages takes stage_pools (a pool per stage) and no replica_pools")
            if len(self.stage_pools) != p.pp:
                raise ValueError(f"stage_pools lists {len(self.stage_pools)} pools; the plan has {p.pp} stages")
            if min(self.stage_pools) < 0:
                raise ValueError(f"stage_pools {list(self.stage_pools)}: a pool index is its place in the cluster's "
                                 "pools, 0 or more")
        else:
            if self.replica_pools is None or self.replica_batches is None or self.stage_pools is not None:
                raise ValueError("assignment replicas takes replica_pools and replica_batches, no stage_pools")
            if len(self.replica_pools) != len(self.replica_batches) or sum(self.replica_pools) != p.dp \
                    or min(self.replica_pools) < 0:
                raise ValueError(f"replica_pools {self.replica_pools} must sum to dp ({p.dp}), one per pool")
            if sum(self.replica_batches) != p.global_batch or any(
                    b % (p.micro_batch * r) if r else b
                    for r, b in zip(self.replica_pools, self.replica_batches, strict=True)):
                raise ValueError(f"replica_batches {self.replica_batches} must sum to the global batch "
                                 f"({p.global_batch}), each a multiple of micro_batch x its pool's replicas")
        return self

    def pools_used(self) -> tuple[int, ...]:
        """Indices of the pools that hold part of the plan, in order."""
        if self.stage_pools is not None:
            return tuple(sorted(set(self.stage_pools)))
        return tuple(g for g, r in enumerate(self.replica_pools or ()) if r)
