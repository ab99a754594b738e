"""MoE serving with data-parallel attention and wide expert parallelism: how many tokens each rank's experts
see, the busiest rank's load, EPLB's redundant experts, and DeepEP's dispatch / combine in prefill (normal
kernels) and decode (low-latency kernels), with or without two-batch overlap.

Symbols: T tokens of a step on one attention rank, k experts per token, E routed experts, R redundant experts,
h hidden size, n EP ranks (ep).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from llmplan.arith import expected_max_normal
from llmplan.cost.comm import Dispatch, a2a_shares, expert_groups, ranks_per_token
from llmplan.cost.params import expert_params
from llmplan.specs.hardware import SystemSpec
from llmplan.specs.model import ModelSpec
from llmplan.specs.serve import ServePlan
from llmplan.topology.collectives import collective_time, group_links
from llmplan.topology.graph import link_profile
from llmplan.topology.placement import GroupSpan
from llmplan.units import NVFP4_BYTES

DEEPEP_SCALE_GROUP = 128
"""Elements per fp32 scale of DeepEP's fp8 dispatch (per-token, per-128-channel scales, as DeepGEMM reads
them). Source: DeepEP README (FP8 dispatching, BF16 combining); DeepSeek-V3 report §3.3.2 (1x128 tiles)."""

COMBINE_BYTES = 2.0
"""Bytes per element of a combine (bf16 expert outputs)."""


def expert_token_factor(plan: ServePlan) -> float:
    """Attention groups whose tokens meet at each rank's experts: ep / tp when the EP group spans several
    replicas (DP attention: ep ranks of tp 1; vLLM --enable-expert-parallel with --data-parallel-size, whose
    EP group is every DP x TP rank and whose DP ranks step together), so an expert GEMM sees that many times
    one replica's tokens; 1 when EP stays inside a replica (ep <= tp: SGLang's and TensorRT-LLM's EP without
    attention DP). Source: vLLM docs, Expert Parallel Deployment (EP size = TP x DP).
    Derived: docs/formulas.md#serve.moe"""
    return max(plan.ep / plan.tp, 1.0)


def redundant_expert_params(m: ModelSpec, plan: ServePlan) -> float:
    """Parameters of the redundant expert replicas (EPLB) one EP rank holds: R / ep experts per MoE layer.
    Source: DeepSeek-V3 report §3.4 (redundant experts); SGLang --ep-num-redundant-experts.
    Derived: docs/formulas.md#serve.moe"""
    if not m.is_moe or plan.redundant_experts == 0:
        return 0.0
    return m.num_moe_layers * plan.redundant_experts / plan.ep * expert_params(m) / plan.pp


def serve_ep_imbalance(m: ModelSpec, plan: ServePlan, tokens: Any) -> Any:
    """Expert rows of the busiest EP rank over the mean when the EP group gathers the tokens of several
    attention groups (expert_token_factor > 1: DP attention, or vLLM's DP + EP): the trained router's (and
    EPLB's) imbalance (plan.ep_imbalance) times the spread of random top-k draws over the n = ep ranks, each
    of which receives R = T·k·(ep/tp)/ep rows on average: 1 + z(n)·sqrt((1 - 1/n)(E - k)/((E - 1)·R))
    (cost.moe.routing_imbalance); 1 when EP stays inside a replica. Derived: docs/formulas.md#serve.moe"""
    factor = expert_token_factor(plan)
    if not (m.is_moe and plan.ep > 1 and factor > 1):
        return 1.0
    E, k, n = m.num_experts, m.num_experts_per_tok, plan.ep
    rows = np.maximum(np.asarray(tokens, dtype=float) * k * factor / n, 1.0)
    spread = np.sqrt((1 - 1 / n) * (E - k) / max(E - 1, 1) / rows)
    return plan.ep_imbalance * (1.0 + float(expected_max_normal(n)) * spread)


def dispatch_bytes_per_element(plan: ServePlan, gpu: Any) -> float:
    """Bytes per element of a token in a dispatch: DeepEP sends fp8 with one fp32 scale per 128 elements, or
    NVFP4 (one E4M3 scale per 16) when the experts run NVFP4 GEMMs on a GPU with fp4 tensor cores; the plain
    all-to-all sends 16 bits. Source: DeepEP README; LMSYS blog 2025-09-25 (GB200 part II: NVFP4 fused in
    DeepEP's dispatch halves its traffic). Derived: docs/formulas.md#serve.moe"""
    if plan.moe_dispatcher != "deepep":
        return 2.0
    if plan.expert_dtype_resolved == "nvfp4" and "fp4" in gpu.tflops:
        return NVFP4_BYTES
    return 1.0 + 4.0 / DEEPEP_SCALE_GROUP


