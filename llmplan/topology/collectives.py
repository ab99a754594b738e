"""Time of one collective on the links its group spans: alpha-beta model with NCCL bus-bandwidth factors.

S is the size of the full buffer as nccl-tests defines it (all-gather / reduce-scatter: the whole gathered
buffer; all-to-all: one rank's send buffer). algbw = S / t, busbw = algbw x factor (nccl-tests doc/PERFORMANCE.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

from llmplan.specs.hardware import SystemSpec
from llmplan.topology.graph import link_profile
from llmplan.topology.placement import GroupSpan, span_of_ranks

Op = Literal["all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv", "broadcast"]
Algorithm = Literal["auto", "ring", "tree", "hierarchical"]
OPS: tuple[str, ...] = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv", "broadcast")
# An all-reduce across nodes pays a start-up that grows with the depth of the node tree, beyond its per-step
# latencies: read off Fernandez et al. 2024 (arXiv 2411.13055), the nccl-tests all-reduce busbw-vs-size curves on
# DGX H100 over 4 to 512 nodes (reproduced in stas00/ml-engineering 744d01e1 network/images/nccl-all-reduce-scan.png).
# Derived: docs/formulas.md#comm.net_fill
NET_FILL_S = 120e-6
NET_FILL_PER_LEVEL_S = 80e-6
# The start-up grows with the message up to that value: below NET_FILL_RAMP_BYTES an all-reduce pays
# net_fill(k) x S / NET_FILL_RAMP_BYTES (nothing at a few bytes). Read off nccl-tests all_reduce_perf tables on
# H100 at 2, 4 and 8 nodes (NVIDIA/nccl-tests issue #309) and A100 at 2 nodes (oracle-quickstart/oci-hpc-oke
# 72d816ea README.md): their time at 8 B - 64 KiB is NCCL's tree LL latency, and the effective latency reaches
# the Fernandez level at 16-64 MiB (docs/validation.md#small-coll). Derived: docs/formulas.md#comm.net_fill
NET_FILL_RAMP_BYTES = 32 * 2**20
# NCCL's own ring latency model, per protocol (LL, LL128, Simple), seconds: baseLat once a call, hwLat a step by
# link type, netOverhead (getNetOverhead: 2 us on an x86 AMD host, 1 us on any other, x3 for Simple) as the floor
# of an NVLink step across nodes, and each protocol's busbw against Simple's (ring LL busBw x .5 up to llMaxBw,
# by host CPU; LL128 x .92, x .7 with under 2 ranks a node; per-channel caps left out); the multi-node ring
# Simple all-reduce's latency x1.4 from sm80, x1.9 below ("Plateau effect of ring").
# Source: NVIDIA/nccl v2.21.5-1 (ab2b89c4) src/graph/tuning.cc ncclTopoTuneModel (same ring values in v2.18.3-1).
# Derived: docs/formulas.md#comm.nccl_latency
NCCL_PROTOCOLS = ("LL", "LL128", "Simple")
NCCL_RING_BASE_S = {"LL": 6.6e-6, "LL128": 14.0e-6, "Simple": 8.4e-6}
NCCL_RING_HW_S = {"nvlink": {"LL": 0.6e-6, "LL128": 1.9e-6, "Simple": 3.4e-6},
                  "pci": {"LL": 1.0e-6, "LL128": 2.5e-6, "Simple": 5.7e-6},
                  "net": {"LL": 2.7e-6, "LL128": 4.0e-6, "Simple": 14.0e-6}}
NCCL_NET_OVERHEAD_S = {"intel": 1.0e-6, "amd": 2.0e-6, "arm": 1.0e-6, None: 1.0e-6}  # getNetOverhead
NCCL_LL_MAX_BUSBW = {"amd": (22.5e9, 19.0e9)}  # llMaxBws AMD row, 2 nodes / more; any other host: Intel row
NCCL_LL_MAX_BUSBW_OTHER = (39.0e9, 20.4e9)
NCCL_RING_BW_FACTOR = {"LL": 0.5, "LL128": 0.92, "Simple": 1.0}
NCCL_RING_LL128_ONE_PPN = 0.7  # ring LL128 busBw factor when nRanks / nNodes < 2 (v2.21.5-1, dropped in v2.23.4-1)
NCCL_RING_PLATEAU = {True: 1.4, False: 1.9}  # ncclTopoGetAlgoTime: x1.4 if minCompCap >= 80, else x1.9
# LL128 on by default (tuning.cc): compute capability 7.0 / 8.0 / 9.0 in v2.21.5-1; Blackwell (10.x) from NCCL
# 2.25, where sm100 is on and sm103 off (v2.25.1-1, v2.26.6-1 switch (minCompCap)), and every cc >= 7.0 from
# v2.27.3-1 (sm103 on): Blackwell follows 2.27+, the release its published runs carry (nccl 2.27.7 in the
# dgx-b200 busbw reading, docs/validation.md#lat-mend).
# NCCL's tree all-reduce per protocol (LL, LL128), across nodes: baseLat once, hwLat a step by link type, busbw
# against the Simple tree's x 1/3.8 (LL, up to llMaxBw) and x 120/128 (LL128, nNodes > 1). The Simple tree keeps
# llmplan's profile latencies (comm.collective). Source: NVIDIA/nccl v2.21.5-1 (ab2b89c4) src/graph/tuning.cc.
# Derived: docs/formulas.md#comm.nccl_latency
NCCL_TREE_BASE_S = {"LL": 6.8e-6, "LL128": 14.0e-6}
NCCL_TREE_HW_S = {"nvlink": {"LL": 0.6e-6, "LL128": 1.25e-6}, "pci": {"LL": 1.0e-6, "LL128": 1.9e-6},
                  "net": {"LL": 5.0e-6, "LL128": 8.5e-6}}
NCCL_TREE_BW_FACTOR = {"LL": 1 / 3.8, "LL128": 120 / 128}
NCCL_LL128_CC = (7.0, 8.0, 9.0)
NCCL_LL128_CC_FROM = 10.0
# NCCL uses NVLink SHARP for all-reduce from 5 GPUs (H200) / 6 (B200) up; nccl-tests busbw measurements in
# ml-engineering network/README.md
NVLS_MIN_GPUS = 5


def bus_factor(op: str, n: int) -> float:
    """busbw / algbw. Source: nccl-tests doc/PERFORMANCE.md (nccl-tests doc/PERFORMANCE.md)."""
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
    ring_inter_bw: float
    """The network rate of NCCL's ring collectives across nodes, one share for all of them: the ring / tree
    all-reduce and the ring all-gather / reduce-scatter (SystemSpec.allreduce_nic_efficiency where a profile
    sets it, else nic_efficiency; docs/validation.md#ar-mend). Required: the all-gather / reduce-scatter divide
    by it, so no default may stand in for it (0 only where the group has no network path, as inter_bw)."""
    nccl: bool = False
    """Whether a ring across domains takes NCCL's latency model (nccl_ring_coeffs): NVIDIA GPUs. Else (RCCL,
    whose constants were not read) the profile's per-step latencies."""
    nccl_intra: str = "nvlink"
    """NCCL's link type inside the domain for its latency table: "nvlink" or "pci" (nccl_ring_latency)."""
    ll128: bool = False
    """Whether NCCL enables its LL128 protocol by default: NVIDIA GPUs with NVLink inside the domain and a
    compute capability NCCL enables it on (nccl_ll128_enabled)."""
    ll_max_busbw: float = 20.4e9
    """NCCL's LL busbw ceiling (llMaxBws, bytes/s) across nodes: by node count and host CPU (ll_max_busbw)."""
    net_overhead: float = 1.0e-6
    """NCCL's network post overhead (getNetOverhead, s) by host CPU: the floor of an NVLink step across nodes."""
    sm80: bool = True
    """Whether the GPU's compute capability is 8.0 or more (NCCL's ring plateau factor x1.4, else x1.9)."""


