"""Formulas of training on pools of different GPUs (specs.pools): the layer split of a pipeline whose stages
run at different speeds, the batch shares of data-parallel replicas that run at different speeds, and the
gradient reduction between pools. Pure functions of numbers; llmplan.hetero composes them with the
single-system estimate."""

from __future__ import annotations

import math

from llmplan.specs.pools import InterPoolFabric
from llmplan.units import GB
from llmplan.topology.collectives import bus_factor, ring_share


def speed_split(slots: int, seconds_per_slot: list[float], caps: list[int] | None = None) -> tuple[int, ...]:
    """Slots (layers) per stage so that the slowest stage is as fast as it can be while every stage keeps its
    quota: stage i, taking t_i seconds per slot, gets floor or ceil of q_i = slots x (1/t_i) / sum_j(1/t_j)
    (its share of the pipeline's speed), the ceilings going to the stages whose (floor + 1) x t_i is
    smallest. `caps` bound a stage's slots (memory); a capped stage keeps its cap and the others share the
    rest by the same rule. ValueError when the caps cannot hold the slots.
    Derived: docs/formulas.md#hetero.stages"""
    n = len(seconds_per_slot)
    caps = list(caps) if caps is not None else [slots] * n
    if sum(caps) < slots:
        raise ValueError(f"the stages hold at most {sum(caps)} of the {slots} layers")
    fixed: dict[int, int] = {}
    while True:
        free = [i for i in range(n) if i not in fixed]
        left = slots - sum(fixed.values())
        speed = sum(1 / seconds_per_slot[i] for i in free)
        quota = {i: left * (1 / seconds_per_slot[i]) / speed for i in free}
        out = {i: math.floor(quota[i] + 1e-9) for i in free}
        rest = left - sum(out.values())
        for i in sorted(free, key=lambda i: ((out[i] + 1) * seconds_per_slot[i], i))[:rest]:
            out[i] += 1
        over = [i for i in free if out[i] > caps[i]]
        if not over:
            return tuple(fixed.get(i, out.get(i, 0)) for i in range(n))
        for i in over:
            fixed[i] = caps[i]


def speed_layout(num_layers: int, seconds_per_layer: list[float], caps: list[int] | None = None) -> tuple[str, ...]:
    """The pp_layout (one chunk per stage, specs.layout) of a pipeline whose stage i takes seconds_per_layer[i]
    per layer: the embedding and the loss each count as one layer's slot (Megatron's --account-for-embedding-
    /loss-in-pipeline-split, as balanced_layout counts them) and the num_layers + 2 slots split by speed_split;
    with equal speeds the split is even. `caps`: most transformer layers a stage holds.
    Derived: docs/formulas.md#hetero.stages"""
    n = len(seconds_per_layer)
    if n == 1:
        return ("E" + "t" * num_layers + "L",)
    slot_caps = None
    if caps is not None:
        slot_caps = [c + (i == 0) + (i == n - 1) for i, c in enumerate(caps)]
    slots = list(speed_split(num_layers + 2, seconds_per_layer, slot_caps))
    if slots[0] < 1 or slots[-1] < 1:  # the end stages hold at least their embedding / loss slot
        raise ValueError("a pipeline end stage gets no slot for its embedding or loss")
    chunks = ["t" * (k - (i == 0) - (i == n - 1)) for i, k in enumerate(slots)]
    chunks[0], chunks[-1] = "E" + chunks[0], chunks[-1] + "L"
    return tuple(chunks)


def batch_shares(global_batch: int, units: list[int], sequences_per_s: list[float]) -> tuple[int, ...] | None:
    """Sequences of the global batch each pool's replicas take per step, in proportion to the pool's speed
    (`sequences_per_s`: its replicas together), each a multiple of its `units` (micro-batch x replicas), so
    that the pools finish their shares together: floors of the proportional quota, then the remaining units
    to the pools that finish their share soonest with one more. None when no such split exists (the batch
    is not a sum of the units) or a pool would get nothing. Derived: docs/formulas.md#hetero.replicas"""
    total = sum(sequences_per_s)
    count = [math.floor(global_batch * s / total / u + 1e-9) for s, u in zip(sequences_per_s, units, strict=True)]
    left = global_batch - sum(c * u for c, u in zip(count, units, strict=True))
    while left > 0:
        fits = [i for i, u in enumerate(units) if u <= left]
        if not fits:
            return None
        i = min(fits, key=lambda i: ((count[i] + 1) * units[i] / sequences_per_s[i], i))
        count[i] += 1
        left -= units[i]
    if min(count) < 1:
        return None
    return tuple(c * u for c, u in zip(count, units, strict=True))


def cross_pool_reduce_seconds(grad_bytes: float, replicas: list[int], fabric: InterPoolFabric) -> float:
    """Gradient reduction between pools, after each pool has reduce-scattered its replicas' gradients inside
    itself (hierarchical all-reduce): rank j of each pool holds 1/r_g of a rank's `grad_bytes` and all-reduces
    it with its peers of the other P pools over the inter-pool fabric, ring all-reduce 2(P-1)/P of the bytes
    (topology.collectives.bus_factor) at the fabric's ring share (topology.collectives.ring_share) and 2(P-1) latencies;
    the pool with fewest replicas holds the largest shard and paces it. 0 for one pool.
    Source: Thakur, Rabenseifner and Gropp 2005 §4 (ring all-reduce); Jia et al. 2018 (hierarchical all-reduce,
    arXiv 1807.11205). Derived: docs/formulas.md#hetero.replicas"""
    used = [r for r in replicas if r]
    P = len(used)
    if P <= 1:
        return 0.0
    shard = grad_bytes / min(used)
    ring_bytes_per_s = fabric.gb_per_s * GB * ring_share(fabric.allreduce_efficiency, fabric.efficiency)
    return bus_factor("all-reduce", P) * shard / ring_bytes_per_s + 2 * (P - 1) * fabric.latency_s


def cross_pool_p2p_seconds(message_bytes: float, fabric: InterPoolFabric) -> float:
    """One pipeline send (activations forward, their gradient backward) from a stage on one pool to the next
    stage on another, over the inter-pool fabric. Derived: docs/formulas.md#hetero.stages"""
    return message_bytes / fabric.bytes_per_s + fabric.latency_s


def cross_pool_kv_seconds(kv_bytes: float, shards: int, fabric: InterPoolFabric) -> float:
    """One request's KV cache from a prefill instance on one pool to a decode instance on another: each of the
    `shards` ranks holding a distinct shard sends its part over its own GPU's share of the inter-pool fabric,
    in parallel. Derived: docs/formulas.md#serve.pools"""
    return kv_bytes / shards / fabric.bytes_per_s + fabric.latency_s
