"""Communication per training step and per GPU, for each parallel axis: what is sent, in which collective,
how many times, over which group, and how long it takes on the links that group spans.

`bytes` is what one GPU puts on the wire in a step: calls x message size x the collective's bus factor
(ring all-reduce of S bytes over n ranks sends 2(n-1)/n·S per rank; nccl-tests doc/PERFORMANCE.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from math import comb
from typing import Any, Generic, TypeVar

import numpy as np

from llmplan.arith import maximum, minimum, where
from llmplan.cost.compute import (KERNEL_LAUNCH_S, QUANTIZED_COPY_BYTES, QUANTIZED_GATHER_RECIPES,
                                  TE_PIPELINE_SPLITS)
from llmplan.cost.flops import layer_flops
from llmplan.cost.memory import candidate_stages, class_key, each_stage
from llmplan.cost.model_states import (FP32_SUM_BYTES, bf16_gathered_params, bf16_reduction, fp32_embedding_grad_bytes,
                                       fp32_sum_reduction, low_precision_params)
from llmplan.cost.mixers import attention_share, dense_mlp_share, lightning
from llmplan.cost.gemm import router_padding_share
from llmplan.cost.moe import EAGER_OP_HOST_S, dispatch_sms, routing_imbalance
from llmplan.cost.quantize import torchao_fp8_params
from llmplan.cost.offload import attention_offload_bytes, moe_layer_offload_bytes, offload_layer_bytes
from llmplan.cost.memo import memoized
from llmplan.cost.params import (
    whole_embedding,
    attention_params,
    indexer_params,
    norm_params,
    stage_weight_layers,
    tp_synced_layer_params,
    kv_heads_per_rank,
    max_stage_layers,
    mlp_params,
    recomputed_share,
    stepped_rank_params,
)
from llmplan.cost.runtime_memory import userbuffers_on
from llmplan.cost.stages import attention_rerun_share, most_moe_layers, stage_mtp_modules
from llmplan.cost.exposure import GRAD_RING_BYTES, CommSeconds, bucket_params, later_stage_unbucketed, zero3_gathers
from llmplan.specs.hardware import GpuSpec, SystemSpec
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan, cp_a2a_group, cp_ring_size, has_layout
from llmplan.specs.plan_choices import MoeFlexBackend
from llmplan.specs.quantities import dp_first_chunk_unbucketed, megatron_fsdp_acts, param_gather_optstep
from llmplan.specs.rule import as_bool
from llmplan.specs.schedule import schedule_of
from llmplan.topology.collectives import Coeff, bus_factor, collective_coeffs, group_links
from llmplan.topology.graph import link_profile
from llmplan.topology.placement import GroupSpan, groups_of

AXES = ("tp", "pp", "dp", "cp", "ep")
ACT_BYTES = 2.0  # activations and their gradients travel in bf16/fp16
FP8_DISPATCH_BYTES = 1.0 + 4.0 / 128  # per element: an e4m3 byte and an fp32 scale per 1x128 tile
"""Bytes per element of an fp8 EP dispatch (ParallelPlan.ep_dispatch_fp8). Source: DeepSeek-V3 technical report
(arXiv 2412.19437) §3.3.2 (1x128 activation tiles, one scale each) and §3.3.3 (dispatch in FP8); deepseek-ai/DeepEP
README (dispatch of an (x_fp8, x_scales) tuple, scales float [tokens, hidden / 128])."""
QUANTIZED_GATHER_BYTES = {r: QUANTIZED_COPY_BYTES[r] for r in QUANTIZED_GATHER_RECIPES}
"""Bytes per element of a TP all-gather that low-precision training sends quantised (one copy, scales
included: QUANTIZED_COPY_BYTES), by the recipes that cast before the gather (QUANTIZED_GATHER_RECIPES)."""


TWO_USAGE_GATHER_RECIPES = ("blockwise", "mxfp8", "nvfp4")
"""Recipes whose Transformer Engine all-gather of a tensor wanted in both layouts moves both quantised copies:
_all_gather_mxfp8, _all_gather_nvfp4 and _start_all_gather_fp8_blockwise gather the rowwise data and scales and
then the columnwise ones whenever the quantizer asks for both usages (per-tensor fp8 gathers the rowwise copy
only: Float8Quantizer / Float8CurrentScalingQuantizer.supports_only_rowwise_all_gather). Under sequence
parallelism a row-parallel Linear's backward asks for both (grad_output_quantizer.set_usage(rowwise=True,
columnwise=True): the dgrad GEMM reads rows, the wgrad GEMM columns) before grad_output_preprocess gathers the
output gradient; the forward gathers (set_usage(rowwise=True, columnwise=False)) and the backward re-gather of
the input (columnwise only) move one copy. Under userbuffers (tp_comm_overlap) only MXFP8 runs: linear.py
gathers its columnwise copy apart (the `ub_overlap_ag and isinstance(grad_output_quantizer, MXFP8Quantizer)`
branch, a bulk all-gather beside the dgrad GEMM), the same bytes; NVFP4 and blockwise tensors cannot enter
userbuffers (check rule tp_comm_overlap_recipe, specs.check_switches.UB_UNSUPPORTED_RECIPES).
Source: NVIDIA/TransformerEngine v2.16.1 (the same at v2.14 and v2.17.1) transformer_engine/pytorch/distributed.py,
module/linear.py (_Linear.backward), module/base.py (grad_output_preprocess, fill_userbuffers_buffer_for_all_gather),
module/layernorm_linear.py (forward). Derived: docs/formulas.md#comm.tp"""


def gather_bytes(m: ModelSpec, plan: ParallelPlan, both_usages: bool = False) -> Any:
    """Bytes per element of the TP all-gathers of a low-precision plan's quantised GEMM inputs (its layers
    kept in bf16 gather bf16); `both_usages`: a gather Transformer Engine asks for in both layouts (the output
    gradient's under SP), two quantised copies under TWO_USAGE_GATHER_RECIPES with Megatron-Core TP.
    Derived: docs/formulas.md#comm.tp"""
    if not plan.low_precision or plan.recipe not in QUANTIZED_GATHER_BYTES:
        return ACT_BYTES
    share = plan.low_precision_layer_fraction(m.num_hidden_layers)
    copies = where(both_usages & (plan.recipe in TWO_USAGE_GATHER_RECIPES) & (plan.tp_impl == "megatron"), 2, 1)
    return share * copies * QUANTIZED_GATHER_BYTES[plan.recipe] + (1 - share) * ACT_BYTES


@dataclass(frozen=True)
class Dispatch:
    """What a DeepEP dispatch or combine carries, for the NVLink / network split of its all-to-all
    (a2a_shares): the model's routed experts, top-k and expert groups, and the plan's routing."""

    experts: int
    top_k: int
    routing: str
    groups: tuple[int, int] | None
    sms: int = 0
    """SMs the dispatch and combine kernels run on (0: not bound by SMs; dispatch_sm_beta)."""
    backend: MoeFlexBackend = "deepep"
    """The kernels (ParallelPlan.moe_flex_backend): deepep (dispatch_sm_beta) or hybridep (hybridep_rate)."""
    width: float = 0.0
    """Elements of a dispatched row (the expert width: a latent MoE's latent size); hybridep_prob_share's
    denominator (0: no prob bytes priced)."""
    elem_bytes: float = ACT_BYTES
    """Bytes per element of the rows this call moves (FP8_DISPATCH_BYTES for an ep_dispatch_fp8 dispatch): the
    probs are fp32 whatever the rows' dtype, so their share of a call's bytes is taken of these."""
    copies: int = 1
    """Ranks of the call's group that receive each row an EP rank gets: the flex dispatcher's expert-TP degree
    (its group is expert TP x EP, each EP rank's etp ranks consecutive: flex_copies); 1 for an EP group."""


G = TypeVar("G", GroupSpan, str)
"""A transfer's group: its GroupSpan (the scalar path) or its axis name (the vectorised path: search.evaluate
resolves the name to the spans of its plans)."""


@dataclass(frozen=True)
class Transfer(Generic[G]):
    """Repeated calls of one collective with one message size over one group."""

    collective: str
    calls: float
    """Calls per step."""
    message: float
    """Bytes of the full buffer of one call (nccl-tests convention)."""
    group: G
    """The group's span (scalar path) or its axis name (vectorised path: search.evaluate resolves it)."""
    dispatch: Dispatch | None = None
    """DeepEP's all-to-all: across nodes it sends a token once per node over the network (a2a_shares)."""
    host_s: Any = 0.0
    """Host seconds of one call that the GPU waits for (zero3_host_seconds; 0: the host runs ahead)."""
    copy_bytes: Any = 0.0
    """HBM bytes one call copies around its collective on the GPU (ZERO3_GATHER_COPIES; 0: none)."""
    step_end: bool = False
    """Run once a step outside the micro-batches, serial with the step: exposed whole (after the optimizer step:
    mxfp8_amax_transfers; before it: tp_step_end_transfers)."""
    outer: bool = False
    """Hybrid sharding's collective across the replicas (hsdp_transfers): once a step, in the last micro-batch's
    backward (reduction) and the first's forward (gather), even where the shard group's run every micro-batch
    (hsdp_split, docs/formulas.md#step.hsdp_outer); not FSDP2's HSDP all-reduce, every micro-batch
    (hsdp_reduce_per_microbatch)."""
    te_cp: bool = False
    """One of Transformer Engine's a2a / all_gather context-parallel collectives (te_cp_collectives), not a
    hybrid mixer's all-to-all (te_cp_split, cp_mixer_split)."""

    @property
    def bytes(self: Transfer[GroupSpan]) -> float:
        """Bytes one GPU sends per step."""
        return self.calls * self.message * bus_factor(self.collective, self.group.size)


@dataclass(frozen=True)
class AxisComm:
    """One axis's communication per step; `bytes` and `seconds` are the sums over its transfers."""

    axis: str
    transfers: tuple[Transfer[GroupSpan], ...]
    seconds: float

    @property
    def bytes(self) -> float:
        return sum(t.bytes for t in self.transfers)

    @property
    def collectives(self) -> str:
        return " + ".join(dict.fromkeys(t.collective for t in self.transfers if t.calls)) or "-"


@dataclass(frozen=True)
class CommBreakdown:
    """Per-axis communication of the most-loaded rank; total bytes and seconds are the sums over axes."""

    axes: dict[str, AxisComm]
    host_layer_bytes: Any = 0.0
    """Bytes one offloaded layer copies to host memory per micro-batch, each way (not a collective: the
    GPU's own link to host memory; cost.offload). 0 without activation offload."""
    host_moe_act_bytes: Any = 0.0
    """Bytes one MoE layer's fine-grained offload groups (expert fc1 output, and any mlp_norm / expert_fc1 of
    ParallelPlan.offload_modules) copy to host memory per micro-batch, each way
    (cost.offload.moe_layer_offload_bytes). 0 without them."""
    host_attn_bytes: Any = 0.0
    """Bytes one attention layer's fine-grained offload groups copy to host memory per micro-batch, each way
    (cost.offload.attention_offload_bytes). 0 without attention modules in ParallelPlan.offload_modules."""
    tp_edge_stages: tuple[tuple[AxisComm, AxisComm], ...] = ()
    """(synchronous, asynchronous) TP collectives outside the decoder layers of a rank of each candidate stage
    (cost.memory.candidate_stages, in order; tp_edge_transfers), not in axes["tp"]. Empty: none."""
    dp_stages: tuple[AxisComm, ...] = ()
    """The dp axis of a rank of each candidate stage (cost.memory.candidate_stages, in order): each stage
    reduces and gathers its own parameters (docs/formulas.md#step.stage_tail); `axes["dp"]` is the first
    stage's. Empty: every stage's is `axes["dp"]`."""

    @property
    def bytes(self) -> float:
        return sum(a.bytes for a in self.axes.values())

    @property
    def seconds(self) -> float:
        return sum(a.seconds for a in self.axes.values())


DISPATCH_SM_BYTES_PER_S = (494e9 / 24, 420e9 / 24)
"""Bytes per second one SM moves in DeepEP's normal (training) dispatch and combine, BF16: B200, 8 ranks, 4,096
tokens of hidden 7,168, top-8 of 64 experts, 24 SMs, 494 GB/s dispatch and 420 GB/s combine through the torch
API (algorithm bandwidth), 20.6 / 17.5 GB/s per SM; the same table rises about in proportion from 16 SMs
(348 / 302) to 32 (619 / 524) and levels off near 640 / 586 at 48, the NVLink's rate (deepseek-ai/DeepEP
docs/README_Hybrid-EP.md, "B200 Platform"; GB200 at 8 ranks and 24 SMs: 513 / 426). Derived:
docs/formulas.md#comm.ep_sms"""


def dispatch_sm_beta(d: Dispatch | None) -> float:
    """Seconds per byte of a DeepEP all-to-all bound by the SMs it runs on: half its calls are dispatches
    (the forward's dispatch, the backward's combine-gradient) and half combines, each moving the whole send
    buffer through `sms` SMs at DISPATCH_SM_BYTES_PER_S; 0 where no SM budget is given (NCCL's alltoall).
    The kernel's time is the larger of this and the links' (dispatch_coeffs).
    Source: deepseek-ai/DeepEP docs/README_Hybrid-EP.md (B200, DeepEP at 16-48 SMs). Derived:
    docs/formulas.md#comm.ep_sms"""
    if d is None or d.sms <= 0:
        return 0.0
    r_dispatch, r_combine = DISPATCH_SM_BYTES_PER_S
    return 0.5 * (1 / r_dispatch + 1 / r_combine) / d.sms


HYBRIDEP_GB200_GBPS = {
    16: {8: (750.15, 684.27), 16: (661.93, 600.75), 24: (637.80, 565.53), 32: (629.79, 547.25), 36: (612.85, 543.27)},
    32: {8: (764.03, 737.13), 16: (706.95, 666.26), 24: (665.97, 639.80), 32: (642.23, 605.15), 36: (632.31, 596.99)},
}
"""HybridEP's published dispatch (BF16) and combine algorithm bandwidth in GB/s on GB200, kernel time only, by SMs
and then by ranks of one NVLink domain: 4,096 tokens per rank of hidden 7,168, top-8, 8 local experts per rank,
uniform random routing; bytes = the rows a rank receives (deepseek-ai/DeepEP docs/README_Hybrid-EP.md at
94a9f8f6, "GB200 Platform"; tests/test_hybrid_ep.py: nvl_recv_bytes / time). The kernels alone: the torch API's
rate adds the copy out of (into) the registered buffer, which Megatron's dispatch_with_permute does as the
permute llmplan prices in HBM bytes (cost.elementwise.moe_routing_bytes), and host synchronisation, which
cost.moe prices (docs/formulas.md#comm.hybridep)."""
HYBRIDEP_BENCH = (4096, 7168, 8, 8)
"""(tokens per rank, hidden, top-k, experts per rank) of HYBRIDEP_GB200_GBPS's benchmark."""


@lru_cache(maxsize=64)
def hybridep_fit(sms: int) -> tuple[float, float]:
    """(seconds per byte, seconds per peer) of a HybridEP call at a published SM count: the least-squares line
    t(n) = beta·B(n)·(1 + p(n)) + alpha·(n - 1) through the mean dispatch-and-combine time of the published table,
    B(n) the benchmark's received bytes at n ranks (T·ranks_per_token·h·2), p(n) the probs its dispatch copies
    with them (hybridep_prob_share), n - 1 the peers each call writes to and waits on. At 32 SMs it holds every
    published point within 2.1% (794 GB/s, 4.1 us a peer); at 16, 5%.
    Source: HYBRIDEP_GB200_GBPS. Derived: docs/formulas.md#comm.hybridep"""
    T, h, k, local = HYBRIDEP_BENCH
    table = HYBRIDEP_GB200_GBPS[sms]
    ranks = sorted(table)
    n = np.array(ranks, dtype=float)
    B = np.array([T * ranks_per_token(local * r, k, r, "random") * h * 2.0 for r in ranks])
    t = np.array([0.5 * b * (1 / table[r][0] + 1 / table[r][1]) / 1e9 for r, b in zip(ranks, B, strict=True)])
    # the bytes moved: the rows and, in the benchmark's dispatch (half its calls), the domain's probs a row
    moved = B * np.array([1 + hybridep_prob_share(Dispatch(local * r, k, "random", None, width=h), r, r)
                          for r in ranks])
    (beta, alpha), *_ = np.linalg.lstsq(np.vstack([moved, n - 1]).T, t, rcond=None)
    return float(beta), float(alpha)


def hybridep_rate(sms: int) -> tuple[float, float]:
    """(seconds per byte, seconds per peer) of HybridEP's dispatch and combine on `sms` SMs: the published fits
    (hybridep_fit) at 16 and 32 SMs, linear between them, the 32-SM one above (the table's 8-rank rate is
    716 GB/s at 16 SMs and 750 at 32: the SMs barely bind); below 16 SMs the bytes a second fall in proportion to the
    SMs (unpublished on NVLink; DeepEP's rule, comm.ep_sms). Derived: docs/formulas.md#comm.hybridep"""
    lo, hi = hybridep_fit(16), hybridep_fit(32)
    if sms >= 32:
        return hi
    if sms <= 16:
        return lo[0] * 16 / sms, lo[1]
    w = (sms - 16) / 16
    return (1 - w) * lo[0] + w * hi[0], (1 - w) * lo[1] + w * hi[1]


HYBRIDEP_PROB_BYTES = 4
"""Bytes of one prob HybridEP moves (fp32: the kernels' prob buffers are float; deepseek-ai/DeepEP
csrc/hybrid_ep/backend/hybrid_ep_backend.cuh at 17cfb81)."""


def hybridep_prob_share(d: Dispatch, ranks: int, g: int) -> float:
    """Bytes HybridEP's probs add to a call's rows, as a share of the rows' bytes (d.elem_bytes an element: the
    probs are absolute fp32 bytes a row, the same for fp8 and bf16 rows), averaged over a layer's
    calls. Its forward dispatch and backward combine (half the calls: Megatron-LM's HybridEPDispatch passes the
    router's probs forward and their gradient back) copy with each row a prob for every expert of the NVLink
    domain, E/ranks a rank times its g ranks, not only the receiving rank's; the other half carry none. 0 without
    a row width. Source: deepseek-ai/DeepEP csrc/hybrid_ep/backend/hybrid_ep_backend.cuh at 17cfb81 (dispatch
    S2G remote_expert_output_prob and combine G2S under BACKWARD_COMBINE: NUM_OF_EXPERTS_PER_RANK ·
    NUM_OF_RANKS_PER_NODE floats a row). Derived: docs/formulas.md#comm.hybridep_probs"""
    if d.width <= 0 or ranks <= 0:
        return 0.0
    # the flex dispatcher's group is expert TP x EP: E·copies experts over its ranks (MoEFlexTokenDispatcher's
    # num_experts = tp_size·E), E/ep a rank (docs/formulas.md#comm.etp_flex)
    return 0.5 * HYBRIDEP_PROB_BYTES * (d.experts * d.copies / ranks) * g / (d.elem_bytes * d.width)