@dataclass(frozen=True)
class DispatchTime:
    """One MoE layer's token exchange on the busiest rank: dispatch + combine = total (seconds)."""

    dispatch: Any
    combine: Any

    @property
    def total(self) -> Any:
        return self.dispatch + self.combine


def deepep_normal(m: ModelSpec, plan: ServePlan, system: SystemSpec, span: GroupSpan, tokens: float,
                  imbalance: float) -> DispatchTime:
    """DeepEP's normal (high-throughput) kernels, used for prefill: a token goes once to each EP rank holding
    any of its experts (ranks_per_token), and across nodes once per remote node over the network, then over
    NVLink (a2a_shares); bandwidth-bound, timed as an all-to-all of that buffer on the links the group spans,
    waiting on the busiest rank. Source: DeepEP README (normal kernels: NVLink and RDMA forwarding).
    Derived: docs/formulas.md#serve.moe"""
    groups = expert_groups(m)
    rows = ranks_per_token(m.num_experts, m.num_experts_per_tok, plan.ep, "random", groups)
    shares = a2a_shares(Dispatch(m.num_experts, m.num_experts_per_tok, "random", groups), span)
    buffer = tokens * rows * m.expert_width * imbalance  # latent-width rows for a latent MoE
    send = collective_time("all-to-all", buffer * dispatch_bytes_per_element(plan, system.gpu), span, system,
                           shares=shares).seconds
    back = collective_time("all-to-all", buffer * COMBINE_BYTES, span, system, shares=shares).seconds
    return DispatchTime(send, back)


DEEPEP_LL_HEADER_BYTES = 16
"""Bytes of the int4 header each low-latency dispatch message carries beside the token (its source index).
Source: deepseek-ai/DeepEP @ebfe47e46fa86a5b41be96c326a92f62ed6721da csrc/kernels/internode_ll.cu, dispatch
(num_bytes_per_msg = kHidden + num_scales * sizeof(float) + sizeof(int4))."""

DEEPEP_LL_RDMA_EFFICIENCY = 0.875
"""Share of the NIC's line rate DeepEP's low-latency kernels move (43.75 GB/s of a 400 Gb/s CX7). Derived from
DeepEP's published low-latency table (deepseek-ai/DeepEP README @ebfe47e46fa86a5b41be96c326a92f62ed6721da,
pure RDMA, H800 + CX7 400 Gb/s, 128 tokens, hidden 7168, top-8 of 288 experts, FP8 dispatch / BF16 combine,
EP 8..256): least squares of its 12 latencies on alpha + bytes / rate (deepep_low_latency), 43.75 GB/s and
6.3 us, every entry within 3%, each EP size left out within 3.1%. Derived: docs/formulas.md#serve.deepep_ll"""

DEEPEP_LL_LATENCY_S = 6.3e-6
"""Fixed seconds of one low-latency dispatch or combine call, from the same least squares as
DEEPEP_LL_RDMA_EFFICIENCY. Derived: docs/formulas.md#serve.deepep_ll"""


def ll_nic_bytes_per_s(system: SystemSpec, span: GroupSpan) -> float:
    """Bytes per second one GPU's NIC moves in DeepEP's low-latency kernels: the line rate of the network path
    the group spans (the leaf's, or the spine's when it spans leaves) x DEEPEP_LL_RDMA_EFFICIENCY.
    Derived: docs/formulas.md#serve.deepep_ll"""
    prof = link_profile(system)
    path = prof.inter_spine if span.leaves > 1 else (prof.inter_leaf or prof.inter_spine)
    return (path.bw if path else 0.0) * DEEPEP_LL_RDMA_EFFICIENCY


