"""Time of one collective on the links its group spans: alpha-beta model with NCCL bus-bandwidth factors.

S is the size of the full buffer as nccl-tests defines it (all-gather / reduce-scatter: the whole gathered
buffer; all-to-all: one rank's send buffer). algbw = S / t, busbw = algbw x factor (reference/formats.md C5).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from llmplan.specs.hardware import SystemSpec
from llmplan.topology.graph import link_profile
from llmplan.topology.placement import GroupSpan

Op = Literal["all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv", "broadcast"]
Algorithm = Literal["auto", "ring", "tree", "hierarchical"]
OPS: tuple[str, ...] = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv", "broadcast")
NVLS_MIN_GPUS = 5  # NCCL uses NVLink SHARP for all-reduce from 5 GPUs (H200) / 6 (B200) up; formats.md C4


def bus_factor(op: str, n: int) -> float:
    """busbw / algbw. Source: nccl-tests doc/PERFORMANCE.md (reference/formats.md C5)."""
    if n <= 1:
        return 0.0
    return {"all-reduce": 2 * (n - 1) / n, "all-gather": (n - 1) / n, "reduce-scatter": (n - 1) / n,
            "all-to-all": (n - 1) / n, "send-recv": 1.0, "broadcast": 1.0}[op]


@dataclass(frozen=True)
class CollectiveTime:
    op: str
    size: float
    """Bytes of the full buffer (nccl-tests convention)."""
    ranks: int
    seconds: float
    algorithm: str

    @property
    def algbw(self) -> float:
        return self.size / self.seconds if self.seconds > 0 else 0.0

    @property
    def busbw(self) -> float:
        return self.algbw * bus_factor(self.op, self.ranks)


@dataclass(frozen=True)
class Links:
    """Effective per-GPU bandwidths (bytes/s) and per-step latencies (s) a group sees."""

    intra_bw: float
    intra_alpha: float
    inter_bw: float
    inter_alpha: float
    nvls_bw: float | None
    """All-reduce busbw with NVLink SHARP inside the domain, when the hardware has it and it is on."""


def group_links(system: SystemSpec, span: GroupSpan, nvls: bool = True) -> Links:
    """Bandwidth shares from the cluster graph times the profile's efficiencies.

    Derived: docs/formulas.md#comm.links"""
    prof = link_profile(system)
    g = span.size // span.domains  # ranks per NVLink domain
    if system.intra_node_fabric in ("nvlink-mesh", "infinity-fabric"):
        # A ring or direct algorithm over a mesh drives up to g-1 links at once, never more than the total.
        links = min(g - 1, len(system.intra_node_links) if system.intra_node_links else g - 1)
        intra = min(max(links, 1) * system.pair_bytes_per_s, system.intra_node_bytes_per_s) * system.mesh_efficiency
    else:
        intra = prof.intra.bw * system.ring_efficiency
    inter_path = prof.inter_spine if span.leaves > 1 else (prof.inter_leaf or prof.inter_spine)
    inter = inter_path.bw * system.nic_efficiency if inter_path else 0.0
    use_nvls = nvls and system.nvls and g >= NVLS_MIN_GPUS
    return Links(intra_bw=intra, intra_alpha=prof.intra.latency, inter_bw=inter,
                 inter_alpha=inter_path.latency if inter_path else 0.0,
                 nvls_bw=prof.intra.bw * system.nvls_factor if use_nvls else None)


def _ring(op: str, S: float, n: int, bw: float, alpha: float) -> float:
    """Ring: (n-1) steps per phase, each moving S/n (all-reduce has two phases)."""
    if n <= 1:
        return 0.0
    phases = 2 if op == "all-reduce" else 1
    return phases * (n - 1) * alpha + S * bus_factor(op, n) / bw


def _tree_allreduce(S: float, n: int, bw: float, alpha: float) -> float:
    """Double binary tree: 2·ceil(log2 n) latency steps; at large sizes NCCL's tree reaches at best the ring's
    bus bandwidth, so the bandwidth term is the ring's 2(n-1)/n·S / bw (conservative)."""
    return 0.0 if n <= 1 else 2 * math.ceil(math.log2(n)) * alpha + S * bus_factor("all-reduce", n) / bw


def _intra(op: str, S: float, n: int, L: Links) -> tuple[float, str]:
    if op == "all-reduce" and L.nvls_bw:
        return 2 * L.intra_alpha + S * bus_factor(op, n) / L.nvls_bw, "nvls"
    if op == "send-recv":
        return L.intra_alpha + S / L.intra_bw, "p2p"
    if op in ("all-to-all", "broadcast"):
        steps = 1 if op == "all-to-all" else n - 1
        return steps * L.intra_alpha + S * max(bus_factor(op, n), 0) / L.intra_bw, "direct" if op == "all-to-all" else "ring"
    return _ring(op, S, n, L.intra_bw, L.intra_alpha), "ring"


def collective_time(op: str, S: float, span: GroupSpan, system: SystemSpec, algorithm: str = "auto",
                    nvls: bool = True) -> CollectiveTime:
    """Predicted time of one collective of S bytes over the group `span` on `system`.

    Source: alpha-beta model with nccl-tests bus factors (reference/formats.md C5); hierarchical
    collectives for groups that leave the NVLink domain. Derived: docs/formulas.md#comm.collective"""
    n = span.size
    if n <= 1 or S <= 0:
        return CollectiveTime(op, S, n, 0.0, "none")
    L = group_links(system, span, nvls)
    if not span.uses_nic:
        t, algo = _intra(op, S, n, L)
        return CollectiveTime(op, S, n, t, algo)
    k = span.domains
    g = max(1, n // k)
    flat_bw = min(L.intra_bw, L.inter_bw)
    if op == "send-recv":
        return CollectiveTime(op, S, n, L.inter_alpha + S / L.inter_bw, "p2p")
    if op == "all-to-all":
        t = k * L.inter_alpha + max((g - 1) / n * S / L.intra_bw, (n - g) / n * S / L.inter_bw)
        return CollectiveTime(op, S, n, t, "direct")
    if op == "broadcast":
        t = math.ceil(math.log2(n)) * L.inter_alpha + S / flat_bw
        return CollectiveTime(op, S, n, t, "tree")
    candidates: dict[str, float] = {"ring": _ring(op, S, n, flat_bw, L.inter_alpha)}
    # Hierarchical: intra-domain reduce-scatter, inter-domain step on S/g per GPU, intra-domain all-gather.
    # NCCL pipelines the phases over chunks and channels, so the bandwidth terms overlap (the slowest one
    # sets the pace) while the latencies add up. Derived: docs/formulas.md#comm.hierarchical
    phases = 2 if op == "all-reduce" else 1
    intra_alpha = phases * (g - 1) * L.intra_alpha
    intra_beta = phases * S * (g - 1) / g / L.intra_bw
    inner_ring = _ring(op, S / g, k, L.inter_bw, 0.0), phases * (k - 1) * L.inter_alpha
    options = [inner_ring]
    if op == "all-reduce":
        options.append((S / g * bus_factor(op, k) / L.inter_bw, 2 * math.ceil(math.log2(k)) * L.inter_alpha))
        candidates["tree"] = intra_alpha + options[1][1] + max(intra_beta, options[1][0])
    candidates["hierarchical"] = min(intra_alpha + a + max(intra_beta, b) for b, a in options)
    if algorithm != "auto":
        if algorithm not in candidates:
            algorithm = "ring"
        return CollectiveTime(op, S, n, candidates[algorithm], algorithm)
    best = min(candidates, key=candidates.__getitem__)
    return CollectiveTime(op, S, n, candidates[best], best)