def ring_share(ring: float | None, base: float) -> float:
    """The network share of NCCL's ring collectives (ring / tree all-reduce, ring all-gather / reduce-scatter):
    the one a profile or cluster file sets for them (`ring`), else the fabric's general share (`base`); one rule
    for the scale-out fabric (SystemSpec.allreduce_nic_efficiency, nic_efficiency) and the inter-pool fabric
    (InterPoolFabric.allreduce_efficiency, efficiency). Derived: docs/formulas.md#comm.links"""
    return base if ring is None else ring


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
    share = ring_share(system.allreduce_nic_efficiency, system.nic_efficiency)
    use_nvls = nvls and system.nvls and g >= NVLS_MIN_GPUS
    nvlink, nvidia = system.intra_node_fabric != "pcie", system.gpu.vendor == "nvidia"
    cc = system.gpu.compute_capability
    return Links(intra_bw=intra, intra_alpha=prof.intra.latency, inter_bw=inter,
                 inter_alpha=inter_path.latency if inter_path else 0.0,
                 nvls_bw=prof.intra.bw * system.nvls_factor if use_nvls else None,
                 ring_inter_bw=inter_path.bw * share if inter_path else 0.0,
                 nccl=nvidia, nccl_intra="nvlink" if nvlink else "pci",
                 ll128=nvlink and nvidia and nccl_ll128_enabled(cc),
                 ll_max_busbw=ll_max_busbw(span.domains, system.host_cpu),
                 net_overhead=NCCL_NET_OVERHEAD_S[system.host_cpu], sm80=cc is None or cc >= 8.0)