HYBRIDEP_BENCH_LINK_BYTES_PER_S = 900e9
"""NVLink bytes per second a direction of HYBRIDEP_GB200_GBPS's GPU (GB200, NVLink 5: 18 links of 50 GB/s;
link_profile's intra bandwidth of gb200-nvl72): the published rates are scaled to another GPU's NVLink by it."""


HYBRIDEP_H100_RDMA_GBPS = {16: (71.71, 62.95), 32: (57.69, 57.46), 64: (49.97, 49.77)}
"""HybridEP's published internode BF16 dispatch and combine algorithm bandwidth in GB/s on H100 (8 GPUs a node, one
CX7 400 Gb/s NIC a GPU), kernel time only, 16 SMs, by EP ranks: 4,096 tokens per rank of hidden 7,168, top-8, 8
experts per rank, uniform random routing (deepseek-ai/DeepEP docs/README_Hybrid-EP.md at 41cad944, "H100 Platform").
Its bytes count a token once for every node it goes to, its own included (tests/test_hybrid_ep.py
count_rdma_send_from_routing_map: "we do not set the local node map to zeros", as DeepEP's test_internode.py
counts num_rdma_token_sent), so a share (D - 1)/D of them crosses the network (ep_rdma_efficiency)."""
HYBRIDEP_H100_NODE_GPUS = 8
"""GPUs a node (and NVLink domain) in HYBRIDEP_H100_RDMA_GBPS's benchmark."""
HYBRIDEP_H100_NIC_BYTES_PER_S = 50e9
"""Line rate a GPU of HYBRIDEP_H100_RDMA_GBPS's benchmark: one ConnectX-7 at 400 Gb/s (DeepEP README: "CX7
InfiniBand 400 Gb/s RDMA network card (~50 GB/s maximum bandwidth)")."""


def ep_rdma_efficiency(domains: int) -> float:
    """Share of a GPU's NIC line rate that the bytes a DeepEP / HybridEP all-to-all sends to other NVLink domains
    move at, when its group spans `domains` of them: HybridEP's published H100 rates (HYBRIDEP_H100_RDMA_GBPS, the
    dispatch-and-combine mean) times the share (D - 1)/D of the counted bytes that leave the node, over the CX7's
    50 GB/s; 2 nodes 0.67, 4 nodes 0.86, 8 nodes 0.87 (DeepEP's own V1 H800 table, docs/legacy.md, gives 0.86 and
    0.88 the same way at 32 and 64 ranks); linear in D between, the end values beyond. Source: deepseek-ai/DeepEP
    docs/README_Hybrid-EP.md at 41cad944 ("H100 Platform", kernel only, 16 SMs). Derived:
    docs/formulas.md#comm.ep_rdma"""
    pts = sorted((r // HYBRIDEP_H100_NODE_GPUS,
                  2e9 / (1 / a + 1 / b) * (1 - HYBRIDEP_H100_NODE_GPUS / r) / HYBRIDEP_H100_NIC_BYTES_PER_S)
                 for r, (a, b) in HYBRIDEP_H100_RDMA_GBPS.items())
    return float(np.interp(domains, [p[0] for p in pts], [p[1] for p in pts]))