def deepep_low_latency(m: ModelSpec, plan: ServePlan, system: SystemSpec, span: GroupSpan, tokens: Any,
                       imbalance: Any) -> DispatchTime:
    """DeepEP's low-latency kernels, used for decode: every routed copy (k per token) is written straight
    into its expert's buffer on the destination rank as its own message. Across NVLink domains (pure RDMA,
    IBGDA, the V1 kernels SGLang's 2025-05 deployments ran) every copy but the rank's own (n - 1 of n) crosses
    the NIC: DEEPEP_LL_LATENCY_S + the busiest rank's bytes (imbalance x the mean) / ll_nic_bytes_per_s.
    Inside one NVLink domain: the link's latency + the bytes over NVLink. Source: DeepEP README
    (low-latency kernels with pure RDMA); Derived: docs/formulas.md#serve.deepep_ll"""
    n = span.size
    if n <= 1:
        return DispatchTime(0.0, 0.0)
    copies = np.asarray(tokens, dtype=float) * m.num_experts_per_tok * imbalance * (n - 1) / n
    send = m.expert_width * dispatch_bytes_per_element(plan, system.gpu)
    back = m.expert_width * COMBINE_BYTES
    if span.uses_nic:
        bw, alpha = ll_nic_bytes_per_s(system, span), DEEPEP_LL_LATENCY_S
        send += DEEPEP_LL_HEADER_BYTES
    else:
        L = group_links(system, span)
        bw, alpha = L.intra_bw, L.intra_alpha
    return DispatchTime(alpha + copies * send / bw, alpha + copies * back / bw)


def deepep_exchange_seconds(m: ModelSpec, plan: ServePlan, system: SystemSpec, span: GroupSpan, tokens: Any,
                        decode_only: bool) -> Any:
    """DeepEP's dispatch + combine of every MoE layer of a stage for a step of `tokens` tokens per attention
    rank: the low-latency kernels for decode-only steps and the normal kernels for steps that prefill (SGLang
    --deepep-mode auto picks them so). Derived: docs/formulas.md#serve.moe"""
    if not m.is_moe or plan.ep <= 1:
        return 0.0
    layers = m.num_moe_layers / plan.pp
    T = np.asarray(tokens, dtype=float)
    imb = serve_ep_imbalance(m, plan, T)
    if decode_only:
        return layers * deepep_low_latency(m, plan, system, span, T, imb).total
    flat = np.atleast_1d(T)
    imbs = np.broadcast_to(np.asarray(imb, dtype=float), flat.shape)
    out = np.array([deepep_normal(m, plan, system, span, float(t), float(i)).total
                    for t, i in zip(flat, imbs, strict=True)])
    return layers * (out if np.ndim(T) else float(out[0]))


DEEPEP_NORMAL_SMS = 20
"""SMs DeepEP's normal (high-throughput) kernels occupy while they run (deep_ep.Buffer.num_sms default).
Source: deepseek-ai/DeepEP deep_ep/buffer.py (V1, the release SGLang's 2025 deployments ran)."""


def overlapped_step(compute: Any, exchange: Any, half_compute: Any, half_exchange: Any, tbo: bool,
                    slowdown: float = 1.0) -> Any:
    """Step time from its compute and its expert exchange: one after the other, or with two-batch overlap two
    micro-batches of half the tokens, one's exchange running while the other computes, so each half-period
    lasts the longer of the two: 2 x max(compute(T/2) x slowdown, exchange(T/2)), `slowdown` the compute's
    loss to the SMs the communication kernels hold (sm_count / (sm_count - their SMs)). Source: DeepSeek
    inference system overview (2025-03-01: dual micro-batch overlap); LMSYS blog 2025-05-05 (two-batch overlap).
    Derived: docs/formulas.md#serve.tbo"""
    if not tbo:
        return compute + exchange
    return 2 * np.maximum(half_compute * slowdown, half_exchange)


def comm_sm_slowdown(plan: ServePlan, gpu: Any, decode_only: bool) -> float:
    """How much slower compute runs beside DeepEP's normal kernels (which hold DEEPEP_NORMAL_SMS SMs):
    sm_count / (sm_count - 20); 1 for the low-latency kernels (decode), which free every SM once their RDMA
    messages are issued (deepseek-ai/profile-data README, Decoding), and for the plain all-to-all.
    Derived: docs/formulas.md#serve.tbo"""
    if plan.moe_dispatcher != "deepep" or decode_only:
        return 1.0
    return gpu.sm_count / max(gpu.sm_count - DEEPEP_NORMAL_SMS, 1)