def nccl_ll128_enabled(cc: float | None) -> bool:
    """Whether NCCL turns LL128 on by default for GPUs of compute capability `cc` (None: not stated, taken as
    on): 7.0, 8.0, 9.0 (v2.21.5-1), and Blackwell 10.x as NCCL 2.27+ does (every cc >= 7.0; 2.25-2.26 left
    sm103 out). Source: NVIDIA/nccl src/graph/tuning.cc ncclTopoTuneModel at v2.21.5-1, v2.26.6-1, v2.27.3-1.
    Derived: docs/formulas.md#comm.nccl_latency"""
    return cc is None or cc in NCCL_LL128_CC or cc >= NCCL_LL128_CC_FROM


def ll_max_busbw(k: int, host_cpu: str | None = None) -> float:
    """NCCL's LL busbw ceiling across k > 1 nodes, bytes/s, by host CPU (x86 AMD: 22.5 GB/s at 2 nodes, 19.0
    beyond; any other host: 39 and 20.4; one node's, by GPU generation, is not needed: rings inside a domain
    keep the profile's latency). Source: NVIDIA/nccl v2.21.5-1 src/graph/tuning.cc llMaxBws (index1 = AMD ? 1 :
    0 for nNodes > 1). Derived: docs/formulas.md#comm.nccl_latency"""
    two, more = NCCL_LL_MAX_BUSBW.get(host_cpu or "", NCCL_LL_MAX_BUSBW_OTHER)
    return two if k <= 2 else more


@dataclass(frozen=True)
class Coeff:
    """One algorithm's cost as an affine function of the message size: seconds = alpha + S x beta."""

    algorithm: str
    alpha: float
    beta: float

    def seconds(self, S: Any) -> Any:
        return self.alpha + S * self.beta


def nccl_ring_latency(op: str, n: int, k: int, proto: str, intra_hw: str = "nvlink",
                      net_overhead: float = 1.0e-6, sm80: bool = True) -> float:
    """NCCL's modelled latency of one ring call over n ranks in k NVLink domains with protocol `proto`: baseLat
    + (nsteps - nInterSteps)·intraLat + nInterSteps·interLat, nsteps = n - 1 (all-gather, reduce-scatter) or
    2(n - 1) (all-reduce), nInterSteps = k - 1 or 2k (0 in one domain); across nodes an NVLink step costs at
    least the network post overhead `net_overhead` (getNetOverhead by host CPU, x3 for Simple), and a Simple
    all-reduce's latency is x1.4 (`sm80`, else x1.9: "Plateau effect of ring"). Source: NVIDIA/nccl v2.21.5-1
    src/graph/tuning.cc ncclTopoTuneModel, ncclTopoGetAlgoTime. Derived: docs/formulas.md#comm.nccl_latency"""
    ar = op == "all-reduce"
    nsteps = 2 * (n - 1) if ar else n - 1
    inter = (2 * k if k > 1 else 0) if ar else k - 1
    intra = NCCL_RING_HW_S[intra_hw][proto]
    if k > 1:
        intra = max(intra, net_overhead * (3 if proto == "Simple" else 1))
    lat = NCCL_RING_BASE_S[proto] + (nsteps - inter) * intra + inter * NCCL_RING_HW_S["net"][proto]
    return lat * (NCCL_RING_PLATEAU[sm80] if ar and k > 1 and proto == "Simple" else 1.0)