def dispatch_coeffs(op: str, span: GroupSpan, system: SystemSpec, d: Dispatch | None) -> tuple[Coeff, ...]:
    """collective_coeffs of one transfer, a DeepEP all-to-all's per-byte time at least its SMs' (dispatch_sm_beta).
    HybridEP's (hybridep_rate) inside an NVSwitch domain is its published rate in place of NCCL's link
    efficiency (TMA copies, not NCCL channels), scaled to the GPU's NVLink, with each of the g - 1 NVLink peers
    costing the published per-peer time in place of the link's step latency; across domains the published rate
    is a floor under the links'; HybridEP's bytes per row grow by its probs (hybridep_prob_share).
    Derived: docs/formulas.md#comm.ep_sms, docs/formulas.md#comm.hybridep"""
    if span.size <= 1:  # a group of one sends nothing
        return collective_coeffs(op, span, system)
    shares = a2a_shares(d, span)
    if shares is not None and span.uses_nic:  # the network's bytes at the kernels' published rate (comm.ep_rdma)
        shares = (shares[0], shares[1] * system.nic_efficiency / ep_rdma_efficiency(span.domains))
    coeffs = collective_coeffs(op, span, system, shares=shares)
    if d is None or d.backend != "hybridep" or d.sms <= 0:
        floor = dispatch_sm_beta(d)
        return tuple(Coeff(c.algorithm, c.alpha, max(c.beta, floor)) for c in coeffs)
    beta, peer = hybridep_rate(d.sms)
    beta *= HYBRIDEP_BENCH_LINK_BYTES_PER_S / link_profile(system).intra.bw
    g = max(span.size // span.domains, 1)
    extra = (g - 1) * max(peer - group_links(system, span).intra_alpha, 0.0)
    own = span.domains == 1 and system.intra_node_fabric == "nvswitch"
    probs = 1 + hybridep_prob_share(d, span.size, g)
    return tuple(Coeff(c.algorithm, c.alpha + extra, probs * (beta if own else max(c.beta, beta))) for c in coeffs)


def transfer_seconds(t: Transfer[GroupSpan], system: SystemSpec) -> float:
    """Seconds of a placed transfer's calls (the scalar path; search.evaluate costs axis names itself)."""
    span = t.group
    if span.size <= 1 or t.message <= 0:
        return 0.0
    best = min(c.seconds(t.message) for c in dispatch_coeffs(t.collective, span, system, t.dispatch))
    return t.calls * best + copy_seconds(t, system.gpu)


def copy_seconds(t: Transfer[Any], gpu: GpuSpec) -> Any:
    """Seconds of the HBM copies around a transfer's calls (Transfer.copy_bytes), serial with its collective, at
    the GPU's achieved HBM rate; elementwise over plan arrays (search.evaluate). Derived:
    docs/formulas.md#comm.zero3_unit"""
    return t.calls * t.copy_bytes / gpu.hbm_achieved_bytes_per_s


def a2a_shares(d: Dispatch | None, span: GroupSpan) -> tuple[float, float] | None:
    """NVLink and network shares of a GPU's send buffer in a DeepEP all-to-all whose group spans D > 1
    NVLink domains of g ranks (None: the uniform split). Internode, DeepEP sends a token over the network
    once to each remote node holding any of its experts, then forwards it over NVLink to those ranks: the
    network carries nodes·(D-1)/D rows per token against the buffer's c·ranks rows, NVLink the buffer's
    (g-1)/g. c = d.copies: the flex dispatcher's group is expert TP x EP (n = c·ep ranks), each EP rank's c
    expert-TP ranks on one node; a token's row goes to all c (c·ranks rows in the buffer), still once a node
    over the network: a node holds g/c EP ranks' experts. Source: DeepEP README (internode normal kernels:
    RDMA between nodes, NVLink forwarding); deepseek-ai/DeepEP dd758ca csrc/kernels/legacy/internode.cu
    (dispatch's kRDMASender: one RDMA copy a token for each node whose 8 is_token_in_rank flags hold any;
    kRDMAAndNVLForwarder: NVLink to each flagged rank); DeepSeek-V3 technical report, section 3.2.2.
    Derived: docs/formulas.md#comm.ep, docs/formulas.md#comm.etp_flex"""
    if d is None or span.domains <= 1:
        return None
    n, D, c = span.size, span.domains, max(d.copies, 1)
    g, ep = max(n // D, 1), max(n // c, 1)
    ranks = ranks_per_token(d.experts, d.top_k, ep, d.routing, d.groups)
    nodes = blocks_hit(d.experts, d.top_k, max(d.experts // ep, 1) * max(g // c, 1), d.routing, d.groups)
    return (g - 1) / g, nodes * (D - 1) / D / (c * ranks)


def _timed(axis: str, transfers: list[Transfer[GroupSpan]], system: SystemSpec) -> AxisComm:
    """Scalar path: keep the transfers that happen, and time them."""
    live = tuple(t for t in transfers if t.calls > 0 and t.group.size > 1 and t.message > 0)
    return AxisComm(axis, live, sum(transfer_seconds(t, system) for t in live))


def reduce_gather_split(transfers: Any) -> tuple[list[Any], list[Any]]:
    """(the gradient reductions, the weight all-gathers) among a step's DP transfers, the once-a-step step-end
    ones (Transfer.step_end) in neither: the split CommSeconds.dp_reduce / dp_gather (and each stage's) is timed by,
    on the scalar path (comm_seconds) and the vectorised one (search.evaluate). Derived: docs/formulas.md#step.dp"""
    timed = [t for t in transfers if not t.step_end]
    return [t for t in timed if t.collective != "all-gather"], [t for t in timed if t.collective == "all-gather"]


def hsdp_split(transfers: Any) -> tuple[list[Any], list[Any]]:
    """(the reductions, the all-gathers) of reduce_gather_split that cross the hybrid-sharding replicas
    (Transfer.outer): CommSeconds.dp_outer_reduce / dp_outer_gather, on the scalar and the vectorised path.
    Derived: docs/formulas.md#step.hsdp_outer"""
    return tuple([t for t in part if t.outer] for part in reduce_gather_split(transfers))  # type: ignore[return-value]


def comm_seconds(comm: CommBreakdown, system: SystemSpec) -> CommSeconds:
    """Per-axis seconds for the step-time model, dp split into gradient reduction and weight gathers
    (reduce_gather_split)."""
    dp = comm.axes["dp"].transfers

    def split(transfers: tuple[Transfer[GroupSpan], ...]) -> tuple[float, float]:
        reduce, gather = reduce_gather_split(transfers)
        return sum(transfer_seconds(t, system) for t in reduce), sum(transfer_seconds(t, system) for t in gather)

    dp_reduce, dp_gather = split(dp)
    outer_reduce, outer_gather = (sum(transfer_seconds(t, system) for t in part) for part in hsdp_split(dp))
    return CommSeconds(
        tp=sum(transfer_seconds(t, system) for t in comm.axes["tp"].transfers if not t.step_end),
        tp_step_end=sum(transfer_seconds(t, system) for t in comm.axes["tp"].transfers if t.step_end),
        pp=comm.axes["pp"].seconds, cp=comm.axes["cp"].seconds,
        ep=comm.axes["ep"].seconds, router=comm.axes["router"].seconds if "router" in comm.axes else 0.0,
        cp_mixers=sum(transfer_seconds(t, system) for t in cp_mixer_split(comm.axes["cp"].transfers)[1]),
        cp_a2a=sum(transfer_seconds(t, system) for t in te_cp_split(comm.axes["cp"].transfers)[0]),
        cp_allgather=sum(transfer_seconds(t, system) for t in te_cp_split(comm.axes["cp"].transfers)[1]),
        dp_reduce=dp_reduce,
        dp_gather=dp_gather,
        dp_outer_reduce=outer_reduce, dp_outer_gather=outer_gather,
        dp_step_end=sum(transfer_seconds(t, system) for t in dp if t.step_end),
        host=comm.host_layer_bytes / system.host_bytes_per_s,
        host_moe_act=comm.host_moe_act_bytes / system.host_bytes_per_s,
        host_attn=comm.host_attn_bytes / system.host_bytes_per_s,
        tp_edge_stages=tuple((a.seconds, b.seconds) for a, b in comm.tp_edge_stages),
        dp_stages=tuple(each_stage(comm.dp_stages, lambda a: split(a.transfers))),  # a stage class's axis: once
        dp_host=sum(t.calls * t.host_s for t in dp),
    )


def tp_transfers(m: ModelSpec, plan: ParallelPlan, group: G, etp_group: G | None = None) -> list[Transfer[G]]:
    """Per layer and micro-batch: 2 all-reduces of sbh in forward and 2 in backward (2 more under full
    recompute); with SP each all-reduce becomes an all-gather plus a reduce-scatter of the same buffer, and
    the backward all-gathers the two saved sequence shards again for the weight gradients (Megatron-LM keeps
    only the shard), so SP adds 2 all-gathers per layer; DTensor TP (tp_impl) saves the gathered inputs instead
    (cost.activations.linear_input_split) and adds none.
    In low precision the all-gathers move the quantised inputs (gather_bytes): every one of Megatron's with
    Transformer Engine, and every one of DTensor's with torchao float8 (PrepareFloat8ModuleInput casts before the
    forward gathers, Float8RowwiseParallel casts the output gradient before the backward ones); Transformer
    Engine's backward gathers of output gradients move both layouts' copies (TWO_USAGE_GATHER_RECIPES).
    The routed experts' pair under expert TP (tp_routed_blocks_per_layer) is the alltoall dispatcher's own
    gather and reduce-scatter of the dispatched rows over the expert-TP group (`etp_group`; default `group`, the
    same ranks at expert TP = TP), no Transformer Engine quantizer, no re-gather (routed_pair_transfers); it runs
    under SP and at TP 1 (expert TP > 1 beside TP 1: the gather is the dispatcher's, whatever the dense layers).
    Without SP, pipeline scatter/gather (pp_scatter_gather) all-gathers each activation and gradient a stage
    receives, 2 per micro-batch and model chunk (pp_gathers).
    A hybrid stack's layer holds one sub-block (a mixer or an MLP / MoE block: Nemotron-H's M, *, E), each a
    column- and a row-parallel linear: its collectives are tp_blocks_per_layer of a transformer layer's.
    Source: Korthikanti et al. 2022 §4.2.2 (Figure 5); Megatron-LM megatron/core/ssm/mamba_mixer.py (in_proj
    column-, out_proj row-parallel), moe/shared_experts.py (the shared expert's gather and reduce-scatter).
    Derived: docs/formulas.md#comm.tp"""
    s, b, h = plan.seq_len / plan.cp, plan.micro_batch, m.hidden_size
    layers = max_stage_layers(m, plan)  # the stage that holds the most layers sets the pace
    per_layer = plan.num_microbatches * layers * tp_blocks_per_layer(m, plan)
    r = recomputed_share(plan, layers)
    calls = per_layer * (4 + 2 * r)
    routed = plan.num_microbatches * layers * tp_routed_blocks_per_layer(m, plan)  # no re-gather
    te = per_layer - routed  # the pairs whose linears gather their own inputs
    regather = te * where(plan.tp_impl == "megatron", 2, 0)  # DTensor saves them whole
    S = ACT_BYTES * s * b * h
    with_sp, without = where(plan.sp, te * (4 + 2 * r), 0), where(plan.sp, 0, calls)
    q = gather_bytes(m, plan)
    # DTensor's backward gathers of output gradients move float8 too: torchao's Float8RowwiseParallel casts
    # the output gradient to e5m2 before its gather (NoopFwToFloat8BwDynamic after the output's redistribute,
    # torchao/float8/float8_tensor_parallel.py at eab345c)
    grad_out = where(plan.sp, te * 2, 0)  # the backward's output-gradient gathers, 2 a layer
    quantised = where(plan.sp, te * (2 + 2 * r) + regather, 0)
    hs: list[Transfer[G]] = [Transfer("all-reduce", without, S, group),
          Transfer("all-gather", quantised, q * s * b * h, group),
          Transfer("all-gather", grad_out, gather_bytes(m, plan, both_usages=True) * s * b * h, group),
          Transfer("reduce-scatter", with_sp, S, group),
          Transfer("all-gather", pp_gathers(plan), S, group)]
    expert = group if etp_group is None else etp_group
    # 2 pairs a layer; without SP at TP > 1 (which Megatron-Core refuses in training) the all-reduces count them
    hs += routed_pair_transfers(m, plan, expert, where(plan.sp | (plan.tp == 1), 2 * routed, 0), r)
    return hs if m.mla is None or m.parallel_block else mla_latent_transfers(m, plan, group, hs, r)


TP_SYNC_COPIES = 4.0
"""HBM bytes per byte of the buffer that Megatron-Core's step-end TP gradient all-reduce moves on the GPU around its
NCCL kernel, serial with it: _flatten_dense_tensors packs the gradients into one buffer (1 read, 1 write) and each
gradient copies its synced slice back (buf.copy_: 1 read, 1 write). Source: NVIDIA/Megatron-LM at d98e8a64dd,
megatron/core/distributed/finalize_model_grads.py (_allreduce_non_tensor_model_parallel_grads).
Derived: docs/formulas.md#comm.tp_grad_sync"""


def tp_synced_params(m: ModelSpec, plan: ParallelPlan, stage: Any) -> tuple[Any, Any]:
    """(summed, averaged) parameters whose gradients a rank of pipeline stage `stage` all-reduces over TP once a
    step (tp_synced_layer_params per layer of the stage, the final norm on the last; the sparse indexer's
    averaged), 0 with TP 1 or PyTorch DTensor TP (not Megatron's finalize_model_grads). A DualPipe rank holds the
    paired stage too. Derived: docs/formulas.md#comm.tp_grad_sync"""
    dense, moe, qk = tp_synced_layer_params(m)
    indexer = indexer_params(m) if m.mla is not None else 0  # DeepSeek-V3.2's (dsa.py); V4's compressors: unpriced
    on = (plan.tp > 1) & (plan.tp_impl == "megatron")
    summed, averaged = 0 * plan.tp, 0 * plan.tp
    stages = (stage, plan.pp - 1 - stage) if schedule_of(plan).param_copies == 2 else (stage,)
    for i in stages:
        n_dense, n_moe = stage_weight_layers(m, plan, i)
        last = where(i == plan.pp - 1, norm_params(m), 0)
        summed = summed + where(plan.sp, n_dense * dense + n_moe * moe + last, 0) + (n_dense + n_moe) * qk
        averaged = averaged + (n_dense + n_moe) * attention_share(m) * indexer
    shard = fsdp_tp_sync_shard(plan)
    return where(on, summed / shard, 0), where(on, averaged / shard, 0)


def fsdp_tp_sync_shard(plan: ParallelPlan) -> Any:
    """Ranks whose shards of one TP-synced gradient make it whole in the step-end TP all-reduce: under
    Megatron-FSDP with sharded gradients (ZeRO 2 / 3 with Megatron-Core TP: optim_grads, optim_grads_params)
    a rank all-reduces only its own DP-Shard slice of each (the main_grad DTensor's _local_tensor), so the
    DP-Shard group (zero_shard ranks: dp x cp over dp_replicate); else 1 (the whole gradient). DeepSpeed's AutoTP
    reduces these gradients otherwise, so its export refuses a plan with any (export.deepspeed.tp_synced_refusal).
    Source: NVIDIA/Megatron-LM megatron/core/distributed/finalize_model_grads.py at cd4afffa6
    (_allreduce_non_tensor_model_parallel_grads: `grad._local_tensor.data` when ddp_config.use_megatron_fsdp).
    Derived: docs/formulas.md#comm.tp_grad_sync"""
    return where((plan.zero >= 2) & (plan.tp_impl == "megatron"), plan.zero_shard, 1)


def tp_step_end_transfers(m: ModelSpec, plan: ParallelPlan, group: G) -> list[Transfer[G]]:
    """Megatron-Core's step-end all-reduces over TP of the gradients of the parameters every TP rank holds whole
    (tp_synced_params): one coalesced call of the summed ones and one of the averaged ones, at the gradient
    buffer's dtype (grad_bytes), after the DP reduction and before the optimizer step, serial with both (exposed
    whole); the rank of the candidate stage with the most. Source: NVIDIA/Megatron-LM at d98e8a64dd,
    megatron/core/distributed/finalize_model_grads.py (finalize_model_grads: finish_grad_sync, then
    _allreduce_non_tensor_model_parallel_grads, _flatten_dense_tensors of main_grad and one all_reduce per
    ReduceOp over the tp group). Derived: docs/formulas.md#comm.tp_grad_sync"""
    summed, averaged = 0.0, 0.0
    for i in candidate_stages(m, plan):
        s_i, a_i = tp_synced_params(m, plan, i)
        summed, averaged = maximum(summed, s_i), maximum(averaged, a_i)
    g = plan.grad_bytes
    return [Transfer("all-reduce", where(x > 0, 1, 0), g * x, group, copy_bytes=TP_SYNC_COPIES * g * x, step_end=True)
            for x in (summed, averaged)]


def tp_edge_roles(plan: ParallelPlan, stage: Any) -> tuple[Any, Any]:
    """(holds the embedding, holds the output layer) for pipeline stage `stage`: the first and the last stage
    (both at pp 1). Per stage, as the step prices a stage's micro-batch (a DualPipe rank runs its two stages'
    passes apart, each priced as its stage). Elementwise. Derived: docs/formulas.md#comm.tp_edge"""
    return stage == 0, stage == plan.pp - 1


def tp_edge_calls(plan: ParallelPlan, count: Any) -> Any:
    """Calls a step of one TP collective that `count` edge modules (embeddings, output heads, MTP modules) issue
    once a micro-batch each: Megatron-Core's TP (tp_impl megatron) at tp > 1 only (DTensor's edge plans are not
    priced; a degree-1 axis sends nothing). Elementwise. Derived: docs/formulas.md#comm.tp_edge"""
    return where((plan.tp > 1) & (plan.tp_impl == "megatron"), plan.num_microbatches * count, 0)


def tp_embedding_transfers(m: ModelSpec, plan: ParallelPlan, group: G, count: Any) -> list[Transfer[G]]:
    """A step's TP collectives of `count` vocab-parallel embedding lookups a micro-batch (the input embedding;
    an MTP module's): with SP a reduce-scatter of sbh forward (an all-reduce and a split with learned positions)
    and an all-gather of its gradient backward (the reduce-scatter's or the split's backward), synchronous;
    without SP one all-reduce forward. bf16 (the embedding's dtype). Megatron-Core TP only (tp_impl megatron).
    Source: NVIDIA/Megatron-LM at core_v0.14.0 and d98e8a64dd, megatron/core/tensor_parallel/layers.py
    (VocabParallelEmbedding.forward), models/common/embeddings/language_model_embedding.py
    (reduce_scatter_embeddings, scatter_to_sequence_parallel_region), tensor_parallel/mappings.py
    (_ReduceScatterToSequenceParallelRegion.backward). Derived: docs/formulas.md#comm.tp_edge"""
    S = ACT_BYTES * plan.seq_len / plan.cp * plan.micro_batch * m.hidden_size
    calls = tp_edge_calls(plan, count)
    rs = where(plan.sp & (not m.learned_position_embeddings), calls, 0)
    return [Transfer("reduce-scatter", rs, S, group),
            Transfer("all-reduce", calls - rs, S, group),
            Transfer("all-gather", where(plan.sp, calls, 0), S, group)]


def tp_head_transfers(m: ModelSpec, plan: ParallelPlan, group: G, count: Any) -> list[Transfer[G]]:
    """A step's synchronous TP collectives of `count` output heads a micro-batch (the output layer, once more per
    MTP module): with SP the ColumnParallelLinear's all-gather of its bf16 input forward, and the vocab-parallel
    cross-entropy's collectives of fp32 per-token values, forward only, with or without SP: fused native
    (fused_loss_impl, Megatron's default) an all-reduce of the row max, then one of the predicted logit and the
    exp sum concatenated (1 and 2 floats); fused te one all-gather of every rank's max, exp sum and target logit
    (3 floats a rank, so 3 tp floats gathered); unfused three all-reduces of 1 each. The head's backward
    collectives run asynchronously (tp_head_async_transfers). Megatron-Core TP only. Source: NVIDIA/
    TransformerEngine d0067d0d transformer_engine/pytorch/triton/cross_entropy.py (cross_entropy_forward:
    m_d_X_y, n_rows * 3 fp32, all_gather_into_tensor); NVIDIA/Megatron-LM d98e8a64dd
    megatron/core/models/common/language_module/language_module.py (compute_language_model_loss: te ->
    te_parallel_cross_entropy over the TP group). NVIDIA/Megatron-LM at core_v0.14.0 and d98e8a64dd,
    megatron/core/models/gpt/gpt_model.py (output_layer = tensor_parallel.ColumnParallelLinear;
    TELMHeadColumnParallelLinear at d98e8a6 only under an MXFP8 output projection), tensor_parallel/layers.py
    (LinearWithGradAccumulationAndAsyncCommunication.forward), fusions/fused_cross_entropy.py
    (_VocabParallelCrossEntropy.forward), tensor_parallel/cross_entropy.py (VocabParallelCrossEntropy.forward).
    Derived: docs/formulas.md#comm.tp_edge"""
    T = plan.seq_len / plan.cp * plan.micro_batch
    calls = tp_edge_calls(plan, count)
    fused = where(plan.fused_loss, calls, 0)
    te = where(plan.fused_loss_impl == "te", fused, 0)
    native = fused - te
    loss = [Transfer("all-reduce", calls - te, 4.0 * T, group), Transfer("all-reduce", native, 8.0 * T, group),
            Transfer("all-reduce", 2 * (calls - fused), 4.0 * T, group),
            Transfer("all-gather", te, 12.0 * T * plan.tp, group)]
    return [Transfer("all-gather", where(plan.sp, calls, 0), ACT_BYTES * T * m.hidden_size, group)] + loss


def tp_head_async_transfers(m: ModelSpec, plan: ParallelPlan, group: G, count: Any) -> list[Transfer[G]]:
    """A step's backward TP collectives of `count` output heads a micro-batch that run beside the head's own GEMMs
    (async_op): with SP the re-gather of the saved input (beside the input-gradient GEMM) and the input gradient's
    reduce-scatter (beside the weight-gradient GEMM), without SP the input gradient's all-reduce; bf16 sbh each.
    Source: NVIDIA/Megatron-LM at core_v0.14.0 and d98e8a64dd, megatron/core/tensor_parallel/layers.py
    (LinearWithGradAccumulationAndAsyncCommunication.backward: all_gather / reduce_scatter / all_reduce with
    async_op=True). Derived: docs/formulas.md#comm.tp_edge"""
    S = ACT_BYTES * plan.seq_len / plan.cp * plan.micro_batch * m.hidden_size
    calls = tp_edge_calls(plan, count)
    sp = where(plan.sp, calls, 0)
    return [Transfer("all-gather", sp, S, group), Transfer("reduce-scatter", sp, S, group),
            Transfer("all-reduce", calls - sp, S, group)]


def tp_mtp_transfers(m: ModelSpec, plan: ParallelPlan, group: G,
                     count: Any) -> tuple[list[Transfer[G]], list[Transfer[G]]]:
    """(synchronous, asynchronous) TP collectives of a step's `count` MTP modules a micro-batch beyond their
    transformer layer (priced among the stage's layers) and output head (tp_head_transfers): the embedding
    (tp_embedding_transfers); eh_proj, a column-parallel TE linear of [s, b, 2h] without output gather, its input
    all-gathered forward with SP, its backward's re-gather and input-gradient reduce-scatter (without SP an
    all-reduce) asynchronous; then the output gathered over TP along the hidden dimension (an all-gather of sbh
    forward) and, with SP, split into sequence shards (an all-gather of its gradient backward). bf16 throughout (an
    over-count under fp8, whose TE gathers move quantised inputs). Source: NVIDIA/Megatron-LM at core_v0.14.0 and
    d98e8a64dd, megatron/core/transformer/multi_token_prediction.py (MultiTokenPredictionLayer._get_embeddings,
    _concat_embeddings: eh_proj(gather_output=False), gather_from_tensor_model_parallel_region,
    scatter_to_sequence_parallel_region). Derived: docs/formulas.md#comm.tp_edge"""
    S = ACT_BYTES * plan.seq_len / plan.cp * plan.micro_batch * m.hidden_size
    calls = tp_edge_calls(plan, count)
    sp = where(plan.sp, calls, 0)
    sync = tp_embedding_transfers(m, plan, group, count) + [
        Transfer("all-gather", sp, 2 * S, group),  # eh_proj's input, forward
        Transfer("all-gather", calls, S, group),  # eh_proj's output over the hidden dimension, forward
        Transfer("all-gather", sp, S, group)]  # the sequence split's backward
    return sync, [Transfer("all-gather", sp, 2 * S, group), Transfer("reduce-scatter", sp, 2 * S, group),
                  Transfer("all-reduce", calls - sp, 2 * S, group)]


def tp_edge_transfers(m: ModelSpec, plan: ParallelPlan, group: G,
                      stage: Any) -> tuple[list[Transfer[G]], list[Transfer[G]]]:
    """(synchronous, asynchronous) TP collectives of a step on a rank of pipeline stage `stage` outside its
    decoder layers (tp_transfers): the input embedding on the first stage, the output head (its loss included) on
    the one that holds the output layer (tp_edge_roles; not an embedding each rank holds whole, params.whole_embedding),
    the MTP modules on the stage a pp_layout places them on, else on that one. The asynchronous ones run beside the
    heads' GEMMs (step.tp_edge).
    Derived: docs/formulas.md#comm.tp_edge"""
    first, last = tp_edge_roles(plan, stage)
    mtp = where(last, m.num_nextn_predict_layers, 0) if not has_layout(plan) else stage_mtp_modules(m, plan, stage)
    heads = where(last, 1, 0) + mtp
    mtp_sync, mtp_async = tp_mtp_transfers(m, plan, group, mtp)
    embeds = where(first, where(whole_embedding(m, plan), 0, 1), 0)  # a whole embedding's output needs no all-reduce
    sync = tp_embedding_transfers(m, plan, group, embeds) + tp_head_transfers(m, plan, group, heads)
    return sync + mtp_sync, tp_head_async_transfers(m, plan, group, heads) + mtp_async


def mla_latent_widths(m: ModelSpec) -> tuple[int, int, int]:
    """Elements per token of the three inputs the column side of an MLA attention TP pair gathers under
    Megatron-Core: the query up-projection's (q_lora_rank; the hidden size where queries are not compressed, the
    column-parallel linear_q_proj), the kv up-projection's (kv_lora_rank) and the shared rotary key
    (qk_rope_head_dim). Source: NVIDIA/Megatron-LM d98e8a6 megatron/core/transformer/multi_latent_attention.py
    (MLASelfAttention.__init__, _qkv_down_projection, get_query_key_value_tensors). Derived:
    docs/formulas.md#comm.tp"""
    mla = m.mla
    assert mla is not None
    return mla.q_lora_rank or m.hidden_size, mla.kv_lora_rank, mla.qk_rope_head_dim


def mla_latent_transfers(m: ModelSpec, plan: ParallelPlan, group: G, hs: list[Transfer[G]], r: Any
                         ) -> list[Transfer[G]]:
    """tp_transfers of an MLA model under Megatron-Core (tp_impl megatron): its attention's down-projections
    run duplicated on the rank's sequence shard (TELinear parallel_mode "duplicated", no collective), so the
    column side of its TP pair moves the latents (mla_latent_widths), not sbh. With SP, per attention pair and
    pass: the up-projections' inputs gathered (quantised, gather_bytes) in forward and recompute and again in
    backward for their weight gradients; the rope key gathered in 16 bits in forward and recompute
    (gather_from_sequence_parallel_region), not again; all three input gradients reduce-scattered in 16 bits.
    Without SP: the two up-projections' input gradients all-reduced (copy_to_tensor_model_parallel_region),
    nothing for the rope key. The row side (linear_proj) keeps sbh. DTensor TP keeps sbh: torchtitan gathers the
    attention input whole before its NoParallel wkv_a / wq_a. `hs` is tp_transfers' list at sbh, `r` its
    recomputed share. Source: NVIDIA/Megatron-LM d98e8a6 multi_latent_attention.py; tensor_parallel/mappings.py;
    pytorch/torchtitan 018740b7 torchtitan/models/deepseek_v3/infra/parallelize.py apply_non_moe_tp.
    Derived: docs/formulas.md#comm.tp"""
    s, b = plan.seq_len / plan.cp, plan.micro_batch
    layers = max_stage_layers(m, plan)
    L = m.num_hidden_layers
    att = where(plan.tp_impl == "megatron", plan.num_microbatches * layers * (L - m.count_layers("none")) / L, 0)
    att_sp, att_ar = where(plan.sp, att, 0), where(plan.sp, 0, att)
    qw, kv, rope = mla_latent_widths(m)
    q = gather_bytes(m, plan)
    ar, ag, ag_grad, rs, pp, *routed = hs  # the sbh transfers less the MLA pairs' column side
    gathers = att_sp * (2 + r)  # forward, recompute, the backward re-gather
    out = [replace(ar, calls=ar.calls - att_ar), replace(ag, calls=ag.calls - gathers),
           ag_grad, replace(rs, calls=rs.calls - att_sp), pp, *routed]
    for w in (qw, kv):
        out += [Transfer("all-gather", gathers, q * s * b * w, group),
                Transfer("reduce-scatter", att_sp, ACT_BYTES * s * b * w, group),
                Transfer("all-reduce", att_ar, ACT_BYTES * s * b * w, group)]
    return out + [Transfer("all-gather", att_sp * (1 + r), ACT_BYTES * s * b * rope, group),
                  Transfer("reduce-scatter", att_sp, ACT_BYTES * s * b * rope, group)]


def tp_blocks_per_layer(m: ModelSpec, plan: ParallelPlan) -> Any:
    """TP sub-blocks of the average layer, in transformer layers (2 each): every mixer and dense MLP holds a
    column- and a row-parallel linear; a MoE block under Megatron-Core with expert TP 1 only through its shared
    experts. Its routed experts take the rank's sequence shard straight to the EP dispatch (the dispatchers'
    TP is the expert TP group, moe/token_dispatcher.py MoETokenDispatcher.tp_group = pg_collection.expt_tp),
    and its router and latent projections are duplicated on that shard (moe_layer.py, parallel_mode
    "duplicated"): no TP collective. Expert TP > 1 keeps the MLP's pair only under the alltoall dispatcher (it
    gathers the routed tokens over that group; the flex dispatcher has no TP collective:
    tp_routed_blocks_per_layer), and DTensor TP keeps it. A parallel transformer block (ModelSpec.parallel_block) feeds
    its attention and MLP one
    gathered input and reduce-scatters their summed outputs once: one pair per layer, half. Source:
    NVIDIA/Megatron-LM d98e8a6 megatron/core/transformer/moe/token_dispatcher.py, moe_layer.py; Jiang et al.
    2024 (MegaScale, arXiv:2402.15627) §3.1. Derived: docs/formulas.md#comm.tp"""
    L = m.num_hidden_layers
    shared = where((m.shared_ffn > 0) | (plan.tp_impl != "megatron"), m.num_moe_layers, 0)
    # the parallel transformer block (ModelSpec.parallel_block): attention and MLP share one pair
    dense = (L - m.count_layers("none") + m.num_mlp_layers + shared) / L / (4 if m.parallel_block else 2)
    return dense + tp_routed_blocks_per_layer(m, plan)


def tp_routed_blocks_per_layer(m: ModelSpec, plan: ParallelPlan) -> Any:
    """The routed experts' TP sub-blocks of the average layer (of tp_blocks_per_layer's), under Megatron-Core with
    expert TP > 1 and the alltoall dispatcher: it gathers the dispatched rows over the expert-TP group
    (gather_from_sequence_parallel_region) and reduce-scatters the experts' outputs
    (reduce_scatter_to_sequence_parallel_region), no Transformer Engine quantizer (the grouped linear quantises
    the gathered rows itself and keeps them for its weight gradients: no backward re-gather); their bytes are
    routed_pair_transfers'. The flex dispatcher (deepep: DeepEP or HybridEP) runs no TP collective: it dispatches
    over the expert-TP x EP group, each token to every expert-TP rank of each EP rank it reaches. A MoE block
    with shared experts holds their pair besides. Source: NVIDIA/Megatron-LM d98e8a6
    megatron/core/transformer/moe/token_dispatcher.py (MoEAlltoAllTokenDispatcher.dispatch_postprocess,
    combine_preprocess; MoEFlexTokenDispatcher: group tp_ep_group, _initialize_metadata expands the routing map
    over tp_size), moe/shared_experts.py. Derived: docs/formulas.md#comm.tp"""
    routed = where((plan.etp_resolved > 1) & (plan.tp_impl == "megatron") & (plan.moe_dispatcher == "alltoall"),
                   m.num_moe_layers, 0)
    return routed / m.num_hidden_layers / (4 if m.parallel_block else 2)


def routed_pair_rows(m: ModelSpec, plan: ParallelPlan) -> Any:
    """The alltoall dispatcher's expert-TP gathered buffer in rows per token of the sequence (s·b): each of the
    etp ranks brings the rows its EP all-to-all received, its s·b/t tokens' k routed copies (as ep_transfers:
    the most-loaded rank's, with moe_router_padding's padded rows): etp·k/t under SP, k at etp = t.
    Source: NVIDIA/Megatron-LM d98e8a6 megatron/core/transformer/moe/token_dispatcher.py
    (MoEAlltoAllTokenDispatcher.dispatch_postprocess gathers global_input_tokens, the all-to-all's output).
    Derived: docs/formulas.md#comm.etp_pair"""
    load = routing_imbalance(m, plan) + router_padding_share(m, plan)
    return plan.etp_resolved / where(plan.sp, plan.tp, 1) * m.num_experts_per_tok * load


def routed_pair_transfers(m: ModelSpec, plan: ParallelPlan, group: G, pairs: Any, r: Any) -> list[Transfer[G]]:
    """The alltoall dispatcher's expert-TP collectives for `pairs` routed pairs (tp_routed_blocks_per_layer's, per
    step), r the recomputed share; each message the gathered buffer, routed_pair_rows(m, plan)·s·b rows.
    Forward (and recompute): all-gathers of the dispatched rows (bf16, h wide) and of their routing probabilities
    (one ROUTER_PROB_BYTES value a row), a reduce-scatter of the experts' output cast to the probabilities'
    dtype (hidden_states.to(self.probs.dtype): fp32 under moe_router_dtype fp32). Backward: the reverse of each
    (mappings.py: a gather's backward reduce-scatters, a reduce-scatter's gathers), in the same dtypes.
    Source: NVIDIA/Megatron-LM d98e8a6 megatron/core/transformer/moe/token_dispatcher.py
    (MoEAlltoAllTokenDispatcher.dispatch_postprocess, combine_preprocess), tensor_parallel/mappings.py
    (_GatherFromSequenceParallelRegion, _ReduceScatterToSequenceParallelRegion).
    Derived: docs/formulas.md#comm.etp_pair"""
    rows = plan.seq_len / plan.cp * plan.micro_batch * routed_pair_rows(m, plan)
    tokens, probs, out = (rows * m.hidden_size * ACT_BYTES, rows * ROUTER_PROB_BYTES,
                          rows * m.hidden_size * ROUTER_PROB_BYTES)
    fwd = pairs * (1 + r)
    return [Transfer("all-gather", fwd, tokens, group), Transfer("all-gather", fwd, probs, group),
            Transfer("reduce-scatter", fwd, out, group), Transfer("all-gather", pairs, out, group),
            Transfer("reduce-scatter", pairs, tokens, group), Transfer("reduce-scatter", pairs, probs, group)]


def routed_pair_roles(m: ModelSpec, plan: ParallelPlan, r: Any) -> tuple[Any, Any, Any, Any]:
    """routed_pair_transfers' bytes per s·b·h element for two routed pairs (a transformer layer's), in
    tp_role_bytes' roles: the ring's gathers (forward tokens and probabilities, 1 + r each, the backward's output
    gradient), the forward reduce-scatters (1 + r), no re-gather, the backward reduce-scatters (tokens and
    probabilities). Derived: docs/formulas.md#comm.etp_pair"""
    f, a, p = 2 * routed_pair_rows(m, plan), ACT_BYTES, ROUTER_PROB_BYTES
    pa = p / m.hidden_size  # a probability a row, per element of the row
    return f * ((1 + r) * (a + pa) + p), f * (1 + r) * p, 0 * f, f * (a + pa)


Roles = tuple[Any, Any, Any, Any]
"""Bytes per s·b·h element of each userbuffer role (tp_role_bytes), in RoleSms' order."""


def tp_forward_rs_share(m: ModelSpec, plan: ParallelPlan, r: Any, roles: Roles | None = None) -> Any:
    """Share of a stage's TP seconds (tp_transfers, Megatron-LM with SP) in its forward and recompute
    reduce-scatters: 2 + 2r of its 4 + 2r reduce-scatters of sbh in 16 bits, beside its 6 + 2r all-gathers per two
    pairs, at the bytes tp_role_bytes gives each (r the stage's recomputed share): the forward and recompute ones
    and the re-gathers at gather_bytes, the output gradients' at its both-usage bytes (two copies under
    TWO_USAGE_GATHER_RECIPES), a routed-expert pair's (expert TP > 1) routed_pair_roles' and no re-gather. By bytes:
    every one is a collective over the same group of a message of the same shape. `roles`: tp_role_bytes(m, plan,
    r) where the caller has it. Derived: docs/formulas.md#step.tp"""
    roles = tp_role_bytes(m, plan, r) if roles is None else roles
    return roles[1] / sum(roles)


def tp_role_bytes(m: ModelSpec, plan: ParallelPlan, r: Any) -> Roles:
    """Bytes per s·b·h element that a transformer layer's TP collectives move under Megatron-LM with SP
    (tp_transfers), per userbuffer role as RoleSms orders them: 4 + 2r all-gathers feeding a GEMM (forward,
    recompute and the row-parallel linears' output gradients, one copy each at gather_bytes), 2 + 2r
    forward and recompute reduce-scatters in 16 bits, 2 backward re-gathers at gather_bytes with the output
    gradients' second copy (both-usage bytes less one copy: MXFP8's columnwise copy, which Transformer Engine
    gathers as a bulk overlap beside the dgrad GEMM, the "external" proj_wgrad / fc2_wgrad userbuffers at the
    bulk methods' 16 SMs and margin; module/linear.py v2.16.1 bulk_overlap_ag_with_external_gemm, module/base.py
    get_default_config), 2 input-gradient reduce-scatters in 16 bits (r the stage's recomputed share). An MLA model's
    attention pairs (their share f of
    the layer's pairs) move their latents on the column side instead (mla_latent_transfers); the routed experts'
    pairs under expert TP (their share g, tp_routed_blocks_per_layer) move routed_pair_roles' bytes, no re-gather.
    Derived: docs/formulas.md#comm.tp"""
    q, a, q2 = gather_bytes(m, plan), ACT_BYTES, gather_bytes(m, plan, both_usages=True)
    # the output gradients' second (columnwise) copy runs as a bulk all-gather beside the dgrad GEMM
    roles = (2 + 2 * r) * q + 2 * q, (2 + 2 * r) * a, 2 * q + 2 * (q2 - q), 2 * a
    blocks = maximum(tp_blocks_per_layer(m, plan), 1e-9)
    g = tp_routed_blocks_per_layer(m, plan) / blocks
    # no routed pair under expert TP anywhere (g = 0): g·routed is 0, so its terms are not costed
    routed = routed_pair_roles(m, plan, r) if np.any(g) else (0.0, 0.0, 0.0, 0.0)
    f = 0.0
    mla = roles  # an MLA attention pair's column side moves its latents (mla_latent_transfers), its row side sbh
    if m.mla is not None and not m.parallel_block:
        L, (qw, kv, rope), h = m.num_hidden_layers, mla_latent_widths(m), m.hidden_size
        f = where(plan.tp_impl == "megatron", (L - m.count_layers("none")) / L / (2 * blocks), 0)
        mla = ((1 + r) * ((qw + kv) * q + rope * a) / h + q, (1 + r) * a, (qw + kv) * q / h + q2 - q,
               (qw + kv + rope) * a / h)
    ring, fwd_rs, re_gather, bwd_rs = ((1 - f - g) * x + 2 * f * y + g * z
                                       for x, y, z in zip(roles, mla, routed, strict=True))
    return ring, fwd_rs, re_gather, bwd_rs


def tp_unfused_rs_share(m: ModelSpec, plan: ParallelPlan, r: Any) -> Any:
    """Share of a stage's TP seconds (tp_transfers, DTensor TP with SP) in the backward's 2 reduce-scatters
    of the input gradients of the two column-parallel groups (wq / wk / wv, w1 / w3), which async TP does not
    fuse with a matmul: each scatters the sum of its linears' input gradients, and PyTorch's micro-pipeline
    TP pass fuses a reduce-scatter only with the one matmul that produces its input. Beside them: 2 + 2r
    other reduce-scatters of 16 bits and 4 + 2r all-gathers of gather_bytes (r the stage's recomputed share).
    By bytes, as tp_forward_rs_share.
    Source: pytorch/pytorch torch/_inductor/fx_passes/micro_pipeline_tp.py (fuse_matmul_reduce_scatter,
    _find_producer_matmul); pytorch/torchtitan parallelize_llama.py at 9dec370 (one PrepareModuleInput
    gather before wq / wk / wv and before w1 / w3). Derived: docs/formulas.md#step.tp"""
    unfused = 2 * ACT_BYTES
    return unfused / ((4 + 2 * r) * (ACT_BYTES + gather_bytes(m, plan)))


def symm_mem_tp_seconds(m: ModelSpec, plan: ParallelPlan, gpu: GpuSpec, layers: Any, r: Any) -> Any:
    """Seconds per micro-batch on a stage of `layers` layers that DTensor async TP (tp_impl dtensor with
    tp_comm_overlap and sp) spends on the compute stream outside its matmuls, at the GPU's achieved HBM
    bandwidth: each fused reduce-scatter (the forward's and recompute's, one a TP pair and pass) pulls
    the tp partial chunks of its M x N output into one buffer and sums them in a separate kernel after the last
    chunk, reading the whole 16-bit output sbh and writing its 1/tp share; each fused all-gather (the same
    gathers plus the backward's of the output gradients) copies the local shard into the gathered buffer,
    a read and a write of sbh/tp at gather_bytes. One of each per TP pair, as tp_transfers counts them
    (2 tp_blocks_per_layer a layer: a parallel block's attention and MLP share one). 0 for every other plan.
    Source: pytorch/pytorch torch/distributed/_symmetric_memory/__init__.py (_fused_matmul_reduce_scatter_impl:
    reduce_fn over stacked_partials after _pipelined_produce_and_all2all; _pipelined_all_gather_and_consume:
    chunks[rank].copy_(shard) on the current stream). Derived: docs/formulas.md#step.tp"""
    t = plan.tp
    sbh = plan.seq_len / plan.cp * plan.micro_batch * m.hidden_size
    passes = 2 * tp_blocks_per_layer(m, plan) * layers  # one fused reduce-scatter and one gather a pair and pass
    reduce = passes * (1 + r) * ACT_BYTES * sbh * (1 + 1 / t)
    local = passes * (2 + r) * 2 * gather_bytes(m, plan) * sbh / t
    on = (plan.tp_impl == "dtensor") & plan.tp_comm_overlap & plan.sp & (t > 1)
    return where(on, (reduce + local) / gpu.hbm_achieved_bytes_per_s, 0.0)


RoleSms = tuple[float, float, float, float]
"""One number per userbuffer role, in ParallelPlan.tp_overlap_sms's order: (ring all-gathers, forward
reduce-scatters, backward re-gathers, backward reduce-scatters)."""

TE_UB_SMS: RoleSms = (1.0, 16.0, 16.0, 16.0)
"""SMs Transformer Engine's userbuffers hold beside a TP GEMM by default, per role (ParallelPlan.tp_overlap_sms):
ring exchange for the all-gathers feeding a GEMM, num_sm 1 with use_ce (each chunk moves by cudaMemcpyAsync on a
copy engine, a one-thread kernel sets the flag); pipeline for the forward reduce-scatters and bulk for the
backward re-gathers and reduce-scatters, num_sm 16. Source: NVIDIA/TransformerEngine
transformer_engine/pytorch/module/base.py initialize_ub (v1.8 ub_cfg.get("num_sm", 1 if method ==
"ring_exchange" else 16), use_ce True; v2.8 get_default_config, the same) and common/comm_gemm_overlap/
userbuffers/userbuffers.cu userbuffers_send (use_ce: cudaMemcpyAsync, a <<<1, 1>>> signal kernel)."""


TUNED_LOW_PRECISION_RS_SMS = 1.0
"""SMs of the forward reduce-scatters (proj_fprop, fc2_fprop) in every fp8 userbuffer config NVIDIA publishes:
a ring exchange on copy engines, RingExchangeOverlapCfg(num_sm=1, set_sm_margin=True), where the bf16 configs run
a pipeline on 8 - 32 SMs with the margin. Megatron-Bridge's Llama performance recipes name the fp8 config for
every precision but bf16 (fp8_cs, fp8_mx, nvfp4). Source: NVIDIA-NeMo/Megatron-Bridge 067f987d
src/megatron/bridge/training/comm_overlap.py (userbuffers_fp8_h100_h8192_tp4, _h100_h16384_tp8_cp2,
_b200_h8192_tp2, _b200_h16384_tp4_cp2 _mbs1_seqlen8192), perf_recipes/llama/{b200,gb200}/llama3.py.
Derived: docs/formulas.md#step.ub_low_precision"""


def tp_role_sms(plan: ParallelPlan) -> RoleSms:
    """SMs each userbuffer role holds beside its GEMM: ParallelPlan.tp_overlap_sms, else TE_UB_SMS; a plan that
    sets neither tp_overlap_sms nor tp_overlap_margin_sms (the published configs priced) with fp8 / fp4 GEMMs
    runs its forward reduce-scatters as the fp8 configs do (TUNED_LOW_PRECISION_RS_SMS).
    Derived: docs/formulas.md#step.ub_low_precision"""
    if plan.tp_overlap_sms:
        return plan.tp_overlap_sms
    if plan.tp_overlap_margin_sms is None and plan.dtype in ("fp8", "fp4"):
        ring, _, re_gather, bwd_rs = TE_UB_SMS
        return ring, TUNED_LOW_PRECISION_RS_SMS, re_gather, bwd_rs
    return TE_UB_SMS


def role_margins(sms: RoleSms, margined: tuple[bool, bool, bool, bool]) -> RoleSms:
    """Each role's SMs where set_sm_margin is on for it (`margined`), 0 where it is off."""
    ring, fwd_rs, re_gather, bwd_rs = (n * on for n, on in zip(sms, margined, strict=True))
    return ring, fwd_rs, re_gather, bwd_rs


def tp_overlap_contention(m: ModelSpec, plan: ParallelPlan, r: Any, sm_count: int,
                          roles: Roles | None = None) -> Any:
    """Share of the GPU's SMs Transformer Engine's userbuffers hold while TP communication runs beside the
    GEMMs (tp_comm_overlap, tp_impl megatron): each role's SMs (ParallelPlan.tp_overlap_sms, else TE_UB_SMS)
    weighted by the seconds it overlaps, as tp_role_bytes counts them: 4 + 2r all-gathers feeding a GEMM
    (forward, recompute, output gradients: the ring exchange; a routed-expert pair's gathers are the token
    dispatcher's NCCL ones, not userbuffers, charged at the ring's SMs here), 2 + 2r forward reduce-scatters
    less the last of their TE_PIPELINE_SPLITS chunks (it runs after the last GEMM), 2 re-gathers (with MXFP8's
    columnwise copies of the output gradients: TE's external bulk all-gather) and 2 reduce-scatters in bulk.
    At most half the GPU, as GpuSpec.contention. `roles`: tp_role_bytes(m, plan, r) where the caller has it.
    Derived: docs/formulas.md#step.ub_sms"""
    ring, fwd_rs, re_gather, bwd_rs = tp_role_bytes(m, plan, r) if roles is None else roles
    spans = (ring, fwd_rs * (1 - 1 / TE_PIPELINE_SPLITS), re_gather, bwd_rs)
    # a role whose GEMM already runs on N_SM - margin SMs (set_sm_margin) contends only beyond its margin
    free = (maximum(n - k, 0.0) for n, k in zip(tp_role_sms(plan), tp_margin_sms(plan), strict=True))
    held = sum(x * n for x, n in zip(spans, free, strict=True))
    return minimum(held / sum(spans) / sm_count, 0.5)


TE_UB_MARGIN = (False, True, True, True)  # per role, as RoleSms orders them
"""Whether Transformer Engine sets an SM margin on each role's GEMMs when no userbuffer config says otherwise:
from v2.0 get_default_config's "set_sm_margin": not method == "ring_exchange" (ring exchange for the
all-gathers, pipeline for the forward reduce-scatters, bulk for the backward); v1.8 - v1.13 default False.
Source: NVIDIA/TransformerEngine transformer_engine/pytorch/module/base.py initialize_ub at v1.13 / v2.0 / v2.8."""

TUNED_UB_MARGIN = (False, True, False, False)  # per role, as RoleSms orders them
"""The margins NVIDIA's published userbuffer configs set, which llmplan prices by default
(ParallelPlan.tp_overlap_margin_sms None): set_sm_margin on the pipelined forward reduce-scatters (proj_fprop,
fc2_fprop) only, every bulk overlap and ring all-gather without. Source: NVIDIA-NeMo/Megatron-Bridge
src/megatron/bridge/training/comm_overlap.py (v0.2.0 .. 067f987d: PipelineOverlapCfg / RingExchangeOverlapCfg
set_sm_margin=True on proj_fprop / fc2_fprop, BulkOverlapCfg set_sm_margin=False), NeMo
tp_overlap_configs/userbuffers.py (ab020f6a72). Derived: docs/formulas.md#step.ub_margin"""


def te_default_margin_sms(sms: RoleSms | None = None) -> RoleSms:
    """tp_overlap_margin_sms of a run that passes Transformer Engine >= 2.0 no userbuffer config (TE_UB_MARGIN
    on each role's SMs, `sms` or TE_UB_SMS): the bulk overlaps' GEMMs also run on N_SM - num_sm SMs.
    Derived: docs/formulas.md#step.ub_margin"""
    return role_margins(sms or TE_UB_SMS, TE_UB_MARGIN)


def tp_margin_sms(plan: ParallelPlan) -> RoleSms:
    """SMs set_sm_margin takes from each role's GEMMs (ParallelPlan.tp_overlap_margin_sms; None: the published
    configs' margins, TUNED_UB_MARGIN on each role's tp_overlap_sms, else TE_UB_SMS).
    Derived: docs/formulas.md#step.ub_margin"""
    if plan.tp_overlap_margin_sms is not None:
        return plan.tp_overlap_margin_sms
    return role_margins(tp_role_sms(plan), TUNED_UB_MARGIN)


def tp_pair_weights(m: ModelSpec) -> tuple[tuple[Any, Any, Any], ...]:
    """(share of layers, column-parallel weights, row-parallel weights) of each TP pair kind of the average
    layer, its share of layers applied: attention (QKV; the output projection a·d·h), dense MLP (fc1; fc2 f·h),
    Mamba-2 (in_proj; out_proj H·P x h: Megatron-LM ssm/mamba_mixer.py, tp_comm_buffer_name "fc1" / "fc2").
    Derived: docs/formulas.md#step.ub_margin"""
    h, f, d_in = m.hidden_size, m.intermediate_size, (m.mamba_num_heads or 0) * (m.mamba_head_dim or 0)
    att, mlp = attention_share(m), 0.0 if m.is_moe else dense_mlp_share(m)
    mamba = m.count_layers("mamba") / m.num_hidden_layers
    ad = m.num_attention_heads * m.d_head
    in_proj = h * (2 * d_in + 2 * (m.n_groups or 0) * (m.ssm_state_size or 0) + (m.mamba_num_heads or 0))
    return ((att, att * (attention_params(m) - ad * h), att * ad * h),
            (mlp, mlp * (mlp_params(m, f) - f * h), mlp * f * h),
            (mamba, mamba * in_proj, mamba * d_in * h))


def layer_gemm_weights(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Matmul weights of the average layer over the TP group, from its GEMM FLOPs (flops.layer_flops: 2 a
    weight and token, s·b tokens, one rank's 1/tp). Derived: docs/formulas.md#step.ub_margin"""
    return layer_flops(m, plan, m.is_moe).gemm * plan.tp / (2 * plan.seq_len / plan.cp * plan.micro_batch)


def tp_role_gemm_shares(m: ModelSpec, plan: ParallelPlan, r: Any) -> tuple[Any, Any, Any, Any]:
    """Share of a stage's GEMM seconds (forward, r recomputed, backward's two) each userbuffer role's GEMMs
    take, by FLOPs: the row-parallel linears (attention output projection, dense fc2: a·d·h and f·h weights)
    and the column-parallel rest (QKV, fc1) of the average layer's matmul weights (flops.layer_flops).
    Ring all-gathers feed the column GEMMs' forward and recompute and the row GEMMs' input gradients; the
    forward reduce-scatters follow the row GEMMs' forward and recompute; the re-gathers run beside the column
    GEMMs' input gradients, the backward reduce-scatters beside their weight gradients. Mamba-2 mixers pair
    as tp_pair_weights says; experts and linear-attention mixers count in the whole only. Derived:
    docs/formulas.md#step.ub_margin"""
    kinds, weights = tp_pair_weights(m), layer_gemm_weights(m, plan)
    col = sum(c for _share, c, _w in kinds) / weights
    row = sum(w for _share, _c, w in kinds) / weights
    passes = 3 + r
    return ((1 + r) * col + row) / passes, (1 + r) * row / passes, col / passes, col / passes


def tp_chunk_step_waits(m: ModelSpec, plan: ParallelPlan, tp: Any, gemm: Any, r: Any,
                        roles: Roles | None = None) -> Any:
    """Seconds a stage's micro-batch waits, beyond its GEMMs and the last pipeline chunk's reduce-scatter
    (tp_exposed's waits), where a userbuffers chunk step is transfer-bound (tp_comm_overlap, sp, tp_impl
    megatron). Ring exchange (the forward's and recompute's column GEMMs, the row GEMMs' input gradients): the
    t - 1 sends run one after another (step i + 1's send waits for step i's receive) and chunk i + 1's GEMM for
    that receive, so a GEMM of G seconds beside a gather of C ends at max(G, C + G / t), C - G (1 - 1/t) late
    when positive. Pipeline (the row GEMMs' forward reduce-scatters, n = TE_PIPELINE_SPLITS): chunk i's
    reduce-scatter follows its GEMM and the previous chunk's on one stream, max(G + C/n, G/n + C): (1 - 1/n)
    (C - G) beyond tp_exposed's C/n. C is the collective's share of the stage's TP seconds `tp` (its bytes of
    tp_transfers'), G the GEMM's share of `gemm` (its weights' share of layer_flops, one pass), per TP pair
    (an attention block, a dense MLP and a Mamba-2 mixer, tp_pair_weights; or a parallel block's one pair);
    within a layer kind every layer is alike, so the stage's totals stand for the per-layer max. A Mamba-2
    mixer's in_proj / out_proj run TE's fc1 / fc2 userbuffers (Megatron-LM megatron/core/ssm/mamba_mixer.py,
    tp_comm_buffer_name), so they chunk as an MLP's pair. Source: NVIDIA/TransformerEngine
    pytorch/csrc/comm_gemm_overlap.h at v1.8 (UbufP2PCommOverlap::split_overlap_ag: _stream_send waits
    _stop_recv; _stream_compute[(i + 1) % n] waits _stop_recv) and common/comm_gemm_overlap/
    comm_gemm_overlap.cpp at v2.8 (CommOverlapP2PBase::split_overlap_ag, CommOverlapBase::split_overlap_rs).
    `roles`: tp_role_bytes(m, plan, r) where the caller has it. Derived: docs/formulas.md#step.tp_chunk_steps"""
    t, n = plan.tp, TE_PIPELINE_SPLITS
    q, a = gather_bytes(m, plan), ACT_BYTES
    roles = tp_role_bytes(m, plan, r) if roles is None else roles
    per_pair = tp / maximum(tp_blocks_per_layer(m, plan), 1e-9) / sum(roles)
    pass_s = gemm / (3 + r) / maximum(layer_gemm_weights(m, plan), 1e-9)  # seconds of one pass per weight
    attention, mlp, mamba = tp_pair_weights(m)
    kinds: tuple[tuple[Any, Any, Any], ...] = (attention, mlp, mamba)
    if m.parallel_block:  # one gathered input feeds both column GEMMs, one reduce-scatter takes both rows
        kinds = ((attention[0], attention[1] + mlp[1], attention[2] + mlp[2]),)
    ring, pipe = 0.0, 0.0
    for k, c, w in kinds:
        # one collective of the stage's pairs of this kind; the ring moves one copy of the output gradient too
        # (TE v2.16.1 linear.py gathers MXFP8's columnwise copy apart from the userbuffer ring)
        gather, scatter = k * q * per_pair, k * a * per_pair
        ring = ring + (1 + r) * maximum(gather - c * pass_s * (1 - 1 / t), 0.0)
        ring = ring + maximum(gather - w * pass_s * (1 - 1 / t), 0.0)
        pipe = pipe + (1 + r) * maximum(scatter - w * pass_s, 0.0) * (1 - 1 / n)
    return where(userbuffers_on(plan), ring + pipe, 0.0)


def tp_sm_margin_seconds(m: ModelSpec, plan: ParallelPlan, gemm: Any, r: Any, sm_count: int) -> Any:
    """Seconds a stage's micro-batch loses to set_sm_margin under userbuffers (tp_comm_overlap, sp, tp_impl
    megatron): each role's GEMMs (tp_role_gemm_shares of the stage's `gemm` seconds) run on N_SM - k SMs
    (tp_margin_sms) for their whole length, k / (N_SM - k) of their time more; tp_overlap_contention then
    charges those roles nothing beyond k. 0 for every other plan.
    Source: NVIDIA/TransformerEngine common/comm_gemm_overlap/comm_gemm_overlap.cpp (v2.8) CommOverlapCore::
    initialize (_math_sms = set_sm_margin ? sm_count - num_comm_sm : sm_count), passed to every GEMM chunk of
    bulk_overlap, split_overlap_rs and split_overlap_ag. Derived: docs/formulas.md#step.ub_margin"""
    shares = tp_role_gemm_shares(m, plan, r)
    extra = sum(s * k / max(sm_count - k, 1) for s, k in zip(shares, tp_margin_sms(plan), strict=True))
    return where(userbuffers_on(plan), gemm * extra, 0.0)


def pp_scattered(plan: ParallelPlan) -> Any:
    """Whether a stage's output crosses to the next stage split over the TP ranks: with SP it is already
    split; without, when pipeline scatter/gather is on (ParallelPlan.pp_scatter_gather).
    Source: Narayanan et al. 2021 §4.1 (scatter/gather communication optimization). Derived:
    docs/formulas.md#comm.pp"""
    return where(plan.sp, True, plan.pp_scatter_gather)


def pp_sends(plan: ParallelPlan) -> Any:
    """Sends per step between neighbouring pipeline stages: each micro-batch's activation forward and its gradient
    backward, once per model chunk, 2·n·v. Derived: docs/formulas.md#comm.pp"""
    return 2 * plan.num_microbatches * plan.vpp


def pp_gathers(plan: ParallelPlan) -> Any:
    """All-gathers over TP that pipeline scatter/gather adds without SP: the receiving stage rebuilds each
    activation (forward) and gradient (backward) from the TP ranks' 1/t slices, 2 per micro-batch and chunk
    (Megatron-LM p2p_communication.py at 50a4b5fa02, gather_split_1d_tensor; DeepSpeed PartitionedTensor.full).
    Derived: docs/formulas.md#comm.pp"""
    rebuilt = where(plan.sp, False, plan.pp_scatter_gather)  # with SP the layers take it split (sequence shards)
    return where(rebuilt & (plan.pp > 1), pp_sends(plan), 0)


def pp_transfers(m: ModelSpec, plan: ParallelPlan, group: G) -> list[Transfer[G]]:
    """Per micro-batch and model chunk: the activation forward and its gradient backward, sbh/t per TP rank
    with SP or pipeline scatter/gather (pp_scattered), sbh from every TP rank otherwise; a model with
    hyper-connections sends its hc_mult residual streams (n·h per token: DeepSeek-V4's [s, b, n, h] between
    layers, transformers DeepseekV4DecoderLayer). Derived: docs/formulas.md#comm.pp"""
    s, b, h = plan.seq_len / plan.cp, plan.micro_batch, m.hidden_size * m.hc_mult
    S = ACT_BYTES * s * b * h / where(pp_scattered(plan), plan.tp, 1)
    return [Transfer("send-recv", pp_sends(plan), S, group)]


def dp_transfers(m: ModelSpec, plan: ParallelPlan, dense_group: G, expert_group: G,
                 stage: Any = 0, dense_outer: G | None = None, expert_outer: G | None = None) -> list[Transfer[G]]:
    """Gradient synchronisation over dp x cp (dense) and expert-dp (experts): all-reduce of the gradients;
    with ZeRO-1 (distributed optimizer) one reduce-scatter of the accumulated gradients + all-gather of the
    updated weights per step; ZeRO-2 keeps only its gradient shard, so it reduce-scatters after every
    micro-batch's backward (DeepSpeed stage 2, FSDP SHARD_GRAD_OP); ZeRO-3 also all-gathers the weights in
    every forward and backward of every micro-batch. Under a pipeline, ZeRO-2/3 keep the stage gathered and
    its gradients unsharded until the last micro-batch (PyTorch pipelining with FSDP2: no resharding, no
    gradient sync before the last backward), so they gather and reduce once per step, as ZeRO-1.
    ZeRO-1 with grad_reduce all-reduce (DeepSpeed's BF16_Optimizer under its pipeline engine) all-reduces the
    whole gradient, twice a reduce-scatter's traffic, before each rank steps its shard and gathers the weights.
    The parameters are those of a rank of pipeline stage `stage` (stepped_rank_params: both paired stages'
    under DualPipe).
    Source: Rajbhandari et al. 2020 §7 (ZeRO communication volume); microsoft/DeepSpeed
    runtime/pipe/engine.py _bf16_reduce_grads (buffered_allreduce_fallback of the optimizer's fp32 gradients).
    Hybrid sharding (dp_replicate > 1): the groups above are the shard groups (dense_group, expert_group: the
    partial groups), and each step the replicas reduce the shard's gradients across them (hsdp_transfers).
    Under fp32_embedding_grads the dense reduce-scatter moves the embeddings' fp32 buckets at 4 bytes
    (fp32_embedding_grad_bytes more: NVIDIA/apex @810ffae374 apex/contrib/optimizers/distributed_fused_adam.py
    _start_bucket_grad_sync, reduce_scatter_tensor of each bucket in its grads_bucket dtype, the grad_sync_dtype
    torch.float32 NeMo's init_params_bucket gives them; docs/formulas.md#comm.fp32_embedding_grads).
    A later pipeline stage's DDP is unbucketed: one call per chunk (docs/formulas.md#step.dp_later_rs).
    Derived: docs/formulas.md#comm.dp, docs/formulas.md#step.stage_tail, docs/formulas.md#mem.hsdp"""
    rp = stepped_rank_params(m, plan, stage)
    n, z = plan.num_microbatches, plan.zero
    kept = bf16_gathered_params(m, plan, stage)  # gathered at 2 B under fp8_params (torchao: the experts too)
    per_mb, gathered = plan.sharded_per_microbatch, plan.gathered_per_microbatch
    whole = (z == 0) | ((z == 1) & (plan.grad_reduce == "all-reduce"))  # every rank gets the whole gradient
    # ZeRO-2/3 per micro-batch: one collective per unit and group (zero3_units); once a step: one
    units = zero3_units(m, plan, stage)
    ur = [where(per_mb, x, 1) for x in units]
    ug = [where(gathered, x, 1) for x in units]
    host = where(gathered, zero3_host_seconds(plan), 0.0)
    per_tensor = gathered & (plan.zero3_unit == "tensor")  # ZERO3_GATHER_COPIES
    megatron = z <= 1  # Megatron-Core's DDP and distributed optimizer: per bucket (dp_step_calls)
    # the first chunk cut into buckets (comm.dp_bucket), on the first stage only (step.dp_later_rs); Apex's
    # DistributedFusedAdam (kept_grad_shards) keeps its bucket_cap_mb buckets on every stage
    one_call = later_stage_unbucketed(plan, stage) & np.logical_not(plan.kept_grad_shards)
    bucketed = first_chunk_bucketed(plan) & np.logical_not(one_call)
    out: list[Transfer[G]] = []
    # NeMo 1.x / Apex: the embeddings' fp32 buckets reduce-scattered in fp32 (comm.fp32_embedding_grads)
    emb32 = fp32_embedding_grad_bytes(m, plan, stage)
    groups = ((rp.dense, kept.dense, dense_group, plan.zero_shard, emb32, ur[0], ug[0]),
              (rp.expert, kept.expert, expert_group, plan.expert_shard, 0.0, ur[1], ug[1]))
    cast = torchao_fp8_gather_cast_bytes(m, plan, stage)  # per gather call, before the dense all-gather
    for params, bf16, group, ranks, wide, u_r, u_g in groups:
        # sharded gradients: every backward
        reduce_calls = where(per_mb, n * u_r, where((z >= 1) & np.logical_not(whole), 1, 0))
        gather_calls = where(gathered, zero3_gathers(plan, m.num_hidden_layers, m) * n * u_g, where(z >= 1, 1, 0))
        reduced_b, gathered_b = sync_bytes(plan, params, bf16)
        reduced_b = reduced_b + wide
        copies = per_tensor & (ranks > 1)  # a group of one rank runs no collective, so copies nothing
        # one bucket layout for both: the first chunk cut into buckets only with overlap_grad_reduce and without
        # overlap_param_gather_with_optimizer_step (comm.dp_bucket, step.dp_optstep_gather)
        b_r = where(megatron, dp_step_calls(plan, params, bucketed), 1)
        b_g = b_r
        # grad_reduce_dtype bf16: each call's fp32 gradients cast to bf16 and copied back (comm.reduce_dtype); a
        # group of one rank runs no collective, so priced none
        cast_b = where(bf16_reduction(plan) & (ranks > 1),
                       REDUCE_CAST_PASSES * (plan.grad_bytes + plan.reduce_bytes) * params, 0.0)
        # grad_reduce_fp32_sum: Megatron-Core's reduce-scatter as an all-to-all of the same buffer, summed in fp32
        # on each rank (comm.fp32_sum); a group of one rank runs no collective
        a2a = fp32_sum_reduction(plan) & (ranks > 1)
        out += [Transfer("all-reduce", where(whole, b_r, 0), reduced_b / b_r, group, copy_bytes=cast_b / b_r),
                Transfer("reduce-scatter", where(a2a, 0, reduce_calls * b_r), reduced_b / u_r / b_r, group,
                         host_s=where(params > 0, host, 0.0),
                         copy_bytes=where(copies, ZERO3_REDUCE_COPIES * reduced_b / u_r, 0.0)),
                Transfer("all-gather", gather_calls * b_g, gathered_b / u_g / b_g, group,
                         host_s=where(params > 0, host, 0.0),
                         copy_bytes=where(copies, ZERO3_GATHER_COPIES * gathered_b / u_g, 0.0) + cast / u_g),
                Transfer("all-to-all", where(a2a, reduce_calls * b_r, 0), reduced_b / u_r / b_r, group,
                         copy_bytes=where(a2a, fp32_sum_copy_bytes(plan, reduced_b / u_r / b_r, ranks), 0.0))]
        cast = 0.0  # the dense gather only: torchao's Float8Linear weights (no routed expert)
    if dense_outer is not None and expert_outer is not None:
        out += hsdp_transfers(plan, rp.dense / plan.zero_shard, dense_outer, ur[0], whole,
                              kept.dense / plan.zero_shard) \
            + hsdp_transfers(plan, rp.expert / plan.expert_shard, expert_outer, ur[1], whole,
                             kept.expert / plan.expert_shard)
    return out


def hsdp_reduce_per_microbatch(plan: ParallelPlan) -> Any:
    """Whether hybrid sharding all-reduces the shard across the replicas in every micro-batch's backward (PyTorch
    FSDP2's HSDP, torchtitan's: ZeRO-2/3 sharded per micro-batch, without megatron_fsdp and dp_outer_optimizer)
    rather than once a step (Megatron-FSDP; Megatron-LM's partial distributed optimizer). Source: pytorch/pytorch
    002a76fbf torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py (FSDPParamGroup.all_reduce_grads True by
    default, foreach_reduce every post_backward). Derived: docs/formulas.md#step.hsdp_outer"""
    return plan.sharded_per_microbatch & np.logical_not(megatron_fsdp_acts(plan)) \
        & np.logical_not(plan.dp_outer_optimizer)


def hsdp_transfers(plan: ParallelPlan, shard: Any, outer: G, u: Any, whole: Any, kept: Any) -> list[Transfer[G]]:
    """Hybrid sharding's collectives across the dp_replicate replicas, once per step, on a rank's `shard`
    parameters (its shard group's share): the gradient shard all-reduced (Megatron-LM's partial distributed
    optimizer; Megatron-FSDP outer no_shard), or with the optimizer sharded across the
    replicas (dp_outer_optimizer) reduce-scattered and the updated shard all-gathered back, one call per
    ZeRO-3 unit (`u`) times outer_weight_copies (MXFP8's rowwise and columnwise copies under ZeRO-3); `kept` of
    the shard's parameters stay bf16 under fp8_params (kept_gather_extra_bytes). Source: NVIDIA/Megatron-LM
    megatron/core/distributed/param_and_grad_buffer.py,
    fsdp/src/megatron_fsdp/param_and_grad_buffer.py at 2a75ac12c (outer_fsdp_group all_reduce /
    reduce_scatter_tensor at the last micro-batch, the outer param all-gather). Derived: docs/formulas.md#mem.hsdp
    PyTorch FSDP2's HSDP (torchtitan: no megatron_fsdp, no dp_outer_optimizer, ZeRO-2/3 without a pipeline)
    all-reduces each unit's reduce-scattered shard across the replicas in every backward, so num_microbatches
    times a step, outside the once-a-step windows (Transfer.outer False). Source: pytorch/pytorch 002a76fbf
    torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py (post_backward -> foreach_reduce over
    _all_reduce_process_group while all_reduce_grads, True by default); pytorch/torchtitan 1fdf90d (0.3.0rc1)
    and v0.2.2 train_step never call set_requires_all_reduce / set_requires_gradient_sync between micro-batches.
    Derived: docs/formulas.md#step.hsdp_outer"""
    on = (plan.dp_replicate > 1) & np.logical_not(whole) & (shard > 0)
    outer_optim = plan.dp_outer_optimizer
    reduced_b, gathered_b = sync_bytes(plan, shard, kept)
    calls = where(on, u, 0)
    every_mb = hsdp_reduce_per_microbatch(plan)
    return [Transfer("all-reduce", where(outer_optim | every_mb, 0, calls), reduced_b / u, outer, outer=True),
            Transfer("all-reduce", where(every_mb, plan.num_microbatches * calls, 0), reduced_b / u, outer),
            Transfer("reduce-scatter", where(outer_optim, calls, 0), reduced_b / u, outer, outer=True),
            Transfer("all-gather", where(outer_optim, calls * outer_weight_copies(plan), 0), gathered_b / u, outer,
                     outer=True)]


REDUCE_CAST_PASSES = 2
"""HBM passes over a gradient element reduced in bf16 from fp32 (grad_reduce_dtype bf16), each a read of one
dtype and a write of the other: the cast to the bf16 copy before the all-reduce, the copy back into the fp32
gradient after it. Source: deepspeedai/DeepSpeed deepspeed/runtime/engine.py at 56c522386 (allreduce_bucket:
`tensor.to(self.communication_data_type)`, `tensor.copy_(tensor_to_allreduce)`). Derived:
docs/formulas.md#comm.reduce_dtype"""


def fp32_sum_copy_bytes(plan: ParallelPlan, message: Any, ranks: Any) -> Any:
    """HBM bytes of one call of Megatron-Core's reduce_scatter_with_fp32_accumulation around its all-to-all of
    `message` bytes (the whole bucket at grad_bytes an element) over `ranks`: the fp32 sum reads every received
    element and writes the rank's 1/ranks in fp32 (`torch.sum(view(world, -1), dim=0, dtype=torch.float32)`),
    then `output_tensor.copy_` reads that sum and writes it downcast. Source: NVIDIA/Megatron-LM d98e8a64dd
    megatron/core/distributed/reduce_scatter_with_fp32_accumulation.py
    (_ReduceScatterWithFP32AccumulationWorkHandle.wait). Derived: docs/formulas.md#comm.fp32_sum"""
    shard = message / plan.grad_bytes / maximum(ranks, 1)
    return message + shard * (2 * FP32_SUM_BYTES + plan.grad_bytes)


def reduce_wire_bytes(plan: ParallelPlan) -> Any:
    """Bytes a gradient element takes on the wire of the data-parallel reduction: reduce_bytes (2, the bf16 copy)
    where grad_reduce_dtype bf16 acts (cost.model_states.bf16_reduction, as settle shows the plan), else
    grad_bytes. The one rule sync_bytes and the cross-pool reduction of hetero replicas price.
    Derived: docs/formulas.md#comm.reduce_dtype"""
    return where(bf16_reduction(plan), plan.reduce_bytes, plan.grad_bytes)


def sync_bytes(plan: ParallelPlan, params: Any, kept: Any) -> tuple[Any, Any]:
    """(bytes reduced, bytes gathered) when a rank's gradients of `params` parameters are reduced (all-reduce or
    reduce-scatter) and their updated weights all-gathered, `kept` of them bf16 under fp8_params: the gradients
    at reduce_wire_bytes (grad_bytes, or 2 under grad_reduce_dtype bf16); the weights at param_gather_bytes, the
    kept ones 2 (kept_gather_extra_bytes more). The one split dp_transfers and hsdp_transfers price.
    Derived: docs/formulas.md#comm.dp, docs/formulas.md#comm.reduce_dtype,
    docs/formulas.md#mem.fp8_param_bf16_parts"""
    return (reduce_wire_bytes(plan) * params,
            param_gather_bytes(plan) * params + kept_gather_extra_bytes(plan) * kept)


STAGED_GATHER_BYTES = 2.0
"""Bytes a weight moves in Megatron-Core's distributed-optimizer gather of MXFP8 weights: the bf16 view of the
gradient buffer the fp32 master shard is copied into (param_gather_bytes)."""


def mxfp8_params(plan: ParallelPlan) -> Any:
    """Whether the plan keeps its weights in MXFP8 (fp8_params under the mxfp8 recipe)."""
    return plan.fp8_params & (plan.dtype == "fp8") & (plan.recipe == "mxfp8")


def megatron_fsdp_mxfp8_cast(plan: ParallelPlan) -> Any:
    """Whether Megatron-FSDP casts the updated fp32 master shards into the plan's MXFP8 weights after each
    optimizer step (mxfp8_params under plan.megatron_fsdp at ZeRO-3 without a pipeline, as exposure's
    megatron_fsdp_unit_share; check_plan's megatron_fsdp_fp8_params refuses fp8_params at its ZeRO-2):
    copy_main_weights_to_model_weights -> fp8_quantize -> Transformer Engine's cast_master_weights_to_fp8.
    ZeRO-3 on DeepSpeed or FSDP2 runs no such cast. Source: NVIDIA/Megatron-LM megatron/core/distributed/fsdp/
    src/megatron_fsdp/param_and_grad_buffer.py at cd4afffa6 (copy_main_weights_to_model_weights) and
    src/README.md ("Only FSDP / ZeRO-3 supports FP8 parameters"). Derived: docs/formulas.md#comm.mxfp8_amax"""
    return mxfp8_params(plan) & megatron_fsdp_acts(plan) & (plan.zero >= 3)


def mxfp8_staged_gather(plan: ParallelPlan) -> Any:
    """Whether the plan's ZeRO-1 weight gather stages MXFP8 weights through bf16 (param_gather_bytes)."""
    return mxfp8_params(plan) & (plan.zero == 1)


def param_gather_bytes(plan: ParallelPlan) -> Any:
    """Bytes a weight moves in the all-gather of the updated weights: the model copy's (weight_bytes), but for
    MXFP8 weights under the distributed optimizer (ZeRO-1, fp8_params, recipe mxfp8) 2: Megatron-Core maps no
    DDP parameter buffer onto MXFP8 parameters; a bucket holding any shares one buffer of the gradients' dtype
    for the gradient reduce-scatter and the weight gather, its bf16 view (the first half of an fp32 one) the
    gather's; the optimizer copies the fp32 master shard into it, the gather moves bf16, and the rank casts
    into its MXFP8 weights after it (mxfp8_param_unstage_seconds). Per-tensor and blockwise fp8 are cast on the
    shard into the uint8 parameter buffer (1 byte); NVFP4 gathers its packed rowwise bytes, 0.5 a weight, its
    block scales set on every rank by the cast's amax all-reduce; Megatron-FSDP (ZeRO-3) gathers the MXFP8
    data itself (outer_weight_copies). Source: NVIDIA/Megatron-LM megatron/core/distributed/
    param_and_grad_buffer.py at 0d8e0714cd .. 2a75ac12c (the pins of Megatron-Bridge v0.2.0 - 067f987d:
    _ParamAndGradBuffer, shared_buffer "for param AG and grad RS" when use_distributed_optimizer and any MXFP8
    param; nvfp4_packed_numel from d0b3b7754), optimizer/distrib_optimizer.py (_copy_main_params_to_param_buffer:
    "param buffer is not mapped to model params for MXFP8"). Derived: docs/formulas.md#comm.param_gather_bytes"""
    nvfp4 = plan.fp8_params & (plan.dtype == "fp4") & (plan.recipe == "nvfp4") & (plan.zero == 1)
    return where(mxfp8_staged_gather(plan), STAGED_GATHER_BYTES, where(nvfp4, 0.5, plan.weight_bytes))


def kept_gather_extra_bytes(plan: ParallelPlan) -> Any:
    """Bytes a bf16-kept parameter (model_states.bf16_kept_params: embedding, output layer, norms, routers, bf16
    layers) moves in the weight gather beyond param_gather_bytes under fp8_params: 2 - param_gather_bytes (0
    where MXFP8's staged gather already moves 2). Megatron-Core keys its parameter buffers by dtype, so these
    gather from their own bf16 buffer. Source: NVIDIA/Megatron-LM megatron/core/distributed/
    param_and_grad_buffer.py at 2a75ac12c (group_params_for_buffers: one buffer per (param_dtype, grad_dtype),
    uint8 for FP8 / NVFP4 parameters, else param.dtype). Derived: docs/formulas.md#mem.fp8_param_bf16_parts"""
    return where(plan.fp8_params and plan.low_precision, 2.0 - param_gather_bytes(plan), 0.0)


def outer_weight_copies(plan: ParallelPlan) -> Any:
    """Copies of the weight shard hybrid sharding gathers across the replicas each step: 2 where ZeRO-3 gathers
    MXFP8 weights (fp8_params, recipe mxfp8), whose forward reads the rowwise copy and whose backward the
    columnwise one, each gathered across the replicas in the step's first micro-batch; else 1.
    Source: NVIDIA/Megatron-LM megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py at 2a75ac12c
    (all_gather_and_wait_parameters_ready: outer_fsdp_group_param_gather while microbatch_count == 0, forward
    and backward with bwd=True) and param_and_grad_buffer.py (AllGatherPipeline.get_fsdp_buffer: the
    hfsdp_helper_wtbuf transpose buffer for bwd). Derived: docs/formulas.md#mem.hsdp"""
    return where(plan.gathered_per_microbatch & mxfp8_params(plan), 2, 1)


MXFP8_AMAX_BYTES = 2 * 4 / 32
"""Bytes a weight element adds to the all-reduce that sets its MXFP8 block scales after an optimizer step: one
fp32 amax (the master weights' dtype) per 32-element block, rowwise and columnwise. Source: NVIDIA/
TransformerEngine transformer_engine/pytorch/tensor/utils.py, _cast_master_weights_to_fp8_mxfp8_scaling (v2.11 -
v2.17.1): packed_amaxes over every weight's rowwise and columnwise scale_inv, all_reduce(MAX) over the group."""


def mxfp8_amax_transfers(m: ModelSpec, plan: ParallelPlan, dense_groups: tuple[G, G], expert_groups: tuple[G, G],
                         stage: Any = 0) -> list[Transfer[G]]:
    """Megatron-FSDP with MXFP8 weights (megatron_fsdp_mxfp8_cast): after each optimizer step the fp32
    master shards are cast into the MXFP8 weights and the block amaxes of every MXFP8 weight the rank holds
    (model_states.low_precision_params: its layers' linear weights, dense and expert) are all-reduced over the group
    the master weights are sharded across: (whole group, partial group) of each pair, the whole one with
    dp_outer_optimizer (HFSDP's DP-Outer x DP-Shard group). Once a step, synchronous: exposed whole.
    Source: NVIDIA/Megatron-LM megatron/core/distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py at
    2a75ac12c (copy_main_weights_to_model_weights: fp8_quantize over mbuf.data_parallel_group, the
    get_dp_group of the main weight buffer), mixed_precision.py (fp8_quantize: TE cast_master_weights_to_fp8);
    MXFP8_AMAX_BYTES. Derived: docs/formulas.md#comm.mxfp8_amax"""
    low = low_precision_params(m, plan, stage)  # the stepped rank's (both paired stages' under DualPipe)
    on = megatron_fsdp_mxfp8_cast(plan)
    whole = where(on & plan.dp_outer_optimizer, 1, 0)
    part = where(on & np.logical_not(plan.dp_outer_optimizer), 1, 0)
    out: list[Transfer[G]] = []
    for params, (full, inner) in ((low.dense, dense_groups), (low.expert, expert_groups)):
        message = MXFP8_AMAX_BYTES * params
        out += [Transfer("all-reduce", whole, message, full, step_end=True),
                Transfer("all-reduce", part, message, inner, step_end=True)]
    return out


TORCHAO_FP8_GATHER_CAST_BYTES = (4.0 + 4.0) + (4.0 + 4.0) + (4.0 + 1.0)
"""HBM bytes per element of the fp32 weight shard that torchao casts to float8 before each FSDP2 all-gather
(torchtitan enable_fsdp_float8_all_gather with precompute_float8_dynamic_scale_for_fsdp, the scale known):
hp_tensor_and_scale_to_float8 on FSDP2's sharded fp32 parameter, `* scale` (read 4, write 4), to_fp8_saturated's
clamp (4, 4) and `.to(float8)` (4, 1); `.to(torch.float32)` of an fp32 tensor returns it uncopied. Eager: FSDP2
calls fsdp_pre_all_gather from its pre-forward / pre-backward hooks, which dynamo skips (skip_fsdp_hooks, default
True), and torchtitan compiles each block before fully_shard. Source: pytorch/ao@36027d82d1
torchao/float8/fsdp_utils.py (WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather), float8_training_tensor.py
(_ToFloat8ConstrFunc.forward), float8_utils.py (to_fp8_saturated); pytorch/pytorch
torch/distributed/fsdp/_fully_shard/_fsdp_param.py @010ae4a (all_gather_inputs: the extension gets
_sharded_local_tensor, not the param_dtype copy), torch/_dynamo/config.py (skip_fsdp_hooks = True).
Derived: docs/formulas.md#comm.torchao_fp8_gather"""

TORCHAO_AMAX_READ_BYTES = 4.0
"""HBM bytes per fp32 shard element of precompute_float8_dynamic_scale_for_fsdp's amax (torch._foreach_norm, inf
norm, over every float8 weight shard) once a step after the optimizer step. Source: pytorch/ao@36027d82d1
torchao/float8/fsdp_utils.py (precompute_float8_dynamic_scale_for_fsdp).
Derived: docs/formulas.md#comm.torchao_fp8_gather"""


def torchao_fp8_gather(plan: ParallelPlan) -> Any:
    """Whether FSDP2 gathers torchao's Float8Linear weights in float8 (fp8_params read as torchtitan's
    enable_fsdp_float8_all_gather): torchao_float8, the weights sharded (zero >= 2) over more than one rank
    (torchtitan: dp_shard_enabled and enable_fsdp_float8_all_gather).
    Derived: docs/formulas.md#comm.torchao_fp8_gather"""
    return torchao_fp8_params(plan) & (plan.zero >= 2) & (plan.zero_shard > 1)


def torchao_fp8_gather_cast_bytes(m: ModelSpec, plan: ParallelPlan, stage: Any = 0) -> Any:
    """HBM bytes, per gather of a rank's whole shard, of torchao's casts of its Float8Linear weight shards to
    float8 before FSDP2's all-gather (TORCHAO_FP8_GATHER_CAST_BYTES a shard element: the dense low-precision
    weights of the rank, low_precision_params, over the zero_shard ranks), serial with the gather on its copy-in
    stream (Transfer.copy_bytes; dp_transfers divides it over the gather's units); 0 off torchao_fp8_gather.
    Derived: docs/formulas.md#comm.torchao_fp8_gather"""
    shard = low_precision_params(m, plan, stage).dense / plan.zero_shard
    return where(torchao_fp8_gather(plan), TORCHAO_FP8_GATHER_CAST_BYTES * shard, 0.0)


def torchao_amax_transfers(m: ModelSpec, plan: ParallelPlan, group: G, stage: Any = 0) -> list[Transfer[G]]:
    """torchtitan's precompute_float8_dynamic_scale_for_fsdp under torchao_fp8_gather, once a step after the
    optimizer step, exposed whole (step_end): the inf-norm of every Float8Linear weight shard of the rank
    (TORCHAO_AMAX_READ_BYTES a shard element, as the call's copy_bytes) and one all-reduce of one fp32 amax per
    Float8Linear (attention 4, the dense MLP or shared expert 3 gated / 2) over the shard group. The TP group's
    share of the DTensor reduction is not priced. Source: pytorch/ao@36027d82d1 torchao/float8/fsdp_utils.py
    (precompute_float8_dynamic_scale_for_fsdp: torch._foreach_norm, torch.clamp "will issue a single
    all-reduce"); pytorch/torchtitan v0.2.2 components/quantization/float8.py (post_optimizer_hook).
    Derived: docs/formulas.md#comm.torchao_fp8_gather"""
    on = torchao_fp8_gather(plan)
    dense, moe = stage_weight_layers(m, plan, stage)
    mlp = 3 if m.gated_mlp else 2
    linears = dense * (4 + mlp) + moe * (4 + (mlp if m.shared_ffn else 0))
    read = TORCHAO_AMAX_READ_BYTES * low_precision_params(m, plan, stage).dense / plan.zero_shard
    return [Transfer("all-reduce", where(on, 1, 0), 4.0 * linears, group, copy_bytes=where(on, read, 0.0),
                     step_end=True)]


def first_chunk_bucketed(plan: ParallelPlan) -> Any:
    """Elementwise: the first model chunk's DP sync is cut into buckets (dp_step_calls' `overlapped`), i.e. not
    quantities.dp_first_chunk_unbucketed: the gradient-reduce overlap on and overlap_param_gather_with_optimizer_step
    not acting. With that switch off for every plan (param_gather_optstep plain False), the overlap as given,
    without building an all-False array. Derived: docs/formulas.md#comm.dp_bucket"""
    if param_gather_optstep(plan) is False:
        return as_bool(plan.overlap_grad_reduce)
    return np.logical_not(dp_first_chunk_unbucketed(plan))


def dp_step_calls(plan: ParallelPlan, params: Any, overlapped: Any) -> Any:
    """NCCL calls that one step's gradient reduction (or weight gather) of the first stage's `params` splits into,
    each paying its ring's latency: Megatron-Core's DDP issues one collective per bucket and model chunk, the
    gather over the same buckets as the reduction (start_param_sync: one all-gather per bucket group, whether or
    not overlap_param_gather is on). With `overlapped` (the gradient-reduce overlap on and the first chunk
    bucketed: not quantities.dp_first_chunk_unbucketed), the first model chunk of the first pipeline stage is cut
    into buckets of max(40M, 1M x dp·cp) parameters (exposure.bucket_params) and each later chunk is one bucket;
    without it, one per chunk. Source: Megatron-LM 14346b65a
    megatron/core/distributed/param_and_grad_buffer.py (_ParamAndGradBucketGroup.start_param_sync, partition_buckets);
    Megatron-LM megatron/training/training.py (get_model: bucket_size = max(40000000, 1000000 x dp) "to ensure
    that chunks used in NCCL ring-reduce implementations are large enough to remain bandwidth-bound rather than
    latency-bound", None without overlap_grad_reduce; disable_bucketing for model chunks after the first),
    megatron/core/distributed/distributed_data_parallel.py (no bucketing past pipeline stage 0).
    Derived: docs/formulas.md#comm.dp_bucket"""
    v = plan.vpp
    first = where(overlapped, np.ceil(params / v / bucket_params(plan)), 1)
    return maximum(first, 1) + (v - 1)


def zero3_host_seconds(plan: ParallelPlan) -> Any:
    """Host seconds of one per-tensor ZeRO-3 collective (plan.zero3_unit tensor) that the GPU waits for, per
    rank of the dp x cp group: DeepSpeed's Python loop takes one narrow view of the flat buffer per rank
    (an eager op's host time less its launch, EAGER_OP_HOST_S - KERNEL_LAUNCH_S: a view launches nothing), and
    PyTorch's NCCL process group copies each rank's slice between that list and its flat buffer (one copy
    launch, KERNEL_LAUNCH_S). DeepSpeed's stage 3 of 2021 synchronises the device before each gather and after
    each fetch, so the host never runs ahead and the GPU waits these out. FSDP's flat buffers (zero3_unit
    layer): none. Source: microsoft/DeepSpeed v0.3.13 runtime/zero/partition_parameters.py (_allgather_param,
    _reduce_scatter_gradient: torch.cuda.synchronize, `for i in range(self.world_size)` narrow), stage3.py
    (_synchronize_communication); pytorch/pytorch torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (allgather:
    "Copy the flattened output tensors to the outputs"; reduce_scatter: flatten_for_scatter_gather).
    Derived: docs/formulas.md#comm.zero3_unit"""
    ranks = plan.dp * plan.cp
    per_rank = (EAGER_OP_HOST_S - KERNEL_LAUNCH_S) + KERNEL_LAUNCH_S
    return where((plan.zero3_unit == "tensor") & (ranks > 1), ranks * per_rank, 0.0)


ZERO3_GATHER_COPIES, ZERO3_REDUCE_COPIES = 3, 4
"""HBM bytes per byte of the buffer that one per-tensor ZeRO-3 call of DeepSpeed's stage 3 of 2021
(zero3_unit tensor) moves on the GPU around its NCCL kernel, serial with it. All-gather: DeepSpeed zero-fills the
gathered buffer (torch.zeros, 1 write) and PyTorch's list all-gather gathers into a flat buffer of its own and
copies each rank's slice back into the list (1 read, 1 write). Reduce-scatter: DeepSpeed divides the gradient by
the group size in place (average_tensor: div_, 1 read, 1 write) and PyTorch's list reduce-scatter copies the
inputs into a flat buffer (1 read, 1 write). Source: microsoft/DeepSpeed v0.3.13 runtime/zero/
partition_parameters.py (_allgather_param, _reduce_scatter_gradient), stage3.py (average_tensor); pytorch/pytorch
v1.8.0 torch/lib/c10d/ProcessGroupNCCL.cpp (allgather: "Copy the flattened output tensors to the outputs";
reduce_scatter: flatten_for_scatter_gather); DeepSpeed #1453 (4912e0ad7) replaced both with the *_base
collectives "to reduce memory allocations and data movement". Derived: docs/formulas.md#comm.zero3_unit"""


ZERO3_TENSORS_PER_LAYER = 4
"""Weight tensors of a transformer layer that ZeRO-3 gathers one at a time (zero3_unit tensor): Megatron-LM's
fused query_key_value, the attention output dense, dense_h_to_4h and dense_4h_to_h; biases and norms (under
100k elements) stay gathered (DeepSpeed stage3_param_persistence_threshold, default 100000 in 2021:
deepspeed/runtime/zero/constants.py at v0.3.13)."""


def zero3_units(m: ModelSpec, plan: ParallelPlan, stage: Any = 0) -> tuple[Any, Any]:
    """(dense, expert) collectives one ZeRO-3 gather (or per-micro-batch gradient reduction) of a rank of pipeline
    stage `stage` splits into, each its own NCCL call with its own ring latency (topology.collectives.nccl_ring).
    Per tensor (plan.zero3_unit tensor, ZeRO-3): ZERO3_TENSORS_PER_LAYER per layer plus the input and output
    embeddings. Per layer (FSDP units; ZeRO-2's per-micro-batch reduction whatever the unit): one call per unit
    and parameter group, the stage's layers (an MTP module counted as a layer, stage_weight_layers) plus the root
    unit (embedding, final norm, output layer) over the dense group, and one per MoE layer over the expert group:
    Megatron-FSDP groups a unit's buckets by (unit, expert or not) and coalesces each group into one all-gather /
    reduce-scatter on its own data-parallel group; FSDP2 runs one per fully_shard module. DeepSpeed's ZeRO-2/3
    reduce in reduce_bucket_size buckets instead (stage_1_and_2.py average_tensor), not by unit: priced by unit
    here too, a known difference (docs/formulas.md#comm.zero3_unit).
    Source: microsoft/DeepSpeed v0.3.13 runtime/zero/partition_parameters.py
    (_allgather_param and _reduce_scatter_gradient: one torch.distributed call per parameter); NVIDIA/Megatron-LM
    d98e8a64dd megatron/core/distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py
    (_get_parameter_groups: bucket_group_map keyed (fsdp_unit_id, is_expert_param); AllGatherPipeline.
    all_gather_params and GradReducePipeline._bucket_group_gradient_reduce: one _coalescing_manager per bucket
    group); Zhao et al. 2023 (PyTorch FSDP) §3.2. Derived: docs/formulas.md#comm.zero3_unit"""
    dense, moe = stage_weight_layers(m, plan, stage)
    tensor = (plan.zero3_unit == "tensor") & (plan.zero == 3)  # the unit acts at ZeRO-3 only (zero3_unit_zero)
    per_tensor = ZERO3_TENSORS_PER_LAYER * m.num_hidden_layers + 2
    return where(tensor, per_tensor, dense + moe + 1), where(tensor, per_tensor, maximum(moe, 1))


def cp_transfers(m: ModelSpec, plan: ParallelPlan, group: G, a2a_group: G | None = None,
                 ring_group: G | None = None) -> list[Transfer[G]]:
    """Ring attention: per softmax-attention layer and micro-batch, each rank passes its K/V chunk cp-1 times
    forward and K/V plus their gradients backward (3(cp-1) sends; 4(cp-1) when the attention core's forward runs
    again: full recompute, or selective recompute of core_attn, attention_rerun_share). A hybrid's stage holds
    max_stage_layers x attention_share ring layers (its average composition); its Mamba-2 and linear-attention
    layers trade the sequence split for a head split instead (cp_mixer_transfers). PyTorch's ring
    (cp_impl torch-*) rings the K/V its SDPA call gets (cp_kv_repeated: the query heads), gathers them
    in one all-gather per pass (torch-allgather; torch-alltoall: cp-1 sends per pass) and passes the K/V
    gradients on in fp32 after each of its cp steps, the last one's back to their owner. Transformer Engine's
    hierarchical a2a+p2p (a2a_group: its inner level, ring_group: its ring; both `group` where not given)
    is te_cp_hierarchical.
    Source: Liu et al. 2023 (Ring Attention); Megatron-LM context parallelism; pytorch/pytorch
    torch/distributed/tensor/experimental/_attention.py (_templated_ring_attention[_backward], _AllGatherRotater,
    set_rotate_method: #142093); pytorch/torchtitan torchtitan/models/llama/model.py at 9dec370 (repeat_kv before
    F.scaled_dot_product_attention). Derived: docs/formulas.md#comm.cp"""
    s, b, t, cp = plan.seq_len / plan.cp, plan.micro_batch, plan.tp, plan.cp
    torch = plan.cp_impl != "te"  # a workload switch: one value for all plans of a search
    if (mla := m.mla) is not None:
        kv_width = m.num_attention_heads / t * (mla.qk_head_dim + mla.v_head_dim)
    else:  # PyTorch's ring moves the heads the SDPA call gets: the query heads after the model's repeat_kv
        heads = m.num_attention_heads / t if torch and plan.cp_kv_repeated else kv_heads_per_rank(m, t)
        kv_width = 2 * heads * m.d_head
    S = ACT_BYTES * s * b * kv_width
    stage = max_stage_layers(m, plan)  # the stage that holds the most layers sets the pace
    layers = stage * attention_share(m)  # its softmax-attention layers ring the K/V
    r = attention_rerun_share(plan, stage)
    mixers = cp_mixer_transfers(m, plan, group)
    if not torch and plan.cp_comm_type == "a2a+p2p":  # a workload switch, as cp_impl
        return te_cp_hierarchical(m, plan, a2a_group or group, ring_group or group, plan.num_microbatches * layers,
                                  r, S) + mixers
    if not torch and plan.cp_comm_type != "p2p":
        return te_cp_collectives(m, plan, group, plan.num_microbatches * layers, r) + mixers
    if not torch:
        return [Transfer("send-recv", plan.num_microbatches * layers * (3 + r) * (cp - 1), S, group)] + mixers
    calls = plan.num_microbatches * layers
    grads = Transfer("send-recv", calls * cp, GRAD_RING_BYTES / ACT_BYTES * S, group)
    if plan.cp_impl == "torch-allgather":  # the whole gathered buffer (nccl-tests convention)
        return [Transfer("all-gather", calls * (2 + r), cp * S, group), grads] + mixers
    return [Transfer("send-recv", calls * (2 + r) * (cp - 1), S, group), grads] + mixers


def te_cp_collectives(m: ModelSpec, plan: ParallelPlan, group: G, calls: Any, r: Any,
                      kind: str | None = None) -> list[Transfer[G]]:
    """Transformer Engine's a2a and all_gather context parallelism (cp_comm_type), for `calls` softmax-attention
    layer passes (micro-batches x layers) with `r` of them recomputed. a2a (Ulysses): per forward pass one
    all-to-all each of Q, K, V before the attention and one of its output after; backward one of the output's
    gradient and one each of dQ, dK, dV: 4 calls per pass, (2 + r) passes, each moving the rank's s/cp tokens of
    one tensor's heads on its TP rank (the whole buffer, nccl-tests convention); `kind` a2a prices them for the
    a2a level of a2a+p2p (te_cp_hierarchical). all_gather: K and V gathered
    separately in forward and again in backward (the forward keeps only the rank's chunk), dK and dV
    reduce-scattered in bf16 once: 2(2 + r) all-gathers and 2 reduce-scatters of cp chunks. MLA's K and V run
    at the query heads. Widths: q and k qk_head_dim (d_head), v and the output v_head_dim (d_head).
    Source: NVIDIA/TransformerEngine@d0067d0 transformer_engine/pytorch/attention/dot_product_attention/
    context_parallel.py (AttnFuncWithCPAndQKVOA2A: flash_attn_a2a_communicate of [q, k, v], [out], [dout],
    [dq, dk, dv], one all_to_all_single each; AttnFuncWithCPAndKVAllGather: gather_along_first_dim of k and v in
    forward and backward, reduce_scatter_along_first_dim of dk and dv). Derived: docs/formulas.md#comm.cp_a2a,
    docs/formulas.md#comm.cp_allgather"""
    t, cp = plan.tp, plan.cp
    tokens = ACT_BYTES * plan.seq_len / cp * plan.micro_batch
    if (mla := m.mla) is not None:
        heads_q = heads_kv = m.num_attention_heads / t
        dqk, dv = mla.qk_head_dim, mla.v_head_dim
    else:
        heads_q, heads_kv, dqk, dv = m.num_attention_heads / t, kv_heads_per_rank(m, t), m.d_head, m.d_head
    k, v = tokens * heads_kv * dqk, tokens * heads_kv * dv
    live = where(cp > 1, calls, 0)
    if (kind or plan.cp_comm_type) == "a2a":
        qo = tokens * heads_q * (dqk + dv) / 2  # q and the output, the mean of the two
        return [Transfer("all-to-all", 2 * live * (2 + r), qo, group, te_cp=True),
                Transfer("all-to-all", 2 * live * (2 + r), (k + v) / 2, group, te_cp=True)]
    return [Transfer("all-gather", 2 * live * (2 + r), cp * (k + v) / 2, group, te_cp=True),
            Transfer("reduce-scatter", 2 * live, cp * (k + v) / 2, group, te_cp=True)]


def te_cp_hierarchical(m: ModelSpec, plan: ParallelPlan, a2a_group: G, ring_group: G, calls: Any, r: Any,
                       chunk: Any) -> list[Transfer[G]]:
    """Transformer Engine's hierarchical a2a+p2p context parallelism, for `calls` softmax-attention layer passes
    with `r` of them recomputed: the a2a level's all-to-alls of Q, K, V, the output and their gradients over
    the cp_a2a_group ranks of `a2a_group` (te_cp_collectives' a2a calls and messages: each rank's s/cp tokens of
    its TP rank's heads), then the p2p ring over the cp_ring_size ranks of `ring_group`, (3 + r)(ring - 1) sends
    a pass as the plain ring's. After the all-to-all a rank holds s/ring tokens of heads/cp_a2a heads, so one
    ring step moves `chunk` bytes, the plain ring's K/V chunk at cp ranks (cp_transfers' S).
    Source: NVIDIA/TransformerEngine@d0067d0 transformer_engine/pytorch/attention/dot_product_attention/
    context_parallel.py (AttnFuncWithCPAndKVP2P.forward: cp_group = [cp_group_a2a, cp_group], flash_attn_a2a_
    communicate of [q, k, v] before the ring and of out after it; backward: of dout before, of [dq, dk, dv]
    after). Derived: docs/formulas.md#comm.cp_hierarchical"""
    k, ring = cp_a2a_group(plan), cp_ring_size(plan)
    a2a = te_cp_collectives(m, plan, a2a_group, calls, r, kind="a2a")
    sends = Transfer("send-recv", where(plan.cp > 1, calls * (3 + r) * (ring - 1), 0), chunk, ring_group)
    return [Transfer(x.collective, where(k > 1, x.calls, 0), x.message, x.group, te_cp=True) for x in a2a] + [sends]


def cp_mixer_transfers(m: ModelSpec, plan: ParallelPlan, group: G) -> list[Transfer[G]]:
    """A hybrid's recurrent layers under context parallelism: an all-to-all per tensor turns each rank's
    s/cp tokens of every head into all s tokens of 1/cp of the heads before the convolution and scan, and one
    turns the output back; each all-to-all's backward is the reverse all-to-all of its gradient, and full
    recompute runs the forward's again (recomputed_share): (2 + r) passes. Per rank, one call moves
    s/cp·b·width bf16 elements (the rank's whole buffer, nccl-tests convention). Mamba-2: z and x (HP/t each),
    B and C (max(G/t, cp)·N each: groups repeated when fewer than cp), dt (H/t) before, y (HP/t) after: six
    calls a pass. Gated DeltaNet: one call of its whole in_proj output (2 H_k d_k + 2 H_v d_v + 2 H_v)/t before,
    one of the gated norm's output (H_v d_v/t) after; lightning attention, which Megatron-Core lacks, is priced
    as that head split of its q, k, v and gate (H(2 d_k + 2 d_v)/t) and output (H d_v/t). The all-to-alls run
    in line on the compute stream (all_to_all_single, not async): exposed whole (cp_mixer_split).
    Source: NVIDIA/Megatron-LM at d98e8a64dd, megatron/core/ssm/mamba_context_parallel.py (pre_conv_ssm,
    post_conv_ssm), megatron/core/ssm/gated_delta_net/common.py (a2a_cp_to_hp, a2a_hp_to_cp),
    megatron/core/tensor_parallel/mappings.py (_AllToAll). Derived: docs/formulas.md#comm.cp_mixers"""
    stage, t, cp = max_stage_layers(m, plan), plan.tp, plan.cp
    per_layer = where(cp > 1, plan.num_microbatches * stage * (2 + recomputed_share(plan, stage)), 0) \
        / m.num_hidden_layers  # a layer of each kind: the stage's layers x the kind's share
    tokens = ACT_BYTES * plan.seq_len / cp * plan.micro_batch
    H, P, N, G = m.mamba_num_heads or 0, m.mamba_head_dim or 0, m.ssm_state_size or 0, m.n_groups or 0
    Hv, dv = m.linear_num_value_heads or 0, m.linear_value_head_dim or 0
    width_in = Hv * (2 * (m.linear_key_head_dim or 0) + 2 * dv) if lightning(m) else \
        2 * (m.linear_num_key_heads or 0) * (m.linear_key_head_dim or 0) + 2 * Hv * dv + 2 * Hv
    mamba, linear = m.count_layers("mamba") * per_layer, m.count_layers("linear_attention") * per_layer
    out = [Transfer("all-to-all", 3 * mamba, tokens * H * P / t, group),  # z, x; y
           Transfer("all-to-all", 2 * mamba, tokens * maximum(G / t, cp) * N, group),  # B, C
           Transfer("all-to-all", mamba, tokens * H / t, group)] if m.count_layers("mamba") else []
    if m.count_layers("linear_attention"):
        out += [Transfer("all-to-all", linear, tokens * width_in / t, group),
                Transfer("all-to-all", linear, tokens * Hv * dv / t, group)]
    return out


def cp_mixer_split(transfers: Any) -> tuple[list[Any], list[Any]]:
    """(the other transfers, the recurrent mixers' all-to-alls: cp_mixer_transfers) of the cp axis, the split
    CommSeconds.cp_mixers is timed by on the scalar and vectorised paths. Transformer Engine's a2a and
    all_gather collectives (te_cp_collectives, Transfer.te_cp) land in the first list and in te_cp_split; they
    are exposed whole as the mixers' are (exposure.cp_exposed). Derived: docs/formulas.md#comm.cp_mixers"""
    mixer = [x.collective == "all-to-all" and not x.te_cp for x in transfers]
    return [x for x, y in zip(transfers, mixer) if not y], [x for x, y in zip(transfers, mixer) if y]


def te_cp_split(transfers: Any) -> tuple[list[Any], list[Any]]:
    """(Transformer Engine's a2a all-to-alls, its all_gather K/V all-gathers and dK/dV reduce-scatters) among
    the cp axis's transfers (Transfer.te_cp): CommSeconds.cp_a2a and cp_allgather, scalar and vectorised.
    Derived: docs/formulas.md#comm.cp_a2a, docs/formulas.md#comm.cp_allgather"""
    te = [x for x in transfers if x.te_cp]
    return [x for x in te if x.collective == "all-to-all"], [x for x in te if x.collective != "all-to-all"]


def ep_transfers(m: ModelSpec, plan: ParallelPlan, group: G, flex_group: G | None = None) -> list[Transfer[G]]:
    """Per MoE layer and micro-batch: dispatch and combine all-to-alls of the rank's T tokens, each sent as
    dispatch_rows(m, plan) rows, in forward and in backward (and again under full recompute, or when the
    selective recompute_modules hold "moe": Megatron-LM checkpoints the MoE layer's whole forward, router,
    dispatch, experts and combine, moe_layer.py moe_layer_recompute), sized for the most-loaded rank
    (cost.moe.routing_imbalance); rows of the expert width (a latent MoE's moe_latent_size: Megatron-LM projects
    before dispatch and after combine, moe_layer.py). With ep_dispatch_fp8 each dispatch (forward, recomputed
    forward, and backward: the gradient into the down-projection, DeepSeek-V3 §3.3.3) sends FP8_DISPATCH_BYTES
    per element, each combine bf16. The alltoall dispatcher sends the k routing probabilities of each token in a
    second all-to-all right after its tokens (one ROUTER_PROB_BYTES value a row, same splits), whose backward
    returns their gradient: 2 calls a layer and micro-batch and once more per recomputed forward; DeepEP and
    HybridEP carry them inside the dispatch (topk_weights / probs) and combine backward. The alltoall
    dispatcher's calls run over the EP group (`group`), the flex dispatcher's over expert TP x EP (`flex_group`,
    default `group`), one transfer per expert-TP degree among the plans (flex_copies: Dispatch.copies).
    Counted on the candidate stage with the most MoE layers (most_moe_layers). Source: NVIDIA/Megatron-LM at
    d98e8a64dd (and core_v0.15.0), megatron/core/transformer/moe/token_dispatcher.py
    (MoEAlltoAllTokenDispatcher.token_dispatch: all_to_all of permutated_local_input_tokens, then of
    permuted_probs, over self.ep_group; MoEFlexTokenDispatcher: group=self.tp_ep_group),
    tensor_parallel/mappings.py (_AllToAll.backward: the reverse all_to_all), moe/fused_a2a.py (FusedDispatch:
    buffer.dispatch(topk_weights=...); HybridEPDispatch: dispatch_with_permute(probs=...)). Derived:
    docs/formulas.md#comm.ep, docs/formulas.md#comm.ep_fp8, docs/formulas.md#comm.ep_probs,
    docs/formulas.md#comm.ep_stage, docs/formulas.md#comm.etp_flex"""
    if not m.is_moe:
        return []
    s, b, h = plan.seq_len / plan.cp, plan.micro_batch, m.expert_width  # a latent MoE moves latent-width rows
    tokens = s * b / where(plan.sp, plan.tp, 1)
    # The all-to-all waits on the most-loaded rank's rows (routing_imbalance; capacity padding: the factor)
    # and under moe_router_padding with the alltoall dispatcher the padded rows (moe.router_padding; DeepEP pads
    # after the dispatch)
    padded = where(plan.moe_dispatcher == "alltoall", router_padding_share(m, plan), 0.0)
    S = ACT_BYTES * tokens * dispatch_rows(m, plan) * h * (routing_imbalance(m, plan) + padded) * flex_copies(plan)
    # the rank with the most MoE layers, as step_time's moe_max (Derived: docs/formulas.md#comm.ep_stage)
    dense_layers, moe_layers = most_moe_layers(m, plan, candidate_stages(m, plan))
    again = maximum(recomputed_share(plan, dense_layers + moe_layers), where(plan.recomputes("moe"), 1.0, 0.0))
    per_layer = 4 + 2 * again
    calls = plan.num_microbatches * moe_layers
    if plan.moe_dispatcher != "deepep":  # a workload switch: one value for all plans of a search
        # the alltoall dispatcher's own call for the routing probabilities (comm.ep_probs)
        probs = ROUTER_PROB_BYTES * tokens * dispatch_rows(m, plan) * routing_imbalance(m, plan)
        return a2a_calls(calls * per_layer, S, group, None, plan.ep_dispatch_fp8) \
            + [Transfer("all-to-all", calls * (2 + again), probs, group)]
    flex = group if flex_group is None else flex_group
    deepep = Dispatch(m.num_experts, m.num_experts_per_tok, plan.moe_routing, expert_groups(m),
                      dispatch_sms(plan), plan.moe_flex_backend, h)
    out: list[Transfer[G]] = []
    for etp, share in etp_degrees(plan):  # each expert-TP degree's plans: their Dispatch.copies
        out += a2a_calls(share * calls * per_layer, S, flex, replace(deepep, copies=etp), plan.ep_dispatch_fp8)
    if deepep.backend == "hybridep":  # a workload switch, as above
        out.append(Transfer("all-gather", plan.num_microbatches * moe_layers * (1 + again),
                            routing_map_bytes(m, plan, tokens) * flex_copies(plan) ** 2, flex))
    return out


def a2a_calls(calls: Any, S: Any, group: G, d: Dispatch | None, fp8: bool) -> list[Transfer[G]]:
    """`calls` dispatch and combine all-to-alls of S bytes (bf16 rows); with ep_dispatch_fp8 (a workload switch)
    the dispatches, half the calls, move FP8_DISPATCH_BYTES an element, the combines bf16 (the probs stay fp32).
    Derived: docs/formulas.md#comm.ep_fp8"""
    if not fp8:
        return [Transfer("all-to-all", calls, S, group, d)]
    low = None if d is None else replace(d, elem_bytes=FP8_DISPATCH_BYTES)
    return [Transfer("all-to-all", calls / 2, S * FP8_DISPATCH_BYTES / ACT_BYTES, group, low),
            Transfer("all-to-all", calls / 2, S, group, d)]


def etp_degrees(plan: ParallelPlan) -> list[tuple[int, Any]]:
    """(expert-TP degree, 1 where a plan has it and 0 elsewhere) for each distinct degree among plan arrays; one
    pair (its degree, 1) for one plan: what the flex dispatcher's transfers split by (Dispatch.copies)."""
    etp = np.asarray(plan.etp_resolved)
    if etp.ndim == 0:
        return [(int(etp), 1.0)]
    return [(int(e), (etp == e).astype(float)) for e in np.unique(etp)]


def flex_copies(plan: ParallelPlan) -> Any:
    """Copies of each dispatched row in the flex dispatcher's (deepep: DeepEP, HybridEP) dispatch and combine:
    expert TP's degree. It dispatches over the expert-TP x EP group (tp_ep_group), the routing map expanded
    over the expert-TP ranks (each of an EP rank's etp ranks receives the token; tp_size x E experts, top
    tp_size x k), and each combine returns the etp partial outputs; no TP gather (tp_routed_blocks_per_layer).
    HybridEP's gathered routing map grows by etp twice (etp x E columns, etp x ep ranks). 1 for the alltoall
    dispatcher (its expert-TP gather is routed_pair_transfers'). Across NVLink domains only NVLink carries the
    copies: DeepEP and HybridEP send a token once to each node over the network and fan it out there over
    NVLink (a2a_shares with Dispatch.copies, on the expert-TP x EP group's span). Source: NVIDIA/Megatron-LM
    d98e8a6 megatron/core/transformer/moe/token_dispatcher.py (MoEFlexTokenDispatcher.__init__:
    group=self.tp_ep_group, router_topk=self.tp_size * moe_router_topk, num_experts=self.tp_size *
    num_moe_experts; _initialize_metadata). Derived: docs/formulas.md#comm.etp_pair,
    docs/formulas.md#comm.etp_flex"""
    return plan.etp_resolved if plan.moe_dispatcher == "deepep" else 1  # a workload switch: one for a search


TOKEN_COUNT_BYTES = 8
"""Bytes of one expert's token count in the auxiliary loss's all-reduce: routing_map.sum(dim=0) over the bool map
is int64 (torch.sum promotes bool and integer tensors to int64). Source: NVIDIA/Megatron-LM at d98e8a6,
megatron/core/transformer/moe/moe_utils.py (get_tokens_per_expert_and_token_count)."""


def aux_loss_transfers(m: ModelSpec, plan: ParallelPlan, group: G, global_group: G) -> list[Transfer[G]]:
    """Per MoE layer and micro-batch, where the model trains an auxiliary loss (cost.kernels.aux_loss_on): the
    all-reduce of the expert token counts (TOKEN_COUNT_BYTES x E; x the micro-batch's b sequences for seq_aux,
    which reshapes the map to [s, b E]) that get_tokens_per_expert_and_token_count issues in every forward, again
    in a recomputed one, over the tensor x context parallel group (`group`: aux_loss, seq_aux_loss; a group of one
    sends nothing) or, for global_aux, the tensor x data x context parallel group (`global_group`:
    global_aux_loss). On the compute stream, before the loss: in line. Counted on the candidate stage with the
    most MoE layers (most_moe_layers). Source: NVIDIA/Megatron-LM at d98e8a6, megatron/core/transformer/moe/
    router.py (_apply_aux_loss, _apply_seq_aux_loss: reduce_group tp_cp_group; _apply_global_aux_loss:
    tp_dp_cp_group), moe_utils.py (get_tokens_per_expert_and_token_count: reduce_from_tensor_model_parallel_region),
    tensor_parallel/mappings.py (_reduce: torch.distributed.all_reduce, skipped for a group of one).
    Derived: docs/formulas.md#comm.aux_loss_counts"""
    from llmplan.cost.kernels import aux_loss_on  # kernels builds on overhead, which imports this module
    if not m.is_moe or not aux_loss_on(m):
        return []
    dense_layers, moe_layers = most_moe_layers(m, plan, candidate_stages(m, plan))
    again = maximum(recomputed_share(plan, dense_layers + moe_layers), where(plan.recomputes("moe"), 1.0, 0.0))
    message = TOKEN_COUNT_BYTES * m.num_experts * (plan.micro_batch if m.seq_aux else 1)
    return [Transfer("all-reduce", plan.num_microbatches * moe_layers * (1 + again), message,
                     global_group if m.global_aux else group)]


ROUTER_PROB_BYTES = 4
"""Bytes of one routing probability in the alltoall dispatcher's probs all-to-all: the router's dtype (probs
type_as the logits, router_dtype), fp32 with moe_router_dtype fp32 as Megatron-Bridge's MoE providers and Qwen3 MoE
performance recipes set it (bf16's 2 without it: this prices the larger). Source: NVIDIA/Megatron-LM at d98e8a64dd,
megatron/core/transformer/moe/router.py (TopKRouter.gating: router_dtype), moe_utils.py
(topk_routing_with_score_function: probs.type_as(logits)); NVIDIA-NeMo/Megatron-Bridge at 067f987df,
src/megatron/bridge/perf_recipes/qwen/b200/qwen3_moe.py (cfg.model.moe_router_dtype = torch.float32)."""


def routing_map_bytes(m: ModelSpec, plan: ParallelPlan, tokens: Any) -> Any:
    """Bytes of the routing map HybridEP gathers over the EP group before each forward dispatch (the whole
    gathered buffer, nccl-tests' convention): every rank's tokens x E experts, one byte a bool. Its metadata
    preprocessing needs every token's routing to every expert; the backward and the benchmark reuse the
    dispatch's handle. Source: deepseek-ai/DeepEP csrc/hybrid_ep/executor/executor.cu at 94a9f8f6
    (allgather_routing_map: torch.distributed all_gather_into_tensor of the bool [tokens, experts] map unless
    enable_custom_allgather, which Megatron-LM's init_hybrid_ep_buffer leaves off) and Megatron-LM
    megatron/core/transformer/moe/fused_a2a.py at d98e8a6 (HybridEPDispatch.forward passes the routing map).
    Derived: docs/formulas.md#comm.hybridep"""
    return tokens * m.num_experts * plan.ep


def expert_groups(m: ModelSpec) -> tuple[int, int] | None:
    """(n_group, topk_group) of group-limited routing, None without a limit."""
    return (m.n_group, m.topk_group) if m.n_group and m.topk_group and m.topk_group < m.n_group else None


def dispatch_rows(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Rows one token puts in an EP dispatch (and gets back in the combine): its k routed copies with the
    alltoall dispatcher; with deepep, one per EP rank that holds any of its experts (ranks_per_token), for
    each plan's ep. Source: DeepEP README, get_dispatch_layout's is_token_in_rank (a token goes to a rank
    once) and combine (the rank's expert outputs return reduced). Derived: docs/formulas.md#comm.ep"""
    k = m.num_experts_per_tok
    if plan.moe_dispatcher != "deepep":  # a workload switch: one value for all plans of a search
        return float(k)
    ep = np.asarray(plan.ep)
    values, index = np.unique(ep, return_inverse=True)
    rows = np.array([ranks_per_token(m.num_experts, k, int(e), plan.moe_routing, expert_groups(m)) for e in values])
    out = rows[index].reshape(ep.shape)
    return float(out) if out.ndim == 0 else out


def hybridep_domain_ranks(plan: ParallelPlan) -> Any:
    """EP ranks of one NVLink domain as HybridEP counts them (NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN, else the
    ranks of the EP group its allocator reaches over NVLink): the group's size over the NVLink domains it spans,
    as dispatch_coeffs' g, the group's ranks laid out as topology.placement lays them (ep ranks etp apart) in
    domains of ParallelPlan.nvlink_domain_ranks; ep where the domain is not known (0). Elementwise over plan
    arrays. Source: deepseek-ai/DeepEP hybrid-ep @94a9f8f6, deep_ep/hybrid_ep_buffer.py (HybridEPBuffer.__init__:
    the environment's value or detect_accessible_ranks; the group's size a multiple of it).
    Derived: docs/formulas.md#moe.hybridep_permute"""
    D = plan.nvlink_domain_ranks  # a workload field: one value for all plans of a search
    if not D:
        return plan.ep
    return memoized(plan, ("hybridep_domain_ranks", int(D)), lambda: _hybridep_domain_ranks(plan, int(D)))


def _hybridep_domain_ranks(plan: ParallelPlan, D: int) -> Any:
    """hybridep_domain_ranks with a known domain of D ranks (memoized per plan arrays: evaluated for several
    transfers of one search). Derived: docs/formulas.md#moe.hybridep_permute"""
    ep, etp, n = np.broadcast_arrays(np.asarray(plan.ep), np.asarray(plan.etp_resolved), np.asarray(plan.num_gpus))
    rows = np.stack([ep.ravel(), etp.ravel(), n.ravel()], axis=1).astype(np.int64)
    values, index = np.unique(rows, axis=0, return_inverse=True)
    g = np.array([ep_ranks_a_domain(int(e), int(x), int(r), int(D)) for e, x, r in values], dtype=float)
    out = g[index.ravel()].reshape(ep.shape)
    return float(out) if out.ndim == 0 else out


@lru_cache(maxsize=1024)
def ep_ranks_a_domain(ep: int, etp: int, n: int, domain: int) -> int:
    """EP ranks a domain of `domain` ranks holds: ep over the most domains one EP group of n ranks spans (its
    ranks etp apart, topology.placement.axis_dims), at least one. Derived: docs/formulas.md#moe.hybridep_permute"""
    if ep <= 1 or n < ep * etp:
        return max(ep, 1)
    domains = groups_of(n, ((ep, etp),)) // domain
    spans = 1 + (np.diff(np.sort(domains, axis=1), axis=1) != 0).sum(axis=1)
    return max(ep // int(spans.max()), 1)


@lru_cache(maxsize=1024)
def ranks_per_token(E: int, k: int, ep: int, routing: str, groups: tuple[int, int] | None = None) -> float:
    """Mean number of EP ranks a token's k experts live on, E experts spread E/ep per rank in order
    (blocks_hit with blocks of E/ep experts). Derived: docs/formulas.md#comm.ep"""
    if ep <= 1 or E <= 0 or k <= 0:
        return 1.0
    return blocks_hit(E, k, max(E // ep, 1), routing, groups)


@lru_cache(maxsize=1024)
def blocks_hit(E: int, k: int, b: int, routing: str, groups: tuple[int, int] | None = None) -> float:
    """Mean number of blocks of b consecutive experts (a rank's, or a node's) that hold any of a token's k:
    * random routing, k distinct experts drawn uniformly: (E/b)·(1 - C(E - b, k) / C(E, k)), the chance that
      a block holds none of them;
    * with group-limited routing (n_group G groups of s = E/G experts, topk_group t of them per token: the k
      drawn from those t·s), a block inside one group is hit when its group is picked and holds one of the
      k: (E/b)·(t/G)·(1 - C(ts - b, k) / C(ts, k)); a block of j whole groups sums that over the i of them
      picked (hypergeometric in G, j, t). Blocks that straddle groups fall back to no limit (an upper bound);
    * contiguous routing (NeMo AutoModel's FakeBalancedGate: token i takes experts i·k .. i·k + k - 1 mod E):
      the blocks each run spans, averaged over the runs.
    Derived: docs/formulas.md#comm.ep"""
    if b >= E:
        return 1.0
    if routing == "contiguous":
        starts = sorted({i * k % E for i in range(E)})
        return sum(len({(s + j) % E // b for j in range(k)}) for s in starts) / len(starts)
    blocks = E / b
    if groups is not None:
        G, t = groups
        s = E // G
        pool = t * s
        def missed(x: int) -> float:
            return comb(pool - x, k) / comb(pool, k)
        if b <= s and s % b == 0:
            return blocks * (t / G) * (1.0 - missed(b))
        if b > s and b % s == 0:
            j = b // s
            hit = sum(comb(j, i) * comb(G - j, t - i) / comb(G, t) * (1.0 - missed(i * s))
                      for i in range(1, min(j, t) + 1))
            return blocks * hit
    return blocks * (1.0 - comb(E - b, k) / comb(E, k))


def step_comm(m: ModelSpec, plan: ParallelPlan, spans: dict[str, GroupSpan], system: SystemSpec) -> CommBreakdown:
    """Communication of one training step for every axis (axes of size 1 send nothing); the dp axis of a
    rank of each candidate stage beside it (CommBreakdown.dp_stages)."""
    dp = each_stage(candidate_stages(m, plan),
                    lambda i: _timed("dp", dp_transfers(m, plan, spans["dpcp_in"], spans["edp_in"], i,
                                                        spans["dpcp_out"], spans["edp_out"])
                                     + mxfp8_amax_transfers(m, plan, (spans["dpcp"], spans["dpcp_in"]),
                                                            (spans["edp"], spans["edp_in"]), i)
                                     + torchao_amax_transfers(m, plan, spans["dpcp_in"], i), system),
                    class_key(m, plan))  # the stages of a class: one rank's transfers
    return CommBreakdown({
        "tp": _timed("tp", tp_transfers(m, plan, spans["tp"], spans["etp"])
                     + tp_step_end_transfers(m, plan, spans["tp"]), system),
        "pp": _timed("pp", pp_transfers(m, plan, spans["pp"]), system),
        "dp": dp[0],
        "cp": _timed("cp", cp_transfers(m, plan, spans["cp"], spans.get("cp_a2a"), spans.get("cp_ring")), system),
        "ep": _timed("ep", ep_transfers(m, plan, spans["ep"], spans["tpep"]), system),
        # an MoE model's router: the auxiliary loss's token counts (comm.aux_loss_counts)
        **({"router": _timed("router", aux_loss_transfers(m, plan, spans["tpcp"], spans["tpdpcp"]), system)}
           if m.is_moe else {}),
    }, host_layer_bytes=offload_layer_bytes(m, plan),
        host_moe_act_bytes=moe_layer_offload_bytes(m, plan), host_attn_bytes=attention_offload_bytes(m, plan),
        dp_stages=tuple(dp),
        tp_edge_stages=tuple(each_stage(candidate_stages(m, plan), lambda i: tuple(
            _timed("tp", x, system) for x in tp_edge_transfers(m, plan, spans["tp"], i)))))