def tbo_prefill_seconds(rest: Any, routed: Any, exchange: Any, moe_layers: float, dense_layers: float,
                        dispatch_share: float, slowdown: float, rest_b: Any = None, routed_b: Any = None,
                        exchange_b: Any = None) -> Any:
    """A prefill step under SGLang's two-batch overlap, from micro-batch A's compute outside the routed experts
    (`rest`), its routed experts (`routed`) and its DeepEP exchange, and B's (`*_b`; None: the same as A's).
    Each MoE layer runs, per micro-batch, stage X: [wait own combine] shared expert, output, next attention
    and gate, launch dispatch; stage Y: [wait own dispatch] expert GEMMs, launch combine; in the order A.X B.X
    A.Y B.Y on one compute stream, the exchanges in launch order on DeepEP's stream, so a dispatch hides only
    under the other micro-batch's stage X and a combine under its stage Y; compute slowed by the SMs DeepEP
    holds (`slowdown`). Dense layers run both micro-batches without an exchange. Simulated for up to 3 layers,
    then the last layer's period repeats. Source: sgl-project/sglang operations_strategy.py
    (_compute_moe_deepseek_blog_prefill: tbo_delta_stages 0, yields after dispatch_a and combine_a, DeepGEMM on
    sm_count - DeepEP's SMs). Derived: docs/formulas.md#serve.tbo"""
    n_layers = moe_layers + dense_layers
    mb = [(np.asarray(x, dtype=float), np.asarray(y, dtype=float), np.asarray(z, dtype=float))
          for x, y, z in ((rest, routed, exchange), (rest if rest_b is None else rest_b,
                                                     routed if routed_b is None else routed_b,
                                                     exchange if exchange_b is None else exchange_b))]
    r = [x / n_layers * slowdown for x, _, _ in mb]
    e = [y / max(moe_layers, 1.0) * slowdown for _, y, _ in mb]
    d = [z / max(moe_layers, 1.0) * dispatch_share for _, _, z in mb]
    c = [z / max(moe_layers, 1.0) - di for (_, _, z), di in zip(mb, d)]
    t = q = np.zeros_like(r[0] + r[1])  # compute stream, communication stream
    disp, comb = [t, t], [t, t]
    ends = []
    for _ in range(int(min(moe_layers, 3))):
        for i in (0, 1):
            t = np.maximum(t, comb[i]) + r[i]
            q = np.maximum(q, t) + d[i]
            disp[i] = q
        for i in (0, 1):
            t = np.maximum(t, disp[i]) + e[i]
            q = np.maximum(q, t) + c[i]
            comb[i] = q
        ends.append(t)
    tail = (moe_layers - len(ends)) * (ends[-1] - ends[-2] if len(ends) > 1 else ends[-1])
    last = np.maximum(ends[-1], np.maximum(comb[0], comb[1]))  # the output waits for the last combines
    return last + tail + dense_layers * (mb[0][0] + mb[1][0]) / n_layers


def tbo_split_share(prompt_tokens: float, step_tokens: float) -> float:
    """Micro-batch A's mean share of a prefill step's tokens under SGLang's two-batch overlap, which cuts a step
    only between whole sequences (extend pieces): after the first piece whose running sum reaches half the
    step (T // 2), else after the last piece but one; a step of one piece leaves B empty (share 1). Steps of
    T = `step_tokens` tokens are cut from a stream of s = `prompt_tokens`-token prompts (chunked prefill: a
    step opens with the tail of the prompt the previous one cut, offset o), averaged over the offsets the
    stream visits (multiples of gcd(s, T mod s)). E.g. s = 2,000, T = 16,384, o = 0: pieces 2,000 x 8 + 384,
    A = 5 prompts = 10,000 tokens (0.61); s = 4,096: 2 + 2 prompts (0.5). Source: sgl-project/sglang
    @01419072c6e49b889cdf26494ed13cd77e3d367e python/sglang/srt/two_batch_overlap.py
    (compute_split_seq_index, _split_array_by_half_sum); sgl-project/sglang#6328 (2025-05-15: whole-sequence
    micro-batches in the 4-node DP32 prefill, uneven for unequal lengths; the two-chunk split, #8144, came in
    2025-07). Derived: docs/formulas.md#serve.tbo"""
    s, T = max(int(round(prompt_tokens)), 1), max(int(round(step_tokens)), 1)
    g = int(np.gcd(s, T % s)) if T % s else s
    if s >= T:  # at most one boundary, after the first piece s - o: A = min(s - o, T), s - o = g, 2g, ..., s
        n, k = s // g, T // g
        return (g * k * (k + 1) / 2 + T * (n - k)) / (n * T)
    o = np.arange(0, s, g, dtype=float)  # tokens of the open prompt done before the step
    first = np.minimum(s - o, T)  # the first piece; the next boundaries follow every s tokens
    half = T // 2
    j = np.maximum(np.ceil((half - first) / s), 0.0)  # full prompts after the first piece to reach half
    reach = first + j * s
    a = np.where(reach < T, reach, first + (j - 1) * s)  # past the step's end: the last interior boundary
    a = np.where(first >= T, T, a)  # one piece: no cut
    return float(np.mean(a)) / T