@lru_cache(maxsize=4096)  # pure over hashable inputs (Links, Coeff frozen); the scalar path asks it per transfer
def nccl_ring_coeffs(op: str, n: int, k: int, bw: float, L: Links, fill: float = 0.0) -> tuple[Coeff, ...]:
    """A ring call as NCCL's tuner prices it, one candidate per protocol it enables (LL, LL128 where L.ll128,
    Simple); the cheapest at the message size is the one NCCL picks. Each: `fill` + nccl_ring_latency, and
    Simple's time per byte over the protocol's busbw share (LL's capped at L.ll_max_busbw; LL128's .7 where the
    ring has under 2 ranks a domain, ppn = n / k). Source: NVIDIA/nccl v2.21.5-1 src/graph/tuning.cc (ring
    busBw LL x .5 up to llMaxBw, LL128 x (ppn < 2 ? .7 : .92); min time over protocols in enqueue.cc
    topoGetAlgoInfo). Derived: docs/formulas.md#comm.nccl_latency"""
    beta = bus_factor(op, n) / bw
    out: list[Coeff] = []
    for p in NCCL_PROTOCOLS:
        if p == "LL128" and not L.ll128:
            continue
        f = NCCL_RING_LL128_ONE_PPN if p == "LL128" and n < 2 * k else NCCL_RING_BW_FACTOR[p]
        b = beta / f
        if p == "LL":
            b = max(b, bus_factor(op, n) / L.ll_max_busbw)
        lat = nccl_ring_latency(op, n, k, p, L.nccl_intra, L.net_overhead, L.sm80)
        out += with_fill(Coeff("ring", lat, b), fill, ramp=p != "Simple")
    return tuple(out)


def _ring(op: str, n: int, bw: float, L: Links) -> tuple[Coeff, ...]:
    """Ring in one NVLink domain: (n-1) steps per phase, each moving S/n (all-reduce has two phases), at the
    profile's per-step latency (NCCL's in-domain constants made the TP-bound rows worse: docs/validation.md
    #nccl-latency). Source: NVIDIA/nccl v2.21.5-1 src/graph/tuning.cc (ring nsteps). Derived:
    docs/formulas.md#comm.collective"""
    phases = 2 if op == "all-reduce" else 1
    return (Coeff("ring", phases * (n - 1) * L.intra_alpha, bus_factor(op, n) / bw),)


def net_fill(k: int) -> float:
    """Start-up of an all-reduce (ring or tree) across k > 1 NVLink domains, beyond its per-step latencies, so the
    published busbw climbs to its plateau only past 1 GiB; at this full value from NET_FILL_RAMP_BYTES up, in
    proportion to the message below (with_fill). A + B·log2(k), read off Fernandez et al. 2024 (arXiv
    2411.13055)'s nccl-tests all-reduce curves (DGX H100, 4-512 nodes, 64 MiB-1 GiB: least squares 135 µs +
    90 µs·log2(k) of effective latency, less the 14 + 10·log2(k) µs the tree's own steps already price).
    All-reduce only: NCCL's own cost model puts its multi-node size terms on the all-reduce alone (tuning.cc
    ncclTopoGetAlgoTime, v2.21.5-1 to master 5067397c: "Plateau effect of ring", latency x1.4 from sm80 if
    nNodes > 1 and coll == AllReduce; treeCorrectionFactor, tree only), its ring all-gather / reduce-scatter pay
    baseLat once a call plus nRanks - 1 step latencies; log2(k) is the form of the tree's depth term. Chunking
    is no reason to differ: the three ring collectives share one chunk (collectives.h *_CHUNKSTEPS =
    NCCL_STEPS/2). Derived: docs/formulas.md#comm.net_fill"""
    return NET_FILL_S + NET_FILL_PER_LEVEL_S * math.log2(k) if k > 1 else 0.0


def with_fill(c: Coeff, fill: float, ramp: bool = False) -> tuple[Coeff, ...]:
    """Candidate `c` plus the all-reduce's start-up `fill` (net_fill): whole at every size (Simple: ramp False),
    or, for NCCL's LL and LL128 protocols (ramp True), growing with the message up to NET_FILL_RAMP_BYTES and
    whole from there, min(fill, fill·S/NET_FILL_RAMP_BYTES), written as two affine candidates of which the
    cheaper is taken as for every candidate. So a few-byte all-reduce (loss, gradient norm, amax) costs NCCL's
    tree LL time, as the nccl-tests tables measure it (25 µs on 2 H100 nodes, 35 µs on 4:
    docs/validation.md#small-coll). Derived: docs/formulas.md#comm.net_fill"""
    if fill <= 0 or not ramp:
        return (Coeff(c.algorithm, c.alpha + fill, c.beta),)
    return (Coeff(c.algorithm, c.alpha + fill, c.beta),
            Coeff(c.algorithm, c.alpha, c.beta + fill / NET_FILL_RAMP_BYTES))


def nccl_ring(n: int, k: int, bw: float, L: Links, op: str = "all-gather") -> tuple[Coeff, ...]:
    """A ring collective over n ranks in k > 1 NVLink domains. All-gather or reduce-scatter (NCCL runs these as
    a ring only, no tree, no hierarchical variant): n - 1 steps of which k - 1 cross the network and n - k stay
    on NVLink, so the latency grows with every rank, not only with every node; the ring all-reduce has two
    such phases. On NVIDIA GPUs each step and the call's base are NCCL's own latencies per protocol
    (nccl_ring_coeffs); elsewhere the profile's per-step latencies, 2(k - 1) network steps for the all-reduce.
    Source: NVIDIA/nccl v2.21.5-1 src/graph/tuning.cc (ncclTopoTuneModel: ring latency (nsteps -
    nInterSteps)·intraLat + nInterSteps·interLat). Derived: docs/formulas.md#comm.collective"""
    fill = net_fill(k) if op == "all-reduce" else 0.0  # comm.net_fill: all-reduce only, as NCCL's tuner
    if L.nccl:
        return nccl_ring_coeffs(op, n, k, bw, L, fill)
    phases = 2 if op == "all-reduce" else 1
    alpha = phases * ((n - k) * L.intra_alpha + (k - 1) * L.inter_alpha)
    return with_fill(Coeff("ring", alpha, bus_factor(op, n) / bw), fill)


def a2a_latency(n: int, g: int, L: Links, per_node: bool = False) -> float:
    """Latency of an all-to-all over n ranks, g per NVLink domain: a pairwise exchange pays one step latency
    per peer, (g - 1) NVLink steps and (n - g) network steps; DeepEP's internode dispatch sends once per
    remote domain (per_node: n/g - 1 network steps) and forwards over NVLink. So at small messages (per peer
    S/n bytes) the peers' count, not the bandwidth, sets the time. Source: Thakur, Rabenseifner and Gropp
    2005, "Optimization of Collective Communication Operations in MPICH", §4 (pairwise exchange all-to-all:
    (p - 1)·alpha + (p - 1)/p·n·beta); DeepEP README (internode: RDMA between nodes, NVLink forwarding).
    Derived: docs/formulas.md#comm.collective"""
    remote = (n // max(g, 1) - 1) if per_node else (n - g)
    return (g - 1) * L.intra_alpha + remote * L.inter_alpha


def collective_coeffs(op: str, span: GroupSpan, system: SystemSpec, algorithm: str = "auto",
                      nvls: bool = True, shares: tuple[float, float] | None = None) -> tuple[Coeff, ...]:
    """The algorithms NCCL could use for `op` over `span`, each as (alpha, beta); the cost is the cheapest.
    `shares`: for an all-to-all that leaves the NVLink domain, the fractions of a GPU's send buffer that
    cross NVLink and the network when they differ from the uniform split ((g-1)/n and (n-g)/n): DeepEP's
    dispatch (cost.comm.a2a_shares).

    Source: alpha-beta model with nccl-tests bus factors (nccl-tests doc/PERFORMANCE.md); hierarchical
    collectives for groups that leave the NVLink domain. Derived: docs/formulas.md#comm.collective"""
    n = span.size
    if n <= 1:
        return (Coeff("none", 0.0, 0.0),)
    L = group_links(system, span, nvls)
    if not span.uses_nic:
        if op == "all-reduce" and L.nvls_bw:
            out: tuple[Coeff, ...] = (Coeff("nvls", 2 * L.intra_alpha, bus_factor(op, n) / L.nvls_bw),)
        elif op == "send-recv":
            out = (Coeff("p2p", L.intra_alpha, 1 / L.intra_bw),)
        elif op == "all-to-all":  # pairwise exchange: one latency per peer (a2a_latency)
            out = (Coeff("direct", (n - 1) * L.intra_alpha, bus_factor(op, n) / L.intra_bw),)
        elif op == "broadcast":
            out = (Coeff("ring", (n - 1) * L.intra_alpha, 1 / L.intra_bw),)
        else:
            out = _ring(op, n, L.intra_bw, L)
        return out
    k = span.domains
    g = max(1, n // k)
    flat_bw = min(L.intra_bw, L.inter_bw)
    # NCCL runs one ring per channel and enters / leaves each domain on a different GPU's NIC per channel, so
    # a flat ring's domain-crossing edges share the g NICs of the group's ranks there, not one.
    # Source: NVIDIA/nccl issues #43 and #601 (one ring per NIC; NVLink splits the data over the N NICs);
    # Hu et al. 2025, "Demystifying NCCL" (arXiv 2507.04786), channels. Derived: docs/formulas.md#comm.collective
    # The ring all-gather / reduce-scatter run on the all-reduce's ring graph at the same per-channel rate (NCCL
    # v2.21.5-1 tuning.cc: busBw = nChannels x bwInter for every ring collective): one network share for all.
    ring_bw = min(L.intra_bw, g * L.ring_inter_bw)
    if op == "send-recv":
        return (Coeff("p2p", L.inter_alpha, 1 / L.inter_bw),)
    if op == "all-to-all":
        intra, inter = shares or ((g - 1) / n, (n - g) / n)
        return (Coeff("direct", a2a_latency(n, g, L, shares is not None), max(intra / L.intra_bw, inter / L.inter_bw)),)
    if op == "broadcast":
        return (Coeff("tree", math.ceil(math.log2(n)) * L.inter_alpha, 1 / flat_bw),)
    if op in ("all-gather", "reduce-scatter"):
        return nccl_ring(n, k, ring_bw, L, op)
    return allreduce_coeffs(n, k, L, algorithm)


def allreduce_coeffs(n: int, k: int, L: Links, algorithm: str = "auto") -> tuple[Coeff, ...]:
    """All-reduce over n ranks in k > 1 NVLink domains: the algorithms NCCL chooses among, ring (2(n-1)/n of
    S/g on each NIC, nccl_ring's latency) and double binary tree (each domain interior in one tree: 2 S/g on
    each NIC, S/g at k = 2; a chain inside the domain, 2 S through each GPU's NVLink; never faster per byte
    than the ring, as tuning.cc's tree algbw is 0.5 busBw against the ring's nRanks/nsteps busBw; log
    latency), both at the ring network rate, so busbw does not fall with k. The hierarchical form (2(k-1)/k
    of S/g on each NIC), which NCCL does not run, only when asked for.
    Source: NVIDIA/nccl v2.21.5-1 src/graph/tuning.cc ncclTopoTuneModel (busBw = nChannels x bwInter for
    nNodes > 2, bwIntra at 2; algbw ring busBw nRanks/nsteps, tree busBw x .5; tree latency
    2((nRanks/nNodes-1) intraLat + log2(nNodes) interLat)). Derived: docs/formulas.md#comm.collective"""
    g = max(1, n // k)
    ring_bw = min(L.intra_bw, g * L.ring_inter_bw)
    rings = nccl_ring(n, k, ring_bw, L, "all-reduce")
    fill = net_fill(k)
    tree_alpha = 2 * (g - 1) * L.intra_alpha + 2 * math.ceil(math.log2(k)) * L.inter_alpha
    # the ring's Simple rate is the tree's per-byte floor
    tree_beta = max(2.0 / L.intra_bw, (1.0 if k == 2 else 2.0) / g / L.ring_inter_bw,
                    bus_factor("all-reduce", n) / ring_bw)
    # comm.hierarchical
    hier_beta = max(2 * (g - 1) / g / L.intra_bw, bus_factor("all-reduce", k) / g / L.ring_inter_bw)
    cands = [*rings, *with_fill(Coeff("tree", tree_alpha, tree_beta), fill),
             *(nccl_tree_coeffs(g, k, tree_beta, L, fill) if L.nccl else ()),
             Coeff("hierarchical", 2 * (g - 1) * L.intra_alpha + 2 * (k - 1) * L.inter_alpha, hier_beta)]
    if algorithm == "auto":
        return tuple(c for c in cands if c.algorithm != "hierarchical")
    return tuple([c for c in cands if c.algorithm == algorithm] or rings)


def nccl_tree_coeffs(g: int, k: int, tree_beta: float, L: Links, fill: float) -> tuple[Coeff, ...]:
    """NCCL's tree all-reduce with the LL and LL128 protocols (LL128 where L.ll128), g ranks a domain over k > 1
    domains: baseLat + 2((g - 1)·intraLat + log2i(k)·netLat), its bytes at the Simple tree's rate `tree_beta`
    over the protocol's share (LL 1/3.8, its algbw at most half of llMaxBw; LL128 120/128), each with the
    all-reduce's start-up (with_fill). The few-byte all-reduce is NCCL's tree LL: 6.8 + 2(7·0.6 + 5.0) = 25.2 µs
    on 2 DGX H100 nodes, 35.2 on 4. Source: NVIDIA/nccl v2.21.5-1 src/graph/tuning.cc ncclTopoTuneModel (tree
    latency, busBw x 1/3.8 capped at llMaxBw, x 120/128; algbw = 0.5 busBw).
    Derived: docs/formulas.md#comm.nccl_latency"""
    out: list[Coeff] = []
    depth = int(math.floor(math.log2(k)))  # log2i(nNodes)
    for p in ("LL", "LL128"):
        if p == "LL128" and not L.ll128:
            continue
        lat = NCCL_TREE_BASE_S[p] + 2 * ((g - 1) * NCCL_TREE_HW_S[L.nccl_intra][p] + depth * NCCL_TREE_HW_S["net"][p])
        beta = tree_beta / NCCL_TREE_BW_FACTOR[p]
        if p == "LL":
            beta = max(beta, 2.0 / L.ll_max_busbw)
        out += with_fill(Coeff("tree", lat, beta), fill, ramp=True)
    return tuple(out)


def collective_time(op: str, S: float, span: GroupSpan, system: SystemSpec, algorithm: str = "auto",
                    nvls: bool = True, shares: tuple[float, float] | None = None) -> CollectiveTime:
    """Predicted time of one collective of S bytes over the group `span` on `system` (cheapest algorithm)."""
    if span.size <= 1 or S <= 0:
        return CollectiveTime(op, S, span.size, 0.0, "none")
    best = min(collective_coeffs(op, span, system, algorithm, nvls, shares), key=lambda c: c.seconds(S))
    return CollectiveTime(op, S, span.size, best.seconds(S), best.algorithm)


def group_collective_time(op: str, size: float, cluster: Any, algorithm: str = "auto",
                          nvls: bool = True) -> tuple[CollectiveTime, GroupSpan]:
    """One collective over every GPU of `cluster` (ranks filling nodes in order), and the group's span:
    what `llmplan collective` prints, to hold against nccl-tests."""
    span = span_of_ranks(list(range(cluster.num_gpus)), cluster)
    return collective_time(op, size, span, cluster.system, algorithm, nvls), span
